//! On GPUs: every kernel against a host reference (random odd sizes, f32/bf16/f16/s32,
//! one-shot and two-shot all-reduce, all-gather), and ≥ 1000 repeated launches so the
//! on-device epochs advance and the staging parity flips. Ignored unless run with
//! `--ignored` on a machine with ≥ 2 GPUs (scripts/gpu_check.sh), where missing GPUs fail.
#![cfg(feature = "cuda")]

use ffi::cuda::DeviceBuffer;
use kernels::cuda::{Algo, AllGather, AllReduce, Clique, Dtype, Red, device_count};
use rand::{Rng, SeedableRng};

/// The GPUs of this machine. These tests are `#[ignore]`d, so they only run when asked
/// for (`--ignored`, as scripts/gpu_check.sh does), and then a machine without 2 GPUs is a
/// failure, never a silent pass.
fn clique() -> Option<Clique> {
    match device_count() {
        Ok(n) if n >= 2 => Some(Clique::new(&(0..n.min(8)).collect::<Vec<_>>()).expect("clique")),
        r => panic!("these tests need 2 GPUs, found {r:?}"),
    }
}

/// Random elements as bytes, plus the f32 value of each (for the reference).
fn random(dtype: Dtype, n: usize, rng: &mut impl Rng) -> (Vec<u8>, Vec<f32>) {
    let mut b = Vec::new();
    let mut v = Vec::new();
    for _ in 0..n {
        match dtype {
            Dtype::F32 => {
                let x: f32 = rng.random_range(-4.0..4.0);
                b.extend_from_slice(&x.to_le_bytes());
                v.push(x);
            }
            Dtype::Bf16 => {
                let x = half::bf16::from_f32(rng.random_range(-4.0..4.0));
                b.extend_from_slice(&x.to_le_bytes());
                v.push(x.to_f32());
            }
            Dtype::F16 => {
                let x = half::f16::from_f32(rng.random_range(-4.0..4.0));
                b.extend_from_slice(&x.to_le_bytes());
                v.push(x.to_f32());
            }
            Dtype::S32 => {
                let x: i32 = rng.random_range(-1000..1000);
                b.extend_from_slice(&x.to_le_bytes());
                v.push(x as f32);
            }
            _ => unreachable!(),
        }
    }
    (b, v)
}

/// The kernels' result: fp32 accumulation in rank order, one rounding at the end.
fn reference(dtype: Dtype, red: Red, vals: &[Vec<f32>], raw: &[Vec<u8>]) -> Vec<u8> {
    let n = vals[0].len();
    let mut out = Vec::new();
    for i in 0..n {
        match dtype {
            Dtype::S32 => {
                let get = |r: usize| i32::from_le_bytes(raw[r][4 * i..4 * i + 4].try_into().unwrap());
                let mut a = get(0);
                for r in 1..raw.len() {
                    a = match red {
                        Red::Sum => a.wrapping_add(get(r)),
                        Red::Max => a.max(get(r)),
                        _ => unreachable!(),
                    };
                }
                out.extend_from_slice(&a.to_le_bytes());
            }
            _ => {
                let mut a = vals[0][i];
                for v in &vals[1..] {
                    a = match red {
                        Red::Sum => a + v[i],
                        Red::Max => a.max(v[i]),
                        _ => unreachable!(),
                    };
                    // f16 rounds every partial result (as the kernels, NCCL's __hadd and
                    // XLA:CPU do); f32 and bf16 fold in f32. Two members cannot tell them
                    // apart, more can.
                    if dtype == Dtype::F16 {
                        a = half::f16::from_f32(a).to_f32();
                    }
                }
                match dtype {
                    Dtype::F32 => out.extend_from_slice(&a.to_le_bytes()),
                    Dtype::Bf16 => out.extend_from_slice(&half::bf16::from_f32(a).to_le_bytes()),
                    Dtype::F16 => out.extend_from_slice(&half::f16::from_f32(a).to_le_bytes()),
                    _ => unreachable!(),
                }
            }
        }
    }
    out
}

#[test]
#[ignore = "needs 2 GPUs: run with --ignored on a GPU machine (scripts/gpu_check.sh)"]
fn all_reduce_matches_host_reference_bitwise() {
    let Some(c) = clique() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let sizes = [1usize, 3, 7, 8, 17, 1000, 4097, 65_537, 262_147, 1_048_579];
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::S32] {
        for red in [Red::Sum, Red::Max] {
            for algo in [Algo::OneShot, Algo::TwoShot] {
                let max = sizes.iter().max().unwrap() * dtype.size();
                let ar = AllReduce::new(&c, algo, dtype, red, max).unwrap();
                for &n in &sizes {
                    // Odd offsets into the buffers: not 16-byte aligned when off > 0.
                    let off = if n % 2 == 1 { dtype.size() } else { 0 };
                    let bytes = n * dtype.size();
                    let ins: Vec<DeviceBuffer> = c.alloc(bytes + off).unwrap();
                    let outs: Vec<DeviceBuffer> = c.alloc(bytes + off).unwrap();
                    let mut raw = Vec::new();
                    let mut vals = Vec::new();
                    for b in &ins {
                        let (r, v) = random(dtype, n, &mut rng);
                        let mut padded = vec![0u8; off];
                        padded.extend_from_slice(&r);
                        b.write(&padded).unwrap();
                        raw.push(r);
                        vals.push(v);
                    }
                    for o in &outs {
                        o.write(&vec![0xA5u8; bytes + off]).unwrap(); // poison
                    }
                    let want = reference(dtype, red, &vals, &raw);
                    let ip: Vec<u64> = ins.iter().map(|b| b.ptr + off as u64).collect();
                    let op: Vec<u64> = outs.iter().map(|b| b.ptr + off as u64).collect();
                    ar.launch(&c, &ip, &op, n).unwrap();
                    c.synchronize().unwrap();
                    for (r, o) in outs.iter().enumerate() {
                        let mut got = vec![0u8; bytes + off];
                        o.read(&mut got).unwrap();
                        assert!(
                            got[off..] == want[..],
                            "{algo:?} {} {} n={n} off={off}: device {r} differs from the reference",
                            dtype.name(),
                            red.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "needs 2 GPUs: run with --ignored on a GPU machine (scripts/gpu_check.sh)"]
fn repeated_launches_advance_epochs() {
    let Some(c) = clique() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for algo in [Algo::OneShot, Algo::TwoShot] {
        let n = 40_003usize;
        let ar = AllReduce::new(&c, algo, Dtype::F32, Red::Sum, n * 4).unwrap();
        // Two input sets alternate, so a stale staging buffer would show.
        let sets: Vec<(Vec<DeviceBuffer>, Vec<u8>)> = (0..2)
            .map(|_| {
                let ins = c.alloc(n * 4).unwrap();
                let mut raw = Vec::new();
                let mut vals = Vec::new();
                for b in &ins {
                    let (r, v) = random(Dtype::F32, n, &mut rng);
                    b.write(&r).unwrap();
                    raw.push(r);
                    vals.push(v);
                }
                let want = reference(Dtype::F32, Red::Sum, &vals, &raw);
                (ins, want)
            })
            .collect();
        let outs = c.alloc(n * 4).unwrap();
        let op: Vec<u64> = outs.iter().map(|b| b.ptr).collect();
        for it in 0..1001 {
            let (ins, want) = &sets[it % 2];
            let ip: Vec<u64> = ins.iter().map(|b| b.ptr).collect();
            ar.launch(&c, &ip, &op, n).unwrap();
            if it % 100 == 0 || it == 1000 {
                c.synchronize().unwrap();
                for o in &outs {
                    let mut got = vec![0u8; n * 4];
                    o.read(&mut got).unwrap();
                    assert!(got == *want, "{algo:?} launch {it}: wrong result");
                }
            }
        }
    }
}

#[test]
#[ignore = "needs 2 GPUs: run with --ignored on a GPU machine (scripts/gpu_check.sh)"]
fn all_gather_matches_concatenation() {
    let Some(c) = clique() else { return };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
    let w = c.len();
    let ag = AllGather::new(&c).unwrap();
    for bytes in [1usize, 5, 16, 33, 4099, 1 << 20, (1 << 20) + 7] {
        let ins = c.alloc(bytes).unwrap();
        let outs = c.alloc(w * bytes).unwrap();
        let mut want = Vec::new();
        for b in &ins {
            let r: Vec<u8> = (0..bytes).map(|_| rng.random()).collect();
            b.write(&r).unwrap();
            want.extend_from_slice(&r);
        }
        let ip: Vec<u64> = ins.iter().map(|b| b.ptr).collect();
        let op: Vec<u64> = outs.iter().map(|b| b.ptr).collect();
        for _ in 0..1000 {
            ag.launch(&c, &ip, &op, bytes).unwrap();
        }
        c.synchronize().unwrap();
        for (r, o) in outs.iter().enumerate() {
            let mut got = vec![0u8; w * bytes];
            o.read(&mut got).unwrap();
            assert!(got == want, "all-gather {bytes} B: device {r} differs");
        }
    }
}
