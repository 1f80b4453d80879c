//! The container's own figures, read from its cgroup (v2, or v1 as a fallback): CPU use
//! measured against the CPU quota, CFS throttling, the container's block I/O, and, for the
//! memory sampler, the memory limit and working set.
//!
//! Host-wide numbers (`/proc/stat`, `/proc/diskstats`) say little inside a container limited
//! to two of a host's 96 cores; these say how close the job is to *its* limits. They carry
//! Type `container` and Dimension `cgroup` so that nobody mistakes them for host numbers:
//!
//! | Name | what | when |
//! |---|---|---|
//! | `CPUUtilizationOfQuota` | CPU time used / (elapsed time × quota cores) × 100 | a CPU quota is set |
//! | `CPUQuotaCores` | quota / period, e.g. 2.0 | a CPU quota is set |
//! | `CPUThrottledPeriodsPercent` | throttled periods / elapsed periods × 100 | a quota is set and a period elapsed |
//! | `IOPS` | read + write operations per second (discards left out) | the I/O file exists |
//! | `ReadThroughputInBytesPerSecond`, `WriteThroughputInBytesPerSecond` | bytes per second | the I/O file exists |
//!
//! `CPUUtilizationOfQuota` is not clamped to 100: with `cpu.max.burst` a container may use
//! more than its quota for a while, and that is worth seeing.
//!
//! **Finding the cgroup.** v2 when `<cgroup>/cgroup.controllers` exists; the process's cgroup
//! is the `0::/path` line of `<proc>/self/cgroup` and its directory `<cgroup>/<path>`. Inside a
//! container with its own cgroup namespace the path is `/` and the container's cgroup is the
//! mount itself; without one, the path names a cgroup of the host that the container's mount
//! does not show, so a directory that does not exist falls back to `<cgroup>` (the container
//! runtime mounts the container's own cgroup there). v1 does the same per controller, with
//! the `N:cpu,cpuacct:/path`, `N:memory:/path`, `N:blkio:/path` lines and the hierarchies
//! `<cgroup>/cpu,cpuacct` (or `cpu`, `cpuacct`), `<cgroup>/memory`, `<cgroup>/blkio`. A
//! process in the host's root cgroup (no container) finds the root: it has no quota and no
//! limit, but its I/O file, where the kernel has one, is the whole machine's.
//!
//! **Limits are re-read every tick** (one `pread` of a file of a few bytes, next to the
//! counters' own): a Kubernetes in-place resize or `docker update` changes them on a running
//! container, and a stale quota would make `CPUUtilizationOfQuota` wrong from then on. What
//! the probe decides stays decided, though: a container that had no CPU quota at the probe
//! gets no CPU metrics later; one whose quota is lifted gets none until it comes back (the
//! counters keep advancing, so the first tick after has the right rate).

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::{
    Metrics, Name, ParseError, ProcFile, Roots, SampleError, Sampler, fields, parse_u64, percent, rate,
};
use super::{dimension as d, name as n};

/// `Type` of every metric of this sampler.
const KIND: super::MetricType = super::MetricType::Container;
/// `Dimension` of every metric of this sampler.
const DIMENSION: &str = d::CGROUP;

/// A memory limit at or above this is "no limit". v1 writes "unlimited" as the largest
/// page-aligned `i64` (9223372036854771712 with 4 KiB pages, a little less with 64 KiB ones),
/// no real limit comes anywhere near 2^62 bytes.
const UNLIMITED_MEMORY: u64 = 1 << 62;

/// Which hierarchy the kernel mounts at `<cgroup>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// One hierarchy per controller (`<cgroup>/memory`, …).
    V1,
    /// The unified hierarchy: one directory holds every controller's files.
    V2,
}

/// This process's cgroup directories, one per controller (all the same in v2); `None` where
/// a v1 controller is not mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    pub version: CgroupVersion,
    /// `cpu.max` (v2), `cpu.cfs_quota_us` (v1), `cpu.stat`.
    pub cpu: Option<PathBuf>,
    /// `cpuacct.usage` (v1; the same as `cpu` in v2).
    pub cpuacct: Option<PathBuf>,
    /// `memory.max` / `memory.limit_in_bytes`, `memory.stat`, …
    pub memory: Option<PathBuf>,
    /// `io.stat` (v2), `blkio.throttle.*` (v1).
    pub io: Option<PathBuf>,
}

impl CgroupLayout {
    /// Finds this process's cgroup under `roots` (see the module documentation); `Ok(None)`
    /// when there is no cgroup file system at `roots.cgroup`. A missing `<proc>/self/cgroup`
    /// counts as "the root cgroup everywhere".
    pub fn detect(roots: &Roots) -> Result<Option<CgroupLayout>, SampleError> {
        if !roots.cgroup.is_dir() {
            return Ok(None);
        }
        let self_path = roots.proc.join("self/cgroup");
        let text = match std::fs::read(&self_path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(SampleError::io(&self_path, e)),
        };
        let own = parse_self_cgroup(&text).map_err(|what| SampleError::parse(&self_path, what))?;
        if roots.cgroup.join("cgroup.controllers").exists() {
            let dir = resolve(&roots.cgroup, own.unified.unwrap_or(b"/"));
            return Ok(Some(CgroupLayout {
                version: CgroupVersion::V2,
                cpu: Some(dir.clone()),
                cpuacct: Some(dir.clone()),
                memory: Some(dir.clone()),
                io: Some(dir),
            }));
        }
        let v1 = |controller: &str| own.v1_dir(&roots.cgroup, controller);
        Ok(Some(CgroupLayout {
            version: CgroupVersion::V1,
            cpu: v1("cpu"),
            cpuacct: v1("cpuacct"),
            memory: v1("memory"),
            io: v1("blkio"),
        }))
    }
}

/// What `/proc/self/cgroup` says, borrowed from its text.
#[derive(Debug, Default, PartialEq, Eq)]
struct SelfCgroup<'a> {
    /// The path of the `0::/path` line (v2, or the unified part of a hybrid setup).
    unified: Option<&'a [u8]>,
    /// `(controller list, path)` of every v1 line, e.g. `(b"cpu,cpuacct", b"/docker/ab12")`.
    v1: Vec<(&'a [u8], &'a [u8])>,
}

impl SelfCgroup<'_> {
    /// The v1 directory of `controller`: its hierarchy's mount (named as the line names it,
    /// `cpu,cpuacct` for either of those two, or by the controller alone), then the process's
    /// path under it. `None` when no such hierarchy is mounted.
    fn v1_dir(&self, mount: &Path, controller: &str) -> Option<PathBuf> {
        let line =
            self.v1.iter().find(|(list, _)| list.split(|&b| b == b',').any(|c| c == controller.as_bytes()));
        let path = line.map_or(&b"/"[..], |(_, path)| path);
        let listed = line.map(|(list, _)| mount.join(OsStr::from_bytes(list)));
        let shared = matches!(controller, "cpu" | "cpuacct").then(|| mount.join("cpu,cpuacct"));
        let hierarchy =
            [listed, shared, Some(mount.join(controller))].into_iter().flatten().find(|d| d.is_dir())?;
        Some(resolve(&hierarchy, path))
    }
}

/// Parses `/proc/self/cgroup`: `hierarchy-id:controller-list:path` lines.
fn parse_self_cgroup(text: &[u8]) -> Result<SelfCgroup<'_>, ParseError> {
    let mut own = SelfCgroup::default();
    for line in text.split(|&b| b == b'\n').filter(|l| !l.trim_ascii().is_empty()) {
        let mut parts = line.splitn(3, |&b| b == b':');
        let (Some(id), Some(list), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(ParseError::Expected {
                expected: "`ID:CONTROLLERS:PATH`".into(),
                got: snippet(line),
            });
        };
        let Some(id) = parse_u64(id) else {
            return Err(ParseError::NotANumber { what: "hierarchy id".into(), line: snippet(line) });
        };
        if !path.starts_with(b"/") {
            return Err(ParseError::Other(
                format!("cgroup path is not absolute in {}", snippet(line)).into(),
            ));
        }
        if id == 0 && list.is_empty() {
            own.unified = Some(path);
        } else {
            own.v1.push((list, path));
        }
    }
    Ok(own)
}

/// `<mount>/<path>`, or `<mount>` itself when that directory does not exist (the container's
/// cgroup is mounted at the root) or the path leads out of the mount (`/../x`: a cgroup
/// outside our cgroup namespace).
fn resolve(mount: &Path, path: &[u8]) -> PathBuf {
    let mut dir = mount.to_path_buf();
    for part in Path::new(OsStr::from_bytes(path)).components() {
        match part {
            Component::Normal(name) => dir.push(name),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return mount.to_path_buf(),
        }
    }
    if dir.is_dir() { dir } else { mount.to_path_buf() }
}

/// Opens a cgroup file; `Ok(None)` when it does not exist (controller not enabled here).
fn open_if_exists(path: PathBuf) -> Result<Option<ProcFile>, SampleError> {
    match ProcFile::open(path) {
        Ok(file) => Ok(Some(file)),
        Err(SampleError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Re-reads `file` and parses it; a parse failure becomes a [`SampleError::Parse`] naming
/// the file.
fn read_parsed<T>(
    file: &mut ProcFile,
    parse: impl FnOnce(&[u8]) -> Result<T, ParseError>,
) -> Result<T, SampleError> {
    let parsed = parse(file.read()?);
    parsed.map_err(|what| SampleError::parse(file.path(), what))
}

/// The start of a bad line or file, quoted, for an error message.
fn snippet(text: &[u8]) -> String {
    let text = text.trim_ascii();
    let cut = &text[..text.len().min(60)];
    format!("{:?}{}", String::from_utf8_lossy(cut), if cut.len() < text.len() { "…" } else { "" })
}

/// A file holding one decimal number (`cpuacct.usage`, `memory.current`).
fn parse_number(text: &[u8]) -> Result<u64, ParseError> {
    parse_u64(text.trim_ascii())
        .ok_or_else(|| ParseError::Expected { expected: "a number".into(), got: snippet(text) })
}

/// The value of `key` in a file of `key value` lines (`cpu.stat`, `memory.stat`).
fn keyed(text: &[u8], key: &str) -> Result<u64, ParseError> {
    for line in text.split(|&b| b == b'\n') {
        let mut f = fields(line);
        if f.next() == Some(key.as_bytes()) {
            return match (f.next().and_then(parse_u64), f.next()) {
                (Some(v), None) => Ok(v),
                _ => Err(ParseError::Expected {
                    expected: format!("`{key} NUMBER`").into(),
                    got: snippet(line),
                }),
            };
        }
    }
    Err(ParseError::Missing(format!("`{key}` line").into()))
}

// ---------------------------------------------------------------------------------------
// CPU

/// A CFS bandwidth limit: `quota_us` of CPU time every `period_us` (both > 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Quota {
    quota_us: u64,
    period_us: u64,
}

impl Quota {
    /// How many cores' worth of CPU time the quota allows.
    fn cores(self) -> f64 {
        self.quota_us as f64 / self.period_us as f64
    }
}

/// v2 `cpu.max`: `max PERIOD` (no quota) or `QUOTA PERIOD`, in µs.
fn parse_cpu_max(text: &[u8]) -> Result<Option<Quota>, ParseError> {
    let mut f = fields(text);
    let bad =
        || ParseError::Expected { expected: "`max PERIOD` or `QUOTA PERIOD`".into(), got: snippet(text) };
    let (Some(quota), Some(period), None) = (f.next(), f.next(), f.next()) else {
        return Err(bad());
    };
    let period_us = parse_u64(period).filter(|&p| p > 0).ok_or_else(bad)?;
    if quota == b"max" {
        return Ok(None);
    }
    let quota_us = parse_u64(quota).filter(|&q| q > 0).ok_or_else(bad)?;
    Ok(Some(Quota { quota_us, period_us }))
}

/// v1 `cpu.cfs_quota_us` in µs; `None` for `-1` (no quota).
fn parse_cfs_quota(text: &[u8]) -> Result<Option<u64>, ParseError> {
    match std::str::from_utf8(text.trim_ascii()).ok().and_then(|s| s.parse::<i64>().ok()) {
        Some(q) if q < 0 => Ok(None),
        Some(q) if q > 0 => Ok(Some(q.unsigned_abs())),
        _ => Err(ParseError::Expected { expected: "-1 or a positive number".into(), got: snippet(text) }),
    }
}

/// v1 `cpu.cfs_period_us` in µs (> 0).
fn parse_cfs_period(text: &[u8]) -> Result<u64, ParseError> {
    match parse_u64(text.trim_ascii()) {
        Some(p) if p > 0 => Ok(p),
        _ => Err(ParseError::Expected { expected: "a positive number".into(), got: snippet(text) }),
    }
}

/// Cumulative CPU counters of the cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CpuCounters {
    /// CPU time used, ns.
    usage_ns: u64,
    /// CFS periods in which the cgroup ran (`nr_periods`).
    periods: u64,
    /// Of those, periods in which it was throttled (`nr_throttled`).
    throttled: u64,
}

/// v2 `cpu.stat`: `usage_usec`, `nr_periods`, `nr_throttled` (the others are ignored).
fn parse_cpu_stat_v2(text: &[u8]) -> Result<CpuCounters, ParseError> {
    Ok(CpuCounters {
        usage_ns: keyed(text, "usage_usec")?.saturating_mul(1000),
        periods: keyed(text, "nr_periods")?,
        throttled: keyed(text, "nr_throttled")?,
    })
}

/// v1 `cpu.stat`: `(nr_periods, nr_throttled)` (usage is in `cpuacct.usage`).
fn parse_cpu_stat_v1(text: &[u8]) -> Result<(u64, u64), ParseError> {
    Ok((keyed(text, "nr_periods")?, keyed(text, "nr_throttled")?))
}

/// The CPU files of one cgroup, kept open.
#[derive(Debug)]
enum CpuFiles {
    V2 { max: ProcFile, stat: ProcFile },
    V1 { quota: ProcFile, period: ProcFile, stat: ProcFile, usage: ProcFile },
}

impl CpuFiles {
    /// Opens the files of `layout`; `Ok(None)` when one of them does not exist.
    fn open(layout: &CgroupLayout) -> Result<Option<CpuFiles>, SampleError> {
        let (Some(cpu), Some(cpuacct)) = (&layout.cpu, &layout.cpuacct) else {
            return Ok(None);
        };
        Ok(match layout.version {
            CgroupVersion::V2 => {
                match (open_if_exists(cpu.join("cpu.max"))?, open_if_exists(cpu.join("cpu.stat"))?) {
                    (Some(max), Some(stat)) => Some(CpuFiles::V2 { max, stat }),
                    _ => None,
                }
            }
            CgroupVersion::V1 => match (
                open_if_exists(cpu.join("cpu.cfs_quota_us"))?,
                open_if_exists(cpu.join("cpu.cfs_period_us"))?,
                open_if_exists(cpu.join("cpu.stat"))?,
                open_if_exists(cpuacct.join("cpuacct.usage"))?,
            ) {
                (Some(quota), Some(period), Some(stat), Some(usage)) => {
                    Some(CpuFiles::V1 { quota, period, stat, usage })
                }
                _ => None,
            },
        })
    }

    /// The current quota (`None`: none) and counters.
    fn read(&mut self) -> Result<(Option<Quota>, CpuCounters), SampleError> {
        match self {
            CpuFiles::V2 { max, stat } => {
                Ok((read_parsed(max, parse_cpu_max)?, read_parsed(stat, parse_cpu_stat_v2)?))
            }
            CpuFiles::V1 { quota, period, stat, usage } => {
                let quota_us = read_parsed(quota, parse_cfs_quota)?;
                let period_us = read_parsed(period, parse_cfs_period)?;
                let (periods, throttled) = read_parsed(stat, parse_cpu_stat_v1)?;
                let usage_ns = read_parsed(usage, parse_number)?;
                let quota = quota_us.map(|quota_us| Quota { quota_us, period_us });
                Ok((quota, CpuCounters { usage_ns, periods, throttled }))
            }
        }
    }
}

/// The CPU part of the sampler: files, last quota seen (for the log), last counters.
#[derive(Debug)]
struct Cpu {
    files: CpuFiles,
    quota: Option<Quota>,
    prev: CpuCounters,
}

impl Cpu {
    /// Pushes this interval's metrics (only while there is a quota).
    fn push(&self, quota: Option<Quota>, cur: CpuCounters, dt: Duration, out: &mut Metrics) {
        let Some(quota) = quota else { return };
        let cores = quota.cores();
        let used_s = cur.usage_ns.saturating_sub(self.prev.usage_ns) as f64 / 1e9;
        // A zero interval gives NaN or infinity, which `push` leaves out.
        let utilization = used_s / (dt.as_secs_f64() * cores) * 100.0;
        out.push(KIND, Name::Static(n::CPU_UTILIZATION_OF_QUOTA), DIMENSION, utilization);
        out.push(KIND, Name::Static(n::CPU_QUOTA_CORES), DIMENSION, cores);
        let periods = cur.periods.saturating_sub(self.prev.periods) as f64;
        let throttled = cur.throttled.saturating_sub(self.prev.throttled) as f64;
        out.push(
            KIND,
            Name::Static(n::CPU_THROTTLED_PERIODS_PERCENT),
            DIMENSION,
            percent(throttled, periods),
        );
    }
}

// ---------------------------------------------------------------------------------------
// I/O

/// Cumulative block I/O of the cgroup, summed over devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct IoCounters {
    read_bytes: u64,
    write_bytes: u64,
    /// Read and write operations.
    ios: u64,
}

/// v2 `io.stat`: `MAJ:MIN key=value …` lines; `rbytes`, `wbytes`, `rios`, `wios` summed over
/// devices, other keys (`dbytes`, `cost.*`, …) ignored. Empty until the first I/O.
///
/// Like `docker stats`, this sums every device listed: I/O through a stacked device (LVM,
/// md) may be listed both on it and on the disks below.
fn parse_io_stat(text: &[u8]) -> Result<IoCounters, ParseError> {
    let mut c = IoCounters::default();
    for line in text.split(|&b| b == b'\n') {
        let mut f = fields(line);
        let Some(device) = f.next() else { continue };
        if !device.contains(&b':') {
            return Err(ParseError::Expected {
                expected: "`MAJ:MIN key=value…`".into(), got: snippet(line)
            });
        }
        for pair in f {
            let Some(eq) = pair.iter().position(|&b| b == b'=') else {
                return Err(ParseError::Expected {
                    expected: "key=value".into(),
                    got: format!("{} in {}", snippet(pair), snippet(line)),
                });
            };
            let (key, value) = (&pair[..eq], &pair[eq + 1..]);
            let slot = match key {
                b"rbytes" => &mut c.read_bytes,
                b"wbytes" => &mut c.write_bytes,
                b"rios" | b"wios" => &mut c.ios,
                _ => continue,
            };
            let Some(v) = parse_u64(value) else {
                return Err(ParseError::NotANumber { what: snippet(pair), line: snippet(line) });
            };
            *slot = slot.saturating_add(v);
        }
    }
    Ok(c)
}

/// v1 `blkio.throttle.io_service_bytes` or `…io_serviced`: `MAJ:MIN Op N` lines, a final
/// `Total N`; the `Read` and `Write` rows summed over devices (as in `docker stats`), as
/// `(read, write)`.
fn parse_blkio(text: &[u8]) -> Result<(u64, u64), ParseError> {
    let (mut read, mut write) = (0u64, 0u64);
    for line in text.split(|&b| b == b'\n') {
        let mut f = fields(line);
        match (f.next(), f.next(), f.next(), f.next()) {
            (None, ..) => {}
            (Some(b"Total"), Some(n), None, None) if parse_u64(n).is_some() => {}
            (Some(device), Some(op), Some(n), None) if device.contains(&b':') => {
                let Some(n) = parse_u64(n) else {
                    return Err(ParseError::NotANumber { what: "count".into(), line: snippet(line) });
                };
                match op {
                    b"Read" => read = read.saturating_add(n),
                    b"Write" => write = write.saturating_add(n),
                    _ => {}
                }
            }
            _ => {
                return Err(ParseError::Expected {
                    expected: "`MAJ:MIN Op N` or `Total N`".into(),
                    got: snippet(line),
                });
            }
        }
    }
    Ok((read, write))
}

/// The I/O files of one cgroup, kept open.
#[derive(Debug)]
enum IoFiles {
    V2 { stat: ProcFile },
    V1 { bytes: ProcFile, serviced: ProcFile },
}

impl IoFiles {
    /// Opens the files of `layout`; `Ok(None)` when they do not exist.
    fn open(layout: &CgroupLayout) -> Result<Option<IoFiles>, SampleError> {
        let Some(dir) = &layout.io else { return Ok(None) };
        Ok(match layout.version {
            CgroupVersion::V2 => open_if_exists(dir.join("io.stat"))?.map(|stat| IoFiles::V2 { stat }),
            CgroupVersion::V1 => match (
                open_if_exists(dir.join("blkio.throttle.io_service_bytes"))?,
                open_if_exists(dir.join("blkio.throttle.io_serviced"))?,
            ) {
                (Some(bytes), Some(serviced)) => Some(IoFiles::V1 { bytes, serviced }),
                _ => None,
            },
        })
    }

    fn read(&mut self) -> Result<IoCounters, SampleError> {
        match self {
            IoFiles::V2 { stat } => read_parsed(stat, parse_io_stat),
            IoFiles::V1 { bytes, serviced } => {
                let (read_bytes, write_bytes) = read_parsed(bytes, parse_blkio)?;
                let (reads, writes) = read_parsed(serviced, parse_blkio)?;
                Ok(IoCounters { read_bytes, write_bytes, ios: reads.saturating_add(writes) })
            }
        }
    }
}

/// The I/O part of the sampler.
#[derive(Debug)]
struct Io {
    files: IoFiles,
    prev: IoCounters,
}

impl Io {
    fn push(&self, cur: IoCounters, dt: Duration, out: &mut Metrics) {
        let prev = self.prev;
        out.push(KIND, Name::Static(n::IOPS), DIMENSION, rate(prev.ios, cur.ios, dt));
        let read = rate(prev.read_bytes, cur.read_bytes, dt);
        out.push(KIND, Name::Static(n::READ_THROUGHPUT), DIMENSION, read);
        let write = rate(prev.write_bytes, cur.write_bytes, dt);
        out.push(KIND, Name::Static(n::WRITE_THROUGHPUT), DIMENSION, write);
    }
}

// ---------------------------------------------------------------------------------------
// The sampler

/// The container's CPU-quota and I/O figures (see the module documentation). Name `cgroup`.
#[derive(Debug)]
pub struct CgroupSampler {
    /// `None`: no CPU quota at the probe.
    cpu: Option<Cpu>,
    /// `None`: no I/O file.
    io: Option<Io>,
    /// `now` of the previous read.
    last: Duration,
}

impl CgroupSampler {
    /// Finds the cgroup and takes the first reading at `now`. `Ok(None)` when there is
    /// nothing to report: no cgroup file system, or neither a CPU quota nor an I/O file.
    pub fn probe(roots: &Roots, now: Duration) -> Result<Option<CgroupSampler>, SampleError> {
        let Some(layout) = CgroupLayout::detect(roots)? else { return Ok(None) };
        let cpu = match CpuFiles::open(&layout)? {
            Some(mut files) => match files.read()? {
                (Some(quota), prev) => Some(Cpu { files, quota: Some(quota), prev }),
                (None, _) => None,
            },
            None => None,
        };
        let io = match IoFiles::open(&layout)? {
            Some(mut files) => {
                let prev = files.read()?;
                Some(Io { files, prev })
            }
            None => None,
        };
        if cpu.is_none() && io.is_none() {
            return Ok(None);
        }
        let dir = layout.cpu.as_deref().or(layout.io.as_deref()).unwrap_or(&roots.cgroup);
        let quota = match cpu.as_ref().and_then(|c| c.quota) {
            Some(q) => format!("CPU quota of {} cores", q.cores()),
            None => "no CPU quota".to_owned(),
        };
        let io_part = if io.is_some() { "I/O" } else { "no I/O file" };
        let version = match layout.version {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        };
        crate::log!("cgroup {version} at {}: {quota}, {io_part}", dir.display());
        Ok(Some(CgroupSampler { cpu, io, last: now }))
    }
}

impl Sampler for CgroupSampler {
    fn name(&self) -> &'static str {
        "cgroup"
    }

    /// Reads everything first and changes nothing on an error, so that the next good tick
    /// computes its rates from the last good reading.
    fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        let cpu = match &mut self.cpu {
            Some(cpu) => Some(cpu.files.read()?),
            None => None,
        };
        let io = match &mut self.io {
            Some(io) => Some(io.files.read()?),
            None => None,
        };
        let dt = now.saturating_sub(self.last);
        if let (Some(state), Some((quota, cur))) = (&mut self.cpu, cpu) {
            if quota != state.quota {
                match quota {
                    Some(q) => crate::log!("cgroup: the CPU quota is now {} cores", q.cores()),
                    None => {
                        crate::log!("cgroup: the CPU quota was lifted; no quota metrics until it is back")
                    }
                }
                state.quota = quota;
            }
            state.push(quota, cur, dt, out);
            state.prev = cur;
        }
        if let (Some(state), Some(cur)) = (&mut self.io, io) {
            state.push(cur, dt, out);
            state.prev = cur;
        }
        self.last = now;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Memory (for the memory sampler)

/// v2 `memory.max` (`max`: none) or v1 `memory.limit_in_bytes` (a huge value: none).
fn parse_memory_limit(text: &[u8]) -> Result<Option<u64>, ParseError> {
    let t = text.trim_ascii();
    if t == b"max" {
        return Ok(None);
    }
    match parse_u64(t) {
        Some(v) if v >= UNLIMITED_MEMORY => Ok(None),
        Some(v) => Ok(Some(v)),
        None => {
            Err(ParseError::Expected { expected: "`max` or a number of bytes".into(), got: snippet(text) })
        }
    }
}

/// The container's memory limit and working set, for the memory sampler.
///
/// Used memory is the *working set*: usage (`memory.current`, v1 `memory.usage_in_bytes`)
/// less the inactive file cache (`inactive_file`, v1 `total_inactive_file` of
/// `memory.stat`), which the kernel reclaims before it would kill anything. It is what
/// `kubectl top` and the kubelet's eviction report, and what the OOM killer's view of "how
/// close to the limit" approximates; raw usage counts page cache and often sits at the limit
/// on a data-loading job that is in no danger at all.
///
/// The limit is the container's own (an ancestor's lower limit, invisible from inside a
/// cgroup namespace, is not seen). It is re-read at every [`read`](CgroupMemory::read) to
/// follow resizes; should it be lifted while running, the last limit is kept.
#[derive(Debug)]
pub struct CgroupMemory {
    /// `memory.current` / `memory.usage_in_bytes`.
    usage: ProcFile,
    /// `memory.stat`.
    stat: ProcFile,
    /// `memory.max` / `memory.limit_in_bytes`.
    limit: ProcFile,
    /// `inactive_file` (v2) / `total_inactive_file` (v1).
    inactive_key: &'static str,
    limit_bytes: u64,
}

/// One reading of [`CgroupMemory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupMemoryReading {
    /// The working set: usage less inactive file cache, in bytes (0 rather than negative).
    pub used_bytes: u64,
    /// The memory limit, in bytes.
    pub limit_bytes: u64,
}

impl CgroupMemory {
    /// Finds the cgroup's memory files; `Ok(None)` when there is no cgroup file system, no
    /// memory controller here, or no limit.
    pub fn probe(roots: &Roots) -> Result<Option<CgroupMemory>, SampleError> {
        let Some(layout) = CgroupLayout::detect(roots)? else { return Ok(None) };
        let Some(dir) = &layout.memory else { return Ok(None) };
        let (usage, limit, inactive_key) = match layout.version {
            CgroupVersion::V2 => ("memory.current", "memory.max", "inactive_file"),
            CgroupVersion::V1 => ("memory.usage_in_bytes", "memory.limit_in_bytes", "total_inactive_file"),
        };
        let Some(mut limit) = open_if_exists(dir.join(limit))? else { return Ok(None) };
        let Some(limit_bytes) = read_parsed(&mut limit, parse_memory_limit)? else { return Ok(None) };
        let (Some(usage), Some(stat)) =
            (open_if_exists(dir.join(usage))?, open_if_exists(dir.join("memory.stat"))?)
        else {
            return Ok(None);
        };
        let mut memory = CgroupMemory { usage, stat, limit, inactive_key, limit_bytes };
        memory.read()?;
        Ok(Some(memory))
    }

    /// The current working set and limit.
    pub fn read(&mut self) -> Result<CgroupMemoryReading, SampleError> {
        let limit = read_parsed(&mut self.limit, parse_memory_limit)?;
        let usage = read_parsed(&mut self.usage, parse_number)?;
        let key = self.inactive_key;
        let inactive = read_parsed(&mut self.stat, |t| keyed(t, key))?;
        if let Some(limit) = limit {
            self.limit_bytes = limit;
        }
        Ok(CgroupMemoryReading { used_bytes: usage.saturating_sub(inactive), limit_bytes: self.limit_bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake root (`proc/`, `sys/fs/cgroup/`) in a fresh temp dir, removed when dropped
    /// (also when the test fails).
    struct Tree {
        _dir: tempfile::TempDir,
        root: PathBuf,
    }

    impl Tree {
        fn new(name: &str) -> Tree {
            let dir =
                tempfile::Builder::new().prefix(&format!("trainprof-cgroup-{name}-")).tempdir().unwrap();
            let root = dir.path().to_path_buf();
            std::fs::create_dir_all(root.join("sys/fs/cgroup")).unwrap();
            Tree { _dir: dir, root }
        }

        fn roots(&self) -> Roots {
            Roots::under(&self.root)
        }

        /// Writes (or rewrites in place, so that open files see it) `rel` under the root.
        fn write(&self, rel: &str, text: &str) {
            let path = self.root.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.root.join(rel)
        }
    }

    const SEC: Duration = Duration::from_secs(1);

    fn v2_cpu_stat(usage_usec: u64, periods: u64, throttled: u64) -> String {
        format!(
            "usage_usec {usage_usec}\nuser_usec 1\nsystem_usec 2\nnr_periods {periods}\n\
             nr_throttled {throttled}\nthrottled_usec 777\nnr_bursts 0\nburst_usec 0\n"
        )
    }

    fn metric(m: &Metrics, name: &str) -> Option<f64> {
        m.get("container", name, "cgroup")
    }

    // --- parsers -----------------------------------------------------------------------

    #[test]
    fn self_cgroup_lines() {
        let v2 = parse_self_cgroup(b"0::/\n").unwrap();
        assert_eq!(v2, SelfCgroup { unified: Some(b"/"), v1: vec![] });
        let v1 = parse_self_cgroup(
            b"12:memory:/docker/ab12\n4:cpu,cpuacct:/docker/ab12\n1:name=systemd:/docker/ab:12\n0::/init.scope\n",
        )
        .unwrap();
        assert_eq!(v1.unified, Some(&b"/init.scope"[..]));
        assert_eq!(
            v1.v1,
            vec![
                (&b"memory"[..], &b"/docker/ab12"[..]),
                (b"cpu,cpuacct", b"/docker/ab12"),
                (b"name=systemd", b"/docker/ab:12"),
            ]
        );
        assert_eq!(parse_self_cgroup(b"").unwrap(), SelfCgroup::default());
        for bad in [&b"garbage\n"[..], b"x:cpu:/a\n", b"3:cpu:relative\n", b"0:/\n"] {
            let what = parse_self_cgroup(bad).unwrap_err().to_string();
            assert!(what.starts_with("expected") || what.contains(" in "), "{what}");
        }
    }

    #[test]
    fn cpu_quota_files() {
        assert_eq!(parse_cpu_max(b"max 100000\n"), Ok(None));
        let two = parse_cpu_max(b"200000 100000\n").unwrap().unwrap();
        assert_eq!((two, two.cores()), (Quota { quota_us: 200_000, period_us: 100_000 }, 2.0));
        assert_eq!(parse_cpu_max(b"50000 100000").unwrap().unwrap().cores(), 0.5);
        for bad in
            [&b""[..], b"max\n", b"200000\n", b"abc 100000\n", b"200000 0\n", b"0 100000\n", b"1 2 3\n"]
        {
            let what = parse_cpu_max(bad).unwrap_err().to_string();
            assert!(what.starts_with("expected `max PERIOD` or `QUOTA PERIOD`"), "{what}");
        }
        assert_eq!(parse_cfs_quota(b"-1\n"), Ok(None));
        assert_eq!(parse_cfs_quota(b"150000\n"), Ok(Some(150_000)));
        assert_eq!(parse_cfs_period(b"100000\n"), Ok(100_000));
        for bad in [&b""[..], b"0\n", b"1.5\n", b"lots\n"] {
            assert!(
                parse_cfs_quota(bad).unwrap_err().to_string().starts_with("expected -1 or a positive number")
            );
        }
        for bad in [&b""[..], b"0\n", b"-1\n"] {
            assert!(parse_cfs_period(bad).unwrap_err().to_string().starts_with("expected a positive number"));
        }
    }

    #[test]
    fn cpu_stat_files() {
        let c = parse_cpu_stat_v2(v2_cpu_stat(1_500_000, 20, 5).as_bytes()).unwrap();
        assert_eq!(c, CpuCounters { usage_ns: 1_500_000_000, periods: 20, throttled: 5 });
        // Without the cpu controller there are no period lines: that file is not ours.
        let what = parse_cpu_stat_v2(b"usage_usec 1\nuser_usec 1\nsystem_usec 0\n").unwrap_err().to_string();
        assert_eq!(what, "no `nr_periods` line");
        let what =
            parse_cpu_stat_v2(b"usage_usec 12a\nnr_periods 1\nnr_throttled 0\n").unwrap_err().to_string();
        assert_eq!(what, "expected `usage_usec NUMBER`, got \"usage_usec 12a\"");
        assert_eq!(
            parse_cpu_stat_v1(b"nr_periods 10\nnr_throttled 1\nthrottled_time 5000000\n"),
            Ok((10, 1))
        );
        assert!(parse_cpu_stat_v1(b"nr_periods\nnr_throttled 1\n").is_err());
        assert_eq!(parse_number(b"123456789\n"), Ok(123_456_789));
        assert_eq!(parse_number(b"-5\n").unwrap_err().to_string(), "expected a number, got \"-5\"");
    }

    #[test]
    fn io_stat_sums_devices() {
        let text = b"8:0 rbytes=1000 wbytes=2000 rios=10 wios=20 dbytes=5 dios=1\n\
                     259:0 rbytes=24 wbytes=48 rios=2 wios=4 dbytes=0 dios=0 cost.vrate=100.00 cost.usage=7\n";
        let c = parse_io_stat(text).unwrap();
        assert_eq!(c, IoCounters { read_bytes: 1024, write_bytes: 2048, ios: 36 });
        assert_eq!(parse_io_stat(b""), Ok(IoCounters::default()));
        let what = parse_io_stat(b"8:0 rbytes=1x wbytes=2\n").unwrap_err().to_string();
        assert_eq!(what, "\"rbytes=1x\" is not a number in \"8:0 rbytes=1x wbytes=2\"");
        assert!(parse_io_stat(b"8:0 rbytes\n").unwrap_err().to_string().starts_with("expected key=value"));
        assert!(parse_io_stat(b"rbytes=1\n").unwrap_err().to_string().starts_with("expected `MAJ:MIN"));
    }

    #[test]
    fn blkio_sums_reads_and_writes() {
        let text = b"8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 12288\n8:0 Async 0\n8:0 Discard 0\n\
                     8:0 Total 12288\n8:16 Read 1\n8:16 Write 2\n8:16 Total 3\nTotal 12291\n";
        assert_eq!(parse_blkio(text), Ok((4097, 8194)));
        assert_eq!(parse_blkio(b"Total 0\n"), Ok((0, 0)));
        assert_eq!(
            parse_blkio(b"8:0 Read x\n").unwrap_err().to_string(),
            "count is not a number in \"8:0 Read x\""
        );
        for bad in [&b"8:0 Read\n"[..], b"Total\n", b"Total x\n", b"8:0 Read 1 2\n", b"sda Read 1\n"] {
            assert!(
                parse_blkio(bad).unwrap_err().to_string().starts_with("expected `MAJ:MIN Op N` or `Total N`")
            );
        }
    }

    #[test]
    fn memory_limit_and_stat_keys() {
        assert_eq!(parse_memory_limit(b"max\n"), Ok(None));
        assert_eq!(parse_memory_limit(b"9223372036854771712\n"), Ok(None));
        assert_eq!(parse_memory_limit(b"9223372036854710272\n"), Ok(None));
        assert_eq!(parse_memory_limit(b"2147483648\n"), Ok(Some(2 << 30)));
        assert!(
            parse_memory_limit(b"2G\n")
                .unwrap_err()
                .to_string()
                .starts_with("expected `max` or a number of bytes")
        );
        // A key is a whole first field: `inactive_file` is not `total_inactive_file`.
        let stat = b"total_inactive_file 400\ninactive_file 100\n";
        assert_eq!((keyed(stat, "inactive_file"), keyed(stat, "total_inactive_file")), (Ok(100), Ok(400)));
        assert_eq!(
            keyed(b"active_file 1\n", "inactive_file"),
            Err(ParseError::Missing("`inactive_file` line".into()))
        );
    }

    #[test]
    fn snippets_are_short_and_quoted() {
        assert_eq!(snippet(b"  abc \n"), "\"abc\"");
        assert_eq!(snippet(&[b'x'; 100]), format!("\"{}\"…", "x".repeat(60)));
        assert_eq!(snippet(b"\xff"), "\"\u{fffd}\"");
    }

    // --- detection ---------------------------------------------------------------------

    #[test]
    fn detection_falls_back_to_the_mount() {
        let t = Tree::new("detect");
        let roots = t.roots();
        let cg = &roots.cgroup;
        // No cgroup file system at all.
        std::fs::remove_dir_all(cg).unwrap();
        assert_eq!(CgroupLayout::detect(&roots).unwrap(), None);

        // v2, no /proc/self/cgroup: the mount.
        t.write("sys/fs/cgroup/cgroup.controllers", "cpu io memory pids\n");
        let layout = CgroupLayout::detect(&roots).unwrap().unwrap();
        assert_eq!(layout.version, CgroupVersion::V2);
        assert_eq!(layout.cpu.as_ref(), Some(cg));
        // A path the mount does not show, or one leading out of it: the mount.
        t.write("proc/self/cgroup", "0::/kubepods/pod1/c1\n");
        assert_eq!(CgroupLayout::detect(&roots).unwrap().unwrap().memory.as_ref(), Some(cg));
        t.write("proc/self/cgroup", "0::/../elsewhere\n");
        std::fs::create_dir_all(t.path("elsewhere")).unwrap();
        assert_eq!(CgroupLayout::detect(&roots).unwrap().unwrap().io.as_ref(), Some(cg));
        // A path it shows: that directory.
        std::fs::create_dir_all(cg.join("kubepods/pod1/c1")).unwrap();
        t.write("proc/self/cgroup", "0::/kubepods/pod1/c1\n");
        assert_eq!(CgroupLayout::detect(&roots).unwrap().unwrap().cpu, Some(cg.join("kubepods/pod1/c1")));
        // A broken /proc/self/cgroup is an error naming it.
        t.write("proc/self/cgroup", "nonsense\n");
        match CgroupLayout::detect(&roots) {
            Err(SampleError::Parse { path, what }) => {
                assert_eq!(path, t.path("proc/self/cgroup"));
                assert!(what.to_string().contains("nonsense"), "{what}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn detection_v1_hierarchies() {
        let t = Tree::new("detect-v1");
        let roots = t.roots();
        let cg = &roots.cgroup;
        for dir in ["cpu,cpuacct/docker/ab", "memory", "blkio/docker/ab", "pids"] {
            std::fs::create_dir_all(cg.join(dir)).unwrap();
        }
        t.write("proc/self/cgroup", "12:memory:/docker/ab\n11:blkio:/docker/ab\n4:cpu,cpuacct:/docker/ab\n");
        let layout = CgroupLayout::detect(&roots).unwrap().unwrap();
        assert_eq!(
            layout,
            CgroupLayout {
                version: CgroupVersion::V1,
                cpu: Some(cg.join("cpu,cpuacct/docker/ab")),
                cpuacct: Some(cg.join("cpu,cpuacct/docker/ab")),
                memory: Some(cg.join("memory")),
                io: Some(cg.join("blkio/docker/ab")),
            }
        );
        // Separate cpu and cpuacct hierarchies, listed in another order; no blkio mounted.
        std::fs::remove_dir_all(cg).unwrap();
        for dir in ["cpu/a", "cpuacct/b", "memory"] {
            std::fs::create_dir_all(cg.join(dir)).unwrap();
        }
        t.write("proc/self/cgroup", "3:cpuacct:/b\n2:cpu:/a\n1:memory:/\n");
        let layout = CgroupLayout::detect(&roots).unwrap().unwrap();
        assert_eq!(layout.cpu, Some(cg.join("cpu/a")));
        assert_eq!(layout.cpuacct, Some(cg.join("cpuacct/b")));
        assert_eq!(layout.memory, Some(cg.join("memory")));
        assert_eq!(layout.io, None);
    }

    // --- the sampler -------------------------------------------------------------------

    #[test]
    fn v2_quota_throttling_and_io_rates() {
        let t = Tree::new("v2");
        let dir = "sys/fs/cgroup/kubepods/pod1/c1";
        t.write("sys/fs/cgroup/cgroup.controllers", "cpu io memory\n");
        t.write("proc/self/cgroup", "0::/kubepods/pod1/c1\n");
        t.write(&format!("{dir}/cpu.max"), "200000 100000\n");
        t.write(&format!("{dir}/cpu.stat"), &v2_cpu_stat(1_000_000, 100, 10));
        t.write(&format!("{dir}/io.stat"), "8:0 rbytes=1000 wbytes=2000 rios=10 wios=20 dbytes=0 dios=0\n");
        let mut s = CgroupSampler::probe(&t.roots(), 10 * SEC).unwrap().unwrap();
        assert_eq!(s.name(), "cgroup");

        // 2 s later: 1.5 s of CPU on a 2-core quota; 5 of 20 periods throttled; a second device.
        t.write(&format!("{dir}/cpu.stat"), &v2_cpu_stat(2_500_000, 120, 15));
        t.write(
            &format!("{dir}/io.stat"),
            "8:0 rbytes=9000 wbytes=4000 rios=12 wios=22 dbytes=0 dios=0\n\
             259:0 rbytes=192 wbytes=48 rios=1 wios=1 dbytes=8 dios=8\n",
        );
        let mut out = Metrics::new();
        s.sample(12 * SEC, &mut out).unwrap();
        assert_eq!(metric(&out, "CPUUtilizationOfQuota"), Some(37.5));
        assert_eq!(metric(&out, "CPUQuotaCores"), Some(2.0));
        assert_eq!(metric(&out, "CPUThrottledPeriodsPercent"), Some(25.0));
        assert_eq!(metric(&out, "IOPS"), Some(3.0));
        assert_eq!(metric(&out, "ReadThroughputInBytesPerSecond"), Some(4096.0));
        assert_eq!(metric(&out, "WriteThroughputInBytesPerSecond"), Some(1024.0));
        assert_eq!(out.len(), 6);
        assert!(out.as_slice().iter().all(|m| m.kind == "container" && m.dimension == "cgroup"));

        // No period elapsed (idle): no throttling figure, the rest is there and zero.
        out.clear();
        s.sample(13 * SEC, &mut out).unwrap();
        assert_eq!(metric(&out, "CPUThrottledPeriodsPercent"), None);
        assert_eq!(metric(&out, "CPUUtilizationOfQuota"), Some(0.0));
        assert_eq!(metric(&out, "IOPS"), Some(0.0));
        // The same instant twice: no rates at all, the quota still.
        out.clear();
        s.sample(13 * SEC, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(metric(&out, "CPUQuotaCores"), Some(2.0));
    }

    #[test]
    fn v2_at_the_root_and_resized() {
        let t = Tree::new("v2-root");
        t.write("sys/fs/cgroup/cgroup.controllers", "cpu io memory\n");
        t.write("proc/self/cgroup", "0::/\n");
        t.write("sys/fs/cgroup/cpu.max", "100000 100000\n");
        t.write("sys/fs/cgroup/cpu.stat", &v2_cpu_stat(0, 0, 0));
        let mut s = CgroupSampler::probe(&t.roots(), SEC).unwrap().unwrap();
        assert!(s.io.is_none());
        t.write("sys/fs/cgroup/cpu.stat", &v2_cpu_stat(250_000, 10, 0));
        let mut out = Metrics::new();
        s.sample(Duration::from_millis(1500), &mut out).unwrap();
        assert_eq!(metric(&out, "CPUUtilizationOfQuota"), Some(50.0));
        assert_eq!(metric(&out, "CPUThrottledPeriodsPercent"), Some(0.0));
        assert_eq!(out.len(), 3);

        // Lifted: no CPU metrics, though the counters move on…
        t.write("sys/fs/cgroup/cpu.max", "max 100000\n");
        t.write("sys/fs/cgroup/cpu.stat", &v2_cpu_stat(1_250_000, 20, 0));
        out.clear();
        s.sample(Duration::from_millis(2500), &mut out).unwrap();
        assert!(out.is_empty());
        // …so that the quota's return (resized to 4 cores) has the right rate at once.
        t.write("sys/fs/cgroup/cpu.max", "400000 100000\n");
        t.write("sys/fs/cgroup/cpu.stat", &v2_cpu_stat(2_250_000, 30, 5));
        out.clear();
        s.sample(Duration::from_millis(3500), &mut out).unwrap();
        assert_eq!(metric(&out, "CPUUtilizationOfQuota"), Some(25.0));
        assert_eq!(metric(&out, "CPUQuotaCores"), Some(4.0));
        assert_eq!(metric(&out, "CPUThrottledPeriodsPercent"), Some(50.0));
    }

    #[test]
    fn a_broken_file_fails_the_tick_and_keeps_the_last_reading() {
        let t = Tree::new("broken");
        t.write("sys/fs/cgroup/cgroup.controllers", "cpu io\n");
        t.write("sys/fs/cgroup/cpu.max", "100000 100000\n");
        t.write("sys/fs/cgroup/cpu.stat", &v2_cpu_stat(0, 0, 0));
        t.write("sys/fs/cgroup/io.stat", "");
        let mut s = CgroupSampler::probe(&t.roots(), Duration::ZERO).unwrap().unwrap();
        // The CPU file is fine, the I/O one is not: nothing is pushed, nothing is kept.
        t.write("sys/fs/cgroup/cpu.stat", &v2_cpu_stat(500_000, 10, 1));
        t.write("sys/fs/cgroup/io.stat", "8:0 rbytes=oops\n");
        let mut out = Metrics::new();
        match s.sample(SEC, &mut out) {
            Err(SampleError::Parse { path, what }) => {
                assert_eq!(path, t.path("sys/fs/cgroup/io.stat"));
                assert!(what.to_string().contains("rbytes=oops"), "{what}");
            }
            other => panic!("{other:?}"),
        }
        assert!(out.is_empty());
        // Next tick: rates over the 2 s since the last good reading.
        t.write("sys/fs/cgroup/cpu.stat", &v2_cpu_stat(1_000_000, 20, 2));
        t.write("sys/fs/cgroup/io.stat", "8:0 rbytes=8 wbytes=4 rios=2 wios=2\n");
        s.sample(2 * SEC, &mut out).unwrap();
        assert_eq!(metric(&out, "CPUUtilizationOfQuota"), Some(50.0));
        assert_eq!(metric(&out, "CPUThrottledPeriodsPercent"), Some(10.0));
        assert_eq!(metric(&out, "IOPS"), Some(2.0));
        assert_eq!(metric(&out, "ReadThroughputInBytesPerSecond"), Some(4.0));
        assert_eq!(metric(&out, "WriteThroughputInBytesPerSecond"), Some(2.0));
    }

    #[test]
    fn no_quota_means_no_cpu_metrics() {
        let t = Tree::new("no-quota");
        let roots = t.roots();
        // No cgroup file system.
        std::fs::remove_dir_all(&roots.cgroup).unwrap();
        assert!(CgroupSampler::probe(&roots, SEC).unwrap().is_none());
        // v2, no quota, no io.stat (the io controller not enabled): nothing to report.
        t.write("sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
        t.write("proc/self/cgroup", "0::/\n");
        t.write("sys/fs/cgroup/cpu.max", "max 100000\n");
        t.write("sys/fs/cgroup/cpu.stat", &v2_cpu_stat(0, 0, 0));
        assert!(CgroupSampler::probe(&roots, SEC).unwrap().is_none());
        // With io.stat: I/O only, even once a quota is set later.
        t.write("sys/fs/cgroup/io.stat", "8:0 rbytes=0 wbytes=0 rios=0 wios=0\n");
        let mut s = CgroupSampler::probe(&roots, SEC).unwrap().unwrap();
        t.write("sys/fs/cgroup/cpu.max", "100000 100000\n");
        t.write("sys/fs/cgroup/io.stat", "8:0 rbytes=10 wbytes=20 rios=1 wios=1\n");
        let mut out = Metrics::new();
        s.sample(2 * SEC, &mut out).unwrap();
        let names: Vec<String> = out.as_slice().iter().map(|m| m.name.to_string()).collect();
        assert_eq!(names, ["IOPS", "ReadThroughputInBytesPerSecond", "WriteThroughputInBytesPerSecond"]);
        assert_eq!(metric(&out, "WriteThroughputInBytesPerSecond"), Some(20.0));
        // v1 with no quota (-1) and no blkio: nothing.
        let t = Tree::new("no-quota-v1");
        t.write("proc/self/cgroup", "4:cpu,cpuacct:/\n");
        t.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
        t.write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
        t.write("sys/fs/cgroup/cpu,cpuacct/cpu.stat", "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n");
        t.write("sys/fs/cgroup/cpu,cpuacct/cpuacct.usage", "123\n");
        assert!(CgroupSampler::probe(&t.roots(), SEC).unwrap().is_none());
    }

    #[test]
    fn v1_quota_throttling_and_io_rates() {
        let t = Tree::new("v1");
        t.write(
            "proc/self/cgroup",
            "12:memory:/docker/ab\n11:blkio:/docker/ab\n4:cpu,cpuacct:/docker/ab\n1:name=systemd:/docker/ab\n",
        );
        // cpu,cpuacct shows the container's own directory; blkio is mounted at the container.
        let cpu = "sys/fs/cgroup/cpu,cpuacct/docker/ab";
        t.write(&format!("{cpu}/cpu.cfs_quota_us"), "150000\n");
        t.write(&format!("{cpu}/cpu.cfs_period_us"), "100000\n");
        let stat =
            |p: u64, t: u64| format!("nr_periods {p}\nnr_throttled {t}\nthrottled_time {}\n", t * 1000);
        t.write(&format!("{cpu}/cpu.stat"), &stat(10, 1));
        t.write(&format!("{cpu}/cpuacct.usage"), "5000000000\n");
        let blk = "sys/fs/cgroup/blkio";
        let rows = |r: u64, w: u64| {
            format!("8:0 Read {r}\n8:0 Write {w}\n8:0 Sync 0\n8:0 Total {}\nTotal {}\n", r + w, r + w)
        };
        t.write(&format!("{blk}/blkio.throttle.io_service_bytes"), &rows(4096, 8192));
        t.write(&format!("{blk}/blkio.throttle.io_serviced"), &rows(1, 2));
        let mut s = CgroupSampler::probe(&t.roots(), 5 * SEC).unwrap().unwrap();

        // 1 s later: 0.75 s of CPU on 1.5 cores; 2 of 8 periods throttled; 3 + 5 operations.
        t.write(&format!("{cpu}/cpu.stat"), &stat(18, 3));
        t.write(&format!("{cpu}/cpuacct.usage"), "5750000000\n");
        t.write(&format!("{blk}/blkio.throttle.io_service_bytes"), &rows(4096 + 512, 8192 + 65536));
        t.write(&format!("{blk}/blkio.throttle.io_serviced"), &rows(4, 7));
        let mut out = Metrics::new();
        s.sample(6 * SEC, &mut out).unwrap();
        assert_eq!(metric(&out, "CPUUtilizationOfQuota"), Some(50.0));
        assert_eq!(metric(&out, "CPUQuotaCores"), Some(1.5));
        assert_eq!(metric(&out, "CPUThrottledPeriodsPercent"), Some(25.0));
        assert_eq!(metric(&out, "IOPS"), Some(8.0));
        assert_eq!(metric(&out, "ReadThroughputInBytesPerSecond"), Some(512.0));
        assert_eq!(metric(&out, "WriteThroughputInBytesPerSecond"), Some(65536.0));
        assert_eq!(out.len(), 6);

        // Quota lifted (-1): I/O only.
        t.write(&format!("{cpu}/cpu.cfs_quota_us"), "-1\n");
        out.clear();
        s.sample(7 * SEC, &mut out).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(metric(&out, "CPUQuotaCores"), None);
    }

    // --- memory ------------------------------------------------------------------------

    #[test]
    fn memory_v2_working_set() {
        let t = Tree::new("mem-v2");
        let roots = t.roots();
        t.write("sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
        t.write("proc/self/cgroup", "0::/\n");
        t.write("sys/fs/cgroup/memory.max", "max\n");
        t.write("sys/fs/cgroup/memory.current", "1000000\n");
        t.write(
            "sys/fs/cgroup/memory.stat",
            "anon 600000\nfile 400000\nactive_file 100000\ninactive_file 300000\n",
        );
        assert!(CgroupMemory::probe(&roots).unwrap().is_none());

        t.write("sys/fs/cgroup/memory.max", "4294967296\n");
        let mut m = CgroupMemory::probe(&roots).unwrap().unwrap();
        assert_eq!(m.read().unwrap(), CgroupMemoryReading { used_bytes: 700_000, limit_bytes: 4 << 30 });
        // Resized; more cache than usage (a race between the two files) is 0, not a wrap.
        t.write("sys/fs/cgroup/memory.max", "8589934592\n");
        t.write("sys/fs/cgroup/memory.current", "200000\n");
        assert_eq!(m.read().unwrap(), CgroupMemoryReading { used_bytes: 0, limit_bytes: 8 << 30 });
        // Lifted: the last limit stays.
        t.write("sys/fs/cgroup/memory.max", "max\n");
        assert_eq!(m.read().unwrap().limit_bytes, 8 << 30);
        // Broken: an error naming the file.
        t.write("sys/fs/cgroup/memory.stat", "anon 1\n");
        match m.read() {
            Err(SampleError::Parse { path, what }) => {
                assert_eq!(path, t.path("sys/fs/cgroup/memory.stat"));
                assert_eq!(what.to_string(), "no `inactive_file` line");
            }
            other => panic!("{other:?}"),
        }
        // No memory controller enabled here: no memory.max.
        std::fs::remove_file(t.path("sys/fs/cgroup/memory.max")).unwrap();
        assert!(CgroupMemory::probe(&roots).unwrap().is_none());
    }

    #[test]
    fn memory_v1_working_set() {
        let t = Tree::new("mem-v1");
        let roots = t.roots();
        assert!(CgroupMemory::probe(&roots).unwrap().is_none());
        t.write("proc/self/cgroup", "12:memory:/docker/ab\n4:cpu,cpuacct:/docker/ab\n");
        // The container's memory cgroup is mounted at the hierarchy's root.
        let dir = "sys/fs/cgroup/memory";
        t.write(&format!("{dir}/memory.limit_in_bytes"), "9223372036854771712\n");
        t.write(&format!("{dir}/memory.usage_in_bytes"), "1000000000\n");
        t.write(
            &format!("{dir}/memory.stat"),
            "cache 500000000\nrss 500000000\ninactive_file 1\nhierarchical_memory_limit 9223372036854771712\n\
             total_cache 500000000\ntotal_inactive_file 400000000\n",
        );
        assert!(CgroupMemory::probe(&roots).unwrap().is_none());
        t.write(&format!("{dir}/memory.limit_in_bytes"), "2147483648\n");
        let mut m = CgroupMemory::probe(&roots).unwrap().unwrap();
        assert_eq!(m.read().unwrap(), CgroupMemoryReading { used_bytes: 600_000_000, limit_bytes: 2 << 30 });
        // No memory hierarchy at all.
        std::fs::remove_dir_all(t.path(dir)).unwrap();
        assert!(CgroupMemory::probe(&roots).unwrap().is_none());
    }
}
