//! Tests of device code generation: what is generated, and (host emulation) what it
//! computes, against the reference interpreter.

use super::*;

fn plan_of(text: &str, n: usize) -> GenPlan {
    let m = hlo::parse_text("t.hlo", text).unwrap();
    generate(&m, n, emitter::DeviceMode::Replica, &emitter::Flags::default()).unwrap()
}

#[test]
fn kernels_constants_copies_and_declined_ops() {
    let p = plan_of(
        r#"HloModule m
add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ENTRY e {
  x = f32[4,3] parameter(0)
  c = f32[] constant(2)
  cb = f32[4,3] broadcast(c), dimensions={}
  y = f32[4,3] multiply(x, cb)
  r = f32[12] reshape(y)
  z = f32[] constant(0)
  s = f32[4] reduce(y, z), dimensions={1}, to_apply=add
  q = f8e4m3fn[4] parameter(1)
  w = f8e4m3fn[4] add(q, q)
  ROOT t = (f32[12], f32[4], f8e4m3fn[4]) tuple(r, s, w)
}"#,
        2,
    );
    let kinds: Vec<&str> = p
        .steps
        .iter()
        .flatten()
        .map(|s| match s {
            GenStep::Kernel { .. } => "kernel",
            GenStep::Constant { .. } => "constant",
            GenStep::Copy { .. } => "copy",
            GenStep::Nothing => "nothing",
        })
        .collect();
    // reshape of a same-size value aliases (no thunk); sort stays on the host.
    assert_eq!(kinds, ["constant", "kernel", "kernel", "constant", "kernel"], "{p:?}");
    assert_eq!(p.kernels(), 3);
    assert_eq!(p.host.len(), 1);
    assert!(p.host[0].1 == "w" && p.host[0].2.contains("f8e4m3fn"), "{:?}", p.host);
    assert!(p.source.contains("#include \"codegen.h\""));
    assert!(p.source.contains("op_mul(x, y)"), "{}", p.source);
    // The reduce folds dimension 1 in order, from the init value.
    assert!(p.source.contains("for (u64 r1 = 0; r1 < 3ull; ++r1)"), "{}", p.source);
    assert!(p.source.contains("acc0 = op_add(acc0, in0[(o0) * 3ull + (r1)])"), "{}", p.source);
}

#[test]
fn sixteen_bit_floats_compute_in_f32_and_round_each_step() {
    let p = plan_of(
        r#"HloModule m
mx { a = bf16[] parameter(0)  b = bf16[] parameter(1)  ROOT s = bf16[] maximum(a, b) }
ENTRY e {
  x = bf16[8] parameter(0)
  i = s32[8] convert(x)
  h = f16[8] convert(i)
  z = bf16[] constant(-inf)
  ROOT m = bf16[] reduce(x, z), dimensions={0}, to_apply=mx
}"#,
        1,
    );
    assert_eq!(p.kernels(), 3, "{:?}", p.host);
    assert!(p.source.contains("pl_f2i_s32((double)(to_f32(in0[i])))"), "{}", p.source);
    assert!(p.source.contains("from_f32_f16(pl_f64_to_f32_odd((double)(in0[i])))"), "{}", p.source);
    assert!(p.source.contains("acc0 = pl_rnd_bf16(op_max(acc0, to_f32("), "{}", p.source);
}

#[test]
fn reduce_window_loops_over_the_window_and_reads_only_input_elements() {
    let p = plan_of(
        r#"HloModule m
add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ENTRY e {
  x = f32[8] parameter(0)
  z = f32[] constant(0)
  c = f32[8] reduce-window(x, z), window={size=8 pad=7_0}, to_apply=add
  d = f32[5,7] parameter(1)
  r = f32[9,2] reduce-window(d, z), window={size=2x3 stride=1x2 pad=1_0x0_1 lhs_dilate=2x1 rhs_dilate=1x2}, to_apply=add
  ROOT t = (f32[8], f32[9,2]) tuple(c, r)
}"#,
        1,
    );
    assert_eq!(p.kernels(), 2, "{:?}", p.host);
    // cumsum: the window slides over the low padding, which reads nothing.
    assert!(p.source.contains("for (u64 w0 = 0; w0 < 8ull; ++w0)"), "{}", p.source);
    assert!(p.source.contains("const s64 p0 = (s64)o0 * 1ll + (s64)w0 * 1ll - (7ll);"), "{}", p.source);
    assert!(p.source.contains("if (!(p0 >= 0 && p0 < 8ll)) continue;"), "{}", p.source);
    assert!(p.source.contains("acc0 = op_add(acc0, in0[((u64)p0)])"), "{}", p.source);
    // Base dilation: holes read nothing; window dilation and stride step the position.
    assert!(p.source.contains("p0 >= 0 && p0 % 2ll == 0 && p0 / 2ll < 5ll"), "{}", p.source);
    assert!(p.source.contains("(s64)o1 * 2ll + (s64)w1 * 2ll - (0ll)"), "{}", p.source);
}

// ---- host emulation: generated kernels built by the host C++ compiler, run on random
// ---- operands (edge values included), compared with the interpreter's per-op code.

use hlo::Array;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Transcendental ops: the host math library may differ from Rust's in the last bits.
fn approximate(op: Opcode) -> bool {
    use Opcode::*;
    matches!(op, Exp | Expm1 | Log | Log1p | Tanh | Logistic | Sine | Cosine | Tan | Power | Atan2 | Cbrt | Erf)
}

fn random_element(ty: T, rng: &mut ChaCha8Rng, out: &mut [u8]) {
    let edge = rng.random_range(0..4) == 0;
    let f32v = |rng: &mut ChaCha8Rng| -> f32 {
        if edge {
            let e = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0, -1.0, 0.5, 1e-40, 3.0e38, 2.5, -2.5];
            e[rng.random_range(0..e.len())]
        } else {
            (rng.random::<f32>() - 0.5) * 2f32.powi(rng.random_range(-8..8))
        }
    };
    match ty {
        T::Pred => out[0] = rng.random_range(0..2),
        T::F32 => out.copy_from_slice(&f32v(rng).to_le_bytes()),
        T::F64 => out.copy_from_slice(&(f32v(rng) as f64 * (1.0 + rng.random::<f64>() * 1e-9)).to_le_bytes()),
        T::F16 => out.copy_from_slice(&half::f16::from_f32(f32v(rng)).to_le_bytes()),
        T::Bf16 => out.copy_from_slice(&half::bf16::from_f32(f32v(rng)).to_le_bytes()),
        T::S8 | T::S16 | T::S32 | T::S64 | T::U8 | T::U16 | T::U32 | T::U64 => {
            let bits = 8 * out.len() as u32;
            let v: u64 = match rng.random_range(0..4) {
                // Edge values: 0, 1, all ones, the signed minimum and maximum, the unsigned maximum.
                0 => [0, 1, u64::MAX, 1 << (bits - 1), (1 << (bits - 1)) - 1, 2, 3][rng.random_range(0..7)],
                // Small values (shift amounts, exponents, indices).
                1 => rng.random_range(0..(bits as u64 + 3)),
                2 => (rng.random_range(0..9) as u64).wrapping_sub(4),
                _ => rng.random(),
            };
            out.copy_from_slice(&v.to_le_bytes()[..out.len()]);
        }
        _ => out.fill(rng.random()),
    }
}

/// Random operand data; `no_nan` redraws NaNs (sort: with NaN a `<` comparator is not the
/// strict weak order XLA requires, and the order of incomparable elements is unspecified).
fn random_array(shape: &ArrayShape, rng: &mut ChaCha8Rng, no_nan: bool) -> Array {
    let es = shape.ty.byte_size();
    let mut data = vec![0u8; shape.byte_size()];
    for e in data.chunks_mut(es.max(1)) {
        random_element(shape.ty, rng, e);
        while no_nan && is_nan(shape.ty, e) {
            random_element(shape.ty, rng, e);
        }
    }
    Array { shape: shape.clone(), data }
}

fn is_nan(ty: T, b: &[u8]) -> bool {
    match ty {
        T::F32 => f32::from_le_bytes(b.try_into().unwrap()).is_nan(),
        T::F64 => f64::from_le_bytes(b.try_into().unwrap()).is_nan(),
        T::F16 => half::f16::from_le_bytes(b.try_into().unwrap()).is_nan(),
        T::Bf16 => half::bf16::from_le_bytes(b.try_into().unwrap()).is_nan(),
        _ => false,
    }
}

/// Whether two stored elements agree: bitwise, both NaN, or (approximate ops) within 2 ulps.
fn agree(ty: T, got: &[u8], want: &[u8], approx: bool) -> bool {
    if got == want {
        return true;
    }
    let (g, w) = match ty {
        T::F32 => {
            (f32::from_le_bytes(got.try_into().unwrap()) as f64, f32::from_le_bytes(want.try_into().unwrap()) as f64)
        }
        T::F64 => (f64::from_le_bytes(got.try_into().unwrap()), f64::from_le_bytes(want.try_into().unwrap())),
        T::F16 => (
            half::f16::from_le_bytes(got.try_into().unwrap()).to_f64(),
            half::f16::from_le_bytes(want.try_into().unwrap()).to_f64(),
        ),
        T::Bf16 => (
            half::bf16::from_le_bytes(got.try_into().unwrap()).to_f64(),
            half::bf16::from_le_bytes(want.try_into().unwrap()).to_f64(),
        ),
        _ => return false,
    };
    if g.is_nan() && w.is_nan() {
        return true;
    }
    let ulps = |b: &[u8]| -> i128 {
        let mut v = [0u8; 8];
        v[..b.len()].copy_from_slice(b);
        let x = u64::from_le_bytes(v) as i128;
        let sign = 1i128 << (8 * b.len() - 1);
        if x & sign != 0 { sign - x } else { x }
    };
    approx && (ulps(got) - ulps(want)).abs() <= 2
}

/// Builds `source` with the host C++ compiler into a shared library in a fresh directory.
fn build_host(source: &str, tag: usize) -> Result<(std::path::PathBuf, libloading::Library), String> {
    let dir = std::env::temp_dir().join(format!("peerless-codegen-emu-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for (name, text) in [
        TYPES_HEADER,
        GEN_HEADER,
        ("cuda_host_shim.h", include_str!("../tests/host_support/cuda_host_shim.h")),
        ("generated.cu", source),
    ] {
        std::fs::write(dir.join(name), text).map_err(|e| e.to_string())?;
    }
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let out = std::process::Command::new(&cxx)
        .current_dir(&dir)
        .args(["-std=c++20", "-O1", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC"])
        .args(["-DPL_HOST_EMULATION", "-include", "cuda_host_shim.h", "-I.", "-x", "c++", "generated.cu"])
        .args(["-o", "generated.so"])
        .output()
        .map_err(|e| format!("{cxx}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cxx} failed:\n{}\n--- source ---\n{source}", String::from_utf8_lossy(&out.stderr)));
    }
    // SAFETY: the library is the unit just built; its initialisers are the C++ runtime's.
    let lib = unsafe { libloading::Library::new(dir.join("generated.so")) }.map_err(|e| e.to_string())?;
    Ok((dir, lib))
}

/// Runs every generated kernel of `module` on `n` devices on random operands (3 draws, first
/// and last device) and compares with the interpreter; returns the kernels checked.
fn emulate(name: &str, module: &hlo::Module, n: usize, mode: emitter::DeviceMode, tag: usize) -> Result<usize, String> {
    let flags = emitter::Flags::default();
    let table = emitter::PeerAccessTable::for_host_topology(n, &flags.host_topology);
    let low =
        crate::exec::lower(module, n, mode, &flags, &table, &crate::exec::HostSizer).map_err(|e| e.to_string())?;
    let plan = plan(&low);
    if plan.kernels() == 0 {
        return Ok(0);
    }
    let (dir, lib) = build_host(&plan.source, tag)?;
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed ^ tag as u64);
    let mut checked = 0;
    for (k, step) in plan.steps.iter().enumerate() {
        let Some(GenStep::Kernel { name: kname, .. }) = step else { continue };
        let Thunk::Compute { instr, inputs, outputs, .. } = &low.programs[0].thunks[k] else { unreachable!() };
        let ins = low.module.instr(*instr);
        let shapes = &low.shapes[k].operands;
        // SAFETY: every generated kernel is `void(u8*, u32)` (codegen.rs writes them so).
        let f: libloading::Symbol<unsafe extern "C" fn(*mut u8, u32)> =
            unsafe { lib.get(kname.as_bytes()) }.map_err(|e| e.to_string())?;
        for draw in 0..3 {
            for d in [0, n - 1] {
                let mut arena = vec![0u8; low.programs[0].arena_bytes];
                let mut operands: Vec<Literal> = Vec::new();
                for (i, s) in shapes.iter().enumerate() {
                    // An operand used twice (`multiply(x, x)`) is one region: one draw.
                    let a = match inputs[..i].iter().position(|r| *r == inputs[i]) {
                        Some(j) => operands[j].clone(),
                        None => Literal::Array(random_array(
                            s.as_array().ok_or("non-array operand")?,
                            &mut rng,
                            ins.opcode == Opcode::Sort,
                        )),
                    };
                    let bytes = &a.as_array().ok_or("non-array operand")?.data;
                    arena[inputs[i].offset..inputs[i].offset + bytes.len()].copy_from_slice(bytes);
                    operands.push(a);
                }
                // SAFETY: the arena is as large as the program's, and the kernel touches only
                // its thunk's regions inside it; one host "thread" runs the whole loop.
                unsafe { f(arena.as_mut_ptr(), d as u32) };
                let want = low.evaluator.eval(&low.module, *instr, &operands, d).map_err(|e| e.to_string())?;
                let leaves = want.leaves();
                if leaves.len() != outputs.len() {
                    return Err(format!("'{}': {} result leaves, {} regions", ins.name, leaves.len(), outputs.len()));
                }
                for (want, out) in leaves.iter().zip(outputs) {
                    let got = &arena[out.offset..out.offset + want.data.len()];
                    let ty = want.shape.ty;
                    let es = ty.byte_size().max(1);
                    for (j, (g, w)) in got.chunks(es).zip(want.data.chunks(es)).enumerate() {
                        if !agree(ty, g, w, approximate(ins.opcode)) {
                            let args: Vec<String> = operands
                                .iter()
                                .map(|o| {
                                    let a = o.as_array().unwrap();
                                    let es = a.shape.ty.byte_size().max(1);
                                    let j = if a.element_count() == want.element_count() { j } else { 0 };
                                    let at = (j * es).min(a.data.len());
                                    format!("{:02x?}", &a.data[at..(at + es).min(a.data.len())])
                                })
                                .collect();
                            return Err(format!(
                                "{name} on {n}: '{}' ({}) element {j} (draw {draw}, device {d}): got {g:02x?}, \
                                 interpreter {w:02x?}; operands at that element (or 0): {args:?}",
                                ins.name,
                                ins.opcode.name(),
                            ));
                        }
                    }
                }
                checked += 1;
            }
        }
    }
    drop(lib);
    let _ = std::fs::remove_dir_all(dir);
    Ok(checked)
}

/// Every hlo-tests case's generated kernels, built by the host compiler, agree with the
/// interpreter on random operands (edge values included). Without a C++ compiler the test
/// fails under CI=true and is skipped loudly elsewhere.
#[test]
fn generated_kernels_match_the_interpreter_in_host_emulation() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if std::process::Command::new(&cxx).arg("--version").output().is_err() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert!(!ci, "CI=true but the host C++ compiler '{cxx}' is missing");
        eprintln!("\n*** SKIPPED: no host C++ compiler '{cxx}' (set CXX)\n");
        return;
    }
    let mut seen = std::collections::HashSet::new();
    let (mut units, mut checked) = (0, 0);
    for case in hlo_tests::load_cases().expect("hlo-tests cases") {
        let Ok(d) = case.directive.as_ref() else { continue };
        let module = hlo::parse_text(&case.name, &case.text).expect("parse");
        let mode = d.mode.device_mode();
        for &n in &d.devices {
            let src = generate(&module, n, mode, &emitter::Flags::default()).expect("generate").source;
            if src.is_empty() || !seen.insert(src) {
                continue;
            }
            units += 1;
            checked += emulate(&case.name, &module, n, mode, units).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    eprintln!("host emulation: {units} units, {checked} kernel runs agree with the interpreter");
    assert!(checked > 0);
}
