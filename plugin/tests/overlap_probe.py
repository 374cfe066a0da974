#!/usr/bin/env python3
"""The overlap probe: can XLA run a Peerless collective (a typed-FFI custom call) asynchronously,
beside compute? Research script, not a test suite.

For each XLA flag set (its own process: XLA reads XLA_FLAGS once) and each variant of how the
collective is marked, it compiles three programs under shard_map over the visible devices:
the collective alone, a matmul chain alone, and both (independent) in one jit; then prints

  placement  where the Peerless call sits in the optimized HLO (compiled.as_text()): in ENTRY
             (synchronous, compute stream), or inside the computation of a call-start /
             async-start (asynchronous), with the start's `_xla_stream_annotation`;
  window     whether a GEMM is scheduled between that start and its done;
  timings    median ms of collective alone, matmul alone, both, and the overlap
             (coll + mm - both) / min(coll, mm): 0 = serial, 1 = fully hidden;
  ok         whether the collective's result is right (an overlap race shows here).

Variants (mechanisms under test; every one may fail: the error is printed and the run goes on):
  xla          Peerless told `--all_reduce_backend=fallback`: XLA's own all-reduce (reference)
  pl-sync      Peerless kernel in order on the compute stream (--overlap_above_bytes=none, in every
               variant's flags but pl-queue's, since CUDA puts calls above 256 KiB on the queue)
  pl-queue     Peerless kernel with --overlap_above_bytes=0: the pass writes a GpuBackendConfig with
               operation_queue_id 1 (attributes in custom_call_backend_config), XLA's
               StreamAttributeAsyncWrapper wraps the call in async-start on thread "parallel"
  pl-coll      psum under set_xla_metadata(_xla_stream_annotation="collective"): the pass copies
               the all-reduce's frontend attributes onto its custom call, XLA's
               ExplicitStreamAnnotationAsyncWrapper wraps it, "collective" = communication stream
  pl-stream1   the same with _xla_stream_annotation="1" (additional compute stream 1)
  pl-coll-grp  pl-coll plus _scheduling_group_id="1" on the psum and on the matmul chain
  pl-compute_on  jax.experimental.compute_on.compute_on("gpu_stream:collective") around the psum
  tf-sync / tf-stream1   (GPU, no Peerless needed) jaxlib's own FFI call cu_threefry2x32_ffi
               (jax_threefry_gpu_kernel_lowering) instead of the collective, plain / annotated "1"

Flag sets (GPU): default; annot-on+nocmdbuf (--xla_gpu_experimental_stream_annotation=true
--xla_gpu_enable_command_buffer=); annot-off (=false, control: every variant should be sync).

    # CPU smoke (8 host devices; checks the script and the attribute's path through the pass)
    PEERLESS_PJRT_LIBRARY=/work/main/target/debug/libpeerless_pjrt.so PYTHONPATH=plugin/python \\
        JAX_PLATFORMS=cpu .venv/jax/bin/python plugin/tests/overlap_probe.py --cpu
    # GPU (2 or 4 GPUs), with HLO / thunk dumps
    PEERLESS_PJRT_LIBRARY=target/release/libpeerless_pjrt.so PYTHONPATH=plugin/python \\
        python3 plugin/tests/overlap_probe.py --dump /tmp/overlap_dump --json /tmp/overlap.json

Options: --mb (collective MiB per device), --mm (matmul size), --chain (matmuls per program),
--iters, --variants a,b,c, --flagsets a,b, --no-peerless, --timeout (per child, seconds).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
FLAGSETS = {
    "default": "",
    "annot-on+nocmdbuf": "--xla_gpu_experimental_stream_annotation=true --xla_gpu_enable_command_buffer=",
    "annot-off": "--xla_gpu_experimental_stream_annotation=false",
}
VARIANTS = ["xla", "pl-sync", "pl-queue", "pl-coll", "pl-stream1", "pl-coll-grp", "pl-compute_on", "tf-sync", "tf-stream1"]
PEERLESS_FLAGS = os.environ.get(
    "PROBE_PEERLESS_FLAGS", "--all_reduce_backend=kernel --xla_async_above_bytes=none --overlap_above_bytes=none"
)


# ----------------------------------------------------------------------------- parent side

def run_child(name: str, xla_flags: str, args) -> dict:
    env = dict(os.environ, **SAFE_ENV)
    flags = [xla_flags, env.get("XLA_FLAGS", "")]
    if args.cpu:
        flags.append("--xla_force_host_platform_device_count=8")
        env.setdefault("JAX_PLATFORMS", "cpu")
    dump = None
    if args.dump:
        dump = os.path.join(args.dump, name)
        os.makedirs(dump, exist_ok=True)
        flags.append(f"--xla_dump_to={dump} --xla_dump_hlo_as_text "
                     "--xla_dump_hlo_pass_re=apply-xla-transforms.*|.*async.*wrapper.*")
    env["XLA_FLAGS"] = " ".join(f for f in flags if f)
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", "--variants", ",".join(args.variants),
           "--mb", str(args.mb), "--mm", str(args.mm), "--chain", str(args.chain), "--iters", str(args.iters)]
    if args.cpu:
        cmd.append("--cpu")
    if args.no_peerless:
        cmd.append("--no-peerless")
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as e:
        return {"flagset": name, "error": f"timeout after {args.timeout}s: {str(e.stderr)[-800:]}"}
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        err = p.stderr or p.stdout
        # XLA's fatal message (a CHECK) comes before its stack trace: keep it and the last
        # variant started, not just the trace's tail.
        why = [x for x in err.splitlines() if re.search(r"Check failed|RET_CHECK|^F\d{4}|INTERNAL|variant ", x)]
        return {"flagset": name, "error": f"rc={p.returncode}: " + "\n".join(why[-6:]) + "\n" + err[-800:]}
    out = json.loads(lines[-1])
    out.update(flagset=name, xla_flags=env["XLA_FLAGS"], wall_s=round(time.time() - t0, 1))
    if dump:
        out["dump"] = summarize_dump(dump)
    return out


def summarize_dump(d: str) -> dict:
    """Pass order (ApplyXlaTransforms before the stream-annotation wrapper?) and the thunk lines
    of async starts, per module dumped."""
    res = {"passes": [], "thunks": {}}
    for f in sorted(glob.glob(os.path.join(d, "*.txt"))):
        b = os.path.basename(f)
        m = re.match(r"module_(\d+)\.(.+?)\.(\d{4})\.(.+)\.txt$", b)
        if m:
            res["passes"].append(f"module {m.group(1)} {m.group(2)} #{m.group(3)}: {m.group(4)}")
        if "thunk_sequence" in b:
            try:
                text = open(f, errors="replace").read()
            except OSError:
                continue
            keep = [l.strip()[:160] for l in text.splitlines()
                    if re.search(r"AsyncStart|kAsyncStart|async_id|stream=|peerless|CommandBuffer", l)]
            res["thunks"][b] = keep[:12]
    res["passes"] = res["passes"][:60]
    return res


def print_report(r: dict) -> None:
    print(f"\n=== flag set {r['flagset']}: XLA_FLAGS={r.get('xla_flags', '')!r}")
    if "error" in r:
        print("  child failed:", r["error"][:1500])
        return
    print(f"  {r['devices']} x {r['device_kind']}, jax {r['jax']} / jaxlib {r['jaxlib']}, peerless: "
          f"{r.get('peerless', 'off')}, child {r['wall_s']} s; matmul alone {fmt(r.get('mm_ms'))} ms"
          + (f" [{r['mm_error']}]" if r.get("mm_error") else ""))
    hdr = f"  {'variant':<14} {'placement':<44} {'window':<6} {'coll ms':>8} {'both ms':>8} {'overlap':>7} {'ok':<3} decisions"
    print(hdr)
    for v in r["variants"]:
        if "error" in v:
            print(f"  {v['name']:<14} ERROR {v['error'][:300]}")
            continue
        ov = v.get("overlap")
        print(f"  {v['name']:<14} {v['placement'][:44]:<44} {v['window']:<6} {fmt(v.get('coll_ms')):>8} "
              f"{fmt(v.get('both_ms')):>8} {('%.2f' % ov) if ov is not None else '-':>7} {v.get('ok', '-'):<3} "
              f"{v.get('decisions', '')}")
        for note in v.get("notes", []):
            print(f"  {'':<14}   {note[:200]}")
    d = r.get("dump")
    if d:
        # One module that reached the stream-annotation wrapper (else the first): its dumped
        # passes in order, showing whether apply-xla-transforms (our pass) ran before it.
        mods = [p.split(":")[0].rsplit("#", 1)[0] for p in d["passes"] if "stream-annotation" in p]
        pick = mods[0] if mods else (d["passes"][0].split(":")[0].rsplit("#", 1)[0] if d["passes"] else None)
        print("  pass order (dump numbering; apply-xla-transforms-N = PRE/POST_SCHEDULER hooks):")
        for p in [p for p in d["passes"] if pick and p.startswith(pick)][:8]:
            print("    ", p[:150])
        for f, lines in list(d["thunks"].items())[:4]:
            if any("peerless" in l or "AsyncStart" in l or "async_id" in l for l in lines):
                print(f"  thunks {f}:")
                for l in lines[:8]:
                    print("      ", l)


def fmt(x):
    return "-" if x is None else f"{x:.3f}"


def parent(args) -> int:
    names = args.flagsets or (["default"] if args.cpu else list(FLAGSETS))
    results = []
    for n in names:
        r = run_child(n, FLAGSETS[n], args)
        results.append(r)
        print_report(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"\nJSON: {args.json}")
    print("\nReading: 'async(...)' placement + window=yes + overlap near 1 (and ok=yes) is the goal; "
          "compare pl-* with xla (XLA's own async all-reduce).")
    return 0


# ----------------------------------------------------------------------------- child side

def analyze(text: str, needle: str) -> dict:
    """Where the call whose line contains `needle` sits in a scheduled module's text."""
    comps, cur, entry = {}, None, None
    for line in text.splitlines():
        m = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if m and not line.startswith(" "):
            cur = m.group(2)
            comps[cur] = []
            if m.group(1):
                entry = cur
            continue
        if cur is not None and line.startswith(" "):
            comps[cur].append(line.strip())
    home = next((c for c, ls in comps.items() if any(needle in l for l in ls)), None)
    if home is None:
        return {"placement": "not found", "window": "-", "notes": []}
    notes = []

    def started(c: str, l: str, opname: str) -> dict:
        # An async start `l` in computation `c`: is a GEMM scheduled before its done?
        attrs = ",".join(re.findall(r"(_xla_stream_annotation=\"[^\"]*\"|_scheduling_group_id=\"[^\"]*\"|"
                                    r"\\?\"operation_queue_id\\?\":\\?\"?\d+)", l))
        thread = re.search(r"async_execution_thread=\"([^\"]+)\"", l)
        start_name = l.split("=")[0].strip().lstrip("%")
        lines = comps.get(c, [])
        i0 = next((i for i, x in enumerate(lines) if x.split("=")[0].strip().lstrip("%") == start_name), None)
        i1 = next((i for i, x in enumerate(lines) if re.search(r"-done\(%?" + re.escape(start_name) + r"\)", x)), None)
        window = "-"
        if i0 is not None and i1 is not None:
            window = "yes" if any(is_gemm(x) for x in lines[i0 + 1:i1]) else "no"
            notes.append(f"{c}: start at {i0}, done at {i1}, {i1 - i0 - 1} instructions between")
        return {"placement": f"async {opname}({attrs or 'no attr'})"
                             + (f" thread={thread.group(1)}" if thread else ""),
                "window": window, "notes": notes}

    if home == entry:
        line = next(l for l in comps[entry] if needle in l)
        # XLA prints a one-instruction async computation inline: `custom-call-start(...)`.
        op = re.search(r"[\]\}\)]\s+([a-z][a-z\-]*)\(", line)
        if op and op.group(1).endswith("-start"):
            return started(entry, line, op.group(1))
        attrs = ",".join(a.split("=")[1].strip('"') for a in re.findall(r"_xla_stream_annotation=\"[^\"]*\"", line))
        return {"placement": "ENTRY sync" + (f" (attr {attrs} unused)" if attrs else ""), "window": "-",
                "notes": notes}
    # Follow callers up to ENTRY: the start op that runs `home` (directly, or via a call).
    target = home
    for _ in range(4):
        callers = [(c, l) for c, ls in comps.items() for l in ls
                   if re.search(r"(to_apply|calls)=%?" + re.escape(target) + r"\b", l)]
        if not callers:
            break
        c, l = callers[0]
        op = re.search(r"[\]\}\)]\s+([a-z][a-z\-]*)\(", l)  # the opcode follows the shape
        opname = op.group(1) if op else "?"
        if opname.endswith("-start"):
            return started(c, l, opname)
        target = c
        notes.append(f"inside {opname} in {c}")
    return {"placement": f"in {home} (not under a start)", "window": "-", "notes": notes}


def is_gemm(l: str) -> bool:
    return bool(re.search(r"__cublas|triton_gemm|__cudnn|\bdot\(|\"kind\":\"__triton|onednn|convolution\(", l))


def child(args) -> None:
    out = {"variants": []}
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    try:
        from jax import shard_map  # JAX >= 0.7
    except ImportError:  # pragma: no cover
        from jax.experimental.shard_map import shard_map
    from jax.experimental.xla_metadata import set_xla_metadata

    devs = jax.devices()
    n = len(devs)
    out.update(devices=n, device_kind=devs[0].device_kind, jax=jax.__version__,
               jaxlib=__import__("jaxlib").__version__)
    platform = devs[0].platform
    mesh = Mesh(np.array(devs), ("x",))
    spec = NamedSharding(mesh, P("x"))

    pl = None
    if not args.no_peerless:
        try:
            import jax_plugins.peerless as pl  # noqa: F811

            pl.enable(platforms=[platform], flags=PEERLESS_FLAGS)
            out["peerless"] = f"on ({pl.library_path()})"
        except Exception as e:  # noqa: BLE001
            pl = None
            out["peerless"] = f"unavailable: {type(e).__name__}: {e}"[:300]

    # Inputs: collective operand (f32, args.mb MiB per device), matmul operands (bf16).
    cols = 1024
    rows = max(1, int(args.mb * 2**20) // 4 // cols)
    g_host = np.concatenate([np.full((rows, cols), i + 1, np.float32) + (np.arange(cols, dtype=np.float32) * 1e-3)
                             for i in range(n)])
    want = np.full((rows, cols), n * (n + 1) / 2, np.float32) + n * np.arange(cols, dtype=np.float32) * 1e-3
    m = args.mm
    rng = np.random.default_rng(0)
    a_host = rng.standard_normal((n * m, m)).astype(np.float32)
    b_host = (rng.standard_normal((n * m, m)) / np.sqrt(m)).astype(np.float32)
    mm_dtype = jnp.float32 if args.cpu else jnp.bfloat16
    g = jax.device_put(g_host, spec)
    a = jax.device_put(a_host.astype(mm_dtype), spec)
    b = jax.device_put(b_host.astype(mm_dtype), spec)

    def chain(x, w, group=None):
        def body(x, w):
            for _ in range(args.chain):
                x = jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)
            return x
        if group is None:
            return body(x, w)
        with set_xla_metadata(_scheduling_group_id=group):
            return body(x, w)

    def collective(kind):
        def plain(v):
            return jax.lax.psum(v, "x")

        if kind in ("xla", "pl-sync", "pl-queue"):
            return plain
        if kind in ("pl-coll", "pl-stream1", "pl-coll-grp"):
            attrs = {"_xla_stream_annotation": "1" if kind == "pl-stream1" else "collective"}
            if kind == "pl-coll-grp":
                attrs["_scheduling_group_id"] = "1"

            def annotated(v):
                with set_xla_metadata(**attrs):
                    return jax.lax.psum(v, "x")
            return annotated
        if kind == "pl-compute_on":
            from jax._src import core
            from jax.experimental.compute_on import compute_on

            return compute_on(compute_type="gpu_stream:collective", out_memory_spaces=core.MemorySpace.Device)(plain)
        if kind in ("tf-sync", "tf-stream1"):
            def bits(v):
                key = jax.random.key(0)
                if kind == "tf-stream1":
                    with set_xla_metadata(_xla_stream_annotation="1"):
                        r = jax.random.bits(key, v.shape, jnp.uint32)
                else:
                    r = jax.random.bits(key, v.shape, jnp.uint32)
                return v + (r >> 31).astype(v.dtype)  # keeps the call live
            return bits
        raise ValueError(kind)

    def smap(f, n_in, n_out):
        return jax.jit(shard_map(f, mesh=mesh, in_specs=(P("x"),) * n_in,
                                 out_specs=(P("x"),) * n_out if n_out > 1 else P("x"), check_vma=False))

    def timed(fn, *xs):
        for _ in range(3):
            jax.block_until_ready(fn(*xs))
        ts = []
        for _ in range(args.iters):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*xs))
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    def compile_(jitted, *xs, threefry=False):
        from jax._src import config as jcfg
        if threefry:
            with jcfg.threefry_gpu_kernel_lowering(True):
                return jitted.lower(*xs).compile()
        return jitted.lower(*xs).compile()

    try:
        mm = compile_(smap(lambda x, w: chain(x, w), 2, 1), a, b)
        out["mm_ms"] = timed(mm, a, b)
    except Exception as e:  # noqa: BLE001
        out["mm_error"] = f"{type(e).__name__}: {e}"[:300]
        out["mm_ms"] = None

    for kind in args.variants:
        print(f"variant {kind}", file=sys.stderr, flush=True)
        v = {"name": kind}
        out["variants"].append(v)
        try:
            is_tf = kind.startswith("tf-")
            if is_tf and platform not in ("gpu", "cuda"):
                v["error"] = "skipped: GPU only (cu_threefry2x32_ffi)"
                continue
            if kind.startswith("pl-") and pl is None:
                v["error"] = "skipped: Peerless unavailable"
                continue
            if pl is not None:
                flags = PEERLESS_FLAGS
                if kind == "xla":
                    flags = flags.replace("--all_reduce_backend=kernel", "--all_reduce_backend=fallback")
                elif kind == "pl-queue":
                    flags += " --overlap_above_bytes=0"
                pl.enable(platforms=[platform], flags=flags)
                pl.reset_stats()
            coll = collective(kind)
            grp = "1" if kind == "pl-coll-grp" else None
            c_only = compile_(smap(coll, 1, 1), g, threefry=is_tf)
            both = compile_(smap(lambda v_, x, w: (coll(v_), chain(x, w, grp)), 3, 2), g, a, b, threefry=is_tf)
            text = both.as_text()
            needle = {"xla": "all-reduce", "tf-sync": "cu_threefry", "tf-stream1": "cu_threefry"}.get(
                kind, 'custom_call_target="peerless.')
            v.update(analyze(text, needle))
            if kind == "xla":  # XLA's own collective: look for its start/done instead
                starts = [l for l in text.splitlines() if "all-reduce-start" in l or "async-start" in l]
                v["placement"] = "XLA all-reduce-start/done" if starts else "XLA all-reduce (sync)"
                v["window"] = window_of(text, r"all-reduce-start|async-start", r"all-reduce-done|async-done")
            if pl is not None:
                st = pl.stats().get("all-reduce", {})
                v["decisions"] = f"kernel={st.get('kernel', 0)} fallback={st.get('fallback', 0)}"
            v["coll_ms"] = timed(c_only, g)
            v["both_ms"] = timed(both, g, a, b)
            r = np.asarray(c_only(g))[:rows]
            if not is_tf:
                v["ok"] = "yes" if np.allclose(r, want, rtol=1e-5, atol=1e-3) else "NO"
                rb = np.asarray(both(g, a, b)[0])[:rows]
                if not np.allclose(rb, want, rtol=1e-5, atol=1e-3):
                    v["ok"] = "NO"
            if out.get("mm_ms") and v["coll_ms"] and v["both_ms"]:
                lo = min(v["coll_ms"], out["mm_ms"])
                v["overlap"] = (v["coll_ms"] + out["mm_ms"] - v["both_ms"]) / lo if lo > 0 else None
        except Exception as e:  # noqa: BLE001
            v["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:400]
            v["trace"] = traceback.format_exc()[-800:]
    print(json.dumps(out))


def window_of(text: str, start_re: str, done_re: str) -> str:
    entry = text[text.find("ENTRY"):]
    lines = entry.splitlines()
    i0 = next((i for i, l in enumerate(lines) if re.search(start_re, l)), None)
    i1 = next((i for i, l in enumerate(lines) if re.search(done_re, l)), None)
    if i0 is None or i1 is None:
        return "-"
    return "yes" if any(is_gemm(l) for l in lines[i0 + 1:i1]) else "no"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="smoke mode: 8 host devices, small sizes")
    ap.add_argument("--mb", type=float, default=None, help="collective MiB per device (GPU 32, CPU 0.25)")
    ap.add_argument("--mm", type=int, default=None, help="matmul size (GPU 4096, CPU 128)")
    ap.add_argument("--chain", type=int, default=None, help="matmuls per program (GPU 4, CPU 2)")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations (GPU 20, CPU 3)")
    ap.add_argument("--variants", default=None, help=",".join(VARIANTS))
    ap.add_argument("--flagsets", default=None, help=",".join(FLAGSETS))
    ap.add_argument("--no-peerless", action="store_true")
    ap.add_argument("--dump", default=None, help="directory for XLA dumps (HLO, pass order, thunks)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--timeout", type=int, default=120, help="per child process, seconds")
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cpu = args.cpu
    args.mb = args.mb if args.mb is not None else (0.25 if cpu else 32)
    args.mm = args.mm or (128 if cpu else 4096)
    args.chain = args.chain or (2 if cpu else 4)
    args.iters = args.iters or (3 if cpu else 20)
    args.variants = args.variants.split(",") if isinstance(args.variants, str) else list(VARIANTS)
    args.flagsets = args.flagsets.split(",") if args.flagsets else None
    if args._child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
