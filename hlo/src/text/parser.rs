//! Module structure: header, computations, instructions, shapes, and the second pass that resolves operand,
//! control-predecessor and computation names.

use std::collections::HashMap;

use cranelift_entity::PrimaryMap;

use super::attrs::{self, CallSlot, Pending};
use super::cursor::{Cursor, MAX_DEPTH, PResult};
use super::literal;
use crate::ir::{Attrs, CompId, Computation, InstrId, Instruction, Module, ModuleConfig};
use crate::opcode::Opcode;
use crate::types::{ArrayShape, PrimitiveType, Shape};

/// Most dimensions an array shape may have.
pub(crate) const MAX_RANK: usize = 32;

/// Sections of XLA's stack-frame index printed after the header of optimized modules (`FileNames`, `FunctionNames`,
/// `FileLocations`, `StackFrames`).
const FRAME_SECTIONS: [&str; 4] = ["FileNames", "FunctionNames", "FileLocations", "StackFrames"];

/// A name reference waiting for the second pass.
struct NameRef<'a> {
    name: &'a str,
    start: usize,
    end: usize,
}

pub(crate) fn parse_module(c: &mut Cursor<'_>) -> PResult<Module> {
    if c.at_eof() {
        c.check_comment()?;
        fail!(c, 0, 0, "empty input; expected 'HloModule <name>'");
    }
    let hm_start = c.pos;
    if !c.eat_kw("HloModule") {
        return Err(c.err_found("expected 'HloModule <name>' at the start of HLO text"));
    }
    let (_, name) = c.expect_name("expected a module name after 'HloModule'")?;
    let mut config = ModuleConfig { replica_count: 1, num_partitions: 1, ..Default::default() };
    while c.eat(b',') {
        attrs::header_attr(c, &mut config)?;
    }

    let mut instrs: PrimaryMap<InstrId, Instruction> = PrimaryMap::new();
    let mut comps: PrimaryMap<CompId, Computation> = PrimaryMap::new();
    let mut comp_names: HashMap<&str, CompId> = HashMap::new();
    let mut entry: Option<CompId> = None;
    let mut calls: Calls = Vec::new();

    while !c.at_eof() {
        if skip_frame_section(c)? {
            continue;
        }
        let comp_id = comps.next_key();
        let entry_start = c.pos;
        let is_entry = c.eat_kw("ENTRY");
        if is_entry && let Some(first) = entry {
            let first_name = comps.get(first).map_or("", |cm| cm.name.as_str());
            return Err(c.err_range(
                entry_start,
                entry_start + 5,
                &format!("second ENTRY computation; '{first_name}' is already the entry (expected exactly one)"),
            ));
        }
        let (comp, comp_calls, (ns, ne)) = parse_computation(c, comp_id, &mut instrs)?;
        let name: &str = c.slice(ns, ne);
        let name = name.strip_prefix('%').unwrap_or(name);
        if comp_names.contains_key(name) {
            fail!(c, ns, ne, "duplicate computation name '{name}'; expected each computation to have a unique name");
        }
        comp_names.insert(name, comp_id);
        calls.extend(comp_calls);
        comps.push(comp);
        if is_entry {
            entry = Some(comp_id);
        }
    }
    c.check_comment()?;

    let Some(entry) = entry else {
        let end = hm_start + "HloModule".len();
        fail!(c, hm_start, end, "module has no ENTRY computation; expected one computation marked 'ENTRY'");
    };

    // Second pass: called computations.
    for (id, refs) in calls {
        let mut slots: Vec<(CallSlot, CompId)> = Vec::with_capacity(refs.len());
        for (slot, name, start, end) in refs {
            let Some(&target) = comp_names.get(name) else {
                fail!(c, start, end, "unknown computation '{name}'; expected the name of a computation in this module");
            };
            slots.push((slot, target));
        }
        // Stable sort keeps branch_computations in their written order.
        slots.sort_by_key(|(slot, _)| *slot);
        if let Some(instr) = instrs.get_mut(id) {
            instr.called = slots.into_iter().map(|(_, t)| t).collect();
        }
    }

    Ok(Module { name: name.to_owned(), config, comps, instrs, entry, source_name: c.file.to_owned() })
}

/// Skips a stack-frame index section; returns false if the next token is not one.
fn skip_frame_section(c: &mut Cursor<'_>) -> PResult<bool> {
    let save = c.pos;
    let Some((_, kw)) = c.ident() else { return Ok(false) };
    if !FRAME_SECTIONS.contains(&kw) || matches!(c.peek(), Some(b'{' | b'(')) {
        c.pos = save;
        return Ok(false);
    }
    // Entries: `N "string"` or `N {key=value ...}`.
    while c.peek().is_some_and(|b| b.is_ascii_digit()) {
        c.int("a stack-frame index entry number")?;
        match c.peek() {
            Some(b'"') => {
                c.string()?;
            }
            Some(b'{') => {
                c.balanced()?;
            }
            _ => return Err(c.err_found("expected a quoted string or '{...}' in the stack-frame index")),
        }
    }
    Ok(true)
}

/// An operand: a name resolved at the end of the computation, or a nested instruction.
enum OpRef<'a> {
    Name(NameRef<'a>),
    Id(InstrId),
}

struct PendingInstr<'a> {
    id: InstrId,
    operands: Vec<OpRef<'a>>,
    pending: Pending<'a>,
}

/// The right-hand side of an instruction: `shape opcode(operands), attrs...`.
struct Rhs<'a> {
    shape: Shape,
    opcode: Opcode,
    attrs: Attrs,
    operands: Vec<OpRef<'a>>,
    pending: Pending<'a>,
    param: Option<(i64, usize, usize)>,
}

/// Per-computation state while its instructions are read.
struct CompBuilder<'a> {
    comp_id: CompId,
    name: &'a str,
    ids: Vec<InstrId>,
    by_name: HashMap<String, InstrId>,
    pendings: Vec<PendingInstr<'a>>,
    params: Vec<(i64, InstrId, usize, usize)>,
    nested_count: usize,
}

impl<'a> CompBuilder<'a> {
    fn push(
        &mut self,
        instrs: &mut PrimaryMap<InstrId, Instruction>,
        name: String,
        span: crate::Span,
        rhs: Rhs<'a>,
    ) -> InstrId {
        let id = instrs.push(Instruction {
            name: name.clone(),
            opcode: rhs.opcode,
            shape: rhs.shape,
            operands: Vec::new(),
            called: Vec::new(),
            attrs: rhs.attrs,
            parent: self.comp_id,
            span: Some(span),
        });
        if let Some((n, s, e)) = rhs.param {
            self.params.push((n, id, s, e));
        }
        self.by_name.insert(name, id);
        self.ids.push(id);
        self.pendings.push(PendingInstr { id, operands: rhs.operands, pending: rhs.pending });
        id
    }

    /// `shape opcode(operands)` and, when `allow_attrs`, `, key=value...`.
    fn rhs(
        &mut self,
        c: &mut Cursor<'a>,
        instrs: &mut PrimaryMap<InstrId, Instruction>,
        depth: u32,
        allow_attrs: bool,
    ) -> PResult<Rhs<'a>> {
        let shape = parse_shape(c, 0)?;
        let (op_start, opname) = c.expect_ident("expected an opcode after the instruction's shape")?;
        let Some(opcode) = Opcode::from_name(opname) else {
            fail!(c, op_start, c.pos, "unknown opcode '{opname}'; expected an HLO opcode");
        };
        c.expect(b'(', &format!("to open the operand list of '{opname}'"))?;
        let mut attrs_v = Attrs::default();
        let mut operands: Vec<OpRef<'a>> = Vec::new();
        let mut param = None;
        match opcode {
            Opcode::Parameter => {
                c.ws();
                let ns = c.pos;
                let n = c.uint("a parameter number")?;
                param = Some((n, ns, c.pos));
                attrs_v.parameter_number = Some(n);
                c.expect(b')', "to close 'parameter(N)'")?;
            }
            Opcode::Constant => {
                attrs_v.literal = Some(literal::parse_constant(c, &shape)?);
                c.expect(b')', "to close the constant literal")?;
            }
            _ => operands = c.list(b')', "or ',' in the operand list", |c, _| self.operand(c, instrs, depth))?,
        }
        let mut pending = Pending::default();
        let mut seen: Vec<&'a str> = Vec::new();
        while allow_attrs && c.eat(b',') {
            let (kstart, key) = c.expect_ident("expected an attribute name after ','")?;
            let kend = c.pos;
            if seen.contains(&key) {
                fail!(c, kstart, kend, "duplicate attribute '{key}'; expected each attribute once");
            }
            seen.push(key);
            c.expect(b'=', &format!("after attribute name '{key}'"))?;
            attrs::instr_attr(c, key, opcode, &mut attrs_v, &mut pending)?;
        }
        Ok(Rhs { shape, opcode, attrs: attrs_v, operands, pending, param })
    }

    /// `name`, `shape name`, or a nested instruction `shape opcode(operands)`.
    fn operand(
        &mut self,
        c: &mut Cursor<'a>,
        instrs: &mut PrimaryMap<InstrId, Instruction>,
        depth: u32,
    ) -> PResult<OpRef<'a>> {
        c.ws();
        let start = c.pos;
        if c.raw_peek() == Some(b'(') || starts_with_type(c) {
            parse_shape(c, 0)?;
            // A nested instruction: an opcode directly followed by '('.
            let save = c.pos;
            if let Some((_, word)) = c.ident()
                && c.peek() == Some(b'(')
                && Opcode::from_name(word).is_some()
            {
                if depth >= MAX_DEPTH {
                    fail!(c, start, c.pos, "instructions nested too deeply (more than {MAX_DEPTH} levels)");
                }
                c.pos = start;
                let rhs = self.rhs(c, instrs, depth + 1, false)?;
                let mut name = format!("{}.nested{}", rhs.opcode.name(), self.nested_count);
                while self.by_name.contains_key(&name) {
                    self.nested_count += 1;
                    name = format!("{}.nested{}", rhs.opcode.name(), self.nested_count);
                }
                self.nested_count += 1;
                let span = c.span(start, c.pos);
                return Ok(OpRef::Id(self.push(instrs, name, span, rhs)));
            }
            c.pos = save;
        }
        let (ostart, oname) = c.expect_name("expected an operand name")?;
        Ok(OpRef::Name(NameRef { name: oname, start: ostart, end: c.pos }))
    }
}

type Calls<'a> = Vec<(InstrId, Vec<(CallSlot, &'a str, usize, usize)>)>;

fn parse_computation<'a>(
    c: &mut Cursor<'a>,
    comp_id: CompId,
    instrs: &mut PrimaryMap<InstrId, Instruction>,
) -> PResult<(Computation, Calls<'a>, (usize, usize))> {
    let (name_start, name) = c.expect_name("expected a computation name (or 'ENTRY')")?;
    let name_end = c.pos;
    let comp_span = c.span(name_start, name_end);
    if c.peek() == Some(b'(') {
        // Signature `(p0: f32[4], ...) -> shape`, informational only.
        c.balanced()?;
        if !c.eat_str("->") {
            return Err(c.err_found("expected '->' and the result shape after the computation's parameter list"));
        }
        parse_shape(c, 0)?;
    }
    // Computation attributes such as `, execution_thread="parallel"` (ignored).
    while c.eat(b',') {
        if c.ident().is_none() {
            return Err(c.err_found("expected a computation attribute name after ','"));
        }
        c.expect(b'=', "after the computation attribute name")?;
        match c.peek() {
            Some(b'"') => {
                c.string()?;
            }
            _ => {
                if c.ident().is_none() {
                    return Err(c.err_found("expected a quoted string or a word as the computation attribute value"));
                }
            }
        }
    }
    c.expect(b'{', &format!("to open the body of computation '{name}'"))?;

    let mut b = CompBuilder {
        comp_id,
        name,
        ids: Vec::new(),
        by_name: HashMap::new(),
        pendings: Vec::new(),
        params: Vec::new(),
        nested_count: 0,
    };
    let mut root: Option<(InstrId, usize)> = None;

    while !c.eat(b'}') {
        if c.at_eof() {
            return Err(c.err_found(&format!("expected an instruction or '}}' to close computation '{name}'")));
        }
        let root_start = c.pos;
        let is_root = c.eat_kw("ROOT");
        let (istart, iname) = c.expect_name("expected an instruction name or '}'")?;
        let iend = c.pos;
        if b.by_name.contains_key(iname) {
            return Err(c.err_range(
                istart,
                iend,
                &format!("duplicate instruction name '{iname}' in computation '{name}'; expected unique names"),
            ));
        }
        c.expect(b'=', &format!("after instruction name '{iname}'"))?;
        let rhs = b.rhs(c, instrs, 0, true)?;
        if is_root && let Some((_, first)) = root {
            return Err(c.err_range(
                root_start,
                root_start + 4,
                &format!("second ROOT instruction in computation '{name}' (first at {}); expected one", c.loc(first)),
            ));
        }
        let id = b.push(instrs, iname.to_owned(), c.span(istart, iend), rhs);
        if is_root {
            root = Some((id, root_start));
        }
    }

    let Some(&last) = b.ids.last() else {
        fail!(c, name_start, name_end, "computation '{name}' has no instructions; expected at least one");
    };
    let root = root.map_or(last, |(r, _)| r);

    // Parameters must be numbered 0..n without gaps or repeats.
    let mut params = std::mem::take(&mut b.params);
    params.sort_by_key(|p| p.0);
    let mut param_ids = Vec::with_capacity(params.len());
    for (i, &(n, pid, ps, pe)) in params.iter().enumerate() {
        if n != i as i64 {
            let msg = if n < i as i64 {
                format!(
                    "duplicate parameter number {n} in computation '{name}'; expected each of 0..{} once",
                    params.len()
                )
            } else {
                format!(
                    "parameter numbers of computation '{name}' have a gap: parameter({i}) is missing; expected 0..{}",
                    params.len()
                )
            };
            return Err(c.err_range(ps, pe, &msg));
        }
        param_ids.push(pid);
    }

    // Resolve operands (defined earlier) and control predecessors (anywhere in the computation).
    let mut calls = Vec::new();
    for p in std::mem::take(&mut b.pendings) {
        let mut ops = Vec::with_capacity(p.operands.len());
        for r in &p.operands {
            let r = match r {
                OpRef::Id(id) => {
                    ops.push(*id);
                    continue;
                }
                OpRef::Name(r) => r,
            };
            match b.by_name.get(r.name) {
                Some(&o) if o < p.id => ops.push(o),
                Some(_) => {
                    fail!(
                        c,
                        r.start,
                        r.end,
                        "operand '{}' is used before its definition; expected operands defined earlier",
                        r.name
                    );
                }
                None => {
                    return Err(c.err_range(
                        r.start,
                        r.end,
                        &format!("undefined operand '{}'; expected an instruction of computation '{}'", r.name, b.name),
                    ));
                }
            }
        }
        let mut preds = Vec::with_capacity(p.pending.control.len());
        for &(pname, s, e) in &p.pending.control {
            let Some(&o) = b.by_name.get(pname) else {
                return Err(c.err_range(
                    s,
                    e,
                    &format!("unknown control predecessor '{pname}'; expected an instruction of computation '{name}'"),
                ));
            };
            preds.push(o);
        }
        if let Some(instr) = instrs.get_mut(p.id) {
            instr.operands = ops;
            instr.attrs.control_predecessors = preds;
        }
        if !p.pending.calls.is_empty() {
            calls.push((p.id, p.pending.calls));
        }
    }

    let comp = Computation { name: name.to_owned(), instrs: b.ids, params: param_ids, root, span: Some(comp_span) };
    Ok((comp, calls, (name_start, name_end)))
}

/// Whether the next token is an element type followed by `[` (an inline operand shape).
fn starts_with_type(c: &Cursor<'_>) -> bool {
    let mut end = c.pos;
    while c.byte_at(end).is_some_and(|b| b.is_ascii_alphanumeric()) {
        end += 1;
    }
    c.byte_at(end) == Some(b'[') && PrimitiveType::from_name(c.slice(c.pos, end)).is_some()
}

/// A shape: `f32[2,3]{1,0}`, `pred[]`, `token[]`, `(s32[], f32[2])`, `()`.
pub(crate) fn parse_shape(c: &mut Cursor<'_>, depth: u32) -> PResult<Shape> {
    c.ws();
    if depth >= MAX_DEPTH {
        return Err(c.err_found(&format!("shape nested too deeply (more than {MAX_DEPTH} levels)")));
    }
    if c.eat(b'(') {
        return Ok(Shape::Tuple(c.list(b')', "or ',' in the tuple shape", |c, _| parse_shape(c, depth + 1))?));
    }
    let (tstart, tname) = c.expect_ident("expected a shape (e.g. f32[2,3] or a tuple)")?;
    let tend = c.pos;
    let Some(ty) = PrimitiveType::from_name(tname) else {
        fail!(c, tstart, tend, "unknown element type '{tname}'; expected a type such as f32, s32, pred");
    };
    if c.raw_peek() != Some(b'[') {
        return Err(c.err_found(&format!("expected '[' and the dimensions after element type '{tname}'")));
    }
    c.pos += 1;
    let dims = c.list(b']', "or ',' in the dimension list", |c, i| {
        c.ws();
        let dstart = c.pos;
        if c.raw_peek() == Some(b'?') || (c.raw_peek() == Some(b'<') && c.byte_at(c.pos + 1) == Some(b'=')) {
            let end = if c.raw_peek() == Some(b'?') { dstart + 1 } else { dstart + 2 };
            fail!(c, dstart, end, "dynamic dimensions are not supported; expected a static size");
        }
        let d = c.uint("a dimension size")?;
        if i >= MAX_RANK {
            fail!(c, dstart, c.pos, "shape has more than {MAX_RANK} dimensions");
        }
        Ok(d)
    })?;
    // Total bytes must be representable (so size arithmetic downstream cannot overflow).
    let elems = dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d));
    let bytes = elems.and_then(|n| n.checked_mul(ty.byte_size().max(1) as i64));
    if bytes.is_none() {
        fail!(c, tstart, c.pos, "shape is too large: its size overflows a 64-bit byte count");
    }
    // A layout must follow the `]` directly (a `{` after a space opens a computation body).
    let mut layout = None;
    if c.raw_peek() == Some(b'{') {
        c.pos += 1;
        let mut m2m = Vec::new();
        c.ws();
        if c.raw_peek().is_some_and(|b| b.is_ascii_digit()) {
            loop {
                let ls = c.pos;
                let v = c.uint("a layout dimension")?;
                if m2m.len() >= MAX_RANK {
                    fail!(c, ls, c.pos, "layout has more than {MAX_RANK} entries");
                }
                m2m.push(v);
                if !c.eat(b',') {
                    break;
                }
            }
        }
        if c.eat(b':') {
            // Tiling / memory-space suffix (`:T(8,128)S(1)`): skipped.
            skip_until_close_brace(c)?;
        } else {
            c.expect(b'}', "to close the layout")?;
        }
        layout = Some(m2m);
    }
    if ty == PrimitiveType::Token {
        if !dims.is_empty() {
            fail!(c, tstart, c.pos, "token shapes have no dimensions; expected token[]");
        }
        return Ok(Shape::Token);
    }
    Ok(Shape::Array(ArrayShape { ty, dims, layout }))
}

/// Skips to just past the `}` that closes the current layout, over nested brackets.
fn skip_until_close_brace(c: &mut Cursor<'_>) -> PResult<()> {
    let start = c.pos;
    let mut depth = 0u32;
    loop {
        match c.raw_peek() {
            None | Some(b'\n') => {
                return Err(c.err_range(start, start + 1, "unterminated layout; expected '}'"));
            }
            Some(b'(' | b'[' | b'{') => depth += 1,
            Some(b')' | b']') => depth = depth.saturating_sub(1),
            Some(b'}') => {
                if depth == 0 {
                    c.pos += 1;
                    return Ok(());
                }
                depth -= 1;
            }
            _ => {}
        }
        c.pos += 1;
    }
}
