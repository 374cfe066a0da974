//! `thunks::peers`: the table of which devices reach each other's memory.

use std::sync::Arc;

use thunks::peers::*;

#[test]
fn full_mesh_and_pairs() {
    let t = PeerAccessTable::for_host_topology(4, &HostTopology::FullMesh);
    assert!(t.can_access(0, 3) && t.can_access(3, 0));
    assert!(!t.can_access(0, 4));
    assert_eq!(t.missing_link(&[0, 1, 2, 3]), None);
    let topo = HostTopology::Pairs(vec![(0, 1), (3, 2), (1, 9)]);
    let t = PeerAccessTable::for_host_topology(4, &topo);
    assert!(t.can_access(0, 1) && t.can_access(1, 0) && t.can_access(2, 3) && t.can_access(3, 2));
    assert!(!t.can_access(0, 2) && !t.can_access(1, 3));
    for d in 0..4 {
        assert!(t.can_access(d, d));
    }
    assert_eq!(t.missing_link(&[0, 1]), None);
    assert_eq!(t.missing_link(&[0, 2]), Some((0, 2)));
    assert_eq!(t.source(), "host_topology pairs:0-1,3-2,1-9");
    let none = PeerAccessTable::for_host_topology(2, &HostTopology::Pairs(vec![]));
    assert!(!none.can_access(0, 1) && none.can_access(1, 1));
}

#[test]
fn cached_per_device_set() {
    let topo = HostTopology::Pairs(vec![(0, 1)]);
    let a = PeerAccessTable::for_host_topology(3, &topo);
    let b = PeerAccessTable::for_host_topology(3, &topo);
    assert!(Arc::ptr_eq(&a, &b));
    let c = PeerAccessTable::for_host_topology(2, &topo);
    assert!(!Arc::ptr_eq(&a, &c));
    // A backend's probe runs once per device set.
    let mut calls = 0;
    let key = || PeerTableKey::Backend { backend: "test-cached".into(), devices: vec![0, 1] };
    let t1 = PeerAccessTable::cached(key(), || {
        calls += 1;
        PeerAccessTable::from_fn(2, "probe", |a, b| a < b)
    });
    let t2 = PeerAccessTable::cached(key(), || PeerAccessTable::full(2, "never built"));
    assert_eq!(calls, 1);
    assert!(Arc::ptr_eq(&t1, &t2));
    // Asymmetric access counts as a missing link.
    assert!(t1.can_access(0, 1) && !t1.can_access(1, 0));
    assert_eq!(t1.missing_link(&[0, 1]), Some((0, 1)));
}

#[test]
fn gfx90a_is_excluded_unless_forced() {
    let probed = Arc::new(PeerAccessTable::full(3, "rocm peer probe"));
    // MI300X (gfx942) keeps every link.
    let t = probed.with_target_policy(&["gfx942:sramecc+:xnack-"; 3], false);
    assert!(Arc::ptr_eq(&t, &probed));
    // One MI200 device loses its cross-device links; the others keep theirs; self-access stays.
    let t = probed.with_target_policy(&["gfx942", "gfx90a:sramecc+:xnack-", "gfx942"], false);
    assert!(!t.can_access(0, 1) && !t.can_access(1, 2) && !t.can_access(2, 1));
    assert!(t.can_access(0, 2) && t.can_access(2, 0) && t.can_access(1, 1));
    assert_eq!(t.missing_link(&[0, 1, 2]), Some((0, 1)));
    assert_eq!(
        t.source(),
        "rocm peer probe; gfx90a excluded: MI200-class: cross-device atomics are not visible to peers \
         (openxla/xla#48069); --allow_unsafe_peer_targets=true forces kernels"
    );
    // The flag forces kernels: the probed table as it is.
    assert!(Arc::ptr_eq(&probed.with_target_policy(&["gfx90a"; 3], true), &probed));
    // A probe that already found no link stays without one.
    let none = Arc::new(PeerAccessTable::from_fn(2, "probe", |_, _| false));
    assert!(!none.with_target_policy(&["gfx942"; 2], true).can_access(0, 1));
}
