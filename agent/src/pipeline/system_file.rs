//! The system metrics files (`docs/formats.md`, `docs/on-disk.md`): JSON lines, one file per
//! node and minute, `system/incremental/<UTC YYYYMMDDHH>/<window start s>.algo-<n>.json`.
//!
//! A file is written as `system/.<window start>.algo-<n>.<pid>.tmp` (no `.json` in the
//! name, so no smdebug reader lists it) and *sealed* when a tick falls in
//! another minute, or at the end: fsync, link to the final name, unlink, fsync of the
//! folder. Every file call goes through `trainprof_output::fs` (`docs/on-disk.md`): the
//! temporary file is created new (`O_EXCL | O_NOFOLLOW`), so a name planted under
//! `system/` is never written through, and a sealed file is never replaced. If the
//! minute's name is taken (an agent restarted within the same minute) the second of the
//! file's first line is used, which is still a window start ≤ every line inside; if that
//! is taken too, the file stays under its temporary name and is counted.
//! Every tick is one `write`, so a killed agent loses at most the tick being written (a
//! failed write is cut off again, so no partial line stays); the next start repairs the
//! temporary file (`agent/src/pipeline/upload/repair.rs`).
//!
//! The job's last tick ([`SystemWriter::write_last_tick`]) goes into a file of its own, named
//! by its own second, and the file before it gets a name below that second
//! (`docs/formats.md`, "System files: names"): smdebug's profiler trial analyses 60 s
//! windows from the oldest file name while a window starts before the newest one, so the
//! newest name must be the job's end for the rules to see the whole job.

use std::fs::File;
use std::io::{self, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

use trainprof_output::fs::{self as ofs, Dir, Move};
use trainprof_output::ledger;
use trainprof_output::node::SystemNode;
use trainprof_output::protocol::system_line::{self, round_us};

use crate::pipeline::sample::{Metric, Name};

/// Why a tick could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SystemWriteError {
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SystemWriteError + '_ {
    move |source| SystemWriteError::Io { path: path.to_owned(), source }
}

#[derive(Debug)]
struct Open {
    window_s: i64,
    /// The whole second of the first line.
    first_s: i64,
    /// Named by its first line's second, never by the minute (the job's last tick).
    by_second: bool,
    dir: Dir,
    tmp: String,
    file: File,
    lines: u64,
    /// Bytes written so far: where a failed write is cut back to.
    len: u64,
}

/// What the writer did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SystemCounts {
    pub files_sealed: u64,
    pub lines: u64,
    /// Ticks that could not be written (the folder unwritable, the disk full).
    pub ticks_lost: u64,
    /// Files that could not be sealed and stay under their temporary name.
    pub seal_failures: u64,
}

/// Writes ticks into minute files under `<root>/system/`.
#[derive(Debug)]
pub struct SystemWriter {
    root: PathBuf,
    algo_n: u32,
    node_id: String,
    open: Option<Open>,
    buf: String,
    /// `,"NodeId":…,"Timestamp":…}` and the newline: the end of every line of a tick.
    tail: String,
    /// The last tick's line heads (`{"Type":…,"Value":`), one after the other, and where
    /// each ends; reused by position (see [`Self::format`]).
    heads: String,
    head_ends: Vec<usize>,
    head_keys: Vec<HeadKey>,
    counts: SystemCounts,
    /// A problem with `.trainprof/` said once.
    ledger_warned: bool,
    /// The window start this writer's first sealed file was named by.
    first_name_s: Option<i64>,
}

impl SystemWriter {
    pub fn new(root: &Path, node: SystemNode) -> SystemWriter {
        let algo_n = node.index();
        SystemWriter {
            root: root.to_owned(),
            algo_n,
            node_id: node.to_string(),
            open: None,
            buf: String::with_capacity(16 * 1024),
            tail: String::with_capacity(64),
            heads: String::new(),
            head_ends: Vec::new(),
            head_keys: Vec::new(),
            counts: SystemCounts::default(),
            ledger_warned: false,
            first_name_s: None,
        }
    }

    pub fn counts(&self) -> SystemCounts {
        self.counts
    }

    /// The `NodeId` of every line.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Writes one tick, all lines with the same `Timestamp` (`wall_s`, epoch seconds).
    /// Returns the file it sealed when the tick opened a new minute.
    pub fn write_tick(
        &mut self,
        wall_s: f64,
        metrics: &[Metric],
    ) -> Result<Option<PathBuf>, SystemWriteError> {
        // Microseconds are all the readers keep (they compare in ns from a float); the
        // window is taken from the rounded time so every line is inside its file's minute.
        let ts = round_us(wall_s);
        let window_s = (ts.floor() as i64).div_euclid(60) * 60;
        let sealed = match &self.open {
            Some(o) if o.window_s != window_s => self.seal().unwrap_or_else(|e| {
                crate::log!("{e}; the file stays under its temporary name");
                None
            }),
            _ => None,
        };
        if metrics.is_empty() {
            return Ok(sealed);
        }
        self.format(wall_s, metrics);
        let result = self.append(window_s, ts.floor() as i64, false, metrics.len() as u64);
        if result.is_err() {
            self.counts.ticks_lost += 1;
        }
        result.map(|()| sealed)
    }

    /// Writes the job's last tick (at the stop) into a file of its own, named by the tick's
    /// second `E`, after sealing the open file under a name below `E`. smdebug's profiler
    /// trial takes the newest system file name as the end of the data and its rules stop at
    /// the first 60 s window that starts at or after it, so the newest name has to be the
    /// job's end; a name only has to be ≤ every line inside (`docs/formats.md`, "System files:
    /// names"). Returns the files sealed, the last tick's last.
    pub fn write_last_tick(
        &mut self,
        wall_s: f64,
        metrics: &[Metric],
    ) -> Result<Vec<PathBuf>, SystemWriteError> {
        let ts = round_us(wall_s);
        let last_s = ts.floor() as i64;
        let mut sealed = Vec::new();
        match self.seal_below(Some(last_s)) {
            Ok(p) => sealed.extend(p),
            Err(e) => crate::log!("{e}; the file stays under its temporary name"),
        }
        if metrics.is_empty() {
            return Ok(sealed);
        }
        self.format(wall_s, metrics);
        if let Err(e) = self.append(last_s, last_s, true, metrics.len() as u64) {
            self.counts.ticks_lost += 1;
            return Err(e);
        }
        sealed.extend(self.seal()?);
        Ok(sealed)
    }

    /// How long to wait before taking the last tick at `wall_s` so that it does not fall in
    /// the first second of one of the trial's 60 s windows, counted from this writer's first
    /// file name: there the newest name (its second) would be that window's start, which
    /// the rules never analyse, and the tick would be left out. `None`: take it now.
    pub fn last_tick_pause(&self, wall_s: f64) -> Option<std::time::Duration> {
        let ts = round_us(wall_s);
        let last_s = ts.floor() as i64;
        let first = self.first_name_s.or_else(|| {
            // The open file is the first: it is named by its first line's second, below the
            // last tick's.
            self.open.as_ref().map(|o| if o.first_s < last_s { o.first_s } else { o.first_s - 1 })
        })?;
        let on_boundary = last_s > first && (last_s - first) % 60 == 0;
        on_boundary.then(|| std::time::Duration::from_secs_f64(((last_s + 1) as f64 - ts).max(0.0)))
    }

    /// The tick's lines into `buf`, all with the timestamp `wall_s` to the microsecond. The
    /// same bytes as
    /// `writeln!(buf, r#"{{"Type":"{}","Name":"{}","Dimension":"{}","Value":{},"NodeId":"{}","Timestamp":{}}}"#, …)`
    /// with the value rounded to two decimals (the platform's files; large counts stay
    /// integers), without the formatting machinery (the protocol's codec,
    /// `trainprof_output::protocol::system_line`): the tail shared by every line (node id
    /// and timestamp) is built once per tick, each line's head (Type, Name, Dimension) is
    /// kept from the last tick, and values go through `system_line::push_value`. A tick's metrics come
    /// in the same order every tick (the samplers' order, each in its file's order), so
    /// line `i`'s head is reused when its key is the last tick's line `i`'s; from the first
    /// line that differs (a core gone, a process new) the heads are built again. Formatting
    /// was the largest part of the agent's own CPU per tick after parsing (BENCHMARKS.md,
    /// "the agent against its floor").
    fn format(&mut self, wall_s: f64, metrics: &[Metric]) {
        self.buf.clear();
        self.tail.clear();
        system_line::push_tail(&mut self.tail, &self.node_id, (wall_s * 1e6).round());
        for (i, m) in metrics.iter().enumerate() {
            let key = HeadKey::of(m);
            if self.head_keys.get(i) != Some(&key) {
                self.head_keys.truncate(i);
                self.head_ends.truncate(i);
                self.heads.truncate(self.head_ends.last().copied().unwrap_or(0));
                system_line::push_head(&mut self.heads, m.kind, &m.name, m.dimension);
                self.head_keys.push(key);
                self.head_ends.push(self.heads.len());
            }
            let start = if i == 0 { 0 } else { self.head_ends[i - 1] };
            self.buf.push_str(&self.heads[start..self.head_ends[i]]);
            system_line::push_value(&mut self.buf, m.value);
            self.buf.push_str(&self.tail);
        }
    }

    fn create(&self, window_s: i64, first_s: i64, by_second: bool) -> Result<Open, SystemWriteError> {
        let system = self.root.join("system");
        let dir =
            Dir::open_root(&self.root, true).and_then(|r| r.sub("system", true)).map_err(io_err(&system))?;
        // A new file every time: the pid keeps live agents apart, the counter steps over a
        // name someone else put there (a dead agent's file is repaired before sampling).
        let pid = std::process::id();
        let mut last = None;
        for k in 0..8 {
            let tag = if k == 0 { pid.to_string() } else { format!("{pid}-{k}") };
            let tmp = trainprof_output::system_temp(window_s, self.algo_n, &tag);
            match dir.create_new(&tmp) {
                Ok(file) => {
                    // Held for the file's life: the repair leaves a locked file alone.
                    if let Err(e) = file.try_lock() {
                        crate::log!("cannot lock {}: {e}", dir.display(&tmp).display());
                    }
                    return Ok(Open { window_s, first_s, by_second, dir, tmp, file, lines: 0, len: 0 });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(io_err(&dir.display(&tmp))(e)),
            }
        }
        let e = last.unwrap_or_else(|| io::Error::other("no free temporary name"));
        Err(io_err(&system)(e))
    }

    fn append(
        &mut self,
        window_s: i64,
        first_s: i64,
        by_second: bool,
        lines: u64,
    ) -> Result<(), SystemWriteError> {
        if self.open.is_none() {
            self.open = Some(self.create(window_s, first_s, by_second)?);
        }
        let Some(o) = self.open.as_mut() else { return Ok(()) };
        // One write per tick: nothing sits in a user-space buffer if the agent is killed.
        if let Err(e) = o.file.write_all(self.buf.as_bytes()) {
            // Cut a partly written tick off again: readers reject a broken line.
            let _ = o.file.set_len(o.len);
            let _ = o.file.seek(SeekFrom::Start(o.len));
            return Err(io_err(&o.dir.display(&o.tmp))(e));
        }
        o.len += self.buf.len() as u64;
        o.lines += lines;
        self.counts.lines += lines;
        Ok(())
    }

    /// Seals the open file, if any, and returns its final path. A file that cannot be
    /// sealed stays under its temporary name (counted) for the next start to repair.
    pub fn seal(&mut self) -> Result<Option<PathBuf>, SystemWriteError> {
        self.seal_below(None)
    }

    /// [`Self::seal`], with a name below the second `below` when one is given.
    fn seal_below(&mut self, below: Option<i64>) -> Result<Option<PathBuf>, SystemWriteError> {
        let Some(o) = self.open.take() else { return Ok(None) };
        if o.lines == 0 {
            let _ = o.dir.unlink_if_same(&o.tmp, &o.file);
            return Ok(None);
        }
        let result = self.place(o, below);
        if result.is_err() {
            self.counts.seal_failures += 1;
        }
        result.map(Some)
    }

    fn place(&mut self, o: Open, below: Option<i64>) -> Result<PathBuf, SystemWriteError> {
        let tmp_path = o.dir.display(&o.tmp);
        o.file.sync_all().map_err(io_err(&tmp_path))?;
        // The minute, but for a writer's first file and the last tick's; then the first
        // line's second and each second before it (`docs/on-disk.md`, "Names").
        let minute = (self.counts.files_sealed > 0 && !o.by_second).then_some(o.window_s);
        let algo_n = self.algo_n;
        let names = minute
            .into_iter()
            .chain(trainprof_output::system_first_names(o.first_s))
            .filter(move |s| below.is_none_or(|b| *s < b))
            .map(move |s| trainprof_output::system_file(s, algo_n));
        // The file (and its lock) lives until it has its name, so that a repair never
        // takes it for a dead writer's.
        let root = Dir::open_root(&self.root, false).map_err(io_err(&self.root))?;
        let placed = place_sealed(&root, &o.dir, &o.tmp, names, &mut self.ledger_warned);
        drop(o.file);
        let rel = placed.map_err(io_err(&tmp_path))?;
        self.counts.files_sealed += 1;
        if self.first_name_s.is_none() {
            self.first_name_s = window_start_of(&rel);
        }
        Ok(self.root.join(rel))
    }
}

/// What a line's head is made of.
#[derive(Debug, Clone, Copy, PartialEq)]
struct HeadKey {
    kind: crate::pipeline::sample::MetricType,
    name: Name,
    dimension: &'static str,
}

impl HeadKey {
    fn of(m: &Metric) -> HeadKey {
        HeadKey { kind: m.kind, name: m.name, dimension: m.dimension }
    }
}

/// The window start (seconds) in a sealed system file's path.
fn window_start_of(rel: &str) -> Option<i64> {
    rel.rsplit('/').next()?.split('.').next()?.parse().ok()
}

/// Gives the synced temporary file `dir/tmp` the first free name of `names` (paths
/// relative to `root`, each a window start ≤ the file's first line), free meaning neither
/// on disk nor in the [`ledger::SYSTEM_NAMES`] record; records the name before it is
/// taken. Used by the writer and by the repair. `warned`: a record that cannot be used is
/// said once (the names on disk still keep files apart).
pub(crate) fn place_sealed(
    root: &Dir,
    dir: &Dir,
    tmp: &str,
    names: impl IntoIterator<Item = String>,
    warned: &mut bool,
) -> io::Result<String> {
    let mut warn = |e: io::Error| {
        if !std::mem::replace(warned, true) {
            crate::log!("{}/{}: {e}", ledger::DIR, ledger::SYSTEM_NAMES);
        }
    };
    let used = ledger::read(root, ledger::SYSTEM_NAMES).unwrap_or_else(|e| {
        warn(e);
        Vec::new()
    });
    let used: std::collections::HashSet<String> = used.into_iter().collect();
    let claim = |rel: &str| {
        if used.contains(rel) {
            return false;
        }
        // Recorded before it is taken: a name given and then lost to a crash is still
        // never given again.
        if let Err(e) = ledger::append(root, ledger::SYSTEM_NAMES, rel) {
            warn(e);
        }
        true
    };
    match ofs::seal(root, dir, tmp, names, Move::Link, claim)? {
        Some(rel) => Ok(rel),
        None => Err(io::Error::new(io::ErrorKind::AlreadyExists, "its names are taken")),
    }
}

impl Drop for SystemWriter {
    fn drop(&mut self) {
        if let Err(e) = self.seal() {
            crate::log!("{e}; the temporary file is repaired at the next start");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::commands::run::summary::data_files_under as files;
    use crate::pipeline::sample::{Metrics, Name};

    /// A scratch folder, removed when the first value is dropped (also when the test fails).
    fn tmpdir(tag: &str) -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::Builder::new().prefix(&format!("trainprof-system-{tag}-")).tempdir().unwrap();
        let d = t.path().to_path_buf();
        (t, d)
    }

    fn tick(v: f64) -> Metrics {
        let mut m = Metrics::new();
        m.push(crate::pipeline::sample::MetricType::Cpu, Name::Indexed("cpu", 0), "CPUUtilization", v);
        m.push(
            crate::pipeline::sample::MetricType::Network,
            Name::Static("ReceiveBytesPerSecond"),
            "Algorithm",
            123_456_789.0,
        );
        m
    }

    #[test]
    fn one_file_per_minute_sealed_by_rename() {
        let (_scratch, root) = tmpdir("minutes");
        let mut w = SystemWriter::new(&root, SystemNode::new(2));
        // 2020-07-22T22:07:00Z = 1595455620
        assert_eq!(w.write_tick(1_595_455_620.5, tick(12.345).as_slice()).unwrap(), None);
        assert_eq!(w.write_tick(1_595_455_679.999_999_4, tick(1.0).as_slice()).unwrap(), None);
        assert_eq!(files(&root), vec![format!("system/.1595455620.algo-2.{}.tmp", std::process::id())]);
        let sealed = w.write_tick(1_595_455_680.25, tick(99.999).as_slice()).unwrap().unwrap();
        assert!(sealed.ends_with("system/incremental/2020072222/1595455620.algo-2.json"));
        let text = std::fs::read_to_string(&sealed).unwrap();
        let lines: Vec<_> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[0],
            r#"{"Type":"cpu","Name":"cpu0","Dimension":"CPUUtilization","Value":12.35,"NodeId":"algo-2","Timestamp":1595455620.5}"#
        );
        assert!(lines[1].contains(r#""Value":123456789,"#));
        assert!(lines[3].ends_with(r#""Timestamp":1595455679.999999}"#), "{}", lines[3]);
        assert!(text.ends_with('\n'));
        drop(w);
        assert_eq!(
            files(&root),
            vec![
                "system/incremental/2020072222/1595455620.algo-2.json",
                "system/incremental/2020072222/1595455680.algo-2.json"
            ]
        );
        assert_eq!(
            std::fs::read_to_string(root.join("system/incremental/2020072222/1595455680.algo-2.json"))
                .unwrap()
                .lines()
                .count(),
            2
        );
    }

    #[test]
    fn a_restart_in_the_same_minute_never_overwrites() {
        let (_scratch, root) = tmpdir("restart");
        let mut counts = Vec::new();
        // Agents one after the other within the minute starting at …620. Each one's first
        // file is named by its first line's second, else a second before it down to the
        // minute: never a name used before, even when that file is gone (uploaded).
        let mut agent = |v: f64, at: f64| {
            let mut w = SystemWriter::new(&root, SystemNode::new(1));
            w.write_tick(at, tick(v).as_slice()).unwrap();
            let _ = w.seal();
            counts.push(w.counts());
        };
        agent(1.0, 1_595_455_630.0);
        agent(2.0, 1_595_455_640.3);
        agent(3.0, 1_595_455_640.7);
        let dir = "system/incremental/2020072222";
        std::fs::remove_file(root.join(format!("{dir}/1595455630.algo-1.json"))).unwrap();
        agent(4.0, 1_595_455_630.5);
        agent(5.0, 1_595_455_620.2);
        agent(6.0, 1_595_455_620.9);
        let names = files(&root);
        assert_eq!(
            names,
            vec![
                format!("{dir}/1595455619.algo-1.json"),
                format!("{dir}/1595455620.algo-1.json"),
                format!("{dir}/1595455629.algo-1.json"),
                format!("{dir}/1595455639.algo-1.json"),
                format!("{dir}/1595455640.algo-1.json"),
            ]
        );
        let value = |n: &str| std::fs::read_to_string(root.join(n)).unwrap();
        // The sixth started in the same second as the fifth: a name before the minute,
        // still ≤ every line in it.
        assert!(value(&names[0]).contains(r#""Value":6,"#));
        assert!(value(&names[1]).contains(r#""Value":5,"#));
        assert!(value(&names[2]).contains(r#""Value":4,"#));
        assert!(value(&names[3]).contains(r#""Value":3,"#));
        assert!(value(&names[4]).contains(r#""Value":2,"#));
        assert_eq!(
            std::fs::read_to_string(root.join(".trainprof/system-names")).unwrap().lines().count(),
            6,
            "every name given is recorded"
        );
        assert_eq!(counts[1], SystemCounts { files_sealed: 1, lines: 2, ..SystemCounts::default() });
        assert_eq!(counts[5], SystemCounts { files_sealed: 1, lines: 2, ..SystemCounts::default() });

        // Every name of a minute taken: the file stays under its temporary name, counted.
        let mut w = SystemWriter::new(&root, SystemNode::new(1));
        let used: String =
            (1_595_455_570..=1_595_455_630).map(|s| trainprof_output::system_file(s, 1) + "\n").collect();
        std::fs::write(root.join(".trainprof/system-names"), used).unwrap();
        w.write_tick(1_595_455_630.5, tick(7.0).as_slice()).unwrap();
        assert!(w.seal().is_err());
        assert_eq!(w.counts().seal_failures, 1);
        let pid = std::process::id();
        let tmp = format!("system/.1595455620.algo-1.{pid}.tmp");
        assert!(files(&root).contains(&tmp));
        std::fs::remove_file(root.join(tmp)).unwrap();
        // Nothing written: nothing sealed, no file left.
        let mut w = SystemWriter::new(&root, SystemNode::new(1));
        w.write_tick(1_595_455_700.0, &[]).unwrap();
        assert_eq!(w.seal().unwrap(), None);
        assert_eq!(files(&root).len(), 5);
    }

    #[test]
    fn the_last_tick_has_a_file_of_its_own_named_by_its_second() {
        let (_scratch, root) = tmpdir("last");
        let dir = "system/incremental/2020072222";
        let mut w = SystemWriter::new(&root, SystemNode::new(1));
        // A job from …630.5 to …700.4: its first file, the minute …680, the last tick.
        w.write_tick(1_595_455_630.5, tick(1.0).as_slice()).unwrap();
        w.write_tick(1_595_455_690.5, tick(2.0).as_slice()).unwrap();
        w.write_tick(1_595_455_700.2, tick(3.0).as_slice()).unwrap();
        assert_eq!(w.last_tick_pause(1_595_455_700.4), None);
        let sealed = w.write_last_tick(1_595_455_700.4, tick(4.0).as_slice()).unwrap();
        assert_eq!(
            sealed,
            [
                root.join(format!("{dir}/1595455680.algo-1.json")),
                root.join(format!("{dir}/1595455700.algo-1.json"))
            ]
        );
        let last = std::fs::read_to_string(&sealed[1]).unwrap();
        assert_eq!(last.lines().count(), 2);
        assert!(last.lines().all(|l| l.ends_with(r#""Timestamp":1595455700.4}"#)), "{last}");
        assert_eq!(w.counts(), SystemCounts { files_sealed: 3, lines: 8, ..SystemCounts::default() });
        drop(w);
        assert_eq!(
            files(&root),
            [
                format!("{dir}/1595455630.algo-1.json"),
                format!("{dir}/1595455680.algo-1.json"),
                format!("{dir}/1595455700.algo-1.json"),
            ]
        );

        // The last tick in the first second of a minute that already has a tick: that
        // file takes the second before the minute, below the last tick's name.
        let (_scratch, root) = tmpdir("last-minute");
        let mut w = SystemWriter::new(&root, SystemNode::new(1));
        w.write_tick(1_595_455_630.5, tick(1.0).as_slice()).unwrap();
        w.write_tick(1_595_455_680.1, tick(2.0).as_slice()).unwrap();
        w.write_last_tick(1_595_455_680.3, tick(3.0).as_slice()).unwrap();
        assert_eq!(
            files(&root),
            [
                format!("{dir}/1595455630.algo-1.json"),
                format!("{dir}/1595455679.algo-1.json"),
                format!("{dir}/1595455680.algo-1.json"),
            ]
        );

        // A job that is only its last tick: one file, named by that tick's second.
        let (_scratch, root) = tmpdir("last-only");
        let mut w = SystemWriter::new(&root, SystemNode::new(1));
        assert_eq!(w.last_tick_pause(1_595_455_630.5), None);
        w.write_last_tick(1_595_455_630.5, tick(1.0).as_slice()).unwrap();
        assert_eq!(files(&root), [format!("{dir}/1595455630.algo-1.json")]);
    }

    #[test]
    fn the_last_name_is_never_reused_and_stays_the_newest() {
        let (_scratch, root) = tmpdir("last-taken");
        let dir = "system/incremental/2020072222";
        // An earlier agent gave …650 and …649 (recorded, the files uploaded and gone).
        std::fs::create_dir_all(root.join(".trainprof")).unwrap();
        let used =
            [1_595_455_650, 1_595_455_649].map(|s| trainprof_output::system_file(s, 1) + "\n").concat();
        std::fs::write(root.join(".trainprof/system-names"), used).unwrap();
        let mut w = SystemWriter::new(&root, SystemNode::new(1));
        w.write_tick(1_595_455_630.5, tick(1.0).as_slice()).unwrap();
        w.write_last_tick(1_595_455_650.5, tick(2.0).as_slice()).unwrap();
        assert_eq!(
            files(&root),
            [format!("{dir}/1595455630.algo-1.json"), format!("{dir}/1595455648.algo-1.json")]
        );
    }

    #[test]
    fn a_last_tick_on_a_window_start_is_told_to_wait_for_the_next_second() {
        let (_scratch, root) = tmpdir("last-pause");
        let mut w = SystemWriter::new(&root, SystemNode::new(1));
        // The first file will be …630 (its first line's second): the rules' windows start
        // at …630 + 60 k.
        w.write_tick(1_595_455_630.5, tick(1.0).as_slice()).unwrap();
        assert_eq!(w.last_tick_pause(1_595_455_689.9), None);
        let wait = w.last_tick_pause(1_595_455_690.25).unwrap();
        assert!((wait.as_secs_f64() - 0.75).abs() < 1e-6, "{wait:?}");
        assert!(w.last_tick_pause(1_595_455_750.0).is_some());
        // Once sealed, the first file's name counts, whatever the open file is.
        w.write_tick(1_595_455_700.5, tick(2.0).as_slice()).unwrap();
        assert!(w.last_tick_pause(1_595_455_750.1).is_some());
        assert_eq!(w.last_tick_pause(1_595_455_751.1), None);
    }

    #[test]
    fn planted_links_are_never_written_through() {
        use std::os::unix::fs::symlink;
        let (_scratch, root) = tmpdir("planted");
        let secret = root.join("secret");
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::write(secret.join("key"), b"root only").unwrap();
        let local = root.join("local");
        std::fs::create_dir_all(local.join("system")).unwrap();
        // The temporary name this agent will use, the agent's records and an hour folder.
        let pid = std::process::id();
        symlink(secret.join("key"), local.join(format!("system/.1595455620.algo-1.{pid}.tmp"))).unwrap();
        symlink(&secret, local.join(".trainprof")).unwrap();
        std::fs::create_dir_all(local.join("system/incremental")).unwrap();
        symlink(&secret, local.join("system/incremental/2020072223")).unwrap();
        let mut w = SystemWriter::new(&local, SystemNode::new(1));
        w.write_tick(1_595_455_630.5, tick(1.0).as_slice()).unwrap();
        let sealed = w.write_tick(1_595_455_690.5, tick(2.0).as_slice()).unwrap().unwrap();
        assert!(sealed.ends_with("system/incremental/2020072222/1595455630.algo-1.json"), "{sealed:?}");
        // The next hour's folder is a link: that file cannot be sealed and stays, counted.
        w.write_tick(1_595_458_800.5, tick(3.0).as_slice()).unwrap();
        assert!(w.seal().is_err());
        assert_eq!(w.counts().seal_failures, 1);
        drop(w);
        let names: Vec<_> = std::fs::read_dir(&secret).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["key"]);
        assert_eq!(std::fs::read(secret.join("key")).unwrap(), b"root only");
        // The planted link is left where it was.
        let link = local.join(format!("system/.1595455620.algo-1.{pid}.tmp"));
        assert!(std::fs::symlink_metadata(link).unwrap().file_type().is_symlink());
    }

    #[test]
    fn an_unwritable_root_loses_ticks_and_counts_them() {
        let (_scratch, root) = tmpdir("unwritable");
        std::fs::write(root.join("system"), b"a file where the folder should be").unwrap();
        let mut w = SystemWriter::new(&root, SystemNode::new(1));
        assert!(w.write_tick(1_595_455_630.0, tick(1.0).as_slice()).is_err());
        assert!(w.write_tick(1_595_455_631.0, tick(1.0).as_slice()).is_err());
        assert_eq!(w.counts().ticks_lost, 2);
    }

    /// The line as the formatter writes it: the reference the hand-written one must equal
    /// byte for byte.
    fn reference_line(m: &Metric, node: &str, ts: f64) -> String {
        let v = (m.value * 100.0).round() / 100.0;
        format!(
            "{{\"Type\":\"{}\",\"Name\":\"{}\",\"Dimension\":\"{}\",\"Value\":{},\"NodeId\":\"{}\",\"Timestamp\":{}}}\n",
            m.kind, m.name, m.dimension, v, node, ts
        )
    }

    #[test]
    fn line_heads_follow_the_metrics_as_they_change() {
        let (_scratch, root) = tmpdir("heads");
        let mut w = SystemWriter::new(&root, SystemNode::new(1));
        let label = |s: &[u8]| crate::pipeline::sample::Label::sanitized(s);
        let ticks: Vec<Vec<(Name, &'static str, f64)>> = vec![
            vec![
                (Name::Indexed("cpu", 0), "CPUUtilization", 1.0),
                (Name::Indexed("cpu", 1), "CPUUtilization", 2.0),
            ],
            // The same keys, new values.
            vec![
                (Name::Indexed("cpu", 0), "CPUUtilization", 3.5),
                (Name::Indexed("cpu", 1), "CPUUtilization", 4.25),
            ],
            // The first line changes: every head after it is built again.
            vec![
                (Name::Indexed("cpu", 1), "CPUUtilization", 5.0),
                (Name::Process(42, label(b"python")), "ProcessCPUPercent", 6.0),
                (Name::Static("AllCores"), "BusyPercent", 7.0),
            ],
            // Shorter, then a change in the middle and longer again.
            vec![(Name::Indexed("cpu", 1), "CPUUtilization", 8.0)],
            vec![
                (Name::Indexed("cpu", 1), "CPUUtilization", 9.0),
                (Name::Process(43, label(b"python")), "ProcessCPUPercent", 10.0),
                (Name::Process(43, label(b"python")), "ProcessPSSBytes", 11.0),
            ],
            vec![],
            vec![(Name::Indexed("cpu", 1), "I/OWaitPercentage", 12.0)],
        ];
        let mut expected = String::new();
        for (k, tick) in ticks.iter().enumerate() {
            let mut m = Metrics::new();
            for &(name, dim, v) in tick {
                let kind = match name {
                    Name::Process(..) => crate::pipeline::sample::MetricType::Trainer,
                    Name::Static(_) => crate::pipeline::sample::MetricType::Host,
                    Name::Indexed(..) => crate::pipeline::sample::MetricType::Cpu,
                };
                m.push(kind, name, dim, v);
            }
            let wall = 1_595_455_620.25 + k as f64;
            w.write_tick(wall, m.as_slice()).unwrap();
            expected.extend(m.as_slice().iter().map(|x| reference_line(x, "algo-1", round_us(wall))));
        }
        let tmp = root.join(format!("system/.1595455620.algo-1.{}.tmp", std::process::id()));
        assert_eq!(std::fs::read_to_string(tmp).unwrap(), expected);
    }

    #[test]
    fn a_tick_is_written_as_the_formatter_wrote_it() {
        let (_scratch, root) = tmpdir("format");
        let mut w = SystemWriter::new(&root, SystemNode::new(3));
        let mut m = Metrics::new();
        for (i, v) in [12.345, -0.001, 1e14, 0.5, 7.0].into_iter().enumerate() {
            m.push(
                crate::pipeline::sample::MetricType::Host,
                Name::Static("AllCores"),
                "BusyPercent",
                v + i as f64,
            );
        }
        let wall = 1_595_455_620.123_456_7;
        w.write_tick(wall, m.as_slice()).unwrap();
        let expected: String =
            m.as_slice().iter().map(|x| reference_line(x, "algo-3", round_us(wall))).collect();
        let tmp = root.join(format!("system/.1595455620.algo-3.{}.tmp", std::process::id()));
        assert_eq!(std::fs::read_to_string(tmp).unwrap(), expected);
    }
}
