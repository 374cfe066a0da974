//! The PJRT C API implemented in Rust. A thin `cdylib` on top will export
//! `GetPjrtApi`; all logic lives here so it is unit-testable. Filled by the plugin issue.

/// The platform name JAX sees (`JAX_PLATFORMS=peerless`).
pub const PLATFORM_NAME: &str = "peerless";

/// Re-exported so the plugin and the CLI agree on the IR version.
pub use hlo;
