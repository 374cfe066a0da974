#!/usr/bin/env bash
# Builds the release binaries scripts/gpu_check.sh runs and copies them to BINDIR (default
# .gpu, ignored by git; pass it to the device tool's `carry`). x86-64 Linux, no CUDA needed.
# The kernels are prebuilt for GPU_KERNEL_TARGETS (default sm_90: the lent H100 / H200; the
# carry limit keeps the bundle small) with NVRTC from the JAX venv and embedded; set
# GPU_KERNEL_TARGETS= (empty) to embed none and compile on the GPU machine instead.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-.gpu}
mkdir -p "$BIN"
target=$(cargo metadata --format-version 1 --no-deps | python3 -c "import json,sys; print(json.load(sys.stdin)['target_directory'])")
targets=${GPU_KERNEL_TARGETS-sm_90}
if [ -n "$targets" ]; then
  export PEERLESS_NVRTC_LIB=${PEERLESS_NVRTC_LIB:-$(ls "${PEERLESS_VENV_DIR:-.venv}"/jax/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.* | head -1)}
  PEERLESS_PREBUILT_KERNELS= cargo build --release --locked -p peerless-cli
  "$target/release/peerless" kernels build --out "$target/prebuilt-kernels.pb" --targets "$targets"
  export PEERLESS_PREBUILT_KERNELS=$target/prebuilt-kernels.pb # cargo's target_directory is absolute
fi
cargo build --release --locked -p peerless-cli -p peerless-pjrt
cp "$target/release/peerless" "$target/release/libpeerless_pjrt.so" "$BIN/"
for t in cuda_collectives cuda_copy_engines; do
  exe=$(cargo test --release --locked -p peerless-kernels --test "$t" --no-run --message-format=json 2>/dev/null |
    python3 -c "import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['name'] == '$t':
        print(m['executable'])")
  cp "$exe" "$BIN/$t"
done
find "$BIN" -maxdepth 1 -type f -exec strip {} + && ls -la "$BIN"
