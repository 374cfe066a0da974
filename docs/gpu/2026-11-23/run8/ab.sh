# A/B: the CUDA handlers with and without the INSTANTIATE stage (executable state), same machine.
set -u
mkdir -p /tmp/noinst/jax_plugins && cp -r plugin/python/jax_plugins/peerless /tmp/noinst/jax_plugins/
sed -i 's/stages = {"instantiate": cap, "initialize": cap, "execute": cap}/stages = {"initialize": cap, "execute": cap}/' /tmp/noinst/jax_plugins/peerless/inside.py
grep -n 'stages = ' /tmp/noinst/jax_plugins/peerless/inside.py
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PEERLESS_PJRT_LIBRARY="$PWD/.gpu/libpeerless_pjrt.so" PYTHONUNBUFFERED=1 PEERLESS_CACHE_DIR=/tmp/peerless-kernel-cache JAX_PLATFORMS=cuda
for r in A B A B; do
  if [ $r = A ]; then pp=$PWD/plugin/python; else pp=/tmp/noinst; fi
  echo "== $r (PYTHONPATH=$pp)"
  PYTHONPATH=$pp timeout 300 python3 plugin/tests/gpu_xla_inside.py bench --out $OUT/ab_$r --sizes 1024,65536 2>&1 | grep -E "µs|psum/|dp_mlp|tp_decode|ERROR"
done
