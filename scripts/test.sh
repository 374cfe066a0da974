#!/usr/bin/env bash
# The test command: everything CI checks, runnable on a fresh machine.
#   scripts/test.sh            # setup, fmt, clippy, cargo test, XLA golden check
# Set PEERLESS_SKIP_GOLDEN_CHECK=1 to skip re-running XLA (needs jax 0.10.2).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked

# ROCm without AMD hardware: the rocm feature (off by default) is linted and its tests run
# (hipRTC compiles every kernel source for gfx90a through Debian's libamdhip64), and hipcc
# compiles every kernel source. Debian installs ROCm under /usr.
export ROCM_PATH=${ROCM_PATH:-/usr}
step "ROCm: clippy and tests of the rocm feature (ROCM_PATH=$ROCM_PATH)"
cargo clippy -p peerless-ffi -p peerless-kernels -p peerless-emitter --features peerless-kernels/rocm \
  --all-targets --locked -- -D warnings
cargo test -p peerless-ffi -p peerless-kernels --features peerless-kernels/rocm --locked --lib --test rocm_hiprtc

step "ROCm: every kernel source compiles with hipcc (scripts/hip_check.sh)"
scripts/hip_check.sh

step "JAX 0.10.2 runs programs on the PJRT plugin vs JAX's CPU backend (plugin/tests/test_jax.py)"
cargo build -p peerless-pjrt --locked
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c "import json,sys; print(json.load(sys.stdin)['target_directory'])")
lib="$target_dir/debug/libpeerless_pjrt.so"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python python3 -m pytest -q plugin/tests/test_jax.py

step "Collective faults reach JAX as exceptions; the client recovers (plugin/tests/test_faults.py)"
PEERLESS_PJRT_LIBRARY="$lib" PYTHONPATH=plugin/python python3 -m pytest -q plugin/tests/test_faults.py

# The saved fuzz corpora replay in `cargo test` above (fuzz/tests/corpus.rs). The smoke fuzz
# runs libFuzzer for 20 s per target on the stable toolchain: cargo-fuzz's flags are nightly
# ones, which RUSTC_BOOTSTRAP=1 admits, and `-s none` leaves out AddressSanitizer (it needs
# nightly's std; the parsers are safe Rust, so a crash is a panic or an abort either way). The
# long runs in docs/RELIABILITY.md use nightly with ASan. New inputs go to a temporary
# directory; a crash fails this script and leaves its input in fuzz/libfuzzer/artifacts/.
step "Smoke fuzz: 20 s per target, libFuzzer on stable (docs/RELIABILITY.md)"
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz --version 0.13.2
fi
echo "(the first target builds the fuzz project: several minutes on 2 cores)"
for t in hlo_text hlo_proto compile_options npz flags; do
  work=$(mktemp -d)
  mkdir "$work/new"
  if ! RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz/libfuzzer -s none -O "$t" "$work/new" "fuzz/corpus/$t" -- \
    -max_total_time=20 -rss_limit_mb=2048 -timeout=20 >"$work/log" 2>&1; then
    tail -40 "$work/log"
    echo "smoke fuzz of $t failed (the input is in fuzz/libfuzzer/artifacts/$t/)"
    exit 1
  fi
  echo "$t: $(grep -E '^Done [0-9]+ runs' "$work/log" | tail -1)"
  rm -rf "$work"
done

step "pip install ./plugin/python (bundling the library built above); JAX finds the plugin by itself"
# `pip install ./plugin/python` alone runs a release build (well over 5 minutes on 2 cores), so CI
# bundles the debug library through PEERLESS_PJRT_LIBRARY and installs without build isolation
# (setuptools + wheel from hlo-tests/requirements.txt) into a throwaway venv that sees the system's
# jax/jaxlib; then, outside the checkout and with no PEERLESS_* / PYTHONPATH, JAX lists the devices.
venv_dir=$(mktemp -d)
python3 -m venv --system-site-packages "$venv_dir/venv"
PEERLESS_PJRT_LIBRARY="$lib" "$venv_dir/venv/bin/pip" install -q --no-build-isolation ./plugin/python
(cd "$venv_dir" && env -u PEERLESS_PJRT_LIBRARY -u PYTHONPATH JAX_PLATFORMS=peerless "$venv_dir/venv/bin/python" -c '
import os, jax, jax_plugins.peerless as p
assert os.path.realpath(p.library_path()).startswith(os.path.realpath(p.__path__[0])), p.library_path()
print(jax.devices())
assert len(jax.devices()) == 8 and jax.devices()[0].platform == "peerless"')
rm -rf "$venv_dir"

if [ "${PEERLESS_SKIP_GOLDEN_CHECK:-0}" != "1" ]; then
  step "XLA goldens are reproducible (hlo-tests/gen_goldens.py --check)"
  python3 hlo-tests/gen_goldens.py --check
fi
echo "scripts/test.sh: all checks passed"
