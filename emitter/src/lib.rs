//! Collective emitter: turns a verified HLO module into one thunk program per device
//! and decides, per collective, between Peerless's peer-access kernels and a fallback.
//!
//! This crate is filled by the emitter issue; today it only exposes the dtype guard,
//! the first rule every decision starts from.

use hlo::PrimitiveType;

/// Element types Peerless's own collective kernels accept. F8 variants, s4/u4 and
/// complex types always go to the fallback. Callers pass the *operand's* element type
/// (an `all-gather-start` result is a tuple, so its result shape says nothing).
pub fn kernel_accepts_dtype(ty: PrimitiveType) -> bool {
    ty.is_computable()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_guard_rejects_f8_and_int4() {
        assert!(kernel_accepts_dtype(PrimitiveType::Bf16));
        assert!(kernel_accepts_dtype(PrimitiveType::Pred));
        for t in [PrimitiveType::F8E4M3FN, PrimitiveType::F8E5M2, PrimitiveType::S4, PrimitiveType::U4] {
            assert!(!kernel_accepts_dtype(t), "{t}");
        }
    }
}
