//! hipRTC (feature `rocm`): HIP C++ source → an AMD GPU code object for one offload arch, at run time. Bound directly
//! like [`crate::hip`]; found by [`crate::libs::hiprtc`] (`libhiprtc.so` from ROCm 5.3 on, the HIP runtime itself
//! before). No GPU is needed to compile, so CI runs it against Debian's ROCm 5.2 packages.
//!
//! Every call is serialised by one process-wide lock: ROCm 5.2's hipRTC crashes (SIGSEGV) when two programs compile at
//! once in one process (measured: the two tests of `kernels/tests/rocm_hiprtc.rs` on two test threads), and compiles
//! are once per arch anyway.

use std::ffi::{c_char, c_int};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::{Error, Result};

type Program = *mut std::ffi::c_void;

crate::libs::entry_points! {
    /// The entry points, with `hiprtc.h`'s signatures (unchanged from ROCm 4.2 to 6.x).
    struct Sys {
        version: fn(*mut c_int, *mut c_int) -> c_int = "hiprtcVersion",
        get_error_string: fn(c_int) -> *const c_char = "hiprtcGetErrorString",
        create_program: fn(
            *mut Program, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char,
        ) -> c_int = "hiprtcCreateProgram",
        compile_program: fn(Program, c_int, *const *const c_char) -> c_int = "hiprtcCompileProgram",
        get_program_log_size: fn(Program, *mut usize) -> c_int = "hiprtcGetProgramLogSize",
        get_program_log: fn(Program, *mut c_char) -> c_int = "hiprtcGetProgramLog",
        get_code_size: fn(Program, *mut usize) -> c_int = "hiprtcGetCodeSize",
        get_code: fn(Program, *mut c_char) -> c_int = "hiprtcGetCode",
        destroy_program: fn(*mut Program) -> c_int = "hiprtcDestroyProgram",
    }
}

fn sys() -> Result<&'static Sys> {
    static SYS: OnceLock<Result<Sys>> = OnceLock::new();
    crate::once(&SYS, || {
        let loaded = crate::libs::hiprtc()?;
        Sys::load(&loaded.lib, |names, e| Error::Library {
            lib: "libhiprtc",
            reason: format!("{}: symbol {names} missing: {e}", loaded.path.display()),
        })
    })
}

/// The lock every hipRTC call holds (see the module docs). A poisoned lock only means a panic elsewhere while holding
/// it; hipRTC's state is not ours, so keep going.
fn serialised() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn status_text(s: &Sys, status: c_int) -> String {
    // SAFETY: hiprtcGetErrorString returns a static NUL-terminated string (or null).
    format!("hiprtcResult {status}: {}", unsafe { crate::c_text((s.get_error_string)(status)) })
}

fn ck(s: &Sys, call: &'static str, status: c_int) -> Result<()> {
    if status == 0 { Ok(()) } else { Err(Error::Call { call, device: None, status: status_text(s, status) }) }
}

/// hipRTC's version as (major, minor).
pub fn version() -> Result<(i32, i32)> {
    let s = sys()?;
    let _lock = serialised();
    let (mut a, mut b) = (0, 0);
    // SAFETY: both out-pointers outlive the call.
    ck(s, "hiprtcVersion", unsafe { (s.version)(&mut a, &mut b) })?;
    Ok((a, b))
}

/// Compiles `src` (named `name` in messages) for `arch` (an offload arch such as `gfx90a` or a device's full
/// `gcnArchName`, `gfx90a:sramecc+:xnack-`), with headers given as (name, contents). Returns the code object
/// `hipModuleLoadData` takes.
pub fn compile(name: &str, src: &str, headers: &[(&str, &str)], arch: &str) -> Result<Vec<u8>> {
    compile_with(name, src, headers, arch, &[])
}

/// [`compile`] with `extra` compiler options after the fixed ones. CI's check passes `-Werror`; the run-time path
/// passes none, so a newer compiler's new warning never stops a user's program.
pub fn compile_with(name: &str, src: &str, headers: &[(&str, &str)], arch: &str, extra: &[&str]) -> Result<Vec<u8>> {
    let s = sys()?;
    let (_c, c) = crate::c_strings(name, [src, name])?;
    let (_hn, hn) = crate::c_strings(name, headers.iter().map(|h| h.0))?;
    let (_hs, hs) = crate::c_strings(name, headers.iter().map(|h| h.1))?;
    let _lock = serialised();
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: every pointer is a NUL-terminated string alive for the call; counts match.
    ck(s, "hiprtcCreateProgram", unsafe {
        (s.create_program)(&mut prog, c[0], c[1], hn.len() as c_int, hs.as_ptr(), hn.as_ptr())
    })?;
    let result = (|| {
        let fixed = [format!("--offload-arch={arch}"), "-std=c++17".into(), "-O3".into()];
        let (_opts, optp) = crate::c_strings(name, fixed.iter().map(String::as_str).chain(extra.iter().copied()))?;
        // SAFETY: `prog` is live; the options are NUL-terminated strings alive for the call.
        let st = unsafe { (s.compile_program)(prog, optp.len() as c_int, optp.as_ptr()) };
        if st != 0 {
            let (mut n, mut buf) = (0usize, Vec::new());
            // SAFETY: `prog` is live; `n` outlives the call.
            if unsafe { (s.get_program_log_size)(prog, &mut n) } == 0 && n > 0 {
                buf = vec![0u8; n + 1];
                // SAFETY: `buf` holds the `n` bytes hipRTC reported, plus a NUL.
                if unsafe { (s.get_program_log)(prog, buf.as_mut_ptr() as *mut c_char) } != 0 {
                    buf.clear();
                }
            }
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            let log = String::from_utf8_lossy(&buf[..end]).into_owned();
            return Err(Error::HipCompile { name: name.into(), arch: arch.into(), status: status_text(s, st), log });
        }
        let mut n = 0usize;
        // SAFETY: `prog` compiled successfully; `n` outlives the call.
        ck(s, "hiprtcGetCodeSize", unsafe { (s.get_code_size)(prog, &mut n) })?;
        let mut code = vec![0u8; n];
        // SAFETY: `code` holds the `n` bytes hipRTC reported.
        ck(s, "hiprtcGetCode", unsafe { (s.get_code)(prog, code.as_mut_ptr() as *mut c_char) })?;
        if code.is_empty() {
            return Err(Error::Call {
                call: "hiprtcGetCode",
                device: None,
                status: format!("empty code object for {arch}"),
            });
        }
        Ok(code)
    })();
    // SAFETY: destroys the program created above, once.
    let _ = unsafe { (s.destroy_program)(&mut prog) };
    result
}
