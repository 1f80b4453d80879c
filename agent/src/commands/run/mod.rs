//! `trainprof agent` and `trainprof run`, start to end: the configuration, the output
//! folder, signals, the child (CMD), the sampling thread, the uploader, the end markers and
//! the summary. `main.rs` parses the arguments into [`Options`] and calls [`main`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use trainprof_config::{DEFAULT_LOCAL_PATH, FileStatus, Loader, Reload, Sources};
use trainprof_output::node::{ResourceConfig, SystemNode};

use self::summary::SelfCost;
use crate::log;
use crate::pipeline::sample::probe::{ProbeContext, probe_samplers};
use crate::pipeline::sample::process::{self_usage, thread_cpu_us};
use crate::pipeline::sample::tree_pids::TreePids;
use crate::pipeline::sample::{Roots, gpu};
use crate::pipeline::sink::{Sink, SystemFiles};
use crate::pipeline::system_file::SystemWriter;
use crate::pipeline::tick::{Clock as _, LoopCounts, LoopSettings, Reconfigure, Stop, SystemClock, Ticker};
use crate::pipeline::upload;
use crate::process::{child, signals};

pub mod end_markers;
pub mod output_root;
pub mod summary;

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
/// exit status: CMD's, or 2 when something a person typed is wrong.
pub fn main(opts: Options, sources: Sources, command: Option<Vec<OsString>>) -> ExitCode {
    // Before any thread exists, so that every thread inherits SIGTTOU blocked and a signal
    // that comes before the signal thread runs waits in the pipe.
    let taken = signals::Taken::from_dispositions();
    let installed = match signals::install(taken) {
        Ok(i) => Some(i),
        Err(e) => {
            log!(
                "cannot catch SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 ({e}); they will end trainprof at once"
            );
            signals::restore_defaults(&taken);
            None
        }
    };
    // The tree sampler bounds its own descriptors (sample::process::MAX_OPEN); this is
    // room for the rest. The command gets its limit back.
    let nofile = child::raise_nofile_limit();
    let Options {
        config: config_flag,
        local_path_flag,
        disable_flag,
        report: opts_report,
        upload: upload_flags,
    } = opts;
    let command_given = command.is_some();
    // What a person typed (flags, TRAINPROF_* variables, a --config file) is checked before
    // anything starts: a mistake there stops here with exit status 2 (README, `trainprof
    // agent` and `trainprof run`). What the platform wrote degrades per feature below.
    let bad = crate::commands::check::typed_problems(&sources);
    if !bad.is_empty() {
        for line in bad {
            log!("{line}; nothing was started");
        }
        return ExitCode::from(2);
    }
    let loader = Loader::settled(sources, SETTLE);
    let loaded = loader.loaded().clone();
    if let Some(named) = &config_flag {
        let why = match &loaded.file {
            FileStatus::Read => None,
            FileStatus::Missing => Some("no such file".to_owned()),
            FileStatus::Unusable(why) => Some(why.clone()),
        };
        if let Some(why) = why {
            log!("--config {}: {why}; nothing was started", named.display());
            return ExitCode::from(2);
        }
    }
    match &loaded.file {
        FileStatus::Read => log!("config {}", loaded.path.display()),
        FileStatus::Missing => log!("no config at {}: built-in defaults", loaded.path.display()),
        FileStatus::Unusable(why) => {
            log!("config {} unusable ({why}): profiling is off", loaded.path.display())
        }
    }
    for p in &loaded.config.problems {
        // The file's own problem is the line above.
        if p.key != "file" {
            log!("config: {p}");
        }
    }
    let loaded_file = loaded.file.clone();
    let config = loaded.config.clone();

    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let root = if config.enabled {
        let explicit = config.local_path() != std::path::Path::new(DEFAULT_LOCAL_PATH);
        match output_root::output_root(config.local_path(), explicit, &cwd) {
            Ok((root, note)) => {
                if let Some(n) = note {
                    log!("{n}");
                }
                Some(root)
            }
            Err(e) => {
                log!("{e}");
                if command.is_none() {
                    return ExitCode::from(2);
                }
                log!("running the command without profiling");
                None
            }
        }
    } else {
        // An unusable file already said why.
        if !matches!(loaded_file, FileStatus::Unusable(_)) {
            log!("profiling is off ({})", off_by(disable_flag, &loaded.path));
        }
        None
    };

    if let Some(root) = &root
        && let Err(e) = trainprof_output::fs::pin_root(root)
    {
        log!("cannot pin {}: {e}", root.display());
    }
    if let Some(root) = &root {
        repair(root);
        if let Some(at) = end_markers::finished_job(root) {
            log!(
                "{} already holds a finished job (ended {at}): its files stay, this run's are added beside them and the end markers replaced",
                root.display()
            );
        }
    }
    // What is there before this run: the summary counts only this run's files.
    let before: std::collections::HashSet<String> =
        root.as_deref().map(summary::files_under).unwrap_or_default().into_iter().collect();
    let uploader = match (&root, &config.s3_output_path) {
        (Some(root), Some(s3)) => start_upload(root, s3, &upload_flags),
        _ => None,
    };
    let waker = uploader.as_ref().map(|u| u.0.waker());

    let stop = Stop::new();
    let started = Instant::now();

    // The child first: the trainer must start even if sampling cannot.
    let child = match &command {
        None => None,
        Some(argv) => {
            let local_path_env =
                trainer_local_path(root.as_deref(), config.local_path(), local_path_flag, &loaded_file);
            let terminal = child::Terminal::foreground();
            let started = spawn(
                argv,
                config_flag.as_ref(),
                local_path_env.as_ref(),
                config.enabled,
                (terminal.as_ref(), nofile),
            );
            match started {
                Ok(c) => {
                    let trainer = Arc::new(child::Trainer::new(c.id(), terminal));
                    Some((c, trainer))
                }
                Err((code, e)) => {
                    child::Trainer::not_started(terminal);
                    log!("cannot run {}: {e}", argv[0].to_string_lossy());
                    return ExitCode::from(code);
                }
            }
        }
    };
    let child_pid = child.as_ref().map(|(c, _)| c.id());
    let trainer = child.as_ref().map(|(_, t)| Arc::clone(t));
    let signal_stop = stop.clone();
    let on_signal = move |sig: signals::Received| match &trainer {
        // Every signal run takes, to the command's process group, once: a terminal's
        // signals go to that group (the terminal's foreground) and never to run.
        Some(t) => match t.pass_on(sig.signo) {
            child::Passed::Sent => log!("{} passed on to {}'s process group", sig.name(), t.pid()),
            // The command is gone: what `run` still does is bounded anyway, but a stop
            // signal ends the page now (docs/report.md, "At the end of trainprof run").
            child::Passed::Gone if sig.stops() => {
                if !crate::commands::report::page_child::stopped() {
                    log!("{}: the command has exited; the report stops", sig.name());
                }
                crate::commands::report::page_child::stop();
            }
            child::Passed::Gone => {}
            child::Passed::KernelSendsIt => log!(
                "{}: the terminal hung up; the kernel sends it to {}'s process group (not passed on twice)",
                sig.name(),
                t.pid()
            ),
            child::Passed::Failed(e) => log!("cannot pass {} on to {}: {e}", sig.name(), t.pid()),
        },
        None if sig.stops() => {
            log!("{}: sealing files and stopping", sig.name());
            signal_stop.request();
        }
        None => log!("{}: no command to pass it on to; sampling goes on", sig.name()),
    };
    if let Some(installed) = installed
        && let Err(e) = signals::spawn(installed, on_signal)
    {
        log!(
            "cannot start the signal thread ({e}): SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 act as usual"
        );
        signals::restore_defaults(&taken);
    }

    // Sampling runs on its own thread: a hung NVML call or a panic there must not keep
    // `run` from returning the trainer's status.
    let (done_tx, done_rx) = mpsc::channel();
    let sampler = root.clone().map(|root| {
        let stop = stop.clone();
        std::thread::Builder::new().name("trainprof-sampler".into()).spawn(move || {
            let clock = SystemClock::new(stop);
            let reload = ConfigReload { loader, next_at: RELOAD_EVERY };
            let counts = sample(&root, &clock, child_pid, config.interval_ms, waker, reload);
            let _ = done_tx.send(counts);
        })
    });
    let sampler = match sampler {
        Some(Err(e)) => {
            log!("cannot start the sampling thread: {e}");
            None
        }
        Some(Ok(h)) => Some(h),
        None => None,
    };

    let mut uploader =
        uploader.map(|(handle, url, options)| Uploading { handle: Some(handle), url, options, early: None });
    let status = match child {
        Some((mut c, trainer)) => {
            let st = trainer.wait(&mut c);
            // `--upload-deadline-s 0`: no upload starts once the command has exited (README,
            // "Upload to S3 and crash repair"), so the uploader hears it before the last seal
            // wakes it.
            if upload_flags.deadline.is_zero()
                && let Some(u) = uploader.as_mut()
                && let Some(h) = u.handle.take()
            {
                u.early = Some(h.finish(Duration::ZERO));
            }
            stop.request();
            Some(st)
        }
        None => {
            SystemClock::new(stop.clone()).wait_until(Duration::MAX);
            None
        }
    };

    let counts = match (&sampler, done_rx.recv_timeout(FINISH_TIMEOUT)) {
        (None, _) => None,
        (Some(_), Ok(c)) => Some(c),
        (Some(_), Err(mpsc::RecvTimeoutError::Timeout)) => {
            log!(
                "sampling did not stop within {} s; its open file is repaired at the next start",
                FINISH_TIMEOUT.as_secs()
            );
            None
        }
        (Some(_), Err(mpsc::RecvTimeoutError::Disconnected)) => {
            log!("sampling ended abnormally; its open file is repaired at the next start");
            None
        }
    };
    if let Some(root) = &root
        && sampler.is_some()
    {
        // What a killed trainer left behind, now that it is gone (`run`); a live writer's
        // file is locked and left alone (`agent`).
        repair(root);
        if let Err(e) = end_markers::write_end_markers(root, SystemClock::new(Stop::new()).wall_s()) {
            log!("cannot write the training_job_end.ts markers: {e}");
        }
        // The page is made by a child process with bounds of its own (docs/on-disk.md, "Who
        // reads what, with which rights"); a failure is one line, never a failed run. Without
        // an upload, and with --keep-local, it is made from the files on disk, beside the
        // final upload, and sent after it; without --keep-local the files are gone by then,
        // so it is made after the final upload from what this run sent, within what is left
        // of the deadline (docs/report.md, "At the end of trainprof run").
        let want_page = opts_report && command_given;
        let wall = crate::commands::report::page_wall(upload_flags.deadline);
        let mut report_lines = Vec::new();
        let uploaded = match uploader {
            None => {
                if want_page {
                    report_lines = crate::commands::report::at_end_of_run(root, &before, wall);
                }
                None
            }
            Some(Uploading { handle, url, options, early }) => {
                let keep_local = upload_flags.keep_local;
                let page = (want_page && keep_local)
                    .then(|| crate::commands::report::EndPage::start(root, &before, wall));
                // The markers go last, once everything else is in S3.
                let finish_started = Instant::now();
                let report = match (early, handle) {
                    (Some(r), _) => r,
                    (None, Some(h)) => h.finish(upload_flags.deadline),
                    (None, None) => None,
                };
                let until = finish_started + upload_flags.deadline;
                let s3 = format!("s3://{}/{}", url.bucket, url.prefix);
                let all_sent = report.as_ref().is_some_and(|r| r.left.is_empty());
                if let Some(page) = page {
                    let (lines, name) = page.finish();
                    report_lines = lines;
                    if let (Some(name), Some(first)) = (name, report_lines.first_mut()) {
                        *first = if all_sent {
                            crate::commands::report::page_to_s3(root, &name, &url, &options, true, until)
                        } else {
                            format!("{first} (not uploaded: see the upload lines)")
                        };
                    }
                } else if want_page {
                    report_lines = match &report {
                        // Nothing reached S3 (no credentials, a refused bucket): every file
                        // is still here, so the page is made from them and stays here.
                        Some(r) if r.sent.is_empty() => {
                            let left = wall.saturating_sub(finish_started.elapsed());
                            let wall = left.max(crate::commands::report::MIN_PAGE_WALL);
                            let mut lines = crate::commands::report::at_end_of_run(root, &before, wall);
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
                            crate::commands::report::at_end_of_s3_run(root, sent, &url, &options, left)
                        }
                        None => vec![format!(
                            "report: skipped, the upload did not finish; `trainprof report {s3}` makes it"
                        )],
                    };
                }
                Some(report)
            }
        };
        if let Some(counts) = &counts {
            let (cpu_us, rss_bytes) = self_usage();
            let cost = SelfCost { cpu_us, rss_bytes, wall_s: started.elapsed().as_secs_f64() };
            let now = summary::walk_outputs(root);
            let sent = uploaded.iter().flatten().flat_map(|r| r.sent.iter());
            let mine: std::collections::BTreeSet<&str> = now
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
            for line in &report_lines {
                log!("{line}");
            }
        }
        if let Some(report) = uploaded {
            for line in upload_summary(root, report.as_ref(), upload_flags.deadline).lines() {
                log!("{line}");
            }
        }
    }
    match status {
        None => ExitCode::SUCCESS,
        Some(Ok(st)) => ExitCode::from(exit_code(st)),
        Some(Err(e)) => {
            log!("lost track of the command's exit status: {e}");
            ExitCode::from(1)
        }
    }
}

/// The uploader while `run` ends: its handle until the final upload is asked for, and the
/// report of one asked for early (`--upload-deadline-s 0`).
struct Uploading {
    handle: Option<upload::Handle>,
    url: upload::store::S3Url,
    options: upload::store::S3Options,
    early: Option<Option<upload::Report>>,
}

/// How long a config file that does not parse at the start is read again before it is
/// judged (a writer caught half-way).
const SETTLE: Duration = Duration::from_secs(1);

/// The config file is read again at most this often while sampling (by content, as the
/// hook does; README, "Reload").
const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Who switched profiling off, for the start-up line.
fn off_by(flag: bool, path: &Path) -> String {
    if flag {
        return "--disable".to_owned();
    }
    match std::env::var("TRAINPROF_DISABLE") {
        Ok(v) if !v.trim().is_empty() => format!("TRAINPROF_DISABLE={v}"),
        _ => format!("DisableProfiler in {}", path.display()),
    }
}

/// The sampler's view of the config file: re-read at most once a second; the interval and
/// DisableProfiler of a changed file apply at the next tick. A file that became unusable
/// (caught half-written, say) keeps the settings in use, with one line.
struct ConfigReload {
    loader: Loader,
    next_at: Duration,
}

impl Reconfigure for ConfigReload {
    fn poll(&mut self, mono: Duration) -> Option<LoopSettings> {
        if mono < self.next_at {
            return None;
        }
        self.next_at = mono + RELOAD_EVERY;
        if self.loader.reload() == Reload::Unchanged {
            return None;
        }
        let loaded = self.loader.loaded();
        match &loaded.file {
            FileStatus::Unusable(why) => {
                log!("config {} unusable ({why}): keeping the settings in use", loaded.path.display());
                return None;
            }
            FileStatus::Missing => log!("config {} is gone: built-in defaults", loaded.path.display()),
            FileStatus::Read => {}
        }
        for p in &loaded.config.problems {
            log!("config: {p}");
        }
        let c = &loaded.config;
        Some(LoopSettings { interval: Duration::from_millis(u64::from(c.interval_ms)), enabled: c.enabled })
    }
}

/// How long `run` waits for sampling to seal its file once the command has exited.
const FINISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Seals what dead writers left under `root`, with one line when there was any.
fn repair(root: &Path) {
    upload::repair::repair_all(root, Duration::ZERO, std::time::SystemTime::now())
        .log(&mut Default::default());
}

/// The uploader, with the bucket and client options it was started with.
fn start_upload(
    root: &Path,
    s3: &str,
    flags: &UploadOptions,
) -> Option<(upload::Handle, upload::store::S3Url, upload::store::S3Options)> {
    let url = match upload::store::S3Url::parse(s3) {
        Ok(u) => u,
        Err(e) => {
            log!("S3OutputPath: {e}; files stay under {}", root.display());
            return None;
        }
    };
    let options = upload::store::S3Options {
        endpoint: flags.endpoint.clone(),
        multipart_threshold: flags.multipart_bytes,
        ..upload::store::S3Options::default()
    };
    let mut settings = upload::Settings::new(root);
    settings.keep_local = flags.keep_local;
    settings.spool_max_bytes = flags.spool_max_bytes;
    let via = flags.endpoint.as_deref().map(|e| format!(" via {e}")).unwrap_or_default();
    match upload::spawn_s3(url.clone(), options.clone(), settings) {
        Ok(h) => {
            let kept = if flags.keep_local { "kept" } else { "deleted" };
            log!(
                "uploading sealed files under {} to {s3}{via} (local copies {kept} once uploaded)",
                root.display()
            );
            Some((h, url, options))
        }
        Err(e) => {
            log!("cannot start the uploader ({e}); files stay under {}", root.display());
            None
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

/// The sampling thread: probes, ticks until stopped, seals.
fn sample(
    root: &Path,
    clock: &SystemClock,
    trainer: Option<u32>,
    interval_ms: u32,
    waker: Option<upload::Waker>,
    reload: ConfigReload,
) -> LoopCounts {
    let roots = Roots::host();
    let nvml_lib = gpu::lib_from_env();
    let now = || clock.mono();
    let cx = ProbeContext {
        roots: &roots,
        now: &now,
        trainer,
        nvml_lib: nvml_lib.as_deref(),
        tree: TreePids::default(),
    };
    let probed = probe_samplers(&cx);
    let node = SystemNode::from_env(read_resource_config().as_ref(), |k| std::env::var(k).ok());
    let interval = Duration::from_millis(u64::from(interval_ms));
    // Another output is another sink here (ARCHITECTURE.md, "The sink seam").
    let sinks: Vec<Box<dyn Sink>> = vec![Box::new(SystemFiles::new(SystemWriter::new(root, node), waker))];
    let mut ticker = Ticker::new(probed.samplers, sinks, interval);
    ticker.reconfigure_with(Box::new(reload));
    log!(
        "sampling every {interval_ms} ms into {} as {node}: {} ({} cores, {} GPUs)",
        root.join("system").display(),
        ticker.sampler_names().join(", "),
        probed.cores,
        probed.gpus
    );
    if !probed.absent.is_empty() {
        log!("not sampled: {}", probed.absent.join("; "));
    }
    let cpu_before = thread_cpu_us();
    ticker.run(clock);
    let mut c = ticker.counts();
    c.sampling_cpu_us = thread_cpu_us().saturating_sub(cpu_before);
    c
}

/// The `TRAINPROF_LOCAL_PATH` the trainer gets: the agent's root when that root was chosen
/// here (given by flag, fallen back from `configured`, or the built-in default because there
/// is no config file at all: `trainprof run` on its defaults profiles the trainer too).
/// Otherwise none: the trainer reads the same config, and a file without
/// ProfilingParameters keeps smdebug's meaning (the hook does nothing).
fn trainer_local_path(
    root: Option<&Path>,
    configured: &Path,
    by_flag: bool,
    file: &FileStatus,
) -> Option<PathBuf> {
    let root = root?;
    (by_flag || root != configured || matches!(file, FileStatus::Missing)).then(|| root.to_path_buf())
}

/// Starts the command with what the Python package needs in its environment. The error
/// carries the shell's exit code for it: 127 not found, 126 not runnable.
fn spawn(
    argv: &[OsString],
    config: Option<&PathBuf>,
    local_path: Option<&PathBuf>,
    enabled: bool,
    (terminal, nofile): (Option<&child::Terminal>, Option<libc::rlimit>),
) -> Result<std::process::Child, (u8, std::io::Error)> {
    let Some((program, args)) = argv.split_first() else {
        return Err((2, std::io::Error::other("no command")));
    };
    let mut cmd = Command::new(program);
    cmd.args(args);
    child::prepare(&mut cmd, terminal, nofile);
    signals::unblock_in_child(&mut cmd);
    if !enabled {
        // Off for the trainer too (--disable, or a config file that cannot be trusted).
        cmd.env("TRAINPROF_DISABLE", "1");
    }
    // Also when off: the library honours TRAINPROF_DISABLE, and a trainer that loads it
    // must find it.
    if std::env::var_os("TRAINPROF_HOOK_LIB").is_none()
        && let Some(lib) = std::env::current_exe().ok().and_then(|exe| hook_lib_near(&exe))
    {
        cmd.env("TRAINPROF_HOOK_LIB", lib);
    }
    if let Some(c) = config {
        cmd.env("SMPROFILER_CONFIG_PATH", c);
    }
    if let Some(p) = local_path {
        cmd.env("TRAINPROF_LOCAL_PATH", p);
    }
    cmd.spawn().map_err(|e| (if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 }, e))
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

/// `libtrainprof_hook.so` next to the binary, or in `../lib` from it.
pub fn hook_lib_near(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    [dir.join("libtrainprof_hook.so"), dir.join("../lib/libtrainprof_hook.so")]
        .into_iter()
        .find(|p| p.is_file())
}

fn read_resource_config() -> Option<ResourceConfig> {
    let path = ResourceConfig::path(|k| std::env::var(k).ok());
    // Non-blocking and by `fstat`: a FIFO planted there cannot hang the sampler.
    ResourceConfig::parse(&trainprof_config::read_platform_file(&path).ok()??)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trainer_gets_the_root_only_when_it_was_chosen_here() {
        let root = Path::new("/out");
        let read = FileStatus::Read;
        assert_eq!(trainer_local_path(Some(root), root, false, &read), None);
        assert_eq!(trainer_local_path(Some(root), root, true, &read).as_deref(), Some(root));
        let fallback = Path::new("/opt/ml/output/profiler");
        assert_eq!(trainer_local_path(Some(root), fallback, false, &read).as_deref(), Some(root));
        assert_eq!(trainer_local_path(Some(root), root, false, &FileStatus::Missing).as_deref(), Some(root));
        let unusable = FileStatus::Unusable("not JSON".into());
        assert_eq!(trainer_local_path(Some(root), root, false, &unusable), None);
        assert_eq!(trainer_local_path(None, root, true, &FileStatus::Missing), None);
    }
}
