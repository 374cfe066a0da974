//! Collective kernels and device backends. [`host`] is the host backend's collective
//! layer (N simulated devices in one process); [`codegen`] writes device code for
//! non-collective instructions; `cuda` and `rocm` are the GPU device layers.

pub mod codegen;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod exec;
pub mod host;
#[cfg(feature = "rocm")]
pub mod rocm;
pub mod xla_host;

pub use thunks::Phase;
