#!/usr/bin/env python3
"""Accuracy of bf16 sums: Peerless's kernels and XLA alone against an exact reference, on GPUs.

    python3 plugin/tests/gpu_accuracy.py [--out FILE]

1. psum of bf16 over groups of 2, 4 and 8 GPUs (as many as there are), 64 KiB and 1 MiB per
   GPU, random values of mixed magnitude: the exact sum (float64, exact for these) rounded
   once to bf16 is the reference. Each result is measured in bf16 ulps of the reference.
   Peerless must round once (every element the exact sum rounded to bf16) and must not be
   worse than XLA alone in max or mean error (ulps of the larger of the sum and its largest
   term, the scale summation error bounds use).
2. The 8-layer tensor-parallel decode step of bench_programs.py (bf16, d 4096, batch 8) on
   every GPU, with Peerless and with XLA alone, against the same step computed in float32 on
   one GPU: Peerless's relative error must not exceed XLA alone's by more than 10%.

Peerless runs with `--all_reduce_backend=kernel` (every all-reduce on a kernel, whatever the
tuning profile would leave to XLA). Both compiles run in this one process (Peerless enabled, then disabled, caches cleared
between), on the same inputs. Exit status 1 on any failure; a table either way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless as peerless  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def compiled_both(make):
    """(with Peerless, XLA alone): `make()` builds and compiles a fresh jitted function."""
    jax.clear_caches()
    # The kernels are what is measured: sizes the tuning profile leaves to XLA run on them too.
    peerless.enable(flags="--all_reduce_backend=kernel")
    mine = make()
    peerless.disable()
    jax.clear_caches()
    base = make()
    return mine, base


def ulps(got, exact, terms):
    """|got - exact| in bf16 ulps of the larger of the exact sum and its largest term (a
    sum that nearly cancels is measured against its terms' scale, as summation error bounds
    are), float64 in and out."""
    mag = np.maximum(np.maximum(np.abs(exact), np.max(np.abs(terms), axis=0)),
                     np.float64(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_normal))
    ulp = 2.0 ** (np.floor(np.log2(mag)) - 7)  # bf16: 8 significand bits
    return np.abs(got - exact) / ulp


def psum_case(g, elems, rng):
    mesh = Mesh(np.array(jax.devices()[:g]), ("x",))
    # Mixed magnitudes, both signs: the sums cancel and carry, where rounding order shows.
    x = rng.standard_normal((g, elems)) * np.exp2(rng.integers(-4, 5, (g, elems)))
    xb = x.astype(ml_dtypes.bfloat16)
    exact = xb.astype(np.float64).sum(axis=0)  # exact: few terms of 8-bit significands
    ref = exact.astype(ml_dtypes.bfloat16).astype(np.float64)  # rounded once
    arr = jax.device_put(jnp.asarray(xb), NamedSharding(mesh, P("x")))
    make = lambda: jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "x"), mesh=mesh, in_specs=P("x"),
                                         out_specs=P("x"))).lower(arr).compile()
    mine, base = compiled_both(make)
    row = {"group": g, "bytes": elems * 2}
    for name, f in (("peerless", mine), ("xla", base)):
        out = np.asarray(f(arr)).astype(np.float64)[0]
        e = ulps(out, exact, xb.astype(np.float64))
        row[name] = {"max_ulp": float(e.max()), "mean_ulp": float(e.mean()),
                     "rounded_once": float(np.mean(out == ref)),
                     "max_rel": float(np.max(np.abs(out - exact)) / np.max(np.abs(exact)))}
    row["kernel"] = "custom-call" in mine.as_text() and "peerless" in mine.as_text()
    # Round once: every element is the exact sum rounded to bf16 (the f32 accumulation of a
    # few bf16 terms is exact), and no worse than XLA alone.
    row["ok"] = bool(row["kernel"] and row["peerless"]["rounded_once"] == 1.0
                     and row["peerless"]["max_ulp"] <= row["xla"]["max_ulp"] + 1e-9
                     and row["peerless"]["mean_ulp"] <= row["xla"]["mean_ulp"] + 1e-9)
    return row


def decode_case(n):
    import bench_programs

    progs = bench_programs.programs(["decode_d4096_b8"], n)
    step, args, _ = progs["decode_d4096_b8"]
    fn = step.__wrapped__  # the Python step under jax.jit
    # The float32 reference on one GPU: the same weights and inputs, upcast.
    dev0 = jax.devices()[0]
    up = jax.tree.map(lambda a: jax.device_put(np.asarray(a).astype(np.float32), dev0), args)
    ref = np.asarray(jax.jit(fn)(*up), np.float64)
    make = lambda: jax.jit(fn).lower(*args).compile()
    mine, base = compiled_both(make)
    row = {"program": "decode_d4096_b8", "gpus": n}
    scale = np.max(np.abs(ref))
    for name, f in (("peerless", mine), ("xla", base)):
        out = np.asarray(f(*args)).astype(np.float64)
        row[name] = {"max_rel": float(np.max(np.abs(out - ref)) / scale),
                     "rms_rel": float(np.sqrt(np.mean((out - ref) ** 2)) / np.sqrt(np.mean(ref ** 2)))}
    row["kernel"] = "peerless" in mine.as_text()
    row["ok"] = bool(row["kernel"] and row["peerless"]["rms_rel"] <= 1.1 * row["xla"]["rms_rel"])
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--no-decode", action="store_true", help="psums only")
    a = ap.parse_args()
    n = len(jax.devices())
    rng = np.random.default_rng(7)
    rows = []
    print(f"{n}x {jax.devices()[0].device_kind}: bf16 psum vs the exact sum rounded once (ulps of bf16)")
    print(f"{'group':>5s} {'bytes':>8s} {'peerless max/mean ulp':>22s} {'once':>6s} {'XLA max/mean ulp':>18s} {'once':>6s}  ok")
    for g in (2, 4, 8):
        if g > n:
            continue
        for elems in (32768, 524288):
            r = psum_case(g, elems, rng)
            rows.append(r)
            p, x = r["peerless"], r["xla"]
            print(f"{g:5d} {r['bytes']:8d} {p['max_ulp']:12.3f}/{p['mean_ulp']:.4f} {p['rounded_once']:6.3f} "
                  f"{x['max_ulp']:10.3f}/{x['mean_ulp']:.4f} {x['rounded_once']:6.3f}  {'ok' if r['ok'] else 'FAIL'}")
    if n >= 2 and not a.no_decode:
        r = decode_case(n)
        rows.append(r)
        print(f"decode d 4096 batch 8, 8 layers on {n} GPUs vs float32 on one: relative error max / rms: "
              f"peerless {r['peerless']['max_rel']:.3e} / {r['peerless']['rms_rel']:.3e}, "
              f"XLA {r['xla']['max_rel']:.3e} / {r['xla']['rms_rel']:.3e}  {'ok' if r['ok'] else 'FAIL'}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    bad = [r for r in rows if not r["ok"]]
    print(f"gpu_accuracy: {len(rows) - len(bad)} of {len(rows)} ok")
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
