//! The verifier's rules for instructions that call computations: call, while, conditional, fusion and custom-call.

use super::*;

impl<'a> Verifier<'a> {
    /// Operands match the callee's parameters.
    pub(super) fn args_match(&self, id: InstrId, c: CompId) -> R {
        let ins = &self.m.instrs[id];
        let comp = &self.m.comps[c];
        let cname = pname(&comp.name);
        if ins.operands.len() != comp.params.len() {
            bail!(
                self,
                id,
                "{} passes {} operands to computation {cname}, which takes {} parameters",
                self.op(id),
                ins.operands.len(),
                comp.params.len()
            );
        }
        for (i, (&o, &p)) in ins.operands.iter().zip(&comp.params).enumerate() {
            let (os, ps) = (&self.m.instrs[o].shape, &self.m.instrs[p].shape);
            if !os.compatible(ps) {
                bail!(self, id, "{} operand {i} is {}, but {cname} parameter {i} is {}", self.op(id), sh(os), sh(ps));
            }
        }
        Ok(())
    }

    pub(super) fn call(&self, id: InstrId) -> R {
        let c = self.called(id, "to_apply")?;
        self.args_match(id, c)?;
        let root = &self.m.instrs[self.m.comps[c].root].shape;
        self.result_is(id, root, "the callee's root shape")
    }

    /// One parameter of shape `arg` and a root of shape `root`.
    pub(super) fn signature(&self, id: InstrId, c: CompId, what: &str, arg: &Shape, root: &Shape) -> R {
        let comp = &self.m.comps[c];
        let cname = pname(&comp.name);
        let params: Vec<&Shape> = comp.params.iter().map(|&p| &self.m.instrs[p].shape).collect();
        if params.len() != 1 || !params[0].compatible(arg) {
            let got = params.iter().map(|s| sh(s)).collect::<Vec<_>>().join(", ");
            bail!(self, id, "{what} {cname} must take one parameter {}, takes ({got})", sh(arg));
        }
        let got = &self.m.instrs[comp.root].shape;
        if !got.compatible(root) {
            bail!(self, id, "{what} {cname} must return {}, returns {}", sh(root), sh(got));
        }
        Ok(())
    }

    pub(super) fn while_loop(&self, id: InstrId) -> R {
        self.n_operands(id, 1)?;
        let ins = &self.m.instrs[id];
        let &[cond, body] = ins.called.as_slice() else {
            bail!(self, id, "while needs a condition= and a body= computation");
        };
        let state = self.operand_shape(id, 0);
        self.result_is(id, state, "the loop state's shape")?;
        self.signature(id, cond, "condition", state, &Shape::array(PrimitiveType::Pred, vec![]))?;
        self.signature(id, body, "body", state, state)
    }

    pub(super) fn conditional(&self, id: InstrId) -> R {
        let ins = &self.m.instrs[id];
        let n = ins.called.len();
        if n == 0 {
            bail!(self, id, "conditional needs branch computations");
        }
        self.n_operands(id, n + 1)?;
        let sel = self.arr(id, 0)?;
        let ok = sel.rank() == 0 && (sel.ty == PrimitiveType::S32 || (sel.ty == PrimitiveType::Pred && n == 2));
        if !ok {
            bail!(self, id, "conditional selector must be pred[] (two branches) or s32[], got {}", arr_str(sel));
        }
        for (k, &b) in ins.called.iter().enumerate() {
            self.signature(id, b, &format!("branch {k}"), self.operand_shape(id, k + 1), &ins.shape)?;
        }
        Ok(())
    }

    pub(super) fn fusion(&self, id: InstrId) -> R {
        let Some(&c) = self.m.instrs[id].called.first() else {
            bail!(self, id, "fusion needs a calls= computation");
        };
        self.args_match(id, c)
    }

    pub(super) fn custom_call(&self, id: InstrId) -> R {
        let ins = &self.m.instrs[id];
        ins.attrs.custom_call_api_version().map_err(|e| self.err(id, format!("custom-call has an {e}")))?;
        let Some(target) = ins.attrs.custom_call_target.as_deref() else {
            return Ok(());
        };
        if !SHARDING_TARGETS.contains(&target) {
            return Ok(());
        }
        // One operand → an array of the same element type; N operands (the sdy shard_map forms) → an N-tuple, element i
        // of operand i's element type.
        self.min_operands(id, 1)?;
        let n = ins.operands.len();
        let results: Vec<&Shape> = match &ins.shape {
            s @ Shape::Array(_) if n == 1 => vec![s],
            Shape::Tuple(t) if t.len() == n => t.iter().collect(),
            s => bail!(self, id, "custom-call {target} of {n} operand(s) must produce {n} result(s), got {}", sh(s)),
        };
        for (i, r) in results.into_iter().enumerate() {
            let a = self.arr(id, i)?;
            if r.as_array().is_none_or(|r| r.ty != a.ty) {
                bail!(self, id, "custom-call {target} must keep the element type, got {} -> {}", arr_str(a), sh(r));
            }
        }
        Ok(())
    }
}
