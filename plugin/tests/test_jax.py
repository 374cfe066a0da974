"""JAX on Peerless vs JAX's CPU backend, in one process.

Run (from the repository root):
    cargo build --release -p peerless-pjrt
    PEERLESS_PJRT_LIBRARY=$CARGO_TARGET_DIR/release/libpeerless_pjrt.so \
      PYTHONPATH=plugin/python python3.11 -m pytest -q plugin/tests/test_jax.py
(or `pip install ./plugin/python` and drop the two variables). Nothing is skipped: a
missing library is a failure.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "peerless,cpu")
os.environ.setdefault("PEERLESS_NUM_DEVICES", "8")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless as peerless  # noqa: E402


def test_library_is_found():
    assert os.path.isfile(peerless.library_path())


def test_devices():
    devs = jax.devices("peerless")
    assert len(devs) == 8
    assert [d.id for d in devs] == list(range(8))
    assert all(d.platform == "peerless" for d in devs)
    assert jax.devices()[0].platform == "peerless"


def on(platform, f, *args):
    dev = jax.devices(platform)[0]
    args = [jax.device_put(a, dev) for a in args]
    return np.asarray(jax.jit(f)(*args))


CASES = {
    "elementwise": (lambda a, b: a * b + 1.0, (np.arange(12, dtype=np.float32).reshape(3, 4),) * 2),
    "sum": (lambda a: a.sum(), (np.arange(24, dtype=np.float32).reshape(2, 3, 4),)),
    "max_axis": (lambda a: a.max(axis=1), (np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32),)),
    "reshape_transpose": (lambda a: a.reshape(4, 6).T, (np.arange(24, dtype=np.float32),)),
    "int32": (lambda a: (a * 3) // 2 - a, (np.arange(10, dtype=np.int32),)),
    "bf16": (lambda a: (a * 2).astype(jnp.bfloat16), (np.linspace(-2, 2, 9, dtype=np.float32),)),
    "f16": (lambda a: jnp.tanh(a.astype(jnp.float16)), (np.linspace(-2, 2, 9, dtype=np.float32),)),
    "two_outputs": (lambda a: (a + 1, a.sum()), (np.ones(4, np.float32),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jit_one_device_matches_cpu(name):
    f, args = CASES[name]
    got = jax.tree.map(np.asarray, jax.jit(f)(*[jax.device_put(a, jax.devices("peerless")[0]) for a in args]))
    want = jax.tree.map(np.asarray, jax.jit(f)(*[jax.device_put(a, jax.devices("cpu")[0]) for a in args]))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=1e-3), got, want)


def test_repeated_calls():
    f = jax.jit(lambda a: a * 2.0)
    x = jax.device_put(np.arange(4, dtype=np.float32), jax.devices("peerless")[0])
    for _ in range(5):
        x = f(x)
    np.testing.assert_array_equal(np.asarray(x), np.arange(4, dtype=np.float32) * 32)


def test_jit_on_another_device():
    d = jax.devices("peerless")[5]
    y = jax.jit(lambda a: a + 1)(jax.device_put(np.arange(3.0, dtype=np.float32), d))
    assert y.devices() == {d}
    np.testing.assert_array_equal(np.asarray(y), [1, 2, 3])


def shard_map_on(platform, f, x, in_specs, out_specs):
    mesh = Mesh(np.array(jax.devices(platform)[:8]), ("x",))
    xs = jax.device_put(x, NamedSharding(mesh, in_specs))
    return np.asarray(jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs))(xs))


SHARD_CASES = {
    "psum": (lambda a: jax.lax.psum(a, "x"), P("x"), P("x")),
    "all_gather": (lambda a: jax.lax.all_gather(a, "x", tiled=True), P("x"), P("x")),
    "ppermute": (lambda a: jax.lax.ppermute(a, "x", [(i, (i + 1) % 8) for i in range(8)]), P("x"), P("x")),
    "psum_scatter": (lambda a: jax.lax.psum_scatter(a, "x", tiled=True), P(), P("x")),
    "psum_replicated_out": (lambda a: jax.lax.psum(a.sum(keepdims=True), "x"), P("x"), P()),
}


# Output and parameter shardings reach jaxlib through PJRT_Executable_OptimizedProgram
# (spmd_output_sharding / spmd_parameters_shardings of the returned HloModuleProto).
@pytest.mark.parametrize("name", sorted(SHARD_CASES))
def test_shard_map_8_devices_matches_cpu(name):
    f, i, o = SHARD_CASES[name]
    x = np.arange(32, dtype=np.float32)
    np.testing.assert_allclose(shard_map_on("peerless", f, x, i, o), shard_map_on("cpu", f, x, i, o))
