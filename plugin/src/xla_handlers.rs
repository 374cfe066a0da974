//! The typed-FFI handlers XLA calls for Peerless custom calls, one per platform and target,
//! and the per-platform facts the pass needs (peer access).
//!
//! Each handler is a C function over [`thunks::ffi_handler::dispatch`] with the platform's
//! runtime; `ffi::xla_ffi::guard_with_traits` answers the metadata probe and turns errors
//! and panics into XLA errors.

use std::collections::BTreeSet;
use std::sync::Arc;

use emitter::PeerAccessTable;
use ffi::xla_ffi::{XLA_FFI_CallFrame, XLA_FFI_Error};
use kernels::xla_host::HostRuntime;
use thunks::CollectiveKind;
use thunks::custom_call::target_kind;
use thunks::ffi_handler::{CollectiveRuntime, dispatch};

static HOST: HostRuntime = HostRuntime;

/// Runs `kind`'s handler with `rt`.
///
/// # Safety
/// `frame` is the call frame XLA passed to a handler, valid for the call.
unsafe fn call(kind: CollectiveKind, frame: *mut XLA_FFI_CallFrame, rt: &dyn CollectiveRuntime) -> *mut XLA_FFI_Error {
    // SAFETY: the caller's contract (a live call frame from XLA).
    unsafe { ffi::xla_ffi::guard_with_traits(frame, rt.traits(), |f| dispatch(kind, f, rt)) }
}

macro_rules! handlers {
    ($rt:expr; $($name:ident => $kind:ident),* $(,)?) => {
        $(
            /// # Safety
            /// Called by XLA with a live call frame.
            unsafe extern "C" fn $name(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
                // SAFETY: XLA calls handlers with a call frame valid for the call.
                unsafe { call(CollectiveKind::$kind, frame, $rt) }
            }
        )*
    };
}

handlers! { &HOST;
    cpu_all_reduce => AllReduce,
    cpu_all_gather => AllGather,
    cpu_all_to_all => AllToAll,
    cpu_reduce_scatter => ReduceScatter,
    cpu_collective_permute => CollectivePermute,
}

/// A typed-FFI handler as XLA registers it.
pub type Handler = unsafe extern "C" fn(*mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error;

/// The handler of `target` on `platform` (`"cpu"`), or `None`.
pub fn handler(platform: &str, target: &str) -> Option<Handler> {
    let kind = target_kind(target)?;
    let cpu: Handler = match kind {
        CollectiveKind::AllReduce => cpu_all_reduce,
        CollectiveKind::AllGather => cpu_all_gather,
        CollectiveKind::AllToAll => cpu_all_to_all,
        CollectiveKind::ReduceScatter => cpu_reduce_scatter,
        CollectiveKind::CollectivePermute => cpu_collective_permute,
        CollectiveKind::RaggedAllToAll | CollectiveKind::CollectiveBroadcast => return None,
    };
    match platform {
        "cpu" => Some(cpu),
        _ => None,
    }
}

/// The peer-access table the pass decides with on `platform`: `None` on CPU (one address
/// space: every device reaches every other).
pub fn peer_table(platform: &str, _local: Option<&BTreeSet<usize>>) -> Option<Arc<PeerAccessTable>> {
    match platform {
        "cpu" => None,
        _ => None,
    }
}
