//! Editing XLA's protos on the wire: a message as its fields, each kept as its bytes, and writers of new fields.
//! Peerless's collective pass, the XLA runner's module preparation and the PJRT wrapper's compile options edit messages
//! this way rather than decode and re-encode them, because the prost copy of XLA's protos predates fields newer XLA
//! writes and prost drops unknown fields: here every byte not edited passes through as it was.

use std::borrow::Cow;
use std::collections::HashMap;

use cranelift_entity::{EntityRef, PrimaryMap};
use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint};

use crate::ir::{CompId, InstrId};

pub use prost::encoding::WireType;

// The field numbers the editors read and write, one module per message (XLA's `hlo.proto`, `xla_data.proto`,
// `compile_options.proto`), and the enum values they compare with.

/// `HloModuleProto`.
pub mod hlo_module {
    pub const NAME: u32 = 1;
    pub const ENTRY_COMPUTATION_NAME: u32 = 2;
    pub const COMPUTATIONS: u32 = 3;
    pub const HOST_PROGRAM_SHAPE: u32 = 4;
    /// Unique per process (so left out of fingerprints).
    pub const ID: u32 = 5;
    pub const ENTRY_COMPUTATION_ID: u32 = 6;
    pub const SCHEDULE: u32 = 7;
    pub const INPUT_OUTPUT_ALIAS: u32 = 8;
    pub const IS_DYNAMIC: u32 = 11;
    pub const DEVICE_ASSIGNMENT: u32 = 15;
    pub const USE_AUTO_SPMD_PARTITIONING: u32 = 16;
    pub const BUFFER_DONOR: u32 = 18;
    pub const FRONTEND_ATTRIBUTES: u32 = 19;
}

/// `HloComputationProto`.
pub mod hlo_computation {
    pub const NAME: u32 = 1;
    pub const INSTRUCTIONS: u32 = 2;
    pub const PROGRAM_SHAPE: u32 = 4;
    pub const ID: u32 = 5;
    pub const ROOT_ID: u32 = 6;
}

/// `HloInstructionProto`.
pub mod hlo_instruction {
    pub const NAME: u32 = 1;
    pub const OPCODE: u32 = 2;
    pub const SHAPE: u32 = 3;
    pub const METADATA: u32 = 7;
    pub const PARAMETER_NUMBER: u32 = 9;
    pub const TUPLE_INDEX: u32 = 13;
    pub const DIMENSIONS: u32 = 14;
    pub const CHANNEL_ID: u32 = 26;
    pub const CUSTOM_CALL_TARGET: u32 = 28;
    pub const ID: u32 = 35;
    pub const OPERAND_IDS: u32 = 36;
    pub const CONTROL_PREDECESSOR_IDS: u32 = 37;
    pub const CALLED_COMPUTATION_IDS: u32 = 38;
    pub const SHARDING: u32 = 40;
    pub const BACKEND_CONFIG: u32 = 43;
    pub const REPLICA_GROUPS: u32 = 49;
    pub const SOURCE_TARGET_PAIRS: u32 = 52;
    pub const CONSTRAIN_LAYOUT: u32 = 56;
    /// With `CONSTRAIN_LAYOUT` on a custom call: each operand's shape with its layout.
    pub const OPERAND_SHAPES_WITH_LAYOUT: u32 = 57;
    pub const PARAMETER_REPLICATION: u32 = 61;
    pub const FRONTEND_ATTRIBUTES: u32 = 68;
    pub const USE_GLOBAL_DEVICE_IDS: u32 = 71;
    pub const CUSTOM_CALL_API_VERSION: u32 = 77;
    pub const COLLECTIVE_DEVICE_LIST: u32 = 87;
    /// Newer than this build's protos (prost would drop them).
    pub const IOTA_DEVICE_LIST: u32 = 92;
    pub const MESH_AXES_LIST: u32 = 93;
}

/// `ShapeProto`.
pub mod shape {
    pub const ELEMENT_TYPE: u32 = 2;
    pub const DIMENSIONS: u32 = 3;
    pub const TUPLE_SHAPES: u32 = 4;
    pub const LAYOUT: u32 = 5;
}

/// `LayoutProto`.
pub mod layout {
    pub const MINOR_TO_MAJOR: u32 = 1;
    pub const TILES: u32 = 6;
}

/// `ProgramShapeProto`.
pub mod program_shape {
    pub const PARAMETERS: u32 = 1;
    pub const RESULT: u32 = 2;
    pub const PARAMETER_NAMES: u32 = 3;
}

/// `OpSharding`.
pub mod op_sharding {
    pub const TYPE: u32 = 1;
    pub const TUPLE_SHARDINGS: u32 = 5;
}

/// `CompileOptionsProto`.
pub mod compile_options {
    /// A map: each entry a message of key (1) and `OptionOverrideProto` (2).
    pub const ENV_OPTION_OVERRIDES: u32 = 7;
}

/// Enum values as [`ints`] reads them: `PrimitiveType` (the element types without a layout) and `OpSharding.Type`.
pub mod enums {
    pub const TUPLE_TYPE: i64 = 13;
    pub const OPAQUE_TYPE: i64 = 14;
    pub const TOKEN_TYPE: i64 = 17;
    pub const SHARDING_TUPLE: i64 = 2;
}

/// Why bytes are not a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WireError(String);

/// The plugin's editors report in `String`s; every message they edit belongs to a module.
impl From<WireError> for String {
    fn from(e: WireError) -> String {
        format!("not a binary HloModuleProto: {e}")
    }
}

fn err(e: prost::DecodeError) -> WireError {
    WireError(e.to_string())
}

/// One field of a message: its number, wire type, the whole encoded field (key included, what an edit copies to keep
/// it) and its payload: a length-delimited field's contents, else the value's bytes (a varint's, or the fixed 4 or 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    pub number: u32,
    pub wire: WireType,
    pub raw: &'a [u8],
    pub payload: &'a [u8],
}

impl<'a> Field<'a> {
    /// The contents of a length-delimited field (a message, string, bytes or packed repeated scalar); `None` for any
    /// other.
    pub fn message(&self) -> Option<&'a [u8]> {
        (self.wire == WireType::LengthDelimited).then_some(self.payload)
    }
}

/// The fields of `msg`, in order. Groups (which XLA's protos do not use) are an error.
pub fn fields(msg: &[u8]) -> Result<Vec<Field<'_>>, WireError> {
    let mut out = Vec::new();
    let mut buf = msg;
    while !buf.is_empty() {
        let start = msg.len() - buf.len();
        let (number, wire) = decode_key(&mut buf).map_err(err)?;
        let value_start = msg.len() - buf.len();
        let len = match wire {
            WireType::Varint => {
                decode_varint(&mut buf).map_err(err)?;
                0
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => {
                let n = decode_varint(&mut buf).map_err(err)?;
                usize::try_from(n).map_err(|_| WireError(format!("length {n} too large")))?
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err(WireError(format!("field {number}: groups are not used by XLA's protos")));
            }
        };
        if len > buf.len() {
            return Err(WireError(format!("field {number} runs past the end of its message")));
        }
        // A length-delimited field's contents follow its length; any other value's bytes start after the key.
        let from = if wire == WireType::LengthDelimited { msg.len() - buf.len() } else { value_start };
        buf = &buf[len..];
        let end = msg.len() - buf.len();
        out.push(Field { number, wire, raw: &msg[start..end], payload: &msg[from..end] });
    }
    Ok(out)
}

/// The values of a repeated int64 field, packed or not (one value then), or of a scalar integer field.
pub fn ints(f: &Field<'_>) -> Result<Vec<i64>, WireError> {
    let mut out = Vec::new();
    match f.wire {
        WireType::Varint => out.push(decode_varint(&mut &f.payload[..]).map_err(err)? as i64),
        WireType::LengthDelimited => {
            let mut b = f.payload;
            while !b.is_empty() {
                out.push(decode_varint(&mut b).map_err(err)? as i64);
            }
        }
        _ => return Err(WireError(format!("field {}: not an integer", f.number))),
    }
    Ok(out)
}

/// The first value of integer field `number` among a message's `fs`.
pub fn first_int(fs: &[Field<'_>], number: u32) -> Result<Option<i64>, WireError> {
    Ok(fs.iter().find(|x| x.number == number).map(ints).transpose()?.and_then(|v| v.first().copied()))
}

/// The payload of field `number` among a message's `fs` (empty where it has none).
pub fn payload<'a>(fs: &[Field<'a>], number: u32) -> &'a [u8] {
    fs.iter().find(|x| x.number == number).map_or(&[], |x| x.payload)
}

/// Appends a length-delimited field (message, string, bytes).
pub fn put_bytes(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// Appends a varint field (an integer, bool or enum; a negative int64 as its 10 bytes).
pub fn put_varint(out: &mut Vec<u8>, number: u32, v: i64) {
    encode_key(number, WireType::Varint, out);
    encode_varint(v as u64, out);
}

/// Appends a packed repeated int64 field (written even when empty).
pub fn put_ints(out: &mut Vec<u8>, number: u32, v: impl IntoIterator<Item = i64>) {
    let mut packed = Vec::new();
    for x in v {
        encode_varint(x as u64, &mut packed);
    }
    put_bytes(out, number, &packed);
}

/// `msg` with each length-delimited field `number` replaced by `f` of its contents, and every other field copied as it
/// is (fields this build's protos do not know survive).
pub fn map_field<E: From<WireError>>(
    msg: &[u8],
    number: u32,
    f: &mut dyn FnMut(&[u8]) -> Result<Vec<u8>, E>,
) -> Result<Vec<u8>, E> {
    let mut out = Vec::with_capacity(msg.len() + msg.len() / 8);
    for x in fields(msg)? {
        match x.message() {
            Some(p) if x.number == number => put_bytes(&mut out, number, &f(p)?),
            _ => out.extend_from_slice(x.raw),
        }
    }
    Ok(out)
}

/// Proto ids to the IR's typed ids: `CompId` n is a module's n-th computation and `InstrId` n its n-th instruction, in
/// message order, and an instruction id resolves in its computation. The decoder numbers the IR so, and [`Index`] the
/// bytes, so both name an instruction alike.
#[derive(Debug, Default)]
pub struct Numbering {
    pub comps: HashMap<i64, CompId>,
    pub instrs: Vec<HashMap<i64, InstrId>>,
    count: usize,
}

impl Numbering {
    /// Numbers the next computation; `None` where its id is taken.
    pub fn comp(&mut self, id: i64) -> Option<CompId> {
        let c = CompId::new(self.instrs.len());
        self.instrs.push(HashMap::new());
        self.comps.insert(id, c).is_none().then_some(c)
    }

    /// Numbers the next instruction, of the last computation numbered; `None` where its id is taken there.
    pub fn instr(&mut self, id: i64) -> Option<InstrId> {
        let i = InstrId::new(self.count);
        self.count += 1;
        self.instrs.last_mut()?.insert(id, i).is_none().then_some(i)
    }

    /// Instruction `id` of computation `comp`.
    pub fn resolve(&self, comp: CompId, id: i64) -> Option<InstrId> {
        self.instrs.get(comp.index())?.get(&id).copied()
    }

    /// How many instructions were numbered.
    pub fn count(&self) -> usize {
        self.count
    }
}

thread_local! {
    static WALKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Modules this thread has indexed so far ([`Index::new`]): what a test counts to show a caller walks a module's bytes
/// once.
pub fn walks_on_this_thread() -> usize {
    WALKS.with(std::cell::Cell::get)
}

/// A computation of an [`Index`].
#[derive(Debug)]
pub struct IndexedComp<'a> {
    pub id: i64,
    pub name: Cow<'a, str>,
    /// Its field in the module (`raw`: as encoded) and its own fields.
    pub field: Field<'a>,
    pub fields: Vec<Field<'a>>,
    /// Its instructions, in order.
    pub instrs: Vec<InstrId>,
    /// Whether an `async-start` (or its update or done) calls it.
    pub wrapped: bool,
}

/// An instruction of an [`Index`].
#[derive(Debug)]
pub struct IndexedInstr<'a> {
    pub id: i64,
    pub parent: CompId,
    pub name: Cow<'a, str>,
    pub opcode: &'a str,
    /// Operand and called-computation ids, as the proto has them.
    pub operands: Vec<i64>,
    pub called: Vec<i64>,
    /// Its `ShapeProto` (empty: none).
    pub shape: &'a [u8],
    /// Its field in its computation (`raw`: as encoded) and its own fields.
    pub field: Field<'a>,
    pub fields: Vec<Field<'a>>,
}

/// A serialized `HloModuleProto` read in one walk: its top-level fields, and every computation and instruction with
/// what editors of the module read, each a slice of the module's bytes. Numbered as [`Numbering`] says, so an index of
/// the bytes a module was decoded from names its instructions by the IR's ids.
#[derive(Debug)]
pub struct Index<'a> {
    pub top: Vec<Field<'a>>,
    pub comps: PrimaryMap<CompId, IndexedComp<'a>>,
    pub instrs: PrimaryMap<InstrId, IndexedInstr<'a>>,
    pub ids: Numbering,
    /// The entry computation: the one of the module's entry id, else of its entry name (as the decoder finds it).
    pub entry: Option<CompId>,
}

impl<'a> Index<'a> {
    pub fn new(module: &'a [u8]) -> Result<Self, WireError> {
        use hlo_instruction as ins;
        WALKS.with(|n| n.set(n.get() + 1));
        let text = |fs: &[Field<'a>], number| String::from_utf8_lossy(payload(fs, number));
        let top = fields(module)?;
        let (mut comps, mut instrs, mut ids) = (PrimaryMap::new(), PrimaryMap::new(), Numbering::default());
        let mut wrapped = Vec::new();
        for field in top.iter().filter(|c| c.number == hlo_module::COMPUTATIONS && c.wire == WireType::LengthDelimited)
        {
            let cf = fields(field.payload)?;
            let id = first_int(&cf, hlo_computation::ID)?.unwrap_or(0);
            let parent = ids.comp(id).ok_or_else(|| WireError(format!("computation id {id} appears twice")))?;
            let mut list = Vec::new();
            for i in
                cf.iter().filter(|i| i.number == hlo_computation::INSTRUCTIONS && i.wire == WireType::LengthDelimited)
            {
                let fs = fields(i.payload)?;
                let id = first_int(&fs, ins::ID)?.unwrap_or(0);
                ids.instr(id)
                    .ok_or_else(|| WireError(format!("instruction id {id} appears twice in a computation")))?;
                let (mut operands, mut called) = (Vec::new(), Vec::new());
                for x in &fs {
                    match x.number {
                        ins::OPERAND_IDS => operands.extend(ints(x)?),
                        ins::CALLED_COMPUTATION_IDS => called.extend(ints(x)?),
                        _ => {}
                    }
                }
                let opcode = std::str::from_utf8(payload(&fs, ins::OPCODE)).unwrap_or("");
                if matches!(opcode, "async-start" | "async-update" | "async-done") {
                    wrapped.extend_from_slice(&called);
                }
                let (name, shape) = (text(&fs, ins::NAME), payload(&fs, ins::SHAPE));
                let instr = IndexedInstr { id, parent, name, opcode, operands, called, shape, field: *i, fields: fs };
                list.push(instrs.push(instr));
            }
            let name = text(&cf, hlo_computation::NAME);
            comps.push(IndexedComp { id, name, field: *field, fields: cf, instrs: list, wrapped: false });
        }
        for c in wrapped.iter().filter_map(|c| ids.comps.get(c)) {
            comps[*c].wrapped = true;
        }
        let entry_name = text(&top, hlo_module::ENTRY_COMPUTATION_NAME);
        let entry = ids
            .comps
            .get(&first_int(&top, hlo_module::ENTRY_COMPUTATION_ID)?.unwrap_or(0))
            .copied()
            .or_else(|| comps.iter().find(|(_, c)| !entry_name.is_empty() && c.name == entry_name).map(|(k, _)| k));
        Ok(Index { top, comps, instrs, ids, entry })
    }
}
