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
//! (`trainprof_report::hangs::HostState` is the shape, shared by writer and reader).
//!
//! Two parts: a [`Sink`] that copies the tick's few relevant metrics into a bounded ring
//! (a `try_lock`: a tick never waits; a tick that finds the ring busy is counted and left
//! out), and a thread that scans LocalPath twice a second and writes the records. Everything
//! is bounded: the ring's ticks, the dump folders remembered, the threads read, the files
//! walked.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use trainprof_output::fs::{self as ofs, Dir};
use trainprof_output::protocol::metric::{MetricType, Name, dimension as d, name as n};
use trainprof_report::hangs::{HostSample, HostState, ThreadCpu};

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

/// The scanning side: what it has seen, what waits.
#[derive(Debug)]
pub struct Watcher {
    root: PathBuf,
    proc: PathBuf,
    /// The system node (`algo-1`), for `timeline_stopped` records.
    node: String,
    ring: Arc<Mutex<Ring>>,
    tree: TreePids,
    seen: HashSet<(String, String)>,
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
            seen: HashSet::new(),
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

    fn scan_dumps(&mut self, dir: &Dir, now: Instant) {
        let want =
            |name: &str, is_dir: bool| if is_dir { !name.starts_with('.') } else { name == "stall.json" };
        let w = ofs::walk(dir, "framework/hangs", &want);
        for (rel, _) in w.files {
            let parts: Vec<&str> = rel.split('/').collect();
            let [_, _, node, folder, _] = parts.as_slice() else { continue };
            let key = ((*node).to_owned(), (*folder).to_owned());
            if self.seen.contains(&key) || self.seen.len() >= MAX_SEEN {
                continue;
            }
            self.seen.insert(key);
            let Some((_, detected_us)) = trainprof_report::hangs::parse_folder(folder) else { continue };
            // An earlier job's dump in the same LocalPath.
            if detected_us < self.started_us - 60_000_000 || !plain_name(node) || !plain_name(folder) {
                continue;
            }
            self.pending.push(Pending {
                node: (*node).to_owned(),
                name: format!("{folder}.json"),
                trigger: "dump",
                folder: Some(format!("{node}/{folder}")),
                detected_us,
                seen_at: now,
                threads: threads(&self.proc, &self.tree.get()),
            });
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
                trigger: "timeline_stopped",
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
            .sub(&format!("system/hangs/{}", p.node), true)
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
            loop {
                let stop = stopping.load(Ordering::Relaxed);
                w.step(Instant::now(), stop);
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
    use trainprof_output::protocol::metric::{ACCELERATOR, GPU, HOST, PRESSURE, TRAINER};

    fn m(kind: MetricType, name: Name, dimension: &'static str, value: f64) -> Metric {
        Metric { kind, name, dimension, value }
    }

    #[test]
    fn the_ring_keeps_what_a_record_needs_and_is_bounded() {
        let tick = [
            m(GPU, Name::gpu(0), d::GPU_UTILIZATION, 3.0),
            m(GPU, Name::gpu(0), d::GPU_MEMORY_UTILIZATION, 40.0),
            m(ACCELERATOR, Name::device(0), d::GPU_XID_EVENTS, 1.0),
            m(ACCELERATOR, Name::device(0), d::TRAINER_MEM_USED_BYTES, 1e9),
            m(ACCELERATOR, Name::device(0), d::GPU_POWER_WATTS, 300.0),
            m(PRESSURE, Name::Static(n::PRESSURE_IO), d::FULL_STALLED_PERCENT, 12.0),
            m(TRAINER, Name::Static(n::CPU_PERCENT), d::PROCESS_TREE, 0.5),
            m(HOST, Name::Static(n::ALL_CORES), d::BUSY_PERCENT, 7.0),
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
        ring.lock().unwrap().push(t as f64 / 1e6, &[m(GPU, Name::gpu(0), d::GPU_UTILIZATION, 0.0)]);
        let mut w = Watcher::new(&root, &proc, "algo-1", Arc::clone(&ring), tree);
        let folder = format!("framework/hangs/0-algo-1/30-{t}");
        std::fs::create_dir_all(root.join(&folder)).unwrap();
        // Not complete yet: nothing.
        let t0 = Instant::now();
        w.step(t0, false);
        assert!(w.pending.is_empty());
        std::fs::write(root.join(&folder).join("stall.json"), "{}").unwrap();
        // Hostile names are not used as ours; an old dump is not recorded.
        std::fs::create_dir_all(root.join(format!("framework/hangs/a b/1-{t}"))).unwrap();
        std::fs::write(root.join(format!("framework/hangs/a b/1-{t}/stall.json")), "{}").unwrap();
        std::fs::create_dir_all(root.join("framework/hangs/0-algo-1/1-1000000000000000")).unwrap();
        std::fs::write(root.join("framework/hangs/0-algo-1/1-1000000000000000/stall.json"), "{}").unwrap();
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
