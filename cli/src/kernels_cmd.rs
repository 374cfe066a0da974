//! `peerless kernels`: what the library carries prebuilt and where each GPU's kernels would come from; `peerless
//! kernels build` makes the bundle that `PEERLESS_PREBUILT_KERNELS` embeds (kernels/src/cuda/prebuilt.rs).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use kernels::cuda::prebuilt::{self, DEFAULT_TARGETS, Target};
use kernels::gpu::{Origin, Unit};
use prost::Message;

#[derive(clap::Args)]
pub struct KernelsArgs {
    #[command(subcommand)]
    command: Option<KernelsCommand>,
    /// Say where each kernel for this architecture (sm_XY) would come from.
    #[arg(long, value_name = "sm_XY")]
    arch: Option<String>,
}

#[derive(clap::Subcommand)]
enum KernelsCommand {
    /// Compile every kernel unit for the targets with NVRTC into a bundle file.
    Build {
        /// The bundle to write.
        #[arg(long)]
        out: PathBuf,
        /// CUBIN (sm_XY) and PTX (compute_XY) targets, comma-separated.
        #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_TARGETS.iter().map(|s| s.to_string()))]
        targets: Vec<String>,
        /// Compiler threads (default: the machine's cores).
        #[arg(long)]
        jobs: Option<usize>,
    },
}

pub fn run(args: KernelsArgs) -> Result<(), String> {
    match args.command {
        Some(KernelsCommand::Build { out, targets, jobs }) => build(&out, &targets, jobs),
        None => show(args.arch.as_deref()),
    }
}

fn build(out: &PathBuf, targets: &[String], jobs: Option<usize>) -> Result<(), String> {
    let targets = targets.iter().map(|t| Target::parse(t)).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    let jobs = jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let started = std::time::Instant::now();
    let names: Vec<String> = targets.iter().map(|t| t.name()).collect();
    eprintln!("compiling {} kernel units for {} on {jobs} threads", Unit::all().len(), names.join(", "));
    let bundle = prebuilt::build(&targets, jobs, |done, total| {
        if done == total || done % 50 == 0 {
            eprint!("\r  {done}/{total} compiled ({:.0} s)", started.elapsed().as_secs_f64());
            let _ = std::io::stderr().flush();
        }
    })
    .map_err(|e| e.to_string())?;
    eprintln!();
    let bytes = bundle.encode_to_vec();
    std::fs::write(out, &bytes).map_err(|e| format!("{}: {e}", out.display()))?;
    println!(
        "{}: {} code objects, {:.1} MiB, {} ({:.0} s)",
        out.display(),
        bundle.blobs.len(),
        bytes.len() as f64 / (1 << 20) as f64,
        bundle.compiler,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn show(arch: Option<&str>) -> Result<(), String> {
    match prebuilt::embedded() {
        Some(b) => {
            let size: usize = b.blobs.iter().map(|x| x.code.len()).sum();
            let targets: Vec<String> = b.targets().iter().map(|t| t.name()).collect();
            println!(
                "prebuilt: {} code objects for {} ({:.1} MiB deflated, {})",
                b.blobs.len(),
                targets.join(", "),
                size as f64 / (1 << 20) as f64,
                b.compiler
            );
        }
        None => println!("prebuilt: none in this build (kernels compile with NVRTC on first use)"),
    }
    if let Some(arch) = arch {
        let cc = kernels::cuda::compute_capability(arch).map_err(|e| e.to_string())?;
        println!("{arch}: {}", summary(cc));
    }
    Ok(())
}

/// Where the kernel units for compute capability `cc` come from, counted: `281 prebuilt (sm_90)` / `cached` / `compile
/// on first use`.
pub fn summary(cc: u32) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for u in Unit::all() {
        let what = match kernels::cuda::availability(cc, u) {
            Origin::Compiled { .. } => "compile on first use (NVRTC)".to_string(),
            o => o.to_string(),
        };
        *counts.entry(what).or_default() += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    format!("{} kernel units: {}", Unit::all().len(), parts.join(", "))
}
