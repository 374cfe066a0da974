//! The CUDA driver: result layer (every status → [`Error::Call`] naming call and device) and small owners. Contexts are
//! the devices' primary contexts; memory is plain `cuMemAlloc` (never managed memory).

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::result as r;
use cudarc::driver::sys;

use crate::gpu::{self, GpuBuffer, GpuContext, GpuHostMapped, GpuIpcMapping, GpuModule, GpuStream, IPC_HANDLE_BYTES};
use crate::{Error, Result, guarded};

/// Maps a driver status to an [`Error`] naming the call and the device.
fn ck<T>(call: &'static str, dev: Option<usize>, res: Result<T, r::DriverError>) -> Result<T> {
    res.map_err(|e| {
        let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let text = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Error::Call { call, device: dev, status: format!("{name} ({}): {text}", e.0 as i32) }
    })
}

/// Runs a driver call guarded against missing symbols and checks its status.
fn call<T>(name: &'static str, dev: Option<usize>, f: impl FnOnce() -> Result<T, r::DriverError>) -> Result<T> {
    ck(name, dev, guarded(name, dev, f)?)
}

/// Raw status → result, for `sys` calls cudarc has no result wrapper for.
fn st(s: sys::CUresult) -> Result<(), r::DriverError> {
    s.result()
}

/// Probes libcuda and runs `cuInit` once.
pub fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !crate::libs::cuda_present() {
            return Err(Error::Library {
                lib: "libcuda",
                reason: "libcuda.so.1 not found on the loader path (no NVIDIA driver on this machine?)".into(),
            });
        }
        call("cuInit", None, r::init)
    })
    .clone()
}

/// Number of visible devices.
pub fn device_count() -> Result<usize> {
    init()?;
    Ok(call("cuDeviceGetCount", None, r::device::get_count)?.max(0) as usize)
}

/// The driver's CUDA version (`cuDriverGetVersion`: 13000 for 13.0).
fn driver_version() -> Result<i32> {
    init()?;
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer.
    call("cuDriverGetVersion", None, || st(unsafe { sys::cuDriverGetVersion(&mut v) }))?;
    Ok(v)
}

/// A device's primary context, retained for the life of the value.
#[derive(Debug)]
pub struct Context {
    pub ordinal: usize,
    pub dev: sys::CUdevice,
    pub ctx: sys::CUcontext,
}

// SAFETY: a CUcontext handle may be used from any thread once made current there, and every method makes it current
// first; the driver serialises use of one context internally.
crate::send_sync!(Context);

impl GpuContext<Cuda> for Context {
    fn new(ordinal: usize) -> Result<Context> {
        init()?;
        let d = Some(ordinal);
        let dev = call("cuDeviceGet", d, || r::device::get(ordinal as i32))?;
        // SAFETY: `dev` is a valid device handle from cuDeviceGet.
        let ctx = call("cuDevicePrimaryCtxRetain", d, || unsafe { r::primary_ctx::retain(dev) })?;
        let c = Context { ordinal, dev, ctx };
        c.bind()?;
        Ok(c)
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: `self.ctx` is a retained primary context, valid until drop.
        call("cuCtxSetCurrent", Some(self.ordinal), || unsafe { r::ctx::set_current(self.ctx) })
    }

    fn name(&self) -> Result<String> {
        call("cuDeviceGetName", self.d(), || r::device::get_name(self.dev))
    }

    /// Whether the device takes stream memory operations (`cuStreamWriteValue32_v2` / `cuStreamWaitValue32_v2`): always
    /// from CUDA 12 on, whose drivers report the deprecated v1 attribute as 0 (seen on an H200, driver 580); before,
    /// that attribute says.
    fn stream_mem_ops(&self) -> Result<bool> {
        if driver_version()? >= 12000 {
            return Ok(true);
        }
        Ok(self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1)? != 0)
    }

    /// Streaming multiprocessors.
    fn compute_units(&self) -> Result<i32> {
        self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    }

    /// `cuDeviceCanAccessPeer(self → peer)`.
    fn can_access_peer(&self, peer: &Context) -> Result<bool> {
        let mut v = 0i32;
        call("cuDeviceCanAccessPeer", self.d(), || {
            // SAFETY: both handles are valid devices; `v` outlives the call.
            st(unsafe { sys::cuDeviceCanAccessPeer(&mut v, self.dev, peer.dev) })
        })?;
        Ok(v != 0)
    }

    /// Lets kernels in this context access `peer`'s memory. Enabling twice is not an error.
    fn enable_peer_access(&self, peer: &Context) -> Result<()> {
        self.bind()?;
        // SAFETY: `peer.ctx` is a retained context; this context is current.
        let s = guarded("cuCtxEnablePeerAccess", self.d(), || unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) })?;
        if s == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        ck("cuCtxEnablePeerAccess", self.d(), st(s))
    }

    /// Loads a CUBIN or PTX image (NUL-terminated for PTX).
    fn load_module(&self, image: &[u8]) -> Result<Module> {
        self.bind()?;
        let mut img = image.to_vec();
        img.push(0);
        // SAFETY: `img` is a complete image that outlives the call (the driver copies it).
        let m = call("cuModuleLoadData", self.d(), || unsafe { r::module::load_data(img.as_ptr() as *const c_void) })?;
        Ok(Module { m, ordinal: self.ordinal })
    }
}

impl Context {
    fn d(&self) -> Option<usize> {
        Some(self.ordinal)
    }

    /// Free and total device memory of this context's GPU, in bytes (`cuMemGetInfo`).
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        call("cuMemGetInfo", self.d(), r::mem_get_info)
    }

    pub fn attribute(&self, a: sys::CUdevice_attribute) -> Result<i32> {
        // SAFETY: `self.dev` is a valid device handle.
        call("cuDeviceGetAttribute", self.d(), || unsafe { r::device::get_attribute(self.dev, a) })
    }

    /// (major, minor) compute capability.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        Ok((
            self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: releases the retain taken in `new`, once.
        let _ = guarded("cuDevicePrimaryCtxRelease", self.d(), || unsafe { r::primary_ctx::release(self.dev) });
    }
}

/// A loaded module; lives as long as its context (never unloaded while the context lives).
#[derive(Debug)]
pub struct Module {
    m: sys::CUmodule,
    ordinal: usize,
}

/// A kernel entry point.
#[derive(Debug, Clone, Copy)]
pub struct Function {
    pub f: sys::CUfunction,
    pub ordinal: usize,
}

// SAFETY: module, function and stream handles are context-wide and usable from any thread (streams with their context
// current); modules and functions are immutable.
crate::send_sync!(Module, Function, Stream);

impl GpuModule<Cuda> for Module {
    fn function(&self, name: &str) -> Result<Function> {
        let n = std::ffi::CString::new(name).map_err(|_| Error::Invalid(format!("kernel name {name:?}")))?;
        // SAFETY: `self.m` is a loaded module; `n` outlives the call.
        let f = call("cuModuleGetFunction", Some(self.ordinal), || unsafe { r::module::get_function(self.m, n) })?;
        Ok(Function { f, ordinal: self.ordinal })
    }
}

/// A non-blocking stream.
#[derive(Debug)]
pub struct Stream {
    pub s: sys::CUstream,
    pub ordinal: usize,
}

impl GpuStream<Cuda> for Stream {
    fn new(ctx: &Context) -> Result<Stream> {
        ctx.bind()?;
        let s = call("cuStreamCreate", Some(ctx.ordinal), || r::stream::create(r::stream::StreamKind::NonBlocking))?;
        Ok(Stream { s, ordinal: ctx.ordinal })
    }

    unsafe fn foreign(raw: *mut c_void, ordinal: usize) -> gpu::Borrowed<Stream> {
        // `raw` being a live stream of `ordinal` is this method's contract.
        gpu::Borrowed::wrap(Stream { s: raw.cast(), ordinal })
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: `self.s` is a live stream.
        call("cuStreamSynchronize", Some(self.ordinal), || unsafe { r::stream::synchronize(self.s) })
    }

    unsafe fn launch(&self, f: &Function, grid: u32, block: u32, params: &mut [*mut c_void]) -> Result<()> {
        // SAFETY: the caller guarantees the parameter list; `f` belongs to this stream's context.
        call("cuLaunchKernel", Some(self.ordinal), || unsafe {
            r::launch_kernel(f.f, (grid, 1, 1), (block, 1, 1), 0, self.s, params)
        })
    }

    unsafe fn copy_d2d(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        // SAFETY: the caller guarantees both ranges.
        call("cuMemcpyDtoDAsync", Some(self.ordinal), || unsafe { r::memcpy_dtod_async(dst, src, len, self.s) })
    }

    unsafe fn memset_u8(&self, dst: u64, v: u8, len: usize) -> Result<()> {
        // SAFETY: the caller guarantees the range.
        call("cuMemsetD8Async", Some(self.ordinal), || unsafe { r::memset_d8_async(dst, v, len, self.s) })
    }

    unsafe fn write_u32(&self, addr: u64, v: u32) -> Result<()> {
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as std::ffi::c_uint;
        call("cuStreamWriteValue32", Some(self.ordinal), || {
            // SAFETY: the caller guarantees the word; `self.s` is a live stream.
            st(unsafe { sys::cuStreamWriteValue32_v2(self.s, addr, v, flags) })
        })
    }

    unsafe fn wait_u32(&self, addr: u64, v: u32) -> Result<()> {
        let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as std::ffi::c_uint;
        call("cuStreamWaitValue32", Some(self.ordinal), || {
            // SAFETY: the caller guarantees the word; `self.s` is a live stream.
            st(unsafe { sys::cuStreamWaitValue32_v2(self.s, addr, v, flags) })
        })
    }

    unsafe fn copy_2d(
        &self,
        dst: u64,
        dpitch: usize,
        src: u64,
        spitch: usize,
        width: usize,
        rows: usize,
    ) -> Result<()> {
        // Every field written out: the memory-type enum has no zero value.
        let p = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src,
            srcArray: std::ptr::null_mut(),
            srcPitch: spitch,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst,
            dstArray: std::ptr::null_mut(),
            dstPitch: dpitch,
            WidthInBytes: width,
            Height: rows,
        };
        // SAFETY: the caller guarantees both ranges; `p` outlives the call (the driver copies it).
        call("cuMemcpy2DAsync", Some(self.ordinal), || st(unsafe { sys::cuMemcpy2DAsync_v2(&p, self.s) }))
    }
}

impl Stream {
    /// Starts capturing this stream's work into a graph ([`Stream::end_capture`]); nothing runs until the graph is
    /// launched. Thread-local mode: other threads' CUDA calls are unaffected.
    pub fn begin_capture(&self) -> Result<()> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: `self.s` is a live stream.
        call("cuStreamBeginCapture", Some(self.ordinal), || unsafe { r::stream::begin_capture(self.s, mode) })
    }

    /// Ends the capture [`Stream::begin_capture`] started and instantiates what it recorded.
    pub fn end_capture(&self) -> Result<Graph> {
        // SAFETY: `self.s` is a live stream being captured by this thread.
        let graph = call("cuStreamEndCapture", Some(self.ordinal), || unsafe { r::stream::end_capture(self.s) })?;
        // SAFETY: `graph` was just captured; it is destroyed once, below or by `Graph`'s drop.
        let exec = call("cuGraphInstantiate", Some(self.ordinal), || unsafe {
            r::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0))
        });
        let g = Graph { graph, exec: std::ptr::null_mut(), ordinal: self.ordinal };
        Ok(Graph { exec: exec?, ..g })
    }
}

/// A captured and instantiated CUDA graph ([`Stream::end_capture`]), destroyed on drop.
#[derive(Debug)]
pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ordinal: usize,
}

// SAFETY: graph handles are plain driver handles; launching one from any thread is allowed.
crate::send_sync!(Graph);

impl Graph {
    /// Replays the graph on `stream`.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        // SAFETY: `self.exec` is a live executable graph and `stream` a live stream.
        call("cuGraphLaunch", Some(self.ordinal), || unsafe { r::graph::launch(self.exec, stream.s) })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if !self.exec.is_null() {
            // SAFETY: destroys the executable graph made in `end_capture`, once.
            let _ = guarded("cuGraphExecDestroy", Some(self.ordinal), || unsafe { r::graph::exec_destroy(self.exec) });
        }
        // SAFETY: destroys the captured graph, once.
        let _ = guarded("cuGraphDestroy", Some(self.ordinal), || unsafe { r::graph::destroy(self.graph) });
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: destroys the stream created in `new`, once; pending work completes first.
        let _ = guarded("cuStreamDestroy", Some(self.ordinal), || unsafe { r::stream::destroy(self.s) });
    }
}

/// Page-locked host memory mapped into the device's address space ([`crate::gpu::HostWords`]): allocated here, or
/// another mapping registered ([`HostMapped::register`]).
#[derive(Debug)]
pub struct HostMapped {
    pub words: crate::gpu::HostWords,
    ordinal: usize,
    ctx: sys::CUcontext,
    /// Registered, not allocated: unregistered on drop, its owner frees it.
    registered: bool,
}

// SAFETY: host words (`Send`) and device addresses, immutable; the owning context handle is only bound to free or close
// them.
crate::send_sync!(HostMapped, DeviceBuffer, IpcMapping);

impl GpuHostMapped<Cuda> for HostMapped {
    fn new(ctx: &Context, words: usize) -> Result<HostMapped> {
        ctx.bind()?;
        let words = words.max(1);
        const PORTABLE_DEVICEMAP: u32 = 0x01 | 0x02; // CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP
        // SAFETY: a fresh host allocation; freed once in `drop`.
        let ptr = call("cuMemHostAlloc", ctx.d(), || unsafe { r::malloc_host(words * 4, PORTABLE_DEVICEMAP) })?;
        // SAFETY: `ptr` holds `words` writable, page-aligned words just allocated, owned by `m`.
        let words = unsafe { crate::gpu::HostWords::zeroed(ptr, words) };
        HostMapped { words, ordinal: ctx.ordinal, ctx: ctx.ctx, registered: false }.mapped(ctx)
    }

    /// Registers the `words` words at `ptr` (left as they are), portable (every context of the process) and mapped, and
    /// looks up their device address.
    unsafe fn register(ctx: &Context, ptr: *mut c_void, words: usize) -> Result<HostMapped> {
        ctx.bind()?;
        const PORTABLE_DEVICEMAP: u32 = 0x01 | 0x02; // CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP
        call("cuMemHostRegister", ctx.d(), || {
            // SAFETY: the caller guarantees `words` words of host memory at `ptr`.
            st(unsafe { sys::cuMemHostRegister_v2(ptr, words * 4, PORTABLE_DEVICEMAP) })
        })?;
        // SAFETY: the caller guarantees the words; registered above, unregistered in `drop`.
        let words = unsafe { crate::gpu::HostWords::at(ptr, words) };
        HostMapped { words, ordinal: ctx.ordinal, ctx: ctx.ctx, registered: true }.mapped(ctx)
    }
}

impl std::ops::Deref for HostMapped {
    type Target = gpu::HostWords;
    fn deref(&self) -> &gpu::HostWords {
        &self.words
    }
}

impl HostMapped {
    /// Looks up the device address of the words (allocated or registered mapped in `ctx`); on failure, dropping `self`
    /// frees or unregisters them.
    fn mapped(mut self, ctx: &Context) -> Result<HostMapped> {
        let ptr = self.words.ptr();
        call("cuMemHostGetDevicePointer", ctx.d(), || {
            // SAFETY: `ptr` is host memory mapped for this context; the out-pointer is valid.
            st(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut self.words.device_ptr, ptr, 0) })
        })?;
        Ok(self)
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        // SAFETY: `self.ctx` is the owning primary context, retained while buffers exist.
        if guarded("cuCtxSetCurrent", Some(self.ordinal), || unsafe { r::ctx::set_current(self.ctx) }).is_ok() {
            if self.registered {
                let _ = guarded("cuMemHostUnregister", Some(self.ordinal), || {
                    // SAFETY: unregisters the range `register` registered, once; its owner frees it.
                    st(unsafe { sys::cuMemHostUnregister(self.words.ptr()) })
                });
            } else {
                // SAFETY: frees the allocation made in `new`, once.
                let _ = guarded("cuMemFreeHost", Some(self.ordinal), || unsafe { r::free_host(self.words.ptr()) });
            }
        }
    }
}

/// A plain device allocation (`cuMemAlloc`), freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    pub ptr: u64,
    pub len: usize,
    pub ordinal: usize,
    ctx: sys::CUcontext,
}

impl GpuBuffer<Cuda> for DeviceBuffer {
    /// Allocates `len` bytes (at least 1) and zeroes them.
    fn alloc(ctx: &Context, len: usize) -> Result<DeviceBuffer> {
        ctx.bind()?;
        let n = len.max(1);
        // SAFETY: allocation in the current context; no managed memory.
        let ptr = call("cuMemAlloc", Some(ctx.ordinal), || unsafe { r::malloc_sync(n) })?;
        let b = DeviceBuffer { ptr, len, ordinal: ctx.ordinal, ctx: ctx.ctx };
        // SAFETY: `ptr` is a fresh allocation of `n` bytes.
        call("cuMemsetD8", Some(ctx.ordinal), || unsafe { r::memset_d8_sync(ptr, 0, n) })?;
        // cuMemsetD8 on device memory may return before it completes, on the legacy stream, which Peerless's
        // non-blocking streams do not wait for.
        b.settle()?;
        Ok(b)
    }

    fn ptr(&self) -> u64 {
        self.ptr
    }

    fn size(&self) -> usize {
        self.len
    }

    fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        if !crate::gpu::check_range("write of", data.len(), offset, "into", self.len)? {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the destination range lies inside the allocation (checked above).
        call("cuMemcpyHtoD", Some(self.ordinal), || unsafe { r::memcpy_htod_sync(self.ptr + offset as u64, data) })?;
        self.settle()
    }

    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        if !crate::gpu::check_range("read of", out.len(), offset, "from", self.len)? {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the source range lies inside the allocation (checked above).
        call("cuMemcpyDtoH", Some(self.ordinal), || unsafe { r::memcpy_dtoh_sync(out, self.ptr + offset as u64) })
    }

    /// The allocation's IPC handle (a `cuMemAlloc` allocation; valid while this buffer lives).
    fn ipc_handle(&self) -> Result<[u8; IPC_HANDLE_BYTES]> {
        self.bind()?;
        let mut h = sys::CUipcMemHandle_st { reserved: [0; IPC_HANDLE_BYTES] };
        call("cuIpcGetMemHandle", Some(self.ordinal), || {
            // SAFETY: `self.ptr` is the base of a live `cuMemAlloc` allocation of the current context; `h` outlives the
            // call.
            st(unsafe { sys::cuIpcGetMemHandle(&mut h, self.ptr) })
        })?;
        Ok(h.reserved.map(|c| c as u8))
    }
}

impl DeviceBuffer {
    /// Waits until every copy and memset issued on the context has landed. A "synchronous" cuMemcpyHtoD from pageable
    /// memory returns once the data is staged, with the DMA still in flight on the legacy stream, which kernels on
    /// Peerless's non-blocking streams do not wait for: without this, a large argument could be read before it arrives.
    fn settle(&self) -> Result<()> {
        call("cuCtxSynchronize", Some(self.ordinal), r::ctx::synchronize)
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: `self.ctx` is the owning primary context, retained while buffers exist.
        call("cuCtxSetCurrent", Some(self.ordinal), || unsafe { r::ctx::set_current(self.ctx) })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            // SAFETY: frees the allocation made in `alloc`, once.
            let _ = guarded("cuMemFree", Some(self.ordinal), || unsafe { r::free_sync(self.ptr) });
        }
    }
}

/// Another process's device allocation, opened from its IPC handle into this process's address space (unified
/// addressing: the address is valid in every context of the process that has peer access to the allocation's device).
/// Closed on drop.
#[derive(Debug)]
pub struct IpcMapping {
    pub ptr: u64,
    pub ordinal: usize,
    ctx: sys::CUcontext,
}

impl GpuIpcMapping<Cuda> for IpcMapping {
    /// Opens `handle` in `ctx`, enabling peer access to its device lazily where it lies on another GPU. Fails in the
    /// process that exported the handle (CUDA's rule).
    fn open(ctx: &Context, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<IpcMapping> {
        ctx.bind()?;
        let h = sys::CUipcMemHandle_st { reserved: handle.map(|b| b as std::ffi::c_char) };
        let mut ptr: sys::CUdeviceptr = 0;
        let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
        call("cuIpcOpenMemHandle", Some(ctx.ordinal), || {
            // SAFETY: `h` is a handle's 64 bytes (the driver validates them and fails on garbage); `ptr` outlives the
            // call; `ctx` is current.
            st(unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, lazy) })
        })?;
        Ok(IpcMapping { ptr, ordinal: ctx.ordinal, ctx: ctx.ctx })
    }

    fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // SAFETY: `self.ctx` is the primary context the mapping was opened in (retained by the clique that owns this
        // mapping's user); the mapping is closed once.
        let bound = guarded("cuCtxSetCurrent", Some(self.ordinal), || unsafe { r::ctx::set_current(self.ctx) });
        if matches!(bound, Ok(Ok(()))) {
            // SAFETY: `self.ptr` came from cuIpcOpenMemHandle and is closed once.
            let _ =
                guarded("cuIpcCloseMemHandle", Some(self.ordinal), || unsafe { sys::cuIpcCloseMemHandle(self.ptr) });
        }
    }
}

/// The CUDA driver as a [`crate::gpu::Gpu`] device layer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cuda;

impl gpu::Gpu for Cuda {
    const NAME: &'static str = "cuda";
    type Context = Context;
    type Module = Module;
    type Function = Function;
    type Stream = Stream;
    type Buffer = DeviceBuffer;
}

impl gpu::Interop for Cuda {
    type HostMapped = HostMapped;
    type IpcMapping = IpcMapping;

    fn device_count() -> Result<usize> {
        device_count()
    }
    /// GPU `ordinal`'s free memory through its primary context where another library (XLA) already made that context
    /// active; `None` where none is active (none is made here). The calling thread's current context is restored.
    fn free_memory_if_active(ordinal: usize) -> Result<Option<usize>> {
        init()?;
        let d = Some(ordinal);
        let dev = call("cuDeviceGet", d, || r::device::get(ordinal as i32))?;
        let (mut flags, mut active) = (0u32, 0i32);
        call("cuDevicePrimaryCtxGetState", d, || {
            // SAFETY: `dev` is a valid device handle; both out-pointers are valid.
            st(unsafe { sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active) })
        })?;
        if active == 0 {
            return Ok(None);
        }
        let before = call("cuCtxGetCurrent", d, r::ctx::get_current)?;
        let free = Context::new(ordinal).and_then(|c| c.memory_info());
        // SAFETY: `before` was current on this thread (or none was): XLA's threads keep theirs.
        let _ =
            guarded("cuCtxSetCurrent", d, || unsafe { r::ctx::set_current(before.unwrap_or(std::ptr::null_mut())) });
        Ok(Some(free?.0))
    }
    /// The driver's version and every visible device's UUID, in ordinal order, asking for no context: what a peer probe
    /// of these GPUs stays true for (a cached probe's key).
    fn machine_key() -> Result<Option<String>> {
        use std::fmt::Write;
        let mut key = format!("cuda driver {}", driver_version()?);
        for o in 0..device_count()? {
            let dev = call("cuDeviceGet", Some(o), || r::device::get(o as i32))?;
            let uuid = call("cuDeviceGetUuid", Some(o), || r::device::get_uuid(dev))?;
            key.push(' ');
            uuid.bytes.iter().for_each(|b| _ = write!(key, "{:02x}", *b as u8));
        }
        Ok(Some(key))
    }
}
