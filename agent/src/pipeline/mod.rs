//! The sampling pipeline: samplers → the tick → the system metrics files → the uploader.

pub mod sample;
pub mod sink;
pub mod system_file;
pub mod tick;
pub mod upload;
