//! The `trainprof` binary's library: everything but argument parsing lives here (the
//! binary's `main.rs` turns the command line into [`run::Options`] and calls [`run::main`] or
//! [`check`]), so that all of it can be tested without spawning the binary.
//!
//! * [`run`]: `trainprof agent` / `trainprof run -- CMD`, start to end;
//! * [`check`]: `trainprof config check`;
//! * [`output_root`]: the output folder (the configured one or a checked fallback);
//! * [`child`], [`signals`]: CMD in its own process group, signals passed on to it;
//! * [`sample`]: the samplers (procfs, cgroup, NVML, the trainer's process tree) and their
//!   probe; [`tick`]: the sampling loop; [`system_file`]: the system metrics files it writes;
//! * [`upload`]: the S3 uploader and the repair of dead writers' files;
//! * [`end_markers`], [`summary`]: what the end of a job leaves on disk and on stderr;
//! * [`report_cmd`]: `trainprof report` / `trainprof trace` (the `trainprof_report` crate),
//!   their input (a LocalPath or S3) and output files, and the report at the end of `run`;
//! * [`log`]: the `trainprof: ` log lines.

pub mod check;
pub mod child;
pub mod end_markers;
pub mod log;
pub mod output_root;
pub mod report_cmd;
pub mod run;
pub mod sample;
pub mod signals;
pub mod summary;
pub mod system_file;
pub mod tick;
pub mod upload;
