//! `ShmCollective` between real processes: the test binary runs itself again as child
//! processes (the `shm_child` test, which does nothing unless `PEERLESS_SHM_CHILD` names a
//! scenario), each owning four of eight devices, as `jax.distributed` would lay them out.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use hlo::analysis::ReductionKind as R;
use hlo::{ArrayShape, PrimitiveType as T};
use kernels::Error;
use kernels::host::direct::{DirectCollective, DirectSlot};
use kernels::host::shm::{ShmCollective, ShmKey};
use thunks::{CollectiveConfig, CollectiveKind as Kind, CollectiveOp, KernelAlgorithm as Algo};

#[path = "common/shm.rs"]
mod common;
use common::call_of;

/// A staging slot of the collective's own (what the runtime gives a call without a shared slot).
fn own_slot(groups: &[Vec<usize>], bytes: usize) -> kernels::Result<std::sync::Arc<DirectSlot>> {
    DirectSlot::new(groups, bytes).map(std::sync::Arc::new)
}

const SCENARIO: &str = "PEERLESS_SHM_CHILD";
const JOB: &str = "PEERLESS_SHM_JOB";
const PROCESS: &str = "PEERLESS_SHM_PROCESS";
/// Devices 0-3 belong to process 0, 4-7 to process 1.
const PROCESS_OF: [usize; 8] = [0, 0, 0, 0, 1, 1, 1, 1];
/// What a child prints once it attached.
const ATTACHED: &str = "peerless-shm-child-attached";
/// What a child that dies exits with.
const DIED: i32 = 17;

fn config(kind: Kind, groups: Vec<Vec<usize>>, dimension: Option<usize>, n_ops: usize) -> CollectiveConfig {
    CollectiveConfig {
        op: CollectiveOp { kind, is_async: false },
        groups,
        element_type: T::F32,
        reduction: Some(R::Sum),
        bytes_per_device: 0,
        dimension,
        source_target_pairs: vec![],
        num_operands: n_ops,
    }
}

fn sh(ty: T, dims: &[i64]) -> ArrayShape {
    ArrayShape::new(ty, dims.to_vec())
}

/// The collectives both processes run, in order (instance = index + 1).
fn collectives() -> Vec<(CollectiveConfig, Algo, Vec<ArrayShape>)> {
    let all = vec![(0..8).collect::<Vec<_>>()];
    let mixed = vec![vec![0, 4, 1, 5], vec![2, 6, 3, 7]];
    let mut permute = config(Kind::CollectivePermute, vec![], None, 1);
    permute.source_target_pairs = (0..8).map(|d| (d, (d + 3) % 8)).collect();
    vec![
        (
            config(Kind::AllReduce, all.clone(), None, 2),
            Algo::OneShotAllReduce,
            vec![sh(T::F32, &[33]), sh(T::S32, &[5])],
        ),
        (config(Kind::AllReduce, mixed.clone(), None, 1), Algo::TwoShotAllReduce, vec![sh(T::F32, &[2, 9])]),
        (config(Kind::AllGather, mixed.clone(), Some(1), 1), Algo::DirectAllGather, vec![sh(T::F32, &[2, 3])]),
        (config(Kind::ReduceScatter, all.clone(), Some(0), 1), Algo::DirectReduceScatter, vec![sh(T::F32, &[16, 2])]),
        (config(Kind::AllToAll, mixed, Some(0), 1), Algo::DirectAllToAll, vec![sh(T::S32, &[8, 3])]),
        (permute, Algo::DirectPermute, vec![sh(T::F32, &[4]), sh(T::S32, &[3])]),
    ]
}

/// Operand `j` of device `d` at call `c`: f32 of mixed magnitudes (the fold order shows in
/// the bits) or arbitrary s32.
fn operand(shape: &ArrayShape, c: usize, d: usize, j: usize) -> Vec<u8> {
    let n: i64 = shape.dims.iter().product();
    (0..n as u64)
        .flat_map(|i| {
            let mut x =
                ((c as u64) << 48 ^ (d as u64) << 32 ^ (j as u64) << 24 ^ i).wrapping_add(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^= x >> 31;
            match shape.ty {
                T::F32 => (((x % 20001) as f32 - 10000.0) * 2f32.powi(((x >> 32) % 40) as i32 - 20)).to_le_bytes(),
                _ => (x as i32).to_le_bytes(),
            }
        })
        .collect()
}

type Run<'a> = dyn Fn(usize, &[&[u8]], &mut [&mut [u8]]) -> Result<(), Error> + Sync + 'a;

/// Calls `calls` of `devices`, one thread each; results per device, per call, per operand.
fn run_devices(
    devices: &[usize],
    shapes: &[ArrayShape],
    lens: &[usize],
    calls: std::ops::Range<usize>,
    run: &Run,
) -> Vec<Result<Vec<Vec<Vec<u8>>>, Error>> {
    thread::scope(|s| {
        let hs: Vec<_> = (devices.iter())
            .map(|&d| {
                let calls = calls.clone();
                s.spawn(move || {
                    calls
                        .map(|c| {
                            let ins: Vec<Vec<u8>> =
                                shapes.iter().enumerate().map(|(j, s)| operand(s, c, d, j)).collect();
                            let mut outs: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0xAA; l]).collect();
                            let i: Vec<&[u8]> = ins.iter().map(Vec::as_slice).collect();
                            let mut o: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
                            run(d, &i, &mut o).map(|()| outs)
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn devices_of(cfg: &CollectiveConfig, process: Option<usize>) -> Vec<usize> {
    let all: Vec<usize> = if cfg.op.kind == Kind::CollectivePermute {
        (0..8).collect()
    } else {
        let mut d: Vec<usize> = cfg.groups.iter().flatten().copied().collect();
        d.sort_unstable();
        d
    };
    all.into_iter().filter(|&d| process.is_none_or(|p| PROCESS_OF[d] == p)).collect()
}

/// A child's side: the scenario named by the environment, as process `PEERLESS_SHM_PROCESS`.
#[test]
fn shm_child() {
    let Ok(scenario) = std::env::var(SCENARIO) else { return };
    let job = std::env::var(JOB).unwrap();
    let process: usize = std::env::var(PROCESS).unwrap().parse().unwrap();
    match scenario.as_str() {
        // Every collective, three calls each, against DirectCollective over all 8 devices.
        "collectives" => {
            for (i, (cfg, algo, shapes)) in collectives().into_iter().enumerate() {
                let key = ShmKey { job: job.clone(), instance: i as u64 + 1 };
                let t = Duration::from_secs(30);
                let c = ShmCollective::on_slot(
                    &call_of(&cfg, algo, t, "shm"),
                    &shapes,
                    8,
                    &key,
                    None,
                    &PROCESS_OF,
                    process,
                )
                .unwrap();
                let direct =
                    DirectCollective::on_slot(&call_of(&cfg, algo, t, "direct"), &shapes, 8, own_slot).unwrap();
                let lens = c.output_lens();
                let mine = devices_of(&cfg, Some(process));
                let got = run_devices(&mine, &shapes, &lens, 0..3, &|d, i, o| c.run(d, i, o));
                let everyone = devices_of(&cfg, None);
                let want = run_devices(&everyone, &shapes, &lens, 0..3, &|d, i, o| direct.run(d, i, o));
                for (d, got) in mine.iter().zip(got) {
                    let want = &want[everyone.iter().position(|e| e == d).unwrap()];
                    assert!(&got.unwrap() == want.as_ref().unwrap(), "{algo:?}: device {d} differs");
                }
            }
            println!("process {process}: all collectives agree");
        }
        // Two good calls of an all-reduce; then devices 4 and 5 enter the third call and the
        // process exits under them before 6 and 7 come.
        "dies" => {
            let (cfg, algo, shapes) = collectives().swap_remove(0);
            let key = ShmKey { job, instance: 1 };
            let t = Duration::from_millis(1000);
            let c = ShmCollective::on_slot(&call_of(&cfg, algo, t, "ar"), &shapes, 8, &key, None, &PROCESS_OF, process)
                .unwrap();
            // On a line of its own: libtest's "test shm_child ... " precedes it.
            println!("\n{ATTACHED}");
            let lens = c.output_lens();
            let (c, shapes, lens) = (&c, &shapes, &lens);
            thread::scope(|s| {
                for d in 4..8 {
                    s.spawn(move || {
                        for r in run_devices(&[d], shapes, lens, 0..2, &|d, i, o| c.run(d, i, o)) {
                            r.unwrap();
                        }
                        if d < 6 {
                            let _ = run_devices(&[d], shapes, lens, 2..3, &|d, i, o| c.run(d, i, o));
                        } else if d == 6 {
                            thread::sleep(Duration::from_millis(100));
                            std::process::exit(DIED);
                        }
                    });
                }
            });
            unreachable!("the process exits");
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn job() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn leftovers(job: &str) -> Vec<String> {
    let prefix = format!("peerless-{job}-");
    let entries = std::fs::read_dir("/dev/shm").expect("/dev/shm");
    entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(&prefix)).collect()
}

/// This binary as process `process` of scenario `scenario`; its stdout arrives line by line.
fn spawn_child(scenario: &str, job: &str, process: usize) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "shm_child", "--nocapture", "--test-threads=1"])
        .env(SCENARIO, scenario)
        .env(JOB, job)
        .env(PROCESS, process.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Waits for `child` at most `limit`; kills it past that.
fn wait_child(child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("child {} still running after {limit:?}", child.id());
        }
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn two_processes_of_four_devices_agree_with_the_direct_protocol() {
    let job = job();
    let mut children: Vec<_> = (0..2).map(|p| spawn_child("collectives", &job, p)).collect();
    for (p, (child, lines)) in children.iter_mut().enumerate() {
        let status = wait_child(child, Duration::from_secs(120));
        let out: Vec<String> = lines.try_iter().collect();
        assert!(status.success(), "process {p}: {status}\n{}", out.join("\n"));
        assert!(out.iter().any(|l| l.contains("all collectives agree")), "process {p}:\n{}", out.join("\n"));
    }
    assert_eq!(leftovers(&job), Vec::<String>::new());
}

#[test]
fn a_process_that_exits_mid_run_makes_its_peers_time_out() {
    let job = job();
    let (cfg, algo, shapes) = collectives().swap_remove(0);
    let key = ShmKey { job: job.clone(), instance: 1 };
    let t = Duration::from_millis(1000);
    let c = ShmCollective::on_slot(&call_of(&cfg, algo, t, "ar"), &shapes, 8, &key, None, &PROCESS_OF, 0).unwrap();
    let (mut child, lines) = spawn_child("dies", &job, 1);
    let until = Instant::now() + Duration::from_secs(60);
    while lines.recv_timeout(until.saturating_duration_since(Instant::now())).expect("the child attaches") != ATTACHED {
    }
    assert_eq!(leftovers(&job), Vec::<String>::new(), "unlinked once both processes attached");
    let lens = c.output_lens();
    let mine = devices_of(&cfg, Some(0));
    let run = |calls| run_devices(&mine, &shapes, &lens, calls, &|d, i, o| c.run(d, i, o));
    // Two good calls.
    let direct = DirectCollective::on_slot(&call_of(&cfg, algo, t * 30, "direct"), &shapes, 8, own_slot).unwrap();
    let want = run_devices(&(0..8).collect::<Vec<_>>(), &shapes, &lens, 0..2, &|d, i, o| direct.run(d, i, o));
    for (d, got) in run(0..2).into_iter().enumerate() {
        assert!(got.unwrap() == *want[d].as_ref().unwrap(), "device {d}");
    }
    // The third: the child exits under it.
    let start = Instant::now();
    for (d, r) in run(2..3).into_iter().enumerate() {
        match r {
            Err(Error::Timeout { waiting_rank, missing, group, .. }) => {
                assert_eq!((waiting_rank, group), (d, (0..8).collect::<Vec<_>>()));
                assert!(missing.contains(&6) && missing.contains(&7), "{missing:?}");
                assert!(missing.iter().all(|m| (4..8).contains(m)), "{missing:?}");
            }
            r => panic!("device {d}: {r:?}"),
        }
    }
    assert!(start.elapsed() < t + Duration::from_millis(1500), "{:?}", start.elapsed());
    assert_eq!(wait_child(&mut child, Duration::from_secs(30)).code(), Some(DIED));
    drop(c);
    assert_eq!(leftovers(&job), Vec::<String>::new());
}
