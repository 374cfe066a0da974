//! Unit tests of `plugin::xla_inside` (included by path from src/xla_inside.rs); its entry
//! points through the public API are tested in tests/xla_inside.rs.

use super::*;

#[test]
fn the_kind_travels_beside_the_topology() {
    assert_eq!(split_kind(""), (None, String::new()));
    assert_eq!(split_kind("kind=NVIDIA H200"), (Some("NVIDIA H200"), String::new()));
    let topo = "this=0;job=;devices=0:0;hosts=0:0";
    assert_eq!(split_kind(topo), (None, topo.to_owned()), "a string without a kind is as it was");
    assert_eq!(split_kind(&format!("{topo};kind=NVIDIA H200")), (Some("NVIDIA H200"), topo.to_owned()));
    assert_eq!(split_kind("kind=;this=1"), (None, "this=1".to_owned()), "an empty kind is none");
}

/// The tuning profile is looked up by the kind the process was handed (here as the Python
/// package hands it, through `set_topology` and the pass's topology string), a plain value
/// in the pass's configuration: configuring the pass, resolving its tuning and running it on
/// a module whose collectives need no peer access never reach the GPU runtime.
#[test]
fn the_tuning_profile_follows_the_handed_over_kind_and_opens_no_gpu() {
    use emitter::tuning::ProfileSource;
    let opened = || crate::xla_handlers::GPU_RUNTIME_CALLS.with(std::cell::Cell::get);
    let before = opened();
    let cuda = |local: &str| pass_config_tuned(Platform::Cuda, "", local, ProfileSource::Default).unwrap();
    let profile_kind = |cfg: &PassConfig| cfg.tuning.resolve(4).profile.map(|p| p.key.device_kind.clone());
    // XLA:CPU's kind is fixed; a GPU's is unknown until handed over (no other test of this
    // binary hands one over for CUDA).
    assert_eq!(device_kind(Platform::Cpu).as_deref(), Some("cpu"));
    let cfg = cuda("");
    assert_eq!(cfg.tuning.device_kind, None);
    let _ = cfg.tuning.resolve(4);
    // Handed over alone (one process), as `set_topology` gets it.
    set_topology(Platform::Cuda, "kind=NVIDIA H200").unwrap();
    let cfg = cuda("");
    assert_eq!(cfg.tuning.device_kind.as_deref(), Some("NVIDIA H200"));
    assert_eq!(profile_kind(&cfg).as_deref(), Some("NVIDIA H200"), "the Hopper profile (shipped or cached)");
    // Beside the job's topology, in the string each compile gets.
    let cfg = cuda("this=0;job=;devices=0:0,1:0,2:0,3:0;hosts=0:0;kind=NVIDIA A100-SXM4-80GB");
    assert_eq!(cfg.local_devices, Some((0..4).collect()));
    assert_eq!(cfg.tuning.device_kind.as_deref(), Some("NVIDIA A100-SXM4-80GB"));
    assert_ne!(profile_kind(&cfg).as_deref(), Some("NVIDIA H200"), "a profile of another kind is never used");
    // The whole pass on CUDA: its tuning resolved, its one collective (a group of one)
    // decided without peer access.
    let module = include_bytes!("../../../emitter/tests/xla_pass/psum_one_device.pb");
    let (status, _, report) = run_pass(Platform::Cuda, module, "", "");
    assert!(status >= 0 && report.lines().count() == 1, "{status}: {report}");
    assert_eq!(opened(), before, "nothing here opens a GPU");
}

#[test]
fn results_free_cleanly() {
    let r = result(1, Some(vec![1, 2, 3]), "x\n".into());
    // SAFETY: `r` is fresh from `result` and freed once.
    unsafe { pass_free(r) };
    // SAFETY: null is allowed.
    unsafe { pass_free(std::ptr::null_mut()) };
}
