//! The ROCm runtime behind XLA's FFI handlers (feature `rocm`): [`crate::gpu::xla`]'s generic
//! runtime for [`Hip`], with HIP's own process-wide state (never shared with CUDA's). It
//! builds and its unit tests run in CI without an AMD GPU; it has never run on one
//! (docs/ROCM.md).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Hip;
use crate::gpu::xla::{self, GpuRuntime, RuntimeState, XlaBackend};

impl XlaBackend for Hip {
    fn state() -> &'static RuntimeState<Hip> {
        static STATE: RuntimeState<Hip> = RuntimeState::new("peerless.rocm_collective");
        &STATE
    }
}

/// XLA's ROCm platform's [`crate::ffi_handler::CollectiveRuntime`].
pub type RocmRuntime = GpuRuntime<Hip>;
/// The runtime as a value, spelled as a unit struct's (`static ROCM: RocmRuntime = RocmRuntime;`).
#[allow(non_upper_case_globals)]
pub const RocmRuntime: RocmRuntime = GpuRuntime::new();

/// The peer-access table of the process's AMD GPUs (for the pass), or why there is none:
/// gfx90a's links removed unless `allow_unsafe` (`--allow_unsafe_peer_targets`).
pub fn peer_table(allow_unsafe: bool) -> Result<Arc<thunks::PeerAccessTable>, String> {
    xla::peer_table::<Hip>(allow_unsafe)
}

/// The least free device memory among the process's AMD GPUs, in bytes, or why it is unknown.
pub fn least_free_memory() -> Result<usize, String> {
    xla::least_free_memory::<Hip>()
}

/// The name of the process's first GPU (a tuning profile's device kind).
pub fn device_kind() -> Result<String, String> {
    xla::device_kind::<Hip>()
}

/// Records which device id each local GPU (HIP ordinal) has in the job.
pub fn set_device_ids(ids: BTreeMap<usize, usize>) {
    xla::set_device_ids::<Hip>(ids)
}

/// Bytes of device memory the ROCm handlers hold now, per HIP ordinal of this process.
pub fn staging_by_gpu() -> Vec<usize> {
    xla::staging_by_gpu::<Hip>()
}

/// Number of ROCm collective instances alive in the process.
pub fn live_instances() -> usize {
    xla::live_instances::<Hip>()
}
