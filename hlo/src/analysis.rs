//! Analyses over the IR shared by the emitter and the tools: which reduction a collective's `to_apply` computes, and
//! which devices each collective groups together (XLA's `CollectiveOpGroupMode` rules).
//!
//! Device ids here are *global* ids: `replica * num_partitions + partition`, which is XLA's flattened id. Peerless runs
//! either one partition (replica mode) or one replica (partition mode), so the flattened id is also the device's index.

use std::fmt;

use crate::ir::{CompId, InstrId, Instruction, Module};
use crate::opcode::Opcode;
use crate::print::group_list;
use crate::types::Shape;

named_enum! {
    /// A reduction a collective kernel can compute, recognised from a `to_apply` computation by [`recognize_reduction`].
    /// `ALL` is in the kernels' order.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum ReductionKind {
        Sum => "sum",
        Prod => "prod",
        Min => "min",
        Max => "max",
        And => "and",
        Or => "or",
    }
}

impl ReductionKind {
    /// The binary opcode the reduction applies.
    pub fn opcode(self) -> Opcode {
        match self {
            Self::Sum => Opcode::Add,
            Self::Prod => Opcode::Multiply,
            Self::Min => Opcode::Minimum,
            Self::Max => Opcode::Maximum,
            Self::And => Opcode::And,
            Self::Or => Opcode::Or,
        }
    }

    /// The reduction applied by `op`, if `op` is one of the six.
    pub fn from_opcode(op: Opcode) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.opcode() == op)
    }
}

impl fmt::Display for ReductionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Recognises a reduction computation: two scalar parameters of one type whose root is `add`, `multiply`, `minimum`,
/// `maximum`, `and` or `or` of exactly those, in either order. By opcode only (an `add` on `pred` is
/// [`ReductionKind::Sum`]); anything else, a missing computation included, is `None`.
pub fn recognize_reduction(module: &Module, comp: CompId) -> Option<ReductionKind> {
    let comp = module.comps.get(comp)?;
    let [p0, p1] = comp.params[..] else { return None };
    let root = module.instrs.get(comp.root)?;
    let kind = ReductionKind::from_opcode(root.opcode)?;
    let [a, b] = root.operands[..] else { return None };
    if !((a == p0 && b == p1) || (a == p1 && b == p0)) || p0 == p1 {
        return None;
    }
    let scalar = |id: InstrId| match &module.instrs.get(id)?.shape {
        Shape::Array(s) if s.rank() == 0 => Some(s.ty),
        _ => None,
    };
    let ty = scalar(p0)?;
    if scalar(p1)? != ty || scalar(comp.root)? != ty {
        return None;
    }
    if matches!(kind, ReductionKind::And | ReductionKind::Or) && !(ty == crate::PrimitiveType::Pred || ty.is_integral())
    {
        return None;
    }
    Some(kind)
}

/// How a collective's replica groups name devices (XLA's `CollectiveOpGroupMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupMode {
    /// Groups name replica ids; each group is formed once per partition.
    CrossReplica,
    /// Groups name partition ids; each group is formed once per replica.
    CrossPartition,
    /// Groups name replica ids; a group holds those replicas' devices in every partition.
    CrossReplicaAndPartition,
    /// Groups name flattened device ids (`replica * num_partitions + partition`).
    FlattenedId,
}

impl fmt::Display for GroupMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CrossReplica => "cross-replica",
            Self::CrossPartition => "cross-partition",
            Self::CrossReplicaAndPartition => "cross-replica-and-partition",
            Self::FlattenedId => "flattened-id",
        })
    }
}

/// Whether an opcode carries `use_global_device_ids` (XLA's all-reduce family and all-gather). For the others XLA
/// passes "absent", which changes the channel rule.
fn has_global_device_ids_attr(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::AllReduce | Opcode::AllReduceStart | Opcode::ReduceScatter | Opcode::AllGather | Opcode::AllGatherStart
    )
}

/// XLA's `GetCollectiveOpGroupMode(has_channel_id, use_global_device_ids)`:
///
/// | channel_id | use_global_device_ids          | mode                          |
/// |------------|--------------------------------|-------------------------------|
/// | absent     | false / not an attribute       | `CrossReplica`                |
/// | present    | not an attribute of the op     | `CrossPartition`              |
/// | present    | false                          | `CrossReplicaAndPartition`    |
/// | present    | true                           | `FlattenedId`                 |
///
/// Only all-reduce, reduce-scatter and all-gather (and their starts) have `use_global_device_ids`, so a channel id
/// makes the others `CrossPartition`. The attribute without a channel id is invalid in XLA: `CrossReplica` here, and
/// [`device_groups`] rejects it.
pub fn group_mode(instr: &Instruction) -> GroupMode {
    let has_channel = instr.attrs.channel_id.is_some();
    match (has_channel, has_global_device_ids_attr(instr.opcode)) {
        (false, _) => GroupMode::CrossReplica,
        (true, false) => GroupMode::CrossPartition,
        (true, true) if instr.attrs.use_global_device_ids => GroupMode::FlattenedId,
        (true, true) => GroupMode::CrossReplicaAndPartition,
    }
}

/// Most devices [`device_groups`] will enumerate (bounds allocation on odd input).
pub const MAX_DEVICES: usize = 1 << 16;

/// How device ids map onto a module's replicas and partitions when it runs on N devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceMode {
    /// `num_replicas = N`, one partition.
    Replica,
    /// `num_partitions = N`, one replica.
    Partition,
}

/// Checks `num_replicas × num_partitions` and returns the device count.
fn device_count(what: &str, num_replicas: usize, num_partitions: usize) -> Result<usize, String> {
    match num_replicas.checked_mul(num_partitions) {
        Some(n) if n > 0 && n <= MAX_DEVICES => Ok(n),
        _ => Err(format!(
            "{what}: {num_replicas} replicas × {num_partitions} partitions is not a usable device count (1..={MAX_DEVICES})"
        )),
    }
}

fn describe(instr: &Instruction) -> String {
    format!("{} '{}'", instr.opcode, instr.name)
}

/// The groups of global device ids (`replica * num_partitions + partition`) a collective runs over, in XLA's order
/// (`GetParticipatingDevicesGroups`): iota forms expanded, empty groups meaning all replicas (or partitions in
/// `CrossPartition` mode), every device in exactly one group. A collective-permute's groups are the sets its pairs are
/// resolved within ([`permute_pairs`] gives the pairs). Errors name the instruction and its groups.
pub fn device_groups(
    module: &Module,
    instr: InstrId,
    num_replicas: usize,
    num_partitions: usize,
) -> Result<Vec<Vec<usize>>, String> {
    let ins = module.instrs.get(instr).ok_or_else(|| format!("no instruction {instr}"))?;
    let what = describe(ins);
    let n = device_count(&what, num_replicas, num_partitions)?;
    let mode = group_mode(ins);
    if ins.attrs.channel_id.is_none() && ins.attrs.use_global_device_ids {
        return Err(format!("{what}: use_global_device_ids=true needs a channel_id"));
    }
    let (nr, np) = (num_replicas, num_partitions);
    let is_permute = matches!(ins.opcode, Opcode::CollectivePermute | Opcode::CollectivePermuteStart);
    let logical: Vec<Vec<i64>> = if is_permute {
        Vec::new()
    } else {
        match &ins.attrs.replica_groups {
            None => Vec::new(),
            Some(rg) => rg.groups().ok_or_else(|| format!("{what}: inconsistent iota replica groups {rg}"))?,
        }
    };
    let shown = || ins.attrs.replica_groups.as_ref().map_or_else(|| "{}".to_owned(), ToString::to_string);
    // The id space the groups name, for range checks and "empty means all".
    let id_limit = match mode {
        GroupMode::CrossPartition => np,
        GroupMode::FlattenedId => n,
        GroupMode::CrossReplica | GroupMode::CrossReplicaAndPartition => nr,
    };
    let logical: Vec<Vec<usize>> = if logical.is_empty() {
        if mode == GroupMode::FlattenedId && !is_permute {
            return Err(format!("{what}: replica groups cannot be empty with use_global_device_ids=true"));
        }
        vec![(0..id_limit).collect()]
    } else {
        let checked = |id: i64| match usize::try_from(id) {
            Ok(u) if u < id_limit => Ok(u),
            _ => Err(format!(
                "{what}: id {id} in replica_groups={} is out of range for {mode} mode ({nr} replicas, {np} partitions)",
                shown()
            )),
        };
        logical.iter().map(|g| g.iter().map(|&id| checked(id)).collect()).collect::<Result<_, _>>()?
    };
    let dev = |r: usize, p: usize| r * np + p;
    let groups: Vec<Vec<usize>> = match mode {
        GroupMode::CrossReplica => {
            logical.iter().flat_map(|g| (0..np).map(move |p| g.iter().map(|&r| dev(r, p)).collect())).collect()
        }
        GroupMode::CrossPartition => {
            logical.iter().flat_map(|g| (0..nr).map(move |r| g.iter().map(|&p| dev(r, p)).collect())).collect()
        }
        GroupMode::CrossReplicaAndPartition => {
            logical.iter().map(|g| g.iter().flat_map(|&r| (0..np).map(move |p| dev(r, p))).collect()).collect()
        }
        GroupMode::FlattenedId => logical,
    };
    let mut seen = vec![false; n];
    for g in &groups {
        for &d in g {
            if std::mem::replace(&mut seen[d], true) {
                return Err(format!(
                    "{what}: device {d} appears in more than one group (replica_groups={}, {mode} mode, device groups {})",
                    shown(),
                    group_list(&groups)
                ));
            }
        }
    }
    if let Some(missing) = seen.iter().position(|&s| !s) {
        return Err(format!(
            "{what}: device {missing} is in no group (replica_groups={}, {mode} mode, {nr} replicas × {np} partitions, \
             device groups {})",
            shown(),
            group_list(&groups)
        ));
    }
    Ok(groups)
}

/// A collective-permute's source-target pairs as global device pairs, resolved within every group of [`device_groups`]
/// (pairs name replica ids in `CrossReplica` mode and partition ids in `CrossPartition` mode, as in XLA). Errors if an
/// id is out of range or a device is a source (or a target) twice.
pub fn permute_pairs(
    module: &Module,
    instr: InstrId,
    num_replicas: usize,
    num_partitions: usize,
) -> Result<Vec<(usize, usize)>, String> {
    let ins = module.instrs.get(instr).ok_or_else(|| format!("no instruction {instr}"))?;
    let what = describe(ins);
    if !matches!(ins.opcode, Opcode::CollectivePermute | Opcode::CollectivePermuteStart) {
        return Err(format!("{what}: not a collective-permute"));
    }
    let groups = device_groups(module, instr, num_replicas, num_partitions)?;
    let pairs = ins.attrs.source_target_pairs.as_deref().unwrap_or(&[]);
    let limit = groups.first().map_or(0, Vec::len);
    let mut logical = Vec::with_capacity(pairs.len());
    let (mut src_seen, mut dst_seen) = (vec![false; limit], vec![false; limit]);
    for &(s, t) in pairs {
        let (Ok(su), Ok(tu)) = (usize::try_from(s), usize::try_from(t)) else {
            return Err(format!("{what}: source_target_pairs entry {{{s},{t}}} has a negative id"));
        };
        if su >= limit || tu >= limit {
            return Err(format!(
                "{what}: source_target_pairs entry {{{s},{t}}} is out of range for groups of {limit} ({} mode)",
                group_mode(ins)
            ));
        }
        if std::mem::replace(&mut src_seen[su], true) || std::mem::replace(&mut dst_seen[tu], true) {
            return Err(format!("{what}: source_target_pairs names id {s} as a source or {t} as a target twice"));
        }
        logical.push((su, tu));
    }
    Ok(groups.iter().flat_map(|g| logical.iter().map(move |&(s, t)| (g[s], g[t]))).collect())
}
