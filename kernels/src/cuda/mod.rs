//! The CUDA backend: the vendor part of [`crate::gpu`] (kernels compiled by NVRTC for the
//! device's compute capability, cached on disk) and the runtime behind XLA's FFI handlers
//! ([`xla`]). The clique, the peer probe, the launchers and the NCCL fallback are
//! [`crate::gpu`]'s, instantiated for [`Cuda`] (the aliases below).

pub mod xla;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub use ffi::Error as FfiError;
pub use ffi::cuda::Cuda;
use ffi::nvrtc::Output;

use crate::gpu::{self, Backend};
pub use crate::gpu::{Algo, BLOCKS, DEFAULT_GRID, Dtype, MAX_RANKS, Probe, Red, SIGNAL_BYTES, SOURCES, THREADS, grid};
use crate::{Error, Result};

/// The CUDA clique: local GPUs with primary contexts, streams and the kernel module.
pub type Clique = gpu::Clique<Cuda>;
/// One GPU of a [`Clique`].
pub type Device = gpu::Device<Cuda>;
/// The all-reduce launcher on CUDA.
pub type AllReduce = gpu::AllReduce<Cuda>;
/// The all-gather launcher on CUDA.
pub type AllGather = gpu::AllGather<Cuda>;
/// NCCL's communicators for a clique.
pub type NcclClique = gpu::CclClique<Cuda>;

/// Compiles every kernel source that is a translation unit (not headers) for compute
/// capability `cc`. Used by the device layer (CUBIN) and by CI (PTX for sm_80 / sm_90).
pub fn compile_sources(cc: u32, out: Output) -> Result<Vec<(String, Vec<u8>)>> {
    let (units, headers) = gpu::translation_units();
    let mut v = Vec::new();
    for (name, src) in units {
        v.push((name.to_string(), ffi::nvrtc::compile(name, &src, &headers, cc, out)?));
    }
    Ok(v)
}

/// Where compiled kernels are kept between processes: `PEERLESS_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/peerless`, else `~/.cache/peerless` (NVRTC takes tens of seconds for
/// the whole kernel set, which a JAX user would otherwise pay in every process).
fn cache_dir() -> Option<std::path::PathBuf> {
    if let Some(d) = std::env::var_os("PEERLESS_CACHE_DIR") {
        return Some(d.into());
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(std::path::PathBuf::from(d).join("peerless"));
    }
    std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache").join("peerless"))
}

/// A hash of `parts`, the block count and the NVRTC version: names a cached CUBIN, so any
/// change to the sources or the compiler compiles afresh.
fn cache_key(parts: &[(&str, &str)]) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut h);
    BLOCKS.hash(&mut h);
    ffi::nvrtc::version().ok()?.hash(&mut h);
    Some(h.finish())
}

/// CUBIN for compute capability `cc` of the sources hashed as `key`: compiled with
/// `compile` once per process, and kept on disk as `<stem>-sm<cc>-<key>.cubin`.
fn cached_cubin(
    cc: u32,
    stem: &str,
    key: Option<u64>,
    compile: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Arc<Vec<u8>>> {
    type Cache = Mutex<HashMap<(u32, String, Option<u64>), Arc<Vec<u8>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let id = (cc, stem.to_string(), key);
    if let Some(c) = key.and(cache.lock().map_err(|_| Error::Gpu("kernel cache poisoned".into()))?.get(&id)) {
        return Ok(c.clone());
    }
    let file = key.and_then(|k| Some(cache_dir()?.join(format!("{stem}-sm{cc}-{k:016x}.cubin"))));
    let bin = match file.as_ref().and_then(|f| std::fs::read(f).ok()).filter(|b| !b.is_empty()) {
        Some(b) => b,
        None => {
            let started = std::time::Instant::now();
            let b = compile()?;
            log::info!("compiled {stem} for sm_{cc} in {:.2} s", started.elapsed().as_secs_f64());
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
            b
        }
    };
    let bin = Arc::new(bin);
    if key.is_some() {
        cache.lock().map_err(|_| Error::Gpu("kernel cache poisoned".into()))?.insert(id, bin.clone());
    }
    Ok(bin)
}

/// The collective kernels' CUBIN for compute capability `cc`.
fn cubin_for(cc: u32) -> Result<Arc<Vec<u8>>> {
    cached_cubin(cc, "kernels", cache_key(SOURCES), || {
        Ok(compile_sources(cc, Output::Cubin)?.pop().map(|b| b.1).unwrap_or_default())
    })
}

impl Backend for Cuda {
    const PROBE_THREADS: u32 = 32;

    fn arch(ctx: &ffi::cuda::Context) -> Result<String> {
        let (major, minor) = ctx.compute_capability()?;
        Ok(format!("sm_{major}{minor}"))
    }

    fn code_objects(arch: &str) -> Result<Vec<Arc<Vec<u8>>>> {
        let cc: u32 = arch
            .strip_prefix("sm_")
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| Error::Gpu(format!("not a CUDA architecture: {arch}")))?;
        Ok(vec![cubin_for(cc)?])
    }
}

/// Number of CUDA devices visible (error if there is no driver).
pub fn device_count() -> Result<usize> {
    Ok(ffi::cuda::device_count()?)
}
