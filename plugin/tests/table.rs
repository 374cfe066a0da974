//! The function table, driven as a PJRT framework would: every slot is filled, undersized
//! args and panics come back as PJRT errors, and a client round-trips a buffer.

use std::os::raw::c_void;
use std::ptr::null_mut;

use plugin::pjrt_sys::*;

fn api() -> &'static PJRT_Api {
    // SAFETY: `plugin::api()` returns a pointer to a table that lives for the process.
    unsafe { &*plugin::api() }
}

fn message(e: *mut PJRT_Error) -> (u32, String) {
    assert!(!e.is_null(), "expected an error");
    let mut m = PJRT_Error_Message_Args::new();
    m.error = e;
    let mut c = PJRT_Error_GetCode_Args::new();
    c.error = e;
    // SAFETY: `e` is a live error from the plugin; args are fully initialised.
    let text = unsafe {
        (api().PJRT_Error_Message.unwrap())(&mut m);
        assert!((api().PJRT_Error_GetCode.unwrap())(&mut c).is_null());
        String::from_utf8_lossy(std::slice::from_raw_parts(m.message.cast::<u8>(), m.message_size)).into_owned()
    };
    let mut d = PJRT_Error_Destroy_Args::new();
    d.error = e;
    // SAFETY: destroys the error exactly once.
    unsafe { (api().PJRT_Error_Destroy.unwrap())(&mut d) };
    (c.code, text)
}

#[test]
fn every_slot_is_filled_and_version_is_054() {
    let a = api();
    assert_eq!(a.struct_size, PJRT_Api_STRUCT_SIZE as usize);
    assert_eq!((a.pjrt_api_version.major_version, a.pjrt_api_version.minor_version), (0, 54));
    let header = std::mem::offset_of!(PJRT_Api, PJRT_Error_Destroy);
    // The 0.54 header's PJRT_Api_STRUCT_SIZE ends at PJRT_Client_TopologyDescription (96
    // slots) although three more fields follow it; we fill all 100.
    let slots = (std::mem::size_of::<PJRT_Api>() - header) / std::mem::size_of::<usize>();
    assert_eq!(slots, 100);
    let base = std::ptr::from_ref(a).cast::<u8>();
    // The table is followed by guard slots; check those too.
    for i in 0..slots + plugin::api::GUARD_SLOTS {
        // SAFETY: `Table` is repr(C): the 0.54 table then GUARD_SLOTS pointers, all in bounds.
        let p = unsafe { base.add(header + i * std::mem::size_of::<usize>()).cast::<usize>().read() };
        assert_ne!(p, 0, "slot {i} is null");
    }
}

#[test]
fn undersized_struct_is_an_error() {
    let mut args = PJRT_Client_Create_Args::new();
    args.struct_size -= 8;
    // SAFETY: valid args pointer; the plugin must reject it without reading past the size.
    let e = unsafe { (api().PJRT_Client_Create.unwrap())(&mut args) };
    let (code, text) = message(e);
    assert_eq!(code, PJRT_Error_Code_PJRT_Error_Code_INVALID_ARGUMENT);
    assert!(text.contains("struct_size"), "{text}");
}

#[test]
fn null_args_and_null_handles_are_errors() {
    // SAFETY: null args must be answered with an error, not dereferenced.
    let e = unsafe { (api().PJRT_Client_Devices.unwrap())(null_mut()) };
    assert_eq!(message(e).0, PJRT_Error_Code_PJRT_Error_Code_INVALID_ARGUMENT);
    let mut args = PJRT_Buffer_Dimensions_Args::new();
    // SAFETY: a null buffer handle must be answered with an error.
    let e = unsafe { (api().PJRT_Buffer_Dimensions.unwrap())(&mut args) };
    assert!(message(e).1.contains("buffer is null"));
}

struct Probe {
    struct_size: usize,
}
impl plugin::boundary::Args for Probe {
    const NAME: &'static str = "Probe";
    const SIZE: usize = 8;
}

#[test]
fn a_panic_becomes_an_internal_error() {
    let mut p = Probe { struct_size: 8 };
    // SAFETY: `p` is a valid struct beginning with its size.
    let e = unsafe {
        plugin::boundary::enter("probe", &mut p, |p| {
            assert_eq!(p.struct_size, 8);
            panic!("forced panic");
        })
    };
    let (code, text) = message(e);
    assert_eq!(code, PJRT_Error_Code_PJRT_Error_Code_INTERNAL);
    assert!(text.contains("forced panic"), "{text}");
}

#[test]
fn guard_slot_answers_unimplemented() {
    let t = plugin::api::table();
    // SAFETY: guard functions accept any args pointer and do not read it.
    let e = unsafe { (t.guard[0].unwrap())(null_mut::<c_void>()) };
    assert_eq!(message(e).0, PJRT_Error_Code_PJRT_Error_Code_UNIMPLEMENTED);
}

unsafe extern "C" fn on_ready(err: *mut PJRT_Error, user: *mut c_void) {
    assert!(err.is_null());
    // SAFETY: `user` is the counter the test passed.
    unsafe { *user.cast::<u32>() += 1 };
}

#[test]
fn client_devices_buffer_round_trip() {
    let name = "num_devices";
    let mut opt = PJRT_NamedValue::new();
    opt.name = name.as_ptr().cast();
    opt.name_size = name.len();
    opt.type_ = PJRT_NamedValue_Type_PJRT_NamedValue_kInt64;
    opt.__bindgen_anon_1.int64_value = 4;
    let mut c = PJRT_Client_Create_Args::new();
    c.create_options = &opt;
    c.num_options = 1;
    let a = api();
    // SAFETY: every args struct is initialised by `new()` and the handles come from the plugin.
    unsafe {
        assert!((a.PJRT_Client_Create.unwrap())(&mut c).is_null());
        let mut d = PJRT_Client_Devices_Args::new();
        d.client = c.client;
        assert!((a.PJRT_Client_Devices.unwrap())(&mut d).is_null());
        assert_eq!(d.num_devices, 4);
        let devices = std::slice::from_raw_parts(d.devices, d.num_devices);
        for (i, &dev) in devices.iter().enumerate() {
            let mut g = PJRT_Device_GetDescription_Args::new();
            g.device = dev;
            assert!((a.PJRT_Device_GetDescription.unwrap())(&mut g).is_null());
            let mut id = PJRT_DeviceDescription_Id_Args::new();
            id.device_description = g.device_description;
            assert!((a.PJRT_DeviceDescription_Id.unwrap())(&mut id).is_null());
            assert_eq!(id.id, i as i32);
        }
        let mut da = PJRT_Client_DefaultDeviceAssignment_Args::new();
        let mut slots = [-1i32; 4];
        da.client = c.client;
        (da.num_replicas, da.num_partitions) = (1, 4);
        (da.default_assignment, da.default_assignment_size) = (slots.as_mut_ptr(), 4);
        assert!((a.PJRT_Client_DefaultDeviceAssignment.unwrap())(&mut da).is_null());
        assert_eq!(slots, [0, 1, 2, 3]);

        // A 2x3 f32 array given column-major through byte strides; device resolved from memory.
        let host: [f32; 6] = [1.0, 4.0, 2.0, 5.0, 3.0, 6.0];
        let dims = [2i64, 3];
        let strides = [4i64, 8];
        let mut mem = PJRT_Device_DefaultMemory_Args::new();
        mem.device = devices[2];
        assert!((a.PJRT_Device_DefaultMemory.unwrap())(&mut mem).is_null());
        let mut b = PJRT_Client_BufferFromHostBuffer_Args::new();
        b.client = c.client;
        b.data = host.as_ptr().cast();
        b.type_ = PJRT_Buffer_Type_PJRT_Buffer_Type_F32;
        (b.dims, b.num_dims) = (dims.as_ptr(), 2);
        (b.byte_strides, b.num_byte_strides) = (strides.as_ptr(), 2);
        b.memory = mem.memory;
        assert!((a.PJRT_Client_BufferFromHostBuffer.unwrap())(&mut b).is_null());
        assert!(!b.done_with_host_buffer.is_null());
        let mut count = 0u32;
        let mut r = PJRT_Event_OnReady_Args::new();
        r.event = b.done_with_host_buffer;
        r.callback = Some(on_ready);
        r.user_arg = (&raw mut count).cast();
        assert!((a.PJRT_Event_OnReady.unwrap())(&mut r).is_null());
        assert_eq!(count, 1);
        let mut ed = PJRT_Event_Destroy_Args::new();
        ed.event = b.done_with_host_buffer;
        assert!((a.PJRT_Event_Destroy.unwrap())(&mut ed).is_null());

        let mut bd = PJRT_Buffer_Device_Args::new();
        bd.buffer = b.buffer;
        assert!((a.PJRT_Buffer_Device.unwrap())(&mut bd).is_null());
        assert_eq!(bd.device, devices[2]);

        let mut out = [0f32; 6];
        let mut t = PJRT_Buffer_ToHostBuffer_Args::new();
        t.src = b.buffer;
        (t.dst, t.dst_size) = (out.as_mut_ptr().cast(), 24);
        assert!((a.PJRT_Buffer_ToHostBuffer.unwrap())(&mut t).is_null());
        assert!(!t.event.is_null());
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);

        let mut del = PJRT_Buffer_Delete_Args::new();
        del.buffer = b.buffer;
        assert!((a.PJRT_Buffer_Delete.unwrap())(&mut del).is_null());
        let e = (a.PJRT_Buffer_ToHostBuffer.unwrap())(&mut t);
        assert!(message(e).1.contains("deleted"));

        let mut bdst = PJRT_Buffer_Destroy_Args::new();
        bdst.buffer = b.buffer;
        assert!((a.PJRT_Buffer_Destroy.unwrap())(&mut bdst).is_null());
        let mut cd = PJRT_Client_Destroy_Args::new();
        cd.client = c.client;
        assert!((a.PJRT_Client_Destroy.unwrap())(&mut cd).is_null());
    }
}

#[test]
fn mlir_without_converter_is_a_clear_error() {
    let e = plugin::mlir::convert(b"module {}").unwrap_err();
    assert!(e.message.contains("converter"), "{}", e.message);
}
