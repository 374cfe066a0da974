#!/usr/bin/env bash
# Installs what a fresh machine needs to build and test Peerless:
# libclang + protoc (pjrt-sys runs bindgen and prost-build over the XLA protos), gcc/g++, Debian's
# hipcc and HIP runtime (the ROCm compile checks), and two Python virtual environments under
# ${PEERLESS_VENV_DIR:-<repo>/.venv}:
#   goldens/  Python 3.11, hlo-tests/requirements.txt (jax/jaxlib 0.10.2: XLA's goldens)
#   jax/      Python 3.12, plugin/requirements.txt (jax/jaxlib 0.11.2: JAX on the plugin, NVRTC)
#   jax012/   Python 3.12, plugin/requirements-jax012.txt (jax/jaxlib 0.12.0.1: the current JAX)
# Idempotent: does nothing that is already in place (a venv is installed again only when its
# requirements file changed). PEERLESS_SKIP_PYTHON=1 leaves Python alone.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_install() {
  echo "setup: installing $*"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

need_apt=()
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
# The C ABI test compiles a C program (plugin/so/tests/c_abi.rs); the generated kernels' host
# check builds them with the C++ compiler (kernels/src/codegen_tests.rs).
command -v "${CC:-cc}" >/dev/null 2>&1 || need_apt+=(gcc)
command -v "${CXX:-g++}" >/dev/null 2>&1 || need_apt+=(g++)
# What bindgen loads (scripts/find_libclang.sh), not any file named libclang*: Debian's clang
# tooling installs libclang-cpp.so.N, which is not libclang.
scripts/find_libclang.sh >/dev/null || need_apt+=(libclang-dev)
# HIP compile check without AMD hardware (scripts/hip_check.sh, the rocm feature's hipRTC
# test): Debian bookworm's hipcc and HIP runtime (ROCm 5.2.3; hipRTC is inside libamdhip64).
# PEERLESS_SKIP_HIP=1 (scripts/demo.sh) leaves them out: running Peerless needs neither.
if [ "${PEERLESS_SKIP_HIP:-0}" != "1" ] && ! command -v hipcc >/dev/null 2>&1 \
  && ! [ -x "${ROCM_PATH:-/opt/rocm}/bin/hipcc" ]; then
  need_apt+=(hipcc)
fi
# (One `ls` per place: `ls A B` fails when either is missing.)
if [ "${PEERLESS_SKIP_HIP:-0}" != "1" ] && ! ls /usr/lib/x86_64-linux-gnu/libamdhip64.so* >/dev/null 2>&1 \
  && ! ls "${ROCM_PATH:-/opt/rocm}"/lib/libamdhip64.so* >/dev/null 2>&1; then
  need_apt+=(libamdhip64-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  apt_install "${need_apt[@]}"
fi
if ! libclang=$(scripts/find_libclang.sh); then
  echo "setup: no libclang that bindgen can load (libclang.so or libclang-N.so) after installing" \
    "libclang-dev: install it, or set LIBCLANG_PATH to the directory that holds it" >&2
  exit 1
fi
echo "setup: libclang $libclang"

[ "${PEERLESS_SKIP_PYTHON:-0}" = "1" ] && exit 0

venv_root=${PEERLESS_VENV_DIR:-.venv}
case $venv_root in /*) ;; *) venv_root=$PWD/$venv_root ;; esac

# is_python PYTHON X.Y: PYTHON runs and is Python X.Y.
is_python() {
  "$1" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$2'.split('.'))))" >/dev/null 2>&1
}

# An interpreter of Python X.Y: $PEERLESS_PYTHON<X><Y> (e.g. PEERLESS_PYTHON312), pythonX.Y on
# PATH (a pyenv shim counts only if it runs), pyenv's versions, the system's.
find_python() {
  local want=$1 var="PEERLESS_PYTHON${1/./}" cand
  local cands=("${!var:-}" "python$want")
  local root=${PYENV_ROOT:-$HOME/.pyenv}
  command -v pyenv >/dev/null 2>&1 && root=$(pyenv root)
  while IFS= read -r cand; do cands+=("$cand"); done < <(ls -d "$root/versions/$want".*/bin/python"$want" 2>/dev/null | sort -rV)
  cands+=("/usr/local/bin/python$want" "/usr/bin/python$want")
  for cand in "${cands[@]}"; do
    if [ -n "$cand" ] && is_python "$cand" "$want"; then
      command -v "$cand"
      return 0
    fi
  done
  return 1
}

# make_venv NAME X.Y REQUIREMENTS: $venv_root/NAME, a Python X.Y venv with REQUIREMENTS installed.
# A copy of the requirements file in the venv marks it done.
make_venv() {
  local name=$1 version=$2 reqs=$3 dir="$venv_root/$1" python
  local stamp="$dir/.peerless-requirements"
  if is_python "$dir/bin/python" "$version" && cmp -s "$reqs" "$stamp"; then
    return 0
  fi
  if ! python=$(find_python "$version"); then
    echo "setup: no Python $version found: install it (e.g. \`pyenv install $version\`) or set" \
      "PEERLESS_PYTHON${version/./} to its interpreter" >&2
    exit 1
  fi
  if [ -e "$dir" ] && ! is_python "$dir/bin/python" "$version"; then
    echo "setup: $dir is not a working Python $version venv: making it again"
    rm -rf "$dir"
  fi
  echo "setup: Python $version venv $dir ($python), packages from $reqs"
  if [ ! -e "$dir" ] && ! "$python" -m venv "$dir"; then
    # Debian splits venv support (ensurepip) into pythonX.Y-venv.
    [ "$python" = "/usr/bin/python$version" ] || exit 1
    rm -rf "$dir"
    apt_install "python$version-venv"
    "$python" -m venv "$dir"
  fi
  "$dir/bin/python" -m pip install -q --disable-pip-version-check -r "$reqs"
  cp "$reqs" "$stamp"
}

# XLA's goldens are tied to jax/jaxlib 0.10.2 (hlo-tests/gen_goldens.py --check).
make_venv goldens 3.11 hlo-tests/requirements.txt
# JAX loading the plugin (plugin/tests), `pip install ./plugin/python`, and NVRTC for the
# kernel compile check (scripts/test.sh points PEERLESS_NVRTC_LIB at it).
make_venv jax 3.12 plugin/requirements.txt
# The current JAX (0.12.x), for the suites scripts/test.sh runs on both versions. XLA's CPU
# plugin (lammps-jax-pjrt-cpu 0.11.2) declares jax<=0.11.2 but loads under 0.12: --no-deps.
make_venv jax012 3.12 plugin/requirements-jax012.txt
if ! "$venv_root/jax012/bin/python" -c 'import lammps_jax_pjrt_cpu' 2>/dev/null; then
  "$venv_root/jax012/bin/python" -m pip install -q --disable-pip-version-check --no-deps lammps-jax-pjrt-cpu==0.11.2
fi
