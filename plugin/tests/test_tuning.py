"""Tuning profiles inside XLA: the pass reads the profile PEERLESS_TUNING_PROFILE
names, decides kernel vs XLA by its measured figures, and every such decision's reason names
the profile and the figures (`decisions()`, `stats()`); flags still win, and `0` turns the
profile off. With PEERLESS_TUNED_PROFILE set (scripts/test.sh: a profile `peerless tune
--quick` just wrote) the pass also reads that real tune's output.

XLA:CPU with 8 host devices, as test_xla_inside.py."""

import json
import os

_COUNT_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _COUNT_FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

import jax_plugins.peerless as peerless  # noqa: E402

CPU = "cpu"
N = 8


@pytest.fixture(autouse=True)
def _pass_disabled():
    peerless.disable(CPU)
    yield
    peerless.disable(CPU)


def write_profile(path):
    """All-reduce: the one-shot kernel wins; all-gather: XLA wins (figures made up, clearly)."""
    one, xla = "one-shot all-reduce", "xla"
    profile = {
        "format": 1,
        "peerless_version": "0.1.0",
        "key": {"platform": "cpu", "device_kind": "cpu", "devices": N, "links": "host"},
        "measured": {"date": "2026-11-26", "machine": "test", "command": "test_tuning.py"},
        "entries": [
            {"op": "all-reduce", "dtype": "f32", "group": N,
             "points": [{"bytes": b, "us": {one: 11.0, "two-shot all-reduce": 22.0, xla: 33.0}} for b in (16, 1 << 20)]},
            {"op": "all-gather", "dtype": "f32", "group": N,
             "points": [{"bytes": b, "us": {"direct all-gather": 44.0, xla: 5.0}} for b in (16, 1 << 20)]},
        ],
    }
    path.write_text(json.dumps(profile, indent=1))
    return str(path)


def program():
    mesh = Mesh(np.array(jax.devices(CPU)[:N]), ("x",))

    def body(v):
        # The psum reads the all-gather's result: on XLA:CPU a Peerless call must be ordered
        # with a collective the profile leaves to XLA, or it stays XLA's too.
        g = jax.lax.all_gather(v, "x", tiled=True)
        return jax.lax.psum(v + g[: v.shape[0]], "x"), g

    f = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P("x")))
    x = jnp.arange(N * 64, dtype=jnp.float32)
    return f, x


def compile_and_run(flags=None):
    """Decisions and stats of one compile with the pass on; checks the result against XLA's."""
    f, x = program()
    jax.clear_caches()
    want = jax.jit(f)(x)
    peerless.reset_stats()
    jax.clear_caches()
    peerless.enable(CPU, flags=flags if flags is not None else "")
    try:
        got = jax.jit(f)(x)
    finally:
        peerless.disable(CPU)
        jax.clear_caches()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    return {d["op"]: d for d in peerless.decisions()}, peerless.stats()


def test_the_pass_decides_by_the_profile_and_cites_it(tmp_path, monkeypatch):
    path = write_profile(tmp_path / "profile.json")
    monkeypatch.setenv("PEERLESS_TUNING_PROFILE", path)
    d, st = compile_and_run()
    ar, ag = d["all-reduce"], d["all-gather"]
    assert ar["implementation"] == "kernel (one-shot all-reduce)", ar
    assert f"profile {path}: all-reduce f32 groups of 8 at 256 B: XLA 33 µs, one-shot 11 µs, two-shot 22 µs" in ar["reason"], ar
    assert ag["implementation"] == "fallback", ag
    assert ag["reason"].startswith(f"profile {path}: all-gather f32 groups of 8 at 256 B: XLA 5 µs, kernel 44 µs"), ag
    assert ag["reason"].endswith("-> XLA"), ag
    assert st["all-reduce"] == {"kernel": 1, "fallback": 0} and st["all-gather"] == {"kernel": 0, "fallback": 1}, st


def test_flags_win_over_the_profile(tmp_path, monkeypatch):
    path = write_profile(tmp_path / "profile.json")
    monkeypatch.setenv("PEERLESS_TUNING_PROFILE", path)
    d, _ = compile_and_run("--all_gather_backend=kernel --one_shot_max_bytes=0")
    assert d["all-gather"]["implementation"] == "kernel (direct all-gather)", d
    assert "profile" not in d["all-gather"]["reason"], d
    # An explicit threshold gives all-reduce back to the thresholds.
    assert d["all-reduce"]["implementation"] == "kernel (two-shot all-reduce)", d
    assert "one_shot_max_bytes=0" in d["all-reduce"]["reason"], d


def test_profile_off(monkeypatch):
    monkeypatch.setenv("PEERLESS_TUNING_PROFILE", "0")
    d, _ = compile_and_run()
    assert d["all-reduce"]["reason"].startswith("256 bytes <= one_shot_max_bytes=262144"), d
    assert d["all-gather"]["implementation"] == "kernel (direct all-gather)", d


def test_an_unreadable_profile_never_breaks_a_compile(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    monkeypatch.setenv("PEERLESS_TUNING_PROFILE", str(bad))
    d, _ = compile_and_run()
    assert "profile" not in d["all-reduce"]["reason"], d


def test_a_tuned_profile_is_read():
    """The profile `peerless tune --quick` wrote (scripts/test.sh sets PEERLESS_TUNED_PROFILE):
    every decision's reason cites it."""
    path = os.environ.get("PEERLESS_TUNED_PROFILE")
    if not path:
        pytest.skip("PEERLESS_TUNED_PROFILE not set (scripts/test.sh runs peerless tune --quick first)")
    old = os.environ.get("PEERLESS_TUNING_PROFILE")
    os.environ["PEERLESS_TUNING_PROFILE"] = path
    try:
        d, _ = compile_and_run()
    finally:
        if old is None:
            del os.environ["PEERLESS_TUNING_PROFILE"]
        else:
            os.environ["PEERLESS_TUNING_PROFILE"] = old
    for op in ("all-reduce", "all-gather"):
        assert f"profile {path}: {op} f32 groups of 8 at 256 B" in d[op]["reason"], d[op]
