//! npz round trips, the bf16 raw-bits convention, random inputs.
mod common;
use common::*;
use half::{bf16, f16};
use hlo::{Array, ArrayShape, PrimitiveType};
use runs::Mode;
use runs::io::{self, IoError};
use std::collections::BTreeMap;

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("peerless-interp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn round_trip_all_numpy_types() {
    let mut m = BTreeMap::new();
    let lit = |l: hlo::Literal| l.as_array().unwrap().clone();
    m.insert("b".into(), lit(arr(&[3], &[true, false, true])));
    m.insert("i8".into(), lit(arr(&[2], &[-1i8, 7])));
    m.insert("i16".into(), lit(arr(&[2], &[-300i16, 7])));
    m.insert("i32".into(), lit(arr(&[2, 1], &[-70000i32, 7])));
    m.insert("i64".into(), lit(arr(&[1], &[i64::MIN])));
    m.insert("u8".into(), lit(arr(&[1], &[255u8])));
    m.insert("u16".into(), lit(arr(&[1], &[65535u16])));
    m.insert("u32".into(), lit(arr(&[1], &[u32::MAX])));
    m.insert("u64".into(), lit(arr(&[1], &[u64::MAX])));
    m.insert("f16".into(), lit(arr(&[2], &[f16::from_f32(1.5), f16::NEG_INFINITY])));
    m.insert("f32".into(), lit(arr(&[2, 2], &[1.0f32, -2.0, 0.5, 1e-30])));
    m.insert("f64".into(), lit(arr(&[], &[std::f64::consts::PI])));
    m.insert("empty".into(), lit(arr::<f32>(&[0, 3], &[])));
    let p = tmp("all.npz");
    io::write_npz(&p, &m).unwrap();
    let back = io::read_npz(&p).unwrap();
    assert_eq!(back, m);
}

#[test]
fn bf16_and_f8_are_stored_as_raw_bits() {
    let b = Array::from_slice(vec![2], &[bf16::from_f32(1.0), bf16::from_f32(-2.5)]);
    let f8 = Array::new(ArrayShape::new(PrimitiveType::F8E4M3FN, vec![3]), vec![1, 2, 0x7f]).unwrap();
    let mut m = BTreeMap::new();
    m.insert("b".to_string(), b.clone());
    m.insert("f8".to_string(), f8.clone());
    let p = tmp("bits.npz");
    io::write_npz(&p, &m).unwrap();
    let back = io::read_npz(&p).unwrap();
    assert_eq!(back["b"].shape.ty, PrimitiveType::U16);
    assert_eq!(back["b"].to_vec::<u16>().unwrap(), vec![0x3f80, 0xc020]);
    assert_eq!(io::to_type(back["b"].clone(), PrimitiveType::Bf16).unwrap(), b);
    assert_eq!(io::to_type(back["f8"].clone(), PrimitiveType::F8E4M3FN).unwrap(), f8);
    assert!(io::to_type(back["b"].clone(), PrimitiveType::F32).is_none());
}

#[test]
fn cli_glue_round_trip() {
    let t = "HloModule m\nENTRY e {\n  a = bf16[2,2] parameter(0)\n  b = s32[3] parameter(1)\n  n = bf16[2,2] negate(a)\n  ROOT t = (bf16[2,2], s32[3]) tuple(n, b)\n}\n";
    let m = parse(t);
    let c = cfg(2, Mode::Replica);
    let args = io::random_inputs(&m, &c, 42).unwrap();
    assert_eq!(args, io::random_inputs(&m, &c, 42).unwrap());
    assert_ne!(args, io::random_inputs(&m, &c, 43).unwrap());
    assert_ne!(args[0], args[1], "devices get different random values");
    for v in vals::<bf16>(&args[0][0]) {
        assert!((-1.0..1.0).contains(&v.to_f32()));
    }
    for v in vals::<i32>(&args[1][1]) {
        assert!((-8..8).contains(&v));
    }
    let p = tmp("in.npz");
    io::write_npz(&p, &io::inputs_to_npz(&args).unwrap()).unwrap();
    let read = io::inputs_from_npz(&m, &c, &io::read_npz(&p).unwrap()).unwrap();
    assert_eq!(read, args);
    let out = interp::run(&m, &c, &read).unwrap();
    let npz = io::outputs_to_npz(&out);
    assert_eq!(npz.keys().cloned().collect::<Vec<_>>(), vec!["o0_d0", "o0_d1", "o1_d0", "o1_d1"]);
    let p = tmp("out.npz");
    io::write_npz(&p, &npz).unwrap();
    let back = io::outputs_from_npz(&io::read_npz(&p).unwrap(), 2, &[PrimitiveType::Bf16, PrimitiveType::S32]).unwrap();
    assert_eq!(&back[1][0], out[1].leaves()[0]);
    // A missing or mistyped input is a clear error.
    let mut arrays = io::inputs_to_npz(&args).unwrap();
    arrays.remove("p1_d1");
    assert!(matches!(io::inputs_from_npz(&m, &c, &arrays), Err(IoError::Mismatch(s)) if s.contains("p1_d1")));
    arrays.insert("p1_d1".into(), Array::from_slice(vec![4], &[0i32; 4]));
    assert!(matches!(io::inputs_from_npz(&m, &c, &arrays), Err(IoError::Mismatch(s)) if s.contains("s32[3]")));
}

#[test]
fn names() {
    assert_eq!(io::param_name(3, 1), "p3_d1");
    assert_eq!(io::output_name(0, 7), "o0_d7");
}
