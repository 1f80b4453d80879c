//! CPU utilisation and I/O wait per core and in total, from `/proc/stat`.
//!
//! Per core `cpuN`: Type `cpu`, Dimensions `CPUUtilization` and `I/OWaitPercentage` (the
//! vocabulary of `docs/formats.md`). The machine total is Type `host`, Name `AllCores`,
//! Dimensions `BusyPercent` and `IOWaitPercent`: smdebug's rules count every Name with
//! Dimension `CPUUtilization` as a core, and its analysis takes every row under a Type
//! containing `cpu` as one core's figure. These are host numbers; the container's use
//! against its quota comes from the cgroup sampler.

use std::time::Duration;

use super::{
    MetricType, Metrics, Name, ParseError, ProcFile, SampleError, Sampler, fields, parse_u64, percent,
};
use super::{dimension as d, name as n};

/// The jiffy counters of one `cpu` line that matter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// All time but guest time (already counted in user / nice).
    pub total: u64,
    /// idle + iowait: not running anything.
    pub idle: u64,
    pub iowait: u64,
}

/// One `cpu` or `cpuN` line of `/proc/stat`: which core (`None` for the total line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuLine {
    pub core: Option<u32>,
    pub times: CpuTimes,
}

/// Parses the `cpu` lines of `/proc/stat` into `out` (cleared first). The total line
/// comes first, then the cores in file order (an offline core has no line). The kernel
/// writes the `cpu` lines as one block at the top of the file, so parsing stops at the
/// first other line after them: the rest (`intr` alone holds one number per interrupt
/// line) is never scanned.
pub fn parse_stat(text: &[u8], out: &mut Vec<CpuLine>) -> Result<(), ParseError> {
    out.clear();
    for line in text.split(|&b| b == b'\n') {
        let Some(rest) = line.strip_prefix(b"cpu") else {
            if out.is_empty() {
                continue;
            }
            break;
        };
        let mut f = fields(rest);
        let label = if rest.first().is_some_and(|b| b.is_ascii_whitespace()) {
            &b""[..]
        } else {
            f.next().unwrap_or_default()
        };
        let core = if label.is_empty() {
            None
        } else {
            let n = parse_u64(label)
                .ok_or_else(|| ParseError::Bad { what: "cpu label", got: format!("{:?}", lossy(label)) })?;
            Some(u32::try_from(n).map_err(|_| ParseError::from("cpu index out of range"))?)
        };
        // user nice system idle iowait irq softirq steal guest guest_nice (older kernels
        // have fewer; at least the first four exist since 2.4).
        let mut v = [0u64; 10];
        let mut n = 0;
        for (slot, field) in v.iter_mut().zip(&mut f) {
            *slot = parse_u64(field)
                .ok_or_else(|| ParseError::Bad { what: "number", got: format!("{:?}", lossy(field)) })?;
            n += 1;
        }
        if n < 4 {
            return Err(ParseError::Other(format!("cpu line with {n} fields").into()));
        }
        let [user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice] = v;
        // Guest time is already part of user and nice.
        let total =
            [nice.saturating_sub(guest_nice), system, idle, iowait, irq, softirq, steal, guest, guest_nice]
                .into_iter()
                .fold(user.saturating_sub(guest), u64::saturating_add);
        out.push(CpuLine { core, times: CpuTimes { total, idle: idle.saturating_add(iowait), iowait } });
    }
    if out.first().is_none_or(|l| l.core.is_some()) {
        return Err(ParseError::Missing("total cpu line".into()));
    }
    Ok(())
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// (utilisation %, iowait %) between two readings of one line.
pub fn utilisation(prev: CpuTimes, cur: CpuTimes) -> (f64, f64) {
    let total = cur.total.saturating_sub(prev.total) as f64;
    let idle = cur.idle.saturating_sub(prev.idle) as f64;
    let iowait = cur.iowait.saturating_sub(prev.iowait) as f64;
    (percent(total - idle, total), percent(iowait, total))
}

/// The `/proc/stat` sampler.
#[derive(Debug)]
pub struct CpuSampler {
    file: ProcFile,
    prev: Vec<CpuLine>,
    cur: Vec<CpuLine>,
}

impl CpuSampler {
    /// Opens `<proc>/stat` and takes the first reading.
    pub fn probe(proc: &std::path::Path) -> Result<CpuSampler, SampleError> {
        let mut file = ProcFile::open(proc.join("stat"))?;
        let mut prev = Vec::new();
        parse_stat(file.read()?, &mut prev).map_err(|e| SampleError::parse(file.path(), e))?;
        Ok(CpuSampler { file, prev, cur: Vec::new() })
    }

    /// How many cores the last reading had.
    pub fn cores(&self) -> usize {
        self.prev.len().saturating_sub(1)
    }
}

impl Sampler for CpuSampler {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn sample(&mut self, _now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        let text = self.file.read()?;
        parse_stat(text, &mut self.cur).map_err(|e| SampleError::parse(self.file.path(), e))?;
        for (i, line) in self.cur.iter().enumerate() {
            // Match by core, not by position: a core going offline shifts the lines. The
            // same position first: with no change it is the one (no quadratic search on a
            // host of hundreds of cores).
            let prev = match self.prev.get(i) {
                Some(p) if p.core == line.core => p,
                _ => match self.prev.iter().find(|p| p.core == line.core) {
                    Some(p) => p,
                    None => continue,
                },
            };
            let (busy, iowait) = utilisation(prev.times, line.times);
            match line.core {
                Some(i) => {
                    out.push(MetricType::Cpu, Name::core(i), d::CPU_UTILIZATION, busy);
                    out.push(MetricType::Cpu, Name::core(i), d::IO_WAIT_PERCENTAGE, iowait);
                }
                None => {
                    out.push(MetricType::Host, Name::Static(n::ALL_CORES), d::BUSY_PERCENT, busy);
                    out.push(MetricType::Host, Name::Static(n::ALL_CORES), d::IO_WAIT_PERCENT, iowait);
                }
            }
        }
        std::mem::swap(&mut self.prev, &mut self.cur);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_A: &str = "cpu  100 0 50 800 50 0 0 0 0 0\n\
cpu0 50 0 25 400 25 0 0 0 0 0\n\
cpu1 50 0 25 400 25 0 0 0 0 0\n\
intr 12345 1 2 3\nctxt 999\nbtime 1700000000\nprocesses 42\n";
    // cpu0 fully busy for 100 jiffies; cpu1 idle 50 and iowait 50.
    const STAT_B: &str = "cpu  200 0 50 850 100 0 0 0 0 0\n\
cpu0 150 0 25 400 25 0 0 0 0 0\n\
cpu1 50 0 25 450 75 0 0 0 0 0\n\
intr 12345 1 2 3\n";

    #[test]
    fn parses_total_and_cores() {
        let mut v = Vec::new();
        parse_stat(STAT_A.as_bytes(), &mut v).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0], CpuLine { core: None, times: CpuTimes { total: 1000, idle: 850, iowait: 50 } });
        assert_eq!(v[2].core, Some(1));
    }

    #[test]
    fn guest_time_is_not_counted_twice_and_old_kernels_parse() {
        let mut v = Vec::new();
        parse_stat(b"cpu 100 10 0 0 0 0 0 0 40 5\n", &mut v).unwrap();
        assert_eq!(v[0].times.total, 110);
        parse_stat(b"cpu 1 2 3 4\ncpu0 1 2 3 4\n", &mut v).unwrap();
        assert_eq!(v[1].times, CpuTimes { total: 10, idle: 4, iowait: 0 });
    }

    #[test]
    fn only_the_block_of_cpu_lines_is_read() {
        let mut v = Vec::new();
        parse_stat(b"cpu 1 2 3 4\ncpu0 1 2 3 4\nintr 1 2\ncpu_x not numbers\n", &mut v).unwrap();
        assert_eq!(v.len(), 2);
    }

    #[test]
    fn a_core_gone_in_the_middle_keeps_the_others_matched() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let line = |l: &str, busy: u64| format!("{l} {busy} 0 0 {} 0 0 0 0 0 0\n", 1000 - busy);
        std::fs::write(
            dir.join("stat"),
            [line("cpu ", 0), line("cpu0", 0), line("cpu1", 0), line("cpu2", 0)].concat(),
        )
        .unwrap();
        let mut s = CpuSampler::probe(dir).unwrap();
        // cpu1 offline; cpu2 now sits where cpu1 was. Each core's counters advance by
        // 100 jiffies: cpu0 all busy, cpu2 a quarter.
        let advanced = |l: &str, busy: u64| format!("{l} {busy} 0 0 {} 0 0 0 0 0 0\n", 1100 - busy);
        std::fs::write(
            dir.join("stat"),
            [advanced("cpu ", 50), advanced("cpu0", 100), advanced("cpu2", 25)].concat(),
        )
        .unwrap();
        let mut m = Metrics::new();
        s.sample(Duration::from_secs(1), &mut m).unwrap();
        assert_eq!(m.get("cpu", "cpu0", "CPUUtilization"), Some(100.0));
        assert_eq!(m.get("cpu", "cpu2", "CPUUtilization"), Some(25.0));
        assert_eq!(m.get("cpu", "cpu1", "CPUUtilization"), None);
    }

    #[test]
    fn malformed_text_is_an_error_not_a_panic() {
        let mut v = Vec::new();
        for bad in ["", "cpu 1 2\n", "cpu x 2 3 4\n", "cpuX 1 2 3 4\n", "cpu0 1 2 3 4\n", "cpu 1 2 3 -4\n"] {
            assert!(parse_stat(bad.as_bytes(), &mut v).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn samples_per_core_and_total() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("stat"), STAT_A).unwrap();
        let mut s = CpuSampler::probe(&dir).unwrap();
        assert_eq!(s.cores(), 2);
        std::fs::write(dir.join("stat"), STAT_B).unwrap();
        let mut m = Metrics::new();
        s.sample(Duration::from_secs(1), &mut m).unwrap();
        assert_eq!(m.get("cpu", "cpu0", "CPUUtilization"), Some(100.0));
        assert_eq!(m.get("cpu", "cpu0", "I/OWaitPercentage"), Some(0.0));
        assert_eq!(m.get("cpu", "cpu1", "CPUUtilization"), Some(0.0));
        assert_eq!(m.get("cpu", "cpu1", "I/OWaitPercentage"), Some(50.0));
        assert_eq!(m.get("host", "AllCores", "BusyPercent"), Some(50.0));
        assert_eq!(m.get("host", "AllCores", "IOWaitPercent"), Some(25.0));
        assert_eq!(m.len(), 6);
        // Under Type `cpu`, one Name per core and nothing else.
        let cores: std::collections::BTreeSet<_> =
            m.as_slice().iter().filter(|x| x.kind == "cpu").map(|x| x.name.to_string()).collect();
        assert_eq!(cores.into_iter().collect::<Vec<_>>(), ["cpu0", "cpu1"]);
        // cpu1 goes offline: cpu0 keeps its own history.
        std::fs::write(dir.join("stat"), "cpu  300 0 50 850 100 0 0 0 0 0\ncpu0 250 0 25 400 25 0 0 0 0 0\n")
            .unwrap();
        m.clear();
        s.sample(Duration::from_secs(2), &mut m).unwrap();
        assert_eq!(m.get("cpu", "cpu0", "CPUUtilization"), Some(100.0));
        assert_eq!(m.get("cpu", "cpu1", "CPUUtilization"), None);
    }
}
