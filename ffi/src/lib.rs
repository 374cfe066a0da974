//! The only home of `unsafe` foreign calls besides the device layers: dynamic loading
//! of CUDA driver, NVRTC, NCCL and HIP. Filled by the CUDA and ROCm issues.
