//! Unit tests of `kernels::host::shm` that look inside a segment (included by path from
//! src/host/shm.rs); the rest are in kernels/tests/shm.rs.

use std::thread;

use hlo::PrimitiveType as T;
use hlo::analysis::ReductionKind as R;

use super::*;
use thunks::KernelAlgorithm as Algo;

#[path = "../common/shm.rs"]
mod common;
use common::*;

fn key(job: &str) -> ShmKey {
    ShmKey { job: job.to_string(), instance: next_instance() }
}

/// Collectives of one slot (issue 25) meet in one segment, mapped once per process, sized
/// by the slot: an all-reduce and an all-gather alternate on it, across 2 processes (here
/// simulated in one, which maps the slot once for both).
#[test]
fn chained_collectives_share_one_segment() {
    let job = job();
    let key = key(&job);
    let procs = [0, 0, 1, 1];
    let t = Duration::from_secs(20);
    let ar_cfg = config(Kind::AllReduce, vec![vec![0, 1, 2, 3]], None, 1, R::Sum);
    let ag_cfg = config(Kind::AllGather, vec![vec![0, 1, 2, 3]], Some(0), 1, R::Sum);
    let (ar_shape, ag_shape) = ([sh(T::S32, &[6])], [sh(T::S32, &[2])]);
    let build = |p: usize| {
        let ar = ShmCollective::on_slot(
            &call_of(&ar_cfg, Algo::TwoShotAllReduce, t, "ar"),
            &ar_shape,
            4,
            &key,
            Some(256),
            &procs,
            p,
        )
        .unwrap();
        let ag = ShmCollective::on_slot(
            &call_of(&ag_cfg, Algo::DirectAllGather, t, "ag"),
            &ag_shape,
            4,
            &key,
            Some(256),
            &procs,
            p,
        )
        .unwrap();
        (ar, ag)
    };
    let per_process = [build(0), build(1)];
    assert_eq!(per_process[0].0.segment_name(), per_process[1].1.segment_name());
    assert!(std::sync::Arc::ptr_eq(&per_process[0].0.slot, &per_process[0].1.slot));
    assert_eq!(per_process[0].0.slot.layout.per_buffer, 256);
    let outs: Vec<(Vec<u8>, Vec<u8>)> = thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|d| {
                let (ar, ag) = &per_process[procs[d]];
                s.spawn(move || {
                    let (mut r, mut g) = (vec![0u8; 24], vec![0u8; 32]);
                    for k in 0..30i32 {
                        let x: Vec<u8> = (0..6).flat_map(|i| (i + 10 * d as i32 + k).to_le_bytes()).collect();
                        ar.run(d, &[&x], &mut [&mut r]).unwrap();
                        ag.run(d, &[&r[..8]], &mut [&mut g]).unwrap();
                    }
                    (r, g)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want_r: Vec<u8> = (0..6).flat_map(|i: i32| (4 * (i + 29) + 60).to_le_bytes()).collect();
    let want_g: Vec<u8> = (0..4).flat_map(|_| want_r[..8].to_vec()).collect();
    for (r, g) in outs {
        assert_eq!((r, g), (want_r.clone(), want_g.clone()));
    }
}

/// A process that opens the name of a segment its last process just closed (and is
/// about to unlink) waits for the name to go and starts a fresh segment.
#[test]
fn a_closed_segment_is_not_joined() {
    let job = job();
    let key = key(&job);
    let cfg = config(Kind::AllReduce, vec![vec![0, 1]], None, 1, R::Sum);
    let shapes = [sh(T::S32, &[2])];
    let t = Duration::from_millis(1000);
    let new =
        |p| ShmCollective::on_slot(&call_of(&cfg, Algo::OneShotAllReduce, t, "ar"), &shapes, 2, &key, None, &[0, 1], p);
    let mut c0 = new(0).unwrap();
    let seg = std::sync::Arc::get_mut(&mut c0.slot).unwrap().segment.as_mut().unwrap();
    // As process 0's `leave` would: count it out and close, but keep the name a while.
    seg.region.word(H_ATTACHED).fetch_add(CLOSED - LIVE, Ordering::AcqRel);
    seg.attached = false;
    let unlinker = thread::spawn({
        let name = seg.name.clone();
        move || {
            thread::sleep(Duration::from_millis(100));
            unlink(&name);
        }
    });
    let start = Instant::now();
    let c1 = new(1).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(90), "{:?}", start.elapsed());
    unlinker.join().unwrap();
    let fresh = c1.slot.segment.as_ref().unwrap().region.word(H_ATTACHED).load(Ordering::Acquire);
    assert_eq!(fresh, ATTACHED + LIVE, "process 1 alone in a fresh segment");
    drop(c0);
    assert_eq!(leftovers(&job).len(), 1, "process 1 waits for process 0 to come again");
    drop(c1);
    assert_eq!(leftovers(&job), Vec::<String>::new());
}

#[test]
fn calls_are_checked_and_processes_without_members_map_nothing() {
    let job = job();
    let key = key(&job);
    let cfg = config(Kind::AllReduce, vec![vec![0, 1]], None, 1, R::Sum);
    let shapes = [sh(T::S32, &[2])];
    let t = Duration::from_millis(300);
    let procs = [0, 1, 2];
    let c = ShmCollective::on_slot(&call_of(&cfg, Algo::OneShotAllReduce, t, "ar"), &shapes, 3, &key, None, &procs, 0)
        .unwrap();
    assert_eq!(c.segment_name(), format!("/peerless-{job}-{:016x}", key.instance));
    let x = [0u8; 8];
    let mut r = [0u8; 8];
    let e = c.run(1, &[&x], &mut [&mut r]).unwrap_err();
    assert!(e.to_string().contains("device 1 belongs to process 1"), "{e}");
    let e = c.run(2, &[&x], &mut [&mut r]).unwrap_err();
    assert!(e.to_string().contains("device 2 is in no group"), "{e}");
    // Process 2 owns no member: it maps nothing and leaves the count alone.
    let c2 = ShmCollective::on_slot(&call_of(&cfg, Algo::OneShotAllReduce, t, "ar"), &shapes, 3, &key, None, &procs, 2)
        .unwrap();
    assert!(c2.slot.segment.is_none());
    assert_eq!(leftovers(&job).len(), 1);
    let c1 = ShmCollective::on_slot(&call_of(&cfg, Algo::OneShotAllReduce, t, "ar"), &shapes, 3, &key, None, &procs, 1)
        .unwrap();
    assert_eq!(leftovers(&job), Vec::<String>::new());
    // A permute device without peers never needs the segment.
    let cp = ShmCollective::on_slot(
        &call_of(&permute_config(vec![(1, 1)], 1), Algo::DirectPermute, t, "cp"),
        &shapes,
        3,
        &key,
        None,
        &procs,
        0,
    )
    .unwrap();
    assert!(cp.slot.segment.is_none());
    cp.run(0, &[&[7u8; 8]], &mut [&mut r]).unwrap();
    assert_eq!(r, [0u8; 8]);
    drop((c, c1, c2));
    assert_eq!(leftovers(&job), Vec::<String>::new());
}
