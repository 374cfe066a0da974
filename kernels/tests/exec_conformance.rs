//! The host backend on the HLO conformance suite: every case under `hlo-tests/cases/`,
//! on each declared device count, compiled to thunk programs and run on N worker
//! threads, compared with XLA's goldens at the suite's tolerances. Each case runs in
//! two configurations: `kernel` (default flags: Peerless kernels where the rules allow)
//! and `fallback` (every `*_backend=fallback`).
//!
//! A third trial per case and device count (`layout::`) checks the buffer assignment the
//! host backend runs with: aligned, inside the arena, no two simultaneously live buffers
//! sharing a byte, and scratch / signals / the zero region shared with nothing.
//!
//! `cargo test -p peerless-kernels --test exec_conformance [-- FILTER]`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use emitter::Flags;
use hlo_tests::{Case, golden_path, load_cases, read_golden};
use kernels::exec::{BackendKind, Executable};
use libtest_mimic::{Arguments, Failed, Trial};

const FALLBACK: &str = "--all_reduce_backend=fallback --all_gather_backend=fallback --all_to_all_backend=fallback \
                        --reduce_scatter_backend=fallback --collective_permute_backend=fallback";

#[derive(Clone, Copy, Debug)]
enum Config {
    Kernel,
    Fallback,
}

fn backend() -> BackendKind {
    match std::env::var("PEERLESS_TEST_BACKEND").as_deref() {
        Ok("host") | Err(_) => BackendKind::Host,
        Ok(other) => panic!("PEERLESS_TEST_BACKEND={other}: only host (GPUs run modules inside XLA)"),
    }
}

/// Devices the backend has (host: any number).
fn available(kind: BackendKind) -> usize {
    match kind {
        BackendKind::Host => usize::MAX,
    }
}

fn run_case(case: &Case, n: usize, config: Config) -> Result<(), String> {
    let d = case.directive.as_ref().map_err(Clone::clone)?;
    let module = hlo::parse_text(&case.path.display().to_string(), &case.text).map_err(|e| format!("parse: {e}"))?;
    let golden = read_golden(&golden_path(&case.name, n), n)?;
    let args = hlo_tests::make_args(&module.entry_param_shapes(), &golden)?;
    let mode = d.mode.device_mode();
    let flags = match config {
        Config::Kernel => Flags::default(),
        Config::Fallback => Flags::parse(FALLBACK).map_err(|e| e.to_string())?,
    };
    let exe = Executable::new(backend(), &module, n, mode, &flags).map_err(|e| format!("compile: {e}"))?;
    if let Config::Fallback = config
        && let Some(k) = exe.planned().iter().find(|p| p.decision.is_kernel() && p.groups.iter().any(|g| g.len() > 1))
    {
        return Err(format!("fallback configuration planned a kernel: {k}"));
    }
    // Twice: the second run reuses the arenas (signals keep counting).
    for run in 0..2 {
        let got = exe.execute(&args).map_err(|e| format!("execute (run {run}): {e}"))?;
        hlo_tests::compare_results(&got, &golden, d.tolerance).map_err(|e| format!("run {run}: {e}"))?;
    }
    Ok(())
}

fn check_layout(case: &Case, n: usize) -> Result<(), String> {
    use emitter::buffers::{ALIGN, BufferKind};
    let d = case.directive.as_ref().map_err(Clone::clone)?;
    let module = hlo::parse_text(&case.path.display().to_string(), &case.text).map_err(|e| format!("parse: {e}"))?;
    let mode = d.mode.device_mode();
    let p = kernels::exec::host_programs(&module, n, mode, &Flags::default()).map_err(|e| e.to_string())?;
    let b = &p.buffers;
    let reserved = |k| matches!(k, BufferKind::Signals | BufferKind::Scratch | BufferKind::Zero);
    for (i, x) in b.buffers.iter().enumerate() {
        if x.region.offset % ALIGN != 0 || x.region.offset + x.region.len > b.arena_bytes {
            return Err(format!("{x:?} unaligned or outside the {}-byte arena", b.arena_bytes));
        }
        for y in &b.buffers[i + 1..] {
            let together = x.first <= y.last && y.first <= x.last;
            if (together || reserved(x.kind) || reserved(y.kind)) && x.region.overlaps(&y.region) {
                return Err(format!("{x:?} overlaps {y:?}\n{p}"));
            }
        }
    }
    if p.programs.len() != n || p.programs.iter().any(|q| q.thunks != p.programs[0].thunks) {
        return Err("programs differ between devices".into());
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let kind = backend();
    let gpus = available(kind);
    let cases = Arc::new(load_cases().expect("cannot read hlo-tests/cases"));
    let matched = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let mut trials = Vec::new();
    for (idx, case) in cases.iter().enumerate() {
        let devices = match &case.directive {
            Ok(d) => d.devices.clone(),
            Err(e) => {
                let e = e.clone();
                trials.push(Trial::test(format!("directive::{}", case.name), move || Err(Failed::from(e))));
                continue;
            }
        };
        for n in devices {
            let layout_cases = cases.clone();
            trials.push(Trial::test(format!("layout::{}::d{n}", case.name), move || {
                check_layout(&layout_cases[idx], n).map_err(Failed::from)
            }));
            for (ci, config) in [Config::Kernel, Config::Fallback].into_iter().enumerate() {
                let cases = cases.clone();
                let matched = matched[ci].clone();
                let label = match config {
                    Config::Kernel => "kernel",
                    Config::Fallback => "fallback",
                };
                let trial = Trial::test(format!("{label}::{}::d{n}", case.name), move || {
                    run_case(&cases[idx], n, config).map_err(Failed::from)?;
                    matched.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                });
                // More devices than this machine has: ignored (counted as such), never passed.
                trials.push(trial.with_ignored_flag(n > gpus));
            }
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    println!(
        "{} backend: {} case runs matched XLA goldens (kernel) / {} (fallback)",
        kind.name(),
        matched[0].load(Ordering::Relaxed),
        matched[1].load(Ordering::Relaxed)
    );
    conclusion.exit();
}
