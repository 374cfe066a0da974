"""Regenerates the shard_map fixtures of interp/tests/shard_map.rs from JAX (CPU).

For each case and partitioner (Shardy, GSPMD) writes `<case>.<sdy|gspmd>.hlo` (the lowered,
unpartitioned module) and `<case>.<sdy|gspmd>.npz` with every device's input shards
`p{i}_d{d}` and XLA's per-device result shards `o{j}_d{d}`.
Run: python3 gen_shard_map.py (jax 0.10).
"""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

OUT = os.path.dirname(os.path.abspath(__file__))


def cases():
    devs = jax.devices()
    m1 = Mesh(np.array(devs[:4]), ("x",))
    m2 = Mesh(np.array(devs[:8]).reshape(2, 4), ("a", "b"))

    psum = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "x"), mesh=m1, in_specs=P("x"), out_specs=P("x")))
    yield "psum_1d", psum, [(8, 4)], m1, [P("x")]

    def g(x, y):
        s = jax.lax.all_gather(x, "b", axis=1, tiled=True)
        t = jax.lax.psum_scatter(y, "a", scatter_dimension=0, tiled=True)
        u = jax.lax.ppermute(x, "b", [(i, (i + 1) % 4) for i in range(4)])
        i = jax.lax.axis_index("b")
        v = jax.lax.all_to_all(y, "b", 0, 1, tiled=True)
        return s, t, u + i, v

    f = jax.jit(jax.shard_map(g, mesh=m2, in_specs=(P("a", "b"), P(None, "b")), check_vma=False,
                              out_specs=(P("a", None), P("a", "b"), P("a", "b"), P(None, "b"))))
    yield "mesh2d", f, [(8, 16), (8, 16)], m2, [P("a", "b"), P(None, "b")]

    sm = jax.shard_map(lambda x: jax.lax.psum(x, "b") * 2, mesh=m2, in_specs=P("a", "b"), out_specs=P("a", None))
    outer = jax.jit(lambda x: sm(x) + 1.0, in_shardings=NamedSharding(m2, P("a", "b")),
                    out_shardings=NamedSharding(m2, P("a", None)))
    yield "outer_add", outer, [(8, 16)], m2, [P("a", "b")]

    sin = jax.jit(jnp.sin, in_shardings=NamedSharding(m2, P("b", "a")))
    yield "sin_sharded", sin, [(8, 16)], m2, [P("b", "a")]


def main():
    for tag in ("sdy", "gspmd"):
        jax.config.update("jax_use_shardy_partitioner", tag == "sdy")
        for name, fn, shapes, mesh, specs in cases():
            rng = np.random.default_rng(0)
            xs = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
            text = fn.lower(*xs).compiler_ir("hlo").as_hlo_text()
            n = mesh.devices.size
            order = {dev.id: k for k, dev in enumerate(mesh.devices.flat)}
            arrays = {}
            for i, (x, spec) in enumerate(zip(xs, specs)):
                for sh in jax.device_put(x, NamedSharding(mesh, spec)).addressable_shards:
                    arrays[f"p{i}_d{order[sh.device.id]}"] = np.asarray(sh.data)
            outs = fn(*xs)
            outs = outs if isinstance(outs, tuple) else (outs,)
            for j, o in enumerate(outs):
                for sh in o.addressable_shards:
                    arrays[f"o{j}_d{order[sh.device.id]}"] = np.asarray(sh.data)
            assert len(arrays) == n * (len(xs) + len(outs)), name
            with open(os.path.join(OUT, f"{name}.{tag}.hlo"), "w") as fh:
                fh.write(text)
            np.savez(os.path.join(OUT, f"{name}.{tag}.npz"), **arrays)
            print("wrote", name, tag, file=sys.stderr)


if __name__ == "__main__":
    main()
