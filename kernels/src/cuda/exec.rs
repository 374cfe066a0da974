//! The CUDA backend's executor: the emitter's per-device thunk programs run on a clique
//! of local GPUs, with collectives on Peerless's peer-access kernels or NCCL.
//!
//! Phases (thunks' [`Backend`] shape): `prepare` lowers the module with [`CudaSizer`]'s
//! scratch and signal sizes; `initialize` opens the shared [`Clique`], allocates the
//! symmetric arena and a status word per device, and turns every collective thunk into
//! ready-made launches (kernel arguments hold final device addresses, because the arena
//! never moves); `execute` copies arguments in, enqueues every device's program in thunk
//! order from one host thread, and copies results out.
//!
//! - **Collectives** on the kernel path launch `pl_one_shot_*` / `pl_two_shot_*`,
//!   `pl_reduce_scatter_*` or `pl_exchange` (direct all-gather, all-to-all, permute) on
//!   every device; the fallback path is NCCL (communicators per group, created once per
//!   process), with strided packing (`pl_copy_runs`) where a dimension is not the major
//!   one, and an NCCL all-gather plus a local fixed-order reduce (`pl_reduce_blocks_*`)
//!   for reductions NCCL lacks (pred add, bitwise and/or, 16-bit integers).
//! - **Non-collective instructions** run as kernels generated per instruction and shape
//!   (`crate::codegen`: one translation unit per executable, compiled with NVRTC once per
//!   architecture and cached on disk); constants are uploaded once and copied in;
//!   reshapes and bitcasts are device copies. What codegen declines (tuple-shaped values,
//!   variadic reduces, S4/U4/F8, sort, gather, …) is evaluated by the reference
//!   interpreter on the host between device steps; such a program is not graph-captured.
//!   `--device_codegen=false` puts every instruction on the host.
//! - **Missing ranks**: kernel waits are bounded by `--collective_timeout_ms` on the
//!   device; a timeout sets the device's status word, every later wait of the execution
//!   returns at once, and `execute` reports the collective, its group and the members that
//!   never arrived. The arena is then re-zeroed (epochs back in step) before the next run.
//! - Executions are serialised per clique (one lock): kernels of two executables enqueued
//!   in different orders on different devices would wait for each other forever.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use emitter::{DeviceMode, Flags, PlannedCollective};
use ffi::cuda::{DeviceBuffer, Function, PinnedBuffer};
use ffi::nccl::{self, Comms, P2p};
use hlo::{ArrayShape, Literal, Shape};
use thunks::{
    CollectiveConfig, CollectiveKind as Kind, Implementation, KernelAlgorithm as Algo, Region, ScratchSizer, Thunk,
    ThunkProgram,
};

use super::collectives::{
    Blocks, BlocksArgs, Dtype, ExchangeArgs, MAX_TASKS, Ptrs, Red, ReduceArgs, Run, RunArgs, ScatterArgs, Sig, Status,
    Wait, Xchg,
};
use super::launcher::LaunchError;
use super::{BLOCKS, Clique, CudaError, MAX_RANKS, SIGNAL_BYTES, THREADS};
use crate::codegen::{self, GEN_THREADS, GenStep};
use crate::exec::{ExecError, Fault, Lowered, check_args, lower, read_value, write_value};

const ALIGN: usize = 256;

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a).saturating_mul(a)
}

fn largest_group(config: &CollectiveConfig) -> usize {
    config.groups.iter().map(Vec::len).max().unwrap_or(1).max(1)
}

/// Whether NCCL can compute `config`'s reduction (else the fallback gathers and reduces locally).
fn nccl_reduces(config: &CollectiveConfig) -> bool {
    match (Dtype::of(config.element_type), config.reduction) {
        (Some(t), Some(r)) => t.nccl_reduction(Red::of(r)).is_some(),
        _ => false,
    }
}

/// The CUDA backend's scratch and signal sizes, for the emitter's buffer assignment.
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaSizer;

impl ScratchSizer for CudaSizer {
    fn scratch_bytes(&self, config: &CollectiveConfig, implementation: Implementation) -> usize {
        let bytes = config.bytes_per_device;
        let g = largest_group(config);
        let nonmajor = config.dimension.is_some_and(|d| d > 0);
        match implementation {
            // Double-buffered staging of the whole operand.
            Implementation::Kernel(Algo::OneShotAllReduce | Algo::TwoShotAllReduce | Algo::DirectReduceScatter) => {
                round_up(bytes, ALIGN).saturating_mul(2)
            }
            Implementation::Kernel(_) => 0,
            Implementation::Fallback => match config.op.kind {
                Kind::AllReduce | Kind::ReduceScatter if !nccl_reduces(config) => bytes.saturating_mul(g),
                Kind::AllGather if nonmajor => bytes.saturating_mul(g),
                Kind::ReduceScatter if nonmajor => bytes,
                Kind::AllToAll if config.dimension.is_some() => bytes.saturating_mul(2),
                _ => 0,
            },
        }
    }

    fn signal_bytes(&self, _config: &CollectiveConfig, implementation: Implementation) -> usize {
        match implementation {
            Implementation::Kernel(_) => SIGNAL_BYTES,
            Implementation::Fallback => 0,
        }
    }
}

/// The clique of local devices `0..n`, opened once per process and shared by every
/// executable (kernel modules, streams and peer probes are per device, not per program).
pub fn shared_clique(n: usize) -> Result<Arc<Clique>, CudaError> {
    static CLIQUES: OnceLock<Mutex<HashMap<usize, Arc<Clique>>>> = OnceLock::new();
    let map = CLIQUES.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = map.get(&n) {
        return Ok(c.clone());
    }
    let ordinals: Vec<usize> = (0..n).collect();
    let c = Arc::new(Clique::new(&ordinals)?);
    map.insert(n, c.clone());
    Ok(c)
}

/// NCCL communicators for a group of device ordinals (rank i = `ordinals[i]`), created
/// once per process.
fn shared_comms(ordinals: &[usize]) -> Result<Arc<Mutex<Comms>>, CudaError> {
    static COMMS: OnceLock<Mutex<HashMap<Vec<usize>, Arc<Mutex<Comms>>>>> = OnceLock::new();
    let map = COMMS.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = map.get(ordinals) {
        return Ok(c.clone());
    }
    let c = Arc::new(Mutex::new(Comms::new(ordinals)?));
    map.insert(ordinals.to_vec(), c.clone());
    Ok(c)
}

/// A kernel's arguments, by kernel family.
#[expect(clippy::large_enum_variant, reason = "always boxed inside `Launch`")]
#[derive(Clone, Copy, Debug)]
enum Args {
    Reduce(ReduceArgs),
    Scatter(ScatterArgs),
    Blocks(BlocksArgs),
    Exchange(ExchangeArgs),
    Run(RunArgs),
}

/// One device-side operation of a collective on one device.
#[derive(Clone, Debug)]
enum Launch {
    Kernel {
        func: Function,
        args: Box<Args>,
        /// Blocks per grid (`super::grid`): the same on every rank of the collective.
        grid: u32,
    },
    /// A generated kernel (crate::codegen): `(arena base, device index)`.
    Generated {
        func: Function,
        arena: u64,
        device: u32,
        blocks: u32,
    },
    Copy {
        dst: u64,
        src: u64,
        len: usize,
    },
    Zero {
        dst: u64,
        len: usize,
    },
}

/// NCCL calls over one communicator set (`members[i]`: the clique index of rank i).
#[derive(Clone, Debug)]
enum NcclCall {
    AllReduce { bufs: Vec<(u64, u64)>, count: usize, ty: nccl::DataType, op: nccl::RedOp },
    AllGather { bufs: Vec<(u64, u64)>, bytes: usize },
    ReduceScatter { bufs: Vec<(u64, u64)>, count: usize, ty: nccl::DataType, op: nccl::RedOp },
    P2p(Vec<P2p>),
}

#[derive(Clone, Debug)]
enum Stage {
    /// Per device (clique index), launches in order.
    Local(Vec<Vec<Launch>>),
    Nccl {
        comms: Arc<Mutex<Comms>>,
        members: Vec<usize>,
        call: NcclCall,
    },
}

/// What one thunk does on the clique.
#[derive(Clone, Debug)]
enum Step {
    /// Evaluate instruction thunk `k` on the host for every device.
    Compute,
    /// Per device (clique index), launches in order (generated kernels, constants).
    Local(Vec<Vec<Launch>>),
    Copy {
        src: usize,
        dst: usize,
        len: usize,
    },
    Collective {
        stages: Vec<Stage>,
        report: Report,
    },
    Nothing,
}

/// What a timeout report says about a collective: per device, the members its status bits
/// stand for.
#[derive(Clone, Debug)]
struct Report {
    name: String,
    label: String,
    groups: String,
    /// `members[d][bit]`: the device a status bit of device d names.
    members: Vec<Vec<usize>>,
}

fn launch(clique: &Clique, d: usize, l: &Launch) -> Result<(), CudaError> {
    let dev = &clique.devices[d];
    dev.ctx.bind()?;
    match l {
        Launch::Copy { dst, src, len } => {
            if *len > 0 {
                dev.stream.copy_d2d(*dst, *src, *len)?;
            }
        }
        Launch::Zero { dst, len } => {
            if *len > 0 {
                dev.stream.memset_u8(*dst, 0, *len)?;
            }
        }
        Launch::Generated { func, arena, device, blocks } => {
            let (mut a, mut d) = (*arena, *device);
            let mut params = [&mut a as *mut u64 as *mut std::ffi::c_void, &mut d as *mut u32 as *mut std::ffi::c_void];
            // SAFETY: generated kernels take (u8* arena, u32 device) (codegen.rs writes every
            // one so); every offset they touch lies inside this executable's arena, which was
            // laid out for exactly these regions and lives as long as the executable.
            unsafe { dev.stream.launch(func, *blocks, GEN_THREADS, &mut params)? };
        }
        Launch::Kernel { func, args, grid } => {
            let mut a = **args;
            // SAFETY: each Args variant's params() matches the parameter list of the kernel
            // family `func` was looked up from (one field list per kernel, in
            // collectives.rs); every address is inside this executable's arena or status
            // words (alive for the executable) on devices whose peer access was probed.
            unsafe {
                match &mut a {
                    Args::Reduce(x) => dev.stream.launch(func, *grid, THREADS, &mut x.params())?,
                    Args::Scatter(x) => dev.stream.launch(func, *grid, THREADS, &mut x.params())?,
                    Args::Blocks(x) => dev.stream.launch(func, *grid, THREADS, &mut x.params())?,
                    Args::Exchange(x) => dev.stream.launch(func, *grid, THREADS, &mut x.params())?,
                    Args::Run(x) => dev.stream.launch(func, *grid, THREADS, &mut x.params())?,
                }
            }
        }
    }
    Ok(())
}

fn run_nccl(clique: &Clique, comms: &Mutex<Comms>, members: &[usize], call: &NcclCall) -> Result<(), CudaError> {
    let comms = comms.lock().unwrap_or_else(|e| e.into_inner());
    let streams: Vec<_> = members.iter().map(|&m| &clique.devices[m].stream).collect();
    match call {
        NcclCall::AllReduce { bufs, count, ty, op } => comms.all_reduce(bufs, *count, *ty, *op, &streams)?,
        NcclCall::AllGather { bufs, bytes } => comms.all_gather(bufs, *bytes, nccl::DataType::Uint8, &streams)?,
        NcclCall::ReduceScatter { bufs, count, ty, op } => comms.reduce_scatter(bufs, *count, *ty, *op, &streams)?,
        NcclCall::P2p(ops) => comms.exchange(ops, &streams)?,
    }
    Ok(())
}

/// An operand viewed along a dimension: `outer` rows of `n` slices of `inner` bytes.
#[derive(Clone, Copy, Debug)]
struct View {
    outer: usize,
    n: usize,
    inner: usize,
}

impl View {
    fn of(shape: &ArrayShape, dim: usize) -> Result<View, String> {
        let dims: Vec<usize> = shape.dims.iter().map(|&d| usize::try_from(d).unwrap_or(0)).collect();
        if dims.is_empty() {
            // A scalar (all-reduce operands may be): one row of one element.
            return Ok(View { outer: 1, n: 1, inner: shape.ty.byte_size() });
        }
        let Some(&n) = dims.get(dim) else {
            return Err(format!("dimension {dim} is out of range for operand shape {shape}"));
        };
        let outer = dims[..dim].iter().product();
        let inner = dims[dim + 1..].iter().product::<usize>() * shape.ty.byte_size();
        Ok(View { outer, n, inner })
    }

    fn row(self) -> usize {
        self.n * self.inner
    }

    /// Block bytes per row when the dimension splits into `g` blocks.
    fn brow(self, g: usize) -> Result<usize, String> {
        if g == 0 || !self.n.is_multiple_of(g) {
            return Err(format!("dimension of size {} does not split into {g} blocks", self.n));
        }
        Ok(self.n / g * self.inner)
    }

    fn blocks(self, g: usize) -> Result<Blocks, String> {
        Ok(Blocks { outer: self.outer as u64, brow: self.brow(g)? as u64, full: self.row() as u64 })
    }
}

/// Everything needed to build one collective's stages.
struct Build<'a> {
    clique: &'a Clique,
    bases: &'a [u64],
    status: &'a [u64],
    timeout_ns: u64,
    tag: u64,
    k: usize,
    /// `--collective_blocks`.
    max_grid: u32,
}

impl Build<'_> {
    fn n(&self) -> usize {
        self.bases.len()
    }

    fn at(&self, d: usize, offset: usize) -> u64 {
        self.bases[d] + offset as u64
    }

    /// The grid of a collective launch that moves `bytes` per device and phase.
    fn grid(&self, bytes: usize) -> u32 {
        super::grid((bytes as u64).div_ceil(16), self.max_grid)
    }

    fn status(&self, d: usize) -> Status {
        Status { word: self.status[d], timeout_ns: self.timeout_ns, tag: self.tag, report: 0 }
    }

    fn func(&self, d: usize, name: &str) -> Result<Function, String> {
        self.clique.devices[d].module.function(name).map_err(|e| format!("kernel {name}: {e}"))
    }

    fn flags(&self, d: usize, signals: &Region) -> u64 {
        self.at(d, signals.offset) + 4 * BLOCKS as u64
    }

    /// A full group barrier for member `idx` of `group` (both phases of an exchange).
    fn group_phase(&self, group: &[usize], idx: usize, signals: &Region) -> (Sig, Wait) {
        let (mut sig, mut wait) = (Sig::default(), Wait::default());
        for (j, &m) in group.iter().enumerate() {
            if j != idx {
                sig.base[sig.n as usize] = self.flags(m, signals);
                sig.slot[sig.n as usize] = idx as u64;
                sig.n += 1;
                wait.slot[wait.n as usize] = j as u64;
                wait.n += 1;
            }
        }
        (sig, wait)
    }
}

fn group_of(config: &CollectiveConfig, d: usize) -> Result<(&[usize], usize), String> {
    let g = config
        .groups
        .iter()
        .find(|g| g.contains(&d))
        .ok_or_else(|| format!("device {d} is in no group of {}", thunks::fmt_groups(&config.groups)))?;
    Ok((g, g.iter().position(|&m| m == d).unwrap_or(0)))
}

/// Builds the stages of collective thunk `thunk` (the same on every device but for `d`).
fn collective_stages(
    b: &Build,
    programs: &[ThunkProgram],
    shapes: &[ArrayShape],
) -> Result<(Vec<Stage>, Report), String> {
    let n = b.n();
    let Thunk::Collective { name, config, implementation, inputs, outputs, scratch, signals, .. } =
        &programs[0].thunks[b.k]
    else {
        return Err("not a collective thunk".into());
    };
    for p in programs {
        match p.thunks.get(b.k) {
            Some(Thunk::Collective { inputs: i, outputs: o, scratch: s, signals: g, .. })
                if i == inputs && o == outputs && s == scratch && g == signals => {}
            _ => return Err("device programs differ at this collective (asymmetric arenas)".into()),
        }
    }
    let mut report = Report {
        name: name.clone(),
        label: config.op.to_string(),
        groups: if config.op.kind == Kind::CollectivePermute {
            let pairs: Vec<String> = config.source_target_pairs.iter().map(|(s, t)| format!("{s}->{t}")).collect();
            format!("pairs [{}]", pairs.join(","))
        } else {
            format!("groups {}", thunks::fmt_groups(&config.groups))
        },
        members: vec![Vec::new(); n],
    };
    let stages = match implementation {
        Implementation::Kernel(algo) => {
            let mut per = vec![Vec::new(); n];
            for (d, launches) in per.iter_mut().enumerate() {
                let (l, members) = kernel_launches(b, d, config, *algo, inputs, outputs, scratch, signals, shapes)?;
                *launches = l;
                report.members[d] = members;
            }
            vec![Stage::Local(per)]
        }
        Implementation::Fallback => fallback_stages(b, config, inputs, outputs, scratch, shapes)?,
    };
    Ok((stages, report))
}

#[allow(clippy::too_many_arguments)]
fn kernel_launches(
    b: &Build,
    d: usize,
    config: &CollectiveConfig,
    algo: Algo,
    inputs: &[Region],
    outputs: &[Region],
    scratch: &Region,
    signals: &Region,
    shapes: &[ArrayShape],
) -> Result<(Vec<Launch>, Vec<usize>), String> {
    let (Some(input), Some(output), Some(shape)) = (inputs.first(), outputs.first(), shapes.first()) else {
        return Err("a kernel collective without an operand".into());
    };
    if inputs.len() != 1 || outputs.len() != 1 {
        return Err(format!("kernels take one operand, got {} inputs / {} outputs", inputs.len(), outputs.len()));
    }
    let (src, dst) = (b.at(d, input.offset), b.at(d, output.offset));
    let counter = b.at(d, signals.offset);
    if config.op.kind == Kind::CollectivePermute {
        return permute_launches(b, d, config, input, output, signals);
    }
    let (group, idx) = group_of(config, d)?;
    let g = group.len();
    if g == 1 {
        return Ok((vec![Launch::Copy { dst, src, len: output.len }], vec![d]));
    }
    if g > MAX_RANKS.min(MAX_TASKS) {
        return Err(format!("group of {g} > {} devices", MAX_RANKS.min(MAX_TASKS)));
    }
    let flags = Ptrs::of(&group.iter().map(|&m| b.flags(m, signals)).collect::<Vec<_>>());
    let stage_ptrs = Ptrs::of(&group.iter().map(|&m| b.at(m, scratch.offset)).collect::<Vec<_>>());
    let stride = (scratch.len / 2) as u64;
    let reduction = || -> Result<(Dtype, Red), String> {
        let t = Dtype::of(shape.ty).ok_or_else(|| format!("no kernel for element type {}", shape.ty))?;
        let r = Red::of(config.reduction.ok_or("reduction not recognised")?);
        if !r.defined_for(t) {
            return Err(format!("no {} reduction for {}", r.name(), t.name()));
        }
        Ok((t, r))
    };
    let launch = match algo {
        Algo::OneShotAllReduce | Algo::TwoShotAllReduce => {
            let (t, r) = reduction()?;
            let kind = if algo == Algo::OneShotAllReduce { "one_shot" } else { "two_shot" };
            let n = input.len / t.size();
            if scratch.len < 2 * input.len {
                return Err(format!("scratch {scratch} too small for {} bytes", input.len));
            }
            let args = ReduceArgs {
                input: src,
                output: dst,
                n: n as u64,
                rank: idx as u32,
                world: g as u32,
                stage: stage_ptrs,
                stride,
                flags,
                counter,
                status: b.status(d),
            };
            Launch::Kernel {
                func: b.func(d, &format!("pl_{kind}_{}_{}", t.name(), r.name()))?,
                args: Box::new(Args::Reduce(args)),
                grid: b.grid(input.len),
            }
        }
        Algo::DirectReduceScatter => {
            let (t, r) = reduction()?;
            let blocks = View::of(shape, config.dimension.unwrap_or(0))?.blocks(g)?;
            let args = ScatterArgs {
                input: src,
                output: dst,
                rank: idx as u32,
                world: g as u32,
                stage: stage_ptrs,
                stride,
                flags,
                counter,
                blocks,
                status: b.status(d),
            };
            Launch::Kernel {
                func: b.func(d, &format!("pl_reduce_scatter_{}_{}", t.name(), r.name()))?,
                args: Box::new(Args::Scatter(args)),
                grid: b.grid(output.len),
            }
        }
        Algo::DirectAllGather | Algo::DirectAllToAll => {
            let (sig, wait) = b.group_phase(group, idx, signals);
            let mut x =
                Xchg { counter, flags: b.flags(d, signals), sig: [sig, sig], wait: [wait, wait], ..Xchg::default() };
            let v = View::of(shape, config.dimension.unwrap_or(0))?;
            for i in 0..g {
                let k = (idx + i) % g;
                let peer_out = b.at(group[k], output.offset);
                x.task[i] = if algo == Algo::DirectAllGather {
                    let row = v.row() as u64;
                    Run {
                        src,
                        dst: peer_out + idx as u64 * row,
                        rows: v.outer as u64,
                        row,
                        sstride: row,
                        dstride: g as u64 * row,
                    }
                } else {
                    let brow = v.brow(g)? as u64;
                    let full = v.row() as u64;
                    Run {
                        src: src + k as u64 * brow,
                        dst: peer_out + idx as u64 * brow,
                        rows: v.outer as u64,
                        row: brow,
                        sstride: full,
                        dstride: full,
                    }
                };
            }
            x.ntasks = g as u64;
            Launch::Kernel {
                func: b.func(d, "pl_exchange")?,
                args: Box::new(Args::Exchange(ExchangeArgs { x, status: b.status(d) })),
                grid: b.grid(input.len),
            }
        }
        Algo::DirectPermute => return Err("permute handled above".into()),
    };
    Ok((vec![launch], group.to_vec()))
}

/// Collective-permute on the kernel path: slot 0 of flag set 0 is "ready" (written by my
/// target), slot 1 of set 1 is "done" (written by my source).
fn permute_launches(
    b: &Build,
    d: usize,
    config: &CollectiveConfig,
    input: &Region,
    output: &Region,
    signals: &Region,
) -> Result<(Vec<Launch>, Vec<usize>), String> {
    let target = config.source_target_pairs.iter().find(|p| p.0 == d).map(|p| p.1);
    let source = config.source_target_pairs.iter().find(|p| p.1 == d).map(|p| p.0);
    let (src, dst) = (b.at(d, input.offset), b.at(d, output.offset));
    let mut launches = Vec::new();
    if source.is_none() {
        launches.push(Launch::Zero { dst, len: output.len });
    }
    let mut x = Xchg { counter: b.at(d, signals.offset), flags: b.flags(d, signals), ..Xchg::default() };
    if let Some(s) = source.filter(|&s| s != d) {
        x.sig[0].base[0] = b.flags(s, signals);
        x.sig[0].slot[0] = 0;
        x.sig[0].n = 1;
        x.wait[1].slot[0] = 1;
        x.wait[1].n = 1;
    }
    match target {
        Some(t) if t == d => {
            x.task[0] = Run { src, dst, rows: 1, row: input.len as u64, sstride: 0, dstride: 0 };
            x.ntasks = 1;
        }
        Some(t) => {
            x.wait[0].slot[0] = 0;
            x.wait[0].n = 1;
            x.task[0] =
                Run { src, dst: b.at(t, output.offset), rows: 1, row: input.len as u64, sstride: 0, dstride: 0 };
            x.ntasks = 1;
            x.sig[1].base[0] = b.flags(t, signals);
            x.sig[1].slot[0] = 1;
            x.sig[1].n = 1;
        }
        None => {}
    }
    launches.push(Launch::Kernel {
        func: b.func(d, "pl_exchange")?,
        args: Box::new(Args::Exchange(ExchangeArgs { x, status: b.status(d) })),
        grid: b.grid(input.len),
    });
    // Status bit 0: my target never signalled "ready"; bit 1: my source never delivered.
    Ok((launches, vec![target.unwrap_or(d), source.unwrap_or(d)]))
}

fn run_launch(b: &Build, d: usize, run: Run) -> Result<Launch, String> {
    let grid = b.grid((run.rows * run.row) as usize);
    Ok(Launch::Kernel { func: b.func(d, "pl_copy_runs")?, args: Box::new(Args::Run(RunArgs { run })), grid })
}

/// The NCCL fallback's stages.
fn fallback_stages(
    b: &Build,
    config: &CollectiveConfig,
    inputs: &[Region],
    outputs: &[Region],
    scratch: &Region,
    shapes: &[ArrayShape],
) -> Result<Vec<Stage>, String> {
    let n = b.n();
    if inputs.len() != shapes.len() {
        return Err(format!("{} operand regions for {} operand shapes", inputs.len(), shapes.len()));
    }
    let mut stages = Vec::new();
    let local = |stages: &mut Vec<Stage>, per: Vec<Vec<Launch>>| {
        if per.iter().any(|l| !l.is_empty()) {
            stages.push(Stage::Local(per));
        }
    };
    if config.op.kind == Kind::CollectivePermute {
        let comms = shared_comms(&(0..n).map(|d| b.clique.devices[d].ordinal).collect::<Vec<_>>())
            .map_err(|e| e.to_string())?;
        let mut per = vec![Vec::new(); n];
        let mut ops = Vec::new();
        for (input, output) in inputs.iter().zip(outputs) {
            for (d, launches) in per.iter_mut().enumerate() {
                if !config.source_target_pairs.iter().any(|p| p.1 == d) {
                    launches.push(Launch::Zero { dst: b.at(d, output.offset), len: output.len });
                }
            }
            for &(s, t) in &config.source_target_pairs {
                if s == t {
                    per[s].push(Launch::Copy {
                        dst: b.at(s, output.offset),
                        src: b.at(s, input.offset),
                        len: input.len,
                    });
                } else if input.len > 0 {
                    ops.push(P2p { rank: s, send: true, peer: t, buf: b.at(s, input.offset), bytes: input.len });
                    ops.push(P2p { rank: t, send: false, peer: s, buf: b.at(t, output.offset), bytes: input.len });
                }
            }
        }
        local(&mut stages, per);
        if !ops.is_empty() {
            stages.push(Stage::Nccl { comms, members: (0..n).collect(), call: NcclCall::P2p(ops) });
        }
        return Ok(stages);
    }
    if matches!(config.op.kind, Kind::RaggedAllToAll | Kind::CollectiveBroadcast) {
        return Err(format!("{} is not supported by the cuda backend", config.op));
    }
    let tuple_a2a = config.op.kind == Kind::AllToAll && config.dimension.is_none();
    for group in &config.groups {
        let g = group.len();
        let ordinals: Vec<usize> = group.iter().map(|&m| b.clique.devices[m].ordinal).collect();
        if g == 1 {
            let d = group[0];
            let per = (0..n)
                .map(|x| {
                    if x != d {
                        return Vec::new();
                    }
                    inputs
                        .iter()
                        .zip(outputs)
                        .map(|(i, o)| Launch::Copy { dst: b.at(d, o.offset), src: b.at(d, i.offset), len: o.len })
                        .collect()
                })
                .collect();
            local(&mut stages, per);
            continue;
        }
        let comms = shared_comms(&ordinals).map_err(|e| e.to_string())?;
        let nccl = |call| Stage::Nccl { comms: comms.clone(), members: group.clone(), call };
        let bufs = |i: &Region, o: &Region, si: Option<usize>, so: Option<usize>| -> Vec<(u64, u64)> {
            group.iter().map(|&m| (b.at(m, si.unwrap_or(i.offset)), b.at(m, so.unwrap_or(o.offset)))).collect()
        };
        if tuple_a2a {
            if inputs.len() != g {
                return Err(format!("tuple all-to-all with {} operands in a group of {g}", inputs.len()));
            }
            let mut per = vec![Vec::new(); n];
            let mut ops = Vec::new();
            for (idx, &m) in group.iter().enumerate() {
                for k in 0..g {
                    // My operand k becomes member k's result `idx`.
                    let (src, out) = (&inputs[k], &outputs[idx]);
                    if k == idx {
                        per[m].push(Launch::Copy { dst: b.at(m, out.offset), src: b.at(m, src.offset), len: src.len });
                    } else if src.len > 0 {
                        ops.push(P2p { rank: idx, send: true, peer: k, buf: b.at(m, src.offset), bytes: src.len });
                        let into = &outputs[k];
                        ops.push(P2p { rank: idx, send: false, peer: k, buf: b.at(m, into.offset), bytes: into.len });
                    }
                }
            }
            local(&mut stages, per);
            if !ops.is_empty() {
                stages.push(nccl(NcclCall::P2p(ops)));
            }
            continue;
        }
        let mut scratch_at = scratch.offset;
        for ((input, output), shape) in inputs.iter().zip(outputs).zip(shapes) {
            let dim = config.dimension.unwrap_or(0);
            let v = View::of(shape, dim)?;
            let t = Dtype::of(shape.ty);
            let reduce = match config.op.kind {
                Kind::AllReduce | Kind::ReduceScatter => {
                    let t = t.ok_or_else(|| format!("the cuda backend cannot reduce {}", shape.ty))?;
                    let r = Red::of(config.reduction.ok_or("reduction computation not recognised")?);
                    if !r.defined_for(t) {
                        return Err(format!("no {} reduction for {}", r.name(), t.name()));
                    }
                    Some((t, r))
                }
                _ => None,
            };
            match config.op.kind {
                Kind::AllReduce | Kind::ReduceScatter => {
                    let (t, r) = reduce.ok_or("no reduction")?;
                    let rs = config.op.kind == Kind::ReduceScatter;
                    if let Some((ty, op)) = t.nccl_reduction(r) {
                        if !rs {
                            stages.push(nccl(NcclCall::AllReduce {
                                bufs: bufs(input, output, None, None),
                                count: input.len / t.size(),
                                ty,
                                op,
                            }));
                        } else if v.outer <= 1 {
                            stages.push(nccl(NcclCall::ReduceScatter {
                                bufs: bufs(input, output, None, None),
                                count: output.len / t.size(),
                                ty,
                                op,
                            }));
                        } else {
                            // Pack block k of every row into a contiguous slab k.
                            let brow = v.brow(g)?;
                            let slab = v.outer * brow;
                            let mut per = vec![Vec::new(); n];
                            for &m in group {
                                for k in 0..g {
                                    let run = Run {
                                        src: b.at(m, input.offset + k * brow),
                                        dst: b.at(m, scratch_at + k * slab),
                                        rows: v.outer as u64,
                                        row: brow as u64,
                                        sstride: v.row() as u64,
                                        dstride: brow as u64,
                                    };
                                    per[m].push(run_launch(b, m, run)?);
                                }
                            }
                            local(&mut stages, per);
                            stages.push(nccl(NcclCall::ReduceScatter {
                                bufs: bufs(input, output, Some(scratch_at), None),
                                count: output.len / t.size(),
                                ty,
                                op,
                            }));
                            scratch_at += input.len;
                        }
                    } else {
                        // NCCL lacks it: gather every member's operand, reduce locally in
                        // member order (bitwise the same on every member).
                        stages.push(nccl(NcclCall::AllGather {
                            bufs: bufs(input, output, None, Some(scratch_at)),
                            bytes: input.len,
                        }));
                        let blocks = if rs {
                            v.blocks(g)?
                        } else {
                            Blocks { outer: 1, brow: input.len as u64, full: input.len as u64 }
                        };
                        let mut per = vec![Vec::new(); n];
                        for (idx, &m) in group.iter().enumerate() {
                            let srcs: Vec<u64> = (0..g).map(|k| b.at(m, scratch_at + k * input.len)).collect();
                            let args = BlocksArgs {
                                srcs: Ptrs::of(&srcs),
                                world: g as u32,
                                block: if rs { idx as u32 } else { 0 },
                                output: b.at(m, output.offset),
                                blocks,
                            };
                            let func = b.func(m, &format!("pl_reduce_blocks_{}_{}", t.name(), r.name()))?;
                            let grid = b.grid(output.len);
                            per[m].push(Launch::Kernel { func, args: Box::new(Args::Blocks(args)), grid });
                        }
                        local(&mut stages, per);
                        scratch_at += input.len * g;
                    }
                }
                Kind::AllGather => {
                    if v.outer <= 1 {
                        stages.push(nccl(NcclCall::AllGather {
                            bufs: bufs(input, output, None, None),
                            bytes: input.len,
                        }));
                    } else {
                        stages.push(nccl(NcclCall::AllGather {
                            bufs: bufs(input, output, None, Some(scratch_at)),
                            bytes: input.len,
                        }));
                        let row = v.row();
                        let mut per = vec![Vec::new(); n];
                        for &m in group {
                            for k in 0..g {
                                let run = Run {
                                    src: b.at(m, scratch_at + k * input.len),
                                    dst: b.at(m, output.offset + k * row),
                                    rows: v.outer as u64,
                                    row: row as u64,
                                    sstride: row as u64,
                                    dstride: (g * row) as u64,
                                };
                                per[m].push(run_launch(b, m, run)?);
                            }
                        }
                        local(&mut stages, per);
                        scratch_at += input.len * g;
                    }
                }
                Kind::AllToAll => {
                    let brow = v.brow(g)?;
                    let slab = v.outer * brow;
                    let packed = v.outer > 1;
                    let (send_base, recv_base) =
                        if packed { (scratch_at, scratch_at + input.len) } else { (input.offset, output.offset) };
                    let mut pre = vec![Vec::new(); n];
                    let mut post = vec![Vec::new(); n];
                    let mut ops = Vec::new();
                    for (idx, &m) in group.iter().enumerate() {
                        for k in 0..g {
                            if packed {
                                pre[m].push(run_launch(
                                    b,
                                    m,
                                    Run {
                                        src: b.at(m, input.offset + k * brow),
                                        dst: b.at(m, send_base + k * slab),
                                        rows: v.outer as u64,
                                        row: brow as u64,
                                        sstride: v.row() as u64,
                                        dstride: brow as u64,
                                    },
                                )?);
                                post[m].push(run_launch(
                                    b,
                                    m,
                                    Run {
                                        src: b.at(m, recv_base + k * slab),
                                        dst: b.at(m, output.offset + k * brow),
                                        rows: v.outer as u64,
                                        row: brow as u64,
                                        sstride: brow as u64,
                                        dstride: v.row() as u64,
                                    },
                                )?);
                            }
                            if slab == 0 {
                                continue;
                            }
                            ops.push(P2p {
                                rank: idx,
                                send: true,
                                peer: k,
                                buf: b.at(m, send_base + k * slab),
                                bytes: slab,
                            });
                            ops.push(P2p {
                                rank: idx,
                                send: false,
                                peer: k,
                                buf: b.at(m, recv_base + k * slab),
                                bytes: slab,
                            });
                        }
                    }
                    local(&mut stages, pre);
                    if !ops.is_empty() {
                        stages.push(nccl(NcclCall::P2p(ops)));
                    }
                    local(&mut stages, post);
                    if packed {
                        scratch_at += 2 * input.len;
                    }
                }
                _ => return Err(format!("{} on the fallback path", config.op)),
            }
        }
        if scratch_at > scratch.offset + scratch.len {
            return Err(format!("fallback needs {} scratch bytes, {scratch} reserved", scratch_at - scratch.offset));
        }
    }
    Ok(stages)
}

/// Per-device status words: `u32[2]` each (missing-member mask, tag of the first timeout).
struct StatusWords {
    bufs: Vec<DeviceBuffer>,
}

impl StatusWords {
    /// Reads and clears every device's status; returns (device, mask, tag) of the first failure.
    fn take(&self) -> Result<Option<(usize, u32, u32)>, CudaError> {
        let mut first = None;
        for (d, b) in self.bufs.iter().enumerate() {
            let mut w = [0u32; 2];
            b.read(&mut w)?;
            if w[0] != 0 {
                b.write(&[0u32; 2])?;
                first.get_or_insert((d, w[0], w[1]));
            }
        }
        Ok(first)
    }
}

/// A module compiled for the CUDA backend on local GPUs `0..num_devices`.
pub struct CudaExecutable {
    low: Lowered,
    clique: Arc<Clique>,
    arena: Vec<DeviceBuffer>,
    status: StatusWords,
    steps: Vec<Step>,
    fault: Mutex<Option<Fault>>,
    timeout: Duration,
    poisoned: Mutex<bool>,
    /// `--cuda_graphs` and the program evaluates nothing on the host.
    use_graphs: bool,
    /// Per device, the program captured after its first run (dropped on failure).
    graphs: Mutex<Option<Vec<Mutex<ffi::cuda::Graph>>>>,
    /// The benchmark's graphs of several runs each ([`Self::enqueue_batch`]).
    batch_graphs: Mutex<Option<(usize, Vec<Mutex<ffi::cuda::Graph>>)>>,
    /// Per device, the module of generated kernels (declared after `graphs`, which launch
    /// them, so it is unloaded after them) and the constants the program copies in.
    _generated: Vec<ffi::cuda::Module>,
    _constants: Vec<DeviceBuffer>,
    /// Per device, page-locked staging for the arguments and then the results (empty when
    /// they exceed [`PINNED_MAX_BYTES`]: then pageable synchronous copies). Every run ends with
    /// its streams synchronised, so no copy through it is in flight between runs.
    staging: Mutex<Vec<PinnedBuffer>>,
    /// Compute thunks the device runs / the host evaluates.
    device_computes: usize,
    host_computes: Vec<(usize, String, String)>,
}

impl fmt::Debug for CudaExecutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaExecutable")
            .field("module", &self.low.module.name)
            .field("devices", &self.clique.len())
            .finish_non_exhaustive()
    }
}

/// Arguments plus results of one device above which the executor does not pin host memory
/// (page-locked memory is a scarce system resource) and copies synchronously instead.
const PINNED_MAX_BYTES: usize = 1 << 30;

/// Bytes of one device's argument and result regions: the size of its pinned staging.
fn staging_bytes(program: &ThunkProgram) -> usize {
    program.params.iter().flatten().chain(&program.results).map(|r| r.len).sum()
}

fn cuda_err(e: impl fmt::Display) -> ExecError {
    ExecError::Backend(format!("cuda backend: {e}"))
}

/// Compiles `plan`'s unit for every device's architecture and loads it, and uploads its
/// constants (each at the next `ALIGN` boundary, in thunk order) once per device.
fn load_generated(
    clique: &Clique,
    plan: &codegen::GenPlan,
) -> Result<(Vec<ffi::cuda::Module>, Vec<DeviceBuffer>), ExecError> {
    let mut modules = Vec::new();
    if plan.kernels() > 0 {
        for dev in &clique.devices {
            let cc = (dev.cc.0 * 10 + dev.cc.1) as u32;
            let bin = super::generated_cubin(cc, &plan.source)
                .map_err(|e| ExecError::Backend(format!("cuda backend: generated kernels: {e}")))?;
            modules.push(dev.ctx.load_module(&bin).map_err(cuda_err)?);
        }
    }
    let mut blob = Vec::new();
    for s in plan.steps.iter().flatten() {
        if let GenStep::Constant { bytes, .. } = s {
            blob.extend_from_slice(bytes);
            blob.resize(round_up(blob.len(), ALIGN), 0);
        }
    }
    let constants = clique.alloc(blob.len().max(ALIGN)).map_err(cuda_err)?;
    for b in &constants {
        b.write_at(0, &blob).map_err(cuda_err)?;
    }
    Ok((modules, constants))
}

impl CudaExecutable {
    /// Compiles `module` for GPUs `0..num_devices` in `mode`: lowers it with the CUDA
    /// sizes and the clique's probed peer table (prepare), allocates the arena and builds
    /// every collective's launches (initialize).
    pub fn new(module: &hlo::Module, num_devices: usize, mode: DeviceMode, flags: &Flags) -> Result<Self, ExecError> {
        let avail = super::device_count().map_err(cuda_err)?;
        if num_devices == 0 || num_devices > avail.min(MAX_RANKS) {
            return Err(ExecError::BadArguments(format!(
                "the cuda backend runs on 1..={} devices here ({avail} visible), not {num_devices}",
                avail.min(MAX_RANKS)
            )));
        }
        let clique = shared_clique(num_devices).map_err(cuda_err)?;
        let low = lower(module, num_devices, mode, flags, &clique.peers, &CudaSizer)?;
        let arena_bytes = low.programs.iter().map(|p| p.arena_bytes).max().unwrap_or(0).max(16);
        let arena = clique.alloc(arena_bytes).map_err(|e| {
            ExecError::Backend(format!("cuda backend: cannot allocate the {arena_bytes}-byte arena per device: {e}"))
        })?;
        let status = StatusWords { bufs: clique.alloc(8).map_err(cuda_err)? };
        let bases: Vec<u64> = arena.iter().map(|b| b.ptr).collect();
        let words: Vec<u64> = status.bufs.iter().map(|b| b.ptr).collect();
        let timeout_ns = flags.collective_timeout_ms.saturating_mul(1_000_000);
        let plan = if flags.device_codegen { codegen::plan(&low) } else { codegen::GenPlan::default() };
        let (generated, constants) = load_generated(&clique, &plan)?;
        for (k, name, why) in &plan.host {
            log::info!("module '{}': compute #{k} '{name}' runs on the host: {why}", low.module.name);
        }
        let mut const_at = 0usize;
        let mut steps = Vec::new();
        for (k, thunk) in low.programs[0].thunks.iter().enumerate() {
            steps.push(match thunk {
                Thunk::Compute { .. } => match plan.steps.get(k).cloned().flatten() {
                    None => Step::Compute,
                    Some(GenStep::Nothing) => Step::Nothing,
                    Some(GenStep::Copy { src, dst, len }) => Step::Copy { src, dst, len },
                    Some(GenStep::Constant { bytes, dst }) => {
                        let per = (0..clique.len())
                            .map(|d| {
                                vec![Launch::Copy {
                                    dst: bases[d] + dst as u64,
                                    src: constants[d].ptr + const_at as u64,
                                    len: bytes.len(),
                                }]
                            })
                            .collect();
                        const_at = round_up(const_at + bytes.len(), ALIGN);
                        Step::Local(per)
                    }
                    Some(GenStep::Kernel { name, elements }) => {
                        let mut per = Vec::new();
                        for (d, m) in generated.iter().enumerate() {
                            let func = m.function(&name).map_err(cuda_err)?;
                            let blocks = GenStep::blocks(elements);
                            per.push(vec![Launch::Generated { func, arena: bases[d], device: d as u32, blocks }]);
                        }
                        Step::Local(per)
                    }
                },
                Thunk::Copy { src, dst, len, .. } => Step::Copy { src: *src, dst: *dst, len: *len },
                Thunk::Collective { name, .. } => {
                    let b = Build {
                        clique: &clique,
                        bases: &bases,
                        status: &words,
                        timeout_ns,
                        tag: k as u64 + 1,
                        k,
                        max_grid: flags.collective_blocks,
                    };
                    let shapes = low.shapes.get(k).map(|s| s.operand_leaves.clone()).unwrap_or_default();
                    let (stages, report) = collective_stages(&b, &low.programs, &shapes)
                        .map_err(|m| ExecError::Backend(format!("cuda backend: collective '{name}': {m}")))?;
                    Step::Collective { stages, report }
                }
                Thunk::CollectiveDone { .. } => Step::Nothing,
            });
        }
        let mut staging = Vec::new();
        if low.programs.iter().all(|p| staging_bytes(p) <= PINNED_MAX_BYTES) {
            for (p, dev) in low.programs.iter().zip(&clique.devices) {
                staging.push(PinnedBuffer::new(&dev.ctx, staging_bytes(p)).map_err(cuda_err)?);
            }
        }
        Ok(CudaExecutable {
            staging: Mutex::new(staging),
            low,
            clique,
            arena,
            status,
            fault: Mutex::new(None),
            timeout: Duration::from_millis(flags.collective_timeout_ms),
            poisoned: Mutex::new(false),
            use_graphs: flags.cuda_graphs && !steps.iter().any(|s| matches!(s, Step::Compute)),
            graphs: Mutex::new(None),
            batch_graphs: Mutex::new(None),
            device_computes: steps.iter().filter(|s| matches!(s, Step::Local(_))).count(),
            host_computes: plan.host,
            steps,
            _generated: generated,
            _constants: constants,
        })
    }

    /// Compute thunks run on the device (generated kernels, constants) and those the host
    /// evaluates, as (thunk, instruction, why).
    pub fn compute_placement(&self) -> (usize, &[(usize, String, String)]) {
        (self.device_computes, &self.host_computes)
    }

    /// Whether executions replay CUDA graphs (`--cuda_graphs` and no host-evaluated
    /// instruction in the program).
    pub fn uses_graphs(&self) -> bool {
        self.use_graphs
    }

    /// Enqueues every device's program once on the device streams without copying
    /// arguments in or results out and without waiting: what the benchmark times (the
    /// arena keeps whatever values it holds). Errors for programs that evaluate instructions
    /// on the host.
    pub fn enqueue(&self, graphs: bool) -> Result<(), ExecError> {
        if self.steps.iter().any(|s| matches!(s, Step::Compute)) {
            return Err(ExecError::Backend(
                "cuda backend: enqueue needs a program without host-evaluated instructions".into(),
            ));
        }
        let _serial = self.clique.exec_lock.lock().unwrap_or_else(|e| e.into_inner());
        if graphs { self.launch_graphs() } else { self.enqueue_steps(None).map(|_| ()) }
    }

    /// Like [`Self::enqueue`] with graphs, but each device's graph holds `calls` runs of the
    /// program back to back (captured on first use, and again when `calls` changes): one
    /// graph launch per `calls` runs, as PyTorch's and nccl-tests' graph timings do. For the
    /// benchmark, which reports it beside the one-run-per-launch graphs.
    pub fn enqueue_batch(&self, calls: usize) -> Result<(), ExecError> {
        if self.steps.iter().any(|s| matches!(s, Step::Compute)) {
            return Err(ExecError::Backend(
                "cuda backend: enqueue needs a program without host-evaluated instructions".into(),
            ));
        }
        let _serial = self.clique.exec_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut b = self.batch_graphs.lock().unwrap_or_else(|e| e.into_inner());
        if b.as_ref().is_none_or(|(n, _)| *n != calls) {
            *b = None;
            *b = Some((calls, self.capture_calls(calls.max(1))?));
        }
        self.launch_captured(b.as_ref().map(|(_, g)| g.as_slice()).unwrap_or_default())
    }

    /// Waits for every device and reports a collective that timed out (after [`Self::enqueue`]).
    pub fn finish(&self) -> Result<(), ExecError> {
        self.sync_all()?;
        self.check_status()
    }

    /// Launches the captured graphs, capturing them first if needed.
    fn launch_graphs(&self) -> Result<(), ExecError> {
        let mut g = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(self.capture()?);
        }
        self.launch_captured(g.as_deref().unwrap_or_default())
    }

    /// Launches one captured graph per device, every device from its own host thread at
    /// once (launcher.rs).
    fn launch_captured(&self, graphs: &[Mutex<ffi::cuda::Graph>]) -> Result<(), ExecError> {
        let launched = self.clique.launcher.run(graphs.len(), |d| {
            let dev = &self.clique.devices[d];
            dev.ctx
                .bind()
                .and_then(|_| graphs[d].lock().unwrap_or_else(|e| e.into_inner()).launch(&dev.stream))
                .map_err(|e| (d, e))
        });
        launched.map_err(|e| match e {
            LaunchError::Failed((d, e)) => self.device_error(d, 0, e.to_string(), false),
            LaunchError::Panicked(p) => ExecError::Backend(format!("cuda graph launch panicked: {p}")),
        })
    }

    /// Captures one graph per device of the whole program (every stream captured at once,
    /// so NCCL's grouped multi-device calls are captured too).
    fn capture(&self) -> Result<Vec<Mutex<ffi::cuda::Graph>>, ExecError> {
        self.capture_calls(1)
    }

    /// Captures `calls` runs of the program, back to back, into one graph per device.
    fn capture_calls(&self, calls: usize) -> Result<Vec<Mutex<ffi::cuda::Graph>>, ExecError> {
        for dev in &self.clique.devices {
            dev.ctx.bind().map_err(cuda_err)?;
            dev.stream.begin_capture().map_err(cuda_err)?;
        }
        let mut enq = Ok(true);
        for _ in 0..calls {
            enq = self.enqueue_steps(None);
            if enq.is_err() {
                break;
            }
        }
        let mut graphs = Vec::new();
        let mut first_err = enq.err();
        for dev in &self.clique.devices {
            let ended = dev.ctx.bind().and_then(|_| dev.stream.end_capture());
            match ended {
                Ok(g) => graphs.push(Mutex::new(g)),
                Err(e) => {
                    first_err.get_or_insert(cuda_err(e));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(graphs),
        }
    }

    fn device_error(&self, d: usize, k: usize, message: String, timeout: bool) -> ExecError {
        let label = self.low.programs.get(d).and_then(|p| p.thunks.get(k)).map_or_else(String::new, Thunk::label);
        ExecError::Device { device: d, thunk: k, label, message, timeout, progress: String::new() }
    }

    fn compute(&self, k: usize) -> Result<(), ExecError> {
        for (d, program) in self.low.programs.iter().enumerate() {
            let Some(Thunk::Compute { instr, inputs, outputs, .. }) = program.thunks.get(k) else {
                return Err(self.device_error(d, k, "programs differ between devices".into(), false));
            };
            let buf = &self.arena[d];
            let read = |o: usize, l: usize| {
                let mut v = vec![0u8; l];
                buf.read_at(o, &mut v).map(|_| v).map_err(|e| e.to_string())
            };
            let shapes = self.low.shapes.get(k).map(|s| s.operands.as_slice()).unwrap_or(&[]);
            let mut operands = Vec::with_capacity(shapes.len());
            let mut at = 0usize;
            for s in shapes {
                let nl = s.leaves().len();
                let regions =
                    inputs.get(at..at + nl).ok_or_else(|| self.device_error(d, k, "operands".into(), false))?;
                operands.push(read_value(regions, s, read).map_err(|m| self.device_error(d, k, m, false))?);
                at += nl;
            }
            let value = self
                .low
                .evaluator
                .eval(&self.low.module, *instr, &operands, d)
                .map_err(|e| self.device_error(d, k, e.to_string(), false))?;
            write_value(outputs, &value, |o, bytes| buf.write_at(o, bytes).map_err(|e| e.to_string()))
                .map_err(|m| self.device_error(d, k, m, false))?;
        }
        Ok(())
    }

    fn sync_all(&self) -> Result<(), ExecError> {
        let deadline = Instant::now() + self.timeout.saturating_mul(4) + Duration::from_secs(10);
        for (d, dev) in self.clique.devices.iter().enumerate() {
            dev.ctx.bind().map_err(cuda_err)?;
            loop {
                match dev.stream.query() {
                    Ok(true) => break,
                    Ok(false) if Instant::now() < deadline => std::thread::yield_now(),
                    Ok(false) => {
                        return Err(ExecError::Device {
                            device: d,
                            thunk: self.steps.len(),
                            label: "(synchronise)".into(),
                            message: "the device did not finish its program (an NCCL collective whose peers never \
                                      arrived?); the clique must be restarted"
                                .into(),
                            timeout: true,
                            progress: String::new(),
                        });
                    }
                    Err(e) => return Err(cuda_err(e)),
                }
            }
        }
        Ok(())
    }

    /// Runs every device's program once: `args[d]` are device `d`'s entry parameters;
    /// returns each device's entry result.
    pub fn execute(&self, args: &[Vec<Literal>]) -> Result<Vec<Literal>, ExecError> {
        check_args(args, self.clique.len(), &self.low.param_shapes)?;
        let _serial = self.clique.exec_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut poisoned = self.poisoned.lock().unwrap_or_else(|e| e.into_inner());
        if *poisoned {
            // Epochs are out of step after a timeout: start from zeroed flags.
            for (d, b) in self.arena.iter().enumerate() {
                b.write_at(0, &vec![0u8; b.len]).map_err(|e| self.device_error(d, 0, e.to_string(), false))?;
            }
            *poisoned = false;
        }
        let out = self.run(args);
        if out.is_err() {
            *self.graphs.lock().unwrap_or_else(|e| e.into_inner()) = None;
            // No copy through the pinned staging may outlive the run (a device that does not
            // finish here is reported by the next run, or its buffers' drops wait for it).
            let _ = self.sync_all();
        }
        if matches!(out, Err(ExecError::Device { timeout: true, .. })) {
            *poisoned = true;
        }
        out
    }

    /// Enqueues every step; host-evaluated steps synchronise first. Returns whether work
    /// is pending on the streams.
    fn enqueue_steps(&self, fault: Option<&Fault>) -> Result<bool, ExecError> {
        // The arguments' async copies may still be in flight.
        let mut dirty = true;
        for (k, step) in self.steps.iter().enumerate() {
            match step {
                Step::Compute => {
                    if dirty {
                        self.sync_all()?;
                        dirty = false;
                    }
                    self.compute(k)?;
                }
                Step::Local(per) => {
                    for (d, launches) in per.iter().enumerate() {
                        for l in launches {
                            launch(&self.clique, d, l).map_err(|e| self.device_error(d, k, e.to_string(), false))?;
                        }
                    }
                    dirty = true;
                }
                Step::Copy { src, dst, len } => {
                    for (d, b) in self.arena.iter().enumerate() {
                        let l = Launch::Copy { dst: b.ptr + *dst as u64, src: b.ptr + *src as u64, len: *len };
                        launch(&self.clique, d, &l).map_err(|e| self.device_error(d, k, e.to_string(), false))?;
                    }
                    dirty = true;
                }
                Step::Collective { stages, report } => {
                    // A failing device stops before this collective; like a withheld one, its
                    // peers then time out, and the error returned is its own.
                    let failing = match fault {
                        Some(Fault::FailBefore { device, collective }) if *collective == report.name => Some(*device),
                        _ => None,
                    };
                    let withheld = |d: usize| {
                        Some(d) == failing
                            || matches!(fault, Some(Fault::WithholdRank { device, collective })
                                if *device == d && *collective == report.name)
                    };
                    for stage in stages {
                        match stage {
                            Stage::Local(per) => {
                                for (d, launches) in per.iter().enumerate() {
                                    if withheld(d) {
                                        continue;
                                    }
                                    for l in launches {
                                        launch(&self.clique, d, l)
                                            .map_err(|e| self.device_error(d, k, e.to_string(), false))?;
                                    }
                                }
                            }
                            Stage::Nccl { comms, members, call } => {
                                if members.iter().any(|&m| withheld(m)) {
                                    return Err(ExecError::BadArguments(format!(
                                        "withholding a rank from NCCL collective '{}' would hang NCCL; faults are \
                                         injected on the kernel path only",
                                        report.name
                                    )));
                                }
                                run_nccl(&self.clique, comms, members, call)
                                    .map_err(|e| self.device_error(members[0], k, e.to_string(), false))?;
                            }
                        }
                    }
                    dirty = true;
                    if let Some(d) = failing {
                        let _ = self.sync_all();
                        let _ = self.status.take();
                        return Err(self.device_error(
                            d,
                            k,
                            format!("injected failure before {} '{}'", report.label, report.name),
                            true,
                        ));
                    }
                }
                Step::Nothing => {}
            }
        }
        Ok(dirty)
    }

    /// Reads every device's status word: a kernel that timed out names its collective.
    fn check_status(&self) -> Result<(), ExecError> {
        let Some((d, mask, tag)) = self.status.take().map_err(cuda_err)? else {
            return Ok(());
        };
        let k = (tag as usize).saturating_sub(1);
        let (name, label, groups, members) = match self.steps.get(k) {
            Some(Step::Collective { report, .. }) => {
                (report.name.as_str(), report.label.as_str(), report.groups.as_str(), report.members.get(d))
            }
            _ => ("?", "collective", "", None),
        };
        let missing: Vec<String> = (0..32)
            .filter(|b| mask & (1 << b) != 0)
            .map(|b| members.and_then(|m| m.get(b)).map_or(format!("member {b}"), |dev| format!("device {dev}")))
            .collect();
        Err(self.device_error(
            d,
            k,
            format!(
                "{label} '{name}' ({groups}) timed out after {} ms on device {d} waiting for {}",
                self.timeout.as_millis(),
                missing.join(", ")
            ),
            true,
        ))
    }

    fn run(&self, args: &[Vec<Literal>]) -> Result<Vec<Literal>, ExecError> {
        let mut staging = self.staging.lock().unwrap_or_else(|e| e.into_inner());
        for (d, (program, a)) in self.low.programs.iter().zip(args).enumerate() {
            self.clique.devices[d].ctx.bind().map_err(|e| self.device_error(d, 0, e.to_string(), false))?;
            let mut at = 0;
            for (i, (arg, regions)) in a.iter().zip(&program.params).enumerate() {
                write_value(regions, arg, |o, bytes| match staging.get_mut(d) {
                    Some(pin) => {
                        self.check_region(d, o, bytes.len())?;
                        pin.host_mut()[at..at + bytes.len()].copy_from_slice(bytes);
                        // SAFETY: the region lies inside the arena (checked above); the pinned
                        // bytes stay untouched until this run synchronises the stream (at the
                        // end of every run, failed ones included: `execute`).
                        unsafe {
                            self.clique.devices[d].stream.copy_h2d_async(
                                self.arena[d].ptr + o as u64,
                                pin,
                                at,
                                bytes.len(),
                            )
                        }
                        .map_err(|e| e.to_string())?;
                        at += bytes.len();
                        Ok(())
                    }
                    None => self.arena[d].write_at(o, bytes).map_err(|e| e.to_string()),
                })
                .map_err(|m| self.device_error(d, 0, format!("parameter {i}: {m}"), false))?;
            }
        }
        let fault = self.fault.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let replay = self.use_graphs && fault.is_none();
        if replay && self.graphs.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            self.launch_graphs()?;
        } else {
            self.enqueue_steps(fault.as_ref())?;
        }
        // Results: every device's async copies into its staging (after its arguments), queued
        // behind the program, so the one wait below covers both.
        for (d, pin) in staging.iter().enumerate() {
            let program = &self.low.programs[d];
            self.clique.devices[d].ctx.bind().map_err(|e| self.device_error(d, 0, e.to_string(), false))?;
            let mut at = program.params.iter().flatten().map(|r| r.len).sum::<usize>();
            for r in &program.results {
                self.check_region(d, r.offset, r.len).map_err(|m| self.device_error(d, self.steps.len(), m, false))?;
                // SAFETY: the region lies inside the arena (checked above); the staging is
                // read only after the stream is synchronised below.
                unsafe {
                    self.clique.devices[d].stream.copy_d2h_async(pin, at, self.arena[d].ptr + r.offset as u64, r.len)
                }
                .map_err(|e| self.device_error(d, self.steps.len(), e.to_string(), false))?;
                at += r.len;
            }
        }
        self.sync_all()?;
        self.check_status()?;
        if replay {
            // Captured after a run that worked, so the graph replays a known-good program.
            let mut g = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
            if g.is_none() {
                *g = Some(self.capture()?);
            }
        }
        let mut results = Vec::with_capacity(self.low.programs.len());
        for (d, program) in self.low.programs.iter().enumerate() {
            let buf = &self.arena[d];
            let mut at = program.params.iter().flatten().map(|r| r.len).sum::<usize>();
            let root = read_value(&program.results, &self.low.root_shape, |o, l| match staging.get_mut(d) {
                Some(pin) => {
                    let v = pin.host_mut()[at..at + l].to_vec();
                    at += l;
                    Ok(v)
                }
                None => {
                    let mut v = vec![0u8; l];
                    buf.read_at(o, &mut v).map(|_| v).map_err(|e| e.to_string())
                }
            })
            .map_err(|m| self.device_error(d, self.steps.len(), m, false))?;
            results.push(
                self.low
                    .evaluator
                    .finish_result(&self.low.module, root, d)
                    .map_err(|e| self.device_error(d, self.steps.len(), e.to_string(), false))?,
            );
        }
        Ok(results)
    }

    /// Checks that `len` bytes at `offset` lie inside device `d`'s arena.
    fn check_region(&self, d: usize, offset: usize, len: usize) -> Result<(), String> {
        if offset.checked_add(len).is_none_or(|end| end > self.arena[d].len) {
            return Err(format!("region of {len} bytes at {offset} outside the arena of {} bytes", self.arena[d].len));
        }
        Ok(())
    }

    /// One program per device.
    pub fn programs(&self) -> &[ThunkProgram] {
        &self.low.programs
    }

    /// Every collective that runs, with its decision.
    pub fn planned(&self) -> &[PlannedCollective] {
        &self.low.planned
    }

    /// Per entry parameter, the shape each device's argument must have.
    pub fn param_shapes(&self) -> &[Shape] {
        &self.low.param_shapes
    }

    /// Injects `fault` into every later execution (`None` clears it).
    pub fn set_fault(&self, fault: Option<Fault>) {
        *self.fault.lock().unwrap_or_else(|e| e.into_inner()) = fault;
    }
}
