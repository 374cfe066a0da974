//! Collective kernels and device backends. The host backend (N simulated devices)
//! arrives with the emitter issue, CUDA and ROCm with theirs.

pub use thunks::Phase;
