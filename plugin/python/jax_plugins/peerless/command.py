"""The `peerless` console script: runs the Rust command bundled in this package (bin/peerless).

The command finds XLA's PJRT plugin for `run`, `bench` and `tune` through PEERLESS_XLA_PLUGIN;
where that is unset, this sets it to the plugin `JAX_PLATFORMS=peerless` would wrap here (the
installed jax-cuda13 plugin on a machine with a usable NVIDIA GPU, else XLA's CPU plugin if
installed), so the command works after `pip install` with nothing else set.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def executable() -> Path:
    return Path(__file__).resolve().parent / "bin" / "peerless"


def main() -> None:
    exe = executable()
    if not exe.is_file():
        sys.exit(
            f"peerless: this install has no command ({exe} is missing): install the wheel from "
            "scripts/build_wheel.sh, or `pip install ./plugin/python` from a checkout with cargo"
        )
    env = dict(os.environ)
    if not env.get("PEERLESS_XLA_PLUGIN"):
        try:
            from . import inner_plugin

            inner = inner_plugin()
        except Exception:  # JAX missing or broken: the command still lists devices and flags
            inner = None
        if inner is not None:
            env["PEERLESS_XLA_PLUGIN"] = inner[0]
    os.execve(exe, [str(exe), *sys.argv[1:]], env)


if __name__ == "__main__":
    main()
