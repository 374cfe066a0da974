#!/usr/bin/env python3
"""All-reduce by size, kernel against kernel: a chain of dependent psums per jit, Peerless
builds and XLA alone side by side, interleaved rounds.

Each step of the chain is `psum(a) * (1/n)` inside one `jax.jit(shard_map(...))`, so every
all-reduce waits for the one before it (device-bound: XLA's host time per call is paid once
per chain, not per collective). µs per collective is the median over timed calls divided by
the chain length; bus bandwidth follows nccl-tests (all-reduce: 2(n-1)/n * bytes / t).

A *variant* is a name and a directory holding a Peerless install (`pip install --target`),
put first on PYTHONPATH of that variant's subprocess; `stock` runs XLA alone. Every variant
runs once per round, in turn, so the machine's drift spreads over all of them; the table
shows each variant's best median and the spread over rounds, and what each size ran on
(Peerless's decision: one-shot, two-shot or XLA).

    python3 plugin/tests/bench_sizes.py --variant new=/tmp/pl_new --variant old=/tmp/pl_old \\
        --sizes 1K,64K,1M,16M,256M --rounds 2 --out sizes.json

Environment: PEERLESS_FLAGS applies to every Peerless variant (e.g. force the kernels:
`--all_reduce_backend=kernel --two_shot_max_bytes=1073741824`). Exit 0 unless a run failed or
results differ from XLA alone (f32 tolerance).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from time_psum import parse_size  # same directory: one size syntax for both scripts


def human(b: int) -> str:
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m}{unit}"
    return str(b)


def child(a) -> None:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    peerless = None
    if a.variant != "stock":
        import jax_plugins.peerless as peerless

        peerless.enable()
    devices = jax.devices()[: a.devices] if a.devices else jax.devices()
    n = len(devices)
    mesh = Mesh(np.array(devices), ("x",))
    chain = a.chain

    def body(x):
        for _ in range(chain):
            x = jax.lax.psum(x, "x") * (1.0 / n)
        return x

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    rows = []
    for size in a.sizes:
        elems = max(size // 4, 1)
        x = np.random.default_rng(size).standard_normal((n, elems)).astype(np.float32)
        xs = jax.device_put(x, NamedSharding(mesh, P("x")))
        if peerless is not None:
            peerless.reset_stats()
        out = f(xs).block_until_ready()
        impl = ""
        if peerless is not None:
            impl = ",".join(sorted({d["implementation"] for d in peerless.decisions() if d["op"] != "module"}))
        # Equal to XLA alone within f32 tolerance: the mean over devices, scaled back, is
        # invariant under the chain (every step keeps the mean).
        want = x.mean(axis=0)
        got = np.asarray(out)[:elems]
        ok = bool(np.allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max()))
        for _ in range(a.warmup):
            f(xs).block_until_ready()
        times = []
        deadline = time.perf_counter() + a.seconds
        while len(times) < a.iters or (time.perf_counter() < deadline and len(times) < 10 * a.iters):
            t0 = time.perf_counter()
            f(xs).block_until_ready()
            times.append(time.perf_counter() - t0)
        us = statistics.median(times) * 1e6 / chain
        rows.append({"size": size, "us": us, "ok": ok, "impl": impl})
        print(f"  {a.variant}: {human(size)} {us:.1f} µs/collective ({impl or 'xla'})", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps({"variant": a.variant, "devices": n, "kind": devices[0].device_kind, "rows": rows}))


def run_variant(name: str, where: str, a) -> dict:
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    env.pop("PEERLESS_ENABLE", None)
    if where:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--variant-name", name, "--chain", str(a.chain),
           "--sizes", ",".join(map(str, a.sizes)), "--iters", str(a.iters), "--warmup", str(a.warmup),
           "--seconds", str(a.seconds)]
    if a.devices:
        cmd += ["--devices", str(a.devices)]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=a.timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"variant {name} failed (exit {p.returncode}): {p.stdout[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                    help="a Peerless install to measure (repeatable); 'stock' (XLA alone) always runs")
    ap.add_argument("--sizes", default="1K,16K,64K,256K,1M,4M,16M,64M,256M", help="bytes per device")
    ap.add_argument("--chain", type=int, default=8, help="dependent all-reduces per jit")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20, help="timed calls per size, at least")
    ap.add_argument("--seconds", type=float, default=0.5, help="timed calls per size, at most this long beyond --iters")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--devices", type=int, help="first N devices (default all)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per variant run")
    ap.add_argument("--out", help="write every round's rows as JSON here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant-name", dest="variant_name", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.sizes = [parse_size(s) for s in a.sizes.split(",")]
    if a.child:
        a.variant = a.variant_name
        child(a)
        return 0
    variants = [("stock", "")] + [tuple(v.split("=", 1)) for v in a.variant]
    runs: dict[str, list[dict]] = {name: [] for name, _ in variants}
    failed = False
    for r in range(a.rounds):
        for name, where in variants:
            print(f"round {r + 1}/{a.rounds}: {name}", file=sys.stderr, flush=True)
            try:
                runs[name].append(run_variant(name, where, a))
            except Exception as e:  # noqa: BLE001 - reported, the others still run
                print(f"  {e}", file=sys.stderr)
                failed = True
    first = next((rs[0] for rs in runs.values() if rs), None)
    if first is None:
        return 1
    n = first["devices"]
    print(f"\nall-reduce f32, chain of {a.chain}, {n}x {first['kind']}, best median of {a.rounds} rounds "
          f"(range over rounds); busbw = 2(n-1)/n * bytes / t")
    names = [name for name, _ in variants if runs[name]]
    head = "| bytes/device | " + " | ".join(f"{v} µs | {v} GB/s" for v in names) + " | " + \
        " | ".join(f"{v} ran on" for v in names if v != "stock") + " |"
    print(head)
    print("|---:|" + "---:|---:|" * len(names) + "---|" * (len(names) - 1))
    for i, size in enumerate(a.sizes):
        cells, impls = [], []
        for v in names:
            us = [run["rows"][i]["us"] for run in runs[v]]
            best = min(us)
            bw = 2 * (n - 1) / n * size / (best * 1e-6) / 1e9
            cells.append(f"{best:.1f} ({min(us):.1f}-{max(us):.1f}) | {bw:.1f}")
            if v != "stock":
                impls.append(runs[v][0]["rows"][i]["impl"] or "xla")
            if not all(run["rows"][i]["ok"] for run in runs[v]):
                failed = True
                cells[-1] += " WRONG"
        print(f"| {human(size)} | " + " | ".join(cells) + " | " + " | ".join(impls) + " |")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"chain": a.chain, "sizes": a.sizes, "runs": runs}, fh, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
