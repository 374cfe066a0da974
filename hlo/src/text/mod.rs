//! HLO text parser: reads the text XLA prints (`HloModule::ToString`, JAX's `as_hlo_text()`, optimized dumps with
//! layouts and stack-frame indices) and hand-written modules into the [`Module`] IR, unverified.
//!
//! Every error is a [`ErrorKind::Parse`](crate::ErrorKind::Parse) error at `file:line:col` with the offending line and
//! a caret under the token. The parser never panics and never recurses more than 64 levels deep, whatever the input.
//!
//! Representation notes for consumers:
//! - `replica_groups={}` is `Some(ReplicaGroups::Explicit(vec![]))` (all devices); an absent attribute is `None`. The
//!   mesh-axes form (`mesh[a=2,b=4] {b}`) is converted to the equivalent iota form (explicit groups when the mesh has
//!   its own `device_ids` order).
//! - `Instruction::called` is in the order to_apply, calls, condition, body, true_computation, false_computation,
//!   branch_computations (as written), select, scatter (select-and-scatter), called_computations.
//! - `metadata`, braced `backend_config` and unknown attributes are kept verbatim (braces included); quoted values
//!   (`backend_config="..."`, frontend attribute values, `custom_call_target`) are unescaped.
//! - `entry_computation_layout` is kept verbatim without its outer braces.
//! - Layout tiling/memory-space suffixes (`{1,0:T(8,128)}`) are dropped; only minor-to-major numbers are kept. XLA's
//!   stack-frame index sections are skipped.
//! - s4/u4 constants hold one sign-/zero-extended byte per element.

/// `return Err(c.err_range(start, end, &format!(..)))`: a parse error over `src[start..end]`.
macro_rules! fail {
    ($c:expr, $start:expr, $end:expr, $fmt:literal $(, $arg:expr)* $(,)?) => {
        return Err($c.err_range($start, $end, &format!($fmt $(, $arg)*)))
    };
}

mod attrs;
mod cursor;
mod literal;
mod parser;

pub use cursor::{is_ident_char, is_ident_start};
pub use literal::F8Format;

use crate::{Error, Module};

/// Parses HLO text into an unverified module. `file` names the source in diagnostics.
pub fn parse(file: &str, src: &str) -> Result<Module, Error> {
    let mut c = cursor::Cursor::new(file, src);
    parser::parse_module(&mut c)
}

/// Whether `s` is exactly one `{...}` group as the parser reads one (brackets matched, quoted strings skipped whole).
/// The printer writes such values (a braced `backend_config`, a frontend attribute's `{...}` value) verbatim, knowing
/// they read back unchanged.
pub fn is_braced_group(s: &str) -> bool {
    let mut c = cursor::Cursor::new("", s);
    s.starts_with('{') && c.balanced().is_ok() && c.pos == s.len()
}
