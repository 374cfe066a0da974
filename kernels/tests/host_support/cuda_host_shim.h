// Host emulation of the CUDA builtins that generated kernels use (kernels/src/codegen.rs),
// for tests only: the host C++ compiler builds a generated unit with -DPL_HOST_EMULATION and
// this file force-included, and one "thread" (grid 1 x 1) walks every element in the
// kernel's grid-stride loop. Lets CI check the generated code's semantics against the
// reference interpreter without a GPU (kernels/src/codegen_tests.rs).
#pragma once
#include <math.h>
#include <string.h>

struct pl_dim3 { unsigned x, y, z; };
static const pl_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static const pl_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
#define __launch_bounds__(n)

static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline long long __double_as_longlong(double d) { long long v; memcpy(&v, &d, 8); return v; }
static inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, 8); return d; }
// Built with -ffp-contract=off, so these are single IEEE operations, as the _rn intrinsics.
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
