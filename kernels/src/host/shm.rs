//! The host protocols between the processes of one host, over POSIX shared memory: what
//! XLA:CPU's FFI handlers run when a group spans devices of several processes
//! (`jax.distributed`, e.g. 2 processes × 4 CPU devices).
//!
//! [`ShmCollective`] is the cross-process analogue of [`super::direct::DirectCollective`]:
//! the same plan (operands, groups, staging layout and the computation of results, shared
//! code), the same per-member epochs, double buffering and timeout semantics. Only where
//! members meet differs: each collective instance has one shared segment, which every
//! process owning a member device maps; members meet through atomics in it, and peers'
//! operands are read from their staging buffers in it (another process's XLA buffers are
//! out of reach).
//!
//! # Segment
//!
//! Named `/peerless-{job}-{instance:016x}`: the job's unguessable token (hex, from its
//! distributed KV store) and a per-collective key every process derives identically
//! ([`ShmKey`]). Collectives of one pass-assigned slot (issue 25: same groups or pairs,
//! chained by data dependencies, so every member runs them in one order) share one segment
//! ([`ShmCollective::on_slot`]), keyed by the slot and mapped once per process, with staging
//! buffers of the slot's size; the argument below is about the sequence of calls on a
//! segment, whichever collective each is. Created `0600`. Layout, every part 64-byte aligned:
//!
//! - header: magic, layout version, total size, a fingerprint of the plan, and the
//!   `attached` word (processes that attached, those still attached, closed);
//! - per group: two decision words, by epoch parity;
//! - per member: its flags (epoch, finished, arrived; posted and consumed for a permute)
//!   and two "missing members" masks, by epoch parity;
//! - per member: two staging buffers of the plan's staging size, by epoch parity.
//!
//! # Protocol (member `i` of a group, epoch `e`)
//!
//! 1. `e` = its epoch counter + 1 (a word of the segment only its owner writes, never reset);
//! 2. wait until every member finished epoch `e - 2` (then nobody reads buffer `e % 2`);
//! 3. copy the operands into its staging buffer `e % 2`; store `arrived[i] = e` (Release);
//! 4. wait for epoch `e`'s decision, in the group's decision word `e % 2`: a member that
//!    sees every `arrived[k] >= e` (Acquire) swaps in "e complete"; a member whose deadline
//!    passes first writes the members it misses into its mask and swaps in "e broken by i".
//!    One compare-and-swap decides, so every member of the epoch, including one that comes
//!    later, gets the same outcome (`direct.rs` decides under its mutex);
//! 5. complete: compute its results from the members' staging buffers `e % 2`, folding
//!    members in group order (`Plan::compute`, the code `direct.rs` runs); broken: fail
//!    with the timeout error naming the breaker's missing members;
//! 6. store `finished[i] = e` (Release), however the call ended.
//!
//! The two-shot all-reduce runs as the one-shot here: its second shot reads peers'
//! operands in place, which lie in other processes' memory. The one-shot folds the same
//! members in the same order for every element, so its results are the same bits.
//! A collective-permute follows `direct.rs`: a source waits until its target consumed
//! epoch `e - 2`, stages and posts `e`; its target waits for the post, copies, and marks
//! it consumed (also when it gives up); devices without a peer never touch the segment.
//!
//! Why one barrier suffices is `direct.rs`'s double-buffering argument: a member writes
//! buffer `e % 2` again only at epoch `e + 2`, after step 2 saw every member finish `e`.
//! The same argument covers the decision words and masks of parity `e % 2`: a member
//! decides epoch `e + 2` only after that step too, so nobody still deciding `e` can see
//! them change. Acquire/Release pairs order staging writes before the reads they enable.
//!
//! Waits spin briefly, then yield, then sleep with a growing backoff (at most 1 ms), and
//! end at the call's deadline: the error names the collective, the waiting device, its
//! group and the devices that never came, and breaks that epoch for everyone in it, as in
//! `direct.rs`; the next epoch starts clean.
//!
//! # Lifecycle, cleanup and isolation
//!
//! [`ShmCollective::new`] opens the segment (`O_CREAT`, sized by whoever finds it empty),
//! checks its size (another size: [`Error::Invalid`], the segment belongs to
//! another collective), reserves its pages (a full `/dev/shm` is an error now, not a
//! `SIGBUS` later), maps it, checks the header (set by the first to come; a different
//! magic, version, size or plan is `Invalid` too), and counts itself in `attached`. The
//! process whose attach completes the count of participating processes unlinks the name:
//! from then on the segment lives only as long as some process maps it, so a crash leaves
//! nothing in `/dev/shm`. Timeouts unlink too (a process that never attaches makes the
//! others time out, and the name goes with them; a process attaching after a peer gave
//! up gets a fresh segment and times out in turn). `Drop` unmaps, and unlinks only when it
//! is the last attached process to leave while some participant never came: a process
//! whose groups are done may not take the name from a slow process of another group that
//! still has peers waiting for it in the segment. That last process closes the segment in
//! the same atomic step that counts it out, so a process that opened the name just before
//! the unlink sees it closed and opens a fresh one instead of waiting alone. A process
//! that owns no participating device maps nothing.
//!
//! The segment is the only thing processes share. Only processes of the same user can open
//! it, and only while it has a name; the job token keeps other jobs from guessing it. The
//! protocol trusts the processes of its job: one that writes the segment outside the
//! protocol can corrupt its peers' results, as a device thread could in `direct.rs`.

use std::collections::BTreeSet;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hlo::ArrayShape;
use rustix::fs::{FallocateFlags, Mode};
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};
use thunks::{CollectiveConfig, CollectiveKind as Kind, KernelAlgorithm as Algo};

use super::direct::Plan;
use crate::{Error, Result};

/// Names a shared segment: unguessable job token (hex, from the job's distributed KV
/// store) + a per-collective key every process derives identically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmKey {
    pub job: String,
    pub instance: u64,
}

const MAGIC: u64 = u64::from_le_bytes(*b"PEERLSHM");
/// Bump when the layout or the protocol changes: processes of different versions then
/// refuse each other's segments instead of misreading them.
const VERSION: u64 = 1;

/// Header words (byte offsets).
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_SIZE: usize = 16;
const H_FINGERPRINT: usize = 24;
/// The `attached` word: processes that attached (bits 0-23), those of them still
/// attached (bits 24-47, "live"), and whether the last live one closed it (bit 63). One
/// word, so that an attach and the last detach cannot both win.
const H_ATTACHED: usize = 32;
const HEADER: usize = 64;
const ATTACHED: u64 = 1;
const LIVE: u64 = 1 << 24;
const COUNT: u64 = (1 << 24) - 1;
const CLOSED: u64 = 1 << 63;

/// A member's flag words (byte offsets in its 64-byte flag block).
const F_EPOCH: usize = 0;
const F_FINISHED: usize = 8;
const F_ARRIVED: usize = 16;
const F_POSTED: usize = 24;
const F_CONSUMED: usize = 32;
const FLAGS: usize = 64;

/// A decision word: `epoch << 16 | breaker << 2 | outcome` (48 bits of epoch: 2^48 calls).
const COMPLETE: u64 = 1;
const BROKEN: u64 = 2;
/// Members of a group, at most (the breaker's index has 14 bits).
const MAX_MEMBERS: usize = 1 << 14;

fn decision(e: u64, outcome: u64, breaker: usize) -> u64 {
    (e << 16) | ((breaker as u64) << 2) | outcome
}

/// The longest sleep of a wait.
const MAX_SLEEP: Duration = Duration::from_millis(1);

/// Where everything lies in the segment; every process computes the same from the plan.
#[derive(Debug)]
struct SegmentLayout {
    /// Per group: the index of its first member in the per-member tables, its two decision
    /// words, and the words of one mask.
    base: Vec<usize>,
    decisions: Vec<usize>,
    mask_words: Vec<usize>,
    /// Per member (groups one after another): its flags, its two masks, its two staging
    /// buffers (none: it stages nothing).
    flags: Vec<usize>,
    masks: Vec<usize>,
    staging: Vec<Option<usize>>,
    per_buffer: usize,
    size: usize,
}

/// Takes `n` bytes (rounded up to 64) at `at`; `None` on overflow.
fn take(at: &mut usize, n: usize) -> Option<usize> {
    let start = *at;
    *at = start.checked_add(n.checked_next_multiple_of(64)?)?;
    Some(start)
}

impl SegmentLayout {
    /// `stages(d)`: whether device `d` needs staging buffers, each of `per_buffer` bytes (at
    /// least the plan's).
    fn new(plan: &Plan, stages: impl Fn(usize) -> bool, per_buffer: usize) -> Option<Self> {
        let per_buffer = per_buffer.max(plan.per_buffer).checked_next_multiple_of(64)?;
        let mut at = HEADER;
        let mut l = SegmentLayout {
            base: vec![],
            decisions: vec![],
            mask_words: vec![],
            flags: vec![],
            masks: vec![],
            staging: vec![],
            per_buffer,
            size: 0,
        };
        for members in &plan.group_members {
            l.base.push(l.flags.len());
            l.decisions.push(take(&mut at, 16)?);
            let words = members.len().div_ceil(64);
            l.mask_words.push(words);
            for &d in members {
                l.flags.push(take(&mut at, FLAGS)?);
                l.masks.push(take(&mut at, words.checked_mul(16)?)?);
                l.staging.push(if stages(d) { Some(take(&mut at, per_buffer.checked_mul(2)?)?) } else { None });
            }
        }
        l.size = at;
        Some(l)
    }
}

/// A mapped segment. The protocol, not the type system, says who may touch which bytes
/// when.
struct Segment {
    ptr: NonNull<u8>,
    len: usize,
    name: String,
    /// Processes that attach in all.
    participants: u64,
    /// Counted in the `attached` word (before, the segment may be another's).
    attached: bool,
}

/// What a process found when it tried to join an open segment.
enum Join {
    /// Counted in; `true`: the last participant to come.
    Joined(bool),
    /// Its last process left and closed it: its name is about to go.
    Closed,
}

// SAFETY: `Segment` owns its mapping; its bytes are reached only through atomics (flag
// words) or under the protocol's rules (one writer per staging buffer per epoch, readers
// only after the decision that orders them after the write), so sharing it between device
// threads is sound.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Segment {
    /// Opens, checks, maps and attaches to segment `name` of `size` bytes;
    /// `participants` processes attach in all. `Err`: why not. A segment its last process
    /// closed (module docs) still has its name for a moment; this waits for the name to go,
    /// at most `patience`, and opens a fresh one.
    fn attach(
        name: &str,
        size: usize,
        fingerprint: u64,
        participants: u64,
        patience: Duration,
    ) -> Result<Segment, String> {
        let deadline = Instant::now() + patience;
        let mut backoff = Backoff::default();
        loop {
            let mut seg = Segment::open(name, size, fingerprint, participants)?;
            match seg.join() {
                Join::Joined(last) => {
                    seg.attached = true;
                    if last {
                        // Everyone has it mapped: the name has served its purpose.
                        seg.unlink();
                    }
                    return Ok(seg);
                }
                Join::Closed if Instant::now() >= deadline => {
                    return Err(format!("shared segment {name} was closed by its last process and keeps its name"));
                }
                Join::Closed => backoff.snooze(deadline),
            }
        }
    }

    /// Opens, checks and maps segment `name` (not yet counted in).
    fn open(name: &str, size: usize, fingerprint: u64, participants: u64) -> Result<Segment, String> {
        let flags = rustix::shm::OFlags::CREATE | rustix::shm::OFlags::RDWR;
        let fd = rustix::shm::open(name, flags, Mode::RUSR | Mode::WUSR)
            .map_err(|e| format!("shm_open of shared segment {name}: {e}"))?;
        let bytes = |fd| rustix::fs::fstat(fd).map(|s| s.st_size).map_err(|e| format!("fstat of {name}: {e}"));
        let want = size as u64;
        // Whoever finds it empty sizes it (several may, to the same size).
        let created = bytes(&fd)? == 0;
        if created {
            rustix::fs::ftruncate(&fd, want).map_err(|e| format!("ftruncate of {name} to {size} bytes: {e}"))?;
        }
        let have = bytes(&fd)?;
        if u64::try_from(have).ok() != Some(want) {
            return Err(format!(
                "shared segment {name} has {have} bytes where this collective needs {size}: it belongs to \
                 another collective"
            ));
        }
        // Reserve the pages now: tmpfs past its limit would raise SIGBUS on a later write.
        match rustix::fs::fallocate(&fd, FallocateFlags::empty(), 0, want) {
            Ok(()) | Err(Errno::OPNOTSUPP | Errno::NOSYS) => {}
            Err(e) => {
                if created {
                    unlink(name);
                }
                return Err(format!(
                    "cannot reserve {size} bytes for shared segment {name} in /dev/shm: {e} (containers \
                     often limit /dev/shm: docker --shm-size)"
                ));
            }
        }
        // SAFETY: a new shared mapping of `size` bytes (the object's size, checked above) at
        // an address the kernel picks, so it aliases no Rust memory; unmapped only in Drop.
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), size, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0)
        }
        .map_err(|e| format!("mmap of {size} bytes of {name}: {e}"))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| format!("mmap of {name} returned null"))?;
        // The descriptor closes here; the mapping keeps the object.
        drop(fd);
        let seg = Segment { ptr, len: size, name: name.to_string(), participants, attached: false };
        // Each header word is set by whoever comes first and must match for everyone else.
        for (at, value, what) in [
            (H_MAGIC, MAGIC, "magic"),
            (H_VERSION, VERSION, "layout version"),
            (H_SIZE, want, "size"),
            (H_FINGERPRINT, fingerprint, "plan fingerprint"),
        ] {
            match seg.word(at).compare_exchange(0, value, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {}
                Err(v) if v == value => {}
                Err(v) => {
                    return Err(format!(
                        "shared segment {name} belongs to another collective (its {what} is {v:#x}, not {value:#x})"
                    ));
                }
            }
        }
        Ok(seg)
    }

    /// Counts this process in, unless the segment is closed.
    fn join(&self) -> Join {
        let word = self.word(H_ATTACHED);
        let mut v = word.load(Ordering::Acquire);
        loop {
            if v & CLOSED != 0 {
                return Join::Closed;
            }
            match word.compare_exchange(v, v + ATTACHED + LIVE, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => v = now,
            }
        }
        let attached = (v & COUNT) + 1;
        if attached > self.participants {
            log::warn!("shared segment {}: {attached} attachments for {} processes", self.name, self.participants);
        }
        Join::Joined(attached == self.participants)
    }

    /// Counts this process out; `true`: it was the last, some participant never came, and
    /// it closed the segment (then it unlinks the name).
    fn leave(&self) -> bool {
        let word = self.word(H_ATTACHED);
        let mut v = word.load(Ordering::Acquire);
        loop {
            if (v / LIVE) & COUNT == 0 {
                return false;
            }
            let mut next = v - LIVE;
            let close = (next / LIVE) & COUNT == 0 && next & COUNT < self.participants;
            if close {
                next |= CLOSED;
            }
            match word.compare_exchange(v, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return close,
                Err(now) => v = now,
            }
        }
    }

    /// The atomic word at byte `at`.
    fn word(&self, at: usize) -> &AtomicU64 {
        assert!(at.is_multiple_of(8) && at.checked_add(8).is_some_and(|end| end <= self.len), "segment word {at}");
        // SAFETY: in bounds and 8-byte aligned (the mapping is page aligned; checked above),
        // so valid for an `AtomicU64` (same layout as `u64`) while `self` lives; these bytes
        // are only ever accessed as this atomic, by every process (the layout keeps flag
        // words apart from staging).
        unsafe { &*self.ptr.as_ptr().add(at).cast::<AtomicU64>() }
    }

    /// `len` bytes at `at`, shared. Caller: nobody writes them until the borrow ends.
    fn read(&self, at: usize, len: usize) -> &[u8] {
        assert!(at.checked_add(len).is_some_and(|end| end <= self.len), "segment read {at}+{len} of {}", self.len);
        // SAFETY: in bounds (checked above) of a live mapping; the protocol guarantees no
        // concurrent writer in any process (module docs: a staging buffer is written only
        // by its owner, before the decision its readers wait for, and not again until they
        // have all finished).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(at), len) }
    }

    /// `len` bytes at `at`, exclusive. Caller: the owning member, in its write phase.
    #[allow(clippy::mut_from_ref)]
    fn write(&self, at: usize, len: usize) -> &mut [u8] {
        assert!(at.checked_add(len).is_some_and(|end| end <= self.len), "segment write {at}+{len} of {}", self.len);
        // SAFETY: in bounds (checked above) of a live mapping; only the owning member writes
        // its staging buffer, and only while no peer reads it (before it arrives, once every
        // member finished the epoch that last read it), so this is the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(at), len) }
    }

    fn unlink(&self) {
        unlink(&self.name);
    }
}

/// Removes a segment's name; gone already is fine.
fn unlink(name: &str) {
    match rustix::shm::unlink(name) {
        Ok(()) | Err(Errno::NOENT) => {}
        Err(e) => log::warn!("shm_unlink of {name}: {e}"),
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // The last attached process to leave unlinks a name some participant never came
        // for. Not any earlier: a process that is done (its groups need nobody who is
        // missing) must not take the name from a slow one that still has peers to meet.
        // Closing first makes a process that opened the name meanwhile look for a fresh one.
        if self.attached && self.leave() {
            self.unlink();
        }
        // SAFETY: the mapping made in `attach`, unmapped once; no borrow of it outlives
        // `self` (every accessor borrows `self`).
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
            log::warn!("munmap of shared segment {}: {e}", self.name);
        }
    }
}

/// A wait without a condition variable (processes share only memory): spin briefly, then
/// yield, then sleep longer and longer, never past the deadline.
#[derive(Default)]
struct Backoff(u32);

impl Backoff {
    fn snooze(&mut self, deadline: Instant) {
        let step = self.0;
        self.0 = step.saturating_add(1);
        if step < 6 {
            for _ in 0..(8u32 << step) {
                std::hint::spin_loop();
            }
        } else if step < 16 {
            std::thread::yield_now();
        } else {
            let sleep = Duration::from_micros(10u64 << (step - 16).min(7)).min(MAX_SLEEP);
            std::thread::sleep(sleep.min(deadline.saturating_duration_since(Instant::now())));
        }
    }
}

/// Polls `ready` until it holds (`true`) or the deadline passes (`false`).
fn wait(deadline: Instant, mut ready: impl FnMut() -> bool) -> bool {
    let mut backoff = Backoff::default();
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return ready();
        }
        backoff.snooze(deadline);
    }
}

/// FNV-1a: a fingerprint of the plan, so that two collectives that happen to share a key
/// and a size still refuse each other.
fn fingerprint(text: &str) -> u64 {
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    h.max(1)
}

/// A one-time meeting of the processes of one host: each device of `devices` posts `slot`
/// bytes (its owner process posts for it), and everyone gets every device's. The device
/// layer exchanges its IPC handles this way (the CUDA handlers run inside XLA, without
/// Python's key-value store; processes of a host share memory by the topology's
/// definition). `name` names the segment like a collective's (job token + instance, with a
/// suffix); `processes` = the number of distinct processes owning `devices`. The segment
/// is unlinked as soon as every process has attached, or by the last to leave on timeout.
/// Fails with [`Error::ExchangeMissing`] naming the devices whose processes never posted
/// ([`Error::missing`]), or [`Error::Segment`] when the segment cannot be used.
pub fn exchange(
    name: &str,
    devices: &[usize],
    processes: u64,
    mine: &[(usize, Vec<u8>)],
    slot: usize,
    timeout: Duration,
) -> Result<Vec<(usize, Vec<u8>)>> {
    let per = slot.checked_next_multiple_of(64).and_then(|s| s.checked_add(64));
    let Some(size) = per.and_then(|p| p.checked_mul(devices.len())).and_then(|b| b.checked_add(HEADER)) else {
        return Err(Error::Segment(format!("{} slots of {slot} bytes overflow", devices.len())));
    };
    let per = per.unwrap_or(64);
    let print = fingerprint(&format!("exchange|{devices:?}|{slot}|{processes}"));
    let seg = Segment::attach(name, size, print, processes, timeout).map_err(Error::Segment)?;
    let at = |d: usize| devices.iter().position(|&x| x == d).map(|i| HEADER + i * per);
    for (d, bytes) in mine {
        let Some(off) = at(*d) else {
            return Err(Error::Segment(format!("device {d} is not one of {devices:?}")));
        };
        if bytes.len() != slot {
            return Err(Error::Segment(format!("{} bytes posted for a slot of {slot}", bytes.len())));
        }
        seg.write(off + 64, slot).copy_from_slice(bytes);
        seg.word(off).store(1, Ordering::Release);
    }
    let deadline = Instant::now() + timeout;
    let ready = |d: usize| at(d).is_some_and(|off| seg.word(off).load(Ordering::Acquire) == 1);
    if !wait(deadline, || devices.iter().all(|&d| ready(d))) {
        return Err(Error::ExchangeMissing { devices: devices.iter().copied().filter(|&d| !ready(d)).collect() });
    }
    Ok(devices.iter().enumerate().map(|(i, &d)| (d, seg.read(HEADER + i * per + 64, slot).to_vec())).collect())
}

/// A segment, mapped once by this process, and its layout: what one collective, or a slot
/// of collectives that every member runs in one order (issue 25, `direct.rs`'s argument),
/// meets in across processes.
struct ShmSlot {
    segment_name: String,
    layout: SegmentLayout,
    /// `None`: this process owns no device that meets a peer here.
    segment: Option<Segment>,
}

/// Shared slots this process has mapped, by segment name (held weakly: a slot goes with the
/// last collective using it).
fn shm_slots() -> &'static std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<ShmSlot>>> {
    static MAP: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<ShmSlot>>>> =
        std::sync::OnceLock::new();
    MAP.get_or_init(Default::default)
}

/// One rewritten collective of an executable whose groups span processes of one host;
/// each process builds its own, shared by its device threads.
pub struct ShmCollective {
    plan: Plan,
    slot: std::sync::Arc<ShmSlot>,
    process_of: Vec<usize>,
    this_process: usize,
}

impl std::fmt::Debug for ShmCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmCollective")
            .field("op", &self.plan.op)
            .field("algorithm", &self.plan.algorithm)
            .field("name", &self.plan.name)
            .field("segment", &self.slot.segment_name)
            .field("this_process", &self.this_process)
            .finish_non_exhaustive()
    }
}

/// However a call ends, its member is done reading peers' buffers of its epoch.
struct Finish<'a>(&'a AtomicU64, u64);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::Release);
    }
}

impl ShmCollective {
    /// `process_of[d]` = the process index that owns device id d (for every device id below
    /// num_devices); `this_process` = ours. Groups/pairs in `config` are global device ids.
    pub fn new(
        config: &CollectiveConfig,
        algorithm: Algo,
        shapes: &[ArrayShape],
        num_devices: usize,
        timeout: Duration,
        name: &str,
        key: &ShmKey,
        process_of: &[usize],
        this_process: usize,
    ) -> Result<Self> {
        Self::build(config, algorithm, shapes, num_devices, timeout, name, key, None, process_of, this_process)
    }

    /// A collective like [`ShmCollective::new`], on the slot `key` names, shared with the
    /// collectives every member runs in order with this one (the caller's promise, as for
    /// [`super::direct::DirectCollective::on_slot`]): this process maps the slot's segment
    /// once, with staging buffers of `max(slot_bytes, this plan's)` bytes. Every process
    /// derives the same segment (its fingerprint covers groups, pairs, processes and size,
    /// not one collective's plan); a slot already mapped too small for this plan is an error.
    #[allow(clippy::too_many_arguments)]
    pub fn on_slot(
        config: &CollectiveConfig,
        algorithm: Algo,
        shapes: &[ArrayShape],
        num_devices: usize,
        timeout: Duration,
        name: &str,
        key: &ShmKey,
        slot_bytes: usize,
        process_of: &[usize],
        this_process: usize,
    ) -> Result<Self> {
        Self::build(
            config,
            algorithm,
            shapes,
            num_devices,
            timeout,
            name,
            key,
            Some(slot_bytes),
            process_of,
            this_process,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        config: &CollectiveConfig,
        algorithm: Algo,
        shapes: &[ArrayShape],
        num_devices: usize,
        timeout: Duration,
        name: &str,
        key: &ShmKey,
        slot_bytes: Option<usize>,
        process_of: &[usize],
        this_process: usize,
    ) -> Result<Self> {
        let plan = Plan::new(config, algorithm, shapes, num_devices, timeout, name)?;
        let invalid = |reason: String| plan.invalid(0, reason);
        let job = &key.job;
        if !(8..=64).contains(&job.len()) || !job.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid(format!("job token {job:?} is not 8 to 64 hex digits")));
        }
        let segment_name = format!("/peerless-{job}-{:016x}", key.instance);
        if process_of.len() < num_devices {
            return Err(invalid(format!("process_of names {} devices of {num_devices}", process_of.len())));
        }
        let process_of = process_of[..num_devices].to_vec();
        if let Some(m) = plan.group_members.iter().find(|m| m.len() >= MAX_MEMBERS) {
            return Err(invalid(format!("a group of {} members (at most {})", m.len(), MAX_MEMBERS - 1)));
        }
        let participants: BTreeSet<usize> =
            plan.group_members.iter().flatten().filter(|&&d| meets(&plan, d)).map(|&d| process_of[d]).collect();
        if participants.len() as u64 > COUNT {
            return Err(invalid(format!("{} processes (at most {COUNT})", participants.len())));
        }
        let Some(slot_bytes) = slot_bytes else {
            // A segment of its own: its fingerprint covers the whole plan.
            let layout = SegmentLayout::new(&plan, |d| stages(&plan, d), plan.per_buffer)
                .ok_or_else(|| invalid("the shared segment's size overflows".into()))?;
            let shapes: Vec<String> = shapes.iter().map(ToString::to_string).collect();
            let fingerprint = fingerprint(&format!(
                "{:?}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{}",
                plan.op.kind, plan.algorithm, shapes, plan.ops, plan.group_members, plan.pairs, process_of, layout.size
            ));
            let segment = if participants.contains(&this_process) {
                let n = participants.len() as u64;
                Some(Segment::attach(&segment_name, layout.size, fingerprint, n, timeout).map_err(invalid)?)
            } else {
                None
            };
            let slot = std::sync::Arc::new(ShmSlot { segment_name, layout, segment });
            return Ok(ShmCollective { plan, slot, process_of, this_process });
        };
        // A slot: mapped once per process; what its calls share is their groups (permute:
        // pairs), the processes and the size, so that is what the fingerprint covers.
        let mut slots = shm_slots().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        slots.retain(|_, w| w.strong_count() > 0);
        if let Some(slot) = slots.get(&segment_name).and_then(std::sync::Weak::upgrade) {
            if slot.layout.per_buffer < plan.per_buffer {
                return Err(invalid(format!(
                    "its shared slot {segment_name} stages {} bytes, it needs {}",
                    slot.layout.per_buffer, plan.per_buffer
                )));
            }
            return Ok(ShmCollective { plan, slot, process_of, this_process });
        }
        let layout = SegmentLayout::new(&plan, |d| stages(&plan, d), slot_bytes)
            .ok_or_else(|| invalid("the shared segment's size overflows".into()))?;
        let staging: Vec<bool> = (0..num_devices).map(|d| stages(&plan, d)).collect();
        let fingerprint = fingerprint(&format!(
            "slot|{:?}|{:?}|{:?}|{:?}|{}|{}",
            plan.op.kind == Kind::CollectivePermute,
            plan.group_members,
            plan.pairs,
            (process_of.as_slice(), staging),
            layout.per_buffer,
            layout.size
        ));
        let segment = if participants.contains(&this_process) {
            let n = participants.len() as u64;
            Some(Segment::attach(&segment_name, layout.size, fingerprint, n, timeout).map_err(invalid)?)
        } else {
            None
        };
        let slot = std::sync::Arc::new(ShmSlot { segment_name: segment_name.clone(), layout, segment });
        slots.insert(segment_name, std::sync::Arc::downgrade(&slot));
        Ok(ShmCollective { plan, slot, process_of, this_process })
    }

    /// Bytes each result buffer must have (for the caller's checks).
    pub fn output_lens(&self) -> Vec<usize> {
        self.plan.output_lens()
    }

    /// The segment's name (for diagnostics/tests).
    pub fn segment_name(&self) -> &str {
        &self.slot.segment_name
    }

    /// Runs device `device`'s side of one call (a global device id owned by this process):
    /// `inputs` are its operands, `outputs` its result buffers, in operand order; the
    /// contract of [`super::direct::DirectCollective::run`].
    pub fn run(&self, device: usize, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        let plan = &self.plan;
        let (gi, idx) = plan.check_call(device, inputs, outputs)?;
        if self.process_of[device] != self.this_process {
            return Err(plan.invalid(
                device,
                format!(
                    "device {device} belongs to process {}, not to this one ({})",
                    self.process_of[device], self.this_process
                ),
            ));
        }
        let deadline = Instant::now() + plan.timeout;
        let permute = plan.op.kind == Kind::CollectivePermute;
        if permute && !meets(plan, device) {
            return self.permute_locally(device, inputs, outputs);
        }
        let Some(seg) = &self.slot.segment else {
            return Err(plan.invalid(device, "this process has no shared segment for the device".into()));
        };
        let m = self.slot.layout.base[gi] + idx;
        let flag = |f: usize| seg.word(self.slot.layout.flags[m] + f);
        let e = flag(F_EPOCH).load(Ordering::Relaxed) + 1;
        flag(F_EPOCH).store(e, Ordering::Relaxed);
        let _finish = Finish(flag(F_FINISHED), e);
        let par = (e % 2) as usize;
        if permute {
            return self.permute(seg, device, e, deadline, inputs, outputs);
        }
        self.wait_finished(seg, gi, idx, e, deadline)?;
        let own = self.buffer(m, par);
        for (o, x) in plan.ops.iter().zip(inputs) {
            seg.write(own + o.stage, o.len).copy_from_slice(x);
        }
        self.barrier(seg, gi, idx, e, deadline)?;
        // Peers' XLA operands live in other processes: the two-shot folds staged copies.
        let algorithm = match plan.algorithm {
            Algo::TwoShotAllReduce => Algo::OneShotAllReduce,
            a => a,
        };
        let base = self.slot.layout.base[gi];
        let member = |k: usize, at: usize, len: usize| seg.read(self.buffer(base + k, par) + at, len);
        plan.compute(algorithm, idx, plan.group_members[gi].len(), member, outputs);
        Ok(())
    }

    /// Member `m`'s staging buffer `par` (byte offset).
    fn buffer(&self, m: usize, par: usize) -> usize {
        let at = self.slot.layout.staging[m].expect("a member that stages has staging buffers");
        at + par * self.slot.layout.per_buffer
    }

    /// The timeout error, after unlinking the name (a peer that never attached must not
    /// find it later and leave it behind).
    fn timed_out(&self, seg: &Segment, group: &[usize], rank: usize, missing: Vec<usize>) -> Error {
        seg.unlink();
        self.plan.timeout_error(group, rank, missing)
    }

    /// Before writing staging buffer `e % 2`: every member finished epoch `e - 2`.
    fn wait_finished(&self, seg: &Segment, gi: usize, idx: usize, e: u64, deadline: Instant) -> Result<()> {
        let members = &self.plan.group_members[gi];
        let base = self.slot.layout.base[gi];
        let behind = |k: usize| {
            seg.word(self.slot.layout.flags[base + k] + F_FINISHED).load(Ordering::Acquire).saturating_add(2) < e
        };
        if wait(deadline, || !(0..members.len()).any(behind)) {
            return Ok(());
        }
        // Only after a timeout can a member still be in epoch e - 2.
        let missing: Vec<usize> = (0..members.len()).filter(|&k| behind(k)).map(|k| members[k]).collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(self.timed_out(seg, members, members[idx], missing))
    }

    /// Arrives at epoch `e`'s barrier and waits for its decision (module docs, step 4).
    fn barrier(&self, seg: &Segment, gi: usize, idx: usize, e: u64, deadline: Instant) -> Result<()> {
        let members = &self.plan.group_members[gi];
        let (g, base, words) = (members.len(), self.slot.layout.base[gi], self.slot.layout.mask_words[gi]);
        let par = (e % 2) as usize;
        let arrived = |k: usize| seg.word(self.slot.layout.flags[base + k] + F_ARRIVED).load(Ordering::Acquire);
        let mask = |k: usize, w: usize| seg.word(self.slot.layout.masks[base + k] + (par * words + w) * 8);
        seg.word(self.slot.layout.flags[base + idx] + F_ARRIVED).store(e, Ordering::Release);
        let word = seg.word(self.slot.layout.decisions[gi] + par * 8);
        let mut backoff = Backoff::default();
        loop {
            let v = word.load(Ordering::Acquire);
            match v >> 16 {
                de if de == e => {
                    if v & 3 == COMPLETE {
                        return Ok(());
                    }
                    let breaker = ((v >> 2) & (MAX_MEMBERS as u64 - 1)) as usize;
                    let missing = (0..g)
                        .filter(|&k| mask(breaker, k / 64).load(Ordering::Relaxed) >> (k % 64) & 1 == 1)
                        .map(|k| members[k])
                        .collect();
                    return Err(self.timed_out(seg, members, members[idx], missing));
                }
                // A later epoch decided: impossible while this member has not finished `e`
                // (module docs); fail rather than read buffers of another epoch.
                de if de > e => {
                    let missing = (0..g).filter(|&k| arrived(k) < e).map(|k| members[k]).collect();
                    return Err(self.timed_out(seg, members, members[idx], missing));
                }
                _ => {}
            }
            if (0..g).all(|k| arrived(k) >= e) {
                // Release: passes the members' staging writes (acquired above) on to
                // whoever reads this decision.
                let _ = word.compare_exchange(v, decision(e, COMPLETE, 0), Ordering::AcqRel, Ordering::Acquire);
                continue;
            }
            if Instant::now() >= deadline {
                // The mask first: the decision publishes it.
                let mut any = false;
                for w in 0..words {
                    let bits =
                        (64 * w..(64 * w + 64).min(g)).filter(|&k| arrived(k) < e).fold(0u64, |b, k| b | 1 << (k % 64));
                    mask(idx, w).store(bits, Ordering::Relaxed);
                    any |= bits != 0;
                }
                // Everyone came just now: complete it instead.
                if any {
                    let _ = word.compare_exchange(v, decision(e, BROKEN, idx), Ordering::AcqRel, Ordering::Acquire);
                }
                continue;
            }
            backoff.snooze(deadline);
        }
    }

    /// Collective-permute of a device that meets a peer: as `direct.rs`.
    fn permute(
        &self,
        seg: &Segment,
        d: usize,
        e: u64,
        deadline: Instant,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<()> {
        let (source, target) = self.plan.pairs[d];
        // The permute's one group is every device, in order: member index = device id.
        let flag = |k: usize, f: usize| seg.word(self.slot.layout.flags[k] + f);
        let par = (e % 2) as usize;
        let pair_timeout = |peer: usize| self.timed_out(seg, &[d.min(peer), d.max(peer)], d, vec![peer]);
        if let Some(t) = target.filter(|&t| t != d) {
            // My staging buffer `e % 2` is free once my target consumed epoch e - 2.
            if !wait(deadline, || flag(d, F_CONSUMED).load(Ordering::Acquire).saturating_add(2) >= e) {
                return Err(pair_timeout(t));
            }
            let own = self.buffer(d, par);
            for (o, x) in self.plan.ops.iter().zip(inputs) {
                seg.write(own + o.stage, o.len).copy_from_slice(x);
            }
            flag(d, F_POSTED).store(e, Ordering::Release);
        }
        match source {
            Some(s) if s == d => {
                for (x, out) in inputs.iter().zip(outputs.iter_mut()) {
                    out.copy_from_slice(x);
                }
            }
            Some(s) => {
                let posted = wait(deadline, || flag(s, F_POSTED).load(Ordering::Acquire) >= e);
                if posted {
                    let theirs = self.buffer(s, par);
                    for (o, out) in self.plan.ops.iter().zip(outputs.iter_mut()) {
                        out.copy_from_slice(seg.read(theirs + o.stage, o.len));
                    }
                }
                // Consumed (or given up on): my source may reuse the buffer at e + 2.
                flag(s, F_CONSUMED).fetch_max(e, Ordering::AcqRel);
                if !posted {
                    return Err(pair_timeout(s));
                }
            }
            None => outputs.iter_mut().for_each(|o| o.fill(0)),
        }
        Ok(())
    }

    /// Collective-permute of a device without a peer: its own operand, or zeros.
    fn permute_locally(&self, d: usize, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        match self.plan.pairs[d].0 {
            Some(_) => outputs.iter_mut().zip(inputs).for_each(|(out, x)| out.copy_from_slice(x)),
            None => outputs.iter_mut().for_each(|o| o.fill(0)),
        }
        Ok(())
    }
}

/// Whether device `d` meets peers in the segment: every member of a group does; a
/// permute device only with a source or target other than itself.
fn meets(plan: &Plan, d: usize) -> bool {
    let (source, target) = plan.pairs[d];
    plan.op.kind != Kind::CollectivePermute || source.is_some_and(|s| s != d) || target.is_some_and(|t| t != d)
}

/// Whether device `d` stages its operands in the segment: every member of a group does; a
/// permute device only when it sends to another.
fn stages(plan: &Plan, d: usize) -> bool {
    plan.op.kind != Kind::CollectivePermute || plan.pairs[d].1.is_some_and(|t| t != d)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::thread;

    use hlo::PrimitiveType as T;
    use hlo::analysis::ReductionKind as R;
    use thunks::CollectiveOp;

    use super::super::direct::DirectCollective;
    use super::*;

    /// Instances of this test binary never share a key (each test has its own job token).
    static INSTANCE: AtomicU64 = AtomicU64::new(1);

    fn job() -> String {
        format!("{:016x}", rand::random::<u64>())
    }

    fn key(job: &str) -> ShmKey {
        ShmKey { job: job.to_string(), instance: INSTANCE.fetch_add(1, Ordering::Relaxed) }
    }

    /// The job's names left in /dev/shm.
    fn leftovers(job: &str) -> Vec<String> {
        let prefix = format!("peerless-{job}-");
        let entries = std::fs::read_dir("/dev/shm").expect("/dev/shm");
        entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(&prefix)).collect()
    }

    fn config(kind: Kind, groups: Vec<Vec<usize>>, dimension: Option<usize>, n_ops: usize, r: R) -> CollectiveConfig {
        CollectiveConfig {
            op: CollectiveOp { kind, is_async: false },
            groups,
            element_type: T::F32,
            reduction: Some(r),
            bytes_per_device: 0,
            dimension,
            source_target_pairs: vec![],
            num_operands: n_ops,
        }
    }

    fn permute_config(pairs: Vec<(usize, usize)>, n_ops: usize) -> CollectiveConfig {
        let mut cfg = config(Kind::CollectivePermute, vec![], None, n_ops, R::Sum);
        cfg.source_target_pairs = pairs;
        cfg
    }

    fn splitmix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    /// Operand `j` of device `d` at call `c`: f32 of mixed magnitudes (so that the fold
    /// order shows in the bits) or arbitrary s32.
    fn operand(shape: &ArrayShape, c: usize, d: usize, j: usize) -> Vec<u8> {
        let n: i64 = shape.dims.iter().product();
        (0..n as u64)
            .flat_map(|i| {
                let x = splitmix((c as u64) << 48 ^ (d as u64) << 32 ^ (j as u64) << 24 ^ i);
                match shape.ty {
                    T::F32 => {
                        let m = (x % 20001) as f32 - 10000.0;
                        (m * 2f32.powi(((x >> 32) % 40) as i32 - 20)).to_le_bytes()
                    }
                    _ => (x as i32).to_le_bytes(),
                }
            })
            .collect()
    }

    /// The devices that call a collective of `cfg` on `n` devices.
    fn callers(cfg: &CollectiveConfig, n: usize) -> Vec<usize> {
        if cfg.op.kind == Kind::CollectivePermute {
            (0..n).collect()
        } else {
            let mut d: Vec<usize> = cfg.groups.iter().flatten().copied().collect();
            d.sort_unstable();
            d
        }
    }

    /// Device → its results of every call, in call order.
    type Results = BTreeMap<usize, Vec<Vec<Vec<u8>>>>;

    /// Calls `calls` (each call's index picks its inputs) of one device through `run`.
    fn calls(
        device: usize,
        shapes: &[ArrayShape],
        out_lens: &[usize],
        calls: std::ops::Range<usize>,
        run: impl Fn(usize, &[&[u8]], &mut [&mut [u8]]) -> Result<()>,
    ) -> Vec<Vec<Vec<u8>>> {
        calls
            .map(|c| {
                let ins: Vec<Vec<u8>> = shapes.iter().enumerate().map(|(j, s)| operand(s, c, device, j)).collect();
                let mut outs: Vec<Vec<u8>> = out_lens.iter().map(|&l| vec![0xAA; l]).collect();
                let i: Vec<&[u8]> = ins.iter().map(Vec::as_slice).collect();
                let mut o: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
                run(device, &i, &mut o).unwrap_or_else(|e| panic!("device {device}, call {c}: {e}"));
                outs
            })
            .collect()
    }

    fn run_direct(
        cfg: &CollectiveConfig,
        algo: Algo,
        shapes: &[ArrayShape],
        n: usize,
        k: std::ops::Range<usize>,
    ) -> Results {
        let c = DirectCollective::new(cfg, algo, shapes, n, Duration::from_secs(20), "direct").unwrap();
        let lens = c.output_lens();
        thread::scope(|s| {
            let hs: Vec<_> = (callers(cfg, n).into_iter())
                .map(|d| {
                    let (lens, k, c) = (&lens, &k, &c);
                    (d, s.spawn(move || calls(d, shapes, lens, k.clone(), |d, i, o| c.run(d, i, o))))
                })
                .collect();
            hs.into_iter().map(|(d, h)| (d, h.join().unwrap())).collect()
        })
    }

    /// Every process a thread with its own [`ShmCollective`] (its own mapping), whose
    /// device threads call it.
    fn run_shm(
        cfg: &CollectiveConfig,
        algo: Algo,
        shapes: &[ArrayShape],
        n: usize,
        k: std::ops::Range<usize>,
        process_of: &[usize],
        key: &ShmKey,
    ) -> Results {
        let procs = process_of.iter().max().map_or(0, |p| p + 1);
        let devices = callers(cfg, n);
        thread::scope(|s| {
            let hs: Vec<_> = (0..procs)
                .map(|p| {
                    let (devices, k) = (&devices, &k);
                    s.spawn(move || {
                        let c = ShmCollective::new(
                            cfg,
                            algo,
                            shapes,
                            n,
                            Duration::from_secs(20),
                            "shm",
                            key,
                            process_of,
                            p,
                        )
                        .unwrap();
                        let lens = c.output_lens();
                        thread::scope(|s| {
                            let hs: Vec<_> = (devices.iter().filter(|&&d| process_of[d] == p))
                                .map(|&d| {
                                    let (lens, c) = (&lens, &c);
                                    (d, s.spawn(move || calls(d, shapes, lens, k.clone(), |d, i, o| c.run(d, i, o))))
                                })
                                .collect();
                            hs.into_iter().map(|(d, h)| (d, h.join().unwrap())).collect::<Vec<_>>()
                        })
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        })
    }

    /// ShmCollective over processes `process_of` gives DirectCollective's bits, call after call.
    fn check(cfg: &CollectiveConfig, algo: Algo, shapes: &[ArrayShape], n: usize, process_of: &[usize]) {
        let job = job();
        let want = run_direct(cfg, algo, shapes, n, 0..3);
        let got = run_shm(cfg, algo, shapes, n, 0..3, process_of, &key(&job));
        assert!(got == want, "{algo:?} {:?} {:?} over processes {process_of:?}", cfg.groups, cfg.source_target_pairs);
        assert_eq!(leftovers(&job), Vec::<String>::new());
    }

    fn groupings() -> Vec<Vec<Vec<usize>>> {
        vec![vec![(0..8).collect()], vec![(0..4).collect(), (4..8).collect()], vec![vec![0, 5, 2, 7], vec![4, 1, 6, 3]]]
    }

    /// Two processes of four devices, four of two, three uneven ones, eight of one.
    fn process_maps() -> Vec<Vec<usize>> {
        vec![vec![0, 0, 0, 0, 1, 1, 1, 1], vec![0, 1, 2, 3, 0, 1, 2, 3], vec![0, 0, 0, 1, 1, 2, 2, 2], (0..8).collect()]
    }

    fn sh(ty: T, dims: &[i64]) -> ArrayShape {
        ArrayShape::new(ty, dims.to_vec())
    }

    #[test]
    fn all_reduce_matches_direct_bitwise() {
        for algo in [Algo::OneShotAllReduce, Algo::TwoShotAllReduce] {
            for groups in groupings() {
                for procs in process_maps() {
                    let shapes = [sh(T::F32, &[2, 5]), sh(T::S32, &[3])];
                    check(&config(Kind::AllReduce, groups.clone(), None, 2, R::Sum), algo, &shapes, 8, &procs);
                }
                let shapes = [sh(T::F32, &[13])];
                let procs = &process_maps()[2];
                check(&config(Kind::AllReduce, groups.clone(), None, 1, R::Max), algo, &shapes, 8, procs);
            }
        }
    }

    #[test]
    fn gather_scatter_and_all_to_all_match_direct_bitwise() {
        for groups in groupings() {
            let g = groups[0].len() as i64;
            for procs in &process_maps()[..3] {
                let ag = |dim, n_ops| config(Kind::AllGather, groups.clone(), Some(dim), n_ops, R::Sum);
                let shapes = [sh(T::F32, &[2, 3]), sh(T::S32, &[2, 1])];
                check(&ag(1, 2), Algo::DirectAllGather, &shapes, 8, procs);
                check(&ag(0, 1), Algo::DirectAllGather, &[sh(T::F32, &[3])], 8, procs);

                let rs = |dim, n_ops| config(Kind::ReduceScatter, groups.clone(), Some(dim), n_ops, R::Sum);
                let shapes = [sh(T::F32, &[g, 3]), sh(T::S32, &[2 * g])];
                check(&rs(0, 2), Algo::DirectReduceScatter, &shapes, 8, procs);
                check(&rs(1, 1), Algo::DirectReduceScatter, &[sh(T::F32, &[2, 2 * g])], 8, procs);

                let a2a = |dim, n_ops| config(Kind::AllToAll, groups.clone(), dim, n_ops, R::Sum);
                check(&a2a(Some(0), 1), Algo::DirectAllToAll, &[sh(T::F32, &[g, 2])], 8, procs);
                check(&a2a(Some(1), 1), Algo::DirectAllToAll, &[sh(T::S32, &[3, g])], 8, procs);
                let tuple = vec![sh(T::F32, &[3]); g as usize];
                check(&a2a(None, g as usize), Algo::DirectAllToAll, &tuple, 8, procs);
            }
        }
    }

    #[test]
    fn permute_matches_direct_bitwise() {
        let ring: Vec<(usize, usize)> = (0..8).map(|d| (d, (d + 1) % 8)).collect();
        let partial = vec![(0, 5), (5, 2), (6, 6), (3, 1), (7, 4)];
        for pairs in [ring, partial] {
            for procs in process_maps() {
                let shapes = [sh(T::F32, &[5]), sh(T::S32, &[2, 2])];
                check(&permute_config(pairs.clone(), 2), Algo::DirectPermute, &shapes, 8, &procs);
            }
        }
    }

    fn timeout_of(e: &Error) -> (Vec<usize>, usize, Vec<usize>) {
        match e {
            Error::Timeout { group, waiting_rank, missing, .. } => (group.clone(), *waiting_rank, missing.clone()),
            e => panic!("not a timeout: {e}"),
        }
    }

    #[test]
    fn a_process_that_never_attaches_times_out_naming_its_devices() {
        let job = job();
        let key = key(&job);
        let cfg = config(Kind::AllReduce, vec![vec![0, 1, 2, 3]], None, 1, R::Sum);
        let shapes = [sh(T::S32, &[4])];
        let timeout = Duration::from_millis(300);
        let c = ShmCollective::new(&cfg, Algo::OneShotAllReduce, &shapes, 4, timeout, "ar", &key, &[0, 0, 1, 1], 0)
            .unwrap();
        assert_eq!(leftovers(&job), vec![c.segment_name()[1..].to_string()], "named until process 1 attaches");
        let start = Instant::now();
        let errors: Vec<Error> = thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|d| {
                    let (c, shapes) = (&c, &shapes);
                    s.spawn(move || {
                        let x = operand(&shapes[0], 0, d, 0);
                        let mut r = vec![0u8; 16];
                        c.run(d, &[&x], &mut [&mut r]).unwrap_err()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let took = start.elapsed();
        assert!(took >= timeout && took < timeout + Duration::from_millis(700), "{took:?}");
        for (d, e) in errors.iter().enumerate() {
            assert_eq!(timeout_of(e), (vec![0, 1, 2, 3], d, vec![2, 3]), "{e}");
            assert!(e.to_string().contains("%ar timed out after 300 ms"), "{e}");
        }
        assert_eq!(leftovers(&job), Vec::<String>::new(), "the timeout unlinked the segment");
    }

    #[test]
    fn a_late_member_fails_the_broken_epoch_and_the_next_is_clean() {
        for algo in [Algo::OneShotAllReduce, Algo::TwoShotAllReduce] {
            let job = job();
            let key = key(&job);
            let cfg = config(Kind::AllReduce, vec![vec![0, 1]], None, 1, R::Sum);
            let shapes = [sh(T::S32, &[3])];
            let t = Duration::from_millis(300);
            let procs = [0, 1];
            let c0 = ShmCollective::new(&cfg, algo, &shapes, 2, t, "ar", &key, &procs, 0).unwrap();
            let c1 = ShmCollective::new(&cfg, algo, &shapes, 2, t, "ar", &key, &procs, 1).unwrap();
            assert_eq!(leftovers(&job), Vec::<String>::new(), "unlinked once both attached");
            let x = operand(&shapes[0], 0, 0, 0);
            let mut r = vec![0u8; 12];
            let e = c0.run(0, &[&x], &mut [&mut r]).unwrap_err();
            assert_eq!(timeout_of(&e), (vec![0, 1], 0, vec![1]), "{algo:?}: {e}");
            // The late member fails its call of the broken epoch too, without waiting.
            let start = Instant::now();
            let e = c1.run(1, &[&x], &mut [&mut r]).unwrap_err();
            assert!(start.elapsed() < Duration::from_millis(100));
            assert_eq!(timeout_of(&e), (vec![0, 1], 1, vec![1]), "{algo:?}: {e}");
            // Both then agree again, epoch after epoch.
            let lens = c0.output_lens();
            let results = thread::scope(|s| {
                let a = s.spawn(|| calls(0, &shapes, &lens, 0..4, |d, i, o| c0.run(d, i, o)));
                let b = s.spawn(|| calls(1, &shapes, &lens, 0..4, |d, i, o| c1.run(d, i, o)));
                [a.join().unwrap(), b.join().unwrap()]
            });
            for c in 0..4 {
                let sum: Vec<u8> = (0..3)
                    .flat_map(|i| {
                        let v =
                            |d| i32::from_le_bytes(operand(&shapes[0], c, d, 0)[4 * i..4 * i + 4].try_into().unwrap());
                        v(0).wrapping_add(v(1)).to_le_bytes()
                    })
                    .collect();
                assert!(results.iter().all(|r| r[c][0] == sum), "{algo:?} call {c}");
            }
            drop((c0, c1));
            assert_eq!(leftovers(&job), Vec::<String>::new());
        }
    }

    /// One member of a group of eight stalls: every other member fails that epoch with the
    /// same missing device, the stalled one fails it when it comes, and the next is clean.
    #[test]
    fn a_stalled_member_breaks_the_epoch_for_its_whole_group() {
        let job = job();
        let key = key(&job);
        let cfg = config(Kind::AllReduce, vec![vec![3, 1, 4, 0, 5, 2, 6, 7]], None, 1, R::Sum);
        let shapes = [sh(T::F32, &[6])];
        let procs = [0, 0, 0, 0, 1, 1, 1, 1];
        let t = Duration::from_millis(400);
        let cs: Vec<ShmCollective> = (0..2)
            .map(|p| ShmCollective::new(&cfg, Algo::OneShotAllReduce, &shapes, 8, t, "ar", &key, &procs, p).unwrap())
            .collect();
        let lens = cs[0].output_lens();
        let call = |d: usize, c: usize| {
            let x = operand(&shapes[0], c, d, 0);
            let mut r = vec![0u8; lens[0]];
            cs[procs[d]].run(d, &[&x], &mut [&mut r]).map(|()| r)
        };
        thread::scope(|s| {
            let hs: Vec<_> = (0..7).map(|d| s.spawn(move || call(d, 0))).collect();
            for (d, h) in hs.into_iter().enumerate() {
                let e = h.join().unwrap().unwrap_err();
                assert_eq!(timeout_of(&e), (cfg.groups[0].clone(), d, vec![7]), "{e}");
            }
        });
        let e = call(7, 0).unwrap_err();
        assert_eq!(timeout_of(&e), (cfg.groups[0].clone(), 7, vec![7]), "{e}");
        // Calls 1 and 2 then agree with the direct protocol on the same inputs.
        let got: Results = thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|d| s.spawn(move || (d, (1..3).map(|c| vec![call(d, c).unwrap()]).collect::<Vec<_>>())))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want = run_direct(&cfg, Algo::OneShotAllReduce, &shapes, 8, 1..3);
        assert!(got == want);
        drop(cs);
        assert_eq!(leftovers(&job), Vec::<String>::new());
    }

    /// Process 0 is done with its group and leaves before process 2 attaches: the name
    /// stays for process 2, whose peer (process 1) waits in the segment.
    #[test]
    fn a_process_that_is_done_leaves_the_name_to_a_slow_one() {
        let job = job();
        let key = key(&job);
        let cfg = config(Kind::AllReduce, vec![vec![0, 1], vec![2, 3]], None, 1, R::Sum);
        let shapes = [sh(T::F32, &[7])];
        let procs = [0, 1, 1, 2];
        let new = |p| {
            ShmCollective::new(&cfg, Algo::OneShotAllReduce, &shapes, 4, Duration::from_secs(20), "ar", &key, &procs, p)
        };
        let c1 = new(1).unwrap();
        let lens = c1.output_lens();
        let run = |c: &ShmCollective, d: usize| calls(d, &shapes, &lens, 0..3, |d, i, o| c.run(d, i, o));
        let got: Results = thread::scope(|s| {
            let d0 = s.spawn(|| {
                let c0 = new(0).unwrap();
                run(&c0, 0)
            });
            let d1 = s.spawn(|| run(&c1, 1));
            let d2 = s.spawn(|| run(&c1, 2));
            let r0 = d0.join().unwrap();
            assert_eq!(leftovers(&job).len(), 1, "process 2 has yet to attach");
            let c2 = new(2).unwrap();
            let r3 = run(&c2, 3);
            [(0, r0), (1, d1.join().unwrap()), (2, d2.join().unwrap()), (3, r3)].into_iter().collect()
        });
        assert!(got == run_direct(&cfg, Algo::OneShotAllReduce, &shapes, 4, 0..3));
        assert_eq!(leftovers(&job), Vec::<String>::new());
        // The last process to leave unlinks a name that a participant never came for.
        let c0 = new(0).unwrap();
        assert_eq!(leftovers(&job).len(), 1);
        drop(c0);
        assert_eq!(leftovers(&job), Vec::<String>::new());
    }

    /// Collectives of one slot (issue 25) meet in one segment, mapped once per process, sized
    /// by the slot: an all-reduce and an all-gather alternate on it, across 2 processes (here
    /// simulated in one, which maps the slot once for both).
    #[test]
    fn chained_collectives_share_one_segment() {
        let job = job();
        let key = key(&job);
        let procs = [0, 0, 1, 1];
        let t = Duration::from_secs(20);
        let ar_cfg = config(Kind::AllReduce, vec![vec![0, 1, 2, 3]], None, 1, R::Sum);
        let ag_cfg = config(Kind::AllGather, vec![vec![0, 1, 2, 3]], Some(0), 1, R::Sum);
        let (ar_shape, ag_shape) = ([sh(T::S32, &[6])], [sh(T::S32, &[2])]);
        let build = |p: usize| {
            let ar =
                ShmCollective::on_slot(&ar_cfg, Algo::TwoShotAllReduce, &ar_shape, 4, t, "ar", &key, 256, &procs, p)
                    .unwrap();
            let ag =
                ShmCollective::on_slot(&ag_cfg, Algo::DirectAllGather, &ag_shape, 4, t, "ag", &key, 256, &procs, p)
                    .unwrap();
            (ar, ag)
        };
        let per_process = [build(0), build(1)];
        assert_eq!(per_process[0].0.segment_name(), per_process[1].1.segment_name());
        assert!(std::sync::Arc::ptr_eq(&per_process[0].0.slot, &per_process[0].1.slot));
        assert_eq!(per_process[0].0.slot.layout.per_buffer, 256);
        let outs: Vec<(Vec<u8>, Vec<u8>)> = thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|d| {
                    let (ar, ag) = &per_process[procs[d]];
                    s.spawn(move || {
                        let (mut r, mut g) = (vec![0u8; 24], vec![0u8; 32]);
                        for k in 0..30i32 {
                            let x: Vec<u8> = (0..6).flat_map(|i| (i + 10 * d as i32 + k).to_le_bytes()).collect();
                            ar.run(d, &[&x], &mut [&mut r]).unwrap();
                            ag.run(d, &[&r[..8]], &mut [&mut g]).unwrap();
                        }
                        (r, g)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want_r: Vec<u8> = (0..6).flat_map(|i: i32| (4 * (i + 29) + 60).to_le_bytes()).collect();
        let want_g: Vec<u8> = (0..4).flat_map(|_| want_r[..8].to_vec()).collect();
        for (r, g) in outs {
            assert_eq!((r, g), (want_r.clone(), want_g.clone()));
        }
    }

    /// A process that opens the name of a segment its last process just closed (and is
    /// about to unlink) waits for the name to go and starts a fresh segment.
    #[test]
    fn a_closed_segment_is_not_joined() {
        let job = job();
        let key = key(&job);
        let cfg = config(Kind::AllReduce, vec![vec![0, 1]], None, 1, R::Sum);
        let shapes = [sh(T::S32, &[2])];
        let t = Duration::from_millis(1000);
        let new = |p| ShmCollective::new(&cfg, Algo::OneShotAllReduce, &shapes, 2, t, "ar", &key, &[0, 1], p);
        let mut c0 = new(0).unwrap();
        let seg = std::sync::Arc::get_mut(&mut c0.slot).unwrap().segment.as_mut().unwrap();
        // As process 0's `leave` would: count it out and close, but keep the name a while.
        seg.word(H_ATTACHED).fetch_add(CLOSED - LIVE, Ordering::AcqRel);
        seg.attached = false;
        let unlinker = thread::spawn({
            let name = seg.name.clone();
            move || {
                thread::sleep(Duration::from_millis(100));
                unlink(&name);
            }
        });
        let start = Instant::now();
        let c1 = new(1).unwrap();
        assert!(start.elapsed() >= Duration::from_millis(90), "{:?}", start.elapsed());
        unlinker.join().unwrap();
        let fresh = c1.slot.segment.as_ref().unwrap().word(H_ATTACHED).load(Ordering::Acquire);
        assert_eq!(fresh, ATTACHED + LIVE, "process 1 alone in a fresh segment");
        drop(c0);
        assert_eq!(leftovers(&job).len(), 1, "process 1 waits for process 0 to come again");
        drop(c1);
        assert_eq!(leftovers(&job), Vec::<String>::new());
    }

    #[test]
    fn a_permute_source_that_never_posts_times_out_its_target() {
        let job = job();
        let key = key(&job);
        let cfg = permute_config(vec![(0, 1)], 1);
        let shapes = [sh(T::S32, &[2])];
        let t = Duration::from_millis(300);
        let c1 = ShmCollective::new(&cfg, Algo::DirectPermute, &shapes, 2, t, "cp", &key, &[0, 1], 1).unwrap();
        let mut r = vec![0u8; 8];
        let e = c1.run(1, &[&[0u8; 8]], &mut [&mut r]).unwrap_err();
        assert_eq!(timeout_of(&e), (vec![0, 1], 1, vec![0]), "{e}");
        assert_eq!(leftovers(&job), Vec::<String>::new());
    }

    #[test]
    fn segments_of_another_collective_are_invalid() {
        let job = job();
        let cfg = config(Kind::AllReduce, vec![vec![0, 1]], None, 1, R::Sum);
        let shapes = [sh(T::S32, &[4])];
        let t = Duration::from_millis(300);
        let new = |cfg: &CollectiveConfig, shapes: &[ArrayShape], key: &ShmKey, p: usize| {
            ShmCollective::new(cfg, Algo::OneShotAllReduce, shapes, 2, t, "ar", key, &[0, 1], p)
        };
        let invalid = |r: Result<ShmCollective>, what: &str| match r {
            Err(e @ Error::Invalid { .. }) => assert!(e.to_string().contains(what), "{e}"),
            Err(e) => panic!("not invalid: {e}"),
            Ok(c) => panic!("{c:?} was accepted"),
        };
        // A segment of another size under the name.
        let k1 = key(&job);
        let name = format!("/peerless-{job}-{:016x}", k1.instance);
        let fd = rustix::shm::open(
            name.as_str(),
            rustix::shm::OFlags::CREATE | rustix::shm::OFlags::RDWR,
            Mode::RUSR | Mode::WUSR,
        )
        .unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        invalid(new(&cfg, &shapes, &k1, 0), "has 4096 bytes where this collective needs");
        invalid(new(&cfg, &shapes, &k1, 0), "belongs to another collective");
        rustix::shm::unlink(name.as_str()).unwrap();
        // Another collective of the same key: another size, then the same size.
        let k2 = key(&job);
        let c = new(&cfg, &shapes, &k2, 0).unwrap();
        invalid(new(&cfg, &[sh(T::S32, &[64])], &k2, 1), "belongs to another collective");
        let max = config(Kind::AllReduce, vec![vec![0, 1]], None, 1, R::Max);
        invalid(new(&max, &shapes, &k2, 1), "belongs to another collective (its plan fingerprint");
        drop(c);
        assert_eq!(leftovers(&job), Vec::<String>::new());
        // Job tokens.
        for bad in ["", "0123456", "0123456g", "../../tmp/x", &"a".repeat(65)] {
            invalid(new(&cfg, &shapes, &ShmKey { job: bad.to_string(), instance: 1 }, 0), "is not 8 to 64 hex digits");
        }
    }

    #[test]
    fn calls_are_checked_and_processes_without_members_map_nothing() {
        let job = job();
        let key = key(&job);
        let cfg = config(Kind::AllReduce, vec![vec![0, 1]], None, 1, R::Sum);
        let shapes = [sh(T::S32, &[2])];
        let t = Duration::from_millis(300);
        let procs = [0, 1, 2];
        let c = ShmCollective::new(&cfg, Algo::OneShotAllReduce, &shapes, 3, t, "ar", &key, &procs, 0).unwrap();
        assert_eq!(c.segment_name(), format!("/peerless-{job}-{:016x}", key.instance));
        let x = [0u8; 8];
        let mut r = [0u8; 8];
        let e = c.run(1, &[&x], &mut [&mut r]).unwrap_err();
        assert!(e.to_string().contains("device 1 belongs to process 1"), "{e}");
        let e = c.run(2, &[&x], &mut [&mut r]).unwrap_err();
        assert!(e.to_string().contains("device 2 is in no group"), "{e}");
        // Process 2 owns no member: it maps nothing and leaves the count alone.
        let c2 = ShmCollective::new(&cfg, Algo::OneShotAllReduce, &shapes, 3, t, "ar", &key, &procs, 2).unwrap();
        assert!(c2.slot.segment.is_none());
        assert_eq!(leftovers(&job).len(), 1);
        let c1 = ShmCollective::new(&cfg, Algo::OneShotAllReduce, &shapes, 3, t, "ar", &key, &procs, 1).unwrap();
        assert_eq!(leftovers(&job), Vec::<String>::new());
        // A permute device without peers never needs the segment.
        let cp = ShmCollective::new(
            &permute_config(vec![(1, 1)], 1),
            Algo::DirectPermute,
            &shapes,
            3,
            t,
            "cp",
            &key,
            &procs,
            0,
        )
        .unwrap();
        assert!(cp.slot.segment.is_none());
        cp.run(0, &[&[7u8; 8]], &mut [&mut r]).unwrap();
        assert_eq!(r, [0u8; 8]);
        drop((c, c1, c2));
        assert_eq!(leftovers(&job), Vec::<String>::new());
    }

    #[test]
    fn exchange_gives_every_process_every_device_and_names_the_missing() {
        let job = job();
        let name = format!("/peerless-{job}-{:016x}-ipc", INSTANCE.fetch_add(1, Ordering::Relaxed));
        // Three "processes" (threads with their own mappings) own devices {0, 1}, {5}, {7}.
        let owned: Vec<Vec<usize>> = vec![vec![0, 1], vec![5], vec![7]];
        let devices = [0, 1, 5, 7];
        let slot = |d: usize| (0..100u8).map(|i| i ^ d as u8).collect::<Vec<u8>>();
        let got: Vec<_> = thread::scope(|s| {
            let hs: Vec<_> = owned
                .iter()
                .map(|mine| {
                    let name = &name;
                    s.spawn(move || {
                        let posts: Vec<(usize, Vec<u8>)> = mine.iter().map(|&d| (d, slot(d))).collect();
                        exchange(name, &devices, 3, &posts, 100, Duration::from_secs(20))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for g in got {
            let g = g.unwrap_or_else(|e| panic!("{e:?}"));
            assert_eq!(g, devices.iter().map(|&d| (d, slot(d))).collect::<Vec<_>>());
        }
        assert!(leftovers(&job).is_empty(), "{:?}", leftovers(&job));
        // A process that never comes: the others time out naming its devices, and the name goes.
        let name = format!("/peerless-{job}-{:016x}-ipc", INSTANCE.fetch_add(1, Ordering::Relaxed));
        let e = exchange(&name, &devices, 2, &[(0, slot(0)), (1, slot(1))], 100, Duration::from_millis(300));
        match e {
            Err(Error::ExchangeMissing { devices }) => assert_eq!(devices, [5, 7]),
            other => panic!("{other:?}"),
        }
        assert!(leftovers(&job).is_empty(), "{:?}", leftovers(&job));
    }
}
