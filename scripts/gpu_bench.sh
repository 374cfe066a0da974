#!/usr/bin/env bash
# Benchmarks the programs users run (plugin/tests/bench_programs.py) with the wheel installed
# as a user installs it (`pip install --no-deps`, no PYTHONPATH), on every visible GPU.
#   scripts/gpu_bench.sh OUTDIR [bench_programs.py options...]
# The wheel comes from scripts/build_wheel.sh (default .gpu/wheel; PEERLESS_WHEEL_DIR).
set -uo pipefail
OUT=${1:?usage: gpu_bench.sh OUTDIR [options]}
shift
mkdir -p "$OUT"
# NVLink multicast stays off (shared hosts): never remove these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset PEERLESS_PJRT_LIBRARY PYTHONPATH
python3 -m pip install -q --no-deps --force-reinstall "${PEERLESS_WHEEL_DIR:-.gpu/wheel}"/*.whl >"$OUT/pip.txt" 2>&1 || {
  cat "$OUT/pip.txt"
  exit 1
}
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv; nvidia-smi topo -m; } >"$OUT/machine.txt" 2>&1
python3 plugin/tests/bench_programs.py --out "$OUT" "$@" 2>&1 | tee "$OUT/bench_programs.txt"
