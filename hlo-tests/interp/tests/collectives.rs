//! Collectives on 1/2/4/8 devices: groups (explicit, iota, empty), modes, async forms.
mod common;
use common::*;
use hlo::Literal;
use interp::{InterpError, Mode};

const ADD: &str = "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n";

/// Device d's argument: [d*10, d*10+1, ...] of `len` elements.
fn per_dev(n: usize, len: usize) -> Vec<Vec<Literal>> {
    (0..n).map(|d| vec![arr(&[len as i64], &(0..len).map(|i| (d * 10 + i) as f32).collect::<Vec<_>>())]).collect()
}

fn run_n(text: &str, n: usize, mode: Mode, args: Vec<Vec<Literal>>) -> Vec<Literal> {
    let m = parse(text);
    interp::run(&m, &cfg(n, mode), &args).unwrap_or_else(|e| panic!("{e}"))
}

fn all_reduce(groups: &str, extra: &str) -> String {
    format!(
        "HloModule m\n{ADD}ENTRY e {{\n  a = f32[2] parameter(0)\n  ROOT r = f32[2] all-reduce(a), replica_groups={groups}{extra}, to_apply=add\n}}\n"
    )
}

#[test]
fn all_reduce_all_sizes() {
    for n in [1usize, 2, 4, 8] {
        let out = run_n(&all_reduce("{}", ""), n, Mode::Replica, per_dev(n, 2));
        let s: f32 = (0..n).map(|d| d as f32 * 10.0).sum();
        for o in &out {
            assert_eq!(vals::<f32>(o), vec![s, s + n as f32]);
        }
    }
}

#[test]
fn all_reduce_subgroups_and_iota_groups() {
    let out = run_n(&all_reduce("{{0,2},{1,3}}", ""), 4, Mode::Replica, per_dev(4, 2));
    assert_eq!(out.iter().map(|o| vals::<f32>(o)[0]).collect::<Vec<_>>(), vec![20., 40., 20., 40.]);
    // [2,2]<=[2,2]T(1,0) = {{0,2},{1,3}}.
    let out = run_n(&all_reduce("[2,2]<=[2,2]T(1,0)", ""), 4, Mode::Replica, per_dev(4, 2));
    assert_eq!(out.iter().map(|o| vals::<f32>(o)[0]).collect::<Vec<_>>(), vec![20., 40., 20., 40.]);
    let out = run_n(&all_reduce("[4,2]<=[8]", ""), 8, Mode::Replica, per_dev(8, 2));
    assert_eq!(
        out.iter().map(|o| vals::<f32>(o)[0]).collect::<Vec<_>>(),
        vec![10., 10., 50., 50., 90., 90., 130., 130.]
    );
}

#[test]
fn all_reduce_partition_mode_group_modes() {
    // channel_id + use_global_device_ids: flattened ids = partitions.
    let t = all_reduce("{{0,1},{2,3}}", ", channel_id=1, use_global_device_ids=true");
    let out = run_n(&t, 4, Mode::Partition, per_dev(4, 2));
    assert_eq!(out.iter().map(|o| vals::<f32>(o)[0]).collect::<Vec<_>>(), vec![10., 10., 50., 50.]);
    // channel_id alone: cross-replica-and-partition, groups list replica ids and take
    // every partition of them (XLA's golden all_reduce_partition.d4 agrees).
    let t = all_reduce("{{0}}", ", channel_id=1");
    let out = run_n(&t, 4, Mode::Partition, per_dev(4, 2));
    assert_eq!(out.iter().map(|o| vals::<f32>(o)[0]).collect::<Vec<_>>(), vec![60., 60., 60., 60.]);
    // No channel id in partition mode: cross-replica with one replica → identity.
    let out = run_n(&all_reduce("{}", ""), 4, Mode::Partition, per_dev(4, 2));
    assert_eq!(out.iter().map(|o| vals::<f32>(o)[0]).collect::<Vec<_>>(), vec![0., 10., 20., 30.]);
}

#[test]
fn all_reduce_generic_fixed_order_and_variadic() {
    // subtract is not commutative: left fold in group order: ((a0 - a1) - a2) - a3.
    let t = "HloModule m\nsub {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] subtract(x, y)\n}\nENTRY e {\n  a = f32[1] parameter(0)\n  ROOT r = f32[1] all-reduce(a), replica_groups={{3,2,1,0}}, to_apply=sub\n}\n";
    let out = run_n(t, 4, Mode::Replica, per_dev(4, 1));
    for o in &out {
        assert_eq!(vals::<f32>(o), vec![30. - 20. - 10. - 0.]);
    }
    let t = format!(
        "HloModule m\n{ADD}ENTRY e {{\n  a = f32[1] parameter(0)\n  b = f32[2] parameter(1)\n  ROOT r = (f32[1], f32[2]) all-reduce(a, b), replica_groups={{}}, to_apply=add\n}}\n"
    );
    let args: Vec<Vec<Literal>> =
        (0..2).map(|d| vec![arr(&[1], &[d as f32]), arr(&[2], &[1.0f32, d as f32])]).collect();
    let out = run_n(&t, 2, Mode::Replica, args);
    assert_eq!(tuple_vals::<f32>(&out[1], 0), vec![1.]);
    assert_eq!(tuple_vals::<f32>(&out[1], 1), vec![2., 1.]);
    let t = "HloModule m\nmx {\n  x = s32[] parameter(0)\n  y = s32[] parameter(1)\n  ROOT s = s32[] maximum(x, y)\n}\nENTRY e {\n  a = s32[1] parameter(0)\n  s = s32[1] all-reduce-start(a), replica_groups={}, to_apply=mx\n  ROOT r = s32[1] all-reduce-done(s)\n}\n";
    let args: Vec<Vec<Literal>> = (0..4).map(|d| vec![arr(&[1], &[[3i32, 9, -1, 4][d]])]).collect();
    assert!(run_n(t, 4, Mode::Replica, args).iter().all(|o| vals::<i32>(o) == vec![9]));
}

#[test]
fn all_gather_dims_and_async() {
    let t = "HloModule m\nENTRY e {\n  a = f32[1,2] parameter(0)\n  ROOT r = f32[1,4] all-gather(a), replica_groups={{1,0},{2,3}}, dimensions={1}\n}\n";
    let args: Vec<Vec<Literal>> = (0..4).map(|d| vec![arr(&[1, 2], &[d as f32, d as f32 + 0.5])]).collect();
    let out = run_n(t, 4, Mode::Replica, args.clone());
    assert_eq!(vals::<f32>(&out[0]), vec![1., 1.5, 0., 0.5]);
    assert_eq!(vals::<f32>(&out[3]), vec![2., 2.5, 3., 3.5]);
    let t = "HloModule m\nENTRY e {\n  a = f32[1,2] parameter(0)\n  s = (f32[1,2], f32[4,2]) all-gather-start(a), replica_groups={}, dimensions={0}\n  ROOT r = f32[4,2] all-gather-done(s)\n}\n";
    let out = run_n(t, 4, Mode::Replica, args);
    assert_eq!(vals::<f32>(&out[2]), vec![0., 0.5, 1., 1.5, 2., 2.5, 3., 3.5]);
}

#[test]
fn all_to_all_array_and_tuple_forms() {
    // Device d holds [4d, 4d+1, 4d+2, 4d+3]; chunk j goes to member j.
    let t = "HloModule m\nENTRY e {\n  a = s32[4] parameter(0)\n  ROOT r = s32[4] all-to-all(a), replica_groups={}, dimensions={0}\n}\n";
    let args: Vec<Vec<Literal>> = (0..4).map(|d| vec![arr(&[4], &[4 * d, 4 * d + 1, 4 * d + 2, 4 * d + 3])]).collect();
    let out = run_n(t, 4, Mode::Replica, args);
    assert_eq!(vals::<i32>(&out[1]), vec![1, 5, 9, 13]);
    let t = "HloModule m\nENTRY e {\n  a = s32[1] parameter(0)\n  b = s32[1] parameter(1)\n  ROOT r = (s32[1], s32[1]) all-to-all(a, b), replica_groups={{1,0}}\n}\n";
    let args: Vec<Vec<Literal>> = (0..2).map(|d| vec![arr(&[1], &[10 * d]), arr(&[1], &[10 * d + 1])]).collect();
    let out = run_n(t, 2, Mode::Replica, args);
    // Group order {1,0}: device 1 is member 0, device 0 is member 1.
    // Device 0 (member 1) receives operand 1 from member 0 (device 1) then from member 1 (itself).
    assert_eq!((tuple_vals::<i32>(&out[0], 0), tuple_vals::<i32>(&out[0], 1)), (vec![11], vec![1]));
    assert_eq!((tuple_vals::<i32>(&out[1], 0), tuple_vals::<i32>(&out[1], 1)), (vec![10], vec![0]));
}

#[test]
fn reduce_scatter_blocks() {
    let t = format!(
        "HloModule m\n{ADD}ENTRY e {{\n  a = f32[4] parameter(0)\n  ROOT r = f32[2] reduce-scatter(a), replica_groups={{{{1,0}},{{2,3}}}}, dimensions={{0}}, to_apply=add\n}}\n"
    );
    let out = run_n(&t, 4, Mode::Replica, per_dev(4, 4));
    // Group {1,0}: sum = [10,12,14,16]; member 0 = device 1 keeps block 0.
    assert_eq!(vals::<f32>(&out[1]), vec![10., 12.]);
    assert_eq!(vals::<f32>(&out[0]), vec![14., 16.]);
    assert_eq!(vals::<f32>(&out[3]), vec![54., 56.]);
}

#[test]
fn collective_permute_and_async() {
    let t = "HloModule m\nENTRY e {\n  a = f32[1] parameter(0)\n  ROOT r = f32[1] collective-permute(a), channel_id=1, source_target_pairs={{0,1},{1,2},{2,0}}\n}\n";
    let out = run_n(t, 4, Mode::Partition, per_dev(4, 1));
    assert_eq!(out.iter().map(|o| vals::<f32>(o)[0]).collect::<Vec<_>>(), vec![20., 0., 10., 0.]);
    let t = "HloModule m\nENTRY e {\n  a = f32[1] parameter(0)\n  s = (f32[1], f32[1], u32[], u32[]) collective-permute-start(a), source_target_pairs={{0,1},{1,0}}\n  ROOT r = f32[1] collective-permute-done(s)\n}\n";
    let out = run_n(t, 2, Mode::Replica, per_dev(2, 1));
    assert_eq!(out.iter().map(|o| vals::<f32>(o)[0]).collect::<Vec<_>>(), vec![10., 0.]);
}

/// Parses a valid module, then replaces the root's replica groups / pairs (the verifier
/// rejects bad ones, but the interpreter must not rely on that).
fn with_root_attrs(text: &str, f: impl FnOnce(&mut hlo::Attrs)) -> hlo::Module {
    let mut m = parse(text);
    let root = m.entry().root;
    f(&mut m.instrs[root].attrs);
    m
}

#[test]
fn bad_groups_are_errors() {
    let err = |m: &hlo::Module, n: usize| interp::run(m, &cfg(n, Mode::Replica), &per_dev(n, 2)).unwrap_err();
    let t = all_reduce("{}", "");
    let m =
        with_root_attrs(&t, |a| a.replica_groups = Some(hlo::ReplicaGroups::Explicit(vec![vec![0, 1], vec![1, 2]])));
    let e = err(&m, 3);
    assert!(
        matches!(&e, InterpError::Runtime { instr, why } if instr.contains("%r") && why.contains("replica_groups")),
        "{e}"
    );
    let m = with_root_attrs(&t, |a| a.replica_groups = Some(hlo::ReplicaGroups::Explicit(vec![vec![0, 1]])));
    assert!(err(&m, 4).to_string().contains("is in no group"));
    let m = with_root_attrs(&t, |a| a.replica_groups = Some(hlo::ReplicaGroups::Explicit(vec![vec![0, 5]])));
    assert!(err(&m, 2).to_string().contains("out of range"));
    let p = "HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  ROOT r = f32[2] collective-permute(a), source_target_pairs={{0,1}}\n}\n";
    let m = with_root_attrs(p, |a| a.source_target_pairs = Some(vec![(0, 1), (2, 1)]));
    assert!(err(&m, 3).to_string().contains("twice"));
    let m = with_root_attrs(p, |a| a.source_target_pairs = Some(vec![(0, 7)]));
    assert!(err(&m, 3).to_string().contains("out of range"));
}

#[test]
fn collectives_inside_called_computation() {
    let t = format!(
        "HloModule m\n{ADD}body {{\n  p = f32[2] parameter(0)\n  ROOT r = f32[2] all-reduce(p), channel_id=1, replica_groups={{{{0,1}}}}, use_global_device_ids=true, to_apply=add\n}}\nENTRY e {{\n  a = f32[2] parameter(0)\n  ROOT c = f32[2] call(a), to_apply=body\n}}\n"
    );
    let out = run_n(&t, 2, Mode::Partition, per_dev(2, 2));
    assert_eq!(vals::<f32>(&out[0]), vec![10., 12.]);
}
