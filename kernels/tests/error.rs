//! `kernels::Error`: what each variant says, what it wraps, and how XLA's status is chosen.

use std::error::Error as _;
use std::time::Duration;

use thunks::{CollectiveKind, CollectiveOp};

use kernels::Error;

#[test]
fn wrapping_variants_keep_their_source() {
    let alloc = Error::Alloc { num_devices: 1, arena_bytes: 8 };
    let op = CollectiveOp { kind: CollectiveKind::AllReduce, is_async: false };
    let e = Error::Memory { collective: "ar".into(), op, source: Box::new(alloc) };
    assert_eq!(e.to_string(), "all-reduce %ar: cannot allocate 8 bytes of device memory for each of 1 devices");
    // The chain's entry is the box itself (thiserror hands out the field as it is).
    let source = e.source().expect("a source");
    let inner = source.downcast_ref::<Box<Error>>().map(|b| &**b);
    assert!(matches!(inner, Some(Error::Alloc { arena_bytes: 8, .. })), "{source}");
}

#[test]
fn timeouts_and_missing_ranks() {
    let op = CollectiveOp { kind: CollectiveKind::AllGather, is_async: false };
    let t = Error::Timeout {
        collective: "%ag".into(),
        op,
        group: vec![0, 1],
        waiting_rank: 0,
        missing: vec![1],
        timeout: Duration::from_millis(20),
    };
    assert_eq!(t.to_string(), "all-gather %ag timed out after 20 ms on rank 0 waiting for ranks [1] of group {0,1}");
    assert!(t.is_timeout() && !t.is_invalid_argument());
    assert_eq!(t.missing(), Some(&[1][..]));
    let x = Error::ExchangeMissing { devices: vec![5, 7] };
    assert!(x.is_timeout());
    assert_eq!(x.missing(), Some(&[5, 7][..]));
    let bad = Error::BadCall { name: "c".into(), message: "no operand".into() };
    assert!(!bad.is_timeout() && bad.missing().is_none() && bad.is_invalid_argument());
    assert!(!Error::Segment("taken".into()).is_timeout());
}
