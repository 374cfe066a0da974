//! A simulated device's memory: one zeroed, 64-byte aligned allocation of atomic words.
//!
//! Every access to arena memory, data and flags alike, is an atomic operation on a whole
//! 64-bit word (data with `Relaxed`, signal flags with `Release` / `Acquire`). That makes
//! the arena sound under Rust's memory model whatever callers do: a buggy protocol or an
//! overlapping region yields wrong bytes, never undefined behaviour, and there is no
//! `unsafe` here at all. Ordering of data between devices comes only from the protocol's
//! release/acquire flags: a relaxed data store sequenced before a release flag store is
//! visible to every relaxed load sequenced after an acquire load that reads that flag.
//!
//! Sub-word writes (the head and tail of a byte range that does not start or end on a word
//! boundary) merge into their word with a compare-and-swap loop, so two devices writing
//! adjacent bytes of one word (two 1-byte slots of an all-gather) never lose each other's
//! bytes. Using one access size everywhere also avoids racing mixed-size atomics.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// One cache line of words; the arena is a slice of these, so it is 64-byte aligned.
#[repr(C, align(64))]
#[derive(Default)]
struct Line([AtomicU64; 8]);

/// Bytes moved per step by copies and reductions (a multiple of every element size).
pub(crate) const CHUNK: usize = 4096;

/// Bounds are the cluster's business (`HostCluster::check`); every range passed here has
/// been checked against the arena size.
pub(crate) struct Arena {
    lines: Box<[Line]>,
}

impl Arena {
    /// A zeroed arena of `bytes` bytes, or `None` if the allocation fails.
    pub(crate) fn new(bytes: usize) -> Option<Self> {
        let n = bytes.div_ceil(64);
        let mut v: Vec<Line> = Vec::new();
        v.try_reserve_exact(n).ok()?;
        v.resize_with(n, Line::default);
        Some(Arena { lines: v.into_boxed_slice() })
    }

    /// Word `w` (bytes `8w..8w+8`). Callers check ranges first.
    fn word(&self, w: usize) -> &AtomicU64 {
        &self.lines[w / 8].0[w % 8]
    }

    /// Copies `out.len()` bytes starting at byte `off` into `out`.
    pub(crate) fn load(&self, off: usize, out: &mut [u8]) {
        for_each_word_piece(off, out.len(), |w, b, n, o| {
            let bytes = self.word(w).load(Relaxed).to_le_bytes();
            out[o..o + n].copy_from_slice(&bytes[b..b + n]);
        });
    }

    /// Writes `src` starting at byte `off`; bytes outside the range are preserved.
    pub(crate) fn store(&self, off: usize, src: &[u8]) {
        for_each_word_piece(off, src.len(), |w, b, n, o| {
            let word = self.word(w);
            if n == 8 {
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(&src[o..o + 8]);
                word.store(u64::from_le_bytes(bytes), Relaxed);
            } else {
                // The closure always returns `Some`, so this cannot fail.
                let _ = word.fetch_update(Relaxed, Relaxed, |old| {
                    let mut bytes = old.to_le_bytes();
                    bytes[b..b + n].copy_from_slice(&src[o..o + n]);
                    Some(u64::from_le_bytes(bytes))
                });
            }
        });
    }

    /// Zeroes `len` bytes starting at `off`.
    pub(crate) fn zero(&self, off: usize, len: usize) {
        let zeros = [0u8; CHUNK];
        let mut done = 0;
        while done < len {
            let n = CHUNK.min(len - done);
            self.store(off + done, &zeros[..n]);
            done += n;
        }
    }

    /// A signal flag: the 32-bit counter in the low half of word `w`, read with `Acquire`.
    pub(crate) fn flag_load(&self, w: usize) -> u32 {
        self.word(w).load(Acquire) as u32
    }

    /// Publishes counter value `v` in word `w` with `Release`: everything this thread
    /// wrote before is visible to a thread whose acquire load reads `v`.
    pub(crate) fn flag_store(&self, w: usize, v: u32) {
        self.word(w).store(u64::from(v), Release);
    }

    /// A device-private counter in word `w` (only the owning device reads or writes it).
    pub(crate) fn counter_load(&self, w: usize) -> u32 {
        self.word(w).load(Relaxed) as u32
    }

    pub(crate) fn counter_store(&self, w: usize, v: u32) {
        self.word(w).store(u64::from(v), Relaxed);
    }
}

/// Splits byte range `[off, off + len)` into per-word pieces and calls
/// `f(word, byte_in_word, piece_len, offset_in_range)` for each, in ascending order.
fn for_each_word_piece(off: usize, len: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
    let mut done = 0;
    while done < len {
        let pos = off + done;
        let b = pos % 8;
        let n = (8 - b).min(len - done);
        f(pos / 8, b, n, done);
        done += n;
    }
}

/// Copies `len` bytes from `src` at `s` to `dst` at `d` with `memmove` semantics (when
/// `src` and `dst` are the same arena and the ranges overlap, the result is as if the
/// source were read first). Ranges are checked by the caller.
pub(crate) fn copy(src: &Arena, s: usize, dst: &Arena, d: usize, len: usize) {
    let mut buf = [0u8; CHUNK];
    let backward = std::ptr::eq(src, dst) && d > s && d < s + len;
    let chunks = len.div_ceil(CHUNK);
    for i in 0..chunks {
        let k = if backward { chunks - 1 - i } else { i };
        let at = k * CHUNK;
        let n = CHUNK.min(len - at);
        src.load(s + at, &mut buf[..n]);
        dst.store(d + at, &buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_round_trips_and_neighbours_survive() {
        let a = Arena::new(100).unwrap();
        let data: Vec<u8> = (1..=37).collect();
        a.store(3, &data);
        let mut out = vec![0u8; 37];
        a.load(3, &mut out);
        assert_eq!(out, data);
        let mut edge = [9u8; 2];
        a.load(2, &mut edge[..1]);
        a.load(40, &mut edge[1..]);
        assert_eq!(edge, [0, 0]);
        // Overlapping copies behave like memmove in both directions.
        copy(&a, 3, &a, 5, 37);
        a.load(5, &mut out);
        assert_eq!(out, data);
        copy(&a, 5, &a, 1, 37);
        a.load(1, &mut out);
        assert_eq!(out, data);
    }

    #[test]
    fn flags_are_32_bit_counters() {
        let a = Arena::new(64).unwrap();
        a.flag_store(1, u32::MAX);
        assert_eq!(a.flag_load(1), u32::MAX);
        assert_eq!(a.flag_load(0), 0);
    }
}
