"""Writes the inputs of the pass's golden tests (emitter/tests/xla_pass.rs): `NAME.pb`, the
serialized HloModuleProto exactly as XLA hands it to the Peerless pass (jax.extend.xla,
stage PRE_SCHEDULER, CPU with 8 host devices), for a few small JAX programs.

    /tmp/v312/bin/python emitter/tests/xla_pass/make_inputs.py      # (a venv with jax 0.11.2)
    PEERLESS_BLESS=1 cargo test -p peerless-emitter --test xla_pass  # then re-bless

A pass callback records every module a program's compile runs through it; of those, only
the module(s) holding a collective are kept (the helper modules of device_put, iota, ...
are dropped), or for `no_collective` the program's own module. `psum_fallback` is
`psum_f32` again: its `.flags` file makes the runner force the fallback.
The inputs also seed the fuzz target's corpus (named by content, as libFuzzer names them):

    for f in emitter/tests/xla_pass/*.pb; do cp "$f" fuzz/corpus/xla_pass/$(sha1sum <"$f" | cut -c1-40); done
"""

import os
import pathlib
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.extend import xla as jx  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent

COLLECTIVES = {
    b"all-reduce", b"all-gather", b"all-to-all", b"reduce-scatter", b"collective-permute",
    b"all-reduce-start", b"all-gather-start", b"collective-permute-start", b"ragged-all-to-all",
    b"collective-broadcast",
}


# ---------------------------------------------------------------- a minimal protobuf reader

def varint(b, i):
    v = s = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << s
        s += 7
        if x < 0x80:
            return v, i


def fields(b):
    """(field number, payload) of each field of a message (length-delimited payloads only)."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        tag, wire = key >> 3, key & 7
        if wire == 0:
            _, i = varint(b, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = varint(b, i)
            yield tag, b[i:i + n]
            i += n
        else:
            raise ValueError(f"wire type {wire}")


def module_name(b):
    return next((p.decode() for t, p in fields(b) if t == 1), "?")


def opcodes(b):
    """Every instruction's opcode (HloModuleProto.computations[].instructions[].opcode)."""
    for t, comp in fields(b):
        if t != 3:
            continue
        for t2, ins in fields(comp):
            if t2 != 2:
                continue
            for t3, p in fields(ins):
                if t3 == 2:
                    yield bytes(p)


# ---------------------------------------------------------------- recording

seen = []


def callback(b):
    seen.append(bytes(b))
    return None


jx.register_hlo_module_transformation(callback, name="peerless_make_inputs", platforms="cpu")


ONLY = set(sys.argv[1:])  # names to (re)write; none: every input


def record(name, f, *args, keep=None):
    """Runs `f(*args)` and saves the modules its compile passed through that hold a
    collective (or, with `keep`, those whose name contains it)."""
    if ONLY and name not in ONLY:
        return [b""]
    seen.clear()
    jax.block_until_ready(f(*args))
    if keep is None:
        picked = [b for b in seen if COLLECTIVES & set(opcodes(b))]
    else:
        picked = [b for b in seen if keep in module_name(b) and not COLLECTIVES & set(opcodes(b))]
    if not picked:
        sys.exit(f"{name}: no module kept of {[module_name(b) for b in seen]}")
    for k, b in enumerate(picked):
        path = OUT / (f"{name}.pb" if k == 0 else f"{name}_{k + 1}.pb")
        path.write_bytes(b)
        ops = sorted({o.decode() for o in opcodes(b)} & {c.decode() for c in COLLECTIVES})
        print(f"{path.name}: {module_name(b)}, {len(b)} bytes, {ops}")
    return picked


devs = jax.devices()
assert len(devs) == 8, devs
mesh = Mesh(np.array(devs), ("x",))
mesh24 = Mesh(np.array(devs).reshape(2, 4), ("a", "b"))
rev = Mesh(np.array(devs[::-1]), ("x",))


def jitted(name, f):
    """`f` jitted under `name`, so the module is `jit_NAME`."""
    def g(*a):
        return f(*a)
    g.__name__ = g.__qualname__ = name
    return jax.jit(g)


def case(name, f, *args, m=mesh, i=P("x"), o=P("x")):
    """`f` under shard_map over mesh `m`, jitted as `name`, recorded."""
    return record(name, jitted(name, jax.shard_map(f, mesh=m, in_specs=i, out_specs=o)), *args)


x = jnp.arange(64.0, dtype=jnp.float32).reshape(8, 8)
ring = [(k, (k + 1) % 8) for k in range(8)]

psum = case("psum_f32", lambda v: jax.lax.psum(v, "x"), x, o=P())
if not ONLY:
    (OUT / "psum_fallback.pb").write_bytes(psum[0])
print("psum_fallback.pb: psum_f32.pb again (psum_fallback.flags forces the fallback)")
case("pmax_i32", lambda v: jax.lax.pmax(v, "x"), jnp.arange(64, dtype=jnp.int32).reshape(8, 8), o=P())
case("psum_mesh2x4_axis_b", lambda v: jax.lax.psum(v, "b"), x, m=mesh24, i=P(("a", "b")), o=P("a"))
case("psum_mesh2x4_both", lambda v: jax.lax.psum(v, ("a", "b")), x, m=mesh24, i=P(("a", "b")), o=P())
# CPU's layout assignment gives the gathered buffers a column-major layout (`layout` attribute).
case("all_gather_axis1", lambda v: jax.lax.all_gather(v, "x", axis=1, tiled=True), x)
# XLA:CPU decomposes the array all-to-all into its tuple form (8 operands, 8 results).
case("all_to_all", lambda v: jax.lax.all_to_all(v, "x", 1, 1, tiled=True),
     jnp.arange(512.0, dtype=jnp.float32).reshape(8, 64))
case("psum_scatter", lambda v: jax.lax.psum_scatter(v, "x", scatter_dimension=1, tiled=True),
     jnp.ones((8, 64), jnp.float32))
case("ppermute_ring", lambda v: jax.lax.ppermute(v, "x", ring), x)
# Two rewrites in one module: instance ids 1 and 2, in instruction order.
case("ppermute_then_psum", lambda v: jax.lax.psum(jax.lax.ppermute(v, "x", ring) * 2.0, "x"), x, o=P())
# Shared staging (issue 25): three chained 1 MiB psums share one slot.
def psum_chain(v):
    for _ in range(3):
        v = (jax.lax.psum(v, "x") + v) % 65521
    return v


case("psum_chain", psum_chain, (jnp.arange(8 * 256 * 1024, dtype=jnp.int32) % 1000).reshape(8 * 256, 1024))


# Two independent chains (psum, pmax) get different slots; an all-gather after the psums joins
# theirs; a psum in a loop body gets a slot of its own (another computation).
def psum_chains_independent(v):
    a, b = v[:, :4], v[:, 4:]
    for _ in range(2):
        a = jax.lax.psum(a, "x") * 0.5
        b = jax.lax.pmax(b, "x") + 1.0
    c = jax.lax.all_gather(a, "x", axis=1, tiled=True)[:, :4]
    d = jax.lax.fori_loop(0, 3, lambda i, y: jax.lax.psum(y, "x") * 0.25, b)
    return jnp.concatenate([c + d, a], axis=1)


case("psum_chains_independent", psum_chains_independent, jnp.ones((64, 8), jnp.float32))
# The device assignment maps logical ids 0..7 to devices 7..0.
case("psum_reversed_devices", lambda v: jax.lax.psum(v, "x"), x, m=rev, o=P())
# XLA:CPU's float normalization turns f8 into f16 before the pass runs: the pass sees an f16
# all-gather between two converts. complex64, which CPU keeps, meets the dtype guard.
case("all_gather_f8", lambda v: jax.lax.all_gather(v, "x", axis=0, tiled=True), jnp.ones((8, 8), jnp.float8_e4m3fn))
case("all_gather_c64", lambda v: jax.lax.all_gather(v, "x", axis=0, tiled=True), jnp.ones((8, 8), jnp.complex64))


# No device meets another: the pass leaves these to XLA (a copy or nothing) unless forced
# (`psum_one_device_forced.flags`), which is how single-GPU checks run the handlers.
one = Mesh(np.array(jax.devices()[:1]), ("x",))
psum1 = case("psum_one_device", lambda v: jax.lax.psum(v, "x"), x, m=one)
if not ONLY:
    (OUT / "psum_one_device_forced.pb").write_bytes(psum1[0])
print("psum_one_device_forced.pb: psum_one_device.pb again (its .flags forces the kernel)")
mesh81 = Mesh(np.array(jax.devices()).reshape(8, 1), ("a", "b"))
case("psum_axis_of_one", lambda v: jax.lax.psum(v, "b"), x, m=mesh81, i=P(("a", "b")), o=P(("a", "b")))


def loss(w, xs, ys):
    h = jnp.tanh(xs @ w[0])
    return jnp.mean((h @ w[1] - ys) ** 2)


@jax.jit
def train_step(w, xs, ys):
    g = jax.grad(loss)(w, xs, ys)
    return [wi - 0.1 * gi for wi, gi in zip(w, g)]


# Data-parallel: the two weight gradients are summed by one variadic all-reduce.
rep, dat = NamedSharding(mesh, P()), NamedSharding(mesh, P("x"))
w = [jax.device_put(jnp.ones((16, 32)) * 0.01, rep), jax.device_put(jnp.ones((32, 4)) * 0.01, rep)]
record("mlp_train_step", train_step, w, jax.device_put(jnp.ones((64, 16)), dat), jax.device_put(jnp.ones((64, 4)), dat))

record("no_collective", jitted("no_collective", lambda v: jnp.tanh(v) * 2.0 + 1.0), x, keep="no_collective")


# The all-reduce fused with the residual add + RMSNorm (issue 35 item 3): a layer that fuses,
# and near misses that must not (`python make_inputs.py rmsnorm_layer ...` writes only these).
mesh4 = Mesh(np.array(devs[:4]), ("tp",))


def rms(h, eps=1e-6, axis=-1, dtype=jnp.bfloat16, gamma=None, d=None, cast=True):
    hf = h.astype(jnp.float32) if cast else h
    ms = jnp.mean(hf * hf, axis, keepdims=True) if d is None else jnp.sum(hf * hf, axis, keepdims=True) / d
    n = hf * jax.lax.rsqrt(ms + eps)
    if gamma is not None:
        n = n * gamma
    return n.astype(dtype)


def tp(name, f, nargs=3, dtype=jnp.bfloat16):
    args = [jnp.ones((8, 256), dtype), jnp.ones((8, 256), dtype), jnp.ones((256,), jnp.float32)][:nargs]
    g = jax.shard_map(f, mesh=mesh4, in_specs=(P(),) * nargs, out_specs=P(), check_vma=False)
    record(name, jitted(name, g), *args)


def layer_of(norm):
    def f(x, a, g):
        h = x + jax.lax.psum(a, "tp")
        return h, norm(h, g)
    return f


tp("rmsnorm_layer", layer_of(lambda h, g: rms(h, gamma=g)))
tp("rmsnorm_layer_f32_no_gamma", lambda x, a: (lambda h: (h, rms(h, dtype=jnp.float32)))(x + jax.lax.psum(a, "tp")),
   nargs=2, dtype=jnp.float32)
# Near misses: eps inside the rsqrt's argument another way, the mean over the other dimension,
# an intermediate another output reads, no f32 cast, a mean over another size.
tp("rmsnorm_eps_elsewhere", layer_of(lambda h, g: (h.astype(jnp.float32) * (jax.lax.rsqrt(
    jnp.mean(h.astype(jnp.float32) ** 2, -1, keepdims=True)) + 1e-6) * g).astype(jnp.bfloat16)))
tp("rmsnorm_other_dim", layer_of(lambda h, g: rms(h, axis=0, gamma=g)))
tp("rmsnorm_extra_user", lambda x, a, g: (lambda h: (h, rms(h, gamma=g), jnp.mean(
    h.astype(jnp.float32) * h.astype(jnp.float32), -1)))(x + jax.lax.psum(a, "tp")))
tp("rmsnorm_no_cast", layer_of(lambda h, g: rms(h, cast=False, gamma=g.astype(jnp.bfloat16))))
tp("rmsnorm_other_size", layer_of(lambda h, g: rms(h, gamma=g, d=200.0)))
