//! The CUDA backend: the vendor part of [`crate::gpu`] (kernels prebuilt into the library ([`prebuilt`]) or compiled by
//! NVRTC for the device's compute capability one unit at a time, cached on disk) and its names for the runtime behind
//! XLA's FFI handlers ([`xla`]: [`crate::gpu::xla`]'s, for [`Cuda`]). The clique and the peer probe are
//! [`crate::gpu`]'s, instantiated for [`Cuda`] (the alias below).

pub mod one_gpu;
pub mod prebuilt;
pub mod xla;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

pub use ffi::cuda::Cuda;
use ffi::nvrtc::Output;

use crate::gpu::{self, Backend, Origin, Unit};
pub use crate::gpu::{Algo, Dtype, MAX_RANKS, Probe, Red, SOURCES, THREADS, grid};
use crate::{Error, Result};

/// The CUDA clique: local GPUs with primary contexts, streams and the kernel module.
pub type Clique = gpu::Clique<Cuda>;

pub use thunks::runtime::cache_dir;

/// The disk cache's file for `unit` on compute capability `cc`, named by the unit's key and NVRTC's version, so other
/// sources or another compiler compile afresh (`None`: no cache directory, or no NVRTC to compile with).
fn cache_file(cc: u32, unit: Unit) -> Option<PathBuf> {
    let (major, minor) = ffi::nvrtc::version().ok()?;
    Some(cache_dir()?.join(format!("{}-sm{cc}-{}-nvrtc{major}.{minor}.cubin", unit.name(), unit.key())))
}

/// Where `unit`'s code for compute capability `cc` would come from now, without compiling: what `peerless devices`
/// reports.
pub fn availability(cc: u32, unit: Unit) -> Origin {
    if let Some((t, _)) = prebuilt::embedded().and_then(|b| b.find(cc, unit)) {
        return Origin::Prebuilt { target: t.name() };
    }
    if cache_file(cc, unit).is_some_and(|f| f.is_file()) {
        return Origin::Cached;
    }
    Origin::Compiled { seconds: 0.0 }
}

/// `unit`'s code for compute capability `cc`: prebuilt (when `use_prebuilt`), else from the disk cache, else compiled
/// by NVRTC and cached. Kept per process.
fn code_for(cc: u32, unit: Unit, use_prebuilt: bool) -> Result<(Arc<[u8]>, Origin)> {
    static CACHE: Mutex<BTreeMap<(u32, Unit, bool), (Arc<[u8]>, Origin)>> = Mutex::new(BTreeMap::new());
    let id = (cc, unit, use_prebuilt);
    if let Some(c) = CACHE.lock().unwrap_or_else(PoisonError::into_inner).get(&id) {
        return Ok(c.clone());
    }
    let prebuilt = prebuilt::embedded().filter(|_| use_prebuilt).and_then(|b| b.find(cc, unit));
    let found = if let Some((t, blob)) = prebuilt {
        log::debug!("kernels {} for sm_{cc}: prebuilt {}", unit.name(), t.name());
        (Arc::from(blob.code()?), Origin::Prebuilt { target: t.name() })
    } else {
        let file = cache_file(cc, unit);
        match file.as_ref().and_then(|f| std::fs::read(f).ok()).filter(|b| !b.is_empty()) {
            Some(b) => (Arc::from(b), Origin::Cached),
            None => {
                let started = std::time::Instant::now();
                let b = prebuilt::compile(unit, prebuilt::Target { cc, out: Output::Cubin })?;
                let seconds = started.elapsed().as_secs_f64();
                log::info!(
                    target: "peerless::compile",
                    "compiled kernels {} for sm_{cc} with NVRTC in {seconds:.2} s (no prebuilt code for this GPU)",
                    unit.name()
                );
                if let Some(f) = &file {
                    // A cache that cannot be written only costs the next process a compile.
                    let tmp = f.with_extension(format!("tmp{}", std::process::id()));
                    let saved = f.parent().map(std::fs::create_dir_all).transpose().is_ok()
                        && std::fs::write(&tmp, &b).is_ok()
                        && std::fs::rename(&tmp, f).is_ok();
                    if !saved {
                        log::warn!("could not cache compiled kernels at {}", f.display());
                    }
                }
                (Arc::from(b), Origin::Compiled { seconds })
            }
        }
    };
    CACHE.lock().unwrap_or_else(PoisonError::into_inner).insert(id, found.clone());
    Ok(found)
}

/// A compute capability from `sm_XY`.
pub fn compute_capability(arch: &str) -> Result<u32> {
    arch.strip_prefix("sm_")
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| Error::Gpu(format!("not a CUDA architecture: {arch}")))
}

impl Backend for Cuda {
    const PROBE_THREADS: u32 = 32;

    fn arch(ctx: &ffi::cuda::Context) -> Result<String> {
        let (major, minor) = ctx.compute_capability()?;
        Ok(format!("sm_{major}{minor}"))
    }

    fn code_object(arch: &str, unit: Unit, prebuilt: bool) -> Result<(Arc<[u8]>, Origin)> {
        code_for(compute_capability(arch)?, unit, prebuilt)
    }
}

/// Number of CUDA devices visible (error if there is no driver).
pub fn device_count() -> Result<usize> {
    Ok(ffi::cuda::device_count()?)
}
