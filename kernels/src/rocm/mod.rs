//! The ROCm backend (feature `rocm`): the vendor part of [`crate::gpu`] on AMD GPUs through
//! HIP. The clique and the peer probe are [`crate::gpu`]'s,
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
//! [`xla`] is the runtime behind XLA's FFI handlers on ROCm ([`crate::gpu::xla`]'s generic
//! one, for [`Hip`]), which the plugin registers for XLA's "ROCM" platform when built with
//! `rocm`.
//!
//! Nothing here has run on an AMD GPU yet: CI compiles the kernels for gfx90a (hipRTC and
//! hipcc), type-checks and lints this module and runs its unit tests (docs/ROCM.md).

pub mod xla;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

pub use ffi::hip::Hip;

use crate::Result;
use crate::gpu::{self, Backend, Origin, Unit};
pub use crate::gpu::{Algo, Dtype, MAX_RANKS, Probe, Red, SOURCES, THREADS};

/// The ROCm clique: local AMD GPUs with streams and the kernel modules.
pub type Clique = gpu::Clique<Hip>;

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

    /// One unit per arch compiled by hipRTC, once per process (no prebuilt code and no disk
    /// cache for ROCm yet).
    fn code_object(arch: &str, unit: Unit, _prebuilt: bool) -> Result<(Arc<[u8]>, Origin)> {
        type Cache = Mutex<HashMap<(String, Unit), (Arc<[u8]>, Origin)>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let id = (arch.to_string(), unit);
        if let Some(c) = cache.lock().unwrap_or_else(PoisonError::into_inner).get(&id) {
            return Ok(c.clone());
        }
        let started = std::time::Instant::now();
        let (name, src, headers) = unit.source();
        let code = ffi::hiprtc::compile(&format!("{name} [{}]", unit.name()), &src, &headers, arch)?;
        let seconds = started.elapsed().as_secs_f64();
        log::info!(target: "peerless::compile", "compiled kernels {} for {arch} with hipRTC in {seconds:.2} s", unit.name());
        let found = (Arc::from(code), Origin::Compiled { seconds });
        cache.lock().unwrap_or_else(PoisonError::into_inner).insert(id, found.clone());
        Ok(found)
    }
}
