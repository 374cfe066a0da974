//! Peerless's reference interpreter: evaluates a verified HLO module on N logical
//! devices with XLA's semantics. It is the oracle every backend is checked against,
//! and it is itself checked against XLA's CPU backend (hlo-tests).
//!
//! Devices are evaluated in lockstep: every instruction holds one value per device,
//! so a collective sees all its group members' operands at once and needs no
//! threads. That keeps the oracle simple and deterministic.
//!
//! Partition mode also runs JAX's dumped `shard_map` modules: entry parameters carry
//! per-device shards (see [`local_param_shapes`]), the shard_map custom calls
//! (`Sharding`, `SPMDFullToShardShape`, `SPMDShardToFullShape`, `xla.sdy.GlobalToLocalShape`,
//! `xla.sdy.LocalToGlobalShape`, `xla.sdy.FuncResultSharding`) pass local values through,
//! and each device's entry result is its local shard ([`local_result_shapes`]).
//! Outside shard_map, sharded values may only flow through elementwise ops, tuples,
//! `get-tuple-element`, `copy` and `convert`; anything else needs XLA's SPMD partitioner
//! and is reported as [`InterpError::UnsupportedOp`].

mod eval;
pub mod io;
mod ops;
mod plan;
mod scalar;
mod sharding;
pub mod single;

use hlo::{InstrId, Literal, Module, Shape};

pub use eval::{single_op_reducer, unexecuted};
pub use ops::{GatherPlan, ScatterPlan};
pub use sharding::Tiling;

/// How device ids map onto the module's replicas and partitions (shared with the
/// emitter, so both resolve replica groups the same way).
pub use hlo::analysis::DeviceMode as Mode;

/// What to run on.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub num_devices: usize,
    pub mode: Mode,
}

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

/// `%name in computation` for error messages.
pub(crate) fn describe(m: &Module, id: InstrId) -> String {
    match m.instrs.get(id) {
        Some(i) => match m.comps.get(i.parent) {
            Some(c) => format!("%{} in {}", i.name, c.name),
            None => format!("%{}", i.name),
        },
        None => format!("{id}"),
    }
}

fn check_config(module: &Module, cfg: &RunConfig) -> Result<(), InterpError> {
    if cfg.num_devices == 0 {
        return Err(InterpError::BadArguments("num_devices must be at least 1".into()));
    }
    if module.comps.get(module.entry).is_none() {
        return Err(InterpError::BadArguments("module has no entry computation".into()));
    }
    let (declared, what) = match cfg.mode {
        Mode::Replica => (module.config.replica_count, "replica_count"),
        Mode::Partition => (module.config.num_partitions, "num_partitions"),
    };
    if declared > 1 && declared as usize != cfg.num_devices {
        return Err(InterpError::BadArguments(format!(
            "module declares {what}={declared}, asked to run on {} devices",
            cfg.num_devices
        )));
    }
    Ok(())
}

fn make_plan(module: &Module, cfg: &RunConfig) -> Result<Option<plan::Plan>, InterpError> {
    check_config(module, cfg)?;
    match cfg.mode {
        Mode::Partition => Ok(Some(plan::analyze(module, cfg.num_devices)?)),
        Mode::Replica => Ok(None),
    }
}

fn param_shapes(module: &Module, plan: Option<&plan::Plan>) -> Vec<Shape> {
    module
        .entry()
        .params
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let declared = &module.instr(p).shape;
            match plan.and_then(|pl| pl.param_tags.get(i)) {
                Some(t) => t.local_shape(declared),
                None => declared.clone(),
            }
        })
        .collect()
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
    if let Some(e) = plan.as_ref().and_then(|p| p.deferred.clone()) {
        return Err(e);
    }
    let declared = module.entry_result_shape();
    let shape = match plan.as_ref().and_then(|p| p.root_tag.as_ref()) {
        Some(t) => t.local_shape(declared),
        None => declared.clone(),
    };
    Ok(vec![shape; cfg.num_devices])
}

/// Partition mode: the tilings of the entry parameters (one per parameter) and of the
/// entry result's array leaves, as [`local_param_shapes`] and [`local_result_shapes`] use
/// them (`None`: every device holds the full value). Replica mode: `None`.
#[allow(clippy::type_complexity)]
pub fn entry_tilings(
    module: &Module,
    cfg: &RunConfig,
) -> Result<Option<(Vec<Option<Tiling>>, Vec<Option<Tiling>>)>, InterpError> {
    let Some(plan) = make_plan(module, cfg)? else { return Ok(None) };
    let tiling = |t: &plan::Tag| match t {
        plan::Tag::Local(t) => Some(t.clone()),
        _ => None,
    };
    let params = (0..module.entry().params.len()).map(|i| plan.param_tags.get(i).and_then(tiling)).collect();
    let declared = module.entry_result_shape();
    let results = match &plan.root_tag {
        Some(t) => t.leaves(declared).iter().map(tiling).collect(),
        None => declared.leaves().iter().map(|_| None).collect(),
    };
    Ok(Some((params, results)))
}

/// Runs the entry computation. `args[d]` are device `d`'s entry parameters (each of the
/// shape [`local_param_shapes`] gives); returns each device's entry result.
pub fn run(module: &Module, cfg: &RunConfig, args: &[Vec<Literal>]) -> Result<Vec<Literal>, InterpError> {
    let plan = make_plan(module, cfg)?;
    if let Some(e) = plan.as_ref().and_then(|p| p.deferred.clone()) {
        return Err(e);
    }
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
