//! Static sharding analysis of the entry computation (partition mode).
//!
//! Entry parameters may carry per-device shards; the shard_map custom calls mark where
//! values switch between global and local (per-device) shapes. This pass gives every
//! entry instruction a [`Tag`]: `Global` (each device holds the declared shape) or
//! `Local(tiling)` (each device holds its shard of the declared global shape), decides
//! where full values must be cut into shards, and rejects ops on sharded values that
//! only XLA's SPMD partitioner could run.

use std::collections::HashMap;

use hlo::{InstrId, Module, Opcode, Shape, Sharding};

use crate::sharding::{self, Tiling};
use crate::{InterpError, describe};

/// Where a value lives, per device.
#[derive(Clone, Debug, PartialEq)]
pub enum Tag {
    Global,
    Local(Tiling),
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

/// The analysis result.
#[derive(Debug, Default)]
pub struct Plan {
    pub tags: HashMap<InstrId, Tag>,
    /// Operand `(user, operand index)` values that must be cut into shards before use.
    pub slices: HashMap<(InstrId, usize), Tiling>,
    /// Per entry-result leaf: cut the (full) value into this tiling's shard at the end.
    pub root_slices: Vec<Option<Tiling>>,
    /// The entry result's final tag.
    pub root_tag: Option<Tag>,
    pub param_tags: Vec<Tag>,
    /// The first op on sharded values that needs XLA's SPMD partitioner: reported when
    /// the module runs, so parameter shapes stay available.
    pub deferred: Option<InterpError>,
}

const FULL_TO_SHARD: [&str; 2] = ["SPMDFullToShardShape", "xla.sdy.GlobalToLocalShape"];
const SHARD_TO_FULL: [&str; 2] = ["SPMDShardToFullShape", "xla.sdy.LocalToGlobalShape"];
const PASS_THROUGH: [&str; 2] = ["Sharding", "xla.sdy.FuncResultSharding"];

/// Custom-call targets the interpreter understands (all pass values through).
pub fn is_sharding_call(target: &str) -> bool {
    FULL_TO_SHARD.contains(&target) || SHARD_TO_FULL.contains(&target) || PASS_THROUGH.contains(&target)
}

fn tag_from_sharding(s: &Sharding, shape: &Shape, n: usize) -> Result<Tag, String> {
    Ok(match (s, shape) {
        (Sharding::Tuple(v), Shape::Tuple(ss)) if v.len() == ss.len() => {
            Tag::tuple(v.iter().zip(ss).map(|(s, sh)| tag_from_sharding(s, sh, n)).collect::<Result<_, _>>()?)
        }
        (s, Shape::Array(a)) => Tag::local(sharding::from_hlo(s, a.rank(), n)?),
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
    let ts = sharding::from_sdy(m, attr, n)?;
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
        let ts = sharding::from_sdy(m, attr, n)?;
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

/// Runs the analysis on the entry computation of `m` for `n` partitions.
pub fn analyze(m: &Module, n: usize) -> Result<Plan, InterpError> {
    let mut plan = Plan::default();
    let entry = m.entry();
    for &id in &entry.instrs {
        let ins = m.instr(id);
        let err = |why: String| InterpError::Runtime { instr: describe(m, id), why };
        let unsupported =
            |why: String| InterpError::UnsupportedOp { op: ins.opcode.name().to_string(), instr: describe(m, id), why };
        let op_tags: Vec<Tag> = ins.operands.iter().map(|o| plan.tags.get(o).cloned().unwrap_or(Tag::Global)).collect();
        let target = ins.attrs.custom_call_target.as_deref().unwrap_or("");
        if ins.opcode == Opcode::CustomCall {
            for key in ["xla.sdy.sharding", "xla.sdy.in_shardings", "xla.sdy.out_shardings"] {
                if let Some(attr) = ins.attrs.frontend_attributes.get(key) {
                    sharding::check_unreduced(attr).map_err(unsupported)?;
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
                    plan.slices.insert((id, k), tiling);
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
                            if op_tags[k].is_global() && full {
                                if t.coords.is_none() {
                                    return Err(unsupported(format!(
                                        "operand {k} is a full value mixed with shards of unknown placement"
                                    )));
                                }
                                plan.slices.insert((id, k), t.clone());
                            }
                        }
                        Tag::Local(t)
                    }
                }
            }
            _ => {
                if let Some(k) = op_tags.iter().position(|t| !t.is_global())
                    && plan.deferred.is_none()
                {
                    plan.deferred = Some(unsupported(format!(
                        "operand {k} ({}) is sharded across partitions; running '{}' on it needs XLA's SPMD partitioner",
                        describe(m, ins.operands[k]),
                        ins.opcode
                    )));
                }
                Tag::Global
            }
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
        (Tag::Global, Some(s)) => tag_from_sharding(s, &root.shape, n)
            .map_err(|why| InterpError::Runtime { instr: describe(m, entry.root), why })?,
        _ => root_tag.clone(),
    };
    let before = root_tag.leaves(&root.shape);
    plan.root_slices = final_tag
        .leaves(&root.shape)
        .into_iter()
        .zip(before)
        .map(|(f, b)| match (f, b) {
            (Tag::Local(t), Tag::Global) => Some(t),
            _ => None,
        })
        .collect();
    if plan.root_slices.iter().flatten().any(|t| t.coords.is_none()) {
        return Err(InterpError::Runtime { instr: describe(m, entry.root), why: "cannot shard the result".into() });
    }
    plan.root_tag = Some(final_tag);
    Ok(plan)
}
