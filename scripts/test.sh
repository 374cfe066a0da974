#!/usr/bin/env bash
# The test command: everything CI checks, runnable on a fresh machine.
#   scripts/test.sh            # setup, fmt, clippy, cargo test, JAX on the plugin, fuzz, the wheel, goldens
# Python runs in scripts/setup.sh's venvs under ${PEERLESS_VENV_DIR:-<repo>/.venv}: jax/ (JAX
# 0.11.2, Python 3.12) for everything that loads the plugin, goldens/ (JAX 0.10.2, Python
# 3.11) for the golden check. Set PEERLESS_SKIP_GOLDEN_CHECK=1 to skip re-running XLA.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

venv_root=${PEERLESS_VENV_DIR:-.venv}
case $venv_root in /*) ;; *) venv_root=$PWD/$venv_root ;; esac
# The interpreter of the JAX steps (plugin/requirements.txt), for this script and its children.
export PEERLESS_PYTHON="$venv_root/jax/bin/python"
goldens_python="$venv_root/goldens/bin/python"
# NVRTC for the kernel compile check in `cargo test` (kernels/tests/cuda_nvrtc.rs): the wheel in
# the JAX venv, whatever `python3` on PATH is.
if [ -z "${PEERLESS_NVRTC_LIB:-}" ]; then
  PEERLESS_NVRTC_LIB=$("$PEERLESS_PYTHON" -c '
import glob, os, nvidia.cuda_nvrtc as m
print(*[p for d in m.__path__ for p in glob.glob(os.path.join(d, "lib", "libnvrtc.so.*"))][:1])' 2>/dev/null || true)
  [ -n "$PEERLESS_NVRTC_LIB" ] && export PEERLESS_NVRTC_LIB
fi

# Each step's heading says when it started (seconds since the script began), so a slow step
# shows in the log.
step() { printf '\n== [%4d s] %s\n' "$SECONDS" "$*"; }

step "setup's libclang check against fake trees (scripts/tests/find_libclang.sh)"
scripts/tests/find_libclang.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
# The compute_80 bundle cuda_nvrtc's all-units test builds is kept for the wheel step below.
test_bundle=$(mktemp "${TMPDIR:-/tmp}/peerless-kernels.XXXXXX.pb")
trap 'rm -f "$test_bundle"' EXIT
PEERLESS_TEST_BUNDLE_OUT="$test_bundle" cargo test --workspace --locked

# ROCm without AMD hardware: the rocm feature (off by default) is linted and its tests run
# (hipRTC, the compiler the ROCm device layer uses, compiles every kernel source for gfx90a
# through Debian's libamdhip64 with warnings as errors; the generic GPU runtime's unit tests for
# HIP), and the plugin with the ROCm handlers is linted. Debian installs ROCm under /usr.
# (scripts/hip_check.sh compiles the same sources with hipcc; CI leaves it out as it checks
# nothing the hipRTC test does not.)
export ROCM_PATH=${ROCM_PATH:-/usr}
step "ROCm: clippy and tests of the rocm feature (ROCM_PATH=$ROCM_PATH)"
cargo clippy -p peerless-ffi -p peerless-kernels -p peerless-emitter -p peerless-plugin -p peerless-pjrt \
  --features peerless-kernels/rocm,peerless-plugin/rocm --all-targets --locked -- -D warnings
cargo test -p peerless-ffi -p peerless-kernels -p peerless-plugin --features peerless-kernels/rocm,peerless-plugin/rocm \
  --locked --lib --test rocm_hiprtc

step "JAX $("$PEERLESS_PYTHON" -c 'import jax; print(jax.__version__)') on JAX_PLATFORMS=peerless (XLA's CPU plugin wrapped) vs JAX's CPU backend (plugin/tests/test_jax.py)"
# The workspace, not `-p peerless-pjrt`: `cargo test --workspace` above built the library with
# the workspace's features (clap's among them), so this builds nothing; `-p` alone would
# rebuild it and its proc-macro dependencies with a smaller feature set (about a minute).
cargo build --workspace --locked
target_dir=$(cargo metadata --format-version 1 --no-deps | "$PEERLESS_PYTHON" -c "import json,sys; print(json.load(sys.stdin)['target_directory'])")
lib="$target_dir/debug/libpeerless_pjrt.so"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python CI="${CI:-}" "$PEERLESS_PYTHON" -m pytest -q plugin/tests/test_jax.py

step "Peerless inside XLA: XLA:CPU, 8 host devices, every program vs XLA alone (plugin/tests/test_xla_inside.py, test_fused_norm.py)"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python "$PEERLESS_PYTHON" -m pytest -q plugin/tests/test_xla_inside.py \
  plugin/tests/test_fused_norm.py

step "The README's first Python block as pasted, and the bench plot (plugin/tests/test_readme.py, test_plot.py)"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python "$PEERLESS_PYTHON" -m pytest -q plugin/tests/test_readme.py \
  plugin/tests/test_plot.py

step "Every collective form vs XLA alone, the kernels forced: XLA:CPU, 8 host devices (plugin/tests/collective_sweep.py --quick)"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python "$PEERLESS_PYTHON" plugin/tests/collective_sweep.py --platform cpu \
  --devices 8 --quick

step "Programs as users write them vs XLA alone on XLA:CPU: a process per device with PEERLESS_ENABLE=1, JAX's async collectives, user layouts (plugin/tests/gpu_user_forms.py)"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python "$PEERLESS_PYTHON" plugin/tests/gpu_user_forms.py --platform cpu

step "The GPU benchmark and accuracy scripts run on XLA:CPU (4 host devices; results vs XLA alone, not timings)"
XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python \
  "$PEERLESS_PYTHON" plugin/tests/bench_programs.py --out "${TMPDIR:-/tmp}/peerless-bench-programs" --modes stock,peerless \
  --programs psum_chain,moe,ring_attention,dp_step,tpdp_train_tiny --rounds 1 --iters 2 --repeats 1
XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python \
  "$PEERLESS_PYTHON" plugin/tests/gpu_accuracy.py --no-decode

step "Tuning profiles: a short peerless tune on XLA:CPU (8 host devices), then the pass reads the profile and its decisions cite it (plugin/tests/test_tuning.py)"
tune_dir=$(mktemp -d)
PEERLESS_VENV_DIR="$venv_root" cargo run -q -p peerless-cli --locked -- tune --quick --out-dir "$tune_dir" >"$tune_dir/crossovers.md"
tuned=$(ls "$tune_dir"/*.json)
PEERLESS_TUNED_PROFILE="$tuned" PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python "$PEERLESS_PYTHON" -m pytest -q plugin/tests/test_tuning.py
rm -rf "$tune_dir"

step "The demo on the debug library (examples/inside_xla.py: decisions as configured and with the kernels forced, agreement with XLA alone)"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python "$PEERLESS_PYTHON" examples/inside_xla.py --steps 3

step "Many processes: jax.distributed, 2 processes × 4 CPU devices, groups across them on shared memory, faults (plugin/tests/test_multiprocess.py)"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python "$PEERLESS_PYTHON" -m pytest -q plugin/tests/test_multiprocess.py

step "JAX_PLATFORMS=peerless wrapping XLA's CPU plugin: programs vs JAX's CPU backend (plugin/tests/test_wrap.py)"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python CI="${CI:-}" "$PEERLESS_PYTHON" -m pytest -q plugin/tests/test_wrap.py

jax012_python="$venv_root/jax012/bin/python"
step "JAX $("$jax012_python" -c 'import jax; print(jax.__version__)') (the current release): inside XLA, many processes, the wrapper (test_xla_inside.py, test_multiprocess.py, test_wrap.py)"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python "$jax012_python" -m pytest -q plugin/tests/test_xla_inside.py \
  plugin/tests/test_multiprocess.py
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python CI="${CI:-}" "$jax012_python" -m pytest -q plugin/tests/test_wrap.py

step "PJRT conformance (pypjrt): the wrapper vs XLA's CPU plugin alone (scripts/conform_wrap.py)"
"$PEERLESS_PYTHON" scripts/conform_wrap.py "$lib"

# The saved fuzz corpora replay in `cargo test` above (fuzz/tests/corpus.rs). The smoke fuzz
# runs libFuzzer for 10 s per target on the stable toolchain: cargo-fuzz's flags are nightly
# ones, which RUSTC_BOOTSTRAP=1 admits, and `-s none` leaves out AddressSanitizer (it needs
# nightly's std; the parsers are safe Rust, so a crash is a panic or an abort either way). The
# long runs in docs/RELIABILITY.md use nightly with ASan. New inputs go to a temporary
# directory; a crash fails this script and leaves its input in fuzz/libfuzzer/artifacts/.
step "Smoke fuzz: 10 s per target, libFuzzer on stable (docs/RELIABILITY.md)"
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz --version 0.13.2
fi
echo "(the first target builds the fuzz project: several minutes on 2 cores)"
for t in hlo_text hlo_proto compile_options npz flags xla_pass; do
  work=$(mktemp -d)
  mkdir "$work/new"
  if ! RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz/libfuzzer -s none -O "$t" "$work/new" "fuzz/corpus/$t" -- \
    -max_total_time=10 -rss_limit_mb=2048 -timeout=20 >"$work/log" 2>&1; then
    tail -40 "$work/log"
    echo "smoke fuzz of $t failed (the input is in fuzz/libfuzzer/artifacts/$t/)"
    exit 1
  fi
  echo "$t: $(grep -E '^Done [0-9]+ runs' "$work/log" | tail -1)"
  rm -rf "$work"
done

step "pip install ./plugin/python (bundling the library built above); JAX finds the plugin by itself"
# `pip install ./plugin/python` alone runs a release build (well over 5 minutes on 2 cores), so CI
# bundles the debug library through PEERLESS_PJRT_LIBRARY and installs it without build isolation
# into a throwaway venv that sees the JAX venv's packages (jax, setuptools, wheel; a .pth file
# names its site-packages); then, outside the checkout and with no PEERLESS_* / PYTHONPATH, JAX
# lists the devices.
venv_dir=$(mktemp -d)
"$PEERLESS_PYTHON" -m venv "$venv_dir/venv"
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
purelib "$PEERLESS_PYTHON" >"$(purelib "$venv_dir/venv/bin/python")/peerless_jax_venv.pth"
PEERLESS_PJRT_LIBRARY="$lib" "$venv_dir/venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-build-isolation ./plugin/python
(cd "$venv_dir" && env -u PEERLESS_PJRT_LIBRARY -u PYTHONPATH JAX_PLATFORMS=peerless "$venv_dir/venv/bin/python" -c '
import os, jax, jax_plugins.peerless as p
assert os.path.realpath(p.library_path()).startswith(os.path.realpath(p.__path__[0])), p.library_path()
print(jax.devices())
assert len(jax.devices("peerless")) == 8 and p.wrapped() == "cpu", (jax.devices(), p.wrapped())
assert jax.devices()[0] == jax.devices("peerless")[0]')
# Without JAX_PLATFORMS the package changes nothing (JAX's own CPU backend stays the default),
# and the bundled command runs through its console script.
(cd "$venv_dir" && env -u PEERLESS_PJRT_LIBRARY -u PYTHONPATH -u JAX_PLATFORMS "$venv_dir/venv/bin/python" -c '
import jax, jax_plugins.peerless as p
assert jax.default_backend() == "cpu" and "peerless" not in str(jax.devices()), jax.devices()
print("jax-peerless", p.__version__)' && "$venv_dir/venv/bin/peerless" --version)
rm -rf "$venv_dir"

step "pip install ./plugin/python beside JAX 0.12.0.1 keeps it, and enable() runs a psum on Peerless"
venv_dir=$(mktemp -d)
"$jax012_python" -m venv "$venv_dir/venv"
purelib "$jax012_python" >"$(purelib "$venv_dir/venv/bin/python")/peerless_jax_venv.pth"
PEERLESS_PJRT_LIBRARY="$lib" "$venv_dir/venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-build-isolation ./plugin/python
(cd "$venv_dir" && env -u PEERLESS_PJRT_LIBRARY -u PYTHONPATH JAX_PLATFORMS=cpu \
  XLA_FLAGS=--xla_force_host_platform_device_count=8 "$venv_dir/venv/bin/python" -c '
import numpy as np, jax, jax_plugins.peerless as p
from jax.sharding import Mesh, PartitionSpec as P
assert jax.__version__ == "0.12.0.1", jax.__version__
mesh = Mesh(np.array(jax.devices()), ("i",))
f = lambda: jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
x = np.arange(64.0, dtype=np.float32)
want = np.asarray(f()(x))
assert p.enable("cpu") == ["cpu"]
jax.clear_caches()
got = np.asarray(f()(x))
np.testing.assert_array_equal(got, want)
assert p.stats()["all-reduce"]["kernel"] == 1, p.stats()
print("jax", jax.__version__, "kept; psum on Peerless equals XLA alone:", p.stats())')
rm -rf "$venv_dir"

# The wheel step bundles the compute_80 PTX that `cargo test` compiled above (every unit,
# cuda_nvrtc.rs) instead of compiling every unit again for sm_90 (the bundle code is the same
# for any target list), and builds the library on the dev profile, whose dependencies `cargo
# test` built: a release build of the whole graph takes over 15 minutes on 2 cores. What it
# checks is the packaging: the manylinux tag, the embedded kernels, an install without cargo.
step "The wheel: scripts/build_wheel.sh (library with the GPU kernels of cargo test embedded, PTX for compute_80; manylinux tag from auditwheel); scripts/check_wheel.sh installs it in a fresh venv without cargo and runs plugin/tests/wheel_smoke.py"
wheel_start=$(date +%s)
wheel_dir=$(mktemp -d)
[ -s "$test_bundle" ] || { echo "cargo test left no kernel bundle in $test_bundle (NVRTC missing?)" >&2; exit 1; }
PEERLESS_WHEEL_PROFILE=dev scripts/build_wheel.sh --kernels "$test_bundle" "$wheel_dir"
scripts/check_wheel.sh "$wheel_dir"/jax_peerless-*.whl --kernels compute_80
rm -rf "$wheel_dir"
echo "the wheel step took $(($(date +%s) - wheel_start)) s"

if [ "${PEERLESS_SKIP_GOLDEN_CHECK:-0}" != "1" ]; then
  step "XLA goldens are reproducible (hlo-tests/gen_goldens.py --check, JAX $("$goldens_python" -c 'import jax; print(jax.__version__)'))"
  "$goldens_python" hlo-tests/gen_goldens.py --check
fi
echo "scripts/test.sh: all checks passed"
