pub mod bench;
pub mod config;
pub mod run;
pub mod topology;
