//! Unit tests of `tools::xla_tune` (included by path from src/xla_tune.rs).

use super::*;

fn points(measured: &[(usize, &str, f64)]) -> Profile {
    let key = Key { platform: "cpu".into(), device_kind: "cpu".into(), devices: 8, links: "host".into() };
    let mut p = Profile::new(key, Measured::default());
    for &(bytes, imp, us) in measured {
        p.record("all-reduce", "f32", 8, bytes, imp, us);
    }
    p
}

#[test]
fn the_midpoint_between_neighbours_whose_winners_differ_is_measured() {
    // 1 KiB: one-shot; 4 KiB: one-shot; 16 KiB: two-shot; 64 KiB: two-shot within the
    // margin, so XLA; 256 KiB: XLA.
    let (one, two) = ("one-shot all-reduce", "two-shot all-reduce");
    let p = points(&[
        (1024, XLA, 100.0),
        (1024, one, 50.0),
        (1024, two, 70.0),
        (4096, XLA, 100.0),
        (4096, one, 60.0),
        (4096, two, 70.0),
        (16384, XLA, 200.0),
        (16384, one, 190.0),
        (16384, two, 150.0),
        (65536, XLA, 300.0),
        (65536, one, 400.0),
        (65536, two, 290.0),
        (262144, XLA, 500.0),
        (262144, two, 700.0),
    ]);
    let pts = p.points("all-reduce", "f32", 8);
    let w = |b: usize| pts.iter().find(|x| x.bytes == b).and_then(|x| x.winner());
    assert_eq!(w(1024), Some("one-shot all-reduce"));
    assert_eq!(w(16384), Some("two-shot all-reduce"));
    assert_eq!(w(65536), Some(XLA));
    // 4 KiB -> 16 KiB and 16 KiB -> 64 KiB change hands; 64 KiB -> 256 KiB does not.
    assert_eq!(midpoints(pts, 4 * 8), vec![8192, 32768]);
    // A step of 2 leaves nothing strictly between, whole elements of 8 devices.
    let close = points(&[(1024, XLA, 100.0), (1024, one, 50.0), (1056, XLA, 100.0)]);
    assert!(midpoints(close.points("all-reduce", "f32", 8), 32).is_empty());
}
