//! HloModuleProto decoder (stub: filled in by the proto work).
use crate::{Error, ErrorKind, Module};

/// Decodes a serialized `HloModuleProto` into an unverified module.
pub fn decode(file: &str, _bytes: &[u8]) -> Result<Module, Error> {
    Err(Error::new(ErrorKind::Unsupported, file, "proto decoder not built yet"))
}
