#!/usr/bin/env python3
"""The Rust pass alone (PeerlessXlaPass) of several builds on one module, side by side.

    python3 plugin/tests/bench_pass.py MODULE.pb NAME=LIB.so [NAME=LIB.so ...] [--reps 15] [--devices 8]

MODULE.pb: a serialized HloModuleProto as XLA hands the pass (e.g. `bench_xla_inside.py --only
compile --dump-module M.pb`). Each build runs the pass on XLA:CPU's platform with its default
flags (the whole module decoded: the fused norm may match) and with `--fuse_norm=false` (the slim
copy), the builds alternating; ms are medians and ranges. The rewritten modules are compared
field by field with instance ids (10+ digits) masked: builds that decide alike print `same`.
Not a test.
"""

import argparse
import ctypes
import re
import statistics
import time


class Result(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int32), ("module", ctypes.c_void_p), ("module_len", ctypes.c_size_t),
                ("report", ctypes.c_void_p), ("report_len", ctypes.c_size_t)]


def load(path):
    d = ctypes.CDLL(path)
    d.PeerlessXlaPass.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p]
    d.PeerlessXlaPass.restype = ctypes.POINTER(Result)
    d.PeerlessXlaPassFree.argtypes = [ctypes.POINTER(Result)]
    return d


def varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(b):
    """A protobuf message as nested tuples; strings with instance ids masked."""
    out, i = [], 0
    while i < len(b):
        k, i = varint(b, i)
        f, w = k >> 3, k & 7
        if f == 0 or w not in (0, 1, 2, 5):
            raise ValueError
        if w == 0:
            v, i = varint(b, i)
        elif w in (1, 5):
            n = 8 if w == 1 else 4
            v, i = b[i:i + n], i + n
        else:
            n, i = varint(b, i)
            v, i = canon(b[i:i + n]), i + n
            if i > len(b):
                raise ValueError
        out.append((f, v))
    return tuple(out)


def canon(p):
    try:
        t = p.decode()
        if t and t.isprintable():
            return ("s", re.sub(r"\d{10,}", "N", t))
    except UnicodeDecodeError:
        pass
    try:
        return ("m", fields(p))
    except (ValueError, IndexError):
        return ("b", p)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("module")
    ap.add_argument("builds", nargs="+", help="NAME=path/to/libpeerless_pjrt.so")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--devices", type=int, default=8)
    args = ap.parse_args()
    mod = open(args.module, "rb").read()
    libs = {n: load(p) for n, p in (b.split("=", 1) for b in args.builds)}
    local = ",".join(map(str, range(args.devices))).encode()
    print(f"module {args.module}: {len(mod) / 1e6:.2f} MB")
    print("| flags | build | ms (median) | range | decisions | kernels | output |")
    print("|---|---|---:|---|---:|---:|---|")
    for flags in (b"", b"--fuse_norm=false"):
        ts, outs = {n: [] for n in libs}, {}
        for _ in range(args.reps):
            for n, d in libs.items():
                t = time.perf_counter()
                r = d.PeerlessXlaPass(b"cpu", mod, len(mod), flags, local)
                ts[n].append(time.perf_counter() - t)
                rep = ctypes.string_at(r.contents.report, r.contents.report_len).decode()
                body = ctypes.string_at(r.contents.module, r.contents.module_len) if r.contents.module else b""
                lines = [l.split("\t") for l in rep.splitlines() if l.count("\t") >= 7]
                outs[n] = (len(lines), sum(l[5] == "1" for l in lines), canon(body))
                d.PeerlessXlaPassFree(r)
        first = next(iter(outs.values()))[2]
        for n in libs:
            v = sorted(ts[n])
            same = "same" if outs[n][2] == first else "DIFFERS"
            print(f"| {flags.decode() or '(defaults)'} | {n} | {statistics.median(v) * 1e3:.1f} | "
                  f"{v[0] * 1e3:.1f}–{v[-1] * 1e3:.1f} | {outs[n][0]} | {outs[n][1]} | {same} |")


if __name__ == "__main__":
    main()
