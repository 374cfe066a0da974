//! `peerless bench`: one collective module per (op, dtype, size), built here as a binary HloModuleProto in replica mode
//! and compiled through XLA's PJRT plugin once per [`Impl`]; with `chain = K`, K collectives one after another
//! ([`module`]), times per collective. Each executable's results are first checked exactly against host-computed ones
//! (a wrong result or failed compile is an error row, never timed); samples of the implementations are then
//! interleaved, so a passing load weighs on each alike, and the median reported. ARCHITECTURE.md ("tools") has the
//! overview.

use std::path::PathBuf;
use std::time::Instant;

use emitter::xla_pass::PassDecision;
use ffi::pjrt::client::{Buffer, Client, Device};
use hlo::PrimitiveType;
use pjrt_sys::protos::xla;
use plugin::Platform;
use prost::Message;
use runs::Mode;
use thunks::flag::{ALL_REDUCE_BACKEND, ONE_SHOT_MAX_BYTES, TWO_SHOT_MAX_BYTES};
use thunks::{CollectiveKind, CollectiveOp};

use crate::xla_run::buffer_type;

/// The one of `all` that `name` calls `s`, else an error naming `what` and every name.
fn by_name<T: Copy>(all: &[T], name: fn(T) -> &'static str, what: &str, s: &str) -> Result<T, String> {
    let names: Vec<&str> = all.iter().map(|&x| name(x)).collect();
    all.iter().copied().find(|&x| name(x) == s).ok_or_else(|| format!("{what} {s} ({})", names.join(", ")))
}

/// The collectives the bench measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    /// A ring: device i sends to device (i + 1) mod n.
    CollectivePermute,
}

impl Op {
    pub const ALL: [Op; 5] = [Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::AllToAll, Op::CollectivePermute];

    pub fn parse(s: &str) -> Result<Op, String> {
        by_name(&Op::ALL, Op::name, "bench op", s)
    }

    /// The HLO opcode, which is also the name the bench prints.
    pub fn name(self) -> &'static str {
        CollectiveOp { kind: self.kind(), is_async: false }.name()
    }

    /// The collective kind the op is.
    pub fn kind(self) -> CollectiveKind {
        use CollectiveKind as K;
        // In `Op::ALL`'s order.
        [K::AllReduce, K::AllGather, K::ReduceScatter, K::AllToAll, K::CollectivePermute][self as usize]
    }

    /// The Peerless flag choosing this op's backend.
    fn backend_flag(self) -> &'static str {
        self.kind().backend_flag().unwrap_or_else(|| unreachable!("every bench op has a kernel"))
    }

    /// XLA's `DebugOptions.CollectiveKernelType` value for `xla_gpu_experimental_use_collective_kernels`, if XLA has
    /// kernels for the op (jaxlib 0.11.2's XLA: all-reduce and all-gather). The full enum name: the XLA_FLAGS parser
    /// takes `ALL_REDUCE`, the compile options' override parser only the proto's name ("'ALL_REDUCE' is not a valid
    /// enum value").
    pub fn xla_kernel_name(self) -> Option<&'static str> {
        match self {
            Op::AllReduce => Some("COLLECTIVE_KERNEL_ALL_REDUCE"),
            Op::AllGather => Some("COLLECTIVE_KERNEL_ALL_GATHER"),
            _ => None,
        }
    }

    /// Whether a chain of this op feeds each collective the previous one's result (pure data movement of one shape:
    /// exact for any length); the others run on a parameter each, ordered by data through an `opt-barrier` (see
    /// [`module`]).
    fn data_chain(self) -> bool {
        matches!(self, Op::AllToAll | Op::CollectivePermute)
    }

    /// Parameters (= results) of a module of `chain` collectives.
    fn arrays(self, chain: usize) -> usize {
        if self.data_chain() { 1 } else { chain }
    }

    /// Elements of the result per device for an operand of `elems`.
    fn result_elems(self, elems: usize, n: usize) -> usize {
        match self {
            Op::AllGather => elems * n,
            Op::ReduceScatter => elems / n,
            _ => elems,
        }
    }

    /// (algbw factor on bytes, busbw factor on algbw), nccl-tests' conventions with `bytes` the operand bytes per
    /// device: all-reduce busbw = bytes/t · 2(n−1)/n; all-gather algbw = n·bytes/t; reduce-scatter, all-to-all and
    /// permute algbw = bytes/t; their busbw = algbw · (n−1)/n (permute: busbw = algbw, as nccl-tests' sendrecv).
    pub fn factors(self, n: f64) -> (f64, f64) {
        match self {
            Op::AllReduce => (1.0, 2.0 * (n - 1.0) / n),
            Op::AllGather => (n, (n - 1.0) / n),
            Op::ReduceScatter | Op::AllToAll => (1.0, (n - 1.0) / n),
            Op::CollectivePermute => (1.0, 1.0),
        }
    }

    /// What device `d` must hold, from every device's inputs (`inputs[d]`).
    fn expected(self, inputs: &[Vec<i8>], d: usize) -> Vec<i32> {
        let n = inputs.len();
        let elems = inputs[0].len();
        let sum = |range: std::ops::Range<usize>| -> Vec<i32> {
            range.map(|i| inputs.iter().map(|v| i32::from(v[i])).sum()).collect()
        };
        match self {
            Op::AllReduce => sum(0..elems),
            Op::AllGather => inputs.iter().flatten().map(|&v| i32::from(v)).collect(),
            Op::ReduceScatter => {
                let b = elems / n;
                sum(d * b..(d + 1) * b)
            }
            Op::AllToAll => {
                let b = elems / n;
                inputs.iter().flat_map(|v| v[d * b..(d + 1) * b].iter().map(|&x| i32::from(x))).collect()
            }
            Op::CollectivePermute => inputs[(d + n - 1) % n].iter().map(|&x| i32::from(x)).collect(),
        }
    }
}

/// Element types of the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    pub fn parse(s: &str) -> Result<Dtype, String> {
        by_name(&[Dtype::F32, Dtype::Bf16], Dtype::name, "bench dtype", s)
    }

    /// The HLO element type.
    pub fn hlo(self) -> PrimitiveType {
        match self {
            Dtype::F32 => PrimitiveType::F32,
            Dtype::Bf16 => PrimitiveType::Bf16,
        }
    }

    pub fn name(self) -> &'static str {
        self.hlo().name()
    }

    pub fn bytes(self) -> usize {
        self.hlo().byte_size()
    }

    /// Small integers, exact in both types (a bf16 is the top half of the f32).
    fn encode(self, vals: &[i8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(vals.len() * self.bytes());
        for &v in vals {
            let bits = f32::from(v).to_bits();
            match self {
                Dtype::F32 => out.extend_from_slice(&bits.to_le_bytes()),
                Dtype::Bf16 => out.extend_from_slice(&((bits >> 16) as u16).to_le_bytes()),
            }
        }
        out
    }

    fn decode(self, b: &[u8], i: usize) -> f32 {
        match self {
            Dtype::F32 => f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]),
            Dtype::Bf16 => f32::from_bits(u32::from(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])) << 16),
        }
    }
}

/// How the collective runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    /// Peerless's pass applied without a tuning profile (the flags' thresholds): the collectives it takes run on
    /// Peerless's handlers.
    Peerless,
    /// Peerless's pass with the active tuning profile (`PEERLESS_TUNING_PROFILE`, else the cache's, else the shipped
    /// defaults): what a program gets by default.
    Auto,
    /// All-reduce forced onto the one-shot kernel at every size (other ops: skipped).
    OneShot,
    /// All-reduce forced onto the two-shot kernel at every size (other ops: skipped).
    TwoShot,
    /// XLA's own collective (NCCL on GPU).
    Xla,
    /// XLA's own collective kernels (`xla_gpu_experimental_use_collective_kernels`, through `env_option_overrides`):
    /// CUDA plugin only, a skipped row elsewhere.
    XlaKernels,
    /// Every kind's copy-engine form at every size (`--copy_engines=0`; CUDA only): the bytes move on the copy engines,
    /// reductions fold with one small local kernel.
    CopyEngines,
}

impl Impl {
    pub const ALL: [Impl; 7] =
        [Impl::Peerless, Impl::Auto, Impl::OneShot, Impl::TwoShot, Impl::Xla, Impl::XlaKernels, Impl::CopyEngines];

    pub fn parse(s: &str) -> Result<Impl, String> {
        by_name(&Impl::ALL, Impl::name, "bench implementation", s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Impl::Peerless => "peerless",
            Impl::Auto => "auto",
            Impl::OneShot => "one-shot",
            Impl::TwoShot => "two-shot",
            Impl::Xla => "xla",
            Impl::XlaKernels => "xla-kernels",
            Impl::CopyEngines => "copy-engines",
        }
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct Options {
    /// `--xla-plugin` (else `PEERLESS_XLA_PLUGIN`, else the CPU plugin in the JAX venv).
    pub plugin: Option<PathBuf>,
    /// Devices (default: CPU 8, the CPU plugin's `cpu_device_count`; GPU: all, at most 8).
    pub devices: Option<usize>,
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub step: usize,
    pub samples: usize,
    pub iters: usize,
    pub chain: usize,
    pub ops: Vec<Op>,
    pub dtypes: Vec<Dtype>,
    pub impls: Vec<Impl>,
    /// Peerless emitter flags for the `peerless` rows (`--name=value ...`).
    pub flags: String,
    /// If set, each sample runs as many executes as take about this long (at least one), in place of `iters`: `peerless
    /// tune` bounds every row's time this way.
    pub sample_ms: Option<f64>,
    /// Close calls get more samples: where the fastest Peerless row and the `xla` row are within `close` of each other,
    /// `more` times the samples in all (`peerless tune`).
    pub close_calls: Option<CloseCalls>,
    /// Bytes per device to measure, in place of `min_bytes`..=`max_bytes` by `step` (`peerless tune` measures the sizes
    /// between two neighbours whose winners differ).
    pub sizes: Option<Vec<usize>>,
}

/// See [`Options::close_calls`].
#[derive(Clone, Copy, Debug)]
pub struct CloseCalls {
    pub close: f64,
    pub more: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            plugin: None,
            devices: None,
            min_bytes: 1024,
            max_bytes: 256 << 20,
            step: 4,
            samples: 20,
            iters: 20,
            chain: 1,
            ops: Op::ALL.to_vec(),
            dtypes: vec![Dtype::F32, Dtype::Bf16],
            impls: vec![Impl::Peerless, Impl::Auto, Impl::Xla, Impl::XlaKernels],
            flags: String::new(),
            sample_ms: None,
            close_calls: None,
            sizes: None,
        }
    }
}

/// A row's result check.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    /// Every device's result is the expected one.
    Same,
    /// Not run (the reason), e.g. XLA's kernels on CPU.
    Skipped(String),
    /// A failed compile or run, or a wrong result.
    Error(String),
}

impl Check {
    /// One word for the table and the CSV.
    pub fn word(&self) -> &'static str {
        match self {
            Check::Same => "same",
            Check::Skipped(_) => "skipped",
            Check::Error(_) => "error",
        }
    }

    /// The note of a skipped or failed row ("" for a checked one).
    pub fn note(&self) -> &str {
        match self {
            Check::Same => "",
            Check::Skipped(s) | Check::Error(s) => s,
        }
    }
}

/// One (op, dtype, size, impl).
#[derive(Clone, Debug)]
pub struct Row {
    pub op: Op,
    pub dtype: Dtype,
    /// Operand bytes per device of one collective.
    pub bytes: usize,
    pub imp: Impl,
    /// How the collectives ran: the pass's implementation (`kernel (one-shot all-reduce)`, `fallback: reason`) for a
    /// Peerless row, XLA's for the others.
    pub path: String,
    /// The pass's decisions (Peerless rows).
    pub decisions: Vec<PassDecision>,
    /// Median µs per collective (checked rows only).
    pub us: Option<f64>,
    pub algbw_gbps: Option<f64>,
    pub busbw_gbps: Option<f64>,
    pub check: Check,
}

impl Row {
    /// Collectives the pass put on Peerless (a custom call each).
    pub fn peerless_calls(&self) -> usize {
        self.decisions.iter().filter(|d| d.kernel).count()
    }
}

/// The whole run.
#[derive(Debug)]
pub struct Report {
    pub plugin: PathBuf,
    pub platform: Platform,
    /// The devices' kind, as the plugin names it ("cpu", "NVIDIA H200").
    pub device_kind: String,
    pub devices: usize,
    pub chain: usize,
    pub samples: usize,
    pub iters: usize,
    pub rows: Vec<Row>,
}

/// The CSV's header (and [`Report::csv`]'s first line).
pub const CSV_HEADER: &str =
    "op,dtype,devices,bytes,impl,chain,path,peerless_calls,us_per_collective,algbw_gbps,busbw_gbps,check,note";

impl Report {
    /// Every row as CSV (quoted where a field needs it).
    pub fn csv(&self) -> String {
        let q = |s: &str| {
            if s.contains([',', '"', '\n']) {
                format!("\"{}\"", s.replace('"', "\"\"").replace('\n', " "))
            } else {
                s.into()
            }
        };
        let num = |v: Option<f64>, digits: usize| v.map(|v| format!("{v:.digits$}")).unwrap_or_default();
        let mut out = format!("{CSV_HEADER}\n");
        for r in &self.rows {
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                r.op.name(),
                r.dtype.name(),
                self.devices,
                r.bytes,
                r.imp.name(),
                self.chain,
                q(&r.path),
                r.peerless_calls(),
                num(r.us, 3),
                num(r.algbw_gbps, 3),
                num(r.busbw_gbps, 3),
                r.check.word(),
                q(r.check.note()),
            ));
        }
        out
    }
}

/// `auto` beside the fastest of what it chooses among, for one (op, dtype, size).
#[derive(Clone, Debug)]
pub struct AutoVerdict {
    pub op: Op,
    pub dtype: Dtype,
    pub bytes: usize,
    /// What `auto` ran ("kernel (two-shot all-reduce)", "xla: ...").
    pub took: String,
    pub auto_us: f64,
    /// The fastest of the `peerless`, `one-shot`, `two-shot` and `xla` rows.
    pub best: Impl,
    pub best_us: f64,
}

impl AutoVerdict {
    /// `auto`'s time over the fastest's.
    pub fn ratio(&self) -> f64 {
        self.auto_us / self.best_us
    }
}

impl Report {
    /// For every (op, dtype, size) with a timed `auto` row and another timed row it chooses among (Peerless forced or
    /// by thresholds, or XLA's own; not XLA's collective kernels, which the pass never picks): how `auto` compares with
    /// the fastest of them.
    pub fn auto_verdicts(&self) -> Vec<AutoVerdict> {
        let mut out = Vec::new();
        for a in self.rows.iter().filter(|r| r.imp == Impl::Auto) {
            let Some(auto_us) = a.us else { continue };
            let same = |r: &&Row| r.op == a.op && r.dtype == a.dtype && r.bytes == a.bytes;
            let best = self
                .rows
                .iter()
                .filter(same)
                .filter(|r| {
                    matches!(r.imp, Impl::Peerless | Impl::OneShot | Impl::TwoShot | Impl::Xla | Impl::CopyEngines)
                })
                .filter_map(|r| r.us.map(|us| (r.imp, us)))
                .min_by(|x, y| x.1.total_cmp(&y.1));
            if let Some((best, best_us)) = best {
                out.push(AutoVerdict {
                    op: a.op,
                    dtype: a.dtype,
                    bytes: a.bytes,
                    took: a.path.clone(),
                    auto_us,
                    best,
                    best_us,
                });
            }
        }
        out
    }
}

// ---- the module -------------------------------------------------------------------------

/// The bench module: `chain` collectives `op` over all `n` replicas of `elems`-element operands, as HLO text encoded by
/// `hlo`. Collective k takes the previous result (all-to-all, permute) or parameter k after collective k − 1 through
/// `opt-barrier((p_k, c_{k-1}))`: a data dependency no XLA pass sees through, free at run time, so the chain shares one
/// staging slot as a real program's does. (Control dependencies crash XLA:CPU of jaxlib 0.11.2 on all-to-alls and fail
/// XLA:CUDA's compile of async all-reduces.)
pub fn module(op: Op, ty: Dtype, elems: usize, n: usize, chain: usize) -> Vec<u8> {
    let (t, name) = (ty.name(), op.name());
    let (arg, out) = (format!("{t}[{elems}]"), format!("{t}[{}]", op.result_elems(elems, n)));
    let list = |v: Vec<String>| v.join(",");
    let attrs = match op {
        Op::CollectivePermute => {
            format!("source_target_pairs={{{}}}", list((0..n).map(|i| format!("{{{i},{}}}", (i + 1) % n)).collect()))
        }
        _ => {
            let groups = format!("replica_groups={{{{{}}}}}", list((0..n).map(|i| i.to_string()).collect()));
            match op {
                Op::AllReduce => format!("{groups}, to_apply=add"),
                Op::ReduceScatter => format!("{groups}, dimensions={{0}}, to_apply=add"),
                _ => format!("{groups}, dimensions={{0}}"),
            }
        }
    };
    let mut lines = vec![format!("p0 = {arg} parameter(0)"), format!("c0 = {out} {name}(p0), {attrs}")];
    for k in 1..chain {
        let operand = if op.data_chain() {
            format!("c{}", k - 1)
        } else {
            let pair = format!("({arg}, {out})");
            lines.push(format!("p{k} = {arg} parameter({k})"));
            lines.push(format!("after{k} = {pair} tuple(p{k}, c{})", k - 1));
            lines.push(format!("barrier{k} = {pair} opt-barrier(after{k})"));
            lines.push(format!("operand{k} = {arg} get-tuple-element(barrier{k}), index=0"));
            format!("operand{k}")
        };
        lines.push(format!("c{k} = {out} {name}({operand}), {attrs}"));
    }
    if chain == 1 || op.data_chain() {
        let last = lines.pop().expect("a collective");
        lines.push(format!("ROOT {last}"));
    } else {
        let outs = list((0..chain).map(|_| out.clone()).collect());
        lines.push(format!("ROOT result = ({outs}) tuple({})", list((0..chain).map(|k| format!("c{k}")).collect())));
    }
    let entry: String = lines.iter().map(|l| format!("  {l}\n")).collect();
    let text = format!(
        "HloModule bench_{}_{t}_{elems}\n\nadd {{\n  a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n  \
         ROOT s = {t}[] add(a, b)\n}}\n\nENTRY bench {{\n{entry}}}\n",
        name.replace('-', "_")
    );
    let module = hlo::parse_text("bench", &text).unwrap_or_else(|e| panic!("the bench module parses: {e}\n{text}"));
    hlo::encode_proto(&module).unwrap_or_else(|e| panic!("the bench module encodes: {e}"))
}

// ---- running ----------------------------------------------------------------------------

/// Small integers in [-8, 8] for device `d`, collective `k` (a sum over up to 32 devices is at most 256: exact in bf16
/// in any order).
fn inputs(elems: usize, d: usize, k: usize) -> Vec<i8> {
    let mut s = ((d as u64) << 32 | k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ elems as u64;
    (0..elems)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % 17) as i8 - 8
        })
        .collect()
}

/// Compares every device's outputs with the expectation: `host[d][k]` is device d's input of parameter k; a data chain
/// applies the op `chain` times.
fn check(op: Op, ty: Dtype, chain: usize, host: &[Vec<Vec<i8>>], outputs: &[Vec<Buffer<'_>>]) -> Result<(), String> {
    let arrays = host[0].len();
    let n = host.len();
    for k in 0..arrays {
        let mut cur: Vec<Vec<i8>> = host.iter().map(|dev| dev[k].clone()).collect();
        let rounds = if op.data_chain() { chain } else { 1 };
        for _ in 1..rounds {
            // Pure data movement: the values stay in i8.
            cur = (0..n).map(|d| op.expected(&cur, d).into_iter().map(|v| v as i8).collect()).collect();
        }
        for (d, bufs) in outputs.iter().enumerate() {
            if bufs.len() != arrays {
                return Err(format!("device {d}: {} outputs, expected {arrays}", bufs.len()));
            }
            let want = op.expected(&cur, d);
            let got = bufs[k].to_host()?;
            if got.len() != want.len() * ty.bytes() {
                return Err(format!(
                    "device {d} result {k}: {} bytes, expected {}",
                    got.len(),
                    want.len() * ty.bytes()
                ));
            }
            if let Some(i) = (0..want.len()).find(|&i| ty.decode(&got, i) != want[i] as f32) {
                return Err(format!(
                    "device {d} result {k} element {i} is {}, expected {}",
                    ty.decode(&got, i),
                    want[i]
                ));
            }
        }
    }
    Ok(())
}

/// The compile options: replicas on `ids`; XLA's collective kernels for `kernels`.
fn options(ids: &[i64], kernels: Option<&str>) -> Vec<u8> {
    let mut o = crate::xla_run::compile_options(Mode::Replica, ids);
    if let Some(k) = kernels {
        let value = Some(xla::option_override_proto::Value::StringField(k.into()));
        o.env_option_overrides
            .insert("xla_gpu_experimental_use_collective_kernels".into(), xla::OptionOverrideProto { value });
    }
    o.encode_to_vec()
}

/// Warms `exe` up and returns the executes per sample (`iters`, or with `sample_ms` as many as take about that long, at
/// least one) and the seconds one execute took.
fn calibrate(
    exe: &ffi::pjrt::client::Executable<'_>,
    args: &[Vec<&Buffer<'_>>],
    iters: usize,
    sample_ms: Option<f64>,
) -> Result<(usize, f64), String> {
    drop(exe.execute(args)?); // warm-up
    // A second warm-up, timed: the first pays for first-touch allocations.
    let t = Instant::now();
    drop(exe.execute(args)?);
    let secs = t.elapsed().as_secs_f64().max(1e-9);
    Ok(match sample_ms {
        Some(ms) => (((ms * 1e-3 / secs) as usize).clamp(1, 10_000), secs),
        None => (iters.max(1), secs),
    })
}

/// With `sample_ms` (a time-bounded run), rows whose executes are slow take fewer samples: about 5 s of samples per
/// implementation, and never fewer than 3.
fn samples_for(opts: &Options, slowest_execute_s: f64) -> usize {
    let want = opts.samples.max(1);
    match opts.sample_ms {
        Some(_) if slowest_execute_s * want as f64 > 5.0 => ((5.0 / slowest_execute_s) as usize).clamp(3, want),
        _ => want,
    }
}

/// One sample: µs per collective over `iters` executes, after one untimed execute. Samples of different implementations
/// alternate, and the first execute after another program pays for what that program left in the caches (a bigger
/// footprint, e.g. Peerless's staging, costs the next one more): measured on 8 host devices, XLA's program timed right
/// after Peerless's took up to 1.3× its time after its own.
fn sample(
    exe: &ffi::pjrt::client::Executable<'_>,
    args: &[Vec<&Buffer<'_>>],
    iters: usize,
    chain: usize,
) -> Result<f64, String> {
    drop(exe.execute(args)?);
    let t = Instant::now();
    for _ in 0..iters {
        drop(exe.execute(args)?);
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / (iters * chain) as f64)
}

/// What an implementation compiled. The pass is deterministic, so two implementations whose pass made the same
/// decisions on one module compiled the same program (up to the instance ids every compile draws afresh), e.g. `auto`
/// choosing what `peerless` forces; one whose pass left every collective to XLA compiled XLA's own, as the `xla` row
/// does.
#[derive(Debug, PartialEq, Eq)]
struct Program {
    /// The implementations the pass chose, if it took any collective (else XLA's own).
    taken: Option<Vec<String>>,
    /// XLA's collective kernels asked for.
    xla_kernels: Option<&'static str>,
}

/// One implementation's compile: how it ran (path), the pass's decisions, and its executable with executes per sample,
/// seconds per execute and what it compiled — or why not.
type Prepared<'c> =
    (String, Vec<PassDecision>, Result<(ffi::pjrt::client::Executable<'c>, usize, f64, Program), Check>);

/// Takes sample rounds `rounds` of every implementation still runnable and not `same_as` an earlier one, one sample of
/// each per round into `times`. Rounds alternate direction and start one implementation later every two rounds, so that
/// no implementation always follows the same one.
fn take_rounds(
    prepared: &mut [(Impl, Prepared<'_>)],
    times: &mut [Vec<f64>],
    args: &[Vec<&Buffer<'_>>],
    chain: usize,
    rounds: std::ops::Range<usize>,
    same_as: &[Option<usize>],
) {
    let count = prepared.len();
    for round in rounds {
        for j in 0..count {
            let j = if round % 2 == 1 { count - 1 - j } else { j };
            let k = (round / 2 + j) % count;
            let (_, (_, _, result)) = &mut prepared[k];
            if let Ok((exe, iters, _, _)) = result
                && same_as[k].is_none()
            {
                match sample(exe, args, *iters, chain) {
                    Ok(t) => times[k].push(t),
                    Err(e) => *result = Err(Check::Error(e)),
                }
            }
        }
    }
}

/// Whether the fastest Peerless implementation's median and XLA's own are within `close` of each other.
fn is_close<T>(prepared: &[(Impl, T)], times: &[Vec<f64>], close: f64) -> bool {
    let med = |k: usize| median(times[k].clone());
    let xla = prepared.iter().position(|(i, _)| *i == Impl::Xla).and_then(med);
    let peerless = (0..prepared.len())
        .filter(|&k| {
            matches!(prepared[k].0, Impl::Peerless | Impl::Auto | Impl::OneShot | Impl::TwoShot | Impl::CopyEngines)
        })
        .filter_map(med)
        .min_by(f64::total_cmp);
    matches!((xla, peerless), (Some(x), Some(p)) if x.max(p) < close * x.min(p))
}

fn median(mut ts: Vec<f64>) -> Option<f64> {
    ts.sort_by(f64::total_cmp);
    ts.get(ts.len() / 2).copied()
}

/// Compiles, checks and warms up one implementation of one module: its executable and executes per sample, or why not.
fn measure<'c>(
    client: &'c Client,
    platform: Platform,
    ids: &[i64],
    module: &[u8],
    op: Op,
    ty: Dtype,
    imp: Impl,
    opts: &Options,
    host: &[Vec<Vec<i8>>],
    args: &[Vec<&Buffer<'_>>],
) -> Prepared<'c> {
    let n = ids.len();
    let skipped = |why: String| (String::new(), Vec::new(), Err(Check::Skipped(why)));
    let (program, path, decisions, kernels) = match imp {
        Impl::Peerless | Impl::Auto | Impl::OneShot | Impl::TwoShot | Impl::CopyEngines => {
            use emitter::tuning::ProfileSource;
            let mut flags: Vec<String> = opts.flags.split_whitespace().map(str::to_owned).collect();
            if n == 1 {
                flags.push(format!("--{}=kernel", op.backend_flag()));
            }
            if imp == Impl::CopyEngines {
                if platform != Platform::Cuda {
                    return skipped("the copy-engine forms run on CUDA".into());
                }
                flags.push(format!("--{}=kernel", op.backend_flag()));
                flags.push(format!("--{}=0", thunks::flag::COPY_ENGINES));
            }
            let forced = match imp {
                Impl::OneShot => Some(format!("--{ONE_SHOT_MAX_BYTES}={}", usize::MAX)),
                Impl::TwoShot => Some(format!("--{ONE_SHOT_MAX_BYTES}=0 --{TWO_SHOT_MAX_BYTES}={}", usize::MAX)),
                _ => None,
            };
            if let Some(f) = forced {
                if op != Op::AllReduce {
                    return skipped("all-reduce only".into());
                }
                flags.push(format!("--{ALL_REDUCE_BACKEND}=kernel"));
                flags.extend(f.split_whitespace().map(str::to_owned));
            }
            let source = if imp == Impl::Auto { ProfileSource::from_env() } else { ProfileSource::Off };
            match crate::xla_run::prepare_tuned(module, Mode::Replica, ids, platform, &flags, source) {
                Ok((program, outcome)) => {
                    let mut paths: Vec<String> = outcome
                        .decisions
                        .iter()
                        .map(|d| if d.kernel { d.implementation.clone() } else { format!("xla: {}", d.reason) })
                        .collect();
                    paths.dedup();
                    (program, paths.join("; "), outcome.decisions, None)
                }
                Err(e) => return (String::new(), Vec::new(), Err(Check::Error(e))),
            }
        }
        Impl::Xla => {
            let what = if platform == Platform::Cuda { "xla (NCCL)" } else { "xla (XLA:CPU)" };
            (module.to_vec(), what.into(), Vec::new(), None)
        }
        Impl::XlaKernels => {
            if platform != Platform::Cuda {
                return skipped("XLA's collective kernels are GPU-only".into());
            }
            let Some(k) = op.xla_kernel_name() else {
                return skipped(format!("XLA has no collective kernel for {}", op.name()));
            };
            (module.to_vec(), format!("xla_gpu_experimental_use_collective_kernels={k}"), Vec::new(), Some(k))
        }
    };
    let result = (|| {
        let exe = client.compile_hlo(&program, &options(ids, kernels)).map_err(|e| Check::Error(e.to_string()))?;
        let outputs = exe.execute(args).map_err(Check::Error)?;
        check(op, ty, opts.chain.max(1), host, &outputs).map_err(Check::Error)?;
        drop(outputs);
        let (iters, secs) = calibrate(&exe, args, opts.iters, opts.sample_ms).map_err(Check::Error)?;
        let taken =
            decisions.iter().any(|d| d.kernel).then(|| decisions.iter().map(|d| d.implementation.clone()).collect());
        Ok((exe, iters, secs, Program { taken, xla_kernels: kernels }))
    })();
    (path, decisions, result)
}

/// The bytes per device to measure for `ty`: `opts.sizes`, else `min_bytes` (at least one element) times `step` up to
/// `max_bytes`.
fn sizes(opts: &Options, ty: Dtype) -> Vec<usize> {
    let steps = || geometric_sizes(opts.min_bytes.max(ty.bytes()), opts.max_bytes, opts.step);
    opts.sizes.clone().unwrap_or_else(steps)
}

/// `min`, then each size `step` (at least 2) times the last, up to `max`.
pub fn geometric_sizes(min: usize, max: usize, step: usize) -> Vec<usize> {
    std::iter::successors(Some(min), |&b| Some(b.saturating_mul(step.max(2)))).take_while(|&b| b <= max).collect()
}

/// Runs the bench; `progress` gets a line per measured row (the CLI prints them to stderr).
pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report, String> {
    let path = crate::xla_run::find_plugin(opts.plugin.as_deref())?;
    let platform = crate::xla_run::platform_of(&path);
    let inner = crate::xla_run::plugin(&path, platform)?;
    let chain = opts.chain.max(1);
    let want = match (opts.devices, platform) {
        (Some(n), _) => n,
        (None, Platform::Cpu) => 8,
        (None, _) => 0, // all of them, at most 8
    };
    let (client, all) = crate::xla_run::client(inner, platform, want)?;
    let n = if want == 0 { all.len().min(8) } else { want };
    if n == 0 || all.len() < n {
        return Err(format!("{}: the client has {} devices, {n} are needed", path.display(), all.len()));
    }
    let devices: Vec<Device> = all[..n].to_vec();
    let ids: Vec<i64> = devices.iter().map(|d| i64::from(d.id)).collect();
    let mut rows = Vec::new();
    // Progress: sizes done of all, and the time left at the pace so far (each size costs about the same: a compile per
    // implementation and samples of about --sample_ms).
    let total: usize = opts.ops.len() * opts.dtypes.iter().map(|&ty| sizes(opts, ty).len()).sum::<usize>();
    let started = std::time::Instant::now();
    let mut done = 0usize;
    for &op in &opts.ops {
        for &ty in &opts.dtypes {
            for this in sizes(opts, ty) {
                if done > 0 {
                    let spent = started.elapsed().as_secs_f64();
                    let left = spent / done as f64 * (total - done) as f64;
                    progress(&format!("[{done}/{total} sizes, {spent:.0} s so far, about {left:.0} s left]"));
                }
                done += 1;
                let elems = this / ty.bytes();
                if !elems.is_multiple_of(n) || elems == 0 {
                    continue;
                }
                let module = module(op, ty, elems, n, chain);
                let host: Vec<Vec<Vec<i8>>> =
                    (0..n).map(|d| (0..op.arrays(chain)).map(|k| inputs(elems, d, k)).collect()).collect();
                let pjrt = buffer_type(ty.hlo())?;
                let upload = |(dev, vals): (&Device, &Vec<Vec<i8>>)| {
                    vals.iter().map(|v| client.buffer_from_host(&ty.encode(v), pjrt, &[elems as i64], dev)).collect()
                };
                let bufs: Vec<Vec<Buffer<'_>>> = devices.iter().zip(&host).map(upload).collect::<Result<_, _>>()?;
                let args: Vec<Vec<&Buffer<'_>>> = bufs.iter().map(|v| v.iter().collect()).collect();
                // Every implementation compiled and checked first, then their samples interleaved (one of each in
                // turn), so that a load that comes and goes on the machine weighs on all of them alike (see `sample` on
                // what one program leaves the next).
                let mut prepared: Vec<_> = opts
                    .impls
                    .iter()
                    .map(|&imp| (imp, measure(&client, platform, &ids, &module, op, ty, imp, opts, &host, &args)))
                    .collect();
                // An implementation that compiled the same program as an earlier one is timed once, as that one: two
                // timings of one program differ only by the machine's spread (up to 1.14x between `auto` and `peerless`
                // on one CPU kernel), which is not a difference between the implementations.
                let same_as: Vec<Option<usize>> = (0..prepared.len())
                    .map(|k| {
                        let program = |i: usize| prepared[i].1.2.as_ref().ok().map(|x| &x.3);
                        program(k).and_then(|me| (0..k).find(|&j| program(j) == Some(me)))
                    })
                    .collect();
                let mut times: Vec<Vec<f64>> = vec![Vec::new(); prepared.len()];
                let slowest =
                    prepared.iter().filter_map(|(_, (_, _, r))| r.as_ref().ok().map(|x| x.2)).fold(0.0, f64::max);
                let base = samples_for(opts, slowest);
                take_rounds(&mut prepared, &mut times, &args, chain, 0..base, &same_as);
                // A close call between Peerless and XLA gets more samples.
                if let Some(c) = opts.close_calls
                    && c.more > 1
                    && is_close(&prepared, &times, c.close)
                {
                    progress(&format!(
                        "{:>18} {:>4} {:>10} B: a close call, {} samples each",
                        op.name(),
                        ty.name(),
                        this,
                        base * c.more
                    ));
                    take_rounds(&mut prepared, &mut times, &args, chain, base..base * c.more, &same_as);
                }
                for (k, j) in same_as.iter().enumerate() {
                    if let Some(j) = *j {
                        times[k] = times[j].clone();
                        let with = format!(" [the program of the {} row, timed once]", prepared[j].0.name());
                        prepared[k].1.0.push_str(&with);
                    }
                }
                for ((imp, (path, decisions, result)), ts) in prepared.into_iter().zip(times) {
                    let (fa, fb) = op.factors(n as f64);
                    let (us, check) = match result {
                        Ok(_) => (median(ts), Check::Same),
                        Err(c) => (None, c),
                    };
                    let algbw = us.map(|us| fa * this as f64 / us / 1e3);
                    let row = Row {
                        op,
                        dtype: ty,
                        bytes: this,
                        imp,
                        path,
                        decisions,
                        us,
                        algbw_gbps: algbw,
                        busbw_gbps: algbw.map(|a| a * fb),
                        check,
                    };
                    progress(&format!(
                        "{:>18} {:>4} {:>10} B {:>11}: {} {}",
                        op.name(),
                        ty.name(),
                        this,
                        imp.name(),
                        row.us.map_or_else(|| row.check.word().to_owned(), |u| format!("{u:.2} µs")),
                        row.check.note()
                    ));
                    rows.push(row);
                }
            }
        }
    }
    let device_kind = devices[0].kind.clone();
    Ok(Report {
        plugin: path,
        platform,
        device_kind,
        devices: n,
        chain,
        samples: opts.samples,
        iters: opts.iters,
        rows,
    })
}

#[cfg(test)]
#[path = "../tests/unit/xla_bench.rs"]
mod tests;
