"""JAX plugin for Peerless.

Two ways in: inside XLA (`enable()` / `PEERLESS_ENABLE=1`: XLA compiles and runs the
program, Peerless runs the collectives it takes; see inside.py), and the standalone PJRT
platform `JAX_PLATFORMS=peerless` described below.

JAX imports every `jax_plugins.*` module and calls `initialize()`. We register the PJRT
plugin library and hand it an MLIR → HLO converter (jaxlib's own), since the plugin
compiles HloModuleProtos and JAX sends StableHLO.

The library is, in order: $PEERLESS_PJRT_LIBRARY, or the libpeerless_pjrt.so bundled in
this package. The plugin itself reads its settings from the environment when JAX creates the
client: PEERLESS_BACKEND (host | cuda; default host), PEERLESS_HOST_DEVICES (host backend
device count, default 8; PEERLESS_NUM_DEVICES is an alias), PEERLESS_FLAGS (collective
flags, see `peerless flags`). JAX's `jax_pjrt_client_create_options` may also pass
`num_devices:N;peerless_flags:...`.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .inside import decisions, disable, enable, enabled, handler_calls, reset_stats, stats  # noqa: F401  (public API)

PLATFORM = "peerless"
_LIB = "libpeerless_pjrt.so"

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


def initialize() -> None:
    from jax._src import xla_bridge

    path = library_path()
    if os.environ.get("PEERLESS_ENABLE", "") not in ("", "0"):
        # Peerless inside XLA for users who change no code (see inside.py).
        from . import inside

        inside.enable_at_start()
    # The plugin claims PJRT C API 0.54 (the header we build against); jaxlib accepts an
    # older minor (>= its kMinPjRtMinor, 29 in jaxlib 0.10.2) only in compatibility mode.
    os.environ.setdefault("ENABLE_PJRT_COMPATIBILITY", "1")
    # The same library is dlopen'ed by ctypes and by XLA; dlopen returns one handle, so the
    # converter registered here is the one the plugin's Compile sees.
    _register_converter(path)
    options = None
    inner = os.environ.get("PEERLESS_XLA_PLUGIN", "")
    inner_platform = os.environ.get("PEERLESS_XLA_PLATFORM") or ("cuda" if "cuda" in os.path.basename(inner) else "cpu")
    if inner and inner_platform == "cpu":
        # The library wraps XLA's own plugin (plugin/src/wrap.rs, which tells CPU from CUDA
        # the same way): XLA compiles and runs everything, and the inner CPU plugin takes its
        # device count as a create option (the CUDA plugin rejects it).
        options = {"cpu_device_count": int(os.environ.get("PEERLESS_HOST_DEVICES", "8"))}
    try:
        xla_bridge.register_plugin(PLATFORM, priority=400, library_path=path, options=options)
    except Exception as e:  # a second initialize() in one process
        if "ALREADY_EXISTS" not in str(e) and "already" not in str(e).lower():
            raise
