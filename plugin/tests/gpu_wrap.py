#!/usr/bin/env python3
"""`JAX_PLATFORMS=peerless` wrapping XLA's CUDA plugin vs stock JAX on CUDA, one GPU.

Each configuration runs in its own process, pinned to the same 4 CPU cores (host dispatch
dominates these small programs, and a process's placement moved it by ±20%); the parent
alternates them, GPU_WRAP_ROUNDS (default 3) rounds in rotating order, and takes each
configuration's best round:
  stock    : JAX_PLATFORMS=cuda
  peerless : JAX_PLATFORMS=peerless: libpeerless_pjrt.so finds the installed jax-cuda13-pjrt
             plugin itself and hands JAX its table, with Peerless's handlers registered and
             Peerless's pass on.
  nopass   : the same with PEERLESS_ENABLE=0 (the wrapper without the pass), to tell the
             pass's cost from the platform's.
Per program: median µs per call over 5 × GPU_WRAP_CALLS (default 1000) calls (`us`), and the host time to enqueue
them (`enqueue_us`, per call). Windows of 20 calls moved host-bound programs by tens of µs and showed
a conv-net gap that 1000-call windows do not (docs/PERFORMANCE.md, 2026-11-25); the best round's ratio and the median round's; whether every
process compiled the same optimized HLO (XLA's autotuner picks per process:
GPU_WRAP_XLA_FLAGS="--xla_gpu_per_fusion_autotune_cache_dir=DIR" makes them share its picks).
Programs: matmul f32 / bf16, an MLP train step, a transformer block, softmax cross-entropy,
an elementwise chain, a small conv net, and a one-device psum (which the pass leaves to XLA,
since no device meets another: a custom call there cost a launch and split XLA's fusions). Results compared. `--noop`: also with a no-op pass registered instead.
    python3 plugin/tests/gpu_wrap.py --out DIR
"""

import json
import os
import subprocess
import sys
import time

CALLS = int(os.environ.get("GPU_WRAP_CALLS", "1000"))
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def cuda_plugin_path():
    import importlib.util

    for name in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        spec = importlib.util.find_spec(name)
        if spec and spec.submodule_search_locations:
            for d in spec.submodule_search_locations:
                p = os.path.join(d, "xla_cuda_plugin.so")
                if os.path.exists(p):
                    return p
    sys.exit("no jax-cuda13/12-pjrt plugin installed")


def conv_net():
    """A small conv net (two 3×3 convolutions, ReLU, mean) and its inputs: (fn, args)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(1)
    k1 = jnp.asarray(rng.standard_normal((3, 3, 16, 32)) * 0.1, jnp.float32)
    k2 = jnp.asarray(rng.standard_normal((3, 3, 32, 32)) * 0.1, jnp.float32)
    img = jnp.asarray(rng.standard_normal((32, 64, 64, 16)), jnp.float32)

    def conv(x, k1, k2):
        dn = ("NHWC", "HWIO", "NHWC")
        y = jax.nn.relu(jax.lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=dn))
        y = jax.nn.relu(jax.lax.conv_general_dilated(y, k2, (2, 2), "SAME", dimension_numbers=dn))
        return jnp.mean(y, axis=(1, 2))

    return conv, (img, k1, k2)


def child(out):
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(cores[2:6] if len(cores) >= 6 else cores))
    import numpy as np

    import jax
    import jax.numpy as jnp

    peerless = None
    if os.environ.get("JAX_PLATFORMS") == "peerless":
        import jax_plugins.peerless as peerless

        jax.devices()
        assert peerless.wrapped() == "cuda", peerless.wrapped()
        want = [] if os.environ.get("PEERLESS_ENABLE") == "0" else ["peerless"]
        assert peerless.enabled() == want, peerless.enabled()
        if os.environ.get("GPU_WRAP_NOOP_PASS"):
            # A pass that does nothing, registered like Peerless's: what registering costs.
            from jax.extend import xla as jxla

            jxla.register_hlo_module_transformation(lambda m: None, name="noop", platforms=["peerless"])
    dev = jax.devices()[0]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_xla_inside import compute_programs

    progs = compute_programs()
    rng = np.random.default_rng(1)
    progs["conv_net"] = conv_net()
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array([dev]), ("x",))
    progs["psum_1_device"] = (jax.shard_map(lambda v: jax.lax.psum(v * 2.0, "x") + 1.0, mesh=mesh,
                                            in_specs=P("x"), out_specs=P("x")),
                              (jnp.asarray(rng.standard_normal((1, 4096)), jnp.float32),))
    res, enq, hlo, arrays = {}, {}, {}, {}
    import hashlib

    for name, (fn, args) in progs.items():
        f = jax.jit(fn)
        r = jax.block_until_ready(f(*args))
        for i, leaf in enumerate(jax.tree.leaves(r)):
            arrays[f"{name}/{i}"] = np.asarray(leaf.astype(jnp.float32))
        text = f.lower(*args).compile().as_text() or ""
        hlo[name] = hashlib.sha1(text.encode()).hexdigest()[:12]
        if os.environ.get("GPU_WRAP_HLO_DIR"):
            with open(os.path.join(os.environ["GPU_WRAP_HLO_DIR"], f"{name}.txt"), "w") as fh:
                fh.write(text)
        ts, es = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(CALLS):
                r = f(*args)
            t1 = time.perf_counter()
            jax.block_until_ready(r)
            ts.append((time.perf_counter() - t0) / CALLS * 1e6)
            es.append((t1 - t0) / CALLS * 1e6)
        res[name] = sorted(ts)[2]
        enq[name] = sorted(es)[2]
    np.savez(out, **arrays)
    info = {"us": res, "enqueue_us": enq, "hlo": hlo, "device": str(dev), "platform": dev.platform}
    if peerless is not None:
        from jax_plugins.peerless import inside

        info["stats"] = inside.stats()
        info["handler_calls"] = inside.handler_calls("cuda")
    print(json.dumps(info))


def main():
    if sys.argv[1:2] == ["_child"]:
        child(sys.argv[2])
        return 0
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "gpu_wrap_out"
    os.makedirs(out, exist_ok=True)
    plugin = cuda_plugin_path()
    import numpy as np

    print(f"inner plugin (found by the package): {plugin}")
    runs = {"stock": [], "peerless": [], "nopass": []}
    if "--noop" in sys.argv:
        runs["noop"] = []
    rounds = int(os.environ.get("GPU_WRAP_ROUNDS", "3"))
    names = list(runs)
    for rnd in range(rounds):
        for cfg in names[rnd % len(names):] + names[:rnd % len(names)]:
            env = dict(os.environ, **SAFE_ENV)
            env.pop("PEERLESS_XLA_PLUGIN", None)
            if os.environ.get("GPU_WRAP_XLA_FLAGS"):
                # The same XLA flags for every configuration (e.g. an autotune cache that all
                # share, so that every process runs the same autotuned programs).
                env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + os.environ["GPU_WRAP_XLA_FLAGS"]).strip()
            if cfg == "stock":
                env["JAX_PLATFORMS"] = "cuda"
            else:
                env["JAX_PLATFORMS"] = "peerless"
                env.pop("PEERLESS_ENABLE", None)  # the pass is on by default
                if cfg in ("nopass", "noop"):
                    env["PEERLESS_ENABLE"] = "0"
                if cfg == "noop":
                    env["GPU_WRAP_NOOP_PASS"] = "1"
            npz = f"/tmp/gpu_wrap_{cfg}_{rnd}.npz"
            if rnd == 0:
                env["GPU_WRAP_HLO_DIR"] = os.path.join(out, f"hlo_{cfg}")
                os.makedirs(env["GPU_WRAP_HLO_DIR"], exist_ok=True)
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "_child", npz], env=env,
                               capture_output=True, text=True, timeout=600)
            lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
            if p.returncode or not lines:
                print(f"{cfg} round {rnd}: FAILED rc={p.returncode}\n{(p.stderr or p.stdout)[-4000:]}")
                return 1
            r = json.loads(lines[-1])
            r["npz"] = npz
            runs[cfg].append(r)
    with open(os.path.join(out, "gpu_wrap.json"), "w") as fh:
        json.dump(runs, fh, indent=1)
    want, got = np.load(runs["stock"][0]["npz"]), np.load(runs["peerless"][0]["npz"])
    pr = runs["peerless"][0]
    print(f"stock on {runs['stock'][0]['device']}; peerless on {pr['device']} (platform {pr['platform']}), "
          f"stats {pr.get('stats')}, handler calls {pr.get('handler_calls')}")
    print(f"{'program':20s} {'stock µs':>9s} {'peerless µs':>11s} {'ratio':>6s} {'nopass':>7s} "
          f"{'median ratio':>12s} {'enqueue stock/peerless µs':>25s} {'HLO':>5s} same")
    rc = 0
    for name in runs["stock"][0]["us"]:
        s = min(r["us"][name] for r in runs["stock"])
        q = min(r["us"][name] for r in runs["peerless"])
        n = min(r["us"][name] for r in runs["nopass"])
        es = min(r["enqueue_us"][name] for r in runs["stock"])
        eq = min(r["enqueue_us"][name] for r in runs["peerless"])
        med = lambda c: sorted(r["us"][name] for r in runs[c])[len(runs[c]) // 2]  # noqa: E731
        # Same: every process of every configuration compiled the same program.
        same_hlo = len({r["hlo"][name] for c in runs for r in runs[c]}) == 1
        keys = [k for k in want.files if k.startswith(name + "/")]
        same = all(np.allclose(got[k], want[k], rtol=1e-5, atol=1e-6) for k in keys)
        exact = all(np.array_equal(got[k], want[k]) for k in keys)
        print(f"{name:20s} {s:9.1f} {q:11.1f} {q / s:6.3f} {n / s:7.3f} {med('peerless') / med('stock'):12.3f} "
              f"{es:12.1f} / {eq:10.1f} "
              f"{'same' if same_hlo else 'DIFF':>5s} {'bit-identical' if exact else same}")
        rc |= not same
    if "noop" in runs:
        print("a no-op pass registered instead of Peerless's (ratio to stock): " + ", ".join(
            f"{k} {min(r['us'][k] for r in runs['noop']) / min(r['us'][k] for r in runs['stock']):.3f}"
            for k in runs["stock"][0]["us"]))
    return rc


if __name__ == "__main__":
    sys.exit(main())
