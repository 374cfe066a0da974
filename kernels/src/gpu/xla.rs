//! The GPU runtime behind XLA's FFI handlers, written once for both vendors over the device layer ([`XlaBackend`]:
//! [`crate::gpu::Backend`] plus [`ffi::gpu::Interop`]): Peerless's kernels (or copy-engine steps) on XLA's stream, XLA's
//! buffers as operands and results. Each vendor keeps its own process-wide state ([`RuntimeState`]). The design (slots,
//! plans made at INITIALIZE, epochs on the device so captured calls replay, the exchanges' copy-out in stream order,
//! groups across processes through IPC handles, [`set_device_ids`] mapping XLA's ordinals) is ARCHITECTURE.md's
//! `gpu/xla.rs` section. A peer that never arrives ends the kernel's bounded wait: the kernel writes the missing members
//! into its status word and a host-mapped report word, and the next call on that device reports them (no host
//! synchronisation on the hot path). On ROCm this is compile-checked and unit-tested, never run on an AMD GPU.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use ffi::gpu::{GpuBuffer, GpuContext, GpuHostMapped, GpuIpcMapping, GpuStream, IPC_HANDLE_BYTES, Interop};
use ffi::xla_ffi::{COMMAND_BUFFER_COMPATIBLE, CallFrame, ErrorCode, ExecutableState, HandlerError, Traits};
use hlo::ArrayShape;
use thunks::custom_call::CustomCallConfig;
use thunks::{CollectiveKind as Kind, KernelAlgorithm as Algo};

use super::args::{
    Blocks, Dtype, ExchangeArgs, LocalArgs, MAX_OPERANDS, MAX_TASKS, Many, ManyArgs, Norm, NormArgs, Ptrs, Red,
    ReduceArgs, Run, ScatterArgs, Sig, Status, Wait, Xchg,
};
use super::{BLOCKS, Backend, Clique, DEFAULT_GRID, Kernel, MAX_RANKS, SIGNAL_BYTES, THREADS, Unit};
use crate::ffi_handler::{Adopted, At, CallState, CollectiveRuntime, Slot, SlotKey, Slots, array_shape};

mod copy_engine;
mod launch;
use launch::{Frame, Plan, check_epilogue};

/// A vendor's device layer as the runtime behind XLA's handlers needs it: the kernels' backend ([`Backend`]), what
/// living inside XLA takes ([`Interop`]: IPC, host-mapped memory, XLA's streams, free memory), and the vendor's own
/// process-wide state.
pub trait XlaBackend: Backend + Interop + Sized {
    /// Whether this vendor's handlers run a call with an epilogue (the fused all-reduce + RMSNorm kernel,
    /// `pl_one_shot_norm_*`): CUDA does; ROCm refuses one (its kernel has not run on an AMD GPU, and the pass never
    /// fuses there: capability `fused_norm`).
    const FUSED_NORM: bool = false;

    /// This vendor's runtime state, one `static` per vendor (never shared with another's).
    fn state() -> &'static RuntimeState<Self>;
}

/// What the runtime of one vendor keeps for the process: the clique, the device ids, the bytes held per GPU, the live
/// instances, the executable-state type and the slot tables. Declare one per vendor with [`RuntimeState::new`] in a
/// `static`.
pub struct RuntimeState<B: XlaBackend> {
    /// Every GPU of the process, opened once (`opening`: by one thread at a time).
    clique: OnceLock<Clique<B>>,
    opening: Mutex<()>,
    /// The peer probe a process kept on disk for these GPUs and driver, read once ([`known_peer_table`]).
    kept: OnceLock<Option<KeptProbe>>,
    /// Local ordinal → device id, where this process does not own every device of the job (`jax.distributed`;
    /// [`NO_ID`]: none); `mapped` false: ids are ordinals. Atomics, not a locked map: every call reads it (set once per
    /// process, before any executable runs).
    device_ids: [AtomicUsize; MAX_RANKS],
    mapped: AtomicBool,
    /// Device memory held by ranks, per ordinal.
    held: [AtomicUsize; MAX_RANKS],
    /// Instances alive (tests watch executables free theirs).
    live: AtomicUsize,
    /// The executables' state for each custom call.
    exec: ExecutableState<ExecState<B>>,
    /// The states of calls XLA keeps none for.
    adopted: Adopted<GpuCall<B>>,
    /// Live slots, held weakly: a slot lives as long as a call of an executable holds it.
    slots: Slots<Instance<B>>,
    /// Instances with copy-engine calls, which the watchdog ([`watchdog`]) watches.
    watched: Mutex<Vec<std::sync::Weak<Instance<B>>>>,
    /// Set once the watchdog thread runs.
    watchdog: OnceLock<()>,
}

impl<B: XlaBackend> RuntimeState<B> {
    /// Empty state whose executable state XLA registers as `state_type` (unique per vendor, e.g.
    /// `peerless.cuda_collective`).
    pub const fn new(state_type: &'static str) -> Self {
        RuntimeState {
            clique: OnceLock::new(),
            opening: Mutex::new(()),
            kept: OnceLock::new(),
            device_ids: [const { AtomicUsize::new(NO_ID) }; MAX_RANKS],
            mapped: AtomicBool::new(false),
            held: [const { AtomicUsize::new(0) }; MAX_RANKS],
            live: AtomicUsize::new(0),
            exec: ExecutableState::new(state_type),
            adopted: Adopted::new(),
            slots: Slots::new(),
            watched: Mutex::new(Vec::new()),
            watchdog: OnceLock::new(),
        }
    }
}

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a).saturating_mul(a)
}

fn err(code: ErrorCode, m: impl Into<String>) -> HandlerError {
    HandlerError::new(code, m)
}

fn internal(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::internal(e.to_string())
}

/// Every GPU of the process, opened once. A failure is not kept: a compile that asked before the GPUs could open leaves
/// the runtime free to open them later.
fn clique<B: XlaBackend>() -> Result<&'static Clique<B>, HandlerError> {
    let state = B::state();
    if let Some(c) = state.clique.get() {
        return Ok(c);
    }
    let _one_opener = state.opening.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(c) = state.clique.get() {
        return Ok(c);
    }
    let open = || {
        let n = B::device_count()?.min(MAX_RANKS);
        Clique::new(&(0..n).collect::<Vec<_>>())
    };
    let c = open().map_err(|e| err(ErrorCode::FailedPrecondition, format!("Peerless cannot open the GPUs: {e}")))?;
    let c = state.clique.get_or_init(|| c);
    // What the runtime probed serves later processes' compiles (`known_peer_table`).
    if let Err(e) = save_probe::<B>(c) {
        log::debug!("peerless: the {} peer probe is not kept: {e}", B::NAME);
    }
    Ok(c)
}

/// Where the peer probe of this vendor's GPUs is kept between processes.
fn probe_file<B: XlaBackend>() -> Option<std::path::PathBuf> {
    Some(thunks::runtime::cache_dir()?.join(format!("peer-probe-{}.txt", B::NAME)))
}

/// Writes the clique's probe ([`probe_text`]) for later processes on these GPUs.
fn save_probe<B: XlaBackend>(c: &Clique<B>) -> Result<(), String> {
    let (Some(key), Some(path)) = (B::machine_key().map_err(|e| e.to_string())?, probe_file::<B>()) else {
        return Ok(());
    };
    let text = probe_text(&key, &c.targets(), |a, b| c.probes[a][b].works());
    std::fs::create_dir_all(path.parent().unwrap_or(&path)).map_err(|e| e.to_string())?;
    // A whole file or none: written aside, then renamed over the old one.
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A kept probe: the machine's key (driver and GPU UUIDs), the devices' targets, then one row of `0`/`1` per device
/// (can its kernels reach each device's memory).
fn probe_text(key: &str, targets: &[&str], works: impl Fn(usize, usize) -> bool) -> String {
    let n = targets.len();
    let rows: Vec<String> = (0..n).map(|a| (0..n).map(|b| if works(a, b) { '1' } else { '0' }).collect()).collect();
    format!("{key}\n{}\n{}\n", targets.join(" "), rows.join(" "))
}

/// The table a kept probe holds (under the target policy) if it was made on machine `key`.
fn read_probe(text: &str, key: &str, source: String) -> Option<KeptProbe> {
    let mut lines = text.lines();
    if lines.next() != Some(key) {
        return None;
    }
    let targets: Vec<String> = lines.next()?.split(' ').map(str::to_owned).collect();
    let rows: Vec<&[u8]> = lines.next()?.split(' ').map(str::as_bytes).collect();
    let n = targets.len();
    if rows.len() != n || rows.iter().any(|r| r.len() != n || r.iter().any(|c| !b"01".contains(c))) {
        return None;
    }
    Some((Arc::new(thunks::PeerAccessTable::from_fn(n, source, |a, b| rows[a][b] == b'1')), targets))
}

/// A kept probe's table (before the target policy) and the devices' targets.
type KeptProbe = (Arc<thunks::PeerAccessTable>, Vec<String>);

/// The peer table (under the target policy) the pass may use without opening a GPU: the runtime's, if it opened the
/// GPUs, else the probe an earlier process kept for these same GPUs and driver ([`save_probe`]; read once per process).
pub fn known_peer_table<B: XlaBackend>(allow_unsafe: bool) -> Option<Arc<thunks::PeerAccessTable>> {
    if let Some(c) = B::state().clique.get() {
        return Some(c.peer_table(allow_unsafe));
    }
    let kept = B::state().kept.get_or_init(|| {
        let (key, path) = (B::machine_key().ok()??, probe_file::<B>()?);
        let text = std::fs::read_to_string(&path).ok()?;
        read_probe(&text, &key, format!("{} peer probe kept in {}", B::NAME, path.display()))
    });
    let (table, targets) = kept.as_ref()?;
    Some(table.with_target_policy(&targets.iter().map(String::as_str).collect::<Vec<_>>(), allow_unsafe))
}

/// The runtime's peer-access table (opening and probing the GPUs, once per process), or why there is none: what the
/// pass asks for where no table is known ([`known_peer_table`]).
pub fn peer_table<B: XlaBackend>(allow_unsafe: bool) -> Result<Arc<thunks::PeerAccessTable>, String> {
    clique::<B>().map(|c| c.peer_table(allow_unsafe)).map_err(|e| e.to_string())
}

/// The least free device memory among the process's GPUs, in bytes (the pass's staging budget), read through the
/// contexts XLA made (none is made for it), or why it is unknown.
pub fn least_free_memory<B: XlaBackend>() -> Result<usize, String> {
    let n = B::device_count().map_err(|e| e.to_string())?.min(MAX_RANKS);
    let free = (0..n).map(|o| B::free_memory_if_active(o).map_err(|e| e.to_string()));
    free.collect::<Result<Vec<_>, _>>()?.into_iter().flatten().min().ok_or_else(|| "no GPU context is active".into())
}

/// Records which device id each local GPU (ordinal) has in the job (from the job's topology, which the Python package
/// hands the plugin at its first compile or cache lookup).
pub fn set_device_ids<B: XlaBackend>(ids: BTreeMap<usize, usize>) {
    let state = B::state();
    for (ordinal, slot) in state.device_ids.iter().enumerate() {
        slot.store(ids.get(&ordinal).copied().unwrap_or(NO_ID), Ordering::Release);
    }
    state.mapped.store(!ids.is_empty(), Ordering::Release);
}

/// An ordinal without a device id in the job.
const NO_ID: usize = usize::MAX;

/// One device's part of a collective (a device of this process).
#[derive(Debug)]
struct Rank<B: XlaBackend> {
    staging: B::Buffer,
    signals: B::Buffer,
    /// The kernels' status words (polled while waiting: device memory).
    status: B::Buffer,
    /// Where a timeout is also reported, for the host to read without synchronising.
    report: B::HostMapped,
    /// The GPU it lives on, for [`staging_by_gpu`].
    ordinal: usize,
}

impl<B: XlaBackend> Rank<B> {
    fn held(&self) -> usize {
        self.staging.size() + self.signals.size() + self.status.size()
    }
}

impl<B: XlaBackend> Drop for Rank<B> {
    fn drop(&mut self) {
        if let Some(h) = B::state().held.get(self.ordinal) {
            h.fetch_sub(self.held(), Ordering::Relaxed);
        }
    }
}

/// Bytes of device memory Peerless's collectives hold now (staging, signals, status words), per ordinal of this process
/// (`peerless.staging_bytes()`, `peerless devices`).
pub fn staging_by_gpu<B: XlaBackend>() -> Vec<usize> {
    B::state().held.iter().map(|h| h.load(Ordering::Relaxed)).collect()
}

/// Where a member's staging and signals lie, as this process addresses them.
#[derive(Clone, Copy, Debug)]
struct Addr {
    staging: u64,
    signals: u64,
}

/// Every member's addresses, once known (the hot path reads this).
#[derive(Debug)]
struct Complete<B: XlaBackend> {
    /// This process's devices' parts.
    ranks: HashMap<usize, Arc<Rank<B>>>,
    /// Every member's staging and signals: its own buffers, or another process's opened from their IPC handles.
    addrs: HashMap<usize, Addr>,
    /// Other processes' buffers, closed when the instance goes.
    _mapped: Vec<B::IpcMapping>,
}

/// A collective's per-device state. Each device allocates its own part and publishes it here when it makes its plan: in
/// its INITIALIZE stage (outside any stream capture: allocating or memsetting on another device while that device
/// records a command buffer would break its capture), or at EXECUTE where XLA skipped INITIALIZE or keeps no state. It
/// then waits (bounded) until every device it exchanges with has: in this process through `ranks`, in other processes
/// of the host (`job` calls) through the IPC handles they post in a shared segment ([`crate::host::shm::exchange`]).
#[derive(Debug)]
struct Instance<B: XlaBackend> {
    ranks: Mutex<HashMap<usize, Arc<Rank<B>>>>,
    complete: OnceLock<Complete<B>>,
    /// Held by the one thread of the process that meets the other processes.
    meeting: Mutex<()>,
    /// Staging bytes per device (AR / RS: two halves).
    staging: usize,
    /// The largest operand of the Lamport one-shot's regions, which follow the signals (0: none; all-reduces only, up
    /// to [`super::LAMPORT_MAX_BYTES`]): the same on every member, since it follows from the staging size and the group
    /// size.
    lamport_slot: usize,
    /// Members per group (the Lamport regions hold one slot per member).
    world: usize,
    devices: Vec<usize>,
    /// Across processes: the id the members meet under (the call's instance and this executable's occurrence,
    /// [`thunks::runtime::shared_key`]).
    key: u64,
    /// The copy-engine forms' flag words (`copy_engine::STRIDE` per device of `devices`), page-locked host memory
    /// mapped into every GPU, made by the first copy-engine plan.
    ce: OnceLock<CeWords<B>>,
    /// The longest timeout of the instance's copy-engine calls, for the watchdog.
    ce_timeout_ms: AtomicU64,
    /// Whether the watchdog watches this instance.
    ce_watched: AtomicBool,
}

/// An instance's copy-engine flag words: this process's page-locked memory, or, for a call across processes, a shared
/// segment every process registers with its GPUs.
#[derive(Debug)]
struct CeWords<B: XlaBackend> {
    /// Declared first, so dropped first: unregistered before the segment unmaps.
    mapped: B::HostMapped,
    _segment: Option<crate::host::shm::SharedWords>,
}

/// Where a member's Lamport regions start in its signals allocation.
fn lamport_at() -> usize {
    round_up(SIGNAL_BYTES, 256)
}

impl<B: XlaBackend> Instance<B> {
    /// Whether an operand of `bytes` runs through this instance's Lamport regions (it has some, and the operand fits a
    /// slot).
    fn fits_lamport(&self, bytes: usize) -> bool {
        self.lamport_slot > 0 && bytes <= self.lamport_slot
    }

    /// Where this instance's processes meet (a shared segment's name, `suffix` after the instance's key) and how many
    /// processes hold its devices.
    fn meeting_place(&self, cfg: &CustomCallConfig, job: &str, suffix: &str) -> (String, u64) {
        let processes = self.devices.iter().filter_map(|d| cfg.process_of().get(d).copied());
        let processes = processes.collect::<BTreeSet<_>>().len() as u64;
        (format!("/peerless-{job}-{:016x}-{}{suffix}", self.key, B::NAME), processes)
    }

    /// The copy-engine flag words as every GPU of the process addresses them, made on first use (on `ctx`'s device;
    /// across processes in a segment named by the job and the instance's key, which every process registers), and the
    /// instance put under the watchdog with the call's timeout.
    fn ce_words(self: &Arc<Self>, ctx: &B::Context, cfg: &CustomCallConfig) -> Result<copy_engine::Words, String> {
        self.ce_timeout_ms.fetch_max(cfg.timeout_ms.max(1), Ordering::Relaxed);
        let words = self.devices.len() * copy_engine::STRIDE;
        let h = match self.ce.get() {
            Some(h) => h,
            None => {
                // One thread of the process makes them: a second attach of the shared segment would count this process
                // twice among the processes that joined it.
                let _one = self.meeting.lock().unwrap_or_else(PoisonError::into_inner);
                match self.ce.get() {
                    Some(h) => h,
                    None => {
                        let made = self.make_ce_words(ctx, cfg, words)?;
                        self.ce.get_or_init(|| made)
                    }
                }
            }
        };
        if !self.ce_watched.swap(true, Ordering::AcqRel) {
            watch(Arc::downgrade(self));
        }
        Ok(copy_engine::Words { base: h.mapped.device_ptr })
    }

    /// [`Self::ce_words`]' words, `words` of them: this process's, or across processes the shared segment's, registered
    /// with this process's GPUs.
    fn make_ce_words(&self, ctx: &B::Context, cfg: &CustomCallConfig, words: usize) -> Result<CeWords<B>, String> {
        if !cfg.spans_processes() {
            let mapped = B::HostMapped::new(ctx, words).map_err(|e| e.to_string())?;
            return Ok(CeWords { mapped, _segment: None });
        }
        let (name, processes) = self.meeting_place(cfg, &thunks::runtime::job_for(cfg)?, "-ce");
        let patience = std::time::Duration::from_millis(cfg.timeout_ms.max(1));
        let seg =
            crate::host::shm::SharedWords::attach(&name, words, processes, patience).map_err(|e| e.to_string())?;
        let (ptr, n) = seg.words();
        // SAFETY: `n` page-aligned words of the segment's mapping, which `CeWords` keeps alive until after the
        // registration is dropped (field order).
        let mapped = unsafe { B::HostMapped::register(ctx, ptr, n) }.map_err(|e| e.to_string())?;
        Ok(CeWords { mapped, _segment: Some(seg) })
    }

    /// Bytes of each member's signals allocation: the flags, then the Lamport regions if any.
    fn signal_bytes(&self) -> usize {
        if self.lamport_slot == 0 {
            return SIGNAL_BYTES;
        }
        lamport_at() + super::lamport_bytes(self.lamport_slot, self.world)
    }
}

impl<B: XlaBackend> Drop for Instance<B> {
    fn drop(&mut self) {
        B::state().live.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Number of this vendor's collective instances alive in the process.
pub fn live_instances<B: XlaBackend>() -> usize {
    B::state().live.load(Ordering::Relaxed)
}

/// An executable's state for one custom call (dropping it frees every device's staging).
type ExecState<B> = CallState<GpuCall<B>>;

/// What an executable keeps for one call: its instance, and per GPU ordinal the plan its INITIALIZE made (what EXECUTE
/// replays). Opaque outside this module.
pub struct GpuCall<B: XlaBackend> {
    inst: Arc<Instance<B>>,
    plans: [OnceLock<Plan<B>>; MAX_RANKS],
}

/// The instance `cfg` runs on: its slot's (a live one of the same key, or a new one of the slot's size), or one of its
/// own without a slot or where the live slot is too small for it (only a config from elsewhere: the pass sized the slot
/// for every call), with a warning.
fn on_slot<B: XlaBackend>(cfg: &CustomCallConfig, need: usize, occurrence: u64) -> Arc<Instance<B>> {
    let own = || new_instance(cfg, need, thunks::runtime::shared_key(cfg.instance, occurrence));
    let Some(slot) = cfg.slot else { return own() };
    let key: SlotKey = (slot, occurrence, cfg.groups.clone(), cfg.pairs.clone());
    let size = round_up(need.max(usize::try_from(cfg.slot_gpu_bytes).unwrap_or(usize::MAX)), 512);
    let make =
        || Ok::<_, std::convert::Infallible>(new_instance(cfg, size, thunks::runtime::shared_key(slot, occurrence)));
    match B::state().slots.get_or_make(key, need, |inst| inst.staging, make) {
        Slot::Live(inst) | Slot::Made(Ok(inst)) => inst,
        Slot::TooSmall(have) => {
            log::warn!(
                "peerless: {} '{}' stages {need} bytes per GPU, more than its slot's {have}: staging of its own",
                cfg.target(),
                cfg.name
            );
            own()
        }
        Slot::Made(Err(never)) => match never {},
    }
}

fn devices_of(cfg: &CustomCallConfig) -> Vec<usize> {
    let mut v: Vec<usize> =
        cfg.groups.iter().flatten().copied().chain(cfg.pairs.iter().flat_map(|&(s, t)| [s, t])).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// An instance (nothing allocated yet) of `staging` bytes per device, meeting other processes under `key`.
fn new_instance<B: XlaBackend>(cfg: &CustomCallConfig, staging: usize, key: u64) -> Arc<Instance<B>> {
    B::state().live.fetch_add(1, Ordering::Relaxed);
    let world = cfg.groups.iter().map(Vec::len).max().unwrap_or(0);
    let lamport_slot = if cfg.kind == Kind::AllReduce && world > 1 {
        round_up((staging / 2).min(super::LAMPORT_MAX_BYTES), 256)
    } else {
        0
    };
    Arc::new(Instance {
        ranks: Mutex::new(HashMap::new()),
        complete: OnceLock::new(),
        meeting: Mutex::new(()),
        staging,
        lamport_slot,
        world,
        devices: devices_of(cfg),
        key,
        ce: OnceLock::new(),
        ce_timeout_ms: AtomicU64::new(0),
        ce_watched: AtomicBool::new(false),
    })
}

/// The instance of `cfg` (its slot's, or its own; created empty on first sight, allocating nothing), held by the call's
/// state.
fn instance<B: XlaBackend>(
    state: &ExecState<B>,
    cfg: &CustomCallConfig,
    args: &[ArrayShape],
    rets: &[ArrayShape],
) -> Arc<Instance<B>> {
    // The staging a call needs on every device, worked out only when the instance is made (the sizes allocate).
    let need = || {
        let sizes = |v: &[ArrayShape]| v.iter().map(ArrayShape::byte_size).collect::<Vec<_>>();
        cfg.gpu_staging_bytes(&sizes(args), &sizes(rets))
    };
    let call =
        || GpuCall { inst: on_slot(cfg, need(), state.occurrence), plans: [const { OnceLock::new() }; MAX_RANKS] };
    state.instance.get_or_init(call).inst.clone()
}

/// Allocates and publishes the part of `inst` of `device` (GPU `ordinal`) unless it exists.
fn publish_own<B: XlaBackend>(
    c: &Clique<B>,
    cfg: &CustomCallConfig,
    inst: &Instance<B>,
    device: usize,
    ordinal: usize,
) -> Result<(), HandlerError> {
    if inst.ranks.lock().unwrap_or_else(PoisonError::into_inner).contains_key(&device) {
        return Ok(());
    }
    let dev = c.devices.get(ordinal).ok_or_else(|| {
        err(
            ErrorCode::FailedPrecondition,
            format!("'{}' runs on device {device} (GPU {ordinal}); this process has {} GPUs", cfg.name, c.len()),
        )
    })?;
    let flag = cfg.kind.backend_flag().unwrap_or(thunks::flag::COLLECTIVE_PERMUTE_BACKEND);
    let no_memory = |e: ffi::Error| {
        err(
            ErrorCode::ResourceExhausted,
            format!(
                "{} '{}': cannot allocate {} bytes of staging on GPU {ordinal} ({e}); lower the sizes Peerless \
                 takes (e.g. PEERLESS_FLAGS=--two_shot_max_bytes=...) or leave this collective to XLA \
                 (--{flag}=fallback)",
                cfg.target(),
                cfg.name,
                inst.staging,
            ),
        )
    };
    // `Gpu::alloc`: zeroed memory peers may access while kernels run (plain `cuMemAlloc` on CUDA; fine-grained on HIP).
    // The Lamport regions follow the signals and start as sentinel.
    let signals = B::Buffer::alloc(&dev.ctx, inst.signal_bytes()).map_err(no_memory)?;
    if inst.lamport_slot > 0 {
        let mut init = vec![0u8; lamport_at()];
        init.extend_from_slice(&super::lamport_init(super::lamport_bytes(inst.lamport_slot, inst.world)));
        signals.write_at(0, &init).map_err(internal)?;
    }
    let rank = Rank::<B> {
        staging: B::Buffer::alloc(&dev.ctx, inst.staging).map_err(no_memory)?,
        signals,
        status: B::Buffer::alloc(&dev.ctx, 8).map_err(no_memory)?,
        report: B::HostMapped::new(&dev.ctx, 2).map_err(no_memory)?,
        ordinal,
    };
    let mut ranks = inst.ranks.lock().unwrap_or_else(PoisonError::into_inner);
    if let std::collections::hash_map::Entry::Vacant(v) = ranks.entry(device) {
        if let Some(h) = B::state().held.get(ordinal) {
            h.fetch_add(rank.held(), Ordering::Relaxed);
        }
        v.insert(Arc::new(rank));
    }
    Ok(())
}

/// The devices of the call this process owns: all of them unless the call spans processes.
fn local_members<B: XlaBackend>(cfg: &CustomCallConfig, inst: &Instance<B>, device: usize) -> Vec<usize> {
    if !cfg.spans_processes() {
        return inst.devices.clone();
    }
    let by = cfg.process_of();
    let me = by.get(&device).copied();
    inst.devices.iter().copied().filter(|d| by.get(d).copied() == me).collect()
}

/// Every member's addresses, waiting (up to the call's timeout) for devices that have not published yet; the error
/// names them. `ordinal`: the calling GPU, in whose context other processes' buffers are opened.
fn all_ranks<'a, B: XlaBackend>(
    c: &Clique<B>,
    cfg: &CustomCallConfig,
    inst: &'a Instance<B>,
    device: usize,
    ordinal: usize,
) -> Result<&'a Complete<B>, HandlerError> {
    if let Some(done) = inst.complete.get() {
        return Ok(done);
    }
    let timed_out = |missing: Vec<usize>, how: &str| {
        deadline_error(cfg, format!(": devices {missing:?} never {how} within {} ms", cfg.timeout_ms))
    };
    let local = local_members(cfg, inst, device);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(cfg.timeout_ms);
    let ranks = loop {
        let missing: Vec<usize> = {
            let ranks = inst.ranks.lock().unwrap_or_else(PoisonError::into_inner);
            let missing: Vec<usize> = local.iter().copied().filter(|d| !ranks.contains_key(d)).collect();
            if missing.is_empty() {
                break ranks.clone();
            }
            missing
        };
        if std::time::Instant::now() >= deadline {
            return Err(timed_out(missing, "initialised it"));
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    };
    let own = |r: &Rank<B>| Addr { staging: r.staging.ptr(), signals: r.signals.ptr() };
    let mut addrs: HashMap<usize, Addr> = ranks.iter().map(|(&d, r)| (d, own(r))).collect();
    if !cfg.spans_processes() {
        return Ok(inst.complete.get_or_init(|| Complete { ranks, addrs, _mapped: vec![] }));
    }
    let job = thunks::runtime::job_for(cfg).map_err(|m| err(ErrorCode::FailedPrecondition, m))?;
    // Across processes: one thread of this process meets the others.
    let _meeting = inst.meeting.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(done) = inst.complete.get() {
        return Ok(done);
    }
    // Each device posts its staging's and signals' IPC handles and the staging size.
    const SLOT: usize = 2 * IPC_HANDLE_BYTES + 8;
    let mut posts = Vec::new();
    for &d in &local {
        let r = &ranks[&d];
        let mut b = Vec::with_capacity(SLOT);
        b.extend_from_slice(&r.staging.ipc_handle().map_err(internal)?);
        b.extend_from_slice(&r.signals.ipc_handle().map_err(internal)?);
        b.extend_from_slice(&(inst.staging as u64).to_le_bytes());
        posts.push((d, b));
    }
    let (name, processes) = inst.meeting_place(cfg, &job, "");
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    let all = crate::host::shm::exchange(&name, &inst.devices, processes, &posts, SLOT, left).map_err(|e| {
        match e.missing() {
            Some(m) => timed_out(m.to_vec(), "posted their buffers (their processes never came)"),
            None => err(ErrorCode::FailedPrecondition, format!("{} '{}': {e}", cfg.target(), cfg.name)),
        }
    })?;
    let ctx = &c.devices.get(ordinal).ok_or_else(|| internal(format!("no GPU {ordinal}")))?.ctx;
    let mut mapped = Vec::new();
    for (d, b) in all.iter().filter(|(d, _)| !ranks.contains_key(d)) {
        let size = u64::from_le_bytes(b[2 * IPC_HANDLE_BYTES..].try_into().unwrap_or_default());
        if size != inst.staging as u64 {
            return Err(internal(format!(
                "'{}': device {d} staged {size} bytes where this process stages {}",
                cfg.name, inst.staging
            )));
        }
        let open = |at: usize| {
            let h = b[at..at + IPC_HANDLE_BYTES].try_into().expect("a posted slot holds two handles");
            B::IpcMapping::open(ctx, h).map_err(|e| {
                err(
                    ErrorCode::FailedPrecondition,
                    format!("'{}': cannot map device {d}'s buffers from another process: {e}", cfg.name),
                )
            })
        };
        let (staging, signals) = (open(0)?, open(IPC_HANDLE_BYTES)?);
        addrs.insert(*d, Addr { staging: staging.ptr(), signals: signals.ptr() });
        mapped.push(staging);
        mapped.push(signals);
    }
    Ok(inst.complete.get_or_init(|| Complete { ranks, addrs, _mapped: mapped }))
}

/// What a double-buffered reduction kernel takes besides its buffers: the group's staging (or Lamport regions) and flag
/// bases, the half's (or slot's) size and this device's counters.
#[derive(Clone, Copy)]
struct Symmetric {
    stage: Ptrs,
    flags: Ptrs,
    stride: u64,
    counter: u64,
}

/// Puts `inst` under the watchdog, starting its thread on first use.
fn watch<B: XlaBackend>(inst: std::sync::Weak<Instance<B>>) {
    let state = B::state();
    state.watched.lock().unwrap_or_else(PoisonError::into_inner).push(inst);
    state.watchdog.get_or_init(|| {
        let spawned = std::thread::Builder::new().name(format!("peerless-{}-watchdog", B::NAME)).spawn(watchdog::<B>);
        if let Err(e) = spawned {
            log::error!("peerless: no watchdog for copy-engine collectives ({e}): a missing member will hang them");
        }
    });
}

/// How often the watchdog looks at the copy-engine waits.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(2);

/// Ends the copy-engine waits that outlast their call's timeout. A stream memory wait has no bound of its own, so each
/// wait first writes its code into its member's watch word; a word that keeps one code for the whole timeout while the
/// awaited flag stays 0 is a member that never came. The watchdog records the missing member in the waiting device's
/// report word (the next call on that device returns DEADLINE_EXCEEDED naming it, as a kernel's timeout does) and sets
/// the flag itself: a host store, which ends the wait whichever GPU queue is blocked. That call's data is wrong, and
/// the instance's later calls are not trusted.
fn watchdog<B: XlaBackend>() {
    let state = B::state();
    let mut seen: HashMap<(usize, usize), (u32, std::time::Instant)> = HashMap::new();
    loop {
        let live: Vec<Arc<Instance<B>>> = {
            let mut w = state.watched.lock().unwrap_or_else(PoisonError::into_inner);
            w.retain(|i| i.strong_count() > 0);
            w.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        let now = std::time::Instant::now();
        let mut next = HashMap::new();
        for inst in &live {
            let Some(words) = inst.ce.get().map(|w| &w.mapped) else { continue };
            let timeout = std::time::Duration::from_millis(inst.ce_timeout_ms.load(Ordering::Relaxed));
            let ranks = inst.ranks.lock().unwrap_or_else(PoisonError::into_inner).clone();
            for (&d, rank) in &ranks {
                let Some(p) = inst.devices.iter().position(|&x| x == d) else { continue };
                let at = p * copy_engine::STRIDE;
                let mark = words.load(at + copy_engine::MARK);
                if mark == 0 {
                    continue;
                }
                let key = (Arc::as_ptr(inst) as usize, p);
                let since = match seen.get(&key) {
                    Some(&(m, t)) if m == mark => t,
                    _ => now,
                };
                if now.duration_since(since) < timeout {
                    next.insert(key, (mark, since));
                    continue;
                }
                let word = (mark - 1) as usize;
                if word < copy_engine::MARK && words.load(at + word) == 0 {
                    let member = copy_engine::member_of_word(word);
                    let bits = rank.report.load(0) | (1 << member);
                    rank.report.store(0, bits);
                    log::error!(
                        "peerless: device {d} waited {} ms on the copy engines for member {member} of its call; \
                         ending the wait (the next call reports it)",
                        timeout.as_millis()
                    );
                    words.store(at + word, 1);
                }
                next.insert(key, (mark, now));
            }
        }
        seen = next;
        let idle = live.is_empty();
        drop(live);
        std::thread::sleep(if idle { 25 * WATCH_EVERY } else { WATCH_EVERY });
    }
}

/// The [`CollectiveRuntime`] of vendor `B`'s XLA platform (`B::NAME`: "cuda", "rocm").
pub struct GpuRuntime<B: XlaBackend>(pub(crate) PhantomData<fn() -> B>);

/// A launch's blocks for `bytes` per device and phase.
fn launch_grid(bytes: usize) -> u32 {
    super::grid((bytes as u64).div_ceil(16), DEFAULT_GRID)
}

/// Operand `shape` in `cfg`'s physical order, viewed along the call's dimension: (rows before it, its size, bytes after
/// it).
fn view(cfg: &CustomCallConfig, shape: &ArrayShape) -> Result<(usize, usize, usize), HandlerError> {
    let (phys, dim) = cfg.physical(&shape.dims).map_err(|m| err(ErrorCode::InvalidArgument, m))?;
    let (shape, dim) = (ArrayShape::new(shape.ty, phys), dim.unwrap_or(0));
    let dims: Vec<usize> = shape.dims.iter().map(|&d| usize::try_from(d).unwrap_or(0)).collect();
    if dims.is_empty() {
        return Ok((1, 1, shape.ty.byte_size()));
    }
    let n = *dims
        .get(dim)
        .ok_or_else(|| err(ErrorCode::InvalidArgument, format!("dimension {dim} out of range for {shape}")))?;
    Ok((dims[..dim].iter().product(), n, dims[dim + 1..].iter().product::<usize>() * shape.ty.byte_size()))
}

impl<B: XlaBackend> CollectiveRuntime for GpuRuntime<B> {
    type Instance = GpuCall<B>;

    fn platform(&self) -> &'static str {
        B::NAME
    }

    fn traits(&self) -> Traits {
        COMMAND_BUFFER_COMPATIBLE
    }

    fn executable_state(&self) -> &'static ExecutableState<ExecState<B>> {
        &B::state().exec
    }

    fn adopted(&self) -> &'static Adopted<GpuCall<B>> {
        &B::state().adopted
    }

    fn device_id(&self, ordinal: usize) -> Result<usize, HandlerError> {
        let state = B::state();
        if !state.mapped.load(Ordering::Acquire) {
            return Ok(ordinal);
        }
        match state.device_ids.get(ordinal).map(|id| id.load(Ordering::Acquire)) {
            Some(id) if id != NO_ID => Ok(id),
            _ => {
                let ids: BTreeMap<usize, usize> = (0..MAX_RANKS)
                    .filter_map(|o| Some((o, state.device_ids[o].load(Ordering::Acquire))).filter(|x| x.1 != NO_ID))
                    .collect();
                Err(err(
                    ErrorCode::FailedPrecondition,
                    format!("GPU {ordinal} of this process has no device id in the job's topology ({ids:?})"),
                ))
            }
        }
    }

    fn initialize(&self, f: &CallFrame<'_>, at: &At<'_, GpuCall<B>>) -> Result<(), HandlerError> {
        let At { call: cfg, state, device, ordinal } = *at;
        if cfg.epilogue.is_some() {
            check_epilogue::<B>(cfg)?;
        }
        // Every member's part is known and the plan made here, outside any stream capture: the kernels load (prebuilt,
        // cached, or compiled one unit at a time), and other processes' IPC handles open, neither of which a capturing
        // stream allows.
        let plan = plan::<B>(f, cfg, state, device, ordinal)?;
        if let Some(call) = state.instance.get() {
            // A second device thread of the same ordinal cannot exist: keep the first plan.
            let _ = call.plans.get(ordinal).map(|p| p.set(plan));
        }
        state.mark_initialized(ordinal);
        Ok(())
    }

    fn execute(&self, f: &CallFrame<'_>, at: &At<'_, GpuCall<B>>) -> Result<(), HandlerError> {
        let At { call: cfg, state, device, ordinal } = *at;
        // The plan INITIALIZE made; made now (once) where XLA skipped that stage.
        let plan = match state.instance.get().and_then(|c| c.plans.get(ordinal)).and_then(OnceLock::get) {
            Some(p) => p,
            None => {
                let made = plan::<B>(f, cfg, state, device, ordinal)?;
                let slot = state.instance.get().and_then(|c| c.plans.get(ordinal));
                slot.ok_or_else(|| internal(format!("GPU ordinal {ordinal} beyond {MAX_RANKS}")))?.get_or_init(|| made)
            }
        };
        let c = clique::<B>()?;
        c.devices[ordinal].ctx.bind().map_err(internal)?;
        // SAFETY: XLA hands an FFI handler the stream (CUstream, hipStream_t) of the calling device, alive for the call
        // and for the work enqueued on it.
        let stream = unsafe { B::Stream::foreign(f.stream()?, ordinal) };
        // A previous call's kernel may have given up on a peer: report it now.
        let own = &plan.own;
        let missing = own.report.load(0);
        if missing != 0 {
            // Clear both words: the device one in stream order (later launches would otherwise see the failure and skip
            // their work).
            own.report.store(0, 0);
            // SAFETY: the status word is this rank's 8-byte device allocation, alive with the plan.
            unsafe { stream.memset_u8(own.status.ptr(), 0, 8) }.map_err(internal)?;
            return Err(timed_out_earlier(cfg, device, missing));
        }
        plan.run(|i| f.arg(i).map(|b| b.data as u64), |i| f.ret(i).map(|b| b.data as u64), &stream)
    }
}

/// The error for a call whose previous kernel gave up waiting for the members in `missing` (status bits name group
/// members; permute: bit 0 my target, bit 1 my source).
fn timed_out_earlier(cfg: &CustomCallConfig, device: usize, missing: u32) -> HandlerError {
    let bits = (0..32usize).filter(|i| missing & (1 << i) != 0);
    let members: Vec<usize> = if cfg.kind == Kind::CollectivePermute {
        let target = cfg.pairs.iter().find(|p| p.0 == device).map_or(device, |p| p.1);
        let source = cfg.pairs.iter().find(|p| p.1 == device).map_or(device, |p| p.0);
        // A pair of two devices has one peer as both target and source: name it once.
        let named: BTreeSet<usize> = bits.map(|b| if b == 0 { target } else { source }).collect();
        named.into_iter().collect()
    } else {
        let group = cfg.group_of(device).unwrap_or(&[]);
        bits.filter_map(|b| group.get(b).copied()).collect()
    };
    let ms = cfg.timeout_ms;
    let what = format!(" on device {device}: an earlier call timed out after {ms} ms waiting for devices {members:?}");
    deadline_error(cfg, what)
}

/// A deadline error of call `cfg`: `what` between its name and its groups.
fn deadline_error(cfg: &CustomCallConfig, what: String) -> HandlerError {
    let (name, groups, pairs) = (cfg.name.as_str(), thunks::fmt_groups(&cfg.groups), &cfg.pairs);
    err(ErrorCode::DeadlineExceeded, format!("{} '{name}'{what} (groups {groups}, pairs {pairs:?})", cfg.target()))
}

/// The call's plan on `device` (GPU `ordinal`): its part allocated and published, every member's part known (waiting,
/// bounded, for the others), its kernels resolved.
fn plan<B: XlaBackend>(
    f: &CallFrame<'_>,
    cfg: &CustomCallConfig,
    state: &ExecState<B>,
    device: usize,
    ordinal: usize,
) -> Result<Plan<B>, HandlerError> {
    let c = clique::<B>()?;
    let (args, rets) = (crate::ffi_handler::operands(f, cfg)?, f.rets()?);
    let args = args.iter().map(array_shape).collect::<Result<Vec<_>, _>>()?;
    let rets = rets.iter().map(array_shape).collect::<Result<Vec<_>, _>>()?;
    let inst = instance(state, cfg, &args, &rets);
    publish_own(c, cfg, &inst, device, ordinal)?;
    let done = all_ranks(c, cfg, &inst, device, ordinal)?;
    Plan::new(&Frame { c, cfg, inst: &inst, done, device, ordinal, args: &args, rets: &rets })
}

/// A call run without XLA by members that share this process's GPUs, each member a stream of its own, through the
/// runtime's own instance, plans and steps (the copy-engine operations and kernel launches EXECUTE enqueues): what
/// `peerless bench --members-on-one-gpu` times and the GPU tests prove the forms with. Member `m` is device id `m` and
/// runs on `clique.devices[m]` (several may be the same GPU, [`Clique::on_one_device`]).
pub struct LocalCall<B: XlaBackend> {
    cfg: CustomCallConfig,
    /// The members taking part (device ids, ascending), and their plans in that order.
    devices: Vec<usize>,
    plans: Vec<Plan<B>>,
}

impl<B: XlaBackend> LocalCall<B> {
    /// Makes every member's part and plan for `cfg` (groups or pairs over members `0..clique.len()`), whose every
    /// member has operands `args` and results `rets`.
    pub fn new(
        clique: &'static Clique<B>,
        cfg: CustomCallConfig,
        args: &[ArrayShape],
        rets: &[ArrayShape],
    ) -> Result<Self, HandlerError> {
        let sizes = |v: &[ArrayShape]| v.iter().map(ArrayShape::byte_size).collect::<Vec<_>>();
        let need = round_up(cfg.gpu_staging_bytes(&sizes(args), &sizes(rets)), 512);
        let inst = new_instance::<B>(&cfg, need, cfg.instance);
        let devices = inst.devices.clone();
        if devices.iter().any(|&d| d >= clique.len()) {
            return Err(internal(format!("'{}' names members beyond the clique's {}", cfg.name, clique.len())));
        }
        for &d in &devices {
            publish_own(clique, &cfg, &inst, d, d)?;
        }
        let done = all_ranks(clique, &cfg, &inst, devices[0], devices[0])?;
        let plans = devices
            .iter()
            .map(|&d| Plan::new(&Frame { c: clique, cfg: &cfg, inst: &inst, done, device: d, ordinal: d, args, rets }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LocalCall { cfg, devices, plans })
    }

    /// The members taking part (a permute's may be fewer than the clique's).
    pub fn members(&self) -> &[usize] {
        &self.devices
    }

    /// Kernel launches per call of a member (0: the copy engines move everything).
    pub fn launches(&self) -> usize {
        self.plans.first().map_or(0, Plan::launches)
    }

    /// Enqueues member `m`'s part on `stream` with its buffers' device addresses; an earlier call's timeout on this
    /// member is returned as XLA's handler would (DEADLINE_EXCEEDED).
    pub fn run(&self, m: usize, stream: &B::Stream, args: &[u64], rets: &[u64]) -> Result<(), HandlerError> {
        let at = self.devices.iter().position(|&d| d == m);
        let plan = at.and_then(|i| self.plans.get(i)).ok_or_else(|| internal(format!("{m} is no member")))?;
        let missing = plan.own.report.load(0);
        if missing != 0 {
            plan.own.report.store(0, 0);
            return Err(timed_out_earlier(&self.cfg, m, missing));
        }
        let at = |v: &[u64], i: usize| v.get(i).copied().ok_or_else(|| internal(format!("no buffer {i}")));
        plan.run(|i| at(args, i), |i| at(rets, i), stream)
    }
}

#[cfg(test)]
#[path = "../../tests/unit/gpu_xla.rs"]
mod tests;
