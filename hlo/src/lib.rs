//! Peerless's HLO front end: one IR built from HLO text or a binary `HloModuleProto`, a verifier of every shape rule, an
//! encoder ([`encode_proto`]) for XLA's plugins, and
//! analyses ([`analysis`], [`sharding`]). A [`Module`] from [`parse_text`] or [`decode_proto`] has passed
//! [`verify::verify`]: operands refer to earlier instructions of the same computation, called computations exist,
//! shapes match XLA's inference.

/// Declares a fieldless enum from one table of variants and their spellings, with `ALL` (every variant, in table
/// order), `name` (the spelling) and `from_name` (its inverse).
macro_rules! named_enum {
    ($(#[$attr:meta])* pub enum $ty:ident { $($(#[$vattr:meta])* $variant:ident => $name:literal,)* }) => {
        $(#[$attr])*
        pub enum $ty { $($(#[$vattr])* $variant,)* }

        impl $ty {
            /// Every variant, in table order.
            pub const ALL: [Self; [$($name,)*].len()] = [$(Self::$variant,)*];

            pub fn name(self) -> &'static str {
                match self { $(Self::$variant => $name,)* }
            }

            pub fn from_name(s: &str) -> Option<Self> {
                match s { $($name => Some(Self::$variant),)* _ => None }
            }
        }
    };
}

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

/// Reads a module from a file: HLO text, or a binary `HloModuleProto` when the content is not UTF-8 text (or the name
/// ends in `.pb`).
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
