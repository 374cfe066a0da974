//! Randomized stress test of the host collectives: over a thousand calls (random
//! algorithm, implementation, dtype, size including 0 and odd, operand rank and split
//! dimension, offsets, group layout, permute pairs) issued back to back by one thread per
//! device on long-lived clusters, each checked against the reference.

mod host_support;

use std::time::{Duration, Instant};

use hlo::PrimitiveType as T;
use hlo::analysis::ReductionKind as K;
use host_support::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use thunks::{CollectiveKind as C, Implementation};

fn group_layouts(n: usize, rng: &mut ChaCha8Rng) -> Vec<Vec<Vec<usize>>> {
    let mut v = vec![vec![(0..n).collect::<Vec<_>>()], (0..n).map(|d| vec![d]).collect()];
    let mut shuffled: Vec<usize> = (0..n).collect();
    shuffled.shuffle(rng);
    v.push(vec![shuffled]);
    if n.is_multiple_of(2) && n > 2 {
        // {0, n/2}, {1, n/2 + 1}, ... and the strided halves {0, 2, ..}, {1, 3, ..}.
        v.push((0..n / 2).map(|i| vec![i, i + n / 2]).collect());
        v.push(vec![(0..n).step_by(2).collect(), (1..n).step_by(2).rev().collect()]);
    }
    v
}

fn random_case(n: usize, rng: &mut ChaCha8Rng) -> Case {
    let kinds = [C::AllReduce, C::AllGather, C::AllToAll, C::ReduceScatter, C::CollectivePermute];
    let kind = kinds[rng.random_range(0..kinds.len())];
    let imp = match rng.random_range(0..3) {
        0 => Implementation::Fallback,
        k => kernel(kind, k == 2),
    };
    let layouts = group_layouts(n, rng);
    let groups = layouts[rng.random_range(0..layouts.len())].clone();
    let g = groups[0].len();
    let reduces = matches!(kind, C::AllReduce | C::ReduceScatter);
    let ty = loop {
        let t = T::ALL[rng.random_range(0..T::ALL.len())];
        if t != T::Token && (!reduces || t.is_computable()) {
            break t;
        }
    };
    // Operand shape: rank 1-3, the split dimension a multiple of the group size where the
    // op splits; sizes include 0 and odd counts.
    let rank = rng.random_range(1..=3);
    let dim = rng.random_range(0..rank);
    let mut dims: Vec<i64> = (0..rank).map(|_| rng.random_range(0..=if rank == 1 { 70 } else { 6 })).collect();
    if rng.random_bool(0.05) {
        dims[dim] = 0;
    }
    if matches!(kind, C::AllToAll | C::ReduceScatter) {
        dims[dim] = (g * rng.random_range(0..=if rank == 1 { 9 } else { 3 })) as i64;
    }
    let mut case = Case::new(kind, imp, groups, ty, &dims).dimension(dim);
    if reduces {
        let rs = [K::Sum, K::Prod, K::Min, K::Max, K::And, K::Or];
        let r = loop {
            let r = rs[rng.random_range(0..rs.len())];
            if !(ty.is_float() && matches!(r, K::And | K::Or)) {
                break r;
            }
        };
        case = case.reduction(r);
    }
    match kind {
        C::AllToAll if rng.random_bool(0.3) => {
            // Tuple form: one operand per member, no split dimension.
            case.config.dimension = None;
            case = case.operands(g);
        }
        C::AllReduce | C::AllGather | C::ReduceScatter if rng.random_bool(0.15) => {
            case = case.operands(rng.random_range(2..=3));
        }
        C::CollectivePermute => {
            let mut targets: Vec<usize> = (0..n).collect();
            targets.shuffle(rng);
            let pairs: Vec<(usize, usize)> = (0..n).zip(targets).filter(|_| rng.random_bool(0.8)).collect();
            case = case.pairs(&pairs);
        }
        _ => {}
    }
    case
}

#[test]
fn randomized_calls() {
    let start = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    let mut total = 0;
    for (n, calls) in [(1, 200), (2, 600), (3, 600), (4, 800), (8, 800)] {
        let cases: Vec<Case> = (0..calls).map(|_| random_case(n, &mut rng)).collect();
        // Data regions are reused by every call; scratch and signals belong to one call.
        const DATA: usize = 1 << 18;
        let mut bump = DATA;
        let layouts: Vec<Layout> = cases
            .iter()
            .map(|c| {
                let skew = rng.random_range(0..16);
                let mut l = Layout::new(c, 0, skew, 0);
                assert!(l.end <= DATA, "{}", c.config);
                l.scratch.offset = bump + skew;
                bump = (l.scratch.offset + l.scratch.len).div_ceil(8) * 8;
                l.signals.offset = bump;
                bump += l.signals.len;
                l
            })
            .collect();
        let inputs: Vec<Vec<Vec<Vec<u8>>>> = cases
            .iter()
            .map(|c| {
                (0..n)
                    .map(|_| {
                        (0..c.config.num_operands).map(|_| random_bytes(&mut rng, c.ty(), c.operand_bytes())).collect()
                    })
                    .collect()
            })
            .collect();
        let cl = cluster(n, bump + 64);
        let got = on_devices(&cl, |dev| {
            let mut outs = Vec::with_capacity(cases.len());
            for (i, (case, layout)) in cases.iter().zip(&layouts).enumerate() {
                let name = format!("call.{i}");
                let call = layout.call(case, &name, Duration::from_secs(60));
                outs.push(run_one(&dev, &call, &inputs[i][dev.rank()]));
            }
            outs
        });
        for (i, case) in cases.iter().enumerate() {
            let want = expected(case, &inputs[i]);
            for d in 0..n {
                let g = got[d][i].as_ref().unwrap_or_else(|e| panic!("call {i} {} on device {d}: {e}", case.config));
                assert_eq!(
                    canonical_nans(case.ty(), g),
                    canonical_nans(case.ty(), &want[d]),
                    "call {i}: {} ({}) dims {:?} on device {d} of {n}",
                    case.config,
                    case.implementation,
                    case.dims
                );
            }
        }
        total += calls;
    }
    assert!(total >= 1000);
    eprintln!("{total} randomized calls in {:?}", start.elapsed());
}
