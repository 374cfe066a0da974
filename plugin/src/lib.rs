//! The PJRT C API (version 0.54, the header `pjrt-sys` ships) implemented in Rust over the
//! Peerless host backend. The `peerless-pjrt` cdylib (plugin/so) exports [`api`] as
//! `GetPjrtApi`; all logic lives here so it is unit-testable through the function table.
//!
//! Module map: [`boundary`] (the one shape of every entry point: struct_size check,
//! catch_unwind, errors), [`error`], [`runtime`] (client, devices, buffers, events,
//! compile/execute), [`mlir`] (the registered MLIR → HLO converter), [`api`] (entry points
//! and the table).

pub mod api;
pub mod boundary;
pub mod error;
pub mod mlir;
pub mod runtime;
pub mod wrap;
pub mod xla_bench;
pub mod xla_handlers;
pub mod xla_inside;
pub mod xla_run;
pub mod xla_tune;

use std::sync::OnceLock;

/// Re-exported so the plugin and the CLI agree on the IR version.
pub use hlo;
pub use pjrt_sys;

/// The platform name JAX sees (`JAX_PLATFORMS=peerless`).
pub const PLATFORM_NAME: &str = "peerless";
/// The platform version reported by the topology.
pub const PLATFORM_VERSION: &str = concat!("peerless ", env!("CARGO_PKG_VERSION"));

static TABLE: OnceLock<api::Table> = OnceLock::new();

/// Installs the library's logger once (stderr; `PEERLESS_LOG` takes env_logger's filter
/// syntax, default `warn` plus the kernel-compile lines, which say why a first call waits).
/// A host that installed a logger first (the CLI) keeps its own.
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let env = env_logger::Env::new().filter_or("PEERLESS_LOG", "warn,peerless::compile=info");
        let _ = env_logger::Builder::from_env(env).try_init();
    });
}

/// The function table (`GetPjrtApi`'s result). Never null; lives for the process.
pub fn api() -> *const pjrt_sys::PJRT_Api {
    &TABLE.get_or_init(api::table).api
}
