"""Builds libpeerless_pjrt.so with cargo when installed from a checkout.

`pip install ./plugin/python` runs `cargo build --release -p peerless-pjrt` in the
repository root (two directories up) and copies the library into the package. Set
PEERLESS_PJRT_LIBRARY=/path/libpeerless_pjrt.so to skip the build and bundle that file
instead (machines without a Rust toolchain can also set it at run time, see __init__.py).
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LIB = "libpeerless_pjrt.so"


class BuildWithCargo(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib) / "jax_plugins" / "peerless" / LIB
        prebuilt = os.environ.get("PEERLESS_PJRT_LIBRARY")
        if prebuilt:
            src = Path(prebuilt)
        else:
            if not (REPO / "Cargo.toml").is_file():
                raise RuntimeError(
                    f"no Cargo workspace at {REPO}; install from a Peerless checkout "
                    "or set PEERLESS_PJRT_LIBRARY to a prebuilt libpeerless_pjrt.so"
                )
            target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
            subprocess.check_call(["cargo", "build", "--release", "-p", "peerless-pjrt"], cwd=REPO)
            src = target / "release" / LIB
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)


setup(cmdclass={"build_py": BuildWithCargo})
