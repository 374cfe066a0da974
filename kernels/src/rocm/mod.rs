//! The ROCm backend (feature `rocm`): the vendor part of [`crate::gpu`] for [`Hip`]. Kernels are compiled by hipRTC for
//! the device's full `gcnArchName` (so the code object matches its xnack/sramecc mode; the peer-target policy reads the
//! target alone), and every allocation is fine-grained, since peers poll flags while kernels run. [`xla`] is the
//! runtime behind XLA's "ROCM" handlers. Never run on an AMD GPU yet (docs/ROCM.md; ARCHITECTURE.md, "ROCm").

pub mod xla;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

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

    /// One unit per arch compiled by hipRTC, once per process (no prebuilt code and no disk cache for ROCm yet).
    fn code_object(arch: &str, unit: Unit, _prebuilt: bool) -> Result<(Arc<[u8]>, Origin)> {
        static CACHE: Mutex<BTreeMap<(String, Unit), (Arc<[u8]>, Origin)>> = Mutex::new(BTreeMap::new());
        let id = (arch.to_string(), unit);
        if let Some(c) = CACHE.lock().unwrap_or_else(PoisonError::into_inner).get(&id) {
            return Ok(c.clone());
        }
        let started = std::time::Instant::now();
        let (name, src, headers) = unit.source();
        let code = ffi::hiprtc::compile(&format!("{name} [{}]", unit.name()), &src, &headers, arch)?;
        let seconds = started.elapsed().as_secs_f64();
        log::info!(target: "peerless::compile", "compiled kernels {} for {arch} with hipRTC in {seconds:.2} s", unit.name());
        let found = (Arc::from(code), Origin::Compiled { seconds });
        CACHE.lock().unwrap_or_else(PoisonError::into_inner).insert(id, found.clone());
        Ok(found)
    }
}
