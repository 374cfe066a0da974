#!/usr/bin/env bash
# The NVLink run: every measurement that needs 2-8 GPUs, in one command for the device tool,
# with the wheel pip-installed as users install it (no PYTHONPATH, no PEERLESS_PJRT_LIBRARY).
#   scripts/gpu_nvlink.sh OUTDIR [BINDIR]
# BINDIR (default .gpu) holds the wheel in BINDIR/wheel (scripts/gpu_build.sh, then
# scripts/build_wheel.sh --kernels target/prebuilt-kernels.pb .gpu/wheel) and the kernel test
# binaries. About 25 minutes of device time on 4 GPUs; NVLINK_STEPS picks steps:
#   kernels   `peerless bench` per group size (2 and all GPUs): every kind, 1 KiB-1 GiB, bf16
#             (and f32 at all GPUs), Peerless's algorithms (copy engines included) beside
#             XLA's NCCL in one run
#   gputime   GPU time per call of the psum chain (stock's NCCL vs Peerless's one-shot), profiled
#   programs  the steps users write (psum chain, decode, DP/FSDP/TP+DP training), stock vs
#             Peerless's default vs calls beside compute vs the copy engines, interleaved rounds
#   prefill   TP prefill with XLA's collective matmul (windowed einsum), whose permutes Peerless
#             runs, against the same without it
#   processes one process per GPU (PEERLESS_ENABLE=1) against XLA alone
#   checks    the kernels' tests across the GPUs (today's kernels, the copy engines)
# Step caps add up to more than 25 minutes; the run has not been timed on 2+ GPUs yet. The
# collective sweep, JAX's suites (their test files in JAX_TESTS_DIR) and the rest of the GPU
# check: GPU_CHECK_STEPS="sweep suites ..." scripts/gpu_check.sh.
set -uo pipefail
LOG=${1:?usage: gpu_nvlink.sh OUTDIR [BINDIR]}
BIN=${2:-.gpu}
STEPS=${NVLINK_STEPS:-kernels gputime programs prefill processes checks}
mkdir -p "$LOG"
# NVLink multicast stays off (shared hosts): never remove these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PEERLESS_CACHE_DIR=/tmp/peerless-kernel-cache
unset PEERLESS_PJRT_LIBRARY PYTHONPATH
STEP_TAIL=8
. "$(dirname "$0")/steps.sh"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$NGPU" -lt 2 ]; then
  echo "gpu_nvlink: $NGPU GPU(s); the NVLink run needs 2 or more" | tee -a "$LOG/summary.txt"
  exit 1
fi
python3 -m pip install -q --no-deps --force-reinstall "$BIN"/wheel/*.whl >"$LOG/pip.txt" 2>&1 || {
  cat "$LOG/pip.txt"
  exit 1
}
{ date -u; nvidia-smi; nvidia-smi topo -m; python3 -m pip list 2>/dev/null | grep -i -E "jax|peerless"; } >"$LOG/machine.txt" 2>&1
# XLA's CUDA plugin, for `peerless bench`'s XLA rows.
XLA_CUDA=$(xla_cuda_plugin)
export PEERLESS_XLA_PLUGIN=${PEERLESS_XLA_PLUGIN:-$XLA_CUDA}
counts="$NGPU"
[ "$NGPU" -gt 2 ] && counts="2 $NGPU"
if has kernels; then
  for n in $counts; do
    dtypes=bf16
    [ "$n" -eq "$NGPU" ] && dtypes=bf16,f32
    step "kernels_${n}gpu" 560 peerless bench --devices "$n" --dtypes "$dtypes" --min-bytes 1024 \
      --max-bytes 1073741824 --step 4 --samples 10 --sample-ms 5 \
      --impls peerless,auto,one-shot,two-shot,copy-engines,xla --csv "$LOG/kernels_${n}gpu.csv"
  done
fi
has gputime && step gputime 400 python3 plugin/tests/bench_programs.py --profile --programs psum_chain \
  --modes stock,peerless --rounds 1 --out "$LOG/gputime"
if has programs; then
  step programs 590 python3 plugin/tests/bench_programs.py --out "$LOG/programs" --rounds 2 \
    --programs psum_chain,decode_d4096_b8,decode_d8192_b16,dp_train_400m,fsdp_train_400m,tpdp_train_400m \
    --modes stock,peerless,peerless-overlap,peerless-ce,peerless-ce-sync
fi
has prefill && step prefill 400 python3 plugin/tests/bench_programs.py --out "$LOG/prefill" --rounds 2 \
  --programs prefill_d4096 --modes stock,peerless,stock:wein,peerless:wein
has processes && step processes 590 python3 plugin/tests/gpu_user_forms.py --platform cuda --parts multiprocess \
  --out "$LOG/processes"
if has checks; then
  step cuda_collectives 300 "$BIN/cuda_collectives" --ignored --test-threads=1
  step cuda_copy_engines 300 "$BIN/cuda_copy_engines" --ignored --test-threads=1
fi
echo "gpu_nvlink rc=$rc" | tee -a "$LOG/summary.txt"
exit $rc
