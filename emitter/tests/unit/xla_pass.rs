use prost::Message;

use super::*;

#[test]
fn dependencies_order_chains_and_keep_independent_collectives_apart() {
    // Two independent chains (psum, pmax) in the entry, an all-gather after the psums,
    // and a psum in a loop body (see psum_chains_independent.expected for the slots).
    let pb = include_bytes!("../xla_pass/psum_chains_independent.pb");
    let index = Index::new(pb).unwrap();
    let id = |n: &str| index.instrs.iter().find(|(_, i)| i.name == n).unwrap().0;
    let names = ["psum_invariant.21", "psum_invariant.22", "pmax.14", "pmax.15", "all_gather.3", "psum_invariant.18"];
    let d = dependencies(&index, &names.map(id));
    let precedes = |a: &str, b: &str| d.precedes(id(a), id(b));
    assert!(precedes("psum_invariant.21", "psum_invariant.22") && precedes("psum_invariant.22", "all_gather.3"));
    assert!(precedes("pmax.14", "pmax.15") && !precedes("pmax.15", "pmax.14"));
    for (a, b) in [("psum_invariant.21", "pmax.15"), ("pmax.14", "psum_invariant.22"), ("pmax.15", "all_gather.3")] {
        assert!(!precedes(a, b) && !precedes(b, a), "{a} {b}");
    }
    let entry = d.entry.unwrap();
    assert_eq!(d.ancestors[&id("pmax.14")].0, entry);
    let body = d.ancestors[&id("psum_invariant.18")].0;
    assert_ne!(body, entry);
    assert!(d.runs_alone(entry) && d.runs_alone(body));
}

#[test]
fn pinned_shapes_carry_a_layout_on_every_array() {
    let decode = |b: &[u8]| xla::ShapeProto::decode(b).unwrap();
    // s32[4,2,3] without a layout gets the row-major one; one with a layout keeps it.
    let mut bare = Vec::new();
    put_varint(&mut bare, hlo::wire::shape::ELEMENT_TYPE, 4);
    put_ints(&mut bare, hlo::wire::shape::DIMENSIONS, [4, 2, 3]);
    let pinned = decode(&with_layout(&bare).unwrap());
    assert_eq!(pinned.layout.unwrap().minor_to_major, [2, 1, 0]);
    let mut laid = bare.clone();
    let mut layout = Vec::new();
    put_ints(&mut layout, hlo::wire::layout::MINOR_TO_MAJOR, [1, 2, 0]);
    put_bytes(&mut laid, hlo::wire::shape::LAYOUT, &layout);
    assert_eq!(with_layout(&laid).unwrap(), laid);
    // A scalar gets an empty layout (present, so XLA sees it set); a tuple's leaves each
    // get theirs; a token none.
    let mut scalar = Vec::new();
    put_varint(&mut scalar, hlo::wire::shape::ELEMENT_TYPE, 11);
    assert!(decode(&with_layout(&scalar).unwrap()).layout.is_some_and(|l| l.minor_to_major.is_empty()));
    let mut tuple = Vec::new();
    put_varint(&mut tuple, hlo::wire::shape::ELEMENT_TYPE, hlo::wire::enums::TUPLE_TYPE);
    put_bytes(&mut tuple, hlo::wire::shape::TUPLE_SHAPES, &bare);
    put_bytes(&mut tuple, hlo::wire::shape::TUPLE_SHAPES, &laid);
    let t = decode(&with_layout(&tuple).unwrap());
    let leaves: Vec<Vec<i64>> = t.tuple_shapes.into_iter().map(|s| s.layout.unwrap().minor_to_major).collect();
    assert_eq!(leaves, [vec![2, 1, 0], vec![1, 2, 0]]);
    let mut token = Vec::new();
    put_varint(&mut token, hlo::wire::shape::ELEMENT_TYPE, hlo::wire::enums::TOKEN_TYPE);
    assert_eq!(with_layout(&token).unwrap(), token);
    // An operand the computation does not hold is an error naming the call.
    let mut ins = Vec::new();
    let err = pin_operands(&mut ins, &[7], &HashMap::new(), "all-to-all.3").unwrap_err();
    assert!(err.to_string().contains("'all-to-all.3': operand 7"), "{err}");
}
