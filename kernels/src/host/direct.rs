//! The host protocols on plain process memory: what XLA:CPU's FFI handlers run on XLA's
//! own buffers (no arena, no copies of results).
//!
//! XLA:CPU runs each device's program on its own thread, in one address space, so "peer
//! access" is a pointer. The arena-backed [`super::HostCluster`] simulates GPU memory for
//! the standalone host backend; here each rewritten collective ([`DirectCollective`], one
//! per custom call of an executable) owns, per group member, two staging buffers (double
//! buffered by epoch parity, as in `protocol.rs`) and the members' flags. A call:
//!
//! 1. takes the next epoch `e` of its member (counted per member, never reset);
//! 2. copies its operands into its own staging buffer `e % 2` (peers never write XLA's
//!    buffers, and read them only in the two-shot, which publishes its operands' addresses
//!    at barrier 0 instead and keeps them alive until barrier 1; so a rank that returns
//!    early, with a timeout at barrier 0, cannot leave a peer using memory XLA has reused);
//! 3. arrives at barrier 0 and waits for every member of its group (bounded by the call's
//!    timeout; the error names the ranks that never came);
//! 4. computes its own results from the members' staging buffers, in the algorithm the
//!    pass chose: one-shot (reduce every member in fixed order), two-shot (reduce slice
//!    `rank` of every member's operand into its staging, barrier 1, gather the slices in
//!    rotated order), direct
//!    reduce-scatter (reduce block `rank`), direct all-gather / all-to-all (pull, rotated
//!    order), direct permute (the target pulls from its source's staging).
//!
//! Why one barrier suffices (the double-buffering argument of `protocol.rs`): a member
//! writes staging buffer `e % 2` again only at epoch `e + 2`, after passing barrier 0 of
//! `e + 1`, which every peer reaches only after finishing epoch `e`'s reads. A call also
//! checks, before its copy-in, that every member finished epoch `e - 2` (always true after
//! a normal barrier, and what keeps the argument sound after a timeout).
//!
//! A timeout breaks the epoch it happened in: every member waiting in it, and any that
//! arrives for it later, fails with the timeout error; the next epoch starts clean.
//! Waiting members sleep on the group's condition variable (8 device threads may share
//! 2 cores); the last to arrive wakes them.
//!
//! What a collective computes (operands, groups, staging layout, results from staged
//! operands) is its `Plan`, which `shm.rs` shares to run the same collectives between
//! processes.
//!
//! Staging, flags and epochs live in a [`DirectSlot`], which several collectives may share
//! ([`DirectCollective::on_slot`]): the argument above is about the sequence of calls on a
//! slot, not about which collective a call is, so it holds for any collectives that every
//! member calls in the same order, each with its own plan, as long as the slot's buffers hold
//! the largest of their staged messages. Which collectives may share (the pass's rule in
//! `emitter::xla_pass`): same groups (a permute: same pairs), one computation, and each a
//! data-dependency ancestor of the next, so that no device can run two of them at once or in
//! another order. Collectives XLA may run concurrently get different slots.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hlo::ArrayShape;
use thunks::custom_call::host_stage_len;
use thunks::{CollectiveConfig, CollectiveKind as Kind, CollectiveOp, KernelAlgorithm as Algo};

use super::fmt_group;
use super::layout::{Runs, Split, shape_bytes};
use super::reduce::Reducer;
use crate::{Error, Result};

/// A zeroed, 64-byte aligned buffer that members reach through raw pointers; the
/// protocol, not the type system, says who may touch which bytes when.
struct Staging {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Staging` owns its allocation; all access goes through `ptr` under the protocol's
// rules (one writer per byte range per phase, readers only after a barrier that orders them
// after the write), so sharing it between device threads is sound.
unsafe impl Send for Staging {}
// SAFETY: as above.
unsafe impl Sync for Staging {}

/// Staging bytes held by the process's direct collectives now (`peerless.staging_bytes()`).
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Bytes of staging the direct collectives of this process hold now.
pub fn staging_bytes() -> usize {
    HELD.load(Ordering::Relaxed)
}

impl Staging {
    fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Ok(Staging { ptr: NonNull::dangling(), len });
        }
        let alloc = || Error::Alloc { num_devices: 1, arena_bytes: len };
        let layout = Layout::from_size_align(len, 64).map_err(|_| alloc())?;
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or_else(alloc)?;
        HELD.fetch_add(len, Ordering::Relaxed);
        Ok(Staging { ptr, len })
    }

    /// `len` bytes at `at`, shared. Caller: nobody writes them until the borrow ends.
    fn read(&self, at: usize, len: usize) -> &[u8] {
        assert!(at.checked_add(len).is_some_and(|end| end <= self.len), "staging read {at}+{len} of {}", self.len);
        if len == 0 {
            return &[];
        }
        // SAFETY: in bounds (checked above); the protocol guarantees no concurrent writer
        // (module docs: a buffer is written only by its owner, before the barrier its
        // readers wait for, and not again until they have all finished).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(at), len) }
    }

    /// `len` bytes at `at`, exclusive. Caller: the owning member, in its write phase.
    #[allow(clippy::mut_from_ref)]
    fn write(&self, at: usize, len: usize) -> &mut [u8] {
        assert!(at.checked_add(len).is_some_and(|end| end <= self.len), "staging write {at}+{len} of {}", self.len);
        if len == 0 {
            return &mut [];
        }
        // SAFETY: in bounds (checked above); only the owning member writes its buffer, and
        // only while no peer reads it (before barrier 0 of the epoch, or a region peers
        // read only after barrier 1), so this is the only reference to these bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(at), len) }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `new` with this size and alignment, freed once.
            unsafe { dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, 64)) };
            HELD.fetch_sub(self.len, Ordering::Relaxed);
        }
    }
}

/// Arrivals of a set of members (a group, or every device of a permute), under one lock.
#[derive(Debug)]
struct Flags {
    /// `arrived[p][i]`: the latest epoch member `i` arrived at barrier `p` in.
    /// Collective-permute: `arrived[0][d]` = "posted" (device `d` staged epoch e),
    /// `arrived[1][d]` = "consumed" (`d`'s target read it).
    arrived: [Vec<u64>; 2],
    /// The latest epoch a timeout broke (0: none), and the ranks missing then.
    broken: u64,
    missing: Vec<usize>,
    /// Two-shot: each member's operands and results (address, length), published at
    /// barrier 0.
    inputs: Vec<Vec<(usize, usize)>>,
    outputs: Vec<Vec<(usize, usize)>>,
}

struct Rendezvous {
    flags: Mutex<Flags>,
    wake: Condvar,
    /// Per member: its epoch counter (only that member writes it).
    epoch: Vec<AtomicU64>,
    /// Per member: the latest epoch whose reads of peers' staging it has finished.
    finished: Vec<AtomicU64>,
}

impl Rendezvous {
    fn new(n: usize) -> Self {
        Rendezvous {
            flags: Mutex::new(Flags {
                arrived: [vec![0; n], vec![0; n]],
                broken: 0,
                missing: vec![],
                inputs: vec![vec![]; n],
                outputs: vec![vec![]; n],
            }),
            wake: Condvar::new(),
            epoch: (0..n).map(|_| AtomicU64::new(0)).collect(),
            finished: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Flags> {
        self.flags.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `ready(flags)` or the deadline (none: no limit); `Err` on timeout.
    fn wait_until<'a>(
        &'a self,
        mut g: MutexGuard<'a, Flags>,
        deadline: Option<Instant>,
        ready: impl Fn(&Flags) -> bool,
    ) -> Result<MutexGuard<'a, Flags>, MutexGuard<'a, Flags>> {
        while !ready(&g) {
            g = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(g);
                    }
                    self.wake.wait_timeout(g, left).unwrap_or_else(PoisonError::into_inner).0
                }
                None => self.wake.wait(g).unwrap_or_else(PoisonError::into_inner),
            };
        }
        Ok(g)
    }
}

/// One group: its members (device ids, in group order), their staging and flags.
struct Group {
    members: Vec<usize>,
    staging: Vec<[Staging; 2]>,
    sync: Rendezvous,
}

/// One operand of the collective, as every member stages it.
#[derive(Clone, Debug)]
pub(super) struct Operand {
    /// Physical (row-major) shape of the operand.
    pub(super) shape: ArrayShape,
    pub(super) len: usize,
    pub(super) out_len: usize,
    /// Offset in a staging buffer.
    pub(super) stage: usize,
    pub(super) reducer: Option<Reducer>,
    pub(super) split: Option<Split>,
}

/// What a rewritten collective computes, whatever memory its members meet in: the
/// operands and where each lies in a staging buffer, the groups, the permute pairs, and
/// the results computed from members' staged operands. [`DirectCollective`] (device
/// threads of one process) and `shm::ShmCollective` (processes of one host) share it, so
/// the two agree bit for bit.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) op: CollectiveOp,
    pub(super) algorithm: Algo,
    pub(super) name: String,
    pub(super) timeout: Duration,
    pub(super) ops: Vec<Operand>,
    /// Bytes of one staging buffer: every operand at its `stage` offset.
    pub(super) per_buffer: usize,
    /// Each group's members (device ids, in group order); collective-permute: one group
    /// of every device.
    pub(super) group_members: Vec<Vec<usize>>,
    /// Device id → (group index, member index).
    pub(super) rank_of: Vec<Option<(usize, usize)>>,
    /// Collective-permute: device id → its source and its target.
    pub(super) pairs: Vec<(Option<usize>, Option<usize>)>,
}

/// Staging (two buffers per member), flags and epochs of a set of groups: what one
/// collective, or a chain of collectives that every member runs in one order, meets in.
pub struct DirectSlot {
    groups: Vec<Group>,
    /// Bytes of each staging buffer.
    per_buffer: usize,
}

impl std::fmt::Debug for DirectSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectSlot")
            .field("groups", &self.groups.iter().map(|g| &g.members).collect::<Vec<_>>())
            .field("per_buffer", &self.per_buffer)
            .finish()
    }
}

impl DirectSlot {
    /// A slot for `groups` (device ids; a permute's: every device) with staging buffers of
    /// `per_buffer` bytes, zeroed; epochs start at 0.
    pub fn new(groups: &[Vec<usize>], per_buffer: usize) -> Result<Self> {
        let groups = groups
            .iter()
            .map(|members| {
                let staging = members
                    .iter()
                    .map(|_| Ok([Staging::new(per_buffer)?, Staging::new(per_buffer)?]))
                    .collect::<Result<Vec<_>>>()?;
                Ok(Group { sync: Rendezvous::new(members.len()), members: members.clone(), staging })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DirectSlot { groups, per_buffer })
    }

    /// Bytes of each staging buffer.
    pub fn per_buffer(&self) -> usize {
        self.per_buffer
    }

    /// Staging bytes the slot holds (every member's two buffers).
    pub fn bytes(&self) -> usize {
        self.groups.iter().map(|g| g.members.len()).sum::<usize>().saturating_mul(2 * self.per_buffer)
    }

    fn same_groups(&self, groups: &[Vec<usize>]) -> bool {
        self.groups.len() == groups.len() && self.groups.iter().zip(groups).all(|(g, m)| &g.members == m)
    }
}

/// One rewritten collective of an executable, shared by the device threads that run it: its
/// plan, on a slot of its own or shared with the collectives it is chained with.
pub struct DirectCollective {
    plan: Plan,
    slot: Arc<DirectSlot>,
}

impl std::fmt::Debug for DirectCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectCollective")
            .field("op", &self.plan.op)
            .field("algorithm", &self.plan.algorithm)
            .field("name", &self.plan.name)
            .finish_non_exhaustive()
    }
}

/// Copies run by run from `src` into `dst` (same row count and length).
fn copy_runs(src: &[u8], s: Runs, dst: &mut [u8], d: Runs) {
    for (a, b) in s.starts(0).zip(d.starts(0)) {
        dst[b..b + d.row].copy_from_slice(&src[a..a + s.row]);
    }
}

impl Plan {
    /// The plan of `config` (groups and pairs are device ids below `num_devices`), run
    /// with `algorithm` on operands of the given physical shapes.
    pub(super) fn new(
        config: &CollectiveConfig,
        algorithm: Algo,
        shapes: &[ArrayShape],
        num_devices: usize,
        timeout: Duration,
        name: &str,
    ) -> Result<Self> {
        let op = config.op;
        let invalid = |reason: String| Error::Invalid { collective: name.to_string(), op, rank: 0, reason };
        let unsupported = |reason: String| Error::Unsupported { collective: name.to_string(), op, rank: 0, reason };
        let computes = match algorithm {
            Algo::OneShotAllReduce | Algo::TwoShotAllReduce => Kind::AllReduce,
            Algo::DirectAllGather => Kind::AllGather,
            Algo::DirectAllToAll => Kind::AllToAll,
            Algo::DirectReduceScatter => Kind::ReduceScatter,
            Algo::DirectPermute => Kind::CollectivePermute,
        };
        if computes != op.kind {
            return Err(invalid(format!("{} does not compute {op}", algorithm.name())));
        }

        // Groups (device ids) and each device's place in them.
        let mut rank_of = vec![None; num_devices];
        let mut pairs = vec![(None, None); num_devices];
        let groups: Vec<Vec<usize>> = if op.kind == Kind::CollectivePermute {
            for &(s, t) in &config.source_target_pairs {
                if s >= num_devices || t >= num_devices {
                    return Err(invalid(format!("source-target pair {s}->{t} names a device >= {num_devices}")));
                }
                if pairs[s].1.replace(t).is_some() || pairs[t].0.replace(s).is_some() {
                    return Err(invalid(format!("source-target pairs repeat source {s} or target {t}")));
                }
            }
            for (d, r) in rank_of.iter_mut().enumerate() {
                *r = Some((0, d));
            }
            vec![(0..num_devices).collect()]
        } else {
            for (gi, g) in config.groups.iter().enumerate() {
                for (i, &d) in g.iter().enumerate() {
                    match rank_of.get_mut(d) {
                        Some(r @ None) => *r = Some((gi, i)),
                        _ => {
                            return Err(invalid(format!(
                                "replica group {} names device {d} twice or out of range",
                                fmt_group(g)
                            )));
                        }
                    }
                }
            }
            config.groups.clone()
        };

        // Operands, and how results relate to them.
        let mut ops = Vec::with_capacity(shapes.len());
        let mut stage = 0usize;
        let dim = config.dimension.unwrap_or(0);
        let g_of = |j: usize| groups.get(j).map_or(1, Vec::len);
        let g = g_of(0);
        if groups.iter().any(|m| m.len() != g) {
            return Err(invalid("replica groups differ in size".into()));
        }
        for (j, shape) in shapes.iter().enumerate() {
            let len = shape_bytes(shape).ok_or_else(|| invalid(format!("operand {j}'s shape {shape} has no size")))?;
            if shape.ty.byte_size() == 0 {
                return Err(invalid(format!("operand {j} has element type {}, which has no bytes", shape.ty)));
            }
            let reducer = match op.kind {
                Kind::AllReduce | Kind::ReduceScatter => {
                    let kind = config.reduction.ok_or_else(|| unsupported("reduction not recognised".into()))?;
                    Some(Reducer::new(shape.ty, kind).map_err(unsupported)?)
                }
                _ => None,
            };
            let (split, out_len) = match op.kind {
                Kind::AllReduce | Kind::CollectivePermute => (None, len),
                Kind::AllGather => (Some(Split::new(shape, dim, len).map_err(invalid)?), len.saturating_mul(g)),
                Kind::ReduceScatter => {
                    let s = Split::new(shape, dim, len).map_err(invalid)?;
                    s.check_blocks(g, shape, dim).map_err(invalid)?;
                    (Some(s), len / g.max(1))
                }
                Kind::AllToAll if config.dimension.is_some() => {
                    if shapes.len() != 1 {
                        return Err(invalid(format!("array all-to-all with {} operands", shapes.len())));
                    }
                    let s = Split::new(shape, dim, len).map_err(invalid)?;
                    s.check_blocks(g, shape, dim).map_err(invalid)?;
                    (Some(s), len)
                }
                Kind::AllToAll => {
                    if shapes.len() != g || shapes.iter().any(|s| shape_bytes(s) != Some(len)) {
                        return Err(invalid(format!(
                            "tuple all-to-all needs {g} operands of one size, not {} operands",
                            shapes.len()
                        )));
                    }
                    (None, len)
                }
                Kind::RaggedAllToAll | Kind::CollectiveBroadcast => {
                    return Err(unsupported(format!("the host backend has no {op}")));
                }
            };
            ops.push(Operand { shape: shape.clone(), len, out_len, stage, reducer, split });
            // `CustomCallConfig::host_staging_bytes`'s rule (the pass sizes slots by it).
            stage = stage.saturating_add(host_stage_len(len));
        }
        if ops.is_empty() {
            return Err(invalid("a collective needs an operand".into()));
        }
        Ok(Plan {
            op,
            algorithm,
            name: name.to_string(),
            timeout,
            ops,
            per_buffer: stage,
            group_members: groups,
            rank_of,
            pairs,
        })
    }

    /// Bytes each result buffer must have (for the caller's checks).
    pub(super) fn output_lens(&self) -> Vec<usize> {
        self.ops.iter().map(|o| o.out_len).collect()
    }

    pub(super) fn invalid(&self, rank: usize, reason: String) -> Error {
        Error::Invalid { collective: self.name.clone(), op: self.op, rank, reason }
    }

    pub(super) fn timeout_error(&self, group: &[usize], rank: usize, missing: Vec<usize>) -> Error {
        Error::Timeout {
            collective: self.name.clone(),
            op: self.op,
            group: group.to_vec(),
            waiting_rank: rank,
            missing,
            timeout: self.timeout,
        }
    }

    /// Checks one call of device `device` against the plan; its (group index, member
    /// index).
    pub(super) fn check_call(&self, device: usize, inputs: &[&[u8]], outputs: &[&mut [u8]]) -> Result<(usize, usize)> {
        let Some(&Some((gi, idx))) = self.rank_of.get(device) else {
            return Err(self.invalid(device, format!("device {device} is in no group of this collective")));
        };
        if inputs.len() != self.ops.len() || outputs.len() != self.ops.len() {
            return Err(self.invalid(
                device,
                format!("{} operands and {} results for {} operands", inputs.len(), outputs.len(), self.ops.len()),
            ));
        }
        for (j, o) in self.ops.iter().enumerate() {
            if inputs[j].len() != o.len || outputs[j].len() != o.out_len {
                return Err(self.invalid(
                    device,
                    format!(
                        "operand {j}: {} bytes in, {} out; the collective needs {} and {}",
                        inputs[j].len(),
                        outputs[j].len(),
                        o.len,
                        o.out_len
                    ),
                ));
            }
        }
        Ok((gi, idx))
    }

    /// Member `idx`'s results, for a group of `g`, from the members' staged operands:
    /// `member(k, at, len)` is `len` bytes at `at` of member `k`'s staging buffer of this
    /// epoch. For the algorithms that read staging only (one-shot all-reduce, direct
    /// reduce-scatter, all-gather and all-to-all); the two-shot and the permute are their
    /// callers' own.
    pub(super) fn compute<'a>(
        &self,
        algorithm: Algo,
        idx: usize,
        g: usize,
        member: impl Fn(usize, usize, usize) -> &'a [u8],
        outputs: &mut [&mut [u8]],
    ) {
        match algorithm {
            Algo::OneShotAllReduce => {
                for (o, out) in self.ops.iter().zip(outputs.iter_mut()) {
                    let Some(red) = o.reducer else { continue };
                    let m: Vec<&[u8]> = (0..g).map(|k| member(k, o.stage, o.len)).collect();
                    red.reduce(&m, out);
                }
            }
            Algo::DirectReduceScatter => {
                for (o, out) in self.ops.iter().zip(outputs.iter_mut()) {
                    let (Some(red), Some(s)) = (o.reducer, o.split) else { continue };
                    let (src, dst) = (s.block(g, idx), s.block_dense(g));
                    for (a, b) in src.starts(o.stage).zip(dst.starts(0)) {
                        let m: Vec<&[u8]> = (0..g).map(|k| member(k, a, src.row)).collect();
                        red.reduce(&m, &mut out[b..b + dst.row]);
                    }
                }
            }
            Algo::DirectAllGather => {
                for i in 0..g {
                    let k = (idx + i) % g;
                    for (o, out) in self.ops.iter().zip(outputs.iter_mut()) {
                        let Some(s) = o.split else { continue };
                        copy_runs(member(k, o.stage, o.len), s.whole(), out, s.gathered(g, k));
                    }
                }
            }
            Algo::DirectAllToAll => {
                for i in 0..g {
                    let k = (idx + i) % g;
                    match self.ops.first().and_then(|o| o.split) {
                        // Array form: my block k is member k's block `idx`.
                        Some(s) => {
                            let o = &self.ops[0];
                            copy_runs(member(k, o.stage, o.len), s.block(g, idx), outputs[0], s.block(g, k));
                        }
                        // Tuple form: my result k is member k's operand `idx`.
                        None => {
                            let src = &self.ops[idx];
                            outputs[k].copy_from_slice(member(k, src.stage, src.len));
                        }
                    }
                }
            }
            Algo::TwoShotAllReduce | Algo::DirectPermute => {
                unreachable!("{algorithm} computes outside Plan::compute")
            }
        }
    }
}

impl DirectCollective {
    /// A collective for `config` (groups and pairs are device ids below `num_devices`),
    /// run with `algorithm` on operands of the given physical shapes.
    pub fn new(
        config: &CollectiveConfig,
        algorithm: Algo,
        shapes: &[ArrayShape],
        num_devices: usize,
        timeout: Duration,
        name: &str,
    ) -> Result<Self> {
        Self::on_slot(config, algorithm, shapes, num_devices, timeout, name, |groups, bytes| {
            DirectSlot::new(groups, bytes).map(Arc::new)
        })
    }

    /// A collective like [`DirectCollective::new`], on the slot `slot(groups, bytes)` returns
    /// for its groups (device ids) and staged bytes: a new one, or one shared with the
    /// collectives every member runs in order with this one (the caller's promise, on
    /// which the protocols' correctness rests). The slot must have exactly these groups and
    /// buffers of at least `bytes`.
    pub fn on_slot(
        config: &CollectiveConfig,
        algorithm: Algo,
        shapes: &[ArrayShape],
        num_devices: usize,
        timeout: Duration,
        name: &str,
        slot: impl FnOnce(&[Vec<usize>], usize) -> Result<Arc<DirectSlot>>,
    ) -> Result<Self> {
        let plan = Plan::new(config, algorithm, shapes, num_devices, timeout, name)?;
        // Staging holds each operand at `stage` (the two-shot, which works in XLA's buffers,
        // leaves its share of a slot it may have with other collectives unused).
        let memory = |source| Error::Memory { collective: plan.name.clone(), op: plan.op, source: Box::new(source) };
        let slot = slot(&plan.group_members, plan.per_buffer).map_err(memory)?;
        if !slot.same_groups(&plan.group_members) || slot.per_buffer < plan.per_buffer {
            return Err(plan.invalid(
                0,
                format!(
                    "its staging slot ({:?}) does not fit its groups {:?} and {} staged bytes",
                    slot, plan.group_members, plan.per_buffer
                ),
            ));
        }
        Ok(DirectCollective { plan, slot })
    }

    /// Bytes of one staging buffer this collective needs.
    pub fn staged_bytes(&self) -> usize {
        self.plan.per_buffer
    }

    /// Bytes each result buffer must have (for the caller's checks).
    pub fn output_lens(&self) -> Vec<usize> {
        self.plan.output_lens()
    }

    /// Runs device `device`'s side of one call: `inputs` are its operands, `outputs` its
    /// result buffers (XLA's), in operand order.
    pub fn run(&self, device: usize, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        let (gi, idx) = self.plan.check_call(device, inputs, outputs)?;
        let deadline = Instant::now() + self.plan.timeout;
        let group = &self.slot.groups[gi];
        let sync = &group.sync;
        let e = sync.epoch[idx].load(Ordering::Relaxed) + 1;
        sync.epoch[idx].store(e, Ordering::Relaxed);
        // However the call ends, this member is done reading peers' buffers of epoch `e`.
        struct Finish<'a>(&'a AtomicU64, u64);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                self.0.store(self.1, Ordering::Release);
            }
        }
        let _finish = Finish(&sync.finished[idx], e);
        if self.plan.op.kind == Kind::CollectivePermute {
            return self.permute(group, device, e, deadline, inputs, outputs);
        }
        self.wait_finished(group, idx, e, deadline)?;
        let own = &group.staging[idx][(e % 2) as usize];
        // The two-shot works in peers' XLA buffers: each member reduces its slice of every
        // operand straight from peers' operands and writes the sum into every member's result
        // (one read and one write of each byte, where staging the slices and gathering them
        // again costs a second read and write). Its barrier 1, which no member passes before
        // every member finished, keeps those buffers alive. The others stage their operands.
        let in_place = self.plan.algorithm == Algo::TwoShotAllReduce;
        let published = in_place.then(|| {
            let ins: Vec<(usize, usize)> = inputs.iter().map(|b| (b.as_ptr() as usize, b.len())).collect();
            // Addresses taken from the results' own `&mut`: from here to barrier 1 this member
            // touches its results only through them (see `peer_output`).
            let outs: Vec<(usize, usize)> = outputs.iter_mut().map(|b| (b.as_mut_ptr() as usize, b.len())).collect();
            (ins, outs)
        });
        if !in_place {
            for (o, x) in self.plan.ops.iter().zip(inputs) {
                own.write(o.stage, o.len).copy_from_slice(x);
            }
        }
        self.barrier(group, 0, idx, e, Some(deadline), published)?;
        let par = (e % 2) as usize;
        let g = group.members.len();
        let member = |k: usize, at: usize, len: usize| group.staging[k][par].read(at, len);
        match self.plan.algorithm {
            Algo::TwoShotAllReduce => {
                let (ins, outs) = {
                    let f = group.sync.lock();
                    (f.inputs.clone(), f.outputs.clone())
                };
                let reduce = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    for (j, o) in self.plan.ops.iter().enumerate() {
                        let Some(red) = o.reducer else { continue };
                        let (lo, hi) = slice(o, g, idx);
                        let m: Vec<&[u8]> = ins.iter().map(|t| peer_input(&t[j], lo, hi)).collect();
                        let mine = peer_output(&outs[idx][j], lo, hi);
                        red.reduce(&m, mine);
                        for i in 1..g {
                            peer_output(&outs[(idx + i) % g][j], lo, hi).copy_from_slice(mine);
                        }
                    }
                }));
                // Not bounded: every member passed barrier 0, so each arrives after its reads
                // and writes (a panic included), and none may leave while a peer still reads
                // its operand or writes its result.
                self.barrier(group, 1, idx, e, None, None)?;
                if let Err(p) = reduce {
                    std::panic::resume_unwind(p);
                }
            }
            algo => self.plan.compute(algo, idx, g, member, outputs),
        }
        Ok(())
    }

    /// Before writing staging buffer `e % 2`: every member finished epoch `e - 2`.
    fn wait_finished(&self, group: &Group, idx: usize, e: u64, deadline: Instant) -> Result<()> {
        let behind = || -> Vec<usize> {
            (group.sync.finished.iter().enumerate())
                .filter(|(_, f)| f.load(Ordering::Acquire).saturating_add(2) < e)
                .map(|(k, _)| group.members[k])
                .collect()
        };
        loop {
            let missing = behind();
            if missing.is_empty() {
                return Ok(());
            }
            // Only after a timeout can a member still be in epoch e - 2.
            if Instant::now() >= deadline {
                return Err(self.plan.timeout_error(&group.members, group.members[idx], missing));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Arrives at barrier `p` of epoch `e` (publishing a two-shot's operands and results as
    /// (address, length)) and waits for the whole group, until `deadline` (none: every
    /// member is known to be coming).
    fn barrier(
        &self,
        group: &Group,
        p: usize,
        idx: usize,
        e: u64,
        deadline: Option<Instant>,
        published: Option<(Vec<(usize, usize)>, Vec<(usize, usize)>)>,
    ) -> Result<()> {
        let sync = &group.sync;
        let mut f = sync.lock();
        if f.broken >= e {
            return Err(self.broken(group, idx, &f));
        }
        if let Some((ins, outs)) = published {
            f.inputs[idx] = ins;
            f.outputs[idx] = outs;
        }
        f.arrived[p][idx] = e;
        let ready = |f: &Flags| f.broken >= e || f.arrived[p].iter().all(|&a| a >= e);
        if ready(&f) {
            drop(f);
            sync.wake.notify_all();
            return Ok(());
        }
        match sync.wait_until(f, deadline, ready) {
            Ok(f) if f.broken < e => Ok(()),
            Ok(f) => Err(self.broken(group, idx, &f)),
            Err(mut f) => {
                f.broken = f.broken.max(e);
                f.missing =
                    (f.arrived[p].iter().enumerate()).filter(|(_, a)| **a < e).map(|(k, _)| group.members[k]).collect();
                let err = self.broken(group, idx, &f);
                drop(f);
                sync.wake.notify_all();
                Err(err)
            }
        }
    }

    /// The timeout error of a broken epoch: the ranks that had not arrived when it broke.
    fn broken(&self, group: &Group, idx: usize, f: &Flags) -> Error {
        self.plan.timeout_error(&group.members, group.members[idx], f.missing.clone())
    }

    /// Collective-permute: a source stages its operand and posts it; its target waits for
    /// the post, pulls, and marks it consumed; devices nothing targets write zeros.
    fn permute(
        &self,
        group: &Group,
        d: usize,
        e: u64,
        deadline: Instant,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<()> {
        let (source, target) = self.plan.pairs[d];
        let sync = &group.sync;
        let par = (e % 2) as usize;
        let pair_timeout = |peer: usize| self.plan.timeout_error(&[d.min(peer), d.max(peer)], d, vec![peer]);
        if let Some(t) = target.filter(|&t| t != d) {
            // My staging buffer `e % 2` is free once my target consumed epoch e - 2.
            let f = sync.lock();
            let f = sync
                .wait_until(f, Some(deadline), |f| f.arrived[1][d].saturating_add(2) >= e)
                .map_err(|_| pair_timeout(t))?;
            drop(f);
            for (o, x) in self.plan.ops.iter().zip(inputs) {
                group.staging[d][par].write(o.stage, o.len).copy_from_slice(x);
            }
            sync.lock().arrived[0][d] = e;
            sync.wake.notify_all();
        }
        match source {
            Some(s) if s == d => {
                for (x, out) in inputs.iter().zip(outputs.iter_mut()) {
                    out.copy_from_slice(x);
                }
            }
            Some(s) => {
                let f = sync.lock();
                let waited = sync.wait_until(f, Some(deadline), |f| f.arrived[0][s] >= e);
                let mut f = match waited {
                    Ok(f) => {
                        drop(f);
                        for (o, out) in self.plan.ops.iter().zip(outputs.iter_mut()) {
                            out.copy_from_slice(group.staging[s][par].read(o.stage, o.len));
                        }
                        sync.lock()
                    }
                    Err(f) => f,
                };
                // Consumed (or given up on): my source may reuse the buffer at e + 2.
                let timed_out = f.arrived[0][s] < e;
                f.arrived[1][s] = f.arrived[1][s].max(e);
                drop(f);
                sync.wake.notify_all();
                if timed_out {
                    return Err(pair_timeout(s));
                }
            }
            None => outputs.iter_mut().for_each(|o| o.fill(0)),
        }
        Ok(())
    }
}

/// Bytes `lo..hi` of a peer's operand published at barrier 0 as (address, length).
fn peer_input(entry: &(usize, usize), lo: usize, hi: usize) -> &[u8] {
    let (addr, len) = *entry;
    assert!(lo <= hi && hi <= len, "peer operand range {lo}..{hi} of {len}");
    if lo == hi {
        return &[];
    }
    // SAFETY: the owner published its XLA operand (valid for its call, never written during
    // it) at barrier 0 of this epoch and cannot return before barrier 1, which this member
    // reaches only after its last use of the slice (the reduce phase; the borrow checker
    // cannot see the barrier, so callers keep these slices inside that phase); the range is
    // in bounds (checked).
    unsafe { std::slice::from_raw_parts((addr as *const u8).add(lo), hi - lo) }
}

/// Bytes `lo..hi` of a member's result published at barrier 0 as (address, length), for
/// the member that owns two-shot slice `lo..hi` to write.
#[allow(clippy::mut_from_ref)]
fn peer_output(entry: &(usize, usize), lo: usize, hi: usize) -> &mut [u8] {
    let (addr, len) = *entry;
    assert!(lo <= hi && hi <= len, "peer result range {lo}..{hi} of {len}");
    if lo == hi {
        return &mut [];
    }
    // SAFETY: the owner published its XLA result buffer (valid for its call, and disjoint
    // from every operand: the custom call declares no aliasing) at barrier 0 of this epoch,
    // took the address from its own `&mut` and does not touch the buffer again before
    // barrier 1, which it cannot pass before this member's last write (the reduce phase; the
    // slice never leaves it). Slices of different members are disjoint, so no two members
    // write one byte, and nobody reads the range before barrier 1 orders the write before
    // it. The range is in bounds (checked).
    unsafe { std::slice::from_raw_parts_mut((addr as *mut u8).add(lo), hi - lo) }
}

/// Byte range of two-shot slice `k` of `g` of operand `o`: `ceil(n / g)` elements each,
/// the last ones shorter or empty.
fn slice(o: &Operand, g: usize, k: usize) -> (usize, usize) {
    let eb = o.shape.ty.byte_size().max(1);
    let n = o.len / eb;
    let s = n.div_ceil(g.max(1));
    ((k * s).min(n) * eb, ((k + 1) * s).min(n) * eb)
}

#[cfg(test)]
mod tests {
    use std::thread;

    use hlo::PrimitiveType as T;
    use hlo::analysis::ReductionKind;

    use super::*;

    fn config(kind: Kind, groups: Vec<Vec<usize>>, dimension: Option<usize>, n_ops: usize) -> CollectiveConfig {
        CollectiveConfig {
            op: CollectiveOp { kind, is_async: false },
            groups,
            element_type: T::S32,
            reduction: Some(ReductionKind::Sum),
            bytes_per_device: 0,
            dimension,
            source_target_pairs: vec![],
            num_operands: n_ops,
        }
    }

    fn ints(v: impl IntoIterator<Item = i32>) -> Vec<u8> {
        v.into_iter().flat_map(i32::to_le_bytes).collect()
    }

    /// Runs `calls` calls on every device of `c` at once; device d's operand j is
    /// `input(d, j)`. Returns each device's results of the last call.
    fn run_all(
        c: &DirectCollective,
        n: usize,
        calls: usize,
        input: impl Fn(usize, usize) -> Vec<u8> + Sync,
    ) -> Vec<Vec<Vec<u8>>> {
        thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|d| {
                    let input = &input;
                    s.spawn(move || {
                        let ins: Vec<Vec<u8>> = (0..c.plan.ops.len()).map(|j| input(d, j)).collect();
                        let mut outs: Vec<Vec<u8>> = c.output_lens().into_iter().map(|l| vec![0xAA; l]).collect();
                        for _ in 0..calls {
                            let i: Vec<&[u8]> = ins.iter().map(Vec::as_slice).collect();
                            let mut o: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
                            c.run(d, &i, &mut o).unwrap();
                        }
                        outs
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    const T10: Duration = Duration::from_secs(10);

    #[test]
    fn all_reduce_one_and_two_shot_in_groups() {
        for algo in [Algo::OneShotAllReduce, Algo::TwoShotAllReduce] {
            let cfg = config(Kind::AllReduce, vec![vec![0, 2], vec![3, 1]], None, 2);
            let shapes = [ArrayShape::new(T::S32, vec![5]), ArrayShape::new(T::S32, vec![3])];
            let c = DirectCollective::new(&cfg, algo, &shapes, 4, T10, "ar").unwrap();
            let outs = run_all(&c, 4, 5, |d, j| ints((0..[5, 3][j]).map(|i| (d as i32 + 1) * 10 + i)));
            for (d, o) in outs.iter().enumerate() {
                let peer = [2, 3, 0, 1][d];
                let want = |j: usize| ints((0..[5, 3][j]).map(|i| (d as i32 + 1) * 10 + (peer + 1) * 10 + 2 * i));
                assert_eq!(o, &vec![want(0), want(1)], "{algo:?} device {d}");
            }
        }
    }

    #[test]
    fn gather_scatter_all_to_all_and_permute() {
        let n = 4;
        // All-gather along dimension 1 of a [2, 2] operand.
        let cfg = config(Kind::AllGather, vec![vec![0, 1, 2, 3]], Some(1), 1);
        let c =
            DirectCollective::new(&cfg, Algo::DirectAllGather, &[ArrayShape::new(T::S32, vec![2, 2])], n, T10, "ag")
                .unwrap();
        let outs = run_all(&c, n, 3, |d, _| ints((0..4).map(|i| d as i32 * 100 + i)));
        let want = ints((0..2).flat_map(|r| (0..4).flat_map(move |d| [d * 100 + 2 * r, d * 100 + 2 * r + 1])));
        assert!(outs.iter().all(|o| o[0] == want));
        // Reduce-scatter of 8 elements.
        let cfg = config(Kind::ReduceScatter, vec![vec![0, 1, 2, 3]], Some(0), 1);
        let c =
            DirectCollective::new(&cfg, Algo::DirectReduceScatter, &[ArrayShape::new(T::S32, vec![8])], n, T10, "rs")
                .unwrap();
        let outs = run_all(&c, n, 3, |d, _| ints((0..8).map(|i| i * (d as i32 + 1))));
        for (d, o) in outs.iter().enumerate() {
            assert_eq!(o[0], ints((2 * d as i32..2 * d as i32 + 2).map(|i| i * 10)));
        }
        // Array all-to-all.
        let cfg = config(Kind::AllToAll, vec![vec![0, 1, 2, 3]], Some(0), 1);
        let c = DirectCollective::new(&cfg, Algo::DirectAllToAll, &[ArrayShape::new(T::S32, vec![4])], n, T10, "a2a")
            .unwrap();
        let outs = run_all(&c, n, 3, |d, _| ints((0..4).map(|i| d as i32 * 10 + i)));
        for (d, o) in outs.iter().enumerate() {
            assert_eq!(o[0], ints((0..4).map(|k| k * 10 + d as i32)));
        }
        // Tuple all-to-all.
        let c = DirectCollective::new(
            &config(Kind::AllToAll, vec![vec![0, 1, 2, 3]], None, 4),
            Algo::DirectAllToAll,
            &vec![ArrayShape::new(T::S32, vec![1]); 4],
            n,
            T10,
            "a2a_tuple",
        )
        .unwrap();
        let outs = run_all(&c, n, 3, |d, j| ints([d as i32 * 10 + j as i32]));
        for (d, o) in outs.iter().enumerate() {
            assert_eq!(o, &(0..4).map(|k| ints([k * 10 + d as i32])).collect::<Vec<_>>());
        }
        // Permute: 0→1, 1→2, 2→2; device 0 and 3 get no source (zeros).
        let mut cfg = config(Kind::CollectivePermute, vec![], None, 1);
        cfg.source_target_pairs = vec![(0, 1), (1, 2), (3, 0)];
        let c = DirectCollective::new(&cfg, Algo::DirectPermute, &[ArrayShape::new(T::S32, vec![2])], n, T10, "cp")
            .unwrap();
        let outs = run_all(&c, n, 5, |d, _| ints([d as i32, 7]));
        assert_eq!(
            outs.iter().map(|o| o[0].clone()).collect::<Vec<_>>(),
            vec![ints([3, 7]), ints([0, 7]), ints([1, 7]), ints([0, 0])]
        );
    }

    #[test]
    fn chained_collectives_share_one_slot() {
        // An all-reduce (one- and two-shot), an all-gather and a reduce-scatter of other
        // sizes, called in one order by every member, on one slot sized for the largest.
        let n = 4;
        let members = vec![vec![0, 1, 2, 3]];
        let slot = Arc::new(DirectSlot::new(&members, 64 * 8).unwrap());
        let on = |kind, algo, dim, shape: Vec<i64>| {
            let cfg = config(kind, members.clone(), dim, 1);
            let s = ArrayShape::new(T::S32, shape);
            DirectCollective::on_slot(&cfg, algo, &[s], n, T10, "c", |_, _| Ok(Arc::clone(&slot))).unwrap()
        };
        let chain = [
            on(Kind::AllReduce, Algo::OneShotAllReduce, None, vec![100]),
            on(Kind::AllGather, Algo::DirectAllGather, Some(0), vec![3]),
            on(Kind::AllReduce, Algo::TwoShotAllReduce, None, vec![128]),
            on(Kind::ReduceScatter, Algo::DirectReduceScatter, Some(0), vec![8]),
        ];
        assert_eq!(slot.bytes(), n * 2 * 512);
        let outs: Vec<Vec<Vec<u8>>> = thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|d| {
                    let chain = &chain;
                    s.spawn(move || {
                        let mut last = vec![];
                        for round in 0..50i32 {
                            last.clear();
                            for c in chain {
                                let len = c.plan.ops[0].len / 4;
                                let x = ints((0..len as i32).map(|i| i + d as i32 * 1000 + round));
                                let mut out = vec![0u8; c.output_lens()[0]];
                                c.run(d, &[&x], &mut [&mut out]).unwrap();
                                last.push(out);
                            }
                        }
                        last
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let r = 49;
        for (d, o) in outs.iter().enumerate() {
            assert_eq!(o[0], ints((0..100).map(|i| 4 * (i + r) + 6000)));
            assert_eq!(o[1], ints((0..4).flat_map(|k| (0..3).map(move |i| i + k * 1000 + r))));
            assert_eq!(o[2], ints((0..128).map(|i| 4 * (i + r) + 6000)));
            let lo = 2 * d as i32;
            assert_eq!(o[3], ints((lo..lo + 2).map(|i| 4 * (i + r) + 6000)));
        }
        // A slot of other groups or too small is refused.
        let cfg = config(Kind::AllReduce, vec![vec![0, 1], vec![2, 3]], None, 1);
        let big = [ArrayShape::new(T::S32, vec![100])];
        assert!(
            DirectCollective::on_slot(&cfg, Algo::OneShotAllReduce, &big, n, T10, "x", |_, _| Ok(Arc::clone(&slot)))
                .is_err()
        );
        let cfg = config(Kind::AllReduce, members.clone(), None, 1);
        let huge = [ArrayShape::new(T::S32, vec![1000])];
        assert!(
            DirectCollective::on_slot(&cfg, Algo::OneShotAllReduce, &huge, n, T10, "x", |_, _| Ok(Arc::clone(&slot)))
                .is_err()
        );
    }

    #[test]
    fn a_missing_rank_times_out_and_the_next_epoch_is_clean() {
        for algo in [Algo::OneShotAllReduce, Algo::TwoShotAllReduce] {
            let cfg = config(Kind::AllReduce, vec![vec![0, 1]], None, 1);
            let shape = [ArrayShape::new(T::S32, vec![3])];
            let c = DirectCollective::new(&cfg, algo, &shape, 2, Duration::from_millis(50), "ar").unwrap();
            let x = ints([1, 2, 3]);
            let mut r = vec![0u8; 12];
            let e = c.run(0, &[&x], &mut [&mut r]).unwrap_err().to_string();
            assert!(e.contains("timed out") && e.contains("[1]") && e.contains("{0,1}"), "{algo:?}: {e}");
            // The late rank fails its call of the broken epoch too, without waiting.
            let t = Instant::now();
            assert!(c.run(1, &[&x], &mut [&mut r]).is_err());
            assert!(t.elapsed() < Duration::from_millis(40));
            // Both then agree again.
            let outs = run_all(&c, 2, 3, |_, _| ints([1, 2, 3]));
            assert!(outs.iter().all(|o| o[0] == ints([2, 4, 6])), "{algo:?}");
        }
    }
}
