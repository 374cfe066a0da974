//! The pass's edits on the wire: the quick scan for collectives, the slim module the decisions
//! read, and the rewrite of the taken collectives into pinned custom calls.

use super::*;

/// The first value of integer field `number` of a message's `fs`.
pub(super) fn first_int(fs: &[Field<'_>], number: u32) -> Result<Option<i64>, PassError> {
    Ok(fs.iter().find(|x| x.number == number).map(ints).transpose()?.and_then(|v| v.first().copied()))
}

/// The payload of field `number` of a message's `fs` (empty where it has none).
fn payload<'a>(fs: &[Field<'a>], number: u32) -> &'a [u8] {
    fs.iter().find(|x| x.number == number).map_or(&[], |x| x.payload)
}

/// Whether the module has any collective: the cheap check that lets the pass return at
/// once for the many modules without one.
pub fn has_collectives(module: &[u8]) -> Result<bool, PassError> {
    let mut any = false;
    for c in fields(module)?.iter().filter(|c| c.number == hlo_module::COMPUTATIONS).filter_map(Field::message) {
        for i in fields(c)?.iter().filter(|i| i.number == computation::INSTRUCTIONS).filter_map(Field::message) {
            let opcode = std::str::from_utf8(payload(&fields(i)?, instruction::OPCODE)).unwrap_or("");
            any |= COLLECTIVE_OPCODES.contains(&opcode);
        }
    }
    Ok(any)
}

/// What the decisions read, and nothing else: a module of the computations that hold
/// collectives, each reduced to its collectives (verbatim but for control predecessors)
/// and their operands (as parameters of the same name, id and shape), plus the
/// computations the collectives call (reducers), verbatim. Decoding it costs a fraction of
/// decoding the whole module (a 32-layer train step: 3.8 MB, 29 672 instructions in 3 435
/// computations, of which the slim module keeps the few hundred that matter). `None`: the
/// module has no collective.
pub(super) fn slim(module: &[u8]) -> Result<Option<Vec<u8>>, PassError> {
    let top = fields(module)?;
    let mut kept_comps: Vec<Vec<u8>> = Vec::new();
    let mut called: Vec<i64> = Vec::new();
    let mut entry: Option<(Vec<u8>, i64)> = None;
    let mut by_id: HashMap<i64, &[u8]> = HashMap::new();
    for c in top.iter().filter(|c| c.number == hlo_module::COMPUTATIONS && c.wire == WireType::LengthDelimited) {
        let cf = fields(c.payload)?;
        let comp_id = first_int(&cf, computation::ID)?;
        // proto3 leaves a zero out: a computation without an id is id 0 (prost writes
        // modules so, and XLA may).
        by_id.insert(comp_id.unwrap_or(0), c.raw);
        let instrs: Vec<&Field<'_>> = cf
            .iter()
            .filter(|i| i.number == computation::INSTRUCTIONS && i.wire == WireType::LengthDelimited)
            .collect();
        // The collectives of this computation, with their fields.
        let mut colls: Vec<Vec<Field<'_>>> = Vec::new();
        let mut all: HashMap<i64, Vec<Field<'_>>> = HashMap::new();
        for i in &instrs {
            let fs = fields(i.payload)?;
            let op = std::str::from_utf8(payload(&fs, instruction::OPCODE)).unwrap_or("");
            if COLLECTIVE_OPCODES.contains(&op) {
                colls.push(fs);
            } else {
                all.insert(first_int(&fs, instruction::ID)?.unwrap_or(0), fs);
            }
        }
        if colls.is_empty() {
            continue;
        }
        let mut out = Vec::new();
        for x in cf.iter().filter(|x| matches!(x.number, computation::NAME | computation::ID)) {
            out.extend_from_slice(x.raw);
        }
        // Operands that are not collectives themselves become parameters.
        let mut stand_ins: Vec<i64> = Vec::new();
        for fs in &colls {
            for x in fs.iter().filter(|x| x.number == instruction::OPERAND_IDS) {
                for id in ints(x)? {
                    if all.contains_key(&id) && !stand_ins.contains(&id) {
                        stand_ins.push(id);
                    }
                }
            }
            for x in fs.iter().filter(|x| x.number == instruction::CALLED_COMPUTATION_IDS) {
                called.extend(ints(x)?);
            }
        }
        for (k, id) in stand_ins.iter().enumerate() {
            let fs = &all[id];
            let mut ins = Vec::new();
            for x in fs.iter().filter(|x| matches!(x.number, instruction::NAME | instruction::SHAPE | instruction::ID))
            {
                ins.extend_from_slice(x.raw);
            }
            put_bytes(&mut ins, instruction::OPCODE, b"parameter");
            put_varint(&mut ins, instruction::PARAMETER_NUMBER, k as i64);
            put_bytes(&mut out, computation::INSTRUCTIONS, &ins);
        }
        let mut root = 0;
        for fs in &colls {
            let mut ins = Vec::new();
            for x in fs.iter().filter(|x| x.number != instruction::CONTROL_PREDECESSOR_IDS) {
                ins.extend_from_slice(x.raw);
                if x.number == instruction::ID {
                    root = ints(x)?.first().copied().unwrap_or(0);
                }
            }
            put_bytes(&mut out, computation::INSTRUCTIONS, &ins);
        }
        put_varint(&mut out, computation::ROOT_ID, root);
        if entry.is_none() {
            let name =
                cf.iter().find(|x| x.number == computation::NAME).map(|x| x.payload.to_vec()).unwrap_or_default();
            entry = Some((name, comp_id.unwrap_or(0)));
        }
        kept_comps.push(out);
    }
    let mut out = Vec::with_capacity(module.len() / 8);
    for x in top.iter().filter(|x| MODULE_KEPT.contains(&x.number)) {
        out.extend_from_slice(x.raw);
    }
    for c in &kept_comps {
        put_bytes(&mut out, hlo_module::COMPUTATIONS, c);
    }
    if kept_comps.is_empty() {
        return Ok(None);
    }
    called.sort_unstable();
    called.dedup();
    for id in called {
        if let Some(raw) = by_id.get(&id) {
            out.extend_from_slice(raw);
        }
    }
    // The entry is a kept computation (the last value of a scalar field wins).
    if let Some((name, id)) = entry {
        put_bytes(&mut out, hlo_module::ENTRY_COMPUTATION_NAME, &name);
        put_varint(&mut out, hlo_module::ENTRY_COMPUTATION_ID, id);
    }
    Ok(Some(out))
}

/// The instructions' ids and names of a whole module (fresh ones for inserted calls must be
/// unused).
pub(super) fn ids_and_names(module: &[u8]) -> Result<(BTreeSet<i64>, BTreeSet<String>), PassError> {
    let (mut ids, mut names) = (BTreeSet::new(), BTreeSet::new());
    for c in
        fields(module)?.iter().filter(|c| c.number == hlo_module::COMPUTATIONS && c.wire == WireType::LengthDelimited)
    {
        for i in fields(c.payload)?.iter().filter(|i| i.number == computation::INSTRUCTIONS) {
            for x in fields(i.payload)? {
                match x.number {
                    instruction::ID => ids.extend(ints(&x)?),
                    instruction::NAME => drop(names.insert(String::from_utf8_lossy(x.payload).into_owned())),
                    _ => {}
                }
            }
        }
    }
    Ok((ids, names))
}

/// `shape` (a ShapeProto) with a layout on every array: the one it has, else the default
/// (row-major). A pinned custom call must say every layout (XLA rejects one without).
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

/// `PrimitiveType` numbers of the shapes [`leaves`] tells apart.
const TUPLE: i64 = 13;
const TOKEN: i64 = 17;

/// Array leaves of a serialized shape (a tuple's, recursively; an array is one; a token none).
pub(super) fn leaves(shape: &[u8]) -> Result<usize, PassError> {
    let fs = fields(shape)?;
    let tuple: Vec<_> = fs
        .iter()
        .filter(|x| x.number == hlo::wire::shape::TUPLE_SHAPES && x.wire == WireType::LengthDelimited)
        .collect();
    match first_int(&fs, hlo::wire::shape::ELEMENT_TYPE)? {
        Some(TUPLE) => tuple.iter().map(|x| leaves(x.payload)).sum(),
        Some(TOKEN) => Ok(0),
        _ => Ok(1),
    }
}

/// Pins a call's operand layouts (and, with its shape written by [`with_layout`], its
/// result's): XLA's layout assignment keeps a layout-constrained custom call's layouts, where
/// it may give an unconstrained one any (XLA:GPU assigns layouts after the pass and gave an
/// all-to-all's call `{3,2,0,1}`, which a handler told nothing reads as row-major). The
/// handlers are told exactly these layouts (`layout` attribute, or none where operand and
/// result agree): the same shapes the pass decided on.
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

/// The fields an instruction the pass turns into another opcode keeps: what names it and
/// what users and tools see of it.
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

/// The backend config of a call on XLA:GPU's operation queue `queue` ([`super::ASYNC_QUEUE`];
/// 0: the MLIR dictionary itself): a `GpuBackendConfig` in proto JSON whose
/// `custom_call_backend_config.attributes` carries the dictionary, where XLA:GPU reads a
/// typed-FFI call's attributes from when its backend config parses as one.
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

/// Re-encodes the module with the instructions named in `rewrites` turned into custom
/// calls (target, backend_config, [`Form`]). An async start's `-done` (the instruction of
/// that opcode whose operand is the start) is rewritten with it: a `copy` of an
/// all-reduce's call, element 1 of the `(operand, result)` tuple of the others. An
/// inserted call gets an id one past the largest of its computation (ids carry their
/// computation in the upper 32 bits in modules XLA writes) that no instruction of the
/// module has, and the start's name with `.peerless` (made unique).
///
/// With `chain` (XLA:CPU, whose thunk executor runs a device's independent thunks at once),
/// each call after the first of a computation that `chain(previous, call)` says nothing
/// orders yet also takes, as its last operand, the previous call of that computation in
/// instruction order (the instruction the earlier rewrite left under that id: the call, or an
/// async form's tuple), and says how many buffers that adds (`order_operands`): every device
/// then runs a computation's calls one at a time, in one order. Instruction order is a
/// topological order, so the added edges make no cycle.
///
/// A call in `fused` ([`super::fuse::Fused`]) also takes the residual (and gamma) and returns
/// the tuple `(h, y)`: the instructions that computed `h` and `y` become its elements, those
/// only the chain read are dropped, and the computation's instructions are put back in a
/// topological order (the call needs operands the all-reduce did not).
pub(super) fn rewrite(
    module: &[u8],
    rewrites: &HashMap<String, (&'static str, CustomCallConfig, Form)>,
    chain: Option<&dyn Fn(&str, &str) -> bool>,
    fused: &HashMap<String, super::fuse::Fused>,
) -> Result<Vec<u8>, PassError> {
    // Instruction name → (the fused call's all-reduce, element) for h and y; names dropped.
    let mut elements: HashMap<&str, (&str, i64)> = HashMap::new();
    let mut dropped: BTreeSet<&str> = BTreeSet::new();
    for (ar, f) in fused {
        elements.insert(f.h.as_str(), (ar.as_str(), 0));
        elements.insert(f.y.as_str(), (ar.as_str(), 1));
        dropped.extend(f.dead.iter().map(String::as_str));
    }
    let any_tuple = rewrites.values().any(|r| r.2 == Form::AsyncTuple);
    let (mut used_ids, mut used_names) =
        if any_tuple { ids_and_names(module)? } else { (BTreeSet::new(), BTreeSet::new()) };
    let mut out = Vec::with_capacity(module.len() + rewrites.len() * 256);
    for c in fields(module)? {
        if c.number != hlo_module::COMPUTATIONS || c.wire != WireType::LengthDelimited {
            out.extend_from_slice(c.raw);
            continue;
        }
        let cf = fields(c.payload)?;
        let mut instrs: Vec<Option<Vec<Field<'_>>>> = Vec::with_capacity(cf.len());
        for i in &cf {
            instrs.push(if i.number == computation::INSTRUCTIONS && i.wire == WireType::LengthDelimited {
                Some(fields(i.payload)?)
            } else {
                None
            });
        }
        let name_of = |fs: &[Field<'_>]| {
            fs.iter().find(|x| x.number == instruction::NAME).map(|x| String::from_utf8_lossy(x.payload).into_owned())
        };
        // Async starts rewritten here, by id, the largest id of the computation and every
        // instruction's shape by id (a call's operands are in its computation).
        let mut starts: HashMap<i64, Form> = HashMap::new();
        let mut shapes: HashMap<i64, &[u8]> = HashMap::new();
        let mut max_id = 0i64;
        let mut ids_by_name: HashMap<String, i64> = HashMap::new();
        for fs in instrs.iter().flatten() {
            let id = first_int(fs, instruction::ID)?.unwrap_or(0);
            max_id = max_id.max(id);
            if let Some(n) = name_of(fs) {
                ids_by_name.insert(n, id);
            }
            if let Some(x) = fs.iter().find(|x| x.number == instruction::SHAPE) {
                shapes.insert(id, x.payload);
            }
            if let Some((_, _, form)) = name_of(fs).and_then(|n| rewrites.get(&n))
                && !matches!(form, Form::Sync | Form::InAsync)
            {
                starts.insert(id, *form);
            }
        }
        let mut comp = Vec::with_capacity(c.payload.len());
        let mut any_fused = false;
        // The previous call of this computation (`chain`): its instruction id and name.
        let mut prev: Option<(i64, String)> = None;
        // A call's config, with `order_operands` where it is chained after `prev`, and the
        // operand to add.
        let ordered =
            |config: &CustomCallConfig, prev: &Option<(i64, String)>| -> Result<(String, Option<i64>), PassError> {
                let after = chain.and_then(|unordered| {
                    prev.as_ref().filter(|(_, name)| unordered(name, &config.name)).map(|(id, _)| *id)
                });
                match after {
                    Some(p) => {
                        let shape = shapes.get(&p).ok_or_else(|| PassError::Wire(format!("call {p} has no shape")))?;
                        // A fused call returns (h, y): two buffers.
                        let fused_prev = prev.as_ref().is_some_and(|(_, n)| fused.contains_key(n));
                        let n = if fused_prev { 2 } else { leaves(shape)? };
                        let call = CustomCallConfig { order_operands: n, ..config.clone() };
                        Ok((call.backend_config(), Some(p)))
                    }
                    None => Ok((config.backend_config(), None)),
                }
            };
        for (i, fs) in cf.iter().zip(&instrs) {
            let Some(fs) = fs else {
                comp.extend_from_slice(i.raw);
                continue;
            };
            // A -done of a rewritten start.
            if payload(fs, instruction::OPCODE).ends_with(b"-done")
                && let Some(form) = first_int(fs, instruction::OPERAND_IDS)?.and_then(|o| starts.get(&o))
            {
                let mut ins = Vec::with_capacity(i.payload.len());
                copy_fields(fs, &IDENTITY, &mut ins);
                copy_fields(fs, &[instruction::OPERAND_IDS, instruction::CONTROL_PREDECESSOR_IDS], &mut ins);
                if *form == Form::AsyncTuple {
                    put_bytes(&mut ins, instruction::OPCODE, b"get-tuple-element");
                    put_varint(&mut ins, instruction::TUPLE_INDEX, 1);
                } else {
                    put_bytes(&mut ins, instruction::OPCODE, b"copy");
                }
                put_bytes(&mut comp, computation::INSTRUCTIONS, &ins);
                continue;
            }
            let name = name_of(fs);
            // The chain a fused call computes: its outputs become the call's elements, the rest goes.
            if let Some(n) = name.as_deref() {
                if dropped.contains(n) {
                    continue;
                }
                if let Some(&(ar, index)) = elements.get(n) {
                    let call_id = *ids_by_name
                        .get(ar)
                        .ok_or_else(|| PassError::Wire(format!("'{n}': the fused '{ar}' is not in its computation")))?;
                    let mut ins = Vec::with_capacity(i.payload.len());
                    copy_fields(fs, &IDENTITY, &mut ins);
                    put_bytes(&mut ins, instruction::OPCODE, b"get-tuple-element");
                    put_varint(&mut ins, instruction::TUPLE_INDEX, index);
                    put_ints(&mut ins, instruction::OPERAND_IDS, [call_id]);
                    put_bytes(&mut comp, computation::INSTRUCTIONS, &ins);
                    continue;
                }
            }
            let Some((target, config, form)) = name.as_ref().and_then(|n| rewrites.get(n)) else {
                comp.extend_from_slice(i.raw);
                continue;
            };
            let (config_text, after) = ordered(config, &prev)?;
            let id = first_int(fs, instruction::ID)?.unwrap_or(0);
            prev = Some((id, config.name.clone()));
            // Inside XLA's async wrapper a call needs no queue (one would wrap it again).
            let queue = if *form == Form::InAsync { 0 } else { super::queue_of(config) };
            let config = on_queue(config_text, queue);
            if *form != Form::AsyncTuple {
                let mut ins = Vec::with_capacity(i.payload.len() + config.len() + 64);
                for x in fs.iter().filter(|x| {
                    !DROPPED.contains(&x.number)
                        && x.number != instruction::SHAPE
                        && x.number != instruction::OPERAND_IDS
                }) {
                    ins.extend_from_slice(x.raw);
                }
                let shape = payload(fs, instruction::SHAPE);
                let mut operands =
                    fs.iter().find(|x| x.number == instruction::OPERAND_IDS).map(ints).transpose()?.unwrap_or_default();
                match name.as_deref().and_then(|n| fused.get(n)) {
                    None => put_bytes(&mut ins, instruction::SHAPE, &with_layout(shape)?),
                    Some(f) => {
                        any_fused = true;
                        let id_of = |n: &str| {
                            ids_by_name
                                .get(n)
                                .copied()
                                .ok_or_else(|| PassError::Wire(format!("fused '{n}' is not in its computation")))
                        };
                        operands.push(id_of(&f.residual)?);
                        if let Some(g) = &f.gamma {
                            operands.push(id_of(g)?);
                        }
                        let mut tuple = Vec::new();
                        put_varint(&mut tuple, hlo::wire::shape::ELEMENT_TYPE, TUPLE);
                        for out in [&f.h, &f.y] {
                            let s = shapes
                                .get(&id_of(out)?)
                                .ok_or_else(|| PassError::Wire(format!("fused '{out}' has no shape")))?;
                            put_bytes(&mut tuple, hlo::wire::shape::TUPLE_SHAPES, &with_layout(s)?);
                        }
                        put_bytes(&mut ins, instruction::SHAPE, &tuple);
                    }
                }
                operands.extend(after);
                put_ints(&mut ins, instruction::OPERAND_IDS, operands.iter().copied());
                pin_operands(&mut ins, &operands, &shapes, name.as_deref().unwrap_or(""))?;
                put_call(&mut ins, target, &config);
                put_bytes(&mut comp, computation::INSTRUCTIONS, &ins);
                continue;
            }
            // `(operand, result)`: the call computes the result, the start becomes the tuple.
            let name = name.unwrap_or_default();
            let result_shape = fields(payload(fs, instruction::SHAPE))?
                .into_iter()
                .filter(|x| x.number == hlo::wire::shape::TUPLE_SHAPES && x.wire == WireType::LengthDelimited)
                .nth(1)
                .map(|x| x.payload)
                .ok_or_else(|| PassError::Wire(format!("'{name}': the start's shape has no element 1")))?;
            let operand = first_int(fs, instruction::OPERAND_IDS)?
                .ok_or_else(|| PassError::Wire(format!("'{name}': the start has no operand")))?;
            let mut call_id = max_id + 1;
            while used_ids.contains(&call_id) {
                call_id += 1;
            }
            used_ids.insert(call_id);
            max_id = max_id.max(call_id);
            let mut call_name = format!("{name}.peerless");
            let mut k = 1;
            while used_names.contains(&call_name) {
                call_name = format!("{name}.peerless.{k}");
                k += 1;
            }
            used_names.insert(call_name.clone());
            let mut call = Vec::with_capacity(i.payload.len() + config.len() + 64);
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
            pin_operands(&mut call, &operands, &shapes, &name)?;
            put_call(&mut call, target, &config);
            put_bytes(&mut comp, computation::INSTRUCTIONS, &call);
            let mut tuple = Vec::with_capacity(i.payload.len());
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
        put_bytes(&mut out, hlo_module::COMPUTATIONS, &comp);
    }
    Ok(out)
}

/// A computation's instructions in a topological order (operands and control predecessors
/// first), otherwise in the order they had; its other fields as they were.
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

/// `shape` without its layouts (a tuple's, recursively): what two shapes must share for one to
/// stand for the other.
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

/// The rewritten module with the entry computation's parameters and root carrying the layouts
/// of its `host_program_shape` (the entry computation layout: what the user asked for, or
/// XLA's defaults), or `None` where they already do.
///
/// Why: before layout assignment (XLA:GPU's PRE_SCHEDULER) the entry layout lives only in the
/// module's configuration, and XLA takes a changed module's entry layout from its entry's
/// parameter and root shapes (the PJRT transform hook replaces the entry computation). Left
/// as they come (row-major), a user's layout would silently become the default, and JAX
/// refuses the executable ("Unexpected XLA layout override"). A parameter's shape constrains
/// nothing: XLA adds a copy where a pinned call reads it in another layout. A root whose own
/// layout is pinned (a Peerless call) keeps it and gets a `copy` in the entry layout as the
/// new root. Shapes that leave a layout out (JAX's `AUTO`) stay as they are: XLA chooses.
pub(super) fn pin_entry_layouts(module: &[u8]) -> Result<Option<Vec<u8>>, PassError> {
    use hlo::wire::program_shape::{PARAMETERS, RESULT};
    let top = fields(module)?;
    let Some(host) = top.iter().find(|f| f.number == hlo_module::HOST_PROGRAM_SHAPE).and_then(|f| f.message()) else {
        return Ok(None);
    };
    let hf = fields(host)?;
    let params: Vec<&[u8]> = hf
        .iter()
        .filter(|x| x.number == PARAMETERS && x.wire == WireType::LengthDelimited)
        .map(|x| x.payload)
        .collect();
    let result = hf.iter().find(|x| x.number == RESULT && x.wire == WireType::LengthDelimited).map(|x| x.payload);
    let entry_id = first_int(&top, hlo_module::ENTRY_COMPUTATION_ID)?.unwrap_or(0);
    let entry_name = top
        .iter()
        .find(|f| f.number == hlo_module::ENTRY_COMPUTATION_NAME)
        .map(|f| String::from_utf8_lossy(f.payload).into_owned());
    // The shape an entry instruction should have, if it differs from `shape`.
    let wanted = |want: Option<&[u8]>, shape: &[u8]| -> Result<Option<Vec<u8>>, PassError> {
        let Some(want) = want else { return Ok(None) };
        if want == shape || !fully_laid(want)? || unlaid(want)? != unlaid(shape)? {
            return Ok(None);
        }
        Ok(Some(want.to_vec()))
    };
    // A fresh id and name for a root copy: every id and name of the module is distinct.
    let (ids, names) = ids_and_names(module)?;
    let mut changed = false;
    let mut out = Vec::with_capacity(module.len() + 64);
    for f in &top {
        let Some(comp) = f.message().filter(|_| f.number == hlo_module::COMPUTATIONS) else {
            out.extend_from_slice(f.raw);
            continue;
        };
        let cf = fields(comp)?;
        let id = first_int(&cf, computation::ID)?.unwrap_or(0);
        let name = cf.iter().find(|x| x.number == computation::NAME).map(|x| String::from_utf8_lossy(x.payload));
        let is_entry = match &entry_name {
            Some(n) => name.as_deref() == Some(n.as_str()),
            None => id == entry_id,
        };
        if !is_entry {
            out.extend_from_slice(f.raw);
            continue;
        }
        let root = first_int(&cf, computation::ROOT_ID)?.unwrap_or(0);
        let mut new_root: Option<i64> = None;
        let mut comp_out = Vec::with_capacity(comp.len() + 64);
        for x in &cf {
            if x.number == computation::ROOT_ID {
                continue; // written last: it may change
            }
            let Some(ins) = x.message().filter(|_| x.number == computation::INSTRUCTIONS) else {
                comp_out.extend_from_slice(x.raw);
                continue;
            };
            let fs = fields(ins)?;
            let (opcode, shape) = (payload(&fs, instruction::OPCODE), payload(&fs, instruction::SHAPE));
            let is_root = first_int(&fs, instruction::ID)?.unwrap_or(0) == root;
            let want = if opcode == b"parameter" {
                let k = first_int(&fs, instruction::PARAMETER_NUMBER)?.unwrap_or(0);
                usize::try_from(k).ok().and_then(|k| params.get(k).copied())
            } else if is_root {
                result
            } else {
                None
            };
            let Some(new_shape) = wanted(want, shape)? else {
                comp_out.extend_from_slice(x.raw);
                continue;
            };
            changed = true;
            let pinned = first_int(&fs, instruction::CONSTRAIN_LAYOUT)?.unwrap_or(0) != 0;
            if is_root && pinned {
                // The call keeps its layout; a copy in the entry layout becomes the root.
                comp_out.extend_from_slice(x.raw);
                let copy_id = (root + 1..).find(|i| !ids.contains(i)).unwrap_or(root + 1);
                let base =
                    fs.iter().find(|y| y.number == instruction::NAME).map(|y| String::from_utf8_lossy(y.payload));
                let base = format!("{}.entry_layout", base.as_deref().unwrap_or("root"));
                let name = (0..).map(|k| if k == 0 { base.clone() } else { format!("{base}.{k}") });
                let name = name.into_iter().find(|n| !names.contains(n)).unwrap_or(base);
                let mut copy = Vec::new();
                put_bytes(&mut copy, instruction::NAME, name.as_bytes());
                put_bytes(&mut copy, instruction::OPCODE, b"copy");
                put_bytes(&mut copy, instruction::SHAPE, &new_shape);
                put_varint(&mut copy, instruction::ID, copy_id);
                put_ints(&mut copy, instruction::OPERAND_IDS, [root]);
                put_bytes(&mut comp_out, computation::INSTRUCTIONS, &copy);
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
            put_bytes(&mut comp_out, computation::INSTRUCTIONS, &new);
        }
        put_varint(&mut comp_out, computation::ROOT_ID, new_root.unwrap_or(root));
        put_bytes(&mut out, hlo_module::COMPUTATIONS, &comp_out);
    }
    Ok(changed.then_some(out))
}

/// Names of the computations an `async-start` wraps (JAX's explicit async collectives,
/// `all_to_all_start` and the like, reach XLA:GPU so). Such a computation must hold only its
/// root and parameters: a collective there becomes a call in place ([`Form::InAsync`]).
pub(super) fn async_computations(module: &[u8]) -> Result<BTreeSet<String>, PassError> {
    let mut names: HashMap<i64, String> = HashMap::new();
    let mut wrapped: BTreeSet<i64> = BTreeSet::new();
    for c in fields(module)?.iter().filter(|c| c.number == hlo_module::COMPUTATIONS) {
        let Some(comp) = c.message() else { continue };
        let cf = fields(comp)?;
        if let Some(n) = cf.iter().find(|x| x.number == computation::NAME) {
            names
                .insert(first_int(&cf, computation::ID)?.unwrap_or(0), String::from_utf8_lossy(n.payload).into_owned());
        }
        for i in cf.iter().filter(|x| x.number == computation::INSTRUCTIONS).filter_map(|x| x.message()) {
            let fs = fields(i)?;
            if matches!(payload(&fs, instruction::OPCODE), b"async-start" | b"async-update" | b"async-done") {
                for x in fs.iter().filter(|x| x.number == instruction::CALLED_COMPUTATION_IDS) {
                    wrapped.extend(ints(x)?);
                }
            }
        }
    }
    Ok(wrapped.iter().filter_map(|id| names.get(id).cloned()).collect())
}
