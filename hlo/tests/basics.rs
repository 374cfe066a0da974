//! The small pieces: primitive types and shapes, literals, opcodes, diagnostics.

use hlo::ErrorKind;
use hlo::diag::Error;
use hlo::ir::Span;
use hlo::literal::Array;
use hlo::opcode::Opcode;
use hlo::types::{ArrayShape, PrimitiveType, Shape};

#[test]
fn names_round_trip() {
    for t in PrimitiveType::ALL {
        assert_eq!(PrimitiveType::from_name(t.name()), Some(t));
    }
    assert_eq!(PrimitiveType::from_name("f7"), None);
}

#[test]
fn shape_display_and_sizes() {
    let mut a = ArrayShape::new(PrimitiveType::F32, vec![2, 3, 4]);
    assert_eq!(a.byte_size(), 96);
    a.layout = Some(vec![2, 1, 0]);
    assert_eq!(a.to_string(), "f32[2,3,4]{2,1,0}");
    let t = Shape::Tuple(vec![Shape::Array(a), Shape::array(PrimitiveType::Pred, vec![])]);
    assert_eq!(t.to_string(), "(f32[2,3,4]{2,1,0}, pred[])");
    assert_eq!(t.leaves().len(), 2);
}

#[test]
fn round_trip_typed() {
    let a = Array::from_slice(vec![2, 2], &[1.0f32, 2.0, 3.0, 4.0]);
    assert_eq!(a.data.len(), 16);
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    assert!(a.to_vec::<i32>().is_none());
    let b = Array::from_slice(vec![3], &[true, false, true]);
    assert_eq!(b.data, vec![1, 0, 1]);
    assert!(Array::new(ArrayShape::new(PrimitiveType::F32, vec![2]), vec![0; 7]).is_err());
}

#[test]
fn names_are_unique_and_round_trip() {
    let mut seen = std::collections::HashSet::new();
    for &op in Opcode::ALL {
        assert!(seen.insert(op.name()), "duplicate {}", op.name());
        assert_eq!(Opcode::from_name(op.name()), Some(op));
    }
}

#[test]
fn caret_under_column() {
    let src = "HloModule m\n\nENTRY e {\n  x = f32[2] bogus()\n}\n";
    let e = Error::at(ErrorKind::Parse, "t.hlo", src, Span { line: 4, col: 14, len: 5 }, "unknown opcode 'bogus'");
    let s = e.to_string();
    assert!(s.starts_with("t.hlo:4:14: parse error: unknown opcode 'bogus'"), "{s}");
    assert!(s.ends_with("\n  |   x = f32[2] bogus()\n  |              ^^^^^"), "{s}");
}
