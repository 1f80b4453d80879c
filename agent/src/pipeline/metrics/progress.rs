//! The trainer's progress for the metrics endpoint (`docs/metrics.md`, "Training progress"):
//! per timeline node (rank) and mode, the last step, steps per second and step-time
//! quantiles, from the step events (`Step:ModeKeys.<MODE>`) of the hook's timeline files.
//!
//! Cheap and bounded, and only on the server thread, at most once per [`REFRESH`] and only
//! when scraped: per node, the open timeline (`framework/<node>_pythontimeline.json.*.tmp`,
//! the newest if a node has several) and its newest sealed one (in the newest hour folder of
//! `framework/pevents/`) are followed: read first as their first [`HEAD_BYTES`] (the base
//! time) and last [`TAIL_BYTES`], then from where the last read stopped (at most
//! [`TAIL_BYTES`]); at most [`MAX_NODES`] nodes. Nothing is followed through a link and
//! nothing but a regular file with one link is read (`trainprof_output::fs`). The figures
//! cover the steps kept: those that ended in the last [`WINDOW_US`] before the newest one.

use std::collections::BTreeMap;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use trainprof_output::fs::{Dir, Kind, meta_of};
use trainprof_output::protocol::timeline::{
    BASE_TIME_KEY, PH_COMPLETE, STEP_NUM_KEY, STEP_PREFIX, step_mode,
};
use trainprof_output::{PYTHON_TIMELINE_SUFFIX, parse_timeline_temp};

/// The files are looked at no more often than this.
pub const REFRESH: Duration = Duration::from_secs(1);
/// Bytes read from the start of a file for its base time.
pub const HEAD_BYTES: u64 = 4096;
/// Bytes read from the end of a file for its step events.
pub const TAIL_BYTES: u64 = 256 * 1024;
/// Timeline nodes followed at most (ranks on one host).
pub const MAX_NODES: usize = 64;
/// The steps the figures cover: those that ended this long before the newest, at most.
pub const WINDOW_US: i64 = 60_000_000;

/// One node's steps of one mode.
#[derive(Debug, Clone, PartialEq)]
pub struct StepStats {
    /// The timeline node id (`<rank>-<host>`).
    pub node: String,
    pub mode: String,
    pub last_step: u64,
    /// End of the last step, epoch seconds.
    pub last_end_s: f64,
    /// Steps per second over the window (`None` with fewer than two steps).
    pub steps_per_second: Option<f64>,
    /// p50, p90, p99 of the steps' durations in the window, seconds.
    pub quantiles: [f64; 3],
    /// Steps in the window and their summed duration, seconds.
    pub count: u64,
    pub sum_s: f64,
}

pub const QUANTILES: [&str; 3] = ["0.5", "0.9", "0.99"];

/// What was read last, and when.
#[derive(Debug)]
pub struct Progress {
    root: PathBuf,
    next_at: Option<Instant>,
    /// Bumped whenever `stats` changed (the rendered exposition is cached against it).
    pub generation: u64,
    pub stats: Vec<StepStats>,
    /// Per timeline node: the files followed and the steps kept.
    nodes: BTreeMap<String, Node>,
}

/// One timeline node's followed files and steps.
#[derive(Debug, Default)]
struct Node {
    /// (dev, ino) → the file's base time and how far it was read (after its last complete
    /// line). Sealing renames a file, so the open file and its sealed self are one entry.
    files: Vec<((u64, u64), Followed)>,
    /// By mode: the steps that ended in the [`WINDOW_US`] before the newest, at most
    /// [`MAX_STEPS`].
    steps: BTreeMap<String, Vec<Step>>,
}

#[derive(Debug, Clone, Copy)]
struct Followed {
    base: i64,
    offset: u64,
}

/// Steps kept per node and mode at most.
pub const MAX_STEPS: usize = 10_000;

/// One step event.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Step {
    step: u64,
    end_us: i64,
    dur_us: i64,
}

impl Progress {
    pub fn new(root: PathBuf) -> Progress {
        Progress { root, next_at: None, generation: 0, stats: Vec::new(), nodes: BTreeMap::new() }
    }

    /// Reads what was appended to the files since the last read, when [`REFRESH`] has passed
    /// since then.
    pub fn refresh(&mut self, now: Instant) {
        if self.next_at.is_some_and(|at| now < at) {
            return;
        }
        self.next_at = Some(now + REFRESH);
        self.follow();
        let mut stats = Vec::new();
        for (node, n) in &self.nodes {
            for (mode, steps) in &n.steps {
                stats.extend(compute(node, mode, steps));
            }
        }
        if stats != self.stats {
            self.stats = stats;
            self.generation += 1;
        }
    }

    /// Reads each node's open file and newest sealed one from where it was left.
    fn follow(&mut self) {
        let Some((framework, open, newest_hour, sealed)) = candidates(&self.root) else {
            self.nodes.clear();
            return;
        };
        let mut names: Vec<&String> = open.keys().chain(sealed.keys()).collect();
        names.sort();
        names.dedup();
        names.truncate(MAX_NODES);
        let mut nodes = BTreeMap::new();
        for name in names {
            let mut node = self.nodes.remove(name).unwrap_or_default();
            let mut files = Vec::new();
            if let (Some(hour), Some(f)) = (&newest_hour, sealed.get(name)) {
                read_steps(hour, f, &node.files, &mut files, &mut node.steps);
            }
            if let Some((f, _)) = open.get(name) {
                read_steps(&framework, f, &node.files, &mut files, &mut node.steps);
            }
            // Only the files still among the candidates are remembered.
            node.files = files;
            for steps in node.steps.values_mut() {
                prune(steps);
            }
            nodes.insert(name.clone(), node);
        }
        self.nodes = nodes;
    }
}

/// The open files by node (the newest of a node's, by mtime) and the newest sealed ones
/// (in the newest hour folder), or `None` without `framework/`.
#[allow(clippy::type_complexity)]
fn candidates(
    root: &std::path::Path,
) -> Option<(Dir, BTreeMap<String, (String, (i64, i64))>, Option<Dir>, BTreeMap<String, String>)> {
    let root = Dir::open_root(root, false).ok()?;
    let framework = root.sub("framework", false).ok()?;
    let mut open: BTreeMap<String, (String, (i64, i64))> = BTreeMap::new();
    for e in framework.entries().unwrap_or_default() {
        let (Ok(name), Kind::File) = (&e.name, e.kind) else { continue };
        let Some(node) = parse_timeline_temp(name) else { continue };
        let Ok(meta) = framework.stat(name) else { continue };
        let newer = open.get(node).is_none_or(|(_, at)| meta.mtime > *at);
        if newer && (open.len() < MAX_NODES || open.contains_key(node)) {
            open.insert(node.to_owned(), (name.clone(), meta.mtime));
        }
    }
    let mut sealed: BTreeMap<String, String> = BTreeMap::new();
    let pevents = framework.sub("pevents", false).ok();
    let newest_hour = pevents.as_ref().and_then(|p| {
        let hours = p.entries().ok()?;
        let h = hours
            .iter()
            .rev()
            .find(|e| e.kind == Kind::Dir && e.name.as_ref().is_ok_and(|n| is_digits(n)))?;
        p.sub(h.name.as_ref().ok()?, false).ok()
    });
    if let Some(hour) = &newest_hour {
        // Sorted by name, so by end time: the last one of a node is its newest.
        for e in hour.entries().unwrap_or_default() {
            let (Ok(name), Kind::File) = (&e.name, e.kind) else { continue };
            let Some(node) = sealed_node(name) else { continue };
            if sealed.len() < MAX_NODES || sealed.contains_key(node) {
                sealed.insert(node.to_owned(), name.clone());
            }
        }
    }
    Some((framework, open, newest_hour, sealed))
}

/// Drops the steps older than [`WINDOW_US`] before the newest, and beyond [`MAX_STEPS`].
fn prune(steps: &mut Vec<Step>) {
    steps.sort_by_key(|s| (s.end_us, s.step));
    steps.dedup();
    let Some(last) = steps.last().copied() else { return };
    let keep_from = steps.partition_point(|s| last.end_us - s.end_us > WINDOW_US);
    let keep_from = keep_from.max(steps.len().saturating_sub(MAX_STEPS));
    steps.drain(..keep_from);
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The node of a sealed timeline's name `<end_us>_<node>_pythontimeline.json`.
fn sealed_node(name: &str) -> Option<&str> {
    let rest = name.strip_suffix(PYTHON_TIMELINE_SUFFIX)?.strip_suffix('_')?;
    let (t, node) = rest.split_once('_')?;
    (is_digits(t) && !node.is_empty()).then_some(node)
}

/// The step events of `dir/name` appended since it was last read (`known`; a file not
/// read before: its head for the base time, and its last [`TAIL_BYTES`]); what was read
/// goes to `files`, the steps to `out` by mode.
fn read_steps(
    dir: &Dir,
    name: &str,
    known: &[((u64, u64), Followed)],
    files: &mut Vec<((u64, u64), Followed)>,
    out: &mut BTreeMap<String, Vec<Step>>,
) {
    let Ok(mut f) = dir.open_regular(name, false) else { return };
    let Ok(meta) = meta_of(&f) else { return };
    if !meta.is_plain_file() || meta.is_mostly_holes() {
        return;
    }
    let id = (meta.dev, meta.ino);
    if files.iter().any(|(i, _)| *i == id) {
        return;
    }
    let followed = match known.iter().find(|(i, _)| *i == id) {
        Some((_, f)) => *f,
        None => {
            let mut head = Vec::new();
            if (&mut f).take(HEAD_BYTES).read_to_end(&mut head).is_err() {
                return;
            }
            let Some(base) = base_time(&head) else { return };
            Followed { base, offset: 0 }
        }
    };
    // Never more than the tail: a file that grew faster is skipped ahead.
    let from = followed.offset.max(meta.len.saturating_sub(TAIL_BYTES)).min(meta.len);
    let mut tail = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_err() || (&mut f).take(TAIL_BYTES).read_to_end(&mut tail).is_err() {
        return;
    }
    // The writer puts `,\n` before each event, so the newest event has no newline after it
    // yet: it is taken when it parses, and read again next time (the steps are deduplicated)
    // from the start of that line. A line cut by a skip ahead is left out.
    let complete = tail.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let cut = from > followed.offset;
    let lines = tail.split(|&b| b == b'\n').skip(usize::from(cut));
    for line in lines {
        if let Some((mode, step)) = step_event(line, followed.base) {
            out.entry(mode).or_default().push(step);
        }
    }
    files.push((id, Followed { base: followed.base, offset: from + complete as u64 }));
}

/// The base time (µs since the epoch) of pid 0's `process_name` line.
fn base_time(head: &[u8]) -> Option<i64> {
    let text = String::from_utf8_lossy(head);
    text.lines().find_map(|l| {
        let v = line_json(l.as_bytes())?;
        v.get("args")?.get(BASE_TIME_KEY)?.as_i64()
    })
}

/// One line of the array as JSON (without its `,`).
fn line_json(line: &[u8]) -> Option<serde_json::Value> {
    let t = line.trim_ascii();
    let t = t.strip_suffix(b",").unwrap_or(t);
    if !t.starts_with(b"{") {
        return None;
    }
    serde_json::from_slice(t).ok()
}

/// A complete step event: its mode and step.
fn step_event(line: &[u8], base: i64) -> Option<(String, Step)> {
    // Cheap filter first: most lines are not steps.
    let prefix = STEP_PREFIX.as_bytes();
    if !line.windows(prefix.len()).any(|w| w == prefix) {
        return None;
    }
    let v = line_json(line)?;
    if v.get("ph")?.as_str()? != PH_COMPLETE {
        return None;
    }
    let mode = step_mode(v.get("name")?.as_str()?)?.to_owned();
    let ts = v.get("ts")?.as_i64()?;
    let dur = v.get("dur")?.as_i64()?;
    let step = v.get("args")?.get(STEP_NUM_KEY).and_then(|s| match s {
        serde_json::Value::String(s) => s.parse().ok(),
        n => n.as_u64(),
    })?;
    Some((mode, Step { step, end_us: base.saturating_add(ts).saturating_add(dur), dur_us: dur.max(0) }))
}

/// The figures of one node's steps of one mode (sorted and pruned by [`prune`]).
fn compute(node: &str, mode: &str, window: &[Step]) -> Option<StepStats> {
    let last = *window.last()?;
    let first = window.first()?;
    let span_s = (last.end_us - first.end_us) as f64 / 1e6;
    let steps_per_second = (window.len() >= 2 && span_s > 0.0).then(|| (window.len() - 1) as f64 / span_s);
    let mut durs: Vec<f64> = window.iter().map(|s| s.dur_us as f64 / 1e6).collect();
    durs.sort_by(f64::total_cmp);
    let q = |p: f64| {
        // Nearest rank.
        let i = ((p * durs.len() as f64).ceil() as usize).clamp(1, durs.len()) - 1;
        durs[i]
    };
    Some(StepStats {
        node: node.to_owned(),
        mode: mode.to_owned(),
        last_step: last.step,
        last_end_s: last.end_us as f64 / 1e6,
        steps_per_second,
        quantiles: [q(0.5), q(0.9), q(0.99)],
        count: durs.len() as u64,
        sum_s: durs.iter().sum(),
    })
}

/// Appends the progress families (after the system rows' families; the same in both formats).
pub fn render(buf: &mut String, node: &str, stats: &[StepStats]) {
    use std::fmt::Write as _;
    if stats.is_empty() {
        return;
    }
    let labels = |buf: &mut String, s: &StepStats| {
        buf.push_str("{node=\"");
        super::exposition::escaped(buf, node);
        buf.push_str("\",timeline=\"");
        super::exposition::escaped(buf, &s.node);
        buf.push('"');
        if let Some((rank, _)) = s.node.split_once('-')
            && is_digits(rank)
        {
            buf.push_str(",rank=\"");
            buf.push_str(rank);
            buf.push('"');
        }
        buf.push_str(",mode=\"");
        super::exposition::escaped(buf, &s.mode);
        buf.push('"');
    };
    let gauge = |buf: &mut String, name: &str, help: &str, value: &dyn Fn(&StepStats) -> Option<f64>| {
        let _ = write!(buf, "# HELP {name} {help}\n# TYPE {name} gauge\n");
        for s in stats {
            if let Some(v) = value(s) {
                buf.push_str(name);
                labels(buf, s);
                let _ = writeln!(buf, "}} {v}");
            }
        }
    };
    gauge(
        buf,
        "trainprof_step_last",
        "The last step the trainer's hook recorded (labels timeline, rank, mode).",
        &|s| Some(s.last_step as f64),
    );
    gauge(
        buf,
        "trainprof_step_last_end_timestamp_seconds",
        "When the last recorded step ended, epoch seconds.",
        &|s| Some(s.last_end_s),
    );
    gauge(
        buf,
        "trainprof_steps_per_second",
        "Steps per second over the steps that ended in the last 60 s before the last one.",
        &|s| s.steps_per_second,
    );
    let name = "trainprof_step_duration_seconds";
    let _ = write!(
        buf,
        "# HELP {name} Step time over the steps that ended in the last 60 s before the last one, seconds.\n# TYPE {name} summary\n"
    );
    for s in stats {
        for (q, v) in QUANTILES.iter().zip(s.quantiles) {
            buf.push_str(name);
            labels(buf, s);
            let _ = writeln!(buf, ",quantile=\"{q}\"}} {v}");
        }
        let _ = write!(buf, "{name}_sum");
        labels(buf, s);
        let _ = writeln!(buf, "}} {}", s.sum_s);
        let _ = write!(buf, "{name}_count");
        labels(buf, s);
        let _ = writeln!(buf, "}} {}", s.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: i64 = 1_795_316_901_000_000;

    fn timeline(steps: impl Iterator<Item = (u64, i64, i64)>, mode: &str) -> String {
        let mut s = format!(
            "[\n{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {{\"start_time_since_epoch_in_micros\": {B}}}}},\n{{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": 0, \"args\": {{\"sort_index\": 0}}}}"
        );
        for (step, ts, dur) in steps {
            s.push_str(&format!(",\n{{\"name\": \"Net\", \"pid\": 1, \"ph\": \"X\", \"ts\": {ts}, \"dur\": 10, \"args\": {{\"pid\": 7, \"step_num\": \"{step}\"}}}}"));
            s.push_str(&format!(",\n{{\"name\": \"Step:ModeKeys.{mode}\", \"pid\": 2, \"ph\": \"X\", \"ts\": {ts}, \"dur\": {dur}, \"args\": {{\"pid\": 7, \"step_num\": \"{step}\"}}}}"));
        }
        s
    }

    #[test]
    fn the_open_and_the_newest_sealed_timeline_give_each_ranks_progress() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let hour = root.join("framework/pevents/2026112203");
        std::fs::create_dir_all(&hour).unwrap();
        // Rank 0: steps 0..=99 sealed (100 ms each, 10 a second), 100..=149 open (200 ms).
        let sealed = timeline((0..100).map(|k| (k, k as i64 * 100_000, 100_000)), "TRAIN") + "\n]";
        std::fs::write(hour.join(format!("{}_0-algo-1_pythontimeline.json", B + 10_000_000)), sealed)
            .unwrap();
        // An older sealed file of the same rank is not read.
        std::fs::write(hour.join(format!("{}_0-algo-1_pythontimeline.json", B)), "garbage").unwrap();
        let open =
            timeline((100..150).map(|k| (k, 10_000_000 + (k as i64 - 100) * 200_000, 200_000)), "TRAIN");
        std::fs::write(root.join("framework/0-algo-1_pythontimeline.json.7-3.tmp"), open).unwrap();
        // Rank 1: only an open file, EVAL steps.
        let eval = timeline((0..3).map(|k| (k, k as i64 * 1_000_000, 500_000)), "EVAL");
        std::fs::write(root.join("framework/1-algo-1_pythontimeline.json.8-1.tmp"), eval).unwrap();
        // Not a timeline.
        std::fs::write(root.join("framework/notes.tmp"), "x").unwrap();
        let mut p = Progress::new(root.to_owned());
        let t0 = Instant::now();
        p.refresh(t0);
        assert_eq!(p.generation, 1);
        assert_eq!(p.stats.len(), 2, "{:?}", p.stats);
        let r0 = &p.stats[0];
        assert_eq!((r0.node.as_str(), r0.mode.as_str(), r0.last_step), ("0-algo-1", "TRAIN", 149));
        assert_eq!(r0.last_end_s, (B + 10_000_000 + 49 * 200_000 + 200_000) as f64 / 1e6);
        assert_eq!(r0.count, 150);
        // 149 steps over 19.9 s: 10 + 5 per second.
        let sps = r0.steps_per_second.unwrap();
        assert!((sps - 149.0 / 19.9).abs() < 1e-9, "{sps}");
        assert_eq!(r0.quantiles, [0.1, 0.2, 0.2]);
        let r1 = &p.stats[1];
        assert_eq!((r1.node.as_str(), r1.mode.as_str(), r1.last_step, r1.count), ("1-algo-1", "EVAL", 2, 3));
        assert!((r1.steps_per_second.unwrap() - 1.0).abs() < 1e-9);
        // Not again within REFRESH.
        std::fs::remove_dir_all(root.join("framework")).unwrap();
        p.refresh(t0 + Duration::from_millis(10));
        assert_eq!(p.stats.len(), 2);
        p.refresh(t0 + REFRESH);
        assert!(p.stats.is_empty());
        assert_eq!(p.generation, 2);
    }

    #[test]
    fn appended_steps_are_read_from_where_the_last_read_stopped_across_a_seal() {
        use std::io::Write as _;
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("framework")).unwrap();
        let tmp = root.join("framework/0-h_pythontimeline.json.1-1.tmp");
        std::fs::write(&tmp, timeline((0..10).map(|k| (k, k as i64 * 100_000, 100_000)), "TRAIN")).unwrap();
        let mut p = Progress::new(root.to_owned());
        let t0 = Instant::now();
        p.refresh(t0);
        assert_eq!((p.stats[0].last_step, p.stats[0].count), (9, 10));
        // Ten more steps, the last one half written.
        let more = timeline((10..20).map(|k| (k, k as i64 * 100_000, 100_000)), "TRAIN");
        let events = &more[more.find(",\n{\"name\": \"Net\"").unwrap()..];
        let mut f = std::fs::OpenOptions::new().append(true).open(&tmp).unwrap();
        f.write_all(&events.as_bytes()[..events.len() - 20]).unwrap();
        p.refresh(t0 + REFRESH);
        assert_eq!((p.stats[0].last_step, p.stats[0].count), (18, 19), "{:?}", p.stats);
        f.write_all(&events.as_bytes()[events.len() - 20..]).unwrap();
        f.write_all(b"\n]").unwrap();
        drop(f);
        // Sealed: the same file under its final name; a new open file goes on.
        let hour = root.join("framework/pevents/2026112203");
        std::fs::create_dir_all(&hour).unwrap();
        std::fs::rename(&tmp, hour.join(format!("{}_0-h_pythontimeline.json", B + 2_000_000))).unwrap();
        let next = timeline((20..25).map(|k| (k, k as i64 * 100_000, 100_000)), "TRAIN");
        std::fs::write(root.join("framework/0-h_pythontimeline.json.1-2.tmp"), next).unwrap();
        p.refresh(t0 + 2 * REFRESH);
        assert_eq!((p.stats[0].last_step, p.stats[0].count), (24, 25), "{:?}", p.stats);
        assert!((p.stats[0].steps_per_second.unwrap() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn a_long_file_is_read_by_its_tail_and_a_link_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("framework")).unwrap();
        // 20,000 steps: far more than the tail holds.
        let t = timeline((0..20_000).map(|k| (k, k as i64 * 1000, 1000)), "TRAIN");
        assert!(t.len() as u64 > 4 * TAIL_BYTES);
        std::fs::write(root.join("framework/0-h_pythontimeline.json.1-1.tmp"), t).unwrap();
        std::fs::write(root.join("elsewhere"), timeline(std::iter::once((5, 0, 1)), "TRAIN")).unwrap();
        std::os::unix::fs::symlink(
            root.join("elsewhere"),
            root.join("framework/1-h_pythontimeline.json.1-1.tmp"),
        )
        .unwrap();
        let mut p = Progress::new(root.to_owned());
        p.refresh(Instant::now());
        assert_eq!(p.stats.len(), 1, "{:?}", p.stats);
        assert_eq!(p.stats[0].last_step, 19_999);
        assert!(p.stats[0].count < 2000, "{}", p.stats[0].count);
        assert!((p.stats[0].steps_per_second.unwrap() - 1000.0).abs() < 1e-6);
    }
}
