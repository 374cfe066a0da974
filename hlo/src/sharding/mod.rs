//! The shape of each device's entry arguments in partition mode, read from the module's shardings before anything runs,
//! so that `runs` gives each device its shard of the entry's parameters (the CLI's runs through XLA, the conformance
//! goldens). XLA's SPMD partitioner runs the module; nothing here checks what it will do with the shards.
//!
//! A parameter holds a shard where it carries a tiled sharding (`sharding={devices=..}`), Shardy's `xla.sdy.sharding`,
//! or, unannotated, where the shard_map custom call consuming it (`Sharding`, `xla.sdy.GlobalToLocalShape`) declares
//! one; every dimension is divided by its tile count, rounded up, as XLA's partitioner pads uneven shards.

mod tiling;

use tiling::Tiling;

use crate::{Error, ErrorKind, InstrId, Module, Opcode, Shape, Sharding};

/// Where a value lives, per device.
#[derive(Clone, Debug, PartialEq)]
enum Tag {
    /// Every device holds the whole declared value.
    Global,
    /// Every device holds its shard of the declared (global) array.
    Local(Tiling),
    /// A tuple, per element.
    Tuple(Vec<Tag>),
}

impl Tag {
    fn local(t: Option<Tiling>) -> Tag {
        match t {
            Some(t) if !t.is_trivial() => Tag::Local(t),
            _ => Tag::Global,
        }
    }

    /// The per-device shape of a value declared as `declared`.
    fn local_shape(&self, declared: &Shape) -> Shape {
        match (self, declared) {
            (Tag::Local(t), Shape::Array(a)) => Shape::Array(t.shard_shape(a)),
            (Tag::Tuple(ts), Shape::Tuple(ss)) if ts.len() == ss.len() => {
                Shape::Tuple(ts.iter().zip(ss).map(|(t, s)| t.local_shape(s)).collect())
            }
            _ => declared.clone(),
        }
    }
}

/// Per entry parameter of a verified module `m` run on `n` partitions, the shape each device's argument has: its shard
/// where the parameter is sharded, the declared shape otherwise. A sharding that cannot be read or does not fit `n`
/// devices is an [`ErrorKind::Sharding`] error about its parameter ([`Error::about`]).
pub fn param_shapes(m: &Module, n: usize) -> Result<Vec<Shape>, Error> {
    let Some(entry) = m.comps.get(m.entry) else { return Ok(Vec::new()) };
    entry
        .params
        .iter()
        .map(|&p| {
            let tag = param_tag(m, p, n).map_err(|why| Error::about(ErrorKind::Sharding, m, p, why))?;
            Ok(tag.local_shape(&m.instr(p).shape))
        })
        .collect()
}

fn tag_from_sharding(s: &Sharding, shape: &Shape, n: usize) -> Result<Tag, String> {
    Ok(match (s, shape) {
        (Sharding::Tuple(v), Shape::Tuple(ss)) if v.len() == ss.len() => {
            let ts: Vec<Tag> = v.iter().zip(ss).map(|(s, sh)| tag_from_sharding(s, sh, n)).collect::<Result<_, _>>()?;
            if ts.iter().all(|t| *t == Tag::Global) { Tag::Global } else { Tag::Tuple(ts) }
        }
        (s, Shape::Array(a)) => Tag::local(tiling::from_hlo(s, a.rank(), n)?),
        _ => Tag::Global,
    })
}

/// Tiling implied by a local shape alone (tile counts from the shape ratio).
fn ratio_tiling(global: &Shape, local: &Shape) -> Tag {
    match (global, local) {
        (Shape::Array(g), Shape::Array(l)) if g.rank() == l.rank() => {
            let counts = g.dims.iter().zip(&l.dims).map(|(&g, &l)| if l <= 0 { 1 } else { (g + l - 1) / l }).collect();
            Tag::local(Some(Tiling { counts }))
        }
        _ => Tag::Global,
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
                // The call's results: tuple elements, or the one array.
                let locals: Vec<&Shape> = match &user.shape {
                    Shape::Tuple(ss) if user.operands.len() > 1 => ss.iter().collect(),
                    s => vec![s],
                };
                let declared = user.attrs.frontend_attributes.get("xla.sdy.in_shardings");
                let sdy = declared.map(|attr| tiling::from_sdy(m, attr, n));
                return Ok(match sdy {
                    Some(Ok(ts)) if ts.len() == user.operands.len() => Tag::local(ts[k].clone()),
                    _ => locals.get(k).map_or(Tag::Global, |l| ratio_tiling(&ins.shape, l)),
                });
            }
            _ => {}
        }
    }
    Ok(Tag::Global)
}
