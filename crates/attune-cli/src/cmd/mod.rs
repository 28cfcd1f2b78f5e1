pub mod bench;
pub mod config;
pub mod kernel_swap;
pub mod run;
pub mod topology;
