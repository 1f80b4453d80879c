//! `trainprof report` and `trainprof trace` (`docs/report.md`), and the report written at the
//! end of `trainprof run`. The work is in the `trainprof_report` crate; this module picks the
//! input (a LocalPath, or `s3://bucket/prefix` downloaded into a private temporary folder)
//! and creates the output file without ever replacing one (`O_EXCL | O_NOFOLLOW` through
//! `trainprof_output::fs`).

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use trainprof_output::fs::Dir;
use trainprof_report::model::ReportModel;
use trainprof_report::trace::Clip;

use crate::log;
use crate::upload::store::{ObjectStore as _, Put, S3Options, S3Store, S3Url};

/// The default output names.
pub const REPORT_FILE: &str = "report.html";
pub const TRACE_FILE: &str = "trace.json.gz";

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
pub fn input(path: &str, endpoint: Option<&str>) -> Result<Input, String> {
    if path.starts_with("s3://") {
        let url = S3Url::parse(path).map_err(|e| e.to_string())?;
        let temp = tempfile::Builder::new()
            .prefix("trainprof-report-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(|e| format!("cannot make a temporary folder: {e}"))?;
        let n = download(&url, endpoint, temp.path())?;
        if n == 0 {
            return Err(format!("{path}: no profiler files (system/, framework/) under this prefix"));
        }
        log!("downloaded {n} files from {path}");
        Ok(Input { root: temp.path().to_owned(), source: path.to_owned(), remote: true, _temp: Some(temp) })
    } else {
        if endpoint.is_some() {
            return Err("--s3-endpoint applies only to an s3:// PATH".to_owned());
        }
        let root = PathBuf::from(path);
        if !root.is_dir() {
            return Err(format!("{path}: not a folder"));
        }
        Ok(Input { root, source: path.to_owned(), remote: false, _temp: None })
    }
}

/// Creates `name` in `dir`, never over an existing file or through a link.
fn create_in(dir: &Path, name: &str) -> Result<(File, PathBuf), String> {
    let shown = dir.join(name);
    let d = Dir::open_root(dir, false).map_err(|e| format!("{}: {e}", dir.display()))?;
    match d.create_new(name) {
        Ok(f) => Ok((f, shown)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(format!("{} exists: not replaced (remove it, or name another file with -o)", shown.display()))
        }
        Err(e) => Err(format!("{}: {e}", shown.display())),
    }
}

/// The output file: `-o FILE`, else `default` in the LocalPath (or the current folder for S3).
fn output(flag: Option<&Path>, input: &Input, default: &str) -> Result<(File, PathBuf), String> {
    match flag {
        Some(p) => {
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| format!("{}: not a file name", p.display()))?;
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
            log!("{e}");
            return ExitCode::from(2);
        }
    };
    let opts = trainprof_report::Options { patience: args.patience, ..Default::default() };
    let model = match trainprof_report::build(&input.root, &input.source, &opts) {
        Ok(m) => m,
        Err(e) => {
            log!("{e}");
            return ExitCode::from(1);
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

fn write_html(model: &ReportModel, flag: Option<&Path>, input: &Input) -> Result<PathBuf, String> {
    let (mut f, path) = output(flag, input, REPORT_FILE)?;
    let page = trainprof_report::html::render(model);
    f.write_all(page.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// One line per triggered finding: `finding: <rule>: <summary>`.
pub fn triggered_lines(model: &ReportModel) -> Vec<String> {
    model
        .findings
        .iter()
        .filter(|f| f.triggered)
        .map(|f| format!("finding: {}: {}", f.rule, f.summary))
        .collect()
}

/// `trainprof trace`.
#[derive(Debug, Clone, Default)]
pub struct TraceArgs {
    pub path: String,
    pub output: Option<PathBuf>,
    pub s3_endpoint: Option<String>,
    pub clip: Clip,
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
            log!("{e}");
            return ExitCode::from(2);
        }
    };
    let (f, path) = match output(args.output.as_deref(), &input, TRACE_FILE) {
        Ok(x) => x,
        Err(e) => {
            log!("{e}");
            return ExitCode::from(1);
        }
    };
    let dir = path.parent().map(Path::to_owned).unwrap_or_else(|| PathBuf::from("."));
    match trainprof_report::trace::write(&input.root, &f, &args.clip) {
        Ok(w) => {
            let _ = f.sync_all();
            for s in &w.skipped {
                log!("skipped: {s}");
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
        Err(e) => {
            log!("{e}");
            // The half-written file is ours: remove it, but only while the name still holds it.
            if let (Ok(d), Some(name)) =
                (Dir::open_root(&dir, false), path.file_name().and_then(|n| n.to_str()))
            {
                let _ = d.unlink_if_same(name, &f);
            }
            ExitCode::from(1)
        }
    }
}

/// The report at the end of `trainprof run`: `report.html` in the output folder, on this
/// run's files only (`before`: the files that were there when it started). When an earlier
/// job's `report.html` is there, the first free of `report-2.html`, `report-3.html`, …
/// Returns the summary's lines (its path and one line per triggered finding); a failure is
/// one line, never a failed run.
pub fn at_end_of_run(root: &Path, before: &std::collections::HashSet<String>) -> Vec<String> {
    at_end_of_run_named(root, before).0
}

/// [`at_end_of_run`], with the name of the page written (`None`: none was).
pub fn at_end_of_run_named(
    root: &Path,
    before: &std::collections::HashSet<String>,
) -> (Vec<String>, Option<String>) {
    let opts = trainprof_report::Options { leave_out: before.clone(), ..Default::default() };
    let model = match trainprof_report::build(root, &root.display().to_string(), &opts) {
        Ok(m) => m,
        Err(e) => return (vec![format!("no report: {e}")], None),
    };
    match write_page(root, &model) {
        Ok(name) => {
            let mut lines = vec![format!("report: {}", root.join(&name).display())];
            lines.extend(triggered_lines(&model));
            (lines, Some(name))
        }
        Err(e) => (vec![format!("no report: {e}")], None),
    }
}

/// Writes the page of `model` into `root` under the first free name of `report.html`,
/// `report-2.html`, …; `Ok(name)`.
fn write_page(root: &Path, model: &ReportModel) -> Result<String, String> {
    let page = trainprof_report::html::render(model);
    let dir = Dir::open_root(root, false).map_err(|e| format!("{}: {e}", root.display()))?;
    let names = std::iter::once(REPORT_FILE.to_owned())
        .chain((2..=END_OF_RUN_TRIES).map(|n| format!("report-{n}.html")));
    for name in names {
        let mut f = match dir.create_new(&name) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("{}: {e}", root.join(&name).display())),
        };
        if let Err(e) = f.write_all(page.as_bytes()).and_then(|()| f.sync_all()) {
            return Err(format!("{}: {e}", root.join(&name).display()));
        }
        return Ok(name);
    }
    Err(format!("report.html to report-{END_OF_RUN_TRIES}.html all exist in {}", root.display()))
}

/// The page at the end of `run --s3` without `--keep-local` (`docs/report.md`, "At the end
/// of trainprof run"), once the uploader has finished and deleted what it sent: built from
/// the objects this run sent (`sent`), downloaded into a private temporary folder; written
/// into the LocalPath as for a run without upload, sent as one object under the prefix
/// (never over an existing one) and deleted once S3 has it. All of it within `within`;
/// past it, one line says the page was skipped and how to make it. Returns the summary's
/// lines.
pub fn at_end_of_s3_run(
    root: &Path,
    sent: std::collections::HashSet<String>,
    url: &S3Url,
    options: &S3Options,
    within: std::time::Duration,
) -> Vec<String> {
    let how = format!("`trainprof report s3://{}/{}` makes it", url.bucket, url.prefix);
    if within.is_zero() {
        return vec![format!("report: skipped, no time left of --upload-deadline-s; {how}")];
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let (root2, url2, options2) = (root.to_owned(), url.clone(), options.clone());
    let spawned = std::thread::Builder::new().name("trainprof-report".into()).spawn(move || {
        let lines = page_to_s3(&root2, &sent, url2, options2);
        let _ = tx.send(lines);
    });
    if let Err(e) = spawned {
        return vec![format!("no report: cannot start its thread: {e}; {how}")];
    }
    match rx.recv_timeout(within) {
        Ok(Ok(lines)) => lines,
        Ok(Err(e)) => vec![format!("no report: {e}; {how}")],
        Err(_) => vec![format!(
            "report: skipped, not done within what was left of --upload-deadline-s ({} s); {how}",
            within.as_secs()
        )],
    }
}

fn page_to_s3(
    root: &Path,
    sent: &std::collections::HashSet<String>,
    url: S3Url,
    options: S3Options,
) -> Result<Vec<String>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the S3 client: {e}"))?;
    rt.block_on(async {
        let s3 = format!("s3://{}/{}", url.bucket, url.prefix);
        let store = S3Store::connect(url, options).await;
        let temp = tempfile::Builder::new()
            .prefix("trainprof-report-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(|e| format!("cannot make a temporary folder: {e}"))?;
        download_from(&store, temp.path(), Some(sent)).await?;
        let model = trainprof_report::build(temp.path(), &s3, &trainprof_report::Options::default())
            .map_err(|e| e.to_string())?;
        drop(temp);
        let name = write_page(root, &model)?;
        let local = root.join(&name);
        let dir = Dir::open_root(root, false).map_err(|e| format!("{}: {e}", root.display()))?;
        let file = dir.open_regular(&name, false).map_err(|e| format!("{}: {e}", local.display()))?;
        let held = trainprof_output::fs::meta_of(&file).map_err(|e| format!("{}: {e}", local.display()))?;
        let key = format!("s3://{}/{}", store.url().bucket, store.url().key(&name));
        let mut lines = match store.put_file(&name, &file, held.len, true).await {
            Ok(Put::Stored) => match dir.unlink_if_holds(&name, &held) {
                Ok(_) => vec![format!("report: {key}")],
                Err(e) => vec![format!("report: {key} (the local copy {} stays: {e})", local.display())],
            },
            Ok(Put::Exists) => vec![format!(
                "report: {} (not uploaded: {key} already holds another object, not overwritten)",
                local.display()
            )],
            Err(e) => vec![format!("report: {} (not uploaded: {e})", local.display())],
        };
        lines.extend(triggered_lines(&model));
        Ok(lines)
    })
}

/// Names tried at the end of `run`.
const END_OF_RUN_TRIES: u32 = 100;

/// Whether an S3 key (relative to the prefix) is a file the report reads: system files,
/// timelines, Python-stats files (not the TF detailed profiles, which can be large), every
/// component a plain name.
fn wanted(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    let kind = rel.starts_with("system/incremental/")
        || rel.starts_with("framework/pevents/")
        || (rel.starts_with("framework/")
            && (rel.contains("/cprofile/") || rel.contains("/pyinstrument/"))
            && (name == "python_stats" || name == "python_stats.json"));
    kind && !rel.ends_with(".tmp")
        && rel.split('/').all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
}

/// Downloads the profiler files under `url` into the folder `into` (made private by the
/// caller), never over a file or through a link; `Ok(files)`. The client is the uploader's
/// (`S3Store::connect`: the standard credential chain, rustls, the endpoint from
/// `--s3-endpoint` or `AWS_ENDPOINT_URL(_S3)`, path-style with an endpoint).
fn download(url: &S3Url, endpoint: Option<&str>, into: &Path) -> Result<u64, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the S3 client: {e}"))?;
    rt.block_on(async {
        let options = S3Options { endpoint: endpoint.map(str::to_owned), ..S3Options::default() };
        let store = S3Store::connect(url.clone(), options).await;
        download_from(&store, into, None).await
    })
}

/// [`download`] with a store already made; `only`: the keys (relative to the prefix) to
/// fetch, when not every profiler file under the prefix.
async fn download_from(
    store: &S3Store,
    into: &Path,
    only: Option<&std::collections::HashSet<String>>,
) -> Result<u64, String> {
    use crate::upload::store::chain;

    let (client, url) = (store.client(), store.url());
    let prefix = if url.prefix.is_empty() { String::new() } else { format!("{}/", url.prefix) };
    let root = Dir::open_root(into, false).map_err(|e| format!("{}: {e}", into.display()))?;
    let mut token: Option<String> = None;
    let mut n = 0u64;
    loop {
        let mut req = client.list_objects_v2().bucket(&url.bucket).prefix(&prefix);
        if let Some(t) = token.take() {
            req = req.continuation_token(t);
        }
        let out =
            req.send().await.map_err(|e| format!("listing s3://{}/{prefix}: {}", url.bucket, chain(&e)))?;
        for obj in out.contents() {
            let Some(key) = obj.key() else { continue };
            let Some(rel) = key.strip_prefix(&prefix) else { continue };
            if !wanted(rel) || only.is_some_and(|o| !o.contains(rel)) {
                continue;
            }
            let (folder, name) = rel.rsplit_once('/').unwrap_or(("", rel));
            let mut f =
                root.sub(folder, true).and_then(|d| d.create_new(name)).map_err(|e| format!("{rel}: {e}"))?;
            let got = client
                .get_object()
                .bucket(&url.bucket)
                .key(key)
                .send()
                .await
                .map_err(|e| format!("reading s3://{}/{key}: {}", url.bucket, chain(&e)))?;
            let mut body = got.body;
            while let Some(chunk) =
                body.try_next().await.map_err(|e| format!("reading s3://{}/{key}: {e}", url.bucket))?
            {
                f.write_all(&chunk).map_err(|e| format!("{rel}: {e}"))?;
            }
            n += 1;
        }
        match out.next_continuation_token() {
            Some(t) if out.is_truncated() == Some(true) => token = Some(t.to_owned()),
            _ => break,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_profiler_keys_with_plain_components() {
        assert!(wanted("system/incremental/2026112203/1795316940.algo-1.json"));
        assert!(wanted("framework/pevents/2026112203/1_0-a_pythontimeline.json"));
        assert!(!wanted("framework/../../etc/passwd"));
        assert!(!wanted("system//x"));
        assert!(!wanted("report.html"));
        assert!(!wanted("system/training_job_end.ts"));
        assert!(!wanted("framework/x.json.1-1.tmp"));
        assert!(wanted(
            "framework/pytorch/cprofile/0-algo-1/train-1-stepstart-1.0_train-2-stepstart-2.0/python_stats"
        ));
        assert!(!wanted("framework/pytorch/cprofile/0-algo-1/w/python_stats.html"));
        assert!(!wanted("framework/tensorflow/detailed_profiling/2026112203/000000005/x.xplane.pb"));
    }

    #[test]
    fn an_existing_output_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(REPORT_FILE), "mine").unwrap();
        let input = Input { root: dir.path().to_owned(), source: String::new(), remote: false, _temp: None };
        let err = output(None, &input, REPORT_FILE).unwrap_err();
        assert!(err.contains("exists: not replaced"), "{err}");
        assert_eq!(std::fs::read_to_string(dir.path().join(REPORT_FILE)).unwrap(), "mine");
        // A planted link is not written through either.
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), dir.path().join(TRACE_FILE)).unwrap();
        assert!(output(None, &input, TRACE_FILE).is_err());
        assert!(!dir.path().join("elsewhere").exists());
    }
}
