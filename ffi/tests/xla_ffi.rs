//! The safe layer on hand-built call frames and a fake API table whose calls record what
//! they were given. Test memory is leaked: frames must outlive every reference the layer
//! hands out, and a test process is short.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use ffi::xla_ffi::sys::{self, XLA_FFI_DataType as DT};
use ffi::xla_ffi::*;

/// [`guard_with_traits`] with no traits, as a plain handler reports them.
///
/// # Safety
/// `frame` is the call frame XLA passed to the handler, valid for the call.
unsafe fn guard(
    frame: *mut XLA_FFI_CallFrame,
    f: impl FnOnce(&CallFrame<'_>) -> Result<(), HandlerError>,
) -> *mut XLA_FFI_Error {
    // SAFETY: the caller's contract.
    unsafe { guard_with_traits(frame, 0, f) }
}

/// Defines an XLA FFI handler, `unsafe extern "C" fn $name(*mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error`, whose body
/// sees the frame as `&CallFrame` and returns `Result<(), HandlerError>`, under [`guard`].
macro_rules! xla_ffi_handler {
    ($(#[$m:meta])* $vis:vis fn $name:ident($frame:ident) $body:block) => {
        $(#[$m])*
        ///
        /// # Safety
        /// `frame` is a call frame XLA passed, valid for the call.
        $vis unsafe extern "C" fn $name(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
            // SAFETY: this function's contract.
            unsafe { guard(frame, |$frame: &CallFrame<'_>| -> Result<(), HandlerError> { $body }) }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// The fake XLA

/// What `XLA_FFI_Error` points to in the fake.
struct FakeError {
    code: sys::XLA_FFI_Error_Code,
    message: CString,
}

static DESTROYED: AtomicUsize = AtomicUsize::new(0);

fn new_error(code: sys::XLA_FFI_Error_Code, message: &str) -> *mut XLA_FFI_Error {
    let e = Box::new(FakeError { code, message: CString::new(message).unwrap() });
    Box::into_raw(e) as *mut XLA_FFI_Error
}

unsafe extern "C" fn fake_error_create(args: *mut sys::XLA_FFI_Error_Create_Args) -> *mut XLA_FFI_Error {
    // SAFETY: the layer passes initialised args with a NUL-terminated message.
    let a = unsafe { &*args };
    assert_eq!(a.struct_size, sys::XLA_FFI_Error_Create_Args_STRUCT_SIZE);
    // SAFETY: as above.
    let msg = unsafe { CStr::from_ptr(a.message) };
    new_error(a.errc, &msg.to_string_lossy())
}

unsafe extern "C" fn fake_error_get_details(args: *mut sys::XLA_FFI_Error_GetDetails_Args) {
    // SAFETY: the layer passes initialised args naming a live fake error.
    let a = unsafe { &mut *args };
    // SAFETY: as above.
    let e = unsafe { &*(a.error as *const FakeError) };
    a.errc = e.code;
    a.message = e.message.as_ptr();
}

unsafe extern "C" fn fake_error_destroy(args: *mut sys::XLA_FFI_Error_Destroy_Args) {
    // SAFETY: the layer passes a live fake error it owns.
    drop(unsafe { Box::from_raw((*args).error as *mut FakeError) });
    DESTROYED.fetch_add(1, Ordering::SeqCst);
}

/// What `XLA_FFI_InvokeContext` points to in the fake.
#[derive(Default)]
struct FakeCtx {
    /// Null: answer Stream_Get as XLA:CPU does.
    stream: usize,
    ordinal: i32,
    run_id: i64,
    state: RefCell<HashMap<(i32, i64), usize>>,
}

fn ctx_of<'a>(ctx: *mut sys::XLA_FFI_InvokeContext) -> &'a FakeCtx {
    // SAFETY: fake frames' contexts are leaked FakeCtx values.
    unsafe { &*(ctx as *const FakeCtx) }
}

unsafe extern "C" fn fake_stream_get(args: *mut sys::XLA_FFI_Stream_Get_Args) -> *mut XLA_FFI_Error {
    // SAFETY: the layer passes initialised args.
    let a = unsafe { &mut *args };
    let c = ctx_of(a.ctx);
    if c.stream == 0 {
        return new_error(sys::XLA_FFI_Error_Code::UNIMPLEMENTED, "XLA FFI GPU context is not available");
    }
    a.stream = c.stream as *mut c_void;
    ptr::null_mut()
}

unsafe extern "C" fn fake_ordinal_get(args: *mut sys::XLA_FFI_DeviceOrdinal_Get_Args) -> *mut XLA_FFI_Error {
    // SAFETY: the layer passes initialised args.
    let a = unsafe { &mut *args };
    a.device_ordinal = ctx_of(a.ctx).ordinal;
    ptr::null_mut()
}

unsafe extern "C" fn fake_run_id_get(args: *mut sys::XLA_FFI_RunId_Get_Args) -> *mut XLA_FFI_Error {
    // SAFETY: the layer passes initialised args.
    let a = unsafe { &mut *args };
    a.run_id = ctx_of(a.ctx).run_id;
    ptr::null_mut()
}

unsafe extern "C" fn fake_state_set(args: *mut sys::XLA_FFI_State_Set_Args) -> *mut XLA_FFI_Error {
    // SAFETY: the layer passes initialised args with a live type id.
    let a = unsafe { &*args };
    // SAFETY: as above.
    let key = (a.stage.0, unsafe { (*a.type_id).type_id });
    let mut state = ctx_of(a.ctx).state.borrow_mut();
    if state.contains_key(&key) {
        return new_error(sys::XLA_FFI_Error_Code::ALREADY_EXISTS, "state already set");
    }
    state.insert(key, a.state as usize);
    ptr::null_mut()
}

unsafe extern "C" fn fake_state_get(args: *mut sys::XLA_FFI_State_Get_Args) -> *mut XLA_FFI_Error {
    // SAFETY: the layer passes initialised args with a live type id.
    let a = unsafe { &mut *args };
    // SAFETY: as above.
    let key = (a.stage.0, unsafe { (*a.type_id).type_id });
    match ctx_of(a.ctx).state.borrow().get(&key) {
        Some(&p) => {
            a.state = p as *mut c_void;
            ptr::null_mut()
        }
        None => new_error(sys::XLA_FFI_Error_Code::NOT_FOUND, "no state"),
    }
}

fn fake_api() -> sys::XLA_FFI_Api {
    sys::XLA_FFI_Api {
        struct_size: sys::XLA_FFI_Api_STRUCT_SIZE,
        extension_start: ptr::null_mut(),
        api_version: sys::XLA_FFI_Api_Version {
            struct_size: sys::XLA_FFI_Api_Version_STRUCT_SIZE,
            extension_start: ptr::null_mut(),
            major_version: 0,
            minor_version: 4,
        },
        internal_api: ptr::null(),
        XLA_FFI_Error_Create: Some(fake_error_create),
        XLA_FFI_Error_GetDetails: Some(fake_error_get_details),
        XLA_FFI_Error_Destroy: Some(fake_error_destroy),
        XLA_FFI_Handler_Register: None,
        XLA_FFI_Stream_Get: Some(fake_stream_get),
        XLA_FFI_Type_Register: None,
        XLA_FFI_InvokeContext_Get: None,
        XLA_FFI_State_Set: Some(fake_state_set),
        XLA_FFI_State_Get: Some(fake_state_get),
        XLA_FFI_DeviceMemory_Allocate: None,
        XLA_FFI_DeviceMemory_Free: None,
        XLA_FFI_ThreadPool_Schedule: None,
        XLA_FFI_ThreadPool_NumThreads: None,
        XLA_FFI_Future_Create: None,
        XLA_FFI_Future_SetAvailable: None,
        XLA_FFI_Future_SetError: None,
        XLA_FFI_RunId_Get: Some(fake_run_id_get),
        XLA_FFI_DeviceOrdinal_Get: Some(fake_ordinal_get),
        XLA_FFI_InvokeContext_FindExtension: None,
    }
}

/// Takes an error the layer returned: (code, message).
fn take(err: *mut XLA_FFI_Error) -> (sys::XLA_FFI_Error_Code, String) {
    assert!(!err.is_null(), "expected an error, got success");
    // SAFETY: errors in these tests come from the fake's Error_Create.
    let e = unsafe { Box::from_raw(err as *mut FakeError) };
    (e.code, e.message.to_string_lossy().into_owned())
}

fn leak<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

// ---------------------------------------------------------------------------------------------
// Frames

/// An attribute: type and pointer.
struct A(sys::XLA_FFI_AttrType, *mut c_void);

fn scalar<T>(dtype: DT, v: T) -> A {
    A(sys::XLA_FFI_AttrType::SCALAR, leak(sys::XLA_FFI_Scalar { dtype, value: leak(v) as *mut c_void }) as *mut c_void)
}

fn array<T>(dtype: DT, v: Vec<T>) -> A {
    let v = v.leak();
    let arr = sys::XLA_FFI_Array { dtype, size: v.len(), data: v.as_mut_ptr() as *mut c_void };
    A(sys::XLA_FFI_AttrType::ARRAY, leak(arr) as *mut c_void)
}

fn bytes(b: &[u8]) -> A {
    let b = b.to_vec().leak();
    let span = sys::XLA_FFI_ByteSpan { ptr: b.as_ptr() as *const _, len: b.len() };
    A(sys::XLA_FFI_AttrType::STRING, leak(span) as *mut c_void)
}

fn string(s: &str) -> A {
    bytes(s.as_bytes())
}

fn buffer(dtype: DT, dims: &[i64], data: usize) -> *mut c_void {
    let dims = dims.to_vec().leak();
    leak(sys::XLA_FFI_Buffer {
        struct_size: sys::XLA_FFI_Buffer_STRUCT_SIZE,
        extension_start: ptr::null_mut(),
        dtype,
        data: data as *mut c_void,
        rank: dims.len() as i64,
        dims: dims.as_mut_ptr(),
    }) as *mut c_void
}

struct Frame {
    api: *const sys::XLA_FFI_Api,
    ctx: FakeCtx,
    ext: *mut sys::XLA_FFI_InternalExtension,
    args: Vec<*mut c_void>,
    rets: Vec<*mut c_void>,
    attrs: Vec<(String, A)>,
}

impl Frame {
    fn new() -> Frame {
        Frame {
            api: leak(fake_api()),
            ctx: FakeCtx::default(),
            ext: ptr::null_mut(),
            args: vec![],
            rets: vec![],
            attrs: vec![],
        }
    }

    fn arg(mut self, b: *mut c_void) -> Frame {
        self.args.push(b);
        self
    }

    fn ret(mut self, b: *mut c_void) -> Frame {
        self.rets.push(b);
        self
    }

    fn attr(mut self, name: &str, a: A) -> Frame {
        self.attrs.push((name.into(), a));
        self
    }

    /// The frame, attributes sorted by name as XLA sorts them.
    fn build(mut self) -> *mut XLA_FFI_CallFrame {
        self.attrs.sort_by(|a, b| a.0.cmp(&b.0));
        let n_args = self.args.len() as i64;
        let n_rets = self.rets.len() as i64;
        let n_attrs = self.attrs.len() as i64;
        let names: Vec<*mut sys::XLA_FFI_ByteSpan> = self
            .attrs
            .iter()
            .map(|(n, _)| {
                let b = n.as_bytes().to_vec().leak();
                leak(sys::XLA_FFI_ByteSpan { ptr: b.as_ptr() as *const _, len: b.len() })
            })
            .collect();
        let (attr_types, attr_ptrs): (Vec<_>, Vec<_>) = self.attrs.iter().map(|(_, A(t, p))| (*t, *p)).unzip();
        leak(XLA_FFI_CallFrame {
            struct_size: sys::XLA_FFI_CallFrame_STRUCT_SIZE,
            extension_start: self.ext,
            api: self.api,
            ctx: leak(self.ctx) as *mut sys::XLA_FFI_InvokeContext,
            stage: sys::XLA_FFI_ExecutionStage::EXECUTE,
            args: sys::XLA_FFI_Args {
                struct_size: sys::XLA_FFI_Args_STRUCT_SIZE,
                extension_start: ptr::null_mut(),
                size: n_args,
                types: vec![sys::XLA_FFI_ArgType::BUFFER; self.args.len()].leak().as_mut_ptr(),
                args: self.args.leak().as_mut_ptr(),
            },
            rets: sys::XLA_FFI_Rets {
                struct_size: sys::XLA_FFI_Rets_STRUCT_SIZE,
                extension_start: ptr::null_mut(),
                size: n_rets,
                types: vec![sys::XLA_FFI_RetType::BUFFER; self.rets.len()].leak().as_mut_ptr(),
                rets: self.rets.leak().as_mut_ptr(),
            },
            attrs: sys::XLA_FFI_Attrs {
                struct_size: sys::XLA_FFI_Attrs_STRUCT_SIZE,
                extension_start: ptr::null_mut(),
                size: n_attrs,
                types: attr_types.leak().as_mut_ptr(),
                names: names.leak().as_mut_ptr(),
                attrs: attr_ptrs.leak().as_mut_ptr(),
            },
            future: ptr::null_mut(),
        })
    }
}

/// Runs `f` on `frame` (a leaked fake frame) as a handler body would see it.
fn with<R>(frame: *mut XLA_FFI_CallFrame, f: impl FnOnce(&CallFrame<'static>) -> R) -> R {
    // SAFETY: fake frames are leaked, valid for the rest of the process.
    let cf = unsafe { CallFrame::from_raw(frame) }.expect("a well-formed frame");
    f(&cf)
}

fn frame_mut<'a>(frame: *mut XLA_FFI_CallFrame) -> &'a mut XLA_FFI_CallFrame {
    // SAFETY: fake frames are leaked and used by one test thread.
    unsafe { &mut *frame }
}

// ---------------------------------------------------------------------------------------------
// Data types, codes

#[test]
fn data_types_round_trip_and_have_xla_names() {
    for n in -1..40 {
        let t = DataType::from_raw(DT(n));
        assert_eq!(t.to_raw(), DT(n));
        if !matches!(t, DataType::Unknown(_)) {
            assert_ne!(t.name(), "unknown");
        }
    }
    assert_eq!(DataType::from_raw(DT::F32), DataType::F32);
    assert_eq!(DataType::from_raw(DT(34)), DataType::Unknown(34));
    assert_eq!(DataType::BF16.name(), "bf16");
    assert_eq!(DataType::F8E4M3FN.name(), "f8e4m3fn");
    assert_eq!(DataType::F8E4M3B11FNUZ.name(), "f8e4m3b11fnuz");
    assert_eq!(DataType::Pred.to_string(), "pred");
    assert_eq!(DataType::Unknown(99).to_string(), "unknown data type 99");
}

#[test]
fn widths_pack_sub_byte_types() {
    assert_eq!(DataType::F32.byte_width(), Some(4));
    assert_eq!(DataType::C128.byte_width(), Some(16));
    assert_eq!(DataType::Pred.byte_width(), Some(1));
    assert_eq!(DataType::F8E5M2.byte_width(), Some(1));
    assert_eq!(DataType::Token.byte_width(), Some(0));
    for t in [
        DataType::S1,
        DataType::S2,
        DataType::S4,
        DataType::U4,
        DataType::F4E2M1FN,
        DataType::Invalid,
        DataType::Unknown(77),
    ] {
        assert_eq!(t.byte_width(), None, "{t}");
    }
    assert_eq!(DataType::S4.byte_len(8), Some(4));
    assert_eq!(DataType::S4.byte_len(3), Some(2));
    assert_eq!(DataType::U2.byte_len(8), Some(2));
    assert_eq!(DataType::S1.byte_len(9), Some(2));
    assert_eq!(DataType::F32.byte_len(3), Some(12));
    assert_eq!(DataType::Invalid.byte_len(1), None);
    assert_eq!(DataType::F64.byte_len(usize::MAX), None);
}

#[test]
fn error_codes_round_trip() {
    for n in 0..=16 {
        assert_eq!(ErrorCode::from_raw(sys::XLA_FFI_Error_Code(n)).to_raw().0, n);
    }
    assert_eq!(ErrorCode::from_raw(sys::XLA_FFI_Error_Code(99)), ErrorCode::Unknown);
    assert_eq!(ErrorCode::InvalidArgument.to_string(), "INVALID_ARGUMENT");
    for n in 0..=5 {
        assert_eq!(ExecutionStage::from_raw(sys::XLA_FFI_ExecutionStage(n)).to_raw().0, n);
    }
}

// ---------------------------------------------------------------------------------------------
// Buffers

#[test]
fn buffers() {
    let f = Frame::new()
        .arg(buffer(DT::F32, &[2, 3], 0x1000))
        .arg(buffer(DT::S4, &[8], 0x2000))
        .arg(buffer(DT::S32, &[], 0x3000))
        .ret(buffer(DT::BF16, &[4, 0], 0x4000))
        .build();
    with(f, |cf| {
        assert_eq!(cf.stage(), ExecutionStage::Execute);
        assert_eq!(cf.arg_count().unwrap(), 3);
        let a = cf.args().unwrap();
        assert_eq!((a[0].dtype, a[0].dims, a[0].data as usize), (DataType::F32, &[2i64, 3][..], 0x1000));
        assert_eq!((a[0].element_count().unwrap(), a[0].byte_len().unwrap()), (6, 24));
        assert_eq!((a[1].element_count().unwrap(), a[1].byte_len().unwrap()), (8, 4));
        assert_eq!((a[2].dims.len(), a[2].element_count().unwrap(), a[2].byte_len().unwrap()), (0, 1, 4));
        let r = cf.rets().unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].dtype, r[0].byte_len().unwrap(), r[0].data as usize), (DataType::BF16, 0, 0x4000));
        assert_eq!(cf.arg(3).unwrap_err(), HandlerError::OutOfRange { what: "argument", index: 3, count: 3 });
        assert_eq!(cf.ret(1).unwrap_err().to_string(), "result 1 out of range: the call has 1");
    });
}

#[test]
fn malformed_buffers_are_frame_errors() {
    let neg_dim = buffer(DT::F32, &[2, -1], 0);
    let unknown = buffer(DT(99), &[2], 0);
    let f = Frame::new().arg(neg_dim).arg(unknown).arg(ptr::null_mut()).arg(buffer(DT::F32, &[1], 0)).build();
    with(f, |cf| {
        assert!(matches!(cf.arg(0).unwrap().byte_len(), Err(HandlerError::Frame(m)) if m.contains("negative")));
        let e = cf.arg(1).unwrap().byte_len().unwrap_err();
        assert_eq!(
            (e.code(), e.to_string()),
            (ErrorCode::InvalidArgument, "no byte size for a unknown data type 99 buffer".into())
        );
        assert_eq!(cf.arg(2).unwrap_err(), HandlerError::Frame("argument 2 is null".into()));
        assert!(cf.args().is_err());
    });
    // A non-buffer operand type, a negative rank, null dims, a short buffer struct.
    let fm = frame_mut(f);
    // SAFETY: the fake frame's lists hold 4 entries.
    unsafe { *fm.args.types.add(3) = sys::XLA_FFI_ArgType(7) };
    with(f, |cf| assert_eq!(cf.arg(3).unwrap_err(), HandlerError::Frame("argument 3 has type 7, not a buffer".into())));
    for (patch, msg) in [
        (sys::XLA_FFI_Buffer { rank: -1, ..f32_buffer() }, "argument 0: rank -1"),
        (sys::XLA_FFI_Buffer { dims: ptr::null_mut(), ..f32_buffer() }, "argument 0: rank 2 with null dims"),
        (sys::XLA_FFI_Buffer { struct_size: 16, ..f32_buffer() }, "argument 0: buffer size 16"),
    ] {
        // SAFETY: the fake frame's lists hold 4 entries.
        unsafe { *fm.args.args = leak(patch) as *mut c_void };
        with(f, |cf| assert_eq!(cf.arg(0).unwrap_err(), HandlerError::Frame(msg.into())));
    }
    // Lists: a negative count, a count with null lists.
    fm.args.size = -2;
    with(f, |cf| assert_eq!(cf.arg_count().unwrap_err(), HandlerError::Frame("argument count -2".into())));
    fm.args.size = 1;
    fm.args.args = ptr::null_mut();
    with(f, |cf| assert_eq!(cf.arg(0).unwrap_err(), HandlerError::Frame("1 arguments at a null list".into())));
}

/// A well-formed f32[2, 3] buffer struct, for patching.
fn f32_buffer() -> sys::XLA_FFI_Buffer {
    let dims = vec![2i64, 3].leak();
    sys::XLA_FFI_Buffer {
        struct_size: sys::XLA_FFI_Buffer_STRUCT_SIZE,
        extension_start: ptr::null_mut(),
        dtype: DT::F32,
        data: ptr::null_mut(),
        rank: 2,
        dims: dims.as_mut_ptr(),
    }
}

// ---------------------------------------------------------------------------------------------
// Attributes

fn attr_frame() -> *mut XLA_FFI_CallFrame {
    Frame::new()
        .attr("n", scalar(DT::S64, 42i64))
        .attr("n32", scalar(DT::S32, -7i32))
        .attr("big", scalar(DT::U64, u64::MAX))
        .attr("u8", scalar(DT::U8, 200u8))
        .attr("x", scalar(DT::F64, 1.5f64))
        .attr("x32", scalar(DT::F32, 0.25f32))
        .attr("flag", scalar(DT::PRED, 1u8))
        .attr("half", scalar(DT::F16, 0u16))
        .attr("name", string("ring"))
        .attr("empty", string(""))
        .attr("bad_utf8", bytes(&[0xff, 0xfe]))
        .attr("dims", array(DT::S64, vec![1i64, 2, 3]))
        .attr("dims32", array(DT::S32, vec![4i32, -5]))
        .attr("udims", array(DT::U64, vec![1u64, u64::MAX]))
        .attr("none", array::<i64>(DT::S64, vec![]))
        .attr("scales", array(DT::F32, vec![0.5f32, 2.0]))
        .build()
}

#[test]
fn attributes_by_name() {
    with(attr_frame(), |cf| {
        assert_eq!(cf.attr_count().unwrap(), 16);
        let names = cf.attr_names().unwrap();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert!(names.contains(&"dims32"));

        assert_eq!(cf.attr_i64("n").unwrap(), 42);
        assert_eq!(cf.attr_i64("n32").unwrap(), -7);
        assert_eq!(cf.attr_i64("u8").unwrap(), 200);
        assert_eq!(cf.attr_str("name").unwrap(), "ring");
        assert_eq!(cf.attr_str("empty").unwrap(), "");
        assert_eq!(cf.attr_i64_array("dims").unwrap(), vec![1, 2, 3]);
        assert_eq!(cf.attr_i64_array("dims32").unwrap(), vec![4, -5]);
        assert_eq!(cf.attr_i64_array("none").unwrap(), Vec::<i64>::new());
        assert!(matches!(cf.attr("half").unwrap(), Attr::Scalar(Scalar::Other(DataType::F16))));
        assert!(cf.attr_opt("absent").unwrap().is_none());
        match cf.attr("dims").unwrap() {
            Attr::Array(a) => assert_eq!((a.dtype, a.len), (DataType::S64, 3)),
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn attribute_errors_name_the_attribute_and_what_was_found() {
    with(attr_frame(), |cf| {
        let e = cf.attr_i64("absent").unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        let msg = e.to_string();
        assert!(msg.starts_with("attribute `absent` not found (attributes: bad_utf8, big, dims, "), "{msg}");

        let cases: [(Result<()>, &str); 7] = [
            (cf.attr_i64("name").map(drop), "attribute `name`: expected an integer scalar fitting i64, found string"),
            (cf.attr_i64("x").map(drop), "attribute `x`: expected an integer scalar fitting i64, found scalar f64 1.5"),
            (
                cf.attr_i64("big").map(drop),
                "attribute `big`: expected an integer scalar fitting i64, found scalar u64 18446744073709551615",
            ),
            (cf.attr_str("dims").map(drop), "attribute `dims`: expected a string, found array of s64 (3 elements)"),
            (
                cf.attr_str("bad_utf8").map(drop),
                "attribute `bad_utf8`: expected a UTF-8 string, found bytes [255, 254]",
            ),
            (
                cf.attr_i64_array("scales").map(drop),
                "attribute `scales`: expected an integer array fitting i64, found array of f32 (2 elements)",
            ),
            (
                cf.attr_i64_array("udims").map(drop),
                "attribute `udims`: expected an integer array fitting i64, found array of u64 (2 elements)",
            ),
        ];
        for (r, want) in cases {
            let e = r.unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidArgument);
            assert_eq!(e.to_string(), want);
        }
    });
}

#[test]
fn no_attributes_and_malformed_attributes() {
    let f = Frame::new().build();
    with(f, |cf| {
        assert_eq!(cf.attr_names().unwrap(), Vec::<&str>::new());
        assert_eq!(cf.attr_i64("n").unwrap_err().to_string(), "attribute `n` not found (attributes: none)");
    });

    let f = Frame::new()
        .attr("a", scalar(DT::S64, 1i64))
        .attr("b", A(sys::XLA_FFI_AttrType(9), leak(0u8) as *mut c_void))
        .build();
    with(f, |cf| {
        assert_eq!(
            cf.attr_i64("b").unwrap_err().to_string(),
            "attribute `b`: expected an integer scalar fitting i64, found attribute of unknown type 9"
        )
    });
    let fm = frame_mut(f);
    // A null scalar value, a null attribute, an array with elements at null, a null name.
    // SAFETY: the fake frame's lists hold 2 entries.
    unsafe { *fm.attrs.attrs = leak(sys::XLA_FFI_Scalar { dtype: DT::S64, value: ptr::null_mut() }) as *mut c_void };
    with(f, |cf| {
        assert_eq!(
            cf.attr_i64("a").unwrap_err(),
            HandlerError::Frame("scalar attribute 0 (s64) has a null value".into())
        )
    });
    // SAFETY: as above.
    unsafe { *fm.attrs.attrs = ptr::null_mut() };
    with(f, |cf| assert_eq!(cf.attr_i64("a").unwrap_err(), HandlerError::Frame("attribute 0 is null".into())));
    // SAFETY: as above.
    unsafe {
        *fm.attrs.types = sys::XLA_FFI_AttrType::ARRAY;
        *fm.attrs.attrs = leak(sys::XLA_FFI_Array { dtype: DT::S64, size: 3, data: ptr::null_mut() }) as *mut c_void;
    }
    with(f, |cf| {
        assert_eq!(cf.attr("a").unwrap_err(), HandlerError::Frame("array attribute 0 has 3 elements at null".into()))
    });
    // SAFETY: as above.
    unsafe { *fm.attrs.names.add(1) = ptr::null_mut() };
    with(f, |cf| assert_eq!(cf.attr_names().unwrap_err(), HandlerError::Frame("attribute 1 has a null name".into())));
    fm.attrs.names = ptr::null_mut();
    with(f, |cf| assert_eq!(cf.attr_count().unwrap_err(), HandlerError::Frame("2 attributes at a null list".into())));
}

// ---------------------------------------------------------------------------------------------
// Metadata probe

/// A probe frame as XLA builds one; `meta_size`: the metadata struct's `struct_size`.
fn probe_frame(meta_size: usize, api: bool) -> (*mut XLA_FFI_CallFrame, *mut sys::XLA_FFI_Metadata) {
    let meta = leak(sys::XLA_FFI_Metadata {
        struct_size: meta_size,
        api_version: sys::XLA_FFI_Api_Version {
            struct_size: sys::XLA_FFI_Api_Version_STRUCT_SIZE,
            extension_start: ptr::null_mut(),
            major_version: 0,
            minor_version: 0,
        },
        traits: 0,
        state_type_id: TypeId { type_id: 77 },
    });
    let ext = leak(sys::XLA_FFI_Metadata_Extension {
        extension_base: sys::XLA_FFI_InternalExtension {
            struct_size: sys::XLA_FFI_Metadata_Extension_STRUCT_SIZE,
            r#type: sys::XLA_FFI_InternalExtension_Type::XLA_FFI_Extension_Metadata,
            next: ptr::null_mut(),
        },
        metadata: meta,
    });
    let mut f = Frame::new();
    f.ext = ext as *mut sys::XLA_FFI_InternalExtension;
    if !api {
        f.api = ptr::null();
    }
    (f.build(), meta)
}

fn body_must_not_run(_: &CallFrame<'_>) -> Result<()> {
    panic!("the handler body ran during the metadata probe")
}

#[test]
fn guard_answers_the_metadata_probe() {
    // XLA 0.11.2 passes struct_size 36 (ending at `traits`) and a null context.
    for api in [true, false] {
        let (f, meta) = probe_frame(sys::XLA_FFI_Metadata_STRUCT_SIZE, api);
        with(f, |cf| assert!(cf.is_metadata_probe()));
        // SAFETY: a fake frame.
        let err = unsafe { guard_with_traits(f, COMMAND_BUFFER_COMPATIBLE, body_must_not_run) };
        assert!(err.is_null());
        // SAFETY: leaked by `probe_frame`.
        let m = unsafe { &*meta };
        assert_eq!((m.api_version.major_version, m.api_version.minor_version), (0, 4));
        assert_eq!(m.api_version.struct_size, sys::XLA_FFI_Api_Version_STRUCT_SIZE);
        assert!(m.api_version.extension_start.is_null());
        assert_eq!(m.traits, 1);
        assert_eq!(m.state_type_id.type_id, 77, "not written past struct_size");
    }
    // A metadata struct that includes `state_type_id` gets "no state".
    let (f, meta) = probe_frame(std::mem::size_of::<sys::XLA_FFI_Metadata>(), true);
    // SAFETY: a fake frame.
    assert!(unsafe { guard(f, body_must_not_run) }.is_null());
    // SAFETY: leaked by `probe_frame`.
    let m = unsafe { &*meta };
    assert_eq!((m.traits, m.state_type_id.type_id), (0, 0));
}

#[test]
fn short_probe_structs_are_refused() {
    let (f, meta) = probe_frame(8, true);
    // SAFETY: a fake frame.
    let (code, msg) = take(unsafe { guard(f, body_must_not_run) });
    assert_eq!(code, sys::XLA_FFI_Error_Code::INVALID_ARGUMENT);
    assert_eq!(msg, "malformed XLA FFI call frame: metadata size 8, expected at least 36");
    // SAFETY: leaked by `probe_frame`.
    assert_eq!(unsafe { (*meta).api_version.minor_version }, 0, "nothing written");

    let (f, _) = probe_frame(36, true);
    // SAFETY: the fake probe's extension is a leaked Metadata_Extension.
    unsafe { (*(frame_mut(f).extension_start)).struct_size = 24 };
    with(f, |cf| {
        assert_eq!(
            cf.answer_metadata_probe(0).unwrap_err().to_string(),
            "malformed XLA FFI call frame: metadata extension size 24, expected at least 32"
        );
    });
    with(Frame::new().build(), |cf| {
        assert!(!cf.is_metadata_probe());
        assert!(cf.answer_metadata_probe(0).is_err());
    });
}

// ---------------------------------------------------------------------------------------------
// Guard and errors

#[test]
fn guard_reports_errors_and_panics() {
    let f = Frame::new().arg(buffer(DT::F32, &[4], 0x10)).build();
    let mut seen = 0;
    // SAFETY: a fake frame.
    let ok = unsafe {
        guard(f, |cf| {
            seen = cf.arg(0)?.element_count()?;
            Ok(())
        })
    };
    assert!(ok.is_null());
    assert_eq!(seen, 4);

    // SAFETY: as above.
    let (code, msg) = take(unsafe { guard(f, |cf| cf.arg(5).map(drop)) });
    assert_eq!(
        (code, msg.as_str()),
        (sys::XLA_FFI_Error_Code::INVALID_ARGUMENT, "argument 5 out of range: the call has 1")
    );

    // SAFETY: as above.
    let (code, msg) = take(unsafe { guard(f, |_| Err(HandlerError::new(ErrorCode::NotFound, "no such ring"))) });
    assert_eq!((code, msg.as_str()), (sys::XLA_FFI_Error_Code::NOT_FOUND, "no such ring"));

    // SAFETY: as above.
    let (code, msg) = take(unsafe { guard(f, |_| panic!("boom {}", 7)) });
    assert_eq!((code, msg.as_str()), (sys::XLA_FFI_Error_Code::INTERNAL, "handler panicked: boom 7"));

    // OK would read as success in XLA: it becomes UNKNOWN. NUL bytes survive as `\0`.
    // SAFETY: as above.
    let (code, msg) = take(unsafe { guard(f, |_| Err(HandlerError::new(ErrorCode::Ok, "a\0b"))) });
    assert_eq!((code, msg.as_str()), (sys::XLA_FFI_Error_Code::UNKNOWN, "a\\0b"));

    let e: HandlerError = ffi::Error::Invalid("bad".into()).into();
    assert_eq!((e.code(), e.to_string()), (ErrorCode::Internal, "bad".into()));
}

#[test]
fn frames_too_short_or_null() {
    // SAFETY: null is allowed.
    let null = unsafe { CallFrame::from_raw(ptr::null_mut()) };
    assert_eq!(null.unwrap_err(), HandlerError::Frame("null call frame".into()));
    let f = Frame::new().build();
    frame_mut(f).struct_size = 40;
    // SAFETY: a fake frame.
    let e = unsafe { CallFrame::from_raw(f) }.unwrap_err();
    assert_eq!(
        e.to_string(),
        "malformed XLA FFI call frame: call frame size 40, expected at least 168 (API version 0.4)"
    );
    // The API table is still reachable at that size, so the guard reports through it.
    // SAFETY: a fake frame.
    let (code, msg) = take(unsafe { guard(f, body_must_not_run) });
    assert_eq!(code, sys::XLA_FFI_Error_Code::INVALID_ARGUMENT);
    assert!(msg.contains("call frame size 40"), "{msg}");
}

xla_ffi_handler! {
    /// A handler defined with the macro: fails unless its first argument is f32.
    fn macro_handler(f) {
        let x = f.arg(0)?;
        if x.dtype != DataType::F32 {
            return Err(HandlerError::invalid_argument(format!("expected f32, got {}", x.dtype)));
        }
        Ok(())
    }
}

#[test]
fn macro_defined_handler() {
    let h: sys::XLA_FFI_Handler = macro_handler;
    // SAFETY: a fake frame.
    assert!(unsafe { h(Frame::new().arg(buffer(DT::F32, &[1], 0)).build()) }.is_null());
    // SAFETY: as above.
    let (code, msg) = take(unsafe { h(Frame::new().arg(buffer(DT::S8, &[1], 0)).build()) });
    assert_eq!((code, msg.as_str()), (sys::XLA_FFI_Error_Code::INVALID_ARGUMENT, "expected f32, got s8"));
}

// ---------------------------------------------------------------------------------------------
// API calls

#[test]
fn stream_ordinal_run_id() {
    let mut fr = Frame::new();
    fr.ctx = FakeCtx { stream: 0xabc0, ordinal: 3, run_id: 17, ..Default::default() };
    with(fr.build(), |cf| {
        assert_eq!(cf.stream().unwrap() as usize, 0xabc0);
        assert_eq!(cf.device_ordinal().unwrap(), 3);
        assert_eq!(cf.run_id().unwrap(), 17);
    });
}

#[test]
fn api_errors_are_taken_and_destroyed() {
    // XLA:CPU: no stream.
    let f = Frame::new().build();
    let before = DESTROYED.load(Ordering::SeqCst);
    with(f, |cf| {
        let e = cf.stream().unwrap_err();
        assert_eq!(
            e,
            HandlerError::Api {
                call: "XLA_FFI_Stream_Get",
                code: ErrorCode::Unimplemented,
                message: "XLA FFI GPU context is not available".into()
            }
        );
        assert_eq!(e.code(), ErrorCode::Unimplemented);
    });
    assert!(DESTROYED.load(Ordering::SeqCst) > before, "the API's error was destroyed");

    // A table without the entry, and one too short to hold it.
    let mut api = fake_api();
    api.XLA_FFI_RunId_Get = None;
    api.struct_size = std::mem::offset_of!(sys::XLA_FFI_Api, XLA_FFI_DeviceOrdinal_Get);
    let mut fr = Frame::new();
    fr.api = leak(api);
    with(fr.build(), |cf| {
        for e in [cf.run_id().unwrap_err(), cf.device_ordinal().unwrap_err()] {
            assert_eq!(e.code(), ErrorCode::Unimplemented);
            assert!(e.to_string().contains("has no such entry"), "{e}");
        }
    });

    // No table at all.
    let mut fr = Frame::new();
    fr.api = ptr::null();
    with(fr.build(), |cf| {
        assert_eq!(cf.device_ordinal().unwrap_err(), HandlerError::Frame("null API table".into()));
        assert!(cf.error(ErrorCode::Internal, "x").is_null());
    });
}

#[test]
fn state_set_then_get() {
    let f = Frame::new().build();
    let id = TypeId { type_id: 5 };
    let obj = leak(123u32) as *mut c_void;
    with(f, |cf| {
        assert_eq!(cf.state_get(ExecutionStage::Instantiate, id).unwrap_err().code(), ErrorCode::NotFound);
        // SAFETY: the fake keeps the pointer without calling a deleter.
        unsafe { cf.state_set(ExecutionStage::Instantiate, id, obj) }.unwrap();
        assert_eq!(cf.state_get(ExecutionStage::Instantiate, id).unwrap(), obj);
        // SAFETY: as above.
        let again = unsafe { cf.state_set(ExecutionStage::Instantiate, id, obj) }.unwrap_err();
        assert_eq!(again.code(), ErrorCode::AlreadyExists);
    });
}

#[test]
fn error_creates_through_the_api() {
    with(Frame::new().build(), |cf| {
        let (code, msg) = take(cf.error(ErrorCode::ResourceExhausted, "out of memory on device 2"));
        assert_eq!((code, msg.as_str()), (sys::XLA_FFI_Error_Code::RESOURCE_EXHAUSTED, "out of memory on device 2"));
    });
}
