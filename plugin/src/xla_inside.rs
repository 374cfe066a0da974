//! Peerless inside XLA: the C entry points behind `jax_plugins.peerless.enable()`.
//!
//! - [`pass_entry`] (`PeerlessXlaPass`): the collective pass. A serialized HloModuleProto in; a [`PassResult`] out with
//!   the rewritten module (or none: unchanged) and a report of every decision, one tab-separated line each. It never
//!   fails a compile: a decode error or a panic comes back as status -1 with the reason, and the caller keeps the
//!   module.
//! - [`handler`] (`PeerlessXlaHandler`): the typed-FFI handler of a platform and target.
//!
//! - [`set_topology`] (`PeerlessXlaSetTopology`): what the running process tells the handlers and the pass: the job's
//!   topology, and the devices' kind as XLA names it, which the tuning profile is looked up by ([`device_kind`]).
//!
//! Thread safety: XLA runs the pass from several compile threads at once. Each call builds its own configuration
//! ([`pass_config`]); the process state here is the devices' kind per platform and the client's flags (each behind a
//! mutex), the compile's flags (thread-local), whether the Python package owns the pass and whether it is registered
//! (plus, in `emitter`, the instance counter and the tuning profiles' cache).

use std::collections::BTreeSet;
use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use emitter::xla_pass::{self, PassConfig, PassOutcome};
use emitter::{Capabilities, Flags};
use thunks::flag;

use crate::Platform;

/// What `PeerlessXlaPass` returns; free it with `PeerlessXlaPassFree`.
#[repr(C)]
#[derive(Debug)]
pub struct PassResult {
    /// 1: `module` holds the rewritten module; 0: unchanged; -1: error (unchanged, `report` says why).
    pub status: i32,
    pub module: *mut u8,
    pub module_len: usize,
    pub report: *mut u8,
    pub report_len: usize,
}

fn boxed_bytes(v: Vec<u8>) -> (*mut u8, usize) {
    let b = v.into_boxed_slice();
    let len = b.len();
    (Box::into_raw(b).cast::<u8>(), len)
}

fn result(status: i32, module: Option<Vec<u8>>, report: String) -> *mut PassResult {
    let (module, module_len) = module.map_or((std::ptr::null_mut(), 0), boxed_bytes);
    let (report, report_len) = boxed_bytes(report.into_bytes());
    Box::into_raw(Box::new(PassResult { status, module, module_len, report, report_len }))
}

/// The pass configuration for a platform, flags string and local device list. On CUDA the peer table is looked up
/// lazily ([`xla_pass::Peers::Lazy`]), only by a module with a collective that passed every other rule: the runtime's
/// probe, kept on disk for these GPUs and driver, so only the first process on a machine opens the GPUs to probe them.
/// The tuning profile is looked up by the devices' kind this process was handed ([`device_kind`]).
pub fn pass_config(platform: Platform, flags: &str, local_devices: &str) -> Result<PassConfig, String> {
    pass_config_tuned(platform, flags, local_devices, emitter::tuning::ProfileSource::from_env())
}

/// [`pass_config`] with the tuning profile from `source` rather than `PEERLESS_TUNING_PROFILE` (`peerless bench`
/// measures the pass without a profile and with the active one).
pub fn pass_config_tuned(
    platform: Platform,
    flags: &str,
    local_devices: &str,
    source: emitter::tuning::ProfileSource,
) -> Result<PassConfig, String> {
    let platform = platform.with_handlers()?;
    let mut f = Flags::from_env().map_err(|e| e.to_string())?;
    for arg in flags.split_whitespace() {
        f.apply(arg).map_err(|e| e.to_string())?;
    }
    // XLA:CPU does not overlap its collectives with compute, so the rule that leaves large partitioner-made collectives
    // to XLA (measured on GPUs) only costs there: a DP train step on 8 host devices took 0.88× XLA's time on Peerless's
    // kernels and 1.01× with the rule (docs/PERFORMANCE.md). An explicit setting wins.
    let env_flags = std::env::var(emitter::flags::ENV_VAR).unwrap_or_default();
    let explicit = |s: &str| emitter::flags::sets(s, flag::XLA_ASYNC_ABOVE_BYTES);
    if platform == Platform::Cpu && !explicit(flags) && !explicit(&env_flags) {
        f.xla_async_above_bytes = None;
    }
    // `local_devices`: this process's device ids ("0,1,2"), or the job's topology
    // ("this=0;job=...;devices=0:0,...;hosts=0:0,...") under jax.distributed, either with the devices' kind
    // (";kind=NAME") where the Python package knows it.
    let (kind, local_devices) = split_kind(local_devices);
    if let Some(kind) = kind {
        record_device_kind(platform, kind);
    }
    let local_devices = local_devices.as_str();
    let (local, topology) = if local_devices.contains('=') {
        let t = xla_pass::Topology::parse(local_devices)?;
        (t.local_devices(), Some(t))
    } else if local_devices.trim().is_empty() {
        (None, None)
    } else {
        let ids = local_devices
            .split(',')
            .map(|d| d.trim().parse::<usize>().map_err(|_| format!("bad local device id '{d}'")))
            .collect::<Result<BTreeSet<_>, _>>()?;
        (Some(ids), None)
    };
    // Every platform reaches the other processes of a host: CPU through the host protocols over shared memory, the GPUs
    // (CUDA; ROCm in a build with it) through staging shared with IPC handles.
    let caps = Capabilities {
        variadic: true,
        cross_process: true,
        // A GPU runs a device's calls in stream order; XLA:CPU may run independent ones at once.
        in_order: platform.is_gpu(),
        // The fused all-reduce + RMSNorm runs on the host runtime and on CUDA (`pl_one_shot_norm_*`); ROCm's runtime
        // refuses an epilogue. The decision of a fused call already says what was fused ("<implementation> + rmsnorm",
        // "fused: ...").
        fused_norm: matches!(platform, Platform::Cpu | Platform::Cuda),
        fused_norm_auto: platform == Platform::Cpu,
        // XLA:GPU's operation queues (`--overlap_above_bytes`): verified on CUDA only.
        async_queue: platform == Platform::Cuda,
        // Stream memory operations and copy-engine copies (`--copy_engines`): CUDA's runtime.
        copy_engines: platform == Platform::Cuda,
    };
    // The handlers learn the job (its token, the GPUs' device ids) from the Python package (`set_topology`), which also
    // hands it to every compile: an executable loaded from a persistent cache runs without this pass.
    if let Some(t) = &topology {
        learn_topology(platform, t)?;
    }
    let ordinals = topology.as_ref().map(|t| t.ordinals.clone()).filter(|o| !o.is_empty());
    let gpu = Some(platform).filter(|p| p.is_gpu());
    let allow_unsafe = f.allow_unsafe_peer_targets;
    // Plain values where the runtime knows them without opening a GPU (its own table, or the probe it kept for these
    // GPUs and driver; free memory through XLA's contexts), else a probe asked for only if a call needs it.
    let peers = match gpu {
        Some(gpu) => match crate::xla_handlers::gpu_known_peer_table(gpu, ordinals.as_ref(), allow_unsafe) {
            Some(table) => xla_pass::Peers::Known(table),
            None => xla_pass::Peers::Lazy(std::sync::Arc::new(move || {
                crate::xla_handlers::gpu_peer_table(gpu, ordinals.as_ref(), allow_unsafe)
            })),
        },
        None => xla_pass::Peers::Shared,
    };
    let device_memory = gpu.and_then(|gpu| {
        let free = crate::xla_handlers::gpu_least_free_memory(gpu);
        free.map_err(|e| log::debug!("peerless: no staging budget on {gpu}: {e}")).ok().map(|b| b as u64)
    });
    // The tuning profile decides kernel vs XLA where the flags leave it to it; explicit all-reduce thresholds (here or
    // in PEERLESS_FLAGS) keep all-reduce on them.
    let tuning = emitter::tuning::TuningConfig {
        source,
        platform: platform.name().to_owned(),
        device_kind: device_kind(platform),
        explicit_thresholds: emitter::tuning::sets_thresholds(flags) || emitter::tuning::sets_thresholds(&env_flags),
    };
    Ok(PassConfig { flags: f, peers, local_devices: local, topology, caps, instance_base: None, tuning, device_memory })
}

/// The devices' kind per platform ([`Platform::index`]), as XLA names it ("NVIDIA H200"): handed over by whoever holds
/// XLA's devices ([`record_device_kind`]).
static DEVICE_KINDS: Mutex<[Option<String>; Platform::ALL.len()]> = Mutex::new([const { None }; Platform::ALL.len()]);

/// Records the kind of `platform`'s devices as XLA names it (a PJRT device description's kind, JAX's
/// `Device.device_kind`: "cpu", "NVIDIA H200"): the Python package hands it over with the topology ([`set_topology`]),
/// the wrapper reads it from the client XLA created, the CLI from its PJRT client. The tuning profile is looked up by
/// it. An empty kind is ignored.
pub fn record_device_kind(platform: Platform, kind: &str) {
    let kind = kind.trim();
    if kind.is_empty() {
        return;
    }
    let mut kinds = DEVICE_KINDS.lock().unwrap_or_else(|e| e.into_inner());
    let slot = &mut kinds[platform.index()];
    if slot.as_deref() != Some(kind) {
        log::debug!("peerless: {platform} devices are of kind '{kind}'");
        *slot = Some(kind.to_owned());
    }
}

/// The kind of `platform`'s devices the tuning profile is looked up by: the one recorded ([`record_device_kind`]), else
/// the platform's fixed one (XLA:CPU's "cpu"), else unknown (`None`: the profile is looked up without a kind). Never
/// asks a device.
pub fn device_kind(platform: Platform) -> Option<String> {
    let recorded = DEVICE_KINDS.lock().unwrap_or_else(|e| e.into_inner())[platform.index()].clone();
    recorded.or_else(|| platform.fixed_device_kind().map(str::to_owned))
}

/// Takes the devices' kind (`kind=NAME`, the field the Python package adds to the topology string) out of a topology
/// string: the kind, if one is given, and the other fields as they were (what [`xla_pass::Topology::parse`] reads). A
/// kind is the rest of its field: it holds no `;`.
fn split_kind(s: &str) -> (Option<&str>, String) {
    let (kinds, rest): (Vec<&str>, Vec<&str>) = s.split(';').partition(|p| p.trim_start().starts_with("kind="));
    let kind = kinds.last().and_then(|p| p.trim_start().strip_prefix("kind=")).map(str::trim).filter(|k| !k.is_empty());
    (kind, rest.join(";"))
}

/// One decision per line ([`xla_pass::PassDecision::report_line`]): op, instruction, dtypes, bytes, groups, kernel
/// (1/0), implementation, reason.
pub fn report(outcome: &PassOutcome) -> String {
    outcome.decisions.iter().map(xla_pass::PassDecision::report_line).collect()
}

/// What the handlers take from the running process rather than from a compiled module (which a persistent compilation
/// cache may have kept from another job): the job's token, and on a GPU which device id each GPU (its ordinal, as XLA
/// calls the handlers) has.
fn learn_topology(platform: Platform, t: &xla_pass::Topology) -> Result<(), String> {
    thunks::runtime::set_job(t.job.as_deref())?;
    if platform.is_gpu() && !t.ordinals.is_empty() {
        crate::xla_handlers::set_gpu_device_ids(platform, t.ordinals.iter().map(|(&id, &ord)| (ord, id)).collect());
    }
    Ok(())
}

/// `PeerlessXlaSetTopology`: the job's topology as the Python package computed it (the pass's spelling,
/// `this=..;job=..;devices=..;hosts=..[;ordinals=..][;kind=..]`), for the handlers of `platform`; without `this=`,
/// `job=`, `devices=` and `hosts=` (empty, or only `kind=NAME`) it says "one process". `kind`: the devices' kind as XLA
/// names it ([`record_device_kind`]). Called once per process and platform, before any executable of the job runs,
/// whether compiled or loaded from a cache.
pub fn set_topology(platform: Platform, topology: &str) -> Result<(), String> {
    let platform = platform.with_handlers()?;
    let (kind, topology) = split_kind(topology);
    if !topology.trim().is_empty() {
        learn_topology(platform, &xla_pass::Topology::parse(&topology)?)?;
    }
    if let Some(kind) = kind {
        record_device_kind(platform, kind);
    }
    Ok(())
}

thread_local! {
    /// Per-executable flags of the compile running on this thread (`plugin::wrap` takes them out of the compile
    /// options): XLA runs its passes, ours included, on the thread that called `PJRT_Client_Compile`.
    static COMPILE_FLAGS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` (a compile) with `flags` applied by the pass after its own, on this thread.
pub fn with_compile_flags<R>(flags: Vec<String>, f: impl FnOnce() -> R) -> R {
    struct Reset(Vec<String>);
    impl Drop for Reset {
        fn drop(&mut self) {
            let old = std::mem::take(&mut self.0);
            COMPILE_FLAGS.with(|c| *c.borrow_mut() = old);
        }
    }
    let _reset = Reset(COMPILE_FLAGS.with(|c| std::mem::replace(&mut *c.borrow_mut(), flags)));
    f()
}

/// Flags from the client's create options (`peerless_flags`, set by the wrapper's `PJRT_Client_Create`): after
/// `PEERLESS_FLAGS`, before the caller's and the compile's.
static CLIENT_FLAGS: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Sets the flags a client was created with (see [`CLIENT_FLAGS`]); an unknown flag or a bad value is an error naming
/// it, and nothing is set.
pub fn set_client_flags(flags: &str) -> Result<(), String> {
    Flags::parse(flags).map_err(|e| e.to_string())?;
    *CLIENT_FLAGS.lock().unwrap_or_else(|e| e.into_inner()) = flags.to_owned();
    Ok(())
}

/// Runs the pass; see the module docs. Safe wrapper of the C entry point's body.
pub fn run_pass(platform: Platform, module: &[u8], flags: &str, local_devices: &str) -> (i32, Option<Vec<u8>>, String) {
    let per_executable = COMPILE_FLAGS.with(|c| c.borrow().join(" "));
    let client = CLIENT_FLAGS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let flags = [client.as_str(), flags, per_executable.as_str()]
        .iter()
        .filter(|f| !f.trim().is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    let flags = flags.as_str();
    let run = || -> Result<(i32, Option<Vec<u8>>, String), String> {
        // Flags are checked on every call (a bad one is an error even for an empty module); the peer table only when a
        // collective needs it. A module without a collective (the common case: XLA hands the pass every module) costs
        // the pass one walk of its bytes.
        let cfg = pass_config(platform, flags, local_devices)?;
        let outcome = xla_pass::run(module, &cfg).map_err(|e| e.to_string())?;
        let text = report(&outcome);
        // These decisions are reported now: instantiating the calls adds none of them again.
        if outcome.module.is_some() {
            thunks::runtime::reported(outcome.instances.iter().copied());
        }
        Ok((i32::from(outcome.module.is_some()), outcome.module, text))
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => failed(module, e),
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into());
            log::error!("peerless pass panicked (module left unchanged): {msg}");
            (-1, None, format!("internal error (module left unchanged): {msg}"))
        }
    }
}

/// The pass's answer to an error: the module unchanged, status -1 and the reason.
fn failed(module: &[u8], e: String) -> (i32, Option<Vec<u8>>, String) {
    // An empty module is a flag check (the Python package's `_check_flags`), whose caller reports the error once; a
    // real module's error is logged here.
    if !module.is_empty() {
        log::warn!("peerless pass: module left unchanged: {e}");
    }
    (-1, None, e)
}

/// The name the pass is registered under in XLA's transform registry (the Python package's name too: at most one of the
/// two registers it).
pub const PASS_NAME: &str = "peerless_collectives";

/// Set once the Python package loaded the wrapper: the pass is then the package's to register or leave off (it adds the
/// job's topology under jax.distributed and counts decisions for `stats()`); the wrapper's client creation does not
/// register it.
static PYTHON_OWNS_PASS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `PeerlessXlaPassFromPython`: the Python package owns the pass on the wrapped platform; called once it loaded the
/// wrapper, before any client exists.
pub fn python_owns_pass() {
    PYTHON_OWNS_PASS.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// The pass as XLA's own transform, for a process without the Python package (a C++ or ctypes PJRT client): one
/// process, every device local, flags from `PEERLESS_FLAGS` and the compile options. Decisions go to the log (`info`);
/// a module the pass cannot handle stays as it is (with a warning), as in `run_pass`.
fn transform(platform: Platform, module: &[u8]) -> Option<Vec<u8>> {
    let (status, out, report) = run_pass(platform, module, "", "");
    for line in report.lines().filter(|_| status >= 0) {
        log::info!("peerless pass ({platform}): {line}");
    }
    if status == 1 { out } else { None }
}

/// [`transform`] on `Platform::ALL[P]`, as a plain function (what XLA's registry takes).
fn transform_on<const P: usize>(module: &[u8]) -> Option<Vec<u8>> {
    transform(Platform::ALL[P], module)
}

/// Registers the pass in `inner`'s XlaTransform registry for `platform` at PRE_SCHEDULER, once per process, unless the
/// Python package owns it or `PEERLESS_ENABLE=0` (the wrapper without the pass, as under JAX). Returns whether this
/// call registered it.
pub fn register_pass_in(inner: &ffi::pjrt::InnerPlugin, platform: Platform) -> Result<bool, String> {
    static DONE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let mut done = DONE.lock().unwrap_or_else(|e| e.into_inner());
    let off = std::env::var("PEERLESS_ENABLE").as_deref() == Ok("0");
    if *done || off || PYTHON_OWNS_PASS.load(std::sync::atomic::Ordering::SeqCst) {
        return Ok(false);
    }
    if !platform.has_handlers() {
        return Err(format!("Peerless has no pass for platform '{platform}'"));
    }
    let f: ffi::pjrt::TransformFn = [transform_on::<0>, transform_on::<1>, transform_on::<2>][platform.index()];
    inner.register_xla_transform(PASS_NAME, ffi::pjrt::TransformStage::PreScheduler, f)?;
    *done = true;
    log::info!("peerless: collective pass registered in {} for {platform}", inner.path().display());
    Ok(true)
}

/// Reads a C string argument; null is "".
///
/// # Safety
/// `p` is null or a NUL-terminated string valid for the call.
pub unsafe fn c_str<'a>(p: *const c_char) -> &'a str {
    if p.is_null() {
        return "";
    }
    // SAFETY: the caller promises a NUL-terminated string alive for the call.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

/// `PeerlessXlaPass(platform, module, len, flags, local_devices)`. Never returns null.
///
/// # Safety
/// `module` points to `len` readable bytes (or is null with `len == 0`); the strings are null or NUL-terminated. The
/// result must be freed with [`pass_free`].
pub unsafe fn pass_entry(
    platform: *const c_char,
    module: *const u8,
    len: usize,
    flags: *const c_char,
    local_devices: *const c_char,
) -> *mut PassResult {
    let bytes: &[u8] = if module.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller promises `len` readable bytes at `module` for the call.
        unsafe { std::slice::from_raw_parts(module, len) }
    };
    // SAFETY: the caller promises null or NUL-terminated strings.
    let (platform, flags, local) = unsafe { (c_str(platform), c_str(flags), c_str(local_devices)) };
    let (status, module, report) = match Platform::parse(platform) {
        Ok(p) => run_pass(p, bytes, flags, local),
        Err(e) => failed(bytes, e),
    };
    result(status, module, report)
}

/// `PeerlessXlaSetTopology(platform, topology)`: [`set_topology`]; status 0, or -1 with the reason in `report`. Never
/// returns null.
///
/// # Safety
/// The strings are null or NUL-terminated. The result must be freed with [`pass_free`].
pub unsafe fn set_topology_entry(platform: *const c_char, topology: *const c_char) -> *mut PassResult {
    // SAFETY: the caller promises null or NUL-terminated strings.
    let (platform, topology) = unsafe { (c_str(platform), c_str(topology)) };
    match catch_unwind(|| set_topology(Platform::parse(platform)?, topology)) {
        Ok(Ok(())) => result(0, None, String::new()),
        Ok(Err(e)) => result(-1, None, e),
        Err(_) => result(-1, None, "internal error while setting the topology".into()),
    }
}

/// `PeerlessXlaTakeDecisions()`: the decision lines of executables this process loaded without running the pass (a
/// persistent cache hit), registered since the last call, in `report` ([`report`]'s format led by the platform and a
/// tab; status 0). Never returns null; free with [`pass_free`].
pub fn take_decisions_entry() -> *mut PassResult {
    let lines = catch_unwind(thunks::runtime::take_decisions).unwrap_or_default();
    result(0, None, lines)
}

/// Frees a [`PassResult`]; null is ignored.
///
/// # Safety
/// `r` is null or a pointer [`pass_entry`] returned that was not freed yet.
pub unsafe fn pass_free(r: *mut PassResult) {
    if r.is_null() {
        return;
    }
    // SAFETY: `r` came from `Box::into_raw` in `result` and is freed once (caller's promise).
    let r = unsafe { Box::from_raw(r) };
    for (p, n) in [(r.module, r.module_len), (r.report, r.report_len)] {
        if !p.is_null() {
            // SAFETY: `p`/`n` came from `boxed_bytes` (a boxed slice of exactly `n` bytes).
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) });
        }
    }
}

#[cfg(test)]
#[path = "../tests/unit/xla_inside.rs"]
mod tests;
