//! Synchronisation shared by the subsystems: the fork gate every runtime operation runs
//! inside, and the small allocator's per-thread gate.

pub mod gate;
pub mod thread_gate;
