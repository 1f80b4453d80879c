//! Stage 4 of `run`: what the end of a job leaves on disk, in S3 and on stderr.

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::path::Path;
use std::process::{ExitCode, ExitStatus};
use std::time::{Duration, Instant};

use super::summary::{self, SelfCost};
use super::wait::Ended;
use super::{Job, UploadOptions, Uploading, end_markers, repair};
use crate::commands::report::{self as page, EndPage};
use crate::log;
use crate::pipeline::sample::process::self_usage;
use crate::pipeline::sink::LoopCounts;
use crate::pipeline::tick::{Clock as _, Stop, SystemClock};
use crate::pipeline::upload;

/// Repairs what a killed trainer left, writes the end markers, makes the final upload and
/// the page (in the order the upload flags call for), prints the summary, and returns the
/// exit status.
///
/// Guarantees: the exit status is CMD's as [`super::wait`] took it (128 + the signal that
/// ended it; 1 when its status was lost; 0 for `agent`); nothing here can change it: the
/// markers, the upload, the page (made by a child process with bounds of its own) and the
/// summary each end in lines, and the upload and the page are bounded in time
/// (`--upload-deadline-s`; the page at least [`page::MIN_PAGE_WALL`]). Without a sampling
/// thread (profiling off, or it could not start) this stage only returns the status.
pub(super) fn finish(ended: Ended) -> ExitCode {
    let Ended { job, status, sampled, counts } = ended;
    let Job { root, before, upload: flags, want_page, uploader, started, relay } = job;
    if let Some(r) = relay {
        r.stop();
    }
    if let Some(root) = &root
        && sampled
    {
        // What a killed trainer left behind, now that it is gone (`run`); a live writer's
        // file is locked and left alone (`agent`).
        repair(root);
        if let Err(e) = end_markers::write_end_markers(root, SystemClock::new(Stop::new()).wall_s()) {
            log!("cannot write the training_job_end.ts markers: {e}");
        }
        let wall = page::page_wall(flags.deadline);
        let (uploaded, page_lines) = match uploader {
            None => (None, if want_page { page::at_end_of_run(root, &before, wall) } else { Vec::new() }),
            Some(u) => {
                let (report, lines) = final_upload(root, &before, &flags, want_page.then_some(wall), u);
                (Some(report), lines)
            }
        };
        if let Some(counts) = &counts {
            let report = uploaded.as_ref().and_then(Option::as_ref);
            log_summary(root, &before, started, counts, report);
            for line in &page_lines {
                log!("{line}");
            }
        }
        if let Some(report) = uploaded {
            for line in upload_summary(root, report.as_ref(), flags.deadline).lines() {
                log!("{line}");
            }
        }
    }
    match status {
        None => ExitCode::SUCCESS,
        Some(st) => exit_status(st),
    }
}

/// The final upload, and the page when `page_wall` is given (its bound) with the page's
/// lines. The page is made by a child process with bounds of its own (docs/on-disk.md, "Who
/// reads what, with which rights"); a failure is one line, never a failed run. With
/// --keep-local it is made from the files on disk, beside the final upload, and sent after
/// it; without --keep-local the files are gone by then, so it is made after the final
/// upload from what this run sent, within what is left of the deadline (docs/report.md, "At
/// the end of trainprof run"). The upload's report is `None` when it did not finish in time.
fn final_upload(
    root: &Path,
    before: &HashSet<String>,
    flags: &UploadOptions,
    page_wall: Option<Duration>,
    uploading: Uploading,
) -> (Option<upload::Report>, Vec<String>) {
    let Uploading { handle, url, options, early } = uploading;
    let beside = page_wall.filter(|_| flags.keep_local).map(|wall| EndPage::start(root, before, wall));
    // The markers go last, once everything else is in S3.
    let finish_started = Instant::now();
    let report = match (early, handle) {
        (Some(r), _) => r,
        (None, Some(h)) => h.finish(flags.deadline),
        (None, None) => None,
    };
    let until = finish_started + flags.deadline;
    let lines = match (beside, page_wall) {
        (Some(page), _) => {
            let (mut lines, name) = page.finish();
            let all_sent = report.as_ref().is_some_and(|r| r.left.is_empty());
            if let (Some(name), Some(first)) = (name, lines.first_mut()) {
                *first = if all_sent {
                    page::page_to_s3(root, &name, &url, &options, true, until)
                } else {
                    format!("{first} (not uploaded: see the upload lines)")
                };
            }
            lines
        }
        (None, Some(wall)) => {
            let s3 = format!("s3://{}/{}", url.bucket, url.prefix);
            match &report {
                // Nothing reached S3 (no credentials, a refused bucket): every file is still
                // here, so the page is made from them and stays here.
                Some(r) if r.sent.is_empty() => {
                    let left = (finish_started + wall).saturating_duration_since(Instant::now());
                    let wall = left.max(page::MIN_PAGE_WALL);
                    let mut lines = page::at_end_of_run(root, before, wall);
                    if let Some(l) = lines.first_mut().filter(|l| l.starts_with("report: ")) {
                        l.push_str(" (not uploaded: see the upload lines)");
                    }
                    lines
                }
                // Part of the job is in S3 and part still here: neither copy is whole.
                Some(r) if !r.left.is_empty() => vec![format!(
                    "report: skipped, {} files are still on local disk and not in S3; \
                     `trainprof report {s3}` makes it once they are uploaded",
                    r.left.len()
                )],
                Some(r) => {
                    let left = until.saturating_duration_since(Instant::now());
                    let sent = r.sent.iter().cloned().collect();
                    page::at_end_of_s3_run(root, sent, &url, &options, left)
                }
                None => {
                    vec![format!(
                        "report: skipped, the upload did not finish; `trainprof report {s3}` makes it"
                    )]
                }
            }
        }
        (None, None) => Vec::new(),
    };
    (report, lines)
}

/// The summary's lines: this run's files (on disk, and sent to S3), the loop's counts and
/// the agent's own cost.
fn log_summary(
    root: &Path,
    before: &HashSet<String>,
    started: Instant,
    counts: &LoopCounts,
    uploaded: Option<&upload::Report>,
) {
    let (cpu_us, rss_bytes) = self_usage();
    let cost = SelfCost { cpu_us, rss_bytes, wall_s: started.elapsed().as_secs_f64() };
    let now = summary::walk_outputs(root);
    let sent = uploaded.into_iter().flat_map(|r| r.sent.iter());
    let mine: BTreeSet<&str> = now
        .files
        .iter()
        .map(|(rel, _)| rel)
        .chain(sent)
        .map(String::as_str)
        .filter(|f| !before.contains(*f))
        .collect();
    let mut out = summary::count_outputs(mine);
    out.refused = now.refused.len() as u64;
    for line in summary::summary(root, out, counts, cost).lines() {
        log!("{line}");
    }
    log!("{}", crate::pipeline::cost::line(&crate::pipeline::cost::record("", Default::default())));
}

/// CMD's exit status as `run`'s.
fn exit_status(status: io::Result<ExitStatus>) -> ExitCode {
    match status {
        Ok(st) => ExitCode::from(exit_code(st)),
        Err(e) => {
            log!("lost track of the command's exit status: {e}");
            ExitCode::from(1)
        }
    }
}

/// The upload lines of the summary.
fn upload_summary(root: &Path, report: Option<&upload::Report>, deadline: Duration) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let Some(r) = report else {
        let left = upload::sealed_files(root).files.len();
        let _ = writeln!(
            s,
            "upload: did not finish within {} s or stopped; {left} files left on local disk under {}",
            deadline.as_secs(),
            root.display()
        );
        return s;
    };
    let c = &r.counts;
    let _ = writeln!(
        s,
        "upload: {} files uploaded ({} bytes), {} already in S3, {} failed attempts",
        c.uploaded, c.uploaded_bytes, c.already_there, c.failed_attempts
    );
    if c.spool_dropped > 0 || c.conflicts > 0 || c.rejected > 0 {
        let _ = writeln!(
            s,
            "upload: {} files ({} bytes) deleted unsent because the spool was full; {} not overwritten in S3; {} refused",
            c.spool_dropped, c.spool_dropped_bytes, c.conflicts, c.rejected
        );
    }
    let _ = writeln!(s, "upload: {} files left on local disk under {}", r.left.len(), root.display());
    if let Some(e) = &r.last_error
        && !r.left.is_empty()
    {
        let _ = writeln!(s, "upload: last error: {e}");
    }
    s
}

/// The shell's convention: the code, or 128 + the signal that ended the process.
fn exit_code(st: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    match (st.code(), st.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from((128 + sig) & 0xff).unwrap_or(1),
        _ => 1,
    }
}
