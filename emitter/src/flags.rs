//! XLA-style emitter flags (`--name=value`), from the `PEERLESS_FLAGS` environment variable or the CLI. [`FLAGS`] is
//! the one table of every flag: name, type, help, and how to read and write it; defaults live in `Flags::default()` and
//! the table shows them.

use std::fmt;

use thunks::CollectiveKind;
use thunks::flag;

use crate::EmitError;

/// Environment variable [`Flags::from_env`] reads.
pub const ENV_VAR: &str = "PEERLESS_FLAGS";

/// Largest all-reduce (operand bytes per device) the one-shot kernel takes: 256 KiB, XLA's one-shot cut-off, which
/// TensorRT-LLM's dispatch table matches (shared/research/collective_anchors.md, §1 "Limits" and §3 "Dispatch").
pub const DEFAULT_ONE_SHOT_MAX_BYTES: usize = 256 * 1024;
/// Largest all-reduce the two-shot kernel takes: 4 MiB, XLA's two-shot cut-off (2 MB in earlier versions); NCCL wins
/// above it (collective_anchors.md §1, §3, lesson 6).
pub const DEFAULT_TWO_SHOT_MAX_BYTES: usize = 4 * 1024 * 1024;
/// The simulated peer topology (`--host_topology`), which `thunks::peers` holds with the table.
pub use thunks::peers::{HostTopology, MAX_TOPOLOGY_DEVICE};
/// How long a collective may wait for its peers before the runtime reports a hang.
pub const DEFAULT_COLLECTIVE_TIMEOUT_MS: u64 = 10_000;

/// Which implementation a collective kind may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The decision rules pick (kernel where every rule allows it).
    #[default]
    Auto,
    /// Peerless kernels only: a collective no kernel can run is an error, not a fallback.
    Kernel,
    /// Always the fallback.
    Fallback,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Kernel => "kernel",
            Self::Fallback => "fallback",
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        [Self::Auto, Self::Kernel, Self::Fallback]
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| format!("'{s}' is not one of auto, kernel, fallback"))
    }
}

/// The emitter's flags. Build with `Flags::default()`, [`Flags::parse`] or [`Flags::from_env`]; change one with
/// [`Flags::apply`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Flags {
    pub all_reduce_backend: Backend,
    pub all_gather_backend: Backend,
    pub all_to_all_backend: Backend,
    pub reduce_scatter_backend: Backend,
    pub collective_permute_backend: Backend,
    pub one_shot_max_bytes: usize,
    pub two_shot_max_bytes: usize,
    pub collective_timeout_ms: u64,
    pub host_topology: HostTopology,
    /// Use peer kernels even on GPU targets whose cross-device atomics are known not to be visible to peers
    /// ([`crate::peers::PEER_ATOMICS_NOT_VISIBLE`]).
    pub allow_unsafe_peer_targets: bool,
    /// Inside XLA: partitioner-made collectives larger than this stay XLA's, which runs them asynchronously, overlapped
    /// with compute (a custom call runs in order on the compute stream). `None`: no such rule.
    pub xla_async_above_bytes: Option<usize>,
    /// Inside XLA:GPU (platforms with [`crate::Capabilities::async_queue`]): collectives above this run on XLA's async
    /// compute stream, overlapped with compute, instead of staying XLA's under `xla_async_above_bytes`; `None` (the
    /// default): every call on the compute stream, and collectives inside JAX's own async pairs stay XLA's.
    pub overlap_above_bytes: Option<usize>,
    /// The most thread blocks a call beside compute launches with (`overlap_above_bytes`): few SMs for the collective,
    /// the rest for the GEMMs it overlaps.
    pub async_blocks: u32,
    /// Inside XLA: fuse a sum all-reduce the pass gives a kernel with the residual add and RMSNorm after it
    /// (`xla_pass::fuse`) where the platform's handlers run it: always (`Some(true)`), never, or (`None`) where the
    /// fused kernel is the faster ([`crate::Capabilities::fused_norm_auto`]).
    pub fuse_norm: Option<bool>,
    /// Where all-gather, all-to-all and collective-permute move on the GPUs' copy engines (no kernel, no SM) on
    /// platforms that have them ([`crate::Capabilities::copy_engines`]).
    pub copy_engines: CopyEngines,
}

/// `--copy_engines`: when the copy-engine forms run. Off by default until the NVLink run measures them against NCCL and
/// the SM kernels (docs/PERFORMANCE.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CopyEngines {
    /// Never (the default).
    #[default]
    Off,
    /// Where the tuning profile measured them fastest (rows `copy-engine ...`).
    Auto,
    /// At and above this many bytes per device, whatever the profile says.
    From(usize),
}

/// Default of `--xla_async_above_bytes`: above it a partitioner-made collective stays XLA's, which overlaps it with
/// compute. The measurements behind it, and behind `--overlap_above_bytes` being off: docs/PERFORMANCE.md.
pub const DEFAULT_XLA_ASYNC_ABOVE_BYTES: usize = 256 * 1024;

/// Default of `--async_blocks`: a quarter of an H100's 132 SMs (NCCL's rings use 16–32 blocks).
pub const DEFAULT_ASYNC_BLOCKS: u32 = 32;

impl Default for Flags {
    fn default() -> Self {
        Flags {
            all_reduce_backend: Backend::Auto,
            all_gather_backend: Backend::Auto,
            all_to_all_backend: Backend::Auto,
            reduce_scatter_backend: Backend::Auto,
            collective_permute_backend: Backend::Auto,
            one_shot_max_bytes: DEFAULT_ONE_SHOT_MAX_BYTES,
            two_shot_max_bytes: DEFAULT_TWO_SHOT_MAX_BYTES,
            collective_timeout_ms: DEFAULT_COLLECTIVE_TIMEOUT_MS,
            host_topology: HostTopology::FullMesh,
            allow_unsafe_peer_targets: false,
            xla_async_above_bytes: Some(DEFAULT_XLA_ASYNC_ABOVE_BYTES),
            overlap_above_bytes: None,
            async_blocks: DEFAULT_ASYNC_BLOCKS,
            fuse_norm: None,
            copy_engines: CopyEngines::Off,
        }
    }
}

/// One flag: its name (without `--`), value type, help, and accessors.
pub struct FlagSpec {
    pub name: &'static str,
    /// The value's type as shown to users (`auto|kernel|fallback`, `bytes`, ...).
    pub ty: &'static str,
    pub help: &'static str,
    get: fn(&Flags) -> String,
    set: fn(&mut Flags, &str) -> Result<(), String>,
}

impl FlagSpec {
    /// The default value, as it would be written on the command line.
    pub fn default_value(&self) -> String {
        (self.get)(&Flags::default())
    }

    /// The value in `flags`.
    pub fn value(&self, flags: &Flags) -> String {
        (self.get)(flags)
    }
}

impl fmt::Debug for FlagSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlagSpec").field("name", &self.name).field("ty", &self.ty).finish_non_exhaustive()
    }
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    s.parse::<usize>().map_err(|_| format!("'{s}' is not a byte count (a non-negative integer)"))
}

/// A `bytes|none` value: `none` is no limit.
fn parse_bytes_or_none(s: &str) -> Result<Option<usize>, String> {
    if s == "none" { Ok(None) } else { parse_bytes(s).map(Some) }
}

fn show_bytes_or_none(b: Option<usize>) -> String {
    b.map_or_else(|| "none".to_owned(), |b| b.to_string())
}

/// Stores a parsed value in its field (a flag's `set`).
fn put<T>(field: &mut T, parsed: Result<T, String>) -> Result<(), String> {
    *field = parsed?;
    Ok(())
}

macro_rules! backend_flag {
    ($kind:ident, $field:ident, $what:literal) => {
        FlagSpec {
            name: match CollectiveKind::$kind.backend_flag() {
                Some(name) => name,
                None => panic!("a kind with a backend flag"),
            },
            ty: "auto|kernel|fallback",
            help: concat!(
                "how ",
                $what,
                " runs: auto = kernel where the rules and the tuning profile choose it, else fallback; kernel = kernel at any size wherever its guards (dtype, peer access, group size, processes) allow, else fallback saying why; fallback = always XLA's"
            ),
            get: |f| f.$field.name().to_owned(),
            set: |f, v| put(&mut f.$field, Backend::parse(v)),
        }
    };
}

/// Every emitter flag. `peerless flags` prints this table.
pub const FLAGS: &[FlagSpec] = &[
    backend_flag!(AllReduce, all_reduce_backend, "all-reduce (and all-reduce-start)"),
    backend_flag!(AllGather, all_gather_backend, "all-gather (and all-gather-start)"),
    backend_flag!(AllToAll, all_to_all_backend, "all-to-all"),
    backend_flag!(ReduceScatter, reduce_scatter_backend, "reduce-scatter"),
    backend_flag!(CollectivePermute, collective_permute_backend, "collective-permute (and its start)"),
    FlagSpec {
        name: flag::ONE_SHOT_MAX_BYTES,
        ty: "bytes",
        help: "largest all-reduce (operand bytes per device) for the one-shot kernel (XLA's cut-off)",
        get: |f| f.one_shot_max_bytes.to_string(),
        set: |f, v| put(&mut f.one_shot_max_bytes, parse_bytes(v)),
    },
    FlagSpec {
        name: flag::TWO_SHOT_MAX_BYTES,
        ty: "bytes",
        help: "largest all-reduce for the two-shot kernel; larger ones use the fallback (XLA's cut-off)",
        get: |f| f.two_shot_max_bytes.to_string(),
        set: |f, v| put(&mut f.two_shot_max_bytes, parse_bytes(v)),
    },
    FlagSpec {
        name: flag::COLLECTIVE_TIMEOUT_MS,
        ty: "milliseconds > 0",
        help: "how long a collective waits for its peers before reporting a hang",
        get: |f| f.collective_timeout_ms.to_string(),
        set: |f, v| {
            let ms = v.parse::<u64>().ok().filter(|&ms| ms > 0);
            put(
                &mut f.collective_timeout_ms,
                ms.ok_or_else(|| format!("'{v}' is not a positive number of milliseconds")),
            )
        },
    },
    FlagSpec {
        name: flag::HOST_TOPOLOGY,
        ty: "full|pairs:A-B,C-D,...",
        help: "peer links of the host backend: every pair (full) or only the listed links, both directions",
        get: |f| f.host_topology.to_string(),
        set: |f, v| put(&mut f.host_topology, HostTopology::parse(v)),
    },
    FlagSpec {
        name: flag::ALLOW_UNSAFE_PEER_TARGETS,
        ty: "true|false",
        help: "use peer kernels even on GPU targets whose cross-device atomics are known not to be visible to \
               peers (gfx90a, MI200-class); false: those devices use the fallback",
        get: |f| f.allow_unsafe_peer_targets.to_string(),
        set: |f, v| {
            put(&mut f.allow_unsafe_peer_targets, v.parse().map_err(|_| format!("'{v}' is neither true nor false")))
        },
    },
    FlagSpec {
        name: flag::XLA_ASYNC_ABOVE_BYTES,
        ty: "bytes|none",
        help: "inside XLA: partitioner-made collectives (is_spmd_generated) above this stay XLA's, which overlaps them with compute",
        get: |f| show_bytes_or_none(f.xla_async_above_bytes),
        set: |f, v| put(&mut f.xla_async_above_bytes, parse_bytes_or_none(v)),
    },
    FlagSpec {
        name: flag::OVERLAP_ABOVE_BYTES,
        ty: "bytes|none",
        help: "inside XLA:GPU: collectives above this run on a Peerless kernel on XLA's async compute stream, \
               overlapped with compute where XLA's scheduler can (and no longer stay XLA's under \
               xla_async_above_bytes, which then applies only where no async queue is), and so do those inside \
               JAX's own async pairs (any size); none (the default: realistic training steps measured slower with \
               calls beside compute): every call on the compute stream",
        get: |f| show_bytes_or_none(f.overlap_above_bytes),
        set: |f, v| put(&mut f.overlap_above_bytes, parse_bytes_or_none(v)),
    },
    FlagSpec {
        name: flag::ASYNC_BLOCKS,
        ty: "blocks",
        help: "inside XLA:GPU: the most thread blocks a call beside compute (overlap_above_bytes) launches with, \
               so the GEMMs it overlaps keep the other SMs",
        get: |f| f.async_blocks.to_string(),
        set: |f, v| {
            let b: u32 = v.parse().map_err(|_| format!("'{v}' is not a block count"))?;
            if !(1..=thunks::MAX_COLLECTIVE_BLOCKS).contains(&b) {
                return Err(format!("{b} blocks: the kernels take 1 to {}", thunks::MAX_COLLECTIVE_BLOCKS));
            }
            f.async_blocks = b;
            Ok(())
        },
    },
    FlagSpec {
        name: flag::FUSE_NORM,
        ty: "auto|true|false",
        help: "inside XLA: fuse a sum all-reduce run on a kernel with the residual add + RMSNorm (+ convert) after \
               it into one call; auto: where the fused kernel measured faster (XLA:CPU), true: wherever the \
               platform runs it (CPU, CUDA), false: never",
        get: |f| f.fuse_norm.map_or_else(|| "auto".to_owned(), |b| b.to_string()),
        set: |f, v| {
            f.fuse_norm = match v {
                "auto" => None,
                "true" => Some(true),
                "false" => Some(false),
                _ => return Err(format!("'{v}' is not auto, true or false")),
            };
            Ok(())
        },
    },
    FlagSpec {
        name: flag::COPY_ENGINES,
        ty: "none|auto|bytes",
        help: "inside XLA:GPU (CUDA): all-gather, all-to-all and collective-permute calls of at least this many \
               bytes per device move on the copy engines (device-to-device copies and stream memory operations: \
               no kernel, no SM, so the GEMMs beside them keep the SMs); auto: where the tuning profile measured \
               them fastest; none (the default until they are measured across NVLink)",
        get: |f| match f.copy_engines {
            CopyEngines::Off => "none".to_owned(),
            CopyEngines::Auto => "auto".to_owned(),
            CopyEngines::From(b) => b.to_string(),
        },
        set: |f, v| {
            f.copy_engines = match v {
                "none" => CopyEngines::Off,
                "auto" => CopyEngines::Auto,
                _ => CopyEngines::From(parse_bytes(v)?),
            };
            Ok(())
        },
    },
];

/// The flag table as text: one line per flag with its type, default and help.
pub fn flags_help() -> String {
    let mut out = String::new();
    for spec in FLAGS {
        out.push_str(&format!(
            "  --{}={}  (default {})\n      {}\n",
            spec.name,
            spec.ty,
            spec.default_value(),
            spec.help
        ));
    }
    out
}

fn flag_error(msg: String) -> EmitError {
    EmitError::InvalidFlag(format!("{msg}\nvalid flags:\n{}", flags_help().trim_end()))
}

impl Flags {
    /// Parses whitespace-separated `--name=value` flags over the defaults.
    pub fn parse(s: &str) -> Result<Flags, EmitError> {
        let mut flags = Flags::default();
        for arg in s.split_whitespace() {
            flags.apply(arg)?;
        }
        Ok(flags)
    }

    /// Reads [`ENV_VAR`]; unset means the defaults.
    pub fn from_env() -> Result<Flags, EmitError> {
        match std::env::var(ENV_VAR) {
            Ok(s) => Flags::parse(&s).map_err(|e| match e {
                EmitError::InvalidFlag(m) => EmitError::InvalidFlag(format!("in {ENV_VAR}: {m}")),
                other => other,
            }),
            Err(std::env::VarError::NotPresent) => Ok(Flags::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(flag_error(format!("{ENV_VAR} is not valid UTF-8"))),
        }
    }

    /// Sets one flag from `--name=value`.
    pub fn apply(&mut self, arg: &str) -> Result<(), EmitError> {
        let (spec, value) = split(arg)?;
        (spec.set)(self, value).map_err(|why| flag_error(format!("bad value for --{} ({}): {why}", spec.name, spec.ty)))
    }

    /// The backend flag governing `kind` and its name, or `None` for kinds Peerless has no kernel for.
    pub fn backend_for(&self, kind: CollectiveKind) -> Option<(Backend, &'static str)> {
        use CollectiveKind as K;
        let backend = match kind {
            K::AllReduce => self.all_reduce_backend,
            K::AllGather => self.all_gather_backend,
            K::AllToAll => self.all_to_all_backend,
            K::ReduceScatter => self.reduce_scatter_backend,
            K::CollectivePermute => self.collective_permute_backend,
            K::RaggedAllToAll | K::CollectiveBroadcast => return None,
        };
        Some((backend, kind.backend_flag()?))
    }
}

/// One `--name=value` argument: the flag it names and its value (not yet checked), or why it is not a flag.
fn split(arg: &str) -> Result<(&'static FlagSpec, &str), EmitError> {
    let Some(body) = arg.strip_prefix("--") else {
        return Err(flag_error(format!("'{arg}' is not a flag of the form --name=value")));
    };
    let Some((name, value)) = body.split_once('=') else {
        return Err(flag_error(format!("'{arg}' has no value (write --{body}=VALUE)")));
    };
    let Some(spec) = FLAGS.iter().find(|s| s.name == name) else {
        return Err(flag_error(format!("unknown flag '--{name}'")));
    };
    Ok((spec, value))
}

/// Whether a flags string (whitespace-separated `--name=value`, as [`Flags::parse`] reads it) sets the flag `name` (one
/// of [`thunks::flag`]'s). An argument that is no flag sets nothing here; [`Flags::apply`] reports it.
pub fn sets(flags: &str, name: &str) -> bool {
    flags.split_whitespace().filter_map(|arg| split(arg).ok()).any(|(spec, _)| spec.name == name)
}

/// Every flag as `--name=value`, so `Flags::parse(&flags.to_string())` round-trips.
impl fmt::Display for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args: Vec<String> = FLAGS.iter().map(|s| format!("--{}={}", s.name, s.value(self))).collect();
        f.write_str(&args.join(" "))
    }
}
