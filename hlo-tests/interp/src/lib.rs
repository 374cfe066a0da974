//! Peerless's reference interpreter: evaluates a verified HLO module on N logical
//! devices with XLA's semantics. It is the conformance suite's oracle (hlo-tests), itself
//! checked against XLA's CPU backend; no runtime uses it (issue 26: XLA runs programs).
//! Analyses of the module (sharding, device groups) are `hlo`'s. [`io`] reads and writes
//! the npz files of `peerless run`.
//!
//! Devices are evaluated in lockstep: every instruction holds one value per device,
//! so a collective sees all its group members' operands at once and needs no
//! threads. That keeps the oracle simple and deterministic.
//!
//! Partition mode also runs JAX's dumped `shard_map` modules, as `hlo`'s sharding
//! analysis ([`hlo::sharding`]) reads them: entry parameters carry per-device shards
//! (see [`local_param_shapes`]), the shard_map custom calls (`Sharding`,
//! `SPMDFullToShardShape`, `SPMDShardToFullShape`, `xla.sdy.GlobalToLocalShape`,
//! `xla.sdy.LocalToGlobalShape`, `xla.sdy.FuncResultSharding`) pass local values through,
//! full values are cut into shards where the analysis says so ([`shard`]), and each
//! device's entry result is its local shard ([`local_result_shapes`]). Outside shard_map,
//! sharded values may only flow through elementwise ops, tuples, `get-tuple-element`,
//! `copy` and `convert`; anything else needs XLA's SPMD partitioner and is reported as
//! [`InterpError::UnsupportedOp`].

mod eval;
mod ops;
mod scalar;

use hlo::sharding::{Plan, Tiling};
use hlo::{Array, ErrorKind, InstrId, Literal, Module, Shape};

pub use eval::{single_op_reducer, unexecuted};
pub use ops::{GatherPlan, ScatterPlan};

/// The run's configuration and device modes (`runs`, shared with XLA's runs and the CLI).
pub use runs::{Mode, RunConfig};

/// Interpreter errors. Unsupported ops and dtypes name themselves.
#[derive(Clone, Debug, thiserror::Error)]
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

/// `%name in computation` for error messages (`hlo`'s wording, which the sharding
/// analysis's errors use too).
pub(crate) fn describe(m: &Module, id: InstrId) -> String {
    m.describe(id)
}

/// An error of `hlo`'s sharding analysis in the interpreter's words: an unsupported op
/// names its opcode, anything else (a sharding that does not fit) is a runtime error of
/// the instruction. The analysis names the instruction in every error it raises.
pub(crate) fn analysis_error(m: &Module, e: &hlo::Error) -> InterpError {
    let why = e.reason(m).to_string();
    match e.instr.and_then(|id| Some((id, m.instrs.get(id)?))) {
        Some((id, ins)) if e.kind == ErrorKind::Unsupported => {
            InterpError::UnsupportedOp { op: ins.opcode.name().to_string(), instr: describe(m, id), why }
        }
        Some((id, _)) => InterpError::Runtime { instr: describe(m, id), why },
        None => InterpError::Runtime { instr: format!("module {}", m.name), why },
    }
}

/// Device `d`'s shard of a full (global) array under `t`, as [`Tiling::shard_window`]
/// places it; padding beyond the array is zero. Errors (a reason) when the device's tile
/// is unknown or the ranks differ.
pub fn shard(t: &Tiling, a: &Array, d: usize) -> Result<Array, String> {
    let (starts, local) = t.shard_window(&a.shape, d)?;
    Ok(ops::window(a, &starts, local))
}

/// The run's configuration against the module's header (`runs`' rule), as this crate's error.
fn check_config(module: &Module, cfg: &RunConfig) -> Result<(), InterpError> {
    runs::check_config(module, cfg).map_err(|e| InterpError::BadArguments(e.to_string()))
}

/// The sharding plan to run by: `hlo`'s analysis in partition mode, none in replica mode
/// (every device holds every value whole).
fn make_plan(module: &Module, cfg: &RunConfig) -> Result<Option<Plan>, InterpError> {
    check_config(module, cfg)?;
    match cfg.mode {
        Mode::Partition => {
            hlo::sharding::analyze(module, cfg.num_devices).map(Some).map_err(|e| analysis_error(module, &e))
        }
        Mode::Replica => Ok(None),
    }
}

/// The plan's first op that needs XLA's SPMD partitioner, as an error.
fn deferred(module: &Module, plan: Option<&Plan>) -> Result<(), InterpError> {
    match plan.and_then(|p| p.deferred.as_ref()) {
        Some(e) => Err(analysis_error(module, e)),
        None => Ok(()),
    }
}

fn param_shapes(module: &Module, plan: Option<&Plan>) -> Vec<Shape> {
    match plan {
        Some(p) => p.param_shapes(module),
        None => module.entry_param_shapes().into_iter().cloned().collect(),
    }
}

/// Per device, per entry parameter: the shape of the value that device holds. In partition
/// mode a parameter sharded by `sharding={devices=..}`, by Shardy's `xla.sdy.sharding`, or
/// by the shard_map custom call that consumes it holds its shard (each dimension divided
/// by its tile count, rounded up); otherwise (and in replica mode) the full declared shape.
pub fn local_param_shapes(module: &Module, cfg: &RunConfig) -> Result<Vec<Vec<Shape>>, InterpError> {
    let plan = make_plan(module, cfg)?;
    Ok(vec![param_shapes(module, plan.as_ref()); cfg.num_devices])
}

/// Per device: the shape of the entry result that device returns (its local shard of a
/// sharded result; the declared shape otherwise).
pub fn local_result_shapes(module: &Module, cfg: &RunConfig) -> Result<Vec<Shape>, InterpError> {
    let plan = make_plan(module, cfg)?;
    deferred(module, plan.as_ref())?;
    let shape = match &plan {
        Some(p) => p.result_shape(module),
        None => module.entry_result_shape().clone(),
    };
    Ok(vec![shape; cfg.num_devices])
}

/// Runs the entry computation. `args[d]` are device `d`'s entry parameters (each of the
/// shape [`local_param_shapes`] gives); returns each device's entry result.
pub fn run(module: &Module, cfg: &RunConfig, args: &[Vec<Literal>]) -> Result<Vec<Literal>, InterpError> {
    let plan = make_plan(module, cfg)?;
    deferred(module, plan.as_ref())?;
    let n = cfg.num_devices;
    if args.len() != n {
        return Err(InterpError::BadArguments(format!("{} devices' argument lists for {n} devices", args.len())));
    }
    let shapes = param_shapes(module, plan.as_ref());
    for (d, a) in args.iter().enumerate() {
        if a.len() != shapes.len() {
            return Err(InterpError::BadArguments(format!(
                "device {d}: {} arguments, the entry computation takes {}",
                a.len(),
                shapes.len()
            )));
        }
        for (i, (v, want)) in a.iter().zip(&shapes).enumerate() {
            let got = v.shape();
            if !got.compatible(want) {
                return Err(InterpError::BadArguments(format!(
                    "parameter {i} on device {d}: expected {want}, got {got}"
                )));
            }
        }
    }
    // Transpose to [parameter][device].
    let by_param: Vec<Vec<Literal>> = (0..shapes.len()).map(|i| args.iter().map(|a| a[i].clone()).collect()).collect();
    let interp = eval::Interp { m: module, n, mode: cfg.mode, plan: plan.as_ref(), first: 0 };
    interp.eval_comp(module.entry, &by_param, 0)
}
