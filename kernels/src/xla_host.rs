//! The host backend behind XLA's CPU FFI handlers: each Peerless call runs the host protocols ([`crate::host`]) between
//! XLA's CPU devices, on XLA's own buffers. A rewritten collective owns a [`DirectCollective`] for the executable's
//! life, or runs on the [`DirectSlot`] of its (slot, occurrence, groups, pairs), held weakly; groups across processes
//! meet in one shared-memory segment per slot (`ShmCollective::on_slot`). Every device of a group makes the same calls
//! in one order (one SPMD program per device); one that never arrives makes its peers time out, naming the missing
//! ranks. ARCHITECTURE.md ("Host protocol") has the rest.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use ffi::xla_ffi::{BufferRef, CallFrame, ErrorCode, ExecutableState, HandlerError, Traits};
use hlo::{ArrayShape, PrimitiveType};
use thunks::custom_call::CustomCallConfig;

use crate::ffi_handler::{Adopted, At, CallState, CollectiveRuntime, Slot, SlotKey, Slots, array_shape};
use crate::host::direct::{DirectCollective, DirectSlot};
use crate::host::shm::{ShmCollective, ShmKey};
use crate::{Error, Result};

/// One device's side of a call: its operands and result buffers, in XLA's order.
#[derive(Debug)]
pub struct HostCall<'a> {
    pub config: &'a CustomCallConfig,
    /// The calling device's id.
    pub device: usize,
    /// Operand bytes with their logical shapes.
    pub inputs: Vec<(&'a [u8], ArrayShape)>,
    /// Result buffers with their logical shapes.
    pub outputs: Vec<(&'a mut [u8], ArrayShape)>,
}

/// Where a collective's members meet: one process's memory, or a segment shared by the processes of a host (groups
/// across processes under jax.distributed).
#[derive(Debug)]
enum Protocol {
    Direct(DirectCollective),
    Shared(Box<ShmCollective>),
}

impl Protocol {
    fn output_lens(&self) -> Vec<usize> {
        match self {
            Protocol::Direct(c) => c.output_lens(),
            Protocol::Shared(c) => c.output_lens(),
        }
    }

    fn run(&self, device: usize, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        match self {
            Protocol::Direct(c) => c.run(device, inputs, outputs),
            Protocol::Shared(c) => c.run(device, inputs, outputs),
        }
    }
}

/// A rewritten collective: the shapes it was built for and its protocol state. Opaque outside this module.
#[derive(Debug)]
pub struct Instance {
    /// Shapes the instance was built for: every later call must match.
    shapes: (Vec<ArrayShape>, Vec<ArrayShape>),
    collective: Protocol,
}

/// Collectives alive, wherever they are held (tests watch executables free theirs).
static LIVE: AtomicUsize = AtomicUsize::new(0);

impl Drop for Instance {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Number of collective instances alive in the process.
pub fn live_clusters() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The per-executable state XLA holds for one custom call: its config and the collective, built by the first device to
/// execute.
type ExecState = CallState<Result<Arc<Instance>, String>>;

/// Where XLA keeps each executable's [`ExecState`].
static STATE: ExecutableState<ExecState> = ExecutableState::new("peerless.host_collective");

/// The states of calls XLA keeps none for.
static ADOPTED: Adopted<Result<Arc<Instance>, String>> = Adopted::new();

/// The in-process collectives' shared slots.
static SLOTS: Slots<DirectSlot> = Slots::new();

/// Staging bytes the CPU handlers' in-process collectives hold now.
pub fn staging_bytes() -> usize {
    crate::host::direct::staging_bytes()
}

/// The slot `cfg` (with a `slot`) runs on: the live one of its key, or a new one of `max(slot_bytes, bytes)` per
/// buffer. A live slot too small for this call (the pass sized it for every call, so only a config from elsewhere) or a
/// slot that cannot be allocated gives the call staging of its own, with the reason logged.
fn shared_slot(
    cfg: &CustomCallConfig,
    occurrence: u64,
    groups: &[Vec<usize>],
    bytes: usize,
) -> Result<Arc<DirectSlot>> {
    let own = || DirectSlot::new(groups, bytes).map(Arc::new);
    let Some(id) = cfg.slot else { return own() };
    let key: SlotKey = (id, occurrence, groups.to_vec(), cfg.pairs.clone());
    let want = bytes.max(usize::try_from(cfg.slot_bytes).unwrap_or(usize::MAX));
    match SLOTS.get_or_make(key, bytes, DirectSlot::per_buffer, || DirectSlot::new(groups, want).map(Arc::new)) {
        Slot::Live(slot) | Slot::Made(Ok(slot)) => Ok(slot),
        Slot::TooSmall(have) => {
            log::warn!(
                "peerless: {} '{}' stages {bytes} bytes, more than its slot's {have}: staging of its own",
                cfg.target(),
                cfg.name
            );
            own()
        }
        Slot::Made(Err(e)) if want > bytes => {
            log::warn!(
                "peerless: {} '{}': its shared slot of {want} bytes per buffer cannot be allocated ({e}); \
                 staging of its own ({bytes} bytes)",
                cfg.target(),
                cfg.name
            );
            own()
        }
        Slot::Made(Err(e)) => Err(e),
    }
}

/// A call that does not fit its collective (names the collective).
fn invalid(cfg: &CustomCallConfig, message: impl Into<String>) -> Error {
    Error::BadCall { name: cfg.name.clone(), message: message.into() }
}

impl Instance {
    /// Builds the collective of `call`; a group across processes meets under the running job's token and `occurrence`
    /// (see [`ExecState`]).
    fn build(call: &HostCall, occurrence: u64) -> Result<Instance> {
        let cfg = call.config;
        let in_shapes: Vec<ArrayShape> = call.inputs.iter().map(|(_, s)| s.clone()).collect();
        let out_shapes: Vec<ArrayShape> = call.outputs.iter().map(|(_, s)| s.clone()).collect();
        if in_shapes.is_empty() {
            return Err(invalid(cfg, "a collective needs an operand"));
        }
        let n = cfg.device_span().max(call.device + 1);
        let collective = if !cfg.spans_processes() {
            Protocol::Direct(DirectCollective::on_slot(cfg, &in_shapes, n, |groups, bytes| {
                shared_slot(cfg, occurrence, groups, bytes)
            })?)
        } else {
            // Groups across processes: every process of the host that owns a member opens the segment the running job's
            // token and the (shared) instance id name; the module holds no token (it may come from a cache, compiled by
            // another job).
            let job = thunks::runtime::job_for(cfg).map_err(|m| invalid(cfg, m))?;
            let by_device = cfg.process_of();
            let Some(&this) = by_device.get(&call.device) else {
                return Err(invalid(cfg, format!("device {} has no process in the call's attributes", call.device)));
            };
            // Devices the call does not name: process 0 (every process fills them alike, since the segment's plan
            // fingerprint covers the whole map).
            let process_of: Vec<_> = (0..n).map(|d| by_device.get(&d).copied().unwrap_or(0)).collect();
            // A slot's segment is named by the slot (its first call's instance, the same in every process) and this
            // executable's occurrence, and mapped once per process.
            let (instance, slot_bytes) = match cfg.slot {
                Some(slot) => (slot, Some(usize::try_from(cfg.slot_bytes).unwrap_or(usize::MAX))),
                None => (cfg.instance, None),
            };
            let key = ShmKey { job, instance: thunks::runtime::shared_key(instance, occurrence) };
            let shm = ShmCollective::on_slot(cfg, &in_shapes, n, &key, slot_bytes, &process_of, this)?;
            Protocol::Shared(Box::new(shm))
        };
        if collective.output_lens() != out_shapes.iter().map(ArrayShape::byte_size).collect::<Vec<_>>() {
            return Err(invalid(cfg, format!("result shapes {out_shapes:?} do not fit operands {in_shapes:?}")));
        }
        LIVE.fetch_add(1, Ordering::Relaxed);
        Ok(Instance { shapes: (in_shapes, out_shapes), collective })
    }
}

/// Checks a call's buffers against its shapes.
fn check_call(call: &HostCall) -> Result<()> {
    let cfg = call.config;
    let operands = call.inputs.iter().map(|(b, s)| ("operand", b.len(), s));
    for (what, len, shape) in operands.chain(call.outputs.iter().map(|(b, s)| ("result", b.len(), s))) {
        if len != shape.byte_size() {
            return Err(invalid(cfg, format!("{what} of {len} bytes for shape {shape}")));
        }
    }
    if call.inputs.len() != call.outputs.len() {
        return Err(invalid(cfg, format!("{} operands but {} results", call.inputs.len(), call.outputs.len())));
    }
    if let Some((_, s)) = call.inputs.iter().find(|(_, s)| s.ty.byte_size() == 0 || s.ty == PrimitiveType::Token) {
        return Err(invalid(cfg, format!("element type {} cannot move", s.ty)));
    }
    Ok(())
}

/// Runs one device's side of `call` in its `state`, whose collective the first device to run builds (freed with the
/// executable).
fn run_in(state: &ExecState, call: HostCall) -> Result<()> {
    check_call(&call)?;
    let inst = state
        .instance
        .get_or_init(|| Instance::build(&call, state.occurrence).map(Arc::new).map_err(|e| e.to_string()));
    let cfg = call.config;
    inst.as_ref().map_err(|m| invalid(cfg, m.clone())).and_then(|i| run_on(i, call))
}

/// Runs `call` on `instance`: XLA's buffers in and out, no copies of results.
fn run_on(instance: &Instance, call: HostCall) -> Result<()> {
    let cfg = call.config;
    let same_shapes = call.inputs.iter().map(|(_, s)| s).eq(&instance.shapes.0)
        && call.outputs.iter().map(|(_, s)| s).eq(&instance.shapes.1);
    if !same_shapes {
        return Err(invalid(cfg, "called with other shapes than the first call of this collective"));
    }
    let inputs: Vec<&[u8]> = call.inputs.iter().map(|(b, _)| *b).collect();
    let mut outputs: Vec<&mut [u8]> = call.outputs.into_iter().map(|(b, _)| b).collect();
    instance.collective.run(call.device, &inputs, &mut outputs)
}

/// An XLA:CPU operand buffer's bytes.
fn host_bytes<'b>(b: &BufferRef<'b>) -> Result<&'b [u8], HandlerError> {
    let len = b.byte_len()?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: on XLA:CPU a buffer's `data` is host memory holding `len` bytes (its dtype and dims), valid for the
    // duration of the call; operands are only read.
    Ok(unsafe { std::slice::from_raw_parts(b.data as *const u8, len) })
}

/// An XLA:CPU result buffer's bytes, writable.
///
/// # Safety
/// No other reference to the buffer's bytes may be alive while the slice is used.
unsafe fn host_bytes_mut<'b>(b: &BufferRef<'b>) -> Result<&'b mut [u8], HandlerError> {
    let len = b.byte_len()?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: host memory of `len` bytes valid for the call; the caller holds the only reference.
    Ok(unsafe { std::slice::from_raw_parts_mut(b.data as *mut u8, len) })
}

/// The CPU platform's [`CollectiveRuntime`]: XLA:CPU buffers are host memory.
#[derive(Debug, Default)]
pub struct HostRuntime;

impl CollectiveRuntime for HostRuntime {
    type Instance = Result<Arc<Instance>, String>;

    fn platform(&self) -> &'static str {
        "cpu"
    }

    fn traits(&self) -> Traits {
        0
    }

    fn executable_state(&self) -> &'static ExecutableState<ExecState> {
        &STATE
    }

    fn adopted(&self) -> &'static Adopted<Self::Instance> {
        &ADOPTED
    }

    fn execute(&self, f: &CallFrame<'_>, at: &At<'_, Self::Instance>) -> Result<(), HandlerError> {
        let At { call, state, device, .. } = *at;
        let (args, rets) = (crate::ffi_handler::operands(f, call)?, f.rets()?);
        let input = |a| array_shape(a).and_then(|shape| Ok((host_bytes(a)?, shape)));
        let mut inputs: Vec<(&[u8], ArrayShape)> = args.iter().map(input).collect::<Result<_, _>>()?;
        // SAFETY: result buffers are distinct from each other and from the operands (the pass's custom calls declare
        // no output-operand aliasing), so this is the only reference to these bytes during the call.
        let output = |r| array_shape(r).and_then(|shape| Ok((unsafe { host_bytes_mut(r)? }, shape)));
        let mut outputs: Vec<(&mut [u8], ArrayShape)> = rets.iter().map(output).collect::<Result<_, _>>()?;
        // A fused epilogue: the all-reduce runs on the first operand into a buffer of its own, then the epilogue reads
        // it and writes `h` and `y`.
        let mut fused = None;
        if let Some(e) = &call.epilogue {
            let extra = e.extra_operands();
            if inputs.len() != 1 + extra || outputs.len() != 2 {
                return Err(HandlerError::invalid_argument(format!(
                    "'{}': a fused call takes {} operands and returns 2 results, not {} and {}",
                    call.name,
                    1 + extra,
                    inputs.len(),
                    outputs.len()
                )));
            }
            let a = inputs[0].1.clone();
            let dims_fit = outputs.iter().all(|r| r.1.dims == a.dims)
                && inputs[1].1.dims == a.dims
                && inputs.get(2).is_none_or(|g| g.1.dims == [*a.dims.last().unwrap_or(&0)]);
            let types_fit =
                inputs.iter().map(|r| r.1.ty).chain(outputs.iter().map(|r| r.1.ty)).all(crate::epilogue::supports);
            if !dims_fit || !types_fit {
                return Err(HandlerError::invalid_argument(format!(
                    "'{}': the fused call's shapes or types do not fit its epilogue",
                    call.name
                )));
            }
            inputs.truncate(1);
            outputs.clear();
            fused = Some((e, a));
        }
        let mut sum = vec![0u8; fused.as_ref().map_or(0, |f| f.1.byte_size())];
        if let Some((_, shape)) = &fused {
            outputs.push((&mut sum[..], shape.clone()));
        }
        let call = HostCall { config: call, device, inputs, outputs };
        let result = run_in(state, call);
        if let (Ok(()), Some((e, shape))) = (&result, fused) {
            let d = shape.dims.last().copied().unwrap_or(0) as usize;
            let bytes_and_type = |b| -> Result<_, HandlerError> { Ok((host_bytes(b)?, array_shape(b)?.ty)) };
            let x = bytes_and_type(&args[1])?;
            let g = args.get(2).map(bytes_and_type).transpose()?;
            let (h_ty, y_ty) = (array_shape(&rets[0])?.ty, array_shape(&rets[1])?.ty);
            // SAFETY: as above: the two result buffers are distinct host memory of their shapes, and nothing else
            // refers to them now (the protocol wrote `sum`).
            let (h, y) = unsafe { (host_bytes_mut(&rets[0])?, host_bytes_mut(&rets[1])?) };
            crate::epilogue::apply(e, d, (&sum, shape.ty), x, g, h, h_ty, y, y_ty, &crate::epilogue::sum_of_squares);
        }
        result.map_err(|e| {
            let code = if e.is_timeout() {
                ErrorCode::DeadlineExceeded
            } else if e.is_invalid_argument() {
                ErrorCode::InvalidArgument
            } else {
                ErrorCode::Internal
            };
            HandlerError::new(code, e.to_string())
        })
    }
}

#[cfg(test)]
#[path = "../tests/unit/xla_host.rs"]
mod tests;
