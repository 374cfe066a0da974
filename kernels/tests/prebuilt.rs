//! `kernels::cuda::prebuilt` without a GPU or NVRTC: which shipped code each GPU gets, and
//! that a bundle finds only code of the current sources.
#![cfg(feature = "cuda")]

use bytes::Bytes;
use kernels::cuda::prebuilt::{Blob, Bundle, DEFAULT_TARGETS, Target, choose};
use kernels::gpu::{Dtype, Kernel, Red, Unit};
use prost::Message;

fn t(s: &str) -> Target {
    Target::parse(s).unwrap()
}

/// `code` deflated, as `prebuilt::build` stores it.
fn deflate(code: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(code).unwrap();
    enc.finish().unwrap()
}

#[test]
fn each_gpu_gets_the_code_it_can_run() {
    let shipped: Vec<Target> = DEFAULT_TARGETS.iter().map(|s| t(s)).collect();
    let names = |cc| choose(&shipped, cc).iter().map(|t| t.name()).collect::<Vec<_>>();
    assert_eq!(names(90), ["sm_90"]);
    assert_eq!(names(80), ["sm_80"]);
    // Ampere and Ada run sm_80 SASS; Hopper's does not run on Blackwell and back.
    assert_eq!(names(86), ["sm_80"]);
    assert_eq!(names(89), ["sm_80"]);
    assert_eq!(names(100), ["sm_100", "compute_100"]);
    assert_eq!(names(103), ["sm_100", "compute_100"]);
    // Newer majors JIT the PTX; older GPUs have nothing prebuilt.
    assert_eq!(names(120), ["compute_100"]);
    assert!(names(75).is_empty());
    assert!(Target::parse("gfx90a").is_err());
    assert!(Target::parse("sm_x").is_err());
}

#[test]
fn a_blob_of_other_sources_is_never_found() {
    let u = Unit::Spec(Kernel::TwoShot, Dtype::F32, Red::Sum);
    let blob = |target: &str, key: String| Blob {
        target: target.into(),
        unit: u.name(),
        key,
        code: deflate(b"code").into(),
        deflated: true,
    };
    let stale = Bundle { compiler: "x".into(), blobs: vec![blob("sm_90", "0123456789abcdef".into())] };
    assert!(stale.find(90, u).is_none());
    let good = Bundle { compiler: "x".into(), blobs: vec![blob("sm_90", u.key()), blob("compute_100", u.key())] };
    assert_eq!(good.find(90, u).map(|f| f.0.name()), Some("sm_90".into()));
    assert_eq!(good.find(90, u).unwrap().1.code().unwrap(), b"code");
    assert_eq!(good.find(120, u).map(|f| f.0.name()), Some("compute_100".into()));
    assert!(good.find(80, u).is_none());
    assert!(good.find(90, Unit::Base).is_none());
    // Round trip through the wire format.
    let back = Bundle::decode(Bytes::from(good.encode_to_vec())).unwrap();
    assert_eq!(back, good);
}
