"""Collective faults through JAX: a device that fails before a collective, or never arrives
at it, ends the call with a Python exception that names the injected fault or the collective
and the missing ranks; the same client then runs new programs correctly.

The fault is injected by the plugin's test hook PEERLESS_TEST_FAULT (`fail:<device>` or
`withhold:<device>`), read when a program is compiled, so each case compiles its own
function. Execution is synchronous on the host backend: the error comes back from Execute
itself, so JAX raises it at the call, for all devices at once.

Run (from the repository root), in its own process (it sets PEERLESS_FLAGS):
    cargo build -p peerless-pjrt
    PEERLESS_PJRT_LIBRARY=$CARGO_TARGET_DIR/debug/libpeerless_pjrt.so \
      PYTHONPATH=plugin/python python3 -m pytest -q plugin/tests/test_faults.py
"""

import os
import time

# Short collective timeouts, so a withheld rank fails fast; set before the client exists.
os.environ["PEERLESS_FLAGS"] = "--collective_timeout_ms=300"
os.environ.setdefault("JAX_PLATFORMS", "peerless,cpu")
os.environ.pop("PEERLESS_TEST_FAULT", None)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless  # noqa: E402, F401

K = 4


def psum_program(scale):
    """A fresh jit(shard_map(psum)) over K peerless devices (a new compile each call)."""
    mesh = Mesh(np.array(jax.devices("peerless")[:K]), ("x",))
    f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a * scale, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))
    x = jax.device_put(jnp.arange(K * 3, dtype=jnp.float32).reshape(K, 3), NamedSharding(mesh, P("x")))
    want = (np.arange(K * 3, dtype=np.float32).reshape(K, 3) * scale).sum(axis=0, keepdims=True)
    return f, x, want


def with_fault(spec, scale):
    os.environ["PEERLESS_TEST_FAULT"] = spec
    try:
        f, x, want = psum_program(scale)
        f.lower(x).compile()  # compile while the fault is set
    finally:
        del os.environ["PEERLESS_TEST_FAULT"]
    return f, x, want


def check_recovers(scale):
    f, x, want = psum_program(scale)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(f(x)), want)


def test_a_device_failing_before_a_collective_raises():
    f, x, _ = with_fault("fail:2", 2.0)
    with pytest.raises(Exception) as info:
        jax.block_until_ready(f(x))
    text = str(info.value)
    assert "injected fault: device 2 failed before collective" in text, text
    check_recovers(3.0)


def test_a_withheld_rank_times_out_and_names_the_missing_rank():
    f, x, _ = with_fault("withhold:1", 5.0)
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        jax.block_until_ready(f(x))
    took = time.monotonic() - start
    text = str(info.value)
    assert "timed out after 300 ms" in text and "waiting for ranks [1]" in text, text
    assert took < 10, took
    check_recovers(7.0)


def test_a_faulted_executable_fails_every_time_and_the_client_stays_usable():
    f, x, _ = with_fault("fail:0", 11.0)
    for _ in range(3):
        with pytest.raises(Exception):
            jax.block_until_ready(f(x))
        check_recovers(13.0)
