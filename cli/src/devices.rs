//! `peerless devices`: the local GPUs, the peer table and the probe results.

use kernels::cuda::{Clique, Probe, device_count};

pub fn run() -> Result<(), String> {
    // A machine without NVIDIA's driver has no CUDA devices: an answer, not an error (Peerless then runs on XLA:CPU's
    // devices only).
    let n = match device_count() {
        Ok(n) => n,
        Err(e) => {
            println!("0 CUDA devices ({e})");
            return Ok(());
        }
    };
    println!("{n} CUDA device(s)");
    if n == 0 {
        return Ok(());
    }
    let ords: Vec<usize> = (0..n.min(kernels::cuda::MAX_RANKS)).collect();
    let clique = Clique::new(&ords).map_err(|e| e.to_string())?;
    for d in &clique.devices {
        println!("  {}: {} ({}, {} SMs)", d.ordinal, d.name, d.arch, d.units);
    }
    // Where each device's kernels come from: prebuilt into the library, the disk cache of an earlier compile, or NVRTC
    // on first use (one kernel unit at a time, at XLA's initialize).
    let mut archs: Vec<&str> = clique.devices.iter().map(|d| d.arch.as_str()).collect();
    archs.dedup();
    for arch in archs {
        let cc = kernels::cuda::compute_capability(arch).map_err(|e| e.to_string())?;
        println!("kernels for {arch}: {}", crate::kernels_cmd::summary(cc));
    }
    for d in &clique.devices {
        let loaded: Vec<String> = d.loaded().iter().map(|(u, o)| format!("{} {o}", u.name())).collect();
        println!("  {} loaded: {}", d.ordinal, loaded.join(", "));
    }
    println!("peer table ({}):", clique.peers.source());
    for (i, row) in clique.probes.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .map(|p| match p {
                Probe::Local => "  -".into(),
                Probe::Ok => " ok".into(),
                Probe::NotReported => " no".into(),
                Probe::Failed(_) => "BAD".into(),
            })
            .collect();
        println!("  {i}: {}", cells.join(" "));
    }
    for (i, row) in clique.probes.iter().enumerate() {
        for (j, p) in row.iter().enumerate() {
            match p {
                Probe::Failed(why) => println!("probe {i}→{j} failed: {why}"),
                Probe::NotReported => println!("probe {i}→{j}: cuDeviceCanAccessPeer reports no access"),
                _ => {}
            }
        }
    }
    Ok(())
}
