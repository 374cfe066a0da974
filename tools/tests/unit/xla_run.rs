//! Unit tests of `tools::xla_run` (included by path from src/xla_run.rs).

use super::*;

#[test]
fn four_bit_integers_cross_as_xla_cpu_holds_them() {
    let values: Vec<u8> = (-8i8..8).map(|v| v as u8).collect();
    let s4 = Array::new(ArrayShape::new(PrimitiveType::S4, vec![16]), values.clone()).expect("s4");
    let host = to_host_form(&s4).into_owned();
    assert_eq!(host, (0u8..16).map(|v| (v + 8) & 0x0f).collect::<Vec<_>>(), "low nibbles");
    assert_eq!(from_host_form(PrimitiveType::S4, host), values, "sign-extended back");
    assert_eq!(from_host_form(PrimitiveType::U4, vec![0x1f, 0x07]), [0x0f, 0x07]);
    let f8 = Array::new(ArrayShape::new(PrimitiveType::F8E4M3FN, vec![2]), vec![0xff, 0x81]).expect("f8");
    assert_eq!(to_host_form(&f8).as_ref(), &[0xff, 0x81], "raw bits");
    assert_eq!(from_host_form(PrimitiveType::F8E4M3FN, vec![0xff]), [0xff]);
}
