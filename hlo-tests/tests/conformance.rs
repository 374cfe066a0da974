//! HLO conformance: every case under `hlo-tests/cases/` is run by Peerless's
//! interpreter on each declared device count and compared with XLA's goldens
//! (`hlo-tests/goldens/`, written only by `gen_goldens.py`). Each case runs twice:
//! once parsed from HLO text, once decoded from XLA's own serialized
//! `HloModuleProto` (`goldens/<case>.pb`).
//!
//! `cargo test -p peerless-hlo-tests --test conformance [-- FILTER]`

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hlo_tests::{Case, Directive, Mode, golden_inventory, golden_path, load_cases, proto_path, read_golden};
use libtest_mimic::{Arguments, Failed, Trial};

#[derive(Clone, Copy, Debug)]
enum Front {
    Text,
    Proto,
}

fn load_module(case: &Case, front: Front) -> Result<hlo::Module, String> {
    match front {
        Front::Text => hlo::parse_text(&case.path.display().to_string(), &case.text).map_err(|e| format!("parse: {e}")),
        Front::Proto => {
            let path = proto_path(&case.name);
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            hlo::decode_proto(&path.display().to_string(), &bytes).map_err(|e| format!("decode_proto: {e}"))
        }
    }
}

fn run_case(case: &Case, d: &Directive, n: usize, front: Front) -> Result<(), String> {
    let module = load_module(case, front)?;
    let golden = read_golden(&golden_path(&case.name, n), n)?;
    let args = hlo_tests::make_args(&module.entry_param_shapes(), &golden)?;
    let cfg = interp::RunConfig {
        num_devices: n,
        mode: match d.mode {
            Mode::Replica => interp::Mode::Replica,
            Mode::Partition => interp::Mode::Partition,
        },
    };
    let got = interp::run(&module, &cfg, &args).map_err(|e| format!("interp: {e}"))?;
    hlo_tests::compare_results(&got, &golden, d.tolerance)
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
        for &n in &d.devices {
            devices.insert(n);
            for front in [Front::Text, Front::Proto] {
                let cases = cases.clone();
                let matched = matched.clone();
                let label = match front {
                    Front::Text => "text",
                    Front::Proto => "proto",
                };
                trials.push(Trial::test(format!("{label}::{}::d{n}", case.name), move || {
                    let case = &cases[idx];
                    let d = case.directive.as_ref().unwrap();
                    run_case(case, d, n, front).map_err(Failed::from)?;
                    matched.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                }));
            }
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    let devs: Vec<String> = devices.iter().map(usize::to_string).collect();
    println!(
        "hlo-tests: {} case runs matched XLA goldens ({} files, devices {})",
        matched.load(Ordering::Relaxed),
        cases.len(),
        devs.join("/")
    );
    conclusion.exit();
}
