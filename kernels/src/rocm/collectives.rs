//! Launchers for the collective kernels on HIP, and the RCCL fallback clique. The argument
//! structs are the CUDA launchers' ([`crate::cuda::collectives`]): one definition of each
//! kernel's parameter list for both backends, since both compile the same sources.

use ffi::hip::{DeviceBuffer, Function};
use ffi::rccl;

use super::{BLOCKS, Clique, Result, RocmError, SIGNAL_BYTES, THREADS};
use crate::cuda::collectives::{GatherArgs, Ptrs, ReduceArgs, Status};
use crate::cuda::{Algo, Dtype, Red};

/// How long these launchers' kernels wait for a peer before reporting it missing (the CUDA
/// launchers' value).
const TIMEOUT_NS: u64 = 30_000_000_000;

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Reads and clears the status words of `bufs` (one per device); `Err` names the members
/// (clique ranks) that never arrived.
fn take_status(bufs: &[DeviceBuffer], what: &str) -> Result<()> {
    for (r, b) in bufs.iter().enumerate() {
        let mut w = [0u32; 2];
        b.read(&mut w)?;
        if w[0] != 0 {
            b.write(&[0u32; 2])?;
            let missing: Vec<usize> = (0..32).filter(|i| w[0] & (1 << i) != 0).collect();
            return Err(RocmError::Invalid(format!(
                "{what}: rank {r} (device {}) timed out waiting for ranks {missing:?}",
                b.ordinal
            )));
        }
    }
    Ok(())
}

fn functions(clique: &Clique, name: &str) -> Result<Vec<Function>> {
    clique.devices.iter().map(|d| d.function(name)).collect()
}

/// One all-reduce communicator: its own signals and double-buffered staging on every device,
/// for operands up to `max_bytes`.
#[derive(Debug)]
pub struct AllReduce {
    pub algo: Algo,
    pub dtype: Dtype,
    pub red: Red,
    max_bytes: usize,
    stride: usize,
    arena: Vec<DeviceBuffer>,
    status: Vec<DeviceBuffer>,
    funcs: Vec<Function>,
}

impl AllReduce {
    pub fn new(clique: &Clique, algo: Algo, dtype: Dtype, red: Red, max_bytes: usize) -> Result<AllReduce> {
        clique.require_full_peer_access()?;
        let kind = match algo {
            Algo::OneShot => "one_shot",
            Algo::TwoShot => "two_shot",
        };
        let funcs = functions(clique, &format!("pl_{kind}_{}_{}", dtype.name(), red.name()))?;
        let stride = round_up(max_bytes.max(16), 256);
        let arena = clique.alloc(round_up(SIGNAL_BYTES, 256) + 2 * stride)?;
        let status = clique.alloc(8)?;
        Ok(AllReduce { algo, dtype, red, max_bytes, stride, arena, status, funcs })
    }

    /// Enqueues one all-reduce of `n` elements: `ins[i]` / `outs[i]` on device `i` (device
    /// allocations, any alignment), on each device's stream.
    pub fn launch(&self, clique: &Clique, ins: &[u64], outs: &[u64], n: usize) -> Result<()> {
        let w = clique.len();
        if ins.len() != w || outs.len() != w || n.saturating_mul(self.dtype.size()) > self.max_bytes {
            return Err(RocmError::Invalid(format!(
                "all-reduce of {n} {} on {} inputs / {} outputs for {w} devices (max {} bytes)",
                self.dtype.name(),
                ins.len(),
                outs.len(),
                self.max_bytes
            )));
        }
        let sig = round_up(SIGNAL_BYTES, 256) as u64;
        let flags: Vec<u64> = self.arena.iter().map(|b| b.ptr + 4 * BLOCKS as u64).collect();
        let stage: Vec<u64> = self.arena.iter().map(|b| b.ptr + sig).collect();
        for (r, d) in clique.devices.iter().enumerate() {
            let mut a = ReduceArgs {
                input: ins[r],
                output: outs[r],
                n: n as u64,
                rank: r as u32,
                world: w as u32,
                stage: Ptrs::of(&stage),
                stride: self.stride as u64,
                flags: Ptrs::of(&flags),
                counter: self.arena[r].ptr,
                status: Status { word: self.status[r].ptr, timeout_ns: TIMEOUT_NS, tag: 1, report: 0 },
            };
            d.ctx.bind()?;
            let grid = crate::cuda::grid((n * self.dtype.size()).div_ceil(16) as u64, crate::cuda::DEFAULT_GRID);
            // SAFETY: ReduceArgs::params matches the kernel's parameter list (the same source
            // as CUDA's); every pointer is a device allocation of the clique (peer access
            // probed) that outlives the launch.
            unsafe { d.stream.launch(&self.funcs[r], grid, THREADS, &mut a.params())? };
        }
        Ok(())
    }

    /// Errors if a launch since the last check timed out waiting for a peer (call after
    /// synchronising).
    pub fn check(&self) -> Result<()> {
        take_status(&self.status, "all-reduce")
    }
}

/// One all-gather communicator (push to peers, rotated order).
#[derive(Debug)]
pub struct AllGather {
    arena: Vec<DeviceBuffer>,
    status: Vec<DeviceBuffer>,
    funcs: Vec<Function>,
}

impl AllGather {
    pub fn new(clique: &Clique) -> Result<AllGather> {
        clique.require_full_peer_access()?;
        Ok(AllGather {
            arena: clique.alloc(SIGNAL_BYTES)?,
            status: clique.alloc(8)?,
            funcs: functions(clique, "pl_all_gather")?,
        })
    }

    /// Enqueues one all-gather of `bytes` per device: `outs[i]` holds `world * bytes`.
    pub fn launch(&self, clique: &Clique, ins: &[u64], outs: &[u64], bytes: usize) -> Result<()> {
        let w = clique.len();
        if ins.len() != w || outs.len() != w {
            return Err(RocmError::Invalid(format!(
                "all-gather with {} inputs, {} outputs, {w} devices",
                ins.len(),
                outs.len()
            )));
        }
        let flags: Vec<u64> = self.arena.iter().map(|b| b.ptr + 4 * BLOCKS as u64).collect();
        for (r, d) in clique.devices.iter().enumerate() {
            let mut a = GatherArgs {
                input: ins[r],
                bytes: bytes as u64,
                rank: r as u32,
                world: w as u32,
                out: Ptrs::of(outs),
                flags: Ptrs::of(&flags),
                counter: self.arena[r].ptr,
                status: Status { word: self.status[r].ptr, timeout_ns: TIMEOUT_NS, tag: 1, report: 0 },
            };
            d.ctx.bind()?;
            let grid = crate::cuda::grid(bytes.div_ceil(16) as u64, crate::cuda::DEFAULT_GRID);
            // SAFETY: GatherArgs::params matches pl_all_gather's parameters; buffers are clique
            // allocations with probed peer access that outlive the launch.
            unsafe { d.stream.launch(&self.funcs[r], grid, THREADS, &mut a.params())? };
        }
        Ok(())
    }

    /// Errors if a launch since the last check timed out waiting for a peer.
    pub fn check(&self) -> Result<()> {
        take_status(&self.status, "all-gather")
    }
}

/// RCCL communicators for a clique (the fallback), created once. A missing librccl is an
/// error naming the library, where it was looked for and `PEERLESS_RCCL_LIB`.
#[derive(Debug)]
pub struct RcclClique {
    pub comms: rccl::Comms,
}

impl RcclClique {
    pub fn new(clique: &Clique) -> Result<RcclClique> {
        let ords: Vec<usize> = clique.devices.iter().map(|d| d.ordinal).collect();
        Ok(RcclClique { comms: rccl::Comms::new(&ords)? })
    }

    pub fn all_reduce(
        &self,
        clique: &Clique,
        ins: &[u64],
        outs: &[u64],
        n: usize,
        dtype: Dtype,
        red: Red,
    ) -> Result<()> {
        let (ty, op) = dtype
            .nccl_reduction(red)
            .ok_or_else(|| RocmError::Invalid(format!("RCCL has no {} reduction of {}", red.name(), dtype.name())))?;
        let bufs: Vec<(u64, u64)> = ins.iter().copied().zip(outs.iter().copied()).collect();
        let streams: Vec<_> = clique.devices.iter().map(|d| &d.stream).collect();
        Ok(self.comms.all_reduce(&bufs, n, ty, op, &streams)?)
    }

    pub fn all_gather(&self, clique: &Clique, ins: &[u64], outs: &[u64], bytes: usize) -> Result<()> {
        let bufs: Vec<(u64, u64)> = ins.iter().copied().zip(outs.iter().copied()).collect();
        let streams: Vec<_> = clique.devices.iter().map(|d| &d.stream).collect();
        Ok(self.comms.all_gather(&bufs, bytes, rccl::DataType::Uint8, &streams)?)
    }
}
