//! HLO conformance of Peerless's front ends: every case under `hlo-tests/cases/` is read
//! three ways, and each must give the same module: parsed from HLO text, decoded from XLA's
//! own serialized `HloModuleProto` (`goldens/<case>.pb`), and parsed from text, encoded as an
//! `HloModuleProto` by Peerless's encoder (`hlo::encode_proto`) and decoded again, which must
//! print as the text-parsed module does (the encoder's round trip). Each module's entry
//! parameters must fit the inputs of every golden of the case (`goldens/<case>.d<N>.npz`,
//! written only by `gen_goldens.py` with XLA's CPU backend). The goldens' outputs are XLA's
//! answers: `tools/tests/xla_run.rs` runs every case through XLA:CPU, with Peerless's pass and
//! handlers, and compares with them.
//!
//! `cargo test -p peerless-hlo-tests --test conformance [-- FILTER]`

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hlo_tests::{Case, Directive, golden_inventory, golden_path, load_cases, proto_path, read_golden};
use libtest_mimic::{Arguments, Failed, Trial};

#[derive(Clone, Copy, Debug)]
enum Front {
    Text,
    Proto,
    Encoded,
}

fn load_module(case: &Case, front: Front) -> Result<hlo::Module, String> {
    match front {
        Front::Text => hlo::parse_text(&case.path.display().to_string(), &case.text).map_err(|e| format!("parse: {e}")),
        Front::Proto => {
            let path = proto_path(&case.name);
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            hlo::decode_proto(&path.display().to_string(), &bytes).map_err(|e| format!("decode_proto: {e}"))
        }
        Front::Encoded => {
            let text = load_module(case, Front::Text)?;
            let bytes = hlo::encode_proto(&text).map_err(|e| format!("encode_proto: {e}"))?;
            let back = hlo::decode_proto(&case.name, &bytes).map_err(|e| format!("decode_proto(encode_proto): {e}"))?;
            // What the encoder writes as XLA's text parser does: the default (row-major) layout
            // where the text gives none, the entry's layout as its parameters' and result's
            // (`host_program_shape`, which the decoder does not print), and convolution's
            // group counts (the proto always has them).
            // Names unique in the module and iota groups written out, as XLA needs them.
            let mut want = text.clone();
            want.config.entry_computation_layout = None;
            for (id, name) in hlo::encode::unique_names(&text) {
                want.instrs[id].name = name;
            }
            for ins in want.instrs.values_mut() {
                if let Some(g @ hlo::ReplicaGroups::Iota(_)) = &ins.attrs.replica_groups {
                    ins.attrs.replica_groups = g.groups().map(hlo::ReplicaGroups::Explicit);
                }
                with_layouts(&mut ins.shape);
                if ins.opcode == hlo::Opcode::Convolution {
                    for key in ["feature_group_count", "batch_group_count"] {
                        ins.attrs.other.entry(key.into()).or_insert_with(|| "1".into());
                    }
                }
            }
            let (want, got) = (hlo_tests::print::module_text(&want), hlo_tests::print::module_text(&back));
            if want != got {
                let at = want.lines().zip(got.lines()).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!(
                    "the encoded module prints differently from line {}:\n  text:    {}\n  encoded: {}",
                    at + 1,
                    want.lines().nth(at).unwrap_or(""),
                    got.lines().nth(at).unwrap_or("")
                ));
            }
            Ok(back)
        }
    }
}

/// `shape` with the default layout on every array that has none.
fn with_layouts(shape: &mut hlo::Shape) {
    match shape {
        hlo::Shape::Array(a) if a.layout.is_none() && !a.dims.is_empty() => {
            a.layout = Some((0..a.dims.len() as i64).rev().collect())
        }
        hlo::Shape::Tuple(elems) => elems.iter_mut().for_each(with_layouts),
        _ => {}
    }
}

fn run_case(case: &Case, d: &Directive, front: Front) -> Result<(), String> {
    let module = load_module(case, front)?;
    // (Both front ends run the verifier on what they return.)
    for &n in &d.devices {
        let golden = read_golden(&golden_path(&case.name, n), n)?;
        hlo_tests::make_args(&module.entry_param_shapes(), &golden).map_err(|e| format!("devices={n}: {e}"))?;
    }
    Ok(())
}

/// Every declared device count has a golden and a `.pb`; every golden belongs to a
/// declared device count of an existing case. Nothing may skip silently.
fn inventory(cases: &[Case]) -> Result<(), String> {
    let mut errors = Vec::new();
    let mut declared = BTreeSet::new();
    for c in cases {
        match &c.directive {
            Err(e) => errors.push(format!("{}: bad directive: {e}", c.name)),
            Ok(d) => {
                for &n in &d.devices {
                    declared.insert((c.name.clone(), n));
                    if !golden_path(&c.name, n).exists() {
                        errors.push(format!(
                            "{}: declares devices={n} but {} is missing",
                            c.name,
                            golden_path(&c.name, n).display()
                        ));
                    }
                }
                if !proto_path(&c.name).exists() {
                    errors.push(format!("{}: {} is missing", c.name, proto_path(&c.name).display()));
                }
            }
        }
    }
    for (case, n) in golden_inventory().map_err(|e| format!("goldens/: {e}"))? {
        if !declared.contains(&(case.clone(), n)) {
            errors.push(format!("golden {case}.d{n}.npz has no case declaring devices={n}"));
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(errors.join("\n")) }
}

fn main() {
    let args = Arguments::from_args();
    let cases = Arc::new(load_cases().expect("cannot read hlo-tests/cases"));
    let matched = Arc::new(AtomicUsize::new(0));
    let mut devices = BTreeSet::new();
    let mut trials = Vec::new();
    {
        let cases = cases.clone();
        trials.push(Trial::test("inventory", move || inventory(&cases).map_err(Failed::from)));
    }
    for (idx, case) in cases.iter().enumerate() {
        let Ok(d) = &case.directive else {
            let err = case.directive.clone().unwrap_err();
            trials.push(Trial::test(format!("text::{}", case.name), move || Err(Failed::from(err))));
            continue;
        };
        devices.extend(d.devices.iter().copied());
        for front in [Front::Text, Front::Proto, Front::Encoded] {
            let cases = cases.clone();
            let matched = matched.clone();
            let label = match front {
                Front::Text => "text",
                Front::Proto => "proto",
                Front::Encoded => "encoded",
            };
            trials.push(Trial::test(format!("{label}::{}", case.name), move || {
                let case = &cases[idx];
                let d = case.directive.as_ref().unwrap();
                run_case(case, d, front).map_err(Failed::from)?;
                matched.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }));
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    let devs: Vec<String> = devices.iter().map(usize::to_string).collect();
    println!(
        "hlo-tests: {} module readings agree with each other and with the goldens' inputs ({} files, devices {})",
        matched.load(Ordering::Relaxed),
        cases.len(),
        devs.join("/")
    );
    conclusion.exit();
}
