use super::*;

#[test]
fn norm_describes_the_epilogue_as_the_kernel_reads_it() {
    // `struct Norm` of collectives.cu: six u64, ten u32.
    assert_eq!(std::mem::size_of::<Norm>(), 88);
    let e = Epilogue {
        round_ar: Some(RoundTo::Bf16),
        norm_of_rounded: false,
        mean: Mean::Divide(4096f32.to_bits()),
        eps: 1e-6f32.to_bits(),
        gamma: true,
    };
    let n = Norm::new(&e, 8, 4096, (1, Dtype::Bf16), Some((2, Dtype::F32)), (3, Dtype::Bf16), (4, Dtype::F16)).unwrap();
    assert_eq!((n.residual, n.gamma, n.h, n.y, n.rows, n.d), (1, 2, 3, 4, 8, 4096));
    assert_eq!((n.x_ty, n.g_ty, n.h_ty, n.y_ty, n.round_ar, n.of_rounded), (1, 0, 1, 2, 1, 0));
    assert_eq!((n.mean_div, n.mean, n.eps), (1, 4096f32.to_bits(), 1e-6f32.to_bits()));
    // Gamma must match the epilogue; only float arrays.
    assert!(Norm::new(&e, 8, 4096, (1, Dtype::Bf16), None, (3, Dtype::Bf16), (4, Dtype::F16)).is_err());
    let s32 = Norm::new(&e, 8, 4096, (1, Dtype::S32), Some((2, Dtype::F32)), (3, Dtype::Bf16), (4, Dtype::F16));
    assert!(s32.is_err());
}
