//! Verifier: checks a module's structure (ids resolve, operands are defined before use in the same computation,
//! parameters are numbered `0..n`, called computations exist and the call graph has no cycles) and every instruction's
//! shape rule, after XLA's shape inference. Ops Peerless does not execute (while, sort, gather, ...) only get the
//! structural checks.
//!
//! Errors carry the offending instruction's span (line 0 when it has none, e.g. proto input) and a message of the form
//! `%name: <opcode> <rule>, got <what>`.

/// `return Err(self.err(id, format!(..)))`: a failed rule names its instruction.
macro_rules! bail {
    ($v:expr, $id:expr, $fmt:literal $(, $arg:expr)* $(,)?) => { return Err($v.err($id, format!($fmt $(, $arg)*))) };
    ($v:expr, $id:expr, $msg:expr $(,)?) => { return Err($v.err($id, $msg)) };
}

mod calls;
mod collectives;

use std::collections::{HashMap, HashSet};
use std::fmt::Display;

use crate::ir::{CompId, InstrId, IotaReplicaGroups, MAX_IOTA_DEVICES, ReplicaGroups, Span, Window};
use crate::opcode::Opcode;
// The printer's spellings, under the short names the messages here use.
use crate::print::{array_without_layout as arr_str, int_list as list, pct as pname, shape_without_layout as sh};
use crate::types::{ArrayShape, PrimitiveType, Shape};
use crate::{Error, ErrorKind, Module};

/// Largest element count of one array the verifier accepts (2^40), so that downstream byte-size arithmetic can never
/// overflow.
pub const MAX_ELEMENTS: u128 = 1 << 40;
/// Deepest tuple nesting accepted in a shape.
pub const MAX_SHAPE_DEPTH: usize = 64;

/// Custom-call targets whose shape rule is known: one operand, result of the same element type.
const SHARDING_TARGETS: &[&str] = &[
    "Sharding",
    "SPMDFullToShardShape",
    "SPMDShardToFullShape",
    "xla.sdy.GlobalToLocalShape",
    "xla.sdy.LocalToGlobalShape",
    "xla.sdy.FuncResultSharding",
];

type R<T = ()> = Result<T, Error>;

/// Checks structure and every instruction's shape rule.
pub fn verify(module: &Module) -> Result<(), Error> {
    let v = Verifier { m: module };
    v.structure()?;
    v.call_graph_acyclic()?;
    let ids = || module.comps.values().flat_map(|comp| comp.instrs.iter().copied());
    ids().try_for_each(|id| v.shape_valid(id, &module.instrs[id].shape, 0))?;
    ids().try_for_each(|id| v.instruction(id))
}

/// Element count, `None` on a negative dimension or overflow.
fn elements(a: &ArrayShape) -> Option<u128> {
    a.dims.iter().try_fold(1u128, |acc, &d| if d < 0 { None } else { acc.checked_mul(d as u128) })
}

/// Byte size, `None` on a negative dimension or overflow.
fn bytes(a: &ArrayShape) -> Option<u128> {
    elements(a).map(|n| n * a.ty.byte_size() as u128)
}

/// Bit width of one element (s4/u4: 4), `None` for tokens.
fn bit_width(t: PrimitiveType) -> Option<u64> {
    match t {
        PrimitiveType::Token => None,
        PrimitiveType::S4 | PrimitiveType::U4 => Some(4),
        t => Some(t.byte_size() as u64 * 8),
    }
}

/// Whether `got` is the tuple of `shapes` or, for one shape, that shape; else what it must be.
fn one_or_tuple(got: &Shape, shapes: Vec<Shape>) -> Result<(), String> {
    let one = (shapes.len() == 1).then(|| shapes[0].clone());
    let tuple = Shape::Tuple(shapes);
    if got.compatible(&tuple) || one.as_ref().is_some_and(|s| got.compatible(s)) {
        return Ok(());
    }
    Err(sh(one.as_ref().unwrap_or(&tuple)))
}

/// Whether `a` and `b` have one element type and equal dimensions except dimension `d`.
fn same_but_dim(a: &ArrayShape, b: &ArrayShape, d: usize) -> bool {
    a.ty == b.ty && a.rank() == b.rank() && a.dims.iter().zip(&b.dims).enumerate().all(|(k, (x, y))| k == d || x == y)
}

/// `dims` must be distinct and each in `0..rank`.
pub(crate) fn valid_dim_set(dims: &[i64], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    dims.iter().all(|&d| d >= 0 && (d as usize) < rank && !std::mem::replace(&mut seen[d as usize], true))
}

/// Expands an iota replica-group form after bounding its sizes (so the expansion cannot overflow or allocate absurdly).
fn expand_iota(i: &IotaReplicaGroups) -> Option<Vec<Vec<i64>>> {
    let in_range = |x: i64| (0..=MAX_IOTA_DEVICES).contains(&x);
    if !in_range(i.num_groups) || !in_range(i.group_size) || !i.reshape_dims.iter().all(|&d| in_range(d)) {
        return None;
    }
    let total =
        i.reshape_dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d).filter(|&t| t <= MAX_IOTA_DEVICES))?;
    if total != i.num_groups * i.group_size {
        return None;
    }
    i.expand()
}

struct Verifier<'a> {
    m: &'a Module,
}

impl<'a> Verifier<'a> {
    fn at(&self, span: Option<Span>, message: String) -> Error {
        Error::located(ErrorKind::Verify, &self.m.source_name, span.unwrap_or_default(), message)
    }

    /// An error about instruction `id` (which must exist).
    fn err(&self, id: InstrId, msg: impl Display) -> Error {
        match self.m.instrs.get(id) {
            Some(i) => self.at(i.span, format!("{}: {msg}", pname(&i.name))),
            None => self.at(None, format!("{id}: {msg}")),
        }
    }

    fn comp_err(&self, c: CompId, msg: impl Display) -> Error {
        let comp = &self.m.comps[c];
        self.at(comp.span, format!("computation {}: {msg}", pname(&comp.name)))
    }

    fn structure(&self) -> R {
        let m = self.m;
        if m.comps.get(m.entry).is_none() {
            return Err(self.at(None, format!("entry computation {} does not exist", m.entry)));
        }
        let mut owner: HashSet<InstrId> = HashSet::new();
        for (cid, comp) in m.comps.iter() {
            if comp.instrs.is_empty() {
                return Err(self.comp_err(cid, "has no instructions"));
            }
            let members: HashSet<InstrId> = comp.instrs.iter().copied().collect();
            let mut pos: HashMap<InstrId, usize> = HashMap::new();
            for (k, &id) in comp.instrs.iter().enumerate() {
                let Some(ins) = m.instrs.get(id) else {
                    return Err(self.comp_err(cid, format!("lists instruction {id}, which does not exist")));
                };
                if ins.parent != cid {
                    let other = m.comps.get(ins.parent).map_or_else(|| ins.parent.to_string(), |c| pname(&c.name));
                    bail!(self, id, "listed in computation {} but its parent is {other}", pname(&comp.name));
                }
                if !owner.insert(id) {
                    bail!(self, id, "instruction appears more than once in the module");
                }
                for (j, &op) in ins.operands.iter().enumerate() {
                    if pos.contains_key(&op) {
                        continue;
                    }
                    let msg = match m.instrs.get(op) {
                        None => format!("operand {j} refers to instruction {op}, which does not exist"),
                        Some(o) if o.parent != cid || !members.contains(&op) => format!(
                            "operand {j} ({}) belongs to another computation, not {}",
                            pname(&o.name),
                            pname(&comp.name)
                        ),
                        Some(o) => format!("operand {j} ({}) is used before it is defined", pname(&o.name)),
                    };
                    bail!(self, id, msg);
                }
                for &cp in &ins.attrs.control_predecessors {
                    match m.instrs.get(cp) {
                        Some(o) if o.parent == cid && members.contains(&cp) => {}
                        Some(o) => bail!(
                            self,
                            id,
                            "control predecessor {} is not in computation {}",
                            pname(&o.name),
                            pname(&comp.name)
                        ),
                        None => bail!(self, id, "control predecessor {cp} does not exist"),
                    }
                }
                if let Some(c) = ins.called.iter().find(|&&c| m.comps.get(c).is_none()) {
                    bail!(self, id, "calls computation {c}, which does not exist");
                }
                pos.insert(id, k);
            }
            if !pos.contains_key(&comp.root) {
                return Err(self.comp_err(cid, format!("root {} is not one of its instructions", comp.root)));
            }
            // Parameters: numbered 0..n without gaps, and `params[i]` is parameter(i).
            let params = comp.instrs.iter().filter(|&&id| m.instrs[id].opcode == Opcode::Parameter);
            let number = |id| {
                m.instrs[id].attrs.parameter_number.ok_or_else(|| self.err(id, "parameter has no parameter number"))
            };
            let mut numbers = params.map(|&id| Ok((number(id)?, id))).collect::<R<Vec<_>>>()?;
            numbers.sort();
            for (i, &(n, id)) in numbers.iter().enumerate() {
                if n != i as i64 {
                    let got: Vec<i64> = numbers.iter().map(|p| p.0).collect();
                    bail!(
                        self,
                        id,
                        "parameters of computation {} must be numbered 0..{} without gaps or repeats, got {}",
                        pname(&comp.name),
                        numbers.len(),
                        list(&got)
                    );
                }
            }
            if comp.params.len() != numbers.len() || numbers.iter().any(|&(n, id)| comp.params[n as usize] != id) {
                return Err(self.comp_err(
                    cid,
                    format!(
                        "parameter list ({} entries) does not match its {} parameter instructions",
                        comp.params.len(),
                        numbers.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// No computation may (transitively) call itself.
    fn call_graph_acyclic(&self) -> R {
        let m = self.m;
        // 0 = unvisited, 1 = on the stack, 2 = done.
        let mut state: HashMap<CompId, u8> = HashMap::new();
        for start in m.comps.keys() {
            if state.contains_key(&start) {
                continue;
            }
            // Stack of (computation, list of (caller instr, callee), next index).
            let edges = |c: CompId| -> Vec<(InstrId, CompId)> {
                m.comps[c].instrs.iter().flat_map(|&i| m.instrs[i].called.iter().map(move |&cc| (i, cc))).collect()
            };
            let mut stack = vec![(start, edges(start), 0usize)];
            state.insert(start, 1);
            while let Some(top) = stack.last_mut() {
                if top.2 == top.1.len() {
                    state.insert(top.0, 2);
                    stack.pop();
                    continue;
                }
                let (caller, callee) = top.1[top.2];
                top.2 += 1;
                match state.get(&callee).copied().unwrap_or(0) {
                    0 => {
                        state.insert(callee, 1);
                        stack.push((callee, edges(callee), 0));
                    }
                    1 => bail!(
                        self,
                        caller,
                        "calls computation {}, which is already on the call stack (recursion is not allowed)",
                        pname(&m.comps[callee].name)
                    ),
                    _ => {}
                }
            }
        }
        Ok(())
    }

    fn shape_valid(&self, id: InstrId, s: &Shape, depth: usize) -> R {
        if depth > MAX_SHAPE_DEPTH {
            bail!(self, id, "shape nests tuples deeper than {MAX_SHAPE_DEPTH} levels");
        }
        match s {
            Shape::Array(a) => {
                if let Some(&d) = a.dims.iter().find(|&&d| d < 0) {
                    bail!(self, id, "shape has a negative dimension {d}");
                }
                match elements(a) {
                    Some(n) if n <= MAX_ELEMENTS => Ok(()),
                    _ => Err(self.err(id, format!("shape {} has more than 2^40 elements", arr_str(a)))),
                }
            }
            Shape::Tuple(t) => t.iter().try_for_each(|e| self.shape_valid(id, e, depth + 1)),
            Shape::Token => Ok(()),
        }
    }

    fn op(&self, id: InstrId) -> &'a str {
        self.m.instrs[id].opcode.name()
    }

    fn operand_shape(&self, id: InstrId, i: usize) -> &'a Shape {
        &self.m.instrs[self.m.instrs[id].operands[i]].shape
    }

    fn n_operands(&self, id: InstrId, n: usize) -> R {
        let k = self.m.instrs[id].operands.len();
        if k != n {
            let s = if n == 1 { "" } else { "s" };
            bail!(self, id, "{} expects {n} operand{s}, got {k}", self.op(id));
        }
        Ok(())
    }

    fn min_operands(&self, id: InstrId, n: usize) -> R {
        let k = self.m.instrs[id].operands.len();
        if k < n {
            bail!(self, id, "{} expects at least {n} operand(s), got {k}", self.op(id));
        }
        Ok(())
    }

    fn arr(&self, id: InstrId, i: usize) -> R<&'a ArrayShape> {
        let s = self.operand_shape(id, i);
        s.as_array().ok_or_else(|| self.err(id, format!("{} operand {i} must be an array, got {}", self.op(id), sh(s))))
    }

    fn res(&self, id: InstrId) -> R<&'a ArrayShape> {
        let s = &self.m.instrs[id].shape;
        s.as_array().ok_or_else(|| self.err(id, format!("{} result must be an array, got {}", self.op(id), sh(s))))
    }

    fn result_is(&self, id: InstrId, expected: &Shape, why: &str) -> R {
        let got = &self.m.instrs[id].shape;
        if !got.compatible(expected) {
            bail!(self, id, "{} result must be {} ({why}), got {}", self.op(id), sh(expected), sh(got));
        }
        Ok(())
    }

    fn result_dims(&self, id: InstrId, ty: PrimitiveType, dims: Vec<i64>, why: &str) -> R {
        self.result_is(id, &Shape::array(ty, dims), why)
    }

    fn dims_attr(&self, id: InstrId) -> R<&'a [i64]> {
        self.m.instrs[id]
            .attrs
            .dimensions
            .as_deref()
            .ok_or_else(|| self.err(id, format!("{} needs a dimensions={{...}} attribute", self.op(id))))
    }

    /// The one dimension, of `rank`, that `dims` names; errors show `a` and say what it is.
    fn one_dim(&self, id: InstrId, dims: &[i64], rank: usize, a: &ArrayShape, what: &str) -> R<usize> {
        match dims {
            [d] if *d >= 0 && (*d as usize) < rank => Ok(*d as usize),
            _ => Err(self.err(
                id,
                format!("{} dimensions={} must name one {what}dimension of {}", self.op(id), list(dims), arr_str(a)),
            )),
        }
    }

    fn called(&self, id: InstrId, what: &str) -> R<CompId> {
        let ins = &self.m.instrs[id];
        match ins.called.as_slice() {
            [c] => Ok(*c),
            v => Err(self.err(id, format!("{} needs exactly one {what} computation, got {}", self.op(id), v.len()))),
        }
    }

    fn instruction(&self, id: InstrId) -> R {
        use Opcode::*;
        let ins = &self.m.instrs[id];
        let op = ins.opcode;
        match op {
            Parameter => self.n_operands(id, 0),
            Constant => self.constant(id),
            _ if op.is_elementwise_unary() => self.unary(id),
            _ if op.is_elementwise_binary() => self.binary(id),
            Select => self.select(id),
            Clamp => self.clamp(id),
            Convert => self.keeps(id, "the dimensions", |a, r| a.dims == r.dims),
            BitcastConvert => self.bitcast_convert(id),
            Broadcast => self.broadcast(id),
            Reshape => {
                self.keeps(id, "the element type and element count", |a, r| a.ty == r.ty && elements(a) == elements(r))
            }
            Bitcast => self.keeps(id, "the byte size", |a, r| bytes(a) == bytes(r)),
            Transpose => self.transpose(id),
            Slice => self.slice(id),
            DynamicSlice => self.dynamic_slice(id),
            DynamicUpdateSlice => self.dynamic_update_slice(id),
            Concatenate => self.concatenate(id),
            Pad => self.pad(id),
            Iota => {
                self.n_operands(id, 0)?;
                let r = self.res(id)?;
                match ins.attrs.iota_dimension {
                    Some(d) if d >= 0 && (d as usize) < r.rank() => Ok(()),
                    Some(d) => Err(self.err(
                        id,
                        format!("iota_dimension={d} is out of range for result {} of rank {}", arr_str(r), r.rank()),
                    )),
                    None => Err(self.err(id, "iota needs an iota_dimension attribute")),
                }
            }
            Reverse => {
                self.n_operands(id, 1)?;
                let a = self.arr(id, 0)?;
                let dims = self.dims_attr(id)?;
                if !valid_dim_set(dims, a.rank()) {
                    bail!(self, id, "reverse dimensions={} must be distinct dimensions of {}", list(dims), arr_str(a));
                }
                self.result_is(id, &Shape::Array(a.clone()), "same as the operand")
            }
            Reduce => self.reduce(id),
            ReduceWindow => self.reduce_window(id),
            Dot => self.dot(id),
            Tuple => {
                let expected = Shape::Tuple(ins.operands.iter().map(|&o| self.m.instrs[o].shape.clone()).collect());
                self.result_is(id, &expected, "the tuple of its operand shapes")
            }
            GetTupleElement => {
                self.n_operands(id, 1)?;
                let s = self.operand_shape(id, 0);
                let Some(elems) = s.tuple_elements() else {
                    bail!(self, id, "get-tuple-element operand must be a tuple, got {}", sh(s));
                };
                let Some(index) = ins.attrs.tuple_index else {
                    bail!(self, id, "get-tuple-element needs an index attribute");
                };
                if index < 0 || index as usize >= elems.len() {
                    bail!(
                        self,
                        id,
                        "get-tuple-element index={index} is out of range for a tuple of {} elements {}",
                        elems.len(),
                        sh(s)
                    );
                }
                self.result_is(id, &elems[index as usize], &format!("element {index} of the operand"))
            }
            Copy => {
                self.n_operands(id, 1)?;
                self.result_is(id, &self.operand_shape(id, 0).clone(), "same as the operand")
            }
            Call => self.call(id),
            Fusion => self.fusion(id),
            ReplicaId | PartitionId => {
                self.n_operands(id, 0)?;
                self.result_is(id, &Shape::array(PrimitiveType::U32, vec![]), "a u32 scalar")
            }
            CustomCall => self.custom_call(id),
            AllReduce | AllReduceStart => self.all_reduce(id),
            AllReduceDone => {
                self.n_operands(id, 1)?;
                self.result_is(id, &self.operand_shape(id, 0).clone(), "same as the all-reduce-start operand")
            }
            AllGather => self.all_gather(id),
            AllGatherStart => self.all_gather_start(id),
            AllGatherDone => self.done(id, "the (operand, result) tuple of an", "all-gather-start", |n| n == 2),
            AllToAll => self.all_to_all(id),
            ReduceScatter => self.reduce_scatter(id),
            CollectivePermute => self.collective_permute(id),
            CollectivePermuteStart => self.collective_permute_start(id),
            CollectivePermuteDone => self.done(id, "the tuple of a", "collective-permute-start", |n| n >= 2),
            CollectiveBroadcast => {
                self.groups(id, false)?;
                Ok(())
            }
            While => self.while_loop(id),
            Conditional => self.conditional(id),
            // Parsed but not executed by Peerless: structure only.
            _ => Ok(()),
        }
    }

    /// One array operand, and a result that keeps `what` of it.
    fn keeps(&self, id: InstrId, what: &str, same: fn(&ArrayShape, &ArrayShape) -> bool) -> R {
        self.n_operands(id, 1)?;
        let (a, r) = (self.arr(id, 0)?, self.res(id)?);
        if same(a, r) {
            return Ok(());
        }
        Err(self.err(id, format!("{} must keep {what}, got {} -> {}", self.op(id), arr_str(a), arr_str(r))))
    }

    /// An async done, whose result is element 1 of its start's tuple (of `len` elements).
    fn done(&self, id: InstrId, tuple: &str, start: &str, len: fn(usize) -> bool) -> R {
        self.n_operands(id, 1)?;
        let s = self.operand_shape(id, 0);
        match s.tuple_elements() {
            Some(e) if len(e.len()) => self.result_is(id, &e[1], &format!("element 1 of the {start} tuple")),
            _ => Err(self.err(id, format!("{} operand must be {tuple} {start}, got {}", self.op(id), sh(s)))),
        }
    }

    fn constant(&self, id: InstrId) -> R {
        self.n_operands(id, 0)?;
        let ins = &self.m.instrs[id];
        let Some(lit) = &ins.attrs.literal else {
            bail!(self, id, "constant has no literal");
        };
        let ls = lit.shape();
        if !ls.compatible(&ins.shape) {
            bail!(
                self,
                id,
                "constant literal has shape {}, but the instruction's shape is {}",
                sh(&ls),
                sh(&ins.shape)
            );
        }
        for a in lit.leaves() {
            if bytes(&a.shape) != Some(a.data.len() as u128) {
                bail!(self, id, "constant literal of shape {} holds {} bytes", arr_str(&a.shape), a.data.len());
            }
        }
        Ok(())
    }

    fn unary(&self, id: InstrId) -> R {
        use Opcode::*;
        self.n_operands(id, 1)?;
        let op = self.m.instrs[id].opcode;
        let a = self.arr(id, 0)?;
        let t = a.ty;
        let component = |t: PrimitiveType| match t {
            PrimitiveType::C64 => PrimitiveType::F32,
            PrimitiveType::C128 => PrimitiveType::F64,
            t => t,
        };
        let out_ty = match op {
            IsFinite => {
                if !t.is_float() {
                    bail!(self, id, "is-finite needs a floating-point operand, got {}", arr_str(a));
                }
                PrimitiveType::Pred
            }
            Not if !(t == PrimitiveType::Pred || t.is_integral()) => {
                bail!(self, id, "not needs a pred or integer operand, got {}", arr_str(a))
            }
            PopulationCount | CountLeadingZeros if !t.is_integral() => {
                bail!(self, id, "{} needs an integer operand, got {}", op.name(), arr_str(a))
            }
            Abs | Real | Imag => component(t),
            _ => t,
        };
        self.result_dims(id, out_ty, a.dims.clone(), "elementwise")
    }

    fn binary(&self, id: InstrId) -> R {
        use Opcode::*;
        self.n_operands(id, 2)?;
        let ins = &self.m.instrs[id];
        let op = ins.opcode;
        let (a, b) = (self.arr(id, 0)?, self.arr(id, 1)?);
        if !a.compatible(b) {
            bail!(
                self,
                id,
                "{} operands must have the same element type and dimensions, got {} and {}",
                op.name(),
                arr_str(a),
                arr_str(b)
            );
        }
        let t = a.ty;
        let out_ty = match op {
            Compare => {
                if ins.attrs.comparison_direction.is_none() {
                    bail!(self, id, "compare needs a direction attribute (EQ, NE, LT, LE, GT, GE)");
                }
                PrimitiveType::Pred
            }
            And | Or | Xor if !(t == PrimitiveType::Pred || t.is_integral()) => {
                bail!(self, id, "{} needs pred or integer operands, got {}", op.name(), arr_str(a))
            }
            ShiftLeft | ShiftRightArithmetic | ShiftRightLogical if !t.is_integral() => {
                bail!(self, id, "{} needs integer operands, got {}", op.name(), arr_str(a))
            }
            Complex => match t {
                PrimitiveType::F32 => PrimitiveType::C64,
                PrimitiveType::F64 => PrimitiveType::C128,
                _ => bail!(self, id, "complex needs f32 or f64 operands, got {}", arr_str(a)),
            },
            _ => t,
        };
        self.result_dims(id, out_ty, a.dims.clone(), "elementwise")
    }

    fn select(&self, id: InstrId) -> R {
        self.n_operands(id, 3)?;
        let (p, t, f) = (self.arr(id, 0)?, self.arr(id, 1)?, self.arr(id, 2)?);
        if p.ty != PrimitiveType::Pred {
            bail!(self, id, "select predicate must be pred, got {}", arr_str(p));
        }
        if !t.compatible(f) {
            bail!(self, id, "select branches must have the same shape, got {} and {}", arr_str(t), arr_str(f));
        }
        if p.rank() != 0 && p.dims != t.dims {
            bail!(
                self,
                id,
                "select predicate must be a scalar or have the branches' dimensions, got {} for {}",
                arr_str(p),
                arr_str(t)
            );
        }
        self.result_is(id, &Shape::Array(t.clone()), "same as the branches")
    }

    fn clamp(&self, id: InstrId) -> R {
        self.n_operands(id, 3)?;
        let (lo, x, hi) = (self.arr(id, 0)?, self.arr(id, 1)?, self.arr(id, 2)?);
        for (what, b) in [("min", lo), ("max", hi)] {
            if b.ty != x.ty || (b.rank() != 0 && b.dims != x.dims) {
                bail!(
                    self,
                    id,
                    "clamp {what} must be a scalar or match the operand, with the same element type, got {} for {}",
                    arr_str(b),
                    arr_str(x)
                );
            }
        }
        self.result_is(id, &Shape::Array(x.clone()), "same as the operand")
    }

    fn bitcast_convert(&self, id: InstrId) -> R {
        self.n_operands(id, 1)?;
        let (a, r) = (self.arr(id, 0)?, self.res(id)?);
        let (Some(ib), Some(ob)) = (bit_width(a.ty), bit_width(r.ty)) else {
            bail!(self, id, "bitcast-convert cannot convert tokens");
        };
        let expected: Option<Vec<i64>> = if ib == ob {
            Some(a.dims.clone())
        } else if ib > ob {
            (ib % ob == 0).then(|| a.dims.iter().copied().chain([(ib / ob) as i64]).collect())
        } else {
            match a.dims.split_last() {
                Some((&last, rest)) if ob % ib == 0 && last == (ob / ib) as i64 => Some(rest.to_vec()),
                _ => None,
            }
        };
        match expected {
            Some(d) if d == r.dims => Ok(()),
            Some(d) => Err(self.err(
                id,
                format!(
                    "bitcast-convert from {} to {} must give dimensions {}, got {}",
                    arr_str(a),
                    r.ty,
                    list(&d),
                    arr_str(r)
                ),
            )),
            None => Err(self.err(
                id,
                format!(
                    "bitcast-convert from {} ({ib} bits) to {} ({ob} bits): the narrower operand's minor dimension must be {}",
                    arr_str(a),
                    arr_str(r),
                    ob.max(ib) / ob.min(ib)
                ),
            )),
        }
    }

    fn broadcast(&self, id: InstrId) -> R {
        self.n_operands(id, 1)?;
        let (a, r) = (self.arr(id, 0)?, self.res(id)?);
        let dims = self.dims_attr(id)?;
        if a.ty != r.ty {
            bail!(self, id, "broadcast must keep the element type, got {} -> {}", arr_str(a), arr_str(r));
        }
        if dims.len() != a.rank() {
            bail!(
                self,
                id,
                "broadcast dimensions={} must map each of the {} operand dimensions of {}",
                list(dims),
                a.rank(),
                arr_str(a)
            );
        }
        if !valid_dim_set(dims, r.rank()) {
            bail!(
                self,
                id,
                "broadcast dimensions={} must be distinct dimensions of the result {}",
                list(dims),
                arr_str(r)
            );
        }
        for (i, &d) in dims.iter().enumerate() {
            if a.dims[i] != r.dims[d as usize] {
                bail!(
                    self,
                    id,
                    "broadcast maps operand dimension {i} (size {}) to result dimension {d} (size {}): sizes must be equal",
                    a.dims[i],
                    r.dims[d as usize]
                );
            }
        }
        Ok(())
    }

    fn transpose(&self, id: InstrId) -> R {
        self.n_operands(id, 1)?;
        let a = self.arr(id, 0)?;
        let perm = self.dims_attr(id)?;
        if perm.len() != a.rank() || !valid_dim_set(perm, a.rank()) {
            bail!(
                self,
                id,
                "transpose dimensions={} must be a permutation of 0..{} for {}",
                list(perm),
                a.rank(),
                arr_str(a)
            );
        }
        let dims = perm.iter().map(|&p| a.dims[p as usize]).collect();
        self.result_dims(id, a.ty, dims, "operand dimensions permuted")
    }

    fn slice(&self, id: InstrId) -> R {
        self.n_operands(id, 1)?;
        let a = self.arr(id, 0)?;
        let Some(sl) = &self.m.instrs[id].attrs.slice else {
            bail!(self, id, "slice needs a slice={{[start:limit:stride],...}} attribute");
        };
        if sl.len() != a.rank() {
            bail!(self, id, "slice has {} dimension bounds for operand {} of rank {}", sl.len(), arr_str(a), a.rank());
        }
        let mut dims = Vec::with_capacity(sl.len());
        for (i, s) in sl.iter().enumerate() {
            if s.stride <= 0 {
                bail!(self, id, "slice stride in dimension {i} must be positive, got {}", s.stride);
            }
            if s.start < 0 || s.start > s.limit || s.limit > a.dims[i] {
                bail!(
                    self,
                    id,
                    "slice [{}:{}] in dimension {i} is out of bounds for operand {} (need 0 <= start <= limit <= {})",
                    s.start,
                    s.limit,
                    arr_str(a),
                    a.dims[i]
                );
            }
            let len = s.limit - s.start;
            dims.push(len / s.stride + i64::from(len % s.stride != 0));
        }
        self.result_dims(id, a.ty, dims, "ceil((limit-start)/stride) per dimension")
    }

    fn start_indices(&self, id: InstrId, first: usize, rank: usize) -> R {
        let n = self.m.instrs[id].operands.len() - first;
        if n != rank {
            bail!(self, id, "{} needs one start index per operand dimension ({rank}), got {n}", self.op(id));
        }
        for i in first..first + rank {
            let s = self.arr(id, i)?;
            if s.rank() != 0 || !s.ty.is_integral() {
                bail!(
                    self,
                    id,
                    "{} start index (operand {i}) must be an integer scalar, got {}",
                    self.op(id),
                    arr_str(s)
                );
            }
        }
        Ok(())
    }

    fn dynamic_slice(&self, id: InstrId) -> R {
        self.min_operands(id, 1)?;
        let a = self.arr(id, 0)?;
        self.start_indices(id, 1, a.rank())?;
        let Some(sizes) = &self.m.instrs[id].attrs.dynamic_slice_sizes else {
            bail!(self, id, "dynamic-slice needs a dynamic_slice_sizes attribute");
        };
        if sizes.len() != a.rank() || sizes.iter().zip(&a.dims).any(|(&s, &d)| s < 0 || s > d) {
            bail!(
                self,
                id,
                "dynamic-slice dynamic_slice_sizes={} must give one size per dimension, each within {}",
                list(sizes),
                arr_str(a)
            );
        }
        self.result_dims(id, a.ty, sizes.clone(), "the dynamic_slice_sizes")
    }

    fn dynamic_update_slice(&self, id: InstrId) -> R {
        self.min_operands(id, 2)?;
        let (a, u) = (self.arr(id, 0)?, self.arr(id, 1)?);
        self.start_indices(id, 2, a.rank())?;
        if u.ty != a.ty || u.rank() != a.rank() || u.dims.iter().zip(&a.dims).any(|(x, y)| x > y) {
            bail!(
                self,
                id,
                "dynamic-update-slice update {} must have the operand's element type and rank and fit within {}",
                arr_str(u),
                arr_str(a)
            );
        }
        self.result_is(id, &Shape::Array(a.clone()), "same as the operand")
    }

    fn concatenate(&self, id: InstrId) -> R {
        self.min_operands(id, 1)?;
        let dims = self.dims_attr(id)?;
        let first = self.arr(id, 0)?;
        let d = self.one_dim(id, dims, first.rank(), first, "")?;
        let mut total = 0i64;
        for i in 0..self.m.instrs[id].operands.len() {
            let a = self.arr(id, i)?;
            if !same_but_dim(a, first, d) {
                bail!(
                    self,
                    id,
                    "concatenate operands must have the same element type and equal dimensions except dimension {d}, got {} and {}",
                    arr_str(first),
                    arr_str(a)
                );
            }
            total = total.saturating_add(a.dims[d]);
        }
        let mut out = first.dims.clone();
        out[d] = total;
        self.result_dims(id, first.ty, out, "operands joined along the dimension")
    }

    fn pad(&self, id: InstrId) -> R {
        self.n_operands(id, 2)?;
        let (a, v) = (self.arr(id, 0)?, self.arr(id, 1)?);
        if v.rank() != 0 || v.ty != a.ty {
            bail!(self, id, "pad value must be a scalar of the operand's element type {}, got {}", a.ty, arr_str(v));
        }
        let Some(pads) = &self.m.instrs[id].attrs.padding else {
            bail!(self, id, "pad needs a padding=lo_hi_interior attribute");
        };
        if pads.len() != a.rank() {
            bail!(self, id, "pad has {} padding entries for operand {} of rank {}", pads.len(), arr_str(a), a.rank());
        }
        let mut dims = Vec::with_capacity(pads.len());
        for (i, (p, &n)) in pads.iter().zip(&a.dims).enumerate() {
            if p.interior < 0 {
                bail!(self, id, "pad interior padding in dimension {i} must be >= 0, got {}", p.interior);
            }
            let size = p.lo as i128 + p.hi as i128 + n as i128 + (n as i128 - 1).max(0) * p.interior as i128;
            if size < 0 || size > i64::MAX as i128 {
                bail!(
                    self,
                    id,
                    "pad gives dimension {i} a negative or overflowing size {size} (lo={}, hi={})",
                    p.lo,
                    p.hi
                );
            }
            dims.push(size as i64);
        }
        self.result_dims(id, a.ty, dims, "lo + hi + n + (n-1)*interior per dimension")
    }

    /// `comp` must take `2N` scalars (`types[i]` twice: accumulators then values) and return a scalar (`N == 1`) or an
    /// `N`-tuple of scalars of `types`.
    fn check_reducer(&self, id: InstrId, c: CompId, types: &[PrimitiveType]) -> R {
        let comp = &self.m.comps[c];
        let n = types.len();
        let cname = pname(&comp.name);
        let op = self.op(id);
        if comp.params.len() != 2 * n {
            bail!(
                self,
                id,
                "{op} to_apply computation {cname} must take {} scalar parameters, got {}",
                2 * n,
                comp.params.len()
            );
        }
        for (k, &p) in comp.params.iter().enumerate() {
            let want = Shape::array(types[k % n], vec![]);
            let got = &self.m.instrs[p].shape;
            if !got.compatible(&want) {
                bail!(
                    self,
                    id,
                    "{op} to_apply computation {cname} parameter {k} must be {}, got {}",
                    sh(&want),
                    sh(got)
                );
            }
        }
        let root = &self.m.instrs[comp.root].shape;
        one_or_tuple(root, types.iter().map(|&t| Shape::array(t, vec![])).collect()).map_err(|want| {
            self.err(id, format!("{op} to_apply computation {cname} must return {want}, got {}", sh(root)))
        })
    }

    /// reduce's and reduce-window's reducer and result: per input, an array of `dims`.
    fn reduced(&self, id: InstrId, types: &[PrimitiveType], dims: Vec<i64>, why: &str) -> R {
        let c = self.called(id, "to_apply")?;
        self.check_reducer(id, c, types)?;
        let mut outs: Vec<Shape> = types.iter().map(|&t| Shape::array(t, dims.clone())).collect();
        let expected = if outs.len() == 1 { outs.remove(0) } else { Shape::Tuple(outs) };
        self.result_is(id, &expected, why)
    }

    /// The operands of reduce and reduce-window: N inputs of one shape, then N scalar init values of their element
    /// types. Returns the first input and the N element types.
    fn inputs_and_inits(&self, id: InstrId) -> R<(&'a ArrayShape, Vec<PrimitiveType>)> {
        let op = self.op(id);
        let k = self.m.instrs[id].operands.len();
        if k == 0 || !k.is_multiple_of(2) {
            bail!(self, id, "{op} needs N inputs and N init values (an even count), got {k} operands");
        }
        let n = k / 2;
        let first = self.arr(id, 0)?;
        let mut types = Vec::with_capacity(n);
        for i in 0..n {
            let a = self.arr(id, i)?;
            if a.dims != first.dims {
                bail!(self, id, "{op} inputs must have the same dimensions, got {} and {}", arr_str(first), arr_str(a));
            }
            let init = self.arr(id, n + i)?;
            if init.rank() != 0 || init.ty != a.ty {
                bail!(
                    self,
                    id,
                    "{op} init value {i} must be a scalar {} (input {i} is {}), got {}",
                    a.ty,
                    arr_str(a),
                    arr_str(init)
                );
            }
            types.push(a.ty);
        }
        Ok((first, types))
    }

    fn reduce(&self, id: InstrId) -> R {
        let (first, types) = self.inputs_and_inits(id)?;
        let dims = self.dims_attr(id)?;
        if !valid_dim_set(dims, first.rank()) {
            bail!(self, id, "reduce dimensions={} must be distinct dimensions of {}", list(dims), arr_str(first));
        }
        let kept = first.dims.iter().enumerate().filter(|(i, _)| !dims.contains(&(*i as i64))).map(|(_, &d)| d);
        self.reduced(id, &types, kept.collect(), "input dimensions minus the reduced ones")
    }

    /// reduce-window: N inputs and N init values as reduce, a window of the inputs' rank, and per dimension as many
    /// results as window positions (`Window::output_dims`).
    fn reduce_window(&self, id: InstrId) -> R {
        let (first, types) = self.inputs_and_inits(id)?;
        let window = Window::of(&self.m.instrs[id].attrs).map_err(|e| self.err(id, format!("reduce-window {e}")))?;
        let dims = window
            .output_dims(&first.dims)
            .map_err(|e| self.err(id, format!("reduce-window {e} ({})", arr_str(first))))?;
        self.reduced(id, &types, dims, "(padded dilated input - dilated window) / stride + 1 per dimension")
    }

    fn dot(&self, id: InstrId) -> R {
        self.n_operands(id, 2)?;
        let (l, r) = (self.arr(id, 0)?, self.arr(id, 1)?);
        let res = self.res(id)?;
        let dd = self.m.instrs[id].attrs.dot.clone().unwrap_or_default();
        let bad = |msg: String| Err(self.err(id, format!("dot {msg}, for {} x {}", arr_str(l), arr_str(r))));
        for (what, lhs, rhs) in
            [("batch", &dd.lhs_batch, &dd.rhs_batch), ("contracting", &dd.lhs_contracting, &dd.rhs_contracting)]
        {
            if lhs.len() != rhs.len() {
                return bad(format!(
                    "lhs_{what}_dims={} and rhs_{what}_dims={} must have the same length",
                    list(lhs),
                    list(rhs)
                ));
            }
        }
        let lhs_all: Vec<i64> = dd.lhs_batch.iter().chain(&dd.lhs_contracting).copied().collect();
        let rhs_all: Vec<i64> = dd.rhs_batch.iter().chain(&dd.rhs_contracting).copied().collect();
        for (side, all, a) in [("lhs", &lhs_all, l), ("rhs", &rhs_all, r)] {
            if !valid_dim_set(all, a.rank()) {
                return bad(format!(
                    "{side} batch and contracting dimensions {} must be distinct and in range",
                    list(all)
                ));
            }
        }
        for (&a, &b) in dd.lhs_batch.iter().zip(&dd.rhs_batch) {
            if l.dims[a as usize] != r.dims[b as usize] {
                return bad(format!("batch dimension lhs {a} and rhs {b} differ in size"));
            }
        }
        for (&a, &b) in dd.lhs_contracting.iter().zip(&dd.rhs_contracting) {
            if l.dims[a as usize] != r.dims[b as usize] {
                return bad(format!(
                    "contracting dimension lhs {a} (size {}) and rhs {b} (size {}) differ",
                    l.dims[a as usize], r.dims[b as usize]
                ));
            }
        }
        let mut dims: Vec<i64> = dd.lhs_batch.iter().map(|&a| l.dims[a as usize]).collect();
        dims.extend(l.dims.iter().enumerate().filter(|(i, _)| !lhs_all.contains(&(*i as i64))).map(|(_, &d)| d));
        dims.extend(r.dims.iter().enumerate().filter(|(i, _)| !rhs_all.contains(&(*i as i64))).map(|(_, &d)| d));
        if res.dims != dims {
            bail!(
                self,
                id,
                "dot result must have dimensions {} (batch, lhs free, rhs free), got {}",
                list(&dims),
                arr_str(res)
            );
        }
        Ok(())
    }
}
