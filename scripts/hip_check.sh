#!/usr/bin/env bash
# Compiles every kernel source under kernels/cuda/ (*.cu, globbed, so new files are included)
# with hipcc for AMD GPUs, through the same portability header the CUDA build uses. No AMD
# GPU is needed: this is a compile check, nothing runs.
#   scripts/hip_check.sh                  # gfx90a always; gfx942 if the toolchain knows it
#   PEERLESS_HIP_ARCHS="gfx90a gfx942"    # override the list (each one must compile)
# Fails on any compiler error or warning, on a missing hipcc, and if no source was found.
# Debian bookworm's hipcc is ROCm 5.2 (clang 15), which predates gfx942 (MI300): that target
# is then skipped with a message, never silently.
set -euo pipefail
cd "$(dirname "$0")/.."

hipcc=${HIPCC:-}
if [ -z "$hipcc" ]; then
  if [ -n "${ROCM_PATH:-}" ] && [ -x "$ROCM_PATH/bin/hipcc" ]; then
    hipcc="$ROCM_PATH/bin/hipcc"
  else
    hipcc=$(command -v hipcc || true)
  fi
fi
if [ -z "$hipcc" ]; then
  echo "hip_check: hipcc not found (scripts/setup.sh installs Debian's hipcc; or set HIPCC / ROCM_PATH)" >&2
  exit 1
fi

# PL_BLOCKS comes from the host at run time (kernels/src/cuda/mod.rs: BLOCKS); any value
# compiles, and 24 is the one the runtime uses today.
blocks=${PEERLESS_PL_BLOCKS:-24}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Whether this hipcc can generate code for an offload arch at all (a one-line kernel).
supports() {
  printf 'extern "C" __global__ void pl_arch_probe(int* p) { *p = 1; }\n' >"$work/probe.hip"
  "$hipcc" -x hip --offload-arch="$1" --cuda-device-only -nogpulib -c "$work/probe.hip" -o "$work/probe.o" \
    >"$work/probe.log" 2>&1
}

if [ -n "${PEERLESS_HIP_ARCHS:-}" ]; then
  read -r -a archs <<<"$PEERLESS_HIP_ARCHS"
  optional=()
else
  archs=(gfx90a)
  optional=(gfx942)
fi
version=$("$hipcc" --version 2>/dev/null || true)
version=$(printf '%s\n' "$version" | grep -m1 -i 'version' || echo 'version unknown')
echo "hip_check: $hipcc ($version)"
for a in "${optional[@]}"; do
  if supports "$a"; then
    archs+=("$a")
  else
    echo "hip_check: SKIPPED $a: this hipcc cannot target it:"
    grep -m1 -i 'error' "$work/probe.log" | sed 's/^/hip_check:   /' || true
  fi
done

shopt -s nullglob
sources=(kernels/cuda/*.cu)
if [ ${#sources[@]} -eq 0 ]; then
  echo "hip_check: no kernel sources under kernels/cuda/" >&2
  exit 1
fi

status=0
for a in "${archs[@]}"; do
  for src in "${sources[@]}"; do
    obj="$work/$(basename "$src" .cu).$a.o"
    if "$hipcc" -x hip -std=c++17 --offload-arch="$a" -O3 -Werror -DPL_BLOCKS="$blocks" -Ikernels/cuda \
      -c "$src" -o "$obj" 2>"$work/log"; then
      echo "hip_check: ok      $src for $a ($(stat -c %s "$obj") bytes)"
    else
      echo "hip_check: FAILED  $src for $a:" >&2
      cat "$work/log" >&2
      status=1
    fi
  done
done
exit $status
