//! `peerless tune`: measures Peerless's algorithms against XLA's own collectives through XLA (as `peerless bench`) and
//! writes the tuning profile the pass reads by default (`tools::xla_tune`, `emitter::tuning`). Prints the crossovers as
//! a Markdown table and where the profile went; a progress line per measured row goes to stderr.

use std::path::PathBuf;

use tools::xla_bench::{Dtype, Op};
use tools::xla_tune::{TuneOptions, crossovers};

#[derive(clap::Args)]
pub struct TuneArgs {
    /// XLA's PJRT plugin (as `peerless bench`).
    #[arg(long, value_name = "PATH")]
    xla_plugin: Option<PathBuf>,
    /// Devices (the profile's key; default 8 on the CPU plugin).
    #[arg(long)]
    devices: Option<usize>,
    /// Group sizes to measure (default: the device count).
    #[arg(long, value_delimiter = ',')]
    groups: Vec<usize>,
    /// Smallest operand per device, bytes.
    #[arg(long)]
    min_bytes: Option<usize>,
    /// Largest operand per device, bytes.
    #[arg(long)]
    max_bytes: Option<usize>,
    /// Size step factor.
    #[arg(long)]
    step: Option<usize>,
    /// Timed samples per row (the median is kept).
    #[arg(long)]
    samples: Option<usize>,
    /// Milliseconds of executes per sample.
    #[arg(long)]
    sample_ms: Option<f64>,
    /// Collectives per module.
    #[arg(long)]
    chain: Option<usize>,
    /// Element types (f32, bf16).
    #[arg(long, value_delimiter = ',')]
    dtypes: Vec<String>,
    /// Collectives.
    #[arg(long, value_delimiter = ',')]
    ops: Vec<String>,
    /// A short tune (CI): f32, 1 KiB to 64 KiB, 2 samples of ~2 ms; other options still apply.
    #[arg(long)]
    quick: bool,
    /// Directory for the profile (default: the cache's tuning/ directory, where the pass looks).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Describes the machine in the profile (default: the host name and CPU count).
    #[arg(long)]
    machine: Option<String>,
}

fn machine() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    format!("{} ({cpus} cores, {model})", host.trim())
}

pub fn run(args: &TuneArgs) -> Result<(), String> {
    let mut o = TuneOptions::default();
    if args.quick {
        o = o.quick();
    }
    let b = &mut o.bench;
    b.plugin = args.xla_plugin.clone();
    b.devices = args.devices;
    b.min_bytes = args.min_bytes.unwrap_or(b.min_bytes);
    b.max_bytes = args.max_bytes.unwrap_or(b.max_bytes);
    b.step = args.step.unwrap_or(b.step);
    b.samples = args.samples.unwrap_or(b.samples);
    b.sample_ms = args.sample_ms.or(b.sample_ms);
    b.chain = args.chain.unwrap_or(b.chain);
    if !args.dtypes.is_empty() {
        b.dtypes = args.dtypes.iter().map(|s| Dtype::parse(s)).collect::<Result<_, _>>()?;
    }
    if !args.ops.is_empty() {
        b.ops = args.ops.iter().map(|s| Op::parse(s)).collect::<Result<_, _>>()?;
    }
    o.groups = args.groups.clone();
    o.out_dir = args.out_dir.clone();
    o.machine = args.machine.clone().unwrap_or_else(machine);
    o.command =
        std::env::args().map(|a| if a.contains(' ') { format!("'{a}'") } else { a }).collect::<Vec<_>>().join(" ");
    let start = std::time::Instant::now();
    let report = tools::xla_tune::run(&o, &mut |line| eprintln!("{line}"))?;
    print!("{}", crossovers(&report.profile));
    println!(
        "wrote {} ({} rows measured in {:.0} s); the pass reads it by default (PEERLESS_TUNING_PROFILE=0 turns it off)",
        report.path.display(),
        report.rows.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
