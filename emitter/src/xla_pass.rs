//! The collective emitter as an HLO pass inside XLA's pipeline.
//!
//! XLA hands the pass a serialized `HloModuleProto` after SPMD partitioning (`jax.extend.xla`, stage PRE_SCHEDULER);
//! the pass decides every collective with the emitter's rules ([`crate::decide_tuned`]) and the pass's own on device
//! ids (peer access, processes and hosts, layouts, async forms: all in `decide.rs`), and rewrites each one assigned to
//! a kernel into a typed-FFI `custom-call` to a Peerless target whose attributes are the plain-data
//! [`CustomCallConfig`]. Fallbacks stay XLA's own collectives, untouched. A rewritten module keeps its entry layout
//! (`wire_edit::pin_entry`).
//!
//! The rewrite edits the protobuf wire format in place rather than re-encoding decoded messages: our prost copy of
//! XLA's protos predates fields newer XLA writes (mesh-axes replica groups, original values, ...), and prost drops
//! unknown fields. Every byte of the module except the rewritten instructions passes through verbatim.
//!
//! Invariants: the pass is a pure function of (bytes, config) apart from the per-rewrite `instance` ids (its only
//! shared state besides them is the tuning profiles' cache, behind a mutex in `tuning.rs`), and a module it already
//! rewrote comes back unchanged (its Peerless custom calls are not collectives, and its fallbacks are decided the same
//! way again). It never fails a compile: the C entry point turns every error into "unchanged" with the reason logged.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use hlo::proto::{Message, xla};
use hlo::wire::{
    Field, Index, WireError, WireType, fields, first_int, hlo_computation as computation,
    hlo_instruction as instruction, hlo_module, ints, payload, put_bytes, put_ints, put_varint,
};
use hlo::{CompId, InstrId, Module, Opcode};
use thunks::CollectiveKind;
use thunks::custom_call::CustomCallConfig;

use crate::decide::{Capabilities, Run, decide_in_run};
use crate::flags::Flags;
use crate::peers::PeerAccessTable;
use crate::tuning::TuningConfig;

mod fuse;
mod staging;
#[cfg(test)]
#[path = "../tests/unit/xla_pass.rs"]
mod tests;
mod wire_edit;

use staging::*;
pub use wire_edit::has_collectives;
use wire_edit::*;

/// `xla.CustomCallApiVersion.API_VERSION_TYPED_FFI`.
const API_VERSION_TYPED_FFI: i64 = 4;

/// HloModuleProto: the fields the slim module keeps besides its computations (name, entry name, id, entry id,
/// is_dynamic, device assignment, auto-SPMD flag, frontend attributes); the rest (schedule, aliasing, shardings, stack
/// frames, ...) name instructions the slim module drops.
const MODULE_KEPT: [u32; 8] = [
    hlo_module::NAME,
    hlo_module::ENTRY_COMPUTATION_NAME,
    hlo_module::ID,
    hlo_module::ENTRY_COMPUTATION_ID,
    hlo_module::IS_DYNAMIC,
    hlo_module::DEVICE_ASSIGNMENT,
    hlo_module::USE_AUTO_SPMD_PARTITIONING,
    hlo_module::FRONTEND_ATTRIBUTES,
];

/// Fields of a collective that mean nothing on a custom call (groups, reducer, channel); they are dropped, and opcode,
/// target, backend_config and api version are written anew.
const DROPPED: [u32; 14] = [
    instruction::OPCODE,
    instruction::DIMENSIONS,
    instruction::CHANNEL_ID,
    instruction::CUSTOM_CALL_TARGET,
    instruction::CALLED_COMPUTATION_IDS,
    instruction::BACKEND_CONFIG,
    instruction::REPLICA_GROUPS,
    instruction::SOURCE_TARGET_PAIRS,
    instruction::CONSTRAIN_LAYOUT,
    instruction::USE_GLOBAL_DEVICE_IDS,
    instruction::CUSTOM_CALL_API_VERSION,
    instruction::COLLECTIVE_DEVICE_LIST,
    instruction::IOTA_DEVICE_LIST,
    instruction::MESH_AXES_LIST,
];

/// Whether the pass looks at an instruction of `opcode` (and the quick scan looks for it): a collective or its start.
fn is_collective(opcode: &str) -> bool {
    Opcode::from_name(opcode).and_then(thunks::CollectiveOp::from_opcode).is_some()
}

/// One array's layout as the pass compares them: `minor_to_major`, or `None` for the default (row-major) layout. Tiled
/// layouts are an error.
pub(crate) type LeafLayout = Option<Vec<i64>>;
/// An instruction's leaf layouts, by its id in the decoded module (the IR keeps no tiles).
pub(crate) type Layouts<'a> = dyn Fn(InstrId) -> Vec<Result<LeafLayout, String>> + 'a;

/// The leaf layouts of a serialized shape (a tuple's, recursively), appended to `out`.
fn leaf_layouts(shape: &[u8], out: &mut Vec<Result<LeafLayout, String>>) -> Result<(), WireError> {
    use hlo::wire::{layout, shape::*};
    let (mut tuple, mut rank, mut laid) = (false, 0, None);
    for x in fields(shape)? {
        match x.number {
            TUPLE_SHAPES => (tuple, _) = (true, leaf_layouts(x.payload, out)?),
            DIMENSIONS => rank += ints(&x)?.len() as i64,
            LAYOUT => laid = Some(fields(x.payload)?),
            _ => {}
        }
    }
    let mut m2m = Vec::new();
    for x in laid.iter().flatten().filter(|x| x.number == layout::MINOR_TO_MAJOR) {
        m2m.extend(ints(x)?);
    }
    out.extend((!tuple).then(|| match m2m {
        _ if laid.iter().flatten().any(|x| x.number == layout::TILES) => Err("a tiled layout".to_owned()),
        m if m.is_empty() || m.iter().copied().eq((0..rank).rev()) => Ok(None),
        m => Ok(Some(m)),
    }));
    Ok(())
}

/// How a collective the pass takes becomes a custom call (the handlers see one synchronous collective in every form:
/// operands in, result out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// A synchronous collective: the instruction becomes the call.
    Sync,
    /// `all-reduce-start` (result: the reduced array): the start becomes the call and its `all-reduce-done` a `copy` of
    /// it (XLA's simplifier removes the copy where it compiles the module from the start; users read the done as
    /// before).
    AsyncInPlace,
    /// `all-gather-start` / `collective-permute-start` (result: the tuple `(operand, result)`): a new call, inserted
    /// just before the start, computes the result; the start becomes `tuple(operand, call)`, so any user of the start
    /// (its `-done`, a `get-tuple-element` of either element) reads what it read before, and the `-done` becomes
    /// `get-tuple-element(start), index=1`.
    AsyncTuple,
    /// A synchronous collective inside an `async-start`'s computation (JAX's explicit async API): the instruction
    /// becomes the call, never on an operation queue (XLA's async wrapper already runs it beside compute; a queue would
    /// wrap it again), limited to `async_blocks` as a call beside compute is.
    InAsync,
}

/// A collective the pass takes: its decision (an index into the run's decisions), its instruction, and the custom call
/// it becomes (target, attributes, form).
struct Call {
    at: usize,
    /// In the decoded module, and in the index.
    id: InstrId,
    ix: InstrId,
    target: &'static str,
    config: CustomCallConfig,
    form: Form,
}

/// What [`decide_in_run`] makes of a collective it takes (its place comes from the run).
pub(crate) struct Rewrite {
    pub target: &'static str,
    pub call: CustomCallConfig,
    pub form: Form,
}

/// The `operation_queue_id` of calls run asynchronously (`--overlap_above_bytes`): XLA:GPU wraps them in `async-start`
/// on thread "parallel", which its scheduler overlaps with compute, and runs them on that queue's stream
/// (docs/OVERLAP.md).
pub const ASYNC_QUEUE: u64 = 1;

/// The operation queue `call` runs on: [`ASYNC_QUEUE`] for a call beside compute (the only calls the pass limits to
/// `async_blocks`), else 0, the compute stream.
fn queue_of(call: &CustomCallConfig) -> u64 {
    if call.blocks > 0 { ASYNC_QUEUE } else { 0 }
}

/// Where the pass learns peer access between device ids: a plain table where the runtime knows one without opening a
/// GPU (its own, or the probe it kept for these GPUs), else a probe. Probing opens the GPUs (seconds; minutes on a cold
/// kernel cache), so a table that must be probed is asked for only when a collective has passed every rule that needs
/// no GPU: a module whose collectives all fall back for other reasons (groups of one, the dtype guard, sizes, hosts)
/// opens none.
#[derive(Clone, Default)]
pub enum Peers {
    /// Every device reaches every other (the CPU platform: one address space).
    #[default]
    Shared,
    /// The table, known before the run.
    Known(std::sync::Arc<PeerAccessTable>),
    /// A table made on first need, at most once per run of the pass.
    Lazy(std::sync::Arc<dyn Fn() -> std::sync::Arc<PeerAccessTable> + Send + Sync>),
}

impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peers::Shared => f.write_str("Shared"),
            Peers::Known(t) => write!(f, "Known({})", t.source()),
            Peers::Lazy(_) => f.write_str("Lazy"),
        }
    }
}

/// The share of free device memory one module's staging may take (1/4): XLA's allocator and the model need the rest,
/// and a compile may precede others that allocate.
pub const STAGING_SHARE_OF_FREE: u64 = 4;

/// One run's view of [`Peers`]: the table, made when first asked for.
pub(crate) struct PeerLookup<'a> {
    source: &'a Peers,
    num_devices: usize,
    /// `--host_topology`: the links of [`Peers::Shared`] (every pair by default).
    host_topology: &'a crate::flags::HostTopology,
    table: std::cell::OnceCell<std::sync::Arc<PeerAccessTable>>,
}

impl PeerLookup<'_> {
    pub(crate) fn get(&self) -> &PeerAccessTable {
        self.table.get_or_init(|| match self.source {
            Peers::Shared => PeerAccessTable::for_host_topology(self.num_devices, self.host_topology),
            Peers::Known(t) => std::sync::Arc::clone(t),
            Peers::Lazy(make) => make(),
        })
    }
}

/// What the pass needs to know about the process it runs in.
#[derive(Clone, Debug)]
pub struct PassConfig {
    pub flags: Flags,
    /// Peer access between device ids.
    pub peers: Peers,
    /// Device ids this process owns; `None`: all of them. Without a `topology`, a group with another device falls back
    /// (its collective needs XLA's cross-process path).
    pub local_devices: Option<BTreeSet<usize>>,
    /// The job's processes and hosts (`jax.distributed`); `None`: one process.
    pub topology: Option<Topology>,
    /// What the handlers of this platform can run.
    pub caps: Capabilities,
    /// The first `instance` id of this run, the next rewrite getting the next id (tests want stable output); `None`:
    /// ids from a per-process random base ([`next_instance`]).
    pub instance_base: Option<u64>,
    /// Free device memory the staging budget is taken from ([`fit_staging`]: the least among the process's GPUs, in
    /// bytes, as the runtime read it before the run); `None` (the CPU platform, or unknown): unbounded.
    pub device_memory: Option<u64>,
    /// Where the tuning profile comes from ([`crate::tuning`]); off by default.
    pub tuning: TuningConfig,
}

impl Default for PassConfig {
    fn default() -> Self {
        PassConfig {
            flags: Flags::default(),
            peers: Peers::Shared,
            local_devices: None,
            topology: None,
            caps: Capabilities { variadic: true, fused_norm: true, fused_norm_auto: true, ..Capabilities::default() },
            instance_base: None,
            device_memory: None,
            tuning: TuningConfig::default(),
        }
    }
}

/// Which process owns each device of a job and which processes share a host. "Host" means a shared-memory domain:
/// processes that can open each other's POSIX shared memory (the Python package checks it, rather than trusting host
/// names: containers on one machine may not share /dev/shm). Every process of a job holds the same topology, so every
/// process decides every collective the same way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// Device id → process index, for every device of the job.
    pub process_of: BTreeMap<usize, usize>,
    /// Process index → host index.
    pub host_of: BTreeMap<usize, usize>,
    /// The job's token (hex, from the job's key-value store): names the shared segments of groups across processes, so
    /// another job cannot meet them. `None`: such groups fall back. The handlers take it from the running process
    /// ([`thunks::runtime::set_job`]); the pass only needs to know there is one, and writes it into no module.
    pub job: Option<String>,
    /// The process the pass runs in (its devices are the local ones); decisions never depend on it.
    pub this_process: Option<usize>,
    /// This process's devices: device id → the platform's local ordinal (a GPU's CUDA ordinal), for the handlers, which
    /// XLA calls with the ordinal. Empty: not given.
    pub ordinals: BTreeMap<usize, usize>,
}

impl Topology {
    /// Parses `this=PROC;job=HEX;devices=ID:PROC,...;hosts=PROC:HOST,...[;ordinals=ID:ORD,...]` (the Python package's
    /// spelling; `job` may be empty).
    pub fn parse(s: &str) -> Result<Topology, String> {
        let mut t = Topology::default();
        let pairs = |v: &str, what: &str| -> Result<Vec<(usize, usize)>, String> {
            v.split(',')
                .filter(|x| !x.trim().is_empty())
                .map(|x| {
                    let (a, b) = x.split_once(':').ok_or_else(|| format!("{what} entry '{x}' is not A:B"))?;
                    let n = |y: &str| y.trim().parse::<usize>().map_err(|_| format!("{what} entry '{x}': '{y}'"));
                    Ok((n(a)?, n(b)?))
                })
                .collect()
        };
        for part in s.split(';').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("topology part '{part}' is not KEY=VALUE"))?;
            match k.trim() {
                "job" if v.is_empty() => t.job = None,
                "job" if thunks::runtime::valid_job(v) => t.job = Some(v.to_owned()),
                "job" => return Err(format!("job token '{v}' is not 8 to 64 hex digits")),
                "this" => t.this_process = Some(v.trim().parse().map_err(|_| format!("process index '{v}'"))?),
                "devices" => t.process_of = pairs(v, "devices")?.into_iter().collect(),
                "hosts" => t.host_of = pairs(v, "hosts")?.into_iter().collect(),
                "ordinals" => t.ordinals = pairs(v, "ordinals")?.into_iter().collect(),
                other => return Err(format!("unknown topology key '{other}'")),
            }
        }
        if let Some(p) = t.process_of.values().find(|p| !t.host_of.contains_key(p)) {
            return Err(format!("process {p} has devices but no host"));
        }
        Ok(t)
    }

    /// The devices of `this_process`.
    pub fn local_devices(&self) -> Option<BTreeSet<usize>> {
        let me = self.this_process?;
        Some(self.process_of.iter().filter(|&(_, &p)| p == me).map(|(&d, _)| d).collect())
    }

    /// Why `talking` (groups of device ids that exchange data) cannot run on Peerless's kernels, or whether it crosses
    /// processes (`Ok(true)`).
    pub(crate) fn check(&self, talking: &[Vec<usize>], cross_process: bool) -> Result<bool, String> {
        let mut crosses = false;
        for g in talking {
            let mut procs = BTreeSet::new();
            for d in g {
                procs.insert(*self.process_of.get(d).ok_or_else(|| format!("device {d} is in no process of the job"))?);
            }
            if procs.len() < 2 {
                continue;
            }
            let hosts: BTreeSet<usize> = procs.iter().filter_map(|p| self.host_of.get(p).copied()).collect();
            if hosts.len() > 1 {
                return Err(format!(
                    "group {} spans hosts {hosts:?} (processes {procs:?}): XLA's collective runs between hosts",
                    thunks::fmt_groups(std::slice::from_ref(g))
                ));
            }
            crosses = true;
        }
        if crosses && !cross_process {
            return Err(
                "devices of several processes on one host: this platform's handlers do not reach across processes yet"
                    .into(),
            );
        }
        if crosses && self.job.is_none() {
            return Err("devices of several processes, and no job token to name shared memory with".into());
        }
        Ok(crosses)
    }
}

/// A collective id every process derives alike, in every run: the module (its bytes but its per-process `id`) and the
/// instruction. Nothing of the run: a module kept in a persistent compilation cache serves later jobs, whose handlers
/// tell them apart by their job's token and tell two executables of one module apart by the order they are instantiated
/// in ([`thunks::runtime::shared_key`]).
pub fn shared_instance(fingerprint: u64, instr: &str) -> u64 {
    thunks::runtime::stable_hash((fingerprint, instr))
}

/// The module's fingerprint for [`shared_instance`]: every top-level field but `id`.
pub fn fingerprint(module: &[u8]) -> Result<u64, PassError> {
    Ok(fingerprint_of(&fields(module)?))
}

/// [`fingerprint`] of a module's top-level fields.
fn fingerprint_of(top: &[Field<'_>]) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    for f in top.iter().filter(|f| f.number != hlo_module::ID) {
        h.write(f.raw);
    }
    h.finish()
}

/// One collective the pass looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassDecision {
    pub instr: String,
    /// HLO opcode (`all-reduce`, ...).
    pub op: String,
    /// Operand element types, comma-separated.
    pub dtype: String,
    /// Operand bytes per device.
    pub bytes: usize,
    /// Groups as device ids, XLA's `{{0,1},{2,3}}` spelling (pairs for permute).
    pub groups: String,
    /// `kernel (one-shot all-reduce)` or `fallback`.
    pub implementation: String,
    pub kernel: bool,
    pub reason: String,
}

impl PassDecision {
    /// Sends a kernel decision back to XLA: `why`, then the reason it had.
    fn back_to_xla(&mut self, why: &str) {
        (self.kernel, self.implementation) = (false, "fallback".into());
        self.reason = format!("{why} (was: {})", self.reason);
    }

    /// The decision as one report line: op, instruction, dtypes, bytes, groups, kernel (1/0), implementation, reason,
    /// tab-separated (tabs and newlines inside fields become spaces). The Python package counts these (`stats()`);
    /// every Peerless custom call carries its own ([`CustomCallConfig::decisions`]).
    pub fn report_line(&self) -> String {
        let clean = |s: &str| s.replace(['\t', '\n'], " ");
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            clean(&self.op),
            clean(&self.instr),
            clean(&self.dtype),
            self.bytes,
            clean(&self.groups),
            u8::from(self.kernel),
            clean(&self.implementation),
            clean(&self.reason)
        )
    }
}

impl fmt::Display for PassDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} {} B groups={} -> {}: {}",
            self.op, self.instr, self.dtype, self.bytes, self.groups, self.implementation, self.reason
        )
    }
}

/// The pass's answer.
#[derive(Clone, Debug, Default)]
pub struct PassOutcome {
    /// The rewritten module, `None` when nothing changed.
    pub module: Option<Vec<u8>>,
    pub decisions: Vec<PassDecision>,
    /// The `instance` of every custom call written.
    pub instances: Vec<u64>,
}

/// Why the pass left a module alone. The module is then returned unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PassError {
    #[error("malformed HloModuleProto: {0}")]
    Wire(String),
    #[error("cannot decode the module: {0}")]
    Decode(String),
    #[error("device assignment: {0}")]
    Assignment(String),
}

impl From<WireError> for PassError {
    fn from(e: WireError) -> Self {
        PassError::Wire(e.to_string())
    }
}

/// Instance ids: a per-process random base plus a counter, so two compiles (or two processes sharing a persistent
/// compilation cache) never give two collectives the same handler state.
pub fn next_instance() -> u64 {
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        h.finish() & 0x7fff_ffff_0000_0000
    });
    base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) & (i64::MAX as u64)
}

// ----------------------------------------------------------------------------- the pass

/// Logical id (`replica * partitions + partition`) → device id.
pub(crate) struct Assignment {
    pub replicas: usize,
    pub partitions: usize,
    pub devices: Vec<usize>,
}

impl Assignment {
    fn of(index: &Index<'_>) -> Result<Self, PassError> {
        let mut da: Option<xla::DeviceAssignmentProto> = None;
        for f in index.top.iter().filter(|f| f.number == hlo_module::DEVICE_ASSIGNMENT) {
            // Merged, as a decode of the module would.
            da.get_or_insert_default().merge(f.payload).map_err(|e| PassError::Decode(e.to_string()))?;
        }
        let Some(da) = da else {
            return Err(PassError::Assignment("the module carries no device assignment".into()));
        };
        let (r, c) = (da.replica_count, da.computation_count);
        if r < 1 || c < 1 || da.computation_devices.len() != c as usize {
            return Err(PassError::Assignment(format!(
                "{r} replicas × {c} computations with {} computation device lists",
                da.computation_devices.len()
            )));
        }
        let (replicas, partitions) = (r as usize, c as usize);
        let mut devices = vec![0; replicas * partitions];
        for (p, comp) in da.computation_devices.iter().enumerate() {
            if comp.replica_device_ids.len() != replicas {
                return Err(PassError::Assignment(format!(
                    "computation {p} lists {} devices for {replicas} replicas",
                    comp.replica_device_ids.len()
                )));
            }
            for (rep, &d) in comp.replica_device_ids.iter().enumerate() {
                devices[rep * partitions + p] =
                    usize::try_from(d).map_err(|_| PassError::Assignment(format!("negative device id {d}")))?;
            }
        }
        Ok(Assignment { replicas, partitions, devices })
    }

    pub(crate) fn device(&self, logical: usize) -> usize {
        self.devices.get(logical).copied().unwrap_or(logical)
    }
}

/// Runs the pass over a serialized module.
pub fn run(bytes: &[u8], cfg: &PassConfig) -> Result<PassOutcome, PassError> {
    // One walk of the bytes (the index) serves every read and edit of the module, and it is decoded once: whole where a
    // call may fuse (the matcher reads what follows an all-reduce), else its slim copy (`slim`: the whole pass on a 3.8 MB
    // train step takes 56 ms instead of 171 ms, docs/PERFORMANCE.md).
    let index = Index::new(bytes)?;
    if !any_collective(&index) {
        return Ok(PassOutcome::default());
    }
    let fusing = cfg.caps.fused_norm && cfg.flags.fuse_norm.unwrap_or(cfg.caps.fused_norm_auto);
    // Each decoded instruction's id in the index (the whole module's are the same).
    let (module, at) = if fusing {
        (hlo::proto::decode("module", bytes), index.instrs.keys().collect())
    } else {
        let (slimmed, at) = slim(&index);
        (hlo::proto::decode("module", &slimmed), at)
    };
    let module = module.map_err(|e| PassError::Decode(e.to_string()))?;
    let ix = |id: InstrId| at[id.as_u32() as usize];
    let assignment = Assignment::of(&index)?;
    let layouts = |id: InstrId| {
        let mut out = Vec::new();
        if let Err(e) = leaf_layouts(index.instrs[ix(id)].shape, &mut out) {
            out.push(Err(format!("an unreadable shape ({e})")));
        }
        out
    };
    let n = assignment.devices.iter().copied().max().map_or(1, |m| m + 1);
    let peers = PeerLookup {
        source: &cfg.peers,
        num_devices: n,
        host_topology: &cfg.flags.host_topology,
        table: std::cell::OnceCell::new(),
    };
    // The rules see logical ids; peer access is checked on device ids (rule 13).
    let logical = PeerAccessTable::full(assignment.devices.len(), "checked on device ids");
    let tuning = cfg.tuning.resolve(assignment.devices.len());
    let run = Run {
        module: &module,
        assignment: &assignment,
        cfg,
        tuning: &tuning,
        logical: &logical,
        peers: &peers,
        layouts: &layouts,
    };
    let mut decisions = Vec::new();
    // Collectives across processes get ids every process derives alike (the module's fingerprint, computed once, and
    // only if the module has such a collective).
    let crossing = cfg.topology.as_ref().is_some_and(|t| t.job.is_some());
    let fingerprint = std::cell::OnceCell::new();
    // The collectives the pass takes, in the module's order; every collective's index id.
    let mut calls: Vec<Call> = Vec::new();
    let mut collectives = Vec::new();
    for id in module.collectives() {
        let instance = cfg.instance_base.map(|b| b.wrapping_add(calls.len() as u64) & (i64::MAX as u64));
        let shared_id = |instr: &str| {
            crossing.then(|| shared_instance(*fingerprint.get_or_init(|| fingerprint_of(&index.top)), instr))
        };
        let in_async = index.comps[index.instrs[ix(id)].parent].wrapped;
        let (decision, rewrite) = decide_in_run(&run, id, instance, shared_id, in_async);
        if let Some(Rewrite { target, call, form }) = rewrite {
            calls.push(Call { at: decisions.len(), id, ix: ix(id), target, config: call, form });
        }
        log::info!("peerless pass: {decision}");
        decisions.push(decision);
        collectives.push(ix(id));
    }
    // The module's dependencies, where needed: on XLA:CPU (`in_order` false) those of every collective (calls are
    // ordered with what else blocks, and chained below where their data do not already order them); else only the
    // calls', for shared staging (only worth it with two calls).
    let ordering = !cfg.caps.in_order && decisions.len() > 1;
    let deps = (ordering || calls.len() > 1).then(|| {
        let wanted: Vec<InstrId> = if ordering { collectives } else { calls.iter().map(|c| c.ix).collect() };
        dependencies(&index, &wanted)
    });
    if let Some(deps) = deps.as_ref().filter(|_| ordering) {
        keep_ordered(deps, &index, &mut calls, &mut decisions);
    }
    // (Calls only go back to XLA above: with two, the dependencies were read.)
    if let Some(deps) = deps.as_ref().filter(|_| calls.len() > 1) {
        assign_slots(&module, deps, &mut calls);
    } else if let Some(c) = calls.first_mut() {
        // One call: a slot of its own (so a later load of the module may still share nothing).
        c.config.slot = Some(c.config.instance);
        c.config.slot_bytes = staged_bytes(&module, c.id);
        c.config.slot_gpu_bytes = gpu_staged_bytes(&module, c.id, &c.config);
    }
    if !calls.is_empty() {
        fit_staging(&module, cfg.device_memory, &mut calls, &mut decisions);
    }
    // The whole module is decoded where it fuses: its ids are the index's.
    let fused = if fusing { fuse_epilogues(&module, &mut calls, &mut decisions) } else { HashMap::new() };
    // Every call carries its decision, and the module's first call the collectives left to XLA: an executable loaded
    // from a cache reports them when XLA instantiates its calls.
    let fallbacks: String = decisions.iter().filter(|d| !d.kernel).map(PassDecision::report_line).collect();
    let mut rewrites = HashMap::new();
    let mut instances = Vec::with_capacity(calls.len());
    for (k, Call { at, ix, target, mut config, form, .. }) in calls.into_iter().enumerate() {
        config.decisions = decisions[at].report_line();
        if k == 0 {
            config.decisions.push_str(&fallbacks);
        }
        instances.push(config.instance);
        rewrites.insert(ix, (target, config, form));
    }
    // A call needs an ordering operand unless the previous call of its computation is already one of its
    // data-dependency ancestors (no extra operand keeps a result alive longer).
    let unordered = |prev: InstrId, next: InstrId| deps.as_ref().is_none_or(|d| !d.precedes(prev, next));
    let chain: Option<&dyn Fn(InstrId, InstrId) -> bool> = (!cfg.caps.in_order).then_some(&unordered);
    // A changed module keeps its entry layout (`pin_entry`).
    let module = match rewrites.is_empty() {
        true => None,
        false => Some(rewrite(&index, &rewrites, chain, &fused)?),
    };
    Ok(PassOutcome { module, decisions, instances })
}

/// Fuses the residual add and RMSNorm after each sum all-reduce call that has them ([`fuse::match_rmsnorm`]) in
/// `module` (the whole module: the pass decodes it whole where it may fuse): the call gets the epilogue, its decision
/// says so. Returns the matches by all-reduce.
fn fuse_epilogues(
    module: &Module,
    calls: &mut [Call],
    decisions: &mut [PassDecision],
) -> HashMap<InstrId, fuse::Fused> {
    let mut out = HashMap::new();
    for call in calls.iter_mut() {
        let (ins, c) = (module.instr(call.id), &call.config);
        let candidate = ins.opcode == Opcode::AllReduce
            && c.kind == CollectiveKind::AllReduce
            && c.reduction == Some(hlo::analysis::ReductionKind::Sum)
            && ins.operands.len() == 1
            && call.form == Form::Sync
            // The fused kernel is latency-bound: it stays on the compute stream.
            && queue_of(c) == 0
            && c.layout.is_none()
            && ins.shape.as_array().is_some_and(|s| {
                matches!(s.ty, hlo::PrimitiveType::Bf16 | hlo::PrimitiveType::F16 | hlo::PrimitiveType::F32)
                    && !s.dims.is_empty()
            });
        if !candidate {
            continue;
        }
        let Some(f) = fuse::match_rmsnorm(module, ins.parent, call.id) else { continue };
        let d = &mut decisions[call.at];
        d.reason = format!("{}; {}", d.reason, f.describe(module));
        d.implementation = format!("{} + rmsnorm", d.implementation);
        call.config.epilogue = Some(f.epilogue.clone());
        out.insert(call.id, f);
    }
    out
}
