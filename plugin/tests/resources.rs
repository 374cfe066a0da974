//! Resources through the function table: 1000 rounds of client create → compile → upload →
//! execute → read back → destroy everything keep resident memory flat, and leak no file
//! descriptors and no threads. One test in this binary, so nothing else runs beside it.

mod support;

use hlo::Array;
use support::*;

fn round(proto: &[u8], salt: f32) {
    let c = create_client(2);
    let devs = devices(c);
    let l = compile(c, proto, &replicas_options(2));
    let x: Vec<Array> = (0..2).map(|d| Array::from_slice(vec![3], &[salt, salt + 1.0, d as f32])).collect();
    let args: Vec<Vec<Buffer>> = (0..2).map(|d| vec![upload(c, devs[d], &x[d])]).collect();
    let outs = execute(l, &args);
    // collective_permute_start_done: output 0 of device 0 is device 1's x, and vice versa.
    for d in 0..2 {
        assert_eq!(to_host(outs[d][0]), x[1 - d].data, "round {salt}, device {d}");
    }
    outs.into_iter().flatten().chain(args.into_iter().flatten()).for_each(destroy_buffer);
    destroy_loaded(l);
    destroy_client(c);
}

#[test]
fn a_thousand_compile_execute_destroy_rounds_keep_memory_fds_and_threads_flat() {
    let proto = std::fs::read(goldens().join("collective_permute_start_done.pb")).expect("golden");
    // Warm up: allocator pools, lazily initialised statics, the peer table cache.
    for i in 0..100 {
        round(&proto, i as f32);
    }
    let before = usage();
    let started = std::time::Instant::now();
    let mut peak = before.rss_bytes;
    for i in 0..1000 {
        round(&proto, 1000.0 + i as f32);
        if i % 50 == 0 {
            peak = peak.max(usage().rss_bytes);
        }
    }
    let took = started.elapsed();
    // A worker that was just joined may still be leaving the kernel's thread list for a few
    // milliseconds: give exiting threads a moment before counting (a leak never goes away).
    let mut after = usage();
    for _ in 0..100 {
        if after.threads <= before.threads {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        after = usage();
    }
    eprintln!(
        "1000 rounds in {took:?}: RSS {} KiB -> {} KiB (peak {} KiB), fds {} -> {}, threads {} -> {}",
        before.rss_bytes / 1024,
        after.rss_bytes / 1024,
        peak / 1024,
        before.fds,
        after.fds,
        before.threads,
        after.threads
    );
    // A leak of one arena (two devices' worth) or one module per round would be megabytes.
    let growth = after.rss_bytes.saturating_sub(before.rss_bytes);
    assert!(growth < 8 << 20, "resident memory grew by {} KiB over 1000 rounds", growth / 1024);
    assert_eq!(after.fds, before.fds, "file descriptors leaked");
    // Fewer is fine: a thread alive at the first count (a worker still exiting) may be gone.
    assert!(after.threads <= before.threads, "threads leaked: {} -> {}", before.threads, after.threads);
}
