//! `ffi::pjrt` through its public API (the layouts and the transform trampoline are unit
//! tests: tests/unit/pjrt.rs).

use std::path::Path;

use ffi::pjrt::InnerPlugin;

#[test]
fn a_missing_plugin_is_an_error_naming_it() {
    let e = InnerPlugin::load(Path::new("/nonexistent/pjrt_plugin.so")).unwrap_err();
    assert!(e.contains("/nonexistent/pjrt_plugin.so"), "{e}");
}
