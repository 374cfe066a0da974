//! Which element types the kernels take.

use emitter::kernel_accepts_dtype;
use hlo::PrimitiveType;

#[test]
fn dtype_guard_rejects_f8_and_int4() {
    assert!(kernel_accepts_dtype(PrimitiveType::Bf16));
    assert!(kernel_accepts_dtype(PrimitiveType::Pred));
    for t in [PrimitiveType::F8E4M3FN, PrimitiveType::F8E5M2, PrimitiveType::S4, PrimitiveType::U4] {
        assert!(!kernel_accepts_dtype(t), "{t}");
    }
    assert!(!kernel_accepts_dtype(PrimitiveType::C64));
}
