//! Per-device host threads that enqueue work on every GPU of a clique at once.
//!
//! Why: a graph launch costs the host about 2 µs, so one thread launching a small collective
//! on four GPUs one after another spends ~8 µs per call, longer than the kernels. With one
//! thread per device the host cost per call is one launch plus a hand-off. The hand-off must
//! take well under a microsecond, so workers spin on a generation counter for a while after
//! each job (back-to-back calls find them awake) and only then sleep on a condition variable.
//! A general-purpose pool (rayon) wakes sleeping workers through the OS and gives no bound on
//! that latency; this is the one place that needs it, so it is written here.
//!
//! The caller's thread does device 0's work itself; worker `i` does device `i + 1`'s.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

type Job = &'static (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped once per job; a worker runs each generation once.
    generation: AtomicU64,
    job: Mutex<Option<Job>>,
    /// Workers that finished the current generation.
    done: AtomicUsize,
    /// Workers asleep (or about to sleep) on `wake`.
    sleepers: AtomicUsize,
    wake: Condvar,
    quit: AtomicBool,
}

/// One host thread per device but the first; see the module docs.
pub struct Launcher {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One job at a time (the caller waits for the workers before returning).
    busy: Mutex<()>,
}

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launcher").field("workers", &self.workers.len()).finish()
    }
}

impl Launcher {
    /// A launcher for `devices` devices (`devices - 1` threads). A thread that cannot be
    /// spawned leaves the launcher with fewer workers, which run the remaining devices' work
    /// on the caller's thread (slower, still correct).
    pub fn new(devices: usize) -> Launcher {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            done: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            wake: Condvar::new(),
            quit: AtomicBool::new(false),
        });
        let mut workers = Vec::new();
        for i in 1..devices {
            let s = shared.clone();
            match std::thread::Builder::new().name(format!("peerless-launch-{i}")).spawn(move || worker(&s, i)) {
                Ok(h) => workers.push(h),
                Err(e) => {
                    log::warn!("launcher thread for device {i}: {e}; that device's launches run on the caller");
                    break;
                }
            }
        }
        Launcher { shared, workers, busy: Mutex::new(()) }
    }

    /// Runs `f(d)` for every device `d < devices`, devices with a worker on that worker and
    /// the others on this thread, and returns once every call has returned. The first error
    /// (lowest device) is returned; a panic in `f` becomes an error.
    pub fn run<E: Send>(
        &self,
        devices: usize,
        f: impl Fn(usize) -> Result<(), E> + Sync,
    ) -> Result<(), LaunchError<E>> {
        let _one = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let results: Vec<Mutex<Option<LaunchError<E>>>> = (0..devices).map(|_| Mutex::new(None)).collect();
        let call = |d: usize| {
            if d >= devices {
                return;
            }
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(d)));
            let err = match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(LaunchError::Failed(e)),
                Err(p) => Some(LaunchError::Panicked(panic_text(p.as_ref()))),
            };
            *results[d].lock().unwrap_or_else(|e| e.into_inner()) = err;
        };
        let workers = self.workers.len().min(devices.saturating_sub(1));
        if workers > 0 {
            let job: &(dyn Fn(usize) + Sync) = &call;
            // SAFETY: the reference is only lifetime-extended, never outlives this call: it is
            // cleared from `job` below, after every worker has reported it finished with it
            // (`done` counts workers that returned from the job; the wait below cannot be
            // skipped, `call` does not unwind because it catches panics, and workers running
            // a device >= `devices` return at once).
            let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(job) };
            *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
            self.shared.done.store(0, Ordering::SeqCst);
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
            if self.shared.sleepers.load(Ordering::SeqCst) > 0 {
                let _g = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
                self.shared.wake.notify_all();
            }
        }
        call(0);
        for d in workers + 1..devices {
            call(d);
        }
        if workers > 0 {
            while self.shared.done.load(Ordering::SeqCst) < self.workers.len() {
                std::hint::spin_loop();
            }
            *self.shared.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        for r in results {
            if let Some(e) = r.into_inner().unwrap_or_else(|e| e.into_inner()) {
                return Err(e);
            }
        }
        Ok(())
    }
}

/// Why a device's launch failed.
#[derive(Debug)]
pub enum LaunchError<E> {
    Failed(E),
    Panicked(String),
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        // Spin, then sleep, until a new generation (or quit).
        let mut since = Instant::now();
        let mut spins = 0u32;
        let generation = loop {
            if s.quit.load(Ordering::SeqCst) {
                return;
            }
            let g = s.generation.load(Ordering::SeqCst);
            if g != seen {
                break g;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && since.elapsed() > SPIN {
                let mut guard = s.job.lock().unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.generation.load(Ordering::SeqCst) == seen && !s.quit.load(Ordering::SeqCst) {
                    guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(guard);
                since = Instant::now();
            }
            std::hint::spin_loop();
        };
        seen = generation;
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = job {
            f(index);
        }
        s.done.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.job.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_device_runs_once_per_call_and_errors_come_back() {
        let l = Launcher::new(4);
        let hits: Vec<AtomicU32> = (0..4).map(|_| AtomicU32::new(0)).collect();
        for round in 0..2000u32 {
            if round == 1000 {
                // Long enough for every worker to fall asleep: they must wake up.
                std::thread::sleep(Duration::from_millis(5));
            }
            l.run(4, |d| -> Result<(), ()> {
                hits[d].fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .unwrap();
        }
        assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 2000));
        // Fewer devices than workers: the extra worker does nothing.
        l.run(2, |d| -> Result<(), ()> {
            hits[d].fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        assert_eq!(hits[2].load(Ordering::SeqCst), 2000);
        assert_eq!(hits[1].load(Ordering::SeqCst), 2001);
        // The lowest failing device's error; a panic is an error, not an unwind.
        let r = l.run(4, |d| if d >= 2 { Err(d) } else { Ok(()) });
        assert!(matches!(r, Err(LaunchError::Failed(2))));
        let r = l.run(4, |d| -> Result<(), ()> {
            if d == 3 {
                panic!("boom");
            }
            Ok(())
        });
        assert!(matches!(r, Err(LaunchError::Panicked(ref s)) if s == "boom"));
        // More devices than threads: the rest run on the caller.
        let l1 = Launcher::new(1);
        let n = AtomicU32::new(0);
        l1.run(3, |_| -> Result<(), ()> {
            n.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 3);
    }
}
