//! The detailed windows' memory events (`docs/report.md`, "Memory over the detailed
//! windows"): torch.profiler's `[memory]` events (with `profile_memory`), which the hook writes
//! as `trainprof:Memory` events with the allocator's totals (docs/formats.md, "Memory
//! events"), kept per node and device while the timelines are read, then cut into windows
//! (runs of consecutive steps) with their peak and a chart of allocated memory.
//!
//! Bounded: at most [`MAX_POINTS`] events a job (32 bytes each) in at most [`MAX_SERIES`]
//! (node, device) series; the rest are counted as left out (`job.capped`, `memory_events`).

use std::collections::HashMap;

use trainprof_output::protocol::timeline::{self, memory_key};

use crate::model::Capped;
use crate::model::memory::MemoryWindow;

/// Memory events kept per job.
pub const MAX_POINTS: usize = 1_000_000;
/// (node, device) series per job.
pub const MAX_SERIES: usize = 4096;
/// Points of a window's chart.
pub const CHART_POINTS: usize = 2000;

#[derive(Debug, Clone, Copy)]
struct Point {
    t_us: i64,
    step: i64,
    allocated: i64,
    reserved: i64,
}

/// What is kept while reading.
#[derive(Debug, Default)]
pub struct Collector {
    /// (node, device type, device id) → its events, in the order read.
    series: Vec<((String, i64, i64), Vec<Point>)>,
    ids: HashMap<(String, i64, i64), usize>,
    points: usize,
    left_out: u64,
}

fn arg_i64(e: &crate::reading::Event<'_>, k: &str) -> Option<i64> {
    let v = e.args.get(k)?;
    v.as_i64().or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
}

/// The device as people write it: `cpu`, `cuda:0`, … (c10's `DeviceType` numbers).
pub fn device_label(device_type: i64, device_id: i64) -> String {
    let kind = match device_type {
        0 => "cpu",
        1 => "cuda",
        12 => "xpu",
        13 => "mps",
        20 => "privateuseone",
        n => return format!("device type {n}:{device_id}"),
    };
    if device_id < 0 { kind.to_owned() } else { format!("{kind}:{device_id}") }
}

impl Collector {
    /// One event of a timeline: kept when it is a memory event with a step.
    pub fn event(&mut self, e: &crate::reading::Event<'_>) {
        if e.phase != timeline::MEMORY_PHASE {
            return;
        }
        let (Some(step), Some(allocated)) = (e.step, arg_i64(e, memory_key::TOTAL_ALLOCATED)) else {
            return;
        };
        if self.points >= MAX_POINTS {
            self.left_out += 1;
            return;
        }
        let device_type = arg_i64(e, memory_key::DEVICE_TYPE).unwrap_or(0);
        let device_id = arg_i64(e, memory_key::DEVICE_ID).unwrap_or(-1);
        let reserved = arg_i64(e, memory_key::TOTAL_RESERVED).unwrap_or(0);
        let key = (e.node.to_owned(), device_type, device_id);
        let i = match self.ids.get(&key) {
            Some(&i) => i,
            None => {
                if self.series.len() >= MAX_SERIES {
                    self.left_out += 1;
                    return;
                }
                self.series.push((key.clone(), Vec::new()));
                self.ids.insert(key, self.series.len() - 1);
                self.series.len() - 1
            }
        };
        self.points += 1;
        self.series[i].1.push(Point { t_us: e.start_us, step, allocated, reserved });
    }

    /// The cap reached, for `job.capped`.
    pub fn capped(&self) -> Vec<Capped> {
        if self.left_out == 0 {
            return Vec::new();
        }
        vec![Capped {
            what: "memory_events".into(),
            node: None,
            limit: MAX_POINTS as u64,
            left_out: self.left_out,
        }]
    }

    /// Every window of every series, by node, device, then first step.
    pub fn finish(self) -> Vec<MemoryWindow> {
        let mut series = self.series;
        series.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::new();
        for ((node, device_type, device_id), mut pts) in series {
            // Files are read in name order; within a rank, time order is the events' order.
            pts.sort_by_key(|p| p.t_us);
            let mut start = 0;
            for i in 1..=pts.len() {
                let cut = i == pts.len()
                    || pts[i].step > pts[i - 1].step.saturating_add(1)
                    || pts[i].step < pts[i - 1].step;
                if cut {
                    out.push(window(&node, device_type, device_id, &pts[start..i]));
                    start = i;
                }
            }
        }
        out
    }
}

fn window(node: &str, device_type: i64, device_id: i64, pts: &[Point]) -> MemoryWindow {
    let s = |p: &Point| p.t_us as f64 / 1e6;
    let mut peak = pts[0];
    let mut peak_reserved = 0;
    for p in pts {
        if p.allocated > peak.allocated {
            peak = *p;
        }
        peak_reserved = peak_reserved.max(p.reserved);
    }
    let per = pts.len().div_ceil(CHART_POINTS);
    let chart = pts
        .chunks(per)
        .map(|c| {
            let best = c.iter().max_by_key(|p| p.allocated).unwrap_or(&c[0]);
            [s(best), best.allocated as f64]
        })
        .collect();
    let (first, last) = (pts[0], pts[pts.len() - 1]);
    MemoryWindow {
        node: node.to_owned(),
        device: device_label(device_type, device_id),
        device_type,
        device_id,
        first_step: first.step,
        last_step: last.step,
        events: pts.len() as u64,
        start_s: s(&first),
        end_s: s(&last),
        peak_allocated_bytes: peak.allocated,
        peak_s: s(&peak),
        peak_step: peak.step,
        peak_reserved_bytes: peak_reserved,
        first_allocated_bytes: first.allocated,
        last_allocated_bytes: last.allocated,
        chart,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn ev(c: &mut Collector, node: &str, t_us: i64, step: i64, dev: (i64, i64), alloc: i64) {
        let mut args = serde_json::Map::new();
        args.insert(memory_key::DEVICE_TYPE.into(), dev.0.into());
        args.insert(memory_key::DEVICE_ID.into(), dev.1.into());
        args.insert(memory_key::TOTAL_ALLOCATED.into(), alloc.into());
        args.insert(memory_key::TOTAL_RESERVED.into(), (alloc * 2).into());
        let e = crate::reading::Event {
            node,
            phase: timeline::MEMORY_PHASE,
            name: timeline::MEMORY_NAME,
            ph: 'X',
            start_us: t_us,
            dur_us: 0,
            step: Some(step),
            args: &args,
        };
        c.event(&e);
    }

    #[test]
    fn windows_per_device_with_their_peak() {
        let mut c = Collector::default();
        let t = 1_800_000_000_000_000;
        // Window 1 (steps 3-4) on the CPU and cuda:0, window 2 (step 9) on the CPU.
        ev(&mut c, "0-a", t, 3, (0, -1), 100);
        ev(&mut c, "0-a", t + 10, 3, (1, 0), 7);
        ev(&mut c, "0-a", t + 20, 4, (0, -1), 900);
        ev(&mut c, "0-a", t + 30, 4, (0, -1), 300);
        ev(&mut c, "0-a", t + 900, 9, (0, -1), 50);
        let w = c.finish();
        let got: Vec<_> = w
            .iter()
            .map(|w| (w.device.as_str(), w.first_step, w.last_step, w.peak_allocated_bytes, w.events))
            .collect();
        assert_eq!(got, [("cpu", 3, 4, 900, 3), ("cpu", 9, 9, 50, 1), ("cuda:0", 3, 3, 7, 1)]);
        assert_eq!(w[0].peak_step, 4);
        assert_eq!(w[0].peak_s, (t + 20) as f64 / 1e6);
        assert_eq!(w[0].peak_reserved_bytes, 1800);
        assert_eq!((w[0].first_allocated_bytes, w[0].last_allocated_bytes), (100, 300));
        assert_eq!(w[0].chart.len(), 3);
    }

    #[test]
    fn the_chart_keeps_the_peak_and_the_events_are_capped() {
        let mut c = Collector::default();
        let t = 1_800_000_000_000_000;
        for i in 0..10_000 {
            ev(&mut c, "0-a", t + i, 1, (0, -1), if i == 7777 { 1 << 30 } else { i });
        }
        let w = c.finish();
        assert_eq!(w[0].chart.len(), CHART_POINTS);
        assert_eq!(w[0].chart.iter().map(|p| p[1]).fold(0.0, f64::max), (1u64 << 30) as f64);
        let mut c = Collector { points: MAX_POINTS, ..Collector::default() };
        ev(&mut c, "0-a", t, 1, (0, -1), 1);
        assert_eq!(c.capped()[0].left_out, 1);
    }

    #[test]
    fn device_labels() {
        assert_eq!(device_label(0, -1), "cpu");
        assert_eq!(device_label(1, 3), "cuda:3");
        assert_eq!(device_label(99, 1), "device type 99:1");
    }
}
