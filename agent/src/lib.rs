//! The `trainprof` binary's library: everything but argument parsing lives here (the
//! binary's `main.rs` turns the command line into [`commands::run::Options`] and calls
//! [`commands::run::main`] or another command), so that all of it can be tested without
//! spawning the binary. The folders are the architecture (ARCHITECTURE.md, "The agent"):
//!
//! * [`commands`]: what a user runs: `agent` / `run` ([`commands::run`], in stages),
//!   `config check` ([`commands::check`]), `report` / `trace` and the page at the end of
//!   `run` ([`commands::report`]);
//! * [`pipeline`]: the samplers ([`pipeline::sample`]), the sampling loop
//!   ([`pipeline::tick`]) and the sinks it hands each tick to ([`pipeline::sink`], built in
//!   [`pipeline::sinks`]; the system metrics files of [`pipeline::system_file`] are one), and
//!   the S3 uploader with the repair of dead writers' files ([`pipeline::upload`]);
//! * [`s3`]: the S3 client and store ([`s3::store`]) and the download of a job's files
//!   ([`s3::download`]), for the uploader and the commands;
//! * [`process`]: CMD in its own process group ([`process::child`]) and the signals passed
//!   on to it ([`process::signals`]);
//! * [`mod@log`]: the `trainprof: ` log lines.

pub mod commands;
pub mod log;
pub mod pipeline;
pub mod process;
pub mod s3;
