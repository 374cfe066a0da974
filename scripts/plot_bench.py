"""Plots `peerless bench` CSV (and optionally torch_symm_bench.py's) as latency and bus
bandwidth vs size, Peerless vs NCCL (vs PyTorch symmetric memory), one panel pair per op.

    python3 scripts/plot_bench.py bench.csv [--torch torch_symm.csv] --dtype f32 --out bench.png
"""

import argparse
import csv
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--torch")
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="", help="comma-separated launch modes to plot (default: all)")
    ap.add_argument("--blocks", default="", help="comma-separated Peerless max_blocks to plot (default: all)")
    a = ap.parse_args()
    series = defaultdict(list)  # (op, label) -> [(bytes, us, busbw)]
    devices = "?"
    for r in csv.DictReader(open(a.csv)):
        if r["dtype"] != a.dtype or (a.modes and r["mode"] not in a.modes.split(",")):
            continue
        blocks = r.get("max_blocks", "0")
        if a.blocks and r["impl"] != "nccl" and blocks not in a.blocks.split(","):
            continue
        devices = r["devices"]
        who = "nccl" if r["impl"] == "nccl" else f"peerless b{blocks}" if blocks != "0" else "peerless"
        series[(r["op"], f"{who} ({r['mode']})")].append(
            (int(r["bytes"]), float(r["us_median"]), float(r["busbw_gbps"])))
    if a.torch:
        for r in csv.DictReader(open(a.torch)):
            if r["status"] == "ok":
                n = int(r["devices"])
                b = int(r["bytes"])
                us = float(r["us_median"])
                series[("all-reduce", r["impl"] + " (graph)")].append((b, us, b / us / 1e3 * 2 * (n - 1) / n))
    ops = sorted({op for op, _ in series}, key=["all-reduce", "all-gather", "reduce-scatter", "all-to-all"].index)
    fig, axes = plt.subplots(2, len(ops), figsize=(4.5 * len(ops), 8), squeeze=False)
    for i, op in enumerate(ops):
        for (o, label), pts in sorted(series.items()):
            if o != op:
                continue
            pts.sort()
            xs = [p[0] for p in pts]
            style = "--" if "nccl" in label else (":" if "torch" in label else "-")
            axes[0][i].plot(xs, [p[1] for p in pts], style, marker="o", ms=3, label=label)
            axes[1][i].plot(xs, [p[2] for p in pts], style, marker="o", ms=3, label=label)
        axes[0][i].set_title(f"{op}, {a.dtype}, {devices} GPUs")
        for ax, yl in ((axes[0][i], "µs per call (median)"), (axes[1][i], "bus bandwidth GB/s")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("bytes per device")
            ax.set_ylabel(yl)
            ax.grid(True, which="both", alpha=0.3)
        axes[0][i].set_yscale("log")
        axes[0][i].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
