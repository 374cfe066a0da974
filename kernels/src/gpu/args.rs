//! The kernels' element types, reductions and argument structs: one definition of each kernel's parameter list for
//! every backend, since CUDA and HIP compile the same sources.

use std::ffi::c_void;

use thunks::custom_call::{Epilogue, Mean, RoundTo};

use super::MAX_RANKS;

/// Declares [`Dtype`], [`Dtype::ALL`] and [`Dtype::hlo`] from one list (HLO's variant names).
macro_rules! dtypes {
    ($($t:ident),*) => {
        /// Element types the kernels take (every computable type: `emitter::kernel_accepts_dtype`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Dtype { $($t),* }

        impl Dtype {
            /// Every element type the kernels take.
            pub const ALL: [Dtype; [$(Dtype::$t),*].len()] = [$(Dtype::$t),*];

            /// The HLO element type: its name, size and kind are the kernels' too.
            pub fn hlo(self) -> hlo::PrimitiveType {
                match self { $(Dtype::$t => hlo::PrimitiveType::$t),* }
            }
        }
    };
}
dtypes!(F32, F64, Bf16, F16, S8, S16, S32, S64, U8, U16, U32, U64, Pred);

impl Dtype {
    /// The kernels' type for an HLO element type (`None`: not computable on the device).
    pub fn of(ty: hlo::PrimitiveType) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|t| t.hlo() == ty)
    }

    /// HLO's spelling (`f32`, `bf16`, `pred`): what the kernels' names carry.
    pub fn name(self) -> &'static str {
        self.hlo().name()
    }

    pub fn size(self) -> usize {
        self.hlo().byte_size()
    }

    /// Whether the type is a float (f32, f64, bf16, f16): what the Lamport one-shot takes.
    pub fn is_float(self) -> bool {
        self.hlo().is_float()
    }
}

/// Reductions: the IR's (the kernels have all six).
pub use hlo::analysis::ReductionKind as Red;

/// Whether the kernels have reduction `red` for `ty` (floats: arithmetic only).
pub fn red_defined_for(red: Red, ty: Dtype) -> bool {
    !(ty.is_float() && matches!(red, Red::And | Red::Or))
}

/// All-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    OneShot,
    TwoShot,
    /// The one-shot through Lamport regions (float types).
    Lamport,
}

/// `struct Ptrs` of the kernels: one address per rank.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Ptrs(pub [u64; MAX_RANKS]);

impl Ptrs {
    pub fn of(v: &[u64]) -> Ptrs {
        let mut p = Ptrs::default();
        p.0[..v.len()].copy_from_slice(v);
        p
    }
}

/// `struct Status` of the kernels: where a bounded wait reports a peer that never arrived.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Status {
    /// Device address of this device's `u32[2]`: missing-member mask, tag of the first timeout.
    pub word: u64,
    pub timeout_ns: u64,
    /// Non-zero tag naming the collective (the executor uses thunk index + 1).
    pub tag: u64,
    /// 0, or a host-mapped `u32[2]` a timeout also writes (XLA's handlers read it without synchronising).
    pub report: u64,
}

/// `struct Norm` of the kernels: the fused residual add + RMSNorm of a `pl_one_shot_norm_*` launch
/// ([`thunks::custom_call::Epilogue`], with the call's buffers and element types).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Norm {
    pub residual: u64,
    /// 0: no gamma.
    pub gamma: u64,
    pub h: u64,
    pub y: u64,
    pub rows: u64,
    pub d: u64,
    pub x_ty: u32,
    pub g_ty: u32,
    pub h_ty: u32,
    pub y_ty: u32,
    /// 0: none, else the type code ([`norm_type`]) the sum is rounded to.
    pub round_ar: u32,
    pub of_rounded: u32,
    pub mean_div: u32,
    /// f32 bits.
    pub mean: u32,
    /// f32 bits.
    pub eps: u32,
    pub pad: u32,
}

/// One array of a fused call: its device address and element type.
pub type NormArray = (u64, Dtype);

/// The kernels' run-time type code of an epilogue array (`PL_F32`, `PL_BF16`, `PL_F16`).
pub fn norm_type(t: Dtype) -> Result<u32, String> {
    match t {
        Dtype::F32 => Ok(0),
        Dtype::Bf16 => Ok(1),
        Dtype::F16 => Ok(2),
        t => Err(format!("the fused all-reduce + RMSNorm takes f32, bf16 or f16 arrays, not {}", t.name())),
    }
}

impl Norm {
    /// The kernel's description of epilogue `e` over `rows` rows of `d` elements, with residual `x`, gamma `g` (when
    /// `e.gamma`) and results `h`, `y`.
    pub fn new(
        e: &Epilogue,
        rows: u64,
        d: u64,
        x: NormArray,
        g: Option<NormArray>,
        h: NormArray,
        y: NormArray,
    ) -> Result<Norm, String> {
        if g.is_some() != e.gamma {
            return Err(format!(
                "the epilogue {} gamma, the call {}",
                if e.gamma { "has" } else { "has no" },
                if g.is_some() { "passes one" } else { "passes none" }
            ));
        }
        let (mean_div, mean) = match e.mean {
            Mean::Multiply(c) => (0, c),
            Mean::Divide(c) => (1, c),
        };
        Ok(Norm {
            residual: x.0,
            gamma: g.map_or(0, |g| g.0),
            h: h.0,
            y: y.0,
            rows,
            d,
            x_ty: norm_type(x.1)?,
            g_ty: g.map_or(Ok(0), |g| norm_type(g.1))?,
            h_ty: norm_type(h.1)?,
            y_ty: norm_type(y.1)?,
            round_ar: match e.round_ar {
                None => 0,
                Some(RoundTo::Bf16) => 1,
                Some(RoundTo::F16) => 2,
            },
            of_rounded: u32::from(e.norm_of_rounded),
            mean_div,
            mean,
            eps: e.eps,
            pad: 0,
        })
    }
}

/// Operands a `pl_one_shot_many_*` launch takes at most (`PL_MAX_OPERANDS`).
pub const MAX_OPERANDS: usize = 8;

/// `struct Many` of the kernels: a variadic all-reduce's operands of one element type.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Many {
    pub count: u64,
    pub input: [u64; MAX_OPERANDS],
    pub output: [u64; MAX_OPERANDS],
    /// Elements of each operand.
    pub n: [u64; MAX_OPERANDS],
    /// Byte offset of each operand in a staging half (16-byte aligned).
    pub off: [u64; MAX_OPERANDS],
}

/// `struct Run`: `rows` runs of `row` bytes, `sstride` / `dstride` apart.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Run {
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
pub struct Blocks {
    pub outer: u64,
    pub brow: u64,
    pub full: u64,
}

/// Copies an exchange kernel takes at most (`PL_MAX_TASKS`).
pub const MAX_TASKS: usize = 8;

/// `struct Sig`: flag slots to store the epoch into (peer flag-set bases).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Sig {
    pub n: u64,
    pub base: [u64; MAX_RANKS],
    pub slot: [u64; MAX_RANKS],
}

/// `struct Wait`: own flag slots to wait on.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Wait {
    pub n: u64,
    pub slot: [u64; MAX_RANKS],
}

/// `struct Xchg`: two signal phases around up to [`MAX_TASKS`] copies.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Xchg {
    pub counter: u64,
    pub flags: u64,
    pub sig: [Sig; 2],
    pub wait: [Wait; 2],
    pub ntasks: u64,
    pub task: [Run; MAX_TASKS],
}

/// Declares each kernel's argument struct and its `params()` (the pointer array a launch takes) from one field list, so
/// each kernel's argument order is written exactly once.
macro_rules! kernel_args {
    // The reduction kernels': their own fields, then the member's rank, the group's size, the symmetric staging and
    // flags, the launch counters and the status.
    (group: $($(#[$meta:meta])* struct $name:ident { $($field:ident: $ty:ty),* })*) => {
        kernel_args! {$(
            $(#[$meta])* struct $name {
                $($field: $ty,)* rank: u32, world: u32, stage: Ptrs, stride: u64, flags: Ptrs, counter: u64, status: Status
            }
        )*}
    };
    ($($(#[$meta:meta])* struct $name:ident { $($field:ident: $ty:ty),* $(,)? })*) => {$(
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        pub struct $name {
            $(pub $field: $ty),*
        }

        impl $name {
            pub fn params(&mut self) -> [*mut c_void; [$(stringify!($field)),*].len()] {
                [$(&mut self.$field as *mut $ty as *mut c_void),*]
            }
        }
    )*};
}

kernel_args! { group:
    /// The arguments of `pl_one_shot_*` / `pl_two_shot_*`, in the kernels' order.
    struct ReduceArgs { input: u64, output: u64, n: u64 }
    /// The arguments of `pl_one_shot_norm_*`, in the kernels' order.
    struct NormArgs { input: u64, norm: Norm }
    /// The arguments of `pl_one_shot_many_*`, in the kernels' order.
    struct ManyArgs { many: Many }
}

kernel_args! {
    /// The arguments of `pl_probe(u32*, u32, u32*)`.
    struct ProbeArgs { remote: u64, value: u32, back: u64 }
    /// The arguments of `pl_reduce_scatter_*`, in order.
    struct ScatterArgs {
        input: u64, output: u64, rank: u32, world: u32, stage: Ptrs, stride: u64, flags: Ptrs, counter: u64,
        blocks: Blocks, status: Status,
    }
    /// The arguments of `pl_exchange`.
    struct ExchangeArgs { x: Xchg, status: Status }
    /// The arguments of `pl_reduce_local_*`, in order.
    struct LocalArgs { src: Ptrs, world: u32, output: u64, n: u64 }
}

#[cfg(test)]
#[path = "../../tests/unit/gpu_args.rs"]
mod tests;
