//! Network throughput of the agent's network namespace (the container's interfaces),
//! loopback excluded, from `/proc/net/dev`.
//!
//! Type `network`, Names `ReceiveBytesPerSecond` / `TransmitBytesPerSecond`, Dimension
//! `Algorithm` (docs/formats.md, "System metrics: vocabulary": the rules sum the `Algorithm` rows). Counters are kept per
//! interface, so an interface that appears or goes away does not make a jump.

use std::path::Path;
use std::time::Duration;

use super::{Metrics, Name, ParseError, ProcFile, SampleError, Sampler, fields, parse_u64};
use super::{dimension as d, name as n};

/// One interface's byte counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfBytes {
    pub name: Vec<u8>,
    pub rx: u64,
    pub tx: u64,
}

/// Calls `each(name, rx_bytes, tx_bytes)` for every interface but `lo`.
pub fn parse_net_dev(text: &[u8], mut each: impl FnMut(&[u8], u64, u64)) -> Result<(), ParseError> {
    // Two header lines, then `  eth0: rx_bytes packets … (8 fields) tx_bytes …`; a large
    // counter may touch the colon.
    for line in text.split(|&b| b == b'\n').skip(2) {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let colon = line.iter().position(|&b| b == b':').ok_or("line without ':'")?;
        let name = line[..colon].trim_ascii();
        let mut f = fields(&line[colon + 1..]);
        let rx = f.next().and_then(parse_u64);
        let tx = f.nth(7).and_then(parse_u64);
        let (Some(rx), Some(tx)) = (rx, tx) else {
            return Err(ParseError::Bad {
                what: "counters for",
                got: String::from_utf8_lossy(name).into_owned(),
            });
        };
        if name != b"lo" {
            each(name, rx, tx);
        }
    }
    Ok(())
}

/// The `/proc/net/dev` sampler.
#[derive(Debug)]
pub struct NetSampler {
    file: ProcFile,
    prev: Vec<IfBytes>,
    prev_at: Duration,
    seen: Vec<bool>,
}

impl NetSampler {
    pub fn probe(proc: &Path, now: Duration) -> Result<NetSampler, SampleError> {
        let mut s = NetSampler {
            file: ProcFile::open(proc.join("net/dev"))?,
            prev: Vec::new(),
            prev_at: now,
            seen: Vec::new(),
        };
        s.update()?;
        Ok(s)
    }

    /// Reads the file, updates `prev` in place and returns the bytes moved since the last
    /// read by the interfaces present both times.
    fn update(&mut self) -> Result<(u64, u64), SampleError> {
        let text = self.file.read()?;
        let (prev, seen) = (&mut self.prev, &mut self.seen);
        seen.clear();
        seen.resize(prev.len(), false);
        let (mut rx_d, mut tx_d) = (0u64, 0u64);
        parse_net_dev(text, |name, rx, tx| match prev.iter().position(|p| p.name == name) {
            Some(i) => {
                rx_d = rx_d.saturating_add(rx.saturating_sub(prev[i].rx));
                tx_d = tx_d.saturating_add(tx.saturating_sub(prev[i].tx));
                (prev[i].rx, prev[i].tx, seen[i]) = (rx, tx, true);
            }
            None => {
                prev.push(IfBytes { name: name.to_vec(), rx, tx });
                seen.push(true);
            }
        })
        .map_err(|e| SampleError::parse(self.file.path(), e))?;
        let mut keep = self.seen.iter();
        self.prev.retain(|_| keep.next().copied().unwrap_or(true));
        Ok((rx_d, tx_d))
    }
}

impl Sampler for NetSampler {
    fn name(&self) -> &'static str {
        "network"
    }

    fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        let (rx, tx) = self.update()?;
        let secs = now.saturating_sub(self.prev_at).as_secs_f64();
        self.prev_at = now;
        let per_s = |v: u64| if secs > 0.0 { v as f64 / secs } else { f64::NAN };
        out.push(
            crate::pipeline::sample::MetricType::Network,
            Name::Static(n::RECEIVE_BYTES_PER_SECOND),
            d::ALGORITHM,
            per_s(rx),
        );
        out.push(
            crate::pipeline::sample::MetricType::Network,
            Name::Static(n::TRANSMIT_BYTES_PER_SECOND),
            d::ALGORITHM,
            per_s(tx),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "Inter-|   Receive                                                |  Transmit\n \
face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n";

    fn text(lines: &[&str]) -> String {
        let mut s = HEAD.to_owned();
        for l in lines {
            s.push_str(l);
            s.push('\n');
        }
        s
    }

    #[test]
    fn parses_and_skips_loopback() {
        let t = text(&[
            "    lo:    9579      87    0    0    0     0          0         0     9579      87    0    0    0     0       0          0",
            "  eth0:12345678901 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0",
        ]);
        let mut seen = Vec::new();
        parse_net_dev(t.as_bytes(), |n, rx, tx| seen.push((n.to_vec(), rx, tx))).unwrap();
        assert_eq!(seen, vec![(b"eth0".to_vec(), 12_345_678_901, 2000)]);
        assert!(parse_net_dev(text(&["eth0 1 2 3"]).as_bytes(), |_, _, _| {}).is_err());
        assert!(parse_net_dev(text(&["eth0: 1 2 3"]).as_bytes(), |_, _, _| {}).is_err());
    }

    #[test]
    fn rates_per_interface_without_jumps() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::create_dir_all(dir.join("net")).unwrap();
        let write = |lines: &[&str]| std::fs::write(dir.join("net/dev"), text(lines)).unwrap();
        write(&["lo: 5 0 0 0 0 0 0 0 5 0 0 0 0 0 0 0", "eth0: 1000 0 0 0 0 0 0 0 500 0 0 0 0 0 0 0"]);
        let mut s = NetSampler::probe(&dir, Duration::from_secs(1)).unwrap();
        write(&[
            "lo: 99999 0 0 0 0 0 0 0 99999 0 0 0 0 0 0 0",
            "eth0: 3000 0 0 0 0 0 0 0 1500 0 0 0 0 0 0 0",
            "eth1: 777777 0 0 0 0 0 0 0 777777 0 0 0 0 0 0 0",
        ]);
        let mut m = Metrics::new();
        s.sample(Duration::from_millis(1500), &mut m).unwrap();
        assert_eq!(m.get("network", "ReceiveBytesPerSecond", "Algorithm"), Some(4000.0));
        assert_eq!(m.get("network", "TransmitBytesPerSecond", "Algorithm"), Some(2000.0));
        // eth0 goes away; eth1 counts from its last reading.
        write(&["eth1: 778777 0 0 0 0 0 0 0 777777 0 0 0 0 0 0 0"]);
        m.clear();
        s.sample(Duration::from_millis(2500), &mut m).unwrap();
        assert_eq!(m.get("network", "ReceiveBytesPerSecond", "Algorithm"), Some(1000.0));
        assert_eq!(m.get("network", "TransmitBytesPerSecond", "Algorithm"), Some(0.0));
        assert_eq!(s.prev.len(), 1);
    }
}
