//! `kernels::epilogue`: the host's residual add and RMSNorm, and the kernel's summation order.

use half::bf16;
use hlo::PrimitiveType;
use thunks::custom_call::{Epilogue, Mean, RoundTo};

use kernels::epilogue::{apply, sum_of_squares};

#[path = "common/sum_order.rs"]
mod sum_order;
use sum_order::block_sum_of_squares;

/// Element `i` of `bytes` (f32 or bf16) as f32.
fn get(bytes: &[u8], ty: PrimitiveType, i: usize) -> f32 {
    match ty {
        PrimitiveType::F32 => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()),
        _ => bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
    }
}

#[test]
fn block_order_sums_every_square_once() {
    let hf: Vec<f32> = (0..1000).map(|i| (i % 7) as f32 - 3.0).collect();
    // Small integers: every order is exact.
    for unit in [1, 4, 8] {
        assert_eq!(block_sum_of_squares(&hf, 512, unit), sum_of_squares(&hf));
        assert_eq!(block_sum_of_squares(&hf, 1, unit), sum_of_squares(&hf));
        assert_eq!(block_sum_of_squares(&[3.0], 512, unit), 9.0);
    }
    // An order the result shows: sequentially 2^24 + 1 rounds back to 2^24 (ties to
    // even), twice; with 2 threads of units of 1, thread 1's 1 + 1 = 2 is added to 2^24
    // whole; with units of 2, thread 0 holds 4096 and 1 (2^24 + 1 -> 2^24), thread 1 0 and 1.
    let v = [4096.0f32, 1.0, 0.0, 1.0];
    assert_eq!(sum_of_squares(&v), 16_777_216.0);
    assert_eq!(block_sum_of_squares(&v, 2, 1), 16_777_218.0);
    assert_eq!(block_sum_of_squares(&v, 2, 2), 16_777_216.0);
    // Units of 2 over 2 threads: thread 0 sums units 0 and 2 (elements 0, 1, 4), thread 1 unit 1.
    let w = [4096.0f32, 0.0, 1.0, 1.0, 1.0];
    assert_eq!(block_sum_of_squares(&w, 2, 2), 16_777_218.0);
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
    let x: Vec<u8> = [1.0f32, 0.0, -1.0, 0.0].iter().flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes()).collect();
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
