//! Golden filetests of the collective pass that runs inside XLA (`emitter::xla_pass`).
//!
//! Every `tests/xla_pass/NAME.pb` is a serialized HloModuleProto as XLA hands it to the
//! pass (written by `tests/xla_pass/make_inputs.py`); every `NAME.hlo` is HLO text that
//! Peerless's encoder turns into one (`hlo::encode_proto`), with the device assignment of
//! its header's `replica_count` / `num_partitions` (device d = logical id d), for modules
//! JAX does not hand the pass (async start/done pairs, as XLA dumps optimized modules,
//! and edge forms of them); an optional `NAME.flags` holds
//! `--name=value` flags for the pass. Inputs are decided as for XLA:CPU (whose thunk executor
//! may run a device's independent calls at once), those named `*_gpu` as for a GPU (calls in
//! stream order). One trial per input runs the pass (instance ids from
//! a fixed base), decodes the rewritten module with the proto front end, runs the verifier
//! on it, runs the pass again on its own output (it must change nothing and decide the
//! fallbacks the same way), and compares with `NAME.expected`: one line per decision, a
//! blank line, then the rewritten module as HLO text (or `unchanged`).
//!
//! `PEERLESS_BLESS=1 cargo test -p peerless-emitter --test xla_pass` rewrites the expected
//! files (and deletes those without an input). The `negative::` trials feed the pass
//! malformed modules.

use std::path::{Path, PathBuf};

use emitter::Flags;
use emitter::xla_pass::{self, PassConfig, PassDecision, PassError};
use libtest_mimic::{Arguments, Failed, Trial};

/// The first instance id of every run.
const INSTANCE_BASE: u64 = 1;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("xla_pass")
}

fn bless() -> bool {
    std::env::var_os("PEERLESS_BLESS").is_some_and(|v| !v.is_empty() && v != "0")
}

fn config(flags: &str) -> Result<PassConfig, String> {
    let flags = Flags::parse(flags).map_err(|e| format!("flags: {e}"))?;
    Ok(PassConfig { flags, instance_base: Some(INSTANCE_BASE), ..PassConfig::default() })
}

/// `config`, for the platform the input's name says (`*_gpu`: XLA:GPU on CUDA, calls in
/// stream order, operation queues).
fn config_for(pb: &Path, flags: &str) -> Result<PassConfig, String> {
    let mut cfg = config(flags)?;
    let gpu = pb.file_stem().is_some_and(|s| s.to_string_lossy().ends_with("_gpu"));
    cfg.caps.in_order = gpu;
    cfg.caps.async_queue = gpu;
    // CUDA's fused kernel is not the faster (`Capabilities::fused_norm_auto`): `*_gpu` inputs
    // fuse only with `--fuse_norm=true`.
    cfg.caps.fused_norm_auto = !gpu;
    Ok(cfg)
}

/// The part of a decision that must not change when the pass sees its own output.
fn key(d: &PassDecision) -> (&str, &str, &str, bool, &str) {
    (&d.instr, &d.op, &d.implementation, d.kernel, &d.reason)
}

/// Runs the pass on one input and renders what the expected file holds.
fn render(pb: &Path) -> Result<String, String> {
    let bytes = if pb.extension().is_some_and(|e| e == "hlo") {
        from_text(pb)?
    } else {
        std::fs::read(pb).map_err(|e| format!("{}: {e}", pb.display()))?
    };
    let flags_path = pb.with_extension("flags");
    let flags = match std::fs::read_to_string(&flags_path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {e}", flags_path.display())),
    };
    let cfg = config_for(pb, &flags)?;
    let outcome = xla_pass::run(&bytes, &cfg).map_err(|e| format!("the pass failed: {e}"))?;
    let mut out = String::new();
    for d in &outcome.decisions {
        out.push_str(&d.to_string());
        out.push('\n');
    }
    out.push('\n');
    let Some(module) = &outcome.module else {
        if let Some(d) = outcome.decisions.iter().find(|d| d.kernel) {
            return Err(format!("a kernel decision but no rewrite: {d}"));
        }
        out.push_str("unchanged\n");
        return Ok(out);
    };
    let name = format!("{} (rewritten)", pb.display());
    let m = hlo::proto::decode(&name, module).map_err(|e| format!("the rewritten module does not decode: {e}"))?;
    hlo::verify::verify(&m).map_err(|e| format!("the rewritten module does not verify: {e}"))?;
    out.push_str(&hlo_tests::print::module_text(&m));

    // Idempotence: the kernels are custom calls now; the fallbacks are decided again, the same way.
    let again = xla_pass::run(module, &cfg).map_err(|e| format!("the pass failed on its own output: {e}"))?;
    if again.module.is_some() {
        return Err("the pass rewrote its own output again".into());
    }
    let first: Vec<_> = outcome.decisions.iter().filter(|d| !d.kernel).map(key).collect();
    let second: Vec<_> = again.decisions.iter().map(key).collect();
    if first != second {
        return Err(format!(
            "on its own output the pass decided\n{}\ninstead of the first run's fallbacks\n{}",
            lines(&again.decisions),
            lines(outcome.decisions.iter().filter(|d| !d.kernel))
        ));
    }
    Ok(out)
}

/// `NAME.hlo` as the pass gets it: encoded, with the header's device assignment (HloModuleProto
/// field 15: replicas × partitions, device `replica * partitions + partition`).
fn from_text(path: &Path) -> Result<Vec<u8>, String> {
    use prost::encoding::{WireType, encode_key, encode_varint};
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let m = hlo::parse_text(&path.display().to_string(), &text).map_err(|e| e.to_string())?;
    let mut bytes = hlo::encode_proto(&m).map_err(|e| e.with_source(&text).to_string())?;
    let (r, p) = (m.config.replica_count.max(1), m.config.num_partitions.max(1));
    let varint = |out: &mut Vec<u8>, tag: u32, v: u64| {
        encode_key(tag, WireType::Varint, out);
        encode_varint(v, out);
    };
    let bytes_field = |out: &mut Vec<u8>, tag: u32, payload: &[u8]| {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(payload.len() as u64, out);
        out.extend_from_slice(payload);
    };
    let mut da = Vec::new();
    varint(&mut da, 1, r as u64);
    varint(&mut da, 2, p as u64);
    for c in 0..p {
        let mut ids = Vec::new();
        for rep in 0..r {
            encode_varint((rep * p + c) as u64, &mut ids);
        }
        let mut comp = Vec::new();
        bytes_field(&mut comp, 1, &ids);
        bytes_field(&mut da, 3, &comp);
    }
    bytes_field(&mut bytes, 15, &da);
    Ok(bytes)
}

fn lines<'a>(ds: impl IntoIterator<Item = &'a PassDecision>) -> String {
    ds.into_iter().map(|d| format!("  {d}\n")).collect()
}

/// A line diff (longest common subsequence) with 3 lines of context around each change.
fn diff(expected: &str, got: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), got.lines().collect());
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    let near_change = |k: usize| ops[k.saturating_sub(3)..(k + 4).min(ops.len())].iter().any(|(c, _)| *c != ' ');
    let mut out = String::from("--- expected\n+++ got\n");
    let mut skipped = false;
    for (k, (c, l)) in ops.iter().enumerate() {
        if near_change(k) {
            out.push_str(&format!("{c}{l}\n"));
            skipped = false;
        } else if !skipped {
            out.push_str("  ...\n");
            skipped = true;
        }
    }
    out
}

fn check(pb: &Path) -> Result<(), Failed> {
    let got = render(pb)?;
    let expected_path = pb.with_extension("expected");
    if bless() {
        std::fs::write(&expected_path, &got).map_err(|e| format!("{}: {e}", expected_path.display()))?;
        return Ok(());
    }
    let expected = std::fs::read_to_string(&expected_path).map_err(|e| {
        format!(
            "{}: {e} (PEERLESS_BLESS=1 cargo test -p peerless-emitter --test xla_pass writes it)",
            expected_path.display()
        )
    })?;
    if expected != got {
        return Err(format!(
            "{} differs from the pass's output (PEERLESS_BLESS=1 to accept):\n{}",
            expected_path.display(),
            diff(&expected, &got)
        )
        .into());
    }
    Ok(())
}

fn files_with(ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("tests/xla_pass")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// Every `.expected` and `.flags` file has its input (bless deletes orphaned expected files).
fn no_orphans() -> Result<(), Failed> {
    let mut orphans = Vec::new();
    for f in files_with("expected").into_iter().chain(files_with("flags")) {
        if !f.with_extension("pb").exists() && !f.with_extension("hlo").exists() {
            if bless() && f.extension().is_some_and(|e| e == "expected") {
                std::fs::remove_file(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            } else {
                orphans.push(f.display().to_string());
            }
        }
    }
    if orphans.is_empty() { Ok(()) } else { Err(format!("no .pb or .hlo input for {}", orphans.join(", ")).into()) }
}

// ----------------------------------------------------------------------------- negative cases

/// Runs the pass, turning a panic into a failure.
fn run_caught(bytes: &[u8]) -> Result<Result<xla_pass::PassOutcome, PassError>, Failed> {
    std::panic::catch_unwind(|| xla_pass::run(bytes, &config("").expect("no flags"))).map_err(|p| {
        let msg = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
        Failed::from(format!("the pass panicked: {}", msg.unwrap_or_default()))
    })
}

fn input(name: &str) -> Vec<u8> {
    let p = dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn garbage_bytes() -> Result<(), Failed> {
    let cases: [(&str, &[u8]); 4] = [
        ("a varint key past 64 bits", &[0xff; 11]),
        ("a field running past the end", b"\x1a\x05ab"),
        ("a group (unused by XLA)", b"\x0b"),
        ("an instruction running past its computation", b"\x1a\x04\x12\x09\x12\x0b"),
    ];
    for (what, bytes) in cases {
        match run_caught(bytes)? {
            Err(PassError::Wire(_)) => {}
            other => return Err(format!("{what}: expected PassError::Wire, got {other:?}").into()),
        }
    }
    Ok(())
}

/// Byte offsets where the module's top-level fields start (a cut there leaves a valid,
/// shorter message).
fn top_level_boundaries(bytes: &[u8]) -> Vec<usize> {
    use prost::encoding::{WireType, decode_key, decode_varint};
    let mut out = vec![0];
    let mut buf = bytes;
    while !buf.is_empty() {
        let (_, wire) = decode_key(&mut buf).expect("a valid module");
        let skip = match wire {
            WireType::Varint => {
                decode_varint(&mut buf).expect("a valid module");
                0
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => decode_varint(&mut buf).expect("a valid module") as usize,
            WireType::StartGroup | WireType::EndGroup => panic!("groups in a valid module"),
        };
        buf = &buf[skip..];
        out.push(bytes.len() - buf.len());
    }
    out
}

fn truncated_module() -> Result<(), Failed> {
    for name in ["psum_f32.pb", "all_to_all.pb"] {
        let bytes = input(name);
        let boundaries = top_level_boundaries(&bytes);
        for cut in 0..bytes.len() {
            let r =
                run_caught(&bytes[..cut]).map_err(|e| format!("{name} cut at {cut}: {}", e.message().unwrap_or("")))?;
            if !boundaries.contains(&cut) && r.is_ok() {
                return Err(format!("{name} cut at {cut} (inside a field): expected an error, got {r:?}").into());
            }
        }
    }
    Ok(())
}

/// The module minus HloModuleProto field 15 (`device_assignment`).
fn without_device_assignment(bytes: &[u8]) -> Vec<u8> {
    use prost::encoding::decode_key;
    let b = top_level_boundaries(bytes);
    let mut out = Vec::new();
    let mut found = false;
    for w in b.windows(2) {
        let field = &bytes[w[0]..w[1]];
        let (tag, _) = decode_key(&mut &field[..]).expect("a valid key");
        if tag == 15 {
            found = true;
        } else {
            out.extend_from_slice(field);
        }
    }
    assert!(found, "the module has a device assignment to remove");
    out
}

fn no_device_assignment() -> Result<(), Failed> {
    let bytes = without_device_assignment(&input("psum_f32.pb"));
    match run_caught(&bytes)? {
        Err(e @ PassError::Assignment(_)) if e.to_string().contains("device assignment") => Ok(()),
        other => Err(format!("expected an error naming the device assignment, got {other:?}").into()),
    }
}

fn main() {
    let args = Arguments::from_args();
    let mut trials: Vec<Trial> = files_with("pb")
        .into_iter()
        .chain(files_with("hlo"))
        .map(|pb| {
            let name = pb.file_stem().expect("a file name").to_string_lossy().into_owned();
            Trial::test(name, move || check(&pb))
        })
        .collect();
    trials.push(Trial::test("no_orphaned_files", no_orphans));
    trials.push(Trial::test("negative::garbage_bytes", garbage_bytes));
    trials.push(Trial::test("negative::truncated_module", truncated_module));
    trials.push(Trial::test("negative::no_device_assignment", no_device_assignment));
    libtest_mimic::run(&args, trials).exit();
}
