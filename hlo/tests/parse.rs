//! HLO text parser: real JAX/XLA output (tests/text_samples, generated with jax 0.10.2)
//! and hand-written modules covering every attribute and literal form.

use hlo::{
    ArrayShape, CompId, ComparisonDirection, DotDims, Instruction, Literal, Module, Opcode, PadDim, PrimitiveType,
    ReplicaGroups, Shape, Sharding, SliceDim,
};

fn parse(src: &str) -> Module {
    hlo::text::parse("test.hlo", src).unwrap_or_else(|e| panic!("{e}"))
}

fn sample(name: &str) -> Module {
    let path = format!("{}/tests/text_samples/{name}.hlo", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(&path).unwrap();
    let m = hlo::text::parse(&path, &src).unwrap_or_else(|e| panic!("{e}"));
    check_structure(&m);
    m
}

/// Invariants the parser guarantees for every module it returns.
fn check_structure(m: &Module) {
    for (cid, comp) in m.comps.iter() {
        assert!(comp.instrs.contains(&comp.root), "{}: root in instrs", comp.name);
        for (i, &p) in comp.params.iter().enumerate() {
            assert_eq!(m.instr(p).attrs.parameter_number, Some(i as i64));
            assert_eq!(m.instr(p).opcode, Opcode::Parameter);
        }
        for &id in &comp.instrs {
            let ins = m.instr(id);
            assert_eq!(ins.parent, cid);
            assert!(ins.span.is_some());
            for &o in &ins.operands {
                assert!(o < id, "{}: operand defined before use", ins.name);
                assert_eq!(m.instr(o).parent, cid);
            }
            for &c in &ins.called {
                assert!(m.comps.get(c).is_some());
            }
        }
    }
}

fn find<'m>(m: &'m Module, name: &str) -> &'m Instruction {
    m.instrs.values().find(|i| i.name == name).unwrap_or_else(|| panic!("no instruction {name}"))
}

fn comp_names(m: &Module, ids: &[CompId]) -> Vec<String> {
    ids.iter().map(|&c| m.comp(c).name.clone()).collect()
}

fn array(l: &Literal) -> &hlo::Array {
    l.as_array().expect("array literal")
}

fn lit<'m>(m: &'m Module, name: &str) -> &'m Literal {
    find(m, name).attrs.literal.as_ref().expect("literal")
}

#[test]
fn jax_simple_unoptimized() {
    let m = sample("jax_simple");
    assert_eq!(m.name, "jit__lambda");
    assert_eq!(m.source_name.rsplit('/').next(), Some("jax_simple.hlo"));
    assert_eq!(m.config.replica_count, 1);
    assert_eq!(m.config.num_partitions, 1);
    assert_eq!(m.config.entry_computation_layout.as_deref(), Some("(f32[4,8]{1,0})->f32[8]{0}"));
    assert_eq!(m.entry().name, "main.2");
    assert_eq!(m.comps.len(), 2);
    let root = m.instr(m.entry().root);
    assert_eq!(root.name, "reduce_sum.7");
    assert_eq!(root.opcode, Opcode::Reduce);
    assert_eq!(root.attrs.dimensions, Some(vec![0]));
    assert_eq!(comp_names(&m, &root.called), ["region_0.1"]);
    assert_eq!(root.operands.iter().map(|&o| m.instr(o).name.as_str()).collect::<Vec<_>>(), ["mul.3", "constant.3"]);
    let x = find(&m, "x.1");
    assert_eq!(
        x.shape,
        Shape::Array(ArrayShape { ty: PrimitiveType::F32, dims: vec![4, 8], layout: Some(vec![1, 0]) })
    );
    assert_eq!(m.entry_param_shapes().len(), 1);
    assert_eq!(array(lit(&m, "constant.2")).to_vec::<f32>(), Some(vec![2.0]));
    assert_eq!(find(&m, "mul.2").attrs.dimensions, Some(vec![]));
    // Spans point at the instruction name.
    let span = root.span.unwrap();
    assert_eq!((span.line, span.col, span.len), (16, 8, 12));
    let cspan = m.entry().span.unwrap();
    assert_eq!((cspan.line, cspan.col), (9, 7));
}

#[test]
fn jax_simple_optimized() {
    let m = sample("jax_simple_opt");
    assert_eq!(m.config.other.get("is_scheduled").map(String::as_str), Some("true"));
    assert_eq!(m.config.other.get("allow_spmd_sharding_propagation_to_output").map(String::as_str), Some("{true}"));
    assert_eq!(m.comps.len(), 3);
    let fusion = find(&m, "multiply_reduce_fusion");
    assert_eq!(fusion.opcode, Opcode::Fusion);
    assert_eq!(fusion.attrs.other.get("kind").map(String::as_str), Some("kLoop"));
    assert_eq!(comp_names(&m, &fusion.called), ["fused_computation"]);
    let md = fusion.attrs.metadata.as_deref().unwrap();
    assert_eq!(md, r#"{op_name="jit(<lambda>)/reduce_sum" stack_frame_id=2}"#);
    // Called computations may be defined before or after their users.
    assert_eq!(comp_names(&m, &find(&m, "reduce_sum.0").called), ["region_0.1"]);
}

#[test]
fn jax_shard_map_collectives() {
    let m = sample("jax_shmap");
    assert_eq!(
        m.config.frontend_attributes.get("xla.sdy.meshes").map(String::as_str),
        Some(r#"{mesh = #sdy.mesh<["x"=8]>}"#)
    );
    let all8 = ReplicaGroups::Explicit(vec![(0..8).collect()]);
    let ar = find(&m, "psum.5");
    assert_eq!(ar.opcode, Opcode::AllReduce);
    assert_eq!(ar.attrs.replica_groups, Some(all8.clone()));
    assert_eq!(ar.attrs.channel_id, Some(1));
    assert!(ar.attrs.use_global_device_ids);
    assert_eq!(comp_names(&m, &ar.called), ["region_0.1"]);
    let ag = find(&m, "all_gather.3");
    assert_eq!(ag.attrs.dimensions, Some(vec![0]));
    let a2a = find(&m, "all_to_all.1");
    assert!(!a2a.attrs.use_global_device_ids);
    assert_eq!(a2a.attrs.dimensions, Some(vec![0]));
    let rs = find(&m, "reduce_scatter.5");
    assert_eq!(rs.opcode, Opcode::ReduceScatter);
    assert_eq!(comp_names(&m, &rs.called), ["region_1.2"]);
    let cp = find(&m, "ppermute.1");
    assert_eq!(cp.attrs.source_target_pairs, Some((0..8).map(|i| (i, (i + 1) % 8)).collect()));
    let x = find(&m, "x.1");
    assert_eq!(
        x.attrs.sharding,
        Some(Sharding::Tiled {
            tile_dims: vec![8],
            devices: (0..8).collect(),
            last_tile_dim_replicate: false,
            last_tile_dims: vec![]
        })
    );
    assert_eq!(
        x.attrs.frontend_attributes.get("xla.sdy.sharding").map(String::as_str),
        Some(r##"#sdy.sharding<@mesh, [{"x"}]>"##)
    );
    let g2l = find(&m, "shard_map.20");
    assert_eq!(g2l.attrs.custom_call_target.as_deref(), Some("xla.sdy.GlobalToLocalShape"));
    assert_eq!(g2l.attrs.other.get("custom_call_has_side_effect").map(String::as_str), Some("true"));
    assert_eq!(g2l.attrs.frontend_attributes.len(), 2);
    assert_eq!(find(&m, "shard_map.22").attrs.tuple_index, Some(0));
    assert_eq!(find(&m, "shard_map.26").attrs.tuple_index, Some(4));
    let root = m.instr(m.entry().root);
    let Some(Sharding::Tuple(parts)) = &root.attrs.sharding else { panic!("tuple sharding") };
    assert_eq!(parts.len(), 5);
    assert_eq!(parts[0], Sharding::Replicated);
    assert_eq!(m.collectives().len(), 5);
}

#[test]
fn jax_shard_map_optimized() {
    let m = sample("jax_shmap_opt");
    assert_eq!(m.config.num_partitions, 8);
    assert_eq!(m.entry().name, "main.0_spmd");
    // `/*index=5*/` comments inside tuple shapes and operand lists.
    let a2a = find(&m, "all-to-all");
    assert_eq!(a2a.operands.len(), 8);
    assert_eq!(a2a.shape.tuple_elements().unwrap().len(), 8);
    assert_eq!(find(&m, "concatenate").operands.len(), 8);
    assert_eq!(find(&m, "get-tuple-element.12").attrs.tuple_index, Some(7));
    assert_eq!(
        find(&m, "slice.9").attrs.slice,
        Some(vec![SliceDim { start: 7, limit: 8, stride: 1 }, SliceDim { start: 0, limit: 1, stride: 1 }])
    );
}

#[test]
fn jax_control_flow() {
    let m = sample("jax_ctrl");
    let w = find(&m, "while.9");
    assert_eq!(w.opcode, Opcode::While);
    assert_eq!(comp_names(&m, &w.called), ["region_2.4", "region_0.3"]); // condition, body
    let cond = find(&m, "cond.1");
    assert_eq!(comp_names(&m, &cond.called), ["region_3.5", "region_4.6"]);
    assert_eq!(find(&m, "gt.3").attrs.comparison_direction, Some(ComparisonDirection::Gt));
    let lt = find(&m, "lt_to.1");
    assert_eq!(lt.attrs.comparison_direction, Some(ComparisonDirection::Lt));
    assert_eq!(lt.attrs.comparison_type.as_deref(), Some("TOTALORDER"));
    assert_eq!(
        find(&m, "dot_general.1").attrs.dot,
        Some(DotDims { lhs_contracting: vec![1], rhs_contracting: vec![0], ..Default::default() })
    );
    assert_eq!(find(&m, "transpose.1").attrs.dimensions, Some(vec![1, 0]));
    assert_eq!(find(&m, "dynamic_slice.1").attrs.dynamic_slice_sizes, Some(vec![2]));
    assert_eq!(find(&m, "pad.1").attrs.padding, Some(vec![PadDim { lo: 1, hi: 2, interior: 0 }]));
    assert_eq!(find(&m, "slice.1").attrs.slice, Some(vec![SliceDim { start: 0, limit: 7, stride: 2 }]));
    assert_eq!(find(&m, "iota.1").attrs.iota_dimension, Some(0));
    let sort = find(&m, "sort.5");
    assert_eq!(sort.attrs.other.get("is_stable").map(String::as_str), Some("true"));
    assert_eq!(comp_names(&m, &sort.called), ["region_5.8"]);
    let c9 = array(lit(&m, "constant.9")).to_vec::<f32>().unwrap();
    assert_eq!(&c9[..2], &[1.5, -2.0]);
    assert!(c9[2].is_infinite() && c9[2] > 0.0);
    assert!(array(lit(&m, "constant.19")).to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(m.entry_result_shape().tuple_elements().unwrap().len(), 6);
}

#[test]
fn jax_control_flow_optimized() {
    let m = sample("jax_ctrl_opt");
    let call = find(&m, "call.2");
    assert_eq!(comp_names(&m, &call.called), ["while.3_computation"]);
    assert_eq!(call.attrs.frontend_attributes.get("xla_cpu_small_call").map(String::as_str), Some("true"));
    let cond = find(&m, "cond.1.clone");
    assert_eq!(comp_names(&m, &cond.called), ["region_3.5", "region_4.6"]);
    let c = m.comps.values().find(|c| c.name == "wrapped_iota_computation").unwrap();
    assert!(c.params.is_empty());
    assert_eq!(array(lit(&m, "constant.2")).to_vec::<i32>(), Some(vec![i32::MAX]));
}

#[test]
fn jax_two_axis_mesh() {
    let m = sample("jax_mesh2");
    assert_eq!(
        find(&m, "psum.5").attrs.replica_groups,
        Some(ReplicaGroups::Explicit(vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]))
    );
    assert_eq!(
        find(&m, "reshape.2").attrs.sharding,
        Some(Sharding::Tiled {
            tile_dims: vec![1, 4, 2],
            devices: vec![0, 4, 1, 5, 2, 6, 3, 7],
            last_tile_dim_replicate: true,
            last_tile_dims: vec![],
        })
    );
    sample("jax_mesh2_opt");
}

#[test]
fn jax_spmd_mesh_axes_replica_groups() {
    sample("jax_spmd");
    let m = sample("jax_spmd_opt");
    let ar = find(&m, "all-reduce");
    let groups = ar.attrs.replica_groups.as_ref().unwrap().groups().unwrap();
    assert_eq!(groups, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
}

#[test]
fn jax_mlp_and_misc() {
    let m = sample("jax_mlp");
    assert!(m.instrs.values().any(|i| i.opcode == Opcode::Dot));
    sample("jax_mlp_opt");
    let m = sample("jax_misc");
    let c = array(lit(&m, "constant.20"));
    assert_eq!(c.shape.ty, PrimitiveType::C64);
    let parts: Vec<f32> = c.data.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(parts, [1.0, 2.0, -0.0, -3.5]);
    assert!(parts[2].is_sign_negative());
    let z = array(lit(&m, "constant.14"));
    assert_eq!(z.shape.dims, vec![0, 3]);
    assert!(z.data.is_empty());
    let ni = array(lit(&m, "constant.21")).to_vec::<f32>().unwrap();
    assert!(ni[0].is_nan() && ni[1] == f32::NEG_INFINITY);
    sample("jax_misc_opt");
}

const ATTRS: &str = r##"
HloModule attrs, replica_count=4, num_partitions=2, frontend_attributes={k="v",esc="a \"q\" \\ b"}, is_scheduled=true, entry_computation_layout={(f32[8]{0}, s32[])->(f32[8]{0})}, allow_spmd_sharding_propagation_to_output={true}, custom={a, {b}}

// A line comment.
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

/* a block comment */
%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(10)
  ROOT %lt = pred[] compare(s32[] %i, s32[] %n), direction=LT, type=SIGNED
}

body {
  p = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  v = f32[8] get-tuple-element(p), index=1
  ROOT t = (s32[], f32[8]) tuple(i2, v)
}

ENTRY %main.1 (x: f32[8], y: s32[]) -> (f32[8]) {
  x = f32[8]{0} parameter(0), sharding={devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}
  y = s32[] parameter(1), sharding={maximal device=0 metadata={op_name="y"}}
  ar0 = f32[8] all-reduce(x), replica_groups={}, to_apply=add
  ar1 = f32[8] all-reduce(x), replica_groups={{0,2},{1,3}}, channel_id=3, use_global_device_ids=true, to_apply=add
  ar2 = f32[8] all-reduce(x), replica_groups=[2,2]<=[4], to_apply=add
  ar3 = f32[8] all-reduce(x), replica_groups=[2,2]<=[2,2]T(1,0), to_apply=add, sharding={manual}
  ar4 = f32[8] all-reduce(x), to_apply=add, sharding={devices=[4]<=[4]}
  ars = f32[8] all-reduce-start(x), replica_groups={{0,1,2,3}}, to_apply=add, backend_config={"collective_backend_config":{"is_sync":true},"x":[1,2]}
  ard = f32[8] all-reduce-done(ars)
  cp = f32[8] collective-permute(x), channel_id=2, source_target_pairs={{0,1},{1,0}}, backend_config="{\"a\": 1}"
  ag = f32[16] all-gather(x), dimensions={0}, replica_groups=[1,2]<=[2]
  sl = f32[2] slice(x), slice={[0:4:2]}
  ds = f32[2] dynamic-slice(x, y), dynamic_slice_sizes={2}
  pd = f32[18] pad(x, f32[] constant(0)), padding=1_2_1
  z = s32[] constant(0)
  tup = (s32[], f32[8]) tuple(z, x)
  w = (s32[], f32[8]) while(tup), condition=%cond, body=body, metadata={op_type="while" op_name="jit(f)/while" source_file="f.py" source_line=3}
  cc = f32[8] custom-call(x), custom_call_target="xla.sdy.GlobalToLocalShape", api_version=API_VERSION_TYPED_FFI, operand_layout_constraints={f32[8]{0}}, custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"x\"}]>", b="y \"q\""}
  io = s32[4] iota(), iota_dimension=0, sharding={devices=[1,2,2]<=[4] last_tile_dims={manual}}
  cc2 = f32[2,2] constant({{1, 2}, {3, 4}})
  dt = f32[2,2] dot(f32[2,2] cc2, f32[2,2] cc2), lhs_batch_dims={}, lhs_contracting_dims={1}, rhs_batch_dims={}, rhs_contracting_dims={0}, sharding={{replicated}, {devices=[4]<=[4]}}
  u = f32[8] negate(x), control-predecessors={ar0, %cp}, sharding={unknown}, statistics={visit_state=1,stat-0=0.5}
  s1 = f32[8] sine(x), sharding={devices=[2,2]<=[2,2]T(1,0)}
  ROOT r = (f32[8]) tuple(u)
}
"##;

#[test]
fn attribute_forms() {
    let m = parse(ATTRS);
    check_structure(&m);
    // Header.
    assert_eq!(m.config.replica_count, 4);
    assert_eq!(m.config.num_partitions, 2);
    assert_eq!(m.config.frontend_attributes.get("k").map(String::as_str), Some("v"));
    assert_eq!(m.config.frontend_attributes.get("esc").map(String::as_str), Some(r#"a "q" \ b"#));
    assert_eq!(m.config.entry_computation_layout.as_deref(), Some("(f32[8]{0}, s32[])->(f32[8]{0})"));
    assert_eq!(m.config.other.get("custom").map(String::as_str), Some("{a, {b}}"));
    assert_eq!(m.entry().name, "main.1");
    assert_eq!(m.comps.values().find(|c| c.name == "cond").unwrap().params.len(), 1);

    // Replica groups.
    assert_eq!(find(&m, "ar0").attrs.replica_groups, Some(ReplicaGroups::Explicit(vec![])));
    assert_eq!(find(&m, "ar4").attrs.replica_groups, None);
    let ar1 = find(&m, "ar1");
    assert_eq!(ar1.attrs.replica_groups, Some(ReplicaGroups::Explicit(vec![vec![0, 2], vec![1, 3]])));
    assert_eq!(ar1.attrs.channel_id, Some(3));
    assert!(ar1.attrs.use_global_device_ids);
    let g2 = find(&m, "ar2").attrs.replica_groups.as_ref().unwrap();
    assert!(matches!(g2, ReplicaGroups::Iota(_)));
    assert_eq!(g2.groups().unwrap(), vec![vec![0, 1], vec![2, 3]]);
    let g3 = find(&m, "ar3").attrs.replica_groups.as_ref().unwrap();
    assert_eq!(g3.groups().unwrap(), vec![vec![0, 2], vec![1, 3]]);
    assert_eq!(g3.to_string(), "[2,2]<=[2,2]T(1,0)");

    // Shardings.
    let tiled = |dims: &[i64], devs: &[i64], rep: bool, last: &[&str]| Sharding::Tiled {
        tile_dims: dims.to_vec(),
        devices: devs.to_vec(),
        last_tile_dim_replicate: rep,
        last_tile_dims: last.iter().map(|s| s.to_string()).collect(),
    };
    assert_eq!(find(&m, "x").attrs.sharding, Some(tiled(&[2, 1, 2], &[0, 1, 2, 3], true, &[])));
    assert_eq!(find(&m, "y").attrs.sharding, Some(Sharding::Maximal { device: 0 }));
    assert_eq!(find(&m, "ar3").attrs.sharding, Some(Sharding::Manual));
    assert_eq!(find(&m, "ar4").attrs.sharding, Some(tiled(&[4], &[0, 1, 2, 3], false, &[])));
    assert_eq!(find(&m, "io").attrs.sharding, Some(tiled(&[1, 2, 2], &[0, 1, 2, 3], false, &["manual"])));
    assert_eq!(find(&m, "s1").attrs.sharding, Some(tiled(&[2, 2], &[0, 2, 1, 3], false, &[])));
    assert_eq!(
        find(&m, "dt").attrs.sharding,
        Some(Sharding::Tuple(vec![Sharding::Replicated, tiled(&[4], &[0, 1, 2, 3], false, &[])]))
    );
    assert_eq!(find(&m, "u").attrs.sharding, Some(Sharding::Other("{unknown}".into())));

    // Configs and raw attributes.
    assert_eq!(
        find(&m, "ars").attrs.backend_config.as_deref(),
        Some(r#"{"collective_backend_config":{"is_sync":true},"x":[1,2]}"#)
    );
    assert_eq!(find(&m, "cp").attrs.backend_config.as_deref(), Some(r#"{"a": 1}"#));
    assert_eq!(find(&m, "cp").attrs.source_target_pairs, Some(vec![(0, 1), (1, 0)]));
    let cc = find(&m, "cc");
    assert_eq!(cc.attrs.custom_call_target.as_deref(), Some("xla.sdy.GlobalToLocalShape"));
    assert_eq!(cc.attrs.other.get("api_version").map(String::as_str), Some("API_VERSION_TYPED_FFI"));
    assert_eq!(cc.attrs.other.get("operand_layout_constraints").map(String::as_str), Some("{f32[8]{0}}"));
    assert_eq!(cc.attrs.other.get("custom_call_has_side_effect").map(String::as_str), Some("true"));
    assert_eq!(
        cc.attrs.frontend_attributes.get("xla.sdy.sharding").map(String::as_str),
        Some(r##"#sdy.sharding<@mesh, [{"x"}]>"##)
    );
    assert_eq!(cc.attrs.frontend_attributes.get("b").map(String::as_str), Some(r#"y "q""#));
    let w = find(&m, "w");
    assert_eq!(comp_names(&m, &w.called), ["cond", "body"]);
    assert_eq!(
        w.attrs.metadata.as_deref(),
        Some(r#"{op_type="while" op_name="jit(f)/while" source_file="f.py" source_line=3}"#)
    );
    let u = find(&m, "u");
    let preds: Vec<&str> = u.attrs.control_predecessors.iter().map(|&p| m.instr(p).name.as_str()).collect();
    assert_eq!(preds, ["ar0", "cp"]);
    assert_eq!(u.attrs.other.get("statistics").map(String::as_str), Some("{visit_state=1,stat-0=0.5}"));
    let lt = find(&m, "lt");
    assert_eq!(lt.attrs.comparison_type.as_deref(), Some("SIGNED"));
    assert_eq!(lt.operands.len(), 2);

    // Shapes of array attributes.
    assert_eq!(find(&m, "sl").attrs.slice, Some(vec![SliceDim { start: 0, limit: 4, stride: 2 }]));
    assert_eq!(find(&m, "ds").attrs.dynamic_slice_sizes, Some(vec![2]));
    assert_eq!(find(&m, "ag").attrs.dimensions, Some(vec![0]));
    let pd = find(&m, "pd");
    assert_eq!(pd.attrs.padding, Some(vec![PadDim { lo: 1, hi: 2, interior: 1 }]));
    // The nested `f32[] constant(0)` operand became its own instruction, before its user.
    let c0 = m.instr(pd.operands[1]);
    assert_eq!(c0.opcode, Opcode::Constant);
    assert!(pd.operands[1] < m.entry().instrs.iter().copied().find(|&i| m.instr(i).name == "pd").unwrap());
    assert_eq!(
        find(&m, "dt").attrs.dot,
        Some(DotDims { lhs_batch: vec![], rhs_batch: vec![], lhs_contracting: vec![1], rhs_contracting: vec![0] })
    );
    assert_eq!(find(&m, "io").attrs.iota_dimension, Some(0));
    assert_eq!(m.instr(m.entry().root).name, "r");
}

#[test]
fn called_computation_order_and_kinds() {
    let m = parse(
        r#"HloModule m
ENTRY e {
  p = s32[] parameter(0)
  x = f32[2] parameter(1)
  c = f32[2] conditional(p, x, x, x), branch_computations={b2, %b0, b1}
  pr = pred[] parameter(2)
  c2 = f32[2] conditional(pr, x, x), true_computation=b1, false_computation=b0
  f = f32[2] fusion(x), kind=kLoop, calls=b0
  ROOT k = f32[2] call(x), to_apply=b2
}
%b0 (a: f32[2]) -> f32[2], execution_thread="main" {
  ROOT a = f32[2] parameter(0)
}
b1 {
  a = f32[2] parameter(0)
  ROOT n = f32[2] negate(a)
}
b2 {
  a = f32[2] parameter(0)
  ROOT n = f32[2] abs(a)
}
"#,
    );
    assert_eq!(comp_names(&m, &find(&m, "c").called), ["b2", "b0", "b1"]);
    assert_eq!(comp_names(&m, &find(&m, "c2").called), ["b1", "b0"]);
    assert_eq!(comp_names(&m, &find(&m, "f").called), ["b0"]);
    assert_eq!(m.entry().name, "e");
    assert_eq!(m.entry().params.len(), 3);
    // Names may repeat across computations.
    assert_eq!(m.instrs.values().filter(|i| i.name == "a").count(), 3);
}

#[test]
fn root_defaults_to_last_and_layout_suffixes() {
    let m = parse(
        "HloModule m\nENTRY e {\n  a = f32[2,3]{1,0:T(8,128)} parameter(0)\n  b = f32[2,3]{0,1:S(1)} copy(a)\n  t = token[] after-all()\n  e = () tuple()\n  n = f32[2,3] negate(b)\n}\n",
    );
    assert_eq!(m.instr(m.entry().root).name, "n");
    assert_eq!(find(&m, "a").shape.as_array().unwrap().layout, Some(vec![1, 0]));
    assert_eq!(find(&m, "b").shape.as_array().unwrap().layout, Some(vec![0, 1]));
    assert_eq!(find(&m, "t").shape, Shape::Token);
    assert_eq!(find(&m, "e").shape, Shape::Tuple(vec![]));
    assert_eq!(find(&m, "n").shape.as_array().unwrap().layout, None);
}

#[test]
fn mesh_axes_replica_groups() {
    let groups = |rg: &str| {
        let src = format!(
            "HloModule m\nadd {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}}\nENTRY e {{\n  x = f32[] parameter(0)\n  ROOT r = f32[] all-reduce(x), replica_groups={rg}, to_apply=add\n}}\n"
        );
        let m = parse(&src);
        find(&m, "r").attrs.replica_groups.clone().unwrap().groups().unwrap()
    };
    assert_eq!(groups("mesh['a'=2,'b'=4] {'b'}"), vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!(groups("mesh[a=2,b=4] {a}"), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    assert_eq!(groups("mesh[a=2,b=4] {b,a}"), vec![vec![0, 4, 1, 5, 2, 6, 3, 7]]);
    assert_eq!(groups("mesh[a=2,b=4] {}"), (0..8).map(|i| vec![i]).collect::<Vec<_>>());
    assert_eq!(groups("mesh[x=8] {x:(2)2}"), vec![vec![0, 2], vec![1, 3], vec![4, 6], vec![5, 7]]);
    assert_eq!(groups("mesh[x=8] {x:(1)2}"), vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
    assert_eq!(groups("mesh[a=2,b=2], device_ids=(3,2,1,0) {b}"), vec![vec![3, 2], vec![1, 0]]);
    assert_eq!(groups("mesh[a=2,b=2], device_ids=([2,2]<=[2,2]T(1,0)) {b}"), vec![vec![0, 2], vec![1, 3]]);
    assert_eq!(groups("maximal_mesh[device_id=3] {}"), vec![vec![3]]);
}

const LITERALS: &str = r#"HloModule lits
ENTRY e {
  s0 = f32[] constant(1)
  s1 = f32[] constant(-2.5)
  s2 = f32[] constant(1e-05)
  s3 = pred[] constant(true)
  s4 = f32[] constant(inf)
  s5 = f32[] constant(-inf)
  s6 = f32[] constant(nan)
  s7 = f32[] constant(-nan)
  s8 = f32[] constant(nan(0x1234))
  s9 = f64[] constant(0.1)
  a1 = s32[3] constant({1, 2, 3})
  a2 = s32[2,2]{1,0} constant({ { 1, 2 }, { 3, 4 } })
  a3 = f32[0] constant({})
  a4 = f32[2,0] constant({ {}, {} })
  a5 = f32[0,3] constant({  })
  t1 = (f32[], s32[2]) constant(( 1, {2,3} ))
  t2 = ((pred[], (u8[])), f32[1]) constant(((true, (7)), {0.5}))
  h1 = bf16[3] constant({1.00390625, 1.01171875, -3})
  h2 = f16[2] constant({65504, 1e-8})
  h3 = bf16[] constant(nan)
  p1 = pred[4] constant({true, false, 1, 0})
  i1 = s8[2] constant({-128, 127})
  i2 = u64[1] constant({18446744073709551615})
  i3 = s64[1] constant({-9223372036854775808})
  i4 = s4[3] constant({-8, 7, -1})
  i5 = u4[2] constant({0, 15})
  i6 = u16[] constant(+7)
  e1 = f8e4m3fn[4] constant({1, -2, 448, 0.0017})
  e2 = f8e5m2[3] constant({1, -inf, 57344})
  e3 = f8e4m3fnuz[2] constant({-0, 1})
  c1 = c128[] constant((1.5, -2))
  ROOT r = f32[] add(s0, s1)
}
"#;

#[test]
fn literal_forms() {
    let m = parse(LITERALS);
    let f32s = |n: &str| array(lit(&m, n)).to_vec::<f32>().unwrap();
    let bits = |n: &str| f32s(n)[0].to_bits();
    assert_eq!(f32s("s0"), [1.0]);
    assert_eq!(f32s("s1"), [-2.5]);
    assert_eq!(f32s("s2"), [1e-5]);
    assert_eq!(array(lit(&m, "s3")).data, [1]);
    assert_eq!(f32s("s4"), [f32::INFINITY]);
    assert_eq!(f32s("s5"), [f32::NEG_INFINITY]);
    assert_eq!(bits("s6"), 0x7fc0_0000);
    assert_eq!(bits("s7"), 0xffc0_0000);
    assert_eq!(bits("s8"), 0x7f80_1234);
    assert_eq!(array(lit(&m, "s9")).to_vec::<f64>(), Some(vec![0.1]));
    assert_eq!(array(lit(&m, "a1")).to_vec::<i32>(), Some(vec![1, 2, 3]));
    assert_eq!(array(lit(&m, "a2")).to_vec::<i32>(), Some(vec![1, 2, 3, 4]));
    assert_eq!(array(lit(&m, "a2")).shape.layout, Some(vec![1, 0]));
    for z in ["a3", "a4", "a5"] {
        assert!(array(lit(&m, z)).data.is_empty());
    }
    let Literal::Tuple(t1) = lit(&m, "t1") else { panic!("tuple") };
    assert_eq!(array(&t1[0]).to_vec::<f32>(), Some(vec![1.0]));
    assert_eq!(array(&t1[1]).to_vec::<i32>(), Some(vec![2, 3]));
    let Literal::Tuple(t2) = lit(&m, "t2") else { panic!("tuple") };
    let Literal::Tuple(inner) = &t2[0] else { panic!("nested tuple") };
    assert_eq!(array(&inner[0]).data, [1]);
    assert_eq!(t2[0].leaves().len(), 2);
    assert_eq!(array(&t2[1]).to_vec::<f32>(), Some(vec![0.5]));
    // bf16 rounds to nearest even: 1.00390625 is a tie between 1.0 and 1.0078125 -> 1.0.
    let h1 = array(lit(&m, "h1")).to_vec::<half::bf16>().unwrap();
    assert_eq!(h1.iter().map(|h| h.to_bits()).collect::<Vec<_>>(), [0x3f80, 0x3f82, 0xc040]);
    let h2 = array(lit(&m, "h2")).to_vec::<half::f16>().unwrap();
    assert_eq!(h2[0].to_f32(), 65504.0);
    assert_eq!(h2[1].to_bits(), 0);
    assert!(array(lit(&m, "h3")).to_vec::<half::bf16>().unwrap()[0].is_nan());
    assert_eq!(array(lit(&m, "p1")).data, [1, 0, 1, 0]);
    assert_eq!(array(lit(&m, "i1")).to_vec::<i8>(), Some(vec![-128, 127]));
    assert_eq!(array(lit(&m, "i2")).to_vec::<u64>(), Some(vec![u64::MAX]));
    assert_eq!(array(lit(&m, "i3")).to_vec::<i64>(), Some(vec![i64::MIN]));
    assert_eq!(array(lit(&m, "i4")).data, [0xF8, 0x07, 0xFF]);
    assert_eq!(array(lit(&m, "i5")).data, [0, 15]);
    assert_eq!(array(lit(&m, "i6")).to_vec::<u16>(), Some(vec![7]));
    // 0.0017 = 0.87 * 2^-9: rounds to the smallest subnormal.
    assert_eq!(array(lit(&m, "e1")).data, [0x38, 0xC0, 0x7E, 0x01]);
    assert_eq!(array(lit(&m, "e2")).data, [0x3C, 0xFC, 0x7B]);
    assert_eq!(array(lit(&m, "e3")).data, [0x00, 0x40]);
    let c1 = array(lit(&m, "c1"));
    assert_eq!(c1.data.len(), 16);
    assert_eq!(f64::from_le_bytes(c1.data[8..].try_into().unwrap()), -2.0);
    // The literal's shape is the instruction's.
    for i in m.instrs.values() {
        if let Some(l) = &i.attrs.literal {
            assert_eq!(l.shape(), i.shape, "{}", i.name);
        }
    }
}

#[test]
fn every_element_type_parses_in_shapes() {
    for t in PrimitiveType::ALL {
        let ty = t.name();
        let src = format!("HloModule m\nENTRY e {{\n  ROOT p = {ty}[] parameter(0)\n}}\n");
        let m = parse(&src);
        let shape = &m.instr(m.entry().root).shape;
        if t == PrimitiveType::Token {
            assert_eq!(*shape, Shape::Token);
        } else {
            assert_eq!(shape.as_array().unwrap().ty, t);
        }
    }
}

#[test]
fn opcodes_all_parse() {
    for &op in Opcode::ALL {
        let src =
            format!("HloModule m\nENTRY e {{\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] {}(x)\n}}\n", op.name());
        let m = match op {
            Opcode::Parameter | Opcode::Constant => continue,
            _ => parse(&src),
        };
        assert_eq!(m.instr(m.entry().root).opcode, op);
    }
}

#[test]
fn parse_text_runs_the_verifier_on_valid_input() {
    // hlo::parse_text = text::parse + verify; a simple valid module passes both.
    let src =
        std::fs::read_to_string(format!("{}/tests/text_samples/jax_simple.hlo", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let m = hlo::parse_text("jax_simple.hlo", &src).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.entry().name, "main.2");
}

#[test]
fn window_attribute() {
    let m = parse(
        r#"HloModule m
add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ENTRY e {
  x = f32[8] parameter(0)
  z = f32[] constant(0)
  cs = f32[8] reduce-window(x, z), window={size=8 pad=7_0}, to_apply=add
  y = f32[4,6] parameter(1)
  all = f32[10,1] reduce-window(y, z), window={size=2x3 stride=1x2 pad=2_2x-1_0 lhs_dilate=2x1 rhs_dilate=1x2 rhs_reversal=0x1}, to_apply=add
  s = f32[] parameter(2)
  ROOT sc = f32[] reduce-window(s, z), window={}, to_apply=add
}"#,
    );
    let w = |name: &str| hlo::Window::of(&find(&m, name).attrs).unwrap_or_else(|e| panic!("{name}: {e}"));
    let dim = |size, stride, pad_lo, pad_hi, base_dilation, window_dilation, reversal| hlo::WindowDim {
        size,
        stride,
        pad_lo,
        pad_hi,
        base_dilation,
        window_dilation,
        reversal,
    };
    // Fields left out take XLA's defaults.
    assert_eq!(w("cs").dims, [dim(8, 1, 7, 0, 1, 1, false)]);
    assert_eq!(w("cs").output_dims(&[8]), Ok(vec![8]));
    assert_eq!(w("all").dims, [dim(2, 1, 2, 2, 2, 1, false), dim(3, 2, -1, 0, 1, 2, true)]);
    // Dimension 0: 4 dilated by 2 is 7, padded 11, windows of 2 → 10; dimension 1: 6 less one
    // of padding is 5, a window of 3 dilated by 2 is 5 → 1.
    assert_eq!(w("all").output_dims(&[4, 6]), Ok(vec![10, 1]));
    assert_eq!(w("sc").dims, []);
    assert_eq!(w("sc").output_dims(&[]), Ok(vec![]));
    assert_eq!(comp_names(&m, &find(&m, "cs").called), ["add"]);

    let bad = |raw: &str| {
        let mut a = hlo::Attrs::default();
        a.other.insert("window".into(), raw.into());
        hlo::Window::of(&a).unwrap_err()
    };
    assert!(bad("{size=2 stride=1x1}").contains("stride= has 2 entries for a window of 1 dimensions"));
    assert!(bad("{stride=2}").contains("without size="));
    assert!(bad("{size=2 pad=1}").contains("padding '1' is not lo_hi"));
    assert!(bad("{size=a}").contains("'a' is not an integer"));
    assert!(bad("{size=2 size=2}").contains("more than once"));
    assert!(bad("{size=2 dilate=2}").contains("unknown field 'dilate'"));
    assert!(bad("{size=2 rhs_reversal=2}").contains("is not 0 or 1"));
    assert!(bad("size=2").contains("no braces"));
    assert!(hlo::Window::of(&hlo::Attrs::default()).unwrap_err().contains("needs a window={...} attribute"));
    let zero = hlo::Window { dims: vec![dim(0, 1, 0, 0, 1, 1, false)] };
    assert!(zero.output_dims(&[4]).unwrap_err().contains("window dimension 0 has size=0"));
    let neg = hlo::Window { dims: vec![dim(1, 1, -3, -2, 1, 1, false)] };
    assert!(neg.output_dims(&[4]).unwrap_err().contains("negative size -1"));
    let wide = hlo::Window { dims: vec![dim(5, 1, 0, 0, 1, 1, false)] };
    assert_eq!(wide.output_dims(&[4]), Ok(vec![0]));
    assert!(wide.output_dims(&[4, 4]).unwrap_err().contains("1 dimensions for an input of rank 2"));
}

#[test]
fn mesh_shardings_of_newer_xla() {
    // XLA's dumps of mid-2026 print parameters' shardings with a mesh first.
    let text = "HloModule m, num_partitions=4\n\nENTRY e {\n  \
        p = f32[8,4]{1,0} parameter(0), sharding={mesh[], replicated}\n  \
        q = f32[8,4]{1,0} parameter(1), sharding={mesh[a=2,b=2], [{a}, {}]}\n  \
        ROOT t = (f32[8,4]{1,0}, f32[8,4]{1,0}) tuple(p, q)\n}\n";
    let m = hlo::parse_text("m.hlo", text).expect("parses");
    assert_eq!(find(&m, "p").attrs.sharding, Some(Sharding::Replicated));
    assert_eq!(find(&m, "q").attrs.sharding, Some(Sharding::Other("{mesh[a=2,b=2], [{a}, {}]}".into())));
}
