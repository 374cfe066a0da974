//! Unit tests of `tools::xla_bench` (included by path from src/xla_bench.rs).

use super::*;

#[test]
fn a_close_call_is_peerless_and_xla_within_the_factor() {
    let prepared = [(Impl::Xla, ()), (Impl::OneShot, ()), (Impl::TwoShot, ())];
    let times = |x: f64, one: f64, two: f64| vec![vec![x, x, x], vec![one, one, one], vec![two, two, two]];
    assert!(is_close(&prepared, &times(100.0, 200.0, 110.0), 1.25));
    assert!(is_close(&prepared, &times(100.0, 81.0, 300.0), 1.25));
    assert!(!is_close(&prepared, &times(100.0, 200.0, 130.0), 1.25));
    assert!(!is_close(&prepared, &times(100.0, 70.0, 79.0), 1.25));
    // Without an XLA row there is nothing to call close.
    assert!(!is_close(&prepared[1..], &times(100.0, 100.0, 100.0)[1..], 1.25));
}
