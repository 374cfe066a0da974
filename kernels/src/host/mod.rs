//! The host protocols: Peerless's collectives between XLA:CPU's devices, on XLA's own buffers.
//!
//! [`direct`] runs them between the devices of one process (each device's program is a
//! thread of XLA:CPU; peer access is a pointer), [`shm`] between processes of one host
//! (POSIX shared memory). They follow the GPU kernels' synchronisation rules
//! (`shared/research/collective_anchors.md` §1–§4): signal flags with one writer each,
//! written with `Release`, read with `Acquire` and compared "at least" (wrapping-aware), never
//! reset; per-member epochs counted on the device side; no host-side coordination inside a
//! collective beyond a wake-up hint; and a deadline on every wait, whose error names the ranks
//! that never arrived. [`reduce`] is the one place reductions live, [`layout`] the strided
//! runs of split dimensions.
//!
//! (Issue 26 retired the arena-backed simulation of GPU memory, `HostCluster` and its
//! protocols, with the standalone host executor.)

pub mod direct;
mod layout;
mod reduce;
#[cfg(target_os = "linux")]
pub mod shm;

/// Formats a group as `{0,1,2,3}`.
pub(crate) fn fmt_group(group: &[usize]) -> String {
    format!("{{{}}}", group.iter().map(usize::to_string).collect::<Vec<_>>().join(","))
}
