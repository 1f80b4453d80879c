//! Stage 3 of `run`: until the job ends.

use std::io;
use std::process::ExitStatus;
use std::sync::mpsc;
use std::time::Duration;

use super::Job;
use super::start::Started;
use crate::log;
use crate::pipeline::sink::LoopCounts;
use crate::pipeline::tick::{Clock as _, SystemClock};

/// How the job ended.
pub(super) struct Ended {
    pub job: Job,
    /// CMD's exit status as `wait` gave it (`None`: `agent`).
    pub status: Option<io::Result<ExitStatus>>,
    /// Whether a sampling thread ran.
    pub sampled: bool,
    /// What it counted, when it sealed its file in time.
    pub counts: Option<LoopCounts>,
}

/// Waits until CMD exits (`run`) or a stop signal comes (`agent`), then stops sampling and
/// waits for it to seal its file, at most [`FINISH_TIMEOUT`].
///
/// Guarantees: CMD's status is taken as it exited, before anything of the end runs, and
/// sampling cannot hold `run` longer than [`FINISH_TIMEOUT`] (a sampler that hangs or
/// panics is one line; its open file is repaired at the next start).
pub(super) fn wait(s: Started) -> Ended {
    let Started { mut job, child, sampling, stop } = s;
    let status = match child {
        Some((mut c, trainer)) => {
            let st = trainer.wait(&mut c);
            // Told to stop, never waited for: the relay cannot hold the final upload.
            if let Some(r) = job.relay.take() {
                r.stop();
            }
            // `--upload-deadline-s 0`: no upload starts once the command has exited (docs/run.md,
            // "Upload to S3 and crash repair"), so the uploader hears it before the last seal
            // wakes it.
            if job.upload.deadline.is_zero()
                && let Some(u) = job.uploader.as_mut()
                && let Some(h) = u.handle.take()
            {
                u.early = Some(h.finish(Duration::ZERO));
            }
            stop.request();
            Some(st)
        }
        None => {
            SystemClock::new(stop.clone()).wait_until(Duration::MAX);
            if let Some(r) = job.relay.take() {
                r.stop();
            }
            None
        }
    };
    let counts = sampling.as_ref().and_then(|done| match done.recv_timeout(FINISH_TIMEOUT) {
        Ok(c) => Some(c),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            log!(
                "sampling did not stop within {} s; its open file is repaired at the next start",
                FINISH_TIMEOUT.as_secs()
            );
            None
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            log!("sampling ended abnormally; its open file is repaired at the next start");
            None
        }
    });
    Ended { job, status, sampled: sampling.is_some(), counts }
}

/// How long `run` waits for sampling to seal its file once the command has exited.
const FINISH_TIMEOUT: Duration = Duration::from_secs(10);
