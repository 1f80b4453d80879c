//! The framework timeline writer (spec §3.3–§3.5), run by the hook's one background thread.
//!
//! A file is opened lazily at the first event, under a temporary name that no smdebug
//! reader matches (`framework/<node>_pythontimeline.json.tmp`), and locked (`flock`) for
//! its whole life, so that the agent's repair can tell it from a dead writer's. A
//! non-empty file found under that name is such a leftover (a killed trainer with the
//! same node id): it is moved aside as `<node>_pythontimeline.json.stale-<µs>.tmp` for
//! the agent to repair, never truncated or appended to. A file is *sealed* — closed with
//! `\n]`, flushed, fsync'd and renamed to
//! `framework/pevents/<hour>/<T>_<node>_pythontimeline.json` — when it reaches
//! `RotateMaxFileSizeInBytes`, when it has been open for `RotateFileCloseIntervalInSeconds`
//! (also while idle, unlike smdebug), and at shutdown.
//!
//! `<T>` is the largest event end inside the file, raised if needed to one more than the
//! previous file's, so names strictly increase and no file replaces another (spec §8,
//! pitfalls 12 and 13). Every time is passed in by the caller, so tests need no sleeping.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use trainprof_output::{PYTHON_TIMELINE_SUFFIX, timeline_file};

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

/// Counters of what happened to the events handed to the writer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Records written into files that were sealed or are still open.
    pub written: u64,
    /// Events lost by the writer: after it turned itself off, or with a file it could not
    /// write.
    pub dropped: u64,
    pub files_sealed: u64,
    pub open_failures: u64,
}

struct OpenFile {
    out: BufWriter<File>,
    tmp: PathBuf,
    bytes: u64,
    records: u64,
    opened_us: i64,
    max_end_us: i64,
    /// Phases whose metadata lines this file already has.
    phases_named: Vec<bool>,
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
}

impl std::fmt::Debug for TimelineWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimelineWriter")
            .field("settings", &self.settings)
            .field("base_us", &self.base_us)
            .field("open", &self.file.as_ref().map(|f| &f.tmp))
            .field("healthy", &self.healthy)
            .field("counts", &self.counts)
            .finish()
    }
}

impl TimelineWriter {
    /// A writer whose `ts` values are relative to `base_us` (µs since the epoch).
    pub fn new(settings: Settings, base_us: i64) -> TimelineWriter {
        TimelineWriter {
            settings,
            base_us,
            phase_index: HashMap::new(),
            file: None,
            last_name_us: i64::MIN,
            healthy: true,
            line: String::with_capacity(512),
            counts: Counts::default(),
        }
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// False once `FileOpenFailThreshold` opens have failed; it then drops everything.
    pub fn is_healthy(&self) -> bool {
        self.healthy
    }

    /// New rotation limits (after a config reload); they apply from the next event.
    pub fn set_rotation(&mut self, max_bytes: u64, interval_us: i64) {
        self.settings.rotate_max_bytes = max_bytes;
        self.settings.rotate_interval_us = interval_us;
    }

    /// The temporary path of the open file.
    pub fn tmp_path(&self) -> PathBuf {
        self.settings
            .root
            .join("framework")
            .join(format!("{}_{}.tmp", self.settings.node_id, PYTHON_TIMELINE_SUFFIX))
    }

    /// Writes one event at wall-clock time `now_us`. `names[id]` must resolve every id the
    /// event uses (the hook checks ids when the event is recorded).
    pub fn write(&mut self, ev: &Event, names: &[Arc<str>], now_us: i64) {
        if !self.healthy {
            self.counts.dropped += 1;
            return;
        }
        self.rotate_if_due(now_us);
        if self.file.is_none() && !self.open(now_us) {
            self.counts.dropped += 1;
            return;
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
        match file.out.write_all(self.line.as_bytes()) {
            Ok(()) => {
                file.bytes += self.line.len() as u64;
                file.records += 1;
                file.max_end_us = file.max_end_us.max(ev.end_us);
                self.counts.written += 1;
            }
            Err(e) => {
                self.counts.dropped += 1;
                self.abandon(&e);
            }
        }
    }

    /// Seals the open file if it is too big or has been open too long. Called for every
    /// event and by the idle loop.
    pub fn rotate_if_due(&mut self, now_us: i64) {
        let due = self.file.as_ref().is_some_and(|f| {
            f.bytes >= self.settings.rotate_max_bytes
                || now_us.saturating_sub(f.opened_us) >= self.settings.rotate_interval_us
        });
        if due {
            self.seal();
        }
    }

    /// Pushes buffered lines to the file (not fsync'd: only sealing syncs).
    pub fn flush(&mut self) {
        if let Some(file) = self.file.as_mut()
            && let Err(e) = file.out.flush()
        {
            self.abandon(&e);
        }
    }

    /// Seals the open file, if any. The writer stays usable.
    pub fn close(&mut self) {
        self.seal();
    }

    fn open(&mut self, now_us: i64) -> bool {
        let tmp = self.tmp_path();
        let opened = tmp.parent().map_or(Ok(()), fs::create_dir_all).and_then(|()| open_locked(&tmp, now_us));
        match opened {
            Ok(f) => {
                let mut out = BufWriter::with_capacity(64 * 1024, f);
                self.line.clear();
                self.line.push_str("[\n");
                trace::header(&mut self.line, self.base_us);
                if let Err(e) = out.write_all(self.line.as_bytes()) {
                    crate::log(&format_args!("cannot write {}: {e}", tmp.display()));
                    self.open_failed();
                    return false;
                }
                self.file = Some(OpenFile {
                    out,
                    tmp,
                    bytes: self.line.len() as u64,
                    records: 0,
                    opened_us: now_us,
                    max_end_us: i64::MIN,
                    phases_named: Vec::new(),
                });
                true
            }
            Err(e) => {
                crate::log(&format_args!("cannot open {}: {e}", tmp.display()));
                self.open_failed();
                false
            }
        }
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

    /// Gives up on the open file after a write error: its records are counted as dropped
    /// and its temporary file removed, so that no half-written file is ever sealed.
    fn abandon(&mut self, e: &io::Error) {
        if let Some(f) = self.file.take() {
            crate::log(&format_args!(
                "write to {} failed ({e}); dropping its {} events",
                f.tmp.display(),
                f.records
            ));
            self.counts.written -= f.records;
            self.counts.dropped += f.records;
            // Removed while still locked, so that the agent never repairs it.
            let _ = fs::remove_file(&f.tmp);
            drop(f.out.into_parts());
            self.open_failed();
        }
    }

    fn seal(&mut self) {
        let Some(mut f) = self.file.take() else { return };
        let written =
            f.out.write_all(b"\n]").and_then(|()| f.out.flush()).and_then(|()| f.out.get_ref().sync_all());
        if let Err(e) = written {
            self.file = Some(f);
            self.abandon(&e);
            return;
        }
        let mut t = f.max_end_us.max(self.last_name_us.saturating_add(1));
        let mut path = self.final_path(t);
        // Never over an existing file (the agent's repair may have placed one under the
        // same name): the next microsecond instead.
        let moved = loop {
            let placed = path
                .parent()
                .map_or(Ok(()), fs::create_dir_all)
                .and_then(|()| rename_no_replace(&f.tmp, &path));
            match placed {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    t += 1;
                    path = self.final_path(t);
                }
                other => break other,
            }
        };
        match moved {
            Ok(()) => {
                sync_dir(path.parent());
                self.last_name_us = t;
                self.counts.files_sealed += 1;
            }
            Err(e) => {
                // The complete file is moved aside under a unique temporary name (the next
                // file reuses the usual one), for the agent's start-up repair; its events
                // count as dropped, and the failure counts toward FileOpenFailThreshold.
                let aside = f.tmp.with_extension(format!("{t}.tmp"));
                let kept = fs::rename(&f.tmp, &aside).is_ok();
                crate::log(&format_args!(
                    "cannot rename {} to {}: {e}; {} events {}",
                    f.tmp.display(),
                    path.display(),
                    f.records,
                    if kept { format!("kept in {}", aside.display()) } else { "lost".to_owned() }
                ));
                self.counts.written -= f.records;
                self.counts.dropped += f.records;
                self.open_failed();
            }
        }
    }

    fn final_path(&self, t: i64) -> PathBuf {
        self.settings.root.join(timeline_file(t, &self.settings.node_id, PYTHON_TIMELINE_SUFFIX))
    }
}

/// Opens `tmp` empty and locked (the lock lives as long as the file). The lock is taken
/// waiting, on the writer thread: the agent's repair holds one for milliseconds. A file
/// with content is a dead writer's (a live one holds the lock): it is moved aside, still
/// locked, for the agent to repair, and a new file is made.
fn open_locked(tmp: &Path, now_us: i64) -> io::Result<File> {
    for attempt in 0..4 {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(tmp)?;
        if let Err(e) = file.lock() {
            // No locks on this filesystem: the file is still used; the agent's repair
            // cannot lock it either, and leaves it alone.
            crate::log(&format_args!("cannot lock {}: {e}", tmp.display()));
        }
        let held = file.metadata()?;
        // The agent may have repaired (renamed) the file between the open and the lock.
        let same = fs::symlink_metadata(tmp).is_ok_and(|m| m.ino() == held.ino() && m.dev() == held.dev());
        if !same {
            continue;
        }
        if held.len() == 0 {
            return Ok(file);
        }
        let aside = tmp.with_extension(format!("stale-{}.tmp", now_us.saturating_add(attempt)));
        crate::log(&format_args!("moving a dead writer's {} aside to {}", tmp.display(), aside.display()));
        fs::rename(tmp, &aside)?;
    }
    Err(io::Error::other("it kept changing while being opened"))
}

/// `rename` that fails with `AlreadyExists` instead of replacing `to` (`RENAME_NOREPLACE`);
/// where the file system cannot do that, a check and a rename.
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let (Ok(from_c), Ok(to_c)) = (
        std::ffi::CString::new(from.as_os_str().as_bytes()),
        std::ffi::CString::new(to.as_os_str().as_bytes()),
    ) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: both paths are NUL-terminated strings that live across the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from_c.as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS) if !to.exists() => fs::rename(from, to),
        Some(libc::EINVAL | libc::ENOSYS) => Err(io::Error::from(io::ErrorKind::AlreadyExists)),
        _ => Err(e),
    }
}

fn sync_dir(dir: Option<&Path>) {
    if let Some(d) = dir
        && let Ok(f) = File::open(d)
    {
        let _ = f.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{TRAINPROF_MAX_ARGS, TrainprofArg};

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

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("trainprof-writer-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn one_file_matches_the_spec_layout() {
        let root = tempdir("layout");
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        w.write(&ev(1, 2, BASE + 3358, BASE + 13358, 0), &names(), BASE + 20_000);
        w.write(&ev(0, 0, BASE + 1000, BASE + 42358, 0), &names(), BASE + 43_000);
        assert!(w.tmp_path().exists());
        w.close();
        assert!(!w.tmp_path().exists());
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
        assert_eq!(w.counts(), Counts { written: 2, dropped: 0, files_sealed: 1, open_failures: 0 });
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn size_rotation_gives_strictly_increasing_names_and_loses_nothing() {
        let root = tempdir("size");
        let mut w = TimelineWriter::new(settings(&root, 400, 3600), BASE);
        // Every event ends at the same time: smdebug would give several files one name.
        for i in 0..40 {
            w.write(&ev(1, 2, BASE, BASE + 500, i), &names(), BASE + 1000 + i);
        }
        w.close();
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
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_interval_closes_an_idle_file() {
        let root = tempdir("idle");
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 10), BASE);
        w.write(&ev(1, 2, BASE, BASE + 5, 0), &names(), BASE + 10);
        w.rotate_if_due(BASE + 9_000_000);
        assert_eq!(sealed(&root).len(), 0);
        w.rotate_if_due(BASE + 10_000_010);
        assert_eq!(sealed(&root).len(), 1);
        assert!(!w.tmp_path().exists());
        // Nothing open: nothing to seal, no empty file.
        w.rotate_if_due(BASE + 30_000_000);
        w.close();
        assert_eq!(sealed(&root).len(), 1);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn open_failures_turn_the_writer_off_after_the_threshold() {
        let root = tempdir("openfail");
        fs::create_dir_all(&root).unwrap();
        // `framework` is a file, so no directory can be made under it.
        fs::write(root.join("framework"), b"").unwrap();
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        for i in 0..4 {
            w.write(&ev(1, 2, BASE, BASE + 5, i), &names(), BASE + 10);
        }
        assert!(!w.is_healthy());
        assert_eq!(w.counts(), Counts { written: 0, dropped: 4, files_sealed: 0, open_failures: 2 });
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_file_already_under_the_name_is_never_replaced() {
        let root = tempdir("taken");
        // Placed by the agent's repair under the very name this file would take.
        let taken =
            root.join(format!("framework/pevents/2026112203/{}_0-algo-1_pythontimeline.json", BASE + 42358));
        fs::create_dir_all(taken.parent().unwrap()).unwrap();
        fs::write(&taken, "[]").unwrap();
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        w.write(&ev(0, 0, BASE + 1000, BASE + 42358, 0), &names(), BASE + 43_000);
        w.close();
        assert_eq!(fs::read_to_string(&taken).unwrap(), "[]");
        let names: Vec<String> = sealed(&root).into_iter().map(|(n, _)| n).collect();
        assert!(
            names.contains(&format!("2026112203/{}_0-algo-1_pythontimeline.json", BASE + 42359)),
            "{names:?}"
        );
        assert_eq!(w.counts().files_sealed, 1);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_stale_temporary_file_is_moved_aside_not_truncated_or_appended_to() {
        let root = tempdir("stale");
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        fs::create_dir_all(w.tmp_path().parent().unwrap()).unwrap();
        let stale = b"[\n{\"garbage\": ";
        fs::write(w.tmp_path(), stale).unwrap();
        w.write(&ev(1, 2, BASE, BASE + 5, 0), &names(), BASE + 10);
        // The open file is locked: the agent's repair sees a live writer.
        let other = File::open(w.tmp_path()).unwrap();
        assert!(matches!(other.try_lock(), Err(fs::TryLockError::WouldBlock)));
        w.close();
        let files = sealed(&root);
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].1.as_array().unwrap().len(), 5);
        let aside = root.join(format!("framework/0-algo-1_pythontimeline.json.stale-{}.tmp", BASE + 10));
        assert_eq!(fs::read(&aside).unwrap(), stale);
        // An empty leftover (killed before its first flush) is simply used.
        fs::remove_file(&aside).unwrap();
        fs::write(w.tmp_path(), b"").unwrap();
        w.write(&ev(1, 2, BASE, BASE + 5, 1), &names(), BASE + 20);
        w.close();
        assert_eq!(sealed(&root).len(), 2);
        let left: Vec<_> =
            fs::read_dir(root.join("framework")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["pevents"]);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_failed_rename_keeps_the_file_aside_and_counts_its_events() {
        let root = tempdir("renamefail");
        fs::create_dir_all(root.join("framework")).unwrap();
        // `pevents` is a file, so no hour folder can be made under it.
        fs::write(root.join("framework/pevents"), b"").unwrap();
        let mut w = TimelineWriter::new(settings(&root, 1 << 20, 60), BASE);
        w.write(&ev(1, 2, BASE, BASE + 5, 0), &names(), BASE + 10);
        w.write(&ev(1, 2, BASE, BASE + 7, 1), &names(), BASE + 10);
        w.close();
        assert_eq!(w.counts(), Counts { written: 0, dropped: 2, files_sealed: 0, open_failures: 1 });
        let aside: Vec<_> = fs::read_dir(root.join("framework"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert_eq!(aside, [format!("0-algo-1_pythontimeline.json.{}.tmp", BASE + 7)]);
        let kept: serde_json::Value =
            serde_json::from_slice(&fs::read(root.join("framework").join(&aside[0])).unwrap()).unwrap();
        assert_eq!(kept.as_array().unwrap().len(), 6);
        fs::remove_dir_all(&root).unwrap();
    }
}
