//! NVRTC: CUDA C++ source → PTX or CUBIN for one architecture.

use std::ffi::c_char;

use cudarc::nvrtc::{result as r, sys};

use crate::{Error, Result, guarded};

/// What to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// PTX text (`compute_XY`).
    Ptx,
    /// Machine code (`sm_XY`), loadable without the driver's PTX JIT.
    Cubin,
}

/// NVRTC's version as (major, minor).
pub fn version() -> Result<(i32, i32)> {
    crate::libs::nvrtc()?;
    let (mut a, mut b) = (0, 0);
    // SAFETY: both out-pointers outlive the call.
    let s = guarded("nvrtcVersion", None, || unsafe { sys::nvrtcVersion(&mut a, &mut b) })?;
    s.result().map_err(|e| Error::Call { call: "nvrtcVersion", device: None, status: format!("{e:?}") })?;
    Ok((a, b))
}

/// Compiles `src` (named `name` in messages) for compute capability `cc` (e.g. 90), with headers given as (name,
/// contents).
pub fn compile(name: &str, src: &str, headers: &[(&str, &str)], cc: u32, out: Output) -> Result<Vec<u8>> {
    crate::libs::nvrtc()?;
    let arch = match out {
        Output::Ptx => format!("compute_{cc}"),
        Output::Cubin => format!("sm_{cc}"),
    };
    let (_c, c) = crate::c_strings(name, [src, name])?;
    let (_hn, hn) = crate::c_strings(name, headers.iter().map(|h| h.0))?;
    let (_hs, hs) = crate::c_strings(name, headers.iter().map(|h| h.1))?;
    let ok = |call: &'static str, s: sys::nvrtcResult| match s {
        sys::nvrtcResult::NVRTC_SUCCESS => Ok(()),
        s => Err(Error::Call { call, device: None, status: format!("{s:?}") }),
    };
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is a NUL-terminated string alive for the call; counts match.
    let s = guarded("nvrtcCreateProgram", None, || unsafe {
        sys::nvrtcCreateProgram(&mut prog, c[0], c[1], hn.len() as i32, hs.as_ptr(), hn.as_ptr())
    })?;
    ok("nvrtcCreateProgram", s)?;
    let result = (|| {
        let opts = [format!("--gpu-architecture={arch}"), "--std=c++17".into(), "-default-device".into()];
        // SAFETY: `prog` is a live program; options are plain strings.
        let c = guarded("nvrtcCompileProgram", None, || unsafe { r::compile_program(prog, &opts) })?;
        if let Err(e) = c {
            // SAFETY: `prog` is live; the log is read after compilation.
            let log = guarded("nvrtcGetProgramLog", None, || unsafe { r::get_program_log(prog) })?
                // SAFETY: NVRTC's log is NUL-terminated.
                .map(|l| unsafe { crate::c_text(l.as_ptr()) })
                .unwrap_or_default();
            return Err(Error::Compile { name: name.into(), arch: arch.clone(), status: format!("{e:?}"), log });
        }
        match out {
            Output::Ptx => {
                // SAFETY: `prog` compiled successfully.
                let p = guarded("nvrtcGetPTX", None, || unsafe { r::get_ptx(prog) })?.map_err(|e| Error::Call {
                    call: "nvrtcGetPTX",
                    device: None,
                    status: format!("{e:?}"),
                })?;
                Ok(p.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect())
            }
            Output::Cubin => {
                let mut n = 0usize;
                // SAFETY: `prog` compiled for a real architecture; `n` outlives the call.
                let s = guarded("nvrtcGetCUBINSize", None, || unsafe { sys::nvrtcGetCUBINSize(prog, &mut n) })?;
                ok("nvrtcGetCUBINSize", s)?;
                let mut buf = vec![0u8; n];
                // SAFETY: `buf` holds the `n` bytes NVRTC reported.
                let s = guarded("nvrtcGetCUBIN", None, || unsafe {
                    sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char)
                })?;
                ok("nvrtcGetCUBIN", s)?;
                Ok(buf)
            }
        }
    })();
    // SAFETY: destroys the program created above, once.
    let _ = guarded("nvrtcDestroyProgram", None, || unsafe { r::destroy_program(prog) });
    result
}
