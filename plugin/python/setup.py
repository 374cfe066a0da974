"""Builds libpeerless_pjrt.so and the `peerless` command with cargo when installed from a checkout.

`pip install ./plugin/python` runs `cargo build --release --locked -p peerless-pjrt -p
peerless-cli` in the repository root (two directories up) and copies the library and the
command into the package (`jax_plugins/peerless/libpeerless_pjrt.so`, `bin/peerless`; the
`peerless` console script runs it). Set PEERLESS_PJRT_LIBRARY=/path/libpeerless_pjrt.so to skip
cargo and bundle that file instead, with the `peerless` binary beside it or at
PEERLESS_CLI_BINARY: a machine without a Rust toolchain installs binaries built elsewhere (at
run time, the same variable overrides the bundled library, see __init__.py). The version is
the Cargo workspace's (one source for both). The wheel is platform-specific because it carries
native code; the manylinux-tagged wheel to hand to other machines comes from
scripts/build_wheel.sh (docs/INSTALL.md).
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LIB = "libpeerless_pjrt.so"
CLI = "peerless"


def cargo_version() -> str:
    """The Cargo workspace's version: the one version of the library, the command and this package."""
    text = (REPO / "Cargo.toml").read_text()
    section = text[text.index("[workspace.package]"):]
    return re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)


def packaged_version() -> str:
    """Cargo's version from a checkout, else PEERLESS_VERSION (scripts/build_wheel.sh builds from a
    copy of this directory and sets it from Cargo)."""
    if (REPO / "Cargo.toml").is_file():
        return cargo_version()
    if os.environ.get("PEERLESS_VERSION"):
        return os.environ["PEERLESS_VERSION"]
    raise RuntimeError(f"no Cargo workspace at {REPO} to take the version from (or set PEERLESS_VERSION)")


def top_file(name: str) -> Path:
    """README.md / LICENSE: the checkout's, else a copy beside this file (scripts/build_wheel.sh)."""
    return REPO / name if (REPO / name).is_file() else HERE / name


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
    subprocess.check_call(
        ["cargo", "build", "--release", "--locked", "-p", "peerless-pjrt", "-p", "peerless-cli"], cwd=REPO)
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
        # The `peerless` command: PEERLESS_CLI_BINARY, else the one cargo built beside the library.
        cli = Path(os.environ.get("PEERLESS_CLI_BINARY") or src.parent / CLI)
        if not cli.is_file():
            raise RuntimeError(
                f"{cli} does not exist: build it with `cargo build --release -p peerless-cli` "
                "(or set PEERLESS_CLI_BINARY to a peerless binary)"
            )
        shutil.copyfile(top_file("LICENSE"), dest.parent / "LICENSE")
        bin_dest = dest.parent / "bin" / CLI
        bin_dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cli, bin_dest)
        os.chmod(bin_dest, 0o755)


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

setup(
    version=packaged_version(),
    long_description=top_file("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    cmdclass=cmdclass,
    distclass=BinaryDistribution,
)
