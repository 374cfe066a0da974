#!/usr/bin/env python3
"""The first call of a program with a collective, as a new user meets it: a fresh process and an
empty Peerless kernel cache for every case, timed from before `import jax` to the first result.

Cases (each `jit(shard_map(psum))` over one GPU, 1 MiB of f32):
  stock              JAX alone
  enabled            PEERLESS_ENABLE=1 (the pass inside JAX's CUDA backend)
  wrapped            JAX_PLATFORMS=peerless (XLA's CUDA plugin wrapped)
  enabled+kernel     PEERLESS_ENABLE=1 with --all_reduce_backend=kernel (a kernel really runs)
A group of one device falls back for a reason known without a GPU, so the first three should
cost the same; the last one loads (on a cold cache: compiles) the kernels.

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

CASES = {
    "stock": {},
    "enabled": {"PEERLESS_ENABLE": "1"},
    "wrapped": {"JAX_PLATFORMS": "peerless"},
    "enabled+kernel": {"PEERLESS_ENABLE": "1", "PEERLESS_FLAGS": "--all_reduce_backend=kernel"},
}


def main() -> int:
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    rows = {}
    print(f"{'case':16s} {'first call s':>12s} {'second s':>9s} {'import s':>9s} {'process s':>9s}  result")
    for name, extra in CASES.items():
        if name.endswith("+kernel") and "--skip-kernel" in sys.argv:
            continue
        cache = tempfile.mkdtemp(prefix="peerless-cold-cache-")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEERLESS_") or k == "PEERLESS_PJRT_LIBRARY"}
        env.update(PEERLESS_CACHE_DIR=cache, XDG_CACHE_HOME=cache, NCCL_NVLS_ENABLE="0",
                   JAX_COMPILATION_CACHE_DIR="", JAX_ENABLE_COMPILATION_CACHE="false")
        env.setdefault("JAX_PLATFORMS", "cuda")
        env.update(extra)
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - t0
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        rep = json.loads(lines[-1]) if lines else {"error": r.stderr[-1500:]}
        rep["process_s"] = wall
        rows[name] = rep
        res = "ok" if rep.get("ok") else ("WRONG" if "ok" in rep else rep.get("error", "")[-300:])
        print(f"{name:16s} {rep.get('first_call_s', float('nan')):>12.2f} {rep.get('second_call_s', float('nan')):>9.3f} "
              f"{rep.get('import_s', float('nan')):>9.2f} {wall:>9.1f}  {res} {rep.get('stats') or ''}", flush=True)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "gpu_first_call.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
    ok = all(r.get("ok") for r in rows.values())
    base = rows.get("stock", {}).get("first_call_s")
    for name in ("enabled", "wrapped"):
        t = rows.get(name, {}).get("first_call_s")
        if base is not None and t is not None:
            print(f"{name}: first call {t - base:+.2f} s vs stock")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
