//! The objects behind PJRT handles: client, devices, memories, topology, events, buffers and
//! executables, and the two operations with real work in them, compile and execute.
//!
//! Everything is synchronous on the host backend: `Execute` returns after every device has
//! finished, so every event this plugin hands out is born ready.

use std::os::raw::c_char;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use emitter::{DeviceMode, Flags};
use hlo::sharding::Tiling;
use hlo::{Array, ArrayShape, Literal, PrimitiveType, Shape};
use kernels::exec::Executable as DeviceProgram;
use pjrt_sys::protos::xla;
use pjrt_sys::{PJRT_Buffer_Type, PJRT_Device, PJRT_DeviceDescription, PJRT_Memory};
use prost::Message;

use crate::error::{Error, Result};

/// The one memory kind every device has.
pub const MEMORY_KIND: &str = "device";
/// Device kind reported for host-backend devices.
pub const DEVICE_KIND: &str = "peerless-host";

/// Which backend a client runs programs on (`PEERLESS_BACKEND`). The standalone plugin runs
/// modules on the host backend only: on GPUs, `JAX_PLATFORMS=peerless` wraps XLA's own CUDA
/// plugin instead (`wrap.rs`), and XLA runs everything but Peerless's collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// N simulated devices on N threads (the host backend of `kernels::exec::Executable`).
    Host,
}

impl BackendKind {
    /// `PEERLESS_BACKEND`: `host` or unset / empty.
    pub fn from_env() -> Result<Self> {
        match std::env::var("PEERLESS_BACKEND").as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("host") => Ok(BackendKind::Host),
            Ok("cuda") => Err(Error::invalid(
                "peerless: PEERLESS_BACKEND=cuda needs XLA's CUDA plugin, which was not found (install \
                 jax-cuda13-pjrt or jax-cuda12-pjrt, or set PEERLESS_XLA_PLUGIN=/path/to/xla_cuda_plugin.so): \
                 JAX_PLATFORMS=peerless wraps it; the standalone platform runs on the host backend only",
            )),
            Ok(other) => {
                Err(Error::invalid(format!("peerless: PEERLESS_BACKEND={other} is not a backend (expected host)")))
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
        }
    }
}

/// Client creation settings (create options, then environment, then defaults).
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub backend: BackendKind,
    pub num_devices: usize,
    pub flags: Flags,
}

impl ClientConfig {
    /// Backend from `PEERLESS_BACKEND` ([`BackendKind::from_env`]). `num_devices` from the
    /// create option, else `PEERLESS_HOST_DEVICES` (alias `PEERLESS_NUM_DEVICES`), else 8. Flags from
    /// `PEERLESS_FLAGS` and then the create option `peerless_flags`.
    pub fn new(option_devices: Option<i64>, option_flags: Option<&str>) -> Result<Self> {
        let backend = BackendKind::from_env()?;
        let num_devices = match backend {
            BackendKind::Host => host_devices(option_devices)?,
        };
        if !(1..=4096).contains(&num_devices) {
            return Err(Error::invalid(format!("peerless: num_devices must be in 1..=4096, got {num_devices}")));
        }
        let mut flags = Flags::from_env().map_err(|e| Error::invalid(format!("peerless: PEERLESS_FLAGS: {e}")))?;
        if let Some(extra) = option_flags {
            for arg in extra.split_whitespace() {
                flags.apply(arg).map_err(|e| Error::invalid(format!("peerless: peerless_flags: {e}")))?;
            }
        }
        Ok(ClientConfig { backend, num_devices: num_devices as usize, flags })
    }
}

/// The host backend's device count: create option `num_devices`, else `PEERLESS_HOST_DEVICES`,
/// else `PEERLESS_NUM_DEVICES`, else 8.
fn host_devices(option_devices: Option<i64>) -> Result<i64> {
    if let Some(n) = option_devices {
        return Ok(n);
    }
    for var in ["PEERLESS_HOST_DEVICES", "PEERLESS_NUM_DEVICES"] {
        if let Some(s) = std::env::var(var).ok().filter(|s| !s.trim().is_empty()) {
            return s
                .trim()
                .parse::<i64>()
                .map_err(|_| Error::invalid(format!("peerless: {var}={s} is not an integer")));
        }
    }
    Ok(8)
}

/// A device; its `PJRT_DeviceDescription*` is the same pointer.
pub struct Device {
    pub id: i32,
    pub index: usize,
    pub debug_string: String,
    pub to_string: String,
    /// `[the device's one memory]`, as the array `Device_AddressableMemories` returns.
    pub memories: [*mut PJRT_Memory; 1],
}

/// A device's memory (kind [`MEMORY_KIND`]).
pub struct Memory {
    pub id: i32,
    pub debug_string: String,
    pub to_string: String,
    /// `[the device owning it]`, as the array `Memory_AddressableByDevices` returns.
    pub devices: [*mut PJRT_Device; 1],
}

/// The client's topology; owned by the client (`TopologyDescription_Destroy` on it is a no-op).
pub struct Topology {
    pub descriptions: Vec<*mut PJRT_DeviceDescription>,
}

/// A client: N devices with one memory each. Devices and memories are boxed so the
/// pointers handed out stay valid until `Client_Destroy`.
pub struct Client {
    pub config: ClientConfig,
    pub devices: Vec<Box<Device>>,
    pub memories: Vec<Box<Memory>>,
    pub device_ptrs: Vec<*mut PJRT_Device>,
    pub memory_ptrs: Vec<*mut PJRT_Memory>,
    pub topology: Box<Topology>,
    pub platform_version: String,
}

impl Client {
    pub fn new(config: ClientConfig) -> Box<Client> {
        let n = config.num_devices;
        let backend = config.backend.name();
        let mut devices: Vec<Box<Device>> = (0..n)
            .map(|i| {
                Box::new(Device {
                    id: i as i32,
                    index: i,
                    debug_string: format!("peerless:{i}"),
                    to_string: format!("PeerlessDevice(id={i}, backend={backend})"),
                    memories: [std::ptr::null_mut()],
                })
            })
            .collect();
        let mut memories: Vec<Box<Memory>> = (0..n)
            .map(|i| {
                Box::new(Memory {
                    id: i as i32,
                    debug_string: format!("peerless:{i}:device"),
                    to_string: format!("PeerlessMemory(id={i}, kind=device)"),
                    devices: [std::ptr::null_mut()],
                })
            })
            .collect();
        for (d, m) in devices.iter_mut().zip(memories.iter_mut()) {
            d.memories[0] = std::ptr::from_mut::<Memory>(m).cast();
            m.devices[0] = std::ptr::from_mut::<Device>(d).cast();
        }
        let device_ptrs: Vec<*mut PJRT_Device> =
            devices.iter_mut().map(|d| std::ptr::from_mut::<Device>(d).cast()).collect();
        let memory_ptrs = memories.iter_mut().map(|m| std::ptr::from_mut::<Memory>(m).cast()).collect();
        let topology = Box::new(Topology { descriptions: device_ptrs.iter().map(|p| p.cast()).collect() });
        Box::new(Client {
            config,
            devices,
            memories,
            device_ptrs,
            memory_ptrs,
            topology,
            platform_version: format!("peerless {} ({backend} backend)", env!("CARGO_PKG_VERSION")),
        })
    }

    /// The index of the device behind `p`, if it is one of ours.
    pub fn device_index(&self, p: *mut PJRT_Device) -> Option<usize> {
        self.device_ptrs.iter().position(|&q| q == p)
    }

    /// The index of the device owning memory `p`, if it is one of ours.
    pub fn memory_index(&self, p: *mut PJRT_Memory) -> Option<usize> {
        self.memory_ptrs.iter().position(|&q| q == p)
    }

    /// The device with global id `id`.
    pub fn device_by_id(&self, id: i64) -> Result<usize> {
        usize::try_from(id)
            .ok()
            .filter(|&i| i < self.devices.len())
            .ok_or_else(|| Error::invalid(format!("peerless: no device with id {id} ({} devices)", self.devices.len())))
    }
}

/// An event; always ready (see module docs), carrying the operation's outcome.
pub struct Event {
    pub result: Result<()>,
}

impl Event {
    pub fn ready() -> *mut pjrt_sys::PJRT_Event {
        Box::into_raw(Box::new(Event { result: Ok(()) })).cast()
    }
}

/// A buffer: one dense array on one device. `None` once deleted.
pub struct Buffer {
    pub client: *const Client,
    pub device: usize,
    pub shape: ArrayShape,
    pub data: Mutex<Option<Arc<Array>>>,
}

impl Buffer {
    pub fn array(&self) -> Result<Arc<Array>> {
        self.data
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| Error::failed_precondition("peerless: buffer has been deleted"))
    }
}

/// PJRT buffer type ↔ HLO primitive type.
pub fn to_pjrt_type(ty: PrimitiveType) -> Option<PJRT_Buffer_Type> {
    use PrimitiveType as P;
    Some(match ty {
        P::Pred => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_PRED,
        P::S4 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S4,
        P::S8 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S8,
        P::S16 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S16,
        P::S32 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S32,
        P::S64 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_S64,
        P::U4 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U4,
        P::U8 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U8,
        P::U16 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U16,
        P::U32 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U32,
        P::U64 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_U64,
        P::F16 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F16,
        P::Bf16 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_BF16,
        P::F32 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F32,
        P::F64 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F64,
        P::C64 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_C64,
        P::C128 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_C128,
        P::F8E5M2 => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E5M2,
        P::F8E4M3FN => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E4M3FN,
        P::F8E4M3B11FNUZ => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E4M3B11FNUZ,
        P::F8E5M2FNUZ => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E5M2FNUZ,
        P::F8E4M3FNUZ => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_F8E4M3FNUZ,
        P::Token => pjrt_sys::PJRT_Buffer_Type_PJRT_Buffer_Type_TOKEN,
        _ => return None,
    })
}

pub fn from_pjrt_type(t: PJRT_Buffer_Type) -> Result<PrimitiveType> {
    PrimitiveType::ALL
        .iter()
        .copied()
        .find(|&p| to_pjrt_type(p) == Some(t) && p != PrimitiveType::Token)
        .ok_or_else(|| Error::invalid(format!("peerless: unsupported PJRT buffer type {t}")))
}

/// Gathers a host array with `byte_strides` (empty = dense row-major) into dense row-major.
pub(crate) fn gather_host(src: *const u8, shape: &ArrayShape, byte_strides: &[i64]) -> Result<Vec<u8>> {
    let elem = shape.ty.byte_size();
    let total = shape.byte_size();
    let dense: Vec<i64> = shape.strides().iter().map(|&s| (s * elem) as i64).collect();
    if total == 0 {
        return Ok(Vec::new());
    }
    if src.is_null() {
        return Err(Error::invalid("peerless: host buffer data is null"));
    }
    if byte_strides.is_empty() || byte_strides == dense.as_slice() {
        // SAFETY: the caller's host buffer holds `total` bytes in dense row-major order
        // (PJRT contract for BufferFromHostBuffer without strides, or with dense strides).
        return Ok(unsafe { std::slice::from_raw_parts(src, total) }.to_vec());
    }
    if byte_strides.len() != shape.dims.len() {
        return Err(Error::invalid(format!(
            "peerless: {} byte strides for a rank-{} array",
            byte_strides.len(),
            shape.dims.len()
        )));
    }
    let mut out = Vec::with_capacity(total);
    let count = shape.element_count();
    let mut index = vec![0i64; shape.dims.len()];
    for _ in 0..count {
        let offset: i64 = index.iter().zip(byte_strides).map(|(i, s)| i * s).sum();
        // SAFETY: the caller's strides describe its buffer (PJRT contract), so every
        // in-bounds index lands on `elem` readable bytes at `src + offset`.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(src.offset(offset as isize), elem) });
        for k in (0..index.len()).rev() {
            index[k] += 1;
            if index[k] < shape.dims[k] {
                break;
            }
            index[k] = 0;
        }
    }
    Ok(out)
}

/// A compiled program with everything the executable queries report.
pub struct Compiled {
    pub name: String,
    pub exe: DeviceProgram,
    pub num_replicas: usize,
    pub num_partitions: usize,
    /// Device index per logical device (replica-major), i.e. in device-assignment order.
    pub devices: Vec<usize>,
    pub out_shapes: Vec<ArrayShape>,
    pub out_types: Vec<PJRT_Buffer_Type>,
    pub out_dims: Vec<i64>,
    pub out_dim_sizes: Vec<usize>,
    pub fingerprint: String,
    /// The program as a serialized `HloModuleProtoWithConfig`, with the entry computation's
    /// parameter and output shardings (`PJRT_Executable_OptimizedProgram`).
    pub optimized: Vec<u8>,
    pub deleted: AtomicBool,
}

/// A `PJRT_Executable` handle (caller-owned view of a compiled program).
pub struct Executable {
    pub compiled: Arc<Compiled>,
    pub kinds: Vec<*const c_char>,
    pub kind_sizes: Vec<usize>,
}

impl Executable {
    pub fn new(compiled: Arc<Compiled>) -> Self {
        let n = compiled.out_types.len();
        Executable { compiled, kinds: vec![MEMORY_KIND.as_ptr().cast(); n], kind_sizes: vec![MEMORY_KIND.len(); n] }
    }
}

/// A `PJRT_LoadedExecutable` handle.
pub struct Loaded {
    pub compiled: Arc<Compiled>,
    pub client: *const Client,
    pub device_ptrs: Vec<*mut PJRT_Device>,
}

/// 64-bit FNV-1a, for fingerprints.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Compiles a program (`format` as PJRT names it) with serialized `CompileOptionsProto`.
pub fn compile(client: &Client, format: &str, code: &[u8], options: &[u8]) -> Result<Compiled> {
    let proto: Vec<u8> = match format {
        "hlo" => code.to_vec(),
        "hlo_with_config" => xla::HloModuleProtoWithConfig::decode(code)?
            .hlo_module
            .ok_or_else(|| Error::invalid("peerless: hlo_with_config program without hlo_module"))?
            .encode_to_vec(),
        "mlir" => crate::mlir::convert(code)?,
        other => {
            return Err(Error::invalid(format!(
                "peerless: unsupported program format {other:?} (supported: hlo, hlo_with_config, mlir)"
            )));
        }
    };
    let module = hlo::decode_proto("program", &proto)?;
    let opts = xla::CompileOptionsProto::decode(options)?;
    let build = opts.executable_build_options.unwrap_or_default();
    let num_replicas = build.num_replicas.max(1) as usize;
    let num_partitions = build.num_partitions.max(1) as usize;
    let (mode, n) = match (num_replicas, num_partitions) {
        (r, 1) => (DeviceMode::Replica, r),
        (1, p) => (DeviceMode::Partition, p),
        (r, p) => {
            return Err(Error::unimplemented(format!(
                "peerless: {r} replicas x {p} partitions; only one of them may exceed 1"
            )));
        }
    };
    if n > client.devices.len() {
        return Err(Error::invalid(format!(
            "peerless: program needs {n} devices, the client has {}",
            client.devices.len()
        )));
    }
    let devices = match build.device_assignment.as_ref().filter(|a| !a.computation_devices.is_empty()) {
        None => (0..n).collect::<Vec<_>>(),
        Some(a) => {
            let mut v = Vec::with_capacity(n);
            for r in 0..num_replicas {
                for p in 0..num_partitions {
                    let id =
                        a.computation_devices.get(p).and_then(|c| c.replica_device_ids.get(r)).ok_or_else(|| {
                            Error::invalid(format!("peerless: device assignment lacks replica {r} partition {p}"))
                        })?;
                    v.push(client.device_by_id(*id)?);
                }
            }
            v
        }
    };
    let mut seen = devices.clone();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != devices.len() {
        return Err(Error::invalid(format!("peerless: device assignment repeats a device: {devices:?}")));
    }
    let flags = compile_flags(&client.config.flags, &opts.env_option_overrides)?;
    let kind = match client.config.backend {
        BackendKind::Host => kernels::exec::BackendKind::Host,
    };
    let exe = DeviceProgram::new(kind, &module, n, mode, &flags)?;
    exe.set_fault(test_fault(&exe)?);
    let cfg = interp::RunConfig { num_devices: n, mode };
    let result = interp::local_result_shapes(&module, &cfg)?.into_iter().next().unwrap_or(Shape::Tuple(Vec::new()));
    let out_shapes: Vec<ArrayShape> = result.leaves().into_iter().cloned().collect();
    let out_types = out_shapes
        .iter()
        .map(|s| {
            to_pjrt_type(s.ty).ok_or_else(|| Error::unimplemented(format!("peerless: output type {}", s.ty.name())))
        })
        .collect::<Result<Vec<_>>>()?;
    let out_dims = out_shapes.iter().flat_map(|s| s.dims.iter().copied()).collect();
    let out_dim_sizes = out_shapes.iter().map(|s| s.dims.len()).collect();
    let dev_bytes: Vec<u8> = devices.iter().flat_map(|d| (*d as u64).to_le_bytes()).collect();
    let fingerprint = format!("peerless-{:016x}", fnv1a(&[&proto, options, &dev_bytes]));
    let optimized = optimized_program(&module, &proto, &cfg, num_replicas, num_partitions)?;
    Ok(Compiled {
        name: module.name.clone(),
        exe,
        num_replicas,
        num_partitions,
        devices,
        out_shapes,
        out_types,
        out_dims,
        out_dim_sizes,
        fingerprint,
        optimized,
        deleted: AtomicBool::new(false),
    })
}

/// Test hook: `PEERLESS_TEST_FAULT=fail:<device>` (that logical device errors just before
/// the program's first collective) or `withhold:<device>` (it skips that collective, so its
/// peers time out) is injected into every executable compiled while it is set. For the
/// fault tests (plugin/tests/test_faults.py, docs/RELIABILITY.md); unset, nothing changes.
fn test_fault(exe: &DeviceProgram) -> Result<Option<kernels::exec::Fault>> {
    let Ok(spec) = std::env::var("PEERLESS_TEST_FAULT") else { return Ok(None) };
    let bad =
        || Error::invalid(format!("peerless: PEERLESS_TEST_FAULT={spec}: expected fail:<device> or withhold:<device>"));
    let (kind, device) = spec.split_once(':').ok_or_else(bad)?;
    let device: usize = device.trim().parse().map_err(|_| bad())?;
    let Some(first) = exe.planned().first() else { return Ok(None) };
    let collective = first.instr.clone();
    Ok(Some(match kind {
        "fail" => kernels::exec::Fault::FailBefore { device, collective },
        "withhold" => kernels::exec::Fault::WithholdRank { device, collective },
        _ => return Err(bad()),
    }))
}

/// The client's flags with the compile options' overrides applied: every override named
/// like a Peerless flag (`jax.jit(f).lower(x).compile(compiler_options={"all_reduce_backend":
/// "fallback"})`) sets it; XLA's own options (`xla_*`) mean nothing to Peerless and are
/// ignored; any other name is an error listing the valid flags.
fn compile_flags(
    base: &Flags,
    overrides: &std::collections::HashMap<String, xla::OptionOverrideProto>,
) -> Result<Flags> {
    use xla::option_override_proto::Value;
    let mut flags = base.clone();
    let mut names: Vec<&String> = overrides.keys().filter(|k| !k.starts_with("xla_")).collect();
    names.sort();
    for name in names {
        let value = match overrides[name].value.as_ref() {
            Some(Value::StringField(s)) => s.clone(),
            Some(Value::BoolField(b)) => b.to_string(),
            Some(Value::IntField(i)) => i.to_string(),
            Some(Value::DoubleField(d)) => d.to_string(),
            None => String::new(),
        };
        if !emitter::FLAGS.iter().any(|f| f.name == name.as_str()) {
            // XLA's wording, which JAX's own tests match.
            let known: Vec<&str> = emitter::FLAGS.iter().map(|f| f.name).collect();
            return Err(Error::invalid(format!(
                "peerless: No such compile option: '{name}' (Peerless flags: {}; XLA's xla_* options are ignored)",
                known.join(", ")
            )));
        }
        flags
            .apply(&format!("--{name}={value}"))
            .map_err(|e| Error::invalid(format!("peerless: compile option {name}={value}: {e}")))?;
    }
    Ok(flags)
}

/// An `OpSharding` for a value tiled by `t` over `n` devices (`None`: replicated). Devices
/// are logical ids (positions in the device assignment), as XLA's shardings name them.
fn op_sharding(t: Option<&Tiling>, n: usize) -> Result<xla::OpSharding> {
    const REPLICATED: i32 = 0;
    const OTHER: i32 = 3;
    let replicated = xla::OpSharding { r#type: REPLICATED, ..Default::default() };
    let Some(t) = t.filter(|t| !t.is_trivial()) else { return Ok(replicated) };
    let tiles = t.counts.iter().product::<i64>().max(1) as usize;
    if !n.is_multiple_of(tiles) {
        return Err(Error::internal(format!("peerless: {tiles} tiles do not divide {n} devices evenly")));
    }
    let rep = n / tiles;
    // Linear (row-major) tile index of each device; without known tiles, device d holds tile d / rep.
    let linear: Vec<usize> = match &t.coords {
        Some(coords) => {
            coords.iter().map(|c| c.iter().zip(&t.counts).fold(0i64, |acc, (&c, &k)| acc * k + c) as usize).collect()
        }
        None => (0..n).map(|d| d / rep).collect(),
    };
    let mut devices = vec![-1i64; n];
    let mut filled = vec![0usize; tiles];
    for (d, &tile) in linear.iter().enumerate() {
        let k = filled.get_mut(tile).filter(|k| **k < rep).ok_or_else(|| {
            Error::internal(format!("peerless: device {d}'s tile {tile} is out of range or over-full"))
        })?;
        devices[tile * rep + *k] = d as i64;
        *k += 1;
    }
    let mut dims = t.counts.clone();
    if rep > 1 {
        dims.push(rep as i64);
    }
    Ok(xla::OpSharding {
        r#type: OTHER,
        tile_assignment_dimensions: dims,
        tile_assignment_devices: devices,
        replicate_on_last_tile_dim: rep > 1,
        ..Default::default()
    })
}

/// The program as `PJRT_Executable_OptimizedProgram` returns it: the `HloModuleProto`
/// (`proto`) with `spmd_parameters_shardings` / `spmd_output_sharding` set from `hlo`'s
/// sharding analysis (partition mode), wrapped with a config whose entry layout is the
/// module's program shape (jaxlib rebuilds an `HloModule` from it and reads the shardings).
fn optimized_program(
    module: &hlo::Module,
    proto: &[u8],
    cfg: &interp::RunConfig,
    num_replicas: usize,
    num_partitions: usize,
) -> Result<Vec<u8>> {
    let mut m = xla::HloModuleProto::decode(proto)?;
    if cfg.mode == DeviceMode::Partition {
        let n = cfg.num_devices;
        let plan = hlo::sharding::analyze(module, n)?;
        let (params, results) = (plan.param_tilings(module), plan.result_tilings(module));
        m.spmd_parameters_shardings = params.iter().map(|t| op_sharding(t.as_ref(), n)).collect::<Result<_>>()?;
        let leaves = results.iter().map(|t| op_sharding(t.as_ref(), n)).collect::<Result<Vec<_>>>()?;
        m.spmd_output_sharding = Some(match module.entry_result_shape() {
            // XLA gives an empty tuple one (replicated) leaf sharding.
            Shape::Tuple(_) if leaves.is_empty() => {
                xla::OpSharding { r#type: 2, tuple_shardings: vec![xla::OpSharding::default()], ..Default::default() }
            }
            Shape::Tuple(_) => xla::OpSharding { r#type: 2, tuple_shardings: leaves, ..Default::default() },
            _ => leaves.into_iter().next().unwrap_or_default(),
        });
    }
    let config = xla::HloModuleConfigProto {
        entry_computation_layout: m.host_program_shape.clone(),
        replica_count: num_replicas as i64,
        num_partitions: num_partitions as i64,
        use_spmd_partitioning: num_partitions > 1,
        ..Default::default()
    };
    Ok(xla::HloModuleProtoWithConfig { hlo_module: Some(m), config: Some(config) }.encode_to_vec())
}

impl Compiled {
    /// Runs every device: `args[d][i]` is device `d`'s argument `i`; returns `out[d][o]`.
    pub fn execute(&self, args: &[Vec<&Buffer>]) -> Result<Vec<Vec<Arc<Array>>>> {
        if self.deleted.load(Ordering::Acquire) {
            return Err(Error::failed_precondition("peerless: executable has been deleted"));
        }
        if args.len() != self.devices.len() {
            return Err(Error::invalid(format!(
                "peerless: Execute got {} argument lists for an executable on {} devices",
                args.len(),
                self.devices.len()
            )));
        }
        let mut lits = Vec::with_capacity(args.len());
        for (d, list) in args.iter().enumerate() {
            let mut row = Vec::with_capacity(list.len());
            for (i, b) in list.iter().enumerate() {
                if b.device != self.devices[d] {
                    return Err(Error::invalid(format!(
                        "peerless: argument {i} of logical device {d} lives on device {}, expected device {}",
                        b.device, self.devices[d]
                    )));
                }
                row.push(Literal::Array((*b.array()?).clone()));
            }
            lits.push(row);
        }
        let results = self.exe.execute(&lits)?;
        results
            .into_iter()
            .map(|r| {
                let leaves: Vec<Arc<Array>> = r.leaves().into_iter().map(|a| Arc::new(a.clone())).collect();
                if leaves.len() != self.out_shapes.len() {
                    return Err(Error::internal(format!(
                        "peerless: program returned {} outputs, expected {}",
                        leaves.len(),
                        self.out_shapes.len()
                    )));
                }
                Ok(leaves)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_sharding_of_tilings() {
        assert_eq!(op_sharding(None, 8).unwrap().r#type, 0);
        assert_eq!(op_sharding(Some(&Tiling { counts: vec![1, 1], coords: None }), 8).unwrap().r#type, 0);
        // Eight tiles, device d holding tile 7 - d.
        let t = Tiling { counts: vec![8], coords: Some((0..8).map(|d| vec![7 - d]).collect()) };
        let s = op_sharding(Some(&t), 8).unwrap();
        assert_eq!((s.r#type, s.tile_assignment_dimensions.clone()), (3, vec![8]));
        assert_eq!(s.tile_assignment_devices, vec![7, 6, 5, 4, 3, 2, 1, 0]);
        assert!(!s.replicate_on_last_tile_dim);
        // Two tiles on four devices: each tile held twice, replication on a last dimension.
        let t = Tiling { counts: vec![2, 1], coords: Some(vec![vec![0, 0], vec![1, 0], vec![0, 0], vec![1, 0]]) };
        let s = op_sharding(Some(&t), 4).unwrap();
        assert_eq!(s.tile_assignment_dimensions, vec![2, 1, 2]);
        assert_eq!(s.tile_assignment_devices, vec![0, 2, 1, 3]);
        assert!(s.replicate_on_last_tile_dim);
        assert!(op_sharding(Some(&Tiling { counts: vec![3], coords: None }), 8).is_err());
    }
}
