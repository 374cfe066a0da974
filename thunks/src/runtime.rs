//! What Peerless's FFI handlers take from the process they run in rather than from the
//! compiled module, so that a module compiled by one run (and kept in a persistent
//! compilation cache) runs correctly in another:
//!
//! - the job's token (`jax.distributed`), which names the shared memory of groups across
//!   processes: the running job's ([`set_job`], [`job`]), never the compiling one's;
//! - which executable a group across processes belongs to: its `instance` is the same in
//!   every process and run (it hashes the module and the instruction), so the how-manyth
//!   instantiation of that instance in this process tells two executables of one module
//!   apart ([`next_occurrence`], [`shared_key`]); SPMD processes load the same executables
//!   in the same order, so every process counts alike;
//! - the pass's decisions for executables this process did not compile (a cache hit):
//!   every Peerless custom call carries its decision lines, registered when XLA
//!   instantiates it ([`instantiated`]) unless the pass reported them in this process
//!   ([`reported`]); `stats()` collects them with [`take_decisions`].
//!
//! Decision lines are the pass's report format: op, instruction, dtypes, bytes, groups,
//! kernel (1/0), implementation, reason, tab-separated, one per line; [`take_decisions`]
//! puts the platform first.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError, RwLock};

use crate::custom_call::CustomCallConfig;

static JOB: RwLock<Option<String>> = RwLock::new(None);

/// Whether `token` can name a job's shared memory: 8 to 64 hex digits.
pub fn valid_job(token: &str) -> bool {
    (8..=64).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Sets the running job's token (the Python package learns it through JAX's key-value store;
/// `None`: not in a multi-process job). A token that cannot name shared memory is an error.
pub fn set_job(token: Option<&str>) -> Result<(), String> {
    if let Some(t) = token
        && !valid_job(t)
    {
        return Err(format!("job token '{t}' is not 8 to 64 hex digits"));
    }
    *JOB.write().unwrap_or_else(PoisonError::into_inner) = token.map(str::to_owned);
    Ok(())
}

/// The running job's token, if this process is in a multi-process job that told us.
pub fn job() -> Option<String> {
    JOB.read().unwrap_or_else(PoisonError::into_inner).clone()
}

/// The running job's token for `call` (a group across processes), or an error that says why
/// there is none and what to do.
pub fn job_for(call: &CustomCallConfig) -> Result<String, String> {
    job().ok_or_else(|| {
        format!(
            "{} '{}' spans processes, but this process knows no job token (the Python package \
             learns it from jax.distributed when it first compiles or looks up a program: \
             enable Peerless after jax.distributed.initialize() and compile through JAX)",
            call.target(),
            call.name
        )
    })
}

fn occurrences() -> &'static Mutex<BTreeMap<u64, u64>> {
    static MAP: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());
    &MAP
}

/// How many times this process instantiated `instance` before (0 the first time).
pub fn next_occurrence(instance: u64) -> u64 {
    let mut m = occurrences().lock().unwrap_or_else(PoisonError::into_inner);
    let n = m.entry(instance).or_insert(0);
    *n += 1;
    *n - 1
}

/// The id a group across processes meets under: `instance` for an executable's first
/// instantiation, a hash of both after (the same in every process).
pub fn shared_key(instance: u64, occurrence: u64) -> u64 {
    if occurrence == 0 {
        return instance;
    }
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same value in every process of one build.
    let mut h = std::hash::DefaultHasher::new();
    (instance, occurrence).hash(&mut h);
    h.finish() & (i64::MAX as u64)
}

/// Decision lines kept at most (a process without the Python package never collects them).
const KEPT: usize = 100_000;

#[derive(Default)]
struct Book {
    /// Instances whose decisions the pass reported in this process, not yet instantiated.
    reported: BTreeMap<u64, u64>,
    /// Decision lines of executables this process did not compile, not yet collected.
    lines: VecDeque<String>,
}

fn book() -> &'static Mutex<Book> {
    static BOOK: std::sync::OnceLock<Mutex<Book>> = std::sync::OnceLock::new();
    BOOK.get_or_init(Default::default)
}

/// The pass reported (to `stats()`) the decisions of the calls it wrote with `instances`:
/// their instantiation registers nothing more.
pub fn reported(instances: impl IntoIterator<Item = u64>) {
    let mut b = book().lock().unwrap_or_else(PoisonError::into_inner);
    for i in instances {
        *b.reported.entry(i).or_insert(0) += 1;
    }
}

/// At INSTANTIATE on `platform` ("cpu", "cuda"): registers `call`'s decision lines, unless
/// the pass reported them in this process (then it only forgets that mark). Returns whether
/// it registered.
pub fn instantiated(platform: &str, call: &CustomCallConfig) -> bool {
    let mut b = book().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(n) = b.reported.get_mut(&call.instance) {
        *n -= 1;
        if *n == 0 {
            b.reported.remove(&call.instance);
        }
        return false;
    }
    for line in call.decisions.lines().filter(|l| !l.trim().is_empty()) {
        if b.lines.len() == KEPT {
            b.lines.pop_front();
        }
        b.lines.push_back(format!("{platform}\t{line}"));
    }
    true
}

/// Takes the decision lines registered since the last call, one per line, each led by its
/// platform and a tab.
pub fn take_decisions() -> String {
    let mut b = book().lock().unwrap_or_else(PoisonError::into_inner);
    let mut out = String::new();
    for l in b.lines.drain(..) {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CollectiveKind, KernelAlgorithm};

    fn call(instance: u64, decisions: &str) -> CustomCallConfig {
        CustomCallConfig {
            kind: CollectiveKind::AllGather,
            algorithm: KernelAlgorithm::DirectAllGather,
            groups: vec![vec![0, 1]],
            pairs: vec![],
            reduction: None,
            dimension: Some(0),
            layout: None,
            num_devices: 2,
            instance,
            timeout_ms: 1,
            name: "ag".into(),
            processes: vec![0, 1],
            decisions: decisions.into(),
            slot: None,
            slot_bytes: 0,
            slot_gpu_bytes: 0,
            order_operands: 0,
            epilogue: None,
        }
    }

    #[test]
    fn jobs_are_validated() {
        assert!(set_job(Some("xyz")).unwrap_err().contains("hex"));
        set_job(Some("0123abcd")).unwrap();
        assert_eq!(job_for(&call(1, "")).unwrap(), "0123abcd");
        set_job(None).unwrap();
        assert!(job_for(&call(1, "")).unwrap_err().contains("knows no job token"));
        assert!(valid_job("0123abcd") && !valid_job("0123abc") && !valid_job(&"a".repeat(65)));
    }

    #[test]
    fn occurrences_count_per_instance_and_keys_differ() {
        let i = 0x5eed_0001;
        assert_eq!(next_occurrence(i), 0);
        assert_eq!(next_occurrence(i + 1), 0);
        assert_eq!(next_occurrence(i), 1);
        assert_eq!(shared_key(i, 0), i);
        assert_ne!(shared_key(i, 1), i);
        assert_ne!(shared_key(i, 1), shared_key(i, 2));
        assert!(shared_key(i, 1) <= i64::MAX as u64);
    }

    #[test]
    fn decisions_register_once_unless_the_pass_reported_them() {
        let line = "all-gather\tag\tf32\t8\t{{0,1}}\t1\tkernel (direct all-gather)\twhy";
        let fallback = "all-reduce\tar\tf32\t8\t{{0}}\t0\tfallback\tgroups of one";
        // Reported by this process's pass: its instantiation adds nothing, a second one (an
        // executable loaded from a cache) does.
        reported([0x5eed_0100]);
        assert!(!instantiated("cpu", &call(0x5eed_0100, line)));
        assert!(instantiated("cpu", &call(0x5eed_0100, &format!("{line}\n{fallback}\n"))));
        let got = take_decisions();
        assert!(got.contains(&format!("cpu\t{line}\ncpu\t{fallback}\n")), "{got}");
        assert!(!take_decisions().contains(line));
    }
}
