//! System samplers: CPU, memory, disks, network (procfs), the container's cgroup, GPUs
//! (NVML) and the trainer's process tree.
//!
//! Each sampler is *probed* once (`Ok(None)`: not applicable here, e.g. no GPU, no cgroup
//! limit) and then *sampled* every tick into one reused [`Metrics`] buffer. Parsing is a
//! pure function over bytes, tested on fixture text; reading goes through [`ProcFile`],
//! which keeps the file open and re-reads it from offset 0. Every root (`/proc`, `/sys`,
//! `/sys/fs/cgroup`) comes from one [`Roots`] value so that tests run on fake trees.
//!
//! Rates (CPU %, bytes per second, IOPS) are deltas between two reads divided by the
//! monotonic time between them; the probe takes the first read, so the first tick already
//! has a rate.
//!
//! Every metric follows one vocabulary (`docs/formats.md`, "System metrics: vocabulary";
//! [`vocabulary_ok`] checks each one pushed in debug builds): under the Types `cpu`, `gpu`
//! and `memory` only the percentages smdebug's analysis stack expects there; everything
//! else under a Type of ours whose name contains none of those words ([`HOST`], [`RAM`],
//! [`ACCELERATOR`], …), with Names and Dimensions that no rule or chart takes for a core,
//! a GPU or a percentage.

use std::borrow::Cow;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod cgroup;
pub mod clock;
pub mod cpu;
pub mod disk;
pub mod gpu;
pub mod memory;
pub mod net;
pub mod pressure;
pub mod probe;
pub mod process;
pub mod tree_pids;

/// Where the kernel's pseudo-filesystems are. Tests point this at a fake tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    pub proc: PathBuf,
    pub sys: PathBuf,
    pub cgroup: PathBuf,
}

impl Roots {
    /// The real machine.
    pub fn host() -> Roots {
        Roots::under(Path::new("/"))
    }

    /// `<dir>/proc`, `<dir>/sys`, `<dir>/sys/fs/cgroup`.
    pub fn under(dir: &Path) -> Roots {
        Roots { proc: dir.join("proc"), sys: dir.join("sys"), cgroup: dir.join("sys/fs/cgroup") }
    }
}

/// A metric's `Name`: a fixed string, a prefix and an index (`cpu3`, `gpu0`), or a process
/// (`pid1234-python`), so that a tick allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    Static(&'static str),
    Indexed(&'static str, u32),
    /// `pid<pid>-<label>`: one process of the trainer's tree.
    Process(u32, Label),
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Name::Static(s) => f.write_str(s),
            Name::Indexed(p, i) => write!(f, "{p}{i}"),
            Name::Process(pid, label) => write!(f, "pid{pid}-{label}"),
        }
    }
}

/// A short name from outside (a process's `comm`, at most 15 bytes), kept to the bytes a
/// JSON string and a chart label take as they are: ASCII letters, digits, `_`, `.` and `-`;
/// any other byte becomes `_`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Label {
    bytes: [u8; 15],
    len: u8,
}

impl Label {
    pub fn sanitized(raw: &[u8]) -> Label {
        let mut l = Label::default();
        for (slot, &b) in l.bytes.iter_mut().zip(raw) {
            let keep = b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-');
            *slot = if keep { b } else { b'_' };
            l.len += 1;
        }
        l
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII bytes are ever stored.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A metric's `Type` (`docs/formats.md`, "System metrics: vocabulary"): the five that
/// smdebug's readers and rules know, and ours, chosen so that no reader or rule takes them
/// for one of those. [`MetricType::as_str`] is what is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricType {
    Cpu,
    Gpu,
    Memory,
    Io,
    Network,
    /// Ours: the whole machine's figures that are not per core (all cores together).
    Host,
    /// Ours: memory in bytes (used, and the limit the percentage was taken of).
    Ram,
    /// Ours: per-GPU figures other than the two percentages (power, temperature, clock, bytes).
    Accelerator,
    /// Ours: the container's cgroup (quota, throttling, its own I/O).
    Container,
    /// Ours: the trainer's process tree (`trainprof run`).
    Trainer,
    /// Ours: the agent's own cost.
    Agent,
    /// Ours: pressure stall information (share of time tasks waited for CPU, memory, I/O).
    Pressure,
    /// Ours: the kernel's clock synchronisation state and error bounds.
    Clock,
}

impl MetricType {
    pub const ALL: [MetricType; 13] = [
        MetricType::Cpu,
        MetricType::Gpu,
        MetricType::Memory,
        MetricType::Io,
        MetricType::Network,
        MetricType::Host,
        MetricType::Ram,
        MetricType::Accelerator,
        MetricType::Container,
        MetricType::Trainer,
        MetricType::Agent,
        MetricType::Pressure,
        MetricType::Clock,
    ];

    /// The `Type` as written in the system metrics files.
    pub const fn as_str(self) -> &'static str {
        match self {
            MetricType::Cpu => "cpu",
            MetricType::Gpu => "gpu",
            MetricType::Memory => "memory",
            MetricType::Io => "i/o",
            MetricType::Network => "network",
            MetricType::Host => "host",
            MetricType::Ram => "ram",
            MetricType::Accelerator => "accelerator",
            MetricType::Container => "container",
            MetricType::Trainer => "trainer",
            MetricType::Agent => "agent",
            MetricType::Pressure => "pressure",
            MetricType::Clock => "clock",
        }
    }

    /// The type written as `s`, if it is one of ours.
    pub fn from_written(s: &str) -> Option<MetricType> {
        MetricType::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl std::fmt::Display for MetricType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for MetricType {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

pub const CPU: MetricType = MetricType::Cpu;
pub const GPU: MetricType = MetricType::Gpu;
pub const MEMORY: MetricType = MetricType::Memory;
pub const IO: MetricType = MetricType::Io;
pub const NETWORK: MetricType = MetricType::Network;
pub const HOST: MetricType = MetricType::Host;
pub const RAM: MetricType = MetricType::Ram;
pub const ACCELERATOR: MetricType = MetricType::Accelerator;
pub const CONTAINER: MetricType = MetricType::Container;
pub const TRAINER: MetricType = MetricType::Trainer;
pub const AGENT: MetricType = MetricType::Agent;
pub const PRESSURE: MetricType = MetricType::Pressure;
pub const CLOCK: MetricType = MetricType::Clock;

/// Whether a metric follows the vocabulary of `docs/formats.md`, "System metrics:
/// vocabulary". smdebug's `PandasFrameAnalysis.get_utilization_stats` takes every row whose
/// Type *contains* `cpu`, `gpu` or `memory` as a percentage of that resource; the rules count
/// every Name with Dimension `CPUUtilization` as a core and match `GPUUtilization`,
/// `GPUMemoryUtilization`, `I/OWaitPercentage`, `Algorithm` and the Name
/// `MemoryUsedPercent` under any Type; the numpy reader keeps Names starting with `cpu` /
/// `gpu`; the charts draw Dimensions with `CPU`, `GPU`, `Utilization` or `Memory` in them as
/// percentages.
pub fn vocabulary_ok(kind: &str, name: &str, dimension: &str) -> bool {
    let indexed = |prefix: &str| {
        name.strip_prefix(prefix).is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
    };
    match MetricType::from_written(kind) {
        Some(MetricType::Cpu) => {
            indexed("cpu") && matches!(dimension, "CPUUtilization" | "I/OWaitPercentage")
        }
        Some(MetricType::Gpu) => {
            indexed("gpu") && matches!(dimension, "GPUUtilization" | "GPUMemoryUtilization")
        }
        Some(MetricType::Memory) => name == "MemoryUsedPercent" && dimension.is_empty(),
        Some(MetricType::Io) => name != "MemoryUsedPercent" && dimension.is_empty(),
        Some(MetricType::Network) => dimension == "Algorithm",
        _ => {
            let taken_type = ["cpu", "gpu", "memory", "i/o", "network"].iter().any(|w| kind.contains(w));
            let drawn_as_percent =
                ["CPU", "GPU", "Utilization", "Memory"].iter().any(|w| dimension.contains(w));
            let rule_dimension = matches!(dimension, "Algorithm" | "Platform" | "")
                || dimension.starts_with("CPUUtilization")
                || dimension.contains("I/OWait");
            let is_percent = dimension.ends_with("Percent");
            let bad = [taken_type, percent_like_name(name), drawn_as_percent && !is_percent, rule_dimension];
            !bad.contains(&true)
        }
    }
}

/// A Name that a rule or reader would take for a core, a GPU or the memory percentage.
fn percent_like_name(name: &str) -> bool {
    name.starts_with("cpu") || name.starts_with("gpu") || name == "MemoryUsedPercent"
}

/// One line of a system metrics file, less the node id and timestamp that the whole tick
/// shares (`docs/formats.md`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metric {
    /// `Type`.
    pub kind: MetricType,
    pub name: Name,
    pub dimension: &'static str,
    pub value: f64,
}

/// The metrics of one tick; cleared and refilled, never shrunk.
#[derive(Debug, Default)]
pub struct Metrics {
    items: Vec<Metric>,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Adds a metric; a value that is not finite (a division by a zero interval, a broken
    /// counter) is left out, because JSON has no NaN.
    pub fn push(&mut self, kind: MetricType, name: Name, dimension: &'static str, value: f64) {
        debug_assert!(
            vocabulary_ok(kind.as_str(), &name.to_string(), dimension),
            "{kind}/{name}/{dimension} is outside the vocabulary of docs/formats.md"
        );
        if value.is_finite() {
            self.items.push(Metric { kind, name, dimension, value });
        }
    }

    pub fn clear(&mut self) {
        self.items.clear();
    }

    pub fn as_slice(&self) -> &[Metric] {
        &self.items
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The value of one metric, for tests and summaries.
    pub fn get(&self, kind: &str, name: &str, dimension: &str) -> Option<f64> {
        self.items
            .iter()
            .find(|m| m.kind.as_str() == kind && m.dimension == dimension && m.name.to_string() == name)
            .map(|m| m.value)
    }
}

/// What is wrong with a file's text; [`SampleError::Parse`] names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A line or a value of the wrong shape.
    #[error("expected {expected}, got {got}")]
    Expected { expected: Cow<'static, str>, got: String },
    /// A part that should be a number.
    #[error("{what} is not a number in {line}")]
    NotANumber { what: String, line: String },
    /// A line or a key that must be there.
    #[error("no {0}")]
    Missing(Cow<'static, str>),
    /// A value that cannot be used.
    #[error("bad {what} {got}")]
    Bad { what: &'static str, got: String },
    /// Anything else, in words.
    #[error("{0}")]
    Other(Cow<'static, str>),
}

impl From<&'static str> for ParseError {
    fn from(s: &'static str) -> ParseError {
        ParseError::Other(s.into())
    }
}

impl From<String> for ParseError {
    fn from(s: String) -> ParseError {
        ParseError::Other(s.into())
    }
}

/// Why a read failed. The loop logs a sampler's error once per change of state and counts
/// every failure; it never stops.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("cannot parse {path}: {what}")]
    Parse { path: PathBuf, what: ParseError },
    #[error("{device}: {what}")]
    Device { device: String, what: String },
}

impl SampleError {
    pub fn io(path: &Path, source: io::Error) -> SampleError {
        SampleError::Io { path: path.to_owned(), source }
    }

    pub fn parse(path: &Path, what: impl Into<ParseError>) -> SampleError {
        SampleError::Parse { path: path.to_owned(), what: what.into() }
    }
}

/// One source of metrics. `now` is monotonic time (from the loop's clock); rates are
/// computed against the previous call's `now` (or the probe's).
pub trait Sampler: Send {
    /// A short name for logs: `cpu`, `gpu`, `cgroup`, …
    fn name(&self) -> &'static str;

    /// Appends this tick's metrics to `out`. On error nothing half-made should be left
    /// behind that a later tick would misread (keep the previous counters).
    fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError>;

    /// The job's last tick: [`sample`](Sampler::sample), and whatever the sampler reads at a
    /// slower cadence than the tick is read too, so that its figures reach the end.
    fn sample_last(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        self.sample(now, out)
    }

    /// Failures the sampler handled itself (a GPU field left out of a tick) rather than
    /// returned; the loop adds them to the ones it counted.
    fn failures(&self) -> u64 {
        0
    }
}

/// A pseudo-file kept open and re-read from offset 0 each time (one `pread` per 4 KiB,
/// no `open`/`close`, no allocation once the buffer has grown).
///
/// The buffer is zero-filled only when it grows (`buf.len()` is the initialised part that
/// `pread` may write into; the content is the front of it), so that a tick does not
/// zero-fill every file's buffer again before reading it.
#[derive(Debug)]
pub struct ProcFile {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
}

impl ProcFile {
    pub fn open(path: impl Into<PathBuf>) -> Result<ProcFile, SampleError> {
        let path = path.into();
        match File::open(&path) {
            Ok(file) => Ok(ProcFile { path, file, buf: vec![0; 4096] }),
            Err(e) => Err(SampleError::io(&path, e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's current content.
    pub fn read(&mut self) -> Result<&[u8], SampleError> {
        let mut at = 0usize;
        loop {
            if self.buf.len() - at < 4096 {
                // Doubles, like a Vec's capacity (4 KiB → 8 KiB for most files, once).
                self.buf.resize(self.buf.len() + self.buf.len().max(4096), 0);
            }
            match self.file.read_at(&mut self.buf[at..], at as u64) {
                Ok(0) => break,
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(SampleError::io(&self.path, e)),
            }
        }
        Ok(&self.buf[..at])
    }
}

/// A per-second rate from two counter readings `dt` apart; a counter that went backwards
/// (a reset, a device replaced) gives 0, not a huge number.
pub fn rate(prev: u64, cur: u64, dt: Duration) -> f64 {
    let secs = dt.as_secs_f64();
    if secs <= 0.0 {
        return f64::NAN;
    }
    cur.saturating_sub(prev) as f64 / secs
}

/// `part / whole * 100`, NaN when `whole` is 0 (left out by [`Metrics::push`]).
pub fn percent(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { (part / whole * 100.0).clamp(0.0, 100.0) } else { f64::NAN }
}

/// The whitespace-separated fields of a line, as numbers where they are numbers.
pub fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty())
}

/// A decimal `u64` field.
pub fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() || field.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in field {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d))?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_rates() {
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(rate(100, 300, Duration::from_millis(500)), 400.0);
        assert_eq!(rate(300, 100, Duration::from_secs(1)), 0.0);
        assert!(rate(0, 1, Duration::ZERO).is_nan());
        assert_eq!(percent(1.0, 4.0), 25.0);
        assert!(percent(1.0, 0.0).is_nan());
    }

    #[test]
    fn metrics_leave_out_what_json_cannot_hold() {
        let mut m = Metrics::new();
        m.push(crate::pipeline::sample::CPU, Name::Indexed("cpu", 3), "CPUUtilization", 12.5);
        m.push(crate::pipeline::sample::CPU, Name::Indexed("cpu", 1), "CPUUtilization", f64::NAN);
        m.push(crate::pipeline::sample::CPU, Name::Indexed("cpu", 2), "CPUUtilization", f64::INFINITY);
        assert_eq!(m.len(), 1);
        assert_eq!(m.get("cpu", "cpu3", "CPUUtilization"), Some(12.5));
        assert_eq!(m.as_slice()[0].name.to_string(), "cpu3");
    }

    #[test]
    fn the_vocabulary_keeps_non_percentages_away_from_the_analysis() {
        for (k, n, d) in [
            ("cpu", "cpu0", "CPUUtilization"),
            ("cpu", "cpu15", "I/OWaitPercentage"),
            ("gpu", "gpu1", "GPUUtilization"),
            ("gpu", "gpu0", "GPUMemoryUtilization"),
            ("memory", "MemoryUsedPercent", ""),
            ("i/o", "IOPS", ""),
            ("network", "ReceiveBytesPerSecond", "Algorithm"),
            ("host", "AllCores", "BusyPercent"),
            ("ram", "MemoryUsedBytes", "cgroup"),
            ("accelerator", "device0", "PowerWatts"),
            ("accelerator", "device0", "MemoryBusyPercent"),
            ("container", "CPUUtilizationOfQuota", "cgroup"),
            ("trainer", "RSSBytes", "ProcessTree"),
            ("agent", "CPUMicrosPerTick", "Self"),
            ("trainer", "PSSBytes", "ProcessTree"),
            ("trainer", "pid12-pt_data_worker", "ProcessCPUPercent"),
            ("trainer", "pid12-cpu_burner", "ProcessPSSBytes"),
            ("pressure", "CPU", "SomeStalledPercent"),
            ("pressure", "Memory", "FullStalledPercent"),
            ("pressure", "IO", "SomeStalledPercent"),
            ("clock", "Synchronised", "Kernel"),
            ("clock", "MaxErrorMicros", "Kernel"),
        ] {
            assert!(vocabulary_ok(k, n, d), "{k}/{n}/{d}");
        }
        for (k, n, d) in [
            // The CPU total counted as a core; bytes, watts taken for percentages.
            ("cpu", "total", "CPUUtilization"),
            ("host", "AllCores", "CPUUtilization"),
            ("memory", "MemoryUsedBytes", "host"),
            ("memory_bytes", "MemoryUsedBytes", "host"),
            ("gpu", "gpu0", "GPUPowerWatts"),
            ("gpu_extra", "gpu0", "PowerWatts"),
            ("accelerator", "gpu0", "PowerWatts"),
            ("accelerator", "device0", "GPUPowerWatts"),
            ("accelerator", "device0", "MemUsedBytesOfMemory"),
            ("cpu", "cpu", "CPUUtilization"),
            ("host", "x", "I/OWaitPercentage"),
            ("host", "MemoryUsedPercent", "host"),
            ("host", "x", "Algorithm"),
            // A process's comm must not make its Name a core's, nor bytes a percentage.
            ("trainer", "cpu_burner", "ProcessCPUPercent"),
            ("trainer", "pid12-python", "ProcessMemoryBytes"),
            ("pressure", "cpu", "SomeStalledPercent"),
            ("clock", "MaxErrorMicros", ""),
        ] {
            assert!(!vocabulary_ok(k, n, d), "{k}/{n}/{d}");
        }
        for t in MetricType::ALL {
            assert_eq!(MetricType::from_written(t.as_str()), Some(t));
        }
        assert_eq!(MetricType::Io.to_string(), "i/o");
        assert_eq!(MetricType::from_written("memory_bytes"), None);
    }

    #[test]
    fn labels_keep_json_and_charts_safe() {
        assert_eq!(Label::sanitized(b"pt_data_worker").as_str(), "pt_data_worker");
        assert_eq!(Label::sanitized(b"a \"b\\c)").as_str(), "a__b_c_");
        assert_eq!(Label::sanitized("caf\u{e9}".as_bytes()).as_str(), "caf__");
        assert_eq!(Label::sanitized(b"0123456789abcdefXYZ").as_str(), "0123456789abcde");
        assert!(Label::sanitized(b"").is_empty());
        let name = Name::Process(42, Label::sanitized(b"python3"));
        assert_eq!(name.to_string(), "pid42-python3");
    }

    #[test]
    fn a_proc_file_is_reread_from_the_start() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stat");
        std::fs::write(&path, "a".repeat(10_000)).unwrap();
        let mut f = ProcFile::open(&path).unwrap();
        assert_eq!(f.read().unwrap().len(), 10_000);
        std::fs::write(&path, "short\n").unwrap();
        assert_eq!(f.read().unwrap(), b"short\n");
        assert!(matches!(ProcFile::open(dir.join("absent")), Err(SampleError::Io { .. })));
    }
}
