//! Shared helpers for the host collective tests: call layouts, one thread per device, and a
//! straightforward reference (oracle) for every collective, written independently of the
//! kernels' strided-run code.
#![allow(dead_code)]

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use half::{bf16, f16};
use hlo::analysis::ReductionKind as K;
use hlo::{ArrayShape, PrimitiveType as T};
use kernels::Error;
use kernels::host::{CollectiveCall, HostCluster, HostDevice, PeerMatrix, Region, scratch_bytes, signal_bytes};
use rand::{Rng, RngCore};
use thunks::{CollectiveConfig, CollectiveKind, CollectiveOp, Implementation, KernelAlgorithm as A};

pub fn full_peers(n: usize) -> Arc<PeerMatrix> {
    Arc::new(vec![vec![true; n]; n])
}

pub fn cluster(n: usize, arena: usize) -> Arc<HostCluster> {
    HostCluster::new(n, arena, full_peers(n)).unwrap()
}

/// Runs `f` on one thread per device and returns the results in rank order.
pub fn on_devices<R: Send>(cluster: &Arc<HostCluster>, f: impl Fn(HostDevice) -> R + Sync) -> Vec<R> {
    thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..cluster.num_devices()).map(|d| s.spawn(move || f(cluster.device(d)))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The kernel for a collective kind (all-reduce: one-shot or two-shot by `two_shot`).
pub fn kernel(kind: CollectiveKind, two_shot: bool) -> Implementation {
    Implementation::Kernel(match kind {
        CollectiveKind::AllReduce if two_shot => A::TwoShotAllReduce,
        CollectiveKind::AllReduce => A::OneShotAllReduce,
        CollectiveKind::AllGather => A::DirectAllGather,
        CollectiveKind::AllToAll => A::DirectAllToAll,
        CollectiveKind::ReduceScatter => A::DirectReduceScatter,
        _ => A::DirectPermute,
    })
}

/// A collective to run: one config plus the operands' shape.
#[derive(Clone, Debug)]
pub struct Case {
    pub config: CollectiveConfig,
    pub implementation: Implementation,
    /// Dimensions of every operand.
    pub dims: Vec<i64>,
}

impl Case {
    pub fn new(
        kind: CollectiveKind,
        implementation: Implementation,
        groups: Vec<Vec<usize>>,
        ty: T,
        dims: &[i64],
    ) -> Self {
        let elems: i64 = dims.iter().product();
        let config = CollectiveConfig {
            op: CollectiveOp { kind, is_async: false },
            groups,
            element_type: ty,
            reduction: None,
            bytes_per_device: elems as usize * ty.byte_size(),
            dimension: None,
            source_target_pairs: vec![],
            num_operands: 1,
        };
        Case { config, implementation, dims: dims.to_vec() }
    }

    pub fn reduction(mut self, r: K) -> Self {
        self.config.reduction = Some(r);
        self
    }

    pub fn dimension(mut self, d: usize) -> Self {
        self.config.dimension = Some(d);
        self
    }

    pub fn pairs(mut self, pairs: &[(usize, usize)]) -> Self {
        self.config.source_target_pairs = pairs.to_vec();
        self
    }

    pub fn operands(mut self, n: usize) -> Self {
        self.config.num_operands = n;
        self.config.bytes_per_device = n * self.operand_bytes();
        self
    }

    pub fn ty(&self) -> T {
        self.config.element_type
    }

    pub fn operand_bytes(&self) -> usize {
        self.dims.iter().product::<i64>() as usize * self.ty().byte_size()
    }

    /// Group size (groups are uniform in these tests).
    pub fn g(&self) -> usize {
        self.config.groups.first().map_or(1, Vec::len)
    }

    pub fn output_bytes(&self) -> usize {
        let b = self.operand_bytes();
        match self.config.op.kind {
            CollectiveKind::AllGather => b * self.g(),
            CollectiveKind::ReduceScatter => b / self.g(),
            _ => b,
        }
    }

    pub fn shape(&self) -> ArrayShape {
        ArrayShape::new(self.ty(), self.dims.clone())
    }
}

/// Regions for one case: data from `base` (each region shifted by `skew` bytes, so
/// offsets are deliberately unaligned when `skew` is odd), signals at `signals`.
#[derive(Clone, Debug)]
pub struct Layout {
    pub inputs: Vec<Region>,
    pub outputs: Vec<Region>,
    pub scratch: Region,
    pub signals: Region,
    pub end: usize,
}

impl Layout {
    pub fn new(case: &Case, base: usize, skew: usize, signals: usize) -> Self {
        let mut at = base;
        let mut take = |len: usize| {
            let r = Region::new(at + skew, len);
            at += (len + skew).div_ceil(16) * 16 + 16;
            r
        };
        let n = case.config.num_operands;
        let inputs = (0..n).map(|_| take(case.operand_bytes())).collect();
        let outputs = (0..n).map(|_| take(case.output_bytes())).collect();
        let scratch = take(scratch_bytes(&case.config, case.implementation));
        let signals = Region::new(signals, signal_bytes(&case.config, case.implementation));
        Layout { inputs, outputs, scratch, signals, end: at }
    }

    /// Data from 0, signals right after it.
    pub fn packed(case: &Case, skew: usize) -> Self {
        let mut l = Layout::new(case, 0, skew, 0);
        l.signals.offset = l.end.div_ceil(8) * 8;
        l.end = l.signals.offset + l.signals.len;
        l
    }

    pub fn call<'a>(&self, case: &'a Case, name: &'a str, timeout: Duration) -> CollectiveCall<'a> {
        CollectiveCall {
            config: &case.config,
            implementation: case.implementation,
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            operand_shapes: vec![case.shape(); case.config.num_operands],
            scratch: self.scratch,
            signals: self.signals,
            timeout,
            name,
        }
    }
}

/// Writes `inputs[operand]`, runs the call, reads the outputs back.
pub fn run_one(dev: &HostDevice, call: &CollectiveCall, inputs: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, Error> {
    for (r, data) in call.inputs.iter().zip(inputs) {
        dev.write(r.offset, data).unwrap();
    }
    dev.run_collective(call)?;
    Ok(call.outputs.iter().map(|r| dev.read(r.offset, r.len).unwrap()).collect())
}

/// Random operand bytes for `ty` (pred: 0 or 1; everything else: any bit pattern).
pub fn random_bytes(rng: &mut impl RngCore, ty: T, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    if ty == T::Pred {
        v.iter_mut().for_each(|b| *b &= 1);
    }
    v
}

/// Random but tame values (small integers, also as floats) so that float sums are exact
/// in every order; used where results are compared with per-step folding.
pub fn tame_bytes(rng: &mut impl Rng, ty: T, len: usize) -> Vec<u8> {
    let n = len / ty.byte_size().max(1);
    let mut out = Vec::with_capacity(len);
    for _ in 0..n {
        let x: i8 = rng.random_range(-8..=8);
        match ty {
            T::F16 => out.extend(f16::from_f32(f32::from(x)).to_le_bytes()),
            T::Bf16 => out.extend(bf16::from_f32(f32::from(x)).to_le_bytes()),
            T::F32 => out.extend(f32::from(x).to_le_bytes()),
            T::F64 => out.extend(f64::from(x).to_le_bytes()),
            _ => out.extend(random_bytes(rng, ty, ty.byte_size())),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The oracle.

/// Element-wise fold of `vals` (members in order) with XLA:CPU's collective semantics: float
/// sums, max and min fold from the identity (+0, -inf, +inf), max / min take a member only
/// when it is strictly greater / smaller (so NaN members are skipped and the earlier of -0 / +0
/// stays); f16 rounds after every step, bf16 accumulates in f32 and rounds once.
pub fn reduce(ty: T, kind: K, vals: &[&[u8]]) -> Vec<u8> {
    let w = ty.byte_size();
    let len = vals[0].len();
    if vals.len() == 1 {
        return vals[0].to_vec();
    }
    let mut out = Vec::with_capacity(len);
    for i in (0..len).step_by(w.max(1)) {
        let el = |m: usize| &vals[m][i..i + w];
        macro_rules! int {
            ($t:ty) => {{
                let get = |m| <$t>::from_le_bytes(el(m).try_into().unwrap());
                let mut a = get(0);
                for m in 1..vals.len() {
                    let b = get(m);
                    a = match kind {
                        K::Sum => a.wrapping_add(b),
                        K::Prod => a.wrapping_mul(b),
                        K::Min => a.min(b),
                        K::Max => a.max(b),
                        K::And => a & b,
                        K::Or => a | b,
                    };
                }
                out.extend(a.to_le_bytes());
            }};
        }
        macro_rules! float {
            ($acc:ty, $get:expr, $put:expr, $round:expr) => {{
                let get = $get;
                let round = $round;
                let (mut a, first): ($acc, usize) = match kind {
                    K::Sum => (0.0, 0),
                    K::Max => (<$acc>::NEG_INFINITY, 0),
                    K::Min => (<$acc>::INFINITY, 0),
                    _ => (get(el(0)), 1),
                };
                for m in first..vals.len() {
                    let b: $acc = get(el(m));
                    a = match kind {
                        K::Sum => round(a + b),
                        K::Prod => round(a * b),
                        K::Max => {
                            if b > a {
                                b
                            } else {
                                a
                            }
                        }
                        K::Min => {
                            if b < a {
                                b
                            } else {
                                a
                            }
                        }
                        K::And | K::Or => panic!("float {kind}"),
                    };
                }
                out.extend($put(a));
            }};
        }
        match ty {
            T::Pred => {
                let mut a = el(0)[0] != 0;
                for m in 1..vals.len() {
                    let b = el(m)[0] != 0;
                    a = match kind {
                        K::Sum => a ^ b,
                        K::Prod | K::Min | K::And => a & b,
                        K::Max | K::Or => a | b,
                    };
                }
                out.push(u8::from(a));
            }
            T::S8 => int!(i8),
            T::S16 => int!(i16),
            T::S32 => int!(i32),
            T::S64 => int!(i64),
            T::U8 => int!(u8),
            T::U16 => int!(u16),
            T::U32 => int!(u32),
            T::U64 => int!(u64),
            T::F16 => float!(
                f32,
                |b: &[u8]| f16::from_le_bytes(b.try_into().unwrap()).to_f32(),
                |v: f32| f16::from_f32(v).to_le_bytes(),
                |v: f32| f16::from_f32(v).to_f32()
            ),
            T::Bf16 => float!(
                f32,
                |b: &[u8]| bf16::from_le_bytes(b.try_into().unwrap()).to_f32(),
                |v: f32| bf16::from_f32(v).to_le_bytes(),
                |v: f32| v
            ),
            T::F32 => float!(f32, |b: &[u8]| f32::from_le_bytes(b.try_into().unwrap()), f32::to_le_bytes, |v: f32| v),
            T::F64 => float!(f64, |b: &[u8]| f64::from_le_bytes(b.try_into().unwrap()), f64::to_le_bytes, |v: f64| v),
            _ => panic!("reduce {ty}"),
        }
    }
    out
}

/// Index-by-index block `k` of `g` along `dim` of a row-major array.
pub fn block(data: &[u8], dims: &[i64], elem: usize, dim: usize, g: usize, k: usize) -> Vec<u8> {
    let outer: usize = dims[..dim].iter().product::<i64>() as usize;
    let n = dims[dim] as usize;
    let inner: usize = dims[dim + 1..].iter().product::<i64>() as usize * elem;
    let c = n / g;
    let mut out = Vec::new();
    for o in 0..outer {
        for i in k * c..(k + 1) * c {
            let at = (o * n + i) * inner;
            out.extend_from_slice(&data[at..at + inner]);
        }
    }
    out
}

/// Concatenates equally shaped arrays along `dim`.
pub fn concat(parts: &[Vec<u8>], dims: &[i64], elem: usize, dim: usize) -> Vec<u8> {
    let outer: usize = dims[..dim].iter().product::<i64>() as usize;
    let row = dims[dim..].iter().product::<i64>() as usize * elem;
    let mut out = Vec::new();
    for o in 0..outer {
        for p in parts {
            out.extend_from_slice(&p[o * row..(o + 1) * row]);
        }
    }
    out
}

/// Expected outputs `[device][result]` for `inputs[device][operand]`.
pub fn expected(case: &Case, inputs: &[Vec<Vec<u8>>]) -> Vec<Vec<Vec<u8>>> {
    let cfg = &case.config;
    let n = inputs.len();
    let ty = case.ty();
    let elem = ty.byte_size();
    let ops = cfg.num_operands;
    let mut out: Vec<Vec<Vec<u8>>> = vec![vec![]; n];
    if cfg.op.kind == CollectiveKind::CollectivePermute {
        for (d, o) in out.iter_mut().enumerate() {
            *o = match cfg.source_target_pairs.iter().find(|p| p.1 == d) {
                Some(&(s, _)) => inputs[s].clone(),
                None => vec![vec![0; case.operand_bytes()]; ops],
            };
        }
        return out;
    }
    let dim = cfg.dimension.unwrap_or(0);
    for group in &cfg.groups {
        let g = group.len();
        for (idx, &me) in group.iter().enumerate() {
            out[me] = match cfg.op.kind {
                CollectiveKind::AllReduce => (0..ops)
                    .map(|j| {
                        let vals: Vec<&[u8]> = group.iter().map(|&m| inputs[m][j].as_slice()).collect();
                        reduce(ty, cfg.reduction.unwrap(), &vals)
                    })
                    .collect(),
                CollectiveKind::ReduceScatter => (0..ops)
                    .map(|j| {
                        let blocks: Vec<Vec<u8>> =
                            group.iter().map(|&m| block(&inputs[m][j], &case.dims, elem, dim, g, idx)).collect();
                        let vals: Vec<&[u8]> = blocks.iter().map(Vec::as_slice).collect();
                        reduce(ty, cfg.reduction.unwrap(), &vals)
                    })
                    .collect(),
                CollectiveKind::AllGather => (0..ops)
                    .map(|j| {
                        let parts: Vec<Vec<u8>> = group.iter().map(|&m| inputs[m][j].clone()).collect();
                        concat(&parts, &case.dims, elem, dim)
                    })
                    .collect(),
                CollectiveKind::AllToAll if cfg.dimension.is_some() => {
                    let parts: Vec<Vec<u8>> =
                        group.iter().map(|&m| block(&inputs[m][0], &case.dims, elem, dim, g, idx)).collect();
                    let mut chunk_dims = case.dims.clone();
                    chunk_dims[dim] /= g as i64;
                    vec![concat(&parts, &chunk_dims, elem, dim)]
                }
                // Tuple form: result i of member `idx` is operand `idx` of member i.
                CollectiveKind::AllToAll => group.iter().map(|&m| inputs[m][idx].clone()).collect(),
                _ => unreachable!(),
            };
        }
    }
    out
}

/// `bufs` with every float NaN replaced by one canonical NaN: which NaN's payload a sum of
/// several NaNs keeps is not part of the contract (the compiler may commute an addition).
pub fn canonical_nans(ty: T, bufs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let canon = |b: &[u8]| -> Vec<u8> {
        match ty {
            T::F32 => b
                .chunks(4)
                .flat_map(|c| {
                    let v = f32::from_le_bytes(c.try_into().unwrap());
                    if v.is_nan() { f32::NAN } else { v }.to_le_bytes()
                })
                .collect(),
            T::F64 => b
                .chunks(8)
                .flat_map(|c| {
                    let v = f64::from_le_bytes(c.try_into().unwrap());
                    if v.is_nan() { f64::NAN } else { v }.to_le_bytes()
                })
                .collect(),
            T::F16 => b
                .chunks(2)
                .flat_map(|c| {
                    let v = f16::from_le_bytes(c.try_into().unwrap());
                    if v.is_nan() { f16::NAN } else { v }.to_le_bytes()
                })
                .collect(),
            T::Bf16 => b
                .chunks(2)
                .flat_map(|c| {
                    let v = bf16::from_le_bytes(c.try_into().unwrap());
                    if v.is_nan() { bf16::NAN } else { v }.to_le_bytes()
                })
                .collect(),
            _ => b.to_vec(),
        }
    };
    bufs.iter().map(|b| canon(b)).collect()
}

/// Runs `case` once on a fresh cluster with random inputs and checks every device's
/// results against the oracle (and, for all-reduce, bitwise equality within groups).
pub fn check_case(case: &Case, n: usize, skew: usize, seed: u64) {
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let ops = case.config.num_operands;
    let inputs: Vec<Vec<Vec<u8>>> =
        (0..n).map(|_| (0..ops).map(|_| random_bytes(&mut rng, case.ty(), case.operand_bytes())).collect()).collect();
    let layout = Layout::packed(case, skew);
    let cl = cluster(n, layout.end + 64);
    let got = on_devices(&cl, |dev| {
        let call = layout.call(case, "c", Duration::from_secs(20));
        run_one(&dev, &call, &inputs[dev.rank()])
    });
    let want = expected(case, &inputs);
    for (d, (g, w)) in got.iter().zip(&want).enumerate() {
        let g = g.as_ref().unwrap_or_else(|e| panic!("{} on device {d}: {e}", case.config));
        if canonical_nans(case.ty(), g) != canonical_nans(case.ty(), w) {
            // The first differing element, with every member's input there.
            let es = case.ty().byte_size().max(1);
            let at = |a: &[Vec<u8>]| a.first().cloned().unwrap_or_default();
            let (gb, wb) = (at(g), at(w));
            let i = gb.iter().zip(&wb).position(|(x, y)| x != y).unwrap_or(0) / es * es;
            let ins: Vec<String> = inputs.iter().map(|m| format!("{:02x?}", m[0].get(i..i + es))).collect();
            panic!(
                "{} ({}) on device {d} of {n}, skew {skew}: byte {i}: got {:02x?}, want {:02x?}; inputs {ins:?}",
                case.config,
                case.implementation,
                gb.get(i..i + es),
                wb.get(i..i + es)
            );
        }
    }
}
