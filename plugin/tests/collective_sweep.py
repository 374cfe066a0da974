#!/usr/bin/env python3
"""A sweep of every collective form JAX users write, each compared with XLA alone.

Every collective kind (psum / pmax / pmin, all_gather, psum_scatter, all_to_all, ppermute)
× every axis argument (split / concat / gather / scatter dimension, tiled and not) × operand
rank 1-4 × int32 and float32, under pmap, shard_map (1-D and 2-D meshes, every axis order)
and jit with shardings (every reshard between placements of rank 1-4 arrays, reductions over
a sharded axis, a sharded contraction, rolls): the shapes of the operands XLA hands the pass
differ by case, and XLA may give a call any layout, so this is the check that sees a handler
reading a layout it was not given.

Each case runs twice in this process: first with XLA alone (the oracle), then with Peerless
enabled and every kind forced onto the kernels (`--*_backend=kernel`), after the caches are
cleared. Ints must agree exactly, floats within float32 tolerance. A pmap / shard_map case
whose collective Peerless did not take is a failure too (the sweep checks the kernels, so a
fallback would hide what it is for); jit cases record what XLA emitted and which Peerless took,
and the run fails unless some all-to-all of them ran on the kernel.

    python3 plugin/tests/collective_sweep.py                 # every visible device (GPUs, else CPU)
    python3 plugin/tests/collective_sweep.py --devices 2     # the first 2
    python3 plugin/tests/collective_sweep.py --platform cpu --devices 8 --quick

Environment: PEERLESS_PJRT_LIBRARY (the library), XLA_FLAGS (host device count on CPU; set
here when --platform cpu). Exit 0 only if every case agreed and was taken as required.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import traceback


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--platform", choices=("cpu", "cuda"), help="default: cuda if a GPU is visible, else cpu")
    p.add_argument("--devices", type=int, help="use the first N devices (default: all; on CPU 8 host devices)")
    p.add_argument("--apis", default="pmap,shard_map,jit", help="comma-separated subset of pmap,shard_map,jit")
    p.add_argument("--quick", action="store_true", help="ranks 1-3, int32 for the 2-D meshes (CI on 2 cores)")
    p.add_argument("-k", dest="filter", default="", help="only cases whose name contains this")
    p.add_argument("--out", help="write the results (every case) as JSON here")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    return p.parse_args()


ARGS = parse_args()
if ARGS.platform == "cpu" or (ARGS.platform is None and not os.path.exists("/dev/nvidia0")):
    ARGS.platform = "cpu"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={ARGS.devices or 8}".strip()
else:
    ARGS.platform = "cuda"
# NVLink multicast stays off on shared hosts.
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the partitioner's warnings on 2-D reshards

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless as peerless  # noqa: E402

DEVICES = jax.devices()[: ARGS.devices] if ARGS.devices else jax.devices()
N = len(DEVICES)
DTYPES = ("int32", "float32")
RANKS = (1, 2, 3) if ARGS.quick else (1, 2, 3, 4)
# Sizes of the axes a case does not split, gather or scatter: all different, so a handler
# that mixes up strides or axes moves data to the wrong place rather than to a lucky one.
BASE = (3, 5, 2, 4)
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
FORCED = " ".join(f"--{k.replace('-', '_')}_backend=kernel" for k in
                  ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"))


def data(shape, dtype, seed):
    """Distinct values (a permutation, so max / min pick varying devices), exact in float32."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(shape))
    return (rng.permutation(size) - size // 2).astype(dtype).reshape(shape)


class Case:
    def __init__(self, api, kind, name, build, required=True):
        self.api, self.kind, self.name, self.build, self.required = api, kind, name, build, required


def local_shape(rank, sized, g):
    """BASE's first `rank` sizes with the axes in `sized` set to `sized[axis] * g`."""
    shape = list(BASE[:rank])
    for axis, mult in sized.items():
        shape[axis] = mult * g
    return tuple(shape)


def collective_forms(rank, g):
    """(kind, label, local shape, fn(x, axis_name)) of every collective form over a group of g."""
    out = []
    shape = local_shape(rank, {}, g)
    out.append(("all-reduce", "psum", shape, lambda x, a: lax.psum(x, a)))
    out.append(("all-reduce", "pmax", shape, lambda x, a: lax.pmax(x, a)))
    out.append(("all-reduce", "pmin", shape, lambda x, a: lax.pmin(x, a)))
    for tiled in (False, True):
        for axis in range(rank + (0 if tiled else 1)):
            out.append(("all-gather", f"all_gather(axis={axis},tiled={tiled})", shape,
                        lambda x, a, axis=axis, tiled=tiled: lax.all_gather(x, a, axis=axis, tiled=tiled)))
        for axis in range(rank):
            s = local_shape(rank, {axis: 2 if tiled else 1}, g)
            out.append(("reduce-scatter", f"psum_scatter(dim={axis},tiled={tiled})", s,
                        lambda x, a, axis=axis, tiled=tiled: lax.psum_scatter(x, a, scatter_dimension=axis,
                                                                              tiled=tiled)))
        for split, concat in itertools.product(range(rank), repeat=2):
            s = local_shape(rank, {split: 2 if tiled else 1}, g)
            out.append(("all-to-all", f"all_to_all(split={split},concat={concat},tiled={tiled})", s,
                        lambda x, a, split=split, concat=concat, tiled=tiled: lax.all_to_all(
                            x, a, split, concat, tiled=tiled)))
    ring = [(i, (i + 1) % g) for i in range(g)]
    out.append(("collective-permute", "ppermute(ring)", shape, lambda x, a: lax.ppermute(x, a, ring)))
    if g >= 2:
        pairs = [(i, i ^ 1) for i in range(g - g % 2)]
        out.append(("collective-permute", "ppermute(pairs)", shape, lambda x, a: lax.ppermute(x, a, pairs)))
    return out


def pmap_cases():
    cases = []
    # A reduced program from a user report (XLA:GPU gave its call the layout {3,2,0,1}).
    def build():
        x = np.arange(N ** 4).reshape(N, N, N, N).astype(np.int32)
        return jax.pmap(lambda v: lax.all_to_all(v, "i", 0, 1), axis_name="i", devices=DEVICES), (x,)
    cases.append(Case("pmap", "all-to-all", "pmap int32 issue34 all_to_all(split=0,concat=1) of arange", build))
    for rank, dtype in itertools.product(RANKS, DTYPES):
        for kind, label, shape, fn in collective_forms(rank, N):
            def build(shape=shape, fn=fn, dtype=dtype, seed=len(cases)):
                x = data((N, *shape), dtype, seed)
                return jax.pmap(lambda v: fn(v, "i"), axis_name="i", devices=DEVICES), (x,)
            cases.append(Case("pmap", kind, f"pmap {dtype} rank{rank} {label}", build))
    return cases


def meshes():
    """(label, mesh, the axis names to reduce over) for the 1-D mesh and each 2-D shape."""
    out = [("mesh(i=%d)" % N, Mesh(np.array(DEVICES), ("i",)), ["i"])]
    for a in range(2, N):
        if N % a == 0 and N // a >= 2:
            m = Mesh(np.array(DEVICES).reshape(a, N // a), ("a", "b"))
            out.append((f"mesh(a={a},b={N // a})", m, ["a", "b", ("a", "b"), ("b", "a")]))
    return out


def shard_map_cases():
    cases = []
    for mlabel, mesh, axes in meshes():
        two_d = len(mesh.axis_names) == 2
        spec = P(tuple(mesh.axis_names)) if two_d else P("i")
        for axis in axes:
            g = int(np.prod([mesh.shape[x] for x in (axis if isinstance(axis, tuple) else (axis,))]))
            ranks = (2, 3) if two_d else RANKS
            dtypes = ("int32",) if two_d and ARGS.quick else DTYPES
            for rank, dtype in itertools.product(ranks, dtypes):
                for kind, label, shape, fn in collective_forms(rank, g):
                    def build(shape=shape, fn=fn, dtype=dtype, mesh=mesh, spec=spec, axis=axis, seed=len(cases)):
                        x = data((N * shape[0], *shape[1:]), dtype, seed)
                        f = jax.shard_map(lambda v: fn(v, axis), mesh=mesh, in_specs=spec, out_specs=spec,
                                          check_vma=False)
                        return jax.jit(f), (x,)
                    cases.append(Case("shard_map", kind, f"shard_map {mlabel} over {axis} {dtype} rank{rank} {label}",
                                      build))
    return cases


def placements(rank, names):
    """PartitionSpecs placing each of `names` (a mesh axis or a tuple of them) on one array
    axis, or nowhere: every spec of a rank-`rank` array over those axes."""
    specs = []
    for pos in itertools.product(range(-1, rank), repeat=len(names)):
        if len([p for p in pos if p >= 0]) != len({p for p in pos if p >= 0}):
            continue
        s = [None] * rank
        for name, p in zip(names, pos):
            if p >= 0:
                s[p] = name
        specs.append(P(*s))
    return specs


def jit_cases():
    cases = []
    m1 = Mesh(np.array(DEVICES), ("i",))
    # A reduced reshard from a user report: P("i", None) -> P(None, "i") makes XLA emit an all-to-all.
    def build():
        x = jax.device_put(np.arange(4 * N * 8 * N, dtype=np.float32).reshape(4 * N, 8 * N),
                           NamedSharding(m1, P("i", None)))
        return jax.jit(lambda v: v * 1, out_shardings=NamedSharding(m1, P(None, "i"))), (x,)
    cases.append(Case("jit", "reshard", "jit float32 issue34 P('i', None) -> P(None, 'i')", build, False))
    sets = [("mesh(i=%d)" % N, m1, [placements(r, ["i"]) for r in range(5)], DTYPES)]
    for mlabel, mesh, _ in meshes()[1:]:
        specs = [None, None]
        for r in (2, 3):
            # Rank 3: only placements of both axes (apart or combined in either order), to
            # keep the pairs few; rank 2: every placement.
            s = placements(r, ["a", "b"]) + placements(r, [("a", "b")]) + placements(r, [("b", "a")])
            s = list(dict.fromkeys(s))
            if r == 3:
                s = [x for x in s if sum(len(a) if isinstance(a, tuple) else 1 for a in x if a is not None) == 2]
            specs.append(s if r == 2 or not ARGS.quick else [])
        sets.append((mlabel, mesh, specs, ("int32",)))
    for mlabel, mesh, by_rank, dtypes in sets:
        for rank in RANKS:
            specs = by_rank[rank] if rank < len(by_rank) else None
            if not specs:
                continue
            shape = tuple(N * (k + 1) for k in range(rank))  # every axis divides over any mesh axis
            for dtype in dtypes:
                # Every reshard between two placements: XLA emits all-to-alls, all-gathers, slices.
                for src, dst in itertools.permutations(specs, 2):
                    def build(src=src, dst=dst, shape=shape, dtype=dtype, mesh=mesh, seed=len(cases)):
                        x = jax.device_put(data(shape, dtype, seed), NamedSharding(mesh, src))
                        return jax.jit(lambda v: v * 2, out_shardings=NamedSharding(mesh, dst)), (x,)
                    cases.append(Case("jit", "reshard", f"jit {mlabel} {dtype} {src} -> {dst}", build, False))
                # Reductions over a sharded axis (all-reduce, reduce-scatter), rolls (permutes).
                for spec in specs:
                    sharded = [k for k, s in enumerate(spec) if s is not None]
                    for k in sharded:
                        for op in ("sum", "max"):
                            def build(spec=spec, k=k, op=op, shape=shape, dtype=dtype, mesh=mesh, seed=len(cases)):
                                x = jax.device_put(data(shape, dtype, seed), NamedSharding(mesh, spec))
                                red = getattr(jnp, op)
                                out = P(*[s for j, s in enumerate(spec) if j != k])
                                return jax.jit(lambda v: red(v, axis=k), out_shardings=NamedSharding(mesh, out)), (x,)
                            cases.append(Case("jit", "reduce", f"jit {mlabel} {dtype} {op}(axis={k}) of {spec}", build,
                                              False))
                        def build(spec=spec, k=k, shape=shape, dtype=dtype, mesh=mesh, seed=len(cases)):
                            x = jax.device_put(data(shape, dtype, seed), NamedSharding(mesh, spec))
                            return jax.jit(lambda v: jnp.roll(v, 1, axis=k),
                                           out_shardings=NamedSharding(mesh, spec)), (x,)
                        cases.append(Case("jit", "roll", f"jit {mlabel} {dtype} roll(axis={k}) of {spec}", build, False))
            # A contraction over a sharded axis, its result replicated or sharded (all-reduce /
            # reduce-scatter inside XLA's partitioner).
            if rank == 2 and mesh is m1:
                for out in (P(), P("i", None), P(None, "i")):
                    def build(out=out, mesh=mesh, seed=len(cases)):
                        x = jax.device_put(data((N * 2, N * 4), "float32", seed), NamedSharding(mesh, P(None, "i")))
                        w = jax.device_put(data((N * 4, N * 3), "float32", seed + 1), NamedSharding(mesh, P("i", None)))
                        return jax.jit(lambda a, b: a @ b, out_shardings=NamedSharding(mesh, out)), (x, w)
                    cases.append(Case("jit", "matmul", f"jit {mlabel} float32 matmul (contraction sharded) -> {out}",
                                      build, False))
    return cases


def run_case(case):
    fn, args = case.build()
    return np.asarray(jax.block_until_ready(fn(*args)))


def compare(want, got, dtype):
    if want.shape != got.shape:
        return f"shape {got.shape}, want {want.shape}"
    if np.issubdtype(want.dtype, np.integer):
        bad = int(np.count_nonzero(want != got))
    else:
        bad = int(np.count_nonzero(~np.isclose(got, want, rtol=1e-6, atol=1e-6)))
    if bad:
        idx = np.argwhere(want != got)[0] if np.issubdtype(want.dtype, np.integer) else \
            np.argwhere(~np.isclose(got, want, rtol=1e-6, atol=1e-6))[0]
        return f"{bad} of {want.size} elements differ (first at {tuple(int(i) for i in idx)}: " \
               f"got {got[tuple(idx)]}, want {want[tuple(idx)]})"
    return None


def main():
    if N < 2:
        print(f"collective_sweep: needs 2 devices, {N} visible", file=sys.stderr)
        return 2
    apis = ARGS.apis.split(",")
    cases = []
    if "pmap" in apis:
        cases += pmap_cases()
    if "shard_map" in apis:
        cases += shard_map_cases()
    if "jit" in apis:
        cases += jit_cases()
    cases = [c for c in cases if ARGS.filter in c.name]
    if ARGS.list:
        for c in cases:
            print(c.name)
        return 0
    dev = DEVICES[0]
    print(f"collective_sweep: {len(cases)} cases on {N} x {dev.device_kind} ({ARGS.platform}), JAX {jax.__version__}",
          flush=True)
    t0 = time.time()
    # The oracle: XLA alone.
    want = {}
    for k, c in enumerate(cases):
        try:
            want[c.name] = run_case(c)
        except Exception as e:  # a form XLA itself rejects is no case
            want[c.name] = e
        if (k + 1) % 100 == 0:
            print(f"  XLA alone: {k + 1}/{len(cases)} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    t1 = time.time()
    enabled = peerless.enable([ARGS.platform], flags=FORCED)
    assert enabled == [ARGS.platform], enabled
    jax.clear_caches()
    results = []
    for k, c in enumerate(cases):
        w = want[c.name]
        if isinstance(w, Exception):
            results.append({"name": c.name, "api": c.api, "kind": c.kind, "status": "xla-rejects",
                            "detail": str(w).splitlines()[0][:200]})
            continue
        n0 = len(peerless.decisions())
        try:
            got = run_case(c)
            err = compare(w, got, w.dtype)
        except Exception as e:
            err = "raised " + "".join(traceback.format_exception_only(type(e), e)).strip()[-400:]
        if "issue34" in c.name:
            fn, args = c.build()
            calls = [l.strip() for l in fn.lower(*args).compile().as_text().splitlines() if "peerless." in l]
            print(f"{c.name}: {err or 'agrees'}; compiled calls:\n  " + "\n  ".join(calls), flush=True)
        ds = peerless.decisions()[n0:]
        taken = sorted({d["op"] for d in ds if d["implementation"] != "fallback"})
        left = sorted({f"{d['op']}: {d['reason']}" for d in ds if d["implementation"] == "fallback"})
        status = "ok"
        if err:
            status = "WRONG"
        elif c.required and c.kind not in taken:
            status = "not-taken"
            err = f"Peerless took {taken or 'nothing'}; left to XLA: {left or 'nothing'}"
        results.append({"name": c.name, "api": c.api, "kind": c.kind, "status": status, "detail": err,
                        "taken": taken, "left": left})
        if (k + 1) % 100 == 0:
            print(f"  Peerless: {k + 1}/{len(cases)} ({time.time() - t1:.0f} s)", file=sys.stderr, flush=True)
    t2 = time.time()

    # The table: per api and kind, cases / agreeing / taken by a kernel.
    rows = {}
    for r in results:
        row = rows.setdefault((r["api"], r["kind"]), {"cases": 0, "ok": 0, "wrong": 0, "not-taken": 0, "xla": 0})
        row["cases"] += 1
        row[{"ok": "ok", "WRONG": "wrong", "not-taken": "not-taken", "xla-rejects": "xla"}[r["status"]]] += 1
    kernel_ops = {}
    for r in results:
        for op in r.get("taken", []):
            kernel_ops[op] = kernel_ops.get(op, 0) + 1
    print(f"\n| api | kind | cases | agree with XLA | wrong | not on a kernel | XLA rejects |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (api, kind), row in rows.items():
        print(f"| {api} | {kind} | {row['cases']} | {row['ok']} | {row['wrong']} | {row['not-taken']} | {row['xla']} |")
    print("\ncases in which Peerless ran each kind on a kernel: " +
          ", ".join(f"{k} {v}" for k, v in sorted(kernel_ops.items())))
    bad = [r for r in results if r["status"] in ("WRONG", "not-taken")]
    for r in bad[:60]:
        print(f"{r['status']}: {r['name']}: {r['detail']}")
    if len(bad) > 60:
        print(f"... and {len(bad) - 60} more")
    jit_a2a = sum(1 for r in results if r["api"] == "jit" and "all-to-all" in r.get("taken", []))
    problems = len(bad)
    if "jit" in apis and not ARGS.filter and jit_a2a == 0:
        print("FAIL: no jit reshard ran an all-to-all on Peerless's kernel (the sweep would miss that class)")
        problems += 1
    ok = sum(1 for r in results if r["status"] == "ok")
    print(f"\ncollective_sweep: {ok} passed, {problems} failed ({len(cases)} cases on {N} x {dev.device_kind}; "
          f"XLA alone {t1 - t0:.0f} s, Peerless {t2 - t1:.0f} s)")
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            json.dump({"devices": N, "device_kind": dev.device_kind, "platform": ARGS.platform,
                       "jax": jax.__version__, "results": results}, f, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
