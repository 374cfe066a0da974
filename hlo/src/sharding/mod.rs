//! The sharding analysis: which value each of N partitions holds, read from the module's
//! shardings before anything runs.
//!
//! JAX's `shard_map` modules (Shardy and GSPMD forms) run in partition mode with per-device
//! values: entry parameters may carry shards (`sharding={devices=..}`, Shardy's
//! `xla.sdy.sharding`, or the shard_map custom call that consumes them), the shard_map
//! custom calls ([`is_sharding_call`]) mark where values switch between global and local
//! shapes, and the entry result may be sharded. [`analyze`] turns that into a [`Plan`]: a
//! [`Tag`] per entry value, where full values must be cut into shards ([`Tiling`]), and the
//! per-device shapes of the entry's parameters and result. Outside shard_map, sharded values
//! may only flow through elementwise ops, tuples, `get-tuple-element`, `copy` and `convert`;
//! anything else needs XLA's SPMD partitioner and is an [`crate::ErrorKind::Unsupported`]
//! error ([`Plan::deferred`]).
//!
//! It lives here rather than in a backend because it is a compile-time analysis of the IR
//! that every consumer needs alike: `runs` gives each device its shard of the entry's values by
//! it (the CLI's runs through XLA, the conformance goldens). Cutting a value into its shard is the consumer's (it needs array
//! code): [`Tiling::shard_window`] says which window.

mod plan;
mod tiling;

pub use plan::{Plan, Tag, analyze, is_sharding_call};
pub use tiling::Tiling;
