#!/usr/bin/env bash
# The GPU check: runs prebuilt binaries (no Rust on the GPU machines) and writes logs to $1.
#   scripts/gpu_check.sh LOGDIR [BINDIR]
# BINDIR (default .gpu) holds binaries copied from a release build (scripts/gpu_build.sh):
#   peerless, libpeerless_pjrt.so, cuda_collectives.
# GPUs run whole modules inside XLA: XLA's CUDA plugin (jax-cuda13-pjrt) compiles them and
# Peerless's pass and handlers take the collectives. GPU_CHECK_STEPS (default: every step
# below) picks steps; BENCH_ARGS passes options to `peerless bench`.
set -uo pipefail
LOG=${1:?usage: gpu_check.sh LOGDIR [BINDIR]}
BIN=${2:-.gpu}
STEPS=${GPU_CHECK_STEPS:-userforms first devices collectives fused overlap inside sweep suites edge multiprocess staging order run bench copyengines tune tunebench torch jax psum}
mkdir -p "$LOG"
# NVLink multicast stays off (shared hosts): never remove these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PEERLESS_HLO_TESTS_DIR="$PWD/hlo-tests" PEERLESS_CACHE_DIR=/tmp/peerless-kernel-cache
# The library of BINDIR, with the checkout's package; without one, the pip-installed wheel's
# (the product as users get it).
if [ -f "$BIN/libpeerless_pjrt.so" ]; then
  export PEERLESS_PJRT_LIBRARY="$PWD/$BIN/libpeerless_pjrt.so" PYTHONPATH="$PWD/plugin/python"
fi
# XLA's CUDA plugin, for `peerless run/bench --backend xla`.
. "$(dirname "$0")/steps.sh"
XLA_CUDA=$(xla_cuda_plugin)
export PEERLESS_XLA_PLUGIN=${PEERLESS_XLA_PLUGIN:-$XLA_CUDA}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
{ date -u; nvidia-smi; nvidia-smi topo -m; echo "XLA CUDA plugin: $PEERLESS_XLA_PLUGIN"; } >"$LOG/nvidia-smi.txt" 2>&1
# The first call of a program with a collective, each case in a fresh process with an empty
# kernel cache: stock JAX beside Peerless (prebuilt kernels, and NVRTC without them).
has first && step first_call 400 python3 plugin/tests/gpu_first_call.py --out "$LOG/first_call"
# Where each GPU's kernels come from (prebuilt, cached, compiled on first use).
has devices && step devices 300 "$BIN/peerless" devices
# The kernels against host references on raw buffers (needs 2 GPUs).
has collectives && [ "$NGPU" -ge 2 ] && step cuda_collectives 300 "$BIN/cuda_collectives" --ignored --test-threads=1
# The all-reduce fused with the residual add + RMSNorm inside XLA, against XLA alone.
has fused && [ "$NGPU" -ge 2 ] && step fused_norm 300 python3 plugin/tests/gpu_fused_norm.py --platform cuda
# Can XLA overlap a Peerless call with compute? One variant per process (JAX's
# in-memory executable cache does not key on Peerless's flags): the call on XLA's operation
# queue 1 (32 MiB f32, two-shot; command buffers on and off; 2 MiB), and today's synchronous call.
if has overlap && [ "$NGPU" -ge 2 ]; then
  export PROBE_PEERLESS_FLAGS="--all_reduce_backend=kernel --xla_async_above_bytes=none --overlap_above_bytes=none --two_shot_max_bytes=67108864"
  step overlap_queue_32mib 300 python3 plugin/tests/overlap_probe.py --mb 32 --flagsets default,annot-on+nocmdbuf \
    --variants xla,pl-queue --dump "$LOG/overlap_dump"
  step overlap_queue_2mib 200 python3 plugin/tests/overlap_probe.py --mb 2 --flagsets default --variants pl-queue
  step overlap_sync_32mib 200 python3 plugin/tests/overlap_probe.py --mb 32 --flagsets default --variants pl-sync
  unset PROBE_PEERLESS_FLAGS
fi
# Peerless inside XLA through JAX: every collective kind vs XLA alone, command buffers on and off.
has inside && step inside 500 python3 plugin/tests/gpu_xla_inside.py check --out "$LOG/inside"
# Every collective form JAX users write vs XLA alone, every kind forced onto the kernels:
# kind x axis arguments x tiled x rank 1-4 x int32/float32 x pmap / shard_map (1-D and 2-D
# meshes) / jit reshards and reductions; on every GPU, and on 2 of them (--quick).
has sweep && [ "$NGPU" -ge 2 ] && step sweep 560 python3 plugin/tests/collective_sweep.py --out "$LOG/sweep.json"
has sweep && [ "$NGPU" -gt 2 ] && step sweep_2gpu 400 env CUDA_VISIBLE_DEVICES=0,1 python3 plugin/tests/collective_sweep.py \
  --quick --out "$LOG/sweep_2gpu.json"
# JAX's own suites with PEERLESS_ENABLE=1 beside the same run without: JAX_TESTS_DIR holds
# jax-ml/jax's tests/{pmap,shard_map,pjit}_test.py at the installed JAX's version (never
# committed; the device tool carries them); pytest, pytest-xdist and absl-py come from
# PEERLESS_WHEELS (wheels carried likewise) where the image lacks them. With
# PEERLESS_FLAGS=--overlap_above_bytes=0 every Peerless call runs on XLA's async queue.
if has suites; then
  if ! python3 -c 'import pytest, xdist, absl' 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links "${PEERLESS_WHEELS:-.wheels}" pytest pytest-xdist absl-py
  fi
  step jax_suites "${JAX_SUITES_LIMIT:-1800}" python3 plugin/tests/jax_suites.py "${JAX_TESTS_DIR:-.jaxtests}" \
    --suites "${JAX_SUITES:-pmap_test,shard_map_test,pjit_test}" --workers "${JAX_SUITE_WORKERS:-4}" --out "$LOG/jax_suites"
fi
# Edge values (NaN, ±0, ±inf, overflow) through max / min / sum: Peerless vs XLA alone (NCCL).
has edge && [ "$NGPU" -ge 2 ] && step edge_values 300 python3 plugin/tests/gpu_edge_values.py --out "$LOG/edge"
# Processes: two processes per GPU pair (on one GPU: both on GPU 0) through CUDA IPC.
# Programs as users write them, each against XLA alone: one process per GPU with
# PEERLESS_ENABLE=1 (2 and 4 processes; local_device_ids and CUDA_VISIBLE_DEVICES) and its
# fault case, JAX's async collective API, user-chosen layouts.
has userforms && step user_forms 590 python3 plugin/tests/gpu_user_forms.py --platform cuda --out "$LOG/user_forms"
has multiprocess && step multiprocess 400 python3 plugin/tests/gpu_multiprocess.py --out "$LOG/multiprocess"
# Shared staging: device memory Peerless holds for N = 1 vs N = 200 chained collectives (one
# process; two processes on GPU 0 through IPC; four kernel families on one slot), command
# buffers on and off, every result checked.
has staging && step staging 560 python3 plugin/tests/gpu_staging.py --out "$LOG/staging"
# Group order and edge values: eight processes on GPU 0 as a 2x2x2 mesh, every collective kind
# over every ordered axis choice vs XLA:CPU alone, max / min of NaN / ±0 / ±inf vs NCCL's fmaxf.
has order && step group_order 560 python3 plugin/tests/gpu_group_order.py --out "$LOG/group_order"
# An HLO file through the CLI: XLA compiles it, Peerless's pass and kernels take its all-reduces.
if has run && [ "$NGPU" -ge 4 ]; then
  step run_example 300 "$BIN/peerless" run hlo-tests/goldens/all_reduce_sum.pb --devices 4 --backend xla \
    --inputs hlo-tests/goldens/all_reduce_sum.d4.npz
fi
has bench && [ "$NGPU" -ge 2 ] && step bench 500 "$BIN/peerless" bench --csv "$LOG/bench.csv" ${BENCH_ARGS:-}
# The copy-engine forms (no SMs moving bytes) against today's kernels and XLA's NCCL, every
# kind, 64 KiB to 256 MiB per device, bf16, side by side in one run.
has copyengines && [ "$NGPU" -ge 2 ] && step copy_engines 500 "$BIN/peerless" bench --csv "$LOG/copy_engines.csv" \
  --impls copy-engines,peerless,xla --dtypes bf16 --min-bytes 65536 --max-bytes 268435456 --step 4 --samples 10
# Tuning: `peerless tune` over every group size up to the GPU count (at most 4) into
# LOGDIR/tune; `tunebench` (a separate step: each may take minutes) then runs the bench with
# `auto` deciding by the profile found there.
NT=$((NGPU < 4 ? NGPU : 4))
if has tune && [ "$NGPU" -ge 2 ]; then
  TGROUPS=2; [ "$NT" -ge 4 ] && TGROUPS=2,4
  KIND=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  step tune 560 "$BIN/peerless" tune --devices "$NT" --groups "$TGROUPS" --max-bytes 16777216 \
    --out-dir "$LOG/tune" --machine "${NT}x $KIND (gpu_check.sh)"
fi
if has tunebench && [ "$NGPU" -ge 2 ]; then
  PROFILE=$(ls "$LOG"/tune/*.json 2>/dev/null | head -1)
  if [ -n "$PROFILE" ]; then
    step tune_bench 560 env PEERLESS_TUNING_PROFILE="$PROFILE" "$BIN/peerless" bench \
      --devices "$NT" --chain 8 --max-bytes 16777216 --samples 15 --sample-ms 5 \
      --impls peerless,auto,one-shot,two-shot,xla,xla-kernels --csv "$LOG/tune_bench.csv"
  else
    echo "== tune_bench: no profile in $LOG/tune (run the tune step first)" | tee -a "$LOG/summary.txt"
    rc=1
  fi
fi
has torch && [ "$NGPU" -ge 2 ] && step torch_symm 300 python3 scripts/torch_symm_bench.py --out "$LOG/torch_symm.csv"
# JAX_PLATFORMS=peerless wrapping XLA's CUDA plugin, against JAX's CPU backend.
has jax && PEERLESS_BACKEND=cuda step jax_pytest 400 python3 -m pytest -q -x plugin/tests/test_jax.py
has psum && step time_psum 300 python3 plugin/tests/time_psum.py --out "$LOG/time_psum.csv"
echo "gpu_check rc=$rc" | tee -a "$LOG/summary.txt"
exit $rc
