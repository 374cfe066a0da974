// Not a runtime unit: a compile check of codegen.h for the toolchains CI has without a GPU
// (hipcc through scripts/hip_check.sh, which compiles every *.cu here). The units Peerless
// generates at run time include codegen.h the same way; NVRTC compiles every hlo-tests
// case's unit in kernels/tests/cuda_nvrtc.rs.
#include "codegen.h"

PL_GLOBAL void pl_codegen_check(u8* A, u32 dev) {
  float* f = (float*)A;
  s32* i = (s32*)(A + 64);
  bf16* h = (bf16*)(A + 128);
  for (u64 k = pl_first(); k < 4; k += pl_stride()) {
    f[k] = op_logistic(op_max(f[k], op_rem(f[k], 2.0f)));
    i[k] = op_pow(op_shra(i[k], (s32)dev), op_div(i[k], 3)) + pl_f2i_s32((double)f[k]);
    h[k] = from_f32_bf16(pl_rnd_bf16(pl_f64_to_f32_odd((double)op_total_key(f[k]))));
  }
}
