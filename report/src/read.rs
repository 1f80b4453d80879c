//! Reading a LocalPath: system files, timeline files and Python-stats windows (formats in
//! `docs/formats.md`), strictly through `trainprof_output::fs`: no link is followed, every
//! file is opened as a regular file relative to an open folder, and everything is streamed
//! (one line, one event at a time) so that memory does not grow with a file's size.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read as _};

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use trainprof_output::fs::{self as ofs, Dir};

/// A system line longer than this is skipped (ours are < 200 bytes).
const MAX_LINE: u64 = 64 * 1024;
/// A timeline file larger than this is skipped: events are streamed, but one event is held
/// whole, and no writer makes files this large (the hook rotates at 10 MB by default).
pub const MAX_TIMELINE_BYTES: u64 = 1 << 30;
/// Lines of one tick share one Timestamp; SageMaker's rules take lines less than 20 ms
/// apart as one sample, and so do we.
pub const SNAPSHOT_S: f64 = 0.02;

/// What a read leaves out: `0` collects the problems met (a file that could not be opened
/// or parsed, a link left alone); `leave_out` names files (relative paths) not to read, e.g.
/// an earlier job's files in the same LocalPath.
#[derive(Debug, Default)]
pub struct Skipped(pub Vec<String>, pub std::collections::HashSet<String>);

impl Skipped {
    /// Leaves the files `rels` out of every read.
    pub fn leaving_out(rels: std::collections::HashSet<String>) -> Skipped {
        Skipped(Vec::new(), rels)
    }

    pub fn push(&mut self, s: String) {
        // Bounded: a tree full of planted links must not grow the report without end.
        if self.0.len() < 200 {
            self.0.push(s);
        } else if self.0.len() == 200 {
            self.0.push("… more skipped entries not listed".to_owned());
        }
    }
}

/// One tick of one node: the lines of a system file that share a Timestamp. Only the
/// metrics the report uses are kept (`docs/report.md`, "What is read").
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tick {
    pub t_s: f64,
    /// Dimension `CPUUtilization`, by core index (`cpuN`).
    pub cores: Vec<(u32, f64)>,
    /// Dimension `I/OWaitPercentage`, by core index.
    pub core_iowait: Vec<(u32, f64)>,
    /// `host` / `AllCores` / `BusyPercent`.
    pub cpu_total: Option<f64>,
    /// `host` / `AllCores` / `IOWaitPercent`.
    pub iowait_total: Option<f64>,
    /// `MemoryUsedPercent`.
    pub memory: Option<f64>,
    /// `gpuN` → (`GPUUtilization`, `GPUMemoryUtilization`).
    pub gpus: Vec<(String, Option<f64>, Option<f64>)>,
    /// `i/o` bytes per second (whole disks).
    pub io_read: Option<f64>,
    pub io_write: Option<f64>,
    /// Dimension `Algorithm`, bytes per second, summed.
    pub net_rx: Option<f64>,
    pub net_tx: Option<f64>,
    /// `trainer` / `ProcessTree`: CPU (% of one core) and RSS bytes.
    pub trainer_cpu: Option<f64>,
    pub trainer_rss: Option<f64>,
    /// `clock` / `Kernel`: `Synchronised` (1 or 0), `MaxErrorMicros`, `EstimatedErrorMicros`.
    pub clock_synchronised: Option<f64>,
    pub clock_max_error_us: Option<f64>,
    pub clock_est_error_us: Option<f64>,
    /// GPU readings of names past the first `collect::MAX_GPUS_PER_NODE` of this tick, left
    /// out (so that finding a tick's GPU stays O(1) per line; `docs/report.md`, "Caps").
    pub gpus_left_out: u64,
}

impl Tick {
    /// CPU total: the agent's `AllCores` line, else the mean of the cores.
    pub fn cpu_total(&self) -> Option<f64> {
        self.cpu_total.or_else(|| {
            (!self.cores.is_empty())
                .then(|| self.cores.iter().map(|c| c.1).sum::<f64>() / self.cores.len() as f64)
        })
    }

    fn gpu(&mut self, name: &str) -> Option<&mut (String, Option<f64>, Option<f64>)> {
        let i = match self.gpus.iter().position(|g| g.0 == name) {
            Some(i) => i,
            None if self.gpus.len() >= crate::collect::MAX_GPUS_PER_NODE => {
                self.gpus_left_out += 1;
                return None;
            }
            None => {
                self.gpus.push((name.to_owned(), None, None));
                self.gpus.len() - 1
            }
        };
        Some(&mut self.gpus[i])
    }

    /// Takes one line into the tick.
    pub fn add(&mut self, l: &SysLine) {
        let v = l.value;
        let core = || l.name.strip_prefix("cpu").and_then(|n| n.parse::<u32>().ok());
        match (l.ty.as_str(), l.name.as_str(), l.dimension.as_str()) {
            (_, _, "CPUUtilization") => {
                if let Some(c) = core() {
                    self.cores.push((c, v));
                }
            }
            (_, _, "I/OWaitPercentage") => {
                if let Some(c) = core() {
                    self.core_iowait.push((c, v));
                }
            }
            ("host", "AllCores", "BusyPercent") => self.cpu_total = Some(v),
            ("host", "AllCores", "IOWaitPercent") => self.iowait_total = Some(v),
            (_, "MemoryUsedPercent", _) => self.memory = Some(v),
            (_, name, "GPUUtilization") => {
                if let Some(g) = self.gpu(name) {
                    g.1 = Some(v);
                }
            }
            (_, name, "GPUMemoryUtilization") => {
                if let Some(g) = self.gpu(name) {
                    g.2 = Some(v);
                }
            }
            ("i/o", "ReadThroughputInBytesPerSecond", "") => self.io_read = Some(v),
            ("i/o", "WriteThroughputInBytesPerSecond", "") => self.io_write = Some(v),
            (_, "ReceiveBytesPerSecond", "Algorithm") => self.net_rx = Some(self.net_rx.unwrap_or(0.0) + v),
            (_, "TransmitBytesPerSecond", "Algorithm") => self.net_tx = Some(self.net_tx.unwrap_or(0.0) + v),
            ("trainer", "CPUPercent", "ProcessTree") => self.trainer_cpu = Some(v),
            ("trainer", "RSSBytes", "ProcessTree") => self.trainer_rss = Some(v),
            ("clock", "Synchronised", "Kernel") => self.clock_synchronised = Some(v),
            ("clock", "MaxErrorMicros", "Kernel") => self.clock_max_error_us = Some(v),
            ("clock", "EstimatedErrorMicros", "Kernel") => self.clock_est_error_us = Some(v),
            _ => {}
        }
    }
}

/// One line of a system file (`docs/formats.md`, "System files: line format").
#[derive(Debug, Deserialize)]
pub struct SysLine {
    #[serde(rename = "Type")]
    pub ty: String,
    #[serde(rename = "Name", default)]
    pub name: String,
    #[serde(rename = "Dimension")]
    pub dimension: String,
    #[serde(rename = "Value")]
    pub value: f64,
    #[serde(rename = "NodeId")]
    pub node: String,
    #[serde(rename = "Timestamp")]
    pub timestamp: f64,
}

/// Calls `f(line)` for every line of `r` up to `MAX_LINE` bytes (longer ones are skipped
/// whole, never held in memory); `Ok(skipped)`.
fn for_each_line(mut r: impl BufRead, mut f: impl FnMut(&[u8])) -> io::Result<u64> {
    let mut buf = Vec::new();
    let mut skipped = 0;
    loop {
        buf.clear();
        let n = (&mut r).take(MAX_LINE + 1).read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Ok(skipped);
        }
        if buf.last() != Some(&b'\n') && buf.len() as u64 > MAX_LINE {
            r.skip_until(b'\n')?;
            skipped += 1;
            continue;
        }
        f(&buf);
    }
}

/// Files under `top` (relative to `root`) that `want(name)` keeps, sorted by path; links
/// and special files go to `skipped`.
fn files(root: &Dir, top: &str, want: &dyn Fn(&str, bool) -> bool, skipped: &mut Skipped) -> Vec<String> {
    let w = ofs::walk(root, top, want);
    for r in w.refused {
        skipped.push(r);
    }
    w.files.into_iter().map(|(p, _)| p).filter(|p| !skipped.1.contains(p)).collect()
}

fn open(root: &Dir, rel: &str) -> io::Result<File> {
    ofs::open_at(root, rel, false).map(|(_, _, f)| f)
}

/// Every tick of every node under `system/incremental/`, in file-name order (so in time
/// order per node), as `f(node, tick)`.
pub fn system_ticks(root: &Dir, skipped: &mut Skipped, mut f: impl FnMut(&str, Tick)) {
    let want = |name: &str, is_dir: bool| is_dir || (name.ends_with(".json") && !name.starts_with('.'));
    let mut pending: HashMap<String, Tick> = HashMap::new();
    for rel in files(root, "system/incremental", &want, skipped) {
        let file = match open(root, &rel) {
            Ok(f) => f,
            Err(e) => {
                skipped.push(format!("{rel}: {e}"));
                continue;
            }
        };
        let mut bad = 0u64;
        let res = for_each_line(BufReader::new(file), |line| {
            let l: SysLine = match serde_json::from_slice(line) {
                Ok(l) => l,
                Err(_) => {
                    if !line.iter().all(u8::is_ascii_whitespace) {
                        bad += 1;
                    }
                    return;
                }
            };
            if !l.value.is_finite() || !l.timestamp.is_finite() {
                bad += 1;
                return;
            }
            match pending.get_mut(&l.node) {
                Some(t) if (t.t_s - l.timestamp).abs() <= SNAPSHOT_S => t.add(&l),
                Some(t) => {
                    let mut next = Tick { t_s: l.timestamp, ..Tick::default() };
                    next.add(&l);
                    let done = std::mem::replace(t, next);
                    f(&l.node, done);
                }
                None => {
                    let mut t = Tick { t_s: l.timestamp, ..Tick::default() };
                    t.add(&l);
                    pending.insert(l.node.clone(), t);
                }
            }
        });
        match res {
            Ok(long) => bad += long,
            Err(e) => skipped.push(format!("{rel}: {e}")),
        }
        if bad > 0 {
            skipped.push(format!("{rel}: {bad} lines that are not system metrics skipped"));
        }
    }
    let mut rest: Vec<_> = pending.into_iter().collect();
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    for (node, t) in rest {
        f(&node, t);
    }
}

/// One complete event of a timeline, with absolute times.
#[derive(Debug, Clone)]
pub struct Event<'a> {
    /// The timeline node (`<rank>-<host>`).
    pub node: &'a str,
    /// The trace process's name (the phase: `Step:ModeKeys.TRAIN`, `Forward`, …).
    pub phase: &'a str,
    pub name: &'a str,
    /// `X` (complete) or `i`/`I` (instant, `dur_us` 0).
    pub ph: char,
    pub start_us: i64,
    pub dur_us: i64,
    pub step: Option<i64>,
    pub args: &'a serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct RawEvent {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    ph: Option<String>,
    #[serde(default)]
    pid: Option<serde_json::Value>,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(default)]
    dur: Option<f64>,
    #[serde(default)]
    args: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The timeline node of a timeline file name (`<T>_<node>_<kind>timeline.json`).
pub fn timeline_node(file_name: &str) -> Option<&str> {
    let mut parts = file_name.splitn(3, '_');
    let t = parts.next()?;
    let node = parts.next()?;
    let kind = parts.next()?;
    (t.bytes().all(|b| b.is_ascii_digit()) && !node.is_empty() && kind.ends_with("timeline.json"))
        .then_some(node)
}

/// State carried from one file of a node to the next: smdebug reads a file without a base
/// time with the previous file's (`docs/formats.md`, trap T19).
#[derive(Debug, Default)]
pub struct Bases(HashMap<String, i64>);

/// Every event of every timeline file under `framework/pevents/`, file by file in name
/// order, as `f(event)`. `keep_file(node, last_us)` may skip a file by its name (the name is
/// the largest event end in it).
pub fn timeline_events(
    root: &Dir,
    skipped: &mut Skipped,
    keep_file: &dyn Fn(&str, i64) -> bool,
    mut f: impl FnMut(&Event<'_>),
) {
    let want = |name: &str, is_dir: bool| is_dir || timeline_node(name).is_some();
    let mut bases = Bases::default();
    for rel in files(root, "framework/pevents", &want, skipped) {
        let name = rel.rsplit('/').next().unwrap_or(&rel);
        let Some(node) = timeline_node(name) else { continue };
        let last: i64 = name.split('_').next().and_then(|t| t.parse().ok()).unwrap_or(i64::MAX);
        if !keep_file(node, last) {
            continue;
        }
        let file = match open(root, &rel) {
            Ok(f) => f,
            Err(e) => {
                skipped.push(format!("{rel}: {e}"));
                continue;
            }
        };
        match file.metadata() {
            Ok(m) if m.len() > MAX_TIMELINE_BYTES => {
                skipped.push(format!("{rel}: {} bytes, more than a timeline holds: not read", m.len()));
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                skipped.push(format!("{rel}: {e}"));
                continue;
            }
        }
        if let Err(e) = one_timeline(file, node, &mut bases, &mut f) {
            skipped.push(format!("{rel}: {e} (events before the error were read)"));
        }
    }
}

fn one_timeline(
    file: File,
    node: &str,
    bases: &mut Bases,
    f: &mut dyn FnMut(&Event<'_>),
) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_reader(BufReader::new(file));
    let mut st = FileState { node, base: bases.0.get(node).copied(), phases: HashMap::new(), f };
    let r = de.deserialize_seq(Elements(&mut st)).map_err(|e| e.to_string());
    if let Some(b) = st.base {
        bases.0.insert(node.to_owned(), b);
    }
    r
}

struct FileState<'a, 'f> {
    node: &'a str,
    base: Option<i64>,
    /// Trace pid (as JSON text) → the phase's name.
    phases: HashMap<String, String>,
    f: &'f mut dyn FnMut(&Event<'_>),
}

impl FileState<'_, '_> {
    fn take(&mut self, e: RawEvent) {
        let pid = e.pid.as_ref().map(|p| p.to_string()).unwrap_or_default();
        let ph = e.ph.as_deref().unwrap_or("");
        let empty = serde_json::Map::new();
        let args = e.args.as_ref().unwrap_or(&empty);
        match ph {
            "M" if e.name.as_deref() == Some("process_name") => {
                if let Some(b) =
                    args.get("start_time_since_epoch_in_micros").and_then(serde_json::Value::as_i64)
                {
                    self.base = Some(b);
                } else if let Some(n) = args.get("name").and_then(|v| v.as_str()) {
                    self.phases.insert(pid, n.to_owned());
                }
            }
            "X" | "i" | "I" => {
                let (Some(ts), Some(name)) = (e.ts, e.name.as_deref()) else { return };
                let dur = if ph == "X" { e.dur.unwrap_or(-1.0) } else { 0.0 };
                if !ts.is_finite() || !dur.is_finite() || dur < 0.0 {
                    return;
                }
                let base = self.base.unwrap_or(0);
                let step = match args.get("step_num") {
                    Some(serde_json::Value::String(s)) => s.trim().parse().ok(),
                    Some(v) => v.as_i64(),
                    None => None,
                };
                let phase = self.phases.get(&pid).map_or("Unknown", String::as_str);
                let ev = Event {
                    node: self.node,
                    phase,
                    name,
                    ph: if ph == "X" { 'X' } else { 'i' },
                    start_us: base.saturating_add(ts as i64),
                    dur_us: dur as i64,
                    step,
                    args,
                };
                (self.f)(&ev);
            }
            _ => {}
        }
    }
}

/// Visits the top-level array one element at a time.
struct Elements<'s, 'a, 'f>(&'s mut FileState<'a, 'f>);

impl<'de> Visitor<'de> for Elements<'_, '_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(e) = seq.next_element::<Option<RawEvent>>()? {
            if let Some(e) = e {
                self.0.take(e);
            }
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // An object wrapper (`{"traceEvents": [...]}`): smdebug reads zero events; so do we.
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Elements<'_, '_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// A Python-profiling window found on disk.
#[derive(Debug, Clone)]
pub struct StatsFile {
    pub framework: String,
    pub profiler: String,
    pub node: String,
    pub window: String,
    /// Relative path of the stats file to read.
    pub rel: String,
}

/// Every `python_stats` (cProfile) and `python_stats.json` (pyinstrument) under
/// `framework/<fw>/<cprofile|pyinstrument>/<node>/<window>/`.
pub fn stats_files(root: &Dir, skipped: &mut Skipped) -> Vec<StatsFile> {
    let want = |name: &str, is_dir: bool| {
        if is_dir {
            name != "pevents" && name != "detailed_profiling"
        } else {
            name == "python_stats" || name == "python_stats.json"
        }
    };
    let mut out = Vec::new();
    for rel in files(root, "framework", &want, skipped) {
        let parts: Vec<&str> = rel.split('/').collect();
        let [_, fw, prof, node, window, file] = parts.as_slice() else { continue };
        let ok =
            matches!((*prof, *file), ("cprofile", "python_stats") | ("pyinstrument", "python_stats.json"));
        if ok {
            out.push(StatsFile {
                framework: (*fw).to_owned(),
                profiler: (*prof).to_owned(),
                node: (*node).to_owned(),
                window: (*window).to_owned(),
                rel: rel.clone(),
            });
        }
    }
    out
}

/// The bytes of a stats file, at most `max`.
pub fn read_file(root: &Dir, rel: &str, max: u64) -> io::Result<Vec<u8>> {
    let (_, _, f) = ofs::open_at(root, rel, false)?;
    ofs::read_bounded(f, max, std::path::Path::new(rel))
}

/// One half of a window folder name: `<mode>-<step>-<phase>-<time µs>`.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowEdge {
    pub mode: String,
    /// `None` for `*`.
    pub step: Option<i64>,
    pub phase: String,
    pub time_us: f64,
}

/// Parses `<start half>_<end half>` (`docs/formats.md`, "Directory pattern").
pub fn parse_window(name: &str) -> Option<(WindowEdge, WindowEdge)> {
    let (a, b) = name.split_once('_')?;
    Some((edge(a)?, edge(b)?))
}

fn edge(s: &str) -> Option<WindowEdge> {
    let mut p = s.splitn(4, '-');
    let mode = p.next()?.to_owned();
    let step = p.next()?;
    let phase = p.next()?.to_owned();
    let time_us: f64 = p.next()?.parse().ok()?;
    let step = if step == "*" { None } else { Some(step.parse().ok()?) };
    time_us.is_finite().then_some(WindowEdge { mode, step, phase, time_us })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_names_parse() {
        let (a, b) =
            parse_window("train-2-stepstart-1795316597980690.5_train-2-forwardpassend-1795316597980765.2")
                .unwrap();
        assert_eq!(a.step, Some(2));
        assert_eq!(a.phase, "stepstart");
        assert_eq!(b.phase, "forwardpassend");
        assert!((b.time_us - 1795316597980765.2).abs() < 1.0);
        let (a, b) =
            parse_window("prestepzero-*-start-1795316597979670.5_train-0-stepstart-1795316597979794.8")
                .unwrap();
        assert_eq!(a.step, None);
        assert_eq!(b.step, Some(0));
        assert!(parse_window("nonsense").is_none());
    }

    #[test]
    fn timeline_names_give_the_node() {
        assert_eq!(timeline_node("1795316901809988_29945-vm_pythontimeline.json"), Some("29945-vm"));
        assert_eq!(timeline_node("x_29945-vm_pythontimeline.json"), None);
        assert_eq!(timeline_node("1795316901809988_29945-vm_pythontimeline.json.1-1.tmp"), None);
    }

    #[test]
    fn long_lines_are_skipped_not_held() {
        let mut text = vec![b'x'; (MAX_LINE as usize) * 2];
        text.extend_from_slice(b"\nshort\n");
        let mut seen = Vec::new();
        let skipped = for_each_line(&text[..], |l| seen.push(l.to_vec())).unwrap();
        assert_eq!(skipped, 1);
        assert_eq!(seen, vec![b"short\n".to_vec()]);
    }

    #[test]
    fn timeline_streams_events_with_absolute_times() {
        let dir = tempfile::tempdir().unwrap();
        let hour = dir.path().join("framework/pevents/2026112203");
        std::fs::create_dir_all(&hour).unwrap();
        std::fs::write(
            hour.join("1000000000000100_0-algo-1_pythontimeline.json"),
            r#"[
{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1000000000000000}},
{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "Step:ModeKeys.TRAIN"}},
{"name": "Step:ModeKeys.TRAIN", "pid": 2, "ph": "X", "ts": 10, "dur": 90, "args": {"pid": 7, "step_num": "3"}}
]"#,
        )
        .unwrap();
        let root = Dir::open_root(dir.path(), false).unwrap();
        let mut skipped = Skipped::default();
        let mut got = Vec::new();
        timeline_events(&root, &mut skipped, &|_, _| true, |e| {
            got.push((e.node.to_owned(), e.phase.to_owned(), e.start_us, e.dur_us, e.step))
        });
        assert!(skipped.0.is_empty(), "{:?}", skipped.0);
        assert_eq!(
            got,
            vec![("0-algo-1".into(), "Step:ModeKeys.TRAIN".into(), 1000000000000010, 90, Some(3))]
        );
    }

    #[test]
    fn a_linked_timeline_is_refused_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let hour = dir.path().join("framework/pevents/2026112203");
        std::fs::create_dir_all(&hour).unwrap();
        let outside = dir.path().join("secret");
        std::fs::write(&outside, "[]").unwrap();
        std::os::unix::fs::symlink(&outside, hour.join("1000000000000100_0-algo-1_pythontimeline.json"))
            .unwrap();
        let root = Dir::open_root(dir.path(), false).unwrap();
        let mut skipped = Skipped::default();
        let mut n = 0;
        timeline_events(&root, &mut skipped, &|_, _| true, |_| n += 1);
        assert_eq!(n, 0);
        assert_eq!(skipped.0.len(), 1, "{:?}", skipped.0);
        assert!(skipped.0[0].contains("symbolic link"), "{:?}", skipped.0);
    }

    #[test]
    fn system_lines_group_into_ticks_per_node() {
        let dir = tempfile::tempdir().unwrap();
        let hour = dir.path().join("system/incremental/2026112203");
        std::fs::create_dir_all(&hour).unwrap();
        let line = |ty: &str, name: &str, dim: &str, v: f64, node: &str, t: f64| {
            format!(
                "{{\"Type\":\"{ty}\",\"Name\":\"{name}\",\"Dimension\":\"{dim}\",\"Value\":{v},\"NodeId\":\"{node}\",\"Timestamp\":{t}}}\n"
            )
        };
        let mut text = String::new();
        text += &line("cpu", "cpu0", "CPUUtilization", 10.0, "algo-1", 100.0);
        text += &line("cpu", "cpu1", "CPUUtilization", 30.0, "algo-1", 100.0);
        text += &line("gpu", "gpu0", "GPUUtilization", 5.0, "algo-1", 100.0);
        text += &line("memory", "MemoryUsedPercent", "", 40.0, "algo-1", 100.0);
        text += "not json\n";
        text += &line("cpu", "cpu0", "CPUUtilization", 50.0, "algo-1", 100.5);
        std::fs::write(hour.join("0000000100.algo-1.json"), text).unwrap();
        let root = Dir::open_root(dir.path(), false).unwrap();
        let mut skipped = Skipped::default();
        let mut ticks = Vec::new();
        system_ticks(&root, &mut skipped, |n, t| ticks.push((n.to_owned(), t)));
        assert_eq!(ticks.len(), 2);
        assert_eq!(ticks[0].1.cpu_total(), Some(20.0));
        assert_eq!(ticks[0].1.gpus, vec![("gpu0".to_owned(), Some(5.0), None)]);
        assert_eq!(ticks[0].1.memory, Some(40.0));
        assert_eq!(ticks[1].1.cores, vec![(0, 50.0)]);
        assert_eq!(skipped.0.len(), 1);
    }
}
