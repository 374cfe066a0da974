//! Compilation units of the kernel sources: what one NVRTC or hipRTC program builds. The whole set took NVRTC about 150
//! s on an H100 host, so a unit is the kernels of no element type ([`Unit::Base`]) or one reduction specialization
//! ([`Unit::Spec`]; the fused all-reduce + RMSNorm, [`Kernel::OneShotNorm`], is its own per float type), and a process
//! compiles only what it launches. `collectives.cu` selects a unit with `PL_UNIT_BASE` / `PL_UNIT_SPEC`; with neither
//! it instantiates everything (what `hipcc` checks in CI). A unit's [`key`] hashes the sources, the launch constants
//! and the unit, so a stored code object made from other sources is never loaded.

use std::collections::HashMap;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::{BLOCKS, Dtype, Red, SOURCES};

/// One compilation unit (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    Base,
    Spec(Kernel, Dtype, Red),
}

/// Declares [`Kernel`], [`Kernel::ALL`] and each kernel's name prefix from one list.
macro_rules! kernels {
    ($($(#[$doc:meta])* $k:ident => $prefix:literal,)*) => {
        /// The kernels every reduction specialization has.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Kernel { $($(#[$doc])* $k),* }

        impl Kernel {
            pub const ALL: [Kernel; [$(Kernel::$k),*].len()] = [$(Kernel::$k),*];

            /// The kernel's name before the specialization (`pl_two_shot_` + `f32_sum`).
            fn prefix(self) -> &'static str {
                match self { $(Kernel::$k => $prefix),* }
            }
        }
    };
}
kernels! {
    OneShot => "pl_one_shot_",
    OneShotMany => "pl_one_shot_many_",
    TwoShot => "pl_two_shot_",
    ReduceScatter => "pl_reduce_scatter_",
    /// The copy-engine reduce-scatter's and all-reduce's local reduction (no flags, local reads).
    ReduceLocal => "pl_reduce_local_",
    /// The one-shot all-reduce fused with the residual add and RMSNorm after it (f32, bf16, f16; sum).
    OneShotNorm => "pl_one_shot_norm_",
    /// The one-shot all-reduce through Lamport regions (float types: their sentinel is a NaN).
    Lamport => "pl_lamport_",
    /// [`Kernel::OneShotNorm`] through the Lamport regions.
    LamportNorm => "pl_lamport_norm_",
}

impl Kernel {
    /// Whether the sources define this kernel for `t` and `r`.
    pub fn defined_for(self, t: Dtype, r: Red) -> bool {
        match self {
            Kernel::OneShotNorm | Kernel::LamportNorm => {
                r == Red::Sum && matches!(t, Dtype::F32 | Dtype::Bf16 | Dtype::F16)
            }
            Kernel::Lamport => super::args::red_defined_for(r, t) && t.is_float(),
            _ => super::args::red_defined_for(r, t),
        }
    }

    /// Its kernel for `t` under `r` (`pl_two_shot_f32_sum`).
    pub fn name(self, t: Dtype, r: Red) -> String {
        format!("{}{}_{}", self.prefix(), t.name(), r.name())
    }

    /// The macro of `collectives.cu` that instantiates it: the prefix in capitals (`PL_TWO_SHOT`).
    pub fn macro_name(self) -> String {
        self.prefix().trim_end_matches('_').to_uppercase()
    }
}

/// The kernels of [`Unit::Base`].
const BASE_KERNELS: [&str; 3] = ["pl_all_gather", "pl_exchange", "pl_probe"];

impl Unit {
    /// Every unit the sources define, base first.
    pub fn all() -> Vec<Unit> {
        let mut v = vec![Unit::Base];
        for t in Dtype::ALL {
            for r in Red::ALL {
                v.extend(Kernel::ALL.iter().filter(|k| k.defined_for(t, r)).map(|&k| Unit::Spec(k, t, r)));
            }
        }
        v
    }

    /// `base`, or the kernel's name without `pl_` (`two_shot_f32_sum`): names cache files and bundle entries.
    pub fn name(self) -> String {
        match self {
            Unit::Base => "base".into(),
            Unit::Spec(k, t, r) => k.name(t, r)["pl_".len()..].into(),
        }
    }

    /// The unit that defines kernel `name`. Looked up on every launch, so the name table is built once per process.
    pub fn of_kernel(name: &str) -> Option<Unit> {
        static BY_NAME: OnceLock<HashMap<String, Unit>> = OnceLock::new();
        BY_NAME
            .get_or_init(|| {
                Unit::all().into_iter().flat_map(|u| u.kernels().into_iter().map(move |k| (k, u))).collect()
            })
            .get(name)
            .copied()
    }

    /// The kernels the unit defines.
    pub fn kernels(self) -> Vec<String> {
        match self {
            Unit::Base => BASE_KERNELS.iter().map(|k| k.to_string()).collect(),
            Unit::Spec(k, t, r) => vec![k.name(t, r)],
        }
    }

    /// The defines that select this unit, ahead of the launch constants and the source.
    fn defines(self) -> String {
        match self {
            Unit::Base => "#define PL_UNIT_BASE 1\n".into(),
            Unit::Spec(k, t, r) => format!(
                "#define PL_UNIT_SPEC {}({}_{}, {}, {})\n",
                k.macro_name(),
                t.name(),
                r.name(),
                t.c_type(),
                c_op(r, t)
            ),
        }
    }

    /// The unit's translation unit (`collectives.cu` with the defines prepended) and the headers it includes: what
    /// either runtime compiler takes.
    pub fn source(self) -> (&'static str, String, Vec<(&'static str, &'static str)>) {
        let (units, headers) = super::translation_units();
        let (name, text) = units.into_iter().next().unwrap_or(("collectives.cu", String::new()));
        (name, format!("{}{text}", self.defines()), headers)
    }

    /// Names stored code of this unit: a hash of every source file, the launch constants and the unit, hex (16 digits).
    pub fn key(self) -> String {
        let mut h = Sha256::new();
        for (name, text) in SOURCES {
            h.update(name.as_bytes());
            h.update([0]);
            h.update(text.as_bytes());
            h.update([0]);
        }
        h.update(BLOCKS.to_le_bytes());
        h.update(self.defines().as_bytes());
        h.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl Dtype {
    /// The element type in the kernel sources (`peerless_types.h`); pred is a byte.
    fn c_type(self) -> &'static str {
        match self {
            Dtype::F32 => "float",
            Dtype::F64 => "double",
            Dtype::Pred => "u8",
            t => t.name(),
        }
    }
}

/// Reduction `red`'s functor in the kernel sources. On pred (0 or 1), XLA's max is or, min and prod are and, and sum is
/// xor (pred add).
fn c_op(red: Red, t: Dtype) -> &'static str {
    match (t, red) {
        (Dtype::Pred, Red::Max | Red::Or) => "Or",
        (Dtype::Pred, Red::Min | Red::Prod | Red::And) => "And",
        (Dtype::Pred, Red::Sum) => "Xor",
        (_, Red::Sum) => "Sum",
        (_, Red::Prod) => "Prod",
        (_, Red::Min) => "Min",
        (_, Red::Max) => "Max",
        (_, Red::And) => "And",
        (_, Red::Or) => "Or",
    }
}
