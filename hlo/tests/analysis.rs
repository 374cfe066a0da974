//! `hlo::analysis`: which reduction a collective computes and which devices it groups.

use hlo::analysis::*;
use hlo::ir::{Attrs, Computation, IotaReplicaGroups, ModuleConfig, ReplicaGroups};
use hlo::ir::{CompId, InstrId, Instruction, Module};
use hlo::opcode::Opcode;
use hlo::types::PrimitiveType;
use hlo::types::Shape;

/// A module with a reducer `r` (root `op` over params in the given order) and an
/// entry holding one collective `c` of opcode `coll` built by `attrs`.
struct Build {
    m: Module,
}

impl Build {
    fn new() -> Self {
        Build {
            m: Module {
                name: "m".into(),
                config: ModuleConfig::default(),
                comps: Default::default(),
                instrs: Default::default(),
                entry: CompId::from_u32(0),
                source_name: "t".into(),
            },
        }
    }

    /// Adds a computation whose instructions are `(name, opcode, shape, operand indices
    /// into this list, param number)`; the last one is the root.
    fn comp(&mut self, name: &str, body: &[(&str, Opcode, Shape, &[usize], Option<i64>)]) -> CompId {
        let cid = self.m.comps.next_key();
        let mut ids: Vec<InstrId> = Vec::new();
        let mut params = Vec::new();
        for (n, op, shape, ops, pnum) in body {
            let attrs = Attrs { parameter_number: *pnum, ..Attrs::default() };
            let id = self.m.instrs.push(Instruction {
                name: (*n).into(),
                opcode: *op,
                shape: shape.clone(),
                operands: ops.iter().map(|&i| ids[i]).collect(),
                called: vec![],
                attrs,
                parent: cid,
                span: None,
            });
            if pnum.is_some() {
                params.push(id);
            }
            ids.push(id);
        }
        let root = *ids.last().unwrap();
        self.m.comps.push(Computation { name: name.into(), instrs: ids, params, root, span: None })
    }
}

fn f32s() -> Shape {
    Shape::array(PrimitiveType::F32, vec![])
}

fn reducer(op: Opcode, ty: PrimitiveType, swap: bool) -> (Module, CompId) {
    let mut b = Build::new();
    let s = Shape::array(ty, vec![]);
    let ops: &[usize] = if swap { &[1, 0] } else { &[0, 1] };
    let c = b.comp(
        "r",
        &[
            ("x", Opcode::Parameter, s.clone(), &[], Some(0)),
            ("y", Opcode::Parameter, s.clone(), &[], Some(1)),
            ("z", op, s, ops, None),
        ],
    );
    (b.m, c)
}

#[test]
fn recognises_each_reduction_in_either_order() {
    for (op, kind, ty) in [
        (Opcode::Add, ReductionKind::Sum, PrimitiveType::F32),
        (Opcode::Multiply, ReductionKind::Prod, PrimitiveType::Bf16),
        (Opcode::Minimum, ReductionKind::Min, PrimitiveType::S32),
        (Opcode::Maximum, ReductionKind::Max, PrimitiveType::U8),
        (Opcode::And, ReductionKind::And, PrimitiveType::Pred),
        (Opcode::Or, ReductionKind::Or, PrimitiveType::Pred),
        (Opcode::Or, ReductionKind::Or, PrimitiveType::U32),
        (Opcode::Add, ReductionKind::Sum, PrimitiveType::Pred),
    ] {
        for swap in [false, true] {
            let (m, c) = reducer(op, ty, swap);
            assert_eq!(recognize_reduction(&m, c), Some(kind), "{op} {ty} swap={swap}");
        }
    }
}

#[test]
fn rejects_other_reductions() {
    for op in [Opcode::Subtract, Opcode::Divide, Opcode::Xor, Opcode::Power] {
        let (m, c) = reducer(op, PrimitiveType::F32, false);
        assert_eq!(recognize_reduction(&m, c), None, "{op}");
    }
    // `and` on floats is not a reduction a kernel computes.
    let (m, c) = reducer(Opcode::And, PrimitiveType::F32, false);
    assert_eq!(recognize_reduction(&m, c), None);
    // add(x, x): same parameter twice.
    let mut b = Build::new();
    let c = b.comp(
        "r",
        &[
            ("x", Opcode::Parameter, f32s(), &[], Some(0)),
            ("y", Opcode::Parameter, f32s(), &[], Some(1)),
            ("z", Opcode::Add, f32s(), &[0, 0], None),
        ],
    );
    assert_eq!(recognize_reduction(&b.m, c), None);
    // add(x, y) then negate: root is not the reduction.
    let mut b = Build::new();
    let c = b.comp(
        "r",
        &[
            ("x", Opcode::Parameter, f32s(), &[], Some(0)),
            ("y", Opcode::Parameter, f32s(), &[], Some(1)),
            ("z", Opcode::Add, f32s(), &[0, 1], None),
            ("n", Opcode::Negate, f32s(), &[2], None),
        ],
    );
    assert_eq!(recognize_reduction(&b.m, c), None);
    // Non-scalar parameters.
    let v = Shape::array(PrimitiveType::F32, vec![2]);
    let mut b = Build::new();
    let c = b.comp(
        "r",
        &[
            ("x", Opcode::Parameter, v.clone(), &[], Some(0)),
            ("y", Opcode::Parameter, v.clone(), &[], Some(1)),
            ("z", Opcode::Add, v, &[0, 1], None),
        ],
    );
    assert_eq!(recognize_reduction(&b.m, c), None);
    // A computation id that does not exist.
    assert_eq!(recognize_reduction(&b.m, CompId::from_u32(7)), None);
}

/// A module whose entry is `p = f32[4] parameter(0); c = <op>(p)` with `attrs`.
fn collective(op: Opcode, attrs: Attrs) -> (Module, InstrId) {
    let mut b = Build::new();
    let s = Shape::array(PrimitiveType::F32, vec![4]);
    let c = b.comp("e", &[("p", Opcode::Parameter, s.clone(), &[], Some(0)), ("c", op, s, &[0], None)]);
    let root = b.m.comps[c].root;
    b.m.instrs[root].attrs = attrs;
    b.m.entry = c;
    (b.m, root)
}

fn groups_attr(g: &[&[i64]]) -> Option<ReplicaGroups> {
    Some(ReplicaGroups::Explicit(g.iter().map(|x| x.to_vec()).collect()))
}

#[test]
fn group_mode_follows_xla() {
    let mk = |op, ch: Option<i64>, g: bool| {
        let (m, id) = collective(op, Attrs { channel_id: ch, use_global_device_ids: g, ..Attrs::default() });
        group_mode(m.instr(id))
    };
    assert_eq!(mk(Opcode::AllReduce, None, false), GroupMode::CrossReplica);
    assert_eq!(mk(Opcode::AllReduce, Some(1), false), GroupMode::CrossReplicaAndPartition);
    assert_eq!(mk(Opcode::AllReduce, Some(1), true), GroupMode::FlattenedId);
    assert_eq!(mk(Opcode::AllGatherStart, Some(1), true), GroupMode::FlattenedId);
    assert_eq!(mk(Opcode::ReduceScatter, Some(1), false), GroupMode::CrossReplicaAndPartition);
    assert_eq!(mk(Opcode::AllToAll, Some(1), false), GroupMode::CrossPartition);
    assert_eq!(mk(Opcode::AllToAll, None, false), GroupMode::CrossReplica);
    assert_eq!(mk(Opcode::CollectivePermute, Some(1), false), GroupMode::CrossPartition);
    assert_eq!(mk(Opcode::CollectivePermute, None, false), GroupMode::CrossReplica);
}

#[test]
fn cross_replica_groups_repeat_per_partition() {
    let attrs = Attrs { replica_groups: groups_attr(&[&[0, 1]]), ..Attrs::default() };
    let (m, id) = collective(Opcode::AllReduce, attrs);
    // 2 replicas × 2 partitions: device = r * 2 + p.
    assert_eq!(device_groups(&m, id, 2, 2).unwrap(), vec![vec![0, 2], vec![1, 3]]);
    // Empty groups mean all replicas.
    let (m, id) = collective(Opcode::AllReduce, Attrs::default());
    assert_eq!(device_groups(&m, id, 4, 1).unwrap(), vec![vec![0, 1, 2, 3]]);
    let (m, id) = collective(Opcode::AllReduce, Attrs { replica_groups: groups_attr(&[]), ..Attrs::default() });
    assert_eq!(device_groups(&m, id, 1, 3).unwrap(), vec![vec![0], vec![1], vec![2]]);
}

#[test]
fn cross_partition_groups_repeat_per_replica() {
    let attrs = Attrs { channel_id: Some(1), replica_groups: groups_attr(&[&[1, 0]]), ..Attrs::default() };
    let (m, id) = collective(Opcode::AllToAll, attrs);
    assert_eq!(device_groups(&m, id, 2, 2).unwrap(), vec![vec![1, 0], vec![3, 2]]);
    let (m, id) = collective(Opcode::AllToAll, Attrs { channel_id: Some(1), ..Attrs::default() });
    assert_eq!(device_groups(&m, id, 1, 4).unwrap(), vec![vec![0, 1, 2, 3]]);
}

#[test]
fn cross_replica_and_partition_takes_every_partition() {
    let attrs = Attrs { channel_id: Some(1), replica_groups: groups_attr(&[&[0], &[1]]), ..Attrs::default() };
    let (m, id) = collective(Opcode::AllReduce, attrs);
    assert_eq!(device_groups(&m, id, 2, 2).unwrap(), vec![vec![0, 1], vec![2, 3]]);
    // Partition mode (1 replica): the only group is every partition.
    let (m, id) = collective(Opcode::AllGather, Attrs { channel_id: Some(1), ..Attrs::default() });
    assert_eq!(device_groups(&m, id, 1, 4).unwrap(), vec![vec![0, 1, 2, 3]]);
}

#[test]
fn flattened_ids_explicit_iota_and_transposed_iota() {
    let flat = |rg| Attrs { channel_id: Some(1), use_global_device_ids: true, replica_groups: rg, ..Attrs::default() };
    let (m, id) = collective(Opcode::AllReduce, flat(groups_attr(&[&[0, 4], &[1, 5], &[2, 6], &[3, 7]])));
    assert_eq!(device_groups(&m, id, 1, 8).unwrap(), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    // [2,4]<=[8]: {0,1,2,3},{4,5,6,7}.
    let iota = |g, s, dims: &[i64], perm: &[i64]| {
        Some(ReplicaGroups::Iota(IotaReplicaGroups {
            num_groups: g,
            group_size: s,
            reshape_dims: dims.to_vec(),
            transpose_perm: perm.to_vec(),
        }))
    };
    let (m, id) = collective(Opcode::AllReduce, flat(iota(2, 4, &[8], &[])));
    assert_eq!(device_groups(&m, id, 1, 8).unwrap(), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    // [4,2]<=[2,4]T(1,0): {0,4},{1,5},{2,6},{3,7}.
    let (m, id) = collective(Opcode::AllReduce, flat(iota(4, 2, &[2, 4], &[1, 0])));
    assert_eq!(device_groups(&m, id, 1, 8).unwrap(), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    // Iota in cross-replica mode names replicas.
    let (m, id) =
        collective(Opcode::AllReduce, Attrs { replica_groups: iota(2, 2, &[2, 2], &[1, 0]), ..Attrs::default() });
    assert_eq!(device_groups(&m, id, 4, 1).unwrap(), vec![vec![0, 2], vec![1, 3]]);
    // Inconsistent iota.
    let (m, id) = collective(Opcode::AllReduce, flat(iota(3, 2, &[8], &[])));
    let e = device_groups(&m, id, 1, 8).unwrap_err();
    assert!(e.contains("all-reduce 'c'") && e.contains("iota"), "{e}");
}

#[test]
fn every_device_exactly_once() {
    let flat = |rg| Attrs { channel_id: Some(1), use_global_device_ids: true, replica_groups: rg, ..Attrs::default() };
    let (m, id) = collective(Opcode::AllReduce, flat(groups_attr(&[&[0, 1], &[1, 2]])));
    let e = device_groups(&m, id, 1, 4).unwrap_err();
    assert!(e.contains("'c'") && e.contains("device 1 appears in more than one group"), "{e}");
    assert!(e.contains("replica_groups={{0,1},{1,2}}"), "{e}");
    let (m, id) = collective(Opcode::AllReduce, flat(groups_attr(&[&[0, 1]])));
    let e = device_groups(&m, id, 1, 4).unwrap_err();
    assert!(e.contains("device 2 is in no group"), "{e}");
    let (m, id) = collective(Opcode::AllReduce, flat(groups_attr(&[&[0, 9]])));
    let e = device_groups(&m, id, 1, 4).unwrap_err();
    assert!(e.contains("id 9") && e.contains("out of range"), "{e}");
    let (m, id) = collective(Opcode::AllReduce, flat(None));
    assert!(device_groups(&m, id, 1, 4).unwrap_err().contains("cannot be empty"));
    let (m, id) = collective(Opcode::AllReduce, Attrs { use_global_device_ids: true, ..Attrs::default() });
    assert!(device_groups(&m, id, 4, 1).unwrap_err().contains("needs a channel_id"));
    let (m, id) = collective(Opcode::AllReduce, Attrs::default());
    assert!(device_groups(&m, id, usize::MAX, 2).is_err());
    assert!(device_groups(&m, id, 0, 2).is_err());
}

#[test]
fn permute_pairs_resolve_per_group() {
    let attrs = Attrs { channel_id: Some(1), source_target_pairs: Some(vec![(0, 1), (1, 0)]), ..Attrs::default() };
    let (m, id) = collective(Opcode::CollectivePermute, attrs);
    assert_eq!(device_groups(&m, id, 2, 2).unwrap(), vec![vec![0, 1], vec![2, 3]]);
    assert_eq!(permute_pairs(&m, id, 2, 2).unwrap(), vec![(0, 1), (1, 0), (2, 3), (3, 2)]);
    let attrs = Attrs { source_target_pairs: Some(vec![(0, 3)]), ..Attrs::default() };
    let (m, id) = collective(Opcode::CollectivePermuteStart, attrs);
    assert_eq!(permute_pairs(&m, id, 4, 1).unwrap(), vec![(0, 3)]);
    assert!(permute_pairs(&m, id, 2, 1).unwrap_err().contains("out of range"));
    let attrs = Attrs { source_target_pairs: Some(vec![(0, 1), (0, 2)]), ..Attrs::default() };
    let (m, id) = collective(Opcode::CollectivePermute, attrs);
    assert!(permute_pairs(&m, id, 4, 1).unwrap_err().contains("twice"));
}
