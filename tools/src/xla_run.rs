//! `peerless run --backend xla`: a module run by XLA's own PJRT plugin, with Peerless's pass applied first and its FFI
//! handlers registered in the plugin. The module is prepared as `hlo-tests/gen_goldens.py` prepares XLA's goldens
//! (replicas: an N×1 assignment; partitions: SPMD, 1×N, every instruction `sharding={manual}`; the assignment written
//! into the module, where the pass reads it); JAX's own modules compile as `jax.jit` compiles them
//! ([`module_compile_options`]). What XLA:CPU's client does not take (nested tuple results, tuple parameters) is
//! flattened (`flatten`); [`buffer_type`] maps the f8 and 4-bit types.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use emitter::xla_pass::{PassDecision, PassOutcome};
use ffi::pjrt::InnerPlugin;
use ffi::pjrt::client::{Client, Device, buffer_type as bt};
use hlo::wire::{fields, hlo_computation, hlo_instruction, hlo_module, map_field, put_bytes};
use hlo::{Array, ArrayShape, Literal, PrimitiveType, Shape};
use pjrt_sys::protos::xla;
use plugin::Platform;
use prost::Message;
use runs::{Mode, RunConfig};
use thunks::custom_call::TARGETS;

pub mod flatten;

/// Where the XLA plugin comes from when `--xla-plugin` is not given.
pub const ENV_VAR: &str = plugin::wrap::ENV_VAR;

pub use plugin::wrap::platform_of;

/// What a run produced: every device's result and the pass's decisions.
#[derive(Debug)]
pub struct XlaRun {
    pub outputs: Vec<Literal>,
    pub decisions: Vec<PassDecision>,
    /// Whether the pass rewrote the module (some collective runs on Peerless).
    pub rewritten: bool,
    pub plugin: PathBuf,
    /// Peerless's platform of the plugin.
    pub platform: Platform,
}

/// The CPU plugin of the `lammps-jax-pjrt-cpu` package inside a JAX venv.
fn cpu_plugin_in(venv: &Path) -> PathBuf {
    venv.join("lib/python3.12/site-packages/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so")
}

/// The plugin to run on: `explicit` (`--xla-plugin`), else `PEERLESS_XLA_PLUGIN`, else the CPU plugin in the JAX venv
/// (`$PEERLESS_VENV_DIR/jax`, then `<repo>/.venv/jax`). One error naming every place looked in when none is there.
pub fn find_plugin(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(format!("--xla-plugin {}: no such file", p.display()))
        };
    }
    if let Some(p) = std::env::var_os(ENV_VAR).filter(|p| !p.is_empty() && p != "standalone") {
        let p = PathBuf::from(p);
        return if p.is_file() { Ok(p) } else { Err(format!("{ENV_VAR}={}: no such file", p.display())) };
    }
    let mut looked = vec![format!("--xla-plugin (not given)"), format!("{ENV_VAR} (not set)")];
    let mut venvs = Vec::new();
    if let Some(d) = std::env::var_os("PEERLESS_VENV_DIR").filter(|d| !d.is_empty()) {
        venvs.push(PathBuf::from(d).join("jax"));
    } else {
        looked.push("$PEERLESS_VENV_DIR/jax (PEERLESS_VENV_DIR not set)".into());
    }
    // <repo>/.venv/jax: this crate lives in <repo>/plugin.
    venvs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/jax"));
    for v in venvs {
        let p = cpu_plugin_in(&v);
        if p.is_file() {
            return Ok(p.canonicalize().unwrap_or(p));
        }
        looked.push(p.display().to_string());
    }
    Err(format!(
        "no XLA PJRT plugin found; looked in: {}. Pass --xla-plugin PATH or set {ENV_VAR} (XLA's CPU plugin: \
         scripts/setup.sh installs lammps-jax-pjrt-cpu into .venv/jax; CUDA: jax-cuda13-pjrt's xla_cuda_plugin.so)",
        looked.join("; ")
    ))
}

/// Loads a plugin once per process and registers Peerless's handlers in it (XLA's FFI registry is process-global inside
/// the plugin, and a second registration is an error). `platform`: [`platform_of`] the path.
pub fn plugin(path: &Path, platform: Platform) -> Result<&'static InnerPlugin, String> {
    static LOADED: Mutex<BTreeMap<PathBuf, &'static InnerPlugin>> = Mutex::new(BTreeMap::new());
    let mut map = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = map.get(path) {
        return Ok(p);
    }
    // Never unloaded: XLA keeps pointers to the handlers and the client lives in it.
    let inner: &'static InnerPlugin = Box::leak(Box::new(InnerPlugin::load(path)?));
    let xla_platform = plugin::xla_handlers::register_in(inner, platform)?;
    log::info!(
        "xla: {} (PJRT {}.{}): {} handlers registered for {xla_platform}",
        path.display(),
        inner.version().0,
        inner.version().1,
        TARGETS.len()
    );
    map.insert(path.to_path_buf(), inner);
    Ok(inner)
}

/// A client of `inner` and its devices (XLA:CPU's count: `cpu_devices`). Records the devices' kind ("NVIDIA H200"), as
/// the wrapper does for clients XLA makes, since the pass finds its tuning profile by it ([`prepare`]).
pub fn client(
    inner: &'static InnerPlugin,
    platform: Platform,
    cpu_devices: usize,
) -> Result<(Client, Vec<Device>), String> {
    let options: Vec<(&str, i64)> =
        if platform == Platform::Cpu { vec![("cpu_device_count", cpu_devices as i64)] } else { vec![] };
    let client = Client::create(inner, &options)?;
    let devices = client.devices()?;
    if let Some(d) = devices.first() {
        plugin::xla_inside::record_device_kind(platform, &d.kind);
    }
    Ok((client, devices))
}

/// The device assignment of `ids` (global device ids) for the mode.
fn assignment(mode: Mode, ids: &[i64]) -> xla::DeviceAssignmentProto {
    use xla::device_assignment_proto::ComputationDevice;
    match mode {
        Mode::Replica => xla::DeviceAssignmentProto {
            replica_count: ids.len() as i32,
            computation_count: 1,
            computation_devices: vec![ComputationDevice { replica_device_ids: ids.to_vec() }],
        },
        Mode::Partition => xla::DeviceAssignmentProto {
            replica_count: 1,
            computation_count: ids.len() as i32,
            computation_devices: ids.iter().map(|&d| ComputationDevice { replica_device_ids: vec![d] }).collect(),
        },
    }
}

/// The compile options of gen_goldens.py's `_run_xla`.
pub fn compile_options(mode: Mode, ids: &[i64]) -> xla::CompileOptionsProto {
    let n = ids.len() as i64;
    let (replicas, partitions) = if mode == Mode::Replica { (n, 1) } else { (1, n) };
    xla::CompileOptionsProto {
        executable_build_options: Some(xla::ExecutableBuildOptionsProto {
            device_ordinal: -1,
            num_replicas: replicas,
            num_partitions: partitions,
            use_spmd_partitioning: mode == Mode::Partition,
            device_assignment: Some(assignment(mode, ids)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether the module is in JAX's Shardy round-trip form: `xla.sdy.*` module frontend attributes (the meshes) or custom
/// calls (`xla.sdy.GlobalToLocalShape`, ...).
pub fn uses_shardy(module: &hlo::Module) -> bool {
    module.config.frontend_attributes.keys().any(|k| k.starts_with("xla.sdy."))
        || module
            .instrs
            .values()
            .any(|i| i.attrs.custom_call_target.as_deref().is_some_and(|t| t.starts_with("xla.sdy.")))
}

/// [`compile_options`] for `module` (`bytes`, its binary proto) as JAX compiles its own: a module with shardings may
/// have its outputs' shardings propagated (what `jax.jit` sets for unspecified `out_shardings`: results come back as
/// shards), and one in Shardy form gets `use_shardy_partitioner` (only those: XLA aborts when Shardy meets GSPMD form).
pub fn module_compile_options(
    module: &hlo::Module,
    bytes: &[u8],
    mode: Mode,
    ids: &[i64],
) -> Result<xla::CompileOptionsProto, String> {
    let mut options = compile_options(mode, ids);
    if mode == Mode::Partition
        && has_sharding(bytes)?
        && let Some(eb) = options.executable_build_options.as_mut()
    {
        eb.allow_spmd_sharding_propagation_to_output = vec![true];
        eb.use_shardy_partitioner = uses_shardy(module);
    }
    Ok(options)
}

/// The module with its device assignment replaced by `da`.
fn with_assignment(module: &[u8], da: &xla::DeviceAssignmentProto) -> Result<Vec<u8>, String> {
    let mut out = flatten::without(module, &[hlo_module::DEVICE_ASSIGNMENT])?;
    put_bytes(&mut out, hlo_module::DEVICE_ASSIGNMENT, &da.encode_to_vec());
    Ok(out)
}

/// Every instruction without a sharding marked manual (a tuple: a tuple of manual leaves, what `sharding={manual}` on a
/// tuple-shaped instruction parses to; XLA checks the form).
fn manualize(module: &[u8]) -> Result<Vec<u8>, String> {
    let manual = xla::OpSharding { r#type: xla::op_sharding::Type::Manual as i32, ..Default::default() };
    map_field(module, hlo_module::COMPUTATIONS, &mut |comp| {
        map_field(comp, hlo_computation::INSTRUCTIONS, &mut |instr| {
            let fs = fields(instr)?;
            if fs.iter().any(|x| x.number == hlo_instruction::SHARDING) {
                return Ok(instr.to_vec());
            }
            let shape = fs.iter().find(|x| x.number == hlo_instruction::SHAPE).and_then(|x| x.message());
            let sharding = match shape.map(flatten::WireShape::parse).transpose()?.filter(|s| s.is_tuple()) {
                Some(shape) => xla::OpSharding {
                    r#type: xla::op_sharding::Type::Tuple as i32,
                    tuple_shardings: vec![manual.clone(); shape.leaf_count()],
                    ..Default::default()
                },
                None => manual.clone(),
            };
            let mut out = instr.to_vec();
            put_bytes(&mut out, hlo_instruction::SHARDING, &sharding.encode_to_vec());
            Ok(out)
        })
    })
}

/// The module as XLA gets it: device assignment set, the pass applied (`flags`: `--name=value`), and (partitions) every
/// instruction manual, edited on the wire so fields this build's protos do not know pass through. The pass finds its
/// tuning profile by the devices' kind recorded for `platform` ([`plugin::xla_inside::record_device_kind`]).
pub fn prepare(
    bytes: &[u8],
    mode: Mode,
    ids: &[i64],
    platform: Platform,
    flags: &[String],
) -> Result<(Vec<u8>, PassOutcome), String> {
    prepare_tuned(bytes, mode, ids, platform, flags, emitter::tuning::ProfileSource::from_env())
}

/// [`prepare`] with the tuning profile from `source` (`peerless bench`, `peerless tune`).
pub fn prepare_tuned(
    bytes: &[u8],
    mode: Mode,
    ids: &[i64],
    platform: Platform,
    flags: &[String],
    source: emitter::tuning::ProfileSource,
) -> Result<(Vec<u8>, PassOutcome), String> {
    let module = with_assignment(bytes, &assignment(mode, ids))?;
    let cfg = plugin::xla_inside::pass_config_tuned(platform, &flags.join(" "), "", source)?;
    let outcome = emitter::xla_pass::run(&module, &cfg).map_err(|e| format!("peerless pass: {e}"))?;
    let module = outcome.module.as_deref().unwrap_or(&module);
    // A module that already carries shardings (JAX's GSPMD form: tiled entry, a manual shard_map body) is left to XLA's
    // sharding propagation: marking its unsharded instructions manual would mix manual and tiled leaves (XLA aborts on
    // that).
    let module = if mode == Mode::Partition && !has_sharding(bytes)? { manualize(module)? } else { module.to_vec() };
    Ok((module, outcome))
}

/// Whether any instruction of the module has a sharding.
fn has_sharding(module: &[u8]) -> Result<bool, String> {
    let index = hlo::wire::Index::new(module)?;
    Ok(index.instrs.values().any(|i| i.fields.iter().any(|x| x.number == hlo_instruction::SHARDING)))
}

/// PJRT's buffer type of an element type (the ones XLA's goldens use).
pub fn buffer_type(ty: PrimitiveType) -> Result<u32, String> {
    use PrimitiveType as T;
    Ok(match ty {
        T::Pred => bt::PRED,
        T::S8 => bt::S8,
        T::S16 => bt::S16,
        T::S32 => bt::S32,
        T::S64 => bt::S64,
        T::U8 => bt::U8,
        T::U16 => bt::U16,
        T::U32 => bt::U32,
        T::U64 => bt::U64,
        T::F16 => bt::F16,
        T::Bf16 => bt::BF16,
        T::F32 => bt::F32,
        T::F64 => bt::F64,
        T::F8E5M2 => bt::F8E5M2,
        T::F8E4M3 => bt::F8E4M3,
        T::F8E4M3FN => bt::F8E4M3FN,
        T::F8E4M3B11FNUZ => bt::F8E4M3B11FNUZ,
        T::F8E5M2FNUZ => bt::F8E5M2FNUZ,
        T::F8E4M3FNUZ => bt::F8E4M3FNUZ,
        T::F8E3M4 => bt::F8E3M4,
        T::F8E8M0FNU => bt::F8E8M0FNU,
        T::S4 => bt::S4,
        T::U4 => bt::U4,
        other => return Err(format!("the xla backend does not move {} arrays yet", other.name())),
    })
}

/// The result's leaves (array shapes, depth first), as PJRT returns them from the flat entry ([`flatten::entry`]): a
/// tuple result as its leaves.
fn result_leaves(shape: &Shape) -> Result<Vec<&ArrayShape>, String> {
    fn has_token(s: &Shape) -> bool {
        match s {
            Shape::Token => true,
            Shape::Tuple(t) => t.iter().any(has_token),
            Shape::Array(_) => false,
        }
    }
    if has_token(shape) {
        return Err("the xla backend cannot return a token".into());
    }
    Ok(shape.leaves())
}

/// An array's bytes as XLA:CPU's `BufferFromHostBuffer` takes them. 4-bit integers go one element per byte in the low
/// nibble (measured: XLA:CPU reads them unpacked and `ToHostBuffer` returns them so, high nibble zero), where hlo's
/// `Literal` (like numpy's int4 files) holds s4 sign-extended; every other type as it is.
fn to_host_form(a: &Array) -> std::borrow::Cow<'_, [u8]> {
    match a.ty() {
        PrimitiveType::S4 | PrimitiveType::U4 => a.data.iter().map(|b| b & 0x0f).collect::<Vec<u8>>().into(),
        _ => a.data.as_slice().into(),
    }
}

/// The bytes `ToHostBuffer` returned for an array of `ty`, as hlo's `Literal` holds them: s4 sign-extended from its low
/// nibble, u4 its low nibble.
fn from_host_form(ty: PrimitiveType, mut data: Vec<u8>) -> Vec<u8> {
    match ty {
        PrimitiveType::S4 => data.iter_mut().for_each(|b| *b = (((*b << 4) as i8) >> 4) as u8),
        PrimitiveType::U4 => data.iter_mut().for_each(|b| *b &= 0x0f),
        _ => {}
    }
    data
}

/// Runs `bytes` (a binary HloModuleProto of `module`) on XLA's plugin at `plugin_path`; `inputs[d]` are device d's
/// entry arguments; `xla_options` are XLA options of string value (`xla_disable_hlo_passes`, ...) set for this compile
/// (`CompileOptionsProto.env_option_overrides`).
pub fn run(
    plugin_path: &Path,
    module: &hlo::Module,
    bytes: &[u8],
    cfg: &RunConfig,
    inputs: &[Vec<Literal>],
    flags: &[String],
    xla_options: &[(&str, &str)],
) -> Result<XlaRun, String> {
    let platform = plugin::wrap::platform_of(plugin_path);
    let inner = plugin(plugin_path, platform)?;
    let n = cfg.num_devices;
    let (client, devices) = client(inner, platform, n)?;
    if devices.len() < n {
        let why = if platform == Platform::Cpu {
            format!(" (XLA:CPU's device count is its `cpu_device_count` create option, set to {n})")
        } else {
            String::new()
        };
        return Err(format!(
            "{}: the client has {} devices, {n} are needed{why}",
            plugin_path.display(),
            devices.len()
        ));
    }
    let devices = &devices[..n];
    let ids: Vec<i64> = devices.iter().map(|d| i64::from(d.id)).collect();
    // XLA:CPU's PJRT client takes no nested tuple result nor tuple parameter: such an entry is flattened, its arguments
    // passed as their leaves and its results nested back.
    let flat = flatten::entry(bytes)?;
    let (program, outcome) = prepare(flat.as_deref().unwrap_or(bytes), cfg.mode, &ids, platform, flags)?;
    let mut options = module_compile_options(module, bytes, cfg.mode, &ids)?;
    for &(name, value) in xla_options {
        let value = Some(xla::option_override_proto::Value::StringField(value.into()));
        options.env_option_overrides.insert(name.into(), xla::OptionOverrideProto { value });
    }
    let options = options.encode_to_vec();
    let exe = client.compile_hlo(&program, &options)?;
    let mut args = Vec::with_capacity(n);
    for (d, dev_inputs) in inputs.iter().enumerate() {
        let mut bufs = Vec::new();
        for a in flatten::flat_args(dev_inputs).map_err(|e| format!("device {d}: {e}"))? {
            bufs.push(client.buffer_from_host(&to_host_form(a), buffer_type(a.ty())?, a.dims(), &devices[d])?);
        }
        args.push(bufs);
    }
    let arg_refs: Vec<Vec<_>> = args.iter().map(|v| v.iter().collect()).collect();
    let results = exe.execute(&arg_refs)?;
    let root = module.entry_result_shape();
    let leaves = result_leaves(root)?;
    let mut outputs = Vec::with_capacity(n);
    for (d, bufs) in results.iter().enumerate() {
        if bufs.len() != leaves.len() {
            return Err(format!(
                "device {d}: XLA returned {} outputs, the module's result has {}",
                bufs.len(),
                leaves.len()
            ));
        }
        let mut arrays = Vec::new();
        for (j, (buf, want)) in bufs.iter().zip(&leaves).enumerate() {
            let ty = buffer_type(want.ty)?;
            if buf.element_type()? != ty {
                return Err(format!(
                    "o{j}_d{d}: XLA returned PJRT type {}, expected {}",
                    buf.element_type()?,
                    want.ty.name()
                ));
            }
            let dims = buf.dims()?;
            let shape = ArrayShape::new(want.ty, dims);
            let data = from_host_form(want.ty, buf.to_host()?);
            arrays.push(Array::new(shape, data).map_err(|e| format!("o{j}_d{d}: {e:?}"))?);
        }
        outputs.push(flatten::nest(root, &mut arrays.into_iter())?);
    }
    drop(results);
    drop(args);
    drop(exe);
    Ok(XlaRun {
        rewritten: outcome.module.is_some(),
        outputs,
        decisions: outcome.decisions,
        plugin: plugin_path.to_path_buf(),
        platform,
    })
}

#[cfg(test)]
#[path = "../tests/unit/xla_run.rs"]
mod tests;
