//! The parts of the PJRT C API the wrapper of XLA's plugin needs (`plugin::wrap`): loading an inner plugin, reading its
//! version and extension chain, and registering FFI handlers and the XlaTransform pass through its extensions. Written
//! by hand from PJRT 0.115 (jax 0.11.2's), checked against XLA's CPU plugin (docs/PLUGIN.md); each `#[repr(C)]` struct
//! names the C type it mirrors. `PJRT_Api` slots are only ever appended. Both registries are process-global inside the
//! inner plugin, so each registration happens once per process.

use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

pub mod client;

/// `PJRT_Extension_Type_FFI`.
pub const EXTENSION_FFI: u32 = 5;
/// `PJRT_Extension_Type_XlaTransform`.
pub const EXTENSION_XLA_TRANSFORM: u32 = 24;

/// Bytes of the `PJRT_Api` header before the first function slot.
const API_HEADER: usize = 40;

/// Function slots of `PJRT_Api` (their order is fixed since PJRT 0.1; the wrapper replaces these and keeps every other
/// slot the inner plugin's).
pub const SLOT_ERROR_DESTROY: usize = 0;
pub const SLOT_ERROR_MESSAGE: usize = 1;
pub const SLOT_ERROR_GET_CODE: usize = 2;
pub const SLOT_CLIENT_CREATE: usize = 10;
pub const SLOT_CLIENT_COMPILE: usize = 20;
/// `PJRT_Error_ForEachPayload` (PJRT 0.110-ish on; present in 0.115).
pub const SLOT_ERROR_FOR_EACH_PAYLOAD: usize = 132;
/// The newest PJRT minor version whose every error-reading slot the wrapper knows.
pub const KNOWN_MINOR: i32 = 115;
/// `PJRT_Plugin_Initialize` and `PJRT_Plugin_Attributes`.
pub const SLOT_PLUGIN_INITIALIZE: usize = 3;
pub const SLOT_PLUGIN_ATTRIBUTES: usize = 4;
/// Function slots of a PJRT 0.[`KNOWN_MINOR`] table (through `PJRT_Error_ForEachPayload` and the slots after it that
/// plugins of that version fill; unknown trailing slots of a table a client reads are only ever read up to its
/// `struct_size`).
pub const KNOWN_SLOTS: usize = 140;

/// A function table of our own (`GetPjrtApi`'s answer where no XLA plugin can be wrapped): PJRT 0.[`KNOWN_MINOR`],
/// `slots` function slots all set to `fill` (a function of the uniform `PJRT_Error* f(Args*)` shape, which every slot
/// but `PJRT_Error_Destroy` and `PJRT_Error_Message` has) except those in `patches`, so no slot is null. Leaked: it
/// lives for the process, as `GetPjrtApi`'s table must.
pub fn uniform_table(slots: usize, fill: *const c_void, patches: &[(usize, *const c_void)]) -> *const c_void {
    let words = (API_HEADER + 8 * slots) / 8;
    let mut t = vec![0u64; words].into_boxed_slice();
    t[0] = (API_HEADER + 8 * slots) as u64; // struct_size; extension_start stays null
    t[2] = 24; // PJRT_Api_Version's struct_size; its extension_start stays null
    t[4] = u64::from(KNOWN_MINOR as u32) << 32; // major 0 (low half), minor (high half)
    t[API_HEADER / 8..].fill(fill as u64);
    for &(i, f) in patches.iter().filter(|p| p.0 < slots) {
        t[API_HEADER / 8 + i] = f as u64;
    }
    Box::leak(t).as_ptr().cast()
}
const FFI_EXTENSION_SIZE: usize = 48;

#[repr(C)]
struct ExtensionBase {
    struct_size: usize,
    ty: u32,
    next: *const ExtensionBase,
}

#[repr(C)]
struct FfiExtension {
    base: ExtensionBase,
    type_id_register: *const c_void,
    user_data_add: *const c_void,
    register_handler: Option<unsafe extern "C" fn(*mut RegisterHandlerArgs) -> *mut c_void>,
}

#[repr(C)]
struct RegisterHandlerArgs {
    struct_size: usize,
    target_name: *const c_char,
    target_name_size: usize,
    handler: *const c_void,
    platform_name: *const c_char,
    platform_name_size: usize,
    traits: u32,
}
const REGISTER_HANDLER_ARGS_SIZE: usize = 52;

/// `PJRT_Xla_Transform_Extension` as far as this module reads it.
#[repr(C)]
struct XlaTransformExtension {
    base: ExtensionBase,
    register: Option<unsafe extern "C" fn(*mut RegisterTransformArgs) -> *mut c_void>,
    clear: *const c_void,
}
const XLA_TRANSFORM_EXTENSION_SIZE: usize = 40;

/// `PJRT_Register_Xla_Transform_Args`.
#[repr(C)]
struct RegisterTransformArgs {
    struct_size: usize,
    name: *const c_char,
    name_size: usize,
    stage: i32,
    callbacks: *mut TransformCallbacks,
}

/// `PJRT_XlaTransform_Callbacks` (version 1).
#[repr(C)]
struct TransformCallbacks {
    version: i64,
    dtor: Option<unsafe extern "C" fn(*mut TransformCallbacks)>,
    transform: Option<unsafe extern "C" fn(*mut TransformCallbacks, *mut TransformArgs)>,
}

/// `PJRT_XlaTransform_string`.
#[repr(C)]
struct TransformString {
    data: *const c_char,
    size: usize,
}

/// `PJRT_XlaTransform_version_and_error`.
#[repr(C)]
struct TransformHeader {
    api_version: i64,
    data: *mut c_void,
    cleanup_fn: Option<unsafe extern "C" fn(*mut c_void)>,
    has_error: bool,
    code: i32,
    error_msg: TransformString,
}

/// `PJRT_XlaTransform_Args`.
#[repr(C)]
struct TransformArgs {
    struct_size: usize,
    header: TransformHeader,
    hlo_module: TransformString,
    transformed: TransformString,
    changed: bool,
}

/// Where in XLA's pipeline a transform runs (`PJRT_XlaTransform_PipelineStage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransformStage {
    /// After SPMD partitioning and simplification, before layout assignment, fusion and async-collective conversion (on
    /// GPU); CPU's pipeline has fused by then.
    PreScheduler = 0,
}

/// A module transformation: a serialized `HloModuleProto` in; `Some(bytes)` when it changed the module, `None` for
/// "unchanged". It must not fail a compile, so it has no error path.
pub type TransformFn = fn(&[u8]) -> Option<Vec<u8>>;

/// The callbacks XLA holds, with the Rust function they call. `callbacks` is the first field of a `repr(C)` struct, so
/// the pointer XLA hands back is the pointer to the whole.
#[repr(C)]
struct RegisteredTransform {
    callbacks: TransformCallbacks,
    f: TransformFn,
}

/// Frees a transform's output once XLA has parsed it (`cleanup_fn`).
unsafe extern "C" fn free_output(data: *mut c_void) {
    if !data.is_null() {
        // SAFETY: `data` is the `Box<Vec<u8>>` leaked by `transform_trampoline`, freed once (XLA calls `cleanup_fn`
        // once per call).
        drop(unsafe { Box::from_raw(data.cast::<Vec<u8>>()) });
    }
}

/// `transform_hlo_module`: runs the registered function; a panic or a malformed call leaves the module unchanged (a
/// transform never breaks a compile).
unsafe extern "C" fn transform_trampoline(callbacks: *mut TransformCallbacks, args: *mut TransformArgs) {
    let run = || {
        if callbacks.is_null() || args.is_null() {
            return;
        }
        // SAFETY: XLA hands back the callbacks pointer registered by `register_xla_transform`, the first field of a
        // leaked `RegisteredTransform` (repr(C)), alive for the process.
        let f = unsafe { &*callbacks.cast::<RegisteredTransform>() }.f;
        // SAFETY: XLA passes a live args struct for the duration of the call.
        let a = unsafe { &mut *args };
        if a.struct_size < std::mem::offset_of!(TransformArgs, changed) + 1 {
            return;
        }
        let input: &[u8] = if a.hlo_module.data.is_null() || a.hlo_module.size == 0 {
            &[]
        } else {
            // SAFETY: XLA points `hlo_module` at `size` bytes of the serialized module, alive for the call.
            unsafe { std::slice::from_raw_parts(a.hlo_module.data.cast::<u8>(), a.hlo_module.size) }
        };
        if let Some(out) = f(input) {
            let out = Box::new(out);
            a.transformed = TransformString { data: out.as_ptr().cast(), size: out.len() };
            a.changed = true;
            a.header.data = Box::into_raw(out).cast();
            a.header.cleanup_fn = Some(free_output);
        }
    };
    // A panic is the transform's bug; the module stays as it was.
    let _ = catch_unwind(AssertUnwindSafe(run));
}

// The args of the slots the wrapper patches, as PJRT 0.54 (pjrt-sys) has them: unchanged since.
pub type ErrorMessageArgs = pjrt_sys::PJRT_Error_Message_Args;
pub type ErrorDestroyArgs = pjrt_sys::PJRT_Error_Destroy_Args;
/// `code` is a `PJRT_Error_Code`, XLA's absl status codes.
pub type ErrorGetCodeArgs = pjrt_sys::PJRT_Error_GetCode_Args;
/// `compile_options` is a serialized `CompileOptionsProto`.
pub type ClientCompileArgs = pjrt_sys::PJRT_Client_Compile_Args;

/// `PJRT_Error_ForEachPayload_Args`: the error, then a callback and its argument.
#[repr(C)]
pub struct ErrorForEachPayloadArgs {
    pub struct_size: usize,
    pub extension_start: *const c_void,
    pub error: *mut c_void,
    pub callback: *const c_void,
    pub user_arg: *mut c_void,
}

/// A function slot's C signature: every PJRT entry point takes one args struct.
pub type Entry<A> = unsafe extern "C" fn(*mut A) -> *mut c_void;

/// An inner PJRT plugin, loaded for the process (never unloaded: XLA keeps pointers into it).
#[derive(Debug)]
pub struct InnerPlugin {
    path: PathBuf,
    api: *const u8,
    struct_size: usize,
    version: (i32, i32),
    _lib: libloading::Library,
}

// SAFETY: the table is immutable after `GetPjrtApi` returns and the library stays loaded for the process, so the
// pointer may be shared between threads.
crate::send_sync!(InnerPlugin);

impl InnerPlugin {
    /// Loads the PJRT plugin at `path` and reads its function table's header.
    pub fn load(path: &Path) -> Result<Self, String> {
        let what = path.display();
        // SAFETY: loading runs the library's initialisers; a PJRT plugin is a shared library meant to be dlopen-ed by a
        // host process, which is what this is.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("cannot load {what}: {e}"))?;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get = unsafe { lib.get::<unsafe extern "C" fn() -> *const u8>(b"GetPjrtApi\0") }
            .map_err(|e| format!("{what} is not a PJRT plugin (no GetPjrtApi): {e}"))?;
        // SAFETY: as above; the plugin returns a pointer to its static table (or null).
        let api = unsafe { get() };
        if api.is_null() {
            return Err(format!("{what}: GetPjrtApi returned null"));
        }
        // SAFETY: every PJRT_Api begins with the 40-byte header read here (module docs).
        let (struct_size, major, minor) =
            unsafe { (api.cast::<usize>().read(), api.add(32).cast::<i32>().read(), api.add(36).cast::<i32>().read()) };
        if struct_size < API_HEADER + 16 {
            return Err(format!("{what}: PJRT_Api of {struct_size} bytes is too small"));
        }
        Ok(InnerPlugin { path: path.to_path_buf(), api, struct_size, version: (major, minor), _lib: lib })
    }

    /// The plugin's own function table, for `GetPjrtApi` to hand out unchanged.
    pub fn api(&self) -> *const c_void {
        self.api.cast()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// PJRT API (major, minor) version.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The extension chain: (type, struct size) of each.
    pub fn extensions(&self) -> Vec<(u32, usize)> {
        self.chain().map(|e| (e.ty, e.struct_size)).collect()
    }

    /// The extension chain's entries, the first 64 at most (a malformed chain cannot loop).
    fn chain(&self) -> impl Iterator<Item = &ExtensionBase> {
        // SAFETY: offset 8 of the header is `extension_start` (module docs).
        let mut ext = unsafe { self.api.add(8).cast::<*const ExtensionBase>().read() };
        std::iter::from_fn(move || {
            // SAFETY: a non-null chain entry is an extension base that lives as long as the loaded plugin (its table is
            // static).
            let e = unsafe { ext.as_ref() }?;
            ext = e.next;
            Some(e)
        })
        .take(64)
    }

    fn find_extension(&self, ty: u32, min_size: usize) -> Option<*const ExtensionBase> {
        self.chain().find(|e| e.ty == ty && e.struct_size >= min_size).map(std::ptr::from_ref)
    }

    /// A copy of the plugin's function table with the slots in `patches` replaced, leaked for the process (XLA keeps
    /// the pointer). Header, version, extension chain and every other slot are the plugin's own. Errors name a slot the
    /// table does not have.
    pub fn patched_table(&self, patches: &[(usize, *const c_void)]) -> Result<*const c_void, String> {
        let words = self.struct_size.div_ceil(8);
        let mut copy = vec![0u64; words].into_boxed_slice();
        // SAFETY: the table has `struct_size` readable bytes (its header says so) and `copy` has at least as many; the
        // two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.api, copy.as_mut_ptr().cast::<u8>(), self.struct_size) };
        for &(i, f) in patches {
            if self.slot(i).is_none() {
                return Err(format!("{}: PJRT_Api has no function slot {i}", self.path.display()));
            }
            copy[(API_HEADER + 8 * i) / 8] = f as u64;
        }
        Ok(Box::leak(copy).as_ptr().cast())
    }

    /// The plugin's own function in slot `i` as the function-pointer type `F`.
    ///
    /// # Safety
    /// `F` is the C signature of the PJRT function in slot `i`.
    pub unsafe fn slot_fn<F: Copy>(&self, i: usize) -> Option<F> {
        const { assert!(size_of::<F>() == size_of::<*const c_void>()) };
        // SAFETY: a set slot holds a function pointer of the slot's signature, `F` (the caller's contract), which has a
        // pointer's size (checked above).
        self.slot(i).map(|p| unsafe { std::mem::transmute_copy::<*const c_void, F>(&p) })
    }

    /// Whether the table has function slot `i`, set.
    pub fn has_slot(&self, i: usize) -> bool {
        self.slot(i).is_some()
    }

    /// Function slot `i` of the table, if the table has it and it is set.
    fn slot(&self, i: usize) -> Option<*const c_void> {
        let at = API_HEADER + 8 * i;
        if at + 8 > self.struct_size {
            return None;
        }
        // SAFETY: in bounds of the table (checked against its struct size).
        let p = unsafe { self.api.add(at).cast::<*const c_void>().read() };
        (!p.is_null()).then_some(p)
    }

    /// Takes a `PJRT_Error*` from the plugin: its message, and the error freed.
    pub(crate) fn take_error(&self, error: *mut c_void) -> String {
        let mut message = String::from("(the plugin gave no message)");
        // SAFETY: the slot is `PJRT_Error_Message`, of this signature.
        if let Some(f) = unsafe { self.slot_fn::<unsafe extern "C" fn(*mut ErrorMessageArgs)>(SLOT_ERROR_MESSAGE) } {
            let mut a = ErrorMessageArgs {
                struct_size: size_of::<ErrorMessageArgs>(),
                error: error.cast(),
                ..Default::default()
            };
            // SAFETY: `error` came from this plugin.
            unsafe { f(&mut a) };
            if !a.message.is_null() {
                // SAFETY: the plugin points `message` at `message_size` bytes owned by `error`.
                let b = unsafe { std::slice::from_raw_parts(a.message.cast::<u8>(), a.message_size) };
                message = String::from_utf8_lossy(b).into_owned();
            }
        }
        // SAFETY: the slot is `PJRT_Error_Destroy`, of this signature.
        if let Some(f) = unsafe { self.slot_fn::<unsafe extern "C" fn(*mut ErrorDestroyArgs)>(SLOT_ERROR_DESTROY) } {
            let mut a = ErrorDestroyArgs {
                struct_size: size_of::<ErrorDestroyArgs>(),
                error: error.cast(),
                ..Default::default()
            };
            // SAFETY: the error is freed once, after its message was copied.
            unsafe { f(&mut a) };
        }
        message
    }

    /// Registers `handler` (an `XLA_FFI_Handler*`) as the typed-FFI target `target` for the inner plugin's platform
    /// `platform` ("Host" for XLA:CPU, "CUDA") with `traits`.
    ///
    /// # Safety
    /// `handler` is a typed XLA FFI handler that stays valid for the process.
    pub unsafe fn register_ffi_handler(
        &self,
        target: &'static str,
        handler: *const c_void,
        platform: &'static str,
        traits: u32,
    ) -> Result<(), String> {
        let ext = self
            .find_extension(EXTENSION_FFI, FFI_EXTENSION_SIZE)
            .ok_or_else(|| format!("{} has no FFI extension of the PJRT 0.115 layout", self.path.display()))?;
        // SAFETY: an FFI extension of at least the 48 bytes `FfiExtension` reads (checked).
        let Some(register) = (unsafe { &*ext.cast::<FfiExtension>() }).register_handler else {
            return Err(format!("{}: the FFI extension has no register_handler", self.path.display()));
        };
        let mut a = RegisterHandlerArgs {
            struct_size: REGISTER_HANDLER_ARGS_SIZE,
            target_name: target.as_ptr().cast(),
            target_name_size: target.len(),
            handler,
            platform_name: platform.as_ptr().cast(),
            platform_name_size: platform.len(),
            traits,
        };
        // SAFETY: the extension's `register_handler` with args of its layout; the strings are 'static (the registry may
        // keep them) and the handler is the caller's contract.
        let err = unsafe { register(&mut a) };
        if err.is_null() { Ok(()) } else { Err(format!("registering {target}: {}", self.take_error(err))) }
    }

    /// Registers `f` as the HLO module transformation `name` at `stage` of the plugin's XLA pipeline (process-global,
    /// for every client and compile from now on). The callbacks are leaked: XLA keeps them for the process.
    pub fn register_xla_transform(&self, name: &str, stage: TransformStage, f: TransformFn) -> Result<(), String> {
        let ext = self
            .find_extension(EXTENSION_XLA_TRANSFORM, XLA_TRANSFORM_EXTENSION_SIZE)
            .ok_or_else(|| format!("{} has no XlaTransform extension (PJRT extension type 24)", self.path.display()))?;
        // SAFETY: an XlaTransform extension of at least the 40 bytes read (checked).
        let Some(register) = (unsafe { &*ext.cast::<XlaTransformExtension>() }).register else {
            return Err(format!("{}: the XlaTransform extension has no register entry", self.path.display()));
        };
        let registered = Box::leak(Box::new(RegisteredTransform {
            callbacks: TransformCallbacks { version: 1, dtor: None, transform: Some(transform_trampoline) },
            f,
        }));
        let mut a = RegisterTransformArgs {
            struct_size: size_of::<RegisterTransformArgs>(),
            name: name.as_ptr().cast(),
            name_size: name.len(),
            stage: stage as i32,
            callbacks: &mut registered.callbacks,
        };
        // SAFETY: the extension's register entry with args of its layout; XLA copies the name and keeps the callbacks
        // pointer, which is leaked (valid for the process).
        let err = unsafe { register(&mut a) };
        if err.is_null() { Ok(()) } else { Err(format!("registering transform {name}: {}", self.take_error(err))) }
    }
}

#[cfg(test)]
#[path = "../tests/unit/pjrt.rs"]
mod tests;
