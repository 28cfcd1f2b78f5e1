pub mod config;
pub mod doctor;
pub mod numa;
pub mod profile;
pub mod run;
pub mod status;
pub mod topology;
pub mod usage;
