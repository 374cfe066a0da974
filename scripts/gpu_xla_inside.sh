#!/usr/bin/env bash
# Peerless inside XLA on a GPU machine (the device tool; no Rust there). Carry BINDIR with
# libpeerless_pjrt.so built by `cargo build --release -p peerless-pjrt` (scripts/gpu_build.sh).
#   scripts/gpu_xla_inside.sh LOGDIR [BINDIR]
# STEPS (default: "compute check1 check bench") picks steps; compute and check1 run on GPU 0
# alone (one-device collectives: the handlers on XLA's stream, in command buffers).
set -uo pipefail
LOG=${1:?usage: gpu_xla_inside.sh LOGDIR [BINDIR]}
BIN=${2:-.gpu}
STEPS=${STEPS:-compute check1 check bench}
mkdir -p "$LOG"
# NVLink multicast stays off (shared hosts): never remove these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PEERLESS_PJRT_LIBRARY="$PWD/$BIN/libpeerless_pjrt.so" PYTHONPATH="$PWD/plugin/python" PYTHONUNBUFFERED=1
export PEERLESS_CACHE_DIR=/tmp/peerless-kernel-cache JAX_PLATFORMS=cuda
PY=${PY:-python3}
rc=0
{ date -u; nvidia-smi; nvidia-smi topo -m; $PY -c 'import jax; print(jax.__version__, jax.devices())'; } >"$LOG/devices.txt" 2>&1
for s in $STEPS; do
  echo "== $s" | tee -a "$LOG/summary.txt"
  t0=$SECONDS
  if [ "$s" = compute ]; then
    CUDA_VISIBLE_DEVICES=0 timeout -k 10 400 $PY plugin/tests/gpu_xla_inside.py compute --out "$LOG" >"$LOG/$s.txt" 2>&1
  elif [ "$s" = check1 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout -k 10 400 $PY plugin/tests/gpu_xla_inside.py check --out "$LOG/one" --sizes 1024,1048576 >"$LOG/$s.txt" 2>&1
  else
    timeout -k 10 500 $PY plugin/tests/gpu_xla_inside.py "$s" --out "$LOG" ${SIZES:+--sizes $SIZES} >"$LOG/$s.txt" 2>&1
  fi
  r=$?
  echo "   rc=$r in $((SECONDS - t0)) s" | tee -a "$LOG/summary.txt"
  cat "$LOG/$s.txt" | tail -40 | tee -a "$LOG/summary.txt"
  [ $r -eq 0 ] || rc=1
done
exit $rc
