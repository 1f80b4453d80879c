//! Step statistics per mode (`docs/report.md`, "Steps"): each rank's and the job's
//! percentiles, the histogram, stragglers, outliers, and the step chart's axis and warm-ups,
//! from the step records [`crate::analysis::collect::Agg`] kept.

use std::collections::BTreeMap;

use crate::analysis::stats::{self, mean, std};
use crate::model::*;

/// One step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRec {
    pub start_us: i64,
    pub dur_us: i64,
    pub step: i64,
}

/// Points per rank in the step series.
pub const STEP_POINTS: usize = 4000;
/// Steps longer than mean + 3σ listed per mode.
pub const MAX_OUTLIERS: usize = 50;
/// A rank is a straggler when its median step is at least this many times the median of
/// the ranks' medians (`docs/report.md`, "Stragglers").
pub const STRAGGLER_RATIO: f64 = 1.2;
/// A step chart's axis fits the bulk: it runs to `BULK_MARGIN` × the p99 step when a step is
/// longer than that, and steps above are marked at its edge (`docs/report.md`, "The step
/// chart"). The same bound as the histogram's overflow bin (`stats::step_histogram`).
pub const BULK_MARGIN: f64 = 1.5;
/// A rank's warm-up: its leading steps each longer than this × its median step…
pub const WARMUP_RATIO: f64 = 1.5;
/// …when they are at most this share of its steps (more is a slow phase, not a warm-up).
pub const WARMUP_MAX_SHARE: f64 = 0.1;

fn step_stats(ms_sorted: &[f64]) -> StepStats {
    StepStats {
        count: ms_sorted.len() as u64,
        p50_ms: stats::quantile_sorted(ms_sorted, 0.5),
        p90_ms: stats::quantile_sorted(ms_sorted, 0.9),
        p99_ms: stats::quantile_sorted(ms_sorted, 0.99),
        max_ms: ms_sorted.last().copied(),
        mean_ms: stats::mean(ms_sorted),
    }
}

/// Per mode: overall and per-rank statistics, the histogram, stragglers, outliers.
pub fn mode_steps(ranks: &BTreeMap<String, Vec<StepRec>>) -> ModeSteps {
    let mut all = Vec::with_capacity(ranks.values().map(Vec::len).sum());
    let mut per_rank = BTreeMap::new();
    let mut outliers = Vec::new();
    for (rank, steps) in ranks {
        let ms: Vec<f64> = steps.iter().map(|s| s.dur_us as f64 / 1000.0).collect();
        all.extend_from_slice(&ms);
        per_rank.insert(rank.clone(), step_stats(&stats::sorted(&ms)));
        for s in outlier_steps(steps).1 {
            outliers.push(Outlier {
                rank: rank.clone(),
                step: s.step,
                start_s: s.start_us as f64 / 1e6,
                ms: s.dur_us as f64 / 1000.0,
            });
        }
    }
    outliers.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    outliers.truncate(MAX_OUTLIERS);
    // Sorted in place: over hundreds of ranks `all` is the size of the step table's
    // durations, and a sorted copy would be a second one, a stable sort's scratch half of one
    // (`docs/report.md`, "Many ranks").
    all.sort_unstable_by(f64::total_cmp);
    let s = step_stats(&all);
    let (edges_ms, counts) = stats::step_histogram(&all, 30);
    let chart = step_chart(ranks, &all, &per_rank);
    ModeSteps {
        count: s.count,
        p50_ms: s.p50_ms,
        p90_ms: s.p90_ms,
        p99_ms: s.p99_ms,
        max_ms: s.max_ms,
        mean_ms: s.mean_ms,
        histogram: Histogram { edges_ms, counts },
        stragglers: stragglers(&per_rank),
        per_rank,
        outliers,
        chart,
    }
}

/// The step chart of a mode: its axis, the steps above it, the ranks' warm-ups.
/// `all`: every step's ms, sorted.
pub fn step_chart(
    ranks: &BTreeMap<String, Vec<StepRec>>,
    all: &[f64],
    per_rank: &BTreeMap<String, StepStats>,
) -> StepChart {
    let (Some(p99), Some(&max)) = (stats::quantile_sorted(all, 0.99), all.last()) else {
        return StepChart::default();
    };
    let bulk = BULK_MARGIN * p99;
    let y_max_ms = if max > bulk && bulk > 0.0 { bulk } else { max * 1.05 };
    let mut above = Vec::new();
    let mut above_count = 0u64;
    let mut warmup = Vec::new();
    for (rank, steps) in ranks {
        for s in steps {
            let ms = s.dur_us as f64 / 1000.0;
            if ms > y_max_ms {
                above_count += 1;
                above.push(Outlier {
                    rank: rank.clone(),
                    step: s.step,
                    start_s: s.start_us as f64 / 1e6,
                    ms,
                });
                if above.len() >= 2 * MAX_OUTLIERS {
                    keep_longest(&mut above);
                }
            }
        }
        let Some(median) = per_rank.get(rank).and_then(|r| r.p50_ms) else { continue };
        let mut by_start: Vec<&StepRec> = steps.iter().collect();
        by_start.sort_by_key(|s| (s.start_us, s.step));
        let most = (by_start.len() as f64 * WARMUP_MAX_SHARE).floor() as usize;
        let n = by_start
            .iter()
            .take(most + 1)
            .take_while(|s| s.dur_us as f64 / 1000.0 > WARMUP_RATIO * median)
            .count();
        // Longer than a tenth of the steps: a slow phase, not a warm-up.
        if n > 0 && n <= most {
            let w = &by_start[..n];
            warmup.push(Warmup {
                rank: rank.clone(),
                steps: n as u64,
                first_step: w[0].step,
                last_step: w[n - 1].step,
                start_s: w[0].start_us as f64 / 1e6,
                end_s: w.iter().map(|s| (s.start_us + s.dur_us) as f64 / 1e6).fold(f64::MIN, f64::max),
                ms: w.iter().map(|s| s.dur_us as f64 / 1000.0).sum(),
                median_ms: median,
            });
        }
    }
    keep_longest(&mut above);
    StepChart { y_min_ms: 0.0, y_max_ms, above, above_count, warmup }
}

/// The `MAX_OUTLIERS` longest steps, longest first.
fn keep_longest(v: &mut Vec<Outlier>) {
    v.sort_by(|a, b| b.ms.total_cmp(&a.ms).then_with(|| a.rank.cmp(&b.rank)).then(a.step.cmp(&b.step)));
    v.truncate(MAX_OUTLIERS);
}

/// Ranks whose median step is ≥ `STRAGGLER_RATIO` × the median of the ranks' medians.
pub fn stragglers(per_rank: &BTreeMap<String, StepStats>) -> Vec<Straggler> {
    let medians: Vec<(&String, f64)> =
        per_rank.iter().filter_map(|(r, s)| s.p50_ms.map(|m| (r, m))).collect();
    if medians.len() < 2 {
        return Vec::new();
    }
    let Some(mid) =
        stats::quantile_sorted(&stats::sorted(&medians.iter().map(|m| m.1).collect::<Vec<_>>()), 0.5)
    else {
        return Vec::new();
    };
    if mid <= 0.0 {
        return Vec::new();
    }
    let mut out: Vec<Straggler> = medians
        .iter()
        .filter(|(_, m)| *m >= STRAGGLER_RATIO * mid)
        .map(|(r, m)| Straggler { rank: (*r).clone(), p50_ms: *m, median_rank_p50_ms: mid, ratio: m / mid })
        .collect();
    out.sort_by(|a, b| b.ratio.total_cmp(&a.ratio));
    out
}

/// A step longer than the mean + this many σ of its rank's steps of its mode is an outlier
/// (SageMaker's StepOutlier default; `rules/step_outlier.rs` judges the outliers).
pub const STDDEV: f64 = 3.0;

/// The steps of one rank and mode longer than mean + 3σ, and that threshold (NaN without
/// steps).
pub fn outlier_steps(steps: &[StepRec]) -> (f64, Vec<StepRec>) {
    let ms: Vec<f64> = steps.iter().map(|s| s.dur_us as f64 / 1000.0).collect();
    let (Some(m), Some(sd)) = (mean(&ms), std(&ms)) else { return (f64::NAN, Vec::new()) };
    let threshold = m + STDDEV * sd;
    (threshold, steps.iter().filter(|s| s.dur_us as f64 / 1000.0 > threshold).copied().collect())
}
