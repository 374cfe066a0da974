//! Repository hygiene: BUILD.bazel mirrors the Cargo workspace. Bazel is not available
//! in our build environment, so this test is what keeps the Bazel targets honest.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("hlo-tests lives in the workspace root").to_path_buf()
}

/// Every `"..."` string following `key = ` (single value) or inside `key = [...]`.
fn quoted_values(text: &str, key: &str) -> Vec<String> {
    let mut out = Vec::new();
    let pat = format!("{key} = ");
    let mut rest = text;
    while let Some(pos) = rest.find(&pat) {
        rest = &rest[pos + pat.len()..];
        let end = if rest.starts_with('[') {
            rest.find(']').map_or(rest.len(), |e| e + 1)
        } else {
            rest.find('\n').unwrap_or(rest.len())
        };
        let value = &rest[..end];
        for (i, part) in value.split('"').enumerate() {
            if i % 2 == 1 {
                out.push(part.to_owned());
            }
        }
        rest = &rest[end..];
    }
    out
}

fn workspace_members(root: &Path) -> Vec<String> {
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).expect("read Cargo.toml");
    let start = cargo.find("members = [").expect("workspace members");
    let list = &cargo[start..start + cargo[start..].find(']').expect("closing ]")];
    list.split('"').skip(1).step_by(2).map(str::to_owned).collect()
}

#[test]
fn bazel_paths_exist() {
    let root = repo_root();
    let build = std::fs::read_to_string(root.join("BUILD.bazel")).expect("read BUILD.bazel");
    let mut checked = 0;
    for path in quoted_values(&build, "crate_root") {
        assert!(root.join(&path).is_file(), "BUILD.bazel names crate_root {path}, which does not exist");
        checked += 1;
    }
    for pattern in ["srcs", "data", "compile_data"].into_iter().flat_map(|k| quoted_values(&build, k)) {
        let prefix = pattern.split('*').next().unwrap_or(&pattern).trim_end_matches('/');
        assert!(root.join(prefix).exists(), "BUILD.bazel names {pattern}, but {prefix} does not exist");
        checked += 1;
    }
    assert!(checked > 10, "expected to check the BUILD.bazel paths, checked {checked}");
}

#[test]
fn every_workspace_crate_has_a_bazel_target() {
    let root = repo_root();
    let build = std::fs::read_to_string(root.join("BUILD.bazel")).expect("read BUILD.bazel");
    let roots = quoted_values(&build, "crate_root");
    for member in workspace_members(&root) {
        let manifest =
            std::fs::read_to_string(root.join(&member).join("Cargo.toml")).expect("read a member's Cargo.toml");
        let lib = format!("{member}/{}", hlo_tests::lib_root(&manifest));
        let main = format!("{member}/src/main.rs");
        let named = roots.iter().any(|r| *r == lib || *r == main);
        assert!(named, "workspace crate {member} has no BUILD.bazel target (crate_root {lib} or {main})");
    }
}
