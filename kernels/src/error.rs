//! The crate's one error type, [`Error`]: host device memory, collective calls, cross-process meetings, XLA:CPU custom
//! calls, the GPU layer and the host executor all fail with it, so a caller matches one enum and an error that wraps
//! another keeps it as its `source`.
//!
//! Messages name what failed (the collective, the device, the call); callers, tests and Python tests match on their
//! text, so it is part of the interface.

use std::time::Duration;

use thunks::CollectiveOp;

use crate::host::fmt_group;

/// `%name`, unless the name already carries the sigil.
fn pct(name: &str) -> String {
    if name.starts_with('%') { name.to_string() } else { format!("%{name}") }
}

/// Every failure of the `kernels` crate.
// Not `Clone` or `PartialEq`: `ffi::Error` is not comparable, and no caller copies errors (tests compare `Ok` values
// with `matches!`, errors by structure or message).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // Host memory (staging buffers).
    /// The allocator refused a host buffer of `arena_bytes` (per device, `num_devices` of them).
    #[error("cannot allocate {arena_bytes} bytes of device memory for each of {num_devices} devices")]
    Alloc { num_devices: usize, arena_bytes: usize },

    // One collective call (host protocols, in one process or across processes). Every variant names the collective.
    /// A wait passed the call's deadline. `missing` are the ranks whose signal never came; `group` is the waiting
    /// rank's group (for collective-permute, its source/target pair).
    #[error(
        "{op} {} timed out after {} ms on rank {waiting_rank} waiting for ranks {missing:?} of group {}",
        pct(collective),
        timeout.as_millis(),
        fmt_group(group)
    )]
    Timeout {
        collective: String,
        op: CollectiveOp,
        group: Vec<usize>,
        waiting_rank: usize,
        missing: Vec<usize>,
        timeout: Duration,
    },
    /// The call does not fit its config, its regions or the cluster.
    #[error("{op} {} on rank {rank}: {reason}", pct(collective))]
    Invalid { collective: String, op: CollectiveOp, rank: usize, reason: String },
    /// The host backend has no implementation for this op, type or reduction.
    #[error("{op} {} on rank {rank}: unsupported: {reason}", pct(collective))]
    Unsupported { collective: String, op: CollectiveOp, rank: usize, reason: String },
    /// The collective's memory could not be reached or allocated; `source` is the device memory error (boxed: the enum
    /// holds itself; in a `source()` chain it is the `Box<Error>`).
    #[error("{op} {}: {source}", pct(collective))]
    Memory {
        collective: String,
        op: CollectiveOp,
        #[source]
        source: Box<Error>,
    },

    // Meetings of the processes of one host (`host::shm`).
    /// These devices' processes never posted to `host::shm::exchange` within the timeout.
    #[error("the processes of devices {devices:?} never posted within the timeout")]
    ExchangeMissing { devices: Vec<usize> },
    /// A shared-memory segment could not be opened, or belongs to something else.
    #[error("{0}")]
    Segment(String),

    // XLA:CPU's custom calls (`xla_host`).
    /// A custom call whose buffers, shapes or attributes do not fit its collective; `name` is the collective's.
    #[error("{name}: {message}")]
    BadCall { name: String, message: String },

    // The GPU layer (`gpu`, `cuda`, `rocm`).
    /// A value or state the GPU layer refuses (clique size, a kernel's status, no module).
    #[error("{0}")]
    Gpu(String),
    /// A driver, runtime or compiler call failed.
    #[error(transparent)]
    Ffi(#[from] ffi::Error),
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether a peer never arrived: a collective's wait passed its deadline, or an exchange's processes never posted.
    /// Callers report these as deadline errors and prefer any other error as the root cause.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. } | Error::ExchangeMissing { .. })
    }

    /// The ranks (device ids) that never arrived, for [`Error::Timeout`] and [`Error::ExchangeMissing`]; `None` for
    /// every other error.
    pub fn missing(&self) -> Option<&[usize]> {
        match self {
            Error::Timeout { missing, .. } => Some(missing),
            Error::ExchangeMissing { devices } => Some(devices),
            _ => None,
        }
    }

    /// Whether the caller's input is at fault (a call, collective or argument that does not fit, or an unsupported op),
    /// not the runtime.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::Invalid { .. } | Error::Unsupported { .. } | Error::BadCall { .. })
    }
}
