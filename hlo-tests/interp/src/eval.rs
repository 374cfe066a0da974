//! The lockstep evaluator: every instruction's value is one [`Literal`] per device.

use std::borrow::Cow;
use std::collections::HashMap;

use hlo::sharding::{Plan, is_sharding_call};
use hlo::{Array, ArrayShape, CompId, InstrId, Instruction, Literal, Module, Opcode, PrimitiveType, Shape};

use crate::ops::{self, OpResult};
use crate::scalar::{self, Sc};
use crate::{InterpError, Mode, describe, shard};

type R<T> = Result<T, InterpError>;

/// Deepest nesting of called computations.
const MAX_DEPTH: usize = 64;

/// Most iterations of one `while` before it is an error rather than a hang (a loop whose
/// condition never becomes false would otherwise never return).
pub const MAX_WHILE_ITERATIONS: u64 = 1 << 24;

pub struct Interp<'a> {
    pub m: &'a Module,
    pub n: usize,
    pub mode: Mode,
    /// Sharding plan of the entry computation (partition mode).
    pub plan: Option<&'a Plan>,
    /// The device id of this interpreter's device 0 (`replica-id` / `partition-id` give
    /// `first + d`): a one-device interpreter for device 3 of 8 has `first` 3.
    pub first: usize,
}

/// How a reduction computation combines values.
enum Reducer {
    /// `to_apply` is one binary op on its two scalar parameters.
    Fast(Opcode),
    Generic(CompId),
}

pub(crate) struct Ctx<'b> {
    pub(crate) id: InstrId,
    pub(crate) ins: &'b Instruction,
}

impl<'a> Interp<'a> {
    fn desc(&self, id: InstrId) -> String {
        describe(self.m, id)
    }

    fn rt(&self, c: &Ctx, why: impl Into<String>) -> InterpError {
        InterpError::Runtime { instr: self.desc(c.id), why: why.into() }
    }

    fn unsupported(&self, c: &Ctx, why: impl Into<String>) -> InterpError {
        InterpError::UnsupportedOp { op: c.ins.opcode.name().to_string(), instr: self.desc(c.id), why: why.into() }
    }

    fn dtype(&self, c: &Ctx, ty: PrimitiveType) -> InterpError {
        InterpError::UnsupportedDtype {
            dtype: ty.name().to_string(),
            op: c.ins.opcode.name().to_string(),
            instr: self.desc(c.id),
        }
    }

    /// Evaluates computation `cid`; `args[p][d]` is parameter `p` on device `d`.
    pub fn eval_comp(&self, cid: CompId, args: &[Vec<Literal>], depth: usize) -> R<Vec<Literal>> {
        let comp = self.m.comps.get(cid).ok_or_else(|| InterpError::Runtime {
            instr: format!("computation {cid}"),
            why: "no such computation".into(),
        })?;
        if depth > MAX_DEPTH {
            return Err(InterpError::Runtime {
                instr: comp.name.clone(),
                why: format!("calls nested deeper than {MAX_DEPTH}"),
            });
        }
        let plan = if cid == self.m.entry { self.plan } else { None };
        let mut vals: HashMap<InstrId, Vec<Literal>> = HashMap::new();
        for &id in &comp.instrs {
            let ins = self.m.instrs.get(id).ok_or_else(|| InterpError::Runtime {
                instr: format!("{id} in {}", comp.name),
                why: "no such instruction".into(),
            })?;
            let c = Ctx { id, ins };
            let mut ops: Vec<Cow<Vec<Literal>>> = Vec::with_capacity(ins.operands.len());
            for (k, o) in ins.operands.iter().enumerate() {
                let v =
                    vals.get(o).ok_or_else(|| self.rt(&c, format!("operand {k} ({o}) is not defined before use")))?;
                match plan.and_then(|p| p.slices.get(&(id, k))) {
                    Some(t) => {
                        let mut cut = Vec::with_capacity(self.n);
                        for (d, l) in v.iter().enumerate() {
                            let a = l.as_array().ok_or_else(|| self.rt(&c, "cannot shard a tuple"))?;
                            cut.push(Literal::Array(shard(t, a, d).map_err(|e| self.rt(&c, e))?));
                        }
                        ops.push(Cow::Owned(cut));
                    }
                    None => ops.push(Cow::Borrowed(v)),
                }
            }
            let expected = match plan.and_then(|p| p.tags.get(&id)) {
                Some(t) => t.local_shape(&ins.shape),
                None => ins.shape.clone(),
            };
            for leaf in expected.leaves() {
                ops::shape(leaf.ty, leaf.dims.clone())
                    .map_err(|e| self.rt(&c, format!("result shape {expected}: {e}")))?;
            }
            let ops: Vec<&Vec<Literal>> = ops.iter().map(|c| c.as_ref()).collect();
            let out = self.eval_instr(&c, &ops, args, &expected, depth)?;
            if out.len() != self.n {
                return Err(self.rt(&c, "internal: wrong number of device values"));
            }
            for (d, v) in out.iter().enumerate() {
                let got = v.shape();
                if !got.compatible(&expected) {
                    return Err(self.rt(&c, format!("device {d} produced {got}, expected {expected}")));
                }
            }
            vals.insert(id, out);
        }
        let mut root = vals.remove(&comp.root).ok_or_else(|| InterpError::Runtime {
            instr: comp.name.clone(),
            why: "root instruction not evaluated".into(),
        })?;
        if let Some(p) = plan
            && p.root_slices.iter().any(Option::is_some)
        {
            for (d, v) in root.iter_mut().enumerate() {
                let shape = v.shape();
                let mut leaves = Vec::new();
                for (leaf, t) in v.leaves().into_iter().zip(&p.root_slices) {
                    leaves.push(match t {
                        Some(t) => shard(t, leaf, d)
                            .map_err(|why| InterpError::Runtime { instr: self.desc(comp.root), why })?,
                        None => leaf.clone(),
                    });
                }
                *v = Literal::from_leaves(&shape, &mut leaves.into_iter()).ok_or_else(|| InterpError::Runtime {
                    instr: self.desc(comp.root),
                    why: "internal: result leaves".into(),
                })?;
            }
        }
        Ok(root)
    }

    /// Runs `f` for every device.
    fn per_dev(&self, mut f: impl FnMut(usize) -> R<Literal>) -> R<Vec<Literal>> {
        (0..self.n).map(&mut f).collect()
    }

    fn arr<'l>(&self, c: &Ctx, l: &'l Literal) -> R<&'l Array> {
        l.as_array().ok_or_else(|| self.rt(c, "expected an array operand"))
    }

    fn out_array<'s>(&self, c: &Ctx, s: &'s Shape) -> R<&'s ArrayShape> {
        s.as_array().ok_or_else(|| self.rt(c, "expected an array result shape"))
    }

    fn wrap(&self, c: &Ctx, r: OpResult<Array>) -> R<Literal> {
        r.map(Literal::Array).map_err(|e| self.rt(c, e))
    }

    fn scalars_of(&self, c: &Ctx, a: &Array) -> R<Vec<Sc>> {
        ops::scalars(a).ok_or_else(|| self.dtype(c, a.shape.ty))
    }

    fn index_scalar(&self, c: &Ctx, l: &Literal) -> R<i64> {
        let a = self.arr(c, l)?;
        if a.element_count() != 1 {
            return Err(self.rt(c, "start index is not a scalar"));
        }
        self.scalars_of(c, a)?[0].as_index().ok_or_else(|| self.rt(c, "start index is not an integer"))
    }

    fn dims_attr<'s>(&self, c: &'s Ctx) -> R<&'s [i64]> {
        c.ins.attrs.dimensions.as_deref().ok_or_else(|| self.rt(c, "missing dimensions={...}"))
    }

    pub(crate) fn eval_instr(
        &self,
        c: &Ctx,
        ops: &[&Vec<Literal>],
        args: &[Vec<Literal>],
        expected: &Shape,
        depth: usize,
    ) -> R<Vec<Literal>> {
        use Opcode::*;
        let ins = c.ins;
        let need = |k: usize| -> R<()> {
            if ops.len() < k { Err(self.rt(c, format!("needs {k} operands, has {}", ops.len()))) } else { Ok(()) }
        };
        match ins.opcode {
            Parameter => {
                let p = ins.attrs.parameter_number.ok_or_else(|| self.rt(c, "parameter without number"))?;
                let v = usize::try_from(p).ok().and_then(|p| args.get(p)).ok_or_else(|| self.rt(c, "no argument"))?;
                if v.len() != self.n {
                    return Err(self.rt(c, "internal: argument device count"));
                }
                Ok(v.clone())
            }
            Constant => {
                let l = ins.attrs.literal.as_ref().ok_or_else(|| self.rt(c, "constant without literal"))?;
                Ok(vec![l.clone(); self.n])
            }
            Tuple => self.per_dev(|d| Ok(Literal::Tuple(ops.iter().map(|o| o[d].clone()).collect()))),
            GetTupleElement => {
                need(1)?;
                let i = ins.attrs.tuple_index.ok_or_else(|| self.rt(c, "missing index"))?;
                self.per_dev(|d| match &ops[0][d] {
                    Literal::Tuple(t) => usize::try_from(i)
                        .ok()
                        .and_then(|i| t.get(i))
                        .cloned()
                        .ok_or_else(|| self.rt(c, "index out of range")),
                    _ => Err(self.rt(c, "operand is not a tuple")),
                })
            }
            Copy | OptimizationBarrier | AddDependency => {
                need(1)?;
                Ok(ops[0].clone())
            }
            AfterAll => Ok(vec![Literal::Token; self.n]),
            CopyStart => {
                need(1)?;
                self.per_dev(|d| {
                    Ok(Literal::Tuple(vec![ops[0][d].clone(), ops[0][d].clone(), Array::scalar(0u32).into()]))
                })
            }
            CopyDone => {
                need(1)?;
                self.per_dev(|d| self.tuple_elem(c, &ops[0][d], 0))
            }
            Bitcast | Reshape => {
                need(1)?;
                let out = self.out_array(c, expected)?;
                self.per_dev(|d| {
                    let a = self.arr(c, &ops[0][d])?;
                    if ins.opcode == Bitcast && a.data.len() == out.byte_size() {
                        return Ok(Literal::Array(Array { shape: out.clone(), data: a.data.clone() }));
                    }
                    if a.shape.ty != out.ty {
                        return Err(self.rt(c, "reshape changes the element type"));
                    }
                    self.wrap(c, ops::reshape(a, out))
                })
            }
            Broadcast => {
                need(1)?;
                let out = self.out_array(c, expected)?;
                let dims = self.dims_attr(c)?;
                self.per_dev(|d| self.wrap(c, ops::broadcast(self.arr(c, &ops[0][d])?, out, dims)))
            }
            Transpose => {
                need(1)?;
                let dims = self.dims_attr(c)?;
                self.per_dev(|d| self.wrap(c, ops::transpose(self.arr(c, &ops[0][d])?, dims)))
            }
            Slice => {
                need(1)?;
                let sl = ins.attrs.slice.as_deref().ok_or_else(|| self.rt(c, "missing slice={...}"))?;
                self.per_dev(|d| self.wrap(c, ops::slice(self.arr(c, &ops[0][d])?, sl)))
            }
            DynamicSlice => {
                need(1)?;
                let out = self.out_array(c, expected)?;
                let sizes = ins.attrs.dynamic_slice_sizes.clone().unwrap_or_else(|| out.dims.clone());
                self.per_dev(|d| {
                    let starts = ops[1..].iter().map(|o| self.index_scalar(c, &o[d])).collect::<R<Vec<_>>>()?;
                    self.wrap(c, ops::dynamic_slice(self.arr(c, &ops[0][d])?, &starts, &sizes))
                })
            }
            DynamicUpdateSlice => {
                need(2)?;
                self.per_dev(|d| {
                    let starts = ops[2..].iter().map(|o| self.index_scalar(c, &o[d])).collect::<R<Vec<_>>>()?;
                    let a = self.arr(c, &ops[0][d])?;
                    let u = self.arr(c, &ops[1][d])?;
                    self.wrap(c, ops::dynamic_update_slice(a, u, &starts))
                })
            }
            Concatenate => {
                let dims = self.dims_attr(c)?;
                let &[dim] = dims else { return Err(self.rt(c, "concatenate needs one dimension")) };
                self.per_dev(|d| {
                    let parts = ops.iter().map(|o| self.arr(c, &o[d])).collect::<R<Vec<_>>>()?;
                    self.wrap(c, ops::concatenate(&parts, dim))
                })
            }
            Pad => {
                need(2)?;
                let cfg = ins.attrs.padding.as_deref().ok_or_else(|| self.rt(c, "missing padding="))?;
                self.per_dev(|d| self.wrap(c, ops::pad(self.arr(c, &ops[0][d])?, self.arr(c, &ops[1][d])?, cfg)))
            }
            Iota => {
                let out = self.out_array(c, expected)?;
                if !out.ty.is_computable() {
                    return Err(self.dtype(c, out.ty));
                }
                let dim = ins.attrs.iota_dimension.ok_or_else(|| self.rt(c, "missing iota_dimension"))?;
                let a = self.wrap(c, ops::iota(out, dim))?;
                Ok(vec![a; self.n])
            }
            Reverse => {
                need(1)?;
                let dims = self.dims_attr(c)?;
                self.per_dev(|d| self.wrap(c, ops::reverse(self.arr(c, &ops[0][d])?, dims)))
            }
            Convert => {
                need(1)?;
                let out = self.out_array(c, expected)?;
                self.per_dev(|d| {
                    let a = self.arr(c, &ops[0][d])?;
                    let vals = self.scalars_of(c, a)?;
                    let conv = vals
                        .into_iter()
                        .map(|v| scalar::convert(v, out.ty))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| self.dtype(c, out.ty))?;
                    self.wrap(c, ops::from_scalars(out.ty, a.shape.dims.clone(), &conv))
                })
            }
            BitcastConvert => {
                need(1)?;
                let out = self.out_array(c, expected)?;
                self.per_dev(|d| {
                    let a = self.arr(c, &ops[0][d])?;
                    for ty in [a.shape.ty, out.ty] {
                        if matches!(
                            ty,
                            PrimitiveType::S4 | PrimitiveType::U4 | PrimitiveType::Pred | PrimitiveType::Token
                        ) {
                            return Err(self.dtype(c, ty));
                        }
                    }
                    if a.data.len() != out.byte_size() {
                        return Err(
                            self.rt(c, format!("bitcast-convert of {} to {out} changes the byte size", a.shape))
                        );
                    }
                    Ok(Literal::Array(Array { shape: out.clone(), data: a.data.clone() }))
                })
            }
            op if op.is_elementwise_unary() => {
                need(1)?;
                if matches!(op, Real | Imag) {
                    return Err(self.unsupported(c, "not implemented by the interpreter"));
                }
                self.per_dev(|d| {
                    let a = self.arr(c, &ops[0][d])?;
                    let vals = self.scalars_of(c, a)?;
                    let out = vals.into_iter().map(|v| scalar::unary(op, v)).collect::<Option<Vec<_>>>();
                    let out = out.ok_or_else(|| self.dtype(c, a.shape.ty))?;
                    let ty =
                        out.first().map_or(if op == IsFinite { PrimitiveType::Pred } else { a.shape.ty }, |v| v.ty());
                    self.wrap(c, ops::from_scalars(ty, a.shape.dims.clone(), &out))
                })
            }
            Compare => {
                need(2)?;
                let dir = ins.attrs.comparison_direction.ok_or_else(|| self.rt(c, "missing direction"))?;
                let total = ins.attrs.comparison_type.as_deref() == Some("TOTALORDER");
                self.per_dev(|d| {
                    let (a, b) = (self.arr(c, &ops[0][d])?, self.arr(c, &ops[1][d])?);
                    self.same_shape(c, a, b)?;
                    let (x, y) = (self.scalars_of(c, a)?, self.scalars_of(c, b)?);
                    let out = x
                        .iter()
                        .zip(&y)
                        .map(|(&p, &q)| scalar::compare(dir, total, p, q).map(Sc::Pred))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| self.dtype(c, a.shape.ty))?;
                    self.wrap(c, ops::from_scalars(PrimitiveType::Pred, a.shape.dims.clone(), &out))
                })
            }
            Complex => Err(self.unsupported(c, "complex numbers are not computed")),
            op if op.is_elementwise_binary() => {
                need(2)?;
                self.per_dev(|d| {
                    let (a, b) = (self.arr(c, &ops[0][d])?, self.arr(c, &ops[1][d])?);
                    self.same_shape(c, a, b)?;
                    let (x, y) = (self.scalars_of(c, a)?, self.scalars_of(c, b)?);
                    let out = x
                        .iter()
                        .zip(&y)
                        .map(|(&p, &q)| scalar::binary(op, p, q))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| self.dtype(c, a.shape.ty))?;
                    self.wrap(c, ops::from_scalars(a.shape.ty, a.shape.dims.clone(), &out))
                })
            }
            Select => {
                need(3)?;
                self.per_dev(|d| {
                    let p = self.arr(c, &ops[0][d])?;
                    let (t, f) = (self.arr(c, &ops[1][d])?, self.arr(c, &ops[2][d])?);
                    self.same_shape(c, t, f)?;
                    if p.shape.ty != PrimitiveType::Pred || (p.shape.rank() != 0 && p.shape.dims != t.shape.dims) {
                        return Err(self.rt(c, format!("bad predicate {} for {}", p.shape, t.shape)));
                    }
                    let es = t.shape.ty.byte_size();
                    let mut data = f.data.clone();
                    for i in 0..t.element_count() {
                        let pi = if p.shape.rank() == 0 { 0 } else { i };
                        if p.data[pi] != 0 {
                            data[i * es..(i + 1) * es].copy_from_slice(&t.data[i * es..(i + 1) * es]);
                        }
                    }
                    Ok(Literal::Array(Array { shape: t.shape.clone(), data }))
                })
            }
            Clamp => {
                need(3)?;
                self.per_dev(|d| {
                    let (lo, x, hi) = (self.arr(c, &ops[0][d])?, self.arr(c, &ops[1][d])?, self.arr(c, &ops[2][d])?);
                    for b in [lo, hi] {
                        if b.shape.ty != x.shape.ty || (b.shape.rank() != 0 && b.shape.dims != x.shape.dims) {
                            return Err(self.rt(c, format!("bad clamp bound {} for {}", b.shape, x.shape)));
                        }
                    }
                    let (l, v, h) = (self.scalars_of(c, lo)?, self.scalars_of(c, x)?, self.scalars_of(c, hi)?);
                    let pick = |s: &[Sc], i: usize| if s.len() == 1 { s[0] } else { s[i] };
                    let out = (0..v.len())
                        .map(|i| {
                            scalar::binary(Maximum, v[i], pick(&l, i))
                                .and_then(|m| scalar::binary(Minimum, m, pick(&h, i)))
                        })
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| self.dtype(c, x.shape.ty))?;
                    self.wrap(c, ops::from_scalars(x.shape.ty, x.shape.dims.clone(), &out))
                })
            }
            Reduce => self.reduce(c, ops, depth),
            ReduceWindow => self.reduce_window(c, ops, depth),
            SelectAndScatter => self.select_and_scatter(c, ops, depth),
            Sort => self.sort(c, ops, depth),
            Gather => {
                need(2)?;
                let g = hlo::GatherDims::of(&ins.attrs).map_err(|e| self.rt(c, e))?;
                let out = self.out_array(c, expected)?;
                self.per_dev(|d| {
                    let (a, idx) = (self.arr(c, &ops[0][d])?, self.arr(c, &ops[1][d])?);
                    let starts = self
                        .scalars_of(c, idx)?
                        .iter()
                        .map(|v| v.as_index().ok_or_else(|| self.rt(c, "gather indices must be integers")))
                        .collect::<R<Vec<i64>>>()?;
                    self.wrap(c, ops::gather(a, &idx.shape, &starts, &g, out))
                })
            }
            Dot => {
                need(2)?;
                let out = self.out_array(c, expected)?;
                let dd = ins.attrs.dot.clone().unwrap_or_default();
                self.per_dev(|d| {
                    let (a, b) = (self.arr(c, &ops[0][d])?, self.arr(c, &ops[1][d])?);
                    for ty in [a.shape.ty, b.shape.ty, out.ty] {
                        if !ty.is_computable() || ty == PrimitiveType::Pred {
                            return Err(self.dtype(c, ty));
                        }
                    }
                    self.wrap(c, ops::dot(a, b, &dd, out.ty))
                })
            }
            Scatter => self.scatter(c, ops, depth),
            Convolution => {
                need(2)?;
                let cd = hlo::ConvDims::of(&ins.attrs).map_err(|e| self.rt(c, e))?;
                let w = hlo::Window::of(&ins.attrs).map_err(|e| self.rt(c, e))?;
                let out = self.out_array(c, expected)?;
                self.per_dev(|d| {
                    let (a, b) = (self.arr(c, &ops[0][d])?, self.arr(c, &ops[1][d])?);
                    self.wrap(c, ops::convolution(a, b, &cd, &w, out))
                })
            }
            While => self.while_loop(c, ops, depth),
            Conditional => self.conditional(c, ops, expected, depth),
            Call => {
                let callee = *ins.called.first().ok_or_else(|| self.rt(c, "call without computation"))?;
                let args: Vec<Vec<Literal>> = ops.iter().map(|o| (*o).clone()).collect();
                self.check_args(c, callee, &args)?;
                self.eval_comp(callee, &args, depth + 1)
            }
            CustomCall => {
                let target = ins.attrs.custom_call_target.as_deref().unwrap_or("");
                if !is_sharding_call(target) {
                    return Err(self.unsupported(c, format!("custom-call target \"{target}\" is not supported")));
                }
                if self.mode == Mode::Replica && target != "Sharding" && target != "xla.sdy.FuncResultSharding" {
                    return Err(self.unsupported(c, format!("\"{target}\" (shard_map) needs Mode::Partition")));
                }
                need(1)?;
                if ops.len() == 1 && !expected.is_tuple() {
                    Ok(ops[0].clone())
                } else {
                    self.per_dev(|d| Ok(Literal::Tuple(ops.iter().map(|o| o[d].clone()).collect())))
                }
            }
            ReplicaId | PartitionId => {
                let mine = (ins.opcode == ReplicaId) == (self.mode == Mode::Replica);
                self.per_dev(|d| Ok(Array::scalar(if mine { (self.first + d) as u32 } else { 0 }).into()))
            }
            AllReduce | AllReduceStart => self.all_reduce(c, ops, depth, false),
            ReduceScatter => self.all_reduce(c, ops, depth, true),
            AllReduceDone | CollectivePermuteDone | AllGatherDone => {
                need(1)?;
                if ins.opcode == AllReduceDone {
                    return Ok(ops[0].clone());
                }
                self.per_dev(|d| self.tuple_elem(c, &ops[0][d], 1))
            }
            AllGather | AllGatherStart => self.all_gather(c, ops, expected),
            AllToAll => self.all_to_all(c, ops, expected),
            CollectivePermute | CollectivePermuteStart => self.collective_permute(c, ops, expected),
            CollectiveBroadcast => {
                need(1)?;
                let groups = self.groups(c)?;
                let mut out = vec![Literal::Token; self.n];
                for g in &groups {
                    for &m in g {
                        out[m] = ops[0][g[0]].clone();
                    }
                }
                Ok(out)
            }
            op => Err(self.unsupported(c, unexecuted(op).unwrap_or("not executed by Peerless"))),
        }
    }

    // ---- control flow ----

    /// A scalar `pred` (or, for `conditional`, `s32`) of one device, as an integer.
    fn selector(&self, c: &Ctx, l: &Literal) -> R<(bool, i64)> {
        let a = l.as_array().filter(|a| a.shape.rank() == 0).ok_or_else(|| self.rt(c, "selector is not a scalar"))?;
        match self.scalars_of(c, a)?.first() {
            Some(Sc::Pred(p)) => Ok((true, *p as i64)),
            Some(Sc::S32(v)) => Ok((false, *v as i64)),
            _ => Err(self.rt(c, format!("selector of type {} (expected pred or s32)", a.shape.ty.name()))),
        }
    }

    /// `while`: called computations are (condition, body) — both front ends give that order.
    /// Devices leave the loop independently (a finished device's state is kept while the
    /// others go on); a body with a collective needs every device to agree, as on XLA.
    fn while_loop(&self, c: &Ctx, ops: &[&Vec<Literal>], depth: usize) -> R<Vec<Literal>> {
        let (&[cond, body], [init]) = (c.ins.called.as_slice(), ops) else {
            return Err(self.rt(c, "while needs one operand, a condition and a body"));
        };
        let mut state: Vec<Literal> = (*init).clone();
        let mut iterations = 0u64;
        loop {
            let args = [state];
            self.check_args(c, cond, &args)?;
            let go = self.eval_comp(cond, &args, depth + 1)?;
            let [state_now] = args;
            state = state_now;
            let go = go.iter().map(|l| self.selector(c, l).map(|(_, v)| v != 0)).collect::<R<Vec<bool>>>()?;
            if !go.iter().any(|&g| g) {
                return Ok(state);
            }
            if iterations == MAX_WHILE_ITERATIONS {
                return Err(self.rt(c, format!("still looping after {MAX_WHILE_ITERATIONS} iterations")));
            }
            iterations += 1;
            let split = !go.iter().all(|&g| g);
            if split && self.m.calls_collective(body) {
                return Err(self.rt(c, "devices disagree on the loop condition of a body with collectives"));
            }
            let args = [state];
            let next = self.eval_comp(body, &args, depth + 1)?;
            let [before] = args;
            state = before.into_iter().zip(next).zip(&go).map(|((b, n), &g)| if g { n } else { b }).collect();
        }
    }

    /// `conditional`: operand 0 selects the branch (pred: true → branch 0, false → branch 1;
    /// s32: that branch, out of range → the last), operand 1 + k is branch k's argument.
    fn conditional(&self, c: &Ctx, ops: &[&Vec<Literal>], expected: &Shape, depth: usize) -> R<Vec<Literal>> {
        let branches = &c.ins.called;
        if branches.is_empty() || ops.len() != branches.len() + 1 {
            return Err(self.rt(c, format!("{} branches for {} operands", branches.len(), ops.len())));
        }
        let mut pick = Vec::with_capacity(self.n);
        for l in ops[0] {
            pick.push(match self.selector(c, l)? {
                (true, v) if branches.len() == 2 => usize::from(v == 0),
                (true, _) => return Err(self.rt(c, "a pred selector needs exactly two branches")),
                (false, v) => usize::try_from(v).ok().filter(|&k| k < branches.len()).unwrap_or(branches.len() - 1),
            });
        }
        let mut out: Vec<Option<Literal>> = vec![None; self.n];
        for (k, &b) in branches.iter().enumerate() {
            if !pick.contains(&k) {
                continue;
            }
            if pick.iter().any(|&p| p != k) && self.m.calls_collective(b) {
                return Err(self.rt(c, "devices take different branches and one has collectives"));
            }
            let args = [ops[k + 1].clone()];
            self.check_args(c, b, &args)?;
            for (d, v) in self.eval_comp(b, &args, depth + 1)?.into_iter().enumerate() {
                if pick[d] == k {
                    out[d] = Some(v);
                }
            }
        }
        let out: Vec<Literal> = out.into_iter().flatten().collect();
        if out.len() != self.n || out.iter().any(|v| !v.shape().compatible(expected)) {
            return Err(self.rt(c, format!("branches must produce {expected}")));
        }
        Ok(out)
    }

    fn tuple_elem(&self, c: &Ctx, l: &Literal, i: usize) -> R<Literal> {
        match l {
            Literal::Tuple(t) => t.get(i).cloned().ok_or_else(|| self.rt(c, "tuple too short")),
            _ => Err(self.rt(c, "operand is not a tuple")),
        }
    }

    fn same_shape(&self, c: &Ctx, a: &Array, b: &Array) -> R<()> {
        if a.shape.compatible(&b.shape) {
            Ok(())
        } else {
            Err(self.rt(c, format!("operand shapes differ: {} vs {}", a.shape, b.shape)))
        }
    }

    fn check_args(&self, c: &Ctx, callee: CompId, args: &[Vec<Literal>]) -> R<()> {
        let comp = self.m.comps.get(callee).ok_or_else(|| self.rt(c, "no such computation"))?;
        if comp.params.len() != args.len() {
            return Err(
                self.rt(c, format!("{} takes {} parameters, given {}", comp.name, comp.params.len(), args.len()))
            );
        }
        for (i, (&p, a)) in comp.params.iter().zip(args).enumerate() {
            let want = &self.m.instr(p).shape;
            if let Some(v) = a.iter().find(|v| !v.shape().compatible(want)) {
                return Err(
                    self.rt(c, format!("argument {i} of {} has shape {}, expected {want}", comp.name, v.shape()))
                );
            }
        }
        Ok(())
    }

    // ---- reductions ----

    fn reducer(&self, comp: CompId) -> Reducer {
        match single_op_reducer(self.m, comp) {
            Some(op) => Reducer::Fast(op),
            None => Reducer::Generic(comp),
        }
    }

    /// Applies the reducer: `accs` and `xs` are one element of each of the N reduced values.
    fn combine(&self, c: &Ctx, r: &Reducer, accs: &[Sc], xs: &[Sc], depth: usize) -> R<Vec<Sc>> {
        match r {
            Reducer::Fast(op) => {
                let v = scalar::binary(*op, accs[0], xs[0]).ok_or_else(|| self.dtype(c, accs[0].ty()))?;
                Ok(vec![v])
            }
            Reducer::Generic(comp) => {
                let sub = Interp { m: self.m, n: 1, mode: self.mode, plan: None, first: self.first };
                let args: Vec<Vec<Literal>> = accs
                    .iter()
                    .chain(xs)
                    .map(|&s| {
                        let mut data = vec![0u8; s.ty().byte_size()];
                        s.write(&mut data);
                        vec![Literal::Array(Array { shape: ArrayShape::scalar(s.ty()), data })]
                    })
                    .collect();
                self.check_args(c, *comp, &args)?;
                let out = sub.eval_comp(*comp, &args, depth + 1)?;
                let leaves = out[0].leaves();
                if leaves.len() != accs.len() {
                    return Err(self.rt(c, "reduction computation returns the wrong number of values"));
                }
                leaves
                    .iter()
                    .map(|a| {
                        if a.element_count() != 1 {
                            return Err(self.rt(c, "reduction computation returns a non-scalar"));
                        }
                        Ok(self.scalars_of(c, a)?[0])
                    })
                    .collect()
            }
        }
    }

    fn reduce(&self, c: &Ctx, ops: &[&Vec<Literal>], depth: usize) -> R<Vec<Literal>> {
        let ins = c.ins;
        let comp = *ins.called.first().ok_or_else(|| self.rt(c, "reduce without to_apply"))?;
        let red = self.reducer(comp);
        if ops.is_empty() || !ops.len().is_multiple_of(2) {
            return Err(self.rt(c, "reduce needs N inputs and N init values"));
        }
        let nv = ops.len() / 2;
        let rdims = self.dims_attr(c)?;
        self.per_dev(|d| {
            let inputs = ops[..nv].iter().map(|o| self.arr(c, &o[d])).collect::<R<Vec<_>>>()?;
            let inits = ops[nv..].iter().map(|o| self.arr(c, &o[d])).collect::<R<Vec<_>>>()?;
            let in_dims = &inputs[0].shape.dims;
            let rank = in_dims.len();
            if inputs.iter().any(|a| &a.shape.dims != in_dims) || inits.iter().any(|a| a.shape.rank() != 0) {
                return Err(self.rt(c, "reduce inputs differ in shape or inits are not scalars"));
            }
            let mut seen = vec![false; rank];
            for &r in rdims {
                if r < 0 || r as usize >= rank || std::mem::replace(&mut seen[r as usize], true) {
                    return Err(self.rt(c, format!("bad reduce dimensions {rdims:?} for rank {rank}")));
                }
            }
            let kept: Vec<usize> = (0..rank).filter(|&k| !seen[k]).collect();
            let out_dims: Vec<i64> = kept.iter().map(|&k| in_dims[k]).collect();
            let out_count: usize = out_dims.iter().map(|&x| x as usize).product();
            let mut out_strides = vec![0usize; rank];
            let mut s = 1;
            for &k in kept.iter().rev() {
                out_strides[k] = s;
                s *= in_dims[k] as usize;
            }
            let xs = inputs.iter().map(|a| self.scalars_of(c, a)).collect::<R<Vec<_>>>()?;
            let init = inits.iter().map(|a| Ok(self.scalars_of(c, a)?[0])).collect::<R<Vec<_>>>()?;
            let mut acc: Vec<Vec<Sc>> = (0..out_count).map(|_| init.clone()).collect();
            let dims: Vec<usize> = in_dims.iter().map(|&x| x as usize).collect();
            let mut err = None;
            let mut xv = vec![init[0]; nv];
            ops::for_each_index(&dims, |idx, flat| {
                if err.is_some() {
                    return;
                }
                let o: usize = idx.iter().zip(&out_strides).map(|(i, s)| i * s).sum();
                for k in 0..nv {
                    xv[k] = xs[k][flat];
                }
                match self.combine(c, &red, &acc[o], &xv, depth) {
                    Ok(v) => acc[o] = v,
                    Err(e) => err = Some(e),
                }
            });
            if let Some(e) = err {
                return Err(e);
            }
            self.accumulated(c, &acc, &inits, out_dims)
        })
    }

    /// The result of a reduction of N values: `acc[i]` holds element `i` of each of them
    /// (`inits` give the types of an empty result); one array, or a tuple when the
    /// instruction's shape is one.
    fn accumulated(&self, c: &Ctx, acc: &[Vec<Sc>], inits: &[&Array], out_dims: Vec<i64>) -> R<Literal> {
        let mut results = Vec::with_capacity(inits.len());
        for (k, init) in inits.iter().enumerate() {
            let vals: Vec<Sc> = acc.iter().map(|a| a[k]).collect();
            let ty = vals.first().map_or(init.shape.ty, |v| v.ty());
            results.push(Literal::Array(ops::from_scalars(ty, out_dims.clone(), &vals).map_err(|e| self.rt(c, e))?));
        }
        Ok(if results.len() == 1 && !c.ins.shape.is_tuple() {
            results.pop().unwrap_or(Literal::Token)
        } else {
            Literal::Tuple(results)
        })
    }

    /// `reduce-window` of N inputs with N init values: each output element starts from the
    /// init values and folds in the input elements its window covers, in row-major window
    /// order (padding and base-dilation holes read nothing, as on XLA's CPU backend:
    /// [`ops::window_reads`]). Scalar inputs are returned as they are, as XLA does.
    fn reduce_window(&self, c: &Ctx, ops: &[&Vec<Literal>], depth: usize) -> R<Vec<Literal>> {
        let comp = *c.ins.called.first().ok_or_else(|| self.rt(c, "reduce-window without to_apply"))?;
        let red = self.reducer(comp);
        if ops.is_empty() || !ops.len().is_multiple_of(2) {
            return Err(self.rt(c, "reduce-window needs N inputs and N init values"));
        }
        let nv = ops.len() / 2;
        let window = hlo::Window::of(&c.ins.attrs).map_err(|e| self.rt(c, e))?;
        if window.dims.iter().any(|d| d.reversal) {
            return Err(self.unsupported(c, "a reversed window (rhs_reversal) is not supported"));
        }
        self.per_dev(|d| {
            let inputs = ops[..nv].iter().map(|o| self.arr(c, &o[d])).collect::<R<Vec<_>>>()?;
            let inits = ops[nv..].iter().map(|o| self.arr(c, &o[d])).collect::<R<Vec<_>>>()?;
            let in_dims = &inputs[0].shape.dims;
            if inputs.iter().any(|a| &a.shape.dims != in_dims) || inits.iter().any(|a| a.shape.rank() != 0) {
                return Err(self.rt(c, "reduce-window inputs differ in shape or inits are not scalars"));
            }
            let out_dims = window.output_dims(in_dims).map_err(|e| self.rt(c, e))?;
            let out_count = ops::shape(inits[0].shape.ty, out_dims.clone()).map_err(|e| self.rt(c, e))?.element_count();
            let xs = inputs.iter().map(|a| self.scalars_of(c, a)).collect::<R<Vec<_>>>()?;
            let init = inits.iter().map(|a| Ok(self.scalars_of(c, a)?[0])).collect::<R<Vec<_>>>()?;
            if in_dims.is_empty() {
                // Scalar inputs (a window of no dimensions): XLA's compiler turns the op into a
                // copy of its inputs, whatever the init values and the reducer.
                let acc = vec![xs.iter().map(|x| x[0]).collect::<Vec<Sc>>()];
                return self.accumulated(c, &acc, &inits, out_dims);
            }
            let mut acc: Vec<Vec<Sc>> = vec![init.clone(); out_count];
            let mut err = None;
            let mut xv = init.clone();
            ops::window_reads(in_dims, &window, &out_dims, |o, src| {
                if err.is_some() {
                    return;
                }
                for k in 0..nv {
                    xv[k] = xs[k][src];
                }
                match self.combine(c, &red, &acc[o], &xv, depth) {
                    Ok(v) => acc[o] = v,
                    Err(e) => err = Some(e),
                }
            })
            .map_err(|e| self.rt(c, e))?;
            if let Some(e) = err {
                return Err(e);
            }
            self.accumulated(c, &acc, &inits, out_dims)
        })
    }

    /// `scatter` of N operands: operands, the indices, N updates; each update element is
    /// combined into its operand element in the updates' row-major order (XLA's order for
    /// repeated indices), skipping windows out of bounds.
    fn scatter(&self, c: &Ctx, ops: &[&Vec<Literal>], depth: usize) -> R<Vec<Literal>> {
        let ins = c.ins;
        let comp = *ins.called.first().ok_or_else(|| self.rt(c, "scatter without to_apply"))?;
        let red = self.reducer(comp);
        if ops.len() < 3 || ops.len().is_multiple_of(2) {
            return Err(self.rt(c, "scatter needs N operands, the indices and N updates"));
        }
        let nv = (ops.len() - 1) / 2;
        let dims = hlo::ScatterDims::of(&ins.attrs).map_err(|e| self.rt(c, e))?;
        self.per_dev(|d| {
            let operands = ops[..nv].iter().map(|o| self.arr(c, &o[d])).collect::<R<Vec<_>>>()?;
            let idx = self.arr(c, &ops[nv][d])?;
            let updates = ops[nv + 1..].iter().map(|o| self.arr(c, &o[d])).collect::<R<Vec<_>>>()?;
            let (odims, udims) = (&operands[0].shape.dims, &updates[0].shape.dims);
            if operands.iter().any(|a| &a.shape.dims != odims) || updates.iter().any(|a| &a.shape.dims != udims) {
                return Err(self.rt(c, "scatter operands (or updates) differ in shape"));
            }
            let plan = ops::ScatterPlan::new(odims, &idx.shape.dims, udims, &dims).map_err(|e| self.rt(c, e))?;
            let starts = self
                .scalars_of(c, idx)?
                .iter()
                .map(|v| v.as_index().ok_or_else(|| self.rt(c, "scatter indices must be integers")))
                .collect::<R<Vec<i64>>>()?;
            let mut vals = operands.iter().map(|a| self.scalars_of(c, a)).collect::<R<Vec<_>>>()?;
            let ups = updates.iter().map(|a| self.scalars_of(c, a)).collect::<R<Vec<_>>>()?;
            let ushape: Vec<usize> = udims.iter().map(|&x| x as usize).collect();
            let mut err = None;
            let (mut acc, mut xv) = (Vec::with_capacity(nv), Vec::with_capacity(nv));
            ops::for_each_index(&ushape, |u, flat| {
                if err.is_some() {
                    return;
                }
                let Some(o) = plan.target(u, &starts) else { return };
                acc.clear();
                xv.clear();
                for k in 0..nv {
                    acc.push(vals[k][o]);
                    xv.push(ups[k][flat]);
                }
                match self.combine(c, &red, &acc, &xv, depth) {
                    Ok(v) => {
                        for (k, x) in v.into_iter().enumerate() {
                            vals[k][o] = x;
                        }
                    }
                    Err(e) => err = Some(e),
                }
            });
            if let Some(e) = err {
                return Err(e);
            }
            let mut results = Vec::with_capacity(nv);
            for (k, v) in vals.iter().enumerate() {
                let a = ops::from_scalars(operands[k].shape.ty, odims.clone(), v).map_err(|e| self.rt(c, e))?;
                results.push(Literal::Array(a));
            }
            Ok(if nv == 1 && !ins.shape.is_tuple() {
                results.pop().unwrap_or(Literal::Token)
            } else {
                Literal::Tuple(results)
            })
        })
    }

    /// `select-and-scatter` (the gradient of a max pool): for every window position, the
    /// window's operand elements in row-major order (padding never chosen) keep the selected
    /// one while `select(selected, next)` holds; the source element at that position is then
    /// combined by `scatter` into the output (the init value everywhere else) at the selected
    /// element. Computations are (select, scatter) from both front ends.
    fn select_and_scatter(&self, c: &Ctx, ops: &[&Vec<Literal>], depth: usize) -> R<Vec<Literal>> {
        let ins = c.ins;
        let (&[select, scatter], [operand, source, init]) = (ins.called.as_slice(), ops) else {
            return Err(self.rt(c, "select-and-scatter needs an operand, a source, an init value, select and scatter"));
        };
        let w = hlo::Window::of(&ins.attrs).map_err(|e| self.rt(c, e))?;
        if w.dims.iter().any(|d| d.base_dilation != 1 || d.window_dilation != 1) {
            return Err(self.unsupported(c, "select-and-scatter with a dilated window"));
        }
        let red = self.reducer(scatter);
        self.per_dev(|d| {
            let (a, s, i) = (self.arr(c, &operand[d])?, self.arr(c, &source[d])?, self.arr(c, &init[d])?);
            let (vals, src) = (self.scalars_of(c, a)?, self.scalars_of(c, s)?);
            let init = *self.scalars_of(c, i)?.first().ok_or_else(|| self.rt(c, "init is not a scalar"))?;
            // Per window position, the operand elements it covers, in row-major window order.
            let mut reads: Vec<Vec<usize>> = vec![Vec::new(); s.element_count()];
            ops::window_reads(&a.shape.dims, &w, &s.shape.dims, |o, k| reads[o].push(k)).map_err(|e| self.rt(c, e))?;
            let mut out = vec![init; vals.len()];
            for (o, covered) in reads.iter().enumerate() {
                let Some((&first, rest)) = covered.split_first() else { continue };
                let mut chosen = first;
                for &k in rest {
                    if !self.sorts_before(c, select, &[vals[chosen]], &[vals[k]], depth)? {
                        chosen = k;
                    }
                }
                out[chosen] = self.combine(c, &red, &[out[chosen]], &[src[o]], depth)?[0];
            }
            self.wrap(c, ops::from_scalars(init.ty(), a.shape.dims.clone(), &out))
        })
    }

    /// Whether `lhs` sorts before `rhs` under comparator `comp` (parameters
    /// `lhs0, rhs0, lhs1, rhs1, …`); a single `compare(p0, p1)` is evaluated directly.
    fn sorts_before(&self, c: &Ctx, comp: CompId, lhs: &[Sc], rhs: &[Sc], depth: usize) -> R<bool> {
        if let Some(cm) = self.m.comps.get(comp) {
            let root = self.m.instr(cm.root);
            if root.opcode == Opcode::Compare
                && cm.params.len() >= 2
                && root.operands == [cm.params[0], cm.params[1]]
                && let Some(dir) = root.attrs.comparison_direction
            {
                let total = root.attrs.comparison_type.as_deref() == Some("TOTALORDER");
                return scalar::compare(dir, total, lhs[0], rhs[0]).ok_or_else(|| self.dtype(c, lhs[0].ty()));
            }
        }
        let lit = |s: Sc| {
            let mut data = vec![0u8; s.ty().byte_size()];
            s.write(&mut data);
            vec![Literal::Array(Array { shape: ArrayShape::scalar(s.ty()), data })]
        };
        let args: Vec<Vec<Literal>> = lhs.iter().zip(rhs).flat_map(|(&a, &b)| [lit(a), lit(b)]).collect();
        self.check_args(c, comp, &args)?;
        let sub = Interp { m: self.m, n: 1, mode: self.mode, plan: None, first: self.first };
        let out = sub.eval_comp(comp, &args, depth + 1)?;
        match out.first().and_then(|l| l.as_array()) {
            Some(a) if a.shape.ty == PrimitiveType::Pred && a.element_count() == 1 => Ok(a.data[0] != 0),
            _ => Err(self.rt(c, "the comparator does not return a pred scalar")),
        }
    }

    /// `sort` of N operands along one dimension: every slice is reordered by the comparator
    /// (a stable merge sort, so equal keys keep their order, as `is_stable=true` asks; an
    /// inconsistent comparator gives some order, never a panic).
    fn sort(&self, c: &Ctx, ops: &[&Vec<Literal>], depth: usize) -> R<Vec<Literal>> {
        let ins = c.ins;
        let comp = *ins.called.first().ok_or_else(|| self.rt(c, "sort without a comparator"))?;
        let &[dim] = self.dims_attr(c)? else { return Err(self.rt(c, "sort needs one dimension")) };
        if ops.is_empty() {
            return Err(self.rt(c, "sort of nothing"));
        }
        self.per_dev(|d| {
            let arrays = ops.iter().map(|o| self.arr(c, &o[d])).collect::<R<Vec<_>>>()?;
            let dims = &arrays[0].shape.dims;
            if arrays.iter().any(|a| &a.shape.dims != dims) {
                return Err(self.rt(c, "sort operands differ in shape"));
            }
            let k = usize::try_from(dim).ok().filter(|&k| k < dims.len()).ok_or_else(|| self.rt(c, "bad dimension"))?;
            let len = dims[k] as usize;
            let inner: usize = dims[k + 1..].iter().map(|&x| x as usize).product();
            let total: usize = dims.iter().map(|&x| x as usize).product();
            let xs = arrays.iter().map(|a| self.scalars_of(c, a)).collect::<R<Vec<_>>>()?;
            let mut out: Vec<Vec<Sc>> = xs.clone();
            let mut err = None;
            for slice in 0..total.checked_div(len).unwrap_or(0) {
                let (o, i) = (slice / inner.max(1), slice % inner.max(1));
                let at = |j: usize| (o * len + j) * inner + i;
                let key = |j: usize| xs.iter().map(|x| x[at(j)]).collect::<Vec<Sc>>();
                let mut before = |a: usize, b: usize| -> bool {
                    if err.is_some() {
                        return false;
                    }
                    self.sorts_before(c, comp, &key(a), &key(b), depth).unwrap_or_else(|e| {
                        err = Some(e);
                        false
                    })
                };
                let order = merge_sort(len, &mut before);
                for (j, &from) in order.iter().enumerate() {
                    for (dst, src) in out.iter_mut().zip(&xs) {
                        dst[at(j)] = src[at(from)];
                    }
                }
            }
            if let Some(e) = err {
                return Err(e);
            }
            let results = out
                .iter()
                .zip(&arrays)
                .map(|(v, a)| {
                    Ok(Literal::Array(ops::from_scalars(a.shape.ty, dims.clone(), v).map_err(|e| self.rt(c, e))?))
                })
                .collect::<R<Vec<_>>>()?;
            Ok(if results.len() == 1 && !ins.shape.is_tuple() {
                results.into_iter().next().unwrap_or(Literal::Token)
            } else {
                Literal::Tuple(results)
            })
        })
    }

    // ---- collectives ----

    /// (replica count, partition count) for the shared group analysis.
    fn counts(&self) -> (usize, usize) {
        self.mode.counts(self.n)
    }

    /// Groups of device ids for a collective, following XLA's CollectiveOpGroupMode
    /// (`hlo::analysis::device_groups`, shared with the emitter).
    fn groups(&self, c: &Ctx) -> R<Vec<Vec<usize>>> {
        let (r, p) = self.counts();
        hlo::analysis::device_groups(self.m, c.id, r, p).map_err(|e| self.rt(c, e))
    }

    /// The array operands of a (possibly variadic) collective on every device: `[operand][device]`.
    fn arrays<'l>(&self, c: &Ctx, ops: &[&'l Vec<Literal>]) -> R<Vec<Vec<&'l Array>>> {
        if ops.is_empty() {
            return Err(self.rt(c, "collective without operands"));
        }
        ops.iter().map(|o| o.iter().map(|l| self.arr(c, l)).collect()).collect()
    }

    /// Packs per-operand results into each device's value (a tuple when variadic).
    fn pack(&self, results: Vec<Vec<Array>>, tuple: bool) -> Vec<Literal> {
        let mut per_dev: Vec<Vec<Literal>> = vec![Vec::new(); self.n];
        for r in results {
            for (d, a) in r.into_iter().enumerate() {
                per_dev[d].push(Literal::Array(a));
            }
        }
        per_dev
            .into_iter()
            .map(|mut v| if !tuple && v.len() == 1 { v.pop().unwrap_or(Literal::Token) } else { Literal::Tuple(v) })
            .collect()
    }

    fn all_reduce(&self, c: &Ctx, ops: &[&Vec<Literal>], depth: usize, scatter: bool) -> R<Vec<Literal>> {
        let comp = *c.ins.called.first().ok_or_else(|| self.rt(c, "missing to_apply"))?;
        let red = self.reducer(comp);
        let groups = self.groups(c)?;
        let arrays = self.arrays(c, ops)?;
        let mut results: Vec<Vec<Array>> = Vec::new();
        for per_dev in &arrays {
            let mut out: Vec<Option<Array>> = vec![None; self.n];
            for g in &groups {
                let first = per_dev[g[0]];
                if g.iter().any(|&m| !per_dev[m].shape.compatible(&first.shape)) {
                    return Err(self.rt(c, "group members' operands differ in shape"));
                }
                let mut acc = self.scalars_of(c, first)?;
                for &m in &g[1..] {
                    let xs = self.scalars_of(c, per_dev[m])?;
                    for (a, &x) in acc.iter_mut().zip(&xs) {
                        *a = self.combine(c, &red, &[*a], &[x], depth)?[0];
                    }
                }
                let ty = acc.first().map_or(first.shape.ty, |v| v.ty());
                let full = ops::from_scalars(ty, first.shape.dims.clone(), &acc).map_err(|e| self.rt(c, e))?;
                for (k, &m) in g.iter().enumerate() {
                    out[m] = Some(if scatter { self.block(c, &full, g.len(), k)? } else { full.clone() });
                }
            }
            results
                .push(out.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| self.rt(c, "device not in a group"))?);
        }
        Ok(self.pack(results, c.ins.shape.is_tuple()))
    }

    /// Block `k` of `g` along the collective's dimension.
    fn block(&self, c: &Ctx, a: &Array, g: usize, k: usize) -> R<Array> {
        let &[dim] = self.dims_attr(c)? else { return Err(self.rt(c, "needs one dimension")) };
        if dim < 0 || dim as usize >= a.shape.rank() {
            return Err(self.rt(c, format!("dimension {dim} out of range for {}", a.shape)));
        }
        let size = a.shape.dims[dim as usize];
        if g == 0 || size % g as i64 != 0 {
            return Err(self.rt(c, format!("dimension {dim} of {} does not split into {g} blocks", a.shape)));
        }
        let b = size / g as i64;
        let mut starts = vec![0; a.shape.rank()];
        starts[dim as usize] = b * k as i64;
        let mut dims = a.shape.dims.clone();
        dims[dim as usize] = b;
        Ok(ops::window(a, &starts, ArrayShape::new(a.shape.ty, dims)))
    }

    fn all_gather(&self, c: &Ctx, ops: &[&Vec<Literal>], expected: &Shape) -> R<Vec<Literal>> {
        let &[dim] = self.dims_attr(c)? else { return Err(self.rt(c, "all-gather needs one dimension")) };
        let groups = self.groups(c)?;
        let arrays = self.arrays(c, ops)?;
        let mut results: Vec<Vec<Array>> = Vec::new();
        for per_dev in &arrays {
            let mut out: Vec<Option<Array>> = vec![None; self.n];
            for g in &groups {
                let parts: Vec<&Array> = g.iter().map(|&m| per_dev[m]).collect();
                let full = ops::concatenate(&parts, dim).map_err(|e| self.rt(c, e))?;
                for &m in g {
                    out[m] = Some(full.clone());
                }
            }
            results
                .push(out.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| self.rt(c, "device not in a group"))?);
        }
        if c.ins.opcode == Opcode::AllGatherStart {
            // (operand, result), or ((operands), (results)) when variadic.
            let variadic = matches!(expected.tuple_elements(), Some([Shape::Tuple(_), ..]));
            let gathered = self.pack(results, variadic);
            return Ok((0..self.n)
                .map(|d| {
                    let input = if variadic {
                        Literal::Tuple(ops.iter().map(|o| o[d].clone()).collect())
                    } else {
                        ops[0][d].clone()
                    };
                    Literal::Tuple(vec![input, gathered[d].clone()])
                })
                .collect());
        }
        Ok(self.pack(results, expected.is_tuple()))
    }

    fn all_to_all(&self, c: &Ctx, ops: &[&Vec<Literal>], expected: &Shape) -> R<Vec<Literal>> {
        let groups = self.groups(c)?;
        let arrays = self.arrays(c, ops)?;
        let mut out: Vec<Option<Literal>> = vec![None; self.n];
        match c.ins.attrs.dimensions.as_deref() {
            Some(&[split]) => {
                if arrays.len() != 1 {
                    return Err(self.unsupported(c, "variadic array-form all-to-all"));
                }
                let per_dev = &arrays[0];
                for g in &groups {
                    for (i, &me) in g.iter().enumerate() {
                        let chunks = g
                            .iter()
                            .map(|&sender| self.block(c, per_dev[sender], g.len(), i))
                            .collect::<R<Vec<_>>>()?;
                        let refs: Vec<&Array> = chunks.iter().collect();
                        let got = ops::concatenate(&refs, split).map_err(|e| self.rt(c, e))?;
                        out[me] = Some(Literal::Array(got));
                    }
                }
            }
            None | Some(&[]) => {
                for g in &groups {
                    if arrays.len() != g.len() {
                        return Err(self.rt(c, format!("{} operands for a group of {}", arrays.len(), g.len())));
                    }
                    for (p, &me) in g.iter().enumerate() {
                        let got: Vec<Literal> =
                            g.iter().map(|&sender| Literal::Array(arrays[p][sender].clone())).collect();
                        out[me] = Some(if expected.is_tuple() {
                            Literal::Tuple(got)
                        } else {
                            got.into_iter().next().unwrap_or(Literal::Token)
                        });
                    }
                }
            }
            Some(d) => return Err(self.rt(c, format!("all-to-all dimensions {d:?}"))),
        }
        out.into_iter().collect::<Option<Vec<_>>>().ok_or_else(|| self.rt(c, "device not in a group"))
    }

    fn collective_permute(&self, c: &Ctx, ops: &[&Vec<Literal>], expected: &Shape) -> R<Vec<Literal>> {
        if ops.len() != 1 {
            return Err(self.unsupported(c, "in-place (multi-operand) collective-permute"));
        }
        let (r, p) = self.counts();
        let pairs = hlo::analysis::permute_pairs(self.m, c.id, r, p).map_err(|e| self.rt(c, e))?;
        let mut result: Vec<Literal> = ops[0].iter().map(|l| Literal::zeros(&l.shape())).collect();
        for (src, dst) in pairs {
            result[dst] = ops[0][src].clone();
        }
        if c.ins.opcode == Opcode::CollectivePermuteStart {
            let elems = expected.tuple_elements().ok_or_else(|| self.rt(c, "start must return a tuple"))?;
            return Ok((0..self.n)
                .map(|d| {
                    let mut t = vec![ops[0][d].clone(), result[d].clone()];
                    t.extend(elems.iter().skip(2).map(Literal::zeros));
                    Literal::Tuple(t)
                })
                .collect());
        }
        Ok(result)
    }
}

/// The op of a reducer that is one associative binary op of its two scalar parameters
/// (`add`, `multiply`, `maximum`, `minimum`, `and`, `or`, `xor`, either operand order);
/// `None` for anything else. Backends use it to pick a fast path; the interpreter's fold
/// order stays the same either way.
pub fn single_op_reducer(m: &Module, comp: CompId) -> Option<Opcode> {
    let cm = m.comps.get(comp)?;
    if cm.params.len() != 2 || cm.instrs.len() != 3 {
        return None;
    }
    let root = m.instr(cm.root);
    let (p0, p1) = (cm.params[0], cm.params[1]);
    let scalar_ty = |id: InstrId| m.instr(id).shape.as_array().filter(|a| a.rank() == 0).map(|a| a.ty);
    let same = scalar_ty(p0).is_some() && scalar_ty(p0) == scalar_ty(p1) && scalar_ty(p0) == scalar_ty(cm.root);
    let ops_ok = root.operands == [p0, p1] || root.operands == [p1, p0];
    let op = root.opcode;
    (same
        && ops_ok
        && matches!(
            op,
            Opcode::Add | Opcode::Multiply | Opcode::Maximum | Opcode::Minimum | Opcode::And | Opcode::Or | Opcode::Xor
        ))
    .then_some(op)
}

/// Why the interpreter (hence every backend) never executes `op`, or `None` for the ops it
/// does (the arms of the evaluator's dispatch; custom calls are checked by target when run).
/// Compiling a module that uses one is an error naming it, before anything runs.
pub fn unexecuted(op: Opcode) -> Option<&'static str> {
    use Opcode::*;
    match op {
        Real | Imag => Some("complex numbers are not computed"),
        Complex => Some("complex numbers are not computed"),
        Parameter
        | Constant
        | Tuple
        | GetTupleElement
        | Copy
        | OptimizationBarrier
        | AddDependency
        | AfterAll
        | CopyStart
        | CopyDone
        | Bitcast
        | Reshape
        | Broadcast
        | Transpose
        | Slice
        | DynamicSlice
        | DynamicUpdateSlice
        | Concatenate
        | Pad
        | Iota
        | Reverse
        | Convert
        | BitcastConvert
        | Compare
        | Select
        | Clamp
        | Reduce
        | ReduceWindow
        | Dot
        | Call
        | While
        | Conditional
        | CustomCall
        | ReplicaId
        | PartitionId
        | AllReduce
        | AllReduceStart
        | AllReduceDone
        | ReduceScatter
        | AllGather
        | AllGatherStart
        | AllGatherDone
        | AllToAll
        | CollectivePermute
        | CollectivePermuteStart
        | CollectivePermuteDone
        | CollectiveBroadcast
        | Sort
        | Gather
        | Scatter
        | SelectAndScatter
        | Convolution => None,
        op if op.is_elementwise_unary() || op.is_elementwise_binary() => None,
        _ => Some("not executed by Peerless"),
    }
}

/// A stable bottom-up merge sort of `0..n` by `before(a, b)` ("a sorts strictly before b"),
/// returning the permutation. Unlike `slice::sort_by` it never panics on a comparator that is
/// not a strict weak order (NaN-unaware user comparators): it just yields some order.
fn merge_sort(n: usize, before: &mut impl FnMut(usize, usize) -> bool) -> Vec<usize> {
    let mut a: Vec<usize> = (0..n).collect();
    let mut b = a.clone();
    let mut width = 1;
    while width < n {
        for lo in (0..n).step_by(2 * width) {
            let mid = (lo + width).min(n);
            let hi = (lo + 2 * width).min(n);
            let (mut i, mut j) = (lo, mid);
            for slot in b.iter_mut().take(hi).skip(lo) {
                // Take from the right run only when strictly before: stability.
                if j < hi && (i >= mid || before(a[j], a[i])) {
                    *slot = a[j];
                    j += 1;
                } else {
                    *slot = a[i];
                    i += 1;
                }
            }
        }
        std::mem::swap(&mut a, &mut b);
        width *= 2;
    }
    a
}
