//! The fused all-reduce epilogue on the host (issue 35 item 3): the residual add and RMSNorm
//! a call's [`Epilogue`] describes, applied to the all-reduce's result row by row. The CPU
//! handlers run it after the host protocol; the GPU kernel tests use it as their reference.

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
    let mut sum = 0f32;
    for v in hf {
        sum += v * v;
    }
    sum
}

/// The row's sum of squares in the order of the GPU kernel (`pl_one_shot_norm_*` in
/// kernels/cuda/collectives.cu) launched with `threads` threads a block (a power of two):
/// thread t sums the squares of elements t, t + threads, t + 2 threads, ... left to right,
/// then the threads' sums are added as a tree (t += t + s for s = threads / 2, ..., 1).
pub fn block_sum_of_squares(hf: &[f32], threads: usize) -> f32 {
    let mut part: Vec<f32> =
        (0..threads).map(|t| hf.iter().skip(t).step_by(threads).fold(0f32, |acc, v| acc + v * v)).collect();
    let mut s = threads / 2;
    while s > 0 {
        for t in 0..s {
            part[t] += part[t + s];
        }
        s /= 2;
    }
    part.first().copied().unwrap_or(0.0)
}

/// Applies `e` to the all-reduce result `s` with residual `x` (and gamma `g`, `d` values),
/// rows of `d` elements, writing `h` and `y` (each of `s`'s element count, in their types).
/// Every operation is an f32 operation in XLA's order ([`Epilogue`]); the row's sum of squares
/// is `row_sum` of the row's hf values: [`sum_of_squares`] on the host, [`block_sum_of_squares`]
/// where the GPU kernel tests reproduce the kernel bit for bit.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_order_sums_every_square_once() {
        let hf: Vec<f32> = (0..1000).map(|i| (i % 7) as f32 - 3.0).collect();
        // Small integers: every order is exact.
        assert_eq!(block_sum_of_squares(&hf, 512), sum_of_squares(&hf));
        assert_eq!(block_sum_of_squares(&hf, 1), sum_of_squares(&hf));
        assert_eq!(block_sum_of_squares(&[3.0], 512), 9.0);
        // An order the result shows: sequentially 2^24 + 1 rounds back to 2^24 (ties to
        // even), twice; with 2 threads, thread 1's 1 + 1 = 2 is added to 2^24 whole.
        let v = [4096.0f32, 1.0, 0.0, 1.0];
        assert_eq!(sum_of_squares(&v), 16_777_216.0);
        assert_eq!(block_sum_of_squares(&v, 2), 16_777_218.0);
    }

    #[test]
    fn rmsnorm_of_a_bf16_row() {
        let e = Epilogue {
            round_ar: Some(RoundTo::Bf16),
            norm_of_rounded: true,
            mean: Mean::Multiply(0.25f32.to_bits()),
            eps: 0f32.to_bits(),
            gamma: true,
        };
        // The all-reduce's f32 result 1.00390625 rounds to 1.0 in bf16 (ties to even).
        let s: Vec<u8> = [1.0f32 + 1.0 / 256.0, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let x: Vec<u8> =
            [1.0f32, 0.0, -1.0, 0.0].iter().flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes()).collect();
        let g: Vec<u8> = [1.0f32, 2.0, 1.0, 0.5].iter().flat_map(|v| v.to_le_bytes()).collect();
        let (mut h, mut y) = (vec![0u8; 8], vec![0u8; 16]);
        apply(
            &e,
            4,
            (&s, PrimitiveType::F32),
            (&x, PrimitiveType::Bf16),
            Some((&g, PrimitiveType::F32)),
            &mut h,
            PrimitiveType::Bf16,
            &mut y,
            PrimitiveType::F32,
            &sum_of_squares,
        );
        let hv: Vec<f32> = (0..4).map(|i| get(&h, PrimitiveType::Bf16, i)).collect();
        assert_eq!(hv, [2.0, 2.0, 2.0, 4.0]);
        // mean of squares (4 + 4 + 4 + 16) / 4 = 7.
        let r = 1.0 / 7f32.sqrt();
        let yv: Vec<f32> = (0..4).map(|i| get(&y, PrimitiveType::F32, i)).collect();
        assert_eq!(yv, [2.0 * r, 2.0 * r * 2.0, 2.0 * r, 4.0 * r * 0.5]);
    }
}
