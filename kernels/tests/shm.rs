//! `kernels::host::shm`: the host protocols between the processes of one host, over shared
//! memory. The tests that look inside a segment are in tests/unit/shm.rs.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use hlo::ArrayShape;
use hlo::PrimitiveType as T;
use hlo::analysis::ReductionKind as R;
use rustix::fs::Mode;
use thunks::{CollectiveConfig, CollectiveKind as Kind, KernelAlgorithm as Algo};

use kernels::host::direct::{DirectCollective, DirectSlot};
use kernels::host::shm::*;
use kernels::{Error, Result};

#[path = "common/shm.rs"]
mod common;
use common::*;

/// A staging slot of the collective's own (what the runtime gives a call without a shared slot).
fn own_slot(groups: &[Vec<usize>], bytes: usize) -> kernels::Result<std::sync::Arc<DirectSlot>> {
    DirectSlot::new(groups, bytes).map(std::sync::Arc::new)
}

fn key(job: &str) -> ShmKey {
    ShmKey { job: job.to_string(), instance: next_instance() }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Operand `j` of device `d` at call `c`: f32 of mixed magnitudes (so that the fold
/// order shows in the bits) or arbitrary s32.
fn operand(shape: &ArrayShape, c: usize, d: usize, j: usize) -> Vec<u8> {
    let n: i64 = shape.dims.iter().product();
    (0..n as u64)
        .flat_map(|i| {
            let x = splitmix((c as u64) << 48 ^ (d as u64) << 32 ^ (j as u64) << 24 ^ i);
            match shape.ty {
                T::F32 => {
                    let m = (x % 20001) as f32 - 10000.0;
                    (m * 2f32.powi(((x >> 32) % 40) as i32 - 20)).to_le_bytes()
                }
                _ => (x as i32).to_le_bytes(),
            }
        })
        .collect()
}

/// The devices that call a collective of `cfg` on `n` devices.
fn callers(cfg: &CollectiveConfig, n: usize) -> Vec<usize> {
    if cfg.op.kind == Kind::CollectivePermute {
        (0..n).collect()
    } else {
        let mut d: Vec<usize> = cfg.groups.iter().flatten().copied().collect();
        d.sort_unstable();
        d
    }
}

/// Device → its results of every call, in call order.
type Results = BTreeMap<usize, Vec<Vec<Vec<u8>>>>;

/// Calls `calls` (each call's index picks its inputs) of one device through `run`.
fn calls(
    device: usize,
    shapes: &[ArrayShape],
    out_lens: &[usize],
    calls: std::ops::Range<usize>,
    run: impl Fn(usize, &[&[u8]], &mut [&mut [u8]]) -> Result<()>,
) -> Vec<Vec<Vec<u8>>> {
    calls
        .map(|c| {
            let ins: Vec<Vec<u8>> = shapes.iter().enumerate().map(|(j, s)| operand(s, c, device, j)).collect();
            let mut outs: Vec<Vec<u8>> = out_lens.iter().map(|&l| vec![0xAA; l]).collect();
            let i: Vec<&[u8]> = ins.iter().map(Vec::as_slice).collect();
            let mut o: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
            run(device, &i, &mut o).unwrap_or_else(|e| panic!("device {device}, call {c}: {e}"));
            outs
        })
        .collect()
}

fn run_direct(
    cfg: &CollectiveConfig,
    algo: Algo,
    shapes: &[ArrayShape],
    n: usize,
    k: std::ops::Range<usize>,
) -> Results {
    let c =
        DirectCollective::on_slot(&call_of(cfg, algo, Duration::from_secs(20), "direct"), shapes, n, own_slot).unwrap();
    let lens = c.output_lens();
    thread::scope(|s| {
        let hs: Vec<_> = (callers(cfg, n).into_iter())
            .map(|d| {
                let (lens, k, c) = (&lens, &k, &c);
                (d, s.spawn(move || calls(d, shapes, lens, k.clone(), |d, i, o| c.run(d, i, o))))
            })
            .collect();
        hs.into_iter().map(|(d, h)| (d, h.join().unwrap())).collect()
    })
}

/// Every process a thread with its own [`ShmCollective`] (its own mapping), whose
/// device threads call it.
fn run_shm(
    cfg: &CollectiveConfig,
    algo: Algo,
    shapes: &[ArrayShape],
    n: usize,
    k: std::ops::Range<usize>,
    process_of: &[usize],
    key: &ShmKey,
) -> Results {
    let procs = process_of.iter().max().map_or(0, |p| p + 1);
    let devices = callers(cfg, n);
    thread::scope(|s| {
        let hs: Vec<_> = (0..procs)
            .map(|p| {
                let (devices, k) = (&devices, &k);
                s.spawn(move || {
                    let c = ShmCollective::on_slot(
                        &call_of(cfg, algo, Duration::from_secs(20), "shm"),
                        shapes,
                        n,
                        key,
                        None,
                        process_of,
                        p,
                    )
                    .unwrap();
                    let lens = c.output_lens();
                    thread::scope(|s| {
                        let hs: Vec<_> = (devices.iter().filter(|&&d| process_of[d] == p))
                            .map(|&d| {
                                let (lens, c) = (&lens, &c);
                                (d, s.spawn(move || calls(d, shapes, lens, k.clone(), |d, i, o| c.run(d, i, o))))
                            })
                            .collect();
                        hs.into_iter().map(|(d, h)| (d, h.join().unwrap())).collect::<Vec<_>>()
                    })
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// ShmCollective over processes `process_of` gives DirectCollective's bits, call after call.
fn check(cfg: &CollectiveConfig, algo: Algo, shapes: &[ArrayShape], n: usize, process_of: &[usize]) {
    let job = job();
    let want = run_direct(cfg, algo, shapes, n, 0..3);
    let got = run_shm(cfg, algo, shapes, n, 0..3, process_of, &key(&job));
    assert!(got == want, "{algo:?} {:?} {:?} over processes {process_of:?}", cfg.groups, cfg.source_target_pairs);
    assert_eq!(leftovers(&job), Vec::<String>::new());
}

fn groupings() -> Vec<Vec<Vec<usize>>> {
    vec![vec![(0..8).collect()], vec![(0..4).collect(), (4..8).collect()], vec![vec![0, 5, 2, 7], vec![4, 1, 6, 3]]]
}

/// Two processes of four devices, four of two, three uneven ones, eight of one.
fn process_maps() -> Vec<Vec<usize>> {
    vec![vec![0, 0, 0, 0, 1, 1, 1, 1], vec![0, 1, 2, 3, 0, 1, 2, 3], vec![0, 0, 0, 1, 1, 2, 2, 2], (0..8).collect()]
}

fn sh(ty: T, dims: &[i64]) -> ArrayShape {
    ArrayShape::new(ty, dims.to_vec())
}

#[test]
fn all_reduce_matches_direct_bitwise() {
    for algo in [Algo::OneShotAllReduce, Algo::TwoShotAllReduce] {
        for groups in groupings() {
            for procs in process_maps() {
                let shapes = [sh(T::F32, &[2, 5]), sh(T::S32, &[3])];
                check(&config(Kind::AllReduce, groups.clone(), None, 2, R::Sum), algo, &shapes, 8, &procs);
            }
            let shapes = [sh(T::F32, &[13])];
            let procs = &process_maps()[2];
            check(&config(Kind::AllReduce, groups.clone(), None, 1, R::Max), algo, &shapes, 8, procs);
        }
    }
}

#[test]
fn gather_scatter_and_all_to_all_match_direct_bitwise() {
    for groups in groupings() {
        let g = groups[0].len() as i64;
        for procs in &process_maps()[..3] {
            let ag = |dim, n_ops| config(Kind::AllGather, groups.clone(), Some(dim), n_ops, R::Sum);
            let shapes = [sh(T::F32, &[2, 3]), sh(T::S32, &[2, 1])];
            check(&ag(1, 2), Algo::DirectAllGather, &shapes, 8, procs);
            check(&ag(0, 1), Algo::DirectAllGather, &[sh(T::F32, &[3])], 8, procs);

            let rs = |dim, n_ops| config(Kind::ReduceScatter, groups.clone(), Some(dim), n_ops, R::Sum);
            let shapes = [sh(T::F32, &[g, 3]), sh(T::S32, &[2 * g])];
            check(&rs(0, 2), Algo::DirectReduceScatter, &shapes, 8, procs);
            check(&rs(1, 1), Algo::DirectReduceScatter, &[sh(T::F32, &[2, 2 * g])], 8, procs);

            let a2a = |dim, n_ops| config(Kind::AllToAll, groups.clone(), dim, n_ops, R::Sum);
            check(&a2a(Some(0), 1), Algo::DirectAllToAll, &[sh(T::F32, &[g, 2])], 8, procs);
            check(&a2a(Some(1), 1), Algo::DirectAllToAll, &[sh(T::S32, &[3, g])], 8, procs);
            let tuple = vec![sh(T::F32, &[3]); g as usize];
            check(&a2a(None, g as usize), Algo::DirectAllToAll, &tuple, 8, procs);
        }
    }
}

#[test]
fn permute_matches_direct_bitwise() {
    let ring: Vec<(usize, usize)> = (0..8).map(|d| (d, (d + 1) % 8)).collect();
    let partial = vec![(0, 5), (5, 2), (6, 6), (3, 1), (7, 4)];
    for pairs in [ring, partial] {
        for procs in process_maps() {
            let shapes = [sh(T::F32, &[5]), sh(T::S32, &[2, 2])];
            check(&permute_config(pairs.clone(), 2), Algo::DirectPermute, &shapes, 8, &procs);
        }
    }
}

fn timeout_of(e: &Error) -> (Vec<usize>, usize, Vec<usize>) {
    match e {
        Error::Timeout { group, waiting_rank, missing, .. } => (group.clone(), *waiting_rank, missing.clone()),
        e => panic!("not a timeout: {e}"),
    }
}

#[test]
fn a_process_that_never_attaches_times_out_naming_its_devices() {
    let job = job();
    let key = key(&job);
    let cfg = config(Kind::AllReduce, vec![vec![0, 1, 2, 3]], None, 1, R::Sum);
    let shapes = [sh(T::S32, &[4])];
    let timeout = Duration::from_millis(300);
    let c = ShmCollective::on_slot(
        &call_of(&cfg, Algo::OneShotAllReduce, timeout, "ar"),
        &shapes,
        4,
        &key,
        None,
        &[0, 0, 1, 1],
        0,
    )
    .unwrap();
    assert_eq!(leftovers(&job), vec![c.segment_name()[1..].to_string()], "named until process 1 attaches");
    let start = Instant::now();
    let errors: Vec<Error> = thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|d| {
                let (c, shapes) = (&c, &shapes);
                s.spawn(move || {
                    let x = operand(&shapes[0], 0, d, 0);
                    let mut r = vec![0u8; 16];
                    c.run(d, &[&x], &mut [&mut r]).unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let took = start.elapsed();
    assert!(took >= timeout && took < timeout + Duration::from_millis(700), "{took:?}");
    for (d, e) in errors.iter().enumerate() {
        assert_eq!(timeout_of(e), (vec![0, 1, 2, 3], d, vec![2, 3]), "{e}");
        assert!(e.to_string().contains("%ar timed out after 300 ms"), "{e}");
    }
    assert_eq!(leftovers(&job), Vec::<String>::new(), "the timeout unlinked the segment");
}

#[test]
fn a_late_member_fails_the_broken_epoch_and_the_next_is_clean() {
    for algo in [Algo::OneShotAllReduce, Algo::TwoShotAllReduce] {
        let job = job();
        let key = key(&job);
        let cfg = config(Kind::AllReduce, vec![vec![0, 1]], None, 1, R::Sum);
        let shapes = [sh(T::S32, &[3])];
        let t = Duration::from_millis(300);
        let procs = [0, 1];
        let c0 = ShmCollective::on_slot(&call_of(&cfg, algo, t, "ar"), &shapes, 2, &key, None, &procs, 0).unwrap();
        let c1 = ShmCollective::on_slot(&call_of(&cfg, algo, t, "ar"), &shapes, 2, &key, None, &procs, 1).unwrap();
        assert_eq!(leftovers(&job), Vec::<String>::new(), "unlinked once both attached");
        let x = operand(&shapes[0], 0, 0, 0);
        let mut r = vec![0u8; 12];
        let e = c0.run(0, &[&x], &mut [&mut r]).unwrap_err();
        assert_eq!(timeout_of(&e), (vec![0, 1], 0, vec![1]), "{algo:?}: {e}");
        // The late member fails its call of the broken epoch too, without waiting.
        let start = Instant::now();
        let e = c1.run(1, &[&x], &mut [&mut r]).unwrap_err();
        assert!(start.elapsed() < Duration::from_millis(100));
        assert_eq!(timeout_of(&e), (vec![0, 1], 1, vec![1]), "{algo:?}: {e}");
        // Both then agree again, epoch after epoch.
        let lens = c0.output_lens();
        let results = thread::scope(|s| {
            let a = s.spawn(|| calls(0, &shapes, &lens, 0..4, |d, i, o| c0.run(d, i, o)));
            let b = s.spawn(|| calls(1, &shapes, &lens, 0..4, |d, i, o| c1.run(d, i, o)));
            [a.join().unwrap(), b.join().unwrap()]
        });
        for c in 0..4 {
            let sum: Vec<u8> = (0..3)
                .flat_map(|i| {
                    let v = |d| i32::from_le_bytes(operand(&shapes[0], c, d, 0)[4 * i..4 * i + 4].try_into().unwrap());
                    v(0).wrapping_add(v(1)).to_le_bytes()
                })
                .collect();
            assert!(results.iter().all(|r| r[c][0] == sum), "{algo:?} call {c}");
        }
        drop((c0, c1));
        assert_eq!(leftovers(&job), Vec::<String>::new());
    }
}

/// One member of a group of eight stalls: every other member fails that epoch with the
/// same missing device, the stalled one fails it when it comes, and the next is clean.
#[test]
fn a_stalled_member_breaks_the_epoch_for_its_whole_group() {
    let job = job();
    let key = key(&job);
    let cfg = config(Kind::AllReduce, vec![vec![3, 1, 4, 0, 5, 2, 6, 7]], None, 1, R::Sum);
    let shapes = [sh(T::F32, &[6])];
    let procs = [0, 0, 0, 0, 1, 1, 1, 1];
    let t = Duration::from_millis(400);
    let cs: Vec<ShmCollective> = (0..2)
        .map(|p| {
            ShmCollective::on_slot(&call_of(&cfg, Algo::OneShotAllReduce, t, "ar"), &shapes, 8, &key, None, &procs, p)
                .unwrap()
        })
        .collect();
    let lens = cs[0].output_lens();
    let call = |d: usize, c: usize| {
        let x = operand(&shapes[0], c, d, 0);
        let mut r = vec![0u8; lens[0]];
        cs[procs[d]].run(d, &[&x], &mut [&mut r]).map(|()| r)
    };
    thread::scope(|s| {
        let hs: Vec<_> = (0..7).map(|d| s.spawn(move || call(d, 0))).collect();
        for (d, h) in hs.into_iter().enumerate() {
            let e = h.join().unwrap().unwrap_err();
            assert_eq!(timeout_of(&e), (cfg.groups[0].clone(), d, vec![7]), "{e}");
        }
    });
    let e = call(7, 0).unwrap_err();
    assert_eq!(timeout_of(&e), (cfg.groups[0].clone(), 7, vec![7]), "{e}");
    // Calls 1 and 2 then agree with the direct protocol on the same inputs.
    let got: Results = thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|d| s.spawn(move || (d, (1..3).map(|c| vec![call(d, c).unwrap()]).collect::<Vec<_>>())))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want = run_direct(&cfg, Algo::OneShotAllReduce, &shapes, 8, 1..3);
    assert!(got == want);
    drop(cs);
    assert_eq!(leftovers(&job), Vec::<String>::new());
}

/// Process 0 is done with its group and leaves before process 2 attaches: the name
/// stays for process 2, whose peer (process 1) waits in the segment.
#[test]
fn a_process_that_is_done_leaves_the_name_to_a_slow_one() {
    let job = job();
    let key = key(&job);
    let cfg = config(Kind::AllReduce, vec![vec![0, 1], vec![2, 3]], None, 1, R::Sum);
    let shapes = [sh(T::F32, &[7])];
    let procs = [0, 1, 1, 2];
    let new = |p| {
        ShmCollective::on_slot(
            &call_of(&cfg, Algo::OneShotAllReduce, Duration::from_secs(20), "ar"),
            &shapes,
            4,
            &key,
            None,
            &procs,
            p,
        )
    };
    let c1 = new(1).unwrap();
    let lens = c1.output_lens();
    let run = |c: &ShmCollective, d: usize| calls(d, &shapes, &lens, 0..3, |d, i, o| c.run(d, i, o));
    let got: Results = thread::scope(|s| {
        let d0 = s.spawn(|| {
            let c0 = new(0).unwrap();
            run(&c0, 0)
        });
        let d1 = s.spawn(|| run(&c1, 1));
        let d2 = s.spawn(|| run(&c1, 2));
        let r0 = d0.join().unwrap();
        assert_eq!(leftovers(&job).len(), 1, "process 2 has yet to attach");
        let c2 = new(2).unwrap();
        let r3 = run(&c2, 3);
        [(0, r0), (1, d1.join().unwrap()), (2, d2.join().unwrap()), (3, r3)].into_iter().collect()
    });
    assert!(got == run_direct(&cfg, Algo::OneShotAllReduce, &shapes, 4, 0..3));
    assert_eq!(leftovers(&job), Vec::<String>::new());
    // The last process to leave unlinks a name that a participant never came for.
    let c0 = new(0).unwrap();
    assert_eq!(leftovers(&job).len(), 1);
    drop(c0);
    assert_eq!(leftovers(&job), Vec::<String>::new());
}

#[test]
fn a_permute_source_that_never_posts_times_out_its_target() {
    let job = job();
    let key = key(&job);
    let cfg = permute_config(vec![(0, 1)], 1);
    let shapes = [sh(T::S32, &[2])];
    let t = Duration::from_millis(300);
    let c1 = ShmCollective::on_slot(&call_of(&cfg, Algo::DirectPermute, t, "cp"), &shapes, 2, &key, None, &[0, 1], 1)
        .unwrap();
    let mut r = vec![0u8; 8];
    let e = c1.run(1, &[&[0u8; 8]], &mut [&mut r]).unwrap_err();
    assert_eq!(timeout_of(&e), (vec![0, 1], 1, vec![0]), "{e}");
    assert_eq!(leftovers(&job), Vec::<String>::new());
}

#[test]
fn segments_of_another_collective_are_invalid() {
    let job = job();
    let cfg = config(Kind::AllReduce, vec![vec![0, 1]], None, 1, R::Sum);
    let shapes = [sh(T::S32, &[4])];
    let t = Duration::from_millis(300);
    let new = |cfg: &CollectiveConfig, shapes: &[ArrayShape], key: &ShmKey, p: usize| {
        ShmCollective::on_slot(&call_of(cfg, Algo::OneShotAllReduce, t, "ar"), shapes, 2, key, None, &[0, 1], p)
    };
    let invalid = |r: Result<ShmCollective>, what: &str| match r {
        Err(e @ Error::Invalid { .. }) => assert!(e.to_string().contains(what), "{e}"),
        Err(e) => panic!("not invalid: {e}"),
        Ok(c) => panic!("{c:?} was accepted"),
    };
    // A segment of another size under the name.
    let k1 = key(&job);
    let name = format!("/peerless-{job}-{:016x}", k1.instance);
    let fd = rustix::shm::open(
        name.as_str(),
        rustix::shm::OFlags::CREATE | rustix::shm::OFlags::RDWR,
        Mode::RUSR | Mode::WUSR,
    )
    .unwrap();
    rustix::fs::ftruncate(&fd, 4096).unwrap();
    invalid(new(&cfg, &shapes, &k1, 0), "has 4096 bytes where this collective needs");
    invalid(new(&cfg, &shapes, &k1, 0), "belongs to another collective");
    rustix::shm::unlink(name.as_str()).unwrap();
    // Another collective of the same key: another size, then the same size.
    let k2 = key(&job);
    let c = new(&cfg, &shapes, &k2, 0).unwrap();
    invalid(new(&cfg, &[sh(T::S32, &[64])], &k2, 1), "belongs to another collective");
    let max = config(Kind::AllReduce, vec![vec![0, 1]], None, 1, R::Max);
    invalid(new(&max, &shapes, &k2, 1), "belongs to another collective (its plan fingerprint");
    drop(c);
    assert_eq!(leftovers(&job), Vec::<String>::new());
    // Job tokens.
    for bad in ["", "0123456", "0123456g", "../../tmp/x", &"a".repeat(65)] {
        invalid(new(&cfg, &shapes, &ShmKey { job: bad.to_string(), instance: 1 }, 0), "is not 8 to 64 hex digits");
    }
}

#[test]
fn exchange_gives_every_process_every_device_and_names_the_missing() {
    let job = job();
    let name = format!("/peerless-{job}-{:016x}-ipc", INSTANCE.fetch_add(1, Ordering::Relaxed));
    // Three "processes" (threads with their own mappings) own devices {0, 1}, {5}, {7}.
    let owned: Vec<Vec<usize>> = vec![vec![0, 1], vec![5], vec![7]];
    let devices = [0, 1, 5, 7];
    let slot = |d: usize| (0..100u8).map(|i| i ^ d as u8).collect::<Vec<u8>>();
    let got: Vec<_> = thread::scope(|s| {
        let hs: Vec<_> = owned
            .iter()
            .map(|mine| {
                let name = &name;
                s.spawn(move || {
                    let posts: Vec<(usize, Vec<u8>)> = mine.iter().map(|&d| (d, slot(d))).collect();
                    exchange(name, &devices, 3, &posts, 100, Duration::from_secs(20))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for g in got {
        let g = g.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(g, devices.iter().map(|&d| (d, slot(d))).collect::<Vec<_>>());
    }
    assert!(leftovers(&job).is_empty(), "{:?}", leftovers(&job));
    // A process that never comes: the others time out naming its devices, and the name goes.
    let name = format!("/peerless-{job}-{:016x}-ipc", INSTANCE.fetch_add(1, Ordering::Relaxed));
    let e = exchange(&name, &devices, 2, &[(0, slot(0)), (1, slot(1))], 100, Duration::from_millis(300));
    match e {
        Err(Error::ExchangeMissing { devices }) => assert_eq!(devices, [5, 7]),
        other => panic!("{other:?}"),
    }
    assert!(leftovers(&job).is_empty(), "{:?}", leftovers(&job));
}
