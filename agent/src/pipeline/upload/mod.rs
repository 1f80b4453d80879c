//! Upload of every sealed file under `LocalPath` to S3 (docs/run.md, "Upload to S3 and crash
//! repair"; the files' rules: docs/on-disk.md).
//!
//! The uploader is one thread with its own single-threaded tokio runtime; nothing else in
//! the agent is async. It learns about files by walking `system/` and `framework/` under
//! the output root once a second (the hook's files are sealed by another process), and
//! sooner when the sampler wakes it after a seal. A file is uploaded when it is sealed:
//! hidden files, names ending in `.tmp` and the folders `.tmp/` and `.trainprof/` are
//! never looked at. Each upload asks the store first what it has under the key:
//! * nothing: the file is sent (in parts above a threshold);
//! * the same bytes (length and MD5): it is already there (a restart after an upload
//!   whose local delete did not happen) and is not sent again;
//! * something else: it is never overwritten; the file stays on disk, reported.
//!
//! Only after the store confirmed it is a file deleted, or with `--keep-local` recorded in
//! `.trainprof/uploaded` and left in place. Failures back off as [`retry`] describes; the
//! files wait on disk. Pending files are bounded by `spool_max_bytes`: past it the oldest
//! pending files are deleted, counted and logged (the training's disk matters more than
//! the oldest profile data). The end markers go last, once nothing else is pending, and
//! only when the agent finishes. At the finish the uploader has until a deadline; what
//! is not in S3 by then stays on disk and is listed in the report.
//!
//! The temporary files of writers that died are repaired ([`repair`]) at every walk once
//! they are a few seconds old and unlocked, so a trainer killed under a running agent
//! still gets its timeline uploaded.

pub mod repair;
pub mod retry;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use trainprof_output::fs::{self as ofs, Dir, Meta};
use trainprof_output::ledger;

use self::retry::{Backoff, Policy};
use crate::s3::store::{self, ErrorClass, ObjectStore, Put, StoreError};

/// Entries left alone that are listed one by one; past this, one line says there are more.
const MAX_LISTED: usize = 10_000;

/// The marker files: uploaded after everything else, at the finish only.
const MARKERS: [&str; 2] = trainprof_output::END_MARKERS;

/// Where `--keep-local` records the files S3 has (`trainprof_output::ledger`).
pub const LEDGER: &str = ".trainprof/uploaded";

/// What the uploader is told to do.
#[derive(Debug, Clone)]
pub struct Settings {
    pub root: PathBuf,
    /// Keep uploaded files (recorded in [`LEDGER`]) instead of deleting them.
    pub keep_local: bool,
    /// Bytes of pending files above which the oldest are dropped.
    pub spool_max_bytes: u64,
    /// Uploads in flight at once.
    pub concurrency: usize,
    pub scan_interval: Duration,
    /// Temporary files younger than this are not repaired while running.
    pub repair_min_age: Duration,
    pub policy: Policy,
}

impl Settings {
    pub fn new(root: &Path) -> Settings {
        Settings {
            root: root.to_owned(),
            keep_local: false,
            spool_max_bytes: 1 << 30,
            concurrency: 4,
            scan_interval: Duration::from_secs(1),
            repair_min_age: Duration::from_secs(5),
            policy: Policy::default(),
        }
    }
}

/// What the uploader is asked from outside.
#[derive(Debug)]
pub enum Msg {
    /// A file was sealed: walk now.
    Wake,
    /// Upload what is there, the markers last, then stop; give up at the deadline.
    Finish { deadline: Instant },
}

/// What the uploader did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub uploaded: u64,
    pub uploaded_bytes: u64,
    /// Files the store already had with the same bytes: not sent again.
    pub already_there: u64,
    pub failed_attempts: u64,
    /// Files the store has different bytes for under the same key: kept on disk.
    pub conflicts: u64,
    /// Files the store refused for themselves (an unreadable file, a key S3 will not
    /// take): kept on disk, tried again at the next start.
    pub rejected: u64,
    /// Pending files deleted because the spool was full.
    pub spool_dropped: u64,
    pub spool_dropped_bytes: u64,
    /// Temporary files repaired while running.
    pub repaired: u64,
    /// Entries left alone in the output tree: links, special files, hard-linked files.
    pub refused: u64,
}

/// The uploader's final word.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub counts: Counts,
    /// Files (relative paths) still on disk and not in the store.
    pub left: Vec<String>,
    /// The last error, if the store was failing at the end.
    pub last_error: Option<String>,
    /// Files (relative paths) the store confirmed in this run, uploaded or already there.
    pub sent: Vec<String>,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    len: u64,
    /// When a walk first saw this file: the spool bound drops the oldest first. Not the
    /// file's mtime, which whoever wrote the file chooses.
    seen: SystemTime,
    /// The file as walked: only this file is ever deleted under its name.
    meta: Meta,
}

/// What an upload task returns: the file's path and what became of it (with the file
/// that was sent).
type Done = (String, Result<(Outcome, Meta), StoreError>);

enum Outcome {
    /// The name no longer holds the file the walk saw (or it gained a hard link): nothing
    /// sent; the next walk looks at it again.
    Changed,
    Uploaded,
    AlreadyThere,
    Conflict,
}

/// The uploader's state between events.
struct Uploader<S> {
    store: Arc<S>,
    settings: Settings,
    counts: Counts,
    pending: BTreeMap<String, Pending>,
    in_flight: HashSet<String>,
    /// Uploaded files still on disk (`--keep-local`, or a delete that failed), with their
    /// length when uploaded.
    done: HashMap<String, u64>,
    /// Files kept on disk for good in this run: other bytes in the store, or refused.
    set_aside: HashSet<String>,
    /// When each file was last tried: while failing, the least recently tried goes next,
    /// so one bad file cannot hold the others up.
    tried: HashMap<String, Instant>,
    tasks: HashMap<tokio::task::Id, String>,
    backoff: Backoff,
    not_before: Instant,
    /// The class of the failure being reported, so each state change is logged once.
    failing: Option<ErrorClass>,
    /// Lines about the store's state (failing, reachable again): at most one per 30 s.
    state_log: StateLog,
    last_error: Option<String>,
    spool_full: bool,
    finishing: bool,
    /// A fatal refusal after `Finish`: the end comes now, not at the deadline.
    gave_up: bool,
    /// Repair failures already logged (a file that cannot be repaired stays and fails
    /// again at every walk).
    repair_failures: HashSet<String>,
    /// Hard-linked files seen in the last walk: said when they are still there at the next.
    linked: HashSet<String>,
    sent: Vec<String>,
}

/// Runs the uploader until `Finish` arrives (or every sender is gone) and its work is done
/// or its deadline passed.
pub async fn run<S: ObjectStore>(store: S, settings: Settings, mut rx: mpsc::Receiver<Msg>) -> Report {
    let seed = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id());
    let mut up = Uploader {
        store: Arc::new(store),
        counts: Counts::default(),
        pending: BTreeMap::new(),
        in_flight: HashSet::new(),
        done: if settings.keep_local { read_ledger(&settings.root) } else { HashMap::new() },
        set_aside: HashSet::new(),
        tried: HashMap::new(),
        tasks: HashMap::new(),
        backoff: Backoff::new(settings.policy, seed),
        not_before: Instant::now(),
        failing: None,
        state_log: StateLog::default(),
        last_error: None,
        spool_full: false,
        finishing: false,
        gave_up: false,
        repair_failures: HashSet::new(),
        linked: HashSet::new(),
        sent: Vec::new(),
        settings,
    };
    let mut tasks: JoinSet<Done> = JoinSet::new();
    let mut next_scan = Instant::now();
    let mut deadline: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if now >= next_scan {
            // The walk and the repair are blocking file work: off the runtime's thread, so
            // uploads in flight go on, and bounded by the deadline.
            let root = up.settings.root.clone();
            let min_age = if up.finishing { Duration::ZERO } else { up.settings.repair_min_age };
            let walk = tokio::task::spawn_blocking(move || {
                crate::pipeline::cost::enroll(crate::pipeline::cost::Part::Upload);
                let sealed = sealed_files(&root);
                let walked = (repair::repair_all(&root, min_age, SystemTime::now()), sealed);
                crate::pipeline::cost::flush();
                walked
            });
            crate::pipeline::cost::flush();
            let walked = match deadline {
                Some(d) => tokio::time::timeout_at(d, walk).await.ok(),
                None => Some(walk.await),
            };
            match walked {
                Some(Ok((repaired, files))) => up.scan(repaired, files),
                Some(Err(e)) => crate::log!("walking {} failed: {e}", up.settings.root.display()),
                None => {}
            }
            next_scan = Instant::now() + up.settings.scan_interval;
        }
        let now = Instant::now();
        // Past the deadline nothing new starts (with a deadline of 0: nothing at all once
        // `Finish` came).
        if deadline.is_none_or(|d| now < d) {
            up.start_uploads(&mut tasks, now);
        }
        if up.finishing && up.pending.is_empty() && tasks.is_empty() {
            break;
        }
        let wake_at = if up.pending.len() > up.in_flight.len() && up.not_before > now {
            next_scan.min(up.not_before)
        } else {
            next_scan
        };
        let wake_at = deadline.map_or(wake_at, |d| wake_at.min(d));
        tokio::select! {
            msg = rx.recv(), if !up.finishing => match msg {
                Some(Msg::Wake) => next_scan = Instant::now(),
                Some(Msg::Finish { deadline: d }) => {
                    up.finishing = true;
                    deadline = Some(d);
                    next_scan = Instant::now();
                    // One more try right away, whatever the back-off said (a fatal error's
                    // probe interval is longer than the deadline).
                    up.not_before = Instant::now();
                }
                None => {
                    up.finishing = true;
                    deadline = Some(Instant::now());
                }
            },
            Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                match joined {
                    Ok((id, (rel, result))) => {
                        up.tasks.remove(&id);
                        up.finished(rel, result);
                    }
                    Err(e) => {
                        // A panic in one upload: that file waits for the next start.
                        if let Some(rel) = up.tasks.remove(&e.id()) {
                            crate::log!("uploading {rel} ended abnormally: {e}; it stays on disk");
                            up.in_flight.remove(&rel);
                            up.pending.remove(&rel);
                            up.set_aside.insert(rel);
                        }
                    }
                }
            }
            () = tokio::time::sleep_until(wake_at) => {}
        }
        if up.gave_up || deadline.is_some_and(|d| Instant::now() >= d) {
            // Everything in flight is dropped: those files stay on disk. A request that got
            // no answer by the deadline counts as failed, and says so.
            let unanswered = tasks.len() as u64;
            tasks.abort_all();
            up.in_flight.clear();
            up.counts.failed_attempts += unanswered;
            if up.last_error.is_none() && unanswered > 0 {
                up.last_error = Some(format!(
                    "{} did not answer {unanswered} request(s) before the deadline",
                    up.store.describe()
                ));
            }
            if up.last_error.is_none() && !up.pending.is_empty() {
                up.last_error = Some("the deadline passed before these files were sent".to_owned());
            }
            break;
        }
    }
    up.report()
}

impl<S: ObjectStore> Uploader<S> {
    /// Takes in a walk (what the repair did, the sealed files) and brings `pending` up to
    /// date with the disk.
    fn scan(&mut self, r: repair::RepairReport, walked: Sealed) {
        // A file that cannot be repaired stays and fails again at every walk: said once.
        self.counts.repaired += r.log(&mut self.repair_failures);
        let mut linked = HashSet::new();
        for why in walked.refused {
            // A sealing writer's second link lasts microseconds: only one that stays counts.
            if why.ends_with("hard links") && !self.linked.contains(&why) {
                linked.insert(why);
                continue;
            }
            if why.ends_with("hard links") {
                linked.insert(why.clone());
            }
            if self.repair_failures.len() >= MAX_LISTED {
                if self.repair_failures.insert(String::new()) {
                    crate::log!("more than {MAX_LISTED} entries left alone: the others are not listed");
                }
                continue;
            }
            if self.repair_failures.insert(why.clone()) {
                self.counts.refused += 1;
                crate::log!("left alone, not uploaded: {why}");
            }
        }
        self.linked = linked;
        let mut seen = HashSet::new();
        for (rel, meta) in walked.files {
            let is_marker = MARKERS.contains(&rel.as_str());
            seen.insert(rel.clone());
            if (is_marker && !self.finishing)
                || self.in_flight.contains(&rel)
                || self.set_aside.contains(&rel)
                || self.done.get(&rel) == Some(&meta.len)
            {
                continue;
            }
            let seen = match self.pending.get(&rel) {
                Some(p) if p.meta.is_same(&meta) => p.seen,
                _ => SystemTime::now(),
            };
            self.pending.insert(rel, Pending { len: meta.len, seen, meta });
        }
        // Gone from the disk (someone else cleaned up): nothing left to upload.
        self.pending.retain(|rel, _| seen.contains(rel) || self.in_flight.contains(rel));
        self.bound_spool();
    }

    /// Deletes the oldest pending files while the pending bytes exceed the bound.
    fn bound_spool(&mut self) {
        // Bytes on disk: a sparse file costs what it takes, not what it claims.
        let cost = |p: &Pending| p.len.min(p.meta.allocated);
        let total: u64 = self.pending.values().map(cost).sum();
        if total <= self.settings.spool_max_bytes {
            if self.spool_full {
                crate::log!("spool below {} bytes again", self.settings.spool_max_bytes);
                self.spool_full = false;
            }
            return;
        }
        let mut oldest: Vec<(SystemTime, String, u64, Meta)> = self
            .pending
            .iter()
            .filter(|(rel, _)| !self.in_flight.contains(*rel) && !MARKERS.contains(&rel.as_str()))
            .map(|(rel, p)| (p.seen, rel.clone(), cost(p), p.meta))
            .collect();
        oldest.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let mut excess = total - self.settings.spool_max_bytes;
        let (mut files, mut bytes) = (0u64, 0u64);
        for (_, rel, len, meta) in oldest {
            if excess == 0 {
                break;
            }
            if remove_uploaded(&self.settings.root, &rel, &meta).unwrap_or(false) {
                self.pending.remove(&rel);
                excess = excess.saturating_sub(len);
                files += 1;
                bytes += len;
            }
        }
        self.counts.spool_dropped += files;
        self.counts.spool_dropped_bytes += bytes;
        if !self.spool_full {
            crate::log!(
                "spool full: more than {} bytes wait for S3; deleting the oldest files ({files} so far, {bytes} bytes)",
                self.settings.spool_max_bytes
            );
            self.spool_full = true;
        }
    }

    fn start_uploads(&mut self, tasks: &mut JoinSet<Done>, now: Instant) {
        if now < self.not_before {
            return;
        }
        let data_waiting = self.pending.keys().any(|rel| !MARKERS.contains(&rel.as_str()));
        let mut order: Vec<(Option<Instant>, SystemTime, &String)> = self
            .pending
            .iter()
            .filter(|(rel, _)| !self.in_flight.contains(*rel))
            // Markers only when nothing else is waiting or in flight.
            .filter(|(rel, _)| {
                !MARKERS.contains(&rel.as_str()) || (!data_waiting && self.in_flight.is_empty())
            })
            .map(|(rel, p)| (self.tried.get(rel).copied(), p.seen, rel))
            .collect();
        order.sort();
        // While failing, one request at a time probes the store.
        let slots = if self.failing.is_some() { 1 } else { self.settings.concurrency.max(1) };
        let starts: Vec<String> = order
            .into_iter()
            .take(slots.saturating_sub(self.in_flight.len()))
            .map(|(_, _, rel)| rel.clone())
            .collect();
        for rel in starts {
            self.in_flight.insert(rel.clone());
            self.tried.insert(rel.clone(), now);
            let store = Arc::clone(&self.store);
            let root = self.settings.root.clone();
            let task_rel = rel.clone();
            let walked = self.pending.get(&rel).map(|p| p.meta);
            let handle = tasks.spawn(async move {
                // A marker is a time, not data: a newer one replaces an older job's.
                let replace = MARKERS.contains(&rel.as_str());
                let result = upload_one(&*store, &rel, &root, replace, walked).await;
                (rel, result)
            });
            self.tasks.insert(handle.id(), task_rel);
        }
    }

    fn finished(&mut self, rel: String, result: Result<(Outcome, Meta), StoreError>) {
        self.in_flight.remove(&rel);
        match result {
            Ok((outcome, meta)) => {
                self.tried.remove(&rel);
                self.backoff.success();
                self.state_log.succeeded();
                if self.failing.take().is_some() {
                    let line = format!("{} reachable again: uploading", self.store.describe());
                    self.state_log.change(Instant::now(), line);
                    self.last_error = None;
                }
                self.pending.remove(&rel);
                // What was sent: the open file's length.
                let len = meta.len;
                match outcome {
                    Outcome::Changed => {}
                    Outcome::Uploaded => {
                        self.counts.uploaded += 1;
                        self.counts.uploaded_bytes += len;
                        self.confirmed(&rel, len, &meta);
                    }
                    Outcome::AlreadyThere => {
                        self.counts.already_there += 1;
                        self.confirmed(&rel, len, &meta);
                    }
                    Outcome::Conflict => {
                        crate::log!(
                            "{}/{rel} already holds other bytes: not overwritten; the file stays at {}",
                            self.store.describe(),
                            self.settings.root.join(&rel).display()
                        );
                        self.counts.conflicts += 1;
                        self.set_aside.insert(rel);
                    }
                }
            }
            Err(e) if e.file_only => {
                crate::log!(
                    "{} refused {rel}: {e}; the file stays at {} (tried again at the next start)",
                    self.store.describe(),
                    self.settings.root.join(&rel).display()
                );
                self.counts.failed_attempts += 1;
                self.counts.rejected += 1;
                self.tried.remove(&rel);
                self.pending.remove(&rel);
                self.set_aside.insert(rel);
            }
            Err(e) => {
                self.counts.failed_attempts += 1;
                self.state_log.failed();
                let delay = self.backoff.failure(e.class);
                self.not_before = Instant::now() + delay;
                self.last_error = Some(e.to_string());
                let waiting = self.pending.len();
                let root = self.settings.root.display();
                if self.finishing && e.class == ErrorClass::Fatal {
                    // Refused after Finish (missing credentials, no such bucket): waiting
                    // out the deadline would only delay the end. The error is named once.
                    if self.failing == Some(ErrorClass::Fatal) {
                        crate::log!("upload still refused at the end: not waiting for the deadline");
                    } else if e.is_no_credentials() {
                        crate::log!("{}", no_credentials(waiting, &root));
                    } else {
                        crate::log!(
                            "UPLOAD REFUSED by {} at the end ({e}); not waiting for the deadline",
                            self.store.describe()
                        );
                    }
                    self.gave_up = true;
                    return;
                }
                if self.failing != Some(e.class) {
                    let line = match e.class {
                        ErrorClass::Fatal if e.is_no_credentials() => no_credentials(waiting, &root),
                        ErrorClass::Fatal => format!(
                            "UPLOAD REFUSED by {}: {e}. {waiting} files wait under {root}; trying again every {} s",
                            self.store.describe(),
                            self.settings.policy.fatal.as_secs()
                        ),
                        ErrorClass::Retry | ErrorClass::Throttled => format!(
                            "upload to {} failing ({e}); {waiting} files wait under {root}, retrying with back-off",
                            self.store.describe(),
                        ),
                    };
                    self.state_log.change(Instant::now(), line);
                    self.failing = Some(e.class);
                }
            }
        }
        // A change that was held back is said once its 30 s are over.
        self.state_log.flush(Instant::now());
    }

    /// The store has `rel`: delete it, or record it and keep it.
    fn confirmed(&mut self, rel: &str, len: u64, meta: &Meta) {
        self.sent.push(rel.to_owned());
        if !self.settings.keep_local {
            // Only the file that was sent: a name that now holds another file keeps it.
            match remove_uploaded(&self.settings.root, rel, meta) {
                Ok(_) => return,
                Err(e) => {
                    crate::log!(
                        "uploaded {} but cannot delete it: {e}",
                        self.settings.root.join(rel).display()
                    );
                }
            }
        }
        if let Err(e) = append_ledger(&self.settings.root, rel, len) {
            crate::log!("cannot record {rel} in {LEDGER}: {e}");
        }
        self.done.insert(rel.to_owned(), len);
    }

    fn report(self) -> Report {
        let mut left: Vec<String> = self.pending.keys().chain(self.set_aside.iter()).cloned().collect();
        // Markers are only pending at the finish; list any that did not make it.
        let on_disk = |rel: &str| {
            let (folder, name) = rel.rsplit_once('/').unwrap_or(("", rel));
            Dir::open_root(&self.settings.root, false)
                .and_then(|r| r.sub(folder, false))
                .and_then(|d| d.stat(name))
                .is_ok_and(|m| m.kind() == ofs::Kind::File)
        };
        for m in MARKERS {
            if on_disk(m) && !self.done.contains_key(m) && !left.iter().any(|l| l == m) {
                left.push(m.to_owned());
            }
        }
        left.sort();
        left.dedup();
        Report { counts: self.counts, left, last_error: self.last_error, sent: self.sent }
    }
}

/// "no AWS credentials found; N files kept in DIR; `--s3 ''` keeps files local"
fn no_credentials(waiting: usize, root: &impl std::fmt::Display) -> String {
    format!("no AWS credentials found; {waiting} files kept in {root}; `--s3 ''` keeps files local")
}

/// How often at most the store's state (failing, reachable again) is logged.
const STATE_LOG_EVERY: Duration = Duration::from_secs(30);

/// The store's state changes, said at most once per [`STATE_LOG_EVERY`]: the first at
/// once; one within the period after it is held back and said when the period is over
/// (the latest state, with the failed attempts and uploads since the last line), so a
/// flaky store gives one line per 30 s, not one per change.
#[derive(Debug, Default)]
struct StateLog {
    last: Option<Instant>,
    /// The latest change not said yet.
    held: Option<String>,
    failed: u64,
    uploaded: u64,
}

impl StateLog {
    fn failed(&mut self) {
        self.failed += 1;
    }

    fn succeeded(&mut self) {
        self.uploaded += 1;
    }

    /// A change of state: the line to say (now or later).
    fn change(&mut self, now: Instant, line: String) {
        self.held = Some(line);
        self.flush(now);
    }

    /// Says the held change if the period is over; returns what it said (for tests).
    fn flush(&mut self, now: Instant) -> Option<String> {
        if self.last.is_some_and(|t| now.duration_since(t) < STATE_LOG_EVERY) {
            return None;
        }
        let mut line = self.held.take()?;
        if let Some(t) = self.last {
            use std::fmt::Write as _;
            let _ = write!(
                line,
                " ({} failed attempts, {} files sent in the last {} s)",
                self.failed,
                self.uploaded,
                now.duration_since(t).as_secs()
            );
        }
        crate::log!("{line}");
        self.last = Some(now);
        self.failed = 0;
        self.uploaded = 0;
        Some(line)
    }
}

/// Sends the file at `rel` under `root` (opened without following a link, and only if it
/// is a regular file) unless the store has something under `rel` (unless `replace`); if
/// it has, compares: the same bytes are already there, other bytes are a conflict.
/// Only the file the walk saw (`walked`) is sent, and only while it has no other hard
/// link: a name swapped since the walk is [`Outcome::Changed`]. Returns what happened and
/// the file that was sent.
async fn upload_one<S: ObjectStore>(
    store: &S,
    rel: &str,
    root: &Path,
    replace: bool,
    walked: Option<Meta>,
) -> Result<(Outcome, Meta), StoreError> {
    let io_error = |e: std::io::Error| StoreError {
        class: ErrorClass::Retry,
        code: "io".to_owned(),
        op: "read",
        key: rel.to_owned(),
        detail: e.to_string(),
        // Out of descriptors or memory is the agent's state, not the file's: tried again.
        file_only: !matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM)),
    };
    let (_, _, file) =
        Dir::open_root(root, false).and_then(|r| ofs::open_at(&r, rel, false)).map_err(io_error)?;
    let meta = ofs::meta_of(&file).map_err(io_error)?;
    if walked.is_none_or(|w| !w.is_same(&meta)) || !meta.is_plain_file() || meta.is_mostly_holes() {
        return Ok((Outcome::Changed, meta));
    }
    let len = meta.len;
    if store.put_file(rel, &file, len, !replace).await? == Put::Stored {
        return Ok((Outcome::Uploaded, meta));
    }
    let remote = match store.head(rel).await {
        Ok(Some(remote)) => remote,
        // Gone again in between: the next attempt puts it.
        Ok(None) => {
            return Err(StoreError {
                class: ErrorClass::Retry,
                code: "Vanished".to_owned(),
                op: "HeadObject",
                key: rel.to_owned(),
                detail: "the object that blocked the put is gone".to_owned(),
                file_only: false,
            });
        }
        // Not allowed to look (no s3:GetObject): never overwrite what cannot be compared.
        Err(e) if e.class == ErrorClass::Fatal => return Ok((Outcome::Conflict, meta)),
        Err(e) => return Err(e),
    };
    if remote.len != len {
        return Ok((Outcome::Conflict, meta));
    }
    let outcome = match remote.etag.as_deref() {
        // A multipart ETag is not the file's MD5 (nor one under SSE-KMS): the length has
        // to do.
        Some(tag) if !tag.contains('-') && tag.len() == 32 && tag != md5_hex(&file).map_err(io_error)? => {
            Outcome::Conflict
        }
        _ => Outcome::AlreadyThere,
    };
    Ok((outcome, meta))
}

fn md5_hex(file: &std::fs::File) -> std::io::Result<String> {
    use md5::Digest as _;
    use std::os::unix::fs::FileExt as _;
    let mut hasher = md5::Md5::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = 0;
    loop {
        let n = file.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(hex(&hasher.finalize()))
}

#[cfg(test)]
fn md5_hex_bytes(bytes: &[u8]) -> String {
    use md5::Digest as _;
    hex(&md5::Md5::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(32), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// What a walk of the output tree found: every sealed file under `root/system` and
/// `root/framework` with its `lstat`, as `/`-separated paths relative to `root`. Hidden
/// entries and `*.tmp` are skipped; links, special files and files with a second hard
/// link are never read nor deleted, only listed in `refused` (`docs/on-disk.md`).
#[derive(Debug, Default)]
pub struct Sealed {
    pub files: Vec<(String, Meta)>,
    pub refused: Vec<String>,
}

/// Walks the output tree for sealed files ([`Sealed`]); never through a link.
pub fn sealed_files(root: &Path) -> Sealed {
    let mut out = Sealed::default();
    let root = match Dir::open_root(root, false) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            out.refused.push(format!("cannot open {}: {e}", root.display()));
            return out;
        }
    };
    let keep = |name: &str, _is_dir: bool| !name.starts_with('.') && !name.ends_with(".tmp");
    for top in ["system", "framework"] {
        let walk = ofs::walk(&root, top, &keep);
        out.refused.extend(walk.refused);
        for (rel, meta) in walk.files {
            if meta.nlink > 1 {
                // A hard link to a file elsewhere is not ours to send or delete (a
                // sealing writer's second link lasts microseconds: the caller says so
                // only when it stays).
                out.refused.push(format!("{} has {} hard links", root.display(&rel).display(), meta.nlink));
                continue;
            }
            if meta.is_mostly_holes() {
                // Holes no writer of ours makes (docs/on-disk.md, "Files the readers refuse"): sending
                // 20 GB of zeros would cost the files after it their deadline.
                out.refused.push(format!(
                    "{} is {} bytes with {} on disk (mostly holes)",
                    root.display(&rel).display(),
                    meta.len,
                    meta.allocated
                ));
                continue;
            }
            out.files.push((rel, meta));
        }
    }
    out
}

fn read_ledger(root: &Path) -> HashMap<String, u64> {
    let lines = Dir::open_root(root, false).and_then(|r| ledger::read(&r, ledger::UPLOADED));
    let lines = lines.unwrap_or_else(|e| {
        crate::log!("cannot read {LEDGER}: {e}; files listed there may be uploaded again");
        Vec::new()
    });
    lines
        .iter()
        .filter_map(|l| {
            let (rel, len) = l.rsplit_once('\t')?;
            // A marker of an earlier job is no reason to skip this job's.
            if MARKERS.contains(&rel) {
                return None;
            }
            Some((rel.to_owned(), len.parse().ok()?))
        })
        .collect()
}

fn append_ledger(root: &Path, rel: &str, len: u64) -> std::io::Result<()> {
    let root = Dir::open_root(root, false)?;
    ledger::append(&root, ledger::UPLOADED, &format!("{rel}\t{len}"))
}

/// Removes the file at `rel` only while it is still the file that was uploaded (`held`):
/// `Ok(false)` when the name is gone or now names another file.
fn remove_uploaded(root: &Path, rel: &str, held: &Meta) -> std::io::Result<bool> {
    let root = Dir::open_root(root, false)?;
    let (folder, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    root.sub(folder, false)?.unlink_if_holds(name, held)
}

/// The uploader's thread, seen from the rest of the agent.
#[derive(Debug)]
pub struct Handle {
    tx: mpsc::Sender<Msg>,
    done: std::sync::mpsc::Receiver<Report>,
}

/// Tells the uploader that a file was sealed.
#[derive(Debug, Clone)]
pub struct Waker(mpsc::Sender<Msg>);

impl Waker {
    /// Never blocks: when the channel is full a walk is due anyway.
    pub fn wake(&self) {
        let _ = self.0.try_send(Msg::Wake);
    }
}

impl Handle {
    pub fn waker(&self) -> Waker {
        Waker(self.tx.clone())
    }

    /// Asks for the final uploads and waits for them, at most `within` (plus a second for
    /// the report). `None` when the uploader did not answer in time or had stopped.
    pub fn finish(self, within: Duration) -> Option<Report> {
        let deadline = std::time::Instant::now() + within;
        let mut msg = Msg::Finish { deadline: Instant::now() + within };
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(mpsc::error::TrySendError::Closed(_)) => break,
                Err(mpsc::error::TrySendError::Full(m)) if std::time::Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(mpsc::error::TrySendError::Full(_)) => return None,
            }
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        self.done.recv_timeout(left + Duration::from_secs(1)).ok()
    }
}

/// Starts the uploader thread for S3.
pub fn spawn_s3(url: store::S3Url, options: store::S3Options, settings: Settings) -> std::io::Result<Handle> {
    // Room for a few wakes; a full channel means a walk is due anyway (see `wake`).
    let (tx, rx) = mpsc::channel(8);
    let (done_tx, done) = std::sync::mpsc::sync_channel(1);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name("trainprof-upload".into()).spawn(move || {
        crate::pipeline::cost::enroll(crate::pipeline::cost::Part::Upload);
        let uploaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(async {
                let s3 = store::S3Store::connect(url, options).await;
                run(s3, settings, rx).await
            })
        }));
        match uploaded {
            Ok(report) => {
                let _ = done_tx.send(report);
            }
            // The sender is dropped: `finish` sees it at once, the files stay on disk.
            Err(_) => crate::log!("the uploader stopped on an internal error; files stay on disk"),
        }
        // Connections still open to a dead server must not hold the exit up.
        runtime.shutdown_background();
        crate::pipeline::cost::flush();
    })?;
    Ok(Handle { tx, done })
}
