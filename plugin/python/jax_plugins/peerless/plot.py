"""Plots a `peerless bench --csv` file: time per collective and bus bandwidth against size, each
implementation (Peerless, XLA, XLA's collective kernels, ...) a line, one column of panels per
collective kind; optionally PyTorch symmetric memory's all-reduce beside them
(scripts/torch_symm_bench.py's CSV).

    peerless bench --devices 8 --csv bench.csv
    python3 -m jax_plugins.peerless.plot bench.csv --out bench.png [--dtype f32] [--torch torch.csv]

Needs matplotlib (`pip install "jax-peerless[plot]"`).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict

KINDS = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"]


def read(path: str, dtype: str | None, torch: str | None = None):
    """{(op, implementation): [(bytes, µs, bus GB/s)]}, the dtype plotted and the device count."""
    series: dict[tuple[str, str], list[tuple[int, float, float]]] = defaultdict(list)
    devices = "?"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path}: no rows")
    missing = {"op", "dtype", "devices", "bytes", "impl", "us_per_collective", "busbw_gbps"} - set(rows[0])
    if missing:
        raise SystemExit(f"{path}: not a `peerless bench --csv` file (no column {', '.join(sorted(missing))})")
    dtype = dtype or rows[0]["dtype"]
    for r in rows:
        if r["dtype"] != dtype or not r["us_per_collective"]:
            continue  # another dtype, or a row that did not run
        devices = r["devices"]
        series[(r["op"], r["impl"])].append(
            (int(r["bytes"]), float(r["us_per_collective"]), float(r["busbw_gbps"] or 0)))
    if torch:
        with open(torch, newline="") as f:
            for r in csv.DictReader(f):
                if r.get("status") == "ok":
                    n, b, us = int(r["devices"]), int(r["bytes"]), float(r["us_median"])
                    series[("all-reduce", r["impl"])].append((b, us, b / us / 1e3 * 2 * (n - 1) / n))
    return series, dtype, devices


def plot(series, dtype: str, devices: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = sorted({op for op, _ in series}, key=lambda o: KINDS.index(o) if o in KINDS else len(KINDS))
    if not ops:
        raise SystemExit(f"no rows of dtype {dtype} to plot")
    fig, axes = plt.subplots(2, len(ops), figsize=(4.5 * len(ops), 8), squeeze=False)
    for i, op in enumerate(ops):
        for (o, label), pts in sorted(series.items()):
            if o != op:
                continue
            pts.sort()
            xs = [p[0] for p in pts]
            style = "--" if label.startswith(("xla", "nccl", "torch")) else "-"
            axes[0][i].plot(xs, [p[1] for p in pts], style, marker="o", ms=3, label=label)
            axes[1][i].plot(xs, [p[2] for p in pts], style, marker="o", ms=3, label=label)
        axes[0][i].set_title(f"{op}, {dtype}, {devices} devices")
        for ax, ylabel in ((axes[0][i], "µs per collective"), (axes[1][i], "bus bandwidth GB/s")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("bytes per device")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        axes[0][i].set_yscale("log")
        axes[0][i].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="a `peerless bench --csv` file")
    ap.add_argument("--out", required=True, help="the image to write (.png, .svg, .pdf)")
    ap.add_argument("--dtype", help="the dtype to plot (default: the first row's)")
    ap.add_argument("--torch", help="scripts/torch_symm_bench.py's CSV, drawn beside the all-reduces")
    a = ap.parse_args(argv)
    series, dtype, devices = read(a.csv, a.dtype, a.torch)
    plot(series, dtype, devices, a.out)
    print(f"{a.out}: {len(series)} lines ({dtype}, {devices} devices)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
