//! Unit tests of `hlo::print` (included by path from src/print.rs).

use super::*;

#[test]
fn floats_print_shortest() {
    assert_eq!(f32_text(1.0f32.to_bits()), "1");
    assert_eq!(f32_text((-0.0f32).to_bits()), "-0");
    assert_eq!(f32_text(0.1f32.to_bits()), "0.1");
    assert_eq!(f32_text(1e-7f32.to_bits()), "1e-7");
    assert_eq!(f32_text(f32::INFINITY.to_bits()), "inf");
    assert_eq!(f32_text(f32::NAN.to_bits()), "nan");
    assert_eq!(f32_text(0xffc0_0000), "-nan");
    assert_eq!(f32_text(0x7f80_0001), "nan(0x1)");
    assert_eq!(f64_text(1e300f64.to_bits()), "1e300");
    assert_eq!(element_text(PrimitiveType::F16, &half::f16::from_f64(0.1).to_bits().to_le_bytes()), "0.1");
    assert_eq!(element_text(PrimitiveType::Bf16, &half::bf16::from_f64(3.0).to_bits().to_le_bytes()), "3");
    assert_eq!(element_text(PrimitiveType::F8E4M3FN, &[0x38]), "1");
    assert_eq!(element_text(PrimitiveType::F8E4M3FN, &[0xff]), "-nan");
    assert_eq!(element_text(PrimitiveType::F8E5M2, &[0x7d]), "nan(0x1)");
    assert_eq!(element_text(PrimitiveType::F8E4M3FNUZ, &[0x80]), "nan");
    assert_eq!(element_text(PrimitiveType::S4, &[0xf9]), "-7");
}

#[test]
fn iota_tile_assignments() {
    assert_eq!(iota_form(&[2, 4], &(0..8).collect::<Vec<_>>()), Some((vec![8], vec![])));
    // [[0, 2], [1, 3]] is iota [2,2] transposed.
    assert_eq!(iota_form(&[2, 2], &[0, 2, 1, 3]), Some((vec![2, 2], vec![1, 0])));
    // With a trailing replication dimension and a size-1 dimension.
    assert_eq!(iota_form(&[1, 2, 2], &[0, 2, 1, 3]), Some((vec![2, 2], vec![1, 0])));
    // [4,2] tile of iota [2,4] transposed: device (i, j) = j * 4 + i.
    let devices: Vec<i64> = (0..4).flat_map(|i| (0..2).map(move |j| j * 4 + i)).collect();
    assert_eq!(iota_form(&[4, 2], &devices), Some((vec![2, 4], vec![1, 0])));
    assert_eq!(iota_form(&[2, 2], &[3, 2, 1, 0]), None);
    assert_eq!(canonical_iota(vec![2, 2, 2], vec![2, 0, 1]), (vec![4, 2], vec![1, 0]));
}

#[test]
fn strings_quote_and_escape() {
    assert_eq!(quote("a\"b\\c\nd\u{1}\u{7f}é"), "\"a\\\"b\\\\c\\nd\\001\\177é\"");
    assert_eq!(braced_or_quoted("{\"a\": \"}\"}"), "{\"a\": \"}\"}");
    assert_eq!(braced_or_quoted("{a} {b}"), "\"{a} {b}\"");
    assert_eq!(braced_or_quoted("x"), "\"x\"");
}

#[test]
fn f8_decode_inverts_encode() {
    use PrimitiveType as T;
    for ty in [T::F8E5M2, T::F8E4M3, T::F8E3M4, T::F8E4M3FN, T::F8E4M3FNUZ, T::F8E5M2FNUZ, T::F8E4M3B11FNUZ] {
        for b in 0..=255u8 {
            // The printer's text of every byte (its value, or its NaN payload) parses back to it.
            let text = format!("HloModule m\nENTRY e {{\n  ROOT c = {ty}[] constant({})\n}}\n", element_text(ty, &[b]));
            let m = hlo::parse_text("f8", &text).unwrap_or_else(|e| panic!("{ty} {b:#04x}: {e}"));
            let lit =
                m.instr(m.entry().root).attrs.literal.as_ref().and_then(Literal::as_array).map(|a| a.data.clone());
            assert_eq!(lit, Some(vec![b]), "{ty} {b:#04x}");
        }
    }
    let f = F8Format::of(T::F8E4M3FN).unwrap();
    assert_eq!((f8_decode(f, 0x38), f8_decode(f, 0x7E), f8_decode(f, 0x01)), (1.0, 448.0, 2f64.powi(-9)));
    assert!(f8_decode(f, 0x7F).is_nan());
}
