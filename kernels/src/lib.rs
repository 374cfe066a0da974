//! Collective kernels and device backends. [`host`] is the host backend's collective
//! layer (N simulated devices in one process); CUDA and ROCm arrive with their issues.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod exec;
pub mod host;
#[cfg(feature = "rocm")]
pub mod rocm;

pub use thunks::Phase;
