//! Memory in use: Type `memory`, Name `MemoryUsedPercent`, Dimension `""` (the vocabulary
//! of `docs/formats.md`), against the container's memory limit when it has one, else
//! against the host.
//!
//! Also `MemoryUsedBytes` and `MemoryLimitBytes` under Type `ram` (never `memory`: smdebug's
//! analysis takes every row under a Type containing `memory` for a percentage) with
//! Dimension `cgroup` or `host`, which says what the percentage was taken against. Host "used" is
//! `MemTotal − MemAvailable` from `/proc/meminfo` (what `free` calls used, without the
//! cache the kernel gives back); the container's is its working set (see
//! [`CgroupMemory`]). A limit above the host's memory is capped at the host's memory.

use std::path::Path;
use std::time::Duration;

use super::cgroup::CgroupMemory;
use super::{
    MetricType, Metrics, Name, ParseError, ProcFile, SampleError, Sampler, fields, parse_u64, percent,
};
use super::{dimension as d, name as n};

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn parse_meminfo(text: &[u8]) -> Result<(u64, u64), ParseError> {
    let (mut total, mut available) = (None, None);
    for line in text.split(|&b| b == b'\n') {
        let slot = if line.starts_with(b"MemTotal:") {
            &mut total
        } else if line.starts_with(b"MemAvailable:") {
            &mut available
        } else {
            continue;
        };
        let kib = fields(line).nth(1).and_then(parse_u64).ok_or("bad number in /proc/meminfo")?;
        *slot = Some(kib.saturating_mul(1024));
        if total.is_some() && available.is_some() {
            // Both are among the first lines; the other fifty are never scanned.
            break;
        }
    }
    match (total, available) {
        (Some(t), Some(a)) => Ok((t, a)),
        // Kernels before 3.14 have no MemAvailable.
        _ => Err(ParseError::Missing("MemTotal or MemAvailable".into())),
    }
}

/// The memory sampler.
#[derive(Debug)]
pub struct MemorySampler {
    meminfo: ProcFile,
    cgroup: Option<CgroupMemory>,
}

impl MemorySampler {
    pub fn probe(proc: &Path, cgroup: Option<CgroupMemory>) -> Result<MemorySampler, SampleError> {
        let mut meminfo = ProcFile::open(proc.join("meminfo"))?;
        parse_meminfo(meminfo.read()?).map_err(|e| SampleError::parse(meminfo.path(), e))?;
        Ok(MemorySampler { meminfo, cgroup })
    }

    /// Whether percentages are of a cgroup limit.
    pub fn against_cgroup(&self) -> bool {
        self.cgroup.is_some()
    }
}

impl Sampler for MemorySampler {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn sample(&mut self, _now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        let (total, available) =
            parse_meminfo(self.meminfo.read()?).map_err(|e| SampleError::parse(self.meminfo.path(), e))?;
        let (used, limit, basis) = match self.cgroup.as_mut() {
            Some(c) => {
                let r = c.read()?;
                (r.used_bytes, r.limit_bytes.min(total), d::CGROUP)
            }
            None => (total.saturating_sub(available), total, d::HOST),
        };
        out.push(
            MetricType::Memory,
            Name::Static(n::MEMORY_USED_PERCENT),
            d::NONE,
            percent(used as f64, limit as f64),
        );
        out.push(MetricType::Ram, Name::Static(n::MEMORY_USED_BYTES), basis, used as f64);
        out.push(MetricType::Ram, Name::Static(n::MEMORY_LIMIT_BYTES), basis, limit as f64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::sample::Roots;

    const MEMINFO: &str =
        "MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\nBuffers: 1 kB\n";

    #[test]
    fn parses_meminfo() {
        assert_eq!(parse_meminfo(MEMINFO.as_bytes()), Ok((1_024_000, 256_000)));
        assert!(parse_meminfo(b"MemTotal: 1 kB\n").is_err());
        assert!(parse_meminfo(b"MemTotal: x kB\nMemAvailable: 1 kB\n").is_err());
        // Nothing after the two lines is read.
        assert_eq!(parse_meminfo(b"MemTotal: 2 kB\nMemAvailable: 1 kB\nMemTotal: x\n"), Ok((2048, 1024)));
    }

    #[test]
    fn host_or_cgroup_basis() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let roots = Roots::under(&root);
        std::fs::create_dir_all(roots.proc.join("self")).unwrap();
        std::fs::write(roots.proc.join("meminfo"), MEMINFO).unwrap();
        let mut m = Metrics::new();
        let mut host = MemorySampler::probe(&roots.proc, None).unwrap();
        host.sample(Duration::ZERO, &mut m).unwrap();
        assert_eq!(m.get("memory", "MemoryUsedPercent", ""), Some(75.0));
        assert_eq!(m.get("ram", "MemoryUsedBytes", "host"), Some(768_000.0));
        // A cgroup v2 container limited to 512000 bytes, 128000 of them in use
        // (plus 64000 of inactive file cache that does not count).
        std::fs::create_dir_all(&roots.cgroup).unwrap();
        std::fs::write(roots.proc.join("self/cgroup"), "0::/\n").unwrap();
        std::fs::write(roots.cgroup.join("cgroup.controllers"), "cpu io memory\n").unwrap();
        std::fs::write(roots.cgroup.join("memory.max"), "512000\n").unwrap();
        std::fs::write(roots.cgroup.join("memory.current"), "192000\n").unwrap();
        std::fs::write(roots.cgroup.join("memory.stat"), "anon 128000\ninactive_file 64000\nactive_file 0\n")
            .unwrap();
        let cg = CgroupMemory::probe(&roots).unwrap().unwrap();
        let mut s = MemorySampler::probe(&roots.proc, Some(cg)).unwrap();
        assert!(s.against_cgroup());
        m.clear();
        s.sample(Duration::ZERO, &mut m).unwrap();
        assert_eq!(m.get("memory", "MemoryUsedPercent", ""), Some(25.0));
        assert_eq!(m.get("ram", "MemoryUsedBytes", "cgroup"), Some(128_000.0));
        assert_eq!(m.get("ram", "MemoryLimitBytes", "cgroup"), Some(512_000.0));
        assert_eq!(m.as_slice().iter().filter(|x| x.kind.as_str().contains("memory")).count(), 1);
        // A limit above the host's memory is the host's memory.
        std::fs::write(roots.cgroup.join("memory.max"), "99999999999\n").unwrap();
        m.clear();
        s.sample(Duration::ZERO, &mut m).unwrap();
        assert_eq!(m.get("ram", "MemoryLimitBytes", "cgroup"), Some(1_024_000.0));
    }
}
