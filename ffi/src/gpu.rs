//! One device-layer interface for the GPU runtimes: [`Gpu`], which [`crate::cuda::Cuda`] (the
//! CUDA driver) and, with feature `rocm`, [`crate::hip::Hip`] (the HIP runtime) implement.
//!
//! Why a trait: the collective launchers, the clique (contexts, streams, kernel modules), the
//! peer probe and the symmetric allocations are the same code on both vendors; only these
//! entry points differ. `kernels::gpu` is written once against this trait instead of being
//! copied per vendor. Each method is a thin call into the vendor's result layer, so errors
//! still name the vendor call and the device.
//!
//! [`Interop`] adds what the runtime behind XLA's FFI handlers (`kernels::gpu::xla`) needs on
//! top: IPC handles of allocations and their mappings in other processes, host-mapped memory,
//! XLA's (foreign) streams with stream-ordered copies and fills, and the free-memory query.
//! HIP's `gcnArchName` is not here (read in `kernels::rocm`).

use std::ffi::c_void;
use std::fmt::Debug;

use crate::Result;

/// A GPU runtime's device layer: the handle types and the calls the collective launchers,
/// the clique and the peer probe make. Implemented by marker types; every method is an
/// associated function so the handle types stay the vendor modules' own.
pub trait Gpu: Debug + Send + Sync + 'static {
    /// `"cuda"` or `"rocm"`: names the backend in errors and peer-table keys.
    const NAME: &'static str;

    /// One device, made current with [`Gpu::bind`]. Declared last in owners, so modules,
    /// streams and buffers drop first.
    type Context: Debug + Send + Sync;
    /// A loaded code object.
    type Module: Debug + Send + Sync;
    /// A kernel entry point of a module.
    type Function: Debug + Send + Sync;
    /// A non-blocking stream.
    type Stream: Debug + Send + Sync;
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

/// Bytes of an IPC memory handle: `CUipcMemHandle` and `hipIpcMemHandle_t` are both a
/// 64-byte `reserved` array.
pub const IPC_HANDLE_BYTES: usize = 64;

/// What a runtime living inside another library's executor (XLA's FFI handlers) needs from a
/// device layer beyond [`Gpu`]: buffers that other processes of the host can open (IPC),
/// page-locked host words a kernel writes and the host reads without synchronising, the
/// other library's streams (borrowed, never destroyed) with stream-ordered copies and fills,
/// and each device's free memory. Implemented by [`crate::cuda::Cuda`] (the CUDA driver) and,
/// with feature `rocm`, [`crate::hip::Hip`] (HIP's documented runtime API).
pub trait Interop: Gpu {
    /// Page-locked host memory mapped into a device's address space, freed on drop.
    type HostMapped: Debug + Send + Sync;
    /// Another process's allocation opened from its IPC handle, closed on drop.
    type IpcMapping: Debug + Send + Sync;
    /// A stream another library owns, borrowed for one call: it launches like a
    /// [`Gpu::Stream`] and is never destroyed here.
    type ForeignStream: Debug + std::ops::Deref<Target = Self::Stream>;

    /// Number of visible devices (an error where the runtime library cannot be loaded).
    fn device_count() -> Result<usize>;
    /// Free device memory of `ctx`'s device, in bytes.
    fn free_memory(ctx: &Self::Context) -> Result<usize>;
    /// The buffer's length in bytes, as asked for.
    fn buffer_len(buf: &Self::Buffer) -> usize;
    /// The allocation's IPC handle, which another process of the host opens with
    /// [`Interop::ipc_open`] while this buffer lives.
    fn ipc_handle(buf: &Self::Buffer) -> Result<[u8; IPC_HANDLE_BYTES]>;
    /// Opens another process's `handle` on `ctx`'s device (peer access to the allocation's
    /// device enabled lazily). Fails in the process that exported it.
    fn ipc_open(ctx: &Self::Context, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Self::IpcMapping>;
    /// The mapping's device address in this process.
    fn ipc_ptr(m: &Self::IpcMapping) -> u64;
    /// `words` zeroed 32-bit words (at least one) of host memory mapped into `ctx`'s device.
    fn host_mapped(ctx: &Self::Context, words: usize) -> Result<Self::HostMapped>;
    /// The device address of the mapped words.
    fn host_mapped_device_ptr(h: &Self::HostMapped) -> u64;
    /// Reads word `i` (a device may be writing it). Panics if `i` is out of range.
    fn host_mapped_load(h: &Self::HostMapped, i: usize) -> u32;
    /// Writes word `i`. Panics if `i` is out of range.
    fn host_mapped_store(h: &Self::HostMapped, i: usize, v: u32);
    /// Borrows the raw stream `raw` of device `ordinal`.
    ///
    /// # Safety
    /// `raw` is a live stream of device `ordinal` (or null, the default stream) that outlives
    /// the value.
    unsafe fn foreign_stream(raw: *mut c_void, ordinal: usize) -> Self::ForeignStream;
    /// Enqueues a device-to-device copy of `len` bytes on `stream` (same or peer device,
    /// unified addressing).
    ///
    /// # Safety
    /// `dst` and `src` are device allocations of at least `len` bytes that stay valid until
    /// the copy completes.
    unsafe fn copy_d2d_async(stream: &Self::Stream, dst: u64, src: u64, len: usize) -> Result<()>;
    /// Enqueues a fill of `len` bytes with `v` on `stream`.
    ///
    /// # Safety
    /// `dst` is a device allocation of at least `len` bytes, valid until the fill completes.
    unsafe fn memset_async(stream: &Self::Stream, dst: u64, v: u8, len: usize) -> Result<()>;
}

/// Implements [`Gpu`] for a vendor module's marker type by forwarding to that module's owners
/// (`Context`, `Module`, `Function`, `Stream` and `DeviceBuffer`, which both vendor modules
/// define with the same shapes). Only the names that differ are arguments:
/// the compute-unit query and the allocation that peers may access while kernels run.
macro_rules! forward_gpu {
    ($marker:ty, name: $name:literal, units: $units:ident, alloc: $alloc:ident) => {
        impl $crate::gpu::Gpu for $marker {
            const NAME: &'static str = $name;
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
