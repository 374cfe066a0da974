//! `peerless bench`: Peerless's collectives beside NCCL, in one process on the same GPUs,
//! through the product path: each configuration is an HLO module compiled by the CUDA
//! backend twice, once with default flags (Peerless kernels; all-reduce one-shot up to
//! `one_shot_max_bytes`, two-shot above) and once with every collective on the fallback
//! (NCCL). Every executable is run once and checked against a host-computed result before it
//! is timed.
//!
//! Timing: each of `--samples` samples records a CUDA event on every device, enqueues a
//! batch of back-to-back program launches (`stream`: the thunks' kernel launches; `graph`:
//! one CUDA graph launch per device), records another event; a sample's time per call is the
//! slowest device's elapsed time over the batch; the table reports the median sample. The
//! operands stay in the executable's arena (the same buffers each call, as in a real
//! program). Bandwidths follow nccl-tests with `bytes` = operand bytes per device:
//! all-reduce busbw = bytes/t · 2(n−1)/n; all-gather algbw = n·bytes/t; reduce-scatter and
//! all-to-all algbw = bytes/t; their busbw = algbw · (n−1)/n.

use std::fmt::Write as _;
use std::path::PathBuf;

use emitter::{DeviceMode, Flags};
use ffi::cuda::Event;
use hlo::{Array, ArrayShape, Literal, PrimitiveType};
use kernels::cuda::{Clique, CudaExecutable, device_count, shared_clique};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Number of GPUs (default: all, at most 8).
    #[arg(long)]
    devices: Option<usize>,
    /// Smallest message per device, bytes.
    #[arg(long, default_value_t = 1024)]
    min_bytes: usize,
    /// Largest message per device, bytes.
    #[arg(long, default_value_t = 256 << 20)]
    max_bytes: usize,
    /// Size step factor.
    #[arg(long, default_value_t = 4)]
    step: usize,
    /// Timed samples per configuration (median reported).
    #[arg(long, default_value_t = 50)]
    samples: usize,
    /// Element types (f32, bf16).
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16")]
    dtypes: Vec<String>,
    /// Collectives.
    #[arg(long, value_delimiter = ',', default_value = "all-reduce,all-gather,reduce-scatter,all-to-all")]
    ops: Vec<String>,
    /// Launch modes: stream (each run's kernels launched back to back), graph (one graph
    /// launch per run), graph-batch (one graph of a whole sample's runs, as PyTorch's and
    /// nccl-tests' graph timings do).
    #[arg(long, value_delimiter = ',', default_value = "stream,graph,graph-batch")]
    modes: Vec<String>,
    /// Implementations (peerless, nccl).
    #[arg(long, value_delimiter = ',', default_value = "peerless,nccl")]
    impls: Vec<String>,
    /// Extra emitter flags for the Peerless rows (e.g. `--one_shot_max_bytes=4194304`).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    flags: String,
    /// Largest grids of the Peerless kernels to compare (`--collective_blocks`), one set of
    /// Peerless rows per value (default: the flag's default).
    #[arg(long, value_delimiter = ',')]
    blocks: Vec<u32>,
    /// Write every row as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
}

struct Row {
    op: &'static str,
    dtype: PrimitiveType,
    bytes: usize,
    imp: String,
    mode: &'static str,
    /// `--collective_blocks` of a Peerless row (0 for NCCL).
    blocks: u32,
    us: f64,
    algbw: f64,
    busbw: f64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
}

impl Op {
    fn parse(s: &str) -> Result<Op, String> {
        Ok(match s {
            "all-reduce" => Op::AllReduce,
            "all-gather" => Op::AllGather,
            "reduce-scatter" => Op::ReduceScatter,
            "all-to-all" => Op::AllToAll,
            other => return Err(format!("bench op {other} (all-reduce, all-gather, reduce-scatter, all-to-all)")),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all-reduce",
            Op::AllGather => "all-gather",
            Op::ReduceScatter => "reduce-scatter",
            Op::AllToAll => "all-to-all",
        }
    }

    /// The module: one collective over all `n` replicas of an `elems`-element operand.
    fn module(self, ty: PrimitiveType, elems: usize, n: usize) -> String {
        let t = ty.name();
        let add =
            format!("add {{\n  a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n  ROOT s = {t}[] add(a, b)\n}}\n\n");
        let body = match self {
            Op::AllReduce => format!("ROOT r = {t}[{elems}] all-reduce(p), replica_groups={{}}, to_apply=add"),
            Op::AllGather => {
                format!("ROOT r = {t}[{}] all-gather(p), dimensions={{0}}, replica_groups={{}}", elems * n)
            }
            Op::ReduceScatter => format!(
                "ROOT r = {t}[{}] reduce-scatter(p), dimensions={{0}}, replica_groups={{}}, to_apply=add",
                elems / n
            ),
            Op::AllToAll => format!("ROOT r = {t}[{elems}] all-to-all(p), dimensions={{0}}, replica_groups={{}}"),
        };
        format!(
            "HloModule bench, replica_count={n}\n\n{add}ENTRY e {{\n  p = {t}[{elems}] parameter(0)\n  {body}\n}}\n"
        )
    }

    /// What device `d` must hold, from every device's small-integer inputs.
    fn expected(self, inputs: &[Vec<f64>], d: usize) -> Vec<f64> {
        let n = inputs.len();
        let elems = inputs[0].len();
        match self {
            Op::AllReduce => (0..elems).map(|i| inputs.iter().map(|v| v[i]).sum()).collect(),
            Op::AllGather => inputs.iter().flatten().copied().collect(),
            Op::ReduceScatter => {
                let b = elems / n;
                (d * b..(d + 1) * b).map(|i| inputs.iter().map(|v| v[i]).sum()).collect()
            }
            Op::AllToAll => {
                let b = elems / n;
                inputs.iter().flat_map(|v| v[d * b..(d + 1) * b].iter().copied()).collect()
            }
        }
    }

    /// (algbw factor on bytes, busbw factor on algbw) per nccl-tests.
    fn factors(self, n: f64) -> (f64, f64) {
        match self {
            Op::AllReduce => (1.0, 2.0 * (n - 1.0) / n),
            Op::AllGather => (n, (n - 1.0) / n),
            Op::ReduceScatter | Op::AllToAll => (1.0, (n - 1.0) / n),
        }
    }
}

/// Small integers, exact in f32 and bf16 and under any summation order.
fn fill(ty: PrimitiveType, n: usize, seed: u64) -> (Literal, Vec<f64>) {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut bytes = Vec::with_capacity(n * ty.byte_size());
    let mut vals = Vec::with_capacity(n);
    for _ in 0..n {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let v = ((s >> 33) % 17) as i32 - 8;
        vals.push(v as f64);
        match ty {
            PrimitiveType::Bf16 => bytes.extend_from_slice(&half::bf16::from_f32(v as f32).to_le_bytes()),
            _ => bytes.extend_from_slice(&(v as f32).to_le_bytes()),
        }
    }
    let shape = ArrayShape::new(ty, vec![n as i64]);
    let array = Array::new(shape, bytes).expect("fill builds a matching array");
    (Literal::Array(array), vals)
}

fn decode(ty: PrimitiveType, b: &[u8]) -> Vec<f64> {
    match ty {
        PrimitiveType::Bf16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        _ => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
    }
}

/// Runs `exe` once on fresh inputs and compares every device's result exactly.
fn check(exe: &CudaExecutable, op: Op, ty: PrimitiveType, elems: usize, n: usize, what: &str) -> Result<(), String> {
    let (args, vals): (Vec<Vec<Literal>>, Vec<Vec<f64>>) =
        (0..n).map(|d| fill(ty, elems, (elems * 31 + d) as u64)).map(|(l, v)| (vec![l], v)).unzip();
    let got = exe.execute(&args).map_err(|e| format!("{what}: {e}"))?;
    for (d, l) in got.iter().enumerate() {
        let Literal::Array(a) = l else { return Err(format!("{what}: device {d} returned a tuple")) };
        let got = decode(ty, &a.data);
        let want = op.expected(&vals, d);
        if got.len() != want.len() {
            return Err(format!("{what}: device {d} has {} elements, expected {}", got.len(), want.len()));
        }
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            return Err(format!("{what}: device {d} element {i} is {}, expected {}", got[i], want[i]));
        }
    }
    Ok(())
}

/// Median over samples of the slowest device's time per call, µs: a sample is `launches`
/// calls of `call`, each running the collective `per_launch` times.
fn time(
    clique: &Clique,
    samples: usize,
    launches: usize,
    per_launch: usize,
    call: impl Fn() -> Result<(), String>,
) -> Result<f64, String> {
    let batch = launches * per_launch;
    let e = |e: ffi::Error| e.to_string();
    for _ in 0..5 {
        call()?;
    }
    clique.synchronize().map_err(|e| e.to_string())?;
    let starts = clique.devices.iter().map(|d| Event::new(&d.ctx).map_err(e)).collect::<Result<Vec<_>, _>>()?;
    let ends = clique.devices.iter().map(|d| Event::new(&d.ctx).map_err(e)).collect::<Result<Vec<_>, _>>()?;
    let mut ts = Vec::with_capacity(samples);
    for _ in 0..samples.max(1) {
        for (d, ev) in clique.devices.iter().zip(&starts) {
            d.ctx.bind().map_err(e)?;
            ev.record(&d.stream).map_err(e)?;
        }
        for _ in 0..launches {
            call()?;
        }
        for (d, ev) in clique.devices.iter().zip(&ends) {
            d.ctx.bind().map_err(e)?;
            ev.record(&d.stream).map_err(e)?;
        }
        let mut worst = 0f64;
        for (s, en) in starts.iter().zip(&ends) {
            en.synchronize().map_err(e)?;
            worst = worst.max(en.since(s).map_err(e)? as f64);
        }
        ts.push(worst * 1000.0 / batch as f64);
    }
    ts.sort_by(|a, b| a.total_cmp(b));
    Ok(ts[ts.len() / 2])
}

pub fn run(args: &BenchArgs) -> Result<(), String> {
    let avail = device_count().map_err(|e| e.to_string())?;
    let n = args.devices.unwrap_or(avail).min(avail).min(kernels::cuda::MAX_RANKS);
    if n < 2 {
        return Err(format!("bench needs at least 2 GPUs, found {avail}"));
    }
    let clique = shared_clique(n).map_err(|e| e.to_string())?;
    let ver = ffi::nccl::version().map_err(|e| e.to_string())?;
    println!(
        "# {n} × {}, NCCL {ver}, BLOCKS {} THREADS {}",
        clique.devices[0].name,
        kernels::cuda::BLOCKS,
        kernels::cuda::THREADS
    );
    let fallback = Flags::parse(
        "--all_reduce_backend=fallback --all_gather_backend=fallback --all_to_all_backend=fallback \
         --reduce_scatter_backend=fallback",
    )
    .map_err(|e| e.to_string())?;
    // Peerless kernels at every size: one-shot up to its cut-off, two-shot above.
    let base =
        Flags::parse(&format!("--two_shot_max_bytes={} {}", usize::MAX, args.flags)).map_err(|e| e.to_string())?;
    let peerless: Vec<Flags> = if args.blocks.is_empty() {
        vec![base]
    } else {
        args.blocks
            .iter()
            .map(|b| {
                let mut f = base.clone();
                f.apply(&format!("--collective_blocks={b}")).map(|_| f).map_err(|e| e.to_string())
            })
            .collect::<Result<_, _>>()?
    };
    for i in &args.impls {
        if i != "peerless" && i != "nccl" {
            return Err(format!("bench implementation {i} (peerless, nccl)"));
        }
    }
    let mut rows = Vec::new();
    let wf = n as f64;
    for op in args.ops.iter().map(|s| Op::parse(s)).collect::<Result<Vec<_>, _>>()? {
        for dt in &args.dtypes {
            let ty = match dt.as_str() {
                "f32" => PrimitiveType::F32,
                "bf16" => PrimitiveType::Bf16,
                other => return Err(format!("bench dtype {other} (f32, bf16)")),
            };
            let mut bytes = args.min_bytes;
            while bytes <= args.max_bytes {
                let elems = bytes / ty.byte_size();
                if !elems.is_multiple_of(n) {
                    bytes *= args.step.max(2);
                    continue;
                }
                let batch = if bytes <= 1 << 20 {
                    20
                } else if bytes <= 16 << 20 {
                    4
                } else {
                    1
                };
                let text = op.module(ty, elems, n);
                let module = hlo::parse_text("bench.hlo", &text).map_err(|e| e.to_string())?;
                let configs = peerless.iter().map(|f| (f, false)).chain([(&fallback, true)]);
                for (flags, is_nccl) in configs {
                    if !args.impls.iter().any(|i| i == if is_nccl { "nccl" } else { "peerless" }) {
                        continue;
                    }
                    let exe = CudaExecutable::new(&module, n, DeviceMode::Replica, flags).map_err(|e| e.to_string())?;
                    let imp = if is_nccl {
                        "nccl".to_string()
                    } else {
                        let d = &exe.planned().first().ok_or("no collective planned")?.decision;
                        match d.implementation {
                            thunks::Implementation::Kernel(k) => format!("peerless {}", k.name()),
                            thunks::Implementation::Fallback => format!("peerless fallback ({})", d.reason),
                        }
                    };
                    let what = format!("{imp} {} {bytes} B {}", op.name(), ty.name());
                    check(&exe, op, ty, elems, n, &what)?;
                    for mode in &args.modes {
                        let (mode, us) = match mode.as_str() {
                            "stream" | "graph" => {
                                let graphs = mode == "graph";
                                let call = || exe.enqueue(graphs).map_err(|e| e.to_string());
                                (if graphs { "graph" } else { "stream" }, time(&clique, args.samples, batch, 1, call)?)
                            }
                            "graph-batch" => {
                                let call = || exe.enqueue_batch(batch).map_err(|e| e.to_string());
                                ("graph-batch", time(&clique, args.samples, 1, batch, call)?)
                            }
                            other => return Err(format!("bench mode {other} (stream, graph, graph-batch)")),
                        };
                        exe.finish().map_err(|e| format!("{what} ({mode}): {e}"))?;
                        let (fa, fb) = op.factors(wf);
                        let algbw = fa * bytes as f64 / us / 1e3;
                        eprintln!("{:>14} {:>5} {:>10} {:>28} {:>6} {:>10.2} us", op.name(), dt, bytes, imp, mode, us);
                        rows.push(Row {
                            op: op.name(),
                            dtype: ty,
                            bytes,
                            imp: imp.clone(),
                            mode,
                            blocks: if is_nccl { 0 } else { flags.collective_blocks },
                            us,
                            algbw,
                            busbw: algbw * fb,
                        });
                    }
                }
                bytes *= args.step.max(2);
            }
        }
    }
    let mut table = String::new();
    let _ = writeln!(table, "| op | dtype | bytes/device | impl | launch | µs (median) | algbw GB/s | busbw GB/s |");
    let _ = writeln!(table, "|---|---|---:|---|---|---:|---:|---:|");
    let mut csv = String::from("op,dtype,devices,bytes,impl,mode,max_blocks,us_median,algbw_gbps,busbw_gbps\n");
    for r in &rows {
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {:.2} | {:.1} | {:.1} |",
            r.op, r.dtype, r.bytes, r.imp, r.mode, r.us, r.algbw, r.busbw
        );
        let _ = writeln!(
            csv,
            "{},{},{n},{},{},{},{},{:.3},{:.2},{:.2}",
            r.op, r.dtype, r.bytes, r.imp, r.mode, r.blocks, r.us, r.algbw, r.busbw
        );
    }
    print!("{table}");
    if let Some(p) = &args.csv {
        std::fs::write(p, csv).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}
