//! NCCL, bound directly (sys → result → safe) and loaded by absolute path (see [`crate::libs`]).
//! Only what the fallback and the benchmark need: one communicator set per clique of local
//! devices (`ncclCommInitAll`), grouped all-reduce / all-gather / reduce-scatter, and
//! point-to-point send / recv issued inside one group ([`Comms::exchange`]).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::cuda::Stream;
use crate::{Error, Result};

/// Opaque communicator handle.
pub type Comm = *mut c_void;

/// `ncclDataType_t`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
}

/// `ncclRedOp_t`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
}

/// `ncclAllReduce` and `ncclReduceScatter`: (send, recv, count, type, op, comm, stream).
type ReduceFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int;

/// The raw entry points.
struct Sys {
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int,
    comm_destroy: unsafe extern "C" fn(Comm) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    all_reduce: ReduceFn,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, *mut c_void) -> c_int,
    reduce_scatter: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int,
}

static SYS: OnceLock<Result<Sys>> = OnceLock::new();

fn sys() -> Result<&'static Sys> {
    SYS.get_or_init(|| {
        let l = &crate::libs::nccl()?.lib;
        macro_rules! sym {
            ($n:literal) => {
                // SAFETY: the symbol's C signature is the one NCCL's nccl.h declares (2.x ABI),
                // matching the field type it is stored in; the library stays loaded forever.
                *unsafe { l.get(concat!($n, "\0").as_bytes()) }
                    .map_err(|e| Error::Library { lib: "libnccl", reason: format!("symbol {} missing: {e}", $n) })?
            };
        }
        Ok(Sys {
            get_version: sym!("ncclGetVersion"),
            get_error_string: sym!("ncclGetErrorString"),
            comm_init_all: sym!("ncclCommInitAll"),
            comm_destroy: sym!("ncclCommDestroy"),
            group_start: sym!("ncclGroupStart"),
            group_end: sym!("ncclGroupEnd"),
            all_reduce: sym!("ncclAllReduce"),
            all_gather: sym!("ncclAllGather"),
            reduce_scatter: sym!("ncclReduceScatter"),
            send: sym!("ncclSend"),
            recv: sym!("ncclRecv"),
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Result layer: status → error naming the call and device.
fn ck(s: &Sys, call: &'static str, device: Option<usize>, status: c_int) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any status.
    let text = unsafe { CStr::from_ptr((s.get_error_string)(status)) }.to_string_lossy().into_owned();
    Err(Error::Call { call, device, status: format!("ncclResult {status}: {text}") })
}

/// NCCL's version code (e.g. 22703 for 2.27.3).
pub fn version() -> Result<i32> {
    let s = sys()?;
    let mut v = 0;
    // SAFETY: `v` outlives the call.
    ck(s, "ncclGetVersion", None, unsafe { (s.get_version)(&mut v) })?;
    Ok(v)
}

/// One point-to-point transfer of [`Comms::exchange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2p {
    /// The communicator (clique rank) that issues it.
    pub rank: usize,
    /// `true`: send `bytes` from `buf` to `peer`; `false`: receive them into `buf`.
    pub send: bool,
    pub peer: usize,
    pub buf: u64,
    pub bytes: usize,
}

/// One communicator per local device of a clique, created together.
#[derive(Debug)]
pub struct Comms {
    comms: Vec<Comm>,
    ordinals: Vec<usize>,
}
// SAFETY: communicators are used from one thread at a time (the methods take &self but NCCL
// calls for one clique are issued from the owning thread inside a group).
unsafe impl Send for Comms {}

impl Comms {
    /// `ncclCommInitAll` over the given device ordinals.
    pub fn new(ordinals: &[usize]) -> Result<Comms> {
        let s = sys()?;
        let devs: Vec<c_int> = ordinals.iter().map(|&d| d as c_int).collect();
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` and `devs` both hold `devs.len()` elements.
        ck(s, "ncclCommInitAll", None, unsafe {
            (s.comm_init_all)(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr())
        })?;
        Ok(Comms { comms, ordinals: ordinals.to_vec() })
    }

    pub fn len(&self) -> usize {
        self.comms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.comms.is_empty()
    }

    /// Grouped all-reduce: `bufs[i] = (send, recv)` on device `i`, enqueued on `streams[i]`.
    pub fn all_reduce(
        &self,
        bufs: &[(u64, u64)],
        count: usize,
        ty: DataType,
        op: RedOp,
        streams: &[&Stream],
    ) -> Result<()> {
        self.reducing(|s| s.all_reduce, "ncclAllReduce", bufs, count, ty, op, streams)
    }

    /// Grouped all-gather of `count` elements per device.
    pub fn all_gather(&self, bufs: &[(u64, u64)], count: usize, ty: DataType, streams: &[&Stream]) -> Result<()> {
        self.grouped(streams, |s, i, comm, stream| {
            // SAFETY: send holds `count` and recv `count * len` elements on device `i`.
            let st = unsafe {
                (s.all_gather)(bufs[i].0 as *const c_void, bufs[i].1 as *mut c_void, count, ty as c_int, comm, stream)
            };
            ck(s, "ncclAllGather", Some(self.ordinals[i]), st)
        })
    }

    /// Grouped reduce-scatter: `bufs[i] = (send of count * len, recv of count)` on device `i`.
    pub fn reduce_scatter(
        &self,
        bufs: &[(u64, u64)],
        count: usize,
        ty: DataType,
        op: RedOp,
        streams: &[&Stream],
    ) -> Result<()> {
        self.reducing(|s| s.reduce_scatter, "ncclReduceScatter", bufs, count, ty, op, streams)
    }

    /// A grouped reducing collective (all-reduce and reduce-scatter share one C signature).
    #[allow(clippy::too_many_arguments)]
    fn reducing(
        &self,
        entry: fn(&Sys) -> ReduceFn,
        call: &'static str,
        bufs: &[(u64, u64)],
        count: usize,
        ty: DataType,
        op: RedOp,
        streams: &[&Stream],
    ) -> Result<()> {
        self.grouped(streams, |s, i, comm, stream| {
            // SAFETY: the buffers are device allocations on device `i` sized for `count` as the
            // calling method documents; `stream` belongs to that device.
            let st = unsafe {
                entry(s)(
                    bufs[i].0 as *const c_void,
                    bufs[i].1 as *mut c_void,
                    count,
                    ty as c_int,
                    op as c_int,
                    comm,
                    stream,
                )
            };
            ck(s, call, Some(self.ordinals[i]), st)
        })
    }

    /// Point-to-point transfers in one group: each [`P2p`] is issued by communicator
    /// `rank` (device `ordinals[rank]`) on `streams[rank]`, byte counts as `Uint8`.
    pub fn exchange(&self, ops: &[P2p], streams: &[&Stream]) -> Result<()> {
        if streams.len() != self.comms.len() {
            return Err(Error::Invalid(format!("{} streams for {} communicators", streams.len(), self.comms.len())));
        }
        if let Some(op) = ops.iter().find(|o| o.rank >= self.comms.len() || o.peer >= self.comms.len()) {
            return Err(Error::Invalid(format!("p2p {op:?} outside a clique of {}", self.comms.len())));
        }
        let s = sys()?;
        // SAFETY: group calls take no arguments.
        ck(s, "ncclGroupStart", None, unsafe { (s.group_start)() })?;
        let mut res = Ok(());
        for op in ops {
            let (comm, stream) = (self.comms[op.rank], streams[op.rank].s as *mut c_void);
            let peer = op.peer as c_int;
            let u8t = DataType::Uint8 as c_int;
            res = if op.send {
                // SAFETY: `buf` is a device allocation of at least `bytes` bytes on this rank's device.
                let st = unsafe { (s.send)(op.buf as *const c_void, op.bytes, u8t, peer, comm, stream) };
                ck(s, "ncclSend", Some(self.ordinals[op.rank]), st)
            } else {
                // SAFETY: as above, for the receive buffer.
                let st = unsafe { (s.recv)(op.buf as *mut c_void, op.bytes, u8t, peer, comm, stream) };
                ck(s, "ncclRecv", Some(self.ordinals[op.rank]), st)
            };
            if res.is_err() {
                break;
            }
        }
        // SAFETY: closes the group opened above.
        let end = ck(s, "ncclGroupEnd", None, unsafe { (s.group_end)() });
        res.and(end)
    }

    fn grouped(
        &self,
        streams: &[&Stream],
        mut each: impl FnMut(&Sys, usize, Comm, *mut c_void) -> Result<()>,
    ) -> Result<()> {
        if streams.len() != self.comms.len() {
            return Err(Error::Invalid(format!("{} streams for {} communicators", streams.len(), self.comms.len())));
        }
        let s = sys()?;
        // SAFETY: group calls take no arguments.
        ck(s, "ncclGroupStart", None, unsafe { (s.group_start)() })?;
        let mut res = Ok(());
        for (i, &c) in self.comms.iter().enumerate() {
            res = each(s, i, c, streams[i].s as *mut c_void);
            if res.is_err() {
                break;
            }
        }
        // SAFETY: closes the group opened above.
        let end = ck(s, "ncclGroupEnd", None, unsafe { (s.group_end)() });
        res.and(end)
    }
}

impl Drop for Comms {
    fn drop(&mut self) {
        if let Ok(s) = sys() {
            for &c in &self.comms {
                // SAFETY: destroys communicators created in `new`, once each.
                let _ = unsafe { (s.comm_destroy)(c) };
            }
        }
    }
}
