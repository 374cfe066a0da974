//! On AMD GPUs (never run yet: no AMD hardware in CI): the peer probe passes between every
//! pair, and one-shot / two-shot all-reduce (f32 sum, odd sizes, unaligned offsets) and the
//! all-gather match a host reference bitwise over repeated launches (epochs advance, staging
//! parity flips); RCCL, when installed, agrees. Ignored unless run with `--ignored` on a
//! machine with ≥ 2 AMD GPUs, where missing GPUs fail:
//! `cargo test -p peerless-kernels --features rocm --test rocm_collectives -- --ignored`.
#![cfg(feature = "rocm")]

#[path = "common/launchers.rs"]
mod launchers;

use launchers::CliqueExt;

use ffi::gpu::GpuBuffer;
use ffi::hip::{DeviceBuffer, Hip};
use kernels::rocm::{Algo, Clique, Dtype, Red, device_count};

type AllReduce = launchers::AllReduce<Hip>;
type AllGather = launchers::AllGather<Hip>;

fn clique() -> Clique {
    match device_count() {
        Ok(n) if n >= 2 => Clique::new(&(0..n.min(8)).collect::<Vec<_>>()).expect("clique"),
        r => panic!("these tests need 2 AMD GPUs, found {r:?}"),
    }
}

/// Deterministic f32 inputs per rank (small integers and halves: exact in any order).
fn input(rank: usize, n: usize, launch: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + rank * 13 + launch * 3) % 29) as f32 * 0.5 - 7.0).collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
#[ignore = "needs 2 AMD GPUs: run with --ignored on a ROCm machine"]
fn probe_all_reduce_and_all_gather_match_the_host() {
    let c = clique();
    eprintln!("devices: {:?}", c.devices.iter().map(|d| (&d.name, &d.arch)).collect::<Vec<_>>());
    c.require_full_peer_access().expect("peer probe");
    let w = c.len();
    for algo in [Algo::OneShot, Algo::TwoShot] {
        let sizes = [1usize, 3, 17, 4097, 65_537];
        let max = 65_537 * 4;
        let ar = AllReduce::new(&c, algo, Dtype::F32, Red::Sum, max).unwrap();
        for (launch, &n) in sizes.iter().cycle().take(1000).enumerate() {
            let off = if n % 2 == 1 { 4 } else { 0 };
            let ins: Vec<DeviceBuffer> = c.alloc(n * 4 + off).unwrap();
            let outs: Vec<DeviceBuffer> = c.alloc(n * 4 + off).unwrap();
            let vals: Vec<Vec<f32>> = (0..w).map(|r| input(r, n, launch)).collect();
            for (b, v) in ins.iter().zip(&vals) {
                b.write_at(off, &bytes(v)).unwrap();
            }
            let at = |bs: &[DeviceBuffer]| bs.iter().map(|b| b.ptr + off as u64).collect::<Vec<_>>();
            ar.launch(&c, &at(&ins), &at(&outs), n).unwrap();
            c.synchronize().unwrap();
            ar.check().unwrap();
            let want: Vec<f32> = (0..n).map(|i| vals.iter().fold(0.0f32, |a, v| a + v[i])).collect();
            for (r, o) in outs.iter().enumerate() {
                let mut got = vec![0u8; n * 4];
                o.read_at(off, &mut got).unwrap();
                assert_eq!(got, bytes(&want), "{algo:?} n={n} launch {launch} rank {r}");
            }
        }
    }
    let ag = AllGather::new(&c).unwrap();
    for launch in 0..1000 {
        let n = 1 + launch % 300;
        let ins: Vec<DeviceBuffer> = c.alloc(n * 4).unwrap();
        let outs: Vec<DeviceBuffer> = c.alloc(n * 4 * w).unwrap();
        let vals: Vec<Vec<f32>> = (0..w).map(|r| input(r, n, launch)).collect();
        for (b, v) in ins.iter().zip(&vals) {
            b.write_at(0, &bytes(v)).unwrap();
        }
        let ptrs = |bs: &[DeviceBuffer]| bs.iter().map(|b| b.ptr).collect::<Vec<_>>();
        ag.launch(&c, &ptrs(&ins), &ptrs(&outs), n * 4).unwrap();
        c.synchronize().unwrap();
        ag.check().unwrap();
        let want: Vec<u8> = vals.iter().flat_map(|v| bytes(v)).collect();
        for o in &outs {
            let mut got = vec![0u8; n * 4 * w];
            o.read_at(0, &mut got).unwrap();
            assert_eq!(got, want, "all-gather launch {launch}");
        }
    }
}
