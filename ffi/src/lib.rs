//! The only home of `unsafe` foreign calls besides the device layers: dynamic loading of the
//! CUDA driver and NVRTC, and (feature `rocm`) the HIP runtime and hipRTC ([`hip`],
//! [`hiprtc`], bound directly through `libloading`); XLA's FFI and PJRT C APIs.
//!
//! Layers, as in cudarc: `sys` (raw entry points: cudarc's `driver::sys` / `nvrtc::sys`) → a
//! result layer that turns every status into an [`Error`] naming the call and the device →
//! small safe owners ([`cuda::Context`], [`cuda::Stream`],
//! [`cuda::DeviceBuffer`]).
//!
//! No panic reaches a caller: cudarc panics when a library or a symbol is missing, so every
//! library is probed first ([`libs`]) and every cudarc call runs under `catch_unwind`, which
//! turns a missing symbol into an error.

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

pub use cudarc::driver::sys as cu_sys;

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
        let what = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic in the binding".into());
        Error::Call { call, device, status: format!("symbol or library missing: {what}") }
    })
}
