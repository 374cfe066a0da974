//! On GPUs: every kernel against a host reference (random odd sizes, f32/bf16/f16/s32,
//! one-shot, two-shot and Lamport all-reduce, all-gather), the float all-reduces against each
//! other on edge values, and ≥ 1000 repeated launches so the
//! on-device epochs advance and the staging parity flips. Ignored unless run with
//! `--ignored` on a machine with ≥ 2 GPUs (scripts/gpu_check.sh), where missing GPUs fail.
#![cfg(feature = "cuda")]

#[path = "common/launchers.rs"]
mod launchers;
#[path = "common/sum_order.rs"]
mod sum_order;

use launchers::CliqueExt;

use ffi::cuda::{Cuda, DeviceBuffer};
use ffi::gpu::GpuBuffer;
use kernels::cuda::{Algo, Clique, Dtype, Red, device_count};

type AllReduce = launchers::AllReduce<Cuda>;
type AllGather = launchers::AllGather<Cuda>;
type AllReduceNorm = launchers::AllReduceNorm<Cuda>;
use rand::{Rng, SeedableRng};

/// The GPUs of this machine. These tests are `#[ignore]`d, so they only run when asked
/// for (`--ignored`, as scripts/gpu_check.sh does), and then a machine without 2 GPUs is a
/// failure, never a silent pass.
fn clique() -> Option<Clique> {
    // Ranks that share one GPU (each its own stream): the protocols on a single-GPU machine.
    if let Some(n) = std::env::var("PEERLESS_TEST_RANKS_ON_ONE_GPU").ok().and_then(|v| v.parse().ok()) {
        return Some(launchers::on_one_device(0, n).expect("clique on one GPU"));
    }
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
            for algo in [Algo::OneShot, Algo::TwoShot, Algo::Lamport] {
                if algo == Algo::Lamport && !dtype.is_float() {
                    continue;
                }
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
                        b.write_at(0, &padded).unwrap();
                        raw.push(r);
                        vals.push(v);
                    }
                    for o in &outs {
                        o.write_at(0, &vec![0xA5u8; bytes + off]).unwrap(); // poison
                    }
                    let want = reference(dtype, red, &vals, &raw);
                    let ip: Vec<u64> = ins.iter().map(|b| b.ptr + off as u64).collect();
                    let op: Vec<u64> = outs.iter().map(|b| b.ptr + off as u64).collect();
                    ar.launch(&c, &ip, &op, n).unwrap();
                    c.synchronize().unwrap();
                    for (r, o) in outs.iter().enumerate() {
                        let mut got = vec![0u8; bytes + off];
                        o.read_at(0, &mut got).unwrap();
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

/// One float element's bits from an f32 value (bf16 and f16 rounded to nearest).
fn float_bits(dtype: Dtype, x: f32) -> Vec<u8> {
    match dtype {
        Dtype::F32 => x.to_le_bytes().to_vec(),
        Dtype::Bf16 => half::bf16::from_f32(x).to_le_bytes().to_vec(),
        Dtype::F16 => half::f16::from_f32(x).to_le_bytes().to_vec(),
        _ => unreachable!(),
    }
}

fn is_nan(dtype: Dtype, b: &[u8]) -> bool {
    match dtype {
        Dtype::F32 => f32::from_le_bytes(b.try_into().unwrap()).is_nan(),
        Dtype::Bf16 => half::bf16::from_le_bytes(b.try_into().unwrap()).is_nan(),
        Dtype::F16 => half::f16::from_le_bytes(b.try_into().unwrap()).is_nan(),
        _ => unreachable!(),
    }
}

/// The three float all-reduces give the same bits (NaN for NaN) on edge values: the Lamport
/// one-shot's sentinel (every bit set) inside an operand, -0 on every rank, infinities
/// that cancel; sizes that change between launches, so each region is cleared as far as its
/// last launch filled it.
#[test]
#[ignore = "needs 2 GPUs: run with --ignored on a GPU machine (scripts/gpu_check.sh)"]
fn float_algorithms_agree_bitwise_on_edge_values() {
    let Some(c) = clique() else { return };
    let w = c.len();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
    let sizes = [4099usize, 17, 65_537, 3, 4099, 65_536, 1, 8192];
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
        let es = dtype.size();
        let max = sizes.iter().max().unwrap() * es;
        let algos = [Algo::OneShot, Algo::TwoShot, Algo::Lamport];
        let ars: Vec<AllReduce> = algos.iter().map(|&a| AllReduce::new(&c, a, dtype, Red::Sum, max).unwrap()).collect();
        for round in 0..2 {
            for &n in &sizes {
                let ins: Vec<DeviceBuffer> = c.alloc(n * es).unwrap();
                for (r, b) in ins.iter().enumerate() {
                    let (mut raw, _) = random(dtype, n, &mut rng);
                    for i in 0..n {
                        let e = &mut raw[i * es..(i + 1) * es];
                        if i % 7 == 0 {
                            e.copy_from_slice(&float_bits(dtype, -0.0));
                        } else if i % 11 == 0 && r == 0 {
                            e.fill(0xFF);
                        } else if i % 13 == 0 && r < 2 {
                            e.copy_from_slice(&float_bits(
                                dtype,
                                if r == 0 { f32::INFINITY } else { f32::NEG_INFINITY },
                            ));
                        }
                    }
                    b.write_at(0, &raw).unwrap();
                }
                let ip: Vec<u64> = ins.iter().map(|b| b.ptr).collect();
                let mut results = Vec::new();
                for (a, ar) in algos.iter().zip(&ars) {
                    let outs: Vec<DeviceBuffer> = c.alloc(n * es).unwrap();
                    let op: Vec<u64> = outs.iter().map(|b| b.ptr).collect();
                    ar.launch(&c, &ip, &op, n).unwrap();
                    c.synchronize().unwrap();
                    ar.check().unwrap();
                    let mut got = vec![0u8; n * es];
                    outs[(round + n) % w].read_at(0, &mut got).unwrap();
                    results.push((*a, got));
                }
                let (_, first) = &results[0];
                for i in 0..n {
                    let e0 = &first[i * es..(i + 1) * es];
                    if i % 7 == 0 {
                        assert_eq!(e0, &float_bits(dtype, -0.0)[..], "{} n={n}: -0 on every rank", dtype.name());
                    }
                    if i % 7 != 0 && (i % 11 == 0 || (i % 13 == 0 && w > 1)) {
                        assert!(is_nan(dtype, e0), "{} n={n} element {i}: want NaN", dtype.name());
                    }
                    for (a, got) in &results[1..] {
                        let e = &got[i * es..(i + 1) * es];
                        let same = e == e0 || (is_nan(dtype, e) && is_nan(dtype, e0));
                        assert!(same, "{a:?} {} n={n} element {i}: {e:?} where one-shot gives {e0:?}", dtype.name());
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
    for algo in [Algo::OneShot, Algo::TwoShot, Algo::Lamport] {
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
                    b.write_at(0, &r).unwrap();
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
                    o.read_at(0, &mut got).unwrap();
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
            b.write_at(0, &r).unwrap();
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
            o.read_at(0, &mut got).unwrap();
            assert!(got == want, "all-gather {bytes} B: device {r} differs");
        }
    }
}

// ---- the one-shot all-reduce fused with the residual add and RMSNorm (issue 35 item 3) ----

use hlo::PrimitiveType;
use kernels::cuda::THREADS;
use launchers::NormBuffers;
use thunks::custom_call::{Epilogue, Mean, RoundTo};

fn prim(t: Dtype) -> PrimitiveType {
    match t {
        Dtype::F32 => PrimitiveType::F32,
        Dtype::Bf16 => PrimitiveType::Bf16,
        Dtype::F16 => PrimitiveType::F16,
        _ => unreachable!(),
    }
}

/// Element `i` of `b` (of type `t`) as an integer that orders like the value: the distance
/// between two is their distance in ulps of `t`.
fn ordered(b: &[u8], t: Dtype, i: usize) -> i64 {
    let (bits, sign) = match t {
        Dtype::F32 => (u32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()) as i64, 1i64 << 31),
        _ => (u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as i64, 1i64 << 15),
    };
    if bits & sign != 0 { -(bits & (sign - 1)) } else { bits }
}

/// One fused call's element types and epilogue.
#[derive(Debug, Clone)]
struct Form {
    /// The all-reduce operand's type.
    a: Dtype,
    x: Dtype,
    g: Option<Dtype>,
    h: Dtype,
    y: Dtype,
    e: Epilogue,
}

/// The forms XLA produces for a layer in element type `t` (see `Epilogue`): the all-reduce in
/// `t`, or (16-bit `t`) in f32 rounded to `t` before the add; the norm of rounded or unrounded
/// h; with gamma in f32 or `t`, or none; y in `t` (and once in f32); mean as a multiply or a
/// divide.
fn forms(t: Dtype, d: usize) -> Vec<Form> {
    let round = match t {
        Dtype::Bf16 => Some(RoundTo::Bf16),
        Dtype::F16 => Some(RoundTo::F16),
        _ => None,
    };
    let mut v = Vec::new();
    let mut n = 0;
    for promoted in [false, true] {
        if promoted && round.is_none() {
            continue;
        }
        for of_rounded in [true, false] {
            for g in [None, Some(Dtype::F32), Some(t)] {
                n += 1;
                let mean = if n % 2 == 0 {
                    Mean::Multiply((1.0f32 / d as f32).to_bits())
                } else {
                    Mean::Divide((d as f32).to_bits())
                };
                let e = Epilogue {
                    round_ar: if promoted { round } else { None },
                    norm_of_rounded: of_rounded,
                    mean,
                    eps: if n % 3 == 0 { 1e-5f32 } else { 1e-6f32 }.to_bits(),
                    gamma: g.is_some(),
                };
                let y = if n == 3 { Dtype::F32 } else { t };
                v.push(Form { a: if promoted { Dtype::F32 } else { t }, x: t, g, h: t, y, e });
            }
        }
    }
    v
}

/// Random values of `t` in `lo..hi`, as bytes.
fn random_in(t: Dtype, n: usize, lo: f32, hi: f32, rng: &mut impl Rng) -> Vec<u8> {
    let mut b = Vec::with_capacity(n * t.size());
    for _ in 0..n {
        let v: f32 = rng.random_range(lo..hi);
        match t {
            Dtype::F32 => b.extend_from_slice(&v.to_le_bytes()),
            Dtype::Bf16 => b.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            _ => b.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
        }
    }
    b
}

/// Runs one fused call of `rows` x `d` on every device of `c` and checks it against
/// kernels::epilogue: h bitwise; y bitwise against the kernel's order of the row's sum of
/// squares, and within 1 ulp (16-bit y) or 64 ulps (f32 y, a sum of up to 20000 squares in
/// another order) of the left-to-right reference; every device the same bits. With
/// `zero_residual`, h is also the plain all-reduce's result (the one-shot reference).
fn check_fused(c: &Clique, ar: &AllReduceNorm, f: &Form, rows: usize, d: usize, zero_residual: bool, seed: u64) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let w = c.len();
    let n = rows * d;
    let ins = c.alloc(n * f.a.size()).unwrap();
    let mut raw = Vec::new();
    let mut vals = Vec::new();
    for b in &ins {
        let (r, v) = random(f.a, n, &mut rng);
        b.write_at(0, &r).unwrap();
        raw.push(r);
        vals.push(v);
    }
    let x = if zero_residual { vec![0u8; n * f.x.size()] } else { random_in(f.x, n, -4.0, 4.0, &mut rng) };
    let g = f.g.map(|t| random_in(t, d, 0.5, 1.5, &mut rng));
    let xs = c.alloc(n * f.x.size()).unwrap();
    let gs = c.alloc(d * f.g.map_or(1, Dtype::size)).unwrap();
    let hs = c.alloc(n * f.h.size()).unwrap();
    let ys = c.alloc(n * f.y.size()).unwrap();
    for r in 0..w {
        xs[r].write_at(0, &x).unwrap();
        if let Some(g) = &g {
            gs[r].write_at(0, g).unwrap();
        }
        hs[r].write_at(0, &vec![0xA5u8; n * f.h.size()]).unwrap(); // poison
        ys[r].write_at(0, &vec![0xA5u8; n * f.y.size()]).unwrap();
    }
    let bufs: Vec<NormBuffers> = (0..w)
        .map(|r| NormBuffers {
            input: ins[r].ptr,
            residual: (xs[r].ptr, f.x),
            gamma: f.g.map(|t| (gs[r].ptr, t)),
            h: (hs[r].ptr, f.h),
            y: (ys[r].ptr, f.y),
        })
        .collect();
    ar.launch(c, &f.e, &bufs, rows, d).unwrap();
    c.synchronize().unwrap();
    ar.check().unwrap();
    // The all-reduce's result as the plain one-shot kernel gives it, then the epilogue.
    let s = reference(f.a, Red::Sum, &vals, &raw);
    let gref = g.as_deref().zip(f.g).map(|(b, t)| (b, prim(t)));
    let (mut h_want, mut y_seq) = (vec![0u8; n * f.h.size()], vec![0u8; n * f.y.size()]);
    let (s_ref, x_ref) = ((&s[..], prim(f.a)), (&x[..], prim(f.x)));
    kernels::epilogue::apply(
        &f.e,
        d,
        s_ref,
        x_ref,
        gref,
        &mut h_want,
        prim(f.h),
        &mut y_seq,
        prim(f.y),
        &kernels::epilogue::sum_of_squares,
    );
    let (mut h2, mut y_want) = (vec![0u8; n * f.h.size()], vec![0u8; n * f.y.size()]);
    let threads = THREADS as usize;
    // The kernel reads a row in 16-byte units of the all-reduce's type.
    let unit = 16 / f.a.size();
    let tree = move |hf: &[f32]| sum_order::block_sum_of_squares(hf, threads, unit);
    kernels::epilogue::apply(&f.e, d, s_ref, x_ref, gref, &mut h2, prim(f.h), &mut y_want, prim(f.y), &tree);
    assert_eq!(h2, h_want);
    if zero_residual && f.e.round_ar.is_none() && f.a == f.h {
        assert!(h_want == s, "{f:?}: with a zero residual h is the all-reduce");
    }
    let what = |r: usize| format!("{w} GPUs, {rows} x {d}, {f:?}: device {r}");
    // Two summation orders of d squares differ by up to (d - 1) f32 roundings of the sum, so
    // f32's y may move by ~d/2 ulps (65 seen at d 4096 on 4 H200s); a 16-bit y by 1 ulp.
    let tol = if f.y == Dtype::F32 { d as i64 } else { 1 };
    for r in 0..w {
        let (mut h, mut y) = (vec![0u8; n * f.h.size()], vec![0u8; n * f.y.size()]);
        hs[r].read_at(0, &mut h).unwrap();
        ys[r].read_at(0, &mut y).unwrap();
        if let Some(i) = (0..n).find(|&i| ordered(&h, f.h, i) != ordered(&h_want, f.h, i)) {
            panic!("{}: h[{i}] is {} ulps from the reference", what(r), ordered(&h, f.h, i) - ordered(&h_want, f.h, i));
        }
        if let Some(i) = (0..n).find(|&i| ordered(&y, f.y, i) != ordered(&y_want, f.y, i)) {
            panic!(
                "{}: y[{i}] is {} ulps from the reference in the kernel's order",
                what(r),
                ordered(&y, f.y, i) - ordered(&y_want, f.y, i)
            );
        }
        let far = (0..n).map(|i| (ordered(&y, f.y, i) - ordered(&y_seq, f.y, i)).abs()).max().unwrap_or(0);
        assert!(far <= tol, "{}: y is {far} ulps from the left-to-right reference", what(r));
    }
}

/// Cliques of the first 2 and (when present) 4 GPUs; fails without 2 (as `clique`).
fn fused_cliques() -> Vec<Clique> {
    if std::env::var_os("PEERLESS_TEST_RANKS_ON_ONE_GPU").is_some() {
        return clique().into_iter().collect();
    }
    let n = match device_count() {
        Ok(n) if n >= 2 => n,
        r => panic!("these tests need 2 GPUs, found {r:?}"),
    };
    [2usize, 4]
        .iter()
        .filter(|&&w| w <= n)
        .map(|&w| Clique::new(&(0..w).collect::<Vec<_>>()).expect("clique"))
        .collect()
}

#[test]
#[ignore = "needs 2 GPUs: run with --ignored on a GPU machine (scripts/gpu_check.sh)"]
fn fused_all_reduce_rmsnorm_matches_epilogue_reference() {
    let shapes = [(1usize, 4096usize), (8, 4096), (1, 1000), (8, 1000)];
    for c in fused_cliques() {
        for t in [Dtype::Bf16, Dtype::F16, Dtype::F32] {
            let mut seed = 100;
            for (f, lamport) in forms(t, 4096).into_iter().flat_map(|f| [(f.clone(), false), (f, true)]) {
                // One communicator per operand type, sized for the largest shape; both protocols.
                let max = 8 * 4096 * f.a.size();
                let ar = if lamport { AllReduceNorm::lamport(&c, f.a, max) } else { AllReduceNorm::new(&c, f.a, max) };
                let ar = ar.unwrap();
                for &(rows, d) in &shapes {
                    let mut f = f.clone();
                    // The mean constant belongs to the row length.
                    f.e.mean = match f.e.mean {
                        Mean::Multiply(_) => Mean::Multiply((1.0f32 / d as f32).to_bits()),
                        Mean::Divide(_) => Mean::Divide((d as f32).to_bits()),
                    };
                    seed += 1;
                    check_fused(&c, &ar, &f, rows, d, false, seed);
                }
            }
        }
    }
}

#[test]
#[ignore = "needs 2 GPUs: run with --ignored on a GPU machine (scripts/gpu_check.sh)"]
fn fused_all_reduce_rmsnorm_edges() {
    for c in fused_cliques() {
        for t in [Dtype::Bf16, Dtype::F16, Dtype::F32] {
            let f = forms(t, 1).into_iter().find(|f| f.g.is_some()).unwrap();
            for ar in [
                AllReduceNorm::new(&c, f.a, 130 * 20_000 * f.a.size()).unwrap(),
                AllReduceNorm::lamport(&c, f.a, 130 * 20_000 * f.a.size()).unwrap(),
            ] {
                // A zero residual: h is the plain all-reduce's result, bitwise.
                for &(rows, d, zero) in &[
                    (8usize, 4096usize, true),
                    (5, 1001, false),   // rows not 16-byte multiples: element copies
                    (3, 8192, false),   // every hf kept in shared memory
                    (3, 16_384, false), // half of them recomputed from the staging
                    (2, 20_000, false),
                    (130, 256, false), // more rows than blocks
                    (1, 1, false),
                ] {
                    let mut f = f.clone();
                    f.e.mean = Mean::Multiply((1.0f32 / d as f32).to_bits());
                    check_fused(&c, &ar, &f, rows, d, zero, 7 + rows as u64 * 31 + d as u64);
                }
                // Repeated launches: the epochs advance and the staging parity flips.
                for it in 0..64u64 {
                    check_fused(&c, &ar, &f, 8, 1000, false, 1000 + it);
                }
            }
        }
    }
}

/// The runtime keeps its peer probe for later processes' compiles (the file names the driver
/// and the GPUs' UUIDs, one row per GPU), and free memory is read through the contexts the
/// runtime (here; XLA in a JAX process) made. Needs one GPU or more.
#[test]
#[ignore = "needs a GPU: run with --ignored on a GPU machine (scripts/gpu_check.sh)"]
fn the_runtime_keeps_its_peer_probe() {
    use kernels::gpu::xla;
    let n = device_count().expect("CUDA").min(8);
    assert!(n >= 1, "no GPU");
    let table = xla::peer_table::<Cuda>(false).expect("the runtime opens the GPUs");
    assert_eq!(table.num_devices(), n);
    let known = xla::known_peer_table::<Cuda>(false).expect("known once the runtime opened the GPUs");
    assert_eq!(known.num_devices(), n);
    let path = thunks::runtime::cache_dir().expect("a cache directory").join("peer-probe-cuda.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let key = <Cuda as ffi::gpu::Interop>::machine_key().unwrap().expect("CUDA keeps a key");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], key, "{text}");
    assert!(key.starts_with("cuda driver ") && key.split(' ').count() == 3 + n, "{key}");
    let rows: Vec<&str> = lines[2].split(' ').collect();
    assert_eq!(rows.len(), n, "{text}");
    for (a, row) in rows.iter().enumerate() {
        for b in 0..n {
            assert_eq!(row.as_bytes()[b] == b'1', table.can_access(a, b), "{a}→{b}: {text}");
        }
    }
    let free = xla::least_free_memory::<Cuda>().expect("free memory through the runtime's contexts");
    assert!(free > 1 << 30, "{free} bytes free");
    println!("kept probe {}: {key}; least free {:.1} GiB", path.display(), free as f64 / (1u64 << 30) as f64);
}
