//! Typed launchers for the collective kernels and the NCCL fallback clique.

use std::ffi::c_void;

use ffi::cuda::{DeviceBuffer, Function};
use ffi::nccl;

use super::{BLOCKS, Clique, CudaError, MAX_RANKS, Result, SIGNAL_BYTES, THREADS};

/// Element types the kernels take (every computable type: `emitter::kernel_accepts_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F64,
    Bf16,
    F16,
    S8,
    S16,
    S32,
    S64,
    U8,
    U16,
    U32,
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
            Dtype::S16 => "s16",
            Dtype::S32 => "s32",
            Dtype::S64 => "s64",
            Dtype::U8 => "u8",
            Dtype::U16 => "u16",
            Dtype::U32 => "u32",
            Dtype::U64 => "u64",
            Dtype::Pred => "pred",
        }
    }

    /// The kernels' type for an HLO element type (`None`: not computable on the device).
    pub fn of(ty: hlo::PrimitiveType) -> Option<Dtype> {
        use hlo::PrimitiveType as T;
        Some(match ty {
            T::F32 => Dtype::F32,
            T::F64 => Dtype::F64,
            T::Bf16 => Dtype::Bf16,
            T::F16 => Dtype::F16,
            T::S8 => Dtype::S8,
            T::S16 => Dtype::S16,
            T::S32 => Dtype::S32,
            T::S64 => Dtype::S64,
            T::U8 => Dtype::U8,
            T::U16 => Dtype::U16,
            T::U32 => Dtype::U32,
            T::U64 => Dtype::U64,
            T::Pred => Dtype::Pred,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::S8 | Dtype::U8 | Dtype::Pred => 1,
            Dtype::Bf16 | Dtype::F16 | Dtype::S16 | Dtype::U16 => 2,
            Dtype::F32 | Dtype::S32 | Dtype::U32 => 4,
            Dtype::F64 | Dtype::S64 | Dtype::U64 => 8,
        }
    }

    /// NCCL's type, where NCCL has one (it has no 16-bit integers).
    pub fn nccl(self) -> Option<nccl::DataType> {
        Some(match self {
            Dtype::F32 => nccl::DataType::Float32,
            Dtype::F64 => nccl::DataType::Float64,
            Dtype::Bf16 => nccl::DataType::Bfloat16,
            Dtype::F16 => nccl::DataType::Float16,
            Dtype::S8 => nccl::DataType::Int8,
            Dtype::S32 => nccl::DataType::Int32,
            Dtype::U32 => nccl::DataType::Uint32,
            Dtype::S64 => nccl::DataType::Int64,
            Dtype::U64 => nccl::DataType::Uint64,
            Dtype::U8 | Dtype::Pred => nccl::DataType::Uint8,
            Dtype::S16 | Dtype::U16 => return None,
        })
    }

    /// NCCL's reduction for `red` on this type, where NCCL computes XLA's semantics
    /// (pred: and = min, or = max; pred add is xor, which NCCL lacks; no bitwise and/or on
    /// integers).
    pub fn nccl_reduction(self, red: Red) -> Option<(nccl::DataType, nccl::RedOp)> {
        let ty = self.nccl()?;
        let op = match (self, red) {
            (Dtype::Pred, Red::Prod | Red::Min | Red::And) => nccl::RedOp::Min,
            (Dtype::Pred, Red::Max | Red::Or) => nccl::RedOp::Max,
            (Dtype::Pred, Red::Sum) | (_, Red::And | Red::Or) => return None,
            (_, Red::Sum) => nccl::RedOp::Sum,
            (_, Red::Prod) => nccl::RedOp::Prod,
            (_, Red::Min) => nccl::RedOp::Min,
            (_, Red::Max) => nccl::RedOp::Max,
        };
        Some((ty, op))
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

    pub fn of(kind: hlo::analysis::ReductionKind) -> Red {
        use hlo::analysis::ReductionKind as K;
        match kind {
            K::Sum => Red::Sum,
            K::Prod => Red::Prod,
            K::Min => Red::Min,
            K::Max => Red::Max,
            K::And => Red::And,
            K::Or => Red::Or,
        }
    }

    /// Whether the kernels have this reduction for `ty` (floats: arithmetic only).
    pub fn defined_for(self, ty: Dtype) -> bool {
        let float = matches!(ty, Dtype::F32 | Dtype::F64 | Dtype::Bf16 | Dtype::F16);
        !(float && matches!(self, Red::And | Red::Or))
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
pub(crate) struct Ptrs(pub [u64; MAX_RANKS]);

impl Ptrs {
    pub(crate) fn of(v: &[u64]) -> Ptrs {
        let mut p = Ptrs::default();
        p.0[..v.len()].copy_from_slice(v);
        p
    }
}

/// Declares a kernel's argument struct and its `params()` (the pointer array a launch
/// takes) from one field list, so each kernel's argument order is written exactly once.
macro_rules! kernel_args {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($field:ident: $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        $vis struct $name {
            $(pub(crate) $field: $ty),*
        }

        impl $name {
            pub(crate) fn params(&mut self) -> [*mut c_void; [$(stringify!($field)),*].len()] {
                [$(&mut self.$field as *mut $ty as *mut c_void),*]
            }
        }
    };
}

/// `struct Status` of the kernels: where a bounded wait reports a peer that never arrived.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Status {
    /// Device address of this device's `u32[2]`: missing-member mask, tag of the first timeout.
    pub word: u64,
    pub timeout_ns: u64,
    /// Non-zero tag naming the collective (the executor uses thunk index + 1).
    pub tag: u64,
    /// 0, or a host-mapped `u32[2]` a timeout also writes (XLA's handlers read it without
    /// synchronising).
    pub report: u64,
}

/// How long the benchmark's kernels wait for a peer before reporting it missing.
const BENCH_TIMEOUT_NS: u64 = 30_000_000_000;

/// Reads and clears the status words of `bufs` (one per device); `Err` names the members
/// (clique ranks) that never arrived.
pub(crate) fn take_status(bufs: &[DeviceBuffer], what: &str) -> Result<()> {
    for (r, b) in bufs.iter().enumerate() {
        let mut w = [0u32; 2];
        b.read(&mut w)?;
        if w[0] != 0 {
            b.write(&[0u32; 2])?;
            let missing: Vec<usize> = (0..32).filter(|i| w[0] & (1 << i) != 0).collect();
            return Err(CudaError::Invalid(format!("{what}: rank {r} timed out waiting for ranks {missing:?}")));
        }
    }
    Ok(())
}

kernel_args! {
    /// The arguments of `pl_one_shot_*` / `pl_two_shot_*`, in the kernels' order.
    pub(crate) struct ReduceArgs {
        input: u64,
        output: u64,
        n: u64,
        rank: u32,
        world: u32,
        stage: Ptrs,
        stride: u64,
        flags: Ptrs,
        counter: u64,
        status: Status,
    }
}

/// Operands a `pl_one_shot_many_*` launch takes at most (`PL_MAX_OPERANDS`).
pub(crate) const MAX_OPERANDS: usize = 8;

/// `struct Many` of the kernels: a variadic all-reduce's operands of one element type.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Many {
    pub count: u64,
    pub input: [u64; MAX_OPERANDS],
    pub output: [u64; MAX_OPERANDS],
    /// Elements of each operand.
    pub n: [u64; MAX_OPERANDS],
    /// Byte offset of each operand in a staging half (16-byte aligned).
    pub off: [u64; MAX_OPERANDS],
}

kernel_args! {
    /// The arguments of `pl_one_shot_many_*`, in the kernels' order.
    pub(crate) struct ManyArgs {
        many: Many,
        rank: u32,
        world: u32,
        stage: Ptrs,
        stride: u64,
        flags: Ptrs,
        counter: u64,
        status: Status,
    }
}

kernel_args! {
    /// The arguments of `pl_all_gather`, in order.
    pub(crate) struct GatherArgs {
        input: u64,
        bytes: u64,
        rank: u32,
        world: u32,
        out: Ptrs,
        flags: Ptrs,
        counter: u64,
        status: Status,
    }
}

kernel_args! {
    /// The arguments of `pl_reduce_scatter_*`, in order.
    pub(crate) struct ScatterArgs {
        input: u64,
        output: u64,
        rank: u32,
        world: u32,
        stage: Ptrs,
        stride: u64,
        flags: Ptrs,
        counter: u64,
        blocks: Blocks,
        status: Status,
    }
}

kernel_args! {
    /// The arguments of `pl_exchange`.
    pub(crate) struct ExchangeArgs {
        x: Xchg,
        status: Status,
    }
}

/// `struct Run`: `rows` runs of `row` bytes, `sstride` / `dstride` apart.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Run {
    pub src: u64,
    pub dst: u64,
    pub rows: u64,
    pub row: u64,
    pub sstride: u64,
    pub dstride: u64,
}

/// `struct Blocks`: `outer` rows of `world` blocks of `brow` bytes (`full` bytes a row).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Blocks {
    pub outer: u64,
    pub brow: u64,
    pub full: u64,
}

/// Copies an exchange kernel takes at most (`PL_MAX_TASKS`).
pub(crate) const MAX_TASKS: usize = 8;

/// `struct Sig`: flag slots to store the epoch into (peer flag-set bases).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sig {
    pub n: u64,
    pub base: [u64; MAX_RANKS],
    pub slot: [u64; MAX_RANKS],
}

/// `struct Wait`: own flag slots to wait on.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Wait {
    pub n: u64,
    pub slot: [u64; MAX_RANKS],
}

/// `struct Xchg`: two signal phases around up to [`MAX_TASKS`] copies.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Xchg {
    pub counter: u64,
    pub flags: u64,
    pub sig: [Sig; 2],
    pub wait: [Wait; 2],
    pub ntasks: u64,
    pub task: [Run; MAX_TASKS],
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
        let name = format!("pl_{kind}_{}_{}", dtype.name(), red.name());
        let funcs = clique.devices.iter().map(|d| Ok(d.module.function(&name)?)).collect::<Result<Vec<_>>>()?;
        let stride = round_up(max_bytes.max(16), 256);
        let sig = round_up(SIGNAL_BYTES, 256);
        let arena = clique.alloc(sig + 2 * stride)?;
        let status = clique.alloc(8)?;
        Ok(AllReduce { algo, dtype, red, max_bytes, stride, arena, status, funcs })
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
                status: Status { word: self.status[r].ptr, timeout_ns: BENCH_TIMEOUT_NS, tag: 1, report: 0 },
            };
            d.ctx.bind()?;
            let grid = super::grid((n * self.dtype.size()).div_ceil(16) as u64, super::DEFAULT_GRID);
            // SAFETY: ReduceArgs::params matches the kernel's parameter list; every pointer is a
            // device allocation of the clique (peer access probed) that outlives the launch.
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
        let funcs =
            clique.devices.iter().map(|d| Ok(d.module.function("pl_all_gather")?)).collect::<Result<Vec<_>>>()?;
        Ok(AllGather { arena: clique.alloc(SIGNAL_BYTES)?, status: clique.alloc(8)?, funcs })
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
                status: Status { word: self.status[r].ptr, timeout_ns: BENCH_TIMEOUT_NS, tag: 1, report: 0 },
            };
            d.ctx.bind()?;
            // SAFETY: GatherArgs::params matches pl_all_gather's parameters; buffers are clique
            // allocations with probed peer access that outlive the launch.
            unsafe {
                d.stream.launch(
                    &self.funcs[r],
                    super::grid(bytes.div_ceil(16) as u64, super::DEFAULT_GRID),
                    THREADS,
                    &mut a.params(),
                )?
            };
        }
        Ok(())
    }

    /// As [`AllReduce::check`].
    pub fn check(&self) -> Result<()> {
        take_status(&self.status, "all-gather")
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
        let (ty, op) = dtype
            .nccl_reduction(red)
            .ok_or_else(|| CudaError::Invalid(format!("NCCL has no {} reduction of {}", red.name(), dtype.name())))?;
        let bufs: Vec<(u64, u64)> = ins.iter().copied().zip(outs.iter().copied()).collect();
        let streams: Vec<_> = clique.devices.iter().map(|d| &d.stream).collect();
        Ok(self.comms.all_reduce(&bufs, n, ty, op, &streams)?)
    }

    pub fn all_gather(&self, clique: &Clique, ins: &[u64], outs: &[u64], bytes: usize) -> Result<()> {
        let bufs: Vec<(u64, u64)> = ins.iter().copied().zip(outs.iter().copied()).collect();
        let streams: Vec<_> = clique.devices.iter().map(|d| &d.stream).collect();
        Ok(self.comms.all_gather(&bufs, bytes, nccl::DataType::Uint8, &streams)?)
    }
}
