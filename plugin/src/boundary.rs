//! The one shape every entry point has: check the args pointer and `struct_size`, run the
//! body under `catch_unwind`, and turn `Err` or a panic into a boxed `PJRT_Error`.
//!
//! Handles (`PJRT_Client*`, `PJRT_Buffer*`, …) are pointers to this crate's own Rust
//! objects, produced by `Box::into_raw` (or pointing into a live client). The PJRT contract
//! is that callers only pass handles this plugin returned and has not destroyed; [`obj`] and
//! [`obj_mut`] rely on that and on nothing else.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{Error, Result};

/// An args struct of the PJRT C API: it starts with `size_t struct_size` and
/// `PJRT_Extension_Base* extension_start`, and `SIZE` is its `*_STRUCT_SIZE` in the header
/// we build against (API 0.54). Callers built against a newer header pass a larger size;
/// we only read the fields we know.
pub trait Args {
    const NAME: &'static str;
    const SIZE: usize;
}

macro_rules! args {
    ($($t:ident),* $(,)?) => {$(
        impl $crate::boundary::Args for pjrt_sys::$t {
            const NAME: &'static str = stringify!($t);
            const SIZE: usize = pjrt_sys::$t::STRUCT_SIZE;
        }
    )*};
}
pub(crate) use args;

fn panic_message(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Test hook: `PEERLESS_TEST_PANIC=<entry point>` (the Rust name, e.g. `plugin_attributes`;
/// read once per process) makes that entry point panic inside its body, so a test driving
/// the library from C can prove that no panic crosses the boundary (plugin/so/tests/c_abi.rs).
fn forced_panic(name: &str) -> bool {
    static NAME: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    NAME.get_or_init(|| std::env::var("PEERLESS_TEST_PANIC").ok()).as_deref() == Some(name)
}

/// Runs `f` on `*args` as an entry point named `name`: null and undersized args are
/// INVALID_ARGUMENT; a panic is INTERNAL (and never unwinds into the caller).
///
/// # Safety
/// `args` is null or points to a struct that begins with `size_t struct_size` and is valid
/// for reads and writes of `struct_size` bytes for the duration of the call.
pub unsafe fn enter<A: Args>(
    name: &str,
    args: *mut A,
    f: impl FnOnce(&mut A) -> Result<()>,
) -> *mut pjrt_sys::PJRT_Error {
    let run = || -> Result<()> {
        if args.is_null() {
            return Err(Error::invalid(format!("{name}: args is null")));
        }
        // SAFETY: `args` is non-null and, per the PJRT contract, points to an args struct,
        // every one of which begins with `size_t struct_size`.
        let size = unsafe { args.cast::<usize>().read() };
        if size < A::SIZE {
            return Err(Error::invalid(format!(
                "{name}: {} struct_size is {size}, expected at least {} (PJRT C API {}.{})",
                A::NAME,
                A::SIZE,
                pjrt_sys::PJRT_API_MAJOR,
                pjrt_sys::PJRT_API_MINOR
            )));
        }
        if forced_panic(name) {
            panic!("{name}: forced by PEERLESS_TEST_PANIC");
        }
        // SAFETY: the caller's struct is at least as large as the one we know (checked
        // above), so every field of `A` lies inside it; the caller owns it for the call.
        f(unsafe { &mut *args })
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => e.into_raw(),
        Err(p) => Error::internal(format!("peerless: panic in {name}: {}", panic_message(p.as_ref()))).into_raw(),
    }
}

/// Like [`enter`] for the few entry points that return nothing (`PJRT_Error_Destroy`,
/// `PJRT_Error_Message`, `PJRT_Error_GetCode`): errors and panics are swallowed.
///
/// # Safety
/// As for [`enter`].
pub unsafe fn enter_void<A: Args>(name: &str, args: *mut A, f: impl FnOnce(&mut A) -> Result<()>) {
    // SAFETY: forwarded from our caller.
    let e = unsafe { enter(name, args, f) };
    if !e.is_null() {
        // SAFETY: `e` was just produced by `Error::into_raw` and is owned here.
        drop(unsafe { Box::from_raw(e.cast::<Error>()) });
    }
}

/// The object behind handle `p` (a pointer this crate produced), or INVALID_ARGUMENT if null.
pub fn obj<'a, T, H>(p: *mut H, what: &str) -> Result<&'a T> {
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is null")));
    }
    // SAFETY: non-null handles passed to us are, per the PJRT contract (module docs), live
    // objects of type `T` that this crate created and has not freed.
    Ok(unsafe { &*p.cast::<T>() })
}

/// The object behind a `const` handle.
pub fn obj_const<'a, T, H>(p: *const H, what: &str) -> Result<&'a T> {
    obj(p.cast_mut(), what)
}

/// Takes back ownership of a boxed handle (for `*_Destroy`); `None` for null.
pub fn take<T, H>(p: *mut H) -> Option<Box<T>> {
    if p.is_null() {
        return None;
    }
    // SAFETY: `*_Destroy` receives a handle this crate created with `Box::into_raw` for a
    // `T`, and the PJRT contract says it is destroyed exactly once.
    Some(unsafe { Box::from_raw(p.cast::<T>()) })
}

/// A slice from a C pointer and length; null is accepted when `len == 0`.
pub(crate) fn slice<'a, T>(p: *const T, len: usize, what: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is null but its length is {len}")));
    }
    // SAFETY: the caller supplies `len` valid, initialised elements at `p` (PJRT contract),
    // alive for the duration of the call.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// A string from a C pointer and length (bytes; lossy UTF-8).
pub(crate) fn string(p: *const std::os::raw::c_char, len: usize, what: &str) -> Result<String> {
    Ok(String::from_utf8_lossy(slice(p.cast::<u8>(), len, what)?).into_owned())
}
