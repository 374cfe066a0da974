//! Collective ops, configurations and decisions: names and how they print.

use hlo::analysis::ReductionKind;
use hlo::{Opcode, PrimitiveType};
use thunks::{CollectiveConfig, CollectiveKind, CollectiveOp, Decision, KernelAlgorithm};

#[test]
fn op_names_round_trip_through_opcodes() {
    for &opc in Opcode::ALL {
        if let Some(op) = CollectiveOp::from_opcode(opc) {
            assert_eq!(op.name(), opc.name());
            assert!(opc.is_collective());
        } else {
            assert!(!opc.is_collective(), "{opc}");
        }
    }
    assert_eq!(CollectiveOp::from_opcode(Opcode::AllGatherDone), None);
}

#[test]
fn displays() {
    let cfg = CollectiveConfig {
        op: CollectiveOp { kind: CollectiveKind::AllReduce, is_async: true },
        groups: vec![vec![0, 1], vec![2, 3]],
        element_type: PrimitiveType::Bf16,
        reduction: Some(ReductionKind::Sum),
        bytes_per_device: 64,
        dimension: None,
        source_target_pairs: vec![],
        num_operands: 1,
    };
    assert_eq!(cfg.to_string(), "all-reduce-start bf16 64 B sum groups={{0,1},{2,3}}");
    let d = Decision::kernel(KernelAlgorithm::OneShotAllReduce, "64 bytes <= one_shot_max_bytes=262144");
    assert_eq!(d.to_string(), "kernel (one-shot all-reduce): 64 bytes <= one_shot_max_bytes=262144");
    assert_eq!(Decision::fallback("x").to_string(), "fallback: x");
}
