//! One device-layer interface for the GPU runtimes: [`Gpu`], which [`crate::cuda::Cuda`] (the
//! CUDA driver) and, with feature `rocm`, [`crate::hip::Hip`] (the HIP runtime) implement.
//!
//! Why a trait: the collective launchers, the clique (contexts, streams, kernel modules), the
//! peer probe and the symmetric allocations are the same code on both vendors; only these
//! entry points differ. `kernels::gpu` is written once against this trait instead of being
//! copied per vendor. Each method is a thin call into the vendor's result layer, so errors
//! still name the vendor call and the device.
//!
//! What is not here, because only one vendor's runtime needs it so far: CUDA's IPC handles,
//! host-mapped memory and foreign (XLA's) streams (`kernels::cuda::xla`), and HIP's
//! `gcnArchName` (read in `kernels::rocm`).

use std::ffi::c_void;
use std::fmt::Debug;

use crate::Result;
use crate::ccl::CclStream;

/// A GPU runtime's device layer: the handle types and the calls the collective launchers,
/// the clique and the peer probe make. Implemented by marker types; every method is an
/// associated function so the handle types stay the vendor modules' own.
pub trait Gpu: Debug + Send + Sync + 'static {
    /// `"cuda"` or `"rocm"`: names the backend in errors and peer-table keys.
    const NAME: &'static str;
    /// The vendor's collective library (`"NCCL"`, `"RCCL"`), for errors.
    const CCL: &'static str;

    /// One device, made current with [`Gpu::bind`]. Declared last in owners, so modules,
    /// streams and buffers drop first.
    type Context: Debug + Send + Sync;
    /// A loaded code object.
    type Module: Debug + Send + Sync;
    /// A kernel entry point of a module.
    type Function: Debug + Send + Sync;
    /// A non-blocking stream; the collective library takes it too.
    type Stream: Debug + Send + Sync + CclStream;
    /// A zeroed device allocation peers may read, write and poll while kernels run.
    type Buffer: Debug + Send + Sync;

    /// Opens device `ordinal` (its primary context on CUDA).
    fn open(ordinal: usize) -> Result<Self::Context>;
    /// Makes the device current on the calling thread.
    fn bind(ctx: &Self::Context) -> Result<()>;
    /// The device's marketing name.
    fn name(ctx: &Self::Context) -> Result<String>;
    /// Streaming multiprocessors (CUDA) or compute units (HIP).
    fn compute_units(ctx: &Self::Context) -> Result<i32>;
    /// Whether the runtime reports that `ctx`'s kernels can access `peer`'s memory.
    fn can_access_peer(ctx: &Self::Context, peer: &Self::Context) -> Result<bool>;
    /// Enables that access (already enabled is success).
    fn enable_peer_access(ctx: &Self::Context, peer: &Self::Context) -> Result<()>;
    /// Loads a code object (a cubin or a HIP code object) on the device.
    fn load_module(ctx: &Self::Context, image: &[u8]) -> Result<Self::Module>;
    /// Looks up kernel `name` in `module`.
    fn function(module: &Self::Module, name: &str) -> Result<Self::Function>;
    /// A new non-blocking stream on the device.
    fn stream(ctx: &Self::Context) -> Result<Self::Stream>;
    /// Waits for all work enqueued on `stream`.
    fn synchronize(stream: &Self::Stream) -> Result<()>;
    /// Launches `f` on `stream` with `grid` blocks of `block` threads.
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list in number, order and layout, and every
    /// pointer argument must stay valid until the kernel finishes.
    unsafe fn launch(
        stream: &Self::Stream,
        f: &Self::Function,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()>;
    /// `len` bytes (at least 1), zeroed and settled, that peers may access while kernels run
    /// (plain `cuMemAlloc` on CUDA; fine-grained memory on HIP, where coarse-grained memory
    /// is coherent across devices only at kernel boundaries).
    fn alloc(ctx: &Self::Context, len: usize) -> Result<Self::Buffer>;
    /// The buffer's device address.
    fn ptr(buf: &Self::Buffer) -> u64;
    /// The ordinal of the device the buffer lives on.
    fn buffer_ordinal(buf: &Self::Buffer) -> usize;
    /// Copies the buffer's first `out.len()` bytes to the host (synchronous).
    fn read(buf: &Self::Buffer, out: &mut [u8]) -> Result<()>;
    /// Copies `data` to the buffer's first bytes (synchronous).
    fn write(buf: &Self::Buffer, data: &[u8]) -> Result<()>;
}

/// Implements [`Gpu`] for a vendor module's marker type by forwarding to that module's owners
/// (`Context`, `Module`, `Function`, `Stream` and `DeviceBuffer`, which both vendor modules
/// define with the same shapes). Only the names that differ are arguments:
/// the compute-unit query and the allocation that peers may access while kernels run.
macro_rules! forward_gpu {
    ($marker:ty, name: $name:literal, ccl: $ccl:literal, units: $units:ident, alloc: $alloc:ident) => {
        impl $crate::gpu::Gpu for $marker {
            const NAME: &'static str = $name;
            const CCL: &'static str = $ccl;
            type Context = Context;
            type Module = Module;
            type Function = Function;
            type Stream = Stream;
            type Buffer = DeviceBuffer;

            fn open(ordinal: usize) -> Result<Context> {
                Context::new(ordinal)
            }
            fn bind(ctx: &Context) -> Result<()> {
                ctx.bind()
            }
            fn name(ctx: &Context) -> Result<String> {
                ctx.name()
            }
            fn compute_units(ctx: &Context) -> Result<i32> {
                ctx.$units()
            }
            fn can_access_peer(ctx: &Context, peer: &Context) -> Result<bool> {
                ctx.can_access_peer(peer)
            }
            fn enable_peer_access(ctx: &Context, peer: &Context) -> Result<()> {
                ctx.enable_peer_access(peer)
            }
            fn load_module(ctx: &Context, image: &[u8]) -> Result<Module> {
                ctx.load_module(image)
            }
            fn function(module: &Module, name: &str) -> Result<Function> {
                module.function(name)
            }
            fn stream(ctx: &Context) -> Result<Stream> {
                Stream::new(ctx)
            }
            fn synchronize(stream: &Stream) -> Result<()> {
                stream.synchronize()
            }
            unsafe fn launch(
                stream: &Stream,
                f: &Function,
                grid: u32,
                block: u32,
                params: &mut [*mut std::ffi::c_void],
            ) -> Result<()> {
                // SAFETY: the caller upholds `Stream::launch`'s contract (this method's own).
                unsafe { stream.launch(f, grid, block, params) }
            }
            fn alloc(ctx: &Context, len: usize) -> Result<DeviceBuffer> {
                DeviceBuffer::$alloc(ctx, len)
            }
            fn ptr(buf: &DeviceBuffer) -> u64 {
                buf.ptr
            }
            fn buffer_ordinal(buf: &DeviceBuffer) -> usize {
                buf.ordinal
            }
            fn read(buf: &DeviceBuffer, out: &mut [u8]) -> Result<()> {
                buf.read_at(0, out)
            }
            fn write(buf: &DeviceBuffer, data: &[u8]) -> Result<()> {
                buf.write_at(0, data)
            }
        }
    };
}
pub(crate) use forward_gpu;
