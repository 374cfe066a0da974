//! Embeds the prebuilt kernel bundle named by `PEERLESS_PREBUILT_KERNELS` (a file made by `peerless kernels build`, see
//! kernels/src/cuda/prebuilt.rs) into the library; without it the embedded bundle is empty and kernels compile on first
//! use.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=PEERLESS_PREBUILT_KERNELS");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("prebuilt_kernels.pb");
    let bundle = match std::env::var_os("PEERLESS_PREBUILT_KERNELS").filter(|p| !p.is_empty()) {
        Some(path) => {
            println!("cargo:rerun-if-changed={}", PathBuf::from(&path).display());
            std::fs::read(&path).unwrap_or_else(|e| panic!("PEERLESS_PREBUILT_KERNELS={}: {e}", path.to_string_lossy()))
        }
        None => Vec::new(),
    };
    std::fs::write(&out, bundle).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}
