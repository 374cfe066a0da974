//! Every decision rule, in one place: for each collective, a Peerless kernel or XLA's own collective, and why, in
//! words. [`decide_tuned`] applies rules 1–7 (the HLO collective alone, logical ids; the tests
//! call it); [`decide_in_run`] applies rule 0, then those, then rules 8–13, which need the pass's run. First match
//! wins:
//! 0. inside JAX's async API where calls do not run beside compute → fallback.
//! 1. no Peerless kernel for the op, or backend flag `fallback` → fallback.
//! 2. dtype guard on the *operands'* element types.
//! 3. more than one operand → fallback, unless [`crate::Capabilities`] take variadic all-reduce / tuple all-to-all.
//! 4. all-reduce / reduce-scatter: `to_apply` must be a recognised reduction.
//! 5. uniform groups of at most [`MAX_GROUP_SIZE`] (single-member: a local copy); a permute checks its pairs.
//! 6. peer access both ways between devices that exchange data (logical ids; rule 13 checks the real devices).
//! 7. size: the copy-engine form from `--copy_engines=N` bytes ([`Capabilities::copy_engines`]); else the tuning
//!    profile's fastest ([`crate::tuning`]; with `--copy_engines=auto` copy engines too; not for a call beside
//!    compute); else all-reduce one-shot up to `one_shot_max_bytes`, two-shot up to `two_shot_max_bytes`, fallback
//!    above; other ops take kernels at any size.
//! 8. groups in which no device meets another (device ids) → fallback, unless forced.
//! 9. a group across hosts → fallback; across processes of one host → shared memory, with a job token.
//! 10. a partitioner-made collective above `xla_async_above_bytes`, not beside compute → fallback.
//! 11. a start/done pair must have a form the pass rewrites.
//! 12. operands and results must agree on a layout the handler can work in.
//! 13. peer access on the devices that really talk, last: the one rule that may open the GPUs.
//!
//! With a backend flag of `kernel`, a rule 1–7 that says "fallback" is an error instead.

use hlo::analysis::{self, ReductionKind};
use hlo::{InstrId, Instruction, Module, Opcode, PrimitiveType};
use thunks::custom_call::{CustomCallConfig, target_name};
use thunks::flag::{COPY_ENGINES, ONE_SHOT_MAX_BYTES, OVERLAP_ABOVE_BYTES, TWO_SHOT_MAX_BYTES, XLA_ASYNC_ABOVE_BYTES};
use thunks::{
    CollectiveConfig, CollectiveKind, CollectiveOp, Decision, Implementation, KernelAlgorithm, fmt_groups, fmt_pairs,
};

use crate::flags::{Backend, CopyEngines, Flags};
use crate::peers::PeerAccessTable;
use crate::tuning::Tuning;
use crate::xla_pass::{
    ASYNC_QUEUE, Assignment, Form, Layouts, LeafLayout, PassConfig, PassDecision, PeerLookup, Rewrite, next_instance,
};
use crate::{EmitError, kernel_accepts_dtype};

/// Most members a group may have for a kernel: the kernels keep one peer pointer per member (XLA's
/// `kMaxNumAllReduceInputPtrs = 8`, collective_anchors.md §1 "Limits").
pub const MAX_GROUP_SIZE: usize = 8;

fn invalid(ins: &Instruction, message: String) -> EmitError {
    EmitError::InvalidCollective { instr: ins.name.clone(), message }
}

/// The default kernel for an op (all-reduce: one-shot).
fn default_kernel(kind: CollectiveKind) -> Option<KernelAlgorithm> {
    Some(match kind {
        CollectiveKind::AllReduce => KernelAlgorithm::OneShotAllReduce,
        CollectiveKind::AllGather => KernelAlgorithm::DirectAllGather,
        CollectiveKind::AllToAll => KernelAlgorithm::DirectAllToAll,
        CollectiveKind::ReduceScatter => KernelAlgorithm::DirectReduceScatter,
        CollectiveKind::CollectivePermute => KernelAlgorithm::DirectPermute,
        CollectiveKind::RaggedAllToAll | CollectiveKind::CollectiveBroadcast => return None,
    })
}

/// Builds the config of collective `ins`, returning it with every operand element type.
fn config(
    module: &Module,
    ins: &Instruction,
    op: CollectiveOp,
    num_replicas: usize,
    num_partitions: usize,
    id: InstrId,
) -> Result<(CollectiveConfig, Vec<PrimitiveType>), EmitError> {
    let mut types = Vec::new();
    let mut bytes = 0usize;
    for &o in &ins.operands {
        let shape = &module
            .instrs
            .get(o)
            .ok_or_else(|| invalid(ins, format!("{op} '{}': operand {o} does not exist", ins.name)))?
            .shape;
        types.extend(shape.leaves().iter().map(|a| a.ty));
        bytes = bytes.saturating_add(shape.byte_size());
    }
    let Some(&element_type) = types.first() else {
        return Err(invalid(ins, format!("{op} '{}' has no array operand", ins.name)));
    };
    let groups = analysis::device_groups(module, id, num_replicas, num_partitions).map_err(|m| invalid(ins, m))?;
    let source_target_pairs = if op.kind == CollectiveKind::CollectivePermute {
        analysis::permute_pairs(module, id, num_replicas, num_partitions).map_err(|m| invalid(ins, m))?
    } else {
        Vec::new()
    };
    let reduction = match op.kind {
        CollectiveKind::AllReduce | CollectiveKind::ReduceScatter => {
            ins.called.first().and_then(|&c| analysis::recognize_reduction(module, c))
        }
        _ => None,
    };
    let dimension = match op.kind {
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => {
            ins.attrs.dimensions.as_ref().and_then(|d| d.first()).and_then(|&d| usize::try_from(d).ok())
        }
        _ => None,
    };
    let cfg = CollectiveConfig {
        op,
        groups,
        element_type,
        reduction,
        bytes_per_device: bytes,
        dimension,
        source_target_pairs,
        num_operands: ins.operands.len(),
    };
    Ok((cfg, types))
}

fn peer_reason(peers: &PeerAccessTable, a: usize, b: usize) -> String {
    let n = peers.num_devices();
    if a >= n || b >= n {
        format!("peer table ({}) covers {n} devices, not device {}", peers.source(), a.max(b))
    } else {
        format!("no peer access {a}↔{b} ({})", peers.source())
    }
}

/// What a backend's kernels can do beyond the baseline rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Variadic all-reduce (a data-parallel gradient sync is one) and tuple-form all-to-all run as one kernel call over
    /// several operands.
    pub variadic: bool,
    /// Groups whose devices belong to several processes of one host (the handlers meet through shared memory named by
    /// the job).
    pub cross_process: bool,
    /// The platform runs each device's calls one at a time in program order (a GPU stream). XLA:CPU does not: its thunk
    /// executor runs a device's data-independent thunks at once on a thread pool as small as the machine's cores, so a
    /// call that waits for its peers must be ordered with every other collective beside it (`xla_pass::keep_ordered`).
    pub in_order: bool,
    /// The handlers run an all-reduce fused with the residual add and RMSNorm after it
    /// (`thunks::custom_call::Epilogue`): the host runtime and the CUDA runtime do (ROCm not yet).
    pub fused_norm: bool,
    /// `--fuse_norm=auto` fuses: the fused kernel measured faster than the plain call and XLA's norm kernels (XLA:CPU).
    /// Not CUDA: on 4× H200 its v3 made the decode step level (604 against 592 µs unfused; v1 and v2 were slower,
    /// docs/PERFORMANCE.md).
    pub fused_norm_auto: bool,
    /// XLA runs a call whose `GpuBackendConfig` names an `operation_queue_id` other than 0 asynchronously on another
    /// stream (XLA:GPU's `StreamAttributeAsyncWrapper`).
    pub async_queue: bool,
    /// The handlers have copy-engine forms (`--copy_engines`; CUDA).
    pub copy_engines: bool,
}

/// Rules 2–7 for a collective whose backend flag allows a kernel.
fn rules(
    cfg: &CollectiveConfig,
    types: &[PrimitiveType],
    flags: &Flags,
    tuning: &Tuning,
    peers: &PeerAccessTable,
    caps: Capabilities,
) -> Decision {
    let op = cfg.op;
    let profile = tuning.for_kind(op.kind, flags);
    let Some(default) = default_kernel(op.kind) else {
        return Decision::fallback(format!("no Peerless kernel for {op}"));
    };
    // 2. dtype guard: the operands' element types, never the (possibly tuple) result.
    if let Some(ty) = types.iter().copied().find(|&t| !kernel_accepts_dtype(t)) {
        return Decision::fallback(format!(
            "dtype guard: operand element type {ty} (kernels take pred, s8-s64, u8-u64, f16, bf16, f32, f64)"
        ));
    }
    // 3. one operand, unless the backend takes variadic all-reduce / tuple all-to-all.
    let variadic_ok = caps.variadic && matches!(op.kind, CollectiveKind::AllReduce | CollectiveKind::AllToAll);
    if cfg.num_operands > 1 && !variadic_ok {
        return Decision::fallback(format!(
            "variadic {op} with {} operands: kernels take one operand",
            cfg.num_operands
        ));
    }
    // 4. reduction.
    let reduces = matches!(op.kind, CollectiveKind::AllReduce | CollectiveKind::ReduceScatter);
    if reduces && cfg.reduction.is_none() {
        return Decision::fallback(
            "reduction computation not recognised (kernels compute add, multiply, minimum, maximum, and, or of the two parameters)",
        );
    }
    let red = cfg.reduction.map(|r: ReductionKind| format!(" {r}")).unwrap_or_default();
    // 7's copy-engine forms: the flag's size, or (auto) rows of the profile.
    let bytes = cfg.bytes_per_device;
    // One operand: a variadic all-reduce stays on its one-shot.
    let copy_engine = KernelAlgorithm::copy_engine_for(op.kind).filter(|_| caps.copy_engines && cfg.num_operands == 1);
    let ce_forced = copy_engine.filter(|_| matches!(flags.copy_engines, CopyEngines::From(n) if bytes >= n));
    let ce_why = |a: KernelAlgorithm| match flags.copy_engines {
        CopyEngines::From(n) if reduces => format!("{bytes} bytes >= {COPY_ENGINES}={n}: {a} (SMs only to reduce)"),
        CopyEngines::From(n) => format!("{bytes} bytes >= {COPY_ENGINES}={n}: {a} (no SMs)"),
        _ => String::new(),
    };
    let candidates: Vec<KernelAlgorithm> = match copy_engine {
        Some(c) if flags.copy_engines == CopyEngines::Auto => vec![default, c],
        _ => vec![default],
    };
    // 5–6 for collective-permute: its pairs are what moves.
    if op.kind == CollectiveKind::CollectivePermute {
        let cross: Vec<(usize, usize)> = cfg.source_target_pairs.iter().copied().filter(|(s, t)| s != t).collect();
        if cross.is_empty() {
            return Decision::kernel(ce_forced.unwrap_or(default), "no cross-device pairs: local copy");
        }
        if let Some(&(s, t)) = cross.iter().find(|&&(s, t)| !(peers.can_access(s, t) && peers.can_access(t, s))) {
            return Decision::fallback(peer_reason(peers, s, t));
        }
        let members = cross.iter().flat_map(|&(s, t)| [s, t]).collect::<std::collections::BTreeSet<_>>().len();
        let what = format!("{} cross-device pairs, all with peer access", cross.len());
        if let Some(ce) = ce_forced {
            return Decision::kernel(ce, format!("{what}; {}", ce_why(ce)));
        }
        if let Some(c) = profile.and_then(|p| p.choose(op.kind, cfg.element_type, members, bytes, &candidates)) {
            return match c.algorithm {
                Some(a) => Decision::kernel(a, format!("{what}; {}", c.reason)),
                None => Decision::fallback(c.reason),
            };
        }
        return Decision::kernel(default, what);
    }
    // 5. group shape.
    let size = cfg.groups.first().map_or(0, Vec::len);
    if let Some(other) = cfg.groups.iter().map(Vec::len).find(|&l| l != size) {
        return Decision::fallback(format!(
            "non-uniform replica groups (sizes {size} and {other}) {}",
            fmt_groups(&cfg.groups)
        ));
    }
    if size <= 1 {
        return Decision::kernel(ce_forced.unwrap_or(default), "single-member groups: local copy");
    }
    if size > MAX_GROUP_SIZE {
        return Decision::fallback(format!("groups of {size} devices > {MAX_GROUP_SIZE} (kernel peer-pointer limit)"));
    }
    // 6. peer access.
    for g in &cfg.groups {
        if let Some((a, b)) = peers.missing_link(g) {
            return Decision::fallback(peer_reason(peers, a, b));
        }
    }
    // 7. size.
    let shape = format!("{} groups of {size}", cfg.groups.len());
    if let Some(ce) = ce_forced {
        return Decision::kernel(ce, format!("{shape}, all with peer access; {}", ce_why(ce)));
    }
    if let Some(p) = profile {
        let ce = candidates.iter().copied().filter(|a| a.is_copy_engine());
        let allowed: Vec<KernelAlgorithm> = match op.kind {
            CollectiveKind::AllReduce if bytes > flags.two_shot_max_bytes => ce.collect(),
            CollectiveKind::AllReduce => {
                [KernelAlgorithm::OneShotAllReduce, KernelAlgorithm::TwoShotAllReduce].into_iter().chain(ce).collect()
            }
            _ => candidates.clone(),
        };
        let allowed = allowed.as_slice();
        if allowed.is_empty() {
            return Decision::fallback(format!("{bytes} bytes > {TWO_SHOT_MAX_BYTES}={}", flags.two_shot_max_bytes));
        }
        if let Some(c) = p.choose(op.kind, cfg.element_type, size, bytes, allowed) {
            return match c.algorithm {
                Some(a) => Decision::kernel(a, format!("{shape}{red}; {}", c.reason)),
                None => Decision::fallback(c.reason),
            };
        }
    }
    if op.kind == CollectiveKind::AllReduce {
        let (one, two) = (flags.one_shot_max_bytes, flags.two_shot_max_bytes);
        return if bytes <= one {
            Decision::kernel(
                KernelAlgorithm::OneShotAllReduce,
                format!("{bytes} bytes <= {ONE_SHOT_MAX_BYTES}={one}{red}, {shape}"),
            )
        } else if bytes <= two {
            // usize::MAX: no limit (a call beside compute, `xla_pass`'s async rule).
            let two = if two == usize::MAX { "none".to_owned() } else { two.to_string() };
            Decision::kernel(
                KernelAlgorithm::TwoShotAllReduce,
                format!("{bytes} bytes > {ONE_SHOT_MAX_BYTES}={one} and <= {TWO_SHOT_MAX_BYTES}={two}{red}, {shape}"),
            )
        } else {
            Decision::fallback(format!("{bytes} bytes > {TWO_SHOT_MAX_BYTES}={two}"))
        };
    }
    Decision::kernel(default, format!("{shape}, all with peer access{red}"))
}

/// Rules 1–7 for collective `instr_id` on `num_replicas × num_partitions` devices with `caps`, a tuning profile
/// deciding rule 7 where the flags leave it to it. Errors if the instruction is not a collective `-start` or
/// synchronous collective (a `-done` is decided with its start), if its groups or pairs are invalid for this device
/// count, or if a `kernel` backend flag forces a kernel some rule rules out.
pub fn decide_tuned(
    module: &Module,
    instr_id: InstrId,
    num_replicas: usize,
    num_partitions: usize,
    flags: &Flags,
    tuning: &Tuning,
    peers: &PeerAccessTable,
    caps: Capabilities,
) -> Result<(CollectiveConfig, Decision), EmitError> {
    let ins = module.instrs.get(instr_id).ok_or_else(|| EmitError::InvalidCollective {
        instr: instr_id.to_string(),
        message: format!("no instruction {instr_id} in module '{}'", module.name),
    })?;
    let Some(op) = thunks::CollectiveOp::from_opcode(ins.opcode) else {
        return Err(invalid(
            ins,
            format!(
                "{} '{}' is not a collective the emitter decides (a -done half is decided with its -start)",
                ins.opcode, ins.name
            ),
        ));
    };
    let (cfg, types) = config(module, ins, op, num_replicas, num_partitions, instr_id)?;
    let backend = flags.backend_for(op.kind);
    let decision = match backend {
        Some((Backend::Fallback, flag)) => Decision::fallback(format!("forced by --{flag}=fallback")),
        _ => rules(&cfg, &types, flags, tuning, peers, caps),
    };
    if let Some((Backend::Kernel, flag)) = backend
        && !decision.is_kernel()
    {
        return Err(EmitError::KernelForced {
            instr: ins.name.clone(),
            op: op.to_string(),
            flag: flag.to_owned(),
            reason: decision.reason,
        });
    }
    Ok((cfg, decision))
}

// ------------------------------------------------------------------------ the pass's run

/// What rules 0 and 8–13 read besides the collective: the pass's run over one module.
#[derive(Clone, Copy)]
pub(crate) struct Run<'a> {
    pub module: &'a Module,
    pub assignment: &'a Assignment,
    pub cfg: &'a PassConfig,
    pub tuning: &'a Tuning,
    /// A full table of logical ids for rule 6 (rule 13 checks the device ids).
    pub logical: &'a PeerAccessTable,
    pub peers: &'a PeerLookup<'a>,
    pub layouts: &'a Layouts<'a>,
}

/// Decides one collective of the pass's run: rule 0, rules 1–7 ([`decide_tuned`] on logical ids), then rules 8–13 on
/// device ids. Returns its record and, for a kernel, its rewrite (with `instance` as its id, or a fresh one);
/// `in_async`: it sits inside an async computation (JAX's explicit async API).
pub(crate) fn decide_in_run(
    run: &Run<'_>,
    id: InstrId,
    instance: Option<u64>,
    shared_id: impl FnMut(&str) -> Option<u64>,
    in_async: bool,
) -> (PassDecision, Option<Rewrite>) {
    let cfg = run.cfg;
    // 0. Inside JAX's async pair where Peerless's calls do not run beside compute: XLA's.
    if in_async && !(cfg.caps.async_queue && cfg.flags.overlap_above_bytes.is_some()) {
        return (async_wrapped(run.module, id, cfg.caps.async_queue), None);
    }
    let mut d = fallback_record(run.module, id);
    match kernel_call(run, id, instance, shared_id, in_async, &mut d) {
        Ok(rewrite) => (d, Some(rewrite)),
        Err(why) => {
            d.reason = why;
            (d, None)
        }
    }
}

/// Rules 1–13 for a collective outside rule 0, filling in `d` (its groups; for a kernel, its implementation and
/// reason): the rewrite, or why the collective stays XLA's.
fn kernel_call(
    run: &Run<'_>,
    id: InstrId,
    instance: Option<u64>,
    mut shared_id: impl FnMut(&str) -> Option<u64>,
    in_async: bool,
    d: &mut PassDecision,
) -> Result<Rewrite, String> {
    let Run { module, assignment: a, cfg, tuning, logical, peers, layouts } = *run;
    let ins = module.instr(id);
    // Above `overlap_above_bytes` (XLA:GPU) the call runs on an async queue, which XLA's scheduler overlaps with
    // compute (the async rule), and is decided without the profile and two-shot's limit: both measure a collective run
    // alone (docs/OVERLAP.md). `d.bytes` is the config's `bytes_per_device` (its operands' bytes). A collective inside
    // JAX's own async pair runs beside compute whatever its size.
    let overlap = cfg.flags.overlap_above_bytes.filter(|&l| cfg.caps.async_queue && d.bytes > l);
    let beside = overlap.is_some() || in_async;
    let async_flags = beside.then(|| Flags { two_shot_max_bytes: usize::MAX, ..cfg.flags.clone() });
    let no_profile = Tuning::none();
    let (flags, tuning) = async_flags.as_ref().map_or((&cfg.flags, tuning), |f| (f, &no_profile));
    // Decide on device ids: map the logical groups through the assignment first, so peer access and process locality
    // are checked on the devices that will really talk.
    let (config, decision) = decide_tuned(module, id, a.replicas, a.partitions, flags, tuning, logical, cfg.caps)
        .map_err(|e| e.to_string())?;
    let groups: Vec<Vec<usize>> = config.groups.iter().map(|g| g.iter().map(|&l| a.device(l)).collect()).collect();
    let pairs: Vec<(usize, usize)> =
        config.source_target_pairs.iter().map(|&(s, t)| (a.device(s), a.device(t))).collect();
    let permute = config.op.kind == CollectiveKind::CollectivePermute;
    d.groups = if permute { fmt_pairs(&pairs) } else { fmt_groups(&groups) };
    let Implementation::Kernel(algorithm) = decision.implementation else {
        return Err(decision.reason);
    };
    // The devices that exchange data (the rules saw logical ids).
    let talking: Vec<Vec<usize>> =
        if permute { pairs.iter().filter(|(s, t)| s != t).map(|&(s, t)| vec![s, t]).collect() } else { groups.clone() };
    // 8. A collective in which no device meets another moves no data: XLA makes it a copy or nothing (folded into a
    //    fusion), where a custom call would cost a launch and split the fusions around it (+20 µs per call for a
    //    one-device psum on an H100). Forced kernels still run (single-GPU checks of the handlers).
    let forced = matches!(cfg.flags.backend_for(config.op.kind), Some((Backend::Kernel, _)));
    if !forced && talking.iter().all(|g| g.len() < 2) {
        return Err("no device meets another (groups of one): XLA turns it into a copy or nothing".into());
    }
    // 9. Processes: a group inside one process runs as always; one across processes of a host meets through shared
    //    memory (named by the job); one across hosts is XLA's.
    let crosses = match &cfg.topology {
        Some(t) => t.check(&talking, cfg.caps.cross_process)?,
        None => {
            if let Some(local) = &cfg.local_devices
                && let Some(&dev) = talking.iter().flatten().find(|d| !local.contains(d))
            {
                return Err(format!("device {dev} belongs to another process (this process has {local:?})"));
            }
            false
        }
    };
    // 10. Unless on an async queue, partitioner-made collectives XLA would run asynchronously, overlapped with compute:
    //     above the flag's size, overlap wins over a faster kernel in order on the compute stream.
    let spmd = ins.attrs.frontend_attributes.get("is_spmd_generated").is_some_and(|v| v == "true");
    if let Some(limit) = cfg.flags.xla_async_above_bytes
        && !beside
        && spmd
        && config.bytes_per_device > limit
    {
        return Err(format!(
            "partitioner-made, {} bytes > {XLA_ASYNC_ABOVE_BYTES}={limit}: XLA runs it asynchronously, overlapped with compute",
            config.bytes_per_device
        ));
    }
    // 11. An async pair becomes one synchronous call; the forms it can take ([`Form`]).
    let form = match form_of(module, id)? {
        Form::Sync if in_async => Form::InAsync,
        f => f,
    };
    let elementwise = match config.op.kind {
        CollectiveKind::AllReduce | CollectiveKind::CollectivePermute => true,
        CollectiveKind::AllToAll => config.num_operands > 1,
        _ => false,
    };
    // 12. Operands and results agree on a layout the handler can work in.
    let layout = common_layout(module, id, layouts, elementwise, form == Form::AsyncTuple)?;
    // 13. Peer access on device ids, last: the only rule that opens GPUs (the peer table, this process's; across
    //     processes shared memory reaches every device).
    if !crosses && let Some((x, y)) = talking.iter().find_map(|g| peers.get().missing_link(g)) {
        return Err(format!("no peer access {x}↔{y} ({})", peers.get().source()));
    }
    let target = target_name(config.op.kind).ok_or_else(|| format!("no Peerless kernel for {}", config.op))?;
    let instance = if crosses {
        shared_id(&ins.name).ok_or("across processes, and the module could not be fingerprinted")?
    } else {
        instance.unwrap_or_else(next_instance)
    };
    // Slots (`assign_slots`), decisions, ordering operands and epilogues come once every collective is decided.
    let mut call = CustomCallConfig {
        groups: if permute { Vec::new() } else { groups },
        pairs,
        reduction: config.reduction,
        dimension: config.dimension.filter(|_| config.op.kind != CollectiveKind::AllToAll || config.num_operands == 1),
        layout: layout.map(|l| l.into_iter().map(|x| x as usize).collect()),
        num_devices: a.devices.iter().copied().max().map_or(0, |m| m + 1),
        instance,
        timeout_ms: cfg.flags.collective_timeout_ms,
        blocks: if beside { cfg.flags.async_blocks } else { 0 },
        ..CustomCallConfig::new(config.op.kind, algorithm, ins.name.clone())
    };
    if let (true, Some(t)) = (crosses, &cfg.topology) {
        // `check` found every talking device; a permute's idle self-pairs may be unknown.
        call.processes = call.devices().iter().map(|d| t.process_of.get(d).copied().unwrap_or(0)).collect();
    }
    d.implementation = decision.implementation.to_string();
    d.kernel = true;
    d.reason = decision.reason;
    if in_async {
        d.reason.push_str(&format!(
            "; inside JAX's async pair ('{}'): beside compute on the stream XLA gives it, at most {} blocks",
            module.comps[ins.parent].name, call.blocks
        ));
    } else if let Some(limit) = overlap {
        d.reason.push_str(&format!(
            "; async: {} bytes > {OVERLAP_ABOVE_BYTES}={limit}, on XLA's operation queue {ASYNC_QUEUE} beside compute, \
             at most {} blocks",
            config.bytes_per_device, call.blocks
        ));
    }
    if call.spans_processes() {
        d.reason.push_str(" (across processes of one host: shared memory)");
    }
    Ok(Rewrite { target, call, form })
}

/// The decision for a collective inside an async computation (JAX's explicit async API: `psum_scatter_start`,
/// `all_to_all_start`, ...) where Peerless's calls do not run beside compute: on a platform without operation queues
/// (ROCm; XLA:CPU makes such pairs synchronous before the pass), or with `--overlap_above_bytes=none` (the default).
/// XLA's, which runs it beside compute. (Otherwise the call takes its place, [`Form::InAsync`].)
fn async_wrapped(module: &Module, id: InstrId, queues: bool) -> PassDecision {
    let ins = module.instr(id);
    let why = if queues {
        format!("Peerless's calls beside compute are off (--{OVERLAP_ABOVE_BYTES}=none, the default)")
    } else {
        "this platform's calls do not run beside compute".to_owned()
    };
    PassDecision {
        reason: format!(
            "inside the async computation '{}' (JAX's explicit async collectives, e.g. all_to_all_start): XLA runs it \
             beside compute, and {why}",
            module.comps[ins.parent].name
        ),
        ..fallback_record(module, id)
    }
}

/// Collective `id`'s record as a fallback with no reason yet: op, operand types and bytes.
fn fallback_record(module: &Module, id: InstrId) -> PassDecision {
    let ins = module.instr(id);
    let operands = || ins.operands.iter().filter_map(|&o| module.instrs.get(o));
    PassDecision {
        instr: ins.name.clone(),
        op: ins.opcode.name().to_owned(),
        dtype: operands()
            .flat_map(|o| o.shape.leaves().into_iter().map(|l| l.ty.to_string()))
            .collect::<Vec<_>>()
            .join(","),
        bytes: operands().map(|o| o.shape.byte_size()).sum(),
        groups: String::new(),
        implementation: "fallback".into(),
        kernel: false,
        reason: String::new(),
    }
}

/// The layout a collective's handler works in, or why it cannot run. Collectives move bytes in the buffers' physical
/// order. Elementwise ones (all-reduce, tuple all-to-all, permute) need each operand to share its result's layout, and
/// then need no attribute; the others need one layout for operand and result, passed to the handler (`layout`
/// attribute) when it is not the default.
fn common_layout(
    module: &Module,
    id: InstrId,
    layouts: &Layouts<'_>,
    elementwise: bool,
    async_tuple: bool,
) -> Result<LeafLayout, String> {
    let ins = module.instr(id);
    let show = |x: &LeafLayout| x.as_ref().map_or("row-major".to_owned(), |v| format!("{v:?}"));
    if elementwise {
        // A start's `(operand, result)`: the call computes the result only.
        let results: Vec<_> = layouts(id).into_iter().skip(usize::from(async_tuple)).collect();
        let operands: Vec<_> = ins.operands.iter().flat_map(|&o| layouts(o)).collect();
        for (i, (a, r)) in operands.iter().zip(&results).enumerate() {
            let a = a.clone().map_err(|e| format!("operand {i} has {e}"))?;
            let r = r.clone().map_err(|e| format!("result {i} has {e}"))?;
            if a != r {
                return Err(format!("operand {i} and result {i} layouts differ ({} vs {})", show(&a), show(&r)));
            }
        }
        return Ok(None);
    }
    let mut seen: Option<LeafLayout> = None;
    for i in ins.operands.iter().copied().chain([id]) {
        for l in layouts(i) {
            let l = l.map_err(|e| format!("'{}' has {e}", module.instr(i).name))?;
            match &seen {
                None => seen = Some(l),
                Some(s) if *s == l => {}
                Some(s) => {
                    return Err(format!("operand and result layouts differ ({} vs {})", show(s), show(&l)));
                }
            }
        }
    }
    Ok(seen.flatten())
}

/// The [`Form`] of collective `id`, or why its async form stays XLA's.
fn form_of(module: &Module, id: InstrId) -> Result<Form, String> {
    let ins = module.instr(id);
    let operand = |k: usize| ins.operands.get(k).and_then(|&o| module.instrs.get(o)).map(|o| &o.shape);
    match ins.opcode {
        Opcode::AllReduceStart => match (&ins.shape, ins.operands.len()) {
            (hlo::Shape::Array(_), 1) => Ok(Form::AsyncInPlace),
            _ => Err(format!(
                "async start/done pair: a variadic all-reduce-start ({} operands) stays XLA's (its done would \
                 need a tuple copy)",
                ins.operands.len()
            )),
        },
        Opcode::AllGatherStart | Opcode::CollectivePermuteStart => {
            let ok = ins.operands.len() == 1
                && matches!(&ins.shape, hlo::Shape::Tuple(e) if e.len() == 2
                    && e.iter().all(|x| x.as_array().is_some())
                    && Some(&e[0]) == operand(0));
            if ok {
                Ok(Form::AsyncTuple)
            } else {
                Err(format!(
                    "async start/done pair: a {} of {} operand(s) with result {} is not the (operand, result) form \
                     the pass rewrites",
                    ins.opcode.name(),
                    ins.operands.len(),
                    ins.shape
                ))
            }
        }
        _ => Ok(Form::Sync),
    }
}
