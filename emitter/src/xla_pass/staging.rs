//! Shared staging: which calls may share one slot (the module's data and control order), and how much each slot stages
//! on the host and on a GPU.

use super::*;

/// Bytes of one host staging buffer a call of collective `id` stages ([`CustomCallConfig::host_staging_bytes`], the
/// rule `kernels::host::direct` lays out by).
pub(super) fn staged_bytes(module: &Module, id: InstrId) -> u64 {
    CustomCallConfig::host_staging_bytes(&operand_bytes(module, id)) as u64
}

/// The byte sizes of collective `id`'s operands.
fn operand_bytes(module: &Module, id: InstrId) -> Vec<usize> {
    module.instr(id).operands.iter().filter_map(|&o| module.instrs.get(o)).map(|o| o.shape.byte_size()).collect()
}

/// Staging `call` (the rewrite of `id`) needs on each GPU ([`CustomCallConfig::gpu_staging_bytes`]: results too, where
/// the host stages operands).
pub(super) fn gpu_staged_bytes(module: &Module, id: InstrId, call: &CustomCallConfig) -> u64 {
    let rets: Vec<usize> = module.instr(id).shape.leaves().iter().map(|l| l.byte_size()).collect();
    call.gpu_staging_bytes(&operand_bytes(module, id), &rets) as u64
}

/// Keeps the module's GPU staging within [`STAGING_SHARE_OF_FREE`] of the least free device memory (`free`): while it
/// exceeds that, the calls of the largest slot go back to XLA, each decision saying why, so a program that XLA alone
/// could run never fails allocating Peerless's staging. Calls whose groups span processes stay: every process must
/// rewrite the same collectives, and each would measure its own free memory.
pub(super) fn fit_staging(module: &Module, free: Option<u64>, calls: &mut Vec<Call>, decisions: &mut [PassDecision]) {
    let Some(free) = free else { return };
    let budget = free / STAGING_SHARE_OF_FREE;
    // Bytes per slot (a call without one: its own staging).
    let mut slots: BTreeMap<u64, u64> = BTreeMap::new();
    for Call { id, config: c, .. } in calls.iter() {
        let (key, bytes) = match c.slot {
            Some(s) => (s, c.slot_gpu_bytes),
            None => (c.instance, gpu_staged_bytes(module, *id, c)),
        };
        let e = slots.entry(key).or_insert(0);
        *e = (*e).max(bytes);
    }
    let wanted: u64 = slots.values().sum();
    if wanted <= budget {
        return;
    }
    let mut total = wanted;
    let crossing: BTreeSet<u64> =
        calls.iter().map(|c| &c.config).filter(|c| c.spans_processes()).map(|c| c.slot.unwrap_or(c.instance)).collect();
    let mut order: Vec<(u64, u64)> = slots.into_iter().filter(|(k, _)| !crossing.contains(k)).collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut dropped = BTreeSet::new();
    for (k, b) in order {
        if total <= budget {
            break;
        }
        dropped.insert(k);
        total -= b;
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    calls.retain(|Call { at, config: c, .. }| {
        let key = c.slot.unwrap_or(c.instance);
        if !dropped.contains(&key) {
            return true;
        }
        let d = &mut decisions[*at];
        d.back_to_xla(&format!(
            "staging budget: the module's GPU staging would be {:.1} MiB, more than 1/{STAGING_SHARE_OF_FREE} of the \
             {:.1} MiB free on the fullest GPU; its largest slots stay XLA's",
            mib(wanted),
            mib(free)
        ));
        log::warn!("peerless pass: {} left to XLA: {}", d.instr, d.reason);
        false
    });
}

/// On a platform that may run a device's data-independent calls at once (XLA:CPU), a call that waits for its peers on a
/// pool thread beside an unordered collective can deadlock: device A waits in one while device B, its threads all
/// waiting in the other, never reaches the first. XLA orders its own collectives (one communicator resource) and the
/// rewrite chains Peerless's calls of a computation (`rewrite`'s `chain`); nothing orders a call with anything else
/// that blocks. So a call stays a kernel only if, by data dependencies, it is ordered with every collective of its
/// computation that stays XLA's and every loop, call or conditional there that runs a collective, and, where it lies in
/// such a computation, that instruction is ordered likewise with everything in its caller that blocks (collectives,
/// Peerless's included, and other such instructions), up to the entry. Calls sent back are XLA's from then on, so the
/// check repeats until nothing changes; each decision names what the call could run beside. Every process of a job
/// decides alike (the same module).
pub(super) fn keep_ordered(deps: &Deps, index: &Index<'_>, calls: &mut Vec<Call>, decisions: &mut [PassDecision]) {
    let ordered = |a: InstrId, b: InstrId| deps.precedes(a, b) || deps.precedes(b, a);
    // How decisions name a collective, or a unit (`computation/id`).
    let label = |x: InstrId| {
        let ins = &index.instrs[x];
        match deps.units.contains_key(&x) {
            true => format!("{}/{}", index.comps[ins.parent].name, ins.id),
            false => ins.name.to_string(),
        }
    };
    // Each computation's collectives and units (sorted by label: decisions name the first).
    let mut in_comp: HashMap<CompId, Vec<(String, InstrId)>> = HashMap::new();
    for (&x, &(c, _)) in &deps.ancestors {
        in_comp.entry(c).or_default().push((label(x), x));
    }
    in_comp.values_mut().for_each(|v| v.sort_unstable());
    // What blocks in computation `comp`: its units and its collectives that stay XLA's (`peerless`: those still
    // Peerless's too).
    let blockers = |comp: CompId, kernels: &BTreeSet<InstrId>, peerless: bool| -> Vec<InstrId> {
        let all = in_comp.get(&comp).into_iter().flatten().map(|&(_, x)| x);
        all.filter(|x| peerless || deps.units.contains_key(x) || !kernels.contains(x)).collect()
    };
    // The unit running computation `comp` (its one caller's instruction), if there is one.
    let unit_running = |comp: CompId| -> Option<InstrId> {
        let mut found = deps.units.iter().filter(|(_, runs)| runs.contains(&comp)).map(|(&u, _)| u);
        let one = found.next();
        if found.next().is_some() { None } else { one }
    };
    loop {
        let kernels: BTreeSet<InstrId> = calls.iter().map(|c| c.ix).collect();
        let beside = |x: InstrId| -> Option<String> {
            let &(comp, _) = deps.ancestors.get(&x)?;
            if let Some(o) = blockers(comp, &kernels, false).into_iter().find(|&o| o != x && !ordered(o, x)) {
                return Some(label(o));
            }
            // Up through the loops and branches that run it.
            let mut c = comp;
            for _ in 0..=deps.units.len() {
                if Some(c) == deps.entry {
                    return None;
                }
                let name = &index.comps[c].name;
                let Some(unit) = unit_running(c) else {
                    return Some(format!("another instruction that runs computation {name}"));
                };
                let Some(&(parent, _)) = deps.ancestors.get(&unit) else {
                    return Some(format!("the caller of computation {name}"));
                };
                if let Some(o) = blockers(parent, &kernels, true).into_iter().find(|&o| o != unit && !ordered(o, unit))
                {
                    return Some(format!("{} (beside {}, which runs it)", label(o), label(unit)));
                }
                c = parent;
            }
            None
        };
        let back: Vec<(usize, String)> = calls.iter().filter_map(|c| beside(c.ix).map(|o| (c.at, o))).collect();
        if back.is_empty() {
            return;
        }
        for (at, other) in &back {
            let d = &mut decisions[*at];
            d.back_to_xla(&format!(
                "XLA:CPU may run it at the same time as {other} (nothing orders them), and a device's threads could \
                 then wait in both: left to XLA, which orders its collectives"
            ));
            log::info!("peerless pass: {} left to XLA: {}", d.instr, d.reason);
        }
        calls.retain(|c| !back.iter().any(|(u, _)| *u == c.at));
    }
}

/// Data dependencies between a module's collectives, read from the whole module's index (the slim module the decisions
/// read keeps only collectives and their direct operands).
#[derive(Debug, Default)]
pub(super) struct Deps {
    /// Each collective asked for → its computation and its ancestors among them (bit `index[x]`; a collective is its
    /// own ancestor).
    pub(super) ancestors: HashMap<InstrId, (CompId, Vec<u64>)>,
    index: HashMap<InstrId, usize>,
    /// Computation → the computations of the instructions that call it, one per call.
    callers: HashMap<CompId, Vec<CompId>>,
    pub(super) entry: Option<CompId>,
    /// Control-flow units: an instruction that runs a computation holding a wanted collective (a loop, a call, a
    /// conditional), in `ancestors` too, by the computations it runs.
    pub(super) units: HashMap<InstrId, Vec<CompId>>,
}

impl Deps {
    /// Whether collective `a` is `b` or a data-dependency ancestor of it.
    pub(super) fn precedes(&self, a: InstrId, b: InstrId) -> bool {
        match (self.index.get(&a), self.ancestors.get(&b)) {
            (Some(&i), Some((_, bits))) => bits.get(i / 64).is_some_and(|w| w & (1u64 << (i % 64)) != 0),
            _ => false,
        }
    }

    /// Whether every computation from the entry down to `comp` has one caller: then each run of `comp` is ordered after
    /// the last by its caller (a loop's iterations, one call site), and its collectives never run twice at once on a
    /// device.
    pub(super) fn runs_alone(&self, comp: CompId) -> bool {
        let mut c = comp;
        for _ in 0..=self.callers.len() {
            if Some(c) == self.entry {
                return true;
            }
            match self.callers.get(&c).map(Vec::as_slice) {
                Some(&[one]) => c = one,
                _ => return false,
            }
        }
        false
    }
}

/// The [`Deps`] of the collectives `wanted` (index ids).
pub(super) fn dependencies(index: &Index<'_>, wanted: &[InstrId]) -> Deps {
    let mut deps = Deps {
        index: wanted.iter().enumerate().map(|(k, &x)| (x, k)).collect(),
        entry: index.entry,
        ..Deps::default()
    };
    let callees = |x: InstrId| index.instrs[x].called.iter().filter_map(|c| index.ids.comps.get(c).copied());
    for (x, ins) in index.instrs.iter() {
        for c in callees(x) {
            deps.callers.entry(c).or_default().push(ins.parent);
        }
    }
    // Computations holding a wanted collective, themselves or in a computation they run.
    let mut holds: BTreeSet<CompId> = wanted.iter().map(|&x| index.instrs[x].parent).collect();
    loop {
        let before = holds.len();
        for (x, ins) in index.instrs.iter() {
            if callees(x).any(|c| holds.contains(&c)) {
                holds.insert(ins.parent);
            }
        }
        if holds.len() == before {
            break;
        }
    }
    // Units get indices after the wanted collectives.
    for x in index.instrs.keys() {
        let runs: Vec<CompId> = callees(x).filter(|c| holds.contains(c)).collect();
        if !runs.is_empty() {
            deps.index.insert(x, wanted.len() + deps.units.len());
            deps.units.insert(x, runs);
        }
    }
    let words = (wanted.len() + deps.units.len()).div_ceil(64);
    for (cid, c) in index.comps.iter() {
        if !c.instrs.iter().any(|x| deps.index.contains_key(x)) {
            continue;
        }
        // Operands before users (a proto promises no order): depth first, without recursion (modules may be deep); an
        // instruction is entered once (a DAG: whatever was entered before is finished by the time a user needs it).
        let operands = |x: InstrId| index.instrs[x].operands.iter().filter_map(move |&o| index.ids.resolve(cid, o));
        let mut bits: HashMap<InstrId, Vec<u64>> = HashMap::with_capacity(c.instrs.len());
        let mut entered: std::collections::HashSet<InstrId> = std::collections::HashSet::with_capacity(c.instrs.len());
        for &root in &c.instrs {
            let mut stack = vec![(root, false)];
            while let Some((x, expanded)) = stack.pop() {
                if expanded {
                    let mut b = vec![0u64; words];
                    for o in operands(x) {
                        if let Some(ob) = bits.get(&o) {
                            b.iter_mut().zip(ob).for_each(|(x, y)| *x |= y);
                        }
                    }
                    if let Some(&k) = deps.index.get(&x) {
                        b[k / 64] |= 1u64 << (k % 64);
                        deps.ancestors.insert(x, (cid, b.clone()));
                    }
                    bits.insert(x, b);
                    continue;
                }
                if !entered.insert(x) {
                    continue;
                }
                stack.push((x, true));
                stack.extend(operands(x).filter(|o| !entered.contains(o)).map(|o| (o, false)));
            }
        }
    }
    deps
}

/// Shared staging: gives each rewritten collective in one process a staging `slot`, shared with the collectives every
/// device is sure to run before or after it, never at the same time.
///
/// The rule: two calls share a slot only if they lie in the same computation, that computation runs alone (every
/// computation from the entry down to it has one caller, so its collectives never run twice at once), they have the
/// same groups (a permute: the same pairs; a permute never shares with a grouped collective), and the slot's last call
/// is a data-dependency ancestor of the new one. All devices run the same SPMD program, and XLA:CPU's thunk executor
/// (like a stream) never runs a thunk before its operands' producers, so every device runs a slot's calls in one order,
/// one at a time: the sequence of launches the protocols handle for one collective. Calls XLA may run concurrently or
/// in another order on another device (data-independent ones) get different slots. Slots are opened greedily in a
/// topological order. Calls across processes share alike (one shared-memory segment per slot); their slot id, the first
/// call's `instance`, is then the same in every process, and every process assigns the same slots (the same module, a
/// deterministic walk). Every call keeps staging of its own where the module's dependencies cannot be read.
///
/// A slot's id is its first call's `instance` (unique per compile, like instances), its `slot_bytes` the largest host
/// staging buffer among its calls and its `slot_gpu_bytes` the largest GPU staging (both platforms' sizes travel: the
/// pass does not know which runs it).
pub(super) fn assign_slots(module: &Module, deps: &Deps, calls: &mut [Call]) {
    // Calls by computation.
    let mut by_comp: BTreeMap<CompId, Vec<usize>> = BTreeMap::new();
    for (k, c) in calls.iter().enumerate() {
        if let Some(&(comp, _)) = deps.ancestors.get(&c.ix) {
            by_comp.entry(comp).or_default().push(k);
        }
    }
    for (comp, mut ks) in by_comp {
        if !deps.runs_alone(comp) {
            // Each call keeps staging of its own (`slot` none).
            continue;
        }
        // A topological order: an ancestor has fewer ancestors than its descendants.
        let count = |k: usize| deps.ancestors[&calls[k].ix].1.iter().map(|w| w.count_ones()).sum::<u32>();
        ks.sort_by_key(|&k| count(k));
        // Open slots by group set: (its last call, its first call). A call on an async queue may run beside one on the
        // compute stream: the queue is part of the key, so only calls of one stream share.
        type Key = (u64, bool, Vec<Vec<usize>>, Vec<(usize, usize)>);
        let mut open: HashMap<Key, Vec<(usize, usize)>> = HashMap::new();
        let mut first_of: HashMap<usize, usize> = HashMap::new();
        for &k in &ks {
            let call = &calls[k].config;
            let key: Key = (
                super::queue_of(call),
                call.kind == CollectiveKind::CollectivePermute,
                call.groups.clone(),
                call.pairs.clone(),
            );
            let slots = open.entry(key).or_default();
            let reuse = slots.iter_mut().find(|(last, _)| deps.precedes(calls[*last].ix, calls[k].ix));
            let first = match reuse {
                Some(s) => {
                    s.0 = k;
                    s.1
                }
                None => {
                    slots.push((k, k));
                    k
                }
            };
            first_of.insert(k, first);
        }
        // Each slot's id and size (the largest buffer among its calls).
        let mut size: HashMap<usize, (u64, u64)> = HashMap::new();
        for &k in &ks {
            let e = size.entry(first_of[&k]).or_insert((0, 0));
            e.0 = e.0.max(staged_bytes(module, calls[k].id));
            e.1 = e.1.max(gpu_staged_bytes(module, calls[k].id, &calls[k].config));
        }
        for &k in &ks {
            let first = first_of[&k];
            let id = calls[first].config.instance;
            calls[k].config.slot = Some(id);
            (calls[k].config.slot_bytes, calls[k].config.slot_gpu_bytes) = size[&first];
        }
    }
}
