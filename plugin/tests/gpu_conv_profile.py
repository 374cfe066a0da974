#!/usr/bin/env python3
"""Where the host time of one program's calls goes: stock JAX on CUDA vs `JAX_PLATFORMS=peerless`
(the wrapper of XLA's CUDA plugin), sampled with py-spy's native stacks. A diagnosis script
for the device tool (gpu_wrap.py found the conv net +20–45 µs of enqueue per call on the
wrapped platform with the same optimized HLO); not a benchmark.

Each configuration runs in its own process, pinned to the same cores as gpu_wrap.py: the
program is compiled and warmed up, then called back to back while `py-spy record --native
--format raw` attaches for GPU_PROFILE_SECONDS (default 4) at 250 Hz (run under py-spy from
the start, JAX's import and XLA's compile, with every thread's native stack unwound at each
sample, did not finish in 200 s on an H100 host). Printed per configuration: calls, µs per
call (enqueue and total), and the native functions with the most samples per call (self and
inclusive), then the functions whose inclusive samples per call differ most between the two.
    python3 plugin/tests/gpu_conv_profile.py --py-spy PATH --out DIR [--program conv_net]
"""

import collections
import json
import os
import subprocess
import sys
import time

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def programs():
    import jax.numpy as jnp
    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_wrap import conv_net

    x = jnp.asarray(np.random.default_rng(1).standard_normal((1024, 1024)), jnp.float32)
    return {
        "conv_net": conv_net(),
        "elementwise": (lambda v: jnp.tanh(v * 1.5 + 0.5) * jnp.exp(-v * v), (x,)),
    }


def child(name, out):
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(cores[2:6] if len(cores) >= 6 else cores))
    import jax

    if os.environ.get("JAX_PLATFORMS") == "peerless":
        import jax_plugins.peerless as peerless

        jax.devices()
        assert peerless.wrapped() == "cuda", peerless.wrapped()
    fn, args = programs()[name]
    f = jax.jit(fn)
    for _ in range(50):
        r = f(*args)
    jax.block_until_ready(r)
    with open(out + ".ready", "w") as fh:
        fh.write(str(os.getpid()))
    # The profiler attaches now and samples for GPU_PROFILE_SECONDS; run a little longer.
    seconds = float(os.environ.get("GPU_PROFILE_SECONDS", "4")) + 3
    calls, enqueue = 0, 0.0
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < seconds:
        t0 = time.perf_counter()
        for _ in range(20):
            r = f(*args)
        enqueue += time.perf_counter() - t0
        jax.block_until_ready(r)
        calls += 20
    total = time.perf_counter() - t_start
    # Threads and clients of the process: a second XLA client (or its threads) would cost
    # host time on every call.
    threads = len(os.listdir("/proc/self/task"))
    backends = sorted(jax._src.xla_bridge.backends())
    with open(out, "w") as fh:
        json.dump({"calls": calls, "enqueue_us": enqueue / calls * 1e6, "total_us": total / calls * 1e6,
                   "device": str(jax.devices()[0]), "threads": threads, "backends": backends}, fh)


def frame_name(frame):
    """A frame's function, or its library where the library is stripped (XLA's plugin
    exports only GetPjrtApi, so its frames are addresses, which differ between processes)."""
    func, _, where = frame.strip().partition(" (")
    where = where.rstrip(")").split(":")[0]
    if func.startswith("0x") or func in ("", "???"):
        return f"[{os.path.basename(where) or 'unknown'}]"
    return func


def aggregate(raw_path):
    """py-spy raw (collapsed) stacks → (self, inclusive) sample counts per function."""
    own, incl = collections.Counter(), collections.Counter()
    with open(raw_path) as fh:
        for line in fh:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack or not n.isdigit():
                continue
            frames = [frame_name(f) for f in stack.split(";")]
            own[frames[-1]] += int(n)
            for f in set(frames):
                incl[f] += int(n)
    return own, incl


RATE = 250
SECONDS = int(os.environ.get("GPU_PROFILE_SECONDS", "4"))


def per_call(samples, r):
    """Samples (at RATE Hz over SECONDS) → µs per call, at the child's call rate."""
    calls_per_s = 1e6 / r["total_us"]
    return samples / RATE / (SECONDS * calls_per_s) * 1e6


def main():
    if sys.argv[1:2] == ["_child"]:
        child(sys.argv[2], sys.argv[3])
        return 0
    arg = lambda k, d=None: sys.argv[sys.argv.index(k) + 1] if k in sys.argv else d  # noqa: E731
    out = arg("--out", "gpu_conv_profile_out")
    spy = arg("--py-spy")
    name = arg("--program", "conv_net")
    os.makedirs(out, exist_ok=True)
    results = {}
    for cfg in ("stock", "peerless"):
        env = dict(os.environ, **SAFE_ENV)
        env.pop("PEERLESS_XLA_PLUGIN", None)
        env["JAX_PLATFORMS"] = "cuda" if cfg == "stock" else "peerless"
        stats = os.path.join(out, f"{name}_{cfg}.json")
        raw = os.path.join(out, f"{name}_{cfg}.raw")
        cmd = [sys.executable, os.path.abspath(__file__), "_child", name, stats]
        child_p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        spied = None
        t0 = time.time()
        while spy and not os.path.exists(stats + ".ready") and child_p.poll() is None and time.time() - t0 < 150:
            time.sleep(0.2)
        if spy and os.path.exists(stats + ".ready"):
            spied = subprocess.run([spy, "record", "--native", "--format", "raw", "-r", str(RATE), "-d",
                                    str(SECONDS), "-o", raw, "--pid", str(child_p.pid)],
                                   capture_output=True, text=True, timeout=120)
        try:
            output, _ = child_p.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            child_p.kill()
            output = "(killed after 150 s)"
        if child_p.returncode or not os.path.exists(stats):
            print(f"{cfg}: FAILED rc={child_p.returncode}\n{(output or '')[-3000:]}")
            return 1
        with open(stats) as fh:
            results[cfg] = json.load(fh)
        if spied is not None and spied.returncode:
            print(f"{cfg}: py-spy rc={spied.returncode}: {(spied.stderr or spied.stdout)[-1500:]}")
        results[cfg]["profile"] = aggregate(raw) if spied is not None and os.path.exists(raw) else None
    for cfg, r in results.items():
        print(f"== {cfg}: {name} on {r['device']}: {r['calls']} calls, enqueue {r['enqueue_us']:.1f} µs/call, "
              f"total {r['total_us']:.1f} µs/call; {r['threads']} threads, backends {r['backends']}")
        if r["profile"]:
            own, incl = r["profile"]
            per = lambda c: per_call(c, r)  # noqa: E731
            print("   self µs/call:      " + "; ".join(f"{f} {per(c):.1f}" for f, c in own.most_common(15)))
            print("   inclusive µs/call: " + "; ".join(f"{f} {per(c):.1f}" for f, c in incl.most_common(25)))
    if all(r["profile"] for r in results.values()):
        (so, si), (po, pi) = results["stock"]["profile"], results["peerless"]["profile"]
        rs, rp = results["stock"], results["peerless"]
        diff = {f: per_call(pi.get(f, 0), rp) - per_call(si.get(f, 0), rs) for f in set(si) | set(pi)}
        top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:30]
        print("== inclusive µs/call, peerless − stock (largest first):")
        for f, d in top:
            print(f"   {d:+8.1f}  {f[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
