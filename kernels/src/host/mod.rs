//! The host protocol: Peerless's collectives between XLA:CPU's devices, on XLA's own buffers. [`protocol`] is written
//! once over two meeting places, [`direct`] (one process) and [`shm`] (processes of one host), with the GPU kernels'
//! rules: one-writer flags (Release / Acquire, compared "at least", never reset), per-member epochs, a deadline on
//! every wait. [`reduce`] is the one place reductions live, [`layout`] the strided runs of split dimensions.

pub mod direct;
mod layout;
mod protocol;
mod reduce;
#[cfg(target_os = "linux")]
pub mod shm;

/// Formats a group as `{0,1,2,3}`.
pub(crate) use hlo::print::int_list as fmt_group;
