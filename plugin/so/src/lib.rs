//! The shared library JAX loads (`libpeerless_pjrt.so`). It only re-exports: all logic, and every safety argument,
//! lives in the `plugin` crate. Public symbols: `GetPjrtApi`, and for Peerless inside XLA `PeerlessXlaPass`,
//! `PeerlessXlaPassFree`, `PeerlessXlaPassFromPython`, `PeerlessXlaHandler`, `PeerlessXlaSetTopology` and
//! `PeerlessXlaTakeDecisions`.

use plugin::pjrt_sys::PJRT_Api;
use plugin::xla_inside::c_str;

/// The PJRT entry point: XLA's loader `dlsym`s this name and reads the function table.
#[unsafe(no_mangle)]
pub extern "C" fn GetPjrtApi() -> *const PJRT_Api {
    plugin::init_logging();
    // XLA's own plugin, wrapped (`plugin::wrap`), or a table naming what to install.
    plugin::api()
}

/// The collective pass for XLA (`jax_plugins.peerless.enable()`); see `plugin::xla_inside`. Never returns null; free
/// the result with `PeerlessXlaPassFree`.
///
/// # Safety
/// `module` points to `len` readable bytes; the strings are null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PeerlessXlaPass(
    platform: *const std::ffi::c_char,
    module: *const u8,
    len: usize,
    flags: *const std::ffi::c_char,
    local_devices: *const std::ffi::c_char,
) -> *mut plugin::xla_inside::PassResult {
    plugin::init_logging();
    // SAFETY: this function's contract is `pass_entry`'s.
    unsafe { plugin::xla_inside::pass_entry(platform, module, len, flags, local_devices) }
}

/// Frees a `PeerlessXlaPass` result (null is ignored).
///
/// # Safety
/// `result` came from `PeerlessXlaPass` and is freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PeerlessXlaPassFree(result: *mut plugin::xla_inside::PassResult) {
    // SAFETY: this function's contract is `pass_free`'s.
    unsafe { plugin::xla_inside::pass_free(result) }
}

/// Hands the handlers of `platform` the job's topology (its token; on CUDA the GPUs' device ids); see
/// `plugin::xla_inside::set_topology`. Never returns null; free the result (status 0, or -1 with the reason) with
/// `PeerlessXlaPassFree`.
///
/// # Safety
/// Both strings are null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PeerlessXlaSetTopology(
    platform: *const std::ffi::c_char,
    topology: *const std::ffi::c_char,
) -> *mut plugin::xla_inside::PassResult {
    plugin::init_logging();
    // SAFETY: this function's contract is `set_topology_entry`'s.
    unsafe { plugin::xla_inside::set_topology_entry(platform, topology) }
}

/// Decisions of executables loaded without the pass (a persistent compilation cache hit), registered when XLA
/// instantiated their calls, since the last call: the `report` of the result, one line each. Never returns null; free
/// it with `PeerlessXlaPassFree`.
#[unsafe(no_mangle)]
pub extern "C" fn PeerlessXlaTakeDecisions() -> *mut plugin::xla_inside::PassResult {
    plugin::xla_inside::take_decisions_entry()
}

/// The typed-FFI handler for `target` on `platform` ("cpu", "cuda", "rocm"), or null (an unknown platform or target, or
/// ROCm in a library built without it).
///
/// # Safety
/// Both strings are null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PeerlessXlaHandler(
    platform: *const std::ffi::c_char,
    target: *const std::ffi::c_char,
) -> *const std::ffi::c_void {
    plugin::init_logging();
    // SAFETY: the caller passes null or NUL-terminated strings.
    let (platform, target) = unsafe { (c_str(platform), c_str(target)) };
    match plugin::Platform::parse(platform).ok().and_then(|p| plugin::xla_handlers::handler(p, target)) {
        Some(h) => h as *const std::ffi::c_void,
        None => std::ptr::null(),
    }
}

/// Execute-stage calls of Peerless's FFI handlers on `platform` ("cpu", "cuda", "rocm") so far; 0 for an unknown
/// platform.
///
/// # Safety
/// `platform` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn PeerlessXlaHandlerCalls(platform: *const std::ffi::c_char) -> u64 {
    // SAFETY: the caller passes null or a NUL-terminated string.
    let p = unsafe { c_str(platform) };
    plugin::Platform::parse(p).map_or(0, plugin::xla_handlers::handler_calls)
}

/// The Python package loaded the wrapper and owns the collective pass on it (registers it with the job's topology and
/// `stats()`, or leaves it off): the wrapper's client creation then does not register it.
#[unsafe(no_mangle)]
pub extern "C" fn PeerlessXlaPassFromPython() {
    plugin::xla_inside::python_owns_pass();
}

/// Staging bytes the CPU handlers' in-process collectives hold now (shared slots and collectives of their own; freed
/// with executables).
#[unsafe(no_mangle)]
pub extern "C" fn PeerlessXlaStagingBytes() -> u64 {
    plugin::xla_handlers::staging_bytes() as u64
}

/// Device memory the CUDA handlers hold now on this process's GPU `ordinal` (staging, signal flags and status words of
/// their slots; freed with executables); 0 for an ordinal out of range.
#[unsafe(no_mangle)]
pub extern "C" fn PeerlessXlaGpuStagingBytes(ordinal: u64) -> u64 {
    let held = plugin::xla_handlers::gpu_staging_bytes();
    usize::try_from(ordinal).ok().and_then(|o| held.get(o).copied()).unwrap_or(0) as u64
}

/// Collective clusters of the CPU handlers alive in the process (freed with executables).
#[unsafe(no_mangle)]
pub extern "C" fn PeerlessXlaLiveCollectives() -> u64 {
    plugin::xla_handlers::live_collectives() as u64
}
