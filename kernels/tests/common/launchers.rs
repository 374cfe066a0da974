//! Typed launchers for the collective kernels on a clique (the kernels' tests on raw
//! buffers). Generic over the backend: the same argument structs (`kernels::gpu::args`) and
//! the same launch geometry on CUDA and HIP.
#![allow(dead_code)] // each test binary uses some of them

use std::ffi::c_void;

use ffi::gpu::{GpuBuffer, GpuContext, GpuStream};
use kernels::gpu::args::{Norm, NormArgs, NormArray, Ptrs, ReduceArgs, Status};
use kernels::gpu::{Algo, BLOCKS, Backend, Clique, Dtype, Kernel, Red, SIGNAL_BYTES, THREADS};
use kernels::gpu::{grid, lamport_bytes, lamport_init, norm_grid};
use kernels::{Error, Result};
use thunks::custom_call::Epilogue;

/// The arguments of `pl_all_gather`, in order: only these tests launch that kernel (the runtime's all-gathers are
/// the direct and copy-engine forms).
struct GatherArgs {
    input: u64,
    bytes: u64,
    rank: u32,
    world: u32,
    out: Ptrs,
    flags: Ptrs,
    counter: u64,
    status: Status,
}

impl GatherArgs {
    /// The pointer array a launch takes, one per parameter.
    fn params(&mut self) -> [*mut c_void; 8] {
        [
            (&raw mut self.input).cast(),
            (&raw mut self.bytes).cast(),
            (&raw mut self.rank).cast(),
            (&raw mut self.world).cast(),
            (&raw mut self.out).cast(),
            (&raw mut self.flags).cast(),
            (&raw mut self.counter).cast(),
            (&raw mut self.status).cast(),
        ]
    }
}

/// What the raw-buffer tests do with a clique beside the runtime's own use of it.
pub trait CliqueExt<B: Backend> {
    /// Errors unless every ordered pair passed the probe.
    fn require_full_peer_access(&self) -> Result<()>;
    /// Waits for every device's stream.
    fn synchronize(&self) -> Result<()>;
    /// A zeroed allocation of `len` bytes on every device that peers may access while
    /// kernels run (`Gpu::alloc`).
    fn alloc(&self, len: usize) -> Result<Vec<B::Buffer>>;
}

impl<B: Backend> CliqueExt<B> for Clique<B> {
    fn require_full_peer_access(&self) -> Result<()> {
        for (i, row) in self.probes.iter().enumerate() {
            for (j, p) in row.iter().enumerate() {
                if !p.works() {
                    return Err(Error::Gpu(format!("peer access {i}→{j} is missing: {p:?}")));
                }
            }
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        for d in &self.devices {
            d.ctx.bind()?;
            d.stream.synchronize()?;
        }
        Ok(())
    }

    fn alloc(&self, len: usize) -> Result<Vec<B::Buffer>> {
        self.devices.iter().map(|d| Ok(B::Buffer::alloc(&d.ctx, len)?)).collect()
    }
}

/// `ranks` members on one GPU ([`Clique::on_one_device`]).
pub fn on_one_device<B: Backend>(ordinal: usize, ranks: usize) -> Result<Clique<B>> {
    Clique::on_one_device(ordinal, ranks)
}

/// How long these launchers' kernels wait for a peer before reporting it missing.
const TIMEOUT_NS: u64 = 30_000_000_000;

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Reads and clears the status words of `bufs` (one per device, on device `ordinals[r]`); `Err` names the members
/// (clique ranks) that never arrived.
fn take_status<B: Backend>(bufs: &[B::Buffer], ordinals: &[usize], what: &str) -> Result<()> {
    for (r, b) in bufs.iter().enumerate() {
        let mut w = [0u8; 8];
        b.read_at(0, &mut w)?;
        let mask = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
        if mask != 0 {
            b.write_at(0, &[0u8; 8])?;
            let missing: Vec<usize> = (0..32).filter(|i| mask & (1 << i) != 0).collect();
            return Err(Error::Gpu(format!(
                "{what}: rank {r} (device {}) timed out waiting for ranks {missing:?}",
                ordinals[r]
            )));
        }
    }
    Ok(())
}

fn functions<B: Backend>(clique: &Clique<B>, name: &str) -> Result<Vec<B::Function>> {
    clique.devices.iter().map(|d| d.function(name)).collect()
}

fn status<B: Backend>(buf: &B::Buffer) -> Status {
    Status { word: buf.ptr(), timeout_ns: TIMEOUT_NS, tag: 1, report: 0 }
}

/// A reduction communicator's memory on every device, for operands up to `max_bytes`: signals
/// and two staging halves, or Lamport regions (sentinel, [`lamport_init`]) behind their
/// header; a status word; and the kernel `name` on every device.
struct Comm<B: Backend> {
    max_bytes: usize,
    stride: usize,
    lamport: bool,
    arena: Vec<B::Buffer>,
    status: Vec<B::Buffer>,
    /// The device of each status word.
    ordinals: Vec<usize>,
    funcs: Vec<B::Function>,
}

impl<B: Backend> Comm<B> {
    fn new(clique: &Clique<B>, name: &str, max_bytes: usize, lamport: bool) -> Result<Self> {
        clique.require_full_peer_access()?;
        let funcs = functions(clique, name)?;
        let stride = round_up(max_bytes.max(16), 256);
        let arena = if lamport {
            let len = lamport_bytes(stride, clique.len());
            let arena = clique.alloc(len)?;
            for b in &arena {
                b.write_at(0, &lamport_init(len))?;
            }
            arena
        } else {
            clique.alloc(round_up(SIGNAL_BYTES, 256) + 2 * stride)?
        };
        let ordinals = clique.devices.iter().map(|d| d.ordinal).collect();
        Ok(Comm { max_bytes, stride, lamport, arena, status: clique.alloc(8)?, ordinals, funcs })
    }

    /// Every device's staging base and flags. The Lamport kernels take their regions' bases
    /// as `stage` and the slot as `stride` (the header at the base holds the counters; they
    /// have no flags).
    fn stage_and_flags(&self) -> (Ptrs, Ptrs) {
        let sig = if self.lamport { 0 } else { round_up(SIGNAL_BYTES, 256) as u64 };
        let flags: Vec<u64> = self.arena.iter().map(|b| b.ptr() + 4 * BLOCKS as u64).collect();
        let stage: Vec<u64> = self.arena.iter().map(|b| b.ptr() + sig).collect();
        (Ptrs::of(&stage), Ptrs::of(&flags))
    }
}

impl<B: Backend> std::fmt::Debug for Comm<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm").field("max_bytes", &self.max_bytes).field("lamport", &self.lamport).finish()
    }
}

/// One all-reduce communicator: its own signals and double-buffered staging on every device,
/// for operands up to `max_bytes`.
#[derive(Debug)]
pub struct AllReduce<B: Backend> {
    pub algo: Algo,
    pub dtype: Dtype,
    pub red: Red,
    comm: Comm<B>,
}

impl<B: Backend> AllReduce<B> {
    pub fn new(clique: &Clique<B>, algo: Algo, dtype: Dtype, red: Red, max_bytes: usize) -> Result<Self> {
        let kind = match algo {
            Algo::OneShot => "one_shot",
            Algo::TwoShot => "two_shot",
            Algo::Lamport => "lamport",
        };
        let name = format!("pl_{kind}_{}_{}", dtype.name(), red.name());
        Ok(AllReduce { algo, dtype, red, comm: Comm::new(clique, &name, max_bytes, algo == Algo::Lamport)? })
    }

    /// Enqueues one all-reduce of `n` elements: `ins[i]` / `outs[i]` on device `i` (device
    /// allocations, any alignment), on each device's stream.
    pub fn launch(&self, clique: &Clique<B>, ins: &[u64], outs: &[u64], n: usize) -> Result<()> {
        let w = clique.len();
        let c = &self.comm;
        if ins.len() != w || outs.len() != w || n.saturating_mul(self.dtype.size()) > c.max_bytes {
            return Err(Error::Gpu(format!(
                "all-reduce of {n} {} on {} inputs / {} outputs for {w} devices (max {} bytes)",
                self.dtype.name(),
                ins.len(),
                outs.len(),
                c.max_bytes
            )));
        }
        let (stage, flags) = c.stage_and_flags();
        for (r, d) in clique.devices.iter().enumerate() {
            let mut a = ReduceArgs {
                input: ins[r],
                output: outs[r],
                n: n as u64,
                rank: r as u32,
                world: w as u32,
                stage,
                stride: c.stride as u64,
                flags,
                counter: c.arena[r].ptr(),
                status: status::<B>(&c.status[r]),
            };
            d.ctx.bind()?;
            let grid = grid((n * self.dtype.size()).div_ceil(16) as u64, clique.max_grid);
            // SAFETY: ReduceArgs::params matches the kernel's parameter list (one source for
            // both vendors); every pointer is a device allocation of the clique (peer access
            // probed) that outlives the launch.
            unsafe { d.stream.launch(&c.funcs[r], grid, THREADS, &mut a.params())? };
        }
        Ok(())
    }

    /// Errors if a launch since the last check timed out waiting for a peer (call after
    /// synchronising).
    pub fn check(&self) -> Result<()> {
        take_status::<B>(&self.comm.status, &self.comm.ordinals, "all-reduce")
    }
}

/// The buffers of one device's part of a fused all-reduce + RMSNorm launch (device addresses
/// with their element types; the operand's type is the communicator's).
#[derive(Debug, Clone, Copy)]
pub struct NormBuffers {
    pub input: u64,
    pub residual: NormArray,
    pub gamma: Option<NormArray>,
    pub h: NormArray,
    pub y: NormArray,
}

/// One communicator of the one-shot all-reduce fused with the residual add and RMSNorm
/// (`pl_one_shot_norm_*`): its own signals and double-buffered staging on every device, for
/// operands up to `max_bytes`.
#[derive(Debug)]
pub struct AllReduceNorm<B: Backend> {
    pub dtype: Dtype,
    /// Through Lamport regions (else the flag protocol).
    pub lamport: bool,
    comm: Comm<B>,
}

impl<B: Backend> AllReduceNorm<B> {
    /// The flag protocol's kernel (`pl_one_shot_norm_*`).
    pub fn new(clique: &Clique<B>, dtype: Dtype, max_bytes: usize) -> Result<Self> {
        Self::make(clique, dtype, max_bytes, false)
    }

    /// The kernel through Lamport regions (`pl_lamport_norm_*`).
    pub fn lamport(clique: &Clique<B>, dtype: Dtype, max_bytes: usize) -> Result<Self> {
        Self::make(clique, dtype, max_bytes, true)
    }

    fn make(clique: &Clique<B>, dtype: Dtype, max_bytes: usize, lamport: bool) -> Result<Self> {
        if !Kernel::OneShotNorm.defined_for(dtype, Red::Sum) {
            return Err(Error::Gpu(format!("no fused all-reduce + RMSNorm for {}", dtype.name())));
        }
        let kind = if lamport { "lamport" } else { "one_shot" };
        let name = format!("pl_{kind}_norm_{}_sum", dtype.name());
        Ok(AllReduceNorm { dtype, lamport, comm: Comm::new(clique, &name, max_bytes, lamport)? })
    }

    /// Enqueues one fused all-reduce of `rows` rows of `d` elements with epilogue `e`:
    /// `bufs[i]` on device `i`, on each device's stream.
    pub fn launch(&self, clique: &Clique<B>, e: &Epilogue, bufs: &[NormBuffers], rows: usize, d: usize) -> Result<()> {
        let w = clique.len();
        let n = rows.saturating_mul(d);
        let c = &self.comm;
        if bufs.len() != w || n.saturating_mul(self.dtype.size()) > c.max_bytes {
            return Err(Error::Gpu(format!(
                "fused all-reduce of {rows} x {d} {} on {} buffer sets for {w} devices (max {} bytes)",
                self.dtype.name(),
                bufs.len(),
                c.max_bytes
            )));
        }
        let (stage, flags) = c.stage_and_flags();
        for (r, d_) in clique.devices.iter().enumerate() {
            let b = &bufs[r];
            let norm = Norm::new(e, rows as u64, d as u64, b.residual, b.gamma, b.h, b.y).map_err(Error::Gpu)?;
            let mut a = NormArgs {
                input: b.input,
                norm,
                rank: r as u32,
                world: w as u32,
                stage,
                stride: c.stride as u64,
                flags,
                counter: c.arena[r].ptr(),
                status: status::<B>(&c.status[r]),
            };
            d_.ctx.bind()?;
            let grid = norm_grid(rows).min(clique.max_grid);
            // SAFETY: NormArgs::params matches pl_one_shot_norm_*'s and pl_lamport_norm_*'s
            // parameter list (one source for both vendors); every pointer is a device
            // allocation of the clique (peer access probed) that outlives the launch.
            unsafe { d_.stream.launch(&c.funcs[r], grid, THREADS, &mut a.params())? };
        }
        Ok(())
    }

    /// As [`AllReduce::check`].
    pub fn check(&self) -> Result<()> {
        take_status::<B>(&self.comm.status, &self.comm.ordinals, "fused all-reduce")
    }
}

/// One all-gather communicator (push to peers, rotated order).
#[derive(Debug)]
pub struct AllGather<B: Backend> {
    arena: Vec<B::Buffer>,
    status: Vec<B::Buffer>,
    /// The device of each status word.
    ordinals: Vec<usize>,
    funcs: Vec<B::Function>,
}

impl<B: Backend> AllGather<B> {
    pub fn new(clique: &Clique<B>) -> Result<Self> {
        clique.require_full_peer_access()?;
        Ok(AllGather {
            arena: clique.alloc(SIGNAL_BYTES)?,
            status: clique.alloc(8)?,
            ordinals: clique.devices.iter().map(|d| d.ordinal).collect(),
            funcs: functions(clique, "pl_all_gather")?,
        })
    }

    /// Enqueues one all-gather of `bytes` per device: `outs[i]` holds `world * bytes`.
    pub fn launch(&self, clique: &Clique<B>, ins: &[u64], outs: &[u64], bytes: usize) -> Result<()> {
        let w = clique.len();
        if ins.len() != w || outs.len() != w {
            return Err(Error::Gpu(format!(
                "all-gather with {} inputs, {} outputs, {w} devices",
                ins.len(),
                outs.len()
            )));
        }
        let flags: Vec<u64> = self.arena.iter().map(|b| b.ptr() + 4 * BLOCKS as u64).collect();
        for (r, d) in clique.devices.iter().enumerate() {
            let mut a = GatherArgs {
                input: ins[r],
                bytes: bytes as u64,
                rank: r as u32,
                world: w as u32,
                out: Ptrs::of(outs),
                flags: Ptrs::of(&flags),
                counter: self.arena[r].ptr(),
                status: status::<B>(&self.status[r]),
            };
            d.ctx.bind()?;
            let grid = grid(bytes.div_ceil(16) as u64, clique.max_grid);
            // SAFETY: GatherArgs::params matches pl_all_gather's parameters; buffers are clique
            // allocations with probed peer access that outlive the launch.
            unsafe { d.stream.launch(&self.funcs[r], grid, THREADS, &mut a.params())? };
        }
        Ok(())
    }

    /// As [`AllReduce::check`].
    pub fn check(&self) -> Result<()> {
        take_status::<B>(&self.status, &self.ordinals, "all-gather")
    }
}
