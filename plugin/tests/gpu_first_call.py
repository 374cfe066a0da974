#!/usr/bin/env python3
"""The first call of a program with a collective, as a new user meets it: a fresh process and an
empty Peerless kernel cache for every case, timed from before `import jax` to the first result.

Cases (each `jit(shard_map(psum))` over one GPU, 1 MiB of f32):
  stock              JAX alone
  enabled            PEERLESS_ENABLE=1 (the pass inside JAX's CUDA backend)
  wrapped            JAX_PLATFORMS=peerless (XLA's CUDA plugin wrapped)
  enabled+kernel     PEERLESS_ENABLE=1 with --all_reduce_backend=kernel: the GPU is opened and
                     the base kernels loaded (a group of one device then copies)
  2proc+kernel       the same psum as a job of two processes sharing GPU 0 (jax.distributed),
                     forced onto the kernel: the one-shot f32 sum really runs (CUDA IPC); the
                     column shows the slower process. Stock JAX cannot run this job (NCCL
                     refuses two ranks on one GPU), so compare it with `stock`.
  *-no-prebuilt      the kernel cases with PEERLESS_PREBUILT_KERNELS=0: what a GPU without
                     prebuilt code pays (NVRTC compiles the units the program launches)
A group of one device falls back for a reason known without a GPU, so the first three should
cost the same. Every case gets an empty Peerless kernel cache.

    PEERLESS_PJRT_LIBRARY=$PWD/.gpu/libpeerless_pjrt.so PYTHONPATH=$PWD/plugin/python \\
      python3 plugin/tests/gpu_first_call.py [--out DIR] [--skip-kernel]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from jobs import free_port, run_workers

CHILD = r"""
import time, json, os
t0 = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
t_import = time.perf_counter() - t0
dev = jax.devices()[:1]
mesh = Mesh(np.array(dev), ("i",))
f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
x = jnp.ones((512, 512), jnp.float32)
t1 = time.perf_counter()
y = np.asarray(jax.block_until_ready(f(x)))
t_first = time.perf_counter() - t1
t2 = time.perf_counter()
jax.block_until_ready(f(x))
t_second = time.perf_counter() - t2
ok = bool((y == 1.0).all())
stats = None
try:
    import jax_plugins.peerless as p
    stats = p.stats()
except Exception:
    pass
print(json.dumps({"platform": dev[0].platform, "import_s": t_import, "first_call_s": t_first,
                  "second_call_s": t_second, "total_s": time.perf_counter() - t0, "ok": ok, "stats": stats}))
"""

CHILD_2PROC = r"""
import time, json, os, sys
t0 = time.perf_counter()
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
pid, port = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid, local_device_ids=[0])
t_import = time.perf_counter() - t0
mesh = Mesh(np.array(jax.devices()), ("i",))
f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), np.full((512, 512), pid + 1, np.float32))
t1 = time.perf_counter()
y = np.asarray(jax.block_until_ready(f(x)).addressable_shards[0].data)
t_first = time.perf_counter() - t1
t2 = time.perf_counter()
jax.block_until_ready(f(x))
t_second = time.perf_counter() - t2
import jax_plugins.peerless as p
print(json.dumps({"platform": "cuda", "import_s": t_import, "first_call_s": t_first, "second_call_s": t_second,
                  "total_s": time.perf_counter() - t0, "ok": bool((y == 3.0).all()), "stats": p.stats()}))
"""

KERNEL_FLAGS = {"PEERLESS_ENABLE": "1", "PEERLESS_FLAGS": "--all_reduce_backend=kernel"}
TWO_PROC = {**KERNEL_FLAGS, "PEERLESS_XLA_PLUGIN": "none", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}

CASES = {
    "stock": {},
    "enabled": {"PEERLESS_ENABLE": "1"},
    "wrapped": {"JAX_PLATFORMS": "peerless"},
    "enabled+kernel": KERNEL_FLAGS,
    "2proc+kernel": TWO_PROC,
    "enabled+kernel-no-prebuilt": {**KERNEL_FLAGS, "PEERLESS_PREBUILT_KERNELS": "0"},
    "2proc+kernel-no-prebuilt": {**TWO_PROC, "PEERLESS_PREBUILT_KERNELS": "0"},
}


def main() -> int:
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    rows = {}
    print(f"{'case':26s} {'first call s':>12s} {'second s':>9s} {'import s':>9s} {'process s':>9s}  result")
    for name, extra in CASES.items():
        if "+kernel" in name and "--skip-kernel" in sys.argv:
            continue
        cache = tempfile.mkdtemp(prefix="peerless-cold-cache-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEERLESS_") or k == "PEERLESS_PJRT_LIBRARY"}
        env.update(PEERLESS_CACHE_DIR=cache, XDG_CACHE_HOME=cache, NCCL_NVLS_ENABLE="0",
                   JAX_COMPILATION_CACHE_DIR="", JAX_ENABLE_COMPILATION_CACHE="false")
        env.setdefault("JAX_PLATFORMS", "cuda")
        env.update(extra)
        t0 = time.perf_counter()
        if name.startswith("2proc"):
            port = free_port()
            reps = run_workers(lambda i: [sys.executable, "-c", CHILD_2PROC, str(i), str(port)], 2, env, 600)
            wall = time.perf_counter() - t0
            if all("first_call_s" in x for x in reps):
                rep = max(reps, key=lambda x: x["first_call_s"])
                rep["ok"] = all(x["ok"] for x in reps)
            else:
                rep = {"error": " | ".join(x["stderr"][-700:] for x in reps)}
        else:
            r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
            wall = time.perf_counter() - t0
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
            rep = json.loads(lines[-1]) if lines else {"error": r.stderr[-1500:]}
        rep["process_s"] = wall
        rows[name] = rep
        res = "ok" if rep.get("ok") else ("WRONG" if "ok" in rep else rep.get("error", "")[-300:])
        print(f"{name:26s} {rep.get('first_call_s', float('nan')):>12.2f} {rep.get('second_call_s', float('nan')):>9.3f} "
              f"{rep.get('import_s', float('nan')):>9.2f} {wall:>9.1f}  {res} {rep.get('stats') or ''}", flush=True)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "gpu_first_call.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
    ok = all(r.get("ok") for r in rows.values())
    base = rows.get("stock", {}).get("first_call_s")
    for name in [n for n in CASES if n != "stock"]:
        t = rows.get(name, {}).get("first_call_s")
        if base is not None and t is not None:
            print(f"{name}: first call {t - base:+.2f} s vs stock")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
