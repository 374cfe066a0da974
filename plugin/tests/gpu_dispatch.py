#!/usr/bin/env python3
"""Where the per-call time of `JAX_PLATFORMS=peerless` on one GPU goes, beside stock JAX.

A diagnosis script for the device tool, not a test. Configurations, each in its own process,
alternated over several rounds (the order of rounds rotates):
  stock      JAX_PLATFORMS=cuda
  nopass     JAX_PLATFORMS=peerless, PEERLESS_ENABLE=0 (the wrapper, no pass)
  peerless   JAX_PLATFORMS=peerless (the pass on: as users run it)
  noop       nopass + a Python pass that does nothing, registered before compiling
  late       nopass; programs compiled first, timed, then a no-op pass registered and the
             same executables timed again ("late_" rows) and fresh compiles timed ("fresh_" rows)
Per program: median over 7 × CALLS calls of the host time to enqueue (`enq`) and of the time
to enqueue and finish (`tot`), µs per call, and how many calls took JAX's Python dispatch path
instead of its C++ fast path.

    python3 plugin/tests/gpu_dispatch.py --out DIR [--rounds 3] [--configs stock,nopass,...]
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CALLS = int(os.environ.get("GPU_DISPATCH_CALLS", "200"))
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def programs():
    import numpy as np

    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P

    sys.path.insert(0, HERE)
    from gpu_xla_inside import compute_programs

    all_progs = compute_programs()
    progs = {k: all_progs[k] for k in ("matmul_f32_1024", "softmax_xent", "elementwise_chain")}
    progs["tiny_add"] = (lambda v: v * 2.0 + 1.0, (jnp.ones((1, 256), jnp.float32),))
    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    progs["psum_1_device"] = (jax.shard_map(lambda v: jax.lax.psum(v * 2.0, "x") + 1.0, mesh=mesh,
                                            in_specs=P("x"), out_specs=P("x")),
                              (jnp.ones((1, 4096), jnp.float32),))
    return progs


def timed(f, args):
    import jax

    enq, tot = [], []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            r = f(*args)
        t1 = time.perf_counter()
        jax.block_until_ready(r)
        t2 = time.perf_counter()
        enq.append((t1 - t0) / CALLS * 1e6)
        tot.append((t2 - t0) / CALLS * 1e6)
    return sorted(enq)[3], sorted(tot)[3]


def child(cfg):
    import jax

    from jax._src import pjit

    slow = {"n": 0}
    orig = pjit._pjit_call_impl_python

    def counted(*a, **k):
        slow["n"] += 1
        return orig(*a, **k)

    pjit._pjit_call_impl_python = counted

    def noop_pass():
        from jax.extend import xla as jxla

        jxla.register_hlo_module_transformation(lambda m: None, name="noop", platforms=[jax.default_backend()
                                                if cfg == "stock" else "peerless"])

    jax.devices()
    if cfg == "noop":
        noop_pass()
    progs = programs()
    rows = {}
    compiled = {}
    for name, (fn, args) in progs.items():
        f = jax.jit(fn)
        jax.block_until_ready(f(*args))
        before = slow["n"]
        e, t = timed(f, args)
        rows[name] = {"enq": e, "tot": t, "python_path": slow["n"] - before}
        compiled[name] = (f, args)
    if cfg == "late":
        noop_pass()
        for name, (f, args) in compiled.items():
            e, t = timed(f, args)
            rows["late_" + name] = {"enq": e, "tot": t}
        for name, (fn, args) in progs.items():
            f = jax.jit(lambda *a, fn=fn: fn(*a))  # a new function: compiled with the pass registered
            jax.block_until_ready(f(*args))
            e, t = timed(f, args)
            rows["fresh_" + name] = {"enq": e, "tot": t}
    info = {"rows": rows, "platform": jax.devices()[0].platform}
    if os.environ.get("JAX_PLATFORMS") == "peerless":
        from jax_plugins.peerless import inside

        info["stats"] = inside.stats()
    print(json.dumps(info))


def main():
    if sys.argv[1:2] == ["_child"]:
        child(sys.argv[2])
        return 0
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "gpu_dispatch_out"
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    cfgs = (sys.argv[sys.argv.index("--configs") + 1].split(",") if "--configs" in sys.argv
            else ["stock", "nopass", "peerless", "noop", "late"])
    os.makedirs(out, exist_ok=True)
    runs = {c: [] for c in cfgs}
    for rnd in range(rounds):
        order = cfgs[rnd % len(cfgs):] + cfgs[:rnd % len(cfgs)]
        for cfg in order:
            env = dict(os.environ, **SAFE_ENV)
            env.pop("PEERLESS_XLA_PLUGIN", None)
            env["JAX_PLATFORMS"] = "cuda" if cfg == "stock" else "peerless"
            env.pop("PEERLESS_ENABLE", None)
            if cfg in ("nopass", "noop", "late"):
                env["PEERLESS_ENABLE"] = "0"
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "_child", cfg], env=env,
                               capture_output=True, text=True, timeout=600)
            lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
            if p.returncode or not lines:
                print(f"{cfg} round {rnd}: FAILED rc={p.returncode}\n{(p.stderr or p.stdout)[-3000:]}")
                return 1
            runs[cfg].append(json.loads(lines[-1]))
            print(f"round {rnd} {cfg} done", flush=True)
    with open(os.path.join(out, "gpu_dispatch.json"), "w") as fh:
        json.dump(runs, fh, indent=1)
    names = list(runs[cfgs[0]][0]["rows"])
    print(f"\nµs per call, best round of {rounds} (enqueue / total); python = calls on JAX's Python path")
    print(f"{'program':24s}" + "".join(f"{c:>18s}" for c in cfgs))
    allnames = names + [n for n in runs.get("late", [{"rows": {}}])[0]["rows"] if n not in names]
    for name in allnames:
        cells = []
        for c in cfgs:
            rs = [r["rows"][name] for r in runs[c] if name in r["rows"]]
            if not rs:
                cells.append(f"{'':>18s}")
                continue
            e, t = min(r["enq"] for r in rs), min(r["tot"] for r in rs)
            py = max(r.get("python_path", 0) for r in rs)
            cells.append(f"{e:7.1f} /{t:7.1f}{'*' if py else ' '} ")
        print(f"{name:24s}" + "".join(cells))
    print("(* = some timed calls took the Python path)")
    print("stats:", {c: runs[c][0].get("stats") for c in cfgs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
