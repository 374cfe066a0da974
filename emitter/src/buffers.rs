//! Buffer assignment: every array leaf of every entry-computation value gets a region
//! of one per-device arena, computed once and identical on every device (a symmetric
//! arena: a peer's copy of a value lives at the same offset in the peer's arena).
//!
//! - **Aliasing without copies** where XLA would not copy: `tuple`, `get-tuple-element`,
//!   `bitcast` / `reshape` (row-major, so the same bytes), `opt-barrier`,
//!   `add-dependency`, the shard_map marker custom calls, `copy-done` (element 0 of its
//!   `copy-start`), `all-reduce-done` (its start's result), `all-gather-done` /
//!   `collective-permute-done` (element 1 of the start's tuple). A `-start` tuple
//!   `(operand, result, contexts..)` aliases element 0 to the operand; element 1 is the
//!   result buffer; context elements alias one reserved zero region that is never
//!   written. An instruction whose backend transforms an operand on the way in (cuts a
//!   full value into this device's shard, [`ValueInfo::transforms_operands`]) never aliases.
//! - **Live ranges** over the entry's program order, inclusive at both ends, so a
//!   result never shares bytes with an operand of the same instruction (a kernel reads
//!   peers' operands while writing its result). Parameters are live from position 0
//!   (they are copied in before the first thunk); root leaves to the end.
//! - **Greedy first-fit** in order of definition, 64-byte aligned.
//! - **Scratch and signals** per collective, in a reserved area at the bottom of the
//!   arena that no other value or collective ever uses: signals keep counting across
//!   executions, and a kernel without an end barrier (the one-shot all-reduce) may leave
//!   while a peer still reads its staging in scratch, so scratch stays the collective's
//!   own for the lifetime of the arena (the host backend's ownership rule).

use std::collections::HashMap;

use hlo::{InstrId, Module, Opcode, Shape};
use thunks::{CollectiveConfig, Implementation, Region, ScratchSizer};

use crate::EmitError;

/// Alignment of every region.
pub const ALIGN: usize = 64;

/// Largest arena the assignment will lay out (1 TiB), so offsets never overflow.
pub const MAX_ARENA_BYTES: usize = 1 << 40;

/// Custom calls that only mark shard_map boundaries and pass their operands through.
pub const PASS_THROUGH_CUSTOM_CALLS: [&str; 6] = [
    "Sharding",
    "SPMDFullToShardShape",
    "SPMDShardToFullShape",
    "xla.sdy.GlobalToLocalShape",
    "xla.sdy.LocalToGlobalShape",
    "xla.sdy.FuncResultSharding",
];

/// What the backend's evaluator knows about values beyond the IR.
pub trait ValueInfo {
    /// The per-device shape of instruction `id`'s value (in partition mode, a shard of the
    /// declared shape where the value is sharded).
    fn local_shape(&self, module: &Module, id: InstrId) -> Shape {
        module.instr(id).shape.clone()
    }

    /// Whether the evaluator transforms one of `id`'s operands before use (cuts a full
    /// value into this device's shard); such an instruction is computed, never aliased.
    fn transforms_operands(&self, _id: InstrId) -> bool {
        false
    }
}

/// Declared shapes, no transforms: every value is the same shape on every device.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeclaredShapes;

impl ValueInfo for DeclaredShapes {}

/// What an allocation holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferKind {
    /// An entry parameter's leaf (copied in at execution time).
    Parameter,
    /// An instruction's result leaf.
    Value,
    /// A collective's scratch (reserved for it for the lifetime of the arena).
    Scratch,
    /// A collective's signal flags (never reused).
    Signals,
    /// The zero region that async-start context elements alias (never written).
    Zero,
}

/// One allocation of the arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffer {
    pub kind: BufferKind,
    /// The instruction that defines it.
    pub instr: InstrId,
    pub region: Region,
    /// First and last position (index into the entry's instructions, inclusive) at which
    /// it is live; `usize::MAX` as `last` means "to the end and across executions".
    pub first: usize,
    pub last: usize,
}

/// The result of buffer assignment, shared by every device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BufferAssignment {
    pub arena_bytes: usize,
    pub buffers: Vec<Buffer>,
    /// Every entry instruction's value: its array leaves, depth-first.
    pub values: HashMap<InstrId, Vec<Region>>,
    /// Scratch and signal regions per collective (`-start` or synchronous), each reserved
    /// for that collective alone.
    pub scratch: HashMap<InstrId, Region>,
    pub signals: HashMap<InstrId, Region>,
    /// Per entry parameter, its leaves.
    pub params: Vec<Vec<Region>>,
    /// The entry result's leaves.
    pub results: Vec<Region>,
}

/// How an instruction gets its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Entry parameter `number`.
    Parameter(usize),
    /// Leaves are the concatenation of the operands' leaves (operand `k` only, if given).
    Alias(Option<usize>),
    /// Leaves are those of tuple element `index` of operand 0.
    Element(usize),
    /// Fresh leaves, computed by the backend's evaluator.
    Compute,
    /// Fresh leaves, copied leaf by leaf from operand 0.
    Copy,
    /// `copy-start`: element 0 fresh (copied from the operand), element 1 the operand,
    /// the rest zero contexts.
    CopyStart,
    /// A synchronous collective or `all-reduce-start`: fresh result leaves.
    Collective,
    /// `all-gather-start` / `collective-permute-start`: element 0 the operands, element 1
    /// fresh results, the rest zero contexts.
    StartTuple,
    /// A `-done`: aliases its start (element `index` of it, or all of it).
    Done(Option<usize>),
}

fn leaf_count(s: &Shape) -> usize {
    s.leaves().len()
}

/// The role of entry instruction `id`.
pub(crate) fn role(module: &Module, id: InstrId, info: &dyn ValueInfo) -> Role {
    use Opcode as O;
    let ins = module.instr(id);
    let transforms = info.transforms_operands(id);
    let tuple_elems = |s: &Shape| s.tuple_elements().map_or(0, <[Shape]>::len);
    let same_bytes = || {
        let out = info.local_shape(module, id);
        match (ins.operands.first(), out.as_array()) {
            (Some(&o), Some(a)) => {
                info.local_shape(module, o).as_array().is_some_and(|b| b.byte_size() == a.byte_size() && b.ty == a.ty)
            }
            _ => false,
        }
    };
    let is_marker = ins.opcode == O::CustomCall
        && ins.attrs.custom_call_target.as_deref().is_some_and(|t| PASS_THROUGH_CUSTOM_CALLS.contains(&t));
    match ins.opcode {
        O::Parameter => Role::Parameter(ins.attrs.parameter_number.and_then(|p| usize::try_from(p).ok()).unwrap_or(0)),
        O::AllReduceDone if ins.operands.len() == 1 => Role::Done(None),
        O::AllGatherDone | O::CollectivePermuteDone if ins.operands.len() == 1 => Role::Done(Some(1)),
        O::AllGatherStart | O::CollectivePermuteStart if tuple_elems(&ins.shape) >= 2 => Role::StartTuple,
        op if op.is_collective() => Role::Collective,
        _ if transforms => Role::Compute,
        O::Tuple => Role::Alias(None),
        O::GetTupleElement => Role::Element(ins.attrs.tuple_index.and_then(|i| usize::try_from(i).ok()).unwrap_or(0)),
        O::Bitcast | O::Reshape if ins.operands.len() == 1 && same_bytes() => Role::Alias(None),
        O::OptimizationBarrier if ins.operands.len() == 1 => Role::Alias(None),
        O::AddDependency if !ins.operands.is_empty() => Role::Alias(Some(0)),
        O::CustomCall if is_marker && !ins.operands.is_empty() => {
            // Leaves must line up one to one with the operands' leaves.
            let have: usize = ins.operands.iter().map(|&o| leaf_count(&info.local_shape(module, o))).sum();
            if have == leaf_count(&info.local_shape(module, id)) { Role::Alias(None) } else { Role::Compute }
        }
        O::Copy if ins.operands.len() == 1 => Role::Copy,
        O::CopyStart if ins.operands.len() == 1 && tuple_elems(&ins.shape) >= 2 => Role::CopyStart,
        O::CopyDone if ins.operands.len() == 1 => Role::Done(Some(0)),
        _ => Role::Compute,
    }
}

/// Leaf range of tuple element `index` of a value of shape `shape`.
pub(crate) fn element_range(shape: &Shape, index: usize) -> Option<std::ops::Range<usize>> {
    let elems = shape.tuple_elements()?;
    let start: usize = elems.get(..index)?.iter().map(leaf_count).sum();
    Some(start..start + leaf_count(elems.get(index)?))
}

fn err(module: &Module, id: InstrId, message: String) -> EmitError {
    EmitError::Program { instr: module.instrs.get(id).map_or_else(|| id.to_string(), |i| i.name.clone()), message }
}

fn align(x: usize) -> Option<usize> {
    x.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

struct Alloc {
    kind: BufferKind,
    instr: InstrId,
    size: usize,
    first: usize,
    last: usize,
}

/// Assigns buffers for the entry computation of `module`. `collectives` gives each
/// collective's (synchronous or `-start`) config and implementation, for sizing its
/// scratch and signals with `sizer`.
pub fn assign_buffers(
    module: &Module,
    collectives: &HashMap<InstrId, (CollectiveConfig, Implementation)>,
    info: &dyn ValueInfo,
    sizer: &dyn ScratchSizer,
) -> Result<BufferAssignment, EmitError> {
    let entry = module.comps.get(module.entry).ok_or_else(|| EmitError::Program {
        instr: module.name.clone(),
        message: format!("module '{}' has no entry computation", module.name),
    })?;
    let order = &entry.instrs;
    let mut allocs: Vec<Alloc> = Vec::new();
    // Leaves of every value as allocation indices.
    let mut leaves: HashMap<InstrId, Vec<usize>> = HashMap::new();
    let mut scratch_of: HashMap<InstrId, usize> = HashMap::new();
    let mut signals_of: HashMap<InstrId, usize> = HashMap::new();
    let mut zero_size = 0usize;
    const ZERO: usize = usize::MAX;

    let fresh = |allocs: &mut Vec<Alloc>, kind, instr, shape: &Shape, first| -> Vec<usize> {
        shape
            .leaves()
            .iter()
            .map(|a| {
                allocs.push(Alloc { kind, instr, size: a.byte_size(), first, last: first });
                allocs.len() - 1
            })
            .collect()
    };
    let mut params: Vec<(usize, InstrId)> = Vec::new();
    for (p, &id) in order.iter().enumerate() {
        let ins = module.instrs.get(id).ok_or_else(|| err(module, id, format!("no instruction {id}")))?;
        let shape = info.local_shape(module, id);
        let want = leaf_count(&shape);
        let operand_leaves = |k: usize| -> Result<&Vec<usize>, EmitError> {
            let o = ins.operands.get(k).ok_or_else(|| err(module, id, format!("missing operand {k}")))?;
            leaves.get(o).ok_or_else(|| err(module, id, format!("operand {k} is not defined before use")))
        };
        let all_operands = |leaves: &HashMap<InstrId, Vec<usize>>| -> Result<Vec<usize>, EmitError> {
            let mut v = Vec::new();
            for (k, o) in ins.operands.iter().enumerate() {
                v.extend(
                    leaves.get(o).ok_or_else(|| err(module, id, format!("operand {k} is not defined before use")))?,
                );
            }
            Ok(v)
        };
        let mut mine: Vec<usize> = match role(module, id, info) {
            Role::Parameter(n) => {
                params.push((n, id));
                fresh(&mut allocs, BufferKind::Parameter, id, &shape, 0)
            }
            Role::Alias(None) => all_operands(&leaves)?,
            Role::Alias(Some(k)) => operand_leaves(k)?.clone(),
            Role::Element(i) | Role::Done(Some(i)) => {
                let o = *ins.operands.first().ok_or_else(|| err(module, id, "missing operand".into()))?;
                let range = element_range(&info.local_shape(module, o), i)
                    .ok_or_else(|| err(module, id, format!("operand has no tuple element {i}")))?;
                operand_leaves(0)?
                    .get(range)
                    .ok_or_else(|| err(module, id, format!("tuple element {i} out of range")))?
                    .to_vec()
            }
            Role::Done(None) => operand_leaves(0)?.clone(),
            Role::Compute | Role::Copy | Role::Collective => fresh(&mut allocs, BufferKind::Value, id, &shape, p),
            Role::CopyStart | Role::StartTuple => {
                let elems = shape.tuple_elements().unwrap_or(&[]);
                let operands = all_operands(&leaves)?;
                let e0 = elems.first().map_or(0, leaf_count);
                let mut v = if ins.opcode == Opcode::CopyStart {
                    let e1 = elems.get(1).map_or(0, leaf_count);
                    if e1 != operands.len() {
                        return Err(err(module, id, "copy-start element 1 does not match its operand".into()));
                    }
                    let mut v = fresh(&mut allocs, BufferKind::Value, id, elems.first().unwrap_or(&Shape::Token), p);
                    v.extend(operands);
                    v
                } else {
                    if e0 != operands.len() {
                        return Err(err(module, id, "start tuple element 0 does not match the operands".into()));
                    }
                    let mut v = operands;
                    v.extend(fresh(&mut allocs, BufferKind::Value, id, elems.get(1).unwrap_or(&Shape::Token), p));
                    v
                };
                for e in elems.iter().skip(2) {
                    for a in e.leaves() {
                        zero_size = zero_size.max(a.byte_size());
                        v.push(ZERO);
                    }
                }
                v
            }
        };
        if mine.len() != want {
            return Err(err(
                module,
                id,
                format!("{} has {} array leaves, its operands give {}", ins.opcode, want, mine.len()),
            ));
        }
        // Uses: every operand leaf lives at least until here.
        for o in &ins.operands {
            if let Some(ls) = leaves.get(o) {
                for &l in ls {
                    if let Some(a) = allocs.get_mut(l) {
                        a.last = a.last.max(p);
                    }
                }
            }
        }
        // Collective resources.
        if let Some((cfg, imp)) = collectives.get(&id) {
            allocs.push(Alloc {
                kind: BufferKind::Scratch,
                instr: id,
                size: sizer.scratch_bytes(cfg, *imp),
                first: 0,
                last: usize::MAX,
            });
            scratch_of.insert(id, allocs.len() - 1);
            allocs.push(Alloc {
                kind: BufferKind::Signals,
                instr: id,
                size: sizer.signal_bytes(cfg, *imp),
                first: 0,
                last: usize::MAX,
            });
            signals_of.insert(id, allocs.len() - 1);
        }
        mine.shrink_to_fit();
        leaves.insert(id, mine);
    }
    // Root leaves live to the end.
    let root = leaves.get(&entry.root).cloned().ok_or_else(|| err(module, entry.root, "root not defined".into()))?;
    for &l in &root {
        if let Some(a) = allocs.get_mut(l) {
            a.last = usize::MAX;
        }
    }

    // Layout: signals and scratch (reserved), then the zero region, then the reusable pool.
    let mut regions: Vec<Region> = vec![Region::EMPTY; allocs.len()];
    let overflow = || EmitError::Program {
        instr: module.name.clone(),
        message: format!("arena for '{}' exceeds {MAX_ARENA_BYTES} bytes", module.name),
    };
    let reserved = |k: BufferKind| matches!(k, BufferKind::Signals | BufferKind::Scratch);
    let mut top = 0usize;
    for (i, a) in allocs.iter().enumerate() {
        if reserved(a.kind) && a.size > 0 {
            regions[i] = Region::new(top, a.size);
            top = align(top.checked_add(a.size).ok_or_else(overflow)?).ok_or_else(overflow)?;
        }
    }
    let zero = Region::new(top, zero_size);
    top = align(top.checked_add(zero_size).ok_or_else(overflow)?).ok_or_else(overflow)?;
    let pool_base = top;
    // First-fit in order of definition (then larger first), against every placed
    // allocation whose live range intersects.
    let mut idx: Vec<usize> = (0..allocs.len()).filter(|&i| !reserved(allocs[i].kind) && allocs[i].size > 0).collect();
    idx.sort_by_key(|&i| (allocs[i].first, std::cmp::Reverse(allocs[i].size), i));
    let mut placed: Vec<usize> = Vec::new();
    let mut high = pool_base;
    for &i in &idx {
        let a = &allocs[i];
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| allocs[j].first <= a.last && a.first <= allocs[j].last)
            .map(|&j| (regions[j].offset, regions[j].offset + regions[j].len))
            .collect();
        busy.sort_unstable();
        let mut at = pool_base;
        for (s, e) in busy {
            if at.checked_add(a.size).ok_or_else(overflow)? <= s {
                break;
            }
            at = at.max(align(e).ok_or_else(overflow)?);
        }
        let end = at.checked_add(a.size).ok_or_else(overflow)?;
        if end > MAX_ARENA_BYTES {
            return Err(overflow());
        }
        high = high.max(end);
        regions[i] = Region::new(at, a.size);
        placed.push(i);
    }
    let arena_bytes = align(high).ok_or_else(overflow)?;

    let mut values: HashMap<InstrId, Vec<Region>> = HashMap::new();
    for (&id, ls) in &leaves {
        let shape = info.local_shape(module, id);
        let sizes: Vec<usize> = shape.leaves().iter().map(|a| a.byte_size()).collect();
        let rs: Vec<Region> = ls
            .iter()
            .zip(&sizes)
            .map(|(&l, &size)| if l == ZERO { Region::new(zero.offset, size) } else { regions[l] })
            .collect();
        values.insert(id, rs);
    }
    params.sort_by_key(|&(n, _)| n);
    let params: Vec<Vec<Region>> = params.iter().map(|(_, id)| values.get(id).cloned().unwrap_or_default()).collect();
    let results = values.get(&entry.root).cloned().unwrap_or_default();
    let mut buffers: Vec<Buffer> = allocs
        .iter()
        .zip(&regions)
        .map(|(a, r)| Buffer { kind: a.kind, instr: a.instr, region: *r, first: a.first, last: a.last })
        .collect();
    if zero_size > 0 {
        buffers.push(Buffer { kind: BufferKind::Zero, instr: entry.root, region: zero, first: 0, last: usize::MAX });
    }
    let scratch = scratch_of.into_iter().map(|(id, i)| (id, regions[i])).collect();
    let signals = signals_of.into_iter().map(|(id, i)| (id, regions[i])).collect();
    Ok(BufferAssignment { arena_bytes, buffers, values, scratch, signals, params, results })
}
