//! Unsupported dtypes and ops, and argument checking.
mod common;
use common::*;
use hlo::{Array, ArrayShape, PrimitiveType};
use interp::{InterpError, Mode};

fn raw(ty: PrimitiveType, dims: &[i64]) -> hlo::Literal {
    let shape = ArrayShape::new(ty, dims.to_vec());
    let n = shape.byte_size();
    Array::new(shape, (0..n).map(|i| i as u8).collect()).unwrap().into()
}

#[test]
fn f8_and_s4_move_but_do_not_compute() {
    let t = "HloModule m\nENTRY e {\n  a = f8e4m3fn[2,3] parameter(0)\n  t = f8e4m3fn[3,2] transpose(a), dimensions={1,0}\n  s = f8e4m3fn[1,2] slice(t), slice={[1:2], [0:2]}\n  r = f8e4m3fn[2] reshape(s)\n  ROOT c = f8e4m3fn[4] concatenate(r, r), dimensions={0}\n}\n";
    let out = run1(t, vec![raw(PrimitiveType::F8E4M3FN, &[2, 3])]);
    assert_eq!(out.as_array().unwrap().data, vec![1, 4, 1, 4]);
    let t = "HloModule m\nENTRY e {\n  a = s4[4] parameter(0)\n  ROOT g = s4[8] all-gather(a), replica_groups={}, dimensions={0}\n}\n";
    let out = run_same(t, 2, Mode::Replica, vec![raw(PrimitiveType::S4, &[4])]);
    assert_eq!(out[1].as_array().unwrap().data, vec![0, 1, 2, 3, 0, 1, 2, 3]);
    let t = "HloModule m\nENTRY e {\n  a = f8e5m2[2] parameter(0)\n  ROOT r = f8e5m2[2] add(a, a)\n}\n";
    let e = run_err(t, 1, Mode::Replica, vec![vec![raw(PrimitiveType::F8E5M2, &[2])]]);
    assert!(
        matches!(&e, InterpError::UnsupportedDtype { dtype, op, instr } if dtype == "f8e5m2" && op == "add" && instr.contains("%r")),
        "{e}"
    );
    let t = "HloModule m\nENTRY e {\n  a = s4[2] parameter(0)\n  ROOT r = f32[2] convert(a)\n}\n";
    let e = run_err(t, 1, Mode::Replica, vec![vec![raw(PrimitiveType::S4, &[2])]]);
    assert!(matches!(&e, InterpError::UnsupportedDtype { dtype, op, .. } if dtype == "s4" && op == "convert"), "{e}");
    let t = "HloModule m\nadd {\n  x = f8e4m3fn[] parameter(0)\n  y = f8e4m3fn[] parameter(1)\n  ROOT s = f8e4m3fn[] add(x, y)\n}\nENTRY e {\n  a = f8e4m3fn[2] parameter(0)\n  ROOT r = f8e4m3fn[2] all-reduce(a), replica_groups={}, to_apply=add\n}\n";
    let e = run_err(t, 2, Mode::Replica, vec![vec![raw(PrimitiveType::F8E4M3FN, &[2])]; 2]);
    assert!(matches!(&e, InterpError::UnsupportedDtype { .. }), "{e}");
}

#[test]
fn unsupported_ops_name_themselves() {
    let t = "HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT s = f32[4] reduce-precision(x), exponent_bits=5, mantissa_bits=10\n}\n";
    let e = run_err(t, 1, Mode::Replica, vec![vec![ramp(&[4], 0.0)]]);
    assert!(
        matches!(&e, InterpError::UnsupportedOp { op, instr, .. } if op == "reduce-precision" && instr.contains("%s")),
        "{e}"
    );
    let t = "HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT s = f32[4] custom-call(x), custom_call_target=\"my_kernel\"\n}\n";
    let e = run_err(t, 1, Mode::Replica, vec![vec![ramp(&[4], 0.0)]]);
    assert!(matches!(&e, InterpError::UnsupportedOp { why, .. } if why.contains("my_kernel")), "{e}");
}

#[test]
fn reduce_window_errors_name_the_instruction() {
    let add = "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n";
    let t = format!(
        "HloModule m\n{add}ENTRY e {{\n  a = f32[4] parameter(0)\n  z = f32[] constant(0)\n  ROOT rw = f32[3] reduce-window(a, z), window={{size=2 rhs_reversal=1}}, to_apply=add\n}}\n"
    );
    let e = run_err(&t, 1, Mode::Replica, vec![vec![ramp(&[4], 0.0)]]);
    assert!(
        matches!(&e, InterpError::UnsupportedOp { op, instr, why } if op == "reduce-window" && instr.contains("%rw") && why.contains("rhs_reversal")),
        "{e}"
    );
    // Hand-broken IR (bypassing the verifier): a malformed window, a window of the wrong rank.
    let t = t.replace(" rhs_reversal=1", "");
    let mut m = parse(&t);
    let root = m.entry().root;
    for window in ["{size=2 stride=x}", "{size=2x2}", "{size=0}"] {
        m.instrs[root].attrs.other.insert("window".into(), window.into());
        let e = interp::run(&m, &cfg(1, Mode::Replica), &[vec![ramp(&[4], 0.0)]]).unwrap_err();
        assert!(matches!(&e, InterpError::Runtime { instr, .. } if instr.contains("%rw")), "{window}: {e}");
    }
}

#[test]
fn bad_arguments() {
    let t =
        "HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  b = s32[] parameter(1)\n  ROOT r = f32[2] negate(a)\n}\n";
    let good = vec![ramp(&[2], 0.0), arr(&[], &[1i32])];
    let e = run_err(t, 2, Mode::Replica, vec![good.clone()]);
    assert!(matches!(&e, InterpError::BadArguments(m) if m.contains("1 devices") && m.contains("2 devices")), "{e}");
    let e = run_err(t, 2, Mode::Replica, vec![good.clone(), vec![ramp(&[2], 0.0)]]);
    assert!(matches!(&e, InterpError::BadArguments(m) if m.contains("device 1") && m.contains("takes 2")), "{e}");
    let e = run_err(t, 2, Mode::Replica, vec![good.clone(), vec![ramp(&[3], 0.0), arr(&[], &[1i32])]]);
    assert!(
        matches!(&e, InterpError::BadArguments(m) if m.contains("parameter 0 on device 1") && m.contains("f32[2]") && m.contains("f32[3]")),
        "{e}"
    );
    let e = run_err(t, 1, Mode::Replica, vec![vec![ramp(&[2], 0.0), arr(&[], &[1u32])]]);
    assert!(matches!(&e, InterpError::BadArguments(m) if m.contains("parameter 1")), "{e}");
    let m = parse(t);
    let e = interp::run(&m, &cfg(0, Mode::Replica), &[]).unwrap_err();
    assert!(matches!(e, InterpError::BadArguments(_)));
    let t = "HloModule m, replica_count=4\nENTRY e {\n  a = f32[2] parameter(0)\n  ROOT r = f32[2] negate(a)\n}\n";
    let e = run_err(t, 2, Mode::Replica, vec![vec![ramp(&[2], 0.0)]; 2]);
    assert!(e.to_string().contains("replica_count=4"), "{e}");
}

#[test]
fn malformed_ir_is_an_error_not_a_panic() {
    // Hand-broken IR (bypassing the verifier): bad slice, bad broadcast dims, bad tuple index.
    let t = "HloModule m\nENTRY e {\n  a = f32[4] parameter(0)\n  ROOT s = f32[2] slice(a), slice={[0:2]}\n}\n";
    let mut m = parse(t);
    let root = m.entry().root;
    m.instrs[root].attrs.slice = Some(vec![hlo::SliceDim { start: 3, limit: 9, stride: 1 }]);
    let e = interp::run(&m, &cfg(1, Mode::Replica), &[vec![ramp(&[4], 0.0)]]).unwrap_err();
    assert!(matches!(e, InterpError::Runtime { .. }), "{e}");
    m.instrs[root].attrs.slice = Some(vec![hlo::SliceDim { start: 0, limit: 2, stride: 0 }]);
    assert!(interp::run(&m, &cfg(1, Mode::Replica), &[vec![ramp(&[4], 0.0)]]).is_err());
    let t = "HloModule m\nENTRY e {\n  a = f32[4] parameter(0)\n  ROOT b = f32[4,2] broadcast(a), dimensions={0}\n}\n";
    let mut m = parse(t);
    let root = m.entry().root;
    m.instrs[root].attrs.dimensions = Some(vec![7]);
    assert!(interp::run(&m, &cfg(1, Mode::Replica), &[vec![ramp(&[4], 0.0)]]).is_err());
    m.instrs[root].attrs.dimensions = Some(vec![0]);
    m.instrs[root].shape = hlo::Shape::array(PrimitiveType::F32, vec![1 << 40, 1 << 40]);
    let e = interp::run(&m, &cfg(1, Mode::Replica), &[vec![ramp(&[4], 0.0)]]).unwrap_err();
    assert!(e.to_string().contains("too large"), "{e}");
    m.instrs[root].shape = hlo::Shape::array(PrimitiveType::F32, vec![4, -2]);
    assert!(interp::run(&m, &cfg(1, Mode::Replica), &[vec![ramp(&[4], 0.0)]]).is_err());
}
