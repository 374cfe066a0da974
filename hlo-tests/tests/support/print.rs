//! HLO text printer (test code: the golden filetests and the front ends' round trips): writes a [`Module`] in XLA's
//! text syntax, as `HloModule::ToString()` prints it (`%` names, computation signatures, callees before callers, `ENTRY`
//! last), so that [`hlo::parse_text`] reads it back to the same IR. Golden tests of HLO rewrites compare this text, so it is deterministic: attributes come in one fixed order
//! (XLA's, for the attributes XLA has) and maps print sorted.
//!
//! What the IR keeps verbatim (`metadata`, braced `backend_config`, attributes in
//! [`Attrs::other`](hlo::Attrs::other)) prints verbatim. Constants always print in full (XLA elides large ones as
//! `{...}`, which does not parse), with the shortest decimal that reads back to the same bits. A tiled sharding whose
//! devices are an iota (possibly transposed) prints in the compact `<=[..]T(..)` form XLA uses.

use std::fmt;

use cranelift_entity::EntityRef as _;

use hlo::print::{int_list, join, pct, shape_without_layout};
use hlo::text::{F8Format, is_braced_group, is_ident_char, is_ident_start};
use hlo::{Array, CompId, InstrId, Instruction, IotaReplicaGroups, Literal, Module, Opcode, PrimitiveType, Sharding};

/// What to print beyond the IR's structure.
#[derive(Clone, Debug)]
pub struct PrintOptions {
    /// Print `metadata={...}` (default true). Golden tests may turn it off to keep the expected text short; the text
    /// then no longer round-trips the metadata.
    pub metadata: bool,
    /// Print each operand's shape before its name, as XLA's default `ToString` does: `add(f32[] %a, f32[] %b)`. Default
    /// false: `add(%a, %b)`, the form JAX's dumps use.
    pub operand_shapes: bool,
}

impl Default for PrintOptions {
    fn default() -> Self {
        PrintOptions { metadata: true, operand_shapes: false }
    }
}

/// The module as HLO text, with default options.
pub fn module_text(m: &Module) -> String {
    module_text_with(m, &PrintOptions::default())
}

/// The module as HLO text.
pub fn module_text_with(m: &Module, opts: &PrintOptions) -> String {
    let p = Printer { m, opts };
    let mut out = p.header();
    for c in computation_order(m) {
        out.push_str("\n\n");
        p.computation(&mut out, c);
    }
    out.push('\n');
    out
}

/// Computations in printing order: every computation after the computations it calls (depth first, in the order
/// instructions call them), computations nobody calls in module order, and the entry last.
pub fn computation_order(m: &Module) -> Vec<CompId> {
    let callees = |c: CompId| -> Vec<CompId> {
        let Some(comp) = m.comps.get(c) else { return Vec::new() };
        comp.instrs.iter().filter_map(|&i| m.instrs.get(i)).flat_map(|i| i.called.iter().copied()).collect()
    };
    let mut called = vec![false; m.comps.len()];
    for c in m.comps.keys() {
        for callee in callees(c) {
            if let Some(x) = called.get_mut(callee.index()) {
                *x = true;
            }
        }
    }
    // Roots first, then anything a cycle (unverified input) kept out of reach.
    let roots: Vec<CompId> = m
        .comps
        .keys()
        .filter(|&c| c != m.entry && !called[c.index()])
        .chain(m.comps.keys().filter(|&c| c != m.entry))
        .chain(std::iter::once(m.entry))
        .collect();
    // 0: not seen, 1: on the stack, 2: placed.
    let mut state = vec![0u8; m.comps.len()];
    let mut order = Vec::with_capacity(m.comps.len());
    for root in roots {
        if state.get(root.index()) != Some(&0) {
            continue;
        }
        // An explicit stack: call chains may be deeper than the native stack allows.
        let mut stack: Vec<(CompId, Vec<CompId>, usize)> = vec![(root, callees(root), 0)];
        state[root.index()] = 1;
        while let Some((c, cs, next)) = stack.last_mut() {
            if let Some(&callee) = cs.get(*next) {
                *next += 1;
                // The entry waits for its own turn, so that it prints last.
                if callee != m.entry && state.get(callee.index()) == Some(&0) {
                    state[callee.index()] = 1;
                    let cc = callees(callee);
                    stack.push((callee, cc, 0));
                }
            } else {
                let c = *c;
                state[c.index()] = 2;
                order.push(c);
                stack.pop();
            }
        }
    }
    order
}

struct Printer<'a> {
    m: &'a Module,
    opts: &'a PrintOptions,
}

/// A double-quoted string with the escapes the parser reads back, as XLA's `CEscape` writes them (`\"`, `\\`, `\n`,
/// `\t`, `\r`, octal `\ooo` for other control characters). Other characters, UTF-8 included, print as is.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\{:03o}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A value XLA writes bare when it lexes as one `{...}` group (JSON-like configs), quoted otherwise.
fn braced_or_quoted(s: &str) -> String {
    if is_braced_group(s) { s.to_owned() } else { quote(s) }
}

/// `{key="value",key2={...}}`, sorted by key, as XLA prints frontend attributes.
fn frontend_attributes(map: &std::collections::BTreeMap<String, String>) -> String {
    let is_ident = |k: &str| k.bytes().next().is_some_and(is_ident_start) && k.bytes().all(is_ident_char);
    let entries: Vec<String> = map
        .iter()
        .map(|(k, v)| {
            let key = if is_ident(k) { k.clone() } else { quote(k) };
            format!("{key}={}", braced_or_quoted(v))
        })
        .collect();
    format!("{{{}}}", entries.join(","))
}

/// Order of instruction attributes: XLA's (opcode-specific ones, called computations, sharding, frontend attributes,
/// control predecessors, metadata, backend config). Keys XLA does not have, or Peerless does not know, go after the
/// opcode-specific ones, by name.
const ATTR_ORDER: &[&str] = &[
    "index",
    "kind",
    "custom_call_target",
    "channel_id",
    "replica_groups",
    "constrain_layout",
    "dimensions",
    "use_global_device_ids",
    "source_target_pairs",
    "offset_dims",
    "collapsed_slice_dims",
    "start_index_map",
    "operand_batching_dims",
    "start_indices_batching_dims",
    "update_window_dims",
    "inserted_window_dims",
    "scatter_dims_to_operand_dims",
    "input_batching_dims",
    "scatter_indices_batching_dims",
    "index_vector_dim",
    "slice_sizes",
    "indices_are_sorted",
    "unique_indices",
    "iota_dimension",
    "direction",
    "type",
    "slice",
    "dynamic_slice_sizes",
    "padding",
    "window",
    "dim_labels",
    "feature_group_count",
    "batch_group_count",
    "lhs_batch_dims",
    "lhs_contracting_dims",
    "rhs_batch_dims",
    "rhs_contracting_dims",
    "operand_precision",
    "sparsity",
    "is_stable",
    "exponent_bits",
    "mantissa_bits",
    "k",
    "largest",
    "distribution",
    "algorithm",
    "fft_type",
    "fft_length",
    "is_host_transfer",
    "operand_layout_constraints",
    "custom_call_has_side_effect",
    "output_to_operand_aliasing",
    "padding_type",
    "literal",
    "schedule",
    "api_version",
    // Unknown keys sort here.
    "to_apply",
    "calls",
    "condition",
    "body",
    "true_computation",
    "false_computation",
    "branch_computations",
    "select",
    "scatter",
    "called_computations",
    "sharding",
    "frontend_attributes",
    "control-predecessors",
    "statistics",
    "metadata",
    "backend_config",
    "original_value",
];

fn attr_rank(op: Opcode, key: &str) -> usize {
    let pos = |k: &str| ATTR_ORDER.iter().position(|&x| x == k);
    // reduce-scatter prints all-reduce's attributes (use_global_device_ids) before its own dimension; all-gather the
    // other way round.
    if op == Opcode::ReduceScatter && key == "use_global_device_ids" {
        return pos("dimensions").map_or(0, |p| 2 * p - 1);
    }
    match pos(key) {
        Some(p) => 2 * p,
        None => pos("api_version").map_or(0, |p| 2 * p + 1),
    }
}

/// The header keys XLA prints before `entry_computation_layout`, and the ones after.
const HEADER_FIRST: &[&str] = &["is_scheduled", "input_output_alias", "buffer_donor", "alias_passthrough_params"];

impl Printer<'_> {
    fn header(&self) -> String {
        let m = self.m;
        let mut out = format!("HloModule {}", m.name.strip_prefix('%').unwrap_or(&m.name));
        let other = &m.config.other;
        for k in HEADER_FIRST {
            if let Some(v) = other.get(*k) {
                out.push_str(&format!(", {k}={v}"));
            }
        }
        if let Some(l) = &m.config.entry_computation_layout {
            out.push_str(&format!(", entry_computation_layout={{{l}}}"));
        }
        for (k, v) in other.iter().filter(|(k, _)| !HEADER_FIRST.contains(&k.as_str())) {
            out.push_str(&format!(", {k}={v}"));
        }
        if m.config.replica_count != 1 {
            out.push_str(&format!(", replica_count={}", m.config.replica_count));
        }
        if m.config.num_partitions != 1 {
            out.push_str(&format!(", num_partitions={}", m.config.num_partitions));
        }
        if !m.config.frontend_attributes.is_empty() {
            out.push_str(&format!(", frontend_attributes={}", frontend_attributes(&m.config.frontend_attributes)));
        }
        out
    }

    fn computation(&self, out: &mut String, c: CompId) {
        let m = self.m;
        let Some(comp) = m.comps.get(c) else { return };
        if c == m.entry {
            out.push_str("ENTRY ");
        }
        let params: Vec<String> = comp
            .params
            .iter()
            .filter_map(|&p| m.instrs.get(p))
            .map(|p| format!("{}: {}", p.name.strip_prefix('%').unwrap_or(&p.name), shape_without_layout(&p.shape)))
            .collect();
        let result = m.instrs.get(comp.root).map_or_else(String::new, |r| shape_without_layout(&r.shape));
        out.push_str(&format!("{} ({}) -> {result} {{\n", pct(&comp.name), params.join(", ")));
        for &id in &comp.instrs {
            let Some(ins) = m.instrs.get(id) else { continue };
            out.push_str(if id == comp.root { "  ROOT " } else { "  " });
            self.instruction(out, ins);
            out.push('\n');
        }
        out.push('}');
    }

    fn name_of(&self, id: InstrId) -> String {
        self.m.instrs.get(id).map_or_else(|| format!("%<invalid {id}>"), |i| pct(&i.name))
    }

    fn comp_name(&self, c: CompId) -> String {
        self.m.comps.get(c).map_or_else(|| format!("%<invalid {c}>"), |c| pct(&c.name))
    }

    fn instruction(&self, out: &mut String, ins: &Instruction) {
        out.push_str(&format!("{} = {} {}(", pct(&ins.name), ins.shape, ins.opcode));
        let a = &ins.attrs;
        match ins.opcode {
            Opcode::Parameter => out.push_str(&a.parameter_number.unwrap_or(0).to_string()),
            Opcode::Constant => {
                if let Some(l) = &a.literal {
                    literal_text(out, l);
                }
            }
            _ => {
                let ops: Vec<String> = ins
                    .operands
                    .iter()
                    .map(|&o| {
                        let name = self.name_of(o);
                        match self.m.instrs.get(o) {
                            Some(op) if self.opts.operand_shapes => format!("{} {name}", op.shape),
                            _ => name,
                        }
                    })
                    .collect();
                out.push_str(&ops.join(", "));
            }
        }
        out.push(')');
        let mut attrs = self.attributes(ins);
        attrs.sort_by_key(|(k, _)| attr_rank(ins.opcode, k));
        for (k, v) in attrs {
            out.push_str(&format!(", {k}={v}"));
        }
    }

    /// Every attribute of `ins` as (key, text), unordered.
    fn attributes(&self, ins: &Instruction) -> Vec<(String, String)> {
        let a = &ins.attrs;
        let mut v: Vec<(String, String)> = Vec::new();
        let mut push = |k: &str, val: String| v.push((k.to_owned(), val));
        if let Some(i) = a.tuple_index {
            push("index", i.to_string());
        }
        if let Some(d) = &a.dimensions {
            push("dimensions", int_list(d));
        }
        if let Some(rg) = &a.replica_groups {
            push("replica_groups", rg.to_string());
        }
        if let Some(c) = a.channel_id {
            push("channel_id", c.to_string());
        }
        if a.use_global_device_ids {
            push("use_global_device_ids", "true".into());
        }
        if let Some(s) = &a.slice {
            // XLA writes every stride when any is not 1.
            let unit = s.iter().all(|d| d.stride == 1);
            let stride = |d: i64| if unit { String::new() } else { format!(":{d}") };
            let dims: Vec<String> =
                s.iter().map(|d| format!("[{}:{}{}]", d.start, d.limit, stride(d.stride))).collect();
            push("slice", format!("{{{}}}", dims.join(", ")));
        }
        if let Some(s) = &a.dynamic_slice_sizes {
            push("dynamic_slice_sizes", int_list(s));
        }
        if let Some(p) = &a.padding {
            // XLA writes the interior padding of every dimension when any has one.
            let interior = p.iter().any(|d| d.interior != 0);
            let interior = |i: i64| if interior { format!("_{i}") } else { String::new() };
            let dims: Vec<String> = p.iter().map(|d| format!("{}_{}{}", d.lo, d.hi, interior(d.interior))).collect();
            push("padding", dims.join("x"));
        }
        if let Some(p) = &a.source_target_pairs {
            let pairs: Vec<String> = p.iter().map(|(s, t)| format!("{{{s},{t}}}")).collect();
            push("source_target_pairs", format!("{{{}}}", pairs.join(",")));
        }
        if let Some(t) = &a.custom_call_target {
            push("custom_call_target", quote(t));
        }
        if let Some(d) = a.comparison_direction {
            push("direction", d.name().into());
        }
        if let Some(t) = &a.comparison_type {
            push("type", t.clone());
        }
        if let Some(d) = a.iota_dimension {
            push("iota_dimension", d.to_string());
        }
        if let Some(d) = &a.dot {
            // XLA leaves out empty batch dimensions, never the contracting ones.
            if !d.lhs_batch.is_empty() {
                push("lhs_batch_dims", int_list(&d.lhs_batch));
            }
            push("lhs_contracting_dims", int_list(&d.lhs_contracting));
            if !d.rhs_batch.is_empty() {
                push("rhs_batch_dims", int_list(&d.rhs_batch));
            }
            push("rhs_contracting_dims", int_list(&d.rhs_contracting));
        }
        for (k, val) in &a.other {
            push(k, val.clone());
        }
        for (k, val) in self.called(ins) {
            push(k, val);
        }
        if let Some(s) = &a.sharding {
            push("sharding", sharding_text(s));
        }
        if !a.frontend_attributes.is_empty() {
            push("frontend_attributes", frontend_attributes(&a.frontend_attributes));
        }
        if !a.control_predecessors.is_empty() {
            let names: Vec<String> = a.control_predecessors.iter().map(|&p| self.name_of(p)).collect();
            push("control-predecessors", format!("{{{}}}", names.join(", ")));
        }
        if let Some(md) = a.metadata.as_ref().filter(|_| self.opts.metadata) {
            push("metadata", md.clone());
        }
        if let Some(b) = &a.backend_config {
            push("backend_config", braced_or_quoted(b));
        }
        v
    }

    /// The called computations under the attribute names XLA gives them for the opcode (the IR keeps them in one list,
    /// in the parser's slot order, which these names restore).
    fn called(&self, ins: &Instruction) -> Vec<(&'static str, String)> {
        let names: Vec<String> = ins.called.iter().map(|&c| self.comp_name(c)).collect();
        let list = |ns: &[String]| format!("{{{}}}", ns.join(", "));
        let one_or_list = |ns: &[String]| if ns.len() == 1 { ns[0].clone() } else { list(ns) };
        use Opcode::*;
        match (ins.opcode, names.as_slice()) {
            (_, []) => Vec::new(),
            (While, [c, b]) => vec![("condition", c.clone()), ("body", b.clone())],
            (SelectAndScatter, [s, sc]) => vec![("select", s.clone()), ("scatter", sc.clone())],
            (Conditional, [t, f]) if self.pred_operand(ins) => {
                vec![("true_computation", t.clone()), ("false_computation", f.clone())]
            }
            (Conditional, ns) => vec![("branch_computations", list(ns))],
            (
                Call | Map | ReduceWindow | Reduce | AllReduce | AllReduceStart | ReduceScatter | Scatter | TopK | Sort,
                ns,
            ) => vec![("to_apply", one_or_list(ns))],
            (CustomCall, ns) => vec![("called_computations", list(ns))],
            (_, ns) => vec![("calls", one_or_list(ns))],
        }
    }

    /// Whether the first operand is a `pred` (a conditional with true/false branches).
    fn pred_operand(&self, ins: &Instruction) -> bool {
        ins.operands
            .first()
            .and_then(|&o| self.m.instrs.get(o))
            .and_then(|o| o.shape.as_array())
            .is_some_and(|a| a.ty == PrimitiveType::Pred)
    }
}

/// A sharding as XLA prints it: `{replicated}`, `{maximal device=1}`, `{devices=[2,2]<=[4] last_tile_dim_replicate}`,
/// `{{..}, {..}}` for tuples.
pub fn sharding_text(s: &Sharding) -> String {
    match s {
        Sharding::Replicated => "{replicated}".into(),
        Sharding::Manual => "{manual}".into(),
        Sharding::Maximal { device } => format!("{{maximal device={device}}}"),
        Sharding::Tiled { tile_dims, devices, last_tile_dim_replicate, last_tile_dims } => {
            let mut t = format!("{{devices=[{}]", join(tile_dims, ","));
            match iota_form(tile_dims, devices) {
                Some((dims, perm)) => {
                    t.push_str(&format!("<=[{}]", join(&dims, ",")));
                    if !perm.is_empty() {
                        t.push_str(&format!("T({})", join(&perm, ",")));
                    }
                }
                None => t.push_str(&join(devices, ",")),
            }
            if *last_tile_dim_replicate {
                t.push_str(" last_tile_dim_replicate");
            }
            if !last_tile_dims.is_empty() {
                t.push_str(&format!(" last_tile_dims={{{}}}", last_tile_dims.join(", ")));
            }
            t.push('}');
            t
        }
        Sharding::Tuple(elems) => format!("{{{}}}", elems.iter().map(sharding_text).collect::<Vec<_>>().join(", ")),
        // The text front end keeps the braces; the proto one names the kind alone.
        Sharding::Other(raw) if raw.starts_with('{') => raw.clone(),
        Sharding::Other(raw) => format!("{{{raw}}}"),
    }
}

/// Tile assignments of up to this many non-trivial dimensions, and up to this many devices, are tried as transposed
/// iotas (each of up to 5! permutations is expanded and compared).
const MAX_IOTA_SEARCH_RANK: usize = 5;
const MAX_IOTA_SEARCH_DEVICES: usize = 1 << 12;

/// The canonical iota form (reshape dimensions, transpose permutation; empty when none) of a tile assignment whose
/// devices, in row-major order, are `transpose(iota(dims), perm)` reshaped to the tile dimensions, as XLA prints it:
/// dimensions of size 1 dropped and dimensions that stay adjacent after the transpose merged, so the identity is
/// `<=[n]`. `None` when the devices are no such iota.
fn iota_form(tile_dims: &[i64], devices: &[i64]) -> Option<(Vec<i64>, Vec<i64>)> {
    let n = devices.len() as i64;
    if devices.iter().enumerate().all(|(i, &d)| d == i as i64) {
        return Some((vec![n], Vec::new()));
    }
    let dims: Vec<i64> = tile_dims.iter().copied().filter(|&d| d != 1).collect();
    let product = dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d));
    if dims.len() > MAX_IOTA_SEARCH_RANK || devices.len() > MAX_IOTA_SEARCH_DEVICES || product != Some(n) {
        return None;
    }
    // Every permutation, in lexicographic order: reshape dims `r` with `r[perm[i]] = dims[i]`, so that the transposed
    // array has the tile's (non-trivial) dimensions.
    let k = dims.len();
    let mut perm: Vec<usize> = (0..k).collect();
    loop {
        let mut reshape = vec![0i64; k];
        for (i, &p) in perm.iter().enumerate() {
            reshape[p] = dims[i];
        }
        let iota = IotaReplicaGroups::devices(n, reshape.clone(), perm.iter().map(|&p| p as i64).collect());
        if iota.as_deref() == Some(devices) {
            return Some(canonical_iota(reshape, perm));
        }
        if !next_permutation(&mut perm) {
            return None;
        }
    }
}

/// Merges reshape dimensions that the permutation keeps adjacent and in order, until none are left; an identity
/// permutation is then left out.
fn canonical_iota(mut reshape: Vec<i64>, mut perm: Vec<usize>) -> (Vec<i64>, Vec<i64>) {
    while let Some(i) = (0..perm.len().saturating_sub(1)).find(|&i| perm[i + 1] == perm[i] + 1) {
        let d = perm[i];
        reshape[d] *= reshape[d + 1];
        reshape.remove(d + 1);
        perm.remove(i + 1);
        for p in &mut perm {
            if *p > d {
                *p -= 1;
            }
        }
    }
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        perm.clear();
    }
    (reshape, perm.into_iter().map(|p| p as i64).collect())
}

/// The next permutation in lexicographic order; false after the last one.
fn next_permutation(p: &mut [usize]) -> bool {
    let Some(i) = (0..p.len().saturating_sub(1)).rev().find(|&i| p[i] < p[i + 1]) else { return false };
    let Some(j) = (i + 1..p.len()).rev().find(|&j| p[j] > p[i]) else { return false };
    p.swap(i, j);
    p[i + 1..].reverse();
    true
}

/// A constant's payload as XLA writes it on one line: `1`, `{1, 2}`, `{ { 1, 2 }, { 3, 4 } }`, tuples `( 1, {2, 3} )`;
/// `pred` arrays as `{1, 0}` (a scalar as `true`).
pub fn literal_text(out: &mut String, l: &Literal) {
    match l {
        Literal::Array(a) => array_text(out, a),
        Literal::Tuple(t) => {
            out.push_str("( ");
            for (i, e) in t.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                literal_text(out, e);
            }
            out.push_str(if t.is_empty() { ")" } else { " )" });
        }
        // Not expressible in HLO text (the parser rejects token constants).
        Literal::Token => {}
    }
}

fn array_text(out: &mut String, a: &Array) {
    let size = a.ty().byte_size().max(1);
    // XLA writes the elements of a `pred` array as 1 and 0, "so that the string is more dense".
    let dense_pred = a.ty() == PrimitiveType::Pred && !a.dims().is_empty();
    let mut elems = a
        .data
        .chunks_exact(size)
        .map(|b| if dense_pred { u8::from(le::<1>(b)[0] != 0).to_string() } else { element_text(a.ty(), b) });
    if a.data.len() != a.shape.byte_size() {
        // Only a hand-built array can disagree with its shape: print XLA's elided form, which the parser rejects with a
        // clear message.
        out.push_str("{...}");
    } else if a.dims().is_empty() {
        out.push_str(&elems.next().unwrap_or_default());
    } else if a.element_count() == 0 {
        out.push_str("{}");
    } else {
        nested(out, a.dims(), a.dims().len(), &mut elems);
    }
}

/// One brace level: the innermost of a rank-1 array is `{a, b}`, of a higher rank `{ a, b }` (`{a}` for one element),
/// outer levels `{ {..}, {..} }`; XLA's one-line literal spacing.
fn nested(out: &mut String, dims: &[i64], rank: usize, elems: &mut impl Iterator<Item = String>) {
    let Some((&n, rest)) = dims.split_first() else { return };
    let pad = if rest.is_empty() && (rank == 1 || n <= 1) { "" } else { " " };
    out.push('{');
    out.push_str(pad);
    for i in 0..n {
        if i > 0 {
            out.push_str(", ");
        }
        if rest.is_empty() {
            out.push_str(&elems.next().unwrap_or_default());
        } else {
            nested(out, rest, rank, elems);
        }
    }
    out.push_str(pad);
    out.push('}');
}

/// `N` little-endian bytes of `b` (zeros past its end; callers pass whole elements).
fn le<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    for (o, x) in out.iter_mut().zip(b) {
        *o = *x;
    }
    out
}

/// One element, spelled so that the parser reads back the same bits.
fn element_text(ty: PrimitiveType, b: &[u8]) -> String {
    use PrimitiveType as T;
    match ty {
        T::Pred => if le::<1>(b)[0] != 0 { "true" } else { "false" }.into(),
        // s4/u4 are stored one (sign- or zero-extended) element per byte.
        T::S4 | T::S8 => i8::from_le_bytes(le(b)).to_string(),
        T::U4 | T::U8 => u8::from_le_bytes(le(b)).to_string(),
        T::S16 => i16::from_le_bytes(le(b)).to_string(),
        T::U16 => u16::from_le_bytes(le(b)).to_string(),
        T::S32 => i32::from_le_bytes(le(b)).to_string(),
        T::U32 => u32::from_le_bytes(le(b)).to_string(),
        T::S64 => i64::from_le_bytes(le(b)).to_string(),
        T::U64 => u64::from_le_bytes(le(b)).to_string(),
        T::F32 => f32_text(u32::from_le_bytes(le(b))),
        T::F64 => f64_text(u64::from_le_bytes(le(b))),
        T::F16 | T::Bf16 => {
            let bits = u16::from_le_bytes(le(b));
            let (mant_bits, to, from): (u32, fn(u16) -> f64, fn(f64) -> u16) = if ty == T::F16 {
                (10, |b| half::f16::from_bits(b).to_f64(), |x| half::f16::from_f64(x).to_bits())
            } else {
                (7, |b| half::bf16::from_bits(b).to_f64(), |x| half::bf16::from_f64(x).to_bits())
            };
            let v = to(bits);
            if v.is_nan() {
                let payload = u64::from(bits & ((1 << mant_bits) - 1));
                return nan_text(bits & 0x8000 != 0, payload, 1 << (mant_bits - 1));
            }
            shortest(v, |x| from(x) == bits)
        }
        T::C64 => format!("({}, {})", element_text(T::F32, b), element_text(T::F32, b.get(4..).unwrap_or(&[]))),
        T::C128 => format!("({}, {})", element_text(T::F64, b), element_text(T::F64, b.get(8..).unwrap_or(&[]))),
        // 2^(b - 127), NaN at 0xff. The parser does not read this type (yet).
        T::F8E8M0FNU => match le::<1>(b)[0] {
            0xff => "nan".into(),
            e => plain(2f64.powi(i32::from(e) - 127)),
        },
        T::Token => String::new(),
        _ => {
            let bits = le::<1>(b)[0];
            match F8Format::of(ty) {
                Some(f) => match f8_nan_payload(f, bits) {
                    Some(p) => {
                        // The payload of the NaN the parser makes of `nan` prints as plain `nan`; formats with one NaN
                        // (fnuz: 0x80) have no `-nan`.
                        let quiet = f.encode(f64::NAN);
                        let signed = f.encode(-f64::NAN) != quiet;
                        let default = f8_nan_payload(f, quiet).unwrap_or_default();
                        nan_text(signed && bits & 0x80 != 0, u64::from(p), u64::from(default))
                    }
                    None => shortest(f8_decode(f, bits), |x| f.encode(x) == bits),
                },
                None => bits.to_string(),
            }
        }
    }
}

/// The value of the f8 encoding `b` (exact in f64). NaNs keep their sign; the payload is [`f8_nan_payload`].
fn f8_decode(f: F8Format, b: u8) -> f64 {
    let neg = b & 0x80 != 0;
    let sign = if neg { -1.0 } else { 1.0 };
    let max_field = (1u8 << f.exp) - 1;
    let field = (b >> f.mant) & max_field;
    let frac = b & ((1u8 << f.mant) - 1);
    if f8_nan_payload(f, b).is_some() {
        return if neg { -f64::NAN } else { f64::NAN };
    }
    if f.ieee && field == max_field {
        return sign * f64::INFINITY;
    }
    let m = f.mant as i32;
    let magnitude = if field == 0 {
        f64::from(frac) * 2f64.powi(1 - f.bias - m)
    } else {
        f64::from((1u16 << f.mant) + u16::from(frac)) * 2f64.powi(i32::from(field) - f.bias - m)
    };
    sign * magnitude
}

/// For a NaN encoding of `f`, its mantissa bits (the `nan(0x..)` payload); `None` otherwise.
fn f8_nan_payload(f: F8Format, b: u8) -> Option<u8> {
    let max_field = (1u8 << f.exp) - 1;
    let field = (b >> f.mant) & max_field;
    let frac = b & ((1u8 << f.mant) - 1);
    let all_ones = (1u8 << f.mant) - 1;
    let nan = if f.fnuz {
        b == 0x80
    } else if f.ieee {
        field == max_field && frac != 0
    } else {
        field == max_field && frac == all_ones
    };
    nan.then_some(frac)
}

/// `nan`, `-nan`, or `nan(0x..)` when the payload is not the default quiet one.
fn nan_text(negative: bool, payload: u64, default: u64) -> String {
    let sign = if negative { "-" } else { "" };
    if payload == default { format!("{sign}nan") } else { format!("{sign}nan(0x{payload:x})") }
}

fn f32_text(bits: u32) -> String {
    let v = f32::from_bits(bits);
    if v.is_nan() {
        return nan_text(bits >> 31 != 0, u64::from(bits & 0x7f_ffff), 0x40_0000);
    }
    plain(v)
}

fn f64_text(bits: u64) -> String {
    let v = f64::from_bits(bits);
    if v.is_nan() {
        return nan_text(bits >> 63 != 0, bits & ((1 << 52) - 1), 1 << 51);
    }
    plain(v)
}

/// The shortest decimal that parses back to `v` (Debug; exponent form when very large or small), without the trailing
/// `.0` XLA leaves off integral values.
fn plain(v: impl fmt::Debug) -> String {
    let s = format!("{v:?}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_owned)
}

/// The shortest decimal `x` (of at most 17 significant digits) with `same(x)`: narrow types read their text as f64 and
/// round, so the shortest f64 text of `v` is often longer than needed (`0.1` rather than `0.0999755859375` for the f16
/// nearest 0.1).
fn shortest(v: f64, same: impl Fn(f64) -> bool) -> String {
    if v.is_infinite() {
        return if v < 0.0 { "-inf" } else { "inf" }.into();
    }
    for digits in 0..17 {
        let s = format!("{v:.digits$e}");
        if let Ok(x) = s.parse::<f64>()
            && same(x)
        {
            return plain(x);
        }
    }
    plain(v)
}

#[cfg(test)]
#[path = "print_unit.rs"]
mod tests;
