// Portability header for Peerless's device kernels: CUDA (NVRTC) today, HIP later.
// No system headers: NVRTC compiles these sources without a CUDA toolkit install.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int s32;
typedef unsigned long long u64;
typedef long long s64;

#if defined(__HIPCC__)
#define PL_DEVICE __device__ __forceinline__
#define PL_GLOBAL extern "C" __global__
#else
#define PL_DEVICE __device__ __forceinline__
#define PL_GLOBAL extern "C" __global__
#endif

// 16-bit float storage types (bit patterns); arithmetic happens in fp32.
struct bf16 { u16 x; };
struct f16 { u16 x; };

PL_DEVICE float to_f32(bf16 v) { return __uint_as_float(((u32)v.x) << 16); }
PL_DEVICE bf16 from_f32_bf16(float f) {
  u32 u = __float_as_uint(f);
  bf16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) { r.x = (u16)((u >> 16) | 0x40u); return r; }  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  r.x = (u16)(u >> 16);
  return r;
}
#if defined(__HIPCC__)
PL_DEVICE float to_f32(f16 v) { return __half2float(__ushort_as_half(v.x)); }
PL_DEVICE f16 from_f32_f16(float f) { f16 r; r.x = __half_as_ushort(__float2half_rn(f)); return r; }
#else
PL_DEVICE float to_f32(f16 v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x)); return f; }
PL_DEVICE f16 from_f32_f16(float f) { f16 r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(f)); return r; }
#endif

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

// Wrapping-aware "v is at least e" for 32-bit counters.
PL_DEVICE bool reached(u32 v, u32 e) { return (s32)(v - e) >= 0; }

// Spins until the counter at `p` is at least `e`.
PL_DEVICE void wait_at_least(const u32* p, u32 e) {
  while (!reached(load_acquire_sys(p), e)) {
  }
}

// 16-byte vector loads/stores.
struct alignas(16) vec16 { u32 w[4]; };
PL_DEVICE vec16 load16(const void* p) { return *reinterpret_cast<const vec16*>(p); }
PL_DEVICE void store16(void* p, vec16 v) { *reinterpret_cast<vec16*>(p) = v; }

PL_DEVICE u64 pl_min(u64 a, u64 b) { return a < b ? a : b; }
