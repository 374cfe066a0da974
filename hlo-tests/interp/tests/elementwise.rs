//! Elementwise ops: hand-checked values, XLA's integer and float edge cases.
mod common;
use common::*;
use half::{bf16, f16};

fn bin(op: &str, ty: &str, n: usize) -> String {
    format!(
        "HloModule m\nENTRY e {{\n  a = {ty}[{n}] parameter(0)\n  b = {ty}[{n}] parameter(1)\n  ROOT r = {ty}[{n}] {op}(a, b)\n}}\n"
    )
}

fn un(op: &str, ty: &str, out: &str, n: usize) -> String {
    format!("HloModule m\nENTRY e {{\n  a = {ty}[{n}] parameter(0)\n  ROOT r = {out}[{n}] {op}(a)\n}}\n")
}

#[test]
fn integer_division_edge_cases() {
    let a = arr(&[4], &[5i32, -5, i32::MIN, 7]);
    let b = arr(&[4], &[0i32, 0, -1, -2]);
    assert_eq!(vals::<i32>(&run1(&bin("divide", "s32", 4), vec![a.clone(), b.clone()])), vec![-1, -1, i32::MIN, -3]);
    assert_eq!(vals::<i32>(&run1(&bin("remainder", "s32", 4), vec![a, b])), vec![5, -5, 0, 1]);
    let ua = arr(&[2], &[5u32, 7]);
    let ub = arr(&[2], &[0u32, 2]);
    assert_eq!(vals::<u32>(&run1(&bin("divide", "u32", 2), vec![ua.clone(), ub.clone()])), vec![u32::MAX, 3]);
    assert_eq!(vals::<u32>(&run1(&bin("remainder", "u32", 2), vec![ua, ub])), vec![5, 1]);
}

#[test]
fn integer_power_matches_xla_cpu() {
    // Checked against XLA's CPU backend: only 6 exponent bits are used.
    let a = arr(&[9], &[-1i32, -1, 2, 3, 1, 2, 0, 5, -1]);
    let b = arr(&[9], &[-3i32, -2, 64, 64, -5, -1, -1, 65, 65]);
    assert_eq!(vals::<i32>(&run1(&bin("power", "s32", 9), vec![a, b])), vec![-1, 1, 1, 1, 1, 0, 0, 5, -1]);
    let a = arr(&[4], &[2u8, 1, 3, 3]);
    let b = arr(&[4], &[200u8, 200, 129, 4]);
    assert_eq!(vals::<u8>(&run1(&bin("power", "u8", 4), vec![a, b])), vec![0, 1, 0, 81]);
}

#[test]
fn shifts() {
    let a = arr(&[3], &[1i32, 1, -1]);
    let b = arr(&[3], &[31i32, 32, -1]);
    assert_eq!(vals::<i32>(&run1(&bin("shift-left", "s32", 3), vec![a, b])), vec![i32::MIN, 0, 0]);
    let a = arr(&[3], &[-8i32, -8, 8]);
    let b = arr(&[3], &[1i32, 40, 40]);
    assert_eq!(
        vals::<i32>(&run1(&bin("shift-right-arithmetic", "s32", 3), vec![a.clone(), b.clone()])),
        vec![-4, -1, 0]
    );
    assert_eq!(
        vals::<i32>(&run1(&bin("shift-right-logical", "s32", 3), vec![a, b])),
        vec![((-8i32) as u32 >> 1) as i32, 0, 0]
    );
    let a = arr(&[1], &[0x80u8]);
    let b = arr(&[1], &[1u8]);
    assert_eq!(vals::<u8>(&run1(&bin("shift-right-arithmetic", "u8", 1), vec![a, b])), vec![0xC0]);
}

#[test]
fn float_max_min_nan_and_signed_zero() {
    let a = arr(&[4], &[-0.0f32, 0.0, f32::NAN, 1.0]);
    let b = arr(&[4], &[0.0f32, -0.0, 1.0, f32::NAN]);
    let mx = vals::<f32>(&run1(&bin("maximum", "f32", 4), vec![a.clone(), b.clone()]));
    let mn = vals::<f32>(&run1(&bin("minimum", "f32", 4), vec![a, b]));
    assert!(mx[0] == 0.0 && mx[0].is_sign_positive() && mx[1].is_sign_positive());
    assert!(mn[0].is_sign_negative() && mn[1].is_sign_negative());
    assert!(mx[2].is_nan() && mx[3].is_nan() && mn[2].is_nan() && mn[3].is_nan());
}

#[test]
fn float_arithmetic_and_remainder() {
    let a = arr(&[4], &[7.5f64, -7.5, 1.0, 2.0]);
    let b = arr(&[4], &[2.0f64, 2.0, 0.0, 10.0]);
    assert_eq!(vals::<f64>(&run1(&bin("remainder", "f64", 4), vec![a.clone(), b.clone()]))[..2], [1.5, -1.5]);
    let d = vals::<f64>(&run1(&bin("divide", "f64", 4), vec![a.clone(), b.clone()]));
    assert_eq!(d[2], f64::INFINITY);
    assert_eq!(vals::<f64>(&run1(&bin("power", "f64", 4), vec![a.clone(), b.clone()]))[3], 1024.0);
    assert_eq!(vals::<f64>(&run1(&bin("subtract", "f64", 4), vec![a, b])), vec![5.5, -9.5, 1.0, -8.0]);
}

#[test]
fn bf16_and_f16_round_per_op() {
    // 256 + 1 in bf16 is 256 (8 significand bits); f16 has 11 bits: 2048 + 1 = 2048.
    let a = arr(&[2], &[bf16::from_f32(256.0), bf16::from_f32(1.5)]);
    let b = arr(&[2], &[bf16::from_f32(1.0), bf16::from_f32(1.5)]);
    let r = vals::<bf16>(&run1(&bin("add", "bf16", 2), vec![a, b]));
    assert_eq!(r, vec![bf16::from_f32(256.0), bf16::from_f32(3.0)]);
    let a = arr(&[1], &[f16::from_f32(2048.0)]);
    let b = arr(&[1], &[f16::from_f32(1.0)]);
    assert_eq!(vals::<f16>(&run1(&bin("add", "f16", 1), vec![a, b])), vec![f16::from_f32(2048.0)]);
}

#[test]
fn unary_float_ops() {
    let x = arr(&[5], &[0.5f32, 1.5, 2.5, -0.5, -2.5]);
    assert_eq!(
        vals::<f32>(&run1(&un("round-nearest-afz", "f32", "f32", 5), vec![x.clone()])),
        vec![1., 2., 3., -1., -3.]
    );
    assert_eq!(
        vals::<f32>(&run1(&un("round-nearest-even", "f32", "f32", 5), vec![x.clone()])),
        vec![0., 2., 2., -0., -2.]
    );
    assert_eq!(vals::<f32>(&run1(&un("floor", "f32", "f32", 5), vec![x.clone()])), vec![0., 1., 2., -1., -3.]);
    assert_eq!(vals::<f32>(&run1(&un("ceil", "f32", "f32", 5), vec![x.clone()])), vec![1., 2., 3., -0., -2.]);
    assert_eq!(vals::<f32>(&run1(&un("negate", "f32", "f32", 5), vec![x.clone()]))[0], -0.5);
    let s = vals::<f32>(&run1(&un("sign", "f32", "f32", 4), vec![arr(&[4], &[-0.0f32, 0.0, f32::NAN, -3.0])]));
    assert!(s[0] == 0.0 && s[0].is_sign_negative() && s[1].is_sign_positive() && s[2].is_nan() && s[3] == -1.0);
    let y = arr(&[3], &[0.0f32, 1.0, 4.0]);
    assert_eq!(vals::<f32>(&run1(&un("sqrt", "f32", "f32", 3), vec![y.clone()])), vec![0., 1., 2.]);
    assert_eq!(vals::<f32>(&run1(&un("rsqrt", "f32", "f32", 3), vec![y.clone()]))[2], 0.5);
    assert_eq!(vals::<f32>(&run1(&un("exponential", "f32", "f32", 3), vec![y.clone()]))[0], 1.0);
    assert_eq!(vals::<f32>(&run1(&un("log", "f32", "f32", 3), vec![y.clone()]))[1], 0.0);
    assert_eq!(vals::<f32>(&run1(&un("logistic", "f32", "f32", 3), vec![y.clone()]))[0], 0.5);
    assert_eq!(vals::<f32>(&run1(&un("tanh", "f32", "f32", 3), vec![y.clone()]))[0], 0.0);
    assert_eq!(
        vals::<f32>(&run1(&un("cbrt", "f32", "f32", 3), vec![arr(&[3], &[8.0f32, -27.0, 0.0])])),
        vec![2., -3., 0.]
    );
    assert!((vals::<f32>(&run1(&un("sine", "f32", "f32", 3), vec![y.clone()]))[1] - 1f32.sin()).abs() < 1e-6);
    assert!((vals::<f32>(&run1(&un("cosine", "f32", "f32", 3), vec![y.clone()]))[1] - 1f32.cos()).abs() < 1e-6);
    let f =
        vals::<bool>(&run1(&un("is-finite", "f32", "pred", 3), vec![arr(&[3], &[1.0f32, f32::INFINITY, f32::NAN])]));
    assert_eq!(f, vec![true, false, false]);
}

#[test]
fn unary_integer_ops() {
    let x = arr(&[4], &[0i8, 1, -1, i8::MIN]);
    assert_eq!(vals::<i8>(&run1(&un("negate", "s8", "s8", 4), vec![x.clone()])), vec![0, -1, 1, i8::MIN]);
    assert_eq!(vals::<i8>(&run1(&un("abs", "s8", "s8", 4), vec![x.clone()])), vec![0, 1, 1, i8::MIN]);
    assert_eq!(vals::<i8>(&run1(&un("sign", "s8", "s8", 4), vec![x.clone()])), vec![0, 1, -1, -1]);
    assert_eq!(vals::<i8>(&run1(&un("not", "s8", "s8", 4), vec![x.clone()])), vec![-1, -2, 0, 127]);
    assert_eq!(vals::<i8>(&run1(&un("popcnt", "s8", "s8", 4), vec![x.clone()])), vec![0, 1, 8, 1]);
    assert_eq!(vals::<i8>(&run1(&un("clz", "s8", "s8", 4), vec![x])), vec![8, 7, 0, 0]);
    let p = arr(&[2], &[true, false]);
    assert_eq!(vals::<bool>(&run1(&un("not", "pred", "pred", 2), vec![p])), vec![false, true]);
    assert_eq!(vals::<u16>(&run1(&un("abs", "u16", "u16", 1), vec![arr(&[1], &[65535u16])])), vec![65535]);
}

#[test]
fn logical_ops() {
    let a = arr(&[4], &[true, true, false, false]);
    let b = arr(&[4], &[true, false, true, false]);
    assert_eq!(
        vals::<bool>(&run1(&bin("and", "pred", 4), vec![a.clone(), b.clone()])),
        vec![true, false, false, false]
    );
    assert_eq!(vals::<bool>(&run1(&bin("or", "pred", 4), vec![a.clone(), b.clone()])), vec![true, true, true, false]);
    assert_eq!(vals::<bool>(&run1(&bin("xor", "pred", 4), vec![a, b])), vec![false, true, true, false]);
    let a = arr(&[1], &[0b1100u32]);
    let b = arr(&[1], &[0b1010u32]);
    assert_eq!(vals::<u32>(&run1(&bin("xor", "u32", 1), vec![a, b])), vec![0b0110]);
}

#[test]
fn convert_saturates_and_rounds() {
    let x = arr(&[5], &[f32::NAN, 1e10, -1e10, -1.7, 2.5]);
    assert_eq!(
        vals::<i32>(&run1(&un("convert", "f32", "s32", 5), vec![x.clone()])),
        vec![0, i32::MAX, i32::MIN, -1, 2]
    );
    let u = vals::<u8>(&run1(&un("convert", "f32", "u8", 5), vec![arr(&[5], &[f32::NAN, 1e10, -1e10, -1.7, 255.9])]));
    assert_eq!(u, vec![0, 255, 0, 0, 255]);
    // f32 → bf16 rounds to nearest even: 1 + 2^-8 is a tie between 1 and 1 + 2^-7.
    let b = vals::<bf16>(&run1(
        &un("convert", "f32", "bf16", 2),
        vec![arr(&[2], &[1.0f32 + 1.0 / 256.0, 1.0 + 3.0 / 256.0])],
    ));
    assert_eq!(b, vec![bf16::from_f32(1.0), bf16::from_f32(1.0 + 4.0 / 256.0)]);
    let h = vals::<f16>(&run1(&un("convert", "s64", "f16", 3), vec![arr(&[3], &[65519i64, 65520, 1 << 60])]));
    assert_eq!(h[0], f16::from_f32(65504.0));
    assert!(h[1].is_infinite() && h[2].is_infinite());
    assert_eq!(vals::<i8>(&run1(&un("convert", "s32", "s8", 2), vec![arr(&[2], &[300i32, -129])])), vec![44, 127]);
    assert_eq!(
        vals::<bool>(&run1(&un("convert", "f32", "pred", 3), vec![arr(&[3], &[0.0f32, -0.0, 0.1])])),
        vec![false, false, true]
    );
    assert_eq!(vals::<f32>(&run1(&un("convert", "pred", "f32", 2), vec![arr(&[2], &[true, false])])), vec![1.0, 0.0]);
    assert_eq!(vals::<u32>(&run1(&un("convert", "s32", "u32", 1), vec![arr(&[1], &[-1i32])])), vec![u32::MAX]);
}

#[test]
fn compare_ieee_and_total_order() {
    let t = |dir: &str, ty: &str| {
        format!(
            "HloModule m\nENTRY e {{\n  a = f32[3] parameter(0)\n  b = f32[3] parameter(1)\n  ROOT r = pred[3] compare(a, b), direction={dir}{ty}\n}}\n"
        )
    };
    let a = arr(&[3], &[f32::NAN, -0.0, 1.0]);
    let b = arr(&[3], &[f32::NAN, 0.0, 2.0]);
    assert_eq!(vals::<bool>(&run1(&t("EQ", ""), vec![a.clone(), b.clone()])), vec![false, true, false]);
    assert_eq!(vals::<bool>(&run1(&t("NE", ""), vec![a.clone(), b.clone()])), vec![true, false, true]);
    assert_eq!(vals::<bool>(&run1(&t("LT", ""), vec![a.clone(), b.clone()])), vec![false, false, true]);
    assert_eq!(
        vals::<bool>(&run1(&t("EQ", ", type=TOTALORDER"), vec![a.clone(), b.clone()])),
        vec![true, false, false]
    );
    assert_eq!(vals::<bool>(&run1(&t("LT", ", type=TOTALORDER"), vec![a, b])), vec![false, true, true]);
    let ti = "HloModule m\nENTRY e {\n  a = u32[2] parameter(0)\n  b = u32[2] parameter(1)\n  ROOT r = pred[2] compare(a, b), direction=GT\n}\n";
    assert_eq!(vals::<bool>(&run1(ti, vec![arr(&[2], &[u32::MAX, 1]), arr(&[2], &[1u32, 1])])), vec![true, false]);
}

#[test]
fn select_and_clamp() {
    let t = "HloModule m\nENTRY e {\n  p = pred[3] parameter(0)\n  a = s32[3] parameter(1)\n  b = s32[3] parameter(2)\n  ROOT r = s32[3] select(p, a, b)\n}\n";
    let r = run1(t, vec![arr(&[3], &[true, false, true]), arr(&[3], &[1i32, 2, 3]), arr(&[3], &[-1i32, -2, -3])]);
    assert_eq!(vals::<i32>(&r), vec![1, -2, 3]);
    let t = "HloModule m\nENTRY e {\n  p = pred[] parameter(0)\n  a = s32[3] parameter(1)\n  b = s32[3] parameter(2)\n  ROOT r = s32[3] select(p, a, b)\n}\n";
    let r = run1(t, vec![arr(&[], &[false]), arr(&[3], &[1i32, 2, 3]), arr(&[3], &[-1i32, -2, -3])]);
    assert_eq!(vals::<i32>(&r), vec![-1, -2, -3]);
    let t = "HloModule m\nENTRY e {\n  lo = f32[] parameter(0)\n  x = f32[4] parameter(1)\n  hi = f32[4] parameter(2)\n  ROOT r = f32[4] clamp(lo, x, hi)\n}\n";
    let r =
        run1(t, vec![arr(&[], &[0.0f32]), arr(&[4], &[-1.0f32, 0.5, 3.0, 9.0]), arr(&[4], &[1.0f32, 1.0, 2.0, 10.0])]);
    assert_eq!(vals::<f32>(&r), vec![0.0, 0.5, 2.0, 9.0]);
}

#[test]
fn atan2_and_integer_atan2_rejected() {
    let r = run1(&bin("atan2", "f32", 2), vec![arr(&[2], &[1.0f32, 0.0]), arr(&[2], &[1.0f32, -1.0])]);
    let v = vals::<f32>(&r);
    assert!((v[0] - std::f32::consts::FRAC_PI_4).abs() < 1e-6 && (v[1] - std::f32::consts::PI).abs() < 1e-6);
    let m = parse(&bin("atan2", "s32", 1));
    let e = interp::run(&m, &cfg(1, runs::Mode::Replica), &[vec![arr(&[1], &[1i32]), arr(&[1], &[1i32])]]).unwrap_err();
    assert!(matches!(e, interp::InterpError::UnsupportedDtype { .. }), "{e}");
}
