//! Peerless's HLO front end: one IR (typed indices into arenas) built from XLA's HLO
//! text or from a binary `HloModuleProto`, and a verifier that checks every
//! instruction's shape rule before anything downstream sees the module, a
//! printer back to HLO text ([`print::module_text`]) that the parser reads back
//! to the same IR, and an encoder back to `HloModuleProto` ([`encode_proto`]) for
//! XLA's PJRT plugins. Analyses of a verified module live here too: collectives' device
//! groups ([`analysis`]) and the shape of each partition's entry arguments
//! ([`sharding`]).
//!
//! Invariants for consumers: a [`Module`] returned by [`parse_text`] or
//! [`decode_proto`] has passed [`verify::verify`]; every operand id refers to an
//! instruction of the same computation that precedes its user; every called
//! computation exists; shapes are consistent with XLA's shape inference.

pub mod analysis;
pub mod diag;
#[cfg(feature = "proto")]
pub mod encode;
pub mod ir;
pub mod literal;
pub mod opcode;
pub mod print;
#[cfg(feature = "proto")]
pub mod proto;
pub mod sharding;
pub mod text;
pub mod types;
pub mod verify;
#[cfg(feature = "proto")]
pub mod wire;

pub use diag::{Error, ErrorKind};
pub use ir::*;
pub use literal::{Array, Element, Literal};
pub use opcode::Opcode;
pub use print::{PrintOptions, module_text};
pub use types::{ArrayShape, PrimitiveType, Shape};

/// Parses HLO text and verifies it. `file` names the source in diagnostics.
pub fn parse_text(file: &str, src: &str) -> Result<Module, Error> {
    let module = text::parse(file, src)?;
    verify::verify(&module).map_err(|e| e.with_source(src))?;
    Ok(module)
}

/// Decodes a serialized `HloModuleProto` and verifies it.
#[cfg(feature = "proto")]
pub fn decode_proto(file: &str, bytes: &[u8]) -> Result<Module, Error> {
    let module = proto::decode(file, bytes)?;
    verify::verify(&module)?;
    Ok(module)
}

/// Encodes a module as a serialized `HloModuleProto` (what XLA's PJRT plugins compile).
#[cfg(feature = "proto")]
pub fn encode_proto(module: &Module) -> Result<Vec<u8>, Error> {
    encode::encode(module)
}

/// Reads a module from a file: HLO text, or a binary `HloModuleProto` when the
/// content is not UTF-8 text (or the name ends in `.pb`).
pub fn load_file(path: &std::path::Path) -> Result<Module, Error> {
    let name = path.display().to_string();
    let bytes =
        std::fs::read(path).map_err(|e| Error::new(ErrorKind::Parse, &name, format!("cannot read file: {e}")))?;
    let is_pb = path.extension().is_some_and(|e| e == "pb");
    match (is_pb, std::str::from_utf8(&bytes)) {
        (false, Ok(text)) => parse_text(&name, text),
        _ => {
            #[cfg(feature = "proto")]
            {
                decode_proto(&name, &bytes)
            }
            #[cfg(not(feature = "proto"))]
            {
                Err(Error::new(
                    ErrorKind::Unsupported,
                    &name,
                    "binary HloModuleProto input needs the `proto` feature of peerless-hlo",
                ))
            }
        }
    }
}
