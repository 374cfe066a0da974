"""`JAX_PLATFORMS=peerless` as a wrapper of XLA's own PJRT plugin.

libpeerless_pjrt.so with PEERLESS_XLA_PLUGIN naming XLA's CPU plugin (the PyPI build
`lammps-jax-pjrt-cpu`, PJRT 0.115 like jax 0.11.2): XLA compiles, partitions and runs every
program; Peerless's pass rewrites the collectives and its handlers run them. Each program runs
on the "peerless" backend with Peerless enabled and on JAX's own CPU backend (the oracle), in
one process (8 devices each); ints exactly, floats to tolerance.

Run alone (it sets the environment before JAX starts), as scripts/test.sh does:
    PEERLESS_PJRT_LIBRARY=... PYTHONPATH=plugin/python python -m pytest -q plugin/tests/test_wrap.py
"""

import os

import pytest

try:
    import lammps_jax_pjrt_cpu as _inner
except ImportError:  # CI installs it (plugin/requirements.txt): never skip there
    if os.environ.get("CI"):
        raise
    pytest.skip("lammps-jax-pjrt-cpu (XLA's CPU plugin) is not installed", allow_module_level=True)

os.environ["PEERLESS_XLA_PLUGIN"] = str(_inner.PLUGIN_PATH)
os.environ["PEERLESS_HOST_DEVICES"] = "8"
# Peerless's handlers are under test: the shipped XLA:CPU tuning profile would leave
# some of these collectives to XLA.
os.environ.setdefault("PEERLESS_TUNING_PROFILE", "0")
os.environ["JAX_PLATFORMS"] = "peerless,cpu"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless as peerless  # noqa: E402
from jax_plugins.peerless import inside  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def enabled():
    assert peerless.enable(["peerless"]) == ["peerless"]
    yield
    peerless.disable(["peerless"])


def meshes():
    return {b: Mesh(np.array(jax.devices(b)), ("x",)) for b in ("peerless", "cpu")}


def check(got, want, dtype):
    got, want = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    if np.issubdtype(np.dtype(dtype), np.integer):
        np.testing.assert_array_equal(got, want)
    else:
        tol = {"bfloat16": 2e-2, "float16": 2e-3}.get(str(dtype), 1e-5)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_the_backend_is_xlas_cpu_plugin():
    devs = jax.devices("peerless")
    assert len(devs) == 8 and devs[0].platform == "cpu"


SHARD_MAP = {
    "psum": lambda x: jax.lax.psum(x, "x"),
    "pmax": lambda x: jax.lax.pmax(x, "x"),
    "all_gather": lambda x: jax.lax.all_gather(x, "x", axis=1, tiled=True),
    "psum_scatter": lambda x: jax.lax.psum_scatter(x, "x", scatter_dimension=1, tiled=True),
    "all_to_all": lambda x: jax.lax.all_to_all(x, "x", 1, 1, tiled=True),
    "ppermute": lambda x: jax.lax.ppermute(x, "x", [(i, (i + 3) % 8) for i in range(8)]),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("name", sorted(SHARD_MAP))
def test_shard_map_collectives_agree_with_jax_cpu(name, dtype):
    rng = np.random.default_rng(len(name))
    host = rng.integers(-9, 10, (8, 64)) if dtype == "int32" else rng.standard_normal((8, 64))
    out = {}
    calls = inside.handler_calls("cpu")
    for backend, mesh in meshes().items():
        x = jax.device_put(jnp.asarray(host, dtype=dtype), NamedSharding(mesh, P("x")))
        f = jax.jit(jax.shard_map(SHARD_MAP[name], mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
        out[backend] = f(x)
    check(out["peerless"], out["cpu"], dtype)
    assert inside.handler_calls("cpu") >= calls + 8, "the collective did not run on Peerless's handlers"


def test_auto_partitioned_jit_agrees_and_runs_on_peerless():
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((64, 256)).astype(np.float32), rng.standard_normal((256, 32)).astype(np.float32)
    y = rng.standard_normal((64, 32)).astype(np.float32)

    def loss(w, a, y):
        return jnp.mean((jnp.tanh(a @ w) - y) ** 2)

    def step(w, a, y):
        return w - 0.1 * jax.grad(loss)(w, a, y)

    out = {}
    inside.reset_stats()
    for backend, mesh in meshes().items():
        put = lambda v, *spec: jax.device_put(v, NamedSharding(mesh, P(*spec)))  # noqa: E731
        tp = jax.jit(lambda a, w: a @ w, out_shardings=NamedSharding(mesh, P()))(put(a, None, "x"), put(w, "x", None))
        dp = jax.jit(step)(put(w), put(a, "x"), put(y, "x"))
        out[backend] = (tp, dp)
    for g, want in zip(out["peerless"], out["cpu"]):
        check(g, want, "float32")
    s = inside.stats()
    assert s.get("all-reduce", {}).get("kernel", 0) >= 2, s


def test_the_pass_is_registered_once_by_the_package_not_also_by_the_wrapper():
    """Under JAX the package owns the pass (topology, stats); the wrapper's client creation,
    which registers it for clients without the package, must not add a second copy. With the
    package's pass told to leave psum to XLA, a second (wrapper) pass would take it."""
    mesh = meshes()["peerless"]
    x = jax.device_put(jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16), NamedSharding(mesh, P("x")))
    peerless.enable(["peerless"], flags="--all_reduce_backend=fallback")
    try:
        calls = inside.handler_calls("cpu")
        f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v * 3.0, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x")))
        np.testing.assert_allclose(np.asarray(f(x)), np.tile(np.asarray(x).reshape(8, 16).sum(0) * 3.0, (8, 1)))
        assert inside.handler_calls("cpu") == calls, "a second copy of the pass took the psum"
    finally:
        peerless.enable(["peerless"], flags="")


CREATE_OPTION_PROBE = """
import os, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax_plugins.peerless import inside
try:
    mesh = Mesh(np.array(jax.devices("peerless")), ("x",))
except Exception as e:
    print("ERROR", e)
    raise SystemExit(0)
x = jax.device_put(jnp.ones((8, 16), jnp.float32), NamedSharding(mesh, P("x")))
f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x")))
assert float(f(x)[0, 0]) == 8.0
print("CALLS", inside.handler_calls("cpu"))
"""


@pytest.mark.parametrize("flags, want", [("", "kernel"), ("--all_reduce_backend=fallback", "CALLS 0"),
                                         ("--bogus_flag=1", "bogus_flag")])
def test_peerless_flags_as_a_client_create_option(flags, want):
    """`peerless_flags` among the client's create options (JAX: jax_pjrt_client_create_options)
    sets Peerless's flags for the process and is taken out before XLA sees the options; a bad
    flag fails client creation, naming it."""
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="peerless")
    if flags:
        env["JAX_PJRT_CLIENT_CREATE_OPTIONS"] = f"peerless_flags:{flags}"
    p = subprocess.run([sys.executable, "-c", CREATE_OPTION_PROBE], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    if want == "kernel":  # the default flags: the psum ran on Peerless's handlers
        assert "CALLS" in p.stdout and p.stdout.split("CALLS")[1].split()[0] != "0", p.stdout + p.stderr[-3000:]
    else:
        assert want in p.stdout, p.stdout + p.stderr[-3000:]


def test_peerless_enable_0_leaves_the_pass_off_on_the_wrapped_platform():
    """PEERLESS_ENABLE=0 is the wrapper without the pass: the package then registers no
    pass, and the wrapper's client creation must not register one in its stead (it does only
    for clients without the package)."""
    import subprocess
    import sys

    env = dict(os.environ, JAX_PLATFORMS="peerless", PEERLESS_ENABLE="0")
    p = subprocess.run([sys.executable, "-c", CREATE_OPTION_PROBE], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "CALLS 0" in p.stdout, p.stdout + p.stderr[-3000:]
