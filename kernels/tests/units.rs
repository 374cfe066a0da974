//! `kernels::gpu`'s compilation units: every kernel has one unit, the sources instantiate what
//! the units select, and each unit has its own stable key.

use kernels::gpu::{Dtype, Kernel, Red, Unit};

#[test]
fn every_kernel_the_launchers_name_has_one_unit() {
    let all = Unit::all();
    // Base; five kernels per (type, reduction: one-shot, one-shot many, two-shot, reduce-scatter,
    // the copy engines' local fold); the fused norms; Lamport for the 4 float types x 4
    // reductions; the Lamport fused norms.
    assert_eq!(all.len(), 1 + 5 * (4 * 4 + 9 * 6) + 3 + 4 * 4 + 3);
    for u in &all {
        for k in u.kernels() {
            assert_eq!(Unit::of_kernel(&k), Some(*u), "{k}");
        }
    }
    assert_eq!(
        Unit::of_kernel("pl_one_shot_many_bf16_max"),
        Some(Unit::Spec(Kernel::OneShotMany, Dtype::Bf16, Red::Max))
    );
    assert_eq!(
        Unit::of_kernel("pl_reduce_scatter_pred_sum"),
        Some(Unit::Spec(Kernel::ReduceScatter, Dtype::Pred, Red::Sum))
    );
    assert_eq!(Unit::Spec(Kernel::OneShot, Dtype::U16, Red::Or).name(), "one_shot_u16_or");
    assert_eq!(Unit::of_kernel("pl_probe"), Some(Unit::Base));
    assert_eq!(Unit::of_kernel("pl_one_shot_f32_and"), None);
    assert_eq!(
        Unit::of_kernel("pl_one_shot_norm_bf16_sum"),
        Some(Unit::Spec(Kernel::OneShotNorm, Dtype::Bf16, Red::Sum))
    );
    assert_eq!(Unit::of_kernel("pl_one_shot_norm_f32_max"), None);
    assert_eq!(Unit::of_kernel("pl_one_shot_norm_s32_sum"), None);
    assert_eq!(Unit::of_kernel("pl_lamport_f16_min"), Some(Unit::Spec(Kernel::Lamport, Dtype::F16, Red::Min)));
    assert_eq!(Unit::of_kernel("pl_lamport_s32_sum"), None);
    assert_eq!(Unit::of_kernel("pl_nothing"), None);
}

#[test]
fn the_sources_instantiate_what_the_units_select() {
    // The full list in collectives.cu is the same set as `Unit::all()`.
    let src = include_str!("../cuda/collectives.cu");
    let mut listed = 0;
    let mut lamports = 0;
    let mut norms = Vec::new();
    for line in src.lines() {
        let l = line.trim();
        let list = l.strip_prefix("PL_AR_FLOAT(").or_else(|| l.strip_prefix("PL_AR_INT("));
        if let Some(rest) = list {
            let t = rest.split(',').next().unwrap_or_default();
            // Floats: 4 reductions, and a Lamport kernel each (counted below).
            listed += if l.starts_with("PL_AR_INT") { 6 } else { 4 };
            lamports += if l.starts_with("PL_AR_FLOAT") { 4 } else { 0 };
            assert!(Dtype::ALL.iter().any(|d| d.name() == t), "{l}");
        } else if l.starts_with("PL_AR(pred_") {
            listed += 1;
        } else if l.starts_with("PL_LAMPORT_NORM(") {
            lamports += 1;
        } else if let Some(rest) = l.strip_prefix("PL_ONE_SHOT_NORM(") {
            let (name, t) = (rest.split(',').next().unwrap_or_default(), rest.split(", ").nth(1).unwrap_or_default());
            norms.push((name.to_string(), t.to_string()));
        }
    }
    assert_eq!(5 * listed + norms.len() + lamports, Unit::all().len() - 1);
    for (name, _) in &norms {
        let k = format!("pl_one_shot_norm_{name}");
        assert!(matches!(Unit::of_kernel(&k), Some(Unit::Spec(Kernel::OneShotNorm, ..))), "{k}");
    }
    let (_, text, _) = Unit::Spec(Kernel::OneShotNorm, Dtype::Bf16, Red::Sum).source();
    assert!(text.starts_with("#define PL_UNIT_SPEC PL_ONE_SHOT_NORM(bf16_sum, bf16, Sum)\n"));
    let (_, text, _) = Unit::Spec(Kernel::TwoShot, Dtype::Pred, Red::Max).source();
    assert!(text.starts_with("#define PL_UNIT_SPEC PL_TWO_SHOT(pred_max, u8, Or)\n#define PL_BLOCKS "));
    for k in Kernel::ALL {
        assert!(src.contains(&format!("#define {}(NAME, T, R)", k.macro_name())), "{k:?}");
    }
}

#[test]
fn keys_differ_per_unit_and_are_stable_within_a_build() {
    let keys: std::collections::HashSet<String> = Unit::all().iter().map(|u| u.key()).collect();
    assert_eq!(keys.len(), Unit::all().len());
    assert_eq!(Unit::Base.key(), Unit::Base.key());
    assert_eq!(Unit::Base.key().len(), 16);
}
