//! The HLO IR: a module owns every computation and instruction in arenas keyed by typed `u32` indices
//! (cranelift-entity), so passes hold small copyable ids instead of pointers. Both front ends (text and proto) build
//! this same IR, and [`crate::verify`] checks it before anything consumes it.

use std::collections::BTreeMap;
use std::fmt;

use cranelift_entity::{PrimaryMap, entity_impl};

use crate::literal::Literal;
use crate::opcode::Opcode;
use crate::print::{group_list, join};
use crate::types::Shape;
use crate::verify::valid_dim_set;

/// Index of an instruction in [`Module::instrs`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstrId(u32);
entity_impl!(InstrId, "%");

/// Index of a computation in [`Module::comps`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CompId(u32);
entity_impl!(CompId, "comp");

/// A position in the source text (1-based line and column), for diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    pub line: u32,
    pub col: u32,
    /// Length in characters of the spanned text (at least 1 when shown).
    pub len: u32,
}

named_enum! {
    /// Comparison direction of a `compare` instruction.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum ComparisonDirection {
        Eq => "EQ",
        Ne => "NE",
        Lt => "LT",
        Le => "LE",
        Gt => "GT",
        Ge => "GE",
    }
}

/// Replica groups as XLA spells them: an explicit list `{{0,2},{1,3}}`, or the compact iota form
/// `[G,S]<=[d0,d1,..]T(p0,p1,..)` (a reshape of `iota(prod(dims))` to `dims`, transposed by `perm`, then read as `G`
/// groups of `S`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ReplicaGroups {
    Explicit(Vec<Vec<i64>>),
    Iota(IotaReplicaGroups),
}

/// The iota form of replica groups.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IotaReplicaGroups {
    pub num_groups: i64,
    pub group_size: i64,
    pub reshape_dims: Vec<i64>,
    /// Empty means the identity permutation.
    pub transpose_perm: Vec<i64>,
}

/// Largest device count an iota form (replica groups, a tile assignment, a mesh) may expand to.
pub(crate) const MAX_IOTA_DEVICES: i64 = 1 << 24;

impl IotaReplicaGroups {
    /// `iota(total)` reshaped to `reshape_dims` and transposed, as one list: the devices of a tile assignment or mesh
    /// in iota form. `None` if inconsistent.
    pub fn devices(total: i64, reshape_dims: Vec<i64>, transpose_perm: Vec<i64>) -> Option<Vec<i64>> {
        IotaReplicaGroups { num_groups: 1, group_size: total, reshape_dims, transpose_perm }
            .expand()?
            .into_iter()
            .next()
    }

    /// Expands to explicit groups. `None` if the form is inconsistent (product of dims ≠ groups × size, or a bad
    /// permutation).
    pub fn expand(&self) -> Option<Vec<Vec<i64>>> {
        // Checked arithmetic: this may be called on unverified input.
        if self.reshape_dims.iter().any(|&d| d < 0) {
            return None;
        }
        let total = self.reshape_dims.iter().try_fold(1i64, |acc, &d| acc.checked_mul(d))?;
        if self.num_groups < 0 || self.group_size < 0 || Some(total) != self.num_groups.checked_mul(self.group_size) {
            return None;
        }
        if total > MAX_IOTA_DEVICES {
            return None;
        }
        let rank = self.reshape_dims.len();
        let perm: Vec<usize> = if self.transpose_perm.is_empty() {
            (0..rank).collect()
        } else {
            if self.transpose_perm.len() != rank || !valid_dim_set(&self.transpose_perm, rank) {
                return None;
            }
            self.transpose_perm.iter().map(|&x| x as usize).collect()
        };
        let dims: Vec<usize> = self.reshape_dims.iter().map(|&d| d as usize).collect();
        let mut flat = Vec::with_capacity(total as usize);
        for_each_transposed(&dims, &perm, |_, src| flat.push(src as i64));
        let size = self.group_size.max(1) as usize;
        Some(if self.group_size == 0 { Vec::new() } else { flat.chunks(size).map(<[i64]>::to_vec).collect() })
    }
}

/// Walks an array of dimensions `dims` in the order of its dimensions permuted by `perm` (major to minor): `f(k, o)`
/// for the `k`-th element visited, `o` its row-major offset. What an iota form's transpose and a laid-out literal need.
pub(crate) fn for_each_transposed(dims: &[usize], perm: &[usize], mut f: impl FnMut(usize, usize)) {
    let rank = dims.len();
    let mut strides = vec![1usize; rank];
    for i in (0..rank.saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    let mut idx = vec![0usize; rank];
    for k in 0..dims.iter().product() {
        f(k, (0..rank).map(|j| idx[j] * strides[perm[j]]).sum());
        for j in (0..rank).rev() {
            idx[j] += 1;
            if idx[j] < dims[perm[j]] {
                break;
            }
            idx[j] = 0;
        }
    }
}

impl ReplicaGroups {
    /// The groups as explicit lists (iota form expanded). `None` only for an inconsistent iota form, which the parser
    /// and verifier reject.
    pub fn groups(&self) -> Option<Vec<Vec<i64>>> {
        match self {
            ReplicaGroups::Explicit(g) => Some(g.clone()),
            ReplicaGroups::Iota(i) => i.expand(),
        }
    }

    /// XLA's mesh-axes form (both front ends read it): a mesh of axes `sizes` (devices `device_ids` in mesh order, or
    /// iota), grouped by the listed axis references `refs` (axis, pre-size, size; a whole axis is (1, its size)). Every
    /// axis is split into factors at each referenced sub-axis boundary (pre-size counts the major side); the referenced
    /// factors, in the listed order, make a group (so `{b,a}` makes `b` the major one, as XLA:CPU and JAX's shard_map
    /// read it). The iota form, or explicit groups of `device_ids`. With `unit_axes`, a size-1 axis stays a reshape
    /// dimension of its own (the proto decoder's form; the text parser's leaves it out).
    pub(crate) fn from_mesh(
        sizes: &[i64],
        refs: &[(usize, i64, i64)],
        device_ids: Option<Vec<i64>>,
        unit_axes: bool,
    ) -> Result<ReplicaGroups, String> {
        let mut factors: Vec<i64> = Vec::new();
        let mut bounds_of: Vec<Vec<i64>> = Vec::new();
        let mut first_factor: Vec<usize> = Vec::new();
        for (axis, &n) in sizes.iter().enumerate() {
            let mut b = vec![1, n];
            for &(a, pre, size) in refs {
                if a == axis {
                    b.push(pre);
                    b.push(pre * size);
                }
            }
            b.sort_unstable();
            b.dedup();
            if unit_axes && n == 1 {
                b.push(1);
            }
            if b.windows(2).any(|w| w[1] % w[0] != 0) {
                return Err(format!("sub-axes of mesh axis {axis} do not nest; expected sizes that divide each other"));
            }
            first_factor.push(factors.len());
            factors.extend(b.windows(2).map(|w| w[1] / w[0]));
            bounds_of.push(b);
        }
        let mut used = vec![false; factors.len()];
        let mut grouped: Vec<usize> = Vec::new();
        for &(axis, pre, size) in refs {
            let (Some(b), Some(&f0)) = (bounds_of.get(axis), first_factor.get(axis)) else {
                return Err("bad mesh axis reference".into());
            };
            let lo = b.iter().position(|&x| x == pre).unwrap_or(0);
            let hi = b.iter().rposition(|&x| x == pre * size).unwrap_or(lo);
            for f in f0 + lo..f0 + hi {
                match used.get_mut(f) {
                    Some(u) if !*u => *u = true,
                    _ => return Err("mesh axes of the replica groups overlap; expected each axis once".into()),
                }
                grouped.push(f);
            }
        }
        let rest: Vec<usize> = (0..factors.len()).filter(|f| !used.get(*f).copied().unwrap_or(true)).collect();
        let num_groups: i64 = rest.iter().filter_map(|&f| factors.get(f)).product();
        let group_size: i64 = grouped.iter().filter_map(|&f| factors.get(f)).product();
        let perm: Vec<i64> = rest.iter().chain(grouped.iter()).map(|&f| f as i64).collect();
        let identity = perm.iter().enumerate().all(|(i, &p)| i as i64 == p);
        let iota = IotaReplicaGroups {
            num_groups,
            group_size,
            reshape_dims: factors,
            transpose_perm: if identity { Vec::new() } else { perm },
        };
        let Some(ids) = device_ids else { return Ok(ReplicaGroups::Iota(iota)) };
        let groups = iota.expand().ok_or("inconsistent mesh replica groups")?;
        let device = |i: i64| usize::try_from(i).ok().and_then(|i| ids.get(i).copied()).unwrap_or(-1);
        Ok(ReplicaGroups::Explicit(groups.into_iter().map(|g| g.into_iter().map(device).collect()).collect()))
    }
}

impl fmt::Display for ReplicaGroups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicaGroups::Explicit(g) => f.write_str(&group_list(g)),
            ReplicaGroups::Iota(i) => {
                write!(f, "[{},{}]<=[{}]", i.num_groups, i.group_size, join(&i.reshape_dims, ","))?;
                if !i.transpose_perm.is_empty() {
                    write!(f, "T({})", join(&i.transpose_perm, ","))?;
                }
                Ok(())
            }
        }
    }
}

/// An HLO sharding annotation (`sharding={...}`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Sharding {
    Replicated,
    Manual,
    Maximal {
        device: i64,
    },
    /// `{devices=[a,b,..]<=[n]}` or `{devices=[a,b]0,1,2,3}`, optionally with `last_tile_dim_replicate` or
    /// `last_tile_dims={manual,..}`.
    Tiled {
        /// Tile assignment dimensions (including a trailing replication dimension, if any).
        tile_dims: Vec<i64>,
        /// Devices of the tile assignment in row-major order (iota form expanded).
        devices: Vec<i64>,
        last_tile_dim_replicate: bool,
        /// Raw `last_tile_dims={..}` subgroup types, when present.
        last_tile_dims: Vec<String>,
    },
    Tuple(Vec<Sharding>),
    /// `{unknown}` or anything else XLA may print that Peerless keeps verbatim.
    Other(String),
}

/// A `lo_hi_interior` padding triple for one dimension of `pad`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PadDim {
    pub lo: i64,
    pub hi: i64,
    pub interior: i64,
}

/// One dimension of a `slice={[start:limit:stride], ...}` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SliceDim {
    pub start: i64,
    pub limit: i64,
    pub stride: i64,
}

/// Dot dimension numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DotDims {
    pub lhs_batch: Vec<i64>,
    pub rhs_batch: Vec<i64>,
    pub lhs_contracting: Vec<i64>,
    pub rhs_contracting: Vec<i64>,
}

/// Typed attributes of an instruction. Attributes the IR does not model are kept verbatim in `other` (key → raw text)
/// so real XLA dumps parse and print back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attrs {
    /// `parameter(N)`.
    pub parameter_number: Option<i64>,
    /// `constant(...)` payload, already typed by the instruction's shape.
    pub literal: Option<Literal>,
    /// `get-tuple-element` `index=N`.
    pub tuple_index: Option<i64>,
    /// `dimensions={..}` (broadcast, transpose, reduce, concatenate, reverse, all-gather, reduce-scatter, and
    /// all-to-all's split dimension in its array form).
    pub dimensions: Option<Vec<i64>>,
    pub replica_groups: Option<ReplicaGroups>,
    pub channel_id: Option<i64>,
    pub use_global_device_ids: bool,
    pub slice: Option<Vec<SliceDim>>,
    pub dynamic_slice_sizes: Option<Vec<i64>>,
    pub padding: Option<Vec<PadDim>>,
    pub source_target_pairs: Option<Vec<(i64, i64)>>,
    pub sharding: Option<Sharding>,
    pub frontend_attributes: BTreeMap<String, String>,
    pub backend_config: Option<String>,
    pub metadata: Option<String>,
    pub custom_call_target: Option<String>,
    pub comparison_direction: Option<ComparisonDirection>,
    /// `type=` of compare (`TOTALORDER`, `FLOAT`, `SIGNED`, `UNSIGNED`).
    pub comparison_type: Option<String>,
    pub iota_dimension: Option<i64>,
    pub dot: Option<DotDims>,
    pub control_predecessors: Vec<InstrId>,
    /// Any attribute not modelled above, verbatim.
    pub other: BTreeMap<String, String>,
}

named_enum! {
    /// A custom-call's `api_version=`: how XLA calls its target (XLA's `CustomCallApiVersion`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum CustomCallApiVersion {
        Original => "API_VERSION_ORIGINAL",
        StatusReturning => "API_VERSION_STATUS_RETURNING",
        StatusReturningUnified => "API_VERSION_STATUS_RETURNING_UNIFIED",
        /// XLA FFI: typed buffers and attributes (Peerless's own custom calls use this).
        TypedFfi => "API_VERSION_TYPED_FFI",
    }
}

impl Attrs {
    /// A custom-call's API version. Both front ends keep it in `other["api_version"]` as the text spells it (absent
    /// means the original API, which XLA does not print); an unknown name is an error, which the verifier reports.
    pub fn custom_call_api_version(&self) -> Result<CustomCallApiVersion, String> {
        match self.other.get("api_version") {
            None => Ok(CustomCallApiVersion::Original),
            Some(v) => CustomCallApiVersion::from_name(v.trim()).ok_or_else(|| {
                format!(
                    "unknown api_version={v}; expected API_VERSION_ORIGINAL, API_VERSION_STATUS_RETURNING, \
                     API_VERSION_STATUS_RETURNING_UNIFIED or API_VERSION_TYPED_FFI"
                )
            }),
        }
    }
}

/// One HLO instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct Instruction {
    pub name: String,
    pub opcode: Opcode,
    pub shape: Shape,
    pub operands: Vec<InstrId>,
    /// Called computations: `to_apply`, `calls`, branch computations, in XLA's order, except `while`: (condition, body)
    /// from both front ends (XLA's proto has body first).
    pub called: Vec<CompId>,
    pub attrs: Attrs,
    /// The computation this instruction belongs to.
    pub parent: CompId,
    /// Where the instruction's name starts in the source, when parsed from text.
    pub span: Option<Span>,
}

/// A named computation: instructions in program order, its parameters by number, and its root.
#[derive(Clone, Debug, PartialEq)]
pub struct Computation {
    pub name: String,
    pub instrs: Vec<InstrId>,
    /// `params[i]` is `parameter(i)`.
    pub params: Vec<InstrId>,
    pub root: InstrId,
    pub span: Option<Span>,
}

/// Module-level configuration from the `HloModule` header (or the proto).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModuleConfig {
    pub replica_count: i64,
    pub num_partitions: i64,
    /// `entry_computation_layout={(...)->...}` verbatim, when present.
    pub entry_computation_layout: Option<String>,
    pub frontend_attributes: BTreeMap<String, String>,
    /// Other header attributes, verbatim.
    pub other: BTreeMap<String, String>,
}

/// A whole HLO module.
#[derive(Clone, Debug)]
pub struct Module {
    pub name: String,
    pub config: ModuleConfig,
    pub comps: PrimaryMap<CompId, Computation>,
    pub instrs: PrimaryMap<InstrId, Instruction>,
    pub entry: CompId,
    /// Source file name (for diagnostics), `<proto>` for binary input.
    pub source_name: String,
}

impl Module {
    pub fn entry(&self) -> &Computation {
        &self.comps[self.entry]
    }

    pub fn instr(&self, id: InstrId) -> &Instruction {
        &self.instrs[id]
    }

    pub fn comp(&self, id: CompId) -> &Computation {
        &self.comps[id]
    }

    /// `%name in computation`, how error messages name instruction `id` (`id` itself when it is not in the module).
    pub fn describe(&self, id: InstrId) -> String {
        match self.instrs.get(id) {
            Some(i) => match self.comps.get(i.parent) {
                Some(c) => format!("%{} in {}", i.name, c.name),
                None => format!("%{}", i.name),
            },
            None => format!("{id}"),
        }
    }

    /// Entry parameter shapes, by parameter number.
    pub fn entry_param_shapes(&self) -> Vec<&Shape> {
        self.entry().params.iter().map(|&p| &self.instrs[p].shape).collect()
    }

    /// Entry result shape.
    pub fn entry_result_shape(&self) -> &Shape {
        &self.instrs[self.entry().root].shape
    }

    /// All collective instructions of the module, in computation then program order.
    pub fn collectives(&self) -> Vec<InstrId> {
        self.comps
            .values()
            .flat_map(|c| c.instrs.iter().copied())
            .filter(|&i| self.instrs[i].opcode.is_collective())
            .collect()
    }
}

/// One dimension of a [`Window`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowDim {
    pub size: i64,
    pub stride: i64,
    pub pad_lo: i64,
    pub pad_hi: i64,
    /// `lhs_dilate`: the input's elements are this far apart, with holes between them.
    pub base_dilation: i64,
    /// `rhs_dilate`: the window's elements are this far apart.
    pub window_dilation: i64,
    /// `rhs_reversal` (convolution windows only).
    pub reversal: bool,
}

/// The window of a windowed op (`reduce-window`; convolution and select-and-scatter print theirs the same way), read
/// from its attributes (text form, which the proto importer writes too): `window={size=3x3 stride=2x2 pad=1_1x0_1
/// lhs_dilate=1x2 rhs_dilate=2x1}`, one entry per dimension joined by `x`. A field left out takes XLA's default (stride
/// and dilations 1, no padding, no reversal), as XLA's printer leaves out fields that are all default; `window={}` is
/// the window of a scalar.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub dims: Vec<WindowDim>,
}

impl Window {
    /// The window of an instruction, or what is missing or malformed.
    pub fn of(attrs: &Attrs) -> Result<Window, String> {
        let raw = attrs.other.get("window").ok_or("needs a window={...} attribute")?;
        let bad = |why: String| format!("has a malformed window={raw}: {why}");
        let inner =
            raw.trim().strip_prefix('{').and_then(|s| s.strip_suffix('}')).ok_or_else(|| bad("no braces".into()))?;
        let mut fields: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for field in inner.split_whitespace() {
            let (key, value) = field.split_once('=').ok_or_else(|| bad(format!("'{field}' is not key=value")))?;
            if !matches!(key, "size" | "stride" | "pad" | "lhs_dilate" | "rhs_dilate" | "rhs_reversal") {
                return Err(bad(format!(
                    "unknown field '{key}'; expected size, stride, pad, lhs_dilate, rhs_dilate or rhs_reversal"
                )));
            }
            if fields.insert(key, value.split('x').collect()).is_some() {
                return Err(bad(format!("'{key}' appears more than once")));
            }
        }
        let int = |s: &str| s.parse::<i64>().map_err(|_| bad(format!("'{s}' is not an integer")));
        let rank = match fields.get("size") {
            Some(v) => v.len(),
            None if fields.is_empty() => 0,
            None => return Err(bad("fields without size=".into())),
        };
        // Per dimension, the field's entry (`None` where the field is left out).
        let entries = |key: &str| -> Result<Vec<Option<&str>>, String> {
            match fields.get(key) {
                None => Ok(vec![None; rank]),
                Some(v) if v.len() == rank => Ok(v.iter().map(|&s| Some(s)).collect()),
                Some(v) => Err(bad(format!("{key}= has {} entries for a window of {rank} dimensions", v.len()))),
            }
        };
        let num = |e: Option<&str>, default: i64| e.map_or(Ok(default), int);
        let (size, stride, pad) = (entries("size")?, entries("stride")?, entries("pad")?);
        let (lhs, rhs, rev) = (entries("lhs_dilate")?, entries("rhs_dilate")?, entries("rhs_reversal")?);
        let mut dims = Vec::with_capacity(rank);
        for k in 0..rank {
            let (pad_lo, pad_hi) = match pad[k] {
                None => (0, 0),
                Some(p) => {
                    let (lo, hi) = p.split_once('_').ok_or_else(|| bad(format!("padding '{p}' is not lo_hi")))?;
                    (int(lo)?, int(hi)?)
                }
            };
            let reversal = match rev[k] {
                None | Some("0") => false,
                Some("1") => true,
                Some(r) => return Err(bad(format!("rhs_reversal entry '{r}' is not 0 or 1"))),
            };
            dims.push(WindowDim {
                size: num(size[k], 1)?,
                stride: num(stride[k], 1)?,
                pad_lo,
                pad_hi,
                base_dilation: num(lhs[k], 1)?,
                window_dilation: num(rhs[k], 1)?,
                reversal,
            });
        }
        Ok(Window { dims })
    }

    /// XLA's shape rule for a window over an input of dimensions `input`: per dimension, the number of window
    /// positions, `(padded_dilated_input - dilated_window) / stride + 1` (0 when the window does not fit), where a
    /// dilated size is `(n - 1) * dilation + 1` (0 stays 0). Errors say which dimension breaks which rule.
    pub fn output_dims(&self, input: &[i64]) -> Result<Vec<i64>, String> {
        if self.dims.len() != input.len() {
            return Err(format!("window has {} dimensions for an input of rank {}", self.dims.len(), input.len()));
        }
        let dilated = |n: i64, d: i64| if n == 0 { Some(0) } else { (n - 1).checked_mul(d)?.checked_add(1) };
        let mut out = Vec::with_capacity(input.len());
        for (k, (w, &n)) in self.dims.iter().zip(input).enumerate() {
            let positive = [("size", w.size), ("stride", w.stride)];
            let at_least_one = [("lhs_dilate", w.base_dilation), ("rhs_dilate", w.window_dilation)];
            for (what, v) in positive.into_iter().chain(at_least_one) {
                if v < 1 {
                    return Err(format!("window dimension {k} has {what}={v}; it must be at least 1"));
                }
            }
            let padded = dilated(n, w.base_dilation)
                .and_then(|b| b.checked_add(w.pad_lo))
                .and_then(|b| b.checked_add(w.pad_hi))
                .ok_or_else(|| format!("window dimension {k}: the padded, dilated input overflows"))?;
            if padded < 0 {
                return Err(format!(
                    "window dimension {k}: padding {}_{} leaves a negative size {padded} of the dilated input",
                    w.pad_lo, w.pad_hi
                ));
            }
            let win = dilated(w.size, w.window_dilation)
                .ok_or_else(|| format!("window dimension {k}: the dilated window overflows"))?;
            out.push(if padded == 0 || win > padded { 0 } else { (padded - win) / w.stride + 1 });
        }
        Ok(out)
    }
}
