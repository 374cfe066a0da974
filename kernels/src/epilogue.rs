//! The fused all-reduce epilogue on the host: the residual add and RMSNorm a call's [`Epilogue`] describes, applied to
//! the all-reduce's result row by row. The CPU handlers run it after the host protocol; the GPU kernel tests use it as
//! their reference.

use half::{bf16, f16};
use hlo::PrimitiveType;
use thunks::custom_call::{Epilogue, Mean, RoundTo};

/// Element `i` of `bytes` (of type `ty`: f32, bf16 or f16) as f32.
fn get(bytes: &[u8], ty: PrimitiveType, i: usize) -> f32 {
    match ty {
        PrimitiveType::F32 => f32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]]),
        PrimitiveType::Bf16 => bf16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32(),
        _ => f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32(),
    }
}

/// Writes `v` rounded to `ty` (round to nearest even) as element `i`.
fn put(bytes: &mut [u8], ty: PrimitiveType, i: usize, v: f32) {
    match ty {
        PrimitiveType::F32 => bytes[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        PrimitiveType::Bf16 => bytes[2 * i..2 * i + 2].copy_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes()),
        _ => bytes[2 * i..2 * i + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes()),
    }
}

/// `v` rounded to `ty` and back.
fn round(v: f32, ty: RoundTo) -> f32 {
    match ty {
        RoundTo::Bf16 => bf16::from_f32(v).to_f32(),
        RoundTo::F16 => f16::from_f32(v).to_f32(),
    }
}

/// Whether the epilogue reads and writes `ty`.
pub fn supports(ty: PrimitiveType) -> bool {
    matches!(ty, PrimitiveType::F32 | PrimitiveType::Bf16 | PrimitiveType::F16)
}

/// One array: its bytes and element type.
pub type Typed<'a> = (&'a [u8], PrimitiveType);

/// The row's sum of squares left to right in f32 (XLA:CPU's order within a chunk).
pub fn sum_of_squares(hf: &[f32]) -> f32 {
    hf.iter().fold(0f32, |sum, v| sum + v * v)
}

/// Applies `e` to the all-reduce result `s` with residual `x` (and gamma `g`, `d` values), rows of `d` elements,
/// writing `h` and `y` (each of `s`'s element count, in their types). Every operation is an f32 operation in XLA's
/// order ([`Epilogue`]); the row's sum of squares is `row_sum` of the row's hf values: [`sum_of_squares`] on the host,
/// the kernel's block order where the GPU kernel tests reproduce it bit for bit (kernels/tests/common/sum_order.rs).
pub fn apply(
    e: &Epilogue,
    d: usize,
    s: Typed<'_>,
    x: Typed<'_>,
    g: Option<Typed<'_>>,
    h: &mut [u8],
    h_ty: PrimitiveType,
    y: &mut [u8],
    y_ty: PrimitiveType,
    row_sum: &dyn Fn(&[f32]) -> f32,
) {
    let n = s.0.len() / s.1.byte_size().max(1);
    if d == 0 {
        return;
    }
    let mut hf = vec![0f32; d];
    for row in 0..n / d {
        let base = row * d;
        for (j, slot) in hf.iter_mut().enumerate() {
            let mut a = get(s.0, s.1, base + j);
            if let Some(r) = e.round_ar {
                a = round(a, r);
            }
            let hc = a + get(x.0, x.1, base + j);
            put(h, h_ty, base + j, hc);
            *slot = if e.norm_of_rounded { get(h, h_ty, base + j) } else { hc };
        }
        let sum = row_sum(&hf);
        let ms = match e.mean {
            Mean::Multiply(c) => sum * f32::from_bits(c),
            Mean::Divide(c) => sum / f32::from_bits(c),
        };
        let r = 1.0 / (ms + f32::from_bits(e.eps)).sqrt();
        for (j, v) in hf.iter().enumerate() {
            let mut out = v * r;
            if let Some((gb, gt)) = g {
                out *= get(gb, gt, j);
            }
            put(y, y_ty, base + j, out);
        }
    }
}
