//! The collective-library core that NCCL ([`crate::nccl`]) and RCCL ([`crate::rccl`]) share:
//! both export the same C API (`nccl*` entry points, `ncclDataType_t` / `ncclRedOp_t`
//! values, grouped calls), so the entry-point table, the result layer and the communicator
//! owner are written once. What differs is the library and the stream type; a stream type
//! names its library ([`CclStream::lib`]), so `Comms<cuda::Stream>` is NCCL and
//! `Comms<hip::Stream>` is RCCL.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::marker::PhantomData;

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

/// `ncclAllReduce` and `ncclReduceScatter`: (send, recv, count, type, op, comm, stream).
type ReduceFn = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int;

/// The raw entry points (nccl.h's signatures, which rccl.h repeats).
struct Sys {
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int,
    comm_destroy: unsafe extern "C" fn(Comm) -> c_int,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    all_reduce: ReduceFn,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, *mut c_void) -> c_int,
    reduce_scatter: ReduceFn,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int,
}

/// A loaded collective library: its entry points and the name errors carry.
pub struct Lib {
    sys: Sys,
    /// "NCCL" or "RCCL".
    name: &'static str,
}

impl Lib {
    /// Resolves every entry point from `loaded` (`lib`: the library's name in errors).
    pub(crate) fn load(loaded: &'static crate::libs::Loaded, lib: &'static str, name: &'static str) -> Result<Lib> {
        let l = &loaded.lib;
        macro_rules! sym {
            ($n:literal) => {
                // SAFETY: the symbol's C signature is the one nccl.h (and rccl.h, the same 2.x
                // ABI) declares, matching the field type it is stored in; the library stays
                // loaded for the life of the process.
                *unsafe { l.get(concat!($n, "\0").as_bytes()) }.map_err(|e| Error::Library {
                    lib,
                    reason: format!("{}: symbol {} missing: {e}", loaded.path.display(), $n),
                })?
            };
        }
        let sys = Sys {
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
        };
        Ok(Lib { sys, name })
    }

    /// Result layer: status → error naming the library, the call and the device.
    fn ck(&self, call: &'static str, device: Option<usize>, status: c_int) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string (or null) for any
        // status.
        let p = unsafe { (self.sys.get_error_string)(status) };
        let text = if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null, static, NUL-terminated (see above).
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(Error::Call { call, device, status: format!("{} ncclResult {status}: {text}", self.name) })
    }

    /// The library's version code (e.g. 22703 for 2.27.3).
    pub fn version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: `v` outlives the call.
        self.ck("ncclGetVersion", None, unsafe { (self.sys.get_version)(&mut v) })?;
        Ok(v)
    }

    /// Runs `body` between `ncclGroupStart` and `ncclGroupEnd` (closing the group on errors).
    fn grouped(&self, body: impl FnOnce() -> Result<()>) -> Result<()> {
        // SAFETY: group calls take no arguments.
        self.ck("ncclGroupStart", None, unsafe { (self.sys.group_start)() })?;
        let res = body();
        // SAFETY: closes the group opened above.
        let end = self.ck("ncclGroupEnd", None, unsafe { (self.sys.group_end)() });
        res.and(end)
    }
}

/// A device stream a collective library enqueues on; its type picks the library.
pub trait CclStream {
    /// The raw stream handle (`cudaStream_t` / `hipStream_t`).
    fn raw(&self) -> *mut c_void;
    /// The device it belongs to.
    fn ordinal(&self) -> usize;
    /// The collective library for this kind of stream.
    fn lib() -> Result<&'static Lib>;
}

/// One communicator per local device of a clique, created together (`ncclCommInitAll`).
#[derive(Debug)]
pub struct Comms<S: CclStream> {
    comms: Vec<Comm>,
    ordinals: Vec<usize>,
    _stream: PhantomData<fn(&S)>,
}
// SAFETY: communicators are used from one thread at a time (calls for one clique are issued
// from the owning thread inside a group).
unsafe impl<S: CclStream> Send for Comms<S> {}

impl<S: CclStream> Comms<S> {
    /// Communicators over the given device ordinals (rank i = `ordinals[i]`).
    pub fn new(ordinals: &[usize]) -> Result<Self> {
        let lib = S::lib()?;
        let devs: Vec<c_int> = ordinals.iter().map(|&d| d as c_int).collect();
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` and `devs` both hold `devs.len()` elements.
        lib.ck("ncclCommInitAll", None, unsafe {
            (lib.sys.comm_init_all)(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr())
        })?;
        Ok(Comms { comms, ordinals: ordinals.to_vec(), _stream: PhantomData })
    }

    pub fn len(&self) -> usize {
        self.comms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.comms.is_empty()
    }

    /// Grouped all-reduce: `bufs[i] = (send, recv)` on device `i`, enqueued on `streams[i]`.
    pub fn all_reduce(&self, bufs: &[(u64, u64)], count: usize, ty: DataType, op: RedOp, streams: &[&S]) -> Result<()> {
        self.reducing(|s| s.all_reduce, "ncclAllReduce", bufs, count, ty, op, streams)
    }

    /// Grouped reduce-scatter: `bufs[i] = (send of count * len, recv of count)` on device `i`.
    pub fn reduce_scatter(
        &self,
        bufs: &[(u64, u64)],
        count: usize,
        ty: DataType,
        op: RedOp,
        streams: &[&S],
    ) -> Result<()> {
        self.reducing(|s| s.reduce_scatter, "ncclReduceScatter", bufs, count, ty, op, streams)
    }

    /// Grouped all-gather of `count` elements per device.
    pub fn all_gather(&self, bufs: &[(u64, u64)], count: usize, ty: DataType, streams: &[&S]) -> Result<()> {
        self.each_rank(bufs.len(), streams, |lib, i, comm, stream| {
            // SAFETY: send holds `count` and recv `count * len` elements on device `i`;
            // `stream` belongs to that device (checked).
            let st = unsafe {
                (lib.sys.all_gather)(
                    bufs[i].0 as *const c_void,
                    bufs[i].1 as *mut c_void,
                    count,
                    ty as c_int,
                    comm,
                    stream,
                )
            };
            lib.ck("ncclAllGather", Some(self.ordinals[i]), st)
        })
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
        streams: &[&S],
    ) -> Result<()> {
        self.each_rank(bufs.len(), streams, |lib, i, comm, stream| {
            // SAFETY: the buffers are device allocations on device `i` sized for `count` as the
            // calling method documents; `stream` belongs to that device (checked).
            let st = unsafe {
                entry(&lib.sys)(
                    bufs[i].0 as *const c_void,
                    bufs[i].1 as *mut c_void,
                    count,
                    ty as c_int,
                    op as c_int,
                    comm,
                    stream,
                )
            };
            lib.ck(call, Some(self.ordinals[i]), st)
        })
    }

    /// Point-to-point transfers in one group: each [`P2p`] is issued by communicator `rank`
    /// (device `ordinals[rank]`) on `streams[rank]`, byte counts as `Uint8`.
    pub fn exchange(&self, ops: &[P2p], streams: &[&S]) -> Result<()> {
        self.check_streams(streams)?;
        if let Some(op) = ops.iter().find(|o| o.rank >= self.comms.len() || o.peer >= self.comms.len()) {
            return Err(Error::Invalid(format!("p2p {op:?} outside a clique of {}", self.comms.len())));
        }
        let lib = S::lib()?;
        lib.grouped(|| {
            for op in ops {
                let (comm, stream) = (self.comms[op.rank], streams[op.rank].raw());
                let (peer, u8t) = (op.peer as c_int, DataType::Uint8 as c_int);
                let device = Some(self.ordinals[op.rank]);
                if op.send {
                    // SAFETY: `buf` is a device allocation of at least `bytes` bytes on this
                    // rank's device.
                    let st = unsafe { (lib.sys.send)(op.buf as *const c_void, op.bytes, u8t, peer, comm, stream) };
                    lib.ck("ncclSend", device, st)?;
                } else {
                    // SAFETY: as above, for the receive buffer.
                    let st = unsafe { (lib.sys.recv)(op.buf as *mut c_void, op.bytes, u8t, peer, comm, stream) };
                    lib.ck("ncclRecv", device, st)?;
                }
            }
            Ok(())
        })
    }

    /// One stream per communicator, each of the communicator's device.
    fn check_streams(&self, streams: &[&S]) -> Result<()> {
        if streams.len() != self.comms.len() {
            return Err(Error::Invalid(format!("{} streams for {} communicators", streams.len(), self.comms.len())));
        }
        for (st, &ordinal) in streams.iter().zip(&self.ordinals) {
            if st.ordinal() != ordinal {
                return Err(Error::Invalid(format!(
                    "stream of device {} for the communicator of device {ordinal}",
                    st.ordinal()
                )));
            }
        }
        Ok(())
    }

    /// Calls `each(lib, rank, comm, stream)` for every rank inside one group.
    fn each_rank(
        &self,
        nbufs: usize,
        streams: &[&S],
        mut each: impl FnMut(&Lib, usize, Comm, *mut c_void) -> Result<()>,
    ) -> Result<()> {
        self.check_streams(streams)?;
        if nbufs != self.comms.len() {
            return Err(Error::Invalid(format!("{nbufs} buffer pairs for {} communicators", self.comms.len())));
        }
        let lib = S::lib()?;
        lib.grouped(|| {
            for (i, &c) in self.comms.iter().enumerate() {
                each(lib, i, c, streams[i].raw())?;
            }
            Ok(())
        })
    }
}

impl<S: CclStream> Drop for Comms<S> {
    fn drop(&mut self) {
        if let Ok(lib) = S::lib() {
            for &c in &self.comms {
                // SAFETY: destroys communicators created in `new`, once each.
                let _ = unsafe { (lib.sys.comm_destroy)(c) };
            }
        }
    }
}
