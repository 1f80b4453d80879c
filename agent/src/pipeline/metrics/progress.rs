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
//!
//! Whatever the timelines hold, what is kept is bounded (`docs/metrics.md`, "Labels and
//! caps"), with the report's caps and checks ([`timeline_event`], the decoder the report
//! reads events with): at most [`MAX_MODES`] modes a node, a mode name or node id of
//! at most [`MAX_NAME_BYTES`] bytes, a mode dropped once it has no step in the window, at most
//! [`MAX_STEPS`] steps a node; a step's start and end within 2000–2100 and its step number an
//! integer. What was left out is counted ([`LeftOut`]) and served.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use trainprof_output::fs::{Dir, Kind, meta_of};
use trainprof_output::protocol::timeline::{PH_COMPLETE, STEP_PREFIX, step_mode};
use trainprof_output::protocol::timeline_event::{self, BadTime};
use trainprof_output::{PYTHON_TIMELINE_SUFFIX, parse_timeline_temp};

/// The files are looked at no more often than this.
pub const REFRESH: Duration = Duration::from_secs(1);
/// Bytes read from the start of a file for its base time.
pub const HEAD_BYTES: u64 = 4096;
/// Bytes read from the end of a file for its step events.
pub const TAIL_BYTES: u64 = 256 * 1024;
/// Timeline nodes followed at most (ranks on one host).
pub const MAX_NODES: usize = 64;
/// Step modes kept per node at most: the report's cap on modes.
pub const MAX_MODES: usize = timeline_event::MAX_MODES;
/// Longest mode name or timeline node id kept, in bytes: the report's cap on a name.
pub const MAX_NAME_BYTES: usize = timeline_event::MAX_NAME_BYTES;
/// The steps the figures cover: those that ended this long before the newest, at most.
pub const WINDOW_US: i64 = 60_000_000;

/// One node's steps of one mode.
#[derive(Debug, Clone, PartialEq)]
pub struct StepStats {
    /// The timeline node id (`<rank>-<host>`).
    pub node: String,
    pub mode: String,
    pub last_step: i64,
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
    /// What was left out since the endpoint first looked.
    pub left_out: LeftOut,
    /// Per timeline node: the files followed and the steps kept.
    nodes: BTreeMap<String, Node>,
}

/// What the bounds left out (`docs/metrics.md`, "Labels and caps"): step events since the
/// endpoint first looked, each counted once (a line is counted when complete), and the
/// timelines not followed at the last read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LeftOut {
    /// Step events of a mode past a node's [`MAX_MODES`].
    pub modes: u64,
    /// Step events whose mode name is longer than [`MAX_NAME_BYTES`] or holds a control
    /// character.
    pub names: u64,
    /// Step events whose time or duration is not a number, whose duration is negative, or
    /// that start or end outside 2000–2100 (the report's plausible times).
    pub times: u64,
    /// Step events whose step number is not an integer (`i64`).
    pub steps: u64,
    /// Timeline nodes not followed at the last read: past [`MAX_NODES`], or a node id longer
    /// than [`MAX_NAME_BYTES`] (a gauge, not a count).
    pub timelines: u64,
}

impl LeftOut {
    /// The event counts by `reason` label.
    pub fn events(&self) -> [(&'static str, u64); 4] {
        [("modes", self.modes), ("names", self.names), ("times", self.times), ("steps", self.steps)]
    }
}

/// Why a step event was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reject {
    Name,
    Time,
    StepNumber,
}

/// One timeline node's followed files and steps.
#[derive(Debug, Default)]
struct Node {
    /// (dev, ino) → the file's base time and how far it was read (after its last complete
    /// line). Sealing renames a file, so the open file and its sealed self are one entry.
    files: Vec<((u64, u64), Followed)>,
    /// By mode (at most [`MAX_MODES`]): the steps that ended in the [`WINDOW_US`] before the
    /// newest, at most [`MAX_STEPS`] in all.
    steps: BTreeMap<String, Mode>,
}

/// One mode's steps of one node.
#[derive(Debug, Default)]
struct Mode {
    steps: Vec<Step>,
    /// The latest end among `steps`.
    newest_end_us: i64,
}

impl Node {
    /// Keeps `step` of `mode`. A mode not kept yet joins while the node has fewer than
    /// [`MAX_MODES`], or takes the place of the mode whose newest step ended longest ago when
    /// that was more than [`WINDOW_US`] before this step's end; otherwise the step is left
    /// out (counted when `count`).
    fn push(&mut self, mode: &str, step: Step, left_out: &mut LeftOut, count: bool) {
        if !self.steps.contains_key(mode) && self.steps.len() >= MAX_MODES {
            let stale = self
                .steps
                .iter()
                .min_by_key(|(_, m)| m.newest_end_us)
                .filter(|(_, m)| step.end_us - m.newest_end_us > WINDOW_US)
                .map(|(name, _)| name.clone());
            match stale {
                Some(name) => {
                    self.steps.remove(&name);
                }
                None => {
                    left_out.modes += u64::from(count);
                    return;
                }
            }
        }
        let m = self
            .steps
            .entry(mode.to_owned())
            .or_insert_with(|| Mode { steps: Vec::new(), newest_end_us: i64::MIN });
        m.newest_end_us = m.newest_end_us.max(step.end_us);
        m.steps.push(step);
    }

    /// Drops the modes without a step in the [`WINDOW_US`] before the node's newest, each
    /// mode's steps older than [`WINDOW_US`] before its newest, and the oldest steps beyond
    /// [`MAX_STEPS`] in all.
    fn prune(&mut self) {
        let Some(newest) = self.steps.values().map(|m| m.newest_end_us).max() else { return };
        self.steps.retain(|_, m| newest - m.newest_end_us <= WINDOW_US);
        for m in self.steps.values_mut() {
            prune(&mut m.steps);
        }
        let total: usize = self.steps.values().map(|m| m.steps.len()).sum();
        if total > MAX_STEPS {
            // The end time at which the oldest `total - MAX_STEPS` stop.
            let mut ends: Vec<i64> =
                self.steps.values().flat_map(|m| m.steps.iter().map(|s| s.end_us)).collect();
            let (_, &mut cutoff, _) = ends.select_nth_unstable(total - MAX_STEPS);
            let mut excess = total - MAX_STEPS;
            for m in self.steps.values_mut() {
                // Sorted by end: the older ones first.
                let n = m.steps.partition_point(|s| s.end_us < cutoff).min(excess);
                m.steps.drain(..n);
                excess -= n;
            }
            for m in self.steps.values_mut() {
                let n = m.steps.partition_point(|s| s.end_us <= cutoff).min(excess);
                m.steps.drain(..n);
                excess -= n;
            }
            self.steps.retain(|_, m| !m.steps.is_empty());
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Followed {
    base: i64,
    offset: u64,
}

/// Steps kept per node at most, all its modes together.
pub const MAX_STEPS: usize = 10_000;

/// One step event.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Step {
    step: i64,
    end_us: i64,
    dur_us: i64,
}

impl Progress {
    pub fn new(root: PathBuf) -> Progress {
        Progress {
            root,
            next_at: None,
            generation: 0,
            stats: Vec::new(),
            left_out: LeftOut::default(),
            nodes: BTreeMap::new(),
        }
    }

    /// Reads what was appended to the files since the last read, when [`REFRESH`] has passed
    /// since then.
    pub fn refresh(&mut self, now: Instant) {
        if self.next_at.is_some_and(|at| now < at) {
            return;
        }
        self.next_at = Some(now + REFRESH);
        let left_out = self.left_out;
        self.follow();
        let mut stats = Vec::new();
        for (node, n) in &self.nodes {
            for (mode, m) in &n.steps {
                stats.extend(compute(node, mode, &m.steps));
            }
        }
        if stats != self.stats || left_out != self.left_out {
            self.stats = stats;
            self.generation += 1;
        }
    }

    /// Reads each node's open file and newest sealed one from where it was left.
    fn follow(&mut self) {
        let Some(Candidates { framework, open, newest_hour, sealed, left_out, skipped }) =
            candidates(&self.root)
        else {
            self.nodes.clear();
            self.left_out.timelines = 0;
            return;
        };
        let mut names: Vec<&String> = open.keys().chain(sealed.keys()).collect();
        names.sort();
        names.dedup();
        names.truncate(MAX_NODES);
        // Every node seen, less those followed.
        let seen = skipped.iter().filter(|n| !open.contains_key(*n) && !sealed.contains_key(*n)).count()
            + open.keys().chain(sealed.keys()).collect::<BTreeSet<_>>().len();
        self.left_out.timelines = left_out.saturating_add((seen - names.len()) as u64);
        let mut nodes = BTreeMap::new();
        for name in names {
            let mut node = self.nodes.remove(name).unwrap_or_default();
            let known = std::mem::take(&mut node.files);
            if let (Some(hour), Some(f)) = (&newest_hour, sealed.get(name)) {
                read_steps(hour, f, &known, &mut node, &mut self.left_out);
            }
            if let Some((f, _)) = open.get(name) {
                read_steps(&framework, f, &known, &mut node, &mut self.left_out);
            }
            // Only the files still among the candidates are remembered (`read_steps` put them
            // back into `node.files`).
            node.prune();
            nodes.insert(name.clone(), node);
        }
        self.nodes = nodes;
    }
}

/// The files to follow, by node.
struct Candidates {
    framework: Dir,
    /// The open file of each node (the newest of a node's, by mtime) and its mtime.
    open: BTreeMap<String, (String, (i64, i64))>,
    /// The newest hour folder of `framework/pevents/`, and the newest sealed file of each
    /// node in it.
    newest_hour: Option<Dir>,
    sealed: BTreeMap<String, String>,
    /// Timeline files whose node id is longer than [`MAX_NAME_BYTES`] (a file name's 255
    /// bytes leave at most 227 for it: a bound kept in case a file system allows more).
    left_out: u64,
    /// Nodes seen past [`MAX_NODES`] (no more of them than directory entries read).
    skipped: BTreeSet<String>,
}

/// The files to follow, or `None` without `framework/`.
fn candidates(root: &std::path::Path) -> Option<Candidates> {
    let root = Dir::open_root(root, false).ok()?;
    let framework = root.sub("framework", false).ok()?;
    let mut left_out = 0;
    let mut skipped = BTreeSet::new();
    let mut open: BTreeMap<String, (String, (i64, i64))> = BTreeMap::new();
    for e in framework.entries().unwrap_or_default() {
        let (Ok(name), Kind::File) = (&e.name, e.kind) else { continue };
        let Some(node) = parse_timeline_temp(name) else { continue };
        if node.len() > MAX_NAME_BYTES {
            left_out += 1;
            continue;
        }
        let Ok(meta) = framework.stat(name) else { continue };
        let newer = open.get(node).is_none_or(|(_, at)| meta.mtime > *at);
        if open.len() < MAX_NODES || open.contains_key(node) {
            if newer {
                open.insert(node.to_owned(), (name.clone(), meta.mtime));
            }
        } else if !skipped.contains(node) {
            skipped.insert(node.to_owned());
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
            if node.len() > MAX_NAME_BYTES {
                left_out += 1;
                continue;
            }
            if sealed.len() < MAX_NODES || sealed.contains_key(node) {
                sealed.insert(node.to_owned(), name.clone());
            } else if !skipped.contains(node) {
                skipped.insert(node.to_owned());
            }
        }
    }
    Some(Candidates { framework, open, newest_hour, sealed, left_out, skipped })
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
/// goes to `node.files`, the steps to `node` by mode, what was left out to `left_out`.
fn read_steps(
    dir: &Dir,
    name: &str,
    known: &[((u64, u64), Followed)],
    node: &mut Node,
    left_out: &mut LeftOut,
) {
    let Ok(mut f) = dir.open_regular(name, false) else { return };
    let Ok(meta) = meta_of(&f) else { return };
    if !meta.is_plain_file() || meta.is_mostly_holes() {
        return;
    }
    let id = (meta.dev, meta.ino);
    if node.files.iter().any(|(i, _)| *i == id) {
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
    // A line left out is counted only when complete (a newline after it), so once: an
    // incomplete one is read again.
    let complete = tail.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let cut = from > followed.offset;
    let mut at = 0;
    for (k, line) in tail.split(|&b| b == b'\n').enumerate() {
        let count = at + line.len() < complete;
        at += line.len() + 1;
        if k == 0 && cut {
            continue;
        }
        match step_event(line, followed.base) {
            Some(Ok((mode, step))) => node.push(&mode, step, left_out, count),
            Some(Err(why)) if count => match why {
                Reject::Name => left_out.names += 1,
                Reject::Time => left_out.times += 1,
                Reject::StepNumber => left_out.steps += 1,
            },
            _ => {}
        }
    }
    node.files.push((id, Followed { base: followed.base, offset: from + complete as u64 }));
}

/// The base time (µs since the epoch) of pid 0's `process_name` line.
fn base_time(head: &[u8]) -> Option<i64> {
    let text = String::from_utf8_lossy(head);
    text.lines().find_map(|l| timeline_event::line(l.as_bytes())?.base_time())
}

/// A complete step event: its mode and step, or why it is left out; `None` for a line that
/// is not a step event. Decoded and checked as the report decodes an event
/// ([`timeline_event`]): `ts` and `dur` numbers, `dur` not negative, its start and end
/// plausible times, `step_num` an integer (a string of one, or a number).
fn step_event(line: &[u8], base: i64) -> Option<Result<(String, Step), Reject>> {
    // Cheap filter first: most lines are not steps.
    let prefix = STEP_PREFIX.as_bytes();
    if !line.windows(prefix.len()).any(|w| w == prefix) {
        return None;
    }
    let Some(e) = timeline_event::line(line) else { return mistyped(line).map(Err) };
    if e.ph() != PH_COMPLETE {
        return None;
    }
    let mode = step_mode(e.name.as_deref()?)?;
    if mode.len() > MAX_NAME_BYTES || mode.chars().any(char::is_control) {
        return Some(Err(Reject::Name));
    }
    let (start_us, dur_us) = match e.times(base) {
        Ok(t) => t,
        Err(BadTime::Invalid | BadTime::Implausible) => return Some(Err(Reject::Time)),
    };
    let end_us = start_us.saturating_add(dur_us);
    let Some(step) = e.step() else { return Some(Err(Reject::StepNumber)) };
    Some(Ok((mode.to_owned(), Step { step, end_us, dur_us })))
}

/// Why a step event that the decoder does not take (a field of the wrong type: `"ts":
/// "NaN"`, `"args": 5`) is left out, so that it is counted: its name, else a time that is not
/// a number, else its step number; `None` for a line that is no complete step event.
fn mistyped(line: &[u8]) -> Option<Reject> {
    let t = line.trim_ascii();
    let v: serde_json::Value = serde_json::from_slice(t.strip_suffix(b",").unwrap_or(t)).ok()?;
    let field = |k: &str| v.get(k);
    if field("ph")?.as_str()? != PH_COMPLETE {
        return None;
    }
    let mode = step_mode(field("name")?.as_str()?)?;
    if mode.len() > MAX_NAME_BYTES || mode.chars().any(char::is_control) {
        return Some(Reject::Name);
    }
    let number = |k: &str| field(k).is_some_and(serde_json::Value::is_number);
    Some(if number("ts") && number("dur") { Reject::StepNumber } else { Reject::Time })
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

/// Appends the progress families (after the system rows' families; the same in both
/// formats but for the counter's `TYPE` line), and what was left out once anything was.
pub fn render(buf: &mut String, format: super::format::Format, node: &str, progress: &Progress) {
    use std::fmt::Write as _;
    let stats = &progress.stats[..];
    let left_out = progress.left_out;
    if left_out != LeftOut::default() {
        let name = "trainprof_step_events_left_out";
        let typed = if format == super::format::Format::Text { "_total" } else { "" };
        let _ = write!(
            buf,
            "# HELP {name}{typed} Step events of the trainer's timelines left out by the endpoint's bounds since it first looked (reason: modes, names, times, steps).\n# TYPE {name}{typed} counter\n"
        );
        for (reason, n) in left_out.events() {
            buf.push_str(name);
            buf.push_str("_total{node=\"");
            super::format::escaped(buf, node);
            let _ = writeln!(buf, "\",reason=\"{reason}\"}} {n}");
        }
        let name = "trainprof_step_timelines_left_out";
        let _ = write!(
            buf,
            "# HELP {name} Timelines not followed at the last read (past 64 nodes, or a node id over 256 bytes).\n# TYPE {name} gauge\n{name}{{node=\""
        );
        super::format::escaped(buf, node);
        let _ = writeln!(buf, "\"}} {}", left_out.timelines);
    }
    if stats.is_empty() {
        return;
    }
    let labels = |buf: &mut String, s: &StepStats| {
        buf.push_str("{node=\"");
        super::format::escaped(buf, node);
        buf.push_str("\",timeline=\"");
        super::format::escaped(buf, &s.node);
        buf.push('"');
        if let Some((rank, _)) = s.node.split_once('-')
            && is_digits(rank)
        {
            buf.push_str(",rank=\"");
            buf.push_str(rank);
            buf.push('"');
        }
        buf.push_str(",mode=\"");
        super::format::escaped(buf, &s.mode);
        buf.push('"');
    };
    let gauge = |buf: &mut String, name: &str, help: &str, value: &dyn Fn(&StepStats) -> Option<Value>| {
        let _ = write!(buf, "# HELP {name} {help}\n# TYPE {name} gauge\n");
        for s in stats {
            if let Some(v) = value(s) {
                buf.push_str(name);
                labels(buf, s);
                let _ = match v {
                    Value::Int(v) => writeln!(buf, "}} {v}"),
                    Value::Float(v) => writeln!(buf, "}} {v}"),
                };
            }
        }
    };
    gauge(
        buf,
        "trainprof_step_last",
        "The last step the trainer's hook recorded (labels timeline, rank, mode).",
        // Exact as an integer (a double would round a step past 2⁵³).
        &|s| Some(Value::Int(s.last_step)),
    );
    gauge(
        buf,
        "trainprof_step_last_end_timestamp_seconds",
        "When the last recorded step ended, epoch seconds.",
        &|s| Some(Value::Float(s.last_end_s)),
    );
    gauge(
        buf,
        "trainprof_steps_per_second",
        "Steps per second over the steps that ended in the last 60 s before the last one.",
        &|s| s.steps_per_second.map(Value::Float),
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

/// A sample's value as written.
enum Value {
    Int(i64),
    Float(f64),
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

    /// The head of a timeline and step events of any mode, step and times (JSON text as given).
    fn hostile(events: &[(String, &str, &str, &str)]) -> String {
        let mut s = format!(
            "[\n{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {{\"start_time_since_epoch_in_micros\": {B}}}}}"
        );
        for (mode, step, ts, dur) in events {
            s.push_str(&format!(",\n{{\"name\": \"Step:ModeKeys.{mode}\", \"pid\": 2, \"ph\": \"X\", \"ts\": {ts}, \"dur\": {dur}, \"args\": {{\"step_num\": {step}}}}}"));
        }
        s
    }

    fn ev(
        mode: impl Into<String>,
        step: &'static str,
        ts: i64,
    ) -> (String, &'static str, &'static str, &'static str) {
        (mode.into(), step, Box::leak(ts.to_string().into_boxed_str()), "1000")
    }

    #[test]
    fn a_hostile_timeline_keeps_modes_names_and_steps_bounded_and_what_was_left_out_is_counted() {
        use std::io::Write as _;
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("framework")).unwrap();
        let path = root.join("framework/0-h_pythontimeline.json.1-1.tmp");
        let mut events = Vec::new();
        // 500 modes, each new, a millisecond apart: 16 kept, 484 left out.
        for k in 0..500 {
            events.push(ev(format!("M{k}"), "\"1\"", k * 1000));
        }
        // Names: too long, or with a control character (escaped in the JSON).
        events.push(ev("x".repeat(MAX_NAME_BYTES + 1), "\"1\"", 600_000));
        events.push(ev("EV\\u001bAL", "\"1\"", 600_000));
        // Times: not numbers, huge, negative, before 2000 or after 2100, a negative duration.
        for (ts, dur) in [
            ("\"NaN\"", "1000"),
            ("1e308", "1000"),
            ("-1e18", "1000"),
            ("-1795316901000000", "1000"),
            ("4000000000000000", "1000"),
            ("1000", "-5"),
            ("1000", "1e300"),
            ("1000", "null"),
        ] {
            events.push(("M0".into(), "\"2\"", ts, dur));
        }
        // Step numbers: not integers, too large for one, absent.
        for step in ["\"NaN\"", "\"1e308\"", "\"99999999999999999999999\"", "1.5", "\"x\"", "null"] {
            events.push(("M1".into(), step, "2000", "1000"));
        }
        // Kept as the report keeps them: a negative step and the largest integer.
        events.push(ev("M2", "\"-5\"", 500_000));
        events.push(ev("M3", "9223372036854775807", 500_000));
        // The last line has no newline after it yet (still being written): taken, not counted.
        events.push(ev("M999", "\"1\"", 500_000));
        std::fs::write(&path, hostile(&events)).unwrap();
        let mut p = Progress::new(root.to_owned());
        let t0 = Instant::now();
        p.refresh(t0);
        assert_eq!(p.stats.len(), MAX_MODES, "{:?}", p.stats.iter().map(|s| &s.mode).collect::<Vec<_>>());
        let want = LeftOut { modes: 500 - 16, names: 2, times: 8, steps: 6, timelines: 0 };
        assert_eq!(p.left_out, want);
        let m2 = p.stats.iter().find(|s| s.mode == "M2").unwrap();
        let m3 = p.stats.iter().find(|s| s.mode == "M3").unwrap();
        assert_eq!((m2.last_step, m3.last_step), (-5, i64::MAX));
        let end = |s: &StepStats| s.last_end_s;
        assert!(
            p.stats.iter().all(|s| (B as f64 / 1e6..B as f64 / 1e6 + 1.0).contains(&end(s))),
            "{:?}",
            p.stats
        );
        // Read again: the incomplete line is not counted twice; a generation only for a change.
        let generation = p.generation;
        p.refresh(t0 + REFRESH);
        assert_eq!((p.left_out, p.generation), (want, generation));
        // 2 minutes later, 20 more new modes: the modes without a step in the window are
        // dropped, the new ones take their places (16 of them), the 4 others are left out.
        let later: Vec<_> = (0..20).map(|k| ev(format!("N{k}"), "\"7\"", 120_000_000 + k * 1000)).collect();
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(hostile(&later).split_once("}}").unwrap().1.as_bytes()).unwrap();
        f.write_all(b"\n]").unwrap();
        drop(f);
        p.refresh(t0 + 2 * REFRESH);
        let modes: Vec<_> = p.stats.iter().map(|s| s.mode.as_str()).collect();
        assert_eq!(modes.len(), MAX_MODES);
        assert!(modes.iter().all(|m| m.starts_with('N')), "{modes:?}");
        // M999's line was completed by the append: read again, complete, and counted now (its
        // step 0.5 s after M0's: M0 was not stale yet).
        assert_eq!(p.left_out, LeftOut { modes: want.modes + 1 + 4, ..want });
        // Served: the counts by reason, both formats' TYPE lines.
        let mut text = String::new();
        render(&mut text, super::super::format::Format::Text, "algo-1", &p);
        assert!(text.contains("# TYPE trainprof_step_events_left_out_total counter\n"), "{text}");
        assert!(
            text.contains("trainprof_step_events_left_out_total{node=\"algo-1\",reason=\"modes\"} 489\n"),
            "{text}"
        );
        assert!(text.contains("trainprof_step_events_left_out_total{node=\"algo-1\",reason=\"times\"} 8\n"));
        assert!(text.contains("trainprof_step_timelines_left_out{node=\"algo-1\"} 0\n"));
        let mut om = String::new();
        render(&mut om, super::super::format::Format::OpenMetrics, "algo-1", &p);
        assert!(om.contains("# TYPE trainprof_step_events_left_out counter\n"), "{om}");
    }

    #[test]
    fn a_node_keeps_at_most_max_steps_in_all_its_modes_the_newest() {
        let mut n = Node::default();
        let mut left_out = LeftOut::default();
        // 16 modes × 1,000 steps, all within the window: 16,000 steps.
        for k in 0..16_000_i64 {
            let step = Step { step: k, end_us: B + k * 1000, dur_us: 10 };
            n.push(&format!("M{}", k % 16), step, &mut left_out, true);
        }
        n.prune();
        let kept: Vec<&Step> = n.steps.values().flat_map(|m| &m.steps).collect();
        assert_eq!(kept.len(), MAX_STEPS);
        assert!(kept.iter().all(|s| s.step >= 6_000), "the oldest go first");
        assert_eq!(left_out, LeftOut::default());
    }

    #[test]
    fn timelines_past_the_nodes_cap_are_counted() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        let hour = root.join("framework/pevents/2026112203");
        std::fs::create_dir_all(&hour).unwrap();
        let one = timeline(std::iter::once((1, 0, 1000)), "TRAIN");
        // Open files of nodes 0..=66, sealed ones of 60..=69 (two each): 70 nodes.
        for r in 0..MAX_NODES + 3 {
            std::fs::write(root.join(format!("framework/{r:02}-h_pythontimeline.json.1-1.tmp")), &one)
                .unwrap();
        }
        for r in 60..70 {
            for t in [B, B + 1] {
                std::fs::write(hour.join(format!("{t}_{r:02}-h_pythontimeline.json")), &one).unwrap();
            }
        }
        let mut p = Progress::new(root.to_owned());
        p.refresh(Instant::now());
        assert_eq!(p.stats.len(), MAX_NODES);
        assert_eq!(p.left_out.timelines, 70 - MAX_NODES as u64);
    }
}
