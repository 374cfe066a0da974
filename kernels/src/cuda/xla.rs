//! The CUDA runtime behind XLA's FFI handlers: [`crate::gpu::xla`]'s generic runtime for [`Cuda`], with CUDA's own
//! process-wide state, under the names the plugin uses.

use super::Cuda;
use crate::gpu::xla::{GpuRuntime, RuntimeState, XlaBackend};

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
pub const CudaRuntime: CudaRuntime = GpuRuntime(std::marker::PhantomData);
