//! Finding and probing the device libraries.
//!
//! - libcuda comes from the driver (`libcuda.so.1` on the loader path).
//! - libnvrtc: `PEERLESS_NVRTC_LIB` (a file), else the PyPI wheels' locations under every site-packages
//!   (`nvidia/cuda_nvrtc/lib/libnvrtc.so.12`, `nvidia/cu13/lib/libnvrtc.so.13`, ...), `LD_LIBRARY_PATH`,
//!   `CUDA_HOME`/`/usr/local/cuda`. The file is loaded by absolute path and kept loaded; cudarc's later load by name
//!   then resolves to it through its SONAME.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::{Error, Result};

/// Every site-packages / dist-packages directory worth searching: `python3`'s own list, the `PYTHONPATH` entries, and
/// the usual prefixes.
pub fn site_packages() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(p) = std::env::var("PYTHONPATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    let script = "import site,sys\nfor p in site.getsitepackages()+[site.getusersitepackages()]+sys.path: print(p)";
    for py in ["python3", "python"] {
        if let Ok(out) = std::process::Command::new(py).args(["-c", script]).output()
            && out.status.success()
        {
            dirs.extend(String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).map(PathBuf::from));
            break;
        }
    }
    for root in ["/usr/lib", "/usr/local/lib", "/opt/conda/lib"] {
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if name.starts_with("python3") {
                    dirs.push(e.path().join("site-packages"));
                    dirs.push(e.path().join("dist-packages"));
                }
            }
        }
    }
    dirs.retain(|d| d.is_dir());
    dirs.dedup();
    dirs
}

/// The file of the shared object (or executable) this code was loaded from: the mapping in `/proc/self/maps` that holds
/// this function. (`libpeerless_pjrt.so` finds XLA's plugins beside itself with it.)
pub fn own_path() -> Option<PathBuf> {
    let here = own_path as *const () as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some((lo, hi)) = fields.first().and_then(|r| r.split_once('-')) else { continue };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else { continue };
        if (lo..hi).contains(&here) && fields.len() > 5 && fields[5].starts_with('/') {
            return Some(PathBuf::from(fields[5..].join(" ")));
        }
    }
    None
}

fn ld_library_path() -> Vec<PathBuf> {
    std::env::var_os("LD_LIBRARY_PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default()
}

/// Files in `dir` whose name starts with `prefix` and is a versioned shared object (`libnvrtc.so.12`, not
/// `libnvrtc-builtins...`), best (highest major) first.
fn matching(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix)))
                .collect()
        })
        .unwrap_or_default();
    v.sort_by(|a, b| b.cmp(a));
    v
}

/// A library kept loaded for the life of the process.
#[derive(Debug)]
pub struct Loaded {
    pub path: PathBuf,
    pub lib: libloading::Library,
}

/// Loads the first that loads of: the file `env` names, `prefix*` in each of `dirs` (highest version first), then the
/// bare `sonames` for the loader's search path.
fn load_first(
    lib: &'static str,
    env: &str,
    dirs: impl IntoIterator<Item = PathBuf>,
    prefix: &str,
    sonames: &[&str],
) -> Result<Loaded> {
    let mut paths: Vec<PathBuf> = std::env::var_os(env).map(PathBuf::from).into_iter().collect();
    paths.extend(dirs.into_iter().flat_map(|d| matching(&d, prefix)));
    paths.extend(sonames.iter().map(PathBuf::from));
    let mut tried = Vec::new();
    for p in paths {
        // SAFETY: loading a vendor library runs its initialisers; NVIDIA's and AMD's (HIP, hipRTC) libraries have no
        // initialisers with preconditions on the caller.
        match unsafe { libloading::Library::new(&p) } {
            Ok(l) => return Ok(Loaded { path: p, lib: l }),
            Err(e) => tried.push(format!("{}: {e}", p.display())),
        }
    }
    let hint = if tried.is_empty() { "no candidate file found".to_string() } else { tried.join("; ") };
    Err(Error::Library { lib, reason: format!("{hint} (set {env} to the library file, or install the library)") })
}

/// Loads libnvrtc (see the module docs) once and makes sure cudarc resolves to it.
pub fn nvrtc() -> Result<&'static Loaded> {
    static NVRTC: OnceLock<Result<Loaded>> = OnceLock::new();
    crate::once(&NVRTC, || {
        let wheels = ["nvidia/cuda_nvrtc/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"];
        let cuda_home = std::env::var_os("CUDA_HOME").map(PathBuf::from).unwrap_or_else(|| "/usr/local/cuda".into());
        let dirs = site_packages().into_iter().flat_map(|sp| wheels.map(|w| sp.join(w)));
        let dirs = dirs.chain(ld_library_path()).chain([cuda_home.join("lib64")]);
        let loaded = load_first("libnvrtc", "PEERLESS_NVRTC_LIB", dirs, "libnvrtc.so.", &[])?;
        // SAFETY: probing only dlopens by name; no cudarc symbol is called.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::Library {
                lib: "libnvrtc",
                reason: format!("{} loaded, but its SONAME is not one cudarc loads", loaded.path.display()),
            });
        }
        Ok(loaded)
    })
}

/// Loads libcublas once (`PEERLESS_CUBLAS_LIB`, else the `nvidia-cublas` wheels that `jax[cuda13]` installs,
/// `LD_LIBRARY_PATH`, `CUDA_HOME`/`/usr/local/cuda`): only `peerless bench --beside-gemm` uses it, for the GEMM it runs
/// beside a collective.
pub fn cublas() -> Result<&'static Loaded> {
    static CUBLAS: OnceLock<Result<Loaded>> = OnceLock::new();
    crate::once(&CUBLAS, || {
        let wheels = ["nvidia/cublas/lib", "nvidia/cu13/lib", "nvidia/cu12/lib"];
        let cuda_home = std::env::var_os("CUDA_HOME").map(PathBuf::from).unwrap_or_else(|| "/usr/local/cuda".into());
        let dirs = site_packages().into_iter().flat_map(|sp| wheels.map(|w| sp.join(w)));
        let dirs = dirs.chain(ld_library_path()).chain([cuda_home.join("lib64")]);
        load_first("libcublas", "PEERLESS_CUBLAS_LIB", dirs, "libcublas.so.", &["libcublas.so.13", "libcublas.so.12"])
    })
}

/// Whether the CUDA driver library can be loaded.
pub fn cuda_present() -> bool {
    // SAFETY: probing only dlopens by name; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

// ---- ROCm (feature `rocm`) ----

/// Directories of a ROCm install, best first: `ROCM_PATH` (`/usr` for Debian's packages), `HIP_PATH`, `/opt/rocm`, then
/// Debian's multiarch directory and `LD_LIBRARY_PATH`.
#[cfg(feature = "rocm")]
fn rocm_lib_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> =
        ["ROCM_PATH", "HIP_PATH"].iter().filter_map(std::env::var_os).map(PathBuf::from).collect();
    roots.push("/opt/rocm".into());
    let mut dirs: Vec<PathBuf> = roots.iter().flat_map(|r| [r.join("lib"), r.join("lib64")]).collect();
    dirs.push("/usr/lib/x86_64-linux-gnu".into());
    dirs.extend(ld_library_path());
    dirs.retain(|d| d.is_dir());
    dirs.dedup();
    dirs
}

/// Loads the HIP runtime (`libamdhip64`) once: `PEERLESS_HIP_LIB`, then the ROCm directories (see [`rocm_lib_dirs`]),
/// then `libamdhip64.so.6` / `.so.5` / `.so` by name.
#[cfg(feature = "rocm")]
pub fn hip() -> Result<&'static Loaded> {
    static HIP: OnceLock<Result<Loaded>> = OnceLock::new();
    let sonames = ["libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"];
    crate::once(&HIP, || load_first("libamdhip64", "PEERLESS_HIP_LIB", rocm_lib_dirs(), "libamdhip64.so", &sonames))
}

/// Loads hipRTC once: `PEERLESS_HIPRTC_LIB`, then `libhiprtc.so*` (ROCm 5.3 and later ship it as its own library), then
/// the HIP runtime itself, which exports the hiprtc* entry points in ROCm up to 5.2 (Debian bookworm's 5.2.3).
#[cfg(feature = "rocm")]
pub fn hiprtc() -> Result<&'static Loaded> {
    static HIPRTC: OnceLock<Result<Loaded>> = OnceLock::new();
    crate::once(&HIPRTC, || {
        let sonames = ["libhiprtc.so.6", "libhiprtc.so.5"];
        let e = match load_first("libhiprtc", "PEERLESS_HIPRTC_LIB", rocm_lib_dirs(), "libhiprtc.so", &sonames) {
            Ok(l) => return Ok(l),
            Err(e) => e,
        };
        let hip = hip().map_err(|h| Error::Library {
            lib: "libhiprtc",
            reason: format!("{e}; and the HIP runtime is unavailable too: {h}"),
        })?;
        // SAFETY: the HIP runtime is already loaded (no initialisers run again); this only takes a second reference to
        // it, kept for the life of the process.
        match unsafe { libloading::Library::new(&hip.path) } {
            Ok(lib) => Ok(Loaded { path: hip.path.clone(), lib }),
            Err(e) => Err(Error::Library { lib: "libhiprtc", reason: format!("{}: {e}", hip.path.display()) }),
        }
    })
}

/// Declares `struct $name`, a table of C entry points, and `$name::load`, which fills each field with the first of its
/// symbol names (`"a" | "b"`) that `lib` exports. `missing(names, error)` is the error for a field none of whose names
/// resolve (`names` joined by " / "). The invocation vouches that each field's type is the C signature of its symbols.
macro_rules! entry_points {
    ($(#[$m:meta])* struct $name:ident {
        $($field:ident: fn($($arg:ty),* $(,)?) -> $ret:ty = $($sym:literal)|+,)*
    }) => {
        $(#[$m])*
        struct $name {
            $($field: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl $name {
            fn load(
                lib: &libloading::Library,
                missing: impl Fn(String, libloading::Error) -> $crate::Error,
            ) -> $crate::Result<$name> {
                Ok($name {$($field: {
                    let names = [$(concat!($sym, "\0")),+];
                    // SAFETY: the field's type is the C signature of each of its symbols (the invocation's contract);
                    // the library stays loaded for the process.
                    let get = |n: &str| unsafe { lib.get(n.as_bytes()) }.map(|s| *s);
                    names[1..].iter().fold(get(names[0]), |r, n| r.or_else(|_| get(n)))
                        .map_err(|e| missing([$($sym),+].join(" / "), e))?
                },)*})
            }
        }
    };
}
pub(crate) use entry_points;
