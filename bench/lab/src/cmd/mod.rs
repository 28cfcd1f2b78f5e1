pub mod bench;
pub mod daemon_bench;
pub mod kernel_swap;
pub mod lbench;
