// Element types and 16-bit float conversions shared by every kernel source, the generated
// units included (kernels/src/codegen.rs). Part of the portability layer: the CUDA / HIP /
// host-emulation differences here are the only ones the generated code sees; the rest
// (scopes, atomics, clocks) is in peerless_device.h.
#pragma once

#if defined(__HIPCC__) && !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#endif

typedef signed char s8;
typedef unsigned char u8;
typedef short s16;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int s32;
typedef unsigned long long u64;
typedef long long s64;

#if defined(PL_HOST_EMULATION)
// Host emulation (tests only): generated kernels compiled by the host C++ compiler with
// kernels/tests/host_support/cuda_host_shim.h, which defines the CUDA builtins they use.
#define PL_DEVICE static inline
#define PL_GLOBAL extern "C"
#define PL_WAVE 32
#elif defined(__HIPCC__)
#define PL_DEVICE __device__ __forceinline__
#define PL_GLOBAL extern "C" __global__
// Lanes that execute in lockstep: 64 on CDNA (gfx9xx); 32 on RDNA in wave32 mode.
#define PL_WAVE __AMDGCN_WAVEFRONT_SIZE
#else
#define PL_DEVICE __device__ __forceinline__
#define PL_GLOBAL extern "C" __global__
#define PL_WAVE 32
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
#if defined(__HIPCC__) || defined(PL_HOST_EMULATION)
// Clang's (and GCC's, on x86-64) native _Float16 (IEEE binary16 on AMDGPU, round to nearest even): no hip_fp16.h,
// which the HIP runtime header does not include and hipRTC and hipcc ship differently.
PL_DEVICE float to_f32(f16 v) { return (float)__builtin_bit_cast(_Float16, v.x); }
PL_DEVICE f16 from_f32_f16(float f) { f16 r; r.x = __builtin_bit_cast(u16, (_Float16)f); return r; }
#else
PL_DEVICE float to_f32(f16 v) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x)); return f; }
PL_DEVICE f16 from_f32_f16(float f) { f16 r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(f)); return r; }
#endif
