//! Host backend collectives: every algorithm against a straightforward reference, on 1, 2,
//! 3, 4 and 8 devices, subgroups, odd sizes and offsets, every dtype, repeated calls,
//! concurrent clusters, and the watchdog.

mod host_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hlo::PrimitiveType as T;
use hlo::analysis::ReductionKind as K;
use host_support::*;
use kernels::Error;
use kernels::host::{HostCluster, Region};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use thunks::{CollectiveKind as C, Implementation, KernelAlgorithm};

const SIZES: [usize; 5] = [1, 2, 3, 4, 8];

fn full(n: usize) -> Vec<Vec<usize>> {
    vec![(0..n).collect()]
}

/// Every implementation of a kind: its kernel(s) and the fallback.
fn impls(kind: C) -> Vec<Implementation> {
    let mut v = vec![kernel(kind, false), Implementation::Fallback];
    if kind == C::AllReduce {
        v.push(kernel(kind, true));
    }
    v
}

#[test]
fn all_reduce_every_size_and_algorithm() {
    for n in SIZES {
        for imp in impls(C::AllReduce) {
            // 0 elements, 1, odd counts (not multiples of 16 bytes nor of n), and larger
            // than one copy chunk.
            for elems in [0, 1, 3, 7, 37, 1500] {
                for (ty, r) in [(T::F32, K::Sum), (T::Bf16, K::Sum), (T::S32, K::Max), (T::U8, K::Prod)] {
                    let case = Case::new(C::AllReduce, imp, full(n), ty, &[elems]).reduction(r);
                    check_case(&case, n, elems as usize % 5, elems as u64);
                }
            }
        }
    }
}

#[test]
fn all_reduce_results_are_bitwise_identical_across_ranks() {
    // Random f32 bit patterns (NaNs, infinities, denormals) summed by 8 ranks: every rank
    // reads members in the same order, so results match bit for bit.
    for imp in impls(C::AllReduce) {
        let case = Case::new(C::AllReduce, imp, full(8), T::F32, &[333]).reduction(K::Sum);
        let layout = Layout::new(&case, 0, 3, case.operand_bytes() * 4 + 4096);
        let cl = cluster(8, layout.signals.offset + 4096);
        let outs = on_devices(&cl, |dev| {
            let mut rng = ChaCha8Rng::seed_from_u64(dev.rank() as u64);
            let input = random_bytes(&mut rng, T::F32, case.operand_bytes());
            run_one(&dev, &layout.call(&case, "ar", Duration::from_secs(20)), &[input]).unwrap()
        });
        for o in &outs {
            assert_eq!(o, &outs[0], "{imp}");
        }
    }
}

#[test]
fn gather_scatter_all_to_all_every_size() {
    for n in SIZES {
        for kind in [C::AllGather, C::AllToAll, C::ReduceScatter] {
            for imp in impls(kind) {
                for per in [0usize, 1, 3, 40] {
                    let mut case = Case::new(kind, imp, full(n), T::F32, &[(per * n) as i64]).dimension(0);
                    if kind == C::AllGather {
                        case = Case::new(kind, imp, full(n), T::F32, &[per as i64]).dimension(0);
                    }
                    if kind == C::ReduceScatter {
                        case = case.reduction(K::Sum);
                    }
                    check_case(&case, n, per % 3, per as u64 + 7);
                }
            }
        }
    }
}

#[test]
fn non_major_dimensions_use_strided_blocks() {
    for n in [2, 3, 4] {
        let g = n as i64;
        for imp in impls(C::AllGather) {
            for dim in 0..3 {
                let case = Case::new(C::AllGather, imp, full(n), T::S16, &[3, 5, 7]).dimension(dim);
                check_case(&case, n, 1, dim as u64);
            }
        }
        for kind in [C::AllToAll, C::ReduceScatter] {
            for imp in impls(kind) {
                for dim in 0..3 {
                    let mut dims = vec![3, 5, 7];
                    dims[dim] = 2 * g;
                    let mut case = Case::new(kind, imp, full(n), T::Bf16, &dims).dimension(dim);
                    if kind == C::ReduceScatter {
                        case = case.reduction(K::Sum);
                    }
                    check_case(&case, n, 3, dim as u64);
                }
            }
        }
    }
}

#[test]
fn tuple_all_to_all_and_variadic_fallbacks() {
    for n in [1, 2, 3, 4] {
        for imp in impls(C::AllToAll) {
            let case = Case::new(C::AllToAll, imp, full(n), T::U16, &[5]).operands(n);
            check_case(&case, n, 1, 3);
        }
        // Variadic all-reduce, all-gather and reduce-scatter (the emitter sends these to
        // the fallback; the kernels handle them too).
        for kind in [C::AllReduce, C::AllGather, C::ReduceScatter] {
            for imp in impls(kind) {
                let mut case = Case::new(kind, imp, full(n), T::S64, &[(2 * n) as i64]).dimension(0).operands(3);
                if kind != C::AllGather {
                    case = case.reduction(K::Sum);
                }
                check_case(&case, n, 0, 11);
            }
        }
    }
}

#[test]
fn subgroups() {
    let groups = vec![vec![0, 2], vec![1, 3]];
    let reversed = vec![vec![3, 1], vec![2, 0]];
    for gs in [groups, reversed] {
        for kind in [C::AllReduce, C::AllGather, C::AllToAll, C::ReduceScatter] {
            for imp in impls(kind) {
                let mut case = Case::new(kind, imp, gs.clone(), T::F64, &[6]).dimension(0);
                if matches!(kind, C::AllReduce | C::ReduceScatter) {
                    case = case.reduction(K::Min);
                }
                check_case(&case, 4, 5, 1);
            }
        }
    }
    // Singleton groups are local copies.
    for kind in [C::AllReduce, C::AllGather, C::AllToAll, C::ReduceScatter] {
        let mut case = Case::new(kind, kernel(kind, false), vec![vec![0], vec![1], vec![2]], T::U32, &[9]).dimension(0);
        if matches!(kind, C::AllReduce | C::ReduceScatter) {
            case = case.reduction(K::Sum);
        }
        check_case(&case, 3, 0, 2);
    }
}

#[test]
fn collective_permute() {
    let pair_sets: Vec<(usize, Vec<(usize, usize)>)> = vec![
        (1, vec![(0, 0)]),
        (1, vec![]),
        (2, vec![(0, 1), (1, 0)]),
        (3, vec![(0, 1), (1, 2), (2, 0)]),
        (4, vec![(0, 1), (2, 3)]), // 0 and 2 get zeros
        (4, vec![(3, 3), (0, 2)]), // a self pair
        (8, (0..8).map(|i| (i, (i + 3) % 8)).collect()),
    ];
    for (n, pairs) in pair_sets {
        for imp in impls(C::CollectivePermute) {
            for elems in [0, 1, 13] {
                let case = Case::new(C::CollectivePermute, imp, full(n), T::S8, &[elems]).pairs(&pairs);
                check_case(&case, n, 7, elems as u64);
            }
        }
    }
}

#[test]
fn every_dtype() {
    for ty in T::ALL {
        if ty == T::Token {
            continue;
        }
        // Pure data movement takes every type through the fallback (and the kernels, which
        // are plain byte moves here even where the emitter would not pick them).
        for kind in [C::AllGather, C::AllToAll, C::CollectivePermute] {
            for imp in impls(kind) {
                let case = Case::new(kind, imp, full(3), ty, &[6]).dimension(0).pairs(&[(0, 1), (1, 2)]);
                check_case(&case, 3, 1, 5);
            }
        }
        // Reductions over every computable type and every reduction defined on it.
        if ty.is_computable() {
            for r in [K::Sum, K::Prod, K::Min, K::Max, K::And, K::Or] {
                if ty.is_float() && matches!(r, K::And | K::Or) {
                    continue;
                }
                for kind in [C::AllReduce, C::ReduceScatter] {
                    for imp in impls(kind) {
                        let case = Case::new(kind, imp, full(4), ty, &[12]).dimension(0).reduction(r);
                        check_case(&case, 4, 2, 9);
                    }
                }
            }
        } else {
            // Reductions on types the host cannot compute are errors, not panics.
            let case = Case::new(C::AllReduce, Implementation::Fallback, full(2), ty, &[4]).reduction(K::Sum);
            let layout = Layout::new(&case, 0, 0, 4096);
            let cl = cluster(2, 8192);
            let r = on_devices(&cl, |dev| dev.run_collective(&layout.call(&case, "x", Duration::from_secs(1))));
            assert!(matches!(r[0], Err(Error::Unsupported { .. })), "{ty}: {r:?}");
        }
    }
}

#[test]
fn half_precision_accumulates_in_f32() {
    // bf16: 1 + 3 * 2^-9 rounds once to 1 + 2^-7; per-step rounding would give 1.0.
    use half::bf16;
    for imp in impls(C::AllReduce) {
        let case = Case::new(C::AllReduce, imp, full(4), T::Bf16, &[1]).reduction(K::Sum);
        let layout = Layout::new(&case, 0, 0, 4096);
        let cl = cluster(4, 8192);
        let outs = on_devices(&cl, |dev| {
            let v = if dev.rank() == 0 { 1.0 } else { 1.0 / 512.0 };
            run_one(
                &dev,
                &layout.call(&case, "ar", Duration::from_secs(20)),
                &[bf16::from_f32(v).to_le_bytes().to_vec()],
            )
            .unwrap()
        });
        for o in outs {
            assert_eq!(bf16::from_le_bytes([o[0][0], o[0][1]]).to_f32(), 1.0 + 1.0 / 128.0, "{imp}");
        }
    }
}

/// 1000 back-to-back executions of the same call on one cluster, with fresh inputs each
/// time: epochs advance on the devices and every result stays correct.
#[test]
fn repeated_calls_stay_correct() {
    let n = 4;
    let mut cases = vec![];
    for imp in impls(C::AllReduce) {
        cases.push(Case::new(C::AllReduce, imp, full(n), T::S32, &[5]).reduction(K::Sum));
    }
    cases.push(Case::new(C::AllGather, kernel(C::AllGather, false), full(n), T::S32, &[3]).dimension(0));
    cases.push(Case::new(C::AllToAll, kernel(C::AllToAll, false), full(n), T::S32, &[8]).dimension(0));
    cases.push(
        Case::new(C::ReduceScatter, kernel(C::ReduceScatter, false), full(n), T::S32, &[8])
            .dimension(0)
            .reduction(K::Sum),
    );
    cases.push(Case::new(C::CollectivePermute, kernel(C::CollectivePermute, false), full(n), T::S32, &[3]).pairs(&[
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 0),
    ]));
    cases.push(
        Case::new(C::CollectivePermute, Implementation::Fallback, full(n), T::S32, &[3]).pairs(&[(0, 2), (1, 3)]),
    );
    const ITERS: usize = 1000;
    for case in &cases {
        let layout = Layout::new(case, 0, 4, 8192);
        let cl = cluster(n, 16384);
        // Inputs depend on (iteration, device) so a stale buffer shows up as a wrong value.
        let input = |it: usize, d: usize| -> Vec<Vec<u8>> {
            let words = case.operand_bytes() / 4;
            vec![(0..words).flat_map(|k| ((it * 1000 + d * 10 + k) as i32).to_le_bytes()).collect()]
        };
        let got = on_devices(&cl, |dev| {
            let call = layout.call(case, "rep", Duration::from_secs(30));
            (0..ITERS).map(|it| run_one(&dev, &call, &input(it, dev.rank())).unwrap()).collect::<Vec<_>>()
        });
        for it in 0..ITERS {
            let ins: Vec<Vec<Vec<u8>>> = (0..n).map(|d| input(it, d)).collect();
            let want = expected(case, &ins);
            for (d, per_dev) in got.iter().enumerate() {
                assert_eq!(per_dev[it], want[d], "{} {} iteration {it} device {d}", case.config, case.implementation);
            }
        }
    }
}

#[test]
fn two_clusters_run_concurrently() {
    let a = Case::new(C::AllReduce, kernel(C::AllReduce, false), full(3), T::F32, &[17]).reduction(K::Sum);
    let b = Case::new(C::AllGather, kernel(C::AllGather, false), full(2), T::U8, &[5]).dimension(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for seed in 0..50 {
                    check_case(&a, 3, 1, seed);
                }
            });
            s.spawn(|| {
                for seed in 0..50 {
                    check_case(&b, 2, 0, seed);
                }
            });
        }
    });
    // Two clusters with identical layouts driven at the same time from different threads.
    let layout = Layout::new(&a, 0, 0, 4096);
    let (c1, c2) = (cluster(3, 8192), cluster(3, 8192));
    std::thread::scope(|s| {
        for (cl, scale) in [(&c1, 1.0f32), (&c2, 100.0)] {
            let (a, layout) = (&a, &layout);
            s.spawn(move || {
                let outs = on_devices(cl, |dev| {
                    let call = layout.call(a, "ar", Duration::from_secs(20));
                    let mut last = vec![];
                    for it in 0..200 {
                        let x = scale * (dev.rank() as f32 + it as f32);
                        let input: Vec<u8> = (0..17).flat_map(|_| x.to_le_bytes()).collect();
                        last = run_one(&dev, &call, &[input]).unwrap();
                    }
                    last
                });
                let want = scale * (0.0 + 1.0 + 2.0 + 3.0 * 199.0);
                for o in outs {
                    assert_eq!(f32::from_le_bytes(o[0][..4].try_into().unwrap()), want);
                }
            });
        }
    });
}

#[test]
fn withheld_rank_times_out_on_every_other_device() {
    let timeout = Duration::from_millis(200);
    let mut cases = vec![];
    for imp in impls(C::AllReduce) {
        cases.push(Case::new(C::AllReduce, imp, full(4), T::F32, &[8]).reduction(K::Sum));
    }
    for kind in [C::AllGather, C::AllToAll] {
        for imp in impls(kind) {
            cases.push(Case::new(kind, imp, full(4), T::F32, &[8]).dimension(0));
        }
    }
    for imp in impls(C::ReduceScatter) {
        cases.push(Case::new(C::ReduceScatter, imp, full(4), T::F32, &[8]).dimension(0).reduction(K::Max));
    }
    for case in &cases {
        let layout = Layout::new(case, 0, 0, 4096);
        let cl = cluster(4, 8192);
        let start = Instant::now();
        let res = on_devices(&cl, |dev| {
            if dev.rank() == 3 {
                return None;
            }
            Some(dev.run_collective(&layout.call(case, "ar.1", timeout)))
        });
        let took = start.elapsed();
        assert!(took < Duration::from_secs(3), "{took:?}");
        for (d, r) in res.iter().enumerate().take(3) {
            match r {
                Some(Err(e @ Error::Timeout { waiting_rank, missing, group, .. })) => {
                    assert_eq!((*waiting_rank, missing.as_slice(), group.as_slice()), (d, &[3][..], &[0, 1, 2, 3][..]));
                    let op = case.config.op.name();
                    assert_eq!(
                        e.to_string(),
                        format!(
                            "{op} %ar.1 timed out after 200 ms on rank {d} waiting for ranks [3] of group {{0,1,2,3}}"
                        )
                    );
                }
                other => panic!("{} {}: device {d} got {other:?}", case.config, case.implementation),
            }
        }
        // A fresh cluster works afterwards.
        check_case(case, 4, 0, 1);
    }
    // Collective-permute: the withheld device's partners time out naming it; the others
    // finish.
    for imp in impls(C::CollectivePermute) {
        let case = Case::new(C::CollectivePermute, imp, full(4), T::U8, &[3]).pairs(&[(0, 1), (1, 2), (3, 0)]);
        let layout = Layout::new(&case, 0, 0, 4096);
        let cl = cluster(4, 8192);
        let res = on_devices(&cl, |dev| {
            (dev.rank() != 1).then(|| dev.run_collective(&layout.call(&case, "cp", Duration::from_millis(100))))
        });
        for d in [0, 2] {
            match &res[d] {
                Some(Err(Error::Timeout { missing, .. })) => assert_eq!(missing, &[1], "{imp} device {d}"),
                other => panic!("{imp}: device {d} got {other:?}"),
            }
        }
        assert!(matches!(res[3], Some(Ok(()))), "{imp}: {:?}", res[3]);
        check_case(&case, 4, 0, 1);
    }
}

#[test]
fn missing_peer_access_fails_kernels_not_the_fallback() {
    let peers = Arc::new(vec![
        vec![true, true, false, false],
        vec![true, true, false, false],
        vec![false, false, true, true],
        vec![false, false, true, true],
    ]);
    for imp in impls(C::AllReduce) {
        let case = Case::new(C::AllReduce, imp, full(4), T::F32, &[4]).reduction(K::Sum);
        let layout = Layout::new(&case, 0, 0, 4096);
        let cl = HostCluster::new(4, 8192, Arc::clone(&peers)).unwrap();
        let res = on_devices(&cl, |dev| dev.run_collective(&layout.call(&case, "ar", Duration::from_secs(5))));
        for r in res {
            match imp {
                Implementation::Fallback => assert!(matches!(r, Ok(())), "{imp}: {r:?}"),
                _ => assert!(matches!(r, Err(Error::NoPeerAccess { from: 0 | 1, to: 2 | 3, .. })), "{imp}: {r:?}"),
            }
        }
    }
    // Pairs within the islands work with kernels.
    let case = Case::new(C::AllReduce, kernel(C::AllReduce, false), vec![vec![0, 1], vec![2, 3]], T::F32, &[4])
        .reduction(K::Sum);
    let layout = Layout::new(&case, 0, 0, 4096);
    let cl = HostCluster::new(4, 8192, peers).unwrap();
    let res = on_devices(&cl, |dev| dev.run_collective(&layout.call(&case, "ar", Duration::from_secs(5))));
    assert!(res.iter().all(Result::is_ok), "{res:?}");
}

#[test]
fn bad_calls_are_errors_not_panics() {
    let case = Case::new(C::AllReduce, kernel(C::AllReduce, false), full(2), T::F32, &[4]).reduction(K::Sum);
    let layout = Layout::new(&case, 0, 0, 4096);
    let cl = cluster(2, 8192);
    let dev = cl.device(0);
    let t = Duration::from_millis(50);
    let try_call = |f: &dyn Fn(&mut kernels::host::CollectiveCall)| {
        let mut call = layout.call(&case, "bad", t);
        f(&mut call);
        dev.run_collective(&call).unwrap_err()
    };
    let e = try_call(&|c| c.inputs[0] = Region::new(8190, 16));
    assert!(matches!(&e, Error::Memory { source, .. } if matches!(**source, Error::OutOfBounds { .. })), "{e}");
    let e = try_call(&|c| c.inputs[0] = Region::new(usize::MAX, 16));
    assert!(matches!(e, Error::Memory { .. }), "{e}");
    let e = try_call(&|c| c.signals.offset += 4);
    assert!(e.to_string().contains("8-byte aligned"), "{e}");
    let e = try_call(&|c| c.scratch.len -= 1);
    assert!(e.to_string().contains("scratch"), "{e}");
    let e = try_call(&|c| c.outputs[0] = c.scratch);
    assert!(e.to_string().contains("overlaps"), "{e}");
    let e = try_call(&|c| c.outputs[0].len += 4);
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    let e = try_call(&|c| c.implementation = Implementation::Kernel(KernelAlgorithm::DirectAllGather));
    assert!(e.to_string().contains("does not compute"), "{e}");
    let e = try_call(&|c| c.operand_shapes[0].dims = vec![-1]);
    assert!(matches!(e, Error::Invalid { .. }), "{e}");
    // A device the cluster does not have, and arenas out of range.
    let ghost = cl.device(9);
    assert!(matches!(ghost.read(0, 1), Err(Error::NoSuchDevice { rank: 9, .. })));
    assert!(matches!(ghost.run_collective(&layout.call(&case, "g", t)), Err(Error::Memory { .. })));
    assert!(dev.read(8192, 1).is_err() && dev.write(8190, &[0; 3]).is_err() && dev.copy_within(0, 8000, 193).is_err());
    assert_eq!(dev.read(8192, 0).unwrap(), Vec::<u8>::new());
    assert!(HostCluster::new(0, 10, full_peers(0)).is_err());
    assert!(HostCluster::new(2, 10, full_peers(3)).is_err());
    // Refused before allocating: more than the host has (or, failing /proc/meminfo, the allocator says no).
    assert!(matches!(
        HostCluster::new(2, usize::MAX, full_peers(2)),
        Err(Error::ExceedsHostMemory { .. } | Error::Alloc { .. })
    ));
}

#[test]
fn host_memory_round_trips() {
    let cl = cluster(2, 1000);
    let d = cl.device(1);
    d.write(3, b"hello, peerless").unwrap();
    d.copy_within(3, 5, 15).unwrap();
    assert_eq!(d.read(3, 17).unwrap(), b"hehello, peerless");
    assert_eq!(cl.device(0).read(3, 4).unwrap(), vec![0; 4]);
}
