//! CI without a GPU: every kernel unit compiles with NVRTC (PTX for sm_80, the oldest GPU
//! prebuilt code serves), each holds exactly its kernels, and a unit compiles to CUBIN on its
//! own (what a GPU without prebuilt code does at its first collective; the time is printed,
//! not asserted: docs/PERFORMANCE.md has measured figures).
//!
//! libnvrtc comes from `PEERLESS_NVRTC_LIB` or the `nvidia-cuda-nvrtc-cu12` wheel under any
//! site-packages that `ffi::libs` searches (`python3`'s on PATH, `PYTHONPATH`, ...).
//! `scripts/setup.sh` installs the wheel into its JAX venv (`.venv/jax`,
//! plugin/requirements.txt) and `scripts/test.sh` sets `PEERLESS_NVRTC_LIB` to its libnvrtc, so
//! no system-wide Python package is needed. With `CI=true` a missing NVRTC fails this test;
//! elsewhere it is skipped with a loud message.
//!
//! `PEERLESS_TEST_BUNDLE_OUT=FILE` keeps the compute_80 bundle the all-units test builds:
//! `scripts/test.sh` bundles it into the wheel it checks instead of compiling every unit again.
#![cfg(feature = "cuda")]

use kernels::cuda::prebuilt::{self, Target};
use kernels::gpu::{Dtype, Kernel, Red, Unit};

fn nvrtc() -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    match ffi::nvrtc::version() {
        Ok(v) => {
            eprintln!(
                "NVRTC {}.{} from {}",
                v.0,
                v.1,
                ffi::libs::nvrtc().map(|l| l.path.display().to_string()).unwrap_or_default()
            );
            true
        }
        Err(e) if !ci => {
            eprintln!(
                "\n*** SKIPPED: NVRTC not found ({e}).\n*** scripts/setup.sh, then PEERLESS_NVRTC_LIB=.venv/jax/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12\n"
            );
            false
        }
        Err(e) => panic!("CI=true but NVRTC is unavailable: {e}"),
    }
}

#[test]
fn every_kernel_unit_compiles_and_holds_its_kernels() {
    if !nvrtc() {
        return;
    }
    let jobs = std::thread::available_parallelism().map_or(1, usize::from);
    let target = Target::parse("compute_80").unwrap();
    let bundle = prebuilt::build(&[target], jobs, |_, _| {}).unwrap_or_else(|e| panic!("{e}"));
    if let Some(out) = std::env::var_os("PEERLESS_TEST_BUNDLE_OUT") {
        use prost::Message;
        std::fs::write(&out, bundle.encode_to_vec()).unwrap_or_else(|e| panic!("{}: {e}", out.to_string_lossy()));
    }
    let all = Unit::all();
    assert_eq!(bundle.blobs.len(), all.len());
    let every_kernel: Vec<String> = all.iter().flat_map(|u| u.kernels()).collect();
    for (u, blob) in all.iter().zip(&bundle.blobs) {
        assert_eq!(
            (blob.unit.as_str(), blob.key.as_str(), blob.target.as_str()),
            (&*u.name(), &*u.key(), "compute_80")
        );
        let code = blob.code().unwrap();
        let text = String::from_utf8_lossy(&code);
        let entries: Vec<&String> = every_kernel.iter().filter(|k| text.contains(&format!(".entry {k}("))).collect();
        assert_eq!(entries, u.kernels().iter().collect::<Vec<_>>(), "{}", u.name());
        if matches!(u, Unit::Spec(Kernel::OneShotNorm | Kernel::LamportNorm, ..)) {
            epilogue_rounds_as_written(u, &text);
        }
        if matches!(u, Unit::Spec(Kernel::Lamport | Kernel::LamportNorm, ..)) {
            // No flags: the data is the signal, polled with loads no cache serves.
            assert!(text.contains("ld.volatile.global.v4.u32"), "{}: no volatile 16-byte poll", u.name());
            continue;
        }
        if matches!(u, Unit::Spec(Kernel::ReduceLocal, ..)) {
            // The copy engines' stream memory operations order it: a local fold with no flags.
            assert!(!text.contains("st.release.sys"), "{}: a flag store in the local fold", u.name());
            continue;
        }
        // System-scope release/acquire flags in every other unit (the probe's and the barriers').
        assert!(text.contains("st.release.sys"), "{}: no system-scope release store", u.name());
        assert!(text.contains("ld.acquire.sys"), "{}: no system-scope acquire load", u.name());
    }
    // 16-byte vector accesses in the one-shot.
    let one_shot = Unit::Spec(Kernel::OneShot, Dtype::F32, Red::Sum);
    let i = all.iter().position(|u| *u == one_shot).unwrap();
    assert!(String::from_utf8_lossy(&bundle.blobs[i].code().unwrap()).contains(".v4.u32"));
}

#[test]
fn a_unit_compiles_to_cubin_alone() {
    if !nvrtc() {
        return;
    }
    let target = Target::parse("sm_90").unwrap();
    for unit in [Unit::Base, Unit::Spec(Kernel::TwoShot, Dtype::Bf16, Red::Sum)] {
        // The first compile in a process also loads NVRTC's builtins; time the second.
        prebuilt::compile(unit, target).unwrap();
        let started = std::time::Instant::now();
        let cubin = prebuilt::compile(unit, target).unwrap_or_else(|e| panic!("{e}"));
        let s = started.elapsed().as_secs_f64();
        eprintln!("{} for sm_90: {} bytes in {s:.2} s", unit.name(), cubin.len());
        assert!(cubin.starts_with(b"\x7fELF"), "not an ELF cubin");
    }
}

/// The fused norm's f32 operations are single IEEE operations (kernels::epilogue's order):
/// correctly rounded square root and division, and no multiply contracted into an add.
fn epilogue_rounds_as_written(u: &Unit, ptx: &str) {
    for op in ["sqrt.rn.f32", "div.rn.f32", "mul.rn.f32", "add.rn.f32"] {
        assert!(ptx.contains(op), "{}: no {op}", u.name());
    }
    assert!(!ptx.contains("fma.rn.f32"), "{}: an f32 FMA", u.name());
    assert!(!ptx.contains(".ftz.f32"), "{}: flushes subnormals", u.name());
}
