//! HLO text parser (stub: filled in by the parser work).
use crate::{Error, ErrorKind, Module};

/// Parses HLO text into an unverified module.
pub fn parse(file: &str, _src: &str) -> Result<Module, Error> {
    Err(Error::new(ErrorKind::Unsupported, file, "HLO text parser not built yet"))
}
