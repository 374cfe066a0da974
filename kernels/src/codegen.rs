//! Device code for non-collective instructions: one generated kernel per compute thunk,
//! all of a module's kernels in one CUDA/HIP translation unit (compiled once per
//! executable and architecture, and cached on disk by the device layer).
//!
//! Each kernel is specialised to its thunk: shapes, strides and arena offsets are
//! constants (the arena is symmetric, so one source serves every device), and the only
//! arguments are the device's arena base and its device index. A kernel computes one
//! output element per loop iteration of a grid-stride loop; the scalar semantics live in
//! `kernels/cuda/codegen.h` and follow the reference interpreter (`interp::scalar`):
//! integers wrap, 16-bit floats are computed in fp32 and rounded after every op,
//! reductions combine in the interpreter's order, so results match it bit for bit except
//! for transcendental functions (the device's math library, within a few ulps).
//!
//! What is not generated stays on the host (the executor evaluates it with the
//! interpreter between device steps); [`GenPlan::host`] says which thunks and why:
//! tuple-shaped values, operands the partitioner cuts per device, types the device does
//! not compute (S4/U4, F8, complex), reducers other than one binary op, and ops without a
//! generator (sort, gather, scatter, custom calls, …). Constants are uploaded once and
//! copied in by the device; reshapes, bitcasts and bitcast-converts are device copies.

use std::fmt::Write as _;

use hlo::{ArrayShape, ComparisonDirection, InstrId, Literal, Opcode, PrimitiveType as T, Shape};
use thunks::{Region, Thunk};

use crate::exec::Lowered;

/// Threads per block of every generated kernel.
pub const GEN_THREADS: u32 = 256;
/// Most blocks a generated kernel is launched with (the loop strides over the rest).
pub const GEN_MAX_BLOCKS: u64 = 4096;

/// The header every generated unit includes (scalar semantics), with its name.
pub const GEN_HEADER: (&str, &str) = ("codegen.h", include_str!("../cuda/codegen.h"));
/// The element-type header `codegen.h` includes (shared with the collective kernels).
pub const TYPES_HEADER: (&str, &str) = ("peerless_types.h", include_str!("../cuda/peerless_types.h"));

/// What a compute thunk becomes on the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenStep {
    /// Launch kernel `name` of the unit over `elements` output elements.
    Kernel { name: String, elements: u64 },
    /// Copy `bytes` (uploaded once per executable) into the arena at `dst`.
    Constant { bytes: Vec<u8>, dst: usize },
    /// A device copy within the arena.
    Copy { src: usize, dst: usize, len: usize },
    /// Nothing to do (an empty result).
    Nothing,
}

impl GenStep {
    /// Blocks to launch a kernel over `elements` with [`GEN_THREADS`] threads each.
    pub fn blocks(elements: u64) -> u32 {
        elements.div_ceil(GEN_THREADS as u64).clamp(1, GEN_MAX_BLOCKS) as u32
    }
}

/// Device code for every compute thunk of a module's programs.
#[derive(Clone, Debug, Default)]
pub struct GenPlan {
    /// The translation unit (includes `codegen.h`); empty when no kernel was generated.
    pub source: String,
    /// Per thunk index: what it becomes on the device (`None`: not a compute thunk, or
    /// evaluated on the host).
    pub steps: Vec<Option<GenStep>>,
    /// Compute thunks left to the host: (thunk index, instruction name, why).
    pub host: Vec<(usize, String, String)>,
}

impl GenPlan {
    /// Number of generated kernels.
    pub fn kernels(&self) -> usize {
        self.steps.iter().filter(|s| matches!(s, Some(GenStep::Kernel { .. }))).count()
    }
}

/// Generates device code for `module` on `num_devices` devices (regions as the host
/// backend lays them out): what tests and CI's NVRTC check compile.
pub fn generate(
    module: &hlo::Module,
    num_devices: usize,
    mode: emitter::DeviceMode,
    flags: &emitter::Flags,
) -> Result<GenPlan, crate::exec::ExecError> {
    let table = emitter::PeerAccessTable::for_host_topology(num_devices, &flags.host_topology);
    let low = crate::exec::lower(module, num_devices, mode, flags, &table, &crate::exec::HostSizer)?;
    Ok(plan(&low))
}

/// Generates device code for every compute thunk of `low`'s programs.
pub(crate) fn plan(low: &Lowered) -> GenPlan {
    let mut out = GenPlan::default();
    let mut body = String::new();
    let Some(first) = low.programs.first() else { return out };
    for (k, thunk) in first.thunks.iter().enumerate() {
        let Thunk::Compute { instr, name, inputs, outputs } = thunk else {
            out.steps.push(None);
            continue;
        };
        // The arena is symmetric, so every device's program has the same regions; a
        // program that differs (never, today) stays on the host rather than guess.
        let same = low.programs.iter().all(|p| p.thunks.get(k) == Some(thunk));
        let g = Gen { low, k, instr: *instr, inputs, outputs };
        let result = if same { g.generate() } else { Err("device programs differ".into()) };
        match result {
            Ok((step, code)) => {
                body.push_str(&code);
                out.steps.push(Some(step));
            }
            Err(why) => {
                log::debug!("compute '{name}' stays on the host: {why}");
                out.host.push((k, name.clone(), why));
                out.steps.push(None);
            }
        }
    }
    if !body.is_empty() {
        out.source = format!(
            "// Generated by Peerless for module '{}' (kernels/src/codegen.rs).\n#include \"codegen.h\"\n{body}",
            low.module.name.replace(['\n', '\r'], " ")
        );
    }
    out
}

type R<T> = Result<T, String>;

/// C names of an element type: storage, compute, load and store wrappers.
#[derive(Clone, Copy)]
struct Ty {
    ty: T,
}

impl Ty {
    fn of(ty: T) -> R<Ty> {
        match ty {
            T::Pred
            | T::S8
            | T::S16
            | T::S32
            | T::S64
            | T::U8
            | T::U16
            | T::U32
            | T::U64
            | T::F16
            | T::Bf16
            | T::F32
            | T::F64 => Ok(Ty { ty }),
            other => Err(format!("element type {other} is not computed on the device")),
        }
    }
    /// A type moved as raw stored elements of its byte size (never computed with).
    fn raw(ty: T) -> R<Ty> {
        match Ty::of(ty) {
            Ok(t) => Ok(t),
            Err(e) => match ty.byte_size() {
                1 => Ok(Ty { ty: T::U8 }),
                2 => Ok(Ty { ty: T::U16 }),
                4 => Ok(Ty { ty: T::U32 }),
                8 => Ok(Ty { ty: T::U64 }),
                _ => Err(e),
            },
        }
    }

    /// Storage type in memory.
    fn store_t(self) -> &'static str {
        match self.ty {
            T::Pred | T::U8 => "u8",
            T::S8 => "s8",
            T::S16 => "s16",
            T::S32 => "s32",
            T::S64 => "s64",
            T::U16 => "u16",
            T::U32 => "u32",
            T::U64 => "u64",
            T::F16 => "f16",
            T::Bf16 => "bf16",
            T::F32 => "float",
            _ => "double",
        }
    }
    /// Type values are computed in.
    fn comp_t(self) -> &'static str {
        match self.ty {
            T::F16 | T::Bf16 => "float",
            _ => self.store_t(),
        }
    }
    fn is_pred(self) -> bool {
        self.ty == T::Pred
    }
    fn is_float(self) -> bool {
        matches!(self.ty, T::F16 | T::Bf16 | T::F32 | T::F64)
    }
    fn is_int(self) -> bool {
        !self.is_pred() && !self.is_float()
    }
    /// A stored element as a compute value.
    fn load(self, e: &str) -> String {
        match self.ty {
            T::F16 | T::Bf16 => format!("to_f32({e})"),
            T::Pred => format!("(u8)({e} != 0)"),
            _ => e.to_string(),
        }
    }
    /// A compute value as a stored element.
    fn store(self, e: &str) -> String {
        match self.ty {
            T::Bf16 => format!("from_f32_bf16({e})"),
            T::F16 => format!("from_f32_f16({e})"),
            _ => format!("({})({e})", self.store_t()),
        }
    }
    /// Rounds a compute value to the type (16-bit floats), for multi-step computations.
    fn round(self, e: &str) -> String {
        match self.ty {
            T::Bf16 => format!("pl_rnd_bf16({e})"),
            T::F16 => format!("pl_rnd_f16({e})"),
            _ => e.to_string(),
        }
    }
}

/// `convert` of a compute value of type `from` to a compute value of type `to`, with the
/// interpreter's rules (`interp::scalar::convert`).
fn convert(from: Ty, to: Ty, e: &str) -> String {
    if from.is_pred() {
        return match to.ty {
            T::Pred => e.to_string(),
            _ if to.is_float() => format!("(({e}) ? ({})1 : ({})0)", to.comp_t(), to.comp_t()),
            _ => format!("({})(({e}) ? 1 : 0)", to.comp_t()),
        };
    }
    match to.ty {
        T::Pred => format!("(u8)(({e}) != 0)"),
        _ if to.is_int() => {
            if from.is_float() {
                format!("pl_f2i_{}((double)({e}))", to.store_t())
            } else {
                // Two's complement truncation through the 64-bit pattern.
                format!("({})(u64)({e})", to.store_t())
            }
        }
        T::F16 | T::Bf16 => match from.ty {
            T::F16 | T::Bf16 | T::F32 => e.to_string(),
            _ => format!("pl_f64_to_f32_odd((double)({e}))"),
        },
        T::F32 => format!("(float)({e})"),
        _ => format!("(double)({e})"),
    }
}

fn unary_fn(op: Opcode, t: Ty) -> R<&'static str> {
    use Opcode::*;
    let f = match op {
        Negate => "op_neg",
        Abs => "op_abs",
        Sign => "op_sign",
        Not if t.is_int() => "op_not",
        PopulationCount if t.is_int() => "op_popcnt",
        CountLeadingZeros if t.is_int() => "op_clz",
        Exp if t.is_float() => "op_exp",
        Expm1 if t.is_float() => "op_expm1",
        Log if t.is_float() => "op_log",
        Log1p if t.is_float() => "op_log1p",
        Sqrt if t.is_float() => "op_sqrt",
        Rsqrt if t.is_float() => "op_rsqrt",
        Cbrt if t.is_float() => "op_cbrt",
        Tanh if t.is_float() => "op_tanh",
        Logistic if t.is_float() => "op_logistic",
        Floor if t.is_float() => "op_floor",
        Ceil if t.is_float() => "op_ceil",
        RoundNearestAfz if t.is_float() => "op_round_afz",
        RoundNearestEven if t.is_float() => "op_round_even",
        Sine if t.is_float() => "op_sin",
        Cosine if t.is_float() => "op_cos",
        Tan if t.is_float() => "op_tan",
        Erf if t.is_float() => "op_erf",
        _ => return Err(format!("{} of {} has no device code", op.name(), t.ty)),
    };
    Ok(f)
}

fn binary_fn(op: Opcode, t: Ty) -> R<&'static str> {
    use Opcode::*;
    let f = match op {
        Add => "op_add",
        Subtract => "op_sub",
        Multiply => "op_mul",
        Divide => "op_div",
        Remainder => "op_rem",
        Maximum => "op_max",
        Minimum => "op_min",
        Power => "op_pow",
        Atan2 if t.is_float() => "op_atan2",
        And if t.is_int() => "op_and",
        Or if t.is_int() => "op_or",
        Xor if t.is_int() => "op_xor",
        ShiftLeft if t.is_int() => "op_shl",
        ShiftRightLogical if t.is_int() => "op_shrl",
        ShiftRightArithmetic if t.is_int() => "op_shra",
        _ => return Err(format!("{} of {} has no device code", op.name(), t.ty)),
    };
    Ok(f)
}

/// A binary op on two compute values (pred included), as an expression.
fn binary(op: Opcode, t: Ty, a: &str, b: &str) -> R<String> {
    use Opcode::*;
    if t.is_pred() {
        let o = match op {
            And | Minimum | Multiply => "&",
            Or | Maximum => "|",
            Xor | Add | Subtract => "^",
            _ => return Err(format!("{} of pred has no device code", op.name())),
        };
        return Ok(format!("(u8)({a} {o} {b})"));
    }
    Ok(format!("{}({a}, {b})", binary_fn(op, t)?))
}

/// A comparison of two compute values.
fn compare(dir: ComparisonDirection, total: bool, t: Ty, a: &str, b: &str) -> String {
    let o = match dir {
        ComparisonDirection::Eq => "==",
        ComparisonDirection::Ne => "!=",
        ComparisonDirection::Lt => "<",
        ComparisonDirection::Le => "<=",
        ComparisonDirection::Gt => ">",
        ComparisonDirection::Ge => ">=",
    };
    if total && t.is_float() {
        format!("(u8)(op_total_key({a}) {o} op_total_key({b}))")
    } else {
        // IEEE: with a NaN only != holds, which C's operators already do.
        format!("(u8)({a} {o} {b})")
    }
}

/// Row-major strides of `dims`.
/// A reduction's accumulators `acc0..`, each starting at its init value `in{N + j}[0]`.
fn reduction_init(tys: &[Ty]) -> String {
    let mut s = String::new();
    for (j, t) in tys.iter().enumerate() {
        let _ = writeln!(s, "    {} acc{j} = {};", t.comp_t(), t.load(&format!("in{}[0]", tys.len() + j)));
    }
    s
}

/// A reduction's results: accumulator `acc{j}` stored into `out{j}[i]`.
fn reduction_store(tys: &[Ty]) -> String {
    let mut s = String::new();
    for (j, t) in tys.iter().enumerate() {
        let _ = writeln!(s, "    out{j}[i] = {};", t.store(&format!("acc{j}")));
    }
    s
}

fn strides(dims: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1].saturating_mul(dims[k + 1]);
    }
    s
}

fn udims(a: &ArrayShape) -> R<Vec<u64>> {
    a.dims.iter().map(|&d| u64::try_from(d).map_err(|_| format!("negative dimension in {a}"))).collect()
}

/// `sum(idx[k] * stride[k])` over named index variables.
fn linear(idx: &[String], st: &[u64]) -> String {
    let terms: Vec<String> = idx
        .iter()
        .zip(st)
        .filter(|(_, s)| **s != 0)
        .map(|(i, &s)| if s == 1 { format!("({i})") } else { format!("({i}) * {s}ull") })
        .collect();
    if terms.is_empty() { "0ull".into() } else { terms.join(" + ") }
}

struct Gen<'a> {
    low: &'a Lowered,
    k: usize,
    instr: InstrId,
    inputs: &'a [Region],
    outputs: &'a [Region],
}

impl Gen<'_> {
    fn name(&self) -> String {
        format!("pl_gen_{}", self.k)
    }

    /// The single array shape of operand `i` (declared and local shapes must agree).
    fn operand(&self, i: usize) -> R<&ArrayShape> {
        let m = &self.low.module;
        let ins = m.instr(self.instr);
        let id = *ins.operands.get(i).ok_or_else(|| format!("missing operand {i}"))?;
        let local = self.low.evaluator.local_shape(m, id);
        if local != m.instr(id).shape {
            return Err(format!("operand {i} is sharded (per-device shape {local})"));
        }
        match &m.instr(id).shape {
            Shape::Array(a) => Ok(a),
            s => Err(format!("operand {i} has shape {s}, not an array")),
        }
    }

    fn out_shape(&self) -> R<&ArrayShape> {
        let m = &self.low.module;
        let ins = m.instr(self.instr);
        let local = self.low.evaluator.local_shape(m, self.instr);
        if local != ins.shape {
            return Err(format!("the result is sharded (per-device shape {local})"));
        }
        match &ins.shape {
            Shape::Array(a) => Ok(a),
            s => Err(format!("result shape {s} is not an array")),
        }
    }

    /// `const T* inK = (const T*)(A + off);` for operand `k`'s leaf.
    fn in_ptr(&self, k: usize, t: Ty) -> R<String> {
        let r = self.inputs.get(k).ok_or_else(|| format!("no region for operand {k}"))?;
        Ok(format!("  const {}* __restrict__ in{k} = (const {}*)(A + {}ull);\n", t.store_t(), t.store_t(), r.offset))
    }

    fn out_ptr(&self, t: Ty) -> R<String> {
        let r = self.outputs.first().ok_or("no result region")?;
        Ok(format!("  {}* __restrict__ out = ({}*)(A + {}ull);\n", t.store_t(), t.store_t(), r.offset))
    }

    /// Declares `o0..o{r-1}` (the output multi-index) from the linear index `i`.
    fn decompose(dims: &[u64]) -> String {
        let mut s = String::from("    u64 rest = i;\n");
        for k in (0..dims.len()).rev() {
            if k == 0 {
                let _ = writeln!(s, "    const u64 o0 = rest;");
            } else {
                let _ = writeln!(s, "    const u64 o{k} = rest % {}ull; rest /= {}ull;", dims[k], dims[k]);
            }
        }
        s.push_str("    (void)rest;\n");
        s
    }

    /// Wraps `decls` (pointer declarations) and `body` (one output element at index `i`) into
    /// a kernel over `n` elements.
    fn kernel(&self, n: u64, decls: &str, prologue: &str, body: &str) -> (GenStep, String) {
        let name = self.name();
        let ins = self.low.module.instr(self.instr);
        let code = format!(
            "\n// {} = {}\nPL_GLOBAL void __launch_bounds__({GEN_THREADS}) {name}(u8* __restrict__ A, u32 dev) {{\n  \
             (void)dev;\n{decls}{prologue}  for (u64 i = pl_first(); i < {n}ull; i += pl_stride()) {{\n{body}  }}\n}}\n",
            ins.name.replace(['\n', '\r'], " "),
            ins.opcode.name()
        );
        (GenStep::Kernel { name, elements: n }, code)
    }

    fn generate(&self) -> R<(GenStep, String)> {
        use Opcode::*;
        let m = &self.low.module;
        let ins = m.instr(self.instr);
        if self.low.evaluator.cuts_operands(self.instr) {
            return Err("an operand is cut into this device's shard first".into());
        }
        if !ins.called.is_empty() && !matches!(ins.opcode, Reduce | ReduceWindow | Sort) {
            return Err(format!("{} calls a computation", ins.opcode.name()));
        }
        if ins.opcode == Reduce {
            return self.reduce();
        }
        if ins.opcode == ReduceWindow {
            return self.reduce_window();
        }
        if ins.opcode == Sort {
            return self.sort();
        }
        let out = self.out_shape()?;
        let out_bytes = out.byte_size();
        let dst = self.outputs.first().ok_or("no result region")?.offset;
        match ins.opcode {
            Constant => {
                let Some(Literal::Array(a)) = ins.attrs.literal.as_ref() else {
                    return Err("constant without an array literal".into());
                };
                if a.data.len() != out_bytes {
                    return Err("constant literal size differs from its shape".into());
                }
                return Ok((GenStep::Constant { bytes: a.data.clone(), dst }, String::new()));
            }
            Reshape | Bitcast | Copy | BitcastConvert => {
                let a = self.operand(0)?;
                if a.byte_size() != out_bytes {
                    return Err(format!("{} changes the byte size", ins.opcode.name()));
                }
                if (ins.opcode == Copy || ins.opcode == Reshape) && a.ty != out.ty {
                    return Err(format!("{} changes the element type", ins.opcode.name()));
                }
                for ty in [a.ty, out.ty] {
                    if ins.opcode == BitcastConvert && matches!(ty, T::S4 | T::U4 | T::Pred | T::Token) {
                        return Err(format!("bitcast-convert of {ty}"));
                    }
                }
                let src = self.inputs.first().ok_or("no operand region")?.offset;
                return Ok((GenStep::Copy { src, dst, len: out_bytes }, String::new()));
            }
            _ => {}
        }
        let n = out.element_count() as u64;
        if n == 0 {
            return Ok((GenStep::Nothing, String::new()));
        }
        // Data movement copies stored elements and never computes with them, so any element
        // type of 1, 2, 4 or 8 bytes moves (F8, S4 / U4 are one byte per element, as in XLA's
        // host literals; C64 is 8 bytes).
        let moves = matches!(
            ins.opcode,
            Broadcast
                | Transpose
                | Slice
                | Reverse
                | DynamicSlice
                | DynamicUpdateSlice
                | Pad
                | Concatenate
                | Select
                | Gather
        );
        let ot = if moves { Ty::raw(out.ty)? } else { Ty::of(out.ty)? };
        let dims = udims(out)?;
        let mut decls = self.out_ptr(ot)?;
        let mut prologue = String::new();
        let mut body = String::new();
        let oidx: Vec<String> = (0..dims.len()).map(|k| format!("o{k}")).collect();
        match ins.opcode {
            ReplicaId | PartitionId => {
                let mine = (ins.opcode == ReplicaId) == (self.low.mode == emitter::DeviceMode::Replica);
                body.push_str(&format!("    out[i] = {};\n", if mine { "dev" } else { "0u" }));
            }
            Iota => {
                let dim = ins.attrs.iota_dimension.ok_or("missing iota_dimension")?;
                let d = usize::try_from(dim).ok().filter(|&d| d < dims.len()).ok_or("iota dimension out of range")?;
                body.push_str(&Self::decompose(&dims));
                let v = convert(Ty { ty: T::S64 }, ot, &format!("(s64)o{d}"));
                let _ = writeln!(body, "    out[i] = {};", ot.store(&v));
            }
            op if op.is_elementwise_unary() => {
                let a = self.operand(0)?;
                let at = Ty::of(a.ty)?;
                decls += &self.in_ptr(0, at)?;
                let x = at.load("in0[i]");
                let v = if op == IsFinite {
                    if !at.is_float() {
                        return Err(format!("is-finite of {}", a.ty));
                    }
                    format!("(u8)op_isfinite({x})")
                } else if at.is_pred() {
                    match op {
                        Not => format!("(u8)!({x})"),
                        Abs | Sign | Negate => x,
                        _ => return Err(format!("{} of pred has no device code", op.name())),
                    }
                } else {
                    format!("{}(({}){x})", unary_fn(op, at)?, at.comp_t())
                };
                let _ = writeln!(body, "    out[i] = {};", ot.store(&v));
            }
            Compare => {
                let (a, b) = (self.operand(0)?, self.operand(1)?);
                if a.ty != b.ty {
                    return Err("compare of different types".into());
                }
                let t = Ty::of(a.ty)?;
                decls += &self.in_ptr(0, t)?;
                decls += &self.in_ptr(1, t)?;
                let dir = ins.attrs.comparison_direction.ok_or("missing direction")?;
                let total = ins.attrs.comparison_type.as_deref() == Some("TOTALORDER");
                let _ = writeln!(
                    body,
                    "    const {c} x = {}; const {c} y = {};\n    out[i] = {};",
                    t.load("in0[i]"),
                    t.load("in1[i]"),
                    compare(dir, total, t, "x", "y"),
                    c = t.comp_t()
                );
            }
            op if op.is_elementwise_binary() => {
                let (a, b) = (self.operand(0)?, self.operand(1)?);
                if a.ty != b.ty || a.ty != out.ty {
                    return Err(format!("{} of different types", op.name()));
                }
                decls += &self.in_ptr(0, ot)?;
                decls += &self.in_ptr(1, ot)?;
                let _ = writeln!(
                    body,
                    "    const {c} x = {}; const {c} y = {};\n    out[i] = {};",
                    ot.load("in0[i]"),
                    ot.load("in1[i]"),
                    ot.store(&binary(op, ot, "x", "y")?),
                    c = ot.comp_t()
                );
            }
            Select => {
                let p = self.operand(0)?;
                if p.ty != T::Pred {
                    return Err("select predicate is not pred".into());
                }
                decls += &self.in_ptr(0, Ty { ty: T::Pred })?;
                decls += &self.in_ptr(1, ot)?;
                decls += &self.in_ptr(2, ot)?;
                let pi = if p.rank() == 0 { "0" } else { "i" };
                let _ = writeln!(body, "    out[i] = in0[{pi}] ? in1[i] : in2[i];");
            }
            Clamp => {
                let (lo, hi) = (self.operand(0)?, self.operand(2)?);
                for (k, b) in [(0, lo), (2, hi)] {
                    if b.ty != out.ty {
                        return Err(format!("clamp bound {k} has type {}", b.ty));
                    }
                }
                decls += &self.in_ptr(0, ot)?;
                decls += &self.in_ptr(1, ot)?;
                decls += &self.in_ptr(2, ot)?;
                let (li, hi_) = (if lo.rank() == 0 { "0" } else { "i" }, if hi.rank() == 0 { "0" } else { "i" });
                let max = binary(Maximum, ot, "x", "l")?;
                let min = binary(Minimum, ot, "m", "h")?;
                let _ = writeln!(
                    body,
                    "    const {c} x = {}; const {c} l = {}; const {c} h = {};\n    const {c} m = {};\n    out[i] = {};",
                    ot.load("in1[i]"),
                    ot.load(&format!("in0[{li}]")),
                    ot.load(&format!("in2[{hi_}]")),
                    ot.round(&max),
                    ot.store(&min),
                    c = ot.comp_t()
                );
            }
            Convert => {
                let a = self.operand(0)?;
                let at = Ty::of(a.ty)?;
                decls += &self.in_ptr(0, at)?;
                let v = convert(at, ot, &at.load("in0[i]"));
                let _ = writeln!(body, "    out[i] = {};", ot.store(&v));
            }
            Broadcast | Transpose | Slice | Reverse | DynamicSlice => {
                let a = self.operand(0)?;
                if a.ty != out.ty {
                    return Err(format!("{} changes the element type", ins.opcode.name()));
                }
                decls += &self.in_ptr(0, ot)?;
                let adims = udims(a)?;
                let ast = strides(&adims);
                let rank = adims.len();
                let attr = || ins.attrs.dimensions.clone().ok_or_else(|| "missing dimensions".to_string());
                let as_dim = |d: i64, r: usize| usize::try_from(d).ok().filter(|&d| d < r).ok_or("bad dimension");
                // The operand index per operand dimension, as expressions over o0..
                let idx: Vec<String> = match ins.opcode {
                    Broadcast => {
                        let ds = attr()?;
                        if ds.len() != rank {
                            return Err("broadcast dimensions do not match the operand rank".into());
                        }
                        ds.iter().map(|&d| as_dim(d, dims.len()).map(|d| oidx[d].clone())).collect::<Result<_, _>>()?
                    }
                    Transpose => {
                        let perm = attr()?;
                        if perm.len() != rank {
                            return Err("bad permutation".into());
                        }
                        let mut v = vec![String::new(); rank];
                        for (j, &p) in perm.iter().enumerate() {
                            v[as_dim(p, rank)?] = oidx[j].clone();
                        }
                        if v.iter().any(String::is_empty) {
                            return Err("bad permutation".into());
                        }
                        v
                    }
                    Slice => {
                        let sl = ins.attrs.slice.as_deref().ok_or("missing slice")?;
                        if sl.len() != rank {
                            return Err("slice rank".into());
                        }
                        sl.iter()
                            .enumerate()
                            .map(|(k, s)| format!("{}ull + o{k} * {}ull", s.start.max(0), s.stride.max(1)))
                            .collect()
                    }
                    Reverse => {
                        let ds = attr()?;
                        (0..rank)
                            .map(|k| {
                                if ds.contains(&(k as i64)) {
                                    format!("{}ull - o{k}", adims[k].saturating_sub(1))
                                } else {
                                    oidx[k].clone()
                                }
                            })
                            .collect()
                    }
                    _ => {
                        // dynamic-slice: starts from scalar operands, clamped to [0, dim - size].
                        if ins.operands.len() != rank + 1 {
                            return Err("dynamic-slice needs one scalar start per dimension".into());
                        }
                        prologue += &self.starts(1, &adims, &dims, &mut decls)?;
                        (0..rank).map(|k| format!("s{k} + o{k}")).collect()
                    }
                };
                body.push_str(&Self::decompose(&dims));
                let _ = writeln!(body, "    out[i] = in0[{}];", linear(&idx, &ast));
            }
            DynamicUpdateSlice => {
                let (a, u) = (self.operand(0)?, self.operand(1)?);
                if a.ty != out.ty || u.ty != out.ty || a.dims != out.dims {
                    return Err("dynamic-update-slice types or shapes differ".into());
                }
                let udims_ = udims(u)?;
                let rank = dims.len();
                if ins.operands.len() != rank + 2 || udims_.len() != rank {
                    return Err("dynamic-update-slice needs one scalar start per dimension".into());
                }
                decls += &self.in_ptr(0, ot)?;
                decls += &self.in_ptr(1, ot)?;
                prologue += &self.starts(2, &dims, &udims_, &mut decls)?;
                body.push_str(&Self::decompose(&dims));
                let inside: Vec<String> = (0..rank).map(|k| format!("o{k} - s{k} < {}ull", udims_[k])).collect();
                let uidx: Vec<String> = (0..rank).map(|k| format!("o{k} - s{k}")).collect();
                let cond = if inside.is_empty() { "true".to_string() } else { inside.join(" && ") };
                // Unsigned wrap-around makes `o - s < size` false for o < s.
                let _ = writeln!(body, "    out[i] = ({cond}) ? in1[{}] : in0[i];", linear(&uidx, &strides(&udims_)));
            }
            Pad => {
                let (a, v) = (self.operand(0)?, self.operand(1)?);
                if a.ty != out.ty || v.ty != out.ty || v.element_count() != 1 {
                    return Err("pad types differ".into());
                }
                let cfg = ins.attrs.padding.as_deref().ok_or("missing padding")?;
                let adims = udims(a)?;
                if cfg.len() != adims.len() {
                    return Err("padding rank".into());
                }
                decls += &self.in_ptr(0, ot)?;
                decls += &self.in_ptr(1, ot)?;
                body.push_str(&Self::decompose(&dims));
                let mut conds = Vec::new();
                let mut idx = Vec::new();
                for (k, p) in cfg.iter().enumerate() {
                    if p.interior < 0 {
                        return Err("negative interior padding".into());
                    }
                    let step = p.interior + 1;
                    let _ = writeln!(body, "    const s64 r{k} = (s64)o{k} - ({}ll);", p.lo);
                    conds.push(format!("r{k} >= 0 && r{k} % {step}ll == 0 && r{k} / {step}ll < {}ll", adims[k]));
                    idx.push(format!("(u64)(r{k} / {step}ll)"));
                }
                let cond = if conds.is_empty() { "true".to_string() } else { conds.join(" && ") };
                let _ = writeln!(body, "    out[i] = ({cond}) ? in0[{}] : in1[0];", linear(&idx, &strides(&adims)));
            }
            Concatenate => {
                let ds = ins.attrs.dimensions.as_deref().ok_or("missing dimensions")?;
                let &[d] = ds else { return Err("concatenate needs one dimension".into()) };
                let d = usize::try_from(d).ok().filter(|&d| d < dims.len()).ok_or("bad dimension")?;
                body.push_str(&Self::decompose(&dims));
                let mut at = 0u64;
                for k in 0..ins.operands.len() {
                    let a = self.operand(k)?;
                    if a.ty != out.ty {
                        return Err("concatenate of different types".into());
                    }
                    decls += &self.in_ptr(k, ot)?;
                    let adims = udims(a)?;
                    let size = adims[d];
                    let mut idx = oidx.clone();
                    idx[d] = format!("o{d} - {at}ull");
                    let _ = writeln!(
                        body,
                        "    {}if (o{d} < {}ull) out[i] = in{k}[{}];",
                        if k == 0 { "" } else { "else " },
                        at + size,
                        linear(&idx, &strides(&adims))
                    );
                    at += size;
                }
            }
            Gather => {
                let (a, idx) = (self.operand(0)?, self.operand(1)?);
                let it = Ty::of(idx.ty)?;
                if a.ty != out.ty || !it.is_int() {
                    return Err("gather types: the operand's type in, integer indices".into());
                }
                let g = hlo::GatherDims::of(&ins.attrs)?;
                let p = interp::GatherPlan::new(&a.dims, &idx.dims, &g, &out.dims)?;
                decls += &self.in_ptr(0, ot)?;
                decls += &self.in_ptr(1, it)?;
                let (ist, ast) = (strides(&udims(idx)?), strides(&udims(a)?));
                body.push_str(&Self::decompose(&dims));
                let base: Vec<String> = p.batch.iter().map(|&(od, id)| format!("o{od} * {}ull", ist[id])).collect();
                let _ = writeln!(
                    body,
                    "    const u64 gb = {};",
                    if base.is_empty() { "0ull".into() } else { base.join(" + ") }
                );
                let mut terms = Vec::new();
                for (d, od) in p.offset_of.iter().enumerate() {
                    let start = match p.start_index_map.iter().position(|&m| m == d) {
                        _ if p.batch_of[d].is_some() => p.batch_of[d].map_or(String::new(), |bd| format!("o{bd}")),
                        Some(k) => {
                            let at = if p.index_vector_dim == idx.rank() {
                                "gb".to_string()
                            } else {
                                format!("gb + {}ull", k as u64 * ist[p.index_vector_dim])
                            };
                            // As an i64 (u64 above i64::MAX saturates), clamped to [0, dim - size].
                            let v = if idx.ty == T::U64 {
                                format!(
                                    "(s64)(in1[{at}] > 9223372036854775807ull ? 9223372036854775807ull : in1[{at}])"
                                )
                            } else {
                                format!("(s64)in1[{at}]")
                            };
                            let _ = writeln!(
                                body,
                                "    const s64 t{d} = {v};\n    const u64 st{d} = t{d} < 0 ? 0ull : ((u64)t{d} > {m}ull ? {m}ull : (u64)t{d});",
                                m = p.max_start[d]
                            );
                            format!("st{d}")
                        }
                        None => "0ull".to_string(),
                    };
                    let off = od.map_or(String::new(), |od| format!(" + o{od}"));
                    terms.push(format!("({start}{off}) * {}ull", ast[d]));
                }
                let _ = writeln!(
                    body,
                    "    out[i] = in0[{}];",
                    if terms.is_empty() { "0ull".into() } else { terms.join(" + ") }
                );
            }
            Dot => self.dot(out, &dims, ot, &mut decls, &mut body)?,
            op => return Err(format!("{} has no device code", op.name())),
        }
        Ok(self.kernel(n, &decls, &prologue, &body))
    }

    /// Reads the scalar start operands `first..` into clamped `s0..` (prologue of
    /// dynamic-slice and dynamic-update-slice): `dims` of the operand, `sizes` of the window.
    fn starts(&self, first: usize, dims: &[u64], sizes: &[u64], decls: &mut String) -> R<String> {
        let mut p = String::new();
        for k in 0..dims.len() {
            let s = self.operand(first + k)?;
            let st = Ty::of(s.ty)?;
            if !st.is_int() || s.rank() != 0 {
                return Err("start indices must be integer scalars".into());
            }
            *decls += &self.in_ptr(first + k, st)?;
            let hi = dims[k].saturating_sub(sizes[k]);
            // As an i64 (u64 above i64::MAX saturates), clamped to [0, dim - size].
            let v = if matches!(s.ty, T::U64) {
                format!("(s64)(in{i}[0] > 9223372036854775807ull ? 9223372036854775807ull : in{i}[0])", i = first + k)
            } else {
                format!("(s64)in{}[0]", first + k)
            };
            let _ = writeln!(p, "  const s64 t{k} = {v};");
            let _ = writeln!(p, "  const u64 s{k} = t{k} < 0 ? 0ull : ((u64)t{k} > {hi}ull ? {hi}ull : (u64)t{k});");
        }
        Ok(p)
    }

    /// What `reduce` and `reduce-window` of N inputs with N init values share: N, the
    /// reducer, the N result shapes and the 2N operand shapes; an error where the result is
    /// sharded or does not match.
    fn reduction(&self, what: &str) -> R<(usize, hlo::CompId, Vec<&ArrayShape>, Vec<&ArrayShape>)> {
        let m = &self.low.module;
        let ins = m.instr(self.instr);
        let nv = ins.operands.len() / 2;
        if nv == 0 || ins.operands.len() != 2 * nv {
            return Err(format!("{what} needs N inputs and N init values"));
        }
        let &[comp] = ins.called.as_slice() else { return Err(format!("{what} without one computation")) };
        let local = self.low.evaluator.local_shape(m, self.instr);
        if local != ins.shape {
            return Err(format!("the result is sharded (per-device shape {local})"));
        }
        let outs: Vec<&ArrayShape> = match &ins.shape {
            Shape::Array(a) if nv == 1 => vec![a],
            Shape::Tuple(t) if t.len() == nv => {
                t.iter().map(|s| s.as_array().ok_or("nested tuple result")).collect::<Result<_, _>>()?
            }
            s => return Err(format!("{what} result {s} does not match its {nv} inputs")),
        };
        let ins_shapes: Vec<&ArrayShape> = (0..2 * nv).map(|i| self.operand(i)).collect::<R<_>>()?;
        Ok((nv, comp, outs, ins_shapes))
    }

    /// The element types of a reduction's N results, checking that every input has the first
    /// one's dimensions, every init is a scalar, each input, init and result share a type, and
    /// every result has dimensions `dims`.
    fn reduction_types(&self, what: &str, outs: &[&ArrayShape], ins: &[&ArrayShape], dims: &[i64]) -> R<Vec<Ty>> {
        let nv = outs.len();
        let mut tys = Vec::with_capacity(nv);
        for j in 0..nv {
            let (a, init, o) = (ins[j], ins[nv + j], outs[j]);
            if a.dims != ins[0].dims || a.ty != o.ty || init.ty != o.ty || init.rank() != 0 || o.dims != dims {
                return Err(format!("{what} inputs, inits and results differ in type or shape"));
            }
            tys.push(Ty::of(o.ty)?);
        }
        if self.outputs.len() != nv {
            return Err(format!("{what} result regions"));
        }
        Ok(tys)
    }

    /// A reduction's pointers: results `out0..`, inputs `in0..` and init values `in{N}..`.
    fn reduction_decls(&self, tys: &[Ty]) -> R<String> {
        let nv = tys.len();
        let mut decls = String::new();
        for (j, t) in tys.iter().enumerate() {
            let st = t.store_t();
            let _ = writeln!(decls, "  {st}* __restrict__ out{j} = ({st}*)(A + {}ull);", self.outputs[j].offset);
            decls += &self.in_ptr(j, *t)?;
            decls += &self.in_ptr(nv + j, *t)?;
        }
        Ok(decls)
    }

    /// `reduce` of N inputs with N init values: one output element per loop iteration, the
    /// reduced dimensions folded in the interpreter's (row-major) order, the reducer inlined
    /// (one binary op, or any scalar computation of elementwise ops: argmax and the like).
    fn reduce(&self) -> R<(GenStep, String)> {
        let m = &self.low.module;
        let ins = m.instr(self.instr);
        let (_, comp, outs, ins_shapes) = self.reduction("reduce")?;
        let adims = udims(ins_shapes[0])?;
        let dims = udims(outs[0])?;
        let tys = self.reduction_types("reduce", &outs, &ins_shapes, &outs[0].dims)?;
        let rdims: Vec<usize> = ins
            .attrs
            .dimensions
            .as_deref()
            .ok_or("missing dimensions")?
            .iter()
            .map(|&d| usize::try_from(d).ok().filter(|&d| d < adims.len()).ok_or("bad dimension"))
            .collect::<Result<_, _>>()?;
        let kept: Vec<usize> = (0..adims.len()).filter(|k| !rdims.contains(k)).collect();
        if kept.len() != dims.len() {
            return Err("reduce result rank".into());
        }
        let n = outs[0].element_count() as u64;
        if n == 0 {
            return Ok((GenStep::Nothing, String::new()));
        }
        let decls = self.reduction_decls(&tys)?;
        let mut body = Self::decompose(&dims);
        body += &reduction_init(&tys);
        let mut sorted = rdims.clone();
        sorted.sort_unstable();
        let mut idx = vec![String::new(); adims.len()];
        for (j, &k) in kept.iter().enumerate() {
            idx[k] = format!("o{j}");
        }
        for &k in &sorted {
            idx[k] = format!("r{k}");
            let _ = writeln!(body, "    for (u64 r{k} = 0; r{k} < {}ull; ++r{k})", adims[k]);
        }
        body += &self.fold(comp, &tys, &linear(&idx, &strides(&adims)))?;
        body += &reduction_store(&tys);
        Ok(self.kernel(n, &decls, "", &body))
    }

    /// One step of a reduction: element `at` of inputs `in0..` folded into accumulators
    /// `acc0..` (of types `tys`) by reducer `comp`, as one statement (a one-op reducer of one
    /// input) or as a block with the reducer computation inlined.
    fn fold(&self, comp: hlo::CompId, tys: &[Ty], at: &str) -> R<String> {
        let nv = tys.len();
        let mut body = String::new();
        match interp::single_op_reducer(&self.low.module, comp).filter(|_| nv == 1) {
            Some(op) => {
                let x = tys[0].load(&format!("in0[{at}]"));
                let _ = writeln!(body, "      acc0 = {};", tys[0].round(&binary(op, tys[0], "acc0", &x)?));
            }
            None => {
                body.push_str("    {\n");
                let mut args: Vec<String> = (0..nv).map(|j| format!("acc{j}")).collect();
                for (j, t) in tys.iter().enumerate() {
                    let _ = writeln!(body, "      const {} x{j} = {};", t.comp_t(), t.load(&format!("in{j}[{at}]")));
                    args.push(format!("x{j}"));
                }
                let (code, results) = self.scalar_computation(comp, &args)?;
                if results.len() != nv {
                    return Err("the reducer returns the wrong number of values".into());
                }
                body.push_str(&code);
                for (j, r) in results.iter().enumerate() {
                    let _ = writeln!(body, "      acc{j} = {r};");
                }
                body.push_str("    }\n");
            }
        }
        Ok(body)
    }

    /// `reduce-window` of N inputs with N init values: one output element per loop iteration,
    /// folding the input elements its window covers into the init values in row-major window
    /// order, padding and base-dilation holes skipped (the interpreter's `window_reads`), the
    /// reducer inlined as for reduce. Scalar inputs are copied, as XLA does.
    fn reduce_window(&self) -> R<(GenStep, String)> {
        let m = &self.low.module;
        let ins = m.instr(self.instr);
        let (nv, comp, outs, ins_shapes) = self.reduction("reduce-window")?;
        let window = hlo::Window::of(&ins.attrs)?;
        if window.dims.iter().any(|d| d.reversal) {
            return Err("a reversed window (rhs_reversal)".into());
        }
        let want = window.output_dims(&ins_shapes[0].dims)?;
        let tys = self.reduction_types("reduce-window", &outs, &ins_shapes, &want)?;
        let adims = udims(ins_shapes[0])?;
        // Every position the kernel computes (`o * stride + w * window_dilation - pad_lo`) is
        // within this bound, so its s64 arithmetic cannot overflow.
        let dilated = |n: i128, d: i64| if n == 0 { 0 } else { (n - 1) * d as i128 + 1 };
        let bound = window.dims.iter().zip(&adims).fold(0i128, |acc, (w, &n)| {
            let b = dilated(n as i128, w.base_dilation)
                + (w.pad_lo as i128).abs()
                + (w.pad_hi as i128).abs()
                + dilated(w.size as i128, w.window_dilation);
            acc.max(b)
        });
        if bound >= 1 << 62 {
            return Err("window positions beyond 2^62".into());
        }
        let dims = udims(outs[0])?;
        let n = outs[0].element_count() as u64;
        if n == 0 {
            return Ok((GenStep::Nothing, String::new()));
        }
        let decls = self.reduction_decls(&tys)?;
        let mut body = Self::decompose(&dims);
        if adims.is_empty() {
            for j in 0..nv {
                let _ = writeln!(body, "    out{j}[i] = in{j}[0];");
            }
            return Ok(self.kernel(n, &decls, "", &body));
        }
        body += &reduction_init(&tys);
        let mut idx = Vec::new();
        for (k, w) in window.dims.iter().enumerate() {
            // The window position in the padded, dilated input: it reads an element only where
            // it falls on one (not in the padding, not in a hole of the base dilation).
            let bd = w.base_dilation;
            let (inside, at) = if bd == 1 {
                (format!("p{k} >= 0 && p{k} < {}ll", adims[k]), format!("(u64)p{k}"))
            } else {
                (
                    format!("p{k} >= 0 && p{k} % {bd}ll == 0 && p{k} / {bd}ll < {}ll", adims[k]),
                    format!("(u64)(p{k} / {bd}ll)"),
                )
            };
            let _ = writeln!(
                body,
                "    for (u64 w{k} = 0; w{k} < {}ull; ++w{k}) {{\n    const s64 p{k} = (s64)o{k} * {}ll + (s64)w{k} * \
                 {}ll - ({}ll);\n    if (!({inside})) continue;",
                w.size, w.stride, w.window_dilation, w.pad_lo
            );
            idx.push(at);
        }
        body += &self.fold(comp, &tys, &linear(&idx, &strides(&adims)))?;
        body += &"    }\n".repeat(adims.len());
        body += &reduction_store(&tys);
        Ok(self.kernel(n, &decls, "", &body))
    }

    /// `sort` of N operands along one dimension: one thread per slice copies it to the
    /// results and insertion-sorts it there with the comparator inlined (stable, as the
    /// interpreter's merge sort; quadratic in the slice length — correctness first).
    fn sort(&self) -> R<(GenStep, String)> {
        let m = &self.low.module;
        let ins = m.instr(self.instr);
        let nv = ins.operands.len();
        let &[comp] = ins.called.as_slice() else { return Err("sort without one comparator".into()) };
        let local = self.low.evaluator.local_shape(m, self.instr);
        if local != ins.shape {
            return Err(format!("the result is sharded (per-device shape {local})"));
        }
        let shapes: Vec<&ArrayShape> = (0..nv).map(|i| self.operand(i)).collect::<R<_>>()?;
        let outs: Vec<&ArrayShape> = match &ins.shape {
            Shape::Array(a) if nv == 1 => vec![a],
            Shape::Tuple(t) if t.len() == nv => {
                t.iter().map(|s| s.as_array().ok_or("nested tuple result")).collect::<Result<_, _>>()?
            }
            s => return Err(format!("sort result {s} does not match its {nv} operands")),
        };
        if nv == 0
            || self.outputs.len() != nv
            || shapes.iter().zip(&outs).any(|(a, o)| a != o || a.dims != shapes[0].dims)
        {
            return Err("sort operands and results differ in shape".into());
        }
        let dims = udims(shapes[0])?;
        let &[d] = ins.attrs.dimensions.as_deref().unwrap_or(&[]) else {
            return Err("sort needs one dimension".into());
        };
        let d = usize::try_from(d).ok().filter(|&d| d < dims.len()).ok_or("bad sort dimension")?;
        let (len, inner) = (dims[d], dims[d + 1..].iter().product::<u64>());
        let slices = dims.iter().product::<u64>().checked_div(len).unwrap_or(0);
        if slices == 0 {
            return Ok((GenStep::Nothing, String::new()));
        }
        let tys = shapes.iter().map(|a| Ty::of(a.ty)).collect::<R<Vec<_>>>()?;
        let mut decls = String::new();
        for (k, t) in tys.iter().enumerate() {
            let _ = writeln!(
                decls,
                "  {}* __restrict__ out{k} = ({}*)(A + {}ull);",
                t.store_t(),
                t.store_t(),
                self.outputs[k].offset
            );
            decls += &self.in_ptr(k, *t)?;
        }
        let mut body = format!(
            "    const u64 base = (i / {inner}ull) * {}ull + (i % {inner}ull);\n    for (u64 j = 0; j < {len}ull; ++j) {{\n",
            len * inner
        );
        for k in 0..nv {
            let _ = writeln!(body, "      out{k}[base + j * {inner}ull] = in{k}[base + j * {inner}ull];");
        }
        body += &format!("    }}\n    for (u64 a = 1; a < {len}ull; ++a) {{\n      for (u64 j = a; j > 0; --j) {{\n");
        let mut args = Vec::new();
        for (k, t) in tys.iter().enumerate() {
            let _ = writeln!(
                body,
                "      const {c} a{k} = {}; const {c} b{k} = {};",
                t.load(&format!("out{k}[base + j * {inner}ull]")),
                t.load(&format!("out{k}[base + (j - 1) * {inner}ull]")),
                c = t.comp_t()
            );
            args.push(format!("a{k}"));
            args.push(format!("b{k}"));
        }
        let (code, results) = self.scalar_computation(comp, &args)?;
        let [before] = results.as_slice() else { return Err("the comparator returns more than one value".into()) };
        body += &code;
        let _ = writeln!(body, "      if (!({before})) break;");
        for (k, t) in tys.iter().enumerate() {
            let _ = writeln!(
                body,
                "      {{ const {s} t = out{k}[base + j * {inner}ull]; out{k}[base + j * {inner}ull] = \
                 out{k}[base + (j - 1) * {inner}ull]; out{k}[base + (j - 1) * {inner}ull] = t; }}",
                s = t.store_t()
            );
        }
        body += "      }\n    }\n";
        Ok(self.kernel(slices, &decls, "", &body))
    }

    /// Inlines a scalar computation (a reducer) as statements over compute values: `args`
    /// name its parameters' values; returns the code and the names of the root's values (one,
    /// or one per element of a root tuple). Elementwise ops, compare, select, clamp,
    /// convert and scalar constants; 16-bit floats rounded after every op.
    fn scalar_computation(&self, comp: hlo::CompId, args: &[String]) -> R<(String, Vec<String>)> {
        use Opcode::*;
        let m = &self.low.module;
        let cm = m.comps.get(comp).ok_or("missing computation")?;
        if cm.params.len() != args.len() {
            return Err(format!("computation '{}' takes {} parameters, not {}", cm.name, cm.params.len(), args.len()));
        }
        let mut names: std::collections::HashMap<InstrId, Vec<String>> = std::collections::HashMap::new();
        let mut code = String::new();
        let scalar_ty = |id: InstrId| -> R<Ty> {
            match &m.instr(id).shape {
                Shape::Array(a) if a.rank() == 0 => Ty::of(a.ty),
                s => Err(format!("reducer value of shape {s} is not a scalar")),
            }
        };
        for &id in &cm.instrs {
            let ci = m.instr(id);
            let arg = |k: usize| -> R<String> {
                let o = ci.operands.get(k).ok_or("missing operand")?;
                names.get(o).and_then(|v| v.first().cloned()).ok_or_else(|| "operand defined later".to_string())
            };
            let v = format!("v{}", id.as_u32());
            let expr = match ci.opcode {
                Parameter => {
                    let p =
                        ci.attrs.parameter_number.and_then(|p| usize::try_from(p).ok()).ok_or("parameter number")?;
                    names.insert(id, vec![args.get(p).ok_or("parameter out of range")?.clone()]);
                    continue;
                }
                Tuple => {
                    let vs = (0..ci.operands.len()).map(arg).collect::<R<Vec<_>>>()?;
                    names.insert(id, vs);
                    continue;
                }
                Constant => {
                    let t = scalar_ty(id)?;
                    let Some(Literal::Array(a)) = ci.attrs.literal.as_ref() else { return Err("constant".into()) };
                    let mut b = [0u8; 8];
                    let len = a.data.len().min(8);
                    b[..len].copy_from_slice(&a.data[..len]);
                    let bits = u64::from_le_bytes(b);
                    match t.ty {
                        T::F32 => format!("__uint_as_float({bits:#x}u)"),
                        T::F64 => format!("__longlong_as_double((s64){bits:#x}ull)"),
                        T::Bf16 => format!("to_f32(bf16{{(u16){bits:#x}}})"),
                        T::F16 => format!("to_f32(f16{{(u16){bits:#x}}})"),
                        T::Pred => format!("(u8){}", (bits & 0xff != 0) as u8),
                        _ => format!("({})(u64){bits:#x}ull", t.store_t()),
                    }
                }
                Compare => {
                    let t = scalar_ty(ci.operands[0])?;
                    let dir = ci.attrs.comparison_direction.ok_or("missing direction")?;
                    let total = ci.attrs.comparison_type.as_deref() == Some("TOTALORDER");
                    compare(dir, total, t, &arg(0)?, &arg(1)?)
                }
                Select => format!("({} ? {} : {})", arg(0)?, arg(1)?, arg(2)?),
                Convert => convert(scalar_ty(ci.operands[0])?, scalar_ty(id)?, &arg(0)?),
                Clamp => {
                    let t = scalar_ty(id)?;
                    let mx = t.round(&binary(Maximum, t, &arg(1)?, &arg(0)?)?);
                    t.round(&binary(Minimum, t, &mx, &arg(2)?)?)
                }
                op if op.is_elementwise_binary() => {
                    let t = scalar_ty(id)?;
                    t.round(&binary(op, t, &arg(0)?, &arg(1)?)?)
                }
                op if op.is_elementwise_unary() => {
                    let t = scalar_ty(ci.operands[0])?;
                    match op {
                        IsFinite if t.is_float() => format!("(u8)op_isfinite({})", arg(0)?),
                        Not if t.is_pred() => format!("(u8)!({})", arg(0)?),
                        Abs | Sign | Negate if t.is_pred() => arg(0)?,
                        _ => t.round(&format!("{}({})", unary_fn(op, t)?, arg(0)?)),
                    }
                }
                op => return Err(format!("{} in a reducer has no device code", op.name())),
            };
            let t = scalar_ty(id)?;
            let _ = writeln!(code, "      const {} {v} = {expr};", t.comp_t());
            names.insert(id, vec![v]);
        }
        let results = names.remove(&cm.root).ok_or("reducer without a root")?;
        Ok((code, results))
    }

    fn dot(&self, out: &ArrayShape, dims: &[u64], ot: Ty, decls: &mut String, body: &mut String) -> R<()> {
        let ins = self.low.module.instr(self.instr);
        let (l, r) = (self.operand(0)?, self.operand(1)?);
        let (lt, rt) = (Ty::of(l.ty)?, Ty::of(r.ty)?);
        if lt.is_pred() || rt.is_pred() || ot.is_pred() {
            return Err("dot of pred".into());
        }
        let dd = ins.attrs.dot.clone().unwrap_or_default();
        let (ld, rd) = (udims(l)?, udims(r)?);
        let as_dims = |v: &[i64], rank: usize| -> R<Vec<usize>> {
            v.iter().map(|&d| usize::try_from(d).ok().filter(|&d| d < rank).ok_or("bad dot dimension".into())).collect()
        };
        let (lb, lc) = (as_dims(&dd.lhs_batch, ld.len())?, as_dims(&dd.lhs_contracting, ld.len())?);
        let (rb, rc) = (as_dims(&dd.rhs_batch, rd.len())?, as_dims(&dd.rhs_contracting, rd.len())?);
        if lb.len() != rb.len() || lc.len() != rc.len() {
            return Err("bad dot dimension numbers".into());
        }
        let lfree: Vec<usize> = (0..ld.len()).filter(|d| !lb.contains(d) && !lc.contains(d)).collect();
        let rfree: Vec<usize> = (0..rd.len()).filter(|d| !rb.contains(d) && !rc.contains(d)).collect();
        if lb.len() + lfree.len() + rfree.len() != dims.len() {
            return Err("dot result rank".into());
        }
        *decls += &self.in_ptr(0, lt)?;
        *decls += &self.in_ptr(1, rt)?;
        // Accumulator: f64 if any side is f64, else f32 if any is a float, else i64 (wrapping).
        let any = |t: T| [l.ty, r.ty, out.ty].contains(&t);
        let float = [lt, rt, ot].iter().any(|t| t.is_float());
        let (acc_t, acc) = if any(T::F64) {
            (Ty { ty: T::F64 }, "double")
        } else if float {
            (Ty { ty: T::F32 }, "float")
        } else {
            (Ty { ty: T::S64 }, "s64")
        };
        body.push_str(&Self::decompose(dims));
        let mut li = vec![String::new(); ld.len()];
        let mut ri = vec![String::new(); rd.len()];
        let mut o = 0;
        for (&a, &b) in lb.iter().zip(&rb) {
            li[a] = format!("o{o}");
            ri[b] = format!("o{o}");
            o += 1;
        }
        for &a in &lfree {
            li[a] = format!("o{o}");
            o += 1;
        }
        for &b in &rfree {
            ri[b] = format!("o{o}");
            o += 1;
        }
        let _ = writeln!(body, "    {acc} s = 0;");
        for (j, (&a, &b)) in lc.iter().zip(&rc).enumerate() {
            if ld[a] != rd[b] {
                return Err("dot contracting dimensions differ".into());
            }
            li[a] = format!("c{j}");
            ri[b] = format!("c{j}");
            let _ = writeln!(body, "    for (u64 c{j} = 0; c{j} < {}ull; ++c{j})", ld[a]);
        }
        let x = convert(lt, acc_t, &lt.load(&format!("in0[{}]", linear(&li, &strides(&ld)))));
        let y = convert(rt, acc_t, &rt.load(&format!("in1[{}]", linear(&ri, &strides(&rd)))));
        let _ = writeln!(body, "    s = op_add(s, op_mul(({acc}){x}, ({acc}){y}));");
        let _ = writeln!(body, "    out[i] = {};", ot.store(&convert(acc_t, ot, "s")));
        Ok(())
    }
}

#[cfg(test)]
#[path = "codegen_tests.rs"]
mod tests;
