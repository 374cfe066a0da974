//! `emitter::decide`: the decision rules (kernel or fallback, and why) on modules built by hand
//! and written as HLO text.

use emitter::tuning::Tuning;
use emitter::{Capabilities, EmitError, Flags, PeerAccessTable, decide_tuned};
use hlo::analysis::{DeviceMode, ReductionKind};
use hlo::{
    Attrs, CompId, Computation, InstrId, Instruction, Module, ModuleConfig, Opcode, PrimitiveType, ReplicaGroups, Shape,
};
use thunks::{CollectiveConfig, CollectiveKind, CollectiveOp, Decision, Implementation, KernelAlgorithm};

/// Builds a module by hand: reducers first, then the entry computation.
struct B {
    m: Module,
    entry: Vec<InstrId>,
    params: Vec<InstrId>,
}

/// Rules 1–7 with no tuning profile, on a backend with the baseline capabilities.
fn decide(
    m: &Module,
    id: InstrId,
    replicas: usize,
    partitions: usize,
    flags: &Flags,
    peers: &PeerAccessTable,
) -> Result<(CollectiveConfig, Decision), EmitError> {
    decide_tuned(m, id, replicas, partitions, flags, &Tuning::none(), peers, Capabilities::default())
}

fn arr(ty: PrimitiveType, dims: &[i64]) -> Shape {
    Shape::array(ty, dims.to_vec())
}

impl B {
    fn new() -> Self {
        let m = Module {
            name: "m".into(),
            config: ModuleConfig::default(),
            comps: Default::default(),
            instrs: Default::default(),
            entry: CompId::from_u32(0),
            source_name: "test".into(),
        };
        B { m, entry: vec![], params: vec![] }
    }

    fn raw(&mut self, name: &str, opcode: Opcode, shape: Shape, operands: Vec<InstrId>, parent: CompId) -> InstrId {
        self.m.instrs.push(Instruction {
            name: name.into(),
            opcode,
            shape,
            operands,
            called: vec![],
            attrs: Attrs::default(),
            parent,
            span: None,
        })
    }

    /// `r { x, y = ty[] parameter; ROOT op(x, y) }`. Call before any entry instruction.
    fn reducer(&mut self, op: Opcode, ty: PrimitiveType) -> CompId {
        assert!(self.entry.is_empty());
        let c = self.m.comps.next_key();
        let x = self.raw("x", Opcode::Parameter, arr(ty, &[]), vec![], c);
        let y = self.raw("y", Opcode::Parameter, arr(ty, &[]), vec![], c);
        let z = self.raw("z", op, arr(ty, &[]), vec![x, y], c);
        self.m.comps.push(Computation {
            name: format!("r{c}"),
            instrs: vec![x, y, z],
            params: vec![x, y],
            root: z,
            span: None,
        })
    }

    fn param(&mut self, name: &str, shape: Shape) -> InstrId {
        let id = self.raw(name, Opcode::Parameter, shape, vec![], CompId::from_u32(0));
        self.m.instrs[id].attrs.parameter_number = Some(self.params.len() as i64);
        self.params.push(id);
        self.entry.push(id);
        id
    }

    fn op(&mut self, name: &str, opcode: Opcode, shape: Shape, operands: &[InstrId], attrs: Attrs) -> InstrId {
        let id = self.raw(name, opcode, shape, operands.to_vec(), CompId::from_u32(0));
        self.m.instrs[id].attrs = attrs;
        self.entry.push(id);
        id
    }

    fn finish(mut self) -> Module {
        let c = self.m.comps.next_key();
        for &i in &self.entry {
            self.m.instrs[i].parent = c;
        }
        let root = *self.entry.last().unwrap();
        self.m.comps.push(Computation { name: "e".into(), instrs: self.entry, params: self.params, root, span: None });
        self.m.entry = c;
        self.m
    }
}

fn flat(groups: &[&[i64]]) -> Attrs {
    Attrs {
        channel_id: Some(1),
        use_global_device_ids: true,
        replica_groups: Some(ReplicaGroups::Explicit(groups.iter().map(|g| g.to_vec()).collect())),
        ..Attrs::default()
    }
}

/// `ROOT c = ty[dims] all-reduce(p), to_apply=<op>` with flattened-id `groups`.
fn all_reduce(ty: PrimitiveType, dims: &[i64], op: Opcode, groups: &[&[i64]]) -> (Module, InstrId) {
    let mut b = B::new();
    let r = b.reducer(op, ty);
    let p = b.param("p", arr(ty, dims));
    let c = b.op("c", Opcode::AllReduce, arr(ty, dims), &[p], flat(groups));
    b.m.instrs[c].called = vec![r];
    (b.finish(), c)
}

fn run(m: &Module, id: InstrId, n: usize, flags: &str) -> Result<(CollectiveConfig, Decision), EmitError> {
    let flags = Flags::parse(flags).unwrap();
    let peers = PeerAccessTable::for_host_topology(n, &flags.host_topology);
    decide(m, id, 1, n, &flags, &peers)
}

const ALL4: &[&[i64]] = &[&[0, 1, 2, 3]];

/// Every collective of `m` decided (`-done` halves are decided with their start), with the
/// peer table of `flags.host_topology`: what a caller of [`decide`] does for a module.
fn plan(
    m: &Module,
    n: usize,
    mode: DeviceMode,
    flags: &Flags,
) -> Result<Vec<(String, CollectiveConfig, Decision)>, EmitError> {
    let (replicas, partitions) = match mode {
        DeviceMode::Replica => (n, 1),
        DeviceMode::Partition => (1, n),
    };
    let peers = PeerAccessTable::for_host_topology(n, &flags.host_topology);
    m.collectives()
        .into_iter()
        .map(|id| decide(m, id, replicas, partitions, flags, &peers).map(|(c, d)| (m.instr(id).name.clone(), c, d)))
        .collect()
}

/// A profile over groups of 4: all-reduce one-shot at 16 B, XLA at 1 KiB, two-shot at
/// 64 KiB; all-gather XLA everywhere.
fn tuned(explicit_thresholds: bool) -> emitter::tuning::Tuning {
    use emitter::tuning::{Key, Measured, Profile, XLA};
    let key = Key { platform: "cpu".into(), device_kind: "cpu".into(), devices: 4, links: "host".into() };
    let mut p = Profile::new(key, Measured::default());
    p.source = "test-profile".into();
    let (one, two) = (KernelAlgorithm::OneShotAllReduce.name(), KernelAlgorithm::TwoShotAllReduce.name());
    for (bytes, o, t, x) in [(16, 1.0, 2.0, 3.0), (1024, 5.0, 6.0, 4.0), (65536, 30.0, 10.0, 20.0)] {
        p.record("all-reduce", "f32", 4, bytes, one, o);
        p.record("all-reduce", "f32", 4, bytes, two, t);
        p.record("all-reduce", "f32", 4, bytes, XLA, x);
        p.record("all-gather", "f32", 4, bytes, KernelAlgorithm::DirectAllGather.name(), 2.0 * x);
        p.record("all-gather", "f32", 4, bytes, XLA, x);
    }
    emitter::tuning::Tuning { profile: Some(std::sync::Arc::new(p)), explicit_thresholds }
}

fn run_tuned(m: &Module, id: InstrId, flags: &str, t: &emitter::tuning::Tuning) -> Result<Decision, EmitError> {
    let flags = Flags::parse(flags).unwrap();
    let peers = PeerAccessTable::for_host_topology(4, &flags.host_topology);
    decide_tuned(m, id, 1, 4, &flags, t, &peers, Capabilities::default()).map(|(_, d)| d)
}

#[test]
fn a_profile_picks_among_what_the_guards_allow_and_flags_win() {
    let t = tuned(false);
    let ar = |elems: i64| all_reduce(PrimitiveType::F32, &[elems], Opcode::Add, ALL4);
    let (m, id) = ar(4);
    let d = run_tuned(&m, id, "", &t).unwrap();
    assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::OneShotAllReduce));
    assert!(
        d.reason.starts_with("1 groups of 4 sum; profile test-profile: all-reduce f32 groups of 4 at 16 B"),
        "{}",
        d.reason
    );
    let (m, id) = ar(256);
    let d = run_tuned(&m, id, "", &t).unwrap();
    assert_eq!(d.implementation, Implementation::Fallback);
    assert!(d.reason.contains("XLA 4 µs, one-shot 5 µs, two-shot 6 µs (measured at 1 KiB) -> XLA"), "{}", d.reason);
    let (m, id) = ar(16384);
    assert_eq!(
        run_tuned(&m, id, "", &t).unwrap().implementation,
        Implementation::Kernel(KernelAlgorithm::TwoShotAllReduce)
    );
    // Above two_shot_max_bytes all-reduce stays XLA's whatever the profile says.
    assert_eq!(
        run_tuned(&m, id, "--two_shot_max_bytes=1024", &tuned(false)).unwrap().implementation,
        Implementation::Fallback
    );
    // Explicit thresholds or a forced backend: the profile is not asked.
    let (m, id) = ar(256);
    let d = run_tuned(&m, id, "", &tuned(true)).unwrap();
    assert_eq!(d.reason, "1024 bytes <= one_shot_max_bytes=262144 sum, 1 groups of 4");
    let d = run_tuned(&m, id, "--all_reduce_backend=kernel", &t).unwrap();
    assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::OneShotAllReduce));
    // The dtype guard comes first: a profile never sends f8 to a kernel.
    let (m, id) = all_gather_start(PrimitiveType::F8E4M3FN);
    assert!(run_tuned(&m, id, "", &t).unwrap().reason.starts_with("dtype guard"));
    let (m, id) = all_gather_start(PrimitiveType::F32);
    let d = run_tuned(&m, id, "", &t).unwrap();
    assert_eq!(d.implementation, Implementation::Fallback);
    assert!(d.reason.starts_with("profile test-profile: all-gather f32 groups of 4 at 8 B"), "{}", d.reason);
    assert!(run_tuned(&m, id, "--all_gather_backend=kernel", &t).unwrap().is_kernel());
    // Peer access comes first too.
    let (m, id) = ar(4);
    let d = run_tuned(&m, id, "--host_topology=pairs:0-1,2-3", &t).unwrap();
    assert!(d.reason.starts_with("no peer access"), "{}", d.reason);
}

#[test]
fn all_reduce_size_thresholds_at_the_boundaries() {
    let algo = |elems: i64, flags: &str| {
        let (m, id) = all_reduce(PrimitiveType::F32, &[elems], Opcode::Add, ALL4);
        run(&m, id, 4, flags).unwrap()
    };
    let (cfg, d) = algo(65536, "");
    assert_eq!(cfg.bytes_per_device, 262_144);
    assert_eq!(cfg.reduction, Some(ReductionKind::Sum));
    assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::OneShotAllReduce));
    assert_eq!(d.reason, "262144 bytes <= one_shot_max_bytes=262144 sum, 1 groups of 4");
    let (_, d) = algo(65537, "");
    assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::TwoShotAllReduce));
    assert!(d.reason.starts_with("262148 bytes > one_shot_max_bytes=262144 and <= two_shot_max_bytes=4194304"));
    let (_, d) = algo(1 << 20, "");
    assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::TwoShotAllReduce));
    let (_, d) = algo((1 << 20) + 1, "");
    assert_eq!(d, Decision::fallback("4194308 bytes > two_shot_max_bytes=4194304"));
    // Flags move the boundaries.
    let f = "--one_shot_max_bytes=16 --two_shot_max_bytes=32";
    assert_eq!(algo(4, f).1.implementation, Implementation::Kernel(KernelAlgorithm::OneShotAllReduce));
    assert_eq!(algo(5, f).1.implementation, Implementation::Kernel(KernelAlgorithm::TwoShotAllReduce));
    assert_eq!(algo(8, f).1.implementation, Implementation::Kernel(KernelAlgorithm::TwoShotAllReduce));
    assert_eq!(algo(9, f).1, Decision::fallback("36 bytes > two_shot_max_bytes=32"));
    // Forcing the kernel past the limit is an error that says why.
    let e = algo_err(((1 << 20) + 1, "--all_reduce_backend=kernel"));
    assert_eq!(
        e,
        "all-reduce 'c': --all_reduce_backend=kernel forces a Peerless kernel, but 4194308 bytes > two_shot_max_bytes=4194304"
    );
}

fn algo_err((elems, flags): (i64, &str)) -> String {
    let (m, id) = all_reduce(PrimitiveType::F32, &[elems], Opcode::Add, ALL4);
    run(&m, id, 4, flags).unwrap_err().to_string()
}

#[test]
fn backend_flag_fallback_wins_over_everything() {
    let (m, id) = all_reduce(PrimitiveType::F32, &[4], Opcode::Add, ALL4);
    let (_, d) = run(&m, id, 4, "--all_reduce_backend=fallback").unwrap();
    assert_eq!(d, Decision::fallback("forced by --all_reduce_backend=fallback"));
    // Other ops' flags do not touch all-reduce.
    let (_, d) = run(&m, id, 4, "--all_gather_backend=fallback").unwrap();
    assert!(d.is_kernel());
}

/// `ROOT s = (ty[n], ty[4n]) all-gather-start(p), dimensions={0}` over 4 devices.
fn all_gather_start(ty: PrimitiveType) -> (Module, InstrId) {
    let mut b = B::new();
    let p = b.param("p", arr(ty, &[2]));
    let mut attrs = flat(ALL4);
    attrs.dimensions = Some(vec![0]);
    let tuple = Shape::Tuple(vec![arr(ty, &[2]), arr(ty, &[8])]);
    let s = b.op("ags", Opcode::AllGatherStart, tuple, &[p], attrs);
    b.op("agd", Opcode::AllGatherDone, arr(ty, &[8]), &[s], Attrs::default());
    (b.finish(), s)
}

#[test]
fn dtype_guard_reads_the_operand_of_a_tuple_start() {
    let (m, id) = all_gather_start(PrimitiveType::F8E4M3FN);
    assert!(m.instr(id).shape.is_tuple());
    let (cfg, d) = run(&m, id, 4, "").unwrap();
    assert_eq!(cfg.element_type, PrimitiveType::F8E4M3FN);
    assert_eq!(cfg.op, CollectiveOp { kind: CollectiveKind::AllGather, is_async: true });
    assert_eq!(cfg.dimension, Some(0));
    assert_eq!(d.implementation, Implementation::Fallback);
    assert!(d.reason.starts_with("dtype guard: operand element type f8e4m3fn"), "{}", d.reason);
    // The same op on bf16 gets the direct kernel.
    let (m, id) = all_gather_start(PrimitiveType::Bf16);
    let (cfg, d) = run(&m, id, 4, "").unwrap();
    assert_eq!(cfg.bytes_per_device, 4);
    assert_eq!(d, Decision::kernel(KernelAlgorithm::DirectAllGather, "1 groups of 4, all with peer access"));
    // s4 and complex are guarded too.
    for ty in [PrimitiveType::S4, PrimitiveType::C64] {
        let (m, id) = all_gather_start(ty);
        assert!(run(&m, id, 4, "").unwrap().1.reason.starts_with("dtype guard"), "{ty}");
    }
}

#[test]
fn forced_kernel_on_unsupported_dtype_is_an_error() {
    let (m, id) = all_gather_start(PrimitiveType::F8E4M3FN);
    let e = run(&m, id, 4, "--all_gather_backend=kernel").unwrap_err();
    assert!(
        matches!(&e, EmitError::KernelForced { instr, flag, .. } if instr == "ags" && flag == "all_gather_backend")
    );
    let s = e.to_string();
    assert!(
        s.starts_with("all-gather-start 'ags': --all_gather_backend=kernel forces a Peerless kernel, but dtype guard"),
        "{s}"
    );
    // Forced kernel where the rules agree is fine.
    let (m, id) = all_gather_start(PrimitiveType::F32);
    assert!(run(&m, id, 4, "--all_gather_backend=kernel").unwrap().1.is_kernel());
}

#[test]
fn reduction_must_be_recognised() {
    let (m, id) = all_reduce(PrimitiveType::F32, &[4], Opcode::Subtract, ALL4);
    let (cfg, d) = run(&m, id, 4, "").unwrap();
    assert_eq!(cfg.reduction, None);
    assert_eq!(d.implementation, Implementation::Fallback);
    assert!(d.reason.starts_with("reduction computation not recognised"), "{}", d.reason);
    for (op, kind) in [(Opcode::Maximum, ReductionKind::Max), (Opcode::Or, ReductionKind::Or)] {
        let ty = if op == Opcode::Or { PrimitiveType::Pred } else { PrimitiveType::S32 };
        let (m, id) = all_reduce(ty, &[4], op, ALL4);
        let (cfg, d) = run(&m, id, 4, "").unwrap();
        assert_eq!(cfg.reduction, Some(kind));
        assert!(d.is_kernel());
    }
}

#[test]
fn group_shape_rules() {
    // Non-uniform groups.
    let (m, id) = all_reduce(PrimitiveType::F32, &[4], Opcode::Add, &[&[0], &[1, 2, 3]]);
    let (_, d) = run(&m, id, 4, "").unwrap();
    assert_eq!(d, Decision::fallback("non-uniform replica groups (sizes 1 and 3) {{0},{1,2,3}}"));
    // Single-member groups: a local copy, even with no peer links at all.
    let (m, id) = all_reduce(PrimitiveType::F32, &[1 << 22], Opcode::Add, &[&[0], &[1], &[2], &[3]]);
    let (_, d) = run(&m, id, 4, "--host_topology=pairs:").unwrap();
    assert_eq!(d, Decision::kernel(KernelAlgorithm::OneShotAllReduce, "single-member groups: local copy"));
    // More than 8 members.
    let all16: Vec<i64> = (0..16).collect();
    let (m, id) = all_reduce(PrimitiveType::F32, &[4], Opcode::Add, &[&all16]);
    let (_, d) = run(&m, id, 16, "").unwrap();
    assert_eq!(d, Decision::fallback("groups of 16 devices > 8 (kernel peer-pointer limit)"));
    let (m, id) = all_reduce(PrimitiveType::F32, &[4], Opcode::Add, &[&all16[..8], &all16[8..]]);
    assert!(run(&m, id, 16, "").unwrap().1.is_kernel());
}

#[test]
fn missing_peer_link_is_named() {
    let topo = "--host_topology=pairs:0-1,2-3";
    let (m, id) = all_reduce(PrimitiveType::F32, &[4], Opcode::Add, &[&[0, 2], &[1, 3]]);
    let (_, d) = run(&m, id, 4, topo).unwrap();
    assert_eq!(d, Decision::fallback("no peer access 0↔2 (host_topology pairs:0-1,2-3)"));
    let (m, id) = all_reduce(PrimitiveType::F32, &[4], Opcode::Add, &[&[0, 1], &[2, 3]]);
    assert!(run(&m, id, 4, topo).unwrap().1.is_kernel());
    // A table smaller than the device set.
    let small = PeerAccessTable::full(2, "test table");
    let (m, id) = all_reduce(PrimitiveType::F32, &[4], Opcode::Add, ALL4);
    let (_, d) = decide(&m, id, 1, 4, &Flags::default(), &small).unwrap();
    assert_eq!(d, Decision::fallback("peer table (test table) covers 2 devices, not device 2"));
}

#[test]
fn variadic_all_reduce_falls_back() {
    let mut b = B::new();
    let r = b.reducer(Opcode::Add, PrimitiveType::F32);
    let p = b.param("p", arr(PrimitiveType::F32, &[4]));
    let q = b.param("q", arr(PrimitiveType::F32, &[2]));
    let shape = Shape::Tuple(vec![arr(PrimitiveType::F32, &[4]), arr(PrimitiveType::F32, &[2])]);
    let c = b.op("c", Opcode::AllReduce, shape, &[p, q], flat(&[&[0, 1]]));
    b.m.instrs[c].called = vec![r];
    let m = b.finish();
    let (cfg, d) = run(&m, c, 2, "").unwrap();
    assert_eq!((cfg.num_operands, cfg.bytes_per_device), (2, 24));
    assert_eq!(d, Decision::fallback("variadic all-reduce with 2 operands: kernels take one operand"));
}

#[test]
fn other_ops_use_direct_kernels() {
    let mut b = B::new();
    let r = b.reducer(Opcode::Add, PrimitiveType::F32);
    let p = b.param("p", arr(PrimitiveType::F32, &[1 << 22]));
    let mut a2a = Attrs { channel_id: Some(1), dimensions: Some(vec![0]), ..Attrs::default() };
    a2a.replica_groups = Some(ReplicaGroups::Explicit(vec![vec![0, 1, 2, 3]]));
    let x = b.op("a2a", Opcode::AllToAll, arr(PrimitiveType::F32, &[1 << 22]), &[p], a2a);
    let mut rs = flat(ALL4);
    rs.dimensions = Some(vec![0]);
    let s = b.op("rs", Opcode::ReduceScatter, arr(PrimitiveType::F32, &[1 << 20]), &[p], rs);
    b.m.instrs[s].called = vec![r];
    let cp = Attrs { channel_id: Some(1), source_target_pairs: Some(vec![(0, 1), (1, 2)]), ..Attrs::default() };
    let c = b.op("cp", Opcode::CollectivePermute, arr(PrimitiveType::F32, &[1 << 22]), &[p], cp);
    let m = b.finish();
    let (cfg, d) = run(&m, x, 4, "").unwrap();
    assert_eq!((cfg.dimension, cfg.bytes_per_device), (Some(0), 1 << 24));
    assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::DirectAllToAll));
    let (cfg, d) = run(&m, s, 4, "").unwrap();
    assert_eq!(cfg.reduction, Some(ReductionKind::Sum));
    assert_eq!(d, Decision::kernel(KernelAlgorithm::DirectReduceScatter, "1 groups of 4, all with peer access sum"));
    let (cfg, d) = run(&m, c, 4, "").unwrap();
    assert_eq!(cfg.source_target_pairs, vec![(0, 1), (1, 2)]);
    assert_eq!(d, Decision::kernel(KernelAlgorithm::DirectPermute, "2 cross-device pairs, all with peer access"));
    // Permute peer access is checked per pair.
    let (_, d) = run(&m, c, 4, "--host_topology=pairs:0-1,2-3").unwrap();
    assert_eq!(d, Decision::fallback("no peer access 1↔2 (host_topology pairs:0-1,2-3)"));
    let e = run(&m, c, 4, "--host_topology=pairs:0-1 --collective_permute_backend=kernel").unwrap_err();
    assert!(e.to_string().contains("no peer access 1↔2"), "{e}");
}

#[test]
fn every_collective_is_decided_but_not_done_halves() {
    let mut b = B::new();
    let r = b.reducer(Opcode::Add, PrimitiveType::F32);
    let p = b.param("p", arr(PrimitiveType::F32, &[2]));
    let ar = b.op("ar", Opcode::AllReduce, arr(PrimitiveType::F32, &[2]), &[p], flat(ALL4));
    b.m.instrs[ar].called = vec![r];
    let mut ag = flat(ALL4);
    ag.dimensions = Some(vec![0]);
    let tuple = Shape::Tuple(vec![arr(PrimitiveType::F32, &[2]), arr(PrimitiveType::F32, &[8])]);
    let s = b.op("ags", Opcode::AllGatherStart, tuple, &[ar], ag);
    b.op("agd", Opcode::AllGatherDone, arr(PrimitiveType::F32, &[8]), &[s], Attrs::default());
    let bc = Attrs { channel_id: Some(1), ..Attrs::default() };
    b.op("bc", Opcode::CollectiveBroadcast, arr(PrimitiveType::F32, &[2]), &[p], bc);
    let m = b.finish();
    let planned = plan(&m, 4, DeviceMode::Partition, &Flags::default()).unwrap();
    let names: Vec<&str> = planned.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["ar", "ags", "bc"]);
    assert_eq!(planned[0].2.implementation, Implementation::Kernel(KernelAlgorithm::OneShotAllReduce));
    assert_eq!((planned[1].1.element_type, planned[1].1.bytes_per_device), (PrimitiveType::F32, 8));
    assert_eq!(planned[1].1.groups, vec![vec![0, 1, 2, 3]]);
    assert_eq!(planned[2].2, Decision::fallback("no Peerless kernel for collective-broadcast"));
    assert_eq!(
        planned[0].2.to_string(),
        "kernel (one-shot all-reduce): 8 bytes <= one_shot_max_bytes=262144 sum, 1 groups of 4"
    );
    // Invalid groups for the device count are errors naming the instruction.
    let e = plan(&m, 8, DeviceMode::Partition, &Flags::default()).unwrap_err();
    assert!(matches!(&e, EmitError::InvalidCollective { instr, .. } if instr == "ar"), "{e}");
    assert!(e.to_string().contains("device 4 is in no group"), "{e}");
    // Replica mode with flattened ids on 4 replicas gives the same groups.
    let planned = plan(&m, 4, DeviceMode::Replica, &Flags::default()).unwrap();
    assert_eq!(planned[0].1.groups, vec![vec![0, 1, 2, 3]]);
    // A -done half is not decided on its own.
    let done = m.entry().instrs[3];
    let e = decide(&m, done, 1, 4, &Flags::default(), &PeerAccessTable::full(4, "t")).unwrap_err();
    assert!(e.to_string().contains("all-gather-done 'agd' is not a collective the emitter decides"), "{e}");
}

// The same rules on modules written as HLO text (parsed and verified by `hlo`).

const MODULE: &str = r#"
HloModule m, num_partitions=4

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = f32[] add(x, y)
}

ENTRY e {
  p = f32[1024]{0} parameter(0)
  q = f8e4m3fn[2]{0} parameter(1)
  ar = f32[1024]{0} all-reduce(p), channel_id=1, replica_groups=[2,2]<=[4], use_global_device_ids=true, to_apply=add
  ags = (f8e4m3fn[2]{0}, f8e4m3fn[8]{0}) all-gather-start(q), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  agd = f8e4m3fn[8]{0} all-gather-done(ags)
  cp = f32[1024]{0} collective-permute(p), channel_id=3, source_target_pairs={{0,1},{1,0},{2,3},{3,2}}
  ROOT t = (f32[1024]{0}, f8e4m3fn[8]{0}, f32[1024]{0}) tuple(ar, agd, cp)
}
"#;

#[test]
fn decides_a_parsed_module() {
    let m = hlo::parse_text("m.hlo", MODULE).unwrap();
    let flags = Flags::parse("--host_topology=pairs:0-1,2-3").unwrap();
    let planned = plan(&m, 4, DeviceMode::Partition, &flags).unwrap();
    let got: Vec<(&str, &Decision)> = planned.iter().map(|p| (p.0.as_str(), &p.2)).collect();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0].0, "ar");
    assert_eq!(planned[0].1.groups, vec![vec![0, 1], vec![2, 3]]);
    assert_eq!(got[0].1.implementation, Implementation::Kernel(KernelAlgorithm::OneShotAllReduce));
    assert_eq!(got[1].0, "ags");
    assert_eq!(planned[1].1.element_type, PrimitiveType::F8E4M3FN);
    assert!(got[1].1.reason.starts_with("dtype guard: operand element type f8e4m3fn"), "{got:?}");
    assert_eq!(
        got[2],
        ("cp", &Decision::kernel(KernelAlgorithm::DirectPermute, "4 cross-device pairs, all with peer access"))
    );
    // The other pairing cuts every link the collectives need.
    let flags = Flags::parse("--host_topology=pairs:0-2,1-3").unwrap();
    let planned = plan(&m, 4, DeviceMode::Partition, &flags).unwrap();
    assert_eq!(planned[0].2, Decision::fallback("no peer access 0↔1 (host_topology pairs:0-2,1-3)"));
    assert_eq!(planned[2].2, Decision::fallback("no peer access 0↔1 (host_topology pairs:0-2,1-3)"));
}

#[test]
fn copy_engines_from_their_size_only_where_the_platform_has_them() {
    let caps = Capabilities { copy_engines: true, ..Capabilities::default() };
    let decide_with = |m: &Module, id: InstrId, flags: &str, caps: Capabilities, t: &emitter::tuning::Tuning| {
        let flags = Flags::parse(flags).unwrap();
        let peers = PeerAccessTable::for_host_topology(4, &flags.host_topology);
        decide_tuned(m, id, 1, 4, &flags, t, &peers, caps).map(|(_, d)| d).unwrap()
    };
    let none = emitter::tuning::Tuning::none();
    let (m, id) = all_gather_start(PrimitiveType::Bf16);
    // 4 bytes of operand per device (bf16[2]).
    let d = decide_with(&m, id, "--copy_engines=4", caps, &none);
    assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::CopyEngineAllGather), "{}", d.reason);
    assert!(d.reason.contains("4 bytes >= copy_engines=4") && d.reason.contains("no SMs"), "{}", d.reason);
    // Below the size, off by default, or on a platform without them: the direct kernel.
    for (flags, caps) in [("--copy_engines=5", caps), ("", caps), ("--copy_engines=0", Capabilities::default())] {
        let d = decide_with(&m, id, flags, caps, &none);
        assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::DirectAllGather), "{flags}: {}", d.reason);
    }
    // All-reduce above two_shot_max_bytes: the copy engines where the flag says, else XLA's.
    let (m, id) = all_reduce(PrimitiveType::F32, &[1 << 21], Opcode::Add, ALL4);
    let d = decide_with(&m, id, "--copy_engines=1048576", caps, &none);
    assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::CopyEngineAllReduce), "{}", d.reason);
    assert!(d.reason.contains("SMs only to reduce"), "{}", d.reason);
    assert_eq!(decide_with(&m, id, "", caps, &none).implementation, Implementation::Fallback);
    // auto: only where the profile measured them fastest (the test profile has no such rows).
    let d = decide_with(&m, id, "--copy_engines=auto", caps, &tuned(false));
    assert_eq!(d.implementation, Implementation::Fallback, "{}", d.reason);
    // Groups of one (one GPU inside XLA): the flag still picks the copy-engine form.
    let (m, id) = all_reduce(PrimitiveType::F32, &[1 << 10], Opcode::Add, &[&[0], &[1], &[2], &[3]]);
    let d = decide_with(&m, id, "--copy_engines=0", caps, &none);
    assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::CopyEngineAllReduce), "{}", d.reason);
    let d = decide_with(&m, id, "", caps, &none);
    assert_eq!(d.implementation, Implementation::Kernel(KernelAlgorithm::OneShotAllReduce), "{}", d.reason);
}
