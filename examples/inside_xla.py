#!/usr/bin/env python3
"""Peerless inside XLA on the embedded default: XLA:CPU with 8 host devices.

Two realistic sharded programs, each compiled twice in this process, by XLA alone and with
Peerless's pass on (`jax_plugins.peerless.enable()`):
  - a data-parallel MLP train step (jit on NamedSharding arrays: XLA's partitioner makes the
    gradient all-reduce), and
  - a tensor-parallel transformer MLP block over a 2x4 ("dp", "tp") mesh (shard_map: an
    all-gather of the activations, a reduce-scatter of the output).
Each program runs three ways: XLA alone; Peerless as a user gets it (the pass with the
active tuning profile, which on XLA:CPU leaves a collective to XLA wherever XLA measured
faster, so it may take none); and Peerless's kernels forced (`--*_backend=kernel`, what a GPU
runs). Prints each collective's decision, whether every result agrees with XLA alone, and the
time per step, side by side. Exit status 0 only if everything agrees and the forced run took
Peerless's kernels.

    scripts/setup.sh && cargo build --release -p peerless-pjrt
    PEERLESS_PJRT_LIBRARY=target/release/libpeerless_pjrt.so PYTHONPATH=plugin/python \\
      .venv/jax/bin/python examples/inside_xla.py [--steps N]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless as peerless  # noqa: E402


def dp_train_step():
    """A 3-layer MLP, batch sharded over 8 devices, weights replicated; one SGD step."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("dp",))
    rng = np.random.default_rng(0)
    sizes = [256, 512, 512, 64]
    params = [(rng.standard_normal((a, b)).astype(np.float32) * 0.05, np.zeros(b, np.float32))
              for a, b in zip(sizes, sizes[1:])]
    rep = NamedSharding(mesh, P())
    params = jax.device_put(params, rep)
    x = jax.device_put(rng.standard_normal((512, 256)).astype(np.float32), NamedSharding(mesh, P("dp")))
    y = jax.device_put(rng.standard_normal((512, 64)).astype(np.float32), NamedSharding(mesh, P("dp")))

    def loss(p, x, y):
        h = x
        for i, (w, b) in enumerate(p):
            h = h @ w + b
            if i < len(p) - 1:
                h = jax.nn.gelu(h)
        return jnp.mean((h - y) ** 2)

    def step(p, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), l

    shardings = jax.tree.map(lambda a: a.sharding, params)
    return (lambda: jax.jit(step, out_shardings=(shardings, rep))), (params, x, y)


def tp_block():
    """A transformer MLP block, Megatron-style over a ("dp", "tp") = 2x4 mesh in shard_map:
    activations all-gathered over tp, the output reduce-scattered back."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))
    rng = np.random.default_rng(1)
    d, f, tokens = 512, 2048, 256
    x = jax.device_put(rng.standard_normal((tokens, d)).astype(np.float32),
                       NamedSharding(mesh, P("dp", "tp")))
    w1 = jax.device_put(rng.standard_normal((d, f)).astype(np.float32) * 0.02, NamedSharding(mesh, P(None, "tp")))
    w2 = jax.device_put(rng.standard_normal((f, d)).astype(np.float32) * 0.02, NamedSharding(mesh, P("tp", None)))

    def block(x, w1, w2):
        full = jax.lax.all_gather(x, "tp", axis=1, tiled=True)  # (tokens/dp, d)
        h = jax.nn.gelu(full @ w1)  # (tokens/dp, f/tp)
        out = h @ w2  # partial sums over tp
        return jax.lax.psum_scatter(out, "tp", scatter_dimension=1, tiled=True) + x

    sm = jax.shard_map(block, mesh=mesh, in_specs=(P("dp", "tp"), P(None, "tp"), P("tp", None)),
                       out_specs=P("dp", "tp"))
    return (lambda: jax.jit(sm)), (x, w1, w2)


def time_per_step(f, args, steps):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def max_diff(a, b):
    leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in leaves)


FORCED = "--all_reduce_backend=kernel --all_gather_backend=kernel --reduce_scatter_backend=kernel"


def main() -> int:
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 50
    print(f"Peerless inside XLA: {len(jax.devices())} {jax.devices()[0].platform} devices, jax {jax.__version__}")
    rows, ok = [], True
    for name, make in (("data-parallel MLP train step", dp_train_step), ("tensor-parallel MLP block", tp_block)):
        build, args = make()
        peerless.disable()
        jax.clear_caches()
        alone = build()
        want = alone(*args)
        t_alone = time_per_step(alone, args, steps)
        runs = []
        for how, flags in (("profile", os.environ.get("PEERLESS_FLAGS", "")), ("kernels", FORCED)):
            peerless.reset_stats()
            peerless.enable(flags=flags)
            jax.clear_caches()
            inside = build()
            got = inside(*args)
            decisions = peerless.decisions()
            t_inside = time_per_step(inside, args, steps)
            peerless.disable()
            diff = max_diff(got, want)
            agree = diff <= 1e-4
            kernels = sum(d["implementation"] != "fallback" for d in decisions)
            ok &= agree and (how != "kernels" or kernels > 0)
            print(f"\n{name}, {'as configured (tuning profile, flags)' if how == 'profile' else 'kernels forced'}")
            for d in decisions:
                print(f"  {d['op']:18s} {d['dtype']:12s} {d['bytes']:>8d} B  groups={d['groups']:26s} -> "
                      f"{d['implementation']}: {d['reason']}")
            rows.append((name, how, kernels, len(decisions), agree, diff, t_alone, t_inside))
    print(f"\n{'program':30s} {'Peerless':>9s} {'on kernels':>10s} {'agrees':>7s} {'max |diff|':>10s} "
          f"{'XLA alone µs':>13s} {'Peerless µs':>12s} {'ratio':>6s}")
    for name, how, k, n, agree, diff, a, p in rows:
        print(f"{name:30s} {how:>9s} {f'{k} of {n}':>10s} {str(agree):>7s} {diff:>10.2e} {a:>13.0f} {p:>12.0f} "
              f"{p / a:>6.2f}")
    print(f"(median of {steps} steps each; the numbers behind the product: docs/PERFORMANCE.md)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
