//! The harness itself: test directives and how results are compared.

use hlo::Array;
use hlo_tests::{Mode, Tolerance, compare_leaf, parse_directive};

#[test]
fn directive_parses() {
    let d = parse_directive("// peerless-test: devices=1,2,8 mode=partition tolerance=loose\nHloModule m").unwrap();
    assert_eq!(d.devices, vec![1, 2, 8]);
    assert_eq!(d.mode, Mode::Partition);
    assert_eq!(d.tolerance, Tolerance::Loose);
    assert!(parse_directive("HloModule m").is_err());
    assert!(parse_directive("// peerless-test: devices=2").is_err());
    assert!(parse_directive("// peerless-test: devices=2 mode=replica bogus=1").is_err());
}

#[test]
fn float_compare() {
    let w = Array::from_slice(vec![4], &[1.0f32, f32::NAN, f32::INFINITY, 0.0]);
    let g = Array::from_slice(vec![4], &[1.000001f32, f32::NAN, f32::INFINITY, -0.0]);
    compare_leaf("x", &g, &w, Tolerance::Default).unwrap();
    let g = Array::from_slice(vec![4], &[1.1f32, 0.0, f32::NEG_INFINITY, 0.0]);
    let e = compare_leaf("x", &g, &w, Tolerance::Default).unwrap_err();
    assert!(e.contains("3 of 4"), "{e}");
}

#[test]
fn int_compare_is_exact() {
    let w = Array::from_slice(vec![2], &[1i32, 2]);
    let g = Array::from_slice(vec![2], &[1i32, 3]);
    assert!(compare_leaf("x", &g, &w, Tolerance::Loose).is_err());
    compare_leaf("x", &w, &w, Tolerance::Default).unwrap();
}
