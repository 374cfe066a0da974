//! The C ABI under misuse: compiles `tests/c_abi/misuse.c` with the system C compiler (`cc`,
//! or `$CC`) against the PJRT header that `pjrt-sys` ships, and runs it on the built
//! `libpeerless_pjrt.so`. The C program uses only `dlopen` + `GetPjrtApi` + the function
//! table, and checks that null pointers, undersized structs, unknown program formats,
//! wrong Execute arguments, use after delete and odd destruction orders all come back as
//! `PJRT_Error`s, and that a panic forced inside an entry point (`PEERLESS_TEST_PANIC`)
//! becomes INTERNAL. A crash (signal) fails this test.

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

fn program() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hlo-tests/goldens/collective_permute_start_done.pb")
}

#[test]
fn c_program_misuses_the_function_table_and_gets_errors() {
    let bin = build_c("misuse");
    let out = Command::new(&bin)
        .arg(library())
        .arg(program())
        .env("PEERLESS_TEST_PANIC", "plugin_attributes")
        .env_remove("PEERLESS_FLAGS")
        .env_remove("PEERLESS_NUM_DEVICES")
        .output()
        .expect("run the C harness");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "C harness failed ({:?}):\n{stdout}\n{stderr}", out.status);
    let checks: usize = stdout
        .trim()
        .strip_prefix("misuse: ")
        .and_then(|s| s.strip_suffix(" checks passed"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output: {stdout}"));
    assert!(checks > 300, "only {checks} checks ran");
    eprintln!("{stdout}");
}
