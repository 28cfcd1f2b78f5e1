//! # attune-policy: which pages go where, as pure functions
//!
//! Mechanism (how pages move) lives in the `attune` crate; this crate only decides.
//! Inputs are plain values (tier state, region flags, heat), outputs are plans. Nothing
//! here touches the kernel, so every decision is unit-tested table-driven.
#![forbid(unsafe_code)]

pub mod ahead;
pub mod budget;
pub mod chunk;
pub mod delivery;
pub mod far;
pub mod flags;
pub mod heat;
pub mod huge;
pub mod numa;
pub mod place;
pub mod plan;
pub mod predict;
pub mod promote;
pub mod readahead;
pub mod share;
pub mod spread;
pub mod stream;
pub mod victim;
pub mod writeback;

pub use flags::Flags;
pub use plan::{plan_allocation, AllocationPlan, TierView};
