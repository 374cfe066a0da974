"""Peerless inside XLA across processes: `jax.distributed` with 2 processes × 4 CPU devices on
localhost (XLA's CPU collectives between processes: gloo), Peerless's pass and handlers on.

Each test starts a job: two worker processes (this file, `_worker` mode) that meet through a
coordinator on a free port. A worker compiles every program twice, with the pass (Peerless
takes groups inside a process as before, and groups across the two processes through POSIX
shared memory) and without it (XLA alone, the oracle), runs both on the same inputs and
compares: integers exactly, floats to a tolerance. Programs: shard_map collectives over a
2×4 mesh (groups inside a process, across the processes, all 8 devices) and auto-partitioned
jit on NamedSharding arrays. The workers also report the decisions, so the test checks that
Peerless really took the groups across processes.

The second start: a job started twice on one fresh JAX persistent compilation cache loads every
program from the cache the second time (no compile, no pass), runs Peerless's collectives
right (against XLA alone), and reports the same decisions (`stats()`); two jobs at once on
that cache (two job tokens) both work and never meet.

Faults: a process that leaves before a collective makes the other fail with a timeout error
naming the collective, the group and the missing ranks; two jobs at once on one host never
meet each other's segments; no /dev/shm entry is left behind, a killed process included.

Run (from the repository root):
    cargo build -p peerless-pjrt
    PEERLESS_PJRT_LIBRARY=$PWD/target/debug/libpeerless_pjrt.so PYTHONPATH=plugin/python \\
      python3 -m pytest -q plugin/tests/test_multiprocess.py
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

import pytest

from jobs import free_port, run_workers

HERE = os.path.abspath(__file__)
LOCAL = 4  # CPU devices per process
TIMEOUT_MS = 4000  # Peerless's collective timeout in these jobs


def _litter() -> set[str]:
    return set(glob.glob("/dev/shm/peerless-*"))


def run_job(mode: str, n: int = 2, extra_env: dict | None = None, timeout: float = 300) -> list[dict]:
    """Starts `n` workers in `mode`; returns each one's JSON report (rc and stderr added)."""
    port = free_port()
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        PEERLESS_ENABLE="1",
        PEERLESS_FLAGS=f"--collective_timeout_ms={TIMEOUT_MS}",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={LOCAL}",
        PEERLESS_XLA_PLUGIN="none",  # the JAX_PLATFORMS=peerless wrapper is not under test
        PEERLESS_TUNING_PROFILE="0",  # the kernels across processes are under test, not a profile
    )
    env.update(extra_env or {})
    reps = run_workers(lambda i: [sys.executable, HERE, "_worker", str(i), str(n), str(port), mode], n, env, timeout)
    if any(r["hung"] for r in reps):
        pytest.fail(f"job {mode} hung past {timeout} s:\n" + "\n".join(r["stderr"][-3000:] for r in reps))
    return reps


# ----------------------------------------------------------------------------- worker side

def _programs(jax, jnp, np, mesh):
    from jax.sharding import NamedSharding, PartitionSpec as P

    spec = P(("p", "l"))
    n = 2 * LOCAL
    ring = [(i, (i + 1) % n) for i in range(n)]

    def sm(body, out=spec):
        return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=out, check_vma=False)

    rng = np.random.default_rng(7)
    xf = rng.standard_normal((8 * n, 16)).astype(np.float32)
    xi = rng.integers(-50, 50, (8 * n, 16)).astype(np.int32)
    progs = {
        # Groups inside each process.
        "psum_local": (sm(lambda v: jax.lax.psum(v, "l")), xf),
        # Groups {d, d+4} across the two processes.
        "psum_across": (sm(lambda v: jax.lax.psum(v, "p")), xf),
        # One group of all 8 devices.
        "psum_all": (sm(lambda v: jax.lax.psum(v, ("p", "l"))), xf),
        "pmax_all_i32": (sm(lambda v: jax.lax.pmax(v, ("p", "l"))), xi),
        "all_gather_all": (sm(lambda v: jax.lax.all_gather(v, ("p", "l"), axis=0, tiled=True)), xf),
        "all_to_all_all": (sm(lambda v: jax.lax.all_to_all(v, ("p", "l"), 1, 1, tiled=True)),
                           rng.standard_normal((8 * n, 8 * n)).astype(np.float32)),
        "psum_scatter_across": (sm(lambda v: jax.lax.psum_scatter(v, "p", scatter_dimension=1, tiled=True)), xf),
        "ppermute_ring": (sm(lambda v: jax.lax.ppermute(v, ("p", "l"), ring)), xf),
        "chain": (sm(lambda v: jax.lax.psum(jax.lax.psum(v * 2.0, "l") + 1.0, "p")), xf),
        # Chained collectives of one group across processes share one segment:
        # an all-reduce, an all-gather of its result, another all-reduce, twice over.
        "chain_across": (sm(lambda v: jax.lax.psum(jax.lax.all_gather(
            jax.lax.psum(jax.lax.psum(v, ("p", "l")) * 0.5, ("p", "l")), ("p", "l"), axis=0, tiled=True)[:v.shape[0]]
            + v, ("p", "l"))), xf),
    }
    # Group order: the 2 x 4 devices as a ("p", "a", "b") mesh of 2x2x2, collectives over axes
    # named out of mesh order (a member's place in its group decides where its block goes).
    from jax.sharding import Mesh

    mesh3 = Mesh(np.array(mesh.devices).reshape(2, 2, 2), ("p", "a", "b"))
    spec3 = NamedSharding(mesh3, P(("p", "a", "b")))

    def sm3(body):
        return jax.shard_map(body, mesh=mesh3, in_specs=P(("p", "a", "b")), out_specs=P(("p", "a", "b")),
                             check_vma=False)

    for axes in ORDER_AXES:
        k = 1
        for a in axes:
            k *= mesh3.shape[a]
        tag = "+".join(axes)
        progs[f"order_all_gather_{tag}"] = (sm3(lambda v, a=axes: jax.lax.all_gather(v, a, axis=0, tiled=True)),
                                            (xf, spec3))
        progs[f"order_psum_scatter_{tag}"] = (
            sm3(lambda v, a=axes: jax.lax.psum_scatter(v, a, scatter_dimension=0, tiled=True)), (xf, spec3))
        progs[f"order_all_to_all_{tag}"] = (sm3(lambda v, a=axes: jax.lax.all_to_all(v, a, 0, 0, tiled=True)),
                                            (xf, spec3))
        progs[f"order_ppermute_{tag}"] = (
            sm3(lambda v, a=axes, k=k: jax.lax.ppermute(v, a, [(i, (i + 1) % k) for i in range(k)])), (xf, spec3))
    # Edge values through max / min across the processes, bit for bit. Only values whose max /
    # min does not depend on the order of folding: with NaN or -0/+0 ties, XLA alone's answer
    # in a multi-process job depends on gloo's schedule (measured: neither a fold in group order
    # nor one from the identity reproduces it), where Peerless gives XLA:CPU's in-process answer
    # (NaN skipped, the earlier zero kept; plugin/tests/test_xla_inside.py holds that).
    # Denormals are left out too: XLA:CPU flushes them to signed zeros on the way in.
    pool = np.array([np.inf, -np.inf, 0.0, 1.0, -2.5, 3.4e38, -3.4e38, 1.2e-38, -1.2e-38], np.float32)
    edge = rng.choice(pool, (8 * n, 16))
    progs["edge_pmax_f32"] = (sm3(lambda v: jax.lax.pmax(v, ("b", "p"))), (edge, spec3))
    progs["edge_pmin_f32"] = (sm3(lambda v: jax.lax.pmin(v, ("b", "p"))), (edge, spec3))
    # Auto-partitioned jit: a contraction sharded over all 8 devices, and a DP train step.
    w = rng.standard_normal((16, 8)).astype(np.float32) * 0.1
    rows, cols = NamedSharding(mesh, P(None, ("p", "l"))), NamedSharding(mesh, P(("p", "l"), None))
    progs["jit_matmul_sharded_k"] = ((lambda a, b: a @ b), (rng.standard_normal((8, 16 * n)).astype(np.float32), rows),
                                     (rng.standard_normal((16 * n, 8)).astype(np.float32), cols))

    def loss(w, x, y):
        return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

    progs["jit_dp_step"] = ((lambda w, x, y: w - 0.1 * jax.grad(loss)(w, x, y)),
                            (w, NamedSharding(mesh, P())), (xf, NamedSharding(mesh, spec)),
                            (rng.standard_normal((8 * n, 8)).astype(np.float32), NamedSharding(mesh, spec)))
    return progs


# Axes of the ("p", "a", "b") mesh named out of mesh order, across and inside the processes.
ORDER_AXES = [("b", "p"), ("a", "p", "b"), ("b", "a"), ("p", "b", "a")]


def EXACT(name):
    """Programs whose results must be XLA's bit for bit: data movement, and max / min."""
    return name.startswith("edge_") or (name.startswith("order_") and "psum" not in name)


def _put(jax, np, mesh, arg):
    from jax.sharding import NamedSharding, PartitionSpec as P

    host, sharding = arg if isinstance(arg, tuple) else (arg, NamedSharding(mesh, P(("p", "l"))))
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def _local(np, r):
    """This process's shards of `r`, in device order (each process checks its own)."""
    shards = sorted(r.addressable_shards, key=lambda s: s.device.id)
    return np.concatenate([np.asarray(s.data).reshape(-1) for s in shards])


def worker(pid: int, nproc: int, port: int, mode: str) -> None:
    import re

    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=pid,
                               initialization_timeout=120)
    import numpy as np
    import jax.numpy as jnp
    from jax.sharding import Mesh

    from jax_plugins.peerless import inside

    devs = np.array(jax.devices()).reshape(nproc, LOCAL)
    mesh = Mesh(devs, ("p", "l"))
    report: dict = {"pid": pid, "devices": [d.id for d in jax.local_devices()]}
    if mode in ("programs", "second_job"):
        progs = _programs(jax, jnp, np, mesh)
        if mode == "second_job":
            progs = {k: progs[k] for k in ("psum_all", "psum_across")}
        results = {}
        for name, (fn, *args) in progs.items():
            args = [_put(jax, np, mesh, a) for a in args]
            got = []
            for enabled in (True, False):
                (inside.enable if enabled else inside.disable)("cpu")
                jax.clear_caches()
                jax.config.update("jax_raise_on_ppermute_sort_diff", False)  # ppermute over ("b", "p")
                f = jax.jit(fn)
                hlo = f.lower(*args).compile().as_text() or ""
                vals = [f(*args) for _ in range(3)]  # several calls: epochs advance
                calls = [ln for ln in hlo.splitlines() if 'custom_call_target="peerless.' in ln]
                slots = sorted({m.group(1) for ln in calls for m in [re.search(r"slot = (\d+) ", ln)] if m})
                shared = sum("processes = " in ln for ln in calls)
                got.append((_local(np, vals[-1]), bool(calls), (len(calls), len(slots), shared)))
            (a, took, shape), (b, oracle_took, _) = got
            if np.issubdtype(a.dtype, np.integer) or EXACT(name):
                same = bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))
            else:
                same = bool(np.allclose(a, b, rtol=1e-5, atol=1e-5))
            # (Peerless calls, distinct slots, calls across processes)
            results[name] = {"same": same, "peerless": took, "oracle_peerless": oracle_took, "slots": shape}
            if not same:
                ab, bb = a.view(np.uint8).reshape(a.size, -1), b.view(np.uint8).reshape(b.size, -1)
                bad = np.flatnonzero((ab != bb).any(1))[:5]
                results[name]["first_differences"] = [(int(i), ab[i].tobytes().hex(), bb[i].tobytes().hex()) for i in bad]
        inside.enable("cpu")
        report["results"] = results
        report["decisions"] = [
            {k: d[k] for k in ("op", "groups", "implementation", "reason")} for d in inside.decisions()
        ]
        report["stats"] = inside.stats()
    elif mode == "platforms":
        # PEERLESS_ENABLE=1 in a GPU job enables cpu and cuda, and each platform asks for the
        # job's topology; the second once found the job's keys taken (ALREADY_EXISTS) and
        # left every module of its platform to XLA.
        first = inside._topology("cpu", "cpu")
        inside._state["topology"].clear()  # as a second platform, which has none of its own yet
        second = inside._topology("cpu", "cpu")
        report["same_job"] = first == second and "job=" in first
        f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, ("p", "l")), mesh=mesh,
                                  in_specs=jax.sharding.PartitionSpec(("p", "l")),
                                  out_specs=jax.sharding.PartitionSpec(("p", "l"))))
        x = _put(jax, np, mesh, np.ones((8 * nproc, 4), np.float32))
        inside._state["topology"].clear()
        report["peerless"] = 'custom_call_target="peerless.' in (f.lower(x).compile().as_text() or "")
        report["sum"] = float(_local(np, f(x)).sum())
        report["stats"] = inside.stats()
    elif mode == "cached":
        report.update(_cached(jax, jnp, np, mesh, inside))
    elif mode == "shared_binary":
        report.update(_shared_binary(jax, jnp, np, mesh, inside))
    elif mode == "leave":
        # Process 1 leaves (before the first call: it never arrives; or killed after one call,
        # once the segments were attached); process 0 must time out.
        f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, ("p", "l")), mesh=mesh,
                                  in_specs=jax.sharding.PartitionSpec(("p", "l")),
                                  out_specs=jax.sharding.PartitionSpec(("p", "l"))))
        x = _put(jax, np, mesh, np.ones((8 * nproc, 4), np.float32))
        f.lower(x).compile()
        how = os.environ.get("PEERLESS_TEST_LEAVE", "before")
        if how == "kill_after":
            jax.block_until_ready(f(x))
        if pid == 1:
            print(json.dumps(report), flush=True)
            if how == "kill_after":
                os.kill(os.getpid(), 9)
            os._exit(0)
        t0 = time.time()
        try:
            jax.block_until_ready(f(x))
            report["error"] = None
        except Exception as e:  # noqa: BLE001
            report["error"] = str(e)
        report["waited_s"] = time.time() - t0
        print(json.dumps(report), flush=True)
        os._exit(0)  # the coordinator would wait for process 1 at shutdown
    print(json.dumps(report), flush=True)


# Programs of the persistent-cache jobs: groups inside a process, across processes, all 8
# devices, a chain, a DP train step, and a module whose first collective stays XLA's (a group
# of one device) beside one on Peerless.
CACHED = ["psum_local", "psum_across", "psum_all", "all_gather_all", "ppermute_ring", "chain", "jit_dp_step"]


def _cached(jax, jnp, np, mesh, inside) -> dict:
    """Mode "cached": every program compiled (or loaded from the persistent cache) with
    Peerless on and by XLA alone, run, compared; with what the
    cache did for each Peerless compile."""
    from jax._src import monitoring
    from jax.sharding import Mesh, PartitionSpec as P

    # The cache itself is configured through JAX's environment (JAX_COMPILATION_CACHE_DIR, ...:
    # see the test), as a user's job would be, before anything compiles.
    events: list[str] = []
    monitoring.register_event_listener(lambda e, **_: events.append(e))
    progs = {k: v for k, v in _programs(jax, jnp, np, mesh).items() if k in CACHED}
    mesh1 = Mesh(np.array(mesh.devices).reshape(2, LOCAL, 1), ("p", "l", "o"))
    spec1 = P(("p", "l"))
    progs["mixed"] = (jax.shard_map(lambda v: jax.lax.psum(jax.lax.psum(v, "o") * 2.0, ("p", "l")), mesh=mesh1,
                                    in_specs=spec1, out_specs=spec1, check_vma=False),
                      np.arange(8 * 2 * LOCAL * 4, dtype=np.float32).reshape(8 * 2 * LOCAL, 4))
    results, cache = {}, {}
    inside.reset_stats()
    for name, (fn, *args) in progs.items():
        args = [_put(jax, np, mesh, a) for a in args]
        got = []
        for enabled in (True, False):
            (inside.enable if enabled else inside.disable)("cpu")
            jax.clear_caches()
            before = len(events)
            c = jax.jit(fn).lower(*args).compile()
            seen = events[before:]
            if enabled:
                cache[name] = {"looked": seen.count("/jax/compilation_cache/compile_requests_use_cache"),
                               "hit": seen.count("/jax/compilation_cache/cache_hits")}
                hlo = c.as_text() or ""
            vals = [c(*args) for _ in range(3)]
            got.append(_local(np, vals[-1]))
        a, b = got
        same = bool(np.array_equal(a, b)) if np.issubdtype(a.dtype, np.integer) else bool(
            np.allclose(a, b, rtol=1e-5, atol=1e-5))
        results[name] = {"same": same, "peerless": 'custom_call_target="peerless.' in hlo,
                         "token_in_hlo": any(t.split("job=")[1].split(";")[0] in hlo
                                             for t in inside._state["topology"].values() if "job=" in t)}
    inside.enable("cpu")
    tokens = [t.split("job=")[1].split(";")[0] for t in inside._state["topology"].values() if "job=" in t]
    return {"results": results, "cache": cache, "stats": inside.stats(), "job": tokens,
            "decisions": [{k: d[k] for k in ("op", "groups", "implementation", "reason", "cached")}
                          for d in inside.decisions()],
            "handler_calls": inside.handler_calls("cpu")}


def _shared_binary(jax, jnp, np, mesh, inside) -> dict:
    """Mode "shared_binary": process 0 compiles each program with Peerless on and hands the
    serialized executable to process 1 through the job's key-value store; process 1 loads it
    without compiling (as every process but 0 does with a GPU job's persistent cache, which
    only process 0 writes). Both run it and compare with XLA alone."""
    from jax._src import distributed
    from jax.experimental.serialize_executable import deserialize_and_load, serialize

    client = distributed.global_state.client
    pid = distributed.global_state.process_id
    progs = {k: v for k, v in _programs(jax, jnp, np, mesh).items() if k in CACHED}
    inside.enable("cpu")  # agrees on the job's topology now: process 1 compiles nothing
    inside.reset_stats()
    results = {}
    for name, (fn, *args) in progs.items():
        args = [_put(jax, np, mesh, a) for a in args]
        jax.clear_caches()
        inside.enable("cpu")
        lowered = jax.jit(fn).lower(*args)
        if pid == 0:
            c = lowered.compile()
            client.key_value_set_bytes(f"test/exe/{name}", serialize(c)[0])
        else:
            blob = client.blocking_key_value_get_bytes(f"test/exe/{name}", 120_000)
            c = deserialize_and_load(blob, lowered.in_tree, lowered.out_tree, backend="cpu")
        a = _local(np, [c(*args) for _ in range(3)][-1])
        inside.disable("cpu")
        jax.clear_caches()
        b = _local(np, jax.jit(fn).lower(*args).compile()(*args))
        results[name] = {"same": bool(np.allclose(a, b, rtol=1e-5, atol=1e-5)),
                         "peerless": 'custom_call_target="peerless.' in (c.as_text() or "")}
    inside.enable("cpu")
    return {"results": results, "stats": inside.stats(),
            "decisions": [{k: d[k] for k in ("op", "groups", "implementation", "reason", "cached")}
                          for d in inside.decisions()]}


# ----------------------------------------------------------------------------- tests

@pytest.fixture(scope="module")
def job():
    before = _litter()
    reps = run_job("programs")
    for r in reps:
        assert r["rc"] == 0, r["stderr"]
    yield reps
    assert _litter() - before == set(), "shared segments left in /dev/shm"


PROGRAMS = ["psum_local", "psum_across", "psum_all", "pmax_all_i32", "all_gather_all", "all_to_all_all",
            "psum_scatter_across", "ppermute_ring", "chain", "chain_across", "jit_matmul_sharded_k", "jit_dp_step",
            "edge_pmax_f32", "edge_pmin_f32"] + [
    f"order_{op}_{'+'.join(a)}" for a in ORDER_AXES for op in ("all_gather", "psum_scatter", "all_to_all", "ppermute")]


@pytest.mark.parametrize("name", PROGRAMS)
def test_program_matches_xla(job, name):
    for r in job:
        res = r["results"][name]
        assert res["same"], f"process {r['pid']}: {name} differs from XLA alone: {res.get('first_differences')}"
        assert res["peerless"], f"process {r['pid']}: {name} has no Peerless custom call"
        assert not res["oracle_peerless"]


def test_chained_collectives_across_processes_share_one_segment(job):
    """4 chained collectives of one group spanning both processes get one slot,
    so each process maps one shared-memory segment for them (and results equal XLA's,
    test_program_matches_xla)."""
    for r in job:
        assert r["results"]["chain_across"]["slots"] == [4, 1, 4], r["results"]["chain_across"]


def test_groups_across_processes_run_on_shared_memory(job):
    for r in job:
        across = [d for d in r["decisions"] if "shared memory" in d["reason"]]
        assert across, r["decisions"]
        assert all(d["implementation"] != "fallback" for d in across)
        assert r["stats"]["all-reduce"].get("cross_process", 0) > 0, r["stats"]
    # Both processes decided alike.
    assert [d["implementation"] for d in job[0]["decisions"]] == [d["implementation"] for d in job[1]["decisions"]]


def test_every_platform_shares_the_jobs_topology():
    """the job's token and hosts are agreed once per job, however many platforms
    (PEERLESS_ENABLE=1: cpu and cuda) ask; a compile after a second ask still takes its
    collectives across processes, and nothing is left to XLA."""
    reps = run_job("platforms")
    for r in reps:
        assert r["rc"] == 0, r["stderr"]
        assert r["same_job"], r
        assert r["peerless"], r
        assert "left_to_xla" not in r["stats"], r["stats"]
        # This process's 4 devices × 2 rows × 4 columns of ones, each summed over 8 devices.
        assert r["sum"] == LOCAL * 2 * 4 * 8, r
    assert all("process topology unknown" not in r["stderr"] for r in reps)


def test_groups_across_hosts_fall_back():
    """Processes that cannot see each other's shared memory are on different hosts: XLA's
    collective (gloo) runs the groups across them, with a reason that says so."""
    reps = run_job("second_job", extra_env={"PEERLESS_SHARED_MEMORY": "0"})
    for r in reps:
        assert r["rc"] == 0, r["stderr"]
        assert all(x["same"] for x in r["results"].values()), r["results"]
        across = [d for d in r["decisions"] if "spans hosts" in d["reason"]]
        assert across and all(d["implementation"] == "fallback" for d in across), r["decisions"]


def test_two_jobs_at_once_stay_apart():
    before = _litter()
    port_jobs = []
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(2) as ex:
        port_jobs = list(ex.map(lambda _: run_job("second_job"), range(2)))
    for reps in port_jobs:
        for r in reps:
            assert r["rc"] == 0, r["stderr"]
            assert all(x["same"] and x["peerless"] for x in r["results"].values()), r["results"]
    assert _litter() - before == set()


def test_the_second_start_loads_from_the_persistent_cache(tmp_path):
    """A job started twice on one fresh persistent compilation cache: the second start loads
    every program (no compile, no pass), runs it right, and knows the same decisions; then
    two jobs at once on that cache (two job tokens) both do, without meeting.

    Only process 0 loads: JAX writes the cache from process 0 only, and on XLA:CPU its key
    differs between processes (the "accelerator_config" part hashes each process's view of
    the devices), so process 1 compiles every start. Process 0 then runs a module compiled
    by an earlier job beside process 1's fresh compile: nothing of the first job may be in
    it, and both must agree on every collective that spans them."""
    before = _litter()
    cache = tmp_path / "jax-cache"
    env = {"JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}
    first = run_job("cached", extra_env=env)
    for r in first:
        assert r["rc"] == 0, r["stderr"]
    # Process 0 compiled every program (and wrote the cache); process 1 may already have
    # loaded some of them from there.
    assert all(c == {"looked": 1, "hit": 0} for c in first[0]["cache"].values()), first[0]["cache"]
    written = sorted(os.listdir(cache))
    assert written
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(2) as ex:
        later = list(ex.map(lambda _: run_job("cached", extra_env=env), range(2)))
    assert sorted(os.listdir(cache)) == written, "a later start compiled and wrote again"
    tokens = set()
    for reps in [first] + later:
        for r in reps:
            assert r["rc"] == 0, r["stderr"]
            for name, res in r["results"].items():
                assert res["same"], f"process {r['pid']}: {name} differs from XLA alone"
                assert res["peerless"], f"process {r['pid']}: {name} has no Peerless custom call"
                assert not res["token_in_hlo"], f"process {r['pid']}: {name}: the job token is in the module"
            # The same decisions as the first start's process 0, which ran the pass on every program.
            assert r["stats"] == first[0]["stats"], (r["pid"], r["stats"], first[0]["stats"])
            strip = [{k: v for k, v in d.items() if k != "cached"} for d in r["decisions"]]
            assert sorted(map(str, strip)) == sorted(
                str({k: v for k, v in d.items() if k != "cached"}) for d in first[0]["decisions"])
            assert r["handler_calls"] > 0
        job = {tuple(r["job"]) for r in reps}
        assert len(job) == 1 and len(next(iter(job))) == 1, f"the processes of one job agree on its token: {job}"
        tokens |= job
    assert len(tokens) == 3, f"three jobs, three tokens: {tokens}"
    for reps in later:
        p0 = reps[0]
        assert all(c == {"looked": 1, "hit": 1} for c in p0["cache"].values()), p0["cache"]
        assert all(d["cached"] for d in p0["decisions"]), p0["decisions"]
    st = first[0]["stats"]
    assert st["all-reduce"]["kernel"] > 0 and st["all-reduce"]["fallback"] > 0, st  # "mixed"
    assert st["all-reduce"].get("cross_process", 0) > 0, st
    assert _litter() - before == set()


def test_a_process_runs_what_another_compiled():
    """Process 1 runs executables process 0 compiled (no pass in process 1): the job's token
    and topology come from process 1 itself, the decisions from the executables' calls."""
    before = _litter()
    reps = run_job("shared_binary")
    for r in reps:
        assert r["rc"] == 0, r["stderr"]
        for name, res in r["results"].items():
            assert res["same"] and res["peerless"], (r["pid"], name, res)
    p0, p1 = reps
    assert not any(d["cached"] for d in p0["decisions"]) and all(d["cached"] for d in p1["decisions"])
    assert p1["stats"] == p0["stats"] and p0["stats"]["all-reduce"].get("cross_process", 0) > 0, (p0, p1)
    assert _litter() - before == set()


@pytest.mark.parametrize("how", ["before", "kill_after"])
def test_a_process_that_leaves_makes_the_other_time_out(how):
    before = _litter()
    reps = run_job("leave", extra_env={"PEERLESS_TEST_LEAVE": how})
    p0 = reps[0]
    assert p0["rc"] == 0, p0["stderr"]
    err = p0["error"]
    assert err and "timed out" in err, err
    # The collective, its group and the missing ranks (process 1's devices 2048..2051).
    assert "all-reduce" in err and "2048" in err and "group" in err, err
    assert p0["waited_s"] < TIMEOUT_MS / 1000 * 3 + 5
    assert _litter() - before == set()


if __name__ == "__main__" and sys.argv[1:2] == ["_worker"]:
    worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
