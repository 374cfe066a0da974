use super::*;
use hlo::analysis::ReductionKind;

fn call(instance: u64, slot: Option<u64>, groups: Vec<Vec<usize>>) -> CustomCallConfig {
    CustomCallConfig {
        groups,
        reduction: Some(ReductionKind::Sum),
        num_devices: 2,
        instance,
        timeout_ms: 1,
        slot,
        slot_bytes: 4096,
        slot_gpu_bytes: 8192,
        ..CustomCallConfig::new(Kind::AllReduce, Algo::OneShotAllReduce, format!("ar.{instance}"))
    }
}

#[cfg(feature = "cuda")]
#[test]
fn calls_of_one_slot_share_one_instance_per_executable() {
    slot_sharing::<crate::cuda::Cuda>();
}

#[cfg(feature = "rocm")]
#[test]
fn calls_of_one_slot_share_one_instance_per_executable_on_rocm() {
    slot_sharing::<crate::rocm::Hip>();
}

#[cfg(feature = "rocm")]
#[test]
fn vendors_keep_their_own_state() {
    use crate::cuda::Cuda;
    use crate::rocm::Hip;
    let c = call(0x52_0001, Some(0x52_0001), vec![vec![0, 1]]);
    let _cuda = on_slot::<Cuda>(&c, 1024, 0);
    let key: SlotKey = (0x52_0001, 0, c.groups.clone(), vec![]);
    assert!(Cuda::state().slots.get(&key).is_some());
    assert!(Hip::state().slots.get(&key).is_none(), "a CUDA slot is not HIP's");
    assert_ne!(std::ptr::from_ref(Cuda::state()).addr(), std::ptr::from_ref(Hip::state()).addr());
}

/// No GPU needed: an instance allocates nothing until a device initialises it.
fn slot_sharing<B: XlaBackend>() {
    let on_slot = on_slot::<B>;
    let g = vec![vec![0, 1]];
    let (a, b) = (call(0x51_0001, Some(0x51_0001), g.clone()), call(0x51_0002, Some(0x51_0001), g.clone()));
    let first = on_slot(&a, 1024, 0);
    assert_eq!(first.staging, 8192, "sized by the slot, not by its first call");
    assert!(Arc::ptr_eq(&first, &on_slot(&b, 8192, 0)), "one slot, one instance");
    assert_eq!(first.key, thunks::runtime::shared_key(0x51_0001, 0), "met under the slot's id");
    // Another load of the executable (another occurrence) never shares.
    assert!(!Arc::ptr_eq(&first, &on_slot(&b, 1024, 1)));
    // A call needing more than its slot holds gets staging of its own.
    let big = on_slot(&b, 16384, 0);
    assert!(!Arc::ptr_eq(&first, &big) && big.staging == 16384);
    // Without a slot: its own, as before slots.
    assert!(!Arc::ptr_eq(&first, &on_slot(&call(0x51_0003, None, g.clone()), 1024, 0)));
    // Defensively, other groups under the same slot id never share.
    assert!(!Arc::ptr_eq(&first, &on_slot(&call(0x51_0004, Some(0x51_0001), vec![vec![1, 0]]), 1024, 0)));
    // Once every call holding it is gone, the slot is forgotten and a later one is new.
    let weak = Arc::downgrade(&first);
    drop(first);
    assert!(weak.upgrade().is_none());
    let again = on_slot(&a, 1024, 0);
    assert_eq!(again.staging, 8192);
}

#[test]
fn a_kept_probe_serves_only_the_machine_it_was_made_on() {
    let key = "cuda driver 13000 aa01 bb02";
    let read = |text: &str, key: &str, allow_unsafe: bool| {
        let (t, targets) = read_probe(text, key, "kept".into())?;
        Some(t.with_target_policy(&targets.iter().map(String::as_str).collect::<Vec<_>>(), allow_unsafe))
    };
    // Three GPUs, 2 cannot reach 0.
    let text = probe_text(key, &["sm_90", "sm_90", "sm_90"], |a, b| !(a == 2 && b == 0));
    let t = read(&text, key, false).expect("same machine");
    assert_eq!(t.source(), "kept");
    assert!(t.can_access(0, 2) && t.can_access(1, 2) && !t.can_access(2, 0));
    assert_eq!(t.missing_link(&[0, 1, 2]), Some((0, 2)));
    // Another driver or other GPUs: not this machine's probe.
    assert!(read(&text, "cuda driver 13010 aa01 bb02", false).is_none());
    assert!(read(&text, "cuda driver 13000 aa01", false).is_none());
    // A cut or garbled file is no table.
    assert!(read(&text[..text.len() - 4], key, false).is_none());
    assert!(read(&text.replace("111", "1x1"), key, false).is_none());
    // The target policy applies as to a fresh probe: gfx90a's links go unless allowed.
    let amd = probe_text(key, &["gfx90a:sramecc+:xnack-", "gfx90a:sramecc+:xnack-"], |_, _| true);
    assert!(!read(&amd, key, false).unwrap().can_access(0, 1));
    assert!(read(&amd, key, true).unwrap().can_access(0, 1));
}
