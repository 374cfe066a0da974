//! The HLO text printer: every module Peerless reads (the hlo-tests cases, the text samples
//! and fixtures, and their `HloModuleProto` forms) prints to text that parses and verifies
//! back to the same IR, and printing that again gives the same text; a few prints are
//! checked against XLA's spelling.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cranelift_entity::EntityRef;
use hlo::{Attrs, CompId, InstrId, Literal, Module, ModuleConfig, Opcode, Shape, Sharding};
use hlo_tests::print::{PrintOptions, module_text, module_text_with};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Files with extension `ext` in `dir`, sorted.
fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    v
}

/// An instruction with ids replaced by names, so that modules whose arenas are numbered
/// differently (the printer reorders computations) compare equal.
#[derive(Debug, PartialEq)]
struct Instr {
    name: String,
    opcode: Opcode,
    shape: Shape,
    operands: Vec<String>,
    called: Vec<String>,
    control_predecessors: Vec<String>,
    /// Everything else (control predecessors cleared: they are ids).
    attrs: Attrs,
}

#[derive(Debug, PartialEq)]
struct Comp {
    is_entry: bool,
    params: Vec<String>,
    root: String,
    instrs: Vec<Instr>,
}

#[derive(Debug, PartialEq)]
struct Canon {
    name: String,
    config: ModuleConfig,
    comps: BTreeMap<String, Comp>,
}

fn canon(m: &Module) -> Canon {
    let iname = |id| m.instr(id).name.clone();
    let cname = |id| m.comp(id).name.clone();
    let comps = m
        .comps
        .iter()
        .map(|(id, c)| {
            let instrs = c
                .instrs
                .iter()
                .map(|&i| {
                    let ins = m.instr(i);
                    let mut attrs = ins.attrs.clone();
                    let control_predecessors = attrs.control_predecessors.drain(..).map(iname).collect();
                    Instr {
                        name: ins.name.clone(),
                        opcode: ins.opcode,
                        shape: ins.shape.clone(),
                        operands: ins.operands.iter().map(|&o| iname(o)).collect(),
                        called: ins.called.iter().map(|&c| cname(c)).collect(),
                        control_predecessors,
                        attrs,
                    }
                })
                .collect();
            let comp = Comp {
                is_entry: id == m.entry,
                params: c.params.iter().map(|&p| iname(p)).collect(),
                root: iname(c.root),
                instrs,
            };
            (c.name.clone(), comp)
        })
        .collect();
    Canon { name: m.name.clone(), config: m.config.clone(), comps }
}

/// Asserts that two modules hold the same IR, naming the first difference.
fn assert_same(what: &str, a: &Module, b: &Module) {
    let (ca, cb) = (canon(a), canon(b));
    if ca == cb {
        return;
    }
    assert_eq!(ca.name, cb.name, "{what}: module name");
    assert_eq!(ca.config, cb.config, "{what}: module config");
    assert_eq!(ca.comps.keys().collect::<Vec<_>>(), cb.comps.keys().collect::<Vec<_>>(), "{what}: computations");
    for (name, x) in &ca.comps {
        let y = &cb.comps[name];
        for (i, j) in x.instrs.iter().zip(&y.instrs) {
            assert_eq!(i, j, "{what}: computation {name}, instruction {}", i.name);
        }
        assert_eq!(x, y, "{what}: computation {name}");
    }
}

/// print → parse → same IR, and print → parse → print → same text. Returns the text.
fn round_trip(what: &str, m: &Module) -> String {
    let text = module_text(m);
    let back = hlo::parse_text(&format!("{what} (printed)"), &text)
        .unwrap_or_else(|e| panic!("{what}: printed text does not parse: {e}\n{text}"));
    assert_same(what, m, &back);
    let again = module_text(&back);
    assert_eq!(text, again, "{what}: printing the reparsed module changed the text");
    text
}

fn load(path: &Path) -> Module {
    hlo::load_file(path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn text_cases_round_trip() {
    let mut dirs = vec![root().join("cases"), root().join("../hlo/tests/text_samples")];
    dirs.push(root().join("../hlo/tests/fixtures"));
    let mut n = 0;
    for dir in dirs {
        for path in files(&dir, "hlo") {
            round_trip(&path.display().to_string(), &load(&path));
            n += 1;
        }
    }
    assert!(n >= 90, "only {n} text modules found");
}

#[test]
fn proto_goldens_round_trip() {
    let dirs =
        [root().join("goldens"), root().join("../hlo/tests/fixtures"), root().join("../hlo/tests/fixtures/jax011")];
    let mut n = 0;
    for dir in dirs {
        for path in files(&dir, "pb") {
            round_trip(&path.display().to_string(), &load(&path));
            n += 1;
        }
    }
    assert!(n >= 80, "only {n} protos found");
}

/// Parses `text` and requires the printer to give it back unchanged: `text` is written as
/// XLA prints (attribute order, spacing, `%` names, signatures), so this checks the spelling.
fn fixed_point(text: &str) -> Module {
    let m = hlo::parse_text("fixed_point", text).unwrap_or_else(|e| panic!("{e}"));
    let printed = module_text(&m);
    if printed != text {
        for (i, (a, b)) in printed.lines().zip(text.lines()).enumerate() {
            assert_eq!(a, b, "line {}", i + 1);
        }
        assert_eq!(printed, text);
    }
    round_trip("fixed_point", &m);
    m
}

#[test]
fn prints_every_attribute_as_xla_does() {
    fixed_point(
        r#"HloModule attrs, is_scheduled=true, entry_computation_layout={(f32[4,8]{1,0}, s32[4]{0})->f32[4]{0}}, replica_count=2, num_partitions=4, frontend_attributes={a="x \"y\"",b={k = 1}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}

%less (x: f32[], y: f32[]) -> pred[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %lt = pred[] compare(%x, %y), direction=LT, type=TOTALORDER
}

%then (t: f32[4]) -> f32[4] {
  ROOT %t = f32[4] parameter(0)
}

%else (e: f32[4]) -> f32[4] {
  %e = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%e)
}

%cond (s: (s32[], f32[4])) -> pred[] {
  %s = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (s: (s32[], f32[4])) -> (s32[], f32[4]) {
  %s = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %x = f32[4] get-tuple-element(%s), index=1
  %one = s32[] constant(1)
  %i1 = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[4]) tuple(%i1, %x)
}

ENTRY %main (p0: f32[4,8], p1: s32[4]) -> f32[4] {
  %p0 = f32[4,8]{1,0} parameter(0), sharding={devices=[2,2]<=[2,2]T(1,0)}
  %p1 = s32[4]{0} parameter(1), sharding={{replicated}, {maximal device=1}}
  %zero = f32[] constant(0)
  %s = f32[2,4] slice(%p0), slice={[0:4:2], [0:4:1]}
  %pd = f32[5,4] pad(%s, %zero), padding=1_1_1x0_0_0
  %t = f32[8,4] transpose(%p0), dimensions={1,0}
  %d = f32[4,4] dot(%p0, %t), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %io = s32[4] iota(), iota_dimension=0
  %c = pred[4] compare(%p1, %io), direction=GE
  %r = f32[4] reduce(%d, %zero), dimensions={1}, to_apply=%add
  %ar = f32[4] all-reduce(%r), channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0), use_global_device_ids=true, to_apply=%add
  %cp = f32[4] collective-permute(%ar), channel_id=2, source_target_pairs={{0,1},{1,0}}
  %ag = f32[8] all-gather(%cp), channel_id=3, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}, use_global_device_ids=true
  %rs = f32[4] reduce-scatter(%ag), channel_id=4, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, dimensions={0}, to_apply=%add
  %i0 = s32[] constant(1)
  %ds = f32[2] dynamic-slice(%rs, %i0), dynamic_slice_sizes={2}
  %pr = pred[] constant(true)
  %cd = f32[4] conditional(%pr, %rs, %rs), true_computation=%then, false_computation=%else
  %k = s32[] constant(0)
  %bi = s32[] constant(1)
  %bc = f32[4] conditional(%bi, %cd, %cd), branch_computations={%then, %else}
  %wi = (s32[], f32[4]) tuple(%k, %bc)
  %w = (s32[], f32[4]) while(%wi), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %wx = f32[4] get-tuple-element(%w), index=1
  %cc = (f32[4], s32[4]) custom-call(%wx, %p1), custom_call_target="peerless.all_reduce", custom_call_has_side_effect=true, api_version=API_VERSION_TYPED_FFI, backend_config={algorithm = "one_shot", groups = array<i64: 0, 1, 2, 3>, group_size = 4 : i64, instance = 12345 : i64, reduction = "sum"}
  %g = f32[4] get-tuple-element(%cc), index=0
  %so = f32[4] sort(%g), dimensions={0}, is_stable=true, to_apply=%less
  %kc = (f32[2], s32[], pred[2,2]) constant(( {1.5, -0}, 7, { { 1, 0 }, { 0, 1 } } ))
  ROOT %out = f32[4] add(%so, %g), sharding={devices=[2,1,2]3,1,2,0 last_tile_dim_replicate}, frontend_attributes={k="v"}, control-predecessors={%cp, %ds}, metadata={op_name="jit(f)/add" source_file="f.py" source_line=3}, backend_config="not \"json\"\t\001"
}
"#,
    );
}

fn case(name: &str) -> Module {
    load(&root().join(format!("cases/{name}.hlo")))
}

#[test]
fn jax_dump_prints_callees_first_with_signatures() {
    let text = module_text(&case("jax_psum_2x4_y_gather_x"));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "HloModule jit__lambda, entry_computation_layout={(f32[4,8]{1,0})->(f32[2,2]{1,0}, f32[4,8]{1,0})}, \
         frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<[\"x\"=2, \"y\"=4]>}}"
    );
    let heads: Vec<&str> = lines.iter().copied().filter(|l| l.ends_with('{') && !l.starts_with(' ')).collect();
    assert_eq!(
        heads,
        [
            "%region_0.1 (psum.2: f32[], psum.3: f32[]) -> f32[] {",
            "%xla.sdy.manual_computation_body.2 (shard_map.2: f32[2,2]) -> (f32[2,2], f32[4,2]) {",
            "ENTRY %main.3 (a.1: f32[4,8]) -> (f32[2,2], f32[4,8]) {",
        ]
    );
    for want in [
        "  %psum.5 = f32[2,2]{1,0} all-reduce(%shard_map.2), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, \
         use_global_device_ids=true, to_apply=%region_0.1",
        "  %all_gather.1 = f32[4,2]{1,0} all-gather(%shard_map.2), channel_id=1, \
         replica_groups={{0,4},{1,5},{2,6},{3,7}}, dimensions={0}, use_global_device_ids=true",
        "  %a.1 = f32[4,8]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}, \
         frontend_attributes={xla.sdy.sharding=\"#sdy.sharding<@mesh, [{\\\"x\\\"}, {\\\"y\\\"}]>\"}",
        "  ROOT %tuple.3 = (f32[2,2]{1,0}, f32[4,8]{1,0}) tuple(%shard_map.14, %shard_map.15)",
    ] {
        assert!(lines.contains(&want), "missing line\n{want}\nin\n{text}");
    }
    assert!(text.ends_with("}\n") && lines.last() == Some(&"}"));
}

#[test]
fn constants_and_iota_groups_print_in_full() {
    let text = module_text(&case("constants_arrays"));
    for want in [
        "  %k = f32[2,3] constant({ { 1, -2.5, 300 }, { -0.125, 0, 0.0015 } })",
        "  %i3 = s32[2,2,2] constant({ { { 1, -2 }, { 3, -4 } }, { { 5, -6 }, { 7, 2147483647 } } })",
        "  %pr = pred[4] constant({1, 0, 0, 1})",
        "  %hf = f16[3] constant({0.1, -2, 1024})",
        "  %sp = f32[4] constant({inf, -inf, nan, -0})",
        "  %d = f64[2] constant({1.7976931348623157e308, -5e-324})",
        "  %e = f32[0] constant({})",
    ] {
        assert!(text.lines().any(|l| l == want), "missing line\n{want}\nin\n{text}");
    }
    let text = module_text(&case("all_reduce_iota_groups"));
    assert!(text.contains("  %r1 = f32[6] all-reduce(%x), replica_groups=[2,2]<=[2,2]T(1,0), to_apply=%add_f32\n"));
}

#[test]
fn short_form_input_prints_canonically() {
    // No `%`, no signatures, a nested operand, the mesh-axes replica-group form, an
    // attribute Peerless does not model, a quoted backend config that is JSON.
    let m = hlo::parse_text(
        "short",
        r#"HloModule short, num_partitions=8
add { a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b) }
ENTRY main {
  x = f32[8] parameter(0)
  ar = f32[8] all-reduce(f32[8] negate(x)), channel_id=1, replica_groups=mesh[a=2,b=4] {a}, use_global_device_ids=true, to_apply=add, backend_config="{\"x\": 1}", custom_thing={1, 2}
  ROOT y = f32[8] add(ar, x)
}"#,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let text = round_trip("short", &m);
    assert_eq!(
        text,
        r#"HloModule short, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8] parameter(0)
  %negate.nested0 = f32[8] negate(%x)
  %ar = f32[8] all-reduce(%negate.nested0), channel_id=1, replica_groups=[4,2]<=[2,4]T(1,0), use_global_device_ids=true, custom_thing={1, 2}, to_apply=%add, backend_config={"x": 1}
  ROOT %y = f32[8] add(%ar, %x)
}
"#
    );
}

#[test]
fn options_and_single_item_printers() {
    let m = hlo::parse_text(
        "opts",
        "HloModule opts\nENTRY main {\n  a = f32[2] parameter(0)\n  \
         ROOT n = f32[2] negate(a), metadata={op_name=\"neg\"}\n}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let opts = PrintOptions { metadata: false, operand_shapes: true };
    assert_eq!(
        module_text_with(&m, &opts),
        "HloModule opts\n\nENTRY %main (a: f32[2]) -> f32[2] {\n  %a = f32[2] parameter(0)\n  \
         ROOT %n = f32[2] negate(f32[2] %a)\n}\n"
    );
    // The default options print every instruction's metadata, and the computation as in the module.
    assert_eq!(
        module_text(&m),
        "HloModule opts\n\nENTRY %main (a: f32[2]) -> f32[2] {\n  %a = f32[2] parameter(0)\n  \
         ROOT %n = f32[2] negate(%a), metadata={op_name=\"neg\"}\n}\n"
    );
}

/// The custom call the Peerless HLO pass emits: a typed-FFI call with an MLIR-dictionary
/// backend config, over operands and results of any shape (tuples included).
#[test]
fn peerless_custom_call_round_trips() {
    let m = fixed_point(
        r#"HloModule pass_out, num_partitions=4

ENTRY %main (a: f32[8], b: (f32[4], s32[2])) -> (f32[8], (f32[4], s32[2])) {
  %a = f32[8] parameter(0)
  %b = (f32[4], s32[2]) parameter(1)
  ROOT %ar = (f32[8], (f32[4], s32[2])) custom-call(%a, %b), custom_call_target="peerless.all_reduce", api_version=API_VERSION_TYPED_FFI, backend_config={algorithm = "one_shot", groups = array<i64: 0, 1, 2, 3>, group_size = 4 : i64, instance = 12345 : i64, reduction = "sum"}
}
"#,
    );
    let ar = &m.instrs[m.entry().root];
    assert_eq!(ar.attrs.custom_call_target.as_deref(), Some("peerless.all_reduce"));
    assert_eq!(ar.attrs.custom_call_api_version(), Ok(hlo::CustomCallApiVersion::TypedFfi));
    assert_eq!(ar.attrs.other.get("custom_call_has_side_effect"), None);
    assert_eq!(
        ar.attrs.backend_config.as_deref(),
        Some(
            r#"{algorithm = "one_shot", groups = array<i64: 0, 1, 2, 3>, group_size = 4 : i64, instance = 12345 : i64, reduction = "sum"}"#
        )
    );
}

/// A typed-FFI custom call read from an `HloModuleProto` keeps its API version, side effect,
/// schedule, operand layouts and output aliasing (fields the IR does not type), and prints
/// them as XLA's text does.
#[test]
fn proto_custom_call_attributes_round_trip() {
    use pjrt_sys::protos::xla as pb;
    use prost::Message;
    let f32s = |dims: &[i64]| pb::ShapeProto {
        element_type: 11,
        dimensions: dims.to_vec(),
        is_dynamic_dimension: vec![false; dims.len()],
        layout: Some(Box::new(pb::LayoutProto {
            minor_to_major: (0..dims.len() as i64).rev().collect(),
            ..Default::default()
        })),
        ..Default::default()
    };
    let instr = |id: i64, opcode: &str, shape: pb::ShapeProto| pb::HloInstructionProto {
        id,
        name: format!("i{id}"),
        opcode: opcode.into(),
        shape: Some(shape),
        ..Default::default()
    };
    let backend = r#"{algorithm = "one_shot", groups = array<i64: 0, 1>, reduction = "sum"}"#;
    let cc = pb::HloInstructionProto {
        operand_ids: vec![1],
        custom_call_target: "peerless.all_reduce".into(),
        custom_call_api_version: pb::CustomCallApiVersion::ApiVersionTypedFfi as i32,
        custom_call_has_side_effect: true,
        custom_call_schedule: pb::CustomCallSchedule::ScheduleLatest as i32,
        operand_shapes_with_layout: vec![f32s(&[4])],
        output_operand_aliasing: vec![pb::OutputOperandAliasing {
            output_shape_index: vec![],
            operand_index: 0,
            operand_shape_index: vec![],
        }],
        backend_config: backend.as_bytes().to_vec(),
        ..instr(2, "custom-call", f32s(&[4]))
    };
    let param = pb::HloInstructionProto { parameter_number: 0, ..instr(1, "parameter", f32s(&[4])) };
    let bytes = pb::HloModuleProto {
        name: "m".into(),
        entry_computation_name: "main".into(),
        entry_computation_id: 1,
        computations: vec![pb::HloComputationProto {
            name: "main".into(),
            instructions: vec![param, cc],
            id: 1,
            root_id: 2,
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec();
    let m = hlo::decode_proto("m.pb", &bytes).unwrap_or_else(|e| panic!("{e}"));
    let root = &m.instrs[m.entry().root];
    assert_eq!(root.attrs.custom_call_api_version(), Ok(hlo::CustomCallApiVersion::TypedFfi));
    assert_eq!(root.attrs.other.get("custom_call_has_side_effect").map(String::as_str), Some("true"));
    let text = round_trip("m.pb", &m);
    let want = format!(
        "  ROOT %i2 = f32[4]{{0}} custom-call(%i1), custom_call_target=\"peerless.all_reduce\", \
         operand_layout_constraints={{f32[4]{{0}}}}, custom_call_has_side_effect=true, \
         output_to_operand_aliasing={{{{}}: (0, {{}})}}, schedule=SCHEDULE_LATEST, \
         api_version=API_VERSION_TYPED_FFI, backend_config={backend}\n"
    );
    assert!(text.contains(&want), "{text}");
}

#[test]
fn custom_call_api_version_is_checked() {
    let text = "HloModule m\nENTRY main {\n  a = f32[2] parameter(0)\n  \
                ROOT c = f32[2] custom-call(a), custom_call_target=\"t\", api_version=API_VERSION_NEW\n}\n";
    let e = hlo::parse_text("m", text).unwrap_err();
    assert!(e.message.contains("unknown api_version=API_VERSION_NEW"), "{e}");
}

#[test]
fn malformed_modules_print_without_panicking() {
    let mut m = hlo::parse_text(
        "m",
        "HloModule m\nr {\n  ROOT a = f32[] parameter(0)\n}\nENTRY e {\n  p = f32[2] parameter(0)\n  \
         c = f32[2] constant({1, 2})\n  ROOT s = f32[2] add(p, c), sharding={devices=[2]0,1}\n}\n",
    )
    .unwrap();
    let root = m.entry().root;
    let c = m.entry().instrs[1];
    m.instrs[root].operands.push(InstrId::new(999));
    m.instrs[root].called = vec![CompId::new(99), CompId::new(0)];
    m.instrs[root].attrs.control_predecessors.push(InstrId::new(998));
    m.instrs[root].attrs.sharding = Some(Sharding::Tiled {
        tile_dims: vec![i64::MAX, 4, -1],
        devices: vec![0, 1],
        last_tile_dim_replicate: false,
        last_tile_dims: vec![],
    });
    if let Some(Literal::Array(a)) = &mut m.instrs[c].attrs.literal {
        a.shape.dims = vec![1 << 40];
    }
    m.comps[CompId::new(0)].root = InstrId::new(12345);
    let text = module_text(&m);
    assert!(text.contains("constant({...})") && text.contains("%<invalid %999>"), "{text}");
    m.entry = CompId::new(77);
    module_text(&m);
}
