//! The host protocol within one process: XLA:CPU runs each device's program on its own thread in one address space, so
//! peer access is a pointer. Each rewritten collective ([`DirectCollective`]) runs [`super::protocol`] on a
//! [`DirectSlot`] (per member two staging buffers and flag words; per group a mutex and a condition variable, since 8
//! device threads may share 2 cores); a barrier is decided under the mutex. The two-shot runs in place between barriers
//! 0 and 1. Several collectives may share a slot ([`DirectCollective::on_slot`]). ARCHITECTURE.md ("Host protocol").

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use hlo::ArrayShape;
use thunks::custom_call::CustomCallConfig;

use super::protocol::{self, Place, Plan, Region, Word};
use crate::{Error, Result};

/// A zeroed, 64-byte aligned allocation.
struct Staging(Region);

/// Staging bytes held by the process's direct collectives now (`peerless.staging_bytes()`).
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Bytes of staging the direct collectives of this process hold now.
pub fn staging_bytes() -> usize {
    HELD.load(Ordering::Relaxed)
}

impl Staging {
    fn new(len: usize) -> Result<Self> {
        let alloc = || Error::Alloc { num_devices: 1, arena_bytes: len };
        let ptr = if len == 0 {
            NonNull::<u64>::dangling().cast()
        } else {
            let layout = Layout::from_size_align(len, 64).map_err(|_| alloc())?;
            // SAFETY: `layout` has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or_else(alloc)?;
            HELD.fetch_add(len, Ordering::Relaxed);
            ptr
        };
        // SAFETY: a fresh allocation of `len` bytes aligned to 64 (or nothing to reach, for 0 bytes), freed only in
        // Drop, reached only through the region.
        Ok(Staging(unsafe { Region::new(ptr, len) }))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let len = self.0.len();
        if len > 0 {
            // SAFETY: allocated in `new` with this size and alignment, freed once.
            unsafe { dealloc(self.0.ptr().as_ptr(), Layout::from_size_align_unchecked(len, 64)) };
            HELD.fetch_sub(len, Ordering::Relaxed);
        }
    }
}

/// A group's barrier state, under its mutex.
#[derive(Debug)]
struct Flags {
    /// `arrived[p][i]`: the latest epoch member `i` arrived at barrier `p` in.
    arrived: [Vec<u64>; 2],
    /// The latest epoch a timeout broke (0: none), and the ranks missing then.
    broken: u64,
    missing: Vec<usize>,
    /// Two-shot: each member's operands and results (address, length), published before barrier 0.
    inputs: Vec<Vec<(usize, usize)>>,
    outputs: Vec<Vec<(usize, usize)>>,
}

/// One group: its members (device ids, in group order), their staging and flag words, and where they meet.
struct Group {
    members: Vec<usize>,
    staging: Vec<[Staging; 2]>,
    /// Per member, its words ([`Word`] order).
    words: Vec<[AtomicU64; 4]>,
    flags: Mutex<Flags>,
    wake: Condvar,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, Flags> {
        self.flags.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `ready(flags)` or the deadline (none: no limit); `Err` on timeout.
    fn wait_until<'a>(
        &'a self,
        mut g: MutexGuard<'a, Flags>,
        deadline: Option<Instant>,
        mut ready: impl FnMut(&Flags) -> bool,
    ) -> Result<MutexGuard<'a, Flags>, MutexGuard<'a, Flags>> {
        while !ready(&g) {
            g = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(g);
                    }
                    self.wake.wait_timeout(g, left).unwrap_or_else(PoisonError::into_inner).0
                }
                None => self.wake.wait(g).unwrap_or_else(PoisonError::into_inner),
            };
        }
        Ok(g)
    }
}

/// Staging (two buffers per member), flags and epochs of a set of groups: what one collective, or a chain of
/// collectives that every member runs in one order, meets in.
pub struct DirectSlot {
    groups: Vec<Group>,
    /// Bytes of each staging buffer.
    per_buffer: usize,
}

impl std::fmt::Debug for DirectSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectSlot")
            .field("groups", &self.groups.iter().map(|g| &g.members).collect::<Vec<_>>())
            .field("per_buffer", &self.per_buffer)
            .finish()
    }
}

impl DirectSlot {
    /// A slot for `groups` (device ids; a permute's: every device) with staging buffers of `per_buffer` bytes, zeroed;
    /// epochs start at 0.
    pub fn new(groups: &[Vec<usize>], per_buffer: usize) -> Result<Self> {
        let groups = groups
            .iter()
            .map(|members| {
                let n = members.len();
                let staging = members
                    .iter()
                    .map(|_| Ok([Staging::new(per_buffer)?, Staging::new(per_buffer)?]))
                    .collect::<Result<Vec<_>>>()?;
                Ok(Group {
                    members: members.clone(),
                    staging,
                    words: (0..n).map(|_| Default::default()).collect(),
                    flags: Mutex::new(Flags {
                        arrived: [vec![0; n], vec![0; n]],
                        broken: 0,
                        missing: vec![],
                        inputs: vec![vec![]; n],
                        outputs: vec![vec![]; n],
                    }),
                    wake: Condvar::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DirectSlot { groups, per_buffer })
    }

    /// Bytes of each staging buffer.
    pub fn per_buffer(&self) -> usize {
        self.per_buffer
    }

    /// Staging bytes the slot holds (every member's two buffers).
    pub fn bytes(&self) -> usize {
        self.groups.iter().map(|g| g.members.len()).sum::<usize>().saturating_mul(2 * self.per_buffer)
    }

    fn same_groups(&self, groups: &[Vec<usize>]) -> bool {
        self.groups.len() == groups.len() && self.groups.iter().zip(groups).all(|(g, m)| &g.members == m)
    }
}

impl Place for DirectSlot {
    const IN_PLACE: bool = true;

    fn word(&self, gi: usize, k: usize, w: Word) -> &AtomicU64 {
        &self.groups[gi].words[k][w as usize]
    }

    fn staged(&self, gi: usize, k: usize, par: usize, at: usize, len: usize) -> &[u8] {
        self.groups[gi].staging[k][par].0.read(at, len)
    }

    fn stage(&self, gi: usize, k: usize, par: usize, at: usize, len: usize) -> &mut [u8] {
        self.groups[gi].staging[k][par].0.write(at, len)
    }

    fn barrier(&self, plan: &Plan, gi: usize, idx: usize, p: usize, e: u64, deadline: Option<Instant>) -> Result<()> {
        let group = &self.groups[gi];
        let broken = |f: &Flags| plan.timeout_error(&group.members, group.members[idx], f.missing.clone());
        let mut f = group.lock();
        if f.broken >= e {
            return Err(broken(&f));
        }
        f.arrived[p][idx] = e;
        let ready = |f: &Flags| f.broken >= e || f.arrived[p].iter().all(|&a| a >= e);
        if ready(&f) {
            drop(f);
            group.wake.notify_all();
            return Ok(());
        }
        match group.wait_until(f, deadline, ready) {
            Ok(f) if f.broken < e => Ok(()),
            Ok(f) => Err(broken(&f)),
            Err(mut f) => {
                f.broken = f.broken.max(e);
                f.missing =
                    (f.arrived[p].iter().enumerate()).filter(|(_, a)| **a < e).map(|(k, _)| group.members[k]).collect();
                let err = broken(&f);
                drop(f);
                group.wake.notify_all();
                Err(err)
            }
        }
    }

    fn wait(&self, gi: usize, deadline: Instant, mut ready: impl FnMut() -> bool) -> bool {
        let group = &self.groups[gi];
        group.wait_until(group.lock(), Some(deadline), |_| ready()).is_ok()
    }

    fn wake(&self, gi: usize) {
        // Taking the lock orders the change before any waiter's next look (it looks holding the lock), so no wake-up is
        // lost.
        drop(self.groups[gi].lock());
        self.groups[gi].wake.notify_all();
    }

    fn publish(&self, gi: usize, idx: usize, ins: Vec<(usize, usize)>, outs: Vec<(usize, usize)>) {
        let mut f = self.groups[gi].lock();
        f.inputs[idx] = ins;
        f.outputs[idx] = outs;
    }

    fn published(&self, gi: usize) -> (Vec<Vec<(usize, usize)>>, Vec<Vec<(usize, usize)>>) {
        let f = self.groups[gi].lock();
        (f.inputs.clone(), f.outputs.clone())
    }
}

/// One rewritten collective of an executable, shared by the device threads that run it: its plan, on a slot of its own
/// or shared with the collectives it is chained with.
pub struct DirectCollective {
    plan: Plan,
    slot: Arc<DirectSlot>,
}

impl std::fmt::Debug for DirectCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectCollective")
            .field("op", &self.plan.op)
            .field("algorithm", &self.plan.algorithm)
            .field("name", &self.plan.name)
            .finish_non_exhaustive()
    }
}

impl DirectCollective {
    /// The collective of `call` (groups and pairs are device ids below `num_devices`) on operands of the given
    /// (logical) shapes, on the slot `slot(groups, bytes)` returns for its groups (device ids) and staged bytes: a new
    /// one, or one shared with the collectives every member runs in order with this one (the caller's promise, on which
    /// the protocol's correctness rests). The slot must have exactly these groups and buffers of at least `bytes`.
    pub fn on_slot(
        call: &CustomCallConfig,
        shapes: &[ArrayShape],
        num_devices: usize,
        slot: impl FnOnce(&[Vec<usize>], usize) -> Result<Arc<DirectSlot>>,
    ) -> Result<Self> {
        let plan = Plan::new(call, shapes, num_devices)?;
        // Staging holds each operand at `stage` (the two-shot, which works in XLA's buffers, leaves its share of a slot
        // it may have with other collectives unused).
        let memory = |source| Error::Memory { collective: plan.name.clone(), op: plan.op, source: Box::new(source) };
        let slot = slot(&plan.group_members, plan.per_buffer).map_err(memory)?;
        if !slot.same_groups(&plan.group_members) || slot.per_buffer < plan.per_buffer {
            return Err(plan.invalid(
                0,
                format!(
                    "its staging slot ({:?}) does not fit its groups {:?} and {} staged bytes",
                    slot, plan.group_members, plan.per_buffer
                ),
            ));
        }
        Ok(DirectCollective { plan, slot })
    }

    /// Bytes each result buffer must have (for the caller's checks).
    pub fn output_lens(&self) -> Vec<usize> {
        self.plan.output_lens()
    }

    /// Runs device `device`'s side of one call: `inputs` are its operands, `outputs` its result buffers (XLA's), in
    /// operand order.
    pub fn run(&self, device: usize, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        protocol::run(&self.plan, &*self.slot, device, inputs, outputs)
    }
}
