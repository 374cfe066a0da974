//! Each collective's launches on XLA's stream, for [`GpuRuntime`](super::GpuRuntime)'s EXECUTE:
//! all-reduce (one operand, variadic, or fused with the residual add + RMSNorm after it),
//! reduce-scatter, the pushes of all-gather and all-to-all, and permute. The runtime's
//! state (instances, slots, ranks) is the parent module's.

use super::*;

/// A variadic one-shot all-reduce: one launch per element type (up to
/// [`MAX_OPERANDS`] operands each), all operands staged side by side.
pub(super) fn reduce_many<B: XlaBackend>(
    call: &Call<B>,
    group: &[usize],
    idx: usize,
    args: &[BufferRef],
    rets: &[BufferRef],
    shapes: &[ArrayShape],
) -> Result<(), HandlerError> {
    let red = reduction(call.cfg)?;
    let Symmetric { stage, flags, stride, counter } = call.symmetric(group)?;
    // Operand j's place in a staging half: the sum of the earlier operands' rounded sizes,
    // the layout `staging_bytes` sized.
    let mut offsets = Vec::with_capacity(shapes.len());
    let mut at = 0usize;
    for s in shapes {
        offsets.push(at);
        at += round_up(s.byte_size().max(16), 256);
    }
    let mut types: Vec<hlo::PrimitiveType> = shapes.iter().map(|s| s.ty).collect();
    types.sort_unstable_by_key(|t| *t as i32);
    types.dedup();
    for ty in types {
        let t = reduced_type(ty, red)?;
        let of_type: Vec<usize> = (0..shapes.len()).filter(|&j| shapes[j].ty == ty).collect();
        for chunk in of_type.chunks(MAX_OPERANDS) {
            let mut many = Many { count: chunk.len() as u64, ..Many::default() };
            let mut bytes = 0;
            for (k, &j) in chunk.iter().enumerate() {
                many.input[k] = args[j].data as u64;
                many.output[k] = rets[j].data as u64;
                many.n[k] = (shapes[j].byte_size() / t.size()) as u64;
                many.off[k] = offsets[j] as u64;
                bytes = bytes.max(shapes[j].byte_size());
            }
            let mut x = ManyArgs {
                many,
                rank: idx as u32,
                world: group.len() as u32,
                stage,
                stride,
                flags,
                counter,
                status: call.status()?,
            };
            let name = format!("pl_one_shot_many_{}_{}", t.name(), red.name());
            call.launch(&name, launch_grid(bytes), &mut x.params(), &x)?;
        }
    }
    Ok(())
}

/// The call's reduction.
fn reduction(cfg: &CustomCallConfig) -> Result<Red, HandlerError> {
    cfg.reduction.map(Red::of).ok_or_else(|| err(ErrorCode::InvalidArgument, "no reduction"))
}

/// The kernels' element type for `ty` under `red`, or why no reduction kernel takes it.
fn reduced_type(ty: hlo::PrimitiveType, red: Red) -> Result<Dtype, HandlerError> {
    let t = Dtype::of(ty).ok_or_else(|| err(ErrorCode::InvalidArgument, format!("no kernel for {ty}")))?;
    if !red.defined_for(t) {
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
             compile with PEERLESS_FLAGS=--fuse_norm=false",
            cfg.target(),
            cfg.name,
            B::NAME
        ),
    ))
}

/// A sum all-reduce fused with the residual add and RMSNorm after it (`cfg.epilogue`): the
/// operands (a, x, [gamma]), the results (h, y), one `pl_one_shot_norm_*` launch whatever the
/// call's algorithm (the staging of any all-reduce algorithm holds two halves of the operand).
pub(super) fn reduce_norm<B: XlaBackend>(
    call: &Call<B>,
    group: &[usize],
    idx: usize,
    args: &[BufferRef],
    rets: &[BufferRef],
    shapes: &[ArrayShape],
) -> Result<(), HandlerError> {
    let cfg = call.cfg;
    let e = cfg.epilogue.as_ref().ok_or_else(|| internal("no epilogue"))?;
    check_epilogue::<B>(cfg)?;
    let invalid = |m: String| err(ErrorCode::InvalidArgument, format!("{} '{}': {m}", cfg.target(), cfg.name));
    if args.len() != 1 + e.extra_operands() || rets.len() != 2 {
        return Err(invalid(format!(
            "a fused call takes {} operands and returns 2 results, not {} and {}",
            1 + e.extra_operands(),
            args.len(),
            rets.len()
        )));
    }
    let ret_shapes = rets.iter().map(array_shape).collect::<Result<Vec<_>, _>>()?;
    let a = &shapes[0];
    let d = a.dims.last().copied().unwrap_or(0);
    let dims_fit = ret_shapes.iter().all(|r| r.dims == a.dims)
        && shapes[1].dims == a.dims
        && shapes.get(2).is_none_or(|g| g.dims == [d]);
    let ty = |t: hlo::PrimitiveType| {
        Dtype::of(t)
            .filter(|&t| Kernel::OneShotNorm.defined_for(t, Red::Sum))
            .ok_or_else(|| invalid(format!("the fused all-reduce + RMSNorm takes f32, bf16 or f16 arrays, not {t}")))
    };
    if !dims_fit || d <= 0 {
        return Err(invalid(format!("the fused call's shapes do not fit its epilogue (operand {a})")));
    }
    let t = ty(a.ty)?;
    let (d, elems) = (d as usize, a.byte_size() / t.size());
    let rows = elems / d;
    let x = (args[1].data as u64, ty(shapes[1].ty)?);
    let g = match (args.get(2), shapes.get(2)) {
        (Some(b), Some(s)) => Some((b.data as u64, ty(s.ty)?)),
        _ => None,
    };
    let h = (rets[0].data as u64, ty(ret_shapes[0].ty)?);
    let y = (rets[1].data as u64, ty(ret_shapes[1].ty)?);
    let norm = Norm::new(e, rows as u64, d as u64, x, g, h, y).map_err(invalid)?;
    if rows == 0 {
        return Ok(());
    }
    // Within the instance's Lamport regions: the fused kernel through them (no flags).
    let lamport = call.inst.fits_lamport(a.byte_size());
    let Symmetric { stage, flags, stride, counter } =
        if lamport { call.lamport(group)? } else { call.symmetric(group)? };
    if (a.byte_size() as u64) > stride {
        return Err(internal(format!("'{}': {} bytes do not fit a staging half of {stride}", cfg.name, a.byte_size())));
    }
    let mut x = NormArgs {
        input: args[0].data as u64,
        norm,
        rank: idx as u32,
        world: group.len() as u32,
        stage,
        stride,
        flags,
        counter,
        status: call.status()?,
    };
    let name = format!("pl_{}_norm_{}_sum", if lamport { "lamport" } else { "one_shot" }, t.name());
    call.launch(&name, crate::gpu::norm_grid(rows), &mut x.params(), &x)
}

/// All-reduce (one-/two-shot) or reduce-scatter of one operand.
pub(super) fn reduce<B: XlaBackend>(
    call: &Call<B>,
    group: &[usize],
    idx: usize,
    a: &BufferRef,
    r: &BufferRef,
    shape: &ArrayShape,
) -> Result<(), HandlerError> {
    let cfg = call.cfg;
    let bytes = shape.byte_size();
    let g = group.len();
    if g == 1 {
        return call.copy(r.data as u64, a.data as u64, bytes);
    }
    let red = reduction(cfg)?;
    let t = reduced_type(shape.ty, red)?;
    if cfg.algorithm == Algo::DirectReduceScatter {
        let Symmetric { stage, flags, stride, counter } = call.symmetric(group)?;
        let (phys, dim) = cfg.physical(&shape.dims).map_err(|m| err(ErrorCode::InvalidArgument, m))?;
        let (outer, n, inner) = view(&ArrayShape::new(shape.ty, phys), dim.unwrap_or(0))?;
        if n % g != 0 {
            return Err(err(ErrorCode::InvalidArgument, format!("dimension of {n} does not split into {g}")));
        }
        let blocks = Blocks { outer: outer as u64, brow: (n / g * inner) as u64, full: (n * inner) as u64 };
        let mut x = ScatterArgs {
            input: a.data as u64,
            output: r.data as u64,
            rank: idx as u32,
            world: g as u32,
            stage,
            stride,
            flags,
            counter,
            blocks,
            status: call.status()?,
        };
        let name = format!("pl_reduce_scatter_{}_{}", t.name(), red.name());
        return call.launch(&name, launch_grid(bytes / g), &mut x.params(), &x);
    }
    // Float one-shots within the instance's Lamport regions cross the wire once, with no flags.
    let lamport =
        cfg.algorithm == Algo::OneShotAllReduce && Kernel::Lamport.defined_for(t, red) && call.inst.fits_lamport(bytes);
    let (kind, Symmetric { stage, flags, stride, counter }) = match cfg.algorithm {
        _ if lamport => ("lamport", call.lamport(group)?),
        Algo::OneShotAllReduce => ("one_shot", call.symmetric(group)?),
        _ => ("two_shot", call.symmetric(group)?),
    };
    let mut x = ReduceArgs {
        input: a.data as u64,
        output: r.data as u64,
        n: (bytes / t.size()) as u64,
        rank: idx as u32,
        world: g as u32,
        stage,
        stride,
        flags,
        counter,
        status: call.status()?,
    };
    call.launch(&format!("pl_{kind}_{}_{}", t.name(), red.name()), launch_grid(bytes), &mut x.params(), &x)
}

/// All-gather and all-to-all: push into the peers' staging, then copy my staging out.
pub(super) fn push<B: XlaBackend>(
    call: &Call<B>,
    group: &[usize],
    idx: usize,
    args: &[BufferRef],
    rets: &[BufferRef],
    shapes: &[ArrayShape],
) -> Result<(), HandlerError> {
    let cfg = call.cfg;
    let g = group.len();
    let mine = call.own()?;
    if g > MAX_TASKS {
        return Err(err(ErrorCode::InvalidArgument, format!("group of {g} > {MAX_TASKS}")));
    }
    let mut sig = Sig::default();
    let mut wait = Wait::default();
    for (j, &m) in group.iter().enumerate() {
        if j != idx {
            sig.base[sig.n as usize] = call.flags(m)?;
            sig.slot[sig.n as usize] = idx as u64;
            sig.n += 1;
            wait.slot[wait.n as usize] = j as u64;
            wait.n += 1;
        }
    }
    let mut x = Xchg {
        counter: B::ptr(&mine.signals),
        flags: call.flags(call.device)?,
        sig: [sig, sig],
        wait: [wait, wait],
        ..Xchg::default()
    };
    let peer_stage = |k: usize| call.addr(group[k]).map(|a| a.staging);
    // Copies from my staging into XLA's results once every push has landed.
    let mut outs: Vec<(u64, u64, usize)> = Vec::new();
    let moved: usize;
    if cfg.kind == Kind::AllToAll && args.len() > 1 {
        // Tuple form: operand k goes to member k, result j comes from member j.
        if args.len() != g || rets.len() != g {
            return Err(err(
                ErrorCode::InvalidArgument,
                format!("tuple all-to-all with {} operands in a group of {g}", args.len()),
            ));
        }
        // `CustomCallConfig::gpu_staging_bytes`'s layout: one chunk per member.
        let chunk = round_up(shapes.iter().map(ArrayShape::byte_size).max().unwrap_or(0).max(16), 256);
        for i in 0..g {
            let k = (idx + i) % g;
            let len = shapes[k].byte_size() as u64;
            x.task[i] = Run {
                src: args[k].data as u64,
                dst: peer_stage(k)? + (idx * chunk) as u64,
                rows: 1,
                row: len,
                sstride: 0,
                dstride: 0,
            };
        }
        for (j, r) in rets.iter().enumerate() {
            outs.push((r.data as u64, B::ptr(&mine.staging) + (j * chunk) as u64, shapes[j].byte_size()));
        }
        moved = shapes[0].byte_size();
    } else {
        let (a, r, shape) = (&args[0], &rets[0], &shapes[0]);
        let (phys, dim) = cfg.physical(&shape.dims).map_err(|m| err(ErrorCode::InvalidArgument, m))?;
        let (outer, n, inner) = view(&ArrayShape::new(shape.ty, phys), dim.unwrap_or(0))?;
        let row = (n * inner) as u64;
        for i in 0..g {
            let k = (idx + i) % g;
            x.task[i] = if cfg.kind == Kind::AllGather {
                Run {
                    src: a.data as u64,
                    dst: peer_stage(k)? + idx as u64 * row,
                    rows: outer as u64,
                    row,
                    sstride: row,
                    dstride: g as u64 * row,
                }
            } else {
                if n % g != 0 {
                    return Err(err(ErrorCode::InvalidArgument, format!("dimension of {n} does not split into {g}")));
                }
                let brow = (n / g * inner) as u64;
                Run {
                    src: a.data as u64 + k as u64 * brow,
                    dst: peer_stage(k)? + idx as u64 * brow,
                    rows: outer as u64,
                    row: brow,
                    sstride: row,
                    dstride: row,
                }
            };
        }
        let out_bytes = r.byte_len()?;
        outs.push((r.data as u64, B::ptr(&mine.staging), out_bytes));
        moved = shape.byte_size();
    }
    x.ntasks = g as u64;
    let mut e = ExchangeArgs { x, status: call.status()? };
    call.launch("pl_exchange", launch_grid(moved), &mut e.params(), &e)?;
    for (dst, src, len) in outs {
        if len > 0 {
            call.copy(dst, src, len)?;
        }
    }
    Ok(())
}

/// Collective-permute: "ready" from my target, push into its staging, "done" to it; then my
/// staging (what my source pushed) becomes my result, or zeros without a source.
pub(super) fn permute<B: XlaBackend>(
    call: &Call<B>,
    args: &[BufferRef],
    rets: &[BufferRef],
    shapes: &[ArrayShape],
) -> Result<(), HandlerError> {
    let d = call.device;
    let (a, r) = (&args[0], &rets[0]);
    let len = shapes[0].byte_size();
    let target = call.cfg.pairs.iter().find(|p| p.0 == d).map(|p| p.1);
    let source = call.cfg.pairs.iter().find(|p| p.1 == d).map(|p| p.0);
    let mine = call.own()?;
    let mut x = Xchg { counter: B::ptr(&mine.signals), flags: call.flags(d)?, ..Xchg::default() };
    if let Some(s) = source.filter(|&s| s != d) {
        x.sig[0].base[0] = call.flags(s)?;
        x.sig[0].slot[0] = 0;
        x.sig[0].n = 1;
        x.wait[1].slot[0] = 1;
        x.wait[1].n = 1;
    }
    match target {
        Some(t) if t == d => {
            x.task[0] = Run {
                src: a.data as u64,
                dst: B::ptr(&mine.staging),
                rows: 1,
                row: len as u64,
                sstride: 0,
                dstride: 0,
            };
            x.ntasks = 1;
        }
        Some(t) => {
            x.wait[0].slot[0] = 0;
            x.wait[0].n = 1;
            x.task[0] = Run {
                src: a.data as u64,
                dst: call.addr(t)?.staging,
                rows: 1,
                row: len as u64,
                sstride: 0,
                dstride: 0,
            };
            x.ntasks = 1;
            x.sig[1].base[0] = call.flags(t)?;
            x.sig[1].slot[0] = 1;
            x.sig[1].n = 1;
        }
        None => {}
    }
    let mut e = ExchangeArgs { x, status: call.status()? };
    call.launch("pl_exchange", launch_grid(len), &mut e.params(), &e)?;
    if len == 0 {
        return Ok(());
    }
    if source.is_some() {
        call.copy(r.data as u64, B::ptr(&mine.staging), len)
    } else {
        call.fill(r.data as u64, 0, len)
    }
}
