//! Unit tests of `kernels::host::reduce` (included by path from src/host/reduce.rs).

use super::*;

fn run(ty: T, kind: K, members: &[Vec<u8>]) -> Vec<u8> {
    let r = Reducer::new(ty, kind).unwrap();
    let refs: Vec<&[u8]> = members.iter().map(Vec::as_slice).collect();
    let mut out = vec![0u8; members[0].len()];
    r.reduce(&refs, &mut out);
    out
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn float_min_max_follow_xla() {
    // XLA:CPU (jax 0.11.2, 8 host devices): pmax([NaN, 1, ..., 7]) = 7, a NaN is skipped
    // wherever it stands, all-NaN gives -inf (max) / +inf (min), and of equal zeros the
    // first member's wins.
    let a = f32s(&[f32::NAN, 1.0, -0.0, 0.0, 2.0, f32::NAN]);
    let b = f32s(&[3.0, f32::NAN, 0.0, -0.0, -5.0, f32::NAN]);
    let c = f32s(&[f32::NAN, f32::NAN, 0.0, 0.0, 1.0, f32::NAN]);
    let bits = |v: Vec<u8>| -> Vec<u32> { v.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect() };
    let max = bits(run(T::F32, K::Max, &[a.clone(), b.clone(), c.clone()]));
    assert_eq!(max, [3.0f32, 1.0, -0.0, 0.0, 2.0, f32::NEG_INFINITY].map(f32::to_bits));
    let min = bits(run(T::F32, K::Min, &[a, b, c]));
    assert_eq!(min, [3.0f32, 1.0, -0.0, 0.0, -5.0, f32::INFINITY].map(f32::to_bits));
}

#[test]
fn float_sums_start_from_plus_zero() {
    let neg = f32s(&[-0.0, -0.0, 1.0]);
    let got = run(T::F32, K::Sum, &[neg.clone(), neg]);
    let bits: Vec<u32> = got.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(bits, [0.0f32, 0.0, 2.0].map(f32::to_bits));
}

#[test]
fn blocked_folds_agree_with_element_by_element_ones() {
    // The blocked loop against the element-major one (taken when a member is short):
    // a member longer than `out` by one element makes no difference to the result.
    let mut seed = 0x1234_5678_u64;
    let mut bytes = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (seed >> 56) as u8
            })
            .collect()
    };
    for (ty, kind) in [(T::F32, K::Sum), (T::F32, K::Max), (T::Bf16, K::Sum), (T::F16, K::Sum), (T::S32, K::Prod)] {
        let w = ty.byte_size();
        for elems in [1, 511, 512, 513, 1500] {
            let members: Vec<Vec<u8>> = (0..5).map(|_| bytes(elems * w)).collect();
            let blocked = run(ty, kind, &members);
            // One member one byte short forces the element-major loop; compare the
            // elements both loops compute fully.
            let mut short = members.clone();
            short[2].pop();
            let r = Reducer::new(ty, kind).unwrap();
            let refs: Vec<&[u8]> = short.iter().map(Vec::as_slice).collect();
            let mut reference = vec![0u8; elems * w];
            r.reduce(&refs, &mut reference);
            let whole = (elems - 1) * w;
            assert_eq!(blocked[..whole], reference[..whole], "{ty} {kind:?} {elems}");
        }
    }
}

#[test]
fn pred_ints_and_half_precision() {
    assert_eq!(run(T::Pred, K::Sum, &[vec![1, 1, 0], vec![1, 0, 0]]), vec![0, 1, 0]);
    assert_eq!(run(T::Pred, K::Max, &[vec![1, 7, 0], vec![1, 0, 0]]), vec![1, 1, 0]);
    assert_eq!(run(T::U8, K::Sum, &[vec![200], vec![100]]), vec![44]);
    assert_eq!(run(T::S8, K::Min, &[vec![0x80], vec![5]]), vec![0x80]);
    // bf16: 1 + 3 * 2^-9 in f32 rounds to 1 + 2^-7 in bf16; folding per step would
    // round 1 + 2^-9 back to 1.0 every time.
    let one = bf16::from_f32(1.0).to_le_bytes().to_vec();
    let tiny = bf16::from_f32(1.0 / 512.0).to_le_bytes().to_vec();
    let got = run(T::Bf16, K::Sum, &[one, tiny.clone(), tiny.clone(), tiny]);
    assert_eq!(bf16::from_le_bytes([got[0], got[1]]).to_f32(), 1.0 + 1.0 / 128.0);
    assert!(Reducer::new(T::F32, K::And).is_err());
    assert!(Reducer::new(T::F8E4M3FN, K::Sum).is_err());
}
