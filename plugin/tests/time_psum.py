#!/usr/bin/env python3
"""Times a jitted shard_map that chains 20 psums, on Peerless and on stock JAX, in one run.

    python3 plugin/tests/time_psum.py --out psum.csv              # peerless vs cuda (or cpu)
    python3 plugin/tests/time_psum.py --stock cpu --sizes 1K,64K  # explicit stock platform

For each per-device size (f32, default 1 KiB ... 1 MiB) and each platform, on all local
devices of that platform: one compile, `--warmup` calls, then `--iters` (>= 50) timed calls,
each `f(x).block_until_ready()` timed on its own; the table shows the median per call
divided by 20 (µs per psum). By default every step is `psum(a) * (1/n) + axis_index`, so no
psum's operand is replicated and XLA cannot fold a psum of a psum into a multiply;
`--step psum` chains bare psums (the collectives alone; XLA may fold some of them, so the header
and the CSV give the number of all-reduces left in each compiled program).

Each platform runs in its own subprocess (`JAX_PLATFORMS=<platform>`): both want the same
GPUs, and stock JAX on CUDA preallocates most of their memory. The stock platform is cuda
when `jax.devices("cuda")` works in a probe subprocess, else cpu (with as many host devices as
Peerless has). The subprocesses also report a checksum of the last result, and the table
says whether the two platforms agree (`match`).

Peerless is found as in the tests: `jax_plugins.peerless` on the path (pip-installed, or
PYTHONPATH=plugin/python with PEERLESS_PJRT_LIBRARY); its backend is PEERLESS_BACKEND.
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

CHAIN = 20


def parse_size(s):
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def child(args):
    """Runs in a subprocess with JAX_PLATFORMS set: times every size, prints one JSON line."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    devices = jax.devices(args.platform)
    if args.devices:
        if args.devices > len(devices):
            raise SystemExit(f"--devices {args.devices}: {args.platform} has only {len(devices)}")
        devices = devices[: args.devices]
    n = len(devices)
    mesh = Mesh(np.array(devices), ("x",))

    def body(a):
        idx = jax.lax.axis_index("x").astype(a.dtype)
        for _ in range(CHAIN):
            a = jax.lax.psum(a, "x")
            if args.step == "fma":
                a = a * (1.0 / n) + idx
        return a

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    rows = []
    all_reduces = None
    for size in args.sizes:
        elems = max(size // 4, 1)
        x = np.random.default_rng(0).standard_normal((n, elems)).astype(np.float32)
        xs = jax.device_put(x, NamedSharding(mesh, P("x")))
        out = f(xs).block_until_ready()
        if all_reduces is None:
            # How many all-reduces the compiled program really has (XLA may fold a psum of an
            # already-reduced value into a multiply, which `--step psum` invites).
            try:
                text = f.lower(xs).compile().as_text()
                all_reduces = text.count(" all-reduce(") + text.count(" all-reduce-start(")
            except Exception:  # the platform may not expose its compiled program
                all_reduces = -1
        for _ in range(args.warmup):
            out = f(xs).block_until_ready()
        times = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            out = f(xs).block_until_ready()
            times.append(time.perf_counter() - t0)
        host = np.asarray(out, dtype=np.float64)
        print(f"{args.platform}: {size} bytes/device: median {statistics.median(times) * 1e6 / CHAIN:.2f} µs/psum",
              file=sys.stderr, flush=True)
        rows.append(
            {
                "size": size,
                "median_s": statistics.median(times),
                "min_s": min(times),
                "checksum": [float(host.sum()), float(np.abs(host).sum())],
            }
        )
    print("RESULT " + json.dumps({"platform": args.platform, "devices": n, "device": str(devices[0]), "rows": rows,
                                  "all_reduces": all_reduces}))


def run_child(platform, args, env_extra):
    env = dict(os.environ, JAX_PLATFORMS=platform, **env_extra)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--platform", platform,
           "--sizes", ",".join(str(s) for s in args.sizes), "--iters", str(args.iters), "--warmup", str(args.warmup), "--step", args.step]
    if args.devices:
        cmd += ["--devices", str(args.devices)]
    # stderr (progress, JAX's warnings) passes through; stdout carries the result.
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    sys.stderr.write(p.stdout)
    raise SystemExit(f"time_psum: the {platform} run failed (exit {p.returncode}); its output is above")


def cuda_usable():
    probe = "import jax; print(len(jax.devices('cuda')))"
    env = dict(os.environ, JAX_PLATFORMS="cuda")
    try:
        p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False
    return p.returncode == 0 and p.stdout.strip().isdigit() and int(p.stdout.strip()) > 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="CSV file to write")
    ap.add_argument("--sizes", default="1K,4K,16K,64K,256K,1M", help="per-device bytes, e.g. 1K,256K,1M")
    ap.add_argument("--iters", type=int, default=50, help="timed calls per size (>= 50)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--step", choices=["fma", "psum"], default="fma",
                    help="fma: psum(a) / n + axis_index per step (default; no psum can be folded); "
                         "psum: bare chained psums (XLA may fold them; the header shows how many remain)")
    ap.add_argument("--devices", type=int, help="use the first N devices of each platform (default: all)")
    ap.add_argument("--stock", choices=["auto", "cuda", "cpu"], default="auto", help="stock JAX platform")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--platform", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = [parse_size(s) if isinstance(s, str) else s for s in str(args.sizes).split(",")]
    if args.child:
        return child(args)
    if args.iters < 50:
        ap.error("--iters must be at least 50")

    peerless = run_child("peerless", args, {})
    stock = args.stock if args.stock != "auto" else ("cuda" if cuda_usable() else "cpu")
    extra = {}
    if stock == "cpu":
        flags = os.environ.get("XLA_FLAGS", "")
        extra["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={peerless['devices']}".strip()
    ref = run_child(stock, args, extra)

    print(f"peerless: {peerless['devices']} x {peerless['device']}   stock: {ref['devices']} x {ref['device']} ({stock})")
    print(f"{CHAIN} chained psums per call (--step {args.step}); median of {args.iters} calls after {args.warmup} "
          f"warm-up calls; all-reduces in the compiled program: peerless {peerless['all_reduces']}, "
          f"{stock} {ref['all_reduces']} (-1: not readable)")
    print(f"{'bytes/device':>12}  {'peerless µs/psum':>16}  {'stock µs/psum':>13}  match")
    table = []
    for p, s in zip(peerless["rows"], ref["rows"]):
        a, b = p["checksum"], s["checksum"]
        same_n = peerless["devices"] == ref["devices"]
        match = same_n and all(abs(x - y) <= 1e-3 * max(1.0, abs(y)) for x, y in zip(a, b))
        row = {
            "size_bytes": p["size"],
            "peerless_us_per_psum": p["median_s"] * 1e6 / CHAIN,
            "stock_us_per_psum": s["median_s"] * 1e6 / CHAIN,
            "peerless_min_us_per_psum": p["min_s"] * 1e6 / CHAIN,
            "stock_min_us_per_psum": s["min_s"] * 1e6 / CHAIN,
            "devices": peerless["devices"],
            "stock_platform": stock,
            "peerless_backend": os.environ.get("PEERLESS_BACKEND", "host"),
            "iters": args.iters,
            "step": args.step,
            "peerless_all_reduces": peerless["all_reduces"],
            "stock_all_reduces": ref["all_reduces"],
            "match": match if same_n else "n/a",
        }
        table.append(row)
        print(f"{row['size_bytes']:>12}  {row['peerless_us_per_psum']:>16.2f}  {row['stock_us_per_psum']:>13.2f}  "
              f"{'n/a' if not same_n else 'yes' if match else 'NO'}")
        if same_n and not match:
            print(f"    checksums (sum, sum of |x|): peerless {a}, {stock} {b}")
    if args.out:
        with open(args.out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(table[0]))
            w.writeheader()
            w.writerows(table)
        print(f"wrote {args.out}")
    if peerless["devices"] != ref["devices"]:
        print(f"note: peerless has {peerless['devices']} devices, {stock} has {ref['devices']} "
              "(results not compared; --devices N uses N of each)")
    return 1 if any(r["match"] is False for r in table) else 0


if __name__ == "__main__":
    sys.exit(main())
