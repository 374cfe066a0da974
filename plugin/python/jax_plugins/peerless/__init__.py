"""JAX plugin for Peerless.

Two ways in: inside XLA (`enable()` / `PEERLESS_ENABLE=1`: XLA compiles and runs the
program, Peerless runs the collectives it takes; see inside.py), and the standalone PJRT
platform `JAX_PLATFORMS=peerless` described below.

JAX imports every `jax_plugins.*` module and calls `initialize()`. We register the PJRT
plugin library and hand it an MLIR → HLO converter (jaxlib's own), since the plugin
compiles HloModuleProtos and JAX sends StableHLO.

The library is, in order: $PEERLESS_PJRT_LIBRARY, or the libpeerless_pjrt.so bundled in
this package.

`JAX_PLATFORMS=peerless` is XLA's own PJRT plugin plus Peerless (`inner_plugin()` says which
plugin: jax-cuda13/12-pjrt's where a GPU is usable, else XLA's CPU plugin from
`lammps-jax-pjrt-cpu`): XLA compiles, partitions and runs everything and Peerless's pass and
handlers take the collectives. PEERLESS_HOST_DEVICES (default 8) sets the CPU device count,
PEERLESS_FLAGS the collective flags (`peerless flags`), `compiler_options` per executable.
With PEERLESS_XLA_PLUGIN=standalone (or no inner plugin installed) the older standalone
platform answers instead: a separate compiler over the host backend, configured by
PEERLESS_BACKEND (host | cuda), PEERLESS_HOST_DEVICES and PEERLESS_FLAGS.
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

# The inner platform ("cpu", "cuda") when the "peerless" backend wraps XLA's plugin.
_wrapped_platform: str | None = None

# Keep ctypes callbacks alive for the life of the process.
_converter = None
_dll = None

_SINK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
_CONVERTER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, _SINK, ctypes.c_void_p, ctypes.c_size_t)


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


def mlir_to_hlo(mlir: bytes) -> bytes:
    """StableHLO (bytecode or text) → serialized HloModuleProto, with jaxlib's converter."""
    from jax._src.lib import _jax

    comp = _jax.mlir.mlir_module_to_xla_computation(mlir, use_tuple_args=False, return_tuple=False)
    return comp.as_serialized_hlo_module_proto()


def _convert(code, size, sink, sink_ctx, _ctx):
    try:
        out = mlir_to_hlo(ctypes.string_at(code, size))
        sink(sink_ctx, out, len(out))
        return 0
    except BaseException as e:  # never let an exception unwind into Rust
        msg = f"{type(e).__name__}: {e}".encode("utf-8", "replace")
        sink(sink_ctx, msg, len(msg))
        return 1


def _register_converter(path: str) -> None:
    global _converter, _dll
    _dll = ctypes.CDLL(path)
    _dll.PeerlessRegisterMlirConverter.argtypes = [_CONVERTER, ctypes.c_size_t]
    _dll.PeerlessRegisterMlirConverter.restype = ctypes.c_int
    _converter = _CONVERTER(_convert)
    _dll.PeerlessRegisterMlirConverter(_converter, 0)


def _gpus_usable() -> bool:
    """At least one CUDA device this process may use (the driver answers; no GPU is opened)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0
    except OSError:
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


def wrapped() -> str | None:
    """The inner platform ("cpu", "cuda") when this process's "peerless" backend wraps XLA's
    plugin, else None (the standalone platform, or none registered)."""
    return _wrapped_platform


def inner_plugin() -> tuple[str, str] | None:
    """(path, platform) of XLA's PJRT plugin that `JAX_PLATFORMS=peerless` wraps, or None for
    the standalone platform. In order: PEERLESS_XLA_PLUGIN (a path; "standalone" for the older
    standalone platform); on a machine with a usable GPU (unless PEERLESS_BACKEND=host) the
    installed jax-cuda13-pjrt / jax-cuda12-pjrt plugin; else XLA's CPU plugin from
    `lammps-jax-pjrt-cpu`. PEERLESS_BACKEND=cuda insists on the CUDA plugin, =host (or cpu)
    on the CPU one."""
    env = os.environ.get("PEERLESS_XLA_PLUGIN", "")
    if env == "standalone":
        return None
    if env:
        platform = os.environ.get("PEERLESS_XLA_PLATFORM") or ("cuda" if "cuda" in os.path.basename(env) else "cpu")
        return env, platform
    backend = os.environ.get("PEERLESS_BACKEND", "")
    if backend not in ("", "host", "cpu", "cuda"):
        return None  # the standalone platform's client creation names the bad value
    if backend not in ("host", "cpu"):
        for module in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
            path = _installed_plugin(module, "xla_cuda_plugin.so")
            if path and (backend == "cuda" or _gpus_usable()):
                return path, "cuda"
        if backend == "cuda":
            return None  # the standalone platform names what is missing at client creation
    try:
        import lammps_jax_pjrt_cpu

        return str(lammps_jax_pjrt_cpu.PLUGIN_PATH), "cpu"
    except ImportError:
        if PLATFORM in [p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",")]:
            logging.getLogger(__name__).warning(
                "JAX_PLATFORMS=peerless wraps XLA's CPU plugin from lammps-jax-pjrt-cpu, which is not "
                "installed; the older standalone platform answers instead. Install it with "
                "`pip install --no-deps lammps-jax-pjrt-cpu==0.11.2` (built for jax 0.11.2; it loads under "
                "jax 0.12 too, which its declared jax<=0.11.2 would refuse without --no-deps).")
        return None


def initialize() -> None:
    from jax._src import xla_bridge

    path = library_path()
    if os.environ.get("PEERLESS_ENABLE", "") not in ("", "0"):
        # Peerless inside XLA for users who change no code (see inside.py).
        from . import inside

        inside.enable_at_start()
    inner = inner_plugin()
    if inner is not None:
        _register_wrapper(xla_bridge, path, *inner)
        return
    # The standalone platform claims PJRT C API 0.54 (the header we build against); jaxlib
    # accepts an older minor (>= its kMinPjRtMinor) only in compatibility mode.
    os.environ.setdefault("ENABLE_PJRT_COMPATIBILITY", "1")
    # The same library is dlopen'ed by ctypes and by XLA; dlopen returns one handle, so the
    # converter registered here is the one the plugin's Compile sees.
    _register_converter(path)
    try:
        xla_bridge.register_plugin(PLATFORM, priority=400, library_path=path)
    except Exception as e:  # a second initialize() in one process
        if "ALREADY_EXISTS" not in str(e) and "already" not in str(e).lower():
            raise


def _register_wrapper(xla_bridge, path: str, inner: str, platform: str) -> None:
    """`JAX_PLATFORMS=peerless` as XLA's plugin `inner` plus Peerless (plugin/src/wrap.rs):
    the library reads PEERLESS_XLA_PLUGIN when JAX loads it, registers its handlers in that
    plugin and returns its table. The pass goes on at once (PEERLESS_ENABLE=0 leaves it off)."""
    if platform == "cuda":
        jax_platforms = os.environ.get("JAX_PLATFORMS", "")
        if PLATFORM not in [p.strip() for p in jax_platforms.split(",")]:
            # A second XLA GPU client beside JAX's own "cuda" would claim the GPUs' memory too:
            # on GPUs the wrapper is there only when asked for by name.
            return
        from jaxlib import xla_client

        # What JAX's own CUDA plugin is created with (allocator, memory fraction, ...).
        options = dict(xla_client.generate_pjrt_gpu_plugin_options())
    else:
        # XLA's CPU plugin takes its device count as a create option (the CUDA one rejects it).
        n = os.environ.get("PEERLESS_HOST_DEVICES") or os.environ.get("PEERLESS_NUM_DEVICES") or "8"
        options = {"cpu_device_count": int(n)}
    # The library reads these when JAX loads it (in register_plugin); they are put back after,
    # so child processes choose for themselves.
    # Handlers: the PJRT FFI extension registers execute-only ones (no per-executable state);
    # where the inner plugin is JAX's own CUDA plugin package, JAX reaches its GPU extension,
    # which takes the whole bundle (instantiate / initialize / execute), so we register here.
    jax_cuda = platform == "cuda" and any(
        _installed_plugin(m, "xla_cuda_plugin.so") == inner for m in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"))
    keys = ("PEERLESS_XLA_PLUGIN", "PEERLESS_XLA_PLATFORM", "PEERLESS_XLA_HANDLERS")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(PEERLESS_XLA_PLUGIN=inner, PEERLESS_XLA_PLATFORM=platform,
                      PEERLESS_XLA_HANDLERS="python" if jax_cuda else "rust")
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
    if jax_cuda:
        inside._register_targets("cuda")  # JAX holds it until its CUDA plugin is initialised
    # The pass goes on where the platform will be used: JAX_PLATFORMS names it, or is unset
    # (the highest priority platform, this one, is the default).
    wanted = os.environ.get("JAX_PLATFORMS", "")
    used = not wanted or PLATFORM in [p.strip() for p in wanted.split(",")]
    if os.environ.get("PEERLESS_ENABLE", "") != "0" and c_api is not None and used:
        inside.enable_wrapped_at_start(c_api, platform)
