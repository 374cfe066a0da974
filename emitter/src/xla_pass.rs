//! The collective emitter as an HLO pass inside XLA's pipeline.
//!
//! XLA hands the pass a serialized `HloModuleProto` after SPMD partitioning
//! (`jax.extend.xla`, stage PRE_SCHEDULER); the pass decides every collective with the
//! same rules as the standalone emitter ([`crate::decide_with`]) and rewrites each one
//! assigned to a kernel into a typed-FFI `custom-call` to a Peerless target whose
//! attributes are the plain-data [`CustomCallConfig`]. Fallbacks stay XLA's own
//! collectives, untouched.
//!
//! The rewrite edits the protobuf wire format in place rather than re-encoding decoded
//! messages: our prost copy of XLA's protos predates fields newer XLA writes (mesh-axes
//! replica groups, original values, ...), and prost drops unknown fields. Every byte of
//! the module except the rewritten instructions passes through verbatim.
//!
//! Invariants: the pass is a pure function of (bytes, config) apart from the
//! per-rewrite `instance` ids, holds no locks, and a module it already rewrote comes back
//! unchanged (its Peerless custom calls are not collectives, and its fallbacks are decided
//! the same way again). It never fails a compile: the C entry point turns every error into
//! "unchanged" with the reason logged.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use hlo::wire::{
    Field, WireError, WireType, fields, hlo_computation as computation, hlo_instruction as instruction, hlo_module,
    ints, put_bytes, put_ints, put_varint,
};
use hlo::{InstrId, Module, Opcode};
use prost::Message;
use thunks::custom_call::{CustomCallConfig, target_name};
use thunks::{CollectiveKind, Implementation};

use crate::decide::{Capabilities, decide_tuned};
use crate::flags::Flags;
use crate::peers::PeerAccessTable;
use crate::tuning::{Tuning, TuningConfig};

/// `xla.CustomCallApiVersion.API_VERSION_TYPED_FFI`.
const API_VERSION_TYPED_FFI: i64 = 4;

/// HloModuleProto: the fields the slim module keeps besides its computations (name, entry
/// name, id, entry id, is_dynamic, device assignment, auto-SPMD flag, frontend attributes);
/// the rest (schedule, aliasing, shardings, stack frames, ...) name instructions the slim
/// module drops.
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

/// Fields of a collective that mean nothing on a custom call (groups, reducer, channel);
/// they are dropped, and opcode, target, backend_config and api version are written anew.
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

/// Opcodes the pass looks at (and the quick scan looks for).
const COLLECTIVE_OPCODES: [&str; 10] = [
    "all-reduce",
    "all-gather",
    "all-to-all",
    "reduce-scatter",
    "collective-permute",
    "all-reduce-start",
    "all-gather-start",
    "collective-permute-start",
    "ragged-all-to-all",
    "collective-broadcast",
];

/// `xla.DeviceAssignmentProto` (HloModuleProto field 15): logical (replica, computation)
/// to device id. Decoded on its own so the pass needs no other proto types.
#[derive(Clone, PartialEq, prost::Message)]
struct ModuleHeader {
    #[prost(message, optional, tag = "15")]
    device_assignment: Option<DeviceAssignment>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct DeviceAssignment {
    #[prost(int32, tag = "1")]
    replica_count: i32,
    #[prost(int32, tag = "2")]
    computation_count: i32,
    #[prost(message, repeated, tag = "3")]
    computation_devices: Vec<ComputationDevices>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ComputationDevices {
    #[prost(int64, repeated, tag = "1")]
    replica_device_ids: Vec<i64>,
}

/// Just the layouts of every instruction's shape (the IR keeps no layouts): on CPU the
/// pass runs after layout assignment, so a collective's buffers may be column-major.
mod layouts {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Module {
        #[prost(message, repeated, tag = "3")]
        pub computations: Vec<Computation>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Computation {
        #[prost(message, repeated, tag = "2")]
        pub instructions: Vec<Instruction>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Instruction {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "3")]
        pub shape: Option<Shape>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Shape {
        #[prost(int64, repeated, tag = "3")]
        pub dimensions: Vec<i64>,
        #[prost(message, repeated, tag = "4")]
        pub tuple_shapes: Vec<Shape>,
        #[prost(message, optional, tag = "5")]
        pub layout: Option<Layout>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Layout {
        #[prost(int64, repeated, tag = "1")]
        pub minor_to_major: Vec<i64>,
        #[prost(message, repeated, tag = "6")]
        pub tiles: Vec<Tile>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Tile {
        #[prost(int64, repeated, tag = "1")]
        pub dimensions: Vec<i64>,
    }
}

/// One array's layout as the pass compares them: `minor_to_major`, or `None` for the
/// default (row-major) layout. Tiled layouts are an error.
type LeafLayout = Option<Vec<i64>>;

fn leaf_layouts(shape: &layouts::Shape, out: &mut Vec<Result<LeafLayout, String>>) {
    if !shape.tuple_shapes.is_empty() {
        for s in &shape.tuple_shapes {
            leaf_layouts(s, out);
        }
        return;
    }
    let rank = shape.dimensions.len() as i64;
    let default: Vec<i64> = (0..rank).rev().collect();
    out.push(match &shape.layout {
        None => Ok(None),
        Some(l) if !l.tiles.is_empty() => Err("a tiled layout".to_owned()),
        Some(l) if l.minor_to_major.is_empty() || l.minor_to_major == default => Ok(None),
        Some(l) => Ok(Some(l.minor_to_major.clone())),
    });
}

/// Every instruction's leaf layouts, by name.
fn layout_map(bytes: &[u8]) -> Result<HashMap<String, Vec<Result<LeafLayout, String>>>, PassError> {
    let m = layouts::Module::decode(bytes).map_err(|e| PassError::Wire(e.to_string()))?;
    let mut out = HashMap::new();
    for c in m.computations {
        for i in c.instructions {
            let mut leaves = Vec::new();
            if let Some(s) = &i.shape {
                leaf_layouts(s, &mut leaves);
            }
            out.insert(i.name, leaves);
        }
    }
    Ok(out)
}

/// The layout a collective's handler works in, or why it cannot run. Collectives move bytes
/// in the buffers' physical order. Elementwise ones (all-reduce, tuple all-to-all, permute)
/// need each operand to share its result's layout, and then need no attribute; the others
/// need one layout for operand and result, passed to the handler (`layout` attribute) when it
/// is not the default.
fn common_layout(
    module: &Module,
    id: InstrId,
    layouts: &HashMap<String, Vec<Result<LeafLayout, String>>>,
    elementwise: bool,
    async_tuple: bool,
) -> Result<LeafLayout, String> {
    let ins = module.instr(id);
    let show = |x: &LeafLayout| x.as_ref().map_or("row-major".to_owned(), |v| format!("{v:?}"));
    if elementwise {
        // A start's `(operand, result)`: the call computes the result only.
        let results: Vec<_> =
            layouts.get(&ins.name).cloned().unwrap_or_default().into_iter().skip(usize::from(async_tuple)).collect();
        let mut operands = Vec::new();
        for o in ins.operands.iter().filter_map(|&o| module.instrs.get(o)) {
            operands.extend(layouts.get(&o.name).cloned().unwrap_or_default());
        }
        for (i, (a, r)) in operands.iter().zip(&results).enumerate() {
            let a = a.clone().map_err(|e| format!("operand {i} has {e}"))?;
            let r = r.clone().map_err(|e| format!("result {i} has {e}"))?;
            if a != r {
                return Err(format!("operand {i} and result {i} layouts differ ({} vs {})", show(&a), show(&r)));
            }
        }
        return Ok(None);
    }
    let mut names: Vec<&str> =
        ins.operands.iter().filter_map(|&o| module.instrs.get(o)).map(|o| o.name.as_str()).collect();
    names.push(&ins.name);
    let mut seen: Option<LeafLayout> = None;
    for name in names {
        for l in layouts.get(name).into_iter().flatten() {
            let l = l.clone().map_err(|e| format!("'{name}' has {e}"))?;
            match &seen {
                None => seen = Some(l),
                Some(s) if *s == l => {}
                Some(s) => {
                    return Err(format!("operand and result layouts differ ({} vs {})", show(s), show(&l)));
                }
            }
        }
    }
    Ok(seen.flatten())
}

/// How a collective the pass takes becomes a custom call (the handlers see one synchronous
/// collective in every form: operands in, result out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// A synchronous collective: the instruction becomes the call.
    Sync,
    /// `all-reduce-start` (result: the reduced array): the start becomes the call and its
    /// `all-reduce-done` a `copy` of it (XLA's simplifier removes the copy where it compiles
    /// the module from the start; users read the done as before).
    AsyncInPlace,
    /// `all-gather-start` / `collective-permute-start` (result: the tuple `(operand,
    /// result)`): a new call, inserted just before the start, computes the result; the start
    /// becomes `tuple(operand, call)`, so any user of the start (its `-done`, a
    /// `get-tuple-element` of either element) reads what it read before, and the `-done`
    /// becomes `get-tuple-element(start), index=1`.
    AsyncTuple,
}

/// The [`Form`] of collective `id`, or why its async form stays XLA's.
fn form_of(module: &Module, id: InstrId) -> Result<Form, String> {
    let ins = module.instr(id);
    let operand = |k: usize| ins.operands.get(k).and_then(|&o| module.instrs.get(o)).map(|o| &o.shape);
    match ins.opcode {
        Opcode::AllReduceStart => match (&ins.shape, ins.operands.len()) {
            (hlo::Shape::Array(_), 1) => Ok(Form::AsyncInPlace),
            _ => Err(format!(
                "async start/done pair: a variadic all-reduce-start ({} operands) stays XLA's (its done would \
                 need a tuple copy)",
                ins.operands.len()
            )),
        },
        Opcode::AllGatherStart | Opcode::CollectivePermuteStart => {
            let ok = ins.operands.len() == 1
                && matches!(&ins.shape, hlo::Shape::Tuple(e) if e.len() == 2
                    && e.iter().all(|x| x.as_array().is_some())
                    && Some(&e[0]) == operand(0));
            if ok {
                Ok(Form::AsyncTuple)
            } else {
                Err(format!(
                    "async start/done pair: a {} of {} operand(s) with result {} is not the (operand, result) form \
                     the pass rewrites",
                    ins.opcode.name(),
                    ins.operands.len(),
                    ins.shape
                ))
            }
        }
        _ => Ok(Form::Sync),
    }
}

/// One collective to rewrite: its target, attributes and form.
struct Rewrite {
    target: &'static str,
    call: CustomCallConfig,
    form: Form,
}

/// Where the pass learns peer access between device ids. Probing GPUs opens them (seconds;
/// on a cold kernel cache, minutes of compiling), so a table that must be probed is asked for
/// only when a collective has passed every rule that needs no GPU: a module whose collectives
/// all fall back for other reasons (groups of one, the dtype guard, sizes, hosts) opens none.
#[derive(Clone, Default)]
pub enum Peers {
    /// Every device reaches every other (the CPU platform: one address space).
    #[default]
    Shared,
    /// A table made on first need, at most once per run of the pass.
    Lazy(std::sync::Arc<dyn Fn() -> std::sync::Arc<PeerAccessTable> + Send + Sync>),
}

impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peers::Shared => f.write_str("Shared"),
            Peers::Lazy(_) => f.write_str("Lazy"),
        }
    }
}

/// Free device memory the pass may budget staging against (the least among the process's
/// GPUs, in bytes), asked once per run, after the decisions and only if a collective was
/// rewritten. `None` (the CPU platform): no budget.
#[derive(Clone, Default)]
pub struct DeviceMemory(pub Option<std::sync::Arc<dyn Fn() -> Option<u64> + Send + Sync>>);

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "DeviceMemory(probe)" } else { "DeviceMemory(none)" })
    }
}

/// The share of free device memory one module's staging may take (1/4): XLA's allocator
/// and the model need the rest, and a compile may precede others that allocate.
pub const STAGING_SHARE_OF_FREE: u64 = 4;

/// One run's view of [`Peers`]: the table, made when first asked for.
struct PeerLookup<'a> {
    source: &'a Peers,
    num_devices: usize,
    table: std::cell::OnceCell<std::sync::Arc<PeerAccessTable>>,
}

impl PeerLookup<'_> {
    fn get(&self) -> &PeerAccessTable {
        self.table.get_or_init(|| match self.source {
            Peers::Shared => std::sync::Arc::new(PeerAccessTable::full(self.num_devices, "one process, shared memory")),
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
    /// Device ids this process owns; `None`: all of them. Without a `topology`, a group
    /// with another device falls back (its collective needs XLA's cross-process path).
    pub local_devices: Option<BTreeSet<usize>>,
    /// The job's processes and hosts (`jax.distributed`); `None`: one process.
    pub topology: Option<Topology>,
    /// What the handlers of this platform can run.
    pub caps: Capabilities,
    /// The first `instance` id of this run, the next rewrite getting the next id (tests
    /// want stable output); `None`: ids from a per-process random base ([`next_instance`]).
    pub instance_base: Option<u64>,
    /// Free device memory for the staging budget ([`fit_staging`]); `None`: unbounded.
    pub device_memory: DeviceMemory,
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
            caps: Capabilities { variadic: true, cross_process: false },
            instance_base: None,
            device_memory: DeviceMemory::default(),
            tuning: TuningConfig::default(),
        }
    }
}

/// Which process owns each device of a job and which processes share a host. "Host" means
/// a shared-memory domain: processes that can open each other's POSIX shared memory (the
/// Python package checks it, rather than trusting host names: containers on one machine may
/// not share /dev/shm). Every process of a job holds the same topology, so every process
/// decides every collective the same way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// Device id → process index, for every device of the job.
    pub process_of: BTreeMap<usize, usize>,
    /// Process index → host index.
    pub host_of: BTreeMap<usize, usize>,
    /// The job's token (hex, from the job's key-value store): names the shared segments of
    /// groups across processes, so another job cannot meet them. `None`: such groups fall
    /// back. The handlers take it from the running process ([`thunks::runtime::set_job`]);
    /// the pass only needs to know there is one, and writes it into no module.
    pub job: Option<String>,
    /// The process the pass runs in (its devices are the local ones); decisions never
    /// depend on it.
    pub this_process: Option<usize>,
    /// This process's devices: device id → the platform's local ordinal (a GPU's CUDA
    /// ordinal), for the handlers, which XLA calls with the ordinal. Empty: not given.
    pub ordinals: BTreeMap<usize, usize>,
}

impl Topology {
    /// Parses `this=PROC;job=HEX;devices=ID:PROC,...;hosts=PROC:HOST,...[;ordinals=ID:ORD,...]`
    /// (the Python package's spelling; `job` may be empty).
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
                "job" if (8..=64).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_hexdigit()) => {
                    t.job = Some(v.to_owned())
                }
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

    /// Why `talking` (groups of device ids that exchange data) cannot run on Peerless's
    /// kernels, or whether it crosses processes (`Ok(true)`).
    fn check(&self, talking: &[Vec<usize>], cross_process: bool) -> Result<bool, String> {
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

/// A collective id every process derives alike, in every run: the module (its bytes but its
/// per-process `id`) and the instruction. Nothing of the run: a module kept in a persistent
/// compilation cache serves later jobs, whose handlers tell them apart by their job's token
/// and tell two executables of one module apart by the order they are instantiated in
/// ([`thunks::runtime::shared_key`]).
fn shared_instance(fingerprint: u64, instr: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same value in every process of one build.
    let mut h = std::hash::DefaultHasher::new();
    (fingerprint, instr).hash(&mut h);
    h.finish() & (i64::MAX as u64)
}

/// The module's fingerprint for [`shared_instance`]: every top-level field but `id`.
fn fingerprint(module: &[u8]) -> Result<u64, PassError> {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    for f in fields(module)?.iter().filter(|f| f.number != hlo_module::ID) {
        h.write(f.raw);
    }
    Ok(h.finish())
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
    /// The decision as one report line: op, instruction, dtypes, bytes, groups, kernel (1/0),
    /// implementation, reason, tab-separated (tabs and newlines inside fields become spaces).
    /// The Python package counts these (`stats()`); every Peerless custom call carries its
    /// own ([`CustomCallConfig::decisions`]).
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

/// Instance ids: a per-process random base plus a counter, so two compiles (or two
/// processes sharing a persistent compilation cache) never give two collectives the same
/// handler state.
fn next_instance() -> u64 {
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

// ----------------------------------------------------------------------------- wire format

/// Calls `f(name, opcode)` for every instruction of every computation.
fn for_each_instruction(module: &[u8], mut f: impl FnMut(&str, &str)) -> Result<(), PassError> {
    for c in
        fields(module)?.iter().filter(|c| c.number == hlo_module::COMPUTATIONS && c.wire == WireType::LengthDelimited)
    {
        for i in fields(c.payload)?
            .iter()
            .filter(|i| i.number == computation::INSTRUCTIONS && i.wire == WireType::LengthDelimited)
        {
            let (mut name, mut opcode) = ("", "");
            for x in fields(i.payload)? {
                match x.number {
                    instruction::NAME => name = std::str::from_utf8(x.payload).unwrap_or(""),
                    instruction::OPCODE => opcode = std::str::from_utf8(x.payload).unwrap_or(""),
                    _ => {}
                }
            }
            f(name, opcode);
        }
    }
    Ok(())
}

/// Whether the module has any collective: the cheap check that lets the pass return at
/// once for the many modules without one.
pub fn has_collectives(module: &[u8]) -> Result<bool, PassError> {
    let mut any = false;
    for_each_instruction(module, |_, op| any |= COLLECTIVE_OPCODES.contains(&op))?;
    Ok(any)
}

/// What the decisions read, and nothing else: a module of the computations that hold
/// collectives, each reduced to its collectives (verbatim but for control predecessors)
/// and their operands (as parameters of the same name, id and shape), plus the
/// computations the collectives call (reducers), verbatim. Decoding it costs a fraction of
/// decoding the whole module (a 32-layer train step: 3.8 MB, 29 672 instructions in 3 435
/// computations, of which the slim module keeps the few hundred that matter).
fn slim(module: &[u8]) -> Result<Vec<u8>, PassError> {
    let top = fields(module)?;
    let mut kept_comps: Vec<Vec<u8>> = Vec::new();
    let mut called: Vec<i64> = Vec::new();
    let mut entry: Option<(Vec<u8>, i64)> = None;
    let mut by_id: HashMap<i64, &[u8]> = HashMap::new();
    for c in top.iter().filter(|c| c.number == hlo_module::COMPUTATIONS && c.wire == WireType::LengthDelimited) {
        let cf = fields(c.payload)?;
        let comp_id =
            cf.iter().find(|x| x.number == computation::ID).map(ints).transpose()?.and_then(|v| v.first().copied());
        // proto3 leaves a zero out: a computation without an id is id 0 (prost writes
        // modules so, and XLA may).
        by_id.insert(comp_id.unwrap_or(0), c.raw);
        let instrs: Vec<&Field<'_>> = cf
            .iter()
            .filter(|i| i.number == computation::INSTRUCTIONS && i.wire == WireType::LengthDelimited)
            .collect();
        // The collectives of this computation, with their fields.
        let mut colls: Vec<Vec<Field<'_>>> = Vec::new();
        let mut all: HashMap<i64, Vec<Field<'_>>> = HashMap::new();
        for i in &instrs {
            let fs = fields(i.payload)?;
            let op = fs
                .iter()
                .find(|x| x.number == instruction::OPCODE)
                .map_or("", |x| std::str::from_utf8(x.payload).unwrap_or(""));
            if COLLECTIVE_OPCODES.contains(&op) {
                colls.push(fs);
            } else {
                let id = fs
                    .iter()
                    .find(|x| x.number == instruction::ID)
                    .map(ints)
                    .transpose()?
                    .and_then(|v| v.first().copied());
                all.insert(id.unwrap_or(0), fs);
            }
        }
        if colls.is_empty() {
            continue;
        }
        let mut out = Vec::new();
        for x in cf.iter().filter(|x| matches!(x.number, computation::NAME | computation::ID)) {
            out.extend_from_slice(x.raw);
        }
        // Operands that are not collectives themselves become parameters.
        let mut stand_ins: Vec<i64> = Vec::new();
        for fs in &colls {
            for x in fs.iter().filter(|x| x.number == instruction::OPERAND_IDS) {
                for id in ints(x)? {
                    if all.contains_key(&id) && !stand_ins.contains(&id) {
                        stand_ins.push(id);
                    }
                }
            }
            for x in fs.iter().filter(|x| x.number == instruction::CALLED_COMPUTATION_IDS) {
                called.extend(ints(x)?);
            }
        }
        for (k, id) in stand_ins.iter().enumerate() {
            let fs = &all[id];
            let mut ins = Vec::new();
            for x in fs.iter().filter(|x| matches!(x.number, instruction::NAME | instruction::SHAPE | instruction::ID))
            {
                ins.extend_from_slice(x.raw);
            }
            put_bytes(&mut ins, instruction::OPCODE, b"parameter");
            put_varint(&mut ins, instruction::PARAMETER_NUMBER, k as i64);
            put_bytes(&mut out, computation::INSTRUCTIONS, &ins);
        }
        let mut root = 0;
        for fs in &colls {
            let mut ins = Vec::new();
            for x in fs.iter().filter(|x| x.number != instruction::CONTROL_PREDECESSOR_IDS) {
                ins.extend_from_slice(x.raw);
                if x.number == instruction::ID {
                    root = ints(x)?.first().copied().unwrap_or(0);
                }
            }
            put_bytes(&mut out, computation::INSTRUCTIONS, &ins);
        }
        put_varint(&mut out, computation::ROOT_ID, root);
        if entry.is_none() {
            let name =
                cf.iter().find(|x| x.number == computation::NAME).map(|x| x.payload.to_vec()).unwrap_or_default();
            entry = Some((name, comp_id.unwrap_or(0)));
        }
        kept_comps.push(out);
    }
    let mut out = Vec::with_capacity(module.len() / 8);
    for x in top.iter().filter(|x| MODULE_KEPT.contains(&x.number)) {
        out.extend_from_slice(x.raw);
    }
    for c in &kept_comps {
        put_bytes(&mut out, hlo_module::COMPUTATIONS, c);
    }
    called.sort_unstable();
    called.dedup();
    for id in called {
        if let Some(raw) = by_id.get(&id) {
            out.extend_from_slice(raw);
        }
    }
    // The entry is a kept computation (the last value of a scalar field wins).
    if let Some((name, id)) = entry {
        put_bytes(&mut out, hlo_module::ENTRY_COMPUTATION_NAME, &name);
        put_varint(&mut out, hlo_module::ENTRY_COMPUTATION_ID, id);
    }
    Ok(out)
}

/// The instructions' ids and names of a whole module (fresh ones for inserted calls must be
/// unused).
fn ids_and_names(module: &[u8]) -> Result<(BTreeSet<i64>, BTreeSet<String>), PassError> {
    let (mut ids, mut names) = (BTreeSet::new(), BTreeSet::new());
    for c in
        fields(module)?.iter().filter(|c| c.number == hlo_module::COMPUTATIONS && c.wire == WireType::LengthDelimited)
    {
        for i in fields(c.payload)?.iter().filter(|i| i.number == computation::INSTRUCTIONS) {
            for x in fields(i.payload)? {
                match x.number {
                    instruction::ID => ids.extend(ints(&x)?),
                    instruction::NAME => drop(names.insert(String::from_utf8_lossy(x.payload).into_owned())),
                    _ => {}
                }
            }
        }
    }
    Ok((ids, names))
}

/// `shape` (a ShapeProto) with a layout on every array: the one it has, else the default
/// (row-major). A pinned custom call must say every layout (XLA rejects one without).
fn with_layout(shape: &[u8]) -> Result<Vec<u8>, PassError> {
    use hlo::wire::enums::{OPAQUE_TYPE, TOKEN_TYPE, TUPLE_TYPE};
    use hlo::wire::layout::MINOR_TO_MAJOR;
    use hlo::wire::shape::{DIMENSIONS, ELEMENT_TYPE, LAYOUT, TUPLE_SHAPES};
    let fs = fields(shape)?;
    let ty = fs.iter().find(|x| x.number == ELEMENT_TYPE).map(ints).transpose()?.and_then(|v| v.first().copied());
    let mut out = Vec::with_capacity(shape.len() + 16);
    match ty {
        Some(TUPLE_TYPE) => {
            for x in &fs {
                if x.number == TUPLE_SHAPES && x.wire == WireType::LengthDelimited {
                    put_bytes(&mut out, TUPLE_SHAPES, &with_layout(x.payload)?);
                } else {
                    out.extend_from_slice(x.raw);
                }
            }
        }
        Some(OPAQUE_TYPE | TOKEN_TYPE) => out.extend_from_slice(shape),
        _ if fs.iter().any(|x| x.number == LAYOUT) => out.extend_from_slice(shape),
        _ => {
            let mut rank = 0i64;
            for x in fs.iter().filter(|x| x.number == DIMENSIONS) {
                rank += ints(x)?.len() as i64;
            }
            out.extend_from_slice(shape);
            let mut layout = Vec::new();
            put_ints(&mut layout, MINOR_TO_MAJOR, (0..rank).rev());
            put_bytes(&mut out, LAYOUT, &layout);
        }
    }
    Ok(out)
}

/// Pins a call's operand layouts (and, with its shape written by [`with_layout`], its
/// result's): XLA's layout assignment keeps a layout-constrained custom call's layouts, where
/// it may give an unconstrained one any (XLA:GPU assigns layouts after the pass and gave an
/// all-to-all's call `{3,2,0,1}`, which a handler told nothing reads as row-major). The
/// handlers are told exactly these layouts (`layout` attribute, or none where operand and
/// result agree): the same shapes the pass decided on.
fn pin_operands(
    ins: &mut Vec<u8>,
    operands: &[i64],
    shapes: &HashMap<i64, &[u8]>,
    name: &str,
) -> Result<(), PassError> {
    put_varint(ins, instruction::CONSTRAIN_LAYOUT, 1);
    for o in operands {
        let shape =
            shapes.get(o).ok_or_else(|| PassError::Wire(format!("'{name}': operand {o} is not in its computation")))?;
        put_bytes(ins, instruction::OPERAND_SHAPES_WITH_LAYOUT, &with_layout(shape)?);
    }
    Ok(())
}

/// The custom-call fields every rewritten collective gets.
fn put_call(ins: &mut Vec<u8>, target: &str, config: &str) {
    put_bytes(ins, instruction::OPCODE, b"custom-call");
    put_bytes(ins, instruction::CUSTOM_CALL_TARGET, target.as_bytes());
    put_bytes(ins, instruction::BACKEND_CONFIG, config.as_bytes());
    put_varint(ins, instruction::CUSTOM_CALL_API_VERSION, API_VERSION_TYPED_FFI);
}

/// Re-encodes the module with the instructions named in `rewrites` turned into custom
/// calls (target, backend_config, [`Form`]). An async start's `-done` (the instruction of
/// that opcode whose operand is the start) is rewritten with it: a `copy` of an
/// all-reduce's call, element 1 of the `(operand, result)` tuple of the others. An
/// inserted call gets an id one past the largest of its computation (ids carry their
/// computation in the upper 32 bits in modules XLA writes) that no instruction of the
/// module has, and the start's name with `.peerless` (made unique).
fn rewrite(module: &[u8], rewrites: &HashMap<String, (&'static str, String, Form)>) -> Result<Vec<u8>, PassError> {
    let any_tuple = rewrites.values().any(|r| r.2 == Form::AsyncTuple);
    let (mut used_ids, mut used_names) =
        if any_tuple { ids_and_names(module)? } else { (BTreeSet::new(), BTreeSet::new()) };
    let mut out = Vec::with_capacity(module.len() + rewrites.len() * 256);
    for c in fields(module)? {
        if c.number != hlo_module::COMPUTATIONS || c.wire != WireType::LengthDelimited {
            out.extend_from_slice(c.raw);
            continue;
        }
        let cf = fields(c.payload)?;
        let mut instrs: Vec<Option<Vec<Field<'_>>>> = Vec::with_capacity(cf.len());
        for i in &cf {
            instrs.push(if i.number == computation::INSTRUCTIONS && i.wire == WireType::LengthDelimited {
                Some(fields(i.payload)?)
            } else {
                None
            });
        }
        let name_of = |fs: &[Field<'_>]| {
            fs.iter().find(|x| x.number == instruction::NAME).map(|x| String::from_utf8_lossy(x.payload).into_owned())
        };
        let first_int = |fs: &[Field<'_>], number: u32| -> Result<Option<i64>, PassError> {
            Ok(fs.iter().find(|x| x.number == number).map(ints).transpose()?.and_then(|v| v.first().copied()))
        };
        // Async starts rewritten here, by id, the largest id of the computation and every
        // instruction's shape by id (a call's operands are in its computation).
        let mut starts: HashMap<i64, Form> = HashMap::new();
        let mut shapes: HashMap<i64, &[u8]> = HashMap::new();
        let mut max_id = 0i64;
        for fs in instrs.iter().flatten() {
            let id = first_int(fs, instruction::ID)?.unwrap_or(0);
            max_id = max_id.max(id);
            if let Some(x) = fs.iter().find(|x| x.number == instruction::SHAPE) {
                shapes.insert(id, x.payload);
            }
            if let Some((_, _, form)) = name_of(fs).and_then(|n| rewrites.get(&n))
                && *form != Form::Sync
            {
                starts.insert(id, *form);
            }
        }
        let mut comp = Vec::with_capacity(c.payload.len());
        for (i, fs) in cf.iter().zip(&instrs) {
            let Some(fs) = fs else {
                comp.extend_from_slice(i.raw);
                continue;
            };
            let opcode = fs.iter().find(|x| x.number == instruction::OPCODE).map_or(&b""[..], |x| x.payload);
            // A -done of a rewritten start.
            if opcode.ends_with(b"-done") {
                let operands: Vec<i64> = match fs.iter().find(|x| x.number == instruction::OPERAND_IDS) {
                    Some(x) => ints(x)?,
                    None => Vec::new(),
                };
                if let Some(form) = operands.first().and_then(|o| starts.get(o)) {
                    let mut ins = Vec::with_capacity(i.payload.len());
                    for x in fs.iter().filter(|x| {
                        matches!(
                            x.number,
                            instruction::NAME
                                | instruction::SHAPE
                                | instruction::METADATA
                                | instruction::ID
                                | instruction::OPERAND_IDS
                                | instruction::CONTROL_PREDECESSOR_IDS
                                | instruction::SHARDING
                                | instruction::FRONTEND_ATTRIBUTES
                        )
                    }) {
                        ins.extend_from_slice(x.raw);
                    }
                    if *form == Form::AsyncTuple {
                        put_bytes(&mut ins, instruction::OPCODE, b"get-tuple-element");
                        put_varint(&mut ins, instruction::TUPLE_INDEX, 1);
                    } else {
                        put_bytes(&mut ins, instruction::OPCODE, b"copy");
                    }
                    put_bytes(&mut comp, computation::INSTRUCTIONS, &ins);
                    continue;
                }
            }
            let name = name_of(fs);
            let Some((target, config, form)) = name.as_ref().and_then(|n| rewrites.get(n)) else {
                comp.extend_from_slice(i.raw);
                continue;
            };
            if *form != Form::AsyncTuple {
                let mut ins = Vec::with_capacity(i.payload.len() + config.len() + 64);
                for x in fs.iter().filter(|x| !DROPPED.contains(&x.number) && x.number != instruction::SHAPE) {
                    ins.extend_from_slice(x.raw);
                }
                let shape = fs.iter().find(|x| x.number == instruction::SHAPE).map_or(&b""[..], |x| x.payload);
                put_bytes(&mut ins, instruction::SHAPE, &with_layout(shape)?);
                let operands = match fs.iter().find(|x| x.number == instruction::OPERAND_IDS) {
                    Some(x) => ints(x)?,
                    None => Vec::new(),
                };
                pin_operands(&mut ins, &operands, &shapes, name.as_deref().unwrap_or(""))?;
                put_call(&mut ins, target, config);
                put_bytes(&mut comp, computation::INSTRUCTIONS, &ins);
                continue;
            }
            // `(operand, result)`: the call computes the result, the start becomes the tuple.
            let name = name.unwrap_or_default();
            let shape = fs.iter().find(|x| x.number == instruction::SHAPE).map_or(&b""[..], |x| x.payload);
            let result_shape = fields(shape)?
                .into_iter()
                .filter(|x| x.number == hlo::wire::shape::TUPLE_SHAPES && x.wire == WireType::LengthDelimited)
                .nth(1)
                .map(|x| x.payload)
                .ok_or_else(|| PassError::Wire(format!("'{name}': the start's shape has no element 1")))?;
            let operand = fs
                .iter()
                .find(|x| x.number == instruction::OPERAND_IDS)
                .map(ints)
                .transpose()?
                .and_then(|v| v.first().copied())
                .ok_or_else(|| PassError::Wire(format!("'{name}': the start has no operand")))?;
            let mut call_id = max_id + 1;
            while used_ids.contains(&call_id) {
                call_id += 1;
            }
            used_ids.insert(call_id);
            max_id = max_id.max(call_id);
            let mut call_name = format!("{name}.peerless");
            let mut k = 1;
            while used_names.contains(&call_name) {
                call_name = format!("{name}.peerless.{k}");
                k += 1;
            }
            used_names.insert(call_name.clone());
            let mut call = Vec::with_capacity(i.payload.len() + config.len() + 64);
            put_bytes(&mut call, instruction::NAME, call_name.as_bytes());
            put_bytes(&mut call, instruction::SHAPE, &with_layout(result_shape)?);
            put_varint(&mut call, instruction::ID, call_id);
            for x in fs.iter().filter(|x| {
                matches!(
                    x.number,
                    instruction::METADATA
                        | instruction::OPERAND_IDS
                        | instruction::CONTROL_PREDECESSOR_IDS
                        | instruction::FRONTEND_ATTRIBUTES
                )
            }) {
                call.extend_from_slice(x.raw);
            }
            pin_operands(&mut call, &[operand], &shapes, &name)?;
            put_call(&mut call, target, config);
            put_bytes(&mut comp, computation::INSTRUCTIONS, &call);
            let mut tuple = Vec::with_capacity(i.payload.len());
            for x in fs.iter().filter(|x| {
                matches!(
                    x.number,
                    instruction::NAME
                        | instruction::SHAPE
                        | instruction::METADATA
                        | instruction::ID
                        | instruction::SHARDING
                )
            }) {
                tuple.extend_from_slice(x.raw);
            }
            put_bytes(&mut tuple, instruction::OPCODE, b"tuple");
            put_ints(&mut tuple, instruction::OPERAND_IDS, [operand, call_id]);
            put_bytes(&mut comp, computation::INSTRUCTIONS, &tuple);
        }
        put_bytes(&mut out, hlo_module::COMPUTATIONS, &comp);
    }
    Ok(out)
}

// ----------------------------------------------------------------------------- the pass

/// Logical id (`replica * partitions + partition`) → device id.
struct Assignment {
    replicas: usize,
    partitions: usize,
    devices: Vec<usize>,
}

impl Assignment {
    fn of(bytes: &[u8]) -> Result<Self, PassError> {
        let header = ModuleHeader::decode(bytes).map_err(|e| PassError::Wire(e.to_string()))?;
        let Some(da) = header.device_assignment else {
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

    fn device(&self, logical: usize) -> usize {
        self.devices.get(logical).copied().unwrap_or(logical)
    }
}

fn fmt_ids(groups: &[Vec<usize>]) -> String {
    thunks::fmt_groups(groups)
}

/// Runs the pass over a serialized module.
pub fn run(bytes: &[u8], cfg: &PassConfig) -> Result<PassOutcome, PassError> {
    if !has_collectives(bytes)? {
        return Ok(PassOutcome::default());
    }
    let assignment = Assignment::of(bytes)?;
    let slim = slim(bytes)?;
    let module = hlo::proto::decode("module", &slim).map_err(|e| PassError::Decode(e.to_string()))?;
    let n = assignment.devices.iter().copied().max().map_or(1, |m| m + 1);
    let peers = PeerLookup { source: &cfg.peers, num_devices: n, table: std::cell::OnceCell::new() };
    // The rules see logical ids; peer access is checked on device ids in `decide_one`.
    let logical = PeerAccessTable::full(assignment.devices.len(), "checked on device ids");
    let layouts = layout_map(&slim)?;
    let tuning = cfg.tuning.resolve(assignment.devices.len());
    let mut decisions = Vec::new();
    // Collectives across processes get ids every process derives alike (the module's
    // fingerprint, computed once, and only if the module has such a collective).
    let crossing = cfg.topology.as_ref().is_some_and(|t| t.job.is_some());
    let mut module_key: Option<Option<u64>> = None;
    // Kernel decisions in the module's order, with their calls.
    let mut calls: Vec<(usize, InstrId, &'static str, CustomCallConfig)> = Vec::new();
    let mut forms: HashMap<String, Form> = HashMap::new();
    for id in module.collectives() {
        let instance = cfg.instance_base.map(|b| b.wrapping_add(calls.len() as u64) & (i64::MAX as u64));
        let shared_id = |instr: &str| -> Option<u64> {
            if !crossing {
                return None;
            }
            let fp = (*module_key.get_or_insert_with(|| fingerprint(bytes).ok()))?;
            Some(shared_instance(fp, instr))
        };
        let (decision, rewrite) =
            decide_one(&module, id, &assignment, cfg, &tuning, &logical, &peers, &layouts, instance, shared_id);
        if let Some(Rewrite { target, call, form }) = rewrite {
            forms.insert(call.name.clone(), form);
            calls.push((decisions.len(), id, target, call));
        }
        log::info!("peerless pass: {decision}");
        decisions.push(decision);
    }
    // Shared staging: only worth reading the whole module's dependencies with two calls.
    if calls.len() > 1 {
        let names: Vec<&str> = calls.iter().map(|c| c.3.name.as_str()).collect();
        match dependencies(bytes, &names) {
            Ok(deps) => assign_slots(&module, &deps, &mut calls),
            Err(e) => log::warn!("peerless pass: collectives keep staging of their own ({e})"),
        }
    } else if let Some(c) = calls.first_mut() {
        // One call: a slot of its own (so a later load of the module may still share nothing).
        c.3.slot = Some(c.3.instance);
        c.3.slot_bytes = staged_bytes(&module, c.1);
        c.3.slot_gpu_bytes = gpu_staged_bytes(&module, c.1, &c.3);
    }
    if let Some(probe) = cfg.device_memory.0.as_ref().filter(|_| !calls.is_empty()) {
        fit_staging(&module, probe(), &mut calls, &mut decisions);
    }
    // Every call carries its decision, and the module's first call the collectives left to
    // XLA: an executable loaded from a cache reports them when XLA instantiates its calls.
    let fallbacks: String = decisions.iter().filter(|d| !d.kernel).map(PassDecision::report_line).collect();
    let mut rewrites = HashMap::new();
    let mut instances = Vec::with_capacity(calls.len());
    for (k, (at, _, target, mut call)) in calls.into_iter().enumerate() {
        call.decisions = decisions[at].report_line();
        if k == 0 {
            call.decisions.push_str(&fallbacks);
        }
        instances.push(call.instance);
        let form = forms.get(&call.name).copied().unwrap_or(Form::Sync);
        rewrites.insert(decisions[at].instr.clone(), (target, call.backend_config(), form));
    }
    let module = if rewrites.is_empty() { None } else { Some(rewrite(bytes, &rewrites)?) };
    Ok(PassOutcome { module, decisions, instances })
}

/// Bytes of one staging buffer a call of collective `id` stages: each operand, 64-byte
/// aligned (`kernels::host::direct`'s plan; the two-shot keeps its reduced slices there).
fn staged_bytes(module: &Module, id: InstrId) -> u64 {
    (module.instr(id).operands.iter())
        .filter_map(|&o| module.instrs.get(o))
        .map(|o| (o.shape.byte_size() as u64).div_ceil(64).saturating_mul(64))
        .fold(0u64, u64::saturating_add)
}

/// Staging `call` (the rewrite of `id`) needs on each GPU
/// ([`CustomCallConfig::gpu_staging_bytes`]: results too, where the host stages operands).
fn gpu_staged_bytes(module: &Module, id: InstrId, call: &CustomCallConfig) -> u64 {
    let ins = module.instr(id);
    let args: Vec<usize> =
        ins.operands.iter().filter_map(|&o| module.instrs.get(o)).map(|o| o.shape.byte_size()).collect();
    let rets: Vec<usize> = ins.shape.leaves().iter().map(|l| l.byte_size()).collect();
    call.gpu_staging_bytes(&args, &rets) as u64
}

/// Keeps the module's GPU staging within [`STAGING_SHARE_OF_FREE`] of the least free device
/// memory (`free`): while it exceeds that, the calls of the largest slot go back to XLA, each
/// decision saying why, so a program that XLA alone could run never fails allocating
/// Peerless's staging. Calls whose groups span processes stay: every process must rewrite
/// the same collectives, and each would measure its own free memory.
fn fit_staging(
    module: &Module,
    free: Option<u64>,
    calls: &mut Vec<(usize, InstrId, &'static str, CustomCallConfig)>,
    decisions: &mut [PassDecision],
) {
    let Some(free) = free else { return };
    let budget = free / STAGING_SHARE_OF_FREE;
    // Bytes per slot (a call without one: its own staging).
    let mut slots: BTreeMap<u64, u64> = BTreeMap::new();
    for (_, id, _, c) in calls.iter() {
        let (key, bytes) = match c.slot {
            Some(s) => (s, c.slot_gpu_bytes),
            None => (c.instance, gpu_staged_bytes(module, *id, c)),
        };
        let e = slots.entry(key).or_insert(0);
        *e = (*e).max(bytes);
    }
    let wanted: u64 = slots.values().sum();
    if wanted <= budget {
        return;
    }
    let mut total = wanted;
    let crossing: BTreeSet<u64> =
        calls.iter().filter(|c| c.3.spans_processes()).map(|c| c.3.slot.unwrap_or(c.3.instance)).collect();
    let mut order: Vec<(u64, u64)> = slots.into_iter().filter(|(k, _)| !crossing.contains(k)).collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut dropped = BTreeSet::new();
    for (k, b) in order {
        if total <= budget {
            break;
        }
        dropped.insert(k);
        total -= b;
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    calls.retain(|(at, _, _, c)| {
        let key = c.slot.unwrap_or(c.instance);
        if !dropped.contains(&key) {
            return true;
        }
        let d = &mut decisions[*at];
        d.kernel = false;
        d.implementation = "fallback".into();
        d.reason = format!(
            "staging budget: the module's GPU staging would be {:.1} MiB, more than 1/{STAGING_SHARE_OF_FREE} of the \
             {:.1} MiB free on the fullest GPU; its largest slots stay XLA's (was: {})",
            mib(wanted),
            mib(free),
            d.reason
        );
        log::warn!("peerless pass: {} left to XLA: {}", d.instr, d.reason);
        false
    });
}

/// Data dependencies between a module's collectives, read from the whole module (the slim
/// module the decisions read keeps only collectives and their direct operands).
#[derive(Debug, Default)]
struct Deps {
    /// Collective name → its computation's name and its ancestors among the collectives
    /// asked for (bit `index[name]`; a collective is its own ancestor).
    ancestors: HashMap<String, (String, Vec<u64>)>,
    index: HashMap<String, usize>,
    /// Computation name → the computations of the instructions that call it, one per call.
    callers: HashMap<String, Vec<String>>,
    /// The entry computation's name (the module's entry id; else its entry name).
    entry: Option<String>,
}

impl Deps {
    /// Whether collective `a` is `b` or a data-dependency ancestor of it.
    fn precedes(&self, a: &str, b: &str) -> bool {
        match (self.index.get(a), self.ancestors.get(b)) {
            (Some(&i), Some((_, bits))) => bits.get(i / 64).is_some_and(|w| w & (1u64 << (i % 64)) != 0),
            _ => false,
        }
    }

    /// Whether every computation from the entry down to `comp` has one caller: then each
    /// run of `comp` is ordered after the last by its caller (a loop's iterations, one call
    /// site), and its collectives never run twice at once on a device.
    fn runs_alone(&self, comp: &str) -> bool {
        let mut c = comp;
        for _ in 0..=self.callers.len() {
            if Some(c) == self.entry.as_deref() {
                return true;
            }
            match self.callers.get(c).map(Vec::as_slice) {
                Some([one]) => c = one,
                _ => return false,
            }
        }
        false
    }
}

/// The [`Deps`] of the collectives named `wanted` in the serialized `module`.
fn dependencies(module: &[u8], wanted: &[&str]) -> Result<Deps, PassError> {
    let wanted_names = wanted;
    let mut deps =
        Deps { index: wanted.iter().enumerate().map(|(k, n)| (n.to_string(), k)).collect(), ..Deps::default() };
    let words = wanted.len().div_ceil(64);
    let top = fields(module)?;
    let first_int = |fs: &[Field<'_>], number: u32| -> Result<Option<i64>, PassError> {
        Ok(fs.iter().find(|x| x.number == number).map(ints).transpose()?.and_then(|v| v.first().copied()))
    };
    let name_of = |fs: &[Field<'_>]| -> String {
        fs.iter()
            .find(|x| x.number == computation::NAME)
            .map_or(String::new(), |x| String::from_utf8_lossy(x.payload).into_owned())
    };
    // Computations: id → name, and each one's instructions: id → (the index of a wanted
    // collective, operands, callees).
    type Instr = (Option<usize>, Vec<i64>, Vec<i64>);
    let mut comps: Vec<(String, HashMap<i64, Instr>, Vec<i64>)> = Vec::new();
    let mut comp_name: HashMap<i64, String> = HashMap::new();
    for c in top.iter().filter(|c| c.number == hlo_module::COMPUTATIONS && c.wire == WireType::LengthDelimited) {
        let cf = fields(c.payload)?;
        let name = name_of(&cf);
        comp_name.insert(first_int(&cf, computation::ID)?.unwrap_or(0), name.clone());
        let mut instrs = HashMap::new();
        let mut order = Vec::new();
        for i in cf.iter().filter(|i| i.number == computation::INSTRUCTIONS && i.wire == WireType::LengthDelimited) {
            let fs = fields(i.payload)?;
            let id = first_int(&fs, instruction::ID)?.unwrap_or(0);
            let mut operands = Vec::new();
            let mut called = Vec::new();
            for x in &fs {
                match x.number {
                    instruction::OPERAND_IDS => operands.extend(ints(x)?),
                    instruction::CALLED_COMPUTATION_IDS => called.extend(ints(x)?),
                    _ => {}
                }
            }
            order.push(id);
            let wanted = fs
                .iter()
                .find(|x| x.number == instruction::NAME)
                .and_then(|x| std::str::from_utf8(x.payload).ok())
                .and_then(|n| deps.index.get(n).copied());
            instrs.insert(id, (wanted, operands, called));
        }
        comps.push((name, instrs, order));
    }
    deps.entry = match first_int(&top, hlo_module::ENTRY_COMPUTATION_ID)? {
        Some(id) if comp_name.contains_key(&id) => comp_name.get(&id).cloned(),
        _ => top
            .iter()
            .find(|x| x.number == hlo_module::ENTRY_COMPUTATION_NAME)
            .map(|x| String::from_utf8_lossy(x.payload).into_owned()),
    };
    for (name, instrs, _) in &comps {
        for (_, _, called) in instrs.values() {
            for c in called {
                if let Some(callee) = comp_name.get(c) {
                    deps.callers.entry(callee.clone()).or_default().push(name.clone());
                }
            }
        }
    }
    for (comp, instrs, listed) in &comps {
        if !instrs.values().any(|(k, _, _)| k.is_some()) {
            continue;
        }
        // Operands before users (a proto promises no order): depth first, without recursion
        // (modules may be deep); an instruction is entered once (a DAG: whatever was entered
        // before is finished by the time a user needs it).
        let mut bits: HashMap<i64, Vec<u64>> = HashMap::with_capacity(instrs.len());
        let mut entered: std::collections::HashSet<i64> = std::collections::HashSet::with_capacity(instrs.len());
        for &root in listed {
            let mut stack = vec![(root, false)];
            while let Some((i, expanded)) = stack.pop() {
                let Some((wanted, operands, _)) = instrs.get(&i) else { continue };
                if expanded {
                    let mut b = vec![0u64; words];
                    for o in operands {
                        if let Some(ob) = bits.get(o) {
                            b.iter_mut().zip(ob).for_each(|(x, y)| *x |= y);
                        }
                    }
                    if let Some(k) = *wanted {
                        b[k / 64] |= 1u64 << (k % 64);
                        deps.ancestors.insert(wanted_names[k].to_owned(), (comp.clone(), b.clone()));
                    }
                    bits.insert(i, b);
                    continue;
                }
                if !entered.insert(i) {
                    continue;
                }
                stack.push((i, true));
                stack.extend(operands.iter().filter(|o| !entered.contains(o)).map(|&o| (o, false)));
            }
        }
    }
    Ok(deps)
}

/// Shared staging (issue 25): gives each rewritten collective in one process a staging
/// `slot`, shared with the collectives every device is sure to run before or after it, never
/// at the same time.
///
/// The rule: two calls share a slot only if they lie in the same computation, that
/// computation runs alone (every computation from the entry down to it has one caller, so
/// its collectives never run twice at once), they have the same groups (a permute: the same
/// pairs; a permute never shares with a grouped collective), and the slot's last call is a
/// data-dependency ancestor of the new one. All devices run the same SPMD program, and
/// XLA:CPU's thunk executor (like a stream) never runs a thunk before its operands' producers,
/// so every device runs a slot's calls in one order, one at a time: the sequence of launches
/// the protocols handle for one collective. Calls XLA may run concurrently or in another
/// order on another device (data-independent ones) get different slots. Slots are opened
/// greedily in a topological order. Calls across processes share alike (one shared-memory
/// segment per slot); their slot id, the first call's `instance`, is then the same in every
/// process, and every process assigns the same slots (the same module, a deterministic
/// walk). Every call keeps staging of its own where the module's dependencies cannot be read.
///
/// A slot's id is its first call's `instance` (unique per compile, like instances), its
/// `slot_bytes` the largest host staging buffer among its calls and its `slot_gpu_bytes` the
/// largest GPU staging (both platforms' sizes travel: the pass does not know which runs it).
fn assign_slots(module: &Module, deps: &Deps, calls: &mut [(usize, InstrId, &'static str, CustomCallConfig)]) {
    // Calls by computation.
    let mut by_comp: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (k, (_, _, _, call)) in calls.iter().enumerate() {
        if let Some((comp, _)) = deps.ancestors.get(&call.name) {
            by_comp.entry(comp.clone()).or_default().push(k);
        }
    }
    for (comp, mut ks) in by_comp {
        if !deps.runs_alone(&comp) {
            // Each call keeps staging of its own (`slot` none).
            continue;
        }
        // A topological order: an ancestor has fewer ancestors than its descendants.
        let count = |k: usize| deps.ancestors[&calls[k].3.name].1.iter().map(|w| w.count_ones()).sum::<u32>();
        ks.sort_by_key(|&k| count(k));
        // Open slots by group set: (its last call, its first call).
        type Key = (bool, Vec<Vec<usize>>, Vec<(usize, usize)>);
        let mut open: HashMap<Key, Vec<(usize, usize)>> = HashMap::new();
        let mut first_of: HashMap<usize, usize> = HashMap::new();
        for &k in &ks {
            let call = &calls[k].3;
            let key: Key = (call.kind == CollectiveKind::CollectivePermute, call.groups.clone(), call.pairs.clone());
            let slots = open.entry(key).or_default();
            let reuse = slots.iter_mut().find(|(last, _)| deps.precedes(&calls[*last].3.name, &call.name));
            let first = match reuse {
                Some(s) => {
                    s.0 = k;
                    s.1
                }
                None => {
                    slots.push((k, k));
                    k
                }
            };
            first_of.insert(k, first);
        }
        // Each slot's id and size (the largest buffer among its calls).
        let mut size: HashMap<usize, (u64, u64)> = HashMap::new();
        for &k in &ks {
            let e = size.entry(first_of[&k]).or_insert((0, 0));
            e.0 = e.0.max(staged_bytes(module, calls[k].1));
            e.1 = e.1.max(gpu_staged_bytes(module, calls[k].1, &calls[k].3));
        }
        for &k in &ks {
            let first = first_of[&k];
            let id = calls[first].3.instance;
            calls[k].3.slot = Some(id);
            (calls[k].3.slot_bytes, calls[k].3.slot_gpu_bytes) = size[&first];
        }
    }
}

/// Decides one collective; returns its record and, for a kernel, its rewrite (with
/// `instance` as its id, or a fresh one).
fn decide_one(
    module: &Module,
    id: InstrId,
    a: &Assignment,
    cfg: &PassConfig,
    tuning: &Tuning,
    logical: &PeerAccessTable,
    peers: &PeerLookup<'_>,
    layouts: &HashMap<String, Vec<Result<LeafLayout, String>>>,
    instance: Option<u64>,
    mut shared_id: impl FnMut(&str) -> Option<u64>,
) -> (PassDecision, Option<Rewrite>) {
    let ins = module.instr(id);
    let dtype = {
        let types: Vec<String> = ins
            .operands
            .iter()
            .filter_map(|&o| module.instrs.get(o))
            .flat_map(|o| o.shape.leaves().into_iter().map(|l| l.ty.to_string()))
            .collect();
        types.join(",")
    };
    let mut d = PassDecision {
        instr: ins.name.clone(),
        op: ins.opcode.name().to_owned(),
        dtype,
        bytes: ins.operands.iter().filter_map(|&o| module.instrs.get(o)).map(|o| o.shape.byte_size()).sum(),
        groups: String::new(),
        implementation: "fallback".into(),
        kernel: false,
        reason: String::new(),
    };
    // Decide on device ids: map the logical groups through the assignment first, so peer
    // access and process locality are checked on the devices that will really talk.
    let (config, decision) =
        match decide_tuned(module, id, a.replicas, a.partitions, &cfg.flags, tuning, logical, cfg.caps) {
            Ok(x) => x,
            Err(e) => {
                d.reason = e.to_string();
                return (d, None);
            }
        };
    let groups: Vec<Vec<usize>> = config.groups.iter().map(|g| g.iter().map(|&l| a.device(l)).collect()).collect();
    let pairs: Vec<(usize, usize)> =
        config.source_target_pairs.iter().map(|&(s, t)| (a.device(s), a.device(t))).collect();
    d.groups = if config.op.kind == CollectiveKind::CollectivePermute {
        let p: Vec<String> = pairs.iter().map(|(s, t)| format!("{s}->{t}")).collect();
        format!("[{}]", p.join(","))
    } else {
        fmt_ids(&groups)
    };
    let Implementation::Kernel(algorithm) = decision.implementation else {
        d.reason = decision.reason;
        return (d, None);
    };
    // Peer access on the real devices (the rules saw logical ids).
    let talking: Vec<Vec<usize>> = if config.op.kind == CollectiveKind::CollectivePermute {
        pairs.iter().filter(|(s, t)| s != t).map(|&(s, t)| vec![s, t]).collect()
    } else {
        groups.clone()
    };
    // A collective in which no device meets another moves no data: XLA makes it a copy or
    // nothing (folded into a fusion), where a custom call would cost a launch and split the
    // fusions around it (+20 µs per call for a one-device psum on an H100). Forced kernels
    // still run (single-GPU checks of the handlers).
    let forced = matches!(cfg.flags.backend_for(config.op.kind), Some((crate::flags::Backend::Kernel, _)));
    if !forced && talking.iter().all(|g| g.len() < 2) {
        d.reason = "no device meets another (groups of one): XLA turns it into a copy or nothing".into();
        return (d, None);
    }
    // Processes: a group inside one process runs as always; one across processes of a host
    // meets through shared memory (named by the job); one across hosts is XLA's.
    let mut crosses = false;
    if let Some(t) = &cfg.topology {
        match t.check(&talking, cfg.caps.cross_process) {
            Ok(true) => crosses = true,
            Ok(false) => {}
            Err(why) => {
                d.reason = why;
                return (d, None);
            }
        }
    } else if let Some(local) = &cfg.local_devices
        && let Some(&dev) = talking.iter().flatten().find(|d| !local.contains(d))
    {
        d.reason = format!("device {dev} belongs to another process (this process has {local:?})");
        return (d, None);
    }

    // The peer table is this process's; across processes shared memory reaches every device.
    if !crosses && let Some((x, y)) = talking.iter().find_map(|g| peers.get().missing_link(g)) {
        d.reason = format!("no peer access {x}↔{y} ({})", peers.get().source());
        return (d, None);
    }
    // Partitioner-made collectives XLA would run asynchronously, overlapped with compute:
    // above the flag's size, overlap wins over a faster kernel in order on the compute stream.
    let spmd = ins.attrs.frontend_attributes.get("is_spmd_generated").is_some_and(|v| v == "true");
    if let Some(limit) = cfg.flags.xla_async_above_bytes
        && spmd
        && config.bytes_per_device > limit
    {
        d.reason = format!(
            "partitioner-made, {} bytes > xla_async_above_bytes={limit}: XLA runs it asynchronously, overlapped with compute",
            config.bytes_per_device
        );
        return (d, None);
    }
    // An async pair becomes one synchronous call; the forms it can take ([`Form`]).
    let form = match form_of(module, id) {
        Ok(f) => f,
        Err(e) => {
            d.reason = e;
            return (d, None);
        }
    };
    let elementwise = match config.op.kind {
        CollectiveKind::AllReduce | CollectiveKind::CollectivePermute => true,
        CollectiveKind::AllToAll => config.num_operands > 1,
        _ => false,
    };
    let layout = match common_layout(module, id, layouts, elementwise, form == Form::AsyncTuple) {
        Ok(l) => l,
        Err(e) => {
            d.reason = e;
            return (d, None);
        }
    };
    let Some(target) = target_name(config.op.kind) else {
        d.reason = format!("no Peerless kernel for {}", config.op);
        return (d, None);
    };
    let processes: Vec<usize> = match (crosses, &cfg.topology) {
        (true, Some(t)) => {
            let named: Vec<usize> = if config.op.kind == CollectiveKind::CollectivePermute {
                pairs.iter().flat_map(|&(s, t)| [s, t]).collect()
            } else {
                groups.iter().flatten().copied().collect()
            };
            // `check` found every talking device; a permute's idle self-pairs may be unknown.
            named.iter().map(|d| t.process_of.get(d).copied().unwrap_or(0)).collect()
        }
        _ => Vec::new(),
    };
    let instance = if crosses {
        match shared_id(&ins.name) {
            Some(i) => i,
            None => {
                d.reason = "across processes, and the module could not be fingerprinted".into();
                return (d, None);
            }
        }
    } else {
        instance.unwrap_or_else(next_instance)
    };
    let call = CustomCallConfig {
        kind: config.op.kind,
        algorithm,
        groups: if config.op.kind == CollectiveKind::CollectivePermute { Vec::new() } else { groups },
        pairs,
        reduction: config.reduction,
        dimension: if config.op.kind == CollectiveKind::AllToAll && config.num_operands > 1 {
            None
        } else {
            config.dimension
        },
        layout: layout.map(|l| l.into_iter().map(|x| x as usize).collect()),
        num_devices: a.devices.iter().copied().max().map_or(0, |m| m + 1),
        instance,
        timeout_ms: cfg.flags.collective_timeout_ms,
        name: ins.name.clone(),
        processes,
        decisions: String::new(),
        // Given by `assign_slots` once every collective is decided.
        slot: None,
        slot_bytes: 0,
        slot_gpu_bytes: 0,
    };
    d.implementation = decision.implementation.to_string();
    d.kernel = true;
    d.reason = decision.reason;
    if call.spans_processes() {
        d.reason.push_str(" (across processes of one host: shared memory)");
    }
    (d, Some(Rewrite { target, call, form }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_walker_rejects_truncated_input() {
        // hlo::wire's tests cover the walker; here its errors reach the pass's.
        let e = has_collectives(&[0x0a, 0x05, 1, 2]).unwrap_err();
        assert!(matches!(&e, PassError::Wire(m) if m.contains("runs past the end")), "{e}");
        assert!(matches!(has_collectives(&[0x0b]), Err(PassError::Wire(_))));
        assert!(has_collectives(&[]).is_ok_and(|x| !x));
    }

    fn two_processes(hosts: &str, job: &str) -> Topology {
        let devices: Vec<String> = (0..8).map(|d| format!("{d}:{}", d / 4)).collect();
        Topology::parse(&format!("this=1;job={job};devices={};hosts={hosts}", devices.join(","))).unwrap()
    }

    fn decide(pb: &[u8], topology: Topology, cross_process: bool) -> (PassDecision, Option<String>) {
        let cfg = PassConfig {
            topology: Some(topology),
            caps: Capabilities { variadic: true, cross_process },
            instance_base: Some(1),
            ..PassConfig::default()
        };
        let out = run(pb, &cfg).unwrap();
        let text = out.module.map(|m| String::from_utf8_lossy(&m).into_owned());
        (out.decisions.into_iter().next().unwrap(), text)
    }

    #[test]
    fn topology_parses_and_rejects() {
        let t = two_processes("0:0,1:0", "00ff00ff");
        assert_eq!(t.process_of.get(&5), Some(&1));
        assert_eq!(t.local_devices().unwrap().into_iter().collect::<Vec<_>>(), [4, 5, 6, 7]);
        assert_eq!(t.job.as_deref(), Some("00ff00ff"));
        assert!(Topology::parse("job=xyz").unwrap_err().contains("hex"));
        assert!(Topology::parse("devices=0:0").unwrap_err().contains("no host"));
        assert!(Topology::parse("devices=0-0;hosts=0:0").unwrap_err().contains("not A:B"));
        assert!(Topology::parse("colour=red").unwrap_err().contains("unknown topology key"));
        assert_eq!(Topology::parse("job=").unwrap().job, None);
        let o = Topology::parse("this=1;devices=0:0,1:1;hosts=0:0,1:0;ordinals=1:0").unwrap();
        assert_eq!(o.ordinals.into_iter().collect::<Vec<_>>(), [(1, 0)]);
    }

    #[test]
    fn groups_across_processes_are_decided_by_host() {
        let all = include_bytes!("../tests/xla_pass/psum_mesh2x4_both.pb");
        let halves = include_bytes!("../tests/xla_pass/psum_mesh2x4_axis_b.pb");
        // One host: the 8-device group meets through shared memory, named by the job.
        let (d, m) = decide(all, two_processes("0:0,1:0", "abcdef0123"), true);
        assert!(d.kernel, "{d}");
        let m = m.unwrap();
        assert!(m.contains("processes = array<i64: 0, 0, 0, 0, 1, 1, 1, 1>"), "{m}");
        // Nothing of the run in the module: another job's token gives the same bytes, so a
        // persistent compilation cache may hand the executable to any job of this layout.
        assert!(!m.contains("abcdef0123") && !m.contains("job"), "{m}");
        let (_, other) = decide(all, two_processes("0:0,1:0", "9999888877776666"), true);
        assert_eq!(other.unwrap(), m);
        // Two hosts: XLA's collective.
        let (d, _) = decide(all, two_processes("0:0,1:1", "abcdef0123"), true);
        assert!(!d.kernel && d.reason.contains("spans hosts"), "{d}");
        // A platform whose handlers stay in one process, or no job token: XLA's.
        let (d, _) = decide(all, two_processes("0:0,1:0", "abcdef0123"), false);
        assert!(!d.kernel && d.reason.contains("do not reach across processes"), "{d}");
        let (d, _) = decide(all, Topology { job: None, ..two_processes("0:0,1:0", "abcdef0123") }, true);
        assert!(!d.kernel && d.reason.contains("no job token"), "{d}");
        // Groups inside each process: as in one process (no processes attribute), on any host layout.
        let (d, m) = decide(halves, two_processes("0:0,1:1", "abcdef0123"), false);
        assert!(d.kernel, "{d}");
        assert!(!m.unwrap().contains("processes ="));
    }

    #[test]
    fn shared_instances_agree_between_processes() {
        let pb = include_bytes!("../tests/xla_pass/psum_f32.pb");
        let fp = fingerprint(pb).unwrap();
        // The same module with another per-process id has the same fingerprint.
        let mut other = Vec::new();
        put_varint(&mut other, hlo_module::ID, 12345);
        for f in fields(pb).unwrap().iter().filter(|f| f.number != hlo_module::ID) {
            other.extend_from_slice(f.raw);
        }
        assert_eq!(fingerprint(&other).unwrap(), fp);
        let a = shared_instance(fp, "all-reduce.1");
        assert_eq!(a, shared_instance(fp, "all-reduce.1"));
        assert_ne!(a, shared_instance(fp, "all-reduce.2"));
        assert_ne!(a, shared_instance(fp ^ 1, "all-reduce.1"));
        assert!(a <= i64::MAX as u64);
    }

    #[test]
    fn calls_carry_their_decisions_and_the_first_the_fallbacks() {
        // A permute ring and a psum; forcing the permute to XLA leaves the psum the only call.
        let pb = include_bytes!("../tests/xla_pass/ppermute_then_psum.pb");
        let mut cfg = PassConfig { instance_base: Some(1), ..PassConfig::default() };
        cfg.flags.apply("--collective_permute_backend=fallback").unwrap();
        let out = run(pb, &cfg).unwrap();
        assert_eq!(out.instances, [1]);
        let kernel = out.decisions.iter().find(|d| d.kernel).unwrap();
        let fallback = out.decisions.iter().find(|d| !d.kernel).unwrap();
        let m = String::from_utf8_lossy(out.module.as_ref().unwrap()).into_owned();
        let escaped = |line: String| line.replace('\t', "\\09").replace('\n', "\\0A");
        assert!(m.contains(&escaped(kernel.report_line() + &fallback.report_line())), "{m}");
        // Both kernels: each call carries its own line, the first also (no) fallbacks.
        let out = run(pb, &PassConfig { instance_base: Some(7), ..PassConfig::default() }).unwrap();
        assert_eq!(out.instances, [7, 8]);
        let m = String::from_utf8_lossy(out.module.as_ref().unwrap()).into_owned();
        for d in &out.decisions {
            assert!(m.contains(&format!("decisions = \"{}\"", escaped(d.report_line()))), "{m}");
        }
    }

    #[test]
    fn the_peer_table_is_made_only_when_a_collective_needs_it() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicUsize;
        let made = Arc::new(AtomicUsize::new(0));
        let m = made.clone();
        let cfg = PassConfig {
            peers: Peers::Lazy(Arc::new(move || {
                m.fetch_add(1, Ordering::SeqCst);
                Arc::new(PeerAccessTable::full(8, "test table"))
            })),
            instance_base: Some(1),
            ..PassConfig::default()
        };
        // Groups of one and the dtype guard decide without peer access: no GPU is opened.
        for pb in [
            &include_bytes!("../tests/xla_pass/psum_one_device.pb")[..],
            include_bytes!("../tests/xla_pass/psum_axis_of_one.pb"),
            include_bytes!("../tests/xla_pass/all_gather_c64.pb"),
            include_bytes!("../tests/xla_pass/no_collective.pb"),
        ] {
            let out = run(pb, &cfg).unwrap();
            assert!(out.decisions.iter().all(|d| !d.kernel), "{:?}", out.decisions);
        }
        assert_eq!(made.load(Ordering::SeqCst), 0);
        // Two collectives that take kernels: the table is made once per run.
        let out = run(include_bytes!("../tests/xla_pass/ppermute_then_psum.pb"), &cfg).unwrap();
        assert_eq!(out.decisions.iter().filter(|d| d.kernel).count(), 2);
        assert_eq!(made.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn staging_beyond_a_quarter_of_free_device_memory_goes_back_to_xla() {
        use std::sync::Arc;
        // Slots of 512 (psum_invariant.18), 512 (the pmax chain) and 1024 bytes (two psums
        // and an all-gather): 2048 bytes of GPU staging in all.
        let pb = include_bytes!("../tests/xla_pass/psum_chains_independent.pb");
        let with = |free: Option<u64>| {
            let cfg = PassConfig {
                instance_base: Some(1),
                device_memory: DeviceMemory(Some(Arc::new(move || free))),
                ..PassConfig::default()
            };
            run(pb, &cfg).unwrap()
        };
        let kernels = |out: &PassOutcome| out.decisions.iter().filter(|d| d.kernel).count();
        assert_eq!(kernels(&with(None)), 6, "unknown free memory: no budget");
        assert_eq!(kernels(&with(Some(4 * 2048))), 6, "exactly within a quarter");
        // A quarter of 6144 is 1536: the largest slot (1024 bytes, three calls) goes back.
        let out = with(Some(6144));
        let back: Vec<&str> = out.decisions.iter().filter(|d| !d.kernel).map(|d| d.instr.as_str()).collect();
        assert_eq!(back, ["psum_invariant.21", "psum_invariant.22", "all_gather.3"], "{:?}", out.decisions);
        let d = out.decisions.iter().find(|d| d.instr == "all_gather.3").unwrap();
        assert!(d.reason.starts_with("staging budget:") && d.reason.contains("0.0 MiB free"), "{}", d.reason);
        let m = String::from_utf8_lossy(out.module.as_ref().unwrap()).into_owned();
        assert!(!m.contains("name = \"all_gather.3\"") && m.contains("name = \"pmax.15\""), "{m}");
        // Nothing free: every slot goes back, and the module is left as it was.
        let out = with(Some(0));
        assert_eq!(kernels(&out), 0);
        assert!(out.module.is_none());
    }

    #[test]
    fn dependencies_order_chains_and_keep_independent_collectives_apart() {
        // Two independent chains (psum, pmax) in the entry, an all-gather after the psums,
        // and a psum in a loop body (see psum_chains_independent.expected for the slots).
        let pb = include_bytes!("../tests/xla_pass/psum_chains_independent.pb");
        let names =
            ["psum_invariant.21", "psum_invariant.22", "pmax.14", "pmax.15", "all_gather.3", "psum_invariant.18"];
        let d = dependencies(pb, &names).unwrap();
        assert!(
            d.precedes("psum_invariant.21", "psum_invariant.22") && d.precedes("psum_invariant.22", "all_gather.3")
        );
        assert!(d.precedes("pmax.14", "pmax.15") && !d.precedes("pmax.15", "pmax.14"));
        for (a, b) in [("psum_invariant.21", "pmax.15"), ("pmax.14", "psum_invariant.22"), ("pmax.15", "all_gather.3")]
        {
            assert!(!d.precedes(a, b) && !d.precedes(b, a), "{a} {b}");
        }
        let entry = d.entry.clone().unwrap();
        assert_eq!(d.ancestors["pmax.14"].0, entry);
        let body = &d.ancestors["psum_invariant.18"].0;
        assert_ne!(body, &entry);
        assert!(d.runs_alone(&entry) && d.runs_alone(body));
    }

    /// `text` encoded by the hlo crate, with an N×1 device assignment.
    fn replicas(text: &str, n: i64) -> Vec<u8> {
        let m = hlo::parse_text("t.hlo", text).unwrap();
        let mut bytes = hlo::encode_proto(&m).unwrap();
        let da = DeviceAssignment {
            replica_count: n as i32,
            computation_count: 1,
            computation_devices: vec![ComputationDevices { replica_device_ids: (0..n).collect() }],
        };
        put_bytes(&mut bytes, 15, &da.encode_to_vec());
        bytes
    }

    #[test]
    fn an_async_tuple_start_becomes_a_call_and_a_tuple_with_fresh_id_and_name() {
        // `st.peerless` is taken, and the start's other users read both tuple elements.
        let text = "HloModule m\n\nENTRY main {\n  x = f32[4]{0} parameter(0)\n  st.peerless = f32[4]{0} negate(x)\n  \
                    st = (f32[4]{0}, f32[4]{0}) collective-permute-start(st.peerless), source_target_pairs={{0,1},{1,0}}\n  \
                    a = f32[4]{0} get-tuple-element(st), index=0\n  dn = f32[4]{0} collective-permute-done(st)\n  \
                    ROOT t = (f32[4]{0}, f32[4]{0}) tuple(dn, a)\n}\n";
        let bytes = replicas(text, 2);
        let out = run(&bytes, &PassConfig { instance_base: Some(1), ..PassConfig::default() }).unwrap();
        assert!(out.decisions[0].kernel, "{}", out.decisions[0]);
        let rewritten = out.module.unwrap();
        // Every id of the module is distinct (XLA's importer requires it).
        let (ids, names) = ids_and_names(&rewritten).unwrap();
        let count = fields(&rewritten)
            .unwrap()
            .iter()
            .filter(|c| c.number == hlo_module::COMPUTATIONS)
            .map(|c| fields(c.payload).unwrap().iter().filter(|i| i.number == computation::INSTRUCTIONS).count())
            .sum::<usize>();
        assert_eq!((ids.len(), names.len()), (count, count));
        let m = hlo::decode_proto("out", &rewritten).unwrap();
        let by_name = |n: &str| m.instrs.values().find(|i| i.name == n).unwrap();
        let call = by_name("st.peerless.1");
        assert_eq!(call.opcode, Opcode::CustomCall);
        assert_eq!(call.attrs.custom_call_target.as_deref(), Some("peerless.collective_permute"));
        assert_eq!(m.instrs[call.operands[0]].name, "st.peerless");
        let st = by_name("st");
        assert_eq!(st.opcode, Opcode::Tuple);
        let operands: Vec<&str> = st.operands.iter().map(|&o| m.instrs[o].name.as_str()).collect();
        assert_eq!(operands, ["st.peerless", "st.peerless.1"]);
        let dn = by_name("dn");
        assert_eq!((dn.opcode, dn.attrs.tuple_index), (Opcode::GetTupleElement, Some(1)));
        assert_eq!(by_name("a").attrs.tuple_index, Some(0));
        // The pass's output has no collective left: a second run changes nothing.
        assert!(run(&rewritten, &PassConfig::default()).unwrap().module.is_none());
    }

    #[test]
    fn pinned_shapes_carry_a_layout_on_every_array() {
        let decode = |b: &[u8]| layouts::Shape::decode(b).unwrap();
        // s32[4,2,3] without a layout gets the row-major one; one with a layout keeps it.
        let mut bare = Vec::new();
        put_varint(&mut bare, hlo::wire::shape::ELEMENT_TYPE, 4);
        put_ints(&mut bare, hlo::wire::shape::DIMENSIONS, [4, 2, 3]);
        let pinned = decode(&with_layout(&bare).unwrap());
        assert_eq!(pinned.layout.unwrap().minor_to_major, [2, 1, 0]);
        let mut laid = bare.clone();
        let mut layout = Vec::new();
        put_ints(&mut layout, hlo::wire::layout::MINOR_TO_MAJOR, [1, 2, 0]);
        put_bytes(&mut laid, hlo::wire::shape::LAYOUT, &layout);
        assert_eq!(with_layout(&laid).unwrap(), laid);
        // A scalar gets an empty layout (present, so XLA sees it set); a tuple's leaves each
        // get theirs; a token none.
        let mut scalar = Vec::new();
        put_varint(&mut scalar, hlo::wire::shape::ELEMENT_TYPE, 11);
        assert!(decode(&with_layout(&scalar).unwrap()).layout.is_some_and(|l| l.minor_to_major.is_empty()));
        let mut tuple = Vec::new();
        put_varint(&mut tuple, hlo::wire::shape::ELEMENT_TYPE, hlo::wire::enums::TUPLE_TYPE);
        put_bytes(&mut tuple, hlo::wire::shape::TUPLE_SHAPES, &bare);
        put_bytes(&mut tuple, hlo::wire::shape::TUPLE_SHAPES, &laid);
        let t = decode(&with_layout(&tuple).unwrap());
        let leaves: Vec<Vec<i64>> = t.tuple_shapes.into_iter().map(|s| s.layout.unwrap().minor_to_major).collect();
        assert_eq!(leaves, [vec![2, 1, 0], vec![1, 2, 0]]);
        let mut token = Vec::new();
        put_varint(&mut token, hlo::wire::shape::ELEMENT_TYPE, hlo::wire::enums::TOKEN_TYPE);
        assert_eq!(with_layout(&token).unwrap(), token);
        // An operand the computation does not hold is an error naming the call.
        let mut ins = Vec::new();
        let err = pin_operands(&mut ins, &[7], &HashMap::new(), "all-to-all.3").unwrap_err();
        assert!(err.to_string().contains("'all-to-all.3': operand 7"), "{err}");
    }

    #[test]
    fn instance_ids_are_distinct_and_positive() {
        let a = next_instance();
        let b = next_instance();
        assert_ne!(a, b);
        assert!(a <= i64::MAX as u64 && b <= i64::MAX as u64);
    }
}
