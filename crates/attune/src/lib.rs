//! # Attune runtime core
//!
//! Where things are:
//! * `fault.rs`: the fault path (claim, read-ahead, place) and both deliveries.
//! * `evict.rs`: the CLOCK and the background evictor (mechanism; decisions come from
//!   the `attune-policy` crate).
//! * `tier/`: far tiers (`memory`, `file`) behind one store/load interface.
//! * `region.rs`: a region's chunks and their atomic state words.
//! * `sample.rs`: access sampling of resident pages (park, time the next touch).
//! * `engine.rs`: allocation, free, pin, prefetch; `runtime.rs`: the API entry points.
//! * `config.rs`: the options table, TOML file and environment.
//! * `topology.rs`: discovery of NUMA memory tiers from /sys; `numa.rs`: placement on
//!   NUMA tiers (mbind, weighted interleave, move_pages).

pub mod config;
pub mod engine;
pub mod evict;
pub mod fault;
pub mod fork;
pub mod hash;
pub mod log;
pub mod numa;
pub mod numa_heat;
pub mod pool;
pub mod region;
pub mod run_options;
pub mod runtime;
pub mod sample;
pub mod size;
pub mod small;
pub mod thread_gate;
pub mod tier;
pub mod tmm;
pub mod topology;

pub use attune_policy::Flags;
