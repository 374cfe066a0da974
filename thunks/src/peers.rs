//! Which devices can read and write each other's memory directly: an N×N table the decision rules consult. It is built
//! once per device set and shared: the host backend derives it from `--host_topology`; a GPU backend supplies its own
//! (driver peer-access query plus a real transfer probe, since drivers can report access that does not work) through
//! [`PeerAccessTable::from_fn`] and [`PeerAccessTable::cached`].

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

/// Which devices of a host can reach each other's memory directly. Stands in for the hardware probe on the host backend
/// and in tests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum HostTopology {
    /// Every device reaches every other (`full`).
    #[default]
    FullMesh,
    /// Only the listed links, both directions (`pairs:0-1,2-3`).
    Pairs(Vec<(usize, usize)>),
}

/// Largest device id a `pairs:` topology may name.
pub const MAX_TOPOLOGY_DEVICE: usize = 4095;

impl HostTopology {
    /// Parses `full` or `pairs:A-B,C-D,...` (an empty list means no links).
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "full" {
            return Ok(Self::FullMesh);
        }
        let Some(list) = s.strip_prefix("pairs:") else {
            return Err(format!("'{s}' is neither 'full' nor 'pairs:A-B,C-D,...'"));
        };
        let mut pairs = Vec::new();
        for item in list.split(',').filter(|i| !i.is_empty()) {
            let parsed =
                item.split_once('-').and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
            match parsed {
                Some((a, b)) if a != b && a <= MAX_TOPOLOGY_DEVICE && b <= MAX_TOPOLOGY_DEVICE => pairs.push((a, b)),
                _ => {
                    return Err(format!(
                        "'{item}' in '{s}' is not a link A-B between two different devices 0..={MAX_TOPOLOGY_DEVICE}"
                    ));
                }
            }
        }
        Ok(Self::Pairs(pairs))
    }
}

impl fmt::Display for HostTopology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FullMesh => f.write_str("full"),
            Self::Pairs(p) => {
                let items: Vec<String> = p.iter().map(|(a, b)| format!("{a}-{b}")).collect();
                write!(f, "pairs:{}", items.join(","))
            }
        }
    }
}

/// GPU targets whose cross-device atomics are not visible to peers while kernels run, with why: Peerless's kernels
/// synchronise through system-scope flags in peers' memory, so there every link counts as missing unless
/// `--allow_unsafe_peer_targets=true`. XLA excludes MI200 from its collective kernels likewise (openxla/xla#48069).
pub const PEER_ATOMICS_NOT_VISIBLE: &[(&str, &str)] =
    &[("gfx90a", "MI200-class: cross-device atomics are not visible to peers (openxla/xla#48069)")];

/// What a cached table was computed for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerTableKey {
    /// The host backend's simulated devices under a `--host_topology`.
    HostTopology { num_devices: usize, topology: HostTopology },
    /// A hardware backend's device set (`backend` names it, e.g. `cuda`; `devices` are its ordinals, in the order table
    /// indices refer to them).
    Backend { backend: String, devices: Vec<usize> },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Links {
    /// Every device reaches every other.
    All,
    /// Only these directed links.
    Set(BTreeSet<(usize, usize)>),
    /// Row-major N×N, `from * n + to`.
    Matrix(Vec<bool>),
}

/// Peer access between `n` devices: `can_access(a, b)` says whether device `a` can address device `b`'s memory.
/// Self-access is always true; ids `>= n` never have access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerAccessTable {
    n: usize,
    links: Links,
    /// Where the table came from, for decision reasons (`host_topology pairs:0-1,2-3`).
    source: String,
}

type Cache = Mutex<HashMap<PeerTableKey, Arc<PeerAccessTable>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

impl PeerAccessTable {
    /// A table from a predicate over device pairs, evaluated once per ordered pair (`n × n` entries, so `n` should be a
    /// real device count). Backends use this with their hardware query.
    pub fn from_fn(n: usize, source: impl Into<String>, mut can_access: impl FnMut(usize, usize) -> bool) -> Self {
        let m = (0..n * n).map(|k| k / n == k % n || can_access(k / n, k % n)).collect();
        PeerAccessTable { n, links: Links::Matrix(m), source: source.into() }
    }

    /// Every device reaches every other.
    pub fn full(n: usize, source: impl Into<String>) -> Self {
        PeerAccessTable { n, links: Links::All, source: source.into() }
    }

    /// The table for `n` host-backend devices under `topology`, computed once per `(n, topology)` and shared
    /// process-wide. `pairs:` links are symmetric; links that name a device `>= n` are ignored.
    pub fn for_host_topology(n: usize, topology: &HostTopology) -> Arc<Self> {
        let key = PeerTableKey::HostTopology { num_devices: n, topology: topology.clone() };
        Self::cached(key, || {
            let source = format!("{} {topology}", crate::flag::HOST_TOPOLOGY);
            match topology {
                HostTopology::FullMesh => Self::full(n, source),
                HostTopology::Pairs(pairs) => {
                    let set =
                        pairs.iter().filter(|&&(a, b)| a < n && b < n).flat_map(|&(a, b)| [(a, b), (b, a)]).collect();
                    PeerAccessTable { n, links: Links::Set(set), source }
                }
            }
        })
    }

    /// The cached table for `key`, building it with `build` the first time. A backend calls this with
    /// [`PeerTableKey::Backend`] so its probe runs once per device set.
    pub fn cached(key: PeerTableKey, build: impl FnOnce() -> PeerAccessTable) -> Arc<Self> {
        // A poisoned lock only means another thread panicked mid-insert; the map is still a valid map, so keep using
        // it.
        let mut map = cache().lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(map.entry(key).or_insert_with(|| Arc::new(build())))
    }

    /// This table with every cross-device link of a device whose GPU target (`targets[i]` for table index `i`, e.g.
    /// `gfx90a`, or a full `gfx90a:sramecc+:xnack-`) is listed in [`PEER_ATOMICS_NOT_VISIBLE`] removed, unless
    /// `allow_unsafe` (the emitter's `--allow_unsafe_peer_targets`). The source names the excluded target, why, and the
    /// flag, so decision reasons say what to change. Returns `self` when nothing is excluded.
    pub fn with_target_policy(self: &Arc<Self>, targets: &[&str], allow_unsafe: bool) -> Arc<Self> {
        if allow_unsafe {
            return Arc::clone(self);
        }
        let base = |t: &str| t.split(':').next().unwrap_or(t).to_string();
        let excluded: Vec<Option<&'static str>> = (0..self.n)
            .map(|i| {
                let t = targets.get(i).map(|t| base(t))?;
                PEER_ATOMICS_NOT_VISIBLE.iter().find(|(name, _)| *name == t).map(|(_, why)| *why)
            })
            .collect();
        let mut notes: Vec<String> = Vec::new();
        for (i, why) in excluded.iter().enumerate() {
            if let Some(why) = why {
                let note = format!("{} excluded: {why}", base(targets[i]));
                if !notes.contains(&note) {
                    notes.push(note);
                }
            }
        }
        if notes.is_empty() {
            return Arc::clone(self);
        }
        let source = format!(
            "{}; {}; --{}=true forces kernels",
            self.source,
            notes.join("; "),
            crate::flag::ALLOW_UNSAFE_PEER_TARGETS
        );
        Arc::new(PeerAccessTable::from_fn(self.n, source, |a, b| {
            excluded[a].is_none() && excluded[b].is_none() && self.can_access(a, b)
        }))
    }

    /// Number of devices the table covers.
    pub fn num_devices(&self) -> usize {
        self.n
    }

    /// Where the table came from, e.g. `host_topology pairs:0-1,2-3`.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether device `from` can address device `to`'s memory.
    pub fn can_access(&self, from: usize, to: usize) -> bool {
        if from >= self.n || to >= self.n {
            return false;
        }
        if from == to {
            return true;
        }
        match &self.links {
            Links::All => true,
            Links::Set(s) => s.contains(&(from, to)),
            Links::Matrix(m) => m.get(from * self.n + to).copied().unwrap_or(false),
        }
    }

    /// The first pair of `devices` (in listed order) without access in both directions, if any.
    pub fn missing_link(&self, devices: &[usize]) -> Option<(usize, usize)> {
        for (i, &a) in devices.iter().enumerate() {
            for &b in &devices[i + 1..] {
                if !(self.can_access(a, b) && self.can_access(b, a)) {
                    return Some((a, b));
                }
            }
        }
        None
    }
}
