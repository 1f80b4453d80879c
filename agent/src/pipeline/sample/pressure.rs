//! Pressure stall information (PSI): the share of the interval in which tasks waited for
//! CPU, memory or I/O (`docs/formats.md`, "Pressure stalls").
//!
//! The agent's cgroup's `cpu.pressure`, `memory.pressure` and `io.pressure` (cgroup v2,
//! found as `cgroup.rs` finds the cgroup), else the host's `/proc/pressure/{cpu,memory,io}`.
//! Each file has a `some` line (at least one task stalled) and, except the host's CPU on
//! kernels before 5.13, a `full` line (every non-idle task stalled at once), each with a
//! `total=` counter of stalled µs. The rows are the growth of that counter over the
//! interval as a percent of the interval: exact for the interval, unlike the kernel's
//! `avg10` (an exponentially decaying average over about 10 s).
//!
//! Type `pressure`, Names `CPU`, `Memory`, `IO`, Dimensions `SomeStalledPercent` and
//! `FullStalledPercent`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cgroup::{CgroupLayout, CgroupVersion};
use super::{Metrics, Name, ParseError, ProcFile, Roots, SampleError, Sampler, fields, parse_u64, percent};
use super::{dimension as d, name as n};

/// The three resources: file stem, the Name of the rows.
const RESOURCES: [(&str, &str); 3] =
    [("cpu", n::PRESSURE_CPU), ("memory", n::PRESSURE_MEMORY), ("io", n::PRESSURE_IO)];

/// The `total=` µs counters of one pressure file; `full` is `None` where the file has no
/// `full` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stalls {
    pub some_us: u64,
    pub full_us: Option<u64>,
}

/// Parses a pressure file:
/// `some avg10=0.00 avg60=0.00 avg300=0.00 total=12345` and maybe a `full …` line.
pub fn parse_pressure(text: &[u8]) -> Result<Stalls, ParseError> {
    let mut some = None;
    let mut full = None;
    for line in text.split(|&b| b == b'\n').filter(|l| !l.trim_ascii().is_empty()) {
        let mut f = fields(line);
        let slot = match f.next() {
            Some(b"some") => &mut some,
            Some(b"full") => &mut full,
            _ => continue,
        };
        let total = f
            .find_map(|kv| kv.strip_prefix(b"total="))
            .ok_or_else(|| ParseError::Missing("total=".into()))?;
        *slot = Some(parse_u64(total).ok_or_else(|| ParseError::NotANumber {
            what: "total".into(),
            line: String::from_utf8_lossy(line).into_owned(),
        })?);
    }
    let some_us = some.ok_or_else(|| ParseError::Missing("`some` line".into()))?;
    Ok(Stalls { some_us, full_us: full })
}

#[derive(Debug)]
struct Source {
    name: &'static str,
    file: ProcFile,
    prev: Stalls,
}

/// The pressure sampler.
#[derive(Debug)]
pub struct PressureSampler {
    sources: Vec<Source>,
    /// The folder the files are read from, for the start-up line.
    dir: PathBuf,
    prev_at: Duration,
}

impl PressureSampler {
    /// The agent's cgroup's pressure files where it has them (v2), else the host's;
    /// `Ok(None)` when neither is there (a kernel without PSI, or booted with `psi=0`).
    pub fn probe(roots: &Roots, now: Duration) -> Result<Option<PressureSampler>, SampleError> {
        let cgroup = match CgroupLayout::detect(roots) {
            Ok(Some(CgroupLayout { version: CgroupVersion::V2, cpu: Some(dir), .. })) => Some(dir),
            Ok(_) => None,
            Err(e) => {
                crate::log!("pressure: the host's, not the cgroup's: {e}");
                None
            }
        };
        if let Some(dir) = cgroup {
            let s = PressureSampler::open(&dir, |r| format!("{r}.pressure"), now)?;
            if !s.sources.is_empty() {
                return Ok(Some(s.announce()));
            }
        }
        let s = PressureSampler::open(&roots.proc.join("pressure"), str::to_owned, now)?;
        Ok((!s.sources.is_empty()).then(|| s.announce()))
    }

    /// Opens and reads once each resource's file under `dir` (`file` names it); a file
    /// that is not there, or that the kernel refuses to read (PSI switched off), is left out.
    fn open(
        dir: &Path,
        file: impl Fn(&str) -> String,
        now: Duration,
    ) -> Result<PressureSampler, SampleError> {
        let mut sources = Vec::new();
        for (stem, name) in RESOURCES {
            let mut f = match ProcFile::open(dir.join(file(stem))) {
                Ok(f) => f,
                Err(SampleError::Io { source, .. }) if absent(&source) => continue,
                Err(e) => return Err(e),
            };
            let prev = match f.read() {
                Ok(text) => parse_pressure(text).map_err(|what| SampleError::parse(f.path(), what))?,
                Err(SampleError::Io { source, .. }) if absent(&source) => continue,
                Err(e) => return Err(e),
            };
            sources.push(Source { name, file: f, prev });
        }
        Ok(PressureSampler { sources, dir: dir.to_owned(), prev_at: now })
    }

    /// Where the files are read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Says where the rows come from, for the start-up lines.
    fn announce(self) -> PressureSampler {
        let names: Vec<_> = self.sources.iter().map(|s| s.name).collect();
        crate::log!("pressure stalls from {}: {}", self.dir.display(), names.join(", "));
        self
    }
}

/// A file that is not there, or that PSI switched off refuses (EOPNOTSUPP).
fn absent(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::EOPNOTSUPP)
}

impl Sampler for PressureSampler {
    fn name(&self) -> &'static str {
        "pressure"
    }

    fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        let dt_us = now.saturating_sub(self.prev_at).as_secs_f64() * 1e6;
        self.prev_at = now;
        let mut first_error = None;
        for s in &mut self.sources {
            let cur = match s.file.read() {
                Ok(text) => match parse_pressure(text) {
                    Ok(cur) => cur,
                    Err(what) => {
                        first_error.get_or_insert(SampleError::parse(s.file.path(), what));
                        continue;
                    }
                },
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            };
            let share = |prev: u64, cur: u64| percent(cur.saturating_sub(prev) as f64, dt_us);
            let kind = crate::pipeline::sample::MetricType::Pressure;
            out.push(kind, Name::Static(s.name), d::SOME_STALLED_PERCENT, share(s.prev.some_us, cur.some_us));
            if let (Some(p), Some(c)) = (s.prev.full_us, cur.full_us) {
                out.push(kind, Name::Static(s.name), d::FULL_STALLED_PERCENT, share(p, c));
            }
            s.prev = cur;
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psi(some: u64, full: Option<u64>) -> String {
        let mut s = format!("some avg10=1.50 avg60=0.40 avg300=0.10 total={some}\n");
        if let Some(f) = full {
            s += &format!("full avg10=0.00 avg60=0.00 avg300=0.00 total={f}\n");
        }
        s
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn parses_some_and_full() {
        assert_eq!(parse_pressure(psi(12, Some(3)).as_bytes()), Ok(Stalls { some_us: 12, full_us: Some(3) }));
        assert_eq!(parse_pressure(psi(7, None).as_bytes()), Ok(Stalls { some_us: 7, full_us: None }));
        assert!(matches!(parse_pressure(b"full avg10=0.00 total=1\n"), Err(ParseError::Missing(_))));
        assert!(matches!(parse_pressure(b"some avg10=0.00\n"), Err(ParseError::Missing(_))));
        assert!(matches!(parse_pressure(b"some total=x\n"), Err(ParseError::NotANumber { .. })));
    }

    #[test]
    fn the_cgroups_files_first_as_a_share_of_the_interval() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        write(root, "sys/fs/cgroup/cgroup.controllers", "cpu io memory\n");
        write(root, "proc/self/cgroup", "0::/job\n");
        write(root, "proc/pressure/cpu", &psi(0, None));
        write(root, "sys/fs/cgroup/job/cpu.pressure", &psi(1_000, Some(0)));
        write(root, "sys/fs/cgroup/job/memory.pressure", &psi(0, Some(0)));
        // No io.pressure in this cgroup: left out.
        let roots = Roots::under(root);
        let mut s = PressureSampler::probe(&roots, Duration::ZERO).unwrap().unwrap();
        assert_eq!(s.dir(), root.join("sys/fs/cgroup/job"));
        // 250 ms of 1 s with some task stalled, 100 ms with all of them.
        write(root, "sys/fs/cgroup/job/cpu.pressure", &psi(251_000, Some(100_000)));
        write(root, "sys/fs/cgroup/job/memory.pressure", &psi(5_000_000, Some(20_000)));
        let mut m = Metrics::new();
        s.sample(Duration::from_secs(1), &mut m).unwrap();
        assert_eq!(m.get("pressure", "CPU", "SomeStalledPercent"), Some(25.0));
        assert_eq!(m.get("pressure", "CPU", "FullStalledPercent"), Some(10.0));
        // More than the interval (a counter read late) is clamped to the whole of it.
        assert_eq!(m.get("pressure", "Memory", "SomeStalledPercent"), Some(100.0));
        assert_eq!(m.get("pressure", "Memory", "FullStalledPercent"), Some(2.0));
        assert_eq!(m.len(), 4);
        // A broken file fails the tick, names the file, and the others still come.
        write(root, "sys/fs/cgroup/job/cpu.pressure", "nonsense\n");
        m.clear();
        let e = s.sample(Duration::from_secs(2), &mut m).unwrap_err();
        assert!(e.to_string().contains("cpu.pressure"), "{e}");
        assert_eq!(m.get("pressure", "Memory", "SomeStalledPercent"), Some(0.0));
    }

    #[test]
    fn the_hosts_files_without_a_v2_cgroup_and_none_without_psi() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        write(root, "proc/self/cgroup", "4:memory:/job\n0::/\n");
        std::fs::create_dir_all(root.join("sys/fs/cgroup/memory")).unwrap();
        let roots = Roots::under(root);
        assert!(PressureSampler::probe(&roots, Duration::ZERO).unwrap().is_none());
        write(root, "proc/pressure/cpu", &psi(10, None));
        write(root, "proc/pressure/io", &psi(10, Some(10)));
        let mut s = PressureSampler::probe(&roots, Duration::ZERO).unwrap().unwrap();
        assert_eq!(s.dir(), root.join("proc/pressure"));
        write(root, "proc/pressure/cpu", &psi(50_010, None));
        write(root, "proc/pressure/io", &psi(10, Some(10)));
        let mut m = Metrics::new();
        s.sample(Duration::from_millis(100), &mut m).unwrap();
        assert_eq!(m.get("pressure", "CPU", "SomeStalledPercent"), Some(50.0));
        assert_eq!(m.get("pressure", "CPU", "FullStalledPercent"), None);
        assert_eq!(m.get("pressure", "IO", "FullStalledPercent"), Some(0.0));
        assert_eq!(m.get("pressure", "Memory", "SomeStalledPercent"), None);
    }
}
