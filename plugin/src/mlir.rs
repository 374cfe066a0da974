//! MLIR (StableHLO) programs. Peerless reads `HloModuleProto`; JAX sends StableHLO bytecode.
//! The Python package registers a converter (jaxlib's own MLIR → HLO conversion) through the
//! exported C function `PeerlessRegisterMlirConverter`; without one, `mlir` programs fail
//! with an error that says so.

use std::os::raw::c_void;
use std::sync::Mutex;

use crate::error::{Error, Result};

/// Receives bytes from the converter: the serialized `HloModuleProto` on success, a UTF-8
/// message on failure. `sink_ctx` is the value the plugin passed to the converter.
pub type Sink = unsafe extern "C" fn(sink_ctx: *mut c_void, data: *const u8, len: usize);

/// `int convert(const char* mlir, size_t len, Sink sink, void* sink_ctx, uintptr_t ctx)`:
/// calls `sink` (zero or more times; bytes are appended) and returns 0 on success.
pub type Converter =
    unsafe extern "C" fn(code: *const u8, len: usize, sink: Sink, sink_ctx: *mut c_void, ctx: usize) -> i32;

static CONVERTER: Mutex<Option<(Converter, usize)>> = Mutex::new(None);

/// Registers (or with `None` removes) the converter.
pub fn register(converter: Option<Converter>, ctx: usize) {
    *CONVERTER.lock().unwrap_or_else(|e| e.into_inner()) = converter.map(|c| (c, ctx));
}

unsafe extern "C" fn sink(sink_ctx: *mut c_void, data: *const u8, len: usize) {
    if sink_ctx.is_null() || (data.is_null() && len > 0) {
        return;
    }
    // SAFETY: `sink_ctx` is the `&mut Vec<u8>` that `convert` passed for this call and
    // that outlives it; `data` holds `len` readable bytes (converter contract).
    let (out, bytes) = unsafe { (&mut *sink_ctx.cast::<Vec<u8>>(), std::slice::from_raw_parts(data, len)) };
    out.extend_from_slice(bytes);
}

/// Converts MLIR bytes to a serialized `HloModuleProto` with the registered converter.
pub fn convert(code: &[u8]) -> Result<Vec<u8>> {
    let Some((f, ctx)) = *CONVERTER.lock().unwrap_or_else(|e| e.into_inner()) else {
        return Err(Error::unimplemented(
            "peerless: program format 'mlir' needs an MLIR converter, and none is registered; \
             load the plugin through the jax_plugins.peerless Python package (which registers jaxlib's \
             converter via PeerlessRegisterMlirConverter) or compile an HloModuleProto (format 'hlo')",
        ));
    };
    let mut out: Vec<u8> = Vec::new();
    let out_ptr: *mut Vec<u8> = &mut out;
    // SAFETY: `f` was registered through `PeerlessRegisterMlirConverter` with the `Converter`
    // signature; `code` is valid for the call; `out_ptr` stays valid until `f` returns.
    let rc = unsafe { f(code.as_ptr(), code.len(), sink, out_ptr.cast(), ctx) };
    if rc != 0 {
        return Err(Error::invalid(format!(
            "peerless: MLIR → HLO conversion failed: {}",
            String::from_utf8_lossy(&out)
        )));
    }
    Ok(out)
}
