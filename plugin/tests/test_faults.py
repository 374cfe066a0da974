"""Collective faults through JAX: a device that fails before a collective, or never arrives
at it, ends the call with a Python exception that names the injected fault or the collective
and the missing ranks; the same client then runs new programs correctly.

The fault is injected by the plugin's test hook PEERLESS_TEST_FAULT (`fail:<device>` or
`withhold:<device>`, plugin/src/runtime.rs), read when a program is compiled, so each case
compiles its own function. Execution is synchronous on both backends: the error comes back
from Execute itself, so JAX raises it at the call, for every device at once (the PJRT header:
when Execute returns an error, no completion event is populated; plugin/tests/faults.rs checks
that at the C API).

Backends: the host backend (8 simulated devices by default) and the cuda backend (one device
per GPU; PEERLESS_BACKEND=cuda, run by scripts/gpu_check.sh's `faults` step). A case that
needs more devices than the backend has is skipped, and pytest reports it as skipped. The
cuda executor injects faults on its kernel path only, so fault cases compile with
all_reduce_backend=kernel; on the cuda backend a fault in an NCCL fallback collective is an
error that says so, which test_a_fault_on_the_fallback_path checks.

Faulted programs get a 300 ms collective timeout through compiler_options (a withheld rank
fails fast); every other program runs with the client's flags.

Run (from the repository root):
    cargo build -p peerless-pjrt
    PEERLESS_PJRT_LIBRARY=$CARGO_TARGET_DIR/debug/libpeerless_pjrt.so \
      PYTHONPATH=plugin/python python3 -m pytest -q -rs plugin/tests/test_faults.py
"""

import os
import time

os.environ.setdefault("JAX_PLATFORMS", "peerless,cpu")
# The standalone platform's executor (its fault hook); faults of Peerless inside XLA (handler
# errors, a rank that never arrives) are test_xla_inside.py's.
os.environ.setdefault("PEERLESS_XLA_PLUGIN", "standalone")
os.environ.pop("PEERLESS_TEST_FAULT", None)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless  # noqa: E402, F401

TIMEOUT_MS = 300


def _backend():
    version = jax.devices("peerless")[0].client.platform_version  # "peerless 0.1.0 (cuda backend)"
    for name in ("cuda", "host"):
        if f"({name} backend)" in version:
            return name
    raise AssertionError(f"unknown peerless backend: {version}")


BACKEND = _backend()
NUM_DEVICES = len(jax.devices("peerless"))


def need(k):
    if k > NUM_DEVICES:
        pytest.skip(f"needs {k} devices; the {BACKEND} backend has {NUM_DEVICES}")


def psum_program(k, scale):
    """A fresh jit(shard_map(psum)) over k peerless devices (a new compile each call)."""
    mesh = Mesh(np.array(jax.devices("peerless")[:k]), ("x",))
    f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a * scale, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))
    x = jax.device_put(jnp.arange(k * 3, dtype=jnp.float32).reshape(k, 3), NamedSharding(mesh, P("x")))
    want = (np.arange(k * 3, dtype=np.float32).reshape(k, 3) * scale).sum(axis=0, keepdims=True)
    return f, x, want


def with_fault(spec, k, scale, path="kernel"):
    """The psum program compiled with fault `spec` on the given all-reduce path; returns the
    compiled executable and its argument."""
    os.environ["PEERLESS_TEST_FAULT"] = spec
    try:
        f, x, _ = psum_program(k, scale)
        options = {"all_reduce_backend": path, "collective_timeout_ms": str(TIMEOUT_MS)}
        compiled = f.lower(x).compile(compiler_options=options)  # compiled while the fault is set
    finally:
        del os.environ["PEERLESS_TEST_FAULT"]
    return compiled, x


def failure_text(d):
    """What the error of `fail:<d>` says on this backend."""
    if BACKEND == "cuda":  # "device 2: thunk #1 all-reduce '...' failed: injected failure before all-reduce '...'"
        return [f"device {d}: thunk", "injected failure before"]
    return [f"injected fault: device {d} failed before collective"]


def timeout_text(d):
    """What the error of `withhold:<d>` says on this backend."""
    if BACKEND == "cuda":  # "... timed out after 300 ms on device 0 waiting for device 1"
        return [f"timed out after {TIMEOUT_MS} ms", f"waiting for device {d}"]
    return [f"timed out after {TIMEOUT_MS} ms", f"waiting for ranks [{d}]"]


def raises_with(call, needles):
    with pytest.raises(Exception) as info:
        jax.block_until_ready(call())
    text = str(info.value)
    for n in needles:
        assert n in text, text
    return text


def check_recovers(k, scale):
    f, x, want = psum_program(k, scale)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(x)), want)


@pytest.mark.parametrize("k,d", [(2, 1), (4, 2), (8, 7)], ids=["2dev-fail1", "4dev-fail2", "8dev-fail7"])
def test_a_device_failing_before_a_collective_raises(k, d):
    need(k)
    g, x = with_fault(f"fail:{d}", k, 2.0)
    raises_with(lambda: g(x), failure_text(d))
    check_recovers(k, 3.0)


@pytest.mark.parametrize("k,d", [(2, 0), (4, 1), (8, 5)], ids=["2dev-withhold0", "4dev-withhold1", "8dev-withhold5"])
def test_a_withheld_rank_times_out_and_names_the_missing_rank(k, d):
    need(k)
    g, x = with_fault(f"withhold:{d}", k, 5.0)
    start = time.monotonic()
    raises_with(lambda: g(x), timeout_text(d))
    took = time.monotonic() - start
    assert took < 10, took
    check_recovers(k, 7.0)


@pytest.mark.parametrize("k", [2, 4], ids=["2dev", "4dev"])
def test_a_faulted_executable_fails_every_time_and_the_client_stays_usable(k):
    need(k)
    g, x = with_fault("fail:0", k, 11.0)
    for _ in range(3):
        raises_with(lambda: g(x), failure_text(0))
        check_recovers(k, 13.0)


def test_a_fault_on_the_fallback_path():
    """Host: the fallback all-reduce fails like the kernel one. Cuda: faults are injected on the
    kernel path only, and a fault in an NCCL collective is an error that says so (NCCL has no
    timeout, so a withheld rank would hang it)."""
    need(2)
    g, x = with_fault("fail:1", 2, 17.0, path="fallback")
    if BACKEND == "cuda":
        raises_with(lambda: g(x), ["kernel path only"])
    else:
        raises_with(lambda: g(x), failure_text(1))
    check_recovers(2, 19.0)
