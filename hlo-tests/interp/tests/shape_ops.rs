//! Data movement, reductions, dot and call.
mod common;
use common::*;
use half::bf16;
use hlo::Literal;

fn one(body: &str, params: Vec<Literal>) -> Literal {
    run1(&format!("HloModule m\nENTRY e {{\n{body}\n}}\n"), params)
}

/// A reducer that is not commutative (`x * 2 + y`): its results show the fold order.
const FOLD: &str = "f {\n  x = s32[] parameter(0)\n  y = s32[] parameter(1)\n  two = s32[] constant(2)\n  m = s32[] multiply(x, two)\n  ROOT s = s32[] add(m, y)\n}\n";

/// The (value, index) reducer of an argmax: the larger value wins, the earlier index on ties.
const ARGMAX: &str = "argmax {\n  v0 = f32[] parameter(0)\n  i0 = s32[] parameter(1)\n  v1 = f32[] parameter(2)\n  i1 = s32[] parameter(3)\n  gt = pred[] compare(v1, v0), direction=GT\n  v = f32[] select(gt, v1, v0)\n  i = s32[] select(gt, i1, i0)\n  ROOT t = (f32[], s32[]) tuple(v, i)\n}\n";

#[test]
fn reshape_broadcast_transpose() {
    let x = ramp(&[2, 3], 0.0);
    let r = one("  a = f32[2,3] parameter(0)\n  ROOT r = f32[3,2] reshape(a)", vec![x.clone()]);
    assert_eq!((dims(&r), vals::<f32>(&r)), (vec![3, 2], vec![0., 1., 2., 3., 4., 5.]));
    let r = one("  a = f32[2,3] parameter(0)\n  ROOT r = f32[3,2] transpose(a), dimensions={1,0}", vec![x.clone()]);
    assert_eq!(vals::<f32>(&r), vec![0., 3., 1., 4., 2., 5.]);
    let r = one("  a = f32[2,3] parameter(0)\n  ROOT r = f32[6] bitcast(a)", vec![x]);
    assert_eq!(dims(&r), vec![6]);
    let v = arr(&[2], &[1i32, 2]);
    let r = one("  a = s32[2] parameter(0)\n  ROOT r = s32[2,3] broadcast(a), dimensions={0}", vec![v.clone()]);
    assert_eq!(vals::<i32>(&r), vec![1, 1, 1, 2, 2, 2]);
    let r = one("  a = s32[2] parameter(0)\n  ROOT r = s32[3,2] broadcast(a), dimensions={1}", vec![v]);
    assert_eq!(vals::<i32>(&r), vec![1, 2, 1, 2, 1, 2]);
}

#[test]
fn slice_concat_reverse_pad() {
    let x = ramp(&[3, 4], 0.0);
    let r = one("  a = f32[3,4] parameter(0)\n  ROOT r = f32[2,2] slice(a), slice={[1:3], [0:4:2]}", vec![x.clone()]);
    assert_eq!(vals::<f32>(&r), vec![4., 6., 8., 10.]);
    let r = one(
        "  a = f32[3,4] parameter(0)\n  b = f32[3,4] parameter(1)\n  ROOT r = f32[3,8] concatenate(a, b), dimensions={1}",
        vec![x.clone(), ramp(&[3, 4], 100.0)],
    );
    assert_eq!(vals::<f32>(&r)[..8], [0., 1., 2., 3., 100., 101., 102., 103.]);
    let r = one("  a = f32[3,4] parameter(0)\n  ROOT r = f32[3,4] reverse(a), dimensions={0,1}", vec![x]);
    assert_eq!(vals::<f32>(&r)[..2], [11., 10.]);
    // lo=1, hi=-1 (drops the last element), interior 1.
    let r = one(
        "  a = s32[3] parameter(0)\n  z = s32[] constant(9)\n  ROOT r = s32[5] pad(a, z), padding=1_-1_1",
        vec![arr(&[3], &[1i32, 2, 3])],
    );
    assert_eq!(vals::<i32>(&r), vec![9, 1, 9, 2, 9]);
    let r = one(
        "  a = s32[2,2] parameter(0)\n  z = s32[] constant(0)\n  ROOT r = s32[1,3] pad(a, z), padding=-1_0_0x0_0_1",
        vec![arr(&[2, 2], &[1i32, 2, 3, 4])],
    );
    assert_eq!(vals::<i32>(&r), vec![3, 0, 4]);
}

#[test]
fn dynamic_slice_clamps_starts() {
    let x = ramp(&[5], 0.0);
    let body = |ty: &str| {
        format!(
            "  a = f32[5] parameter(0)\n  i = {ty}[] parameter(1)\n  ROOT r = f32[2] dynamic-slice(a, i), dynamic_slice_sizes={{2}}"
        )
    };
    assert_eq!(vals::<f32>(&one(&body("s32"), vec![x.clone(), arr(&[], &[-3i32])])), vec![0., 1.]);
    assert_eq!(vals::<f32>(&one(&body("s32"), vec![x.clone(), arr(&[], &[2i32])])), vec![2., 3.]);
    assert_eq!(vals::<f32>(&one(&body("s32"), vec![x.clone(), arr(&[], &[7i32])])), vec![3., 4.]);
    assert_eq!(vals::<f32>(&one(&body("u32"), vec![x.clone(), arr(&[], &[u32::MAX])])), vec![3., 4.]);
    let dus = "  a = f32[5] parameter(0)\n  u = f32[2] parameter(1)\n  i = s64[] parameter(2)\n  ROOT r = f32[5] dynamic-update-slice(a, u, i)";
    let r = one(dus, vec![x.clone(), arr(&[2], &[-1.0f32, -2.0]), arr(&[], &[10i64])]);
    assert_eq!(vals::<f32>(&r), vec![0., 1., 2., -1., -2.]);
    let r = one(dus, vec![x, arr(&[2], &[-1.0f32, -2.0]), arr(&[], &[1i64])]);
    assert_eq!(vals::<f32>(&r), vec![0., -1., -2., 3., 4.]);
}

#[test]
fn iota_and_bitcast_convert() {
    let r = one("  ROOT r = s32[2,3] iota(), iota_dimension=1", vec![]);
    assert_eq!(vals::<i32>(&r), vec![0, 1, 2, 0, 1, 2]);
    let r = one("  ROOT r = f32[2,3] iota(), iota_dimension=0", vec![]);
    assert_eq!(vals::<f32>(&r), vec![0., 0., 0., 1., 1., 1.]);
    let r = one("  a = f32[2] parameter(0)\n  ROOT r = u32[2] bitcast-convert(a)", vec![arr(&[2], &[1.0f32, -2.0])]);
    assert_eq!(vals::<u32>(&r), vec![0x3f80_0000, 0xc000_0000]);
    let r = one("  a = u32[1] parameter(0)\n  ROOT r = u8[1,4] bitcast-convert(a)", vec![arr(&[1], &[0x0403_0201u32])]);
    assert_eq!(vals::<u8>(&r), vec![1, 2, 3, 4]);
    let r =
        one("  a = u16[2] parameter(0)\n  ROOT r = u32[] bitcast-convert(a)", vec![arr(&[2], &[0x0201u16, 0x0403])]);
    assert_eq!(vals::<u32>(&r), vec![0x0403_0201]);
}

const ADD_F32: &str = "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n";

#[test]
fn reduce_add_and_generic() {
    let t = format!(
        "HloModule m\n{ADD_F32}ENTRY e {{\n  a = f32[2,3] parameter(0)\n  z = f32[] constant(10)\n  ROOT r = f32[3] reduce(a, z), dimensions={{0}}, to_apply=add\n}}\n"
    );
    assert_eq!(vals::<f32>(&run1(&t, vec![ramp(&[2, 3], 0.0)])), vec![13., 15., 17.]);
    // Generic to_apply (x*2 + y, not commutative): left fold in row-major order from init.
    let t = &format!(
        "HloModule m\n{FOLD}ENTRY e {{\n  a = s32[2,3] parameter(0)\n  z = s32[] constant(1)\n  ROOT r = s32[2] reduce(a, z), dimensions={{1}}, to_apply=f\n}}\n"
    );
    // row 0: ((1*2+0)*2+1)*2+2 = 12; row 1: ((1*2+3)*2+4)*2+5 = 33.
    assert_eq!(vals::<i32>(&run1(t, vec![arr(&[2, 3], &[0i32, 1, 2, 3, 4, 5])])), vec![12, 33]);
}

#[test]
fn variadic_reduce_argmax() {
    let t = &format!(
        "HloModule m\n{ARGMAX}ENTRY e {{
  a = f32[2,4] parameter(0)
  idx = s32[2,4] iota(), iota_dimension=1
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[2], s32[2]) reduce(a, idx, ninf, zero), dimensions={{1}}, to_apply=argmax
}}
"
    );
    let r = run1(t, vec![arr(&[2, 4], &[1.0f32, 5.0, 3.0, 5.0, -1.0, -2.0, 0.5, -3.0])]);
    assert_eq!(tuple_vals::<f32>(&r, 0), vec![5.0, 0.5]);
    assert_eq!(tuple_vals::<i32>(&r, 1), vec![1, 2]);
}

#[test]
fn reduce_bf16_rounds_every_step() {
    // Checked against XLA CPU: 256 + 1 + 1 + 1 in bf16 stays 256.
    let t = "HloModule m\nadd {\n  x = bf16[] parameter(0)\n  y = bf16[] parameter(1)\n  ROOT s = bf16[] add(x, y)\n}\nENTRY e {\n  a = bf16[4] parameter(0)\n  z = bf16[] constant(0)\n  ROOT r = bf16[] reduce(a, z), dimensions={0}, to_apply=add\n}\n";
    let x: Vec<bf16> = [256.0f32, 1.0, 1.0, 1.0].iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(vals::<bf16>(&run1(t, vec![arr(&[4], &x)])), vec![bf16::from_f32(256.0)]);
}

#[test]
fn reduce_window_folds_each_window_from_init() {
    let rw = |input: &str, window: &str, out: &str, init: &str, params: Vec<Literal>| {
        run1(
            &format!(
                "HloModule m\n{ADD_F32}ENTRY e {{\n  a = {input} parameter(0)\n  z = f32[] constant({init})\n  ROOT r = {out} reduce-window(a, z), window={window}, to_apply=add\n}}\n"
            ),
            params,
        )
    };
    // jnp.cumsum: a window as long as the input, padded low by all but one.
    let r = rw("f32[4]", "{size=4 pad=3_0}", "f32[4]", "0", vec![ramp(&[4], 1.0)]);
    assert_eq!(vals::<f32>(&r), vec![1., 3., 6., 10.]);
    // Along dimension 1 only, with a stride: [[0 1 2 3] [4 5 6 7]] in windows of 2.
    let r = rw("f32[2,4]", "{size=1x2 stride=1x2}", "f32[2,2]", "0", vec![ramp(&[2, 4], 0.0)]);
    assert_eq!(vals::<f32>(&r), vec![1., 5., 9., 13.]);
    // Padding and base-dilation holes read nothing: the init value (10) counts once. The
    // dilated, padded input is [pad pad 1 hole 2 pad]; windows of 3.
    let r = rw("f32[2]", "{size=3 pad=2_1 lhs_dilate=2}", "f32[4]", "10", vec![ramp(&[2], 1.0)]);
    assert_eq!(vals::<f32>(&r), vec![11., 11., 13., 12.]);
    // Window dilation: elements 0 and 2, 1 and 3.
    let r = rw("f32[4]", "{size=2 rhs_dilate=2}", "f32[2]", "0", vec![ramp(&[4], 0.0)]);
    assert_eq!(vals::<f32>(&r), vec![2., 4.]);
    // Scalar inputs come back unchanged (XLA compiles the op to a copy, init and reducer unused).
    let r = rw("f32[]", "{}", "f32[]", "10", vec![arr(&[], &[2.5f32])]);
    assert_eq!(vals::<f32>(&r), vec![2.5]);
    // Generic to_apply (x*2 + y, not commutative): a left fold from init in row-major window
    // order. Windows of 3 over [0 1 2 3]: ((1*2+0)*2+1)*2+2 = 12, ((1*2+1)*2+2)*2+3 = 19.
    let t = &format!(
        "HloModule m\n{FOLD}ENTRY e {{\n  a = s32[4] parameter(0)\n  z = s32[] constant(1)\n  ROOT r = s32[2] reduce-window(a, z), window={{size=3}}, to_apply=f\n}}\n"
    );
    assert_eq!(vals::<i32>(&run1(t, vec![arr(&[4], &[0i32, 1, 2, 3])])), vec![12, 19]);
}

#[test]
fn variadic_reduce_window_argmax_pool() {
    let t = &format!(
        "HloModule m\n{ARGMAX}ENTRY e {{
  a = f32[6] parameter(0)
  idx = s32[6] iota(), iota_dimension=0
  ninf = f32[] constant(-inf)
  zero = s32[] constant(-1)
  ROOT r = (f32[4], s32[4]) reduce-window(a, idx, ninf, zero), window={{size=2 stride=2 pad=1_1}}, to_apply=argmax
}}
"
    );
    // Windows [pad 3] [1 4] [1 5] [9 pad].
    let r = run1(t, vec![arr(&[6], &[3.0f32, 1.0, 4.0, 1.0, 5.0, 9.0])]);
    assert_eq!(tuple_vals::<f32>(&r, 0), vec![3.0, 4.0, 5.0, 9.0]);
    assert_eq!(tuple_vals::<i32>(&r, 1), vec![0, 2, 4, 5]);
}

#[test]
fn dot_general() {
    let t = "HloModule m\nENTRY e {\n  a = f32[2,3] parameter(0)\n  b = f32[3,2] parameter(1)\n  ROOT r = f32[2,2] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n";
    let r = run1(t, vec![ramp(&[2, 3], 0.0), ramp(&[3, 2], 0.0)]);
    assert_eq!(vals::<f32>(&r), vec![10., 13., 28., 40.]);
    // Batch dim 0; lhs contracts dim 1, rhs contracts dim 2 → out [batch, lhs free, rhs free].
    let t = "HloModule m\nENTRY e {\n  a = f32[2,3,1] parameter(0)\n  b = f32[2,2,3] parameter(1)\n  ROOT r = f32[2,1,2] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={1}, rhs_contracting_dims={2}\n}\n";
    let r = run1(t, vec![ramp(&[2, 3, 1], 0.0), ramp(&[2, 2, 3], 0.0)]);
    // batch 0: a=[0,1,2], b rows [0,1,2],[3,4,5] → 5, 14; batch 1: a=[3,4,5], rows [6,7,8],[9,10,11] → 86, 122.
    assert_eq!(vals::<f32>(&r), vec![5., 14., 86., 122.]);
    let t = "HloModule m\nENTRY e {\n  a = s8[1,2] parameter(0)\n  b = s8[2,1] parameter(1)\n  ROOT r = s8[1,1] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n";
    let r = run1(t, vec![arr(&[1, 2], &[100i8, 100]), arr(&[2, 1], &[2i8, 1])]);
    assert_eq!(vals::<i8>(&r), vec![(300i32 as i8)]);
    let t = "HloModule m\nENTRY e {\n  a = bf16[1,3] parameter(0)\n  b = bf16[3,1] parameter(1)\n  ROOT r = bf16[1,1] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n";
    let a: Vec<bf16> = [256.0f32, 1.0, 1.0].iter().map(|&v| bf16::from_f32(v)).collect();
    let b: Vec<bf16> = [1.0f32, 1.0, 1.0].iter().map(|&v| bf16::from_f32(v)).collect();
    // f32 accumulation: 258, exactly representable in bf16.
    assert_eq!(vals::<bf16>(&run1(t, vec![arr(&[1, 3], &a), arr(&[3, 1], &b)])), vec![bf16::from_f32(258.0)]);
}

#[test]
fn call_tuple_and_passthrough() {
    let t = "HloModule m\nsq {\n  x = f32[2] parameter(0)\n  ROOT y = f32[2] multiply(x, x)\n}\nENTRY e {\n  a = f32[2] parameter(0)\n  c = f32[2] call(a), to_apply=sq\n  t = (f32[2], f32[2]) tuple(a, c)\n  b = (f32[2], f32[2]) opt-barrier(t)\n  g = f32[2] get-tuple-element(b), index=1\n  ROOT r = f32[2] copy(g)\n}\n";
    assert_eq!(vals::<f32>(&run1(t, vec![arr(&[2], &[3.0f32, -2.0])])), vec![9., 4.]);
}

#[test]
fn replica_and_partition_ids() {
    let t = "HloModule m\nENTRY e {\n  r = u32[] replica-id()\n  p = u32[] partition-id()\n  ROOT t = (u32[], u32[]) tuple(r, p)\n}\n";
    let out = run_same(t, 3, runs::Mode::Replica, vec![]);
    assert_eq!((tuple_vals::<u32>(&out[2], 0), tuple_vals::<u32>(&out[2], 1)), (vec![2], vec![0]));
    let out = run_same(t, 3, runs::Mode::Partition, vec![]);
    assert_eq!((tuple_vals::<u32>(&out[2], 0), tuple_vals::<u32>(&out[2], 1)), (vec![0], vec![2]));
}
