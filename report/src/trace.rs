//! `trainprof trace`: one Chrome trace-event file (JSON array format, gzipped) for
//! ui.perfetto.dev, streamed: one timeline file and one system file at a time go straight
//! into the gzip encoder, so memory does not grow with the job (`docs/report.md`, "The
//! trace").
//!
//! Layout: a process per system node (`node algo-1`: counter tracks) and per rank
//! (`rank 0-algo-1`: a thread per phase, slices for steps, phases, ops, kernels, and a
//! `python` thread with the Python-profiling windows). One time axis: µs since the epoch,
//! each node's events moved by its clock offset as the collectives estimate it
//! (`docs/report.md`, "Clock alignment"; the trace: "The trace").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Write};
use std::path::Path;

use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::{Value, json};
use trainprof_output::fs::Dir;
use trainprof_output::protocol::timeline;

use crate::analysis::collect::{
    MAX_GPUS_PER_NODE, MAX_NAME_BYTES, MAX_NODES, MAX_PHASES, MAX_RANKS, OTHER_PHASES,
};
pub mod archive;

use crate::analysis::collectives;
use crate::model::collectives::{AlignState, NodeClock};
use crate::reading::{self, Skipped, Tick};

/// Processes (nodes and ranks) named in the trace; events of further ones, and of names
/// longer than `MAX_NAME_BYTES`, go to one process [`OTHER_PROCESSES`] (`docs/report.md`,
/// "Caps").
const MAX_PROCESSES: usize = MAX_NODES + MAX_RANKS;
const OTHER_PROCESSES: &str = "(other nodes and ranks)";

/// What to keep.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Clip {
    /// Steps `A..=B` (any mode): the time from the first such step's start to the last one's end.
    pub steps: Option<(i64, i64)>,
    /// Epoch seconds.
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: {1}")]
    Root(String, io::Error),
    #[error("no step numbered {0} to {1} in the timelines")]
    NoSteps(i64, i64),
    #[error("writing the trace: {0}")]
    Write(#[from] io::Error),
}

/// How to write it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// Times as recorded: no node's events are moved by its clock offset.
    pub unaligned: bool,
    /// Only this node's system counters and the events of its ranks (`<rank>-<node>`).
    pub node: Option<String>,
}

/// What was written.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Written {
    pub slices: u64,
    pub counters: u64,
    pub python_windows: u64,
    /// Stalls (slices) and crashes (instants) from the hang dumps.
    pub hangs: u64,
    pub skipped: Vec<String>,
    /// Each node's clock as the collectives estimate it (`docs/report.md`, "Clock
    /// alignment"); empty when no collective was read. With `unaligned`, estimated all the
    /// same but not applied.
    pub clocks: Vec<NodeClock>,
    /// Whether the offsets were applied.
    pub aligned: bool,
}

/// Each node's clock offset, µs, to subtract from its times (the aligned nodes'; none for the
/// reference and the unaligned).
#[derive(Debug, Default, Clone)]
pub struct Shifts {
    by_node: HashMap<String, i64>,
    /// A process name's tail per node when two nodes or more have clocks: how it was moved.
    labels: HashMap<String, (String, Value)>,
}

impl Shifts {
    /// The offsets of `clocks` (`NodeClock::offset_ms` rounded to µs).
    pub fn new(clocks: &[NodeClock], apply: bool) -> Shifts {
        let mut by_node = HashMap::new();
        let mut labels = HashMap::new();
        for c in clocks {
            let off = c.offset_ms.map(|ms| (ms * 1000.0).round() as i64).filter(|_| apply);
            if let Some(us) = off.filter(|us| *us != 0) {
                by_node.insert(c.node.clone(), us);
            }
            if clocks.len() < 2 {
                continue;
            }
            let (label, args) = match (c.state, off) {
                (AlignState::Reference, _) => {
                    ("clock: the reference".to_owned(), json!({"state": "reference", "moved_us": 0}))
                }
                (AlignState::Aligned, Some(us)) => {
                    let unc = c.uncertainty_ms.unwrap_or(0.0);
                    (
                        format!("clock: moved {:+.3} ms ± {unc:.3} ms", -(us as f64) / 1000.0),
                        json!({"state": "aligned", "moved_us": -us, "uncertainty_us": (unc * 1000.0).round() as i64}),
                    )
                }
                (AlignState::Aligned, None) => (
                    format!(
                        "clock: as recorded (offset {:+.3} ms ± {:.3} ms not applied)",
                        c.offset_ms.unwrap_or(0.0),
                        c.uncertainty_ms.unwrap_or(0.0)
                    ),
                    json!({"state": "not_applied", "moved_us": 0}),
                ),
                (AlignState::Unaligned, _) => (
                    "clock: unaligned, as recorded".to_owned(),
                    json!({"state": "unaligned", "moved_us": 0, "reason": c.reason}),
                ),
            };
            labels.insert(c.node.clone(), (label, args));
        }
        Shifts { by_node, labels }
    }

    /// The offset of a node, µs (0 for a node without one).
    pub fn node(&self, node: &str) -> i64 {
        self.by_node.get(node).copied().unwrap_or(0)
    }

    /// The offset of a rank's node (the host of `<rank>-<host>`), µs.
    pub fn rank(&self, rank: &str) -> i64 {
        self.node(collectives::node_of(rank))
    }
}

/// Each node's clock as the collectives of the timelines estimate it: one pass over the
/// timelines, only the collective events kept (`docs/report.md`, "Clock alignment").
pub fn clocks(dir: &Dir) -> Vec<NodeClock> {
    let mut c = collectives::Collector::default();
    // What is skipped here is skipped (and said) again by the pass that writes.
    let mut skipped = Skipped::default();
    reading::timeline_events(dir, &mut skipped, &|_, _| true, |e| c.event(e));
    c.finish(&[]).map(|c| c.clocks).unwrap_or_default()
}

struct Out<W: Write> {
    w: W,
    first: bool,
    pids: HashMap<String, u64>,
    tids: HashMap<(u64, String), u64>,
    /// Threads per process.
    threads: HashMap<u64, usize>,
    /// The GPUs drawn per node process.
    gpus: HashMap<u64, HashSet<String>>,
    next_pid: u64,
    /// Events and samples that went to a shared track or were left out, by cap.
    capped: BTreeMap<&'static str, u64>,
    shifts: Shifts,
}

impl<W: Write> Out<W> {
    fn sep(&mut self) -> io::Result<()> {
        self.w.write_all(if self.first { b"[\n" } else { b",\n" })?;
        self.first = false;
        Ok(())
    }

    fn event(&mut self, v: &Value) -> io::Result<()> {
        self.sep()?;
        serde_json::to_writer(&mut self.w, v).map_err(io::Error::other)
    }

    fn string(&mut self, s: &str) -> io::Result<()> {
        serde_json::to_writer(&mut self.w, s).map_err(io::Error::other)
    }

    /// A timeline event as a slice (or an instant), written field by field: building a
    /// `serde_json::Value` per event was half the trace's time (docs/report.md, "Measured").
    /// `span`: the part of a slice kept ([`clip_slice`]).
    fn slice(&mut self, e: &reading::Event<'_>, pid: u64, tid: u64, span: (i64, i64)) -> io::Result<()> {
        self.sep()?;
        self.w.write_all(b"{\"name\":")?;
        self.string(e.name)?;
        self.w.write_all(b",\"cat\":")?;
        self.string(e.phase)?;
        if e.ph == 'X' {
            write!(
                self.w,
                ",\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"dur\":{},\"args\":",
                span.0, span.1
            )?;
        } else {
            write!(
                self.w,
                ",\"ph\":\"i\",\"s\":\"t\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"args\":",
                span.0
            )?;
        }
        serde_json::to_writer(&mut self.w, e.args).map_err(io::Error::other)?;
        self.w.write_all(b"}")
    }

    /// A counter sample: `args` are the finite values (none: nothing written).
    fn counter(&mut self, name: &str, pid: u64, ts: i64, args: &[(&str, Option<f64>)]) -> io::Result<bool> {
        if !args.iter().any(|(_, v)| v.is_some_and(f64::is_finite)) {
            return Ok(false);
        }
        self.sep()?;
        self.w.write_all(b"{\"name\":")?;
        self.string(name)?;
        write!(self.w, ",\"ph\":\"C\",\"pid\":{pid},\"ts\":{ts},\"args\":{{")?;
        let mut first = true;
        for (k, v) in args {
            if let Some(v) = v.filter(|x| x.is_finite()) {
                // Rust prints a finite f64 without an exponent: valid JSON.
                write!(self.w, "{}\"{k}\":{v}", if first { "" } else { "," })?;
                first = false;
            }
        }
        self.w.write_all(b"}}")?;
        Ok(true)
    }

    /// The trace pid of `process` (`node algo-1`, `rank 0-algo-1`) of `node`, named on first
    /// use (with how its clock was moved, when nodes' clocks were estimated); past the caps,
    /// the shared `OTHER_PROCESSES`.
    fn pid(&mut self, process: &str, node: &str, sort: u64) -> io::Result<u64> {
        if let Some(p) = self.pids.get(process) {
            return Ok(*p);
        }
        if process.len() > MAX_NAME_BYTES + 5 || self.pids.len() >= MAX_PROCESSES {
            *self.capped.entry("processes").or_default() += 1;
            if let Some(p) = self.pids.get(OTHER_PROCESSES) {
                return Ok(*p);
            }
            return self.new_pid(OTHER_PROCESSES, "", 3);
        }
        self.new_pid(process, node, sort)
    }

    fn new_pid(&mut self, process: &str, node: &str, sort: u64) -> io::Result<u64> {
        self.next_pid += 1;
        let p = self.next_pid;
        self.pids.insert(process.to_owned(), p);
        let meta = timeline::PH_METADATA;
        let ev = match self.shifts.labels.get(node) {
            Some((label, clock)) => json!({"name": timeline::PROCESS_NAME, "ph": meta, "pid": p,
                "args": {"name": format!("{process} ({label})"), "clock": clock}}),
            None => json!({"name": timeline::PROCESS_NAME, "ph": meta, "pid": p, "args": {"name": process}}),
        };
        self.event(&ev)?;
        self.event(&json!({"name": timeline::PROCESS_SORT_INDEX, "ph": meta, "pid": p,
            "args": {(timeline::SORT_INDEX_KEY): sort * 1000 + p}}))?;
        Ok(p)
    }

    /// The thread of `thread` in `pid`, named on first use; past `MAX_PHASES` threads in a
    /// process (or for a name longer than `MAX_NAME_BYTES`), the shared `OTHER_PHASES` (the
    /// events keep their phase as `cat`).
    fn tid(&mut self, pid: u64, thread: &str) -> io::Result<u64> {
        let key = (pid, thread.to_owned());
        if let Some(t) = self.tids.get(&key) {
            return Ok(*t);
        }
        let n = self.threads.entry(pid).or_default();
        if thread.len() > MAX_NAME_BYTES || *n >= MAX_PHASES {
            *self.capped.entry("threads").or_default() += 1;
            let other = (pid, OTHER_PHASES.to_owned());
            if let Some(t) = self.tids.get(&other) {
                return Ok(*t);
            }
            return self.new_tid(other);
        }
        *n += 1;
        self.new_tid(key)
    }

    fn new_tid(&mut self, key: (u64, String)) -> io::Result<u64> {
        let (pid, thread) = (key.0, key.1.clone());
        let t = self.tids.len() as u64 + 1;
        self.tids.insert(key, t);
        self.event(
            &json!({"name": timeline::THREAD_NAME, "ph": timeline::PH_METADATA, "pid": pid, "tid": t,
                "args": {"name": thread}}),
        )?;
        Ok(t)
    }

    /// Whether `gpu`'s counters are drawn on node process `pid`: the first
    /// `MAX_GPUS_PER_NODE` GPUs of a node are (a counter track each); the others are left out.
    fn gpu(&mut self, pid: u64, gpu: &str) -> bool {
        let seen = self.gpus.entry(pid).or_default();
        if seen.contains(gpu) {
            return true;
        }
        if gpu.len() > MAX_NAME_BYTES || seen.len() >= MAX_GPUS_PER_NODE {
            *self.capped.entry("gpus").or_default() += 1;
            return false;
        }
        seen.insert(gpu.to_owned());
        true
    }
}

/// Writes the trace of the LocalPath at `root` into `out` (gzipped), aligned.
pub fn write(root: &Path, out: impl Write, clip: &Clip) -> Result<Written, Error> {
    write_with(root, out, clip, &Settings::default())
}

/// Writes the trace of the LocalPath at `root` into `out` (gzipped) as `settings` say.
pub fn write_with(root: &Path, out: impl Write, clip: &Clip, settings: &Settings) -> Result<Written, Error> {
    let dir = Dir::open_root(root, false).map_err(|e| Error::Root(root.display().to_string(), e))?;
    let clocks = clocks(&dir);
    let shifts = Shifts::new(&clocks, !settings.unaligned);
    let sink = Sink::Gz(GzEncoder::new(io::BufWriter::new(out), Compression::fast()));
    write_shifted(&dir, sink, clip, settings.node.as_deref(), shifts, clocks, !settings.unaligned)
}

/// Where the events go: gzipped (the trace), or plain (a member of the per-node archive).
enum Sink<W: Write> {
    Gz(GzEncoder<io::BufWriter<W>>),
    Plain(W),
}

impl<W: Write> Write for Sink<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Gz(w) => w.write(buf),
            Sink::Plain(w) => w.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Gz(w) => w.flush(),
            Sink::Plain(w) => w.flush(),
        }
    }
}

impl<W: Write> Sink<W> {
    fn finish(self) -> io::Result<()> {
        match self {
            Sink::Gz(w) => w.finish()?.flush(),
            Sink::Plain(mut w) => w.flush(),
        }
    }
}

/// Writes the trace, each node's events moved by `shifts`; `node`: only that node's.
fn write_shifted<W: Write>(
    dir: &Dir,
    out: Sink<W>,
    clip: &Clip,
    node: Option<&str>,
    shifts: Shifts,
    clocks: Vec<NodeClock>,
    aligned: bool,
) -> Result<Written, Error> {
    let mut skipped = Skipped::default();
    let ours = |n: &str| node.is_none_or(|x| x == n);
    let spans = range(dir, clip, &shifts, &mut skipped)?;
    let (lo_us, hi_us) = spans.hull;
    // serde_json writes a value in many small pieces, and the encoder compresses at every
    // write: the buffer in front of it makes that one call per 256 KiB (measured on an hour
    // of 8 ranks: about 3× faster, docs/report.md "Measured").
    let gz = io::BufWriter::with_capacity(256 << 10, out);
    let mut o = Out {
        w: gz,
        first: true,
        pids: HashMap::new(),
        tids: HashMap::new(),
        threads: HashMap::new(),
        gpus: HashMap::new(),
        next_pid: 0,
        capped: BTreeMap::new(),
        shifts,
    };
    let mut written = Written { clocks, aligned, ..Written::default() };
    let mut err: Option<io::Error> = None;

    // Timelines: one file at a time.
    let shifts = o.shifts.clone();
    let keep_file = |rank: &str, last_us: i64| {
        ours(collectives::node_of(rank)) && last_us.saturating_sub(shifts.rank(rank)) >= lo_us
    };
    reading::timeline_events(dir, &mut skipped, &keep_file, |e| {
        if err.is_some() {
            return;
        }
        let start = e.start_us.saturating_sub(shifts.rank(e.node));
        let Some(span) = spans.clip(e.node, e.ph == 'X', start, e.dur_us) else { return };
        let r = (|| -> io::Result<()> {
            let pid = o.pid(&format!("rank {}", e.node), collectives::node_of(e.node), 2)?;
            let tid = o.tid(pid, e.phase)?;
            o.slice(e, pid, tid, span)
        })();
        match r {
            Ok(()) => written.slices += 1,
            Err(x) => err = Some(x),
        }
    });
    if let Some(e) = err.take() {
        return Err(e.into());
    }

    // Python-profiling windows.
    for f in reading::stats_files(dir, &mut skipped) {
        if !ours(collectives::node_of(&f.node)) {
            continue;
        }
        let Some((a, b)) = reading::parse_window(&f.window) else { continue };
        let shift = shifts.rank(&f.node);
        let (s, e) = ((a.time_us as i64).saturating_sub(shift), (b.time_us as i64).saturating_sub(shift));
        if e < s {
            continue;
        }
        let Some((s, dur)) = spans.clip(&f.node, true, s, e - s) else { continue };
        let e = s + dur;
        let pid = o.pid(&format!("rank {}", f.node), collectives::node_of(&f.node), 2)?;
        let tid = o.tid(pid, "python")?;
        o.event(&json!({"name": format!("{} window", f.profiler.as_str()), "cat": "python", "ph": "X", "pid": pid, "tid": tid,
            "ts": s, "dur": e - s, "args": {"window": f.window, "profiler": f.profiler}}))?;
        written.python_windows += 1;
    }

    // Hangs and crashes: a stall is a slice from its step's start (else its detection) to its
    // end (else its detection), a crash an instant, on the rank's `hangs` thread.
    let (dumps, _) = crate::reading::dumps::read_dumps(dir, &mut skipped);
    for d in dumps {
        if !ours(collectives::node_of(&d.node)) {
            continue;
        }
        let shift = shifts.rank(&d.node);
        let us = |s: f64| ((s * 1e6).round() as i64).saturating_sub(shift);
        let det = us(d.detected_s);
        let start = d.step_started_s.map_or(det, |s| us(s).min(det));
        let end = d.ended_s.map_or(det, |e| us(e).max(det));
        let slice = d.kind.is_stall();
        let (start, end) = if slice { (start, end) } else { (det, det) };
        let Some((s, dur)) = spans.clip(&d.node, slice, start, end - start) else { continue };
        let pid = o.pid(&format!("rank {}", d.node), collectives::node_of(&d.node), 2)?;
        let tid = o.tid(pid, "hangs")?;
        let name = format!("{} in step {}", d.kind, d.step.map_or("?".to_owned(), |s| s.to_string()));
        let args = json!({"folder": d.folder, "kind": d.kind, "step": d.step, "detected_us": det, // not the protocol: the trace's args
            "stalled_s": d.stalled_s, "signal": d.signal}); // not the protocol: the trace's args
        if slice {
            o.event(&json!({"name": name, "cat": "hang", "ph": "X", "pid": pid, "tid": tid, "ts": s, "dur": dur, "args": args}))?;
        } else {
            o.event(&json!({"name": name, "cat": "hang", "ph": "i", "s": "p", "pid": pid, "tid": tid, "ts": det, "args": args}))?;
        }
        written.hangs += 1;
    }

    // System metrics as counters: one tick at a time.
    reading::system_ticks(dir, &mut skipped, |node, t| {
        if err.is_some() || !ours(node) {
            return;
        }
        let ts = ((t.t_s * 1e6).round() as i64).saturating_sub(shifts.node(node));
        if !in_span(ts, lo_us, hi_us) {
            return;
        }
        match counters(&mut o, node, ts, &t) {
            Ok(n) => written.counters += n,
            Err(x) => err = Some(x),
        }
    });
    if let Some(e) = err.take() {
        return Err(e.into());
    }
    if o.first {
        o.w.write_all(b"[")?;
    }
    o.w.write_all(b"\n]\n")?;
    o.w.into_inner().map_err(io::IntoInnerError::into_error)?.finish()?;
    written.skipped = skipped.0;
    for (what, n) in &o.capped {
        written.skipped.push(match *what {
            "processes" => format!(
                "{n} events and ticks of nodes and ranks past the first {MAX_PROCESSES} (or with names over {MAX_NAME_BYTES} bytes) drawn in the process {OTHER_PROCESSES:?}"
            ),
            "threads" => format!(
                "{n} events of phases past the first {MAX_PHASES} of a rank (or with names over {MAX_NAME_BYTES} bytes) drawn on the thread {OTHER_PHASES:?}"
            ),
            _ => format!(
                "{n} GPU samples of GPUs past the first {MAX_GPUS_PER_NODE} of a node (or with names over {MAX_NAME_BYTES} bytes) left out"
            ),
        });
    }
    Ok(written)
}

fn counters<W: Write>(o: &mut Out<W>, node: &str, ts: i64, t: &Tick) -> io::Result<u64> {
    let pid = o.pid(&format!("node {node}"), node, 1)?;
    let mut n = 0;
    let mb = |v: Option<f64>| v.map(|b| b / 1e6);
    n += u64::from(o.counter(
        "CPU total %",
        pid,
        ts,
        &[("busy", t.cpu_total()), ("iowait", t.iowait_total)],
    )?);
    n += u64::from(o.counter("Memory used %", pid, ts, &[("used", t.memory)])?);
    if t.gpus_left_out > 0 {
        *o.capped.entry("gpus").or_default() += t.gpus_left_out;
    }
    for (gpu, util, mem) in &t.gpus {
        if !o.gpu(pid, gpu) {
            continue;
        }
        n += u64::from(o.counter(&format!("{gpu} util %"), pid, ts, &[("util", *util)])?);
        n += u64::from(o.counter(&format!("{gpu} memory %"), pid, ts, &[("mem", *mem)])?);
    }
    n += u64::from(o.counter("I/O MB/s", pid, ts, &[("read", mb(t.io_read)), ("write", mb(t.io_write))])?);
    n += u64::from(o.counter("Network MB/s", pid, ts, &[("rx", mb(t.net_rx)), ("tx", mb(t.net_tx))])?);
    n += u64::from(o.counter("Trainer CPU % (of one core)", pid, ts, &[("cpu", t.trainer_cpu)])?);
    n += u64::from(o.counter("Trainer RSS MB", pid, ts, &[("rss", mb(t.trainer_rss))])?);
    // An unsynchronised kernel's bound is no measurement (it only grows to 16 s): the bound is
    // drawn for synchronised readings only; `Clock synchronised` shows the 0.
    if t.clock_synchronised != Some(0.0) {
        n += u64::from(o.counter(
            "Clock error bound µs",
            pid,
            ts,
            &[("max", t.clock_max_error_us), ("estimated", t.clock_est_error_us)],
        )?);
    }
    n += u64::from(o.counter("Clock synchronised", pid, ts, &[("synchronised", t.clock_synchronised)])?);
    Ok(n)
}

/// Whether an instant (a counter sample, an instant event) at `ts` is kept: inside the span
/// `[lo, hi]`, its edges included.
fn in_span(ts: i64, lo: i64, hi: i64) -> bool {
    ts >= lo && ts <= hi
}

/// The part of an event kept in the span `[lo, hi]`, as `(ts, dur)`: a slice that overlaps it
/// by more than nothing is cut at its edges (one that only touches an edge is left out); an
/// instant (or a slice of no duration) is kept when [`in_span`]. `None`: left out. With `trace --steps 5-8`, an event of step 9 that
/// starts where step 8 ends overlaps nothing and is left out (`docs/report.md`, "The
/// trace").
pub fn clip_slice(slice: bool, ts: i64, dur: i64, lo: i64, hi: i64) -> Option<(i64, i64)> {
    let end = ts.saturating_add(dur.max(0));
    if !slice || end == ts {
        return in_span(ts, lo, hi).then_some((ts, dur.max(0)));
    }
    let (a, b) = (ts.max(lo), end.min(hi));
    (b > a).then(|| (a, b - a))
}

/// What to keep: the µs range `hull` (system counters, and every event without `--steps`)
/// and, with `--steps A-B`, each rank's own spans of those steps, one per mode (from the
/// rank's first such step's start to its last one's end): an event of a rank is kept only
/// inside its rank's spans, so step 9 of a rank is left out even while another rank (or
/// another mode) is still in step 8 (`docs/report.md`, "The trace").
#[derive(Debug, Default)]
struct Spans {
    hull: (i64, i64),
    /// `None` without `--steps`. Ranks past [`MAX_RANKS`] are not listed: theirs is `hull`.
    by_rank: Option<HashMap<String, Vec<(i64, i64)>>>,
}

impl Spans {
    /// The part of an event of `rank` kept, as [`clip_slice`] says, within the first of the
    /// rank's spans it overlaps; a rank without any of the steps keeps nothing.
    fn clip(&self, rank: &str, slice: bool, ts: i64, dur: i64) -> Option<(i64, i64)> {
        let (lo, hi) = self.hull;
        let Some(by_rank) = &self.by_rank else { return clip_slice(slice, ts, dur, lo, hi) };
        match by_rank.get(rank) {
            Some(spans) => spans.iter().find_map(|&(a, b)| clip_slice(slice, ts, dur, a.max(lo), b.min(hi))),
            None if by_rank.len() >= MAX_RANKS => clip_slice(slice, ts, dur, lo, hi),
            None => None,
        }
    }
}

/// A mode and the µs span of a rank's steps in it.
type ModeSpan = (String, (i64, i64));

/// The µs range to keep, and with `--steps` each rank's spans of the steps.
/// Times are aligned (each rank's moved by its node's offset in `shifts`).
fn range(dir: &Dir, clip: &Clip, shifts: &Shifts, skipped: &mut Skipped) -> Result<Spans, Error> {
    let lo = clip.start_s.map_or(i64::MIN, |s| (s * 1e6) as i64);
    let hi = clip.end_s.map_or(i64::MAX, |s| (s * 1e6) as i64);
    let Some((a, b)) = clip.steps else { return Ok(Spans { hull: (lo, hi), by_rank: None }) };
    // rank → (mode, the hull of its steps A..=B); at most MAX_RANKS ranks.
    let mut found: HashMap<String, Vec<ModeSpan>> = HashMap::new();
    let mut hull: Option<(i64, i64)> = None;
    reading::timeline_events(dir, skipped, &|_, _| true, |e| {
        let Some(mode) = crate::analysis::collect::step_mode(e.phase) else { return };
        if e.ph != 'X' || !e.step.is_some_and(|s| s >= a && s <= b) {
            return;
        }
        let start = e.start_us.saturating_sub(shifts.rank(e.node));
        let span = (start, start.saturating_add(e.dur_us));
        let join = |(x, y): (i64, i64)| (x.min(span.0), y.max(span.1));
        hull = Some(hull.map_or(span, join));
        if !found.contains_key(e.node) {
            if found.len() >= MAX_RANKS {
                return;
            }
            found.insert(e.node.to_owned(), Vec::new());
        }
        let Some(modes) = found.get_mut(e.node) else { return };
        match modes.iter_mut().find(|(m, _)| m == mode) {
            Some((_, h)) => *h = join(*h),
            None => modes.push((mode.to_owned(), span)),
        }
    });
    let (x, y) = hull.ok_or(Error::NoSteps(a, b))?;
    let by_rank = found
        .into_iter()
        .map(|(rank, modes)| {
            let mut v: Vec<(i64, i64)> = modes.into_iter().map(|(_, h)| h).collect();
            v.sort_unstable();
            (rank, v)
        })
        .collect();
    Ok(Spans { hull: (lo.max(x), hi.min(y)), by_rank: Some(by_rank) })
}

/// A `--steps` value that is not `A-B` with `0 <= A <= B`.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum StepsError {
    #[error("{0:?} is not A-B (e.g. 10-20)")]
    NotARange(String),
    #[error("{0:?} is not a step number")]
    NotAStep(String),
    #[error("{0:?}: need 0 <= A <= B")]
    Order(String),
}

/// Parses `A-B` (`--steps`).
pub fn parse_steps(s: &str) -> Result<(i64, i64), StepsError> {
    let (a, b) = s.split_once('-').ok_or_else(|| StepsError::NotARange(s.to_owned()))?;
    let a: i64 = a.trim().parse().map_err(|_| StepsError::NotAStep(a.to_owned()))?;
    let b: i64 = b.trim().parse().map_err(|_| StepsError::NotAStep(b.to_owned()))?;
    if a < 0 || b < a {
        return Err(StepsError::Order(s.to_owned()));
    }
    Ok((a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    /// `trace --steps 5-8` keeps exactly the steps' span: an event of step 9 that starts
    /// where step 8 ends is left out, one that crosses an edge is cut at it.
    #[test]
    fn events_are_clipped_to_the_span_by_time() {
        let (lo, hi) = (1000, 2000);
        // Starts where the span ends (step 9's first op), ends where it starts (step 4).
        assert_eq!(clip_slice(true, 2000, 50, lo, hi), None);
        assert_eq!(clip_slice(true, 950, 50, lo, hi), None);
        // Inside, across the end, across both edges.
        assert_eq!(clip_slice(true, 1500, 100, lo, hi), Some((1500, 100)));
        assert_eq!(clip_slice(true, 1990, 65, lo, hi), Some((1990, 10)));
        assert_eq!(clip_slice(true, 900, 2000, lo, hi), Some((1000, 1000)));
        // Instants and empty slices: inside the span, its edges included.
        assert_eq!(clip_slice(false, 2000, 0, lo, hi), Some((2000, 0)));
        assert_eq!(clip_slice(false, 2001, 0, lo, hi), None);
        assert_eq!(clip_slice(true, 999, 0, lo, hi), None);
        // No clip at all.
        assert_eq!(clip_slice(true, 5, 7, i64::MIN, i64::MAX), Some((5, 7)));
    }

    #[test]
    fn steps_range_parses_strictly() {
        assert_eq!(parse_steps("3-7"), Ok((3, 7)));
        assert_eq!(parse_steps("7-3").map_err(|e| e.to_string()), Err("\"7-3\": need 0 <= A <= B".into()));
        assert_eq!(parse_steps("x-3").map_err(|e| e.to_string()), Err("\"x\" is not a step number".into()));
        assert_eq!(parse_steps("3").map_err(|e| e.to_string()), Err("\"3\" is not A-B (e.g. 10-20)".into()));
        assert!(parse_steps("-1-3").is_err());
    }

    #[test]
    fn trace_holds_slices_and_counters_and_clips() {
        let dir = tempfile::tempdir().unwrap();
        let hour = dir.path().join("framework/pevents/2026112203");
        std::fs::create_dir_all(&hour).unwrap();
        let mut tl = String::from(
            "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"start_time_since_epoch_in_micros\": 1000000000000000}},\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": \"Step:ModeKeys.TRAIN\"}}",
        );
        for i in 0..5 {
            tl += &format!(
                ",\n{{\"name\": \"Step:ModeKeys.TRAIN\", \"pid\": 1, \"ph\": \"X\", \"ts\": {}, \"dur\": 1000000, \"args\": {{\"step_num\": \"{i}\"}}}}",
                i * 1_000_000
            );
        }
        tl += "\n]";
        std::fs::write(hour.join("1000000005000000_0-algo-1_pythontimeline.json"), tl).unwrap();
        let sys = dir.path().join("system/incremental/2026112203");
        std::fs::create_dir_all(&sys).unwrap();
        let mut s = String::new();
        for i in 0..5 {
            s += &format!(
                "{{\"Type\":\"cpu\",\"Name\":\"cpu0\",\"Dimension\":\"CPUUtilization\",\"Value\":5,\"NodeId\":\"algo-1\",\"Timestamp\":{}}}\n",
                1_000_000_000 + i
            );
        }
        std::fs::write(sys.join("1000000000.algo-1.json"), s).unwrap();

        let decode = |buf: &[u8]| -> Vec<Value> {
            let mut text = String::new();
            flate2::read::GzDecoder::new(buf).read_to_string(&mut text).unwrap();
            serde_json::from_str(&text).unwrap()
        };
        let mut buf = Vec::new();
        let w = write(dir.path(), &mut buf, &Clip::default()).unwrap();
        assert_eq!((w.slices, w.counters), (5, 5));
        let ev = decode(&buf);
        assert_eq!(ev.iter().filter(|e| e["ph"] == "X").count(), 5);
        assert_eq!(ev.iter().filter(|e| e["ph"] == "C").count(), 5);
        assert_eq!(ev.iter().filter(|e| e["ph"] == "M" && e["name"] == "process_name").count(), 2);

        let mut buf = Vec::new();
        let w = write(dir.path(), &mut buf, &Clip { steps: Some((1, 2)), ..Clip::default() }).unwrap();
        // Steps 1 and 2 cover [1 s, 3 s]: steps 0 and 3 only touch its edges and are left
        // out; the ticks at 1, 2 and 3 s are inside.
        assert_eq!(w.slices, 2);
        assert_eq!(w.counters, 3);
        let ev = decode(&buf);
        let steps: Vec<&str> =
            ev.iter().filter(|e| e["ph"] == "X").map(|e| e["args"]["step_num"].as_str().unwrap()).collect();
        assert_eq!(steps, ["1", "2"]);
        assert!(matches!(
            write(dir.path(), &mut Vec::new(), &Clip { steps: Some((50, 60)), ..Clip::default() }),
            Err(Error::NoSteps(50, 60))
        ));
        // A time range: from 3.5 s on, steps 3 and 4 and the last tick (4 s).
        let clip = Clip { start_s: Some(1_000_000_003.5), end_s: None, ..Clip::default() };
        let mut buf = Vec::new();
        let w = write(dir.path(), &mut buf, &clip).unwrap();
        assert_eq!((w.slices, w.counters), (2, 1));
        let ev = decode(&buf);
        let steps: Vec<&str> =
            ev.iter().filter(|e| e["ph"] == "X").map(|e| e["args"]["step_num"].as_str().unwrap()).collect();
        assert_eq!(steps, ["3", "4"]);
    }

    /// A known-answer job: rank 1 runs half a second behind rank 0, and rank 0 has EVAL steps
    /// 5 and 6 long after its TRAIN step 9. `--steps 5-8` keeps, per rank, the TRAIN steps 5 to
    /// 8 and a `Forward` slice inside each, plus rank 0's two EVAL steps: 18 slices, none of
    /// step 4 or 9 (the span of all ranks and modes together, 5 s to 22 s, held rank 0's TRAIN
    /// step 9 and rank 1's step 4).
    #[test]
    fn steps_are_clipped_by_each_ranks_own_spans() {
        let dir = tempfile::tempdir().unwrap();
        let hour = dir.path().join("framework/pevents/2026112203");
        std::fs::create_dir_all(&hour).unwrap();
        let t0: i64 = 1_000_000_000_000_000;
        for (rank, offset_us) in [("0-algo-1", 0), ("1-algo-1", 500_000)] {
            let mut tl = format!(
                "[\n{{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {{\"start_time_since_epoch_in_micros\": {t0}}}}},\n\
                 {{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {{\"name\": \"Step:ModeKeys.TRAIN\"}}}},\n\
                 {{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 2, \"args\": {{\"name\": \"Forward\"}}}},\n\
                 {{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 3, \"args\": {{\"name\": \"Step:ModeKeys.EVAL\"}}}}"
            );
            let mut ev = |pid: u32, ts: i64, dur: i64, step: i64| {
                tl += &format!(
                    ",\n{{\"name\": \"e\", \"pid\": {pid}, \"ph\": \"X\", \"ts\": {ts}, \"dur\": {dur}, \"args\": {{\"step_num\": \"{step}\"}}}}"
                );
            };
            for i in 0..12 {
                let ts = i * 1_000_000 + offset_us;
                ev(1, ts, 1_000_000, i);
                ev(2, ts + 100_000, 500_000, i);
            }
            if offset_us == 0 {
                ev(3, 20_000_000, 1_000_000, 5);
                ev(3, 21_000_000, 1_000_000, 6);
            }
            tl += "\n]";
            std::fs::write(hour.join(format!("{}_{rank}_pythontimeline.json", t0 + 30_000_000)), tl).unwrap();
        }
        let mut buf = Vec::new();
        let w = write(dir.path(), &mut buf, &Clip { steps: Some((5, 8)), ..Clip::default() }).unwrap();
        let mut text = String::new();
        flate2::read::GzDecoder::new(&buf[..]).read_to_string(&mut text).unwrap();
        let ev: Vec<Value> = serde_json::from_str(&text).unwrap();
        let mut steps: Vec<(String, String)> = ev
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                (e["cat"].as_str().unwrap().to_owned(), e["args"]["step_num"].as_str().unwrap().to_owned())
            })
            .collect();
        steps.sort();
        let mut want: Vec<(String, String)> = Vec::new();
        for rank in 0..2 {
            for i in 5..=8 {
                want.push(("Step:ModeKeys.TRAIN".into(), i.to_string()));
                want.push(("Forward".into(), i.to_string()));
            }
            if rank == 0 {
                want.push(("Step:ModeKeys.EVAL".into(), "5".into()));
                want.push(("Step:ModeKeys.EVAL".into(), "6".into()));
            }
        }
        want.sort();
        assert_eq!(steps, want);
        assert_eq!(w.slices, 18);
        // Every slice lies inside its own step: none was cut.
        assert!(ev.iter().filter(|e| e["ph"] == "X" && e["cat"] != "Forward").all(|e| e["dur"] == 1_000_000));
    }
}
