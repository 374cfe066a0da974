//! Concurrency through the function table: eight threads compile and execute eight different
//! programs on one client at once, and two threads execute the same executable at once; every
//! result matches XLA's golden outputs (ints exactly, floats to 1e-5 relative) and the
//! single-threaded run bit for bit.

mod support;

use hlo::Array;
use support::*;

/// Eight hlo-tests cases with goldens, replica mode, no 16-bit or 8-bit floats.
const CASES: &[(&str, usize)] = &[
    ("all_gather", 4),
    ("all_reduce_sum", 8),
    ("all_to_all_array", 4),
    ("reduce_scatter", 4),
    ("binary_int_div", 2),
    ("dot", 2),
    ("all_reduce_subgroups", 4),
    ("concatenate", 2),
];

/// Compiles `case` on `c`, runs it on the golden inputs, checks XLA's outputs; returns the
/// output bytes.
fn run_case(c: Client, case: &Case) -> Vec<Vec<Vec<u8>>> {
    let devs = devices(c);
    let l = compile(c, &case.proto, &replicas_options(case.devices as u8));
    let args: Vec<Vec<Buffer>> =
        case.inputs.iter().enumerate().map(|(d, row)| row.iter().map(|a| upload(c, devs[d], a)).collect()).collect();
    let outs = execute(l, &args);
    let bytes: Vec<Vec<Vec<u8>>> = outs.iter().map(|row| row.iter().map(|&b| to_host(b)).collect()).collect();
    for (d, (got, want)) in bytes.iter().zip(&case.outputs).enumerate() {
        assert_eq!(got.len(), want.len(), "{}: device {d} output count", case.name);
        for (o, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(close_to(g, w), "{}: device {d} output {o} differs from XLA", case.name);
        }
    }
    outs.into_iter().flatten().chain(args.into_iter().flatten()).for_each(destroy_buffer);
    destroy_loaded(l);
    bytes
}

#[test]
fn eight_threads_compile_and_execute_different_programs_at_once() {
    let cases: Vec<Case> = CASES.iter().map(|&(n, d)| case(n, d)).collect();
    let c = create_client(8);
    let baseline: Vec<_> = cases.iter().map(|k| run_case(c, k)).collect();
    let barrier = std::sync::Barrier::new(cases.len());
    std::thread::scope(|s| {
        for (k, want) in cases.iter().zip(&baseline) {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                for round in 0..25 {
                    assert_eq!(&run_case(c, k), want, "{} round {round}: differs from the serial run", k.name);
                }
            });
        }
    });
    destroy_client(c);
}

#[test]
fn two_threads_execute_the_same_executable_at_once() {
    let proto = std::fs::read(goldens().join("collective_permute_start_done.pb")).expect("golden");
    let c = create_client(2);
    let devs = devices(c);
    let l = compile(c, &proto, &replicas_options(2));
    std::thread::scope(|s| {
        for t in 0..2 {
            let devs = &devs;
            s.spawn(move || {
                for i in 0..200 {
                    // Small values, so exp() stays finite; distinct per thread and iteration.
                    let salt = t as f32 + i as f32 / 256.0;
                    let x: Vec<Array> = (0..2).map(|d| Array::from_slice(vec![3], &[salt, d as f32, -salt])).collect();
                    let args: Vec<Vec<Buffer>> = (0..2).map(|d| vec![upload(c, devs[d], &x[d])]).collect();
                    let outs = execute(l, &args);
                    for d in 0..2 {
                        // Output 0: the peer's x; output 1: that plus exp(own x).
                        assert_eq!(to_host(outs[d][0]), x[1 - d].data, "thread {t} iteration {i} device {d}");
                        let sum = to_host(outs[d][1]);
                        let want: Vec<f32> = (0..3)
                            .map(|j| x[1 - d].to_vec::<f32>().unwrap()[j] + x[d].to_vec::<f32>().unwrap()[j].exp())
                            .collect();
                        for (j, w) in want.iter().enumerate() {
                            let g = f32::from_le_bytes(sum[4 * j..4 * j + 4].try_into().unwrap());
                            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "thread {t} iteration {i}: {g} vs {w}");
                        }
                    }
                    outs.into_iter().flatten().chain(args.into_iter().flatten()).for_each(destroy_buffer);
                }
            });
        }
    });
    destroy_loaded(l);
    destroy_client(c);
}
