#!/usr/bin/env bash
# The demo: Peerless inside XLA on the embedded default (XLA:CPU, 8 host devices):
# a data-parallel train step and a tensor-parallel block, each collective's decision, agreement
# with XLA alone and the time per step, as configured (tuning profile) and with the kernels forced
# (examples/inside_xla.py). Arguments pass through
# (e.g. --steps 200).
set -euo pipefail
cd "$(dirname "$0")/.."
PEERLESS_SKIP_HIP=1 scripts/setup.sh # the HIP compile checks are the tests', not the demo's
cargo build --release --locked -p peerless-pjrt
venv_root=${PEERLESS_VENV_DIR:-.venv}
case $venv_root in /*) ;; *) venv_root=$PWD/$venv_root ;; esac
python="$venv_root/jax/bin/python"
target_dir=$(cargo metadata --format-version 1 --no-deps | "$python" -c "import json,sys; print(json.load(sys.stdin)['target_directory'])")
PEERLESS_PJRT_LIBRARY="$target_dir/release/libpeerless_pjrt.so" PYTHONPATH="$PWD/plugin/python" \
  "$python" examples/inside_xla.py "$@"
