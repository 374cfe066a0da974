#!/usr/bin/env bash
# Builds the release binaries scripts/gpu_check.sh runs and copies them to BINDIR (default
# .gpu, ignored by git; pass it to the device tool's `carry`). x86-64 Linux, no CUDA needed.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-.gpu}
mkdir -p "$BIN"
cargo build --release --locked -p peerless-cli -p peerless-pjrt
target=$(cargo metadata --format-version 1 --no-deps | python3 -c "import json,sys; print(json.load(sys.stdin)['target_directory'])")
cp "$target/release/peerless" "$target/release/libpeerless_pjrt.so" "$BIN/"
for t in cuda_collectives; do
  exe=$(cargo test --release --locked -p peerless-kernels --test "$t" --no-run --message-format=json 2>/dev/null |
    python3 -c "import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get('reason') == 'compiler-artifact' and m.get('executable') and m['target']['name'] == '$t':
        print(m['executable'])")
  cp "$exe" "$BIN/$t"
done
strip "$BIN"/* && ls -la "$BIN"
