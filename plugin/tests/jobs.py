"""Multi-process jobs for the test scripts: start one worker per process, collect their
reports. Shared by test_multiprocess.py (CI), gpu_multiprocess.py and gpu_group_order.py.

A worker prints one JSON object per line; its last such line is its report. Each report gets
the worker's `rc` and the tail of its stderr; a worker still running at the deadline is killed
with the whole job, and `hung` is set on every report collected after that.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time


def free_port() -> int:
    """A TCP port on localhost nobody listens on (for the job's coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(argv_of, n: int, env: dict, timeout: float, stderr_tail: int = 4000, env_of=None) -> list[dict]:
    """Starts `n` processes (`argv_of(i)` is process i's command line) with `env` (and
    `env_of(i)`'s variables, e.g. a CUDA_VISIBLE_DEVICES each), waits at most `timeout` seconds
    for all of them, and returns their reports in process order."""
    procs = [subprocess.Popen(argv_of(i), env=dict(env, **(env_of(i) if env_of else {})), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    out = []
    hung = False
    deadline = time.time() + timeout
    for p in procs:
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            hung = True
            for q in procs:
                q.kill()
            so, se = p.communicate()
            se = f"HUNG past {timeout} s\n" + se
        lines = [line for line in so.splitlines() if line.startswith("{")]
        rep = json.loads(lines[-1]) if lines else {}
        rep.update(rc=p.returncode, stderr=se[-stderr_tail:], hung=hung)
        out.append(rep)
    return out
