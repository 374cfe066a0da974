#!/usr/bin/env python3
"""Group order and edge values on CUDA: eight processes on one GPU, a 2x2x2 mesh.

The CPU suite (plugin/tests/test_xla_inside.py: test_group_order_*, test_edge_values_*) holds
these programs against XLA alone in CI. On a one-GPU machine the only groups larger than one
device are groups of processes, so this script starts eight `jax.distributed` processes that
all take GPU 0 (`local_device_ids=[0]`): the job has devices 0..7, one per process, laid out
as a ("x", "y", "z") mesh of 2x2x2, and Peerless's CUDA handlers meet through CUDA IPC.

Programs:
- every collective kind (psum, all_gather tiled and untiled, psum_scatter, all_to_all, a ring
  ppermute) over every ordered choice of one, two and three axes, one program per choice;
- JAX's ShardMapTest.test_matmul_reduce_scatter, reduced (psum_scatter over ("z", "y"));
- pmax / pmin / psum of edge values (NaN, ±inf, ±0, denormals, extremes) in f32, bf16, f16
  and int32 over ("z", "x").

Oracle: XLA alone can't run here (NCCL refuses two ranks on one GPU), so the orders are held
against XLA:CPU alone (8 host devices, computed first in a child process) and the edge values'
max / min against what XLA alone gives on GPUs, measured on 2x H100 (plugin/tests/
gpu_edge_values.py): f32 / bf16 propagate NaN (XLA's Triton one-shot kernel), f16 skips a NaN
operand (NCCL's fmaxf); -0 below +0 in both, so the fold order does not matter.
Every bit is judged, the sign of zero included. Sums compare to a dtype tolerance.

    PEERLESS_PJRT_LIBRARY=$PWD/.gpu/libpeerless_pjrt.so PYTHONPATH=$PWD/plugin/python \\
      python3 plugin/tests/gpu_group_order.py [--out DIR] [--cpu]
`--cpu` is a dry run without a GPU (eight processes of one CPU device each, gloo between them,
XLA:CPU's answers as the oracle everywhere). Exit status 0 only if every check passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from itertools import permutations

from jobs import free_port, run_workers

HERE = os.path.abspath(__file__)
NPROC = 8
SHAPE, NAMES = (2, 2, 2), ("x", "y", "z")
BLOCK = (8, 16)
ORDER_OPS = ["psum", "all_gather_tiled0", "all_gather_untiled0", "psum_scatter0", "all_to_all", "ppermute_ring"]
EDGE_DTYPES = ["float32", "bfloat16", "float16", "int32"]
EDGE_AXES = ("z", "x")


def ordered_axes():
    return [c for r in range(1, len(NAMES) + 1) for c in permutations(NAMES, r)]


def _ops(jax):
    def ring(k):
        return [(i, (i + 1) % k) for i in range(k)]

    lax = jax.lax
    return {
        "psum": lambda v, a, k: lax.psum(v, a),
        "all_gather_tiled0": lambda v, a, k: lax.all_gather(v, a, axis=0, tiled=True),
        "all_gather_untiled0": lambda v, a, k: lax.all_gather(v, a, axis=0, tiled=False),
        "psum_scatter0": lambda v, a, k: lax.psum_scatter(v, a, scatter_dimension=0, tiled=True),
        "all_to_all": lambda v, a, k: lax.all_to_all(v, a, 0, 1, tiled=True),
        "ppermute_ring": lambda v, a, k: lax.ppermute(v, a, ring(k)),
    }


def edge_values(np, jnp, dtype, rows, seed):
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        pool = np.array([info.min, info.max, 0, 1, -1, info.min + 1, info.max - 1], dtype)
        return pool[rng.integers(0, len(pool), size=(NPROC * rows, 16))]
    fi = jnp.finfo(dtype)
    pool = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -7.0, float(fi.max), -float(fi.max),
                     float(fi.tiny), float(fi.smallest_subnormal), -float(fi.smallest_subnormal)]).astype(dtype)
    x = pool[rng.integers(0, len(pool), size=(NPROC * rows, 16))]
    col = lambda vals: np.repeat(np.array(vals, np.float64), rows).astype(dtype)  # noqa: E731
    x[:, 0] = col([np.nan, 1, 2, 3, 4, 5, 6, 7])
    x[:, 1] = col([1, 2, 3, 4, 5, 6, 7, np.nan])
    x[:, 2] = col([np.inf, np.nan, -np.inf, 1, 2, 3, 4, 5])
    x[:, 3] = col([-0.0, 0.0] * 4)
    x[:, 4] = col([np.nan] * 8)
    return x


def programs(jax, jnp, np, mesh):
    """name -> (fn, input, kind) with kind 'order' (oracle XLA:CPU) or 'edge:<op>'."""
    P = jax.sharding.PartitionSpec
    ops = _ops(jax)
    spec = P(NAMES)
    out = {}
    for axes in ordered_axes():
        k = int(np.prod([mesh.shape[a] for a in axes]))
        fn = jax.shard_map(lambda v, axes=axes, k=k: tuple(ops[o](v, axes, k) for o in ORDER_OPS),
                           mesh=mesh, in_specs=spec, out_specs=spec)
        rng = np.random.default_rng(len(out))
        out["order:" + "+".join(axes)] = (fn, rng.standard_normal((NPROC * BLOCK[0], BLOCK[1])).astype(np.float32))
    mm = jax.shard_map(lambda a, b: jax.lax.psum_scatter(a @ b, ("z", "y"), scatter_dimension=0, tiled=True),
                       mesh=mesh, in_specs=(P("z", "y"), P("y", None)), out_specs=P(("z", "y"), None))
    out["matmul_reduce_scatter"] = (mm, np.arange(64.0, dtype=np.float32).reshape(8, 8))
    for dt in EDGE_DTYPES:
        fn = jax.shard_map(lambda v: (jax.lax.pmax(v, EDGE_AXES), jax.lax.pmin(v, EDGE_AXES), jax.lax.psum(v, EDGE_AXES)),
                           mesh=mesh, in_specs=spec, out_specs=spec)
        out[f"edge:{dt}"] = (fn, edge_values(np, jnp, jnp.dtype(dt), 4, 7))
    return out


def args_of(name, host, mesh, jax):
    """The program's arguments as global arrays (the matmul takes two differently sharded)."""
    P = jax.sharding.PartitionSpec
    ns = lambda *s: jax.sharding.NamedSharding(mesh, P(*s))  # noqa: E731
    mk = lambda a, sh: jax.make_array_from_callback(a.shape, sh, lambda idx: a[idx])  # noqa: E731
    if name == "matmul_reduce_scatter":
        return (mk(host, ns("z", "y")), mk(host, ns("y", None)))
    return (mk(host, ns(NAMES)),)


def oracle(out_dir: str) -> None:
    """XLA:CPU alone, 8 host devices: every program's global outputs."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()[:NPROC]).reshape(SHAPE), NAMES)
    arrays = {}
    with jax._src.config.raise_on_ppermute_sort_diff(False):
        for name, (fn, host) in programs(jax, jnp, np, mesh).items():
            res = jax.jit(fn)(*args_of(name, host, mesh, jax))
            for i, r in enumerate(res if isinstance(res, tuple) else (res,)):
                arrays[f"{name}|{i}"] = np.asarray(r)
    np.savez(os.path.join(out_dir, "oracle.npz"), **{k.replace(":", "@"): v for k, v in arrays.items()})
    print(json.dumps({"oracle": len(arrays)}), flush=True)


def xla_gpu_model(np, x, axes_groups, op):
    """XLA alone's max / min on GPUs (measured on 2x H100, jax 0.11.2): f32 / bf16 on XLA's
    Triton one-shot kernel propagate NaN, f16 on NCCL skips a NaN operand (all-NaN stays NaN);
    both order -0 below +0, so the fold order does not matter."""
    propagate = x.dtype != np.float16
    blocks = np.split(x.astype(np.float32), NPROC)
    out = [None] * NPROC

    def step(acc, v):
        both0 = (acc == 0) & (v == 0)
        if op == "max":
            r = np.where(both0, np.where(np.signbit(acc) & np.signbit(v), np.float32(-0.0), np.float32(0.0)),
                         np.fmax(acc, v))
        else:
            r = np.where(both0, np.where(~np.signbit(acc) & ~np.signbit(v), np.float32(0.0), np.float32(-0.0)),
                         np.fmin(acc, v))
        return np.where(np.isnan(acc) | np.isnan(v), np.float32(np.nan), r) if propagate else r

    for g in axes_groups:
        acc = blocks[g[0]]
        for d in g[1:]:
            acc = step(acc, blocks[d])
        for d in g:
            out[d] = acc
    return np.concatenate(out)


def groups_over(np, axes):
    ids = np.arange(NPROC).reshape(SHAPE)
    grouped = [NAMES.index(a) for a in axes]
    rest = [i for i in range(len(NAMES)) if i not in grouped]
    k = int(np.prod([SHAPE[i] for i in grouped]))
    return np.transpose(ids, rest + grouped).reshape(-1, k).tolist()


def worker(pid: int, port: int, oracle_dir: str, platform: str) -> None:
    import jax

    if platform == "cpu":  # a dry run of this script without a GPU: one CPU device per process
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=NPROC, process_id=pid,
                                   initialization_timeout=300)
    else:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=NPROC, process_id=pid,
                                   local_device_ids=[0], initialization_timeout=300)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh

    from jax_plugins.peerless import inside

    want_all = np.load(os.path.join(oracle_dir, "oracle.npz"))
    mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: d.id)).reshape(SHAPE), NAMES)
    report: dict = {"pid": pid, "device": jax.local_devices()[0].id, "results": {}}
    inside.enable(platform)
    with jax._src.config.raise_on_ppermute_sort_diff(False):
        for name, (fn, host) in programs(jax, jnp, np, mesh).items():
            res: dict = {}
            try:
                jax.clear_caches()
                f = jax.jit(fn)
                args = args_of(name, host, mesh, jax)
                res["peerless"] = f.lower(*args).compile().as_text().count('custom_call_target="peerless.')
                outs = jax.block_until_ready(f(*args))
                outs = jax.block_until_ready(f(*args))  # a second run: epochs advance
                outs = outs if isinstance(outs, tuple) else (outs,)
                bad = []
                zero_sign = []
                for i, o in enumerate(outs):
                    (shard,) = o.addressable_shards
                    got = np.asarray(shard.data)
                    want_full = want_all[f"{name}|{i}".replace(":", "@")]
                    if want_full.dtype.kind == "V":  # npz keeps bfloat16 as raw 2-byte records
                        want_full = want_full.view(got.dtype)
                    if name.startswith("edge:") and i < 2 and platform == "cuda" and got.dtype != np.int32:
                        want_full = xla_gpu_model(np, np.asarray(host), groups_over(np, EDGE_AXES), ("max", "min")[i])
                        want_full = want_full.astype(got.dtype)
                    want = want_full[shard.index]
                    if got.dtype.kind == "f" or got.dtype == jnp.bfloat16:
                        g64, w64 = got.astype(np.float64), want.astype(np.float64)
                        if name.startswith("edge:") and i < 2:
                            ok = np.array_equal(g64, w64, equal_nan=True)
                            zs = (g64 == 0) & (w64 == 0) & (np.signbit(g64) != np.signbit(w64))
                            zero_sign.append(int(zs.sum()))
                            ok = ok and not zs.any()  # the sign of zero too
                        elif name.startswith("order:") and ORDER_OPS[i] not in ("psum", "psum_scatter0"):
                            ok = np.array_equal(got.view(np.uint8), want.view(np.uint8))  # moved, not computed
                        else:
                            tol = 2e-2 if got.dtype != np.float32 else 1e-5
                            ok = bool(np.allclose(g64, w64, rtol=tol, atol=tol, equal_nan=True))
                    else:
                        ok = np.array_equal(got, want)
                    if not ok:
                        bad.append(i)
                res["same"] = not bad
                res["bad_outputs"] = bad
                if zero_sign:
                    res["zero_sign_differs"] = zero_sign
            except Exception as e:  # noqa: BLE001 - reported; the check fails
                res["error"] = str(e)[:1500]
            report["results"][name] = res
    report["decisions"] = [{k: d[k] for k in ("op", "groups", "implementation")} for d in inside.decisions()
                           if d["op"] != "collective-permute"][:40]
    report["kernels"] = sum(v["kernel"] for v in inside.stats().values())
    report["fallbacks"] = sum(v["fallback"] for v in inside.stats().values())
    print(json.dumps(report), flush=True)
    os._exit(0)


def main() -> int:
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "/tmp/peerless_group_order"
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    cpu_env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    r = subprocess.run([sys.executable, HERE, "_oracle", out_dir], env=cpu_env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        print("oracle (XLA:CPU alone) failed:\n" + r.stderr[-3000:])
        return 1
    print(f"oracle: XLA:CPU alone, 8 host devices, {time.time() - t0:.0f} s")
    platform = "cpu" if "--cpu" in sys.argv else "cuda"
    port = free_port()
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS=platform,
        PEERLESS_FLAGS="--collective_timeout_ms=30000",
        PEERLESS_XLA_PLUGIN="none",  # JAX's own CUDA backend; no "peerless" platform
        XLA_PYTHON_CLIENT_PREALLOCATE="false",  # eight processes share one GPU's memory
        NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
    )
    reps = run_workers(lambda i: [sys.executable, HERE, "_worker", str(i), str(port), out_dir, platform],
                       NPROC, env, timeout=480, stderr_tail=3000)
    with open(os.path.join(out_dir, "gpu_group_order.json"), "w") as fh:
        json.dump(reps, fh, indent=1)
    ok = True
    for r in reps:
        if r["rc"] != 0 or "results" not in r:
            ok = False
            print(f"process {r.get('pid', '?')}: rc {r['rc']}\n{r['stderr']}")
    if not all("results" in r for r in reps):
        print("FAIL")
        return 1
    print(f"{'program':24s} {'same (8 procs)':>14s} {'peerless calls':>14s}  notes")
    for name in reps[0]["results"]:
        rows = [r["results"][name] for r in reps]
        same = all(x.get("same") for x in rows)
        calls = rows[0].get("peerless", 0)
        ok &= same and calls > 0
        notes = next((x["error"][:200] for x in rows if "error" in x), "")
        bad = sorted({b for x in rows for b in x.get("bad_outputs", [])})
        if bad:
            notes += f" outputs differing: {bad}"
        zs = [x.get("zero_sign_differs") for x in rows if any(x.get("zero_sign_differs") or [])]
        if zs:
            notes += f" sign of zero differs (max, min): {zs[0]}"
        print(f"{name:24s} {str(same):>14s} {calls:>14d}  {notes}")
    print(f"kernels {reps[0]['kernels']} fallbacks {reps[0]['fallbacks']} (process 0's decisions)")
    for d in reps[0]["decisions"][:6]:
        print("  ", d)
    ok &= reps[0]["fallbacks"] == 0
    print(f"{time.time() - t0:.0f} s; " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
    elif len(sys.argv) > 1 and sys.argv[1] == "_oracle":
        oracle(sys.argv[2])
    else:
        sys.exit(main())
