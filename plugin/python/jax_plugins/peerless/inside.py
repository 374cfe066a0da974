"""Peerless inside XLA: the collective pass and the FFI handlers, on JAX's own backends.

    import jax_plugins.peerless as peerless
    peerless.enable()          # every initialised platform Peerless supports ("cpu", "cuda", "rocm")
    ...                        # jit / shard_map as usual; XLA compiles, Peerless runs collectives
    peerless.stats()           # {"all-reduce": {"kernel": 3, "fallback": 0}, ...}
    peerless.disable()

`PEERLESS_ENABLE=1` does `enable()` when JAX starts (JAX imports this package while it
discovers plugins). `PEERLESS_FLAGS` (or `enable(flags=...)`) sets the collective flags
(`peerless flags` lists them). Each decision is logged at INFO on the `jax_plugins.peerless`
logger: op, dtype, bytes, groups, implementation and reason.

How it works: `jax.extend.xla.register_hlo_module_transformation` runs our pass at stage
PRE_SCHEDULER (after SPMD partitioning); the pass (Rust, in libpeerless_pjrt.so) rewrites
each collective it takes into a typed-FFI custom call `peerless.<op>`, whose handlers
(registered with `jax.ffi.register_ffi_target`) run Peerless's protocols: the host backend
on CPU, the peer-access kernels on XLA's stream on CUDA and, with a library built with the
cargo feature `rocm`, on ROCm (`jax-rocm7-pjrt`; never run on an AMD GPU so far).

JAX's persistent compilation cache (`jax_compilation_cache_dir`) works with Peerless on: a
compiled module holds nothing of the run that compiled it (no job token, no process), so a
later run, or another job of the same layout, may load it. Peerless adds what its decisions
depend on to JAX's cache key (the library, the flags, the platforms it is on, the job's
processes and hosts), hands the handlers the running job's token and device ids before any
executable runs, and counts the decisions of a cached executable when XLA instantiates its
Peerless calls (each carries its decision).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import secrets
import threading
from typing import Iterable

log = logging.getLogger("jax_plugins.peerless")

PASS_NAME = "peerless_collectives"
TARGETS = (
    "peerless.all_reduce",
    "peerless.all_gather",
    "peerless.all_to_all",
    "peerless.reduce_scatter",
    "peerless.collective_permute",
)
# Platforms with Peerless handlers, as JAX names them, and as XLA's FFI registry does. "rocm"
# needs a library built with the cargo feature `rocm` (`_supported()` asks the library).
SUPPORTED = {"cpu": "cpu", "cuda": "CUDA", "rocm": "ROCM"}


def _supported() -> list[str]:
    """The platforms of SUPPORTED this library has handlers for."""
    dll = _dll()
    return [p for p in SUPPORTED if p == "cpu" or dll.PeerlessXlaHandler(p.encode(), TARGETS[0].encode())]


class _PassResult(ctypes.Structure):
    _fields_ = [
        ("status", ctypes.c_int32),
        ("module", ctypes.POINTER(ctypes.c_uint8)),
        ("module_len", ctypes.c_size_t),
        ("report", ctypes.POINTER(ctypes.c_uint8)),
        ("report_len", ctypes.c_size_t),
    ]


_lock = threading.Lock()
# Held while the job's token and hosts are agreed (seconds: it waits on the other processes),
# so that two compiles, or two platforms, never agree twice: the key-value store takes each
# key once per job.
_job_lock = threading.Lock()
_state = {
    "dll": None,
    "enabled": set(),  # platforms with the pass registered
    "targets": set(),  # platforms whose FFI targets are registered (never unregistered)
    "flags": "",
    "stats": {},
    "decisions": [],
    "topology": {},  # JAX backend name -> the pass's topology string (jax.distributed jobs)
    "kinds": {},  # JAX backend name -> its devices' kind, handed to the library (one-process jobs)
    "job": None,  # (distributed client, job token, hosts): agreed once per job, for every platform
    "left_to_xla": [],  # internal failures that left a module to XLA, with their reasons
    "library_id": None,  # hash of libpeerless_pjrt.so, part of JAX's cache key
    "cache_hook": False,  # our part of JAX's persistent-cache key is installed
}


def _dll():
    if _state["dll"] is None:
        from . import library_path

        dll = ctypes.CDLL(library_path())
        dll.PeerlessXlaPass.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p]
        dll.PeerlessXlaPass.restype = ctypes.POINTER(_PassResult)
        dll.PeerlessXlaPassFree.argtypes = [ctypes.POINTER(_PassResult)]
        dll.PeerlessXlaPassFree.restype = None
        dll.PeerlessXlaHandler.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        dll.PeerlessXlaHandler.restype = ctypes.c_void_p
        dll.PeerlessXlaHandlerCalls.argtypes = [ctypes.c_char_p]
        dll.PeerlessXlaHandlerCalls.restype = ctypes.c_uint64
        dll.PeerlessXlaPassFromPython.argtypes = []
        dll.PeerlessXlaPassFromPython.restype = None
        dll.PeerlessXlaLiveCollectives.argtypes = []
        dll.PeerlessXlaStagingBytes.argtypes = []
        dll.PeerlessXlaStagingBytes.restype = ctypes.c_uint64
        dll.PeerlessXlaGpuStagingBytes.argtypes = [ctypes.c_uint64]
        dll.PeerlessXlaGpuStagingBytes.restype = ctypes.c_uint64
        dll.PeerlessXlaLiveCollectives.restype = ctypes.c_uint64
        dll.PeerlessXlaSetTopology.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        dll.PeerlessXlaSetTopology.restype = ctypes.POINTER(_PassResult)
        dll.PeerlessXlaTakeDecisions.argtypes = []
        dll.PeerlessXlaTakeDecisions.restype = ctypes.POINTER(_PassResult)
        _state["dll"] = dll
    return _state["dll"]


def _report_of(dll, res) -> tuple[int, str]:
    """(status, report) of a `_PassResult`, which is freed."""
    try:
        r = res.contents
        report = ctypes.string_at(r.report, r.report_len).decode("utf-8", "replace") if r.report_len else ""
        return r.status, report
    finally:
        dll.PeerlessXlaPassFree(res)


def _record(platform: str, report: str, cached: bool = False) -> None:
    """Counts the pass's decisions (one tab-separated line each) and logs them. `cached`:
    decisions of an executable this process loaded without running the pass (a persistent
    compilation cache hit), as its Peerless calls carry them."""
    with _lock:
        for line in report.splitlines():
            f = line.split("\t")
            if len(f) != 8:
                continue
            op, instr, dtype, nbytes, groups, kernel, impl, reason = f
            key = "kernel" if kernel == "1" else "fallback"
            counts = _state["stats"].setdefault(op, {"kernel": 0, "fallback": 0})
            counts[key] += 1
            if kernel == "1" and "across processes" in reason:
                counts["cross_process"] = counts.get("cross_process", 0) + 1
            _state["decisions"].append(
                {
                    "platform": platform,
                    "op": op,
                    "instruction": instr,
                    "dtype": dtype,
                    "bytes": int(nbytes),
                    "groups": groups,
                    "implementation": impl,
                    "reason": reason,
                    "cached": cached,
                }
            )
            log.info("%s%s %s %s %s B groups=%s -> %s: %s", "(cached executable) " if cached else "", op, instr,
                     dtype, nbytes, groups, impl, reason)


def _collect() -> None:
    """Counts the decisions of executables loaded without the pass since the last call (the
    handlers registered them when XLA instantiated their calls)."""
    dll = _state["dll"]
    if dll is None:
        return  # nothing loaded the library: no handler ran
    _, text = _report_of(dll, dll.PeerlessXlaTakeDecisions())
    by_platform: dict[str, list[str]] = {}
    for line in text.splitlines():
        platform, _, rest = line.partition("\t")
        by_platform.setdefault(platform, []).append(rest)
    for platform, lines in by_platform.items():
        _record(platform, "\n".join(lines), cached=True)


def _kv_barrier_get(client, key: str, timeout_ms: int) -> str:
    v = client.blocking_key_value_get(key, timeout_ms)
    return v.decode() if isinstance(v, bytes) else v


def _job_hosts(client, this: int, nproc: int) -> tuple[str, dict[int, int]]:
    """The job's token and each process's host, agreed through the job's key-value store.

    "Host" is a shared-memory domain, tested rather than assumed from host names (containers
    on one machine may not share /dev/shm): every process leaves a nonce in /dev/shm, reads
    the others', and publishes whom it saw; processes that see each other share a host."""
    timeout = int(os.environ.get("PEERLESS_TOPOLOGY_TIMEOUT_MS", "60000"))
    if this == 0:
        job = secrets.token_hex(16)
        client.key_value_set("peerless/job", job)
    else:
        job = _kv_barrier_get(client, "peerless/job", timeout)
    if os.environ.get("PEERLESS_SHARED_MEMORY", "") == "0":
        # The user says processes share no memory: each is its own host.
        return job, {q: q for q in range(nproc)}
    nonce = secrets.token_hex(16)
    mine = f"/dev/shm/peerless-{job}-p{this}"
    try:
        fd = os.open(mine, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.write(fd, nonce.encode())
        os.close(fd)
    except OSError as e:  # no /dev/shm: every process is its own host
        log.warning("peerless: no shared memory (%s): groups across processes use XLA's collectives", e)
        mine = None
    try:
        client.key_value_set(f"peerless/{job}/nonce/{this}", nonce)
        sees = []
        for q in range(nproc):
            want = _kv_barrier_get(client, f"peerless/{job}/nonce/{q}", timeout)
            try:
                with open(f"/dev/shm/peerless-{job}-p{q}") as fh:
                    if fh.read() == want:
                        sees.append(q)
            except OSError:
                pass
        client.key_value_set(f"peerless/{job}/sees/{this}", ",".join(map(str, sees)))
        # Every process has looked once all have published (so files may go after this).
        views = {q: {int(x) for x in _kv_barrier_get(client, f"peerless/{job}/sees/{q}", timeout).split(",") if x}
                 for q in range(nproc)}
    finally:
        if mine:
            os.unlink(mine)
    hosts = {q: min([p for p in views[q] if q in views[p]] + [q]) for q in range(nproc)}
    return job, hosts


def _job_of(client, this: int, nproc: int) -> tuple[str, dict[int, int]]:
    """The job's token and hosts (`_job_hosts`), agreed once per job and shared by every
    platform: each of `PEERLESS_ENABLE=1`'s platforms (cpu and cuda in a GPU job) asks, and a
    second agreement would publish the job's keys again (ALREADY_EXISTS), leaving every module
    of that platform to XLA. A new `jax.distributed` client is a new job."""
    with _job_lock:
        known = _state["job"]
        if known is not None and known[0] is client:
            return known[1], known[2]
        job, hosts = _job_hosts(client, this, nproc)
        _state["job"] = (client, job, hosts)
        return job, hosts


def _left_to_xla(platform: str, why: str) -> None:
    """Records an internal failure that left a whole module to XLA, where users look:
    `stats()["left_to_xla"]` counts them and `decisions()` holds each with its reason."""
    with _lock:
        _state["left_to_xla"].append(
            {"platform": platform, "op": "module", "instruction": "", "dtype": "", "bytes": 0, "groups": "",
             "implementation": "fallback (Peerless error: the whole module left to XLA)", "reason": why,
             "cached": False})
    log.warning("peerless: %s: the pass leaves this module to XLA", why)


def _device_kind(backend) -> str:
    """The kind of the backend's local devices as XLA names it ("cpu", "NVIDIA H200"), which the
    pass looks its tuning profile up by; "" when unknown (the profile is then looked up without
    one). A kind is a field of the topology string: it holds no ";"."""
    try:
        devices = backend.local_devices()
        kind = str(devices[0].device_kind) if devices else ""
    except Exception as e:  # noqa: BLE001 - the profile is then looked up without a kind
        log.debug("peerless: the devices' kind is unknown (%s)", e)
        return ""
    return "" if ";" in kind else kind.strip()


def _hand_kind(backend_name: str, platform: str) -> None:
    """One process: hands the library the kind of the backend's devices, once (the pass looks
    its tuning profile up by it; the library never opens a GPU to learn it)."""
    with _lock:
        if backend_name in _state["kinds"]:
            return
    from jax._src import xla_bridge

    try:
        backend = xla_bridge.get_backend(backend_name)
    except Exception as e:  # noqa: BLE001 - never a reason to leave a module to XLA; asked again
        log.debug("peerless: no %s backend to ask the devices' kind (%s)", backend_name, e)
        return
    kind = _device_kind(backend)
    with _lock:
        if backend_name in _state["kinds"]:
            return
        _state["kinds"][backend_name] = kind
    if not kind:
        log.info("peerless: the %s devices' kind is unknown: the tuning profile is looked up without one", platform)
        return
    status, why = _report_of(_dll(), _dll().PeerlessXlaSetTopology(platform.encode(), f"kind={kind}".encode()))
    if status < 0:
        log.warning("peerless: cannot hand over the %s devices' kind %r: %s", platform, kind, why)


def _topology(backend_name: str, platform: str) -> str:
    """What the pass knows of the processes: this process's device ids in one process, or
    under jax.distributed the job's topology (`this=P;job=HEX;devices=ID:P,..;hosts=P:H,..`,
    then `;ordinals=..` on GPUs and `;kind=NAME`, the devices' kind), computed once
    (collectively: every process compiles the same programs). In one process the devices'
    kind goes to the library on its own (`_hand_kind`)."""
    from jax._src import distributed

    gs = distributed.global_state
    if gs.client is None or (gs.num_processes or 1) <= 1:
        _hand_kind(backend_name, platform)
        return ""  # one process: every device is local
    with _lock:
        cached = _state["topology"].get(backend_name)
    if cached is not None:
        return cached
    from jax._src import xla_bridge

    backend = xla_bridge.get_backend(backend_name)
    this, nproc = backend.process_index(), gs.num_processes
    job, hosts = _job_of(gs.client, this, nproc)
    devices = ",".join(f"{d.id}:{d.process_index}" for d in backend.devices())
    topo = f"this={this};job={job};devices={devices};hosts=" + ",".join(f"{q}:{h}" for q, h in sorted(hosts.items()))
    if platform in ("cuda", "rocm"):
        # XLA calls a GPU's handlers with its CUDA / HIP ordinal, which is not its id here.
        topo += ";ordinals=" + ",".join(f"{d.id}:{d.local_hardware_id}" for d in backend.local_devices())
    kind = _device_kind(backend)
    if kind:
        # The tuning profile is looked up by it; the library never opens a GPU to learn it.
        topo += f";kind={kind}"
    log.info("peerless: process %d of %d, hosts %s, platform %s", this, nproc, hosts, platform)
    with _lock:
        _state["topology"].setdefault(backend_name, topo)
        topo = _state["topology"][backend_name]
    # The handlers take the job's token (and a GPU's device id) from here, not from the
    # compiled module: an executable from a persistent cache was compiled by another job.
    status, why = _report_of(_dll(), _dll().PeerlessXlaSetTopology(platform.encode(), topo.encode()))
    if status < 0:
        raise RuntimeError(f"Peerless cannot use the job's topology {topo!r}: {why}")
    return topo


def _layout(topo: str) -> str:
    """What of a topology the pass's decisions depend on, the same in every process and job:
    which process owns each device and which processes share a host (not this process, the
    job's token or local ordinals)."""
    return ";".join(p for p in topo.split(";") if p.split("=", 1)[0] in ("devices", "hosts"))


def _library_id() -> str:
    if _state["library_id"] is None:
        from . import library_path

        h = hashlib.sha256()
        with open(library_path(), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _state["library_id"] = h.hexdigest()[:32]
    return _state["library_id"]


def _tuning_key() -> str:
    """What the pass's tuning profile depends on: PEERLESS_TUNING_PROFILE, and the
    profiles in the cache's tuning/ directory (names, sizes, times), which `peerless tune`
    rewrites."""
    env = os.environ.get("PEERLESS_TUNING_PROFILE", "")
    paths = []
    if env and env not in ("0", "off", "none"):
        paths = [env]
    elif not env:
        base = os.environ.get("PEERLESS_CACHE_DIR") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "peerless")
        d = os.path.join(base, "tuning")
        try:
            paths = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".json"))
        except OSError:
            paths = []
    stamps = []
    for p in paths:
        try:
            st = os.stat(p)
            stamps.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            stamps.append(f"{p}:missing")
    return env + "|" + ",".join(stamps)


def _cache_key_part() -> str:
    """Peerless's part of JAX's persistent-cache key: empty while Peerless is off (programs
    compiled then are XLA's alone), else what its rewrite depends on, so that an executable
    compiled with other Peerless settings, another build, or for another layout of processes
    and hosts is never handed back."""
    with _lock:
        enabled = sorted(_state["enabled"])
        flags = _state["flags"]
    if not enabled:
        return ""
    parts = [f"peerless={_library_id()}", f"flags={flags}", f"env_flags={os.environ.get('PEERLESS_FLAGS', '')}",
             f"tuning={_tuning_key()}"]
    for p in enabled:
        try:
            layout = _layout(_topology(p, _wrapped(p) or p))
        except Exception as e:  # noqa: BLE001 - the pass then leaves every module to XLA
            log.warning("peerless: process topology unknown (%s)", e)
            layout = "unknown"
        parts.append(f"{p}:{layout}")
    return ";".join(parts)


def _install_cache_hook() -> None:
    """Adds `_cache_key_part` to JAX's persistent-cache key (`jax._src.cache_key.custom_hook`,
    which JAX hashes into every key), after whatever hook was there."""
    if _state["cache_hook"]:
        return
    try:
        from jax._src import cache_key
    except Exception as e:  # noqa: BLE001
        log.warning("peerless: cannot extend JAX's compilation-cache key (%s): do not share a persistent "
                    "cache between runs with and without Peerless", e)
        return
    previous = getattr(cache_key, "custom_hook", None)

    def hook() -> str:
        base = previous() if previous is not None else ""
        mine = _cache_key_part()
        return f"{base}|peerless:{mine}" if mine else base

    cache_key.custom_hook = hook
    _state["cache_hook"] = True


def _make_pass(platform: str, local_devices: str | None = None, backend: str | None = None):
    """The pass for XLA's `platform` ("cpu", "cuda", "rocm") on JAX backend `backend` (default the
    same name). `local_devices` fixes the process view; None: found at each compile (it
    changes when jax.distributed starts)."""
    dll = _dll()
    plat = platform.encode()

    def run(module: bytes):
        # XLA calls this from its compile threads; the Rust side is thread-safe and never
        # raises (errors come back as "unchanged" with the reason).
        flags = _state["flags"].encode()
        try:
            local = (local_devices if local_devices is not None else _topology(backend or platform, platform)).encode()
        except Exception as e:  # noqa: BLE001 - the pass never breaks a compile
            _left_to_xla(platform, f"process topology unknown ({e})")
            return None
        res = dll.PeerlessXlaPass(plat, module, len(module), flags, local)
        if not res:
            return None
        try:
            r = res.contents
            report = ctypes.string_at(r.report, r.report_len).decode("utf-8", "replace") if r.report_len else ""
            if r.status < 0:
                _left_to_xla(platform, f"the pass failed ({report})")
                return None
            _record(platform, report)
            if r.status == 1:
                return ctypes.string_at(r.module, r.module_len)
            return None
        finally:
            dll.PeerlessXlaPassFree(res)

    return run


def _check_flags(flags: str) -> None:
    """Raises ValueError for flags the pass would reject (every compile would otherwise log a
    warning and rewrite nothing). The pass on an empty module checks only the flags."""
    dll = _dll()
    res = dll.PeerlessXlaPass(b"cpu", None, 0, flags.encode(), b"")
    try:
        r = res.contents
        if r.status < 0:
            msg = ctypes.string_at(r.report, r.report_len).decode("utf-8", "replace")
            raise ValueError(f"Peerless flags {flags!r}: {msg}")
    finally:
        dll.PeerlessXlaPassFree(res)


def _register_targets(platform: str) -> None:
    import jax

    if platform in _state["targets"]:
        return
    dll = _dll()
    xla_platform = SUPPORTED[platform]
    fn_type = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
    for target in TARGETS:
        addr = dll.PeerlessXlaHandler(platform.encode(), target.encode())
        if not addr:
            raise RuntimeError(f"libpeerless_pjrt.so has no {platform} handler for {target}")
        cap = jax.ffi.pycapsule(fn_type(addr))
        # One function serves every stage: INSTANTIATE hands XLA per-executable state (the
        # collective's instance, freed with the executable); INITIALIZE sets up this
        # device's part of it outside any command-buffer capture (CUDA); EXECUTE runs it.
        stages = {"instantiate": cap, "initialize": cap, "execute": cap}
        jax.ffi.register_ffi_target(target, stages, platform=xla_platform, api_version=1)
    _state["targets"].add(platform)


def _register_pass(platform: str, inner: str | None = None) -> None:
    from jax.extend import xla as jxla

    jxla.register_hlo_module_transformation(
        _make_pass(inner or platform, backend=platform),
        name=PASS_NAME,
        stage=jxla.PipelineStage.PRE_SCHEDULER,
        platforms=[platform],
    )


def enable(platforms: str | Iterable[str] | None = None, *, flags: str | None = None) -> list[str]:
    """Runs Peerless's collective pass and handlers inside XLA for `platforms` ("cpu",
    "cuda", "rocm"; "gpu", as `jax.Device.platform` says, is whichever of the last two is
    initialised; None: every initialised platform Peerless supports). Returns the platforms
    enabled. Calling it again for an enabled platform changes nothing but the flags."""
    from jax._src import xla_bridge

    xla_bridge.backends()  # the plugins are loaded (and a wrapper known) from here on
    _install_cache_hook()
    if flags is not None:
        _check_flags(flags)
        _state["flags"] = flags
    elif not _state["flags"]:
        _state["flags"] = os.environ.get("PEERLESS_FLAGS", "")
        _check_flags(_state["flags"])
    supported = _supported()
    if platforms is None:
        wanted = [p for p in xla_bridge.backends() if p in supported or _wrapped(p)]
    else:
        wanted = [platforms] if isinstance(platforms, str) else list(platforms)
        # `jax.Device.platform` says "gpu" for CUDA and ROCm devices: take it to mean
        # whichever of them is initialised.
        gpus = [p for p in xla_bridge.backends() if p in ("cuda", "rocm")]
        wanted = list(dict.fromkeys(q for p in wanted for q in ((gpus or [p]) if p == "gpu" else [p])))
    for p in wanted:
        if p not in supported and not _wrapped(p):
            why = " (this library was built without the cargo feature `rocm`)" if p in SUPPORTED else ""
            raise ValueError(f"Peerless has no handlers for platform {p!r}{why} (supported: {sorted(supported)})")
    done = []
    for p in wanted:
        if _wrapped(p):
            # libpeerless_pjrt.so wrapping XLA's plugin registered the handlers in that
            # plugin's FFI registry when it was loaded; the pass goes through its
            # XlaTransform extension, deciding for the inner platform's devices.
            if p not in _state["enabled"]:
                _register_pass(p, inner=_wrapped(p))
                _state["enabled"].add(p)
        else:
            _register_targets(p)
            if p not in _state["enabled"]:
                _register_pass(p)
                _state["enabled"].add(p)
        done.append(p)
    _learn_topology(done)
    return done


def _learn_topology(platforms: list[str]) -> None:
    """Under jax.distributed, agrees on the job's topology now (every process calls enable())
    and hands it to the handlers, so that an executable this process never compiles or looks
    up (one deserialized by hand) still finds the job's token and device ids. Without a job
    yet (PEERLESS_ENABLE=1 at import), the first compile or cache lookup does it."""
    from jax._src import distributed

    gs = distributed.global_state
    if gs.client is None or (gs.num_processes or 1) <= 1:
        return
    for p in platforms:
        try:
            _topology(p, _wrapped(p) or p)
        except Exception as e:  # noqa: BLE001 - the first compile tries again
            log.warning("peerless: the job's topology is not known yet (%s)", e)


def _wrapped(platform: str) -> str | None:
    """For the "peerless" backend wrapping XLA's plugin, the Peerless platform of its devices
    ("cpu", "cuda", "rocm"); else None."""
    from . import PLATFORM, wrapped

    return wrapped() if platform == PLATFORM else None


def disable(platforms: str | Iterable[str] | None = None) -> None:
    """Stops rewriting collectives for newly compiled programs (compiled ones keep their
    Peerless custom calls, whose handlers stay registered)."""
    from jax.extend import xla as jxla

    wanted = set(_state["enabled"]) if platforms is None else ({platforms} if isinstance(platforms, str) else set(platforms))
    for p in sorted(wanted & _state["enabled"]):
        jxla.clear_hlo_module_transformation(PASS_NAME, jxla.PipelineStage.PRE_SCHEDULER, platforms=[p])
        _state["enabled"].discard(p)


def enabled() -> list[str]:
    return sorted(_state["enabled"])


def stats() -> dict:
    """Decisions over the modules compiled, or loaded from JAX's persistent compilation cache
    (those with a Peerless call: each carries its module's decisions), since `enable` (HLO op names):
    {"all-reduce": {"kernel": n, "fallback": m, "cross_process": k}, ...}, where
    `cross_process` counts the kernels whose groups span processes of one host (shared
    memory; present once there is one). `"left_to_xla": {"modules": n}` (present once there
    is one) counts modules an internal failure left wholly to XLA; `decisions()` says why."""
    _collect()
    with _lock:
        out = {op: dict(v) for op, v in sorted(_state["stats"].items())}
        if _state["left_to_xla"]:
            out["left_to_xla"] = {"modules": len(_state["left_to_xla"])}
        return out


def decisions() -> list[dict]:
    """Every decision since `enable` (or `reset_stats`), with its reason; `cached` says it
    came from an executable loaded from JAX's persistent cache rather than from the pass.
    A module an internal failure left wholly to XLA appears as one entry with op "module"
    and the failure as its reason (after the collectives' decisions)."""
    _collect()
    with _lock:
        return [dict(d) for d in _state["decisions"]] + [dict(d) for d in _state["left_to_xla"]]


def handler_calls(platform: str = "cpu") -> int:
    """Execute-stage calls of Peerless's handlers on `platform` so far. A call XLA captured
    into a command buffer and replays does not reach the handler, so this stays behind the
    number of executions then."""
    return int(_dll().PeerlessXlaHandlerCalls(platform.encode()))


def live_collectives() -> int:
    """Collective clusters the CPU handlers hold now; each is freed with its executable."""
    return int(_dll().PeerlessXlaLiveCollectives())


def staging_bytes() -> int:
    """Staging bytes Peerless's CPU handlers hold now, all devices of the process together
    (in-process groups). Collectives that every device runs in one order share one slot,
    so this grows with the collectives that may run at once, not with their
    number; it is freed with the executables."""
    return int(_dll().PeerlessXlaStagingBytes())


def staging_by_device() -> dict:
    """Memory Peerless's collectives hold now, per device of this process: {"cpu": bytes of
    the CPU handlers' staging, "cuda:0": bytes of device memory on GPU 0 (staging, signal
    flags, status words; "rocm:0" where Peerless runs on ROCm), ...}; a GPU appears once it
    holds any. On every platform collectives that every device runs in one order share one
    slot, so this grows with the collectives that may run at once, not with their
    number."""
    from . import wrapped

    dll = _dll()
    out = {"cpu": int(dll.PeerlessXlaStagingBytes())}
    gpu = "rocm" if "rocm" in _state["enabled"] or wrapped() == "rocm" else "cuda"
    for ordinal in range(8):  # MAX_RANKS: the GPU handlers' GPUs per process
        held = int(dll.PeerlessXlaGpuStagingBytes(ordinal))
        if held:
            out[f"{gpu}:{ordinal}"] = held
    return out


def reset_stats() -> None:
    _collect()
    with _lock:
        _state["stats"].clear()
        _state["decisions"].clear()
        _state["left_to_xla"].clear()


def enable_wrapped_at_start(c_api, platform: str) -> None:
    """`JAX_PLATFORMS=peerless` wrapping XLA's plugin: the pass goes on that plugin's
    XlaTransform extension as soon as JAX has loaded it (before any client exists), deciding
    for the inner `platform`'s devices ("cpu", "cuda", "rocm")."""
    from jax._src.lib import _xla

    from . import PLATFORM

    if not _state["flags"]:
        _state["flags"] = os.environ.get("PEERLESS_FLAGS", "")
    _xla.register_xla_transform_c_api(c_api, PASS_NAME, 0, _make_pass(platform, backend=PLATFORM))
    _state["enabled"].add(PLATFORM)
    _install_cache_hook()


def enable_at_start() -> None:
    """`PEERLESS_ENABLE=1`: called while JAX discovers plugins, before any backend exists.
    CPU registers at once (XLA's CPU pass and FFI registries are process-global); PJRT
    plugins (cuda, rocm) register from JAX's plugin callback, once their C API is loaded."""
    from jax._src import xla_bridge

    flags = os.environ.get("PEERLESS_FLAGS", "")
    if flags:
        # Once, here, rather than a warning from every compile: JAX logs this as its plugin
        # configuration error and starts without Peerless.
        try:
            _check_flags(flags)
        except ValueError as e:
            raise ValueError(f"PEERLESS_ENABLE=1: {e}\n(`peerless flags` lists them; Peerless is off in this "
                             "process: fix or unset PEERLESS_FLAGS)") from None
    _state["flags"] = flags

    def on_plugin(c_api=None):
        for name, factory in list(xla_bridge._backend_factories.items()):
            if factory.c_api is c_api and name in _supported() and name not in _state["enabled"]:
                from jax._src.lib import _xla

                _register_targets(name)
                _xla.register_xla_transform_c_api(c_api, PASS_NAME, 0, _make_pass(name))
                _state["enabled"].add(name)

    from jax._src.lib import _xla

    _register_targets("cpu")
    _xla.register_xla_transform(PASS_NAME, 0, _make_pass("cpu"))
    _state["enabled"].add("cpu")
    _install_cache_hook()
    xla_bridge.register_plugin_callbacks(on_plugin)
