//! The `trainprof` binary's library: everything but argument parsing lives here so that
//! it can be tested without spawning the binary.
//!
//! * [`check`]: `trainprof config check`;
//! * [`sample`]: the samplers (procfs, cgroup, NVML, the trainer's process tree);
//! * the system metrics writer, the sampling loop and `trainprof run` / `trainprof agent`
//!   build on them; the uploader on the same configuration.

pub mod check;
pub mod child;
pub mod launch;
pub mod log;
pub mod sample;
pub mod signals;
pub mod system;
pub mod tick;
pub mod upload;
