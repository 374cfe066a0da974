//! Malformed HLO text: every case is a parse error at the right line and column,
//! with a message that says what was wrong, and a caret under the offending text.
//! None may panic or overflow the stack.

use hlo::ErrorKind;

/// Wraps instruction lines in a module with one ENTRY computation (they start on line 3).
fn entry(body: &str) -> String {
    format!("HloModule m\nENTRY e {{\n{body}\n}}\n")
}

const ADD: &str = "add {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}\n";

/// Wraps instruction lines after the `add` computation (they start on line 8).
fn with_add(body: &str) -> String {
    format!("HloModule m\n{ADD}ENTRY e {{\n{body}\n}}\n")
}

#[track_caller]
fn check(src: &str, line: u32, col: u32, fragment: &str) {
    let e = match hlo::text::parse("t.hlo", src) {
        Ok(_) => panic!("accepted malformed input:\n{src}"),
        Err(e) => e,
    };
    let shown = e.to_string();
    println!("{shown}\n");
    assert_eq!(e.kind, ErrorKind::Parse, "{shown}");
    assert_eq!((e.line, e.col), (line, col), "{shown}");
    assert!(e.message.contains(fragment), "message lacks {fragment:?}: {shown}");
    assert!(shown.starts_with(&format!("t.hlo:{line}:{col}: parse error: ")), "{shown}");
    assert!(shown.contains("\n  | ") && shown.trim_end().ends_with('^'), "no caret: {shown}");
}

#[test]
fn empty_and_garbage_input() {
    check("", 1, 1, "empty input");
    check("   \n\n  // only a comment\n", 1, 1, "empty input");
    check("\u{0}\u{1}\u{ff}\u{fffd} garbage", 1, 1, "expected 'HloModule");
    check("int main() { return 0; }\n", 1, 1, "expected 'HloModule");
    check("ENTRY e {\n  ROOT x = f32[] parameter(0)\n}\n", 1, 1, "expected 'HloModule");
    check("HloModule\n", 1, 10, "expected a module name");
    check("HloModule m, replica_count=0\nENTRY e {\n  ROOT x = f32[] parameter(0)\n}\n", 1, 28, "at least 1");
}

#[test]
fn truncated_and_unbalanced() {
    check("HloModule m\nENTRY e {\n  x = f32[] parameter(0)\n", 3, 25, "unexpected end of file");
    check("HloModule m\nENTRY e {\n  x = f32[] parameter(0\n}\n", 4, 1, "expected ')'");
    check(
        "HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] copy(x), foo={a, {b\n",
        4,
        36,
        "unbalanced '{'",
    );
    check(
        "HloModule m\nENTRY e {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] copy(x), foo={a, {b}\n}\n",
        5,
        2,
        "unexpected end of file",
    );
    check(&entry("  x = f32[2] parameter(0)\n  ROOT y = f32[2] copy(x), foo={a, (b}}"), 4, 38, "mismatched '}'");
    check(
        &entry("  x = f32[2] parameter(0)\n  ROOT b = f32[2] broadcast(x), dimensions={0"),
        5,
        2,
        "unexpected end of file",
    );
    check("HloModule m\nENTRY e {\n  ROOT x = f32[] parameter(0)\n}\n/* never closed\n", 5, 1, "unterminated '/*'");
    check("HloModule m /* oops\nENTRY e {\n  ROOT x = f32[] parameter(0)\n}\n", 1, 13, "unterminated '/*'");
}

#[test]
fn bad_tokens() {
    check(&entry("  x = f32[2] parameter(0)\n  ROOT y = f32[2] bogus(x)"), 4, 19, "unknown opcode 'bogus'");
    check(&entry("  ROOT x = f31[2] parameter(0)"), 3, 12, "unknown element type 'f31'");
    check(&entry("  ROOT x = f32 parameter(0)"), 3, 16, "expected '['");
    check(&entry("  ROOT x = f32[2,] parameter(0)"), 3, 18, "expected a dimension size");
    check(&entry("  ROOT x = f32[2 parameter(0)"), 3, 18, "expected ']' or ','");
    check(&entry("  ROOT x f32[2] parameter(0)"), 3, 10, "expected '='");
    check(&entry("  ROOT = f32[2] parameter(0)"), 3, 8, "expected an instruction name");
    check(
        &entry("  x = f32[2] parameter(0)\n  ROOT y = f32[2] custom-call(x), custom_call_target=\"abc"),
        4,
        54,
        "unterminated string",
    );
    check(
        &entry("  x = f32[2] parameter(0)\n  ROOT y = pred[2] compare(x, x), direction=XX"),
        4,
        45,
        "unknown comparison direction 'XX'",
    );
    check(
        &entry("  x = f32[2] parameter(0)\n  ROOT y = f32[2] copy(x), dimensions={0}, dimensions={0}"),
        4,
        44,
        "duplicate attribute",
    );
    check(
        &entry("  x = f32[2] parameter(0)\n  ROOT y = f32[2] copy(x) junk"),
        5,
        1,
        "expected '=' after instruction name 'junk'",
    );
    check(
        &entry("  x = f32[2] parameter(0)\n  ROOT y = f32[2] copy(x), use_global_device_ids=yes"),
        4,
        50,
        "expected true or false",
    );
}

#[test]
fn shapes_out_of_bounds() {
    check(&entry("  ROOT x = f32[99999999999999999999] parameter(0)"), 3, 16, "out of range");
    check(&entry("  ROOT x = f32[4294967296,4294967296] parameter(0)"), 3, 12, "too large");
    check(&entry("  ROOT x = f32[<=8] parameter(0)"), 3, 16, "dynamic dimensions are not supported");
    check(&entry("  ROOT x = f32[?,2] parameter(0)"), 3, 16, "dynamic dimensions are not supported");
    let rank33 = vec!["1"; 33].join(",");
    check(&entry(&format!("  ROOT x = f32[{rank33}] parameter(0)")), 3, 80, "more than 32 dimensions");
    check(&entry("  ROOT x = f32[-1] parameter(0)"), 3, 16, "non-negative");
    check(&entry("  ROOT x = token[2] parameter(0)"), 3, 12, "token shapes have no dimensions");
}

#[test]
fn nesting_bombs_are_errors_not_stack_overflows() {
    let bomb = "(".repeat(10_000);
    check(&entry(&format!("  ROOT x = {bomb}")), 3, 76, "nested too deeply");
    check(
        &entry(&format!("  x = f32[] parameter(0)\n  ROOT y = f32[] copy(x), foo={}", "{".repeat(10_000))),
        4,
        287,
        "nested too deeply",
    );
    check(
        &entry(&format!("  x = f32[] parameter(0)\n  ROOT y = f32[] copy(x), sharding={}", "{".repeat(10_000))),
        4,
        100,
        "nested too deeply",
    );
    check(&entry(&format!("  x = f32[] parameter(0)\n  ROOT y = f32[] copy({bomb}")), 4, 87, "nested too deeply");
    check(&entry(&format!("  ROOT c = f32[] constant({bomb})")), 3, 27, "expected an f32 value");
    let nested_shape = format!("{}f32[]{}", "(".repeat(63), ")".repeat(63));
    check(&entry(&format!("  ROOT c = {nested_shape} constant({bomb}")), 3, 216, "expected an f32 value");
}

#[test]
fn replica_groups_and_shardings() {
    check(
        &with_add("  x = f32[] parameter(0)\n  ROOT y = f32[] all-reduce(x), replica_groups={{0,1}, to_apply=add"),
        9,
        56,
        "or '}' to close replica_groups",
    );
    check(
        &with_add("  x = f32[] parameter(0)\n  ROOT y = f32[] all-reduce(x), replica_groups={{0,1}"),
        10,
        2,
        "unexpected end of file",
    );
    check(
        &with_add("  x = f32[] parameter(0)\n  ROOT y = f32[] all-reduce(x), replica_groups=[2,3]<=[4], to_apply=add"),
        9,
        48,
        "groups x size",
    );
    check(
        &with_add(
            "  x = f32[] parameter(0)\n  ROOT y = f32[] all-reduce(x), replica_groups=[2,2]<=[2,2]T(0,0), to_apply=add",
        ),
        9,
        48,
        "bad transpose permutation",
    );
    check(
        &with_add(
            "  x = f32[] parameter(0)\n  ROOT y = f32[] all-reduce(x), replica_groups=[2,2]<=[2,2]T(1,2), to_apply=add",
        ),
        9,
        48,
        "bad transpose permutation",
    );
    check(
        &with_add("  x = f32[] parameter(0)\n  ROOT y = f32[] all-reduce(x), replica_groups=[4]<=[4], to_apply=add"),
        9,
        48,
        "need [groups,size]",
    );
    check(
        &with_add(
            "  x = f32[] parameter(0)\n  ROOT y = f32[] all-reduce(x), replica_groups=mesh[a=2] {b}, to_apply=add",
        ),
        9,
        59,
        "unknown mesh axis 'b'",
    );
    check(
        &with_add("  x = f32[] parameter(0)\n  ROOT y = f32[] all-reduce(x), replica_groups=bogus, to_apply=add"),
        9,
        48,
        "unknown replica groups form",
    );
    check(&entry("  ROOT x = f32[4] parameter(0), sharding={devices=[2,2]0,1,2}"), 3, 51, "need 4 devices but 3");
    check(&entry("  ROOT x = f32[4] parameter(0), sharding={devices=[2,2]<=[3]}"), 3, 51, "need 4 devices but 3");
    check(
        &with_add(
            "  x = f32[] parameter(0)\n  ROOT y = f32[] all-reduce(x), replica_groups=[1,100000]<=[100000], to_apply=add",
        ),
        9,
        48,
        "too large",
    );
    check(&entry("  ROOT x = f32[4] parameter(0), sharding={devices=[100000]<=[100000]}"), 3, 51, "too large");
    check(&entry("  ROOT x = f32[4] parameter(0), sharding={bogus"), 4, 2, "unexpected end of file");
    check(
        &entry("  x = f32[2] parameter(0)\n  ROOT y = f32[2] collective-permute(x), source_target_pairs={{0,1,2}}"),
        4,
        63,
        "expected {source,target}",
    );
    check(&entry("  x = f32[2] parameter(0)\n  ROOT y = f32[4] pad(x, x), padding=1x2"), 4, 38, "bad padding");
    check(&entry("  x = f32[2] parameter(0)\n  ROOT y = f32[1] slice(x), slice={[0,1]}"), 4, 38, "expected ':'");
}

#[test]
fn names_and_structure() {
    check(&entry("  x = f32[] parameter(0)\n  ROOT y = f32[] negate(z)"), 4, 25, "undefined operand 'z'");
    check(
        &entry("  x = f32[] parameter(0)\n  y = f32[] negate(w)\n  ROOT w = f32[] negate(x)"),
        4,
        20,
        "used before its definition",
    );
    check(&entry("  x = f32[] parameter(0)\n  x = f32[] negate(x)"), 4, 3, "duplicate instruction name 'x'");
    check(
        &entry("  x = f32[] parameter(0)\n  ROOT y = f32[] negate(x)\n  ROOT z = f32[] negate(x)"),
        5,
        3,
        "second ROOT",
    );
    check(
        &format!("HloModule m\n{ADD}{ADD}ENTRY e {{\n  ROOT x = f32[] parameter(0)\n}}\n"),
        7,
        1,
        "duplicate computation name 'add'",
    );
    check(&format!("HloModule m\n{ADD}"), 1, 1, "no ENTRY computation");
    check(
        "HloModule m\nENTRY a {\n  ROOT x = f32[] parameter(0)\n}\nENTRY b {\n  ROOT x = f32[] parameter(0)\n}\n",
        5,
        1,
        "second ENTRY",
    );
    check(&entry("  x = f32[] parameter(0)\n  ROOT y = f32[] parameter(2)"), 4, 28, "parameter(1) is missing");
    check(&entry("  x = f32[] parameter(0)\n  ROOT y = f32[] parameter(0)"), 4, 28, "duplicate parameter number 0");
    check(
        &entry("  x = f32[] parameter(0)\n  ROOT y = f32[] call(x), to_apply=nowhere"),
        4,
        36,
        "unknown computation 'nowhere'",
    );
    check(
        &entry("  x = f32[] parameter(0)\n  ROOT y = f32[] negate(x), control-predecessors={q}"),
        4,
        51,
        "unknown control predecessor 'q'",
    );
    check("HloModule m\nENTRY e {\n}\n", 2, 7, "has no instructions");
}

#[test]
fn bad_constants() {
    check(
        &entry("  ROOT c = f32[3] constant({1, 2})"),
        3,
        28,
        "dimension 0 of the array constant has 2 entries; expected 3",
    );
    check(&entry("  ROOT c = f32[2] constant({1, 2, 3})"), 3, 35, "too many entries");
    check(&entry("  ROOT c = s32[2,2] constant({{1,2},{3,4},{5,6}})"), 3, 43, "too many entries");
    check(
        &entry("  ROOT c = s32[2,2] constant({{1,2},{3}})"),
        3,
        37,
        "dimension 1 of the array constant has 1 entries",
    );
    check(&entry("  ROOT c = s8[] constant(128)"), 3, 26, "out of range for s8");
    check(&entry("  ROOT c = u8[2] constant({1, -1})"), 3, 31, "out of range for u8");
    check(&entry("  ROOT c = s4[] constant(8)"), 3, 26, "out of range for s4");
    check(&entry("  ROOT c = u64[] constant(18446744073709551616)"), 3, 27, "out of range for u64");
    check(&entry("  ROOT c = s32[] constant(1.5)"), 3, 27, "expected an integer");
    check(&entry("  ROOT c = pred[] constant(2)"), 3, 28, "expected true or false");
    check(&entry("  ROOT c = f32[] constant(infinity)"), 3, 27, "invalid f32 value");
    check(&entry("  ROOT c = f32[] constant(1.5.2)"), 3, 27, "invalid f32 value");
    check(&entry("  ROOT c = f32[1000000] constant({...})"), 3, 34, "elided constant");
    check(&entry("  ROOT c = f32[2] constant(1)"), 3, 28, "expected '{'");
    check(&entry("  ROOT c = (f32[], s32[]) constant((1))"), 3, 38, "expected ','");
    check(&entry("  ROOT c = f8e8m0fnu[] constant(1)"), 3, 33, "not supported");
    check(&entry("  ROOT c = token[] constant(1)"), 3, 29, "token constants are not supported");
}

/// Every prefix and many single-character mutations of real XLA output must give
/// Ok or a located parse error, never a panic.
#[test]
fn truncations_and_mutations_never_panic() {
    let dir = format!("{}/tests/text_samples", env!("CARGO_MANIFEST_DIR"));
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let replacements =
        ['{', '}', '(', ')', '[', ']', ',', '=', '"', '%', '/', '*', '-', '9', 'x', ' ', '\n', 'é', ':', '<'];
    for name in ["jax_shmap", "jax_ctrl_opt", "jax_mesh2", "jax_spmd_opt", "jax_misc"] {
        let src = std::fs::read_to_string(format!("{dir}/{name}.hlo")).unwrap();
        let bounds: Vec<usize> = src.char_indices().map(|(i, _)| i).collect();
        let step = (bounds.len() / 1500).max(1);
        for &cut in bounds.iter().step_by(step) {
            if let Err(e) = hlo::text::parse("t.hlo", &src[..cut]) {
                assert!(e.line > 0 && e.source_line.is_some(), "{e}");
                let _ = e.to_string();
            }
        }
        for _ in 0..1500 {
            let at = bounds[(next() % bounds.len() as u64) as usize];
            let ch = replacements[(next() % replacements.len() as u64) as usize];
            let mut s = src.clone();
            let end = at + s[at..].chars().next().map_or(0, char::len_utf8);
            if next() % 3 == 0 {
                s.replace_range(at..end, "");
            } else {
                s.replace_range(at..end, &ch.to_string());
            }
            if let Err(e) = hlo::text::parse("t.hlo", &s) {
                assert!(e.line > 0 && e.source_line.is_some(), "{e}");
                let _ = e.to_string();
            }
        }
    }
}
