//! The only home of `unsafe` foreign calls besides the device layers: the CUDA driver and NVRTC, (feature `rocm`) the
//! HIP runtime and hipRTC ([`hip`], [`hiprtc`], through `libloading`), and XLA's FFI and PJRT C APIs. Layers as in
//! cudarc: `sys` → a result layer whose [`Error`] names the call and the device → small safe owners ([`cuda::Context`],
//! [`cuda::Stream`], [`cuda::DeviceBuffer`]). No panic reaches a caller: libraries are probed first ([`libs`]) and
//! every cudarc call runs under `catch_unwind`.

pub mod cublas;
pub mod cuda;
pub mod gpu;
#[cfg(feature = "rocm")]
pub mod hip;
#[cfg(feature = "rocm")]
pub mod hiprtc;
pub mod libs;
pub mod nvrtc;
pub mod pjrt;
pub mod xla_ffi;

use std::ffi::{CStr, CString, c_char};
use std::sync::OnceLock;

/// Every failure of a foreign call.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// A shared library could not be found or loaded.
    #[error("{lib} unavailable: {reason}")]
    Library { lib: &'static str, reason: String },
    /// A call returned an error status (or its symbol was missing).
    #[error("{call} failed{}: {status}", device.map(|d| format!(" on device {d}")).unwrap_or_default())]
    Call { call: &'static str, device: Option<usize>, status: String },
    /// NVRTC rejected a source; `log` is the compiler's log.
    #[error("NVRTC could not compile {name} for {arch}: {status}\n{log}")]
    Compile { name: String, arch: String, status: String, log: String },
    /// hipRTC rejected a source; `log` is the compiler's log.
    #[error("hipRTC could not compile {name} for {arch}: {status}\n{log}")]
    HipCompile { name: String, arch: String, status: String, log: String },
    /// A value outside what a call accepts.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs `f` (a cudarc call) and turns a panic (missing library or symbol) into an error.
pub(crate) fn guarded<T>(call: &'static str, device: Option<usize>, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let what = panic_text(&*p, "panic in the binding");
        Error::Call { call, device, status: format!("symbol or library missing: {what}") }
    })
}

/// A panic payload's message (a `String` or `&str`), else `default`.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send), default: &str) -> String {
    let text = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
    text.unwrap_or_else(|| default.into())
}

/// `cell`'s value, made by `init` on first use; a failure is kept, and cloned to every caller.
pub(crate) fn once<T>(cell: &'static OnceLock<Result<T>>, init: impl FnOnce() -> Result<T>) -> Result<&'static T> {
    cell.get_or_init(init).as_ref().map_err(Clone::clone)
}

/// `unsafe impl Send` and `Sync` for handle types; the SAFETY note above an invocation covers both traits for every
/// type it lists.
macro_rules! send_sync {
    ($($t:ty),+ $(,)?) => {$(
        // SAFETY: the invocation's note.
        unsafe impl Send for $t {}
        // SAFETY: the invocation's note.
        unsafe impl Sync for $t {}
    )+};
}
pub(crate) use send_sync;

/// `strs` as C strings, with pointers to them (valid while the strings live), for a runtime compiler (NVRTC, hipRTC); a
/// NUL byte is an error naming the program `name`.
pub(crate) fn c_strings<'a>(
    name: &str,
    strs: impl IntoIterator<Item = &'a str>,
) -> Result<(Vec<CString>, Vec<*const c_char>)> {
    let owned: Vec<CString> = strs
        .into_iter()
        .map(|s| CString::new(s).map_err(|_| Error::Invalid(format!("NUL byte in {name}"))))
        .collect::<Result<_>>()?;
    let ptrs = owned.iter().map(|c| c.as_ptr()).collect();
    Ok((owned, ptrs))
}

/// The NUL-terminated string at `p` (lossily UTF-8), or "" for null.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that lives for the call.
pub(crate) unsafe fn c_text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated and live (the caller's contract).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
