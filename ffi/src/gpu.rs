//! One device-layer interface for the GPU runtimes: [`Gpu`], implemented by [`crate::cuda::Cuda`] and, with feature
//! `rocm`, [`crate::hip::Hip`], so `kernels::gpu` (launchers, clique, peer probe, symmetric allocations) is written
//! once; each method is a thin call whose errors still name the vendor call and the device. [`Interop`] adds what the
//! runtime behind XLA's handlers needs: IPC, host-mapped memory, XLA's streams with stream-ordered copies and fills,
//! free memory.

use std::ffi::c_void;
use std::fmt::Debug;

use crate::Result;

/// A GPU runtime's device layer: the handle types and the calls the collective launchers, the clique and the peer probe
/// make. Implemented by marker types; every method is an associated function so the handle types stay the vendor
/// modules' own.
pub trait Gpu: Debug + Send + Sync + 'static {
    /// `"cuda"` or `"rocm"`: names the backend in errors and peer-table keys.
    const NAME: &'static str;

    /// One device, made current with [`Gpu::bind`]. Declared last in owners, so modules, streams and buffers drop
    /// first.
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
    /// `params` must match the kernel's parameter list in number, order and layout, and every pointer argument must
    /// stay valid until the kernel finishes.
    unsafe fn launch(
        stream: &Self::Stream,
        f: &Self::Function,
        grid: u32,
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()>;
    /// `len` bytes (at least 1), zeroed and settled, that peers may access while kernels run (plain `cuMemAlloc` on
    /// CUDA; fine-grained memory on HIP, where coarse-grained memory is coherent across devices only at kernel
    /// boundaries).
    fn alloc(ctx: &Self::Context, len: usize) -> Result<Self::Buffer>;
    /// The buffer's device address.
    fn ptr(buf: &Self::Buffer) -> u64;
    /// Copies the buffer's first `out.len()` bytes to the host (synchronous).
    fn read(buf: &Self::Buffer, out: &mut [u8]) -> Result<()>;
    /// Copies `data` to the buffer's first bytes (synchronous).
    fn write(buf: &Self::Buffer, data: &[u8]) -> Result<()>;
}

/// Bytes of an IPC memory handle: `CUipcMemHandle` and `hipIpcMemHandle_t` are both a 64-byte `reserved` array.
pub const IPC_HANDLE_BYTES: usize = 64;

/// What a runtime living inside another library's executor (XLA's FFI handlers) needs from a
/// device layer beyond [`Gpu`]: buffers that other processes of the host can open (IPC),
/// page-locked host words a kernel writes and the host reads without synchronising, the
/// other library's streams (borrowed, never destroyed) with stream-ordered copies and fills,
/// and each device's free memory. Implemented by [`crate::cuda::Cuda`] (the CUDA driver) and,
/// with feature `rocm`, [`crate::hip::Hip`] (HIP's documented runtime API).
pub trait Interop: Gpu {
    /// Page-locked host memory mapped into a device's address space, freed on drop: its words, which the host reads
    /// and writes and whose device address a kernel takes.
    type HostMapped: Debug + Send + Sync + std::ops::Deref<Target = HostWords>;
    /// Another process's allocation opened from its IPC handle, closed on drop.
    type IpcMapping: Debug + Send + Sync;
    /// A stream another library owns, borrowed for one call: it launches like a
    /// [`Gpu::Stream`] and is never destroyed here.
    type ForeignStream: Debug + std::ops::Deref<Target = Self::Stream>;

    /// Number of visible devices (an error where the runtime library cannot be loaded).
    fn device_count() -> Result<usize>;
    /// GPU `ordinal`'s free memory in bytes, read through a context another library (XLA)
    /// already made; `None` where there is none (no context is made for the question).
    fn free_memory_if_active(ordinal: usize) -> Result<Option<usize>>;
    /// The driver's version and the visible devices' UUIDs, asking for no context: what a
    /// cached peer probe is keyed by; `None` where this vendor keeps no cached probe.
    fn machine_key() -> Result<Option<String>>;
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
    /// Page-locks the `words` words at `ptr` (host memory this process mapped, e.g. a
    /// segment shared with other processes; left as they are) and maps them into every GPU
    /// of the process; unregistered on drop. CUDA only.
    ///
    /// # Safety
    /// `ptr` holds `words` writable, page-aligned words that outlive the value.
    unsafe fn host_register(ctx: &Self::Context, ptr: *mut c_void, words: usize) -> Result<Self::HostMapped>;
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
    /// Whether `ctx`'s device takes stream memory operations ([`Interop::write_value32_async`],
    /// [`Interop::wait_value32_async`]): what the copy-engine collectives synchronise with.
    fn stream_mem_ops(ctx: &Self::Context) -> Result<bool>;
    /// Enqueues a write of `v` to the word at `addr` on `stream`, after a fence (earlier
    /// writes of the stream land first): no kernel.
    ///
    /// # Safety
    /// `addr` is an aligned word of an allocation the stream's device can access (its own,
    /// a peer's or host-mapped memory), valid until the write completes.
    unsafe fn write_value32_async(stream: &Self::Stream, addr: u64, v: u32) -> Result<()>;
    /// Enqueues a wait until the word at `addr` is at least `v`: no kernel, no bound (callers
    /// keep a watchdog).
    ///
    /// # Safety
    /// As [`Interop::write_value32_async`].
    unsafe fn wait_value32_async(stream: &Self::Stream, addr: u64, v: u32) -> Result<()>;
    /// Enqueues a copy of `rows` rows of `width` bytes, `spitch` apart at `src` and `dpitch`
    /// apart at `dst` (same or peer device): one copy-engine operation.
    ///
    /// # Safety
    /// Every row of both ranges lies in device allocations valid until the copy completes.
    unsafe fn copy_2d_async(
        stream: &Self::Stream,
        dst: u64,
        dpitch: usize,
        src: u64,
        spitch: usize,
        width: usize,
        rows: usize,
    ) -> Result<()>;
}

/// Checks that `n` bytes at `offset` lie inside a buffer of `len` bytes: an [`crate::Error::Invalid`] such as "write of
/// 8 bytes at 4 into 10" where not (`access`: "write of" / "read of", `prep`: "into" / "from"). `Ok(false)` when `n` is
/// 0: there is nothing to copy.
pub(crate) fn check_range(access: &str, n: usize, offset: usize, prep: &str, len: usize) -> Result<bool> {
    if offset.checked_add(n).is_none_or(|end| end > len) {
        return Err(crate::Error::Invalid(format!("{access} {n} bytes at {offset} {prep} {len}")));
    }
    Ok(n > 0)
}

/// A stream another library owns (XLA's, handed to an FFI handler), borrowed for one call: it launches and copies like
/// the vendor's stream `S` and is never destroyed here. Each vendor module names it `ForeignStream` (`forward_gpu`
/// declares it).
#[derive(Debug)]
pub struct Borrowed<S>(std::mem::ManuallyDrop<S>);

impl<S> Borrowed<S> {
    /// Wraps a stream value that must never be dropped.
    pub(crate) fn wrap(s: S) -> Borrowed<S> {
        Borrowed(std::mem::ManuallyDrop::new(s))
    }
}

impl<S> std::ops::Deref for Borrowed<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.0
    }
}

/// Zeroed 32-bit words of page-locked host memory mapped into a device's address space: a kernel writes them, and the
/// host reads them later without synchronising a stream (a collective's timeout status). The vendor's `HostMapped`
/// allocates and frees them.
#[derive(Debug)]
pub struct HostWords {
    ptr: *mut u32,
    words: usize,
    /// The device address of the same words.
    pub device_ptr: u64,
}
// SAFETY: plain host memory owned by the vendor's `HostMapped`; the host touches it only through volatile word
// accesses, which tolerate a concurrent device writer.
crate::send_sync!(HostWords);

impl HostWords {
    /// Takes the `words` words at `ptr` and zeroes them; the device address is set once known.
    ///
    /// # Safety
    /// `ptr` holds `words` writable, aligned 32-bit words that outlive the value.
    pub(crate) unsafe fn zeroed(ptr: *mut c_void, words: usize) -> HostWords {
        let ptr = ptr.cast::<u32>();
        // SAFETY: the caller guarantees `words` writable words at `ptr`.
        unsafe { std::ptr::write_bytes(ptr, 0, words) };
        HostWords { ptr, words, device_ptr: 0 }
    }

    /// Takes the `words` words at `ptr` as they are (memory another process may already be using); the device address
    /// is set once known.
    ///
    /// # Safety
    /// As [`HostWords::zeroed`].
    pub(crate) unsafe fn at(ptr: *mut c_void, words: usize) -> HostWords {
        HostWords { ptr: ptr.cast(), words, device_ptr: 0 }
    }

    /// The host address, for the vendor's free.
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.ptr.cast()
    }

    /// Reads word `i` (a device may be writing it).
    pub fn load(&self, i: usize) -> u32 {
        assert!(i < self.words, "word {i} of a {}-byte mapping", self.words * 4);
        // SAFETY: in bounds (asserted); volatile because a device writes the word behind the compiler's back.
        unsafe { std::ptr::read_volatile(self.ptr.add(i)) }
    }

    /// Writes word `i`.
    pub fn store(&self, i: usize, v: u32) {
        assert!(i < self.words, "word {i} of a {}-byte mapping", self.words * 4);
        // SAFETY: as in `load`.
        unsafe { std::ptr::write_volatile(self.ptr.add(i), v) }
    }
}

/// Implements [`Gpu`] and [`Interop`] for a vendor module's marker type by forwarding to that module's owners
/// (`Context`, `Module`, `Function`, `Stream`, `DeviceBuffer`, `HostMapped` and `IpcMapping`, which both vendor modules
/// define with the same shapes), declares the module's `ForeignStream` and makes `HostMapped` deref to its words. Only
/// the names that differ are arguments: the compute-unit query and the allocation that peers may access while kernels
/// run.
macro_rules! forward_gpu {
    ($marker:ty, name: $name:literal, units: $units:ident, alloc: $alloc:ident) => {
        /// A stream another library owns (XLA's, handed to an FFI handler), borrowed for one call
        /// ([`Interop::foreign_stream`](crate::gpu::Interop::foreign_stream)).
        pub type ForeignStream = $crate::gpu::Borrowed<Stream>;

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
            fn read(buf: &DeviceBuffer, out: &mut [u8]) -> Result<()> {
                buf.read_at(0, out)
            }
            fn write(buf: &DeviceBuffer, data: &[u8]) -> Result<()> {
                buf.write_at(0, data)
            }
        }

        impl std::ops::Deref for HostMapped {
            type Target = $crate::gpu::HostWords;
            fn deref(&self) -> &$crate::gpu::HostWords {
                &self.words
            }
        }

        impl $crate::gpu::Interop for $marker {
            type HostMapped = HostMapped;
            type IpcMapping = IpcMapping;
            type ForeignStream = ForeignStream;

            fn device_count() -> Result<usize> {
                device_count()
            }
            fn free_memory_if_active(ordinal: usize) -> Result<Option<usize>> {
                free_memory_if_active(ordinal)
            }
            fn machine_key() -> Result<Option<String>> {
                machine_key()
            }
            fn buffer_len(buf: &DeviceBuffer) -> usize {
                buf.len
            }
            fn ipc_handle(buf: &DeviceBuffer) -> Result<[u8; $crate::gpu::IPC_HANDLE_BYTES]> {
                buf.ipc_handle()
            }
            fn ipc_open(ctx: &Context, handle: &[u8; $crate::gpu::IPC_HANDLE_BYTES]) -> Result<IpcMapping> {
                IpcMapping::open(ctx, handle)
            }
            fn ipc_ptr(m: &IpcMapping) -> u64 {
                m.ptr
            }
            fn host_mapped(ctx: &Context, words: usize) -> Result<HostMapped> {
                HostMapped::new(ctx, words)
            }
            unsafe fn host_register(ctx: &Context, ptr: *mut std::ffi::c_void, words: usize) -> Result<HostMapped> {
                // SAFETY: the caller's contract is `HostMapped::register`'s.
                unsafe { HostMapped::register(ctx, ptr, words) }
            }
            unsafe fn foreign_stream(raw: *mut std::ffi::c_void, ordinal: usize) -> ForeignStream {
                // `raw` being a live stream of `ordinal` is this method's contract.
                $crate::gpu::Borrowed::wrap(Stream { s: raw.cast(), ordinal })
            }
            unsafe fn copy_d2d_async(stream: &Stream, dst: u64, src: u64, len: usize) -> Result<()> {
                // SAFETY: the caller's contract is `Stream::copy_d2d`'s.
                unsafe { stream.copy_d2d(dst, src, len) }
            }
            unsafe fn memset_async(stream: &Stream, dst: u64, v: u8, len: usize) -> Result<()> {
                // SAFETY: the caller's contract is `Stream::memset_u8`'s.
                unsafe { stream.memset_u8(dst, v, len) }
            }
            fn stream_mem_ops(ctx: &Context) -> Result<bool> {
                ctx.stream_mem_ops()
            }
            unsafe fn write_value32_async(stream: &Stream, addr: u64, v: u32) -> Result<()> {
                // SAFETY: the caller's contract is `Stream::write_u32`'s.
                unsafe { stream.write_u32(addr, v) }
            }
            unsafe fn wait_value32_async(stream: &Stream, addr: u64, v: u32) -> Result<()> {
                // SAFETY: the caller's contract is `Stream::wait_u32`'s.
                unsafe { stream.wait_u32(addr, v) }
            }
            unsafe fn copy_2d_async(
                stream: &Stream,
                dst: u64,
                dpitch: usize,
                src: u64,
                spitch: usize,
                width: usize,
                rows: usize,
            ) -> Result<()> {
                // SAFETY: the caller's contract is `Stream::copy_2d`'s.
                unsafe { stream.copy_2d(dst, dpitch, src, spitch, width, rows) }
            }
        }
    };
}
pub(crate) use forward_gpu;
