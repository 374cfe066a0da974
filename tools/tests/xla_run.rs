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
//! Every case runs: entries with nested tuple results or tuple parameters are flattened for
//! XLA:CPU's PJRT client (`xla_run`'s `flatten`; `flattened_tuple_parameter_and_nested_result`
//! runs a tuple parameter, which no case has, end to end), f8 and s4 arrays cross as XLA:CPU
//! holds them, JAX's Shardy-form dumps compile with `use_shardy_partitioner` and JAX's
//! modules with output sharding propagation. A case this XLA:CPU miscompiles runs with the
//! XLA option that avoids the bug ([`xla_workaround`]: `select_clamp`), and an `xla_bug::`
//! trial checks that the bug is still there without it. Cases the backend cannot run would
//! be listed in [`UNSUPPORTED`] (empty now) with the reason and a fragment of the error they
//! must fail with; any other failure fails the test, and a listed case that passes fails with
//! "now passes: remove from the list". Over all trials, the collectives the pass put on
//! Peerless vs left to XLA are tallied and printed; the total on Peerless must be > 0.
//!
//! Needs XLA's CPU plugin (`lammps-jax-pjrt-cpu` in `.venv/jax`, which scripts/setup.sh
//! installs, or PEERLESS_XLA_PLUGIN), loaded once per process. Without it the test fails,
//! unless PEERLESS_SKIP_XLA_PLUGIN=1 says to skip it (CI never sets it).
//!
//! `cargo test -p peerless-tools --test xla_run [-- FILTER]`. Trials run one at a time
//! unless `--test-threads` says otherwise (each builds its own XLA client).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hlo_tests::{Case, Directive, Mode, golden_path, load_cases, make_args, proto_path, read_golden};
use libtest_mimic::{Arguments, Failed, Trial};

/// Cases the xla backend cannot run: (case, device count or `None` for all, reason, a
/// fragment of the error they must fail with). None at present.
const UNSUPPORTED: &[(&str, Option<usize>, &str, &str)] = &[];

/// XLA options (`env_option_overrides`) a case needs to get past a bug of this XLA:CPU, and a
/// fragment of the error it fails with without them ([`xla_bug_still_there`] checks that it
/// still does).
fn xla_workaround(case: &str) -> Option<(&'static [(&'static str, &'static str)], &'static str)> {
    match case {
        // XLA:CPU bug (lammps-jax-pjrt-cpu / jaxlib 0.11.2; XLA's goldens, from jaxlib 0.10.2,
        // were made without it): `clamp` with scalar (rank-0) bounds, which the
        // `fusion-wrapper` pass puts in a fusion of its own, fails in the tiled fusion
        // emitter: "'xtile.extract' op full tile shape size: 2 does not match rank of
        // buffer: 0" (no upstream issue found). Without that pass the clamp is emitted by the
        // elemental emitter and matches the goldens.
        "select_clamp" => Some((&[("xla_disable_hlo_passes", "fusion-wrapper")], "xtile.extract")),
        _ => None,
    }
}

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
    let options = xla_workaround(&case.name).map_or(&[][..], |(o, _)| o);
    let run = tools::xla_run::run(plugin, &module, &bytes, &cfg, &args, &source.flags(), options)?;
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

/// A workaround's XLA bug is still there: the case without its options fails with the bug's
/// error (once it does not, the workaround goes).
fn xla_bug_still_there(plugin: &Path, case: &Case, n: usize) -> Result<(), Failed> {
    let Some((_, fragment)) = xla_workaround(&case.name) else { return Ok(()) };
    let d = case.directive.as_ref().map_err(|e| Failed::from(format!("bad directive: {e}")))?;
    let module = hlo::parse_text(&case.name, &case.text).map_err(|e| format!("parse: {e}"))?;
    let bytes = hlo::encode_proto(&module).map_err(|e| format!("encode_proto: {e}"))?;
    let golden = read_golden(&golden_path(&case.name, n), n)?;
    let args = make_args(&module.entry_param_shapes(), &golden)?;
    let mode = if d.mode == Mode::Replica { runs::Mode::Replica } else { runs::Mode::Partition };
    let cfg = runs::RunConfig { num_devices: n, mode };
    match tools::xla_run::run(plugin, &module, &bytes, &cfg, &args, &[], &[]) {
        Err(e) if e.contains(fragment) => Ok(()),
        Err(e) => Err(format!("{}: expected XLA's `{fragment}` bug, got: {e}", case.name).into()),
        Ok(_) => Err(format!("{} runs without its XLA workaround now: remove it", case.name).into()),
    }
}

/// A tuple parameter and a nested tuple result (no hlo-tests case has a tuple parameter),
/// with an all-reduce forced onto Peerless: XLA:CPU's PJRT client takes neither, so the
/// entry is flattened, the tuple argument passed as its leaves and the results nested back.
fn tuple_interface(plugin: &Path) -> Result<(), Failed> {
    const TEXT: &str = "HloModule tuple_io

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY main {
  a = f32[2] parameter(0)
  t = (s32[3], (pred[2], f32[])) parameter(1)
  t0 = s32[3] get-tuple-element(t), index=0
  t1 = (pred[2], f32[]) get-tuple-element(t), index=1
  t10 = pred[2] get-tuple-element(t1), index=0
  t11 = f32[] get-tuple-element(t1), index=1
  b = f32[2] broadcast(t11), dimensions={}
  s = f32[2] add(a, b)
  ar = f32[2] all-reduce(s), replica_groups={}, to_apply=add
  inner = (s32[3], pred[2]) tuple(t0, t10)
  one = (f32[]) tuple(t11)
  ROOT r = (f32[2], (s32[3], pred[2]), (f32[])) tuple(ar, inner, one)
}
";
    use hlo::{Array, ArrayShape, Literal, PrimitiveType};
    let module = hlo::parse_text("tuple_io.hlo", TEXT).map_err(|e| format!("parse: {e}"))?;
    let bytes = hlo::encode_proto(&module).map_err(|e| format!("encode_proto: {e}"))?;
    let f32s = |v: &[f32]| Literal::Array(Array::from_slice(vec![v.len() as i64], v));
    let f32_0 = || Literal::Array(Array::from_slice(Vec::new(), &[0.5f32]));
    let s32s = |d: i32| Literal::Array(Array::from_slice(vec![3], &[d, -d, 7]));
    let preds = |d: u8| {
        Literal::Array(Array::new(ArrayShape::new(PrimitiveType::Pred, vec![2]), vec![d, 1 - d]).expect("pred[2]"))
    };
    let args: Vec<Vec<Literal>> = [0u8, 1]
        .iter()
        .map(|&d| {
            let a = f32s(&[f32::from(d), f32::from(2 * d + 1)]);
            vec![a, Literal::Tuple(vec![s32s(i32::from(d)), Literal::Tuple(vec![preds(d), f32_0()])])]
        })
        .collect();
    let cfg = runs::RunConfig { num_devices: 2, mode: runs::Mode::Replica };
    let flags = Source::Kernel.flags();
    let run = tools::xla_run::run(plugin, &module, &bytes, &cfg, &args, &flags, &[])?;
    if !(run.rewritten && run.decisions.len() == 1 && run.decisions[0].kernel) {
        return Err(format!("the all-reduce is not on Peerless: {:?}", run.decisions).into());
    }
    for (d, got) in run.outputs.iter().enumerate() {
        let di = d as u8;
        let want = Literal::Tuple(vec![
            f32s(&[2.0, 5.0]),
            Literal::Tuple(vec![s32s(i32::from(di)), preds(di)]),
            Literal::Tuple(vec![f32_0()]),
        ]);
        if *got != want {
            return Err(format!("device {d}: got {got:?}, want {want:?}").into());
        }
    }
    Ok(())
}

fn clear_errors() -> Result<(), Failed> {
    let e = tools::xla_run::find_plugin(Some(Path::new("/nonexistent/xla_plugin.so"))).unwrap_err();
    if !e.contains("/nonexistent/xla_plugin.so") {
        return Err(e.into());
    }
    let e =
        tools::xla_run::prepare(b"HloModule m\n", runs::Mode::Replica, &[0], plugin::Platform::Cpu, &[]).unwrap_err();
    if !e.contains("HloModuleProto") {
        return Err(e.into());
    }
    Ok(())
}

fn buffer_types() -> Result<(), Failed> {
    use hlo::PrimitiveType as T;
    use tools::xla_run::buffer_type;
    let got: Vec<u32> = [T::F8E5M2, T::F8E4M3FN, T::F8E4M3B11FNUZ, T::F8E5M2FNUZ, T::F8E4M3FNUZ, T::S4, T::U4]
        .into_iter()
        .map(|t| buffer_type(t).expect("mapped"))
        .collect();
    assert_eq!(got, (16..=22).collect::<Vec<u32>>(), "PJRT_Buffer_Type's order after C128");
    assert_eq!([T::F8E4M3, T::F8E3M4, T::F8E8M0FNU].map(|t| buffer_type(t).ok()), [Some(26), Some(27), Some(28)]);
    assert!(buffer_type(T::Token).is_err());
    Ok(())
}

/// A case's module, parsed and encoded.
fn case_module(name: &str) -> (hlo::Module, Vec<u8>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hlo-tests/cases").join(format!("{name}.hlo"));
    let text = std::fs::read_to_string(&path).expect("case");
    let m = hlo::parse_text(name, &text).expect("parse");
    let bytes = hlo::encode_proto(&m).expect("encode");
    (m, bytes)
}

fn jax_forms() -> Result<(), Failed> {
    use tools::xla_run::{module_compile_options, uses_shardy};
    let ids = [0, 1, 2, 3];
    let build = |name: &str, mode: runs::Mode| {
        let (m, bytes) = case_module(name);
        let o = module_compile_options(&m, &bytes, mode, &ids).expect("options");
        let eb = o.executable_build_options.expect("build options");
        (eb.use_shardy_partitioner, eb.allow_spmd_sharding_propagation_to_output)
    };
    assert_eq!(build("jax_psum_x4", runs::Mode::Partition), (true, vec![true]), "Shardy form");
    assert_eq!(build("jax_gspmd_psum_x4", runs::Mode::Partition), (false, vec![true]), "GSPMD form: no Shardy");
    assert_eq!(build("all_reduce_sum", runs::Mode::Replica), (false, vec![]), "hand-written: as gen_goldens.py");
    let (m, _) = case_module("jax_psum_x4");
    assert!(uses_shardy(&m));
    assert!(!uses_shardy(&case_module("jax_gspmd_psum_x4").0));
    Ok(())
}

fn main() {
    let mut args = Arguments::from_args();
    // XLA's CPU clients are process-wide heavy objects: one trial at a time by default.
    if args.test_threads.is_none() {
        args.test_threads = Some(1);
    }
    let mut trials = vec![
        Trial::test("text_modules_and_missing_plugins_are_clear_errors", clear_errors),
        Trial::test("every_f8_and_4_bit_type_has_its_pjrt_buffer_type", buffer_types),
        Trial::test("jax_forms_compile_as_jax_compiles_them", jax_forms),
    ];
    let plugin = match tools::xla_run::find_plugin(None) {
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
    if tools::xla_run::platform_of(&plugin) != plugin::Platform::Cpu {
        // The goldens are XLA:CPU's; another plugin is checked by hand (ARCHITECTURE.md).
        eprintln!("note: {} is not XLA's CPU plugin; the goldens' tolerances may not fit", plugin.display());
    }
    let plugin = Arc::new(plugin);
    {
        let plugin = plugin.clone();
        trials.push(Trial::test("flattened_tuple_parameter_and_nested_result", move || tuple_interface(&plugin)));
    }
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
            if xla_workaround(&case.name).is_some() {
                let (plugin, case) = (plugin.clone(), case.clone());
                trials.push(Trial::test(format!("xla_bug::{}::d{n}", case.name), move || {
                    xla_bug_still_there(&plugin, &case, n)
                }));
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
