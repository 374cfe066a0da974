//! The host backend's executor: a verified module becomes one thunk program per device
//! (emitter), and [`HostExecutable::execute`] runs device `d`'s program on worker thread
//! `d` against a [`HostCluster`] of per-device arenas.
//!
//! Phases (thunks' [`Backend`]): `prepare` reads the programs' resources (the arena
//! size, which already holds every collective's scratch and signals); `initialize`
//! creates the cluster once per executable; `execute` only launches: it copies the
//! arguments into each device's parameter regions, runs the thunks in order, and copies
//! the result leaves out.
//!
//! - **Compute thunks** run the reference interpreter's per-op code on the device's
//!   values ([`interp::single::InstrEvaluator`]); collective thunks call
//!   [`HostDevice::run_collective`]; `-done` thunks are no-ops (the start ran it).
//! - **Progress**: each device records the last thunk it completed, so a failure or a
//!   hang report names where every device stopped.
//! - **Failures**: the first error on a device ends that device's program; peers blocked
//!   in a collective with it end by their own `--collective_timeout_ms`, never hang. The
//!   error returned is a root cause if there is one (an error other than a timeout),
//!   else the lowest device's timeout, which names the ranks that never arrived.
//! - **Recovery**: a failed execution leaves signal epochs out of step between devices
//!   (some devices entered a collective that others never did), so it poisons the
//!   cluster; the next `execute` re-initializes it (fresh zeroed arenas, epochs back in
//!   step) before running. Executions of one executable are serialised; different
//!   executables have their own clusters and never interfere.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use emitter::{DeviceMode, Flags, PeerAccessTable, PlannedCollective, ValueInfo};
use hlo::{Array, InstrId, Literal, Module, Shape};
use interp::RunConfig;
use interp::single::InstrEvaluator;
use thunks::{Backend, CollectiveConfig, Implementation, Resources, ScratchSizer, Thunk, ThunkProgram};

use crate::host::{self, CollectiveCall, HostCluster, HostDevice, PeerMatrix};
use crate::{Error, Result};

/// The host backend's scratch and signal sizes, for the emitter's buffer assignment.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostSizer;

impl ScratchSizer for HostSizer {
    fn scratch_bytes(&self, config: &CollectiveConfig, implementation: Implementation) -> usize {
        host::scratch_bytes(config, implementation)
    }
    fn signal_bytes(&self, config: &CollectiveConfig, implementation: Implementation) -> usize {
        host::signal_bytes(config, implementation)
    }
}

/// The interpreter's knowledge of per-device shapes, for buffer assignment.
struct EvalInfo<'a>(&'a InstrEvaluator);

impl ValueInfo for EvalInfo<'_> {
    fn local_shape(&self, module: &Module, id: InstrId) -> Shape {
        self.0.local_shape(module, id)
    }
    fn transforms_operands(&self, id: InstrId) -> bool {
        self.0.cuts_operands(id)
    }
}

/// A module lowered for a device set (what the host executor runs):
/// the inlined module, the per-instruction evaluator and one program per device (each
/// thunk carries the shapes its regions hold).
pub(crate) struct Lowered {
    pub(crate) module: Module,
    pub(crate) evaluator: InstrEvaluator,
    pub(crate) programs: Vec<ThunkProgram>,
    pub(crate) planned: Vec<PlannedCollective>,
    pub(crate) param_shapes: Vec<Shape>,
    /// The root's value shape (before any result sharding).
    pub(crate) root_shape: Shape,
}

/// Inlines calls, plans every collective with `flags` against `table`, assigns buffers with
/// `sizer`'s scratch and signal sizes, and builds one program per device.
pub(crate) fn lower(
    module: &Module,
    num_devices: usize,
    mode: DeviceMode,
    flags: &Flags,
    table: &PeerAccessTable,
    sizer: &impl ScratchSizer,
) -> Result<Lowered> {
    if num_devices == 0 {
        return Err(Error::BadArguments("num_devices must be at least 1".into()));
    }
    let flat = emitter::inline_calls(module)?;
    let evaluator = InstrEvaluator::new(&flat, &RunConfig { num_devices, mode })?;
    let built = emitter::build_programs(&flat, num_devices, mode, flags, table, &EvalInfo(&evaluator), sizer)?;
    let param_shapes = evaluator.param_shapes().to_vec();
    let root_shape = evaluator.local_shape(&flat, flat.entry().root);
    Ok(Lowered { programs: built.programs, planned: built.planned, param_shapes, root_shape, evaluator, module: flat })
}

/// Reads a value of `shape` from its array leaves' regions with `read(offset, len)`.
pub(crate) fn read_value(
    regions: &[thunks::Region],
    shape: &Shape,
    mut read: impl FnMut(usize, usize) -> Result<Vec<u8>, String>,
) -> Result<Literal, String> {
    let leaf_shapes = shape.leaves();
    if leaf_shapes.len() != regions.len() {
        return Err(format!("{} regions for {} array leaves of {shape}", regions.len(), leaf_shapes.len()));
    }
    let mut arrays = Vec::with_capacity(regions.len());
    for (r, s) in regions.iter().zip(leaf_shapes) {
        let bytes = read(r.offset, r.len)?;
        arrays.push(Array::new(s.clone(), bytes).map_err(|e| e.to_string())?);
    }
    Literal::from_leaves(shape, &mut arrays.into_iter()).ok_or_else(|| format!("cannot build a value of {shape}"))
}

/// Writes `value`'s array leaves into their regions with `write(offset, bytes)`.
pub(crate) fn write_value(
    regions: &[thunks::Region],
    value: &Literal,
    mut write: impl FnMut(usize, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let leaves = value.leaves();
    if leaves.len() != regions.len() {
        return Err(format!("value has {} array leaves, {} regions", leaves.len(), regions.len()));
    }
    for (r, a) in regions.iter().zip(leaves) {
        if a.data.len() != r.len {
            return Err(format!("leaf of {} bytes for a region of {}", a.data.len(), r.len));
        }
        write(r.offset, &a.data)?;
    }
    Ok(())
}

/// Checks `args` (per device, per parameter) against the entry's per-device shapes.
pub(crate) fn check_args(args: &[Vec<Literal>], num_devices: usize, param_shapes: &[Shape]) -> Result<()> {
    if args.len() != num_devices {
        return Err(Error::BadArguments(format!("{} devices' argument lists for {num_devices} devices", args.len())));
    }
    for (d, a) in args.iter().enumerate() {
        if a.len() != param_shapes.len() {
            return Err(Error::BadArguments(format!(
                "device {d}: {} arguments, the entry computation takes {}",
                a.len(),
                param_shapes.len()
            )));
        }
        for (i, (v, want)) in a.iter().zip(param_shapes).enumerate() {
            let got = v.shape();
            if !got.compatible(want) {
                return Err(Error::BadArguments(format!("parameter {i} on device {d}: expected {want}, got {got}")));
            }
        }
    }
    Ok(())
}

/// Something a test can inject into one execution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Device `device` skips collective `collective` (by instruction name), as if it never
    /// arrived; its peers time out waiting for it.
    WithholdRank { device: usize, collective: String },
    /// Device `device` fails with an error just before collective `collective`, as a worker
    /// whose own work broke would; its peers time out waiting for it, and the returned
    /// error is this root cause.
    FailBefore { device: usize, collective: String },
}

/// The host backend: programs plus what running them needs (module, evaluator, timeout).
pub struct HostBackend {
    module: Module,
    evaluator: InstrEvaluator,
    num_devices: usize,
    peers: Arc<PeerMatrix>,
    timeout: Duration,
    param_shapes: Vec<Shape>,
    /// The root's value shape (before any result sharding).
    root_shape: Shape,
    /// Per device, 1 + index of the last completed thunk (0: none yet).
    progress: Vec<AtomicUsize>,
    fault: Mutex<Option<Fault>>,
}

impl fmt::Debug for HostBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBackend")
            .field("module", &self.module.name)
            .field("num_devices", &self.num_devices)
            .finish_non_exhaustive()
    }
}

/// How one device's run ended: where, and the error itself (kept as the `Device` error's
/// source).
struct DeviceFailure {
    thunk: usize,
    label: String,
    cause: Box<Error>,
}

impl HostBackend {
    fn progress_report(&self, programs: &[ThunkProgram]) -> String {
        let parts: Vec<String> = self
            .progress
            .iter()
            .enumerate()
            .map(|(d, p)| match p.load(Ordering::Acquire).checked_sub(1) {
                None => format!("d{d}: none"),
                Some(k) => {
                    let label = programs.get(d).and_then(|pr| pr.thunks.get(k)).map_or_else(String::new, Thunk::label);
                    format!("d{d}: #{k} {label}")
                }
            })
            .collect();
        parts.join(", ")
    }

    fn read_leaves(&self, dev: &HostDevice, regions: &[thunks::Region], shape: &Shape) -> Result<Literal, String> {
        read_value(regions, shape, |o, l| dev.read(o, l).map_err(|e| e.to_string()))
    }

    fn write_leaves(dev: &HostDevice, regions: &[thunks::Region], value: &Literal) -> Result<(), String> {
        write_value(regions, value, |o, b| dev.write(o, b).map_err(|e| e.to_string()))
    }

    fn run_thunk(&self, dev: &HostDevice, thunk: &Thunk) -> Result<()> {
        let d = dev.rank();
        let plain = Error::Thunk;
        match thunk {
            Thunk::Compute { instr, inputs, outputs, operand_shapes, .. } => {
                let mut operands = Vec::with_capacity(operand_shapes.len());
                let mut at = 0usize;
                for s in operand_shapes {
                    let n = s.leaves().len();
                    let regions = inputs.get(at..at + n).ok_or_else(|| plain("operand regions".into()))?;
                    operands.push(self.read_leaves(dev, regions, s).map_err(plain)?);
                    at += n;
                }
                let value = self.evaluator.eval(&self.module, *instr, &operands, d)?;
                Self::write_leaves(dev, outputs, &value).map_err(plain)
            }
            Thunk::Copy { src, dst, len, .. } => dev.copy_within(*src, *dst, *len),
            Thunk::Collective {
                name,
                config,
                implementation,
                inputs,
                outputs,
                operand_shapes,
                scratch,
                signals,
                ..
            } => {
                match &*self.fault.lock().unwrap_or_else(|e| e.into_inner()) {
                    Some(Fault::WithholdRank { device, collective }) if *device == d && collective == name => {
                        return Ok(());
                    }
                    Some(Fault::FailBefore { device, collective }) if *device == d && collective == name => {
                        return Err(plain(format!("injected fault: device {d} failed before collective '{name}'")));
                    }
                    _ => {}
                }
                let region = |r: &thunks::Region| host::Region::new(r.offset, r.len);
                let call = CollectiveCall {
                    config,
                    implementation: *implementation,
                    inputs: inputs.iter().map(region).collect(),
                    outputs: outputs.iter().map(region).collect(),
                    operand_shapes: operand_shapes.clone(),
                    scratch: region(scratch),
                    signals: region(signals),
                    timeout: self.timeout,
                    name,
                };
                dev.run_collective(&call)
            }
            Thunk::CollectiveDone { .. } => Ok(()),
        }
    }

    fn run_device(&self, dev: &HostDevice, program: &ThunkProgram, args: &[Literal]) -> Result<Literal, DeviceFailure> {
        let d = dev.rank();
        let setup =
            |m: String| DeviceFailure { thunk: 0, label: "(arguments)".into(), cause: Box::new(Error::Thunk(m)) };
        if args.len() != program.params.len() {
            return Err(setup(format!("{} arguments for {} parameters", args.len(), program.params.len())));
        }
        for (i, (arg, regions)) in args.iter().zip(&program.params).enumerate() {
            Self::write_leaves(dev, regions, arg).map_err(|e| setup(format!("parameter {i}: {e}")))?;
        }
        let progress = self.progress.get(d);
        for (k, thunk) in program.thunks.iter().enumerate() {
            self.run_thunk(dev, thunk).map_err(|e| DeviceFailure {
                thunk: k,
                label: thunk.label(),
                cause: Box::new(e),
            })?;
            if let Some(p) = progress {
                p.store(k + 1, Ordering::Release);
            }
        }
        let last = program.thunks.len();
        let done = |e: Error| DeviceFailure { thunk: last, label: "(results)".into(), cause: Box::new(e) };
        let root = self.read_leaves(dev, &program.results, &self.root_shape).map_err(|m| done(Error::Thunk(m)))?;
        self.evaluator.finish_result(&self.module, root, d).map_err(|e| done(e.into()))
    }

    fn check_args(&self, args: &[Vec<Literal>]) -> Result<()> {
        check_args(args, self.num_devices, &self.param_shapes)
    }
}

impl Backend for HostBackend {
    type Initialized = Arc<HostCluster>;
    type Error = crate::Error;

    fn prepare(&self, programs: &[ThunkProgram]) -> Result<Resources> {
        if programs.len() != self.num_devices {
            return Err(Error::BadArguments(format!("{} programs for {} devices", programs.len(), self.num_devices)));
        }
        Ok(Resources::of(programs))
    }

    fn initialize(&self, resources: &Resources) -> Result<Arc<HostCluster>> {
        HostCluster::new(resources.num_devices, resources.arena_bytes.max(1), Arc::clone(&self.peers))
            .map_err(|e| Error::Cluster(Box::new(e)))
    }

    fn execute(
        &self,
        cluster: &Arc<HostCluster>,
        programs: &[ThunkProgram],
        args: &[Vec<Literal>],
    ) -> Result<Vec<Literal>> {
        self.check_args(args)?;
        if programs.len() != self.num_devices || cluster.num_devices() != self.num_devices {
            return Err(Error::BadArguments("programs, cluster and device count disagree".into()));
        }
        for p in &self.progress {
            p.store(0, Ordering::Release);
        }
        let outcomes: Vec<Result<Literal, DeviceFailure>> = std::thread::scope(|s| {
            let handles: Vec<_> = programs
                .iter()
                .zip(args)
                .map(|(program, a)| {
                    let dev = cluster.device(program.device);
                    s.spawn(move || self.run_device(&dev, program, a))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(DeviceFailure {
                            thunk: 0,
                            label: "(worker)".into(),
                            cause: Box::new(Error::Thunk("worker thread panicked".into())),
                        })
                    })
                })
                .collect()
        });
        let mut results = Vec::with_capacity(outcomes.len());
        let mut failures = Vec::new();
        for (d, o) in outcomes.into_iter().enumerate() {
            match o {
                Ok(v) => results.push(v),
                Err(f) => failures.push((d, f)),
            }
        }
        // A root cause (not a timeout) first; else the lowest device's timeout.
        let pick = failures.iter().position(|(_, f)| !f.cause.is_timeout()).unwrap_or(0);
        if let Some((device, f)) = failures.into_iter().nth(pick) {
            return Err(Error::Device {
                device,
                thunk: f.thunk,
                label: f.label,
                cause: f.cause,
                progress: self.progress_report(programs),
            });
        }
        Ok(results)
    }
}

/// The cluster an executable runs on, and whether a failed execution left it out of step.
struct ClusterState {
    cluster: Arc<HostCluster>,
    poisoned: bool,
}

/// A module compiled for the host backend on `num_devices` devices.
pub struct HostExecutable {
    backend: HostBackend,
    programs: Vec<ThunkProgram>,
    planned: Vec<PlannedCollective>,
    resources: Resources,
    state: Mutex<ClusterState>,
}

impl fmt::Debug for HostExecutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostExecutable")
            .field("backend", &self.backend)
            .field("resources", &self.resources)
            .finish_non_exhaustive()
    }
}

fn peer_matrix(table: &PeerAccessTable, n: usize) -> PeerMatrix {
    (0..n).map(|a| (0..n).map(|b| table.can_access(a, b)).collect()).collect()
}

impl HostExecutable {
    /// Compiles `module` (verified) for `num_devices` host devices in `mode`: inlines calls,
    /// plans every collective with `flags`, assigns buffers, builds one program per device
    /// (prepare) and creates the cluster (initialize).
    pub fn new(module: &Module, num_devices: usize, mode: DeviceMode, flags: &Flags) -> Result<Self> {
        let table = PeerAccessTable::for_host_topology(num_devices, &flags.host_topology);
        let low = lower(module, num_devices, mode, flags, &table, &HostSizer)?;
        let backend = HostBackend {
            evaluator: low.evaluator,
            num_devices,
            peers: Arc::new(peer_matrix(&table, num_devices)),
            timeout: Duration::from_millis(flags.collective_timeout_ms),
            param_shapes: low.param_shapes,
            root_shape: low.root_shape,
            progress: (0..num_devices).map(|_| AtomicUsize::new(0)).collect(),
            fault: Mutex::new(None),
            module: low.module,
        };
        let resources = backend.prepare(&low.programs)?;
        let cluster = backend.initialize(&resources)?;
        Ok(HostExecutable {
            backend,
            programs: low.programs,
            planned: low.planned,
            resources,
            state: Mutex::new(ClusterState { cluster, poisoned: false }),
        })
    }

    /// Runs every device's program once. `args[d]` are device `d`'s entry parameters
    /// (each of the shape [`HostExecutable::param_shapes`] gives); returns each device's
    /// entry result. Executions of one executable are serialised.
    pub fn execute(&self, args: &[Vec<Literal>]) -> Result<Vec<Literal>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.poisoned {
            // Signal epochs are out of step after a failure: start from fresh arenas.
            state.cluster = self.backend.initialize(&self.resources)?;
            state.poisoned = false;
        }
        let out = self.backend.execute(&state.cluster, &self.programs, args);
        if matches!(out, Err(Error::Device { .. })) {
            state.poisoned = true;
        }
        out
    }

    /// One program per device.
    pub fn programs(&self) -> &[ThunkProgram] {
        &self.programs
    }

    /// Every collective that runs, with its decision.
    pub fn planned(&self) -> &[PlannedCollective] {
        &self.planned
    }

    /// What `prepare` declared (arena bytes per device, scratch, signals).
    pub fn resources(&self) -> &Resources {
        &self.resources
    }

    /// Per entry parameter, the shape each device's argument must have.
    pub fn param_shapes(&self) -> &[Shape] {
        &self.backend.param_shapes
    }

    /// Per device, the last thunk it completed in the latest execution (index and label).
    pub fn progress(&self) -> Vec<Option<(usize, String)>> {
        let programs = &self.programs;
        self.backend
            .progress
            .iter()
            .enumerate()
            .map(|(d, p)| {
                let k = p.load(Ordering::Acquire).checked_sub(1)?;
                Some((k, programs.get(d)?.thunks.get(k)?.label()))
            })
            .collect()
    }

    /// Injects `fault` into every later execution (`None` clears it). For tests of
    /// failure handling.
    pub fn set_fault(&self, fault: Option<Fault>) {
        *self.backend.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }
}

/// Compiles and runs `module` once on the host backend: what `peerless run --backend
/// host` calls. `args[d]` are device `d`'s entry parameters.
pub fn run_host(
    module: &Module,
    num_devices: usize,
    mode: DeviceMode,
    flags: &Flags,
    args: &[Vec<Literal>],
) -> Result<Vec<Literal>> {
    HostExecutable::new(module, num_devices, mode, flags)?.execute(args)
}

/// The thunk programs the host backend would run (with its scratch sizes and the
/// interpreter's shard shapes), for `peerless check --thunks`; `Display` prints them.
pub fn host_programs(
    module: &Module,
    num_devices: usize,
    mode: DeviceMode,
    flags: &Flags,
) -> Result<emitter::Programs> {
    if num_devices == 0 {
        return Err(Error::BadArguments("num_devices must be at least 1".into()));
    }
    let flat = emitter::inline_calls(module)?;
    let evaluator = InstrEvaluator::new(&flat, &RunConfig { num_devices, mode })?;
    let table = PeerAccessTable::for_host_topology(num_devices, &flags.host_topology);
    Ok(emitter::build_programs(&flat, num_devices, mode, flags, &table, &EvalInfo(&evaluator), &HostSizer)?)
}

/// The devices a program runs on. Peerless runs whole modules itself only on the host
/// backend (the oracle's companion and the standalone CPU plugin); on GPUs XLA runs them, with
/// Peerless's collectives inside (`peerless run --backend xla`, `JAX_PLATFORMS=peerless`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// N simulated devices: worker threads over shared-memory arenas.
    Host,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
        }
    }
}

/// A compiled module on one backend: a closed enum, so callers (the CLI, the plugin) never
/// name a backend's types.
#[derive(Debug)]
pub enum Executable {
    Host(HostExecutable),
}

impl Executable {
    /// Compiles `module` for `num_devices` devices of `kind` in `mode`.
    pub fn new(
        kind: BackendKind,
        module: &Module,
        num_devices: usize,
        mode: DeviceMode,
        flags: &Flags,
    ) -> Result<Self> {
        match kind {
            BackendKind::Host => Ok(Executable::Host(HostExecutable::new(module, num_devices, mode, flags)?)),
        }
    }

    /// Runs every device's program once (`args[d]`: device `d`'s parameters).
    pub fn execute(&self, args: &[Vec<Literal>]) -> Result<Vec<Literal>> {
        match self {
            Executable::Host(e) => e.execute(args),
        }
    }

    pub fn kind(&self) -> BackendKind {
        match self {
            Executable::Host(_) => BackendKind::Host,
        }
    }

    /// One program per device.
    pub fn programs(&self) -> &[ThunkProgram] {
        match self {
            Executable::Host(e) => e.programs(),
        }
    }

    /// Every collective that runs, with its decision.
    pub fn planned(&self) -> &[PlannedCollective] {
        match self {
            Executable::Host(e) => e.planned(),
        }
    }

    /// Per entry parameter, the shape each device's argument must have.
    pub fn param_shapes(&self) -> &[Shape] {
        match self {
            Executable::Host(e) => e.param_shapes(),
        }
    }

    /// Injects `fault` into every later execution (`None` clears it).
    pub fn set_fault(&self, fault: Option<Fault>) {
        match self {
            Executable::Host(e) => e.set_fault(fault),
        }
    }
}
