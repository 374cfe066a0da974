//! A call's work on one device, worked out once at INITIALIZE ([`Plan::new`]): which kernels it launches (loaded and
//! resolved to functions), their grids, and their argument structs with every address filled in but XLA's buffers,
//! which change between executions. EXECUTE ([`Plan::run`]) copies each argument struct, writes this execution's buffer
//! addresses into it and enqueues the launch on XLA's stream: no formatting, name or map lookup, allocation or lock.
//! Covered: all-reduce (one operand, variadic, or fused with the residual add + RMSNorm after it), reduce-scatter, the
//! pushes of all-gather and all-to-all, and permute.

use super::copy_engine::{self, Loc, Op, Peer, Piece, Send, Words};
use super::*;

/// Where a copy's source lies: an operand of the call, or this instance's staging.
#[derive(Clone, Copy, Debug)]
enum Src {
    Arg(usize),
    Addr(u64),
}

/// A launch's arguments with every address but XLA's buffers in place, and where this execution's buffers go.
#[derive(Clone, Copy, Debug)]
#[expect(clippy::large_enum_variant, reason = "built once per plan; boxing would add an indirection to each launch")]
enum Args {
    /// `input` ← operand `i`, `output` ← result `i`.
    Reduce(ReduceArgs, usize),
    Scatter(ScatterArgs, usize),
    /// `many.input[k]` / `many.output[k]` ← operand / result `ops[k]`, for `k < many.count`.
    Many(ManyArgs, [usize; MAX_OPERANDS]),
    /// `input` ← operand 0, the residual ← operand 1, gamma ← operand 2 (when `true`), `h` and `y` ← results 0 and 1.
    Norm(NormArgs, bool),
    /// Task `i`'s `src` ← operand `src[i].0` plus `src[i].1` bytes.
    Exchange(ExchangeArgs, [(usize, u64); MAX_TASKS]),
    /// `output` ← result `.1` plus `.2` bytes.
    Local(LocalArgs, usize, u64),
}

#[derive(Debug)]
#[expect(clippy::large_enum_variant, reason = "built once per plan; boxing would add an indirection to each launch")]
enum Step {
    /// `func`: an index into [`Plan::funcs`].
    Launch { func: usize, grid: u32, args: Args },
    /// Into result `dst`.
    Copy { dst: usize, src: Src, len: usize },
    /// Result `dst` ← zeros.
    Fill { dst: usize, len: usize },
    /// A copy-engine operation (copy_engine.rs): a copy or a stream memory operation.
    Ce(Op),
}

/// Blocks of the copy-engine reductions' one kernel (16 of an H200's 132 SMs): it reads only local memory the copy
/// engines filled, so it needs no SMs to hide link latency, and the rest stay with the compute beside. A starting
/// point, to be tuned when measured beside GEMMs.
const CE_REDUCE_BLOCKS: u32 = 16;

/// A call on one device, resolved at INITIALIZE.
pub(super) struct Plan<B: XlaBackend> {
    /// Keeps the staging, signals and other processes' mapped buffers alive.
    _inst: Arc<Instance<B>>,
    /// This device's part (its status words, read before each execution).
    pub(super) own: Arc<Rank<B>>,
    funcs: Vec<B::Function>,
    steps: Vec<Step>,
}

/// What building a plan reads: the call, its instance with every member's addresses, the calling device and its GPU,
/// and the buffers' shapes (fixed for an executable).
pub(super) struct Frame<'a, B: XlaBackend> {
    pub c: &'static Clique<B>,
    pub cfg: &'a CustomCallConfig,
    pub inst: &'a Arc<Instance<B>>,
    pub done: &'a Complete<B>,
    pub device: usize,
    pub ordinal: usize,
    pub args: &'a [ArrayShape],
    pub rets: &'a [ArrayShape],
}

/// A reduction kernel's argument struct: its own fields, then what every one of them takes (the member's rank, the
/// group's size, the [`Symmetric`] addresses and the status).
macro_rules! group_args {
    ($ty:ident { $($f:ident $(: $v:expr)?),* $(,)? }, $rank:expr, $world:expr, $sym:expr, $status:expr) => {
        $ty {
            $($f $(: $v)?,)*
            rank: $rank as u32,
            world: $world as u32,
            stage: $sym.stage,
            stride: $sym.stride,
            flags: $sym.flags,
            counter: $sym.counter,
            status: $status,
        }
    };
}

/// A plan under construction: the kernels resolved so far (by name, at INITIALIZE only).
struct Builder<'a, B: XlaBackend> {
    x: &'a Frame<'a, B>,
    own: Arc<Rank<B>>,
    /// The algorithm the kernels run (a copy-engine reduction's direct form where it cannot run on the copy engines).
    algo: Algo,
    /// The instance's copy-engine flag words, once a copy-engine form was chosen.
    words: Option<Words>,
    names: Vec<String>,
    funcs: Vec<B::Function>,
    steps: Vec<Step>,
}

impl<B: XlaBackend> Plan<B> {
    /// Works out `x`'s call on its device: loads (prebuilt, cached or compiled) and resolves every kernel it launches,
    /// and checks its operands.
    pub(super) fn new(x: &Frame<'_, B>) -> Result<Plan<B>, HandlerError> {
        let own = x.done.ranks.get(&x.device).cloned().ok_or_else(|| no_state(x.cfg, x.device))?;
        // A copy-engine reduction that does not run on the copy engines runs its direct kernel.
        let algo = match x.cfg.algorithm {
            Algo::CopyEngineReduceScatter => Algo::DirectReduceScatter,
            Algo::CopyEngineAllReduce => Algo::TwoShotAllReduce,
            a => a,
        };
        let mut b = Builder { x, own, algo, words: None, names: Vec::new(), funcs: Vec::new(), steps: Vec::new() };
        let cfg = x.cfg;
        let single = x.args.len() == 1 && cfg.epilogue.is_none();
        if cfg.algorithm.is_copy_engine() && (single || cfg.kind != Kind::AllReduce) && b.copy_engines()? {
            match cfg.kind {
                Kind::CollectivePermute => b.ce_permute()?,
                Kind::ReduceScatter => b.ce_reduce_scatter()?,
                Kind::AllReduce => b.ce_all_reduce()?,
                _ => b.push(true)?,
            }
        } else if cfg.kind == Kind::CollectivePermute {
            b.permute()?;
        } else {
            let (group, idx) = b.group()?;
            match b.algo {
                _ if cfg.epilogue.is_some() => b.reduce_norm(group, idx)?,
                Algo::OneShotAllReduce if x.args.len() > 1 && group.len() > 1 => b.reduce_many(group, idx)?,
                Algo::OneShotAllReduce | Algo::TwoShotAllReduce | Algo::DirectReduceScatter => {
                    for i in 0..x.args.len().min(x.rets.len()) {
                        b.reduce(group, idx, i)?;
                    }
                }
                Algo::DirectAllGather | Algo::DirectAllToAll | Algo::CopyEngineAllGather | Algo::CopyEngineAllToAll => {
                    b.push(false)?
                }
                Algo::DirectPermute
                | Algo::CopyEnginePermute
                | Algo::CopyEngineReduceScatter
                | Algo::CopyEngineAllReduce => {
                    return Err(internal(format!("{} on {:?}", b.algo, cfg.kind)));
                }
            }
        }
        Ok(Plan { _inst: x.inst.clone(), own: b.own, funcs: b.funcs, steps: b.steps })
    }

    /// Kernel launches per call (0 for the copy-engine forms).
    pub(super) fn launches(&self) -> usize {
        self.steps.iter().filter(|s| matches!(s, Step::Launch { .. })).count()
    }

    /// Enqueues the call on `stream` with this execution's buffers: `arg(i)` / `ret(i)`, the device addresses of
    /// operand and result `i` (XLA's, or a harness's).
    pub(super) fn run(
        &self,
        arg: impl Fn(usize) -> Result<u64, HandlerError>,
        ret: impl Fn(usize) -> Result<u64, HandlerError>,
        stream: &B::Stream,
    ) -> Result<(), HandlerError> {
        for step in &self.steps {
            match *step {
                Step::Launch { func, grid, args } => {
                    let func = &self.funcs[func];
                    match args {
                        Args::Reduce(mut a, i) => {
                            (a.input, a.output) = (arg(i)?, ret(i)?);
                            self.launch(stream, func, grid, &mut a.params())?;
                        }
                        Args::Scatter(mut a, i) => {
                            (a.input, a.output) = (arg(i)?, ret(i)?);
                            self.launch(stream, func, grid, &mut a.params())?;
                        }
                        Args::Many(mut a, ops) => {
                            for (k, &j) in ops.iter().enumerate().take(a.many.count as usize) {
                                (a.many.input[k], a.many.output[k]) = (arg(j)?, ret(j)?);
                            }
                            self.launch(stream, func, grid, &mut a.params())?;
                        }
                        Args::Norm(mut a, gamma) => {
                            a.input = arg(0)?;
                            a.norm.residual = arg(1)?;
                            a.norm.gamma = if gamma { arg(2)? } else { 0 };
                            (a.norm.h, a.norm.y) = (ret(0)?, ret(1)?);
                            self.launch(stream, func, grid, &mut a.params())?;
                        }
                        Args::Local(mut a, i, off) => {
                            a.output = ret(i)? + off;
                            self.launch(stream, func, grid, &mut a.params())?;
                        }
                        Args::Exchange(mut a, src) => {
                            for (t, &(i, off)) in a.x.task.iter_mut().zip(&src).take(a.x.ntasks as usize) {
                                t.src = arg(i)? + off;
                            }
                            self.launch(stream, func, grid, &mut a.params())?;
                        }
                    }
                }
                Step::Copy { dst, src, len } => {
                    let src = match src {
                        Src::Arg(i) => arg(i)?,
                        Src::Addr(a) => a,
                    };
                    // SAFETY: `dst` is a result of this call and `src` an operand of it or this instance's staging
                    // (alive with `_inst`); XLA's buffers live until the stream reaches the copy (XLA's contract), and
                    // `len` is the result's byte size, which the source holds (checked when the plan was made).
                    unsafe { stream.copy_d2d(ret(dst)?, src, len) }.map_err(internal)?;
                }
                Step::Fill { dst, len } => {
                    // SAFETY: `dst` is a result of this call, holding `len` bytes and alive until the stream reaches
                    // the fill (as in `Copy`).
                    unsafe { stream.memset_u8(ret(dst)?, 0, len) }.map_err(internal)?;
                }
                Step::Ce(op) => self.ce(op, &arg, &ret, stream)?,
            }
        }
        Ok(())
    }

    /// Enqueues one copy-engine operation.
    fn ce(
        &self,
        op: Op,
        arg: &impl Fn(usize) -> Result<u64, HandlerError>,
        ret: &impl Fn(usize) -> Result<u64, HandlerError>,
        stream: &B::Stream,
    ) -> Result<(), HandlerError> {
        let at = |l: Loc| match l {
            Loc::Arg(i, o) => arg(i).map(|a| a + o),
            Loc::Ret(i, o) => ret(i).map(|a| a + o),
            Loc::At(a) => Ok(a),
        };
        // What every block below relies on: flag and watch words lie in the instance's host-mapped words, which `_inst`
        // keeps alive as long as the executable; staging addresses are members' staging (alive with `_inst`); XLA's
        // buffers live until the stream reaches the work (XLA's contract); the plan sized every copy from the shapes it
        // was made for, which XLA's buffers have.
        match op {
            // SAFETY: a flag word (above).
            Op::Signal(a) => unsafe { stream.write_u32(a, 1) },
            Op::Await { addr, code, mark } => {
                // SAFETY: `mark` and `addr` are this member's watch and flag words (above).
                unsafe { stream.write_u32(mark, code) }
                    // SAFETY: as the write before it.
                    .and_then(|()| unsafe { stream.wait_u32(addr, 1) })
                    // SAFETY: as the write before it.
                    .and_then(|()| unsafe { stream.write_u32(addr, 0) })
            }
            // SAFETY: this member's watch word (above).
            Op::Unmark(mark) => unsafe { stream.write_u32(mark, 0) },
            Op::Move { dst, src, width, rows, dpitch, spitch } => {
                let (dst, src) = (at(dst)?, at(src)?);
                if rows == 1 {
                    // SAFETY: staging or this call's buffers, `width` bytes within them (above).
                    unsafe { stream.copy_d2d(dst, src, width as usize) }
                } else {
                    let (w, r, dp, sp) = (width as usize, rows as usize, dpitch as usize, spitch as usize);
                    // SAFETY: as the contiguous copy, every row within its buffer.
                    unsafe { stream.copy_2d(dst, dp, src, sp, w, r) }
                }
            }
            // SAFETY: a result of this call, `len` bytes within it (above).
            Op::Zero { dst, len } => unsafe { stream.memset_u8(at(dst)?, 0, len as usize) },
        }
        .map_err(internal)
    }

    fn launch(
        &self,
        stream: &B::Stream,
        func: &B::Function,
        grid: u32,
        params: &mut [*mut std::ffi::c_void],
    ) -> Result<(), HandlerError> {
        // SAFETY: `params` points into a copy of one of args.rs's argument structs, alive for this call, whose field
        // list is `func`'s kernel family's parameter list (the plan pairs them); every address in it is an XLA buffer
        // of this execution (alive until the stream reaches it, XLA's contract) or this instance's staging, signals or
        // mapped status, which `_inst` keeps as long as the executable (which outlives the work it enqueued) on devices
        // whose peer access was probed.
        unsafe { stream.launch(func, grid, THREADS, params) }.map_err(internal)
    }
}

impl<'a, B: XlaBackend> Builder<'a, B> {
    /// The calling device's group and its index in it.
    fn group(&self) -> Result<(&'a [usize], usize), HandlerError> {
        let group = self.x.cfg.group_of(self.x.device).ok_or_else(|| internal("device in no group"))?;
        Ok((group, group.iter().position(|&m| m == self.x.device).unwrap_or(0)))
    }

    /// The kernel of `unit` named `name`, loaded and resolved once per plan.
    fn func(&mut self, unit: Unit, name: String) -> Result<usize, HandlerError> {
        if let Some(i) = self.names.iter().position(|n| *n == name) {
            return Ok(i);
        }
        let dev = &self.x.c.devices[self.x.ordinal];
        let f = dev.function_of(unit, &name).map_err(|e| internal(format!("kernel {name}: {e}")))?;
        self.names.push(name);
        self.funcs.push(f);
        Ok(self.funcs.len() - 1)
    }

    /// The specialised kernel `k` for `t` under `red`.
    fn spec(&mut self, k: Kernel, t: Dtype, red: Red) -> Result<usize, HandlerError> {
        self.func(Unit::Spec(k, t, red), k.name(t, red))
    }

    fn launch(&mut self, func: usize, grid: u32, args: Args) {
        // At most the call's `blocks` (kernels stride over any grid; every rank has the same limit).
        let blocks = self.x.cfg.blocks;
        let grid = if blocks > 0 { grid.min(blocks) } else { grid };
        self.steps.push(Step::Launch { func, grid, args });
    }

    /// Member `d`'s staging and signals, as this process addresses them.
    fn addr(&self, d: usize) -> Result<Addr, HandlerError> {
        self.x.done.addrs.get(&d).copied().ok_or_else(|| no_state(self.x.cfg, d))
    }

    fn flags(&self, d: usize) -> Result<u64, HandlerError> {
        Ok(self.addr(d)?.signals + 4 * BLOCKS as u64)
    }

    fn status(&self) -> Status {
        let timeout_ns = self.x.cfg.timeout_ms.saturating_mul(1_000_000);
        Status { word: self.own.status.ptr(), timeout_ns, tag: 1, report: self.own.report.device_ptr }
    }

    /// The group's staging and flag bases, the staging half's size and this device's launch counters: what every
    /// double-buffered reduction kernel takes.
    fn symmetric(&self, group: &[usize]) -> Result<Symmetric, HandlerError> {
        Ok(Symmetric {
            stage: Ptrs::of(&group.iter().map(|&m| self.addr(m).map(|a| a.staging)).collect::<Result<Vec<_>, _>>()?),
            flags: Ptrs::of(&group.iter().map(|&m| self.flags(m)).collect::<Result<Vec<_>, _>>()?),
            stride: (self.x.inst.staging / 2) as u64,
            counter: self.own.signals.ptr(),
        })
    }

    /// The group's Lamport regions (as `stage`, the slot as `stride`) and this device's Lamport counters: what
    /// `pl_lamport_*` takes.
    fn lamport(&self, group: &[usize]) -> Result<Symmetric, HandlerError> {
        let at = lamport_at() as u64;
        let stage = group.iter().map(|&m| self.addr(m).map(|a| a.signals + at)).collect::<Result<Vec<_>, _>>()?;
        Ok(Symmetric {
            stage: Ptrs::of(&stage),
            flags: Ptrs::default(),
            stride: self.x.inst.lamport_slot as u64,
            counter: self.own.signals.ptr() + at,
        })
    }

    /// A variadic one-shot all-reduce: one launch per element type (up to [`MAX_OPERANDS`] operands each), all operands
    /// staged side by side.
    fn reduce_many(&mut self, group: &[usize], idx: usize) -> Result<(), HandlerError> {
        let shapes = self.x.args;
        let red = reduction(self.x.cfg)?;
        let sym = self.symmetric(group)?;
        // Operand j's place in a staging half: the sum of the earlier operands' rounded sizes, the layout
        // `CustomCallConfig::gpu_staging_bytes` sized.
        let offsets: Vec<usize> = shapes
            .iter()
            .scan(0, |at, s| Some(std::mem::replace(at, *at + round_up(s.byte_size().max(16), 256))))
            .collect();
        let mut types: Vec<hlo::PrimitiveType> = shapes.iter().map(|s| s.ty).collect();
        types.sort_unstable_by_key(|t| *t as i32);
        types.dedup();
        for ty in types {
            let t = reduced_type(ty, red)?;
            let func = self.spec(Kernel::OneShotMany, t, red)?;
            let of_type: Vec<usize> = (0..shapes.len()).filter(|&j| shapes[j].ty == ty).collect();
            for chunk in of_type.chunks(MAX_OPERANDS) {
                let mut many = Many { count: chunk.len() as u64, ..Many::default() };
                let mut ops = [0usize; MAX_OPERANDS];
                let mut bytes = 0;
                for (k, &j) in chunk.iter().enumerate() {
                    ops[k] = j;
                    many.n[k] = (shapes[j].byte_size() / t.size()) as u64;
                    many.off[k] = offsets[j] as u64;
                    bytes = bytes.max(shapes[j].byte_size());
                }
                let x = group_args!(ManyArgs { many }, idx, group.len(), sym, self.status());
                self.launch(func, launch_grid(bytes), Args::Many(x, ops));
            }
        }
        Ok(())
    }

    /// A sum all-reduce fused with the residual add and RMSNorm after it (`cfg.epilogue`): the operands (a, x,
    /// [gamma]), the results (h, y), one `pl_one_shot_norm_*` (or, within the Lamport regions, `pl_lamport_norm_*`)
    /// launch whatever the call's algorithm (the staging of any all-reduce algorithm holds two halves of the operand).
    fn reduce_norm(&mut self, group: &[usize], idx: usize) -> Result<(), HandlerError> {
        let (cfg, shapes, rets) = (self.x.cfg, self.x.args, self.x.rets);
        let e = cfg.epilogue.as_ref().ok_or_else(|| internal("no epilogue"))?;
        check_epilogue::<B>(cfg)?;
        let invalid = |m: String| err(ErrorCode::InvalidArgument, format!("{} '{}': {m}", cfg.target(), cfg.name));
        if shapes.len() != 1 + e.extra_operands() || rets.len() != 2 {
            return Err(invalid(format!(
                "a fused call takes {} operands and returns 2 results, not {} and {}",
                1 + e.extra_operands(),
                shapes.len(),
                rets.len()
            )));
        }
        let a = &shapes[0];
        let d = a.dims.last().copied().unwrap_or(0);
        let dims_fit = rets.iter().all(|r| r.dims == a.dims)
            && shapes[1].dims == a.dims
            && shapes.get(2).is_none_or(|g| g.dims == [d]);
        let ty = |t: hlo::PrimitiveType| {
            Dtype::of(t).filter(|&t| Kernel::OneShotNorm.defined_for(t, Red::Sum)).ok_or_else(|| {
                invalid(format!("the fused all-reduce + RMSNorm takes f32, bf16 or f16 arrays, not {t}"))
            })
        };
        if !dims_fit || d <= 0 {
            return Err(invalid(format!("the fused call's shapes do not fit its epilogue (operand {a})")));
        }
        let t = ty(a.ty)?;
        let (d, elems) = (d as usize, a.byte_size() / t.size());
        let rows = elems / d;
        // Addresses come with each execution (`Plan::run`); the element types are fixed.
        let g = shapes.get(2).map(|s| ty(s.ty).map(|t| (0, t))).transpose()?;
        let norm =
            Norm::new(e, rows as u64, d as u64, (0, ty(shapes[1].ty)?), g, (0, ty(rets[0].ty)?), (0, ty(rets[1].ty)?))
                .map_err(invalid)?;
        if rows == 0 {
            return Ok(());
        }
        // Within the instance's Lamport regions: the fused kernel through them (no flags).
        let lamport = self.x.inst.fits_lamport(a.byte_size());
        let sym = if lamport { self.lamport(group)? } else { self.symmetric(group)? };
        if (a.byte_size() as u64) > sym.stride {
            return Err(internal(format!(
                "'{}': {} bytes do not fit a staging half of {}",
                cfg.name,
                a.byte_size(),
                sym.stride
            )));
        }
        let x = group_args!(NormArgs { input: 0, norm }, idx, group.len(), sym, self.status());
        let func = self.spec(if lamport { Kernel::LamportNorm } else { Kernel::OneShotNorm }, t, Red::Sum)?;
        self.launch(func, crate::gpu::norm_grid(rows), Args::Norm(x, g.is_some()));
        Ok(())
    }

    /// All-reduce (one-/two-shot) or reduce-scatter of operand `i` into result `i`.
    fn reduce(&mut self, group: &[usize], idx: usize, i: usize) -> Result<(), HandlerError> {
        let (cfg, shape) = (self.x.cfg, &self.x.args[i]);
        let bytes = shape.byte_size();
        let g = group.len();
        if g == 1 {
            self.steps.push(Step::Copy { dst: i, src: Src::Arg(i), len: bytes });
            return Ok(());
        }
        let red = reduction(cfg)?;
        let t = reduced_type(shape.ty, red)?;
        if self.algo == Algo::DirectReduceScatter {
            let sym = self.symmetric(group)?;
            let (outer, n, inner) = view(cfg, shape)?;
            let blocks = Blocks { outer: outer as u64, brow: block_row(n, inner, g)?, full: (n * inner) as u64 };
            let x = group_args!(ScatterArgs { input: 0, output: 0, blocks }, idx, g, sym, self.status());
            let func = self.spec(Kernel::ReduceScatter, t, red)?;
            self.launch(func, launch_grid(bytes / g), Args::Scatter(x, i));
            return Ok(());
        }
        // Float one-shots within the instance's Lamport regions cross the wire once, with no flags.
        let lamport = self.algo == Algo::OneShotAllReduce
            && Kernel::Lamport.defined_for(t, red)
            && self.x.inst.fits_lamport(bytes);
        let (kernel, sym) = match self.algo {
            _ if lamport => (Kernel::Lamport, self.lamport(group)?),
            Algo::OneShotAllReduce => (Kernel::OneShot, self.symmetric(group)?),
            _ => (Kernel::TwoShot, self.symmetric(group)?),
        };
        let n = (bytes / t.size()) as u64;
        let x = group_args!(ReduceArgs { input: 0, output: 0, n }, idx, g, sym, self.status());
        let func = self.spec(kernel, t, red)?;
        self.launch(func, launch_grid(bytes), Args::Reduce(x, i));
        Ok(())
    }

    /// All-gather and all-to-all: push into the peers' staging, then copy my staging out; by one `pl_exchange` launch,
    /// or (`ce`) on the copy engines, where an all-gather pulls instead (`copy_engine::all_gather`).
    fn push(&mut self, ce: bool) -> Result<(), HandlerError> {
        let (cfg, shapes, rets) = (self.x.cfg, self.x.args, self.x.rets);
        let (group, idx) = self.group()?;
        let g = group.len();
        if g > MAX_TASKS {
            return Err(err(ErrorCode::InvalidArgument, format!("group of {g} > {MAX_TASKS}")));
        }
        if ce && cfg.kind == Kind::AllGather {
            let (outer, n, inner) = view(cfg, &shapes[0])?;
            let (words, positions, staging) = self.ce_members(group)?;
            let ops = copy_engine::all_gather(words, idx, &positions, &staging, (outer as u64, (n * inner) as u64));
            self.steps.extend(ops.into_iter().map(Step::Ce));
            return Ok(());
        }
        let mut sig = Sig::default();
        let mut wait = Wait::default();
        for (j, &m) in group.iter().enumerate().filter(|&(j, _)| j != idx) {
            sig.base[sig.n as usize] = self.flags(m)?;
            sig.slot[sig.n as usize] = idx as u64;
            sig.n += 1;
            wait.slot[wait.n as usize] = j as u64;
            wait.n += 1;
        }
        let mut x = Xchg {
            counter: self.own.signals.ptr(),
            flags: self.flags(self.x.device)?,
            sig: [sig, sig],
            wait: [wait, wait],
            ..Xchg::default()
        };
        let mut src = [(0usize, 0u64); MAX_TASKS];
        let mine = self.own.staging.ptr();
        // Copies from my staging into results j, once every push has landed.
        let mut outs: Vec<(usize, u64, usize)> = Vec::new();
        let moved: usize;
        if cfg.kind == Kind::AllToAll && shapes.len() > 1 {
            // Tuple form: operand k goes to member k, result j comes from member j.
            if shapes.len() != g || rets.len() != g {
                return Err(err(
                    ErrorCode::InvalidArgument,
                    format!("tuple all-to-all with {} operands in a group of {g}", shapes.len()),
                ));
            }
            // `CustomCallConfig::gpu_staging_bytes`'s layout: one chunk per member.
            let chunk = round_up(shapes.iter().map(ArrayShape::byte_size).max().unwrap_or(0).max(16), 256);
            for (i, (task, src)) in x.task.iter_mut().zip(&mut src).enumerate().take(g) {
                let k = (idx + i) % g;
                let len = shapes[k].byte_size() as u64;
                *src = (k, 0);
                *task = Run {
                    src: 0,
                    dst: self.addr(group[k])?.staging + (idx * chunk) as u64,
                    rows: 1,
                    row: len,
                    ..Run::default()
                };
            }
            for (j, r) in rets.iter().enumerate() {
                outs.push((j, mine + (j * chunk) as u64, r.byte_size()));
            }
            moved = shapes[0].byte_size();
        } else {
            let shape = &shapes[0];
            let (outer, n, inner) = view(cfg, shape)?;
            let row = (n * inner) as u64;
            for (i, (task, src)) in x.task.iter_mut().zip(&mut src).enumerate().take(g) {
                let k = (idx + i) % g;
                let peer = self.addr(group[k])?.staging;
                *task = if cfg.kind == Kind::AllGather {
                    Run {
                        src: 0,
                        dst: peer + idx as u64 * row,
                        rows: outer as u64,
                        row,
                        sstride: row,
                        dstride: g as u64 * row,
                    }
                } else {
                    let brow = block_row(n, inner, g)?;
                    *src = (0, k as u64 * brow);
                    Run {
                        src: 0,
                        dst: peer + idx as u64 * brow,
                        rows: outer as u64,
                        row: brow,
                        sstride: row,
                        dstride: row,
                    }
                };
            }
            outs.push((0, mine, rets.first().map_or(0, ArrayShape::byte_size)));
            moved = shape.byte_size();
        }
        x.ntasks = g as u64;
        if ce {
            return self.ce_grouped(group, idx, &x.task, &src, &outs);
        }
        let e = ExchangeArgs { x, status: self.status() };
        let func = self.func(Unit::Base, "pl_exchange".into())?;
        self.launch(func, launch_grid(moved), Args::Exchange(e, src));
        let copies = outs.into_iter().filter(|o| o.2 > 0);
        self.steps.extend(copies.map(|(dst, src, len)| Step::Copy { dst, src: Src::Addr(src), len }));
        Ok(())
    }

    /// Whether this call runs on the copy engines: its device takes stream memory operations (across processes, the
    /// flag words are a shared segment each process registers). Otherwise the same collective runs on its direct
    /// kernel, which computes the same bytes.
    fn copy_engines(&mut self) -> Result<bool, HandlerError> {
        let (cfg, dev) = (self.x.cfg, &self.x.c.devices[self.x.ordinal]);
        let why_not = match dev.ctx.stream_mem_ops() {
            Ok(true) => None,
            Ok(false) => Some(format!("GPU {} takes no stream memory operations", dev.ordinal)),
            Err(e) => Some(e.to_string()),
        };
        if let Some(why) = why_not {
            log::warn!("peerless: {} '{}' runs its direct kernel, not the copy engines: {why}", cfg.target(), cfg.name);
            return Ok(false);
        }
        let words = self.x.inst.ce_words(&dev.ctx, cfg).map_err(|e| {
            err(
                ErrorCode::ResourceExhausted,
                format!("{} '{}': cannot map the copy engines' flag words: {e}", cfg.target(), cfg.name),
            )
        })?;
        self.words = Some(words);
        Ok(true)
    }

    /// The position of member `d` among the instance's devices (its flag words).
    fn position(&self, d: usize) -> Result<usize, HandlerError> {
        self.x.inst.devices.iter().position(|&x| x == d).ok_or_else(|| no_state(self.x.cfg, d))
    }

    /// The copy-engine form of [`Self::push`]'s exchange: `tasks[i]` (with its source `src[i]`) goes to member `(idx +
    /// i) % g`; `outs` (result, address in my staging, length) are copied out after every member's data landed.
    fn ce_grouped(
        &mut self,
        group: &[usize],
        idx: usize,
        tasks: &[Run],
        src: &[(usize, u64)],
        outs: &[(usize, u64, usize)],
    ) -> Result<(), HandlerError> {
        let (words, positions, staging) = self.ce_members(group)?;
        let (g, mine) = (group.len(), staging[idx]);
        let send = |k: usize| {
            let i = (k + g - idx) % g;
            let (t, (arg, off)) = (tasks[i], src[i]);
            Send {
                src: Loc::Arg(arg, off),
                dst: t.dst - staging[k],
                width: t.row,
                rows: t.rows,
                spitch: t.sstride,
                dpitch: t.dstride,
            }
        };
        let outs: Vec<(Loc, u64, u64)> =
            outs.iter().map(|&(r, a, len)| (Loc::Ret(r, 0), a - mine, len as u64)).collect();
        let ops = copy_engine::grouped(words, idx, &positions, &staging, send, &outs);
        self.steps.extend(ops.into_iter().map(Step::Ce));
        Ok(())
    }

    /// The members' places among the instance's devices and their staging, in group order.
    fn ce_members(&self, group: &[usize]) -> Result<(Words, Vec<usize>, Vec<u64>), HandlerError> {
        let words = self.words.ok_or_else(|| internal("copy engines without flag words"))?;
        let positions = group.iter().map(|&m| self.position(m)).collect::<Result<Vec<_>, _>>()?;
        let staging = group.iter().map(|&m| self.addr(m).map(|a| a.staging)).collect::<Result<Vec<_>, _>>()?;
        Ok((words, positions, staging))
    }

    /// Adds `pieces`: the operations as steps, each fold as a `pl_reduce_local_*` launch on a small grid (the
    /// copy-engine reductions' one kernel).
    fn ce_pieces(&mut self, pieces: Vec<Piece>) -> Result<(), HandlerError> {
        let red = reduction(self.x.cfg)?;
        let t = reduced_type(self.x.args[0].ty, red)?;
        for p in pieces {
            match p {
                Piece::Op(op) => self.steps.push(Step::Ce(op)),
                Piece::Reduce { len: 0, .. } => {}
                Piece::Reduce { base, slot, world, len, at } => {
                    let src = Ptrs::of(&(0..world as u64).map(|k| base + k * slot).collect::<Vec<_>>());
                    let a = LocalArgs { src, world: world as u32, output: 0, n: len / t.size() as u64 };
                    let func = self.spec(Kernel::ReduceLocal, t, red)?;
                    let grid = crate::gpu::grid(len.div_ceil(16), CE_REDUCE_BLOCKS);
                    self.launch(func, grid, Args::Local(a, 0, at));
                }
            }
        }
        Ok(())
    }

    /// Reduce-scatter on the copy engines (`copy_engine::reduce_scatter`).
    fn ce_reduce_scatter(&mut self) -> Result<(), HandlerError> {
        let (cfg, shape) = (self.x.cfg, &self.x.args[0]);
        let (group, idx) = self.group()?;
        let g = group.len();
        let (outer, n, inner) = view(cfg, shape)?;
        let (brow, row) = (block_row(n, inner, g)?, (n * inner) as u64);
        if g == 1 {
            self.steps.push(Step::Copy { dst: 0, src: Src::Arg(0), len: outer * brow as usize });
            return Ok(());
        }
        let (words, positions, staging) = self.ce_members(group)?;
        let pieces = copy_engine::reduce_scatter(words, idx, &positions, &staging, (outer as u64, brow, row));
        self.ce_pieces(pieces)
    }

    /// All-reduce on the copy engines (`copy_engine::all_reduce`).
    fn ce_all_reduce(&mut self) -> Result<(), HandlerError> {
        let (group, idx) = self.group()?;
        let bytes = self.x.args[0].byte_size();
        let g = group.len();
        if g == 1 {
            self.steps.push(Step::Copy { dst: 0, src: Src::Arg(0), len: bytes });
            return Ok(());
        }
        let part = thunks::custom_call::ce_part_bytes(bytes, g) as u64;
        let need = g as u64 * copy_engine::slot_bytes(part) + bytes as u64;
        if need > self.x.inst.staging as u64 {
            let name = &self.x.cfg.name;
            return Err(internal(format!("'{name}': {need} bytes of staging needed, {} held", self.x.inst.staging)));
        }
        let (words, positions, staging) = self.ce_members(group)?;
        let pieces = copy_engine::all_reduce(words, idx, &positions, &staging, bytes as u64, part);
        self.ce_pieces(pieces)
    }

    /// Collective-permute on the copy engines (`copy_engine::permute`).
    fn ce_permute(&mut self) -> Result<(), HandlerError> {
        let words = self.words.ok_or_else(|| internal("copy engines without flag words"))?;
        let (cfg, d) = (self.x.cfg, self.x.device);
        let len = self.x.args.first().map_or(0, ArrayShape::byte_size) as u64;
        let peer = |m: usize| -> Result<Peer, HandlerError> {
            Ok(Peer { position: self.position(m)?, staging: self.addr(m)?.staging })
        };
        let target = cfg.pairs.iter().find(|p| p.0 == d).map(|p| peer(p.1)).transpose()?;
        let source = cfg.pairs.iter().find(|p| p.1 == d).map(|p| peer(p.0)).transpose()?;
        let ops = copy_engine::permute(words, peer(d)?, target, source, len);
        self.steps.extend(ops.into_iter().map(Step::Ce));
        Ok(())
    }

    /// Collective-permute: "ready" from my target, push into its staging, "done" to it; then my staging (what my source
    /// pushed) becomes my result, or zeros without a source.
    fn permute(&mut self) -> Result<(), HandlerError> {
        let (cfg, d) = (self.x.cfg, self.x.device);
        let len = self.x.args.first().map_or(0, ArrayShape::byte_size);
        let target = cfg.pairs.iter().find(|p| p.0 == d).map(|p| p.1);
        let source = cfg.pairs.iter().find(|p| p.1 == d).map(|p| p.0);
        let mine = self.own.staging.ptr();
        let mut x = Xchg { counter: self.own.signals.ptr(), flags: self.flags(d)?, ..Xchg::default() };
        if let Some(s) = source.filter(|&s| s != d) {
            x.sig[0].base[0] = self.flags(s)?;
            x.sig[0].slot[0] = 0;
            x.sig[0].n = 1;
            x.wait[1].slot[0] = 1;
            x.wait[1].n = 1;
        }
        let one = |dst: u64| Run { src: 0, dst, rows: 1, row: len as u64, ..Run::default() };
        match target {
            Some(t) if t == d => {
                x.task[0] = one(mine);
                x.ntasks = 1;
            }
            Some(t) => {
                x.wait[0].slot[0] = 0;
                x.wait[0].n = 1;
                x.task[0] = one(self.addr(t)?.staging);
                x.ntasks = 1;
                x.sig[1].base[0] = self.flags(t)?;
                x.sig[1].slot[0] = 1;
                x.sig[1].n = 1;
            }
            None => {}
        }
        let e = ExchangeArgs { x, status: self.status() };
        let func = self.func(Unit::Base, "pl_exchange".into())?;
        self.launch(func, launch_grid(len), Args::Exchange(e, [(0, 0); MAX_TASKS]));
        if len == 0 {
            return Ok(());
        }
        self.steps.push(match source {
            Some(_) => Step::Copy { dst: 0, src: Src::Addr(mine), len },
            None => Step::Fill { dst: 0, len },
        });
        Ok(())
    }
}

/// Bytes of one of `g` blocks of a row of `n` slices of `inner` bytes, or why the row does not split into `g`.
fn block_row(n: usize, inner: usize, g: usize) -> Result<u64, HandlerError> {
    if !n.is_multiple_of(g) {
        return Err(err(ErrorCode::InvalidArgument, format!("dimension of {n} does not split into {g}")));
    }
    Ok((n / g * inner) as u64)
}

/// The error for member `d` of call `cfg` whose part is unknown.
fn no_state(cfg: &CustomCallConfig, d: usize) -> HandlerError {
    internal(format!("'{}': no state for device {d}", cfg.name))
}

/// The call's reduction.
fn reduction(cfg: &CustomCallConfig) -> Result<Red, HandlerError> {
    cfg.reduction.ok_or_else(|| err(ErrorCode::InvalidArgument, "no reduction"))
}

/// The kernels' element type for `ty` under `red`, or why no reduction kernel takes it.
fn reduced_type(ty: hlo::PrimitiveType, red: Red) -> Result<Dtype, HandlerError> {
    let t = Dtype::of(ty).ok_or_else(|| err(ErrorCode::InvalidArgument, format!("no kernel for {ty}")))?;
    if !crate::gpu::args::red_defined_for(red, t) {
        return Err(err(ErrorCode::InvalidArgument, format!("no {} reduction for {}", red.name(), t.name())));
    }
    Ok(t)
}

/// Errors unless vendor `B` runs calls with `cfg`'s epilogue.
pub(super) fn check_epilogue<B: XlaBackend>(cfg: &CustomCallConfig) -> Result<(), HandlerError> {
    if B::FUSED_NORM {
        return Ok(());
    }
    Err(err(
        ErrorCode::Unimplemented,
        format!(
            "{} '{}' carries a fused epilogue (all-reduce + RMSNorm), which Peerless's {} runtime does not run; \
             compile with PEERLESS_FLAGS=--{}=false",
            cfg.target(),
            cfg.name,
            B::NAME,
            thunks::flag::FUSE_NORM
        ),
    ))
}
