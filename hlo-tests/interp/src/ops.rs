//! Array operations on raw row-major bytes (data movement works for every element type,
//! F8 and s4/u4 included) and elementwise maps through [`Sc`].
//!
//! Every function validates its attributes against the operands' actual shapes and
//! returns `Err(reason)` instead of panicking; the evaluator adds the instruction's name.

use hlo::{Array, ArrayShape, DotDims, PadDim, PrimitiveType, SliceDim};

use crate::scalar::{self, Sc};

pub type OpResult<T> = Result<T, String>;

/// Largest array the interpreter will allocate (elements).
pub const MAX_ELEMENTS: usize = 1 << 31;

/// Validates dimensions (non-negative, bounded size) and builds a shape.
pub fn shape(ty: PrimitiveType, dims: Vec<i64>) -> OpResult<ArrayShape> {
    let mut count: usize = 1;
    for &d in &dims {
        if d < 0 {
            return Err(format!("negative dimension in {dims:?}"));
        }
        count = count.checked_mul(d as usize).filter(|&c| c <= MAX_ELEMENTS).ok_or("array too large")?;
    }
    Ok(ArrayShape::new(ty, dims))
}

fn udims(s: &ArrayShape) -> Vec<usize> {
    s.dims.iter().map(|&d| d.max(0) as usize).collect()
}

/// Calls `f(out_index, out_flat)` for every index of `dims` in row-major order.
pub fn for_each_index(dims: &[usize], mut f: impl FnMut(&[usize], usize)) {
    let count: usize = dims.iter().product();
    let mut idx = vec![0usize; dims.len()];
    for flat in 0..count {
        f(&idx, flat);
        for k in (0..dims.len()).rev() {
            idx[k] += 1;
            if idx[k] < dims[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

/// Builds an array of `out` by copying, for each output index, the source element
/// `src(index)` (a flat index into `a`), or leaving the fill bytes where it is `None`.
fn gather_by(a: &Array, out: ArrayShape, fill: Option<&[u8]>, mut src: impl FnMut(&[usize]) -> Option<usize>) -> Array {
    let es = a.shape.ty.byte_size();
    let mut data = vec![0u8; out.byte_size()];
    if let Some(f) = fill
        && f.len() == es
        && es > 0
    {
        for chunk in data.chunks_exact_mut(es) {
            chunk.copy_from_slice(f);
        }
    }
    let od = udims(&out);
    for_each_index(&od, |idx, flat| {
        if let Some(s) = src(idx) {
            data[flat * es..(flat + 1) * es].copy_from_slice(&a.data[s * es..(s + 1) * es]);
        }
    });
    Array { shape: out, data }
}

/// The window of `a` starting at `starts` with shape `out` (same type); positions outside
/// `a` read as zero bytes.
pub fn window(a: &Array, starts: &[i64], out: ArrayShape) -> Array {
    let dims = udims(&a.shape);
    let strides = a.shape.strides();
    gather_by(a, out, None, |idx| {
        let mut s = 0;
        for k in 0..idx.len() {
            let p = starts[k] + idx[k] as i64;
            if p < 0 || p as usize >= dims[k] {
                return None;
            }
            s += p as usize * strides[k];
        }
        Some(s)
    })
}

pub fn reshape(a: &Array, out: &ArrayShape) -> OpResult<Array> {
    if out.element_count() != a.element_count() || out.ty.byte_size() != a.shape.ty.byte_size() {
        return Err(format!("cannot reshape {} to {}", a.shape, out));
    }
    Ok(Array { shape: ArrayShape::new(out.ty, out.dims.clone()), data: a.data.clone() })
}

pub fn broadcast(a: &Array, out: &ArrayShape, dims: &[i64]) -> OpResult<Array> {
    if dims.len() != a.shape.rank() {
        return Err(format!("broadcast dimensions {dims:?} do not match operand rank {}", a.shape.rank()));
    }
    for (i, &d) in dims.iter().enumerate() {
        if d < 0 || d as usize >= out.rank() || out.dims[d as usize] != a.shape.dims[i] {
            return Err(format!("broadcast of {} to {} with dimensions {dims:?}", a.shape, out));
        }
    }
    let strides = a.shape.strides();
    let out = ArrayShape::new(a.shape.ty, out.dims.clone());
    Ok(gather_by(a, out, None, |idx| Some(dims.iter().enumerate().map(|(i, &d)| idx[d as usize] * strides[i]).sum())))
}

pub fn transpose(a: &Array, perm: &[i64]) -> OpResult<Array> {
    let rank = a.shape.rank();
    let mut seen = vec![false; rank];
    for &p in perm {
        if p < 0 || p as usize >= rank || std::mem::replace(&mut seen[p as usize], true) {
            return Err(format!("bad permutation {perm:?} for rank {rank}"));
        }
    }
    if perm.len() != rank {
        return Err(format!("bad permutation {perm:?} for rank {rank}"));
    }
    let strides = a.shape.strides();
    let out = ArrayShape::new(a.shape.ty, perm.iter().map(|&p| a.shape.dims[p as usize]).collect());
    Ok(gather_by(a, out, None, |idx| Some(perm.iter().enumerate().map(|(i, &p)| idx[i] * strides[p as usize]).sum())))
}

pub fn slice(a: &Array, sl: &[SliceDim]) -> OpResult<Array> {
    if sl.len() != a.shape.rank() {
        return Err(format!("slice has {} dimensions, operand rank {}", sl.len(), a.shape.rank()));
    }
    let mut dims = Vec::new();
    for (k, s) in sl.iter().enumerate() {
        if s.start < 0 || s.stride < 1 || s.limit < s.start || s.limit > a.shape.dims[k] {
            return Err(format!(
                "bad slice [{}:{}:{}] of dimension {k} (size {})",
                s.start, s.limit, s.stride, a.shape.dims[k]
            ));
        }
        dims.push((s.limit - s.start + s.stride - 1) / s.stride);
    }
    let strides = a.shape.strides();
    let out = ArrayShape::new(a.shape.ty, dims);
    Ok(gather_by(a, out, None, |idx| {
        Some(
            idx.iter().enumerate().map(|(k, &i)| (sl[k].start as usize + i * sl[k].stride as usize) * strides[k]).sum(),
        )
    }))
}

/// Clamps dynamic start indices into `[0, dim - size]` as XLA does.
pub fn clamp_starts(dims: &[i64], sizes: &[i64], starts: &[i64]) -> OpResult<Vec<i64>> {
    if starts.len() != dims.len() || sizes.len() != dims.len() {
        return Err(format!("{} start indices for rank {}", starts.len(), dims.len()));
    }
    let mut out = Vec::new();
    for k in 0..dims.len() {
        if sizes[k] < 0 || sizes[k] > dims[k] {
            return Err(format!("slice size {} exceeds dimension {k} of size {}", sizes[k], dims[k]));
        }
        out.push(starts[k].clamp(0, dims[k] - sizes[k]));
    }
    Ok(out)
}

pub fn dynamic_slice(a: &Array, starts: &[i64], sizes: &[i64]) -> OpResult<Array> {
    let s = clamp_starts(&a.shape.dims, sizes, starts)?;
    Ok(window(a, &s, ArrayShape::new(a.shape.ty, sizes.to_vec())))
}

pub fn dynamic_update_slice(a: &Array, upd: &Array, starts: &[i64]) -> OpResult<Array> {
    if upd.shape.ty != a.shape.ty {
        return Err(format!("update type {} differs from operand {}", upd.shape.ty, a.shape.ty));
    }
    let s = clamp_starts(&a.shape.dims, &upd.shape.dims, starts)?;
    let es = a.shape.ty.byte_size();
    let strides = a.shape.strides();
    let mut out = a.clone();
    for_each_index(&udims(&upd.shape), |idx, flat| {
        let dst: usize = idx.iter().enumerate().map(|(k, &i)| (s[k] as usize + i) * strides[k]).sum();
        out.data[dst * es..(dst + 1) * es].copy_from_slice(&upd.data[flat * es..(flat + 1) * es]);
    });
    Ok(out)
}

pub fn concatenate(parts: &[&Array], dim: i64) -> OpResult<Array> {
    let first = parts.first().ok_or("concatenate of nothing")?;
    let rank = first.shape.rank();
    if dim < 0 || dim as usize >= rank {
        return Err(format!("concatenate dimension {dim} out of range for rank {rank}"));
    }
    let d = dim as usize;
    let mut total = 0;
    for p in parts {
        let same = p.shape.ty == first.shape.ty
            && p.shape.rank() == rank
            && (0..rank).all(|k| k == d || p.shape.dims[k] == first.shape.dims[k]);
        if !same {
            return Err(format!("cannot concatenate {} with {} along {d}", first.shape, p.shape));
        }
        total += p.shape.dims[d];
    }
    let mut dims = first.shape.dims.clone();
    dims[d] = total;
    let out = shape(first.shape.ty, dims)?;
    // Row-major: the result is, for each index of the dimensions before `d`, the parts'
    // contiguous blocks one after another.
    let outer: usize = first.shape.dims[..d].iter().map(|&x| x as usize).product();
    let es = first.shape.ty.byte_size();
    let mut data = Vec::with_capacity(out.byte_size());
    for o in 0..outer {
        for p in parts {
            let block = p.shape.dims[d..].iter().map(|&x| x as usize).product::<usize>() * es;
            data.extend_from_slice(&p.data[o * block..(o + 1) * block]);
        }
    }
    Ok(Array { shape: out, data })
}

pub fn pad(a: &Array, value: &Array, cfg: &[PadDim]) -> OpResult<Array> {
    if cfg.len() != a.shape.rank() || value.shape.ty != a.shape.ty || value.element_count() != 1 {
        return Err(format!("bad pad of {} with {} and {} padding dims", a.shape, value.shape, cfg.len()));
    }
    let mut dims = Vec::new();
    for (k, p) in cfg.iter().enumerate() {
        let n = a.shape.dims[k];
        if p.interior < 0 {
            return Err("negative interior padding".into());
        }
        let inner = if n == 0 { 0 } else { n + (n - 1) * p.interior };
        let size = p.lo + inner + p.hi;
        if size < 0 {
            return Err(format!("padding makes dimension {k} negative"));
        }
        dims.push(size);
    }
    let out = shape(a.shape.ty, dims)?;
    let strides = a.shape.strides();
    let src_dims = udims(&a.shape);
    Ok(gather_by(a, out, Some(&value.data), |idx| {
        let mut s = 0;
        for k in 0..idx.len() {
            let rel = idx[k] as i64 - cfg[k].lo;
            let step = cfg[k].interior + 1;
            if rel < 0 || rel % step != 0 {
                return None;
            }
            let i = (rel / step) as usize;
            if i >= src_dims[k] {
                return None;
            }
            s += i * strides[k];
        }
        Some(s)
    }))
}

pub fn reverse(a: &Array, dims: &[i64]) -> OpResult<Array> {
    let rank = a.shape.rank();
    if dims.iter().any(|&d| d < 0 || d as usize >= rank) {
        return Err(format!("reverse dimensions {dims:?} out of range for rank {rank}"));
    }
    let strides = a.shape.strides();
    let ad = udims(&a.shape);
    Ok(gather_by(a, a.shape.clone(), None, |idx| {
        Some(
            (0..idx.len())
                .map(|k| {
                    let i = if dims.contains(&(k as i64)) { ad[k] - 1 - idx[k] } else { idx[k] };
                    i * strides[k]
                })
                .sum(),
        )
    }))
}

/// Reads every element as a scalar. `None` for a type Peerless does not compute with.
pub fn scalars(a: &Array) -> Option<Vec<Sc>> {
    let es = a.shape.ty.byte_size();
    if !a.shape.ty.is_computable() {
        return None;
    }
    a.data.chunks_exact(es).map(|b| Sc::read(a.shape.ty, b)).collect()
}

/// Builds an array from scalars (all of type `ty`).
pub fn from_scalars(ty: PrimitiveType, dims: Vec<i64>, vals: &[Sc]) -> OpResult<Array> {
    let shape = shape(ty, dims)?;
    let es = ty.byte_size();
    if vals.len() != shape.element_count() {
        return Err("internal: element count mismatch".into());
    }
    let mut data = vec![0u8; shape.byte_size()];
    for (i, v) in vals.iter().enumerate() {
        if v.ty() != ty {
            return Err(format!("internal: {} element in {ty} array", v.ty()));
        }
        v.write(&mut data[i * es..(i + 1) * es]);
    }
    Ok(Array { shape, data })
}

pub fn iota(out: &ArrayShape, dim: i64) -> OpResult<Array> {
    if dim < 0 || dim as usize >= out.rank() {
        return Err(format!("iota dimension {dim} out of range for {out}"));
    }
    let mut vals = Vec::with_capacity(out.element_count());
    let mut err = None;
    for_each_index(&udims(out), |idx, _| match scalar::convert(Sc::S64(idx[dim as usize] as i64), out.ty) {
        Some(v) => vals.push(v),
        None => err = Some(format!("iota of {}", out.ty)),
    });
    if let Some(e) = err {
        return Err(e);
    }
    from_scalars(out.ty, out.dims.clone(), &vals)
}

/// Accumulator types of `dot`.
enum Acc {
    F32(Vec<f32>, Vec<f32>),
    F64(Vec<f64>, Vec<f64>),
    I64(Vec<i64>, Vec<i64>),
}

impl Acc {
    /// `op`'s operands widened to its accumulation type: fp64 when any of the three types is
    /// fp64, else fp32 when any is a float, else wrapping i64 (pred is refused).
    fn of(op: &str, l: &Array, r: &Array, out_ty: PrimitiveType) -> OpResult<Acc> {
        let (ls, rs) = match (scalars(l), scalars(r)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(format!("{op} operand type is not computable")),
        };
        let types = [l.shape.ty, r.shape.ty, out_ty];
        Ok(if types.iter().any(|t| t.is_float()) {
            if types.contains(&PrimitiveType::F64) {
                Acc::F64(widen_f(&ls), widen_f(&rs))
            } else {
                let f = |v: &[Sc]| widen_f(v).into_iter().map(|x| x as f32).collect();
                Acc::F32(f(&ls), f(&rs))
            }
        } else if types[..2].contains(&PrimitiveType::Pred) {
            return Err(format!("{op} of pred"));
        } else {
            Acc::I64(widen_i(&ls), widen_i(&rs))
        })
    }
}

fn widen_f(v: &[Sc]) -> Vec<f64> {
    v.iter()
        .map(|&s| match scalar::convert(s, PrimitiveType::F64) {
            Some(Sc::F64(x)) => x,
            _ => 0.0,
        })
        .collect()
}

fn widen_i(v: &[Sc]) -> Vec<i64> {
    v.iter()
        .map(|&s| match s {
            Sc::U64(x) => x as i64,
            other => other.as_index().unwrap_or(0),
        })
        .collect()
}

/// `dot` with general dimension numbers. Floats accumulate in f32 (f64 when any side is
/// f64) and round once to the result type; integers accumulate with wrapping arithmetic.
pub fn dot(l: &Array, r: &Array, dd: &DotDims, out_ty: PrimitiveType) -> OpResult<Array> {
    let lr = l.shape.rank() as i64;
    let rr = r.shape.rank() as i64;
    let all_l: Vec<i64> = dd.lhs_batch.iter().chain(&dd.lhs_contracting).copied().collect();
    let all_r: Vec<i64> = dd.rhs_batch.iter().chain(&dd.rhs_contracting).copied().collect();
    if all_l.iter().any(|&d| d < 0 || d >= lr)
        || all_r.iter().any(|&d| d < 0 || d >= rr)
        || dd.lhs_batch.len() != dd.rhs_batch.len()
        || dd.lhs_contracting.len() != dd.rhs_contracting.len()
    {
        return Err("bad dot dimension numbers".into());
    }
    for (a, b) in all_l.iter().zip(&all_r) {
        if l.shape.dims[*a as usize] != r.shape.dims[*b as usize] {
            return Err(format!("dot dimension {a} of {} does not match dimension {b} of {}", l.shape, r.shape));
        }
    }
    let lfree: Vec<i64> = (0..lr).filter(|d| !all_l.contains(d)).collect();
    let rfree: Vec<i64> = (0..rr).filter(|d| !all_r.contains(d)).collect();
    let lperm: Vec<i64> = dd.lhs_batch.iter().chain(&lfree).chain(&dd.lhs_contracting).copied().collect();
    let rperm: Vec<i64> = dd.rhs_batch.iter().chain(&dd.rhs_contracting).chain(&rfree).copied().collect();
    if lperm.len() != lr as usize || rperm.len() != rr as usize {
        return Err("dot dimension repeated".into());
    }
    let lt = transpose(l, &lperm)?;
    let rt = transpose(r, &rperm)?;
    let prod = |s: &ArrayShape, ds: &[i64]| ds.iter().map(|&d| s.dims[d as usize] as usize).product::<usize>();
    let b = prod(&l.shape, &dd.lhs_batch);
    let m = prod(&l.shape, &lfree);
    let k = prod(&l.shape, &dd.lhs_contracting);
    let n = prod(&r.shape, &rfree);
    let mut dims: Vec<i64> = dd.lhs_batch.iter().map(|&d| l.shape.dims[d as usize]).collect();
    dims.extend(lfree.iter().map(|&d| l.shape.dims[d as usize]));
    dims.extend(rfree.iter().map(|&d| r.shape.dims[d as usize]));
    let out_shape = shape(out_ty, dims)?;
    let acc = Acc::of("dot", &lt, &rt, out_ty)?;
    let mut out = Vec::with_capacity(b * m * n);
    for bi in 0..b {
        for i in 0..m {
            for j in 0..n {
                let li = |kk: usize| (bi * m + i) * k + kk;
                let ri = |kk: usize| (bi * k + kk) * n + j;
                let v = match &acc {
                    Acc::F32(x, y) => Sc::F32((0..k).fold(0f32, |s, kk| s + x[li(kk)] * y[ri(kk)])),
                    Acc::F64(x, y) => Sc::F64((0..k).fold(0f64, |s, kk| s + x[li(kk)] * y[ri(kk)])),
                    Acc::I64(x, y) => {
                        Sc::S64((0..k).fold(0i64, |s, kk| s.wrapping_add(x[li(kk)].wrapping_mul(y[ri(kk)]))))
                    }
                };
                out.push(scalar::convert(v, out_ty).ok_or(format!("dot result type {out_ty}"))?);
            }
        }
    }
    from_scalars(out_ty, out_shape.dims, &out)
}

/// `convolution` (feature groups, padding, base and window dilation, strides; no batch
/// groups or reversed windows), accumulating as `dot` does: fp32 (fp64 when an operand is
/// fp64) for floats, wrapping i64 for integers, in input-feature then row-major window order.
pub fn convolution(l: &Array, r: &Array, cd: &hlo::ConvDims, w: &hlo::Window, out: &ArrayShape) -> OpResult<Array> {
    let ns = cd.input_spatial.len();
    let (ld, rd, od) = (&l.shape.dims, &r.shape.dims, &out.dims);
    if cd.kernel_spatial.len() != ns || cd.output_spatial.len() != ns || w.dims.len() != ns {
        return Err("convolution: dimension numbers and window disagree on the spatial rank".into());
    }
    if ld.len() != ns + 2 || rd.len() != ns + 2 || od.len() != ns + 2 {
        return Err("convolution: operand ranks do not match the dimension numbers".into());
    }
    if w.dims.iter().any(|d| d.reversal) {
        return Err("convolution with a reversed window is not supported".into());
    }
    if cd.batch_groups != 1 {
        return Err("convolution with batch_group_count > 1 is not supported".into());
    }
    let (c, o, g) = (ld[cd.input_feature], rd[cd.kernel_output], cd.feature_groups);
    if g < 1 || c % g != 0 || o % g != 0 || rd[cd.kernel_input] != c / g {
        return Err(format!("convolution: {c} input and {o} output features do not split into {g} groups"));
    }
    let spatial_in: Vec<i64> = cd.input_spatial.iter().map(|&d| ld[d]).collect();
    let spatial_out = w.output_dims(&spatial_in)?;
    let ok = od[cd.output_batch] == ld[cd.input_batch]
        && od[cd.output_feature] == o
        && cd.output_spatial.iter().zip(&spatial_out).all(|(&d, &n)| od[d] == n)
        && cd.kernel_spatial.iter().zip(&w.dims).all(|(&d, wd)| rd[d] == wd.size);
    if !ok {
        return Err(format!("convolution of {} and {} cannot give {out}", l.shape, r.shape));
    }
    let ot = out.ty;
    let acc = Acc::of("convolution", l, r, ot)?;
    let (lst, rst) = (l.shape.strides(), r.shape.strides());
    let (cg, og) = ((c / g) as usize, (o / g) as usize);
    let wsizes: Vec<usize> = w.dims.iter().map(|d| d.size as usize).collect();
    let odims: Vec<usize> = od.iter().map(|&x| x as usize).collect();
    let mut vals = Vec::with_capacity(out.element_count());
    let mut err = None;
    for_each_index(&odims, |oi, _| {
        let (b, f) = (oi[cd.output_batch], oi[cd.output_feature]);
        let group = f / og;
        let (mut af32, mut af64, mut ai64) = (0f32, 0f64, 0i64);
        for ci in 0..cg {
            let lbase = b * lst[cd.input_batch] + (group * cg + ci) * lst[cd.input_feature];
            let rbase = ci * rst[cd.kernel_input] + f * rst[cd.kernel_output];
            for_each_index(&wsizes, |kp, _| {
                let (mut li, mut ri) = (lbase, rbase);
                for (k, wd) in w.dims.iter().enumerate() {
                    // Position in the padded, base-dilated input; holes and padding read nothing.
                    let p = oi[cd.output_spatial[k]] as i64 * wd.stride + kp[k] as i64 * wd.window_dilation - wd.pad_lo;
                    if p < 0 || p % wd.base_dilation != 0 || p / wd.base_dilation >= spatial_in[k] {
                        return;
                    }
                    li += (p / wd.base_dilation) as usize * lst[cd.input_spatial[k]];
                    ri += kp[k] * rst[cd.kernel_spatial[k]];
                }
                match &acc {
                    Acc::F32(x, y) => af32 += x[li] * y[ri],
                    Acc::F64(x, y) => af64 += x[li] * y[ri],
                    Acc::I64(x, y) => ai64 = ai64.wrapping_add(x[li].wrapping_mul(y[ri])),
                }
            });
        }
        let v = match &acc {
            Acc::F32(..) => Sc::F32(af32),
            Acc::F64(..) => Sc::F64(af64),
            Acc::I64(..) => Sc::S64(ai64),
        };
        match scalar::convert(v, ot) {
            Some(v) => vals.push(v),
            None => err = Some(format!("convolution result type {ot}")),
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    from_scalars(ot, od.clone(), &vals)
}

/// Per operand dimension, the batch dimension (of the output for gather, of the updates for
/// scatter) whose coordinate is its start, for `batching[j]` paired with index dimension
/// `index_batching[j]`; `batch` / `index_dims` pair those dimensions with the indices'.
fn batching_dims(
    batching: &[usize],
    index_batching: &[usize],
    batch: &[usize],
    index_dims: &[usize],
    operand: &[i64],
    indices: &[i64],
    r: usize,
) -> OpResult<Vec<Option<usize>>> {
    if batching.len() != index_batching.len() {
        return Err("batching dimensions of the operand and the indices differ in number".into());
    }
    let mut of = vec![None; r];
    for (&d, &id) in batching.iter().zip(index_batching) {
        let k = index_dims.iter().position(|&x| x == id).ok_or("a batching dimension is the index-vector dimension")?;
        if operand[d] != indices[id] {
            return Err(format!(
                "batching dimension {d} has {} elements, the indices' {id} has {}",
                operand[d], indices[id]
            ));
        }
        of[d] = Some(batch[k]);
    }
    Ok(of)
}

/// Dimension numbers as indices, each below `n`.
fn as_dims(v: &[i64], n: usize) -> OpResult<Vec<usize>> {
    v.iter().map(|&d| usize::try_from(d).ok().filter(|&d| d < n).ok_or_else(|| format!("bad dimension {d}"))).collect()
}

/// Where `gather` reads: the dimension numbers checked against the shapes once, then, per
/// output index, the operand's flat index. Shared by the interpreter and (as plain data) by
/// backends that generate code for it.
#[derive(Clone, Debug)]
pub struct GatherPlan {
    /// Output dimensions that index the start indices (in order), and the start-index
    /// dimension each one is (the index-vector dimension skipped).
    pub batch: Vec<(usize, usize)>,
    /// Per operand dimension: `Some(out_dim)` when an output dimension offsets it.
    pub offset_of: Vec<Option<usize>>,
    /// Per operand dimension: `Some(out_dim)` for a batching dimension, whose start is that
    /// output (batch) coordinate (`take_along_axis` gathers this way).
    pub batch_of: Vec<Option<usize>>,
    /// Per entry of the index vector: the operand dimension it starts.
    pub start_index_map: Vec<usize>,
    /// The index-vector dimension of the start indices (== their rank: an implicit one).
    pub index_vector_dim: usize,
    /// Per operand dimension, the largest start (`dim - slice_size`): starts clamp to it.
    pub max_start: Vec<i64>,
}

impl GatherPlan {
    pub fn new(operand: &[i64], indices: &[i64], g: &hlo::GatherDims, out: &[i64]) -> OpResult<GatherPlan> {
        let r = operand.len();
        let ivd =
            usize::try_from(g.index_vector_dim).ok().filter(|&v| v <= indices.len()).ok_or("bad index_vector_dim")?;
        let nvec = if ivd == indices.len() { 1 } else { indices[ivd] as usize };
        let start_index_map = as_dims(&g.start_index_map, r)?;
        let collapsed = as_dims(&g.collapsed_slice_dims, r)?;
        let offset_dims = as_dims(&g.offset_dims, out.len())?;
        let batching = as_dims(&g.operand_batching_dims, r)?;
        let index_batching = as_dims(&g.start_indices_batching_dims, indices.len())?;
        if start_index_map.len() != nvec || g.slice_sizes.len() != r {
            return Err(format!("gather: {nvec} start indices per vector, start_index_map {:?}", g.start_index_map));
        }
        let batch_out: Vec<usize> = (0..out.len()).filter(|d| !offset_dims.contains(d)).collect();
        let batch_idx: Vec<usize> = (0..indices.len()).filter(|&k| k != ivd).collect();
        let offset_operand: Vec<usize> = (0..r).filter(|d| !collapsed.contains(d) && !batching.contains(d)).collect();
        if batch_out.len() != batch_idx.len() || offset_operand.len() != offset_dims.len() {
            return Err("gather dimension numbers do not match the shapes".into());
        }
        let batch_of = batching_dims(&batching, &index_batching, &batch_out, &batch_idx, operand, indices, r)?;
        let mut offset_of = vec![None; r];
        for (&od, &opd) in offset_dims.iter().zip(&offset_operand) {
            if out[od] > g.slice_sizes[opd] {
                return Err("gather output dimension larger than its slice".into());
            }
            offset_of[opd] = Some(od);
        }
        let mut max_start = Vec::with_capacity(r);
        for (d, (&size, &slice)) in operand.iter().zip(&g.slice_sizes).enumerate() {
            if slice < 0 || slice > size {
                return Err(format!("gather slice size {slice} for dimension {d} of size {size}"));
            }
            max_start.push(size - slice);
        }
        Ok(GatherPlan {
            batch: batch_out.into_iter().zip(batch_idx).collect(),
            offset_of,
            batch_of,
            start_index_map,
            index_vector_dim: ivd,
            max_start,
        })
    }
}

/// Where `scatter` writes: the dimension numbers checked against the shapes once, then, per
/// update element, the operand's flat index (or none: XLA skips an update whose window
/// does not fit inside the operand, rather than clamping as gather does).
#[derive(Clone, Debug)]
pub struct ScatterPlan {
    /// Update dimensions that index the scatter indices (in order), with the indices'
    /// dimension each one is (the index-vector dimension skipped).
    scatter: Vec<(usize, usize)>,
    /// Per operand dimension: `Some(update_dim)` when an update window dimension offsets it.
    window_of: Vec<Option<usize>>,
    /// Per operand dimension: `Some(update_dim)` for a batching dimension, whose start is
    /// that update (scatter) coordinate.
    batch_of: Vec<Option<usize>>,
    /// Per entry of the index vector: the operand dimension it starts.
    to_operand: Vec<usize>,
    index_vector_dim: usize,
    index_strides: Vec<usize>,
    /// Per operand dimension: the window's extent (1 for inserted dimensions).
    window: Vec<i64>,
    operand: Vec<i64>,
    operand_strides: Vec<usize>,
}

impl ScatterPlan {
    pub fn new(operand: &[i64], indices: &[i64], updates: &[i64], s: &hlo::ScatterDims) -> OpResult<ScatterPlan> {
        let (r, ir) = (operand.len(), indices.len());
        let ivd = usize::try_from(s.index_vector_dim).ok().filter(|&v| v <= ir).ok_or("bad index_vector_dim")?;
        let nvec = if ivd == ir { 1 } else { usize::try_from(indices[ivd]).map_err(|_| "bad indices shape")? };
        let to_operand = as_dims(&s.scatter_dims_to_operand_dims, r)?;
        let inserted = as_dims(&s.inserted_window_dims, r)?;
        let update_window = as_dims(&s.update_window_dims, updates.len())?;
        if to_operand.len() != nvec {
            return Err(format!("scatter: {nvec} indices per vector, scatter_dims_to_operand_dims {to_operand:?}"));
        }
        let batching = as_dims(&s.input_batching_dims, r)?;
        let index_batching = as_dims(&s.scatter_indices_batching_dims, ir)?;
        let window_operand: Vec<usize> = (0..r).filter(|d| !inserted.contains(d) && !batching.contains(d)).collect();
        let update_scatter: Vec<usize> = (0..updates.len()).filter(|d| !update_window.contains(d)).collect();
        let index_dims: Vec<usize> = (0..ir).filter(|&k| k != ivd).collect();
        if window_operand.len() != update_window.len() || update_scatter.len() != index_dims.len() {
            return Err("scatter dimension numbers do not match the shapes".into());
        }
        if update_scatter.iter().zip(&index_dims).any(|(&u, &i)| updates[u] != indices[i]) {
            return Err("scatter updates and indices disagree on the scatter dimensions".into());
        }
        let batch_of = batching_dims(&batching, &index_batching, &update_scatter, &index_dims, operand, indices, r)?;
        let mut window_of = vec![None; r];
        let mut window = vec![1i64; r];
        for (&ud, &od) in update_window.iter().zip(&window_operand) {
            if updates[ud] > operand[od] {
                return Err("scatter update window larger than the operand".into());
            }
            window_of[od] = Some(ud);
            window[od] = updates[ud];
        }
        let strides = |dims: &[i64]| {
            let mut st = vec![1usize; dims.len()];
            for k in (0..dims.len().saturating_sub(1)).rev() {
                st[k] = st[k + 1] * dims[k + 1] as usize;
            }
            st
        };
        Ok(ScatterPlan {
            scatter: update_scatter.into_iter().zip(index_dims).collect(),
            window_of,
            batch_of,
            to_operand,
            index_vector_dim: ivd,
            index_strides: strides(indices),
            window,
            operand: operand.to_vec(),
            operand_strides: strides(operand),
        })
    }

    /// The operand's flat index that update element `u` combines into, or `None` when its
    /// window is out of bounds. `starts` are the scatter indices' values as i64.
    pub fn target(&self, u: &[usize], starts: &[i64]) -> Option<usize> {
        let ist = &self.index_strides;
        let base: usize = self.scatter.iter().map(|&(ud, id)| u[ud] * ist[id]).sum();
        let mut flat = 0usize;
        for (d, &size) in self.operand.iter().enumerate() {
            let start = match self.to_operand.iter().position(|&m| m == d) {
                _ if self.batch_of[d].is_some() => self.batch_of[d].map_or(0, |ud| u[ud] as i64),
                Some(_) if self.index_vector_dim == ist.len() => starts[base],
                Some(k) => starts[base + k * ist[self.index_vector_dim]],
                None => 0,
            };
            if start < 0 || start > size - self.window[d] {
                return None;
            }
            flat += (start as usize + self.window_of[d].map_or(0, |ud| u[ud])) * self.operand_strides[d];
        }
        Some(flat)
    }
}

/// The reads of `reduce-window` over an input of dimensions `input`: calls `f(out, src)` for
/// every output element (flat index `out`, row-major) and, within it, for every input element
/// its window covers (flat index `src`), in row-major window order. Window positions in the
/// padding or in a hole of the base dilation read nothing: XLA's CPU backend and its evaluator
/// skip them rather than fold in the init value, so the init value counts once, as the
/// accumulator's start, whatever the reducer. `out` must be `w.output_dims(input)`.
pub fn window_reads(input: &[i64], w: &hlo::Window, out: &[i64], mut f: impl FnMut(usize, usize)) -> OpResult<()> {
    let want = w.output_dims(input)?;
    if want != out {
        return Err(format!("a window over {input:?} gives dimensions {want:?}, not {out:?}"));
    }
    let sizes: Vec<usize> = w.dims.iter().map(|d| d.size as usize).collect();
    // The window's positions are visited for every output element: bound them as an array.
    sizes.iter().try_fold(1usize, |n, &s| n.checked_mul(s).filter(|&n| n <= MAX_ELEMENTS)).ok_or("window too large")?;
    let mut strides = vec![1usize; input.len()];
    for k in (0..input.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * input[k + 1] as usize;
    }
    let out: Vec<usize> = out.iter().map(|&d| d as usize).collect();
    for_each_index(&out, |o, flat| {
        for_each_index(&sizes, |win, _| {
            let mut src = 0;
            for (k, d) in w.dims.iter().enumerate() {
                // Position in the padded, dilated input, relative to the first input element
                // (i128: no product of a bounded index and an i64 attribute overflows).
                let p = o[k] as i128 * d.stride as i128 + win[k] as i128 * d.window_dilation as i128 - d.pad_lo as i128;
                let dil = d.base_dilation as i128;
                if p < 0 || p % dil != 0 || p / dil >= input[k] as i128 {
                    return;
                }
                src += (p / dil) as usize * strides[k];
            }
            f(flat, src);
        });
    });
    Ok(())
}

/// `gather`: `starts` are the start indices' values as i64 (unsigned above i64::MAX saturate).
pub fn gather(
    a: &Array,
    idx_shape: &ArrayShape,
    starts: &[i64],
    g: &hlo::GatherDims,
    out: &ArrayShape,
) -> OpResult<Array> {
    let p = GatherPlan::new(&a.shape.dims, &idx_shape.dims, g, &out.dims)?;
    let ist = idx_shape.strides();
    let ast = a.shape.strides();
    let irank = idx_shape.rank();
    Ok(gather_by(a, ArrayShape::new(a.shape.ty, out.dims.clone()), None, |o| {
        let mut base = 0usize;
        for &(od, id) in &p.batch {
            base += o[od] * ist[id];
        }
        let mut s = 0usize;
        for (d, &od) in p.offset_of.iter().enumerate() {
            let start = match p.start_index_map.iter().position(|&m| m == d) {
                _ if p.batch_of[d].is_some() => p.batch_of[d].map_or(0, |bd| o[bd]),
                Some(k) => {
                    let at = if p.index_vector_dim == irank { base } else { base + k * ist[p.index_vector_dim] };
                    starts[at].clamp(0, p.max_start[d]) as usize
                }
                None => 0,
            };
            s += (start + od.map_or(0, |od| o[od])) * ast[d];
        }
        Some(s)
    }))
}
