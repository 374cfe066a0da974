//! HloModuleProto encoder: the IR back to a serialized `xla.HloModuleProto`, the inverse of [`crate::proto::decode`]
//! for everything the IR keeps, so HLO text reaches XLA's PJRT plugins without XLA's parser. Computations go callees
//! first, instructions in program order, ids `computation << 32 | position`, as XLA writes them. What the IR cannot say
//! (unknown verbatim attributes, custom-call layout constraints, output aliasing, f8 types newer than `pjrt-sys`'s
//! protos) is an [`ErrorKind::Unsupported`] error, never a silently different module. By necessity names are made
//! unique ([`unique_names`]) and iota replica groups written explicitly; `decode(encode(m))` prints as `m` with those
//! applied.

use std::collections::BTreeMap;

use cranelift_entity::EntityRef;
use pjrt_sys::protos::xla as pb;
use prost::Message;

use crate::ir::{Attrs, CompId, InstrId, Instruction, ReplicaGroups, Sharding, Window};
use crate::literal::{Array, Literal};
use crate::opcode::Opcode;
use crate::proto::SHARDING_TYPES;
use crate::types::{ArrayShape, PrimitiveType, Shape};
use crate::{Error, ErrorKind, Module};

type R<T> = Result<T, Error>;

/// Instruction names as the encoder writes them: unique in the whole module, as XLA requires (the text form only needs
/// them unique per computation). The entry's keep theirs; a name another computation already took gets `.1`, `.2`, ...
/// (XLA's parser does the same).
pub fn unique_names(module: &Module) -> BTreeMap<InstrId, String> {
    let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut out = BTreeMap::new();
    let entry = module.comp(module.entry);
    for &i in &entry.instrs {
        taken.insert(module.instr(i).name.clone());
        out.insert(i, module.instr(i).name.clone());
    }
    for (cid, c) in module.comps.iter() {
        if cid == module.entry {
            continue;
        }
        for &i in &c.instrs {
            let name = &module.instr(i).name;
            let mut unique = name.clone();
            let mut k = 1;
            while !taken.insert(unique.clone()) {
                unique = format!("{name}.{k}");
                k += 1;
            }
            out.insert(i, unique);
        }
    }
    out
}

/// The module as a serialized `HloModuleProto`.
pub fn encode(module: &Module) -> Result<Vec<u8>, Error> {
    let order = callees_first(module);
    let names = unique_names(module);
    // Computation ids: position in the written order + 1 (0 reads as "unset").
    let comp_id: BTreeMap<CompId, i64> = order.iter().enumerate().map(|(k, &c)| (c, k as i64 + 1)).collect();
    let mut computations = Vec::with_capacity(order.len());
    for &cid in &order {
        let c = module.comp(cid);
        let cnum = comp_id[&cid];
        let id_of = |i: InstrId| -> i64 {
            let pos = c.instrs.iter().position(|&x| x == i).unwrap_or(i.index());
            cnum << 32 | pos as i64
        };
        let mut instructions = Vec::with_capacity(c.instrs.len());
        for &iid in &c.instrs {
            let ins = module.instr(iid);
            let mut p = instruction(module, iid, ins, id_of(iid), &id_of, &comp_id)?;
            if let Some(n) = names.get(&iid) {
                p.name = n.clone();
            }
            instructions.push(p);
        }
        let program_shape = pb::ProgramShapeProto {
            parameters: c.params.iter().map(|&p| shape(&module.instr(p).shape)).collect(),
            parameter_names: c.params.iter().map(|p| names.get(p).cloned().unwrap_or_default()).collect(),
            result: Some(shape(&module.instr(c.root).shape)),
        };
        computations.push(pb::HloComputationProto {
            name: c.name.clone(),
            id: cnum,
            root_id: id_of(c.root),
            program_shape: Some(program_shape),
            instructions,
            ..Default::default()
        });
    }
    let entry = module.comp(module.entry);
    let host_program_shape =
        computations.iter().find(|c| c.id == comp_id[&module.entry]).and_then(|c| c.program_shape.clone());
    let proto = pb::HloModuleProto {
        name: module.name.clone(),
        entry_computation_name: entry.name.clone(),
        entry_computation_id: comp_id[&module.entry],
        computations,
        host_program_shape,
        id: 1,
        frontend_attributes: frontend_attributes(&module.config.frontend_attributes),
        ..Default::default()
    };
    Ok(proto.encode_to_vec())
}

fn frontend_attributes(map: &BTreeMap<String, String>) -> Option<pb::FrontendAttributes> {
    (!map.is_empty()).then(|| pb::FrontendAttributes { map: map.clone().into_iter().collect() })
}

/// Every computation, each after the computations it calls, the entry last.
fn callees_first(module: &Module) -> Vec<CompId> {
    let mut order = Vec::with_capacity(module.comps.len());
    let mut state = vec![0u8; module.comps.len()];
    // Depth first without recursion: (computation, whether its callees are done).
    let mut roots: Vec<CompId> = module.comps.keys().filter(|&c| c != module.entry).collect();
    roots.push(module.entry);
    for root in roots {
        let mut stack = vec![(root, false)];
        while let Some((c, expanded)) = stack.pop() {
            if expanded {
                if state[c.index()] != 2 {
                    state[c.index()] = 2;
                    order.push(c);
                }
                continue;
            }
            if state[c.index()] != 0 {
                continue;
            }
            state[c.index()] = 1;
            stack.push((c, true));
            let callees = module.comp(c).instrs.iter().flat_map(|&i| &module.instr(i).called);
            stack.extend(callees.filter(|cc| state.get(cc.index()) == Some(&0)).map(|&cc| (cc, false)));
        }
    }
    // The entry last (a computation nothing calls may come after it in the walk above only if it was listed after the
    // entry, which the roots' order rules out).
    if let Some(p) = order.iter().position(|&c| c == module.entry) {
        let e = order.remove(p);
        order.push(e);
    }
    order
}

fn array_shape(a: &ArrayShape, row_major: bool) -> pb::ShapeProto {
    let rank = a.dims.len();
    let minor_to_major = match &a.layout {
        Some(l) if !row_major => l.clone(),
        _ => (0..rank as i64).rev().collect(),
    };
    // XLA stores s4 / u4 arrays two to a byte; its text parser writes that into the layout.
    let element_size_in_bits = if matches!(a.ty, PrimitiveType::S4 | PrimitiveType::U4) { 4 } else { 0 };
    pb::ShapeProto {
        element_type: a.ty.proto_number(),
        dimensions: a.dims.clone(),
        is_dynamic_dimension: vec![false; rank],
        layout: Some(Box::new(pb::LayoutProto { minor_to_major, element_size_in_bits, ..Default::default() })),
        ..Default::default()
    }
}

/// A shape with its layouts (row-major where none is written).
pub fn shape(s: &Shape) -> pb::ShapeProto {
    match s {
        Shape::Array(a) => array_shape(a, false),
        Shape::Tuple(elems) => pb::ShapeProto {
            element_type: pb::PrimitiveType::Tuple as i32,
            tuple_shapes: elems.iter().map(shape).collect(),
            ..Default::default()
        },
        Shape::Token => pb::ShapeProto { element_type: pb::PrimitiveType::Token as i32, ..Default::default() },
    }
}

/// The attributes the IR keeps in their text form that this encoder writes.
const TEXT_ATTRS: [&str; 35] = [
    "offset_dims",
    "collapsed_slice_dims",
    "start_index_map",
    "index_vector_dim",
    "operand_batching_dims",
    "start_indices_batching_dims",
    "slice_sizes",
    "update_window_dims",
    "inserted_window_dims",
    "scatter_dims_to_operand_dims",
    "input_batching_dims",
    "scatter_indices_batching_dims",
    "dim_labels",
    "feature_group_count",
    "batch_group_count",
    "window",
    "kind",
    "is_host_transfer",
    "constrain_layout",
    "is_stable",
    "indices_are_sorted",
    "unique_indices",
    "custom_call_has_side_effect",
    "api_version",
    "schedule",
    "operand_precision",
    "exponent_bits",
    "mantissa_bits",
    "k",
    "largest",
    "distribution",
    "algorithm",
    "fft_type",
    "fft_length",
    // XLA's printer writes it on calls it may inline; the proto has no field (XLA derives it).
    "inlineable",
];

fn instruction(
    module: &Module,
    iid: InstrId,
    ins: &Instruction,
    id: i64,
    id_of: &dyn Fn(InstrId) -> i64,
    comp_id: &BTreeMap<CompId, i64>,
) -> R<pb::HloInstructionProto> {
    let err = |why: String| Error::about(ErrorKind::Unsupported, module, iid, why);
    let a = &ins.attrs;
    let mut called: Vec<i64> = ins.called.iter().map(|c| comp_id.get(c).copied().unwrap_or(0)).collect();
    if ins.opcode == Opcode::While && called.len() == 2 {
        // The IR's order is the text form's (condition, body); XLA serializes (body, condition).
        called.swap(0, 1);
    }
    let mut p = pb::HloInstructionProto {
        name: ins.name.clone(),
        opcode: ins.opcode.name().to_owned(),
        shape: Some(shape(&ins.shape)),
        id,
        operand_ids: ins.operands.iter().map(|&o| id_of(o)).collect(),
        control_predecessor_ids: a.control_predecessors.iter().map(|&o| id_of(o)).collect(),
        called_computation_ids: called,
        parameter_number: a.parameter_number.unwrap_or(0),
        tuple_index: a.tuple_index.unwrap_or(0),
        dimensions: a.dimensions.clone().or(a.iota_dimension.map(|d| vec![d])).unwrap_or_default(),
        channel_id: a.channel_id.unwrap_or(0),
        use_global_device_ids: a.use_global_device_ids,
        slice_dimensions: (a.slice.iter().flatten())
            .map(|d| pb::hlo_instruction_proto::SliceDimensions { start: d.start, limit: d.limit, stride: d.stride })
            .collect(),
        dynamic_slice_sizes: a.dynamic_slice_sizes.clone().unwrap_or_default(),
        padding_config: a.padding.as_ref().map(|pad| pb::PaddingConfig {
            dimensions: pad
                .iter()
                .map(|d| pb::padding_config::PaddingConfigDimension {
                    edge_padding_low: d.lo,
                    edge_padding_high: d.hi,
                    interior_padding: d.interior,
                })
                .collect(),
        }),
        source_target_pairs: (a.source_target_pairs.iter().flatten())
            .map(|&(source, target)| pb::SourceTarget { source, target })
            .collect(),
        frontend_attributes: frontend_attributes(&a.frontend_attributes),
        backend_config: a.backend_config.clone().unwrap_or_default().into_bytes(),
        metadata: a.metadata.as_deref().map(metadata),
        custom_call_target: a.custom_call_target.clone().unwrap_or_default(),
        comparison_direction: a.comparison_direction.map_or(String::new(), |d| d.name().to_owned()),
        comparison_type: a.comparison_type.clone().unwrap_or_default(),
        dot_dimension_numbers: a.dot.as_ref().map(|d| pb::DotDimensionNumbers {
            lhs_batch_dimensions: d.lhs_batch.clone(),
            rhs_batch_dimensions: d.rhs_batch.clone(),
            lhs_contracting_dimensions: d.lhs_contracting.clone(),
            rhs_contracting_dimensions: d.rhs_contracting.clone(),
        }),
        ..Default::default()
    };
    if let Some(l) = &a.literal {
        p.literal = Some(literal(l).map_err(err)?);
    }
    let groups = match &a.replica_groups {
        Some(ReplicaGroups::Explicit(g)) if !g.is_empty() => Some(g.clone()),
        // XLA reads the iota form from a field (92) this build's copy of its protos lacks; the groups it stands for are
        // written out instead.
        Some(rg @ ReplicaGroups::Iota(i)) => {
            Some(i.expand().ok_or_else(|| err(format!("inconsistent iota replica groups {rg}")))?)
        }
        _ => None,
    };
    p.collective_device_list = groups.map(|g| pb::CollectiveDeviceListProto {
        replica_groups: g.into_iter().map(|r| pb::ReplicaGroup { replica_ids: r }).collect(),
        ..Default::default()
    });
    if let Some(s) = &a.sharding {
        p.sharding = Some(sharding(s, &ins.shape).map_err(err)?);
    }
    text_attrs(ins, &mut p).map_err(err)?;
    Ok(p)
}

/// The attributes kept in their text form (`Attrs::other`).
fn text_attrs(ins: &Instruction, p: &mut pb::HloInstructionProto) -> Result<(), String> {
    let other = &ins.attrs.other;
    if let Some(k) = other.keys().find(|k| !TEXT_ATTRS.contains(&k.as_str())) {
        return Err(format!(
            "attribute {k}={} has no HloModuleProto field in Peerless's encoder",
            other.get(k).map_or("", String::as_str)
        ));
    }
    // Absent values are the proto's defaults.
    let int = |key: &str| -> Result<i64, String> {
        other.get(key).map_or(Ok(0), |v| v.trim().parse::<i64>().map_err(|_| format!("bad {key}={v}")))
    };
    let flag = |key: &str| other.get(key).is_some_and(|v| v.trim() == "true");
    // Gather's, scatter's and convolution's dimension numbers, from the text form's attributes (which the decoder
    // writes too).
    let op = ins.opcode.name();
    let req = |key: &str| list_attr(&ins.attrs, op, key)?.ok_or(format!("{op} without {key}"));
    let opt = |key: &str| Ok::<_, String>(list_attr(&ins.attrs, op, key)?.unwrap_or_default());
    let index_vector_dim = || {
        let v = other.get("index_vector_dim").ok_or(format!("{op} without index_vector_dim"))?;
        v.trim().parse::<i64>().map_err(|_| format!("{op}: bad index_vector_dim"))
    };
    match ins.opcode {
        Opcode::Gather => {
            let (offset_dims, collapsed_slice_dims) = (req("offset_dims")?, opt("collapsed_slice_dims")?);
            let (start_index_map, index_vector_dim) = (req("start_index_map")?, index_vector_dim()?);
            p.gather_slice_sizes = req("slice_sizes")?;
            p.gather_dimension_numbers = Some(pb::GatherDimensionNumbers {
                offset_dims,
                collapsed_slice_dims,
                start_index_map,
                index_vector_dim,
                operand_batching_dims: opt("operand_batching_dims")?,
                start_indices_batching_dims: opt("start_indices_batching_dims")?,
            });
        }
        Opcode::Scatter => {
            p.scatter_dimension_numbers = Some(pb::ScatterDimensionNumbers {
                update_window_dims: req("update_window_dims")?,
                inserted_window_dims: opt("inserted_window_dims")?,
                scatter_dims_to_operand_dims: req("scatter_dims_to_operand_dims")?,
                index_vector_dim: index_vector_dim()?,
                input_batching_dims: opt("input_batching_dims")?,
                scatter_indices_batching_dims: opt("scatter_indices_batching_dims")?,
            });
        }
        Opcode::Convolution => {
            p.convolution_dimension_numbers = Some(conv_dims(other)?);
            // Both 1 when absent.
            let count = |key: &str| -> Result<i64, String> {
                other.get(key).map_or(Ok(1), |v| v.trim().parse().map_err(|_| format!("convolution: bad {key}={v}")))
            };
            p.feature_group_count = count("feature_group_count")?;
            p.batch_group_count = count("batch_group_count")?;
        }
        _ => {}
    }
    if other.contains_key("window") {
        let w = Window::of(&ins.attrs)?;
        p.window = Some(pb::Window {
            dimensions: w
                .dims
                .iter()
                .map(|d| pb::WindowDimension {
                    size: d.size,
                    stride: d.stride,
                    padding_low: d.pad_lo,
                    padding_high: d.pad_hi,
                    window_dilation: d.window_dilation,
                    base_dilation: d.base_dilation,
                    window_reversal: d.reversal,
                })
                .collect(),
        });
    }
    if let Some(k) = other.get("kind") {
        p.fusion_kind = k.trim().to_owned();
    }
    p.is_host_transfer = flag("is_host_transfer");
    p.constrain_layout = flag("constrain_layout");
    p.is_stable = flag("is_stable");
    p.indices_are_sorted = flag("indices_are_sorted");
    p.unique_indices = flag("unique_indices");
    p.custom_call_has_side_effect = flag("custom_call_has_side_effect");
    let enum_value = |key: &str, upper: bool, from: fn(&str) -> Option<i32>| -> Result<i32, String> {
        let Some(v) = other.get(key) else { return Ok(0) };
        let name = if upper { v.trim().to_ascii_uppercase() } else { v.trim().to_owned() };
        from(&name).ok_or_else(|| format!("unknown {key}={v}"))
    };
    p.custom_call_api_version =
        enum_value("api_version", false, |s| pb::CustomCallApiVersion::from_str_name(s).map(|e| e as i32))?;
    p.custom_call_schedule =
        enum_value("schedule", false, |s| pb::CustomCallSchedule::from_str_name(s).map(|e| e as i32))?;
    if let Some(v) = other.get("operand_precision") {
        let inner = v.trim().trim_start_matches('{').trim_end_matches('}');
        let precision = inner
            .split(',')
            .filter(|x| !x.trim().is_empty())
            .map(|x| {
                pb::precision_config::Precision::from_str_name(&x.trim().to_ascii_uppercase())
                    .map(|e| e as i32)
                    .ok_or_else(|| format!("unknown operand_precision={v}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        p.precision_config = Some(pb::PrecisionConfig { operand_precision: precision, ..Default::default() });
    }
    p.exponent_bits = int("exponent_bits")? as i32;
    p.mantissa_bits = int("mantissa_bits")? as i32;
    p.k = int("k")?;
    p.largest = flag("largest");
    p.distribution = enum_value("distribution", true, |s| pb::RandomDistribution::from_str_name(s).map(|e| e as i32))?;
    if ins.opcode == Opcode::RngBitGenerator {
        p.rng_algorithm = enum_value("algorithm", true, |s| pb::RandomAlgorithm::from_str_name(s).map(|e| e as i32))?;
    }
    p.fft_type = enum_value("fft_type", false, |s| pb::FftType::from_str_name(s).map(|e| e as i32))?;
    p.fft_length = opt("fft_length")?;
    Ok(())
}

/// A `{a,b,..}` list attribute of `op` (`None` when absent), as the text form writes it.
fn list_attr(attrs: &Attrs, op: &str, key: &str) -> Result<Option<Vec<i64>>, String> {
    let Some(v) = attrs.other.get(key) else { return Ok(None) };
    let inner = v.trim().trim_start_matches('{').trim_end_matches('}').trim();
    if inner.is_empty() {
        return Ok(Some(Vec::new()));
    }
    inner
        .split(',')
        .map(|x| x.trim().parse::<i64>().map_err(|_| format!("{op}: bad {key}={v}")))
        .collect::<Result<_, _>>()
        .map(Some)
}

/// A convolution's `dim_labels=b01f_01io->b01f`: per operand, which dimension is the batch / feature (`b`, `f`; kernel:
/// input / output features `i`, `o`) and which is spatial dimension `k` (the digit `k`).
fn conv_dims(other: &BTreeMap<String, String>) -> Result<pb::ConvolutionDimensionNumbers, String> {
    let raw = other.get("dim_labels").ok_or("convolution without dim_labels")?;
    let bad = || format!("convolution: bad dim_labels={raw}");
    let (lhs, rest) = raw.trim().split_once('_').ok_or_else(bad)?;
    let (rhs, out) = rest.split_once("->").ok_or_else(bad)?;
    // (position of `a`, position of `b`, position of each spatial digit in order)
    let labels = |l: &str, a: char, b: char| -> Result<(i64, i64, Vec<i64>), String> {
        let (mut pa, mut pb) = (None, None);
        let mut spatial = vec![None; l.len().saturating_sub(2)];
        for (p, ch) in l.chars().enumerate() {
            let slot = match ch {
                _ if ch == a => &mut pa,
                _ if ch == b => &mut pb,
                _ => ch.to_digit(10).and_then(|k| spatial.get_mut(k as usize)).ok_or_else(bad)?,
            };
            if slot.replace(p as i64).is_some() {
                return Err(bad());
            }
        }
        let spatial = spatial.into_iter().collect::<Option<Vec<_>>>().ok_or_else(bad)?;
        Ok((pa.ok_or_else(bad)?, pb.ok_or_else(bad)?, spatial))
    };
    let (input_batch_dimension, input_feature_dimension, input_spatial_dimensions) = labels(lhs, 'b', 'f')?;
    let (kernel_input_feature_dimension, kernel_output_feature_dimension, kernel_spatial_dimensions) =
        labels(rhs, 'i', 'o')?;
    let (output_batch_dimension, output_feature_dimension, output_spatial_dimensions) = labels(out, 'b', 'f')?;
    Ok(pb::ConvolutionDimensionNumbers {
        input_batch_dimension,
        input_feature_dimension,
        input_spatial_dimensions,
        kernel_input_feature_dimension,
        kernel_output_feature_dimension,
        kernel_spatial_dimensions,
        output_batch_dimension,
        output_feature_dimension,
        output_spatial_dimensions,
    })
}

/// `{op_type="..." op_name="..." source_file="..." source_line=N}` (the form the decoder and XLA's printer write) as
/// `OpMetadata`; anything else in it is left out.
fn metadata(text: &str) -> pb::OpMetadata {
    let mut m = pb::OpMetadata::default();
    let body = text.trim().trim_start_matches('{').trim_end_matches('}');
    let mut rest = body;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim();
        let after = &rest[eq + 1..];
        let (value, next) = if let Some(q) = after.strip_prefix('"') {
            // A quoted string with backslash escapes.
            let mut out = String::new();
            let mut chars = q.char_indices();
            let mut end = q.len();
            while let Some((k, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            out.push(n);
                        }
                    }
                    '"' => {
                        end = k + 1;
                        break;
                    }
                    c => out.push(c),
                }
            }
            (out, &q[end.min(q.len())..])
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            (after[..end].to_owned(), &after[end..])
        };
        match key {
            "op_type" => m.op_type = value,
            "op_name" => m.op_name = value,
            "source_file" => m.source_file = value,
            "source_line" => m.source_line = value.parse().unwrap_or(0),
            _ => {}
        }
        rest = next;
    }
    m
}

fn sharding(s: &Sharding, shape_of: &Shape) -> Result<pb::OpSharding, String> {
    use pb::op_sharding::Type;
    Ok(match s {
        Sharding::Replicated => pb::OpSharding { r#type: Type::Replicated as i32, ..Default::default() },
        Sharding::Manual => {
            // `sharding={manual}` on a tuple-shaped instruction is a tuple of manual leaves.
            if let Shape::Tuple(_) = shape_of {
                let leaves = shape_of_leaf_count(shape_of);
                pb::OpSharding {
                    r#type: Type::Tuple as i32,
                    tuple_shardings: vec![pb::OpSharding { r#type: Type::Manual as i32, ..Default::default() }; leaves],
                    ..Default::default()
                }
            } else {
                pb::OpSharding { r#type: Type::Manual as i32, ..Default::default() }
            }
        }
        Sharding::Maximal { device } => pb::OpSharding {
            r#type: Type::Maximal as i32,
            tile_assignment_dimensions: vec![1],
            tile_assignment_devices: vec![*device],
            ..Default::default()
        },
        Sharding::Tiled { tile_dims, devices, last_tile_dim_replicate, last_tile_dims } => pb::OpSharding {
            r#type: Type::Other as i32,
            tile_assignment_dimensions: tile_dims.clone(),
            tile_assignment_devices: devices.clone(),
            replicate_on_last_tile_dim: *last_tile_dim_replicate,
            last_tile_dims: last_tile_dims
                .iter()
                .map(|t| {
                    let number = SHARDING_TYPES.iter().position(|&n| n == t.trim());
                    number.map(|n| n as i32).ok_or_else(|| format!("unknown last_tile_dims entry {t}"))
                })
                .collect::<Result<_, _>>()?,
            ..Default::default()
        },
        Sharding::Tuple(parts) => {
            let elems: Vec<&Shape> = match shape_of {
                Shape::Tuple(e) => e.iter().collect(),
                other => vec![other],
            };
            // A tuple sharding lists one sharding per leaf, depth first.
            let mut leaves = Vec::new();
            for (k, part) in parts.iter().enumerate() {
                let sub = sharding(part, elems.get(k).copied().unwrap_or(&Shape::Token))?;
                if sub.r#type == Type::Tuple as i32 {
                    leaves.extend(sub.tuple_shardings);
                } else {
                    leaves.push(sub);
                }
            }
            pb::OpSharding { r#type: Type::Tuple as i32, tuple_shardings: leaves, ..Default::default() }
        }
        Sharding::Other(t) if t.trim() == "{unknown}" => {
            pb::OpSharding { r#type: Type::Unknown as i32, ..Default::default() }
        }
        Sharding::Other(t) => return Err(format!("sharding {t} has no HloModuleProto form in Peerless's encoder")),
    })
}

fn shape_of_leaf_count(s: &Shape) -> usize {
    match s {
        Shape::Tuple(e) => e.iter().map(shape_of_leaf_count).sum(),
        _ => 1,
    }
}

fn literal(l: &Literal) -> Result<pb::LiteralProto, String> {
    match l {
        Literal::Token => Ok(pb::LiteralProto { shape: Some(shape(&Shape::Token)), ..Default::default() }),
        Literal::Tuple(parts) => {
            let tuple_literals = parts.iter().map(literal).collect::<Result<Vec<_>, _>>()?;
            let shapes = tuple_literals.iter().map(|t| t.shape.clone().unwrap_or_default()).collect();
            Ok(pb::LiteralProto {
                shape: Some(pb::ShapeProto {
                    element_type: pb::PrimitiveType::Tuple as i32,
                    tuple_shapes: shapes,
                    ..Default::default()
                }),
                tuple_literals,
                ..Default::default()
            })
        }
        Literal::Array(a) => array(a),
    }
}

/// An array constant: its data is row-major, so its shape's layout is too.
fn array(a: &Array) -> Result<pb::LiteralProto, String> {
    use PrimitiveType as P;
    let mut p = pb::LiteralProto { shape: Some(array_shape(&a.shape, true)), ..Default::default() };
    let d = &a.data;
    fn words<const N: usize>(d: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        d.chunks_exact(N).map(|c| {
            let mut w = [0u8; N];
            w.copy_from_slice(c);
            w
        })
    }
    match a.ty() {
        P::Pred => p.preds = d.iter().map(|&b| b != 0).collect(),
        P::S8 => p.s8s = d.clone(),
        P::U8 => p.u8s = d.clone(),
        // One element per byte, as XLA's LiteralProto holds 4-bit types.
        P::S4 => p.s4s = d.iter().map(|&b| b & 0xf).collect(),
        P::U4 => p.u4s = d.iter().map(|&b| b & 0xf).collect(),
        P::S16 => p.s16s = d.clone(),
        P::U16 => p.u16s = d.clone(),
        P::F16 => p.f16s = d.clone(),
        P::Bf16 => p.bf16s = d.clone(),
        P::S32 => p.s32s = words::<4>(d).map(i32::from_le_bytes).collect(),
        P::S64 => p.s64s = words::<8>(d).map(i64::from_le_bytes).collect(),
        P::U32 => p.u32s = words::<4>(d).map(u32::from_le_bytes).collect(),
        P::U64 => p.u64s = words::<8>(d).map(u64::from_le_bytes).collect(),
        P::F32 => p.f32s = words::<4>(d).map(f32::from_le_bytes).collect(),
        P::F64 => p.f64s = words::<8>(d).map(f64::from_le_bytes).collect(),
        P::C64 => p.c64s = words::<4>(d).map(f32::from_le_bytes).collect(),
        P::C128 => p.c128s = words::<8>(d).map(f64::from_le_bytes).collect(),
        P::F8E5M2 => p.f8e5m2s = d.clone(),
        P::F8E4M3FN => p.f8e4m3fns = d.clone(),
        P::F8E4M3B11FNUZ => p.f8e4m3b11fnuzs = d.clone(),
        P::F8E5M2FNUZ => p.f8e5m2fnuzs = d.clone(),
        P::F8E4M3FNUZ => p.f8e4m3fnuzs = d.clone(),
        t @ (P::F8E4M3 | P::F8E3M4 | P::F8E8M0FNU | P::Token) => {
            return Err(format!("a {} constant has no field in this build's copy of XLA's LiteralProto", t.name()));
        }
    }
    Ok(p)
}
