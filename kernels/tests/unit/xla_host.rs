//! Unit tests of `kernels::xla_host` (included by path from src/xla_host.rs: one reads its shared slots).

use std::thread;

use hlo::analysis::ReductionKind;
use thunks::{CollectiveKind, KernelAlgorithm};

use super::*;

fn cfg(kind: CollectiveKind, algorithm: KernelAlgorithm, instance: u64) -> CustomCallConfig {
    CustomCallConfig {
        groups: vec![vec![0, 1, 2, 3]],
        reduction: Some(ReductionKind::Sum),
        dimension: Some(0),
        num_devices: 4,
        instance,
        timeout_ms: 5_000,
        ..CustomCallConfig::new(kind, algorithm, "c")
    }
}

/// Runs `call` as XLA:CPU's handler does for a call whose XLA keeps no state: in the state
/// adopted for its instance.
fn run(call: HostCall) -> Result<()> {
    let state = ADOPTED.adopt(ExecState::for_call(call.config)).map_err(|e| invalid(call.config, e.to_string()))?;
    run_in(state, call)
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Runs `ar` then `ag` on every device, `rounds` times: the all-reduce of `x(d, k)`, then
/// the all-gather of its result (`gather_result`) or of `x`. Each device's last results.
fn ar_then_ag(
    ar: &CustomCallConfig,
    ag: &CustomCallConfig,
    rounds: usize,
    gather_result: bool,
    x: impl Fn(usize, usize) -> Vec<u8> + Sync,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let shape = ArrayShape::new(PrimitiveType::F32, vec![2]);
    let gathered = ArrayShape::new(PrimitiveType::F32, vec![8]);
    thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|d| {
                let (x, shape, gathered) = (&x, &shape, &gathered);
                s.spawn(move || {
                    let (mut r, mut g) = (vec![0u8; 8], vec![0u8; 32]);
                    for k in 0..rounds {
                        let x = x(d, k);
                        let inputs = vec![(x.as_slice(), shape.clone())];
                        run(HostCall { config: ar, device: d, inputs, outputs: vec![(&mut r, shape.clone())] })
                            .unwrap();
                        let input = if gather_result { &r } else { &x };
                        let (inputs, outputs) =
                            (vec![(input.as_slice(), shape.clone())], vec![(g.as_mut_slice(), gathered.clone())]);
                        run(HostCall { config: ag, device: d, inputs, outputs }).unwrap();
                    }
                    (r, g)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn all_reduce_and_all_gather_across_threads() {
    let ar = cfg(CollectiveKind::AllReduce, KernelAlgorithm::OneShotAllReduce, 0xA11);
    let ag = cfg(CollectiveKind::AllGather, KernelAlgorithm::DirectAllGather, 0xA12);
    for (r, g) in ar_then_ag(&ar, &ag, 3, false, |d, _| f32s(&[d as f32, 1.0])) {
        assert_eq!(r, f32s(&[6.0, 4.0]));
        assert_eq!(g, f32s(&[0.0, 1.0, 1.0, 1.0, 2.0, 1.0, 3.0, 1.0]));
    }
}

#[test]
fn chained_calls_share_a_slot() {
    // Two collectives of one slot (the pass's promise: every device calls them in one
    // order), alternating; the slot is sized by `slot_bytes`, not by the first call.
    let mut ar = cfg(CollectiveKind::AllReduce, KernelAlgorithm::TwoShotAllReduce, 0xA21);
    let mut ag = cfg(CollectiveKind::AllGather, KernelAlgorithm::DirectAllGather, 0xA22);
    (ar.slot, ar.slot_bytes) = (Some(0x5107), 4096);
    (ag.slot, ag.slot_bytes) = (Some(0x5107), 4096);
    for (r, g) in ar_then_ag(&ar, &ag, 20, true, |d, k| f32s(&[d as f32, k as f32])) {
        assert_eq!(r, f32s(&[6.0, 76.0]));
        assert_eq!(g, f32s(&[6.0, 76.0, 6.0, 76.0, 6.0, 76.0, 6.0, 76.0]));
    }
    let key: SlotKey = (0x5107, 0, ar.groups.clone(), vec![]);
    let slot = SLOTS.get(&key).expect("one shared slot");
    assert_eq!(slot.per_buffer(), 4096);
    assert_eq!(slot.bytes(), 4 * 2 * 4096);
}

#[test]
fn a_missing_rank_is_a_timeout_naming_it() {
    let mut c = cfg(CollectiveKind::AllReduce, KernelAlgorithm::OneShotAllReduce, 0xA13);
    c.groups = vec![vec![0, 1]];
    c.timeout_ms = 50;
    let x = f32s(&[1.0]);
    let mut r = vec![0u8; 4];
    let shape = ArrayShape::new(PrimitiveType::F32, vec![1]);
    let e = run(HostCall { config: &c, device: 0, inputs: vec![(&x, shape.clone())], outputs: vec![(&mut r, shape)] })
        .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("timed out") && msg.contains("[1]") && msg.contains("{0,1}"), "{msg}");
}
