#!/usr/bin/env python3
"""Real JAX programs (shard_map + collectives) dumped as HLO text, with goldens.

For every program below this writes
  cases/jax_<name>.hlo      -- `jax.jit(f).lower(...).compiler_ir('hlo').as_hlo_text()`
                               with the `// peerless-test:` directive prepended
  goldens/jax_<name>.d<N>.npz -- per-device SHARDS of inputs and outputs, produced by
                               running the JAX program itself on JAX's CPU backend.

Device d is position d in the mesh's flattened device order (the mesh is
`jax.devices()[:N]` reshaped to the mesh shape), which is also partition id d.
`p{i}_d{d}` is device d's shard of input i (per its in_spec); `o{j}_d{d}` is device
d's shard of output j (per its out_spec; replicated axes hold the full block).

Usually run through `gen_goldens.py`, which also writes the `.pb` files and
implements `--check`. Running this file directly regenerates only the jax_* cases.

Programs are dumped in Shardy form (`xla.sdy.GlobalToLocalShape` /
`xla.sdy.LocalToGlobalShape` custom calls, `xla.sdy.manual_computation_body`) by
default; those marked `gspmd=True` are dumped with
`jax_use_shardy_partitioner=False` (`Sharding` / `SPMDFullToShardShape` /
`SPMDShardToFullShape` custom calls).
"""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "--xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import sys
import zlib
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

try:
    from jax import shard_map  # jax >= 0.6
except ImportError:  # pragma: no cover
    from jax.experimental.shard_map import shard_map

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Program:
    name: str
    mesh_shape: tuple
    axis_names: tuple
    body: Callable
    in_specs: tuple
    out_specs: object
    inputs: list  # list of (global shape, numpy dtype, kind) ; kind in {"float", "int", "positive"}
    gspmd: bool = False
    note: str = ""
    check_vma: bool = True

    @property
    def num_devices(self):
        return int(np.prod(self.mesh_shape))


def _programs():
    ps = []

    def add(*a, **k):
        ps.append(Program(*a, **k))

    # ---- 1-D meshes -------------------------------------------------------------
    add("psum_x4", (4,), ("x",),
        lambda a: (lax.psum(a, "x"), lax.axis_index("x")[None]),
        (P("x"),), (P(), P("x")),
        [((8, 3), np.float32, "float")], note="psum + axis_index")
    add("pmax_pmin_x2", (2,), ("x",),
        lambda a, b: (lax.pmax(a, "x"), lax.pmin(b, "x")),
        (P("x"), P("x")), (P(), P()),
        [((4, 4), np.int32, "int"), ((2, 6), np.float32, "float")])
    add("all_gather_untiled_x4", (4,), ("x",),
        lambda a: lax.all_gather(a, "x", axis=0, tiled=False),
        (P("x"),), P(),
        [((8, 3), np.float32, "float")], check_vma=False)
    add("all_gather_tiled_x8", (8,), ("x",),
        lambda a: lax.all_gather(a, "x", axis=1, tiled=True),
        (P(None, "x"),), P(),
        [((3, 16), np.int32, "int")], check_vma=False)
    add("all_to_all_x4", (4,), ("x",),
        lambda a: lax.all_to_all(a, "x", split_axis=1, concat_axis=0, tiled=True),
        (P("x"),), P("x"),
        [((8, 8), np.float32, "float")])
    add("psum_scatter_x4", (4,), ("x",),
        lambda a: lax.psum_scatter(a, "x", scatter_dimension=0, tiled=True),
        (P(None),), P("x"),
        [((8, 2), np.float32, "float")], note="replicated input, scattered output")
    add("ppermute_x8", (8,), ("x",),
        lambda a: (lax.ppermute(a, "x", [(i, (i + 1) % 8) for i in range(8)]),
                   lax.ppermute(a, "x", [(0, 3), (3, 5), (6, 1)])),
        (P("x"),), (P("x"), P("x")),
        [((16, 2), np.float32, "float")], note="cyclic shift and a partial permutation")
    add("axis_index_math_x8", (8,), ("x",),
        lambda a: a * (lax.axis_index("x").astype(jnp.float32) + 1.0) + lax.psum(jnp.sum(a), "x"),
        (P("x"),), P("x"),
        [((8, 4), np.float32, "float")])
    add("psum_bf16_int_x2", (2,), ("x",),
        lambda a, b: (lax.psum(a, "x"), lax.psum(b, "x")),
        (P("x"), P("x")), (P(), P()),
        [((4, 4), jnp.bfloat16, "float"), ((4,), np.int32, "int")])

    # ---- 2-D meshes -------------------------------------------------------------
    add("psum_2x2_both", (2, 2), ("x", "y"),
        lambda a: lax.psum(a, ("x", "y")),
        (P("x", "y"),), P(),
        [((4, 6), np.float32, "float")], note="psum over both axes")
    add("psum_2x4_y_gather_x", (2, 4), ("x", "y"),
        lambda a: (lax.psum(a, "y"), lax.all_gather(a, "x", axis=0, tiled=True)),
        (P("x", "y"),), (P(None, None), P(None, "y")),
        [((4, 8), np.float32, "float")], note="reduce over the minor axis, gather over the major axis",
        check_vma=False)
    add("all_to_all_2x4_x", (2, 4), ("x", "y"),
        lambda a: lax.all_to_all(a, "x", split_axis=0, concat_axis=1, tiled=True),
        (P("x", "y"),), P("x", "y"),
        [((8, 8), np.float32, "float")])
    add("ppermute_2x2_y_axis_index", (2, 2), ("x", "y"),
        lambda a: (lax.ppermute(a, "y", [(0, 1), (1, 0)]),
                   (lax.axis_index("x") * 10 + lax.axis_index("y"))[None, None]),
        (P("x", "y"),), (P("x", "y"), P("x", "y")),
        [((4, 4), np.float32, "float")])
    add("psum_scatter_2x4_both", (2, 4), ("x", "y"),
        lambda a: lax.psum_scatter(a, ("x", "y"), scatter_dimension=0, tiled=True),
        (P(),), P(("x", "y")),
        [((16, 2), np.float32, "float")])
    add("mlp_2x4", (2, 4), ("x", "y"),
        lambda x, w1, w2: lax.psum(jnp.tanh(x @ w1) @ w2, "y"),
        (P("x", None), P(None, "y"), P("y", None)), P("x", None),
        [((4, 8), np.float32, "float"), ((8, 16), np.float32, "float"), ((16, 4), np.float32, "float")],
        note="Megatron-style MLP: data parallel over x, tensor parallel over y")

    # ---- GSPMD form -------------------------------------------------------------
    add("gspmd_psum_x4", (4,), ("x",),
        lambda a: (lax.psum(a, "x"), lax.axis_index("x")[None]),
        (P("x"),), (P(), P("x")),
        [((8, 3), np.float32, "float")], gspmd=True)
    add("gspmd_all_gather_2x2", (2, 2), ("x", "y"),
        lambda a: lax.all_gather(a, ("x", "y"), axis=0, tiled=True),
        (P(("x", "y")),), P(),
        [((8, 2), np.int32, "int")], check_vma=False, gspmd=True)
    add("gspmd_ppermute_all_to_all_x4", (4,), ("x",),
        lambda a: (lax.ppermute(a, "x", [(i, (i + 3) % 4) for i in range(4)]),
                   lax.all_to_all(a, "x", split_axis=1, concat_axis=1, tiled=True)),
        (P("x"),), (P("x"), P("x")),
        [((8, 4), np.float32, "float")], gspmd=True)
    return {p.name: p for p in ps}


PROGRAMS = _programs()


def case_names():
    return sorted("jax_" + n for n in PROGRAMS)


def _seed(name, n):
    return zlib.crc32(f"{name}/{n}".encode()) & 0x7FFFFFFF


def _make_input(rng, shape, dtype, kind):
    dtype = np.dtype(dtype)
    if kind == "int":
        return rng.integers(-9, 10, size=shape).astype(dtype)
    lo = 0.125 if kind == "positive" else -1.0
    return rng.uniform(lo, 1.0, size=shape).astype(np.float32).astype(dtype)


def directive(p):
    return f"// peerless-test: devices={p.num_devices} mode=partition source=jax\n"


def _mesh(p):
    devs = np.array(jax.devices("cpu")[: p.num_devices]).reshape(p.mesh_shape)
    return Mesh(devs, p.axis_names)


def _shards(arr, mesh):
    by_dev = {s.device: s for s in arr.addressable_shards}
    return [np.asarray(by_dev[d].data) for d in mesh.devices.flat]


def dump(name):
    """Returns (hlo_text_with_directive, arrays dict) for case `name` (with jax_ prefix)."""
    p = PROGRAMS[name[len("jax_"):]]
    jax.config.update("jax_use_shardy_partitioner", not p.gspmd)
    try:
        mesh = _mesh(p)
        rng = np.random.default_rng(_seed(name, p.num_devices))
        host = [_make_input(rng, s, dt, k) for (s, dt, k) in p.inputs]
        args = [jax.device_put(h, NamedSharding(mesh, spec)) for h, spec in zip(host, p.in_specs)]
        f = shard_map(p.body, mesh=mesh, in_specs=p.in_specs, out_specs=p.out_specs, check_vma=p.check_vma)
        jf = jax.jit(f)
        text = jf.lower(*args).compiler_ir("hlo").as_hlo_text()
        outs = jf(*args)
        leaves = jax.tree_util.tree_leaves(outs)
        arrays = {}
        for i, a in enumerate(args):
            for d, s in enumerate(_shards(a, mesh)):
                arrays[f"p{i}_d{d}"] = s
        for j, o in enumerate(leaves):
            for d, s in enumerate(_shards(o, mesh)):
                arrays[f"o{j}_d{d}"] = s
        header = directive(p)
        if p.note:
            header += f"// {p.note}\n"
        header += f"// jax program: mesh {dict(zip(p.axis_names, p.mesh_shape))}, " \
                  f"in_specs={p.in_specs}, out_specs={p.out_specs}" + (" (GSPMD form)" if p.gspmd else " (Shardy form)") + "\n"
        return header + text, arrays
    finally:
        jax.config.update("jax_use_shardy_partitioner", True)


def main():
    # Delegate to gen_goldens so the .pb and npz encodings stay in one place.
    sys.path.insert(0, HERE)
    import gen_goldens

    sys.exit(gen_goldens.main(["--only-jax"] + sys.argv[1:]))


if __name__ == "__main__":
    main()
