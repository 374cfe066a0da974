#!/usr/bin/env bash
# The ROCm check: what scripts/gpu_check.sh is for CUDA, for a machine with AMD GPUs. It has
# NEVER RUN: there is no AMD GPU in our build or lent machines (docs/ROCM.md). It runs
# prebuilt binaries (no Rust needed on the GPU machine) and writes logs to LOGDIR.
#   scripts/rocm_check.sh build [BINDIR]     # on any x86-64 Linux: build BINDIR (default .rocm)
#   scripts/rocm_check.sh LOGDIR [BINDIR]    # on the ROCm machine: run the steps
# BINDIR holds libpeerless_pjrt.so built with the cargo feature `rocm` (the HIP handlers,
# registered for XLA's "ROCM" platform) and the rocm_collectives test binary. No ROCm is
# needed to build: HIP, hipRTC and RCCL are loaded at run time.
# The ROCm machine needs: AMD GPUs with ROCm >= 6 (set ROCM_PATH if not /opt/rocm), and a
# python3 with jax, jax-rocm7-pjrt and jax-rocm7-plugin (XLA's ROCm plugin, as AMD users
# install it: `pip install jax[rocm7-local]` or the two wheels), numpy and pytest.
# ROCM_CHECK_STEPS (default: every step below) picks steps.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = build ]; then
  set -e
  BIN=${2:-.rocm}
  mkdir -p "$BIN"
  target=$(cargo metadata --format-version 1 --no-deps | python3 -c "import json,sys; print(json.load(sys.stdin)['target_directory'])")
  cargo build --release --locked -p peerless-pjrt --features rocm
  cp "$target/release/libpeerless_pjrt.so" "$BIN/"
  exe=$(cargo test --release --locked -p peerless-kernels --features rocm --test rocm_collectives --no-run \
    --message-format=json 2>/dev/null | python3 -c "import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['name'] == 'rocm_collectives':
        print(m['executable'])")
  cp "$exe" "$BIN/rocm_collectives"
  strip "$BIN"/* && ls -la "$BIN"
  exit 0
fi

LOG=${1:?usage: rocm_check.sh LOGDIR [BINDIR] | rocm_check.sh build [BINDIR]}
BIN=${2:-.rocm}
STEPS=${ROCM_CHECK_STEPS:-devices collectives inside multiprocess}
mkdir -p "$LOG"
export PEERLESS_PJRT_LIBRARY="$PWD/$BIN/libpeerless_pjrt.so" PYTHONPATH="$PWD/plugin/python"
# Every JAX step runs on JAX's own ROCm backend with Peerless enabled for platform "rocm".
export PEERLESS_PLATFORM=rocm JAX_PLATFORMS=rocm
NGPU=$(python3 -c 'from jax._src import hardware_utils as h; print(h.num_available_amd_gpus())' 2>/dev/null || echo 0)
. "$(dirname "$0")/steps.sh"
{
  date -u
  rocm-smi --showproductname --showbus 2>&1 || true
  rocminfo 2>/dev/null | grep -E "Marketing Name|Name: +gfx" || true
  python3 -c 'import jax, jax_plugins.xla_rocm7 as p; print("jax", jax.__version__, "XLA ROCm plugin", p.__file__)'
  echo "AMD GPUs: $NGPU; library: $PEERLESS_PJRT_LIBRARY"
} >"$LOG/devices.txt" 2>&1
# The library has the HIP handlers (a build without `--features rocm` has none).
has devices && step handlers 60 python3 -c '
import ctypes, os
dll = ctypes.CDLL(os.environ["PEERLESS_PJRT_LIBRARY"])
dll.PeerlessXlaHandler.restype = ctypes.c_void_p
assert dll.PeerlessXlaHandler(b"rocm", b"peerless.all_reduce"), "library built without --features rocm"
print("rocm handlers present")'
# The kernels against host references on raw buffers, and RCCL if installed (needs 2 GPUs).
has collectives && [ "$NGPU" -ge 2 ] && step rocm_collectives 300 "$BIN/rocm_collectives" --ignored --test-threads=1
# Peerless inside XLA through JAX: every collective kind vs XLA alone (RCCL), command buffers
# (HIP graphs) on and off; one GPU forces the kernels.
has inside && step inside 500 python3 plugin/tests/gpu_xla_inside.py check --out "$LOG/inside"
# Processes: two processes on GPU 0 through HIP IPC (jax.distributed).
has multiprocess && step multiprocess 400 python3 plugin/tests/gpu_multiprocess.py --out "$LOG/multiprocess"
echo "rocm_check rc=$rc" | tee -a "$LOG/summary.txt"
exit $rc
