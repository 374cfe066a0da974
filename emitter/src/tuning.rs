//! Tuning profiles: measured crossovers between Peerless's kernels and XLA's own collectives. `peerless tune` writes a
//! [`Profile`] (JSON under `<cache>/tuning/<key>.json`, keyed by platform, device kind and count, links and version);
//! the pass ([`crate::decide`], rule 7) reads the matching one, found through [`ProfileSource`]. A profile only chooses
//! among what the guards allow, flags win over it, and an unreadable one is a warning, never a failed compile.
//! ARCHITECTURE.md ("emitter", "Invariant (tuning)") has the sources in order and the rules.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hlo::PrimitiveType;
use serde::{Deserialize, Serialize};
use thunks::{CollectiveKind, KernelAlgorithm};

use crate::flags::{Backend, Flags};

/// Environment variable naming the profile: a path, or `0` / `off` / `none` for none.
pub const ENV_VAR: &str = "PEERLESS_TUNING_PROFILE";
/// The profile format this build reads and writes.
pub const FORMAT: u32 = 1;
/// This build's version, part of every profile's key.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The name XLA's path has in a profile's figures.
pub const XLA: &str = "xla";
/// A kernel is chosen over XLA only if the profile measured it this much faster (a fraction of XLA's time): closer
/// calls are within a tune's noise, and XLA's path is the safe side.
pub const XLA_MARGIN: f64 = 0.05;

/// What a profile was measured on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// "cpu" or "cuda".
    pub platform: String,
    /// The device kind ("cpu"; a GPU's name).
    pub device_kind: String,
    /// Devices of the client the profile was measured on.
    pub devices: usize,
    /// "host" (one address space), or the GPUs' peer links ("nvlink", "pcie", ...).
    pub links: String,
}

impl Key {
    /// The file name in the cache's `tuning/` directory: every part, made path-safe.
    pub fn file_name(&self) -> String {
        let safe = |s: &str| -> String {
            s.chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c.to_ascii_lowercase() } else { '_' })
                .collect()
        };
        format!(
            "{}-{}-{}dev-{}-v{}.json",
            safe(&self.platform),
            safe(&self.device_kind),
            self.devices,
            safe(&self.links),
            safe(VERSION)
        )
    }
}

/// Where and how a profile was measured.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measured {
    pub date: String,
    pub machine: String,
    pub command: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// One measured size: XLA's time and each kernel algorithm's, µs per collective.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Operand bytes per device.
    pub bytes: usize,
    /// Implementation ([`XLA`] or a [`KernelAlgorithm::name`]) → µs per collective.
    pub us: BTreeMap<String, f64>,
}

impl Point {
    /// Whether kernel `imp` beat XLA here by more than [`XLA_MARGIN`] (false where either was not measured).
    pub fn beats_xla(&self, imp: &str) -> bool {
        matches!((self.us.get(imp), self.us.get(XLA)), (Some(&k), Some(&x)) if k < x * (1.0 - XLA_MARGIN))
    }

    /// What the pass takes at exactly this size among everything measured: the fastest kernel where it beat XLA by more
    /// than the margin, else [`XLA`]; `None` without XLA's figure.
    pub fn winner(&self) -> Option<&str> {
        self.us.get(XLA)?;
        let fastest = self.us.iter().filter(|(n, _)| *n != XLA).min_by(|a, b| a.1.total_cmp(b.1));
        Some(match fastest {
            Some((name, _)) if self.beats_xla(name) => name,
            _ => XLA,
        })
    }
}

/// The measurements of one collective kind, dtype class and group size, by size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The collective's HLO name ("all-reduce", ...).
    pub op: String,
    /// [`dtype_class`] of the operands.
    pub dtype: String,
    /// Members per group (a permute: devices in its cross pairs).
    pub group: usize,
    /// Ascending sizes.
    pub points: Vec<Point>,
}

/// A tuning profile. See the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub format: u32,
    pub peerless_version: String,
    pub key: Key,
    pub measured: Measured,
    pub entries: Vec<Entry>,
    /// Where it was read from (a path, or "shipped ..."); not stored.
    #[serde(skip)]
    pub source: String,
}

/// The class a dtype is measured under: floats by width (f16 and bf16 share one), integers by width, pred.
pub fn dtype_class(ty: PrimitiveType) -> String {
    use PrimitiveType as T;
    match ty {
        T::F16 | T::Bf16 => "f16/bf16".into(),
        T::Pred => "pred".into(),
        t if t.is_float() => format!("f{}", 8 * t.byte_size()),
        t => format!("int{}", 8 * t.byte_size()),
    }
}

/// Bytes per element of a [`dtype_class`] (0 if unknown).
fn class_width(class: &str) -> usize {
    match class {
        "f16/bf16" | "int16" => 2,
        "pred" | "int8" => 1,
        "f32" | "int32" => 4,
        "f64" | "int64" => 8,
        _ => 0,
    }
}

fn short_bytes(b: usize) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// Short names of implementations in reasons.
fn short_impl(name: &str) -> &str {
    match name {
        "one-shot all-reduce" => "one-shot",
        "two-shot all-reduce" => "two-shot",
        "direct all-gather" | "direct all-to-all" | "direct reduce-scatter" | "direct permute" => "kernel",
        XLA => "XLA",
        other => other,
    }
}

/// The HLO name of a collective kind (its synchronous opcode).
pub fn kind_name(kind: CollectiveKind) -> &'static str {
    thunks::CollectiveOp { kind, is_async: false }.name()
}

/// A profile's answer for one collective: a kernel algorithm or XLA (`None`), and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    pub algorithm: Option<KernelAlgorithm>,
    pub reason: String,
}

impl Profile {
    /// An empty profile for `key`.
    pub fn new(key: Key, measured: Measured) -> Profile {
        Profile {
            format: FORMAT,
            peerless_version: VERSION.into(),
            key,
            measured,
            entries: Vec::new(),
            source: String::new(),
        }
    }

    /// Records one measurement (`imp`: [`XLA`] or a kernel algorithm's name).
    pub fn record(&mut self, op: &str, class: &str, group: usize, bytes: usize, imp: &str, us: f64) {
        let i = match self.entries.iter().position(|e| e.op == op && e.dtype == class && e.group == group) {
            Some(i) => i,
            None => {
                self.entries.push(Entry { op: op.into(), dtype: class.into(), group, points: Vec::new() });
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[i];
        let at = e.points.partition_point(|p| p.bytes < bytes);
        if e.points.get(at).is_none_or(|p| p.bytes != bytes) {
            e.points.insert(at, Point { bytes, us: BTreeMap::new() });
        }
        // Hundredths of a µs: readable, and the JSON reads back to the same value.
        e.points[at].us.insert(imp.into(), (us * 100.0).round() / 100.0);
    }

    /// Pretty JSON (what [`Profile::save`] writes).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// Reads a profile from JSON; `source` names it in reasons.
    pub fn from_json(text: &str, source: &str) -> Result<Profile, String> {
        let mut p: Profile = serde_json::from_str(text).map_err(|e| format!("{source}: not a tuning profile: {e}"))?;
        if p.format != FORMAT {
            return Err(format!("{source}: profile format {} (this build reads {FORMAT})", p.format));
        }
        for e in &mut p.entries {
            e.points.sort_by_key(|p| p.bytes);
        }
        p.source = source.into();
        Ok(p)
    }

    /// Writes the profile to `dir/<key file name>`, creating `dir`; returns the path.
    pub fn save(&self, dir: &Path) -> Result<PathBuf, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(self.key.file_name());
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        std::fs::write(&tmp, self.to_json() + "\n").map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// The points measured for exactly `op`, dtype class and group size (none if unmeasured).
    pub fn points(&self, op: &str, class: &str, group: usize) -> &[Point] {
        self.entries
            .iter()
            .find(|e| e.op == op && e.dtype == class && e.group == group)
            .map_or(&[], |e| e.points.as_slice())
    }

    /// The entry for `op`, dtype class and group size: the class itself, else one of the same element width, else the
    /// nearest width; the group size itself, else the nearest (the larger on a tie).
    fn entry(&self, op: &str, class: &str, group: usize) -> Option<&Entry> {
        let width = class_width(class);
        let rank = |e: &Entry| -> (usize, usize, usize) {
            let cls = match class_width(&e.dtype) {
                _ if e.dtype == class => 0,
                w if w == width => 1,
                w => 2 + w.abs_diff(width),
            };
            (cls, e.group.abs_diff(group), usize::MAX - e.group)
        };
        self.entries.iter().filter(|e| e.op == op && !e.points.is_empty()).min_by_key(|e| rank(e))
    }

    /// What the profile says for `kind` on `ty`, groups of `group`, `bytes` per device, choosing among XLA and
    /// `allowed` kernels; `None` where it measured nothing for the op.
    pub fn choose(
        &self,
        kind: CollectiveKind,
        ty: PrimitiveType,
        group: usize,
        bytes: usize,
        allowed: &[KernelAlgorithm],
    ) -> Option<Choice> {
        let class = dtype_class(ty);
        let e = self.entry(kind_name(kind), &class, group)?;
        let points = monotone(&e.points);
        // The measured points around `bytes` (one point at or past either end).
        let hi = points.partition_point(|p| p.bytes < bytes).min(points.len() - 1);
        let lo = if points[hi].bytes > bytes && hi > 0 { hi - 1 } else { hi };
        let (p0, p1) = (&points[lo], &points[hi]);
        // Log-log interpolation between the two sizes.
        let frac = if p0.bytes == p1.bytes || bytes <= p0.bytes {
            0.0
        } else {
            ((bytes as f64).ln() - (p0.bytes as f64).ln()) / ((p1.bytes as f64).ln() - (p0.bytes as f64).ln())
        };
        let at = |imp: &str| -> Option<f64> {
            let (a, b) = (*p0.us.get(imp)?, *p1.us.get(imp)?);
            (a > 0.0 && b > 0.0).then(|| (a.ln() + frac * (b.ln() - a.ln())).exp())
        };
        let names = std::iter::once(XLA).chain(allowed.iter().map(|a| a.name()));
        let candidates: Vec<(&str, f64)> = names.filter_map(|n| Some((n, at(n)?))).collect();
        // Without XLA's time, or without any allowed kernel's, there is nothing to compare.
        let xla = candidates.iter().find(|c| c.0 == XLA)?.1;
        if candidates.len() < 2 {
            return None;
        }
        let fastest = *candidates.iter().min_by(|a, b| a.1.total_cmp(&b.1))?;
        // A kernel must beat XLA by more than the margin at every measured size the decision rests on (both neighbours
        // between two sizes). Closer than the margin the two were within the measurement's noise; where the neighbours
        // disagree the crossover lies between them, unmeasured. XLA's own path is the safe side.
        let ends: &[&Point] = if frac == 0.0 { &[p0] } else { &[p0, p1] };
        let falls_short = |imp: &str| ends.iter().find(|p| !p.beats_xla(imp)).map(|p| p.bytes);
        let best = candidates
            .iter()
            .filter(|c| c.0 == XLA || falls_short(c.0).is_none())
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .copied()
            .unwrap_or((XLA, xla));
        let figures: Vec<String> = candidates.iter().map(|(n, t)| format!("{} {t:.0} µs", short_impl(n))).collect();
        let mut reason = format!("profile {}: {} {} groups of {}", self.source, kind_name(kind), e.dtype, e.group);
        let mut nearest = Vec::new();
        if e.dtype != class {
            nearest.push(class.clone());
        }
        if e.group != group {
            nearest.push(format!("groups of {group}"));
        }
        if !nearest.is_empty() {
            let _ = write!(reason, " (nearest measured to {})", nearest.join(", "));
        }
        let _ = write!(reason, " at {}: {}", short_bytes(bytes), figures.join(", "));
        if p0.bytes == p1.bytes || frac == 0.0 {
            let _ = write!(reason, " (measured at {})", short_bytes(p0.bytes));
        } else {
            let _ = write!(reason, " (between {} and {})", short_bytes(p0.bytes), short_bytes(p1.bytes));
        }
        let _ = write!(reason, " -> {}", short_impl(best.0));
        if fastest.0 != best.0
            && let Some(at) = falls_short(fastest.0)
        {
            let _ = write!(
                reason,
                " ({} not {:.0}% faster than XLA at {})",
                short_impl(fastest.0),
                XLA_MARGIN * 100.0,
                short_bytes(at)
            );
        }
        let algorithm = KernelAlgorithm::ALL.into_iter().find(|a| a.name() == best.0);
        Some(Choice { algorithm, reason })
    }
}

/// `points` with each implementation's time at a size the least it measured there or above: the same algorithm moving
/// fewer bytes does not take longer, so a smaller size measured slower was noise (the shipped Hopper profile's f32
/// all-to-all ×4 at 256 KiB, which left FSDP's to XLA).
fn monotone(points: &[Point]) -> Vec<Point> {
    let mut least: BTreeMap<String, f64> = BTreeMap::new();
    let mut out = Vec::with_capacity(points.len());
    for p in points.iter().rev() {
        let mut us = p.us.clone();
        for (name, t) in &mut us {
            let m = least.entry(name.clone()).or_insert(f64::INFINITY);
            *m = m.min(*t);
            *t = *m;
        }
        out.push(Point { bytes: p.bytes, us });
    }
    out.reverse();
    out
}

/// Where the pass takes its profile from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ProfileSource {
    /// No profile: the flags' thresholds decide (the library's tests, `peerless tune`).
    #[default]
    Off,
    /// The cache directory's profile for this machine, else the shipped defaults.
    Default,
    /// This file.
    File(PathBuf),
}

impl ProfileSource {
    /// [`ENV_VAR`]: unset or empty → [`ProfileSource::Default`]; `0`, `off`, `none` → off;
    /// anything else is a path.
    pub fn from_env() -> ProfileSource {
        match std::env::var_os(ENV_VAR).filter(|v| !v.is_empty()) {
            None => ProfileSource::Default,
            Some(v) if matches!(v.to_str(), Some("0" | "off" | "none")) => ProfileSource::Off,
            Some(v) => ProfileSource::File(v.into()),
        }
    }

    /// The profile for a module on `devices` devices of `platform` whose devices are of `kind` (`None`: unknown), or
    /// `None` (thresholds).
    pub fn select(&self, platform: &str, devices: usize, kind: Option<&str>) -> Option<Arc<Profile>> {
        match self {
            ProfileSource::Off => None,
            ProfileSource::File(p) => match load(p) {
                Ok(prof) if prof.key.platform == platform => Some(prof),
                Ok(prof) => {
                    log::warn!(
                        "peerless: tuning profile {} is for platform {}, not {platform}: not used",
                        p.display(),
                        prof.key.platform
                    );
                    None
                }
                Err(e) => {
                    log::warn!("peerless: tuning profile not used: {e}");
                    None
                }
            },
            ProfileSource::Default => cached(platform, devices, kind).or_else(|| shipped(platform, kind)),
        }
    }
}

/// Where profiles are kept: `<cache dir>/tuning` ([`thunks::runtime::cache_dir`]).
pub fn profile_dir() -> Option<PathBuf> {
    Some(thunks::runtime::cache_dir()?.join("tuning"))
}

/// Profiles read so far, by path, with the file's length and modification time (a file rewritten by a later `peerless
/// tune` is read again).
static LOADED: Mutex<BTreeMap<PathBuf, (u64, Option<std::time::SystemTime>, Arc<Profile>)>> =
    Mutex::new(BTreeMap::new());

/// Reads the profile at `path` (once per version of the file).
pub fn load(path: &Path) -> Result<Arc<Profile>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let stamp = (meta.len(), meta.modified().ok());
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((len, time, p)) = loaded.get(path)
        && (*len, *time) == stamp
    {
        return Ok(p.clone());
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let p = Arc::new(Profile::from_json(&text, &path.display().to_string())?);
    loaded.insert(path.to_owned(), (stamp.0, stamp.1, p.clone()));
    Ok(p)
}

/// Whether a profile measured on devices of kind `measured` may decide for devices of kind `kind`: the same kind, or
/// either unknown (`None`, or a profile written before the key named GPUs, which says "gpu").
fn kind_fits(measured: &str, kind: Option<&str>) -> bool {
    kind.is_none_or(|k| measured == k || measured == "gpu" || measured.is_empty())
}

/// The cache directory's profile for `platform` on `devices` devices of `kind`, of this version: the one of that kind
/// (else one of unknown kind) whose key names that count, else the one of the nearest count.
fn cached(platform: &str, devices: usize, kind: Option<&str>) -> Option<Arc<Profile>> {
    let dir = profile_dir()?;
    let entries = std::fs::read_dir(&dir).ok()?;
    let prefix = format!("{platform}-");
    let suffix = format!("-v{VERSION}.json");
    let mut best: Option<((usize, usize), Arc<Profile>)> = None;
    for f in entries.flatten() {
        let name = f.file_name().to_string_lossy().into_owned();
        if !(name.starts_with(&prefix) && name.ends_with(&suffix)) {
            continue;
        }
        match load(&f.path()) {
            Ok(p)
                if p.key.platform == platform
                    && p.peerless_version == VERSION
                    && kind_fits(&p.key.device_kind, kind) =>
            {
                // The same kind before an unknown one, then the nearest count.
                let d = (usize::from(Some(p.key.device_kind.as_str()) != kind), p.key.devices.abs_diff(devices));
                if best.as_ref().is_none_or(|(bd, _)| d < *bd) {
                    best = Some((d, p));
                }
            }
            Ok(_) => {}
            Err(e) => log::warn!("peerless: tuning profile not used: {e}"),
        }
    }
    best.map(|(_, p)| p)
}

/// A profile shipped in the library: measured on a machine we ran, used where the cache holds none for the platform and
/// device kind.
struct Shipped {
    platform: &'static str,
    /// Its name in reasons ("shipped xla-cpu (date)").
    name: &'static str,
    /// The device kinds it decides for, as XLA names them (empty: any).
    kinds: &'static [&'static str],
    json: &'static str,
}

/// The shipped profiles (`emitter/profiles/`; each file says where, when and how it was measured).
const SHIPPED: &[Shipped] = &[
    Shipped { platform: "cpu", name: "xla-cpu", kinds: &[], json: include_str!("../profiles/xla-cpu.json") },
    // Hopper with NVLink: measured on 4x H200 (groups of 2 and 4); H100 SXM has the same kernels (sm_90) and links.
    // PCIe and NVL parts are other kinds: not covered.
    Shipped {
        platform: "cuda",
        name: "cuda-hopper-nvlink",
        kinds: &["NVIDIA H200", "NVIDIA H100 80GB HBM3"],
        json: include_str!("../profiles/cuda-hopper-nvlink.json"),
    },
];

/// The shipped defaults for `platform` and device `kind`: XLA:CPU's, measured on the build machine, and Hopper NVLink
/// GPUs', measured on 4x H200. Other GPUs have none: the flags' thresholds decide there.
pub fn shipped(platform: &str, kind: Option<&str>) -> Option<Arc<Profile>> {
    static PARSED: std::sync::OnceLock<Vec<Option<Arc<Profile>>>> = std::sync::OnceLock::new();
    let parsed = PARSED.get_or_init(|| {
        SHIPPED
            .iter()
            .map(|s| match Profile::from_json(s.json, &format!("shipped {}", s.name)) {
                Ok(mut p) => {
                    p.source = format!("shipped {} ({})", s.name, p.measured.date);
                    Some(Arc::new(p))
                }
                Err(e) => {
                    log::warn!("peerless: {e}");
                    None
                }
            })
            .collect()
    });
    SHIPPED
        .iter()
        .zip(parsed)
        .find(|(s, _)| s.platform == platform && (s.kinds.is_empty() || kind.is_some_and(|k| s.kinds.contains(&k))))
        .and_then(|(_, p)| p.clone())
}

/// What the rules need of tuning for one run: the profile (if any) and whether the flags set the all-reduce thresholds
/// explicitly.
#[derive(Clone, Debug, Default)]
pub struct Tuning {
    pub profile: Option<Arc<Profile>>,
    /// `one_shot_max_bytes` or `two_shot_max_bytes` was given: all-reduce follows them.
    pub explicit_thresholds: bool,
}

impl Tuning {
    /// No profile: the thresholds decide.
    pub fn none() -> Tuning {
        Tuning::default()
    }

    /// The profile, where it may decide `kind` under `flags`: backend `auto`, and for all-reduce no explicit threshold.
    pub fn for_kind(&self, kind: CollectiveKind, flags: &Flags) -> Option<&Profile> {
        let p = self.profile.as_deref()?;
        if !matches!(flags.backend_for(kind), Some((Backend::Auto, _))) {
            return None;
        }
        if kind == CollectiveKind::AllReduce && self.explicit_thresholds {
            return None;
        }
        Some(p)
    }
}

/// How a pass configuration finds its profile: the source, the platform the profile must be for, the devices' kind, and
/// whether the flags set the all-reduce thresholds (then all-reduce follows them).
#[derive(Clone, Debug, Default)]
pub struct TuningConfig {
    pub source: ProfileSource,
    pub platform: String,
    /// The devices' kind as XLA names it ("cpu", "NVIDIA H200"), a plain value handed over by whoever holds XLA's
    /// devices (the Python package from JAX's, the CLI from its PJRT client's): resolving the tuning asks no device.
    /// `None`: unknown; a cached profile of any kind is then taken (`kind_fits`), a shipped one, which names its kind,
    /// is not.
    pub device_kind: Option<String>,
    pub explicit_thresholds: bool,
}

impl TuningConfig {
    /// The tuning of a module on `devices` devices.
    pub fn resolve(&self, devices: usize) -> Tuning {
        let kind = match self.source {
            ProfileSource::Default => {
                if self.device_kind.is_none() {
                    log::debug!(
                        "peerless: no device kind known on {}: the tuning profile is looked up without one",
                        self.platform
                    );
                }
                self.device_kind.as_deref()
            }
            _ => None,
        };
        Tuning {
            profile: self.source.select(&self.platform, devices, kind),
            explicit_thresholds: self.explicit_thresholds,
        }
    }
}

/// Whether a flags string (`--name=value ...`) sets one of the all-reduce thresholds.
pub fn sets_thresholds(flags: &str) -> bool {
    use thunks::flag::{ONE_SHOT_MAX_BYTES, TWO_SHOT_MAX_BYTES};
    crate::flags::sets(flags, ONE_SHOT_MAX_BYTES) || crate::flags::sets(flags, TWO_SHOT_MAX_BYTES)
}

#[cfg(test)]
#[path = "../tests/unit/tuning.rs"]
mod tests;
