//! Helpers shared by the shared-memory tests: kernels/tests/shm.rs and the in-crate ones
//! (kernels/tests/unit/shm.rs, which include this file by path).
#![allow(dead_code)] // each includer uses a part

use std::sync::atomic::{AtomicU64, Ordering};

use hlo::analysis::ReductionKind as R;
use hlo::{ArrayShape, PrimitiveType as T};
use thunks::{CollectiveConfig, CollectiveKind as Kind, CollectiveOp};

/// Instances of a test binary never share a key (each test has its own job token).
pub static INSTANCE: AtomicU64 = AtomicU64::new(1);

pub fn next_instance() -> u64 {
    INSTANCE.fetch_add(1, Ordering::Relaxed)
}

pub fn job() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The job's names left in /dev/shm.
pub fn leftovers(job: &str) -> Vec<String> {
    let prefix = format!("peerless-{job}-");
    let entries = std::fs::read_dir("/dev/shm").expect("/dev/shm");
    entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(&prefix)).collect()
}

pub fn config(kind: Kind, groups: Vec<Vec<usize>>, dimension: Option<usize>, n_ops: usize, r: R) -> CollectiveConfig {
    CollectiveConfig {
        op: CollectiveOp { kind, is_async: false },
        groups,
        element_type: T::F32,
        reduction: Some(r),
        bytes_per_device: 0,
        dimension,
        source_target_pairs: vec![],
        num_operands: n_ops,
    }
}

pub fn permute_config(pairs: Vec<(usize, usize)>, n_ops: usize) -> CollectiveConfig {
    let mut cfg = config(Kind::CollectivePermute, vec![], None, n_ops, R::Sum);
    cfg.source_target_pairs = pairs;
    cfg
}

pub fn sh(ty: T, dims: &[i64]) -> ArrayShape {
    ArrayShape::new(ty, dims.to_vec())
}

/// The call the handlers would pass for `cfg` run with `algo`: the protocols take a call's
/// config, as XLA's handlers hand it over.
pub fn call_of(
    cfg: &CollectiveConfig,
    algo: thunks::KernelAlgorithm,
    timeout: std::time::Duration,
    name: &str,
) -> thunks::custom_call::CustomCallConfig {
    thunks::custom_call::CustomCallConfig {
        groups: cfg.groups.clone(),
        pairs: cfg.source_target_pairs.clone(),
        reduction: cfg.reduction,
        dimension: cfg.dimension,
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        ..thunks::custom_call::CustomCallConfig::new(cfg.op.kind, algo, name.to_string())
    }
}
