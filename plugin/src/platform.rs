//! The platforms Peerless runs on inside XLA. A platform's name enters as a string only at the library's edges (the C
//! exports the Python package calls, the wrapped plugin's file name or `PEERLESS_XLA_PLATFORM`, the CLI's plugin path),
//! where [`Platform::parse`] reads it once and an unknown name is an error naming it; everything inside takes a
//! [`Platform`].

use std::fmt;

/// A platform with Peerless handlers: XLA:CPU, CUDA, or ROCm. ROCm's handlers need the cargo feature `rocm`: without it
/// the platform is known by name (a ROCm plugin is recognised and refused with the reason) but
/// [`Platform::with_handlers`] refuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Platform {
    Cpu,
    Cuda,
    Rocm,
}

impl Platform {
    /// Every platform, in [`Platform::index`] order.
    pub const ALL: [Platform; 3] = [Platform::Cpu, Platform::Cuda, Platform::Rocm];

    /// The platform JAX and the Python package call `name` ("cpu", "cuda", "rocm"); an unknown name is an error naming
    /// it.
    pub fn parse(name: &str) -> Result<Platform, String> {
        Platform::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| format!("Peerless has no handlers for platform '{name}'"))
    }

    /// The name JAX gives the platform ("cpu", "cuda", "rocm").
    pub fn name(self) -> &'static str {
        match self {
            Platform::Cpu => "cpu",
            Platform::Cuda => "cuda",
            Platform::Rocm => "rocm",
        }
    }

    /// XLA's name of the platform ("Host", "CUDA", "ROCM"), as XLA's FFI registry and JAX's `register_ffi_target` take
    /// it.
    pub fn xla_name(self) -> &'static str {
        match self {
            Platform::Cpu => "Host",
            Platform::Cuda => "CUDA",
            Platform::Rocm => "ROCM",
        }
    }

    /// A position in [`Platform::ALL`], for per-platform tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether the platform's devices are GPUs (the generic GPU runtime's).
    pub fn is_gpu(self) -> bool {
        self != Platform::Cpu
    }

    /// Whether this library has the platform's handlers (ROCm: built with the feature `rocm`).
    pub fn has_handlers(self) -> bool {
        self != Platform::Rocm || cfg!(feature = "rocm")
    }

    /// The platform, if this library has its handlers; else why not.
    pub fn with_handlers(self) -> Result<Platform, String> {
        if self.has_handlers() {
            Ok(self)
        } else {
            Err(format!(
                "Peerless has no handlers for platform '{self}': this library was built without the cargo feature \
                 `rocm` (cargo build -p peerless-pjrt --features rocm)"
            ))
        }
    }

    /// The device kind XLA gives every device of the platform, where it is one fixed name (XLA:CPU's "cpu"); a GPU's
    /// kind is its model, which XLA knows and hands over.
    pub fn fixed_device_kind(self) -> Option<&'static str> {
        (self == Platform::Cpu).then_some("cpu")
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
