//! A run of an HLO module on N devices, as `peerless run`, the conformance suite and the benchmarks describe one: how
//! device ids map onto the module's replicas or partitions ([`RunConfig`], [`Mode`]), the value each device holds of
//! every entry parameter ([`local_param_shapes`]: a shard where the parameter's sharding says so), and the inputs and
//! outputs as npz files ([`io`]). XLA's runs (through `tools::xla_run`), the CLI and the conformance goldens share it;
//! it runs nothing itself.

pub mod io;

use hlo::{Module, Shape};

/// How device ids map onto the module's replicas and partitions (the emitter resolves replica groups with the same
/// rule).
pub use hlo::analysis::DeviceMode as Mode;
pub use io::IoError as Error;

/// What to run on.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub num_devices: usize,
    pub mode: Mode,
}

/// Checks the configuration against the module's header.
pub fn check_config(module: &Module, cfg: &RunConfig) -> Result<(), Error> {
    if cfg.num_devices == 0 {
        return Err(Error::Mismatch("num_devices must be at least 1".into()));
    }
    if module.comps.get(module.entry).is_none() {
        return Err(Error::Mismatch("module has no entry computation".into()));
    }
    let (declared, what) = match cfg.mode {
        Mode::Replica => (module.config.replica_count, "replica_count"),
        Mode::Partition => (module.config.num_partitions, "num_partitions"),
    };
    if declared > 1 && declared as usize != cfg.num_devices {
        return Err(Error::Mismatch(format!(
            "module declares {what}={declared}, asked to run on {} devices",
            cfg.num_devices
        )));
    }
    Ok(())
}

/// Per device, per entry parameter: the shape of the value that device holds. In partition mode a parameter sharded by
/// `sharding={devices=..}`, by Shardy's `xla.sdy.sharding`, or by the shard_map custom call that consumes it holds its
/// shard (each dimension divided by its tile count, rounded up); otherwise (and in replica mode) the full declared
/// shape.
pub fn local_param_shapes(module: &Module, cfg: &RunConfig) -> Result<Vec<Vec<Shape>>, Error> {
    check_config(module, cfg)?;
    let shapes = match cfg.mode {
        Mode::Partition => hlo::sharding::param_shapes(module, cfg.num_devices)
            .map_err(|e| Error::Mismatch(format!("{}: {}", module.name, e.reason(module))))?,
        Mode::Replica => module.entry_param_shapes().into_iter().cloned().collect(),
    };
    Ok(vec![shapes; cfg.num_devices])
}
