//! `trainprof compare A B` (`docs/report.md`, "compare"): two jobs, each a LocalPath or an
//! `s3://` prefix read with `report`'s rules (the same download, bounds and links refused:
//! [`super::report`]), compared by `trainprof_report::compare`. Exit status: 0 compared (and
//! the gate passed), 1 the gate failed, 2 unusable input (a bad argument, a job that cannot
//! be read or holds nothing, no step mode to gate on, an output file refused); one line on
//! stderr says why.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use trainprof_report::compare::{self, Comparison, Options};

use super::report::{self as rep, FileError, Input, InputError};
use crate::log;
use crate::s3::download::DownloadError;
use crate::s3::store::{S3Url, S3UrlError};

/// Exit statuses.
pub mod status {
    pub const FAILED_GATE: u8 = 1;
    pub const UNUSABLE: u8 = 2;
}

/// `trainprof compare`.
#[derive(Debug, Clone, Default)]
pub struct CompareArgs {
    pub a: String,
    pub b: String,
    pub output: Option<PathBuf>,
    pub json: bool,
    pub fail_if_slower: Option<f64>,
    pub mode: Option<String>,
    pub noise: Option<f64>,
    pub warmup: Option<usize>,
    pub s3_endpoint: Option<String>,
    pub patience: Option<u64>,
}

/// Why a side cannot be compared; [`compare`] says it on one line.
#[derive(Debug, thiserror::Error)]
enum CompareError {
    #[error("--s3-endpoint applies only to an s3:// A or B")]
    EndpointWithoutS3,
    #[error("no temporary folder")]
    NoTemp,
    #[error("{0}: no profiler files (system/, framework/) under this prefix")]
    NoFiles(String),
    #[error("{}", .0.message)]
    Input(InputError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Url(#[from] S3UrlError),
    #[error(transparent)]
    Download(#[from] DownloadError),
    #[error(transparent)]
    Load(#[from] trainprof_report::Error),
}

/// One side: the folder to read, and the downloaded copy held until the command ends.
struct Source {
    root: PathBuf,
    source: String,
    _local: Option<Input>,
}

/// Both sides. S3 prefixes are downloaded into one private temporary folder (`a/`, `b/`),
/// removed at the end and by a signal that ends the command, as for `report`.
fn sources(args: &CompareArgs) -> Result<(Source, Source, Option<tempfile::TempDir>), CompareError> {
    let remote = |p: &str| p.starts_with("s3://");
    if args.s3_endpoint.is_some() && !remote(&args.a) && !remote(&args.b) {
        return Err(CompareError::EndpointWithoutS3);
    }
    let temp = if remote(&args.a) || remote(&args.b) {
        let t = rep::private_temp(None)?;
        rep::remove_on_signal(t.path());
        Some(t)
    } else {
        None
    };
    let one = |path: &str, sub: &str| -> Result<Source, CompareError> {
        if remote(path) {
            let url = S3Url::parse(path)?;
            let into = temp.as_ref().map(|t| t.path().join(sub)).ok_or(CompareError::NoTemp)?;
            std::fs::create_dir(&into).map_err(|source| FileError::Io { path: into.clone(), source })?;
            let got = crate::s3::download::download(&url, args.s3_endpoint.as_deref(), &into)?;
            rep::log_skipped(&got.skipped);
            if got.files == 0 {
                return Err(CompareError::NoFiles(path.to_owned()));
            }
            log!("downloaded {} files ({} bytes) from {path}", got.files, got.bytes);
            Ok(Source { root: into, source: path.to_owned(), _local: None })
        } else {
            let input = rep::input(path, None).map_err(CompareError::Input)?;
            Ok(Source { root: input.root.clone(), source: path.to_owned(), _local: Some(input) })
        }
    };
    let a = one(&args.a, "a")?;
    let b = one(&args.b, "b")?;
    Ok((a, b, temp))
}

fn load(s: &Source, patience: Option<u64>, warmup: usize) -> Result<compare::Run, CompareError> {
    let opts = trainprof_report::Options { patience, ..Default::default() };
    let run = compare::load(&s.root, &s.source, &opts, warmup)?;
    for x in &run.model.job.skipped {
        log!("skipped: {}: {x}", s.source);
    }
    Ok(run)
}

fn unusable(why: &str) -> ExitCode {
    log!("compare: {why}");
    ExitCode::from(status::UNUSABLE)
}

pub fn compare(args: &CompareArgs) -> ExitCode {
    let noise = args.noise.unwrap_or(compare::DEFAULT_NOISE_PCT);
    if !(noise.is_finite() && noise >= 0.0)
        || args.fail_if_slower.is_some_and(|p| !(p.is_finite() && p >= 0.0))
    {
        return unusable("--noise and --fail-if-slower take a percentage of 0 or more");
    }
    let (a, b, _temp) = match sources(args) {
        Ok(x) => x,
        Err(e) => return unusable(&e.to_string()),
    };
    let warmup = args.warmup.unwrap_or(compare::DEFAULT_WARMUP);
    let (ra, rb) = match (load(&a, args.patience, warmup), load(&b, args.patience, warmup)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => return unusable(&e.to_string()),
    };
    let opts = Options {
        mode: args.mode.clone(),
        noise_pct: noise,
        warmup,
        fail_if_slower: args.fail_if_slower,
        ..Options::default()
    };
    let c = compare::compare(&ra, &rb, &opts);
    drop((ra, rb));
    summary(&c);
    if let Some(path) = &args.output {
        match write_page(&c, path) {
            Ok(p) => log!("compare: {}", p.display()),
            Err(e) => return unusable(&e.to_string()),
        }
    }
    if args.json {
        let mut text = compare::to_json(&c);
        text.push('\n');
        let _ = std::io::stdout().write_all(text.as_bytes());
    }
    exit_status(&c, args.mode.as_deref())
}

/// The status, with the one line that says why when there is a gate (or nothing to compare).
fn exit_status(c: &Comparison, mode: Option<&str>) -> ExitCode {
    if c.steps.is_empty() {
        let why = match mode {
            Some(m) => format!("no {} steps in both runs", m.to_uppercase()),
            None => "no step mode in both runs".into(),
        };
        return unusable(&why);
    }
    let Some(g) = &c.gate else { return ExitCode::SUCCESS };
    let usable = c.steps.get(&g.mode).is_some_and(|s| s.ratio.is_some());
    if !usable {
        return unusable(&g.why);
    }
    log!("gate: {}", g.why);
    if g.failed { ExitCode::from(status::FAILED_GATE) } else { ExitCode::SUCCESS }
}

/// The verdict per mode, what makes the runs hard to compare, the three largest movers.
fn summary(c: &Comparison) {
    for i in c.comparable.items.iter().filter(|i| i.status == compare::Status::Differs) {
        log!("not comparable: {}: A {}, B {}", i.what, i.a, i.b);
    }
    for (mode, s) in &c.steps {
        log!("{mode}: {} (median {} → {} ms)", s.text, ms(s.a.p50_ms), ms(s.b.p50_ms));
    }
    for m in c.movers.iter().take(3) {
        log!("moved: {} {}: {} → {} ms a step", m.kind.as_str(), m.name, ms(Some(m.a_ms)), ms(Some(m.b_ms)));
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.2}"))
}

/// Creates the page at `path`, never over a file or through a link.
fn write_page(c: &Comparison, path: &Path) -> Result<PathBuf, FileError> {
    let name =
        path.file_name().and_then(|n| n.to_str()).ok_or_else(|| FileError::NotAFileName(path.to_owned()))?;
    let parent = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let (mut f, shown) = rep::create_in(&parent, name)?;
    let page = compare::page::render(c);
    f.write_all(page.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|source| FileError::Io { path: shown.clone(), source })?;
    Ok(shown)
}
