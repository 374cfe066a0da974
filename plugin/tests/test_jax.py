"""JAX on Peerless (`JAX_PLATFORMS=peerless`) vs JAX's CPU backend, in one process.

Every program runs twice in this process, once on Peerless devices and once on JAX's own CPU
backend, and the results are compared (exactly for integers, to a dtype-dependent tolerance
for floats). Nothing here hard-codes an expected result.

The "peerless" platform is XLA's own PJRT plugin wrapped by libpeerless_pjrt.so (in CI XLA's
CPU plugin from `lammps-jax-pjrt-cpu`, 8 devices): XLA compiles and partitions, Peerless's
pass and handlers take the collectives, and the handlers are checked to have run. XLA is
the only runtime: without an XLA plugin to wrap this module fails at import, naming what to
install.

Run (from the repository root):
    cargo build -p peerless-pjrt
    PEERLESS_PJRT_LIBRARY=$CARGO_TARGET_DIR/debug/libpeerless_pjrt.so \
      PYTHONPATH=plugin/python python3 -m pytest -q plugin/tests/test_jax.py
(or `pip install ./plugin/python` and drop the two variables). Nothing is skipped on the CI
machine: a missing library is a failure.

On a GPU machine: `PEERLESS_BACKEND=cuda` (the plugin then has one device per GPU). The mesh
sizes are parametrized by `len(jax.devices("peerless"))`: cases needing more devices than
exist are skipped, with the reason printed by `pytest -rs`.
"""

import math
import os

os.environ.setdefault("JAX_PLATFORMS", "peerless,cpu")
# JAX's CPU backend is the reference: give it as many devices as the largest mesh we build.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless as peerless  # noqa: E402
from jax_plugins.peerless import inside  # noqa: E402

PEERLESS = "peerless"
# XLA's plugin wrapped: its devices are the inner platform's ("cpu").
if peerless.inner_plugin() is None:
    raise RuntimeError("no XLA plugin to wrap: install lammps-jax-pjrt-cpu (CPU) or jax[cuda13] (GPUs)")
jax.devices()  # initialise the backends (the wrapper's state is set then)
INNER = peerless.wrapped()  # "cpu" / "cuda"
assert INNER is not None, "the peerless platform does not wrap XLA's plugin"
CPU = "cpu"
BACKEND = os.environ.get("PEERLESS_BACKEND", "host")


def num_devices():
    return len(jax.devices(PEERLESS))


def max_mesh():
    """Largest mesh both platforms can hold."""
    return min(num_devices(), len(jax.devices(CPU)))


def need(k):
    if k > max_mesh():
        pytest.skip(f"needs {k} devices; peerless has {num_devices()}, cpu {len(jax.devices(CPU))}")


DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16, "i32": jnp.int32}


def sample(shape, dtype, seed=0):
    """Values exactly representable in every tested dtype (small integers / 8 for floats,
    signed), so sums of up to 8 of them are exact in bf16 and f16 too, and every
    comparison can be exact up to reduction order."""
    rng = np.random.default_rng(seed)
    v = rng.integers(-16, 17, size=shape)
    if jnp.issubdtype(dtype, jnp.floating):
        return (v / 8.0).astype(dtype)
    return v.astype(dtype)


def assert_same(got, want, dtype=None):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if jnp.issubdtype(got.dtype, jnp.floating):
        tol = {np.dtype(jnp.bfloat16): 1e-2, np.dtype(np.float16): 1e-3}.get(got.dtype, 1e-5)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


def assert_tree_same(got, want):
    g, gt = jax.tree.flatten(got)
    w, wt = jax.tree.flatten(want)
    assert gt == wt
    for a, b in zip(g, w):
        assert_same(a, b)


# ---- the plugin and its devices -----------------------------------------------------------


def test_library_is_found():
    assert os.path.isfile(peerless.library_path())


def test_devices():
    devs = jax.devices(PEERLESS)
    want = os.environ.get("PEERLESS_HOST_DEVICES") or os.environ.get("PEERLESS_NUM_DEVICES")
    if INNER in ("cpu", None) and BACKEND == "host":
        assert len(devs) == int(want or 8)
    else:
        assert len(devs) >= 1
    assert [d.id for d in devs] == list(range(len(devs)))
    # Wrapped, the devices are the inner plugin's (XLA's CPU or GPU devices), on the "peerless" backend.
    assert all(d.platform == {"cpu": "cpu", "cuda": "gpu", None: PEERLESS}[INNER] for d in devs)
    assert len({str(d) for d in devs}) == len(devs)
    assert all(d.process_index == 0 for d in devs)
    assert jax.devices()[0] == devs[0]
    # JAX names a backend by its client's platform: wrapped, XLA's ("cpu"), lowering for it.
    assert jax.default_backend() == {"cpu": "cpu", "cuda": "gpu"}[INNER]
    assert jax.device_count() == len(devs)
    mem = devs[0].default_memory()
    assert mem.kind == "device"
    kinds = [m.kind for m in devs[-1].addressable_memories()]
    # XLA's memory spaces (host memory too).
    assert kinds[0] == "device", kinds


# ---- jit on one device -------------------------------------------------------------------


def on(platform, f, args, device_index=0):
    dev = jax.devices(platform)[device_index]
    return jax.jit(f)(*[jax.device_put(a, dev) for a in args])


def lowest(dtype):
    """The identity of max for `dtype` (max-pool's init value)."""
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


ONE_DEVICE = {
    "add_mul": lambda a, b: a * b + a,
    "sub_neg_abs": lambda a, b: jnp.abs(a - b) - (-a),
    "max_min": lambda a, b: jnp.maximum(a, b) - jnp.minimum(a, b),
    "select": lambda a, b: jnp.where(a > b, a, b),
    "compare_cast": lambda a, b: (a >= b).astype(a.dtype) + (a == b),
    "sum_all": lambda a, b: a.sum(),
    "sum_axis0": lambda a, b: a.sum(axis=0),
    "max_axis1": lambda a, b: a.max(axis=1),
    "min_keepdims": lambda a, b: a.min(axis=1, keepdims=True),
    "prod_axis1": lambda a, b: (jnp.sign(a) + 1).prod(axis=1),
    "argmax": lambda a, b: jnp.argmax(a, axis=1),
    "reshape_transpose": lambda a, b: a.reshape(4, 6).T,
    "broadcast": lambda a, b: a[:, None, :] + b[None, :, :].sum(axis=0, keepdims=True),
    "concat_slice": lambda a, b: jnp.concatenate([a[1:], b[:2]], axis=0)[:, ::2],
    "pad_rev": lambda a, b: jnp.pad(a, ((1, 0), (0, 2)))[::-1],
    "dot": lambda a, b: jnp.dot(a, b.T),
    "iota_dynamic_slice": lambda a, b: jax.lax.dynamic_slice(a, (1, 2), (2, 3)) + jnp.arange(3, dtype=a.dtype),
    "tuple_out": lambda a, b: (a + 1, a.sum(), b.reshape(-1)),
    "sort_argsort": lambda a, b: (jnp.sort(a, axis=1), jnp.argsort(b, axis=0)),
    "gather_take": lambda a, b: (jnp.take(a, jnp.array([3, 0, 2]), axis=0), a[:, jnp.array([5, 1, 1])]),
    # Control flow: while and conditional (run on the host between device steps).
    "fori_loop": lambda a, b: jax.lax.fori_loop(0, 3, lambda i, v: v * 2 - b, a),
    "while_loop": lambda a, b: jax.lax.while_loop(
        lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] + b * c[0].astype(b.dtype)), (0, a))[1],
    "cond_switch": lambda a, b: (
        jax.lax.cond(a.sum() > b.sum(), lambda x: x * 2, lambda x: x - b, a),
        jax.lax.switch((a.sum() > 0).astype(jnp.int32) + (b.sum() > 0).astype(jnp.int32),
                       [lambda x: x, lambda x: -x, lambda x: x * x], b)),
    "scan": lambda a, b: jax.lax.scan(lambda c, x: (c + x, c * x), jnp.zeros_like(a[0]), a),
    "convolve_conv2d": lambda a, b: (
        jnp.convolve(a[0], b[1]),
        jax.lax.conv_general_dilated(a[None, None], b[None, None, :3, :3], (2, 1), "SAME", rhs_dilation=(1, 2))),
    "take_along_axis": lambda a, b: jnp.take_along_axis(a, jnp.argsort(b, axis=1)[:, ::2], axis=1),
    # Scatter: repeated indices accumulate; out-of-range ones are dropped.
    "scatter_add_set": lambda a, b: (a.at[jnp.array([1, 3, 1])].add(b[0]), a.at[:, jnp.array([0, 7, 2])].set(b[:, :3]),
                                     a.at[jnp.array([[0, 5], [2, 2]])].max(b[0, 0])),
    # reduce-window: jnp.cumsum (6 terms: exact in every dtype) and a strided, padded max pool.
    "cumsum": lambda a, b: (jnp.cumsum(a[0]), jnp.cumsum(b, axis=1)),
    "max_pool": lambda a, b: jax.lax.reduce_window(a, lowest(a.dtype), jax.lax.max, (2, 3), (2, 2), "SAME"),
}
FLOAT_ONLY = {
    "tanh_exp": lambda a, b: jnp.tanh(a) + jnp.exp(b / 4),
    "mean_axis": lambda a, b: a.mean(axis=0),
    "div_sqrt": lambda a, b: a / (jnp.abs(b) + 1) + jnp.sqrt(jnp.abs(a)),
    "softmax": lambda a, b: jax.nn.softmax(a, axis=-1),
    "gelu_exact": lambda a, b: jax.nn.gelu(a, approximate=False),
    # The gradient of a max pool: select-and-scatter.
    "max_pool_grad": lambda a, b: jax.grad(lambda x: (jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (2, 3), (2, 2), "SAME") ** 2).sum())(a),
    # take_along_axis gathers with batching dimensions; its gradient scatters with them.
    "take_along_axis_grad": lambda a, b: jax.grad(
        lambda x: (jnp.take_along_axis(x, jnp.argsort(b, axis=1)[:, :3], axis=1) ** 2).sum())(a),
}


ONE_DEVICE_CASES = [(n, d) for n in sorted(ONE_DEVICE) for d in sorted(DTYPES)] + [
    (n, d) for n in sorted(FLOAT_ONLY) for d in sorted(DTYPES) if d != "i32"
]


@pytest.mark.parametrize("name,dtype", ONE_DEVICE_CASES)
def test_jit_one_device(name, dtype):
    dt = DTYPES[dtype]
    f = ONE_DEVICE.get(name) or FLOAT_ONLY[name]
    args = (sample((4, 6), dt, 1), sample((4, 6), dt, 2))
    assert_tree_same(on(PEERLESS, f, args), on(CPU, f, args))


def test_random_numbers_match_cpu():
    """jax.random (threefry as plain integer ops; permutation sorts) gives the CPU backend's
    numbers: the integers bit for bit, the floats within f32 tolerance (XLA's CPU backend may
    contract the inverse-erf polynomial into FMAs; Peerless rounds every op)."""
    f = lambda k: (jax.random.normal(jax.random.key(k), (4, 5)),  # noqa: E731
                   jax.random.uniform(jax.random.key(k + 1), (3,)),
                   jax.random.randint(jax.random.key(k), (6,), 0, 10),
                   jax.random.permutation(jax.random.key(k), 8))
    got = jax.jit(f)(jax.device_put(3, jax.devices(PEERLESS)[0]))
    want = jax.jit(f)(jax.device_put(3, jax.devices(CPU)[0]))
    for g, w in zip(got, want):
        assert_same(g, w)


def test_jit_dtype_conversions():
    f = lambda a: (a.astype(jnp.bfloat16), a.astype(jnp.float16), a.astype(jnp.int32), (a * 3).astype(jnp.uint8))  # noqa: E731
    args = (np.linspace(-3, 3, 13, dtype=np.float32),)
    assert_tree_same(on(PEERLESS, f, args), on(CPU, f, args))


def test_jit_on_another_device():
    d = jax.devices(PEERLESS)[-1]
    x = sample((3, 5), jnp.float32)
    y = jax.jit(lambda a: a + 1)(jax.device_put(x, d))
    assert y.devices() == {d}
    assert_same(y, on(CPU, lambda a: a + 1, (x,)))


def test_repeated_calls_of_one_compiled_function():
    f = jax.jit(lambda a, b: a * 2.0 + b)
    dev, cpu = jax.devices(PEERLESS)[0], jax.devices(CPU)[0]
    x0, b0 = sample((4, 3), jnp.float32, 1), sample((4, 3), jnp.float32, 2)
    x, b = jax.device_put(x0, dev), jax.device_put(b0, dev)
    xc, bc = jax.device_put(x0, cpu), jax.device_put(b0, cpu)
    compiled = f.lower(x, b).compile()
    for _ in range(20):
        x, xc = compiled(x, b), f(xc, bc)
        assert_same(x, xc)
    # Through jit's cache: after the first calls (uncommitted -> committed arguments), no
    # further compilation however often it is called.
    for _ in range(2):
        x, xc = f(x, b), f(xc, bc)
    before = f._cache_size()
    for _ in range(10):
        x, xc = f(x, b), f(xc, bc)
        assert_same(x, xc)
    assert f._cache_size() == before


# ---- shard_map ----------------------------------------------------------------------------


def mesh_of(platform, shape, names):
    n = math.prod(shape)
    return Mesh(np.array(jax.devices(platform)[:n]).reshape(shape), names)


def shard_map_on(platform, f, mesh_shape, names, x, in_specs, out_specs, repeat=1):
    mesh = mesh_of(platform, mesh_shape, names)
    xs = jax.device_put(x, NamedSharding(mesh, in_specs))
    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs))
    out = g(xs)
    for _ in range(repeat - 1):
        out = g(xs)
    if isinstance(out, jax.Array):
        assert out.sharding.spec == NamedSharding(mesh, out_specs).spec or out.sharding.is_equivalent_to(
            NamedSharding(mesh, out_specs), out.ndim
        )
    return out


def compare_shard_map(f, mesh_shape, names, x, in_specs, out_specs, repeat=1):
    need(math.prod(mesh_shape))
    got = shard_map_on(PEERLESS, f, mesh_shape, names, x, in_specs, out_specs, repeat)
    want = shard_map_on(CPU, f, mesh_shape, names, x, in_specs, out_specs)
    assert_same(got, want)


def ppermute_ring(axis, k, shift=1):
    return lambda a: jax.lax.ppermute(a, axis, [(i, (i + shift) % k) for i in range(k)])


def collectives_1d(k):
    """name -> (f, per-device block shape); the mesh axis is 'x' of size k."""
    ax = "x"
    return {
        "psum": (lambda a: jax.lax.psum(a, ax), (2, 3)),
        "pmax": (lambda a: jax.lax.pmax(a, ax), (2, 3)),
        "pmin": (lambda a: jax.lax.pmin(a, ax), (2, 3)),
        "pmean": (lambda a: jax.lax.pmean(a, ax), (2, 3)),
        "all_gather_tiled_axis0": (lambda a: jax.lax.all_gather(a, ax, axis=0, tiled=True), (2, 3)),
        "all_gather_tiled_axis1": (lambda a: jax.lax.all_gather(a, ax, axis=1, tiled=True), (2, 3)),
        "all_gather_untiled_axis0": (lambda a: jax.lax.all_gather(a, ax, axis=0), (2, 3)),
        "all_gather_untiled_axis1": (lambda a: jax.lax.all_gather(a, ax, axis=1), (2, 3)),
        "all_to_all_0_0": (lambda a: jax.lax.all_to_all(a, ax, 0, 0, tiled=True), (k, 3)),
        "all_to_all_1_1": (lambda a: jax.lax.all_to_all(a, ax, 1, 1, tiled=True), (2, 2 * k)),
        "all_to_all_split0_concat1": (lambda a: jax.lax.all_to_all(a, ax, 0, 1, tiled=True), (2 * k, 3)),
        "all_to_all_split1_concat0": (lambda a: jax.lax.all_to_all(a, ax, 1, 0, tiled=True), (3, 2 * k)),
        "all_to_all_untiled": (lambda a: jax.lax.all_to_all(a, ax, 0, 1), (k, 3)),
        "psum_scatter_tiled_dim0": (lambda a: jax.lax.psum_scatter(a, ax, scatter_dimension=0, tiled=True), (2 * k, 3)),
        "psum_scatter_tiled_dim1": (lambda a: jax.lax.psum_scatter(a, ax, scatter_dimension=1, tiled=True), (2, k)),
        "psum_scatter_untiled": (lambda a: jax.lax.psum_scatter(a, ax), (k, 3)),
        "ppermute_ring": (ppermute_ring(ax, k), (2, 3)),
        "ppermute_back2": (ppermute_ring(ax, k, shift=-2 if k > 2 else 1), (2, 3)),
        "ppermute_partial": (lambda a: jax.lax.ppermute(a, ax, [(0, k - 1), (k - 1, 0)]), (2, 3)),
        "axis_index": (lambda a: a + jax.lax.axis_index(ax).astype(a.dtype), (2, 3)),
        "chain": (lambda a: jax.lax.psum(jax.lax.ppermute(a * 2, ax, [(i, (i + 1) % k) for i in range(k)]), ax) - a, (2, 3)),
        # A loop whose body uses the device's index, then a collective on its result.
        "fori_axis_index_then_psum": (lambda a: jax.lax.psum(jax.lax.fori_loop(
            0, 3, lambda i, v: v * 2 + jax.lax.axis_index(ax).astype(v.dtype), a), ax), (2, 3)),
        # Collectives inside counted loops (unrolled by the emitter).
        "fori_psum_inside": (lambda a: jax.lax.fori_loop(
            0, 3, lambda i, v: v * 0.5 + jax.lax.psum(v, ax) * 0.25, a), (2, 3)),
        "scan_ppermute_inside": (lambda a: jax.lax.scan(
            lambda c, x: (jax.lax.ppermute(c, ax, [(j, (j + 1) % k) for j in range(k)]) + x, c.sum()),
            a[0], a)[0], (4, 3)),
    }


def block_input(mesh_shape, block, dtype, seed=0):
    """A global array whose block per device is `block` (leading dims scaled by the mesh)."""
    shape = list(block)
    for i, m in enumerate(mesh_shape):
        shape[i] *= m
    return sample(tuple(shape), dtype, seed)


MESH_1D = [2, 4, 8]


@pytest.mark.parametrize("k", MESH_1D)
@pytest.mark.parametrize("name", sorted(collectives_1d(8)))
def test_shard_map_1d_f32(name, k):
    f, block = collectives_1d(k)[name]
    x = block_input((k,), block, jnp.float32)
    compare_shard_map(f, (k,), ("x",), x, P("x"), P("x"))


DTYPE_OPS = ["psum", "pmax", "pmin", "pmean", "all_gather_tiled_axis1", "all_to_all_split0_concat1",
             "psum_scatter_tiled_dim0", "ppermute_ring", "axis_index"]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "i32"])
@pytest.mark.parametrize("name", DTYPE_OPS)
def test_shard_map_1d_dtypes(name, dtype):
    k = max(m for m in MESH_1D if m <= max(max_mesh(), 2))
    f, block = collectives_1d(k)[name]
    x = block_input((k,), block, DTYPES[dtype], seed=3)
    compare_shard_map(f, (k,), ("x",), x, P("x"), P("x"))


def test_shard_map_replicated_in_and_out():
    k = min(8, max_mesh())
    need(2)
    f = lambda a: jax.lax.psum(a.sum(keepdims=True), "x")  # noqa: E731
    compare_shard_map(f, (k,), ("x",), sample((4 * k,), jnp.float32), P("x"), P())
    g = lambda a: jax.lax.psum_scatter(a, "x", tiled=True)  # noqa: E731
    compare_shard_map(g, (k,), ("x",), sample((2 * k, 3), jnp.float32), P(), P("x"))


def collectives_2d(a, b, axis):
    """Collectives over `axis` ('x', 'y' or ('x', 'y')) of an a x b mesh; per-device block shapes."""
    n = {"x": a, "y": b}[axis] if isinstance(axis, str) else a * b
    return {
        "psum": (lambda v: jax.lax.psum(v, axis), (2, 3)),
        "pmax": (lambda v: jax.lax.pmax(v, axis), (2, 3)),
        "pmin": (lambda v: jax.lax.pmin(v, axis), (2, 3)),
        "pmean": (lambda v: jax.lax.pmean(v, axis), (2, 3)),
        "all_gather_tiled_axis0": (lambda v: jax.lax.all_gather(v, axis, axis=0, tiled=True), (2, 3)),
        "all_gather_tiled_axis1": (lambda v: jax.lax.all_gather(v, axis, axis=1, tiled=True), (2, 3)),
        "all_gather_untiled_axis0": (lambda v: jax.lax.all_gather(v, axis, axis=0), (2, 3)),
        "all_gather_untiled_axis1": (lambda v: jax.lax.all_gather(v, axis, axis=1), (2, 3)),
        "all_to_all_split0_concat1": (lambda v: jax.lax.all_to_all(v, axis, 0, 1, tiled=True), (n, 3)),
        "all_to_all_split1_concat0": (lambda v: jax.lax.all_to_all(v, axis, 1, 0, tiled=True), (2, n)),
        "psum_scatter_tiled": (lambda v: jax.lax.psum_scatter(v, axis, scatter_dimension=1, tiled=True), (2, 2 * n)),
        "ppermute": (
            (lambda v: jax.lax.ppermute(v, axis, [(i, (i + 1) % n) for i in range(n)])),
            (2, 3),
        ),
        "axis_index": (lambda v: v + jax.lax.axis_index(axis).astype(v.dtype), (2, 3)),
    }


MESH_2D = [(2, 2), (2, 4), (4, 2)]
AXES_2D = {"x": "x", "y": "y", "xy": ("x", "y")}


@pytest.mark.parametrize("axis", sorted(AXES_2D))
@pytest.mark.parametrize("mesh_shape", MESH_2D, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", sorted(collectives_2d(2, 2, "x")))
def test_shard_map_2d(name, mesh_shape, axis):
    if name.startswith("ppermute") and axis == "xy":
        pass  # ppermute over both axes: permutation of the flattened (x, y) index
    a, b = mesh_shape
    f, block = collectives_2d(a, b, AXES_2D[axis])[name]
    x = block_input(mesh_shape, block, jnp.float32, seed=5)
    compare_shard_map(f, mesh_shape, ("x", "y"), x, P("x", "y"), P("x", "y"))


def test_shard_map_2d_partially_sharded_input():
    """Input sharded over 'x' only (replicated over 'y'), output over both."""
    need(8)
    f = lambda v: jax.lax.psum(v * (jax.lax.axis_index("y") + 1).astype(v.dtype), "y")  # noqa: E731
    compare_shard_map(f, (2, 4), ("x", "y"), sample((4, 3), jnp.float32), P("x"), P("x"))


def test_shard_map_without_outputs():
    """A program with an empty result (eager shard_map of a body with no outputs, as in JAX's
    shard_map_test): the output sharding of an empty tuple must be XLA's (one leaf)."""
    from functools import partial

    from jax._src import core

    need(4)
    prim = core.Primitive("peerless_test_nothing")
    prim.multiple_results = True
    prim.def_impl(lambda: [])
    prim.def_abstract_eval(lambda: [])
    def body():
        prim.bind()

    for platform in (PEERLESS, CPU):
        f = partial(jax.shard_map, mesh=mesh_of(platform, (4,), ("x",)), in_specs=(), out_specs=None)
        assert f(body)() is None


def test_shard_map_repeated_calls():
    k = min(8, max_mesh())
    need(2)
    f, block = collectives_1d(k)["psum"]
    compare_shard_map(f, (k,), ("x",), block_input((k,), block, jnp.float32), P("x"), P("x"), repeat=10)


# ---- pmap ---------------------------------------------------------------------------------


def pmap_on(platform, f, x, k):
    return jax.pmap(f, axis_name="i", devices=jax.devices(platform)[:k])(x)


PMAP = {
    "psum": lambda a: jax.lax.psum(a, "i"),
    "pmean_pmax": lambda a: jax.lax.pmean(a, "i") + jax.lax.pmax(a, "i"),
    "axis_index": lambda a: a * jax.lax.axis_index("i").astype(a.dtype),
    "all_gather": lambda a: jax.lax.all_gather(a, "i"),
    "elementwise": lambda a: jnp.sin(a) * 2,
}


@pytest.mark.parametrize("k", MESH_1D)
@pytest.mark.parametrize("name", sorted(PMAP))
def test_pmap(name, k):
    need(k)
    x = sample((k, 3, 2), jnp.float32, seed=7)
    got = pmap_on(PEERLESS, PMAP[name], x, k)
    want = pmap_on(CPU, PMAP[name], x, k)
    assert got.devices() <= set(jax.devices(PEERLESS))
    assert_same(got, want)


def test_pmap_repeated_calls_and_int32():
    k = min(8, max_mesh())
    need(2)
    f = jax.pmap(lambda a: jax.lax.psum(a, "i"), axis_name="i", devices=jax.devices(PEERLESS)[:k])
    g = jax.pmap(lambda a: jax.lax.psum(a, "i"), axis_name="i", devices=jax.devices(CPU)[:k])
    x = sample((k, 5), jnp.int32)
    for _ in range(5):
        assert_same(f(x), g(x))


# ---- compile options ----------------------------------------------------------------------


def test_compiler_options_set_peerless_flags():
    """`compiler_options` reach the plugin as CompileOptionsProto.env_option_overrides; names
    of Peerless flags set them for that executable, bad values are errors."""
    k = min(8, max_mesh())
    need(2)
    f, block = collectives_1d(k)["psum"]
    x = block_input((k,), block, jnp.float32)
    want = shard_map_on(CPU, f, (k,), ("x",), x, P("x"), P("x"))
    mesh = mesh_of(PEERLESS, (k,), ("x",))
    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    xs = jax.device_put(x, NamedSharding(mesh, P("x")))
    for backend in ["fallback", "kernel"]:
        compiled = g.lower(xs).compile(compiler_options={"all_reduce_backend": backend})
        assert_same(compiled(xs), want)
        # The pass saw the option for that compile only.
        last = [d for d in inside.decisions() if d["op"] == "all-reduce"][-1]
        assert (last["implementation"] == "fallback") == (backend == "fallback"), last
    with pytest.raises(Exception, match="all_reduce_backend=bogus"):
        g.lower(xs).compile(compiler_options={"all_reduce_backend": "bogus"})
    # XLA's wording for an unknown option (JAX's pmap_test matches it); xla_* options are ignored.
    with pytest.raises(Exception, match="No such compile option: 'invalid_key'"):
        g.lower(xs).compile(compiler_options={"invalid_key": "invalid_value"})
    assert_same(g.lower(xs).compile(compiler_options={"xla_embed_ir_in_executable": True})(xs), want)


# ---- client settings (each in a fresh process: JAX creates the client once) -------------------


def run_python(code, **env):
    import subprocess
    import sys

    full = dict(os.environ, JAX_PLATFORMS="peerless", **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300)


PROBE = """
import jax
try:
    print("DEVICES", len(jax.devices("peerless")), repr(jax.devices()[0]))
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""


@pytest.mark.skipif(BACKEND != "host", reason="host backend device count")
def test_host_devices_from_environment():
    p = run_python(PROBE, PEERLESS_HOST_DEVICES="3", PEERLESS_BACKEND="host")
    assert p.returncode == 0, p.stderr
    assert "DEVICES 3 CpuDevice(id=0)" in p.stdout, p.stdout + p.stderr  # XLA's CPU plugin, wrapped


def test_backend_selection_errors_are_clear():
    p = run_python(PROBE, PEERLESS_BACKEND="tpu")
    assert p.returncode == 0, p.stderr
    assert "ERROR" in p.stdout and "PEERLESS_BACKEND=tpu is not a backend" in p.stdout, p.stdout + p.stderr
    # cuda: GPU devices where the CUDA backend is usable, else a Python exception that names
    # the plugin and cuda (never a crash).
    p = run_python(PROBE, PEERLESS_BACKEND="cuda")
    assert p.returncode == 0, p.stderr
    if "ERROR" in p.stdout:
        assert "peerless" in p.stdout and "cuda" in p.stdout.lower(), p.stdout + p.stderr
    else:
        assert "cuda" in p.stdout.lower(), p.stdout  # XLA's CUDA plugin, wrapped
    # No XLA plugin at all (none importable): client creation says what to install.
    p = run_python("import sys; sys.modules['lammps_jax_pjrt_cpu'] = None\n" + PROBE, PEERLESS_BACKEND="host")
    assert p.returncode == 0, p.stderr
    assert "ERROR" in p.stdout and "lammps-jax-pjrt-cpu" in p.stdout, p.stdout + p.stderr


# ---- errors -------------------------------------------------------------------------------


def test_jit_on_sharded_arrays_without_shard_map():
    """A jit over an array sharded across devices with no shard_map needs XLA's SPMD
    partitioner: XLA partitions it, and Peerless runs the collectives it made."""
    need(2)
    k = min(8, max_mesh())
    x = np.arange(4.0 * k, dtype=np.float32).reshape(k, 4)
    f = lambda a: a.sum(axis=0)  # noqa: E731
    assert_same(*(jax.jit(f)(jax.device_put(x, NamedSharding(mesh_of(pl, (k,), ("x",)), P("x")))) for pl in (PEERLESS, CPU)))


def named_on(platform, f, args, specs, mesh_shape, names):
    """`jax.jit(f)` on arrays placed with NamedSharding(mesh, spec) on `platform`'s devices."""
    mesh = mesh_of(platform, mesh_shape, names)
    placed = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
    return jax.jit(f)(*placed)


def _mlp_loss(w1, w2, x, y):
    h = jax.nn.relu(x @ w1)
    return jnp.mean((h @ w2 - y) ** 2)


def _dp_step(w1, w2, x, y):
    g1, g2 = jax.grad(_mlp_loss, argnums=(0, 1))(w1, w2, x, y)
    return w1 - 0.1 * g1, w2 - 0.1 * g2


NAMED = {
    # name: (f, shapes, specs, mesh shape, axis names)
    "sum_over_sharded_rows": (lambda a: a.sum(axis=0), [(16, 8)], [P("x")], (8,), ("x",)),
    "mean_of_all": (lambda a: jnp.mean(a * 2.0), [(16, 8)], [P("x")], (8,), ("x",)),
    "matmul_row_sharded_weight": (lambda a, w: jnp.tanh(a @ w), [(4, 32), (32, 16)], [P(), P("x")], (8,), ("x",)),
    "matmul_col_sharded_weight": (lambda a, w: (a @ w).sum(axis=1), [(4, 32), (32, 16)], [P(), P(None, "x")], (8,), ("x",)),
    "softmax_on_2d_mesh": (lambda a: jax.nn.softmax(a, axis=-1), [(8, 16)], [P("x", "y")], (2, 4), ("x", "y")),
    "dp_mlp_step": (_dp_step, [(8, 16), (16, 4), (32, 8), (32, 4)], [P(), P(), P("x"), P("x")], (8,), ("x",)),
    "fsdp_mlp_step": (_dp_step, [(8, 16), (16, 4), (32, 8), (32, 4)], [P("x"), P(None, "x"), P("x"), P("x")], (4,), ("x",)),
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_jit_on_named_sharding(name):
    """Auto-partitioned jit on NamedSharding-sharded arrays (no shard_map): XLA partitions;
    the collectives it makes are Peerless's."""
    f, shapes, specs, mesh_shape, names = NAMED[name]
    need(math.prod(mesh_shape))
    args = [sample(s, jnp.float32, seed=i) for i, s in enumerate(shapes)]
    assert_tree_same(named_on(PEERLESS, f, args, specs, mesh_shape, names), named_on(CPU, f, args, specs, mesh_shape, names))


def test_jit_reshards_rows_to_columns():
    """A sharding constraint that moves an array from rows to columns (an all-to-all XLA makes)."""
    need(8)
    x = sample((8, 8), jnp.float32)

    def run(platform):
        mesh = mesh_of(platform, (8,), ("x",))
        f = lambda a: jax.lax.with_sharding_constraint(a * 3.0, NamedSharding(mesh, P(None, "x")))  # noqa: E731
        out = jax.jit(f)(jax.device_put(x, NamedSharding(mesh, P("x"))))
        assert out.sharding.spec == P(None, "x")
        return out

    assert_same(run(PEERLESS), run(CPU))


def test_unreduced_values():
    """The gradient of a `reduced` output is `unreduced` (partial sums that XLA's partitioner
    reduces when resharding): XLA does that, and the result equals JAX's CPU backend."""
    from jax.sharding import AxisType

    need(4)
    x = np.arange(32.0, dtype=np.float32).reshape(8, 4)

    def grad_on(platform):
        devs = jax.devices(platform)[:4]
        mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2, devices=devs)
        with jax.set_mesh(mesh):
            arr = jax.device_put(x, P("x", "y"))

            @jax.shard_map(out_specs=P(reduced={"y"}))
            def f(a):
                seq = jax.lax.all_gather(a, "y", axis=1, tiled=True, to="reduced")
                return jax.lax.psum(jnp.sum(seq), "x")

            return jax.jit(jax.grad(f))(arr)

    want = grad_on(CPU)
    assert_same(want, on(CPU, jax.grad(jnp.sum), (x,)))  # the program is valid
    assert_same(grad_on(PEERLESS), want)


OTHER_OPS = {
    # Ops Peerless has nothing to do with: XLA runs them.
    "fft": lambda a: jnp.fft.fft(a).real,
}


def test_collective_inside_an_uncounted_loop():
    """A loop body with a collective whose trip count is only known at run time: XLA runs the
    loop and Peerless the psum inside it."""
    need(2)
    f = lambda a: jax.lax.while_loop(lambda v: v.sum() < 100, lambda v: v + jax.lax.psum(v, "x") + 1, a)  # noqa: E731
    x = sample((4, 3), jnp.float32)
    assert_same(shard_map_on(PEERLESS, f, (2,), ("x",), x, P("x"), P("x")),
                shard_map_on(CPU, f, (2,), ("x",), x, P("x"), P("x")))


@pytest.mark.parametrize("name", sorted(OTHER_OPS))
def test_ops_without_collectives(name):
    f = OTHER_OPS[name]
    x = sample((5,), jnp.float32)
    assert_same(on(PEERLESS, f, (x,)), on(CPU, f, (x,)))


def test_zz_peerless_handlers_ran():
    """The collectives above ran on Peerless's handlers (runs last: pytest keeps file
    order). On one device every collective above is skipped or a group of one (XLA's)."""
    need(2)
    assert inside.handler_calls(INNER) > 0
    assert inside.stats().get("all-reduce", {}).get("kernel", 0) > 0, inside.stats()

