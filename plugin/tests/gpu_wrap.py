#!/usr/bin/env python3
"""`JAX_PLATFORMS=peerless` wrapping XLA's CUDA plugin vs stock JAX on CUDA, one GPU.

Each configuration runs in its own process (the parent alternates them, two rounds each):
  stock    : JAX_PLATFORMS=cuda
  peerless : JAX_PLATFORMS=peerless, PEERLESS_XLA_PLUGIN = the installed jax-cuda13-pjrt
             plugin (libpeerless_pjrt.so returns its table, with Peerless's handlers
             registered), Peerless's pass enabled on the wrapped backend.
Programs: matmul f32 / bf16, an MLP train step, a transformer block, softmax cross-entropy,
an elementwise chain, a small conv net, and a one-device psum (which the pass rewrites, so
Peerless's CUDA handler runs on XLA's stream). Median µs of 5 × 20 calls; results compared.
    python3 plugin/tests/gpu_wrap.py --out DIR
"""

import json
import os
import subprocess
import sys
import time

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


def child(out):
    import numpy as np

    import jax
    import jax.numpy as jnp

    peerless = None
    if os.environ.get("JAX_PLATFORMS") == "peerless":
        import jax_plugins.peerless as peerless

        assert peerless.enable(["peerless"]) == ["peerless"]
    dev = jax.devices()[0]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_xla_inside import compute_programs

    progs = compute_programs()
    rng = np.random.default_rng(1)
    k1 = jnp.asarray(rng.standard_normal((3, 3, 16, 32)) * 0.1, jnp.float32)
    k2 = jnp.asarray(rng.standard_normal((3, 3, 32, 32)) * 0.1, jnp.float32)
    img = jnp.asarray(rng.standard_normal((32, 64, 64, 16)), jnp.float32)

    def conv(x, k1, k2):
        dn = ("NHWC", "HWIO", "NHWC")
        y = jax.nn.relu(jax.lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=dn))
        y = jax.nn.relu(jax.lax.conv_general_dilated(y, k2, (2, 2), "SAME", dimension_numbers=dn))
        return jnp.mean(y, axis=(1, 2))

    progs["conv_net"] = (conv, (img, k1, k2))
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array([dev]), ("x",))
    progs["psum_1_device"] = (jax.shard_map(lambda v: jax.lax.psum(v * 2.0, "x") + 1.0, mesh=mesh,
                                            in_specs=P("x"), out_specs=P("x")),
                              (jnp.asarray(rng.standard_normal((1, 4096)), jnp.float32),))
    res, arrays = {}, {}
    for name, (fn, args) in progs.items():
        f = jax.jit(fn)
        r = jax.block_until_ready(f(*args))
        for i, leaf in enumerate(jax.tree.leaves(r)):
            arrays[f"{name}/{i}"] = np.asarray(leaf.astype(jnp.float32))
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(20):
                r = f(*args)
            jax.block_until_ready(r)
            ts.append((time.perf_counter() - t0) / 20 * 1e6)
        res[name] = sorted(ts)[2]
    np.savez(out, **arrays)
    info = {"us": res, "device": str(dev), "platform": dev.platform}
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

    runs = {"stock": [], "peerless": []}
    for rnd in range(2):
        for cfg in ("stock", "peerless"):
            env = dict(os.environ, **SAFE_ENV)
            if cfg == "stock":
                env["JAX_PLATFORMS"] = "cuda"
                env.pop("PEERLESS_XLA_PLUGIN", None)
            else:
                env.update(JAX_PLATFORMS="peerless", PEERLESS_XLA_PLUGIN=plugin)
            npz = f"/tmp/gpu_wrap_{cfg}_{rnd}.npz"
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
    print(f"{'program':20s} {'stock µs':>9s} {'peerless µs':>11s} {'ratio':>6s} same")
    rc = 0
    for name in runs["stock"][0]["us"]:
        s = min(r["us"][name] for r in runs["stock"])
        q = min(r["us"][name] for r in runs["peerless"])
        keys = [k for k in want.files if k.startswith(name + "/")]
        same = all(np.allclose(got[k], want[k], rtol=1e-5, atol=1e-6) for k in keys)
        exact = all(np.array_equal(got[k], want[k]) for k in keys)
        print(f"{name:20s} {s:9.1f} {q:11.1f} {q / s:6.3f} {'bit-identical' if exact else same}")
        rc |= not same
    return rc


if __name__ == "__main__":
    sys.exit(main())
