//! The agent's side of a stall (`docs/on-disk.md`, "Host state at a stall"): when the hook
//! writes a stall dump (a new `framework/hangs/<node>/<step>-<µs>/stall.json` under LocalPath),
//! or when the trainer's timelines stop changing while its process lives, the agent records
//! the host and GPUs around that moment: the last ticks' GPU utilisation, per-process GPU
//! figures, Xid and ECC counters, pressure stalls, host and trainer CPU, and the trainer tree's
//! threads (`/proc/<pid>/task/*/stat`: running or asleep, and how busy over a short interval).
//!
//! The record goes to the agent's own output, `system/hangs/<node>/<step>-<µs>.json` (or
//! `system/hangs/<node>/timeline-<µs>.json`), written new through `trainprof_output::fs`
//! (never over a file, never through a link), and never into the trainer's dump folder: the
//! trainer's user owns that. The report joins it to the dump by `folder`
//! (`trainprof_output::protocol::host_record::HostState` is the shape, shared by writer and
//! reader).
//!
//! Two parts: a [`Sink`] that copies the tick's few relevant metrics into a bounded ring
//! (a `try_lock`: a tick never waits; a tick that finds the ring busy is counted and left
//! out), and a thread that looks under LocalPath twice a second and writes the records.
//! Everything is bounded: the ring's ticks, the dump folders remembered, the threads read, the
//! timeline files walked, and each look at `framework/hangs/` (names read and folders looked
//! into per look, a folder listed again only when its mtime moved: planted folders cost the
//! same as none), with a record only for a `stall.json` that is the hook's.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use trainprof_output::fs::{self as ofs, Dir, Kind, Meta};
use trainprof_output::protocol::dump;
use trainprof_output::protocol::host_record::{self, HostSample, HostState, ThreadCpu};
use trainprof_output::protocol::metric::{MetricType, Name, dimension as d, name as n};

use crate::log;
use crate::pipeline::sample::Metric;
use crate::pipeline::sample::process::{clock_ticks, parse_pid_stat, stat_comm};
use crate::pipeline::sample::tree_pids::TreePids;
use crate::pipeline::sink::{Sink, Tick};

/// Ticks kept in the ring (30 s at the default 100 ms).
pub const RING_TICKS: usize = 300;
/// Metrics kept of one tick.
pub const MAX_TICK_METRICS: usize = 512;
/// A record holds the ticks from this long before the detection to its writing.
pub const BEFORE_S: f64 = 10.0;
/// A record is written this long after the detection: the ticks after it, and the threads'
/// CPU over that interval.
pub const AFTER: Duration = Duration::from_secs(1);
/// Samples in a record at most.
pub const MAX_SAMPLES: usize = 256;
/// Dump folders remembered (seen or written); past it, new ones are not recorded.
pub const MAX_SEEN: usize = 4096;
/// Node folders of `framework/hangs/` followed.
pub const MAX_NODES: usize = 256;
/// Per look: names read from `framework/hangs/` and its node folders (a node folder's
/// `lstat` counts as one), and dump folders looked into (`docs/on-disk.md`, "Host state at a
/// stall"). A folder is listed again only when its mtime changed since its last complete
/// listing, and a listing longer than the budget goes on at the next look.
pub const LIST_BUDGET: usize = 4096;
pub const CHECK_BUDGET: usize = 256;
/// Bytes of `stall.json` read per look on average: each look adds this much to what may be
/// read, up to [`MAX_STALL_BYTES`] (the largest read).
pub const STALL_BYTES_PER_LOOK: u64 = 256 << 10;
pub const MAX_STALL_BYTES: u64 = dump::MAX_JSON_BYTES;
/// How long a dump folder is waited on for its `stall.json` after it was first seen (the hook
/// writes it within seconds: its native stacks take at most 64 × 200 ms).
pub const WAIT_FOR_STALL: Duration = Duration::from_secs(60);
/// A `stall.json` that is not the hook's record is read again while it is younger than this
/// (the crash handler writes it in place, so it may be caught half-written).
pub const STALL_SETTLE: Duration = Duration::from_secs(5);
/// A folder's mtime trusted to show every change made to it is at least this old: file
/// systems stamp with a coarse clock, so two changes within one of its ticks share a stamp.
pub const MTIME_SETTLE: Duration = Duration::from_secs(2);
/// A folder named more than this after the look is not the hook's: it names a folder by the
/// moment it detects the stall.
pub const FUTURE_US: i64 = 60_000_000;
/// Processes and threads of the trainer tree read.
pub const MAX_PIDS: usize = 256;
pub const MAX_THREADS: usize = 4096;
/// Busiest threads listed.
pub const TOP_THREADS: usize = 16;
/// The timelines have stopped when no timeline file changed for this long while the trainer
/// lives (and one had changed before).
pub const TIMELINE_QUIET: Duration = Duration::from_secs(120);
/// How often the watcher looks, and how often it walks the timelines.
pub const SCAN_EVERY: Duration = Duration::from_millis(500);
pub const TIMELINE_EVERY: Duration = Duration::from_secs(5);
/// Timeline files looked at per walk.
pub const MAX_TIMELINE_FILES: usize = 100_000;
/// How long the sink's finish waits for the watcher to write what is pending.
pub const FINISH_WAIT: Duration = Duration::from_secs(4);

/// Whether a tick's metric is kept for a record.
pub fn keep(m: &Metric) -> bool {
    match m.kind {
        MetricType::Gpu => true,
        MetricType::Pressure => true,
        MetricType::Trainer => m.dimension == d::PROCESS_TREE && m.name == Name::Static(n::CPU_PERCENT),
        MetricType::Host => m.name == Name::Static(n::ALL_CORES) && m.dimension == d::BUSY_PERCENT,
        MetricType::Accelerator => {
            matches!(
                m.dimension,
                d::GPU_XID_EVENTS
                    | d::GPU_ECC_SINGLE_BIT_EVENTS
                    | d::GPU_ECC_DOUBLE_BIT_EVENTS
                    | d::GPU_ECC_CORRECTED_VOLATILE
                    | d::GPU_ECC_UNCORRECTED_VOLATILE
                    | d::TRAINER_PROCESSES
                    | d::TRAINER_MEM_USED_BYTES
                    | d::TRAINER_SM_BUSY_PERCENT
                    | d::UNATTRIBUTED_PROCESSES
                    | d::UNATTRIBUTED_MEM_USED_BYTES
            ) || d::TOP_PROCESS.iter().flatten().any(|t| *t == m.dimension)
        }
        _ => false,
    }
}

/// The last [`RING_TICKS`] ticks' kept metrics.
#[derive(Debug, Default)]
pub struct Ring {
    ticks: VecDeque<(f64, Vec<Metric>)>,
}

impl Ring {
    /// Adds a tick, reusing the oldest tick's buffer once full.
    pub fn push(&mut self, wall_s: f64, metrics: &[Metric]) {
        let mut buf = if self.ticks.len() >= RING_TICKS {
            self.ticks.pop_front().map(|t| t.1).unwrap_or_default()
        } else {
            Vec::new()
        };
        buf.clear();
        buf.extend(metrics.iter().filter(|m| keep(m)).take(MAX_TICK_METRICS).copied());
        self.ticks.push_back((wall_s, buf));
    }

    /// The samples from `from_s` on, at most [`MAX_SAMPLES`] (the last ones).
    pub fn samples(&self, from_s: f64) -> Vec<HostSample> {
        let chosen: Vec<&(f64, Vec<Metric>)> = self.ticks.iter().filter(|t| t.0 >= from_s).collect();
        let skip = chosen.len().saturating_sub(MAX_SAMPLES);
        chosen[skip..].iter().map(|(t, m)| sample(*t, m)).collect()
    }
}

/// One tick's kept metrics as a record's sample.
pub fn sample(t_s: f64, metrics: &[Metric]) -> HostSample {
    let mut s = HostSample { t_s, ..HostSample::default() };
    for m in metrics {
        let name = m.name.to_string();
        match m.kind {
            MetricType::Gpu if m.dimension == d::GPU_UTILIZATION => {
                s.gpus.entry(name).or_default().0 = Some(m.value);
            }
            MetricType::Gpu if m.dimension == d::GPU_MEMORY_UTILIZATION => {
                s.gpus.entry(name).or_default().1 = Some(m.value);
            }
            MetricType::Pressure => {
                let kind = if m.dimension == d::FULL_STALLED_PERCENT { "full" } else { "some" };
                s.pressure.insert(format!("{}_{kind}", name.to_ascii_lowercase()), m.value);
            }
            MetricType::Trainer => s.trainer_cpu = Some(m.value),
            MetricType::Host => s.cpu_total = Some(m.value),
            MetricType::Accelerator
                if matches!(
                    m.dimension,
                    d::GPU_XID_EVENTS
                        | d::GPU_ECC_SINGLE_BIT_EVENTS
                        | d::GPU_ECC_DOUBLE_BIT_EVENTS
                        | d::GPU_ECC_CORRECTED_VOLATILE
                        | d::GPU_ECC_UNCORRECTED_VOLATILE
                ) =>
            {
                s.gpu_errors.insert(format!("{name}:{}", m.dimension), m.value);
            }
            MetricType::Accelerator => {
                s.gpu_processes.insert(format!("{name}:{}", m.dimension), m.value);
            }
            _ => {}
        }
    }
    s
}

/// One thread of the trainer tree as `/proc/<pid>/task/<tid>/stat` says.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadStat {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    pub state: char,
    pub cpu_ticks: u64,
}

/// Reads the threads of `pids` under `proc`, at most [`MAX_PIDS`] processes and
/// [`MAX_THREADS`] threads.
pub fn threads(proc: &Path, pids: &[u32]) -> Vec<ThreadStat> {
    let mut out = Vec::new();
    for &pid in pids.iter().take(MAX_PIDS) {
        let Ok(rd) = std::fs::read_dir(proc.join(pid.to_string()).join("task")) else { continue };
        for e in rd.flatten() {
            if out.len() >= MAX_THREADS {
                return out;
            }
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(text) = read_small(&e.path().join("stat")) else { continue };
            if let Some(t) = thread_stat(pid, tid, &text) {
                out.push(t);
            }
        }
    }
    out
}

fn read_small(p: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut buf = Vec::with_capacity(512);
    std::fs::File::open(p)?.take(4096).read_to_end(&mut buf)?;
    Ok(buf)
}

/// One `stat` line of a thread.
pub fn thread_stat(pid: u32, tid: u32, text: &[u8]) -> Option<ThreadStat> {
    let st = parse_pid_stat(text)?;
    let close = text.iter().rposition(|&b| b == b')')?;
    let state = text[close + 1..].iter().find(|b| !b.is_ascii_whitespace()).map(|&b| char::from(b))?;
    let name = String::from_utf8_lossy(stat_comm(text))
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    Some(ThreadStat { pid, tid, name, state, cpu_ticks: st.cpu_ticks })
}

/// The threads' states at the detection (`before`) counted, the busiest over `[before,
/// after]` (`secs` apart; without `after`, the threads at the detection with no CPU figure),
/// and the tree's state: `busy` when a thread was running or used at least a fifth of a core,
/// `asleep` when none did, `unknown` without threads.
pub fn summarise(
    before: &[ThreadStat],
    after: &[ThreadStat],
    secs: f64,
    hz: f64,
) -> (BTreeMap<String, u64>, Vec<ThreadCpu>, String) {
    let mut states = BTreeMap::new();
    for t in before {
        *states.entry(t.state.to_string()).or_insert(0) += 1;
    }
    let prev: HashMap<(u32, u32), u64> = before.iter().map(|t| ((t.pid, t.tid), t.cpu_ticks)).collect();
    let listed = if after.is_empty() { before } else { after };
    let mut busy: Vec<ThreadCpu> = listed
        .iter()
        .map(|t| ThreadCpu {
            pid: i64::from(t.pid),
            tid: i64::from(t.tid),
            name: t.name.clone(),
            state: t.state.to_string(),
            cpu_pct: prev
                .get(&(t.pid, t.tid))
                .filter(|_| !after.is_empty() && secs > 0.0 && hz > 0.0)
                .map(|p| t.cpu_ticks.saturating_sub(*p) as f64 / hz / secs * 100.0),
        })
        .collect();
    busy.sort_by(|a, b| {
        b.cpu_pct.unwrap_or(-1.0).total_cmp(&a.cpu_pct.unwrap_or(-1.0)).then(a.tid.cmp(&b.tid))
    });
    let running = before.iter().any(|t| t.state == 'R');
    let state = if before.is_empty() && after.is_empty() {
        "unknown"
    } else if running || busy.iter().any(|t| t.cpu_pct.is_some_and(|p| p >= 20.0)) {
        "busy"
    } else {
        "asleep"
    };
    busy.truncate(TOP_THREADS);
    (states, busy, state.to_owned())
}

/// A name from the trainer's folder, used as a path component of ours only when plain.
pub fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A record waiting for its [`AFTER`].
#[derive(Debug)]
struct Pending {
    node: String,
    /// `system/hangs/<node>/<name>.json`.
    name: String,
    trigger: &'static str,
    folder: Option<String>,
    detected_us: i64,
    seen_at: Instant,
    threads: Vec<ThreadStat>,
}

/// A folder listed a bit at a time: the identity and mtime (`(ino, mtime)`) at the start of its
/// last complete listing, and the listing under way with the identity at its start.
#[derive(Debug, Default)]
struct Listed {
    done: Option<FolderId>,
    reading: Option<(ofs::Stream, Option<FolderId>)>,
}

/// A folder's inode and mtime.
type FolderId = (u64, (i64, i64));

/// Whether `meta`'s mtime is old enough to be compared ([`MTIME_SETTLE`]).
fn settled(meta: &Meta) -> bool {
    SystemTime::now().duration_since(meta.modified()).is_ok_and(|age| age >= MTIME_SETTLE)
}

impl Listed {
    /// Reads on in the listing of `dir` (whose `lstat` is `meta`), starting one when its
    /// identity or mtime changed since the last complete one: at most `*budget` names, each
    /// given to `each`.
    fn read(
        &mut self,
        dir: impl FnOnce() -> Option<Dir>,
        meta: &Meta,
        budget: &mut usize,
        each: &mut dyn FnMut(&str),
    ) {
        let id = (meta.ino, meta.mtime);
        if self.reading.is_none() {
            if self.done == Some(id) {
                return;
            }
            let Some(s) = dir().and_then(|d| d.stream().ok()) else { return };
            // A listing begun under a young mtime is not taken as complete: one more follows.
            self.reading = Some((s, settled(meta).then_some(id)));
        }
        let Some((stream, started)) = &mut self.reading else { return };
        while *budget > 0 {
            *budget -= 1;
            match stream.next_name() {
                None => {
                    // Changed while read: listed again at the next look.
                    self.done = *started;
                    self.reading = None;
                    return;
                }
                Some(Ok(Ok(name))) => each(&name),
                Some(Ok(Err(_))) => {}
                Some(Err(_)) => {
                    self.reading = None;
                    return;
                }
            }
        }
    }
}

/// A dump folder waiting for its `stall.json`.
#[derive(Debug)]
struct Waiting {
    node: String,
    folder: String,
    detected_us: i64,
    first_seen: Instant,
    /// The folder's mtime when it was last looked into; `None`: look again.
    mtime: Option<(i64, i64)>,
}

/// The work of one look at the dump folders (for tests of the budget).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    pub names: usize,
    pub checks: usize,
}

/// What a look into a waiting dump folder found.
enum Check {
    Wait,
    Drop,
    Record,
}

/// The scanning side: what it has seen, what waits.
#[derive(Debug)]
pub struct Watcher {
    root: PathBuf,
    proc: PathBuf,
    /// The system node (`algo-1`), for `timeline_stopped` records.
    node: String,
    ring: Arc<Mutex<Ring>>,
    tree: TreePids,
    /// `framework/hangs/` and its node folders.
    hangs: Listed,
    nodes: Vec<(String, Listed)>,
    node_names: HashSet<String>,
    /// The node the next look starts at.
    next_node: usize,
    seen: HashSet<(String, String)>,
    waiting: VecDeque<Waiting>,
    /// Bytes of `stall.json` that may be read now.
    stall_bytes: u64,
    /// Well-named folders past [`MAX_SEEN`], not recorded.
    pub left_out: u64,
    told_left_out: bool,
    /// The budget of one look and what the last look did.
    pub budget: Work,
    pub work: Work,
    pending: Vec<Pending>,
    started_us: i64,
    hz: f64,
    /// The timelines' newest change, when it was last seen to move, and whether a record was
    /// made for this quiet spell.
    timeline_last: Option<SystemTime>,
    timeline_moved_at: Option<Instant>,
    timeline_recorded: bool,
    next_timeline: Option<Instant>,
    pub written: u64,
    pub failed: u64,
}

fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

impl Watcher {
    pub fn new(root: &Path, proc: &Path, node: &str, ring: Arc<Mutex<Ring>>, tree: TreePids) -> Watcher {
        Watcher {
            root: root.to_owned(),
            proc: proc.to_owned(),
            node: node.to_owned(),
            ring,
            tree,
            hangs: Listed::default(),
            nodes: Vec::new(),
            node_names: HashSet::new(),
            next_node: 0,
            seen: HashSet::new(),
            waiting: VecDeque::new(),
            stall_bytes: 0,
            left_out: 0,
            told_left_out: false,
            budget: Work { names: LIST_BUDGET, checks: CHECK_BUDGET },
            work: Work::default(),
            pending: Vec::new(),
            started_us: now_us(),
            hz: clock_ticks() as f64,
            timeline_last: None,
            timeline_moved_at: None,
            timeline_recorded: false,
            next_timeline: None,
            written: 0,
            failed: 0,
        }
    }

    /// One look: new dumps, the timelines, and the records whose time has come (all of them
    /// when `stopping`).
    pub fn step(&mut self, now: Instant, stopping: bool) {
        let Ok(dir) = Dir::open_root(&self.root, false) else { return };
        self.scan_dumps(&dir, now);
        if !stopping && self.next_timeline.is_none_or(|t| now >= t) {
            self.next_timeline = Some(now + TIMELINE_EVERY);
            self.scan_timelines(&dir, now);
        }
        let (due, wait): (Vec<Pending>, Vec<Pending>) =
            std::mem::take(&mut self.pending).into_iter().partition(|p| stopping || now >= p.seen_at + AFTER);
        self.pending = wait;
        for p in due {
            self.write(&dir, p, now);
        }
    }

    /// One bounded look at `framework/hangs/` (`docs/on-disk.md`, "Host state at a stall"):
    /// the folders whose mtime changed are listed on (at most [`Watcher::budget`] names), new
    /// well-named dump folders join the waiting ones, and at most the budget of waiting
    /// folders are looked into; one whose `stall.json` is the hook's record gets a record.
    fn scan_dumps(&mut self, root: &Dir, now: Instant) {
        self.work = Work::default();
        self.stall_bytes = (self.stall_bytes + STALL_BYTES_PER_LOOK).min(MAX_STALL_BYTES);
        let Ok(hangs) = root.sub(dump::HANGS_DIR, false) else { return };
        let mut names = self.budget.names;
        if let Ok(meta) = ofs::meta_of(&hangs) {
            let (nodes, node_names) = (&mut self.nodes, &mut self.node_names);
            self.hangs.read(|| hangs.try_clone().ok(), &meta, &mut names, &mut |name| {
                if nodes.len() < MAX_NODES && plain_name(name) && !node_names.contains(name) {
                    node_names.insert(name.to_owned());
                    nodes.push((name.to_owned(), Listed::default()));
                }
            });
        }
        // The nodes in turn, from where the last look stopped.
        let n = self.nodes.len();
        let first = self.next_node;
        let now_us = now_us();
        let oldest_us = self.started_us - 60_000_000;
        for k in 0..n {
            if names == 0 {
                break;
            }
            let i = (first + k) % n;
            self.next_node = (i + 1) % n;
            names -= 1;
            let (node, listed) = &mut self.nodes[i];
            let Ok(meta) = hangs.stat(node) else { continue };
            let (seen, waiting, left_out) = (&mut self.seen, &mut self.waiting, &mut self.left_out);
            listed.read(|| hangs.sub(node, false).ok(), &meta, &mut names, &mut |folder| {
                // Only the name is looked at here: no system call per planted folder.
                let Some((_, us)) = dump::parse_folder(folder) else { return };
                // An earlier job's dump in the same LocalPath, or a time the hook never names.
                if us < oldest_us || us > now_us + FUTURE_US || !plain_name(folder) {
                    return;
                }
                let key = (node.clone(), folder.to_owned());
                if seen.contains(&key) {
                    return;
                }
                if seen.len() >= MAX_SEEN {
                    *left_out += 1;
                    return;
                }
                seen.insert(key);
                waiting.push_back(Waiting {
                    node: node.clone(),
                    folder: folder.to_owned(),
                    detected_us: us,
                    first_seen: now,
                    mtime: None,
                });
            });
        }
        self.work.names = self.budget.names - names;
        if self.left_out > 0 && !self.told_left_out {
            self.told_left_out = true;
            log!("more than {MAX_SEEN} dump folders under framework/hangs: later ones get no host record");
        }
        let mut node_dirs: HashMap<String, Option<Dir>> = HashMap::new();
        for _ in 0..self.waiting.len().min(self.budget.checks) {
            let Some(mut w) = self.waiting.pop_front() else { break };
            if now.duration_since(w.first_seen) > WAIT_FOR_STALL {
                continue;
            }
            self.work.checks += 1;
            let node_dir = node_dirs.entry(w.node.clone()).or_insert_with(|| hangs.sub(&w.node, false).ok());
            let Some(node_dir) = node_dir.as_ref() else { continue };
            match self.check(node_dir, &mut w) {
                Check::Wait => self.waiting.push_back(w),
                Check::Drop => {}
                Check::Record => self.pending.push(Pending {
                    name: format!("{}.json", w.folder),
                    trigger: host_record::TRIGGER_DUMP,
                    folder: Some(format!("{}/{}", w.node, w.folder)),
                    node: w.node,
                    detected_us: w.detected_us,
                    seen_at: now,
                    threads: threads(&self.proc, &self.tree.get()),
                }),
            }
        }
    }

    /// Whether the dump folder `w` (in `node_dir`) holds the hook's `stall.json` now.
    fn check(&mut self, node_dir: &Dir, w: &mut Waiting) -> Check {
        // Not a folder (a file, a link): not the hook's.
        let Ok(meta) = node_dir.stat(&w.folder) else { return Check::Drop };
        if meta.kind() != Kind::Dir {
            return Check::Drop;
        }
        // Nothing new in it since the last look (a file renamed in changes its mtime).
        if w.mtime == Some(meta.mtime) {
            return Check::Wait;
        }
        let Ok(folder) = node_dir.sub(&w.folder, false) else { return Check::Drop };
        let stall = match folder.stat(dump::STALL_FILE) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                w.mtime = settled(&meta).then_some(meta.mtime);
                return Check::Wait;
            }
            Err(_) => return Check::Drop,
        };
        if !stall.is_plain_file() || stall.len > MAX_STALL_BYTES {
            return Check::Drop;
        }
        if stall.len > self.stall_bytes {
            // Read at a later look, when the bytes allowed have grown.
            w.mtime = None;
            return Check::Wait;
        }
        let Ok(Some(bytes)) = folder.read(dump::STALL_FILE, MAX_STALL_BYTES) else {
            return Check::Drop;
        };
        self.stall_bytes = self.stall_bytes.saturating_sub(bytes.len() as u64);
        if dump::hook_record(&bytes).is_ok() {
            return Check::Record;
        }
        // Caught half-written by the crash handler: read again while it is young.
        let young = SystemTime::now().duration_since(stall.modified()).is_ok_and(|age| age < STALL_SETTLE);
        if young {
            w.mtime = None;
            Check::Wait
        } else {
            Check::Drop
        }
    }

    fn scan_timelines(&mut self, dir: &Dir, now: Instant) {
        let want = |_: &str, _: bool| true;
        let w = ofs::walk(dir, "framework/pevents", &want);
        let newest = w.files.iter().take(MAX_TIMELINE_FILES).map(|(_, m)| m.modified()).max();
        let Some(newest) = newest else { return };
        if self.timeline_last.is_none_or(|l| newest > l) {
            // Moving (the first sight counts as a move only when a later one follows).
            if self.timeline_last.is_some() {
                self.timeline_moved_at = Some(now);
            }
            self.timeline_last = Some(newest);
            self.timeline_recorded = false;
            return;
        }
        let Some(moved) = self.timeline_moved_at else { return };
        let alive = !self.tree.get().is_empty();
        if alive && !self.timeline_recorded && now.duration_since(moved) >= TIMELINE_QUIET {
            self.timeline_recorded = true;
            let at = now_us();
            log!(
                "the trainer's timelines have not changed for {} s while it runs: recording the host",
                now.duration_since(moved).as_secs()
            );
            self.pending.push(Pending {
                node: self.node.clone(),
                name: format!("timeline-{at}.json"),
                trigger: host_record::TRIGGER_TIMELINE_STOPPED,
                folder: None,
                detected_us: at,
                seen_at: now,
                threads: threads(&self.proc, &self.tree.get()),
            });
        }
    }

    fn write(&mut self, dir: &Dir, p: Pending, now: Instant) {
        let after = threads(&self.proc, &self.tree.get());
        let secs = now.duration_since(p.seen_at).as_secs_f64();
        let (trainer_threads, busy_threads, trainer_cpu_state) = summarise(&p.threads, &after, secs, self.hz);
        let from_s = p.detected_us as f64 / 1e6 - BEFORE_S;
        let samples = self.ring.lock().unwrap_or_else(PoisonError::into_inner).samples(from_s);
        let record = HostState {
            version: 1,
            node: p.node.clone(),
            trigger: p.trigger.to_owned(),
            folder: p.folder,
            detected_us: p.detected_us,
            samples,
            trainer_threads,
            busy_threads,
            trainer_cpu_state,
        };
        let bytes = match serde_json::to_vec_pretty(&record) {
            Ok(b) => b,
            Err(_) => return,
        };
        let done = dir
            .sub(&format!("{}/{}", host_record::HOST_DIR, p.node), true)
            .and_then(|d| ofs::write_new(&d, &p.name, &std::process::id().to_string(), &bytes));
        match done {
            Ok(true) => {
                self.written += 1;
                log!("host state at the stall written to system/hangs/{}/{}", p.node, p.name);
            }
            Ok(false) => {}
            Err(e) => {
                self.failed += 1;
                log!("cannot write system/hangs/{}/{}: {e}", p.node, p.name);
            }
        }
    }
}

/// The sink: the tick's kept metrics into the ring; the watcher's thread beside it.
#[derive(Debug)]
pub struct HangSink {
    ring: Arc<Mutex<Ring>>,
    stop: Arc<AtomicBool>,
    done: Option<mpsc::Receiver<()>>,
    /// Ticks that found the ring busy and were left out of it.
    pub busy: u64,
}

impl HangSink {
    /// Starts the watcher's thread over LocalPath `root`; `None` when it cannot start (then
    /// nothing is recorded at a stall, and sampling goes on).
    pub fn start(root: &Path, proc: &Path, node: &str, tree: TreePids) -> Option<HangSink> {
        let ring = Arc::new(Mutex::new(Ring::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let mut w = Watcher::new(root, proc, node, Arc::clone(&ring), tree);
        let stopping = Arc::clone(&stop);
        let spawned = std::thread::Builder::new().name("trainprof-hangs".into()).spawn(move || {
            crate::pipeline::cost::enroll(crate::pipeline::cost::Part::HangWatch);
            loop {
                let stop = stopping.load(Ordering::Relaxed);
                w.step(Instant::now(), stop);
                crate::pipeline::cost::flush();
                if stop {
                    break;
                }
                let mut slept = Duration::ZERO;
                while slept < SCAN_EVERY && !stopping.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    slept += Duration::from_millis(100);
                }
            }
            let _ = tx.send(());
        });
        match spawned {
            Ok(_) => Some(HangSink { ring, stop, done: Some(rx), busy: 0 }),
            Err(e) => {
                log!("cannot start the stall watcher ({e}): no host state is recorded at a stall");
                None
            }
        }
    }
}

impl Sink for HangSink {
    fn cost_part(&self) -> crate::pipeline::cost::Part {
        crate::pipeline::cost::Part::HangSink
    }

    fn tick(&mut self, tick: &Tick<'_>) {
        match self.ring.try_lock() {
            Ok(mut r) => r.push(tick.wall_s, tick.metrics),
            Err(_) => self.busy += 1,
        }
    }

    fn finish(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(rx) = self.done.take() {
            let _ = rx.recv_timeout(FINISH_WAIT);
        }
    }
}

impl Drop for HangSink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(kind: MetricType, name: Name, dimension: &'static str, value: f64) -> Metric {
        Metric { kind, name, dimension, value }
    }

    #[test]
    fn the_ring_keeps_what_a_record_needs_and_is_bounded() {
        let tick = [
            m(MetricType::Gpu, Name::gpu(0), d::GPU_UTILIZATION, 3.0),
            m(MetricType::Gpu, Name::gpu(0), d::GPU_MEMORY_UTILIZATION, 40.0),
            m(MetricType::Accelerator, Name::device(0), d::GPU_XID_EVENTS, 1.0),
            m(MetricType::Accelerator, Name::device(0), d::TRAINER_MEM_USED_BYTES, 1e9),
            m(MetricType::Accelerator, Name::device(0), d::GPU_POWER_WATTS, 300.0),
            m(MetricType::Pressure, Name::Static(n::PRESSURE_IO), d::FULL_STALLED_PERCENT, 12.0),
            m(MetricType::Trainer, Name::Static(n::CPU_PERCENT), d::PROCESS_TREE, 0.5),
            m(MetricType::Host, Name::Static(n::ALL_CORES), d::BUSY_PERCENT, 7.0),
        ];
        let mut r = Ring::default();
        for i in 0..(RING_TICKS + 10) {
            r.push(1000.0 + i as f64, &tick);
        }
        assert_eq!(r.ticks.len(), RING_TICKS);
        assert!(r.ticks.iter().all(|t| t.1.len() == 7), "power is not kept");
        let s = r.samples(1000.0 + (RING_TICKS as f64) + 5.0);
        assert_eq!(s.len(), 5);
        let s = &s[0];
        assert_eq!(s.gpus["gpu0"], (Some(3.0), Some(40.0)));
        assert_eq!(s.gpu_errors["device0:XidEvents"], 1.0);
        assert_eq!(s.gpu_processes["device0:TrainerMemUsedBytes"], 1e9);
        assert_eq!(s.pressure["io_full"], 12.0);
        assert_eq!((s.trainer_cpu, s.cpu_total), (Some(0.5), Some(7.0)));
        assert_eq!(r.samples(0.0).len(), MAX_SAMPLES);
    }

    fn stat(tid: u32, state: char, ticks: u64) -> String {
        format!("{tid} (py thr) {state} 1 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0 100 0 10")
    }

    #[test]
    fn threads_say_busy_or_asleep() {
        let a = thread_stat(7, 8, stat(8, 'S', 100).as_bytes()).unwrap();
        assert_eq!((a.state, a.cpu_ticks, a.name.as_str()), ('S', 100, "py thr"));
        let before = [a.clone(), ThreadStat { tid: 9, ..a.clone() }];
        // Thread 9 spun: 200 ticks in 2 s at 100 Hz is a whole core.
        let after = [a.clone(), ThreadStat { tid: 9, cpu_ticks: 300, ..a.clone() }];
        let (states, busy, s) = summarise(&before, &after, 2.0, 100.0);
        assert_eq!(states["S"], 2);
        assert_eq!(s, "busy");
        assert_eq!((busy[0].tid, busy[0].cpu_pct), (9, Some(100.0)));
        let (_, _, s) = summarise(&before, &before, 2.0, 100.0);
        assert_eq!(s, "asleep");
        // The trainer gone by the writing: the threads at the detection, no CPU figure.
        let (states, busy, s) = summarise(&before, &[], 2.0, 100.0);
        assert_eq!((states["S"], busy.len(), busy[0].cpu_pct, s.as_str()), (2, 2, None, "asleep"));
        assert_eq!(summarise(&[], &[], 2.0, 100.0).2, "unknown");
        assert!(thread_stat(1, 1, b"garbage").is_none());
    }

    /// `stall.json` as the hook writes it (docs/formats.md, "Hang and crash dumps").
    fn hook_stall(step: i64, us: i64) -> String {
        format!(
            r#"{{"version": 1, "kind": "stall", "node": "0-algo-1", "pid": 42, "mode": "train", "step": {step}, "step_started_us": {}, "detected_us": {us}, "threshold_s": 1.0, "median_step_s": 0.005, "last_completed_step": {}, "signal": null, "ring": [], "open_windows": [], "hook": {{"enabled": true}}}}"#,
            us - 2_000_000,
            step - 1
        )
    }

    fn watcher(root: &Path) -> Watcher {
        let proc = root.parent().unwrap().join("proc");
        Watcher::new(root, &proc, "algo-1", Arc::new(Mutex::new(Ring::default())), TreePids::default())
    }

    fn records(root: &Path) -> Vec<String> {
        let mut v: Vec<String> = walk_names(&root.join("system/hangs"));
        v.sort();
        v
    }

    fn walk_names(p: &Path) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(p) else { return Vec::new() };
        let mut out = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type().unwrap().is_dir() {
                out.extend(walk_names(&e.path()).into_iter().map(|n| format!("{name}/{n}")));
            } else {
                out.push(name);
            }
        }
        out
    }

    #[test]
    fn only_a_dump_the_hook_wrote_gets_a_record() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("out");
        let node = root.join("framework/hangs/0-algo-1");
        let t = now_us();
        let plant = |i: i64, stall: Option<&[u8]>| {
            let f = node.join(format!("{i}-{}", t + i));
            std::fs::create_dir_all(&f).unwrap();
            if let Some(b) = stall {
                std::fs::write(f.join("stall.json"), b).unwrap();
            }
            f
        };
        // Planted: an empty stall.json, an empty object, NaN, nested too deep, another
        // program's JSON, one past the bytes read, none at all.
        plant(1, Some(b""));
        plant(2, Some(b"{}"));
        plant(3, Some(hook_stall(3, t + 3).replace("1.0", "NaN").as_bytes()));
        plant(4, Some(format!("{}{}", "[".repeat(200), "]".repeat(200)).as_bytes()));
        plant(5, Some(br#"{"version": 2, "kind": "stall", "pid": 1, "step": 5, "detected_us": 1}"#));
        let big = plant(6, None);
        let f = std::fs::File::create(big.join("stall.json")).unwrap();
        f.set_len(MAX_STALL_BYTES + 1).unwrap();
        plant(7, None);
        // A link to a real record, and a folder that is a link to a real dump.
        let real_elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&real_elsewhere).unwrap();
        std::fs::write(real_elsewhere.join("stall.json"), hook_stall(8, t + 8)).unwrap();
        let linked = plant(8, None);
        std::os::unix::fs::symlink(real_elsewhere.join("stall.json"), linked.join("stall.json")).unwrap();
        std::os::unix::fs::symlink(&real_elsewhere, node.join(format!("9-{}", t + 9))).unwrap();
        // The hook's dump.
        plant(10, Some(hook_stall(10, t + 10).as_bytes()));
        let mut w = watcher(&root);
        let t0 = Instant::now();
        for k in 0..4 {
            w.step(t0 + AFTER * k, false);
        }
        w.step(t0 + AFTER * 4, true);
        assert_eq!(records(&root), [format!("0-algo-1/10-{}.json", t + 10)]);
        assert_eq!(w.written, 1);
    }

    #[test]
    fn a_look_reads_at_most_its_budget_and_an_unchanged_folder_is_not_listed_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("out");
        let node = root.join("framework/hangs/0-algo-1");
        let t = now_us();
        for i in 0..60 {
            let f = node.join(format!("{i}-{}", t + i));
            std::fs::create_dir_all(&f).unwrap();
            std::fs::write(f.join("stall.json"), "").unwrap();
        }
        let real = node.join(format!("60-{}", t + 60));
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("stall.json"), hook_stall(60, t + 60)).unwrap();
        let mut w = watcher(&root);
        w.budget = Work { names: 10, checks: 3 };
        let t0 = Instant::now();
        let mut looks = Vec::new();
        for k in 0..80u32 {
            w.step(t0 + SCAN_EVERY * k, false);
            looks.push(w.work);
        }
        assert!(looks.iter().all(|l| l.names <= 10 && l.checks <= 3), "{looks:?}");
        // The first looks spend the whole budget on the listing.
        assert_eq!((looks[0].names, looks[1].names), (10, 10));
        w.step(t0 + SCAN_EVERY * 80, true);
        assert_eq!(records(&root), [format!("0-algo-1/60-{}.json", t + 60)]);
        // Once listed with a settled mtime, an unchanged folder costs its lstat only.
        let old = SystemTime::now() - MTIME_SETTLE * 2;
        for d in [root.join("framework/hangs"), node.clone()] {
            std::fs::File::open(&d).unwrap().set_modified(old).unwrap();
        }
        let mut w = watcher(&root);
        w.budget = Work { names: 10, checks: 3 };
        for k in 0..20u32 {
            w.step(t0 + SCAN_EVERY * k, false);
        }
        w.step(t0 + SCAN_EVERY * 21, false);
        assert_eq!(w.work.names, 1);
        // A new folder changes the mtime: it is seen.
        std::fs::create_dir_all(node.join(format!("61-{}", t + 61))).unwrap();
        w.step(t0 + SCAN_EVERY * 22, false);
        assert!(w.work.names > 1);
    }

    #[test]
    fn a_new_stall_dump_gets_a_record_of_ours_not_in_the_trainers_folder() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("out");
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(proc.join("42/task/42")).unwrap();
        std::fs::write(proc.join("42/task/42/stat"), stat(42, 'S', 5)).unwrap();
        let tree = TreePids::default();
        tree.publish(&[42]);
        let ring = Arc::new(Mutex::new(Ring::default()));
        let t = now_us();
        ring.lock()
            .unwrap()
            .push(t as f64 / 1e6, &[m(MetricType::Gpu, Name::gpu(0), d::GPU_UTILIZATION, 0.0)]);
        let mut w = Watcher::new(&root, &proc, "algo-1", Arc::clone(&ring), tree);
        let folder = format!("framework/hangs/0-algo-1/30-{t}");
        std::fs::create_dir_all(root.join(&folder)).unwrap();
        // Not complete yet: nothing.
        let t0 = Instant::now();
        w.step(t0, false);
        assert!(w.pending.is_empty());
        std::fs::write(root.join(&folder).join("stall.json"), hook_stall(30, t)).unwrap();
        // Hostile names are not used as ours; an old dump is not recorded.
        std::fs::create_dir_all(root.join(format!("framework/hangs/a b/1-{t}"))).unwrap();
        std::fs::write(root.join(format!("framework/hangs/a b/1-{t}/stall.json")), hook_stall(1, t)).unwrap();
        std::fs::create_dir_all(root.join("framework/hangs/0-algo-1/1-1000000000000000")).unwrap();
        std::fs::write(
            root.join("framework/hangs/0-algo-1/1-1000000000000000/stall.json"),
            hook_stall(1, 1_000_000_000_000_000),
        )
        .unwrap();
        w.step(t0, false);
        assert_eq!(w.pending.len(), 1);
        w.step(t0 + Duration::from_millis(500), false);
        assert_eq!(w.written, 0, "waits for AFTER");
        w.step(t0 + AFTER, false);
        assert_eq!(w.written, 1);
        let rec = root.join(format!("system/hangs/0-algo-1/30-{t}.json"));
        let h: HostState = serde_json::from_slice(&std::fs::read(rec).unwrap()).unwrap();
        assert_eq!(h.folder.as_deref(), Some(format!("0-algo-1/30-{t}").as_str()));
        assert_eq!(h.trigger, "dump");
        assert_eq!(h.trainer_threads["S"], 1);
        assert_eq!(h.trainer_cpu_state, "asleep");
        assert_eq!(h.samples.len(), 1);
        // Nothing was written into the trainer's folder, and a dump is recorded once.
        let names: Vec<_> =
            std::fs::read_dir(root.join(&folder)).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, ["stall.json"]);
        w.step(t0 + AFTER * 3, true);
        assert_eq!(w.written, 1);
    }

    #[test]
    fn timelines_that_stop_while_the_trainer_runs_get_a_record() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("out");
        let tl = root.join("framework/pevents/2026112603");
        std::fs::create_dir_all(&tl).unwrap();
        let file = |name: &str, age_s: u64| {
            let f = std::fs::File::create(tl.join(name)).unwrap();
            f.set_modified(SystemTime::now() - Duration::from_secs(age_s)).unwrap();
        };
        file("1_0-a_pythontimeline.json", 100);
        let tree = TreePids::default();
        let mut w = Watcher::new(
            &root,
            &dir.path().join("proc"),
            "algo-1",
            Arc::new(Mutex::new(Ring::default())),
            tree.clone(),
        );
        let t0 = Instant::now();
        w.step(t0, false);
        // Never seen moving: no record however long it stays.
        w.step(t0 + TIMELINE_QUIET * 2, false);
        assert!(w.pending.is_empty());
        file("2_0-a_pythontimeline.json", 50);
        let t1 = t0 + TIMELINE_QUIET * 2 + TIMELINE_EVERY;
        w.step(t1, false);
        assert!(w.timeline_moved_at.is_some());
        // Quiet, but the trainer is gone: nothing.
        w.step(t1 + TIMELINE_QUIET + TIMELINE_EVERY, false);
        assert!(w.pending.is_empty());
        tree.publish(&[1]);
        let t2 = t1 + TIMELINE_QUIET + TIMELINE_EVERY * 2;
        w.step(t2, false);
        assert_eq!(w.pending.len(), 1);
        w.step(t2 + AFTER, false);
        assert_eq!(w.written, 1);
        let written: Vec<_> =
            std::fs::read_dir(root.join("system/hangs/algo-1")).unwrap().flatten().collect();
        assert_eq!(written.len(), 1);
        let h: HostState = serde_json::from_slice(&std::fs::read(written[0].path()).unwrap()).unwrap();
        assert_eq!((h.trigger.as_str(), h.folder.as_deref()), ("timeline_stopped", None));
        // Once per quiet spell.
        w.step(t2 + TIMELINE_QUIET * 3, false);
        assert!(w.pending.is_empty());
    }
}
