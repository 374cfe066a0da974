//! Unit tests of `text::literal` (included by path from src/text/literal.rs).

use super::*;

#[test]
fn f8_e4m3fn() {
    let f = F8Format::of(PrimitiveType::F8E4M3FN).unwrap();
    assert_eq!(f.encode(0.0), 0x00);
    assert_eq!(f.encode(-0.0), 0x80);
    assert_eq!(f.encode(1.0), 0x38);
    assert_eq!(f.encode(-2.0), 0xC0);
    assert_eq!(f.encode(448.0), 0x7E);
    assert_eq!(f.encode(464.0), 0x7E); // tie rounds to even (0x7E), not to NaN
    assert_eq!(f.encode(480.0), 0x7F); // overflow: NaN
    assert_eq!(f.encode(f64::NAN), 0x7F);
    assert_eq!(f.encode(2f64.powi(-9)), 0x01); // smallest subnormal
    assert_eq!(f.encode(2f64.powi(-10)), 0x00); // tie to even: 0
    assert_eq!(f.encode(3.0 * 2f64.powi(-10)), 0x02); // 1.5 quanta -> 2
    assert_eq!(f.encode(1.0625), 0x38); // tie between 1.0 and 1.125 -> even (1.0)
    assert_eq!(f.encode(1.1875), 0x3A); // tie between 1.125 and 1.25 -> even (1.25)
    assert_eq!(f.encode(0.015625), 0x08); // 2^-6, smallest normal
}

#[test]
fn f8_e5m2() {
    let f = F8Format::of(PrimitiveType::F8E5M2).unwrap();
    assert_eq!(f.encode(1.0), 0x3C);
    assert_eq!(f.encode(57344.0), 0x7B);
    assert_eq!(f.encode(61440.0), 0x7C); // tie at max -> even: inf
    assert_eq!(f.encode(f64::INFINITY), 0x7C);
    assert_eq!(f.encode(f64::NEG_INFINITY), 0xFC);
    assert_eq!(f.encode(f64::NAN), 0x7F);
    assert_eq!(f.encode(2f64.powi(-16)), 0x01);
    assert_eq!(f.encode(-1.5), 0xBE);
}

#[test]
fn f8_fnuz() {
    let f = F8Format::of(PrimitiveType::F8E4M3FNUZ).unwrap();
    assert_eq!(f.encode(-0.0), 0x00);
    assert_eq!(f.encode(1.0), 0x40);
    assert_eq!(f.encode(240.0), 0x7F);
    assert_eq!(f.encode(f64::NAN), 0x80);
    assert_eq!(f.encode(1e9), 0x80);
}

#[test]
fn floats() {
    assert!(float_value("infinity").is_none());
    assert!(float_value("1e-05").is_some());
    assert_eq!(float_value("-2.5").unwrap().value, -2.5);
    assert_eq!(float_value("nan(0x1)").unwrap().nan_payload, Some(1));
}
