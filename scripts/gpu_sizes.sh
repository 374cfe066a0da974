#!/usr/bin/env bash
# All-reduce kernels by size on the device machine: the kernels' own GPU tests (.gpu/, from
# scripts/gpu_build.sh), then plugin/tests/bench_sizes.py with each carried wheel installed
# as a variant (pip install --target, as a user's site-packages) beside XLA alone.
#   scripts/gpu_sizes.sh NAME=WHEELDIR [NAME=WHEELDIR...]    (extra bench_sizes.py options in SIZES_ARGS)
# Output in $OUT: tests.txt, sizes.txt, sizes.json.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset PEERLESS_PJRT_LIBRARY PEERLESS_ENABLE
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi -L
variants=()
for v in "$@"; do
  name=${v%%=*} dir=${v#*=}
  python3 -m pip install -q --no-deps --target "/tmp/pl_$name" "$dir"/jax_peerless-*.whl 2>&1 | tail -2
  variants+=(--variant "$name=/tmp/pl_$name")
done
rc=0
if [ -x .gpu/cuda_collectives ] && [ -z "${SKIP_TESTS:-}" ]; then
  t0=$SECONDS
  timeout -k 10 240 .gpu/cuda_collectives --ignored --test-threads=1 all_reduce float_algorithms repeated \
    >"$OUT/tests.txt" 2>&1 || rc=1
  echo "== kernel tests: rc=$rc in $((SECONDS - t0)) s"
  grep -E "^test |test result|panicked|differs" "$OUT/tests.txt" | head -20
fi
t0=$SECONDS
# shellcheck disable=SC2086
timeout -k 10 "${SIZES_SECONDS:-420}" python3 plugin/tests/bench_sizes.py "${variants[@]}" ${SIZES_ARGS:-} \
  --out "$OUT/sizes.json" >"$OUT/sizes.txt" 2>"$OUT/sizes.err" || rc=1
echo "== bench_sizes in $((SECONDS - t0)) s"
cat "$OUT/sizes.txt"
grep -v "^W\|^I0\|^E0" "$OUT/sizes.err" | tail -15
exit $rc
