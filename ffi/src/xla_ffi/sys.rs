//! The raw XLA FFI C ABI, API version 0.4 (jaxlib 0.11.2's `xla/ffi/api/c_api.h`), written by hand from its documented
//! layout: names, field order and enum values are XLA's; the prose is ours. Nothing here is checked by the compiler
//! against the header; the layout test (`tests/xla_ffi_layout.rs`) compiles a C program against jaxlib's header and
//! compares every size, offset, `*_STRUCT_SIZE` and enum value with these definitions.
//!
//! Conventions:
//! - C enums are `#[repr(transparent)]` newtypes over `i32` with associated constants, so a value this table does not
//!   know (a newer XLA's data type) is representable rather than undefined behaviour.
//! - Function pointers are `Option<unsafe extern "C" fn ..>`: nullable, pointer-sized. Calls Peerless never makes
//!   (handler registration, futures, device memory, thread pool, extensions) keep only their slot ([`Unused`]).
//! - `*_STRUCT_SIZE` is what the header's `XLA_FFI_STRUCT_SIZE(T, last)` computes: the offset of `last` plus its size.
//!   `last` is not always the final field (see [`XLA_FFI_Metadata_STRUCT_SIZE`],
//!   [`XLA_FFI_Type_Register_Args_STRUCT_SIZE`]); callers fill `struct_size` with it and XLA reads only that far.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_void};
use std::marker::{PhantomData, PhantomPinned};
use std::mem::{offset_of, size_of};

/// The API version these definitions describe (major: ABI breaks; minor: additions).
pub const XLA_FFI_API_MAJOR: c_int = 0;
pub const XLA_FFI_API_MINOR: c_int = 4;

/// The size of the field a projection `|s: &T| &s.f` selects (used by [`struct_size!`]).
const fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// `offset_of!(T, f) + size_of(field f)`: the header's `XLA_FFI_STRUCT_SIZE(T, f)`.
macro_rules! struct_size {
    ($t:ty, $f:ident) => {
        offset_of!($t, $f) + field_size(|s: &$t| &s.$f)
    };
}

/// An opaque C type: zero-sized, not constructible outside this module, neither `Send`, `Sync` nor `Unpin` (the
/// nomicon's pattern for incomplete types).
macro_rules! opaque {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[repr(C)]
        pub struct $name {
            _data: [u8; 0],
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }
    )*};
}

/// A C enum: an `i32` newtype with the header's values as associated constants.
macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $n:expr,)* }) => {
        $(#[$m])*
        #[repr(transparent)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(pub i32);
        impl $name {
            $($(#[$vm])* pub const $v: $name = $name($n);)*
        }
    };
}

/// API calls, each with its argument struct (`struct_size` and `extension_start` first, then the fields given), the
/// struct's `*_STRUCT_SIZE` (through field `last`) and the call's function type.
macro_rules! api_call {
    ($(
        $(#[$m:meta])* fn $f:ident(args: $args:ident) $(-> $ret:ty)? { $($(#[$fm:meta])* $field:ident: $ty:ty,)* }
        $(#[$sm:meta])* $size:ident = through $last:ident;
    )*) => {$(
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug)]
        pub struct $args {
            pub struct_size: usize,
            pub extension_start: *mut XLA_FFI_InternalExtension,
            $($(#[$fm])* pub $field: $ty,)*
        }
        $(#[$sm])*
        pub const $size: usize = struct_size!($args, $last);
        impl $args {
            /// What `struct_size` is set to (the `*_STRUCT_SIZE` above).
            pub const STRUCT_SIZE: usize = $size;
        }
        pub type $f = unsafe extern "C" fn(args: *mut $args) $(-> $ret)?;
    )*};
}

opaque! {
    /// XLA's private half of the API table (for handlers linked into XLA itself; unused here).
    XLA_FFI_InternalApi;
    /// An error (an `absl::Status` inside XLA). Owned by whoever receives it: XLA destroys one a handler returns; a
    /// handler destroys one an API call returns.
    XLA_FFI_Error;
    /// Per-call state (device, stream, execution state) that API calls take as `ctx`.
    XLA_FFI_InvokeContext;
    /// An asynchronous completion a handler may hand back in `XLA_FFI_CallFrame::future`.
    XLA_FFI_Future;
}

// --------------------------------------------------------------------------------------------- Extensions

c_enum! {
    /// The kind of an [`XLA_FFI_InternalExtension`].
    XLA_FFI_InternalExtension_Type {
        /// The registration-time probe: the extension is an [`XLA_FFI_Metadata_Extension`].
        XLA_FFI_Extension_Metadata = 1,
    }
}

/// The head of a chain of XLA-internal extensions (`extension_start` of most structs).
#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_InternalExtension {
    pub struct_size: usize,
    pub r#type: XLA_FFI_InternalExtension_Type,
    pub next: *mut XLA_FFI_InternalExtension,
}
pub const XLA_FFI_InternalExtension_STRUCT_SIZE: usize = struct_size!(XLA_FFI_InternalExtension, next);

// --------------------------------------------------------------------------------------------- Version

/// An API version; in [`XLA_FFI_Metadata`], the version a handler was built against.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct XLA_FFI_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub major_version: c_int,
    pub minor_version: c_int,
}
pub const XLA_FFI_Api_Version_STRUCT_SIZE: usize = struct_size!(XLA_FFI_Api_Version, minor_version);

// --------------------------------------------------------------------------------------------- Errors

c_enum! {
    /// Status codes (absl's canonical codes).
    XLA_FFI_Error_Code {
        OK = 0,
        CANCELLED = 1,
        UNKNOWN = 2,
        INVALID_ARGUMENT = 3,
        DEADLINE_EXCEEDED = 4,
        NOT_FOUND = 5,
        ALREADY_EXISTS = 6,
        PERMISSION_DENIED = 7,
        RESOURCE_EXHAUSTED = 8,
        FAILED_PRECONDITION = 9,
        ABORTED = 10,
        OUT_OF_RANGE = 11,
        UNIMPLEMENTED = 12,
        INTERNAL = 13,
        UNAVAILABLE = 14,
        DATA_LOSS = 15,
        UNAUTHENTICATED = 16,
    }
}

api_call! {
    fn XLA_FFI_Error_Create(args: XLA_FFI_Error_Create_Args) -> *mut XLA_FFI_Error {
        /// NUL-terminated; XLA copies it into the error.
        message: *const c_char,
        errc: XLA_FFI_Error_Code,
    }
    XLA_FFI_Error_Create_Args_STRUCT_SIZE = through errc;

    fn XLA_FFI_Error_GetDetails(args: XLA_FFI_Error_GetDetails_Args) {
        error: *mut XLA_FFI_Error,
        /// Out: valid while `error` lives.
        message: *const c_char,
        /// Out.
        errc: XLA_FFI_Error_Code,
    }
    XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE = through errc;

    fn XLA_FFI_Error_Destroy(args: XLA_FFI_Error_Destroy_Args) {
        error: *mut XLA_FFI_Error,
    }
    XLA_FFI_Error_Destroy_Args_STRUCT_SIZE = through error;
}

// --------------------------------------------------------------------------------------------- Data types, buffers,
//  attributes

c_enum! {
    /// Element types; the values are `xla::PrimitiveType`'s.
    XLA_FFI_DataType {
        INVALID = 0,
        PRED = 1,
        S1 = 30,
        S2 = 26,
        S4 = 21,
        S8 = 2,
        S16 = 3,
        S32 = 4,
        S64 = 5,
        U1 = 31,
        U2 = 27,
        U4 = 22,
        U8 = 6,
        U16 = 7,
        U32 = 8,
        U64 = 9,
        F16 = 10,
        F32 = 11,
        F64 = 12,
        BF16 = 16,
        C64 = 15,
        C128 = 18,
        TOKEN = 17,
        F8E5M2 = 19,
        F8E3M4 = 29,
        F8E4M3 = 28,
        F8E4M3FN = 20,
        F8E4M3B11FNUZ = 23,
        F8E5M2FNUZ = 24,
        F8E4M3FNUZ = 25,
        F4E2M1FN = 32,
        F8E8M0FNU = 33,
    }
}

/// A dense array argument or result (row-major, the default layout).
#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_Buffer {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub dtype: XLA_FFI_DataType,
    pub data: *mut c_void,
    pub rank: i64,
    /// `rank` entries.
    pub dims: *mut i64,
}
pub const XLA_FFI_Buffer_STRUCT_SIZE: usize = struct_size!(XLA_FFI_Buffer, dims);

c_enum! {
    /// What an entry of `XLA_FFI_Args::args` points to.
    XLA_FFI_ArgType {
        /// An [`XLA_FFI_Buffer`].
        BUFFER = 1,
    }
}

c_enum! {
    /// What an entry of `XLA_FFI_Rets::rets` points to.
    XLA_FFI_RetType {
        /// An [`XLA_FFI_Buffer`].
        BUFFER = 1,
    }
}

c_enum! {
    /// What an entry of `XLA_FFI_Attrs::attrs` points to.
    XLA_FFI_AttrType {
        /// An [`XLA_FFI_Array`].
        ARRAY = 1,
        /// A nested [`XLA_FFI_Attrs`].
        DICTIONARY = 2,
        /// An [`XLA_FFI_Scalar`].
        SCALAR = 3,
        /// An [`XLA_FFI_ByteSpan`].
        STRING = 4,
    }
}

/// A byte string, not NUL-terminated.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct XLA_FFI_ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

/// A scalar attribute: `value` points to one element of `dtype`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct XLA_FFI_Scalar {
    pub dtype: XLA_FFI_DataType,
    pub value: *mut c_void,
}

/// An array attribute: `size` elements of `dtype` at `data`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct XLA_FFI_Array {
    pub dtype: XLA_FFI_DataType,
    pub size: usize,
    pub data: *mut c_void,
}

// --------------------------------------------------------------------------------------------- Type registry

/// A user type's id; 0 ([`XLA_FFI_UNKNOWN_TYPE_ID`]) asks XLA to assign one.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct XLA_FFI_TypeId {
    pub type_id: i64,
}

/// The id that means "not registered" / "assign one".
pub const XLA_FFI_UNKNOWN_TYPE_ID: XLA_FFI_TypeId = XLA_FFI_TypeId { type_id: 0 };

/// How XLA destroys objects of a registered type (execution state).
#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_TypeInfo {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub deleter: Option<unsafe extern "C" fn(object: *mut c_void)>,
}
pub const XLA_FFI_TypeInfo_STRUCT_SIZE: usize = struct_size!(XLA_FFI_TypeInfo, deleter);

// --------------------------------------------------------------------------------------------- Call frame

c_enum! {
    /// The stage a handler is called for.
    XLA_FFI_ExecutionStage {
        INSTANTIATE = 0,
        PREPARE = 1,
        INITIALIZE = 2,
        EXECUTE = 3,
        RECORD = 4,
    }
}

#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub size: i64,
    /// `size` entries.
    pub types: *mut XLA_FFI_ArgType,
    /// `size` entries.
    pub args: *mut *mut c_void,
}
pub const XLA_FFI_Args_STRUCT_SIZE: usize = struct_size!(XLA_FFI_Args, args);

#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_Rets {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub size: i64,
    /// `size` entries.
    pub types: *mut XLA_FFI_RetType,
    /// `size` entries.
    pub rets: *mut *mut c_void,
}
pub const XLA_FFI_Rets_STRUCT_SIZE: usize = struct_size!(XLA_FFI_Rets, rets);

/// Attributes, sorted by name.
#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_Attrs {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub size: i64,
    /// `size` entries.
    pub types: *mut XLA_FFI_AttrType,
    /// `size` entries.
    pub names: *mut *mut XLA_FFI_ByteSpan,
    /// `size` entries.
    pub attrs: *mut *mut c_void,
}
pub const XLA_FFI_Attrs_STRUCT_SIZE: usize = struct_size!(XLA_FFI_Attrs, attrs);

/// What a handler receives.
#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_CallFrame {
    pub struct_size: usize,
    /// Non-null with type [`XLA_FFI_InternalExtension_Type::XLA_FFI_Extension_Metadata`] in the registration-time
    /// metadata probe.
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub api: *const XLA_FFI_Api,
    pub ctx: *mut XLA_FFI_InvokeContext,
    pub stage: XLA_FFI_ExecutionStage,
    pub args: XLA_FFI_Args,
    pub rets: XLA_FFI_Rets,
    pub attrs: XLA_FFI_Attrs,
    /// Out: set by an asynchronous handler.
    pub future: *mut XLA_FFI_Future,
}
/// Ends at `attrs`, not at `future`.
pub const XLA_FFI_CallFrame_STRUCT_SIZE: usize = struct_size!(XLA_FFI_CallFrame, attrs);

// --------------------------------------------------------------------------------------------- Handlers

/// A handler: null means success; otherwise an error XLA takes ownership of.
pub type XLA_FFI_Handler = unsafe extern "C" fn(call_frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error;

/// A bit set of `XLA_FFI_HANDLER_TRAITS_*`.
pub type XLA_FFI_Handler_Traits = u32;
/// The handler launches the same device work on every call, so it may be captured into a command buffer (a CUDA graph).
pub const XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE: XLA_FFI_Handler_Traits = 1 << 0;

// --------------------------------------------------------------------------------------------- Type registration,
//  invoke context

api_call! {
    fn XLA_FFI_Type_Register(args: XLA_FFI_Type_Register_Args) -> *mut XLA_FFI_Error {
        name: XLA_FFI_ByteSpan,
        /// In and out.
        type_id: *mut XLA_FFI_TypeId,
        type_info: *const XLA_FFI_TypeInfo,
    }
    /// Ends at `type_id`, not at `type_info`.
    XLA_FFI_Type_Register_Args_STRUCT_SIZE = through type_id;

}

// --------------------------------------------------------------------------------------------- State

api_call! {
    fn XLA_FFI_State_Set(args: XLA_FFI_State_Set_Args) -> *mut XLA_FFI_Error {
        ctx: *mut XLA_FFI_InvokeContext,
        stage: XLA_FFI_ExecutionStage,
        type_id: *mut XLA_FFI_TypeId,
        state: *mut c_void,
    }
    XLA_FFI_State_Set_Args_STRUCT_SIZE = through state;

    fn XLA_FFI_State_Get(args: XLA_FFI_State_Get_Args) -> *mut XLA_FFI_Error {
        ctx: *mut XLA_FFI_InvokeContext,
        stage: XLA_FFI_ExecutionStage,
        type_id: *mut XLA_FFI_TypeId,
        /// Out.
        state: *mut c_void,
    }
    XLA_FFI_State_Get_Args_STRUCT_SIZE = through state;
}

// --------------------------------------------------------------------------------------------- Stream, run id, device
//  ordinal

api_call! {
    fn XLA_FFI_Stream_Get(args: XLA_FFI_Stream_Get_Args) -> *mut XLA_FFI_Error {
        ctx: *mut XLA_FFI_InvokeContext,
        /// Out: the platform's stream (a `CUstream` on CUDA).
        stream: *mut c_void,
    }
    XLA_FFI_Stream_Get_Args_STRUCT_SIZE = through stream;

    fn XLA_FFI_RunId_Get(args: XLA_FFI_RunId_Get_Args) -> *mut XLA_FFI_Error {
        ctx: *mut XLA_FFI_InvokeContext,
        /// Out.
        run_id: i64,
    }
    XLA_FFI_RunId_Get_Args_STRUCT_SIZE = through run_id;

    fn XLA_FFI_DeviceOrdinal_Get(args: XLA_FFI_DeviceOrdinal_Get_Args) -> *mut XLA_FFI_Error {
        ctx: *mut XLA_FFI_InvokeContext,
        /// Out.
        device_ordinal: i32,
    }
    XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE = through device_ordinal;
}

// --------------------------------------------------------------------------------------------- Metadata (the
//  registration-time probe)

/// What a handler reports when probed: the API version it was built against, its traits, and the type id of the state
/// its instantiate stage creates.
#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_Metadata {
    pub struct_size: usize,
    pub api_version: XLA_FFI_Api_Version,
    pub traits: XLA_FFI_Handler_Traits,
    pub state_type_id: XLA_FFI_TypeId,
}
/// Ends at `traits`, not at `state_type_id` (XLA 0.11.2 passes exactly this size, so `state_type_id` is written only
/// when `struct_size` covers it).
pub const XLA_FFI_Metadata_STRUCT_SIZE: usize = struct_size!(XLA_FFI_Metadata, traits);

/// The extension a metadata probe's call frame starts with.
#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_Metadata_Extension {
    pub extension_base: XLA_FFI_InternalExtension,
    pub metadata: *mut XLA_FFI_Metadata,
}
pub const XLA_FFI_Metadata_Extension_STRUCT_SIZE: usize = struct_size!(XLA_FFI_Metadata_Extension, metadata);

// --------------------------------------------------------------------------------------------- The API table

/// A slot of [`XLA_FFI_Api`] Peerless never calls: pointer-sized and nullable like the others, so the table keeps XLA's
/// layout without mirroring those calls' argument structs (add a call's ABI back before using it).
pub type Unused = unsafe extern "C" fn();

/// XLA's function table, reached through `XLA_FFI_CallFrame::api`. A slot past `struct_size` does not exist in the XLA
/// that made the table.
#[repr(C)]
#[derive(Debug)]
pub struct XLA_FFI_Api {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_InternalExtension,
    pub api_version: XLA_FFI_Api_Version,
    pub internal_api: *const XLA_FFI_InternalApi,
    pub XLA_FFI_Error_Create: Option<XLA_FFI_Error_Create>,
    pub XLA_FFI_Error_GetDetails: Option<XLA_FFI_Error_GetDetails>,
    pub XLA_FFI_Error_Destroy: Option<XLA_FFI_Error_Destroy>,
    pub XLA_FFI_Handler_Register: Option<Unused>,
    pub XLA_FFI_Stream_Get: Option<XLA_FFI_Stream_Get>,
    pub XLA_FFI_Type_Register: Option<XLA_FFI_Type_Register>,
    pub XLA_FFI_InvokeContext_Get: Option<Unused>,
    pub XLA_FFI_State_Set: Option<XLA_FFI_State_Set>,
    pub XLA_FFI_State_Get: Option<XLA_FFI_State_Get>,
    pub XLA_FFI_DeviceMemory_Allocate: Option<Unused>,
    pub XLA_FFI_DeviceMemory_Free: Option<Unused>,
    pub XLA_FFI_ThreadPool_Schedule: Option<Unused>,
    pub XLA_FFI_ThreadPool_NumThreads: Option<Unused>,
    pub XLA_FFI_Future_Create: Option<Unused>,
    pub XLA_FFI_Future_SetAvailable: Option<Unused>,
    pub XLA_FFI_Future_SetError: Option<Unused>,
    pub XLA_FFI_RunId_Get: Option<XLA_FFI_RunId_Get>,
    pub XLA_FFI_DeviceOrdinal_Get: Option<XLA_FFI_DeviceOrdinal_Get>,
    pub XLA_FFI_InvokeContext_FindExtension: Option<Unused>,
}
pub const XLA_FFI_Api_STRUCT_SIZE: usize = struct_size!(XLA_FFI_Api, XLA_FFI_InvokeContext_FindExtension);
