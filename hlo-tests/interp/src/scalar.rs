//! Scalar semantics: one element of a computable type, and XLA's elementwise rules on it.
//!
//! Every elementwise op of the interpreter is written once here, on [`Sc`]; arrays map it
//! over their elements. 16-bit floats are computed in `f32` and rounded back (round to
//! nearest even) after every op, as XLA's CPU backend does.

use half::{bf16, f16};
use hlo::{ComparisonDirection, Element, Opcode, PrimitiveType as T};

/// One element of a computable type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sc {
    Pred(bool),
    S8(i8),
    S16(i16),
    S32(i32),
    S64(i64),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    F16(f16),
    Bf16(bf16),
    F32(f32),
    F64(f64),
}

impl Sc {
    pub fn ty(self) -> T {
        match self {
            Sc::Pred(_) => T::Pred,
            Sc::S8(_) => T::S8,
            Sc::S16(_) => T::S16,
            Sc::S32(_) => T::S32,
            Sc::S64(_) => T::S64,
            Sc::U8(_) => T::U8,
            Sc::U16(_) => T::U16,
            Sc::U32(_) => T::U32,
            Sc::U64(_) => T::U64,
            Sc::F16(_) => T::F16,
            Sc::Bf16(_) => T::Bf16,
            Sc::F32(_) => T::F32,
            Sc::F64(_) => T::F64,
        }
    }

    /// Reads one element of type `ty` from its little-endian bytes; `None` for a
    /// type Peerless does not compute with (or too few bytes).
    pub fn read(ty: T, b: &[u8]) -> Option<Sc> {
        if b.len() < ty.byte_size() {
            return None;
        }
        Some(match ty {
            T::Pred => Sc::Pred(b[0] != 0),
            T::S8 => Sc::S8(<i8 as Element>::from_le(b)),
            T::S16 => Sc::S16(<i16 as Element>::from_le(b)),
            T::S32 => Sc::S32(<i32 as Element>::from_le(b)),
            T::S64 => Sc::S64(<i64 as Element>::from_le(b)),
            T::U8 => Sc::U8(<u8 as Element>::from_le(b)),
            T::U16 => Sc::U16(<u16 as Element>::from_le(b)),
            T::U32 => Sc::U32(<u32 as Element>::from_le(b)),
            T::U64 => Sc::U64(<u64 as Element>::from_le(b)),
            T::F16 => Sc::F16(f16::from_le(b)),
            T::Bf16 => Sc::Bf16(bf16::from_le(b)),
            T::F32 => Sc::F32(f32::from_le(b)),
            T::F64 => Sc::F64(f64::from_le(b)),
            _ => return None,
        })
    }

    /// Writes the element's little-endian bytes (`out` must hold the type's size).
    pub fn write(self, out: &mut [u8]) {
        match self {
            Sc::Pred(v) => v.write_le(out),
            Sc::S8(v) => v.write_le(out),
            Sc::S16(v) => v.write_le(out),
            Sc::S32(v) => v.write_le(out),
            Sc::S64(v) => v.write_le(out),
            Sc::U8(v) => v.write_le(out),
            Sc::U16(v) => v.write_le(out),
            Sc::U32(v) => v.write_le(out),
            Sc::U64(v) => v.write_le(out),
            Sc::F16(v) => v.write_le(out),
            Sc::Bf16(v) => v.write_le(out),
            Sc::F32(v) => v.write_le(out),
            Sc::F64(v) => v.write_le(out),
        }
    }

    /// The value as an `i64` index (integers only; unsigned values above `i64::MAX` saturate).
    pub fn as_index(self) -> Option<i64> {
        Some(match self {
            Sc::S8(v) => v as i64,
            Sc::S16(v) => v as i64,
            Sc::S32(v) => v as i64,
            Sc::S64(v) => v,
            Sc::U8(v) => v as i64,
            Sc::U16(v) => v as i64,
            Sc::U32(v) => v as i64,
            Sc::U64(v) => v.min(i64::MAX as u64) as i64,
            _ => return None,
        })
    }
}

/// Integer operations with XLA's (wrapping, total) semantics.
trait Int: Copy + Eq + Ord {
    const SIGNED: bool;
    const BITS: u32;
    fn zero() -> Self;
    fn one() -> Self;
    fn ones() -> Self;
    fn wadd(self, o: Self) -> Self;
    fn wsub(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    fn wdiv(self, o: Self) -> Self;
    fn wrem(self, o: Self) -> Self;
    fn wneg(self) -> Self;
    fn band(self, o: Self) -> Self;
    fn bor(self, o: Self) -> Self;
    fn bxor(self, o: Self) -> Self;
    fn bnot(self) -> Self;
    /// Bit pattern, zero-extended.
    fn bits(self) -> u64;
    /// Negative when read as a signed number of the same width.
    fn sign_bit(self) -> bool;
    fn shl(self, s: u32) -> Self;
    fn lshr(self, s: u32) -> Self;
    fn ashr(self, s: u32) -> Self;
    fn popcnt(self) -> Self;
    fn clz(self) -> Self;
}

macro_rules! int_impl {
    ($t:ty, $s:ty, $u:ty) => {
        impl Int for $t {
            const SIGNED: bool = <$t>::MIN != 0;
            const BITS: u32 = <$t>::BITS;
            fn zero() -> Self {
                0
            }
            fn one() -> Self {
                1
            }
            fn ones() -> Self {
                !0
            }
            fn wadd(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            fn wsub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            fn wmul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            fn wdiv(self, o: Self) -> Self {
                self.wrapping_div(o)
            }
            fn wrem(self, o: Self) -> Self {
                self.wrapping_rem(o)
            }
            fn wneg(self) -> Self {
                self.wrapping_neg()
            }
            fn band(self, o: Self) -> Self {
                self & o
            }
            fn bor(self, o: Self) -> Self {
                self | o
            }
            fn bxor(self, o: Self) -> Self {
                self ^ o
            }
            fn bnot(self) -> Self {
                !self
            }
            fn bits(self) -> u64 {
                (self as $u) as u64
            }
            fn sign_bit(self) -> bool {
                (self as $s) < 0
            }
            fn shl(self, s: u32) -> Self {
                self.wrapping_shl(s)
            }
            fn lshr(self, s: u32) -> Self {
                ((self as $u) >> s) as $t
            }
            fn ashr(self, s: u32) -> Self {
                ((self as $s) >> s) as $t
            }
            fn popcnt(self) -> Self {
                self.count_ones() as $t
            }
            fn clz(self) -> Self {
                self.leading_zeros() as $t
            }
        }
    };
}
int_impl!(i8, i8, u8);
int_impl!(i16, i16, u16);
int_impl!(i32, i32, u32);
int_impl!(i64, i64, u64);
int_impl!(u8, i8, u8);
int_impl!(u16, i16, u16);
int_impl!(u32, i32, u32);
int_impl!(u64, i64, u64);

fn is_neg<I: Int>(x: I) -> bool {
    I::SIGNED && x.sign_bit()
}

/// XLA's integer power: exponentiation by squaring over the exponent's low 6 bits;
/// a negative exponent (signed reading of its bits) gives 1 for base 1, ±1 for
/// base -1, else 0.
fn ipow<I: Int>(base: I, exp: I) -> I {
    if exp.sign_bit() {
        let neg_one = I::ones();
        return if base == I::one() {
            I::one()
        } else if base == neg_one {
            if exp.bits() & 1 == 1 { neg_one } else { I::one() }
        } else {
            I::zero()
        };
    }
    let mut acc = I::one();
    let mut b = base;
    let mut e = exp.bits();
    for _ in 0..6 {
        if e & 1 == 1 {
            acc = acc.wmul(b);
        }
        b = b.wmul(b);
        e >>= 1;
    }
    acc
}

fn int_binary<I: Int>(op: Opcode, x: I, y: I) -> Option<I> {
    use Opcode::*;
    let shift = y.bits();
    Some(match op {
        Add => x.wadd(y),
        Subtract => x.wsub(y),
        Multiply => x.wmul(y),
        Divide => {
            if y == I::zero() {
                I::ones()
            } else {
                x.wdiv(y)
            }
        }
        Remainder => {
            if y == I::zero() {
                x
            } else {
                x.wrem(y)
            }
        }
        Maximum => x.max(y),
        Minimum => x.min(y),
        Power => ipow(x, y),
        And => x.band(y),
        Or => x.bor(y),
        Xor => x.bxor(y),
        ShiftLeft => {
            if shift >= I::BITS as u64 {
                I::zero()
            } else {
                x.shl(shift as u32)
            }
        }
        ShiftRightLogical => {
            if shift >= I::BITS as u64 {
                I::zero()
            } else {
                x.lshr(shift as u32)
            }
        }
        ShiftRightArithmetic => {
            if shift >= I::BITS as u64 {
                if x.sign_bit() { I::ones() } else { I::zero() }
            } else {
                x.ashr(shift as u32)
            }
        }
        _ => return None,
    })
}

fn int_unary<I: Int>(op: Opcode, x: I) -> Option<I> {
    use Opcode::*;
    Some(match op {
        Negate => x.wneg(),
        Abs => {
            if is_neg(x) {
                x.wneg()
            } else {
                x
            }
        }
        Sign => {
            if is_neg(x) {
                I::ones()
            } else if x == I::zero() {
                I::zero()
            } else {
                I::one()
            }
        }
        Not => x.bnot(),
        PopulationCount => x.popcnt(),
        CountLeadingZeros => x.clz(),
        _ => return None,
    })
}

/// Float operations, for `f32` and `f64` (16-bit floats go through `f32`).
trait Float: Copy + PartialOrd + std::ops::Neg<Output = Self> {
    fn zero() -> Self;
    fn one() -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn rem(self, o: Self) -> Self;
    fn is_nan(self) -> bool;
    fn is_sign_negative(self) -> bool;
    fn powf(self, o: Self) -> Self;
    fn atan2(self, o: Self) -> Self;
    fn abs(self) -> Self;
    fn exp(self) -> Self;
    fn exp_m1(self) -> Self;
    fn ln(self) -> Self;
    fn ln_1p(self) -> Self;
    fn sqrt(self) -> Self;
    fn cbrt(self) -> Self;
    fn tanh(self) -> Self;
    fn floor(self) -> Self;
    fn ceil(self) -> Self;
    fn round(self) -> Self;
    fn round_ties_even(self) -> Self;
    fn sin(self) -> Self;
    fn cos(self) -> Self;
    fn tan(self) -> Self;
    fn signum(self) -> Self;
    fn erf(self) -> Self;
}

macro_rules! float_impl {
    ($t:ty) => {
        impl Float for $t {
            fn zero() -> Self {
                0.0
            }
            fn one() -> Self {
                1.0
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn sub(self, o: Self) -> Self {
                self - o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn div(self, o: Self) -> Self {
                self / o
            }
            fn rem(self, o: Self) -> Self {
                self % o
            }
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn is_sign_negative(self) -> bool {
                <$t>::is_sign_negative(self)
            }
            fn powf(self, o: Self) -> Self {
                <$t>::powf(self, o)
            }
            fn atan2(self, o: Self) -> Self {
                <$t>::atan2(self, o)
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn exp_m1(self) -> Self {
                <$t>::exp_m1(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn ln_1p(self) -> Self {
                <$t>::ln_1p(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn cbrt(self) -> Self {
                <$t>::cbrt(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn floor(self) -> Self {
                <$t>::floor(self)
            }
            fn ceil(self) -> Self {
                <$t>::ceil(self)
            }
            fn round(self) -> Self {
                <$t>::round(self)
            }
            fn round_ties_even(self) -> Self {
                <$t>::round_ties_even(self)
            }
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            fn tan(self) -> Self {
                <$t>::tan(self)
            }
            fn signum(self) -> Self {
                <$t>::signum(self)
            }
            fn erf(self) -> Self {
                Erf::erf_impl(self)
            }
        }
    };
}

/// erf from libm (Rust's std has none), by width.
trait Erf {
    fn erf_impl(self) -> Self;
}
impl Erf for f32 {
    fn erf_impl(self) -> Self {
        libm::erff(self)
    }
}
impl Erf for f64 {
    fn erf_impl(self) -> Self {
        libm::erf(self)
    }
}

float_impl!(f32);
float_impl!(f64);

fn float_binary<F: Float>(op: Opcode, x: F, y: F) -> Option<F> {
    use Opcode::*;
    Some(match op {
        Add => x.add(y),
        Subtract => x.sub(y),
        Multiply => x.mul(y),
        Divide => x.div(y),
        Remainder => x.rem(y),
        Power => x.powf(y),
        Atan2 => x.atan2(y),
        // llvm.maximum / llvm.minimum: NaN-propagating, -0 < +0.
        Maximum | Minimum => {
            if x.is_nan() {
                x
            } else if y.is_nan() {
                y
            } else if x == F::zero() && y == F::zero() {
                let want_neg = op == Minimum;
                if x.is_sign_negative() == want_neg { x } else { y }
            } else if (x > y) == (op == Maximum) {
                x
            } else {
                y
            }
        }
        _ => return None,
    })
}

fn float_unary<F: Float>(op: Opcode, x: F) -> Option<F> {
    use Opcode::*;
    Some(match op {
        Negate => -x,
        Abs => x.abs(),
        Exp => x.exp(),
        Expm1 => x.exp_m1(),
        Log => x.ln(),
        Log1p => x.ln_1p(),
        Sqrt => x.sqrt(),
        Rsqrt => F::one().div(x.sqrt()),
        Cbrt => x.cbrt(),
        Tanh => x.tanh(),
        Logistic => F::one().div(F::one().add((-x).exp())),
        Floor => x.floor(),
        Ceil => x.ceil(),
        RoundNearestAfz => x.round(),
        RoundNearestEven => x.round_ties_even(),
        Sign => {
            if x.is_nan() || x == F::zero() {
                x
            } else {
                x.signum()
            }
        }
        Sine => x.sin(),
        Cosine => x.cos(),
        Tan => x.tan(),
        Erf => x.erf(),
        _ => return None,
    })
}

/// Applies a binary elementwise op (not compare). `None`: the op is undefined for the type
/// (or the operand types differ).
pub fn binary(op: Opcode, a: Sc, b: Sc) -> Option<Sc> {
    use Sc::*;
    Some(match (a, b) {
        (Pred(x), Pred(y)) => Pred(match op {
            Opcode::And | Opcode::Minimum | Opcode::Multiply => x & y,
            Opcode::Or | Opcode::Maximum => x | y,
            Opcode::Xor | Opcode::Add | Opcode::Subtract => x ^ y,
            _ => return None,
        }),
        (S8(x), S8(y)) => S8(int_binary(op, x, y)?),
        (S16(x), S16(y)) => S16(int_binary(op, x, y)?),
        (S32(x), S32(y)) => S32(int_binary(op, x, y)?),
        (S64(x), S64(y)) => S64(int_binary(op, x, y)?),
        (U8(x), U8(y)) => U8(int_binary(op, x, y)?),
        (U16(x), U16(y)) => U16(int_binary(op, x, y)?),
        (U32(x), U32(y)) => U32(int_binary(op, x, y)?),
        (U64(x), U64(y)) => U64(int_binary(op, x, y)?),
        (F16(x), F16(y)) => F16(f16::from_f32(float_binary(op, x.to_f32(), y.to_f32())?)),
        (Bf16(x), Bf16(y)) => Bf16(bf16::from_f32(float_binary(op, x.to_f32(), y.to_f32())?)),
        (F32(x), F32(y)) => F32(float_binary(op, x, y)?),
        (F64(x), F64(y)) => F64(float_binary(op, x, y)?),
        _ => return None,
    })
}

/// Applies a unary elementwise op. `is-finite` returns `Pred`.
pub fn unary(op: Opcode, a: Sc) -> Option<Sc> {
    use Sc::*;
    if op == Opcode::IsFinite {
        return Some(Pred(match a {
            F16(x) => x.is_finite(),
            Bf16(x) => x.is_finite(),
            F32(x) => x.is_finite(),
            F64(x) => x.is_finite(),
            _ => return None,
        }));
    }
    Some(match a {
        Pred(x) => match op {
            Opcode::Not => Pred(!x),
            Opcode::Abs | Opcode::Sign | Opcode::Negate => Pred(x),
            _ => return None,
        },
        S8(x) => S8(int_unary(op, x)?),
        S16(x) => S16(int_unary(op, x)?),
        S32(x) => S32(int_unary(op, x)?),
        S64(x) => S64(int_unary(op, x)?),
        U8(x) => U8(int_unary(op, x)?),
        U16(x) => U16(int_unary(op, x)?),
        U32(x) => U32(int_unary(op, x)?),
        U64(x) => U64(int_unary(op, x)?),
        F16(x) => F16(f16::from_f32(float_unary(op, x.to_f32())?)),
        Bf16(x) => Bf16(bf16::from_f32(float_unary(op, x.to_f32())?)),
        F32(x) => F32(float_unary(op, x)?),
        F64(x) => F64(float_unary(op, x)?),
    })
}

fn dir_holds(dir: ComparisonDirection, ord: Option<std::cmp::Ordering>) -> bool {
    use std::cmp::Ordering::*;
    match (dir, ord) {
        (ComparisonDirection::Ne, None) => true,
        (_, None) => false,
        (ComparisonDirection::Eq, Some(o)) => o == Equal,
        (ComparisonDirection::Ne, Some(o)) => o != Equal,
        (ComparisonDirection::Lt, Some(o)) => o == Less,
        (ComparisonDirection::Le, Some(o)) => o != Greater,
        (ComparisonDirection::Gt, Some(o)) => o == Greater,
        (ComparisonDirection::Ge, Some(o)) => o != Less,
    }
}

/// `compare`: IEEE semantics for floats (unordered: only NE holds), or IEEE total order
/// when `total` (`type=TOTALORDER`).
pub fn compare(dir: ComparisonDirection, total: bool, a: Sc, b: Sc) -> Option<bool> {
    use Sc::*;
    let ord = match (a, b) {
        (Pred(x), Pred(y)) => Some(x.cmp(&y)),
        (S8(x), S8(y)) => Some(x.cmp(&y)),
        (S16(x), S16(y)) => Some(x.cmp(&y)),
        (S32(x), S32(y)) => Some(x.cmp(&y)),
        (S64(x), S64(y)) => Some(x.cmp(&y)),
        (U8(x), U8(y)) => Some(x.cmp(&y)),
        (U16(x), U16(y)) => Some(x.cmp(&y)),
        (U32(x), U32(y)) => Some(x.cmp(&y)),
        (U64(x), U64(y)) => Some(x.cmp(&y)),
        (F16(x), F16(y)) => fcmp(total, x.to_f32(), y.to_f32()),
        (Bf16(x), Bf16(y)) => fcmp(total, x.to_f32(), y.to_f32()),
        (F32(x), F32(y)) => fcmp(total, x, y),
        (F64(x), F64(y)) => {
            if total {
                Some(x.total_cmp(&y))
            } else {
                x.partial_cmp(&y)
            }
        }
        _ => return None,
    };
    Some(dir_holds(dir, ord))
}

fn fcmp(total: bool, x: f32, y: f32) -> Option<std::cmp::Ordering> {
    if total { Some(x.total_cmp(&y)) } else { x.partial_cmp(&y) }
}

/// An element widened for conversion: booleans, integers exactly, floats as `f64`
/// (exact for every narrower float).
#[derive(Clone, Copy)]
enum Wide {
    B(bool),
    I(i128),
    F(f64),
}

fn widen(a: Sc) -> Wide {
    match a {
        Sc::Pred(v) => Wide::B(v),
        Sc::S8(v) => Wide::I(v as i128),
        Sc::S16(v) => Wide::I(v as i128),
        Sc::S32(v) => Wide::I(v as i128),
        Sc::S64(v) => Wide::I(v as i128),
        Sc::U8(v) => Wide::I(v as i128),
        Sc::U16(v) => Wide::I(v as i128),
        Sc::U32(v) => Wide::I(v as i128),
        Sc::U64(v) => Wide::I(v as i128),
        Sc::F16(v) => Wide::F(v.to_f64()),
        Sc::Bf16(v) => Wide::F(v.to_f64()),
        Sc::F32(v) => Wide::F(v as f64),
        Sc::F64(v) => Wide::F(v),
    }
}

macro_rules! to_int {
    ($w:expr, $t:ty) => {
        match $w {
            Wide::B(b) => b as $t,
            Wide::I(i) => i as $t,
            // Saturating, NaN → 0 (Rust's `as` matches XLA's CPU backend).
            Wide::F(f) => f as $t,
        }
    };
}

/// `convert` to `to`: integers wrap (two's complement truncation), floats → integers
/// saturate with NaN → 0, float narrowing rounds to nearest even, → pred is `x != 0`.
pub fn convert(a: Sc, to: T) -> Option<Sc> {
    let w = widen(a);
    let as_f64 = |w: Wide| match w {
        Wide::B(b) => b as u8 as f64,
        Wide::I(i) => i as f64,
        Wide::F(f) => f,
    };
    Some(match to {
        T::Pred => Sc::Pred(match w {
            Wide::B(b) => b,
            Wide::I(i) => i != 0,
            Wide::F(f) => f != 0.0,
        }),
        T::S8 => Sc::S8(to_int!(w, i8)),
        T::S16 => Sc::S16(to_int!(w, i16)),
        T::S32 => Sc::S32(to_int!(w, i32)),
        T::S64 => Sc::S64(to_int!(w, i64)),
        T::U8 => Sc::U8(to_int!(w, u8)),
        T::U16 => Sc::U16(to_int!(w, u16)),
        T::U32 => Sc::U32(to_int!(w, u32)),
        T::U64 => Sc::U64(to_int!(w, u64)),
        T::F16 => Sc::F16(f16::from_f32(f64_to_f32_odd(as_f64(w)))),
        T::Bf16 => Sc::Bf16(bf16::from_f32(f64_to_f32_odd(as_f64(w)))),
        T::F32 => Sc::F32(match w {
            Wide::I(i) => i as f32,
            other => as_f64(other) as f32,
        }),
        T::F64 => Sc::F64(as_f64(w)),
        _ => return None,
    })
}

/// Rounds an `f64` to `f32` with round-to-odd, so that a second rounding to a type of at
/// most 22 significand bits (f16, bf16) is correctly rounded.
fn f64_to_f32_odd(x: f64) -> f32 {
    let f = x as f32;
    if !f.is_finite() || f as f64 == x || f.to_bits() & 1 == 1 {
        return f;
    }
    let bits = f.to_bits();
    if (f as f64).abs() < x.abs() { f32::from_bits(bits + 1) } else { f32::from_bits(bits - 1) }
}
