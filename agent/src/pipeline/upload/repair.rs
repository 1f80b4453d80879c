//! Repair of the temporary files a killed writer left under `LocalPath`, so that their
//! records are sealed and uploaded like any other file:
//!
//! * `system/.<window s>.algo-<n>.<pid>.tmp`, the agent's system writer: JSON lines. The
//!   complete lines are kept up to the first broken one, the file is cut after them and
//!   sealed under the second of its first line, else under its window's start (never
//!   replacing a file, [`crate::pipeline::system_file::place_sealed`]).
//! * `framework/<node>_pythontimeline.json.tmp`, the hook's timeline writer, and
//!   `framework/<node>_pythontimeline.json.<anything>.tmp`, a file the hook moved aside (a
//!   complete one whose rename failed, or a dead trainer's `stale-<µs>` leftover): the
//!   records up to the last complete one are kept, `\n]` closes the array, and the file is
//!   sealed as `framework/pevents/<hour>/<T>_<node>_pythontimeline.json`, `<T>` the largest
//!   event end inside, raised by 1 µs while the name is taken.
//!
//! A file with no record (no complete line; no `X` event) is deleted. Nothing else is looked
//! at: not `.tmp/` (Python stats being written), not `.trainprof/`, not sealed files.
//!
//! Live writers: both writers hold an exclusive `flock` on their temporary file for its
//! whole life. The repair takes the lock without waiting, so a file whose lock is taken
//! belongs to a live writer and is left alone; once locked, the path must still name the
//! locked file (a writer may have sealed or moved it meanwhile). The whole repair, the
//! final link and the unlink of the temporary name included, happens under the lock.

use std::fs::{File, TryLockError};
use std::io::{self, Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use trainprof_output::fs::{self as ofs, Dir, Kind, Move};
use trainprof_output::protocol::timeline_event::RawEvent;
use trainprof_output::protocol::{system_line, timeline};

use crate::pipeline::system_file::place_sealed;

/// What [`repair_all`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Temporary files sealed under a final name.
    pub repaired: u64,
    /// Records in them: lines of system files, `X` events of timelines.
    pub records: u64,
    /// Bytes thrown away: broken tails cut off, and the content of removed files.
    pub bytes_cut: u64,
    /// Temporary files deleted because they held no record.
    pub removed: u64,
    /// Temporary files left alone because a writer holds them, or just replaced them.
    pub live: u64,
    /// Temporary files left alone because they changed less than `min_age` ago.
    pub young: u64,
    /// One line per file that could not be repaired, with its path. The file stays (for
    /// the next try); it may have been cut already, which a next try keeps.
    pub failed: Vec<String>,
    /// Entries with a temporary file's name that are not regular files (a link, a FIFO),
    /// or folders that are links: left alone, one line each.
    pub refused: Vec<String>,
    /// The final paths of the repaired files.
    pub sealed: Vec<PathBuf>,
}

impl RepairReport {
    /// Logs what was repaired (one line, if anything) and each failure or refusal that
    /// `logged` does not hold yet; returns the number of files repaired.
    pub fn log(&self, logged: &mut std::collections::HashSet<String>) -> u64 {
        if self.repaired > 0 {
            crate::log!("repaired {} temporary files ({} records)", self.repaired, self.records);
        }
        for f in &self.failed {
            if logged.insert(f.clone()) {
                crate::log!("{f}");
            }
        }
        for r in &self.refused {
            if logged.insert(r.clone()) {
                crate::log!("left alone: {r}");
            }
        }
        self.repaired
    }
}

/// Why one file could not be repaired.
#[derive(Debug, thiserror::Error)]
enum RepairError {
    #[error("cannot repair {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("cannot repair {path}: {why}")]
    Invalid { path: PathBuf, why: &'static str },
}

/// What a temporary file is, from its name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Temp {
    System,
    Timeline { node: String },
}

enum Outcome {
    Sealed {
        path: PathBuf,
        records: u64,
        cut: u64,
    },
    Removed {
        cut: u64,
    },
    Live,
    Young,
    /// Sealed or removed by someone else since it was listed.
    Gone,
}

/// One temporary file to look at: its folder, its name.
struct Found<'a> {
    dir: &'a Dir,
    name: &'a str,
}

impl Found<'_> {
    fn path(&self) -> PathBuf {
        self.dir.display(self.name)
    }

    fn err(&self) -> impl FnOnce(io::Error) -> RepairError + '_ {
        move |source| RepairError::Io { path: self.path(), source }
    }
}

/// Repairs every dead writer's temporary file under `root` (see the module doc). A file
/// changed less than `min_age` before `now` is left alone: at start-up, with nothing
/// running yet, `min_age` is zero; while writers run, a few seconds.
pub fn repair_all(root: &Path, min_age: Duration, now: SystemTime) -> RepairReport {
    let mut report = RepairReport::default();
    let root = match Dir::open_root(root, false) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return report,
        Err(e) => {
            report.failed.push(format!("cannot open {}: {e}", root.display()));
            return report;
        }
    };
    for (folder, parse) in [("system", system_temp as fn(&str) -> Option<Temp>), ("framework", timeline_temp)]
    {
        let dir = match root.sub(folder, false) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                report.refused.push(e.to_string());
                continue;
            }
        };
        let entries = match dir.entries() {
            Ok(e) => e,
            Err(e) => {
                report.failed.push(format!("cannot list {}: {e}", dir.path().display()));
                continue;
            }
        };
        for entry in entries {
            let Ok(name) = entry.name else { continue };
            let Some(temp) = parse(&name) else { continue };
            let found = Found { dir: &dir, name: &name };
            if entry.kind != Kind::File {
                if entry.kind != Kind::Dir {
                    report.refused.push(format!("{} is not a regular file", found.path().display()));
                }
                continue;
            }
            match repair_one(&root, &found, &temp, min_age, now) {
                Ok(Outcome::Sealed { path, records, cut }) => {
                    report.repaired += 1;
                    report.records += records;
                    report.bytes_cut += cut;
                    report.sealed.push(path);
                }
                Ok(Outcome::Removed { cut }) => {
                    report.removed += 1;
                    report.bytes_cut += cut;
                }
                Ok(Outcome::Live) => report.live += 1,
                Ok(Outcome::Young) => report.young += 1,
                Ok(Outcome::Gone) => {}
                Err(e) => report.failed.push(e.to_string()),
            }
        }
    }
    report
}

/// A system writer's temporary name (`trainprof_output::system_temp`).
fn system_temp(name: &str) -> Option<Temp> {
    trainprof_output::parse_system_temp(name).map(|_| Temp::System)
}

/// A timeline writer's temporary name (`trainprof_output::timeline_temp`).
fn timeline_temp(name: &str) -> Option<Temp> {
    trainprof_output::parse_timeline_temp(name).map(|node| Temp::Timeline { node: node.to_owned() })
}

fn repair_one(
    root: &Dir,
    found: &Found<'_>,
    temp: &Temp,
    min_age: Duration,
    now: SystemTime,
) -> Result<Outcome, RepairError> {
    let meta = match found.dir.stat(found.name) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Outcome::Gone),
        Err(e) => return Err(found.err()(e)),
    };
    if min_age > Duration::ZERO && meta.modified().checked_add(min_age).is_none_or(|t| t > now) {
        return Ok(Outcome::Young);
    }
    let mut file = match lock(found).map_err(found.err())? {
        Locked::Held(file) => file,
        Locked::Live => return Ok(Outcome::Live),
        Locked::Gone => return Ok(Outcome::Gone),
    };
    // A second link: the writer was killed between giving the file its final name and
    // removing the temporary one. The data is sealed already; sealing it again would
    // make it two objects.
    let held = ofs::meta_of(&file).map_err(found.err())?;
    if held.nlink > 1 {
        found.dir.unlink_if_same(found.name, &file).map_err(found.err())?;
        return Ok(Outcome::Gone);
    }
    // Our writers write every byte: a file that takes much less room than it claims is
    // sparse, planted, and not read into memory; nor is one larger than any we write.
    if held.len > MAX_TEMP_BYTES || held.allocated.saturating_add(1 << 20) < held.len {
        return Err(RepairError::Invalid {
            path: found.path(),
            why: "it is larger than any temporary file of ours, or sparse: left alone",
        });
    }
    file.seek(SeekFrom::Start(0)).map_err(found.err())?;
    let mut bytes = Vec::new();
    (&mut file).take(MAX_TEMP_BYTES).read_to_end(&mut bytes).map_err(found.err())?;
    match temp {
        Temp::System => repair_system(root, found, &file, &bytes),
        Temp::Timeline { node } => repair_timeline(root, found, &mut file, &bytes, node),
    }
    // `file`, and with it the lock, is dropped only here, after the temporary name is gone.
}

enum Locked {
    Held(File),
    Live,
    Gone,
}

/// Opens the file (a regular file, never through a link) and takes its lock without
/// waiting.
fn lock(found: &Found<'_>) -> io::Result<Locked> {
    let file = match found.dir.open_regular(found.name, true) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Locked::Gone),
        Err(e) => return Err(e),
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(Locked::Live),
        Err(TryLockError::Error(e)) => return Err(e),
    }
    // The writer may have sealed, moved or replaced the file between the open and the lock.
    match found.dir.names(found.name, &file) {
        Ok(true) => Ok(Locked::Held(file)),
        Ok(false) if found.dir.stat(found.name).is_err() => Ok(Locked::Gone),
        Ok(false) => Ok(Locked::Live),
        Err(e) => Err(e),
    }
}

/// Deletes a temporary file without a record (its lock is still held by the caller),
/// only while its name still holds the file that was read.
fn remove(found: &Found<'_>, file: &File, len: usize) -> Result<Outcome, RepairError> {
    if !found.dir.unlink_if_same(found.name, file).map_err(found.err())? {
        return Ok(Outcome::Gone);
    }
    Ok(Outcome::Removed { cut: len as u64 })
}

/// The largest temporary file the repair reads: far above a minute of system lines or a
/// rotated timeline, small enough that a planted file cannot exhaust memory.
const MAX_TEMP_BYTES: u64 = 512 << 20;

/// Keeps the complete lines up to the first broken one, each a JSON object with a
/// numeric `Timestamp`.
fn repair_system(root: &Dir, found: &Found<'_>, file: &File, bytes: &[u8]) -> Result<Outcome, RepairError> {
    let mut keep = 0;
    let mut lines = 0;
    let mut first_s = None;
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        let Some(body) = line.strip_suffix(b"\n") else { break };
        let ts = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get(system_line::TIMESTAMP_KEY)?.as_f64());
        let Some(ts) = ts else { break };
        first_s.get_or_insert(ts.floor() as i64);
        keep += line.len();
        lines += 1;
    }
    let Some(first_s) = first_s else { return remove(found, file, bytes.len()) };
    if keep < bytes.len() {
        file.set_len(keep as u64).map_err(found.err())?;
    }
    file.sync_all().map_err(found.err())?;
    // The n of the name is the writer's; the lines carry it too, but the name is what the
    // writer chose.
    let algo_n = trainprof_output::parse_system_temp(found.name).map_or(1, |(_, n)| n);
    let names = trainprof_output::system_names(None, first_s, algo_n);
    let rel = place_sealed(root, found.dir, found.name, names, &mut false).map_err(found.err())?;
    Ok(Outcome::Sealed { path: root.display(&rel), records: lines, cut: (bytes.len() - keep) as u64 })
}

/// Keeps the records up to the last complete one and closes the array.
fn repair_timeline(
    root: &Dir,
    found: &Found<'_>,
    file: &mut File,
    bytes: &[u8],
    node: &str,
) -> Result<Outcome, RepairError> {
    // A complete file (one moved aside after a failed rename) is kept byte for byte.
    let (events, keep) = match serde_json::from_slice::<Vec<Value>>(bytes) {
        Ok(events) => (events, None),
        Err(_) => {
            let keep = complete_prefix(bytes);
            if keep == 0 {
                return remove(found, file, bytes.len());
            }
            let mut closed = bytes[..keep].to_vec();
            closed.extend_from_slice(b"\n]");
            let events = serde_json::from_slice::<Vec<Value>>(&closed).map_err(|_| RepairError::Invalid {
                path: found.path(),
                why: "its complete lines do not make a JSON array",
            })?;
            (events, Some(keep))
        }
    };
    // Decoded as every reader decodes an event (`timeline_event`); an element that is not
    // one (a field of the wrong type) is no record.
    let events: Vec<RawEvent> = events.iter().filter_map(RawEvent::from_value).collect();
    let base = events.first().map_or(0, |e| micros(e.args().get(timeline::BASE_TIME_KEY)));
    let ends = events
        .iter()
        .filter(|e| e.ph() == timeline::PH_COMPLETE)
        .map(|e| base.saturating_add(micros_f(e.ts)).saturating_add(micros_f(e.dur)));
    let (records, end_us) = ends.fold((0, i64::MIN), |(n, max), end| (n + 1, max.max(end)));
    if records == 0 {
        return remove(found, file, bytes.len());
    }
    if let Some(keep) = keep {
        file.set_len(keep as u64).map_err(found.err())?;
        file.seek(SeekFrom::End(0)).and_then(|_| file.write_all(b"\n]")).map_err(found.err())?;
    }
    file.sync_all().map_err(found.err())?;
    let names = trainprof_output::timeline_names(end_us, node);
    let placed = ofs::seal(root, found.dir, found.name, names, Move::Link, |_| true).map_err(found.err())?;
    let Some(rel) = placed else {
        return Err(RepairError::Invalid {
            path: found.path(),
            why: "the names for its end time are all taken",
        });
    };
    let cut = keep.map_or(0, |k| bytes.len() - k) as u64;
    Ok(Outcome::Sealed { path: root.display(&rel), records, cut })
}

/// The length of `bytes` up to the end of its last complete line: `[` on the first line,
/// then lines that each hold one JSON object followed by `,` (or not, for the last one).
///
/// The last line counts even without its newline: the hook writes the separator before a
/// record, so its last complete record is never followed by one; and a cut line never
/// parses, because a line holds exactly one object, which ends only at its last `}`.
fn complete_prefix(bytes: &[u8]) -> usize {
    let Some(mut rest) = bytes.strip_prefix(b"[\n") else { return 0 };
    let mut at = 2;
    let mut keep = 0;
    while !rest.is_empty() {
        let (line, next) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        let body = line.strip_suffix(b",").unwrap_or(line);
        if !serde_json::from_slice::<Value>(body).is_ok_and(|v| v.is_object()) {
            break;
        }
        keep = at + body.len();
        at += line.len() + 1;
        rest = next;
    }
    keep
}

/// A time in µs: an integer, or a float rounded (readers accept both); 0 when absent.
fn micros(v: Option<&Value>) -> i64 {
    v.and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f.round() as i64))).unwrap_or(0)
}

/// [`micros`] of an event's `ts` or `dur`.
fn micros_f(v: Option<f64>) -> i64 {
    v.map_or(0, |f| f.round() as i64)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::fs::{self, OpenOptions};

    use trainprof_output::{PYTHON_TIMELINE_SUFFIX, timeline_file};

    use super::*;
    use crate::commands::run::summary::data_files_under as files;

    /// smdebug 1.0.34's own output (docs/formats.md, "Timeline files"): a sealed
    /// file is byte for byte what a killed writer's prefix extends to.
    const TIMELINE: &str = r#"[
{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1795316901767630}},
{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},
{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "Forward"}},
{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},
{"name": "Net", "pid": 0, "ph": "X", "ts": 3358, "dur": 10000, "args": {"pid": 29945, "step_num": "0"}},
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "Forward-SubModuleInternal"}},
{"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": 1}},
{"name": "conv1", "pid": 1, "ph": "X", "ts": 3358, "dur": 4000, "args": {"pid": 29945, "step_num": "0"}},
{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "Backward(post-forward)"}},
{"name": "process_sort_index", "ph": "M", "pid": 2, "args": {"sort_index": 2}},
{"name": "conv1", "pid": 2, "ph": "X", "ts": 13358, "dur": 8000, "args": {"pid": 29945, "step_num": "0"}},
{"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "Step:ModeKeys.TRAIN"}},
{"name": "process_sort_index", "ph": "M", "pid": 3, "args": {"sort_index": 3}},
{"name": "Step:ModeKeys.TRAIN", "pid": 3, "ph": "X", "ts": 2358, "dur": 20000, "args": {"pid": 29945, "step_num": "0"}},
{"name": "process_name", "ph": "M", "pid": 4, "args": {"name": "cpu_functions"}},
{"name": "process_sort_index", "ph": "M", "pid": 4, "args": {"sort_index": 4}},
{"name": "aten::conv2d", "pid": 4, "ph": "X", "ts": 23358, "dur": 2000, "args": {"tid": 1, "step_num": 1, "device": "cpu"}},
{"name": "process_name", "ph": "M", "pid": 5, "args": {"name": "gpu_functions-dev:0"}},
{"name": "process_sort_index", "ph": "M", "pid": 5, "args": {"sort_index": 5}},
{"name": "volta_scudnn_128x64_relu", "pid": 5, "ph": "X", "ts": 24358, "dur": 1000, "args": {"tid": 0, "step_num": 1, "event_name": "aten::conv2d", "device": 0, "start_cpu_thread": 1, "cpu_thread_start_time": 1795316901790988.0}},
{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "Forward"}},
{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},
{"name": "Net", "pid": 0, "ph": "X", "ts": 23358, "dur": 10000, "args": {"pid": 29945, "step_num": "1"}},
{"name": "Step:ModeKeys.TRAIN", "pid": 3, "ph": "X", "ts": 22358, "dur": 20000, "args": {"pid": 29945, "step_num": "1"}}
]"#;

    /// The sealed name of [`TIMELINE`] (smdebug's own: base + the largest end).
    const TIMELINE_NAME: &str = "framework/pevents/2026112203/1795316901809988_29945-vm_pythontimeline.json";

    /// A scratch folder, removed when the first value is dropped (also when the test fails).
    fn tmpdir(tag: &str) -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::Builder::new().prefix(&format!("trainprof-repair-{tag}-")).tempdir().unwrap();
        let d = t.path().to_path_buf();
        fs::create_dir_all(d.join("system")).unwrap();
        fs::create_dir_all(d.join("framework")).unwrap();
        (t, d)
    }

    fn repair(root: &Path) -> RepairReport {
        repair_all(root, Duration::ZERO, SystemTime::now())
    }

    fn line(ts: f64, v: u32) -> String {
        format!(
            r#"{{"Type":"cpu","Name":"cpu0","Dimension":"CPUUtilization","Value":{v},"NodeId":"algo-1","Timestamp":{ts}}}"#
        ) + "\n"
    }

    #[test]
    fn a_system_temp_cut_mid_line_keeps_its_complete_lines() {
        let (_scratch, root) = tmpdir("system");
        // 2020-07-22T22:07:00Z = 1595455620; the first line is at …621.5.
        let good = line(1_595_455_621.5, 1) + &line(1_595_455_621.5, 2) + &line(1_595_455_631.0, 3);
        let partial = r#"{"Type":"cpu","Name":"cpu0","Dimen"#;
        fs::write(root.join("system/.1595455620.algo-1.4242.tmp"), good.clone() + partial).unwrap();
        // A broken line in the middle: everything from it on goes.
        let broken = line(1_595_455_680.0, 4) + "{\"Type\":\n" + &line(1_595_455_681.0, 5);
        fs::write(root.join("system/.1595455680.algo-2.77.extra.tmp"), &broken).unwrap();

        let report = repair(&root);
        let first = "system/incremental/2020072222/1595455621.algo-1.json";
        let second = "system/incremental/2020072222/1595455680.algo-2.json";
        assert_eq!(files(&root), [first, second]);
        assert_eq!(fs::read_to_string(root.join(first)).unwrap(), good);
        assert_eq!(fs::read_to_string(root.join(second)).unwrap(), line(1_595_455_680.0, 4));
        assert_eq!(
            report,
            RepairReport {
                repaired: 2,
                records: 4,
                bytes_cut: (partial.len() + broken.len() - line(1_595_455_680.0, 4).len()) as u64,
                sealed: vec![root.join(first), root.join(second)],
                ..RepairReport::default()
            }
        );
        // Nothing left to do.
        assert_eq!(repair(&root), RepairReport::default());
    }

    #[test]
    fn a_system_temp_never_overwrites_a_sealed_file() {
        let (_scratch, root) = tmpdir("taken");
        let taken = "system/incremental/2020072222/1595455621.algo-1.json";
        fs::create_dir_all(root.join(taken).parent().unwrap()).unwrap();
        fs::write(root.join(taken), "sealed before").unwrap();
        let text = line(1_595_455_621.5, 1);
        fs::write(root.join("system/.1595455620.algo-1.1.tmp"), &text).unwrap();
        let report = repair(&root);
        // The next choice: a second earlier.
        let other = root.join("system/incremental/2020072222/1595455620.algo-1.json");
        assert_eq!(report.sealed, std::slice::from_ref(&other));
        assert_eq!(fs::read_to_string(&other).unwrap(), text);
        assert_eq!(fs::read_to_string(root.join(taken)).unwrap(), "sealed before");

        // Every name of the minute before taken (given before, say): the file stays, cut,
        // and the failure names it.
        let used: String =
            (1_595_455_561..=1_595_455_621).map(|s| trainprof_output::system_file(s, 1) + "\n").collect();
        fs::write(root.join(".trainprof/system-names"), used).unwrap();
        let tmp = root.join("system/.1595455620.algo-1.2.tmp");
        fs::write(&tmp, text.clone() + "{\"cut").unwrap();
        let report = repair(&root);
        assert_eq!(report.repaired, 0);
        assert_eq!(report.failed.len(), 1);
        assert!(report.failed[0].contains(".1595455620.algo-1.2.tmp"), "{:?}", report.failed);
        assert_eq!(fs::read_to_string(&tmp).unwrap(), text);
        assert_eq!(fs::read_to_string(&other).unwrap(), text);
        assert_eq!(fs::read_to_string(root.join(taken)).unwrap(), "sealed before");
    }

    #[test]
    fn a_temp_without_a_record_is_removed() {
        let (_scratch, root) = tmpdir("empty");
        fs::write(root.join("system/.1595455620.algo-1.1.tmp"), "").unwrap();
        fs::write(root.join("system/.1595455620.algo-1.2.tmp"), r#"{"Type":"cpu","Timest"#).unwrap();
        // A complete line without a Timestamp is not a record.
        fs::write(root.join("system/.1595455620.algo-1.3.tmp"), "{}\n").unwrap();
        fs::write(root.join("framework/0-algo-1_pythontimeline.json.tmp"), "").unwrap();
        // Metadata only: no event.
        let meta: String = TIMELINE.lines().take(5).map(|l| format!("{l}\n")).collect();
        fs::write(root.join("framework/1-algo-1_pythontimeline.json.tmp"), &meta).unwrap();
        let report = repair(&root);
        assert_eq!(files(&root), Vec::<String>::new());
        assert_eq!(
            report,
            RepairReport { removed: 5, bytes_cut: 21 + 3 + meta.len() as u64, ..RepairReport::default() }
        );
    }

    /// The objects of [`TIMELINE`] with the offset where each one's line ends (before its
    /// `,` or newline).
    fn timeline_lines() -> Vec<(usize, Value)> {
        let mut out = Vec::new();
        let mut at = 0;
        for l in TIMELINE.split_inclusive('\n') {
            let body = l.trim_end_matches('\n').trim_end_matches(',');
            if body.starts_with('{') {
                out.push((at + body.len(), serde_json::from_str(body).unwrap()));
            }
            at += l.len();
        }
        out
    }

    #[test]
    fn a_timeline_cut_anywhere_keeps_every_complete_record() {
        let (_scratch, root) = tmpdir("cut");
        let all = timeline_lines();
        assert_eq!(all.len(), 24);
        let tmp = root.join("framework/29945-vm_pythontimeline.json.tmp");
        for cut in 0..=TIMELINE.len() {
            fs::write(&tmp, &TIMELINE.as_bytes()[..cut]).unwrap();
            let report = repair(&root);
            let kept: Vec<Value> =
                all.iter().filter(|(end, _)| *end <= cut).map(|(_, v)| v.clone()).collect();
            let events = kept.iter().filter(|v| v["ph"] == "X").count() as u64;
            assert!(report.failed.is_empty(), "cut at {cut}: {:?}", report.failed);
            assert!(!tmp.exists(), "cut at {cut}");
            if events == 0 {
                assert_eq!((report.removed, report.bytes_cut), (1, cut as u64), "cut at {cut}");
                assert_eq!(files(&root), Vec::<String>::new(), "cut at {cut}");
                continue;
            }
            assert_eq!((report.repaired, report.records), (1, events), "cut at {cut}");
            let path = &report.sealed[0];
            let text = fs::read_to_string(path).unwrap();
            let parsed: Vec<Value> = serde_json::from_str(&text).unwrap();
            assert_eq!(parsed, kept, "cut at {cut}");
            // The records kept are the file's own bytes, closed like a sealed file.
            assert!(text.ends_with("}\n]"), "cut at {cut}");
            assert!(TIMELINE.starts_with(&text[..text.len() - 2]), "cut at {cut}");
            let cut_off = if cut == TIMELINE.len() { 0 } else { cut - (text.len() - 2) };
            assert_eq!(report.bytes_cut as usize, cut_off, "cut at {cut}");
            // Named by the largest end of the events kept.
            let base = 1_795_316_901_767_630;
            let end = kept
                .iter()
                .filter(|v| v["ph"] == "X")
                .map(|v| micros(Some(&v["ts"])) + micros(Some(&v["dur"])))
                .max();
            let name = timeline_file(base + end.unwrap(), "29945-vm", PYTHON_TIMELINE_SUFFIX);
            assert_eq!(path, &root.join(name), "cut at {cut}");
            if cut >= TIMELINE.len() - 2 {
                assert_eq!(path, &root.join(TIMELINE_NAME));
            }
            fs::remove_file(path).unwrap();
        }
    }

    #[test]
    fn a_timeline_moved_aside_keeps_its_bytes_and_takes_a_free_name() {
        let (_scratch, root) = tmpdir("aside");
        fs::create_dir_all(root.join(TIMELINE_NAME).parent().unwrap()).unwrap();
        fs::write(root.join(TIMELINE_NAME), "sealed before").unwrap();
        let aside = root.join("framework/29945-vm_pythontimeline.json.1795316901809988.tmp");
        fs::write(&aside, TIMELINE).unwrap();
        let stale = root.join("framework/29945-vm_pythontimeline.json.stale-1795316901900000.tmp");
        fs::write(&stale, TIMELINE).unwrap();
        let report = repair(&root);
        let next = |t: i64| root.join(timeline_file(t, "29945-vm", PYTHON_TIMELINE_SUFFIX));
        assert_eq!(report.sealed, [next(1_795_316_901_809_989), next(1_795_316_901_809_990)]);
        assert_eq!((report.repaired, report.records, report.bytes_cut), (2, 16, 0));
        for p in &report.sealed {
            assert_eq!(fs::read_to_string(p).unwrap(), TIMELINE);
        }
        assert_eq!(fs::read_to_string(root.join(TIMELINE_NAME)).unwrap(), "sealed before");
        assert!(!aside.exists() && !stale.exists());
    }

    #[test]
    fn a_writer_killed_between_link_and_unlink_leaves_one_sealed_file() {
        let (_scratch, root) = tmpdir("linked");
        let tmp = root.join("system/.1595455620.algo-1.1.tmp");
        fs::write(&tmp, line(1_595_455_621.5, 1)).unwrap();
        let sealed = root.join("system/incremental/2020072222/1595455621.algo-1.json");
        fs::create_dir_all(sealed.parent().unwrap()).unwrap();
        fs::hard_link(&tmp, &sealed).unwrap();
        assert_eq!(repair(&root), RepairReport::default());
        assert_eq!(files(&root), ["system/incremental/2020072222/1595455621.algo-1.json"]);
        assert_eq!(fs::read_to_string(&sealed).unwrap(), line(1_595_455_621.5, 1));
    }

    #[test]
    fn a_locked_temp_is_left_alone() {
        let (_scratch, root) = tmpdir("locked");
        let system = root.join("system/.1595455620.algo-1.1.tmp");
        fs::write(&system, line(1_595_455_621.5, 1) + "{\"cut").unwrap();
        let timeline = root.join("framework/0-algo-1_pythontimeline.json.tmp");
        fs::write(&timeline, &TIMELINE[..1000]).unwrap();
        let before = files(&root);
        let writers: Vec<File> = [&system, &timeline]
            .into_iter()
            .map(|p| {
                let f = OpenOptions::new().write(true).open(p).unwrap();
                f.try_lock().unwrap();
                f
            })
            .collect();
        let report = repair(&root);
        assert_eq!(report, RepairReport { live: 2, ..RepairReport::default() });
        assert_eq!(files(&root), before);
        assert_eq!(fs::read(&timeline).unwrap(), &TIMELINE.as_bytes()[..1000]);
        // The writers die: their files are repaired.
        drop(writers);
        assert_eq!(repair(&root).repaired, 2);
        assert!(!system.exists() && !timeline.exists());
    }

    #[test]
    fn a_young_temp_is_left_alone() {
        let (_scratch, root) = tmpdir("young");
        let tmp = root.join("system/.1595455620.algo-1.1.tmp");
        fs::write(&tmp, line(1_595_455_621.5, 1)).unwrap();
        let changed = fs::metadata(&tmp).unwrap().modified().unwrap();
        let min_age = Duration::from_secs(5);
        let report = repair_all(&root, min_age, changed + Duration::from_secs(1));
        assert_eq!(report, RepairReport { young: 1, ..RepairReport::default() });
        assert!(tmp.exists());
        assert_eq!(repair_all(&root, min_age, changed + Duration::from_secs(6)).repaired, 1);
        assert!(!tmp.exists());
    }

    #[test]
    fn other_files_are_not_looked_at() {
        let (_scratch, root) = tmpdir("others");
        let others = [
            ".tmp/0-algo-1/1595455620_1-2/python_stats.tmp",
            ".tmp/.1595455620.algo-1.1.tmp",
            ".trainprof/.1595455620.algo-1.1.tmp",
            "system/1595455620.algo-1.1.tmp",
            "system/.x1595455620.algo-1.1.tmp",
            "system/.1595455620.algo-1.tmp",
            "system/incremental/2020072222/1595455620.algo-1.json",
            "system/incremental/2020072222/.1595455620.algo-1.1.tmp",
            "framework/pevents/2026112203/0-algo-1_pythontimeline.json.tmp",
            "framework/0-algo-1_model_timeline.json.tmp",
            "framework/0-algo-1_pythontimeline.json",
            "framework/0-algo-1_pythontimeline.jsonx.tmp",
            "framework/_pythontimeline.json.tmp",
        ];
        for rel in others {
            fs::create_dir_all(root.join(rel).parent().unwrap()).unwrap();
            fs::write(root.join(rel), "[\n{\"cut").unwrap();
        }
        assert_eq!(repair(&root), RepairReport::default());
        let mut sorted = others.map(str::to_owned).to_vec();
        sorted.sort();
        assert_eq!(crate::commands::run::summary::files_under(&root), sorted);
    }

    #[test]
    fn temp_names() {
        assert_eq!(system_temp(".1595455620.algo-12.345.tmp"), Some(Temp::System));
        assert_eq!(system_temp(".1595455620.algo-1.a.b.tmp"), Some(Temp::System));
        assert_eq!(system_temp(".1595455620.algo-1.tmp"), None);
        assert_eq!(system_temp(".-5.algo-1.2.tmp"), None);
        let node = |n: &str| Some(Temp::Timeline { node: n.to_owned() });
        assert_eq!(timeline_temp("0-algo-1_pythontimeline.json.tmp"), node("0-algo-1"));
        assert_eq!(timeline_temp("0-algo-1_pythontimeline.json.17.tmp"), node("0-algo-1"));
        assert_eq!(timeline_temp("0-algo-1_pythontimeline.json.stale-17.tmp"), node("0-algo-1"));
        assert_eq!(timeline_temp("0-algo-1_pythontimeline.json..tmp"), None);
        assert_eq!(timeline_temp("0-algo-1_pythontimeline.json"), None);
    }
}
