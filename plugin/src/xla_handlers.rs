//! The typed-FFI handlers XLA calls for Peerless custom calls, one per platform and target,
//! and the per-platform facts the pass needs (peer access, free device memory).
//!
//! Platforms: "cpu" (XLA's "Host"), "cuda" ("CUDA") and, in a library built with the cargo
//! feature `rocm`, "rocm" ("ROCM"): the same generic GPU runtime (`kernels::gpu::xla`) for
//! CUDA and HIP, each with its own state.
//!
//! Each handler is a C function over [`kernels::ffi_handler::dispatch`] with the platform's
//! runtime; `ffi::xla_ffi::guard_with_traits` answers the metadata probe and turns errors
//! and panics into XLA errors.

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

static HOST: HostRuntime = HostRuntime;
/// Execute-stage handler calls per platform (cpu, cuda, rocm): a call captured into a command
/// buffer and replayed by XLA does not count, which is how tests see that it was replayed.
static CALLS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// The GPU platforms this library has handlers for.
#[cfg(feature = "rocm")]
pub const GPU_PLATFORMS: &[&str] = &["cuda", "rocm"];
/// The GPU platforms this library has handlers for ("rocm" needs the cargo feature `rocm`).
#[cfg(not(feature = "rocm"))]
pub const GPU_PLATFORMS: &[&str] = &["cuda"];

/// Whether this library has handlers for `platform` ("cpu", a GPU platform).
pub fn has_platform(platform: &str) -> bool {
    platform == "cpu" || GPU_PLATFORMS.contains(&platform)
}

/// Why there are no handlers for `platform`.
pub fn no_platform(platform: &str) -> String {
    if platform == "rocm" {
        "Peerless has no handlers for platform 'rocm': this library was built without the cargo feature \
         `rocm` (cargo build -p peerless-pjrt --features rocm)"
            .into()
    } else {
        format!("Peerless has no handlers for platform '{platform}'")
    }
}

/// Collectives of the CPU and GPU handlers alive now (each freed with its executable).
pub fn live_collectives() -> usize {
    let gpu = gpu_xla::live_instances::<Cuda>();
    #[cfg(feature = "rocm")]
    let gpu = gpu + gpu_xla::live_instances::<kernels::rocm::Hip>();
    kernels::xla_host::live_clusters() + gpu
}

/// Staging bytes the CPU handlers hold now (in-process groups: shared slots and
/// collectives of their own).
pub fn staging_bytes() -> usize {
    kernels::xla_host::staging_bytes()
}

/// Device memory the GPU handlers hold now, per GPU ordinal of the process (CUDA's and, in a
/// ROCm build, HIP's added: a process runs one vendor's GPUs).
pub fn gpu_staging_bytes() -> Vec<usize> {
    let held = gpu_xla::staging_by_gpu::<Cuda>();
    #[cfg(feature = "rocm")]
    let held = held.iter().zip(gpu_xla::staging_by_gpu::<kernels::rocm::Hip>()).map(|(a, b)| a + b).collect();
    held
}

/// Execute-stage calls of the handlers of `platform` so far.
pub fn handler_calls(platform: &str) -> u64 {
    match platform {
        "cpu" => CALLS[0].load(Ordering::Relaxed),
        "cuda" => CALLS[1].load(Ordering::Relaxed),
        "rocm" => CALLS[2].load(Ordering::Relaxed),
        _ => 0,
    }
}
static CUDA: CudaRuntime = CudaRuntime;
#[cfg(feature = "rocm")]
static ROCM: kernels::rocm::xla::RocmRuntime = kernels::rocm::xla::RocmRuntime;

/// Runs `kind`'s handler with `rt`.
///
/// # Safety
/// `frame` is the call frame XLA passed to a handler, valid for the call.
unsafe fn call(
    kind: CollectiveKind,
    frame: *mut XLA_FFI_CallFrame,
    rt: &dyn CollectiveRuntime,
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

macro_rules! handlers {
    ($rt:expr, $counter:expr; $($name:ident => $kind:ident),* $(,)?) => {
        $(
            /// # Safety
            /// Called by XLA with a live call frame.
            unsafe extern "C" fn $name(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
                // SAFETY: XLA calls handlers with a call frame valid for the call.
                unsafe { call(CollectiveKind::$kind, frame, $rt, $counter) }
            }
        )*
    };
}

handlers! { &HOST, &CALLS[0];
    cpu_all_reduce => AllReduce,
    cpu_all_gather => AllGather,
    cpu_all_to_all => AllToAll,
    cpu_reduce_scatter => ReduceScatter,
    cpu_collective_permute => CollectivePermute,
}

handlers! { &CUDA, &CALLS[1];
    cuda_all_reduce => AllReduce,
    cuda_all_gather => AllGather,
    cuda_all_to_all => AllToAll,
    cuda_reduce_scatter => ReduceScatter,
    cuda_collective_permute => CollectivePermute,
}

#[cfg(feature = "rocm")]
handlers! { &ROCM, &CALLS[2];
    rocm_all_reduce => AllReduce,
    rocm_all_gather => AllGather,
    rocm_all_to_all => AllToAll,
    rocm_reduce_scatter => ReduceScatter,
    rocm_collective_permute => CollectivePermute,
}

/// A typed-FFI handler as XLA registers it.
pub type Handler = unsafe extern "C" fn(*mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error;

/// The handler of `target` on `platform` (`"cpu"`, `"cuda"`, and `"rocm"` in a ROCm build),
/// or `None`.
pub fn handler(platform: &str, target: &str) -> Option<Handler> {
    use CollectiveKind as K;
    let kind = target_kind(target)?;
    let h: Handler = match (platform, kind) {
        ("cpu", K::AllReduce) => cpu_all_reduce,
        ("cpu", K::AllGather) => cpu_all_gather,
        ("cpu", K::AllToAll) => cpu_all_to_all,
        ("cpu", K::ReduceScatter) => cpu_reduce_scatter,
        ("cpu", K::CollectivePermute) => cpu_collective_permute,
        ("cuda", K::AllReduce) => cuda_all_reduce,
        ("cuda", K::AllGather) => cuda_all_gather,
        ("cuda", K::AllToAll) => cuda_all_to_all,
        ("cuda", K::ReduceScatter) => cuda_reduce_scatter,
        ("cuda", K::CollectivePermute) => cuda_collective_permute,
        #[cfg(feature = "rocm")]
        ("rocm", K::AllReduce) => rocm_all_reduce,
        #[cfg(feature = "rocm")]
        ("rocm", K::AllGather) => rocm_all_gather,
        #[cfg(feature = "rocm")]
        ("rocm", K::AllToAll) => rocm_all_to_all,
        #[cfg(feature = "rocm")]
        ("rocm", K::ReduceScatter) => rocm_reduce_scatter,
        #[cfg(feature = "rocm")]
        ("rocm", K::CollectivePermute) => rocm_collective_permute,
        _ => return None,
    };
    Some(h)
}

/// XLA's name of a Peerless platform ("cpu" → "Host", "cuda" → "CUDA", "rocm" → "ROCM"), as
/// XLA's FFI registry and JAX's `register_ffi_target` take it.
pub fn xla_platform(platform: &str) -> &'static str {
    match platform {
        "cuda" => "CUDA",
        "rocm" => "ROCM",
        _ => "Host",
    }
}

/// Registers every Peerless handler of `platform` ("cpu", "cuda", "rocm") in an inner plugin's
/// FFI registry, through its FFI extension (execute-only handlers; XLA's platform "Host",
/// "CUDA" or "ROCM", the GPU ones command-buffer compatible). Once per plugin and process:
/// XLA's registry is process-global inside the plugin, and a second registration is an error.
pub fn register_in(inner: &ffi::pjrt::InnerPlugin, platform: &str) -> Result<&'static str, String> {
    if !has_platform(platform) {
        return Err(no_platform(platform));
    }
    let xla_platform = xla_platform(platform);
    let traits = if platform == "cpu" { 0 } else { 1 };
    for &(_, target) in thunks::custom_call::TARGETS.iter() {
        let h = handler(platform, target).ok_or_else(|| format!("Peerless has no {platform} handler for {target}"))?;
        // SAFETY: `h` is one of this library's typed FFI handlers, a plain function valid for
        // the process.
        unsafe { inner.register_ffi_handler(target, h as *const std::ffi::c_void, xla_platform, traits) }
            .map_err(|e| format!("{}: {e}", inner.path().display()))?;
    }
    Ok(xla_platform)
}

/// The peer-access table the pass decides with on CUDA: the probed table of the process's
/// GPUs, on device ids (`ordinals`: this process's device id → CUDA ordinal, where the process
/// does not own every device; `None`: ids are ordinals), or a table with no links when the
/// GPUs cannot be opened (every collective then stays XLA's, with that reason). (On CPU every
/// device reaches every other: `xla_pass::Peers::Shared`.)
pub fn cuda_peer_table(ordinals: Option<&BTreeMap<usize, usize>>, allow_unsafe: bool) -> Arc<PeerAccessTable> {
    remapped(gpu_xla::peer_table::<Cuda>(allow_unsafe), ordinals, "cuda")
}

/// [`cuda_peer_table`] for the AMD GPUs of the process (HIP ordinals), in a ROCm build.
#[cfg(feature = "rocm")]
pub fn rocm_peer_table(ordinals: Option<&BTreeMap<usize, usize>>, allow_unsafe: bool) -> Arc<PeerAccessTable> {
    remapped(gpu_xla::peer_table::<kernels::rocm::Hip>(allow_unsafe), ordinals, "rocm")
}

/// The peer table of GPU `platform` ("cuda", "rocm") under the target policy
/// (`allow_unsafe`: `--allow_unsafe_peer_targets`); a table with no links where this
/// library has no such platform.
pub fn gpu_peer_table(
    platform: &str,
    ordinals: Option<&BTreeMap<usize, usize>>,
    allow_unsafe: bool,
) -> Arc<PeerAccessTable> {
    match platform {
        "cuda" => cuda_peer_table(ordinals, allow_unsafe),
        #[cfg(feature = "rocm")]
        "rocm" => rocm_peer_table(ordinals, allow_unsafe),
        other => remapped(Err(no_platform(other)), ordinals, other),
    }
}

/// The least free device memory among the process's GPUs of `platform` (the pass's staging
/// budget), or why it is unknown.
pub fn gpu_least_free_memory(platform: &str) -> Result<usize, String> {
    match platform {
        "cuda" => gpu_xla::least_free_memory::<Cuda>(),
        #[cfg(feature = "rocm")]
        "rocm" => gpu_xla::least_free_memory::<kernels::rocm::Hip>(),
        other => Err(no_platform(other)),
    }
}

/// The name of GPU `platform`'s first device (a tuning profile's device kind).
pub fn gpu_device_kind(platform: &str) -> Result<String, String> {
    match platform {
        "cuda" => gpu_xla::device_kind::<Cuda>(),
        #[cfg(feature = "rocm")]
        "rocm" => gpu_xla::device_kind::<kernels::rocm::Hip>(),
        other => Err(no_platform(other)),
    }
}

/// Hands GPU `platform`'s handlers each local GPU's device id (ordinal → id).
pub fn set_gpu_device_ids(platform: &str, ids: BTreeMap<usize, usize>) {
    match platform {
        "cuda" => gpu_xla::set_device_ids::<Cuda>(ids),
        #[cfg(feature = "rocm")]
        "rocm" => gpu_xla::set_device_ids::<kernels::rocm::Hip>(ids),
        _ => {}
    }
}

/// A probed table (or why there is none) on device ids.
fn remapped(
    table: Result<Arc<PeerAccessTable>, String>,
    ordinals: Option<&BTreeMap<usize, usize>>,
    platform: &str,
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
