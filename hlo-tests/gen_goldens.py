#!/usr/bin/env python3
"""Generates (or checks) the XLA goldens of the HLO conformance suite.

    python3 hlo-tests/gen_goldens.py            # regenerate every golden
    python3 hlo-tests/gen_goldens.py --check    # regenerate into a temp dir, compare
                                                # (outputs within each case's tolerance)
    python3 hlo-tests/gen_goldens.py --only add_sub_mul   # just some cases

Hand-written cases (`cases/*.hlo` not starting with `jax_`) are run on XLA's CPU
backend through jaxlib; `jax_*` cases are (re)dumped from the JAX programs in
`dump_jax.py` and their goldens come from running those programs. Goldens only
ever come from here -- never from Peerless's own output. See README.md for the
directive format and the npz conventions.
"""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse
import io
import re
import shutil
import sys
import tempfile
import zipfile
import zlib

import numpy as np
import ml_dtypes
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax._src.lib import _jax
from jaxlib import _hlo, xla_client

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "cases")
GOLDENS = os.path.join(HERE, "goldens")
sys.path.insert(0, HERE)
import dump_jax  # noqa: E402

DIRECTIVE = "// peerless-test:"


class Golden:
    """What --check needs to compare one npz: the case's tolerance class and each array's
    element type (before `to_storage`)."""

    def __init__(self, tolerance, dtypes):
        self.tolerance = tolerance
        self.dtypes = dtypes
VALID_KEYS = {"devices", "mode", "tolerance", "inputs", "source"}


# ----------------------------------------------------------------------------- directive

def parse_directive(text, name):
    first = text.splitlines()[0] if text else ""
    if not first.startswith(DIRECTIVE):
        raise SystemExit(f"{name}: first line must start with '{DIRECTIVE}'")
    d = {}
    for tok in first[len(DIRECTIVE):].split():
        k, sep, v = tok.partition("=")
        if not sep or k not in VALID_KEYS:
            raise SystemExit(f"{name}: bad directive token '{tok}'")
        d[k] = v
    if "devices" not in d or d.get("mode") not in ("replica", "partition"):
        raise SystemExit(f"{name}: directive needs devices=... and mode=replica|partition")
    d["devices"] = [int(x) for x in d["devices"].split(",")]
    d.setdefault("inputs", "default")
    if d["inputs"] not in ("default", "positive"):
        raise SystemExit(f"{name}: inputs= must be default|positive")
    return d


# ----------------------------------------------------------------------------- npz encoding

def to_storage(a):
    """Array as stored in the npz (README: bf16 -> uint16 bits, f8 -> uint8 bits,
    s4 -> uint8 holding the sign-extended two's-complement byte, u4 -> uint8)."""
    a = np.array(a, order="C")  # (np.ascontiguousarray would turn 0-d into 1-d)
    dt = a.dtype
    if dt == ml_dtypes.bfloat16:
        return a.view(np.uint16)
    if dt in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        return a.view(np.uint8)
    if dt == ml_dtypes.int4:
        return a.astype(np.int8).view(np.uint8)
    if dt == ml_dtypes.uint4:
        return a.astype(np.uint8)
    return a


def write_npz(path, arrays):
    """Deterministic, uncompressed npz (fixed timestamps, sorted member names). Returns each
    array's element type before `to_storage` (bf16 is stored as uint16, but compared as bf16)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for k in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, to_storage(arrays[k]), allow_pickle=False)
            info = zipfile.ZipInfo(k + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return {k: np.asarray(a).dtype for k, a in arrays.items()}


# ----------------------------------------------------------------------------- inputs

XLA_TO_NP = {
    "pred": np.bool_, "s8": np.int8, "s16": np.int16, "s32": np.int32, "s64": np.int64,
    "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
    "f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64,
    "f8e4m3fn": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2,
    "s4": ml_dtypes.int4, "u4": ml_dtypes.uint4,
}


def _shape_to_np(shape):
    if not shape.is_array():
        raise SystemExit(f"entry parameters must be arrays, got {shape}")
    return np.dtype(shape.numpy_dtype()), tuple(shape.dimensions())


def make_input(rng, dtype, dims, positive):
    if dtype == np.bool_:
        return rng.integers(0, 2, size=dims).astype(np.bool_)
    if dtype == ml_dtypes.int4:
        return rng.integers(-8, 8, size=dims).astype(ml_dtypes.int4)
    if dtype == ml_dtypes.uint4:
        return rng.integers(0, 16, size=dims).astype(ml_dtypes.uint4)
    if np.issubdtype(dtype, np.signedinteger):
        lo = 1 if positive else -9
        return rng.integers(lo, 10, size=dims).astype(dtype)
    if np.issubdtype(dtype, np.unsignedinteger):
        return rng.integers(1 if positive else 0, 20, size=dims).astype(dtype)
    lo, hi = (0.125, 2.0) if positive else (-1.0, 1.0)
    return rng.uniform(lo, hi, size=dims).astype(np.float32).astype(dtype)


def seed_for(name, n):
    return zlib.crc32(f"{name}/{n}".encode()) & 0x7FFFFFFF


# ----------------------------------------------------------------------------- XLA execution

_INSTR = re.compile(r"^\s*(ROOT )?%?[\w.\-]+ = ")


def manualize(text):
    """Marks every instruction `sharding={manual}` so that XLA's SPMD partitioner (which
    PJRT insists on for num_partitions > 1) leaves the per-partition program as written."""
    out = []
    for line in text.splitlines():
        if _INSTR.match(line) and "sharding=" not in line:
            line += ", sharding={manual}"
        out.append(line)
    return "\n".join(out) + "\n"


def run_xla(text, mode, n, args):
    """Runs HLO text on n CPU devices; args[d][i] = device d's parameter i.
    Returns outs[j][d] (result leaves, depth-first)."""
    # 64-bit inputs must reach the executable unconverted; the JAX programs of
    # dump_jax.py are traced with the default (x64 off).
    jax.config.update("jax_enable_x64", True)
    try:
        return _run_xla(text, mode, n, args)
    finally:
        jax.config.update("jax_enable_x64", False)


def _run_xla(text, mode, n, args):
    if mode == "partition":
        text = manualize(_hlo.hlo_module_from_text(text).to_string())
    proto = _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    mlir = _jax.mlir.hlo_to_stablehlo(proto)
    devs = jax.devices("cpu")[:n]
    opts = _jax.CompileOptions()
    bo = opts.executable_build_options
    if mode == "replica":
        bo.num_replicas, bo.num_partitions = n, 1
        bo.device_assignment = xla_client.DeviceAssignment.create(np.arange(n).reshape(n, 1))
    else:
        bo.num_replicas, bo.num_partitions = 1, n
        bo.use_spmd_partitioning = True
        bo.device_assignment = xla_client.DeviceAssignment.create(np.arange(n).reshape(1, n))
    client = devs[0].client
    exe = client.compile_and_load(mlir, _jax.DeviceList(tuple(devs)), opts)
    mesh = Mesh(np.array(devs), ("d",))
    jargs = []
    for i in range(len(args[0]) if args else 0):
        per_dev = [jax.device_put(args[d][i], devs[d]) for d in range(n)]
        jargs.append(jax.make_array_from_single_device_arrays(
            args[0][i].shape, NamedSharding(mesh, P()), per_dev))
    outs = exe.execute_sharded(jargs).disassemble_into_single_device_arrays()
    return [[np.asarray(x) for x in leaf] for leaf in outs]


def gen_handwritten(name, text, out_dir):
    d = parse_directive(text, name)
    module = _hlo.hlo_module_from_text(text)
    proto = module.as_serialized_hlo_module_proto()
    with open(os.path.join(out_dir, name + ".pb"), "wb") as f:
        f.write(proto)
    params = xla_client.XlaComputation(proto).program_shape().parameter_shapes()
    written = {name + ".pb": None}
    for n in d["devices"]:
        rng = np.random.default_rng(seed_for(name, n))
        specs = [_shape_to_np(s) for s in params]
        args = [[make_input(rng, dt, dims, d["inputs"] == "positive") for (dt, dims) in specs]
                for _ in range(n)]
        outs = run_xla(text, d["mode"], n, args)
        arrays = {}
        for dev in range(n):
            for i, a in enumerate(args[dev]):
                arrays[f"p{i}_d{dev}"] = a
            for j, leaf in enumerate(outs):
                arrays[f"o{j}_d{dev}"] = leaf[dev]
        fn = f"{name}.d{n}.npz"
        written[fn] = Golden(d.get("tolerance", "default"), write_npz(os.path.join(out_dir, fn), arrays))
    return written


def gen_jax(name, out_dir, cases_dir):
    text, arrays = dump_jax.dump(name)
    with open(os.path.join(cases_dir, name + ".hlo"), "w") as f:
        f.write(text)
    d = parse_directive(text, name)
    n = d["devices"][0]
    proto = _hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    with open(os.path.join(out_dir, name + ".pb"), "wb") as f:
        f.write(proto)
    fn = f"{name}.d{n}.npz"
    return {name + ".pb": None, fn: Golden(d.get("tolerance", "default"), write_npz(os.path.join(out_dir, fn), arrays))}


def handwritten_names():
    return sorted(f[:-4] for f in os.listdir(CASES) if f.endswith(".hlo") and not f.startswith("jax_"))


def generate(names, out_dir, cases_dir):
    """Writes every golden of `names`; returns {file name: Golden (npz) or None (.pb)}."""
    written = {}
    for name in names:
        print(f"  {name}", file=sys.stderr, flush=True)
        if name.startswith("jax_"):
            written.update(gen_jax(name, out_dir, cases_dir))
        else:
            with open(os.path.join(CASES, name + ".hlo")) as f:
                written.update(gen_handwritten(name, f.read(), out_dir))
    return written


# ----------------------------------------------------------------------------- check

def _load(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _same_array(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# (rtol, atol) per float element type, x10 for `tolerance=loose`: the Rust harnesses'
# tolerances (hlo-tests/tests/support/lib.rs `tolerance`, README "Comparison"). Every other element type
# (ints, pred, f8, 4-bit) compares exactly.
TOLERANCES = {
    np.dtype(np.float64): (1e-12, 1e-14),
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float16): (1e-3, 1e-4),
    np.dtype(ml_dtypes.bfloat16): (1e-2, 1e-3),
}


def _compare_output(committed, fresh, dtype, tolerance):
    """Compares a fresh output with its committed golden as the Rust harnesses compare Peerless
    with it: floats within |fresh - committed| <= atol + rtol*|committed| (NaN matches NaN,
    an infinity only the same infinity, -0.0 matches +0.0), everything else exactly. XLA's CPU
    backend picks vectorized transcendental code by the host's ISA, so the last bits of e.g. an
    f32 rsqrt differ between processors; the goldens are XLA's answer, not one CPU's bits.
    Returns None if they match, else a description of the difference."""
    if committed.dtype != fresh.dtype or committed.shape != fresh.shape:
        return f"stored as {committed.dtype}{list(committed.shape)}, now {fresh.dtype}{list(fresh.shape)}"
    if dtype not in TOLERANCES:
        if committed.tobytes() == fresh.tobytes():
            return None
        bad = np.flatnonzero(committed.reshape(-1) != fresh.reshape(-1))
        want, got = committed.reshape(-1), fresh.reshape(-1)
    else:
        rtol, atol = TOLERANCES[dtype]
        if tolerance == "loose":
            rtol, atol = rtol * 10, atol * 10
        want = committed.view(dtype).astype(np.float64).reshape(-1)
        got = fresh.view(dtype).astype(np.float64).reshape(-1)
        with np.errstate(invalid="ignore", over="ignore"):
            nan = np.isnan(want) | np.isnan(got)
            inf = ~nan & (np.isinf(want) | np.isinf(got))
            ok = np.where(nan, np.isnan(want) & np.isnan(got),
                          np.where(inf, want == got, np.abs(got - want) <= atol + rtol * np.abs(want)))
        bad = np.flatnonzero(~ok)
        if bad.size == 0:
            return None
    first = ", ".join(f"at {[int(x) for x in np.unravel_index(i, committed.shape)]}: "
                      f"{want[i].item()!r} -> {got[i].item()!r}" for i in bad[:3])
    what = f"{dtype}" + (f", rtol={rtol:g}, atol={atol:g}" if dtype in TOLERANCES else ", exact")
    return f"{bad.size} of {want.size} elements differ ({what}): {first}"


def _pb_text(path):
    with open(path, "rb") as f:
        return xla_client.XlaComputation(f.read()).as_hlo_text()


def check(names):
    """Returns (problems, outputs that differ from the goldens' bits but within tolerance)."""
    problems, within = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = os.path.join(tmp, "goldens")
        cases_dir = os.path.join(tmp, "cases")
        os.makedirs(out_dir)
        os.makedirs(cases_dir)
        written = generate(names, out_dir, cases_dir)
        for fn in sorted(written):
            committed = os.path.join(GOLDENS, fn)
            fresh = os.path.join(out_dir, fn)
            if not os.path.exists(committed):
                problems.append(f"{fn}: missing from goldens/")
                continue
            if fn.endswith(".pb"):
                if _pb_text(committed) != _pb_text(fresh):
                    problems.append(f"{fn}: HloModuleProto differs")
                continue
            old, new = _load(committed), _load(fresh)
            if sorted(old) != sorted(new):
                problems.append(f"{fn}: array names differ: {sorted(old)} vs {sorted(new)}")
                continue
            golden = written[fn]
            for k in sorted(new):
                if _same_array(old[k], new[k]):
                    continue
                if not k.startswith("o"):  # inputs come from numpy's seeded generator: exact
                    problems.append(f"{fn}: input {k} changed")
                    continue
                diff = _compare_output(old[k], new[k], golden.dtypes[k], golden.tolerance)
                if diff:
                    problems.append(f"{fn}: output {k} changed beyond tolerance={golden.tolerance}: {diff}")
                else:
                    within.append(f"{fn}:{k}")
        for name in names:
            if name.startswith("jax_"):
                with open(os.path.join(cases_dir, name + ".hlo")) as f:
                    fresh_text = f.read()
                path = os.path.join(CASES, name + ".hlo")
                if not os.path.exists(path):
                    problems.append(f"cases/{name}.hlo: missing")
                elif open(path).read() != fresh_text:
                    problems.append(f"cases/{name}.hlo: JAX dump changed")
        # Stale goldens: files in goldens/ that no case produces.
        if set(names) == set(all_names()):
            for fn in sorted(os.listdir(GOLDENS)):
                if fn.endswith((".npz", ".pb")) and fn not in written:
                    problems.append(f"{fn}: stale golden (no case/device count produces it)")
    return problems, within


def all_names():
    return sorted(set(handwritten_names()) | set(dump_jax.case_names()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="regenerate into a temp dir and compare with goldens/")
    ap.add_argument("--only", nargs="+", metavar="CASE", help="restrict to these cases")
    ap.add_argument("--only-jax", action="store_true", help="restrict to the jax_* cases")
    a = ap.parse_args(argv)
    names = all_names()
    if a.only_jax:
        names = [n for n in names if n.startswith("jax_")]
    if a.only:
        unknown = sorted(set(a.only) - set(names))
        if unknown:
            print(f"unknown cases: {unknown}", file=sys.stderr)
            return 2
        names = sorted(a.only)
    if a.check:
        problems, within = check(names)
        if within:
            print(f"gen_goldens --check: {len(within)} output(s) differ from the goldens' bits within "
                  f"their tolerance (this CPU's XLA): {' '.join(within)}")
        if problems:
            print(f"gen_goldens --check: {len(problems)} problem(s):")
            for p in problems:
                print("  " + p)
            return 1
        print(f"gen_goldens --check: {len(names)} cases match the committed goldens "
              "(inputs, .pb and jax_* dumps exactly, outputs within each case's tolerance)")
        return 0
    os.makedirs(GOLDENS, exist_ok=True)
    written = set(generate(names, GOLDENS, CASES))
    if names == all_names():
        for fn in os.listdir(GOLDENS):
            if fn.endswith((".npz", ".pb")) and fn not in written:
                os.remove(os.path.join(GOLDENS, fn))
                print(f"removed stale {fn}", file=sys.stderr)
    print(f"wrote {len(written)} golden files for {len(names)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
