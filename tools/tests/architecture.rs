//! ARCHITECTURE.md's crate graph against the Cargo.toml files, and every workspace crate a
//! crate declares in `[dependencies]` named in its sources: the document cannot drift from
//! the build, and no edge is declared and unused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Workspace crates by the name dependents use for them, with their directory.
const CRATES: &[(&str, &str)] = &[
    ("hlo", "hlo"),
    ("ffi", "ffi"),
    ("runs", "runs"),
    ("thunks", "thunks"),
    ("emitter", "emitter"),
    ("kernels", "kernels"),
    ("plugin", "plugin"),
    ("plugin/so", "plugin/so"),
    ("tools", "tools"),
    ("cli", "cli"),
    ("fuzz", "fuzz"),
    ("hlo-tests", "hlo-tests"),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The workspace crates in `[dependencies]` of `dir`'s Cargo.toml.
fn declared(dir: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join(dir).join("Cargo.toml")).unwrap();
    let mut in_deps = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = l == "[dependencies]";
            continue;
        }
        if !in_deps || l.is_empty() || l.starts_with('#') {
            continue;
        }
        let key = l.split(['.', '=', ' ']).next().unwrap_or_default();
        if CRATES.iter().any(|(n, _)| *n == key) {
            out.insert(key.to_string());
        }
    }
    out
}

/// The graph block of ARCHITECTURE.md: crate → workspace crates it depends on.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let start = text.find("## Crates and their dependencies").expect("the section");
    let block = text[start..].split("```").nth(1).expect("the graph block");
    let mut out = BTreeMap::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let name = line.split_whitespace().next().unwrap().to_string();
        let deps = match line.split_once('→') {
            None => BTreeSet::new(),
            Some((_, rest)) => {
                // The edges end where two spaces start a note ("(dev: ...)", "package ...").
                let edges = rest.trim_start().split("  ").next().unwrap_or_default();
                edges
                    .split(',')
                    .map(|d| d.trim().split('[').next().unwrap_or_default().to_string())
                    .filter(|d| !d.is_empty())
                    .collect()
            }
        };
        out.insert(name, deps);
    }
    out
}

#[test]
fn the_documented_crate_graph_is_the_built_one() {
    let doc = documented();
    for (name, dir) in CRATES {
        let want = declared(dir);
        let got = doc.get(*name).unwrap_or_else(|| panic!("ARCHITECTURE.md's graph has no line for {name}"));
        assert_eq!(got, &want, "{name}: ARCHITECTURE.md says {got:?}, {dir}/Cargo.toml declares {want:?}");
    }
    assert_eq!(doc.len(), CRATES.len(), "ARCHITECTURE.md names crates that do not exist: {:?}", doc.keys());
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_declared_workspace_dependency_is_used() {
    for (name, dir) in CRATES {
        let mut files = Vec::new();
        sources(&root().join(dir).join("src"), &mut files);
        let text: String = files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect();
        for dep in declared(dir) {
            let ident = dep.replace('-', "_");
            let used = text.contains(&format!("{ident}::")) || text.contains(&format!("use {ident}"));
            assert!(used, "{name} declares {dep} in [dependencies] and its sources never name it");
        }
    }
}
