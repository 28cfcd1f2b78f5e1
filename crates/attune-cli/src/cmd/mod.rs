pub mod bench;
pub mod config;
pub mod kernel_swap;
pub mod lbench;
pub mod numa;
pub mod run;
pub mod topology;
pub mod usage;
