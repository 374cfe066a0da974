#!/usr/bin/env bash
# Installs a jax-peerless wheel (scripts/build_wheel.sh) into a fresh venv with no Rust toolchain
# on PATH and runs plugin/tests/wheel_smoke.py there: Peerless enabled vs XLA alone on 8 CPU
# devices, and stats() showing Peerless took the collectives; then the `peerless` command
# (`--version`, `devices`, `flags`) and the version, LICENSE and default backend of the package.
#   scripts/check_wheel.sh WHEEL [--kernels TARGETS]   # TARGETS: e.g. sm_80,sm_90,sm_100,compute_100
# JAX comes from where scripts/setup.sh's venvs get it (pip: the index, or PIP_FIND_LINKS such
# as /opt/wheels), pinned to plugin/requirements.txt's versions. The venv is made from
# $PEERLESS_PYTHON (default: scripts/setup.sh's jax venv) and removed afterwards.
set -euo pipefail
[ $# -eq 1 ] || [ $# -eq 3 ] || { sed -n '5p' "$0" | sed 's/^# //' >&2; exit 2; }
wheel=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
shift
# The smoke also counts the prebuilt kernel units per target in the bundled library.
smoke_args=("$@")
cd "$(dirname "$0")/.."
repo=$PWD
venv_root=${PEERLESS_VENV_DIR:-.venv}
case $venv_root in /*) ;; *) venv_root=$repo/$venv_root ;; esac
python=${PEERLESS_PYTHON:-$venv_root/jax/bin/python}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# PATH without any directory that holds cargo or rustc.
path=""
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  [ -n "$d" ] && { [ -e "$d/cargo" ] || [ -e "$d/rustc" ]; } && continue
  path=${path:+$path:}$d
done
export PATH=$path
hash -r
# (`!` alone would not stop the script: set -e ignores inverted commands.)
! command -v cargo || { echo "check_wheel: cargo is still on PATH" >&2; exit 1; }
! command -v rustc || { echo "check_wheel: rustc is still on PATH" >&2; exit 1; }
echo "check_wheel: no cargo or rustc on PATH ($PATH)"
env -u PYTHONPATH "$python" -m venv "$work/venv"
# Constraints, not requirements: the wheel's dependencies (jax, jaxlib, numpy, ...) at the versions
# CI tests, nothing else from that file.
env -u PYTHONPATH "$work/venv/bin/python" -m pip install -q --disable-pip-version-check \
  -c plugin/requirements.txt "$wheel"
"$work/venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null | grep -iE '^(jax|jaxlib|jax-peerless) '
cp plugin/tests/wheel_smoke.py "$work/"
# Outside the checkout, isolated (-I: no PYTHONPATH, no user site), no Peerless variables.
(cd "$work" && env -u PEERLESS_PJRT_LIBRARY -u PEERLESS_ENABLE -u PEERLESS_FLAGS -u PEERLESS_XLA_PLUGIN \
  JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 \
  "$work/venv/bin/python" -I wheel_smoke.py "${smoke_args[@]}")
# The command and the package's metadata, as installed (no cargo on PATH).
(cd "$work" && env -u PEERLESS_PJRT_LIBRARY -u PYTHONPATH -u JAX_PLATFORMS -u XLA_FLAGS sh -c '
set -e
bin=$(dirname "$1")
"$bin/peerless" --version
"$bin/peerless" flags | head -3
"$bin/peerless" devices | head -5
"$1" -I -c "
import importlib.metadata as md, os, jax, jax_plugins.peerless as p
assert p.__version__ == md.version(\"jax-peerless\"), (p.__version__, md.version(\"jax-peerless\"))
assert os.path.isfile(os.path.join(p.__path__[0], \"LICENSE\"))
meta = md.metadata(\"jax-peerless\")
assert meta[\"Summary\"] and \"Peerless\" in (meta.get_payload() or meta[\"Description\"] or \"\"), \"no description\"
# Installing the wheel changes neither the default platform nor its devices.
assert jax.default_backend() == \"cpu\", jax.default_backend()
print(\"check_wheel: jax-peerless\", p.__version__, \"default backend\", jax.default_backend())
"' sh "$work/venv/bin/python")
