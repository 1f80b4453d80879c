//! NVML's sample buffers reduced to one figure per interval (`docs/formats.md`, "GPU").
//!
//! NVML keeps a ring of samples per GPU (utilisation, memory-controller busy) and per
//! process (SM and memory busy), each with a timestamp in µs. Asked with the newest
//! timestamp the previous tick saw, it returns only the newer samples, so a tick of any
//! length reports the whole interval: the mean and the maximum of what happened in it.

/// Mean and maximum of one interval's samples; `count` 0 when there were none.
///
/// `held` and `lost` tell how long the ring holds, so that it is read often enough
/// (`docs/formats.md`, "GPU: cadence"): a read that returned the whole ring (asked from 0, or
/// with a gap after the previous read's newest sample) shows its span.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SampleStats {
    pub count: u32,
    pub mean: f64,
    pub max: f64,
    /// µs from the oldest to the newest sample returned, when they were the ring's whole
    /// content (at least two samples): asked from 0, or samples were lost.
    pub held: Option<u64>,
    /// Samples that fell out of the ring since the previous read (estimated from the gap
    /// between that read's newest sample and this read's oldest, at this read's period).
    pub lost: u64,
    /// The driver's sample period, µs (at least two samples), and the newest sample's
    /// timestamp (0 without samples): where the next sample falls.
    pub period: Option<u64>,
    pub newest: u64,
}

impl SampleStats {
    /// `(timestamp, value)` pairs; only those newer than `since` (and finite) count.
    /// Returns the figures and the newest timestamp seen (`since` when none is newer).
    pub fn of(samples: impl IntoIterator<Item = (u64, f64)>, since: u64) -> (SampleStats, u64) {
        let (mut count, mut sum, mut max, mut newest, mut oldest) =
            (0u32, 0.0, f64::NEG_INFINITY, since, u64::MAX);
        for (ts, value) in samples {
            if ts <= since || !value.is_finite() {
                continue;
            }
            count += 1;
            sum += value;
            max = max.max(value);
            newest = newest.max(ts);
            oldest = oldest.min(ts);
        }
        if count == 0 {
            return (SampleStats::default(), since);
        }
        let (mut held, mut lost, mut sample_period) = (None, 0, None);
        if count >= 2 {
            let period = (newest - oldest) / u64::from(count - 1);
            sample_period = (period > 0).then_some(period);
            // Two periods' gap: at least one sample between the reads is missing.
            let gap = since > 0 && period > 0 && oldest - since >= 2 * period;
            if since == 0 || gap {
                held = Some(newest - oldest);
            }
            if gap {
                // Rounded: the driver's period wobbles a little.
                lost = ((oldest - since) + period / 2) / period - 1;
            }
        }
        (
            SampleStats {
                count,
                mean: sum / f64::from(count),
                max,
                held,
                lost,
                period: sample_period,
                newest,
            },
            newest,
        )
    }
}

/// One process's SM and memory-controller busy over the interval (the mean of its samples).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessBusy {
    pub pid: u32,
    pub sm_percent: f64,
    pub memory_busy_percent: f64,
}

/// One per-process utilisation sample as NVML gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessSample {
    pub pid: u32,
    pub timestamp: u64,
    pub sm_percent: u32,
    pub memory_busy_percent: u32,
}

/// The samples newer than `since`, averaged per pid (sorted by pid), and the newest
/// timestamp seen (`since` when none is newer).
pub fn per_process(samples: &[ProcessSample], since: u64) -> (Vec<ProcessBusy>, u64) {
    let mut newer: Vec<&ProcessSample> = samples.iter().filter(|s| s.timestamp > since).collect();
    newer.sort_unstable_by_key(|s| s.pid);
    let newest = newer.iter().map(|s| s.timestamp).max().unwrap_or(since);
    let mut out: Vec<ProcessBusy> = Vec::new();
    let mut n = 0u32;
    for s in newer {
        match out.last_mut() {
            Some(last) if last.pid == s.pid => {
                last.sm_percent += f64::from(s.sm_percent);
                last.memory_busy_percent += f64::from(s.memory_busy_percent);
                n += 1;
            }
            _ => {
                finish_mean(out.last_mut(), n);
                out.push(ProcessBusy {
                    pid: s.pid,
                    sm_percent: f64::from(s.sm_percent),
                    memory_busy_percent: f64::from(s.memory_busy_percent),
                });
                n = 1;
            }
        }
    }
    finish_mean(out.last_mut(), n);
    (out, newest)
}

fn finish_mean(p: Option<&mut ProcessBusy>, n: u32) {
    if let Some(p) = p.filter(|_| n > 1) {
        p.sm_percent /= f64::from(n);
        p.memory_busy_percent /= f64::from(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_samples_newer_than_the_last_tick_count() {
        let s = [(100, 50.0), (200, 100.0), (300, 80.0), (400, 90.0)];
        let (st, newest) = SampleStats::of(s, 100);
        assert_eq!(
            st,
            SampleStats {
                count: 3,
                mean: 90.0,
                max: 100.0,
                held: None,
                lost: 0,
                period: st.period,
                newest: st.newest
            }
        );
        assert_eq!(newest, 400);
        let (st, newest) = SampleStats::of(s, 400);
        assert_eq!((st.count, newest), (0, 400));
        let (st, _) = SampleStats::of([(500, f64::NAN), (600, 7.0)], 0);
        assert_eq!(
            st,
            SampleStats {
                count: 1,
                mean: 7.0,
                max: 7.0,
                held: None,
                lost: 0,
                period: None,
                newest: st.newest
            }
        );
    }

    #[test]
    fn a_read_of_the_whole_ring_or_after_a_gap_shows_its_span() {
        let ring = [(1_000, 1.0), (1_200, 2.0), (1_400, 3.0), (1_600, 4.0)];
        // From 0: the whole ring, 600 µs.
        let (st, _) = SampleStats::of(ring, 0);
        assert_eq!((st.held, st.lost), (Some(600), 0));
        // Right after the previous read's newest: nothing lost, the span unknown.
        let (st, _) = SampleStats::of(ring, 800);
        assert_eq!((st.count, st.held, st.lost), (4, None, 0));
        // Two samples (at 600 and 800) fell out between the reads.
        let (st, _) = SampleStats::of(ring, 400);
        assert_eq!((st.held, st.lost), (Some(600), 2));
        // One sample cannot tell a period.
        let (st, _) = SampleStats::of([(5_000, 1.0)], 400);
        assert_eq!((st.held, st.lost), (None, 0));
    }

    #[test]
    fn process_samples_are_averaged_per_pid() {
        let p = |pid, timestamp, sm, mem| ProcessSample {
            pid,
            timestamp,
            sm_percent: sm,
            memory_busy_percent: mem,
        };
        let samples = [p(7, 10, 99, 99), p(9, 20, 10, 2), p(7, 30, 60, 20), p(7, 40, 80, 40), p(9, 15, 0, 0)];
        let (busy, newest) = per_process(&samples, 10);
        assert_eq!(newest, 40);
        assert_eq!(
            busy,
            [
                ProcessBusy { pid: 7, sm_percent: 70.0, memory_busy_percent: 30.0 },
                ProcessBusy { pid: 9, sm_percent: 5.0, memory_busy_percent: 1.0 },
            ]
        );
        assert_eq!(per_process(&samples, 40), (vec![], 40));
    }
}
