//! The collective protocols, as the GPU kernels will run them.
//!
//! Signal layout (8-byte words from `signals.offset`, each holding a 32-bit counter):
//! word 0 is the device's epoch counter; word `1 + b * G + j` is barrier `b`'s flag written
//! only by group member `j` (`G` = the largest group). Collective-permute uses word 1
//! ("ready", written by my target) and word 2 ("done", written by my source). A device
//! signals a peer by storing the current epoch into the peer's slot with `Release`, and
//! waits by polling its *own* slots with `Acquire` until each is at least the epoch
//! (wrapping-aware). Slots are never reset: a slot that already holds a later epoch means
//! the peer is further ahead, which every protocol below tolerates.
//!
//! Staging buffers live in `scratch`; operand `j` is staged at the sum of the earlier
//! operands' lengths. Reductions read group members in fixed order (member 0, 1, ...), so
//! every rank computes bitwise the same result; pure copies use the rotated order
//! `(rank + i) mod G` so that ranks do not all hit the same peer first.
//!
//! - **One-shot all-reduce** (1 barrier): copy my operand into my staging buffer
//!   `epoch % 2`, signal every peer, wait for every peer, reduce all members' staging in
//!   fixed order into my output. There is no end barrier; double buffering makes that safe:
//!   I overwrite buffer `k` again only at epoch `e + 2`, after passing the barrier of epoch
//!   `e + 1`, and a peer signals that barrier only after it finished epoch `e`, including
//!   its reads of my buffer `k`. (With one buffer, a fast rank's next copy-in could
//!   overwrite data a slow peer is still reducing.)
//! - **Two-shot all-reduce** (2 barriers): copy-in as above; after barrier 0 each rank
//!   reduces its slice `k` (of `ceil(n / G)` elements; the last ones may be shorter or
//!   empty) from all members' staging, in fixed order, back into slice `k` of its own
//!   staging (only rank `k` reads slice `k` in this phase); after barrier 1 every rank
//!   copies slice `k` from member `k`'s staging into its output. Double buffered like the
//!   one-shot, so no end barrier.
//! - **Direct reduce-scatter** (1 barrier): copy-in, barrier, reduce block `rank` (strided
//!   when the scatter dimension is not the major one) from all members' staging. Double
//!   buffered.
//! - **Direct all-gather / all-to-all** (ready + done): a peer's output may be written only
//!   once the peer is inside this collective (its earlier use of that buffer is over), so
//!   every rank first signals "ready for epoch e" to every peer and waits for all peers'
//!   ready flags; then it pushes its shard (all-gather) or chunk `k` (all-to-all) into
//!   member `k`'s output at slot `rank`, in rotated order, and signals "done" to that
//!   member; it returns once every peer's "done" arrived (its output is complete). Pushes
//!   read only my own operand, so no staging and no end barrier are needed.
//! - **Direct collective-permute**: a target signals "ready" to its source; the source
//!   waits for it, pushes its operand into the target's output and signals "done"; the
//!   target waits for "done". Devices that no pair targets write zeros (XLA semantics).
//! - **Fallback** (what the emitter's "fallback" means on the host; NCCL on CUDA): copy my
//!   operands into my single staging buffer, barrier 0, then read every member's staging
//!   member by member (reducing in fixed order, or copying), then a plain end barrier so
//!   that nobody still reads my staging when I reuse it. Collective-permute's fallback pulls:
//!   the source stages and signals "done", the target copies from the source's staging and
//!   signals "ready" (consumed), which the source waits for before it returns. The fallback
//!   moves every element type (f8, s4/u4, complex included) and reduces computable ones.

use std::hint::spin_loop;
use std::time::{Duration, Instant};

use hlo::ArrayShape;
use thunks::{CollectiveKind as Kind, Implementation, KernelAlgorithm as Algo};

use super::arena::{self, Arena, CHUNK};
use super::layout::{Runs, Split, shape_bytes};
use super::reduce::Reducer;
use super::{
    CollectiveCall, HostCluster, Region, fmt_group, max_group, scratch_bytes, signal_bytes, staging_buffers,
    staging_stride,
};
use crate::{Error, Result};

/// Wrapping-aware `v >= e` for 32-bit counters.
fn reached(v: u32, e: u32) -> bool {
    v.wrapping_sub(e) < 1 << 31
}

/// One operand as this call moves it.
struct Operand {
    input: Region,
    output: Region,
    shape: ArrayShape,
    /// Offset of the operand within a staging buffer.
    stage: usize,
    reducer: Option<Reducer>,
    /// The operand along the collective's dimension (all-gather, reduce-scatter, array
    /// all-to-all).
    split: Option<Split>,
}

/// Collective-permute roles of this device.
#[derive(Clone, Copy)]
struct Pair {
    /// The device this one sends to, if any.
    target: Option<usize>,
    /// The device this one receives from, if any.
    source: Option<usize>,
}

struct Ctx<'a> {
    cluster: &'a HostCluster,
    call: &'a CollectiveCall<'a>,
    rank: usize,
    /// My group (for collective-permute: me with my source and target), for errors.
    group: Vec<usize>,
    /// My index in `group` (group collectives).
    idx: usize,
    gmax: usize,
    /// Word index of the signals region (the epoch counter).
    sig: usize,
    epoch: u32,
    deadline: Option<Instant>,
    ops: Vec<Operand>,
    pair: Pair,
}

/// Validates `call` for device `rank` and runs it.
pub(super) fn run(cluster: &HostCluster, rank: usize, call: &CollectiveCall) -> Result<()> {
    let start = Instant::now();
    let mut ctx = prepare(cluster, rank, call)?;
    ctx.deadline = start.checked_add(call.timeout);
    // The epoch advances on the device: read and incremented by this device only.
    let own = &cluster.arenas[rank];
    let epoch = own.counter_load(ctx.sig).wrapping_add(1);
    own.counter_store(ctx.sig, epoch);
    ctx.epoch = epoch;
    let kind = call.config.op.kind;
    match call.implementation {
        Implementation::Kernel(Algo::OneShotAllReduce) => ctx.one_shot(),
        Implementation::Kernel(Algo::TwoShotAllReduce) => ctx.two_shot(),
        Implementation::Kernel(Algo::DirectReduceScatter) => ctx.direct_reduce_scatter(),
        Implementation::Kernel(Algo::DirectAllGather | Algo::DirectAllToAll) => ctx.direct_push(),
        Implementation::Kernel(Algo::DirectPermute) => ctx.direct_permute(),
        Implementation::Fallback if kind == Kind::CollectivePermute => ctx.fallback_permute(),
        Implementation::Fallback => ctx.fallback(),
    }
}

/// Every check that does not depend on peers: a call that passes them runs to completion
/// unless a peer fails to arrive.
fn prepare<'a>(cluster: &'a HostCluster, rank: usize, call: &'a CollectiveCall<'a>) -> Result<Ctx<'a>> {
    let cfg = call.config;
    let op = cfg.op;
    let name = || call.name.to_string();
    let invalid = |reason: String| Error::Invalid { collective: name(), op, rank, reason };
    let unsupported = |reason: String| Error::Unsupported { collective: name(), op, rank, reason };
    let memory = |source| Error::Memory { collective: name(), op, source: Box::new(source) };
    let n = cluster.num_devices();
    cluster.arena(rank).map_err(memory)?;

    // The op and the implementation.
    let algo_kind = match call.implementation {
        Implementation::Kernel(Algo::OneShotAllReduce | Algo::TwoShotAllReduce) => Some(Kind::AllReduce),
        Implementation::Kernel(Algo::DirectAllGather) => Some(Kind::AllGather),
        Implementation::Kernel(Algo::DirectAllToAll) => Some(Kind::AllToAll),
        Implementation::Kernel(Algo::DirectReduceScatter) => Some(Kind::ReduceScatter),
        Implementation::Kernel(Algo::DirectPermute) => Some(Kind::CollectivePermute),
        Implementation::Fallback => None,
    };
    if matches!(op.kind, Kind::RaggedAllToAll | Kind::CollectiveBroadcast) {
        return Err(unsupported(format!("the host backend has no {op}")));
    }
    if algo_kind.is_some_and(|k| k != op.kind) {
        return Err(invalid(format!("implementation {} does not compute {op}", call.implementation)));
    }

    // Regions.
    let (ins, outs) = (&call.inputs, &call.outputs);
    if ins.len() != cfg.num_operands || outs.len() != ins.len() {
        return Err(invalid(format!(
            "{} inputs and {} outputs for {} operands",
            ins.len(),
            outs.len(),
            cfg.num_operands
        )));
    }
    if !call.operand_shapes.is_empty() && call.operand_shapes.len() != ins.len() {
        return Err(invalid(format!("{} operand shapes for {} operands", call.operand_shapes.len(), ins.len())));
    }
    for r in ins {
        cluster.check("input", rank, *r).map_err(memory)?;
    }
    for r in outs {
        cluster.check("output", rank, *r).map_err(memory)?;
    }
    cluster.check("scratch", rank, call.scratch).map_err(memory)?;
    cluster.check("signals", rank, call.signals).map_err(memory)?;
    let total = ins.iter().try_fold(0usize, |a, r| a.checked_add(r.len));
    if total != Some(cfg.bytes_per_device) {
        return Err(invalid(format!("inputs total {total:?} bytes, the config says {}", cfg.bytes_per_device)));
    }
    let need = scratch_bytes(cfg, call.implementation);
    if call.scratch.len < need {
        return Err(invalid(format!("scratch {} is smaller than the {need} bytes needed", call.scratch)));
    }
    let need = signal_bytes(cfg, call.implementation);
    if call.signals.len < need {
        return Err(invalid(format!("signals {} is smaller than the {need} bytes needed", call.signals)));
    }
    if !call.signals.offset.is_multiple_of(8) {
        return Err(invalid(format!("signals {} is not 8-byte aligned", call.signals)));
    }
    let staged = staging_buffers(call.implementation) > 0;
    let mut all: Vec<(&str, Region)> = vec![("scratch", call.scratch), ("signals", call.signals)];
    all.extend(ins.iter().map(|&r| ("input", r)));
    all.extend(outs.iter().map(|&r| ("output", r)));
    for (i, (wa, a)) in all.iter().enumerate() {
        for (wb, b) in &all[i + 1..] {
            // Inputs may share bytes with each other, and with outputs when the
            // implementation stages its inputs before anything writes an output.
            let allowed = (*wa == "input" && *wb == "input") || (staged && *wa == "input" && *wb == "output");
            if !allowed && a.overlaps(b) {
                return Err(invalid(format!("{wa} {a} overlaps {wb} {b}")));
            }
        }
    }

    // Operands.
    let mut ops = Vec::with_capacity(ins.len());
    let mut stage = 0;
    for (j, (&input, &output)) in ins.iter().zip(outs).enumerate() {
        let shape = match call.operand_shapes.get(j) {
            Some(s) => s.clone(),
            None => {
                let elem = cfg.element_type.byte_size();
                if elem == 0 || input.len % elem != 0 {
                    return Err(invalid(format!(
                        "input {input} is not a whole number of {} elements",
                        cfg.element_type
                    )));
                }
                ArrayShape::new(cfg.element_type, vec![i64::try_from(input.len / elem).unwrap_or(i64::MAX)])
            }
        };
        if shape.ty.byte_size() == 0 {
            return Err(invalid(format!("operand {j} has element type {}, which has no bytes", shape.ty)));
        }
        if shape_bytes(&shape) != Some(input.len) {
            return Err(invalid(format!("operand {j}'s shape {shape} does not match its input {input}")));
        }
        let reducer = match op.kind {
            Kind::AllReduce | Kind::ReduceScatter => {
                let kind = cfg.reduction.ok_or_else(|| unsupported("reduction computation not recognised".into()))?;
                Some(Reducer::new(shape.ty, kind).map_err(unsupported)?)
            }
            _ => None,
        };
        ops.push(Operand { input, output, shape, stage, reducer, split: None });
        stage += input.len;
    }

    // Groups or pairs, and peer access for kernels.
    let kernel = matches!(call.implementation, Implementation::Kernel(_));
    let no_peer =
        |from, to| Error::NoPeerAccess { collective: name(), op, implementation: call.implementation, from, to };
    let mut pair = Pair { target: None, source: None };
    let (group, idx) = if op.kind == Kind::CollectivePermute {
        let mut is_src = vec![false; n];
        let mut is_tgt = vec![false; n];
        for &(s, t) in &cfg.source_target_pairs {
            if s >= n || t >= n {
                return Err(invalid(format!("source-target pair {s}->{t} names a device >= {n}")));
            }
            if std::mem::replace(&mut is_src[s], true) || std::mem::replace(&mut is_tgt[t], true) {
                return Err(invalid(format!("source-target pairs repeat source {s} or target {t}")));
            }
            if kernel && !cluster.can_access(s, t) {
                return Err(no_peer(s, t));
            }
            if s == rank {
                pair.target = Some(t);
            }
            if t == rank {
                pair.source = Some(s);
            }
        }
        let mut g: Vec<usize> = [pair.source, Some(rank), pair.target].into_iter().flatten().collect();
        g.dedup();
        (g, 0)
    } else {
        let Some(group) = cfg.groups.iter().find(|g| g.contains(&rank)) else {
            return Err(invalid(format!(
                "device {rank} is in no replica group of {}",
                thunks::fmt_groups(&cfg.groups)
            )));
        };
        for (i, &m) in group.iter().enumerate() {
            if m >= n || group[..i].contains(&m) {
                return Err(invalid(format!(
                    "replica group {} names device {m} twice or out of range",
                    fmt_group(group)
                )));
            }
            if kernel {
                for &p in &group[..i] {
                    if !cluster.can_access(p, m) {
                        return Err(no_peer(p, m));
                    }
                }
            }
        }
        let idx = group.iter().position(|&m| m == rank).unwrap_or(0);
        (group.clone(), idx)
    };

    // Per-op shapes of results.
    let g = group.len();
    let dim = cfg.dimension.unwrap_or(0);
    match op.kind {
        Kind::AllReduce | Kind::CollectivePermute => {
            for o in &ops {
                if o.output.len != o.input.len {
                    return Err(invalid(format!("output {} differs in size from input {}", o.output, o.input)));
                }
            }
        }
        Kind::AllGather => {
            for o in &mut ops {
                o.split = Some(Split::new(&o.shape, dim, o.input.len).map_err(invalid)?);
                if Some(o.output.len) != o.input.len.checked_mul(g) {
                    return Err(invalid(format!("output {} is not {g} times input {}", o.output, o.input)));
                }
            }
        }
        Kind::ReduceScatter => {
            for o in &mut ops {
                let s = Split::new(&o.shape, dim, o.input.len).map_err(invalid)?;
                s.check_blocks(g, &o.shape, dim).map_err(invalid)?;
                o.split = Some(s);
                if o.output.len.checked_mul(g) != Some(o.input.len) {
                    return Err(invalid(format!("input {} is not {g} times output {}", o.input, o.output)));
                }
            }
        }
        Kind::AllToAll => {
            if cfg.dimension.is_some() {
                let n_ops = ops.len();
                let [o] = &mut ops[..] else {
                    return Err(invalid(format!("array all-to-all with {n_ops} operands")));
                };
                let s = Split::new(&o.shape, dim, o.input.len).map_err(invalid)?;
                s.check_blocks(g, &o.shape, dim).map_err(invalid)?;
                o.split = Some(s);
                if o.output.len != o.input.len {
                    return Err(invalid(format!("output {} differs in size from input {}", o.output, o.input)));
                }
            } else {
                if ops.len() != g {
                    return Err(invalid(format!("tuple all-to-all with {} operands in a group of {g}", ops.len())));
                }
                let len = ops.first().map_or(0, |o| o.input.len);
                if ops.iter().any(|o| o.input.len != len || o.output.len != len) {
                    return Err(invalid("tuple all-to-all operands and results differ in size".into()));
                }
            }
        }
        Kind::RaggedAllToAll | Kind::CollectiveBroadcast => {}
    }

    Ok(Ctx {
        cluster,
        call,
        rank,
        group,
        idx,
        gmax: max_group(cfg),
        sig: call.signals.offset / 8,
        epoch: 0,
        deadline: None,
        ops,
        pair,
    })
}

/// Copies run by run (both sides have the same rows and row length).
fn copy_runs(src: &Arena, sbase: usize, s: Runs, dst: &Arena, dbase: usize, d: Runs) {
    let row = s.row.min(d.row);
    for (a, b) in s.starts(sbase).zip(d.starts(dbase)) {
        arena::copy(src, a, dst, b, row);
    }
}

/// Reduces `len` bytes at `src` of every arena in `members` (in that order) into `dst`
/// at `d`. `dst` may be one of the members with `d == src`: each chunk is read before it
/// is written.
fn reduce_range(red: Reducer, members: &[&Arena], src: usize, len: usize, dst: &Arena, d: usize) {
    let mut bufs: Vec<Vec<u8>> = members.iter().map(|_| vec![0u8; CHUNK.min(len)]).collect();
    let mut out = vec![0u8; CHUNK.min(len)];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        for (buf, a) in bufs.iter_mut().zip(members) {
            a.load(src + done, &mut buf[..n]);
        }
        let refs: Vec<&[u8]> = bufs.iter().map(|b| &b[..n]).collect();
        red.reduce(&refs, &mut out[..n]);
        dst.store(d + done, &out[..n]);
        done += n;
    }
}

impl Ctx<'_> {
    fn own(&self) -> &Arena {
        &self.cluster.arenas[self.rank]
    }

    fn arena(&self, d: usize) -> &Arena {
        &self.cluster.arenas[d]
    }

    fn members(&self) -> Vec<&Arena> {
        self.group.iter().map(|&m| self.arena(m)).collect()
    }

    /// Word of barrier `b`'s flag written by member `j`.
    fn slot(&self, b: usize, j: usize) -> usize {
        self.sig + 1 + b * self.gmax + j
    }

    /// Offset of staging buffer `buf`.
    fn staging(&self, buf: usize) -> usize {
        self.call.scratch.offset + buf * staging_stride(self.call.config)
    }

    /// Copies every operand into staging buffer `st`.
    fn stage_in(&self, st: usize) {
        let own = self.own();
        for o in &self.ops {
            arena::copy(own, o.input.offset, own, st + o.stage, o.input.len);
        }
    }

    /// Stores the epoch into barrier `b`'s slot of every peer, in rotated order.
    fn signal_all(&self, b: usize) {
        let g = self.group.len();
        for i in 1..g {
            let m = self.group[(self.idx + i) % g];
            self.arena(m).flag_store(self.slot(b, self.idx), self.epoch);
            self.cluster.wake(m);
        }
    }

    /// Waits until every peer's barrier-`b` slot reached the epoch.
    fn wait_all(&self, b: usize) -> Result<()> {
        let slots =
            (0..self.group.len()).filter(|&j| j != self.idx).map(|j| (self.slot(b, j), self.group[j])).collect();
        self.wait(slots)
    }

    fn barrier(&self, b: usize) -> Result<()> {
        self.signal_all(b);
        self.wait_all(b)
    }

    /// Spins until each `(word, rank)` slot of my own arena reached the epoch, or fails
    /// at the deadline naming the ranks still missing.
    fn wait(&self, mut pending: Vec<(usize, usize)>) -> Result<()> {
        let own = self.own();
        let mut spins: u32 = 0;
        loop {
            pending.retain(|&(w, _)| !reached(own.flag_load(w), self.epoch));
            if pending.is_empty() {
                return Ok(());
            }
            spins = spins.saturating_add(1);
            if spins <= 64 {
                spin_loop();
                continue;
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                let call = self.call;
                return Err(Error::Timeout {
                    collective: call.name.to_string(),
                    op: call.config.op,
                    group: self.group.clone(),
                    waiting_rank: self.rank,
                    missing: pending.iter().map(|&(_, r)| r).collect(),
                    timeout: call.timeout,
                });
            }
            // Park until a peer stores a flag (every store wakes the cluster's parked
            // devices; the flags stay the only truth, the wake-up is a hint), so a host with
            // fewer cores than devices (XLA:CPU runs one thread per device) makes progress.
            let parked = self.cluster.park_lock(self.rank);
            pending.retain(|&(w, _)| !reached(own.flag_load(w), self.epoch));
            if pending.is_empty() {
                self.cluster.park(self.rank, None, Duration::ZERO);
                return Ok(());
            }
            let cap = Duration::from_millis(2);
            let wait = self.deadline.map_or(cap, |d| d.saturating_duration_since(Instant::now()).min(cap));
            self.cluster.park(self.rank, Some(parked), wait);
        }
    }

    /// Byte range of slice `k` of `g` of operand `o` (two-shot): `ceil(n / g)` elements
    /// each, the last ones shorter or empty.
    fn slice(o: &Operand, g: usize, k: usize) -> (usize, usize) {
        let eb = o.shape.ty.byte_size().max(1);
        let n = o.input.len / eb;
        let s = n.div_ceil(g.max(1));
        ((k * s).min(n) * eb, ((k + 1) * s).min(n) * eb)
    }

    fn one_shot(&self) -> Result<()> {
        let st = self.staging(self.epoch as usize % 2);
        self.stage_in(st);
        self.barrier(0)?;
        let members = self.members();
        for o in &self.ops {
            if let Some(red) = o.reducer {
                reduce_range(red, &members, st + o.stage, o.input.len, self.own(), o.output.offset);
            }
        }
        Ok(())
    }

    fn two_shot(&self) -> Result<()> {
        let st = self.staging(self.epoch as usize % 2);
        let g = self.group.len();
        self.stage_in(st);
        self.barrier(0)?;
        let members = self.members();
        for o in &self.ops {
            if let Some(red) = o.reducer {
                let (lo, hi) = Self::slice(o, g, self.idx);
                let at = st + o.stage + lo;
                reduce_range(red, &members, at, hi - lo, self.own(), at);
            }
        }
        self.barrier(1)?;
        for i in 0..g {
            let k = (self.idx + i) % g;
            for o in &self.ops {
                let (lo, hi) = Self::slice(o, g, k);
                arena::copy(self.arena(self.group[k]), st + o.stage + lo, self.own(), o.output.offset + lo, hi - lo);
            }
        }
        Ok(())
    }

    /// Reduces block `idx` of every operand from staging buffer `st` of all members.
    fn reduce_block(&self, st: usize) {
        let g = self.group.len();
        let members = self.members();
        for o in &self.ops {
            let (Some(red), Some(s)) = (o.reducer, o.split) else { continue };
            let (src, dst) = (s.block(g, self.idx), s.block_dense(g));
            for (a, b) in src.starts(st + o.stage).zip(dst.starts(o.output.offset)) {
                reduce_range(red, &members, a, src.row, self.own(), b);
            }
        }
    }

    fn direct_reduce_scatter(&self) -> Result<()> {
        let st = self.staging(self.epoch as usize % 2);
        self.stage_in(st);
        self.barrier(0)?;
        self.reduce_block(st);
        Ok(())
    }

    /// Direct all-gather and all-to-all: ready barrier, pushes, done flags.
    fn direct_push(&self) -> Result<()> {
        let g = self.group.len();
        self.barrier(0)?;
        let own = self.own();
        for i in 0..g {
            let k = (self.idx + i) % g;
            let m = self.group[k];
            let dst = self.arena(m);
            match self.call.config.op.kind {
                Kind::AllGather => {
                    for o in &self.ops {
                        let Some(s) = o.split else { continue };
                        copy_runs(own, o.input.offset, s.whole(), dst, o.output.offset, s.gathered(g, self.idx));
                    }
                }
                _ if self.call.config.dimension.is_some() => {
                    for o in &self.ops {
                        let Some(s) = o.split else { continue };
                        copy_runs(own, o.input.offset, s.block(g, k), dst, o.output.offset, s.block(g, self.idx));
                    }
                }
                _ => {
                    // Tuple form: my operand k becomes member k's result `idx`.
                    if let (Some(src), Some(out)) = (self.ops.get(k), self.ops.get(self.idx)) {
                        arena::copy(own, src.input.offset, dst, out.output.offset, src.input.len);
                    }
                }
            }
            if m != self.rank {
                dst.flag_store(self.slot(1, self.idx), self.epoch);
                self.cluster.wake(m);
            }
        }
        self.wait_all(1)
    }

    fn zero_outputs(&self) {
        for o in &self.ops {
            self.own().zero(o.output.offset, o.output.len);
        }
    }

    fn copy_inputs_to_outputs(&self) {
        let own = self.own();
        for o in &self.ops {
            arena::copy(own, o.input.offset, own, o.output.offset, o.input.len);
        }
    }

    /// Permute words: 1 = "ready" (written by my target), 2 = "done" (written by my source).
    const READY: usize = 1;
    const DONE: usize = 2;

    fn direct_permute(&self) -> Result<()> {
        let Pair { target, source } = self.pair;
        if let Some(s) = source.filter(|&s| s != self.rank) {
            self.arena(s).flag_store(self.sig + Self::READY, self.epoch);
            self.cluster.wake(s);
        }
        match target {
            Some(t) if t == self.rank => self.copy_inputs_to_outputs(),
            Some(t) => {
                self.wait(vec![(self.sig + Self::READY, t)])?;
                let dst = self.arena(t);
                for o in &self.ops {
                    arena::copy(self.own(), o.input.offset, dst, o.output.offset, o.input.len);
                }
                dst.flag_store(self.sig + Self::DONE, self.epoch);
                self.cluster.wake(t);
            }
            None => {}
        }
        match source {
            Some(s) if s != self.rank => self.wait(vec![(self.sig + Self::DONE, s)]),
            Some(_) => Ok(()),
            None => {
                self.zero_outputs();
                Ok(())
            }
        }
    }

    fn fallback_permute(&self) -> Result<()> {
        let Pair { target, source } = self.pair;
        let st = self.staging(0);
        let remote_target = target.filter(|&t| t != self.rank);
        if let Some(t) = remote_target {
            self.stage_in(st);
            self.arena(t).flag_store(self.sig + Self::DONE, self.epoch);
            self.cluster.wake(t);
        }
        match source {
            Some(s) if s == self.rank => self.copy_inputs_to_outputs(),
            Some(s) => {
                self.wait(vec![(self.sig + Self::DONE, s)])?;
                let src = self.arena(s);
                for o in &self.ops {
                    arena::copy(src, st + o.stage, self.own(), o.output.offset, o.input.len);
                }
                src.flag_store(self.sig + Self::READY, self.epoch);
                self.cluster.wake(s);
            }
            None => self.zero_outputs(),
        }
        match remote_target {
            Some(t) => self.wait(vec![(self.sig + Self::READY, t)]),
            None => Ok(()),
        }
    }

    fn fallback(&self) -> Result<()> {
        let st = self.staging(0);
        let g = self.group.len();
        self.stage_in(st);
        self.barrier(0)?;
        let own = self.own();
        match self.call.config.op.kind {
            Kind::AllReduce => {
                let members = self.members();
                for o in &self.ops {
                    if let Some(red) = o.reducer {
                        reduce_range(red, &members, st + o.stage, o.input.len, own, o.output.offset);
                    }
                }
            }
            Kind::ReduceScatter => self.reduce_block(st),
            Kind::AllGather => {
                for (k, &m) in self.group.iter().enumerate() {
                    for o in &self.ops {
                        let Some(s) = o.split else { continue };
                        copy_runs(self.arena(m), st + o.stage, s.whole(), own, o.output.offset, s.gathered(g, k));
                    }
                }
            }
            Kind::AllToAll if self.call.config.dimension.is_some() => {
                for (k, &m) in self.group.iter().enumerate() {
                    for o in &self.ops {
                        let Some(s) = o.split else { continue };
                        copy_runs(
                            self.arena(m),
                            st + o.stage,
                            s.block(g, self.idx),
                            own,
                            o.output.offset,
                            s.block(g, k),
                        );
                    }
                }
            }
            Kind::AllToAll => {
                // Tuple form: my result k is member k's operand `idx`.
                if let Some(src) = self.ops.get(self.idx) {
                    for (k, &m) in self.group.iter().enumerate() {
                        if let Some(out) = self.ops.get(k) {
                            arena::copy(self.arena(m), st + src.stage, own, out.output.offset, src.input.len);
                        }
                    }
                }
            }
            Kind::CollectivePermute | Kind::RaggedAllToAll | Kind::CollectiveBroadcast => {}
        }
        self.barrier(1)
    }
}
