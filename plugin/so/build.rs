//! Hands the target triple to the tests: `tests/c_abi.rs` finds the `pjrt-sys` crate with `cargo metadata
//! --filter-platform <this triple>`, which resolves only the packages a build for this target fetched (plain `cargo
//! metadata` wants every platform's, e.g. Windows-only crates that a fresh machine never downloaded).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").expect("cargo sets TARGET for build scripts");
    println!("cargo:rustc-env=PEERLESS_TARGET={target}");
}
