//! Thunks: plain-data collective configs ([`CollectiveConfig`], [`Decision`]), the custom-call contract between the
//! pass and the handlers ([`custom_call`]), and what the running process tells the handlers ([`runtime`]). Nothing here
//! refers to a particular device or depends on the device or FFI layers.

pub mod custom_call;
pub mod peers;
pub mod runtime;

/// The names of Peerless's flags (`--name=value`, without the dashes). The table that reads them, with their types,
/// defaults and help, is `emitter::flags::FLAGS`, which takes its names from here; so does any code that names a flag
/// (a message that says what to set, a flags string built or read), in this crate or above it (the GPU runtime's
/// messages, the bench).
pub mod flag {
    pub const ALL_REDUCE_BACKEND: &str = "all_reduce_backend";
    pub const ALL_GATHER_BACKEND: &str = "all_gather_backend";
    pub const ALL_TO_ALL_BACKEND: &str = "all_to_all_backend";
    pub const REDUCE_SCATTER_BACKEND: &str = "reduce_scatter_backend";
    pub const COLLECTIVE_PERMUTE_BACKEND: &str = "collective_permute_backend";
    pub const ONE_SHOT_MAX_BYTES: &str = "one_shot_max_bytes";
    pub const TWO_SHOT_MAX_BYTES: &str = "two_shot_max_bytes";
    pub const COLLECTIVE_TIMEOUT_MS: &str = "collective_timeout_ms";
    pub const HOST_TOPOLOGY: &str = "host_topology";
    pub const ALLOW_UNSAFE_PEER_TARGETS: &str = "allow_unsafe_peer_targets";
    pub const XLA_ASYNC_ABOVE_BYTES: &str = "xla_async_above_bytes";
    pub const OVERLAP_ABOVE_BYTES: &str = "overlap_above_bytes";
    pub const ASYNC_BLOCKS: &str = "async_blocks";
    pub const FUSE_NORM: &str = "fuse_norm";
    pub const COPY_ENGINES: &str = "copy_engines";
}

use std::fmt;

pub use peers::{PeerAccessTable, PeerTableKey};

/// GPU backends: the most thread blocks a collective kernel's grid may have. The kernels' per-block counter and flag
/// arrays are sized for this many (`PL_BLOCKS`).
pub const MAX_COLLECTIVE_BLOCKS: u32 = 128;
/// GPU backends: the default largest grid of a collective kernel (smaller messages get fewer blocks: one thread per
/// 16-byte unit).
pub const DEFAULT_COLLECTIVE_BLOCKS: u32 = 64;

use hlo::analysis::ReductionKind;
use hlo::{Opcode, PrimitiveType};

/// The kind of a collective, independent of whether it is issued asynchronously.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    AllToAll,
    ReduceScatter,
    CollectivePermute,
    /// No Peerless kernel; always the fallback.
    RaggedAllToAll,
    /// No Peerless kernel; always the fallback.
    CollectiveBroadcast,
}

impl CollectiveKind {
    /// The flag choosing this kind's backend (`--all_reduce_backend=auto|kernel|fallback`, ...), or `None` for the
    /// kinds Peerless has no kernel for.
    pub const fn backend_flag(self) -> Option<&'static str> {
        match self {
            Self::AllReduce => Some(flag::ALL_REDUCE_BACKEND),
            Self::AllGather => Some(flag::ALL_GATHER_BACKEND),
            Self::AllToAll => Some(flag::ALL_TO_ALL_BACKEND),
            Self::ReduceScatter => Some(flag::REDUCE_SCATTER_BACKEND),
            Self::CollectivePermute => Some(flag::COLLECTIVE_PERMUTE_BACKEND),
            Self::RaggedAllToAll | Self::CollectiveBroadcast => None,
        }
    }
}

/// A collective operation: its kind, and whether it is the `-start` half of an async pair (`all-reduce-start`,
/// `all-gather-start`, `collective-permute-start`). The matching `-done` is not a separate collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CollectiveOp {
    pub kind: CollectiveKind,
    pub is_async: bool,
}

/// Every opcode that starts a collective, with the collective's kind and whether it is the `-start` of an async pair.
const OPCODES: [(Opcode, CollectiveKind, bool); 10] = {
    use CollectiveKind as K;
    [
        (Opcode::AllReduce, K::AllReduce, false),
        (Opcode::AllReduceStart, K::AllReduce, true),
        (Opcode::AllGather, K::AllGather, false),
        (Opcode::AllGatherStart, K::AllGather, true),
        (Opcode::AllToAll, K::AllToAll, false),
        (Opcode::ReduceScatter, K::ReduceScatter, false),
        (Opcode::CollectivePermute, K::CollectivePermute, false),
        (Opcode::CollectivePermuteStart, K::CollectivePermute, true),
        (Opcode::RaggedAllToAll, K::RaggedAllToAll, false),
        (Opcode::CollectiveBroadcast, K::CollectiveBroadcast, false),
    ]
};

impl CollectiveOp {
    /// The collective an opcode starts, or `None` for non-collectives and `-done` halves.
    pub fn from_opcode(op: Opcode) -> Option<Self> {
        OPCODES.iter().find(|e| e.0 == op).map(|&(_, kind, is_async)| CollectiveOp { kind, is_async })
    }

    /// The HLO opcode spelling (`all-gather-start` for an async all-gather; a kind without an async form by its one
    /// opcode).
    pub fn name(self) -> &'static str {
        let opcode = |is_async| OPCODES.iter().find(|e| (e.1, e.2) == (self.kind, is_async)).map(|e| e.0.name());
        opcode(self.is_async).or_else(|| opcode(false)).unwrap_or("collective")
    }
}

impl fmt::Display for CollectiveOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything a backend needs to know about one collective, as plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectiveConfig {
    pub op: CollectiveOp,
    /// Groups of global device ids (`replica * num_partitions + partition`), in XLA's participant order; every device
    /// is in exactly one group.
    pub groups: Vec<Vec<usize>>,
    /// Element type of the *operand* (an `all-gather-start` result is a tuple, so the result shape says nothing about
    /// what moves).
    pub element_type: PrimitiveType,
    /// The reduction of all-reduce / reduce-scatter, when `to_apply` is recognised.
    pub reduction: Option<ReductionKind>,
    /// Bytes of all operands on one device.
    pub bytes_per_device: usize,
    /// Gather / scatter / split dimension, where the op has one.
    pub dimension: Option<usize>,
    /// Collective-permute pairs as global device ids (source, target); empty otherwise.
    pub source_target_pairs: Vec<(usize, usize)>,
    pub num_operands: usize,
}

/// Formats groups as XLA prints replica groups: `{{0,1},{2,3}}` (error messages and reports show them so).
pub use hlo::print::group_list as fmt_groups;

/// Formats collective-permute pairs as `[0->1,1->0]`.
pub fn fmt_pairs(pairs: &[(usize, usize)]) -> String {
    let items: Vec<String> = pairs.iter().map(|(s, t)| format!("{s}->{t}")).collect();
    format!("[{}]", items.join(","))
}

impl fmt::Display for CollectiveConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {} B", self.op, self.element_type, self.bytes_per_device)?;
        if self.num_operands != 1 {
            write!(f, " ({} operands)", self.num_operands)?;
        }
        if let Some(r) = self.reduction {
            write!(f, " {r}")?;
        }
        if let Some(d) = self.dimension {
            write!(f, " dim={d}")?;
        }
        if self.op.kind == CollectiveKind::CollectivePermute {
            write!(f, " pairs={}", fmt_pairs(&self.source_target_pairs))
        } else {
            write!(f, " groups={}", fmt_groups(&self.groups))
        }
    }
}

/// Declares [`KernelAlgorithm`] from one table: each variant's display name, its attribute spelling (compiled modules
/// in caches carry it, so it never changes) and whether it moves its bytes on the copy engines.
macro_rules! kernel_algorithms {
    ($($(#[$m:meta])* $v:ident = $name:literal, $attr:literal, $ce:literal;)*) => {
        /// A Peerless peer-access kernel.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum KernelAlgorithm { $($(#[$m])* $v,)* }

        impl KernelAlgorithm {
            /// Every algorithm, for reading one back from a spelling.
            pub const ALL: [KernelAlgorithm; [$(KernelAlgorithm::$v),*].len()] = [$(KernelAlgorithm::$v),*];

            pub fn name(self) -> &'static str {
                match self { $(Self::$v => $name,)* }
            }

            /// The spelling of the custom call's `algorithm` attribute.
            pub fn attr_name(self) -> &'static str {
                match self { $(Self::$v => $attr,)* }
            }

            /// Whether the algorithm moves its bytes on the copy engines (the reductions' forms then launch one local
            /// reduction kernel; the others none).
            pub fn is_copy_engine(self) -> bool {
                match self { $(Self::$v => $ce,)* }
            }
        }
    };
}

kernel_algorithms! {
    /// Every rank reads all peers' inputs and reduces them in fixed rank order.
    OneShotAllReduce = "one-shot all-reduce", "one_shot", false;
    /// Reduce-scatter of 1/N slices, then an all-gather of the reduced slices.
    TwoShotAllReduce = "two-shot all-reduce", "two_shot", false;
    DirectAllGather = "direct all-gather", "direct_all_gather", false;
    DirectAllToAll = "direct all-to-all", "direct_all_to_all", false;
    DirectReduceScatter = "direct reduce-scatter", "direct_reduce_scatter", false;
    DirectPermute = "direct permute", "direct_permute", false;
    /// All-gather moved by the GPUs' copy engines (device-to-device copies, readiness by stream memory operations): no
    /// kernel, no SM.
    CopyEngineAllGather = "copy-engine all-gather", "copy_engine_all_gather", true;
    /// All-to-all on the copy engines, as [`Self::CopyEngineAllGather`].
    CopyEngineAllToAll = "copy-engine all-to-all", "copy_engine_all_to_all", true;
    /// Collective-permute on the copy engines, as [`Self::CopyEngineAllGather`].
    CopyEnginePermute = "copy-engine permute", "copy_engine_permute", true;
    /// Reduce-scatter: the copy engines gather every member's block for me into my staging, then one small kernel
    /// reduces them with local reads (the only SMs it uses).
    CopyEngineReduceScatter = "copy-engine reduce-scatter", "copy_engine_reduce_scatter", true;
    /// All-reduce as [`Self::CopyEngineReduceScatter`] of 1/N parts, then the reduced parts all-gathered on the copy
    /// engines: a two-shot whose movement uses no SM.
    CopyEngineAllReduce = "copy-engine all-reduce", "copy_engine_all_reduce", true;
}

impl KernelAlgorithm {
    /// The copy-engine form of `kind`'s collective: all five kinds have one.
    pub fn copy_engine_for(kind: CollectiveKind) -> Option<KernelAlgorithm> {
        match kind {
            CollectiveKind::AllGather => Some(Self::CopyEngineAllGather),
            CollectiveKind::AllToAll => Some(Self::CopyEngineAllToAll),
            CollectiveKind::CollectivePermute => Some(Self::CopyEnginePermute),
            CollectiveKind::ReduceScatter => Some(Self::CopyEngineReduceScatter),
            CollectiveKind::AllReduce => Some(Self::CopyEngineAllReduce),
            _ => None,
        }
    }
}

impl fmt::Display for KernelAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a collective runs: a Peerless kernel, or the backend's fallback path (the host backend's copy loops, NCCL/RCCL
/// on GPUs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Implementation {
    Kernel(KernelAlgorithm),
    Fallback,
}

impl fmt::Display for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Kernel(k) => write!(f, "kernel ({k})"),
            Self::Fallback => f.write_str("fallback"),
        }
    }
}

/// The emitter's choice for one collective, with the reason it was made. Every decision carries a reason a person can
/// act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub implementation: Implementation,
    pub reason: String,
}

impl Decision {
    pub fn kernel(algo: KernelAlgorithm, reason: impl Into<String>) -> Self {
        Decision { implementation: Implementation::Kernel(algo), reason: reason.into() }
    }

    pub fn fallback(reason: impl Into<String>) -> Self {
        Decision { implementation: Implementation::Fallback, reason: reason.into() }
    }

    pub fn is_kernel(&self) -> bool {
        matches!(self.implementation, Implementation::Kernel(_))
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.implementation, self.reason)
    }
}
