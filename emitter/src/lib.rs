//! The collective emitter: Peerless's HLO pass inside XLA ([`xla_pass`]), which decides, per collective, between
//! Peerless's peer-access kernels and XLA's own collective, and rewrites the ones it takes into typed-FFI custom calls.
//!
//! The decision layer: [`Flags`] (XLA-style `--name=value`), the [`PeerAccessTable`] (computed once per device set),
//! and [`decide`], which applies the rules in a fixed order and gives every decision a reason. XLA assigns buffers and
//! runs the programs.

mod decide;
pub mod flags;
/// Peer access between devices (held by `thunks`, which the kernels use too).
pub use thunks::peers;
pub mod tuning;
pub mod xla_pass;

use hlo::PrimitiveType;

pub use decide::{Capabilities, MAX_GROUP_SIZE, decide_tuned};
pub use flags::{Backend, CopyEngines, FLAGS, FlagSpec, Flags, HostTopology, flags_help};
pub use peers::{PeerAccessTable, PeerTableKey};

/// Element types Peerless's own collective kernels accept. F8 variants, s4/u4 and complex types always go to the
/// fallback. Callers pass the *operand's* element type (an `all-gather-start` result is a tuple, so its result shape
/// says nothing).
pub fn kernel_accepts_dtype(ty: PrimitiveType) -> bool {
    ty.is_computable()
}

/// Emitter errors. Each names what to fix; none is a silent fallback.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// A flag that does not parse; the message lists every valid flag.
    #[error("invalid flag: {0}")]
    InvalidFlag(String),
    /// A collective that cannot run on this device count as written (groups, pairs, operands). `message` names the
    /// instruction.
    #[error("{message}")]
    InvalidCollective { instr: String, message: String },
    /// `--<flag>=kernel` forces a kernel, but a rule rules it out.
    #[error("{op} '{instr}': --{flag}=kernel forces a Peerless kernel, but {reason}")]
    KernelForced { instr: String, op: String, flag: String, reason: String },
}
