//! Verifier (stub: filled in by the verifier work).
use crate::{Error, Module};

/// Checks structure and every instruction's shape rule.
pub fn verify(_module: &Module) -> Result<(), Error> {
    Ok(())
}
