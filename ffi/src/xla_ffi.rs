//! XLA's typed FFI ("custom call" handlers), as a handler author sees it: [`sys`], the C ABI (API 0.4, jaxlib 0.11.2)
//! by hand, checked against jaxlib's header by `tests/xla_ffi_layout.rs`; and here [`CallFrame`] (arguments, results
//! and attributes by name, typed errors), the API calls a handler makes, and [`guard_with_traits`], which answers the
//! registration probe and turns a [`HandlerError`] or a panic into an XLA error. ARCHITECTURE.md ("ffi") has the
//! overview.
//!
//! Facts about XLA's side this relies on (jaxlib 0.11.2, checked on XLA:CPU):
//! - Sub-byte element types arrive packed, low bits first (8 s4 elements in 4 bytes); [`BufferRef::byte_len`] counts so
//!   (XLA's C++ `size_bytes()` assumes a byte per element).
//! - Attributes arrive sorted by name; Python ints as s64, floats as f64, bools as pred, NumPy arrays as their dtype.
//! - `XLA_FFI_Error_Create` copies the message; `XLA_FFI_Stream_Get` on CPU fails with UNIMPLEMENTED;
//!   `XLA_FFI_DeviceOrdinal_Get` returns the device's id.
//! - Registration probes the execute handler once with a metadata extension (a null `ctx`) and accepts only API
//!   versions within XLA's range (0.1 to 0.4); the probe is answered with 0.4.

pub mod sys;
mod types;

use std::ffi::{CString, c_void};
use std::fmt;
use std::marker::PhantomData;
use std::mem::{offset_of, size_of};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

pub use sys::{XLA_FFI_CallFrame, XLA_FFI_Error, XLA_FFI_Handler, XLA_FFI_TypeId as TypeId};
pub use types::{DataType, ErrorCode, ExecutionStage};

/// The (major, minor) API version handlers built on [`sys`] report: XLA accepts a handler whose version lies in its
/// supported range (jaxlib 0.11.2: 0.1 to 0.4).
pub const API_VERSION: (i32, i32) = (sys::XLA_FFI_API_MAJOR, sys::XLA_FFI_API_MINOR);

/// Handler traits, a bit set (reported in the metadata probe).
pub type Traits = sys::XLA_FFI_Handler_Traits;
/// The handler may be captured into a command buffer (CUDA graph).
pub const COMMAND_BUFFER_COMPATIBLE: Traits = sys::XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE;

// --------------------------------------------------------------------------------------------- Errors

/// Every failure a handler can report; [`guard_with_traits`] hands it to XLA with [`HandlerError::code`].
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum HandlerError {
    /// No attribute of this name (`available`: the names the call has).
    #[error("attribute `{name}` not found (attributes: {})", names_or_none(available))]
    MissingAttr { name: String, available: Vec<String> },
    /// The attribute exists with another type or a value out of the asked type's range.
    #[error("attribute `{name}`: expected {expected}, found {found}")]
    AttrType { name: String, expected: &'static str, found: String },
    /// An argument or result index past the end (`what`: "argument" or "result").
    #[error("{what} {index} out of range: the call has {count}")]
    OutOfRange { what: &'static str, index: usize, count: usize },
    /// The call frame breaks the ABI's rules (a null pointer, a short struct, a negative count or dimension, a
    /// non-buffer operand).
    #[error("malformed XLA FFI call frame: {0}")]
    Frame(String),
    /// An XLA API call failed (or XLA's API table lacks the entry: `Unimplemented`).
    #[error("{call} failed ({code}): {message}")]
    Api { call: &'static str, code: ErrorCode, message: String },
    /// Raised by the handler itself.
    #[error("{message}")]
    Handler { code: ErrorCode, message: String },
    /// The handler panicked; the payload's message.
    #[error("handler panicked: {0}")]
    Panic(String),
}

fn names_or_none(names: &[String]) -> String {
    if names.is_empty() { "none".into() } else { names.join(", ") }
}

impl HandlerError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> HandlerError {
        HandlerError::Handler { code, message: message.into() }
    }

    pub fn invalid_argument(message: impl Into<String>) -> HandlerError {
        HandlerError::new(ErrorCode::InvalidArgument, message)
    }

    pub fn internal(message: impl Into<String>) -> HandlerError {
        HandlerError::new(ErrorCode::Internal, message)
    }

    /// The code XLA sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            HandlerError::MissingAttr { .. }
            | HandlerError::AttrType { .. }
            | HandlerError::OutOfRange { .. }
            | HandlerError::Frame(_) => ErrorCode::InvalidArgument,
            HandlerError::Api { code, .. } | HandlerError::Handler { code, .. } => *code,
            HandlerError::Panic(_) => ErrorCode::Internal,
        }
    }
}

/// A device-layer failure inside a handler is XLA's `INTERNAL`.
impl From<crate::Error> for HandlerError {
    fn from(e: crate::Error) -> HandlerError {
        HandlerError::internal(e.to_string())
    }
}

pub type Result<T, E = HandlerError> = std::result::Result<T, E>;

fn frame_err<T>(what: impl Into<String>) -> Result<T> {
    Err(HandlerError::Frame(what.into()))
}

// --------------------------------------------------------------------------------------------- The API table

/// The entry `$slot` of `$api` (a `&XLA_FFI_Api`), if the table is long enough to hold it and it is set; otherwise an
/// `Unimplemented` [`HandlerError::Api`].
macro_rules! slot {
    ($api:expr, $slot:ident) => {{
        let api: &sys::XLA_FFI_Api = $api;
        let end = offset_of!(sys::XLA_FFI_Api, $slot) + size_of::<usize>();
        match api.$slot {
            Some(f) if api.struct_size >= end => Ok(f),
            _ => Err(HandlerError::Api {
                call: stringify!($slot),
                code: ErrorCode::Unimplemented,
                message: format!("XLA's FFI API table (size {}) has no such entry", api.struct_size),
            }),
        }
    }};
}

/// Creates an XLA error through `api` (null if the table has no `XLA_FFI_Error_Create`). `OK` becomes `UNKNOWN`: XLA
/// would read an OK error as success. NUL bytes in the message are written `\0`; XLA copies the message, so it lives
/// only for the call.
fn make_error(api: &sys::XLA_FFI_Api, code: ErrorCode, message: &str) -> *mut XLA_FFI_Error {
    let Ok(create) = slot!(api, XLA_FFI_Error_Create) else {
        return ptr::null_mut();
    };
    let code = if code == ErrorCode::Ok { ErrorCode::Unknown } else { code };
    let msg = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    let mut args = sys::XLA_FFI_Error_Create_Args {
        struct_size: sys::XLA_FFI_Error_Create_Args_STRUCT_SIZE,
        extension_start: ptr::null_mut(),
        message: msg.as_ptr(),
        errc: code.to_raw(),
    };
    // SAFETY: `create` is the table's Error_Create; `args` is fully initialised and `msg` outlives the call (XLA copies
    // the message).
    unsafe { create(&mut args) }
}

/// Turns an error an API call returned into a [`HandlerError::Api`] and destroys it (its owner is the caller of the
/// API).
fn take_error(api: &sys::XLA_FFI_Api, call: &'static str, err: *mut XLA_FFI_Error) -> HandlerError {
    let mut code = ErrorCode::Unknown;
    let mut message = String::from("(XLA's API table has no XLA_FFI_Error_GetDetails)");
    if let Ok(details) = slot!(api, XLA_FFI_Error_GetDetails) {
        let mut args = sys::XLA_FFI_Error_GetDetails_Args {
            struct_size: sys::XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE,
            extension_start: ptr::null_mut(),
            error: err,
            message: ptr::null(),
            errc: sys::XLA_FFI_Error_Code::UNKNOWN,
        };
        // SAFETY: `err` is a live error the API just returned; `args` is initialised.
        unsafe { details(&mut args) };
        code = ErrorCode::from_raw(args.errc);
        // SAFETY: GetDetails returns a NUL-terminated message (or null) valid while `err` lives; it is copied here,
        // before `err` is destroyed below.
        message = unsafe { crate::c_text(args.message) };
    }
    if let Ok(destroy) = slot!(api, XLA_FFI_Error_Destroy) {
        let mut args = sys::XLA_FFI_Error_Destroy_Args {
            struct_size: sys::XLA_FFI_Error_Destroy_Args_STRUCT_SIZE,
            extension_start: ptr::null_mut(),
            error: err,
        };
        // SAFETY: `err` is live and owned by us; it is not used after this call.
        unsafe { destroy(&mut args) };
    }
    HandlerError::Api { call, code, message }
}

fn check(api: &sys::XLA_FFI_Api, call: &'static str, err: *mut XLA_FFI_Error) -> Result<()> {
    if err.is_null() { Ok(()) } else { Err(take_error(api, call, err)) }
}

/// Calls entry `$slot` of a [`CallFrame`]'s API table with argument struct `$args` (its `struct_size` and a null
/// `extension_start` filled in, then the fields given) and returns the struct with XLA's out fields written; an error
/// XLA returns is a [`HandlerError::Api`].
macro_rules! call_api {
    ($frame:expr, $slot:ident, $args:ident { $($field:ident $(: $value:expr)?),* $(,)? }) => {{
        let api = $frame.api()?;
        let f = slot!(api, $slot)?;
        let mut args =
            sys::$args { struct_size: sys::$args::STRUCT_SIZE, extension_start: ptr::null_mut(), $($field $(: $value)?),* };
        // SAFETY: `f` is the table's entry for this argument struct, fully initialised; what its pointers point to (the
        // call's context, the callers' locals or 'static data) outlives the call.
        check(api, stringify!($slot), unsafe { f(&mut args) }).map(|()| args)
    }};
}

// --------------------------------------------------------------------------------------------- Buffers and attributes

/// An argument or result buffer: `dims.iter().product()` elements of `dtype`, row-major, at `data` (device memory on
/// GPU platforms).
#[derive(Debug, Clone, Copy)]
pub struct BufferRef<'a> {
    pub dtype: DataType,
    pub dims: &'a [i64],
    pub data: *mut c_void,
}

impl BufferRef<'_> {
    /// The number of elements (1 for a scalar).
    pub fn element_count(&self) -> Result<usize> {
        self.dims.iter().try_fold(1usize, |n, &d| {
            let d = usize::try_from(d)
                .map_err(|_| HandlerError::Frame(format!("negative dimension in {:?}", self.dims)))?;
            n.checked_mul(d).ok_or_else(|| HandlerError::Frame(format!("element count of {:?} overflows", self.dims)))
        })
    }

    /// The buffer's size in bytes; sub-byte types packed as XLA stores them (8 s4 elements in 4 bytes). An error for
    /// invalid or unknown element types.
    pub fn byte_len(&self) -> Result<usize> {
        let n = self.element_count()?;
        self.dtype
            .byte_len(n)
            .ok_or_else(|| HandlerError::invalid_argument(format!("no byte size for a {} buffer", self.dtype)))
    }
}

/// Declares [`Scalar`], a variant per element type this layer decodes (pred, then the integer and float types listed),
/// with its `Display` ("s32 7"), `Scalar::read` (one element of a given type), and the integer conversions
/// [`Scalar::as_i64`] and [`ArrayRef::to_i64_vec`].
macro_rules! scalars {
    (ints: $($i:ident($it:ty)),*; floats: $($f:ident($ft:ty)),*) => {
        /// A scalar attribute's value. `Other`: a type this layer does not decode (f16, c64, ...).
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum Scalar {
            Pred(bool),
            $($i($it),)*
            $($f($ft),)*
            Other(DataType),
        }

        impl Scalar {
            /// An integer scalar whose value fits `i64`.
            pub fn as_i64(&self) -> Option<i64> {
                match *self {
                    $(Scalar::$i(v) => i64::try_from(v).ok(),)*
                    _ => None,
                }
            }

            /// The element of type `t` at `v` (pred: a byte, true unless 0).
            ///
            /// # Safety
            /// `v` points to one readable element of `t`.
            unsafe fn read(t: DataType, v: *const c_void) -> Scalar {
                // SAFETY: (each arm) `v` holds one element of `t` (the caller's contract), read as the Rust type of
                // that width; unaligned reads tolerate any producer.
                unsafe {
                    match t {
                        DataType::Pred => Scalar::Pred(ptr::read_unaligned(v as *const u8) != 0),
                        $(DataType::$i => Scalar::$i(ptr::read_unaligned(v as *const $it)),)*
                        $(DataType::$f => Scalar::$f(ptr::read_unaligned(v as *const $ft)),)*
                        other => Scalar::Other(other),
                    }
                }
            }
        }

        impl fmt::Display for Scalar {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self {
                    Scalar::Pred(v) => write!(f, "pred {v}"),
                    $(Scalar::$i(v) => write!(f, "{} {v}", DataType::$i),)*
                    $(Scalar::$f(v) => write!(f, "{} {v}", DataType::$f),)*
                    Scalar::Other(t) => write!(f, "{t}"),
                }
            }
        }

        impl ArrayRef<'_> {
            /// The elements as `i64`, for any integer element type whose values fit (u64 values past `i64::MAX` do
            /// not); `None` otherwise.
            pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
                match self.dtype {
                    $(DataType::$i => (0..self.len).map(|i| i64::try_from(self.read::<$it>(i)).ok()).collect(),)*
                    _ => None,
                }
            }
        }
    };
}

scalars!(ints: S8(i8), S16(i16), S32(i32), S64(i64), U8(u8), U16(u16), U32(u32), U64(u64); floats: F32(f32), F64(f64));

/// An array attribute: `len` elements of `dtype`.
#[derive(Debug, Clone, Copy)]
pub struct ArrayRef<'a> {
    pub dtype: DataType,
    pub len: usize,
    data: *const c_void,
    _frame: PhantomData<&'a ()>,
}

impl ArrayRef<'_> {
    /// Reads element `i` as `T` (the caller matched `T` to `dtype`).
    fn read<T: Copy>(&self, i: usize) -> T {
        debug_assert!(i < self.len && size_of::<T>() * 8 == self.dtype.bit_width().unwrap_or(0));
        // SAFETY: `data` holds `len` elements of `dtype` for the frame's lifetime (checked non-null when `len > 0` at
        // construction); callers pass `i < len` and a `T` of the element's width. Unaligned reads cost nothing and
        // tolerate any producer.
        unsafe { ptr::read_unaligned((self.data as *const T).add(i)) }
    }
}

/// One attribute's value.
#[derive(Debug, Clone, Copy)]
pub enum Attr<'a> {
    Scalar(Scalar),
    Array(ArrayRef<'a>),
    /// The bytes as XLA passed them (not NUL-terminated; UTF-8 in practice).
    String(&'a [u8]),
    /// A nested dictionary, left raw.
    Dictionary(&'a sys::XLA_FFI_Attrs),
    /// An attribute type this layer does not know.
    Unknown(i32),
}

impl Attr<'_> {
    /// What the attribute is, for error messages: "scalar s32 7", "array of s64 (3 elements)", "string", ...
    pub fn describe(&self) -> String {
        match self {
            Attr::Scalar(s) => format!("scalar {s}"),
            Attr::Array(a) => format!("array of {} ({} elements)", a.dtype, a.len),
            Attr::String(_) => "string".into(),
            Attr::Dictionary(_) => "dictionary".into(),
            Attr::Unknown(t) => format!("attribute of unknown type {t}"),
        }
    }
}

/// A byte span's bytes.
///
/// # Safety
/// `span.ptr` points to `span.len` readable bytes that live for `'a` (or `len` is 0).
unsafe fn span_bytes<'a>(span: &sys::XLA_FFI_ByteSpan) -> Result<&'a [u8]> {
    if span.len == 0 {
        return Ok(&[]);
    }
    if span.ptr.is_null() {
        return frame_err(format!("byte span of length {} at null", span.len));
    }
    // SAFETY: the caller's contract; `ptr` is non-null and `len > 0`.
    Ok(unsafe { std::slice::from_raw_parts(span.ptr as *const u8, span.len) })
}

// --------------------------------------------------------------------------------------------- The call frame

/// The call frame XLA passes a handler, read-only, with typed access.
#[derive(Debug, Clone, Copy)]
pub struct CallFrame<'a> {
    raw: &'a XLA_FFI_CallFrame,
}

/// Argument or result list.
#[derive(Clone, Copy)]
enum Side {
    Arg,
    Ret,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Arg => "argument",
            Side::Ret => "result",
        }
    }
}

impl<'a> CallFrame<'a> {
    /// Wraps `ptr`, checking it is non-null and at least as large as the frame this layer reads.
    ///
    /// # Safety
    /// `ptr` is null or a call frame XLA passed to a handler, valid (with everything it points to, as the ABI
    /// describes) for `'a`, which must not outlive the handler call.
    pub unsafe fn from_raw(ptr: *mut XLA_FFI_CallFrame) -> Result<CallFrame<'a>> {
        if ptr.is_null() {
            return frame_err("null call frame");
        }
        // SAFETY: non-null and, by the caller's contract, a valid call frame for `'a`; `struct_size` is the first
        // field, present in every version.
        let size = unsafe { (*ptr).struct_size };
        if size < sys::XLA_FFI_CallFrame_STRUCT_SIZE {
            return frame_err(format!(
                "call frame size {size}, expected at least {} (API version {}.{})",
                sys::XLA_FFI_CallFrame_STRUCT_SIZE,
                API_VERSION.0,
                API_VERSION.1
            ));
        }
        // SAFETY: as above; the size check shows every field up to `attrs` exists.
        Ok(CallFrame { raw: unsafe { &*ptr } })
    }

    /// XLA's API table.
    pub fn api(&self) -> Result<&'a sys::XLA_FFI_Api> {
        if self.raw.api.is_null() {
            return frame_err("null API table");
        }
        // SAFETY: XLA's API table is static, valid for the process; non-null checked.
        let api = unsafe { &*self.raw.api };
        if api.struct_size < offset_of!(sys::XLA_FFI_Api, XLA_FFI_Error_Create) {
            return frame_err(format!("API table size {}", api.struct_size));
        }
        Ok(api)
    }

    pub fn stage(&self) -> ExecutionStage {
        ExecutionStage::from_raw(self.raw.stage)
    }

    // ---- metadata probe

    /// Whether this call is XLA's registration-time probe for the handler's metadata rather than a real call
    /// ([`guard_with_traits`] answers it before running the handler's body).
    pub fn is_metadata_probe(&self) -> bool {
        let ext = self.raw.extension_start;
        // SAFETY: a non-null `extension_start` points to an extension header XLA built for this call (frame contract).
        !ext.is_null() && unsafe { (*ext).r#type } == sys::XLA_FFI_InternalExtension_Type::XLA_FFI_Extension_Metadata
    }

    /// Answers the metadata probe: the API version of [`sys`] ([`API_VERSION`]), `traits`, and no state type (where the
    /// metadata struct has room for it). An error if this is not a probe or XLA's structs are shorter than this
    /// layer's.
    pub fn answer_metadata_probe(&self, traits: Traits) -> Result<()> {
        if !self.is_metadata_probe() {
            return frame_err("not a metadata probe");
        }
        let ext = self.raw.extension_start as *mut sys::XLA_FFI_Metadata_Extension;
        // SAFETY: a metadata-typed extension is an XLA_FFI_Metadata_Extension (ABI); its header's `struct_size` (first
        // field) is readable in every version.
        let ext_size = unsafe { (*ext).extension_base.struct_size };
        if ext_size < sys::XLA_FFI_Metadata_Extension_STRUCT_SIZE {
            return frame_err(format!(
                "metadata extension size {ext_size}, expected at least {}",
                sys::XLA_FFI_Metadata_Extension_STRUCT_SIZE
            ));
        }
        // SAFETY: the size check shows `metadata` exists.
        let meta = unsafe { (*ext).metadata };
        if meta.is_null() {
            return frame_err("metadata probe without a metadata struct");
        }
        // SAFETY: XLA's metadata struct, live and writable for the call (probe contract).
        let meta = unsafe { &mut *meta };
        if meta.struct_size < sys::XLA_FFI_Metadata_STRUCT_SIZE {
            return frame_err(format!(
                "metadata size {}, expected at least {}",
                meta.struct_size,
                sys::XLA_FFI_Metadata_STRUCT_SIZE
            ));
        }
        meta.api_version = sys::XLA_FFI_Api_Version {
            struct_size: sys::XLA_FFI_Api_Version_STRUCT_SIZE,
            extension_start: ptr::null_mut(),
            major_version: sys::XLA_FFI_API_MAJOR,
            minor_version: sys::XLA_FFI_API_MINOR,
        };
        meta.traits = traits;
        if meta.struct_size >= offset_of!(sys::XLA_FFI_Metadata, state_type_id) + size_of::<TypeId>() {
            meta.state_type_id = sys::XLA_FFI_UNKNOWN_TYPE_ID;
        }
        Ok(())
    }

    // ---- arguments and results

    /// (count, types, pointers) of the argument or result list.
    fn list(&self, side: Side) -> Result<(usize, *const i32, *const *mut c_void)> {
        let (size, types, ptrs) = match side {
            Side::Arg => (self.raw.args.size, self.raw.args.types as *const i32, self.raw.args.args),
            Side::Ret => (self.raw.rets.size, self.raw.rets.types as *const i32, self.raw.rets.rets),
        };
        let n = usize::try_from(size).map_err(|_| HandlerError::Frame(format!("{} count {size}", side.name())))?;
        if n > 0 && (types.is_null() || ptrs.is_null()) {
            return frame_err(format!("{n} {}s at a null list", side.name()));
        }
        Ok((n, types, ptrs as *const *mut c_void))
    }

    fn buffer(&self, side: Side, i: usize) -> Result<BufferRef<'a>> {
        let (n, types, ptrs) = self.list(side)?;
        if i >= n {
            return Err(HandlerError::OutOfRange { what: side.name(), index: i, count: n });
        }
        // SAFETY: `types` and `ptrs` hold `n` entries (frame contract, non-null checked) and `i < n`. The type is read
        // as an i32 (both enums' representation).
        let (ty, p) = unsafe { (*types.add(i), *ptrs.add(i)) };
        if ty != sys::XLA_FFI_ArgType::BUFFER.0 {
            return frame_err(format!("{} {i} has type {ty}, not a buffer", side.name()));
        }
        if p.is_null() {
            return frame_err(format!("{} {i} is null", side.name()));
        }
        // SAFETY: a buffer-typed entry points to an XLA_FFI_Buffer valid for the call (ABI); `struct_size` is its first
        // field.
        let b = unsafe { &*(p as *const sys::XLA_FFI_Buffer) };
        if b.struct_size < sys::XLA_FFI_Buffer_STRUCT_SIZE {
            return frame_err(format!("{} {i}: buffer size {}", side.name(), b.struct_size));
        }
        let rank = usize::try_from(b.rank)
            .map_err(|_| HandlerError::Frame(format!("{} {i}: rank {}", side.name(), b.rank)))?;
        let dims: &'a [i64] = if rank == 0 {
            &[]
        } else if b.dims.is_null() {
            return frame_err(format!("{} {i}: rank {rank} with null dims", side.name()));
        } else {
            // SAFETY: `dims` holds `rank` entries valid for the call (ABI); non-null checked.
            unsafe { std::slice::from_raw_parts(b.dims, rank) }
        };
        Ok(BufferRef { dtype: DataType::from_raw(b.dtype), dims, data: b.data })
    }

    pub fn arg_count(&self) -> Result<usize> {
        Ok(self.list(Side::Arg)?.0)
    }

    /// Argument `i` (a buffer).
    pub fn arg(&self, i: usize) -> Result<BufferRef<'a>> {
        self.buffer(Side::Arg, i)
    }

    /// Result `i` (a buffer).
    pub fn ret(&self, i: usize) -> Result<BufferRef<'a>> {
        self.buffer(Side::Ret, i)
    }

    pub fn args(&self) -> Result<Vec<BufferRef<'a>>> {
        (0..self.arg_count()?).map(|i| self.arg(i)).collect()
    }

    pub fn rets(&self) -> Result<Vec<BufferRef<'a>>> {
        (0..self.list(Side::Ret)?.0).map(|i| self.ret(i)).collect()
    }

    // ---- attributes

    pub fn attr_count(&self) -> Result<usize> {
        let a = &self.raw.attrs;
        let n = usize::try_from(a.size).map_err(|_| HandlerError::Frame(format!("attribute count {}", a.size)))?;
        if n > 0 && (a.types.is_null() || a.names.is_null() || a.attrs.is_null()) {
            return frame_err(format!("{n} attributes at a null list"));
        }
        Ok(n)
    }

    /// Attribute `i`'s name (bytes).
    fn name_at(&self, i: usize) -> Result<&'a [u8]> {
        // SAFETY: `names` holds `attr_count()` entries (checked by the caller, `i` below it).
        let span = unsafe { *self.raw.attrs.names.add(i) };
        if span.is_null() {
            return frame_err(format!("attribute {i} has a null name"));
        }
        // SAFETY: a non-null name is a byte span valid for the call (ABI).
        unsafe { span_bytes(&*span) }
    }

    /// Every attribute's name, in XLA's order (sorted). Non-UTF-8 names are a frame error.
    pub fn attr_names(&self) -> Result<Vec<&'a str>> {
        (0..self.attr_count()?)
            .map(|i| {
                let b = self.name_at(i)?;
                std::str::from_utf8(b)
                    .map_err(|_| HandlerError::Frame(format!("attribute {i}'s name is not UTF-8: {b:?}")))
            })
            .collect()
    }

    /// Attribute `i`'s value.
    fn attr_at(&self, i: usize) -> Result<Attr<'a>> {
        let a = &self.raw.attrs;
        // SAFETY: `types` and `attrs` hold `attr_count()` entries and `i` is below it (caller).
        let (ty, p) = unsafe { (*a.types.add(i), *a.attrs.add(i)) };
        if p.is_null() && ty != sys::XLA_FFI_AttrType::STRING {
            return frame_err(format!("attribute {i} is null"));
        }
        Ok(match ty {
            sys::XLA_FFI_AttrType::SCALAR => {
                // SAFETY: a scalar-typed attribute points to an XLA_FFI_Scalar (ABI).
                let s = unsafe { *(p as *const sys::XLA_FFI_Scalar) };
                let t = DataType::from_raw(s.dtype);
                if s.value.is_null() {
                    return frame_err(format!("scalar attribute {i} ({t}) has a null value"));
                }
                // SAFETY: `value` points to one element of the scalar's dtype (ABI).
                Attr::Scalar(unsafe { Scalar::read(t, s.value) })
            }
            sys::XLA_FFI_AttrType::ARRAY => {
                // SAFETY: an array-typed attribute points to an XLA_FFI_Array (ABI).
                let arr = unsafe { *(p as *const sys::XLA_FFI_Array) };
                if arr.size > 0 && arr.data.is_null() {
                    return frame_err(format!("array attribute {i} has {} elements at null", arr.size));
                }
                Attr::Array(ArrayRef {
                    dtype: DataType::from_raw(arr.dtype),
                    len: arr.size,
                    data: arr.data,
                    _frame: PhantomData,
                })
            }
            sys::XLA_FFI_AttrType::STRING => {
                if p.is_null() {
                    return frame_err(format!("string attribute {i} is null"));
                }
                // SAFETY: a string-typed attribute points to a byte span valid for the call.
                Attr::String(unsafe { span_bytes(&*(p as *const sys::XLA_FFI_ByteSpan))? })
            }
            // SAFETY: a dictionary-typed attribute points to an XLA_FFI_Attrs valid for the call.
            sys::XLA_FFI_AttrType::DICTIONARY => Attr::Dictionary(unsafe { &*(p as *const sys::XLA_FFI_Attrs) }),
            sys::XLA_FFI_AttrType(t) => Attr::Unknown(t),
        })
    }

    /// The attribute `name`, or `None`. A linear scan (attribute lists are short; XLA sorts them, but this does not
    /// rely on it).
    pub fn attr_opt(&self, name: &str) -> Result<Option<Attr<'a>>> {
        for i in 0..self.attr_count()? {
            if self.name_at(i)? == name.as_bytes() {
                return self.attr_at(i).map(Some);
            }
        }
        Ok(None)
    }

    /// The attribute `name`; [`HandlerError::MissingAttr`] (listing the call's attributes) if absent.
    pub fn attr(&self, name: &str) -> Result<Attr<'a>> {
        match self.attr_opt(name)? {
            Some(a) => Ok(a),
            None => Err(HandlerError::MissingAttr {
                name: name.into(),
                available: (0..self.attr_count()?)
                    .map(|i| self.name_at(i).map(|b| String::from_utf8_lossy(b).into_owned()))
                    .collect::<Result<_>>()?,
            }),
        }
    }

    fn mistyped(name: &str, expected: &'static str, found: &Attr<'_>) -> HandlerError {
        HandlerError::AttrType { name: name.into(), expected, found: found.describe() }
    }

    /// An integer scalar attribute (any integer type whose value fits `i64`; JAX passes Python ints as s64).
    pub fn attr_i64(&self, name: &str) -> Result<i64> {
        match self.attr(name)? {
            Attr::Scalar(s) if s.as_i64().is_some() => Ok(s.as_i64().unwrap_or_default()),
            a => Err(Self::mistyped(name, "an integer scalar fitting i64", &a)),
        }
    }

    /// A string attribute; not UTF-8 is a type error.
    pub fn attr_str(&self, name: &str) -> Result<&'a str> {
        match self.attr(name)? {
            Attr::String(b) => std::str::from_utf8(b).map_err(|_| HandlerError::AttrType {
                name: name.into(),
                expected: "a UTF-8 string",
                found: format!("bytes {b:?}"),
            }),
            a => Err(Self::mistyped(name, "a string", &a)),
        }
    }

    /// An integer array attribute as `i64`s (s64 as is; other integer types converted when every value fits).
    pub fn attr_i64_array(&self, name: &str) -> Result<Vec<i64>> {
        match self.attr(name)? {
            Attr::Array(a) if a.to_i64_vec().is_some() => Ok(a.to_i64_vec().unwrap_or_default()),
            a => Err(Self::mistyped(name, "an integer array fitting i64", &a)),
        }
    }

    // ---- API calls

    /// The platform stream of the call (a `CUstream` on CUDA). XLA:CPU has none and answers UNIMPLEMENTED, which comes
    /// back as [`HandlerError::Api`].
    pub fn stream(&self) -> Result<*mut c_void> {
        call_api!(self, XLA_FFI_Stream_Get, XLA_FFI_Stream_Get_Args { ctx: self.raw.ctx, stream: ptr::null_mut() })
            .map(|a| a.stream)
    }

    /// The ordinal of the device the call runs on (XLA:CPU: the device id).
    pub fn device_ordinal(&self) -> Result<i32> {
        call_api!(
            self,
            XLA_FFI_DeviceOrdinal_Get,
            XLA_FFI_DeviceOrdinal_Get_Args { ctx: self.raw.ctx, device_ordinal: -1 }
        )
        .map(|a| a.device_ordinal)
    }

    /// The id of the current run (the same on every device of one execution).
    pub fn run_id(&self) -> Result<i64> {
        call_api!(self, XLA_FFI_RunId_Get, XLA_FFI_RunId_Get_Args { ctx: self.raw.ctx, run_id: 0 }).map(|a| a.run_id)
    }

    /// The state of type `type_id` set at `stage` (an error if none or of another type).
    pub fn state_get(&self, stage: ExecutionStage, type_id: TypeId) -> Result<*mut c_void> {
        let mut id = type_id;
        call_api!(
            self,
            XLA_FFI_State_Get,
            XLA_FFI_State_Get_Args {
                ctx: self.raw.ctx,
                stage: stage.to_raw(),
                type_id: &mut id,
                state: ptr::null_mut(),
            }
        )
        .map(|a| a.state)
    }

    /// Hands `state` to XLA as the state of type `type_id` for `stage` (an error if already set). XLA keeps it until
    /// the executable dies and then calls the deleter registered with `type_id`.
    ///
    /// # Safety
    /// `state` is an object of the type registered as `type_id`, owned by the caller, which gives ownership to XLA on
    /// success.
    pub unsafe fn state_set(&self, stage: ExecutionStage, type_id: TypeId, state: *mut c_void) -> Result<()> {
        let mut id = type_id;
        // `state`'s type and ownership are this function's contract.
        call_api!(
            self,
            XLA_FFI_State_Set,
            XLA_FFI_State_Set_Args { ctx: self.raw.ctx, stage: stage.to_raw(), type_id: &mut id, state }
        )
        .map(drop)
    }

    /// Registers a state type named `name` whose objects XLA destroys with `deleter`, and returns its id (XLA assigns
    /// it; registering the same name again returns the first id). `info` must live for the process (XLA keeps the
    /// pointer).
    pub fn register_type(&self, name: &'static str, info: &'static StateType) -> Result<TypeId> {
        let mut id = sys::XLA_FFI_UNKNOWN_TYPE_ID;
        call_api!(
            self,
            XLA_FFI_Type_Register,
            XLA_FFI_Type_Register_Args {
                name: sys::XLA_FFI_ByteSpan { ptr: name.as_ptr().cast(), len: name.len() },
                type_id: &mut id,
                type_info: &info.0,
            }
        )?;
        Ok(id)
    }

    /// A new XLA error (for a handler to return): null if XLA's table cannot create one. `OK` becomes `UNKNOWN`; XLA
    /// copies the message.
    pub fn error(&self, code: ErrorCode, message: &str) -> *mut XLA_FFI_Error {
        self.api().map_or(ptr::null_mut(), |api| make_error(api, code, message))
    }
}

/// A state type as XLA keeps it for the process: its deleter (`XLA_FFI_TypeInfo`).
#[derive(Debug)]
pub struct StateType(sys::XLA_FFI_TypeInfo);

// SAFETY: never changed after construction, and its extension pointer is always null.
unsafe impl Sync for StateType {}

impl StateType {
    /// A type whose objects XLA destroys with `deleter`.
    pub const fn new(deleter: unsafe extern "C" fn(*mut c_void)) -> StateType {
        StateType(sys::XLA_FFI_TypeInfo {
            struct_size: sys::XLA_FFI_TypeInfo_STRUCT_SIZE,
            extension_start: ptr::null_mut(),
            deleter: Some(deleter),
        })
    }
}

/// Per-executable state of type `T` that XLA keeps: handed over at INSTANTIATE, read at later stages, destroyed
/// (dropped) with the executable. Declare one `static` per type.
pub struct ExecutableState<T: Send + Sync + 'static> {
    name: &'static str,
    info: StateType,
    id: std::sync::OnceLock<TypeId>,
    _t: PhantomData<fn() -> T>,
}

/// How XLA destroys an [`ExecutableState`]'s object.
unsafe extern "C" fn drop_boxed<T>(p: *mut c_void) {
    if !p.is_null() {
        // SAFETY: XLA hands back the pointer `ExecutableState::instantiate` gave it (a leaked Box<T>, registered with
        // this deleter), once, when the executable dies.
        drop(unsafe { Box::from_raw(p.cast::<T>()) });
    }
}

impl<T: Send + Sync + 'static> ExecutableState<T> {
    /// State registered with XLA under `name` (unique per type in the process).
    pub const fn new(name: &'static str) -> Self {
        ExecutableState { name, info: StateType::new(drop_boxed::<T>), id: std::sync::OnceLock::new(), _t: PhantomData }
    }

    /// The type's id, registered on first use; `None` where XLA's table cannot register.
    fn id(&'static self, f: &CallFrame<'_>) -> Option<TypeId> {
        let id =
            *self.id.get_or_init(|| f.register_type(self.name, &self.info).unwrap_or(sys::XLA_FFI_UNKNOWN_TYPE_ID));
        (id.type_id != 0).then_some(id)
    }

    /// At INSTANTIATE: hands XLA `value` for this executable (what its calls must share); `value` comes back where XLA
    /// keeps none (no type registry, or state already set).
    pub fn instantiate_with(&'static self, f: &CallFrame<'_>, value: T) -> std::result::Result<(), T> {
        let Some(id) = self.id(f) else { return Err(value) };
        let state = Box::into_raw(Box::new(value));
        // SAFETY: `state` is a fresh Box<T>, the type registered as `id` with `drop_boxed::<T>`; XLA owns it on
        // success.
        if unsafe { f.state_set(ExecutionStage::Instantiate, id, state.cast()) }.is_err() {
            // SAFETY: XLA did not take it; it is still ours, taken back once.
            return Err(*unsafe { Box::from_raw(state) });
        }
        Ok(())
    }

    /// The executable's `T`, if XLA holds one (set at INSTANTIATE).
    pub fn get<'f>(&'static self, f: &'f CallFrame<'_>) -> Option<&'f T> {
        let id = *self.id.get().filter(|id| id.type_id != 0)?;
        let p = f.state_get(ExecutionStage::Instantiate, id).ok()?;
        // SAFETY: XLA keeps the state set at INSTANTIATE (a Box<T>, by the type id) alive until the executable is
        // destroyed, which cannot happen during one of its calls; it is only read through shared references (T: Sync).
        (!p.is_null()).then(|| unsafe { &*p.cast::<T>() })
    }
}

// --------------------------------------------------------------------------------------------- The guard

/// Runs handler body `f` on the frame XLA passed: answers the metadata probe, reporting `traits` (e.g.
/// [`COMMAND_BUFFER_COMPATIBLE`]), turns `Err` into an XLA error with [`HandlerError::code`] and a panic into
/// `INTERNAL` ("handler panicked: .."). Null means success, as XLA expects.
///
/// A failure that cannot be reported (a null frame, or one with no usable API table) aborts the process with a message
/// on stderr: returning null would report success over lost work. (A probe is the exception: leaving the metadata
/// unanswered already fails registration, with XLA's version-mismatch message.)
///
/// # Safety
/// `frame` is the call frame XLA passed to the handler, valid for the call.
pub unsafe fn guard_with_traits(
    frame: *mut XLA_FFI_CallFrame,
    traits: Traits,
    f: impl FnOnce(&CallFrame<'_>) -> Result<()>,
) -> *mut XLA_FFI_Error {
    // SAFETY: the caller's contract.
    let cf = match unsafe { CallFrame::from_raw(frame) } {
        Ok(cf) => cf,
        // SAFETY: the caller's contract.
        Err(e) => return unsafe { report_on_short_frame(frame, &e) },
    };
    let probe = cf.is_metadata_probe();
    let result = catch_unwind(AssertUnwindSafe(|| if probe { cf.answer_metadata_probe(traits) } else { f(&cf) }))
        .unwrap_or_else(|p| Err(HandlerError::Panic(crate::panic_text(&*p, "a non-string panic payload"))));
    match result {
        Ok(()) => ptr::null_mut(),
        Err(e) => {
            let err = cf.error(e.code(), &e.to_string());
            if err.is_null() {
                if !probe {
                    unreportable(&e);
                }
                eprintln!("peerless: XLA FFI metadata probe failed, and XLA gave no API to report it: {e}");
            }
            err
        }
    }
}

/// Reports `e` for a frame [`CallFrame::from_raw`] refused, through its API table if the frame is long enough to hold
/// one.
///
/// # Safety
/// `frame` is null or points to at least `struct_size` readable bytes of a call frame.
unsafe fn report_on_short_frame(frame: *mut XLA_FFI_CallFrame, e: &HandlerError) -> *mut XLA_FFI_Error {
    if !frame.is_null() {
        // SAFETY: `struct_size` (the first field) is present in every version.
        let size = unsafe { (*frame).struct_size };
        if size >= offset_of!(XLA_FFI_CallFrame, api) + size_of::<usize>() {
            // SAFETY: the size shows `api` is present.
            let api = unsafe { (*frame).api };
            if !api.is_null() {
                // SAFETY: XLA's table is static; `struct_size` is its first field.
                let api = unsafe { &*api };
                let err = make_error(api, e.code(), &e.to_string());
                if !err.is_null() {
                    return err;
                }
            }
        }
    }
    unreportable(e)
}

fn unreportable(e: &HandlerError) -> ! {
    eprintln!("peerless: an XLA FFI handler failed and XLA gave no way to report it; aborting: {e}");
    std::process::abort()
}
