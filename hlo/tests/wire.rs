//! `hlo::wire`: protos as their fields on the wire.

use prost::encoding::WireType;

use hlo::wire::*;

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
    assert_eq!((fs[0].wire, fs[0].payload, fs[0].message()), (WireType::LengthDelimited, &b"x"[..], Some(&b"x"[..])));
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
