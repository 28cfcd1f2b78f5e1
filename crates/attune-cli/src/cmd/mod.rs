pub mod bench;
pub mod config;
pub mod topology;
