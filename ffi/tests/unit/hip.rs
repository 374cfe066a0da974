//! Unit tests of `ffi::hip` (included by path from src/hip.rs).

use super::*;

#[test]
fn ipc_handle_is_the_c_layout() {
    // `hipIpcMemHandle_t` is `struct { char reserved[64]; }`: passed by value, its size
    // and alignment decide the call's ABI.
    assert_eq!(std::mem::size_of::<IpcMemHandle>(), 64);
    assert_eq!(std::mem::align_of::<IpcMemHandle>(), 1);
}

#[test]
fn every_entry_point_resolves_where_the_runtime_is_installed() {
    // No GPU needed: resolving the symbols loads the library and runs nothing. Every entry
    // point is looked up at once, so one a ROCm lacks fails every HIP call (named here).
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    match crate::libs::hip() {
        Ok(l) => {
            if let Err(e) = sys() {
                panic!("{}: {e}", l.path.display());
            }
        }
        Err(e) if !ci => eprintln!("*** SKIPPED: no HIP runtime ({e})"),
        Err(e) => panic!("CI=true but the HIP runtime is unavailable: {e}"),
    }
}

#[test]
fn gfx_targets() {
    assert_eq!(gfx_target("gfx90a:sramecc+:xnack-"), Some("gfx90a"));
    assert_eq!(gfx_target("gfx942"), Some("gfx942"));
    assert_eq!(gfx_target("gfx1100"), Some("gfx1100"));
    for bad in ["", "gfx", "sm_90", "gfx9G", "GFX90A"] {
        assert_eq!(gfx_target(bad), None, "{bad}");
    }
}

#[test]
fn arch_name_is_found_in_any_props_layout() {
    // A name field first (as in every hipDeviceProp_t), then other fields, then the arch.
    let mut props = vec![0u8; 1024];
    props[..19].copy_from_slice(b"AMD Instinct MI250X");
    props[300..304].copy_from_slice(&910i32.to_ne_bytes());
    let arch = b"gfx90a:sramecc+:xnack-";
    props[396..396 + arch.len()].copy_from_slice(arch);
    assert_eq!(find_arch_name(&props).as_deref(), Some("gfx90a:sramecc+:xnack-"));
    // Text that merely contains "gfx" is not an arch name.
    let mut other = vec![0u8; 64];
    other[..9].copy_from_slice(b"gfxcard:x");
    assert_eq!(find_arch_name(&other), None);
    assert_eq!(find_arch_name(&[0u8; 64]), None);
}
