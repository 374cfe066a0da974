//! The host protocol, written once over two meeting places: what a rewritten collective computes ([`Plan`]) and how its
//! members meet to compute it ([`run`]), whatever memory they meet in ([`Place`]): the device threads of one process
//! ([`super::direct`]) or the processes of one host ([`super::shm`]). The places differ only in where staging and flag
//! words live, how a member waits and how a group decides a barrier, so the two agree bit for bit.
//!
//! Per epoch `e` a member waits for every member to finish `e - 2`, stages into buffer `e % 2`, meets at barrier 0,
//! computes from the members' staging and marks `e` finished. Why one barrier suffices, and why slots may share
//! staging: docs/RELIABILITY.md ("The host protocol"); the invariants are in ARCHITECTURE.md ("Host protocol").

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hlo::ArrayShape;
use thunks::custom_call::CustomCallConfig;
use thunks::custom_call::host_stage_len;
use thunks::{CollectiveKind as Kind, CollectiveOp, KernelAlgorithm as Algo};

use super::fmt_group;
use super::layout::{Runs, Split, shape_bytes};
use super::reduce::Reducer;
use crate::{Error, Result};

/// A member's flag words (each written by one member only; read with Acquire, compared "at least").
#[derive(Clone, Copy, Debug)]
pub(super) enum Word {
    /// Its epoch counter (only it reads and writes it).
    Epoch,
    /// The latest epoch whose reads of peers' staging it has finished.
    Finished,
    /// Collective-permute: the latest epoch it staged for its target.
    Posted,
    /// Collective-permute: the latest epoch of it its target consumed (written by the target).
    Consumed,
}

/// Where the members of a collective meet: their staging buffers, their flag words and their barrier. Groups are the
/// plan's (a permute: one group of every device, member index = device id).
pub(super) trait Place {
    /// Whether a two-shot all-reduce may work in peers' XLA buffers (one address space); if not, it runs as the
    /// one-shot, which folds the same members in the same order.
    const IN_PLACE: bool;

    /// Member `k` of group `gi`: its word `w`.
    fn word(&self, gi: usize, k: usize, w: Word) -> &AtomicU64;

    /// `len` bytes at `at` of member `k`'s staging buffer `par`. Caller: nobody writes them until the borrow ends (the
    /// protocol's phases).
    fn staged(&self, gi: usize, k: usize, par: usize, at: usize, len: usize) -> &[u8];

    /// The same, to write. Caller: member `k`, in its write phase.
    #[allow(clippy::mut_from_ref)]
    fn stage(&self, gi: usize, k: usize, par: usize, at: usize, len: usize) -> &mut [u8];

    /// Arrives at barrier `p` of epoch `e` and waits for the group's decision, until `deadline` (none: every member is
    /// known to be coming); a broken epoch is the timeout error naming the members missing when it broke.
    fn barrier(&self, plan: &Plan, gi: usize, idx: usize, p: usize, e: u64, deadline: Option<Instant>) -> Result<()>;

    /// Waits until `ready()` or the deadline; `false` on timeout. A waiter may sleep until [`Place::wake`].
    fn wait(&self, gi: usize, deadline: Instant, ready: impl FnMut() -> bool) -> bool;

    /// Wakes the members of group `gi` waiting in [`Place::wait`] (after a word changed).
    fn wake(&self, _gi: usize) {}

    /// A member is about to report a timeout.
    fn timing_out(&self) {}

    /// In-place two-shot ([`Place::IN_PLACE`]): member `idx` publishes its operands and results as (address, length)
    /// before barrier 0 ...
    fn publish(&self, _gi: usize, _idx: usize, _ins: Vec<(usize, usize)>, _outs: Vec<(usize, usize)>) {
        unreachable!("only an in-place meeting place runs the two-shot in place")
    }

    /// ... and reads every member's after it.
    fn published(&self, _gi: usize) -> (Vec<Vec<(usize, usize)>>, Vec<Vec<(usize, usize)>>) {
        unreachable!("only an in-place meeting place runs the two-shot in place")
    }
}

/// Bytes that members reach through a raw pointer (a zeroed allocation, a shared mapping): the protocol, not the type
/// system, says who may touch which bytes when.
pub(super) struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: all access goes through `ptr` under the protocol's rules (flag words only as atomics; one writer per staging
// range per phase, readers only after the barrier or flag that orders them after the write), so sharing a region
// between device threads is sound.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// # Safety
    /// `ptr` is valid for reads and writes of `len` bytes, 8-byte aligned, for as long as the region lives, and reached
    /// only through it.
    pub(super) unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        Region { ptr, len }
    }

    pub(super) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The atomic word at byte `at`.
    pub(super) fn word(&self, at: usize) -> &AtomicU64 {
        assert!(at.is_multiple_of(8) && at.checked_add(8).is_some_and(|end| end <= self.len), "word at {at}");
        // SAFETY: in bounds and 8-byte aligned (the region is; checked above), so valid for an `AtomicU64` (same layout
        // as `u64`) while `self` lives; the places keep flag words apart from staging, and these bytes are only ever
        // accessed as this atomic.
        unsafe { &*self.ptr.as_ptr().add(at).cast::<AtomicU64>() }
    }

    /// `len` bytes at `at`, shared. Caller: nobody writes them until the borrow ends.
    pub(super) fn read(&self, at: usize, len: usize) -> &[u8] {
        assert!(at.checked_add(len).is_some_and(|end| end <= self.len), "read {at}+{len} of {}", self.len);
        if len == 0 {
            return &[];
        }
        // SAFETY: in bounds (checked above); the protocol guarantees no concurrent writer (module docs: a buffer is
        // written only by its owner, before the barrier or post its readers wait for, and not again until they have all
        // finished).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(at), len) }
    }

    /// `len` bytes at `at`, exclusive. Caller: the owning member, in its write phase.
    #[allow(clippy::mut_from_ref)]
    pub(super) fn write(&self, at: usize, len: usize) -> &mut [u8] {
        assert!(at.checked_add(len).is_some_and(|end| end <= self.len), "write {at}+{len} of {}", self.len);
        if len == 0 {
            return &mut [];
        }
        // SAFETY: in bounds (checked above); only the owning member writes its buffer, and only while no peer reads it
        // (before it arrives, once every member finished the epoch that last read it), so this is the only reference to
        // these bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(at), len) }
    }
}

/// The longest sleep of a polling wait.
const MAX_SLEEP: Duration = Duration::from_millis(1);

/// A wait without a condition variable: spin briefly, then yield, then sleep longer and longer, never past the
/// deadline.
#[derive(Default)]
pub(super) struct Backoff(u32);

impl Backoff {
    pub(super) fn snooze(&mut self, deadline: Instant) {
        let step = self.0;
        self.0 = step.saturating_add(1);
        if step < 6 {
            for _ in 0..(8u32 << step) {
                std::hint::spin_loop();
            }
        } else if step < 16 {
            std::thread::yield_now();
        } else {
            let sleep = Duration::from_micros(10u64 << (step - 16).min(7)).min(MAX_SLEEP);
            std::thread::sleep(sleep.min(deadline.saturating_duration_since(Instant::now())));
        }
    }
}

/// Polls `ready` until it holds (`true`) or the deadline passes (`false`).
pub(super) fn poll(deadline: Instant, mut ready: impl FnMut() -> bool) -> bool {
    let mut backoff = Backoff::default();
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return ready();
        }
        backoff.snooze(deadline);
    }
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

/// What a rewritten collective computes, whatever memory its members meet in: the operands and where each lies in a
/// staging buffer, the groups, the permute pairs, and the results computed from members' staged operands. Both places
/// run it, so the two agree bit for bit.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) op: CollectiveOp,
    pub(super) algorithm: Algo,
    pub(super) name: String,
    pub(super) timeout: Duration,
    pub(super) ops: Vec<Operand>,
    /// Bytes of one staging buffer: every operand at its `stage` offset.
    pub(super) per_buffer: usize,
    /// Each group's members (device ids, in group order); collective-permute: one group of every device.
    pub(super) group_members: Vec<Vec<usize>>,
    /// Device id → (group index, member index).
    pub(super) rank_of: Vec<Option<(usize, usize)>>,
    /// Collective-permute: device id → its source and its target.
    pub(super) pairs: Vec<(Option<usize>, Option<usize>)>,
}

/// Copies run by run from `src` into `dst` (same row count and length).
fn copy_runs(src: &[u8], s: Runs, dst: &mut [u8], d: Runs) {
    for (a, b) in s.starts(0).zip(d.starts(0)) {
        dst[b..b + d.row].copy_from_slice(&src[a..a + s.row]);
    }
}

impl Plan {
    /// The plan of `call` (groups and pairs are device ids below `num_devices`) on operands of the given logical shapes
    /// (the protocol moves them in their physical order, the call's `layout`).
    pub(super) fn new(call: &CustomCallConfig, logical: &[ArrayShape], num_devices: usize) -> Result<Self> {
        let (name, timeout) = (call.name.as_str(), Duration::from_millis(call.timeout_ms));
        // Host memory has no copy engines: a copy-engine form moves its bytes as the direct one.
        let algorithm = match call.algorithm {
            Algo::CopyEngineAllGather => Algo::DirectAllGather,
            Algo::CopyEngineAllToAll => Algo::DirectAllToAll,
            Algo::CopyEnginePermute => Algo::DirectPermute,
            Algo::CopyEngineReduceScatter => Algo::DirectReduceScatter,
            Algo::CopyEngineAllReduce => Algo::TwoShotAllReduce,
            a => a,
        };
        let op = CollectiveOp { kind: call.kind, is_async: false };
        let invalid = |reason: String| Error::Invalid { collective: name.to_string(), op, rank: 0, reason };
        let unsupported = |reason: String| Error::Unsupported { collective: name.to_string(), op, rank: 0, reason };
        // Row-major arrays in the buffers' physical order, and the dimension among them.
        let mut shapes = Vec::with_capacity(logical.len());
        let mut dimension = call.dimension;
        for s in logical {
            let (dims, d) = call.physical(&s.dims).map_err(&invalid)?;
            dimension = d;
            shapes.push(ArrayShape::new(s.ty, dims));
        }
        let computes = match algorithm {
            Algo::OneShotAllReduce | Algo::TwoShotAllReduce | Algo::CopyEngineAllReduce => Kind::AllReduce,
            Algo::DirectAllGather | Algo::CopyEngineAllGather => Kind::AllGather,
            Algo::DirectAllToAll | Algo::CopyEngineAllToAll => Kind::AllToAll,
            Algo::DirectReduceScatter | Algo::CopyEngineReduceScatter => Kind::ReduceScatter,
            Algo::DirectPermute | Algo::CopyEnginePermute => Kind::CollectivePermute,
        };
        if computes != op.kind {
            return Err(invalid(format!("{} does not compute {op}", algorithm.name())));
        }

        // Groups (device ids) and each device's place in them.
        let mut rank_of = vec![None; num_devices];
        let mut pairs = vec![(None, None); num_devices];
        let groups: Vec<Vec<usize>> = if op.kind == Kind::CollectivePermute {
            for &(s, t) in &call.pairs {
                if s >= num_devices || t >= num_devices {
                    return Err(invalid(format!("source-target pair {s}->{t} names a device >= {num_devices}")));
                }
                if pairs[s].1.replace(t).is_some() || pairs[t].0.replace(s).is_some() {
                    return Err(invalid(format!("source-target pairs repeat source {s} or target {t}")));
                }
            }
            rank_of = (0..num_devices).map(|d| Some((0, d))).collect();
            vec![(0..num_devices).collect()]
        } else {
            for (gi, g) in call.groups.iter().enumerate() {
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
            call.groups.clone()
        };

        // Operands, and how results relate to them.
        let mut ops = Vec::with_capacity(shapes.len());
        let mut stage = 0usize;
        let dim = dimension.unwrap_or(0);
        let g = groups.first().map_or(1, Vec::len);
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
                    let kind = call.reduction.ok_or_else(|| unsupported("reduction not recognised".into()))?;
                    Some(Reducer::new(shape.ty, kind).map_err(unsupported)?)
                }
                _ => None,
            };
            // The operand viewed along the dimension, and the same split into `g` blocks.
            let view = || Split::new(shape, dim, len).map_err(invalid);
            let blocks = || view().and_then(|s| s.check_blocks(g, shape, dim).map_err(invalid));
            let (split, out_len) = match op.kind {
                Kind::AllReduce | Kind::CollectivePermute => (None, len),
                Kind::AllGather => (Some(view()?), len.saturating_mul(g)),
                Kind::ReduceScatter => (Some(blocks()?), len / g.max(1)),
                Kind::AllToAll if dimension.is_some() => {
                    if shapes.len() != 1 {
                        return Err(invalid(format!("array all-to-all with {} operands", shapes.len())));
                    }
                    (Some(blocks()?), len)
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

    /// Checks one call of device `device` against the plan; its (group index, member index).
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

    /// Member `idx`'s results, for a group of `g`, from the members' staged operands: `member(k, at, len)` is `len`
    /// bytes at `at` of member `k`'s staging buffer of this epoch. For the algorithms that read staging only (one-shot
    /// all-reduce, direct reduce-scatter, all-gather and all-to-all); the two-shot and the permute are their callers'
    /// own.
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
            Algo::TwoShotAllReduce
            | Algo::DirectPermute
            | Algo::CopyEngineAllGather
            | Algo::CopyEngineAllToAll
            | Algo::CopyEnginePermute
            | Algo::CopyEngineReduceScatter
            | Algo::CopyEngineAllReduce => {
                unreachable!("{algorithm} computes outside Plan::compute")
            }
        }
    }
}

/// However a call ends, its member is done reading peers' buffers of its epoch.
struct Finish<'a>(&'a AtomicU64, u64);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::Release);
    }
}

/// Runs device `device`'s side of one call of `plan` in `place` (module docs): `inputs` are its operands, `outputs` its
/// result buffers (XLA's), in operand order.
pub(super) fn run<P: Place>(
    plan: &Plan,
    place: &P,
    device: usize,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
) -> Result<()> {
    let (gi, idx) = plan.check_call(device, inputs, outputs)?;
    let deadline = Instant::now() + plan.timeout;
    let epoch = place.word(gi, idx, Word::Epoch);
    let e = epoch.load(Ordering::Relaxed) + 1;
    epoch.store(e, Ordering::Relaxed);
    let _finish = Finish(place.word(gi, idx, Word::Finished), e);
    if plan.op.kind == Kind::CollectivePermute {
        return permute(plan, place, device, e, deadline, inputs, outputs);
    }
    wait_finished(plan, place, gi, idx, e, deadline)?;
    let par = (e % 2) as usize;
    // The in-place two-shot works in peers' XLA buffers: each member reduces its slice of every operand straight from
    // peers' operands and writes the sum into every member's result (one read and one write of each byte, where staging
    // the slices and gathering them again costs a second read and write). Its barrier 1, which no member passes before
    // every member finished, keeps those buffers alive. The others stage operands.
    let algorithm = match plan.algorithm {
        Algo::TwoShotAllReduce if !P::IN_PLACE => Algo::OneShotAllReduce,
        a => a,
    };
    if algorithm == Algo::TwoShotAllReduce {
        let ins = inputs.iter().map(|b| (b.as_ptr() as usize, b.len())).collect();
        // Addresses taken from the results' own `&mut`: from here to barrier 1 this member touches its results only
        // through them (see `peer_output`).
        let outs = outputs.iter_mut().map(|b| (b.as_mut_ptr() as usize, b.len())).collect();
        place.publish(gi, idx, ins, outs);
    } else {
        for (o, x) in plan.ops.iter().zip(inputs) {
            place.stage(gi, idx, par, o.stage, o.len).copy_from_slice(x);
        }
    }
    place.barrier(plan, gi, idx, 0, e, Some(deadline))?;
    let g = plan.group_members[gi].len();
    if algorithm != Algo::TwoShotAllReduce {
        plan.compute(algorithm, idx, g, |k, at, len| place.staged(gi, k, par, at, len), outputs);
        return Ok(());
    }
    let (ins, outs) = place.published(gi);
    let reduce = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for (j, o) in plan.ops.iter().enumerate() {
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
    // Not bounded: every member passed barrier 0, so each arrives after its reads and writes (a panic included), and
    // none may leave while a peer still reads its operand or writes its result.
    place.barrier(plan, gi, idx, 1, e, None)?;
    if let Err(p) = reduce {
        std::panic::resume_unwind(p);
    }
    Ok(())
}

/// Before writing staging buffer `e % 2`: every member finished epoch `e - 2`.
fn wait_finished<P: Place>(plan: &Plan, place: &P, gi: usize, idx: usize, e: u64, deadline: Instant) -> Result<()> {
    let members = &plan.group_members[gi];
    let behind = |k: usize| place.word(gi, k, Word::Finished).load(Ordering::Acquire).saturating_add(2) < e;
    if poll(deadline, || !(0..members.len()).any(behind)) {
        return Ok(());
    }
    // Only after a timeout can a member still be in epoch e - 2.
    let missing: Vec<usize> = (0..members.len()).filter(|&k| behind(k)).map(|k| members[k]).collect();
    if missing.is_empty() {
        return Ok(());
    }
    place.timing_out();
    Err(plan.timeout_error(members, members[idx], missing))
}

/// Collective-permute (module docs); the plan's one group is every device, in order.
fn permute<P: Place>(
    plan: &Plan,
    place: &P,
    d: usize,
    e: u64,
    deadline: Instant,
    inputs: &[&[u8]],
    outputs: &mut [&mut [u8]],
) -> Result<()> {
    let (source, target) = plan.pairs[d];
    let word = |k: usize, w: Word| place.word(0, k, w);
    let par = (e % 2) as usize;
    let pair_timeout = |peer: usize| {
        place.timing_out();
        plan.timeout_error(&[d.min(peer), d.max(peer)], d, vec![peer])
    };
    if let Some(t) = target.filter(|&t| t != d) {
        // My staging buffer `e % 2` is free once my target consumed epoch e - 2.
        if !place.wait(0, deadline, || word(d, Word::Consumed).load(Ordering::Acquire).saturating_add(2) >= e) {
            return Err(pair_timeout(t));
        }
        for (o, x) in plan.ops.iter().zip(inputs) {
            place.stage(0, d, par, o.stage, o.len).copy_from_slice(x);
        }
        word(d, Word::Posted).store(e, Ordering::Release);
        place.wake(0);
    }
    match source {
        Some(s) if s == d => {
            for (x, out) in inputs.iter().zip(outputs.iter_mut()) {
                out.copy_from_slice(x);
            }
        }
        Some(s) => {
            let posted = place.wait(0, deadline, || word(s, Word::Posted).load(Ordering::Acquire) >= e);
            if posted {
                for (o, out) in plan.ops.iter().zip(outputs.iter_mut()) {
                    out.copy_from_slice(place.staged(0, s, par, o.stage, o.len));
                }
            }
            // Consumed (or given up on): my source may reuse the buffer at e + 2.
            word(s, Word::Consumed).fetch_max(e, Ordering::AcqRel);
            place.wake(0);
            if !posted {
                return Err(pair_timeout(s));
            }
        }
        None => outputs.iter_mut().for_each(|o| o.fill(0)),
    }
    Ok(())
}

/// Bytes `lo..hi` of a peer's operand published at barrier 0 as (address, length).
fn peer_input(entry: &(usize, usize), lo: usize, hi: usize) -> &[u8] {
    let (addr, len) = *entry;
    assert!(lo <= hi && hi <= len, "peer operand range {lo}..{hi} of {len}");
    if lo == hi {
        return &[];
    }
    // SAFETY: the owner published its XLA operand (valid for its call, never written during it) at barrier 0 of this
    // epoch and cannot return before barrier 1, which this member reaches only after its last use of the slice (the
    // reduce phase; the borrow checker cannot see the barrier, so callers keep these slices inside that phase); the
    // range is in bounds (checked). Only an in-place place (one address space) publishes.
    unsafe { std::slice::from_raw_parts((addr as *const u8).add(lo), hi - lo) }
}

/// Bytes `lo..hi` of a member's result published at barrier 0 as (address, length), for the member that owns two-shot
/// slice `lo..hi` to write.
#[allow(clippy::mut_from_ref)]
fn peer_output(entry: &(usize, usize), lo: usize, hi: usize) -> &mut [u8] {
    let (addr, len) = *entry;
    assert!(lo <= hi && hi <= len, "peer result range {lo}..{hi} of {len}");
    if lo == hi {
        return &mut [];
    }
    // SAFETY: the owner published its XLA result buffer (valid for its call, and disjoint from every operand: the
    // custom call declares no aliasing) at barrier 0 of this epoch, took the address from its own `&mut` and does not
    // touch the buffer again before barrier 1, which it cannot pass before this member's last write (the reduce phase;
    // the slice never leaves it). Slices of different members are disjoint, so no two members write one byte, and
    // nobody reads the range before barrier 1 orders the write before it. The range is in bounds (checked).
    unsafe { std::slice::from_raw_parts_mut((addr as *mut u8).add(lo), hi - lo) }
}

/// Byte range of two-shot slice `k` of `g` of operand `o`: `ceil(n / g)` elements each, the last ones shorter or empty.
fn slice(o: &Operand, g: usize, k: usize) -> (usize, usize) {
    let eb = o.shape.ty.byte_size().max(1);
    let n = o.len / eb;
    let s = n.div_ceil(g.max(1));
    ((k * s).min(n) * eb, ((k + 1) * s).min(n) * eb)
}
