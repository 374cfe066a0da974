//! The CLI's tooling over XLA's own PJRT plugin with Peerless's pass and handlers registered: running HLO files
//! ([`xla_run`], with [`xla_run::flatten`] for modules XLA's runner needs flat), benchmarking collectives
//! ([`xla_bench`], `peerless bench`) and writing tuning profiles ([`xla_tune`], `peerless tune`). Kept out of `plugin`,
//! so the library JAX and XLA load carries none of it.

pub mod xla_bench;
pub mod xla_run;
pub mod xla_tune;
