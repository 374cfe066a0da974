//! `tools::xla_run::flatten`: a module with tuple parameters and results, flattened for PJRT and nested back.

use hlo::wire::{fields, hlo_computation, hlo_module};
use hlo::{Array, Literal, Shape};
use pjrt_sys::protos::xla;
use prost::Message;

use tools::xla_run::flatten::*;

const NESTED: &str = r#"HloModule tuple_io, entry_computation_layout={(f32[2]{0}, (s32[3]{0}, (pred[2]{0}, f32[])))->(f32[2]{0}, (s32[3]{0}, pred[2]{0}), (f32[]))}

ENTRY main {
  a = f32[2] parameter(0)
  t = (s32[3], (pred[2], f32[])) parameter(1)
  t0 = s32[3] get-tuple-element(t), index=0
  t1 = (pred[2], f32[]) get-tuple-element(t), index=1
  t10 = pred[2] get-tuple-element(t1), index=0
  t11 = f32[] get-tuple-element(t1), index=1
  b = f32[2] broadcast(t11), dimensions={}
  s = f32[2] add(a, b)
  inner = (s32[3], pred[2]) tuple(t0, t10)
  one = (f32[]) tuple(t11)
  ROOT r = (f32[2], (s32[3], pred[2]), (f32[])) tuple(s, inner, one)
}
"#;

fn encode(text: &str) -> Vec<u8> {
    let m = hlo::parse_text("t.hlo", text).expect("parse");
    hlo::encode_proto(&m).expect("encode")
}

#[test]
fn a_nested_interface_becomes_flat_and_keeps_its_meaning() {
    let bytes = encode(NESTED);
    let flat = entry(&bytes).expect("flatten").expect("needs flattening");
    let m = hlo::decode_proto("flat", &flat).expect("XLA's form: decodes and verifies");
    let params: Vec<(&str, Vec<i64>)> =
        m.entry_param_shapes().iter().filter_map(|s| s.as_array()).map(|a| (a.ty.name(), a.dims.clone())).collect();
    assert_eq!(params, [("f32", vec![2]), ("s32", vec![3]), ("pred", vec![2]), ("f32", vec![])]);
    let root = m.entry_result_shape();
    assert_eq!(root.tuple_elements().map(|e| e.len()), Some(4));
    assert!(root.tuple_elements().unwrap_or_default().iter().all(|e| !e.is_tuple()), "{root}");
    // The old root's leaves, in order, through get-tuple-element chains.
    let leaf_path = |mut id: hlo::InstrId| {
        let mut path = Vec::new();
        while m.instr(id).opcode == hlo::Opcode::GetTupleElement {
            path.push(m.instr(id).attrs.tuple_index.unwrap_or(-1));
            id = m.instr(id).operands[0];
        }
        path.reverse();
        (m.instr(id).name.clone(), path)
    };
    let r = m.instr(m.entry().root);
    let paths: Vec<_> = r.operands.iter().map(|&o| leaf_path(o)).collect();
    let want = |p: &[i64]| ("r".to_owned(), p.to_vec());
    assert_eq!(paths, vec![want(&[0]), want(&[1, 0]), want(&[1, 1]), want(&[2, 0])]);
    // The old tuple parameter is the tuple of the new ones, numbered after `a`.
    let t = m.entry().instrs.iter().copied().find(|&i| m.instr(i).name == "t").expect("t");
    assert_eq!(m.instr(t).opcode, hlo::Opcode::Tuple);
    let numbers = |i: hlo::InstrId| -> Vec<Option<i64>> {
        m.instr(i).operands.iter().map(|&o| m.instr(o).attrs.parameter_number).collect()
    };
    assert_eq!(numbers(t)[0], Some(1));
    assert_eq!(m.instr(m.instr(t).operands[1]).opcode, hlo::Opcode::Tuple);
    assert_eq!(numbers(m.instr(t).operands[1]), [Some(2), Some(3)]);
    // The program shapes XLA compiles for say the same.
    let p = xla::HloModuleProto::decode(flat.as_slice()).expect("prost");
    let host = p.host_program_shape.expect("host_program_shape");
    assert_eq!(host.parameters.len(), 4);
    assert_eq!(host.parameter_names.len(), 4);
    let result = host.result.expect("result");
    assert_eq!(result.tuple_shapes.len(), 4);
    assert!(result.tuple_shapes.iter().all(|s| s.tuple_shapes.is_empty()));
    let comp = p.computations.iter().find(|c| c.id == p.entry_computation_id).expect("entry");
    assert_eq!(comp.program_shape.as_ref().map(|s| s.parameters.len()), Some(4));
    let root = comp.instructions.iter().find(|i| i.id == comp.root_id).expect("root");
    assert_eq!((root.opcode.as_str(), root.operand_ids.len()), ("tuple", 4));
    // Ids stay unique in the module.
    let mut ids: Vec<i64> = p.computations.iter().flat_map(|c| c.instructions.iter().map(|i| i.id)).collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n);
}

#[test]
fn fields_the_protos_do_not_know_pass_through() {
    // Field 999 (varint 7) on the module and on every instruction.
    let unknown = [0xb8, 0x3e, 7];
    let mut bytes = hlo::wire::map_field::<String>(&encode(NESTED), hlo_module::COMPUTATIONS, &mut |c| {
        hlo::wire::map_field(c, hlo_computation::INSTRUCTIONS, &mut |i| Ok([i, &unknown[..]].concat()))
    })
    .expect("edit");
    bytes.extend_from_slice(&unknown);
    let flat = entry(&bytes).expect("flatten").expect("needs flattening");
    let top = fields(&flat).expect("fields");
    assert!(top.iter().any(|f| f.number == 999));
    let comp = top.iter().find(|f| f.number == hlo_module::COMPUTATIONS).and_then(|f| f.message()).expect("comp");
    let mut old = 0;
    for i in fields(comp).expect("fields").iter().filter(|f| f.number == hlo_computation::INSTRUCTIONS) {
        old += usize::from(fields(i.message().unwrap_or_default()).expect("fields").iter().any(|f| f.number == 999));
    }
    assert_eq!(old, 11, "every old instruction, the tuple parameter turned tuple included");
}

#[test]
fn a_flat_interface_is_left_alone() {
    let text = "HloModule m\n\nENTRY e {\n  a = f32[2] parameter(0)\n  ROOT t = (f32[2], f32[2]) tuple(a, a)\n}\n";
    assert_eq!(entry(&encode(text)), Ok(None));
    assert!(entry(b"\x08").is_err(), "not a module");
}

#[test]
fn aliased_modules_are_refused() {
    let mut p = xla::HloModuleProto::decode(encode(NESTED).as_slice()).expect("prost");
    p.input_output_alias = Some(xla::HloInputOutputAliasProto {
        entries: vec![xla::hlo_input_output_alias_proto::AliasEntryProto {
            output_shape_index: vec![0],
            parameter_number: 0,
            ..Default::default()
        }],
    });
    let e = entry(&p.encode_to_vec()).unwrap_err();
    assert!(e.contains("input/output aliases"), "{e}");
}

#[test]
fn values_cross_the_flattening() {
    let a = |v: f32| Array::from_slice(vec![1], &[v]);
    let nested = Literal::Tuple(vec![
        Literal::Array(a(1.0)),
        Literal::Tuple(vec![Literal::Array(a(2.0)), Literal::Tuple(vec![Literal::Array(a(3.0))])]),
    ]);
    let flat: Vec<Array> = flat_args(std::slice::from_ref(&nested)).expect("flat").into_iter().cloned().collect();
    assert_eq!(flat, vec![a(1.0), a(2.0), a(3.0)]);
    assert_eq!(nest(&nested.shape(), &mut flat.into_iter()), Ok(nested));
    assert!(flat_args(&[Literal::Token]).is_err());
    assert!(nest(&Shape::Token, &mut std::iter::empty()).is_err());
}
