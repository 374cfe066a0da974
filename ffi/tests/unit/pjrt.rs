//! Unit tests of `ffi::pjrt` (included by path from src/pjrt.rs).

use std::mem::{offset_of, size_of};

use super::*;

#[test]
fn layouts_are_pjrt_0_115s() {
    assert_eq!(size_of::<ExtensionBase>(), 24);
    assert_eq!(size_of::<FfiExtension>(), FFI_EXTENSION_SIZE);
    assert_eq!(offset_of!(FfiExtension, register_handler), 40);
    assert_eq!(offset_of!(RegisterHandlerArgs, traits) + 4, REGISTER_HANDLER_ARGS_SIZE);
    assert_eq!(size_of::<ErrorMessageArgs>(), 40);
    assert_eq!(size_of::<ErrorDestroyArgs>(), 24);
    assert_eq!(offset_of!(ErrorGetCodeArgs, code), 24);
    assert_eq!(size_of::<ClientCompileArgs>(), 56);
    assert_eq!(size_of::<XlaTransformExtension>(), XLA_TRANSFORM_EXTENSION_SIZE);
    assert_eq!(offset_of!(XlaTransformExtension, register), 24);
    assert_eq!(size_of::<RegisterTransformArgs>(), 40);
    assert_eq!(offset_of!(RegisterTransformArgs, callbacks), 32);
    assert_eq!(size_of::<TransformCallbacks>(), 24);
    assert_eq!(size_of::<TransformHeader>(), 48);
    // `PJRT_XlaTransform_Args_STRUCT_SIZE`: up to and including `changed`.
    assert_eq!(offset_of!(TransformArgs, changed) + 1, 89);
    // Slot numbers against the header pjrt-sys binds (0.54; slots are only appended).
    let slot = |off: usize| (off - API_HEADER) / 8;
    assert_eq!(slot(offset_of!(pjrt_sys::PJRT_Api, PJRT_Client_Create)), SLOT_CLIENT_CREATE);
    assert_eq!(slot(offset_of!(pjrt_sys::PJRT_Api, PJRT_Client_Compile)), SLOT_CLIENT_COMPILE);
}

fn reverse(m: &[u8]) -> Option<Vec<u8>> {
    (!m.is_empty()).then(|| m.iter().rev().copied().collect())
}

fn boom(_: &[u8]) -> Option<Vec<u8>> {
    panic!("transform bug")
}

/// Calls the trampoline as XLA does: args from a module, then `cleanup_fn`.
fn call_as_xla(f: TransformFn, module: &[u8]) -> Option<Vec<u8>> {
    let mut reg = RegisteredTransform {
        callbacks: TransformCallbacks { version: 1, dtor: None, transform: Some(transform_trampoline) },
        f,
    };
    let mut a = TransformArgs {
        struct_size: offset_of!(TransformArgs, changed) + 1,
        header: TransformHeader {
            api_version: 1,
            data: std::ptr::null_mut(),
            cleanup_fn: None,
            has_error: false,
            code: 0,
            error_msg: TransformString { data: std::ptr::null(), size: 0 },
        },
        hlo_module: TransformString { data: module.as_ptr().cast(), size: module.len() },
        transformed: TransformString { data: std::ptr::null(), size: 0 },
        changed: false,
    };
    // SAFETY: a callbacks struct at the head of a RegisteredTransform and live args, as XLA
    // passes them.
    unsafe { transform_trampoline(&mut reg.callbacks, &mut a) };
    assert!(!a.header.has_error);
    let out = a.changed.then(|| {
        // SAFETY: the trampoline pointed `transformed` at its output, alive until cleanup.
        unsafe { std::slice::from_raw_parts(a.transformed.data.cast::<u8>(), a.transformed.size) }.to_vec()
    });
    if let Some(c) = a.header.cleanup_fn {
        // SAFETY: the trampoline's own cleanup for its own data, called once.
        unsafe { c(a.header.data) };
    }
    out
}

#[test]
fn the_trampoline_hands_xla_the_output_and_frees_it() {
    assert_eq!(call_as_xla(reverse, b"abc"), Some(b"cba".to_vec()));
    assert_eq!(call_as_xla(reverse, b""), None);
    // A panicking transform leaves the module unchanged.
    assert_eq!(call_as_xla(boom, b"abc"), None);
}
