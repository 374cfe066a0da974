//! The typed-FFI handlers XLA calls for Peerless custom calls, one per [`Platform`] (XLA:CPU, CUDA and, with feature
//! `rocm`, ROCm) and target, and the per-platform facts the pass needs (peer access, free device memory). Each handler
//! is a C function over [`kernels::ffi_handler::dispatch`] under `ffi::xla_ffi::guard_with_traits`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use emitter::PeerAccessTable;
use ffi::xla_ffi::{XLA_FFI_CallFrame, XLA_FFI_Error};
use kernels::cuda::Cuda;
use kernels::cuda::xla::CudaRuntime;
use kernels::ffi_handler::{CollectiveRuntime, dispatch};
use kernels::gpu::xla as gpu_xla;
use kernels::xla_host::HostRuntime;
use thunks::CollectiveKind;
use thunks::custom_call::target_kind;

use crate::Platform;

static HOST: HostRuntime = HostRuntime;
/// Execute-stage handler calls per platform (by [`Platform::index`]): a call captured into a command buffer and
/// replayed by XLA does not count, which is how tests see that it was replayed.
static CALLS: [AtomicU64; Platform::ALL.len()] = [const { AtomicU64::new(0) }; Platform::ALL.len()];

/// Why GPU `platform` has no runtime here: it is no GPU platform, or its handlers were not built.
fn no_gpu_runtime(platform: Platform) -> String {
    match platform.with_handlers() {
        Err(e) => e,
        Ok(_) => format!("'{platform}' is no GPU platform"),
    }
}

#[cfg(test)]
thread_local! {
    /// Calls on this thread into what opens the GPU runtime (its clique: every GPU opened, contexts made, pairs
    /// probed): tests see which paths never reach it.
    pub(crate) static GPU_RUNTIME_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts a call into the GPU runtime (tests only).
fn opens_gpus() {
    #[cfg(test)]
    GPU_RUNTIME_CALLS.with(|c| c.set(c.get() + 1));
}

/// Collectives of the CPU and GPU handlers alive now (each freed with its executable).
pub fn live_collectives() -> usize {
    let gpu = gpu_xla::live_instances::<Cuda>();
    #[cfg(feature = "rocm")]
    let gpu = gpu + gpu_xla::live_instances::<kernels::rocm::Hip>();
    kernels::xla_host::live_clusters() + gpu
}

/// Staging bytes the CPU handlers hold now (in-process groups: shared slots and collectives of their own).
pub fn staging_bytes() -> usize {
    kernels::xla_host::staging_bytes()
}

/// Device memory the GPU handlers hold now, per GPU ordinal of the process (CUDA's and, in a ROCm build, HIP's added: a
/// process runs one vendor's GPUs).
pub fn gpu_staging_bytes() -> Vec<usize> {
    let held = gpu_xla::staging_by_gpu::<Cuda>();
    #[cfg(feature = "rocm")]
    let held = held.iter().zip(gpu_xla::staging_by_gpu::<kernels::rocm::Hip>()).map(|(a, b)| a + b).collect();
    held
}

/// Execute-stage calls of the handlers of `platform` so far.
pub fn handler_calls(platform: Platform) -> u64 {
    CALLS[platform.index()].load(Ordering::Relaxed)
}
static CUDA: CudaRuntime = CudaRuntime;
#[cfg(feature = "rocm")]
static ROCM: kernels::rocm::xla::RocmRuntime = kernels::rocm::xla::RocmRuntime;

/// Runs `kind`'s handler with `rt`.
///
/// # Safety
/// `frame` is the call frame XLA passed to a handler, valid for the call.
unsafe fn call<R: CollectiveRuntime>(
    kind: CollectiveKind,
    frame: *mut XLA_FFI_CallFrame,
    rt: &R,
    counter: &AtomicU64,
) -> *mut XLA_FFI_Error {
    // SAFETY: the caller's contract (a live call frame from XLA).
    unsafe {
        ffi::xla_ffi::guard_with_traits(frame, rt.traits(), |f| {
            if f.stage() == ffi::xla_ffi::ExecutionStage::Execute {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            dispatch(kind, f, rt)
        })
    }
}

/// A typed-FFI handler as XLA registers it.
pub type Handler = unsafe extern "C" fn(*mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error;

/// One platform's handlers, one per collective kind with a Peerless kernel, and `$lookup(kind)`: the one of `kind`.
macro_rules! handlers {
    ($lookup:ident, $rt:expr, $counter:expr) => {
        fn $lookup(kind: CollectiveKind) -> Option<Handler> {
            handlers!(@each kind, $rt, $counter; AllReduce, AllGather, AllToAll, ReduceScatter, CollectivePermute)
        }
    };
    (@each $kind:ident, $rt:expr, $counter:expr; $($k:ident),*) => {{
        $(
            /// # Safety
            /// Called by XLA with a live call frame.
            #[allow(non_snake_case)]
            unsafe extern "C" fn $k(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
                // SAFETY: XLA calls handlers with a call frame valid for the call.
                unsafe { call(CollectiveKind::$k, frame, $rt, $counter) }
            }
        )*
        match $kind {
            $(CollectiveKind::$k => Some($k as Handler),)*
            _ => None,
        }
    }};
}

handlers!(cpu_handler, &HOST, &CALLS[Platform::Cpu as usize]);
handlers!(cuda_handler, &CUDA, &CALLS[Platform::Cuda as usize]);
#[cfg(feature = "rocm")]
handlers!(rocm_handler, &ROCM, &CALLS[Platform::Rocm as usize]);

/// The handler of `target` on `platform` (ROCm's in a ROCm build), or `None`.
pub fn handler(platform: Platform, target: &str) -> Option<Handler> {
    let kind = target_kind(target)?;
    match platform {
        Platform::Cpu => cpu_handler(kind),
        Platform::Cuda => cuda_handler(kind),
        #[cfg(feature = "rocm")]
        Platform::Rocm => rocm_handler(kind),
        #[cfg(not(feature = "rocm"))]
        Platform::Rocm => None,
    }
}

/// Registers every Peerless handler of `platform` in an inner plugin's FFI registry, through its FFI extension
/// (execute-only handlers; XLA's platform "Host", "CUDA" or "ROCM", the GPU ones command-buffer compatible). Once per
/// plugin and process: XLA's registry is process-global inside the plugin, and a second registration is an error.
pub fn register_in(inner: &ffi::pjrt::InnerPlugin, platform: Platform) -> Result<&'static str, String> {
    let xla_platform = platform.with_handlers()?.xla_name();
    let traits = if platform.is_gpu() { 1 } else { 0 };
    for &(_, target) in thunks::custom_call::TARGETS.iter() {
        let h = handler(platform, target).ok_or_else(|| format!("Peerless has no {platform} handler for {target}"))?;
        // SAFETY: `h` is one of this library's typed FFI handlers, a plain function valid for the process.
        unsafe { inner.register_ffi_handler(target, h as *const std::ffi::c_void, xla_platform, traits) }
            .map_err(|e| format!("{}: {e}", inner.path().display()))?;
    }
    Ok(xla_platform)
}

/// The peer-access table the pass decides with on GPU `platform` under the target policy (`allow_unsafe`): the
/// runtime's probe of the process's GPUs (kept on disk for the same GPUs and driver, else probed now), on device ids
/// (`ordinals`: id → ordinal where the process does not own every device; `None`: ids are ordinals). With no GPUs to
/// open or no such runtime, a table with no links: every collective then stays XLA's, with that reason.
pub fn gpu_peer_table(
    platform: Platform,
    ordinals: Option<&BTreeMap<usize, usize>>,
    allow_unsafe: bool,
) -> Arc<PeerAccessTable> {
    opens_gpus();
    let table = match platform {
        Platform::Cuda => gpu_xla::peer_table::<Cuda>(allow_unsafe),
        #[cfg(feature = "rocm")]
        Platform::Rocm => gpu_xla::peer_table::<kernels::rocm::Hip>(allow_unsafe),
        other => Err(no_gpu_runtime(other)),
    };
    remapped(table, ordinals, platform)
}

/// The least free device memory among the process's GPUs of `platform` (the pass's staging budget), read through the
/// contexts XLA made, or why it is unknown.
pub fn gpu_least_free_memory(platform: Platform) -> Result<usize, String> {
    match platform {
        Platform::Cuda => gpu_xla::least_free_memory::<Cuda>(),
        #[cfg(feature = "rocm")]
        Platform::Rocm => gpu_xla::least_free_memory::<kernels::rocm::Hip>(),
        other => Err(no_gpu_runtime(other)),
    }
}

/// Hands GPU `platform`'s handlers each local GPU's device id (ordinal → id).
pub fn set_gpu_device_ids(platform: Platform, ids: BTreeMap<usize, usize>) {
    match platform {
        Platform::Cuda => gpu_xla::set_device_ids::<Cuda>(ids),
        #[cfg(feature = "rocm")]
        Platform::Rocm => gpu_xla::set_device_ids::<kernels::rocm::Hip>(ids),
        _ => {}
    }
}

/// The peer-access table of GPU `platform` known without opening a GPU (the runtime's, or the probe it kept for these
/// GPUs and driver), on device ids as [`gpu_peer_table`]'s; `None`: it must be probed.
pub fn gpu_known_peer_table(
    platform: Platform,
    ordinals: Option<&BTreeMap<usize, usize>>,
    allow_unsafe: bool,
) -> Option<Arc<PeerAccessTable>> {
    let table = match platform {
        Platform::Cuda => gpu_xla::known_peer_table::<Cuda>(allow_unsafe),
        #[cfg(feature = "rocm")]
        Platform::Rocm => gpu_xla::known_peer_table::<kernels::rocm::Hip>(allow_unsafe),
        _ => None,
    };
    Some(remapped(Ok(table?), ordinals, platform))
}

/// A probed table (or why there is none) on device ids.
fn remapped(
    table: Result<Arc<PeerAccessTable>, String>,
    ordinals: Option<&BTreeMap<usize, usize>>,
    platform: Platform,
) -> Arc<PeerAccessTable> {
    match table {
        Ok(t) => match ordinals.filter(|o| !o.is_empty()) {
            None => t,
            Some(o) => {
                let n = o.keys().max().map_or(0, |m| m + 1);
                let source = format!("{} (device ids of this process {:?})", t.source(), o.keys());
                Arc::new(PeerAccessTable::from_fn(n, source, |a, b| match (o.get(&a), o.get(&b)) {
                    (Some(&x), Some(&y)) => t.can_access(x, y),
                    _ => false,
                }))
            }
        },
        Err(e) => {
            log::warn!("peerless: no peer table on {platform}: {e}");
            Arc::new(PeerAccessTable::from_fn(0, format!("GPUs not opened: {e}"), |_, _| false))
        }
    }
}
