// Portability header for Peerless's device kernels: one source tree for CUDA (NVRTC) and
// HIP (hipRTC at run time, hipcc in CI). Every CUDA/HIP difference lives in this file and in
// peerless_types.h (element types, 16-bit floats, PL_DEVICE / PL_GLOBAL); the
// kernels use only the names defined here plus the common CUDA/HIP builtins (threadIdx,
// blockIdx, gridDim, blockDim, __syncthreads, __shared__, atomicCAS/atomicOr, which are
// device (CUDA) / agent (HIP) scope in both).
//
// Memory scopes: cross-device flags are system scope (CUDA .sys, HIP
// __HIP_MEMORY_SCOPE_SYSTEM); flags only this device's blocks touch may use device scope
// (CUDA .gpu, HIP __HIP_MEMORY_SCOPE_AGENT). Counters are compared unsigned and
// wrapping-aware (`reached`). Kernels must not assume a warp of 32: an AMD CDNA wavefront
// is 64 lanes (PL_WAVE).
//
// Headers: NVRTC compiles without a CUDA toolkit (no system headers here), and hipRTC has
// the HIP runtime built in (__HIPCC_RTC__); only a full hipcc compile includes
// <hip/hip_runtime.h>.
#pragma once

#if defined(__HIPCC__) && !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif

#include "peerless_types.h"

// Cross-device flags: system-scope release store, acquire load.
#if defined(__HIPCC__)
PL_DEVICE void store_release_sys(u32* p, u32 v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
}
PL_DEVICE u32 load_acquire_sys(const u32* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
}
#else
PL_DEVICE void store_release_sys(u32* p, u32 v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
PL_DEVICE u32 load_acquire_sys(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
#endif

// Same-device flags (only this device's blocks touch them): device / agent scope.
#if defined(__HIPCC__)
PL_DEVICE void store_release_dev(u32* p, u32 v) {
  __hip_atomic_store(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
PL_DEVICE u32 load_acquire_dev(const u32* p) {
  return __hip_atomic_load(p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
#else
PL_DEVICE void store_release_dev(u32* p, u32 v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
PL_DEVICE u32 load_acquire_dev(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
#endif

// Wrapping-aware "v is at least e" for 32-bit counters.
PL_DEVICE bool reached(u32 v, u32 e) { return (s32)(v - e) >= 0; }

// One pause inside a spin-wait loop. On AMD, s_sleep(1) (64 cycles) keeps polling
// wavefronts from flooding the fabric with remote acquire loads; CUDA spins as before.
#if defined(__HIPCC__)
PL_DEVICE void pl_spin_pause() { __builtin_amdgcn_s_sleep(1); }
#else
PL_DEVICE void pl_spin_pause() {}
#endif

// Spins until the counter at `p` is at least `e`.
PL_DEVICE void wait_at_least(const u32* p, u32 e) {
  while (!reached(load_acquire_sys(p), e)) {
    pl_spin_pause();
  }
}

// 16-byte vector loads/stores.
struct alignas(16) vec16 { u32 w[4]; };
PL_DEVICE vec16 load16(const void* p) { return *reinterpret_cast<const vec16*>(p); }
PL_DEVICE void store16(void* p, vec16 v) { *reinterpret_cast<vec16*>(p) = v; }
// A 16-byte load that is not served from a cache a peer's store would not update: polls of
// memory that peers write (the Lamport one-shot's receive regions).
#if defined(__HIPCC__)
PL_DEVICE vec16 load16_volatile(const void* p) {
  const volatile u32* q = reinterpret_cast<const volatile u32*>(p);
  vec16 v;
  v.w[0] = q[0]; v.w[1] = q[1]; v.w[2] = q[2]; v.w[3] = q[3];
  return v;
}
#else
PL_DEVICE vec16 load16_volatile(const void* p) {
  vec16 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p)
               : "memory");
  return v;
}
#endif

PL_DEVICE u64 pl_min(u64 a, u64 b) { return a < b ? a : b; }

// f32 arithmetic rounded exactly as written: one IEEE operation each, round to nearest even,
// never contracted into an FMA with a neighbour (the fused epilogue matches XLA's own order of
// f32 operations: kernels/src/epilogue.rs). CUDA: the _rn intrinsics; HIP (clang): plain
// operations with contraction off (HIP's f32 division and square root are correctly rounded
// by default).
#if defined(__HIPCC__)
PL_DEVICE float pl_add_rn(float a, float b) {
#pragma clang fp contract(off)
  return a + b;
}
PL_DEVICE float pl_mul_rn(float a, float b) {
#pragma clang fp contract(off)
  return a * b;
}
PL_DEVICE float pl_div_rn(float a, float b) { return a / b; }
PL_DEVICE float pl_sqrt_rn(float a) { return __builtin_sqrtf(a); }
#else
PL_DEVICE float pl_add_rn(float a, float b) { return __fadd_rn(a, b); }
PL_DEVICE float pl_mul_rn(float a, float b) { return __fmul_rn(a, b); }
PL_DEVICE float pl_div_rn(float a, float b) { return __fdiv_rn(a, b); }
PL_DEVICE float pl_sqrt_rn(float a) { return __fsqrt_rn(a); }
#endif

// Nanoseconds from a device-wide clock, for bounded spin waits (a peer that never arrives
// ends in a reported timeout, never a hung stream).
#if defined(__HIPCC__)
PL_DEVICE u64 pl_nanotime() { return __builtin_amdgcn_s_memrealtime() * 10ull; }  // 100 MHz counter
#else
PL_DEVICE u64 pl_nanotime() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif
