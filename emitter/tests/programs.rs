//! Buffer assignment and thunk programs on parsed modules.

use emitter::buffers::{ALIGN, BufferKind};
use emitter::{DeclaredShapes, DeviceMode, Flags, PeerAccessTable, Programs, build_programs, inline_calls};
use thunks::{CollectiveConfig, Implementation, Region, ScratchSizer, Thunk};

/// Asks for some scratch and signals so their placement is exercised.
struct Sizer;

impl ScratchSizer for Sizer {
    fn scratch_bytes(&self, c: &CollectiveConfig, _: Implementation) -> usize {
        c.bytes_per_device * 2
    }
    fn signal_bytes(&self, c: &CollectiveConfig, _: Implementation) -> usize {
        8 * (1 + c.groups.first().map_or(1, Vec::len))
    }
}

fn build(text: &str, n: usize, mode: DeviceMode, flags: &str) -> Programs {
    let m = hlo::parse_text("t.hlo", text).unwrap();
    let flat = inline_calls(&m).unwrap();
    let flags = Flags::parse(flags).unwrap();
    let peers = PeerAccessTable::for_host_topology(n, &flags.host_topology);
    build_programs(&flat, n, mode, &flags, &peers, &DeclaredShapes, &Sizer).unwrap()
}

/// No two buffers that are live at the same time share a byte; everything is aligned and
/// inside the arena; signals overlap nothing.
fn check_layout(p: &Programs) {
    let b = &p.buffers;
    for (i, x) in b.buffers.iter().enumerate() {
        assert_eq!(x.region.offset % ALIGN, 0, "{x:?}");
        assert!(x.region.offset + x.region.len <= b.arena_bytes, "{x:?} outside {}", b.arena_bytes);
        for y in &b.buffers[i + 1..] {
            let live_together = x.first <= y.last && y.first <= x.last;
            let reserved = |k| matches!(k, BufferKind::Signals | BufferKind::Scratch | BufferKind::Zero);
            let permanent = reserved(x.kind) || reserved(y.kind);
            if live_together || permanent {
                assert!(!x.region.overlaps(&y.region), "{x:?} overlaps {y:?}");
            }
        }
    }
    for prog in &p.programs {
        assert_eq!(prog.thunks, p.programs[0].thunks, "programs are symmetric");
        assert_eq!(prog.arena_bytes, b.arena_bytes);
    }
}

const ASYNC: &str = r#"
HloModule m, replica_count=4
ENTRY main {
  x = f32[2,3] parameter(0)
  st = (f32[2,3], f32[8,3]) all-gather-start(x), replica_groups={}, dimensions={0}
  y = f32[2,3] negate(x)
  dn = f32[8,3] all-gather-done(st)
  ROOT t = (f32[8,3], f32[2,3]) tuple(dn, y)
}
"#;

#[test]
fn async_start_aliases_operand_and_done_aliases_result() {
    let p = build(ASYNC, 4, DeviceMode::Replica, "");
    check_layout(&p);
    let prog = &p.programs[2];
    assert_eq!(prog.device, 2);
    let x = prog.params[0][0];
    let Thunk::Collective { inputs, outputs, implementation, scratch, signals, .. } = &prog.thunks[0] else {
        panic!("{prog}")
    };
    assert_eq!(inputs, &vec![x]);
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].len, 96);
    assert!(matches!(implementation, Implementation::Kernel(_)));
    assert_eq!((scratch.len, signals.len), (48, 40));
    assert!(matches!(prog.thunks[1], Thunk::Compute { ref name, .. } if name == "y"));
    assert_eq!(prog.thunks[2], Thunk::CollectiveDone { name: "dn".into(), start: 0 });
    assert_eq!(prog.thunks.len(), 3);
    // The result tuple is (done's buffer = the start's result, y).
    assert_eq!(prog.results[0], outputs[0]);
    // The operand stays live across the async pair: y's buffer is not x's.
    let Thunk::Compute { outputs: y, .. } = &prog.thunks[1] else { unreachable!() };
    assert!(!y[0].overlaps(&x) && !y[0].overlaps(&outputs[0]));
    let text = prog.to_string();
    assert!(text.starts_with("device 2: arena "), "{text}");
    assert!(text.contains("collective st ("), "{text}");
    assert!(text.contains("all-gather-start f32 24 B dim=0 groups={{0,1,2,3}} [kernel (direct all-gather)]"), "{text}");
    assert!(text.contains("done dn (waits for #0)"), "{text}");
}

#[test]
fn dead_values_are_reused_and_aliases_share_bytes() {
    let p = build(
        r#"
HloModule m
ENTRY main {
  a = f32[64] parameter(0)
  b = f32[64] negate(a)
  c = f32[64] negate(b)
  d = f32[64] negate(c)
  e = f32[64] negate(d)
  r = f32[8,8] reshape(e)
  bc = f32[8,8] bitcast(r)
  t = (f32[8,8], f32[64]) tuple(bc, a)
  g = f32[8,8] get-tuple-element(t), index=0
  ROOT k = f32[8,8] copy(g)
}
"#,
        1,
        DeviceMode::Replica,
        "",
    );
    check_layout(&p);
    let v = &p.buffers.values;
    let by_name = |n: &str| {
        p.programs[0]
            .thunks
            .iter()
            .find_map(|t| match t {
                Thunk::Compute { name, outputs, .. } if name == n => Some(outputs[0]),
                _ => None,
            })
            .unwrap()
    };
    // Four negates of 256 bytes: with reuse, at most three live at once (a, x, y).
    let (b, c, d, e) = (by_name("b"), by_name("c"), by_name("d"), by_name("e"));
    assert_eq!(b.offset, d.offset, "d reuses b's bytes");
    assert_eq!(c.offset, e.offset, "e reuses c's bytes");
    // reshape / bitcast / tuple / gte add no thunks and no bytes; copy is a Copy thunk.
    let last = p.programs[0].thunks.last().unwrap();
    assert!(matches!(last, Thunk::Copy { src, len: 256, .. } if *src == e.offset), "{last:?}");
    assert_eq!(p.programs[0].thunks.len(), 5);
    assert_eq!(p.buffers.arena_bytes, 3 * 256);
    assert_eq!(p.programs[0].results[0].offset, p.programs[0].params[0][0].offset, "k reuses a's bytes");
    assert!(v.values().all(|r| r.iter().all(|x| x.len == 256 || x.len == 0)));
}

#[test]
fn calls_are_inlined_so_their_collectives_run() {
    let text = r#"
HloModule m, num_partitions=2
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = f32[] add(x, y)
}
body {
  p = f32[4] parameter(0)
  ROOT s = f32[4] all-reduce(p), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
}
ENTRY main {
  a = f32[4] parameter(0)
  c = f32[4] call(a), to_apply=body
  d = f32[4] call(c), to_apply=body
  ROOT n = f32[4] negate(d)
}
"#;
    let p = build(text, 2, DeviceMode::Partition, "--all_reduce_backend=fallback");
    check_layout(&p);
    let names: Vec<String> = p.programs[0].thunks.iter().map(|t| t.label()).collect();
    assert_eq!(names, ["all-reduce 's'", "all-reduce 's.1'", "compute 'n'"]);
    assert_eq!(p.planned.len(), 2);
    assert!(p.planned.iter().all(|c| c.decision.implementation == Implementation::Fallback));
    // Signals are distinct per collective and never overlap values.
    let sig: Vec<Region> = p.buffers.signals.values().copied().collect();
    assert_eq!(sig.len(), 2);
    assert!(!sig[0].overlaps(&sig[1]));
}

#[test]
fn permute_start_contexts_alias_the_zero_region() {
    let text = r#"
HloModule m, replica_count=2
ENTRY main {
  x = s32[3] parameter(0)
  st = (s32[3], s32[3], u32[], u32[]) collective-permute-start(x), source_target_pairs={{0,1},{1,0}}
  dn = s32[3] collective-permute-done(st)
  ROOT t = (s32[3], (s32[3], s32[3], u32[], u32[])) tuple(dn, st)
}
"#;
    let p = build(text, 2, DeviceMode::Replica, "");
    check_layout(&p);
    let r = &p.programs[1].results;
    assert_eq!(r.len(), 5);
    assert_eq!(r[0], r[2], "done is the start's result");
    assert_eq!(r[1], p.programs[1].params[0][0], "element 0 is the operand");
    assert_eq!(r[3], r[4]);
    assert_eq!(r[3].len, 4);
    let zero = p.buffers.buffers.iter().find(|b| b.kind == BufferKind::Zero).unwrap();
    assert_eq!(zero.region.offset, r[3].offset);
}

/// A module with one loop `w` over state `(s32[], f32[4])`: `cmp` is the condition's root
/// (over `i` and `n`, the bound), `next` the counter update, `start` its initial value.
fn counted(cmp: &str, bound: &str, next: &str, start: i32) -> String {
    format!(
        "HloModule m\n\nadd {{\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT s = f32[] add(a, b)\n}}\n\n\
         c {{\n  s = (s32[], f32[4]) parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n  \
         n = s32[] {bound}\n  ROOT p = pred[] {cmp}\n}}\n\n\
         b {{\n  s = (s32[], f32[4]) parameter(0)\n  i = s32[] get-tuple-element(s), index=0\n  \
         x = f32[4] get-tuple-element(s), index=1\n  r = f32[4] all-reduce(x), to_apply=add, replica_groups={{}}\n  \
         k = s32[] constant(2)\n  i1 = s32[] {next}\n  ROOT t = (s32[], f32[4]) tuple(i1, r)\n}}\n\n\
         ENTRY main {{\n  x = f32[4] parameter(0)\n  z = s32[] constant({start})\n  \
         init = (s32[], f32[4]) tuple(z, x)\n  w = (s32[], f32[4]) while(init), condition=c, body=b\n  \
         ROOT r = f32[4] get-tuple-element(w), index=1\n}}\n"
    )
}

#[test]
fn counted_loops_have_a_trip_count_and_unroll() {
    let cases: &[(&str, &str, &str, i32, Option<i64>)] = &[
        ("compare(i, n), direction=LT", "constant(7)", "add(i, k)", 0, Some(4)),
        ("compare(i, n), direction=LE", "constant(7)", "add(k, i)", 1, Some(4)),
        ("compare(n, i), direction=GT", "constant(6)", "add(i, k)", 0, Some(3)),
        ("compare(n, i), direction=GE", "constant(6)", "add(i, k)", 0, Some(4)),
        ("compare(i, n), direction=LT", "constant(-3)", "add(i, k)", 0, Some(0)),
        // Not counted: the wrong direction, a bound read from data, a step that is not a constant.
        ("compare(i, n), direction=GT", "constant(7)", "add(i, k)", 0, None),
        ("compare(i, n), direction=NE", "constant(7)", "add(i, k)", 0, None),
        ("compare(i, n), direction=LT", "constant(7)", "multiply(i, k)", 1, None),
        ("compare(i, n), direction=LT", "constant(7)", "add(i, i)", 1, None),
    ];
    for &(cmp, bound, next, start, want) in cases {
        let text = counted(cmp, bound, next, start);
        let m = hlo::parse_text("t.hlo", &text).unwrap();
        let w = m.entry().instrs.iter().copied().find(|&i| m.instrs[i].opcode == hlo::Opcode::While).unwrap();
        assert_eq!(emitter::trip_count(&m, w), want, "{cmp} {bound} {next} from {start}");
        let flat = inline_calls(&m).unwrap();
        let count = |op| flat.entry().instrs.iter().filter(|&&i| flat.instrs[i].opcode == op).count();
        match want {
            Some(t) => {
                assert_eq!(count(hlo::Opcode::While), 0, "{cmp}");
                assert_eq!(count(hlo::Opcode::AllReduce), t as usize, "{cmp}");
            }
            None => assert_eq!(count(hlo::Opcode::While), 1, "{cmp}"),
        }
    }
}
