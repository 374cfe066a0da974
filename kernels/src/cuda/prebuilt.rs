//! Prebuilt kernels: every compilation unit ([`Unit`]) compiled ahead of time for the GPUs people run, bundled into the
//! library, so a process on such a GPU needs no NVRTC and waits for no compile.
//!
//! `peerless kernels build --out FILE` makes a bundle ([`build`]: CUBIN for sm_80, sm_90 and sm_100, PTX for
//! compute_100); building the library with `PEERLESS_PREBUILT_KERNELS=FILE` embeds it (kernels/build.rs;
//! `scripts/build_wheel.sh` does both). The bundle is a protobuf message ([`Bundle`]), each code object named by its
//! target and unit and keyed by [`Unit::key`], so code made from other sources is never loaded.
//!
//! Which code a device gets ([`choose`]): CUBIN for its exact architecture; else CUBIN of the same major version and a
//! lower minor (sm_80 runs on sm_86 and sm_89: SASS is compatible within a major version); else the newest PTX at or
//! below it, which the driver compiles for the device on load (sm_103, sm_110, sm_120, ...) and keeps in its own cache.
//! A device older than every target (sm_75) compiles with NVRTC on first use, one unit at a time.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{OnceLock, PoisonError};

use bytes::Bytes;
use ffi::nvrtc::Output;
use prost::Message;

use crate::gpu::Unit;
use crate::{Error, Result};

/// What `peerless kernels build` compiles for when given no targets.
pub const DEFAULT_TARGETS: &[&str] = &["sm_80", "sm_90", "sm_100", "compute_100"];

/// A set of compiled units.
#[derive(Clone, PartialEq, Message)]
pub struct Bundle {
    /// The compiler that made it (`NVRTC 12.9`), for reports.
    #[prost(string, tag = "1")]
    pub compiler: String,
    #[prost(message, repeated, tag = "2")]
    pub blobs: Vec<Blob>,
}

/// One unit's code for one target.
#[derive(Clone, PartialEq, Message)]
pub struct Blob {
    /// `sm_90` (CUBIN) or `compute_100` (PTX).
    #[prost(string, tag = "1")]
    pub target: String,
    /// [`Unit::name`].
    #[prost(string, tag = "2")]
    pub unit: String,
    /// [`Unit::key`] of the sources it was compiled from.
    #[prost(string, tag = "3")]
    pub key: String,
    /// The code, deflated when `deflated` (every blob `build` makes).
    #[prost(bytes = "bytes", tag = "4")]
    pub code: Bytes,
    #[prost(bool, tag = "5")]
    pub deflated: bool,
}

impl Blob {
    /// The code as the driver loads it.
    pub fn code(&self) -> Result<Vec<u8>> {
        if !self.deflated {
            return Ok(self.code.to_vec());
        }
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::DeflateDecoder::new(&self.code[..]), &mut out)
            .map_err(|e| Error::Gpu(format!("prebuilt kernels {} for {}: {e}", self.unit, self.target)))?;
        Ok(out)
    }
}

fn deflate(code: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write;
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(code).and_then(|()| enc.finish()).map_err(|e| Error::Gpu(format!("deflate: {e}")))
}

/// A compile target: CUBIN for `sm_XY` or PTX for `compute_XY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub cc: u32,
    pub out: Output,
}

impl Target {
    pub fn parse(s: &str) -> Result<Target> {
        let bad = || Error::Gpu(format!("not a CUDA target: '{s}' (sm_XY for CUBIN, compute_XY for PTX)"));
        let (out, cc) = match (s.strip_prefix("sm_"), s.strip_prefix("compute_")) {
            (Some(cc), _) => (Output::Cubin, cc),
            (_, Some(cc)) => (Output::Ptx, cc),
            _ => return Err(bad()),
        };
        Ok(Target { cc: cc.parse().map_err(|_| bad())?, out })
    }

    pub fn name(self) -> String {
        match self.out {
            Output::Cubin => format!("sm_{}", self.cc),
            Output::Ptx => format!("compute_{}", self.cc),
        }
    }
}

/// The bundle embedded at build time (empty unless `PEERLESS_PREBUILT_KERNELS` was set).
static EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/prebuilt_kernels.pb"));

/// The embedded bundle, decoded once (`None`: none embedded, or `PEERLESS_PREBUILT_KERNELS=0` at run time, which makes
/// every unit compile or come from the disk cache).
pub fn embedded() -> Option<&'static Bundle> {
    static DECODED: OnceLock<Option<Bundle>> = OnceLock::new();
    if std::env::var("PEERLESS_PREBUILT_KERNELS").is_ok_and(|v| v == "0") {
        return None;
    }
    DECODED
        .get_or_init(|| {
            if EMBEDDED.is_empty() {
                return None;
            }
            // Slices of the static image: no copy of the code.
            Bundle::decode(Bytes::from_static(EMBEDDED))
                .map_err(|e| log::warn!("the embedded kernel bundle does not decode ({e}); compiling instead"))
                .ok()
        })
        .as_ref()
}

/// Which of `targets` serves a device of compute capability `cc` (see the module doc), best first: exact CUBIN,
/// same-major CUBIN (highest minor not above), then PTX (highest not above).
pub fn choose(targets: &[Target], cc: u32) -> Vec<Target> {
    let mut cubins: Vec<Target> =
        targets.iter().copied().filter(|t| t.out == Output::Cubin && t.cc / 10 == cc / 10 && t.cc <= cc).collect();
    cubins.sort_by_key(|t| std::cmp::Reverse(t.cc));
    let mut ptx: Vec<Target> = targets.iter().copied().filter(|t| t.out == Output::Ptx && t.cc <= cc).collect();
    ptx.sort_by_key(|t| std::cmp::Reverse(t.cc));
    cubins.dedup();
    ptx.dedup();
    cubins.into_iter().chain(ptx).collect()
}

impl Bundle {
    /// The targets this bundle holds code for.
    pub fn targets(&self) -> Vec<Target> {
        let mut v: Vec<Target> = self.blobs.iter().filter_map(|b| Target::parse(&b.target).ok()).collect();
        v.sort_by_key(|t| (t.cc, t.out == Output::Ptx));
        v.dedup();
        v
    }

    /// `unit`'s blob for a device of compute capability `cc`, from the best target that has it under the current key;
    /// with that target.
    pub fn find(&self, cc: u32, unit: Unit) -> Option<(Target, &Blob)> {
        let (name, key) = (unit.name(), unit.key());
        choose(&self.targets(), cc).into_iter().find_map(|t| {
            let target = t.name();
            self.blobs.iter().find(|b| b.target == target && b.unit == name && b.key == key).map(|b| (t, b))
        })
    }
}

/// Compiles every unit for every target on `jobs` threads, calling `progress(done, total)` after each.
pub fn build(targets: &[Target], jobs: usize, progress: impl Fn(usize, usize) + Sync) -> Result<Bundle> {
    let (major, minor) = ffi::nvrtc::version()?;
    let work: Vec<(Target, Unit)> =
        targets.iter().flat_map(|&t| Unit::all().into_iter().map(move |u| (t, u))).collect();
    let (next, done) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    let Some(&(t, u)) = work.get(i) else { break };
                    let r = compile(u, t).and_then(|code| {
                        let (target, unit, key, code) = (t.name(), u.name(), u.key(), deflate(&code)?.into());
                        Ok(Blob { target, unit, key, code, deflated: true })
                    });
                    let failed = r.is_err();
                    results.lock().unwrap_or_else(PoisonError::into_inner).push((i, r));
                    progress(done.fetch_add(1, Relaxed) + 1, work.len());
                    if failed {
                        // Stop handing out work: the first error is the answer.
                        next.store(work.len(), Relaxed);
                    }
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
    results.sort_by_key(|r| r.0);
    let blobs = results.into_iter().map(|(_, r)| r).collect::<Result<Vec<_>>>()?;
    Ok(Bundle { compiler: format!("NVRTC {major}.{minor}"), blobs })
}

/// One unit for one target with NVRTC.
pub fn compile(unit: Unit, t: Target) -> Result<Vec<u8>> {
    let (name, src, headers) = unit.source();
    Ok(ffi::nvrtc::compile(&format!("{name} [{}]", unit.name()), &src, &headers, t.cc, t.out)?)
}
