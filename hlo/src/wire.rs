//! Editing XLA's protos on the wire: a message as its fields, each kept as its bytes, and
//! writers of new fields. Peerless's collective pass, the XLA runner's module preparation
//! and the PJRT wrapper's compile options edit messages this way rather than decode and
//! re-encode them, because the prost copy of XLA's protos predates fields newer XLA writes
//! and prost drops unknown fields: here every byte not edited passes through as it was.

use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint};

pub use prost::encoding::WireType;

// The field numbers the editors read and write, one module per message (XLA's `hlo.proto`,
// `xla_data.proto`, `compile_options.proto`), and the enum values they compare with.

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

/// Enum values as [`ints`] reads them: `PrimitiveType` (the element types without a
/// layout) and `OpSharding.Type`.
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

/// One field of a message: its number, wire type, the whole encoded field (key included,
/// what an edit copies to keep it) and its payload: a length-delimited field's contents,
/// else the value's bytes (a varint's, or the fixed 4 or 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field<'a> {
    pub number: u32,
    pub wire: WireType,
    pub raw: &'a [u8],
    pub payload: &'a [u8],
}

impl<'a> Field<'a> {
    /// The contents of a length-delimited field (a message, string, bytes or packed
    /// repeated scalar); `None` for any other.
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
        let payload_at = msg.len() - buf.len();
        buf = &buf[len..];
        let end = msg.len() - buf.len();
        let payload = if wire == WireType::LengthDelimited { &msg[payload_at..end] } else { &msg[value_start..end] };
        out.push(Field { number, wire, raw: &msg[start..end], payload });
    }
    Ok(out)
}

/// The values of a repeated int64 field, packed or not (one value then), or of a scalar
/// integer field.
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

/// `msg` with each length-delimited field `number` replaced by `f` of its contents, and
/// every other field copied as it is (fields this build's protos do not know survive).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_and_odd_input_is_rejected() {
        assert!(fields(&[0x0a, 0x05, 1, 2]).is_err(), "payload past the end");
        assert!(fields(&[0x0b]).is_err(), "a group");
        assert!(fields(&[0x08]).is_err(), "a key without its varint");
        assert!(fields(&[0x08, 0x80]).is_err(), "a truncated varint");
        assert!(fields(&[0x09, 1, 2, 3]).is_err(), "a fixed64 past the end");
        assert!(fields(&[0x00, 0x00]).is_err(), "field number 0");
        assert!(fields(&[]).is_ok_and(|f| f.is_empty()));
        let e: String = fields(&[0x0a, 0x05]).unwrap_err().into();
        assert!(e.starts_with("not a binary HloModuleProto: "), "{e}");
        let f = fields(&[0x0d, 1, 2, 3, 4]).unwrap();
        assert!(ints(&f[0]).unwrap_err().to_string().contains("not an integer"));
    }

    #[test]
    fn fields_written_read_back() {
        let mut msg = Vec::new();
        put_bytes(&mut msg, hlo_instruction::NAME, b"x");
        put_varint(&mut msg, hlo_instruction::ID, 300);
        put_varint(&mut msg, hlo_instruction::PARAMETER_NUMBER, -1);
        put_ints(&mut msg, hlo_instruction::OPERAND_IDS, [1, 2, 1 << 40, -5]);
        put_ints(&mut msg, hlo_instruction::DIMENSIONS, []);
        msg.extend_from_slice(&[0x0d, 1, 2, 3, 4]); // field 1, fixed32
        let fs = fields(&msg).unwrap();
        let numbers: Vec<u32> = fs.iter().map(|f| f.number).collect();
        assert_eq!(numbers, [1, 35, 9, 36, 14, 1]);
        assert_eq!(fs.iter().map(|f| f.raw.len()).sum::<usize>(), msg.len(), "raw covers every byte");
        assert_eq!(
            (fs[0].wire, fs[0].payload, fs[0].message()),
            (WireType::LengthDelimited, &b"x"[..], Some(&b"x"[..]))
        );
        assert_eq!(fs[0].raw, [0x0a, 1, b'x']);
        assert_eq!((fs[1].wire, fs[1].message()), (WireType::Varint, None));
        assert_eq!(ints(&fs[1]).unwrap(), [300]);
        assert_eq!(ints(&fs[2]).unwrap(), [-1]);
        assert_eq!(fs[2].payload.len(), 10, "a negative int64 takes 10 bytes");
        assert_eq!(ints(&fs[3]).unwrap(), [1, 2, 1 << 40, -5]);
        assert_eq!(ints(&fs[4]).unwrap(), [] as [i64; 0]);
        assert_eq!((fs[5].wire, fs[5].payload), (WireType::ThirtyTwoBit, &[1, 2, 3, 4][..]));
        // The same as prost writes.
        let mut prost_msg = Vec::new();
        prost::encoding::int64::encode(35, &300, &mut prost_msg);
        prost::encoding::int64::encode_packed(36, &[1, 2, 1 << 40, -5], &mut prost_msg);
        let mut ours = Vec::new();
        put_varint(&mut ours, 35, 300);
        put_ints(&mut ours, 36, [1, 2, 1 << 40, -5]);
        assert_eq!(ours, prost_msg);
    }

    #[test]
    fn map_field_edits_only_its_field() {
        let mut comp = Vec::new();
        put_bytes(&mut comp, hlo_computation::NAME, b"c");
        put_bytes(&mut comp, hlo_computation::INSTRUCTIONS, b"\x0a\x01a");
        put_varint(&mut comp, hlo_computation::INSTRUCTIONS, 7); // not a message: kept
        put_bytes(&mut comp, hlo_computation::INSTRUCTIONS, b"\x0a\x01b");
        comp.extend_from_slice(&[0xb8, 0x3e, 7]); // field 999, unknown
        let mut seen = Vec::new();
        let out = map_field::<WireError>(&comp, hlo_computation::INSTRUCTIONS, &mut |i| {
            seen.push(i.to_vec());
            Ok([i, &[0x18, 1]].concat())
        })
        .unwrap();
        assert_eq!(seen, [b"\x0a\x01a".to_vec(), b"\x0a\x01b".to_vec()]);
        let fs = fields(&out).unwrap();
        assert_eq!(fs.iter().map(|f| f.number).collect::<Vec<_>>(), [1, 2, 2, 2, 999]);
        assert_eq!(fs[1].payload, b"\x0a\x01a\x18\x01");
        assert_eq!(fs[2].raw, [0x10, 7]);
        assert_eq!(fs[4].raw, [0xb8, 0x3e, 7]);
        // The identity edit gives the message back; an error stops it.
        assert_eq!(map_field::<WireError>(&comp, 2, &mut |i| Ok(i.to_vec())).unwrap(), comp);
        let e = map_field(&comp, 2, &mut |_| Err(String::from("no"))).unwrap_err();
        assert_eq!(e, "no");
        assert!(map_field::<String>(&[0x0a, 0x05], 1, &mut |i| Ok(i.to_vec())).is_err());
    }
}
