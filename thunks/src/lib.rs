//! Thunks: plain-data collective configs and the prepare / initialize / execute
//! interface that every backend runs. Filled by the emitter/thunk issue.

/// XLA's three thunk phases, in the order a runtime drives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Declare resources (scratch, signal flags, communicators).
    Prepare,
    /// Allocate and load, once per executable and device.
    Initialize,
    /// Launch only.
    Execute,
}
