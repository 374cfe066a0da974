//! The pass's edits on the wire: the quick scan for collectives, the slim module the decisions read, and the rewrite of
//! the taken collectives into pinned custom calls.

use std::borrow::Cow;

use super::*;

/// Whether the module has any collective: the cheap check that lets the pass return at once for the many modules
/// without one.
pub fn has_collectives(module: &[u8]) -> Result<bool, PassError> {
    Ok(any_collective(&Index::new(module)?))
}

pub(super) fn any_collective(index: &Index<'_>) -> bool {
    index.instrs.values().any(|i| is_collective(i.opcode))
}

/// What the decisions read, and nothing else: a module of the computations that hold collectives, each reduced to its
/// collectives (verbatim but for control predecessors) and their operands (as parameters of the same name, id and
/// shape), plus the computations the collectives call (reducers), verbatim. Decoding it costs a fraction of decoding
/// the whole module (a 32-layer train step: 3.8 MB, 29 672 instructions in 3 435 computations, of which the slim module
/// keeps the few hundred that matter). Also returns the index id of each of its instructions, in order (as the decoder
/// numbers them).
pub(super) fn slim(index: &Index<'_>) -> (Vec<u8>, Vec<InstrId>) {
    let mut out = Vec::with_capacity(index.top.iter().map(|f| f.raw.len()).sum::<usize>() / 8);
    copy_fields(&index.top, &MODULE_KEPT, &mut out);
    let (mut at, mut called, mut entry) = (Vec::new(), Vec::new(), None);
    let collective = |i: &InstrId| is_collective(index.instrs[*i].opcode);
    for (cid, c) in index.comps.iter() {
        let colls: Vec<InstrId> = c.instrs.iter().copied().filter(collective).collect();
        let Some(&last) = colls.last() else { continue };
        let mut comp = Vec::new();
        copy_fields(&c.fields, &[computation::NAME, computation::ID], &mut comp);
        // Operands that are not collectives themselves become parameters.
        let mut stand_ins: Vec<InstrId> = Vec::new();
        for &i in &colls {
            for o in index.instrs[i].operands.iter().filter_map(|&o| index.ids.resolve(cid, o)) {
                if !collective(&o) && !stand_ins.contains(&o) {
                    stand_ins.push(o);
                }
            }
            called.extend_from_slice(&index.instrs[i].called);
        }
        for (k, &i) in stand_ins.iter().enumerate() {
            let mut ins = Vec::new();
            copy_fields(&index.instrs[i].fields, &[instruction::NAME, instruction::SHAPE, instruction::ID], &mut ins);
            put_bytes(&mut ins, instruction::OPCODE, b"parameter");
            put_varint(&mut ins, instruction::PARAMETER_NUMBER, k as i64);
            put_bytes(&mut comp, computation::INSTRUCTIONS, &ins);
        }
        for &i in &colls {
            let mut ins = Vec::new();
            for x in index.instrs[i].fields.iter().filter(|x| x.number != instruction::CONTROL_PREDECESSOR_IDS) {
                ins.extend_from_slice(x.raw);
            }
            put_bytes(&mut comp, computation::INSTRUCTIONS, &ins);
        }
        put_varint(&mut comp, computation::ROOT_ID, index.instrs[last].id);
        entry.get_or_insert((&c.name, c.id));
        at.extend(stand_ins.into_iter().chain(colls));
        put_bytes(&mut out, hlo_module::COMPUTATIONS, &comp);
    }
    called.sort_unstable();
    called.dedup();
    for c in called.iter().filter_map(|id| index.ids.comps.get(id)) {
        out.extend_from_slice(index.comps[*c].field.raw);
        at.extend_from_slice(&index.comps[*c].instrs);
    }
    // The entry is a kept computation (the last value of a scalar field wins).
    if let Some((name, id)) = entry {
        put_bytes(&mut out, hlo_module::ENTRY_COMPUTATION_NAME, name.as_bytes());
        put_varint(&mut out, hlo_module::ENTRY_COMPUTATION_ID, id);
    }
    (out, at)
}

/// `shape` (a ShapeProto) with a layout on every array: the one it has, else the default (row-major). A pinned custom
/// call must say every layout (XLA rejects one without).
pub(super) fn with_layout(shape: &[u8]) -> Result<Vec<u8>, PassError> {
    use hlo::wire::enums::{OPAQUE_TYPE, TOKEN_TYPE, TUPLE_TYPE};
    use hlo::wire::layout::MINOR_TO_MAJOR;
    use hlo::wire::shape::{DIMENSIONS, ELEMENT_TYPE, LAYOUT, TUPLE_SHAPES};
    let fs = fields(shape)?;
    let mut out = Vec::with_capacity(shape.len() + 16);
    match first_int(&fs, ELEMENT_TYPE)? {
        Some(TUPLE_TYPE) => {
            for x in &fs {
                if x.number == TUPLE_SHAPES && x.wire == WireType::LengthDelimited {
                    put_bytes(&mut out, TUPLE_SHAPES, &with_layout(x.payload)?);
                } else {
                    out.extend_from_slice(x.raw);
                }
            }
        }
        Some(OPAQUE_TYPE | TOKEN_TYPE) => out.extend_from_slice(shape),
        _ if fs.iter().any(|x| x.number == LAYOUT) => out.extend_from_slice(shape),
        _ => {
            let mut rank = 0i64;
            for x in fs.iter().filter(|x| x.number == DIMENSIONS) {
                rank += ints(x)?.len() as i64;
            }
            out.extend_from_slice(shape);
            let mut layout = Vec::new();
            put_ints(&mut layout, MINOR_TO_MAJOR, (0..rank).rev());
            put_bytes(&mut out, LAYOUT, &layout);
        }
    }
    Ok(out)
}

/// Array leaves of a serialized shape (a tuple's, recursively; an array is one; a token none).
pub(super) fn leaves(shape: &[u8]) -> Result<usize, PassError> {
    use hlo::wire::{enums::*, shape::*};
    let fs = fields(shape)?;
    match first_int(&fs, ELEMENT_TYPE)? {
        Some(TUPLE_TYPE) => {
            fs.iter().filter_map(|x| x.message().filter(|_| x.number == TUPLE_SHAPES)).map(leaves).sum()
        }
        Some(TOKEN_TYPE) => Ok(0),
        _ => Ok(1),
    }
}

/// Pins a call's operand layouts (and, with its shape written by [`with_layout`], its result's): XLA's layout
/// assignment keeps a layout-constrained custom call's layouts, where it may give an unconstrained one any (XLA:GPU
/// assigns layouts after the pass and gave an all-to-all's call `{3,2,0,1}`, which a handler told nothing reads as
/// row-major). The handlers are told exactly these layouts (`layout` attribute, or none where operand and result
/// agree): the same shapes the pass decided on.
pub(super) fn pin_operands(
    ins: &mut Vec<u8>,
    operands: &[i64],
    shapes: &HashMap<i64, &[u8]>,
    name: &str,
) -> Result<(), PassError> {
    put_varint(ins, instruction::CONSTRAIN_LAYOUT, 1);
    for o in operands {
        let shape =
            shapes.get(o).ok_or_else(|| PassError::Wire(format!("'{name}': operand {o} is not in its computation")))?;
        put_bytes(ins, instruction::OPERAND_SHAPES_WITH_LAYOUT, &with_layout(shape)?);
    }
    Ok(())
}

/// The fields an instruction the pass turns into another opcode keeps: what names it and what users and tools see of
/// it.
const IDENTITY: [u32; 6] = [
    instruction::NAME,
    instruction::SHAPE,
    instruction::METADATA,
    instruction::ID,
    instruction::SHARDING,
    instruction::FRONTEND_ATTRIBUTES,
];

/// Copies the fields of `fs` numbered in `keep` to `out`, as they were encoded.
fn copy_fields(fs: &[Field<'_>], keep: &[u32], out: &mut Vec<u8>) {
    for x in fs.iter().filter(|x| keep.contains(&x.number)) {
        out.extend_from_slice(x.raw);
    }
}

/// The backend config of a call on XLA:GPU's operation queue `queue` ([`super::ASYNC_QUEUE`]; 0: the MLIR dictionary
/// itself): a `GpuBackendConfig` in proto JSON whose `custom_call_backend_config.attributes` carries the dictionary,
/// where XLA:GPU reads a typed-FFI call's attributes from when its backend config parses as one.
fn on_queue(dict: String, queue: u64) -> String {
    if queue == 0 {
        return dict;
    }
    serde_json::json!({
        "operation_queue_id": queue.to_string(),
        "custom_call_backend_config": { "attributes": dict },
    })
    .to_string()
}

/// The custom-call fields every rewritten collective gets.
pub(super) fn put_call(ins: &mut Vec<u8>, target: &str, config: &str) {
    put_bytes(ins, instruction::OPCODE, b"custom-call");
    put_bytes(ins, instruction::CUSTOM_CALL_TARGET, target.as_bytes());
    put_bytes(ins, instruction::BACKEND_CONFIG, config.as_bytes());
    put_varint(ins, instruction::CUSTOM_CALL_API_VERSION, API_VERSION_TYPED_FFI);
}

/// Re-encodes the module with the instructions in `rewrites` (index ids) turned into custom calls (target,
/// backend_config, [`Form`]), and its entry computation's layouts pinned ([`pin_entry`]). An async start's `-done` (the
/// instruction of that opcode whose operand is the start) is rewritten with it: a `copy` of an all-reduce's call,
/// element 1 of the `(operand, result)` tuple of the others. An inserted call gets an id one past the largest of its
/// computation (ids carry their computation in the upper 32 bits in modules XLA writes) that no instruction of the
/// module has, and the start's name with `.peerless` (made unique). Computations with nothing to change are copied as
/// they are.
///
/// With `chain` (XLA:CPU, whose thunk executor runs a device's independent thunks at once), each call after the first
/// of a computation that `chain(previous, call)` says nothing orders yet also takes, as its last operand, the previous
/// call of that computation in instruction order (the instruction the earlier rewrite left under that id: the call, or
/// an async form's tuple), and says how many buffers that adds (`order_operands`): every device then runs a
/// computation's calls one at a time, in one order. Instruction order is a topological order, so the added edges make
/// no cycle.
///
/// A call in `fused` ([`super::fuse::Fused`]) also takes the residual (and gamma) and returns the tuple `(h, y)`: the
/// instructions that computed `h` and `y` become its elements, those only the chain read are dropped, and the
/// computation's instructions are put back in a topological order (the call needs operands the all-reduce did not).
pub(super) fn rewrite(
    index: &Index<'_>,
    rewrites: &HashMap<InstrId, (&'static str, CustomCallConfig, Form)>,
    chain: Option<&dyn Fn(InstrId, InstrId) -> bool>,
    fused: &HashMap<InstrId, super::fuse::Fused>,
) -> Result<Vec<u8>, PassError> {
    // h and y → (the fused call's all-reduce, element); the instructions dropped.
    let mut elements: HashMap<InstrId, (InstrId, i64)> = HashMap::new();
    let mut dropped: BTreeSet<InstrId> = BTreeSet::new();
    for (&ar, f) in fused {
        elements.insert(f.h, (ar, 0));
        elements.insert(f.y, (ar, 1));
        dropped.extend(&f.dead);
    }
    // Every id and name of the module: an inserted instruction's must be new.
    let mut used_ids: BTreeSet<i64> = index.instrs.values().map(|i| i.id).collect();
    let mut used_names: BTreeSet<Cow<'_, str>> = index.instrs.values().map(|i| i.name.clone()).collect();
    let touched = |i: &InstrId| rewrites.contains_key(i) || elements.contains_key(i) || dropped.contains(i);
    let mut out = Vec::with_capacity(index.top.iter().map(|f| f.raw.len()).sum::<usize>() + rewrites.len() * 256);
    // The entry computation, pinned once every id the rewrite adds is known: where it goes.
    let mut entry: Option<(usize, Vec<u8>)> = None;
    let mut comps = index.comps.iter();
    for f in &index.top {
        let is_comp = f.number == hlo_module::COMPUTATIONS && f.wire == WireType::LengthDelimited;
        let Some((cid, c)) = is_comp.then(|| comps.next()).flatten() else {
            out.extend_from_slice(f.raw);
            continue;
        };
        if Some(cid) != index.entry && !c.instrs.iter().any(touched) {
            out.extend_from_slice(f.raw);
            continue;
        }
        // Async starts rewritten here, by id, the largest id of the computation and every instruction's shape by id (a
        // call's operands are in its computation).
        let mut starts: HashMap<i64, Form> = HashMap::new();
        let mut shapes: HashMap<i64, &[u8]> = HashMap::new();
        let mut max_id = 0i64;
        for &i in &c.instrs {
            let ins = &index.instrs[i];
            max_id = max_id.max(ins.id);
            if ins.fields.iter().any(|x| x.number == instruction::SHAPE) {
                shapes.insert(ins.id, ins.shape);
            }
            if let Some((_, _, form)) = rewrites.get(&i)
                && !matches!(form, Form::Sync | Form::InAsync)
            {
                starts.insert(ins.id, *form);
            }
        }
        let mut comp = Vec::with_capacity(c.field.payload.len());
        let mut any_fused = false;
        // The previous call of this computation (`chain`): its instruction's id and index id.
        let mut prev: Option<(i64, InstrId)> = None;
        // A call's config, with `order_operands` where it is chained after `prev`, and the operand to add.
        let ordered = |config: &CustomCallConfig,
                       prev: Option<(i64, InstrId)>,
                       this: InstrId|
         -> Result<(String, Option<i64>), PassError> {
            match chain.and_then(|unordered| prev.filter(|&(_, p)| unordered(p, this))) {
                Some((p, prev)) => {
                    let shape = shapes.get(&p).ok_or_else(|| PassError::Wire(format!("call {p} has no shape")))?;
                    // A fused call returns (h, y): two buffers.
                    let n = if fused.contains_key(&prev) { 2 } else { leaves(shape)? };
                    let call = CustomCallConfig { order_operands: n, ..config.clone() };
                    Ok((call.backend_config(), Some(p)))
                }
                None => Ok((config.backend_config(), None)),
            }
        };
        let mut instrs = c.instrs.iter().copied();
        for x in &c.fields {
            let is_instr = x.number == computation::INSTRUCTIONS && x.wire == WireType::LengthDelimited;
            let Some(i) = is_instr.then(|| instrs.next()).flatten() else {
                comp.extend_from_slice(x.raw);
                continue;
            };
            let ins = &index.instrs[i];
            let fs = &ins.fields[..];
            // A -done of a rewritten start.
            if ins.opcode.ends_with("-done")
                && let Some(form) = ins.operands.first().and_then(|o| starts.get(o))
            {
                let mut new = Vec::with_capacity(x.payload.len());
                copy_fields(fs, &IDENTITY, &mut new);
                copy_fields(fs, &[instruction::OPERAND_IDS, instruction::CONTROL_PREDECESSOR_IDS], &mut new);
                if *form == Form::AsyncTuple {
                    put_bytes(&mut new, instruction::OPCODE, b"get-tuple-element");
                    put_varint(&mut new, instruction::TUPLE_INDEX, 1);
                } else {
                    put_bytes(&mut new, instruction::OPCODE, b"copy");
                }
                put_bytes(&mut comp, computation::INSTRUCTIONS, &new);
                continue;
            }
            // The chain a fused call computes: its outputs become the call's elements, the rest goes.
            if dropped.contains(&i) {
                continue;
            }
            if let Some(&(ar, element)) = elements.get(&i) {
                let mut new = Vec::with_capacity(x.payload.len());
                copy_fields(fs, &IDENTITY, &mut new);
                put_bytes(&mut new, instruction::OPCODE, b"get-tuple-element");
                put_varint(&mut new, instruction::TUPLE_INDEX, element);
                put_ints(&mut new, instruction::OPERAND_IDS, [index.instrs[ar].id]);
                put_bytes(&mut comp, computation::INSTRUCTIONS, &new);
                continue;
            }
            let Some((target, config, form)) = rewrites.get(&i) else {
                comp.extend_from_slice(x.raw);
                continue;
            };
            let (config_text, after) = ordered(config, prev, i)?;
            prev = Some((ins.id, i));
            // Inside XLA's async wrapper a call needs no queue (one would wrap it again).
            let queue = if *form == Form::InAsync { 0 } else { super::queue_of(config) };
            let config = on_queue(config_text, queue);
            let name = &*ins.name;
            if *form != Form::AsyncTuple {
                let mut new = Vec::with_capacity(x.payload.len() + config.len() + 64);
                for y in fs.iter().filter(|y| {
                    !DROPPED.contains(&y.number)
                        && y.number != instruction::SHAPE
                        && y.number != instruction::OPERAND_IDS
                }) {
                    new.extend_from_slice(y.raw);
                }
                let mut operands = ins.operands.clone();
                match fused.get(&i) {
                    None => put_bytes(&mut new, instruction::SHAPE, &with_layout(ins.shape)?),
                    Some(f) => {
                        any_fused = true;
                        operands.extend(std::iter::once(f.residual).chain(f.gamma).map(|g| index.instrs[g].id));
                        let mut tuple = Vec::new();
                        put_varint(&mut tuple, hlo::wire::shape::ELEMENT_TYPE, hlo::wire::enums::TUPLE_TYPE);
                        for out in [f.h, f.y] {
                            let s = shapes.get(&index.instrs[out].id).ok_or_else(|| {
                                PassError::Wire(format!("fused '{}' has no shape", index.instrs[out].name))
                            })?;
                            put_bytes(&mut tuple, hlo::wire::shape::TUPLE_SHAPES, &with_layout(s)?);
                        }
                        put_bytes(&mut new, instruction::SHAPE, &tuple);
                    }
                }
                operands.extend(after);
                put_ints(&mut new, instruction::OPERAND_IDS, operands.iter().copied());
                pin_operands(&mut new, &operands, &shapes, name)?;
                put_call(&mut new, target, &config);
                put_bytes(&mut comp, computation::INSTRUCTIONS, &new);
                continue;
            }
            // `(operand, result)`: the call computes the result, the start becomes the tuple.
            let result_shape = fields(ins.shape)?
                .into_iter()
                .filter(|x| x.number == hlo::wire::shape::TUPLE_SHAPES && x.wire == WireType::LengthDelimited)
                .nth(1)
                .map(|x| x.payload)
                .ok_or_else(|| PassError::Wire(format!("'{name}': the start's shape has no element 1")))?;
            let operand =
                *ins.operands.first().ok_or_else(|| PassError::Wire(format!("'{name}': the start has no operand")))?;
            let call_id = (max_id + 1..).find(|i| !used_ids.contains(i)).unwrap_or(max_id + 1);
            used_ids.insert(call_id);
            max_id = max_id.max(call_id);
            let base = format!("{name}.peerless");
            let names = (0..).map(|k| if k == 0 { base.clone() } else { format!("{base}.{k}") });
            let call_name = names.into_iter().find(|n| !used_names.contains(n.as_str())).unwrap_or(base);
            used_names.insert(Cow::Owned(call_name.clone()));
            let mut call = Vec::with_capacity(x.payload.len() + config.len() + 64);
            put_bytes(&mut call, instruction::NAME, call_name.as_bytes());
            put_bytes(&mut call, instruction::SHAPE, &with_layout(result_shape)?);
            put_varint(&mut call, instruction::ID, call_id);
            copy_fields(
                fs,
                &[instruction::METADATA, instruction::CONTROL_PREDECESSOR_IDS, instruction::FRONTEND_ATTRIBUTES],
                &mut call,
            );
            let operands: Vec<i64> = std::iter::once(operand).chain(after).collect();
            put_ints(&mut call, instruction::OPERAND_IDS, operands.iter().copied());
            pin_operands(&mut call, &operands, &shapes, name)?;
            put_call(&mut call, target, &config);
            put_bytes(&mut comp, computation::INSTRUCTIONS, &call);
            let mut tuple = Vec::with_capacity(x.payload.len());
            copy_fields(
                fs,
                &[instruction::NAME, instruction::SHAPE, instruction::METADATA, instruction::ID, instruction::SHARDING],
                &mut tuple,
            );
            put_bytes(&mut tuple, instruction::OPCODE, b"tuple");
            put_ints(&mut tuple, instruction::OPERAND_IDS, [operand, call_id]);
            put_bytes(&mut comp, computation::INSTRUCTIONS, &tuple);
        }
        if any_fused {
            comp = topological(&comp)?;
        }
        match Some(cid) == index.entry {
            true => entry = Some((out.len(), comp)),
            false => put_bytes(&mut out, hlo_module::COMPUTATIONS, &comp),
        }
    }
    let Some((at, comp)) = entry else { return Ok(out) };
    // The ids and names of the rewritten module.
    for &i in &dropped {
        used_ids.remove(&index.instrs[i].id);
        used_names.remove(&index.instrs[i].name);
    }
    let comp = pin_entry(index, &comp, &used_ids, &used_names)?.unwrap_or(comp);
    let mut field = Vec::with_capacity(comp.len() + 8);
    put_bytes(&mut field, hlo_module::COMPUTATIONS, &comp);
    out.splice(at..at, field);
    Ok(out)
}

/// A computation's instructions in a topological order (operands and control predecessors first), otherwise in the
/// order they had; its other fields as they were.
fn topological(comp: &[u8]) -> Result<Vec<u8>, PassError> {
    let cf = fields(comp)?;
    let mut out = Vec::with_capacity(comp.len());
    let mut nodes: Vec<(i64, Vec<i64>, &[u8])> = Vec::new();
    for x in &cf {
        if x.number == computation::INSTRUCTIONS && x.wire == WireType::LengthDelimited {
            let (mut id, mut deps) = (0, Vec::new());
            for f in fields(x.payload)? {
                match f.number {
                    instruction::ID => id = ints(&f)?.first().copied().unwrap_or(0),
                    instruction::OPERAND_IDS | instruction::CONTROL_PREDECESSOR_IDS => deps.extend(ints(&f)?),
                    _ => {}
                }
            }
            nodes.push((id, deps, x.raw));
        } else {
            out.extend_from_slice(x.raw);
        }
    }
    let present: BTreeSet<i64> = nodes.iter().map(|n| n.0).collect();
    let mut done: BTreeSet<i64> = BTreeSet::new();
    let mut emitted = vec![false; nodes.len()];
    // Each sweep emits, in order, every instruction whose dependencies are out (n sweeps at most).
    while done.len() < nodes.len() {
        let before = done.len();
        for (k, (id, deps, raw)) in nodes.iter().enumerate() {
            if !emitted[k] && deps.iter().all(|d| done.contains(d) || !present.contains(d)) {
                out.extend_from_slice(raw);
                emitted[k] = true;
                done.insert(*id);
            }
        }
        if done.len() == before {
            return Err(PassError::Wire("a cycle among a computation's instructions".into()));
        }
    }
    Ok(out)
}

/// `shape` without its layouts (a tuple's, recursively): what two shapes must share for one to stand for the other.
fn unlaid(shape: &[u8]) -> Result<Vec<u8>, PassError> {
    use hlo::wire::shape::{LAYOUT, TUPLE_SHAPES};
    let mut out = Vec::with_capacity(shape.len());
    for x in fields(shape)? {
        match x.number {
            LAYOUT => {}
            TUPLE_SHAPES if x.wire == WireType::LengthDelimited => {
                put_bytes(&mut out, TUPLE_SHAPES, &unlaid(x.payload)?)
            }
            _ => out.extend_from_slice(x.raw),
        }
    }
    Ok(out)
}

/// Whether every array of `shape` says its layout (a layout left out means "XLA chooses").
fn fully_laid(shape: &[u8]) -> Result<bool, PassError> {
    use hlo::wire::enums::{OPAQUE_TYPE, TOKEN_TYPE, TUPLE_TYPE};
    use hlo::wire::shape::{ELEMENT_TYPE, LAYOUT, TUPLE_SHAPES};
    let fs = fields(shape)?;
    match first_int(&fs, ELEMENT_TYPE)? {
        Some(TUPLE_TYPE) => {
            for x in fs.iter().filter(|x| x.number == TUPLE_SHAPES && x.wire == WireType::LengthDelimited) {
                if !fully_laid(x.payload)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Some(OPAQUE_TYPE | TOKEN_TYPE) => Ok(true),
        _ => Ok(fs.iter().any(|x| x.number == LAYOUT)),
    }
}

/// The rewritten entry computation `comp` with its parameters and root carrying the layouts of the module's
/// `host_program_shape` (the entry computation layout: what the user asked for, or XLA's defaults), or `None` where
/// they already do. `ids` and `names`: those of the rewritten module (a root copy gets fresh ones).
///
/// Why: before layout assignment (XLA:GPU's PRE_SCHEDULER) the entry layout lives only in the module's configuration,
/// and XLA takes a changed module's entry layout from its entry's parameter and root shapes (the PJRT transform hook
/// replaces the entry computation). Left as they come (row-major), a user's layout would silently become the default,
/// and JAX refuses the executable ("Unexpected XLA layout override"). A parameter's shape constrains nothing: XLA adds
/// a copy where a pinned call reads it in another layout. A root whose own layout is pinned (a Peerless call) keeps it
/// and gets a `copy` in the entry layout as the new root. Shapes that leave a layout out (JAX's `AUTO`) stay as they
/// are: XLA chooses.
fn pin_entry(
    index: &Index<'_>,
    comp: &[u8],
    ids: &BTreeSet<i64>,
    names: &BTreeSet<Cow<'_, str>>,
) -> Result<Option<Vec<u8>>, PassError> {
    use hlo::wire::program_shape::{PARAMETERS, RESULT};
    let host = index.top.iter().find(|f| f.number == hlo_module::HOST_PROGRAM_SHAPE).and_then(|f| f.message());
    let Some(host) = host else { return Ok(None) };
    let hf = fields(host)?;
    let params: Vec<&[u8]> = hf
        .iter()
        .filter(|x| x.number == PARAMETERS && x.wire == WireType::LengthDelimited)
        .map(|x| x.payload)
        .collect();
    let result = hf.iter().find(|x| x.number == RESULT && x.wire == WireType::LengthDelimited).map(|x| x.payload);
    // The shape an entry instruction should have, if it differs from `shape`.
    let wanted = |want: Option<&[u8]>, shape: &[u8]| -> Result<Option<Vec<u8>>, PassError> {
        let Some(want) = want else { return Ok(None) };
        if want == shape || !fully_laid(want)? || unlaid(want)? != unlaid(shape)? {
            return Ok(None);
        }
        Ok(Some(want.to_vec()))
    };
    let cf = fields(comp)?;
    let root = first_int(&cf, computation::ROOT_ID)?.unwrap_or(0);
    let mut new_root: Option<i64> = None;
    let mut changed = false;
    let mut out = Vec::with_capacity(comp.len() + 64);
    for x in &cf {
        if x.number == computation::ROOT_ID {
            continue; // written last: it may change
        }
        let Some(ins) = x.message().filter(|_| x.number == computation::INSTRUCTIONS) else {
            out.extend_from_slice(x.raw);
            continue;
        };
        let fs = fields(ins)?;
        let (opcode, shape) = (payload(&fs, instruction::OPCODE), payload(&fs, instruction::SHAPE));
        let is_root = first_int(&fs, instruction::ID)?.unwrap_or(0) == root;
        let want = if opcode == b"parameter" {
            let k = first_int(&fs, instruction::PARAMETER_NUMBER)?.unwrap_or(0);
            usize::try_from(k).ok().and_then(|k| params.get(k).copied())
        } else {
            result.filter(|_| is_root)
        };
        let Some(new_shape) = wanted(want, shape)? else {
            out.extend_from_slice(x.raw);
            continue;
        };
        changed = true;
        let pinned = first_int(&fs, instruction::CONSTRAIN_LAYOUT)?.unwrap_or(0) != 0;
        if is_root && pinned {
            // The call keeps its layout; a copy in the entry layout becomes the root.
            out.extend_from_slice(x.raw);
            let copy_id = (root + 1..).find(|i| !ids.contains(i)).unwrap_or(root + 1);
            let base = fs.iter().find(|y| y.number == instruction::NAME).map(|y| String::from_utf8_lossy(y.payload));
            let base = format!("{}.entry_layout", base.as_deref().unwrap_or("root"));
            let name = (0..).map(|k| if k == 0 { base.clone() } else { format!("{base}.{k}") });
            let name = name.into_iter().find(|n| !names.contains(n.as_str())).unwrap_or(base);
            let mut copy = Vec::new();
            put_bytes(&mut copy, instruction::NAME, name.as_bytes());
            put_bytes(&mut copy, instruction::OPCODE, b"copy");
            put_bytes(&mut copy, instruction::SHAPE, &new_shape);
            put_varint(&mut copy, instruction::ID, copy_id);
            put_ints(&mut copy, instruction::OPERAND_IDS, [root]);
            put_bytes(&mut out, computation::INSTRUCTIONS, &copy);
            new_root = Some(copy_id);
            continue;
        }
        let mut new = Vec::with_capacity(ins.len() + 16);
        for y in &fs {
            if y.number == instruction::SHAPE {
                put_bytes(&mut new, instruction::SHAPE, &new_shape);
            } else {
                new.extend_from_slice(y.raw);
            }
        }
        put_bytes(&mut out, computation::INSTRUCTIONS, &new);
    }
    put_varint(&mut out, computation::ROOT_ID, new_root.unwrap_or(root));
    Ok(changed.then_some(out))
}
