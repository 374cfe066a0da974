//! ARCHITECTURE.md's crate graph against the Cargo.toml files, and every crate a workspace
//! crate declares (workspace or registry; `[dependencies]`, `[dev-dependencies]`,
//! `[build-dependencies]`) named in the sources that can use it: the document cannot drift
//! from the build, and no dependency is declared and unused (what `cargo machete` checks,
//! without installing it in CI).

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
    table(dir, "[dependencies]").into_iter().filter(|k| CRATES.iter().any(|(n, _)| n == k)).collect()
}

/// Every key of table `section` (`[dependencies]`, ...) of `dir`'s Cargo.toml, targets'
/// tables (`[target.'cfg(..)'.dependencies]`) included.
fn table(dir: &str, section: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join(dir).join("Cargo.toml")).unwrap();
    let mut in_deps = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = l == section || (l.starts_with("[target.") && l.ends_with(&format!(".{}", &section[1..])));
            continue;
        }
        if !in_deps || l.is_empty() || l.starts_with('#') {
            continue;
        }
        out.insert(l.split(['.', '=', ' ']).next().unwrap_or_default().to_string());
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

/// The text of every `.rs` file of `dir` under `subdirs` (files or directories).
fn text_of(dir: &str, subdirs: &[&str]) -> String {
    let mut files = Vec::new();
    for sub in subdirs {
        let p = root().join(dir).join(sub);
        if p.is_dir() {
            sources(&p, &mut files);
        } else if p.is_file() {
            files.push(p);
        }
    }
    files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect()
}

fn names(text: &str, dep: &str) -> bool {
    let ident = dep.replace('-', "_");
    text.contains(&format!("{ident}::"))
        || text.contains(&format!("use {ident}"))
        || text.contains(&format!("{ident}!"))
}

#[test]
fn every_declared_dependency_is_used() {
    // The reading itself: tables found, and a name counts only as a path, an import or a macro.
    assert!(table("kernels", "[dependencies]").is_superset(&["prost", "sha2", "ffi"].map(String::from).into()));
    assert!(table("kernels", "[dev-dependencies]").len() + table("kernels", "[build-dependencies]").len() > 0);
    assert!(names("use prost::Message;", "prost") && names("log::warn!(..)", "log") && !names("prosthesis", "prost"));
    let mut unused = Vec::new();
    for (name, dir) in CRATES {
        // Library and binary code; tests, examples and benches for dev-dependencies; the
        // build script for build-dependencies.
        // A library whose `[lib] path` is outside src/ (hlo-tests' harness, tests/support/) counts as main, its folder whole.
        let manifest = std::fs::read_to_string(root().join(dir).join("Cargo.toml")).unwrap();
        let lib = hlo_tests::lib_root(&manifest);
        let lib_dir = std::path::Path::new(&lib).parent().and_then(|d| d.to_str()).unwrap_or("src");
        let main = text_of(dir, &["src", "build.rs", lib_dir]);
        let dev = main.clone() + &text_of(dir, &["tests", "examples", "benches"]);
        let build = text_of(dir, &["build.rs"]);
        for (section, text) in
            [("[dependencies]", &main), ("[dev-dependencies]", &dev), ("[build-dependencies]", &build)]
        {
            for dep in table(dir, section) {
                if !names(text, &dep) {
                    unused.push(format!("{name}: {section} {dep}"));
                }
            }
        }
    }
    assert!(unused.is_empty(), "declared and never named in the sources that could use them: {unused:#?}");
}

/// The C exports of `plugin/so` and the ones ARCHITECTURE.md names are the same.
#[test]
fn the_documented_c_exports_are_the_library_s() {
    let lib = std::fs::read_to_string(root().join("plugin/so/src/lib.rs")).unwrap();
    let exports: BTreeSet<String> = lib
        .split("extern \"C\" fn ")
        .skip(1)
        .map(|rest| rest.split('(').next().unwrap_or_default().trim().to_string())
        .collect();
    assert!(exports.contains("GetPjrtApi") && exports.len() > 5, "{exports:?}");
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let named: BTreeSet<String> = doc
        .split('`')
        .filter(|w| w.starts_with("PeerlessXla") || *w == "GetPjrtApi")
        .filter(|w| w.chars().all(|c| c.is_ascii_alphanumeric()))
        .map(String::from)
        .collect();
    assert_eq!(named, exports, "ARCHITECTURE.md names {named:?}; plugin/so exports {exports:?}");
}

/// ARCHITECTURE.md's table of registry dependencies names every one a workspace crate's
/// `[dependencies]` declares, with exactly the crates that declare it.
#[test]
fn the_documented_dependencies_are_the_declared_ones() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let section = doc.split("## Dependencies and why").nth(1).expect("the section");
    let ticked = |cell: &str| -> BTreeSet<String> { cell.split('`').skip(1).step_by(2).map(String::from).collect() };
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in section.lines().take_while(|l| !l.starts_with("## ")).filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').collect();
        for dep in ticked(cells[1]) {
            assert!(documented.insert(dep.clone(), ticked(cells[2])).is_none(), "{dep} has two rows");
        }
    }
    let mut declared: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, dir) in CRATES {
        for dep in table(dir, "[dependencies]").into_iter().filter(|d| !CRATES.iter().any(|(n, _)| n == d)) {
            declared.entry(dep).or_default().insert(name.to_string());
        }
    }
    assert_eq!(documented, declared, "ARCHITECTURE.md's dependency table vs the Cargo.toml files");
}
