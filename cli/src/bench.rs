//! `peerless bench`: Peerless's collective kernels beside NCCL, in one process on the same
//! GPUs. Every configuration is checked against a host reference before it is timed.
//!
//! Timing: each of `--samples` samples records a CUDA event on every device, enqueues a batch
//! of back-to-back calls (input buffers rotate among 4 sets), records another event; a
//! sample's time per call is the slowest device's elapsed time over the batch size; the table
//! reports the median sample. Bandwidths follow nccl-tests: all-reduce algbw = bytes / t,
//! busbw = algbw · 2(n−1)/n; all-gather algbw = n·bytes / t, busbw = algbw · (n−1)/n.

use std::fmt::Write as _;
use std::path::PathBuf;

use ffi::cuda::{DeviceBuffer, Event};
use kernels::cuda::{Algo, AllGather, AllReduce, Clique, Dtype, NcclClique, Red, device_count};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Number of GPUs (default: all, at most 8).
    #[arg(long)]
    devices: Option<usize>,
    /// Smallest message per device, bytes.
    #[arg(long, default_value_t = 1024)]
    min_bytes: usize,
    /// Largest message per device, bytes.
    #[arg(long, default_value_t = 256 << 20)]
    max_bytes: usize,
    /// Size step factor.
    #[arg(long, default_value_t = 4)]
    step: usize,
    /// Timed samples per configuration (median reported).
    #[arg(long, default_value_t = 50)]
    samples: usize,
    /// Element types (f32, bf16).
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16")]
    dtypes: Vec<String>,
    /// Collectives (all-reduce, all-gather).
    #[arg(long, value_delimiter = ',', default_value = "all-reduce,all-gather")]
    ops: Vec<String>,
    /// Write every row as CSV here.
    #[arg(long)]
    csv: Option<PathBuf>,
}

const ROTATE: usize = 4;

struct Row {
    op: &'static str,
    dtype: Dtype,
    bytes: usize,
    imp: String,
    us: f64,
    algbw: f64,
    busbw: f64,
}

/// Small integers, exact in every dtype and under any summation order.
fn fill(dtype: Dtype, n: usize, seed: u64) -> (Vec<u8>, Vec<f64>) {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut bytes = Vec::with_capacity(n * dtype.size());
    let mut vals = Vec::with_capacity(n);
    for _ in 0..n {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let v = ((s >> 33) % 17) as i32 - 8;
        vals.push(v as f64);
        match dtype {
            Dtype::F32 => bytes.extend_from_slice(&(v as f32).to_le_bytes()),
            Dtype::Bf16 => bytes.extend_from_slice(&half::bf16::from_f32(v as f32).to_le_bytes()),
            _ => bytes.extend_from_slice(&v.to_le_bytes()[..dtype.size()]),
        }
    }
    (bytes, vals)
}

fn decode(dtype: Dtype, b: &[u8]) -> Vec<f64> {
    match dtype {
        Dtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        Dtype::Bf16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        _ => Vec::new(),
    }
}

struct Bufs {
    ins: Vec<Vec<DeviceBuffer>>,
    outs: Vec<DeviceBuffer>,
    /// Host copies of set 0's inputs, per device.
    vals: Vec<Vec<f64>>,
}

fn make_bufs(clique: &Clique, dtype: Dtype, n: usize, out_factor: usize, seed: u64) -> Result<Bufs, String> {
    let e = |e: ffi::Error| e.to_string();
    let w = clique.len();
    let mut ins = Vec::new();
    let mut vals = Vec::new();
    for set in 0..ROTATE {
        let mut v = Vec::new();
        for (r, d) in clique.devices.iter().enumerate() {
            let b = DeviceBuffer::zeroed(&d.ctx, n * dtype.size()).map_err(e)?;
            let (bytes, x) = fill(dtype, n, seed ^ ((set * 16 + r) as u64));
            b.write(&bytes).map_err(e)?;
            if set == 0 {
                vals.push(x);
            }
            v.push(b);
        }
        ins.push(v);
    }
    let outs = clique
        .devices
        .iter()
        .map(|d| DeviceBuffer::zeroed(&d.ctx, out_factor * n * dtype.size()).map_err(e))
        .collect::<Result<Vec<_>, _>>()?;
    let _ = w;
    Ok(Bufs { ins, outs, vals })
}

/// Times `call(set)`: median over samples of the slowest device's time per call, µs.
fn time(
    clique: &Clique,
    samples: usize,
    batch: usize,
    mut call: impl FnMut(usize) -> Result<(), String>,
) -> Result<f64, String> {
    let e = |e: ffi::Error| e.to_string();
    for i in 0..5 {
        call(i % ROTATE)?;
    }
    clique.synchronize().map_err(|e| e.to_string())?;
    let starts = clique.devices.iter().map(|d| Event::new(&d.ctx).map_err(e)).collect::<Result<Vec<_>, _>>()?;
    let ends = clique.devices.iter().map(|d| Event::new(&d.ctx).map_err(e)).collect::<Result<Vec<_>, _>>()?;
    let mut ts = Vec::new();
    let mut k = 0;
    for _ in 0..samples {
        for (d, ev) in clique.devices.iter().zip(&starts) {
            d.ctx.bind().map_err(e)?;
            ev.record(&d.stream).map_err(e)?;
        }
        for _ in 0..batch {
            call(k % ROTATE)?;
            k += 1;
        }
        for (d, ev) in clique.devices.iter().zip(&ends) {
            d.ctx.bind().map_err(e)?;
            ev.record(&d.stream).map_err(e)?;
        }
        let mut worst = 0f64;
        for (s, en) in starts.iter().zip(&ends) {
            en.synchronize().map_err(e)?;
            worst = worst.max(en.since(s).map_err(e)? as f64);
        }
        ts.push(worst * 1000.0 / batch as f64);
    }
    ts.sort_by(|a, b| a.total_cmp(b));
    Ok(ts[ts.len() / 2])
}

fn check(clique: &Clique, dtype: Dtype, outs: &[DeviceBuffer], want: &[f64], what: &str) -> Result<(), String> {
    clique.synchronize().map_err(|e| e.to_string())?;
    for (r, o) in outs.iter().enumerate() {
        let mut b = vec![0u8; want.len() * dtype.size()];
        o.read(&mut b).map_err(|e| e.to_string())?;
        let got = decode(dtype, &b);
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            return Err(format!("{what}: device {r} element {i} is {} , expected {}", got[i], want[i]));
        }
    }
    Ok(())
}

pub fn run(args: &BenchArgs) -> Result<(), String> {
    let avail = device_count().map_err(|e| e.to_string())?;
    let n = args.devices.unwrap_or(avail).min(avail).min(kernels::cuda::MAX_RANKS);
    if n < 2 {
        return Err(format!("bench needs at least 2 GPUs, found {avail}"));
    }
    let ords: Vec<usize> = (0..n).collect();
    let clique = Clique::new(&ords).map_err(|e| e.to_string())?;
    let nccl = NcclClique::new(&clique).map_err(|e| e.to_string())?;
    let ver = ffi::nccl::version().map_err(|e| e.to_string())?;
    println!(
        "# {} × {}, NCCL {ver}, BLOCKS {} THREADS {}",
        n,
        clique.devices[0].name,
        kernels::cuda::BLOCKS,
        kernels::cuda::THREADS
    );
    let mut rows = Vec::new();
    let wf = n as f64;
    for op in &args.ops {
        for dt in &args.dtypes {
            let dtype = match dt.as_str() {
                "f32" => Dtype::F32,
                "bf16" => Dtype::Bf16,
                other => return Err(format!("bench dtype {other} (f32, bf16)")),
            };
            let mut bytes = args.min_bytes;
            while bytes <= args.max_bytes {
                let elems = bytes / dtype.size();
                let batch = if bytes <= 1 << 20 {
                    20
                } else if bytes <= 16 << 20 {
                    4
                } else {
                    1
                };
                match op.as_str() {
                    "all-reduce" => {
                        let bufs = make_bufs(&clique, dtype, elems, 1, bytes as u64)?;
                        let want: Vec<f64> = (0..elems).map(|i| bufs.vals.iter().map(|v| v[i]).sum()).collect();
                        let outs: Vec<u64> = bufs.outs.iter().map(|b| b.ptr).collect();
                        let ins = |s: usize| -> Vec<u64> { bufs.ins[s].iter().map(|b| b.ptr).collect() };
                        let mut imps: Vec<(String, Option<AllReduce>)> = Vec::new();
                        for (algo, name, limit) in [
                            (Algo::OneShot, "peerless-1shot", 4usize << 20),
                            (Algo::TwoShot, "peerless-2shot", usize::MAX),
                        ] {
                            if bytes <= limit {
                                let ar =
                                    AllReduce::new(&clique, algo, dtype, Red::Sum, bytes).map_err(|e| e.to_string())?;
                                imps.push((name.into(), Some(ar)));
                            }
                        }
                        imps.push(("nccl".into(), None));
                        for (name, ar) in &imps {
                            let call = |s: usize| -> Result<(), String> {
                                match ar {
                                    Some(ar) => ar.launch(&clique, &ins(s), &outs, elems).map_err(|e| e.to_string()),
                                    None => nccl
                                        .all_reduce(&clique, &ins(s), &outs, elems, dtype, Red::Sum)
                                        .map_err(|e| e.to_string()),
                                }
                            };
                            call(0)?;
                            check(
                                &clique,
                                dtype,
                                &bufs.outs,
                                &want,
                                &format!("{name} all-reduce {bytes} B {}", dtype.name()),
                            )?;
                            let us = time(&clique, args.samples, batch, call)?;
                            let algbw = bytes as f64 / us / 1e3;
                            rows.push(Row {
                                op: "all-reduce",
                                dtype,
                                bytes,
                                imp: name.clone(),
                                us,
                                algbw,
                                busbw: algbw * 2.0 * (wf - 1.0) / wf,
                            });
                            eprintln!(
                                "{:>11} {:>5} {:>10} {:>15} {:>10.2} us",
                                "all-reduce",
                                dtype.name(),
                                bytes,
                                name,
                                us
                            );
                        }
                    }
                    "all-gather" => {
                        let bufs = make_bufs(&clique, dtype, elems, n, bytes as u64)?;
                        let want: Vec<f64> = bufs.vals.iter().flatten().copied().collect();
                        let outs: Vec<u64> = bufs.outs.iter().map(|b| b.ptr).collect();
                        let ins = |s: usize| -> Vec<u64> { bufs.ins[s].iter().map(|b| b.ptr).collect() };
                        let ag = AllGather::new(&clique).map_err(|e| e.to_string())?;
                        for name in ["peerless-push", "nccl"] {
                            let call = |s: usize| -> Result<(), String> {
                                if name == "nccl" {
                                    nccl.all_gather(&clique, &ins(s), &outs, bytes).map_err(|e| e.to_string())
                                } else {
                                    ag.launch(&clique, &ins(s), &outs, bytes).map_err(|e| e.to_string())
                                }
                            };
                            call(0)?;
                            check(
                                &clique,
                                dtype,
                                &bufs.outs,
                                &want,
                                &format!("{name} all-gather {bytes} B {}", dtype.name()),
                            )?;
                            let us = time(&clique, args.samples, batch, call)?;
                            let algbw = wf * bytes as f64 / us / 1e3;
                            rows.push(Row {
                                op: "all-gather",
                                dtype,
                                bytes,
                                imp: name.into(),
                                us,
                                algbw,
                                busbw: algbw * (wf - 1.0) / wf,
                            });
                            eprintln!(
                                "{:>11} {:>5} {:>10} {:>15} {:>10.2} us",
                                "all-gather",
                                dtype.name(),
                                bytes,
                                name,
                                us
                            );
                        }
                    }
                    other => return Err(format!("bench op {other} (all-reduce, all-gather)")),
                }
                bytes *= args.step.max(2);
            }
        }
    }
    let mut table = String::new();
    let _ = writeln!(table, "| op | dtype | bytes/device | impl | µs (median) | algbw GB/s | busbw GB/s |");
    let _ = writeln!(table, "|---|---|---:|---|---:|---:|---:|");
    let mut csv = String::from("op,dtype,devices,bytes,impl,us_median,algbw_gbps,busbw_gbps\n");
    for r in &rows {
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {:.2} | {:.1} | {:.1} |",
            r.op,
            r.dtype.name(),
            r.bytes,
            r.imp,
            r.us,
            r.algbw,
            r.busbw
        );
        let _ = writeln!(
            csv,
            "{},{},{n},{},{},{:.3},{:.2},{:.2}",
            r.op,
            r.dtype.name(),
            r.bytes,
            r.imp,
            r.us,
            r.algbw,
            r.busbw
        );
    }
    print!("{table}");
    if let Some(p) = &args.csv {
        std::fs::write(p, csv).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}
