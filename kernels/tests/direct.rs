//! `kernels::host::direct`: the host protocol within one process.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hlo::ArrayShape;
use hlo::PrimitiveType as T;
use hlo::analysis::ReductionKind;
use thunks::{CollectiveConfig, KernelAlgorithm as Algo};
use thunks::{CollectiveKind as Kind, CollectiveOp};

use kernels::host::direct::*;

fn config(kind: Kind, groups: Vec<Vec<usize>>, dimension: Option<usize>, n_ops: usize) -> CollectiveConfig {
    CollectiveConfig {
        op: CollectiveOp { kind, is_async: false },
        groups,
        element_type: T::S32,
        reduction: Some(ReductionKind::Sum),
        bytes_per_device: 0,
        dimension,
        source_target_pairs: vec![],
        num_operands: n_ops,
    }
}

fn ints(v: impl IntoIterator<Item = i32>) -> Vec<u8> {
    v.into_iter().flat_map(i32::to_le_bytes).collect()
}

/// Runs `calls` calls on every device of `c` at once; device d's operand j is
/// `input(d, j)`. Returns each device's results of the last call.
fn run_all(
    c: &DirectCollective,
    n: usize,
    calls: usize,
    input: impl Fn(usize, usize) -> Vec<u8> + Sync,
) -> Vec<Vec<Vec<u8>>> {
    thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|d| {
                let input = &input;
                s.spawn(move || {
                    let ins: Vec<Vec<u8>> = (0..c.output_lens().len()).map(|j| input(d, j)).collect();
                    let mut outs: Vec<Vec<u8>> = c.output_lens().into_iter().map(|l| vec![0xAA; l]).collect();
                    for _ in 0..calls {
                        let i: Vec<&[u8]> = ins.iter().map(Vec::as_slice).collect();
                        let mut o: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
                        c.run(d, &i, &mut o).unwrap();
                    }
                    outs
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[path = "common/shm.rs"]
mod common;
use common::call_of;

const T10: Duration = Duration::from_secs(10);

/// A staging slot of the collective's own (what the runtime gives a call without a shared slot).
fn own_slot(groups: &[Vec<usize>], bytes: usize) -> kernels::Result<std::sync::Arc<DirectSlot>> {
    DirectSlot::new(groups, bytes).map(std::sync::Arc::new)
}

#[test]
fn all_reduce_one_and_two_shot_in_groups() {
    for algo in [Algo::OneShotAllReduce, Algo::TwoShotAllReduce] {
        let cfg = config(Kind::AllReduce, vec![vec![0, 2], vec![3, 1]], None, 2);
        let shapes = [ArrayShape::new(T::S32, vec![5]), ArrayShape::new(T::S32, vec![3])];
        let c = DirectCollective::on_slot(&call_of(&cfg, algo, T10, "ar"), &shapes, 4, own_slot).unwrap();
        let outs = run_all(&c, 4, 5, |d, j| ints((0..[5, 3][j]).map(|i| (d as i32 + 1) * 10 + i)));
        for (d, o) in outs.iter().enumerate() {
            let peer = [2, 3, 0, 1][d];
            let want = |j: usize| ints((0..[5, 3][j]).map(|i| (d as i32 + 1) * 10 + (peer + 1) * 10 + 2 * i));
            assert_eq!(o, &vec![want(0), want(1)], "{algo:?} device {d}");
        }
    }
}

#[test]
fn gather_scatter_all_to_all_and_permute() {
    let n = 4;
    // All-gather along dimension 1 of a [2, 2] operand.
    let cfg = config(Kind::AllGather, vec![vec![0, 1, 2, 3]], Some(1), 1);
    let c = DirectCollective::on_slot(
        &call_of(&cfg, Algo::DirectAllGather, T10, "ag"),
        &[ArrayShape::new(T::S32, vec![2, 2])],
        n,
        own_slot,
    )
    .unwrap();
    let outs = run_all(&c, n, 3, |d, _| ints((0..4).map(|i| d as i32 * 100 + i)));
    let want = ints((0..2).flat_map(|r| (0..4).flat_map(move |d| [d * 100 + 2 * r, d * 100 + 2 * r + 1])));
    assert!(outs.iter().all(|o| o[0] == want));
    // Reduce-scatter of 8 elements.
    let cfg = config(Kind::ReduceScatter, vec![vec![0, 1, 2, 3]], Some(0), 1);
    let c = DirectCollective::on_slot(
        &call_of(&cfg, Algo::DirectReduceScatter, T10, "rs"),
        &[ArrayShape::new(T::S32, vec![8])],
        n,
        own_slot,
    )
    .unwrap();
    let outs = run_all(&c, n, 3, |d, _| ints((0..8).map(|i| i * (d as i32 + 1))));
    for (d, o) in outs.iter().enumerate() {
        assert_eq!(o[0], ints((2 * d as i32..2 * d as i32 + 2).map(|i| i * 10)));
    }
    // Array all-to-all.
    let cfg = config(Kind::AllToAll, vec![vec![0, 1, 2, 3]], Some(0), 1);
    let c = DirectCollective::on_slot(
        &call_of(&cfg, Algo::DirectAllToAll, T10, "a2a"),
        &[ArrayShape::new(T::S32, vec![4])],
        n,
        own_slot,
    )
    .unwrap();
    let outs = run_all(&c, n, 3, |d, _| ints((0..4).map(|i| d as i32 * 10 + i)));
    for (d, o) in outs.iter().enumerate() {
        assert_eq!(o[0], ints((0..4).map(|k| k * 10 + d as i32)));
    }
    // Tuple all-to-all.
    let c = DirectCollective::on_slot(
        &call_of(&config(Kind::AllToAll, vec![vec![0, 1, 2, 3]], None, 4), Algo::DirectAllToAll, T10, "a2a_tuple"),
        &vec![ArrayShape::new(T::S32, vec![1]); 4],
        n,
        own_slot,
    )
    .unwrap();
    let outs = run_all(&c, n, 3, |d, j| ints([d as i32 * 10 + j as i32]));
    for (d, o) in outs.iter().enumerate() {
        assert_eq!(o, &(0..4).map(|k| ints([k * 10 + d as i32])).collect::<Vec<_>>());
    }
    // Permute: 0→1, 1→2, 2→2; device 0 and 3 get no source (zeros).
    let mut cfg = config(Kind::CollectivePermute, vec![], None, 1);
    cfg.source_target_pairs = vec![(0, 1), (1, 2), (3, 0)];
    let c = DirectCollective::on_slot(
        &call_of(&cfg, Algo::DirectPermute, T10, "cp"),
        &[ArrayShape::new(T::S32, vec![2])],
        n,
        own_slot,
    )
    .unwrap();
    let outs = run_all(&c, n, 5, |d, _| ints([d as i32, 7]));
    assert_eq!(
        outs.iter().map(|o| o[0].clone()).collect::<Vec<_>>(),
        vec![ints([3, 7]), ints([0, 7]), ints([1, 7]), ints([0, 0])]
    );
}

#[test]
fn chained_collectives_share_one_slot() {
    // An all-reduce (one- and two-shot), an all-gather and a reduce-scatter of other
    // sizes, called in one order by every member, on one slot sized for the largest.
    let n = 4;
    let members = vec![vec![0, 1, 2, 3]];
    let slot = Arc::new(DirectSlot::new(&members, 64 * 8).unwrap());
    let on = |kind, algo, dim, shape: Vec<i64>| {
        let cfg = config(kind, members.clone(), dim, 1);
        let len = shape[0] as i32;
        let s = ArrayShape::new(T::S32, shape);
        (DirectCollective::on_slot(&call_of(&cfg, algo, T10, "c"), &[s], n, |_, _| Ok(Arc::clone(&slot))).unwrap(), len)
    };
    let chain = [
        on(Kind::AllReduce, Algo::OneShotAllReduce, None, vec![100]),
        on(Kind::AllGather, Algo::DirectAllGather, Some(0), vec![3]),
        on(Kind::AllReduce, Algo::TwoShotAllReduce, None, vec![128]),
        on(Kind::ReduceScatter, Algo::DirectReduceScatter, Some(0), vec![8]),
    ];
    assert_eq!(slot.bytes(), n * 2 * 512);
    let outs: Vec<Vec<Vec<u8>>> = thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|d| {
                let chain = &chain;
                s.spawn(move || {
                    let mut last = vec![];
                    for round in 0..50i32 {
                        last.clear();
                        for (c, len) in chain {
                            let x = ints((0..*len).map(|i| i + d as i32 * 1000 + round));
                            let mut out = vec![0u8; c.output_lens()[0]];
                            c.run(d, &[&x], &mut [&mut out]).unwrap();
                            last.push(out);
                        }
                    }
                    last
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let r = 49;
    for (d, o) in outs.iter().enumerate() {
        assert_eq!(o[0], ints((0..100).map(|i| 4 * (i + r) + 6000)));
        assert_eq!(o[1], ints((0..4).flat_map(|k| (0..3).map(move |i| i + k * 1000 + r))));
        assert_eq!(o[2], ints((0..128).map(|i| 4 * (i + r) + 6000)));
        let lo = 2 * d as i32;
        assert_eq!(o[3], ints((lo..lo + 2).map(|i| 4 * (i + r) + 6000)));
    }
    // A slot of other groups or too small is refused.
    let cfg = config(Kind::AllReduce, vec![vec![0, 1], vec![2, 3]], None, 1);
    let big = [ArrayShape::new(T::S32, vec![100])];
    assert!(
        DirectCollective::on_slot(&call_of(&cfg, Algo::OneShotAllReduce, T10, "x"), &big, n, |_, _| Ok(Arc::clone(
            &slot
        )))
        .is_err()
    );
    let cfg = config(Kind::AllReduce, members.clone(), None, 1);
    let huge = [ArrayShape::new(T::S32, vec![1000])];
    assert!(
        DirectCollective::on_slot(&call_of(&cfg, Algo::OneShotAllReduce, T10, "x"), &huge, n, |_, _| Ok(Arc::clone(
            &slot
        )))
        .is_err()
    );
}

#[test]
fn a_missing_rank_times_out_and_the_next_epoch_is_clean() {
    for algo in [Algo::OneShotAllReduce, Algo::TwoShotAllReduce] {
        let cfg = config(Kind::AllReduce, vec![vec![0, 1]], None, 1);
        let shape = [ArrayShape::new(T::S32, vec![3])];
        let c = DirectCollective::on_slot(&call_of(&cfg, algo, Duration::from_millis(50), "ar"), &shape, 2, own_slot)
            .unwrap();
        let x = ints([1, 2, 3]);
        let mut r = vec![0u8; 12];
        let e = c.run(0, &[&x], &mut [&mut r]).unwrap_err().to_string();
        assert!(e.contains("timed out") && e.contains("[1]") && e.contains("{0,1}"), "{algo:?}: {e}");
        // The late rank fails its call of the broken epoch too, without waiting.
        let t = Instant::now();
        assert!(c.run(1, &[&x], &mut [&mut r]).is_err());
        assert!(t.elapsed() < Duration::from_millis(40));
        // Both then agree again.
        let outs = run_all(&c, 2, 3, |_, _| ints([1, 2, 3]));
        assert!(outs.iter().all(|o| o[0] == ints([2, 4, 6])), "{algo:?}");
    }
}
