//! The framework timeline writer (docs/formats.md, "Timeline files"), run by the hook's one background thread.
//!
//! A file is opened lazily at the first event, under a new temporary name that no smdebug
//! reader matches (`framework/<node>_pythontimeline.json.<pid>-<k>.tmp`, created with
//! `O_EXCL | O_NOFOLLOW`, so a leftover or a planted link is never truncated, appended to
//! or written through), and locked (`flock`) for its whole life, so that the agent's repair
//! can tell it from a dead writer's. All file calls follow the on-disk protocol
//! (`docs/on-disk.md`, `trainprof_output::fs`). A file is *sealed* — closed with
//! `\n]`, flushed, fsync'd and renamed (never over an existing name) to
//! `framework/pevents/<hour>/<T>_<node>_pythontimeline.json` — when it reaches
//! `RotateMaxFileSizeInBytes`, when it has been open for `RotateFileCloseIntervalInSeconds`
//! (also while idle, unlike smdebug), and at shutdown.
//!
//! `<T>` is the largest event end inside the file, raised if needed to one more than the
//! previous file's, so names strictly increase and no file replaces another (docs/formats.md,
//! traps T20 and T21). Every time is passed in by the caller, so tests need no sleeping.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::Arc;

use trainprof_output::fs::{self as ofs, Dir, Move};

use crate::event::Event;
use crate::trace;

/// What the writer needs to know, fixed for its lifetime except the rotation limits.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `LocalPath`.
    pub root: PathBuf,
    pub node_id: String,
    /// Written as `args.pid` of every event.
    pub os_pid: u32,
    pub rotate_max_bytes: u64,
    pub rotate_interval_us: i64,
    pub file_open_fail_threshold: u32,
}

/// `RotateFileCloseIntervalSeconds` in µs ([`Settings::rotate_interval_us`]); not a
/// positive finite number: never.
pub(crate) fn interval_us(s: f64) -> i64 {
    if s.is_finite() && s > 0.0 { (s * 1e6).min(i64::MAX as f64) as i64 } else { i64::MAX }
}

/// Counters of what happened to the events handed to the writer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Records accepted into files that were sealed or are still open (on disk, or in the
    /// writer's buffer waiting for the disk).
    pub written: u64,
    /// Events lost by the writer: after it turned itself off, while the disk was full, or
    /// with a file it could not seal.
    pub dropped: u64,
    pub files_sealed: u64,
    /// Opens that failed for a reason other than a full disk (they count toward
    /// `FileOpenFailThreshold`).
    pub open_failures: u64,
    /// Writes, opens and seals that failed because the disk was full (or any write error):
    /// retried with back-off, never counted toward `FileOpenFailThreshold`.
    pub write_errors: u64,
    /// Bytes of the files sealed (docs/formats.md, "The hook's own cost": `BytesWritten`).
    pub bytes_sealed: u64,
}

/// Bytes gathered before they are written (one `pwrite`); also the most a full disk can
/// hold back, since nothing more is accepted while it is full.
const BUFFER_BYTES: usize = 64 * 1024;
/// The first wait after a failed write, doubled after each failure up to [`BACKOFF_MAX_US`].
const BACKOFF_FIRST_US: i64 = 100_000;
const BACKOFF_MAX_US: i64 = 2_000_000;

/// The file operations, so that tests can make them fail (a full disk, a refused open)
/// on a real file system, behind the same code path.
pub trait FileIo: Send {
    /// Creates `dir/name`, which must not exist yet (`Dir::create_new`).
    fn create(&mut self, dir: &Dir, name: &str) -> io::Result<File> {
        dir.create_new(name)
    }
    /// One `pwrite`: the bytes written (maybe fewer than `buf`), or the error.
    fn write_at(&mut self, f: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
        f.write_at(buf, offset)
    }
    fn set_len(&mut self, f: &File, len: u64) -> io::Result<()> {
        f.set_len(len)
    }
    fn sync(&mut self, f: &File) -> io::Result<()> {
        f.sync_all()
    }
}

/// The real file system, unchanged.
#[derive(Debug, Default)]
pub struct RealIo;

impl FileIo for RealIo {}

/// A full disk (or a quota): waited out, never a reason to give a file up.
fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// The back-off after failed writes: nothing is attempted before `retry_at_us`.
#[derive(Debug, Clone, Copy, Default)]
struct Backoff {
    /// 0 when the last write worked.
    delay_us: i64,
    retry_at_us: i64,
}

impl Backoff {
    fn failing(&self) -> bool {
        self.delay_us > 0
    }

    /// May a write be tried at `now_us`?
    fn due(&self, now_us: i64) -> bool {
        !self.failing() || now_us >= self.retry_at_us
    }

    fn failed(&mut self, now_us: i64) {
        self.delay_us =
            if self.failing() { (self.delay_us * 2).min(BACKOFF_MAX_US) } else { BACKOFF_FIRST_US };
        self.retry_at_us = now_us.saturating_add(self.delay_us);
    }
}

struct OpenFile {
    file: File,
    /// `framework/`, and the file's temporary name in it.
    dir: Dir,
    tmp: String,
    /// Bytes accepted but not yet in the file: whole records only.
    buf: Vec<u8>,
    /// Records in `buf`.
    buf_records: u64,
    /// The length of the file's complete records: what a failed write is cut back to.
    committed: u64,
    /// The file's bytes past `committed` may hold part of a failed write.
    tail_dirty: bool,
    records: u64,
    opened_us: i64,
    max_end_us: i64,
    /// Phases whose metadata lines this file already has.
    phases_named: Vec<bool>,
}

impl OpenFile {
    /// The file's size once its buffer is written.
    fn bytes(&self) -> u64 {
        self.committed + self.buf.len() as u64
    }
}

/// Writes events into rotating, sealed timeline files.
pub struct TimelineWriter {
    settings: Settings,
    base_us: i64,
    /// Phase name id -> phase index (the trace `pid`), in first-seen order, stable across
    /// this writer's files. Numbered from 1 so that pid 0 only carries the base time.
    phase_index: HashMap<u32, u32>,
    file: Option<OpenFile>,
    last_name_us: i64,
    healthy: bool,
    line: String,
    counts: Counts,
    io: Box<dyn FileIo>,
    backoff: Backoff,
    /// A seal failed for a full disk: the file is kept open and sealed at the next try.
    seal_pending: bool,
    /// Events dropped since the disk filled (for the log line when it recovers).
    dropped_while_full: u64,
    /// The `<k>` of the next temporary name.
    temp_seq: u64,
}

impl std::fmt::Debug for TimelineWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimelineWriter")
            .field("settings", &self.settings)
            .field("base_us", &self.base_us)
            .field("open", &self.file.as_ref().map(|f| &f.tmp))
            .field("healthy", &self.healthy)
            .field("backoff", &self.backoff)
            .field("counts", &self.counts)
            .finish_non_exhaustive()
    }
}

impl TimelineWriter {
    /// A writer whose `ts` values are relative to `base_us` (µs since the epoch).
    pub fn new(settings: Settings, base_us: i64) -> TimelineWriter {
        TimelineWriter::with_io(settings, base_us, Box::new(RealIo))
    }

    /// The same, with its file operations going through `io`.
    pub fn with_io(settings: Settings, base_us: i64, io: Box<dyn FileIo>) -> TimelineWriter {
        TimelineWriter {
            settings,
            base_us,
            phase_index: HashMap::new(),
            file: None,
            last_name_us: i64::MIN,
            healthy: true,
            line: String::with_capacity(512),
            counts: Counts::default(),
            io,
            backoff: Backoff::default(),
            seal_pending: false,
            dropped_while_full: 0,
            temp_seq: 0,
        }
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// False once `FileOpenFailThreshold` opens have failed; it then drops everything.
    pub fn is_healthy(&self) -> bool {
        self.healthy
    }

    /// True while writes fail (a full disk): events are dropped and counted until a retry
    /// works.
    pub fn is_waiting_for_disk(&self) -> bool {
        self.backoff.failing()
    }

    /// New rotation limits (after a config reload); they apply from the next event.
    pub fn set_rotation(&mut self, max_bytes: u64, interval_us: i64) {
        self.settings.rotate_max_bytes = max_bytes;
        self.settings.rotate_interval_us = interval_us;
    }

    /// The temporary path of the open file, if one is open.
    pub fn tmp_path(&self) -> Option<PathBuf> {
        self.file.as_ref().map(|f| f.dir.display(&f.tmp))
    }

    fn drop_event(&mut self) {
        self.counts.dropped += 1;
        if self.backoff.failing() {
            self.dropped_while_full += 1;
        }
    }

    /// Writes one event at wall-clock time `now_us`. `names[id]` must resolve every id the
    /// event uses (the hook checks ids when the event is recorded).
    pub fn write(&mut self, ev: &Event, names: &[Arc<str>], now_us: i64) {
        if !self.healthy {
            self.counts.dropped += 1;
            return;
        }
        self.rotate_if_due(now_us);
        // While the disk is full nothing new is accepted: what was accepted before waits in
        // the buffer, and the retry (above) decides when writing goes on. With nothing held
        // back, the retry is this event's open, once the wait is over.
        let may_open = self.file.is_none() && self.backoff.due(now_us);
        if self.seal_pending || (self.backoff.failing() && !may_open) {
            self.drop_event();
            return;
        }
        if self.file.is_none() && !self.open(now_us) {
            self.drop_event();
            return;
        }
        if self.backoff.failing() {
            self.recovered();
        }
        let next = self.phase_index.len() as u32 + 1;
        let index = *self.phase_index.entry(ev.phase).or_insert(next);
        let name_of = |id: u32| names.get(id as usize).map_or("?", |n| &**n);

        self.line.clear();
        let Some(file) = self.file.as_mut() else { return };
        let slot = index as usize;
        if file.phases_named.len() <= slot {
            file.phases_named.resize(slot + 1, false);
        }
        if !file.phases_named[slot] {
            file.phases_named[slot] = true;
            self.line.push_str(",\n");
            trace::phase_meta(&mut self.line, index, name_of(ev.phase));
        }
        self.line.push_str(",\n");
        trace::record(&mut self.line, ev, index, self.base_us, self.settings.os_pid, name_of);
        file.buf.extend_from_slice(self.line.as_bytes());
        file.buf_records += 1;
        file.records += 1;
        file.max_end_us = file.max_end_us.max(ev.end_us);
        self.counts.written += 1;
        if file.buf.len() >= BUFFER_BYTES {
            self.flush(now_us);
        }
    }

    /// Seals the open file if it is too big or has been open too long, and retries what a
    /// full disk held back once its wait is over. Called for every event and by the idle
    /// loop.
    pub fn rotate_if_due(&mut self, now_us: i64) {
        if self.backoff.failing() {
            if !self.backoff.due(now_us) {
                return;
            }
            if self.seal_pending {
                self.seal(now_us);
                return;
            }
            if self.file.is_none() {
                // Nothing held back: the next event's open is the retry.
                return;
            }
            self.flush(now_us);
            if self.backoff.failing() {
                return;
            }
        }
        let due = self.file.as_ref().is_some_and(|f| {
            f.bytes() >= self.settings.rotate_max_bytes
                || now_us.saturating_sub(f.opened_us) >= self.settings.rotate_interval_us
        });
        if due {
            self.seal(now_us);
        }
    }

    /// Writes the buffered records to the file (not fsync'd: only sealing syncs). A
    /// failure cuts the file back to its last complete record, keeps the buffer and waits
    /// before the next try.
    pub fn flush(&mut self, now_us: i64) {
        if self.backoff.failing() && !self.backoff.due(now_us) {
            return;
        }
        let Some(f) = self.file.as_mut() else { return };
        match write_buffer(&mut *self.io, f) {
            Ok(()) => self.recovered(),
            Err(e) => self.write_failed(&e, now_us),
        }
    }

    /// Seals the open file, if any: at shutdown. When the disk is still full, the file
    /// is left under its temporary name with its complete records, for the agent's repair,
    /// and what only the buffer held is counted as dropped.
    pub fn close(&mut self, now_us: i64) {
        self.backoff = Backoff::default();
        self.seal(now_us);
        if self.seal_pending {
            self.seal_pending = false;
            if let Some(f) = self.file.take() {
                crate::log(&format_args!(
                    "cannot seal {} (the disk is still full): its {} complete events stay there for repair, {} buffered events are lost",
                    f.dir.display(&f.tmp).display(),
                    f.records - f.buf_records,
                    f.buf_records
                ));
                self.counts.written -= f.buf_records;
                self.counts.dropped += f.buf_records;
                if f.tail_dirty {
                    let _ = self.io.set_len(&f.file, f.committed);
                }
            }
        }
    }

    fn recovered(&mut self) {
        if self.backoff.failing() {
            crate::log(&format_args!(
                "timeline writing resumed; {} events were dropped while it could not write",
                self.dropped_while_full
            ));
        }
        self.backoff = Backoff::default();
        self.dropped_while_full = 0;
    }

    fn write_failed(&mut self, e: &io::Error, now_us: i64) {
        self.counts.write_errors += 1;
        if !self.backoff.failing() {
            crate::log(&format_args!(
                "cannot write the timeline ({e}){}; events are dropped and counted until it can, complete events are kept",
                if is_disk_full(e) { ": the disk is full" } else { "" }
            ));
        }
        self.backoff.failed(now_us);
    }

    fn open(&mut self, now_us: i64) -> bool {
        match self.create_locked() {
            Ok((file, dir, tmp)) => {
                self.line.clear();
                self.line.push_str("[\n");
                trace::header(&mut self.line, self.base_us);
                let mut buf = Vec::with_capacity(BUFFER_BYTES + 4096);
                buf.extend_from_slice(self.line.as_bytes());
                self.file = Some(OpenFile {
                    file,
                    dir,
                    tmp,
                    buf,
                    buf_records: 0,
                    committed: 0,
                    tail_dirty: false,
                    records: 0,
                    opened_us: now_us,
                    max_end_us: i64::MIN,
                    phases_named: Vec::new(),
                });
                true
            }
            Err(e) if is_disk_full(&e) => {
                self.write_failed(&e, now_us);
                false
            }
            Err(e) => {
                crate::log(&format_args!(
                    "cannot open a timeline file in {}: {e}",
                    self.framework().display()
                ));
                self.open_failed();
                false
            }
        }
    }

    fn framework(&self) -> PathBuf {
        self.settings.root.join("framework")
    }

    /// Creates a new temporary file in `framework/` (made if missing, never through a
    /// link) and locks it. The lock is taken waiting, on the writer thread: the agent's
    /// repair holds one for milliseconds. Since the repair may take an unlocked new file
    /// for a dead writer's empty one, the name must still hold this file once locked;
    /// otherwise the next name is tried.
    fn create_locked(&mut self) -> io::Result<(File, Dir, String)> {
        let dir = Dir::open_root(&self.settings.root, true)?.sub("framework", true)?;
        let mut last = None;
        for _ in 0..8 {
            let tag = format!("{}-{}", self.settings.os_pid, self.temp_seq);
            self.temp_seq += 1;
            let name = trainprof_output::timeline_temp(&self.settings.node_id, &tag);
            let file = match self.io.create(&dir, &name) {
                Ok(f) => f,
                // A leftover, or a name planted there: never touched, the next one is used.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Err(e) = file.lock() {
                // No locks on this file system: the file is still used; the agent's repair
                // cannot lock it either, and leaves it alone.
                crate::log(&format_args!("cannot lock {}: {e}", dir.display(&name).display()));
            }
            if dir.names(&name, &file)? {
                return Ok((file, dir, name));
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("its temporary names kept changing")))
    }

    fn open_failed(&mut self) {
        self.counts.open_failures += 1;
        if self.counts.open_failures >= u64::from(self.settings.file_open_fail_threshold.max(1)) {
            self.healthy = false;
            crate::log(&format_args!(
                "{} failed opens (FileOpenFailThreshold): timeline writing is off, events are dropped and counted",
                self.counts.open_failures
            ));
        }
    }

    /// Closes the file with `\n]`, syncs it and renames it into place. When the disk is
    /// full the file stays open, cut back to its complete records, and the seal is retried
    /// after the back-off (events are dropped meanwhile).
    fn seal(&mut self, now_us: i64) {
        let Some(f) = self.file.as_mut() else { return };
        let records_end = f.buf.len();
        f.buf.extend_from_slice(b"\n]");
        let written = write_buffer(&mut *self.io, f).and_then(|()| self.io.sync(&f.file));
        if let Err(e) = written {
            // Back to the complete records: the `\n]` is written again at the next try.
            if f.buf.len() >= records_end + 2 {
                f.buf.truncate(records_end);
            } else {
                // The buffer reached the file; only the closing bytes are taken back.
                f.buf.clear();
                f.buf_records = 0;
                f.committed = f.committed.saturating_sub(2);
                f.tail_dirty = true;
                if self.io.set_len(&f.file, f.committed).is_ok() {
                    f.tail_dirty = false;
                }
            }
            self.seal_pending = true;
            self.write_failed(&e, now_us);
            return;
        }
        self.seal_pending = false;
        self.recovered();
        let Some(mut f) = self.file.take() else { return };
        let t = f.max_end_us.max(self.last_name_us.saturating_add(1));
        // Never over an existing file (the agent's repair may have placed one under the
        // same name): the next microsecond instead.
        let names = trainprof_output::timeline_names(t, &self.settings.node_id);
        let placed = Dir::open_root(&self.settings.root, false)
            .and_then(|root| ofs::seal(&root, &f.dir, &f.tmp, names, Move::Rename, |_| true))
            .and_then(|rel| rel.ok_or_else(|| io::Error::other("the names for its end time are all taken")));
        match placed {
            Ok(rel) => {
                self.last_name_us = name_time(&rel).unwrap_or(t);
                self.counts.files_sealed += 1;
                self.counts.bytes_sealed += f.committed;
            }
            Err(e) if is_disk_full(&e) => {
                // No room for the hour folder or the name: the file stays open without its
                // `\n]`, and the whole seal is tried again after the back-off.
                f.committed = f.committed.saturating_sub(2);
                f.tail_dirty = self.io.set_len(&f.file, f.committed).is_err();
                self.file = Some(f);
                self.seal_pending = true;
                self.write_failed(&e, now_us);
            }
            Err(e) => {
                // The complete file stays under its own temporary name (no later file uses
                // it) for the agent's repair; here its events count as dropped, and the
                // failure counts toward FileOpenFailThreshold.
                crate::log(&format_args!(
                    "cannot seal {}: {e}; its {} events stay there for the agent's repair",
                    f.dir.display(&f.tmp).display(),
                    f.records
                ));
                self.counts.written -= f.records;
                self.counts.dropped += f.records;
                self.open_failed();
            }
        }
    }
}

/// The end time a sealed timeline's name gives (`…/<T>_<node>_pythontimeline.json`).
fn name_time(rel: &str) -> Option<i64> {
    rel.rsplit('/').next()?.split('_').next()?.parse().ok()
}

/// Writes `f.buf` at the end of `f`'s complete records. On success the buffer is empty
/// and `committed` covers it; on failure the file is cut back to `committed` (its last
/// complete record) and the buffer is kept whole for the next try.
fn write_buffer(io: &mut dyn FileIo, f: &mut OpenFile) -> io::Result<()> {
    if f.buf.is_empty() {
        return Ok(());
    }
    let mut done = 0usize;
    let failed = loop {
        if done == f.buf.len() {
            break None;
        }
        match io.write_at(&f.file, &f.buf[done..], f.committed + done as u64) {
            Ok(0) => break Some(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Some(e),
        }
    };
    match failed {
        None => {
            f.committed += f.buf.len() as u64;
            f.buf.clear();
            f.buf_records = 0;
            if f.tail_dirty && io.set_len(&f.file, f.committed).is_ok() {
                f.tail_dirty = false;
            }
            Ok(())
        }
        Some(e) => {
            // Part of the buffer may be in the file: cut it off, so that the file ends
            // with a complete record (and the space goes back to the full disk).
            f.tail_dirty = true;
            if io.set_len(&f.file, f.committed).is_ok() {
                f.tail_dirty = false;
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File};
    use std::path::Path;

    use super::*;
    use crate::types::{TRAINPROF_MAX_ARGS, TrainprofArg};

    const BASE: i64 = 1_795_316_901_000_000;

    fn settings(root: &Path, max_bytes: u64, interval_s: i64) -> Settings {
        Settings {
            root: root.to_path_buf(),
            node_id: "0-algo-1".into(),
            os_pid: 42,
            rotate_max_bytes: max_bytes,
            rotate_interval_us: interval_s * 1_000_000,
            file_open_fail_threshold: 2,
        }
    }

    fn names() -> Vec<Arc<str>> {
        ["Step:ModeKeys.TRAIN", "Forward", "Net"].into_iter().map(Arc::from).collect()
    }

    fn ev(phase: u32, name: u32, start_us: i64, end_us: i64, step: i64) -> Event {
        Event {
            kind: crate::event::Kind::Complete,
            phase,
            name,
            start_us,
            end_us,
            step,
            n_args: 0,
            args: [TrainprofArg::EMPTY; TRAINPROF_MAX_ARGS],
        }
    }

    fn sealed(root: &Path) -> Vec<(String, serde_json::Value)> {
        let mut out = Vec::new();
        let pevents = root.join("framework/pevents");
        let Ok(hours) = fs::read_dir(&pevents) else { return out };
        for hour in hours {
            let hour = hour.unwrap().path();
            for f in fs::read_dir(&hour).unwrap() {
                let p = f.unwrap().path();
                let name = p.file_name().unwrap().to_str().unwrap().to_string();
                let v = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
                out.push((format!("{}/{name}", hour.file_name().unwrap().to_str().unwrap()), v));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The temporary timeline files in `root/framework`.
    fn temporaries(root: &Path) -> Vec<PathBuf> {
        let Ok(entries) = fs::read_dir(root.join("framework")) else { return Vec::new() };
        entries.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "tmp")).collect()
    }

    /// A fresh temp folder (the first value; removed when it is dropped, also when the test
    /// fails) and, in it, the not yet existing `root` path a test's writer makes.
    fn tempdir(tag: &str) -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::Builder::new().prefix(&format!("trainprof-writer-{tag}-")).tempdir().unwrap();
        let root = t.path().join("root");
        (t, root)
    }

    #[test]
    fn one_file_matches_the_spec_layout() {
        let (_root_dir, root) = tempdir("layout");
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        w.write(&ev(1, 2, BASE + 3358, BASE + 13358, 0), &names(), BASE + 20_000);
        w.write(&ev(0, 0, BASE + 1000, BASE + 42358, 0), &names(), BASE + 43_000);
        assert!(w.tmp_path().unwrap().exists());
        w.close(BASE + 1_000_000_000);
        assert!(w.tmp_path().is_none() && temporaries(&root).is_empty());
        let files = sealed(&root);
        assert_eq!(files.len(), 1);
        let (name, v) = &files[0];
        // Named by the largest end time, in the UTC hour of that time.
        assert_eq!(name, &format!("2026112203/{}_0-algo-1_pythontimeline.json", BASE + 42358));
        let v = v.as_array().unwrap();
        assert_eq!(v[0]["args"]["start_time_since_epoch_in_micros"], BASE);
        assert_eq!(v[2]["args"]["name"], "Forward");
        assert_eq!(v[4]["name"], "Net");
        assert_eq!(v[4]["pid"], 1);
        assert_eq!(v[4]["ts"], 3358);
        assert_eq!(v[4]["args"]["pid"], 42);
        assert_eq!(v[5]["args"]["name"], "Step:ModeKeys.TRAIN");
        assert_eq!(v[7]["pid"], 2);
        assert_eq!(v.len(), 8);
        let text = fs::read_to_string(root.join("framework/pevents").join(name)).unwrap();
        assert!(text.starts_with("[\n{\"name\": \"process_name\""));
        assert!(text.ends_with("}\n]"));
        assert_eq!(
            w.counts(),
            Counts {
                written: 2,
                dropped: 0,
                files_sealed: 1,
                open_failures: 0,
                write_errors: 0,
                // Every byte of the sealed file.
                bytes_sealed: text.len() as u64,
            }
        );
    }

    #[test]
    fn size_rotation_gives_strictly_increasing_names_and_loses_nothing() {
        let (_root_dir, root) = tempdir("size");
        let mut w = TimelineWriter::new(settings(&root, 400, 3600), BASE);
        // Every event ends at the same time: smdebug would give several files one name.
        for i in 0..40 {
            w.write(&ev(1, 2, BASE, BASE + 500, i), &names(), BASE + 1000 + i);
        }
        w.close(BASE + 1_000_000_000);
        let files = sealed(&root);
        assert!(files.len() >= 5, "{} files", files.len());
        let times: Vec<i64> =
            files.iter().map(|(n, _)| n[11..].split('_').next().unwrap().parse().unwrap()).collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
        assert!(times.iter().all(|&t| t >= BASE + 500));
        let mut steps = Vec::new();
        for (_, v) in &files {
            let v = v.as_array().unwrap();
            // Every file starts with the base time, and names the phase it uses.
            assert_eq!(v[0]["args"]["start_time_since_epoch_in_micros"], BASE);
            assert_eq!(v[2]["args"]["name"], "Forward");
            for e in v.iter().filter(|e| e["ph"] == "X") {
                steps.push(e["args"]["step_num"].as_str().unwrap().parse::<i64>().unwrap());
            }
        }
        assert_eq!(steps, (0..40).collect::<Vec<_>>());
        assert_eq!(w.counts().written, 40);
    }

    #[test]
    fn the_interval_closes_an_idle_file() {
        let (_root_dir, root) = tempdir("idle");
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 10), BASE);
        w.write(&ev(1, 2, BASE, BASE + 5, 0), &names(), BASE + 10);
        w.rotate_if_due(BASE + 9_000_000);
        assert_eq!(sealed(&root).len(), 0);
        w.rotate_if_due(BASE + 10_000_010);
        assert_eq!(sealed(&root).len(), 1);
        assert!(w.tmp_path().is_none() && temporaries(&root).is_empty());
        // Nothing open: nothing to seal, no empty file.
        w.rotate_if_due(BASE + 30_000_000);
        w.close(BASE + 1_000_000_000);
        assert_eq!(sealed(&root).len(), 1);
    }

    #[test]
    fn open_failures_turn_the_writer_off_after_the_threshold() {
        let (_root_dir, root) = tempdir("openfail");
        fs::create_dir_all(&root).unwrap();
        // `framework` is a file, so no directory can be made under it.
        fs::write(root.join("framework"), b"").unwrap();
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        for i in 0..4 {
            w.write(&ev(1, 2, BASE, BASE + 5, i), &names(), BASE + 10);
        }
        assert!(!w.is_healthy());
        assert_eq!(
            w.counts(),
            Counts {
                written: 0,
                dropped: 4,
                files_sealed: 0,
                open_failures: 2,
                write_errors: 0,
                ..Counts::default()
            }
        );
    }

    #[test]
    fn a_file_already_under_the_name_is_never_replaced() {
        let (_root_dir, root) = tempdir("taken");
        // Placed by the agent's repair under the very name this file would take.
        let taken =
            root.join(format!("framework/pevents/2026112203/{}_0-algo-1_pythontimeline.json", BASE + 42358));
        fs::create_dir_all(taken.parent().unwrap()).unwrap();
        fs::write(&taken, "[]").unwrap();
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        w.write(&ev(0, 0, BASE + 1000, BASE + 42358, 0), &names(), BASE + 43_000);
        w.close(BASE + 1_000_000_000);
        assert_eq!(fs::read_to_string(&taken).unwrap(), "[]");
        let names: Vec<String> = sealed(&root).into_iter().map(|(n, _)| n).collect();
        assert!(
            names.contains(&format!("2026112203/{}_0-algo-1_pythontimeline.json", BASE + 42359)),
            "{names:?}"
        );
        assert_eq!(w.counts().files_sealed, 1);
    }

    #[test]
    fn a_leftover_or_planted_temporary_name_is_never_touched() {
        let (_root_dir, root) = tempdir("stale");
        fs::create_dir_all(root.join("framework")).unwrap();
        // A dead writer's leftover under the name earlier versions used, the name this
        // writer would take first (a leftover of a writer with the same pid), and a link
        // planted at its second name.
        let old = root.join("framework/0-algo-1_pythontimeline.json.tmp");
        let stale = b"[\n{\"garbage\": ";
        fs::write(&old, stale).unwrap();
        fs::write(root.join("framework/0-algo-1_pythontimeline.json.42-0.tmp"), stale).unwrap();
        let target = root.join("target");
        fs::write(&target, b"not the writer's").unwrap();
        std::os::unix::fs::symlink(&target, root.join("framework/0-algo-1_pythontimeline.json.42-1.tmp"))
            .unwrap();
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        w.write(&ev(1, 2, BASE, BASE + 5, 0), &names(), BASE + 10);
        let tmp = w.tmp_path().unwrap();
        assert!(tmp.ends_with("framework/0-algo-1_pythontimeline.json.42-2.tmp"), "{tmp:?}");
        // The open file is locked: the agent's repair sees a live writer.
        let other = File::open(&tmp).unwrap();
        assert!(matches!(other.try_lock(), Err(fs::TryLockError::WouldBlock)));
        w.close(BASE + 1_000_000_000);
        let files = sealed(&root);
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].1.as_array().unwrap().len(), 5);
        assert_eq!(fs::read(&old).unwrap(), stale);
        assert_eq!(fs::read(root.join("framework/0-algo-1_pythontimeline.json.42-0.tmp")).unwrap(), stale);
        assert_eq!(fs::read(&target).unwrap(), b"not the writer's");
        // A new file takes a new name.
        w.write(&ev(1, 2, BASE, BASE + 5, 1), &names(), BASE + 20);
        assert!(w.tmp_path().unwrap().ends_with("framework/0-algo-1_pythontimeline.json.42-3.tmp"));
        w.close(BASE + 1_000_000_000);
        assert_eq!(sealed(&root).len(), 2);
    }

    #[test]
    fn a_linked_framework_folder_is_refused() {
        let (_root_dir, root) = tempdir("linked");
        let (_elsewhere_dir, elsewhere) = tempdir("linked-target");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("framework")).unwrap();
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        w.write(&ev(1, 2, BASE, BASE + 5, 0), &names(), BASE + 10);
        w.write(&ev(1, 2, BASE, BASE + 5, 1), &names(), BASE + 10);
        assert_eq!(w.counts().open_failures, 2);
        assert!(!w.is_healthy());
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[test]
    fn a_failed_seal_keeps_the_file_for_repair_and_counts_its_events() {
        let (_root_dir, root) = tempdir("renamefail");
        fs::create_dir_all(root.join("framework")).unwrap();
        // `pevents` is a file, so no hour folder can be made under it.
        fs::write(root.join("framework/pevents"), b"").unwrap();
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        w.write(&ev(1, 2, BASE, BASE + 5, 0), &names(), BASE + 10);
        w.write(&ev(1, 2, BASE, BASE + 7, 1), &names(), BASE + 10);
        w.close(BASE + 1_000_000_000);
        assert_eq!(
            w.counts(),
            Counts {
                written: 0,
                dropped: 2,
                files_sealed: 0,
                open_failures: 1,
                write_errors: 0,
                ..Counts::default()
            }
        );
        let kept: Vec<_> = fs::read_dir(root.join("framework"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert_eq!(kept, ["0-algo-1_pythontimeline.json.42-0.tmp"]);
        let kept: serde_json::Value =
            serde_json::from_slice(&fs::read(root.join("framework").join(&kept[0])).unwrap()).unwrap();
        assert_eq!(kept.as_array().unwrap().len(), 6);
    }

    /// A file system that fills up on demand: [`FileIo`] over the real one, with the
    /// failures a full disk (or a read-only folder) gives.
    #[derive(Clone, Default)]
    struct Fault(Arc<std::sync::Mutex<FaultState>>);

    #[derive(Default)]
    struct FaultState {
        /// Writes and syncs fail with ENOSPC once `room` bytes more are written.
        full: bool,
        room: usize,
        /// Opens fail with ENOSPC while full (a disk without a free inode or block).
        full_blocks_open: bool,
        /// Opens fail with EACCES (a read-only folder).
        deny_open: bool,
        write_calls: u64,
    }

    impl Fault {
        fn set(&self, f: impl FnOnce(&mut FaultState)) {
            f(&mut self.0.lock().unwrap());
        }
        fn writes(&self) -> u64 {
            self.0.lock().unwrap().write_calls
        }
    }

    fn err(code: i32) -> io::Error {
        io::Error::from_raw_os_error(code)
    }

    impl FileIo for Fault {
        fn create(&mut self, dir: &Dir, name: &str) -> io::Result<File> {
            let s = self.0.lock().unwrap();
            if s.deny_open {
                return Err(err(libc::EACCES));
            }
            if s.full && s.full_blocks_open {
                return Err(err(libc::ENOSPC));
            }
            drop(s);
            RealIo.create(dir, name)
        }
        fn write_at(&mut self, f: &File, buf: &[u8], offset: u64) -> io::Result<usize> {
            let mut s = self.0.lock().unwrap();
            s.write_calls += 1;
            if !s.full {
                return f.write_at(buf, offset);
            }
            if s.room == 0 {
                return Err(err(libc::ENOSPC));
            }
            // What fits lands in the file for real: a partial record to be cut off.
            let n = f.write_at(&buf[..buf.len().min(s.room)], offset)?;
            s.room -= n;
            Ok(n)
        }
        fn sync(&mut self, f: &File) -> io::Result<()> {
            if self.0.lock().unwrap().full { Err(err(libc::ENOSPC)) } else { f.sync_all() }
        }
    }

    fn steps_in(v: &serde_json::Value) -> Vec<i64> {
        v.as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| e["args"]["step_num"].as_str().unwrap().parse().unwrap())
            .collect()
    }

    /// The temporary file as the agent's repair would read it: complete records, closed.
    fn tmp_as_json(root: &Path) -> serde_json::Value {
        let tmps = temporaries(root);
        assert_eq!(tmps.len(), 1, "{tmps:?}");
        let mut text = fs::read(&tmps[0]).unwrap();
        assert!(text.ends_with(b"}"), "not cut at a complete record: {:?}", String::from_utf8_lossy(&text));
        text.extend_from_slice(b"\n]");
        serde_json::from_slice(&text).unwrap()
    }

    const MS: i64 = 1000;

    #[test]
    fn a_full_disk_loses_only_what_comes_while_it_is_full() {
        let (_root_dir, root) = tempdir("enospc");
        let fault = Fault::default();
        let mut w = TimelineWriter::with_io(settings(&root, 1 << 20, 3600), BASE, Box::new(fault.clone()));
        let mut now = BASE + 10 * MS;
        for i in 0..10 {
            w.write(&ev(1, 2, BASE, BASE + 5, i), &names(), now);
        }
        w.flush(now);
        let before = fs::metadata(w.tmp_path().unwrap()).unwrap().len();
        assert_eq!(steps_in(&tmp_as_json(&root)), (0..10).collect::<Vec<_>>());

        // Accepted before the disk fills: kept in the buffer.
        for i in 10..20 {
            w.write(&ev(1, 2, BASE, BASE + 5, i), &names(), now);
        }
        fault.set(|s| (s.full, s.room) = (true, 100));
        w.flush(now);
        assert!(w.is_waiting_for_disk());
        // 100 bytes of a record reached the file and were cut off again: nothing deleted,
        // the file ends with its last complete record.
        assert_eq!(fs::metadata(w.tmp_path().unwrap()).unwrap().len(), before);
        assert_eq!(steps_in(&tmp_as_json(&root)), (0..10).collect::<Vec<_>>());

        // While full: dropped and counted, and tried again only as the back-off allows
        // (100 ms, doubling to 2 s).
        let mut retries = Vec::new();
        let mut step = 20;
        while now < BASE + 10_000 * MS {
            now += 10 * MS;
            let calls = fault.writes();
            w.write(&ev(1, 2, BASE, BASE + 5, step), &names(), now);
            step += 1;
            if fault.writes() != calls {
                retries.push(now);
            }
        }
        let gaps: Vec<i64> = retries.windows(2).map(|p| (p[1] - p[0]) / MS).collect();
        assert_eq!(gaps[..5], [200, 400, 800, 1600, 2000], "{gaps:?}");
        assert!(gaps[5..].iter().all(|&g| g == 2000), "{gaps:?}");
        let dropped = (step - 20) as u64;
        assert_eq!(w.counts().dropped, dropped);
        assert_eq!(fs::metadata(w.tmp_path().unwrap()).unwrap().len(), before);
        assert!(w.is_healthy());

        // Space comes back: within one back-off (≤ 2 s) the buffer is written, then new
        // events again.
        fault.set(|s| s.full = false);
        let freed = now;
        while w.is_waiting_for_disk() {
            now += 10 * MS;
            w.rotate_if_due(now);
        }
        assert!(now - freed <= 2_000 * MS);
        for i in 1000..1010 {
            w.write(&ev(1, 2, BASE, BASE + 5, i), &names(), now);
        }
        w.close(now);
        let files = sealed(&root);
        assert_eq!(files.len(), 1);
        let want: Vec<i64> = (0..20).chain(1000..1010).collect();
        assert_eq!(steps_in(&files[0].1), want);
        let c = w.counts();
        assert_eq!((c.written, c.dropped, c.files_sealed, c.open_failures), (30, dropped, 1, 0));
        assert_eq!(c.write_errors, retries.len() as u64 + 1);
    }

    #[test]
    fn opens_failing_on_a_full_disk_back_off_and_say_so_once() {
        let (_root_dir, root) = tempdir("enospc-open");
        let fault = Fault::default();
        let mut w = TimelineWriter::with_io(settings(&root, 1 << 20, 3600), BASE, Box::new(fault.clone()));
        fault.set(|s| (s.full, s.full_blocks_open) = (true, true));
        let mut now = BASE;
        // 10 s of events every 10 ms while no file can be made: 100 ms doubling to 2 s
        // gives 8 tries (at 0, 0.1, 0.3, 0.7, 1.5, 3.1, 5.1, 7.1, 9.1 s).
        for i in 0..1000 {
            now += 10 * MS;
            w.write(&ev(1, 2, BASE, BASE + 5, i), &names(), now);
        }
        let c = w.counts();
        assert!((8..=10).contains(&c.write_errors), "{c:?}");
        assert_eq!((c.open_failures, c.dropped, c.written), (0, 1000, 0));
        assert!(w.is_healthy() && w.is_waiting_for_disk());
        // Space again: the next try opens, and events are written.
        fault.set(|s| s.full = false);
        for i in 0..300 {
            now += 10 * MS;
            w.write(&ev(1, 2, BASE, BASE + 5, 1000 + i), &names(), now);
        }
        assert!(!w.is_waiting_for_disk());
        assert!(w.counts().written > 0);
        w.close(now);
    }

    #[test]
    fn a_seal_on_a_full_disk_keeps_the_file_and_seals_it_later() {
        let (_root_dir, root) = tempdir("enospc-seal");
        let fault = Fault::default();
        // Small files: the size rotation seals while the disk is full.
        let mut w = TimelineWriter::with_io(settings(&root, 2000, 3600), BASE, Box::new(fault.clone()));
        let mut now = BASE + 10 * MS;
        let mut step = 0;
        while sealed(&root).is_empty() {
            w.write(&ev(1, 2, BASE, BASE + 5, step), &names(), now);
            w.flush(now);
            step += 1;
        }
        // The event that found the first file full opened the second.
        let first_file = step - 1;
        // Fill the next file up to just below the limit, then fill the disk.
        while fs::metadata(w.tmp_path().unwrap()).map_or(0, |m| m.len()) < 1900 {
            w.write(&ev(1, 2, BASE, BASE + 5, step), &names(), now);
            w.flush(now);
            step += 1;
        }
        w.write(&ev(1, 2, BASE, BASE + 5, step), &names(), now);
        step += 1;
        let accepted = step;
        fault.set(|s| (s.full, s.room) = (true, 1));
        // The seal is due at this event: `\n]` and the buffer cannot be written.
        w.write(&ev(1, 2, BASE, BASE + 5, step), &names(), now);
        assert!(w.is_waiting_for_disk());
        assert_eq!(sealed(&root).len(), 1);
        // The file holds what was flushed; the last accepted event waits in the buffer.
        assert_eq!(steps_in(&tmp_as_json(&root)), (first_file..accepted - 1).collect::<Vec<_>>());
        // A close while the disk is still full leaves the complete records for the
        // agent's repair; here the disk comes back first.
        now += 50 * MS;
        w.rotate_if_due(now);
        fault.set(|s| s.full = false);
        now += 2_000 * MS;
        w.rotate_if_due(now);
        assert!(!w.is_waiting_for_disk());
        assert!(w.tmp_path().is_none() && temporaries(&root).is_empty());
        let files = sealed(&root);
        assert_eq!(files.len(), 2);
        assert_eq!(steps_in(&files[1].1), (first_file..accepted).collect::<Vec<_>>());
        assert_eq!(w.counts().dropped, 1);
        assert_eq!(w.counts().written, accepted as u64);
    }

    #[test]
    fn closing_on_a_full_disk_leaves_the_complete_records_for_repair() {
        let (_root_dir, root) = tempdir("enospc-close");
        let fault = Fault::default();
        let mut w = TimelineWriter::with_io(settings(&root, 1 << 20, 3600), BASE, Box::new(fault.clone()));
        for i in 0..5 {
            w.write(&ev(1, 2, BASE, BASE + 5, i), &names(), BASE + 10);
        }
        w.flush(BASE + 10);
        for i in 5..8 {
            w.write(&ev(1, 2, BASE, BASE + 5, i), &names(), BASE + 10);
        }
        fault.set(|s| (s.full, s.room) = (true, 70));
        w.close(BASE + 20);
        assert!(sealed(&root).is_empty());
        assert_eq!(steps_in(&tmp_as_json(&root)), (0..5).collect::<Vec<_>>());
        let c = w.counts();
        assert_eq!((c.written, c.dropped, c.files_sealed), (5, 3, 0));
    }

    #[test]
    fn a_full_disk_never_counts_toward_file_open_fail_threshold_a_refused_open_does() {
        let (_root_dir, root) = tempdir("enospc-open");
        let fault = Fault::default();
        let mut w = TimelineWriter::with_io(settings(&root, 1 << 20, 3600), BASE, Box::new(fault.clone()));
        fault.set(|s| (s.full, s.full_blocks_open) = (true, true));
        let mut now = BASE;
        for i in 0..500 {
            now += 10 * MS;
            w.write(&ev(1, 2, BASE, BASE + 5, i), &names(), now);
        }
        assert!(w.is_healthy());
        assert_eq!((w.counts().open_failures, w.counts().dropped), (0, 500));
        assert!(w.counts().write_errors >= 3);
        fault.set(|s| s.full = false);
        now += 2_000 * MS;
        w.write(&ev(1, 2, BASE, BASE + 5, 500), &names(), now);
        assert_eq!(w.counts().written, 1);
        w.close(now);
        assert_eq!(steps_in(&sealed(&root)[0].1), [500]);

        // A folder that refuses the file (EACCES): threshold 2.
        fault.set(|s| s.deny_open = true);
        for i in 0..4 {
            w.write(&ev(1, 2, BASE, BASE + 5, 600 + i), &names(), now + i);
        }
        assert!(!w.is_healthy());
        assert_eq!(w.counts().open_failures, 2);
    }
}
