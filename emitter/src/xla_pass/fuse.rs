//! The all-reduce epilogue the pass fuses: a sum all-reduce followed by the residual add and RMSNorm of a
//! tensor-parallel transformer layer,
//!
//! ```text
//! h = x + psum(a);  hf = f32(h);  y = T(hf * rsqrt(mean(hf * hf, -1) + eps) [* gamma])
//! ```
//!
//! matched exactly on the module XLA hands the pass (at PRE_SCHEDULER XLA:CPU has already fused it into loop fusions,
//! promoted bf16 arithmetic to f32 and split the row sum into a reduce-window and a reduce; the matcher reads through
//! fusions to the operations they compute). Anything else stays as it was: a value the chain computes that anything
//! outside it reads, another constant, another dimension, another order of operations.

use hlo::analysis::{ReductionKind, recognize_reduction};
use hlo::ir::Window;
use hlo::literal::Literal;
use hlo::{CompId, InstrId, Module, Opcode, PrimitiveType, Shape};
use thunks::custom_call::{Epilogue, Mean, RoundTo};

/// A matched chain: what the call takes and what it replaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Fused {
    pub residual: InstrId,
    pub gamma: Option<InstrId>,
    /// The instruction whose value is `h` (becomes element 0 of the call).
    pub h: InstrId,
    /// The instruction whose value is `y` (becomes element 1).
    pub y: InstrId,
    /// Whether y is cast from f32 (to bf16 / f16) at the end.
    pub cast: bool,
    /// Instructions only the chain reads, removed.
    pub dead: Vec<InstrId>,
    pub epilogue: Epilogue,
}

impl Fused {
    /// What the decision says was fused.
    pub fn describe(&self, m: &Module) -> String {
        format!(
            "fused: residual add + rmsnorm{}{} (h = {}, y = {})",
            if self.epilogue.gamma { " * gamma" } else { "" },
            if self.cast { " + convert" } else { "" },
            m.instr(self.h).name,
            m.instr(self.y).name
        )
    }
}

/// A value: an instruction, reached through the fusions in `path` (outermost first).
#[derive(Clone, Debug, PartialEq, Eq)]
struct V {
    path: Vec<InstrId>,
    id: InstrId,
}

struct Matcher<'m> {
    m: &'m Module,
    comp: CompId,
    /// Instructions of `comp` the match read (fusions entered, values used).
    touched: std::cell::RefCell<Vec<InstrId>>,
}

impl<'m> Matcher<'m> {
    fn ins(&self, v: &V) -> &'m hlo::ir::Instruction {
        self.m.instr(v.id)
    }

    /// Records that the match read instruction `id` of `comp`.
    fn touch(&self, id: InstrId) {
        let mut t = self.touched.borrow_mut();
        if !t.contains(&id) {
            t.push(id);
        }
    }

    /// `v` resolved: a fusion becomes its root (inside it), a fusion's parameter the fusion's operand (outside it).
    fn enter(&self, mut v: V) -> Option<V> {
        for _ in 0..64 {
            let ins = self.m.instr(v.id);
            if v.path.is_empty() {
                self.touch(v.id);
            }
            match ins.opcode {
                Opcode::Fusion => {
                    let &[called] = &ins.called[..] else { return None };
                    let root = self.m.comp(called).root;
                    if !matches!(self.m.instr(root).shape, Shape::Array(_)) {
                        return None;
                    }
                    v.path.push(v.id);
                    v.id = root;
                }
                Opcode::Parameter if !v.path.is_empty() => {
                    let fusion = v.path.pop()?;
                    let k = usize::try_from(ins.attrs.parameter_number?).ok()?;
                    v.id = *self.m.instr(fusion).operands.get(k)?;
                }
                _ => return Some(v),
            }
        }
        None
    }

    fn operand(&self, v: &V, k: usize) -> Option<V> {
        let id = *self.ins(v).operands.get(k)?;
        self.enter(V { path: v.path.clone(), id })
    }

    fn array(&self, v: &V) -> Option<&'m hlo::ArrayShape> {
        self.ins(v).shape.as_array()
    }

    fn ty(&self, v: &V) -> Option<PrimitiveType> {
        self.array(v).map(|s| s.ty)
    }

    fn is(&self, v: &V, op: Opcode) -> bool {
        self.ins(v).opcode == op
    }

    /// The two operands of a binary `op` at `v`, both orders (commutative ops).
    fn both(&self, v: &V, op: Opcode) -> Option<[(V, V); 2]> {
        if !self.is(v, op) || self.ins(v).operands.len() != 2 {
            return None;
        }
        let (a, b) = (self.operand(v, 0)?, self.operand(v, 1)?);
        Some([(a.clone(), b.clone()), (b, a)])
    }

    /// The f32 a scalar constant, or a broadcast of one, holds.
    fn scalar_f32(&self, v: &V) -> Option<f32> {
        let c = if self.is(v, Opcode::Broadcast) {
            if !self.ins(v).attrs.dimensions.as_ref().is_none_or(Vec::is_empty) {
                return None;
            }
            self.operand(v, 0)?
        } else {
            v.clone()
        };
        if !self.is(&c, Opcode::Constant) {
            return None;
        }
        let Some(Literal::Array(a)) = &self.ins(&c).attrs.literal else { return None };
        if a.dims().iter().product::<i64>() != 1 || a.ty() != PrimitiveType::F32 {
            return None;
        }
        a.to_vec::<f32>()?.first().copied()
    }

    /// Whether `v` is a broadcast of `inner` along the leading dimensions (a row's value to every element of the row)
    /// into `dims`.
    fn row_broadcast(&self, v: &V, dims: &[i64]) -> Option<V> {
        if !self.is(v, Opcode::Broadcast) || self.array(v)?.dims != dims {
            return None;
        }
        let want: Vec<i64> = (0..dims.len() as i64 - 1).collect();
        (self.ins(v).attrs.dimensions.as_deref() == Some(&want[..])).then(|| self.operand(v, 0))?
    }

    /// The f32 row sum over the last dimension of `dims` at `v`: what it sums. XLA:CPU's split form (a reduce-window in
    /// chunks along the row, then a reduce) is the same sum.
    fn row_sum(&self, v: &V, dims: &[i64]) -> Option<V> {
        let rank = dims.len();
        let sum_over_last = |v: &V| -> Option<V> {
            let ins = self.ins(v);
            let input = self.operand(v, 0)?;
            let ok = ins.opcode == Opcode::Reduce
                && ins.operands.len() == 2
                && self.scalar_f32(&self.operand(v, 1)?) == Some(0.0)
                && ins.attrs.dimensions.as_deref() == Some(&[rank as i64 - 1][..])
                && recognize_reduction(self.m, *ins.called.first()?) == Some(ReductionKind::Sum)
                && self.ty(v) == Some(PrimitiveType::F32)
                && self.array(v)?.dims[..] == dims[..rank - 1];
            ok.then_some(input)
        };
        let input = sum_over_last(v)?;
        if self.array(&input)?.dims == dims {
            return Some(input);
        }
        // reduce(reduce-window(x, 0, size=1x..xk stride=1x..xk), 0, dims={last})
        let ins = self.ins(&input);
        if ins.opcode != Opcode::ReduceWindow
            || ins.operands.len() != 2
            || self.scalar_f32(&self.operand(&input, 1)?) != Some(0.0)
            || recognize_reduction(self.m, *ins.called.first()?) != Some(ReductionKind::Sum)
        {
            return None;
        }
        let w = Window::of(&ins.attrs).ok()?;
        let inner = self.operand(&input, 0)?;
        if self.array(&inner)?.dims != dims || w.dims.len() != rank {
            return None;
        }
        let d = dims[rank - 1];
        for (k, wd) in w.dims.iter().enumerate() {
            let last = k == rank - 1;
            let (size, stride) = (wd.size, wd.stride);
            let plain = wd.pad_lo == 0 && wd.pad_hi == 0 && wd.base_dilation == 1 && wd.window_dilation == 1;
            if !plain
                || (!last && (size != 1 || stride != 1))
                || (last && (size != stride || size < 1 || d % size != 0))
            {
                return None;
            }
        }
        Some(inner)
    }

    /// The instruction of `comp` whose value `v` is (itself, or a fusion whose root it is).
    fn top(&self, v: &V) -> Option<InstrId> {
        match &v.path[..] {
            [] => Some(v.id),
            [f] => (self.m.comp(*self.m.instr(*f).called.first()?).root == v.id).then_some(*f),
            _ => None,
        }
    }
}

/// The residual add at `hc` (the sum of the all-reduce `ar` and a residual, in f32 or in the element type `t`): the
/// residual's instruction and how the all-reduce's result is rounded.
fn residual_add(mx: &Matcher<'_>, hc: &V, ar: InstrId, t: PrimitiveType) -> Option<(InstrId, Option<RoundTo>)> {
    let ar_ty = mx.m.instr(ar).shape.as_array()?.ty;
    // The all-reduce's side: the result itself (same type as the add), or in an f32 add its result converted to f32,
    // possibly through the element type (XLA:CPU sums bf16 in f32 and rounds once).
    let is_ar = |v: &V| v.path.is_empty() && v.id == ar;
    let ar_side = |p: &V| -> Option<Option<RoundTo>> {
        if is_ar(p) {
            return (mx.ty(hc) == Some(ar_ty)).then_some(None);
        }
        if mx.ty(hc) != Some(PrimitiveType::F32) || !mx.is(p, Opcode::Convert) {
            return None;
        }
        let inner = mx.operand(p, 0)?;
        if is_ar(&inner) {
            return (ar_ty == t).then_some(None);
        }
        if mx.is(&inner, Opcode::Convert) && mx.ty(&inner) == Some(t) && ar_ty == PrimitiveType::F32 {
            let r = mx.operand(&inner, 0)?;
            return if is_ar(&r) { RoundTo::of(t).map(Some) } else { None };
        }
        None
    };
    for (p, q) in mx.both(hc, Opcode::Add)? {
        let round = ar_side(&p);
        let Some(round) = round else { continue };
        // The residual's side: an instruction of the computation of type `t`, converted to the add's type where they
        // differ.
        let x = if mx.ty(&q) == Some(t) {
            q
        } else if mx.is(&q, Opcode::Convert) {
            let x = mx.operand(&q, 0)?;
            if mx.ty(&x) != Some(t) {
                continue;
            }
            x
        } else {
            continue;
        };
        // The residual is a top-level value: an instruction, or the root of a fusion (the previous layer's sum, which
        // XLA:CPU wraps), which the matcher reads through.
        if let Some(top) = mx.top(&x).filter(|_| mx.array(&x).map(|a| &a.dims) == mx.array(hc).map(|a| &a.dims)) {
            return Some((top, round));
        }
    }
    None
}

/// Matches the chain after all-reduce `ar` (a sum, in computation `comp`), starting from every instruction of `comp`
/// that could be its `y`, last first. Returns the match, or `None`.
pub(super) fn match_rmsnorm(m: &Module, comp: CompId, ar: InstrId) -> Option<Fused> {
    let dims = m.instr(ar).shape.as_array()?.dims.clone();
    if dims.is_empty() || dims.iter().any(|&d| d < 1) {
        return None;
    }
    // Latest first: where the chain goes on (n * gamma, then the cast), the longest match wins over its prefix (n alone
    // in f32), which would leave the rest to XLA.
    let instrs = &m.comp(comp).instrs;
    for &y in instrs.iter().rev() {
        let mx = Matcher { m, comp, touched: Default::default() };
        if let Some(f) = try_y(&mx, y, ar, &dims) {
            return Some(f);
        }
    }
    None
}

fn try_y(mx: &Matcher<'_>, y: InstrId, ar: InstrId, dims: &[i64]) -> Option<Fused> {
    let yv = mx.enter(V { path: vec![], id: y })?;
    let y_ty = mx.ty(&yv)?;
    if !matches!(y_ty, PrimitiveType::Bf16 | PrimitiveType::F16 | PrimitiveType::F32) || mx.array(&yv)?.dims != dims {
        return None;
    }
    // y = T(prod), or prod itself in f32.
    let prod = if mx.is(&yv, Opcode::Convert) && y_ty != PrimitiveType::F32 {
        mx.operand(&yv, 0)?
    } else if y_ty == PrimitiveType::F32 {
        yv.clone()
    } else {
        return None;
    };
    if mx.ty(&prod) != Some(PrimitiveType::F32) || !mx.is(&prod, Opcode::Multiply) {
        return None;
    }
    // prod = n * gamma (gamma broadcast along the row), or n alone.
    let mut candidates: Vec<(V, Option<V>)> = Vec::new();
    for (n, g) in mx.both(&prod, Opcode::Multiply)? {
        if let Some(g) = gamma_of(mx, &g, dims) {
            candidates.push((n, Some(g)));
        }
    }
    candidates.push((prod.clone(), None));
    for (n, gamma) in candidates {
        let Some(pairs) = mx.both(&n, Opcode::Multiply) else { continue };
        for (hf, rb) in pairs {
            let Some(r) = mx.row_broadcast(&rb, dims) else { continue };
            if let Some(f) = try_norm(mx, y, &hf, &r, gamma.as_ref(), ar, dims) {
                return Some(Fused { cast: y_ty != PrimitiveType::F32, ..f });
            }
        }
    }
    None
}

/// A constant, or a broadcast / reshape / convert of one: a value of the program's text.
fn constant_like(m: &Module, i: InstrId) -> bool {
    let ins = m.instr(i);
    match ins.opcode {
        Opcode::Constant => true,
        Opcode::Broadcast | Opcode::Reshape | Opcode::Convert => {
            ins.operands.len() == 1 && constant_like(m, ins.operands[0])
        }
        _ => false,
    }
}

/// gamma: broadcast of a `[d]` f32 value along the last dimension (converted from its type).
fn gamma_of(mx: &Matcher<'_>, v: &V, dims: &[i64]) -> Option<V> {
    if !mx.is(v, Opcode::Broadcast) || mx.array(v)?.dims != dims {
        return None;
    }
    let last = dims.len() as i64 - 1;
    if mx.ins(v).attrs.dimensions.as_deref() != Some(&[last][..]) {
        return None;
    }
    let mut g = mx.operand(v, 0)?;
    if mx.is(&g, Opcode::Convert) {
        g = mx.operand(&g, 0)?;
        if !matches!(mx.ty(&g)?, PrimitiveType::Bf16 | PrimitiveType::F16) {
            return None;
        }
    } else if mx.ty(&g) != Some(PrimitiveType::F32) {
        return None;
    }
    (g.path.is_empty() && mx.array(&g)?.dims == [dims[dims.len() - 1]]).then_some(g)
}

#[allow(clippy::too_many_arguments)]
fn try_norm(
    mx: &Matcher<'_>,
    y: InstrId,
    hf: &V,
    r: &V,
    gamma: Option<&V>,
    ar: InstrId,
    dims: &[i64],
) -> Option<Fused> {
    let m = mx.m;
    if mx.ty(hf) != Some(PrimitiveType::F32) || mx.array(hf)?.dims != dims || !mx.is(r, Opcode::Rsqrt) {
        return None;
    }
    // r = rsqrt(ms + eps)
    let sum = mx.operand(r, 0)?;
    let (ms, eps) = mx.both(&sum, Opcode::Add)?.into_iter().find_map(|(a, b)| Some((a, mx.scalar_f32(&b)?)))?;
    // ms = S * (1/d) or S / d
    let d = dims[dims.len() - 1];
    let mean_of = |ms: &V| -> Option<(V, Mean)> {
        if mx.is(ms, Opcode::Divide) {
            let c = mx.scalar_f32(&mx.operand(ms, 1)?)?;
            return (c == d as f32).then(|| Some((mx.operand(ms, 0)?, Mean::Divide(c.to_bits()))))?;
        }
        let inv = [(1.0f32 / d as f32).to_bits(), ((1.0f64 / d as f64) as f32).to_bits()];
        mx.both(ms, Opcode::Multiply)?.into_iter().find_map(|(s, c)| {
            let c = mx.scalar_f32(&c)?;
            inv.contains(&c.to_bits()).then_some((s, Mean::Multiply(c.to_bits())))
        })
    };
    let (s, mean) = mean_of(&ms)?;
    let sq = mx.row_sum(&s, dims)?;
    let (a, b) = (mx.operand(&sq, 0)?, mx.operand(&sq, 1)?);
    if !mx.is(&sq, Opcode::Multiply) || a != *hf || b != *hf {
        return None;
    }
    // hf = f32(h) (h in the element type), or the f32 sum itself (XLA with excess precision reads the unrounded sum;
    // then h is another instruction converting it).
    let (h_instr, hc, t, of_rounded) = if mx.is(hf, Opcode::Convert) {
        let h = mx.operand(hf, 0)?;
        let t = mx.ty(&h)?;
        RoundTo::of(t)?;
        (mx.top(&h)?, h, t, true)
    } else if mx.is(hf, Opcode::Add) {
        let ar_ty = m.instr(ar).shape.as_array()?.ty;
        if ar_ty == PrimitiveType::F32 && residual_add(mx, hf, ar, PrimitiveType::F32).is_some() {
            // All f32: h is the add.
            (mx.top(hf)?, hf.clone(), PrimitiveType::F32, true)
        } else {
            // Find the instruction converting the sum to the element type.
            let comp = mx.comp;
            let found = m.comp(comp).instrs.iter().find_map(|&i| {
                let probe = Matcher { m, comp, touched: Default::default() };
                let v = probe.enter(V { path: vec![], id: i })?;
                if !probe.is(&v, Opcode::Convert) || probe.top(&v) != Some(i) {
                    return None;
                }
                let t = probe.ty(&v)?;
                RoundTo::of(t)?;
                (probe.operand(&v, 0)? == *hf).then_some((i, t, probe.touched.into_inner()))
            });
            let (h_instr, t, seen) = found?;
            seen.into_iter().for_each(|i| mx.touch(i));
            (h_instr, hf.clone(), t, false)
        }
    } else {
        return None;
    };
    let add = if of_rounded && t != PrimitiveType::F32 {
        // h = T(sum in f32), or the add in T itself.
        if mx.is(&hc, Opcode::Convert) { mx.operand(&hc, 0)? } else { hc.clone() }
    } else {
        hc.clone()
    };
    let (x, round_ar) = residual_add(mx, &add, ar, t)?;
    if m.instr(h_instr).shape.as_array().map(|s| s.ty) != Some(t) {
        return None;
    }
    let gamma_id = gamma.map(|g| g.id);
    // Every instruction the chain read that is not an input or an output: only the chain may read it (else the program
    // needs a value the call does not give).
    let touched = mx.touched.borrow().clone();
    let inputs = [Some(x), gamma_id, Some(ar)];
    let outputs = [h_instr, y];
    let chain: Vec<InstrId> = touched.iter().copied().filter(|i| !inputs.contains(&Some(*i))).collect();
    let comp = m.comp(mx.comp);
    let mut dead = Vec::new();
    for &i in &chain {
        let ins = m.instr(i);
        if !ins.attrs.control_predecessors.is_empty() {
            return None;
        }
        if outputs.contains(&i) {
            continue;
        }
        let users: Vec<InstrId> = comp.instrs.iter().copied().filter(|u| m.instr(*u).operands.contains(&i)).collect();
        let external = users.iter().any(|u| !chain.contains(u)) || comp.root == i;
        if constant_like(m, i) {
            // XLA shares a constant's broadcast among every layer's norm (CSE), so others may read it: it stays, and
            // XLA's dead-code pass removes it if nothing does.
            continue;
        }
        if external {
            log::info!(
                "peerless pass: not fusing after '{}': '{}' has users outside the chain",
                m.instr(ar).name,
                ins.name
            );
            return None;
        }
        dead.push(i);
    }
    // The all-reduce's result: only the chain reads it.
    if comp.instrs.iter().any(|&u| m.instr(u).operands.contains(&ar) && !chain.contains(&u)) || comp.root == ar {
        log::info!("peerless pass: not fusing after '{}': its result has users outside the chain", m.instr(ar).name);
        return None;
    }
    // Layouts: every array involved row-major (the handlers read rows along the last dimension).
    let row_major = |i: InstrId| {
        m.instr(i).shape.as_array().is_some_and(|s| {
            s.layout.as_ref().is_none_or(|l| l.is_empty() || l.iter().rev().copied().eq(0..s.dims.len() as i64))
        })
    };
    if ![ar, x, h_instr, y].into_iter().chain(gamma_id).all(row_major) {
        return None;
    }
    Some(Fused {
        residual: x,
        gamma: gamma_id,
        h: h_instr,
        y,
        cast: false,
        dead,
        epilogue: Epilogue { round_ar, norm_of_rounded: of_rounded, mean, eps: eps.to_bits(), gamma: gamma.is_some() },
    })
}
