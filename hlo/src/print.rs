//! The text forms the IR's diagnostics and `Display`s share with XLA's HLO text: names, integer lists, replica groups,
//! shapes without layouts. The module printer that reads back through the parser is test code
//! (`hlo-tests/tests/support/print.rs`): the golden filetests and the front ends' round trips use it; nothing the
//! product runs prints a module.

use crate::types::{ArrayShape, Shape};

/// `name` with one leading `%` (names are stored without it).
pub fn pct(name: &str) -> String {
    format!("%{}", name.strip_prefix('%').unwrap_or(name))
}

pub fn join<T: ToString>(v: &[T], sep: &str) -> String {
    v.iter().map(T::to_string).collect::<Vec<_>>().join(sep)
}

/// `{1,2,3}`.
pub fn int_list<T: ToString>(v: &[T]) -> String {
    format!("{{{}}}", join(v, ","))
}

/// `{{0,1},{2,3}}`, as XLA prints replica groups.
pub fn group_list<T: ToString>(groups: &[Vec<T>]) -> String {
    format!("{{{}}}", groups.iter().map(|g| int_list(g)).collect::<Vec<_>>().join(","))
}

/// A shape without layouts, as XLA writes computation signatures.
pub fn shape_without_layout(s: &Shape) -> String {
    match s {
        Shape::Array(a) => array_without_layout(a),
        Shape::Token => "token[]".into(),
        Shape::Tuple(t) => format!("({})", t.iter().map(shape_without_layout).collect::<Vec<_>>().join(", ")),
    }
}

/// `f32[2,3]`: an array shape without its layout.
pub fn array_without_layout(a: &ArrayShape) -> String {
    format!("{}[{}]", a.ty, join(&a.dims, ","))
}
