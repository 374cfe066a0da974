//! The shared library JAX loads (`libpeerless_pjrt.so`). It only re-exports: all logic, and
//! every safety argument, lives in the `plugin` crate. Public symbols: `GetPjrtApi` and
//! `PeerlessRegisterMlirConverter`.

use plugin::pjrt_sys::PJRT_Api;

/// The PJRT entry point: XLA's loader `dlsym`s this name and reads the function table.
#[unsafe(no_mangle)]
pub extern "C" fn GetPjrtApi() -> *const PJRT_Api {
    plugin::api()
}

/// Registers the MLIR → `HloModuleProto` converter (see `plugin::mlir::Converter`); the
/// Python package calls this with a ctypes callback. Null unregisters. Returns 0.
#[unsafe(no_mangle)]
pub extern "C" fn PeerlessRegisterMlirConverter(converter: Option<plugin::mlir::Converter>, ctx: usize) -> i32 {
    plugin::mlir::register(converter, ctx);
    0
}
