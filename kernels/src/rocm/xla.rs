//! The ROCm runtime behind XLA's FFI handlers (feature `rocm`): [`crate::gpu::xla`]'s generic runtime for [`Hip`], with
//! HIP's own process-wide state (never shared with CUDA's). It builds and its unit tests run in CI without an AMD GPU;
//! it has never run on one (docs/ROCM.md).

use super::Hip;
use crate::gpu::xla::{GpuRuntime, RuntimeState, XlaBackend};

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
pub const RocmRuntime: RocmRuntime = GpuRuntime(std::marker::PhantomData);
