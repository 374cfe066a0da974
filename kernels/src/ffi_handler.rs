//! Thunks as XLA FFI handlers: the phases XLA drives (instantiate / prepare / initialize / execute) for every Peerless
//! custom call, independent of the platform.
//!
//! A platform supplies a [`CollectiveRuntime`] (the host backend on CPU, the peer-access kernels on CUDA); the C ABI
//! layer (plugin) wraps [`dispatch`] in `ffi::xla_ffi::guard_with_traits`, which answers XLA's metadata probe with the
//! runtime's traits; [`dispatch`] parses the call's [`CustomCallConfig`] from its attributes at INSTANTIATE into a
//! [`CallState`] (XLA's per-executable state, or where XLA keeps none one [`Adopted`] for the process), finds the
//! calling device, and hands INITIALIZE and EXECUTE to the runtime with that state: one path, whoever holds the state.
//! Every error, and any panic, becomes an XLA FFI error (JAX raises it as an exception); nothing unwinds into XLA.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use ffi::xla_ffi::{BufferRef, CallFrame, ErrorCode, ExecutableState, ExecutionStage, HandlerError, Traits};
use hlo::{ArrayShape, PrimitiveType};

use thunks::CollectiveKind;
use thunks::custom_call::{AttrSource, CustomCallConfig};

/// A platform's implementation of the Peerless custom calls.
pub trait CollectiveRuntime: Sync {
    /// What the runtime keeps for one call of an executable beside its config (a [`CallState`]'s instance).
    type Instance: Send + Sync + 'static;
    /// The platform as the Python package names it ("cpu", "cuda").
    fn platform(&self) -> &'static str;
    /// Traits the handlers declare in the metadata probe (command-buffer compatibility).
    fn traits(&self) -> Traits;
    /// Where XLA keeps this runtime's per-executable state for a call (set at INSTANTIATE: once per executable and
    /// custom call, also for an executable loaded from a persistent compilation cache, which the pass never saw;
    /// destroyed with the executable).
    fn executable_state(&self) -> &'static ExecutableState<CallState<Self::Instance>>;
    /// Where this runtime keeps the states of calls XLA keeps none for (one per runtime, a `static`).
    fn adopted(&self) -> &'static Adopted<Self::Instance>;
    /// The INITIALIZE stage on `device` (its device id; `ordinal`: the platform's local ordinal), outside any stream
    /// capture: set up per-collective state that must not be created while XLA records a command buffer.
    fn initialize(&self, _frame: &CallFrame<'_>, _at: &At<'_, Self::Instance>) -> Result<(), HandlerError> {
        Ok(())
    }
    /// The device id of the device XLA calls the handler on, from the ordinal XLA reports (XLA:CPU reports the id
    /// itself; a GPU reports its local ordinal, which is the id only in a process that owns every device).
    fn device_id(&self, ordinal: usize) -> Result<usize, HandlerError> {
        Ok(ordinal)
    }
    /// Runs the call.
    fn execute(&self, frame: &CallFrame<'_>, at: &At<'_, Self::Instance>) -> Result<(), HandlerError>;
}

/// Where a stage of a call runs: the call's config, its state (XLA's or adopted), and the calling device (its id in the
/// job and the platform's local ordinal).
#[derive(Debug)]
pub struct At<'a, I> {
    pub call: &'a CustomCallConfig,
    pub state: &'a CallState<I>,
    pub device: usize,
    pub ordinal: usize,
}

/// What XLA keeps for one call of an executable (FFI state set at INSTANTIATE, dropped with the executable), in every
/// runtime: the call's config, parsed once, its instance (the runtime's type, made by the first device to need it), the
/// GPUs whose INITIALIZE ran, and the executable's occurrence of the call (see [`CallState::for_call`]).
#[derive(Debug)]
pub struct CallState<I> {
    /// The call's attributes as INSTANTIATE parsed them (the hot path reads no attribute).
    pub config: CustomCallConfig,
    pub instance: OnceLock<I>,
    /// Bit o: INITIALIZE finished on GPU ordinal o (XLA repeats the stage on every execution; with command buffers it
    /// is the only stage that reaches a handler).
    initialized: std::sync::atomic::AtomicU64,
    /// For a group across processes or a shared slot: how many executables of this process instantiated the call's
    /// `instance` before this one (two loads of one module never share; every process counts alike,
    /// [`thunks::runtime::shared_key`]).
    pub occurrence: u64,
}

impl<I> CallState<I> {
    /// The state INSTANTIATE hands XLA for `cfg` (the occurrence counted here, once per executable, in the order every
    /// process loads them).
    pub fn for_call(cfg: &CustomCallConfig) -> Self {
        let occurrence = if cfg.spans_processes() || cfg.slot.is_some() {
            thunks::runtime::next_occurrence(cfg.instance)
        } else {
            0
        };
        CallState { config: cfg.clone(), instance: OnceLock::new(), initialized: 0.into(), occurrence }
    }

    /// Whether INITIALIZE finished on GPU `ordinal`.
    pub fn initialized_on(&self, ordinal: usize) -> bool {
        ordinal < 64 && self.initialized.load(std::sync::atomic::Ordering::Acquire) & (1 << ordinal) != 0
    }

    /// Records that INITIALIZE finished on GPU `ordinal`.
    pub fn mark_initialized(&self, ordinal: usize) {
        if ordinal < 64 {
            self.initialized.fetch_or(1 << ordinal, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// The states of calls XLA keeps none for (an XLA without FFI state, or a failed `state_set`), made at INSTANTIATE and
/// kept for the process by the call's `instance`: an open-addressed table of atomic keys, so a stage finds its state
/// with one attribute read and no lock, allocation or formatting, as with XLA's state. Two executables of one module
/// share a state here (XLA's state would tell them apart).
pub struct Adopted<I>(OnceLock<Box<[AdoptedSlot<I>]>>);

struct AdoptedSlot<I> {
    /// `instance + 1` (0: free); claimed once, never released.
    key: std::sync::atomic::AtomicU64,
    /// Boxed: a free slot costs a pointer, not a whole call's state.
    state: OnceLock<Box<CallState<I>>>,
}

/// Calls a process may run without XLA's state.
pub const ADOPTED_CALLS: usize = 4096;

impl<I> Adopted<I> {
    pub const fn new() -> Self {
        Adopted(OnceLock::new())
    }

    fn slots(&self) -> &[AdoptedSlot<I>] {
        self.0
            .get_or_init(|| (0..ADOPTED_CALLS).map(|_| AdoptedSlot { key: 0.into(), state: OnceLock::new() }).collect())
    }

    /// The slot of `instance`: its own, or (`claim`) a free one claimed for it.
    fn slot(&self, instance: u64, claim: bool) -> Option<&AdoptedSlot<I>> {
        use std::sync::atomic::Ordering;
        let (slots, key) = (self.slots(), instance.wrapping_add(1));
        // Fibonacci hashing: instance ids are a random base plus a counter.
        let start = (instance.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize;
        for k in 0..slots.len() {
            let s = &slots[(start + k) % slots.len()];
            match s.key.load(Ordering::Acquire) {
                k if k == key => return Some(s),
                0 if !claim => return None,
                0 => match s.key.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Some(s),
                    Err(k) if k == key => return Some(s),
                    Err(_) => {}
                },
                _ => {}
            }
        }
        None
    }

    /// The state kept for `state`'s instance: `state`, unless one is kept already.
    pub fn adopt(&self, state: CallState<I>) -> Result<&CallState<I>, HandlerError> {
        let Some(slot) = self.slot(state.config.instance, true) else {
            let name = &state.config.name;
            let what =
                format!("'{name}': more than {ADOPTED_CALLS} Peerless calls in a process whose XLA keeps no FFI state");
            return Err(HandlerError::new(ErrorCode::ResourceExhausted, what));
        };
        Ok(slot.state.get_or_init(|| Box::new(state)))
    }

    /// The state adopted for `instance`, if any.
    pub fn find(&self, instance: u64) -> Option<&CallState<I>> {
        self.slot(instance, false).map(|s| &**s.state.wait())
    }
}

impl<I> Default for Adopted<I> {
    fn default() -> Self {
        Self::new()
    }
}

/// What a shared staging slot is keyed by: the pass's slot id, the executable's occurrence of the call's instance (two
/// loads of one module never share), and (defensively: the pass gives a slot one group set) groups and pairs.
pub type SlotKey = (u64, u64, Vec<Vec<usize>>, Vec<(usize, usize)>);

/// The shared staging slots of a runtime (the CPU's, each GPU vendor's), held weakly: a slot lives as long as a call of
/// an executable holds it.
#[derive(Debug)]
pub struct Slots<T>(OnceLock<Mutex<HashMap<SlotKey, Weak<T>>>>);

/// What [`Slots::get_or_make`] found.
pub enum Slot<T, E> {
    /// The live slot of the key, large enough.
    Live(Arc<T>),
    /// The live slot of the key holds this many bytes, fewer than the call needs (only a config from elsewhere: the
    /// pass sizes a slot for every call of it).
    TooSmall(usize),
    /// None was live: what `make` gave (kept under the key when made).
    Made(Result<Arc<T>, E>),
}

impl<T> Slots<T> {
    pub const fn new() -> Self {
        Slots(OnceLock::new())
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<SlotKey, Weak<T>>> {
        self.0.get_or_init(Default::default).lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live slot of `key` if `size(slot) >= need`; else, where none is live, a new one from `make`, kept under
    /// `key`. Forgets the slots of freed executables.
    pub fn get_or_make<E>(
        &self,
        key: SlotKey,
        need: usize,
        size: impl Fn(&T) -> usize,
        make: impl FnOnce() -> Result<Arc<T>, E>,
    ) -> Slot<T, E> {
        let mut map = self.map();
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(slot) = map.get(&key).and_then(Weak::upgrade) {
            let have = size(&slot);
            return if have >= need { Slot::Live(slot) } else { Slot::TooSmall(have) };
        }
        let made = make();
        if let Ok(slot) = &made {
            map.insert(key, Arc::downgrade(slot));
        }
        Slot::Made(made)
    }
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The call frame's attributes, as [`CustomCallConfig::from_attrs`] reads them.
struct FrameAttrs<'a, 'f>(&'a CallFrame<'f>);

fn missing_is_none<T>(r: Result<T, HandlerError>) -> Result<Option<T>, String> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(HandlerError::MissingAttr { .. }) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl AttrSource for FrameAttrs<'_, '_> {
    fn names(&self) -> Result<Vec<String>, String> {
        self.0.attr_names().map(|v| v.into_iter().map(str::to_owned).collect()).map_err(|e| e.to_string())
    }
    fn i64(&self, name: &str) -> Result<Option<i64>, String> {
        missing_is_none(self.0.attr_i64(name))
    }
    fn str(&self, name: &str) -> Result<Option<String>, String> {
        missing_is_none(self.0.attr_str(name).map(str::to_owned))
    }
    fn i64_array(&self, name: &str) -> Result<Option<Vec<i64>>, String> {
        missing_is_none(self.0.attr_i64_array(name))
    }
}

/// The element type of a buffer, as the IR names it; sub-byte and unknown types are an error (the pass never sends them
/// to a kernel: XLA packs them, the kernels do not).
pub fn element_type(b: &BufferRef<'_>) -> Result<PrimitiveType, HandlerError> {
    let name = b.dtype.name();
    match PrimitiveType::from_name(name) {
        Some(t) if !matches!(t, PrimitiveType::S4 | PrimitiveType::U4) && b.dtype.byte_width().is_some() => Ok(t),
        _ => Err(HandlerError::invalid_argument(format!("element type {name} cannot run on a Peerless kernel"))),
    }
}

/// The call's operand buffers, without the trailing ones that only order it after another call
/// ([`CustomCallConfig::order_operands`]).
pub fn operands<'a>(f: &CallFrame<'a>, call: &CustomCallConfig) -> Result<Vec<BufferRef<'a>>, HandlerError> {
    let mut args = f.args()?;
    if call.order_operands > args.len() {
        return Err(HandlerError::invalid_argument(format!(
            "'{}': {} ordering operands, but the call has {} operand buffers",
            call.name,
            call.order_operands,
            args.len()
        )));
    }
    args.truncate(args.len() - call.order_operands);
    Ok(args)
}

/// A buffer's logical shape.
pub fn array_shape(b: &BufferRef<'_>) -> Result<ArrayShape, HandlerError> {
    Ok(ArrayShape::new(element_type(b)?, b.dims.to_vec()))
}

/// The state adopted for the call of `f` (its `instance` attribute), adopted now if INSTANTIATE never reached this
/// process's handlers for it.
#[cold]
fn adopted<'r, R: CollectiveRuntime>(
    kind: CollectiveKind,
    f: &CallFrame<'_>,
    rt: &'r R,
) -> Result<&'r CallState<R::Instance>, HandlerError> {
    let instance = f.attr_i64("instance").ok().and_then(|i| u64::try_from(i).ok());
    if let Some(s) = instance.and_then(|i| rt.adopted().find(i)) {
        return Ok(s);
    }
    rt.adopted().adopt(CallState::for_call(&parse(kind, f)?))
}

/// The call's config from its attributes (INSTANTIATE; the only parse of a call's life).
fn parse(kind: CollectiveKind, f: &CallFrame<'_>) -> Result<CustomCallConfig, HandlerError> {
    CustomCallConfig::from_attrs(kind, &FrameAttrs(f)).map_err(|e| {
        HandlerError::invalid_argument(format!("{}: {e}", thunks::custom_call::target_name(kind).unwrap_or("?")))
    })
}

/// The handler body for a custom call of `kind`. One read of XLA's state and of the device ordinal per stage; the
/// stages get them ([`At`]).
pub fn dispatch<R: CollectiveRuntime>(kind: CollectiveKind, f: &CallFrame<'_>, rt: &R) -> Result<(), HandlerError> {
    // Instantiate: per-executable state (before any device runs), the config parsed once. Prepare: nothing to declare.
    // Initialize: the runtime sets up this device's part of the collective's state (peers' parts are joined on
    // execute), once per device.
    let stage = f.stage();
    if !matches!(stage, ExecutionStage::Execute | ExecutionStage::Initialize | ExecutionStage::Instantiate) {
        return Ok(());
    }
    if stage == ExecutionStage::Instantiate {
        let call = parse(kind, f)?;
        // An executable this process did not compile (a persistent cache hit) tells `stats()` its decisions here.
        thunks::runtime::instantiated(rt.platform(), &call);
        // Where XLA keeps no state, the process keeps one: later stages take the same path.
        if let Err(state) = rt.executable_state().instantiate_with(f, CallState::for_call(&call)) {
            rt.adopted().adopt(state)?;
        }
        return Ok(());
    }
    let state = rt.executable_state().get(f).map_or_else(|| adopted(kind, f, rt), Ok)?;
    let ordinal = f.device_ordinal()?;
    let ordinal = usize::try_from(ordinal)
        .map_err(|_| HandlerError::new(ErrorCode::Internal, format!("XLA reported device ordinal {ordinal}")))?;
    // The replay path (command buffers reach only this stage): done before any lookup.
    if stage == ExecutionStage::Initialize && state.initialized_on(ordinal) {
        return Ok(());
    }
    let call = &state.config;
    let device = rt.device_id(ordinal)?;
    if kind != CollectiveKind::CollectivePermute && call.group_of(device).is_none() {
        return Err(HandlerError::invalid_argument(format!(
            "{} '{}': device {device} is in none of its groups {}",
            call.target(),
            call.name,
            thunks::fmt_groups(&call.groups)
        )));
    }
    let at = At { call, state, device, ordinal };
    if stage == ExecutionStage::Initialize {
        return rt.initialize(f, &at);
    }
    rt.execute(f, &at)
}

#[cfg(test)]
#[path = "../tests/unit/ffi_handler.rs"]
mod tests;
