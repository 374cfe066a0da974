// Peerless's peer-access collective kernels (CUDA C++, compiled at run time by NVRTC).
//
// The protocols are the host backend's (kernels/src/host/protocol.rs), per thread block:
// - Signals of one communicator on one device: `u32 counter[PL_BLOCKS]` (the block's launch
//   count, advanced on the device at kernel entry), then `u32 flags[2][PL_BLOCKS][PL_MAX_RANKS]`
//   where flags[s][b][j] is written only by rank j's block b. A block signals peer t by a
//   system-scope release store into t's flags[s][b][rank] and waits with acquire loads on its
//   own flags[s][b][t] until it is at least the expected value (wrapping-aware). Values only
//   grow, so slots are never reset.
// - Work is split in 16-byte units (VEC elements); unit u (of a range) belongs to thread
//   u mod (gridDim * blockDim), the same thread in every phase and on every rank, so a
//   per-block barrier covers exactly the data that block exchanges.
// - Staging is double-buffered by launch parity (one-shot and two-shot have no end barrier).
//
// PL_BLOCKS (blocks per grid, also the flag-array size) is defined by the host before this
// file: one constant for launch geometry and flag sizing.
#include "peerless_device.h"

#ifndef PL_BLOCKS
#error "PL_BLOCKS must be defined by the host"
#endif
#define PL_MAX_RANKS 8

struct Ptrs { u64 p[PL_MAX_RANKS]; };

PL_DEVICE u32* flag_slot(u64 flags_base, u32 set, u32 block, u32 rank) {
  return reinterpret_cast<u32*>(flags_base) + (set * PL_BLOCKS + block) * PL_MAX_RANKS + rank;
}

// Advances this block's launch counter (only this block of this device touches it).
PL_DEVICE u32 next_epoch(u32* counter) {
  __shared__ u32 e;
  if (threadIdx.x == 0) {
    e = counter[blockIdx.x] + 1;
    counter[blockIdx.x] = e;
  }
  __syncthreads();
  return e;
}

// Per-block cross-rank barrier: every thread's prior writes are ordered before the signal.
PL_DEVICE void block_barrier(const Ptrs& flags, u32 set, u32 rank, u32 world, u32 value) {
  __syncthreads();
  const u32 t = threadIdx.x;
  if (t < world) {
    store_release_sys(flag_slot(flags.p[t], set, blockIdx.x, rank), value);
    wait_at_least(flag_slot(flags.p[rank], set, blockIdx.x, t), value);
  }
  __syncthreads();
}

// ---- element traits: accumulation type, conversions ----
template <typename T> struct Tr;
template <> struct Tr<float> {
  typedef float Acc;
  static PL_DEVICE Acc up(float v) { return v; }
  static PL_DEVICE float down(Acc a) { return a; }
};
template <> struct Tr<double> {
  typedef double Acc;
  static PL_DEVICE Acc up(double v) { return v; }
  static PL_DEVICE double down(Acc a) { return a; }
};
template <> struct Tr<bf16> {
  typedef float Acc;
  static PL_DEVICE Acc up(bf16 v) { return to_f32(v); }
  static PL_DEVICE bf16 down(Acc a) { return from_f32_bf16(a); }
};
template <> struct Tr<f16> {
  typedef float Acc;
  static PL_DEVICE Acc up(f16 v) { return to_f32(v); }
  static PL_DEVICE f16 down(Acc a) { return from_f32_f16(a); }
};
#define PL_INT_TRAITS(T)                            \
  template <> struct Tr<T> {                        \
    typedef T Acc;                                  \
    static PL_DEVICE Acc up(T v) { return v; }      \
    static PL_DEVICE T down(Acc a) { return a; }    \
  };
PL_INT_TRAITS(u8)
PL_INT_TRAITS(s32)
PL_INT_TRAITS(u32)
PL_INT_TRAITS(s64)
PL_INT_TRAITS(u64)
typedef signed char s8;
PL_INT_TRAITS(s8)

// ---- reductions (NaN-propagating min/max for floats: a + b is NaN when either is) ----
struct Sum { template <typename A> static PL_DEVICE A f(A a, A b) { return a + b; } };
struct Prod { template <typename A> static PL_DEVICE A f(A a, A b) { return a * b; } };
struct Min { template <typename A> static PL_DEVICE A f(A a, A b) { return (a != a || b != b) ? a + b : (b < a ? b : a); } };
struct Max { template <typename A> static PL_DEVICE A f(A a, A b) { return (a != a || b != b) ? a + b : (b > a ? b : a); } };
struct And { template <typename A> static PL_DEVICE A f(A a, A b) { return a & b; } };
struct Or { template <typename A> static PL_DEVICE A f(A a, A b) { return a | b; } };

template <typename T> struct Unit {
  static constexpr u32 VEC = 16 / sizeof(T);
  T e[VEC];
};

PL_DEVICE bool aligned16(const void* p) { return (reinterpret_cast<u64>(p) & 15) == 0; }

// Copies unit `u` (elements [u*VEC, min(u*VEC+VEC, n))) from src to dst.
template <typename T>
PL_DEVICE void copy_unit(T* dst, const T* src, u64 u, u64 n, bool vec_ok) {
  constexpr u32 VEC = Unit<T>::VEC;
  const u64 b = u * VEC;
  if (vec_ok && b + VEC <= n) {
    store16(dst + b, load16(src + b));
  } else {
    for (u64 i = b; i < n && i < b + VEC; ++i) dst[i] = src[i];
  }
}

// Reduces unit `u` over every rank's staging (fixed order 0..world-1) into dst.
template <typename T, typename R>
PL_DEVICE void reduce_unit(T* dst, const Ptrs& stage, u64 par, u32 world, u64 u, u64 n, bool dst_vec_ok) {
  typedef typename Tr<T>::Acc A;
  constexpr u32 VEC = Unit<T>::VEC;
  const u64 b = u * VEC;
  if (b + VEC <= n) {
    A acc[VEC];
    {
      union { vec16 v; T e[VEC]; } x;
      x.v = load16(reinterpret_cast<const T*>(stage.p[0] + par) + b);
#pragma unroll
      for (u32 k = 0; k < VEC; ++k) acc[k] = Tr<T>::up(x.e[k]);
    }
#pragma unroll 1
    for (u32 p = 1; p < world; ++p) {
      union { vec16 v; T e[VEC]; } x;
      x.v = load16(reinterpret_cast<const T*>(stage.p[p] + par) + b);
#pragma unroll
      for (u32 k = 0; k < VEC; ++k) acc[k] = R::f(acc[k], Tr<T>::up(x.e[k]));
    }
    union { vec16 v; T e[VEC]; } y;
#pragma unroll
    for (u32 k = 0; k < VEC; ++k) y.e[k] = Tr<T>::down(acc[k]);
    if (dst_vec_ok) {
      store16(dst + b, y.v);
    } else {
      for (u32 k = 0; k < VEC; ++k) dst[b + k] = y.e[k];
    }
  } else {
    for (u64 i = b; i < n; ++i) {
      A acc = Tr<T>::up(reinterpret_cast<const T*>(stage.p[0] + par)[i]);
      for (u32 p = 1; p < world; ++p) acc = R::f(acc, Tr<T>::up(reinterpret_cast<const T*>(stage.p[p] + par)[i]));
      dst[i] = Tr<T>::down(acc);
    }
  }
}

// One-shot all-reduce: copy-in to my staging[parity], barrier, reduce every rank's staging.
template <typename T, typename R>
PL_DEVICE void one_shot(const T* in, T* out, u64 n, u32 rank, u32 world, const Ptrs& stage, u64 stride,
                        const Ptrs& flags, u32* counter) {
  const u32 e = next_epoch(counter);
  const u64 par = (e & 1) * stride;
  const u64 units = (n + Unit<T>::VEC - 1) / Unit<T>::VEC;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  T* mine = reinterpret_cast<T*>(stage.p[rank] + par);
  const bool in_ok = aligned16(in), out_ok = aligned16(out);
  for (u64 u = tid; u < units; u += nt) copy_unit(mine, in, u, n, in_ok);
  block_barrier(flags, 0, rank, world, e);
  for (u64 u = tid; u < units; u += nt) reduce_unit<T, R>(out, stage, par, world, u, n, out_ok);
}

// Two-shot all-reduce: copy-in, barrier, reduce my slice into my staging and output,
// barrier, gather the other slices from their owners' staging.
template <typename T, typename R>
PL_DEVICE void two_shot(const T* in, T* out, u64 n, u32 rank, u32 world, const Ptrs& stage, u64 stride,
                        const Ptrs& flags, u32* counter) {
  const u32 e = next_epoch(counter);
  const u64 par = (e & 1) * stride;
  const u64 units = (n + Unit<T>::VEC - 1) / Unit<T>::VEC;
  const u64 per = (units + world - 1) / world;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  T* mine = reinterpret_cast<T*>(stage.p[rank] + par);
  const bool in_ok = aligned16(in), out_ok = aligned16(out);
  for (u32 k = 0; k < world; ++k) {
    const u64 lo = k * per, hi = pl_min(units, lo + per);
    for (u64 u = lo + tid; u < hi; u += nt) copy_unit(mine, in, u, n, in_ok);
  }
  block_barrier(flags, 0, rank, world, 2 * e - 1);
  {
    const u64 lo = rank * per, hi = pl_min(units, lo + per);
    for (u64 u = lo + tid; u < hi; u += nt) {
      reduce_unit<T, R>(mine, stage, par, world, u, n, true);
      copy_unit(out, mine, u, n, out_ok);
    }
  }
  block_barrier(flags, 0, rank, world, 2 * e);
  for (u32 i = 1; i < world; ++i) {
    const u32 k = (rank + i) % world;
    const u64 lo = k * per, hi = pl_min(units, lo + per);
    const T* src = reinterpret_cast<const T*>(stage.p[k] + par);
    for (u64 u = lo + tid; u < hi; u += nt) copy_unit(out, src, u, n, out_ok);
  }
}

// All-gather by pushing: "ready" barrier (every peer is inside this launch, so its output is
// free), push my `bytes` into every peer's output at slot `rank` in rotated order, then
// "done" barrier (every peer's pushes into my output are complete).
PL_GLOBAL void __launch_bounds__(512) pl_all_gather(const u8* in, u64 bytes, u32 rank, u32 world, Ptrs out,
                                                    Ptrs flags, u32* counter) {
  const u32 e = next_epoch(counter);
  block_barrier(flags, 0, rank, world, e);
  const u64 units = (bytes + 15) / 16;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const bool in_ok = aligned16(in);
  for (u32 i = 0; i < world; ++i) {
    const u32 p = (rank + i) % world;
    u8* dst = reinterpret_cast<u8*>(out.p[p]) + rank * bytes;
    const bool ok = in_ok && aligned16(dst);
    for (u64 u = tid; u < units; u += nt) copy_unit(dst, in, u, bytes, ok);
  }
  block_barrier(flags, 1, rank, world, e);
}

#define PL_AR(NAME, T, R)                                                                                    \
  PL_GLOBAL void __launch_bounds__(512) pl_one_shot_##NAME(const T* in, T* out, u64 n, u32 rank, u32 world, \
                                                          Ptrs stage, u64 stride, Ptrs flags, u32* counter) { \
    one_shot<T, R>(in, out, n, rank, world, stage, stride, flags, counter);                                  \
  }                                                                                                          \
  PL_GLOBAL void __launch_bounds__(512) pl_two_shot_##NAME(const T* in, T* out, u64 n, u32 rank, u32 world, \
                                                          Ptrs stage, u64 stride, Ptrs flags, u32* counter) { \
    two_shot<T, R>(in, out, n, rank, world, stage, stride, flags, counter);                                  \
  }

#define PL_AR_ARITH(NAME, T) PL_AR(NAME##_sum, T, Sum) PL_AR(NAME##_prod, T, Prod) PL_AR(NAME##_min, T, Min) PL_AR(NAME##_max, T, Max)
#define PL_AR_INT(NAME, T) PL_AR_ARITH(NAME, T) PL_AR(NAME##_and, T, And) PL_AR(NAME##_or, T, Or)

PL_AR_ARITH(f32, float)
PL_AR_ARITH(f64, double)
PL_AR_ARITH(bf16, bf16)
PL_AR_ARITH(f16, f16)
PL_AR_INT(s8, s8)
PL_AR_INT(s32, s32)
PL_AR_INT(u32, u32)
PL_AR_INT(s64, s64)
PL_AR_INT(u64, u64)
PL_AR(pred_and, u8, And)
PL_AR(pred_or, u8, Or)
PL_AR(pred_max, u8, Or)
PL_AR(pred_min, u8, And)

// Peer-access probe: one thread stores `v` into a peer's memory and reads it back.
PL_GLOBAL void pl_probe(u32* remote, u32 v, u32* readback) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    store_release_sys(remote, v);
    *readback = load_acquire_sys(remote);
  }
}
