//! Reading a LocalPath (formats in `docs/formats.md`), strictly through
//! `trainprof_output::fs`: no link is followed, every file is opened as a regular file
//! relative to an open folder, and everything is streamed (one line, one event at a time) or
//! read up to a bound, so that memory does not grow with a file's size.
//!
//! One module per format: [`marshal`] (cProfile's stats), [`pickle`] (PyTorch memory snapshots), [`python`] (cProfile and
//! pyinstrument windows), [`native`] (`profile.pb.gz`, `flamegraph.svg`) with [`demangle`],
//! [`dumps`] (hang and crash dumps, the agent's host records), [`node_gpus`] (the node
//! record), [`agent_cost`] (the agent's own cost). This file holds the system lines and the timelines, and what every reader shares:
//! [`Skipped`], the bounded reads ([`open_limited`], [`read_file`]) and the text helpers
//! ([`printable`], [`shown`], [`readable`]).

pub mod agent_cost;
pub mod demangle;
pub mod dumps;
pub mod hook_cost;
pub mod inspector;
pub mod job_files;
pub mod marshal;
pub mod memory;
pub mod native;
pub mod node_gpus;
pub mod pickle;
pub mod python;

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read as _};

use trainprof_output::fs::{self as ofs, Dir};
use trainprof_output::protocol::metric::{self, MetricType, dimension as d, name as n};
use trainprof_output::protocol::python_window::{self, EdgeMode, EdgePhase, PythonProfilerDir};
use trainprof_output::protocol::system_line::{self, SysLine, for_each_line};
use trainprof_output::protocol::timeline_event::{Bases, file_events};
pub use trainprof_output::protocol::timeline_event::{
    Event, MAX_ARG_STRING, MAX_ARG_VALUES, MAX_ARGS, MAX_EVENT_BYTES, MAX_PHASES, PLAUSIBLE_S, TimelineCost,
    plausible_s, plausible_us, read_timeline,
};
pub use trainprof_output::text::{is_terminal_control, printable, shown};

/// A timeline file larger than this is skipped: events are streamed, one at a time, and no
/// writer makes files this large (the hook rotates at 10 MB by default).
pub const MAX_TIMELINE_BYTES: u64 = 1 << 30;
/// Largest stats file read (cProfile / pyinstrument).
pub const MAX_STATS_BYTES: u64 = 64 << 20;
/// A system file larger than this is skipped (the agent writes one a minute: ~40 MB at 10
/// ticks a second on 256 cores).
pub const MAX_SYSTEM_BYTES: u64 = 1 << 30;
/// Nodes of system lines being grouped into ticks, and per tick at most so many cores and
/// GPUs (a `p4d` has 96 cores and 8 GPUs): more are skipped and counted.
pub const MAX_NODES: usize = 1024;
pub const MAX_TICK_CORES: usize = 4096;
/// GPUs per node in a tick: as many as the aggregates keep per node
/// (`analysis::collect::MAX_GPUS_PER_NODE`, which is this).
pub const MAX_TICK_GPUS: usize = 64;
/// A file mostly of holes ([`ofs::Meta::is_mostly_holes`], the uploader's rule too) is not
/// read.
pub use ofs::{SPARSE_MIN_BYTES, SPARSE_RATIO};
/// A skip reason is cut to this many bytes.
const MAX_REASON: usize = 512;

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

    /// Adds a reason, at most `MAX_REASON` bytes, control characters escaped (a file name
    /// is the trainer's).
    pub fn push(&mut self, s: impl ToString) {
        let s = s.to_string();
        // Bounded: a tree full of planted links must not grow the report without end.
        if self.0.len() < 200 {
            self.0.push(printable(&s, MAX_REASON));
        } else if self.0.len() == 200 {
            self.0.push("… more skipped entries not listed".to_owned());
        }
    }
}

/// `x` as a person reads it, never hundreds of digits: in scientific notation with at most
/// three significant digits (`1e308`, `-2.5e12`) from a billion up, and below a thousandth
/// when no `decimals` are asked (`1e-300`); else as usual, with `decimals` decimals or as
/// short as it reads back. A trainer's file or a typed flag may hold any number.
pub fn readable(x: f64, decimals: Option<usize>) -> String {
    let a = x.abs();
    let sci = x.is_finite() && (a >= 1e9 || (decimals.is_none() && x != 0.0 && a < 1e-3));
    if !sci {
        return match decimals {
            Some(d) if x.is_finite() => format!("{x:.d$}"),
            _ => x.to_string(),
        };
    }
    let s = format!("{x:.2e}");
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let mantissa =
        if mantissa.contains('.') { mantissa.trim_end_matches('0').trim_end_matches('.') } else { mantissa };
    format!("{mantissa}e{exp}")
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
    /// `pressure` / `CPU`, `Memory`, `IO` / `SomeStalledPercent` (read by `compare` only).
    pub pressure: [Option<f64>; 3],
    /// `accelerator` rows of all GPUs (`docs/report.md`, "Many ranks"): the throttle
    /// reasons OR'd (`ThrottleReasonsMask`, and the `Throttle<Reason>` rows), the largest
    /// `XidEvents` count, and PCIe bytes per second (tx + rx) summed.
    pub gpu_throttle: u64,
    pub gpu_xid: Option<f64>,
    pub gpu_pcie: Option<f64>,
    /// `accelerator` / `device<N>` / `TrainerMemUsedBytes`: the trainer tree's GPU memory on
    /// device N (docs/formats.md, "GPU: the trainer's processes"), at most
    /// `MAX_TICK_CORES` devices.
    pub gpu_trainer_mem: Vec<(u32, f64)>,
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

    /// The GPU `name` of this tick; `None` past [`MAX_TICK_GPUS`] (counted in
    /// `gpus_left_out`, which the report and the trace name as a cap reached).
    fn gpu(&mut self, name: &str) -> Option<&mut (String, Option<f64>, Option<f64>)> {
        let i = match self.gpus.iter().position(|g| g.0 == name) {
            Some(i) => i,
            None if self.gpus.len() < MAX_TICK_GPUS => {
                self.gpus.push((name.to_owned(), None, None));
                self.gpus.len() - 1
            }
            None => {
                self.gpus_left_out += 1;
                return None;
            }
        };
        Some(&mut self.gpus[i])
    }

    /// Takes one line into the tick; false when it was dropped (a core or GPU past the
    /// caps, [`MAX_TICK_CORES`], [`MAX_TICK_GPUS`]).
    pub fn add(&mut self, l: &SysLine) -> bool {
        let v = l.value;
        let core = || metric::indexed(&l.name, metric::CORE);
        let ty = MetricType::from_written(&l.ty);
        match (ty, l.name.as_str(), l.dimension.as_str()) {
            (_, _, d::CPU_UTILIZATION) => {
                if let Some(c) = core() {
                    if self.cores.len() >= MAX_TICK_CORES {
                        return false;
                    }
                    self.cores.push((c, v));
                }
            }
            (_, _, d::IO_WAIT_PERCENTAGE) => {
                if let Some(c) = core() {
                    if self.core_iowait.len() >= MAX_TICK_CORES {
                        return false;
                    }
                    self.core_iowait.push((c, v));
                }
            }
            (Some(MetricType::Host), n::ALL_CORES, d::BUSY_PERCENT) => self.cpu_total = Some(v),
            (Some(MetricType::Host), n::ALL_CORES, d::IO_WAIT_PERCENT) => self.iowait_total = Some(v),
            (_, n::MEMORY_USED_PERCENT, _) => self.memory = Some(v),
            (_, name, d::GPU_UTILIZATION) => match self.gpu(name) {
                Some(g) => g.1 = Some(v),
                None => return false,
            },
            (_, name, d::GPU_MEMORY_UTILIZATION) => match self.gpu(name) {
                Some(g) => g.2 = Some(v),
                None => return false,
            },
            (Some(MetricType::Io), n::READ_THROUGHPUT, d::NONE) => self.io_read = Some(v),
            (Some(MetricType::Io), n::WRITE_THROUGHPUT, d::NONE) => self.io_write = Some(v),
            (_, n::RECEIVE_BYTES_PER_SECOND, d::ALGORITHM) => {
                self.net_rx = Some(self.net_rx.unwrap_or(0.0) + v)
            }
            (_, n::TRANSMIT_BYTES_PER_SECOND, d::ALGORITHM) => {
                self.net_tx = Some(self.net_tx.unwrap_or(0.0) + v)
            }
            (Some(MetricType::Trainer), n::CPU_PERCENT, d::PROCESS_TREE) => self.trainer_cpu = Some(v),
            (Some(MetricType::Trainer), n::RSS_BYTES, d::PROCESS_TREE) => self.trainer_rss = Some(v),
            (Some(MetricType::Clock), n::SYNCHRONISED, d::KERNEL) => self.clock_synchronised = Some(v),
            (Some(MetricType::Clock), n::MAX_ERROR_MICROS, d::KERNEL) => self.clock_max_error_us = Some(v),
            (Some(MetricType::Clock), n::ESTIMATED_ERROR_MICROS, d::KERNEL) => {
                self.clock_est_error_us = Some(v)
            }
            (Some(MetricType::Pressure), n::PRESSURE_CPU, d::SOME_STALLED_PERCENT) => {
                self.pressure[0] = Some(v)
            }
            (Some(MetricType::Pressure), n::PRESSURE_MEMORY, d::SOME_STALLED_PERCENT) => {
                self.pressure[1] = Some(v)
            }
            (Some(MetricType::Pressure), n::PRESSURE_IO, d::SOME_STALLED_PERCENT) => {
                self.pressure[2] = Some(v)
            }
            (Some(MetricType::Accelerator), _, d::GPU_THROTTLE_MASK)
                if v.is_finite() && v >= 0.0 && v < u64::MAX as f64 =>
            {
                self.gpu_throttle |= v as u64
            }
            (Some(MetricType::Accelerator), name, d::TRAINER_MEM_USED_BYTES) => {
                if let Some(i) = metric::indexed(name, metric::DEVICE) {
                    if self.gpu_trainer_mem.len() >= MAX_TICK_CORES {
                        return false;
                    }
                    self.gpu_trainer_mem.push((i, v));
                }
            }
            (Some(MetricType::Accelerator), _, d::GPU_XID_EVENTS) => {
                self.gpu_xid = Some(self.gpu_xid.map_or(v, |x| x.max(v)))
            }
            (
                Some(MetricType::Accelerator),
                _,
                d::GPU_PCIE_TX_BYTES_PER_SECOND | d::GPU_PCIE_RX_BYTES_PER_SECOND,
            ) => self.gpu_pcie = Some(self.gpu_pcie.unwrap_or(0.0) + v),
            (Some(MetricType::Accelerator), _, dim) if v == 1.0 => {
                if let Some(f) = d::THROTTLE_FLAGS.iter().find(|f| f.1 == dim) {
                    self.gpu_throttle |= f.0;
                }
            }
            _ => {}
        }
        true
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

/// Opens the file at `rel` for reading as the uploader would send it (a regular file with
/// one link: [`ofs::Meta::is_plain_file`]), at most `max` bytes long and not mostly holes;
/// returns a reader of the bytes it held at open, never more (a writer may go on
/// appending). The error is the reason to skip it: the file and the kind of problem, never
/// its content.
pub fn open_limited(root: &Dir, rel: &str, max: u64) -> Result<(io::Take<File>, u64), Unread> {
    let (_, _, f) = ofs::open_at(root, rel, false).map_err(|e| Unread::Io(rel.to_owned(), e))?;
    let m = ofs::meta_of(&f).map_err(|e| Unread::Io(rel.to_owned(), e))?;
    if !m.is_plain_file() {
        return Err(Unread::Links(rel.to_owned(), m.nlink));
    }
    if m.len > max {
        return Err(Unread::TooLong(rel.to_owned(), m.len, max));
    }
    if m.is_mostly_holes() {
        return Err(Unread::Holes(rel.to_owned(), m.len, m.allocated));
    }
    Ok((f.take(m.len), m.len))
}

/// Why a file was not read, as [`Skipped`] lists it: the file and the kind of problem,
/// never its content.
#[derive(Debug, thiserror::Error)]
pub enum Unread {
    #[error("{0}: {1}")]
    Io(String, io::Error),
    #[error("{0}: has {1} hard links: not read (nor uploaded)")]
    Links(String, u64),
    #[error("{0}: {1} bytes, more than the {2} read: not read")]
    TooLong(String, u64, u64),
    #[error("{0}: {1} bytes with {2} on disk (mostly holes): not read")]
    Holes(String, u64, u64),
}

/// Every tick of every node under `system/incremental/`, in file-name order (so in time
/// order per node), as `f(node, tick)`.
pub fn system_ticks(root: &Dir, skipped: &mut Skipped, mut f: impl FnMut(&str, Tick)) {
    let want = |name: &str, is_dir: bool| is_dir || (name.ends_with(".json") && !name.starts_with('.'));
    let mut pending: HashMap<String, Tick> = HashMap::new();
    for rel in files(root, "system/incremental", &want, skipped) {
        let file = match open_limited(root, &rel, MAX_SYSTEM_BYTES) {
            Ok((f, _)) => f,
            Err(e) => {
                skipped.push(e);
                continue;
            }
        };
        let (res, c) = system_lines(file, &mut pending, &mut f);
        if let Err(e) = res {
            skipped.push(format!("{rel}: {e}"));
        }
        if c.bad > 0 {
            skipped.push(format!("{rel}: {} lines that are not system metrics skipped", c.bad));
        }
        if c.implausible > 0 {
            skipped.push(format!(
                "{rel}: {} lines with a Timestamp outside 2000-01-01..2100-01-01 skipped",
                c.implausible
            ));
        }
        if c.dropped > 0 {
            skipped.push(format!(
                "{rel}: {} lines past {MAX_NODES} nodes, {MAX_TICK_CORES} cores or {MAX_TICK_GPUS} GPUs a tick skipped",
                c.dropped
            ));
        }
    }
    flush(pending, &mut f);
}

/// Hands on the ticks still being grouped, by node name.
fn flush(pending: HashMap<String, Tick>, f: &mut dyn FnMut(&str, Tick)) {
    let mut rest: Vec<_> = pending.into_iter().collect();
    rest.sort_by(|a, b| a.0.cmp(&b.0));
    for (node, t) in rest {
        // A system file under LocalPath may have been planted: its node is shown escaped.
        f(&shown(&node), t);
    }
}

/// What reading system lines dropped, and what it cost.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SystemCost {
    /// Lines read (each one a tick's line or skipped).
    pub lines: u64,
    /// Lines that are not system metrics, or longer than `MAX_LINE`.
    pub bad: u64,
    /// Lines with a Timestamp outside [`PLAUSIBLE_S`].
    pub implausible: u64,
    /// Lines past [`MAX_NODES`], [`MAX_TICK_CORES`] or [`MAX_TICK_GPUS`].
    pub dropped: u64,
}

/// Reads one system file's lines from `r` into ticks as `system_ticks` does, for tests of
/// the bounds: `(result, cost)`.
pub fn read_system(r: impl io::Read, f: &mut dyn FnMut(&str, Tick)) -> (io::Result<()>, SystemCost) {
    let mut pending = HashMap::new();
    let out = system_lines(r, &mut pending, f);
    flush(pending, f);
    out
}

/// Groups the lines of `r` into ticks per node (`pending`), handing on each tick that a
/// later time closes.
fn system_lines(
    r: impl io::Read,
    pending: &mut HashMap<String, Tick>,
    f: &mut dyn FnMut(&str, Tick),
) -> (io::Result<()>, SystemCost) {
    let mut c = SystemCost::default();
    let res = for_each_line(BufReader::new(r), |line| {
        c.lines += 1;
        let l: SysLine = match system_line::parse(line) {
            Some(l) => l,
            None => {
                if !line.iter().all(u8::is_ascii_whitespace) {
                    c.bad += 1;
                }
                return;
            }
        };
        if !l.value.is_finite() {
            c.bad += 1;
            return;
        }
        if !plausible_s(l.timestamp) {
            c.implausible += 1;
            return;
        }
        let full = pending.len() >= MAX_NODES;
        match pending.get_mut(&l.node) {
            Some(t) if (t.t_s - l.timestamp).abs() <= SNAPSHOT_S => {
                if !t.add(&l) {
                    c.dropped += 1;
                }
            }
            Some(t) => {
                let mut next = Tick { t_s: l.timestamp, ..Tick::default() };
                next.add(&l);
                let done = std::mem::replace(t, next);
                f(&shown(&l.node), done);
            }
            None if full => c.dropped += 1,
            None => {
                let mut t = Tick { t_s: l.timestamp, ..Tick::default() };
                t.add(&l);
                pending.insert(l.node.clone(), t);
            }
        }
    });
    match res {
        Ok(long) => {
            c.bad += long;
            c.lines += long;
            (Ok(()), c)
        }
        Err(e) => (Err(e), c),
    }
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
        let node = shown(node);
        let node = node.as_ref();
        let last: i64 = name.split('_').next().and_then(|t| t.parse().ok()).unwrap_or(i64::MAX);
        if !keep_file(node, last) {
            continue;
        }
        let file = match open_limited(root, &rel, MAX_TIMELINE_BYTES) {
            Ok((f, _)) => f,
            Err(e) => {
                skipped.push(e);
                continue;
            }
        };
        let (res, c) = file_events(file, node, &mut bases, &mut f);
        if let Err(e) = res {
            skipped.push(format!("{rel}: {e} (events before the error were read)"));
        }
        if c.implausible > 0 {
            skipped.push(format!(
                "{rel}: {} events with a time outside 2000-01-01..2100-01-01 skipped",
                c.implausible
            ));
        }
        if c.args_cut > 0 {
            skipped.push(format!(
                "{rel}: args of {} events cut to {MAX_ARGS} keys, {MAX_ARG_VALUES} values and strings of {MAX_ARG_STRING} bytes",
                c.args_cut
            ));
        }
        if c.phases_dropped > 0 {
            skipped.push(format!(
                "{rel}: {} phases past {MAX_PHASES} not named (their events read as Unknown)",
                c.phases_dropped
            ));
        }
    }
}

/// A Python-profiling window found on disk.
#[derive(Debug, Clone)]
pub struct StatsFile {
    pub framework: String,
    pub profiler: PythonProfilerDir,
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
            python_window::STATS_FILES.contains(&name)
        }
    };
    let mut out = Vec::new();
    for rel in files(root, "framework", &want, skipped) {
        let parts: Vec<&str> = rel.split('/').collect();
        let [_, fw, prof, node, window, file] = parts.as_slice() else { continue };
        let profiler = PythonProfilerDir::parse(prof).filter(|p| p.stats_file() == *file);
        if let Some(profiler) = profiler {
            out.push(StatsFile {
                framework: shown(fw).into_owned(),
                profiler,
                node: shown(node).into_owned(),
                window: shown(window).into_owned(),
                rel: rel.clone(),
            });
        }
    }
    out
}

/// The bytes of a stats file, at most `max` ([`open_limited`]); the error is the reason
/// to skip it.
/// node → the relative path of its newest record under `folder` (`<folder>/<node>/<µs>.json`,
/// the node record's naming: docs/formats.md, "Node record"), for at most `max_nodes` nodes;
/// what the walk refused is in `skipped`.
pub fn newest_per_node(
    dir: &Dir,
    folder: &str,
    max_nodes: usize,
    skipped: &mut Skipped,
) -> std::collections::BTreeMap<String, String> {
    use trainprof_output::protocol::node_record;
    let want =
        |name: &str, is_dir: bool| !name.starts_with('.') && (is_dir || node_record::name_us(name).is_some());
    let w = ofs::walk(dir, folder, &want);
    for r in w.refused {
        skipped.push(r);
    }
    let mut newest: std::collections::BTreeMap<String, (u64, String)> = std::collections::BTreeMap::new();
    for (rel, _) in w.files {
        let parts: Vec<&str> = rel.split('/').collect();
        let [_, _, node, name] = parts[..] else { continue };
        let Some(us) = node_record::name_us(name) else { continue };
        if skipped.1.contains(&rel) || (!newest.contains_key(node) && newest.len() >= max_nodes) {
            continue;
        }
        let e = newest.entry(node.to_owned()).or_insert((us, rel.clone()));
        if us > e.0 {
            *e = (us, rel);
        }
    }
    newest.into_iter().map(|(node, (_, rel))| (node, rel)).collect()
}

pub fn read_file(root: &Dir, rel: &str, max: u64) -> Result<Vec<u8>, Unread> {
    let (mut f, len) = open_limited(root, rel, max)?;
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    f.read_to_end(&mut bytes).map_err(|e| Unread::Io(rel.to_owned(), e))?;
    Ok(bytes)
}

/// One half of a window folder name: `<mode>-<step>-<phase>-<time µs>`.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowEdge {
    pub mode: EdgeMode,
    /// `None` for `*`.
    pub step: Option<i64>,
    pub phase: EdgePhase,
    pub time_us: f64,
}

/// Parses `<start half>_<end half>` (`docs/formats.md`, "Directory pattern").
pub fn parse_window(name: &str) -> Option<(WindowEdge, WindowEdge)> {
    let (a, b) = name.split_once('_')?;
    Some((edge(a)?, edge(b)?))
}

fn edge(s: &str) -> Option<WindowEdge> {
    let mut p = s.splitn(4, '-');
    let mode = EdgeMode::parse(p.next()?);
    let step = p.next()?;
    let phase = EdgePhase::parse(p.next()?);
    let time_us: f64 = p.next()?.parse().ok()?;
    let step = if step == "*" { None } else { Some(step.parse().ok()?) };
    plausible_s(time_us / 1e6).then_some(WindowEdge { mode, step, phase, time_us })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_numbers_however_large_or_small() {
        assert_eq!(readable(1e308, None), "1e308");
        assert_eq!(readable(-2.5e12, Some(1)), "-2.5e12");
        assert_eq!(readable(1.23456e9, Some(1)), "1.23e9");
        assert_eq!(readable(1e-300, None), "1e-300");
        assert_eq!(readable(1e-300, Some(2)), "0.00");
        assert_eq!(readable(300.0, None), "300");
        assert_eq!(readable(12.345, Some(1)), "12.3");
        assert_eq!(readable(0.0, None), "0");
        assert_eq!(readable(f64::INFINITY, Some(1)), "inf");
        assert_eq!(crate::compare::stats::pct(1e308), "1e308");
        assert_eq!(crate::compare::stats::pct(-0.01), "0.0");
        assert_eq!(crate::page::markup::num(Some(1e308)), "1e308");
        assert_eq!(crate::page::markup::num(Some(1234.5)), "1234");
        assert_eq!(crate::page::markup::duration(Some(1e308)), "1e308 s");
    }

    #[test]
    fn window_names_parse() {
        let (a, b) =
            parse_window("train-2-stepstart-1795316597980690.5_train-2-forwardpassend-1795316597980765.2")
                .unwrap();
        assert_eq!(a.step, Some(2));
        assert_eq!(a.phase, EdgePhase::StepStart);
        assert_eq!(b.phase, EdgePhase::ForwardPassEnd);
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
        let mut text = vec![b'x'; (system_line::MAX_LINE as usize) * 2];
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
        let t0 = 1_795_400_100.0;
        text += &line("cpu", "cpu0", "CPUUtilization", 10.0, "algo-1", t0);
        text += &line("cpu", "cpu1", "CPUUtilization", 30.0, "algo-1", t0);
        text += &line("gpu", "gpu0", "GPUUtilization", 5.0, "algo-1", t0);
        text += &line("memory", "MemoryUsedPercent", "", 40.0, "algo-1", t0);
        text += "not json\n";
        text += &line("cpu", "cpu0", "CPUUtilization", 50.0, "algo-1", t0 + 0.5);
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

    fn sys_line(name: &str, t: &str) -> String {
        format!(
            "{{\"Type\":\"cpu\",\"Name\":\"{name}\",\"Dimension\":\"CPUUtilization\",\"Value\":1,\"NodeId\":\"algo-1\",\"Timestamp\":{t}}}\n"
        )
    }

    /// A LocalPath with `files` (relative path, content) in it.
    fn local_path(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (rel, bytes) in files {
            let p = dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, bytes).unwrap();
        }
        dir
    }

    const SYS: &str = "system/incremental/2026112203/1795400100.algo-1.json";
    const TL: &str = "framework/pevents/2026112203/1795400100000000_0-algo-1_pythontimeline.json";

    fn ticks_of(dir: &std::path::Path) -> (Vec<f64>, Vec<String>) {
        let root = Dir::open_root(dir, false).unwrap();
        let mut skipped = Skipped::default();
        let mut ticks = Vec::new();
        system_ticks(&root, &mut skipped, |_, t| ticks.push(t.t_s));
        (ticks, skipped.0)
    }

    fn events_of(dir: &std::path::Path) -> (Vec<(i64, i64)>, Vec<String>) {
        let root = Dir::open_root(dir, false).unwrap();
        let mut skipped = Skipped::default();
        let mut got = Vec::new();
        timeline_events(&root, &mut skipped, &|_, _| true, |e| got.push((e.start_us, e.dur_us)));
        (got, skipped.0)
    }

    #[test]
    fn implausible_system_timestamps_are_skipped_and_counted() {
        // 1e18 put the report's 60 s walk into an endless loop (t + 60 == t).
        let mut text = String::new();
        for t in ["1e18", "-5", "0", "4102444800", "1e308", "NaN", "1795400100", "1795400101"] {
            text += &sys_line("cpu0", t);
        }
        let dir = local_path(&[(SYS, text.as_bytes())]);
        let (ticks, skipped) = ticks_of(dir.path());
        assert_eq!(ticks, [1_795_400_100.0, 1_795_400_101.0]);
        assert_eq!(
            skipped,
            [
                format!("{SYS}: 1 lines that are not system metrics skipped"),
                format!("{SYS}: 5 lines with a Timestamp outside 2000-01-01..2100-01-01 skipped"),
            ]
        );
    }

    #[test]
    fn implausible_event_times_are_skipped_and_counted() {
        let tl = |base: &str, ts: &str, dur: &str| {
            format!(
                r#"[{{"name": "process_name", "ph": "M", "pid": 0, "args": {{"start_time_since_epoch_in_micros": {base}}}}},
{{"name": "Step:ModeKeys.TRAIN", "pid": 1, "ph": "X", "ts": {ts}, "dur": {dur}, "args": {{}}}},
{{"name": "Step:ModeKeys.TRAIN", "pid": 1, "ph": "X", "ts": 5, "dur": 5, "args": {{}}}}]"#
            )
        };
        let ok = tl("1795400000000000", "1", "2");
        let cases = [
            tl("1000000000000000000", "1", "2"),
            tl("-5", "1", "2"),
            tl("1795400000000000", "1e300", "2"),
            tl("1795400000000000", "-1795400000000000", "2"),
            tl("1795400000000000", "1", "1e17"),
        ];
        let dir = local_path(&[(TL, ok.as_bytes())]);
        assert_eq!(
            events_of(dir.path()),
            (vec![(1_795_400_000_000_001, 2), (1_795_400_000_000_005, 5)], vec![])
        );
        for (i, text) in cases.iter().enumerate() {
            let dir = local_path(&[(TL, text.as_bytes())]);
            let (got, skipped) = events_of(dir.path());
            let n = if i < 2 { 2 } else { 1 };
            assert_eq!(got.len(), 2 - n, "{text}");
            assert_eq!(
                skipped,
                [format!("{TL}: {n} events with a time outside 2000-01-01..2100-01-01 skipped")],
                "{text}"
            );
        }
    }

    #[test]
    fn one_event_with_millions_of_args_is_refused_at_the_event_bound() {
        // 5 M keys (54 MB) in one event took 745 MB; now the read stops at MAX_EVENT_BYTES.
        let mut text = br#"[{"name": "a", "pid": 1, "ph": "X", "ts": 1, "dur": 1, "args": {"start_time_since_epoch_in_micros": 1795400000000000, "step_num": "1""#.to_vec();
        for i in 0..5_000_000u32 {
            text.extend_from_slice(format!(",\"{i}\":0").as_bytes());
        }
        text.extend_from_slice(b"}}]");
        assert!(text.len() > 50 << 20);
        let mut n = 0;
        let (r, cost) = read_timeline(&text[..], "0-algo-1", &mut |_| n += 1);
        assert_eq!(
            r.map_err(|e| e.to_string()),
            Err(format!("an event holds more than {MAX_EVENT_BYTES} bytes at line 1 column 1048578"))
        );
        assert_eq!((n, cost.largest_event), (0, MAX_EVENT_BYTES + 1));
        // Under the event bound: the first MAX_ARGS keys are kept, the event read.
        let mut text =
            br#"[{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 1795400000000000}}, {"name": "a", "pid": 1, "ph": "X", "ts": 1, "dur": 1, "args": {"step_num": "3""#.to_vec();
        for i in 0..1000u32 {
            text.extend_from_slice(format!(",\"{i}\":0").as_bytes());
        }
        text.extend_from_slice(br#", "big": [0"#);
        text.extend(std::iter::repeat_n(&b",0"[..], MAX_ARG_VALUES).flatten());
        text.extend_from_slice(b"]}}]");
        let mut got = Vec::new();
        let (r, cost) = read_timeline(&text[..], "0-algo-1", &mut |e| got.push((e.args.len(), e.step)));
        assert_eq!(r, Ok(()));
        assert_eq!(got, [(MAX_ARGS, Some(3))]);
        assert_eq!((cost.events, cost.args_cut), (1, 1));
        // Nested values beyond MAX_ARG_VALUES are dropped whole, the rest kept.
        let mut text = br#"[{"name": "a", "pid": 1, "ph": "X", "ts": 1795400000000000, "dur": 1, "args": {"small": [1, [2, {"x": "y"}]], "big": [0"#.to_vec();
        text.extend(std::iter::repeat_n(&b",[0]"[..], MAX_ARG_VALUES).flatten());
        text.extend_from_slice(br#"], "after": 1}}]"#);
        let mut got = Vec::new();
        let (r, cost) = read_timeline(&text[..], "0-algo-1", &mut |e| {
            got.push(serde_json::Value::Object(e.args.clone()))
        });
        assert_eq!(r, Ok(()));
        assert_eq!(got, [serde_json::json!({"small": [1, [2, {"x": "y"}]]})]);
        assert_eq!(cost.args_cut, 1);
    }

    #[test]
    fn a_hard_linked_timeline_is_not_read_nor_echoed() {
        // A file the trainer's user cannot read, linked into the LocalPath: the report (root)
        // printed its content in the skip reason. Now it is refused as the uploader refuses it.
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("shadow");
        std::fs::write(&secret, "\"root:SECRET:19000:0:99999:7:::\"").unwrap();
        let hour = dir.path().join("framework/pevents/2026112203");
        std::fs::create_dir_all(&hour).unwrap();
        std::fs::hard_link(&secret, dir.path().join(TL)).unwrap();
        let (got, skipped) = events_of(dir.path());
        assert!(got.is_empty());
        assert_eq!(skipped, [format!("{TL}: has 2 hard links: not read (nor uploaded)")]);
        // The same content in a file of its own is read, and the reason does not quote it.
        std::fs::remove_file(dir.path().join(TL)).unwrap();
        std::fs::rename(&secret, dir.path().join(TL)).unwrap();
        let (got, skipped) = events_of(dir.path());
        assert!(got.is_empty());
        assert_eq!(
            skipped,
            [format!(
                "{TL}: not an array of trace events (a value of the wrong type at line 1, column 32) (events before the error were read)"
            )]
        );
        // Nor a hard-linked system or stats file.
        let dir = local_path(&[("x", &sys_line("cpu0", "1795400100").into_bytes())]);
        std::fs::create_dir_all(dir.path().join(SYS).parent().unwrap()).unwrap();
        std::fs::hard_link(dir.path().join("x"), dir.path().join(SYS)).unwrap();
        assert_eq!(
            ticks_of(dir.path()),
            (vec![], vec![format!("{SYS}: has 2 hard links: not read (nor uploaded)")])
        );
        let root = Dir::open_root(dir.path(), false).unwrap();
        assert_eq!(
            read_file(&root, SYS, 1 << 20).map_err(|e| e.to_string()),
            Err(format!("{SYS}: has 2 hard links: not read (nor uploaded)"))
        );
    }

    #[test]
    fn skip_reasons_are_bounded_and_escaped() {
        let mut s = Skipped::default();
        s.push(format!("a\x1b]0;title\x07b{}", "x".repeat(10_000)));
        assert!(s.0[0].starts_with("a\\x1b]0;title\\x07bxx"), "{}", s.0[0]);
        assert!(s.0[0].len() <= MAX_REASON + '…'.len_utf8() && s.0[0].ends_with('…'));
    }

    #[test]
    fn sparse_files_are_refused_by_their_allocated_bytes() {
        // A 20 GB sparse system file (a few KB on disk) was read for 56 s.
        for len in [20_000_000_000u64, 512 << 20] {
            let dir = local_path(&[(SYS, sys_line("cpu0", "1795400100").as_bytes())]);
            let f = std::fs::OpenOptions::new().write(true).open(dir.path().join(SYS)).unwrap();
            f.set_len(len).unwrap();
            let allocated = ofs::meta_of(&f).unwrap().allocated;
            assert!(allocated < 1 << 20, "{allocated}: this file system does not make sparse files");
            let (ticks, skipped) = ticks_of(dir.path());
            assert!(ticks.is_empty());
            let why = if len > MAX_SYSTEM_BYTES {
                format!("{SYS}: {len} bytes, more than the {MAX_SYSTEM_BYTES} read: not read")
            } else {
                format!("{SYS}: {len} bytes with {allocated} on disk (mostly holes): not read")
            };
            assert_eq!(skipped, [why]);
        }
    }

    #[test]
    fn a_growing_file_is_read_to_its_size_at_open() {
        // Each tick read appends a line of a later tick, as a writer that never stops would:
        // read to the end, that would be 100,000 more ticks.
        let mut text = String::new();
        for i in 0..1000 {
            text += &sys_line("cpu0", &format!("{}", 1_795_400_000 + i));
        }
        let dir = local_path(&[(SYS, text.as_bytes())]);
        let mut w = std::fs::OpenOptions::new().append(true).open(dir.path().join(SYS)).unwrap();
        let root = Dir::open_root(dir.path(), false).unwrap();
        let mut skipped = Skipped::default();
        let mut ticks = 0u32;
        system_ticks(&root, &mut skipped, |_, _| {
            ticks += 1;
            if ticks < 100_000 {
                use std::io::Write as _;
                w.write_all(sys_line("cpu0", &format!("{}", 1_795_500_000 + ticks)).as_bytes()).unwrap();
            }
        });
        assert_eq!(ticks, 1000);
        assert!(skipped.0.is_empty(), "{:?}", skipped.0);
    }
}
