//! `libpeerless_pjrt.so` as a wrapper of XLA's own PJRT plugin (issue 14, first slice).
//!
//! With `PEERLESS_XLA_PLUGIN=/path/to/xla_plugin.so` set, `GetPjrtApi` loads that plugin,
//! registers Peerless's typed-FFI handlers in its FFI registry (process-global inside the
//! plugin's copy of XLA) and returns the plugin's own function table, unchanged: every slot,
//! the version and the struct sizes are XLA's. The collective pass is registered by the
//! Python package through the plugin's XlaTransform extension
//! (`jax.extend.xla.register_hlo_module_transformation`, which finds the extension on the
//! table), so JAX lowers for the inner platform and XLA compiles, partitions and runs
//! everything; Peerless takes the collectives it rewrote.
//!
//! Without the variable, the standalone plugin answers as before. A plugin that cannot be
//! loaded or registered with is not silently replaced by it: the standalone table is
//! returned, and its `PJRT_Client_Create` fails with [`load_error`], naming the path and
//! the reason.
//!
//! Not yet here: registration from Rust at client creation (the pass for HLO files run
//! through the CLI), the inner plugin found without the variable, create options
//! (`PEERLESS_HOST_DEVICES`) passed to the inner client.

use std::path::PathBuf;
use std::sync::OnceLock;

use ffi::pjrt::InnerPlugin;
use thunks::custom_call::TARGETS;

/// The environment variable naming the inner plugin.
pub const ENV_VAR: &str = "PEERLESS_XLA_PLUGIN";

static INNER: OnceLock<Option<Result<InnerPlugin, String>>> = OnceLock::new();

/// The Peerless platform whose handlers the inner plugin gets: "cuda" for XLA's CUDA plugin
/// (`PEERLESS_XLA_PLATFORM`, else the file name), "cpu" otherwise.
fn platform_of(path: &std::path::Path) -> &'static str {
    match std::env::var("PEERLESS_XLA_PLATFORM").as_deref() {
        Ok("cuda") => "cuda",
        Ok(_) => "cpu",
        Err(_) if path.file_name().is_some_and(|n| n.to_string_lossy().contains("cuda")) => "cuda",
        Err(_) => "cpu",
    }
}

fn load(path: PathBuf) -> Result<InnerPlugin, String> {
    let inner = InnerPlugin::load(&path)?;
    let platform = platform_of(&path);
    // XLA's FFI platform names, and the handlers' traits (CUDA: command-buffer compatible).
    let (xla_platform, traits) = if platform == "cuda" { ("CUDA", 1) } else { ("Host", 0) };
    for &(_, target) in TARGETS.iter() {
        let Some(h) = crate::xla_handlers::handler(platform, target) else {
            return Err(format!("Peerless has no {platform} handler for {target}"));
        };
        // SAFETY: `h` is one of this library's typed FFI handlers (`xla_handlers`), a plain
        // function valid for the process.
        unsafe { inner.register_ffi_handler(target, h as *const std::ffi::c_void, xla_platform, traits) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    log::info!(
        "peerless: wrapping {} (PJRT {}.{}, {} extensions); handlers registered for {xla_platform}",
        path.display(),
        inner.version().0,
        inner.version().1,
        inner.extensions().len()
    );
    Ok(inner)
}

fn inner() -> Option<&'static Result<InnerPlugin, String>> {
    INNER
        .get_or_init(|| {
            let path = std::env::var_os(ENV_VAR).filter(|p| !p.is_empty())?;
            let path = PathBuf::from(path);
            Some(
                std::panic::catch_unwind(|| load(path.clone()))
                    .unwrap_or_else(|_| Err(format!("{}: loading panicked", path.display()))),
            )
        })
        .as_ref()
}

/// The inner plugin's table when `PEERLESS_XLA_PLUGIN` names one that loaded.
pub fn api() -> Option<*const std::ffi::c_void> {
    match inner()? {
        Ok(p) => Some(p.api()),
        Err(_) => None,
    }
}

/// Why the inner plugin named by `PEERLESS_XLA_PLUGIN` could not be used, if it could not.
pub fn load_error() -> Option<String> {
    match inner()? {
        Ok(_) => None,
        Err(e) => Some(format!("peerless: {ENV_VAR} names an XLA plugin that cannot be wrapped: {e}")),
    }
}
