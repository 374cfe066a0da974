//! Static sharding analysis of the entry computation (partition mode).
//!
//! Entry parameters may carry per-device shards; the shard_map custom calls mark where
//! values switch between global and local (per-device) shapes. This pass gives every
//! entry instruction a [`Tag`]: `Global` (each device holds the declared shape) or
//! `Local(tiling)` (each device holds its shard of the declared global shape).

use std::collections::HashMap;

use super::tiling::{self, Tiling};
use crate::{Error, ErrorKind, InstrId, Module, Opcode, Shape, Sharding};

/// Where a value lives, per device.
#[derive(Clone, Debug, PartialEq)]
pub enum Tag {
    /// Every device holds the whole declared value.
    Global,
    /// Every device holds its shard of the declared (global) array.
    Local(Tiling),
    /// A tuple with at least one element that is not `Global`, per element.
    Tuple(Vec<Tag>),
}

impl Tag {
    fn tuple(ts: Vec<Tag>) -> Tag {
        if ts.iter().all(|t| *t == Tag::Global) { Tag::Global } else { Tag::Tuple(ts) }
    }

    fn local(t: Option<Tiling>) -> Tag {
        match t {
            Some(t) if !t.is_trivial() => Tag::Local(t),
            _ => Tag::Global,
        }
    }

    /// The per-device shape of a value declared as `declared`.
    pub fn local_shape(&self, declared: &Shape) -> Shape {
        match (self, declared) {
            (Tag::Local(t), Shape::Array(a)) => Shape::Array(t.shard_shape(a)),
            (Tag::Tuple(ts), Shape::Tuple(ss)) if ts.len() == ss.len() => {
                Shape::Tuple(ts.iter().zip(ss).map(|(t, s)| t.local_shape(s)).collect())
            }
            _ => declared.clone(),
        }
    }

    /// Tags of the array leaves of `shape`, depth-first.
    pub fn leaves(&self, shape: &Shape) -> Vec<Tag> {
        match (self, shape) {
            (Tag::Tuple(ts), Shape::Tuple(ss)) if ts.len() == ss.len() => {
                ts.iter().zip(ss).flat_map(|(t, s)| t.leaves(s)).collect()
            }
            (_, Shape::Tuple(ss)) => ss.iter().flat_map(|s| Tag::Global.leaves(s)).collect(),
            (t, Shape::Array(_)) => vec![t.clone()],
            (_, Shape::Token) => Vec::new(),
        }
    }

    fn element(&self, i: usize) -> Tag {
        match self {
            Tag::Tuple(ts) => ts.get(i).cloned().unwrap_or(Tag::Global),
            _ => Tag::Global,
        }
    }

    fn is_global(&self) -> bool {
        *self == Tag::Global
    }
}

/// The analysis result: where every entry value lives and where a backend must cut full
/// values into shards. Plain data; `runs` acts on it.
#[derive(Debug, Default)]
pub struct Plan {
    /// Per entry instruction, where its value lives.
    pub tags: HashMap<InstrId, Tag>,
    /// The entry result's final tag.
    pub root_tag: Option<Tag>,
    /// Per entry parameter (by number), where its argument lives.
    pub param_tags: Vec<Tag>,
}

impl Plan {
    /// Per entry parameter, the shape each device's argument has: its shard where the
    /// parameter is sharded, the declared shape otherwise.
    pub fn param_shapes(&self, m: &Module) -> Vec<Shape> {
        let Some(entry) = m.comps.get(m.entry) else { return Vec::new() };
        entry
            .params
            .iter()
            .enumerate()
            .filter_map(|(i, &p)| {
                let declared = &m.instrs.get(p)?.shape;
                Some(match self.param_tags.get(i) {
                    Some(t) => t.local_shape(declared),
                    None => declared.clone(),
                })
            })
            .collect()
    }

    /// The shape of the entry result each device returns: its shard where the result is
    /// sharded, the declared shape otherwise.
    pub fn result_shape(&self, m: &Module) -> Shape {
        let declared = m.entry_result_shape();
        match &self.root_tag {
            Some(t) => t.local_shape(declared),
            None => declared.clone(),
        }
    }
}

const FULL_TO_SHARD: [&str; 2] = ["SPMDFullToShardShape", "xla.sdy.GlobalToLocalShape"];
const SHARD_TO_FULL: [&str; 2] = ["SPMDShardToFullShape", "xla.sdy.LocalToGlobalShape"];
const PASS_THROUGH: [&str; 2] = ["Sharding", "xla.sdy.FuncResultSharding"];

fn tag_from_sharding(s: &Sharding, shape: &Shape, n: usize) -> Result<Tag, String> {
    Ok(match (s, shape) {
        (Sharding::Tuple(v), Shape::Tuple(ss)) if v.len() == ss.len() => {
            Tag::tuple(v.iter().zip(ss).map(|(s, sh)| tag_from_sharding(s, sh, n)).collect::<Result<_, _>>()?)
        }
        (s, Shape::Array(a)) => Tag::local(tiling::from_hlo(s, a.rank(), n)?),
        _ => Tag::Global,
    })
}

/// Tiling implied by a local shape alone (tile counts from the shape ratio, tiles unknown).
fn ratio_tiling(global: &Shape, local: &Shape) -> Tag {
    match (global, local) {
        (Shape::Array(g), Shape::Array(l)) if g.rank() == l.rank() => {
            let counts = g.dims.iter().zip(&l.dims).map(|(&g, &l)| if l <= 0 { 1 } else { (g + l - 1) / l }).collect();
            Tag::local(Some(Tiling { counts, coords: None }))
        }
        _ => Tag::Global,
    }
}

fn sdy_tags(m: &Module, attr: Option<&String>, shapes: &[&Shape], n: usize) -> Result<Vec<Tag>, String> {
    let attr = attr.ok_or("missing Shardy sharding attribute")?;
    let ts = tiling::from_sdy(m, attr, n)?;
    if ts.len() != shapes.len() {
        return Err(format!("Shardy attribute has {} shardings for {} values", ts.len(), shapes.len()));
    }
    Ok(ts.into_iter().map(Tag::local).collect())
}

/// The shapes of a multi-value custom call's results (tuple elements, or the one array).
fn value_shapes(shape: &Shape, count: usize) -> Vec<&Shape> {
    match shape {
        Shape::Tuple(ss) if count > 1 => ss.iter().collect(),
        s => vec![s],
    }
}

fn param_tag(m: &Module, id: InstrId, n: usize) -> Result<Tag, String> {
    let ins = m.instr(id);
    if let Some(s) = &ins.attrs.sharding {
        return tag_from_sharding(s, &ins.shape, n);
    }
    if let Some(attr) = ins.attrs.frontend_attributes.get("xla.sdy.sharding") {
        let ts = tiling::from_sdy(m, attr, n)?;
        if let ([t], Shape::Array(_)) = (ts.as_slice(), &ins.shape) {
            return Ok(Tag::local(t.clone()));
        }
    }
    // No annotation on the parameter: take the one its shard_map entry declares.
    for &u in &m.entry().instrs {
        let user = m.instr(u);
        if user.opcode != Opcode::CustomCall {
            continue;
        }
        let Some(k) = user.operands.iter().position(|&o| o == id) else { continue };
        match user.attrs.custom_call_target.as_deref() {
            Some("Sharding") => {
                if let Some(s) = &user.attrs.sharding {
                    return tag_from_sharding(s, &ins.shape, n);
                }
            }
            Some("xla.sdy.GlobalToLocalShape") => {
                let locals = value_shapes(&user.shape, user.operands.len());
                let shapes: Vec<&Shape> = user.operands.iter().map(|&o| &m.instr(o).shape).collect();
                return Ok(match sdy_tags(m, user.attrs.frontend_attributes.get("xla.sdy.in_shardings"), &shapes, n) {
                    Ok(ts) => ts[k].clone(),
                    Err(_) => locals.get(k).map_or(Tag::Global, |l| ratio_tiling(&ins.shape, l)),
                });
            }
            _ => {}
        }
    }
    Ok(Tag::Global)
}

fn is_elementwise(op: Opcode) -> bool {
    op.is_elementwise_unary()
        || op.is_elementwise_binary()
        || matches!(op, Opcode::Select | Opcode::Clamp | Opcode::Convert | Opcode::Copy | Opcode::ReducePrecision)
}

/// Runs the analysis on the entry computation of a verified module `m` for `n` partitions
/// (partition mode; in replica mode every device holds every value whole and there is
/// nothing to analyse). Errors are about one instruction ([`Error::about`]):
/// [`ErrorKind::Sharding`] for a sharding that cannot be read or does not fit,
/// [`ErrorKind::Unsupported`] for what only XLA's SPMD partitioner could run.
pub fn analyze(m: &Module, n: usize) -> Result<Plan, Error> {
    let mut plan = Plan::default();
    let Some(entry) = m.comps.get(m.entry) else {
        return Err(Error::new(ErrorKind::Verify, &m.source_name, "module has no entry computation"));
    };
    for &id in &entry.instrs {
        let ins = m.instr(id);
        let err = |why: String| Error::about(ErrorKind::Sharding, m, id, why);
        let unsupported = |why: String| Error::about(ErrorKind::Unsupported, m, id, why);
        let op_tags: Vec<Tag> = ins.operands.iter().map(|o| plan.tags.get(o).cloned().unwrap_or(Tag::Global)).collect();
        let target = ins.attrs.custom_call_target.as_deref().unwrap_or("");
        if ins.opcode == Opcode::CustomCall {
            for key in ["xla.sdy.sharding", "xla.sdy.in_shardings", "xla.sdy.out_shardings"] {
                if let Some(attr) = ins.attrs.frontend_attributes.get(key) {
                    tiling::check_unreduced(attr).map_err(unsupported)?;
                }
            }
        }
        let tag = match ins.opcode {
            Opcode::Parameter => param_tag(m, id, n).map_err(err)?,
            Opcode::Tuple => Tag::tuple(op_tags),
            Opcode::GetTupleElement => {
                op_tags.first().map_or(Tag::Global, |t| t.element(ins.attrs.tuple_index.unwrap_or(0) as usize))
            }
            Opcode::OptimizationBarrier | Opcode::AddDependency => op_tags.first().cloned().unwrap_or(Tag::Global),
            Opcode::BitcastConvert
                if ins.operands.first().and_then(|&o| m.instr(o).shape.as_array()).map(|a| a.ty.byte_size())
                    == ins.shape.as_array().map(|a| a.ty.byte_size()) =>
            {
                op_tags.first().cloned().unwrap_or(Tag::Global)
            }
            Opcode::CustomCall if PASS_THROUGH.contains(&target) => {
                let t = op_tags.first().cloned().unwrap_or(Tag::Global);
                if let (Tag::Local(have), Some(s)) = (&t, &ins.attrs.sharding)
                    && target == "Sharding"
                {
                    let want = tag_from_sharding(s, &ins.shape, n).map_err(err)?;
                    if want != Tag::Global && want != Tag::Local(have.clone()) {
                        return Err(unsupported("resharding a sharded value needs the SPMD partitioner".into()));
                    }
                }
                t
            }
            Opcode::CustomCall if FULL_TO_SHARD.contains(&target) => {
                let locals = value_shapes(&ins.shape, ins.operands.len());
                if locals.len() != ins.operands.len() {
                    return Err(err("result count does not match operand count".into()));
                }
                let sdy = if target == "xla.sdy.GlobalToLocalShape" {
                    let shapes: Vec<&Shape> = ins.operands.iter().map(|&o| &m.instr(o).shape).collect();
                    Some(sdy_tags(m, ins.attrs.frontend_attributes.get("xla.sdy.in_shardings"), &shapes, n))
                } else {
                    None
                };
                for (k, &o) in ins.operands.iter().enumerate() {
                    let global = &m.instr(o).shape;
                    let have = op_tags[k].local_shape(global);
                    if have.compatible(locals[k]) {
                        continue;
                    }
                    if !op_tags[k].is_global() {
                        return Err(err(format!(
                            "operand {k} holds shards of shape {have}, but the shard_map declares {}",
                            locals[k]
                        )));
                    }
                    // A full value entering shard_map: cut it into the declared shards.
                    let tiling = match &sdy {
                        Some(r) => match r.as_ref().map_err(|e| err(e.clone()))?[k].clone() {
                            Tag::Local(t) => t,
                            _ => return Err(err(format!("operand {k} is replicated but its local shape differs"))),
                        },
                        None => {
                            let src = m.instr(o);
                            let s = src
                                .attrs
                                .sharding
                                .as_ref()
                                .filter(|_| src.attrs.custom_call_target.as_deref() == Some("Sharding"))
                                .ok_or_else(|| err("operand is not a Sharding custom-call".into()))?;
                            match tag_from_sharding(s, global, n).map_err(err)? {
                                Tag::Local(t) => t,
                                _ => return Err(err("operand sharding is replicated but shapes differ".into())),
                            }
                        }
                    };
                    if !Tag::Local(tiling.clone()).local_shape(global).compatible(locals[k]) {
                        return Err(err(format!(
                            "sharding of operand {k} does not give the local shape {}",
                            locals[k]
                        )));
                    }
                }
                Tag::Global
            }
            Opcode::CustomCall if SHARD_TO_FULL.contains(&target) => {
                let globals = value_shapes(&ins.shape, ins.operands.len());
                if globals.len() != ins.operands.len() || op_tags.iter().any(|t| !t.is_global()) {
                    return Err(err("bad shard_map exit".into()));
                }
                let tags: Vec<Tag> = if target == "SPMDShardToFullShape" {
                    let s = ins.attrs.sharding.as_ref().ok_or_else(|| err("missing sharding".into()))?;
                    vec![tag_from_sharding(s, &ins.shape, n).map_err(err)?]
                } else {
                    match sdy_tags(m, ins.attrs.frontend_attributes.get("xla.sdy.out_shardings"), &globals, n) {
                        Ok(ts) => ts,
                        Err(_) => ins
                            .operands
                            .iter()
                            .zip(&globals)
                            .map(|(&o, g)| ratio_tiling(g, &m.instr(o).shape))
                            .collect(),
                    }
                };
                for (k, &o) in ins.operands.iter().enumerate() {
                    let local = tags[k].local_shape(globals[k]);
                    if !local.compatible(&m.instr(o).shape) {
                        return Err(err(format!(
                            "operand {k} has shape {} but the sharding gives shards of {local}",
                            m.instr(o).shape
                        )));
                    }
                }
                if globals.len() == 1 && !ins.shape.is_tuple() { tags[0].clone() } else { Tag::tuple(tags) }
            }
            op if is_elementwise(op) => {
                let mut tiling: Option<Tiling> = None;
                for (k, t) in op_tags.iter().enumerate() {
                    match t {
                        Tag::Global => {}
                        Tag::Local(l) => match &tiling {
                            None => tiling = Some(l.clone()),
                            Some(prev) if prev == l => {}
                            Some(_) => {
                                return Err(unsupported(format!(
                                    "operand {k} is sharded differently from the others; that needs the SPMD partitioner"
                                )));
                            }
                        },
                        Tag::Tuple(_) => return Err(unsupported("tuple operand".into())),
                    }
                }
                match tiling {
                    None => Tag::Global,
                    Some(t) => {
                        for (k, &o) in ins.operands.iter().enumerate() {
                            let oshape = &m.instr(o).shape;
                            let full = oshape.as_array().is_some_and(|a| a.rank() > 0);
                            if op_tags[k].is_global() && full && t.coords.is_none() {
                                return Err(unsupported(format!(
                                    "operand {k} is a full value mixed with shards of unknown placement"
                                )));
                            }
                        }
                        Tag::Local(t)
                    }
                }
            }
            // What else runs on shards is XLA's SPMD partitioner's.
            _ => Tag::Global,
        };
        if ins.opcode == Opcode::Parameter {
            let num = ins.attrs.parameter_number.unwrap_or(0).max(0) as usize;
            if plan.param_tags.len() <= num {
                plan.param_tags.resize(num + 1, Tag::Global);
            }
            plan.param_tags[num] = tag.clone();
        }
        plan.tags.insert(id, tag);
    }
    let root = m.instr(entry.root);
    let root_tag = plan.tags.get(&entry.root).cloned().unwrap_or(Tag::Global);
    let final_tag = match (&root_tag, &root.attrs.sharding) {
        (Tag::Global, Some(s)) => {
            tag_from_sharding(s, &root.shape, n).map_err(|why| Error::about(ErrorKind::Sharding, m, entry.root, why))?
        }
        _ => root_tag.clone(),
    };
    // A full result leaf that must become shards needs to know which tile each device holds.
    let cut = final_tag.leaves(&root.shape).into_iter().zip(root_tag.leaves(&root.shape));
    if cut.into_iter().any(|(f, b)| matches!((f, b), (Tag::Local(t), Tag::Global) if t.coords.is_none())) {
        return Err(Error::about(ErrorKind::Sharding, m, entry.root, "cannot shard the result"));
    }
    plan.root_tag = Some(final_tag);
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_text;

    const TRANSPOSE: &str = "HloModule m, num_partitions=2\nENTRY e {\n  a = f32[5,2] parameter(0), sharding={devices=[2,1]<=[2]}\n  ROOT t = f32[2,5] transpose(a), dimensions={1,0}\n}\n";

    #[test]
    fn sharded_parameter_and_partitioner_op() {
        let m = parse_text("t.hlo", TRANSPOSE).unwrap();
        let plan = analyze(&m, 2).unwrap();
        // Uneven: 5 rows over 2 tiles is 3 rows a shard, the last one padded.
        assert_eq!(plan.param_shapes(&m)[0].to_string(), "f32[3,2]");
        // The transpose on a shard is XLA's SPMD partitioner's: the result is declared whole.
        assert_eq!(plan.result_shape(&m).to_string(), "f32[2,5]");
    }

    #[test]
    fn a_sharding_that_does_not_fit_names_its_instruction() {
        let m = parse_text("t.hlo", TRANSPOSE).unwrap();
        let e = analyze(&m, 4).unwrap_err();
        assert_eq!((e.kind, e.instr), (ErrorKind::Sharding, Some(m.entry().params[0])));
        assert_eq!(e.reason(&m), "sharding spans 2 devices, running on 4");
        assert!(e.to_string().starts_with("t.hlo:3:3: invalid sharding: %a in e: sharding spans"), "{e}");
    }
}
