//! What the `attune` command shares with the benchmark lab (`bench/lab`, `attune-lab`):
//! where the Python side is installed, and the plots; and the execution history, a
//! library module so that its fuzz target reads it as `attune run` does.

#![forbid(unsafe_code)]

pub mod history;
pub mod memstore;
pub mod python;
