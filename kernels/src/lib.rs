//! Collective kernels and device layers, run by XLA's FFI handlers. [`host`] holds the protocols the CPU handlers
//! ([`xla_host`]) run between XLA:CPU's devices (one process, or the processes of one host); `cuda` and `rocm` are the
//! GPU device layers (Peerless's collective kernels; inside XLA through `gpu::xla`, named `cuda::xla` and `rocm::xla`).
//! [`ffi_handler`] drives them through XLA's FFI phases. Everything fails with the one [`Error`].

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod epilogue;
mod error;
pub mod ffi_handler;
pub mod gpu;
pub mod host;
#[cfg(feature = "rocm")]
pub mod rocm;
pub mod xla_host;

pub use error::{Error, Result};
