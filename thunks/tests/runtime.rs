//! `thunks::runtime`: what the FFI handlers take from the process they run in.

use thunks::custom_call::CustomCallConfig;
use thunks::runtime::*;
use thunks::{CollectiveKind, KernelAlgorithm};

fn call(instance: u64, decisions: &str) -> CustomCallConfig {
    CustomCallConfig {
        groups: vec![vec![0, 1]],
        dimension: Some(0),
        num_devices: 2,
        instance,
        timeout_ms: 1,
        processes: vec![0, 1],
        decisions: decisions.into(),
        ..CustomCallConfig::new(CollectiveKind::AllGather, KernelAlgorithm::DirectAllGather, "ag")
    }
}

#[test]
fn jobs_are_validated() {
    assert!(set_job(Some("xyz")).unwrap_err().contains("hex"));
    set_job(Some("0123abcd")).unwrap();
    assert_eq!(job_for(&call(1, "")).unwrap(), "0123abcd");
    set_job(None).unwrap();
    assert!(job_for(&call(1, "")).unwrap_err().contains("knows no job token"));
    assert!(valid_job("0123abcd") && !valid_job("0123abc") && !valid_job(&"a".repeat(65)));
}

#[test]
fn occurrences_count_per_instance_and_keys_differ() {
    let i = 0x5eed_0001;
    assert_eq!(next_occurrence(i), 0);
    assert_eq!(next_occurrence(i + 1), 0);
    assert_eq!(next_occurrence(i), 1);
    assert_eq!(shared_key(i, 0), i);
    assert_ne!(shared_key(i, 1), i);
    assert_ne!(shared_key(i, 1), shared_key(i, 2));
    assert!(shared_key(i, 1) <= i64::MAX as u64);
}

#[test]
fn decisions_register_once_unless_the_pass_reported_them() {
    let line = "all-gather\tag\tf32\t8\t{{0,1}}\t1\tkernel (direct all-gather)\twhy";
    let fallback = "all-reduce\tar\tf32\t8\t{{0}}\t0\tfallback\tgroups of one";
    // Reported by this process's pass: its instantiation adds nothing, a second one (an
    // executable loaded from a cache) does.
    reported([0x5eed_0100]);
    assert!(!instantiated("cpu", &call(0x5eed_0100, line)));
    assert!(instantiated("cpu", &call(0x5eed_0100, &format!("{line}\n{fallback}\n"))));
    let got = take_decisions();
    assert!(got.contains(&format!("cpu\t{line}\ncpu\t{fallback}\n")), "{got}");
    assert!(!take_decisions().contains(line));
}
