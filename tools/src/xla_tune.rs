//! `peerless tune`: measures, as `peerless bench` does ([`crate::xla_bench`]), every Peerless algorithm of each kind
//! against XLA's path per dtype class, group size and size, and writes the profile the pass reads
//! ([`emitter::tuning`]). A wrong result fails the tune. A close call (within [`CLOSE`]) gets [`REFINE_SAMPLES`] times
//! the samples; where neighbouring sizes have different winners their geometric midpoint is measured too (the pass
//! takes a kernel between two sizes only where it won at both).

use std::fmt::Write as _;
use std::path::PathBuf;

use emitter::tuning::{Key, Measured, Point, Profile, XLA, dtype_class};

use crate::xla_bench::{self, Check, Dtype, Impl, Op, Row};

/// What to measure.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// XLA's plugin, devices of the profile's key (default: the CPU plugin 8; GPUs all, at most 8), sizes, samples
    /// (each running executes for about `sample_ms`), chain, ops and dtypes, as `peerless bench` takes them; its
    /// implementations, iterations, flags, close calls and sizes are the tune's own.
    pub bench: xla_bench::Options,
    /// Group sizes to measure (default: the device count).
    pub groups: Vec<usize>,
    /// Measure the midpoint between neighbouring sizes whose winners differ.
    pub refine: bool,
    /// Where to write the profile (default: the cache's `tuning/` directory).
    pub out_dir: Option<PathBuf>,
    /// Recorded in the profile: the command line and the machine.
    pub command: String,
    pub machine: String,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            bench: xla_bench::Options {
                max_bytes: 4 << 20,
                samples: 15,
                sample_ms: Some(5.0),
                chain: 8,
                ..xla_bench::Options::default()
            },
            groups: Vec::new(),
            refine: true,
            out_dir: None,
            command: String::new(),
            machine: String::new(),
        }
    }
}

impl TuneOptions {
    /// A short tune (CI): groups of the device count, f32, three sizes, 2 samples of ~2 ms, no midpoints.
    pub fn quick(mut self) -> Self {
        self.refine = false;
        let b = &mut self.bench;
        (b.min_bytes, b.max_bytes, b.step) = (1024, 64 << 10, 8);
        (b.samples, b.sample_ms, b.chain) = (2, Some(2.0), 4);
        b.dtypes = vec![Dtype::F32];
        self
    }
}

/// What a tune found.
#[derive(Debug)]
pub struct TuneReport {
    pub profile: Profile,
    /// Where the profile was written.
    pub path: PathBuf,
    /// Every measured row.
    pub rows: Vec<Row>,
}

/// The implementation name a checked row is recorded under, if it is one the profile keeps.
fn recorded_name(r: &Row) -> Option<String> {
    match r.imp {
        Impl::Xla => Some(XLA.to_owned()),
        Impl::OneShot => Some(thunks::KernelAlgorithm::OneShotAllReduce.name().to_owned()),
        Impl::TwoShot => Some(thunks::KernelAlgorithm::TwoShotAllReduce.name().to_owned()),
        Impl::Peerless | Impl::CopyEngines if !r.decisions.is_empty() && r.decisions.iter().all(|d| d.kernel) => {
            // "kernel (direct all-gather)" → "direct all-gather".
            let i = &r.decisions[0].implementation;
            Some(i.strip_prefix("kernel (").and_then(|s| s.strip_suffix(')')).unwrap_or(i).to_owned())
        }
        _ => None,
    }
}

/// A size whose fastest kernel and XLA's path are within this factor of each other is a close call: it decides a
/// crossover, so it gets [`REFINE_SAMPLES`] times the samples.
const CLOSE: f64 = 1.25;
const REFINE_SAMPLES: usize = 3;

/// The sizes between neighbouring `points` (one op, dtype class and group) whose winners differ: their geometric mean,
/// rounded to whole elements for the group (`unit` bytes); none where no such size lies strictly between them.
fn midpoints(points: &[Point], unit: usize) -> Vec<usize> {
    let w: Vec<(usize, &str)> = points.iter().filter_map(|p| Some((p.bytes, p.winner()?))).collect();
    w.windows(2)
        .filter(|p| p[0].1 != p[1].1)
        .filter_map(|p| {
            let mid = ((p[0].0 as f64) * (p[1].0 as f64)).sqrt();
            let m = ((mid / unit as f64).round() as usize) * unit;
            (m > p[0].0 && m < p[1].0).then_some(m)
        })
        .collect()
}

/// Runs `bench` on groups of `g`, recording every checked row in `profile` and `rows`; a row whose check failed fails
/// the tune.
fn measure(
    bench: &xla_bench::Options,
    g: usize,
    profile: &mut Profile,
    rows: &mut Vec<Row>,
    progress: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let report = xla_bench::run(bench, &mut |line| progress(&format!("tune groups of {g}: {line}")))?;
    if profile.key.device_kind.is_empty() {
        profile.key.device_kind = report.device_kind.clone();
    }
    for r in report.rows {
        if let Check::Error(e) = &r.check {
            return Err(format!(
                "{} {} {} B {} on {g} devices failed its check: {e}",
                r.op.name(),
                r.dtype.name(),
                r.bytes,
                r.imp.name()
            ));
        }
        if let (Some(us), Some(name)) = (r.us, recorded_name(&r)) {
            profile.record(r.op.name(), &dtype_class(r.dtype.hlo()), g, r.bytes, &name, us);
        }
        rows.push(r);
    }
    Ok(())
}

/// Runs the tune and writes the profile; `progress` gets a line per row.
pub fn run(opts: &TuneOptions, progress: &mut dyn FnMut(&str)) -> Result<TuneReport, String> {
    let path = crate::xla_run::find_plugin(opts.bench.plugin.as_deref())?;
    let platform = crate::xla_run::platform_of(&path);
    let devices = match (opts.bench.devices, platform) {
        (Some(n), _) => n,
        (None, plugin::Platform::Cpu) => 8,
        // GPUs: all of the client's, at most 8 (as `peerless bench`).
        (None, _) => {
            let inner = crate::xla_run::plugin(&path, platform)?;
            let client = ffi::pjrt::client::Client::create(inner, &[])?;
            client.devices()?.len().min(8)
        }
    };
    let groups = if opts.groups.is_empty() { vec![devices] } else { opts.groups.clone() };
    if let Some(g) = groups.iter().find(|&&g| g < 2 || g > devices) {
        return Err(format!("group size {g}: groups of 2..={devices} devices can be measured"));
    }
    // The device kind is filled in from the first measurement (the client names it).
    let key = Key {
        platform: platform.name().to_owned(),
        device_kind: String::new(),
        devices,
        links: if platform == plugin::Platform::Cpu { "host".into() } else { "peer".into() },
    };
    let date = crate::xla_tune::today();
    let measured = Measured { date, machine: opts.machine.clone(), command: opts.command.clone(), note: String::new() };
    let mut profile = Profile::new(key, measured);
    let mut rows = Vec::new();
    let (reduce, others): (Vec<Op>, Vec<Op>) = opts.bench.ops.iter().partition(|&&o| o == Op::AllReduce);
    // On CUDA the copy-engine forms are rows too (`--copy_engines=auto` chooses by them).
    let ce = (platform == plugin::Platform::Cuda).then_some(Impl::CopyEngines);
    let moves: Vec<Impl> = [Impl::Xla, Impl::Peerless].into_iter().chain(ce).collect();
    let reductions: Vec<Impl> = [Impl::Xla, Impl::OneShot, Impl::TwoShot].into_iter().chain(ce).collect();
    let plan = [(reduce, reductions), (others, moves)];
    for &g in &groups {
        for (ops, impls) in &plan {
            if ops.is_empty() {
                continue;
            }
            let bench = xla_bench::Options {
                plugin: Some(path.clone()),
                devices: Some(g),
                iters: 1,
                ops: ops.clone(),
                impls: impls.clone(),
                flags: String::new(),
                close_calls: Some(xla_bench::CloseCalls { close: CLOSE, more: REFINE_SAMPLES }),
                sizes: None,
                ..opts.bench.clone()
            };
            measure(&bench, g, &mut profile, &mut rows, progress)?;
            if !opts.refine {
                continue;
            }
            for &op in ops {
                for &dt in &opts.bench.dtypes {
                    let points = profile.points(op.name(), &dtype_class(dt.hlo()), g);
                    let mids = midpoints(points, dt.bytes() * g);
                    if mids.is_empty() {
                        continue;
                    }
                    let sizes = mids.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(", ");
                    progress(&format!(
                        "tune groups of {g}: {} {}: the winner changes; measuring between, at {sizes} B",
                        op.name(),
                        dt.name()
                    ));
                    let between =
                        xla_bench::Options { ops: vec![op], dtypes: vec![dt], sizes: Some(mids), ..bench.clone() };
                    measure(&between, g, &mut profile, &mut rows, progress)?;
                }
            }
        }
    }
    let dir = match &opts.out_dir {
        Some(d) => d.clone(),
        None => emitter::tuning::profile_dir().ok_or("no cache directory (set PEERLESS_CACHE_DIR or HOME)")?,
    };
    let path = profile.save(&dir)?;
    profile.source = path.display().to_string();
    Ok(TuneReport { profile, path, rows })
}

/// The crossovers of a profile as a Markdown table: per entry and size, each measured implementation's µs and the
/// fastest.
pub fn crossovers(p: &Profile) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "| op | dtype | group | bytes/device | µs per collective | fastest | vs XLA |");
    let _ = writeln!(t, "|---|---|---:|---:|---|---|---:|");
    for e in &p.entries {
        for pt in &e.points {
            let figs: Vec<String> = pt.us.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
            let best = pt.us.iter().min_by(|a, b| a.1.total_cmp(b.1));
            let (name, us) = best.map_or(("—", 0.0), |(k, v)| (k.as_str(), *v));
            let ratio = pt.us.get(XLA).map_or_else(|| "—".into(), |x| format!("{:.2}", us / x));
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} | {name} | {ratio} |",
                e.op,
                e.dtype,
                e.group,
                pt.bytes,
                figs.join(", ")
            );
        }
    }
    t
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    // Civil from days (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
#[path = "../tests/unit/xla_tune.rs"]
mod tests;
