"""Builds libpeerless_pjrt.so with cargo when installed from a checkout.

`pip install ./plugin/python` runs `cargo build --release --locked -p peerless-pjrt` in the
repository root (two directories up) and copies the library into the package
(`jax_plugins/peerless/libpeerless_pjrt.so`). Set PEERLESS_PJRT_LIBRARY=/path/libpeerless_pjrt.so
to skip cargo and bundle that file instead: a machine without a Rust toolchain installs a
library built elsewhere (at run time, the same variable overrides the bundled library,
see __init__.py). The wheel is platform-specific because it carries a native library; the
manylinux-tagged wheel to hand to other machines comes from scripts/build_wheel.sh (docs/INSTALL.md).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LIB = "libpeerless_pjrt.so"


def cargo_library() -> Path:
    if not (REPO / "Cargo.toml").is_file():
        raise RuntimeError(
            f"no Cargo workspace at {REPO}; install from a Peerless checkout "
            "or set PEERLESS_PJRT_LIBRARY to a prebuilt libpeerless_pjrt.so"
        )
    if shutil.which("cargo") is None:
        raise RuntimeError(
            "cargo not found: install a Rust toolchain (https://rustup.rs) "
            "or set PEERLESS_PJRT_LIBRARY to a prebuilt libpeerless_pjrt.so"
        )
    subprocess.check_call(["cargo", "build", "--release", "--locked", "-p", "peerless-pjrt"], cwd=REPO)
    meta = subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=REPO)
    return Path(json.loads(meta)["target_directory"]) / "release" / LIB


class BuildWithCargo(build_py):
    def run(self):
        super().run()
        prebuilt = os.environ.get("PEERLESS_PJRT_LIBRARY")
        src = Path(prebuilt) if prebuilt else cargo_library()
        if not src.is_file():
            raise RuntimeError(f"{src} does not exist")
        dest = Path(self.build_lib) / "jax_plugins" / "peerless" / LIB
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        os.chmod(dest, 0o755)


class BinaryDistribution(Distribution):
    """Marks the wheel as platform-specific (it carries a native library)."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildWithCargo}
try:
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:
        from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        """`py3-none-<platform>`: the library uses no Python ABI, only the platform's."""

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # no wheel support: pip builds none either
    pass

setup(cmdclass=cmdclass, distclass=BinaryDistribution)
