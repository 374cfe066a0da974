// Peerless's peer-access collective kernels (CUDA C++, compiled at run time by NVRTC).
// Kernels: one-shot / two-shot all-reduce and reduce-scatter per (type, reduction), the
// one-shot all-reduce fused with the residual add + RMSNorm after it (f32 / bf16 / f16 sums),
// pl_exchange (direct all-gather, all-to-all, collective-permute over strided runs),
// pl_all_gather (the kernel tests' contiguous all-gather).
//
// The protocols are the host backend's (kernels/src/host/protocol.rs), per thread block:
// - Signals of one communicator on one device: `u32 counter[PL_BLOCKS]` (the block's launch
//   count, advanced on the device at kernel entry), then `u32 flags[2][PL_BLOCKS][PL_MAX_RANKS]`
//   where flags[s][b][j] is written only by rank j's block b. A block signals peer t by a
//   system-scope release store into t's flags[s][b][rank] and waits with acquire loads on its
//   own flags[s][b][t] until it is at least the expected value (wrapping-aware). Values only
//   grow, so slots are never reset. Every kernel's barriers of launch epoch e use the values
//   2e - 1 and 2e (a kernel with one barrier per set: 2e), so the values stay monotonic when
//   launches of different kernels share one device's signals (the handlers' shared staging
//   slots run all-reduces, reduce-scatters and exchanges of one group on one set of flags).
// - Work is split in 16-byte units (VEC elements); unit u (of a range) belongs to thread
//   u mod (gridDim * blockDim), the same thread in every phase and on every rank, so a
//   per-block barrier covers exactly the data that block exchanges.
// - Staging is double-buffered by launch parity (one-shot and two-shot have no end barrier).
//
// PL_BLOCKS (blocks per grid, also the flag-array size) is defined by the host before this
// file: one constant for launch geometry and flag sizing.
//
// Compilation units: with nothing more defined, this file instantiates every kernel. The host
// compiles one unit at a time instead (kernels/src/gpu/units.rs), so a process builds only what
// it runs: PL_UNIT_BASE keeps the kernels of no element type (pl_all_gather, pl_exchange,
// pl_probe); PL_UNIT_SPEC, defined as e.g. `PL_TWO_SHOT(f32_sum, float, Sum)`, keeps that one
// kernel of one reduction specialization.
#include "peerless_device.h"

#ifndef PL_BLOCKS
#error "PL_BLOCKS must be defined by the host"
#endif
#define PL_MAX_RANKS 8

struct Ptrs { u64 p[PL_MAX_RANKS]; };

// Where a kernel reports a peer that never arrived: `word` points to this device's
// `u32[2]` status (bit m of word[0]: member m missed a barrier; word[1]: the tag of the
// first collective that timed out). Once word[0] is non-zero every later wait of the
// execution returns at once, so a missing rank costs one timeout, not one per barrier.
// `word`: this device's u32[2] (missing-member mask, tag of the first timeout) in device
// memory, polled by every wait. `report`: 0, or host-mapped u32[2] that a timeout also writes
// (plain stores: host-mapped memory has no device atomics over PCIe), for hosts that read
// the outcome without synchronising (XLA's FFI handlers); polling it would cost a PCIe read
// per spin.
struct Status { u64 word; u64 timeout_ns; u64 tag; u64 report; };

PL_DEVICE bool failed(const Status& st) {
  return *reinterpret_cast<volatile const u32*>(st.word) != 0;
}

// Records that member `member` never arrived (status words, and the host-mapped report).
PL_DEVICE void report_missing(const Status& st, u32 member) {
  u32* w = reinterpret_cast<u32*>(st.word);
  atomicCAS(w + 1, 0u, (u32)st.tag);
  const u32 mask = atomicOr(w, 1u << member) | (1u << member);
  if (st.report) {
    volatile u32* r = reinterpret_cast<volatile u32*>(st.report);
    r[1] = (u32)st.tag;
    r[0] = mask;
    __threadfence_system();
  }
}

// Spins until the counter at `p` is at least `e`, or `st.timeout_ns` passed (reported as
// member `member` missing), or an earlier wait of this execution already failed.
PL_DEVICE void wait_bounded(const u32* p, u32 e, const Status& st, u32 member) {
  if (reached(load_acquire_sys(p), e)) return;
  const u64 t0 = pl_nanotime();
  while (!reached(load_acquire_sys(p), e)) {
    pl_spin_pause();
    if (failed(st)) return;
    if (pl_nanotime() - t0 > st.timeout_ns) {
      report_missing(st, member);
      return;
    }
  }
}

PL_DEVICE u32* flag_slot(u64 flags_base, u32 set, u32 block, u32 rank) {
  return reinterpret_cast<u32*>(flags_base) + (set * PL_BLOCKS + block) * PL_MAX_RANKS + rank;
}

// Advances this block's launch counter and returns it. Grids vary with the message size (up
// to PL_BLOCKS blocks), so block b also advances counters b + gridDim, b + 2 gridDim, ...:
// every counter of a device advances once per launch and all blocks of a launch share one
// epoch (the staging parity below needs that). Only this block touches those counters
// during the launch; launches on a stream are ordered.
PL_DEVICE u32 next_epoch(u32* counter) {
  __shared__ u32 e;
  if (threadIdx.x == 0) e = counter[blockIdx.x] + 1;
  __syncthreads();
  // Thread t stores counter blockIdx.x + t * gridDim.x (thread 0 its own block's).
  for (u32 i = blockIdx.x + threadIdx.x * gridDim.x; i < PL_BLOCKS; i += gridDim.x * blockDim.x) counter[i] = e;
  return e;
}

// Per-block cross-rank barrier: every thread's prior writes are ordered before the signal.
PL_DEVICE void block_barrier(const Ptrs& flags, u32 set, u32 rank, u32 world, u32 value, const Status& st) {
  __syncthreads();
  const u32 t = threadIdx.x;
  if (t < world) {
    store_release_sys(flag_slot(flags.p[t], set, blockIdx.x, rank), value);
    wait_bounded(flag_slot(flags.p[rank], set, blockIdx.x, t), value, st, t);
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
PL_INT_TRAITS(s16)
PL_INT_TRAITS(u16)
PL_INT_TRAITS(s32)
PL_INT_TRAITS(u32)
PL_INT_TRAITS(s64)
PL_INT_TRAITS(u64)
PL_INT_TRAITS(s8)

// ---- reductions ----
// Float min/max give what XLA alone gives on GPUs at the sizes Peerless takes (measured on 2x
// H100, jax 0.11.2): f32 and bf16 run on XLA's Triton one-shot kernel up to 4 MiB (at least),
// NaN-propagating (any NaN gives NaN); f16 (and f64) run on NCCL, whose fminf/fmaxf skip a NaN
// operand (all-NaN stays NaN). Both order -0 below +0 (CUDA's fmaxf does), so the result does
// not depend on the order members are folded in. 16-bit floats are widened to f32 first.
// Integers: plain comparisons.
template <typename A> PL_DEVICE A pl_minv(A a, A b) { return b < a ? b : a; }
template <typename A> PL_DEVICE A pl_maxv(A a, A b) { return b > a ? b : a; }
template <> PL_DEVICE float pl_minv<float>(float a, float b) { return fminf(a, b); }
template <> PL_DEVICE float pl_maxv<float>(float a, float b) { return fmaxf(a, b); }
template <> PL_DEVICE double pl_minv<double>(double a, double b) { return fmin(a, b); }
template <> PL_DEVICE double pl_maxv<double>(double a, double b) { return fmax(a, b); }
struct Sum { template <typename A> static PL_DEVICE A f(A a, A b) { return a + b; } };
struct Prod { template <typename A> static PL_DEVICE A f(A a, A b) { return a * b; } };
struct Min { template <typename A> static PL_DEVICE A f(A a, A b) { return pl_minv(a, b); } };
struct Max { template <typename A> static PL_DEVICE A f(A a, A b) { return pl_maxv(a, b); } };
// NaN-propagating variants (a + b is NaN when either is).
struct MinNaN { template <typename A> static PL_DEVICE A f(A a, A b) { return (a != a || b != b) ? a + b : pl_minv(a, b); } };
struct MaxNaN { template <typename A> static PL_DEVICE A f(A a, A b) { return (a != a || b != b) ? a + b : pl_maxv(a, b); } };
// The reduction element type T really folds with: f32 and bf16 min/max propagate NaN.
template <typename T, typename R> struct OpOf { typedef R type; };
template <> struct OpOf<float, Min> { typedef MinNaN type; };
template <> struct OpOf<float, Max> { typedef MaxNaN type; };
template <> struct OpOf<bf16, Min> { typedef MinNaN type; };
template <> struct OpOf<bf16, Max> { typedef MaxNaN type; };
// The rounding after each step of a fold: none (the accumulator's own), except f16, which
// rounds every partial result as NCCL's __hadd / __hmul and XLA:CPU do (so overflow happens
// where theirs does); bf16 folds in f32 and rounds once.
template <typename T> struct StepRound { static PL_DEVICE typename Tr<T>::Acc f(typename Tr<T>::Acc a) { return a; } };
template <> struct StepRound<f16> { static PL_DEVICE float f(float a) { return to_f32(from_f32_f16(a)); } };
// One step of a fold: the next member `x` into the accumulator, in the element's rounding.
template <typename T, typename R>
PL_DEVICE typename Tr<T>::Acc fold_step(typename Tr<T>::Acc a, T x) {
  return StepRound<T>::f(OpOf<T, R>::type::f(a, Tr<T>::up(x)));
}
struct And { template <typename A> static PL_DEVICE A f(A a, A b) { return a & b; } };
struct Or { template <typename A> static PL_DEVICE A f(A a, A b) { return a | b; } };
struct Xor { template <typename A> static PL_DEVICE A f(A a, A b) { return a ^ b; } };  // pred "add"


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
      for (u32 k = 0; k < VEC; ++k) acc[k] = fold_step<T, R>(acc[k], x.e[k]);
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
      for (u32 p = 1; p < world; ++p) acc = fold_step<T, R>(acc, reinterpret_cast<const T*>(stage.p[p] + par)[i]);
      dst[i] = Tr<T>::down(acc);
    }
  }
}

// ---- several units per thread in flight ----
// NVLink reads take about a microsecond, so a thread with one 16-byte load outstanding caps
// 24 blocks x 512 threads near 130 GB/s (the two-shot all-reduce measured 123 GB/s bus
// bandwidth that way). These helpers take PL_UNROLL units of a thread per step (units u,
// u + nt, ..., the same unit -> thread mapping as one unit per step, which the per-block
// barriers rely on) and issue the step's loads (per rank, for reductions) before using any.
#define PL_UNROLL 4

// Reduces, for each k < UN, the 16-byte unit at byte offset off[k] of every rank's buffer
// src.p[0..world) in the fixed rank order 0..world-1 (bitwise the same result on every
// rank), into y[k].
template <typename T, typename R, u32 UN>
PL_DEVICE void reduce_vecs(vec16 (&y)[UN], const Ptrs& src, u32 world, const u64 (&off)[UN]) {
  typedef typename Tr<T>::Acc A;
  constexpr u32 VEC = Unit<T>::VEC;
  union V { vec16 v; T e[VEC]; };
  A acc[UN][VEC];
  {
    V x[UN];
#pragma unroll
    for (u32 k = 0; k < UN; ++k) x[k].v = load16(reinterpret_cast<const void*>(src.p[0] + off[k]));
#pragma unroll
    for (u32 k = 0; k < UN; ++k)
#pragma unroll
      for (u32 i = 0; i < VEC; ++i) acc[k][i] = Tr<T>::up(x[k].e[i]);
  }
  // Ranks one after another (UN loads in flight each): unrolling this loop too multiplied
  // NVRTC's compile time by three for the ~200 reduction kernels.
#pragma unroll 1
  for (u32 p = 1; p < world; ++p) {
    V x[UN];
#pragma unroll
    for (u32 k = 0; k < UN; ++k) x[k].v = load16(reinterpret_cast<const void*>(src.p[p] + off[k]));
#pragma unroll
    for (u32 k = 0; k < UN; ++k)
#pragma unroll
      for (u32 i = 0; i < VEC; ++i) acc[k][i] = fold_step<T, R>(acc[k][i], x[k].e[i]);
  }
#pragma unroll
  for (u32 k = 0; k < UN; ++k) {
    V o;
#pragma unroll
    for (u32 i = 0; i < VEC; ++i) o.e[i] = Tr<T>::down(acc[k][i]);
    y[k] = o.v;
  }
}

template <typename T, typename R>
PL_DEVICE vec16 fold_units(const vec16 (&xv)[PL_MAX_RANKS], u32 world);

// Reduces one whole 16-byte unit at byte offset `off` of every rank's buffer, with every
// rank's load issued before any is used (the small-message path: one unit per thread, so the
// NVLink latency is paid once, not once per rank). Same fixed rank order as reduce_vecs.
template <typename T, typename R>
PL_DEVICE vec16 reduce_wide(const Ptrs& src, u32 world, u64 off) {
  vec16 x[PL_MAX_RANKS];
#pragma unroll
  for (u32 p = 0; p < PL_MAX_RANKS; ++p)
    if (p < world) x[p] = load16(reinterpret_cast<const void*>(src.p[p] + off));
  return fold_units<T, R>(x, world);
}

// Reduces every member's unit x[0..world) in the fixed rank order into one unit.
template <typename T, typename R>
PL_DEVICE vec16 fold_units(const vec16 (&xv)[PL_MAX_RANKS], u32 world) {
  typedef typename Tr<T>::Acc A;
  constexpr u32 VEC = Unit<T>::VEC;
  union V { vec16 v; T e[VEC]; };
  V x[PL_MAX_RANKS];
#pragma unroll
  for (u32 p = 0; p < PL_MAX_RANKS; ++p)
    if (p < world) x[p].v = xv[p];
  A acc[VEC];
#pragma unroll
  for (u32 i = 0; i < VEC; ++i) acc[i] = Tr<T>::up(x[0].e[i]);
#pragma unroll
  for (u32 p = 1; p < PL_MAX_RANKS; ++p)
    if (p < world) {
#pragma unroll
      for (u32 i = 0; i < VEC; ++i) acc[i] = fold_step<T, R>(acc[i], x[p].e[i]);
    }
  V o;
#pragma unroll
  for (u32 i = 0; i < VEC; ++i) o.e[i] = Tr<T>::down(acc[i]);
  return o.v;
}

// Stores unit `u` of `y` into dst (16-byte store when `vec_ok`, element stores otherwise).
template <typename T>
PL_DEVICE void store_unit(T* dst, u64 u, vec16 y, bool vec_ok) {
  constexpr u32 VEC = Unit<T>::VEC;
  if (vec_ok) {
    store16(dst + u * VEC, y);
  } else {
    union { vec16 v; T e[VEC]; } o;
    o.v = y;
    for (u32 i = 0; i < VEC; ++i) dst[u * VEC + i] = o.e[i];
  }
}

// Copies units [lo, hi) of an n-element array (this thread's share), PL_UNROLL at a time.
template <typename T>
PL_DEVICE void copy_range(T* dst, const T* src, u64 lo, u64 hi, u64 n, bool vec_ok) {
  constexpr u32 VEC = Unit<T>::VEC;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  u64 u = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 full = pl_min(hi, n / VEC);  // units wholly inside the array
  if (vec_ok) {
    for (; u + (PL_UNROLL - 1) * nt < full; u += PL_UNROLL * nt) {
      vec16 v[PL_UNROLL];
#pragma unroll
      for (u32 k = 0; k < PL_UNROLL; ++k) v[k] = load16(src + (u + k * nt) * VEC);
#pragma unroll
      for (u32 k = 0; k < PL_UNROLL; ++k) store16(dst + (u + k * nt) * VEC, v[k]);
    }
  }
  for (; u < hi; u += nt) copy_unit(dst, src, u, n, vec_ok);
}

// Reduces units [lo, hi) of every rank's staging (`stage.p[p] + par`) into dst and, when
// dst2 is non-null, also into dst2 (which must be 16-byte aligned). This thread's share.
template <typename T, typename R>
PL_DEVICE void reduce_range(T* dst, bool dst_ok, T* dst2, const Ptrs& stage, u64 par, u32 world, u64 lo,
                            u64 hi, u64 n) {
  constexpr u32 VEC = Unit<T>::VEC;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  u64 u = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 full = pl_min(hi, n / VEC);
  for (; u + (PL_UNROLL - 1) * nt < full; u += PL_UNROLL * nt) {
    u64 off[PL_UNROLL];
#pragma unroll
    for (u32 k = 0; k < PL_UNROLL; ++k) off[k] = par + (u + k * nt) * 16;
    vec16 y[PL_UNROLL];
    reduce_vecs<T, R, PL_UNROLL>(y, stage, world, off);
#pragma unroll
    for (u32 k = 0; k < PL_UNROLL; ++k) {
      store_unit(dst, u + k * nt, y[k], dst_ok);
      if (dst2) store16(dst2 + (u + k * nt) * VEC, y[k]);
    }
  }
  for (; u < full; u += nt) {
    const vec16 y = reduce_wide<T, R>(stage, world, par + u * 16);
    store_unit(dst, u, y, dst_ok);
    if (dst2) store16(dst2 + u * VEC, y);
  }
  for (; u < hi; u += nt) {  // the array's partial last unit
    reduce_unit<T, R>(dst, stage, par, world, u, n, dst_ok);
    if (dst2) copy_unit(dst2, dst, u, n, dst_ok);
  }
}

// One-shot all-reduce: copy-in to my staging[parity], barrier, reduce every rank's staging.
template <typename T, typename R>
PL_DEVICE void one_shot(const T* in, T* out, u64 n, u32 rank, u32 world, const Ptrs& stage, u64 stride,
                        const Ptrs& flags, u32* counter, const Status& st) {
  const u32 e = next_epoch(counter);
  const u64 par = (e & 1) * stride;
  const u64 units = (n + Unit<T>::VEC - 1) / Unit<T>::VEC;
  T* mine = reinterpret_cast<T*>(stage.p[rank] + par);
  const bool in_ok = aligned16(in), out_ok = aligned16(out);
  copy_range(mine, in, 0, units, n, in_ok);
  block_barrier(flags, 0, rank, world, 2 * e, st);
  reduce_range<T, R>(out, out_ok, nullptr, stage, par, world, 0, units, n);
}

// A variadic all-reduce in one launch: up to PL_MAX_OPERANDS operands of one element type,
// operand j staged at byte offset `off[j]` of the staging half. Same protocol as one_shot
// (every operand copied in, one barrier, every operand reduced), so a gradient sync of many
// small arrays pays one launch and one barrier instead of one per array.
#define PL_MAX_OPERANDS 8
struct Many { u64 count; u64 in[PL_MAX_OPERANDS]; u64 out[PL_MAX_OPERANDS]; u64 n[PL_MAX_OPERANDS]; u64 off[PL_MAX_OPERANDS]; };

template <typename T, typename R>
PL_DEVICE void one_shot_many(const Many& m, u32 rank, u32 world, const Ptrs& stage, u64 stride, const Ptrs& flags,
                             u32* counter, const Status& st) {
  const u32 e = next_epoch(counter);
  const u64 par = (e & 1) * stride;
  const u64 count = pl_min(m.count, PL_MAX_OPERANDS);
  for (u64 j = 0; j < count; ++j) {
    const T* in = reinterpret_cast<const T*>(m.in[j]);
    const u64 units = (m.n[j] + Unit<T>::VEC - 1) / Unit<T>::VEC;
    copy_range(reinterpret_cast<T*>(stage.p[rank] + par + m.off[j]), in, 0, units, m.n[j], aligned16(in));
  }
  block_barrier(flags, 0, rank, world, 2 * e, st);
  for (u64 j = 0; j < count; ++j) {
    T* out = reinterpret_cast<T*>(m.out[j]);
    const u64 units = (m.n[j] + Unit<T>::VEC - 1) / Unit<T>::VEC;
    Ptrs s;
    for (u32 p = 0; p < PL_MAX_RANKS; ++p) s.p[p] = stage.p[p] + m.off[j];
    reduce_range<T, R>(out, aligned16(out), nullptr, s, par, world, 0, units, m.n[j]);
  }
}

// Two-shot all-reduce, reduce-scatter by pushing: each rank stores block k of its operand
// straight into member k's staging (no copy-in: the wire carries XLA's buffer), barrier; the
// owner reduces its block from its own operand and the pushed pieces (local reads only) into
// the output and into its staging, barrier; every rank reads the other blocks from their
// owners' staging. Member k's staging half holds one piece per other rank: rank r's at slot
// r (r < k) or r - 1 (r > k); the reduced block overwrites slot 0 (the thread that writes a
// unit is the one that just read it). The rank order of the reduction is fixed (0..world-1),
// so a row's result is the same bits as in the one-shot.
template <typename T, typename R>
PL_DEVICE void two_shot(const T* in, T* out, u64 n, u32 rank, u32 world, const Ptrs& stage, u64 stride,
                        const Ptrs& flags, u32* counter, const Status& st) {
  constexpr u32 VEC = Unit<T>::VEC;
  const u64 units = (n + VEC - 1) / VEC;
  const u64 per = (units + world - 1) / world;
  if ((u64)(world - 1) * per * 16 > stride) {
    // Tiny operands (under world^2 units) may not fit the pieces: one-shot (same bits).
    one_shot<T, R>(in, out, n, rank, world, stage, stride, flags, counter, st);
    return;
  }
  const u32 e = next_epoch(counter);
  const u64 par = (e & 1) * stride;
  const bool in_ok = aligned16(in), out_ok = aligned16(out);
  // Address of slot `s` of member `k`'s half, shifted so that unit u of block [lo, ..) is at + u * 16.
  auto slot = [&](u32 k, u32 s, u64 lo) { return stage.p[k] + par + s * per * 16 - lo * 16; };
  for (u32 i = 1; i < world; ++i) {
    const u32 k = (rank + i) % world;
    const u64 lo = pl_min(units, k * per), hi = pl_min(units, lo + per);
    copy_range(reinterpret_cast<T*>(slot(k, rank - (rank > k ? 1 : 0), lo)), in, lo, hi, n, in_ok);
  }
  block_barrier(flags, 0, rank, world, 2 * e - 1, st);
  const u64 lo = pl_min(units, rank * per), hi = pl_min(units, lo + per);
  T* result = reinterpret_cast<T*>(slot(rank, 0, lo));
  if (in_ok) {
    Ptrs src;
    for (u32 p = 0; p < world; ++p) src.p[p] = p == rank ? reinterpret_cast<u64>(in) : slot(rank, p - (p > rank ? 1 : 0), lo);
    reduce_range<T, R>(out, out_ok, result, src, 0, world, lo, hi, n);
  } else {
    // An operand off 16-byte alignment: element by element (never XLA's buffers).
    typedef typename Tr<T>::Acc A;
    const u64 nt = (u64)gridDim.x * blockDim.x;
    for (u64 u = lo + (u64)blockIdx.x * blockDim.x + threadIdx.x; u < hi; u += nt) {
      for (u64 i = u * VEC; i < n && i < u * VEC + VEC; ++i) {
        A acc = Tr<T>::up(rank == 0 ? in[i] : reinterpret_cast<const T*>(slot(rank, 0, lo))[i]);
        for (u32 p = 1; p < world; ++p)
          acc = fold_step<T, R>(acc, p == rank ? in[i] : reinterpret_cast<const T*>(slot(rank, p - (p > rank ? 1 : 0), lo))[i]);
        out[i] = Tr<T>::down(acc);
        result[i] = out[i];
      }
    }
  }
  block_barrier(flags, 0, rank, world, 2 * e, st);
  for (u32 i = 1; i < world; ++i) {
    const u32 k = (rank + i) % world;
    const u64 klo = pl_min(units, k * per), khi = pl_min(units, klo + per);
    copy_range(out, reinterpret_cast<const T*>(slot(k, 0, klo)), klo, khi, n, out_ok);
  }
}

// ---- the one-shot all-reduce through Lamport regions (float types) ----
// One crossing of the wire and no flags: each rank stores its operand into every peer's
// receive region (slot `rank`), and a receiver knows a 16-byte unit has arrived when none of
// its elements holds the sentinel (every bit set: a NaN of every float type; an operand's own
// such NaNs are sent as another NaN, so the sum is NaN either way). Regions start as sentinel,
// and rotate over three launches: launch i receives into region i % 3 and sets region
// (i + 2) % 3 back to sentinel, which launch i - 1 used (all of it arrived: this rank read it)
// and launch i + 2 reuses (its writers get there only after this rank's launch i + 1 pushed,
// after this launch ended). Per device, at `lam.p[rank]`: u32 counter[PL_BLOCKS] (Lamport
// launches), u64 used[3] (bytes per slot each region's last launch received), then at
// PL_LAMPORT_HDR the three regions of `world` slots of `slot` bytes.
#define PL_LAMPORT_HDR 1024

template <u32 S> PL_DEVICE bool has_sentinel(vec16 v);
template <> PL_DEVICE bool has_sentinel<4>(vec16 v) {
  return (v.w[0] == ~0u) | (v.w[1] == ~0u) | (v.w[2] == ~0u) | (v.w[3] == ~0u);
}
template <> PL_DEVICE bool has_sentinel<2>(vec16 v) {
  bool s = false;
#pragma unroll
  for (u32 k = 0; k < 4; ++k) s |= ((v.w[k] & 0xffffu) == 0xffffu) | ((v.w[k] >> 16) == 0xffffu);
  return s;
}
template <> PL_DEVICE bool has_sentinel<8>(vec16 v) {
  return ((v.w[0] & v.w[1]) == ~0u) | ((v.w[2] & v.w[3]) == ~0u);
}
// The unit with each sentinel element replaced by the NaN with every bit but the sign set.
template <u32 S> PL_DEVICE vec16 unsentinel(vec16 v);
template <> PL_DEVICE vec16 unsentinel<4>(vec16 v) {
#pragma unroll
  for (u32 k = 0; k < 4; ++k) v.w[k] = v.w[k] == ~0u ? 0x7fffffffu : v.w[k];
  return v;
}
template <> PL_DEVICE vec16 unsentinel<2>(vec16 v) {
#pragma unroll
  for (u32 k = 0; k < 4; ++k) {
    if ((v.w[k] & 0xffffu) == 0xffffu) v.w[k] &= 0xffff7fffu;
    if ((v.w[k] >> 16) == 0xffffu) v.w[k] &= 0x7fffffffu;
  }
  return v;
}
template <> PL_DEVICE vec16 unsentinel<8>(vec16 v) {
  if ((v.w[0] & v.w[1]) == ~0u) v.w[1] = 0x7fffffffu;
  if ((v.w[2] & v.w[3]) == ~0u) v.w[3] = 0x7fffffffu;
  return v;
}

// Unit u of an n-element array, zero past its end.
template <typename T>
PL_DEVICE vec16 load_unit(const T* src, u64 u, u64 n, bool vec_ok) {
  constexpr u32 VEC = Unit<T>::VEC;
  const u64 b = u * VEC;
  if (vec_ok && b + VEC <= n) return load16(src + b);
  union { vec16 v; T e[VEC]; } x;
  x.v = vec16{{0u, 0u, 0u, 0u}};
  for (u32 k = 0; k < VEC && b + k < n; ++k) x.e[k] = src[b + k];
  return x.v;
}

// Spins until the unit at `p` holds no sentinel (into `v`), or the timeout (member missing).
template <u32 S>
PL_DEVICE void wait_unit(vec16& v, const u8* p, const Status& st, u32 member) {
  if (!has_sentinel<S>(v)) return;
  const u64 t0 = pl_nanotime();
  while (has_sentinel<S>(v = load16_volatile(p))) {
    if (failed(st)) return;
    if (pl_nanotime() - t0 > st.timeout_ns) {
      report_missing(st, member);
      return;
    }
  }
}

// Ends Lamport launch `i` of `units` units per slot on this rank (its regions at `base`):
// records the units, and sets region (i + 2) % 3 back to sentinel as far as its last launch
// filled it, every slot (this rank's own too: the fused kernel fills it on the same regions).
PL_DEVICE void lamport_reset(u64 base, u32 world, u64 slot, u32 i, u64 units) {
  const u64 nt = (u64)gridDim.x * blockDim.x;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  u64* used = reinterpret_cast<u64*>(base + 4 * PL_BLOCKS);
  const u32 old = (i + 2) % 3;
  const u64 prev = used[old] / 16;
  if (tid == 0) used[i] = units * 16;
  u8* clear = reinterpret_cast<u8*>(base + PL_LAMPORT_HDR + (u64)old * world * slot);
  for (u64 k = tid; k < world * prev; k += nt) {
    const u64 p = k / prev;
    store16(clear + p * slot + (k - p * prev) * 16, vec16{{~0u, ~0u, ~0u, ~0u}});
  }
}

template <typename T, typename R>
PL_DEVICE void lamport(const T* in, T* out, u64 n, u32 rank, u32 world, const Ptrs& lam, u64 slot, u32* counter,
                       const Status& st) {
  constexpr u32 VEC = Unit<T>::VEC;
  constexpr u32 S = sizeof(T);
  union V { vec16 v; T e[VEC]; };
  const u32 e = next_epoch(counter);
  const u32 i = e % 3;
  const u64 units = (n + VEC - 1) / VEC;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 region = PL_LAMPORT_HDR + (u64)i * world * slot;
  const bool in_ok = aligned16(in), out_ok = aligned16(out);
  for (u64 u = tid; u < units; u += nt) {
    const vec16 v = unsentinel<S>(load_unit(in, u, n, in_ok));
    for (u32 k = 1; k < world; ++k) store16(reinterpret_cast<u8*>(lam.p[(rank + k) % world] + region + rank * slot) + u * 16, v);
  }
  const u8* mine = reinterpret_cast<const u8*>(lam.p[rank] + region);
  for (u64 u = tid; u < units; u += nt) {
    vec16 x[PL_MAX_RANKS];
#pragma unroll
    for (u32 p = 0; p < PL_MAX_RANKS; ++p)
      if (p < world) x[p] = p == rank ? unsentinel<S>(load_unit(in, u, n, in_ok)) : load16_volatile(mine + p * slot + u * 16);
#pragma unroll
    for (u32 p = 0; p < PL_MAX_RANKS; ++p)
      if (p < world && p != rank) wait_unit<S>(x[p], mine + p * slot + u * 16, st, p);
    V y;
    y.v = fold_units<T, R>(x, world);
    if (out_ok && u * VEC + VEC <= n) {
      store16(out + u * VEC, y.v);
    } else {
      for (u32 k = 0; k < VEC && u * VEC + k < n; ++k) out[u * VEC + k] = y.e[k];
    }
  }
  lamport_reset(lam.p[rank], world, slot, i, units);
}

// All-gather by pushing (the benchmark's contiguous form; the executor uses pl_exchange):
// "ready" barrier (every peer is inside this launch, so its output is free), push my `bytes`
// into every peer's output at slot `rank` in rotated order, then "done" barrier (every
// peer's pushes into my output are complete).
#if !defined(PL_UNIT_SPEC)
PL_GLOBAL void __launch_bounds__(512) pl_all_gather(const u8* in, u64 bytes, u32 rank, u32 world, Ptrs out,
                                                    Ptrs flags, u32* counter, Status st) {
  const u32 e = next_epoch(counter);
  block_barrier(flags, 0, rank, world, 2 * e, st);
  const u64 units = (bytes + 15) / 16;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  bool ok = aligned16(in);
  for (u32 p = 0; p < world; ++p) ok = ok && aligned16(reinterpret_cast<u8*>(out.p[p]) + rank * bytes);
  if (ok) {
    // Each group of units is loaded once and stored to every peer, in rotated order.
    for (; u + (PL_UNROLL - 1) * nt < bytes / 16; u += PL_UNROLL * nt) {
      vec16 v[PL_UNROLL];
#pragma unroll
      for (u32 k = 0; k < PL_UNROLL; ++k) v[k] = load16(in + (u + k * nt) * 16);
      for (u32 i = 0; i < world; ++i) {
        u8* dst = reinterpret_cast<u8*>(out.p[(rank + i) % world]) + rank * bytes;
#pragma unroll
        for (u32 k = 0; k < PL_UNROLL; ++k) store16(dst + (u + k * nt) * 16, v[k]);
      }
    }
  }
  for (; u < units; u += nt) {
    for (u32 i = 0; i < world; ++i) {
      u8* dst = reinterpret_cast<u8*>(out.p[(rank + i) % world]) + rank * bytes;
      copy_unit(dst, in, u, bytes, ok);
    }
  }
  block_barrier(flags, 1, rank, world, 2 * e, st);
}
#endif

// ---- strided runs: `rows` runs of `row` bytes, `sstride` / `dstride` apart ----
struct Run { u64 src; u64 dst; u64 rows; u64 row; u64 sstride; u64 dstride; };

// Copies a run set, 16-byte units spread over the whole grid (unit u: thread u mod nt).
PL_DEVICE void copy_runs(const Run& r) {
  if (r.rows == 0 || r.row == 0) return;
  const u64 upr = (r.row + 15) / 16;
  const u64 units = r.rows * upr;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const bool vec = ((r.src | r.dst | r.sstride | r.dstride) & 15) == 0;
  u64 u = tid;
  if (vec && (r.row & 15) == 0) {  // every unit is 16 whole bytes: PL_UNROLL loads in flight
    for (; u + (PL_UNROLL - 1) * nt < units; u += PL_UNROLL * nt) {
      vec16 v[PL_UNROLL];
      u64 d[PL_UNROLL];
#pragma unroll
      for (u32 k = 0; k < PL_UNROLL; ++k) {
        const u64 uk = u + k * nt, row = uk / upr, c = (uk - row * upr) * 16;
        v[k] = load16(reinterpret_cast<const u8*>(r.src + row * r.sstride + c));
        d[k] = r.dst + row * r.dstride + c;
      }
#pragma unroll
      for (u32 k = 0; k < PL_UNROLL; ++k) store16(reinterpret_cast<u8*>(d[k]), v[k]);
    }
  }
  for (; u < units; u += nt) {
    const u64 row = u / upr, c = (u - row * upr) * 16;
    const u8* s = reinterpret_cast<const u8*>(r.src + row * r.sstride + c);
    u8* d = reinterpret_cast<u8*>(r.dst + row * r.dstride + c);
    const u64 len = pl_min(16, r.row - c);
    if (vec && len == 16) {
      store16(d, load16(s));
    } else {
      for (u64 i = 0; i < len; ++i) d[i] = s[i];
    }
  }
}

// ---- the exchange kernel: direct all-gather, all-to-all and collective-permute ----
// Two signal phases around a list of copies (which may target peers' memory). Phase s
// stores the epoch into `sig[s].n` peers' flag slots (flags set s, this block) and waits
// until `wait[s].n` of this device's own slots reach it. All-gather and all-to-all use a
// full group barrier in both phases ("ready": every peer is inside this launch, so its
// output is free; "done": every push into my output landed); collective-permute signals
// "ready" to its source and "done" to its target.
#define PL_MAX_TASKS 8
struct Sig { u64 n; u64 base[PL_MAX_RANKS]; u64 slot[PL_MAX_RANKS]; };
struct Wait { u64 n; u64 slot[PL_MAX_RANKS]; };
struct Xchg {
  u64 counter;  // this device's u32[PL_BLOCKS] launch counters
  u64 flags;    // this device's flag sets
  Sig sig[2];
  Wait wait[2];
  u64 ntasks;
  Run task[PL_MAX_TASKS];
};

PL_DEVICE void exchange_phase(const Xchg& x, u32 s, u32 e, const Status& st) {
  __syncthreads();
  const u32 t = threadIdx.x;
  if (t < x.sig[s].n) store_release_sys(flag_slot(x.sig[s].base[t], s, blockIdx.x, (u32)x.sig[s].slot[t]), e);
  if (t < x.wait[s].n) wait_bounded(flag_slot(x.flags, s, blockIdx.x, (u32)x.wait[s].slot[t]), e, st, (u32)x.wait[s].slot[t]);
  __syncthreads();
}

#if !defined(PL_UNIT_SPEC)
PL_GLOBAL void __launch_bounds__(512) pl_exchange(Xchg x, Status st) {
  const u32 e = next_epoch(reinterpret_cast<u32*>(x.counter));
  exchange_phase(x, 0, 2 * e, st);
  if (!failed(st)) {
    for (u64 k = 0; k < x.ntasks && k < PL_MAX_TASKS; ++k) copy_runs(x.task[k]);
  }
  exchange_phase(x, 1, 2 * e, st);
}
#endif

// ---- block reductions: reduce-scatter and the fallback's local reduce ----
// An operand viewed along the scatter dimension: `outer` rows of `world` blocks of `brow`
// bytes (`full` = world * brow bytes per row). Unit u of a block is VEC elements of one
// row: the same unit index maps to the same thread in every block, so a per-block barrier
// covers exactly the units a block stages and later reads.
struct Blocks { u64 outer; u64 brow; u64 full; };

template <typename T>
PL_DEVICE u64 block_units(const Blocks& b) {
  const u64 elems = b.brow / sizeof(T);
  return b.outer * ((elems + Unit<T>::VEC - 1) / Unit<T>::VEC);
}

// Reduces block `k` of every `srcs.p[0..world)` (fixed order) into dense `out`.
template <typename T, typename R>
PL_DEVICE void reduce_block(const Ptrs& srcs, u32 world, u32 k, T* out, const Blocks& b) {
  typedef typename Tr<T>::Acc A;
  constexpr u32 VEC = Unit<T>::VEC;
  const u64 elems = b.brow / sizeof(T);
  const u64 upr = (elems + VEC - 1) / VEC;
  const u64 units = b.outer * upr;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  bool vec = ((reinterpret_cast<u64>(out) | b.brow | b.full) & 15) == 0;
  for (u32 p = 0; p < world; ++p) vec = vec && (srcs.p[p] & 15) == 0;
  if (vec) {  // brow is a multiple of 16: every unit is whole
    for (; u + (PL_UNROLL - 1) * nt < units; u += PL_UNROLL * nt) {
      u64 off[PL_UNROLL];
      T* dst[PL_UNROLL];
#pragma unroll
      for (u32 j = 0; j < PL_UNROLL; ++j) {
        const u64 uj = u + j * nt, row = uj / upr, c = (uj - row * upr) * VEC;
        off[j] = row * b.full + k * b.brow + c * sizeof(T);
        dst[j] = out + row * elems + c;
      }
      vec16 y[PL_UNROLL];
      reduce_vecs<T, R, PL_UNROLL>(y, srcs, world, off);
#pragma unroll
      for (u32 j = 0; j < PL_UNROLL; ++j) store16(dst[j], y[j]);
    }
  }
  for (; u < units; u += nt) {
    const u64 row = u / upr, c = (u - row * upr) * VEC;
    const u64 off = row * b.full + k * b.brow + c * sizeof(T);
    const u64 len = pl_min(VEC, elems - c);
    T* dst = out + row * elems + c;
    A acc[VEC];
    for (u32 i = 0; i < len; ++i) acc[i] = Tr<T>::up(reinterpret_cast<const T*>(srcs.p[0] + off)[i]);
#pragma unroll 1
    for (u32 p = 1; p < world; ++p) {
      const T* s = reinterpret_cast<const T*>(srcs.p[p] + off);
      for (u32 i = 0; i < len; ++i) acc[i] = fold_step<T, R>(acc[i], s[i]);
    }
    for (u32 i = 0; i < len; ++i) dst[i] = Tr<T>::down(acc[i]);
  }
}

// Direct reduce-scatter: stage my whole operand (block by block, same unit mapping as the
// reduce), barrier, reduce block `rank` from every member's staging. Double-buffered by
// launch parity like the one-shot all-reduce, so no end barrier.
template <typename T, typename R>
PL_DEVICE void reduce_scatter(const u8* in, T* out, u32 rank, u32 world, const Ptrs& stage, u64 stride,
                              const Ptrs& flags, u32* counter, const Blocks& b, const Status& st) {
  const u32 e = next_epoch(counter);
  const u64 par = (e & 1) * stride;
  constexpr u32 VEC = Unit<T>::VEC;
  const u64 elems = b.brow / sizeof(T);
  const u64 upr = (elems + VEC - 1) / VEC;
  const u64 units = b.outer * upr;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  u8* mine = reinterpret_cast<u8*>(stage.p[rank] + par);
  const bool vec = ((reinterpret_cast<u64>(in) | reinterpret_cast<u64>(mine) | b.brow | b.full) & 15) == 0;
  for (u32 k = 0; k < world; ++k) {
    u64 u = tid;
    if (vec) {  // brow is a multiple of 16: every unit is whole
      for (; u + (PL_UNROLL - 1) * nt < units; u += PL_UNROLL * nt) {
        vec16 v[PL_UNROLL];
        u64 off[PL_UNROLL];
#pragma unroll
        for (u32 j = 0; j < PL_UNROLL; ++j) {
          const u64 uj = u + j * nt, row = uj / upr, c = (uj - row * upr) * VEC;
          off[j] = row * b.full + k * b.brow + c * sizeof(T);
          v[j] = load16(in + off[j]);
        }
#pragma unroll
        for (u32 j = 0; j < PL_UNROLL; ++j) store16(mine + off[j], v[j]);
      }
    }
    for (; u < units; u += nt) {
      const u64 row = u / upr, c = (u - row * upr) * VEC;
      const u64 off = row * b.full + k * b.brow + c * sizeof(T);
      const u64 len = pl_min(VEC, elems - c) * sizeof(T);
      if (vec && len == 16) {
        store16(mine + off, load16(in + off));
      } else {
        for (u64 i = 0; i < len; ++i) mine[off + i] = in[off + i];
      }
    }
  }
  block_barrier(flags, 0, rank, world, 2 * e, st);
  Ptrs srcs;
  for (u32 p = 0; p < PL_MAX_RANKS; ++p) srcs.p[p] = stage.p[p] + par;
  if (!failed(st)) reduce_block<T, R>(srcs, world, rank, out, b);
}

// ---- one-shot all-reduce fused with the residual add and RMSNorm after it ----
// (issue 35 item 3: the call's `epilogue`, thunks::custom_call::Epilogue; the host reference
// is kernels/src/epilogue.rs, which this follows operation for operation in f32.) Rows of `d`
// elements along the last dimension; block b owns rows b, b + gridDim, ... on every rank: it
// stages those rows of its operand, meets the peers' block b (per-block barrier, as one_shot),
// then for each of its rows sums the element over every rank's staging in the fixed rank order
// (exactly as one_shot: rounded once to T, f16 per step), and writes
//   a  = the sum as T, rounded to `round_ar` when set;  hc = a + f32(x);  h = hc as h's type
//   hf = f32(h) if `of_rounded` else hc;  ms = sum(hf * hf) * mean (or / mean)
//   r  = 1 / sqrt(ms + eps);  y = hf * r [* f32(gamma)] as y's type.
// Every rank computes every row in the same order, so h and y are bitwise the same on every
// rank. The row's sum of squares is a tree over the block (the reference sums left to right:
// within an ulp of y). A thread reads a row in 16-byte units of the all-reduce's type (every
// rank's load issued at once) and keeps its first PL_NORM_UNITS units' hf in registers; units
// beyond are computed again from the staging for y (same operations, same bits), so any d runs.
// Element types of the residual, gamma, h and y are chosen at run time (f32, bf16, f16).
#define PL_F32 0u
#define PL_BF16 1u
#define PL_F16 2u
// Units (16 bytes of the all-reduce's type) of a row each thread keeps in registers.
#define PL_NORM_UNITS 4
#define PL_NORM_THREADS 512
struct Norm {
  u64 residual;  // x: rows x d
  u64 gamma;     // 0: none, else d values
  u64 h;         // rows x d
  u64 y;         // rows x d
  u64 rows;
  u64 d;
  u32 x_ty, g_ty, h_ty, y_ty;  // PL_F32 / PL_BF16 / PL_F16
  u32 round_ar;                // 0: none, else PL_BF16 / PL_F16
  u32 of_rounded;              // the norm reads f32(h) (1) or the unrounded hc (0)
  u32 mean_div;                // ms = sum / mean (1) or sum * mean (0)
  u32 mean;                    // f32 bits
  u32 eps;                     // f32 bits
  u32 pad;
};

PL_DEVICE void store_from_f32(u64 base, u32 ty, u64 i, float v) {
  if (ty == PL_F32) {
    reinterpret_cast<float*>(base)[i] = v;
  } else if (ty == PL_BF16) {
    reinterpret_cast<bf16*>(base)[i] = from_f32_bf16(v);
  } else {
    reinterpret_cast<f16*>(base)[i] = from_f32_f16(v);
  }
}

// Elements i .. i + len of `base` (of type `ty`) as f32, every load issued before any use (the
// fused kernel's residual and gamma: loaded one by one between stores to h and y, which may
// alias them for all the compiler knows, each paid a memory latency).
template <u32 N>
PL_DEVICE void load_f32s(u64 base, u32 ty, u64 i, u32 len, float (&out)[N]) {
  if (ty == PL_F32) {
    const float* p = reinterpret_cast<const float*>(base) + i;
#pragma unroll
    for (u32 k = 0; k < N; ++k)
      if (k < len) out[k] = p[k];
  } else if (ty == PL_BF16) {
    const bf16* p = reinterpret_cast<const bf16*>(base) + i;
#pragma unroll
    for (u32 k = 0; k < N; ++k)
      if (k < len) out[k] = to_f32(p[k]);
  } else {
    const f16* p = reinterpret_cast<const f16*>(base) + i;
#pragma unroll
    for (u32 k = 0; k < N; ++k)
      if (k < len) out[k] = to_f32(p[k]);
  }
}

// `v` rounded to `ty` (round to nearest even) and back; f32 (or 0): unchanged.
PL_DEVICE float round_as(float v, u32 ty) {
  if (ty == PL_BF16) return to_f32(from_f32_bf16(v));
  if (ty == PL_F16) return to_f32(from_f32_f16(v));
  return v;
}

// Element `i` of the all-reduce from its sum over the ranks `acc`, through the residual add
// (`x`: f32 of the residual's element): writes h[i] when `write_h`, returns hf.
template <typename T>
PL_DEVICE float norm_finish(typename Tr<T>::Acc acc, float x, u64 i, const Norm& nm, bool write_h) {
  float a = (float)Tr<T>::up(Tr<T>::down(acc));  // the all-reduce's result, in T
  if (nm.round_ar) a = round_as(a, nm.round_ar);
  const float hc = pl_add_rn(a, x);
  if (write_h) store_from_f32(nm.h, nm.h_ty, i, hc);
  return nm.of_rounded ? round_as(hc, nm.h_ty) : hc;
}

// Unit `u` of the row at element `base` (its elements u VEC .. min(d, u VEC + VEC)): each
// element summed over every rank's staging in the fixed order 0..world-1 (as reduce_wide),
// through the residual add, into hf[0..len); returns len. `vec` (whole 16-byte units): one
// 16-byte load per rank, all issued before any is used, so the NVLink latency is paid once
// per unit, not once per element and rank.
template <typename T>
PL_DEVICE u32 norm_unit(const Ptrs& stage, u64 par, u32 world, u64 base, u64 u, u64 d, const Norm& nm, bool write_h,
                        bool vec, float (&hf)[Unit<T>::VEC]) {
  typedef typename Tr<T>::Acc A;
  constexpr u32 VEC = Unit<T>::VEC;
  union V { vec16 v; T e[VEC]; };
  const u64 j0 = u * VEC;
  const u32 len = (u32)pl_min((u64)VEC, d - j0);
  float xr[VEC];
  load_f32s(nm.residual, nm.x_ty, base + j0, len, xr);
  V x[PL_MAX_RANKS];
#pragma unroll
  for (u32 p = 0; p < PL_MAX_RANKS; ++p) {
    if (p >= world) continue;
    const T* src = reinterpret_cast<const T*>(stage.p[p] + par) + base + j0;
    if (vec) {
      x[p].v = load16(src);
    } else {
#pragma unroll
      for (u32 k = 0; k < VEC; ++k)
        if (k < len) x[p].e[k] = src[k];
    }
  }
#pragma unroll
  for (u32 k = 0; k < VEC; ++k) {
    if (k >= len) continue;
    A acc = Tr<T>::up(x[0].e[k]);
#pragma unroll
    for (u32 p = 1; p < PL_MAX_RANKS; ++p)
      if (p < world) acc = fold_step<T, Sum>(acc, x[p].e[k]);
    hf[k] = norm_finish<T>(acc, xr[k], base + j0 + k, nm, write_h);
  }
  return len;
}

// The sum of every thread's `v` (blockDim.x a power of two, at most PL_NORM_THREADS): a tree
// in shared memory, the same order on every rank. Every thread of the block must call it.
PL_DEVICE float block_sum(float v, float* part) {
  part[threadIdx.x] = v;
  __syncthreads();
  for (u32 s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] = pl_add_rn(part[threadIdx.x], part[threadIdx.x + s]);
    __syncthreads();
  }
  const float total = part[0];
  __syncthreads();  // `part` is reused for the next row
  return total;
}

// y for the `len` elements of a row from element `i` (row position `j`) from their hf and the
// row's r (gamma's elements loaded before any store).
template <u32 N>
PL_DEVICE void norm_y(const Norm& nm, u64 i, u64 j, u32 len, const float (&hf)[N], float r) {
  float g[N];
  if (nm.gamma) load_f32s(nm.gamma, nm.g_ty, j, len, g);
#pragma unroll
  for (u32 k = 0; k < N; ++k) {
    if (k >= len) continue;
    float out = pl_mul_rn(hf[k], r);
    if (nm.gamma) out = pl_mul_rn(out, g[k]);
    store_from_f32(nm.y, nm.y_ty, i + k, out);
  }
}

// The per-row work of the fused kernels once every member's rows are readable at
// `stage.p[p] + par` (row r at element r * d): sum, residual add, RMSNorm, h and y.
template <typename T>
PL_DEVICE void norm_rows(const Norm& nm, const Ptrs& stage, u64 par, u32 world, bool vec_rows, float* part) {
  constexpr u32 VEC = Unit<T>::VEC;
  const u64 d = nm.d;
  const float mean = __uint_as_float(nm.mean), eps = __uint_as_float(nm.eps);
  const u64 units = (d + VEC - 1) / VEC;
  for (u64 row = blockIdx.x; row < nm.rows; row += gridDim.x) {
    const u64 base = row * d;
    // Thread t: units t, t + blockDim, ..., each unit's elements in order (the order
    // kernels::epilogue::block_sum_of_squares reproduces). Its first PL_NORM_UNITS units stay
    // in registers for y; units beyond are summed again from the staging (same bits).
    float kept[PL_NORM_UNITS][VEC];
    float sq = 0.f;
#pragma unroll
    for (u32 q = 0; q < PL_NORM_UNITS; ++q) {
      const u64 u = threadIdx.x + (u64)q * blockDim.x;
      if (u < units) {
        const u32 len = norm_unit<T>(stage, par, world, base, u, d, nm, true, vec_rows, kept[q]);
#pragma unroll
        for (u32 k = 0; k < VEC; ++k)
          if (k < len) sq = pl_add_rn(sq, pl_mul_rn(kept[q][k], kept[q][k]));
      }
    }
    for (u64 u = threadIdx.x + (u64)PL_NORM_UNITS * blockDim.x; u < units; u += blockDim.x) {
      float hf[VEC];
      const u32 len = norm_unit<T>(stage, par, world, base, u, d, nm, true, vec_rows, hf);
#pragma unroll
      for (u32 k = 0; k < VEC; ++k)
        if (k < len) sq = pl_add_rn(sq, pl_mul_rn(hf[k], hf[k]));
    }
    const float sum = block_sum(sq, part);
    const float ms = nm.mean_div ? pl_div_rn(sum, mean) : pl_mul_rn(sum, mean);
    const float r = pl_div_rn(1.0f, pl_sqrt_rn(pl_add_rn(ms, eps)));
#pragma unroll
    for (u32 q = 0; q < PL_NORM_UNITS; ++q) {
      const u64 u = threadIdx.x + (u64)q * blockDim.x;
      if (u < units) norm_y(nm, base + u * VEC, u * VEC, (u32)pl_min((u64)VEC, d - u * VEC), kept[q], r);
    }
    for (u64 u = threadIdx.x + (u64)PL_NORM_UNITS * blockDim.x; u < units; u += blockDim.x) {
      float hf[VEC];
      const u32 len = norm_unit<T>(stage, par, world, base, u, d, nm, false, vec_rows, hf);
      norm_y(nm, base + u * VEC, u * VEC, len, hf, r);
    }
  }
}

template <typename T>
PL_DEVICE void one_shot_norm(const T* in, const Norm& nm, u32 rank, u32 world, const Ptrs& stage, u64 stride,
                             const Ptrs& flags, u32* counter, const Status& st) {
  __shared__ float part[PL_NORM_THREADS];
  const u32 e = next_epoch(counter);
  const u64 par = (e & 1) * stride;
  const u64 d = nm.d;
  constexpr u32 VEC = Unit<T>::VEC;
  // Stage this block's rows of my operand (staging halves are 256-byte aligned).
  T* mine = reinterpret_cast<T*>(stage.p[rank] + par);
  // Rows of whole 16-byte units (every row then starts 16-byte aligned in the staging).
  const bool vec_rows = (d * sizeof(T)) % 16 == 0;
  const bool vec = aligned16(in) && vec_rows;
  for (u64 row = blockIdx.x; row < nm.rows; row += gridDim.x) {
    const T* src = in + row * d;
    T* dst = mine + row * d;
    if (vec) {
      for (u64 u = threadIdx.x; u < d / VEC; u += blockDim.x) store16(dst + u * VEC, load16(src + u * VEC));
    } else {
      for (u64 j = threadIdx.x; j < d; j += blockDim.x) dst[j] = src[j];
    }
  }
  block_barrier(flags, 0, rank, world, 2 * e, st);
  norm_rows<T>(nm, stage, par, world, vec_rows, part);
}

// The fused all-reduce + RMSNorm through the Lamport regions (as `lamport`; rows of the
// operand as one flat array of 16-byte units, this rank's own copy pushed too, so the norm
// reads every member's rows from one place): push, wait for every unit of this block's rows
// from every member, then the same per-row work as one_shot_norm.
template <typename T>
PL_DEVICE void lamport_norm(const T* in, const Norm& nm, u32 rank, u32 world, const Ptrs& lam, u64 slot, u32* counter,
                            const Status& st) {
  __shared__ float part[PL_NORM_THREADS];
  constexpr u32 VEC = Unit<T>::VEC;
  constexpr u32 S = sizeof(T);
  const u32 e = next_epoch(counter);
  const u32 i = e % 3;
  const u64 d = nm.d;
  const u64 n = nm.rows * d;
  const u64 units = (n + VEC - 1) / VEC;
  const u64 nt = (u64)gridDim.x * blockDim.x;
  const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 region = PL_LAMPORT_HDR + (u64)i * world * slot;
  const bool in_ok = aligned16(in);
  for (u64 u = tid; u < units; u += nt) {
    const vec16 v = unsentinel<S>(load_unit(in, u, n, in_ok));
    for (u32 k = 0; k < world; ++k) store16(reinterpret_cast<u8*>(lam.p[(rank + k) % world] + region + rank * slot) + u * 16, v);
  }
  const u8* mine = reinterpret_cast<const u8*>(lam.p[rank] + region);
  for (u64 row = blockIdx.x; row < nm.rows; row += gridDim.x) {
    const u64 hi = ((row + 1) * d + VEC - 1) / VEC;
    for (u64 u = row * d / VEC + threadIdx.x; u < hi; u += blockDim.x)
      for (u32 p = 0; p < world; ++p) {
        vec16 v = load16_volatile(mine + p * slot + u * 16);
        wait_unit<S>(v, mine + p * slot + u * 16, st, p);
      }
  }
  __syncthreads();
  Ptrs src;
  for (u32 p = 0; p < PL_MAX_RANKS; ++p) src.p[p] = lam.p[rank] + region + p * slot;
  norm_rows<T>(nm, src, 0, world, (d * sizeof(T)) % 16 == 0, part);
  lamport_reset(lam.p[rank], world, slot, i, units);
}

// The copy-engine reduce-scatter's and all-reduce's one kernel: reduces the `world` arrays of
// `n` elements at src.p[0..world) (the members' blocks the copy engines gathered into this
// member's staging) in the fixed rank order 0..world-1 of every other reduction, so it gives the
// same bits, into `out`. Local reads only and no flags: the copy engines and stream memory
// operations did the rest, so a small grid does.
template <typename T, typename R>
PL_DEVICE void reduce_local(const Ptrs& src, u32 world, T* out, u64 n) {
  constexpr u32 VEC = Unit<T>::VEC;
  const u64 units = (n + VEC - 1) / VEC;
  const bool vec_ok = aligned16(out);
  const u64 nt = static_cast<u64>(gridDim.x) * blockDim.x;
  for (u64 u = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += nt)
    reduce_unit<T, R>(out, src, 0, world, u, n, vec_ok);
}

// One macro per kernel of a reduction specialization (the host compiles them one at a time),
// and PL_AR for all five.
#define PL_ONE_SHOT(NAME, T, R)                                                                              \
  PL_GLOBAL void __launch_bounds__(512) pl_one_shot_##NAME(const T* in, T* out, u64 n, u32 rank, u32 world, \
                                                          Ptrs stage, u64 stride, Ptrs flags, u32* counter,    \
                                                          Status st) {                                         \
    one_shot<T, R>(in, out, n, rank, world, stage, stride, flags, counter, st);                              \
  }
#define PL_ONE_SHOT_MANY(NAME, T, R)                                                                         \
  PL_GLOBAL void __launch_bounds__(512) pl_one_shot_many_##NAME(Many m, u32 rank, u32 world, Ptrs stage,      \
                                                               u64 stride, Ptrs flags, u32* counter,        \
                                                               Status st) {                                 \
    one_shot_many<T, R>(m, rank, world, stage, stride, flags, counter, st);                                  \
  }
#define PL_TWO_SHOT(NAME, T, R)                                                                              \
  PL_GLOBAL void __launch_bounds__(512) pl_two_shot_##NAME(const T* in, T* out, u64 n, u32 rank, u32 world, \
                                                          Ptrs stage, u64 stride, Ptrs flags, u32* counter,    \
                                                          Status st) {                                         \
    two_shot<T, R>(in, out, n, rank, world, stage, stride, flags, counter, st);                              \
  }
#define PL_REDUCE_SCATTER(NAME, T, R)                                                                        \
  PL_GLOBAL void __launch_bounds__(512) pl_reduce_scatter_##NAME(const u8* in, T* out, u32 rank, u32 world,  \
                                                                Ptrs stage, u64 stride, Ptrs flags,           \
                                                                u32* counter, Blocks b, Status st) {          \
    reduce_scatter<T, R>(in, out, rank, world, stage, stride, flags, counter, b, st);                        \
  }
#define PL_REDUCE_LOCAL(NAME, T, R)                                                                          \
  PL_GLOBAL void __launch_bounds__(512) pl_reduce_local_##NAME(Ptrs src, u32 world, T* out, u64 n) {          \
    reduce_local<T, R>(src, world, out, n);                                                                    \
  }
// The fused one-shot all-reduce + RMSNorm: float types, sum only (R is Sum).
#define PL_ONE_SHOT_NORM(NAME, T, R)                                                                         \
  PL_GLOBAL void __launch_bounds__(512) pl_one_shot_norm_##NAME(const T* in, Norm nm, u32 rank, u32 world,  \
                                                               Ptrs stage, u64 stride, Ptrs flags,          \
                                                               u32* counter, Status st) {                   \
    one_shot_norm<T>(in, nm, rank, world, stage, stride, flags, counter, st);                                \
  }
// The Lamport one-shot: float types (their all-ones sentinel is a NaN).
#define PL_LAMPORT(NAME, T, R)                                                                               \
  PL_GLOBAL void __launch_bounds__(512) pl_lamport_##NAME(const T* in, T* out, u64 n, u32 rank, u32 world,  \
                                                         Ptrs lam, u64 slot, Ptrs flags, u32* counter,       \
                                                         Status st) {                                        \
    lamport<T, R>(in, out, n, rank, world, lam, slot, counter, st);                                           \
  }
// The fused all-reduce + RMSNorm through the Lamport regions: float types, sum only.
#define PL_LAMPORT_NORM(NAME, T, R)                                                                         \
  PL_GLOBAL void __launch_bounds__(512) pl_lamport_norm_##NAME(const T* in, Norm nm, u32 rank, u32 world,   \
                                                              Ptrs lam, u64 slot, Ptrs flags, u32* counter,  \
                                                              Status st) {                                    \
    lamport_norm<T>(in, nm, rank, world, lam, slot, counter, st);                                              \
  }
#define PL_AR(NAME, T, R)                                                                                   \
  PL_ONE_SHOT(NAME, T, R) PL_ONE_SHOT_MANY(NAME, T, R) PL_TWO_SHOT(NAME, T, R) PL_REDUCE_SCATTER(NAME, T, R) \
  PL_REDUCE_LOCAL(NAME, T, R)

#define PL_AR_ARITH(NAME, T) PL_AR(NAME##_sum, T, Sum) PL_AR(NAME##_prod, T, Prod) PL_AR(NAME##_min, T, Min) PL_AR(NAME##_max, T, Max)
#define PL_AR_FLOAT(NAME, T) PL_AR_ARITH(NAME, T) \
  PL_LAMPORT(NAME##_sum, T, Sum) PL_LAMPORT(NAME##_prod, T, Prod) PL_LAMPORT(NAME##_min, T, Min) PL_LAMPORT(NAME##_max, T, Max)
#define PL_AR_INT(NAME, T) PL_AR_ARITH(NAME, T) PL_AR(NAME##_and, T, And) PL_AR(NAME##_or, T, Or)

#if defined(PL_UNIT_SPEC)
PL_UNIT_SPEC
#elif !defined(PL_UNIT_BASE)
PL_AR_FLOAT(f32, float)
PL_AR_FLOAT(f64, double)
PL_AR_FLOAT(bf16, bf16)
PL_AR_FLOAT(f16, f16)
PL_AR_INT(s8, s8)
PL_AR_INT(s16, s16)
PL_AR_INT(s32, s32)
PL_AR_INT(u8, u8)
PL_AR_INT(u16, u16)
PL_AR_INT(u32, u32)
PL_AR_INT(s64, s64)
PL_AR_INT(u64, u64)
PL_AR(pred_and, u8, And)
PL_AR(pred_or, u8, Or)
PL_AR(pred_max, u8, Or)
PL_AR(pred_min, u8, And)
PL_AR(pred_sum, u8, Xor)
PL_AR(pred_prod, u8, And)
PL_ONE_SHOT_NORM(f32_sum, float, Sum)
PL_ONE_SHOT_NORM(bf16_sum, bf16, Sum)
PL_ONE_SHOT_NORM(f16_sum, f16, Sum)
PL_LAMPORT_NORM(f32_sum, float, Sum)
PL_LAMPORT_NORM(bf16_sum, bf16, Sum)
PL_LAMPORT_NORM(f16_sum, f16, Sum)
#endif

#if !defined(PL_UNIT_SPEC)
// Peer-access probe: one thread stores `v` into a peer's memory and reads it back.
PL_GLOBAL void pl_probe(u32* remote, u32 v, u32* readback) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    store_release_sys(remote, v);
    *readback = load_acquire_sys(remote);
  }
}
#endif
