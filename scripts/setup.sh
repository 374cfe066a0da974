#!/usr/bin/env bash
# Installs what a fresh machine needs to build and test Peerless:
# libclang + protoc (pjrt-sys runs bindgen and prost-build over the XLA protos),
# and the Python packages that produce XLA goldens (jax/jaxlib 0.10.2 on Python 3.11).
# Idempotent: does nothing that is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
if ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libclang; then
  need_apt+=(libclang-dev)
fi
# HIP compile check without AMD hardware (scripts/hip_check.sh, the rocm feature's hipRTC
# test): Debian bookworm's hipcc and HIP runtime (ROCm 5.2.3; hipRTC is inside libamdhip64).
if ! command -v hipcc >/dev/null 2>&1 && ! [ -x "${ROCM_PATH:-/opt/rocm}/bin/hipcc" ]; then
  need_apt+=(hipcc)
fi
if ! ls /usr/lib/x86_64-linux-gnu/libamdhip64.so* "${ROCM_PATH:-/opt/rocm}"/lib/libamdhip64.so* >/dev/null 2>&1; then
  need_apt+=(libamdhip64-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ "${PEERLESS_SKIP_PYTHON:-0}" != "1" ]; then
  # NVRTC without a GPU or a CUDA toolkit: CI compiles every CUDA kernel source to PTX
  # (kernels/tests/cuda_nvrtc.rs finds libnvrtc in site-packages).
  if ! python3 -c "import nvidia.cuda_nvrtc" >/dev/null 2>&1; then
    echo "setup: installing nvidia-cuda-nvrtc-cu12 (NVRTC for the kernel compile check)"
    python3 -m pip install -q nvidia-cuda-nvrtc-cu12==12.9.86
  fi
  if ! python3 -c "import jax, jaxlib, ml_dtypes, pytest, wheel; assert jax.__version__ == '0.10.2'" >/dev/null 2>&1; then
    echo "setup: installing Python packages from hlo-tests/requirements.txt"
    python3 -m pip install -q -r hlo-tests/requirements.txt
  fi
fi
