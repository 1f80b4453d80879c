//! Memory snapshots judged (`docs/report.md`, "Memory"): per device, allocated and reserved
//! memory over the allocator's history, rebuilt backwards from the state at the snapshot
//! (the history is a ring: its start is unknown, its end is the snapshot), the peak, the live
//! allocations at the peak grouped by frame, and the leak finding against the rank's steps.

use std::collections::{BTreeMap, HashMap};

use trainprof_output::fs::Dir;

use crate::analysis::incidents::Steps;
use crate::model::memory::*;
use crate::reading::Skipped;
use crate::reading::memory::{self as rm, Action, Device, Snapshot};

/// Rows of a top table.
pub const TOP_ROWS: usize = 15;
/// Points of a chart.
pub const CHART_POINTS: usize = 2000;
/// Step starts looked at for a leak, the last ones of the history.
pub const LEAK_STEPS: usize = 64;
/// A leak is at least this much growth over the steps looked at…
pub const LEAK_MIN_BYTES: i64 = 1 << 20;
/// …with growth at every one of at least this many step starts.
pub const LEAK_MIN_STEPS: usize = 3;

/// The allocated and reserved deltas an entry makes.
fn deltas(e: &rm::Entry) -> (i64, i64) {
    match e.action {
        Action::Alloc => (e.size, 0),
        Action::FreeRequested => (-e.size, 0),
        Action::SegmentAlloc => (0, e.size),
        Action::SegmentFree => (0, -e.size),
        _ => (0, 0),
    }
}

fn rows(
    live: impl Iterator<Item = (i64, Option<u32>)>,
    s: &Snapshot,
    keep: usize,
) -> (Vec<SiteRow>, i64, u64) {
    let mut by: HashMap<Option<u32>, (i64, u64)> = HashMap::new();
    for (size, site) in live {
        let r = by.entry(site).or_default();
        r.0 = r.0.saturating_add(size);
        r.1 += 1;
    }
    let mut v: Vec<(Option<u32>, (i64, u64))> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(b.1.1.cmp(&a.1.1)).then(a.0.cmp(&b.0)));
    let (mut left_b, mut left_n) = (0i64, 0u64);
    let mut out = Vec::new();
    for (i, (site, (bytes, count))) in v.into_iter().enumerate() {
        if i >= keep {
            left_b = left_b.saturating_add(bytes);
            left_n += count;
            continue;
        }
        let (file, line, function) = match site.and_then(|i| s.sites.get(i as usize)) {
            Some(x) => (x.file.clone(), x.line, x.function.clone()),
            None => (
                "(no stack: allocated before the history, or recorded without stacks)".to_owned(),
                0,
                String::new(),
            ),
        };
        out.push(SiteRow { file, line, function, bytes, count });
    }
    (out, left_b, left_n)
}

/// One device of a snapshot, judged; `starts_us` are the rank's step starts `(µs, step)`, sorted.
pub fn device(index: i64, d: &Device, s: &Snapshot, starts_us: &[(i64, i64)]) -> SnapshotDevice {
    let end_alloc: i64 = d.live.iter().map(|l| l.1).sum();
    let n = d.trace.len();
    // Backwards: the values after each entry, and the live set at the history's start.
    let mut after = vec![(0i64, 0i64); n];
    let (mut a, mut r) = (end_alloc, d.reserved);
    let mut live: HashMap<i64, (i64, Option<u32>)> =
        d.live.iter().map(|&(addr, size, site)| (addr, (size, site))).collect();
    for i in (0..n).rev() {
        after[i] = (a, r);
        let e = &d.trace[i];
        let (da, dr) = deltas(e);
        a -= da;
        r -= dr;
        match e.action {
            Action::Alloc => {
                live.remove(&e.addr);
            }
            Action::FreeRequested => {
                live.insert(e.addr, (e.size, None));
            }
            _ => {}
        }
    }
    let (start_a, start_r) = (a.max(0), r.max(0));
    // The peak: the start, or after some entry.
    let mut peak = (start_a, None::<usize>);
    let mut peak_reserved = start_r;
    for (i, &(a, r)) in after.iter().enumerate() {
        if a > peak.0 {
            peak = (a, Some(i));
        }
        peak_reserved = peak_reserved.max(r);
    }
    let reserved_at_peak = peak.1.map_or(start_r, |i| after[i].1);
    // Forwards to the peak: the live set there.
    if let Some(p) = peak.1 {
        for e in &d.trace[..=p] {
            match e.action {
                Action::Alloc => {
                    live.insert(e.addr, (e.size, e.site));
                }
                Action::FreeRequested => {
                    live.remove(&e.addr);
                }
                _ => {}
            }
        }
    }
    let (top, left_b, left_n) = rows(live.values().copied(), s, TOP_ROWS);
    let time = |i: usize| d.trace[i].time_us as f64 / 1e6;
    let chart = chart(d, &after, start_a);
    let (leak_judged, leak) = leak(d, &after, start_a, s, starts_us, peak.0);
    SnapshotDevice {
        device: index,
        entries: n as u64,
        start_s: (n > 0).then(|| time(0)),
        end_s: (n > 0).then(|| time(n - 1)),
        peak_allocated_bytes: peak.0,
        peak_s: peak.1.map(time),
        peak_reserved_bytes: peak_reserved.max(d.reserved),
        fragmentation_bytes: (reserved_at_peak - peak.0).max(0),
        allocated_bytes: end_alloc,
        reserved_bytes: d.reserved,
        segments: d.segments,
        top,
        top_left_out_bytes: left_b,
        top_left_out_count: left_n,
        chart,
        leak,
        leak_judged,
        agent: None,
    }
}

/// Readings further than this from the peak are not compared.
pub const AGENT_NEAR_S: f64 = 5.0;

/// The agent's reading of the trainer's memory on the snapshot's GPU nearest its peak (the
/// host of the snapshot's rank, the GPU of its device index).
fn agent(
    rank: &str,
    d: &SnapshotDevice,
    trainer_gpu_mem: &BTreeMap<(String, u32), Vec<(f64, f64)>>,
) -> Option<AgentGpuMemory> {
    let host = crate::analysis::fleet::rank_host(rank)?;
    let gpu = u32::try_from(d.device).ok()?;
    let series = trainer_gpu_mem.get(&(host.to_owned(), gpu))?;
    let at = d.peak_s.or(d.end_s)?;
    let &(t, bytes) = series.iter().min_by(|a, b| (a.0 - at).abs().total_cmp(&(b.0 - at).abs()))?;
    if (t - at).abs() > AGENT_NEAR_S {
        return None;
    }
    let reserved = d.peak_allocated_bytes.saturating_add(d.fragmentation_bytes);
    let trainer = bytes as i64;
    Some(AgentGpuMemory {
        node: host.to_owned(),
        gpu: trainprof_output::protocol::metric::Name::gpu(gpu).to_string(),
        at_s: t,
        trainer_bytes: trainer,
        reserved_bytes: reserved,
        outside_bytes: trainer.saturating_sub(reserved),
    })
}

/// Allocated memory over time, each point the highest of its span of entries.
fn chart(d: &Device, after: &[(i64, i64)], start: i64) -> Vec<[f64; 2]> {
    let n = after.len();
    if n == 0 {
        return Vec::new();
    }
    let mut out = vec![[d.trace[0].time_us as f64 / 1e6, start as f64]];
    let per = n.div_ceil(CHART_POINTS - 1);
    for chunk in (0..n).collect::<Vec<_>>().chunks(per) {
        let best = chunk.iter().copied().max_by_key(|&i| after[i].0).unwrap_or(chunk[0]);
        out.push([d.trace[best].time_us as f64 / 1e6, after[best].0 as f64]);
    }
    out
}

/// Allocated memory at each step start inside the history: whether there were enough to
/// judge, and a leak when it grows at every one.
fn leak(
    d: &Device,
    after: &[(i64, i64)],
    start: i64,
    s: &Snapshot,
    starts_us: &[(i64, i64)],
    peak: i64,
) -> (bool, Option<Leak>) {
    let (Some(first), Some(last)) = (d.trace.first(), d.trace.last()) else { return (false, None) };
    let (first, last) = (first.time_us, last.time_us);
    let inside: Vec<(i64, i64)> =
        starts_us.iter().copied().filter(|&(t, _)| t >= first && t <= last).collect();
    let inside = &inside[inside.len().saturating_sub(LEAK_STEPS)..];
    if inside.len() < LEAK_MIN_STEPS + 1 {
        return (false, None);
    }
    (true, grown(d, after, start, s, inside, peak))
}

/// The leak over the step starts `inside` (at least [`LEAK_MIN_STEPS`] + 1), if it grew.
fn grown(
    d: &Device,
    after: &[(i64, i64)],
    start: i64,
    s: &Snapshot,
    inside: &[(i64, i64)],
    peak: i64,
) -> Option<Leak> {
    // The value just before each start: after the last entry earlier than it.
    let at = |t: i64| {
        let k = d.trace.partition_point(|e| e.time_us < t);
        if k == 0 { start } else { after[k - 1].0 }
    };
    let steps: Vec<[i64; 2]> = inside.iter().map(|&(t, step)| [step, at(t)]).collect();
    let grows = steps.windows(2).all(|w| w[1][1] > w[0][1]);
    let growth = steps[steps.len() - 1][1] - steps[0][1];
    if !grows || growth < LEAK_MIN_BYTES {
        return None;
    }
    // What grew: allocated after the first start and live at the last.
    let (t0, t1) = (inside[0].0, inside[inside.len() - 1].0);
    let mut live: BTreeMap<i64, (i64, Option<u32>)> = BTreeMap::new();
    for e in d.trace.iter().filter(|e| e.time_us >= t0 && e.time_us < t1) {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, (e.size, e.site));
            }
            Action::FreeRequested => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    let (sites, _, _) = rows(live.values().copied(), s, 5);
    let per_step = growth / (steps.len() as i64 - 1);
    let mib = |b: i64| b as f64 / 1048576.0;
    let sentence = format!(
        "Allocated memory grew at each of {} step starts (steps {}–{}): {:.1} MiB in all, {:.1} MiB a step ({:.1} % of the peak){}.",
        steps.len() - 1,
        steps[0][0],
        steps[steps.len() - 1][0],
        mib(growth),
        mib(per_step),
        100.0 * growth as f64 / peak.max(1) as f64,
        sites
            .first()
            .map(|r| format!("; most of it allocated at {}:{} in {}", r.file, r.line, r.function))
            .unwrap_or_default()
    );
    Some(Leak { steps, growth_bytes: growth, per_step_bytes: per_step, sites, sentence })
}

/// The rank's step starts `(µs, step)`, sorted: `TRAIN`, else `GLOBAL`, else any mode.
fn starts(steps: &Steps, node: &str) -> Vec<(i64, i64)> {
    let recs = ["TRAIN", "GLOBAL"]
        .iter()
        .filter_map(|m| steps.get(*m).and_then(|r| r.get(node)))
        .next()
        .or_else(|| steps.values().find_map(|r| r.get(node)));
    let mut v: Vec<(i64, i64)> =
        recs.map(|r| r.iter().map(|s| (s.start_us, s.step)).collect()).unwrap_or_default();
    v.sort_unstable();
    v
}

/// Every snapshot of the job, read and judged one at a time (a decoded snapshot is dropped
/// before the next is read).
pub fn read(
    dir: &Dir,
    steps: &Steps,
    trainer_gpu_mem: &BTreeMap<(String, u32), Vec<(f64, f64)>>,
    skipped: &mut Skipped,
) -> Memory {
    let mut out = Memory::default();
    for f in rm::files(dir, skipped) {
        let s = match rm::read(dir, &f) {
            Ok(s) => s,
            Err(e) => {
                skipped.push(e.to_string());
                continue;
            }
        };
        let starts = starts(steps, &f.node);
        let devices = s
            .devices
            .iter()
            .map(|(i, d)| {
                let mut dev = device(*i, d, &s, &starts);
                dev.agent = agent(&f.node, &dev, trainer_gpu_mem);
                dev
            })
            .collect();
        out.snapshots.push(MemorySnapshot {
            node: f.node.clone(),
            kind: f.name.kind.as_str().to_owned(),
            first_step: f.name.first_step,
            last_step: f.name.last_step,
            file: f.rel.clone(),
            bytes: f.bytes,
            devices,
        });
    }
    out
}

/// The snapshot devices judged for a leak, and those that grew (the GPUMemoryLeak rule's
/// evidence rows).
pub fn leaks(m: &Memory) -> (u64, Vec<crate::model::evidence::memory_leak::LeakEvidence>) {
    let mut judged = 0u64;
    let mut out = Vec::new();
    for s in &m.snapshots {
        for d in &s.devices {
            judged += u64::from(d.leak_judged);
            let Some(l) = &d.leak else { continue };
            let (Some(first), Some(last)) = (l.steps.first(), l.steps.last()) else { continue };
            out.push(crate::model::evidence::memory_leak::LeakEvidence {
                node: s.node.clone(),
                file: s.file.clone(),
                device: d.device,
                first_step: first[0],
                last_step: last[0],
                growth_bytes: l.growth_bytes,
                per_step_bytes: l.per_step_bytes,
                site: l
                    .sites
                    .first()
                    .map(|r| format!("{}:{} {}", r.file, r.line, r.function))
                    .unwrap_or_default(),
            });
        }
    }
    (judged, out)
}
