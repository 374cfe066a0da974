#!/usr/bin/env bash
# The copy-engine collectives on one GPU, in one command for the device tool: members share
# GPU 0, each with a stream of its own, through the handlers' own plans (no NVLink is crossed).
#   scripts/gpu_copy_engines.sh LOGDIR [BINDIR]
# BINDIR (default .gpu, from scripts/gpu_build.sh) holds peerless, libpeerless_pjrt.so and the
# cuda_copy_engines test binary. Steps (GPU_CE_STEPS picks): tests (2, 3, 4 members: every form,
# element type and algorithm against the host reference, 1,000 CUDA-graph replays each, a
# missing member), ncu (the copy-engine forms under Nsight Compute: no kernel may appear),
# bench (µs per call, and a bf16 GEMM's speed beside 4 members' 256 MiB all-gather on the copy
# engines, on today's kernel and as bare copies of the same bytes, the floor), inside (the
# forms through JAX and XLA with --copy_engines=0), multiprocess (two processes sharing GPU 0,
# every call on the copy engines across them).
set -uo pipefail
LOG=${1:?usage: gpu_copy_engines.sh LOGDIR [BINDIR]}
BIN=${2:-.gpu}
STEPS=${GPU_CE_STEPS:-tests ncu bench inside multiprocess}
mkdir -p "$LOG"
# NVLink multicast stays off (shared hosts): never remove these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PEERLESS_CACHE_DIR=/tmp/peerless-kernel-cache
# Members on one GPU are several streams each blocked in turn on a stream wait: give every
# stream a hardware queue of its own.
export CUDA_DEVICE_MAX_CONNECTIONS=32
STEP_TAIL=12
. "$(dirname "$0")/steps.sh"
{ date -u; nvidia-smi; } >"$LOG/nvidia-smi.txt" 2>&1
if has tests; then
  step tests 240 "$BIN/cuda_copy_engines" --ignored --test-threads=1 --nocapture
fi
if has ncu; then
  # Only the copy-engine algorithms run (--impls copy-engines): check, missing member, timing.
  step ncu 150 ncu --target-processes all --print-summary per-kernel \
    "$BIN/peerless" bench --members-on-one-gpu 4 --impls copy-engines --ops all-gather,all-to-all,collective-permute --graph-replays 5 \
    --min-bytes 65536 --max-bytes 1048576 --step 16 --samples 2
  if grep -q "No kernels were profiled" "$LOG/ncu.txt"; then
    echo "   ncu: no kernel ran" | tee -a "$LOG/summary.txt"
  else
    echo "   ncu: KERNELS RAN (see ncu.txt)" | tee -a "$LOG/summary.txt"
    rc=1
  fi
fi
if has bench; then
  step bench4 200 "$BIN/peerless" bench --members-on-one-gpu 4 --beside-gemm --graph-replays 20 \
    --min-bytes 16384 --max-bytes 67108864 --step 16 --samples 5
  step bench2 120 "$BIN/peerless" bench --members-on-one-gpu 2 --graph-replays 20 \
    --min-bytes 16384 --max-bytes 67108864 --step 16 --samples 5
fi
if has inside; then
  # One GPU: groups of one through XLA (the forms forced onto Peerless, command buffers on and
  # off), the copy-engine algorithms chosen at every size.
  if [ -f "$BIN/libpeerless_pjrt.so" ]; then
    export PEERLESS_PJRT_LIBRARY="$PWD/$BIN/libpeerless_pjrt.so" PYTHONPATH="$PWD/plugin/python"
  fi
  forced="--all_reduce_backend=kernel --all_gather_backend=kernel --all_to_all_backend=kernel"
  forced="$forced --reduce_scatter_backend=kernel --collective_permute_backend=kernel --copy_engines=0"
  step inside 300 env PEERLESS_FLAGS="$forced" python3 plugin/tests/gpu_xla_inside.py check --out "$LOG/inside"
  grep -h "implementations" "$LOG/inside.txt" | sed 's/^/   | /' | tee -a "$LOG/summary.txt"
  rm -rf "$LOG/inside" # its digests are in inside.txt's verdicts; too many files to bring back
fi
if has multiprocess; then
  # Two processes sharing GPU 0 (jax.distributed), every call on its copy-engine form across
  # them: the flag words in a shared segment, the copies through IPC; results against numpy,
  # then a process that never arrives.
  if [ -f "$BIN/libpeerless_pjrt.so" ]; then
    export PEERLESS_PJRT_LIBRARY="$PWD/$BIN/libpeerless_pjrt.so" PYTHONPATH="$PWD/plugin/python"
  fi
  step multiprocess 300 python3 plugin/tests/gpu_multiprocess.py --flags "--copy_engines=0" --no-cache-check \
    --out "$LOG/multiprocess"
fi
echo "rc=$rc" | tee -a "$LOG/summary.txt"
exit $rc
