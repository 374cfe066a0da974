//! Typed launchers for the collective kernels and the NCCL fallback clique.

use std::ffi::c_void;

use ffi::cuda::{DeviceBuffer, Function};
use ffi::nccl;

use super::{BLOCKS, Clique, CudaError, MAX_RANKS, Result, SIGNAL_BYTES, THREADS};

/// Element types the kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F64,
    Bf16,
    F16,
    S8,
    S32,
    U32,
    S64,
    U64,
    Pred,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::S8 => "s8",
            Dtype::S32 => "s32",
            Dtype::U32 => "u32",
            Dtype::S64 => "s64",
            Dtype::U64 => "u64",
            Dtype::Pred => "pred",
        }
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::S8 | Dtype::Pred => 1,
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 | Dtype::S32 | Dtype::U32 => 4,
            Dtype::F64 | Dtype::S64 | Dtype::U64 => 8,
        }
    }

    pub fn nccl(self) -> nccl::DataType {
        match self {
            Dtype::F32 => nccl::DataType::Float32,
            Dtype::F64 => nccl::DataType::Float64,
            Dtype::Bf16 => nccl::DataType::Bfloat16,
            Dtype::F16 => nccl::DataType::Float16,
            Dtype::S8 => nccl::DataType::Int8,
            Dtype::S32 => nccl::DataType::Int32,
            Dtype::U32 => nccl::DataType::Uint32,
            Dtype::S64 => nccl::DataType::Int64,
            Dtype::U64 => nccl::DataType::Uint64,
            Dtype::Pred => nccl::DataType::Uint8,
        }
    }
}

/// Reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Red {
    Sum,
    Prod,
    Min,
    Max,
    And,
    Or,
}

impl Red {
    pub fn name(self) -> &'static str {
        match self {
            Red::Sum => "sum",
            Red::Prod => "prod",
            Red::Min => "min",
            Red::Max => "max",
            Red::And => "and",
            Red::Or => "or",
        }
    }
}

/// All-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    OneShot,
    TwoShot,
}

/// `struct Ptrs` of the kernels: one address per rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Ptrs([u64; MAX_RANKS]);

impl Ptrs {
    fn of(v: &[u64]) -> Ptrs {
        let mut p = Ptrs::default();
        p.0[..v.len()].copy_from_slice(v);
        p
    }
}

/// Declares a kernel's argument struct and its `params()` (the pointer array a launch
/// takes) from one field list, so each kernel's argument order is written exactly once.
macro_rules! kernel_args {
    ($(#[$meta:meta])* struct $name:ident { $($field:ident: $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        struct $name {
            $($field: $ty),*
        }

        impl $name {
            fn params(&mut self) -> [*mut c_void; [$(stringify!($field)),*].len()] {
                [$(&mut self.$field as *mut $ty as *mut c_void),*]
            }
        }
    };
}

kernel_args! {
    /// The arguments of `pl_one_shot_*` / `pl_two_shot_*`, in the kernels' order.
    struct ReduceArgs {
        input: u64,
        output: u64,
        n: u64,
        rank: u32,
        world: u32,
        stage: Ptrs,
        stride: u64,
        flags: Ptrs,
        counter: u64,
    }
}

kernel_args! {
    /// The arguments of `pl_all_gather`, in order.
    struct GatherArgs {
        input: u64,
        bytes: u64,
        rank: u32,
        world: u32,
        out: Ptrs,
        flags: Ptrs,
        counter: u64,
    }
}

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// One all-reduce communicator: its own signals and double-buffered staging on every device
/// (the collective's reserved part of the symmetric arena), for operands up to `max_bytes`.
#[derive(Debug)]
pub struct AllReduce {
    pub algo: Algo,
    pub dtype: Dtype,
    pub red: Red,
    max_bytes: usize,
    stride: usize,
    arena: Vec<DeviceBuffer>,
    funcs: Vec<Function>,
}

impl AllReduce {
    pub fn new(clique: &Clique, algo: Algo, dtype: Dtype, red: Red, max_bytes: usize) -> Result<AllReduce> {
        clique.require_full_peer_access()?;
        let kind = match algo {
            Algo::OneShot => "one_shot",
            Algo::TwoShot => "two_shot",
        };
        let name = format!("pl_{kind}_{}_{}", dtype.name(), red.name());
        let funcs = clique.devices.iter().map(|d| Ok(d.module.function(&name)?)).collect::<Result<Vec<_>>>()?;
        let stride = round_up(max_bytes.max(16), 256);
        let sig = round_up(SIGNAL_BYTES, 256);
        let arena = clique.alloc(sig + 2 * stride)?;
        Ok(AllReduce { algo, dtype, red, max_bytes, stride, arena, funcs })
    }

    /// Enqueues one all-reduce of `n` elements: `ins[i]` / `outs[i]` on device `i` (device
    /// allocations, any alignment), on each device's stream.
    pub fn launch(&self, clique: &Clique, ins: &[u64], outs: &[u64], n: usize) -> Result<()> {
        let w = clique.len();
        if ins.len() != w || outs.len() != w || n * self.dtype.size() > self.max_bytes {
            return Err(CudaError::Invalid(format!(
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
            };
            d.ctx.bind()?;
            // SAFETY: ReduceArgs::params matches the kernel's parameter list; every pointer is a
            // device allocation of the clique (peer access probed) that outlives the launch.
            unsafe { d.stream.launch(&self.funcs[r], BLOCKS, THREADS, &mut a.params())? };
        }
        Ok(())
    }
}

/// One all-gather communicator (push to peers, rotated order).
#[derive(Debug)]
pub struct AllGather {
    arena: Vec<DeviceBuffer>,
    funcs: Vec<Function>,
}

impl AllGather {
    pub fn new(clique: &Clique) -> Result<AllGather> {
        clique.require_full_peer_access()?;
        let funcs =
            clique.devices.iter().map(|d| Ok(d.module.function("pl_all_gather")?)).collect::<Result<Vec<_>>>()?;
        Ok(AllGather { arena: clique.alloc(SIGNAL_BYTES)?, funcs })
    }

    /// Enqueues one all-gather of `bytes` per device: `outs[i]` holds `world * bytes`.
    pub fn launch(&self, clique: &Clique, ins: &[u64], outs: &[u64], bytes: usize) -> Result<()> {
        let w = clique.len();
        if ins.len() != w || outs.len() != w {
            return Err(CudaError::Invalid(format!(
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
            };
            d.ctx.bind()?;
            // SAFETY: GatherArgs::params matches pl_all_gather's parameters; buffers are clique
            // allocations with probed peer access that outlive the launch.
            unsafe { d.stream.launch(&self.funcs[r], BLOCKS, THREADS, &mut a.params())? };
        }
        Ok(())
    }
}

/// NCCL communicators for a clique (the fallback), created once.
#[derive(Debug)]
pub struct NcclClique {
    pub comms: nccl::Comms,
}

impl NcclClique {
    pub fn new(clique: &Clique) -> Result<NcclClique> {
        let ords: Vec<usize> = clique.devices.iter().map(|d| d.ordinal).collect();
        Ok(NcclClique { comms: nccl::Comms::new(&ords)? })
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
        let op = match red {
            Red::Sum => nccl::RedOp::Sum,
            Red::Prod => nccl::RedOp::Prod,
            Red::Min | Red::And => nccl::RedOp::Min,
            Red::Max | Red::Or => nccl::RedOp::Max,
        };
        let bufs: Vec<(u64, u64)> = ins.iter().copied().zip(outs.iter().copied()).collect();
        let streams: Vec<_> = clique.devices.iter().map(|d| &d.stream).collect();
        Ok(self.comms.all_reduce(&bufs, n, dtype.nccl(), op, &streams)?)
    }

    pub fn all_gather(&self, clique: &Clique, ins: &[u64], outs: &[u64], bytes: usize) -> Result<()> {
        let bufs: Vec<(u64, u64)> = ins.iter().copied().zip(outs.iter().copied()).collect();
        let streams: Vec<_> = clique.devices.iter().map(|d| &d.stream).collect();
        Ok(self.comms.all_gather(&bufs, bytes, nccl::DataType::Uint8, &streams)?)
    }
}
