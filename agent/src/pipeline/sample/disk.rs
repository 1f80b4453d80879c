//! Disk IOPS and throughput for whole physical disks, from `/sys/block/<disk>/stat`
//! (the same counters as a `/proc/diskstats` line, without the name).
//!
//! Whole disks are the entries of `/sys/block` that do not live under
//! `/sys/devices/virtual` (loop, ram, zram, device-mapper: their I/O is already counted
//! on the disk below, or is not disk I/O at all); partitions are not in `/sys/block`.
//! The set is fixed at probe time. One small file per disk, kept open, costs the kernel
//! less than `/proc/diskstats`, which formats every loop device and partition too.
//!
//! Type `i/o`, Names `IOPS`, `ReadThroughputInBytesPerSecond`,
//! `WriteThroughputInBytesPerSecond`, Dimension `""` (docs/formats.md, "System metrics: vocabulary"). These are host numbers; the container's own come from the cgroup sampler.

use std::path::Path;
use std::time::Duration;

use super::{Metrics, Name, ParseError, ProcFile, SampleError, Sampler, fields, parse_u64, rate};
use super::{dimension as d, name as n};

/// The block layer counts sectors of 512 bytes, whatever the device's sector size.
const SECTOR: u64 = 512;

/// Summed counters of the selected disks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskTotals {
    pub ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// The physical whole disks listed in `<sys>/block`, named as `/proc/diskstats` names
/// them (`/sys` writes `/` in a name as `!`).
pub fn whole_disks(sys: &Path) -> std::io::Result<Vec<Vec<u8>>> {
    let mut disks = Vec::new();
    for entry in std::fs::read_dir(sys.join("block"))? {
        let entry = entry?;
        let target = std::fs::read_link(entry.path()).unwrap_or_default();
        if target.to_string_lossy().contains("devices/virtual/") {
            continue;
        }
        disks.push(entry.file_name().to_string_lossy().replace('!', "/").into_bytes());
    }
    disks.sort();
    Ok(disks)
}

/// The counters of one `/sys/block/<disk>/stat`: reads, reads merged, sectors read, ms
/// reading, writes, writes merged, sectors written, …
pub fn parse_block_stat(text: &[u8]) -> Result<DiskTotals, ParseError> {
    let mut v = [0u64; 7];
    let mut f = fields(text);
    for slot in &mut v {
        let field = f.next().ok_or("short stat line")?;
        *slot = parse_u64(field).ok_or_else(|| ParseError::Bad {
            what: "number",
            got: format!("{:?}", String::from_utf8_lossy(field)),
        })?;
    }
    Ok(DiskTotals {
        ios: v[0].wrapping_add(v[4]),
        read_bytes: v[2].wrapping_mul(SECTOR),
        write_bytes: v[6].wrapping_mul(SECTOR),
    })
}

/// The whole-disk sampler.
#[derive(Debug)]
pub struct DiskSampler {
    files: Vec<ProcFile>,
    disks: Vec<Vec<u8>>,
    prev: DiskTotals,
    prev_at: Duration,
}

impl DiskSampler {
    /// `Ok(None)` when the machine shows no physical disk (or no `/sys/block`).
    pub fn probe(sys: &Path, now: Duration) -> Result<Option<DiskSampler>, SampleError> {
        let disks = match whole_disks(sys) {
            Ok(d) if !d.is_empty() => d,
            Ok(_) => return Ok(None),
            Err(e) => {
                crate::log!("no disk sampler: cannot list {}: {e}", sys.join("block").display());
                return Ok(None);
            }
        };
        let mut files = Vec::with_capacity(disks.len());
        for d in &disks {
            let name = String::from_utf8_lossy(d).replace('/', "!");
            files.push(ProcFile::open(sys.join("block").join(name).join("stat"))?);
        }
        let mut s = DiskSampler { files, disks, prev: DiskTotals::default(), prev_at: now };
        s.prev = s.read()?;
        Ok(Some(s))
    }

    /// The disks it sums.
    pub fn disks(&self) -> impl Iterator<Item = std::borrow::Cow<'_, str>> {
        self.disks.iter().map(|d| String::from_utf8_lossy(d))
    }

    fn read(&mut self) -> Result<DiskTotals, SampleError> {
        let mut t = DiskTotals::default();
        for f in &mut self.files {
            let d = parse_block_stat(f.read()?).map_err(|e| SampleError::parse(f.path(), e))?;
            t.ios = t.ios.wrapping_add(d.ios);
            t.read_bytes = t.read_bytes.wrapping_add(d.read_bytes);
            t.write_bytes = t.write_bytes.wrapping_add(d.write_bytes);
        }
        Ok(t)
    }
}

impl Sampler for DiskSampler {
    fn name(&self) -> &'static str {
        "disk"
    }

    fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        let cur = self.read()?;
        let dt = now.saturating_sub(self.prev_at);
        out.push(
            crate::pipeline::sample::MetricType::Io,
            Name::Static(n::IOPS),
            d::NONE,
            rate(self.prev.ios, cur.ios, dt),
        );
        out.push(
            crate::pipeline::sample::MetricType::Io,
            Name::Static(n::READ_THROUGHPUT),
            d::NONE,
            rate(self.prev.read_bytes, cur.read_bytes, dt),
        );
        out.push(
            crate::pipeline::sample::MetricType::Io,
            Name::Static(n::WRITE_THROUGHPUT),
            d::NONE,
            rate(self.prev.write_bytes, cur.write_bytes, dt),
        );
        (self.prev, self.prev_at) = (cur, now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_block_stat_line() {
        let real = b"  399679    45916 33046930   590222    71276   179369 27745768    87971        0    54840   689724   110707       18 19003088    10671     9570      858\n";
        assert_eq!(
            parse_block_stat(real).unwrap(),
            DiskTotals { ios: 470_955, read_bytes: 33_046_930 * 512, write_bytes: 27_745_768 * 512 }
        );
        assert!(parse_block_stat(b"1 2 3").is_err());
        assert!(parse_block_stat(b"1 2 3 4 5 6 x").is_err());
    }

    #[test]
    fn whole_physical_disks_only_with_rates() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let sys = root.join("sys");
        for d in ["sys/block", "sys/devices/virtual/block/loop0", "sys/devices/pci0/virtio1/block/vda"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::os::unix::fs::symlink("../devices/virtual/block/loop0", sys.join("block/loop0")).unwrap();
        std::os::unix::fs::symlink("../devices/pci0/virtio1/block/vda", sys.join("block/vda")).unwrap();
        assert_eq!(whole_disks(&sys).unwrap(), vec![b"vda".to_vec()]);
        let stat = sys.join("devices/pci0/virtio1/block/vda/stat");
        std::fs::write(
            &stat,
            "     100        0     2000       10       50        0     1000        5 0 0 0\n",
        )
        .unwrap();
        let mut s = DiskSampler::probe(&sys, Duration::from_secs(10)).unwrap().unwrap();
        assert_eq!(s.disks().collect::<Vec<_>>(), vec!["vda"]);
        std::fs::write(
            &stat,
            "     300        0     4048       10      150        0     5096        5 0 0 0\n",
        )
        .unwrap();
        let mut m = Metrics::new();
        s.sample(Duration::from_secs(12), &mut m).unwrap();
        assert_eq!(m.get("i/o", "IOPS", ""), Some(150.0));
        assert_eq!(m.get("i/o", "ReadThroughputInBytesPerSecond", ""), Some(1024.0 * 512.0));
        assert_eq!(m.get("i/o", "WriteThroughputInBytesPerSecond", ""), Some(2048.0 * 512.0));
        // No physical disk: no sampler.
        std::fs::remove_file(sys.join("block/vda")).unwrap();
        assert!(DiskSampler::probe(&sys, Duration::ZERO).unwrap().is_none());
    }
}
