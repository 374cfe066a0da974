//! Collective kernels and device backends. [`host`] is the host backend's collective
//! layer (N simulated devices in one process; also the CPU handlers' protocols inside XLA);
//! [`exec`] runs whole HLO modules on it; `cuda` and `rocm` are the GPU device layers
//! (Peerless's collective kernels; inside XLA through `cuda::xla`). Everything fails with
//! the one [`Error`].

#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
pub mod exec;
pub mod gpu;
pub mod host;
#[cfg(feature = "rocm")]
pub mod rocm;
pub mod xla_host;

pub use error::{Error, Result};
pub use thunks::Phase;
