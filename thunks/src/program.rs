//! Per-device thunk programs: what the emitter hands a backend after buffer assignment.
//!
//! A [`ThunkProgram`] is plain data: a list of [`Thunk`]s in execution order, the size
//! of the device's arena, and where the entry parameters and results live in it. Every
//! offset is into one per-device arena, and the arena is *symmetric*: a value has the
//! same offset on every device, so a kernel finds a peer's copy of its operand at the
//! offset of its own.

use std::fmt;

use hlo::{ArrayShape, InstrId, Shape};

use crate::{CollectiveConfig, Implementation};

/// A byte range of a device's arena.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Region {
    pub offset: usize,
    pub len: usize,
}

impl Region {
    pub const EMPTY: Region = Region { offset: 0, len: 0 };

    pub fn new(offset: usize, len: usize) -> Self {
        Region { offset, len }
    }

    /// One past the last byte, or `None` on overflow.
    pub fn end(&self) -> Option<usize> {
        self.offset.checked_add(self.len)
    }

    /// Whether the two ranges share a byte (empty regions overlap nothing).
    pub fn overlaps(&self, other: &Region) -> bool {
        self.len > 0
            && other.len > 0
            && self.offset < other.offset.saturating_add(other.len)
            && other.offset < self.offset.saturating_add(self.len)
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#x}+{}]", self.offset, self.len)
    }
}

/// One step of a device's program. All variants are plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Thunk {
    /// A non-collective instruction, run by the backend's own evaluator (the host
    /// backend evaluates it with the reference interpreter's per-op code). `inputs` are
    /// the array leaves of its operands, depth-first over the operands in order;
    /// `outputs` the array leaves of its result.
    Compute {
        instr: InstrId,
        name: String,
        inputs: Vec<Region>,
        outputs: Vec<Region>,
        /// Per operand, its per-device shape: how `inputs` group into operand values (a
        /// shard's shape where shard_map made one). The thunk carries it so a backend needs
        /// no side table indexed by thunk number.
        operand_shapes: Vec<Shape>,
    },
    /// A device-local copy of `len` bytes (`copy`, the first half of `copy-start`).
    Copy { name: String, src: usize, dst: usize, len: usize },
    /// A collective (synchronous, or the `-start` of an async pair: the start runs it).
    Collective {
        instr: InstrId,
        name: String,
        config: CollectiveConfig,
        implementation: Implementation,
        /// Operand leaves.
        inputs: Vec<Region>,
        /// The per-device shape of each operand leaf, in `inputs` order.
        operand_shapes: Vec<ArrayShape>,
        /// Result leaves (for a `-start`, only the results, not the aliased operands).
        outputs: Vec<Region>,
        /// Staging space, this collective's own for the lifetime of the arena (a kernel
        /// without an end barrier may leave while a peer still reads it).
        scratch: Region,
        /// Signal flags, this collective's own for the lifetime of the arena (they keep
        /// counting across executions).
        signals: Region,
    },
    /// The `-done` of an async collective: a wait point for thunk `start`.
    CollectiveDone { name: String, start: usize },
}

impl Thunk {
    /// The instruction name the thunk comes from.
    pub fn name(&self) -> &str {
        match self {
            Thunk::Compute { name, .. }
            | Thunk::Copy { name, .. }
            | Thunk::Collective { name, .. }
            | Thunk::CollectiveDone { name, .. } => name,
        }
    }

    /// A short label for progress and hang reports: `compute 'x'`, `all-reduce 'ar'`.
    pub fn label(&self) -> String {
        match self {
            Thunk::Compute { name, .. } => format!("compute '{name}'"),
            Thunk::Copy { name, .. } => format!("copy '{name}'"),
            Thunk::Collective { name, config, .. } => format!("{} '{name}'", config.op),
            Thunk::CollectiveDone { name, .. } => format!("done '{name}'"),
        }
    }
}

/// One device's program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThunkProgram {
    pub device: usize,
    pub thunks: Vec<Thunk>,
    /// Bytes of the device's arena; every region lies inside it.
    pub arena_bytes: usize,
    /// Per entry parameter, its array leaves (copied in before the first thunk).
    pub params: Vec<Vec<Region>>,
    /// The entry result's array leaves (copied out after the last thunk).
    pub results: Vec<Region>,
}

fn regions(rs: &[Region]) -> String {
    let parts: Vec<String> = rs.iter().map(Region::to_string).collect();
    format!("({})", parts.join(", "))
}

impl fmt::Display for ThunkProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "device {}: arena {} bytes, {} thunks", self.device, self.arena_bytes, self.thunks.len())?;
        for (i, p) in self.params.iter().enumerate() {
            writeln!(f, "  param {i} {}", regions(p))?;
        }
        for (i, t) in self.thunks.iter().enumerate() {
            write!(f, "  #{i:<3} ")?;
            match t {
                Thunk::Compute { name, inputs, outputs, .. } => {
                    writeln!(f, "compute {name} {} -> {}", regions(inputs), regions(outputs))?
                }
                Thunk::Copy { name, src, dst, len } => {
                    writeln!(f, "copy {name} {} -> {}", Region::new(*src, *len), Region::new(*dst, *len))?
                }
                Thunk::Collective { name, config, implementation, inputs, outputs, scratch, signals, .. } => writeln!(
                    f,
                    "collective {name} {} -> {} scratch={scratch} signals={signals}\n         {config} [{implementation}]",
                    regions(inputs),
                    regions(outputs)
                )?,
                Thunk::CollectiveDone { name, start } => writeln!(f, "done {name} (waits for #{start})")?,
            }
        }
        writeln!(f, "  results {}", regions(&self.results))
    }
}

/// Sizes of the per-collective resources a backend needs, supplied by the backend
/// (the emitter does not depend on any backend).
pub trait ScratchSizer {
    /// Scratch (staging) bytes one device needs for `config` run as `implementation`.
    fn scratch_bytes(&self, config: &CollectiveConfig, implementation: Implementation) -> usize;
    /// Signal-flag bytes one device needs for `config` run as `implementation`.
    fn signal_bytes(&self, config: &CollectiveConfig, implementation: Implementation) -> usize;
}

/// A sizer that asks for nothing: for printing programs without a backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoScratch;

impl ScratchSizer for NoScratch {
    fn scratch_bytes(&self, _: &CollectiveConfig, _: Implementation) -> usize {
        0
    }
    fn signal_bytes(&self, _: &CollectiveConfig, _: Implementation) -> usize {
        0
    }
}

/// What a set of programs declares in [`Backend::prepare`]: the resources to allocate
/// once per executable in [`Backend::initialize`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub num_devices: usize,
    /// Arena bytes per device (values, scratch and signals together).
    pub arena_bytes: usize,
    /// Scratch bytes per device, summed over collectives (a part of `arena_bytes`).
    pub scratch_bytes: usize,
    /// Signal bytes per device (a part of `arena_bytes`, never reused).
    pub signal_bytes: usize,
    pub num_collectives: usize,
}

impl Resources {
    /// The resources `programs` (one per device) declare.
    pub fn of(programs: &[ThunkProgram]) -> Resources {
        let mut r = Resources { num_devices: programs.len(), ..Resources::default() };
        for p in programs {
            r.arena_bytes = r.arena_bytes.max(p.arena_bytes);
        }
        if let Some(p) = programs.first() {
            for t in &p.thunks {
                if let Thunk::Collective { scratch, signals, .. } = t {
                    r.num_collectives += 1;
                    r.scratch_bytes = r.scratch_bytes.saturating_add(scratch.len);
                    r.signal_bytes = r.signal_bytes.saturating_add(signals.len);
                }
            }
        }
        r
    }
}

/// XLA's three thunk phases for a backend that runs [`ThunkProgram`]s.
///
/// `prepare` declares resources (scratch, signal flags, communicators: here, the
/// arena size) without touching a device; `initialize` allocates them once per
/// executable and device; `execute` only launches: it copies arguments in, runs
/// every device's program, and copies results out.
pub trait Backend {
    /// What `initialize` produces and `execute` runs on (a cluster of device arenas).
    type Initialized;
    type Error;

    /// Declares the resources `programs` need.
    fn prepare(&self, programs: &[ThunkProgram]) -> Result<Resources, Self::Error>;

    /// Allocates the declared resources, once per executable.
    fn initialize(&self, resources: &Resources) -> Result<Self::Initialized, Self::Error>;

    /// Runs every device's program once: `args[d]` are device `d`'s entry parameters;
    /// returns each device's entry result.
    fn execute(
        &self,
        initialized: &Self::Initialized,
        programs: &[ThunkProgram],
        args: &[Vec<hlo::Literal>],
    ) -> Result<Vec<hlo::Literal>, Self::Error>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_overlap() {
        let a = Region::new(0, 64);
        assert!(a.overlaps(&Region::new(63, 1)));
        assert!(!a.overlaps(&Region::new(64, 8)));
        assert!(!a.overlaps(&Region::new(10, 0)));
        assert_eq!(Region::new(128, 4).to_string(), "[0x80+4]");
        assert_eq!(Region::new(usize::MAX, 2).end(), None);
    }
}
