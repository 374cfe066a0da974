//! `peerless run --backend xla` in-process: golden cases run by XLA's own CPU plugin with
//! Peerless's pass applied and its handlers registered, compared with XLA's goldens
//! (`hlo-tests/goldens/`). Every case must have had collectives rewritten by the pass.
//!
//! Needs XLA's CPU plugin (`lammps-jax-pjrt-cpu` in `.venv/jax`, which scripts/setup.sh
//! installs, or PEERLESS_XLA_PLUGIN). Without it the test fails, unless
//! PEERLESS_SKIP_XLA_PLUGIN=1 says to skip it.

use hlo_tests::{Mode, golden_path, load_cases, make_args, proto_path, read_golden};

/// Collective cases of both modes: (case, device count).
const CASES: &[(&str, usize)] = &[
    ("all_reduce_sum", 4),
    ("all_reduce_sum", 8),
    ("all_reduce_partition", 4),
    ("all_gather", 4),
    ("all_gather_partition_groups", 8),
    ("all_to_all_array", 4),
    ("reduce_scatter", 4),
    ("reduce_scatter_partition", 8),
    ("collective_permute", 4),
    ("collective_permute_partition", 8),
];

fn run_case(plugin: &std::path::Path, name: &str, n: usize) -> Result<String, String> {
    let cases = load_cases().map_err(|e| e.to_string())?;
    let case = cases.iter().find(|c| c.name == name).ok_or_else(|| format!("no case {name}"))?;
    let d = case.directive.as_ref().map_err(Clone::clone)?;
    let bytes = std::fs::read(proto_path(name)).map_err(|e| e.to_string())?;
    let module = hlo::decode_proto(name, &bytes).map_err(|e| e.to_string())?;
    let golden = read_golden(&golden_path(name, n), n)?;
    let args = make_args(&module.entry_param_shapes(), &golden)?;
    let mode = if d.mode == Mode::Replica { interp::Mode::Replica } else { interp::Mode::Partition };
    let cfg = interp::RunConfig { num_devices: n, mode };
    let run = plugin::xla_run::run(plugin, &module, &bytes, &cfg, &args, &[])?;
    hlo_tests::compare_results(&run.outputs, &golden, d.tolerance)?;
    let taken = run.decisions.iter().filter(|d| d.kernel).count();
    if taken == 0 || !run.rewritten {
        return Err(format!("the pass took no collective: {:#?}", run.decisions));
    }
    Ok(format!("{taken} of {} collectives on Peerless", run.decisions.len()))
}

#[test]
fn golden_cases_on_xla_cpu_with_peerless_collectives() {
    let plugin = match plugin::xla_run::find_plugin(None) {
        Ok(p) => p,
        Err(e) if std::env::var("PEERLESS_SKIP_XLA_PLUGIN").as_deref() == Ok("1") => {
            eprintln!("SKIPPED (PEERLESS_SKIP_XLA_PLUGIN=1): {e}");
            return;
        }
        Err(e) => panic!("{e}\n(set PEERLESS_SKIP_XLA_PLUGIN=1 to skip this test)"),
    };
    if plugin::xla_run::platform_of(&plugin) != "cpu" {
        // The goldens are XLA:CPU's; another plugin is checked by hand (ARCHITECTURE.md).
        eprintln!("note: {} is not XLA's CPU plugin; the goldens' tolerances may not fit", plugin.display());
    }
    let mut failures = Vec::new();
    for &(name, n) in CASES {
        match run_case(&plugin, name, n) {
            Ok(summary) => eprintln!("ok   {name} d{n}: {summary}"),
            Err(e) => {
                eprintln!("FAIL {name} d{n}: {e}");
                failures.push(format!("{name} d{n}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), CASES.len(), failures.join("\n"));
}

#[test]
fn text_modules_and_missing_plugins_are_clear_errors() {
    let e = plugin::xla_run::find_plugin(Some(std::path::Path::new("/nonexistent/xla_plugin.so"))).unwrap_err();
    assert!(e.contains("/nonexistent/xla_plugin.so"), "{e}");
    let e = plugin::xla_run::prepare(b"HloModule m\n", interp::Mode::Replica, &[0], "cpu", &[]).unwrap_err();
    assert!(e.contains("HloModuleProto"), "{e}");
}
