//! The CUDA runtime behind XLA's FFI handlers: [`crate::gpu::xla`]'s generic runtime for
//! [`Cuda`], with CUDA's own process-wide state, under the names the plugin uses.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Cuda;
use crate::gpu::xla::{self, GpuRuntime, RuntimeState, XlaBackend};

impl XlaBackend for Cuda {
    const FUSED_NORM: bool = true;

    fn state() -> &'static RuntimeState<Cuda> {
        static STATE: RuntimeState<Cuda> = RuntimeState::new("peerless.cuda_collective");
        &STATE
    }
}

/// The CUDA platform's [`crate::ffi_handler::CollectiveRuntime`].
pub type CudaRuntime = GpuRuntime<Cuda>;
/// The runtime as a value, spelled as a unit struct's (`static CUDA: CudaRuntime = CudaRuntime;`).
#[allow(non_upper_case_globals)]
pub const CudaRuntime: CudaRuntime = GpuRuntime::new();

/// The peer-access table of the process's GPUs (for the pass), or why there is none.
pub fn peer_table(allow_unsafe: bool) -> Result<Arc<thunks::PeerAccessTable>, String> {
    xla::peer_table::<Cuda>(allow_unsafe)
}

/// The least free device memory among the process's GPUs, in bytes (the pass's staging
/// budget), or why it is unknown.
pub fn least_free_memory() -> Result<usize, String> {
    xla::least_free_memory::<Cuda>()
}

/// The name of the process's first GPU (a tuning profile's device kind).
pub fn device_kind() -> Result<String, String> {
    xla::device_kind::<Cuda>()
}

/// Records which device id each local GPU (CUDA ordinal) has in the job.
pub fn set_device_ids(ids: BTreeMap<usize, usize>) {
    xla::set_device_ids::<Cuda>(ids)
}

/// Bytes of device memory Peerless's collectives hold now (staging, signals, status words),
/// per CUDA ordinal of this process (`peerless.staging_bytes()`, `peerless devices`).
pub fn staging_by_gpu() -> Vec<usize> {
    xla::staging_by_gpu::<Cuda>()
}

/// Number of CUDA collective instances alive in the process.
pub fn live_instances() -> usize {
    xla::live_instances::<Cuda>()
}
