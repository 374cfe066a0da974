//! The HIP runtime (feature `rocm`), bound directly and loaded at run time (sys → result → owners, like
//! [`crate::cuda`]): devices, streams, fine-grained device allocations, peer access, and code-object modules with
//! kernel launches; and for the runtime behind XLA's FFI handlers ([`crate::gpu::Interop`]): IPC handles of allocations
//! and their mappings in other processes ([`DeviceBuffer::ipc_handle`], [`IpcMapping`]), host-mapped memory
//! ([`HostMapped`]), XLA's streams ([`GpuStream::foreign`]) and the free-memory query. Each signature is written from
//! HIP's documented runtime API (`hip_runtime_api.h`); none of these has run on an AMD GPU (docs/ROCM.md).
//!
//! Why not `hip-rs`: its build script runs bindgen over `hipblas/hipblas.h` and links `libhipblas` and `libamdhip64` at
//! build time, so it cannot even type-check against Debian's ROCm packages (no hipBLAS), and it wraps none of events,
//! peer access, modules, launches or hipRTC. Binding the ~35 entry points we call keeps `cargo build --features rocm`
//! free of any ROCm install, as the CUDA layer is (ARCHITECTURE.md, dependency table).
//!
//! HIP has no explicit contexts: [`Context::bind`] is `hipSetDevice`, which selects the device's primary context on the
//! calling thread; every method binds before it calls. Statuses become [`Error::Call`] naming the call and the device
//! (`hipGetErrorName`).

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::gpu::{self, GpuBuffer, GpuContext, GpuHostMapped, GpuIpcMapping, GpuModule, GpuStream};
use crate::{Error, Result};

/// `hipStream_t`, `hipModule_t`, `hipFunction_t`: opaque handles.
pub type RawStream = *mut c_void;
type RawModule = *mut c_void;
type RawFunction = *mut c_void;

/// `hipErrorPeerAccessAlreadyEnabled`.
const PEER_ACCESS_ALREADY_ENABLED: c_int = 704;
/// `hipStreamNonBlocking`.
const STREAM_NON_BLOCKING: c_uint = 1;
/// `hipDeviceMallocFinegrained` (`hipExtMallocWithFlags`): coherent across devices while kernels run, which
/// cross-device signal flags need.
const MALLOC_FINE_GRAINED: c_uint = 1;
/// `hipIpcMemLazyEnablePeerAccess` (`hipIpcOpenMemHandle`'s only flag).
const IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;
/// `hipHostMallocPortable | hipHostMallocMapped | hipHostMallocCoherent`: pinned host memory of every device, mapped
/// into their address spaces, and coherent (a kernel's system-scope store is visible to the host without synchronising,
/// which the timeout report word needs; without the flag the default depends on `HIP_HOST_COHERENT`).
const HOST_MALLOC_MAPPED: c_uint = 0x1 | 0x2 | 0x4000_0000;
/// `hipMemcpyKind`.
const H2D: c_int = 1;
const D2H: c_int = 2;
const D2D: c_int = 3;
/// `hipDeviceAttributeMultiprocessorCount` (HIP's CUDA-compatible attribute range, value from ROCm 5.2's
/// `hip_runtime_api.h`).
pub const ATTR_MULTIPROCESSOR_COUNT: c_int = 63;
/// Bytes reserved for `hipDeviceProp_t`: larger than every layout (792 bytes in ROCm 5.2, about 1.5 KiB for ROCm 6's
/// `R0600`).
const PROPS_BYTES: usize = 16 * 1024;

/// `hipIpcMemHandle_t`: `struct { char reserved[64]; }`, passed by value to `hipIpcOpenMemHandle` (the C ABI of a
/// 64-byte aggregate, which `repr(C)` reproduces).
#[repr(C)]
#[derive(Clone, Copy)]
struct IpcMemHandle {
    reserved: [c_char; crate::gpu::IPC_HANDLE_BYTES],
}

crate::libs::entry_points! {
    /// The raw entry points, with `hip_runtime_api.h`'s signatures (`hipError_t` is a C enum, i.e. `int`; stable across
    /// ROCm 5 and 6 for every entry point used here). ROCm 6 exports the new `hipDeviceProp_t` layout as ...R0600 and
    /// keeps the old name for the old layout; either holds `gcnArchName`, all we read (see `Context::arch`).
    /// hipHostAlloc and hipFreeHost are the CUDA-named twins (same signatures and flags), for a ROCm that drops the
    /// older names.
    struct Sys {
        get_error_name: fn(c_int) -> *const c_char = "hipGetErrorName",
        get_error_string: fn(c_int) -> *const c_char = "hipGetErrorString",
        init: fn(c_uint) -> c_int = "hipInit",
        get_device_count: fn(*mut c_int) -> c_int = "hipGetDeviceCount",
        set_device: fn(c_int) -> c_int = "hipSetDevice",
        device_get_name: fn(*mut c_char, c_int, c_int) -> c_int = "hipDeviceGetName",
        get_device_properties: fn(*mut c_void, c_int) -> c_int =
            "hipGetDevicePropertiesR0600" | "hipGetDeviceProperties",
        device_get_attribute: fn(*mut c_int, c_int, c_int) -> c_int = "hipDeviceGetAttribute",
        device_can_access_peer: fn(*mut c_int, c_int, c_int) -> c_int = "hipDeviceCanAccessPeer",
        device_enable_peer_access: fn(c_int, c_uint) -> c_int = "hipDeviceEnablePeerAccess",
        device_synchronize: fn() -> c_int = "hipDeviceSynchronize",
        stream_create_with_flags: fn(*mut RawStream, c_uint) -> c_int = "hipStreamCreateWithFlags",
        stream_synchronize: fn(RawStream) -> c_int = "hipStreamSynchronize",
        stream_destroy: fn(RawStream) -> c_int = "hipStreamDestroy",
        ext_malloc_with_flags: fn(*mut *mut c_void, usize, c_uint) -> c_int = "hipExtMallocWithFlags",
        free: fn(*mut c_void) -> c_int = "hipFree",
        memset: fn(*mut c_void, c_int, usize) -> c_int = "hipMemset",
        memset_async: fn(*mut c_void, c_int, usize, RawStream) -> c_int = "hipMemsetAsync",
        memcpy: fn(*mut c_void, *const c_void, usize, c_int) -> c_int = "hipMemcpy",
        memcpy_async: fn(*mut c_void, *const c_void, usize, c_int, RawStream) -> c_int = "hipMemcpyAsync",
        mem_get_info: fn(*mut usize, *mut usize) -> c_int = "hipMemGetInfo",
        ipc_get_mem_handle: fn(*mut IpcMemHandle, *mut c_void) -> c_int = "hipIpcGetMemHandle",
        ipc_open_mem_handle: fn(*mut *mut c_void, IpcMemHandle, c_uint) -> c_int = "hipIpcOpenMemHandle",
        ipc_close_mem_handle: fn(*mut c_void) -> c_int = "hipIpcCloseMemHandle",
        host_malloc: fn(*mut *mut c_void, usize, c_uint) -> c_int = "hipHostMalloc" | "hipHostAlloc",
        host_get_device_pointer: fn(*mut *mut c_void, *mut c_void, c_uint) -> c_int = "hipHostGetDevicePointer",
        host_free: fn(*mut c_void) -> c_int = "hipHostFree" | "hipFreeHost",
        module_load_data: fn(*mut RawModule, *const c_void) -> c_int = "hipModuleLoadData",
        module_get_function: fn(*mut RawFunction, RawModule, *const c_char) -> c_int = "hipModuleGetFunction",
        module_unload: fn(RawModule) -> c_int = "hipModuleUnload",
        module_launch_kernel: fn(
            RawFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, RawStream, *mut *mut c_void,
            *mut *mut c_void,
        ) -> c_int = "hipModuleLaunchKernel",
    }
}

fn sys() -> Result<&'static Sys> {
    static SYS: OnceLock<Result<Sys>> = OnceLock::new();
    crate::once(&SYS, || {
        let missing =
            |names: String, _| Error::Library { lib: "libamdhip64", reason: format!("symbol {names} missing") };
        Sys::load(&crate::libs::hip()?.lib, missing)
    })
}

/// Result layer: a `hipError_t` → an error naming the call, the device and the status.
fn ck(s: &Sys, call: &'static str, device: Option<usize>, status: c_int) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: both functions accept any status value and return static NUL-terminated strings (or null).
    let (name, desc) =
        unsafe { (crate::c_text((s.get_error_name)(status)), crate::c_text((s.get_error_string)(status))) };
    Err(Error::Call { call, device, status: format!("{name} ({status}): {desc}") })
}

/// Makes entry-point call `f` (named `name`, on `device`) and checks the status it returns.
fn call(name: &'static str, device: Option<usize>, f: impl FnOnce(&Sys) -> c_int) -> Result<()> {
    let s = sys()?;
    ck(s, name, device, f(s))
}

/// `hipSetDevice(ordinal)`: selects the device's primary context on the calling thread.
fn set_device(ordinal: usize) -> Result<()> {
    // SAFETY: an out-of-range ordinal is an error status, not UB (owners hold ordinals that `Context::new` checked
    // against hipGetDeviceCount).
    call("hipSetDevice", Some(ordinal), |s| unsafe { (s.set_device)(ordinal as c_int) })
}

/// Loads libamdhip64 and runs `hipInit` once.
pub fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    // SAFETY: hipInit takes a flags word that must be 0.
    INIT.get_or_init(|| call("hipInit", None, |s| unsafe { (s.init)(0) })).clone()
}

/// Number of visible HIP devices.
pub fn device_count() -> Result<usize> {
    init()?;
    let mut n = 0;
    // SAFETY: `n` outlives the call.
    call("hipGetDeviceCount", None, |s| unsafe { (s.get_device_count)(&mut n) })?;
    Ok(n.max(0) as usize)
}

/// The gfx target of an AMD `gcnArchName` (`gfx90a:sramecc+:xnack-` → `gfx90a`), if it is one (`gfx` followed by
/// lowercase hex digits).
pub fn gfx_target(arch_name: &str) -> Option<&str> {
    let t = arch_name.split(':').next()?;
    let digits = t.strip_prefix("gfx")?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))).then_some(t)
}

/// Finds `gcnArchName` in the bytes of a `hipDeviceProp_t` of any layout: the one NUL-terminated field of the form
/// `gfx<hex>[:feature±]*`.
fn find_arch_name(props: &[u8]) -> Option<String> {
    props.windows(3).enumerate().find_map(|(i, w)| {
        if w != b"gfx" || (i > 0 && props[i - 1] != 0 && props[i - 1].is_ascii_graphic()) {
            return None;
        }
        // No NUL after this `gfx`: none after a later one either.
        let end = i + props[i..].iter().position(|&b| b == 0)?;
        let s = std::str::from_utf8(&props[i..end]).ok()?;
        let features = s.split(':').skip(1).all(|f| f.len() > 1 && (f.ends_with('+') || f.ends_with('-')));
        (gfx_target(s).is_some() && features).then(|| s.to_string())
    })
}

/// One HIP device, selected with `hipSetDevice` before every call.
#[derive(Debug)]
pub struct Context {
    pub ordinal: usize,
}

impl GpuContext<Hip> for Context {
    fn new(ordinal: usize) -> Result<Context> {
        let n = device_count()?;
        if ordinal >= n {
            return Err(Error::Call {
                call: "hipSetDevice",
                device: Some(ordinal),
                status: format!("only {n} HIP device(s) visible"),
            });
        }
        let c = Context { ordinal };
        c.bind()?;
        Ok(c)
    }

    fn bind(&self) -> Result<()> {
        set_device(self.ordinal)
    }

    fn name(&self) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` holds the 256 bytes passed as its length.
        call("hipDeviceGetName", self.d(), |s| unsafe {
            (s.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, self.id())
        })?;
        buf[255] = 0;
        // SAFETY: the last byte of `buf` is NUL, so the string ends inside it.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// The copy-engine collectives' stream memory operations are not bound on HIP.
    fn stream_mem_ops(&self) -> Result<bool> {
        Ok(false)
    }

    fn compute_units(&self) -> Result<i32> {
        self.attribute(ATTR_MULTIPROCESSOR_COUNT)
    }

    /// `hipDeviceCanAccessPeer(self → peer)`.
    fn can_access_peer(&self, peer: &Context) -> Result<bool> {
        let mut v = 0;
        // SAFETY: both ordinals are valid devices; `v` outlives the call.
        call("hipDeviceCanAccessPeer", self.d(), |s| unsafe {
            (s.device_can_access_peer)(&mut v, self.id(), peer.id())
        })?;
        Ok(v != 0)
    }

    fn enable_peer_access(&self, peer: &Context) -> Result<()> {
        self.bind()?;
        let s = sys()?;
        // SAFETY: this device is current; `peer` is a valid ordinal; flags must be 0.
        let st = unsafe { (s.device_enable_peer_access)(peer.id(), 0) };
        if st == PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        ck(s, "hipDeviceEnablePeerAccess", self.d(), st)
    }

    /// Loads a code object (hipRTC's output for this device's arch).
    fn load_module(&self, image: &[u8]) -> Result<Module> {
        self.bind()?;
        let mut m: RawModule = std::ptr::null_mut();
        // SAFETY: `image` is a complete code object that outlives the call (HIP copies it).
        call("hipModuleLoadData", self.d(), |s| unsafe {
            (s.module_load_data)(&mut m, image.as_ptr() as *const c_void)
        })?;
        Ok(Module { m, ordinal: self.ordinal })
    }
}

impl Context {
    fn d(&self) -> Option<usize> {
        Some(self.ordinal)
    }

    fn id(&self) -> c_int {
        self.ordinal as c_int
    }

    /// The device's `gcnArchName`, e.g. `gfx90a:sramecc+:xnack-` (what hipRTC's `--offload-arch` takes, so the code
    /// object matches the device's xnack/sramecc mode).
    pub fn arch(&self) -> Result<String> {
        let mut props = vec![0u64; PROPS_BYTES / 8];
        // SAFETY: `props` is zeroed, 8-byte aligned and larger than any hipDeviceProp_t layout.
        call("hipGetDeviceProperties", self.d(), |s| unsafe {
            (s.get_device_properties)(props.as_mut_ptr() as *mut c_void, self.id())
        })?;
        let bytes: Vec<u8> = props.iter().flat_map(|w| w.to_ne_bytes()).collect();
        find_arch_name(&bytes).ok_or_else(|| Error::Call {
            call: "hipGetDeviceProperties",
            device: self.d(),
            status: "no gcnArchName of the form gfx<hex>[:feature±] in the device properties".into(),
        })
    }

    pub fn attribute(&self, attr: c_int) -> Result<i32> {
        let mut v = 0;
        // SAFETY: `v` outlives the call; an unknown attribute is an error status, not UB.
        call("hipDeviceGetAttribute", self.d(), |s| unsafe { (s.device_get_attribute)(&mut v, attr, self.id()) })?;
        Ok(v)
    }

    /// Free and total memory of this device, in bytes (`hipMemGetInfo`).
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both out-pointers outlive the call; this device is current.
        call("hipMemGetInfo", self.d(), |s| unsafe { (s.mem_get_info)(&mut free, &mut total) })?;
        Ok((free, total))
    }
}

/// A loaded code object, unloaded on drop.
#[derive(Debug)]
pub struct Module {
    m: RawModule,
    ordinal: usize,
}

/// A kernel entry point. Valid while its [`Module`] lives.
#[derive(Debug, Clone, Copy)]
pub struct Function {
    f: RawFunction,
    pub ordinal: usize,
}

// SAFETY: module, function and stream handles are process-wide, usable from any thread (HIP serialises work on one
// stream internally); modules and functions are immutable.
crate::send_sync!(Module, Function, Stream);

impl GpuModule<Hip> for Module {
    fn function(&self, name: &str) -> Result<Function> {
        let n = CString::new(name).map_err(|_| Error::Invalid(format!("kernel name {name:?}")))?;
        let mut f: RawFunction = std::ptr::null_mut();
        // SAFETY: `self.m` is a loaded module; `n` outlives the call.
        call("hipModuleGetFunction", Some(self.ordinal), |s| unsafe {
            (s.module_get_function)(&mut f, self.m, n.as_ptr())
        })
        .map_err(|e| match e {
            Error::Call { call, device, status } => Error::Call { call, device, status: format!("{name}: {status}") },
            other => other,
        })?;
        Ok(Function { f, ordinal: self.ordinal })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(s) = sys() {
            // SAFETY: selects the owning device (a valid ordinal), then unloads the module loaded in `load_module`,
            // once.
            unsafe {
                let _ = (s.set_device)(self.ordinal as c_int);
                let _ = (s.module_unload)(self.m);
            }
        }
    }
}

/// A non-blocking stream.
#[derive(Debug)]
pub struct Stream {
    pub s: RawStream,
    pub ordinal: usize,
}

impl GpuStream<Hip> for Stream {
    fn new(ctx: &Context) -> Result<Stream> {
        ctx.bind()?;
        let mut st: RawStream = std::ptr::null_mut();
        // SAFETY: `st` outlives the call; the device is current.
        call("hipStreamCreateWithFlags", ctx.d(), |s| unsafe {
            (s.stream_create_with_flags)(&mut st, STREAM_NON_BLOCKING)
        })?;
        Ok(Stream { s: st, ordinal: ctx.ordinal })
    }

    unsafe fn foreign(raw: *mut c_void, ordinal: usize) -> gpu::Borrowed<Stream> {
        // `raw` being a live stream of `ordinal` is this method's contract.
        gpu::Borrowed::wrap(Stream { s: raw, ordinal })
    }

    fn synchronize(&self) -> Result<()> {
        // SAFETY: `self.s` is a live stream.
        call("hipStreamSynchronize", self.d(), |s| unsafe { (s.stream_synchronize)(self.s) })
    }

    unsafe fn launch(&self, f: &Function, grid: u32, block: u32, params: &mut [*mut c_void]) -> Result<()> {
        if f.ordinal != self.ordinal {
            return Err(Error::Invalid(format!(
                "kernel of device {} launched on a stream of device {}",
                f.ordinal, self.ordinal
            )));
        }
        // SAFETY: the caller guarantees the parameter list; `f` belongs to this stream's device (checked above); no
        // dynamic shared memory and no `extra` block.
        call("hipModuleLaunchKernel", self.d(), |s| unsafe {
            (s.module_launch_kernel)(f.f, grid, 1, 1, block, 1, 1, 0, self.s, params.as_mut_ptr(), std::ptr::null_mut())
        })
    }

    unsafe fn copy_d2d(&self, dst: u64, src: u64, len: usize) -> Result<()> {
        // SAFETY: the caller guarantees both ranges.
        call("hipMemcpyAsync", self.d(), |s| unsafe {
            (s.memcpy_async)(dst as *mut c_void, src as *const c_void, len, D2D, self.s)
        })
    }

    unsafe fn memset_u8(&self, dst: u64, v: u8, len: usize) -> Result<()> {
        // SAFETY: the caller guarantees the range.
        call("hipMemsetAsync", self.d(), |s| unsafe { (s.memset_async)(dst as *mut c_void, v as c_int, len, self.s) })
    }

    /// Stream memory operations are not bound on HIP: the copy-engine collectives run on CUDA only
    /// ([`Context::stream_mem_ops`] says no, so nothing calls this). Enqueues nothing.
    unsafe fn write_u32(&self, _addr: u64, _v: u32) -> Result<()> {
        Err(not_on_hip("hipStreamWriteValue32"))
    }

    /// As [`Stream::write_u32`].
    unsafe fn wait_u32(&self, _addr: u64, _v: u32) -> Result<()> {
        Err(not_on_hip("hipStreamWaitValue32"))
    }

    /// As [`Stream::write_u32`].
    unsafe fn copy_2d(&self, _d: u64, _dp: usize, _s: u64, _sp: usize, _w: usize, _r: usize) -> Result<()> {
        Err(not_on_hip("hipMemcpy2DAsync"))
    }
}

impl Stream {
    fn d(&self) -> Option<usize> {
        Some(self.ordinal)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(s) = sys() {
            // SAFETY: destroys the stream created in `new`, once; pending work completes first.
            let _ = unsafe { (s.stream_destroy)(self.s) };
        }
    }
}

/// A fine-grained device allocation (`hipExtMallocWithFlags(hipDeviceMallocFinegrained)`), freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    pub ptr: u64,
    pub len: usize,
    pub ordinal: usize,
}

impl GpuBuffer<Hip> for DeviceBuffer {
    /// `len` bytes (at least 1) of fine-grained device memory, zeroed: stores and atomics at system scope are visible
    /// to peers while kernels run, which signal flags and staging that peers poll or read need (coarse-grained
    /// `hipMalloc` memory is only coherent at kernel boundaries).
    fn alloc(ctx: &Context, len: usize) -> Result<DeviceBuffer> {
        ctx.bind()?;
        let n = len.max(1);
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` outlives the call; the device is current.
        call("hipExtMallocWithFlags", ctx.d(), |s| unsafe {
            (s.ext_malloc_with_flags)(&mut p, n, MALLOC_FINE_GRAINED)
        })?;
        let b = DeviceBuffer { ptr: p as u64, len, ordinal: ctx.ordinal };
        // SAFETY: `p` is a fresh allocation of `n` bytes.
        call("hipMemset", ctx.d(), |s| unsafe { (s.memset)(p, 0, n) })?;
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
        set_device(self.ordinal)?;
        // SAFETY: the destination range lies inside the allocation (checked above).
        call("hipMemcpy", Some(self.ordinal), |s| unsafe {
            (s.memcpy)((self.ptr + offset as u64) as *mut c_void, data.as_ptr() as *const c_void, data.len(), H2D)
        })?;
        self.settle()
    }

    fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        if !crate::gpu::check_range("read of", out.len(), offset, "from", self.len)? {
            return Ok(());
        }
        set_device(self.ordinal)?;
        // SAFETY: the source range lies inside the allocation (checked above).
        call("hipMemcpy", Some(self.ordinal), |s| unsafe {
            (s.memcpy)(out.as_mut_ptr() as *mut c_void, (self.ptr + offset as u64) as *const c_void, out.len(), D2H)
        })
    }

    /// The allocation's IPC handle (`hipIpcGetMemHandle`).
    fn ipc_handle(&self) -> Result<[u8; crate::gpu::IPC_HANDLE_BYTES]> {
        set_device(self.ordinal)?;
        let mut h = IpcMemHandle { reserved: [0; crate::gpu::IPC_HANDLE_BYTES] };
        // SAFETY: `self.ptr` is the base of a live hipExtMallocWithFlags allocation of this device, which is current;
        // `h` outlives the call.
        call("hipIpcGetMemHandle", Some(self.ordinal), |s| unsafe {
            (s.ipc_get_mem_handle)(&mut h, self.ptr as *mut c_void)
        })?;
        Ok(h.reserved.map(|c| c as u8))
    }
}

impl DeviceBuffer {
    /// Waits for the device: hipMemset and hipMemcpy from pageable memory may return before the bytes land, on the null
    /// stream, which non-blocking streams do not wait for (the CUDA layer's `settle`, for the same reason).
    fn settle(&self) -> Result<()> {
        // SAFETY: no arguments; the buffer's device is current (callers bind first).
        call("hipDeviceSynchronize", Some(self.ordinal), |s| unsafe { (s.device_synchronize)() })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if set_device(self.ordinal).is_ok()
            && let Ok(s) = sys()
        {
            // SAFETY: frees the allocation made in `alloc`, once.
            let _ = unsafe { (s.free)(self.ptr as *mut c_void) };
        }
    }
}

/// Page-locked host memory mapped into the devices' address space ([`crate::gpu::HostWords`]; `hipHostMalloc`, mapped,
/// portable and coherent).
#[derive(Debug)]
pub struct HostMapped {
    pub words: crate::gpu::HostWords,
}

impl GpuHostMapped<Hip> for HostMapped {
    fn new(ctx: &Context, words: usize) -> Result<HostMapped> {
        ctx.bind()?;
        let words = words.max(1);
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` outlives the call; a fresh host allocation, freed once in `drop`.
        call("hipHostMalloc", ctx.d(), |s| unsafe { (s.host_malloc)(&mut p, words * 4, HOST_MALLOC_MAPPED) })?;
        // SAFETY: `p` holds `words` writable, page-aligned words just allocated, owned by `m`.
        let mut m = HostMapped { words: unsafe { crate::gpu::HostWords::zeroed(p, words) } };
        let mut d: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a mapped host allocation; `d` outlives the call; flags must be 0.
        call("hipHostGetDevicePointer", ctx.d(), |s| unsafe { (s.host_get_device_pointer)(&mut d, p, 0) })?;
        m.words.device_ptr = d as u64;
        Ok(m)
    }

    /// Registering another mapping serves the copy-engine collectives only: CUDA only (nothing is touched).
    unsafe fn register(_ctx: &Context, _ptr: *mut c_void, _words: usize) -> Result<HostMapped> {
        Err(not_on_hip("hipHostRegister"))
    }
}

impl std::ops::Deref for HostMapped {
    type Target = gpu::HostWords;
    fn deref(&self) -> &gpu::HostWords {
        &self.words
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        if let Ok(s) = sys() {
            // SAFETY: frees the allocation made in `new`, once.
            let _ = unsafe { (s.host_free)(self.words.ptr()) };
        }
    }
}

/// Another process's device allocation, opened from its IPC handle into this process's address space
/// (`hipIpcOpenMemHandle`, peer access to its device enabled lazily). Closed on drop.
#[derive(Debug)]
pub struct IpcMapping {
    pub ptr: u64,
    pub ordinal: usize,
}

impl GpuIpcMapping<Hip> for IpcMapping {
    fn open(ctx: &Context, handle: &[u8; crate::gpu::IPC_HANDLE_BYTES]) -> Result<IpcMapping> {
        ctx.bind()?;
        let h = IpcMemHandle { reserved: handle.map(|b| b as c_char) };
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `h` is a handle's 64 bytes passed by value as the C API declares (the runtime validates them and
        // fails on garbage); `p` outlives the call; the device is current.
        call("hipIpcOpenMemHandle", ctx.d(), |s| unsafe {
            (s.ipc_open_mem_handle)(&mut p, h, IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        })?;
        Ok(IpcMapping { ptr: p as u64, ordinal: ctx.ordinal })
    }

    fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if let Ok(s) = sys() {
            // SAFETY: selects the device the mapping was opened on (a valid ordinal), then closes the address
            // hipIpcOpenMemHandle returned, once.
            unsafe {
                let _ = (s.set_device)(self.ordinal as c_int);
                let _ = (s.ipc_close_mem_handle)(self.ptr as *mut c_void);
            }
        }
    }
}

#[cfg(test)]
#[path = "../tests/unit/hip.rs"]
mod tests;

/// The HIP runtime as a [`crate::gpu::Gpu`] device layer. Its allocations are fine-grained (see
/// [`DeviceBuffer::alloc`]): peers poll signal flags and read staging while kernels run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hip;

impl gpu::Gpu for Hip {
    const NAME: &'static str = "rocm";
    type Context = Context;
    type Module = Module;
    type Function = Function;
    type Stream = Stream;
    type Buffer = DeviceBuffer;
}

impl gpu::Interop for Hip {
    type HostMapped = HostMapped;
    type IpcMapping = IpcMapping;

    fn device_count() -> Result<usize> {
        device_count()
    }
    /// HIP device `ordinal`'s free memory: HIP keeps one implicit context per device, which the runtime made at
    /// `hipInit` (XLA:ROCm's too), so asking makes none.
    fn free_memory_if_active(ordinal: usize) -> Result<Option<usize>> {
        Ok(Some(Context::new(ordinal)?.memory_info()?.0))
    }
    /// No cached peer probe on ROCm (its probe runs where the runtime opens the GPUs).
    fn machine_key() -> Result<Option<String>> {
        Ok(None)
    }
}

/// The error of a CUDA-only device-layer call made on HIP.
fn not_on_hip(call: &'static str) -> Error {
    Error::Invalid(format!("{call}: Peerless's copy-engine collectives run on CUDA only"))
}
