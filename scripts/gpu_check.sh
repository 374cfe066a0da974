#!/usr/bin/env bash
# The GPU check: runs prebuilt binaries (no Rust on the GPU machines) and writes logs to $1.
#   scripts/gpu_check.sh LOGDIR [BINDIR]
# BINDIR (default .gpu) holds binaries copied from a release build (scripts/gpu_build.sh):
#   peerless, libpeerless_pjrt.so, cuda_collectives, exec_conformance, exec_stress, exec_chain.
# GPU_CHECK_STEPS (default: every step below) picks steps;
# BENCH_ARGS passes options to `peerless bench`; STRESS_MODULES sizes the stress test.
set -uo pipefail
LOG=${1:?usage: gpu_check.sh LOGDIR [BINDIR]}
BIN=${2:-.gpu}
STEPS=${GPU_CHECK_STEPS:-devices collectives conformance conformance2 stress chain chain2 run bench bench2 sweep torch jax faults psum}
mkdir -p "$LOG"
# NVLink multicast stays off (shared hosts): never remove these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PEERLESS_HLO_TESTS_DIR="$PWD/hlo-tests" PEERLESS_CACHE_DIR=/tmp/peerless-kernel-cache
rc=0
has() { [[ " $STEPS " == *" $1 "* ]]; }
step() { # step NAME SECONDS CMD...: runs CMD with a time limit, logs to NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee -a "$LOG/summary.txt"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$LOG/$name.txt" 2>&1
  local r=$?
  echo "   rc=$r in $((SECONDS - t0)) s" | tee -a "$LOG/summary.txt"
  tail -4 "$LOG/$name.txt" | sed 's/^/   | /' | tee -a "$LOG/summary.txt"
  [ $r -eq 0 ] || rc=1
}
{ date -u; nvidia-smi; nvidia-smi topo -m; } >"$LOG/nvidia-smi.txt" 2>&1
has devices && step devices 120 "$BIN/peerless" devices
has collectives && step cuda_collectives 300 "$BIN/cuda_collectives" --ignored --test-threads=1
if has conformance; then
  PEERLESS_TEST_BACKEND=cuda step conformance 400 "$BIN/exec_conformance" --test-threads=1
  grep -E "^test .*(FAILED|failed)" "$LOG/conformance.txt" | head -20 >>"$LOG/summary.txt"
fi
# The same cases on the first two GPUs only (a 2-GPU machine's view, on a larger machine).
if has conformance2; then
  CUDA_VISIBLE_DEVICES=0,1 PEERLESS_TEST_BACKEND=cuda step conformance2 400 "$BIN/exec_conformance" --test-threads=1
  grep -E "^test .*(FAILED|failed)" "$LOG/conformance2.txt" | head -20 >>"$LOG/summary.txt"
fi
has chain2 && CUDA_VISIBLE_DEVICES=0,1 PEERLESS_TEST_BACKEND=cuda step chain2 300 "$BIN/exec_chain" --nocapture
has stress && PEERLESS_TEST_BACKEND=cuda EXEC_STRESS_MODULES=${STRESS_MODULES:-400} \
  step stress 400 "$BIN/exec_stress" --nocapture
has chain && PEERLESS_TEST_BACKEND=cuda step chain 300 "$BIN/exec_chain" --nocapture
has run && step run_example 120 "$BIN/peerless" run examples/all_reduce.hlo --devices 4 --backend cuda
has bench && step bench 500 "$BIN/peerless" bench --csv "$LOG/bench.csv" ${BENCH_ARGS:-}
has bench2 && step bench2 300 "$BIN/peerless" bench --devices 2 --dtypes f32 --csv "$LOG/bench2.csv" ${BENCH2_ARGS:-}
# Grid-size sweep of the Peerless kernels alone (graph launches, f32): SWEEP_BLOCKS lists
# --collective_blocks values; the all-reduce rows also run with one-shot up to 4 MiB.
if has sweep; then
  for b in ${SWEEP_BLOCKS:-24 48 96}; do
    step "sweep_b$b" 200 "$BIN/peerless" bench --impls peerless --modes graph --dtypes f32 \
      --flags "--collective_blocks=$b" --csv "$LOG/sweep_b$b.csv"
    step "sweep_oneshot_b$b" 120 "$BIN/peerless" bench --impls peerless --modes graph --dtypes f32 \
      --ops all-reduce --max-bytes 4194304 --flags "--collective_blocks=$b --one_shot_max_bytes=4194304" \
      --csv "$LOG/sweep_oneshot_b$b.csv"
  done
fi
has torch && step torch_symm 300 python3 scripts/torch_symm_bench.py --out "$LOG/torch_symm.csv"
# JAX (0.11 on the GPU image) with the plugin on the cuda backend, against JAX's CPU backend.
export PEERLESS_PJRT_LIBRARY="$PWD/$BIN/libpeerless_pjrt.so" PYTHONPATH="$PWD/plugin/python"
has jax && PEERLESS_BACKEND=cuda step jax_pytest 400 python3 -m pytest -q -x plugin/tests/test_jax.py
# Collective faults through JAX (docs/RELIABILITY.md section 3): a failing or withheld device on
# the kernel path ends in an exception, then the client runs new programs. Cases needing more
# devices than GPUs are skipped; -rs lists them in the log.
has faults && PEERLESS_BACKEND=cuda step faults 300 python3 -m pytest -q -rs plugin/tests/test_faults.py
has psum && PEERLESS_BACKEND=cuda step time_psum 300 python3 plugin/tests/time_psum.py --out "$LOG/time_psum.csv"
echo "gpu_check rc=$rc" | tee -a "$LOG/summary.txt"
exit $rc
