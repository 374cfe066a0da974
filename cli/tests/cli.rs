//! The `peerless` binary as a user runs it: exit codes, tables and error messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("cli lives in the workspace").to_path_buf()
}

fn peerless(args: &[&str]) -> Output {
    peerless_with(args, &[])
}

/// `peerless` with extra environment variables. XLA's CPU plugin comes from the environment
/// as a user's would: PEERLESS_XLA_PLUGIN, else the JAX venv (`$PEERLESS_VENV_DIR/jax` in CI,
/// `<repo>/.venv/jax` here).
fn peerless_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peerless"))
        .args(args)
        .current_dir(repo())
        .env_remove("PEERLESS_FLAGS")
        // The rules, not a tuning profile (issue 27), unless a test names one.
        .env("PEERLESS_TUNING_PROFILE", "0")
        .envs(env.iter().copied())
        .output()
        .expect("run peerless")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("peerless-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// `peerless run FILE.hlo` runs inside XLA (XLA's CPU plugin, Peerless's pass and handlers),
/// and its outputs are what the module says: the replicas' sum, then the sum times the
/// replica id (checked here from the inputs it wrote, summed in group order as the kernel does).
#[test]
fn readme_example_runs_inside_xla_and_computes_the_sum() {
    let path = tmp("ar-default.npz");
    let o =
        peerless(&["run", "examples/all_reduce.hlo", "--devices", "4", "--out", path.to_str().expect("utf-8 path")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("output  device") && out.contains("replica 3"), "{out}");
    assert!(out.contains("4 replicas inside XLA"), "{out}");
    assert!(out.contains("(cpu); Peerless's pass: 1 of 1 collectives on Peerless"), "{out}");
    assert!(out.contains("all-reduce total f32 32 B groups={{0,1,2,3}} -> kernel (one-shot all-reduce)"), "{out}");
    let arrays = runs::io::read_npz(&path).expect("read npz");
    let f32s = |name: &str| -> Vec<f32> {
        let a = arrays.get(name).unwrap_or_else(|| panic!("no {name}"));
        a.data.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    };
    let ins: Vec<Vec<f32>> = (0..4).map(|d| f32s(&format!("p0_d{d}"))).collect();
    let sum: Vec<f32> = (0..8).map(|i| ins.iter().map(|x| x[i]).fold(0.0f32, |a, b| a + b)).collect();
    for d in 0..4 {
        assert_eq!(f32s(&format!("o0_d{d}")), sum, "device {d}'s sum");
        let scaled: Vec<f32> = sum.iter().map(|v| v * d as f32).collect();
        assert_eq!(f32s(&format!("o1_d{d}")), scaled, "device {d}'s scaled sum");
    }
}

/// What is missing when XLA's plugin cannot be found, and what to do; HLO text needs no
/// Python (Peerless encodes it as an HloModuleProto itself).
#[test]
fn run_without_xla_names_what_to_install() {
    let o = peerless_with(&["run", "examples/all_reduce.hlo"], &[("PEERLESS_XLA_PLUGIN", "/no/such/xla_plugin.so")]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(err.contains("PEERLESS_XLA_PLUGIN=/no/such/xla_plugin.so: no such file"), "{err}");
    assert!(err.contains("pip install lammps-jax-pjrt-cpu"), "{err}");
    let o = peerless_with(
        &["run", "examples/all_reduce.hlo", "--devices", "4"],
        &[("PEERLESS_PYTHON", "/no/such/python"), ("PATH", "/nonexistent")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("Peerless's pass: 1 of 1 collectives on Peerless"), "{}", stdout(&o));
}

/// An attribute the text parser keeps but no HloModuleProto field holds is an error at its
/// line and column, with a caret, before XLA sees anything.
#[test]
fn text_the_encoder_cannot_write_is_an_error_at_its_place() {
    let path = tmp("unencodable.hlo");
    std::fs::write(
        &path,
        "HloModule m\n\nENTRY main {\n  x = f32[4] parameter(0)\n  ROOT r = f32[4] add(x, x), frobnicate=1\n}\n",
    )
    .expect("write");
    let o = peerless(&["run", path.to_str().expect("utf-8 path"), "--devices", "1"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(err.contains("unencodable.hlo:5:") && err.contains("frobnicate=1") && err.contains('^'), "{err}");
}

#[test]
fn inputs_round_trip_through_npz() {
    let first = tmp("first.npz");
    let o = peerless(&["run", "examples/all_reduce.hlo", "--seed", "7", "--out", first.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let again = tmp("again.npz");
    let o = peerless(&[
        "run",
        "examples/all_reduce.hlo",
        "--inputs",
        first.to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(runs::io::read_npz(&first).unwrap(), runs::io::read_npz(&again).unwrap());
}

#[test]
fn check_explains_the_decisions_of_the_pass_inside_xla() {
    // `ar` reads the all-gather's result: on XLA:CPU a call must be ordered with a collective
    // that stays XLA's (it is), or it stays XLA's too.
    let hlo = tmp("guards.hlo");
    std::fs::write(
        &hlo,
        "HloModule guards\n\nsum {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n\n\
         ENTRY main {\n  x = f8e4m3fn[4] parameter(0)\n  y = f32[16] parameter(1)\n  \
         ags = (f8e4m3fn[4], f8e4m3fn[16]) all-gather-start(x), replica_groups={{0,1,2,3}}, dimensions={0}\n  \
         ag = f8e4m3fn[16] all-gather-done(ags)\n  \
         c = f32[16] convert(ag)\n  \
         z = f32[16] add(y, c)\n  \
         ar = f32[16] all-reduce(z), replica_groups={{0,2},{1,3}}, to_apply=sum\n  \
         ROOT t = (f8e4m3fn[16], f32[16]) tuple(ag, ar)\n}\n",
    )
    .unwrap();
    let o = peerless(&["check", hlo.to_str().unwrap(), "--devices", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = |name: &str| out.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_owned();
    assert!(out.contains("the pass inside XLA (cpu)"), "{out}");
    assert!(line("ags").contains("fallback") && line("ags").contains("dtype guard"), "{out}");
    assert!(line("ags").contains("f8e4m3fn"), "{out}");
    assert!(line("ar ").contains("kernel (one-shot all-reduce)") && line("ar ").contains("{{0,2},{1,3}}"), "{out}");
    // A flag changes the decision, with its name in the reason.
    let o = peerless(&["check", hlo.to_str().unwrap(), "--devices", "4", "--flag", "all_reduce_backend=fallback"]);
    let out = stdout(&o);
    assert!(line_of(&out, "ar ").contains("fallback") && out.contains("all_reduce_backend"), "{out}");
}

fn line_of(out: &str, name: &str) -> String {
    out.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_owned()
}

#[test]
fn bad_flags_list_the_valid_ones() {
    let o = peerless(&["check", "examples/all_reduce.hlo", "--flag", "all_reduce_backend=fast"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("all_reduce_backend") && err.contains("one_shot_max_bytes"), "{err}");
    let o = peerless(&["flags"]);
    assert!(o.status.success() && stdout(&o).contains("collective_timeout_ms"));
}

#[test]
fn forced_kernel_on_unsupported_case_is_a_stated_fallback_inside_xla() {
    // The pass leaves such a collective to XLA and says why (it never breaks a compile).
    let o = peerless(&[
        "run",
        "examples/all_reduce.hlo",
        "--flag",
        "all_reduce_backend=kernel",
        "--flag",
        "one_shot_max_bytes=16",
        "--flag",
        "two_shot_max_bytes=16",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("0 of 1 collectives on Peerless (module unchanged)"), "{out}");
    assert!(out.contains("forces a Peerless kernel, but 32 bytes > two_shot_max_bytes=16"), "{out}");
}

/// Malformed inputs: each gets a non-zero exit and an error with a location.
#[test]
fn malformed_inputs_fail_cleanly_with_locations() {
    let good = "HloModule m\n\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT y = f32[4] negate(x)\n}\n";
    let cases: Vec<(&str, String, &str)> = vec![
        ("empty", String::new(), ":1:1:"),
        ("truncated", good[..good.len() - 20].to_owned(), ":"),
        ("unknown opcode", good.replace("negate", "frobnicate"), ":5:"),
        ("unknown type", good.replace("f32[4] negate", "f31[4] negate"), ":5:"),
        ("shape mismatch", good.replace("ROOT y = f32[4]", "ROOT y = f32[5]"), ":5:"),
        ("operand type", good.replace("ROOT y = f32[4] negate(x)", "ROOT y = s32[4] negate(x)"), ":5:"),
        ("undefined operand", good.replace("negate(x)", "negate(z)"), ":5:"),
        ("duplicate name", good.replace("ROOT y", "ROOT x"), ":5:"),
        ("missing entry", good.replace("ENTRY ", ""), ":"),
        ("unbalanced", good.replace("ROOT y = f32[4] negate(x)\n}", "ROOT y = f32[4] negate(x)\n"), ":"),
        ("bad dims", good.replace("f32[4] parameter", "f32[4,] parameter"), ":4:"),
        ("bad groups", good.replace("negate(x)", "all-reduce(x), replica_groups={{0,1}, to_apply=e"), ":5:"),
        ("bad iota groups", good.replace("negate(x)", "all-reduce(x), replica_groups=[2,3]<=[4], to_apply=e"), ":5:"),
        ("unknown computation", good.replace("negate(x)", "call(x), to_apply=nowhere"), ":5:"),
        ("param gap", good.replace("parameter(0)", "parameter(1)"), ":4:"),
        ("bad constant", good.replace("negate(x)", "constant({1,2,3})"), ":5:"),
        ("int out of range", good.replace("ROOT y = f32[4] negate(x)", "ROOT y = s8[] constant(300)"), ":5:"),
        ("bad attribute", good.replace("negate(x)", "broadcast(x), dimensions={7}"), ":5:"),
        ("bad slice", good.replace("ROOT y = f32[4] negate(x)", "ROOT y = f32[2] slice(x), slice={[3:9]}"), ":5:"),
        (
            "bad transpose",
            good.replace("ROOT y = f32[4] negate(x)", "ROOT y = f32[4] transpose(x), dimensions={1}"),
            ":5:",
        ),
        ("unterminated string", good.replace("negate(x)", "negate(x), metadata={op_name=\"oops}"), ":"),
        ("nesting bomb", format!("HloModule m\nENTRY e {{\n  x = {} parameter(0)\n}}\n", "(".repeat(10_000)), ":3:"),
        ("huge dims", good.replace("f32[4] parameter", "f32[99999999999999999999] parameter"), ":4:"),
    ];
    assert!(cases.len() >= 20);
    for (what, text, loc) in &cases {
        let path = tmp(&format!("bad-{}.hlo", what.replace(' ', "_")));
        std::fs::write(&path, text).unwrap();
        let o = peerless(&["check", path.to_str().unwrap()]);
        let err = stderr(&o);
        assert!(!o.status.success(), "{what}: exit 0\n{}", stdout(&o));
        assert!(err.starts_with("error: ") && err.contains(&format!("{}{loc}", path.display())), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
    // Garbage bytes are taken as a proto and rejected as one.
    let path = tmp("garbage.pb");
    std::fs::write(&path, [0xffu8, 0x13, 0x00, 0x9a, 0x42, 0x07, 0xee]).unwrap();
    let o = peerless(&["check", path.to_str().unwrap()]);
    assert!(!o.status.success() && stderr(&o).contains("HloModuleProto"), "{}", stderr(&o));
    // A missing file is a clear error too.
    let o = peerless(&["run", "no/such/file.hlo"]);
    assert!(!o.status.success() && stderr(&o).contains("cannot read"), "{}", stderr(&o));
}

#[test]
fn check_decides_with_the_tuning_profile_and_names_it() {
    let profile = tmp("tuning.json");
    let json = r#"{"format": 1, "peerless_version": "0.1.0",
      "key": {"platform": "cpu", "device_kind": "cpu", "devices": 4, "links": "host"},
      "measured": {"date": "2026-11-26", "machine": "test", "command": "cli.rs"},
      "entries": [{"op": "all-reduce", "dtype": "f32", "group": 4,
        "points": [{"bytes": 1024, "us": {"xla": 10.0, "one-shot all-reduce": 20.0, "two-shot all-reduce": 30.0}}]}]}"#;
    std::fs::write(&profile, json).unwrap();
    let path = profile.to_str().unwrap();
    let o =
        peerless_with(&["check", "examples/all_reduce.hlo", "--devices", "4"], &[("PEERLESS_TUNING_PROFILE", path)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains(&format!("tuning profile: {path}")), "{out}");
    assert!(
        out.contains(&format!("fallback        profile {path}: all-reduce f32 groups of 4 at 32 B: XLA 10 µs")),
        "{out}"
    );
    // An explicit threshold gives all-reduce back to the thresholds.
    let o = peerless_with(
        &["check", "examples/all_reduce.hlo", "--devices", "4", "--flag", "one_shot_max_bytes=64"],
        &[("PEERLESS_TUNING_PROFILE", path)],
    );
    assert!(stdout(&o).contains("kernel (one-shot all-reduce)"), "{}", stdout(&o));
    let o = peerless(&["check", "examples/all_reduce.hlo", "--devices", "4"]);
    assert!(stdout(&o).contains("tuning profile: none"), "{}", stdout(&o));
}
