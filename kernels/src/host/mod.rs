//! The host protocol: Peerless's collectives between XLA:CPU's devices, on XLA's own buffers.
//!
//! [`protocol`] is written once ([`protocol::Plan`]: what a collective computes;
//! [`protocol::run`]: how members meet) over two meeting places: [`direct`], the devices of
//! one process (each device's program is a thread of XLA:CPU; peer access is a pointer), and
//! [`shm`], processes of one host (POSIX shared memory). It follows the GPU kernels'
//! synchronisation rules: signal flags with one writer each, written with `Release`, read with
//! `Acquire` and compared "at least" (wrapping-aware), never reset; per-member epochs; and a
//! deadline on every wait, whose error names the ranks that never arrived. [`reduce`] is the
//! one place reductions live, [`layout`] the strided runs of split dimensions.

pub mod direct;
mod layout;
mod protocol;
mod reduce;
#[cfg(target_os = "linux")]
pub mod shm;

/// Formats a group as `{0,1,2,3}`.
pub(crate) fn fmt_group(group: &[usize]) -> String {
    format!("{{{}}}", group.iter().map(usize::to_string).collect::<Vec<_>>().join(","))
}
