//! Shared helpers for the HLO conformance suite: the `// peerless-test:` directive,
//! reading XLA goldens from npz, and comparing Peerless's results with them.
//!
//! Goldens are produced only by `hlo-tests/gen_goldens.py` (XLA's CPU backend via
//! jaxlib, or the JAX program itself for `jax_*` cases). Nothing here writes them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use hlo::{Array, Literal, PrimitiveType, Shape};

/// The HLO text printer the golden filetests and round trips compare with.
pub mod print;

/// The suite's root directory (`hlo-tests/`): `PEERLESS_HLO_TESTS_DIR` when set (prebuilt
/// test binaries run from another checkout, as on the GPU machines), else this crate's.
pub fn suite_dir() -> PathBuf {
    match std::env::var_os("PEERLESS_HLO_TESTS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

/// The library root a crate's Cargo.toml names (`[lib] path`), or `src/lib.rs` where it names
/// none; relative to the crate (the workspace's tidy and architecture tests read it).
pub fn lib_root(manifest: &str) -> String {
    let section = manifest.split("[lib]").nth(1).map(|t| t.split("\n[").next().unwrap_or(t));
    let path = section.and_then(|t| t.lines().find_map(|l| l.trim().strip_prefix("path = ")));
    path.map_or_else(|| "src/lib.rs".to_owned(), |p| p.trim_matches('"').to_owned())
}

pub fn cases_dir() -> PathBuf {
    suite_dir().join("cases")
}

pub fn goldens_dir() -> PathBuf {
    suite_dir().join("goldens")
}

/// How a case runs: replicas or partitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Replica,
    Partition,
}

/// Tolerance class of a case (`tolerance=loose` multiplies float tolerances by 10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tolerance {
    Default,
    Loose,
}

/// The parsed first line of a case: `// peerless-test: devices=1,2 mode=replica ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directive {
    pub devices: Vec<usize>,
    pub mode: Mode,
    pub tolerance: Tolerance,
    /// `inputs=positive` (generator-side only; recorded for completeness).
    pub positive_inputs: bool,
    /// `source=jax`: the module was dumped from a JAX program.
    pub source_jax: bool,
}

pub const DIRECTIVE_PREFIX: &str = "// peerless-test:";

/// Parses the directive line at the top of a case.
pub fn parse_directive(text: &str) -> Result<Directive, String> {
    let first = text.lines().next().unwrap_or("");
    let rest = first
        .strip_prefix(DIRECTIVE_PREFIX)
        .ok_or_else(|| format!("first line must start with `{DIRECTIVE_PREFIX}`"))?;
    let mut devices = None;
    let mut mode = None;
    let mut tolerance = Tolerance::Default;
    let mut positive_inputs = false;
    let mut source_jax = false;
    for tok in rest.split_whitespace() {
        let (k, v) = tok.split_once('=').ok_or_else(|| format!("bad directive token `{tok}`"))?;
        match k {
            "devices" => {
                let list: Result<Vec<usize>, _> = v.split(',').map(str::parse).collect();
                let list = list.map_err(|e| format!("bad devices list `{v}`: {e}"))?;
                if list.is_empty() || list.contains(&0) {
                    return Err(format!("bad devices list `{v}`"));
                }
                devices = Some(list);
            }
            "mode" => {
                mode = Some(match v {
                    "replica" => Mode::Replica,
                    "partition" => Mode::Partition,
                    _ => return Err(format!("bad mode `{v}`")),
                })
            }
            "tolerance" => {
                tolerance = match v {
                    "loose" => Tolerance::Loose,
                    "default" => Tolerance::Default,
                    _ => return Err(format!("bad tolerance `{v}`")),
                }
            }
            "inputs" => {
                positive_inputs = match v {
                    "positive" => true,
                    "default" => false,
                    _ => return Err(format!("bad inputs `{v}`")),
                }
            }
            "source" => {
                source_jax = match v {
                    "jax" => true,
                    _ => return Err(format!("bad source `{v}`")),
                }
            }
            _ => return Err(format!("unknown directive key `{k}`")),
        }
    }
    Ok(Directive {
        devices: devices.ok_or("directive needs devices=...")?,
        mode: mode.ok_or("directive needs mode=replica|partition")?,
        tolerance,
        positive_inputs,
        source_jax,
    })
}

/// One case file.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub path: PathBuf,
    pub text: String,
    pub directive: Result<Directive, String>,
}

/// All cases under `cases/`, sorted by name.
pub fn load_cases() -> std::io::Result<Vec<Case>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(cases_dir())? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "hlo") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path)?;
            let directive = parse_directive(&text);
            out.push(Case { name, path, text, directive });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// `goldens/<case>.d<N>.npz`.
pub fn golden_path(case: &str, n: usize) -> PathBuf {
    goldens_dir().join(format!("{case}.d{n}.npz"))
}

/// `goldens/<case>.pb`.
pub fn proto_path(case: &str) -> PathBuf {
    goldens_dir().join(format!("{case}.pb"))
}

/// The (case, device count) pairs present in `goldens/` as `<case>.d<N>.npz`.
pub fn golden_inventory() -> std::io::Result<Vec<(String, usize)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(goldens_dir())? {
        let fname = entry?.file_name().to_string_lossy().into_owned();
        let Some(stem) = fname.strip_suffix(".npz") else { continue };
        if let Some((case, n)) = stem.rsplit_once(".d")
            && let Ok(n) = n.parse()
        {
            out.push((case.to_string(), n));
            continue;
        }
        out.push((stem.to_string(), 0));
    }
    out.sort();
    Ok(out)
}

// ------------------------------------------------------------------------------- npz

/// Reinterprets a stored golden array as element type `ty` (`runs::io`'s npz
/// convention: bf16 as uint16 bits, f8 and s4/u4 as uint8, everything else native). Its
/// dims come from the npz: for `jax_*` cases they are per-device shard dims.
pub fn to_array(stored: &Array, ty: PrimitiveType) -> Result<Array, String> {
    runs::io::to_type(stored.clone(), ty).ok_or_else(|| {
        let want = runs::io::storage_type(ty).map_or_else(|| "nothing".to_owned(), |t| t.name().to_owned());
        format!("stored as {} but element type {} is stored as {want}", stored.ty().name(), ty.name())
    })
}

/// A case's golden for one device count: per-device inputs and expected result leaves.
#[derive(Clone, Debug)]
pub struct Golden {
    /// `inputs[d][i]` = `p{i}_d{d}`.
    pub inputs: Vec<Vec<Array>>,
    /// `outputs[d][j]` = `o{j}_d{d}`.
    pub outputs: Vec<Vec<Array>>,
}

/// Reads `p{i}_d{d}` / `o{j}_d{d}` for `n` devices and checks that no other names exist.
pub fn read_golden(path: &Path, n: usize) -> Result<Golden, String> {
    let mut arrays = runs::io::read_npz(path).map_err(|e| e.to_string())?;
    let mut take = |prefix: char, d: usize| {
        let mut v = Vec::new();
        while let Some(a) = arrays.remove(&format!("{prefix}{}_d{d}", v.len())) {
            v.push(a);
        }
        v
    };
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    for d in 0..n {
        inputs.push(take('p', d));
        outputs.push(take('o', d));
    }
    if let Some(extra) = arrays.keys().next() {
        return Err(format!("{}: unexpected array `{extra}` for {n} devices", path.display()));
    }
    for d in 0..n {
        if inputs[d].len() != inputs[0].len() || outputs[d].len() != outputs[0].len() {
            return Err(format!("{}: device {d} has a different number of inputs/outputs", path.display()));
        }
    }
    if outputs.first().is_none_or(Vec::is_empty) {
        return Err(format!("{}: no outputs", path.display()));
    }
    Ok(Golden { inputs, outputs })
}

/// Entry arguments for a run (XLA through `peerless run`, the tests): element types from the module's entry
/// parameters, dims from the golden (shards for `jax_*` cases).
pub fn make_args(param_shapes: &[&Shape], golden: &Golden) -> Result<Vec<Vec<Literal>>, String> {
    let mut args = Vec::new();
    for (d, inputs) in golden.inputs.iter().enumerate() {
        if inputs.len() != param_shapes.len() {
            return Err(format!(
                "golden has {} inputs per device, entry computation has {} parameters",
                inputs.len(),
                param_shapes.len()
            ));
        }
        let mut dev = Vec::new();
        for (i, (raw, shape)) in inputs.iter().zip(param_shapes).enumerate() {
            let ty = shape.as_array().ok_or_else(|| format!("entry parameter {i} is not an array"))?.ty;
            dev.push(Literal::Array(to_array(raw, ty).map_err(|e| format!("p{i}_d{d}: {e}"))?));
        }
        args.push(dev);
    }
    Ok(args)
}

// ------------------------------------------------------------------------------- comparison

/// Float tolerance `|got - want| <= atol + rtol * |want|` for an element type.
pub fn tolerance(ty: PrimitiveType, class: Tolerance) -> (f64, f64) {
    let (rtol, atol) = match ty {
        PrimitiveType::F64 => (1e-12, 1e-14),
        PrimitiveType::F32 => (1e-5, 1e-6),
        PrimitiveType::F16 => (1e-3, 1e-4),
        PrimitiveType::Bf16 => (1e-2, 1e-3),
        _ => (0.0, 0.0),
    };
    match class {
        Tolerance::Default => (rtol, atol),
        Tolerance::Loose => (rtol * 10.0, atol * 10.0),
    }
}

fn float_at(a: &Array, i: usize) -> Option<f64> {
    let b = a.element_bytes(i);
    Some(match a.ty() {
        PrimitiveType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        PrimitiveType::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        PrimitiveType::F32 => f32::from_le_bytes(b.try_into().ok()?) as f64,
        PrimitiveType::F64 => f64::from_le_bytes(b.try_into().ok()?),
        _ => return None,
    })
}

fn show_elem(a: &Array, i: usize) -> String {
    if let Some(f) = float_at(a, i) {
        return format!("{f:e}");
    }
    let b = a.element_bytes(i);
    use PrimitiveType as T;
    match a.ty() {
        T::Pred => format!("{}", b[0] != 0),
        T::S8 | T::S4 => format!("{}", b[0] as i8),
        T::S16 => format!("{}", i16::from_le_bytes([b[0], b[1]])),
        T::S32 => format!("{}", i32::from_le_bytes(b.try_into().unwrap())),
        T::S64 => format!("{}", i64::from_le_bytes(b.try_into().unwrap())),
        T::U8 | T::U4 => format!("{}", b[0]),
        T::U16 => format!("{}", u16::from_le_bytes([b[0], b[1]])),
        T::U32 => format!("{}", u32::from_le_bytes(b.try_into().unwrap())),
        T::U64 => format!("{}", u64::from_le_bytes(b.try_into().unwrap())),
        _ => format!("0x{}", b.iter().rev().map(|x| format!("{x:02x}")).collect::<String>()),
    }
}

fn index_of(dims: &[i64], mut flat: usize) -> String {
    let mut idx = vec![0usize; dims.len()];
    for k in (0..dims.len()).rev() {
        let d = dims[k].max(1) as usize;
        idx[k] = flat % d;
        flat /= d;
    }
    format!("{idx:?}")
}

/// Compares one result leaf with its golden. Integers, pred and f8 / 4-bit types must
/// match exactly; floats within [`tolerance`] (NaN matches NaN, infinities match
/// same-sign infinities). Returns a diff report on mismatch.
pub fn compare_leaf(name: &str, got: &Array, want: &Array, class: Tolerance) -> Result<(), String> {
    if got.ty() != want.ty() || got.dims() != want.dims() {
        return Err(format!(
            "{name}: shape mismatch: expected {}{:?}, got {}{:?}",
            want.ty().name(),
            want.dims(),
            got.ty().name(),
            got.dims()
        ));
    }
    let (rtol, atol) = tolerance(want.ty(), class);
    let n = want.element_count();
    let mut bad = Vec::new();
    for i in 0..n {
        let ok = match (float_at(got, i), float_at(want, i)) {
            (Some(g), Some(w)) => {
                if w.is_nan() || g.is_nan() {
                    w.is_nan() && g.is_nan()
                } else if w.is_infinite() || g.is_infinite() {
                    g == w
                } else {
                    (g - w).abs() <= atol + rtol * w.abs()
                }
            }
            _ => {
                let (g, w) = (got.element_bytes(i), want.element_bytes(i));
                if want.ty() == PrimitiveType::Pred { (g[0] != 0) == (w[0] != 0) } else { g == w }
            }
        };
        if !ok {
            bad.push(i);
        }
    }
    if bad.is_empty() {
        return Ok(());
    }
    let mut msg = format!(
        "{name}: {} of {n} elements differ ({}{:?}, rtol={rtol:e}, atol={atol:e})",
        bad.len(),
        want.ty().name(),
        want.dims()
    );
    for &i in bad.iter().take(10) {
        let _ = write!(
            msg,
            "\n    at {}: expected {}, got {}",
            index_of(want.dims(), i),
            show_elem(want, i),
            show_elem(got, i)
        );
    }
    if bad.len() > 10 {
        let _ = write!(msg, "\n    ... and {} more", bad.len() - 10);
    }
    Err(msg)
}

/// Compares every device's result with the golden outputs; collects all diffs.
pub fn compare_results(got: &[Literal], golden: &Golden, class: Tolerance) -> Result<(), String> {
    if got.len() != golden.outputs.len() {
        return Err(format!("the run returned {} device results, expected {}", got.len(), golden.outputs.len()));
    }
    let mut errors = Vec::new();
    for (d, (lit, want)) in got.iter().zip(&golden.outputs).enumerate() {
        let leaves = lit.leaves();
        if leaves.len() != want.len() {
            errors.push(format!("device {d}: result has {} leaves, golden has {}", leaves.len(), want.len()));
            continue;
        }
        for (j, (g, w)) in leaves.iter().zip(want).enumerate() {
            let name = format!("o{j}_d{d}");
            match to_array(w, g.ty()) {
                Err(e) => errors.push(format!("{name}: golden unreadable as {}: {e}", g.ty().name())),
                Ok(w) => {
                    if let Err(e) = compare_leaf(&name, g, &w, class) {
                        errors.push(e);
                    }
                }
            }
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(errors.join("\n")) }
}
