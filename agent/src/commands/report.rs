//! `trainprof report` and `trainprof trace` (`docs/report.md`), and the report written at the
//! end of `trainprof run`. The work is in the `trainprof_report` crate; this module picks the
//! input (a LocalPath, or `s3://bucket/prefix` downloaded into a private temporary folder)
//! and creates the output file without ever replacing one (`O_EXCL | O_NOFOLLOW` through
//! `trainprof_output::fs`). At the end of `run` the report is made by a child process
//! ([`page_child`]).

pub mod page_child;

use std::collections::HashSet;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use trainprof_output::fs::Dir;
use trainprof_report::model::ReportModel;
use trainprof_report::trace::Clip;

use self::page_child::{ChildError, Made};
use crate::log;
use crate::log::printable;
use crate::s3::download::{download, download_from};
use crate::s3::store::{ObjectStore as _, Put, S3Options, S3Store, S3Url};

/// The default output names.
pub const REPORT_FILE: &str = "report.html";
pub const TRACE_FILE: &str = "trace.json.gz";

/// Exit statuses of `report` and `trace` (docs/report.md, "Exit status").
pub mod status {
    /// Nothing to report, or the output file was refused or could not be written.
    pub const NOTHING: u8 = 1;
    /// A bad argument.
    pub const BAD_ARGUMENT: u8 = 2;
    /// The source could not be read: the bucket or prefix could not be listed, an object
    /// could not be fetched (no such bucket, access denied, no connection), or the local
    /// folder could not be opened.
    pub const UNREADABLE: u8 = 3;
}

/// Why there is no input, with its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    pub status: u8,
    pub message: String,
}

impl InputError {
    fn new(status: u8, message: impl Into<String>) -> InputError {
        InputError { status, message: message.into() }
    }
}

/// Why an output file, the page's file or a temporary folder could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot make a temporary folder: {0}")]
    Temp(#[source] std::io::Error),
    #[error("cannot hand {} over: {source}", path.display())]
    HandOver { path: PathBuf, source: std::io::Error },
    #[error("{} exists: not replaced (remove it, or name another file with -o)", .0.display())]
    Exists(PathBuf),
    #[error("{}: not a file name", .0.display())]
    NotAFileName(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// Every name the page at the end of `run` may take is taken, in the folder.
    #[error("report.html to report-{END_OF_RUN_TRIES}.html all exist in {}", .0.display())]
    NamesTaken(PathBuf),
}

impl FileError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
        move |source| FileError::Io { path: path.to_owned(), source }
    }
}

/// Where the data is.
#[derive(Debug)]
pub struct Input {
    /// The folder to read.
    pub root: PathBuf,
    /// What the user gave.
    pub source: String,
    /// True for S3 (outputs then default to the current folder).
    pub remote: bool,
    /// Holds the downloaded copy until the command ends.
    _temp: Option<tempfile::TempDir>,
}

/// `PATH` as given: a LocalPath, or `s3://…` fetched with the upload's credential chain.
/// Keys left out of an S3 download are logged (`skipped: …`).
pub fn input(path: &str, endpoint: Option<&str>) -> Result<Input, InputError> {
    if path.starts_with("s3://") {
        let url = S3Url::parse(path).map_err(|e| InputError::new(status::BAD_ARGUMENT, e.to_string()))?;
        let temp = private_temp(None).map_err(|e| InputError::new(status::NOTHING, e.to_string()))?;
        remove_on_signal(temp.path());
        let got = download(&url, endpoint, temp.path())
            .map_err(|e| InputError::new(status::UNREADABLE, e.to_string()))?;
        log_skipped(&got.skipped);
        if got.files == 0 {
            return Err(InputError::new(
                status::NOTHING,
                format!("{path}: no profiler files (system/, framework/) under this prefix"),
            ));
        }
        log!("downloaded {} files ({} bytes) from {path}", got.files, got.bytes);
        Ok(Input { root: temp.path().to_owned(), source: path.to_owned(), remote: true, _temp: Some(temp) })
    } else {
        if endpoint.is_some() {
            return Err(InputError::new(status::BAD_ARGUMENT, "--s3-endpoint applies only to an s3:// PATH"));
        }
        let root = PathBuf::from(path);
        if !root.is_dir() {
            return Err(InputError::new(status::BAD_ARGUMENT, format!("{path}: not a folder")));
        }
        Ok(Input { root, source: path.to_owned(), remote: false, _temp: None })
    }
}

/// A new private temporary folder (mode 0700) for a download, removed when dropped; owned
/// by `owner` when given (the user the report's child runs as, [`page_child`]).
pub(crate) fn private_temp(owner: page_child::RunAs) -> Result<tempfile::TempDir, FileError> {
    let temp = tempfile::Builder::new()
        .prefix("trainprof-report-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .tempdir()
        .map_err(FileError::Temp)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(temp.path(), Some(uid), Some(gid))
            .map_err(|source| FileError::HandOver { path: temp.path().to_owned(), source })?;
    }
    Ok(temp)
}

/// A signal that ends the command (SIGTERM, SIGINT, SIGHUP, SIGQUIT: Ctrl-C during a long
/// download) removes the downloaded copy first, then ends the process by that signal, as
/// it would have without a handler; a signal the shell had ignored (`nohup`) stays ignored,
/// and the user signals are taken and logged rather than ending the command. Without this
/// the copy, with every file of the job, stayed in the temporary folder. Called before any
/// other thread starts ([`signals::install`]); when the signals cannot be taken, they keep
/// their default action.
pub(crate) fn remove_on_signal(dir: &Path) {
    use crate::process::signals;
    let taken = signals::Taken::from_dispositions();
    let Ok(installed) = signals::install(taken) else { return };
    let dir = dir.to_owned();
    let spawned = signals::spawn(installed, move |r| {
        if !r.stops() {
            log!("{} ignored", r.name());
            return;
        }
        // A file the download creates meanwhile can make one pass fail (not empty).
        for _ in 0..5 {
            if std::fs::remove_dir_all(&dir).is_ok() || !dir.exists() {
                break;
            }
        }
        log!("stopped by {}; the downloaded copy is removed", r.name());
        signals::restore_defaults(&taken);
        let _ = signals::send(std::process::id(), r.signo);
        std::process::exit(128 + r.signo);
    });
    if spawned.is_err() {
        signals::restore_defaults(&taken);
    }
}

/// Reasons listed one by one at most; past this, one line says how many more.
const MAX_SKIPPED_LISTED: usize = 200;

pub(crate) fn log_skipped(skipped: &[String]) {
    for s in skipped.iter().take(MAX_SKIPPED_LISTED) {
        log!("skipped: {s}");
    }
    if skipped.len() > MAX_SKIPPED_LISTED {
        log!("skipped: {} more objects not listed", skipped.len() - MAX_SKIPPED_LISTED);
    }
}

/// The exit status for an error of the report crate.
fn build_status(e: &trainprof_report::Error) -> u8 {
    match e {
        trainprof_report::Error::Root(..) => status::UNREADABLE,
        _ => status::NOTHING,
    }
}

/// Creates `name` in `dir`, never over an existing file or through a link.
pub(crate) fn create_in(dir: &Path, name: &str) -> Result<(File, PathBuf), FileError> {
    let shown = dir.join(name);
    let d = Dir::open_root(dir, false).map_err(FileError::io(dir))?;
    match d.create_new(name) {
        Ok(f) => Ok((f, shown)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(FileError::Exists(shown)),
        Err(source) => Err(FileError::Io { path: shown, source }),
    }
}

/// The output file: `-o FILE`, else `default` in the LocalPath (or the current folder for S3).
fn output(flag: Option<&Path>, input: &Input, default: &str) -> Result<(File, PathBuf), FileError> {
    match flag {
        Some(p) => {
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| FileError::NotAFileName(p.to_owned()))?;
            let parent = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
                _ => PathBuf::from("."),
            };
            create_in(&parent, name)
        }
        None if input.remote => create_in(Path::new("."), default),
        None => create_in(&input.root, default),
    }
}

/// `trainprof report`.
#[derive(Debug, Clone, Default)]
pub struct ReportArgs {
    pub path: String,
    pub output: Option<PathBuf>,
    pub json: bool,
    pub s3_endpoint: Option<String>,
    pub patience: Option<u64>,
}

pub fn report(args: &ReportArgs) -> ExitCode {
    let input = match input(&args.path, args.s3_endpoint.as_deref()) {
        Ok(i) => i,
        Err(e) => {
            log!("{}", e.message);
            return ExitCode::from(e.status);
        }
    };
    let opts = trainprof_report::Options { patience: args.patience, ..Default::default() };
    let model = match trainprof_report::build(&input.root, &input.source, &opts) {
        Ok(m) => m,
        Err(e) => {
            log!("{e}");
            return ExitCode::from(build_status(&e));
        }
    };
    for s in &model.job.skipped {
        log!("skipped: {s}");
    }
    if args.json && args.output.is_none() {
        let mut text = trainprof_report::to_json(&model);
        text.push('\n');
        let _ = std::io::stdout().write_all(text.as_bytes());
        return ExitCode::SUCCESS;
    }
    match write_html(&model, args.output.as_deref(), &input) {
        Ok(p) => {
            if args.json {
                let mut text = trainprof_report::to_json(&model);
                text.push('\n');
                let _ = std::io::stdout().write_all(text.as_bytes());
            }
            log!("report: {}", p.display());
            for line in triggered_lines(&model) {
                log!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            log!("{e}");
            ExitCode::from(1)
        }
    }
}

fn write_html(model: &ReportModel, flag: Option<&Path>, input: &Input) -> Result<PathBuf, FileError> {
    let (mut f, path) = output(flag, input, REPORT_FILE)?;
    let page = trainprof_report::page::render(model);
    f.write_all(page.as_bytes()).and_then(|()| f.sync_all()).map_err(FileError::io(&path))?;
    Ok(path)
}

/// One line per triggered finding: `finding: <rule>: <summary>`, with `(preliminary: 481 of
/// 1000 datapoints)` when judged on less than the rule's patience; then, when any finding is
/// preliminary, one line naming them all (docs/report.md, "Short jobs").
pub fn triggered_lines(model: &ReportModel) -> Vec<String> {
    let mut lines: Vec<String> = model
        .findings
        .iter()
        .filter(|f| f.triggered)
        .map(|f| match &f.preliminary {
            Some(p) => format!("finding: {}: {} ({})", f.rule, f.summary, p.label()),
            None => format!("finding: {}: {}", f.rule, f.summary),
        })
        .collect();
    let prelim: Vec<String> = model
        .findings
        .iter()
        .filter_map(|f| f.preliminary.as_ref().map(|p| format!("{} ({})", f.rule, p.label())))
        .collect();
    if !prelim.is_empty() {
        lines.push(format!(
            "findings judged on less than their patience of data: {}; --patience gives SageMaker's behaviour (not evaluated)",
            prelim.join(", ")
        ));
    }
    lines
}

/// What `trace` says of each node's clock (docs/report.md, "The trace"): by how much its
/// events moved and how sure, or why they did not; nothing with fewer than two nodes.
fn clock_lines(clocks: &[trainprof_report::model::collectives::NodeClock], aligned: bool) -> Vec<String> {
    use trainprof_report::model::AlignState;
    if clocks.len() < 2 {
        return Vec::new();
    }
    let reference = clocks.iter().find(|c| c.state == AlignState::Reference).map_or("", |c| c.node.as_str());
    clocks
        .iter()
        .map(|c| {
            let node = printable(&c.node);
            match (c.state, c.offset_ms, aligned) {
                (AlignState::Reference, ..) => format!("clock: {node} is the reference (not moved)"),
                (AlignState::Aligned, Some(off), true) => format!(
                    "clock: {node} moved by {:+.3} ms (± {:.3} ms, from {} collective ends shared with {})",
                    -off,
                    c.uncertainty_ms.unwrap_or(0.0),
                    c.collectives,
                    printable(reference)
                ),
                (AlignState::Aligned, Some(off), false) => format!(
                    "clock: {node} left as recorded (--unaligned); its offset is {off:+.3} ms ± {:.3} ms",
                    c.uncertainty_ms.unwrap_or(0.0)
                ),
                _ => format!(
                    "clock: {node} left as recorded: unaligned ({})",
                    printable(c.reason.as_deref().unwrap_or("no estimate"))
                ),
            }
        })
        .collect()
}

/// `trainprof trace`.
#[derive(Debug, Clone, Default)]
pub struct TraceArgs {
    pub path: String,
    pub output: Option<PathBuf>,
    pub s3_endpoint: Option<String>,
    pub clip: Clip,
    /// Times as recorded (`--unaligned`).
    pub unaligned: bool,
    /// `--per-node-archive FILE`: that archive instead of the merged trace.
    pub per_node_archive: Option<PathBuf>,
}

pub fn trace(args: &TraceArgs) -> ExitCode {
    if let (Some(a), Some(b)) = (args.clip.start_s, args.clip.end_s)
        && b < a
    {
        log!("--end must not be before --start");
        return ExitCode::from(2);
    }
    let input = match input(&args.path, args.s3_endpoint.as_deref()) {
        Ok(i) => i,
        Err(e) => {
            log!("{}", e.message);
            return ExitCode::from(e.status);
        }
    };
    if let Some(archive) = &args.per_node_archive {
        return per_node_archive(args, &input, archive);
    }
    let (f, path) = match output(args.output.as_deref(), &input, TRACE_FILE) {
        Ok(x) => x,
        Err(e) => {
            log!("{e}");
            return ExitCode::from(1);
        }
    };
    let dir = path.parent().map(Path::to_owned).unwrap_or_else(|| PathBuf::from("."));
    let settings = trainprof_report::trace::Settings { unaligned: args.unaligned, node: None };
    match trainprof_report::trace::write_with(&input.root, &f, &args.clip, &settings) {
        Ok(w) => {
            let _ = f.sync_all();
            for s in &w.skipped {
                log!("skipped: {s}");
            }
            for line in clock_lines(&w.clocks, w.aligned) {
                log!("{line}");
            }
            log!(
                "trace: {} ({} slices, {} counter samples, {} python windows); open it in ui.perfetto.dev",
                path.display(),
                w.slices,
                w.counters,
                w.python_windows
            );
            ExitCode::SUCCESS
        }
        Err(e) => trace_failed(&e, &dir, &path, &f),
    }
}

/// `trace --per-node-archive FILE`: the per-node traces and `perfetto_manifest.json` in one
/// new tar (docs/report.md, "The trace").
fn per_node_archive(args: &TraceArgs, input: &Input, archive: &Path) -> ExitCode {
    let (f, path) = match output(Some(archive), input, TRACE_FILE) {
        Ok(x) => x,
        Err(e) => {
            log!("{e}");
            return ExitCode::from(1);
        }
    };
    let dir = path.parent().map(Path::to_owned).unwrap_or_else(|| PathBuf::from("."));
    match trainprof_report::trace::archive::write(&input.root, std::io::BufWriter::new(&f), &args.clip) {
        Ok(a) => {
            let _ = f.sync_all();
            let mut skipped = HashSet::new();
            for (_, _, w) in &a.files {
                for s in &w.skipped {
                    if skipped.insert(s.clone()) {
                        log!("skipped: {s}");
                    }
                }
            }
            for line in clock_lines(&a.clocks, true) {
                log!("{line}");
            }
            log!(
                "archive: {} ({} per-node traces and {}, their clock offsets in it); open it in ui.perfetto.dev",
                path.display(),
                a.files.len(),
                trainprof_report::trace::archive::MANIFEST
            );
            ExitCode::SUCCESS
        }
        Err(e) => trace_failed(&e, &dir, &path, &f),
    }
}

/// A trace or archive that could not be written: the line, the half-written file removed (it
/// is ours, and only while the name still holds it), the exit status.
fn trace_failed(e: &trainprof_report::trace::Error, dir: &Path, path: &Path, f: &std::fs::File) -> ExitCode {
    log!("{e}");
    if let (Ok(d), Some(name)) = (Dir::open_root(dir, false), path.file_name().and_then(|n| n.to_str())) {
        let _ = d.unlink_if_same(name, f);
    }
    let code = match e {
        trainprof_report::trace::Error::Root(..) => status::UNREADABLE,
        _ => status::NOTHING,
    };
    ExitCode::from(code)
}

/// The page at the end of `trainprof run` (docs/report.md, "At the end of trainprof run"):
/// made by a child process ([`page_child`]) on the LocalPath, leaving out the files that were
/// there when the run started. Start it with [`EndPage::start`], do other work (the final
/// upload), then [`EndPage::finish`].
#[derive(Debug)]
pub struct EndPage {
    root: PathBuf,
    running: Result<page_child::Running, ChildError>,
}

/// The least wall time the page gets, also with `--upload-deadline-s 0`.
pub const MIN_PAGE_WALL: Duration = Duration::from_secs(5);

/// The page's wall bound for `--upload-deadline-s` `deadline`.
pub fn page_wall(deadline: Duration) -> Duration {
    deadline.max(MIN_PAGE_WALL)
}

impl EndPage {
    /// Starts the child on `root`, with `wall` to finish.
    pub fn start(root: &Path, before: &HashSet<String>, wall: Duration) -> EndPage {
        let run_as = page_child::run_as(page_child::owner_of(root));
        let running = page_child::spawn(root, &root.display().to_string(), before, run_as, wall);
        EndPage { root: root.to_owned(), running }
    }

    /// Waits for the page and writes it into the LocalPath under the first free name of
    /// `report.html`, `report-2.html`, …; returns the summary's lines (its path and one line
    /// per triggered finding, or one `no report: …` line) and the name written.
    pub fn finish(self) -> (Vec<String>, Option<String>) {
        let root = &self.root;
        let how = format!("`trainprof report {}` makes it", root.display());
        let made = match self.running.and_then(|r| r.wait(None)) {
            Ok(Made { error: Some(e), .. }) => return (vec![format!("no report: {e}")], None),
            Ok(m) => m,
            Err(e) => return (vec![format!("no report: {e}; {how}")], None),
        };
        match write_page(root, &made.page) {
            Ok(name) => {
                let mut lines = vec![format!("report: {}", root.join(&name).display())];
                lines.extend(made.lines);
                (lines, Some(name))
            }
            Err(e) => (vec![format!("no report: {e}")], None),
        }
    }
}

/// [`EndPage`] started and finished.
pub fn at_end_of_run(root: &Path, before: &HashSet<String>, wall: Duration) -> Vec<String> {
    EndPage::start(root, before, wall).finish().0
}

/// Writes `page` into `root` under the first free name of `report.html`, `report-2.html`,
/// …; `Ok(name)`.
fn write_page(root: &Path, page: &[u8]) -> Result<String, FileError> {
    let dir = Dir::open_root(root, false).map_err(FileError::io(root))?;
    let names = std::iter::once(REPORT_FILE.to_owned())
        .chain((2..=END_OF_RUN_TRIES).map(|n| format!("report-{n}.html")));
    for name in names {
        let mut f = match dir.create_new(&name) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(FileError::Io { path: root.join(&name), source: e }),
        };
        if let Err(e) = f.write_all(page).and_then(|()| f.sync_all()) {
            return Err(FileError::Io { path: root.join(&name), source: e });
        }
        return Ok(name);
    }
    Err(FileError::NamesTaken(root.to_owned()))
}

/// Runs `f` until `until`, or until `run` is told to stop ([`page_child::stop`]).
async fn bounded<F: std::future::Future>(until: Instant, f: F) -> Result<F::Output, &'static str> {
    let stop = async {
        while !page_child::stopped() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        r = tokio::time::timeout_at(until.into(), f) => r.map_err(|_| "deadline"),
        () = stop => Err("stopped"),
    }
}

/// Sends the page `name` (written into `root` by [`write_page`]) to S3 as one object, never
/// over an existing one, until `until`; without `keep_local` deletes it once S3 has it.
/// Returns the summary's line for it.
pub fn page_to_s3(
    root: &Path,
    name: &str,
    url: &S3Url,
    options: &S3Options,
    keep_local: bool,
    until: Instant,
) -> String {
    let local = root.join(name);
    if Instant::now() >= until {
        return format!("report: {} (not uploaded: no time left of --upload-deadline-s)", local.display());
    }
    let rt = match crate::s3::runtime() {
        Ok(rt) => rt,
        Err(e) => return format!("report: {} (not uploaded: {e})", local.display()),
    };
    let line = rt.block_on(async {
        match bounded(until, S3Store::connect(url.clone(), options.clone())).await {
            Ok(store) => send_page(&store, root, name, keep_local, until).await,
            Err(why) => not_sent(&local, why),
        }
    });
    rt.shutdown_background();
    line
}

fn not_sent(local: &Path, why: &str) -> String {
    let why = match why {
        "stopped" => "stopped by a signal",
        _ => "not done within --upload-deadline-s",
    };
    format!("report: {} (not uploaded: {why})", local.display())
}

async fn send_page(store: &S3Store, root: &Path, name: &str, keep_local: bool, until: Instant) -> String {
    let local = root.join(name);
    let opened = Dir::open_root(root, false).and_then(|dir| {
        let file = dir.open_regular(name, false)?;
        let held = trainprof_output::fs::meta_of(&file)?;
        Ok((dir, file, held))
    });
    let (dir, file, held) = match opened {
        Ok(x) => x,
        Err(e) => return format!("report: {} (not uploaded: {e})", local.display()),
    };
    let key = format!("s3://{}/{}", store.url().bucket, store.url().key(name));
    match bounded(until, store.put_file(name, &file, held.len, true)).await {
        Ok(Ok(Put::Stored)) if keep_local => format!("report: {} (uploaded to {key})", local.display()),
        Ok(Ok(Put::Stored)) => match dir.unlink_if_holds(name, &held) {
            Ok(_) => format!("report: {key}"),
            Err(e) => format!("report: {key} (the local copy {} stays: {e})", local.display()),
        },
        Ok(Ok(Put::Exists)) => format!(
            "report: {} (not uploaded: {key} already holds another object, not overwritten)",
            local.display()
        ),
        Ok(Err(e)) => format!("report: {} (not uploaded: {e})", local.display()),
        Err(why) => not_sent(&local, why),
    }
}

/// The page at the end of `run --s3` without `--keep-local` (`docs/report.md`, "At the end
/// of trainprof run"), once the uploader has finished and deleted what it sent: built from
/// the objects this run sent (`sent`), downloaded into a private temporary folder (removed
/// before this returns, on every path) and read there by the child ([`page_child`]); written
/// into the LocalPath as for a run without upload, sent as one object under the prefix
/// (never over an existing one) and deleted once S3 has it. All of it within `within`;
/// past it, one line says the page was skipped and how to make it. Returns the summary's
/// lines.
pub fn at_end_of_s3_run(
    root: &Path,
    sent: HashSet<String>,
    url: &S3Url,
    options: &S3Options,
    within: Duration,
) -> Vec<String> {
    let s3 = format!("s3://{}/{}", url.bucket, url.prefix);
    let how = format!("`trainprof report {s3}` makes it");
    if within.is_zero() {
        return vec![format!("report: skipped, no time left of --upload-deadline-s; {how}")];
    }
    let until = Instant::now() + within;
    let late = || {
        vec![format!(
            "report: skipped, not done within what was left of --upload-deadline-s ({} s); {how}",
            within.as_secs()
        )]
    };
    let run_as = page_child::run_as(page_child::owner_of(root));
    let temp = match private_temp(run_as) {
        Ok(t) => t,
        Err(e) => return vec![format!("no report: {e}; {how}")],
    };
    let rt = match crate::s3::runtime() {
        Ok(rt) => rt,
        Err(e) => return vec![format!("no report: {e}; {how}")],
    };
    let downloaded = rt.block_on(bounded(until, async {
        let store = S3Store::connect(url.clone(), options.clone()).await;
        download_from(&store, temp.path(), Some(&sent)).await.map(|got| (store, got))
    }));
    let store = match downloaded {
        Ok(Ok((store, _))) => store,
        Ok(Err(e)) => return vec![format!("no report: {e}; {how}")],
        Err("stopped") => return vec![format!("report: skipped, stopped by a signal; {how}")],
        Err(_) => return late(),
    };
    let made = page_child::spawn(temp.path(), &s3, &HashSet::new(), run_as, until - Instant::now())
        .and_then(|r| r.wait(Some(until)));
    // Removed at once, whatever the child did (it is dead by now).
    drop(temp);
    let made = match made {
        Ok(Made { error: Some(e), .. }) => return vec![format!("no report: {e}")],
        Ok(m) => m,
        Err(e) => return vec![format!("no report: {e}; {how}")],
    };
    let name = match write_page(root, &made.page) {
        Ok(n) => n,
        Err(e) => return vec![format!("no report: {e}")],
    };
    let mut lines = vec![rt.block_on(send_page(&store, root, &name, false, until))];
    rt.shutdown_background();
    lines.extend(made.lines);
    lines
}

/// Names tried at the end of `run`.
const END_OF_RUN_TRIES: u32 = 100;

#[cfg(test)]
mod tests {
    use super::*;

    /// A finding judged on less than its patience says so on its line, and one line names
    /// every preliminary finding (docs/report.md, "Short jobs").
    #[test]
    fn preliminary_findings_are_said_in_the_text_lines() {
        let mut agg = trainprof_report::rules::Agg::new(None);
        for i in 0..481 {
            let t = trainprof_report::reading::Tick {
                t_s: 1000.0 + f64::from(i) * 0.1,
                cores: vec![(0, 95.0)],
                gpus: vec![("gpu0".into(), Some(3.0), Some(10.0))],
                ..Default::default()
            };
            agg.tick("algo-1", &t);
        }
        agg.finish();
        let model =
            ReportModel { findings: trainprof_report::rules::all(&mut agg, None), ..Default::default() };
        let lines = triggered_lines(&model);
        assert!(
            lines.contains(&"finding: CPUBottleneck: On algo-1, 100.0 % of the datapoints had a GPU below 10 % while a CPU core above 90 % (threshold: more than 50 % at any minute). (preliminary: 481 of 1000 datapoints)".to_owned()),
            "{lines:#?}"
        );
        let last = lines.last().unwrap();
        assert!(last.starts_with("findings judged on less than their patience of data: CPUBottleneck (preliminary: 481 of 1000 datapoints), "), "{last}");
    }

    #[test]
    fn an_existing_output_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(REPORT_FILE), "mine").unwrap();
        let input = Input { root: dir.path().to_owned(), source: String::new(), remote: false, _temp: None };
        let err = output(None, &input, REPORT_FILE).unwrap_err().to_string();
        assert!(err.contains("exists: not replaced"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.path().join(REPORT_FILE)).unwrap(), "mine");
        // A planted link is not written through either.
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), dir.path().join(TRACE_FILE)).unwrap();
        assert!(output(None, &input, TRACE_FILE).is_err());
        assert!(!dir.path().join("elsewhere").exists());
    }
}
