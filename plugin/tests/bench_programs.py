#!/usr/bin/env python3
"""The programs users run on several GPUs, timed with Peerless beside every XLA option, in one
run (docs/PERFORMANCE.md cites its tables). Not a test: a script the device tool runs.

    python3 plugin/tests/bench_programs.py --out DIR                       # everything
    python3 plugin/tests/bench_programs.py --programs psum_chain,decode_d4096_b8 --rounds 2
    python3 plugin/tests/bench_programs.py --profile --programs psum_chain --modes stock,peerless

Modes (each round runs every mode in its own process, since XLA reads XLA_FLAGS once; rounds
alternate the order, so drift spreads over all modes):
  stock           JAX as installed (NCCL through XLA, command buffers as XLA defaults them)
  xla-kernels     XLA's own one-/two-shot collective kernels
  nccl-symmetric  NCCL with symmetric buffer registration
  peerless        `jax_plugins.peerless.enable()`: every call in order on the compute stream, and
                  partitioner-made ones above 256 KiB left to XLA
  peerless-overlap   `--overlap_above_bytes=262144`: on CUDA collectives above 256 KiB run on a
                  Peerless kernel on XLA's async queue, beside compute, on at most 32 blocks (the
                  default until 2026-11-28)
  peerless-sync   `--overlap_above_bytes=none`: today's default, spelled out
  peerless-blocks64  `--overlap_above_bytes=262144 --async_blocks=64`: calls beside compute on
                  the synchronous grid
  peerless-fuse   `--fuse_norm=true`: the all-reduce fused with the RMSNorm after it on CUDA too
  any mode + ":nographs"  XLA's command buffers off (`--xla_gpu_enable_command_buffer=`)
  any mode + ":va"        command buffers replay without updates when buffers move
                          (`--xla_gpu_command_buffer_update_mode=SKIP_PROFILED`)

Programs (bf16 unless named; the decode steps feed each output to the next call, as a decode
loop does; µs per call is the median over samples of `--iters` back-to-back calls):
  psum_chain              20 dependent psums of 64 KiB per GPU, each followed by a scale
  decode_d{D}_b{B}        an 8-layer (d 8192: 4) Megatron tensor-parallel decode step: per layer
                          RMSNorm, column-parallel qkv, attention over a KV cache of 512, row-
                          parallel out projection + all-reduce + residual, RMSNorm, MLP (4d,
                          column / row parallel) + all-reduce + residual
  prefill_d4096           4 of the same layers' projections and MLP over 1024 tokens (8 MiB
                          all-reduces: XLA's, above two_shot_max_bytes)
  moe                     top-1 MoE layer: all_to_all dispatch (2 MiB per GPU), expert MLP,
                          all_to_all combine
  ring_attention          8 ppermute steps of a 1 MiB KV block around the ring, each beside a
                          block of attention
  dp_step                 data-parallel MLP train step, 20 MiB of f32 gradients
  fsdp_step               FSDP: per layer all-gather of the weights, reduce-scatter of the grads
  dp_train_400m           a realistic data-parallel training step: a residual MLP stack of 403M
                          parameters (f32 master weights, bf16 compute, d 2048, 12 layers), 4096
                          tokens per GPU, jit(grad) with out_shardings; 32 MiB
                          bf16 gradient all-reduces (dp_train_tiny: the same, small, for CPUs)
  fsdp_train_400m         the same step with the weights sharded by rows through jit shardings
                          (fsdp_train_tiny: small)
  tpdp_train_400m         the same step on a (dp, tp) mesh, tp 2: Megatron MLP weights (w1 by
                          columns, w2 by rows) all-reduce activations over tp, gradients over
                          dp (tpdp_train_tiny: small)

Every mode's results are compared with stock's: the largest difference relative to the largest
magnitude must stay within AGREE (5e-2: three fed-back bf16 decode steps of 8 layers differ by
1e-2 to 2e-2 between XLA's own options, command buffers on and off, on 4 H200s); a mode beyond
it is flagged in the table and the script exits 1. Accuracy proper: gpu_accuracy.py. `--profile` also records one
profiled window of each program in each mode (jax.profiler, CUPTI) and prints where the time
goes: the device's busy time and kernels per call, and the host's time per call by XLA's
trace events; the raw traces go to DIR/traces.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MODES = {
    "stock": "",
    "xla-kernels": "--xla_gpu_experimental_use_collective_kernels=ALL_REDUCE,ALL_GATHER",
    "nccl-symmetric": "--xla_gpu_experimental_enable_nccl_symmetric_buffers=true",
    "peerless": "",
    "peerless-overlap": "",
    "peerless-sync": "",
    "peerless-blocks64": "",
    "peerless-fuse": "",
    "peerless-ce": "",
    "peerless-ce-sync": "",
}
# Peerless's flags per mode (`enable(flags=...)`). (In the 2026-11-27 runs, `peerless` was
# today's `peerless-overlap`, the default then; runs C and D of that day also set every backend
# `kernel` and --two_shot_max_bytes=67108864.)
PEERLESS_MODES = {
    "peerless": None,
    "peerless-overlap": "--overlap_above_bytes=262144",
    "peerless-sync": "--overlap_above_bytes=none",
    "peerless-blocks64": "--overlap_above_bytes=262144 --async_blocks=64",
    "peerless-fuse": "--fuse_norm=true",
    # Calls of 16 MiB and more on the copy engines (no SMs), beside compute / in order.
    "peerless-ce": "--copy_engines=16777216 --overlap_above_bytes=262144",
    "peerless-ce-sync": "--copy_engines=16777216",
}
# Mode suffixes: XLA options a user may add to any mode.
SUFFIXES = {
    "nographs": "--xla_gpu_enable_command_buffer=",
    # Command buffers replay without an update when buffers move: XLA remaps the moved
    # parameters and temporaries to the addresses the command buffer recorded (VMM).
    "va": "--xla_gpu_command_buffer_update_mode=SKIP_PROFILED",
    # XLA's collective matmul: a TP einsum's all-gather becomes permutes inside a loop.
    "wein": "--xla_gpu_threshold_for_windowed_einsum_mib=0",
}
AGREE = 5e-2
# Kernel names of collectives (Peerless's, NCCL's, XLA's collective kernels) in a profile.
COLLECTIVE_KERNEL = re.compile(r"^pl_|nccl|[Aa]ll[_-]?[Rr]educe|[Aa]ll[_-]?[Gg]ather|[Aa]ll[_-]?[Tt]o[_-]?[Aa]ll|collective")
DEFAULT_PROGRAMS = [
    "psum_chain", "decode_d4096_b1", "decode_d4096_b8", "decode_d4096_b64", "decode_d8192_b16",
    "prefill_d4096", "moe", "ring_attention", "dp_step", "fsdp_step",
]


# ----------------------------------------------------------------------------- programs

def programs(names, n):
    """name -> (step, args, feed): `step(*args)`; `feed(args, out)` gives the next call's
    args (a decode loop's output becomes its input), or None to call with the same args."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:n]), ("x",))
    put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
    rng = np.random.default_rng(0)
    rnd = lambda shape, scale=1.0, dt=jnp.bfloat16: jnp.asarray(rng.standard_normal(shape) * scale, dt)

    def rms(x, g):
        xf = x.astype(jnp.float32)
        return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6) * g).astype(x.dtype)

    def tp_layers(d, layers, heads=32, kv_len=512):
        hd = d // heads
        ps = []
        for _ in range(layers):
            ps.append({
                "g1": put(jnp.ones((d,), jnp.float32)), "g2": put(jnp.ones((d,), jnp.float32)),
                "qkv": put(rnd((d, 3, heads, hd), d ** -0.5), None, None, "x"),
                "o": put(rnd((heads, hd, d), d ** -0.5), "x"),
                "w1": put(rnd((d, 4 * d), d ** -0.5), None, "x"),
                "w2": put(rnd((4 * d, d), (4 * d) ** -0.5), "x"),
            })
        return ps

    def decode(d, batch, layers):
        kv_len, heads = 512, 32
        hd = d // heads
        ps = tp_layers(d, layers, heads)
        kc = [put(rnd((batch, heads, kv_len, hd), 0.5), None, "x") for _ in range(layers)]
        vc = [put(rnd((batch, heads, kv_len, hd), 0.5), None, "x") for _ in range(layers)]

        def step(ps, kc, vc, x):
            for p, k, v in zip(ps, kc, vc):
                h = rms(x, p["g1"])
                q = jnp.einsum("bd,dthe->bthe", h, p["qkv"])[:, 0]  # (b, heads, hd)
                s = jnp.einsum("bhe,bhke->bhk", q, k).astype(jnp.float32) * hd ** -0.5
                a = jax.nn.softmax(s, axis=-1).astype(x.dtype)
                o = jnp.einsum("bhk,bhke->bhe", a, v)
                x = x + jnp.einsum("bhe,hed->bd", o, p["o"])  # all-reduce, residual
                h = rms(x, p["g2"])
                x = x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]  # all-reduce, residual
            return x

        x = put(rnd((batch, d)))
        return jax.jit(step), (ps, kc, vc, x), lambda a, o: (a[0], a[1], a[2], o)

    def train_stack(name):
        """A realistic training step: a residual MLP stack, f32 master weights,
        bf16 compute, `jax.jit(grad)` with out_shardings (weights not donated: the bench calls
        a step again with the same weights). `*_400m`: d
        2048, MLP 4d, 12 layers (403M parameters; a 32 MiB bf16 gradient per matrix), 4096
        tokens per GPU; `*_tiny` (d 128, 2 layers, 64 tokens) checks the program on a CPU.
        `dp_`: weights replicated (XLA all-reduces the gradients); `fsdp_`: weights sharded by
        rows through jit shardings (the partitioner all-gathers them and reduce-scatters the
        gradients); `tpdp_`: a (dp, tp) mesh with tp 2 (1 on an odd device count), w1 sharded
        by columns and w2 by rows over tp (activations all-reduced over tp in both passes),
        tokens over dp (gradients all-reduced over dp)."""
        big = name.endswith("_400m")
        d, layers, tokens = (2048, 12, 4096) if big else (128, 2, 64)
        if name.startswith("tpdp_"):
            tp = 2 if n % 2 == 0 else 1
            m2 = Mesh(np.array(jax.devices()[:n]).reshape(n // tp, tp), ("dp", "tp"))
            specs = [NamedSharding(m2, P(None, "tp")), NamedSharding(m2, P("tp", None))]
            xspec = NamedSharding(m2, P("dp", None))
        else:
            wspec = NamedSharding(mesh, P("x", None) if name.startswith("fsdp_") else P())
            specs, xspec = [wspec, wspec], NamedSharding(mesh, P("x", None))
        ws = [jax.device_put(rnd(shape, shape[0] ** -0.5, jnp.float32), specs[k])
              for _ in range(layers) for k, shape in enumerate(((d, 4 * d), (4 * d, d)))]
        xb = jax.device_put(rnd((tokens * n, d), 1.0, jnp.bfloat16), xspec)

        def loss(ws, x):
            for w1, w2 in zip(ws[::2], ws[1::2]):
                x = x + jax.nn.gelu(x @ w1.astype(jnp.bfloat16)) @ w2.astype(jnp.bfloat16)
            return jnp.mean(jnp.square(x.astype(jnp.float32)))

        def step(ws, x):
            g = jax.grad(loss)(ws, x)
            return [w - 1e-4 * gi for w, gi in zip(ws, g)]

        f = jax.jit(step, out_shardings=[specs[k % 2] for k in range(len(ws))])
        return (f, (ws, xb), lambda a, o: (o, a[1]))

    def build(name):
        # One scope per program: its closures see its own sizes.
        if name == "psum_chain":
            def body(x):
                for _ in range(20):
                    x = jax.lax.psum(x, "x") * jnp.asarray(1.0 / n, x.dtype)
                return x
            f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
            return (f, (put(rnd((n, 32768)), "x"),), lambda a, o: (o,))
        elif name.startswith("decode_"):
            d, b = (int(t[1:]) for t in name.split("_")[1:3])
            return decode(d, b, 8 if d <= 4096 else 4)
        elif name == "prefill_d4096":
            d, tokens, layers = 4096, 1024, 4
            ps = tp_layers(d, layers)

            def prefill(ps, x):
                for p in ps:
                    h = rms(x, p["g1"])
                    qkv = jnp.einsum("td,dche->tche", h, p["qkv"])
                    x = x + jnp.einsum("the,hed->td", qkv[:, 2], p["o"])  # all-reduce, residual
                    h = rms(x, p["g2"])
                    x = x + jax.nn.gelu(h @ p["w1"]) @ p["w2"]
                return x

            return (jax.jit(prefill), (ps, put(rnd((tokens, d)))), None)
        elif name == "moe":
            tokens, d, f = 1024, 1024, 2048  # per GPU: 1024 tokens of 2 KiB (bf16): 2 MiB dispatched
            w1 = put(rnd((n, d, f), d ** -0.5), "x")
            w2 = put(rnd((n, f, d), f ** -0.5), "x")

            def moe(w1, w2, x):
                # x: (tokens, d) per GPU, already routed: block e goes to expert e.
                x = x.reshape(n, tokens // n, d)
                x = jax.lax.all_to_all(x, "x", 0, 0, tiled=True)
                h = jax.nn.gelu(jnp.einsum("etd,df->etf", x, w1[0]))
                y = jnp.einsum("etf,fd->etd", h, w2[0])
                y = jax.lax.all_to_all(y, "x", 0, 0, tiled=True)
                return y.reshape(tokens, d)

            g = jax.jit(jax.shard_map(moe, mesh=mesh, in_specs=(P("x"), P("x"), P("x")), out_specs=P("x")))
            return (g, (w1, w2, put(rnd((n * tokens, d)), "x")), None)
        elif name == "ring_attention":
            blk, hd = 2048, 128  # a KV block: 2 x 2048 x 128 bf16 = 1 MiB

            def ring(q, k, v):
                acc = jnp.zeros(q.shape, jnp.float32)
                for _ in range(8):
                    s = (q @ k.T).astype(jnp.float32) * hd ** -0.5
                    acc = acc + jax.nn.softmax(s, axis=-1).astype(q.dtype) @ v
                    perm = [(i, (i + 1) % n) for i in range(n)]
                    k, v = jax.lax.ppermute(k, "x", perm), jax.lax.ppermute(v, "x", perm)
                return acc.astype(q.dtype)

            g = jax.jit(jax.shard_map(ring, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
            qkv = [put(rnd((n * blk, hd)), "x") for _ in range(3)]
            return (g, tuple(qkv), None)
        elif name == "dp_step":
            sizes = [(1024, 2048), (2048, 1024), (1024, 1024)]  # 20 MiB of f32 gradients
            ws = [put(rnd(s, s[0] ** -0.5, jnp.float32)) for s in sizes]
            xb = put(rnd((64 * n, 1024), 1.0, jnp.float32), "x")

            def loss(w, x):
                h = jax.nn.gelu(x @ w[0]) @ w[1]
                return jnp.mean((h @ w[2] - 1.0) ** 2)

            dp = jax.jit(lambda w, x: [wi - 1e-3 * gi for wi, gi in zip(w, jax.grad(loss)(w, x))])
            return (dp, (ws, xb), lambda a, o: (o, a[1]))
        elif name.startswith(("dp_train_", "fsdp_train_", "tpdp_train_")):
            return train_stack(name)
        elif name == "fsdp_step":
            d, layers = 2048, 4
            ws = [put(rnd((d, d), d ** -0.5, jnp.float32), "x") for _ in range(layers)]
            xb = put(rnd((32 * n, d), 1.0, jnp.float32), "x")

            def loss(ws, x):
                for w in ws:
                    x = jax.nn.gelu(x @ w)
                return jnp.mean(x * x)

            fs = jax.jit(lambda w, x: [wi - 1e-3 * gi for wi, gi in zip(w, jax.grad(loss)(w, x))])
            return (fs, (ws, xb), lambda a, o: (o, a[1]))
        raise SystemExit(f"unknown program {name}")

    return {name: build(name) for name in names}


# ----------------------------------------------------------------------------- child

def _time(f, args, feed, iters, repeats):
    import jax

    samples, enqueue = [], []
    for _ in range(repeats):
        a = args
        jax.block_until_ready(a)
        t0 = time.perf_counter()
        for _ in range(iters):
            o = f(*a)
            if feed is not None:
                a = feed(a, o)
        t1 = time.perf_counter()
        jax.block_until_ready(o)
        samples.append((time.perf_counter() - t0) / iters * 1e6)
        enqueue.append((t1 - t0) / iters * 1e6)
    return statistics.median(samples), statistics.median(enqueue)


def _profile(f, args, feed, calls, trace_dir):
    """Where one window of `calls` calls spends its time: device kernels (GPU 0 and the slowest
    GPU) and the host's trace events, per call."""
    import glob

    import jax

    a = args
    jax.block_until_ready(a)
    jax.profiler.start_trace(trace_dir)
    try:
        for _ in range(calls):
            o = f(*a)
            if feed is not None:
                a = feed(a, o)
        jax.block_until_ready(o)
    finally:
        jax.profiler.stop_trace()
    paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not paths:
        return {"error": "no xplane.pb written"}
    from jax.profiler import ProfileData

    pd = ProfileData.from_file(paths[-1])
    gpus, host = {}, {}
    for plane in pd.planes:
        if plane.name.startswith("/device:GPU:"):
            kernels, busy, first, last = {}, 0, None, None
            for line in plane.lines:
                if not line.name.startswith("Stream"):
                    continue
                for ev in line.events:
                    k = ev.name[:60]
                    c = kernels.setdefault(k, [0, 0.0])
                    c[0] += 1
                    c[1] += ev.duration_ns / 1e3
                    busy += ev.duration_ns
                    first = ev.start_ns if first is None else min(first, ev.start_ns)
                    last = max(last or 0, ev.start_ns + ev.duration_ns)
            top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:12]
            # The step's compute: every kernel but the collectives' (Peerless's pl_*, NCCL's,
            # XLA's collective kernels), the floor a faster collective cannot go below.
            coll = sum(c[1] for k, c in kernels.items() if COLLECTIVE_KERNEL.search(k))
            gpus[plane.name] = {
                "busy_us_per_call": busy / 1e3 / calls,
                "compute_us_per_call": (busy / 1e3 - coll) / calls,
                "span_us_per_call": ((last - first) / 1e3 / calls) if first is not None else 0.0,
                "events_per_call": sum(c[0] for c in kernels.values()) / calls,
                "top": [(k, c[0] / calls, c[1] / calls) for k, c in top],
            }
        elif plane.name.startswith("/host:"):
            for line in plane.lines:
                for ev in line.events:
                    k = ev.name[:70]
                    c = host.setdefault(k, [0, 0.0])
                    c[0] += 1
                    c[1] += ev.duration_ns / 1e3
    host_top = sorted(host.items(), key=lambda kv: -kv[1][1])[:30]
    return {"gpus": gpus, "host": [(k, c[0] / calls, c[1] / calls) for k, c in host_top]}


def child(a):
    import jax
    import numpy as np

    peerless = None
    if a.mode.split(":")[0] in PEERLESS_MODES:
        import jax_plugins.peerless as peerless

        peerless.enable(flags=PEERLESS_MODES[a.mode.split(":")[0]])
    n = len(jax.devices()) if not a.devices else a.devices
    res = {"n": n, "device": jax.devices()[0].device_kind, "us": {}, "enqueue_us": {}, "checksum": {}, "profile": {}}
    progs = programs(a.programs.split(","), n)
    for name, (f, args, feed) in progs.items():
        try:
            o = f(*args)
            jax.block_until_ready(o)
            # The result of a fixed number of fed-back calls, for the comparison across modes.
            b = args
            for _ in range(3):
                o = f(*b)
                if feed is not None:
                    b = feed(b, o)
            leaves = [np.asarray(x, np.float32) for x in jax.tree.leaves(o)]
            np.savez(os.path.join(a.arrays, f"{a.mode.replace(':', '_')}_{name}.npz"), *leaves)
            for _ in range(3):
                f(*args)
            us, enq = _time(f, args, feed, a.iters, a.repeats)
            res["us"][name], res["enqueue_us"][name] = us, enq
            if a.profile:
                res["profile"][name] = _profile(f, args, feed, 10, os.path.join(a.traces, a.mode.replace(":", "_"), name))
        except Exception as e:  # noqa: BLE001 - reported per program
            res["us"][name] = None
            res.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"[:800]
    if peerless is not None:
        res["stats"] = peerless.stats()
        res["decisions"] = sorted({(d["op"], d["implementation"], d["reason"][:90]) for d in peerless.decisions()})[:40]
        res["handler_calls"] = peerless.handler_calls("cuda")
    print(json.dumps(res))


# ----------------------------------------------------------------------------- driver

def run_mode(mode, a):
    base, *suffixes = mode.split(":")
    env = dict(os.environ, **SAFE_ENV)
    flags = [MODES[base], *(SUFFIXES[x] for x in suffixes), env.get("XLA_FLAGS", "")]
    if a.dump:
        flags.append(f"--xla_dump_to={os.path.join(a.out, 'dump', mode.replace(':', '_'))} --xla_dump_hlo_as_text"
                     " --xla_dump_hlo_pass_re=apply-xla-transforms.*")  # the modules Peerless's pass sees
    env["XLA_FLAGS"] = " ".join(x for x in flags if x)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--mode", mode, "--programs", a.programs,
           "--iters", str(a.iters), "--repeats", str(a.repeats), "--arrays", a.arrays, "--traces", a.traces]
    if a.profile:
        cmd.append("--profile")
    if a.devices:
        cmd += ["--devices", str(a.devices)]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"mode": mode, "error": (p.stderr or p.stdout)[-2500:]}
    r = json.loads(lines[-1])
    r.update(mode=mode, wall_s=round(time.time() - t0, 1))
    return r


def compare(a, modes, names):
    """mode -> program -> max |diff| / max |stock| of the fed-back result (None: missing)."""
    import numpy as np

    out = {}
    for m in modes:
        out[m] = {}
        for name in names:
            try:
                want = np.load(os.path.join(a.arrays, f"stock_{name}.npz"))
                got = np.load(os.path.join(a.arrays, f"{m.replace(':', '_')}_{name}.npz"))
                worst = 0.0
                for k in want.files:
                    scale = max(float(np.max(np.abs(want[k]))), 1e-30)
                    worst = max(worst, float(np.max(np.abs(got[k] - want[k]))) / scale)
                out[m][name] = worst
            except (OSError, KeyError, ValueError):
                out[m][name] = None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench_programs_out")
    ap.add_argument("--modes", default="stock,xla-kernels,nccl-symmetric,peerless")
    ap.add_argument("--programs", default=",".join(DEFAULT_PROGRAMS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--devices", type=int, default=0, help="use the first N GPUs (default: all)")
    ap.add_argument("--profile", action="store_true", help="one profiled window per program (first round)")
    ap.add_argument("--dump", action="store_true", help="XLA's HLO dumps per mode (first round)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--arrays", help=argparse.SUPPRESS)
    ap.add_argument("--traces", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a)
        return 0
    os.makedirs(a.out, exist_ok=True)
    a.arrays = os.path.join(a.out, "arrays")
    a.traces = os.path.join(a.out, "traces")
    os.makedirs(a.arrays, exist_ok=True)
    modes = a.modes.split(",")
    names = a.programs.split(",")
    if "stock" not in modes:
        modes.insert(0, "stock")
    runs = {m: [] for m in modes}
    profile, dump = a.profile, a.dump
    for rnd in range(a.rounds):
        order = modes if rnd % 2 == 0 else modes[::-1]
        for m in order:
            a.profile, a.dump = profile and rnd == 0, dump and rnd == 0
            t0 = time.time()
            r = run_mode(m, a)
            runs[m].append(r)
            state = "ERROR" if "error" in r else f"{len([v for v in r['us'].values() if v])} programs"
            print(f"[round {rnd + 1}/{a.rounds}] {m:24s} {state} in {time.time() - t0:.0f} s", flush=True)
            if "error" in r:
                print(r["error"])
    diffs = compare(a, modes, names)
    # Table: median over rounds, range in brackets.
    first = next((r for rs in runs.values() for r in rs if "n" in r), {})
    print(f"\n{first.get('n', '?')}x {first.get('device', '?')}, µs per call (median of rounds [min-max]); "
          f"x: stock / mode; rel diff vs stock after 3 fed-back calls")
    print(f"{'program':18s} " + " ".join(f"{m:>22s}" for m in modes))
    table = {}
    for name in names:
        cells = []
        base = [r["us"].get(name) for r in runs["stock"] if r.get("us", {}).get(name)]
        for m in modes:
            v = [r["us"].get(name) for r in runs[m] if r.get("us", {}).get(name)]
            if not v:
                cells.append(f"{'-':>22s}")
                continue
            med = statistics.median(v)
            x = statistics.median(base) / med if base else float("nan")
            table.setdefault(name, {})[m] = {"us": v, "enqueue_us": [r["enqueue_us"].get(name) for r in runs[m] if r.get("us", {}).get(name)],
                                             "x": x, "rel_diff": diffs[m].get(name)}
            dd = diffs[m].get(name)
            flag = "" if dd is None or dd < AGREE else "!"
            cells.append(f"{med:8.1f} [{min(v):.0f}-{max(v):.0f}] {x:4.2f}x{flag}".rjust(22))
        print(f"{name:18s} " + " ".join(cells))
    for m in modes:
        for r in runs[m]:
            if r.get("errors"):
                print(f"{m}: errors {r['errors']}")
        if runs[m] and runs[m][0].get("stats") is not None:
            print(f"{m}: stats {runs[m][0]['stats']}; handler calls {runs[m][0].get('handler_calls')}")
            for d in runs[m][0].get("decisions", []):
                print(f"   {d}")
    if profile:
        print("\nProfiled window (10 calls), per call: GPU 0's busy and first-to-last-kernel span, kernels; host events")
        for m in modes:
            r = runs[m][0] if runs[m] else {}
            for name, p in (r.get("profile") or {}).items():
                if "error" in p:
                    print(f"{m} {name}: {p['error']}")
                    continue
                g0 = p["gpus"].get("/device:GPU:0", {})
                print(f"\n{m} / {name}: wall {r['us'].get(name) or 0:.1f} µs, enqueue {r['enqueue_us'].get(name) or 0:.1f} µs; "
                      f"GPU0 busy {g0.get('busy_us_per_call', 0):.1f} µs (compute {g0.get('compute_us_per_call', 0):.1f}), "
                      f"span {g0.get('span_us_per_call', 0):.1f} µs, "
                      f"{g0.get('events_per_call', 0):.0f} kernels")
                for k, cnt, us in g0.get("top", [])[:8]:
                    print(f"    gpu  {us:8.1f} µs {cnt:5.1f}x {k}")
                for k, cnt, us in p["host"][:14]:
                    print(f"    host {us:8.1f} µs {cnt:5.1f}x {k}")
    with open(os.path.join(a.out, "bench_programs.json"), "w") as fh:
        json.dump({"runs": runs, "table": table, "argv": sys.argv, "date": time.strftime("%Y-%m-%d %H:%M:%S")}, fh, indent=1)
    disagree = [(m, n) for n, row in table.items() for m, v in row.items() if (v["rel_diff"] or 0) >= AGREE]
    if disagree:
        print(f"results differ from stock beyond {AGREE}: {disagree}")
    return 1 if disagree or any("error" in r or r.get("errors") for rs in runs.values() for r in rs) else 0


if __name__ == "__main__":
    sys.exit(main())
