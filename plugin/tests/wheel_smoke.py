"""Smoke test of an installed jax-peerless wheel (scripts/check_wheel.sh runs it in a fresh venv).

On XLA:CPU with 8 host devices, each program is compiled and run by XLA alone, then with
Peerless enabled (`jax_plugins.peerless.enable()`), and the results must agree: a psum under
shard_map, and a jit over NamedSharding-sharded arrays whose partitioned program has an
all-reduce (a matmul over a sharded contraction axis) and an all-gather (a sharded result
constrained to be replicated). Peerless must have taken every collective: `stats()` counts them
as kernels, none fell back, and the compiled HLO calls Peerless's handlers where XLA alone's
does not. The package and its library must come from the installed wheel, not a checkout.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -I plugin/tests/wheel_smoke.py
"""

import importlib.metadata
import os
import sys

_COUNT_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _COUNT_FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The wheel's kernels are under test: the shipped XLA:CPU tuning profile would leave
# this 256-byte f32 all-gather to XLA.
os.environ.setdefault("PEERLESS_TUNING_PROFILE", "0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless as peerless  # noqa: E402

PEERLESS_CALL = 'custom_call_target="peerless.'


def check_installed():
    """The package is the wheel's: in site-packages, its bundled library, a manylinux tag."""
    assert "PEERLESS_PJRT_LIBRARY" not in os.environ, "the bundled library must be the one loaded"
    pkg = os.path.realpath(peerless.__path__[0])
    assert "site-packages" in pkg.split(os.sep), f"jax_plugins.peerless from {pkg}, not an installed wheel"
    lib = os.path.realpath(peerless.library_path())
    assert lib == os.path.join(pkg, "libpeerless_pjrt.so"), lib
    dist = importlib.metadata.distribution("jax-peerless")
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines() if line.startswith("Tag:")]
    assert tags and all("manylinux" in t for t in tags), f"wheel tags {tags}"
    print(f"jax-peerless {dist.version} ({', '.join(tags)}) from {pkg}; jax {jax.__version__}")


def check_kernels(targets):
    """The bundled library carries prebuilt GPU kernels for every target in `targets`, the same
    number of units for each: counted by the bundle's entry headers (protobuf: field 1, the
    target name, then field 2, the unit)."""
    with open(peerless.library_path(), "rb") as fh:
        image = fh.read()
    counts = {t: image.count(b"\x0a" + bytes([len(t)]) + t.encode() + b"\x12") for t in targets}
    assert len(set(counts.values())) == 1 and min(counts.values()) >= 200, f"prebuilt kernel units per target: {counts}"
    print(f"prebuilt kernels: {counts}")


def compile_run(f, args, shardings):
    """A fresh compile (JAX caches executables; the pass sees only new compiles) and its result."""
    jax.clear_caches()
    compiled = jax.jit(f, in_shardings=shardings).lower(*args).compile()
    out = compiled(*args)
    return jax.tree.map(np.asarray, out), compiled.as_text()


def main():
    check_installed()
    if "--kernels" in sys.argv:
        check_kernels(sys.argv[sys.argv.index("--kernels") + 1].split(","))
    devices = jax.devices("cpu")
    assert len(devices) == 8, f"needs 8 CPU devices (XLA_FLAGS={_COUNT_FLAG}), got {len(devices)}"
    mesh = Mesh(np.array(devices), ("i",))
    rng = np.random.default_rng(0)

    # shard_map: a psum over the 8 devices, on floats (summation order may differ: a tolerance).
    def psum_prog(v):
        return jax.shard_map(lambda s: jax.lax.psum(s * 2.0, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())(v)

    v = rng.standard_normal((8 * 16, 32)).astype(np.float32)

    # A sharded jit: XLA's partitioner makes an all-reduce (the contraction axis of x @ w is
    # sharded) and an all-gather (h is sharded by rows, its result replicated). Integer-valued
    # floats, so every sum is exact in any order: the results must be equal.
    def jit_prog(x, w, h):
        y = jnp.tanh(x @ w)
        g = jax.lax.with_sharding_constraint(h * 3.0 + 1.0, NamedSharding(mesh, P()))
        return y, g

    x = rng.integers(-3, 4, (16, 64)).astype(np.float32)
    w = rng.integers(-3, 4, (64, 32)).astype(np.float32)
    h = rng.integers(-9, 10, (64, 8)).astype(np.float32)
    jit_shardings = (NamedSharding(mesh, P(None, "i")), NamedSharding(mesh, P("i", None)), NamedSharding(mesh, P("i", None)))
    psum_shardings = (NamedSharding(mesh, P("i")),)

    peerless.disable()
    want_psum, hlo = compile_run(psum_prog, (v,), psum_shardings)
    assert PEERLESS_CALL not in hlo
    want_jit, hlo = compile_run(jit_prog, (x, w, h), jit_shardings)
    assert PEERLESS_CALL not in hlo
    assert "all-reduce" in hlo and "all-gather" in hlo, "XLA's partitioned program lacks an all-reduce or an all-gather"

    assert peerless.enable() == ["cpu"], peerless.enabled()
    peerless.reset_stats()
    got_psum, hlo_psum = compile_run(psum_prog, (v,), psum_shardings)
    got_jit, hlo_jit = compile_run(jit_prog, (x, w, h), jit_shardings)
    stats = peerless.stats()
    peerless.disable()

    np.testing.assert_allclose(got_psum, want_psum, rtol=1e-6, atol=1e-5, err_msg="psum under shard_map")
    np.testing.assert_array_equal(got_jit[0], want_jit[0], err_msg="sharded jit: all-reduce (x @ w)")
    np.testing.assert_array_equal(got_jit[1], want_jit[1], err_msg="sharded jit: all-gather")
    assert stats.get("all-reduce", {}).get("kernel", 0) >= 2, stats
    assert stats.get("all-gather", {}).get("kernel", 0) >= 1, stats
    assert all(v.get("fallback", 0) == 0 for v in stats.values()), stats
    for name, hlo in (("psum", hlo_psum), ("sharded jit", hlo_jit)):
        assert PEERLESS_CALL in hlo, f"{name}: the compiled program calls no Peerless handler"
    assert peerless.handler_calls("cpu") > 0
    print("wheel smoke: psum under shard_map and a sharded jit (all-reduce, all-gather) agree with XLA alone;")
    print(f"Peerless took every collective: {stats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
