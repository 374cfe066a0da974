// Scalar semantics for the kernels Peerless generates per instruction (kernels/src/codegen.rs):
// XLA's elementwise rules, written once per element type, matching the reference
// interpreter (interp/src/scalar.rs) bit for bit where IEEE arithmetic allows:
// - integers wrap (arithmetic in the unsigned type of the same width); x / 0 = -1 (all ones),
//   x % 0 = x, MIN / -1 = MIN, MIN % -1 = 0; shifts by >= the bit width give 0 (or the sign
//   for arithmetic right shifts); integer power by squaring over the exponent's low 6 bits;
// - floats: add / sub / mul through the _rn intrinsics, so the compiler never contracts them
//   into an FMA (the interpreter rounds after every op); maximum / minimum propagate NaN and
//   order -0 below +0; 16-bit floats are computed in fp32 and rounded back by the caller.
// Generated code calls these overloads with locals of the exact compute types.
#pragma once
#include "peerless_types.h"

#define PL_INT_OPS(T, U, S, W, BITS)                                                            \
  PL_DEVICE T op_add(T x, T y) { return (T)(U)((W)(U)x + (W)(U)y); }                           \
  PL_DEVICE T op_sub(T x, T y) { return (T)(U)((W)(U)x - (W)(U)y); }                           \
  PL_DEVICE T op_mul(T x, T y) { return (T)(U)((W)(U)x * (W)(U)y); }                           \
  PL_DEVICE T op_neg(T x) { return (T)(U)((W)0 - (W)(U)x); }                                    \
  PL_DEVICE bool op_isneg(T x) { return (T)(-1) < (T)0 && (S)x < 0; }                           \
  PL_DEVICE T op_div(T x, T y) {                                                                \
    if (y == (T)0) return (T)(U)(~(U)0);                                                        \
    if (op_isneg((T)(-1)) && y == (T)(-1)) return op_neg(x);                                    \
    return (T)(x / y);                                                                          \
  }                                                                                             \
  PL_DEVICE T op_rem(T x, T y) {                                                                \
    if (y == (T)0) return x;                                                                    \
    if (op_isneg((T)(-1)) && y == (T)(-1)) return (T)0;                                         \
    return (T)(x % y);                                                                          \
  }                                                                                             \
  PL_DEVICE T op_max(T x, T y) { return x > y ? x : y; }                                        \
  PL_DEVICE T op_min(T x, T y) { return x < y ? x : y; }                                        \
  PL_DEVICE T op_and(T x, T y) { return (T)(x & y); }                                           \
  PL_DEVICE T op_or(T x, T y) { return (T)(x | y); }                                            \
  PL_DEVICE T op_xor(T x, T y) { return (T)(x ^ y); }                                           \
  PL_DEVICE T op_not(T x) { return (T)(~x); }                                                   \
  PL_DEVICE T op_shl(T x, T y) {                                                                \
    u64 s = (u64)(U)y;                                                                          \
    return s >= BITS ? (T)0 : (T)(U)((W)(U)x << s);                                             \
  }                                                                                             \
  PL_DEVICE T op_shrl(T x, T y) {                                                               \
    u64 s = (u64)(U)y;                                                                          \
    return s >= BITS ? (T)0 : (T)(U)((U)x >> s);                                                \
  }                                                                                             \
  PL_DEVICE T op_shra(T x, T y) {                                                               \
    u64 s = (u64)(U)y;                                                                          \
    if (s >= BITS) return (S)x < 0 ? (T)(U)(~(U)0) : (T)0;                                      \
    return (T)(U)(S)((S)x >> s);                                                                \
  }                                                                                             \
  PL_DEVICE T op_pow(T x, T y) {                                                                \
    if ((S)y < 0) {                                                                             \
      if (x == (T)1) return (T)1;                                                               \
      if (x == (T)(U)(~(U)0)) return ((U)y & 1) ? x : (T)1;                                     \
      return (T)0;                                                                              \
    }                                                                                           \
    T acc = (T)1, b = x;                                                                        \
    u64 e = (u64)(U)y;                                                                          \
    for (int k = 0; k < 6; ++k) {                                                               \
      if (e & 1) acc = op_mul(acc, b);                                                          \
      b = op_mul(b, b);                                                                         \
      e >>= 1;                                                                                  \
    }                                                                                           \
    return acc;                                                                                 \
  }                                                                                             \
  PL_DEVICE T op_abs(T x) { return op_isneg(x) ? op_neg(x) : x; }                               \
  PL_DEVICE T op_sign(T x) { return op_isneg(x) ? (T)(U)(~(U)0) : (x == (T)0 ? (T)0 : (T)1); } \
  PL_DEVICE T op_popcnt(T x) { return (T)(BITS == 64 ? __popcll((u64)(U)x) : __popc((u32)(U)x)); } \
  PL_DEVICE T op_clz(T x) {                                                                     \
    return (T)(BITS == 64 ? __clzll((s64)(u64)(U)x) : __clz((s32)(u32)(U)x) - (32 - (BITS == 64 ? 32 : BITS))); \
  }

PL_INT_OPS(s8, u8, s8, u32, 8)
PL_INT_OPS(s16, u16, s16, u32, 16)
PL_INT_OPS(s32, u32, s32, u32, 32)
PL_INT_OPS(s64, u64, s64, u64, 64)
PL_INT_OPS(u8, u8, s8, u32, 8)
PL_INT_OPS(u16, u16, s16, u32, 16)
PL_INT_OPS(u32, u32, s32, u32, 32)
PL_INT_OPS(u64, u64, s64, u64, 64)

// Floats: F is float or double; I the integer type of the same width (for bit tests).
PL_DEVICE float op_add(float x, float y) { return __fadd_rn(x, y); }
PL_DEVICE float op_sub(float x, float y) { return __fsub_rn(x, y); }
PL_DEVICE float op_mul(float x, float y) { return __fmul_rn(x, y); }
PL_DEVICE double op_add(double x, double y) { return __dadd_rn(x, y); }
PL_DEVICE double op_sub(double x, double y) { return __dsub_rn(x, y); }
PL_DEVICE double op_mul(double x, double y) { return __dmul_rn(x, y); }
PL_DEVICE bool op_isnan(float x) { return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u; }
PL_DEVICE bool op_isnan(double x) {
  return ((u64)__double_as_longlong(x) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}
PL_DEVICE bool op_isfinite(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }
PL_DEVICE bool op_isfinite(double x) {
  return ((u64)__double_as_longlong(x) & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}
PL_DEVICE bool op_signbit(float x) { return (__float_as_uint(x) >> 31) != 0; }
PL_DEVICE bool op_signbit(double x) { return __double_as_longlong(x) < 0; }

#define PL_FLOAT_OPS(F, SUF)                                                                   \
  PL_DEVICE F op_div(F x, F y) { return x / y; }                                               \
  PL_DEVICE F op_rem(F x, F y) { return fmod##SUF(x, y); }                                     \
  PL_DEVICE F op_pow(F x, F y) { return pow##SUF(x, y); }                                      \
  PL_DEVICE F op_atan2(F x, F y) { return atan2##SUF(x, y); }                                  \
  PL_DEVICE F op_maxmin(F x, F y, bool max) {                                                  \
    if (op_isnan(x)) return x;                                                                 \
    if (op_isnan(y)) return y;                                                                 \
    if (x == (F)0 && y == (F)0) return op_signbit(x) == !max ? x : y;                          \
    return ((x > y) == max) ? x : y;                                                           \
  }                                                                                            \
  PL_DEVICE F op_max(F x, F y) { return op_maxmin(x, y, true); }                               \
  PL_DEVICE F op_min(F x, F y) { return op_maxmin(x, y, false); }                              \
  PL_DEVICE F op_neg(F x) { return -x; }                                                       \
  PL_DEVICE F op_abs(F x) { return fabs##SUF(x); }                                             \
  PL_DEVICE F op_exp(F x) { return exp##SUF(x); }                                              \
  PL_DEVICE F op_expm1(F x) { return expm1##SUF(x); }                                          \
  PL_DEVICE F op_log(F x) { return log##SUF(x); }                                              \
  PL_DEVICE F op_log1p(F x) { return log1p##SUF(x); }                                          \
  PL_DEVICE F op_sqrt(F x) { return sqrt##SUF(x); }                                            \
  PL_DEVICE F op_rsqrt(F x) { return (F)1 / sqrt##SUF(x); }                                    \
  PL_DEVICE F op_cbrt(F x) { return cbrt##SUF(x); }                                            \
  PL_DEVICE F op_tanh(F x) { return tanh##SUF(x); }                                            \
  PL_DEVICE F op_logistic(F x) { return (F)1 / op_add((F)1, exp##SUF(-x)); }                   \
  PL_DEVICE F op_floor(F x) { return floor##SUF(x); }                                          \
  PL_DEVICE F op_ceil(F x) { return ceil##SUF(x); }                                            \
  PL_DEVICE F op_round_afz(F x) { return round##SUF(x); }                                      \
  PL_DEVICE F op_round_even(F x) { return rint##SUF(x); }                                      \
  PL_DEVICE F op_sign(F x) { return (op_isnan(x) || x == (F)0) ? x : (op_signbit(x) ? (F)-1 : (F)1); } \
  PL_DEVICE F op_sin(F x) { return sin##SUF(x); }                                              \
  PL_DEVICE F op_cos(F x) { return cos##SUF(x); }                                              \
  PL_DEVICE F op_tan(F x) { return tan##SUF(x); }                                              \
  PL_DEVICE F op_erf(F x) { return erf##SUF(x); }

PL_FLOAT_OPS(float, f)
PL_FLOAT_OPS(double, )

// Total order (compare type=TOTALORDER): the sign-magnitude bits as a two's complement key.
PL_DEVICE s64 op_total_key(float x) {
  s32 b = (s32)__float_as_uint(x);
  return (s64)(b ^ (s32)(((u32)(b >> 31)) >> 1));
}
PL_DEVICE s64 op_total_key(double x) {
  s64 b = __double_as_longlong(x);
  return b ^ (s64)(((u64)(b >> 63)) >> 1);
}

// Rounding a 16-bit float result: compute in fp32, store, and read back (reductions round
// after every step, like the interpreter).
PL_DEVICE float pl_rnd_bf16(float x) { return to_f32(from_f32_bf16(x)); }
PL_DEVICE float pl_rnd_f16(float x) { return to_f32(from_f32_f16(x)); }

// f64 → f32 rounding to odd, so that a second rounding to f16 / bf16 is correctly rounded.
PL_DEVICE float pl_f64_to_f32_odd(double x) {
  float f = (float)x;
  if (!op_isfinite(f) || (double)f == x || (__float_as_uint(f) & 1u)) return f;
  u32 bits = __float_as_uint(f);
  return fabs((double)f) < fabs(x) ? __uint_as_float(bits + 1u) : __uint_as_float(bits - 1u);
}

// Float → integer: saturating, NaN → 0 (Rust's `as`, XLA's CPU backend). `lo` is the
// type's minimum, `hi1` 2^(bits) or 2^(bits-1): both exact in a double.
#define PL_F2I(T, LO, HI1, MAXV)                                                                \
  PL_DEVICE T pl_f2i_##T(double f) {                                                           \
    if (op_isnan(f)) return (T)0;                                                              \
    if (f <= (double)(LO)) return (T)(LO);                                                     \
    if (f >= (HI1)) return (T)(MAXV);                                                          \
    return (T)f;                                                                               \
  }
PL_F2I(s8, -128, 128.0, 127)
PL_F2I(s16, -32768, 32768.0, 32767)
PL_F2I(s32, (-2147483647 - 1), 2147483648.0, 2147483647)
PL_F2I(s64, (-9223372036854775807ll - 1), 9223372036854775808.0, 9223372036854775807ll)
PL_F2I(u8, 0, 256.0, 255)
PL_F2I(u16, 0, 65536.0, 65535)
PL_F2I(u32, 0, 4294967296.0, 4294967295u)
PL_F2I(u64, 0, 18446744073709551616.0, 18446744073709551615ull)

// The linear index of this thread and the grid's stride, for grid-stride loops.
PL_DEVICE u64 pl_first() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
PL_DEVICE u64 pl_stride() { return (u64)gridDim.x * blockDim.x; }
