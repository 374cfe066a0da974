//! Peerless's reference interpreter: evaluates a verified HLO module on N logical
//! devices with XLA's semantics. It is the oracle every backend is checked against,
//! and it is itself checked against XLA's CPU backend (hlo-tests).
//!
//! Devices are evaluated in lockstep: every instruction holds one value per device,
//! so a collective sees all its group members' operands at once and needs no
//! threads. That keeps the oracle simple and deterministic.

pub mod io;

use hlo::{Literal, Module};

/// How device ids map onto the module's replicas and partitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `num_replicas = N`, one partition; replica groups name replica ids.
    Replica,
    /// `num_partitions = N`, one replica; with `use_global_device_ids` (or a channel id)
    /// replica groups name partition ids.
    Partition,
}

/// What to run on.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub num_devices: usize,
    pub mode: Mode,
}

/// Interpreter errors. Unsupported ops and dtypes name themselves.
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    #[error("unsupported op '{op}' ({instr}): {why}")]
    UnsupportedOp { op: String, instr: String, why: String },
    #[error("unsupported dtype {dtype} for '{op}' ({instr})")]
    UnsupportedDtype { dtype: String, op: String, instr: String },
    #[error("bad arguments: {0}")]
    BadArguments(String),
    #[error("{instr}: {why}")]
    Runtime { instr: String, why: String },
}

/// Runs the entry computation. `args[d]` are device `d`'s entry parameters; returns
/// each device's entry result.
pub fn run(_module: &Module, _cfg: &RunConfig, _args: &[Vec<Literal>]) -> Result<Vec<Literal>, InterpError> {
    Err(InterpError::BadArguments("interpreter not built yet".into()))
}
