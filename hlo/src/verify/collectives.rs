//! The verifier's rules for collectives: replica groups, reducers, and the result shape of every collective kind and
//! its async forms.

use super::*;

impl<'a> Verifier<'a> {
    /// Validates replica groups; returns the explicit groups, `None` when absent or empty (`{}`: every device, count
    /// unknown at verify time).
    pub(super) fn groups(&self, id: InstrId, uniform: bool) -> R<Option<Vec<Vec<i64>>>> {
        let Some(rg) = &self.m.instrs[id].attrs.replica_groups else {
            return Ok(None);
        };
        let groups = match rg {
            ReplicaGroups::Explicit(g) => g.clone(),
            ReplicaGroups::Iota(i) => expand_iota(i).ok_or_else(|| {
                self.err(
                    id,
                    format!(
                        "replica_groups={rg} is not a valid iota form (product of the reshape dims must equal groups x size, with a valid permutation)"
                    ),
                )
            })?,
        };
        if groups.is_empty() {
            return Ok(None);
        }
        let mut seen = HashSet::new();
        for g in &groups {
            for &d in g {
                if d < 0 {
                    bail!(self, id, "replica_groups={rg} contains a negative id {d}");
                }
                if !seen.insert(d) {
                    bail!(self, id, "replica_groups={rg} lists id {d} more than once");
                }
            }
        }
        if uniform {
            let n = groups[0].len();
            if n == 0 {
                bail!(self, id, "{} replica groups must not be empty, got {rg}", self.op(id));
            }
            if let Some(g) = groups.iter().find(|g| g.len() != n) {
                bail!(
                    self,
                    id,
                    "{} needs replica groups of uniform size, got sizes {n} and {} in {rg}",
                    self.op(id),
                    g.len()
                );
            }
        }
        Ok(Some(groups))
    }

    pub(super) fn group_size(&self, id: InstrId) -> R<Option<i64>> {
        Ok(self.groups(id, true)?.map(|g| g[0].len() as i64))
    }

    /// all-reduce's to_apply: a binary scalar computation of the operands' element type.
    pub(super) fn collective_reducer(&self, id: InstrId) -> R {
        let c = self.called(id, "to_apply")?;
        let first = self.arr(id, 0)?;
        for i in 0..self.m.instrs[id].operands.len() {
            let a = self.arr(id, i)?;
            if a.ty != first.ty {
                bail!(
                    self,
                    id,
                    "{} operands must share one element type for the reducer, got {} and {}",
                    self.op(id),
                    arr_str(first),
                    arr_str(a)
                );
            }
        }
        self.check_reducer(id, c, &[first.ty])
    }

    /// Result is the operand shape (one operand) or the tuple of operand shapes.
    pub(super) fn operands_or_tuple(&self, id: InstrId, shapes: Vec<Shape>, what: &str) -> R {
        let got = &self.m.instrs[id].shape;
        one_or_tuple(got, shapes)
            .map_err(|want| self.err(id, format!("{} result must be {want} ({what}), got {}", self.op(id), sh(got))))
    }

    pub(super) fn operand_shapes(&self, id: InstrId) -> Vec<Shape> {
        self.m.instrs[id].operands.iter().map(|&o| self.m.instrs[o].shape.clone()).collect()
    }

    pub(super) fn all_reduce(&self, id: InstrId) -> R {
        self.min_operands(id, 1)?;
        self.groups(id, false)?;
        self.collective_reducer(id)?;
        self.operands_or_tuple(id, self.operand_shapes(id), "the operand shapes")
    }

    /// Checks that the result `r` has the operand `a`'s element type and dimensions except in dimension `d`, the one
    /// the collective `how` (gathered, scattered).
    fn result_but_dim(&self, id: InstrId, a: &ArrayShape, r: &ArrayShape, d: usize, how: &str) -> R {
        if !same_but_dim(r, a, d) {
            let (op, r, a) = (self.op(id), arr_str(r), arr_str(a));
            bail!(self, id, "{op} result {r} must match operand {a} except in the {how} dimension {d}");
        }
        Ok(())
    }

    /// Checks that `out` is `a` gathered along `d` by `group` (unknown: any positive multiple).
    pub(super) fn gathered(&self, id: InstrId, a: &ArrayShape, out: &Shape, d: usize, group: Option<i64>) -> R {
        let op = self.op(id);
        let Some(r) = out.as_array() else {
            bail!(self, id, "{op} result for operand {} must be an array, got {}", arr_str(a), sh(out));
        };
        self.result_but_dim(id, a, r, d, "gathered")?;
        let (n, m) = (a.dims[d], r.dims[d]);
        match group {
            Some(g) if n.checked_mul(g) != Some(m) => bail!(
                self,
                id,
                "{op} result dimension {d} must be {} (operand size {n} x group size {g}), got {} for {}",
                n.saturating_mul(g),
                m,
                arr_str(r)
            ),
            None if (n == 0 && m != 0) || (n != 0 && (m == 0 || m % n != 0)) => bail!(
                self,
                id,
                "{op} result dimension {d} must be a positive multiple of the operand's {n}, got {m} for {}",
                arr_str(r)
            ),
            _ => Ok(()),
        }
    }

    pub(super) fn gather_dim(&self, id: InstrId) -> R<usize> {
        let dims = self.dims_attr(id)?;
        // A dimension of every operand.
        let ranks = (0..self.m.instrs[id].operands.len()).map(|i| self.arr(id, i).map(|a| a.rank()));
        let rank = ranks.collect::<R<Vec<_>>>()?.into_iter().min().unwrap_or(usize::MAX);
        self.one_dim(id, dims, rank, self.arr(id, 0)?, "")
    }

    /// The result shapes of a variadic collective: one array for one operand, else a tuple with one element per
    /// operand.
    pub(super) fn variadic_results(&self, id: InstrId, op: &str) -> R<Vec<&'a Shape>> {
        let k = self.m.instrs[id].operands.len();
        match &self.m.instrs[id].shape {
            Shape::Tuple(t) if t.len() == k => Ok(t.iter().collect()),
            s if k == 1 && s.as_array().is_some() => Ok(vec![s]),
            s => Err(self.err(
                id,
                format!("{op} of {k} operands must produce {k} results (a tuple when more than one), got {}", sh(s)),
            )),
        }
    }

    pub(super) fn all_gather(&self, id: InstrId) -> R {
        self.min_operands(id, 1)?;
        let group = self.group_size(id)?;
        let d = self.gather_dim(id)?;
        let outs = self.variadic_results(id, "all-gather")?;
        for (i, out) in outs.into_iter().enumerate() {
            let a = self.arr(id, i)?;
            self.gathered(id, a, out, d, group)?;
        }
        Ok(())
    }

    pub(super) fn all_gather_start(&self, id: InstrId) -> R {
        self.min_operands(id, 1)?;
        let group = self.group_size(id)?;
        let d = self.gather_dim(id)?;
        let k = self.m.instrs[id].operands.len();
        let shape = &self.m.instrs[id].shape;
        let bad = || {
            self.err(
                id,
                format!(
                    "all-gather-start result must be the tuple (operand, gathered) (or ((operands...), (gathered...)) for several operands), got {}",
                    sh(shape)
                ),
            )
        };
        let Some([ins_part, outs_part]) = shape.tuple_elements() else {
            return Err(bad());
        };
        let pairs: Vec<(&Shape, &Shape)> = if k == 1 && ins_part.as_array().is_some() {
            vec![(ins_part, outs_part)]
        } else {
            match (ins_part.tuple_elements(), outs_part.tuple_elements()) {
                (Some(a), Some(b)) if a.len() == k && b.len() == k => a.iter().zip(b).collect(),
                _ => return Err(bad()),
            }
        };
        for (i, (in_s, out_s)) in pairs.into_iter().enumerate() {
            let a = self.arr(id, i)?;
            if !in_s.compatible(&Shape::Array(a.clone())) {
                bail!(
                    self,
                    id,
                    "all-gather-start tuple element for operand {i} must be {}, got {}",
                    arr_str(a),
                    sh(in_s)
                );
            }
            self.gathered(id, a, out_s, d, group)?;
        }
        Ok(())
    }

    pub(super) fn all_to_all(&self, id: InstrId) -> R {
        self.min_operands(id, 1)?;
        let group = self.group_size(id)?;
        let ins = &self.m.instrs[id];
        match ins.attrs.dimensions.as_deref() {
            Some(dims) => {
                self.n_operands(id, 1)?;
                let a = self.arr(id, 0)?;
                let d = self.one_dim(id, dims, a.rank(), a, "split ")?;
                if let Some(g) = group
                    && a.dims[d] % g != 0
                {
                    bail!(
                        self,
                        id,
                        "all-to-all split dimension {d} of {} (size {}) must be divisible by the group size {g}",
                        arr_str(a),
                        a.dims[d]
                    );
                }
                self.result_is(id, &Shape::Array(a.clone()), "same as the operand")
            }
            None => {
                (0..ins.operands.len()).try_for_each(|i| self.arr(id, i).map(drop))?;
                self.operands_or_tuple(id, self.operand_shapes(id), "the operand shapes")
            }
        }
    }

    pub(super) fn reduce_scatter(&self, id: InstrId) -> R {
        self.min_operands(id, 1)?;
        let group = self.group_size(id)?;
        let d = self.gather_dim(id)?;
        self.collective_reducer(id)?;
        let outs = self.variadic_results(id, "reduce-scatter")?;
        for (i, out) in outs.into_iter().enumerate() {
            let a = self.arr(id, i)?;
            let Some(r) = out.as_array() else {
                bail!(self, id, "reduce-scatter result {i} must be an array, got {}", sh(out));
            };
            self.result_but_dim(id, a, r, d, "scattered")?;
            let (n, m) = (a.dims[d], r.dims[d]);
            match group {
                Some(g) => {
                    if n % g != 0 {
                        bail!(
                            self,
                            id,
                            "reduce-scatter operand dimension {d} (size {n}) of {} is not divisible by the group size {g}",
                            arr_str(a)
                        );
                    }
                    if m != n / g {
                        bail!(
                            self,
                            id,
                            "reduce-scatter result dimension {d} must be {} (operand size {n} / group size {g}), got {m}",
                            n / g
                        );
                    }
                }
                None => {
                    if (m == 0 && n != 0) || (m != 0 && n % m != 0) {
                        bail!(
                            self,
                            id,
                            "reduce-scatter result dimension {d} ({m}) must divide the operand's {n} for {}",
                            arr_str(a)
                        );
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn source_target_pairs(&self, id: InstrId) -> R {
        let Some(pairs) = &self.m.instrs[id].attrs.source_target_pairs else {
            bail!(self, id, "{} needs a source_target_pairs attribute", self.op(id));
        };
        let (mut sources, mut targets) = (HashSet::new(), HashSet::new());
        for &(s, t) in pairs {
            if s < 0 || t < 0 {
                bail!(self, id, "{} source_target_pairs has a negative id in {{{s},{t}}}", self.op(id));
            }
            if !sources.insert(s) {
                bail!(self, id, "{} source_target_pairs lists source {s} more than once", self.op(id));
            }
            if !targets.insert(t) {
                bail!(self, id, "{} source_target_pairs lists target {t} more than once", self.op(id));
            }
        }
        Ok(())
    }

    pub(super) fn collective_permute(&self, id: InstrId) -> R {
        self.min_operands(id, 1)?;
        self.source_target_pairs(id)?;
        self.operands_or_tuple(id, self.operand_shapes(id), "same as the operand")
    }

    pub(super) fn collective_permute_start(&self, id: InstrId) -> R {
        self.n_operands(id, 1)?;
        self.source_target_pairs(id)?;
        let a = self.operand_shape(id, 0);
        let shape = &self.m.instrs[id].shape;
        let ok = match shape.tuple_elements() {
            Some([x, y, extra @ ..]) => {
                x.compatible(a)
                    && y.compatible(a)
                    && extra.iter().all(|e| e.as_array().is_some_and(|e| e.ty == PrimitiveType::U32))
            }
            _ => false,
        };
        if !ok {
            bail!(
                self,
                id,
                "collective-permute-start result must be the tuple ({0}, {0}) (optionally followed by u32 context), got {1}",
                sh(a),
                sh(shape)
            );
        }
        Ok(())
    }
}
