"""JAX plugin for Peerless: faster collectives from inside XLA.

Two ways in, one runtime (XLA's): `enable()` / `PEERLESS_ENABLE=1` puts Peerless's pass and
handlers into JAX's own backends (see inside.py), and `JAX_PLATFORMS=peerless` is a platform
that is XLA's own PJRT plugin with the pass and handlers registered.

JAX imports every `jax_plugins.*` module and calls `initialize()`. The library is, in order:
$PEERLESS_PJRT_LIBRARY, or the libpeerless_pjrt.so bundled in this package.

`JAX_PLATFORMS=peerless` wraps the plugin `inner_plugin()` names: jax-cuda13/12-pjrt's where an
NVIDIA GPU is usable, jax-rocm7-pjrt's where an AMD GPU is (its handlers need a library built
with the cargo feature `rocm`; never run on an AMD GPU), else XLA's CPU plugin from
`lammps-jax-pjrt-cpu`, or the one PEERLESS_XLA_PLUGIN names (a path). XLA compiles, partitions and runs everything and Peerless
takes the collectives. PEERLESS_HOST_DEVICES (default 8) sets the CPU device count,
PEERLESS_FLAGS the collective flags (`peerless flags`), `compiler_options` per executable.
With no XLA plugin installed, `JAX_PLATFORMS=peerless` fails at client creation with an error
naming what to install (the older standalone platform was retired). PEERLESS_XLA_PLUGIN=none
registers no "peerless" platform at all (`enable()` still works on JAX's own backends).
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

from .inside import (  # noqa: F401  (public API)
    decisions,
    disable,
    enable,
    enabled,
    handler_calls,
    reset_stats,
    staging_bytes,
    staging_by_device,
    stats,
)

PLATFORM = "peerless"
_LIB = "libpeerless_pjrt.so"


def _version() -> str:
    """The installed distribution's version (the Cargo workspace's, which setup.py copies), or
    for a checkout on PYTHONPATH the workspace's own."""
    import importlib.metadata
    import re

    try:
        return importlib.metadata.version("jax-peerless")
    except importlib.metadata.PackageNotFoundError:
        cargo = Path(__file__).resolve().parents[4] / "Cargo.toml"
        try:
            text = cargo.read_text()
            m = re.search(r'^version\s*=\s*"([^"]+)"', text[text.index("[workspace.package]"):], re.M)
            return m.group(1) if m else "unknown"
        except (OSError, ValueError):
            return "unknown"


__version__ = _version()

# The inner platform ("cpu", "cuda", "rocm") when the "peerless" backend wraps XLA's plugin.
_wrapped_platform: str | None = None

# XLA's GPU plugins as JAX installs them: Peerless platform -> (packages, library file).
# jax-rocm7-pjrt 0.12.0 installs `jax_plugins.xla_rocm7` with `xla_rocm_plugin.so` (read from
# its wheel), registered by JAX as platform "rocm" with XLA platform name "ROCM".
_XLA_GPU_PLUGINS = {
    "cuda": (("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"), "xla_cuda_plugin.so"),
    "rocm": (("jax_plugins.xla_rocm7",), "xla_rocm_plugin.so"),
}


def library_path() -> str:
    """Path of the plugin library; raises if there is none."""
    env = os.environ.get("PEERLESS_PJRT_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"PEERLESS_PJRT_LIBRARY={env} does not exist")
        return env
    bundled = Path(__file__).resolve().parent / _LIB
    if bundled.is_file():
        return str(bundled)
    raise FileNotFoundError(
        f"no {_LIB}: install with `pip install ./plugin/python` from a Peerless checkout "
        "or set PEERLESS_PJRT_LIBRARY"
    )


def _gpus_usable() -> bool:
    """At least one CUDA device this process may use (the driver answers; no GPU is opened)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0
    except OSError:
        return False


def _amd_gpus_usable() -> bool:
    """At least one AMD GPU, as JAX's ROCm plugin counts them (the KFD driver's topology; HIP
    is not initialised here)."""
    try:
        from jax._src import hardware_utils

        return hardware_utils.num_available_amd_gpus(stop_at=1) > 0
    except Exception:  # noqa: BLE001 - an older JAX, or no driver
        return False


def _installed_plugin(module: str, filename: str) -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    for d in (spec.submodule_search_locations or []) if spec else []:
        p = os.path.join(d, filename)
        if os.path.isfile(p):
            return p
    return None


def _jax_gpu_plugin(platform: str) -> str | None:
    """The library of JAX's own XLA plugin package for GPU `platform`, if installed."""
    modules, filename = _XLA_GPU_PLUGINS[platform]
    for module in modules:
        path = _installed_plugin(module, filename)
        if path:
            return path
    return None


def wrapped() -> str | None:
    """The inner platform ("cpu", "cuda", "rocm") when this process's "peerless" backend wraps XLA's
    plugin, else None (none registered)."""
    return _wrapped_platform


_INSTALL = ("install XLA's plugin: jax[cuda13] on GPUs, or `pip install --no-deps lammps-jax-pjrt-cpu==0.11.2` "
            "(XLA's CPU plugin; built for jax 0.11.2, it loads under jax 0.12 too, which its declared "
            "jax<=0.11.2 would refuse without --no-deps); or name one with PEERLESS_XLA_PLUGIN=/path/to/plugin.so")


def inner_plugin() -> tuple[str, str] | None:
    """(path, platform) of XLA's PJRT plugin that `JAX_PLATFORMS=peerless` wraps, or None when
    there is none (or PEERLESS_XLA_PLUGIN=none). In order: PEERLESS_XLA_PLUGIN (a path); on a
    machine with a usable NVIDIA GPU (unless PEERLESS_BACKEND=host) the installed
    jax-cuda13-pjrt / jax-cuda12-pjrt plugin; on one with an AMD GPU the installed
    jax-rocm7-pjrt plugin; else XLA's CPU plugin from `lammps-jax-pjrt-cpu`.
    PEERLESS_BACKEND=cuda (rocm) insists on the CUDA (ROCm) plugin, =host (or cpu) on the CPU
    one."""
    env = os.environ.get("PEERLESS_XLA_PLUGIN", "")
    if env in ("none", "standalone"):
        return None
    if env:
        name = os.path.basename(env)
        platform = os.environ.get("PEERLESS_XLA_PLATFORM") or (
            "cuda" if "cuda" in name else "rocm" if "rocm" in name else "cpu")
        return env, platform
    backend = os.environ.get("PEERLESS_BACKEND", "")
    if backend not in ("", "host", "cpu", "cuda", "rocm"):
        return None
    usable = {"cuda": _gpus_usable, "rocm": _amd_gpus_usable}
    for platform in ("cuda", "rocm"):
        if backend in ("", platform):
            path = _jax_gpu_plugin(platform)
            if path and (backend == platform or usable[platform]()):
                return path, platform
    if backend in ("cuda", "rocm"):
        return None
    try:
        import lammps_jax_pjrt_cpu

        return str(lammps_jax_pjrt_cpu.PLUGIN_PATH), "cpu"
    except ImportError:
        return None


def _unavailable_reason() -> str:
    """Why `inner_plugin()` found nothing, naming what to install."""
    backend = os.environ.get("PEERLESS_BACKEND", "")
    if backend not in ("", "host", "cpu", "cuda", "rocm"):
        return f"peerless: PEERLESS_BACKEND={backend} is not a backend (host, cpu, cuda or rocm)"
    if backend == "cuda":
        return ("peerless: PEERLESS_BACKEND=cuda wraps XLA's CUDA plugin, and jax-cuda13-pjrt / jax-cuda12-pjrt "
                "is not installed: pip install 'jax[cuda13]'")
    if backend == "rocm":
        return ("peerless: PEERLESS_BACKEND=rocm wraps XLA's ROCm plugin, and jax-rocm7-pjrt is not installed: "
                "pip install 'jax[rocm7-local]' (and a libpeerless_pjrt.so built with --features rocm)")
    return f"peerless: JAX_PLATFORMS=peerless runs inside XLA's own PJRT plugin, and none is installed: {_INSTALL}"


def _named_by_jax_platforms() -> bool:
    """JAX_PLATFORMS (or `jax.config.update("jax_platforms", ...)`) names "peerless"."""
    try:
        import jax

        value = jax.config.jax_platforms or ""
    except Exception:
        value = os.environ.get("JAX_PLATFORMS", "")
    return PLATFORM in [p.strip() for p in value.split(",")]


def initialize() -> None:
    """JAX calls this while it discovers plugins. Nothing asked of Peerless, nothing happens:
    the "peerless" platform exists only when JAX_PLATFORMS names it (on CPU as on GPUs, so
    installing the package never changes JAX's default platform). An exception here is what
    JAX logs once, with its message, as a plugin configuration error."""
    from jax._src import xla_bridge

    enable = os.environ.get("PEERLESS_ENABLE", "") not in ("", "0")
    named = _named_by_jax_platforms()
    if not enable and not named:
        return
    try:
        path = library_path()
    except FileNotFoundError as e:
        asked = "PEERLESS_ENABLE=1" if enable else "JAX_PLATFORMS=peerless"
        raise FileNotFoundError(f"peerless: {asked} is set, but {e}; Peerless is off in this process") from None
    if enable:
        # Peerless inside XLA for users who change no code (see inside.py); bad flags raise.
        from . import inside

        inside.enable_at_start()
    if not named:
        return
    inner = inner_plugin()
    if inner is not None:
        _register_wrapper(xla_bridge, path, *inner)
        return
    if os.environ.get("PEERLESS_XLA_PLUGIN", "") in ("none", "standalone"):
        return
    # JAX_PLATFORMS=peerless with no XLA plugin: register the library anyway, telling it why,
    # so that client creation fails with that reason (plugin/src/wrap.rs's table of errors).
    why = _unavailable_reason()
    logging.getLogger(__name__).error("%s", why)
    saved = os.environ.get("PEERLESS_XLA_UNAVAILABLE")
    os.environ["PEERLESS_XLA_UNAVAILABLE"] = why
    try:
        xla_bridge.register_plugin(PLATFORM, priority=400, library_path=path)
    except Exception as e:  # a second initialize() in one process
        if "ALREADY_EXISTS" not in str(e) and "already" not in str(e).lower():
            raise
    finally:
        if saved is None:
            os.environ.pop("PEERLESS_XLA_UNAVAILABLE", None)
        else:
            os.environ["PEERLESS_XLA_UNAVAILABLE"] = saved


def _register_wrapper(xla_bridge, path: str, inner: str, platform: str) -> None:
    """`JAX_PLATFORMS=peerless` as XLA's plugin `inner` plus Peerless (plugin/src/wrap.rs):
    the library reads PEERLESS_XLA_PLUGIN when JAX loads it, registers its handlers in that
    plugin and returns its table. The pass goes on at once (PEERLESS_ENABLE=0 leaves it off)."""
    if platform in _XLA_GPU_PLUGINS:
        from jaxlib import xla_client

        # What JAX's own GPU plugin is created with (allocator, memory fraction, ...); XLA's
        # ROCm plugin also takes its platform's name, as jax_plugins.xla_rocm7 passes it.
        options = dict(xla_client.generate_pjrt_gpu_plugin_options())
        if platform == "rocm":
            options["platform_name"] = "ROCM"
    else:
        # XLA's CPU plugin takes its device count as a create option (the CUDA one rejects it).
        n = os.environ.get("PEERLESS_HOST_DEVICES") or os.environ.get("PEERLESS_NUM_DEVICES") or "8"
        options = {"cpu_device_count": int(n)}
    # The library reads these when JAX loads it (in register_plugin); they are put back after,
    # so child processes choose for themselves.
    # Handlers: the PJRT FFI extension registers execute-only ones (no per-executable state);
    # where the inner plugin is JAX's own GPU plugin package (CUDA or ROCm), JAX reaches its
    # GPU extension, which takes the whole bundle (instantiate / initialize / execute), so we
    # register here.
    jax_gpu = platform in _XLA_GPU_PLUGINS and _jax_gpu_plugin(platform) == inner
    keys = ("PEERLESS_XLA_PLUGIN", "PEERLESS_XLA_PLATFORM", "PEERLESS_XLA_HANDLERS")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(PEERLESS_XLA_PLUGIN=inner, PEERLESS_XLA_PLATFORM=platform,
                      PEERLESS_XLA_HANDLERS="python" if jax_gpu else "rust")
    try:
        c_api = xla_bridge.register_plugin(PLATFORM, priority=400, library_path=path, options=options)
    except Exception as e:  # a second initialize() in one process
        if "ALREADY_EXISTS" not in str(e) and "already" not in str(e).lower():
            raise
        return
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    global _wrapped_platform
    _wrapped_platform = platform
    from . import inside

    # With this package loaded, the pass is its to register (`enable()` / `disable()`,
    # PEERLESS_ENABLE=0, the job's topology): the wrapper's client creation, which registers it
    # for clients without the package, must leave it alone, whether or not it goes on here.
    if c_api is not None:
        inside._dll().PeerlessXlaPassFromPython()
    if jax_gpu:
        inside._register_targets(platform)  # JAX holds it until its GPU plugin is initialised
    # The pass goes on where the platform will be used: JAX_PLATFORMS names it, or is unset
    # (the highest priority platform, this one, is the default).
    wanted = os.environ.get("JAX_PLATFORMS", "")
    used = not wanted or PLATFORM in [p.strip() for p in wanted.split(",")]
    if os.environ.get("PEERLESS_ENABLE", "") != "0" and c_api is not None and used:
        inside.enable_wrapped_at_start(c_api, platform)
