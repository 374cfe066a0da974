//! `plugin::xla_inside`'s entry points: malformed modules, unknown platforms and bad flags
//! are errors (status -1 and a report), never a crash; the handlers learn the job from the
//! process's topology. `plugin::Platform`: names round-trip, and ROCm has handlers exactly in
//! a library built with them.

use plugin::Platform;
use plugin::xla_inside::{pass_config, pass_entry, pass_free, run_pass, set_topology, set_topology_entry};

/// The status and report of `pass_entry` (the C entry) on an empty module.
fn pass_entry_status(platform: &std::ffi::CStr) -> (i32, String) {
    // SAFETY: a NUL-terminated literal and no module; `r` is fresh from `pass_entry`, read
    // while alive and freed once.
    unsafe {
        let r = pass_entry(platform.as_ptr(), std::ptr::null(), 0, std::ptr::null(), std::ptr::null());
        let report = std::slice::from_raw_parts((*r).report, (*r).report_len);
        let out = ((*r).status, String::from_utf8_lossy(report).into_owned());
        pass_free(r);
        out
    }
}

#[test]
fn garbage_is_an_error_not_a_crash() {
    let (status, module, report) = run_pass(Platform::Cpu, &[0x0a, 0xff, 0xff], "", "");
    assert_eq!(status, -1);
    assert!(module.is_none());
    assert!(report.contains("malformed"), "{report}");
    // An unknown platform is refused where its name comes in, the C entry.
    let (status, report) = pass_entry_status(c"tpu");
    assert_eq!(status, -1);
    assert!(report.contains("no handlers for platform 'tpu'"), "{report}");
    assert_eq!(pass_entry_status(c"cpu"), (0, String::new()));
    let (status, _, report) = run_pass(Platform::Cpu, &[], "--bogus=1", "");
    assert_eq!(status, -1);
    assert!(report.contains("bogus"), "{report}");
}

#[test]
fn the_handlers_learn_the_job_from_the_process() {
    use kernels::ffi_handler::CollectiveRuntime;
    // What a cache-loaded executable needs, without any pass: the token, and on CUDA
    // which device id each GPU (CUDA ordinal) has.
    let topo = "this=1;job=0123abcd;devices=0:0,1:0,2:1,3:1;hosts=0:0,1:0;ordinals=2:0,3:1";
    set_topology(Platform::Cuda, topo).unwrap();
    assert_eq!(thunks::runtime::job().as_deref(), Some("0123abcd"));
    let cuda = kernels::cuda::xla::CudaRuntime;
    assert_eq!(cuda.device_id(0).unwrap(), 2);
    assert_eq!(cuda.device_id(1).unwrap(), 3);
    assert!(cuda.device_id(2).unwrap_err().to_string().contains("no device id"));
    assert!(Platform::parse("tpu").unwrap_err().contains("no handlers"));
    assert!(set_topology(Platform::Cpu, "job=xyz").unwrap_err().contains("hex"));
    set_topology(Platform::Cpu, "").unwrap(); // one process: nothing to learn
    // A token set through the entry point reads back; errors come back as status -1.
    // SAFETY: NUL-terminated literals; `r` is fresh from `set_topology_entry`, read while
    // alive and freed once.
    let status = unsafe {
        let r = set_topology_entry(c"cpu".as_ptr(), c"this=0;job=89abcdef;devices=0:0;hosts=0:0".as_ptr());
        let s = (*r).status;
        pass_free(r);
        s
    };
    assert_eq!(status, 0);
    assert_eq!(thunks::runtime::job().as_deref(), Some("89abcdef"));
    // SAFETY: as above.
    let status = unsafe {
        let r = set_topology_entry(c"cpu".as_ptr(), c"colour=red".as_ptr());
        let s = (*r).status;
        pass_free(r);
        s
    };
    assert_eq!(status, -1);
    // SAFETY: as above.
    let (status, report) = unsafe {
        let r = set_topology_entry(c"tpu".as_ptr(), c"".as_ptr());
        let out = (
            (*r).status,
            String::from_utf8_lossy(std::slice::from_raw_parts((*r).report, (*r).report_len)).into_owned(),
        );
        pass_free(r);
        out
    };
    assert_eq!(status, -1);
    assert!(report.contains("no handlers for platform 'tpu'"), "{report}");
}

#[test]
fn names_round_trip_and_an_unknown_one_is_named() {
    for p in Platform::ALL {
        assert_eq!(Platform::parse(p.name()), Ok(p));
        assert_eq!(Platform::ALL[p.index()], p);
    }
    assert_eq!(Platform::parse("tpu").unwrap_err(), "Peerless has no handlers for platform 'tpu'");
    assert!(Platform::parse("CUDA").is_err(), "JAX's names, not XLA's");
    assert_eq!(Platform::Rocm.with_handlers().is_ok(), cfg!(feature = "rocm"));
    assert!(Platform::Cpu.with_handlers().is_ok() && Platform::Cuda.with_handlers().is_ok());
}

#[test]
fn rocm_is_a_platform_exactly_when_built_with_it() {
    // No AMD GPU needed: the pass's configuration opens no GPU (its peer table is lazy).
    let rocm = Platform::parse("rocm").unwrap();
    let handlers = thunks::custom_call::TARGETS.iter().all(|&(_, t)| plugin::xla_handlers::handler(rocm, t).is_some());
    assert_eq!(handlers, cfg!(feature = "rocm"));
    assert_eq!(rocm.xla_name(), "ROCM");
    match pass_config(rocm, "", "") {
        Ok(_) => assert!(handlers, "the pass takes rocm only with its handlers"),
        Err(e) => assert!(!handlers && e.contains("feature `rocm`"), "{e}"),
    }
    assert_eq!(set_topology(rocm, "").is_ok(), cfg!(feature = "rocm"));
    assert_eq!(plugin::wrap::platform_of(std::path::Path::new("/x/xla_rocm7/xla_rocm_plugin.so")), Platform::Rocm);
}
