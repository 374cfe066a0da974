//! Collectives whose members share one GPU, run through the XLA runtime's own plans ([`LocalCall`]) without XLA: what
//! `peerless bench --members-on-one-gpu N` and the GPU tests of the copy-engine forms run. [`check`]: every form,
//! element type and algorithm against a host reference bit for bit, eagerly and replayed from CUDA graphs; [`time`]: µs
//! per call, rounds interleaved, and with `beside_gemm` what a bf16 GEMM keeps of its speed. Members share the GPU's
//! memory and copy engines, so times are a proxy for one GPU's share on a node, never for NVLink.

use std::{rc::Rc, time::Instant};

use ffi::cuda::{Cuda, DeviceBuffer, Graph, Stream};
use ffi::gpu::{GpuBuffer, GpuContext, GpuStream};
use hlo::{ArrayShape, PrimitiveType};
use thunks::custom_call::CustomCallConfig;
use thunks::{CollectiveKind as Kind, KernelAlgorithm as Algo};

use super::{Clique, Red};
use crate::gpu::xla::LocalCall;
use crate::{Error, Result};

/// A collective form as users write it, on `g` members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// All-gather along dimension 0 or 1 of a rank-2 operand.
    AllGather(usize),
    /// All-to-all splitting and concatenating dimension 0 or 1.
    AllToAll(usize),
    /// Tuple all-to-all: operand k to member k.
    TupleAllToAll,
    /// Permute i → i + 1 mod g.
    Ring,
    /// Permute 0 → 1 and, with 3 or more members, 2 → 2: members without a source get zeros, a self pair copies, other
    /// members take no part.
    Partial,
    /// Reduce-scatter along dimension 0 or 1 of a rank-2 operand.
    ReduceScatter(usize),
    /// All-reduce of a rank-2 operand.
    AllReduce,
}

impl Form {
    /// The forms that only move bytes.
    pub const MOVES: [Form; 7] = [
        Form::AllGather(0),
        Form::AllGather(1),
        Form::AllToAll(0),
        Form::AllToAll(1),
        Form::TupleAllToAll,
        Form::Ring,
        Form::Partial,
    ];
    /// The forms that reduce.
    pub const REDUCTIONS: [Form; 3] = [Form::ReduceScatter(0), Form::ReduceScatter(1), Form::AllReduce];

    pub fn name(self) -> String {
        match self {
            Form::AllGather(d) => format!("all-gather dim {d}"),
            Form::AllToAll(d) => format!("all-to-all dim {d}"),
            Form::TupleAllToAll => "all-to-all tuple".into(),
            Form::Ring => "permute ring".into(),
            Form::Partial => "permute partial".into(),
            Form::ReduceScatter(d) => format!("reduce-scatter dim {d}"),
            Form::AllReduce => "all-reduce".into(),
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            Form::AllGather(_) => Kind::AllGather,
            Form::AllToAll(_) | Form::TupleAllToAll => Kind::AllToAll,
            Form::Ring | Form::Partial => Kind::CollectivePermute,
            Form::ReduceScatter(_) => Kind::ReduceScatter,
            Form::AllReduce => Kind::AllReduce,
        }
    }

    /// The copy-engine algorithm and today's kernel for the form.
    pub fn algorithms(self) -> [Algo; 2] {
        match self.kind() {
            Kind::AllGather => [Algo::CopyEngineAllGather, Algo::DirectAllGather],
            Kind::AllToAll => [Algo::CopyEngineAllToAll, Algo::DirectAllToAll],
            Kind::ReduceScatter => [Algo::CopyEngineReduceScatter, Algo::DirectReduceScatter],
            Kind::AllReduce => [Algo::CopyEngineAllReduce, Algo::TwoShotAllReduce],
            _ => [Algo::CopyEnginePermute, Algo::DirectPermute],
        }
    }

    fn pairs(self, g: usize) -> Vec<(usize, usize)> {
        match self {
            Form::Ring => (0..g).map(|i| (i, (i + 1) % g)).collect(),
            Form::Partial if g >= 3 => vec![(0, 1), (2, 2)],
            Form::Partial => vec![(0, 1)],
            _ => Vec::new(),
        }
    }
}

/// One call of a form: its config and every member's operand and result shapes.
struct Case {
    form: Form,
    g: usize,
    cfg: CustomCallConfig,
    args: Vec<ArrayShape>,
    rets: Vec<ArrayShape>,
}

/// The call of `form` on `g` members with `rows` × `cols` elements of `ty` per operand (`rows` and `cols` multiples of
/// `g` where the form splits them), running `algo`.
fn case(form: Form, g: usize, ty: PrimitiveType, rows: usize, cols: usize, algo: Algo, blocks: u32) -> Case {
    let (r, c) = (rows as i64, cols as i64);
    let a = ArrayShape::new(ty, vec![r, c]);
    let (args, rets) = match form {
        Form::AllGather(0) => (vec![a.clone()], vec![ArrayShape::new(ty, vec![r * g as i64, c])]),
        Form::AllGather(_) => (vec![a.clone()], vec![ArrayShape::new(ty, vec![r, c * g as i64])]),
        Form::TupleAllToAll => (vec![a.clone(); g], vec![a.clone(); g]),
        Form::ReduceScatter(0) => (vec![a.clone()], vec![ArrayShape::new(ty, vec![r / g as i64, c])]),
        Form::ReduceScatter(_) => (vec![a.clone()], vec![ArrayShape::new(ty, vec![r, c / g as i64])]),
        _ => (vec![a.clone()], vec![a]),
    };
    let mut cfg = CustomCallConfig::new(form.kind(), algo, format!("{} ({})", form.name(), algo));
    match form {
        Form::Ring | Form::Partial => cfg.pairs = form.pairs(g),
        _ => cfg.groups = vec![(0..g).collect()],
    }
    cfg.dimension = match form {
        Form::AllGather(d) | Form::AllToAll(d) | Form::ReduceScatter(d) => Some(d),
        _ => None,
    };
    if matches!(form, Form::ReduceScatter(_) | Form::AllReduce) {
        cfg.reduction = Some(Red::Sum);
    }
    cfg.num_devices = g;
    cfg.instance = next_instance();
    cfg.timeout_ms = 20_000;
    cfg.blocks = blocks;
    Case { form, g, cfg, args, rets }
}

fn next_instance() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0x0ce0_0000_0000_0001);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Member `m`'s results of `case` given every member's operands (row-major bytes).
fn reference(case: &Case, ops: &[Vec<Vec<u8>>], m: usize) -> Vec<Vec<u8>> {
    let g = case.g;
    let esz = case.args[0].ty.byte_size();
    let (rows, cols) = (case.args[0].dims[0] as usize, case.args[0].dims[1] as usize);
    let row = cols * esz;
    match case.form {
        Form::AllGather(0) => vec![(0..g).flat_map(|k| ops[k][0].clone()).collect()],
        Form::AllToAll(0) => {
            let block = rows / g * row;
            vec![(0..g).flat_map(|k| ops[k][0][m * block..(m + 1) * block].to_vec()).collect()]
        }
        // Row by row, every member's part of its row: the whole row (all-gather) or block m (all-to-all).
        Form::AllGather(_) | Form::AllToAll(_) => {
            let (at, w) = if case.form.kind() == Kind::AllGather { (0, row) } else { (m * (row / g), row / g) };
            let part = |op: &Vec<Vec<u8>>, r: usize| op[0][r * row + at..r * row + at + w].to_vec();
            vec![(0..rows).flat_map(|r| ops.iter().take(g).flat_map(move |op| part(op, r))).collect()]
        }
        Form::TupleAllToAll => (0..g).map(|k| ops[k][m].clone()).collect(),
        Form::Ring | Form::Partial => {
            let len = rows * row;
            match case.cfg.pairs.iter().find(|p| p.1 == m) {
                Some(&(s, _)) => vec![ops[s][0].clone()],
                None => vec![vec![0u8; len]],
            }
        }
        // Sums of f32 operands holding small integers (exact in any order): member m's block of the element-wise sum.
        Form::ReduceScatter(_) | Form::AllReduce => {
            let f = |b: &[u8]| -> Vec<f32> {
                b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default())).collect()
            };
            let mut sum = f(&ops[0][0]);
            for op in &ops[1..g] {
                for (a, b) in sum.iter_mut().zip(f(&op[0])) {
                    *a += b;
                }
            }
            let all: Vec<u8> = sum.iter().flat_map(|v| v.to_le_bytes()).collect();
            match case.form {
                Form::AllReduce => vec![all],
                Form::ReduceScatter(0) => {
                    let block = rows / g * row;
                    vec![all[m * block..(m + 1) * block].to_vec()]
                }
                _ => {
                    let brow = row / g;
                    vec![(0..rows).flat_map(|r| all[r * row + m * brow..r * row + (m + 1) * brow].to_vec()).collect()]
                }
            }
        }
    }
}

/// Seeded bytes (splitmix64), distinct per call of the generator.
struct Bytes(u64);

impl Bytes {
    fn fill(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        out.truncate(n);
        out
    }
}

/// A case's plans and every member's buffers.
struct Bound {
    call: LocalCall<Cuda>,
    members: Vec<usize>,
    args: Vec<Vec<DeviceBuffer>>,
    rets: Vec<Vec<DeviceBuffer>>,
}

fn gpu(e: impl std::fmt::Display) -> Error {
    Error::Gpu(e.to_string())
}

impl Bound {
    fn new(clique: &'static Clique, case: &Case) -> Result<Bound> {
        let call = LocalCall::new(clique, case.cfg.clone(), &case.args, &case.rets).map_err(gpu)?;
        let alloc = |m: usize, shapes: &[ArrayShape]| -> Result<Vec<_>> {
            shapes.iter().map(|s| Ok(DeviceBuffer::alloc(&clique.devices[m].ctx, s.byte_size())?)).collect()
        };
        let n = case.g;
        let args = (0..n).map(|m| alloc(m, &case.args)).collect::<Result<Vec<_>>>()?;
        let rets = (0..n).map(|m| alloc(m, &case.rets)).collect::<Result<Vec<_>>>()?;
        let members = call.members().to_vec();
        Ok(Bound { call, members, args, rets })
    }

    fn enqueue(&self, clique: &Clique, m: usize) -> Result<()> {
        let a: Vec<u64> = self.args[m].iter().map(DeviceBuffer::ptr).collect();
        let r: Vec<u64> = self.rets[m].iter().map(DeviceBuffer::ptr).collect();
        let dev = &clique.devices[m];
        dev.ctx.bind()?;
        self.call.run(m, &dev.stream, &a, &r).map_err(gpu)
    }

    /// Enqueues one call of every member.
    fn enqueue_all(&self, clique: &Clique) -> Result<()> {
        self.members.iter().try_for_each(|&m| self.enqueue(clique, m))
    }

    /// One call of every member, waited for.
    fn run_once(&self, clique: &Clique) -> Result<()> {
        self.enqueue_all(clique).and_then(|()| sync_all(clique))
    }

    /// Writes fresh operands, poisons the results; returns the operands. `exact`: f32 small integers (their sums are
    /// exact in any order), else any bytes.
    fn fill_with(&self, bytes: &mut Bytes, exact: bool) -> Result<Vec<Vec<Vec<u8>>>> {
        let mut data = |b: &DeviceBuffer| {
            let mut data = bytes.fill(b.size());
            if exact {
                for c in data.chunks_mut(4) {
                    let v = f32::from(c[0] % 64) - 32.0;
                    let n = c.len();
                    c.copy_from_slice(&v.to_le_bytes()[..n]);
                }
            }
            data
        };
        let all: Vec<Vec<Vec<u8>>> = self.args.iter().map(|bufs| bufs.iter().map(&mut data).collect()).collect();
        self.write(&all)?;
        Ok(all)
    }

    /// Writes `ops` as the operands (another binding's) and poisons the results.
    fn write(&self, ops: &[Vec<Vec<u8>>]) -> Result<()> {
        for (m, bufs) in self.args.iter().enumerate() {
            for (b, data) in bufs.iter().zip(&ops[m]) {
                b.write_at(0, data)?;
            }
            for r in &self.rets[m] {
                r.write_at(0, &vec![0xa5u8; r.size()])?;
            }
        }
        Ok(())
    }

    /// Every member's results.
    fn results(&self) -> Result<Vec<Vec<Vec<u8>>>> {
        let read = |b: &DeviceBuffer| -> Result<Vec<u8>> {
            let mut v = vec![0u8; b.size()];
            b.read_at(0, &mut v)?;
            Ok(v)
        };
        self.rets.iter().map(|bufs| bufs.iter().map(read).collect()).collect()
    }

    /// Compares every member's results with the reference; the error names the first byte off.
    fn verify(&self, case: &Case, ops: &[Vec<Vec<u8>>], what: &str) -> Result<()> {
        let results = self.results()?;
        for &m in &self.members {
            for (j, (got, w)) in results[m].iter().zip(&reference(case, ops, m)).enumerate() {
                if let Some(at) = got.iter().zip(w).position(|(a, b)| a != b) {
                    return Err(Error::Gpu(format!(
                        "{what}: member {m} result {j} differs from the reference at byte {at} of {} (got {:#04x}, want {:#04x})",
                        w.len(),
                        got[at],
                        w[at]
                    )));
                }
            }
        }
        Ok(())
    }
}

fn sync_all(clique: &Clique) -> Result<()> {
    for d in &clique.devices {
        d.ctx.bind()?;
        d.stream.synchronize()?;
    }
    Ok(())
}

/// What [`check`] did.
#[derive(Debug, Default)]
pub struct Checked {
    /// (form, algorithm, element type, shape) combinations equal to the reference.
    pub eager: usize,
    /// Graph replays equal to the reference (each with fresh operands).
    pub replays: usize,
    /// Kernel launches per call of each copy-engine case (must be 0).
    pub ce_launches: usize,
}

/// Checks every form, element type and algorithm on `members` members of GPU 0 against the host reference, then
/// `replays` replays of a captured call per form and algorithm. (`ce_only`: the copy-engine algorithms alone, e.g.
/// under a profiler that must see no kernel.) (`kinds`: the collective kinds whose forms to check.)
pub fn check(
    members: usize,
    replays: usize,
    ce_only: bool,
    kinds: &[Kind],
    progress: &mut dyn FnMut(&str),
) -> Result<Checked> {
    let clique: &'static Clique = Box::leak(Box::new(Clique::on_one_device(0, members)?));
    let types: Vec<PrimitiveType> = PrimitiveType::ALL.into_iter().filter(|t| t.is_computable()).collect();
    let mut bytes = Bytes(members as u64);
    let mut out = Checked::default();
    let g = members;
    for form in Form::MOVES.into_iter().filter(|f| kinds.contains(&f.kind())) {
        for algo in form.algorithms().into_iter().filter(|a| a.is_copy_engine() || !ce_only) {
            for &ty in &types {
                for (rows, cols) in [(g, g), (3 * g, 7 * g), (40 * g, 33 * g)] {
                    let c = case(form, g, ty, rows, cols, algo, clique.max_grid);
                    let b = Bound::new(clique, &c)?;
                    if algo.is_copy_engine() {
                        out.ce_launches += b.call.launches();
                    }
                    for _ in 0..2 {
                        let ops = b.fill_with(&mut bytes, false)?;
                        b.run_once(clique)?;
                        b.verify(&c, &ops, &format!("{} {} {rows}x{cols} {ty}", form.name(), algo))?;
                    }
                    out.eager += 1;
                }
            }
            progress(&format!("{} {algo}: every element type and shape equal to the reference", form.name()));
            if replays == 0 {
                continue;
            }
            // Captured once per member, replayed with fresh operands each time.
            let c = case(form, g, PrimitiveType::F32, 3 * g, 7 * g, algo, clique.max_grid);
            let b = Bound::new(clique, &c)?;
            let graphs = capture(clique, &b)?;
            for i in 0..replays {
                let ops = b.fill_with(&mut bytes, false)?;
                replay(clique, &graphs)?;
                b.verify(&c, &ops, &format!("{} {algo}, graph replay {i}", form.name()))?;
                out.replays += 1;
            }
            progress(&format!("{} {algo}: {replays} graph replays equal to the reference", form.name()));
        }
    }
    let reductions: Vec<Form> = Form::REDUCTIONS.into_iter().filter(|f| kinds.contains(&f.kind())).collect();
    check_reductions(clique, &reductions, replays, ce_only, &mut bytes, &mut out, progress)?;
    Ok(out)
}

/// Captures each member's call of `b` into a graph of its own.
fn capture(clique: &Clique, b: &Bound) -> Result<Vec<(usize, Graph)>> {
    let mut graphs = Vec::new();
    for &m in &b.members {
        let s: &Stream = &clique.devices[m].stream;
        clique.devices[m].ctx.bind()?;
        s.begin_capture()?;
        let queued = b.enqueue(clique, m);
        let graph = s.end_capture();
        queued?;
        graphs.push((m, graph?));
    }
    Ok(graphs)
}

/// Replays every member's graph once and waits for them.
fn replay(clique: &Clique, graphs: &[(usize, Graph)]) -> Result<()> {
    for (m, graph) in graphs {
        clique.devices[*m].ctx.bind()?;
        graph.launch(&clique.devices[*m].stream)?;
    }
    sync_all(clique)
}

/// The reductions: the copy-engine forms bit for bit equal to today's kernels on the same operands (any bytes, NaNs
/// included) for every element type and reduction the kernels take, and equal to exact f32 sums eagerly and over
/// `replays` graph replays.
fn check_reductions(
    clique: &'static Clique,
    forms: &[Form],
    replays: usize,
    ce_only: bool,
    bytes: &mut Bytes,
    out: &mut Checked,
    progress: &mut dyn FnMut(&str),
) -> Result<()> {
    let g = clique.len();
    let types: Vec<PrimitiveType> = PrimitiveType::ALL.into_iter().filter(|t| t.is_computable()).collect();
    for &form in forms {
        let [ce, direct] = form.algorithms();
        if !ce_only {
            for &ty in &types {
                let Some(t) = super::Dtype::of(ty) else { continue };
                for red in Red::ALL.into_iter().filter(|&r| crate::gpu::args::red_defined_for(r, t)) {
                    for (rows, cols) in [(g, g), (3 * g, 7 * g), (40 * g, 33 * g)] {
                        let bind = |algo| {
                            let mut c = case(form, g, ty, rows, cols, algo, clique.max_grid);
                            c.cfg.reduction = Some(red);
                            Bound::new(clique, &c)
                        };
                        let (b_ce, b_direct) = (bind(ce)?, bind(direct)?);
                        let ops = b_ce.fill_with(bytes, false)?;
                        b_direct.write(&ops)?;
                        for b in [&b_ce, &b_direct] {
                            b.run_once(clique)?;
                        }
                        if b_ce.results()? != b_direct.results()? {
                            let what = format!("{} {ty} {} {rows}x{cols}", form.name(), red.name());
                            return Err(Error::Gpu(format!("{what}: {ce} differs from {direct}")));
                        }
                        out.eager += 1;
                    }
                }
            }
            progress(&format!("{}: {ce} bit for bit {direct}, every element type and reduction", form.name()));
        }
        for algo in form.algorithms().into_iter().filter(|a| a.is_copy_engine() || !ce_only) {
            let c = case(form, g, PrimitiveType::F32, 3 * g, 7 * g, algo, clique.max_grid);
            let b = Bound::new(clique, &c)?;
            let ops = b.fill_with(bytes, true)?;
            b.run_once(clique)?;
            b.verify(&c, &ops, &format!("{} {algo}: exact f32 sums", form.name()))?;
            out.eager += 1;
            if replays == 0 {
                continue;
            }
            let graphs = capture(clique, &b)?;
            for i in 0..replays {
                let ops = b.fill_with(bytes, true)?;
                replay(clique, &graphs)?;
                b.verify(&c, &ops, &format!("{} {algo}, graph replay {i}", form.name()))?;
                out.replays += 1;
            }
            progress(&format!("{} {algo}: exact sums, {replays} graph replays equal to the reference", form.name()));
        }
    }
    Ok(())
}

/// Runs each copy-engine form with member 1 missing (it never enqueues its part) and a 200 ms timeout: member 0's
/// stream must finish (the watchdog ends its wait) and its next call must fail naming member 1. Returns those errors.
pub fn check_missing_member(members: usize) -> Result<Vec<String>> {
    let clique: &'static Clique = Box::leak(Box::new(Clique::on_one_device(0, members.max(2))?));
    let g = clique.len();
    let mut errors = Vec::new();
    for form in [Form::AllGather(0), Form::AllToAll(1), Form::TupleAllToAll, Form::Ring] {
        let algo = form.algorithms()[0];
        let mut c = case(form, g, PrimitiveType::F32, 2 * g, 3 * g, algo, clique.max_grid);
        c.cfg.timeout_ms = 200;
        let b = Bound::new(clique, &c)?;
        b.fill_with(&mut Bytes(3), false)?;
        let t = Instant::now();
        b.enqueue(clique, 0)?;
        // Waited for on a thread of its own: a wait the watchdog never ends must not hang this.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let d = &clique.devices[0];
            let r = d.ctx.bind().and_then(|()| d.stream.synchronize());
            let _ = tx.send(r);
        });
        match rx.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::Gpu(format!("{}: member 0's stream still waits after 30 s", form.name())));
            }
        }
        let waited = t.elapsed();
        let (a, r) = (
            b.args[0].iter().map(DeviceBuffer::ptr).collect::<Vec<_>>(),
            b.rets[0].iter().map(DeviceBuffer::ptr).collect::<Vec<_>>(),
        );
        let msg = match b.call.run(0, &clique.devices[0].stream, &a, &r) {
            Err(e) if e.code() == ffi::xla_ffi::ErrorCode::DeadlineExceeded && e.to_string().contains("[1") => {
                e.to_string()
            }
            Err(e) => return Err(Error::Gpu(format!("{}: unexpected error after a missing member: {e}", form.name()))),
            Ok(()) => return Err(Error::Gpu(format!("{}: the call after a missing member succeeded", form.name()))),
        };
        errors.push(format!("{} (member 0 released after {} ms): {msg}", form.name(), waited.as_millis()));
    }
    Ok(errors)
}

/// One timed row.
#[derive(Clone, Debug)]
pub struct Row {
    pub form: String,
    /// An algorithm, or `copies alone, …`: the all-gather's bytes as bare copies, no flags.
    pub algorithm: String,
    /// Operand bytes per member.
    pub bytes: usize,
    /// Kernel launches per call of a member.
    pub launches: usize,
    /// µs per call of every member (min, median, max over rounds).
    pub us: [f64; 3],
    /// With a GEMM beside: the fraction of its speed alone it kept (min, median, max).
    pub gemm_kept: Option<[f64; 3]>,
}

/// What [`time`] measures.
#[derive(Clone, Debug)]
pub struct TimeOptions {
    pub members: usize,
    /// Operand bytes per member.
    pub sizes: Vec<usize>,
    pub forms: Vec<Form>,
    pub rounds: usize,
    /// Also run a bf16 GEMM beside the largest size of each form.
    pub beside_gemm: bool,
    /// The kernels' grid per member (0: the clique's cap); calls beside compute get `--async_blocks`, so the bench
    /// splits those among the members.
    pub blocks: u32,
    /// The copy-engine algorithms alone.
    pub ce_only: bool,
}

fn spread(mut v: Vec<f64>) -> [f64; 3] {
    v.sort_by(f64::total_cmp);
    [v[0], v[v.len() / 2], v[v.len() - 1]]
}

/// What a row times: enqueues one call of every member.
type Load<'a> = Box<dyn Fn() -> Result<()> + 'a>;

/// Seconds for `iters` calls, enqueued back to back and then waited for.
fn run_calls(clique: &Clique, load: &Load, iters: usize) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..iters {
        load()?;
    }
    sync_all(clique)?;
    Ok(t.elapsed().as_secs_f64())
}

/// The copy-engine all-gather's bytes with no flags: each member's part into a staging buffer, then every staged part
/// into each member's result; on the members' own streams, then (one buffer set) all in order on member 0's, as a GPU
/// of a node runs its own member's copies. What the bytes alone take and cost a GEMM: the floor of any all-gather.
fn bare_copies(clique: &Clique, n: usize) -> Result<Vec<(String, usize, Load<'_>)>> {
    let g = clique.len();
    let alloc = |m: usize, len: usize| DeviceBuffer::alloc(&clique.devices[m].ctx, len);
    let bufs = (0..g).map(|m| Ok([alloc(m, n)?, alloc(m, n)?, alloc(m, g * n)?])).collect::<Result<Rc<[_]>>>()?;
    Ok(Vec::from([(false, "members' streams"), (true, "one stream")].map(|(one_stream, on)| {
        let bufs = bufs.clone();
        let load: Load = Box::new(move || {
            for (m, [src, staging, res]) in bufs.iter().enumerate() {
                let d = &clique.devices[if one_stream { 0 } else { m }];
                d.ctx.bind()?;
                // SAFETY: `n`-byte parts of this GPU's buffers (results `g * n`); a caller syncs before dropping them.
                unsafe {
                    d.stream.copy_d2d(staging.ptr(), src.ptr(), n)?;
                    for k in 0..g {
                        d.stream.copy_d2d(res.ptr() + (k * n) as u64, bufs[(m + k) % g][1].ptr(), n)?;
                    }
                }
            }
            Ok(())
        });
        (format!("copies alone, {on}"), 0, load)
    })))
}

/// The bf16 GEMM beside: three matrices and a cuBLAS handle on a stream of its own.
struct Gemm {
    n: usize,
    mats: Vec<DeviceBuffer>,
    stream: Stream,
    blas: ffi::cublas::Blas,
}

impl Gemm {
    fn new(clique: &Clique, n: usize) -> Result<Gemm> {
        let ctx = &clique.devices[0].ctx;
        let stream = Stream::new(ctx)?;
        let blas = ffi::cublas::Blas::new(ctx, &stream)?;
        let mut bytes = Bytes(7);
        let mut mats = Vec::new();
        for _ in 0..3 {
            let m = DeviceBuffer::alloc(ctx, 2 * n * n)?;
            // Random bf16 in [-1, 1): sign, exponent 126 or less, random mantissa.
            let data: Vec<u8> = bytes.fill(2 * n * n).chunks(2).flat_map(|c| [c[0], (c[1] & 0x80) | 0x3e]).collect();
            m.write_at(0, &data)?;
            mats.push(m);
        }
        Ok(Gemm { n, mats, stream, blas })
    }

    /// Seconds for `k` GEMMs on the GEMM's stream.
    fn alone(&self, k: usize) -> Result<f64> {
        let (t, p) = (Instant::now(), |i: usize| self.mats[i].ptr());
        for _ in 0..k {
            // SAFETY: three n×n bf16 matrices of this device, alive with `self`; the stream is synchronised below.
            unsafe { self.blas.gemm_bf16(self.n, p(0), p(1), p(2))? };
        }
        self.stream.synchronize()?;
        Ok(t.elapsed().as_secs_f64())
    }
}

/// GEMMs per timed batch beside a collective.
const GEMMS: usize = 30;

/// Times each form's algorithms at each size, rounds interleaved; with `beside_gemm`, the largest size again with a
/// GEMM on its own stream.
pub fn time(opts: &TimeOptions, progress: &mut dyn FnMut(&str)) -> Result<Vec<Row>> {
    let clique: &'static Clique = Box::leak(Box::new(Clique::on_one_device(0, opts.members)?));
    let g = opts.members;
    let blocks = if opts.blocks == 0 { clique.max_grid } else { opts.blocks.min(clique.max_grid) };
    let gemm = if opts.beside_gemm { Some(Gemm::new(clique, 8192)?) } else { None };
    let mut table = Vec::new();
    let mut bytes = Bytes(11);
    for &form in &opts.forms {
        for (si, &size) in opts.sizes.iter().enumerate() {
            // f32 rows × cols with rows and cols multiples of g (what the forms split).
            let elems = (size / 4).max(g * g);
            let cols = (1024usize.min(elems / g) / g).max(1) * g;
            let rows = (elems / cols / g).max(1) * g;
            let mut bound = form
                .algorithms()
                .into_iter()
                .filter(|a| a.is_copy_engine() || !opts.ce_only)
                .map(|a| {
                    let c = case(form, g, PrimitiveType::F32, rows, cols, a, blocks);
                    let b = Bound::new(clique, &c)?;
                    let ops = b.fill_with(&mut bytes, matches!(form, Form::ReduceScatter(_) | Form::AllReduce))?;
                    b.run_once(clique)?;
                    b.verify(&c, &ops, &format!("{} {a} {rows}x{cols}", form.name()))?;
                    Ok::<_, Error>((a.to_string(), b.call.launches(), Box::new(move || b.enqueue_all(clique)) as Load))
                })
                .collect::<Result<Vec<_>>>()?;
            if let Form::AllGather(_) = form {
                bound.extend(bare_copies(clique, rows * cols * 4)?);
            }
            // Calls per round: about 20 ms of the slowest.
            let one =
                bound.iter().map(|(_, _, b)| run_calls(clique, b, 3).map(|s| s / 3.0)).collect::<Result<Vec<_>>>()?;
            let slowest = one.iter().copied().fold(1e-6, f64::max);
            let iters = ((0.02 / slowest).ceil() as usize).clamp(3, 2000);
            let mut samples = vec![Vec::new(); bound.len()];
            for _ in 0..opts.rounds.max(1) {
                for (i, (_, _, b)) in bound.iter().enumerate() {
                    samples[i].push(run_calls(clique, b, iters)? / iters as f64 * 1e6);
                }
            }
            let last = si + 1 == opts.sizes.len();
            let mut kept = vec![Vec::new(); bound.len()];
            if let (Some(gm), true) = (&gemm, last) {
                gm.alone(GEMMS / 3)?; // clocks up, cuBLAS's kernels loaded
                for _ in 0..opts.rounds.max(1) {
                    for (i, (_, _, b)) in bound.iter().enumerate() {
                        // The GEMMs alone, then again beside enough calls to outlast them (the calls slow down beside
                        // them, and enqueueing them takes host time).
                        let alone = gm.alone(GEMMS)?;
                        let per = samples[i].iter().copied().fold(f64::MAX, f64::min) * 1e-6;
                        let calls = ((4.0 * alone / per).ceil() as usize + 2).min(100_000);
                        for _ in 0..calls {
                            b()?;
                        }
                        let beside = gm.alone(GEMMS)?;
                        sync_all(clique)?;
                        kept[i].push(alone / beside);
                    }
                }
            }
            for (i, (algorithm, launches, _)) in bound.into_iter().enumerate() {
                let row = Row {
                    form: form.name(),
                    algorithm,
                    bytes: rows * cols * 4,
                    launches,
                    us: spread(samples[i].clone()),
                    gemm_kept: (!kept[i].is_empty()).then(|| spread(kept[i].clone())),
                };
                let kept = row.gemm_kept.map(|k| format!(", GEMM keeps {:.3}", k[1])).unwrap_or_default();
                progress(&format!("{} {} {} B: {:.1} µs{kept}", row.form, row.algorithm, row.bytes, row.us[1]));
                table.push(row);
            }
        }
    }
    Ok(table)
}
