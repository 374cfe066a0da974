//! The copy-engine forms of every kind: a call's bytes move as device-to-device copies (`cuMemcpyAsync` /
//! `cuMemcpy2DAsync`, run by the GPU's copy engines) and members agree that a buffer is free and that data has landed
//! with stream memory operations on flag words in host memory. No kernel and no SM, so a call beside a GEMM takes
//! neither its SMs nor its issue slots (docs/OVERLAP.md).
//!
//! This file builds a member's operations ([`Op`]) from plain addresses; `launch.rs` enqueues them on XLA's stream, and
//! the unit tests run them on a model of memory under interleavings they draw. The flag-word protocol and why a reset
//! cannot race the next write: docs/RELIABILITY.md ("Copy-engine flags"); invariants: ARCHITECTURE.md.

/// Words per member: `ARRIVE`, `DONE`, `READY` and `TAKEN` (`MAX_RANKS` each), then `MARK`.
pub(super) const STRIDE: usize = 40;
/// `ARRIVE + k`: member k (its index in the group; permute: 0, my target) is ready for my data.
pub(super) const ARRIVE: usize = 0;
/// `DONE + k`: member k's data (permute: 1, my source's) has landed in my staging.
pub(super) const DONE: usize = super::MAX_RANKS;
/// `READY + k` (all-gathers by pulls): member k's part is in its staging.
pub(super) const READY: usize = 2 * super::MAX_RANKS;
/// `TAKEN + k` (all-gathers by pulls): member k has read my part out of my staging.
pub(super) const TAKEN: usize = 3 * super::MAX_RANKS;
/// The code (`1 + word`) of the word my stream waits on, 0 outside waits.
pub(super) const MARK: usize = 4 * super::MAX_RANKS;
const _: () = assert!(MARK < STRIDE, "a member's words fit its stride");

/// The member index a waited word names (the missing member's bit in a timeout report; permute: bit 0 my target, bit 1
/// my source, as the kernels report them).
pub(super) fn member_of_word(word: usize) -> usize {
    word % super::MAX_RANKS
}

/// Where a copy reads or writes: an operand or result of this execution, or a fixed address (staging), each plus a byte
/// offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Loc {
    Arg(usize, u64),
    Ret(usize, u64),
    At(u64),
}

impl Loc {
    /// The same place `off` bytes further.
    fn plus(self, off: u64) -> Loc {
        match self {
            Loc::Arg(i, o) => Loc::Arg(i, o + off),
            Loc::Ret(i, o) => Loc::Ret(i, o + off),
            Loc::At(a) => Loc::At(a + off),
        }
    }
}

/// One operation of a copy-engine call on its member's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// The word at this address (a member's flag) ← 1.
    Signal(u64),
    /// My watch word `mark` ← `code`; wait until my word `addr` is non-zero; `addr` ← 0.
    Await { addr: u64, code: u32, mark: u64 },
    /// My watch word ← 0: out of the waits.
    Unmark(u64),
    /// `rows` rows of `width` bytes from `src` (rows `spitch` apart) to `dst` (`dpitch` apart).
    Move { dst: Loc, src: Loc, width: u64, rows: u64, dpitch: u64, spitch: u64 },
    /// `len` zero bytes at `dst`.
    Zero { dst: Loc, len: u64 },
}

/// A contiguous copy of `len` bytes.
fn move1(dst: Loc, src: Loc, len: u64) -> Op {
    Op::Move { dst, src, width: len, rows: 1, dpitch: len, spitch: len }
}

/// What a member puts in member k's staging: `rows` rows of `width` bytes from `src`, `spitch` apart, to `dst` bytes
/// into k's staging, `dpitch` apart.
#[derive(Clone, Copy, Debug)]
pub(super) struct Send {
    pub src: Loc,
    pub dst: u64,
    pub width: u64,
    pub rows: u64,
    pub spitch: u64,
    pub dpitch: u64,
}

/// The flag words of an instance's members as this process addresses them: member at position `p` (of the instance's
/// devices) owns words `p * STRIDE ..`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Words {
    pub base: u64,
}

impl Words {
    pub fn at(self, position: usize, word: usize) -> u64 {
        self.base + 4 * (position * STRIDE + word) as u64
    }
}

/// Largest pitch a 2-D copy takes (the driver's limit is at least 2^31 − 1 on the GPUs Peerless runs on); rows further
/// apart move one copy each.
const MAX_PITCH: u64 = (1 << 31) - 1;

/// Adds a copy of `rows` rows of `width` bytes, `spitch` apart from `src` and `dpitch` apart at `dst`: one copy where
/// the rows abut, one 2-D copy, or, with pitches beyond the driver's, a copy per row.
fn copy(ops: &mut Vec<Op>, dst: Loc, src: Loc, (width, rows, dpitch, spitch): (u64, u64, u64, u64)) {
    if width == 0 || rows == 0 {
        return;
    }
    if rows == 1 || (width == spitch && width == dpitch) {
        ops.push(move1(dst, src, width * rows));
    } else if spitch <= MAX_PITCH && dpitch <= MAX_PITCH {
        ops.push(Op::Move { dst, src, width, rows, dpitch, spitch });
    } else {
        for r in 0..rows {
            ops.push(move1(dst.plus(r * dpitch), src.plus(r * spitch), width));
        }
    }
}

/// Pushes `s` into the staging at `base`.
fn push(ops: &mut Vec<Op>, s: Send, base: u64) {
    copy(ops, Loc::At(base + s.dst), s.src, (s.width, s.rows, s.dpitch, s.spitch));
}

/// Member `idx`'s place, its watch word, and its peers' indices in ring order from `idx + 1`.
fn ring(words: Words, idx: usize, positions: &[usize]) -> (usize, u64, Vec<usize>) {
    let g = positions.len();
    let me = positions[idx];
    (me, words.at(me, MARK), (1..g).map(|i| (idx + i) % g).collect())
}

/// A grouped call (all-to-all; reduce-scatter and the all-reduce's first half) of member `idx` in a group whose members
/// sit at `positions` (their places among the instance's devices) with staging at `staging`: `send(k)` goes into member
/// k's staging, then `outs` (where, byte offset in my staging, length) are copied out of mine.
pub(super) fn grouped(
    words: Words,
    idx: usize,
    positions: &[usize],
    staging: &[u64],
    send: impl Fn(usize) -> Send,
    outs: &[(Loc, u64, u64)],
) -> Vec<Op> {
    let (me, mark, peers) = ring(words, idx, positions);
    let mut ops = Vec::new();
    for &k in &peers {
        ops.push(Op::Signal(words.at(positions[k], ARRIVE + idx)));
    }
    push(&mut ops, send(idx), staging[idx]);
    for &k in &peers {
        ops.push(Op::Await { addr: words.at(me, ARRIVE + k), code: (1 + ARRIVE + k) as u32, mark });
        push(&mut ops, send(k), staging[k]);
        ops.push(Op::Signal(words.at(positions[k], DONE + idx)));
    }
    for &k in &peers {
        ops.push(Op::Await { addr: words.at(me, DONE + k), code: (1 + DONE + k) as u32, mark });
    }
    if !peers.is_empty() {
        ops.push(Op::Unmark(mark));
    }
    for &(dst, at, len) in outs.iter().filter(|o| o.2 > 0) {
        ops.push(move1(dst, Loc::At(staging[idx] + at), len));
    }
    ops
}

/// An all-gather by pulls (all-gather; all-reduce's second half) of member `idx` (group as in [`grouped`]): `stage`
/// puts my part into my own staging, "ready" goes to every peer, `take(idx)` copies my part into my result meanwhile,
/// then for each peer k `take(k)` (its `dst` an offset in my result) reads k's part out of k's staging into my result
/// and "taken" goes back to k; the call ends once every peer has taken mine, so my staging is free again. A push into
/// the peers' staging would need a copy-out of the whole result after it: pulls move `g + 1` parts per member where
/// that moves `2g`, and the HBM the copies leave is what a GEMM beside them runs on.
pub(super) fn pulled(
    words: Words,
    idx: usize,
    positions: &[usize],
    staging: &[u64],
    stage: Send,
    take: impl Fn(usize) -> Send,
) -> Vec<Op> {
    let (me, mark, peers) = ring(words, idx, positions);
    let mut ops = Vec::new();
    // `take`'s `dst` is a byte offset in my result 0.
    let into_result = |ops: &mut Vec<Op>, s: Send| {
        let Send { src, dst, width, rows, spitch, dpitch } = s;
        copy(ops, Loc::Ret(0, dst), src, (width, rows, dpitch, spitch));
    };
    if !peers.is_empty() {
        push(&mut ops, stage, staging[idx]);
    }
    for &k in &peers {
        ops.push(Op::Signal(words.at(positions[k], READY + idx)));
    }
    into_result(&mut ops, take(idx));
    for &k in &peers {
        ops.push(Op::Await { addr: words.at(me, READY + k), code: (1 + READY + k) as u32, mark });
        into_result(&mut ops, take(k));
        ops.push(Op::Signal(words.at(positions[k], TAKEN + idx)));
    }
    for &k in &peers {
        ops.push(Op::Await { addr: words.at(me, TAKEN + k), code: (1 + TAKEN + k) as u32, mark });
    }
    if !peers.is_empty() {
        ops.push(Op::Unmark(mark));
    }
    ops
}

/// All-gather of member `idx` (group as in [`grouped`]) along a dimension that makes my operand `rows` rows of `row`
/// bytes: part k lands at `k * row` in each of the result's rows (`g * row` bytes), pulled from k's staging.
pub(super) fn all_gather(
    words: Words,
    idx: usize,
    positions: &[usize],
    staging: &[u64],
    (rows, row): (u64, u64),
) -> Vec<Op> {
    let g = positions.len() as u64;
    let part = |src: Loc, k: usize| Send { src, dst: k as u64 * row, width: row, rows, spitch: row, dpitch: g * row };
    let len = rows * row;
    let stage = Send { src: Loc::Arg(0, 0), dst: 0, width: len, rows: 1, spitch: len, dpitch: len };
    let take = |k: usize| part(if k == idx { Loc::Arg(0, 0) } else { Loc::At(staging[k]) }, k);
    pulled(words, idx, positions, staging, stage, take)
}

/// One step of a copy-engine reduction: an operation, or the local fold (`pl_reduce_local_*`) of `world` slots of
/// `slot` bytes from `base` (my staging), `len` bytes each, into result 0 at byte `at`, in member order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Piece {
    Op(Op),
    Reduce { base: u64, slot: u64, world: usize, len: u64, at: u64 },
}

/// The bytes of a staging slot holding `len` bytes (256-byte aligned, as the kernels' loads want).
pub(super) fn slot_bytes(len: u64) -> u64 {
    len.max(16).div_ceil(256) * 256
}

/// Reduce-scatter of member `idx` (group as in [`grouped`]): member k's block for me — `rows` rows of `brow` bytes,
/// `row` apart in its operand along the call's dimension — lands in slot k of my staging, then the slots fold into my
/// result.
pub(super) fn reduce_scatter(
    words: Words,
    idx: usize,
    positions: &[usize],
    staging: &[u64],
    (rows, brow, row): (u64, u64, u64),
) -> Vec<Piece> {
    let part = rows * brow;
    let slot = slot_bytes(part);
    let send = |k: usize| Send {
        src: Loc::Arg(0, k as u64 * brow),
        dst: idx as u64 * slot,
        width: brow,
        rows,
        spitch: row,
        dpitch: brow,
    };
    let mut out: Vec<Piece> = grouped(words, idx, positions, staging, send, &[]).into_iter().map(Piece::Op).collect();
    out.push(Piece::Reduce { base: staging[idx], slot, world: positions.len(), len: part, at: 0 });
    out
}

/// All-reduce of `bytes` bytes at member `idx`, a two-shot on the copy engines: part k (`part` bytes from `k * part`,
/// [`thunks::custom_call::ce_part_bytes`]) of my operand goes to slot `idx` of member k's staging; I fold my part's
/// slots into my result; then my reduced part goes into my staging's gathered half (after the slots), from which the
/// others pull it ([`pulled`]).
pub(super) fn all_reduce(
    words: Words,
    idx: usize,
    positions: &[usize],
    staging: &[u64],
    bytes: u64,
    part: u64,
) -> Vec<Piece> {
    let g = positions.len();
    let len = |k: usize| part.min(bytes.saturating_sub(k as u64 * part));
    let slot = slot_bytes(part);
    let gathered = g as u64 * slot;
    let scatter = |k: usize| Send {
        src: Loc::Arg(0, k as u64 * part),
        dst: idx as u64 * slot,
        width: len(k),
        rows: 1,
        spitch: len(k),
        dpitch: len(k),
    };
    let mine = idx as u64 * part;
    let one = |src: Loc, dst: u64, width: u64| Send { src, dst, width, rows: 1, spitch: width, dpitch: width };
    let stage = one(Loc::Ret(0, mine), gathered, len(idx));
    let take = |k: usize| one(Loc::At(staging[k] + gathered), k as u64 * part, if k == idx { 0 } else { len(k) });
    let mut out: Vec<Piece> =
        grouped(words, idx, positions, staging, scatter, &[]).into_iter().map(Piece::Op).collect();
    out.push(Piece::Reduce { base: staging[idx], slot, world: g, len: len(idx), at: mine });
    out.extend(pulled(words, idx, positions, staging, stage, take).into_iter().map(Piece::Op));
    out
}

/// A member of a permute as another member sees it: its place among the instance's devices and its staging.
#[derive(Clone, Copy, Debug)]
pub(super) struct Peer {
    pub position: usize,
    pub staging: u64,
}

/// Collective-permute of `len` bytes at the member at position `me` (staging `mine`): to `target` (`None`: sends
/// nothing; itself: a local copy), from `source` (`None`: zeros).
pub(super) fn permute(words: Words, me: Peer, target: Option<Peer>, source: Option<Peer>, len: u64) -> Vec<Op> {
    let mark = words.at(me.position, MARK);
    let mut ops = Vec::new();
    let from_peer = source.filter(|s| s.position != me.position);
    if let Some(s) = from_peer {
        ops.push(Op::Signal(words.at(s.position, ARRIVE)));
    }
    match target {
        Some(t) if t.position == me.position && len > 0 => ops.push(move1(Loc::Ret(0, 0), Loc::Arg(0, 0), len)),
        Some(t) if t.position == me.position => {}
        Some(t) => {
            ops.push(Op::Await { addr: words.at(me.position, ARRIVE), code: (1 + ARRIVE) as u32, mark });
            if len > 0 {
                ops.push(move1(Loc::At(t.staging), Loc::Arg(0, 0), len));
            }
            ops.push(Op::Signal(words.at(t.position, DONE + 1)));
        }
        None => {}
    }
    if from_peer.is_some() {
        ops.push(Op::Await { addr: words.at(me.position, DONE + 1), code: (1 + DONE + 1) as u32, mark });
    }
    if from_peer.is_some() || target.is_some_and(|t| t.position != me.position) {
        ops.push(Op::Unmark(mark));
    }
    if len > 0 {
        match source {
            Some(s) if s.position != me.position => ops.push(move1(Loc::Ret(0, 0), Loc::At(me.staging), len)),
            Some(_) => {}
            None => ops.push(Op::Zero { dst: Loc::Ret(0, 0), len }),
        }
    }
    ops
}

#[cfg(test)]
#[path = "../../../tests/unit/copy_engine.rs"]
mod tests;
