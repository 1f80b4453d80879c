//! The sampling pipeline: the samplers → the tick → its sinks (the system metrics files,
//! the metrics endpoint) → the uploader.

pub mod cost;
pub mod hangs;
pub mod metrics;
pub mod sample;
pub mod sink;
pub mod sinks;
pub mod system_file;
pub mod tick;
pub mod trigger_relay;
pub mod upload;
