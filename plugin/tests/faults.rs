//! Collective faults and Execute's outputs through the function table (issue 5, item 3): an
//! execution in which one device fails before a collective (`PEERLESS_TEST_FAULT=fail:<d>`)
//! or never arrives at it (`withhold:<d>`) fails for every device at once. Execution is
//! synchronous, so the error is `PJRT_LoadedExecutable_Execute`'s own (a JAX exception at the
//! call) and, as the PJRT header requires when Execute returns an error, no device's output
//! list or completion event is written: no device gets a success event or a buffer for a
//! failed execution, and nothing is left for the caller to leak. A null `output_lists[d]` is
//! refused before anything runs, with nothing written for the other devices. On success every
//! device's event is ready and carries no error, and the same client keeps running new
//! executables correctly after faults.
//!
//! One test in this binary: it sets `PEERLESS_TEST_FAULT` (read at compile time) while no
//! other thread runs.

mod support;

use plugin::pjrt_sys::*;
use support::*;

const N: usize = 4;
const CASE: &str = "all_reduce_sum";

/// Compiles the case with `PEERLESS_TEST_FAULT=spec` set for the compile only.
fn compile_with_fault(c: Client, proto: &[u8], spec: &str) -> Loaded {
    // SAFETY: this binary's only test runs on one thread and no plugin thread is alive
    // between executions (the host backend's workers are scoped to Execute).
    unsafe { std::env::set_var("PEERLESS_TEST_FAULT", spec) };
    let l = compile(c, proto, &replicas_options(N as u8));
    // SAFETY: as above.
    unsafe { std::env::remove_var("PEERLESS_TEST_FAULT") };
    l
}

/// A failed execution: its message contains every one of `needles`, and no device's outputs
/// or event was written.
fn expect_failure(l: Loaded, args: &[Vec<Buffer>], needles: &[&str]) {
    let out = execute_raw(l, args, None);
    let m = out.error.as_deref().unwrap_or_else(|| panic!("expected {needles:?}, the execution succeeded"));
    for n in needles {
        assert!(m.contains(n), "expected {n:?} in: {m}");
    }
    assert!(out.nothing_written(), "a failed Execute wrote outputs or events: {m}");
}

/// A successful execution: every device's event is ready without an error, every output
/// matches XLA's; everything is destroyed.
fn expect_success(l: Loaded, args: &[Vec<Buffer>], case: &Case) {
    let out = execute_raw(l, args, None);
    assert_eq!(out.error, None);
    for (d, &ev) in out.events.iter().enumerate() {
        assert!(!ev.is_null(), "device {d}: no completion event");
        let mut r = PJRT_Event_IsReady_Args::new();
        r.event = ev;
        let mut e = PJRT_Event_Error_Args::new();
        e.event = ev;
        let mut del = PJRT_Event_Destroy_Args::new();
        del.event = ev;
        // SAFETY: an event the plugin just returned, destroyed once after the queries.
        unsafe {
            ok((api().PJRT_Event_IsReady.unwrap())(&mut r), "Event_IsReady");
            assert!(r.is_ready, "device {d}: event not ready after a synchronous Execute");
            assert_eq!(error_message((api().PJRT_Event_Error.unwrap())(&mut e)), None, "device {d}: event error");
            ok((api().PJRT_Event_Destroy.unwrap())(&mut del), "Event_Destroy");
        }
    }
    for (d, (row, want)) in out.outs.iter().zip(&case.outputs).enumerate() {
        assert_eq!(row.len(), want.len(), "device {d}: output count");
        for (o, (&b, w)) in row.iter().zip(want).enumerate() {
            assert!(!b.is_null(), "device {d}: output {o} not written");
            assert!(close_to(&to_host(Buffer(b as usize)), w), "device {d}: output {o} differs from XLA");
            destroy_buffer(Buffer(b as usize));
        }
    }
}

#[test]
fn faulted_executions_fail_for_every_device_and_write_no_outputs_or_events() {
    // SAFETY: nothing else runs in this process yet (see the module docs).
    unsafe {
        std::env::set_var("PEERLESS_BACKEND", "host");
        std::env::remove_var("PEERLESS_TEST_FAULT");
    }
    let case = case(CASE, N);
    let c = create_client_with_flags(N as i64, Some("--collective_timeout_ms=300"));
    let devs = devices(c);
    let args: Vec<Vec<Buffer>> =
        case.inputs.iter().enumerate().map(|(d, row)| row.iter().map(|a| upload(c, devs[d], a)).collect()).collect();
    let good = compile(c, &case.proto, &replicas_options(N as u8));
    expect_success(good, &args, &case);

    // A null output list, for the last device and for the first: refused before anything
    // runs, nothing written for the other devices (it would leak), and the executable runs
    // correctly after.
    for d in [N - 1, 0] {
        let out = execute_raw(good, &args, Some(d));
        let m = out.error.clone().expect("a null output list is an error");
        assert!(m.contains(&format!("output_lists[{d}] is null")), "{m}");
        assert!(out.nothing_written(), "outputs or events written although Execute failed: {m}");
    }
    expect_success(good, &args, &case);

    // A device failing before the first all-reduce: the first, a middle and the last device.
    for d in [0, 2, N - 1] {
        let l = compile_with_fault(c, &case.proto, &format!("fail:{d}"));
        for _ in 0..2 {
            expect_failure(l, &args, &[&format!("injected fault: device {d} failed before collective")]);
        }
        destroy_loaded(l);
        expect_success(good, &args, &case);
    }

    // A withheld rank: its peers time out, the error names it; every device fails at once.
    let l = compile_with_fault(c, &case.proto, "withhold:1");
    let started = std::time::Instant::now();
    expect_failure(l, &args, &["timed out after 300 ms", "waiting for ranks [1]"]);
    assert!(started.elapsed().as_secs() < 10, "a withheld rank took {:?}", started.elapsed());
    destroy_loaded(l);

    // The same client compiles and runs a new executable correctly after all of that.
    let fresh = compile(c, &case.proto, &replicas_options(N as u8));
    expect_success(fresh, &args, &case);
    expect_success(good, &args, &case);
    destroy_loaded(fresh);
    destroy_loaded(good);
    args.into_iter().flatten().for_each(destroy_buffer);
    destroy_client(c);
}
