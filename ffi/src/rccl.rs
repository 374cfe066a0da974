//! RCCL (feature `rocm`), the ROCm fallback: the same C API as NCCL, so the shared
//! collective-library core ([`crate::ccl`]) on HIP streams, loaded by absolute path through
//! [`crate::libs::rccl`] with a clear error when it is absent.

use std::ffi::c_void;
use std::sync::OnceLock;

use crate::Result;
use crate::ccl::{CclStream, Lib};
pub use crate::ccl::{DataType, P2p, RedOp};
use crate::hip::Stream;

/// One RCCL communicator per local device of a clique.
pub type Comms = crate::ccl::Comms<Stream>;

fn lib() -> Result<&'static Lib> {
    static LIB: OnceLock<Result<Lib>> = OnceLock::new();
    LIB.get_or_init(|| Lib::load(crate::libs::rccl()?, "librccl", "RCCL")).as_ref().map_err(Clone::clone)
}

impl CclStream for Stream {
    fn raw(&self) -> *mut c_void {
        self.s
    }
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn lib() -> Result<&'static Lib> {
        lib()
    }
}

/// Whether RCCL can be loaded.
pub fn present() -> bool {
    lib().is_ok()
}

/// RCCL's version code (NCCL's scheme, e.g. 21804 for 2.18.4).
pub fn version() -> Result<i32> {
    lib()?.version()
}
