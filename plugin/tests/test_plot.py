"""The bench plot: `python3 -m jax_plugins.peerless.plot` turns a `peerless bench --csv` file
into a PNG, and says what is wrong with a file that is not one."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# A file `peerless bench --csv` wrote (XLA:CPU, 8 devices): today's columns.
CSV = os.path.join(HERE, "..", "..", "docs", "cpu", "2026-11-26b", "bench_auto.csv")


def run(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "python"))
    return subprocess.run([sys.executable, "-m", "jax_plugins.peerless.plot", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_bench_csv_becomes_a_png(tmp_path):
    out = tmp_path / "bench.png"
    r = run(CSV, "--out", str(out), "--dtype", "bf16")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bf16, 8 devices" in r.stdout, r.stdout


def test_a_file_of_other_columns_is_named(tmp_path):
    bad = tmp_path / "other.csv"
    bad.write_text("impl,devices,bytes,us_median,status\nx,2,1024,3.0,ok\n")
    r = run(str(bad), "--out", str(tmp_path / "x.png"))
    assert r.returncode != 0 and "not a `peerless bench --csv` file" in r.stderr, r.stderr
