//! Unit tests of the CLI's `report` (included by path from src/report.rs).

use super::*;

#[test]
fn table_aligns_columns() {
    let t = table(&["a", "bee"], &[vec!["long cell".into(), "x".into()]]);
    assert_eq!(t, "a          bee\n---------  ---\nlong cell  x\n");
}

#[test]
fn preview_formats_types() {
    assert_eq!(preview(&Array::from_slice(vec![3], &[1i32, -2, 3]), 2), "[1, -2, … (3 elements)]");
    assert_eq!(preview(&Array::from_slice(vec![1], &[true]), 4), "[true]");
    assert_eq!(preview(&Array::from_slice(vec![1], &[half::bf16::from_f32(1.5)]), 4), "[1.5]");
}
