//! The entry computation's interface as XLA:CPU's PJRT client takes it: no nested tuples ("Nested tuples are not
//! supported") and no tuple parameters. [`entry`] rewrites a module that has either; [`flat_args`] and [`nest`] move
//! values across the change.
//!
//! - A nested tuple result: the old root stays, and a new root `tuple` takes its leaves (depth first) through
//!   `get-tuple-element` chains of it (one per tuple node).
//! - A tuple parameter: one `parameter` per leaf, numbered in order with the others (all parameters renumbered by their
//!   old number); the old parameter instruction keeps its id and name and becomes the `tuple` of them (inner tuple
//!   nodes get their own `tuple`), so its users read what they read.
//!
//! New instructions get ids past the largest of the module and names unused in it; parameters and tuples come right
//! before the old parameter, the get-tuple-elements and the root at the end (XLA makes instructions in proto order:
//! operands first). Where the old value had a sharding its leaves' shardings go with the new instructions. The entry's
//! `program_shape` and the module's `host_program_shape` (the entry layout XLA compiles for) are flattened the same
//! way. The edit is made on the wire, so fields this build's protos do not know pass through; a module that aliases or
//! donates parameters, or carries a schedule, is refused (their indices would need remapping).

use std::collections::HashSet;

use hlo::{Array, Literal, Shape};

use hlo::wire::{
    self, Field, IndexedInstr, enums, fields, first_int, hlo_computation, hlo_instruction, hlo_module, op_sharding,
    put_bytes, put_ints, put_varint,
};

/// A ShapeProto on the wire: its bytes and, for a tuple, its elements.
pub(super) struct WireShape<'a> {
    bytes: &'a [u8],
    elems: Option<Vec<WireShape<'a>>>,
}

impl<'a> WireShape<'a> {
    pub(super) fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        let fs = fields(bytes)?;
        let elems = if first_int(&fs, wire::shape::ELEMENT_TYPE)? == Some(enums::TUPLE_TYPE) {
            let e = fs
                .iter()
                .filter(|f| f.number == wire::shape::TUPLE_SHAPES)
                .map(|f| Self::parse(f.message().unwrap_or_default()));
            Some(e.collect::<Result<Vec<_>, _>>()?)
        } else {
            None
        };
        Ok(WireShape { bytes, elems })
    }

    pub(super) fn is_tuple(&self) -> bool {
        self.elems.is_some()
    }

    /// A tuple with a tuple element.
    fn is_nested(&self) -> bool {
        self.elems.as_ref().is_some_and(|e| e.iter().any(WireShape::is_tuple))
    }

    /// Leaves, depth first (a tuple's sharding lists one per leaf).
    pub(super) fn leaf_count(&self) -> usize {
        self.elems.as_ref().map_or(1, |e| e.iter().map(WireShape::leaf_count).sum())
    }

    fn leaves(&self, out: &mut Vec<&'a [u8]>) {
        match &self.elems {
            Some(e) => e.iter().for_each(|x| x.leaves(out)),
            None => out.push(self.bytes),
        }
    }

    /// The tuple of this shape's leaves.
    fn flat(&self) -> Vec<u8> {
        let mut leaves = Vec::new();
        self.leaves(&mut leaves);
        tuple_shape(&leaves)
    }
}

fn tuple_shape(elems: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, wire::shape::ELEMENT_TYPE, enums::TUPLE_TYPE);
    for e in elems {
        put_bytes(&mut out, wire::shape::TUPLE_SHAPES, e);
    }
    out
}

/// The leaves' shardings of a value of `shape` with sharding `sharding` (an OpSharding's bytes): a tuple sharding lists
/// them; any other applies to every leaf.
fn leaf_shardings(sharding: Option<&[u8]>, shape: &WireShape<'_>) -> Result<Option<Vec<Vec<u8>>>, String> {
    let Some(s) = sharding else { return Ok(None) };
    let n = shape.leaf_count();
    let fs = fields(s)?;
    if first_int(&fs, op_sharding::TYPE)? == Some(enums::SHARDING_TUPLE) {
        let leaves: Vec<Vec<u8>> = fs
            .iter()
            .filter(|f| f.number == op_sharding::TUPLE_SHARDINGS)
            .map(|f| f.message().unwrap_or_default().to_vec())
            .collect();
        if leaves.len() != n {
            return Err(format!("a tuple sharding of {} leaves on a shape of {n}", leaves.len()));
        }
        Ok(Some(leaves))
    } else {
        Ok(Some(vec![s.to_vec(); n]))
    }
}

/// The sharding of the leaves `range` of a value: the leaf's own, or their tuple.
fn sharding_of(leaves: &Option<Vec<Vec<u8>>>, range: std::ops::Range<usize>, tuple: bool) -> Option<Vec<u8>> {
    let leaves = leaves.as_ref()?;
    if !tuple {
        return leaves.get(range.start).cloned();
    }
    let mut out = Vec::new();
    put_varint(&mut out, op_sharding::TYPE, enums::SHARDING_TUPLE);
    for l in &leaves[range] {
        put_bytes(&mut out, op_sharding::TUPLE_SHARDINGS, l);
    }
    Some(out)
}

/// A new instruction: name, opcode, shape, id, operands, then `extra` fields.
fn instruction(id: u64, name: &str, opcode: &str, shape: &[u8], operands: &[u64], sharding: Option<&[u8]>) -> Vec<u8> {
    let mut out = Vec::new();
    put_bytes(&mut out, hlo_instruction::NAME, name.as_bytes());
    put_bytes(&mut out, hlo_instruction::OPCODE, opcode.as_bytes());
    put_bytes(&mut out, hlo_instruction::SHAPE, shape);
    put_varint(&mut out, hlo_instruction::ID, id as i64);
    if !operands.is_empty() {
        put_ints(&mut out, hlo_instruction::OPERAND_IDS, operands.iter().map(|&o| o as i64));
    }
    if let Some(s) = sharding {
        put_bytes(&mut out, hlo_instruction::SHARDING, s);
    }
    out
}

/// The message without the fields `drop`.
pub(super) fn without(msg: &[u8], drop: &[u32]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(msg.len());
    for f in fields(msg)? {
        if !drop.contains(&f.number) {
            out.extend_from_slice(f.raw);
        }
    }
    Ok(out)
}

/// An entry instruction, read.
struct Instr<'a> {
    bytes: &'a [u8],
    id: u64,
    name: String,
    opcode: &'a str,
    shape: WireShape<'a>,
    parameter_number: u64,
    sharding: Option<&'a [u8]>,
}

impl<'a> Instr<'a> {
    fn of(i: &IndexedInstr<'a>) -> Result<Self, String> {
        Ok(Instr {
            bytes: i.field.payload,
            id: i.id as u64,
            name: i.name.to_string(),
            opcode: i.opcode,
            shape: WireShape::parse(i.shape)?,
            parameter_number: first_int(&i.fields, hlo_instruction::PARAMETER_NUMBER)?.unwrap_or(0) as u64,
            sharding: i.fields.iter().find(|f| f.number == hlo_instruction::SHARDING).and_then(|f| f.message()),
        })
    }
}

/// Fresh instruction ids and names for the module.
struct Fresh {
    next_id: u64,
    names: HashSet<String>,
}

impl Fresh {
    fn id(&mut self) -> u64 {
        self.next_id = self.next_id.saturating_add(1);
        self.next_id - 1
    }

    fn name(&mut self, base: &str) -> String {
        let mut name = base.to_owned();
        let mut k = 1;
        while self.names.contains(&name) {
            name = format!("{base}.{k}");
            k += 1;
        }
        self.names.insert(name.clone());
        name
    }
}

/// The module with a flat entry interface, or `None` when it has one already (a root without nested tuples and no tuple
/// parameter).
pub fn entry(module: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let index = wire::Index::new(module)?;
    let top = &index.top;
    let mut fresh = Fresh {
        next_id: index.instrs.values().map(|i| (i.id as u64).saturating_add(1)).max().unwrap_or(0),
        names: index.instrs.values().map(|i| i.name.to_string()).collect(),
    };
    let entry = &index.comps[index.entry.ok_or("the module names no entry computation it has")?];
    let (comp, cf) = (entry.field.payload, &entry.fields);
    let instrs = entry.instrs.iter().map(|&i| Instr::of(&index.instrs[i])).collect::<Result<Vec<_>, _>>()?;
    let root_id = first_int(cf, hlo_computation::ROOT_ID)?.ok_or("the entry computation has no root_id")? as u64;
    let root =
        instrs.iter().find(|i| i.id == root_id).ok_or("the entry computation's root_id is none of its instructions")?;
    let flatten_result = root.shape.is_nested();
    let mut params: Vec<&Instr<'_>> = instrs.iter().filter(|i| i.opcode == "parameter").collect();
    params.sort_by_key(|p| p.parameter_number);
    let flatten_params = params.iter().any(|p| p.shape.is_tuple());
    if !flatten_result && !flatten_params {
        return Ok(None);
    }
    // New ids count up from the largest: they must stay int64s (and unique).
    if fresh.next_id > (i64::MAX as u64) / 2 {
        return Err(format!("instruction id {} leaves no room for new ones", fresh.next_id - 1));
    }
    for (number, what) in [
        (hlo_module::INPUT_OUTPUT_ALIAS, "input/output aliases"),
        (hlo_module::BUFFER_DONOR, "buffer donors"),
        (hlo_module::SCHEDULE, "a schedule"),
    ] {
        if top.iter().any(|f| f.number == number && f.message().is_some_and(|p| !p.is_empty())) {
            return Err(format!(
                "the entry's interface has nested tuples, which XLA:CPU's PJRT client does not take, and the module \
                 has {what}, which flattening it would have to remap"
            ));
        }
    }

    // Old parameter number → its first new number.
    let mut first_number = std::collections::HashMap::new();
    let mut next = 0u64;
    for p in &params {
        first_number.insert(p.parameter_number, next);
        next += p.shape.leaf_count() as u64;
    }
    // Names of the new parameters, by new number.
    let mut param_names: Vec<String> = Vec::new();
    let mut out_instrs: Vec<Vec<u8>> = Vec::with_capacity(instrs.len() + 8);
    for i in &instrs {
        if i.opcode != "parameter" {
            out_instrs.push(i.bytes.to_vec());
            continue;
        }
        let number = first_number[&i.parameter_number];
        if !i.shape.is_tuple() {
            let mut b = without(i.bytes, &[hlo_instruction::PARAMETER_NUMBER])?;
            put_varint(&mut b, hlo_instruction::PARAMETER_NUMBER, number as i64);
            out_instrs.push(b);
            continue;
        }
        let shardings = leaf_shardings(i.sharding, &i.shape)?;
        let mut leaves = Vec::new();
        i.shape.leaves(&mut leaves);
        let mut leaf_ids = Vec::with_capacity(leaves.len());
        for (k, leaf) in leaves.iter().enumerate() {
            let (id, name) = (fresh.id(), fresh.name(&format!("{}.{k}", i.name)));
            let mut b =
                instruction(id, &name, "parameter", leaf, &[], sharding_of(&shardings, k..k + 1, false).as_deref());
            put_varint(&mut b, hlo_instruction::PARAMETER_NUMBER, (number + k as u64) as i64);
            out_instrs.push(b);
            leaf_ids.push(id);
            param_names.push(name);
        }
        // The tuple nodes, innermost first; the old instruction becomes the outermost.
        fn build(
            node: &WireShape<'_>,
            start: usize,
            top: bool,
            leaf_ids: &[u64],
            shardings: &Option<Vec<Vec<u8>>>,
            base: &str,
            fresh: &mut Fresh,
            out: &mut Vec<Vec<u8>>,
        ) -> (u64, Vec<u64>) {
            let Some(elems) = &node.elems else { return (leaf_ids[start], Vec::new()) };
            let mut operands = Vec::with_capacity(elems.len());
            let mut at = start;
            for e in elems {
                operands.push(build(e, at, false, leaf_ids, shardings, base, fresh, out).0);
                at += e.leaf_count();
            }
            if top {
                return (0, operands);
            }
            let (id, name) = (fresh.id(), fresh.name(&format!("{base}.tuple")));
            let sharding = sharding_of(shardings, start..at, true);
            out.push(instruction(id, &name, "tuple", node.bytes, &operands, sharding.as_deref()));
            (id, operands)
        }
        let (_, operands) = build(&i.shape, 0, true, &leaf_ids, &shardings, &i.name, &mut fresh, &mut out_instrs);
        let mut b = without(
            i.bytes,
            &[
                hlo_instruction::OPCODE,
                hlo_instruction::PARAMETER_NUMBER,
                hlo_instruction::PARAMETER_REPLICATION,
                hlo_instruction::OPERAND_IDS,
            ],
        )?;
        put_bytes(&mut b, hlo_instruction::OPCODE, b"tuple");
        put_ints(&mut b, hlo_instruction::OPERAND_IDS, operands.iter().map(|&o| o as i64));
        out_instrs.push(b);
    }
    let mut new_root = root_id;
    if flatten_result {
        let shardings = leaf_shardings(root.sharding, &root.shape)?;
        let mut leaf_ids = Vec::new();
        fn gtes(
            node: &WireShape<'_>,
            of: u64,
            start: usize,
            shardings: &Option<Vec<Vec<u8>>>,
            base: &str,
            fresh: &mut Fresh,
            out: &mut Vec<Vec<u8>>,
            leaf_ids: &mut Vec<u64>,
        ) {
            let mut at = start;
            for (k, e) in node.elems.iter().flatten().enumerate() {
                let n = e.leaf_count();
                let (id, name) = (fresh.id(), fresh.name(&format!("{base}.{k}")));
                let sharding = sharding_of(shardings, at..at + n, e.is_tuple());
                let mut b = instruction(id, &name, "get-tuple-element", e.bytes, &[of], sharding.as_deref());
                put_varint(&mut b, hlo_instruction::TUPLE_INDEX, k as i64);
                out.push(b);
                if e.is_tuple() {
                    gtes(e, id, at, shardings, &name, fresh, out, leaf_ids);
                } else {
                    leaf_ids.push(id);
                }
                at += n;
            }
        }
        gtes(&root.shape, root_id, 0, &shardings, &root.name, &mut fresh, &mut out_instrs, &mut leaf_ids);
        let (id, name) = (fresh.id(), fresh.name(&format!("{}.flat", root.name)));
        let sharding = sharding_of(&shardings, 0..leaf_ids.len(), true);
        out_instrs.push(instruction(id, &name, "tuple", &root.shape.flat(), &leaf_ids, sharding.as_deref()));
        new_root = id;
    }

    let names = flatten_params.then_some(param_names.as_slice());
    let mut new_comp = Vec::with_capacity(comp.len() + 256);
    let mut emitted = false;
    for f in cf {
        match f.number {
            hlo_computation::INSTRUCTIONS if !emitted => {
                emitted = true;
                out_instrs.iter().for_each(|b| put_bytes(&mut new_comp, hlo_computation::INSTRUCTIONS, b));
            }
            hlo_computation::INSTRUCTIONS => {}
            hlo_computation::ROOT_ID => put_varint(&mut new_comp, hlo_computation::ROOT_ID, new_root as i64),
            hlo_computation::PROGRAM_SHAPE => {
                let ps = program_shape(f.message().unwrap_or_default(), names, &params, flatten_result)?;
                put_bytes(&mut new_comp, hlo_computation::PROGRAM_SHAPE, &ps);
            }
            _ => new_comp.extend_from_slice(f.raw),
        }
    }
    let mut out = Vec::with_capacity(module.len() + 256);
    for f in top {
        if std::ptr::eq(f.raw, entry.field.raw) {
            put_bytes(&mut out, hlo_module::COMPUTATIONS, &new_comp);
        } else if f.number == hlo_module::HOST_PROGRAM_SHAPE {
            let ps = program_shape(f.message().unwrap_or_default(), names, &params, flatten_result)?;
            put_bytes(&mut out, hlo_module::HOST_PROGRAM_SHAPE, &ps);
        } else {
            out.extend_from_slice(f.raw);
        }
    }
    Ok(Some(out))
}

/// A ProgramShapeProto flattened: tuple parameters as their leaves (named `names`, the new parameters' names, where
/// given), a nested result as the tuple of its leaves.
fn program_shape(
    ps: &[u8],
    names: Option<&[String]>,
    params: &[&Instr<'_>],
    flatten_result: bool,
) -> Result<Vec<u8>, String> {
    let fs = fields(ps)?;
    let mut out = Vec::with_capacity(ps.len() + 64);
    let shapes: Vec<&Field<'_>> = fs.iter().filter(|f| f.number == wire::program_shape::PARAMETERS).collect();
    if names.is_some() && shapes.len() != params.len() {
        return Err(format!(
            "the entry's program shape lists {} parameters, the computation has {}",
            shapes.len(),
            params.len()
        ));
    }
    for s in &shapes {
        let shape = WireShape::parse(s.message().unwrap_or_default())?;
        let mut leaves = Vec::new();
        shape.leaves(&mut leaves);
        leaves.iter().for_each(|l| put_bytes(&mut out, wire::program_shape::PARAMETERS, l));
    }
    for f in &fs {
        match f.number {
            wire::program_shape::PARAMETERS => {}
            wire::program_shape::RESULT if flatten_result => {
                let shape = WireShape::parse(f.message().unwrap_or_default())?;
                put_bytes(&mut out, wire::program_shape::RESULT, &shape.flat());
            }
            wire::program_shape::PARAMETER_NAMES if names.is_some() => {}
            _ => out.extend_from_slice(f.raw),
        }
    }
    if let Some(names) = names {
        let old: Vec<String> = fs
            .iter()
            .filter(|f| f.number == wire::program_shape::PARAMETER_NAMES)
            .map(|f| String::from_utf8_lossy(f.payload).into_owned())
            .collect();
        let mut new = names.iter();
        for (k, p) in params.iter().enumerate() {
            if p.shape.is_tuple() {
                for n in new.by_ref().take(p.shape.leaf_count()) {
                    put_bytes(&mut out, wire::program_shape::PARAMETER_NAMES, n.as_bytes());
                }
            } else {
                let name = old.get(k).cloned().unwrap_or_else(|| p.name.clone());
                put_bytes(&mut out, wire::program_shape::PARAMETER_NAMES, name.as_bytes());
            }
        }
    }
    Ok(out)
}

/// Entry arguments as the flat entry takes them: every tuple argument as its leaves.
pub fn flat_args(args: &[Literal]) -> Result<Vec<&Array>, String> {
    fn walk<'a>(l: &'a Literal, i: usize, out: &mut Vec<&'a Array>) -> Result<(), String> {
        match l {
            Literal::Array(a) => out.push(a),
            Literal::Tuple(t) => t.iter().try_for_each(|e| walk(e, i, out))?,
            Literal::Token => return Err(format!("parameter {i}: the xla backend cannot pass a token")),
        }
        Ok(())
    }
    let mut out = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        walk(a, i, &mut out)?;
    }
    Ok(out)
}

/// `leaves` (depth first) nested as `shape` is.
pub fn nest(shape: &Shape, leaves: &mut impl Iterator<Item = Array>) -> Result<Literal, String> {
    match shape {
        Shape::Array(_) => leaves.next().map(Literal::Array).ok_or_else(|| "fewer results than leaves".to_owned()),
        Shape::Tuple(t) => Ok(Literal::Tuple(t.iter().map(|e| nest(e, leaves)).collect::<Result<_, _>>()?)),
        Shape::Token => Err("the xla backend cannot return a token".into()),
    }
}
