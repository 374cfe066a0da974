//! `libpeerless_pjrt.so` as a wrapper of XLA's own PJRT plugin (`PEERLESS_XLA_PLUGIN`, else found where the Python
//! package finds it): `GetPjrtApi` registers Peerless's FFI handlers in the plugin and returns a copy of its table with
//! five slots replaced (`PJRT_Client_Create` registers the pass, `PJRT_Client_Compile` takes Peerless's per-compile
//! options, the three `PJRT_Error` slots answer for the errors those raise). With no plugin to wrap every entry point
//! fails with [`load_error`]'s message, naming what to install. ARCHITECTURE.md ("plugin") and docs/PLUGIN.md have the
//! details.

use std::collections::BTreeSet;
use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use ffi::pjrt::{
    ClientCompileArgs, Entry, ErrorDestroyArgs, ErrorForEachPayloadArgs, ErrorGetCodeArgs, ErrorMessageArgs,
    InnerPlugin, KNOWN_MINOR, SLOT_CLIENT_COMPILE, SLOT_CLIENT_CREATE, SLOT_ERROR_DESTROY, SLOT_ERROR_FOR_EACH_PAYLOAD,
    SLOT_ERROR_GET_CODE, SLOT_ERROR_MESSAGE,
};
use hlo::wire::compile_options::ENV_OPTION_OVERRIDES;
use pjrt_sys::protos::xla;

use crate::Platform;

/// The environment variable naming the inner plugin.
pub const ENV_VAR: &str = "PEERLESS_XLA_PLUGIN";

/// The inner plugin and the table handed out for it.
struct Wrapped {
    plugin: InnerPlugin,
    table: *const c_void,
    own_errors: bool,
    /// The Peerless platform of the inner plugin's devices.
    platform: Platform,
}

// SAFETY: the table is a leaked, never-written copy; `InnerPlugin` is Send + Sync.
unsafe impl Send for Wrapped {}
// SAFETY: as above.
unsafe impl Sync for Wrapped {}

static INNER: OnceLock<Result<Wrapped, String>> = OnceLock::new();

/// The Peerless platform whose handlers the inner plugin gets: CUDA for XLA's CUDA plugin, ROCm for XLA's ROCm plugin
/// (`xla_rocm_plugin.so`; its handlers need a library built with the cargo feature `rocm`), by `PEERLESS_XLA_PLATFORM`
/// ("cuda", "rocm"), else the file name; XLA:CPU otherwise.
pub fn platform_of(path: &std::path::Path) -> Platform {
    let named = |what: &str| path.file_name().is_some_and(|n| n.to_string_lossy().contains(what));
    match std::env::var("PEERLESS_XLA_PLATFORM").as_deref() {
        Ok("cuda") => Platform::Cuda,
        Ok("rocm") => Platform::Rocm,
        Ok(_) => Platform::Cpu,
        Err(_) if named("cuda") => Platform::Cuda,
        Err(_) if named("rocm") => Platform::Rocm,
        Err(_) => Platform::Cpu,
    }
}

fn load(path: PathBuf) -> Result<Wrapped, String> {
    let inner = InnerPlugin::load(&path)?;
    let platform = platform_of(&path);
    // The PJRT FFI extension registers an execute-only handler. Where JAX can reach the plugin's GPU extension (JAX's
    // own CUDA plugin package, the same library), the Python package registers the whole bundle instead (instantiate /
    // initialize / execute: state freed with the executable, set up outside command-buffer capture) and says so here.
    let by_python = std::env::var("PEERLESS_XLA_HANDLERS").as_deref() == Ok("python");
    let xla_platform =
        if by_python { platform.xla_name() } else { crate::xla_handlers::register_in(&inner, platform)? };
    log::info!(
        "peerless: wrapping {} (PJRT {}.{}, {} extensions); handlers for {xla_platform} registered by {}",
        path.display(),
        inner.version().0,
        inner.version().1,
        inner.extensions().len(),
        if by_python { "the Python package" } else { "the FFI extension" }
    );
    let mut patches = vec![
        (SLOT_ERROR_DESTROY, error_destroy as *const c_void),
        (SLOT_ERROR_MESSAGE, error_message as *const c_void),
        (SLOT_ERROR_GET_CODE, error_get_code as *const c_void),
        (SLOT_CLIENT_CREATE, client_create as *const c_void),
        (SLOT_CLIENT_COMPILE, client_compile as *const c_void),
    ];
    if inner.has_slot(SLOT_ERROR_FOR_EACH_PAYLOAD) {
        patches.push((SLOT_ERROR_FOR_EACH_PAYLOAD, error_for_each_payload as *const c_void));
    }
    // A newer plugin may read errors through slots this build does not know; then a bad Peerless option is reported by
    // XLA itself (see `client_compile`), never by an error object of ours.
    let own_errors = inner.version().0 == 0 && inner.version().1 <= KNOWN_MINOR;
    let table = inner.patched_table(&patches)?;
    Ok(Wrapped { plugin: inner, table, own_errors, platform })
}

/// Where XLA's plugin lies when nothing names it: beside this library, where pip installs the plugins
/// (`jax_plugins/xla_cuda13/`, `jax_plugins/xla_rocm7/`, `lammps_jax_pjrt_cpu/`), in the Python package's order; a GPU
/// plugin only where such a GPU is usable (or `PEERLESS_BACKEND` names it).
fn discover() -> Result<PathBuf, String> {
    let own = ffi::libs::own_path().ok_or("cannot tell where libpeerless_pjrt.so lies")?;
    let dir = own.parent().unwrap_or(std::path::Path::new("."));
    let installed = dir.ends_with("jax_plugins/peerless");
    let site = dir.parent().and_then(std::path::Path::parent).filter(|_| installed);
    if let Some(site) = site {
        let backend = std::env::var("PEERLESS_BACKEND").unwrap_or_default();
        if !matches!(backend.as_str(), "host" | "cpu" | "rocm")
            && (backend == "cuda" || ffi::cuda::device_count().unwrap_or(0) > 0)
        {
            for pkg in ["xla_cuda13", "xla_cuda12"] {
                let p = site.join("jax_plugins").join(pkg).join("xla_cuda_plugin.so");
                if p.is_file() {
                    return Ok(p);
                }
            }
        }
        if matches!(backend.as_str(), "" | "rocm") && (backend == "rocm" || amd_gpus_present()) {
            let p = site.join("jax_plugins").join("xla_rocm7").join("xla_rocm_plugin.so");
            if p.is_file() {
                return Ok(p);
            }
        }
        let cpu = site.join("lammps_jax_pjrt_cpu").join("pjrt_c_api_cpu_plugin.so");
        if cpu.is_file() {
            return Ok(cpu);
        }
    }
    Err(format!(
        "no XLA PJRT plugin to wrap{}: Peerless runs inside XLA's own plugin. Install jax[cuda13] (GPUs) or \
         `pip install --no-deps lammps-jax-pjrt-cpu==0.11.2` (XLA's CPU plugin), or name one with \
         {ENV_VAR}=/path/to/plugin.so (the standalone platform was retired)",
        if installed { format!(" beside {}", own.display()) } else { String::new() }
    ))
}

/// Whether the machine has an AMD GPU, as JAX's ROCm plugin tells (a KFD topology node with a non-zero `gpu_id`),
/// without initialising HIP in this process (JAX avoids that too).
fn amd_gpus_present() -> bool {
    let Ok(nodes) = std::fs::read_dir("/sys/class/kfd/kfd/topology/nodes") else { return false };
    nodes.flatten().any(|n| {
        std::fs::read_to_string(n.path().join("gpu_id")).is_ok_and(|id| id.trim().parse::<u64>().is_ok_and(|v| v != 0))
    })
}

/// Set by the Python package when it found no XLA plugin: the reason, which the table of errors reports (JAX loads the
/// library only to register the platform).
const UNAVAILABLE_VAR: &str = "PEERLESS_XLA_UNAVAILABLE";

fn inner() -> &'static Result<Wrapped, String> {
    INNER.get_or_init(|| {
        if let Some(why) = std::env::var(UNAVAILABLE_VAR).ok().filter(|w| !w.is_empty()) {
            return Err(why);
        }
        let named = std::env::var_os(ENV_VAR).filter(|p| !p.is_empty());
        let path = match named {
            Some(p) if p == "standalone" || p == "none" => {
                return Err(format!(
                    "{ENV_VAR}={} wraps no XLA plugin, and the standalone platform was retired: XLA's own plugin is \
                     the only runtime",
                    p.to_string_lossy()
                ));
            }
            Some(p) => PathBuf::from(p),
            None => discover()?,
        };
        std::panic::catch_unwind(|| load(path.clone()))
            .unwrap_or_else(|_| Err(format!("{}: loading panicked", path.display())))
            .map_err(|e| format!("peerless: cannot wrap XLA's plugin {}: {e}", path.display()))
    })
}

/// `GetPjrtApi`'s table: the inner plugin's, patched; else one whose every entry point fails with [`load_error`] (never
/// null, never a second runtime).
pub fn api() -> *const c_void {
    match inner() {
        Ok(w) => w.table,
        Err(_) => unavailable_table(),
    }
}

/// The loaded inner plugin, if there is one.
fn wrapped_opt() -> Option<&'static Wrapped> {
    INNER.get()?.as_ref().ok()
}

/// The loaded inner plugin (only reached through its patched table, so it loaded).
fn wrapped() -> &'static Wrapped {
    wrapped_opt().unwrap_or_else(|| unreachable!("a wrapper entry point ran without the inner plugin"))
}

fn plugin() -> &'static InnerPlugin {
    &wrapped().plugin
}

/// Why no XLA plugin can be wrapped, if none can.
pub fn load_error() -> Option<String> {
    inner().as_ref().err().cloned()
}

// ---- no plugin to wrap: a table of errors ------------------------------------------------

/// The table `GetPjrtApi` returns when no XLA plugin can be wrapped: plugin initialisation succeeds (so JAX registers
/// the platform and reports the reason when it creates a client), every other entry point returns [`load_error`] as a
/// FAILED_PRECONDITION error.
fn unavailable_table() -> *const c_void {
    static TABLE: OnceLock<usize> = OnceLock::new();
    *TABLE.get_or_init(|| {
        ffi::pjrt::uniform_table(
            ffi::pjrt::KNOWN_SLOTS,
            unavailable as *const c_void,
            &[
                (SLOT_ERROR_DESTROY, error_destroy as *const c_void),
                (SLOT_ERROR_MESSAGE, error_message as *const c_void),
                (SLOT_ERROR_GET_CODE, error_get_code as *const c_void),
                (SLOT_ERROR_FOR_EACH_PAYLOAD, error_for_each_payload as *const c_void),
                (ffi::pjrt::SLOT_PLUGIN_INITIALIZE, plugin_initialize as *const c_void),
                (ffi::pjrt::SLOT_PLUGIN_ATTRIBUTES, plugin_attributes as *const c_void),
            ],
        ) as usize
    }) as *const c_void
}

/// `PJRT_Error_Code_FAILED_PRECONDITION`.
const FAILED_PRECONDITION: pjrt_sys::PJRT_Error_Code = 9;

unsafe extern "C" fn unavailable(_args: *mut c_void) -> *mut c_void {
    let why = load_error().unwrap_or_else(|| "peerless: no XLA plugin".into());
    new_error(FAILED_PRECONDITION, why)
}

unsafe extern "C" fn plugin_initialize(_args: *mut c_void) -> *mut c_void {
    std::ptr::null_mut()
}

/// `PJRT_Plugin_Attributes_Args`: struct_size, extension_start, then the attributes and their count, which we set to
/// none.
#[repr(C)]
struct PluginAttributesArgs {
    struct_size: usize,
    extension_start: *mut c_void,
    attributes: *const c_void,
    num_attributes: usize,
}

unsafe extern "C" fn plugin_attributes(args: *mut PluginAttributesArgs) -> *mut c_void {
    if !args.is_null() {
        // SAFETY: PJRT passes a valid args struct of at least these fields.
        let a = unsafe { &mut *args };
        (a.attributes, a.num_attributes) = (std::ptr::null(), 0);
    }
    std::ptr::null_mut()
}

// ---- errors of our own ------------------------------------------------------------------

/// An error the wrapper raises (a bad Peerless compile option); the plugin's own errors are its own. Told apart by
/// address: ours are in [`OURS`] from creation to destruction.
struct WrapError {
    code: pjrt_sys::PJRT_Error_Code,
    message: String,
}

static OURS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

/// `PJRT_Error_Code_INVALID_ARGUMENT` / `_INTERNAL` (absl's codes).
const INVALID_ARGUMENT: pjrt_sys::PJRT_Error_Code = 3;
const INTERNAL: pjrt_sys::PJRT_Error_Code = 13;

fn new_error(code: pjrt_sys::PJRT_Error_Code, message: String) -> *mut c_void {
    let p = Box::into_raw(Box::new(WrapError { code, message }));
    OURS.lock().unwrap_or_else(|e| e.into_inner()).insert(p as usize);
    p.cast()
}

fn ours(error: *const c_void) -> Option<&'static WrapError> {
    let set = OURS.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: an address in `OURS` is a live `WrapError` box (removed before it is freed).
    set.contains(&(error as usize)).then(|| unsafe { &*error.cast::<WrapError>() })
}

unsafe extern "C" fn error_destroy(args: *mut ErrorDestroyArgs) {
    if args.is_null() {
        return;
    }
    let _ = catch_unwind(|| {
        // SAFETY: PJRT passes a valid args struct.
        let error = unsafe { (*args).error };
        if OURS.lock().unwrap_or_else(|e| e.into_inner()).remove(&(error as usize)) {
            // SAFETY: it was ours and is freed once (just taken out of the set).
            drop(unsafe { Box::from_raw(error.cast::<WrapError>()) });
            return;
        }
        let Some(w) = wrapped_opt() else { return };
        // SAFETY: the slot is `PJRT_Error_Destroy`, of the signature named.
        let f = unsafe { w.plugin.slot_fn::<unsafe extern "C" fn(*mut ErrorDestroyArgs)>(SLOT_ERROR_DESTROY) };
        if let Some(f) = f {
            // SAFETY: the plugin's own error, to its own destructor.
            unsafe { f(args) }
        }
    });
}

unsafe extern "C" fn error_message(args: *mut ErrorMessageArgs) {
    if args.is_null() {
        return;
    }
    let _ = catch_unwind(|| {
        // SAFETY: PJRT passes a valid args struct.
        let a = unsafe { &mut *args };
        if let Some(e) = ours(a.error.cast()) {
            (a.message, a.message_size) = (e.message.as_ptr().cast::<c_char>(), e.message.len());
            return;
        }
        let Some(w) = wrapped_opt() else { return };
        // SAFETY: the slot is `PJRT_Error_Message`, of the signature named.
        let f = unsafe { w.plugin.slot_fn::<unsafe extern "C" fn(*mut ErrorMessageArgs)>(SLOT_ERROR_MESSAGE) };
        if let Some(f) = f {
            // SAFETY: the plugin's own error, to its own accessor.
            unsafe { f(args) }
        }
    });
}

unsafe extern "C" fn error_get_code(args: *mut ErrorGetCodeArgs) -> *mut c_void {
    if args.is_null() {
        return new_error(INVALID_ARGUMENT, "peerless: PJRT_Error_GetCode with null args".into());
    }
    catch_unwind(|| {
        // SAFETY: PJRT passes a valid args struct.
        let a = unsafe { &mut *args };
        if let Some(e) = ours(a.error.cast()) {
            a.code = e.code;
            return std::ptr::null_mut();
        }
        let Some(w) = wrapped_opt() else {
            return new_error(INTERNAL, "peerless: an error of no plugin".into());
        };
        // SAFETY: the slot is `PJRT_Error_GetCode`; the plugin's own error.
        match unsafe { w.plugin.slot_fn::<Entry<ErrorGetCodeArgs>>(SLOT_ERROR_GET_CODE) } {
            // SAFETY: the caller's args, to the plugin's own accessor.
            Some(f) => unsafe { f(args) },
            None => new_error(INTERNAL, "peerless: the inner plugin has no PJRT_Error_GetCode".into()),
        }
    })
    .unwrap_or_else(|_| new_error(INTERNAL, "peerless: PJRT_Error_GetCode panicked".into()))
}

unsafe extern "C" fn error_for_each_payload(args: *mut ErrorForEachPayloadArgs) -> *mut c_void {
    if args.is_null() {
        return std::ptr::null_mut(); // nothing to iterate
    }
    catch_unwind(|| {
        // SAFETY: PJRT passes a valid args struct.
        if ours(unsafe { (*args).error }.cast_const()).is_some() {
            return std::ptr::null_mut(); // ours carry no payloads
        }
        let Some(w) = wrapped_opt() else { return std::ptr::null_mut() };
        // SAFETY: the slot is `PJRT_Error_ForEachPayload` (patched only where set).
        match unsafe { w.plugin.slot_fn::<Entry<ErrorForEachPayloadArgs>>(SLOT_ERROR_FOR_EACH_PAYLOAD) } {
            // SAFETY: the caller's args, to the plugin's own iterator.
            Some(f) => unsafe { f(args) },
            None => std::ptr::null_mut(),
        }
    })
    .unwrap_or_else(|_| new_error(INTERNAL, "peerless: PJRT_Error_ForEachPayload panicked".into()))
}

// ---- client creation: the collective pass ---------------------------------------------

/// The client create option that sets Peerless's flags for the process (a string of `--name=value`; from JAX:
/// `JAX_PJRT_CLIENT_CREATE_OPTIONS="peerless_flags:--one_shot_max_bytes=1024"`). It is taken out of the options before
/// XLA sees them.
pub const FLAGS_OPTION: &str = "peerless_flags";

/// Splits `peerless_flags` out of a client's create options: its value (None when absent) and the other options, to
/// hand XLA.
///
/// # Safety
/// Every option's `name` points to `name_size` readable bytes, and a string option's `string_value` to `value_size`
/// bytes (PJRT's contract for create options).
unsafe fn split_create_options(options: &[NamedValue]) -> Result<(Option<String>, Vec<NamedValue>), String> {
    let mut flags = None;
    let mut rest = Vec::with_capacity(options.len());
    for o in options {
        // SAFETY: PJRT passes `name_size` readable bytes at `name` for each option.
        let name = unsafe { raw_bytes(o.name, o.name_size) };
        if name != FLAGS_OPTION.as_bytes() {
            rest.push(*o);
            continue;
        }
        if o.type_ != pjrt_sys::PJRT_NamedValue_Type_PJRT_NamedValue_kString {
            return Err(format!("the client option {FLAGS_OPTION} takes a string of --name=value flags"));
        }
        // SAFETY: a string option's value is `value_size` readable bytes at `string_value`.
        let value = unsafe { raw_bytes(o.__bindgen_anon_1.string_value, o.value_size) };
        flags = Some(String::from_utf8_lossy(value).into_owned());
    }
    Ok((flags, rest))
}

/// `len` bytes at `p` (empty for null).
///
/// # Safety
/// `p` is null or points to `len` readable bytes that outlive the returned slice's use.
unsafe fn raw_bytes<'a>(p: *const c_char, len: usize) -> &'a [u8] {
    if p.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
}

type NamedValue = pjrt_sys::PJRT_NamedValue;

unsafe extern "C" fn client_create(args: *mut pjrt_sys::PJRT_Client_Create_Args) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the slot is `PJRT_Client_Create` (set, since it was patched).
        let Some(create) =
            (unsafe { plugin().slot_fn::<Entry<pjrt_sys::PJRT_Client_Create_Args>>(SLOT_CLIENT_CREATE) })
        else {
            return new_error(INTERNAL, "peerless: the inner plugin has no PJRT_Client_Create".into());
        };
        // Without the pass the platform would be XLA alone while claiming to be Peerless: a plugin that cannot take it
        // is an error here, naming the plugin and the reason.
        if let Err(e) = crate::xla_inside::register_pass_in(plugin(), wrapped().platform) {
            return new_error(INTERNAL, format!("peerless: cannot register the collective pass: {e}"));
        }
        if args.is_null() {
            // SAFETY: the plugin reports its own bad arguments.
            return unsafe { create(args) };
        }
        // SAFETY: PJRT passes a valid args struct; `create_options` holds `num_options` entries.
        let a = unsafe { &mut *args };
        let options: &[NamedValue] = if a.create_options.is_null() || a.num_options == 0 {
            &[]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(a.create_options, a.num_options) }
        };
        // SAFETY: the options come from PJRT, which promises their names and values.
        let r = match unsafe { split_create_options(options) } {
            Err(e) if wrapped().own_errors => new_error(INVALID_ARGUMENT, format!("peerless: {e}")),
            // A newer plugin reads errors through slots this build does not know: XLA judges.
            // SAFETY: the caller's args, unchanged.
            Err(_) => unsafe { create(args) },
            // SAFETY: the caller's args, unchanged.
            Ok((None, _)) => unsafe { create(args) },
            Ok((Some(flags), rest)) => {
                if let Err(e) = crate::xla_inside::set_client_flags(&flags) {
                    return new_error(INVALID_ARGUMENT, format!("peerless: client option {FLAGS_OPTION}: {e}"));
                }
                let saved = (a.create_options, a.num_options);
                (a.create_options, a.num_options) = (rest.as_ptr(), rest.len());
                // SAFETY: the caller's args with the options XLA knows, which outlive the call (`rest`); the originals
                // are put back after.
                let r = unsafe { create(args) };
                (a.create_options, a.num_options) = saved;
                r
            }
        };
        if r.is_null() && !a.client.is_null() {
            // SAFETY: the plugin just created this client; it is alive during this call.
            learn_device_kind(unsafe { ffi::pjrt::client::addressable_devices(plugin(), a.client) });
        }
        r
    }))
    .unwrap_or_else(|_| new_error(INTERNAL, "peerless: PJRT_Client_Create panicked".into()))
}

/// Records the kind of a new client's devices (XLA's name for them, "NVIDIA H200"), which the pass looks its tuning
/// profile up by: what XLA knows, so no GPU is opened for it. A client whose devices cannot be listed leaves the kind
/// unknown (the profile is then looked up without one), which is no reason to fail its creation.
fn learn_device_kind(devices: Result<Vec<ffi::pjrt::client::Device>, String>) {
    let platform = wrapped().platform;
    match devices {
        Ok(d) => match d.first() {
            Some(first) => crate::xla_inside::record_device_kind(platform, &first.kind),
            None => log::debug!("peerless: the {platform} client has no devices: no device kind"),
        },
        Err(e) => log::info!("peerless: the {platform} client's device kind is unknown ({e})"),
    }
}

// ---- compile: Peerless's per-executable options ----------------------------------------

unsafe extern "C" fn client_compile(args: *mut ClientCompileArgs) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the slot is `PJRT_Client_Compile` (set, since it was patched).
        let Some(compile) = (unsafe { plugin().slot_fn::<Entry<ClientCompileArgs>>(SLOT_CLIENT_COMPILE) }) else {
            return new_error(INTERNAL, "peerless: the inner plugin has no PJRT_Client_Compile".into());
        };
        if args.is_null() {
            // SAFETY: the plugin reports its own bad arguments.
            return unsafe { compile(args) };
        }
        // SAFETY: PJRT passes a valid args struct whose options are `compile_options_size` readable bytes (or null).
        let a = unsafe { &mut *args };
        let opts: &[u8] = if a.compile_options.is_null() {
            &[]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(a.compile_options.cast::<u8>(), a.compile_options_size) }
        };
        let (flags, options) = match split_compile_options(opts) {
            Err(e) if wrapped().own_errors => return new_error(INVALID_ARGUMENT, e),
            Err(e) => {
                // XLA's own "No such compile option" error, carrying ours as the name.
                let mut bad = opts.to_vec();
                prost::encoding::message::encode(
                    ENV_OPTION_OVERRIDES,
                    &OverrideEntry { key: e, value: None },
                    &mut bad,
                );
                (Vec::new(), bad)
            }
            // SAFETY: the caller's args, unchanged.
            Ok(None) => return unsafe { compile(args) },
            Ok(Some(split)) => split,
        };
        let saved = (a.compile_options, a.compile_options_size);
        (a.compile_options, a.compile_options_size) = (options.as_ptr().cast(), options.len());
        // SAFETY: the caller's args with options that outlive the call (`options`).
        let r = crate::xla_inside::with_compile_flags(flags, || unsafe { compile(args) });
        (a.compile_options, a.compile_options_size) = saved;
        r
    }))
    .unwrap_or_else(|_| new_error(INTERNAL, "peerless: PJRT_Client_Compile panicked".into()))
}

/// `CompileOptionsProto.env_option_overrides`: one map entry.
#[derive(Clone, PartialEq, prost::Message)]
struct OverrideEntry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<xla::OptionOverrideProto>,
}

/// Takes Peerless's options out of a serialized `CompileOptionsProto`: `env_option_overrides` entries named like a
/// Peerless flag, or `peerless_flags`. None when there are none (the bytes go to XLA untouched), else the checked flags
/// and the options without them, edited on the wire so unknown fields are kept; other names stay for XLA to judge.
pub fn split_compile_options(bytes: &[u8]) -> Result<Option<(Vec<String>, Vec<u8>)>, String> {
    use hlo::wire::{WireType, fields};
    use prost::Message;
    use xla::option_override_proto::Value;

    // Anything odd is left to XLA.
    let Ok(fs) = fields(bytes) else { return Ok(None) };
    let mut flags = Vec::new();
    let mut rest = Vec::with_capacity(bytes.len());
    for f in fs {
        if f.number == ENV_OPTION_OVERRIDES && f.wire == WireType::LengthDelimited {
            let entry = OverrideEntry::decode(f.payload).map_err(|e| format!("peerless: compile options: {e}"))?;
            let value = match entry.value.and_then(|v| v.value) {
                Some(Value::StringField(s)) => s,
                Some(Value::BoolField(b)) => b.to_string(),
                Some(Value::IntField(i)) => i.to_string(),
                Some(Value::DoubleField(d)) => d.to_string(),
                None => String::new(),
            };
            let name = entry.key.as_str();
            let mine: Vec<String> = if name == "peerless_flags" {
                value.split_whitespace().map(str::to_owned).collect()
            } else if emitter::FLAGS.iter().any(|f| f.name == name) {
                vec![format!("--{name}={value}")]
            } else {
                Vec::new()
            };
            if name == "peerless_flags" || !mine.is_empty() {
                let mut check = emitter::Flags::default();
                for f in &mine {
                    check.apply(f).map_err(|e| format!("peerless: compile option {name}={value}: {e}"))?;
                }
                flags.extend(mine);
                continue;
            }
        }
        rest.extend_from_slice(f.raw);
    }
    Ok(if flags.is_empty() && rest.len() == bytes.len() { None } else { Some((flags, rest)) })
}

#[cfg(test)]
#[path = "../tests/unit/wrap.rs"]
mod tests;
