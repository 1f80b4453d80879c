//! Many ranks and many nodes (`docs/report.md`, "Many ranks"): a robust straggler score per
//! rank, what each straggler's node showed while it ran (throttle reasons, Xid, pressure,
//! PCIe) named as likely causes, and the page's series aggregated so that they do not grow
//! with the number of ranks or nodes.
//!
//! The score: each rank's median step time `m_r`; the median of those `M` and their median
//! absolute deviation `MAD = median |m_r − M|`; the rank's score is the modified z-score
//! `(m_r − M) / (1.4826 · MAD)` (Iglewicz and Hoaglin; 1.4826 · MAD estimates σ for normal
//! data, and one slow rank moves neither `M` nor `MAD`). A rank is a straggler when its
//! score is at least [`MAD_Z`] and its median at least [`MIN_SLOWDOWN`] × `M`. Beside it, as
//! NVIDIA's resiliency extension (`nvidia-resiliency-ext`, straggler detection) reports them,
//! a relative score (the fastest rank's median ÷ this rank's: 1 is the fastest, lower is
//! slower) and an individual score (the rank's best tenth of the job ÷ its whole median: 1 is
//! steady, lower is a rank slower than it once was).

use std::collections::BTreeMap;

use trainprof_output::protocol::metric::dimension::THROTTLE_FLAGS;
use trainprof_output::protocol::metric::name::{PRESSURE_CPU, PRESSURE_IO, PRESSURE_MEMORY};

use crate::analysis::stats;
use crate::analysis::steps::StepRec;
use crate::model::StepSeries;
use crate::model::fleet::*;
use crate::reading::Tick;

/// Modified z-score from which a rank is a straggler (Iglewicz and Hoaglin's 3.5).
pub const MAD_Z: f64 = 3.5;
/// …when its median step is also at least this many times the median rank's.
pub const MIN_SLOWDOWN: f64 = 1.05;
/// MAD → σ for normal data.
pub const MAD_SIGMA: f64 = 1.4826;
/// The MAD used is at least this share of the median (all ranks equal: no division by 0).
pub const MIN_MAD_SHARE: f64 = 0.001;
/// Ranks drawn one line each on the step chart; with more, the chart draws the
/// distribution across ranks ([`BAND_POINTS`] buckets: p10, p50, p90, max) and the
/// [`SLOWEST_DRAWN`] slowest ranks.
pub const MAX_RANK_SERIES: usize = 16;
pub const SLOWEST_DRAWN: usize = 8;
pub const BAND_POINTS: usize = 1000;
/// Nodes drawn on the page with their system charts; with more, the first [`FIRST_NODES`]
/// and the nodes of stragglers and of node signals (throttling, Xid), at most this many.
pub const MAX_NODE_SERIES: usize = 16;
pub const FIRST_NODES: usize = 8;
/// A node signal is a likely cause when it is on in at least this share of the node's ticks
/// and at least this share more than on the median node.
pub const CAUSE_SHARE: f64 = 0.05;
/// Pressure (some stalled, %) that counts as a tick under pressure.
pub const PRESSURE_PCT: f64 = 10.0;
/// A node's PCIe throughput below this share of the median node's is a likely cause.
pub const PCIE_LOW_SHARE: f64 = 0.5;
/// Scores listed in `--json` (the highest first).
pub const MAX_SCORES: usize = 4096;

const THERMAL: u64 = 0x20 | 0x40;
const POWER: u64 = 0x4 | 0x80;
const HW_SLOWDOWN: u64 = 0x8;

/// What one node's system rows showed over the job: counters only (`docs/report.md`,
/// "Memory": a few dozen bytes a node).
#[derive(Debug, Clone, Default)]
pub struct NodeSignals {
    pub ticks: u64,
    /// Ticks with a throttle reason on any GPU, and the first and last such tick: thermal,
    /// power, hardware slowdown.
    pub throttle: [Signal; 3],
    /// Ticks with CPU, memory, I/O pressure (some stalled) ≥ [`PRESSURE_PCT`].
    pub pressure: [Signal; 3],
    pub pressure_sum: [f64; 3],
    pub pressure_n: [u64; 3],
    /// Largest `XidEvents` count of any GPU, and when it first grew.
    pub xid: Signal,
    pub xid_max: f64,
    pub pcie_sum: f64,
    pub pcie_n: u64,
}

/// How many ticks a signal was on, first and last.
#[derive(Debug, Clone, Copy, Default)]
pub struct Signal {
    pub ticks: u64,
    pub from_s: Option<f64>,
    pub to_s: Option<f64>,
}

impl Signal {
    fn on(&mut self, t: f64) {
        self.ticks += 1;
        self.from_s = Some(self.from_s.map_or(t, |f| f.min(t)));
        self.to_s = Some(self.to_s.map_or(t, |f| f.max(t)));
    }
}

impl NodeSignals {
    pub fn tick(&mut self, t: &Tick) {
        self.ticks += 1;
        for (i, bits) in [THERMAL, POWER, HW_SLOWDOWN].into_iter().enumerate() {
            if t.gpu_throttle & bits != 0 {
                self.throttle[i].on(t.t_s);
            }
        }
        for (i, p) in t.pressure.iter().enumerate() {
            if let Some(p) = p {
                self.pressure_sum[i] += p;
                self.pressure_n[i] += 1;
                if *p >= PRESSURE_PCT {
                    self.pressure[i].on(t.t_s);
                }
            }
        }
        if let Some(x) = t.gpu_xid
            && x > 0.0
        {
            if x > self.xid_max {
                self.xid_max = x;
            }
            self.xid.on(t.t_s);
        }
        if let Some(p) = t.gpu_pcie {
            self.pcie_sum += p;
            self.pcie_n += 1;
        }
    }

    fn share(&self, s: &Signal) -> f64 {
        if self.ticks == 0 { 0.0 } else { s.ticks as f64 / self.ticks as f64 }
    }

    fn pcie_mean(&self) -> Option<f64> {
        (self.pcie_n > 0).then(|| self.pcie_sum / self.pcie_n as f64)
    }

    /// Whether a throttle reason or an Xid showed on this node.
    fn notable(&self) -> bool {
        self.throttle.iter().any(|s| s.ticks > 0) || self.xid.ticks > 0
    }
}

/// The throttle reasons' names as the rows spell them, by the kinds above.
fn throttle_rows(bits: u64) -> String {
    THROTTLE_FLAGS.iter().filter(|f| f.0 & bits != 0).map(|f| f.1).collect::<Vec<_>>().join(", ")
}

/// The median and MAD of `values`, and each value's modified z-score.
pub fn robust_scores(values: &[f64]) -> (f64, f64, Vec<f64>) {
    let sorted = stats::sorted(values);
    let Some(mid) = stats::quantile_sorted(&sorted, 0.5) else { return (0.0, 0.0, Vec::new()) };
    let dev = stats::sorted(&values.iter().map(|v| (v - mid).abs()).collect::<Vec<_>>());
    let mad = stats::quantile_sorted(&dev, 0.5).unwrap_or(0.0);
    let scale = MAD_SIGMA * mad.max(MIN_MAD_SHARE * mid.abs()).max(f64::MIN_POSITIVE);
    (mid, mad, values.iter().map(|v| (v - mid) / scale).collect())
}

/// The host of a rank named `<rank>-<host>`.
pub fn rank_host(rank: &str) -> Option<&str> {
    let (n, host) = rank.split_once('-')?;
    (n.parse::<u64>().is_ok() && !host.is_empty()).then_some(host)
}

/// The mode scored: `TRAIN`, else the one with the most steps.
pub fn scored_mode(steps: &BTreeMap<String, BTreeMap<String, Vec<StepRec>>>) -> Option<&String> {
    steps
        .keys()
        .find(|m| m.as_str() == "TRAIN")
        .or_else(|| steps.iter().max_by_key(|(_, r)| r.values().map(Vec::len).sum::<usize>()).map(|(m, _)| m))
}

/// The fleet view of a job: `None` with fewer than two ranks of the scored mode.
pub fn fleet(
    steps: &BTreeMap<String, BTreeMap<String, Vec<StepRec>>>,
    signals: &BTreeMap<String, NodeSignals>,
) -> Option<Fleet> {
    let mode = scored_mode(steps)?;
    let ranks = &steps[mode];
    let mut med = Vec::new();
    for (rank, s) in ranks {
        let ms: Vec<f64> = s.iter().map(|s| s.dur_us as f64 / 1000.0).collect();
        if let Some(m) = stats::quantile_sorted(&stats::sorted(&ms), 0.5) {
            med.push((rank, m, individual(s, m)));
        }
    }
    if med.len() < 2 {
        return None;
    }
    let (mid, mad, z) = robust_scores(&med.iter().map(|m| m.1).collect::<Vec<_>>());
    let fastest = med.iter().map(|m| m.1).fold(f64::INFINITY, f64::min);
    let mut scores: Vec<RankScore> = med
        .iter()
        .zip(&z)
        .map(|((rank, m, ind), z)| RankScore {
            rank: (*rank).clone(),
            node: rank_host(rank).filter(|h| signals.contains_key(*h)).map(str::to_owned),
            p50_ms: *m,
            score: *z,
            relative: if *m > 0.0 { fastest / m } else { 1.0 },
            individual: *ind,
            straggler: mid > 0.0 && *z >= MAD_Z && *m >= MIN_SLOWDOWN * mid,
        })
        .collect();
    scores.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.rank.cmp(&b.rank)));
    let stragglers: Vec<FleetStraggler> = scores
        .iter()
        .filter(|s| s.straggler)
        .map(|s| {
            let steps = &ranks[&s.rank];
            let from_s = steps.iter().map(|x| x.start_us).min().unwrap_or(0) as f64 / 1e6;
            let to_s = steps.iter().map(|x| x.start_us + x.dur_us).max().unwrap_or(0) as f64 / 1e6;
            let causes = s.node.as_ref().map(|n| causes(n, signals, from_s, to_s)).unwrap_or_default();
            FleetStraggler {
                rank: s.rank.clone(),
                node: s.node.clone(),
                p50_ms: s.p50_ms,
                score: s.score,
                slowdown: if mid > 0.0 { s.p50_ms / mid } else { 1.0 },
                from_s,
                to_s,
                causes,
            }
        })
        .collect();
    scores.truncate(MAX_SCORES);
    Some(Fleet {
        mode: mode.clone(),
        ranks: med.len() as u64,
        nodes: signals.len() as u64,
        median_ms: mid,
        mad_ms: mad,
        z_threshold: MAD_Z,
        min_slowdown: MIN_SLOWDOWN,
        scores,
        stragglers,
        late_rank: None,
        page: PageChoice::default(),
    })
}

/// The collectives' late rank set beside the scores (`docs/report.md`, "Many ranks"): its
/// score, whether it is a straggler, and its node's likely causes over its steps.
pub fn set_late_rank(
    f: &mut Fleet,
    late: &crate::model::collectives::LateRank,
    steps: &BTreeMap<String, BTreeMap<String, Vec<StepRec>>>,
    signals: &BTreeMap<String, NodeSignals>,
) {
    let node = rank_host(&late.rank).filter(|h| signals.contains_key(*h)).map(str::to_owned);
    let scored = f.scores.iter().find(|s| s.rank == late.rank);
    let span = steps.get(&f.mode).and_then(|r| r.get(&late.rank)).filter(|s| !s.is_empty()).map(|s| {
        let from = s.iter().map(|x| x.start_us).min().unwrap_or(0) as f64 / 1e6;
        let to = s.iter().map(|x| x.start_us + x.dur_us).max().unwrap_or(0) as f64 / 1e6;
        (from, to)
    });
    let causes =
        node.as_ref().zip(span).map(|(n, (from, to))| causes(n, signals, from, to)).unwrap_or_default();
    let straggler = scored.is_some_and(|s| s.straggler);
    let by_steps = match scored {
        Some(s) if s.straggler => format!("It is a straggler by its steps too (score {:.1}).", s.score),
        Some(s) => format!(
            "By its steps it is no straggler (score {:.1}): it is slow before the collectives and the others \
             absorb its delay in their wait.",
            s.score
        ),
        None => "Its steps are not among the scores.".to_owned(),
    };
    f.late_rank = Some(FleetLateRank {
        rank: late.rank.clone(),
        node,
        last_share: late.last_share,
        others_waited_ms: late.others_waited_ms,
        score: scored.map(|s| s.score),
        straggler,
        causes,
        summary: format!(
            "{} arrives last at collectives: at {:.0} % of its {} matched ones, the other ranks waiting {:.1} ms for \
             it in all. {by_steps}",
            late.rank,
            late.last_share * 100.0,
            late.matched,
            late.others_waited_ms
        ),
    });
}

/// The rank's best tenth of its steps (in time order): that tenth's median ÷ `median`.
fn individual(steps: &[StepRec], median: f64) -> Option<f64> {
    if steps.len() < 10 || median <= 0.0 {
        return None;
    }
    let mut v: Vec<&StepRec> = steps.iter().collect();
    v.sort_by_key(|s| s.start_us);
    let n = v.len() / 10;
    let best = v
        .chunks(n)
        .filter(|c| c.len() == n)
        .filter_map(|c| {
            let ms: Vec<f64> = c.iter().map(|s| s.dur_us as f64 / 1000.0).collect();
            stats::quantile_sorted(&stats::sorted(&ms), 0.5)
        })
        .fold(f64::INFINITY, f64::min);
    best.is_finite().then(|| best / median)
}

/// The median of `v` (0 when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    stats::quantile_sorted(&v, 0.5).unwrap_or(0.0)
}

/// Whether `[a, b]` overlaps `[from, to]`.
fn overlaps(s: &Signal, from: f64, to: f64) -> bool {
    matches!((s.from_s, s.to_s), (Some(a), Some(b)) if a <= to && b >= from)
}

/// The likely causes on `node` of a straggler that ran from `from` to `to`.
pub fn causes(node: &str, signals: &BTreeMap<String, NodeSignals>, from: f64, to: f64) -> Vec<Cause> {
    let Some(n) = signals.get(node) else { return Vec::new() };
    let mut out = Vec::new();
    let kinds = [
        (CauseKind::ThermalThrottling, "thermal throttling", THERMAL),
        (CauseKind::PowerThrottling, "power throttling", POWER),
        (CauseKind::HwSlowdown, "hardware slowdown", HW_SLOWDOWN),
    ];
    for (i, (key, words, bits)) in kinds.into_iter().enumerate() {
        let s = &n.throttle[i];
        let share = n.share(s);
        let fleet = median(signals.values().map(|o| o.share(&o.throttle[i])).collect());
        if share >= CAUSE_SHARE && share >= fleet + CAUSE_SHARE && overlaps(s, from, to) {
            out.push(Cause {
                cause: key,
                node_value: share,
                fleet_value: fleet,
                from_s: s.from_s,
                to_s: s.to_s,
                evidence: format!(
                    "{words} on {node}: accelerator ThrottleReasonsMask with {} in {:.0} % of its ticks \
                     ({} of {}), against {:.0} % on the median node",
                    throttle_rows(bits),
                    100.0 * share,
                    s.ticks,
                    n.ticks,
                    100.0 * fleet
                ),
            });
        }
    }
    if n.xid.ticks > 0 && overlaps(&n.xid, from, to) {
        let fleet = median(signals.values().map(|o| o.xid_max).collect());
        if n.xid_max > fleet {
            out.push(Cause {
                cause: CauseKind::Xid,
                node_value: n.xid_max,
                fleet_value: fleet,
                from_s: n.xid.from_s,
                to_s: n.xid.to_s,
                evidence: format!(
                    "Xid errors on {node}: accelerator XidEvents reached {} (the median node: {})",
                    n.xid_max, fleet
                ),
            });
        }
    }
    for (i, (key, what)) in [
        (CauseKind::CpuPressure, PRESSURE_CPU),
        (CauseKind::MemoryPressure, PRESSURE_MEMORY),
        (CauseKind::IoPressure, PRESSURE_IO),
    ]
    .into_iter()
    .enumerate()
    {
        let s = &n.pressure[i];
        let share = n.share(s);
        let fleet = median(signals.values().map(|o| o.share(&o.pressure[i])).collect());
        if share >= CAUSE_SHARE && share >= fleet + CAUSE_SHARE && overlaps(s, from, to) {
            let mean = n.pressure_sum[i] / n.pressure_n[i].max(1) as f64;
            out.push(Cause {
                cause: key,
                node_value: share,
                fleet_value: fleet,
                from_s: s.from_s,
                to_s: s.to_s,
                evidence: format!(
                    "{what} pressure on {node}: pressure {what} SomeStalledPercent ≥ {PRESSURE_PCT} in \
                     {:.0} % of its ticks (mean {mean:.1} %), against {:.0} % on the median node",
                    100.0 * share,
                    100.0 * fleet
                ),
            });
        }
    }
    if let Some(p) = n.pcie_mean() {
        let fleet = median(signals.values().filter_map(NodeSignals::pcie_mean).collect());
        if fleet > 0.0 && p < PCIE_LOW_SHARE * fleet {
            out.push(Cause {
                cause: CauseKind::LowPcie,
                node_value: p / fleet,
                fleet_value: 1.0,
                from_s: None,
                to_s: None,
                evidence: format!(
                    "low PCIe throughput on {node}: accelerator PcieTx/RxBytesPerSecond mean {:.0} MB/s, \
                     {:.0} % of the median node's {:.0} MB/s",
                    p / 1e6,
                    100.0 * p / fleet,
                    fleet / 1e6
                ),
            });
        }
    }
    out.sort_by(|a, b| b.node_value.total_cmp(&a.node_value));
    out
}

/// The step chart's series of one mode: every rank's own (decimated to `points`) when there
/// are at most [`MAX_RANK_SERIES`] ranks; else the distribution across ranks (`p10`, `p50`,
/// `p90`, `max` of the ranks' bucket means, [`BAND_POINTS`] buckets of the job) and the
/// `slowest` ranks' own. Memory: [`BAND_POINTS`] floats per rank, whatever the job's length.
pub fn step_series(
    ranks: &BTreeMap<String, Vec<StepRec>>,
    slowest: &[String],
    points: usize,
) -> BTreeMap<String, StepSeries> {
    let own = |steps: &[StepRec]| {
        let mut v: Vec<&StepRec> = steps.iter().collect();
        v.sort_by_key(|s| s.start_us);
        let t: Vec<f64> = v.iter().map(|s| s.start_us as f64 / 1e6).collect();
        let ms: Vec<f64> = v.iter().map(|s| s.dur_us as f64 / 1000.0).collect();
        let (t_s, ms) = stats::minmax_decimate(&t, &ms, points);
        StepSeries { t_s, ms }
    };
    let mut out = BTreeMap::new();
    if ranks.len() <= MAX_RANK_SERIES {
        for (rank, steps) in ranks {
            out.insert(rank.clone(), own(steps));
        }
        return out;
    }
    let first = ranks.values().flatten().map(|s| s.start_us).min();
    let last = ranks.values().flatten().map(|s| s.start_us).max();
    let (Some(first), Some(last)) = (first, last) else { return out };
    let width = ((last - first) as f64 / BAND_POINTS as f64).max(1.0);
    let bucket = |t: i64| (((t - first) as f64 / width) as usize).min(BAND_POINTS - 1);
    // Per bucket: each rank's mean step (f32), and the largest step of any rank.
    let mut means: Vec<Vec<f32>> = vec![Vec::new(); BAND_POINTS];
    let mut max = vec![f64::NAN; BAND_POINTS];
    let mut sum = vec![0f64; BAND_POINTS];
    let mut cnt = vec![0u32; BAND_POINTS];
    for steps in ranks.values() {
        sum.iter_mut().for_each(|x| *x = 0.0);
        cnt.iter_mut().for_each(|x| *x = 0);
        for s in steps {
            let b = bucket(s.start_us);
            let ms = s.dur_us as f64 / 1000.0;
            sum[b] += ms;
            cnt[b] += 1;
            if max[b].is_nan() || ms > max[b] {
                max[b] = ms;
            }
        }
        for b in 0..BAND_POINTS {
            if cnt[b] > 0 {
                means[b].push((sum[b] / f64::from(cnt[b])) as f32);
            }
        }
    }
    let n = ranks.len();
    let mut bands: [StepSeries; 4] = Default::default();
    for (b, m) in means.iter_mut().enumerate() {
        if m.is_empty() {
            continue;
        }
        m.sort_by(f32::total_cmp);
        let v: Vec<f64> = m.iter().map(|&x| f64::from(x)).collect();
        let t = (first as f64 + (b as f64 + 0.5) * width) / 1e6;
        for (i, q) in [0.1, 0.5, 0.9].into_iter().enumerate() {
            bands[i].t_s.push(t);
            bands[i].ms.push(stats::quantile_sorted(&v, q).unwrap_or(f64::NAN));
        }
        bands[3].t_s.push(t);
        bands[3].ms.push(max[b]);
    }
    for (i, q) in ["p10", "p50", "p90", "max"].into_iter().enumerate() {
        out.insert(format!("{q} of {n} ranks"), std::mem::take(&mut bands[i]));
    }
    for rank in slowest.iter().take(SLOWEST_DRAWN) {
        if let Some(steps) = ranks.get(rank) {
            out.insert(format!("{rank} (slow)"), own(steps));
        }
    }
    out
}

/// The nodes whose system charts the page draws (of `nodes`, sorted): all of them up to
/// [`MAX_NODE_SERIES`]; with more, the first [`FIRST_NODES`], then the stragglers' nodes,
/// then the nodes with throttling or Xid, up to [`MAX_NODE_SERIES`]. The series of the
/// others are never built.
pub fn nodes_to_draw<'a>(
    nodes: impl Iterator<Item = &'a String>,
    fleet: Option<&Fleet>,
    signals: &BTreeMap<String, NodeSignals>,
) -> Vec<String> {
    let all: Vec<&String> = nodes.collect();
    if all.len() <= MAX_NODE_SERIES {
        return all.into_iter().cloned().collect();
    }
    let mut keep: Vec<String> = all.iter().take(FIRST_NODES).map(|n| (*n).clone()).collect();
    let wanted = fleet
        .into_iter()
        .flat_map(|f| f.stragglers.iter().filter_map(|s| s.node.clone()))
        .chain(signals.iter().filter(|(_, s)| s.notable()).map(|(n, _)| n.clone()));
    for n in wanted {
        if keep.len() >= MAX_NODE_SERIES {
            break;
        }
        if all.contains(&&n) && !keep.contains(&n) {
            keep.push(n);
        }
    }
    keep.sort();
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_slow_rank_moves_neither_median_nor_mad() {
        let mut v: Vec<f64> = (0..64).map(|i| 100.0 + f64::from(i % 4)).collect();
        v.push(115.0);
        let (mid, mad, z) = robust_scores(&v);
        assert!((100.0..=103.0).contains(&mid));
        assert!((0.5..=2.0).contains(&mad), "{mad}");
        // The slow rank scores far above 3.5; the others below it.
        assert!(z[64] > 5.0, "{}", z[64]);
        assert!(z[..64].iter().all(|z| z.abs() < MAD_Z));
    }

    #[test]
    fn the_score_is_the_modified_z_score() {
        let (mid, mad, z) = robust_scores(&[10.0, 11.0, 12.0, 13.0, 20.0]);
        assert_eq!(mid, 12.0);
        // |x − 12|: 2, 1, 0, 1, 8 → MAD 1.
        assert_eq!(mad, 1.0);
        assert!((z[4] - 8.0 / 1.4826).abs() < 1e-12);
        assert!((z[0] + 2.0 / 1.4826).abs() < 1e-12);
    }

    #[test]
    fn equal_ranks_score_zero_and_a_tiny_difference_is_no_straggler() {
        let (_, mad, z) = robust_scores(&[50.0; 8]);
        assert_eq!(mad, 0.0);
        assert!(z.iter().all(|z| *z == 0.0));
        // MAD 0: the scale is 0.1 % of the median; 1 % slower scores high but is under
        // MIN_SLOWDOWN, so `fleet` would not name it.
        let mut v = vec![50.0; 8];
        v[3] = 50.5;
        let (_, _, z) = robust_scores(&v);
        assert!(z[3] > MAD_Z && 50.5 < MIN_SLOWDOWN * 50.0);
    }

    fn steps(ms: f64, n: i64) -> Vec<StepRec> {
        (0..n).map(|i| StepRec { start_us: i * 200_000, dur_us: (ms * 1000.0) as i64, step: i }).collect()
    }

    #[test]
    fn a_straggler_on_a_hot_node_is_named_with_thermal_throttling() {
        let mut ranks = BTreeMap::new();
        for r in 0..16 {
            let host = format!("algo-{}", r / 8 + 1);
            ranks.insert(
                format!("{r}-{host}"),
                steps(if r == 13 { 115.0 } else { 100.0 + f64::from(r % 3) }, 100),
            );
        }
        let mut all = BTreeMap::new();
        all.insert("TRAIN".to_owned(), ranks);
        let mut signals = BTreeMap::new();
        for node in ["algo-1", "algo-2"] {
            let mut s = NodeSignals::default();
            for k in 0..200 {
                let mut t = Tick { t_s: f64::from(k) * 0.1, ..Tick::default() };
                if node == "algo-2" && k >= 20 {
                    t.gpu_throttle = 0x60;
                }
                s.tick(&t);
            }
            signals.insert(node.to_owned(), s);
        }
        let f = fleet(&all, &signals).unwrap();
        assert_eq!(f.ranks, 16);
        assert_eq!(f.stragglers.len(), 1, "{:?}", f.scores);
        let s = &f.stragglers[0];
        assert_eq!((s.rank.as_str(), s.node.as_deref()), ("13-algo-2", Some("algo-2")));
        assert_eq!(s.causes.len(), 1);
        assert_eq!(s.causes[0].cause, CauseKind::ThermalThrottling);
        assert!((s.causes[0].node_value - 0.9).abs() < 1e-9);
        assert!(s.causes[0].evidence.contains("ThrottleSwThermal, ThrottleHwThermal"));
        assert_eq!(f.scores[0].rank, "13-algo-2");
        assert!(f.scores[0].relative < 0.9);
    }

    #[test]
    fn many_ranks_are_drawn_as_their_distribution_and_the_slowest() {
        let mut ranks = BTreeMap::new();
        for r in 0..40 {
            ranks.insert(format!("{r}-a"), steps(100.0 + f64::from(r), 5000));
        }
        let s = step_series(&ranks, &["39-a".to_owned()], 4000);
        let names: Vec<&str> = s.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["39-a (slow)", "max of 40 ranks", "p10 of 40 ranks", "p50 of 40 ranks", "p90 of 40 ranks"]
        );
        let p50 = &s["p50 of 40 ranks"];
        assert!(p50.t_s.len() <= BAND_POINTS);
        assert!(p50.ms.iter().all(|&m| (119.0..=120.0).contains(&m)), "{:?}", &p50.ms[..3]);
        assert!(s["max of 40 ranks"].ms.iter().all(|&m| m == 139.0));
        // Few ranks: each its own line.
        ranks.retain(|r, _| r.len() == 3 && r.starts_with('1'));
        assert_eq!(step_series(&ranks, &[], 4000).len(), ranks.len());
    }

    #[test]
    fn rank_hosts() {
        assert_eq!(rank_host("13-algo-2"), Some("algo-2"));
        assert_eq!(rank_host("algo-2"), None);
        assert_eq!(rank_host("x-"), None);
    }
}
