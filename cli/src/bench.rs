//! `peerless bench`: Peerless's collectives beside XLA's own, through XLA's PJRT plugin (`--xla-plugin`, else
//! `PEERLESS_XLA_PLUGIN`, else the CPU plugin in the JAX venv). The logic, what each implementation and row means, and
//! the bandwidth conventions (nccl-tests') live in [`tools::xla_bench`]; this file parses the arguments and prints.
//! PyTorch's symmetric-memory collectives are measured by a separate script, `scripts/torch_symm_bench.py`.

use std::fmt::Write as _;
use std::path::PathBuf;

use tools::xla_bench::{Check, Dtype, Impl, Op, Options};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// XLA's PJRT plugin (default: PEERLESS_XLA_PLUGIN, else the CPU plugin of lammps-jax-pjrt-cpu in
    /// $PEERLESS_VENV_DIR/jax or <repo>/.venv/jax).
    #[arg(long, value_name = "PATH")]
    xla_plugin: Option<PathBuf>,
    /// Number of devices (default: GPUs all, at most 8; the CPU plugin 8).
    #[arg(long)]
    devices: Option<usize>,
    /// Smallest operand per device, bytes.
    #[arg(long, default_value_t = 1024)]
    min_bytes: usize,
    /// Largest operand per device, bytes (default 1 GiB; 64 MiB with --members-on-one-gpu).
    #[arg(long)]
    max_bytes: Option<usize>,
    /// Size step factor.
    #[arg(long, default_value_t = 4)]
    step: usize,
    /// Timed samples per row (median reported).
    #[arg(long, default_value_t = 20)]
    samples: usize,
    /// Executes per sample.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Milliseconds of executes per sample, in place of --iters (rows of any size then take about the same time).
    #[arg(long)]
    sample_ms: Option<f64>,
    /// Collectives per module (µs are per collective).
    #[arg(long, default_value_t = 1)]
    chain: usize,
    /// Element types (f32, bf16).
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16")]
    dtypes: Vec<String>,
    /// Collectives.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "all-reduce,all-gather,reduce-scatter,all-to-all,collective-permute"
    )]
    ops: Vec<String>,
    /// Implementations: peerless (the pass without a tuning profile), auto (with the active profile), one-shot /
    /// two-shot (all-reduce forced onto that kernel), xla, xla-kernels, copy-engines (every kind's copy-engine form:
    /// the bytes on the copy engines; CUDA).
    #[arg(long, value_delimiter = ',', default_value = "peerless,auto,xla,xla-kernels")]
    impls: Vec<String>,
    /// Emitter flags for the Peerless rows (e.g. `--one_shot_max_bytes=4194304`).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    flags: String,
    /// Write every row as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Also draw the rows (µs and bus bandwidth against size, one line per implementation) into this PNG, with `python3
    /// -m jax_plugins.peerless.plot` (matplotlib: `pip install "jax-peerless[plot]"`; PEERLESS_PYTHON names another
    /// Python).
    #[arg(long, value_name = "PNG")]
    plot: Option<PathBuf>,
    /// Without XLA, on GPU 0 alone: N members sharing it, each with a stream of its own, through the handlers' own
    /// plans. Checks every form of every kind (the copy engines and today's kernels, every element type and reduction,
    /// eagerly and in CUDA graph replays) against a host reference, then times them (all-gathers also as bare copies).
    #[arg(long, value_name = "N")]
    members_on_one_gpu: Option<usize>,
    /// With --members-on-one-gpu: also time a bf16 GEMM (8192³, cuBLAS) beside each form's largest size and print the
    /// share of its speed alone it keeps. The kernels then get --async_blocks blocks (32) split among the members, as a
    /// call beside compute would.
    #[arg(long)]
    beside_gemm: bool,
    /// With --members-on-one-gpu: graph replays per form and algorithm in the check.
    #[arg(long, default_value_t = 20)]
    graph_replays: usize,
}

/// `auto` counts as keeping up where it is within this factor of the fastest.
const AUTO_BOUND: f64 = 1.1;

pub fn run(args: &BenchArgs) -> Result<(), String> {
    if let Some(n) = args.members_on_one_gpu {
        return one_gpu(args, n);
    }
    let opts = Options {
        plugin: args.xla_plugin.clone(),
        devices: args.devices,
        min_bytes: args.min_bytes,
        max_bytes: args.max_bytes.unwrap_or(1 << 30),
        step: args.step,
        samples: args.samples,
        iters: args.iters,
        chain: args.chain,
        ops: args.ops.iter().map(|s| Op::parse(s)).collect::<Result<_, _>>()?,
        dtypes: args.dtypes.iter().map(|s| Dtype::parse(s)).collect::<Result<_, _>>()?,
        impls: args.impls.iter().map(|s| Impl::parse(s)).collect::<Result<_, _>>()?,
        flags: args.flags.clone(),
        sample_ms: args.sample_ms,
        close_calls: None,
        sizes: None,
    };
    let report = tools::xla_bench::run(&opts, &mut |line| eprintln!("{line}"))?;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# {} devices, {} plugin {}; chain {}, {} samples × {} executes",
        report.devices,
        report.platform,
        report.plugin.display(),
        report.chain,
        report.samples,
        report.iters
    );
    let _ =
        writeln!(t, "| op | dtype | bytes/device | impl | µs/collective | algbw GB/s | busbw GB/s | check | path |");
    let _ = writeln!(t, "|---|---|---:|---|---:|---:|---:|---|---|");
    let mut skipped: Vec<String> = Vec::new();
    for r in &report.rows {
        if let Check::Skipped(why) = &r.check {
            let note = format!("{} {}: {why}", r.imp.name(), r.op.name());
            if !skipped.contains(&note) {
                skipped.push(note);
            }
            continue;
        }
        let num = |v: Option<f64>, digits: usize| v.map_or_else(|| "—".into(), |v| format!("{v:.digits$}"));
        let path = if r.check.note().is_empty() { r.path.clone() } else { r.check.note().to_owned() };
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.op.name(),
            r.dtype.name(),
            r.bytes,
            r.imp.name(),
            num(r.us, 2),
            num(r.algbw_gbps, 2),
            num(r.busbw_gbps, 2),
            r.check.word(),
            path.replace('|', "/")
        );
    }
    for s in &skipped {
        let _ = writeln!(t, "skipped: {s}");
    }
    // How the active profile's choices fared in this run.
    let verdicts = report.auto_verdicts();
    if !verdicts.is_empty() {
        let within = verdicts.iter().filter(|v| v.ratio() <= AUTO_BOUND).count();
        let _ = writeln!(
            t,
            "auto within {AUTO_BOUND}x of the fastest of peerless/one-shot/two-shot/xla: {within} of {} rows",
            verdicts.len()
        );
        for v in verdicts.iter().filter(|v| v.ratio() > AUTO_BOUND) {
            let _ = writeln!(
                t,
                "  {} {} {} B: auto {:.2} µs ({}) vs {} {:.2} µs = {:.2}x",
                v.op.name(),
                v.dtype.name(),
                v.bytes,
                v.auto_us,
                v.took.replace('|', "/"),
                v.best.name(),
                v.best_us,
                v.ratio()
            );
        }
    }
    print!("{t}");
    if let Some(p) = &args.csv {
        std::fs::write(p, report.csv()).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    if let Some(png) = &args.plot {
        plot(&report.csv(), png)?;
    }
    let failed = report.rows.iter().filter(|r| matches!(r.check, Check::Error(_))).count();
    if failed > 0 {
        return Err(format!("{failed} of {} rows failed (see the table)", report.rows.len()));
    }
    Ok(())
}

/// `--members-on-one-gpu N`: the check, then the timings, as tables.
fn one_gpu(args: &BenchArgs, n: usize) -> Result<(), String> {
    use kernels::cuda::one_gpu::{self, Form, TimeOptions};
    let mut say = |line: &str| eprintln!("{line}");
    // `--impls copy-engines`: those alone (a profiler then must see no kernel at all).
    let ce_only = args.impls.iter().all(|i| i == "copy-engines");
    let kinds = args.ops.iter().map(|s| Op::parse(s).map(Op::kind)).collect::<Result<Vec<_>, _>>()?;
    let checked =
        one_gpu::check(n, args.graph_replays, ce_only, &kinds, &mut say).map_err(|e| format!("check: {e}"))?;
    if checked.ce_launches != 0 {
        return Err(format!("check: the copy-engine forms launched {} kernels", checked.ce_launches));
    }
    for e in one_gpu::check_missing_member(n).map_err(|e| format!("check: {e}"))? {
        say(&format!("missing member: {e}"));
    }
    let (min, max) = (args.min_bytes.max(4 * n * n), args.max_bytes.unwrap_or(64 << 20));
    let sizes = tools::xla_bench::geometric_sizes(min, max, args.step);
    let async_blocks = emitter::flags::DEFAULT_ASYNC_BLOCKS;
    let opts = TimeOptions {
        members: n,
        sizes,
        forms: [Form::AllGather(0), Form::AllToAll(0), Form::Ring, Form::ReduceScatter(0), Form::AllReduce]
            .into_iter()
            .filter(|f| kinds.contains(&f.kind()))
            .collect(),
        rounds: args.samples.clamp(1, 20),
        beside_gemm: args.beside_gemm,
        blocks: if args.beside_gemm { (async_blocks / n as u32).max(1) } else { 0 },
        ce_only,
    };
    let rows = one_gpu::time(&opts, &mut say).map_err(|e| format!("bench: {e}"))?;
    println!(
        "# {n} members on GPU 0 (one stream each): {} combinations and {} graph replays equal to the host reference",
        checked.eager, checked.replays
    );
    println!("# µs: every member's call on the one GPU, min / median / max of {} rounds", opts.rounds);
    println!("# copies alone: the all-gather's bytes as bare copies, no flags (what the bytes alone take and cost)");
    println!("| form | algorithm | bytes/member | kernels/call | µs/call | GEMM keeps |\n|---|---|---:|---:|---|---|");
    for r in &rows {
        let kept = r.gemm_kept.map_or_else(|| "—".into(), |k| format!("{:.3} ({:.3}–{:.3})", k[1], k[0], k[2]));
        println!(
            "| {} | {} | {} | {} | {:.1} ({:.1}–{:.1}) | {kept} |",
            r.form, r.algorithm, r.bytes, r.launches, r.us[1], r.us[0], r.us[2]
        );
    }
    Ok(())
}

/// Draws `csv` (a report's rows) into `png` with the wheel's plot module.
fn plot(csv: &str, png: &std::path::Path) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("peerless-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let file = dir.join("bench.csv");
    std::fs::write(&file, csv).map_err(|e| format!("{}: {e}", file.display()))?;
    let python = std::env::var("PEERLESS_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(&python)
        .args(["-m", "jax_plugins.peerless.plot"])
        .arg(&file)
        .arg("--out")
        .arg(png)
        .output()
        .map_err(|e| format!("--plot: cannot run {python}: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    let out = out?;
    if !out.status.success() {
        return Err(format!(
            "--plot: {python} -m jax_plugins.peerless.plot failed (the plot needs the jax-peerless package and \
             matplotlib: pip install \"jax-peerless[plot]\"): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    eprintln!("plot: {}", png.display());
    Ok(())
}
