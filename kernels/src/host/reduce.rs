//! The typed reduction loops every host collective uses (one-shot, two-shot, reduce-scatter and the fallback), in one
//! place so that all paths agree bit for bit.
//!
//! Semantics, per element, folding group members in fixed order (member 0, 1, ...): `acc = m0; acc = op(acc, m1); ...`.
//! - `pred`: sum is xor (XLA adds `i1`), prod / min / and are and, max / or are or; any non-zero byte is true and
//!   results are 0 or 1.
//! - integers: sum and prod wrap; min / max; and / or are bitwise.
//! - `bf16`: members are widened to `f32`, folded in `f32` and rounded once at the end, as the GPU kernels do (XLA:CPU
//!   widens bf16 collectives to f32 before the pass).
//! - `f16`: sums and products round to f16 after every step, as XLA:CPU's f16 collectives do (overflow included); min /
//!   max need no rounding.
//! - floats: sums start from the identity +0 as XLA:CPU's do (all -0 members sum to +0).
//! - `f32` / `f64`: folded in their own type. min / max give what XLA:CPU's collectives give (measured, jax 0.11.2, 8
//!   host devices): NaN members are skipped, all-NaN gives -inf for max and +inf for min, and of -0 and +0 the earlier
//!   member wins. (The CUDA kernels give XLA's GPU answers instead; docs/PLUGIN.md has both.)
//!
//! A single member is copied byte for byte (no widening round trip).

use half::{bf16, f16};
use hlo::PrimitiveType as T;
use hlo::analysis::ReductionKind as K;

/// A validated (element type, reduction) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reducer {
    ty: T,
    kind: K,
}

impl Reducer {
    /// The reducer for `kind` over `ty`, or why there is none.
    pub(crate) fn new(ty: T, kind: K) -> Result<Self, String> {
        if !ty.is_computable() {
            return Err(format!(
                "cannot reduce {ty} (only pred, s8-s64, u8-u64, f16, bf16, f32 and f64 are computed on)"
            ));
        }
        if ty.is_float() && matches!(kind, K::And | K::Or) {
            return Err(format!("{kind} is not defined on {ty}"));
        }
        Ok(Reducer { ty, kind })
    }

    /// Reduces `members` (each at least `out.len()` bytes, a whole number of elements) element-wise into `out`, folding
    /// members in slice order.
    pub(crate) fn reduce(self, members: &[&[u8]], out: &mut [u8]) {
        match members {
            [] => out.fill(0),
            [one] => out.copy_from_slice(&one[..out.len()]),
            _ => self.fold(members, out),
        }
    }

    fn fold(self, m: &[&[u8]], out: &mut [u8]) {
        macro_rules! int {
            ($t:ty, $w:literal) => {{
                let ld = <$t>::from_le_bytes;
                let st = <$t>::to_le_bytes;
                match self.kind {
                    K::Sum => fold::<$w, $t>(m, out, ld, <$t>::wrapping_add, st),
                    K::Prod => fold::<$w, $t>(m, out, ld, <$t>::wrapping_mul, st),
                    K::Min => fold::<$w, $t>(m, out, ld, Ord::min, st),
                    K::Max => fold::<$w, $t>(m, out, ld, Ord::max, st),
                    K::And => fold::<$w, $t>(m, out, ld, |a, b| a & b, st),
                    K::Or => fold::<$w, $t>(m, out, ld, |a, b| a | b, st),
                }
            }};
        }
        macro_rules! float {
            ($w:literal, $acc:ty, $ld:expr, $st:expr) => {{
                match self.kind {
                    // XLA:CPU sums from the identity +0, so all -0 members give +0.
                    K::Sum => fold_from::<$w, $acc>(m, out, $ld, |a| a + 0.0, |a, b| a + b, $st),
                    K::Prod => fold::<$w, $acc>(m, out, $ld, |a, b| a * b, $st),
                    K::Min => fold::<$w, $acc>(m, out, $ld, |a, b| min_max(a, b, false, <$acc>::INFINITY), $st),
                    K::Max => fold::<$w, $acc>(m, out, $ld, |a, b| min_max(a, b, true, <$acc>::NEG_INFINITY), $st),
                    // Rejected by `Reducer::new`; keep member 0 rather than panic.
                    K::And | K::Or => fold::<$w, $acc>(m, out, $ld, |a, _| a, $st),
                }
            }};
        }
        match self.ty {
            T::Pred => {
                let ld = |b: [u8; 1]| b[0] != 0;
                let st = |v: bool| [u8::from(v)];
                match self.kind {
                    K::Sum => fold::<1, bool>(m, out, ld, |a, b| a ^ b, st),
                    K::Prod | K::Min | K::And => fold::<1, bool>(m, out, ld, |a, b| a & b, st),
                    K::Max | K::Or => fold::<1, bool>(m, out, ld, |a, b| a | b, st),
                }
            }
            T::S8 => int!(i8, 1),
            T::S16 => int!(i16, 2),
            T::S32 => int!(i32, 4),
            T::S64 => int!(i64, 8),
            T::U8 => int!(u8, 1),
            T::U16 => int!(u16, 2),
            T::U32 => int!(u32, 4),
            T::U64 => int!(u64, 8),
            T::F16 => {
                let ld = |b: [u8; 2]| f16::from_le_bytes(b).to_f32();
                let st = |v: f32| f16::from_f32(v).to_le_bytes();
                // XLA:CPU adds and multiplies f16 collectives in f16, rounding every partial result (so 65504 + 65504 -
                // 65504 is inf, as there); min / max are exact.
                let r = |v: f32| f16::from_f32(v).to_f32();
                match self.kind {
                    K::Sum => fold_from::<2, f32>(m, out, ld, |a| a + 0.0, |a, b| r(a + b), st),
                    K::Prod => fold::<2, f32>(m, out, ld, |a, b| r(a * b), st),
                    _ => float!(2, f32, ld, st),
                }
            }
            T::Bf16 => {
                float!(2, f32, |b: [u8; 2]| bf16::from_le_bytes(b).to_f32(), |v: f32| bf16::from_f32(v).to_le_bytes())
            }
            T::F32 => float!(4, f32, f32::from_le_bytes, f32::to_le_bytes),
            T::F64 => float!(8, f64, f64::from_le_bytes, f64::to_le_bytes),
            // Not computable (rejected by `Reducer::new`): keep member 0.
            _ => out.copy_from_slice(&m[0][..out.len()]),
        }
    }
}

/// XLA:CPU's collective max (`max = true`) / min, one step of the fold over members in group order. XLA:CPU starts from
/// the identity (-inf for max, +inf for min) and takes a member only when it is strictly greater: NaN members are
/// skipped (all-NaN gives -inf), and of -0 and +0 the earlier member stays. Folding from member 0 instead, a NaN there
/// is the identity.
fn min_max<F: PartialOrd + Copy>(acc: F, x: F, max: bool, identity: F) -> F {
    // NaN, the one float unordered with itself.
    let acc = if acc.partial_cmp(&acc).is_none() { identity } else { acc };
    if if max { x > acc } else { x < acc } { x } else { acc }
}

/// Element `i` of width `W` from `m` (zeros past the end, which callers never ask for).
fn elem<const W: usize>(m: &[u8], i: usize) -> [u8; W] {
    let mut b = [0u8; W];
    if let Some(s) = m.get(i * W..i * W + W) {
        b.copy_from_slice(s);
    }
    b
}

fn fold<const W: usize, A: Copy>(
    members: &[&[u8]],
    out: &mut [u8],
    load: impl Fn([u8; W]) -> A,
    op: impl Fn(A, A) -> A,
    store: impl Fn(A) -> [u8; W],
) {
    fold_from(members, out, load, |a| a, op, store);
}

/// [`fold`] with `start` applied to member 0's element (e.g. joining the identity).
fn fold_from<const W: usize, A: Copy>(
    members: &[&[u8]],
    out: &mut [u8],
    load: impl Fn([u8; W]) -> A,
    start: impl Fn(A) -> A,
    op: impl Fn(A, A) -> A,
    store: impl Fn(A) -> [u8; W],
) {
    let Some((first, rest)) = members.split_first() else { return };
    if members.iter().any(|m| m.len() < out.len()) {
        // Short members (callers never pass them): element by element, zeros past the end.
        for (i, o) in out.chunks_exact_mut(W).enumerate() {
            let mut acc = start(load(elem::<W>(first, i)));
            for m in rest {
                acc = op(acc, load(elem::<W>(m, i)));
            }
            o.copy_from_slice(&store(acc));
        }
        return;
    }
    // Blocks of BLOCK elements, member by member within a block: each element still folds member 0, 1, ... in order
    // (the same results bit for bit), but the inner loop walks one member's bytes contiguously, which the compiler
    // vectorizes, where element-major order strode across every member per element (the host all-reduces spent most of
    // their time here at 64 KiB and up).
    const BLOCK: usize = 512;
    let word = |c: &[u8]| -> [u8; W] {
        let mut b = [0u8; W];
        b.copy_from_slice(c);
        b
    };
    let mut acc: Vec<A> = Vec::with_capacity(BLOCK.min(out.len() / W.max(1)));
    for (k, o) in out.chunks_mut(BLOCK * W).enumerate() {
        let span = k * BLOCK * W..k * BLOCK * W + o.len();
        acc.clear();
        acc.extend(first[span.clone()].chunks_exact(W).map(|c| start(load(word(c)))));
        for m in rest {
            for (a, c) in acc.iter_mut().zip(m[span.clone()].chunks_exact(W)) {
                *a = op(*a, load(word(c)));
            }
        }
        for (o, a) in o.chunks_exact_mut(W).zip(&acc) {
            o.copy_from_slice(&store(*a));
        }
    }
}

#[cfg(test)]
#[path = "../../tests/unit/reduce.rs"]
mod tests;
