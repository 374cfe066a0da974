"""The tensor-parallel layer the fused all-reduce + RMSNorm checks compile, on XLA:CPU
(test_fused_norm.py) and on GPUs (gpu_fused_norm.py): `h = x + psum(a); y = rmsnorm(h) [* gamma]`
under shard_map over a 1-D mesh "tp"."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

EPS = 1e-6


def layer(gamma):
    def f(x, a, *g):
        h = x + jax.lax.psum(a, "tp")
        hf = h.astype(jnp.float32)
        n = hf * jax.lax.rsqrt(jnp.mean(hf * hf, -1, keepdims=True) + EPS)
        if gamma:
            n = n * g[0].astype(jnp.float32)
        return h, n.astype(x.dtype)

    return f


def program(devices, gamma):
    """The layer over `devices`, inputs replicated (x, a[, gamma]), outputs (h, y)."""
    specs = (P(), P(), P()) if gamma else (P(), P())
    return jax.shard_map(layer(gamma), mesh=Mesh(np.array(devices), ("tp",)), in_specs=specs,
                         out_specs=(P(), P()), check_vma=False)
