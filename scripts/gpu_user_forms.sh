#!/usr/bin/env bash
# Programs as users write them, on the device machine: installs the wheel (dist-gpu/, carried) into the
# image's Python as a user does, then runs parts of plugin/tests/gpu_user_forms.py, each in
# a time limit, with output in $OUT.  scripts/gpu_user_forms.sh PART[,PART...] [SECONDS]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset PEERLESS_PJRT_LIBRARY
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --force-reinstall dist-gpu/jax_peerless-*.whl 2>&1 | tail -2
python3 -c 'import jax, jax_plugins.peerless as p; print("jax", jax.__version__, "peerless", p.__version__, p.library_path())'
nvidia-smi -L
rc=0
IFS=, read -ra parts <<<"${1:-multiprocess,async,layouts}"
for part in "${parts[@]}"; do
  t0=$SECONDS
  timeout -k 10 "${2:-280}" python3 plugin/tests/gpu_user_forms.py --platform cuda --parts "$part" --out "$OUT/$part" \
    >"$OUT/$part.txt" 2>&1
  r=$?
  echo "== $part: rc=$r in $((SECONDS - t0)) s"
  grep -v "^W\|^I0\|^E0" "$OUT/$part.txt" | tail -60
  [ $r -eq 0 ] || rc=1
done
exit $rc
