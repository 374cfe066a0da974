//! `constant(...)` payloads, typed by the instruction's shape: scalars, nested `{...}` arrays, tuples `( a, b )`, and
//! every element type's value syntax. Values are stored little-endian, row-major; s4/u4 one (sign-extended) byte each.

use super::cursor::{Cursor, MAX_DEPTH, PResult};
use crate::literal::{Array, Literal};
use crate::types::{ArrayShape, PrimitiveType, Shape};

pub(crate) fn parse_constant(c: &mut Cursor<'_>, shape: &Shape) -> PResult<Literal> {
    literal(c, shape, 0)
}

fn literal(c: &mut Cursor<'_>, shape: &Shape, depth: u32) -> PResult<Literal> {
    c.ws();
    if depth >= MAX_DEPTH {
        return Err(c.err_found(&format!("constant nested too deeply (more than {MAX_DEPTH} levels)")));
    }
    check_elided(c)?;
    match shape {
        Shape::Token => Err(c.err_found("token constants are not supported; expected an array or tuple shape")),
        Shape::Tuple(elems) => {
            c.expect(b'(', &format!("to open a tuple constant of shape {shape}"))?;
            let mut out = Vec::with_capacity(elems.len());
            for (i, e) in elems.iter().enumerate() {
                if i > 0 {
                    c.expect(b',', &format!("between tuple constant elements (shape {shape})"))?;
                }
                out.push(literal(c, e, depth + 1)?);
            }
            c.expect(b')', &format!("to close the tuple constant: shape {shape} has {} elements", elems.len()))?;
            Ok(Literal::Tuple(out))
        }
        Shape::Array(a) => {
            let size = a.ty.byte_size();
            if a.ty == PrimitiveType::Token || size == 0 {
                return Err(c.err_found(&format!("constants of type {} are not supported", a.ty)));
            }
            let mut data = Vec::new();
            if a.dims.is_empty() {
                element(c, a.ty, &mut data)?;
            } else if c.peek() != Some(b'{') {
                return Err(c.err_found(&format!("expected '{{' to open an array constant of shape {a}")));
            } else {
                let start = c.pos;
                let total = a.element_count();
                // `{}` stands for any zero-element array.
                c.pos += 1;
                if total != 0 || !c.eat(b'}') {
                    c.pos = start;
                    nested(c, a, 0, &mut data)?;
                }
                if data.len() != total * size {
                    return Err(c.err_range(
                        start,
                        c.pos,
                        &format!("constant has {} elements; expected {total} for shape {a}", data.len() / size),
                    ));
                }
            }
            Array::new(a.clone(), data)
                .map(Literal::Array)
                .map_err(|e| c.err_range(c.pos, c.pos, &format!("internal: {e}")))
        }
    }
}

/// XLA prints big constants as `{...}`: the values are not in the text.
fn check_elided(c: &mut Cursor<'_>) -> PResult<()> {
    let start = c.pos;
    let brace = c.eat(b'{');
    if c.eat_str("...") {
        let end = c.pos + usize::from(brace);
        c.pos = start;
        return Err(c.err_range(
            start,
            end,
            "elided constant: XLA printed '{...}' instead of the values; expected the full literal \
             (print with print_large_constants=true)",
        ));
    }
    c.pos = start;
    Ok(())
}

/// One brace level of an array constant: exactly `dims[dim]` entries.
fn nested(c: &mut Cursor<'_>, a: &ArrayShape, dim: usize, out: &mut Vec<u8>) -> PResult<()> {
    c.ws();
    let open = c.pos;
    c.expect(b'{', &format!("to open dimension {dim} of the array constant (shape {a})"))?;
    check_elided_inner(c, open)?;
    let want = a.dims.get(dim).copied().unwrap_or(0);
    let inner = dim + 1 < a.dims.len();
    let mut n: i64 = 0;
    if !c.eat(b'}') {
        loop {
            if n >= want {
                return Err(c.err_found(&format!(
                    "too many entries in dimension {dim} of the array constant: shape {a} has {want}"
                )));
            }
            if inner {
                nested(c, a, dim + 1, out)?;
            } else {
                element(c, a.ty, out)?;
            }
            n += 1;
            if !c.eat(b',') {
                break;
            }
        }
        if c.peek() != Some(b'}') {
            return Err(c.err_found(&format!("expected ',' or '}}' in the array constant (shape {a})")));
        }
        c.pos += 1;
    }
    if n != want {
        fail!(c, open, c.pos, "dimension {dim} of the array constant has {n} entries; expected {want} for shape {a}");
    }
    Ok(())
}

fn check_elided_inner(c: &mut Cursor<'_>, open: usize) -> PResult<()> {
    let save = c.pos;
    if c.eat_str("...") {
        let end = c.pos;
        c.pos = save;
        return Err(c.err_range(
            open,
            end + 1,
            "elided constant: XLA printed '{...}' instead of the values; expected the full literal",
        ));
    }
    Ok(())
}

/// The text of one value token: sign, digits, letters, `.`, exponent sign, and a `(0x...)` NaN payload.
fn value_token<'a>(c: &mut Cursor<'a>) -> (usize, &'a str) {
    c.ws();
    let start = c.pos;
    if matches!(c.raw_peek(), Some(b'-' | b'+')) {
        c.pos += 1;
    }
    loop {
        match c.raw_peek() {
            Some(b) if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' => c.pos += 1,
            Some(b'+' | b'-')
                if matches!(c.byte_at(c.pos.wrapping_sub(1)), Some(b'e' | b'E'))
                    && c.slice(start, c.pos)
                        .trim_start_matches(['-', '+'])
                        .starts_with(|ch: char| ch.is_ascii_digit() || ch == '.') =>
            {
                c.pos += 1
            }
            _ => break,
        }
    }
    let tok = c.slice(start, c.pos);
    if tok.trim_start_matches(['-', '+']) == "nan" && c.raw_peek() == Some(b'(') {
        while let Some(b) = c.raw_peek() {
            c.pos += 1;
            if b == b')' || b == b'\n' {
                break;
            }
        }
    }
    (start, c.slice(start, c.pos))
}

/// Parses one element of type `ty` and appends its little-endian bytes.
fn element(c: &mut Cursor<'_>, ty: PrimitiveType, out: &mut Vec<u8>) -> PResult<()> {
    use PrimitiveType as T;
    if ty.is_complex() {
        c.expect(b'(', &format!("to open a {ty} value (real, imag)"))?;
        let part = if ty == T::C64 { T::F32 } else { T::F64 };
        element(c, part, out)?;
        c.expect(b',', "between the real and imaginary parts")?;
        element(c, part, out)?;
        c.expect(b')', "to close the complex value")?;
        return Ok(());
    }
    let (start, tok) = value_token(c);
    let end = c.pos;
    if tok.is_empty() {
        let article = if ty.name().starts_with(['f', 's', 'u']) { "an" } else { "a" };
        return Err(c.err_found(&format!("expected {article} {ty} value")));
    }
    let bad =
        |c: &Cursor<'_>, what: &str| c.err_range(start, end, &format!("invalid {ty} value '{tok}'; expected {what}"));
    match ty {
        T::Pred => match tok {
            "true" | "1" => out.push(1),
            "false" | "0" => out.push(0),
            _ => return Err(bad(c, "true or false")),
        },
        _ if ty.is_integral() => {
            let Ok(v) = tok.parse::<i128>() else { return Err(bad(c, "an integer")) };
            let (lo, hi): (i128, i128) = match ty {
                T::S4 => (-8, 7),
                T::S8 => (i8::MIN.into(), i8::MAX.into()),
                T::S16 => (i16::MIN.into(), i16::MAX.into()),
                T::S32 => (i32::MIN.into(), i32::MAX.into()),
                T::S64 => (i64::MIN.into(), i64::MAX.into()),
                T::U4 => (0, 15),
                T::U8 => (0, u8::MAX.into()),
                T::U16 => (0, u16::MAX.into()),
                T::U32 => (0, u32::MAX.into()),
                _ => (0, u64::MAX.into()),
            };
            if v < lo || v > hi {
                fail!(c, start, end, "integer {v} is out of range for {ty}; expected {lo}..={hi}");
            }
            let bytes = v.to_le_bytes();
            out.extend_from_slice(bytes.get(..ty.byte_size()).unwrap_or(&[]));
        }
        _ => {
            let Some(v) = float_value(tok) else { return Err(bad(c, "a number, inf, -inf or nan")) };
            if let Some(f) = F8Format::of(ty) {
                out.push(f.encode_with_payload(v.value, v.nan_payload));
                return Ok(());
            }
            let (width, mant_bits, rounded) = match ty {
                // Decimal straight to f32 (one rounding), not through f64.
                T::F32 => {
                    (32, 23, tok.parse::<f32>().ok().filter(|x| !x.is_nan()).unwrap_or(v.value as f32).to_bits().into())
                }
                T::F64 => (64, 52, v.value.to_bits()),
                // f16/bf16 rounded by `half` (round-to-nearest-even).
                T::F16 => (16, 10, half::f16::from_f64(v.value).to_bits().into()),
                T::Bf16 => (16, 7, half::bf16::from_f64(v.value).to_bits().into()),
                _ => fail!(c, start, end, "constants of type {ty} are not supported"),
            };
            let bits = nan_bits(&v, width, mant_bits).unwrap_or(rounded);
            out.extend_from_slice(&bits.to_le_bytes()[..width as usize / 8]);
        }
    }
    Ok(())
}

/// A parsed float token: its value and, for NaNs, the payload written as `nan(0x..)`.
struct FloatValue {
    value: f64,
    nan_payload: Option<u64>,
}

fn float_value(tok: &str) -> Option<FloatValue> {
    let (neg, body) = match tok.as_bytes().first() {
        Some(b'-') => (true, tok.get(1..)?),
        Some(b'+') => (false, tok.get(1..)?),
        _ => (false, tok),
    };
    let sign = if neg { -1.0 } else { 1.0 };
    if body == "inf" {
        return Some(FloatValue { value: sign * f64::INFINITY, nan_payload: None });
    }
    if body == "nan" {
        return Some(FloatValue { value: if neg { -f64::NAN } else { f64::NAN }, nan_payload: None });
    }
    if let Some(p) = body.strip_prefix("nan(").and_then(|s| s.strip_suffix(')')) {
        let hex = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X"))?;
        let payload = u64::from_str_radix(hex, 16).ok()?;
        return Some(FloatValue { value: if neg { -f64::NAN } else { f64::NAN }, nan_payload: Some(payload) });
    }
    // Plain decimal: digits or '.' first (rejects words Rust would accept, like "infinity").
    if !body.starts_with(|ch: char| ch.is_ascii_digit() || ch == '.') {
        return None;
    }
    if !body.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-')) {
        return None;
    }
    let v: f64 = body.parse().ok()?;
    Some(FloatValue { value: sign * v, nan_payload: None })
}

/// The bits of a NaN in an IEEE format `width` bits wide with `mant_bits` mantissa bits: its sign and its payload (the
/// quiet bit when it has none); `None` for any other value.
fn nan_bits(v: &FloatValue, width: u32, mant_bits: u32) -> Option<u64> {
    if !v.value.is_nan() {
        return None;
    }
    let sign = if v.value.is_sign_negative() { 1 << (width - 1) } else { 0 };
    let mask = (1u64 << mant_bits) - 1;
    let exp_mask = ((1u64 << (width - 1)) - 1) & !mask;
    let payload = match v.nan_payload.map(|p| p & mask) {
        Some(p) if p != 0 => p,
        _ => 1 << (mant_bits - 1),
    };
    Some(sign | exp_mask | payload)
}

/// An 8-bit float format: 1 sign bit, `exp` exponent bits, `mant` mantissa bits.
#[derive(Clone, Copy, Debug)]
pub struct F8Format {
    pub exp: u32,
    pub mant: u32,
    pub bias: i32,
    /// IEEE-like: the top exponent encodes inf (mantissa 0) and NaN.
    pub ieee: bool,
    /// "fnuz": no negative zero, the only NaN is 0x80, no infinity.
    pub fnuz: bool,
}

impl F8Format {
    pub fn of(ty: PrimitiveType) -> Option<Self> {
        use PrimitiveType as T;
        let f = |exp, mant, bias, ieee, fnuz| Some(F8Format { exp, mant, bias, ieee, fnuz });
        match ty {
            T::F8E5M2 => f(5, 2, 15, true, false),
            T::F8E4M3 => f(4, 3, 7, true, false),
            T::F8E3M4 => f(3, 4, 3, true, false),
            T::F8E4M3FN => f(4, 3, 7, false, false),
            T::F8E4M3FNUZ => f(4, 3, 8, false, true),
            T::F8E5M2FNUZ => f(5, 2, 16, false, true),
            T::F8E4M3B11FNUZ => f(4, 3, 11, false, true),
            _ => None,
        }
    }

    fn nan(self, neg: bool) -> u8 {
        if self.fnuz {
            0x80
        } else {
            let all = (1u8 << (self.exp + self.mant)) - 1; // exponent and mantissa all ones
            all | if neg { 0x80 } else { 0 }
        }
    }

    /// Like [`F8Format::encode`], but a NaN of an IEEE-like format (several NaN encodings) keeps its `nan(0x..)`
    /// payload, so that the printer's output of any byte parses back to it.
    pub(crate) fn encode_with_payload(self, v: f64, payload: Option<u64>) -> u8 {
        let mask = (1u64 << self.mant) - 1;
        match payload.map(|p| (p & mask) as u8) {
            Some(p) if v.is_nan() && self.ieee && p != 0 => {
                let sign = if v.is_sign_negative() { 0x80 } else { 0 };
                sign | ((((1u8 << self.exp) - 1) << self.mant) | p)
            }
            _ => self.encode(v),
        }
    }

    /// Rounds `v` to nearest (ties to even). Overflow gives inf where the format has one, NaN otherwise
    /// (non-saturating, like XLA's conversions).
    pub fn encode(self, v: f64) -> u8 {
        let neg = v.is_sign_negative();
        let sign: u8 = if neg { 0x80 } else { 0 };
        if v.is_nan() {
            return self.nan(neg);
        }
        let max_field: i32 = (1 << self.exp) - 1;
        let mant_one: i64 = 1 << self.mant; // implicit leading one
        let overflow = || {
            if self.ieee { sign | ((max_field as u8) << self.mant) } else { self.nan(neg) }
        };
        if v.is_infinite() {
            return overflow();
        }
        let a = v.abs();
        if a == 0.0 {
            return if self.fnuz { 0 } else { sign };
        }
        let emin = 1 - self.bias; // exponent of the smallest normal
        // floor(log2(a)) exactly, from the f64 exponent (a is normal or subnormal f64).
        let bits = a.to_bits();
        let raw_exp = ((bits >> 52) & 0x7ff) as i32;
        let e = if raw_exp == 0 { -1075 } else { raw_exp - 1023 }.max(emin);
        // Scale so that one unit is the quantum at exponent e (exact: power-of-two scaling).
        let scaled = a * pow2(self.mant as i32 - e);
        let mut m = scaled.round_ties_even() as i64;
        let mut e = e;
        if m >= 2 * mant_one {
            m /= 2;
            e += 1;
        }
        if m == 0 {
            return if self.fnuz { 0 } else { sign };
        }
        let field: i32 = if m < mant_one { 0 } else { e + self.bias };
        let frac = (m & (mant_one - 1)) as u8;
        // Largest finite encoding.
        let (max_finite_field, max_finite_frac): (i32, u8) = if self.ieee {
            (max_field - 1, (mant_one - 1) as u8)
        } else if self.fnuz {
            (max_field, (mant_one - 1) as u8)
        } else {
            (max_field, (mant_one - 2) as u8) // fn: S.1111.111 is NaN
        };
        if field > max_finite_field || (field == max_finite_field && frac > max_finite_frac) {
            return overflow();
        }
        sign | ((field as u8) << self.mant) | frac
    }
}

/// 2^k as f64 for |k| well inside the normal range.
fn pow2(k: i32) -> f64 {
    let k = k.clamp(-1000, 1000);
    f64::from_bits(((k + 1023) as u64) << 52)
}

#[cfg(test)]
#[path = "../../tests/unit/text_literal.rs"]
mod tests;
