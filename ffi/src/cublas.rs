//! cuBLAS, loaded at run time, for one job: the bf16 GEMM `peerless bench --beside-gemm` runs beside a collective to
//! measure what the collective takes from compute. The library comes from the `nvidia-cublas` wheel JAX's CUDA plugin
//! installs ([`crate::libs::cublas`]); nothing else in Peerless needs it.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use crate::cuda::{Context, Stream};
use crate::gpu::GpuContext;
use crate::{Error, Result};

crate::libs::entry_points! {
    /// `cublas_v2.h`'s signatures (`cublasStatus_t` and the enums are C ints).
    struct Sys {
        create: fn(*mut *mut c_void) -> c_int = "cublasCreate_v2",
        destroy: fn(*mut c_void) -> c_int = "cublasDestroy_v2",
        set_stream: fn(*mut c_void, *mut c_void) -> c_int = "cublasSetStream_v2",
        gemm_ex: fn(
            *mut c_void, c_int, c_int, c_int, c_int, c_int, *const c_void, *const c_void, c_int, c_int,
            *const c_void, c_int, c_int, *const c_void, *mut c_void, c_int, c_int, c_int, c_int,
        ) -> c_int = "cublasGemmEx",
    }
}

fn sys() -> Result<&'static Sys> {
    static SYS: OnceLock<Result<Sys>> = OnceLock::new();
    crate::once(&SYS, || {
        let missing = |names: String, _| Error::Library { lib: "libcublas", reason: format!("symbol {names} missing") };
        Sys::load(&crate::libs::cublas()?.lib, missing)
    })
}

fn ck(call: &'static str, device: usize, status: c_int) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    Err(Error::Call { call, device: Some(device), status: format!("cublasStatus_t {status}") })
}

/// `CUDA_R_16BF`, `CUBLAS_COMPUTE_32F`, `CUBLAS_GEMM_DEFAULT`, `CUBLAS_OP_N`.
const BF16: c_int = 14;
const COMPUTE_32F: c_int = 68;
const GEMM_DEFAULT: c_int = -1;
const OP_N: c_int = 0;

/// A cuBLAS handle bound to one stream of one device, destroyed on drop.
#[derive(Debug)]
pub struct Blas {
    h: *mut c_void,
    ordinal: usize,
}

// SAFETY: a cuBLAS handle may be used from any thread, one at a time; `Blas` is used through `&self` only by its
// owner's thread in Peerless (the bench).
crate::send_sync!(Blas);

impl Blas {
    /// A handle on `ctx`'s device that enqueues its work on `stream`.
    pub fn new(ctx: &Context, stream: &Stream) -> Result<Blas> {
        let s = sys()?;
        ctx.bind()?;
        let mut h = std::ptr::null_mut();
        // SAFETY: `h` is a valid out-pointer; the device's context is current.
        ck("cublasCreate", ctx.ordinal, unsafe { (s.create)(&mut h) })?;
        let b = Blas { h, ordinal: ctx.ordinal };
        // SAFETY: `h` is the live handle just made; `stream.s` a live stream of the same device.
        ck("cublasSetStream", ctx.ordinal, unsafe { (s.set_stream)(b.h, stream.s.cast()) })?;
        Ok(b)
    }

    /// Enqueues C = A·B for column-major bf16 `n`×`n` matrices (f32 accumulation).
    ///
    /// # Safety
    /// `a`, `b` and `c` are device allocations of at least `2 n²` bytes on the handle's device, valid until the GEMM
    /// completes.
    pub unsafe fn gemm_bf16(&self, n: usize, a: u64, b: u64, c: u64) -> Result<()> {
        let s = sys()?;
        let n = c_int::try_from(n).map_err(|_| Error::Invalid(format!("GEMM of {n}: too large")))?;
        let (one, zero) = (1.0f32, 0.0f32);
        let p = |x: &f32| (x as *const f32).cast::<c_void>();
        // SAFETY: the caller guarantees the three matrices; alpha and beta are f32 host values (compute type 32F),
        // alive for the call.
        let st = unsafe {
            (s.gemm_ex)(
                self.h,
                OP_N,
                OP_N,
                n,
                n,
                n,
                p(&one),
                a as *const c_void,
                BF16,
                n,
                b as *const c_void,
                BF16,
                n,
                p(&zero),
                c as *mut c_void,
                BF16,
                n,
                COMPUTE_32F,
                GEMM_DEFAULT,
            )
        };
        ck("cublasGemmEx", self.ordinal, st)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        if let Ok(s) = sys() {
            // SAFETY: destroys the handle made in `new`, once.
            let _ = unsafe { (s.destroy)(self.h) };
        }
    }
}
