//! CI without an AMD GPU: every kernel source compiles with hipRTC (the path the ROCm device
//! layer takes at run time) into a code object for gfx90a that defines every kernel.
//!
//! hipRTC comes from `PEERLESS_HIPRTC_LIB`, `libhiprtc.so*` under `ROCM_PATH` / `/opt/rocm`,
//! or the HIP runtime itself (Debian bookworm's `libamdhip64-dev`, ROCm 5.2, which
//! `scripts/setup.sh` installs). With `CI=true` a missing hipRTC fails these tests; elsewhere
//! they are skipped with a loud message.
#![cfg(feature = "rocm")]

use kernels::rocm::SOURCES;

/// Every kernel source that is a translation unit (not headers), compiled by hipRTC for `arch`
/// with warnings as errors. The device layer compiles one unit at a time, without `-Werror`.
fn compile_sources(arch: &str) -> Result<Vec<(String, Vec<u8>)>, ffi::Error> {
    let (units, headers) = kernels::gpu::translation_units();
    let compile = |(name, src): (&str, String)| {
        Ok((name.to_string(), ffi::hiprtc::compile_with(name, &src, &headers, arch, &["-Werror"])?))
    };
    units.into_iter().map(compile).collect()
}

fn hiprtc_or_skip() -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    match ffi::hiprtc::version() {
        Ok((a, b)) => {
            let from = ffi::libs::hiprtc().map(|l| l.path.display().to_string()).unwrap_or_default();
            eprintln!("hipRTC {a}.{b} from {from}");
            true
        }
        Err(e) if !ci => {
            eprintln!(
                "\n*** SKIPPED: hipRTC not found ({e}).\n*** apt-get install libamdhip64-dev (scripts/setup.sh), or set \
                 PEERLESS_HIPRTC_LIB / ROCM_PATH.\n"
            );
            false
        }
        Err(e) => panic!("CI=true but hipRTC is unavailable: {e}"),
    }
}

/// Kernel names written literally after `PL_GLOBAL` in the sources (macro-built names are
/// checked by the fixed list below).
fn literal_kernels(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in text.split("PL_GLOBAL void").skip(1) {
        let mut rest = part.trim_start();
        if let Some(after) = rest.strip_prefix("__launch_bounds__(") {
            rest = after.split_once(')').map(|(_, r)| r.trim_start()).unwrap_or("");
        }
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let tail = &rest[name.len()..];
        if name.starts_with("pl_") && !tail.starts_with("##") {
            out.push(name);
        }
    }
    out
}

#[test]
fn every_kernel_source_compiles_for_gfx90a() {
    if !hiprtc_or_skip() {
        return;
    }
    let units: Vec<&(&str, &str)> = SOURCES.iter().filter(|s| s.0.ends_with(".cu")).collect();
    assert!(!units.is_empty());
    let out = compile_sources("gfx90a").unwrap_or_else(|e| panic!("gfx90a: {e}"));
    assert_eq!(out.len(), units.len());
    for ((name, code), (_, text)) in out.iter().zip(&units) {
        let elf = code.starts_with(b"\x7fELF");
        let bundle = code.starts_with(b"__CLANG_OFFLOAD_BUNDLE__");
        assert!(elf || bundle, "{name}: hipRTC output is neither an ELF code object nor an offload bundle");
        let has = |k: &str| code.windows(k.len() + 1).any(|w| &w[..k.len()] == k.as_bytes() && w[k.len()] == 0);
        let mut kernels = literal_kernels(text);
        if *name == "collectives.cu" {
            kernels.extend(
                ["pl_one_shot_f32_sum", "pl_two_shot_bf16_sum", "pl_one_shot_f16_max", "pl_one_shot_pred_or"]
                    .map(String::from),
            );
            assert!(kernels.iter().any(|k| k == "pl_probe") && kernels.iter().any(|k| k == "pl_all_gather"));
        }
        for k in &kernels {
            // Every kernel has a symbol and a kernel descriptor (`name.kd`) in the code object.
            assert!(has(k) && has(&format!("{k}.kd")), "{name} for gfx90a lacks kernel {k}");
        }
        eprintln!("{name}: {} bytes for gfx90a, {} kernels checked", code.len(), kernels.len());
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_with_the_log() {
    if !hiprtc_or_skip() {
        return;
    }
    let src = "#include \"peerless_device.h\"\nPL_GLOBAL void pl_bad(u32* p) { *p = undefined_name; }\n";
    let (_, headers) = kernels::gpu::translation_units();
    match ffi::hiprtc::compile("bad.cu", src, &headers, "gfx90a") {
        Err(e @ ffi::Error::HipCompile { .. }) => {
            let text = e.to_string();
            assert!(text.contains("bad.cu") && text.contains("gfx90a") && text.contains("undefined_name"), "{text}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

/// The check above runs with warnings as errors (what `hipcc -Werror` in scripts/hip_check.sh
/// adds); the run-time path does not.
#[test]
fn a_warning_fails_the_check_and_not_the_run_time_compile() {
    if !hiprtc_or_skip() {
        return;
    }
    let src = "#include \"peerless_device.h\"\n#warning \"peerless warns here\"\nPL_GLOBAL void pl_warn(u32* p) { *p = 1; }\n";
    let (_, headers) = kernels::gpu::translation_units();
    ffi::hiprtc::compile("warn.cu", src, &headers, "gfx90a").unwrap_or_else(|e| panic!("without -Werror: {e}"));
    match ffi::hiprtc::compile_with("warn.cu", src, &headers, "gfx90a", &["-Werror"]) {
        Err(e @ ffi::Error::HipCompile { .. }) => assert!(e.to_string().contains("peerless warns here"), "{e}"),
        other => panic!("expected -Werror to fail the compile, got {other:?}"),
    }
}
