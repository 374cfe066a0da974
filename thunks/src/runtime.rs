//! What Peerless's FFI handlers take from the running process rather than the compiled module, so a module from a
//! persistent compilation cache runs correctly in another run: the job's token ([`set_job`], [`job`]), a shared
//! instance's occurrence ([`next_occurrence`], [`shared_key`]; SPMD processes load executables in one order, so every
//! process counts alike) and the decisions of executables compiled elsewhere ([`instantiated`], [`reported`],
//! [`take_decisions`]). Decision lines are the pass's report format: tab-separated op, instruction, dtypes, bytes,
//! groups, kernel (1/0), implementation, reason; [`take_decisions`] puts the platform first.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError, RwLock};

use crate::custom_call::CustomCallConfig;

static JOB: RwLock<Option<String>> = RwLock::new(None);

/// Whether `token` can name a job's shared memory: 8 to 64 hex digits.
pub fn valid_job(token: &str) -> bool {
    (8..=64).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Sets the running job's token (the Python package learns it through JAX's key-value store; `None`: not in a
/// multi-process job). A token that cannot name shared memory is an error.
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

/// The running job's token for `call` (a group across processes), or an error that says why there is none and what to
/// do.
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

static OCCURRENCES: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

/// How many times this process instantiated `instance` before (0 the first time).
pub fn next_occurrence(instance: u64) -> u64 {
    let mut m = OCCURRENCES.lock().unwrap_or_else(PoisonError::into_inner);
    let n = m.entry(instance).or_insert(0);
    *n += 1;
    *n - 1
}

/// The id a group across processes meets under: `instance` for an executable's first instantiation, a hash of both
/// after (the same in every process).
pub fn shared_key(instance: u64, occurrence: u64) -> u64 {
    if occurrence == 0 {
        return instance;
    }
    stable_hash((instance, occurrence))
}

/// A hash of `x` that every process of one build computes alike (SipHash with fixed keys), as a non-negative int64.
pub fn stable_hash(x: impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    x.hash(&mut h);
    h.finish() & (i64::MAX as u64)
}

/// Decision lines kept at most (a process without the Python package never collects them).
const KEPT: usize = 100_000;

struct Book {
    /// Instances whose decisions the pass reported in this process, not yet instantiated.
    reported: BTreeMap<u64, u64>,
    /// Decision lines of executables this process did not compile, not yet collected.
    lines: VecDeque<String>,
}

static BOOK: Mutex<Book> = Mutex::new(Book { reported: BTreeMap::new(), lines: VecDeque::new() });

/// The pass reported (to `stats()`) the decisions of the calls it wrote with `instances`: their instantiation registers
/// nothing more.
pub fn reported(instances: impl IntoIterator<Item = u64>) {
    let mut b = BOOK.lock().unwrap_or_else(PoisonError::into_inner);
    for i in instances {
        *b.reported.entry(i).or_insert(0) += 1;
    }
}

/// At INSTANTIATE on `platform` ("cpu", "cuda"): registers `call`'s decision lines, unless the pass reported them in
/// this process (then it only forgets that mark). Returns whether it registered.
pub fn instantiated(platform: &str, call: &CustomCallConfig) -> bool {
    let mut b = BOOK.lock().unwrap_or_else(PoisonError::into_inner);
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

/// Takes the decision lines registered since the last call, one per line, each led by its platform and a tab.
pub fn take_decisions() -> String {
    let mut b = BOOK.lock().unwrap_or_else(PoisonError::into_inner);
    b.lines.drain(..).map(|l| l + "\n").collect()
}

/// Where Peerless keeps files between processes (compiled kernels, tuning profiles, the peer probe):
/// `PEERLESS_CACHE_DIR`, else `$XDG_CACHE_HOME/peerless`, else `~/.cache/peerless`.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let env = std::env::var_os;
    env("PEERLESS_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| env("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("peerless")))
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache").join("peerless")))
}
