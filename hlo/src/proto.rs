//! HloModuleProto decoder: turns a serialized `xla.HloModuleProto` into the IR.
//!
//! The message types come from `pjrt-sys` (prost-generated from its copy of XLA's protos). That copy predates a few
//! fields newer XLA writes (the `f8e4m3`, `f8e3m4` and `f8e8m0fnu` literal payloads, and the iota replica-group list an
//! instruction carries in field 92), which prost would silently drop; a small supplementary prost message tree below
//! reads just those fields from the same bytes.
//!
//! Every size is bounded before anything is allocated from it, ids must resolve, and nesting is limited, so hostile
//! input yields an [`ErrorKind::Proto`] error rather than a panic or a huge allocation.

use std::collections::{BTreeMap, HashMap};

use cranelift_entity::{EntityRef, PrimaryMap};
use pjrt_sys::protos::xla as pb;

/// XLA's own messages (prost, from `pjrt-sys`), for crates that read parts of a module without the IR (the pass: the
/// device assignment, layouts).
pub use pjrt_sys::protos::xla;
use prost::DecodeError;
/// To decode parts of a module the IR does not keep (the pass: its device assignment).
pub use prost::Message;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};

use crate::ir::{
    Attrs, CompId, ComparisonDirection, Computation, DotDims, InstrId, Instruction, IotaReplicaGroups,
    MAX_IOTA_DEVICES, ModuleConfig, PadDim, ReplicaGroups, Sharding, SliceDim, for_each_transposed,
};
use crate::literal::{Array, Literal};
use crate::opcode::Opcode;
use crate::print::int_list;
use crate::types::{ArrayShape, PrimitiveType, Shape};
use crate::verify::{MAX_ELEMENTS, valid_dim_set};
use crate::wire::Numbering;
use crate::{Error, ErrorKind, Module};

/// Deepest tuple nesting accepted in shapes, literals and shardings.
const MAX_DEPTH: usize = 64;

/// Fields of newer XLA protos that `pjrt-sys`'s copy lacks.
mod extra {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Instruction {
        #[prost(message, optional, tag = "8")]
        pub literal: Option<Literal>,
        /// The iota replica-group list newer XLA writes outside `collective_device_list`.
        #[prost(message, optional, tag = "92")]
        pub iota_device_list: Option<pjrt_sys::protos::xla::IotaReplicaGroupListProto>,
        /// Replica groups named by mesh axes (`replica_groups=mesh['x'=2,'y'=4] {'y'}`), what JAX 0.11's Shardy
        /// lowering (rgv3) emits for shard_map collectives.
        #[prost(message, optional, tag = "93")]
        pub mesh_axes_list: Option<MeshAxesList>,
    }

    /// `xla.MeshAxesReplicaGroupListProto`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MeshAxesList {
        #[prost(message, optional, tag = "1")]
        pub mesh: Option<Mesh>,
        #[prost(message, repeated, tag = "2")]
        pub axes: Vec<AxisRef>,
    }

    /// `xla.MeshProto`: named axes over devices `device_ids` (row-major), or over `iota_transform` applied to
    /// `iota(prod(sizes))`, or over plain iota.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mesh {
        #[prost(message, repeated, tag = "1")]
        pub axes: Vec<MeshAxis>,
        #[prost(int64, repeated, tag = "2")]
        pub device_ids: Vec<i64>,
        #[prost(message, optional, tag = "3")]
        pub iota_transform: Option<IotaTransform>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MeshAxis {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(int64, tag = "2")]
        pub size: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct IotaTransform {
        #[prost(int64, repeated, tag = "1")]
        pub reshape_dims: Vec<i64>,
        #[prost(int64, repeated, tag = "2")]
        pub transpose_perm: Vec<i64>,
    }

    /// `xla.AxisRefProto`: mesh axis `mesh_axis_index`, or the sub-axis of it of size `size` after the first `pre_size`
    /// (major) factor.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AxisRef {
        #[prost(int64, tag = "1")]
        pub mesh_axis_index: i64,
        #[prost(message, optional, tag = "2")]
        pub sub_axis_info: Option<SubAxis>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SubAxis {
        #[prost(int64, tag = "1")]
        pub pre_size: i64,
        #[prost(int64, tag = "2")]
        pub size: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Literal {
        #[prost(message, repeated, tag = "10")]
        pub tuple_literals: Vec<Literal>,
        #[prost(bytes = "vec", tag = "28")]
        pub f8e4m3s: Vec<u8>,
        #[prost(bytes = "vec", tag = "29")]
        pub f8e3m4s: Vec<u8>,
        #[prost(bytes = "vec", tag = "33")]
        pub f8e8m0fnus: Vec<u8>,
    }
}

/// One prost parse of a module that keeps the fields `pjrt-sys`'s messages lack: each message on the way to an
/// instruction is its `pjrt-sys` message `p` and `x`, which reads fields `A` and `B` (the children, or an instruction's
/// newer fields) and, with `p`, field `BOTH`.
#[derive(Debug, Default)]
struct Parsed<P, X, const A: u32, const B: u32, const BOTH: u32> {
    p: P,
    x: X,
}

type ParsedModule = Parsed<pb::HloModuleProto, Comps, 3, 3, 0>;
type ParsedInstr = Parsed<pb::HloInstructionProto, extra::Instruction, 92, 93, 8>;

#[derive(prost::Message)]
struct Comps {
    #[prost(message, repeated, tag = "3")]
    items: Vec<Parsed<pb::HloComputationProto, Instrs, 2, 2, 0>>,
}

#[derive(prost::Message)]
struct Instrs {
    #[prost(message, repeated, tag = "2")]
    items: Vec<ParsedInstr>,
}

impl<P: Message + Default, X: Message + Default, const A: u32, const B: u32, const BOTH: u32> Message
    for Parsed<P, X, A, B, BOTH>
{
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.p.encode_raw(buf);
        self.x.encode_raw(buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wt: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag == A || tag == B {
            self.x.merge_field(tag, wt, buf, ctx)
        } else if tag == BOTH {
            // Its bytes, read once, go to each.
            let mut bytes = prost::bytes::Bytes::new();
            prost::encoding::bytes::merge(wt, &mut bytes, buf, ctx.clone())?;
            let mut field = Vec::with_capacity(bytes.len() + 10);
            prost::encoding::encode_varint(bytes.len() as u64, &mut field);
            field.extend_from_slice(&bytes);
            self.p.merge_field(tag, wt, &mut &field[..], ctx.clone())?;
            self.x.merge_field(tag, wt, &mut &field[..], ctx)
        } else {
            self.p.merge_field(tag, wt, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        self.p.encoded_len() + self.x.encoded_len()
    }

    fn clear(&mut self) {
        self.p.clear();
        self.x.clear();
    }
}

type R<T> = Result<T, Error>;

thread_local! {
    static DECODES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Modules this thread has decoded so far ([`decode`]): what a test counts to show a caller decodes once.
pub fn decodes_on_this_thread() -> usize {
    DECODES.with(std::cell::Cell::get)
}

/// Decodes a serialized `HloModuleProto` into an unverified module, numbered as [`Numbering`] says.
pub fn decode(file: &str, bytes: &[u8]) -> Result<Module, Error> {
    DECODES.with(|n| n.set(n.get() + 1));
    let m = ParsedModule::decode(bytes)
        .map_err(|e| Error::new(ErrorKind::Proto, file, format!("cannot decode HloModuleProto: {e}")))?;
    Decoder { file }.module(&m)
}

struct Decoder<'a> {
    file: &'a str,
}

fn primitive_type(v: i32) -> Result<PrimitiveType, String> {
    PrimitiveType::ALL.into_iter().find(|t| t.proto_number() == v).ok_or_else(|| match v {
        14 => "element type OPAQUE_TYPE is not supported".into(),
        26 | 27 => "2-bit element types (s2/u2) are not supported".into(),
        30 | 31 => "1-bit element types are not supported".into(),
        32 => "element type f4e2m1fn is not supported".into(),
        0 => "element type PRIMITIVE_TYPE_INVALID".into(),
        v => format!("unknown element type {v}"),
    })
}

/// Opcodes whose text form always carries `dimensions={...}` (even when empty).
fn has_dimensions_attr(op: Opcode) -> bool {
    use Opcode::*;
    matches!(
        op,
        Broadcast
            | Transpose
            | Reduce
            | Concatenate
            | Reverse
            | AllGather
            | AllGatherStart
            | ReduceScatter
            | Sort
            | Map
            | GetDimensionSize
            | SetDimensionSize
    )
}

/// Collectives that XLA always prints with `replica_groups=` (`{}` when empty): all but collective-permute
/// (`source_target_pairs=`).
fn has_replica_groups(op: Opcode) -> bool {
    op.is_collective() && !matches!(op, Opcode::CollectivePermute | Opcode::CollectivePermuteStart)
}

/// `OpSharding.Type`'s values by number, as `last_tile_dims={..}` spells them.
pub(crate) const SHARDING_TYPES: [&str; 6] = ["replicated", "maximal", "tuple", "other", "manual", "unknown"];

/// Reorders `data` (elements of `esize` bytes laid out per `minor_to_major`) into row-major order.
fn to_row_major(data: &[u8], dims: &[usize], minor_to_major: &[usize], esize: usize) -> Vec<u8> {
    // Physical order, major to minor.
    let order: Vec<usize> = minor_to_major.iter().rev().copied().collect();
    let mut out = vec![0u8; data.len()];
    for_each_transposed(dims, &order, |p, off| {
        out[off * esize..(off + 1) * esize].copy_from_slice(&data[p * esize..(p + 1) * esize]);
    });
    out
}

/// Builds an iota replica-group form, normalizing an identity permutation to empty (as the text form writes it).
fn iota_groups(l: &pb::IotaReplicaGroupListProto) -> ReplicaGroups {
    let perm: Vec<i64> = l.iota_transpose_perm.iter().map(|&p| p as i64).collect();
    let identity = perm.iter().enumerate().all(|(i, &p)| p == i as i64);
    ReplicaGroups::Iota(IotaReplicaGroups {
        num_groups: l.num_replica_groups,
        group_size: l.num_devices_per_group,
        reshape_dims: l.iota_reshape_dims.clone(),
        transpose_perm: if identity { Vec::new() } else { perm },
    })
}

/// Replica groups named by mesh axes ([`ReplicaGroups::from_mesh`]), after the checks the text form's syntax makes.
fn mesh_axes_groups(l: &extra::MeshAxesList) -> Result<ReplicaGroups, String> {
    let mesh = l.mesh.as_ref().ok_or("no mesh")?;
    let sizes: Vec<i64> = mesh.axes.iter().map(|a| a.size).collect();
    if sizes.iter().any(|&s| s < 1) {
        return Err(format!("mesh axis sizes {sizes:?} must be positive"));
    }
    let total = sizes.iter().try_fold(1i64, |acc, &s| acc.checked_mul(s)).filter(|&t| t <= MAX_IOTA_DEVICES);
    let total = total.ok_or_else(|| format!("mesh {sizes:?} has more than {MAX_IOTA_DEVICES} devices"))?;
    let refs = l
        .axes
        .iter()
        .map(|r| {
            let axis = usize::try_from(r.mesh_axis_index).ok().filter(|&a| a < sizes.len());
            let axis = axis.ok_or_else(|| format!("axis index out of range for a mesh of {} axes", sizes.len()))?;
            let full = sizes[axis];
            let Some(s) = &r.sub_axis_info else { return Ok((axis, 1, full)) };
            if l.axes.iter().any(|o| o.mesh_axis_index == r.mesh_axis_index && o.sub_axis_info.is_none()) {
                return Err("an axis is referenced both whole and split".into());
            }
            if s.pre_size < 1 || s.size < 2 {
                return Err(format!("bad sub-axis ({}){}", s.pre_size, s.size));
            }
            match s.pre_size.checked_mul(s.size).filter(|&end| end <= full) {
                None => Err("sub-axes exceed their axis".into()),
                Some(end) if full % end != 0 => Err(format!("sub-axes do not divide mesh axis {axis} of size {full}")),
                Some(_) => Ok((axis, s.pre_size, s.size)),
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    // Device at each mesh position (row-major).
    let devices = if !mesh.device_ids.is_empty() {
        if mesh.device_ids.len() as i64 != total {
            return Err(format!("{} device ids for a mesh of {total} devices", mesh.device_ids.len()));
        }
        Some(mesh.device_ids.clone())
    } else if let Some(t) = &mesh.iota_transform {
        let all = IotaReplicaGroups::devices(total, t.reshape_dims.clone(), t.transpose_perm.clone());
        Some(all.ok_or("inconsistent mesh iota transform")?)
    } else {
        None
    };
    ReplicaGroups::from_mesh(&sizes, &refs, devices, true)
}

impl Decoder<'_> {
    fn err(&self, msg: impl Into<String>) -> Error {
        Error::new(ErrorKind::Proto, self.file, msg)
    }

    fn module(&self, m: &ParsedModule) -> R<Module> {
        let p = &m.p;
        // Pass 1: computation and instruction ids.
        let mut ids = Numbering::default();
        for c in &m.x.items {
            let name = &c.p.name;
            ids.comp(c.p.id)
                .ok_or_else(|| self.err(format!("computation id {} ({name}) appears more than once", c.p.id)))?;
            for ins in &c.x.items {
                ids.instr(ins.p.id).ok_or_else(|| {
                    self.err(format!(
                        "instruction id {} ({}) appears more than once in computation {name}",
                        ins.p.id, ins.p.name
                    ))
                })?;
            }
        }
        if ids.count() >= u32::MAX as usize || m.x.items.len() >= u32::MAX as usize {
            return Err(self.err("too many instructions"));
        }
        let comp_ids = &ids.comps;

        // Pass 2: build.
        let mut comps: PrimaryMap<CompId, Computation> = PrimaryMap::with_capacity(m.x.items.len());
        let mut instrs: PrimaryMap<InstrId, Instruction> = PrimaryMap::with_capacity(ids.count());
        for (ci, Parsed { p: c, x: Instrs { items } }) in m.x.items.iter().enumerate() {
            let cid = CompId::new(ci);
            let ids = &ids.instrs[ci];
            let mut list = Vec::with_capacity(items.len());
            let mut params: Vec<(i64, InstrId)> = Vec::new();
            for ins in items {
                let built = self.instruction(ins, cid, ids, comp_ids).map_err(|e| {
                    self.err(format!("computation {}, instruction {}: {}", c.name, ins.p.name, e.message))
                })?;
                if built.opcode == Opcode::Parameter {
                    params.push((ins.p.parameter_number, InstrId::new(instrs.len())));
                }
                list.push(instrs.push(built));
            }
            params.sort();
            let root = *ids
                .get(&c.root_id)
                .ok_or_else(|| self.err(format!("computation {}: root id {} does not resolve", c.name, c.root_id)))?;
            comps.push(Computation {
                name: c.name.clone(),
                instrs: list,
                params: params.into_iter().map(|(_, i)| i).collect(),
                root,
                span: None,
            });
        }
        let entry = match comp_ids.get(&p.entry_computation_id) {
            Some(&e) => e,
            None => comps
                .iter()
                .find(|(_, c)| !p.entry_computation_name.is_empty() && c.name == p.entry_computation_name)
                .map(|(id, _)| id)
                .ok_or_else(|| {
                    self.err(format!(
                        "entry computation id {} ({}) does not resolve",
                        p.entry_computation_id, p.entry_computation_name
                    ))
                })?,
        };
        let frontend_attributes: BTreeMap<String, String> =
            p.frontend_attributes.as_ref().map(|f| f.map.clone().into_iter().collect()).unwrap_or_default();
        Ok(Module {
            name: p.name.clone(),
            config: ModuleConfig { replica_count: 1, num_partitions: 1, frontend_attributes, ..Default::default() },
            comps,
            instrs,
            entry,
            source_name: self.file.to_owned(),
        })
    }

    // `replica_groups` (field 49) is deprecated in favour of `collective_device_list`, but older producers still write
    // it.
    #[allow(deprecated)]
    fn instruction(
        &self,
        parsed: &ParsedInstr,
        parent: CompId,
        ids: &HashMap<i64, InstrId>,
        comp_ids: &HashMap<i64, CompId>,
    ) -> R<Instruction> {
        let (p, x) = (&parsed.p, &parsed.x);
        let opcode = Opcode::from_name(&p.opcode).ok_or_else(|| self.err(format!("unknown opcode '{}'", p.opcode)))?;
        let shape = self.shape(p.shape.as_ref().ok_or_else(|| self.err("instruction has no shape"))?, 0)?;
        let resolve = |what: &str, id: i64| {
            ids.get(&id)
                .copied()
                .ok_or_else(|| self.err(format!("{what} id {id} does not resolve in this computation")))
        };
        let operands = p.operand_ids.iter().map(|&i| resolve("operand", i)).collect::<R<Vec<_>>>()?;
        let control_predecessors =
            p.control_predecessor_ids.iter().map(|&i| resolve("control predecessor", i)).collect::<R<Vec<_>>>()?;
        let mut called = p
            .called_computation_ids
            .iter()
            .map(|&i| {
                comp_ids.get(&i).copied().ok_or_else(|| self.err(format!("called computation id {i} does not resolve")))
            })
            .collect::<R<Vec<_>>>()?;
        if opcode == Opcode::While && called.len() == 2 {
            // XLA serializes (body, condition); the IR's order is the text form's (condition, body).
            called.swap(0, 1);
        }

        let mut a = Attrs { control_predecessors, ..Attrs::default() };
        match opcode {
            Opcode::Parameter => a.parameter_number = Some(p.parameter_number),
            Opcode::GetTupleElement => a.tuple_index = Some(p.tuple_index),
            Opcode::Iota => a.iota_dimension = p.dimensions.first().copied(),
            Opcode::Constant => {
                let lp = p.literal.as_ref().ok_or_else(|| self.err("constant has no literal"))?;
                a.literal = Some(self.literal(lp, x.literal.as_ref(), &shape, 0)?);
            }
            _ => {}
        }
        if opcode != Opcode::Iota && (has_dimensions_attr(opcode) || !p.dimensions.is_empty()) {
            a.dimensions = Some(p.dimensions.clone());
        }
        let list = p.collective_device_list.as_ref();
        a.replica_groups = if let Some(l) = &x.mesh_axes_list {
            Some(mesh_axes_groups(l).map_err(|e| self.err(format!("mesh-axes replica groups: {e}")))?)
        } else if let Some(l) = x.iota_device_list.as_ref().or(list.and_then(|d| d.iota_replica_group_list.as_ref())) {
            Some(iota_groups(l))
        } else if let Some(g) =
            [list.map_or(&[][..], |d| &d.replica_groups), &p.replica_groups].iter().find(|g| !g.is_empty())
        {
            Some(ReplicaGroups::Explicit(g.iter().map(|g| g.replica_ids.clone()).collect()))
        } else if has_replica_groups(opcode) {
            Some(ReplicaGroups::Explicit(Vec::new()))
        } else {
            None
        };
        a.channel_id = (p.channel_id > 0).then_some(p.channel_id);
        a.use_global_device_ids = p.use_global_device_ids;
        if opcode == Opcode::Slice || !p.slice_dimensions.is_empty() {
            a.slice = Some(
                p.slice_dimensions
                    .iter()
                    .map(|s| SliceDim { start: s.start, limit: s.limit, stride: s.stride })
                    .collect(),
            );
        }
        if opcode == Opcode::DynamicSlice || !p.dynamic_slice_sizes.is_empty() {
            a.dynamic_slice_sizes = Some(p.dynamic_slice_sizes.clone());
        }
        if let Some(pc) = &p.padding_config {
            a.padding = Some(
                pc.dimensions
                    .iter()
                    .map(|d| PadDim { lo: d.edge_padding_low, hi: d.edge_padding_high, interior: d.interior_padding })
                    .collect(),
            );
        }
        if matches!(opcode, Opcode::CollectivePermute | Opcode::CollectivePermuteStart)
            || !p.source_target_pairs.is_empty()
        {
            a.source_target_pairs = Some(p.source_target_pairs.iter().map(|s| (s.source, s.target)).collect());
        }
        a.sharding = p.sharding.as_ref().map(|s| self.sharding(s, 0)).transpose()?;
        if let Some(f) = &p.frontend_attributes {
            a.frontend_attributes = f.map.clone().into_iter().collect();
        }
        a.backend_config = (!p.backend_config.is_empty()).then(|| String::from_utf8_lossy(&p.backend_config).into());
        a.metadata = p.metadata.as_ref().and_then(metadata);
        a.custom_call_target = (!p.custom_call_target.is_empty()).then(|| p.custom_call_target.clone());
        if !p.comparison_direction.is_empty() {
            a.comparison_direction = Some(
                ComparisonDirection::from_name(&p.comparison_direction)
                    .ok_or_else(|| self.err(format!("unknown comparison direction '{}'", p.comparison_direction)))?,
            );
        }
        a.comparison_type = (!p.comparison_type.is_empty()).then(|| p.comparison_type.clone());
        a.dot = p.dot_dimension_numbers.as_ref().map(|d| DotDims {
            lhs_batch: d.lhs_batch_dimensions.clone(),
            rhs_batch: d.rhs_batch_dimensions.clone(),
            lhs_contracting: d.lhs_contracting_dimensions.clone(),
            rhs_contracting: d.rhs_contracting_dimensions.clone(),
        });
        // Gather's and scatter's dimension numbers become the text form's attributes, which the encoder reads for both
        // front ends.
        if let Some(g) = &p.gather_dimension_numbers {
            a.other.insert("offset_dims".into(), int_list(&g.offset_dims));
            a.other.insert("collapsed_slice_dims".into(), int_list(&g.collapsed_slice_dims));
            a.other.insert("start_index_map".into(), int_list(&g.start_index_map));
            a.other.insert("index_vector_dim".into(), g.index_vector_dim.to_string());
            if !g.operand_batching_dims.is_empty() {
                a.other.insert("operand_batching_dims".into(), int_list(&g.operand_batching_dims));
                a.other.insert("start_indices_batching_dims".into(), int_list(&g.start_indices_batching_dims));
            }
            a.other.insert("slice_sizes".into(), int_list(&p.gather_slice_sizes));
        }
        if let Some(g) = &p.scatter_dimension_numbers {
            a.other.insert("update_window_dims".into(), int_list(&g.update_window_dims));
            a.other.insert("inserted_window_dims".into(), int_list(&g.inserted_window_dims));
            a.other.insert("scatter_dims_to_operand_dims".into(), int_list(&g.scatter_dims_to_operand_dims));
            a.other.insert("index_vector_dim".into(), g.index_vector_dim.to_string());
            if !g.input_batching_dims.is_empty() {
                a.other.insert("input_batching_dims".into(), int_list(&g.input_batching_dims));
                a.other.insert("scatter_indices_batching_dims".into(), int_list(&g.scatter_indices_batching_dims));
            }
        }
        if let Some(c) = &p.convolution_dimension_numbers {
            // dim_labels as the text form prints it, which the encoder reads: per operand, the letters of its two
            // non-spatial dimensions and the digit of each spatial one, at their positions.
            let rank = 2 + c.input_spatial_dimensions.len();
            let [lhs, rhs, out] = [
                (c.input_batch_dimension, c.input_feature_dimension, &c.input_spatial_dimensions, "bf"),
                (
                    c.kernel_input_feature_dimension,
                    c.kernel_output_feature_dimension,
                    &c.kernel_spatial_dimensions,
                    "io",
                ),
                (c.output_batch_dimension, c.output_feature_dimension, &c.output_spatial_dimensions, "bf"),
            ]
            .map(|(a, b, spatial, letters)| {
                let mut l = vec!['?'; rank];
                let digits =
                    spatial.iter().enumerate().map(|(k, &d)| (d, char::from_digit(k as u32, 10).unwrap_or('?')));
                for (d, ch) in [a, b].into_iter().zip(letters.chars()).chain(digits) {
                    if let Some(x) = usize::try_from(d).ok().and_then(|d| l.get_mut(d)) {
                        *x = ch;
                    }
                }
                l.into_iter().collect::<String>()
            });
            a.other.insert("dim_labels".into(), format!("{lhs}_{rhs}->{out}"));
            a.other.insert("feature_group_count".into(), p.feature_group_count.max(1).to_string());
            a.other.insert("batch_group_count".into(), p.batch_group_count.max(1).to_string());
        }
        if let Some(w) = &p.window {
            // The text form, which `Window::of` reads for both front ends.
            a.other.insert("window".into(), window_text(&w.dimensions));
        }
        if !p.fusion_kind.is_empty() {
            a.other.insert("kind".into(), p.fusion_kind.clone());
        }
        self.small_attrs(p, opcode, &mut a.other)?;
        Ok(Instruction { name: p.name.clone(), opcode, shape, operands, called, attrs: a, parent, span: None })
    }

    /// Flags and small attributes the IR does not type, written as XLA's text form spells them (as gather's dimension
    /// numbers are), so that both front ends keep the same `other` entries and the printer writes them back: the
    /// custom-call ones (side effect, API version, schedule, operand layouts, output aliasing), sort's stability,
    /// scatter's and gather's index hints, precision, and the parameters of reduce-precision, top-k, rng,
    /// rng-bit-generator and fft.
    fn small_attrs(&self, p: &pb::HloInstructionProto, opcode: Opcode, other: &mut BTreeMap<String, String>) -> R<()> {
        let mut put = |key: &str, value: String| {
            other.insert(key.into(), value);
        };
        for (key, on) in [
            ("is_host_transfer", p.is_host_transfer),
            ("constrain_layout", p.constrain_layout),
            ("is_stable", p.is_stable),
            ("indices_are_sorted", p.indices_are_sorted),
            ("unique_indices", p.unique_indices),
            ("custom_call_has_side_effect", p.custom_call_has_side_effect),
        ] {
            if on {
                put(key, "true".into());
            }
        }
        if let Some(pc) = &p.precision_config
            && pc.operand_precision.iter().any(|&x| x != 0)
        {
            let names = pc
                .operand_precision
                .iter()
                .map(|&x| {
                    self.enum_name("operand precision", x, pb::precision_config::Precision::as_str_name)
                        .map(str::to_ascii_lowercase)
                })
                .collect::<R<Vec<_>>>()?;
            put("operand_precision", format!("{{{}}}", names.join(",")));
        }
        match opcode {
            Opcode::CustomCall => {
                // 0 (unspecified) and 1 (original) are both the original API, which XLA does not print.
                let v = p.custom_call_api_version;
                if v > 1 {
                    put(
                        "api_version",
                        self.enum_name("custom_call_api_version", v, pb::CustomCallApiVersion::as_str_name)?.into(),
                    );
                }
                let v = p.custom_call_schedule;
                if v != 0 {
                    put(
                        "schedule",
                        self.enum_name("custom_call_schedule", v, pb::CustomCallSchedule::as_str_name)?.into(),
                    );
                }
                if !p.operand_shapes_with_layout.is_empty() {
                    let shapes = p
                        .operand_shapes_with_layout
                        .iter()
                        .map(|s| self.shape(s, 0).map(|s| s.to_string()))
                        .collect::<R<Vec<_>>>()?;
                    put("operand_layout_constraints", format!("{{{}}}", shapes.join(", ")));
                }
                if !p.output_operand_aliasing.is_empty() {
                    let pairs: Vec<String> = p
                        .output_operand_aliasing
                        .iter()
                        .map(|o| {
                            format!(
                                "{}: ({}, {})",
                                int_list(&o.output_shape_index),
                                o.operand_index,
                                int_list(&o.operand_shape_index)
                            )
                        })
                        .collect();
                    put("output_to_operand_aliasing", format!("{{{}}}", pairs.join(", ")));
                }
            }
            Opcode::ReducePrecision => {
                put("exponent_bits", p.exponent_bits.to_string());
                put("mantissa_bits", p.mantissa_bits.to_string());
            }
            Opcode::TopK => {
                put("k", p.k.to_string());
                put("largest", p.largest.to_string());
            }
            Opcode::Rng => {
                let name = self.enum_name("rng distribution", p.distribution, pb::RandomDistribution::as_str_name)?;
                put("distribution", name.to_ascii_lowercase());
            }
            Opcode::RngBitGenerator => {
                let name = self.enum_name("rng algorithm", p.rng_algorithm, pb::RandomAlgorithm::as_str_name)?;
                put("algorithm", name.to_ascii_lowercase());
            }
            Opcode::Fft => {
                put("fft_type", self.enum_name("fft type", p.fft_type, pb::FftType::as_str_name)?.into());
                put("fft_length", int_list(&p.fft_length));
            }
            _ => {}
        }
        Ok(())
    }

    /// The name of value `v` of XLA's enum `E`.
    fn enum_name<E: TryFrom<i32>>(&self, what: &str, v: i32, name: fn(&E) -> &'static str) -> R<&'static str> {
        E::try_from(v).ok().as_ref().map(name).ok_or_else(|| self.err(format!("unknown {what} {v}")))
    }

    fn shape(&self, s: &pb::ShapeProto, depth: usize) -> R<Shape> {
        if depth > MAX_DEPTH {
            return Err(self.err(format!("shape nests tuples deeper than {MAX_DEPTH} levels")));
        }
        match s.element_type {
            13 => Ok(Shape::Tuple(s.tuple_shapes.iter().map(|t| self.shape(t, depth + 1)).collect::<R<Vec<_>>>()?)),
            17 => Ok(Shape::Token),
            t => {
                let ty = primitive_type(t).map_err(|m| self.err(m))?;
                if let Some(&d) = s.dimensions.iter().find(|&&d| d < 0) {
                    return Err(self.err(format!("shape has a negative dimension {d}")));
                }
                if s.dimensions
                    .iter()
                    .try_fold(1u128, |n, &d| n.checked_mul(d as u128))
                    .is_none_or(|n| n > MAX_ELEMENTS)
                {
                    return Err(self.err(format!("shape {:?} has more than 2^40 elements", s.dimensions)));
                }
                let m2m = s.layout.as_ref().map(|l| l.minor_to_major.clone()).unwrap_or_default();
                let layout = if m2m.is_empty() {
                    None
                } else {
                    let rank = s.dimensions.len();
                    if m2m.len() != rank || !valid_dim_set(&m2m, rank) {
                        return Err(self.err(format!(
                            "layout minor_to_major {m2m:?} is not a permutation of the {rank} dimensions"
                        )));
                    }
                    Some(m2m)
                };
                Ok(Shape::Array(ArrayShape { ty, dims: s.dimensions.clone(), layout }))
            }
        }
    }

    fn literal(&self, p: &pb::LiteralProto, x: Option<&extra::Literal>, fallback: &Shape, depth: usize) -> R<Literal> {
        if depth > MAX_DEPTH {
            return Err(self.err(format!("literal nests tuples deeper than {MAX_DEPTH} levels")));
        }
        let shape = match &p.shape {
            Some(s) => self.shape(s, depth)?,
            None => fallback.clone(),
        };
        match &shape {
            Shape::Token => Ok(Literal::Token),
            Shape::Tuple(elems) => {
                if p.tuple_literals.len() != elems.len() {
                    return Err(self.err(format!(
                        "tuple literal has {} elements, its shape has {}",
                        p.tuple_literals.len(),
                        elems.len()
                    )));
                }
                let parts = p
                    .tuple_literals
                    .iter()
                    .zip(elems)
                    .enumerate()
                    .map(|(i, (l, s))| self.literal(l, x.and_then(|x| x.tuple_literals.get(i)), s, depth + 1))
                    .collect::<R<Vec<_>>>()?;
                Ok(Literal::Tuple(parts))
            }
            Shape::Array(a) => Ok(Literal::Array(self.array(p, x, a)?)),
        }
    }

    fn array(&self, p: &pb::LiteralProto, x: Option<&extra::Literal>, a: &ArrayShape) -> R<Array> {
        use PrimitiveType as P;
        let ext = |f: fn(&extra::Literal) -> &Vec<u8>| x.map_or_else(Vec::new, |x| f(x).clone());
        let data = match a.ty {
            P::Pred => p.preds.iter().map(|&b| b as u8).collect(),
            P::S8 => p.s8s.clone(),
            P::U8 => p.u8s.clone(),
            P::S4 => p.s4s.iter().map(|&b| (((b & 0xf) << 4) as i8 >> 4) as u8).collect(),
            P::U4 => p.u4s.iter().map(|&b| b & 0xf).collect(),
            P::S16 => p.s16s.clone(),
            P::U16 => p.u16s.clone(),
            P::F16 => p.f16s.clone(),
            P::Bf16 => p.bf16s.clone(),
            P::S32 => p.s32s.iter().flat_map(|v| v.to_le_bytes()).collect(),
            P::S64 => p.s64s.iter().flat_map(|v| v.to_le_bytes()).collect(),
            P::U32 => p.u32s.iter().flat_map(|v| v.to_le_bytes()).collect(),
            P::U64 => p.u64s.iter().flat_map(|v| v.to_le_bytes()).collect(),
            P::F32 => p.f32s.iter().flat_map(|v| v.to_le_bytes()).collect(),
            P::F64 => p.f64s.iter().flat_map(|v| v.to_le_bytes()).collect(),
            P::C64 => p.c64s.iter().flat_map(|v| v.to_le_bytes()).collect(),
            P::C128 => p.c128s.iter().flat_map(|v| v.to_le_bytes()).collect(),
            P::F8E5M2 => p.f8e5m2s.clone(),
            P::F8E4M3FN => p.f8e4m3fns.clone(),
            P::F8E4M3B11FNUZ => p.f8e4m3b11fnuzs.clone(),
            P::F8E5M2FNUZ => p.f8e5m2fnuzs.clone(),
            P::F8E4M3FNUZ => p.f8e4m3fnuzs.clone(),
            P::F8E4M3 => ext(|x| &x.f8e4m3s),
            P::F8E3M4 => ext(|x| &x.f8e3m4s),
            P::F8E8M0FNU => ext(|x| &x.f8e8m0fnus),
            P::Token => return Err(self.err("token-typed array literal")),
        };
        // (Token, the one type of no byte size, was rejected above.)
        if data.len() != a.byte_size() {
            return Err(self.err(format!(
                "literal of shape {} needs {} elements, got {} ({} bytes)",
                ArrayShape::new(a.ty, a.dims.clone()),
                a.element_count(),
                data.len() / a.ty.byte_size(),
                data.len()
            )));
        }
        let data = match &a.layout {
            Some(m2m) if a.rank() >= 2 && m2m.iter().rev().enumerate().any(|(i, &d)| d != i as i64) => {
                let dims: Vec<usize> = a.dims.iter().map(|&d| d as usize).collect();
                let m2m: Vec<usize> = m2m.iter().map(|&d| d as usize).collect();
                to_row_major(&data, &dims, &m2m, a.ty.byte_size())
            }
            _ => data,
        };
        Array::new(a.clone(), data).map_err(|e| self.err(e.to_string()))
    }

    fn sharding(&self, s: &pb::OpSharding, depth: usize) -> R<Sharding> {
        if depth > MAX_DEPTH {
            return Err(self.err(format!("sharding nests tuples deeper than {MAX_DEPTH} levels")));
        }
        Ok(match s.r#type {
            0 => Sharding::Replicated,
            4 => Sharding::Manual,
            // Braced, as the text front end keeps an unmodelled sharding.
            5 => Sharding::Other("{unknown}".into()),
            1 => Sharding::Maximal {
                device: *s
                    .tile_assignment_devices
                    .first()
                    .ok_or_else(|| self.err("maximal sharding without a device"))?,
            },
            2 => Sharding::Tuple(s.tuple_shardings.iter().map(|t| self.sharding(t, depth + 1)).collect::<R<Vec<_>>>()?),
            3 => {
                let tile_dims = s.tile_assignment_dimensions.clone();
                let bounded = |v: &[i64]| {
                    v.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d).filter(|&t| d >= 0 && t <= MAX_IOTA_DEVICES))
                };
                let total = bounded(&tile_dims).ok_or_else(|| {
                    self.err(format!("sharding tile assignment {tile_dims:?} is too large or negative"))
                })?;
                let devices = if s.iota_reshape_dims.is_empty() {
                    s.tile_assignment_devices.clone()
                } else {
                    let n = bounded(&s.iota_reshape_dims).ok_or_else(|| {
                        self.err(format!("sharding iota dims {:?} are too large or negative", s.iota_reshape_dims))
                    })?;
                    let perm = s.iota_transpose_perm.iter().map(|&p| p as i64).collect();
                    IotaReplicaGroups::devices(n, s.iota_reshape_dims.clone(), perm).unwrap_or_default()
                };
                if devices.len() as i64 != total {
                    return Err(self.err(format!(
                        "sharding tile assignment {tile_dims:?} needs {total} devices, got {}",
                        devices.len()
                    )));
                }
                Sharding::Tiled {
                    tile_dims,
                    devices,
                    last_tile_dim_replicate: s.replicate_on_last_tile_dim,
                    last_tile_dims: s
                        .last_tile_dims
                        .iter()
                        .map(|&t| {
                            usize::try_from(t)
                                .ok()
                                .and_then(|t| SHARDING_TYPES.get(t))
                                .map_or(format!("type{t}"), |n| n.to_string())
                        })
                        .collect(),
                }
            }
            t => Sharding::Other(format!("{{type{t}}}")),
        })
    }
}

/// `{size=.. stride=.. pad=lo_hi.. lhs_dilate=.. rhs_dilate=.. rhs_reversal=..}`, as XLA prints a window: a field whose
/// entries are all the default is left out.
fn window_text(dims: &[pb::WindowDimension]) -> String {
    let mut fields: Vec<String> = Vec::new();
    let mut field = |name: &str, show: bool, entry: &dyn Fn(&pb::WindowDimension) -> String| {
        if show {
            fields.push(format!("{name}={}", dims.iter().map(entry).collect::<Vec<_>>().join("x")));
        }
    };
    field("size", !dims.is_empty(), &|d| d.size.to_string());
    field("stride", dims.iter().any(|d| d.stride != 1), &|d| d.stride.to_string());
    field("pad", dims.iter().any(|d| d.padding_low != 0 || d.padding_high != 0), &|d| {
        format!("{}_{}", d.padding_low, d.padding_high)
    });
    field("lhs_dilate", dims.iter().any(|d| d.base_dilation != 1), &|d| d.base_dilation.to_string());
    field("rhs_dilate", dims.iter().any(|d| d.window_dilation != 1), &|d| d.window_dilation.to_string());
    field("rhs_reversal", dims.iter().any(|d| d.window_reversal), &|d| u8::from(d.window_reversal).to_string());
    format!("{{{}}}", fields.join(" "))
}

/// `{op_type="..." op_name="..." source_file="..." source_line=N}`, as XLA prints it.
fn metadata(m: &pb::OpMetadata) -> Option<String> {
    let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let mut parts: Vec<String> = [("op_type", &m.op_type), ("op_name", &m.op_name), ("source_file", &m.source_file)]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}=\"{}\"", quote(v)))
        .collect();
    if m.source_line != 0 {
        parts.push(format!("source_line={}", m.source_line));
    }
    (!parts.is_empty()).then(|| format!("{{{}}}", parts.join(" ")))
}

#[cfg(test)]
#[path = "../tests/unit/proto.rs"]
mod tests;
