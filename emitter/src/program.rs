//! Per-device thunk programs: a verified module, its collectives' decisions and a
//! [`BufferAssignment`] become one [`ThunkProgram`] per device.
//!
//! Calls are inlined first ([`inline_calls`]): a collective inside a called computation
//! (JAX's shard_map bodies are `call`s) must run as a collective thunk, and inlining
//! every call keeps one rule for all of them. After inlining, only the entry
//! computation is assigned; computations that are not inlined (`to_apply` of reduce,
//! all-reduce, ...) are evaluated inside the one thunk that uses them.
//!
//! A `while` whose body or condition has a collective is unrolled the same way when its
//! trip count is a compile-time constant ([`trip_count`]: the counted loops `fori_loop` and
//! `scan` lower to), since every device's program must run its collectives in one order;
//! other loops stay one instruction and run on the host, one device at a time.
//!
//! Thunks follow the entry's program order. A non-collective instruction that needs
//! bytes of its own is a [`Thunk::Compute`] (or [`Thunk::Copy`] for `copy` and the first
//! half of `copy-start`); aliasing instructions emit nothing; a synchronous collective
//! or a `-start` is a [`Thunk::Collective`]; a collective `-done` is a
//! [`Thunk::CollectiveDone`] naming its start's thunk index. Every device's program has
//! the same thunks and offsets (SPMD); only `device` differs.

use std::collections::{HashMap, HashSet};

use hlo::analysis::DeviceMode;
use hlo::{Computation, InstrId, Module, Opcode};
use thunks::{CollectiveConfig, Implementation, Region, ScratchSizer, Thunk, ThunkProgram};

use crate::EmitError;
use crate::buffers::{BufferAssignment, Role, ValueInfo, assign_buffers, element_range, role};
use crate::decide::{PlannedCollective, decide};
use crate::flags::Flags;
use crate::peers::PeerAccessTable;

/// Deepest nesting of calls [`inline_calls`] follows.
pub const MAX_INLINE_DEPTH: usize = 64;
/// Most instructions an inlined entry computation may have.
pub const MAX_INLINED_INSTRS: usize = 1 << 20;
/// Most iterations of a loop [`inline_calls`] unrolls.
pub const MAX_UNROLLED_TRIPS: i64 = 1 << 16;

/// The integer value of a scalar integer constant.
fn int_constant(m: &Module, id: InstrId) -> Option<i64> {
    let ins = m.instrs.get(id).filter(|i| i.opcode == Opcode::Constant)?;
    let a = ins.attrs.literal.as_ref()?.as_array().filter(|a| a.shape.rank() == 0)?;
    let b = a.data.as_slice();
    use hlo::PrimitiveType as T;
    Some(match a.shape.ty {
        T::S8 => i8::from_le_bytes(b.try_into().ok()?) as i64,
        T::S16 => i16::from_le_bytes(b.try_into().ok()?) as i64,
        T::S32 => i32::from_le_bytes(b.try_into().ok()?) as i64,
        T::S64 => i64::from_le_bytes(b.try_into().ok()?),
        T::U8 => u8::from_le_bytes(b.try_into().ok()?) as i64,
        T::U16 => u16::from_le_bytes(b.try_into().ok()?) as i64,
        T::U32 => u32::from_le_bytes(b.try_into().ok()?) as i64,
        T::U64 => i64::try_from(u64::from_le_bytes(b.try_into().ok()?)).ok()?,
        _ => return None,
    })
}

/// The trip count of `while` instruction `id` of `m` when the loop counts: its state is a
/// tuple whose element `i` starts at a constant (`init` is a `tuple` with a constant there),
/// the body adds a positive constant to it and leaves every other element it reads for the
/// bound alone, and the condition compares it (`<`, `<=`, or the same reversed) with a
/// constant or with a state element that starts constant and the body passes through.
/// `None` for any other loop: its trip count is not known until it runs.
pub fn trip_count(m: &Module, id: InstrId) -> Option<i64> {
    use hlo::ComparisonDirection as D;
    let w = m.instrs.get(id).filter(|w| w.opcode == Opcode::While)?;
    let (&[cond, body], &[init]) = (w.called.as_slice(), w.operands.as_slice()) else { return None };
    let (cond, body) = (m.comps.get(cond)?, m.comps.get(body)?);
    let init = m.instrs.get(init).filter(|i| i.opcode == Opcode::Tuple)?;
    let (&[cp], &[bp]) = (cond.params.as_slice(), body.params.as_slice()) else { return None };
    let body_root = m.instrs.get(body.root).filter(|r| r.opcode == Opcode::Tuple)?;
    // Element `k` of the state, read in `comp` (whose parameter is `p`).
    let element = |x: InstrId, p: InstrId| -> Option<usize> {
        let g = m.instrs.get(x).filter(|g| g.opcode == Opcode::GetTupleElement && g.operands == [p])?;
        usize::try_from(g.attrs.tuple_index?).ok()
    };
    // A value the condition compares with: a constant, or a loop-invariant state element.
    let bound = |x: InstrId| -> Option<i64> {
        if let Some(v) = int_constant(m, x) {
            return Some(v);
        }
        let k = element(x, cp)?;
        (element(*body_root.operands.get(k)?, bp)? == k).then_some(())?;
        int_constant(m, *init.operands.get(k)?)
    };
    let cmp = m.instrs.get(cond.root).filter(|c| c.opcode == Opcode::Compare)?;
    let (&[l, r], dir) = (cmp.operands.as_slice(), cmp.attrs.comparison_direction?) else { return None };
    let (i, limit, inclusive) = match dir {
        D::Lt | D::Le => (element(l, cp)?, bound(r)?, dir == D::Le),
        D::Gt | D::Ge => (element(r, cp)?, bound(l)?, dir == D::Ge),
        _ => return None,
    };
    let start = int_constant(m, *init.operands.get(i)?)?;
    let next = m.instrs.get(*body_root.operands.get(i)?).filter(|a| a.opcode == Opcode::Add)?;
    let step = match *next.operands.as_slice() {
        [a, b] if element(a, bp) == Some(i) => int_constant(m, b)?,
        [a, b] if element(b, bp) == Some(i) => int_constant(m, a)?,
        _ => return None,
    };
    if step <= 0 {
        return None;
    }
    let span = limit.checked_sub(start)?.checked_add(i64::from(inclusive))?;
    Some(if span <= 0 { 0 } else { span.checked_add(step - 1)? / step })
}

fn program_err(instr: &str, message: impl Into<String>) -> EmitError {
    EmitError::Program { instr: instr.to_owned(), message: message.into() }
}

struct Inliner<'a> {
    src: &'a Module,
    out: Module,
    names: HashSet<String>,
    body: Vec<InstrId>,
}

impl Inliner<'_> {
    fn unique(&mut self, name: &str) -> String {
        if self.names.insert(name.to_owned()) {
            return name.to_owned();
        }
        let mut k = 1usize;
        loop {
            let candidate = format!("{name}.{k}");
            if self.names.insert(candidate.clone()) {
                return candidate;
            }
            k += 1;
        }
    }

    /// Appends computation `comp`'s instructions to the new entry with parameters bound
    /// to `args`; returns the id its root maps to. `top` keeps the entry's own ids.
    fn inline(&mut self, comp: &Computation, args: &[InstrId], depth: usize, top: bool) -> Result<InstrId, EmitError> {
        if depth > MAX_INLINE_DEPTH {
            return Err(program_err(&comp.name, format!("calls nested deeper than {MAX_INLINE_DEPTH}")));
        }
        let mut map: HashMap<InstrId, InstrId> = HashMap::new();
        for (i, &p) in comp.params.iter().enumerate() {
            if let Some(&a) = args.get(i) {
                map.insert(p, a);
            }
        }
        for &id in &comp.instrs {
            let ins = self.src.instrs.get(id).ok_or_else(|| program_err(&comp.name, format!("no instruction {id}")))?;
            if map.contains_key(&id) {
                continue; // a bound parameter
            }
            if !top && ins.opcode == Opcode::Parameter {
                return Err(program_err(&ins.name, format!("{} is called with too few arguments", comp.name)));
            }
            let remap = |o: &InstrId| -> Result<InstrId, EmitError> {
                if top && !map.contains_key(o) {
                    return Ok(*o);
                }
                map.get(o)
                    .copied()
                    .ok_or_else(|| program_err(&ins.name, format!("operand {o} is not defined before use")))
            };
            let operands = ins.operands.iter().map(remap).collect::<Result<Vec<_>, _>>()?;
            if ins.opcode == Opcode::While && ins.called.iter().any(|&c| self.src.calls_collective(c)) {
                // Unrolled: the body inlined once per iteration, each on the state before it.
                // The trip count is read off the source module, where `init` is the operand
                // as written (a tuple of constants and values).
                if let Some(trips) = trip_count(self.src, id).filter(|&t| t <= MAX_UNROLLED_TRIPS) {
                    let body = ins.called.get(1).and_then(|&c| self.src.comps.get(c));
                    let body = body.ok_or_else(|| program_err(&ins.name, "while without a body"))?;
                    let mut state = operands[0];
                    for _ in 0..trips {
                        state = self.inline(body, &[state], depth + 1, false)?;
                    }
                    map.insert(id, state);
                    continue;
                }
            }
            if ins.opcode == Opcode::Call {
                let callee = ins
                    .called
                    .first()
                    .and_then(|&c| self.src.comps.get(c))
                    .ok_or_else(|| program_err(&ins.name, "call without a computation"))?;
                let root = self.inline(callee, &operands, depth + 1, false)?;
                map.insert(id, root);
                continue;
            }
            if self.body.len() >= MAX_INLINED_INSTRS {
                return Err(program_err(
                    &ins.name,
                    format!("more than {MAX_INLINED_INSTRS} instructions after inlining"),
                ));
            }
            let mut new = ins.clone();
            new.operands = operands;
            new.attrs.control_predecessors =
                ins.attrs.control_predecessors.iter().filter_map(|p| map.get(p).copied()).collect();
            new.parent = self.src.entry;
            if top {
                // The entry's own instructions keep their ids and names.
                self.out.instrs[id] = new;
                map.insert(id, id);
                self.body.push(id);
            } else {
                new.name = self.unique(&ins.name);
                let nid = self.out.instrs.push(new);
                map.insert(id, nid);
                self.body.push(nid);
            }
        }
        map.get(&comp.root).copied().ok_or_else(|| program_err(&comp.name, "root is not defined"))
    }
}

/// Inlines every `call` reachable from the entry computation, recursively, and unrolls
/// every counted `while` there whose computations have a collective. The entry's
/// own instructions keep their ids and names; inlined ones get new ids, and their
/// names get a `.N` suffix where they would clash. Other computations are unchanged.
pub fn inline_calls(module: &Module) -> Result<Module, EmitError> {
    let entry = module.comps.get(module.entry).ok_or_else(|| program_err(&module.name, "no entry computation"))?;
    let has_call = entry.instrs.iter().any(|&i| {
        module.instrs.get(i).is_some_and(|x| {
            x.opcode == Opcode::Call
                || (x.opcode == Opcode::While && x.called.iter().any(|&c| module.calls_collective(c)))
        })
    });
    if !has_call {
        return Ok(module.clone());
    }
    let names = entry.instrs.iter().filter_map(|&i| module.instrs.get(i)).map(|i| i.name.clone()).collect();
    let mut inl = Inliner { src: module, out: module.clone(), names, body: Vec::new() };
    let root = inl.inline(entry, &[], 0, true)?;
    let mut out = inl.out;
    let body = inl.body;
    if let Some(e) = out.comps.get_mut(module.entry) {
        e.instrs = body;
        e.root = root;
    }
    Ok(out)
}

/// Every collective of the entry computation with its config and decision, in program
/// order (after [`inline_calls`], that is every collective that runs).
pub fn plan_entry(
    module: &Module,
    num_devices: usize,
    mode: DeviceMode,
    flags: &Flags,
    peers: &PeerAccessTable,
) -> Result<Vec<(PlannedCollective, CollectiveConfig)>, EmitError> {
    let (nr, np) = mode.counts(num_devices);
    let entry = module.comps.get(module.entry).ok_or_else(|| program_err(&module.name, "no entry computation"))?;
    let mut out = Vec::new();
    for &id in &entry.instrs {
        let Some(ins) = module.instrs.get(id) else { continue };
        if !ins.opcode.is_collective() {
            continue;
        }
        let (cfg, decision) = decide(module, id, nr, np, flags, peers)?;
        let planned = PlannedCollective {
            instr: ins.name.clone(),
            instr_id: id,
            op: cfg.op,
            dtype: cfg.element_type,
            bytes: cfg.bytes_per_device,
            groups: cfg.groups.clone(),
            decision,
        };
        log::info!("collective {planned}");
        out.push((planned, cfg));
    }
    Ok(out)
}

/// The emitter's output for one module and device set.
#[derive(Clone, Debug)]
pub struct Programs {
    /// Every collective that runs, with its decision.
    pub planned: Vec<PlannedCollective>,
    pub buffers: BufferAssignment,
    /// One program per device.
    pub programs: Vec<ThunkProgram>,
}

impl std::fmt::Display for Programs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for p in &self.programs {
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// Builds one thunk program per device for `module`, whose calls must already be
/// inlined ([`inline_calls`]). `info` gives per-device value shapes (the backend's
/// evaluator knows shard shapes); `sizer` the backend's scratch and signal sizes.
pub fn build_programs(
    module: &Module,
    num_devices: usize,
    mode: DeviceMode,
    flags: &Flags,
    peers: &PeerAccessTable,
    info: &dyn ValueInfo,
    sizer: &dyn ScratchSizer,
) -> Result<Programs, EmitError> {
    if num_devices == 0 {
        return Err(program_err(&module.name, "no devices"));
    }
    let planned = plan_entry(module, num_devices, mode, flags, peers)?;
    let collectives: HashMap<InstrId, (CollectiveConfig, Implementation)> =
        planned.iter().map(|(p, cfg)| (p.instr_id, (cfg.clone(), p.decision.implementation))).collect();
    let buffers = assign_buffers(module, &collectives, info, sizer)?;
    let entry = module.comps.get(module.entry).ok_or_else(|| program_err(&module.name, "no entry computation"))?;
    let mut thunks: Vec<Thunk> = Vec::new();
    let mut start_thunk: HashMap<InstrId, usize> = HashMap::new();
    let leaves_of = |id: &InstrId| -> Result<&Vec<Region>, EmitError> {
        buffers.values.get(id).ok_or_else(|| program_err(&module.name, format!("no buffers for {id}")))
    };
    for &id in &entry.instrs {
        let Some(ins) = module.instrs.get(id) else { continue };
        let mut operand_leaves = Vec::new();
        for o in &ins.operands {
            operand_leaves.extend(leaves_of(o)?.iter().copied());
        }
        let own = leaves_of(&id)?;
        let name = ins.name.clone();
        match role(module, id, info) {
            Role::Parameter(_) | Role::Alias(_) | Role::Element(_) => {}
            Role::Done(_) => {
                if let Some(&start) = ins.operands.first().and_then(|o| start_thunk.get(o)) {
                    thunks.push(Thunk::CollectiveDone { name, start });
                }
            }
            Role::Compute => {
                if ins.opcode == Opcode::AfterAll {
                    continue;
                }
                let operand_shapes = ins.operands.iter().map(|&o| info.local_shape(module, o)).collect();
                thunks.push(Thunk::Compute {
                    instr: id,
                    name,
                    inputs: operand_leaves,
                    outputs: own.clone(),
                    operand_shapes,
                });
            }
            Role::Copy => {
                for (src, dst) in operand_leaves.iter().zip(own.iter()) {
                    if dst.len > 0 {
                        thunks.push(Thunk::Copy { name: name.clone(), src: src.offset, dst: dst.offset, len: dst.len });
                    }
                }
            }
            Role::CopyStart => {
                let range = element_range(&info.local_shape(module, id), 0)
                    .ok_or_else(|| program_err(&name, "copy-start result is not a tuple"))?;
                let dsts = own.get(range).ok_or_else(|| program_err(&name, "copy-start leaves"))?;
                for (src, dst) in operand_leaves.iter().zip(dsts) {
                    if dst.len > 0 {
                        thunks.push(Thunk::Copy { name: name.clone(), src: src.offset, dst: dst.offset, len: dst.len });
                    }
                }
            }
            r @ (Role::Collective | Role::StartTuple) => {
                let (config, implementation) = collectives
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| program_err(&name, format!("{} was not planned", ins.opcode)))?;
                let outputs = if r == Role::StartTuple {
                    let range = element_range(&info.local_shape(module, id), 1)
                        .ok_or_else(|| program_err(&name, "start result is not a tuple"))?;
                    own.get(range).ok_or_else(|| program_err(&name, "start result leaves"))?.to_vec()
                } else {
                    own.clone()
                };
                let scratch = buffers.scratch.get(&id).copied().unwrap_or_default();
                let signals = buffers.signals.get(&id).copied().unwrap_or_default();
                if config.op.is_async {
                    start_thunk.insert(id, thunks.len());
                }
                let operand_shapes = ins
                    .operands
                    .iter()
                    .flat_map(|&o| info.local_shape(module, o).leaves().into_iter().cloned().collect::<Vec<_>>())
                    .collect();
                thunks.push(Thunk::Collective {
                    instr: id,
                    name,
                    config,
                    implementation,
                    inputs: operand_leaves,
                    operand_shapes,
                    outputs,
                    scratch,
                    signals,
                });
            }
        }
    }
    let programs = (0..num_devices)
        .map(|device| ThunkProgram {
            device,
            thunks: thunks.clone(),
            arena_bytes: buffers.arena_bytes,
            params: buffers.params.clone(),
            results: buffers.results.clone(),
        })
        .collect();
    Ok(Programs { planned: planned.into_iter().map(|(p, _)| p).collect(), buffers, programs })
}

/// [`inline_calls`] then [`build_programs`] with declared shapes, the host peer table for
/// `flags.host_topology` and `sizer`: the programs `peerless check --thunks` prints for a
/// module whose values are not sharded by shard_map. (A backend passes its evaluator's
/// [`ValueInfo`] to [`build_programs`] instead.)
pub fn thunk_programs(
    module: &Module,
    num_devices: usize,
    mode: DeviceMode,
    flags: &Flags,
    sizer: &dyn ScratchSizer,
) -> Result<Programs, EmitError> {
    let flat = inline_calls(module)?;
    let peers = PeerAccessTable::for_host_topology(num_devices, &flags.host_topology);
    build_programs(&flat, num_devices, mode, flags, &peers, &crate::buffers::DeclaredShapes, sizer)
}
