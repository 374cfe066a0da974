//! `runs::io`: npz input/output in the CLI's naming scheme, and seeded random inputs.

use runs::io::*;

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A one-member zip archive (stored, not deflated) holding `name` = `data`.
fn zip_one(name: &str, data: &[u8]) -> Vec<u8> {
    let (crc, len, nlen) = (crc32(data), data.len() as u32, name.len() as u16);
    let mut z = Vec::new();
    z.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
    z.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // version, flags, method, time, date
    z.extend_from_slice(&crc.to_le_bytes());
    z.extend_from_slice(&len.to_le_bytes());
    z.extend_from_slice(&len.to_le_bytes());
    z.extend_from_slice(&nlen.to_le_bytes());
    z.extend_from_slice(&0u16.to_le_bytes());
    z.extend_from_slice(name.as_bytes());
    z.extend_from_slice(data);
    let cd = z.len() as u32;
    z.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
    z.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // versions, flags, method, time, date
    z.extend_from_slice(&crc.to_le_bytes());
    z.extend_from_slice(&len.to_le_bytes());
    z.extend_from_slice(&len.to_le_bytes());
    z.extend_from_slice(&nlen.to_le_bytes());
    z.extend_from_slice(&[0; 12]); // extra, comment, disk, internal attrs, external attrs
    z.extend_from_slice(&0u32.to_le_bytes()); // local header offset
    z.extend_from_slice(name.as_bytes());
    let cd_len = z.len() as u32 - cd;
    z.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    z.extend_from_slice(&[0, 0, 0, 0, 1, 0, 1, 0]);
    z.extend_from_slice(&cd_len.to_le_bytes());
    z.extend_from_slice(&cd.to_le_bytes());
    z.extend_from_slice(&0u16.to_le_bytes());
    z
}

/// An npy (version 1) file with header dict `dict` and `data` after it.
fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut h = dict.to_string();
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend_from_slice(&(h.len() as u16).to_le_bytes());
    v.extend_from_slice(h.as_bytes());
    v.extend_from_slice(data);
    v
}

#[test]
fn a_small_npz_round_trips_through_the_in_memory_reader() {
    let data: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let z = zip_one("p0_d0.npy", &npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", &data));
    let arrays = read_npz_bytes("t.npz", &z).unwrap();
    assert_eq!(arrays["p0_d0"].to_vec::<f32>().unwrap(), vec![1.5, -2.0]);
}

#[test]
fn npy_headers_cannot_ask_for_more_than_the_file_holds() {
    // A 100-odd-byte archive whose header claims 2^64+ or 10^12 elements: an error
    // that says so, not an overflow panic in npyz or a terabyte allocation.
    for (shape, why) in [
        ("(4294967296, 4294967296)", "more than 2^40 elements"),
        ("(18446744073709551615, 2)", "more than 2^40 elements"),
        ("(1000000000000,)", "1000000000000 elements but only 8 data bytes follow"),
        ("(1000000,)", "only 8 data bytes follow"),
        ("(2, x)", "is not a size"),
    ] {
        let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
        let z = zip_one("p0_d0.npy", &npy(&dict, &[0; 8]));
        let err = read_npz_bytes("t.npz", &z).unwrap_err().to_string();
        assert!(err.contains(why), "{shape}: {err}");
    }
    // A header length beyond the member.
    let mut v = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", &[0; 8]);
    v[8] = 0xff;
    v[9] = 0xff;
    let err = read_npz_bytes("t.npz", &zip_one("p0_d0.npy", &v)).unwrap_err().to_string();
    assert!(err.contains("npy header claims 65535 bytes"), "{err}");
    // Not a zip archive at all.
    assert!(read_npz_bytes("t.npz", b"PK\x05\x06 not really").is_err());
}
