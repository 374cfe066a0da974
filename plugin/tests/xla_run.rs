//! The HLO conformance suite through XLA: every case of `hlo-tests/cases/`, on each of its
//! golden device counts, is run by XLA's own CPU plugin with Peerless's collective pass
//! applied and its handlers registered (`peerless run --backend xla` in-process), and
//! compared with XLA's goldens (floats within the suite's dtype tolerances, integers and
//! pred exactly). Three trials per (case, device count):
//!
//! - `kernel::<case>::d<N>`: the case's HLO text, parsed and encoded as an HloModuleProto by
//!   Peerless (`hlo::encode_proto`: no Python), every collective forced onto Peerless
//!   (`--<op>_backend=kernel`; what the rules still refuse stays XLA's with its reason). The
//!   async start/done cases must have every collective on a Peerless kernel.
//! - `fallback::<case>::d<N>`: the same module, every `--<op>_backend=fallback`: XLA's own
//!   collectives, and no decision may say kernel.
//! - `proto::<case>::d<N>`: XLA's own serialized proto of the case (`goldens/<case>.pb`,
//!   jaxlib's parser), default flags.
//!
//! Cases XLA's PJRT client cannot run are listed in [`UNSUPPORTED`] with the reason and a
//! fragment of the error they must fail with; any other failure fails the test, and a
//! listed case that passes fails with "now passes: remove from the list". Over all trials,
//! the collectives the pass put on Peerless vs left to XLA are tallied and printed; the
//! total on Peerless must be > 0.
//!
//! Needs XLA's CPU plugin (`lammps-jax-pjrt-cpu` in `.venv/jax`, which scripts/setup.sh
//! installs, or PEERLESS_XLA_PLUGIN), loaded once per process. Without it the test fails,
//! unless PEERLESS_SKIP_XLA_PLUGIN=1 says to skip it (CI never sets it).
//!
//! `cargo test -p peerless-plugin --test xla_run [-- FILTER]`. Trials run one at a time
//! unless `--test-threads` says otherwise (each builds its own XLA client).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hlo_tests::{Case, Directive, Mode, golden_path, load_cases, make_args, proto_path, read_golden};
use libtest_mimic::{Arguments, Failed, Trial};

/// Cases the xla backend cannot run: (case, device count or `None` for all, reason, a
/// fragment of the error the run must fail with).
const UNSUPPORTED: &[(&str, Option<usize>, &str, &str)] = &[
    (
        "all_to_all_groups",
        None,
        "nested tuple result (a tuple of the all-to-all's tuple): Nested tuples are not supported in XLA:CPU's PJRT client",
        "Nested tuples are not supported",
    ),
    (
        "call",
        None,
        "nested tuple result: Nested tuples are not supported in XLA:CPU's PJRT client",
        "Nested tuples are not supported",
    ),
    (
        "parameter_tuple_gte",
        None,
        "nested tuple result: Nested tuples are not supported in XLA:CPU's PJRT client",
        "Nested tuples are not supported",
    ),
    (
        "reduce_argmax",
        None,
        "nested tuple result: Nested tuples are not supported in XLA:CPU's PJRT client",
        "Nested tuples are not supported",
    ),
    (
        "reduce_window",
        None,
        "nested tuple result: Nested tuples are not supported in XLA:CPU's PJRT client",
        "Nested tuples are not supported",
    ),
    (
        "f8_s4_movement",
        None,
        "f8e4m3fn / s4 arrays: the xla backend has no PJRT buffer type mapping for them",
        "does not move f8e4m3fn arrays",
    ),
    (
        "select_clamp",
        None,
        "XLA:CPU of this plugin fails to compile clamp with scalar bounds (xtile.extract rank mismatch)",
        "xtile.extract",
    ),
    ("jax_all_gather_tiled_x8", None, SDY, "xla.sdy"),
    ("jax_all_gather_untiled_x4", None, SDY, "xla.sdy"),
    ("jax_all_to_all_2x4_x", None, SDY, "xla.sdy"),
    ("jax_all_to_all_x4", None, SDY, "xla.sdy"),
    ("jax_axis_index_math_x8", None, SDY, "xla.sdy"),
    ("jax_mlp_2x4", None, SDY, "xla.sdy"),
    ("jax_pmax_pmin_x2", None, SDY, "xla.sdy"),
    ("jax_ppermute_2x2_y_axis_index", None, SDY, "xla.sdy"),
    ("jax_ppermute_x8", None, SDY, "xla.sdy"),
    ("jax_psum_2x2_both", None, SDY, "xla.sdy"),
    ("jax_psum_2x4_y_gather_x", None, SDY, "xla.sdy"),
    ("jax_psum_bf16_int_x2", None, SDY, "xla.sdy"),
    ("jax_psum_scatter_2x4_both", None, SDY, "xla.sdy"),
    ("jax_psum_scatter_x4", None, SDY, "xla.sdy"),
    ("jax_psum_x4", None, SDY, "xla.sdy"),
    ("jax_gspmd_ppermute_all_to_all_x4", None, GSPMD, "shape mismatch"),
    ("jax_gspmd_psum_x4", None, GSPMD, "shape mismatch"),
];

const SDY: &str = "a JAX shard_map module in Shardy form (xla.sdy.* custom calls): the xla backend compiles without \
                   Shardy's import, so XLA's SPMD partitioner rejects it";
const GSPMD: &str = "a JAX GSPMD module with a tuple result that has no sharding: XLA's propagation makes the outputs \
                     replicated full arrays, the goldens are per-device shards";

fn unsupported(name: &str, n: usize) -> Option<(&'static str, &'static str)> {
    UNSUPPORTED
        .iter()
        .find(|&&(c, d, _, _)| c == name && d.is_none_or(|d| d == n))
        .map(|&(_, _, reason, fragment)| (reason, fragment))
}

/// Collectives over all trials run: on Peerless (a kernel) and left to XLA.
#[derive(Default)]
struct Tally {
    peerless: usize,
    xla: usize,
    /// Trials that got as far as the pass.
    runs: usize,
    /// Trials that matched the goldens, per source.
    matched: [usize; 3],
}

/// Where a trial's module comes from and the flags its pass runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The case's text through Peerless's parser and proto encoder, collectives forced onto kernels.
    Kernel,
    /// The same, every collective forced to XLA's own.
    Fallback,
    /// XLA's serialized proto of the case (`goldens/<case>.pb`), default flags.
    Proto,
}

impl Source {
    const ALL: [Source; 3] = [Source::Kernel, Source::Fallback, Source::Proto];

    fn label(self) -> &'static str {
        match self {
            Source::Kernel => "kernel",
            Source::Fallback => "fallback",
            Source::Proto => "proto",
        }
    }

    fn flags(self) -> Vec<String> {
        let backend = match self {
            Source::Kernel => "kernel",
            Source::Fallback => "fallback",
            Source::Proto => return Vec::new(),
        };
        ["all_reduce", "all_gather", "all_to_all", "reduce_scatter", "collective_permute"]
            .iter()
            .map(|op| format!("--{op}_backend={backend}"))
            .collect()
    }
}

fn run_case(
    plugin: &Path,
    case: &Case,
    d: &Directive,
    n: usize,
    source: Source,
    tally: &Mutex<Tally>,
) -> Result<(), String> {
    let (module, bytes) = match source {
        Source::Proto => {
            let bytes = std::fs::read(proto_path(&case.name)).map_err(|e| e.to_string())?;
            let module = hlo::decode_proto(&case.name, &bytes).map_err(|e| format!("decode_proto: {e}"))?;
            (module, bytes)
        }
        Source::Kernel | Source::Fallback => {
            let file = case.path.display().to_string();
            let module = hlo::parse_text(&file, &case.text).map_err(|e| format!("parse: {e}"))?;
            let bytes =
                hlo::encode_proto(&module).map_err(|e| format!("encode_proto: {}", e.with_source(&case.text)))?;
            (module, bytes)
        }
    };
    let golden = read_golden(&golden_path(&case.name, n), n)?;
    let args = make_args(&module.entry_param_shapes(), &golden)?;
    let mode = if d.mode == Mode::Replica { runs::Mode::Replica } else { runs::Mode::Partition };
    let cfg = runs::RunConfig { num_devices: n, mode };
    let run = plugin::xla_run::run(plugin, &module, &bytes, &cfg, &args, &source.flags())?;
    let taken = run.decisions.iter().filter(|x| x.kernel).count();
    if taken > 0 && !run.rewritten {
        return Err(format!("the pass took {taken} collectives but did not rewrite the module"));
    }
    {
        let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
        t.peerless += taken;
        t.xla += run.decisions.len() - taken;
        t.runs += 1;
    }
    let show = || run.decisions.iter().map(|x| format!("\n  {x}")).collect::<String>();
    if source == Source::Fallback && taken > 0 {
        return Err(format!("the fallback configuration put {taken} collectives on Peerless:{}", show()));
    }
    // The async pairs (all-gather-start / all-reduce-start / collective-permute-start) run on
    // Peerless's kernels when forced there.
    if source == Source::Kernel
        && case.name.contains("start_done")
        && (run.decisions.is_empty() || taken < run.decisions.len())
    {
        return Err(format!("an async start/done pair stayed XLA's:{}", show()));
    }
    hlo_tests::compare_results(&run.outputs, &golden, d.tolerance)?;
    let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
    t.matched[Source::ALL.iter().position(|&s| s == source).unwrap_or(0)] += 1;
    Ok(())
}

fn case_trial(plugin: &Arc<PathBuf>, case: Case, n: usize, source: Source, tally: &Arc<Mutex<Tally>>) -> Trial {
    let (plugin, tally) = (plugin.clone(), tally.clone());
    Trial::test(format!("{}::{}::d{n}", source.label(), case.name), move || {
        let d = case.directive.as_ref().map_err(|e| Failed::from(format!("bad directive: {e}")))?;
        let got = run_case(&plugin, &case, d, n, source, &tally);
        match (got, unsupported(&case.name, n)) {
            (Ok(()), None) => Ok(()),
            (Err(e), None) => Err(e.into()),
            (Ok(()), Some((reason, _))) => {
                Err(format!("now passes: remove from the list ({}: {reason})", case.name).into())
            }
            (Err(e), Some((_, fragment))) if e.contains(fragment) => Ok(()),
            (Err(e), Some((reason, fragment))) => {
                Err(format!("listed as unsupported ({reason}) but failed without `{fragment}` in the error:\n{e}")
                    .into())
            }
        }
    })
}

fn clear_errors() -> Result<(), Failed> {
    let e = plugin::xla_run::find_plugin(Some(Path::new("/nonexistent/xla_plugin.so"))).unwrap_err();
    if !e.contains("/nonexistent/xla_plugin.so") {
        return Err(e.into());
    }
    let e = plugin::xla_run::prepare(b"HloModule m\n", runs::Mode::Replica, &[0], "cpu", &[]).unwrap_err();
    if !e.contains("HloModuleProto") {
        return Err(e.into());
    }
    Ok(())
}

fn main() {
    let mut args = Arguments::from_args();
    // XLA's CPU clients are process-wide heavy objects: one trial at a time by default.
    if args.test_threads.is_none() {
        args.test_threads = Some(1);
    }
    let mut trials = vec![Trial::test("text_modules_and_missing_plugins_are_clear_errors", clear_errors)];
    let plugin = match plugin::xla_run::find_plugin(None) {
        Ok(p) => p,
        Err(e) if std::env::var("PEERLESS_SKIP_XLA_PLUGIN").as_deref() == Ok("1") => {
            eprintln!("SKIPPED the golden cases (PEERLESS_SKIP_XLA_PLUGIN=1): {e}");
            libtest_mimic::run(&args, trials).exit();
        }
        Err(e) => {
            let msg = format!("{e}\n(set PEERLESS_SKIP_XLA_PLUGIN=1 to skip this test)");
            trials.push(Trial::test("golden_cases", move || Err(msg.into())));
            libtest_mimic::run(&args, trials).exit();
        }
    };
    if plugin::xla_run::platform_of(&plugin) != "cpu" {
        // The goldens are XLA:CPU's; another plugin is checked by hand (ARCHITECTURE.md).
        eprintln!("note: {} is not XLA's CPU plugin; the goldens' tolerances may not fit", plugin.display());
    }
    let plugin = Arc::new(plugin);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let cases = load_cases().expect("cannot read hlo-tests/cases");
    let n_cases = cases.len();
    let mut listed = 0;
    let mut case_runs = 0;
    for case in cases {
        let devices = match &case.directive {
            Ok(d) => d.devices.clone(),
            Err(_) => vec![0],
        };
        for n in devices {
            case_runs += 1;
            listed += usize::from(unsupported(&case.name, n).is_some());
            for source in Source::ALL {
                if source == Source::Proto && !proto_path(&case.name).exists() {
                    let name = case.name.clone();
                    trials.push(Trial::test(format!("proto::{name}::d{n}"), move || {
                        Err(format!("{} is missing", proto_path(&name).display()).into())
                    }));
                    continue;
                }
                trials.push(case_trial(&plugin, case.clone(), n, source, &tally));
            }
        }
    }
    // A listed entry must name an existing trial.
    for &(c, n, _, _) in UNSUPPORTED {
        let name = match n {
            Some(n) => format!("kernel::{c}::d{n}"),
            None => format!("kernel::{c}::"),
        };
        if !trials.iter().any(|t| t.name().starts_with(&name)) {
            trials.push(Trial::test(format!("unsupported_list::{c}"), move || {
                Err(format!("UNSUPPORTED names {name}, which is no trial: remove it").into())
            }));
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    let t = tally.lock().unwrap_or_else(|e| e.into_inner());
    println!(
        "xla_run: {n_cases} cases, {case_runs} case runs ({listed} listed unsupported) x 3 sources; matched XLA's \
         goldens: {} kernel, {} fallback, {} proto; collectives over {} runs: {} on Peerless, {} left to XLA",
        t.matched[0], t.matched[1], t.matched[2], t.runs, t.peerless, t.xla
    );
    // Over the whole suite (no filter), some collective must have run on Peerless.
    if args.filter.is_none() && args.skip.is_empty() && t.runs > 0 && t.peerless == 0 {
        eprintln!("error: the pass put no collective on Peerless over {} runs", t.runs);
        std::process::exit(101);
    }
    conclusion.exit();
}
