//! Peerless inside XLA, as a library: the wrapper of XLA's own PJRT plugin ([`wrap`], the `GetPjrtApi` of the
//! `peerless-pjrt` cdylib in plugin/so), the collective pass's entry points ([`xla_inside`]) and the FFI handlers'
//! registration ([`xla_handlers`]): what JAX and XLA load. All logic lives here; plugin/so only re-exports it as C
//! symbols. Running HLO files, benchmarks and the tune through XLA is the CLI's (`peerless-tools`).

pub mod platform;
pub mod wrap;
pub mod xla_handlers;
pub mod xla_inside;

pub use platform::Platform;

/// Re-exported so the plugin and the CLI agree on the IR version.
pub use hlo;
pub use pjrt_sys;

/// Installs the library's logger once (stderr; `PEERLESS_LOG` takes env_logger's filter syntax, default `warn` plus the
/// kernel-compile lines, which say why a first call waits). A host that installed a logger first (the CLI) keeps its
/// own.
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let env = env_logger::Env::new().filter_or("PEERLESS_LOG", "warn,peerless::compile=info");
        let _ = env_logger::Builder::from_env(env).try_init();
    });
}

/// The function table (`GetPjrtApi`'s result): XLA's plugin wrapped, or a table that reports why there is none. Never
/// null; lives for the process.
pub fn api() -> *const pjrt_sys::PJRT_Api {
    wrap::api().cast()
}
