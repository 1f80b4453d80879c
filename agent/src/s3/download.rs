//! The download of a job's files from S3 for `trainprof report s3://…`, `trainprof compare`
//! and the page at the end of `run --s3` (`docs/report.md`, "Inputs and outputs": S3): the keys the report
//! reads ([`trainprof_report::job_files`]), listed first and fetched within bounds, never
//! over a file or through a link.

use std::collections::HashSet;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use trainprof_output::fs::Dir;
use trainprof_report::job_files;

use super::store::{S3Options, S3Store, S3Url, chain};

/// Objects one S3 download fetches at most; the rest are skipped, counted.
pub const MAX_OBJECTS: u64 = 100_000;
/// Objects one S3 download fetches at once (`docs/report.md`, "Many ranks").
pub const DOWNLOAD_CONCURRENCY: usize = 16;
/// Bytes one S3 download fetches at most, in key order; the rest are skipped, counted.
pub const MAX_DOWNLOAD_BYTES: u64 = 4 << 30;
/// Keys listed at most (read or not): a prefix of millions of other keys is not walked to
/// its end.
pub const MAX_LISTED_KEYS: u64 = 1_000_000;
/// The largest Python-stats object fetched: the size the report reads at most
/// (docs/report.md, "Memory").
pub const MAX_STATS_OBJECT: u64 = trainprof_report::reading::MAX_STATS_BYTES;
/// The largest native-window file fetched: the size the report reads at most.
pub const MAX_NATIVE_OBJECT: u64 = trainprof_report::reading::native::MAX_FILE_BYTES;
/// The largest system file or timeline fetched: the timeline size the report reads at most.
pub const MAX_OBJECT: u64 = trainprof_report::reading::MAX_TIMELINE_BYTES;

/// The bounds of one S3 download.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    objects: u64,
    bytes: u64,
    listed: u64,
}

impl Bounds {
    const DOWNLOAD: Bounds =
        Bounds { objects: MAX_OBJECTS, bytes: MAX_DOWNLOAD_BYTES, listed: MAX_LISTED_KEYS };
}

/// What a listing picks for download, by the listed sizes, within [`Bounds`].
#[derive(Debug)]
struct Plan {
    bounds: Bounds,
    /// (key, key relative to the prefix, listed size), in listing (key) order.
    todo: Vec<(String, String, u64)>,
    bytes: u64,
    listed: u64,
    over: (u64, u64),
    skipped: Vec<String>,
}

impl Plan {
    fn new(bounds: Bounds) -> Plan {
        Plan { bounds, todo: Vec::new(), bytes: 0, listed: 0, over: (0, 0), skipped: Vec::new() }
    }

    /// A wanted key (`shown`: as the user reads it) and its listed size.
    fn offer(&mut self, shown: &str, key: &str, rel: &str, size: u64) {
        let most = job_files::max_bytes(rel);
        if size > most {
            self.skipped.push(format!("{shown}: {size} bytes, more than the {most} read: not downloaded"));
            return;
        }
        let total = self.bytes.saturating_add(size);
        if self.todo.len() as u64 >= self.bounds.objects || total > self.bounds.bytes {
            self.over = (self.over.0 + 1, self.over.1.saturating_add(size));
            return;
        }
        self.bytes = total;
        self.todo.push((key.to_owned(), rel.to_owned(), size));
    }

    /// What to fetch, and the reasons for what is not (`shown`: the prefix).
    fn finish(mut self, shown: &str) -> (Vec<(String, String, u64)>, Vec<String>) {
        let (n, bytes) = self.over;
        if n > 0 {
            self.skipped.push(format!(
                "{shown}: {n} objects ({bytes} bytes) past the download's bounds ({} objects, {} bytes): not downloaded",
                self.bounds.objects, self.bounds.bytes
            ));
        }
        (self.todo, self.skipped)
    }
}

/// Why a download stopped (a key skipped is no error: [`Downloaded::skipped`]).
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error(transparent)]
    Runtime(#[from] super::RuntimeError),
    /// The folder downloaded into cannot be opened.
    #[error("{}: {source}", path.display())]
    Folder { path: PathBuf, source: std::io::Error },
    /// The bucket cannot be listed; `detail`: the SDK's error chain ([`chain`]).
    #[error("listing s3://{bucket}/{prefix}: {detail}")]
    List { bucket: String, prefix: String, detail: String },
    /// An object cannot be fetched; `detail`: the SDK's error chain.
    #[error("reading s3://{bucket}/{key}: {detail}")]
    Fetch { bucket: String, key: String, detail: String },
    /// A fetched object cannot be written to its file (`rel`: the key relative to the prefix).
    #[error("{rel}: {source}")]
    Write { rel: String, source: std::io::Error },
    /// A fetch's task panicked or was cancelled.
    #[error("a download task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What a download fetched.
#[derive(Debug, Default)]
pub struct Downloaded {
    pub files: u64,
    pub bytes: u64,
    /// Keys left out, with why.
    pub skipped: Vec<String>,
}

/// Downloads the profiler files under `url` into the folder `into` (made private by the
/// caller), never over a file or through a link. The client is the uploader's
/// (`S3Store::connect`: the standard credential chain, rustls, the endpoint from
/// `--s3-endpoint` or `AWS_ENDPOINT_URL(_S3)`, path-style with an endpoint).
pub fn download(url: &S3Url, endpoint: Option<&str>, into: &Path) -> Result<Downloaded, DownloadError> {
    let rt = super::runtime()?;
    let got = rt.block_on(async {
        let options = S3Options { endpoint: endpoint.map(str::to_owned), ..S3Options::default() };
        let store = S3Store::connect(url.clone(), options).await;
        download_from(&store, into, None).await
    });
    rt.shutdown_background();
    got
}

/// One object being fetched: its folder, key, file (created here) and listed size.
type Opened = (Dir, String, File, u64);
/// A fetch's end: its index in the opened files, and the bytes written and whether the
/// object grew past its listed size.
type Fetched = (usize, Result<(u64, bool), DownloadError>);

/// [`download`] with a store already made; `only`: the keys (relative to the prefix) to
/// fetch, when not every profiler file under the prefix. The listing is read first: an
/// object larger than the report reads ([`MAX_STATS_OBJECT`], [`MAX_OBJECT`]) is skipped
/// by its listed size, and the download stops at [`MAX_OBJECTS`] and [`MAX_DOWNLOAD_BYTES`]
/// (in key order). A key that cannot be a file here (`x` beside `x/y`) or whose object grew
/// past its listed size is skipped; each skip is one reason. `Err` when the bucket cannot be
/// listed or an object cannot be fetched.
pub(crate) async fn download_from(
    store: &S3Store,
    into: &Path,
    only: Option<&HashSet<String>>,
) -> Result<Downloaded, DownloadError> {
    let (client, url) = (store.client(), store.url());
    let prefix = if url.prefix.is_empty() { String::new() } else { format!("{}/", url.prefix) };
    let root = Dir::open_root(into, false)
        .map_err(|source| DownloadError::Folder { path: into.to_owned(), source })?;
    let mut plan = Plan::new(Bounds::DOWNLOAD);
    let mut token: Option<String> = None;
    loop {
        let mut req = client.list_objects_v2().bucket(&url.bucket).prefix(&prefix);
        if let Some(t) = token.take() {
            req = req.continuation_token(t);
        }
        let out = req.send().await.map_err(|e| DownloadError::List {
            bucket: url.bucket.clone(),
            prefix: prefix.clone(),
            detail: chain(&e),
        })?;
        for obj in out.contents() {
            plan.listed += 1;
            let Some(key) = obj.key() else { continue };
            let Some(rel) = key.strip_prefix(&prefix) else { continue };
            if !job_files::wanted(rel) || only.is_some_and(|o| !o.contains(rel)) {
                continue;
            }
            let size = obj.size().and_then(|s| u64::try_from(s).ok()).unwrap_or(0);
            plan.offer(&format!("s3://{}/{key}", url.bucket), key, rel, size);
        }
        match out.next_continuation_token() {
            Some(_) if plan.listed >= plan.bounds.listed => {
                plan.skipped.push(format!(
                    "s3://{}/{prefix}: more than {} keys; the rest were not listed",
                    url.bucket, plan.bounds.listed
                ));
                break;
            }
            Some(t) if out.is_truncated() == Some(true) => token = Some(t.to_owned()),
            _ => break,
        }
    }
    let (todo, skipped) = plan.finish(&format!("s3://{}/{prefix}", url.bucket));
    let mut got = Downloaded { skipped, ..Downloaded::default() };
    // At most `DOWNLOAD_CONCURRENCY` objects in flight: each task streams its body into a
    // file created here (never over one), so memory is a few chunks per task, not objects.
    let mut running: tokio::task::JoinSet<Fetched> = tokio::task::JoinSet::new();
    let mut open: Vec<Option<Opened>> = Vec::new();
    let finish =
        |got: &mut Downloaded, open: &mut Vec<Option<Opened>>, done: Fetched| -> Result<(), DownloadError> {
            let (i, res) = done;
            // Each download finishes once.
            let Some((dir, key, f, size)) = open.get_mut(i).and_then(Option::take) else { return Ok(()) };
            let (written, grew) = res?;
            let name = key.rsplit('/').next().unwrap_or(&key);
            if grew {
                let _ = dir.unlink_if_same(name, &f);
                got.skipped.push(format!(
                "s3://{}/{key}: larger than its listed {size} bytes (replaced while read): not downloaded",
                url.bucket
            ));
            } else {
                got.files += 1;
                got.bytes += written;
            }
            Ok(())
        };
    for (key, rel, size) in todo {
        let (folder, name) = rel.rsplit_once('/').unwrap_or(("", rel.as_str()));
        let created = root.sub(folder, true).and_then(|d| d.create_new(name).map(|f| (d, f)));
        let (dir, f) = match created {
            Ok(x) => x,
            Err(e) => {
                // `x` beside `x/y`, or a name taken: this key only.
                got.skipped.push(format!("s3://{}/{key}: {e}: not downloaded", url.bucket));
                continue;
            }
        };
        let mut file = f.try_clone().map_err(|source| DownloadError::Write { rel: rel.clone(), source })?;
        open.push(Some((dir, key.clone(), f, size)));
        let i = open.len() - 1;
        let (client, bucket) = (client.clone(), url.bucket.clone());
        if running.len() >= DOWNLOAD_CONCURRENCY
            && let Some(done) = running.join_next().await
        {
            finish(&mut got, &mut open, done?)?;
        }
        running.spawn(async move {
            let res = async {
                let fetched = client
                    .get_object()
                    .bucket(&bucket)
                    .key(&key)
                    .send()
                    .await
                    .map_err(|e| fetch_error(&bucket, &key, chain(&e)))?;
                let mut body = fetched.body;
                let mut written = 0u64;
                while let Some(chunk) =
                    body.try_next().await.map_err(|e| fetch_error(&bucket, &key, e.to_string()))?
                {
                    written = written.saturating_add(chunk.len() as u64);
                    if written > size {
                        return Ok((written, true));
                    }
                    file.write_all(&chunk)
                        .map_err(|source| DownloadError::Write { rel: rel.clone(), source })?;
                }
                Ok((written, false))
            }
            .await;
            (i, res)
        });
    }
    while let Some(done) = running.join_next().await {
        finish(&mut got, &mut open, done?)?;
    }
    Ok(got)
}

fn fetch_error(bucket: &str, key: &str, detail: String) -> DownloadError {
    DownloadError::Fetch { bucket: bucket.to_owned(), key: key.to_owned(), detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_download_skips_by_listed_size_and_stops_at_its_bounds() {
        let mut plan = Plan::new(Bounds { objects: 2, bytes: 100, listed: 10 });
        let stats = "framework/pytorch/cprofile/0-algo-1/w/python_stats";
        plan.offer("s3://b/big", stats, stats, MAX_STATS_OBJECT + 1);
        plan.offer("s3://b/a", "a", "system/incremental/1/a.json", 60);
        // Past the bytes, then past the objects.
        plan.offer("s3://b/b", "b", "system/incremental/1/b.json", 60);
        plan.offer("s3://b/c", "c", "system/incremental/1/c.json", 40);
        plan.offer("s3://b/d", "d", "system/incremental/1/d.json", 0);
        let (todo, skipped) = plan.finish("s3://b/");
        let keys: Vec<&str> = todo.iter().map(|(k, _, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "c"]);
        assert_eq!(
            skipped,
            [
                format!("s3://b/big: {} bytes, more than the {MAX_STATS_OBJECT} read: not downloaded", MAX_STATS_OBJECT + 1),
                "s3://b/: 2 objects (60 bytes) past the download's bounds (2 objects, 100 bytes): not downloaded".to_owned(),
            ]
        );
        // A timeline may be larger than a stats file, up to what the report reads.
        let mut plan = Plan::new(Bounds::DOWNLOAD);
        plan.offer("s3://b/t", "t", "framework/pevents/1/t.json", MAX_STATS_OBJECT + 1);
        plan.offer("s3://b/u", "u", "framework/pevents/1/u.json", MAX_OBJECT + 1);
        let (todo, skipped) = plan.finish("s3://b/");
        assert_eq!(todo.len(), 1);
        assert_eq!(skipped.len(), 1, "{skipped:?}");
    }
}
