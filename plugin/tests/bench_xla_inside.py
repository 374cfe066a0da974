"""Benchmark: Peerless inside XLA vs XLA alone, on XLA's CPU backend with 8 host devices.

(a) runtime: median µs per call of a few programs (data-parallel MLP train step, tensor-
    parallel matmul, FSDP weight gather, a psum-heavy shard_map loop), each compiled by XLA
    alone and with Peerless's pass; calls of the two alternate, each waited for.
(b) compile: `jax.jit(step).lower(*args).compile()` of a large program (an N-layer
    transformer train step, unrolled, auto-partitioned over a data × model mesh), fresh each
    time (`jax.clear_caches()` between), median over repetitions; plus the time spent inside
    Peerless's pass callback (the ctypes call into Rust and the Python bookkeeping).

Not a test: prints a table. Run from the repository root (time a release build: the dev
profile builds workspace crates at opt-level 1):
    cargo build --release -p peerless-pjrt
    PEERLESS_PJRT_LIBRARY=$PWD/target/release/libpeerless_pjrt.so PYTHONPATH=plugin/python \
      python3 plugin/tests/bench_xla_inside.py [--runs 200] [--compile-reps 5] [--layers 32]
Goal: both ratios <= 1.1. On a loaded machine compile times swing by tens of percent; the
"compile CPU s" column (this process's user + system time) is steadier than wall time.
"""

import argparse
import gc
import os
import platform
import statistics
import sys
import time

_COUNT_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _COUNT_FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless as peerless  # noqa: E402
from jax_plugins.peerless import inside  # noqa: E402

CPU = "cpu"

# ---- timing the pass callback ------------------------------------------------------------------

PASS_TIME = {"calls": 0, "seconds": 0.0}
TIMES = {"lower": 0.0, "compile": 0.0, "compile_cpu": 0.0}  # of the latest compile_with


def rust_pass_seconds(module, reps=5):
    """The Rust pass alone (PeerlessXlaPass: decode, decide, rewrite) on a module it was
    handed during a compile, median of `reps` calls."""
    dll = inside._dll()
    local = ",".join(str(d.id) for d in jax.local_devices(backend=CPU)).encode()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        res = dll.PeerlessXlaPass(CPU.encode(), module, len(module), b"", local)
        ts.append(time.perf_counter() - t)
        dll.PeerlessXlaPassFree(res)
    return statistics.median(ts)
_make_pass = inside._make_pass


def _timed_make_pass(platform_name, local_devices=None, backend=None):
    run = _make_pass(platform_name, local_devices, backend)

    def timed(module):
        t = time.perf_counter()
        try:
            return run(module)
        finally:
            PASS_TIME["calls"] += 1
            PASS_TIME["seconds"] += time.perf_counter() - t
            PASS_TIME["module"] = module


    return timed


inside._make_pass = _timed_make_pass  # enable() builds its callback through this name


def _noop_pass(module):
    PASS_TIME["calls"] += 1
    return None


def compile_with(mode, f, args, **jit_kw):
    """mode: "xla" (XLA alone), "hook" (a pass callback that changes nothing: the cost of
    XLA handing the module to Python and back), "peerless"."""
    from jax.extend import xla as jxla

    jax.clear_caches()
    if mode == "peerless":
        peerless.enable(CPU)
    elif mode == "hook":
        jxla.register_hlo_module_transformation(
            _noop_pass, name="bench_noop", stage=jxla.PipelineStage.PRE_SCHEDULER, platforms=[CPU])
    try:
        t0 = time.perf_counter()
        lowered = jax.jit(f, **jit_kw).lower(*args)
        t1, c1 = time.perf_counter(), os.times()
        compiled = lowered.compile()
        c2 = os.times()
        TIMES.update(lower=t1 - t0, compile=time.perf_counter() - t1,
                     compile_cpu=(c2.user + c2.system) - (c1.user + c1.system))
        return compiled
    finally:
        if mode == "hook":
            jxla.clear_hlo_module_transformation("bench_noop", jxla.PipelineStage.PRE_SCHEDULER, platforms=[CPU])
        peerless.disable(CPU)
        jax.clear_caches()


# ---- programs ------------------------------------------------------------------------------------


def devices(k=8):
    d = jax.devices(CPU)
    if len(d) < k:
        sys.exit(f"needs {k} CPU devices, XLA has {len(d)}")
    return d[:k]


def put(mesh, a, *spec):
    return jax.device_put(a, NamedSharding(mesh, P(*spec)))


def rnd(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def mlp_step(p, x, y):
    def loss(p):
        h = jax.nn.gelu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    l, g = jax.value_and_grad(loss)(p)
    return jax.tree.map(lambda a, b: a - 1e-3 * b, p, g), l


def runtime_programs(size):
    """name -> (f, args, jit kwargs). `size` scales the arrays (1: the default)."""
    mesh = Mesh(np.array(devices()), ("x",))
    d, h, b = 128 * size, 512 * size, 256
    progs = {}
    p = {
        "w1": put(mesh, rnd((d, h), 1, 0.05)), "b1": put(mesh, rnd((h,), 2, 0.05)),
        "w2": put(mesh, rnd((h, d), 3, 0.05)), "b2": put(mesh, rnd((d,), 4, 0.05)),
    }
    progs["dp_mlp_train_step"] = (mlp_step, (p, put(mesh, rnd((b, d), 5), "x"), put(mesh, rnd((b, d), 6), "x")), {})
    a = put(mesh, rnd((b, 1024), 7), None, "x")
    w = put(mesh, rnd((1024, 512 * size), 8), "x", None)
    progs["tp_matmul_all_reduce"] = (lambda a, w: a @ w, (a, w), {"out_shardings": NamedSharding(mesh, P())})
    x = put(mesh, rnd((b, 1024), 9), "x", None)
    w2 = put(mesh, rnd((1024, 256 * size), 10), "x", None)
    progs["fsdp_all_gather"] = (
        lambda x, w: jnp.tanh(x @ w), (x, w2), {"out_shardings": NamedSharding(mesh, P("x", None))})

    def loop(v):
        def body(i, c):  # two collectives per iteration; values stay bounded
            return c * 0.5 + jax.lax.psum(c, "x") * 0.0625 - jax.lax.pmax(c, "x") * 0.125
        return jax.lax.fori_loop(0, 100, body, v)

    progs["psum_loop_x100"] = (
        jax.shard_map(loop, mesh=mesh, in_specs=P("x"), out_specs=P("x")), (put(mesh, rnd((8 * 8, 128), 11), "x"),), {})
    return progs


def bench_runtime(args):
    rows = []
    for name, (f, fargs, kw) in runtime_programs(args.size).items():
        xla = compile_with("xla", f, fargs, **kw)
        peerless.reset_stats()
        pl = compile_with("peerless", f, fargs, **kw)
        decisions = peerless.decisions()
        kernels = sum(d["implementation"] != "fallback" for d in decisions)
        impls = sorted({d["implementation"] for d in decisions})
        times = {"xla": [], "peerless": []}
        for c in (xla, pl):
            for _ in range(args.warmup):
                jax.block_until_ready(c(*fargs))
        gc.collect()
        gc.disable()  # Python's collector showed up in profiles of the timed loop
        for _ in range(args.runs):
            for key, c in (("xla", xla), ("peerless", pl)):
                t = time.perf_counter()
                jax.block_until_ready(c(*fargs))
                times[key].append(time.perf_counter() - t)
        gc.enable()
        mx = statistics.median(times["xla"]) * 1e6
        mp = statistics.median(times["peerless"]) * 1e6
        rows.append((name, mx, mp, mp / mx, f"{kernels}/{len(decisions)}", "; ".join(impls)))
    print(f"\n(a) runtime, median µs per call over {args.runs} runs after {args.warmup} warm-up (alternating)")
    print(f"{'program':24} {'XLA µs':>10} {'Peerless µs':>12} {'ratio':>6}  kernels  implementations")
    for name, mx, mp, r, k, impl in rows:
        print(f"{name:24} {mx:10.1f} {mp:12.1f} {r:6.3f}  {k:7}  {impl}")
    return rows


# ---- a transformer train step (compile time) --------------------------------------------------------


def transformer_setup(layers, d_model, heads, seq, batch, vocab, dp, tp):
    mesh = Mesh(np.array(devices(dp * tp)).reshape(dp, tp), ("dp", "tp"))
    ff = 4 * d_model

    def sds(shape, *spec, dtype=jnp.float32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(*spec)))

    params = {
        "embed": sds((vocab, d_model), None, "tp"),
        "unembed": sds((d_model, vocab), None, "tp"),
        "layers": [
            {
                "ln1": sds((d_model,)), "ln2": sds((d_model,)),
                "wqkv": sds((d_model, 3 * d_model), None, "tp"), "wo": sds((d_model, d_model), "tp", None),
                "w1": sds((d_model, ff), None, "tp"), "w2": sds((ff, d_model), "tp", None),
            }
            for _ in range(layers)
        ],
    }
    tokens = sds((batch, seq), "dp", None, dtype=jnp.int32)

    def norm(x, s):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * s

    def loss(p, tok):
        x = p["embed"][tok]
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        for lp in p["layers"]:
            h = norm(x, lp["ln1"])
            q, k, v = jnp.split(h @ lp["wqkv"], 3, axis=-1)
            split = lambda t: t.reshape(batch, seq, heads, d_model // heads)  # noqa: E731
            s = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / np.sqrt(d_model // heads)
            a = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)
            o = jnp.einsum("bhqk,bkhd->bqhd", a, split(v)).reshape(batch, seq, d_model)
            x = x + o @ lp["wo"]
            x = x + jax.nn.gelu(norm(x, lp["ln2"]) @ lp["w1"]) @ lp["w2"]
        logits = x @ p["unembed"]
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tok[:, 1:, None], axis=-1))

    def step(p, tok):
        l, g = jax.value_and_grad(loss)(p, tok)
        return jax.tree.map(lambda a, b: a - 1e-3 * b, p, g), l

    shardings = jax.tree.map(lambda s: s.sharding, params)
    kw = {"out_shardings": (shardings, NamedSharding(mesh, P()))}
    return step, (params, tokens), kw


def bench_compile(args):
    modes = ("xla", "hook", "peerless")
    # Warm-up (imports, JAX's tracing machinery, the library): a 2-layer model once per mode.
    small = transformer_setup(2, args.d_model, args.heads, args.seq, args.batch, args.vocab, args.dp, args.tp)
    for mode in modes:
        compile_with(mode, small[0], small[1], **small[2])
    step, fargs, kw = transformer_setup(
        args.layers, args.d_model, args.heads, args.seq, args.batch, args.vocab, args.dp, args.tp)
    total = {m: [] for m in modes}
    only_compile = {m: [] for m in modes}
    cpu = {m: [] for m in modes}
    pass_s, pass_calls, decisions = [], 0, []
    for rep in range(args.compile_reps):
        order = modes if rep % 2 == 0 else modes[::-1]  # alternate to spread drift
        for mode in order:
            peerless.reset_stats()
            PASS_TIME.update(calls=0, seconds=0.0)
            compile_with(mode, step, fargs, **kw)
            total[mode].append(TIMES["lower"] + TIMES["compile"])
            only_compile[mode].append(TIMES["compile"])
            cpu[mode].append(TIMES["compile_cpu"])
            if mode == "peerless":
                pass_s.append(PASS_TIME["seconds"])
                pass_calls = PASS_TIME["calls"]
                decisions = peerless.decisions()
    med = {m: statistics.median(total[m]) for m in modes}
    medc = {m: statistics.median(only_compile[m]) for m in modes}
    print(f"\n(b) compile time: {args.layers}-layer transformer train step (unrolled), d_model={args.d_model}, "
          f"heads={args.heads}, seq={args.seq}, batch={args.batch}, vocab={args.vocab}, mesh dp={args.dp} x tp={args.tp}")
    print(f"    fresh jax.jit(step).lower(*args).compile() after jax.clear_caches(), median of {args.compile_reps} "
          f"(modes alternate; a 2-layer warm-up first)")
    medcpu = {m: statistics.median(cpu[m]) for m in modes}
    print(f"{'mode':40} {'lower+compile s':>15} {'ratio':>6} {'compile s':>10} {'ratio':>6} {'compile CPU s':>13} "
          f"{'ratio':>6}")
    label = {"xla": "XLA alone", "hook": "XLA + a no-op PRE_SCHEDULER callback",
             "peerless": "XLA + Peerless (enable())"}
    for m in modes:
        print(f"{label[m]:40} {med[m]:15.3f} {med[m] / med['xla']:6.3f} {medc[m]:10.3f} {medc[m] / medc['xla']:6.3f} "
              f"{medcpu[m]:13.3f} {medcpu[m] / medcpu['xla']:6.3f}   lower+compile runs: "
              + ", ".join(f"{t:.2f}" for t in total[m]))
    module = PASS_TIME.get("module", b"")
    rust = rust_pass_seconds(module) if module else 0.0
    if args.dump_module and module:
        with open(args.dump_module, "wb") as fh:  # for profiling the pass alone
            fh.write(module)
    kernels = [d for d in decisions if d["implementation"] != "fallback"]
    print(f"  Peerless pass callback: {statistics.median(pass_s) * 1e3:.1f} ms per compile (median; ctypes call into "
          f"Rust + decision bookkeeping) over {pass_calls} module(s); {len(decisions)} collectives decided, "
          f"{len(kernels)} on Peerless kernels")
    print(f"  of which the Rust pass alone (PeerlessXlaPass on the same {len(module) / 1e6:.1f} MB module, "
          f"median of 5): {rust * 1e3:.1f} ms")
    reasons = {}
    for d in decisions:
        if d["implementation"] == "fallback":
            key = f"{d['op']} {d['dtype'][:40]}: {d['reason'][:90]}"
            reasons[key] = reasons.get(key, 0) + 1
    for r, n in sorted(reasons.items()):
        print(f"  fallback x{n}: {r}")
    return med


def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{os.cpu_count()} CPUs ({model}); {platform.platform()}; Python {platform.python_version()}; "
            f"jax {jax.__version__}; {len(jax.devices(CPU))} XLA CPU devices")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["runtime", "compile"], help="run one part only")
    ap.add_argument("--runs", type=int, default=200, help="timed calls per program and mode (default 200)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--size", type=int, default=1, help="scales the runtime programs' arrays")
    ap.add_argument("--compile-reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--dump-module", help="write the module the pass got (serialized HloModuleProto) here")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--dp", type=int, default=4, help="data-parallel mesh axis (dp * tp <= 8)")
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel mesh axis")
    args = ap.parse_args()
    print("machine:", machine())
    print("load average at start (1/5/15 min): %.2f %.2f %.2f" % os.getloadavg())
    if args.only in (None, "runtime"):
        bench_runtime(args)
    if args.only in (None, "compile"):
        bench_compile(args)
    print("\nload average at end (1/5/15 min): %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
