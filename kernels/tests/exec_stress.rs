//! Randomized stress test of the host executor against the reference interpreter: over a
//! thousand executions of generated HLO modules, each holding one collective (all-reduce
//! one-shot / two-shot / fallback, all-reduce-start/done, all-gather, all-gather-start/done,
//! all-to-all in array and tuple form, reduce-scatter, collective-permute and
//! collective-permute-start/done) with random sizes (0, 1, odd byte counts), dtypes
//! (including f8e4m3fn and s4, which must fall back), group layouts (all devices,
//! explicit subgroups in random order, iota and transposed iota), device counts 1-8 in
//! replica and partition mode, and both the default flags (kernels where allowed, with
//! small all-reduce cut-offs) and all-fallback flags.
//!
//! Each module is compiled into ONE `HostExecutable` and executed several times with fresh
//! inputs, so signal epochs keep counting across executions. Every result leaf is compared
//! with `interp::run`: bitwise, except bf16 sums and products, which the kernels fold in f32
//! and round once; those are compared bitwise with the interpreter's f32 result of the same
//! module rounded once, and within a tolerance with the interpreter itself. (f16 rounds after
//! every step, as XLA:CPU and the interpreter do, so it compares bitwise.)
//!
//! A mismatch reports the seed, the case, the flags and the module text.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use emitter::{DeviceMode, Flags};
use half::{bf16, f16};
use hlo::{Array, Literal, Module, PrimitiveType as T};
use interp::{Mode, RunConfig};
use kernels::exec::{BackendKind, Executable};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use thunks::{Implementation, KernelAlgorithm};

/// The fixed seed; `EXEC_STRESS_SEED` (decimal or 0x-hex) overrides it to reproduce or explore.
const SEED: u64 = 0x5eed_c011_ec71_0e55;
/// How many modules to generate (each runs 3-5 times); `EXEC_STRESS_MODULES` overrides it.
const MODULES: usize = 3500;

fn env_number(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => v.replace('_', "").parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number")))
}
const ONE_SHOT_MAX: usize = 64;
const TWO_SHOT_MAX: usize = 1024;
const SMALL_CUTOFFS: &str = "--one_shot_max_bytes=64 --two_shot_max_bytes=1024";
const ALL_FALLBACK: &str = "--all_reduce_backend=fallback --all_gather_backend=fallback \
    --all_to_all_backend=fallback --reduce_scatter_backend=fallback --collective_permute_backend=fallback";

const REDUCE_TYPES: [T; 9] = [T::F32, T::F16, T::Bf16, T::F64, T::S8, T::S32, T::U8, T::U64, T::Pred];
const MOVE_TYPES: [T; 11] =
    [T::F32, T::F16, T::Bf16, T::F64, T::S8, T::S32, T::U8, T::U64, T::Pred, T::F8E4M3FN, T::S4];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    AllReduce,
    AllReduceStart,
    AllGather,
    AllGatherStart,
    AllToAll,
    AllToAllTuple,
    ReduceScatter,
    Permute,
    PermuteStart,
}

impl Op {
    const ALL: [Op; 9] = [
        Op::AllReduce,
        Op::AllReduceStart,
        Op::AllGather,
        Op::AllGatherStart,
        Op::AllToAll,
        Op::AllToAllTuple,
        Op::ReduceScatter,
        Op::Permute,
        Op::PermuteStart,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all-reduce",
            Op::AllReduceStart => "all-reduce-start",
            Op::AllGather => "all-gather",
            Op::AllGatherStart => "all-gather-start",
            Op::AllToAll => "all-to-all",
            Op::AllToAllTuple => "all-to-all(tuple)",
            Op::ReduceScatter => "reduce-scatter",
            Op::Permute => "collective-permute",
            Op::PermuteStart => "collective-permute-start",
        }
    }

    fn reduces(self) -> bool {
        matches!(self, Op::AllReduce | Op::AllReduceStart | Op::ReduceScatter)
    }

    fn is_all_reduce(self) -> bool {
        matches!(self, Op::AllReduce | Op::AllReduceStart)
    }

    fn is_permute(self) -> bool {
        matches!(self, Op::Permute | Op::PermuteStart)
    }

    /// Has a `use_global_device_ids` attribute (partition mode uses flattened ids).
    fn has_global_ids(self) -> bool {
        matches!(self, Op::AllReduce | Op::AllReduceStart | Op::AllGather | Op::AllGatherStart | Op::ReduceScatter)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Red {
    Sum,
    Prod,
    Min,
    Max,
    And,
    Or,
}

impl Red {
    fn opcode(self) -> &'static str {
        match self {
            Red::Sum => "add",
            Red::Prod => "multiply",
            Red::Min => "minimum",
            Red::Max => "maximum",
            Red::And => "and",
            Red::Or => "or",
        }
    }
}

/// A replica_groups attribute and the group size it gives.
#[derive(Clone, Debug)]
enum Groups {
    /// `{}`: all devices (where the mode allows it).
    Empty,
    Explicit(Vec<Vec<usize>>),
    /// `[num_groups,size]<=[reshape]T(perm)` (no `T(..)` when `perm` is empty).
    Iota {
        num_groups: usize,
        size: usize,
        reshape: Vec<usize>,
        perm: Vec<usize>,
    },
}

fn join(v: &[impl ToString]) -> String {
    v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

impl Groups {
    fn attr(&self) -> String {
        match self {
            Groups::Empty => "replica_groups={}".into(),
            Groups::Explicit(g) => {
                let inner: Vec<String> = g.iter().map(|m| format!("{{{}}}", join(m))).collect();
                format!("replica_groups={{{}}}", inner.join(","))
            }
            Groups::Iota { num_groups, size, reshape, perm } => {
                let mut s = format!("replica_groups=[{num_groups},{size}]<=[{}]", join(reshape));
                if !perm.is_empty() {
                    write!(s, "T({})", join(perm)).unwrap();
                }
                s
            }
        }
    }
}

/// One generated module: everything its text is made of.
#[derive(Clone, Debug)]
struct Spec {
    n: usize,
    partition: bool,
    op: Op,
    ty: T,
    red: Option<Red>,
    /// Operand dims (per operand; the tuple all-to-all has `g` operands of these dims).
    dims: Vec<i64>,
    /// Gather / scatter / split dimension.
    dim: usize,
    /// Group size.
    g: usize,
    groups: Groups,
    /// Collective-permute pairs (group-local ids).
    pairs: Vec<(usize, usize)>,
    fallback: bool,
}

fn shape(ty: T, dims: &[i64]) -> String {
    format!("{}[{}]", ty.name(), join(dims))
}

impl Spec {
    fn flags(&self) -> String {
        if self.fallback { format!("{SMALL_CUTOFFS} {ALL_FALLBACK}") } else { SMALL_CUTOFFS.into() }
    }

    fn result_dims(&self) -> Vec<i64> {
        let mut r = self.dims.clone();
        match self.op {
            Op::AllGather | Op::AllGatherStart => r[self.dim] *= self.g as i64,
            Op::ReduceScatter => r[self.dim] /= self.g as i64,
            _ => {}
        }
        r
    }

    /// The module text, with element type `ty` (the spec's own, or f32 for the twin that
    /// gives 16-bit reductions' fold-in-f32-round-once reference).
    fn text(&self, ty: T) -> String {
        let mut s = String::new();
        let count = if self.partition { "num_partitions" } else { "replica_count" };
        writeln!(s, "HloModule stress, {count}={}\n", self.n).unwrap();
        if let Some(r) = self.red {
            let t = ty.name();
            writeln!(s, "red {{\n  x = {t}[] parameter(0)\n  y = {t}[] parameter(1)").unwrap();
            writeln!(s, "  ROOT z = {t}[] {}(x, y)\n}}\n", r.opcode()).unwrap();
        }
        let a = shape(ty, &self.dims);
        let out = shape(ty, &self.result_dims());
        let mut attrs = Vec::new();
        if self.partition {
            attrs.push("channel_id=1".to_string());
            if self.op.has_global_ids() {
                attrs.push("use_global_device_ids=true".into());
            }
        }
        if self.op.is_permute() {
            let p: Vec<String> = self.pairs.iter().map(|(a, b)| format!("{{{a},{b}}}")).collect();
            attrs.push(format!("source_target_pairs={{{}}}", p.join(",")));
        } else {
            attrs.push(self.groups.attr());
        }
        match self.op {
            Op::AllGather | Op::AllGatherStart | Op::ReduceScatter | Op::AllToAll => {
                attrs.push(format!("dimensions={{{}}}", self.dim));
            }
            _ => {}
        }
        if self.red.is_some() {
            attrs.push("to_apply=red".into());
        }
        let attrs = attrs.join(", ");
        writeln!(s, "ENTRY main {{").unwrap();
        match self.op {
            Op::AllToAllTuple => {
                for i in 0..self.g {
                    writeln!(s, "  p{i} = {a} parameter({i})").unwrap();
                }
                let names: Vec<String> = (0..self.g).map(|i| format!("p{i}")).collect();
                let tuple = format!("({})", vec![a.clone(); self.g].join(", "));
                writeln!(s, "  ROOT c = {tuple} all-to-all({}), {attrs}", names.join(", ")).unwrap();
            }
            op => {
                writeln!(s, "  p = {a} parameter(0)").unwrap();
                match op {
                    Op::AllReduceStart => {
                        writeln!(s, "  st = {a} all-reduce-start(p), {attrs}").unwrap();
                        writeln!(s, "  ROOT c = {a} all-reduce-done(st)").unwrap();
                    }
                    Op::AllGatherStart => {
                        writeln!(s, "  st = ({a}, {out}) all-gather-start(p), {attrs}").unwrap();
                        writeln!(s, "  ROOT c = {out} all-gather-done(st)").unwrap();
                    }
                    Op::PermuteStart => {
                        writeln!(s, "  st = ({a}, {a}, u32[], u32[]) collective-permute-start(p), {attrs}").unwrap();
                        writeln!(s, "  ROOT c = {a} collective-permute-done(st)").unwrap();
                    }
                    _ => writeln!(s, "  ROOT c = {out} {}(p), {attrs}", op.name()).unwrap(),
                }
            }
        }
        s.push_str("}\n");
        s
    }

    /// Whether results may differ from the interpreter's in rounding (16-bit float sums
    /// and products: the kernels fold in f32 and round once).
    fn rounds_once(&self) -> bool {
        self.ty == T::Bf16 && matches!(self.red, Some(Red::Sum | Red::Prod))
    }

    fn describe(&self) -> String {
        format!(
            "{} {} {:?} dims={:?} dim={} g={} n={} {} flags='{}'",
            self.op.name(),
            self.ty.name(),
            self.red,
            self.dims,
            self.dim,
            self.g,
            self.n,
            if self.partition { "partition" } else { "replica" },
            self.flags()
        )
    }
}

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|g| n.is_multiple_of(*g)).collect()
}

/// A group layout of size `g` over `n` ids. `empty_ok`: `{}` means all ids.
fn random_groups(rng: &mut ChaCha8Rng, n: usize, g: usize, empty_ok: bool) -> Groups {
    let ng = n / g;
    loop {
        match rng.random_range(0..5) {
            0 if g == n && empty_ok => return Groups::Empty,
            1 => {
                let mut ids: Vec<usize> = (0..n).collect();
                ids.shuffle(rng);
                return Groups::Explicit(ids.chunks(g).map(<[usize]>::to_vec).collect());
            }
            2 => return Groups::Iota { num_groups: ng, size: g, reshape: vec![n], perm: vec![] },
            3 if ng > 1 && g > 1 => {
                return Groups::Iota { num_groups: ng, size: g, reshape: vec![g, ng], perm: vec![1, 0] };
            }
            4 if n == 8 => {
                let mut perm = vec![0, 1, 2];
                perm.shuffle(rng);
                return Groups::Iota { num_groups: ng, size: g, reshape: vec![2, 2, 2], perm };
            }
            _ => {}
        }
    }
}

/// `count` elements as dims of rank 1-3 (0 splits anywhere).
fn split_dims(rng: &mut ChaCha8Rng, count: usize) -> Vec<i64> {
    let rank = rng.random_range(1..=3);
    let mut dims = vec![count as i64];
    for _ in 1..rank {
        let last = dims.pop().unwrap_or(0) as usize;
        let f = if last == 0 {
            rng.random_range(0..=3)
        } else {
            let ds = divisors(last);
            ds[rng.random_range(0..ds.len())]
        };
        let rest = if last == 0 { 0 } else { last / f };
        let (a, b) = if rng.random_bool(0.5) { (f, rest) } else { (rest, f) };
        dims.push(a as i64);
        dims.push(b as i64);
    }
    dims.shuffle(rng);
    dims
}

fn random_dims(rng: &mut ChaCha8Rng) -> Vec<i64> {
    let rank = rng.random_range(1..=3);
    let max = if rank == 1 { 70 } else { 6 };
    let mut dims: Vec<i64> = (0..rank).map(|_| rng.random_range(0..=max)).collect();
    match rng.random_range(0..10) {
        0 => dims[0] = 0,
        1 => dims.iter_mut().for_each(|d| *d = 1),
        _ => {}
    }
    dims
}

fn random_spec(rng: &mut ChaCha8Rng) -> Spec {
    let n = [1, 2, 3, 4, 8][rng.random_range(0..5)];
    let partition = rng.random_bool(0.4);
    // All-reduce gets extra weight: it has three algorithms.
    let op = match rng.random_range(0..11) {
        0..=2 => Op::AllReduce,
        3 => Op::AllReduceStart,
        k => Op::ALL[k - 2],
    };
    let ty = if op.reduces() {
        REDUCE_TYPES[rng.random_range(0..REDUCE_TYPES.len())]
    } else {
        MOVE_TYPES[rng.random_range(0..MOVE_TYPES.len())]
    };
    let red = op.reduces().then(|| {
        let choices: &[Red] = if ty.is_float() {
            &[Red::Sum, Red::Prod, Red::Min, Red::Max]
        } else {
            &[Red::Sum, Red::Prod, Red::Min, Red::Max, Red::And, Red::Or]
        };
        choices[rng.random_range(0..choices.len())]
    });
    let ds = divisors(n);
    // Single-member groups (a local copy) only now and then where n > 1.
    let g = match ds.len() {
        1 => 1,
        k if rng.random_bool(0.15) => ds[rng.random_range(0..k)],
        _ if rng.random_bool(0.3) => n,
        k => ds[rng.random_range(1..k)],
    };
    // Partition mode with use_global_device_ids needs explicit groups.
    let empty_ok = !(partition && op.has_global_ids());
    let groups = random_groups(rng, n, g, empty_ok);
    let mut dim = 0;
    let dims = match op {
        Op::AllReduce | Op::AllReduceStart => {
            let es = ty.byte_size().max(1);
            let count = match rng.random_range(0..4) {
                0 => rng.random_range(0..=1.min(ONE_SHOT_MAX / es)),
                1 => rng.random_range(0..=ONE_SHOT_MAX / es),
                2 => rng.random_range(ONE_SHOT_MAX / es + 1..=TWO_SHOT_MAX / es),
                _ => rng.random_range(TWO_SHOT_MAX / es + 1..=2 * TWO_SHOT_MAX / es + 7),
            };
            split_dims(rng, count)
        }
        Op::ReduceScatter | Op::AllToAll => {
            let mut d = random_dims(rng);
            dim = rng.random_range(0..d.len());
            let k = if d.len() == 1 { 9 } else { 3 };
            d[dim] = (g * rng.random_range(0..=k)) as i64;
            d
        }
        _ => {
            let d = random_dims(rng);
            dim = rng.random_range(0..d.len());
            d
        }
    };
    let pairs = if op.is_permute() {
        let mut targets: Vec<usize> = (0..n).collect();
        targets.shuffle(rng);
        let keep = [0.0, 0.5, 0.8, 1.0][rng.random_range(0..4)];
        (0..n).zip(targets).filter(|_| rng.random_bool(keep)).collect()
    } else {
        Vec::new()
    };
    let g = if op.is_permute() { n } else { g };
    Spec { n, partition, op, ty, red, dims, dim, g, groups, pairs, fallback: rng.random_bool(0.3) }
}

fn algorithm(imp: Implementation) -> &'static str {
    match imp {
        Implementation::Fallback => "fallback",
        Implementation::Kernel(KernelAlgorithm::OneShotAllReduce) => "one-shot",
        Implementation::Kernel(KernelAlgorithm::TwoShotAllReduce) => "two-shot",
        Implementation::Kernel(_) => "kernel",
    }
}

fn parse(text: &str, what: &str) -> Module {
    hlo::parse_text("stress.hlo", text).unwrap_or_else(|e| panic!("generator bug: invalid {what} module: {e}\n{text}"))
}

/// `a` widened to f32 (16-bit floats only).
fn widen(a: &Array) -> Array {
    let v: Vec<f32> = match a.ty() {
        T::F16 => a.to_vec::<f16>().unwrap_or_default().into_iter().map(f16::to_f32).collect(),
        _ => a.to_vec::<bf16>().unwrap_or_default().into_iter().map(bf16::to_f32).collect(),
    };
    Array::from_slice(a.dims().to_vec(), &v)
}

/// An f32 array rounded once to `ty` (f16 or bf16).
fn narrow(a: &Array, ty: T) -> Array {
    let v = a.to_vec::<f32>().unwrap_or_default();
    match ty {
        T::F16 => Array::from_slice(a.dims().to_vec(), &v.into_iter().map(f16::from_f32).collect::<Vec<_>>()),
        _ => Array::from_slice(a.dims().to_vec(), &v.into_iter().map(bf16::from_f32).collect::<Vec<_>>()),
    }
}

fn map_leaves(l: &Literal, f: &impl Fn(&Array) -> Array) -> Literal {
    match l {
        Literal::Array(a) => Literal::Array(f(a)),
        Literal::Tuple(t) => Literal::Tuple(t.iter().map(|x| map_leaves(x, f)).collect()),
        Literal::Token => Literal::Token,
    }
}

fn as_f64(a: &Array) -> Vec<f64> {
    match a.ty() {
        T::F16 => a.to_vec::<f16>().unwrap_or_default().into_iter().map(f64::from).collect(),
        T::F32 => a.to_vec::<f32>().unwrap_or_default().into_iter().map(f64::from).collect(),
        T::F64 => a.to_vec::<f64>().unwrap_or_default(),
        _ => a.to_vec::<bf16>().unwrap_or_default().into_iter().map(f64::from).collect(),
    }
}

/// First element where `got` and `want` differ bitwise: (index, got bytes, want bytes).
fn first_diff(got: &Array, want: &Array) -> Option<String> {
    if got.shape != want.shape {
        return Some(format!("shape {} vs {}", got.shape, want.shape));
    }
    let es = (got.data.len().checked_div(got.element_count())).unwrap_or(1).max(1);
    (0..got.element_count())
        .find(|&i| got.data[i * es..(i + 1) * es] != want.data[i * es..(i + 1) * es])
        .map(|i| format!("element {i}: got {:?}, want {:?}", got.element_bytes(i), want.element_bytes(i)))
}

/// 16-bit float sums / products against the per-step-rounding interpreter: within
/// `g` roundings of the largest partial result (|inputs| < 1, so partials are below `g`).
fn close(got: &Array, want: &Array, g: usize) -> Option<String> {
    let eps = if got.ty() == T::F16 { 2f64.powi(-10) } else { 2f64.powi(-7) };
    let tol = g as f64 * eps * g as f64 + 1e-7;
    let (a, b) = (as_f64(got), as_f64(want));
    a.iter()
        .zip(&b)
        .position(|(x, y)| (x - y).abs() > tol)
        .map(|i| format!("element {i}: got {}, want {} (tolerance {tol})", a[i], b[i]))
}

struct Failure {
    case: usize,
    epoch: usize,
    spec: Spec,
    text: String,
    message: String,
}

fn check(spec: &Spec, got: &[Literal], want: &[Literal], twin: Option<&[Literal]>) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} device results, want {}", got.len(), want.len()));
    }
    for d in 0..want.len() {
        let (gl, wl) = (got[d].leaves(), want[d].leaves());
        if gl.len() != wl.len() {
            return Err(format!("device {d}: {} leaves, want {}", gl.len(), wl.len()));
        }
        for (j, (ga, wa)) in gl.iter().zip(&wl).enumerate() {
            let diff = match twin {
                Some(t) => first_diff(ga, t[d].leaves()[j])
                    .map(|m| format!("vs f32 fold rounded once: {m}"))
                    .or_else(|| close(ga, wa, spec.g).map(|m| format!("vs interpreter: {m}"))),
                None => first_diff(ga, wa),
            };
            if let Some(m) = diff {
                return Err(format!("device {d} leaf {j}: {m}"));
            }
        }
    }
    Ok(())
}

/// The host backend (GPUs run whole modules inside XLA now, not on Peerless's executor).
fn backend() -> (BackendKind, usize) {
    match std::env::var("PEERLESS_TEST_BACKEND").as_deref() {
        Ok("host") | Err(_) => (BackendKind::Host, usize::MAX),
        Ok(other) => panic!("PEERLESS_TEST_BACKEND={other}: only host (GPUs run modules inside XLA)"),
    }
}

#[test]
fn executions_match_the_interpreter() {
    let (kind, devices) = backend();
    let mut skipped = 0usize;
    let start = Instant::now();
    let seed = env_number("EXEC_STRESS_SEED").unwrap_or(SEED);
    let modules = env_number("EXEC_STRESS_MODULES").map_or(MODULES, |m| m as usize);
    println!("exec stress: seed {seed:#x} (EXEC_STRESS_SEED), {modules} modules (EXEC_STRESS_MODULES)");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut per_type: BTreeMap<&'static str, usize> = BTreeMap::new();
    let (mut executions, mut partition_execs, mut fallback_cfg_execs) = (0usize, 0usize, 0usize);
    let mut failures: Vec<Failure> = Vec::new();
    let mut failed_cases = 0usize;
    for case in 0..modules {
        let spec = random_spec(&mut rng);
        let text = spec.text(spec.ty);
        let module = parse(&text, "generated");
        let twin_module = spec.rounds_once().then(|| parse(&spec.text(T::F32), "f32 twin"));
        let flags = Flags::parse(&spec.flags()).unwrap();
        let (mode, imode) = if spec.partition {
            (DeviceMode::Partition, Mode::Partition)
        } else {
            (DeviceMode::Replica, Mode::Replica)
        };
        let cfg = RunConfig { num_devices: spec.n, mode: imode };
        if spec.n > devices {
            skipped += 1;
            continue;
        }
        let fail =
            |epoch: usize, message: String| Failure { case, epoch, spec: spec.clone(), text: text.clone(), message };
        let exe = match Executable::new(kind, &module, spec.n, mode, &flags) {
            Ok(e) => e,
            Err(e) => {
                failures.push(fail(0, format!("compile error: {e}")));
                failed_cases += 1;
                continue;
            }
        };
        let planned = exe.planned();
        assert_eq!(planned.len(), 1, "one collective per module\n{text}");
        let imp = planned[0].decision.implementation;
        if spec.fallback || matches!(spec.ty, T::F8E4M3FN | T::S4) {
            assert_eq!(imp, Implementation::Fallback, "{}: {}\n{text}", spec.describe(), planned[0].decision.reason);
        }
        let local = imp != Implementation::Fallback && planned[0].decision.reason.contains("local copy");
        let label = format!("{} {}", spec.op.name(), if local { "local-copy" } else { algorithm(imp) });
        let epochs = rng.random_range(3..=5);
        let mut case_failed = false;
        for epoch in 0..epochs {
            let seed: u64 = rng.random();
            let args = interp::io::random_inputs(&module, &cfg, seed).unwrap();
            let want = interp::run(&module, &cfg, &args)
                .unwrap_or_else(|e| panic!("interpreter failed on case {case}: {e}\n{}\n{text}", spec.describe()));
            let twin = twin_module.as_ref().map(|tm| {
                let wide: Vec<Vec<Literal>> =
                    args.iter().map(|dev| dev.iter().map(|l| map_leaves(l, &widen)).collect()).collect();
                let out = interp::run(tm, &cfg, &wide).unwrap();
                out.iter().map(|l| map_leaves(l, &|a: &Array| narrow(a, spec.ty))).collect::<Vec<_>>()
            });
            executions += 1;
            *counts.entry(label.clone()).or_default() += 1;
            *per_type.entry(spec.ty.name()).or_default() += 1;
            partition_execs += usize::from(spec.partition);
            fallback_cfg_execs += usize::from(spec.fallback);
            let outcome = match exe.execute(&args) {
                Ok(got) => check(&spec, &got, &want, twin.as_deref()),
                Err(e) => Err(format!("execute error: {e}")),
            };
            if let Err(m) = outcome {
                case_failed = true;
                if failures.len() < 8 {
                    failures.push(fail(epoch, format!("input seed {seed:#x}: {m}")));
                }
            }
        }
        failed_cases += usize::from(case_failed);
    }
    let elapsed = start.elapsed();
    let mut line = format!(
        "exec stress ({} backend): {executions} executions, {} modules ({skipped} skipped: more devices than \
         available) in {elapsed:.1?}:",
        kind.name(),
        modules - skipped
    );
    for (k, v) in &counts {
        write!(line, " {k} {v},").unwrap();
    }
    write!(line, " partition mode {partition_execs}, all-fallback flags {fallback_cfg_execs}; dtypes").unwrap();
    for (k, v) in &per_type {
        write!(line, " {k} {v}").unwrap();
    }
    println!("{line}");
    if !failures.is_empty() {
        let mut report = format!("{failed_cases} of {modules} modules failed (seed {seed:#x}); first ones:\n");
        for f in &failures {
            writeln!(report, "--- case {} epoch {}: {}\n{}\n{}", f.case, f.epoch, f.spec.describe(), f.message, f.text)
                .unwrap();
        }
        panic!("{report}");
    }
    assert!(executions >= 1000, "only {executions} executions");
    // At the default size every collective op (sync and async forms each) runs ≥ 1000 times.
    if modules >= MODULES && skipped == 0 {
        for op in Op::ALL {
            let total: usize = counts
                .iter()
                .filter(|(k, _)| k.rsplit_once(' ').is_some_and(|(o, _)| o == op.name()))
                .map(|(_, v)| v)
                .sum();
            assert!(total >= 1000, "{} ran only {total} times", op.name());
        }
    }
    // Every op ran both as a kernel and as the fallback, and all-reduce took all three paths.
    for op in Op::ALL {
        let got = |alg: &str| counts.get(&format!("{} {alg}", op.name())).copied().unwrap_or(0);
        let kernel =
            if op.is_all_reduce() { got("one-shot") + got("two-shot") } else { got("kernel") } + got("local-copy");
        assert!(kernel > 0 || op == Op::AllToAllTuple, "{} never ran a kernel", op.name());
        assert!(got("fallback") > 0, "{} never fell back", op.name());
    }
    for alg in ["one-shot", "two-shot"] {
        assert!(counts.get(&format!("all-reduce {alg}")).is_some_and(|&c| c > 0), "all-reduce never ran {alg}");
    }
}
