#!/usr/bin/env bash
# The GPU check: runs prebuilt binaries (no Rust on the GPU machines) and writes logs to $1.
#   scripts/gpu_check.sh LOGDIR [BINDIR]
# BINDIR (default .gpu) holds `peerless` and `cuda_collectives` (the kernels' GPU test),
# copied from a release build: cargo build --release -p peerless-cli &&
#   cargo test --release -p peerless-kernels --test cuda_collectives --no-run
set -uo pipefail
LOG=${1:?usage: gpu_check.sh LOGDIR [BINDIR]}
BIN=${2:-.gpu}
mkdir -p "$LOG"
# NVLink multicast stays off (shared hosts): never remove these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rc=0
{ nvidia-smi; nvidia-smi topo -m; } >"$LOG/nvidia-smi.txt" 2>&1
"$BIN/peerless" devices 2>&1 | tee "$LOG/devices.txt" || rc=1
"$BIN/cuda_collectives" --ignored --test-threads=1 2>&1 | tee "$LOG/cuda_collectives.txt" || rc=1
"$BIN/peerless" bench --csv "$LOG/bench.csv" ${BENCH_ARGS:-} 2>"$LOG/bench_progress.txt" | tee "$LOG/bench.md" || rc=1
tail -3 "$LOG/bench_progress.txt"
echo "gpu_check rc=$rc"
exit $rc
