//! The copy-engine protocol run on a model of memory: every member's operations execute one
//! at a time in an order drawn at random (each stream in its own order, a wait blocking until
//! its word is set), several calls back to back on the same flags and staging, each call with
//! buffers of its own as XLA hands them. Results must equal the collective's definition and
//! no interleaving may deadlock.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// Flat memory: staging, flag words, and every call's operands and results.
struct Mem {
    bytes: Vec<u8>,
}

impl Mem {
    fn alloc(&mut self, len: usize) -> u64 {
        let at = self.bytes.len().next_multiple_of(256);
        self.bytes.resize(at + len.max(1), 0);
        at as u64
    }
    fn word(&self, a: u64) -> u32 {
        let a = a as usize;
        u32::from_ne_bytes(self.bytes[a..a + 4].try_into().unwrap())
    }
    fn set_word(&mut self, a: u64, v: u32) {
        let a = a as usize;
        self.bytes[a..a + 4].copy_from_slice(&v.to_ne_bytes());
    }
}

/// One call of one member: where its operands and results lie.
struct Buffers {
    args: Vec<u64>,
    rets: Vec<u64>,
}

fn resolve(l: Loc, b: &Buffers) -> u64 {
    match l {
        Loc::Arg(i, o) => b.args[i] + o,
        Loc::Ret(i, o) => b.rets[i] + o,
        Loc::At(a) => a,
    }
}

/// Runs `calls` calls of `ops[m]` for every member m, interleaved at random by `seed`; the
/// buffers of member m's call c are `bufs[c][m]`. Panics on a deadlock.
fn simulate(mem: &mut Mem, ops: &[Vec<Op>], bufs: &[Vec<Buffers>], seed: u64) {
    let pieces: Vec<Vec<Piece>> = ops.iter().map(|o| o.iter().copied().map(Piece::Op).collect()).collect();
    simulate_pieces(mem, &pieces, bufs, seed);
}

/// Executes operation `op` of member `m`'s call `c` (its buffers `b`) on the model.
fn step(mem: &mut Mem, op: Op, b: &Buffers, m: usize, c: usize) {
    match op {
        Op::Signal(a) => {
            assert_eq!(mem.word(a), 0, "member {m} call {c}: signal of a word still set");
            mem.set_word(a, 1);
        }
        Op::Await { addr, code, mark } => {
            assert!(code > 0);
            mem.set_word(mark, code);
            mem.set_word(addr, 0);
        }
        Op::Unmark(mark) => mem.set_word(mark, 0),
        Op::Move { dst, src, width, rows, dpitch, spitch } => {
            let (d, s) = (resolve(dst, b) as usize, resolve(src, b) as usize);
            for r in 0..rows as usize {
                let (d, s) = (d + r * dpitch as usize, s + r * spitch as usize);
                let row = mem.bytes[s..s + width as usize].to_vec();
                mem.bytes[d..d + width as usize].copy_from_slice(&row);
            }
        }
        Op::Zero { dst, len } => {
            let d = resolve(dst, b) as usize;
            mem.bytes[d..d + len as usize].fill(0);
        }
    }
}

/// Buffers for `calls` calls of `members` members: operands of `args` bytes, filled at random
/// (a distinct pattern per call), results of `rets` bytes, poisoned.
fn buffers(
    mem: &mut Mem,
    rng: &mut ChaCha8Rng,
    calls: usize,
    members: usize,
    args: &[usize],
    rets: &[usize],
) -> Vec<Vec<Buffers>> {
    (0..calls)
        .map(|_| {
            (0..members)
                .map(|_| {
                    let a: Vec<u64> = args.iter().map(|&l| mem.alloc(l)).collect();
                    for (&at, &l) in a.iter().zip(args) {
                        rng.fill(&mut mem.bytes[at as usize..at as usize + l]);
                    }
                    let r: Vec<u64> = rets.iter().map(|&l| mem.alloc(l)).collect();
                    for (&at, &l) in r.iter().zip(rets) {
                        mem.bytes[at as usize..at as usize + l].fill(0xa5);
                    }
                    Buffers { args: a, rets: r }
                })
                .collect()
        })
        .collect()
}

fn bytes(mem: &Mem, at: u64, len: usize) -> &[u8] {
    &mem.bytes[at as usize..at as usize + len]
}

const CALLS: usize = 4;
const SEEDS: u64 = 40;

#[test]
fn all_gather_any_dimension() {
    for g in [2usize, 3, 4] {
        for (outer, row) in [(1usize, 24usize), (3, 5), (4, 16)] {
            for seed in 0..SEEDS {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let mut mem = Mem { bytes: vec![] };
                let words = Words { base: mem.alloc(4 * STRIDE * g) };
                let staging: Vec<u64> = (0..g).map(|_| mem.alloc(outer * row * g)).collect();
                let positions: Vec<usize> = (0..g).collect();
                let rb = outer * row * g;
                let ops: Vec<Vec<Op>> = (0..g)
                    .map(|idx| all_gather(words, idx, &positions, &staging, (outer as u64, row as u64)))
                    .collect();
                let bufs = buffers(&mut mem, &mut rng, CALLS, g, &[outer * row], &[rb]);
                simulate(&mut mem, &ops, &bufs, seed);
                for call in &bufs {
                    for b in call {
                        let got = bytes(&mem, b.rets[0], rb);
                        for o in 0..outer {
                            for (k, src) in call.iter().enumerate() {
                                let want = &bytes(&mem, src.args[0], outer * row)[o * row..(o + 1) * row];
                                let at = (o * g + k) * row;
                                assert_eq!(&got[at..at + row], want, "g {g} outer {outer} seed {seed}");
                            }
                        }
                    }
                }
                assert!(ops.iter().flatten().all(|op| !matches!(op, Op::Zero { .. })));
            }
        }
    }
}

#[test]
fn all_to_all_array_and_tuple() {
    for g in [2usize, 3, 4] {
        for seed in 0..SEEDS {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            // Array form: outer 2, a row of g blocks of 6 bytes.
            let (outer, brow) = (2usize, 6usize);
            let row = g * brow;
            let mut mem = Mem { bytes: vec![] };
            let words = Words { base: mem.alloc(4 * STRIDE * g) };
            let staging: Vec<u64> = (0..g).map(|_| mem.alloc(outer * row)).collect();
            let positions: Vec<usize> = (0..g).collect();
            let ops: Vec<Vec<Op>> = (0..g)
                .map(|idx| {
                    let send = |k: usize| Send {
                        src: Loc::Arg(0, (k * brow) as u64),
                        dst: (idx * brow) as u64,
                        width: brow as u64,
                        rows: outer as u64,
                        spitch: row as u64,
                        dpitch: row as u64,
                    };
                    grouped(words, idx, &positions, &staging, send, &[(Loc::Ret(0, 0), 0, (outer * row) as u64)])
                })
                .collect();
            let bufs = buffers(&mut mem, &mut rng, CALLS, g, &[outer * row], &[outer * row]);
            simulate(&mut mem, &ops, &bufs, seed);
            for call in &bufs {
                for (idx, b) in call.iter().enumerate() {
                    let got = bytes(&mem, b.rets[0], outer * row).to_vec();
                    for (k, src) in call.iter().enumerate() {
                        let s = bytes(&mem, src.args[0], outer * row);
                        for o in 0..outer {
                            let want = &s[o * row + idx * brow..o * row + (idx + 1) * brow];
                            assert_eq!(&got[o * row + k * brow..o * row + (k + 1) * brow], want);
                        }
                    }
                }
            }

            // Tuple form: operand k (7 + k bytes) to member k, one 256-byte chunk per member.
            let lens: Vec<usize> = (0..g).map(|k| 7 + k).collect();
            let chunk = 256u64;
            let mut mem = Mem { bytes: vec![] };
            let words = Words { base: mem.alloc(4 * STRIDE * g) };
            let staging: Vec<u64> = (0..g).map(|_| mem.alloc(256 * g)).collect();
            let ops: Vec<Vec<Op>> = (0..g)
                .map(|idx| {
                    let send = |k: usize| Send {
                        src: Loc::Arg(k, 0),
                        dst: idx as u64 * chunk,
                        width: lens[k] as u64,
                        rows: 1,
                        spitch: lens[k] as u64,
                        dpitch: lens[k] as u64,
                    };
                    // Result j comes from member j and has my operand length.
                    let outs: Vec<(Loc, u64, u64)> =
                        (0..g).map(|j| (Loc::Ret(j, 0), j as u64 * chunk, lens[idx] as u64)).collect();
                    grouped(words, idx, &positions, &staging, send, &outs)
                })
                .collect();
            // Member idx's results all have length lens[idx]; its operand k has lens[k].
            let mut bufs: Vec<Vec<Buffers>> = Vec::new();
            for _ in 0..CALLS {
                let mut call = Vec::new();
                for idx in 0..g {
                    let mut b = buffers(&mut mem, &mut rng, 1, 1, &lens, &vec![lens[idx]; g]);
                    call.push(b.remove(0).remove(0));
                }
                bufs.push(call);
            }
            simulate(&mut mem, &ops, &bufs, seed);
            for call in &bufs {
                for (idx, b) in call.iter().enumerate() {
                    for (j, src) in call.iter().enumerate() {
                        assert_eq!(bytes(&mem, b.rets[j], lens[idx]), bytes(&mem, src.args[idx], lens[idx]));
                    }
                }
            }
        }
    }
}

#[test]
fn permute_pairs_self_and_missing_sources() {
    let cases: &[(usize, &[(usize, usize)])] = &[
        (2, &[(0, 1), (1, 0)]),
        (3, &[(0, 1), (1, 2), (2, 0)]),
        (3, &[(0, 1)]),
        (3, &[(0, 0), (1, 2)]),
        (4, &[(3, 0), (0, 2)]),
    ];
    for &(n, pairs) in cases {
        for seed in 0..SEEDS {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let len = 37usize;
            let mut mem = Mem { bytes: vec![] };
            let words = Words { base: mem.alloc(4 * STRIDE * n) };
            let peers: Vec<Peer> = (0..n).map(|p| Peer { position: p, staging: mem.alloc(len) }).collect();
            let ops: Vec<Vec<Op>> = (0..n)
                .map(|d| {
                    let target = pairs.iter().find(|p| p.0 == d).map(|p| peers[p.1]);
                    let source = pairs.iter().find(|p| p.1 == d).map(|p| peers[p.0]);
                    permute(words, peers[d], target, source, len as u64)
                })
                .collect();
            let bufs = buffers(&mut mem, &mut rng, CALLS, n, &[len], &[len]);
            simulate(&mut mem, &ops, &bufs, seed);
            for call in &bufs {
                for (d, b) in call.iter().enumerate() {
                    let got = bytes(&mem, b.rets[0], len);
                    match pairs.iter().find(|p| p.1 == d) {
                        Some(&(s, _)) => assert_eq!(got, bytes(&mem, call[s].args[0], len), "{pairs:?} device {d}"),
                        None => assert!(got.iter().all(|&x| x == 0), "{pairs:?} device {d}: zeros"),
                    }
                }
            }
        }
    }
}

/// `op` with operand and result 0 renamed `i`: one call of the model runs several collectives.
fn renamed(op: Op, i: usize) -> Op {
    let at = |l: Loc| match l {
        Loc::Arg(0, o) => Loc::Arg(i, o),
        Loc::Ret(0, o) => Loc::Ret(i, o),
        other => other,
    };
    match op {
        Op::Move { dst, src, width, rows, dpitch, spitch } => {
            Op::Move { dst: at(dst), src: at(src), width, rows, dpitch, spitch }
        }
        Op::Zero { dst, len } => Op::Zero { dst: at(dst), len },
        other => other,
    }
}

#[test]
fn pulls_and_pushes_share_flags_and_staging() {
    // All-gather (pulls), all-to-all (pushes), all-gather again, back to back on one instance's
    // words and staging: neither protocol's words or staging may be taken by the other's.
    for g in [2usize, 3, 4] {
        for seed in 0..SEEDS {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let (part, brow) = (24usize, 8usize);
            let row = g * brow;
            let mut mem = Mem { bytes: vec![] };
            let words = Words { base: mem.alloc(4 * STRIDE * g) };
            let staging: Vec<u64> = (0..g).map(|_| mem.alloc(g * part)).collect();
            let positions: Vec<usize> = (0..g).collect();
            let ops: Vec<Vec<Op>> = (0..g)
                .map(|idx| {
                    let send = |k: usize| Send {
                        src: Loc::Arg(1, (k * brow) as u64),
                        dst: (idx * brow) as u64,
                        width: brow as u64,
                        rows: 1,
                        spitch: brow as u64,
                        dpitch: brow as u64,
                    };
                    let gather = all_gather(words, idx, &positions, &staging, (1, part as u64));
                    let mut ops = gather.clone();
                    ops.extend(grouped(words, idx, &positions, &staging, send, &[(Loc::Ret(1, 0), 0, row as u64)]));
                    ops.extend(gather.into_iter().map(|op| renamed(op, 2)));
                    ops
                })
                .collect();
            let bufs = buffers(&mut mem, &mut rng, CALLS, g, &[part, row, part], &[g * part, row, g * part]);
            simulate(&mut mem, &ops, &bufs, seed);
            for call in &bufs {
                for (idx, b) in call.iter().enumerate() {
                    for (k, src) in call.iter().enumerate() {
                        for i in [0, 2] {
                            let got = &bytes(&mem, b.rets[i], g * part)[k * part..(k + 1) * part];
                            assert_eq!(got, bytes(&mem, src.args[i], part), "g {g} seed {seed} gather {i}");
                        }
                        let got = &bytes(&mem, b.rets[1], row)[k * brow..(k + 1) * brow];
                        assert_eq!(
                            got,
                            &bytes(&mem, src.args[1], row)[idx * brow..(idx + 1) * brow],
                            "g {g} seed {seed}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn waits_name_the_member_they_wait_for() {
    // Grouped and pulled: a wait on ARRIVE + k, DONE + k, READY + k or TAKEN + k reports member k.
    for k in 0..super::super::MAX_RANKS {
        for base in [ARRIVE, DONE, READY, TAKEN] {
            assert_eq!(member_of_word(base + k), k);
        }
    }
    // Permute: bit 0 is the target (ARRIVE), bit 1 the source (DONE + 1).
    assert_eq!(member_of_word(ARRIVE), 0);
    assert_eq!(member_of_word(DONE + 1), 1);
}

#[test]
fn rows_beyond_the_pitch_limit_move_one_copy_each() {
    let mut ops = Vec::new();
    let s = Send { src: Loc::Arg(0, 0), dst: 0, width: 8, rows: 3, spitch: 8, dpitch: MAX_PITCH + 1 };
    push(&mut ops, s, 1000);
    assert_eq!(ops.len(), 3);
    assert_eq!(ops[2], move1(Loc::At(1000 + 2 * (MAX_PITCH + 1)), Loc::Arg(0, 16), 8));
    // Contiguous rows are one copy.
    let mut ops = Vec::new();
    push(&mut ops, Send { src: Loc::Arg(0, 0), dst: 0, width: 8, rows: 3, spitch: 8, dpitch: 8 }, 0);
    assert_eq!(ops, vec![move1(Loc::At(0), Loc::Arg(0, 0), 24)]);
}

/// Runs `calls` calls of `pieces[m]` for every member m, interleaved at random by `seed` (a
/// fold adds u32 words, wrapping, of the slots in member order). Panics on a deadlock.
fn simulate_pieces(mem: &mut Mem, pieces: &[Vec<Piece>], bufs: &[Vec<Buffers>], seed: u64) {
    // A fold is atomic in the model, like every operation: it follows its stream's earlier steps.
    let members = pieces.len();
    let calls = bufs.len();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // Program counter per member over its calls' operations.
    let mut pc = vec![(0usize, 0usize); members];
    loop {
        let runnable: Vec<usize> = (0..members)
            .filter(|&m| {
                let (c, i) = pc[m];
                c < calls && !matches!(pieces[m][i], Piece::Op(Op::Await { addr, .. }) if mem.word(addr) == 0)
            })
            .collect();
        if runnable.is_empty() {
            assert!(pc.iter().all(|&(c, _)| c >= calls), "deadlock at {pc:?}");
            return;
        }
        let m = runnable[rng.random_range(0..runnable.len())];
        let (c, i) = pc[m];
        match pieces[m][i] {
            Piece::Op(op) => step(mem, op, &bufs[c][m], m, c),
            Piece::Reduce { base, slot, world, len, at } => {
                let out = bufs[c][m].rets[0] + at;
                for w in (0..len).step_by(4) {
                    let sum = (0..world as u64).fold(0u32, |acc, k| acc.wrapping_add(mem.word(base + k * slot + w)));
                    mem.set_word(out + w, sum);
                }
            }
        }
        pc[m] = if i + 1 == pieces[m].len() { (c + 1, 0) } else { (c, i + 1) };
    }
}

/// Element-wise u32 wrapping sums of every member's operand.
fn sums(mem: &Mem, call: &[Buffers], len: usize) -> Vec<u8> {
    let mut out = vec![0u32; len / 4];
    for b in call {
        for (i, o) in out.iter_mut().enumerate() {
            *o = o.wrapping_add(mem.word(b.args[0] + 4 * i as u64));
        }
    }
    out.iter().flat_map(|v| v.to_ne_bytes()).collect()
}

#[test]
fn reduce_scatter_and_all_reduce_fold_every_member_once() {
    for g in [2usize, 3, 4] {
        for seed in 0..SEEDS {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let positions: Vec<usize> = (0..g).collect();
            // Reduce-scatter along an inner dimension: 3 rows of g blocks of 8 bytes.
            let (rows, brow) = (3u64, 8u64);
            let row = g as u64 * brow;
            let mut mem = Mem { bytes: vec![] };
            let words = Words { base: mem.alloc(4 * STRIDE * g) };
            let staging: Vec<u64> = (0..g).map(|_| mem.alloc(g * slot_bytes(rows * brow) as usize)).collect();
            let pieces: Vec<Vec<Piece>> =
                (0..g).map(|idx| reduce_scatter(words, idx, &positions, &staging, (rows, brow, row))).collect();
            let len = (rows * row) as usize;
            let bufs = buffers(&mut mem, &mut rng, CALLS, g, &[len], &[(rows * brow) as usize]);
            simulate_pieces(&mut mem, &pieces, &bufs, seed);
            for call in &bufs {
                let all = sums(&mem, call, len);
                for (m, b) in call.iter().enumerate() {
                    let want: Vec<u8> = (0..rows as usize)
                        .flat_map(|r| {
                            let at = r * row as usize + m * brow as usize;
                            all[at..at + brow as usize].to_vec()
                        })
                        .collect();
                    assert_eq!(bytes(&mem, b.rets[0], want.len()), &want[..], "reduce-scatter g {g} seed {seed}");
                }
            }

            // All-reduce of 100 bytes: parts of 48, 48 and 4 bytes for 3 members (the last short).
            let n = 100u64;
            let part = thunks::custom_call::ce_part_bytes(n as usize, g) as u64;
            let mut mem = Mem { bytes: vec![] };
            let words = Words { base: mem.alloc(4 * STRIDE * g) };
            let staging: Vec<u64> = (0..g).map(|_| mem.alloc((g as u64 * slot_bytes(part) + n) as usize)).collect();
            let pieces: Vec<Vec<Piece>> =
                (0..g).map(|idx| all_reduce(words, idx, &positions, &staging, n, part)).collect();
            let bufs = buffers(&mut mem, &mut rng, CALLS, g, &[n as usize], &[n as usize]);
            simulate_pieces(&mut mem, &pieces, &bufs, seed);
            for call in &bufs {
                let want = sums(&mem, call, n as usize);
                for b in call {
                    assert_eq!(bytes(&mem, b.rets[0], n as usize), &want[..], "all-reduce g {g} seed {seed}");
                }
            }
        }
    }
}
