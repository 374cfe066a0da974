//! The sharding analysis: which value each of N partitions holds, read from the module's
//! shardings before anything runs, so that `runs` gives each device its shard of the entry's
//! parameters and expects its shard of the result (the CLI's runs through XLA, the
//! conformance goldens). XLA's SPMD partitioner runs the module.
//!
//! JAX's `shard_map` modules (Shardy and GSPMD forms) run in partition mode with per-device
//! values: entry parameters may carry shards (`sharding={devices=..}`, Shardy's
//! `xla.sdy.sharding`, or the shard_map custom call that consumes them), the shard_map
//! custom calls mark where values switch between global and local shapes, and the entry
//! result may be sharded. [`analyze`] turns that into a [`Plan`]: a [`Tag`] per entry value
//! ([`Tiling`]: tiles per dimension) and the per-device shapes of the entry's parameters and
//! result. Outside shard_map, sharded values keep their tiling through elementwise ops,
//! tuples, `get-tuple-element`, `copy` and `convert`; a sharding that does not fit, or
//! shards mixed in ways only the SPMD partitioner resolves, is an error about its instruction.

mod plan;
mod tiling;

pub use plan::{Plan, Tag, analyze};
pub use tiling::Tiling;
