//! The paging engine: managed regions whose chunks move between DRAM and far tiers
//! through userfaultfd. Layered bottom up, no module importing one above it:
//!
//! * `pager.rs`: the state (userfaultfds, tiers, regions, DRAM accounting, budget).
//! * `behind.rs`: the ring of chunks streams have passed (first victims).
//! * `removes.rs`: the program's own discards the kernel reported, not acted on yet.
//! * `sample.rs`: what the fault path records for access sampling.
//! * `unshare.rs`: copies pages a fork left shared, so they can move again.
//! * `fill.rs`: chunks of one repeated word, kept as that word (no tier holds them).
//! * `evict.rs`: the CLOCK and the background evictor (decisions: `attune_policy::victim`).
//! * `limit.rs`: the budget capped by the memory cgroup's usage, read on the evictor's tick.
//! * `room.rs`: a fault waiting for the node daemon to grow a full far tier.
//! * `fault.rs`: the fault path (claim, read-ahead, place) and both deliveries.
//! * `ops.rs`: allocate, free, pin, hold, discard, prefetch.
//! * `sampler.rs`: the sampler thread and the online flag prediction; `progclock.rs`, the
//!   program's clock it times samples by; `cputimes.rs`, what the program's threads ran
//!   and waited for a CPU.

mod behind;
pub mod cputimes;
pub mod evict;
pub mod fault;
pub mod fill;
pub mod huge;
pub(crate) mod limit;
pub mod ops;
pub mod pager;
pub mod progclock;
mod removes;
pub mod room;
pub mod sample;
pub mod sampler;
mod unshare;

pub use pager::{
    AllocOptions, Board, CgroupStats, ClockState, Counters, InitError, Pager,
    KERNEL_ACCESS_MAY_FAIL, MAX_RUN, THREAD_FOR_NEW_REGIONS,
};
