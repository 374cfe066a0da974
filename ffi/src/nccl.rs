//! NCCL, loaded by absolute path (see [`crate::libs`]): the shared collective-library core
//! ([`crate::ccl`]) on CUDA streams. Only what the fallback and the benchmark need: one
//! communicator set per clique of local devices (`ncclCommInitAll`), grouped all-reduce /
//! all-gather / reduce-scatter, and point-to-point send / recv issued inside one group
//! ([`Comms::exchange`]).

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::Result;
use crate::ccl::{CclStream, Lib};
pub use crate::ccl::{Comm, DataType, P2p, RedOp};
use crate::cuda::Stream;

/// One NCCL communicator per local device of a clique.
pub type Comms = crate::ccl::Comms<Stream>;

fn lib() -> Result<&'static Lib> {
    static LIB: OnceLock<Result<Lib>> = OnceLock::new();
    LIB.get_or_init(|| Lib::load(crate::libs::nccl()?, "libnccl", "NCCL")).as_ref().map_err(Clone::clone)
}

impl CclStream for Stream {
    fn raw(&self) -> *mut c_void {
        self.s as *mut c_void
    }
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn lib() -> Result<&'static Lib> {
        lib()
    }
}

/// NCCL's version code (e.g. 22703 for 2.27.3).
pub fn version() -> Result<i32> {
    lib()?.version()
}
