//! The C ABI where no XLA plugin can be wrapped: compiles `tests/c_abi/no_plugin.c` with the
//! system C compiler (`cc`, or `$CC`) against the PJRT header that `pjrt-sys` ships, and runs
//! it on the built `libpeerless_pjrt.so`. The C program uses only `dlopen` + `GetPjrtApi` +
//! the function table, and checks that the table is whole (no null slot), that plugin
//! initialisation succeeds, and that client creation and every other entry point (null and
//! undersized args included) return a FAILED_PRECONDITION `PJRT_Error` saying what to install
//! (nothing named), or that the standalone platform was retired (`PEERLESS_XLA_PLUGIN=
//! standalone`), or why the named plugin cannot be loaded. A crash (signal) fails this test.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `include/` directory of the `pjrt-sys` crate this workspace builds against, from
/// `cargo metadata` for the target this test was built for (build.rs hands it over): the
/// filter keeps cargo to the packages that build fetched, so `--offline` holds on a machine
/// that has built nothing else (unfiltered, cargo wants every platform's packages).
fn pjrt_include() -> PathBuf {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", env!("PEERLESS_TARGET")])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let manifests: Vec<&str> = meta["packages"]
        .as_array()
        .expect("cargo metadata lists packages")
        .iter()
        .filter(|p| p["name"] == "pjrt-sys")
        .filter_map(|p| p["manifest_path"].as_str())
        .collect();
    let [manifest] = manifests[..] else {
        panic!("expected one pjrt-sys package in cargo metadata, got {manifests:?}")
    };
    let include = Path::new(manifest).parent().expect("crate dir").join("include");
    assert!(include.join("xla/pjrt/c/pjrt_c_api.h").is_file(), "no PJRT header under {}", include.display());
    include
}

/// The cdylib cargo built next to this test binary.
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    [deps.to_path_buf(), deps.parent().expect("profile dir").to_path_buf()]
        .iter()
        .map(|d| d.join("libpeerless_pjrt.so"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("libpeerless_pjrt.so not found near {}", exe.display()))
}

/// Compiles `tests/c_abi/<name>.c` into an executable and returns its path.
pub fn build_c(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c_abi").join(format!("{name}.c"));
    let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c_abi_{name}"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers", "-I"])
        .arg(pjrt_include())
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .arg("-ldl")
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(out.status.success(), "{cc} {}: {}", src.display(), String::from_utf8_lossy(&out.stderr));
    bin
}

/// Runs the C harness on the library with `env` set (`None`: removed); every error must
/// contain `needle`.
fn run_harness(env: &[(&str, Option<&str>)], needle: &str) {
    // Built once: the tests run in parallel, and one rewriting the binary while another
    // starts it fails with "text file busy".
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let bin = BIN.get_or_init(|| build_c("no_plugin"));
    let mut cmd = Command::new(bin);
    cmd.arg(library()).arg(needle);
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.output().expect("run the C harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "C harness failed ({:?}):\n{stdout}\n{stderr}", out.status);
    let checks: usize = stdout
        .trim()
        .strip_prefix("no_plugin: ")
        .and_then(|s| s.strip_suffix(" checks passed"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output: {stdout}"));
    assert!(checks > 100, "only {checks} checks ran");
}

#[test]
fn without_an_xla_plugin_every_entry_point_says_what_to_install() {
    // The library built by cargo lies in no jax_plugins/peerless/, so nothing is found.
    run_harness(&[("PEERLESS_XLA_PLUGIN", None)], "lammps-jax-pjrt-cpu");
}

#[test]
fn the_standalone_platform_is_retired() {
    run_harness(&[("PEERLESS_XLA_PLUGIN", Some("standalone"))], "standalone platform was retired");
}

#[test]
fn a_plugin_that_cannot_be_loaded_is_named() {
    run_harness(&[("PEERLESS_XLA_PLUGIN", Some("/nonexistent/xla_plugin.so"))], "/nonexistent/xla_plugin.so");
}
