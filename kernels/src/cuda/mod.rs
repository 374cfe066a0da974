//! The CUDA backend's device layer: one [`Clique`] of local GPUs with a context, a stream and
//! the compiled kernel module per device, peer access enabled once per pair and checked by a
//! real cross-device write/read probe, and the symmetric arena ([`SymmetricArena`]).
//!
//! Every CUDA call goes through `ffi` and returns an error naming the call and the device;
//! nothing here panics on a missing library or device.

pub(crate) mod collectives;
pub mod xla;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub use collectives::{Algo, AllGather, AllReduce, Dtype, NcclClique, Red};
use emitter::{PeerAccessTable, PeerTableKey};
pub use ffi::Error as FfiError;
use ffi::cuda::{Context, DeviceBuffer, Module, Stream};
use ffi::nvrtc::Output;

/// The most blocks a collective kernel's grid may have: the size of the per-block counter
/// and flag arrays (the kernels get it as `PL_BLOCKS`). One constant bounds launch geometry
/// and sizes the signals; [`grid`] picks each launch's block count at or below it.
pub const BLOCKS: u32 = emitter::flags::MAX_COLLECTIVE_BLOCKS;
/// The largest grid [`grid`] picks by default (`--collective_blocks`).
pub const DEFAULT_GRID: u32 = emitter::flags::DEFAULT_COLLECTIVE_BLOCKS;
/// Threads per block (the kernels' `__launch_bounds__`).
pub const THREADS: u32 = 512;
/// Blocks for a collective launch that moves `units` 16-byte units per device and phase:
/// one thread per unit up to `max_grid` blocks (at least one, at most [`BLOCKS`]). Small
/// messages get one block, so one block's flags make the whole barrier, and large ones
/// spread over `max_grid` blocks with several units per thread. Every rank of a collective
/// computes the same grid from the same size, which the per-block barriers need.
pub fn grid(units: u64, max_grid: u32) -> u32 {
    let max = max_grid.clamp(1, BLOCKS);
    units.div_ceil(u64::from(THREADS)).clamp(1, u64::from(max)) as u32
}

/// Largest clique the kernels take (`PL_MAX_RANKS`).
pub const MAX_RANKS: usize = 8;
/// Bytes of one communicator's signals on one device: the per-block counters and two flag sets.
pub const SIGNAL_BYTES: usize = 4 * (BLOCKS as usize + 2 * BLOCKS as usize * MAX_RANKS);

/// The element types and 16-bit float conversions every kernel source includes.
pub const TYPES_HEADER: (&str, &str) = ("peerless_types.h", include_str!("../../cuda/peerless_types.h"));

/// The kernel sources, as (file name, text); headers are included by name.
pub const SOURCES: &[(&str, &str)] = &[
    TYPES_HEADER,
    ("peerless_device.h", include_str!("../../cuda/peerless_device.h")),
    ("collectives.cu", include_str!("../../cuda/collectives.cu")),
];

/// Errors of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error(transparent)]
    Ffi(#[from] ffi::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("peer access {from}→{to} is missing: {why}")]
    NoPeer { from: usize, to: usize, why: String },
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// Compiles every kernel source that is a translation unit (not headers) for compute
/// capability `cc`. Used by the device layer (CUBIN) and by CI (PTX for sm_80 / sm_90).
pub fn compile_sources(cc: u32, out: Output) -> Result<Vec<(String, Vec<u8>)>> {
    let headers: Vec<(&str, &str)> = SOURCES.iter().filter(|s| s.0.ends_with(".h")).copied().collect();
    let mut v = Vec::new();
    for (name, text) in SOURCES.iter().filter(|s| s.0.ends_with(".cu")) {
        let src = format!("#define PL_BLOCKS {BLOCKS}\n{text}");
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
    if let Some(c) = key.and(cache.lock().map_err(|_| CudaError::Invalid("kernel cache poisoned".into()))?.get(&id)) {
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
        cache.lock().map_err(|_| CudaError::Invalid("kernel cache poisoned".into()))?.insert(id, bin.clone());
    }
    Ok(bin)
}

/// The collective kernels' CUBIN for compute capability `cc`.
fn cubin_for(cc: u32) -> Result<Arc<Vec<u8>>> {
    cached_cubin(cc, "kernels", cache_key(SOURCES), || {
        Ok(compile_sources(cc, Output::Cubin)?.pop().map(|b| b.1).unwrap_or_default())
    })
}

/// One GPU of a clique.
#[derive(Debug)]
pub struct Device {
    pub ordinal: usize,
    pub name: String,
    pub cc: (i32, i32),
    pub sms: i32,
    pub module: Module,
    pub stream: Stream,
    /// Declared before `ctx` so it is dropped first.
    pub ctx: Context,
}

/// Result of the cross-device write/read probe for one ordered pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Same device.
    Local,
    /// `cuDeviceCanAccessPeer` said no.
    NotReported,
    /// Enabling or the probe failed.
    Failed(String),
    /// A kernel on `from` wrote into `to`'s memory and the value came back on both sides.
    Ok,
}

/// Local GPUs used together, with peer access between every pair that passed the probe.
#[derive(Debug)]
pub struct Clique {
    pub devices: Vec<Device>,
    /// `probes[i][j]`: can device i's kernels access device j's memory.
    pub probes: Vec<Vec<Probe>>,
    pub peers: Arc<PeerAccessTable>,
}

/// Number of CUDA devices visible (error if there is no driver).
pub fn device_count() -> Result<usize> {
    Ok(ffi::cuda::device_count()?)
}

impl Clique {
    /// Opens `ordinals`, compiles and loads the kernels, enables and probes peer access.
    pub fn new(ordinals: &[usize]) -> Result<Clique> {
        if ordinals.is_empty() || ordinals.len() > MAX_RANKS {
            return Err(CudaError::Invalid(format!("a clique has 1..={MAX_RANKS} devices, not {}", ordinals.len())));
        }
        let mut devices = Vec::new();
        for &o in ordinals {
            let ctx = Context::new(o)?;
            let cc = ctx.compute_capability()?;
            let bin = cubin_for((cc.0 * 10 + cc.1) as u32)?;
            let module = ctx.load_module(&bin)?;
            let stream = Stream::new(&ctx)?;
            devices.push(Device { ordinal: o, name: ctx.name()?, cc, sms: ctx.sm_count()?, module, stream, ctx });
        }
        let n = devices.len();
        let mut probes = vec![vec![Probe::Local; n]; n];
        for i in 0..n {
            for j in 0..n {
                if i != j {
                    probes[i][j] = probe_pair(&devices[i], &devices[j]);
                }
            }
        }
        let key = PeerTableKey::Backend { backend: "cuda".into(), devices: ordinals.to_vec() };
        let table = probes.clone();
        let peers = PeerAccessTable::cached(key, move || {
            PeerAccessTable::from_fn(n, "cuda peer probe", |a, b| matches!(table[a][b], Probe::Local | Probe::Ok))
        });
        Ok(Clique { devices, probes, peers })
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Errors unless every ordered pair passed the probe.
    pub fn require_full_peer_access(&self) -> Result<()> {
        for (i, row) in self.probes.iter().enumerate() {
            for (j, p) in row.iter().enumerate() {
                if !matches!(p, Probe::Local | Probe::Ok) {
                    return Err(CudaError::NoPeer { from: i, to: j, why: format!("{p:?}") });
                }
            }
        }
        Ok(())
    }

    pub fn synchronize(&self) -> Result<()> {
        for d in &self.devices {
            d.ctx.bind()?;
            d.stream.synchronize()?;
        }
        Ok(())
    }

    /// A zeroed allocation of `len` bytes on every device.
    pub fn alloc(&self, len: usize) -> Result<Vec<DeviceBuffer>> {
        self.devices.iter().map(|d| Ok(DeviceBuffer::zeroed(&d.ctx, len)?)).collect()
    }
}

fn probe_pair(a: &Device, b: &Device) -> Probe {
    let run = || -> Result<Probe> {
        if !a.ctx.can_access_peer(&b.ctx)? {
            return Ok(Probe::NotReported);
        }
        a.ctx.enable_peer_access(&b.ctx)?;
        let remote = DeviceBuffer::zeroed(&b.ctx, 4)?;
        let back = DeviceBuffer::zeroed(&a.ctx, 4)?;
        let v: u32 = 0x5eed_0000 | ((a.ordinal as u32) << 8) | b.ordinal as u32;
        let f = a.module.function("pl_probe")?;
        a.ctx.bind()?;
        let (mut p0, mut p1, mut p2) = (remote.ptr, v, back.ptr);
        let mut params = [
            &mut p0 as *mut u64 as *mut std::ffi::c_void,
            &mut p1 as *mut u32 as *mut std::ffi::c_void,
            &mut p2 as *mut u64 as *mut std::ffi::c_void,
        ];
        // SAFETY: pl_probe(u32*, u32, u32*): the parameter list matches, and both buffers live
        // until the stream is synchronised below.
        unsafe { a.stream.launch(&f, 1, 32, &mut params)? };
        a.stream.synchronize()?;
        let (mut x, mut y) = ([0u32], [0u32]);
        remote.read(&mut x)?;
        back.read(&mut y)?;
        Ok(if x[0] == v && y[0] == v {
            Probe::Ok
        } else {
            Probe::Failed(format!("wrote {v:#x}, peer holds {:#x}, read back {:#x}", x[0], y[0]))
        })
    };
    run().unwrap_or_else(|e| Probe::Failed(e.to_string()))
}

/// The symmetric arena of one executable: the same size, hence the same offsets, on every
/// device of a clique. Collectives' staging and signals live in it.
#[derive(Debug)]
pub struct SymmetricArena {
    pub bufs: Vec<DeviceBuffer>,
    pub len: usize,
}

impl SymmetricArena {
    pub fn new(clique: &Clique, len: usize) -> Result<SymmetricArena> {
        Ok(SymmetricArena { bufs: clique.alloc(len)?, len })
    }

    /// Address of byte `offset` on every device.
    pub fn at(&self, offset: usize) -> Vec<u64> {
        self.bufs.iter().map(|b| b.ptr + offset as u64).collect()
    }
}
