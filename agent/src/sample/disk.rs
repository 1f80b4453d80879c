//! Disk IOPS and throughput for whole physical disks, from `/proc/diskstats`.
//!
//! Whole disks are the entries of `/sys/block` that do not live under
//! `/sys/devices/virtual` (loop, ram, zram, device-mapper: their I/O is already counted
//! on the disk below, or is not disk I/O at all); partitions are not in `/sys/block`.
//! The set is fixed at probe time. Type `i/o`, Names `IOPS`,
//! `ReadThroughputInBytesPerSecond`, `WriteThroughputInBytesPerSecond`, Dimension `""`
//! (spec §2.3). These are host numbers; the container's own come from the cgroup sampler.

use std::path::Path;
use std::time::Duration;

use super::{Metrics, Name, ProcFile, SampleError, Sampler, fields, parse_u64, rate};

/// `/proc/diskstats` counts sectors of 512 bytes, whatever the device's sector size.
const SECTOR: u64 = 512;

/// Summed counters of the selected disks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskTotals {
    pub ios: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// Sums the counters of the devices `keep` accepts.
pub fn parse_diskstats(text: &[u8], keep: impl Fn(&[u8]) -> bool) -> Result<DiskTotals, String> {
    let mut t = DiskTotals::default();
    for line in text.split(|&b| b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)) {
        let mut f = fields(line).skip(2);
        let name = f.next().ok_or("short line")?;
        if !keep(name) {
            continue;
        }
        // reads, reads merged, sectors read, ms reading, writes, writes merged, sectors written
        let mut v = [0u64; 7];
        for slot in &mut v {
            let field =
                f.next().ok_or_else(|| format!("short line for {}", String::from_utf8_lossy(name)))?;
            *slot = parse_u64(field)
                .ok_or_else(|| format!("bad number in line for {}", String::from_utf8_lossy(name)))?;
        }
        t.ios = t.ios.wrapping_add(v[0]).wrapping_add(v[4]);
        t.read_bytes = t.read_bytes.wrapping_add(v[2].wrapping_mul(SECTOR));
        t.write_bytes = t.write_bytes.wrapping_add(v[6].wrapping_mul(SECTOR));
    }
    Ok(t)
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

/// The `/proc/diskstats` sampler.
#[derive(Debug)]
pub struct DiskSampler {
    file: ProcFile,
    disks: Vec<Vec<u8>>,
    prev: DiskTotals,
    prev_at: Duration,
}

impl DiskSampler {
    /// `Ok(None)` when the machine shows no physical disk (or no `/sys/block`).
    pub fn probe(proc: &Path, sys: &Path, now: Duration) -> Result<Option<DiskSampler>, SampleError> {
        let disks = match whole_disks(sys) {
            Ok(d) if !d.is_empty() => d,
            Ok(_) => return Ok(None),
            Err(e) => {
                crate::log!("no disk sampler: cannot list {}: {e}", sys.join("block").display());
                return Ok(None);
            }
        };
        let mut s = DiskSampler {
            file: ProcFile::open(proc.join("diskstats"))?,
            disks,
            prev: DiskTotals::default(),
            prev_at: now,
        };
        s.prev = s.read()?;
        Ok(Some(s))
    }

    /// The disks it sums.
    pub fn disks(&self) -> impl Iterator<Item = std::borrow::Cow<'_, str>> {
        self.disks.iter().map(|d| String::from_utf8_lossy(d))
    }

    fn read(&mut self) -> Result<DiskTotals, SampleError> {
        let disks = &self.disks;
        let text = self.file.read()?;
        parse_diskstats(text, |n| disks.iter().any(|d| d == n))
            .map_err(|e| SampleError::parse(self.file.path(), e))
    }
}

impl Sampler for DiskSampler {
    fn name(&self) -> &'static str {
        "disk"
    }

    fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        let cur = self.read()?;
        let dt = now.saturating_sub(self.prev_at);
        out.push("i/o", Name::Static("IOPS"), "", rate(self.prev.ios, cur.ios, dt));
        out.push(
            "i/o",
            Name::Static("ReadThroughputInBytesPerSecond"),
            "",
            rate(self.prev.read_bytes, cur.read_bytes, dt),
        );
        out.push(
            "i/o",
            Name::Static("WriteThroughputInBytesPerSecond"),
            "",
            rate(self.prev.write_bytes, cur.write_bytes, dt),
        );
        (self.prev, self.prev_at) = (cur, now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "   7       0 loop0 5 0 10 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n\
 253       0 vda 100 0 2000 10 50 0 1000 5 0 0 0 0 0 0 0 0 0\n\
 253       1 vda1 90 0 1800 10 50 0 1000 5 0 0 0 0 0 0 0 0 0\n\
 259       0 nvme0n1 10 0 8 1 10 0 8 1 0 0 0\n";

    #[test]
    fn sums_only_the_kept_devices() {
        let t = parse_diskstats(A.as_bytes(), |n| n == b"vda" || n == b"nvme0n1").unwrap();
        assert_eq!(t, DiskTotals { ios: 170, read_bytes: 2008 * 512, write_bytes: 1008 * 512 });
        assert!(parse_diskstats(b" 1 2 sda 1 2 x 4 5 6 7\n", |_| true).is_err());
        assert!(parse_diskstats(b" 1 2 sda 1 2\n", |_| true).is_err());
        assert!(parse_diskstats(b" 1 2\n", |_| true).is_err());
        // A short line of a device nobody asked for is not an error.
        assert_eq!(parse_diskstats(b" 1 2 sdz 1\n", |_| false).unwrap(), DiskTotals::default());
    }

    #[test]
    fn whole_physical_disks_only_with_rates() {
        let root = std::env::temp_dir().join(format!("trainprof-disk-{}", std::process::id()));
        let (proc, sys) = (root.join("proc"), root.join("sys"));
        for d in
            ["proc", "sys/block", "sys/devices/virtual/block/loop0", "sys/devices/pci0/virtio1/block/vda"]
        {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::os::unix::fs::symlink("../devices/virtual/block/loop0", sys.join("block/loop0")).unwrap();
        std::os::unix::fs::symlink("../devices/pci0/virtio1/block/vda", sys.join("block/vda")).unwrap();
        assert_eq!(whole_disks(&sys).unwrap(), vec![b"vda".to_vec()]);
        std::fs::write(proc.join("diskstats"), A).unwrap();
        let mut s = DiskSampler::probe(&proc, &sys, Duration::from_secs(10)).unwrap().unwrap();
        std::fs::write(
            proc.join("diskstats"),
            A.replace("vda 100 0 2000 10 50 0 1000", "vda 300 0 4048 10 150 0 5096"),
        )
        .unwrap();
        let mut m = Metrics::new();
        s.sample(Duration::from_secs(12), &mut m).unwrap();
        assert_eq!(m.get("i/o", "IOPS", ""), Some(150.0));
        assert_eq!(m.get("i/o", "ReadThroughputInBytesPerSecond", ""), Some(1024.0 * 512.0));
        assert_eq!(m.get("i/o", "WriteThroughputInBytesPerSecond", ""), Some(2048.0 * 512.0));
        // No physical disk: no sampler.
        std::fs::remove_file(sys.join("block/vda")).unwrap();
        assert!(DiskSampler::probe(&proc, &sys, Duration::ZERO).unwrap().is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
