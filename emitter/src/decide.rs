//! The decision rules on the HLO collective alone: for each collective, a Peerless kernel or
//! the fallback, and why. Rules 1-7 here see logical ids and the module; the pass
//! (`xla_pass::decide_one`) then applies the rules that need its run's context, in order, to a
//! kernel decision from here: (8) a group in which no device meets another stays XLA's
//! (unless forced); (9) processes and hosts of the job's topology; (10) peer access on the
//! device ids that really talk; (11) `xla_async_above_bytes` for partitioner-made collectives
//! in order; (12) the async form; (13) agreeing layouts. Every decision says why, in words.
//!
//! Rules, first match wins:
//! 1. no Peerless kernel for the op (ragged-all-to-all, collective-broadcast) → fallback;
//!    backend flag `fallback` → fallback.
//! 2. dtype guard on the *operands'* element types.
//! 3. more than one operand → fallback, unless the platform's [`crate::Capabilities`] take
//!    variadic all-reduce and tuple all-to-all.
//! 4. all-reduce / reduce-scatter: `to_apply` must be a recognised reduction.
//! 5. group shape: uniform groups; single-member groups are a local copy (kernel);
//!    more than [`MAX_GROUP_SIZE`] members → fallback. Collective-permute checks its
//!    pairs instead (self-pairs only → local copy).
//! 6. peer access in both directions for every pair of devices that exchange data (the pass
//!    passes a full table of logical ids and checks the real devices in rule 10).
//! 7. size. With a tuning profile ([`crate::tuning`]) for the kind (its backend flag `auto`;
//!    all-reduce: no explicit threshold), the fastest it measured of XLA and the kernels
//!    (all-reduce: one-shot, two-shot up to `two_shot_max_bytes`) at this kind, dtype class,
//!    group size and size; the reason cites the profile and its figures. Without one:
//!    all-reduce one-shot up to `one_shot_max_bytes`, two-shot up to `two_shot_max_bytes`,
//!    fallback above; other ops use direct kernels at any size.
//!
//! With a backend flag of `kernel`, a rule that says "fallback" is an error instead.

use hlo::analysis::{self, ReductionKind};
use hlo::{InstrId, Instruction, Module, PrimitiveType};
use thunks::flag::{ONE_SHOT_MAX_BYTES, TWO_SHOT_MAX_BYTES};
use thunks::{CollectiveConfig, CollectiveKind, CollectiveOp, Decision, KernelAlgorithm, fmt_groups};

use crate::flags::{Backend, Flags};
use crate::peers::PeerAccessTable;
use crate::tuning::Tuning;
use crate::{EmitError, kernel_accepts_dtype};

/// Most members a group may have for a kernel: the kernels keep one peer pointer per
/// member (XLA's `kMaxNumAllReduceInputPtrs = 8`, collective_anchors.md §1 "Limits").
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
    /// Variadic all-reduce (a data-parallel gradient sync is one) and tuple-form
    /// all-to-all run as one kernel call over several operands.
    pub variadic: bool,
    /// Groups whose devices belong to several processes of one host (the handlers meet
    /// through shared memory named by the job).
    pub cross_process: bool,
    /// The platform runs each device's calls one at a time in program order (a GPU
    /// stream). XLA:CPU does not: its thunk executor runs a device's data-independent
    /// thunks at once on a thread pool as small as the machine's cores, so a call that
    /// waits for its peers must be ordered with every other collective beside it
    /// (`xla_pass::keep_ordered`).
    pub in_order: bool,
    /// The handlers run an all-reduce fused with the residual add and RMSNorm after it
    /// (`thunks::custom_call::Epilogue`): the host runtime and the CUDA runtime do (ROCm not yet).
    pub fused_norm: bool,
    /// `--fuse_norm=auto` fuses: the fused kernel measured faster than the plain call and
    /// XLA's norm kernels (XLA:CPU). Not CUDA: on 4× H200 its v3 made the decode step level
    /// (604 against 592 µs unfused; v1 and v2 were slower, docs/PERFORMANCE.md).
    pub fused_norm_auto: bool,
    /// XLA runs a call whose `GpuBackendConfig` names an `operation_queue_id` other than 0
    /// asynchronously on another stream (XLA:GPU's `StreamAttributeAsyncWrapper`).
    pub async_queue: bool,
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
    // 5–6 for collective-permute: its pairs are what moves.
    if op.kind == CollectiveKind::CollectivePermute {
        let cross: Vec<(usize, usize)> = cfg.source_target_pairs.iter().copied().filter(|(s, t)| s != t).collect();
        if cross.is_empty() {
            return Decision::kernel(default, "no cross-device pairs: local copy");
        }
        if let Some(&(s, t)) = cross.iter().find(|&&(s, t)| !(peers.can_access(s, t) && peers.can_access(t, s))) {
            return Decision::fallback(peer_reason(peers, s, t));
        }
        let members = cross.iter().flat_map(|&(s, t)| [s, t]).collect::<std::collections::BTreeSet<_>>().len();
        if let Some(c) =
            profile.and_then(|p| p.choose(op.kind, cfg.element_type, members, cfg.bytes_per_device, &[default]))
        {
            return match c.algorithm {
                Some(a) => Decision::kernel(
                    a,
                    format!("{} cross-device pairs, all with peer access; {}", cross.len(), c.reason),
                ),
                None => Decision::fallback(c.reason),
            };
        }
        return Decision::kernel(default, format!("{} cross-device pairs, all with peer access", cross.len()));
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
        return Decision::kernel(default, "single-member groups: local copy");
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
    let bytes = cfg.bytes_per_device;
    let shape = format!("{} groups of {size}", cfg.groups.len());
    if let Some(p) = profile {
        let allowed: &[KernelAlgorithm] = match op.kind {
            CollectiveKind::AllReduce if bytes > flags.two_shot_max_bytes => &[],
            CollectiveKind::AllReduce => &[KernelAlgorithm::OneShotAllReduce, KernelAlgorithm::TwoShotAllReduce],
            _ => std::slice::from_ref(&default),
        };
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

/// Decides how collective `instr_id` runs on `num_replicas × num_partitions` devices.
///
/// Returns the collective's plain-data config with the decision and its reason. Errors
/// if the instruction is not a collective `-start` or synchronous collective (a `-done`
/// half is decided with its start), if its groups or pairs are invalid for this device
/// count, or if a `kernel` backend flag forces a kernel some rule rules out.
pub fn decide(
    module: &Module,
    instr_id: InstrId,
    num_replicas: usize,
    num_partitions: usize,
    flags: &Flags,
    peers: &PeerAccessTable,
) -> Result<(CollectiveConfig, Decision), EmitError> {
    decide_with(module, instr_id, num_replicas, num_partitions, flags, peers, Capabilities::default())
}

/// [`decide`] for a backend with `caps`.
pub fn decide_with(
    module: &Module,
    instr_id: InstrId,
    num_replicas: usize,
    num_partitions: usize,
    flags: &Flags,
    peers: &PeerAccessTable,
    caps: Capabilities,
) -> Result<(CollectiveConfig, Decision), EmitError> {
    decide_tuned(module, instr_id, num_replicas, num_partitions, flags, &Tuning::none(), peers, caps)
}

/// [`decide_with`] with a tuning profile deciding rule 7 where the flags leave it to it.
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
