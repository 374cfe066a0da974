//! The contract between the collective pass and the FFI handlers: which typed-FFI custom-call target a collective
//! becomes, and the plain-data attributes it carries.
//!
//! The pass (emitter) writes a [`CustomCallConfig`] into the custom call's `backend_config` as an MLIR dictionary
//! ([`CustomCallConfig::backend_config`]); XLA parses it and hands the handler each attribute by name; the handler
//! rebuilds the same value with [`CustomCallConfig::from_attrs`]. Both directions live here so they cannot drift apart.
//! Groups and pairs are *device ids* (the module's device assignment is applied by the pass), so a handler finds its
//! rank from its own device id.

use std::fmt;

use hlo::PrimitiveType;
use hlo::analysis::ReductionKind;

use crate::{CollectiveKind, Implementation, KernelAlgorithm};

/// Target names, one per collective kind that has a Peerless kernel.
pub const TARGETS: [(CollectiveKind, &str); 5] = [
    (CollectiveKind::AllReduce, "peerless.all_reduce"),
    (CollectiveKind::AllGather, "peerless.all_gather"),
    (CollectiveKind::AllToAll, "peerless.all_to_all"),
    (CollectiveKind::ReduceScatter, "peerless.reduce_scatter"),
    (CollectiveKind::CollectivePermute, "peerless.collective_permute"),
];

/// The custom-call target of a collective kind (`None`: no Peerless kernel).
pub fn target_name(kind: CollectiveKind) -> Option<&'static str> {
    TARGETS.iter().find(|(k, _)| *k == kind).map(|(_, t)| *t)
}

/// The collective kind of a target name.
pub fn target_kind(target: &str) -> Option<CollectiveKind> {
    TARGETS.iter().find(|(_, t)| *t == target).map(|(k, _)| *k)
}

fn algorithm_from_name(s: &str) -> Option<KernelAlgorithm> {
    KernelAlgorithm::ALL.into_iter().find(|&a| a.attr_name() == s)
}

/// `s` as an MLIR string literal: quotes, backslashes and control characters (the report's tabs and newlines) as `\XX`
/// hex escapes, which XLA's attribute parser decodes.
fn mlir_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' || c.is_ascii_control() {
            out.push_str(&format!("\\{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// The name as it goes into an MLIR string: instruction names are identifiers, but anything outside `[A-Za-z0-9_.-]`
/// becomes `_` so no escape rules are involved.
fn plain_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '_' }).collect()
}

/// What one Peerless custom call is, as plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CustomCallConfig {
    pub kind: CollectiveKind,
    /// The kernel the pass chose (the pass rewrites only kernel decisions).
    pub algorithm: KernelAlgorithm,
    /// Groups of device ids (empty for collective-permute).
    pub groups: Vec<Vec<usize>>,
    /// (source, target) device ids, collective-permute only.
    pub pairs: Vec<(usize, usize)>,
    pub reduction: Option<ReductionKind>,
    /// Gather / scatter / split dimension (absent for tuple-form all-to-all).
    pub dimension: Option<usize>,
    /// The buffers' shared `minor_to_major` when it is not row-major (XLA's CPU pipeline assigns layouts before the
    /// pass runs); the handler works on the physical order.
    pub layout: Option<Vec<usize>>,
    /// Device ids the program spans (the module's device assignment: largest id + 1; 0 = unknown). Devices outside
    /// every pair still call a permute (they receive zeros).
    pub num_devices: usize,
    /// Keys the handler's per-collective state (its plan; staging and signal flags too unless the call names a `slot`,
    /// which then keys those): unique per rewritten instruction and compile for a group inside one process; for a group
    /// across processes, the same in every process and every run (the module and the instruction), told apart at run
    /// time by the job's token and the executable ([`crate::runtime::shared_key`]).
    pub instance: u64,
    pub timeout_ms: u64,
    /// The original instruction's name, for errors.
    pub name: String,
    /// Groups that span processes of one host: the process of each device, in the order of the flattened `groups` (or
    /// `pairs`); empty: every group lies in one process. The job's token, which names the shared segments, is the
    /// running process's ([`crate::runtime::job`]), never the compiling one's: a compiled module holds nothing of the
    /// run that compiled it, so a persistent compilation cache can hand it to another.
    pub processes: Vec<usize>,
    /// The pass's decision for this call as report lines ([`crate::runtime`]'s format), and on the module's first call
    /// those of the collectives it left to XLA: registered when XLA instantiates the call, so an executable loaded from
    /// a cache tells `stats()` what it runs. Empty: none carried.
    pub decisions: String,
    /// The staging slot the call shares with other collectives of its executable (`None`: staging of its own, as calls
    /// written before slots existed). The pass gives two calls one slot only when every device runs them in one order:
    /// same computation, same groups (permute: same pairs), one a data-dependency ancestor of the other
    /// (`emitter::xla_pass`'s slot rule); the handler keys staging, flags and epochs by the slot, so the protocols'
    /// argument for repeated launches of one collective covers the slot's sequence of calls.
    pub slot: Option<u64>,
    /// Bytes of one staging buffer of the slot: the largest staged message among its calls (0: the handler sizes it
    /// from the first call).
    pub slot_bytes: u64,
    /// Bytes of the slot's staging on each GPU: the largest [`Self::gpu_staging_bytes`] among its calls (the GPU layout
    /// stages results, not only operands; 0: the handler sizes it from the first call).
    pub slot_gpu_bytes: u64,
    /// Trailing operand buffers that only order the call after another (XLA:CPU, where the pass chains a computation's
    /// calls through data dependencies: its thunk executor runs independent thunks at once): the handler ignores them.
    pub order_operands: usize,
    /// What the pass fused after an all-reduce ([`Epilogue`]); `None`: the plain collective. With one, the call takes
    /// (operand, residual, [gamma]) and returns (h, y).
    pub epilogue: Option<Epilogue>,
    /// The most thread blocks the call's kernels launch with (0: the kernels' own grid). A call beside compute takes
    /// few SMs, so the GEMMs it overlaps keep the device; every rank reads the same value, which the per-block barriers
    /// need.
    pub blocks: u32,
}

/// Element types an [`Epilogue`] rounds through (the pass matches only these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundTo {
    Bf16,
    F16,
}

impl RoundTo {
    /// The element type (its HLO spelling is the attribute's).
    pub fn ty(self) -> PrimitiveType {
        match self {
            RoundTo::Bf16 => PrimitiveType::Bf16,
            RoundTo::F16 => PrimitiveType::F16,
        }
    }

    /// The `RoundTo` of element type `ty`, if an epilogue rounds through it.
    pub fn of(ty: PrimitiveType) -> Option<Self> {
        [RoundTo::Bf16, RoundTo::F16].into_iter().find(|r| r.ty() == ty)
    }
}

/// How the fused row mean is taken: the row's sum times a constant, or divided by one (XLA keeps whichever the
/// program's simplified form has; the constant is the f32 XLA holds, by its bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mean {
    Multiply(u32),
    Divide(u32),
}

/// A residual add and RMSNorm fused after a sum all-reduce, exactly as the pass matched them after partitioning. The
/// call's operands are the all-reduce's operand `a`, the residual `x` and, with `gamma`, the scale `g` (f32 or a type
/// converted to f32); its results `h` and `y`, rows along the minor-most dimension. In f32:
///
/// ```text
/// s  = allreduce(a), rounded to `round_ar` (XLA:CPU sums bf16 in f32 and rounds once)
/// hc = f32(s) + f32(x);  h = hc rounded to h's type
/// hf = f32(h) if `norm_of_rounded` else hc (XLA drops the round trip with excess precision)
/// ms = mean(hf * hf) over the row ([`Mean`]);  r = rsqrt(ms + eps)
/// y  = (hf * r) [* f32(g)], rounded to y's type
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epilogue {
    pub round_ar: Option<RoundTo>,
    pub norm_of_rounded: bool,
    pub mean: Mean,
    /// The f32 `eps`, by its bits.
    pub eps: u32,
    pub gamma: bool,
}

impl Epilogue {
    /// The attribute's text: `rmsnorm;round=bf16|none;of=rounded|exact;mul=HEX|div=HEX;eps=HEX;gamma=0|1` (f32
    /// constants by their bits, so they travel exactly).
    pub fn text(&self) -> String {
        let mean = match self.mean {
            Mean::Multiply(m) => format!("mul={m:08x}"),
            Mean::Divide(d) => format!("div={d:08x}"),
        };
        format!(
            "rmsnorm;round={};of={};{mean};eps={:08x};gamma={}",
            self.round_ar.map_or("none", |r| r.ty().name()),
            if self.norm_of_rounded { "rounded" } else { "exact" },
            self.eps,
            u8::from(self.gamma)
        )
    }

    /// Reads [`Self::text`] back.
    pub fn parse(s: &str) -> Result<Epilogue, String> {
        let mut parts = s.split(';');
        if parts.next() != Some("rmsnorm") {
            return Err(format!("'{s}' is not an rmsnorm epilogue"));
        }
        let (mut round_ar, mut of, mut mean, mut eps, mut gamma) = (None, None, None, None, None);
        let bits = |v: &str| u32::from_str_radix(v, 16).map_err(|_| format!("'{v}' is not hex"));
        for p in parts {
            let (k, v) = p.split_once('=').ok_or_else(|| format!("'{p}' is not key=value"))?;
            match k {
                "round" if v == "none" => round_ar = Some(None),
                "round" => {
                    let r = PrimitiveType::from_name(v).and_then(RoundTo::of);
                    round_ar = Some(Some(r.ok_or_else(|| format!("round '{v}'"))?));
                }
                "of" => of = Some(v == "rounded"),
                "mul" => mean = Some(Mean::Multiply(bits(v)?)),
                "div" => mean = Some(Mean::Divide(bits(v)?)),
                "eps" => eps = Some(bits(v)?),
                "gamma" => gamma = Some(v == "1"),
                _ => return Err(format!("unknown key '{k}'")),
            }
        }
        let missing = |k: &str| format!("'{s}' lacks {k}");
        Ok(Epilogue {
            round_ar: round_ar.ok_or_else(|| missing("round"))?,
            norm_of_rounded: of.ok_or_else(|| missing("of"))?,
            mean: mean.ok_or_else(|| missing("mul or div"))?,
            eps: eps.ok_or_else(|| missing("eps"))?,
            gamma: gamma.ok_or_else(|| missing("gamma"))?,
        })
    }

    /// Operands the epilogue adds after the all-reduce's own (residual, gamma).
    pub fn extra_operands(&self) -> usize {
        1 + usize::from(self.gamma)
    }
}

/// Every attribute a Peerless custom call may carry.
pub const ATTRIBUTES: [&str; 19] = [
    "algorithm",
    "blocks",
    "decisions",
    "dimension",
    "epilogue",
    "group_size",
    "groups",
    "instance",
    "layout",
    "name",
    "num_devices",
    "order_operands",
    "pairs",
    "processes",
    "reduction",
    "slot",
    "slot_bytes",
    "slot_gpu_bytes",
    "timeout_ms",
];

/// Why a handler's attributes do not describe a Peerless collective.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttrError {
    #[error("unknown attribute '{name}' (a Peerless custom call takes {known})")]
    Unknown { name: String, known: String },
    #[error("attribute '{0}' is missing")]
    Missing(&'static str),
    #[error("attribute '{name}': {message}")]
    Invalid { name: &'static str, message: String },
}

/// Where [`CustomCallConfig::from_attrs`] reads attributes from (the FFI call frame; a map in tests). Each accessor
/// returns `Ok(None)` for a missing attribute and an error message for one of another type.
pub trait AttrSource {
    /// Every attribute name the call has.
    fn names(&self) -> Result<Vec<String>, String>;
    fn i64(&self, name: &str) -> Result<Option<i64>, String>;
    fn str(&self, name: &str) -> Result<Option<String>, String>;
    fn i64_array(&self, name: &str) -> Result<Option<Vec<i64>>, String>;
}

fn need<T>(name: &'static str, v: Result<Option<T>, String>) -> Result<T, AttrError> {
    v.map_err(|message| AttrError::Invalid { name, message })?.ok_or(AttrError::Missing(name))
}

fn nonneg(name: &'static str, v: i64) -> Result<usize, AttrError> {
    usize::try_from(v).map_err(|_| AttrError::Invalid { name, message: format!("{v} is negative") })
}

fn nonneg_all(name: &'static str, v: &[i64]) -> Result<Vec<usize>, AttrError> {
    v.iter().map(|&x| nonneg(name, x)).collect()
}

/// An optional attribute as read (`None`: absent).
fn opt<T>(name: &'static str, v: Result<Option<T>, String>) -> Result<Option<T>, AttrError> {
    v.map_err(|message| AttrError::Invalid { name, message })
}

/// An optional non-negative integer attribute (`None`: absent).
fn opt_count(a: &dyn AttrSource, name: &'static str) -> Result<Option<usize>, AttrError> {
    opt(name, a.i64(name))?.map(|v| nonneg(name, v)).transpose()
}

impl CustomCallConfig {
    /// A call of `kind` running `algorithm`, named `name`, with nothing else set (no groups, pairs, reduction,
    /// dimension, layout, processes, slot, epilogue or block limit; device count, instance and timeout 0): the base the
    /// pass and tests fill in with `..`.
    pub fn new(kind: CollectiveKind, algorithm: KernelAlgorithm, name: impl Into<String>) -> Self {
        CustomCallConfig {
            kind,
            algorithm,
            groups: Vec::new(),
            pairs: Vec::new(),
            reduction: None,
            dimension: None,
            layout: None,
            num_devices: 0,
            instance: 0,
            timeout_ms: 0,
            name: name.into(),
            processes: Vec::new(),
            decisions: String::new(),
            slot: None,
            slot_bytes: 0,
            slot_gpu_bytes: 0,
            order_operands: 0,
            epilogue: None,
            blocks: 0,
        }
    }

    /// The custom-call target.
    pub fn target(&self) -> &'static str {
        target_name(self.kind).unwrap_or("peerless.unknown")
    }

    /// The implementation it runs.
    pub fn implementation(&self) -> Implementation {
        Implementation::Kernel(self.algorithm)
    }

    /// Whether a group spans processes (members meet through memory the job's token names).
    pub fn spans_processes(&self) -> bool {
        !self.processes.is_empty()
    }

    /// The MLIR dictionary XLA reads a typed-FFI custom call's attributes from (`backend_config={...}`), keys sorted as
    /// XLA sorts them.
    pub fn backend_config(&self) -> String {
        fn arr(v: impl IntoIterator<Item = usize>) -> String {
            let items: Vec<String> = v.into_iter().map(|x| x.to_string()).collect();
            if items.is_empty() { "array<i64>".to_owned() } else { format!("array<i64: {}>", items.join(", ")) }
        }
        fn int(v: impl fmt::Display) -> String {
            format!("{v} : i64")
        }
        let mut kv: Vec<(&str, String)> = vec![
            ("algorithm", format!("\"{}\"", self.algorithm.attr_name())),
            ("num_devices", int(self.num_devices)),
            ("instance", int(self.instance & (i64::MAX as u64))),
            ("name", format!("\"{}\"", plain_name(&self.name))),
            ("timeout_ms", int(self.timeout_ms.min(i64::MAX as u64))),
        ];
        if self.kind == CollectiveKind::CollectivePermute {
            kv.push(("pairs", arr(self.pairs.iter().flat_map(|&(s, t)| [s, t]))));
        } else {
            let size = self.groups.first().map_or(0, Vec::len);
            kv.push(("group_size", int(size)));
            kv.push(("groups", arr(self.groups.iter().flatten().copied())));
        }
        if let Some(r) = self.reduction {
            kv.push(("reduction", format!("\"{}\"", r.name())));
        }
        if let Some(d) = self.dimension {
            kv.push(("dimension", int(d)));
        }
        if let Some(l) = &self.layout {
            kv.push(("layout", arr(l.iter().copied())));
        }
        if self.spans_processes() {
            kv.push(("processes", arr(self.processes.iter().copied())));
        }
        if !self.decisions.is_empty() {
            kv.push(("decisions", mlir_string(&self.decisions)));
        }
        if self.order_operands > 0 {
            kv.push(("order_operands", int(self.order_operands)));
        }
        if let Some(e) = &self.epilogue {
            kv.push(("epilogue", mlir_string(&e.text())));
        }
        if self.blocks > 0 {
            kv.push(("blocks", int(self.blocks)));
        }
        if let Some(slot) = self.slot {
            kv.push(("slot", int(slot & (i64::MAX as u64))));
            kv.push(("slot_bytes", int(self.slot_bytes.min(i64::MAX as u64))));
            if self.slot_gpu_bytes > 0 {
                kv.push(("slot_gpu_bytes", int(self.slot_gpu_bytes.min(i64::MAX as u64))));
            }
        }
        kv.sort_by(|a, b| a.0.cmp(b.0));
        let body: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k} = {v}")).collect();
        format!("{{{}}}", body.join(", "))
    }

    /// Rebuilds the config a handler of `kind` was called with. An attribute this contract does not define is an error
    /// (a misspelt optional one would otherwise be ignored).
    pub fn from_attrs(kind: CollectiveKind, a: &dyn AttrSource) -> Result<Self, AttrError> {
        let names = a.names().map_err(|message| AttrError::Invalid { name: "attributes", message })?;
        if let Some(bad) = names.iter().find(|n| !ATTRIBUTES.contains(&n.as_str())) {
            return Err(AttrError::Unknown { name: bad.clone(), known: ATTRIBUTES.join(", ") });
        }
        let algo_name = need("algorithm", a.str("algorithm"))?;
        let algorithm = algorithm_from_name(&algo_name).ok_or_else(|| AttrError::Invalid {
            name: "algorithm",
            message: format!("unknown algorithm '{algo_name}'"),
        })?;
        let instance = need("instance", a.i64("instance"))? as u64;
        let timeout_ms = nonneg("timeout_ms", need("timeout_ms", a.i64("timeout_ms"))?)? as u64;
        let name = opt("name", a.str("name"))?.unwrap_or_default();
        let reduction = opt("reduction", a.str("reduction"))?
            .map(|r| {
                ReductionKind::from_name(&r).ok_or_else(|| AttrError::Invalid {
                    name: "reduction",
                    message: format!("unknown reduction '{r}'"),
                })
            })
            .transpose()?;
        if matches!(kind, CollectiveKind::AllReduce | CollectiveKind::ReduceScatter) && reduction.is_none() {
            return Err(AttrError::Missing("reduction"));
        }
        let dimension = opt_count(a, "dimension")?;
        let layout = opt("layout", a.i64_array("layout"))?.map(|l| nonneg_all("layout", &l)).transpose()?;
        let (mut groups, mut pairs) = (Vec::new(), Vec::new());
        if kind == CollectiveKind::CollectivePermute {
            let flat = need("pairs", a.i64_array("pairs"))?;
            if flat.len() % 2 != 0 {
                return Err(AttrError::Invalid { name: "pairs", message: format!("{} ids, not pairs", flat.len()) });
            }
            for p in flat.chunks(2) {
                pairs.push((nonneg("pairs", p[0])?, nonneg("pairs", p[1])?));
            }
        } else {
            let flat = need("groups", a.i64_array("groups"))?;
            let size = nonneg("group_size", need("group_size", a.i64("group_size"))?)?;
            if size == 0 || flat.len() % size != 0 {
                return Err(AttrError::Invalid {
                    name: "groups",
                    message: format!("{} ids do not split into groups of {size}", flat.len()),
                });
            }
            for g in flat.chunks(size) {
                groups.push(nonneg_all("groups", g)?);
            }
        }
        let processes = match opt("processes", a.i64_array("processes"))? {
            None => Vec::new(),
            Some(p) => {
                let n = if kind == CollectiveKind::CollectivePermute {
                    2 * pairs.len()
                } else {
                    groups.iter().map(Vec::len).sum()
                };
                if p.len() != n {
                    return Err(AttrError::Invalid {
                        name: "processes",
                        message: format!("{} processes for {n} devices", p.len()),
                    });
                }
                nonneg_all("processes", &p)?
            }
        };
        let decisions = opt("decisions", a.str("decisions"))?.unwrap_or_default();
        let num_devices = opt_count(a, "num_devices")?.unwrap_or(0);
        // Absent in calls written before slots: staging of the call's own.
        let slot = opt_count(a, "slot")?.map(|s| s as u64);
        let slot_bytes = opt_count(a, "slot_bytes")?.unwrap_or(0) as u64;
        let order_operands = opt_count(a, "order_operands")?.unwrap_or(0);
        let slot_gpu_bytes = opt_count(a, "slot_gpu_bytes")?.unwrap_or(0) as u64;
        let blocks = opt_count(a, "blocks")?.unwrap_or(0);
        let blocks = u32::try_from(blocks)
            .map_err(|_| AttrError::Invalid { name: "blocks", message: format!("{blocks} is not a block count") })?;
        let epilogue = opt("epilogue", a.str("epilogue"))?
            .map(|e| Epilogue::parse(&e).map_err(|message| AttrError::Invalid { name: "epilogue", message }))
            .transpose()?;
        if epilogue.is_some() && (kind != CollectiveKind::AllReduce || reduction != Some(ReductionKind::Sum)) {
            return Err(AttrError::Invalid { name: "epilogue", message: "only a sum all-reduce takes one".into() });
        }
        Ok(CustomCallConfig {
            kind,
            algorithm,
            groups,
            pairs,
            reduction,
            dimension,
            layout,
            num_devices,
            instance,
            timeout_ms,
            name,
            processes,
            decisions,
            slot,
            slot_bytes,
            slot_gpu_bytes,
            order_operands,
            epilogue,
            blocks,
        })
    }

    /// Staging bytes this call needs on each GPU, in the CUDA handlers' layout (kernels/src/gpu/xla.rs), given its
    /// operands' and results' byte sizes: the reductions double-buffer by launch parity in two equal halves (a variadic
    /// one-shot stages all its operands side by side, each rounded to 256 bytes; the others one operand at a time); the
    /// exchanges (all-gather, all-to-all, permute) assemble the whole result there (tuple all-to-all: one
    /// 256-byte-aligned chunk per member). Always a multiple of 512, so the halves stay 256-byte aligned. The pass
    /// sizes a slot with it and the handler checks a call against its slot with it: one rule for both.
    pub fn gpu_staging_bytes(&self, args: &[usize], rets: &[usize]) -> usize {
        let r = |x: usize| x.max(16).div_ceil(256).saturating_mul(256);
        let max_in = args.iter().copied().max().unwrap_or(0);
        let g = self.groups.first().map_or(1, Vec::len).max(1);
        let bytes = match self.algorithm {
            // One slot of my result's size per member (their blocks for me).
            KernelAlgorithm::CopyEngineReduceScatter if args.len() == 1 => {
                (2 * r(max_in)).max(g.saturating_mul(r(rets.iter().copied().max().unwrap_or(0))))
            }
            // The reduce-scatter's slots, then the gathered operand.
            KernelAlgorithm::CopyEngineAllReduce if args.len() == 1 => {
                (2 * r(max_in)).max(g.saturating_mul(r(ce_part_bytes(max_in, g))).saturating_add(r(max_in)))
            }
            KernelAlgorithm::OneShotAllReduce => 2 * args.iter().map(|&a| r(a)).sum::<usize>(),
            KernelAlgorithm::TwoShotAllReduce
            | KernelAlgorithm::DirectReduceScatter
            | KernelAlgorithm::CopyEngineReduceScatter
            | KernelAlgorithm::CopyEngineAllReduce => 2 * r(max_in),
            _ if self.kind == CollectiveKind::AllToAll && args.len() > 1 => args.len().saturating_mul(r(max_in)),
            _ => r(rets.iter().sum::<usize>()),
        };
        bytes.max(512).div_ceil(512).saturating_mul(512)
    }

    /// Bytes of one host staging buffer (XLA:CPU's protocols, `kernels::host::direct`): each operand at a
    /// 64-byte-aligned offset, in order ([`host_stage_len`]). The pass sizes a slot with it and the handler lays out
    /// its operands by it: one rule for both, as on GPUs.
    pub fn host_staging_bytes(operands: &[usize]) -> usize {
        operands.iter().fold(0usize, |at, &len| at.saturating_add(host_stage_len(len)))
    }

    /// The device ids the call names, in `processes`' order: the flattened `groups` (or `pairs`).
    pub fn devices(&self) -> Vec<usize> {
        match self.kind {
            CollectiveKind::CollectivePermute => self.pairs.iter().flat_map(|&(s, t)| [s, t]).collect(),
            _ => self.groups.iter().flatten().copied().collect(),
        }
    }

    /// With `processes`: each named device's process (device id → process index).
    pub fn process_of(&self) -> std::collections::BTreeMap<usize, usize> {
        self.devices().into_iter().zip(self.processes.iter().copied()).collect()
    }

    /// Physical dimensions and the physical index of `dimension` for buffers whose logical dimensions are `dims`: with
    /// a `layout`, the buffer is a row-major array of the dimensions in major-to-minor order.
    pub fn physical(&self, dims: &[i64]) -> Result<(Vec<i64>, Option<usize>), String> {
        let Some(l) = &self.layout else { return Ok((dims.to_vec(), self.dimension)) };
        let mut sorted = l.clone();
        sorted.sort_unstable();
        if sorted != (0..dims.len()).collect::<Vec<_>>() {
            return Err(format!("layout {l:?} is not a permutation of {} dimensions", dims.len()));
        }
        let major_to_minor: Vec<usize> = l.iter().rev().copied().collect();
        let phys = major_to_minor.iter().map(|&d| dims[d]).collect();
        let dim = self.dimension.map(|d| major_to_minor.iter().position(|&x| x == d).unwrap_or(d));
        Ok((phys, dim))
    }

    /// The group that contains `device` (for permute: every device in a pair).
    pub fn group_of(&self, device: usize) -> Option<&[usize]> {
        self.groups.iter().find(|g| g.contains(&device)).map(Vec::as_slice)
    }

    /// The largest device id the call names (or the program spans), plus one.
    pub fn device_span(&self) -> usize {
        let g = self.groups.iter().flatten().copied();
        let p = self.pairs.iter().flat_map(|&(s, t)| [s, t]);
        g.chain(p).max().map_or(0, |m| m + 1).max(self.num_devices)
    }
}

impl fmt::Display for CustomCallConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({}) {}", self.target(), self.name, self.backend_config())
    }
}

/// The part of an all-reduce operand of `len` bytes each of `g` members reduces on the copy engines' all-reduce: `len /
/// g` rounded up to 16 bytes (a whole element of every type, and the kernels' vector width); member k's part starts at
/// `k` times it (the last may be short or empty).
pub fn ce_part_bytes(len: usize, g: usize) -> usize {
    len.div_ceil(g.max(1)).div_ceil(16).saturating_mul(16)
}

/// The bytes an operand of `len` bytes takes in host staging: `len` rounded up to 64 (each operand starts on its own
/// cache line).
pub fn host_stage_len(len: usize) -> usize {
    len.div_ceil(64).saturating_mul(64)
}
