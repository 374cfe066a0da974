//! The ROCm backend's device layer (feature `rocm`): the CUDA layer's shape ([`crate::cuda`])
//! on AMD GPUs through HIP. One [`Clique`] of local GPUs with a stream and the kernel modules
//! per device, peer access enabled once per pair and checked by the same write/read probe
//! kernel (`pl_probe`), and the symmetric arena ([`SymmetricArena`]).
//!
//! Shared with CUDA, not copied: the kernel sources ([`SOURCES`], one tree compiled by NVRTC
//! or hipRTC through `peerless_device.h`), the launch geometry and signal sizing ([`BLOCKS`],
//! [`THREADS`], [`SIGNAL_BYTES`]), the kernels' argument structs, [`Dtype`] / [`Red`] /
//! [`Algo`] and [`Probe`]. What differs is the device layer (`ffi::hip`, `ffi::hiprtc`,
//! `ffi::rccl`) and two AMD-specific choices made here:
//! - kernels are compiled for the device's full `gcnArchName` (e.g. `gfx90a:sramecc+:xnack-`),
//!   so the code object matches the device's xnack/sramecc mode;
//! - every clique allocation is fine-grained device memory: peers poll signal flags and read
//!   staging while kernels run, and coarse-grained memory (plain `hipMalloc`) is only
//!   coherent across devices at kernel boundaries.
//!
//! The peer table holds what the probe found; [`Clique::peer_table`] applies the emitter's
//! target policy (gfx90a excluded unless `--allow_unsafe_peer_targets=true`).
//!
//! Nothing here has run on an AMD GPU yet: CI compiles the kernels for gfx90a (hipRTC and
//! hipcc) and type-checks and lints this module (README, "ROCm status").

mod collectives;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub use collectives::{AllGather, AllReduce, RcclClique};
use emitter::{Flags, PeerAccessTable, PeerTableKey};
pub use ffi::Error as FfiError;
use ffi::hip::{Context, DeviceBuffer, Function, Module, Stream};

pub use crate::cuda::{Algo, BLOCKS, Dtype, MAX_RANKS, Probe, Red, SIGNAL_BYTES, SOURCES, THREADS};

/// Errors of the ROCm backend.
#[derive(Debug, thiserror::Error)]
pub enum RocmError {
    #[error(transparent)]
    Ffi(#[from] ffi::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("peer access {from}→{to} is missing: {why}")]
    NoPeer { from: usize, to: usize, why: String },
}

pub type Result<T, E = RocmError> = std::result::Result<T, E>;

/// Compiles every kernel source that is a translation unit (not headers) with hipRTC for
/// `arch` (`gfx90a`, or a device's full `gcnArchName`). Used by the device layer and by CI
/// (`kernels/tests/rocm_hiprtc.rs`, gfx90a, no GPU).
pub fn compile_sources(arch: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let headers: Vec<(&str, &str)> = SOURCES.iter().filter(|s| s.0.ends_with(".h")).copied().collect();
    let mut v = Vec::new();
    for (name, text) in SOURCES.iter().filter(|s| s.0.ends_with(".cu")) {
        let src = format!("#define PL_BLOCKS {BLOCKS}\n{text}");
        v.push((name.to_string(), ffi::hiprtc::compile(name, &src, &headers, arch)?));
    }
    Ok(v)
}

/// Code objects per arch, compiled once per process.
fn code_for(arch: &str) -> Result<Arc<Vec<(String, Vec<u8>)>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Vec<(String, Vec<u8>)>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let poisoned = || RocmError::Invalid("kernel cache poisoned".into());
    if let Some(c) = cache.lock().map_err(|_| poisoned())?.get(arch) {
        return Ok(c.clone());
    }
    let code = Arc::new(compile_sources(arch)?);
    cache.lock().map_err(|_| poisoned())?.insert(arch.to_string(), code.clone());
    Ok(code)
}

/// Number of HIP devices visible (error if the HIP runtime cannot be loaded).
pub fn device_count() -> Result<usize> {
    Ok(ffi::hip::device_count()?)
}

/// One GPU of a clique.
#[derive(Debug)]
pub struct Device {
    pub ordinal: usize,
    pub name: String,
    /// `gcnArchName`, e.g. `gfx90a:sramecc+:xnack-`.
    pub arch: String,
    /// The gfx target alone, e.g. `gfx90a`.
    pub target: String,
    /// Compute units.
    pub cus: i32,
    /// One module per kernel translation unit.
    pub modules: Vec<Module>,
    pub stream: Stream,
    /// Declared last so modules and the stream go first.
    pub ctx: Context,
}

impl Device {
    /// The kernel `name`, from whichever module defines it.
    pub fn function(&self, name: &str) -> Result<Function> {
        let mut last = None;
        for m in &self.modules {
            match m.function(name) {
                Ok(f) => return Ok(f),
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) => e.into(),
            None => RocmError::Invalid(format!("device {}: no kernel modules loaded", self.ordinal)),
        })
    }
}

/// Local AMD GPUs used together, with peer access between every pair that passed the probe.
#[derive(Debug)]
pub struct Clique {
    pub devices: Vec<Device>,
    /// `probes[i][j]`: can device i's kernels access device j's memory.
    pub probes: Vec<Vec<Probe>>,
    /// What the probe found, cached per device set ([`PeerTableKey::Backend`] `rocm`).
    pub peers: Arc<PeerAccessTable>,
}

impl Clique {
    /// Opens `ordinals`, compiles (hipRTC, once per arch) and loads the kernels, enables and
    /// probes peer access.
    pub fn new(ordinals: &[usize]) -> Result<Clique> {
        if ordinals.is_empty() || ordinals.len() > MAX_RANKS {
            return Err(RocmError::Invalid(format!("a clique has 1..={MAX_RANKS} devices, not {}", ordinals.len())));
        }
        let mut devices = Vec::new();
        for &o in ordinals {
            let ctx = Context::new(o)?;
            let arch = ctx.arch()?;
            let target = ffi::hip::gfx_target(&arch).unwrap_or(&arch).to_string();
            let modules =
                code_for(&arch)?.iter().map(|(_, code)| ctx.load_module(code)).collect::<Result<Vec<_>, _>>()?;
            let stream = Stream::new(&ctx)?;
            devices.push(Device {
                ordinal: o,
                name: ctx.name()?,
                arch,
                target,
                cus: ctx.cu_count()?,
                modules,
                stream,
                ctx,
            });
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
        let key = PeerTableKey::Backend { backend: "rocm".into(), devices: ordinals.to_vec() };
        let table = probes.clone();
        let peers = PeerAccessTable::cached(key, move || {
            PeerAccessTable::from_fn(n, "rocm peer probe", |a, b| matches!(table[a][b], Probe::Local | Probe::Ok))
        });
        Ok(Clique { devices, probes, peers })
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Every device's gfx target, in clique order.
    pub fn targets(&self) -> Vec<&str> {
        self.devices.iter().map(|d| d.target.as_str()).collect()
    }

    /// The table the decision rules get: the probed table under the emitter's target policy
    /// (`PeerAccessTable::with_target_policy`: gfx90a's links removed unless forced).
    pub fn peer_table(&self, flags: &Flags) -> Arc<PeerAccessTable> {
        self.peers.with_target_policy(&self.targets(), flags)
    }

    /// Errors unless every ordered pair passed the probe.
    pub fn require_full_peer_access(&self) -> Result<()> {
        for (i, row) in self.probes.iter().enumerate() {
            for (j, p) in row.iter().enumerate() {
                if !matches!(p, Probe::Local | Probe::Ok) {
                    return Err(RocmError::NoPeer { from: i, to: j, why: format!("{p:?}") });
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

    /// A zeroed fine-grained allocation of `len` bytes on every device (see the module docs).
    pub fn alloc(&self, len: usize) -> Result<Vec<DeviceBuffer>> {
        self.devices.iter().map(|d| Ok(DeviceBuffer::fine_grained(&d.ctx, len)?)).collect()
    }
}

fn probe_pair(a: &Device, b: &Device) -> Probe {
    let run = || -> Result<Probe> {
        if !a.ctx.can_access_peer(&b.ctx)? {
            return Ok(Probe::NotReported);
        }
        a.ctx.enable_peer_access(&b.ctx)?;
        let remote = DeviceBuffer::fine_grained(&b.ctx, 4)?;
        let back = DeviceBuffer::fine_grained(&a.ctx, 4)?;
        let v: u32 = 0x5eed_0000 | ((a.ordinal as u32) << 8) | b.ordinal as u32;
        let f = a.function("pl_probe")?;
        a.ctx.bind()?;
        let (mut p0, mut p1, mut p2) = (remote.ptr, v, back.ptr);
        let mut params = [
            &mut p0 as *mut u64 as *mut std::ffi::c_void,
            &mut p1 as *mut u32 as *mut std::ffi::c_void,
            &mut p2 as *mut u64 as *mut std::ffi::c_void,
        ];
        // SAFETY: pl_probe(u32*, u32, u32*): the parameter list matches, and both buffers live
        // until the stream is synchronised below.
        unsafe { a.stream.launch(&f, 1, 64, &mut params)? };
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
/// device of a clique (fine-grained memory). Collectives' staging and signals live in it.
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
