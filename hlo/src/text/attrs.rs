//! Attribute values: the typed ones of [`Attrs`] and [`ModuleConfig`], replica groups (explicit, iota and mesh-axes
//! forms), shardings, and raw values.

use std::collections::BTreeMap;

use super::cursor::{Cursor, MAX_DEPTH, PResult};
use crate::ir::{
    Attrs, ComparisonDirection, DotDims, IotaReplicaGroups, ModuleConfig, PadDim, ReplicaGroups, Sharding, SliceDim,
};
use crate::opcode::Opcode;
use crate::verify::valid_dim_set;

/// Most devices an iota, mesh or tile-assignment form may name (bounds what one attribute can expand to in memory).
const MAX_DEVICES: i64 = 1 << 16;

/// Where a called computation goes in [`crate::Instruction::called`] (this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum CallSlot {
    ToApply,
    Calls,
    Condition,
    Body,
    TrueComputation,
    FalseComputation,
    BranchComputations,
    Select,
    Scatter,
    CalledComputations,
}

/// Names of an instruction resolved after its computation (or module) is read.
#[derive(Default)]
pub(crate) struct Pending<'a> {
    pub calls: Vec<(CallSlot, &'a str, usize, usize)>,
    pub control: Vec<(&'a str, usize, usize)>,
}

/// One `key=value` of the `HloModule` header (the `,` and nothing else consumed).
pub(crate) fn header_attr(c: &mut Cursor<'_>, config: &mut ModuleConfig) -> PResult<()> {
    let (_, key) = c.expect_ident("expected a header attribute name after ','")?;
    c.expect(b'=', &format!("after header attribute '{key}'"))?;
    match key {
        "replica_count" => config.replica_count = positive(c, "replica_count")?,
        "num_partitions" => config.num_partitions = positive(c, "num_partitions")?,
        "entry_computation_layout" => {
            let raw = c.balanced()?;
            let inner = raw.strip_prefix('{').and_then(|s| s.strip_suffix('}')).unwrap_or(raw);
            config.entry_computation_layout = Some(inner.to_owned());
        }
        "frontend_attributes" => config.frontend_attributes = frontend_attributes(c)?,
        _ => {
            let raw = c.raw_value()?;
            config.other.insert(key.to_owned(), raw.to_owned());
        }
    }
    Ok(())
}

fn positive(c: &mut Cursor<'_>, what: &str) -> PResult<i64> {
    c.ws();
    let start = c.pos;
    let v = c.int(what)?;
    if v < 1 {
        fail!(c, start, c.pos, "{what} must be at least 1, found {v}");
    }
    Ok(v)
}

/// One instruction attribute value (after `key=`).
pub(crate) fn instr_attr<'a>(
    c: &mut Cursor<'a>,
    key: &'a str,
    opcode: Opcode,
    a: &mut Attrs,
    pending: &mut Pending<'a>,
) -> PResult<()> {
    match key {
        "dimensions" => a.dimensions = Some(int_list(c, "dimensions")?),
        "replica_groups" => a.replica_groups = Some(replica_groups(c)?),
        "channel_id" => a.channel_id = Some(c.int("channel_id")?),
        "use_global_device_ids" => a.use_global_device_ids = c.boolean("use_global_device_ids")?,
        "to_apply" => called(c, CallSlot::ToApply, pending)?,
        "calls" => called(c, CallSlot::Calls, pending)?,
        "condition" => called(c, CallSlot::Condition, pending)?,
        "body" => called(c, CallSlot::Body, pending)?,
        "true_computation" => called(c, CallSlot::TrueComputation, pending)?,
        "false_computation" => called(c, CallSlot::FalseComputation, pending)?,
        "branch_computations" => called(c, CallSlot::BranchComputations, pending)?,
        "select" if opcode == Opcode::SelectAndScatter => called(c, CallSlot::Select, pending)?,
        "scatter" if opcode == Opcode::SelectAndScatter => called(c, CallSlot::Scatter, pending)?,
        "called_computations" => called(c, CallSlot::CalledComputations, pending)?,
        "slice" => a.slice = Some(slice(c)?),
        "dynamic_slice_sizes" => a.dynamic_slice_sizes = Some(int_list(c, "dynamic_slice_sizes")?),
        "padding" => a.padding = Some(padding(c)?),
        "source_target_pairs" => a.source_target_pairs = Some(source_target_pairs(c)?),
        "sharding" => a.sharding = Some(sharding(c, 0)?),
        "frontend_attributes" => a.frontend_attributes = frontend_attributes(c)?,
        "backend_config" => {
            a.backend_config = Some(if c.peek() == Some(b'"') { c.string()? } else { c.raw_value()?.to_owned() });
        }
        "metadata" => a.metadata = Some(c.raw_value()?.to_owned()),
        "custom_call_target" => a.custom_call_target = Some(c.string()?),
        "control-predecessors" => pending.control.extend(name_list(c, "control-predecessors")?),
        "direction" => {
            let (s, d) = c.expect_ident("expected a comparison direction")?;
            let Some(dir) = ComparisonDirection::from_name(d) else {
                fail!(c, s, c.pos, "unknown comparison direction '{d}'; expected EQ, NE, LT, LE, GT or GE");
            };
            a.comparison_direction = Some(dir);
        }
        "type" if opcode == Opcode::Compare => {
            let (s, t) = c.expect_ident("expected a comparison type")?;
            if !matches!(t, "TOTALORDER" | "FLOAT" | "SIGNED" | "UNSIGNED" | "PARTIALORDER") {
                fail!(c, s, c.pos, "unknown comparison type '{t}'; expected TOTALORDER, FLOAT, SIGNED or UNSIGNED");
            }
            a.comparison_type = Some(t.to_owned());
        }
        "iota_dimension" => a.iota_dimension = Some(c.uint("iota_dimension")?),
        "index" if opcode == Opcode::GetTupleElement => a.tuple_index = Some(c.uint("the tuple index")?),
        "lhs_batch_dims" => a.dot.get_or_insert_with(DotDims::default).lhs_batch = int_list(c, key)?,
        "rhs_batch_dims" => a.dot.get_or_insert_with(DotDims::default).rhs_batch = int_list(c, key)?,
        "lhs_contracting_dims" => a.dot.get_or_insert_with(DotDims::default).lhs_contracting = int_list(c, key)?,
        "rhs_contracting_dims" => a.dot.get_or_insert_with(DotDims::default).rhs_contracting = int_list(c, key)?,
        _ => {
            let raw = c.raw_value()?;
            a.other.insert(key.to_owned(), raw.to_owned());
        }
    }
    Ok(())
}

/// `{1,2,3}` or `{}`.
pub(crate) fn int_list(c: &mut Cursor<'_>, what: &str) -> PResult<Vec<i64>> {
    c.expect(b'{', &format!("to open the list of {what}"))?;
    c.list(b'}', &format!("or ',' in the list of {what}"), |c, _| c.int(what))
}

/// `[1,2,3]` or `[]`.
fn bracket_list(c: &mut Cursor<'_>, what: &str) -> PResult<Vec<i64>> {
    c.expect(b'[', &format!("to open the {what}"))?;
    c.list(b']', &format!("or ',' in the {what}"), |c, i| {
        if i >= super::parser::MAX_RANK {
            return Err(c.err_found(&format!("too many entries in the {what} (at most {})", super::parser::MAX_RANK)));
        }
        c.int(what)
    })
}

/// `%comp`, or `{%a, %b}` for branch computations.
fn called<'a>(c: &mut Cursor<'a>, slot: CallSlot, pending: &mut Pending<'a>) -> PResult<()> {
    if c.peek() == Some(b'{') {
        pending.calls.extend(name_list(c, "computation names")?.into_iter().map(|(n, s, e)| (slot, n, s, e)));
    } else {
        let (s, n) = c.expect_name("expected a computation name")?;
        pending.calls.push((slot, n, s, c.pos));
    }
    Ok(())
}

/// `{%a, %b}` or `{}`.
fn name_list<'a>(c: &mut Cursor<'a>, what: &str) -> PResult<Vec<(&'a str, usize, usize)>> {
    c.expect(b'{', &format!("to open the list of {what}"))?;
    c.list(b'}', &format!("or ',' in the list of {what}"), |c, _| match c.name() {
        Some((s, n)) => Ok((n, s, c.pos)),
        None => Err(c.err_found(&format!("expected a name in the list of {what}"))),
    })
}

/// `{[0:4], [1:3:2]}`.
fn slice(c: &mut Cursor<'_>) -> PResult<Vec<SliceDim>> {
    c.expect(b'{', "to open the slice ranges")?;
    c.list(b'}', "or ',' in the slice ranges", |c, _| {
        c.expect(b'[', "to open a slice range [start:limit:stride]")?;
        let start = c.int("the slice start")?;
        c.expect(b':', "between slice start and limit")?;
        let limit = c.int("the slice limit")?;
        let stride = if c.eat(b':') { c.int("the slice stride")? } else { 1 };
        c.expect(b']', "to close the slice range")?;
        Ok(SliceDim { start, limit, stride })
    })
}

/// `0_0x1_2_1`: `lo_hi[_interior]` per dimension, separated by `x`.
fn padding(c: &mut Cursor<'_>) -> PResult<Vec<PadDim>> {
    c.ws();
    let start = c.pos;
    let mut end = start;
    while c.byte_at(end).is_some_and(|b| b.is_ascii_digit() || matches!(b, b'_' | b'x' | b'-')) {
        end += 1;
    }
    let text = c.slice(start, end);
    c.pos = end;
    let bad = |c: &Cursor<'_>| {
        c.err_range(
            start,
            end.max(start + 1),
            &format!("bad padding '{text}'; expected lo_hi or lo_hi_interior per dimension, separated by 'x'"),
        )
    };
    if text.is_empty() {
        return Err(bad(c));
    }
    let dim = |d: &str| -> Option<PadDim> {
        match d.split('_').map(|s| s.parse().ok()).collect::<Option<Vec<i64>>>()?[..] {
            [lo, hi] => Some(PadDim { lo, hi, interior: 0 }),
            [lo, hi, interior] => Some(PadDim { lo, hi, interior }),
            _ => None,
        }
    };
    text.split('x').map(dim).collect::<Option<_>>().ok_or_else(|| bad(c))
}

/// `{{0,1},{1,0}}`.
fn source_target_pairs(c: &mut Cursor<'_>) -> PResult<Vec<(i64, i64)>> {
    c.expect(b'{', "to open source_target_pairs")?;
    c.list(b'}', "or ',' in source_target_pairs", |c, _| {
        c.ws();
        let ps = c.pos;
        let pair = int_list(c, "a source-target pair")?;
        let [s, t] = pair[..] else {
            fail!(c, ps, c.pos, "source-target pair has {} entries; expected {{source,target}}", pair.len());
        };
        Ok((s, t))
    })
}

/// `{k="v", k2={raw}, ...}`: string values are unescaped, braced values kept verbatim.
pub(crate) fn frontend_attributes(c: &mut Cursor<'_>) -> PResult<BTreeMap<String, String>> {
    c.expect(b'{', "to open frontend_attributes")?;
    let pairs = c.list(b'}', "or ',' in frontend_attributes", |c, _| {
        let key = match c.peek() {
            Some(b'"') => c.string()?,
            _ => c.expect_ident("expected an attribute name in frontend_attributes")?.1.to_owned(),
        };
        c.expect(b'=', &format!("after frontend attribute '{key}'"))?;
        let value = match c.peek() {
            Some(b'"') => c.string()?,
            Some(b'{' | b'[' | b'(') => c.balanced()?.to_owned(),
            _ => c.raw_value()?.to_owned(),
        };
        Ok((key, value))
    })?;
    Ok(pairs.into_iter().collect())
}

/// `{{0,1},{2,3}}`, `{}`, `[G,S]<=[dims]T(perm)`, or `mesh[a=2,b=4] {b}`.
pub(crate) fn replica_groups(c: &mut Cursor<'_>) -> PResult<ReplicaGroups> {
    c.ws();
    let start = c.pos;
    match c.raw_peek() {
        Some(b'{') => {
            c.pos += 1;
            let mut groups = Vec::new();
            if c.eat(b'}') {
                return Ok(ReplicaGroups::Explicit(groups));
            }
            loop {
                if c.peek() != Some(b'{') {
                    return Err(c.err_found(&format!(
                        "expected '{{' to open a replica group, or '}}' to close replica_groups opened at {}",
                        c.loc(start)
                    )));
                }
                groups.push(int_list(c, "replica ids")?);
                if !c.eat(b',') {
                    break;
                }
            }
            if c.at_eof() || c.peek() != Some(b'}') {
                return Err(c.err_found(&format!(
                    "expected '}}' to close replica_groups opened at {} (or ',' and another group)",
                    c.loc(start)
                )));
            }
            c.pos += 1;
            Ok(ReplicaGroups::Explicit(groups))
        }
        Some(b'[') => {
            let g = bracket_list(c, "replica group count and size [groups,size]")?;
            let [num_groups, group_size] = g[..] else {
                fail!(c, start, c.pos, "iota replica groups need [groups,size]; found {} numbers", g.len());
            };
            let (reshape_dims, transpose_perm) = iota_tail(c)?;
            let iota = IotaReplicaGroups { num_groups, group_size, reshape_dims, transpose_perm };
            check_iota(c, start, &iota)?;
            Ok(ReplicaGroups::Iota(iota))
        }
        _ => mesh_groups(c, start),
    }
}

/// `<=[d0,d1,..]` with an optional `T(p0,p1,..)`.
fn iota_tail(c: &mut Cursor<'_>) -> PResult<(Vec<i64>, Vec<i64>)> {
    if !c.eat_str("<=") {
        return Err(c.err_found("expected '<=' and the reshape dimensions of the iota form"));
    }
    let dims = bracket_list(c, "iota reshape dimensions")?;
    let mut perm = Vec::new();
    if c.raw_peek() == Some(b'T') {
        c.pos += 1;
        c.expect(b'(', "after 'T' to open the transpose permutation")?;
        perm = c.list(b')', "or ',' in the transpose permutation", |c, i| {
            if i >= super::parser::MAX_RANK {
                return Err(c.err_found("transpose permutation too long"));
            }
            c.int("a permutation entry")
        })?;
    }
    Ok((dims, perm))
}

fn check_iota(c: &Cursor<'_>, start: usize, i: &IotaReplicaGroups) -> PResult<()> {
    if i.reshape_dims.iter().any(|&d| d < 0) || i.num_groups < 0 || i.group_size < 0 {
        fail!(c, start, c.pos, "iota form has a negative size; expected non-negative sizes");
    }
    let total = i.reshape_dims.iter().try_fold(1i64, |a, &d| a.checked_mul(d));
    let Some(total) = total.filter(|&t| t <= MAX_DEVICES) else {
        fail!(c, start, c.pos, "iota form is too large; expected at most {MAX_DEVICES} devices");
    };
    if i.num_groups.checked_mul(i.group_size) != Some(total) {
        fail!(
            c,
            start,
            c.pos,
            "iota form [{},{}] has {} devices but its reshape dims {:?} have {total}; expected groups x size = product of dims",
            i.num_groups,
            i.group_size,
            i.num_groups.saturating_mul(i.group_size),
            i.reshape_dims
        );
    }
    let n = i.reshape_dims.len();
    if !i.transpose_perm.is_empty() && (i.transpose_perm.len() != n || !valid_dim_set(&i.transpose_perm, n)) {
        let perm = &i.transpose_perm;
        fail!(c, start, c.pos, "bad transpose permutation {perm:?}; expected a permutation of 0..{n}");
    }
    Ok(())
}

/// A mesh axis name: an identifier or a quoted string.
fn axis_name(c: &mut Cursor<'_>) -> PResult<String> {
    c.ws();
    match c.raw_peek() {
        Some(q @ (b'\'' | b'"')) => {
            let s = c.pos;
            c.pos += 1;
            while c.raw_peek().is_some_and(|b| b != q && b != b'\n') {
                c.pos += 1;
            }
            if c.raw_peek() != Some(q) {
                fail!(c, s, s + 1, "unterminated axis name; expected a closing quote");
            }
            c.pos += 1;
            Ok(c.slice(s + 1, c.pos - 1).to_owned())
        }
        _ => Ok(c.expect_ident("expected a mesh axis name")?.1.to_owned()),
    }
}

/// XLA's mesh-axes form: `mesh[a=2,b=4] {b}`, `mesh[a=2,b=4], device_ids=(...) {a:(1)2}`, `maximal_mesh[device_id=3]
/// {}`. Converted to the iota form (or explicit groups when the mesh has its own device order).
fn mesh_groups(c: &mut Cursor<'_>, start: usize) -> PResult<ReplicaGroups> {
    let (_, kw) = c.expect_ident("expected replica groups: {{...}}, [groups,size]<=[dims] or mesh[...] {axes}")?;
    match kw {
        "maximal_mesh" => {
            c.expect(b'[', "after 'maximal_mesh'")?;
            if !c.eat_kw("device_id") {
                return Err(c.err_found("expected 'device_id=N' in maximal_mesh"));
            }
            c.expect(b'=', "after 'device_id'")?;
            let d = c.uint("a device id")?;
            c.expect(b']', "to close maximal_mesh")?;
            c.expect(b'{', "to open the replica group axes")?;
            c.expect(b'}', "(a maximal mesh has no axes)")?;
            Ok(ReplicaGroups::Explicit(vec![vec![d]]))
        }
        "mesh" => {
            c.expect(b'[', "after 'mesh' to open its axes")?;
            let axes = c.list(b']', "or ',' in the mesh axes", |c, i| {
                let name = axis_name(c)?;
                c.expect(b'=', "after a mesh axis name")?;
                let s = c.uint("a mesh axis size")?;
                if s == 0 || i >= super::parser::MAX_RANK {
                    return Err(c.err_found("mesh axis sizes must be positive and at most 32 axes"));
                }
                Ok((name, s))
            })?;
            let (names, sizes): (Vec<String>, Vec<i64>) = axes.into_iter().unzip();
            let total = sizes.iter().try_fold(1i64, |a, &d| a.checked_mul(d)).filter(|&t| t <= MAX_DEVICES);
            let Some(total) = total else {
                fail!(c, start, c.pos, "mesh is too large; expected at most {MAX_DEVICES} devices");
            };
            // Optional explicit device order.
            let save = c.pos;
            let mut device_ids: Option<Vec<i64>> = None;
            if c.eat(b',') {
                if c.eat_kw("device_ids") {
                    c.expect(b'=', "after 'device_ids'")?;
                    let ds = c.pos;
                    device_ids = Some(mesh_device_ids(c, total, ds)?);
                } else {
                    c.pos = save;
                }
            }
            c.expect(b'{', "to open the replica group axes of the mesh")?;
            // (axis, pre_size, size)
            let refs: Vec<(usize, i64, i64)> = c.list(b'}', "or ',' in the replica group axes", |c, _| {
                let as_ = c.pos;
                let n = axis_name(c)?;
                let Some(axis) = names.iter().position(|x| *x == n) else {
                    fail!(c, as_, c.pos, "unknown mesh axis '{n}'; expected one of {names:?}");
                };
                let full = sizes.get(axis).copied().unwrap_or(1);
                let (pre, size) = if c.eat(b':') {
                    c.expect(b'(', "to open the sub-axis pre-size")?;
                    let pre = c.uint("a sub-axis pre-size")?;
                    c.expect(b')', "to close the sub-axis pre-size")?;
                    let size = c.uint("a sub-axis size")?;
                    (pre, size)
                } else {
                    (1, full)
                };
                let fits = pre >= 1 && size >= 1 && pre.checked_mul(size).is_some_and(|ps| full % ps == 0);
                if !fits {
                    fail!(c, as_, c.pos, "sub-axis {n}:({pre}){size} does not divide axis size {full}");
                }
                Ok((axis, pre, size))
            })?;
            ReplicaGroups::from_mesh(&sizes, &refs, device_ids, false).map_err(|m| c.err_range(start, c.pos, &m))
        }
        other => fail!(
            c,
            start,
            c.pos,
            "unknown replica groups form '{other}'; expected {{...}}, [groups,size]<=[dims] or mesh[...] {{axes}}"
        ),
    }
}

/// `(...)` after `device_ids=`: an iota tile form `[dims]<=[..]T(..)` or a flat id list.
fn mesh_device_ids(c: &mut Cursor<'_>, total: i64, start: usize) -> PResult<Vec<i64>> {
    c.expect(b'(', "to open the mesh device ids")?;
    let ids = if c.peek() == Some(b'[') {
        let dims = bracket_list(c, "device id dimensions")?;
        let (reshape_dims, transpose_perm) =
            if c.peek() == Some(b'<') { iota_tail(c)? } else { (dims.clone(), Vec::new()) };
        let iota = IotaReplicaGroups { num_groups: 1, group_size: total, reshape_dims, transpose_perm };
        check_iota(c, start, &iota)?;
        iota.expand().and_then(|g| g.into_iter().next()).unwrap_or_default()
    } else {
        let mut v = Vec::new();
        loop {
            while c.eat(b'{') {}
            v.push(c.int("a device id")?);
            while c.eat(b'}') {}
            if !c.eat(b',') || v.len() as i64 > total {
                break;
            }
        }
        v
    };
    c.expect(b')', "to close the mesh device ids")?;
    if ids.len() as i64 != total {
        fail!(c, start, c.pos, "mesh has {total} devices but device_ids lists {}", ids.len());
    }
    Ok(ids)
}

/// `{replicated}`, `{maximal device=N}`, `{manual}`, `{devices=[..]...}`, tuples `{{..}, {..}}`. Forms Peerless does
/// not model (`{unknown}`, `shard_as`, ...) are kept as [`Sharding::Other`].
pub(crate) fn sharding(c: &mut Cursor<'_>, depth: u32) -> PResult<Sharding> {
    c.ws();
    let start = c.pos;
    if depth >= MAX_DEPTH {
        return Err(c.err_found(&format!("sharding nested too deeply (more than {MAX_DEPTH} levels)")));
    }
    c.expect(b'{', "to open a sharding")?;
    if c.peek() == Some(b'{') {
        let mut elems = Vec::new();
        loop {
            elems.push(sharding(c, depth + 1)?);
            if !c.eat(b',') {
                c.expect(b'}', "or ',' in the tuple sharding")?;
                return Ok(Sharding::Tuple(elems));
            }
        }
    }
    if c.eat(b'}') {
        return Ok(Sharding::Tuple(Vec::new()));
    }
    let mut kind: Option<Sharding> = None;
    let mut unmodelled = false;
    let mut tile: Option<(Vec<i64>, Vec<i64>)> = None;
    let mut last_tile_dim_replicate = false;
    let mut last_tile_dims: Vec<String> = Vec::new();
    while !c.eat(b'}') {
        let (_, kw) =
            c.expect_ident("expected a sharding keyword (replicated, manual, maximal, devices=...) or '}'")?;
        match kw {
            "replicated" => kind = Some(Sharding::Replicated),
            "manual" => kind = Some(Sharding::Manual),
            "maximal" => {
                if !c.eat_kw("device") {
                    return Err(c.err_found("expected 'device=N' after 'maximal'"));
                }
                c.expect(b'=', "after 'device'")?;
                kind = Some(Sharding::Maximal { device: c.uint("a device id")? });
            }
            "devices" => {
                c.expect(b'=', "after 'devices'")?;
                c.ws();
                let ds = c.pos;
                let dims = bracket_list(c, "tile assignment dimensions")?;
                let devices = if c.peek() == Some(b'<') {
                    let (reshape_dims, transpose_perm) = iota_tail(c)?;
                    let total: i64 = reshape_dims.iter().try_fold(1i64, |a, &d| a.checked_mul(d)).unwrap_or(-1);
                    let iota = IotaReplicaGroups { num_groups: 1, group_size: total, reshape_dims, transpose_perm };
                    check_iota(c, ds, &iota)?;
                    iota.expand().and_then(|g| g.into_iter().next()).unwrap_or_default()
                } else {
                    let mut v = Vec::new();
                    loop {
                        v.push(c.int("a device id")?);
                        if v.len() as i64 > MAX_DEVICES {
                            return Err(c.err_found("too many devices in the tile assignment"));
                        }
                        // A ',' followed by a number continues the list; anything else ends it.
                        let save = c.pos;
                        if c.eat(b',') && c.peek().is_some_and(|b| b.is_ascii_digit()) {
                            continue;
                        }
                        c.pos = save;
                        break;
                    }
                    v
                };
                let want = dims.iter().try_fold(1i64, |a, &d| a.checked_mul(d));
                if want != Some(devices.len() as i64) || dims.iter().any(|&d| d < 1) {
                    fail!(
                        c,
                        ds,
                        c.pos,
                        "tile assignment dims {dims:?} need {} devices but {} are given",
                        want.map_or("too many".to_owned(), |w| w.to_string()),
                        devices.len()
                    );
                }
                tile = Some((dims, devices));
            }
            "last_tile_dim_replicate" => last_tile_dim_replicate = true,
            "last_tile_dims" => {
                c.expect(b'=', "after 'last_tile_dims'")?;
                c.expect(b'{', "to open last_tile_dims")?;
                last_tile_dims = c.list(b'}', "or ',' in last_tile_dims", |c, _| {
                    Ok(c.expect_ident("expected a subgroup type (manual, replicated, ...)")?.1.to_owned())
                })?;
            }
            "metadata" => {
                c.expect(b'=', "after 'metadata'")?;
                c.balanced()?;
            }
            // Newer XLA prints a mesh first: `{mesh[], replicated}`, `{mesh[a=2,b=4], [{a}, {}]}`. A replicated /
            // manual one is that; one sharded by named axes is kept verbatim.
            "mesh" => {
                if c.peek() == Some(b'[') {
                    c.balanced()?;
                }
                if c.eat(b',') && matches!(c.peek(), Some(b'{' | b'[' | b'(')) {
                    c.balanced()?;
                    unmodelled = true;
                }
            }
            _ => {
                unmodelled = true;
                if c.eat(b'=') {
                    if matches!(c.peek(), Some(b'{' | b'[' | b'(')) {
                        c.balanced()?;
                    } else {
                        skip_word(c);
                    }
                } else if c.peek().is_some_and(|b| b.is_ascii_digit()) {
                    // `shard_as 0` / `shard_like 1`.
                    c.int("a sharding group id")?;
                }
            }
        }
    }
    let raw = c.slice(start, c.pos);
    if unmodelled {
        return Ok(Sharding::Other(raw.to_owned()));
    }
    match (kind, tile) {
        (None, Some((tile_dims, devices))) => {
            Ok(Sharding::Tiled { tile_dims, devices, last_tile_dim_replicate, last_tile_dims })
        }
        (Some(k), None) => Ok(k),
        _ => Ok(Sharding::Other(raw.to_owned())),
    }
}

fn skip_word(c: &mut Cursor<'_>) {
    c.ws();
    while c.raw_peek().is_some_and(|b| !b.is_ascii_whitespace() && b != b'}' && b != b',') {
        c.pos += 1;
    }
}
