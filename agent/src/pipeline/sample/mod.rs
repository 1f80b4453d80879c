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
//! its words are `trainprof_output::protocol::metric`'s, and [`vocabulary_ok`] checks each
//! one pushed in debug builds): under the Types `cpu`, `gpu`
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

// The vocabulary is the protocol's (`trainprof_output::protocol::metric`), shared with the
// report; re-exported so that the samplers name it from here.
pub use trainprof_output::protocol::metric::{Label, MetricType, Name, dimension, name, vocabulary_ok};

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
        m.push(MetricType::Cpu, Name::Indexed("cpu", 3), "CPUUtilization", 12.5);
        m.push(MetricType::Cpu, Name::Indexed("cpu", 1), "CPUUtilization", f64::NAN);
        m.push(MetricType::Cpu, Name::Indexed("cpu", 2), "CPUUtilization", f64::INFINITY);
        assert_eq!(m.len(), 1);
        assert_eq!(m.get("cpu", "cpu3", "CPUUtilization"), Some(12.5));
        assert_eq!(m.as_slice()[0].name.to_string(), "cpu3");
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
