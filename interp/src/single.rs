//! One device's view, one instruction at a time: the interpreter's per-op code for
//! backends that run a module as a program of separate steps (the host backend runs
//! every non-collective instruction of a thunk program through [`InstrEvaluator::eval`]).
//!
//! Collectives are not evaluated here (the backend runs them), and neither is anything
//! whose called computations contain a collective: that needs every device inside the
//! callee. A backend inlines such calls first; a `while` or `conditional` with a collective
//! inside is refused when the module is compiled. `replica-id` / `partition-id` inside a
//! callee give the device's own id.

use std::collections::{HashMap, HashSet};

use hlo::sharding::{Plan, is_sharding_call};
use hlo::{CompId, InstrId, Literal, Module, Opcode, Shape};

use crate::eval::{Ctx, Interp};
use crate::{InterpError, Mode, RunConfig, deferred, describe, make_plan, param_shapes, shard};

type R<T> = Result<T, InterpError>;

/// The per-instruction evaluator for a module on a device set. Build once per module and
/// device set; [`InstrEvaluator::eval`] is then cheap to call from any thread.
#[derive(Debug)]
pub struct InstrEvaluator {
    plan: Option<Plan>,
    mode: Mode,
    num_devices: usize,
    params: Vec<Shape>,
    /// Instructions with an operand cut into this device's shard before use.
    cuts: HashSet<InstrId>,
    /// Computations that contain (transitively) a collective.
    needs_devices: HashMap<CompId, bool>,
}

/// Errors on the first instruction, in any computation the entry reaches, whose op no
/// backend executes: a compile-time error naming it rather than a failure mid-run.
fn check_executable(m: &Module) -> R<()> {
    let mut seen = HashSet::new();
    let mut stack = vec![m.entry];
    while let Some(c) = stack.pop() {
        let Some(comp) = m.comps.get(c).filter(|_| seen.insert(c)) else { continue };
        for &id in &comp.instrs {
            let ins = m.instr(id);
            let target = ins.attrs.custom_call_target.as_deref().unwrap_or("");
            let custom = format!("custom-call target \"{target}\" is not supported");
            let why = match crate::unexecuted(ins.opcode) {
                Some(why) => Some(why.to_string()),
                None if ins.opcode == Opcode::CustomCall && !is_sharding_call(target) => Some(custom),
                None => None,
            };
            if let Some(why) = why {
                return Err(InterpError::UnsupportedOp {
                    op: ins.opcode.name().to_string(),
                    instr: describe(m, id),
                    why,
                });
            }
            stack.extend(ins.called.iter().copied());
        }
    }
    Ok(())
}

fn needs_devices(m: &Module, comp: CompId, memo: &mut HashMap<CompId, bool>, depth: usize) -> bool {
    if let Some(&v) = memo.get(&comp) {
        return v;
    }
    // Assume the worst while visiting (and past any sane depth), so cycles terminate.
    memo.insert(comp, true);
    let Some(c) = m.comps.get(comp) else { return true };
    if depth > 64 {
        return true;
    }
    let v = c.instrs.iter().any(|&i| {
        m.instrs.get(i).is_none_or(|ins| {
            ins.opcode.is_collective()
                || ins.opcode.is_collective_done()
                || ins.called.iter().any(|&cc| needs_devices(m, cc, memo, depth + 1))
        })
    });
    memo.insert(comp, v);
    v
}

impl InstrEvaluator {
    /// Analyses `module` for `cfg` (in partition mode, which values are shards).
    pub fn new(module: &Module, cfg: &RunConfig) -> R<Self> {
        check_executable(module)?;
        let plan = make_plan(module, cfg)?;
        deferred(module, plan.as_ref())?;
        let params = param_shapes(module, plan.as_ref());
        let cuts = plan.as_ref().map(|p| p.slices.keys().map(|&(u, _)| u).collect()).unwrap_or_default();
        let mut memo = HashMap::new();
        for (cid, _) in module.comps.iter() {
            needs_devices(module, cid, &mut memo, 0);
        }
        // Entry instructions run one device at a time; a collective inside one of their
        // computations (a loop body, a branch) would need the others.
        for &id in &module.entry().instrs {
            let ins = module.instr(id);
            if !ins.opcode.is_collective() && ins.called.iter().any(|c| memo.get(c).copied().unwrap_or(true)) {
                return Err(InterpError::UnsupportedOp {
                    op: ins.opcode.name().to_string(),
                    instr: describe(module, id),
                    why: "collectives inside its computations (a loop body or a branch) are not supported yet".into(),
                });
            }
        }
        Ok(InstrEvaluator { plan, mode: cfg.mode, num_devices: cfg.num_devices, params, cuts, needs_devices: memo })
    }

    /// The shape every device's value of entry instruction `id` has (its shard, where the
    /// value is sharded).
    pub fn local_shape(&self, module: &Module, id: InstrId) -> Shape {
        let Some(ins) = module.instrs.get(id) else { return Shape::Token };
        match self.plan.as_ref().and_then(|p| p.tags.get(&id)) {
            Some(t) => t.local_shape(&ins.shape),
            None => ins.shape.clone(),
        }
    }

    /// Whether [`InstrEvaluator::eval`] cuts one of `id`'s operands into the device's
    /// shard before use (so its result cannot alias an operand).
    pub fn cuts_operands(&self, id: InstrId) -> bool {
        self.cuts.contains(&id)
    }

    /// Per entry parameter, the shape each device's argument has.
    pub fn param_shapes(&self) -> &[Shape] {
        &self.params
    }

    /// Evaluates non-collective entry instruction `id` as device `device`, given that
    /// device's operand values (each of its operand's [`InstrEvaluator::local_shape`]).
    /// Returns a value of `id`'s local shape.
    pub fn eval(&self, module: &Module, id: InstrId, operands: &[Literal], device: usize) -> R<Literal> {
        let ins = module.instrs.get(id).ok_or_else(|| InterpError::BadArguments(format!("no instruction {id}")))?;
        let unsupported = |why: String| InterpError::UnsupportedOp {
            op: ins.opcode.name().to_string(),
            instr: describe(module, id),
            why,
        };
        if device >= self.num_devices {
            return Err(InterpError::BadArguments(format!("device {device} of {}", self.num_devices)));
        }
        if ins.opcode.is_collective() || ins.opcode.is_collective_done() || ins.opcode == Opcode::Parameter {
            return Err(unsupported("collectives and parameters are the backend's, not one device's".into()));
        }
        if ins.called.iter().any(|c| self.needs_devices.get(c).copied().unwrap_or(true)) {
            return Err(unsupported("a called computation contains a collective; inline it first".into()));
        }
        if operands.len() != ins.operands.len() {
            return Err(InterpError::BadArguments(format!(
                "{}: {} operands given, the instruction has {}",
                describe(module, id),
                operands.len(),
                ins.operands.len()
            )));
        }
        let expected = self.local_shape(module, id);
        if matches!(ins.opcode, Opcode::ReplicaId | Opcode::PartitionId) {
            let mine = (ins.opcode == Opcode::ReplicaId) == (self.mode == Mode::Replica);
            let v = if mine { u32::try_from(device).unwrap_or(u32::MAX) } else { 0 };
            return Ok(hlo::Array::scalar(v).into());
        }
        let rt = |why: String| InterpError::Runtime { instr: describe(module, id), why };
        let mut ops: Vec<Vec<Literal>> = Vec::with_capacity(operands.len());
        for (k, v) in operands.iter().enumerate() {
            match self.plan.as_ref().and_then(|p| p.slices.get(&(id, k))) {
                Some(t) => {
                    let a = v.as_array().ok_or_else(|| rt("cannot shard a tuple".into()))?;
                    ops.push(vec![Literal::Array(shard(t, a, device).map_err(rt)?)]);
                }
                None => ops.push(vec![v.clone()]),
            }
        }
        let refs: Vec<&Vec<Literal>> = ops.iter().collect();
        // A one-device interpreter for this device (device ids inside callees are its own).
        let interp = Interp { m: module, n: 1, mode: self.mode, plan: None, first: device };
        let out = interp.eval_instr(&Ctx { id, ins }, &refs, &[], &expected, 0)?;
        let v = out.into_iter().next().ok_or_else(|| rt("internal: no value".into()))?;
        let got = v.shape();
        if !got.compatible(&expected) {
            return Err(rt(format!("produced {got}, expected {expected}")));
        }
        Ok(v)
    }

    /// Device `device`'s entry result from the value of the root instruction (cuts full
    /// leaves into the device's shard where the result is sharded).
    pub fn finish_result(&self, module: &Module, root: Literal, device: usize) -> R<Literal> {
        let Some(p) = self.plan.as_ref().filter(|p| p.root_slices.iter().any(Option::is_some)) else {
            return Ok(root);
        };
        let root_id = module.entry().root;
        let rt = |why: String| InterpError::Runtime { instr: describe(module, root_id), why };
        let shape = root.shape();
        let mut leaves = Vec::new();
        for (leaf, t) in root.leaves().into_iter().zip(&p.root_slices) {
            leaves.push(match t {
                Some(t) => shard(t, leaf, device).map_err(rt)?,
                None => leaf.clone(),
            });
        }
        Literal::from_leaves(&shape, &mut leaves.into_iter()).ok_or_else(|| rt("internal: result leaves".into()))
    }
}
