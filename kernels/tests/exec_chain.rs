//! Chains of all-reduces with elementwise steps between them (the shape of a jitted JAX
//! psum loop: `a = psum(a) * 0.5 + replica_id`), at sizes where the all-reduce is one-shot,
//! two-shot and the fallback, run several times with fresh arguments and compared with the
//! interpreter, on the host backend.

use emitter::{DeviceMode, Flags};
use hlo::{Array, Literal};
use interp::{Mode, RunConfig};
use kernels::exec::{BackendKind, Executable};

fn backend() -> (BackendKind, usize) {
    match std::env::var("PEERLESS_TEST_BACKEND").as_deref() {
        Ok("host") | Err(_) => (BackendKind::Host, usize::MAX),
        Ok(other) => panic!("PEERLESS_TEST_BACKEND={other}: only host (GPUs run modules inside XLA)"),
    }
}

fn chain(elems: usize, steps: usize) -> String {
    let mut t = format!(
        "HloModule chain_{elems}\nadd {{ a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }}\n\
         ENTRY e {{\n  v0 = f32[{elems}] parameter(0)\n  c = f32[] constant(0.5)\n  half = f32[{elems}] broadcast(c), \
         dimensions={{}}\n  r = u32[] replica-id()\n  rf = f32[] convert(r)\n  rb = f32[{elems}] broadcast(rf), dimensions={{}}\n"
    );
    for k in 0..steps {
        t += &format!(
            "  s{k} = f32[{elems}] all-reduce(v{k}), replica_groups={{}}, to_apply=add\n  \
             m{k} = f32[{elems}] multiply(s{k}, half)\n  v{n} = f32[{elems}] add(m{k}, rb)\n",
            n = k + 1
        );
    }
    t + &format!("  ROOT out = f32[{elems}] copy(v{steps})\n}}\n")
}

fn close(got: &Array, want: &Array) -> Option<String> {
    let (g, w) = (got.data.chunks(4), want.data.chunks(4));
    for (i, (a, b)) in g.zip(w).enumerate() {
        let (a, b) = (f32::from_le_bytes(a.try_into().ok()?), f32::from_le_bytes(b.try_into().ok()?));
        // NCCL may add in another order: a few ulps over 8 steps. Stale or missing data is
        // off by far more.
        if (a - b).abs() > 1e-5 * b.abs().max(1.0) {
            return Some(format!("element {i}: got {a}, interpreter {b}"));
        }
    }
    (got.data.len() != want.data.len()).then(|| "sizes differ".into())
}

#[test]
fn all_reduce_chains_match_the_interpreter_at_every_algorithm_size() {
    let (kind, devices) = backend();
    let (mut ran, mut skipped) = (0, Vec::new());
    // One-shot (16 KiB), two-shot (1 MiB) and the fallback (4 MiB + 4 B) by default flags; the
    // host backend (CI, debug build) skips the largest size, whose interpreter run is slow.
    let sizes: &[usize] = if kind == BackendKind::Host { &[4096, 262_144] } else { &[4096, 262_144, 1_048_577] };
    let draws = if kind == BackendKind::Host { 2 } else { 4 };
    for &elems in sizes {
        let module = hlo::parse_text("chain.hlo", &chain(elems, 8)).unwrap();
        for n in [2, 4] {
            if n > devices {
                skipped.push(format!("{elems} elements on {n} devices"));
                continue;
            }
            let exe = Executable::new(kind, &module, n, DeviceMode::Replica, &Flags::default())
                .unwrap_or_else(|e| panic!("compile {elems} on {n}: {e}"));
            let cfg = RunConfig { num_devices: n, mode: Mode::Replica };
            for seed in 0..draws {
                let args = interp::io::random_inputs(&module, &cfg, seed * 7919 + elems as u64).unwrap();
                let want = interp::run(&module, &cfg, &args).unwrap();
                let got = exe.execute(&args).unwrap_or_else(|e| panic!("run {elems} on {n}: {e}"));
                for (d, (g, w)) in got.iter().zip(&want).enumerate() {
                    let (Literal::Array(g), Literal::Array(w)) = (g, w) else { panic!("tuple result") };
                    if let Some(m) = close(g, w) {
                        panic!("{elems} f32 on {n} devices ({kind:?}), run {seed}, device {d}: {m}");
                    }
                }
                ran += 1;
            }
        }
    }
    eprintln!("chains: {ran} runs match the interpreter; not run (too few devices): {skipped:?}");
    assert!(ran > 0, "no configuration ran: {skipped:?}");
}
