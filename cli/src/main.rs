//! `peerless`: check and run XLA HLO modules on N devices (`peerless --help`). `run` goes through XLA's own PJRT plugin
//! with Peerless's pass and handlers inside it; npz arrays are named `p{i}_d{d}` / `o{j}_d{d}` (see `runs::io`).

mod bench;
mod devices;
mod kernels_cmd;
mod report;
mod tune;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand, ValueEnum};
use hlo::Module;
use runs::{Mode, RunConfig};

#[derive(Parser)]
#[command(name = "peerless", version, about = "Peerless: XLA HLO programs with collectives on N devices")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse and verify a module (HLO text or binary HloModuleProto), print a summary and, for N devices, how every
    /// collective would run and why.
    Check(CheckArgs),
    /// Run a module on N devices and print (and optionally save) every device's outputs.
    Run(RunArgs),
    /// List the Peerless flags (set in PEERLESS_FLAGS or with --flag NAME=VALUE).
    Flags,
    /// Benchmark collectives through XLA: Peerless's kernels, XLA's own path and XLA's collective kernels.
    Bench(bench::BenchArgs),
    /// Measure Peerless's algorithms against XLA's and write the tuning profile the pass reads.
    Tune(tune::TuneArgs),
    /// List the local GPUs, the peer-access table, the probe results and where each GPU's kernels come from (prebuilt,
    /// cached, compiled).
    Devices,
    /// The prebuilt kernels this build carries; `kernels build` makes a bundle to embed.
    Kernels(kernels_cmd::KernelsArgs),
}

#[derive(clap::Args)]
struct CheckArgs {
    /// The module file.
    file: PathBuf,
    #[command(flatten)]
    devices: DeviceArgs,
    /// The platform whose decisions to explain: XLA:CPU's (shared memory), or CUDA's (opens this machine's GPUs for
    /// their peer-access table; without GPUs every collective stays XLA's, saying why).
    #[arg(long, value_enum, default_value_t = PlatformArg::Cpu)]
    platform: PlatformArg,
    /// The devices' kind as XLA names it (`jax.devices()[0].device_kind`, e.g. "NVIDIA H200"), which the tuning profile
    /// is looked up by. XLA:CPU's is "cpu"; on CUDA without it the profile is looked up without a kind (a GPU is never
    /// opened for it).
    #[arg(long)]
    device_kind: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlatformArg {
    Cpu,
    Cuda,
}

/// Device layout and Peerless flags, shared by `check` and `run`.
#[derive(clap::Args)]
struct DeviceArgs {
    /// Number of devices (default: the module's replica_count × num_partitions).
    #[arg(long)]
    devices: Option<usize>,
    /// Whether devices are replicas or partitions (default: partition when the module declares num_partitions > 1, else
    /// replica).
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// A Peerless flag, e.g. `--flag all_reduce_backend=fallback` (repeatable; applied after PEERLESS_FLAGS). `peerless
    /// flags` lists them.
    #[arg(long = "flag", value_name = "NAME=VALUE")]
    flags: Vec<String>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The module file (HLO text or binary HloModuleProto).
    file: PathBuf,
    #[command(flatten)]
    devices: DeviceArgs,
    /// Inputs as npz (`p{i}_d{d}`); without it, seeded random inputs.
    #[arg(long)]
    inputs: Option<PathBuf>,
    /// Seed for random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write inputs and outputs (`p{i}_d{d}`, `o{j}_d{d}`) to this npz file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// XLA's PJRT plugin that runs the module (default: PEERLESS_XLA_PLUGIN, else the CPU plugin of lammps-jax-pjrt-cpu
    /// in $PEERLESS_VENV_DIR/jax or <repo>/.venv/jax).
    #[arg(long, value_name = "PATH")]
    xla_plugin: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Replica,
    Partition,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn,peerless::compile=info")).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check(args) => check(&args),
        Command::Run(args) => run(&args),
        Command::Flags => {
            print!("{}", emitter::flags_help());
            Ok(())
        }
        Command::Bench(args) => bench::run(&args).map_err(Into::into),
        Command::Tune(args) => tune::run(&args).map_err(Into::into),
        Command::Devices => devices::run().map_err(Into::into),
        Command::Kernels(a) => kernels_cmd::run(a).map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

fn load(file: &std::path::Path) -> CliResult<(Module, f64)> {
    let t = Instant::now();
    let module = hlo::load_file(file)?;
    Ok((module, t.elapsed().as_secs_f64()))
}

fn check(args: &CheckArgs) -> CliResult<()> {
    let (module, secs) = load(&args.file)?;
    print!("{}", report::summary(&module));
    let declared = module.config.replica_count.max(1) * module.config.num_partitions.max(1);
    let collectives = module.collectives().len();
    if args.devices.devices.is_none() && declared == 1 && collectives > 0 {
        // JAX's dumps do not carry the device count in the header; guessing would explain decisions for a layout the
        // user never asked about.
        println!("{collectives} collectives: pass --devices N to see how each would run on N devices");
    } else {
        // The decisions of the pass inside XLA, on the module XLA would get: the same preparation as `run` (device
        // assignment written in), no plugin needed.
        let cfg = run_config(&module, &args.devices)?;
        flags(&args.devices)?;
        let platform = match args.platform {
            PlatformArg::Cpu => plugin::Platform::Cpu,
            PlatformArg::Cuda => plugin::Platform::Cuda,
        };
        if let Some(kind) = &args.device_kind {
            plugin::xla_inside::record_device_kind(platform, kind);
        }
        // The active tuning profile (the pass inside XLA decides with it where the flags leave the choice to it;
        // explicit all-reduce thresholds keep all-reduce on them).
        let pass = plugin::xla_inside::pass_config(platform, &pass_flags(&args.devices).join(" "), "")?;
        let tuning = pass.tuning.resolve(cfg.num_devices);
        match &tuning.profile {
            Some(p) => println!("tuning profile: {}", p.source),
            None => println!("tuning profile: none (the flags' thresholds decide)"),
        }
        let bytes = module_bytes(&args.file, &module)?;
        let ids: Vec<i64> = (0..cfg.num_devices as i64).collect();
        let (_, outcome) = tools::xla_run::prepare(&bytes, cfg.mode, &ids, platform, &pass_flags(&args.devices))?;
        print!("{}", report::decisions(&outcome.decisions, &cfg, platform.name()));
    }
    println!("ok: parsed and verified in {}", report::duration(secs));
    Ok(())
}

/// The module as an HloModuleProto: a `.pb` file's bytes, or the parsed text encoded in Rust (the module as parsed and
/// verified; no Python).
fn module_bytes(file: &std::path::Path, module: &Module) -> CliResult<Vec<u8>> {
    let bytes = std::fs::read(file)?;
    let is_pb = file.extension().is_some_and(|e| e == "pb");
    Ok(match std::str::from_utf8(&bytes) {
        Ok(text) if !is_pb => hlo::encode_proto(module).map_err(|e| e.with_source(text))?,
        _ => bytes,
    })
}

/// `--flag NAME=VALUE` as the pass reads them (`--name=value`; PEERLESS_FLAGS is read too).
fn pass_flags(args: &DeviceArgs) -> Vec<String> {
    args.flags.iter().map(|f| format!("--{}", f.trim_start_matches('-'))).collect()
}

/// PEERLESS_FLAGS, then each `--flag NAME=VALUE`.
fn flags(args: &DeviceArgs) -> CliResult<emitter::Flags> {
    let mut flags = emitter::Flags::from_env()?;
    for f in pass_flags(args) {
        flags.apply(&f)?;
    }
    Ok(flags)
}

/// Picks device count and mode from the flags and the module header, rejecting combinations the module contradicts.
fn run_config(module: &Module, args: &DeviceArgs) -> CliResult<RunConfig> {
    let (replicas, partitions) = (module.config.replica_count.max(1), module.config.num_partitions.max(1));
    let mode = match args.mode {
        Some(ModeArg::Replica) => Mode::Replica,
        Some(ModeArg::Partition) => Mode::Partition,
        None if partitions > 1 => Mode::Partition,
        None => Mode::Replica,
    };
    if replicas > 1 && partitions > 1 {
        return Err(format!(
            "module declares replica_count={replicas} and num_partitions={partitions}; \
             Peerless runs either replicas or partitions, not both"
        )
        .into());
    }
    let declared = match mode {
        Mode::Replica => replicas,
        Mode::Partition => partitions,
    } as usize;
    let num_devices = args.devices.unwrap_or(declared.max(replicas as usize * partitions as usize));
    if num_devices == 0 {
        return Err("--devices must be at least 1".into());
    }
    if declared > 1 && declared != num_devices {
        let what = if mode == Mode::Replica { "replica_count" } else { "num_partitions" };
        return Err(format!("module declares {what}={declared} but --devices is {num_devices}").into());
    }
    Ok(RunConfig { num_devices, mode })
}

fn run(args: &RunArgs) -> CliResult<()> {
    let (module, parse_secs) = load(&args.file)?;
    let cfg = run_config(&module, &args.devices)?;
    let inputs = match &args.inputs {
        Some(path) => runs::io::inputs_from_npz(&module, &cfg, &runs::io::read_npz(path)?)?,
        None => runs::io::random_inputs(&module, &cfg, args.seed)?,
    };
    log::info!("running {} on {} devices ({:?} mode)", module.name, cfg.num_devices, cfg.mode);
    let t = Instant::now();
    let outputs = run_xla(args, &module, &cfg, &inputs)?;
    let run_secs = t.elapsed().as_secs_f64();
    print!("{}", report::outputs_table(&cfg, &outputs));
    if let Some(out) = &args.out {
        let mut arrays = runs::io::inputs_to_npz(&inputs)?;
        arrays.extend(runs::io::outputs_to_npz(&outputs));
        runs::io::write_npz(out, &arrays)?;
        println!("wrote {}", out.display());
    }
    println!(
        "{}: {} {}s inside XLA: parse+verify {}, run {}",
        module.name,
        cfg.num_devices,
        report::device_word(cfg.mode),
        report::duration(parse_secs),
        report::duration(run_secs)
    );
    Ok(())
}

/// XLA's plugin runs the module, Peerless's pass and handlers inside it.
fn run_xla(
    args: &RunArgs,
    module: &Module,
    cfg: &RunConfig,
    inputs: &[Vec<hlo::Literal>],
) -> CliResult<Vec<hlo::Literal>> {
    // Checked here, as the other backends check them; the pass reads them again (with PEERLESS_FLAGS) in the form XLA's
    // plugin hands it.
    flags(&args.devices)?;
    let pass_flags = pass_flags(&args.devices);
    let path = tools::xla_run::find_plugin(args.xla_plugin.as_deref()).map_err(|e| {
        format!(
            "{e}.\n`peerless run` runs the module inside XLA. Install XLA's CPU plugin (Python 3.12: \
             `pip install lammps-jax-pjrt-cpu==0.11.2`; scripts/setup.sh installs it into .venv/jax) and set \
             PEERLESS_XLA_PLUGIN=$(python -c 'import lammps_jax_pjrt_cpu as m; print(m.PLUGIN_PATH)')"
        )
    })?;
    let bytes = module_bytes(&args.file, module)?;
    let run = tools::xla_run::run(&path, module, &bytes, cfg, inputs, &pass_flags, &[])?;
    let on_peerless = run.decisions.iter().filter(|d| d.kernel).count();
    println!(
        "xla: {} ({}); Peerless's pass: {on_peerless} of {} collectives on Peerless{}",
        run.plugin.display(),
        run.platform,
        run.decisions.len(),
        if run.rewritten { "" } else { " (module unchanged)" }
    );
    for d in &run.decisions {
        println!("  {d}");
    }
    Ok(run.outputs)
}
