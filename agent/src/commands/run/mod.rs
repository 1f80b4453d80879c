//! `trainprof agent` and `trainprof run`, start to end, in four stages (ARCHITECTURE.md,
//! "`run`, stage by stage"), each a function of its own with what it guarantees:
//!
//! 1. `prepare` (`prepare.rs`): signals caught, what a person typed checked, the
//!    configuration read and the output folder chosen, before anything starts;
//! 2. `start` (`start.rs`): the uploader, CMD, the signal thread and the sampling thread;
//! 3. `wait` (`wait.rs`): until CMD exits (`run`) or a stop signal comes (`agent`), and
//!    sampling has sealed its file;
//! 4. `finish` (`finish.rs`): the end markers, the final upload, the page, the summary and
//!    the exit status, which is CMD's whatever happens in this stage.
//!
//! `main.rs` parses the arguments into [`Options`] and calls [`main`].

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use trainprof_config::Sources;

use crate::pipeline::upload;

pub mod end_markers;
mod finish;
pub mod output_root;
mod prepare;
mod start;
pub mod summary;
mod wait;

use self::finish::finish;
use self::prepare::prepare;
use self::start::start;
use self::wait::wait;

/// What `trainprof agent` / `trainprof run` were asked, beyond the configuration's sources.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--config`: a file named on the command line must be readable.
    pub config: Option<PathBuf>,
    /// `--local-path` was given: the trainer gets the root in `TRAINPROF_LOCAL_PATH`.
    pub local_path_flag: bool,
    /// `--disable` was given (for the start-up line).
    pub disable_flag: bool,
    /// `run` without `--no-report`: write `report.html` into the output folder at the end.
    pub report: bool,
    pub upload: UploadOptions,
    /// `--metrics-listen`: serve the latest tick there (docs/metrics.md).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `--s3-triggers`: relay `trainprof trigger s3://…` requests, looking every so often
    /// (`--s3-trigger-poll`; docs/trigger.md, "Every node of a job through S3").
    pub s3_triggers: Option<Duration>,
}

/// The upload flags.
#[derive(Debug, Clone, Default)]
pub struct UploadOptions {
    /// S3-compatible endpoint (`--s3-endpoint`).
    pub endpoint: Option<String>,
    /// Keep uploaded files on disk (`--keep-local`).
    pub keep_local: bool,
    /// Bytes waiting for S3 above which the oldest are deleted (`--spool-max-bytes`).
    pub spool_max_bytes: u64,
    /// Time allowed at the end to upload what is left (`--upload-deadline-s`).
    pub deadline: Duration,
    /// Files larger than this go in parts (`--s3-multipart-bytes`).
    pub multipart_bytes: u64,
}

/// Runs `trainprof agent` (`command` is `None`) or `trainprof run -- CMD` with the
/// configuration from `sources` (flags and overrides already applied), and returns the
/// exit status: CMD's, or 2 when something a person typed is wrong (126 / 127 when CMD
/// cannot be started).
pub fn main(opts: Options, sources: Sources, command: Option<Vec<OsString>>) -> ExitCode {
    crate::pipeline::cost::enroll(crate::pipeline::cost::Part::Main);
    let prepared = match prepare(opts, sources, command.is_some()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let started = match start(prepared, command) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // The start-up's time, charged before the long wait.
    crate::pipeline::cost::flush();
    finish(wait(started))
}

/// What the stages after [`prepare`] carry to the end of the job.
struct Job {
    /// The output folder; `None` when profiling is off or no folder could be used.
    root: Option<PathBuf>,
    /// The files under `root` before this run (the summary and the page count only this
    /// run's).
    before: HashSet<String>,
    upload: UploadOptions,
    /// `run` without `--no-report`.
    want_page: bool,
    uploader: Option<Uploading>,
    /// When the uploader had started and CMD was about to (the summary's wall time).
    started: Instant,
    /// The S3 trigger relay (`--s3-triggers`), told to stop when the job ends.
    relay: Option<crate::pipeline::trigger_relay::Relay>,
}

/// The uploader while `run` ends: its handle until the final upload is asked for, and the
/// report of one asked for early (`--upload-deadline-s 0`).
struct Uploading {
    handle: Option<upload::Handle>,
    url: crate::s3::store::S3Url,
    options: crate::s3::store::S3Options,
    early: Option<Option<upload::Report>>,
}

/// Seals what dead writers left under `root`, with one line when there was any.
fn repair(root: &Path) {
    upload::repair::repair_all(root, Duration::ZERO, std::time::SystemTime::now())
        .log(&mut Default::default());
}
