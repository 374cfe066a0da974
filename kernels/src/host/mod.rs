//! The host backend's collective layer: N simulated devices in one process.
//!
//! Device memory is one zeroed, 64-byte aligned arena per device; peer access is direct
//! access to a peer's arena. Collectives run the same synchronisation protocols the GPU
//! kernels will (`shared/research/collective_anchors.md` §1–§4), so the protocols are
//! proven here before any GPU runs them:
//!
//! - **Signal flags** are 32-bit counters in arena memory (the call's `signals` region), one
//!   writer per flag word, written with `Release` and read with `Acquire`, and compared with
//!   a wrapping-aware "at least". They are never reset.
//! - **Epochs** advance on the device side: word 0 of a device's own `signals` region is a
//!   per-device, per-collective counter that the device reads and increments on entry.
//!   Nothing is passed from the host, so a captured graph could replay the same call.
//! - **No host-side coordination** inside a collective: no barrier or channel between
//!   devices, only flags in arena memory. A waiting device spins briefly, then parks on the
//!   cluster's condition variable, which every flag store notifies: a wake-up hint for hosts
//!   with fewer cores than devices (XLA:CPU), never a source of truth.
//! - **A watchdog** on every wait: waiting (spinning, then parking) stops at the call's deadline with [`Error::Timeout`], which names the
//!   ranks that never arrived. Nothing hangs.
//!
//! The protocols themselves are described in `protocol.rs`.
//!
//! **Ownership of `scratch` and `signals`:** both regions belong to one collective
//! instruction for the lifetime of the cluster; the same offsets must be passed on every
//! device and every execution of that instruction, and no other collective may use them.
//! The epoch counter and the one-shot's "no end barrier" argument rely on it (a rank may
//! leave a one-shot while a peer still reads its staging buffer).

mod arena;
pub mod direct;
mod layout;
mod protocol;
mod reduce;
#[cfg(target_os = "linux")]
pub mod shm;

use std::fmt;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicUsize, fence};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hlo::ArrayShape;
use thunks::{CollectiveConfig, CollectiveKind, Implementation, KernelAlgorithm};

use crate::{Error, Result};
use arena::Arena;

/// Peer access between devices: `peers[a][b]` says whether device `a` can address device
/// `b`'s memory. Self-access is implied. Kernels (never the fallback) require access in both
/// directions between every pair of devices that exchange data.
pub type PeerMatrix = Vec<Vec<bool>>;

/// A byte range of a device's arena (the thunk programs' type). Collective regions are
/// symmetric: the same offsets on every device.
pub use thunks::Region;

/// One execution of a collective on one device.
#[derive(Clone, Debug)]
pub struct CollectiveCall<'a> {
    /// Groups are global device ids (= host device ranks).
    pub config: &'a CollectiveConfig,
    /// `Kernel(algorithm)` or `Fallback`.
    pub implementation: Implementation,
    /// One region per operand, symmetric across devices.
    pub inputs: Vec<Region>,
    /// One region per result (all-to-all tuple form: one per operand), symmetric.
    pub outputs: Vec<Region>,
    /// Each operand's shape (element type and dimensions), needed where a dimension splits
    /// or concatenates operands (all-gather, all-to-all, reduce-scatter) and for variadic
    /// collectives of mixed element types. Empty: every operand is a 1-D array of
    /// `config.element_type`.
    pub operand_shapes: Vec<ArrayShape>,
    /// Staging space of at least [`scratch_bytes`] bytes, owned by this collective.
    pub scratch: Region,
    /// Signal space of at least [`signal_bytes`] bytes at an 8-byte aligned offset, owned by
    /// this collective; zero when the cluster is created and never reset afterwards.
    pub signals: Region,
    /// How long the whole call may take before it fails with a timeout.
    pub timeout: Duration,
    /// The instruction's name, for errors.
    pub name: &'a str,
}

/// Formats a group as `{0,1,2,3}`.
pub(crate) fn fmt_group(group: &[usize]) -> String {
    format!("{{{}}}", group.iter().map(usize::to_string).collect::<Vec<_>>().join(","))
}

/// N simulated devices sharing one process. Create one per executable (or per run) and
/// hand [`HostCluster::device`] handles to one worker thread per device.
pub struct HostCluster {
    arenas: Vec<Arena>,
    arena_bytes: usize,
    peers: Arc<PeerMatrix>,
    /// Where each device parks while it waits for its flags; a flag store into a device's
    /// arena wakes that device. A hint only: the protocols read flags, never this.
    parking: Vec<Parking>,
}

/// One device's parking spot.
#[derive(Default)]
struct Parking {
    lock: Mutex<()>,
    wakeup: Condvar,
    /// Set while the device is parked or about to park: a flag store skips the lock and
    /// notify when it is clear.
    parked: AtomicUsize,
}

impl fmt::Debug for HostCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostCluster")
            .field("num_devices", &self.arenas.len())
            .field("arena_bytes", &self.arena_bytes)
            .finish_non_exhaustive()
    }
}

/// The host's physical memory (`MemTotal`), which every simulated device's arena comes
/// from; `None` where /proc/meminfo cannot be read.
fn host_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl HostCluster {
    /// `num_devices` devices of `arena_bytes` zeroed bytes each. `peers` must be
    /// `num_devices × num_devices`.
    pub fn new(num_devices: usize, arena_bytes: usize, peers: Arc<PeerMatrix>) -> Result<Arc<Self>> {
        if num_devices == 0 {
            return Err(Error::NoDevices);
        }
        if peers.len() != num_devices || peers.iter().any(|r| r.len() != num_devices) {
            let len = peers.iter().map(Vec::len).find(|&l| l != num_devices).unwrap_or(num_devices);
            return Err(Error::PeerMatrix { num_devices, rows: peers.len(), len });
        }
        if let Some(host_bytes) = host_memory_bytes()
            && (num_devices as u128) * (arena_bytes as u128) > u128::from(host_bytes)
        {
            // Refuse at load time: zeroing the arenas would otherwise run the process out of
            // memory (overcommit lets the reservation itself succeed).
            return Err(Error::ExceedsHostMemory { num_devices, arena_bytes, host_bytes });
        }
        let alloc = || Error::Alloc { num_devices, arena_bytes };
        let mut arenas = Vec::new();
        arenas.try_reserve_exact(num_devices).map_err(|_| alloc())?;
        for _ in 0..num_devices {
            arenas.push(Arena::new(arena_bytes).ok_or_else(alloc)?);
        }
        Ok(Arc::new(HostCluster {
            parking: (0..arenas.len()).map(|_| Parking::default()).collect(),
            arenas,
            arena_bytes,
            peers,
        }))
    }

    pub fn num_devices(&self) -> usize {
        self.arenas.len()
    }

    /// Wakes device `rank` if it is parked (after a flag store into its arena).
    pub(crate) fn wake(&self, rank: usize) {
        let Some(p) = self.parking.get(rank) else { return };
        // Pairs with the SeqCst increment in `park_lock`: either the parker sees the flag just
        // stored, or this store sees the parker (no lost wake-up).
        fence(SeqCst);
        if p.parked.load(SeqCst) == 0 {
            return;
        }
        drop(p.lock.lock().unwrap_or_else(PoisonError::into_inner));
        p.wakeup.notify_all();
    }

    /// Takes device `rank`'s parking lock; re-check the flags under it, then
    /// [`HostCluster::park`]. Every `park_lock` is followed by exactly one `park`.
    pub(crate) fn park_lock(&self, rank: usize) -> Option<MutexGuard<'_, ()>> {
        let p = self.parking.get(rank)?;
        p.parked.fetch_add(1, SeqCst);
        Some(p.lock.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Sleeps until a flag store into `rank`'s arena or `timeout` (returns at once with
    /// `None`: the flags were re-checked and the wait is over).
    pub(crate) fn park(&self, rank: usize, guard: Option<Option<MutexGuard<'_, ()>>>, timeout: Duration) {
        let Some(p) = self.parking.get(rank) else { return };
        if let Some(Some(guard)) = guard {
            drop(p.wakeup.wait_timeout(guard, timeout).unwrap_or_else(PoisonError::into_inner));
        }
        p.parked.fetch_sub(1, SeqCst);
    }

    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    pub fn peers(&self) -> &PeerMatrix {
        &self.peers
    }

    /// Whether `a` and `b` can access each other's memory (always true for `a == b`).
    pub fn can_access(&self, a: usize, b: usize) -> bool {
        let one = |x: usize, y: usize| self.peers.get(x).and_then(|r| r.get(y)).copied().unwrap_or(false);
        a == b || (one(a, b) && one(b, a))
    }

    /// The handle device `d`'s worker thread uses. A handle for a device that does not exist
    /// fails every operation with [`Error::NoSuchDevice`].
    pub fn device(self: &Arc<Self>, d: usize) -> HostDevice {
        HostDevice { cluster: Arc::clone(self), rank: d }
    }

    fn arena(&self, rank: usize) -> Result<&Arena> {
        self.arenas.get(rank).ok_or(Error::NoSuchDevice { rank, num_devices: self.arenas.len() })
    }

    fn check(&self, what: &'static str, rank: usize, region: Region) -> Result<()> {
        match region.offset.checked_add(region.len) {
            Some(end) if end <= self.arena_bytes => Ok(()),
            _ => Err(Error::OutOfBounds {
                what,
                rank,
                offset: region.offset,
                len: region.len,
                arena_bytes: self.arena_bytes,
            }),
        }
    }
}

/// Device `rank` of a [`HostCluster`].
#[derive(Clone, Debug)]
pub struct HostDevice {
    cluster: Arc<HostCluster>,
    rank: usize,
}

impl HostDevice {
    /// The device's global id.
    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn cluster(&self) -> &Arc<HostCluster> {
        &self.cluster
    }

    /// Reads `out.len()` bytes of this device's arena at `offset` into `out`.
    pub fn read_into(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let arena = self.cluster.arena(self.rank)?;
        self.cluster.check("read", self.rank, Region::new(offset, out.len()))?;
        arena.load(offset, out);
        Ok(())
    }

    /// Reads `len` bytes of this device's arena.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let arena = self.cluster.arena(self.rank)?;
        self.cluster.check("read", self.rank, Region::new(offset, len))?;
        let mut out = Vec::new();
        out.try_reserve_exact(len).map_err(|_| Error::Alloc { num_devices: 1, arena_bytes: len })?;
        out.resize(len, 0);
        arena.load(offset, &mut out);
        Ok(out)
    }

    /// Writes `bytes` into this device's arena.
    pub fn write(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        let arena = self.cluster.arena(self.rank)?;
        self.cluster.check("write", self.rank, Region::new(offset, bytes.len()))?;
        arena.store(offset, bytes);
        Ok(())
    }

    /// Copies `len` bytes from `src` to `dst` within this device's arena (overlap allowed).
    pub fn copy_within(&self, src: usize, dst: usize, len: usize) -> Result<()> {
        let arena = self.cluster.arena(self.rank)?;
        self.cluster.check("copy source", self.rank, Region::new(src, len))?;
        self.cluster.check("copy destination", self.rank, Region::new(dst, len))?;
        arena::copy(arena, src, arena, dst, len);
        Ok(())
    }

    /// Runs one collective as this device. Every device of the call's groups (or, for
    /// collective-permute, every device) must make the same call; a device that never does
    /// makes its peers fail with [`Error::Timeout`] after `call.timeout`.
    pub fn run_collective(&self, call: &CollectiveCall) -> Result<()> {
        protocol::run(&self.cluster, self.rank, call)
    }
}

/// Bytes of the staging space in the `scratch` region, rounded up to 64.
fn staging_stride(config: &CollectiveConfig) -> usize {
    config.bytes_per_device.div_ceil(64).saturating_mul(64)
}

/// Staging buffers an implementation keeps: two (chosen by epoch parity) for the kernels
/// that read peers' staging without an end barrier, none for the direct push kernels, one
/// for the fallback.
fn staging_buffers(implementation: Implementation) -> usize {
    match implementation {
        Implementation::Kernel(
            KernelAlgorithm::OneShotAllReduce
            | KernelAlgorithm::TwoShotAllReduce
            | KernelAlgorithm::DirectReduceScatter,
        ) => 2,
        Implementation::Kernel(
            KernelAlgorithm::DirectAllGather | KernelAlgorithm::DirectAllToAll | KernelAlgorithm::DirectPermute,
        ) => 0,
        Implementation::Fallback => 1,
    }
}

/// Bytes of staging space (`CollectiveCall::scratch`) a collective needs.
pub fn scratch_bytes(config: &CollectiveConfig, implementation: Implementation) -> usize {
    staging_stride(config).saturating_mul(staging_buffers(implementation))
}

/// Barriers (sets of per-member flag slots) an implementation uses.
fn barriers(implementation: Implementation) -> usize {
    match implementation {
        Implementation::Kernel(KernelAlgorithm::OneShotAllReduce | KernelAlgorithm::DirectReduceScatter) => 1,
        _ => 2,
    }
}

/// The largest group (flag slots per barrier), at least 1.
fn max_group(config: &CollectiveConfig) -> usize {
    config.groups.iter().map(Vec::len).max().unwrap_or(0).max(1)
}

/// Flag words after the epoch counter.
fn signal_slots(config: &CollectiveConfig, implementation: Implementation) -> usize {
    if config.op.kind == CollectiveKind::CollectivePermute {
        2
    } else {
        barriers(implementation).saturating_mul(max_group(config))
    }
}

/// Bytes of signal space (`CollectiveCall::signals`) a collective needs: an 8-byte word for
/// the epoch counter, then one 8-byte word per flag (a 32-bit counter in its low half).
pub fn signal_bytes(config: &CollectiveConfig, implementation: Implementation) -> usize {
    signal_slots(config, implementation).saturating_add(1).saturating_mul(8)
}
