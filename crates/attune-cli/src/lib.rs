//! What the `attune` command shares with the benchmark lab (`bench/lab`, `attune-lab`):
//! where the Python side is installed, and the plots.

#![forbid(unsafe_code)]

pub mod python;
