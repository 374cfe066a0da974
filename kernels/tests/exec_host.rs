//! The host executor's runtime behaviour: repeated executions, concurrent executables,
//! a withheld rank, and recovery after a failed execution.

use std::time::{Duration, Instant};

use emitter::{DeviceMode, Flags};
use hlo::{Array, Literal};
use kernels::Error;
use kernels::exec::{Fault, HostExecutable};

const ALL_REDUCE: &str = r#"
HloModule ar, replica_count=4
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = f32[] add(x, y)
}
ENTRY main {
  p = f32[16] parameter(0)
  ar = f32[16] all-reduce(p), replica_groups={}, to_apply=add
  n = f32[16] negate(ar)
  ag = f32[64] all-gather(n), replica_groups={}, dimensions={0}
  ROOT t = (f32[16], f32[64]) tuple(ar, ag)
}
"#;

fn args_for(n: usize, salt: f32) -> Vec<Vec<Literal>> {
    (0..n)
        .map(|d| {
            let v: Vec<f32> = (0..16).map(|i| salt + (d * 16 + i) as f32).collect();
            vec![Array::from_slice(vec![16], &v).into()]
        })
        .collect()
}

fn check(out: &[Literal], n: usize, salt: f32) {
    let sum: Vec<f32> = (0..16).map(|i| (0..n).map(|d| salt + (d * 16 + i) as f32).fold(0.0, |a, x| a + x)).collect();
    let gathered: Vec<f32> = (0..n).flat_map(|_| sum.iter().map(|x| -x)).collect();
    assert_eq!(out.len(), n);
    for (d, o) in out.iter().enumerate() {
        let leaves = o.leaves();
        assert_eq!(leaves[0].to_vec::<f32>().unwrap(), sum, "device {d} all-reduce, salt {salt}");
        assert_eq!(leaves[1].to_vec::<f32>().unwrap(), gathered, "device {d} all-gather, salt {salt}");
    }
}

fn compile(text: &str, n: usize, flags: &str) -> HostExecutable {
    let m = hlo::parse_text("t.hlo", text).unwrap();
    HostExecutable::new(&m, n, DeviceMode::Replica, &Flags::parse(flags).unwrap()).unwrap()
}

#[test]
fn one_executable_runs_1000_times() {
    let exe = compile(ALL_REDUCE, 4, "");
    assert!(exe.planned().iter().all(|p| p.decision.is_kernel()));
    for i in 0..1000 {
        let salt = (i % 97) as f32;
        check(&exe.execute(&args_for(4, salt)).unwrap(), 4, salt);
    }
    let progress = exe.progress();
    assert!(progress.iter().all(|p| p.as_ref().is_some_and(|(k, _)| *k + 1 == exe.programs()[0].thunks.len())));
}

#[test]
fn two_executables_run_concurrently() {
    let kernel = compile(ALL_REDUCE, 4, "");
    let fallback = compile(ALL_REDUCE, 4, "--all_reduce_backend=fallback --all_gather_backend=fallback");
    assert!(fallback.planned().iter().all(|p| !p.decision.is_kernel()));
    std::thread::scope(|s| {
        for (t, exe) in [&kernel, &fallback].into_iter().enumerate() {
            s.spawn(move || {
                for i in 0..200 {
                    let salt = (t * 1000 + i) as f32;
                    check(&exe.execute(&args_for(4, salt)).unwrap(), 4, salt);
                }
            });
        }
        // The same executable from two threads at once is serialised, not corrupted.
        s.spawn(|| {
            for i in 0..50 {
                let salt = 5000.0 + i as f32;
                check(&kernel.execute(&args_for(4, salt)).unwrap(), 4, salt);
            }
        });
    });
}

fn withheld_rank_times_out(flags: &str) {
    let timeout_ms = 300;
    let exe = compile(ALL_REDUCE, 4, &format!("{flags} --collective_timeout_ms={timeout_ms}"));
    exe.set_fault(Some(Fault::WithholdRank { device: 2, collective: "ar".into() }));
    let start = Instant::now();
    let err = exe.execute(&args_for(4, 1.0)).unwrap_err();
    let took = start.elapsed();
    // Every waiting device gives up after its own timeout; nothing hangs.
    assert!(took < Duration::from_millis(timeout_ms * 4), "took {took:?}");
    assert!(took >= Duration::from_millis(timeout_ms), "took {took:?}");
    let Error::Device { device, ref label, ref cause, ref progress, .. } = err else { panic!("{err}") };
    assert!(err.is_timeout(), "{err}");
    // The cause is the collective's own error, kept as the source.
    assert!(matches!(**cause, Error::Timeout { ref missing, .. } if missing == &[2]), "{cause:?}");
    assert!(std::error::Error::source(&err).is_some(), "{err}");
    let message = cause.to_string();
    assert_ne!(device, 2, "{err}");
    assert_eq!(label, "all-reduce 'ar'", "{err}");
    assert!(message.contains("timed out after 300 ms") && message.contains("waiting for ranks [2]"), "{err}");
    assert!(progress.contains("d0: none"), "{err}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("device {device}: thunk #0 all-reduce 'ar' failed: ")), "{text}");
    // The same executable runs correctly again once the rank is back.
    exe.set_fault(None);
    for salt in [2.0, 3.0] {
        check(&exe.execute(&args_for(4, salt)).unwrap(), 4, salt);
    }
}

#[test]
fn withheld_rank_times_out_kernel() {
    withheld_rank_times_out("");
}

#[test]
fn withheld_rank_times_out_fallback() {
    withheld_rank_times_out("--all_reduce_backend=fallback --all_gather_backend=fallback");
}

#[test]
fn a_rank_withheld_from_a_later_collective_is_named_with_progress() {
    // Device 0 skips the all-gather after the all-reduce ran everywhere.
    let exe = compile(ALL_REDUCE, 4, "--collective_timeout_ms=200");
    exe.set_fault(Some(Fault::WithholdRank { device: 0, collective: "ag".into() }));
    let err = exe.execute(&args_for(4, 1.0)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("all-gather 'ag'") && text.contains("waiting for ranks [0]"), "{text}");
    // Progress names where each device stopped: past the all-reduce and the negate.
    assert!(text.contains("#1 compute 'n'"), "{text}");
    exe.set_fault(None);
    check(&exe.execute(&args_for(4, 7.0)).unwrap(), 4, 7.0);
}

#[test]
fn an_unsupported_op_is_a_compile_error_naming_it() {
    // Failures mid-run (a worker failing before a collective) are covered by the FailBefore
    // tests below: the root cause, not the peers' timeouts, is reported.
    for (line, want) in [
        ("e = f32[4] reduce-precision(p), exponent_bits=5, mantissa_bits=10", "unsupported op 'reduce-precision'"),
        ("w = f32[4] cholesky(p)\n  e = f32[4] negate(w)", "unsupported op 'cholesky'"),
        (r#"e = f32[4] custom-call(p), custom_call_target="Foo""#, r#"custom-call target "Foo" is not supported"#),
    ] {
        let text = format!(
            "HloModule bad, replica_count=2\nadd {{ x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT z = f32[] \
             add(x, y) }}\nlt {{ a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT c = pred[] compare(a, b), \
             direction=LT }}\nENTRY main {{\n  p = f32[4] parameter(0)\n  {line}\n  ROOT ar = f32[4] all-reduce(e), \
             replica_groups={{}}, to_apply=add\n}}\n"
        );
        let m = hlo::parse_text("t.hlo", &text).unwrap();
        let err = HostExecutable::new(&m, 2, DeviceMode::Replica, &Flags::default()).unwrap_err();
        assert!(err.to_string().contains(want), "{want}: {err}");
    }
}

#[test]
fn bad_arguments_are_errors() {
    let exe = compile(ALL_REDUCE, 4, "");
    let e = exe.execute(&args_for(3, 0.0)).unwrap_err();
    assert!(e.to_string().contains("3 devices' argument lists for 4 devices"), "{e}");
    let mut a = args_for(4, 0.0);
    a[1][0] = Array::from_slice(vec![15], &[0f32; 15]).into();
    let e = exe.execute(&a).unwrap_err();
    assert!(e.to_string().contains("parameter 0 on device 1: expected f32[16], got f32[15]"), "{e}");
    // Bad arguments do not poison anything.
    check(&exe.execute(&args_for(4, 1.0)).unwrap(), 4, 1.0);
}

/// Modules the conformance cases do not cover, checked against the interpreter.
#[test]
fn matches_the_interpreter_on_async_copies_tuples_and_calls() {
    let text = r#"
HloModule misc, replica_count=4
add {
  x = s32[] parameter(0)
  y = s32[] parameter(1)
  ROOT z = s32[] add(x, y)
}
who {
  v = s32[3] parameter(0)
  r = u32[] replica-id()
  c = s32[] convert(r)
  b = s32[3] broadcast(c), dimensions={}
  s = s32[3] add(v, b)
  ROOT t = (s32[3], u32[]) tuple(s, r)
}
ENTRY main {
  p = (s32[3], f32[2,2]) parameter(0)
  a = s32[3] get-tuple-element(p), index=0
  f = f32[2,2] get-tuple-element(p), index=1
  cs = (f32[2,2], f32[2,2], u32[]) copy-start(f)
  w = (s32[3], u32[]) call(a), to_apply=who
  ws = s32[3] get-tuple-element(w), index=0
  ars = s32[3] all-reduce-start(ws), replica_groups={{0,1},{2,3}}, to_apply=add
  cd = f32[2,2] copy-done(cs)
  ard = s32[3] all-reduce-done(ars)
  ps = (s32[3], s32[3], u32[], u32[]) collective-permute-start(ard), source_target_pairs={{0,1},{1,2},{2,3}}
  pd = s32[3] collective-permute-done(ps)
  bc = f32[4] reshape(cd)
  ROOT t = (s32[3], f32[4], (s32[3], s32[3], u32[], u32[]), (s32[3], u32[]), (f32[2,2], f32[2,2], u32[])) tuple(pd, bc, ps, w, cs)
}
"#;
    let m = hlo::parse_text("misc.hlo", text).unwrap();
    let args: Vec<Vec<Literal>> = (0..4i32)
        .map(|d| {
            let a = Array::from_slice(vec![3], &[d, 10 * d, -7]);
            let f = Array::from_slice(vec![2, 2], &[d as f32, 1.5, -2.0, 0.25]);
            vec![Literal::Tuple(vec![a.into(), f.into()])]
        })
        .collect();
    let want = interp::run(&m, &interp::RunConfig { num_devices: 4, mode: interp::Mode::Replica }, &args).unwrap();
    for flags in ["", "--all_reduce_backend=fallback --collective_permute_backend=fallback"] {
        let exe = HostExecutable::new(&m, 4, DeviceMode::Replica, &Flags::parse(flags).unwrap()).unwrap();
        for _ in 0..3 {
            assert_eq!(exe.execute(&args).unwrap(), want, "flags '{flags}'\n{}", exe.programs()[0]);
        }
    }
}

fn failing_worker_is_the_root_cause(flags: &str) {
    // Device 1 errors just before the all-reduce; devices 0, 2 and 3 wait for it and time
    // out. The reported error is device 1's own, not a peer's timeout.
    let timeout_ms = 200;
    let exe = compile(ALL_REDUCE, 4, &format!("{flags} --collective_timeout_ms={timeout_ms}"));
    for round in 0..3 {
        exe.set_fault(Some(Fault::FailBefore { device: 1, collective: "ar".into() }));
        let start = Instant::now();
        let err = exe.execute(&args_for(4, 1.0)).unwrap_err();
        assert!(start.elapsed() < Duration::from_millis(timeout_ms * 4), "took {:?}", start.elapsed());
        let Error::Device { device: 1, ref label, .. } = err else { panic!("round {round}: {err}") };
        assert!(!err.is_timeout(), "round {round}: the root cause, not a peer's timeout: {err}");
        assert_eq!(label, "all-reduce 'ar'", "{err}");
        let text = err.to_string();
        assert!(text.contains("injected fault: device 1 failed before collective 'ar'"), "{text}");
        assert!(text.contains("d1: none"), "{text}");
        // Same executable, fault cleared: correct results again, several times over (the
        // failed run left epochs out of step; the next execute starts from fresh arenas).
        exe.set_fault(None);
        for salt in [10.0, 11.0, 12.0] {
            let salt = salt + round as f32;
            check(&exe.execute(&args_for(4, salt)).unwrap(), 4, salt);
        }
    }
    // A fault on a later collective, after the all-reduce succeeded everywhere.
    exe.set_fault(Some(Fault::FailBefore { device: 3, collective: "ag".into() }));
    let err = exe.execute(&args_for(4, 2.0)).unwrap_err();
    assert!(err.to_string().contains("device 3 failed before collective 'ag'"), "{err}");
    exe.set_fault(None);
    check(&exe.execute(&args_for(4, 2.0)).unwrap(), 4, 2.0);
}

#[test]
fn a_worker_failing_before_a_collective_is_reported_and_recovered_kernel() {
    failing_worker_is_the_root_cause("");
}

#[test]
fn a_worker_failing_before_a_collective_is_reported_and_recovered_fallback() {
    failing_worker_is_the_root_cause("--all_reduce_backend=fallback --all_gather_backend=fallback");
}

#[test]
fn an_arena_larger_than_host_memory_is_an_error_at_load_time() {
    // Just under 2^38 f32 elements: a ~1 TiB result buffer per device (the emitter's own cap
    // on one arena is 1 TiB), on 8 devices: ~8 TiB, beyond any host's memory. The module is
    // valid; creating the executable (which allocates the arenas) must refuse it with a
    // clear error instead of running out of memory while zeroing them.
    let text = r#"
HloModule huge, replica_count=8
ENTRY main {
  c = f32[] constant(1)
  ROOT b = f32[274876858368] broadcast(c), dimensions={}
}
"#;
    let m = hlo::parse_text("huge.hlo", text).unwrap();
    let err = HostExecutable::new(&m, 8, DeviceMode::Replica, &Flags::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("arena on each of 8 devices, more than the"), "{msg}");
    assert!(msg.contains("bytes of host memory"), "{msg}");
}
