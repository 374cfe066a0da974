//! The host protocol between the processes of one host, over POSIX shared memory: what XLA:CPU's FFI handlers run when
//! a group spans devices of several processes (`jax.distributed`, e.g. 2 processes × 4 CPU devices).
//!
//! [`ShmCollective`] is the cross-process analogue of [`super::direct::DirectCollective`]: the same plan and protocol
//! ([`super::protocol`]), with staging and flag words in one shared segment per slot or collective, named by the job's
//! token and a [`ShmKey`]. ARCHITECTURE.md ("Host protocol") has the invariants; the segment layout, the barrier
//! decision and the lifecycle argument (who unlinks the name, and why a crash leaves nothing in `/dev/shm`) are in
//! docs/RELIABILITY.md ("Shared memory between processes").

use std::collections::{BTreeMap, BTreeSet};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use hlo::ArrayShape;
use rustix::fs::{FallocateFlags, Mode};
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};
use thunks::CollectiveKind as Kind;
use thunks::custom_call::CustomCallConfig;

use super::protocol::{self, Backoff, Place, Plan, Region, Word, poll};
use crate::{Error, Result};

/// Names a shared segment: unguessable job token (hex, from the job's distributed KV store) + a per-collective key
/// every process derives identically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmKey {
    pub job: String,
    pub instance: u64,
}

const MAGIC: u64 = u64::from_le_bytes(*b"PEERLSHM");
/// Bump when the layout or the protocol changes: processes of different versions then refuse each other's segments
/// instead of misreading them.
const VERSION: u64 = 1;

/// Header words (byte offsets).
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_SIZE: usize = 16;
const H_FINGERPRINT: usize = 24;
/// The `attached` word: processes that attached (bits 0-23), those of them still attached (bits 24-47, "live"), and
/// whether the last live one closed it (bit 63). One word, so that an attach and the last detach cannot both win.
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

/// Where everything lies in the segment; every process computes the same from the plan.
#[derive(Debug, Default)]
struct SegmentLayout {
    /// Per group: the index of its first member in the per-member tables, its two decision words, and the words of one
    /// mask.
    base: Vec<usize>,
    decisions: Vec<usize>,
    mask_words: Vec<usize>,
    /// Per member (groups one after another): its flags, its two masks, its two staging buffers (none: it stages
    /// nothing).
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
    /// `stages(d)`: whether device `d` needs staging buffers, each of `per_buffer` bytes (at least the plan's).
    fn new(plan: &Plan, stages: impl Fn(usize) -> bool, per_buffer: usize) -> Option<Self> {
        let per_buffer = per_buffer.max(plan.per_buffer).checked_next_multiple_of(64)?;
        let mut at = HEADER;
        let mut l = SegmentLayout { per_buffer, ..SegmentLayout::default() };
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

/// A mapped segment. The protocol, not the type system, says who may touch which bytes when.
struct Segment {
    region: Region,
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

impl Segment {
    /// Opens, checks, maps and attaches to segment `name` of `size` bytes; `participants` processes attach in all.
    /// `Err`: why not. A segment its last process closed (module docs) still has its name for a moment; this waits for
    /// the name to go, at most `patience`, and opens a fresh one.
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
                        unlink(&seg.name);
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
        // SAFETY: a new shared mapping of `size` bytes (the object's size, checked above) at an address the kernel
        // picks, so it aliases no Rust memory; unmapped only in Drop.
        let ptr = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), size, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0)
        }
        .map_err(|e| format!("mmap of {size} bytes of {name}: {e}"))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| format!("mmap of {name} returned null"))?;
        // The descriptor closes here; the mapping keeps the object.
        drop(fd);
        // SAFETY: the mapping is `size` bytes, page aligned, lives until Drop unmaps it and is reached only through the
        // region.
        let region = unsafe { Region::new(ptr, size) };
        let seg = Segment { region, name: name.to_string(), participants, attached: false };
        // Each header word is set by whoever comes first and must match for everyone else.
        for (at, value, what) in [
            (H_MAGIC, MAGIC, "magic"),
            (H_VERSION, VERSION, "layout version"),
            (H_SIZE, want, "size"),
            (H_FINGERPRINT, fingerprint, "plan fingerprint"),
        ] {
            if let Err(v) = seg.region.word(at).compare_exchange(0, value, Ordering::AcqRel, Ordering::Acquire)
                && v != value
            {
                return Err(format!(
                    "shared segment {name} belongs to another collective (its {what} is {v:#x}, not {value:#x})"
                ));
            }
        }
        Ok(seg)
    }

    /// Counts this process in, unless the segment is closed.
    fn join(&self) -> Join {
        let join = |v: u64| (v & CLOSED == 0).then(|| v + ATTACHED + LIVE);
        let Ok(v) = self.region.word(H_ATTACHED).fetch_update(Ordering::AcqRel, Ordering::Acquire, join) else {
            return Join::Closed;
        };
        let attached = (v & COUNT) + 1;
        if attached > self.participants {
            log::warn!("shared segment {}: {attached} attachments for {} processes", self.name, self.participants);
        }
        Join::Joined(attached == self.participants)
    }

    /// Counts this process out; `true`: it was the last, some participant never came, and it closed the segment (then
    /// it unlinks the name).
    fn leave(&self) -> bool {
        let mut close = false;
        let leave = |v: u64| {
            let next = ((v / LIVE) & COUNT != 0).then(|| v - LIVE)?;
            close = (next / LIVE) & COUNT == 0 && next & COUNT < self.participants;
            Some(if close { next | CLOSED } else { next })
        };
        self.region.word(H_ATTACHED).fetch_update(Ordering::AcqRel, Ordering::Acquire, leave).is_ok() && close
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
        // The last attached process to leave unlinks a name some participant never came for. Not any earlier: a process
        // that is done (its groups need nobody who is missing) must not take the name from a slow one that still has
        // peers to meet. Closing first makes a process that opened the name meanwhile look for a fresh one.
        if self.attached && self.leave() {
            unlink(&self.name);
        }
        // SAFETY: the mapping made in `attach`, unmapped once; no borrow of it outlives `self` (every accessor borrows
        // `self`).
        if let Err(e) = unsafe { rustix::mm::munmap(self.region.ptr().as_ptr().cast(), self.region.len()) } {
            log::warn!("munmap of shared segment {}: {e}", self.name);
        }
    }
}

/// FNV-1a: a fingerprint of the plan, so that two collectives that happen to share a key and a size still refuse each
/// other.
fn fingerprint(text: &str) -> u64 {
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    h.max(1)
}

/// A one-time meeting of the processes of one host: each device of `devices` posts `slot` bytes (its process posts for
/// it) and everyone gets every device's; the GPU runtime exchanges its IPC handles so, inside XLA, without Python's
/// key-value store. `name` names the segment like a collective's; `processes` counts the distinct processes owning
/// `devices`. The name is unlinked once every process attached, or by the last to leave on timeout. Fails with
/// [`Error::ExchangeMissing`] naming the devices never posted ([`Error::missing`]), or [`Error::Segment`].
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
        seg.region.write(off + 64, slot).copy_from_slice(bytes);
        seg.region.word(off).store(1, Ordering::Release);
    }
    let deadline = Instant::now() + timeout;
    let ready = |d: usize| at(d).is_some_and(|off| seg.region.word(off).load(Ordering::Acquire) == 1);
    if !poll(deadline, || devices.iter().all(|&d| ready(d))) {
        return Err(Error::ExchangeMissing { devices: devices.iter().copied().filter(|&d| !ready(d)).collect() });
    }
    Ok(devices.iter().enumerate().map(|(i, &d)| (d, seg.region.read(HEADER + i * per + 64, slot).to_vec())).collect())
}

/// 32-bit words in a segment every process of a host maps, page aligned and zero when the segment is made: the
/// copy-engine collectives' flag words across processes. Each process registers them with its GPUs (the device layer)
/// and touches them only through that; this keeps the mapping alive. `name` names the segment like [`exchange`]'s;
/// `processes` attach.
pub struct SharedWords {
    seg: Segment,
    words: usize,
}

impl std::fmt::Debug for SharedWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedWords({}, {} words)", self.seg.name, self.words)
    }
}

/// Where [`SharedWords`]' words start: a page of their own (registration is by pages).
const WORDS_AT: usize = 4096;

impl SharedWords {
    pub fn attach(name: &str, words: usize, processes: u64, patience: Duration) -> Result<SharedWords> {
        let size = (words.max(1) * 4).checked_next_multiple_of(WORDS_AT).and_then(|b| b.checked_add(WORDS_AT));
        let size = size.ok_or_else(|| Error::Segment(format!("{words} words overflow")))?;
        let print = fingerprint(&format!("words|{words}|{processes}"));
        let seg = Segment::attach(name, size, print, processes, patience).map_err(Error::Segment)?;
        Ok(SharedWords { seg, words })
    }

    /// The first word (page aligned) and the number of words, whole pages of them.
    pub fn words(&self) -> (*mut std::ffi::c_void, usize) {
        let ptr = self.seg.region.ptr().as_ptr().wrapping_add(WORDS_AT);
        (ptr.cast(), (self.seg.region.len() - WORDS_AT) / 4)
    }
}

/// A segment, mapped once by this process, and its layout: what one collective, or a slot of collectives that every
/// member runs in one order (`direct.rs`'s argument), meets in across processes.
struct ShmSlot {
    segment_name: String,
    layout: SegmentLayout,
    /// `None`: this process owns no device that meets a peer here.
    segment: Option<Segment>,
}

/// Shared slots this process has mapped, by segment name (held weakly: a slot goes with the last collective using it).
static SHM_SLOTS: Mutex<BTreeMap<String, Weak<ShmSlot>>> = Mutex::new(BTreeMap::new());

/// One rewritten collective of an executable whose groups span processes of one host; each process builds its own,
/// shared by its device threads.
pub struct ShmCollective {
    plan: Plan,
    slot: Arc<ShmSlot>,
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

impl ShmCollective {
    /// The collective of `call` on operands of the given (logical) shapes; `process_of[d]` = the process index that
    /// owns device id d (for every device id below num_devices); `this_process` = ours. Groups/pairs in `call` are
    /// global device ids.
    ///
    /// With `slot_bytes`, the collective is on the slot `key` names, shared with the collectives every member runs in
    /// order with this one (the caller's promise, as for [`super::direct::DirectCollective::on_slot`]): this process
    /// maps the slot's segment once, with staging buffers of `max(slot_bytes, this plan's)` bytes. Every process
    /// derives the same segment (its fingerprint covers groups, pairs, processes and size, not one collective's plan);
    /// a slot already mapped too small for this plan is an error. Without, the segment is this collective's own.
    pub fn on_slot(
        call: &CustomCallConfig,
        shapes: &[ArrayShape],
        num_devices: usize,
        key: &ShmKey,
        slot_bytes: Option<usize>,
        process_of: &[usize],
        this_process: usize,
    ) -> Result<Self> {
        let plan = Plan::new(call, shapes, num_devices)?;
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
        // A slot is mapped once per process: the live one, else a new one, made and recorded under the lock.
        let mut slots = None;
        if slot_bytes.is_some() {
            let map = slots.insert(SHM_SLOTS.lock().unwrap_or_else(PoisonError::into_inner));
            map.retain(|_, w| w.strong_count() > 0);
            if let Some(slot) = map.get(&segment_name).and_then(Weak::upgrade) {
                if slot.layout.per_buffer < plan.per_buffer {
                    return Err(invalid(format!(
                        "its shared slot {segment_name} stages {} bytes, it needs {}",
                        slot.layout.per_buffer, plan.per_buffer
                    )));
                }
                return Ok(ShmCollective { plan, slot, process_of, this_process });
            }
        }
        let layout = SegmentLayout::new(&plan, |d| stages(&plan, d), slot_bytes.unwrap_or(plan.per_buffer))
            .ok_or_else(|| invalid("the shared segment's size overflows".into()))?;
        let identity = if slot_bytes.is_none() {
            // A segment of its own: its fingerprint covers the whole plan.
            let shapes: Vec<String> = shapes.iter().map(ToString::to_string).collect();
            format!(
                "{:?}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{}",
                plan.op.kind, plan.algorithm, shapes, plan.ops, plan.group_members, plan.pairs, process_of, layout.size
            )
        } else {
            // What a slot's calls share is their groups (permute: pairs), the processes and the size, so that is what
            // its fingerprint covers.
            let staging: Vec<bool> = (0..num_devices).map(|d| stages(&plan, d)).collect();
            format!(
                "slot|{:?}|{:?}|{:?}|{:?}|{}|{}",
                plan.op.kind == Kind::CollectivePermute,
                plan.group_members,
                plan.pairs,
                (process_of.as_slice(), staging),
                layout.per_buffer,
                layout.size
            )
        };
        let fingerprint = fingerprint(&identity);
        let segment = if participants.contains(&this_process) {
            let n = participants.len() as u64;
            Some(Segment::attach(&segment_name, layout.size, fingerprint, n, plan.timeout).map_err(invalid)?)
        } else {
            None
        };
        let slot = Arc::new(ShmSlot { segment_name: segment_name.clone(), layout, segment });
        if let Some(mut map) = slots {
            map.insert(segment_name, Arc::downgrade(&slot));
        }
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

    /// Runs device `device`'s side of one call (a global device id owned by this process): `inputs` are its operands,
    /// `outputs` its result buffers, in operand order; the contract of [`super::direct::DirectCollective::run`].
    pub fn run(&self, device: usize, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        let plan = &self.plan;
        plan.check_call(device, inputs, outputs)?;
        if self.process_of[device] != self.this_process {
            return Err(plan.invalid(
                device,
                format!(
                    "device {device} belongs to process {}, not to this one ({})",
                    self.process_of[device], self.this_process
                ),
            ));
        }
        if plan.op.kind == Kind::CollectivePermute && !meets(plan, device) {
            return self.permute_locally(device, inputs, outputs);
        }
        let Some(seg) = &self.slot.segment else {
            return Err(plan.invalid(device, "this process has no shared segment for the device".into()));
        };
        protocol::run(plan, &ShmPlace { seg, layout: &self.slot.layout }, device, inputs, outputs)
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

/// A segment as the protocol's meeting place.
struct ShmPlace<'a> {
    seg: &'a Segment,
    layout: &'a SegmentLayout,
}

impl ShmPlace<'_> {
    /// Member `k` of group `gi`: its index in the per-member tables.
    fn member(&self, gi: usize, k: usize) -> usize {
        self.layout.base[gi] + k
    }

    /// Member `m`'s staging buffer `par` (byte offset).
    fn buffer(&self, m: usize, par: usize) -> usize {
        let at = self.layout.staging[m].expect("a member that stages has staging buffers");
        at + par * self.layout.per_buffer
    }
}

impl Place for ShmPlace<'_> {
    const IN_PLACE: bool = false;

    fn word(&self, gi: usize, k: usize, w: Word) -> &AtomicU64 {
        let at = match w {
            Word::Epoch => F_EPOCH,
            Word::Finished => F_FINISHED,
            Word::Posted => F_POSTED,
            Word::Consumed => F_CONSUMED,
        };
        self.seg.region.word(self.layout.flags[self.member(gi, k)] + at)
    }

    fn staged(&self, gi: usize, k: usize, par: usize, at: usize, len: usize) -> &[u8] {
        self.seg.region.read(self.buffer(self.member(gi, k), par) + at, len)
    }

    fn stage(&self, gi: usize, k: usize, par: usize, at: usize, len: usize) -> &mut [u8] {
        self.seg.region.write(self.buffer(self.member(gi, k), par) + at, len)
    }

    /// Module docs: one compare-and-swap of the group's decision word decides the epoch.
    fn barrier(&self, plan: &Plan, gi: usize, idx: usize, _p: usize, e: u64, deadline: Option<Instant>) -> Result<()> {
        let deadline = deadline.expect("only the in-place two-shot waits unbounded");
        let (seg, layout) = (&self.seg.region, self.layout);
        let members = &plan.group_members[gi];
        let (g, base, words) = (members.len(), layout.base[gi], layout.mask_words[gi]);
        let par = (e % 2) as usize;
        let arrived = |k: usize| seg.word(layout.flags[base + k] + F_ARRIVED).load(Ordering::Acquire);
        let mask = |k: usize, w: usize| seg.word(layout.masks[base + k] + (par * words + w) * 8);
        let timed_out = |missing: Vec<usize>| {
            self.timing_out();
            plan.timeout_error(members, members[idx], missing)
        };
        seg.word(layout.flags[base + idx] + F_ARRIVED).store(e, Ordering::Release);
        let word = seg.word(layout.decisions[gi] + par * 8);
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
                    return Err(timed_out(missing));
                }
                // A later epoch decided: impossible while this member has not finished `e` (module docs); fail rather
                // than read buffers of another epoch.
                de if de > e => {
                    return Err(timed_out((0..g).filter(|&k| arrived(k) < e).map(|k| members[k]).collect()));
                }
                _ => {}
            }
            if (0..g).all(|k| arrived(k) >= e) {
                // Release: passes the members' staging writes (acquired above) on to whoever reads this decision.
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

    fn wait(&self, _gi: usize, deadline: Instant, ready: impl FnMut() -> bool) -> bool {
        poll(deadline, ready)
    }

    /// Unlinks the name: a peer that never attached must not find it later and leave it behind.
    fn timing_out(&self) {
        unlink(&self.seg.name);
    }
}

/// Whether device `d` meets peers in the segment: every member of a group does; a permute device only with a source or
/// target other than itself.
fn meets(plan: &Plan, d: usize) -> bool {
    let (source, target) = plan.pairs[d];
    plan.op.kind != Kind::CollectivePermute || source.is_some_and(|s| s != d) || target.is_some_and(|t| t != d)
}

/// Whether device `d` stages its operands in the segment: every member of a group does; a permute device only when it
/// sends to another.
fn stages(plan: &Plan, d: usize) -> bool {
    plan.op.kind != Kind::CollectivePermute || plan.pairs[d].1.is_some_and(|t| t != d)
}

#[cfg(test)]
#[path = "../../tests/unit/shm.rs"]
mod tests;
