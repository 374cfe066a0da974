//! Unit tests of `kernels::ffi_handler` (included by path from src/ffi_handler.rs: they read
//! the adopted states' table).

use thunks::KernelAlgorithm;

use super::*;

impl<T> Slots<T> {
    /// The live slot of `key` (the tests of every runtime read their slots through it).
    pub(crate) fn get(&self, key: &SlotKey) -> Option<Arc<T>> {
        self.map().get(key).and_then(Weak::upgrade)
    }
}

fn cfg(instance: u64) -> CustomCallConfig {
    CustomCallConfig {
        groups: vec![vec![0, 1]],
        num_devices: 2,
        instance,
        ..CustomCallConfig::new(CollectiveKind::AllGather, KernelAlgorithm::DirectAllGather, "ag")
    }
}

#[test]
fn an_adopted_state_is_made_once_and_found_by_instance() {
    let table: Adopted<u32> = Adopted::new();
    assert!(table.find(7).is_none(), "nothing adopted yet");
    let a = table.adopt(CallState::for_call(&cfg(7))).unwrap();
    a.instance.set(42).unwrap();
    // Adopting again (a second executable of the module) keeps the first state.
    let b = table.adopt(CallState::for_call(&CustomCallConfig { name: "other".into(), ..cfg(7) })).unwrap();
    assert!(std::ptr::eq(a, b));
    assert_eq!(b.config.name, "ag");
    let found = table.find(7).expect("adopted");
    assert!(std::ptr::eq(a, found));
    assert_eq!(found.instance.get(), Some(&42));
    // Instance 0 and the largest id are ordinary keys (the table stores id + 1).
    for id in [0, i64::MAX as u64] {
        assert!(table.find(id).is_none());
        let s = table.adopt(CallState::for_call(&cfg(id))).unwrap();
        assert!(std::ptr::eq(s, table.find(id).unwrap()));
        assert_eq!(s.config.instance, id);
    }
}

#[test]
fn threads_adopting_one_instance_share_one_state() {
    let table: &'static Adopted<()> = Box::leak(Box::new(Adopted::new()));
    let states: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    (0..64)
                        .map(|i| table.adopt(CallState::for_call(&cfg(1000 + i))).unwrap() as *const _ as usize)
                        .sum()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(states.windows(2).all(|w| w[0] == w[1]), "every thread found the same 64 states");
    for i in 0..64 {
        assert_eq!(table.find(1000 + i).unwrap().config.instance, 1000 + i);
    }
}

#[test]
fn a_full_table_is_an_error_naming_the_call() {
    let table: Adopted<()> = Adopted::new();
    for i in 0..ADOPTED_CALLS as u64 {
        table.adopt(CallState::for_call(&cfg(i * 7919))).unwrap();
    }
    let e = table.adopt(CallState::for_call(&CustomCallConfig { name: "one-too-many".into(), ..cfg(1) })).unwrap_err();
    assert!(e.to_string().contains("one-too-many") && e.to_string().contains("no FFI state"), "{e}");
    // Every adopted state is still found.
    assert_eq!(table.find(5 * 7919).unwrap().config.instance, 5 * 7919);
    assert!(table.find(1).is_none());
}
