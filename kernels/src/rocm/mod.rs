//! The ROCm backend (feature `rocm`): the vendor part of [`crate::gpu`] on AMD GPUs through
//! HIP. The clique, the peer probe, the launchers and the RCCL fallback are [`crate::gpu`]'s,
//! instantiated for [`Hip`]; the kernel sources are the same tree CUDA compiles (through
//! `peerless_device.h`). Two AMD-specific choices live in the device layer and here:
//! - kernels are compiled by hipRTC for the device's full `gcnArchName` (e.g.
//!   `gfx90a:sramecc+:xnack-`), so the code object matches the device's xnack/sramecc mode;
//!   the peer-target policy reads the target alone (`gfx90a`);
//! - every clique allocation is fine-grained device memory ([`ffi::hip::Hip`]'s `alloc`):
//!   peers poll signal flags and read staging while kernels run, and coarse-grained memory
//!   (plain `hipMalloc`) is only coherent across devices at kernel boundaries.
//!
//! [`crate::gpu::Clique::peer_table`] applies the emitter's target policy (gfx90a excluded
//! unless `--allow_unsafe_peer_targets=true`).
//!
//! Nothing here has run on an AMD GPU yet: CI compiles the kernels for gfx90a (hipRTC and
//! hipcc) and type-checks and lints this module (README, "ROCm status").

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub use ffi::Error as FfiError;
pub use ffi::hip::Hip;

use crate::gpu::{self, Backend};
pub use crate::gpu::{Algo, BLOCKS, Dtype, MAX_RANKS, Probe, Red, SIGNAL_BYTES, SOURCES, THREADS};
use crate::{Error, Result};

/// The ROCm clique: local AMD GPUs with streams and the kernel modules.
pub type Clique = gpu::Clique<Hip>;
/// One GPU of a [`Clique`].
pub type Device = gpu::Device<Hip>;
/// The all-reduce launcher on HIP.
pub type AllReduce = gpu::AllReduce<Hip>;
/// The all-gather launcher on HIP.
pub type AllGather = gpu::AllGather<Hip>;
/// RCCL's communicators for a clique (a missing librccl is an error naming the library,
/// where it was looked for and `PEERLESS_RCCL_LIB`).
pub type RcclClique = gpu::CclClique<Hip>;

/// Compiles every kernel source that is a translation unit (not headers) with hipRTC for
/// `arch` (`gfx90a`, or a device's full `gcnArchName`). Used by the device layer and by CI
/// (`kernels/tests/rocm_hiprtc.rs`, gfx90a, no GPU).
pub fn compile_sources(arch: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let (units, headers) = gpu::translation_units();
    let mut v = Vec::new();
    for (name, src) in units {
        v.push((name.to_string(), ffi::hiprtc::compile(name, &src, &headers, arch)?));
    }
    Ok(v)
}

/// Number of HIP devices visible (error if the HIP runtime cannot be loaded).
pub fn device_count() -> Result<usize> {
    Ok(ffi::hip::device_count()?)
}

impl Backend for Hip {
    const PROBE_THREADS: u32 = 64;

    fn arch(ctx: &ffi::hip::Context) -> Result<String> {
        Ok(ctx.arch()?)
    }

    fn target(arch: &str) -> String {
        ffi::hip::gfx_target(arch).unwrap_or(arch).to_string()
    }

    /// Code objects per arch, compiled once per process (hipRTC has no on-disk cache here).
    fn code_objects(arch: &str) -> Result<Vec<Arc<Vec<u8>>>> {
        type Cache = Mutex<HashMap<String, Vec<Arc<Vec<u8>>>>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let poisoned = || Error::Gpu("kernel cache poisoned".into());
        if let Some(c) = cache.lock().map_err(|_| poisoned())?.get(arch) {
            return Ok(c.clone());
        }
        let code: Vec<Arc<Vec<u8>>> = compile_sources(arch)?.into_iter().map(|(_, c)| Arc::new(c)).collect();
        cache.lock().map_err(|_| poisoned())?.insert(arch.to_string(), code.clone());
        Ok(code)
    }
}
