#!/usr/bin/env python3
"""JAX's own collective suites with Peerless enabled, beside the same run without it.

    python3 plugin/tests/jax_suites.py TESTS_DIR [--suites pmap_test,shard_map_test,pjit_test]
                                       [--workers N] [--out DIR]

TESTS_DIR holds test files from jax-ml/jax's tests/ (pmap_test.py, shard_map_test.py,
pjit_test.py: fetched at the version of the installed JAX, never committed; a conftest.py
beside them is used if present). Each suite runs twice under pytest, without Peerless and
with `PEERLESS_ENABLE=1`, on the platform JAX picks (every visible GPU, or CPU). A test
that passes without Peerless and fails with it is a regression: it is run again alone, in a
fresh process each way, and one that still fails only with Peerless fails this script, unless
its failure is an assertion on how many of XLA's collective ops the compiled text holds
(Peerless's custom call replaces them; those are listed apart). The table says passed /
failed / skipped of each run.

PEERLESS_PJRT_LIBRARY and PYTHONPATH (plugin/python) must point at the library under test.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# An assertion on how often an XLA collective op appears in the compiled HLO text.
TEXT_COUNT = re.compile(r"\.count\(['\"](all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)")
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed)")


def pytest(tests: str, target: list[str], peerless: bool, workers: int, log: str | None, timeout: float) -> dict:
    env = dict(os.environ, **SAFE_ENV)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.pop("PEERLESS_ENABLE", None)
    if peerless:
        env["PEERLESS_ENABLE"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *target]
    if workers > 1:
        cmd[4:4] = ["-n", str(workers)]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        out, rc = out + f"\n(timed out after {timeout:.0f} s)", 124
    if log:
        with open(log, "w") as f:
            f.write(out)
    # pytest's closing line ("277 passed, 12 skipped, 4 warnings in 38s"); stderr follows it.
    counts = {}
    closing = [l for l in out.splitlines() if re.match(r"^=*\s*\d+ (passed|failed|skipped|error)", l)]
    for n, what in SUMMARY.findall(closing[-1] if closing else ""):
        counts["error" if what.startswith("error") else what] = int(n)
    failed = sorted({m.group(1) for m in re.finditer(r"^(?:FAILED|ERROR) (\S+)", out, re.M)})
    return {"rc": rc, "counts": counts, "failed": failed, "seconds": round(time.time() - t0), "out": out}


def counts_text(tests: str, out: str) -> bool:
    """Whether a failure's traceback points at such a count: pytest's short traceback may cut the
    assertion before its `.count(...)`, so the lines it names in the test files are read."""
    for name, line in re.findall(r"(\w+\.py):(\d+): in ", out):
        try:
            with open(os.path.join(tests, name)) as fh:
                lines = fh.readlines()
        except OSError:
            continue
        k = int(line) - 1
        if TEXT_COUNT.search("".join(lines[k:k + 4])):
            return True
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests")
    ap.add_argument("--suites", default="pmap_test,shard_map_test,pjit_test")
    ap.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (default 1)")
    ap.add_argument("--out", help="logs of each run go here")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run")
    ap.add_argument("--peerless-only", action="store_true",
                    help="skip the run without Peerless (its failures then count as Peerless's)")
    a = ap.parse_args()
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    if "PEERLESS_PJRT_LIBRARY" not in os.environ:
        print("jax_suites: PEERLESS_PJRT_LIBRARY is not set: the runs would not test this library", file=sys.stderr)
        return 2
    regressions = []
    text_checks = []
    rows = []
    for suite in a.suites.split(","):
        path = f"{suite}.py"
        if not os.path.exists(os.path.join(a.tests, path)):
            print(f"jax_suites: {a.tests}/{path} is missing", file=sys.stderr)
            return 2
        runs = {}
        runs["stock"] = {"failed": []}
        for peerless in (True,) if a.peerless_only else (False, True):
            name = "peerless" if peerless else "stock"
            log = os.path.join(a.out, f"{suite}.{name}.txt") if a.out else None
            runs[name] = r = pytest(a.tests, [path], peerless, a.workers, log, a.timeout)
            c = r["counts"]
            rows.append(f"| {suite} | {name} | {c.get('passed', 0)} | {c.get('failed', 0) + c.get('error', 0)} | "
                        f"{c.get('skipped', 0)} | {r['seconds']} |")
            print(rows[-1], flush=True)
            if r["rc"] not in (0, 1) or not c:
                regressions.append(f"{suite} ({name}): pytest exited {r['rc']} without a result")
        only = [t for t in runs["peerless"]["failed"] if t not in runs["stock"]["failed"]]
        # Confirm each alone (xdist order and shared GPUs can make a test flaky either way).
        for t in only:
            alone = {p: pytest(a.tests, [t], p, 1, None, 600) for p in (False, True)}
            if alone[True]["failed"] and not alone[False]["failed"]:
                # A test that counts XLA's collective ops in the compiled text fails by design
                # (Peerless's custom call replaces the op; the program's values are unchanged):
                # reported, not counted as a wrong result.
                if TEXT_COUNT.search(alone[True]["out"]) or counts_text(a.tests, alone[True]["out"]):
                    text_checks.append(t)
                else:
                    regressions.append(f"{t}: fails with Peerless, passes without (alone too)")
            else:
                both = "fails alone both ways" if alone[False]["failed"] else "passes alone both ways"
                print(f"jax_suites: {t} failed with Peerless in the suite run (without Peerless: not run, or "
                      f"passed there); it {both} (stock rc {alone[False]['rc']}, peerless rc {alone[True]['rc']})",
                      flush=True)
    print("\n| suite | run | passed | failed | skipped | s |\n|---|---|---:|---:|---:|---:|")
    print("\n".join(rows))
    for t in text_checks:
        print(f"text check: {t} counts XLA's collective ops in the compiled text (Peerless's call replaces them)")
    for r in regressions:
        print(f"REGRESSION: {r}")
    print(f"\njax_suites: {len(regressions)} tests fail with Peerless that pass without it")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
