//! # Attune runtime core
//!
//! Where things are (each module only uses the ones listed before it):
//! * `config.rs`, `log.rs`, `size.rs`, `error.rs`: options, logging, sizes, the C API's
//!   error messages.
//! * `sync/`: the fork gate every runtime operation runs inside, the small allocator's
//!   per-thread gate (its protocol in `flag_gate.rs`), and `shim.rs`, the atomics the
//!   loom model swaps (`tests/loom.rs`).
//! * `region.rs`: a region's chunks and their atomic state words; `tier/`: far tiers
//!   (`memory`, `file`) behind one store/load interface.
//! * `paging/`: the paging engine: the fault path (`paging/fault.rs`), replacement
//!   (`paging/evict.rs`), allocation and pinning (`paging/ops.rs`), access sampling.
//!   Decisions come from the `attune-policy` crate.
//! * `topology.rs`: NUMA memory tiers from /sys; `numa/`: placement on NUMA tiers
//!   (mbind, weighted interleave, move_pages) and their write heat.
//! * `small.rs`: small objects in per-class arenas.
//! * `engine.rs`: the composition root (builds the subsystems, starts their threads).
//! * `fork.rs`: a forked child takes the engine over.
//! * `daemon_client.rs`: the connection to the node daemon (`attuned`).
//! * `runtime.rs`: the process-wide state behind the C API, statistics and phases.
//! * `inject.rs`: failure injection for the failure rules' tests (`ATTUNE_INJECT`).

// No unsafe code: raw memory, mimalloc and the published runtime are reached through
// attune-sys and its address contract (attune-sys/src/lib.rs).
#![forbid(unsafe_code)]

pub mod config;
pub mod daemon_client;
pub mod engine;
pub mod error;
pub mod fork;
pub mod hash;
pub mod inject;
pub mod log;
pub mod numa;
pub mod paging;
pub mod pool;
pub mod region;
pub mod run_options;
pub mod runtime;
pub mod size;
pub mod small;
pub mod sync;
pub mod tier;
pub mod topology;

pub use attune_policy::Flags;
