//! The GPU backends' common layer, written once over [`ffi::gpu::Gpu`] and [`Backend`] (how a vendor compiles kernels
//! and names its targets): the [`Clique`] of local GPUs with peer access proven by `pl_probe`, launch geometry, the
//! kernels' argument structs ([`args`]) and the runtime behind XLA's handlers ([`xla`]). `crate::cuda` and
//! `crate::rocm` hold only their compilers, `Backend` impls and runtime state. Every device call returns an error
//! naming the call and the device; nothing here panics on a missing library or device. ARCHITECTURE.md ("GPU layer").

pub mod args;
mod units;
pub mod xla;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

pub use args::NormArray;
pub use args::{Algo, Dtype, Red};
pub use ffi::gpu::Gpu;
use ffi::gpu::{GpuBuffer, GpuContext, GpuModule, GpuStream};
use thunks::{PeerAccessTable, PeerTableKey};
pub use units::{Kernel, Unit};

use crate::{Error, Result};

/// The most blocks a collective kernel's grid may have: the size of the per-block counter and flag arrays (the kernels
/// get it as `PL_BLOCKS`). One constant bounds launch geometry and sizes the signals; [`grid`] picks each launch's
/// block count at or below it.
pub const BLOCKS: u32 = thunks::MAX_COLLECTIVE_BLOCKS;
/// The largest grid [`grid`] picks: one thread per 16-byte unit up to this many blocks.
pub const DEFAULT_GRID: u32 = thunks::DEFAULT_COLLECTIVE_BLOCKS;
/// Threads per block (the kernels' `__launch_bounds__`).
pub const THREADS: u32 = 512;
/// Blocks for a launch moving `units` 16-byte units per device and phase: a thread per unit up to `max_grid` blocks (at
/// least one, at most [`BLOCKS`]), so small messages barrier on one block's flags. Every rank computes the same grid
/// from the same size, which the per-block barriers need.
pub fn grid(units: u64, max_grid: u32) -> u32 {
    let max = max_grid.clamp(1, BLOCKS);
    units.div_ceil(u64::from(THREADS)).clamp(1, u64::from(max)) as u32
}

/// Blocks for a fused all-reduce + RMSNorm launch of `rows` rows: one block per row up to [`DEFAULT_GRID`] (blocks then
/// take rows `b`, `b + grid`, ...). Every rank computes the same grid from the same shape, which the per-block barriers
/// need.
pub fn norm_grid(rows: usize) -> u32 {
    (rows as u64).clamp(1, u64::from(DEFAULT_GRID.clamp(1, BLOCKS))) as u32
}

/// Largest clique the kernels take (`PL_MAX_RANKS`).
pub const MAX_RANKS: usize = 8;
/// Bytes of one communicator's signals on one device: the per-block counters and two flag sets.
pub const SIGNAL_BYTES: usize = 4 * (BLOCKS as usize + 2 * BLOCKS as usize * MAX_RANKS);

/// Bytes before the Lamport one-shot's regions on each device (`PL_LAMPORT_HDR`: its launch counters and the bytes each
/// region last received).
pub const LAMPORT_HDR: usize = 1024;
/// The largest operand the Lamport one-shot takes: its regions hold three copies of every member's operand on each
/// device, so this bounds their memory (3 x 4 x 512 KiB = 6 MiB per communicator and GPU on 4 GPUs).
pub const LAMPORT_MAX_BYTES: usize = 512 << 10;

/// Bytes of the Lamport regions on each device for operands up to `slot` bytes in groups of `world`: the header, then
/// three regions of `world` slots.
pub fn lamport_bytes(slot: usize, world: usize) -> usize {
    LAMPORT_HDR + 3 * world * slot
}

/// The initial contents of Lamport regions of `len` bytes: a zero header, sentinel (all bits set) everywhere else.
pub fn lamport_init(len: usize) -> Vec<u8> {
    let mut v = vec![0xFFu8; len];
    v[..LAMPORT_HDR.min(len)].fill(0);
    v
}

/// The kernel sources, as (file name, text); headers are included by name (`peerless_types.h`: the element types and
/// 16-bit float conversions every source includes).
pub const SOURCES: &[(&str, &str)] = &[
    ("peerless_types.h", include_str!("../../cuda/peerless_types.h")),
    ("peerless_device.h", include_str!("../../cuda/peerless_device.h")),
    ("collectives.cu", include_str!("../../cuda/collectives.cu")),
];

/// The translation units of [`SOURCES`] with the launch constants prepended, and the headers they include: what either
/// compiler takes.
pub fn translation_units() -> (Vec<(&'static str, String)>, Vec<(&'static str, &'static str)>) {
    let headers = SOURCES.iter().filter(|s| s.0.ends_with(".h")).copied().collect();
    let units = SOURCES
        .iter()
        .filter(|s| s.0.ends_with(".cu"))
        .map(|(name, text)| (*name, format!("#define PL_BLOCKS {BLOCKS}\n{text}")))
        .collect();
    (units, headers)
}

/// What a vendor adds to its device layer: its kernels' code objects and its device targets.
pub trait Backend: Gpu {
    /// Threads of the one-block peer probe launch (a warp or a wavefront).
    const PROBE_THREADS: u32;

    /// The device's full architecture name (`sm_90`; `gfx90a:sramecc+:xnack-`), which the kernels are compiled for.
    fn arch(ctx: &Self::Context) -> Result<String>;

    /// The GPU target alone (`sm_90`, `gfx90a`): what the emitter's peer-target policy reads.
    fn target(arch: &str) -> String {
        arch.to_string()
    }

    /// `unit`'s code object for `arch` and where it came from: prebuilt (unless `prebuilt` is false: a prebuilt one
    /// failed to load), the disk cache, or compiled now. Compiled at most once per process and arch.
    fn code_object(arch: &str, unit: Unit, prebuilt: bool) -> Result<(Arc<[u8]>, Origin)>;
}

/// Where a loaded unit's code came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// Bundled with the library, for `target` (`sm_90`, or `compute_100`: PTX the driver compiled).
    Prebuilt { target: String },
    /// The disk cache of an earlier compile.
    Cached,
    /// Compiled in this process, taking `seconds`.
    Compiled { seconds: f64 },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Prebuilt { target } => write!(f, "prebuilt ({target})"),
            Origin::Cached => f.write_str("cached"),
            Origin::Compiled { seconds } => write!(f, "compiled ({seconds:.2} s)"),
        }
    }
}

/// Result of the cross-device write/read probe for one ordered pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Same device.
    Local,
    /// The runtime's can-access-peer query said no.
    NotReported,
    /// Enabling or the probe failed.
    Failed(String),
    /// A kernel on `from` wrote into `to`'s memory and the value came back on both sides.
    Ok,
}

impl Probe {
    /// Whether access works (the device itself, or a passed probe).
    pub fn works(&self) -> bool {
        matches!(self, Probe::Local | Probe::Ok)
    }
}

/// One GPU of a clique.
#[derive(Debug)]
pub struct Device<B: Backend> {
    pub ordinal: usize,
    pub name: String,
    /// What the kernels were compiled for (see [`Backend::arch`]).
    pub arch: String,
    /// The target alone (see [`Backend::target`]).
    pub target: String,
    /// Streaming multiprocessors or compute units.
    pub units: i32,
    /// The units loaded so far (the base unit at open, a specialization on first use).
    modules: Mutex<BTreeMap<Unit, (Arc<B::Module>, Origin)>>,
    pub stream: B::Stream,
    /// Declared last so modules and the stream drop first.
    pub ctx: B::Context,
}

impl<B: Backend> Device<B> {
    /// Opens device `ordinal`, loads the base kernels (the peer probe's) for its architecture and makes a stream.
    /// Specializations load on first use ([`Self::load`]).
    pub fn open(ordinal: usize) -> Result<Self> {
        let ctx = B::Context::new(ordinal)?;
        let arch = B::arch(&ctx)?;
        let stream = B::Stream::new(&ctx)?;
        let d = Device {
            ordinal,
            name: ctx.name()?,
            target: B::target(&arch),
            arch,
            units: ctx.compute_units()?,
            modules: Mutex::default(),
            stream,
            ctx,
        };
        d.load(Unit::Base)?;
        Ok(d)
    }

    /// Loads `unit` if it is not loaded yet (compiling it on a machine with neither prebuilt nor cached code); the
    /// collective handlers call it at XLA's initialize stage, so a compile never happens inside a run or a stream
    /// capture.
    pub fn load(&self, unit: Unit) -> Result<Arc<B::Module>> {
        let mut modules = self.modules.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((m, _)) = modules.get(&unit) {
            return Ok(m.clone());
        }
        let (code, origin) = B::code_object(&self.arch, unit, true)?;
        let (module, origin) = match self.ctx.load_module(&code) {
            Ok(m) => (m, origin),
            Err(e) if matches!(origin, Origin::Prebuilt { .. }) => {
                // E.g. PTX newer than the driver's JIT: compile for this device instead.
                log::warn!("{}: prebuilt kernels {} ({origin}) did not load ({e}); compiling", self.arch, unit.name());
                let (code, origin) = B::code_object(&self.arch, unit, false)?;
                (self.ctx.load_module(&code)?, origin)
            }
            Err(e) => return Err(e.into()),
        };
        let m = Arc::new(module);
        modules.insert(unit, (m.clone(), origin));
        Ok(m)
    }

    /// The units loaded on this device and where each came from.
    pub fn loaded(&self) -> Vec<(Unit, Origin)> {
        let modules = self.modules.lock().unwrap_or_else(PoisonError::into_inner);
        modules.iter().map(|(u, (_, o))| (*u, o.clone())).collect()
    }

    /// The kernel `name`, loading the unit that defines it.
    pub fn function(&self, name: &str) -> Result<B::Function> {
        let unit = Unit::of_kernel(name)
            .ok_or_else(|| Error::Gpu(format!("device {}: no kernel named {name}", self.ordinal)))?;
        self.function_of(unit, name)
    }

    /// Kernel `name` of `unit`, loading the unit.
    pub fn function_of(&self, unit: Unit, name: &str) -> Result<B::Function> {
        Ok(self.load(unit)?.function(name)?)
    }
}

/// Local GPUs used together, with peer access between every pair that passed the probe.
#[derive(Debug)]
pub struct Clique<B: Backend> {
    pub devices: Vec<Device<B>>,
    /// `probes[i][j]`: can device i's kernels access device j's memory.
    pub probes: Vec<Vec<Probe>>,
    /// What the probe found, cached per device set ([`PeerTableKey::Backend`] named [`Gpu::NAME`]).
    pub peers: Arc<PeerAccessTable>,
    /// The largest grid the launchers give a kernel: [`DEFAULT_GRID`], or on one device shared by several members its
    /// compute units over the members, so every member's blocks are resident at once (a spinning block must never wait
    /// for a block that cannot start).
    pub max_grid: u32,
}

impl<B: Backend> Clique<B> {
    /// Opens `ordinals`, loads the kernels, enables and probes peer access.
    pub fn new(ordinals: &[usize]) -> Result<Self> {
        if ordinals.is_empty() || ordinals.len() > MAX_RANKS {
            return Err(Error::Gpu(format!("a clique has 1..={MAX_RANKS} devices, not {}", ordinals.len())));
        }
        let devices = ordinals.iter().map(|&o| Device::open(o)).collect::<Result<Vec<_>>>()?;
        let n = devices.len();
        let probe = |i: usize, j: usize| if i == j { Probe::Local } else { probe_pair(&devices[i], &devices[j]) };
        let probes: Vec<Vec<Probe>> = (0..n).map(|i| (0..n).map(|j| probe(i, j)).collect()).collect();
        let key = PeerTableKey::Backend { backend: B::NAME.into(), devices: ordinals.to_vec() };
        let table = probes.clone();
        let peers = PeerAccessTable::cached(key, move || {
            PeerAccessTable::from_fn(n, format!("{} peer probe", B::NAME), |a, b| table[a][b].works())
        });
        Ok(Clique { devices, probes, peers, max_grid: DEFAULT_GRID })
    }

    /// `members` members on GPU `ordinal`, each with a stream of its own: the collectives' protocols exercised and
    /// timed on a machine with one GPU (`peerless bench --members-on-one-gpu`, the GPU tests). Every member's kernels
    /// must be resident at once, so grids are capped at the compute units over the members (`max_grid`); it says
    /// nothing of links between GPUs.
    pub fn on_one_device(ordinal: usize, members: usize) -> Result<Self> {
        if members == 0 || members > MAX_RANKS {
            return Err(Error::Gpu(format!("a clique has 1..={MAX_RANKS} devices, not {members}")));
        }
        let devices = (0..members).map(|_| Device::open(ordinal)).collect::<Result<Vec<_>>>()?;
        let key = PeerTableKey::Backend { backend: B::NAME.into(), devices: vec![ordinal; members] };
        let peers = PeerAccessTable::cached(key, move || {
            PeerAccessTable::from_fn(members, format!("{} one device", B::NAME), |_, _| true)
        });
        let units = devices[0].units.max(1) as u32;
        let max_grid = (units / members as u32).clamp(1, DEFAULT_GRID);
        Ok(Clique { devices, probes: vec![vec![Probe::Local; members]; members], peers, max_grid })
    }

    pub fn len(&self) -> usize {
        self.devices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// Every device's target, in clique order.
    pub fn targets(&self) -> Vec<&str> {
        self.devices.iter().map(|d| d.target.as_str()).collect()
    }

    /// The table the decision rules get: the probed table under the target policy
    /// (`PeerAccessTable::with_target_policy`: gfx90a's links removed unless `allow_unsafe`, the emitter's
    /// `--allow_unsafe_peer_targets`).
    pub fn peer_table(&self, allow_unsafe: bool) -> Arc<PeerAccessTable> {
        self.peers.with_target_policy(&self.targets(), allow_unsafe)
    }
}

/// Enables `a` → `b` access and checks it: a kernel on `a` writes a value into `b`'s memory and into its own; both must
/// read back.
fn probe_pair<B: Backend>(a: &Device<B>, b: &Device<B>) -> Probe {
    let run = || -> Result<Probe> {
        if !a.ctx.can_access_peer(&b.ctx)? {
            return Ok(Probe::NotReported);
        }
        a.ctx.enable_peer_access(&b.ctx)?;
        let remote = B::Buffer::alloc(&b.ctx, 4)?;
        let back = B::Buffer::alloc(&a.ctx, 4)?;
        let v: u32 = 0x5eed_0000 | ((a.ordinal as u32) << 8) | b.ordinal as u32;
        let f = a.function("pl_probe")?;
        a.ctx.bind()?;
        let mut args = args::ProbeArgs { remote: remote.ptr(), value: v, back: back.ptr() };
        // SAFETY: pl_probe(u32*, u32, u32*): the parameter list matches, and both buffers live until the stream is
        // synchronised below.
        unsafe { a.stream.launch(&f, 1, B::PROBE_THREADS, &mut args.params())? };
        a.stream.synchronize()?;
        let (mut x, mut y) = ([0u8; 4], [0u8; 4]);
        remote.read_at(0, &mut x)?;
        back.read_at(0, &mut y)?;
        let (x, y) = (u32::from_ne_bytes(x), u32::from_ne_bytes(y));
        Ok(if x == v && y == v {
            Probe::Ok
        } else {
            Probe::Failed(format!("wrote {v:#x}, peer holds {x:#x}, read back {y:#x}"))
        })
    };
    run().unwrap_or_else(|e| Probe::Failed(e.to_string()))
}
