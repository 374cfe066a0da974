//! The collective pass registered from Rust through XLA's XlaTransform extension (what the
//! wrapper's `PJRT_Client_Create` does for clients without the Python package): XLA's own
//! CPU plugin compiles a module whose all-reduce was left to XLA beforehand, XLA runs the
//! registered pass in its pipeline, and Peerless's handlers run the all-reduce. Checked
//! against XLA's golden, with the handlers' call count.
//!
//! Needs XLA's CPU plugin (`lammps-jax-pjrt-cpu` in `.venv/jax`, or PEERLESS_XLA_PLUGIN); fails
//! without it unless PEERLESS_SKIP_XLA_PLUGIN=1. One process: the registration is
//! process-global inside the plugin.

use std::path::Path;

use hlo_tests::{golden_path, make_args, proto_path, read_golden};
use plugin::Platform;

#[test]
fn xla_runs_the_registered_pass_and_peerless_takes_the_all_reduce() {
    let path = match tools::xla_run::find_plugin(None) {
        Ok(p) => p,
        Err(e) if std::env::var("PEERLESS_SKIP_XLA_PLUGIN").as_deref() == Ok("1") => {
            eprintln!("SKIPPED (PEERLESS_SKIP_XLA_PLUGIN=1): {e}");
            return;
        }
        Err(e) => panic!("{e}\n(set PEERLESS_SKIP_XLA_PLUGIN=1 to skip this test)"),
    };
    assert_eq!(tools::xla_run::platform_of(&path), Platform::Cpu, "{}: the goldens are XLA:CPU's", path.display());
    let inner = tools::xla_run::plugin(&path, Platform::Cpu).expect("load XLA's CPU plugin");
    let has_transform =
        inner.extensions().iter().any(|&(ty, size)| ty == ffi::pjrt::EXTENSION_XLA_TRANSFORM && size >= 40);
    assert!(has_transform, "{} has no XlaTransform extension", path.display());
    assert_eq!(plugin::xla_inside::register_pass_in(inner, Platform::Cpu), Ok(true));
    // Once per process: a second registration is a no-op.
    assert_eq!(plugin::xla_inside::register_pass_in(inner, Platform::Cpu), Ok(false));
    assert!(plugin::xla_inside::register_pass_in(inner, Platform::Rocm).is_ok(), "already registered: no-op");

    let case = "all_reduce_sum";
    let n = 4;
    let bytes = std::fs::read(proto_path(case)).expect("golden module");
    let module = hlo::decode_proto(case, &bytes).expect("decode");
    let golden = read_golden(&golden_path(case, n), n).expect("golden");
    let args = make_args(&module.entry_param_shapes(), &golden).expect("args");
    let cfg = runs::RunConfig { num_devices: n, mode: runs::Mode::Replica };
    let before = plugin::xla_handlers::handler_calls(Platform::Cpu);
    // The CLI's own pass (applied before XLA sees the module) is told to leave the
    // all-reduce to XLA, so only the registered pass inside XLA's pipeline can take it.
    let flags = vec!["--all_reduce_backend=fallback".to_string()];
    let run = tools::xla_run::run(Path::new(&path), &module, &bytes, &cfg, &args, &flags, &[]).expect("run");
    assert!(!run.rewritten, "the CLI's pass was told to leave the module alone");
    let collectives = run.decisions.len();
    assert!(collectives > 0 && run.decisions.iter().all(|d| !d.kernel), "{:?}", run.decisions);
    let calls = plugin::xla_handlers::handler_calls(Platform::Cpu) - before;
    assert_eq!(
        calls,
        (collectives * n) as u64,
        "every device's all-reduces ran on Peerless's handlers (XLA ran the registered pass)"
    );
    hlo_tests::compare_results(&run.outputs, &golden, hlo_tests::Tolerance::Default).expect("equal to XLA's golden");
}
