//! One device-layer interface for the GPU runtimes: [`Gpu`], implemented by [`crate::cuda::Cuda`] and, with feature
//! `rocm`, [`crate::hip::Hip`], so `kernels::gpu` (launchers, clique, peer probe, symmetric allocations) is written
//! once. The calls are methods of the vendor modules' own handle types ([`GpuContext`], [`GpuModule`], [`GpuStream`],
//! [`GpuBuffer`]); each is a thin call whose errors still name the vendor call and the device. [`Interop`] adds what
//! the runtime behind XLA's handlers needs: IPC, host-mapped memory, XLA's streams with stream-ordered copies and
//! fills, free memory.

use std::ffi::c_void;
use std::fmt::Debug;

use crate::Result;

/// A GPU runtime's device layer: the handle types whose methods the collective launchers, the clique and the peer probe
/// call. Implemented by marker types; the handle types stay the vendor modules' own.
pub trait Gpu: Debug + Send + Sync + Sized + 'static {
    /// `"cuda"` or `"rocm"`: names the backend in errors and peer-table keys.
    const NAME: &'static str;

    /// One device, made current with [`GpuContext::bind`]. Declared last in owners, so modules, streams and buffers
    /// drop first.
    type Context: GpuContext<Self>;
    /// A loaded code object.
    type Module: GpuModule<Self>;
    /// A kernel entry point of a module.
    type Function: Debug + Send + Sync;
    /// A non-blocking stream.
    type Stream: GpuStream<Self>;
    /// A zeroed device allocation peers may read, write and poll while kernels run.
    type Buffer: GpuBuffer<Self>;
}

/// A device of [`Gpu`] `G` (its primary context on CUDA).
pub trait GpuContext<G: Gpu>: Debug + Send + Sync + Sized {
    /// Opens device `ordinal` and makes it current.
    fn new(ordinal: usize) -> Result<Self>;
    /// Makes the device current on the calling thread.
    fn bind(&self) -> Result<()>;
    /// The device's marketing name.
    fn name(&self) -> Result<String>;
    /// Streaming multiprocessors (CUDA) or compute units (HIP).
    fn compute_units(&self) -> Result<i32>;
    /// Whether the runtime reports that this device's kernels can access `peer`'s memory.
    fn can_access_peer(&self, peer: &Self) -> Result<bool>;
    /// Lets kernels on this device access `peer`'s memory. Enabling twice is not an error.
    fn enable_peer_access(&self, peer: &Self) -> Result<()>;
    /// Loads a code object (a cubin or a HIP code object) on the device.
    fn load_module(&self, image: &[u8]) -> Result<G::Module>;
    /// Whether the device takes stream memory operations ([`GpuStream::write_u32`], [`GpuStream::wait_u32`]): what
    /// the copy-engine collectives synchronise with.
    fn stream_mem_ops(&self) -> Result<bool>;
}

/// A loaded code object of [`Gpu`] `G`.
pub trait GpuModule<G: Gpu>: Debug + Send + Sync {
    /// Looks up kernel `name`.
    fn function(&self, name: &str) -> Result<G::Function>;
}

/// A stream of [`Gpu`] `G`: its own non-blocking stream, or (for [`Interop`]) another library's, borrowed.
pub trait GpuStream<G: Gpu>: Debug + Send + Sync + Sized {
    /// A new non-blocking stream on `ctx`'s device.
    fn new(ctx: &G::Context) -> Result<Self>;
    /// Borrows the raw stream `raw` of device `ordinal`: it launches like a stream of this layer and is never destroyed
    /// here.
    ///
    /// # Safety
    /// `raw` is a live stream of device `ordinal` (or null, the default stream) that outlives the value.
    unsafe fn foreign(raw: *mut c_void, ordinal: usize) -> Borrowed<Self>;
    /// Waits for all work enqueued on the stream.
    fn synchronize(&self) -> Result<()>;
    /// Launches `f` with `grid` blocks of `block` threads and `params` (pointers to each argument, in the kernel's
    /// order).
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list in number, order and layout, and every pointer argument must
    /// stay valid until the kernel finishes.
    unsafe fn launch(&self, f: &G::Function, grid: u32, block: u32, params: &mut [*mut c_void]) -> Result<()>;
    /// Enqueues a device-to-device copy of `len` bytes (same or peer device, unified addressing).
    ///
    /// # Safety
    /// `dst` and `src` are device allocations of at least `len` bytes that stay valid until the copy completes.
    unsafe fn copy_d2d(&self, dst: u64, src: u64, len: usize) -> Result<()>;
    /// Enqueues a fill of `len` bytes with `v`.
    ///
    /// # Safety
    /// `dst` is a device allocation of at least `len` bytes, valid until the fill completes.
    unsafe fn memset_u8(&self, dst: u64, v: u8, len: usize) -> Result<()>;
    /// Enqueues a write of `v` to the 32-bit word at `addr` (this device's memory, a peer's, or host-mapped memory),
    /// after a memory fence: every write enqueued before it on this stream is visible first. A stream memory operation:
    /// no kernel, no SM.
    ///
    /// # Safety
    /// `addr` is a 4-byte aligned word of a live allocation this device can access, valid until the write completes.
    unsafe fn write_u32(&self, addr: u64, v: u32) -> Result<()>;
    /// Enqueues a wait until the 32-bit word at `addr` is at least `v` (unsigned, wrapping compare as the driver does):
    /// later work on this stream starts only after it. A stream memory operation: no kernel, no SM; it waits without
    /// bound (callers keep a watchdog).
    ///
    /// # Safety
    /// As [`GpuStream::write_u32`].
    unsafe fn wait_u32(&self, addr: u64, v: u32) -> Result<()>;
    /// Enqueues a copy of `rows` rows of `width` bytes, the rows `spitch` bytes apart at `src` and `dpitch` apart at
    /// `dst` (same or peer device): one copy-engine operation for a strided block.
    ///
    /// # Safety
    /// Every row of both ranges lies inside device allocations valid until the copy completes.
    unsafe fn copy_2d(&self, dst: u64, dpitch: usize, src: u64, spitch: usize, width: usize, rows: usize)
    -> Result<()>;
}

/// A device allocation of [`Gpu`] `G`, freed on drop.
pub trait GpuBuffer<G: Gpu>: Debug + Send + Sync + Sized {
    /// `len` bytes (at least 1), zeroed and settled, that peers may access while kernels run (plain `cuMemAlloc` on
    /// CUDA; fine-grained memory on HIP, where coarse-grained memory is coherent across devices only at kernel
    /// boundaries).
    fn alloc(ctx: &G::Context, len: usize) -> Result<Self>;
    /// The buffer's device address.
    fn ptr(&self) -> u64;
    /// The buffer's length in bytes, as asked for.
    fn size(&self) -> usize;
    /// Copies `data` into bytes `[offset, offset + data.len())`; returns once the bytes are in device memory, so work
    /// enqueued afterwards on any stream sees them.
    fn write_at(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Copies bytes `[offset, offset + out.len())` into `out` (synchronous).
    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// The allocation's IPC handle, which another process of the host opens with [`GpuIpcMapping::open`] while this
    /// buffer lives.
    fn ipc_handle(&self) -> Result<[u8; IPC_HANDLE_BYTES]>;
}

/// Bytes of an IPC memory handle: `CUipcMemHandle` and `hipIpcMemHandle_t` are both a 64-byte `reserved` array.
pub const IPC_HANDLE_BYTES: usize = 64;

/// What a runtime living inside another library's executor (XLA's FFI handlers) needs from a
/// device layer beyond [`Gpu`]: buffers that other processes of the host can open (IPC),
/// page-locked host words a kernel writes and the host reads without synchronising, the
/// other library's streams (borrowed, never destroyed: [`GpuStream::foreign`]) with stream-ordered copies and fills,
/// and each device's free memory. Implemented by [`crate::cuda::Cuda`] (the CUDA driver) and,
/// with feature `rocm`, [`crate::hip::Hip`] (HIP's documented runtime API).
pub trait Interop: Gpu {
    /// Page-locked host memory mapped into a device's address space, freed on drop: its words, which the host reads
    /// and writes and whose device address a kernel takes.
    type HostMapped: GpuHostMapped<Self>;
    /// Another process's allocation opened from its IPC handle, closed on drop.
    type IpcMapping: GpuIpcMapping<Self>;

    /// Number of visible devices (an error where the runtime library cannot be loaded).
    fn device_count() -> Result<usize>;
    /// GPU `ordinal`'s free memory in bytes, read through a context another library (XLA)
    /// already made; `None` where there is none (no context is made for the question).
    fn free_memory_if_active(ordinal: usize) -> Result<Option<usize>>;
    /// The driver's version and the visible devices' UUIDs, asking for no context: what a
    /// cached peer probe is keyed by; `None` where this vendor keeps no cached probe.
    fn machine_key() -> Result<Option<String>>;
}

/// Page-locked host words of [`Interop`] `G` mapped into a device's address space ([`HostWords`]).
pub trait GpuHostMapped<G: Gpu>: Debug + Send + Sync + Sized + std::ops::Deref<Target = HostWords> {
    /// `words` zeroed 32-bit words (at least one) of host memory mapped into `ctx`'s device.
    fn new(ctx: &G::Context, words: usize) -> Result<Self>;
    /// Page-locks the `words` words at `ptr` (host memory this process mapped, e.g. a
    /// segment shared with other processes; left as they are) and maps them into every GPU
    /// of the process; unregistered on drop. CUDA only.
    ///
    /// # Safety
    /// `ptr` holds `words` writable, page-aligned words that outlive the value.
    unsafe fn register(ctx: &G::Context, ptr: *mut c_void, words: usize) -> Result<Self>;
}

/// Another process's allocation of [`Interop`] `G`, opened from its IPC handle.
pub trait GpuIpcMapping<G: Gpu>: Debug + Send + Sync + Sized {
    /// Opens another process's `handle` on `ctx`'s device (peer access to the allocation's
    /// device enabled lazily). Fails in the process that exported it.
    fn open(ctx: &G::Context, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Self>;
    /// The mapping's device address in this process.
    fn ptr(&self) -> u64;
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
/// the vendor's stream `S` and is never destroyed here ([`GpuStream::foreign`]).
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
