//! `peerless devices`: the local GPUs, the peer table and the probe results.

use kernels::cuda::{Clique, Probe, device_count};

pub fn run() -> Result<(), String> {
    let n = device_count().map_err(|e| e.to_string())?;
    println!("{n} CUDA device(s)");
    if n == 0 {
        return Ok(());
    }
    let ords: Vec<usize> = (0..n.min(kernels::cuda::MAX_RANKS)).collect();
    // Opening compiles the kernel set with NVRTC when the on-disk cache is cold: say so, since
    // that takes minutes and prints nothing else.
    eprintln!("opening {} GPU(s): loads the kernels (a cold kernel cache compiles them first, ~2 min)", ords.len());
    let clique = Clique::new(&ords).map_err(|e| e.to_string())?;
    for d in &clique.devices {
        println!("  {}: {} ({}, {} SMs)", d.ordinal, d.name, d.arch, d.units);
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
