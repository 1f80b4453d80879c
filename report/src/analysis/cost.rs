//! What profiling cost (docs/report.md, "What profiling cost"): the agent's CPU per node from
//! its cost records (`reading/agent_cost.rs`), each rank's hook from its cost record
//! (`reading/hook_cost.rs`), each rank's windows from the model, and the
//! steps those windows cost, counted as `trainprof compare` leaves them out (docs/report.md,
//! "Which steps are compared"): a step that overlaps a window, and the step right after it.

use std::collections::BTreeMap;

use trainprof_output::protocol::agent_cost::AgentCost;
use trainprof_output::protocol::hook_cost::HookCost;

use crate::analysis::collectives::node_of;
use crate::model::cost::{
    AgentNodeCost, HookPart, HookRankCost, PartShare, ProfilingCost, RankWindows, WindowCost, WindowSpan,
};
use crate::model::evidence::{self, profiling_cost};
use crate::model::{Evidence, Finding, ReportModel};

/// The finding's bound: the agent's CPU over its node's steps' time plus the hook's time over
/// the rank's median step, percent.
pub const THRESHOLD_PERCENT: f64 = 1.0;
/// Parts listed per node.
pub const LARGEST_PARTS: usize = 5;

/// Each rank's steps (every mode pooled) as (start µs, duration µs).
pub type RankSteps = BTreeMap<String, Vec<(i64, i64)>>;

/// The section's model, and the finding when any agent or hook wrote a record.
pub fn build(
    records: &BTreeMap<String, AgentCost>,
    hooks: &BTreeMap<String, HookCost>,
    m: &ReportModel,
    steps: &RankSteps,
) -> (ProfilingCost, Option<Finding>) {
    let mut ranks = rank_windows(m, steps, hooks);
    let mut per_node: BTreeMap<&str, u64> = BTreeMap::new();
    let mut all_ranks: Vec<&String> = steps.keys().chain(m.job.ranks.iter()).collect();
    all_ranks.sort();
    all_ranks.dedup();
    for r in all_ranks {
        *per_node.entry(node_of(r)).or_default() += 1;
    }
    let nodes: Vec<AgentNodeCost> = records
        .values()
        .map(|c| {
            let n = per_node.get(c.node.as_str()).copied().unwrap_or(0);
            let cpu = c.cpu_s;
            AgentNodeCost {
                node: c.node.clone(),
                wall_s: c.wall_s,
                cpu_s: cpu,
                core_percent: c.core_percent(),
                ranks: n,
                steps_percent: (n > 0 && c.wall_s > 0.0).then(|| cpu / (c.wall_s * n as f64) * 100.0),
                peak_rss_bytes: c.peak_rss_bytes,
                ticks: c.ticks,
                interval_ms: c.interval_ms,
                largest_parts: c
                    .parts
                    .iter()
                    .take(LARGEST_PARTS)
                    .map(|p| PartShare {
                        part: p.part.clone(),
                        seconds: p.seconds,
                        percent: if cpu > 0.0 { p.seconds / cpu * 100.0 } else { 0.0 },
                        calls: p.calls,
                    })
                    .collect(),
            }
        })
        .collect();
    // Each rank's total: its node's agent share plus its hook's share.
    let mut judged = Vec::new();
    for r in &mut ranks {
        let agent = nodes.iter().find(|n| n.node == node_of(&r.rank)).and_then(|n| n.steps_percent);
        let hook = r.hook.as_ref().and_then(|h| h.step_percent);
        r.total_percent = match (agent, hook) {
            (None, None) => None,
            (a, h) => Some(a.unwrap_or(0.0) + h.unwrap_or(0.0)),
        };
        if r.total_percent.is_some() {
            judged.push(profiling_cost::Rank {
                rank: r.rank.clone(),
                agent_percent: agent,
                hook_percent: hook,
                total_percent: r.total_percent,
            });
        }
    }
    let hook_recorded = !hooks.is_empty();
    let finding = (!nodes.is_empty() || hook_recorded).then(|| finding(&nodes, judged));
    let cost = ProfilingCost {
        recorded: !nodes.is_empty(),
        hook_recorded,
        threshold_percent: THRESHOLD_PERCENT,
        nodes,
        ranks,
    };
    (cost, finding)
}

fn finding(nodes: &[AgentNodeCost], ranks: Vec<profiling_cost::Rank>) -> Finding {
    let pct = |r: &profiling_cost::Rank| r.total_percent.unwrap_or(0.0);
    let over = ranks.iter().filter(|r| pct(r) > THRESHOLD_PERCENT).count();
    let worst = ranks.iter().max_by(|a, b| pct(a).total_cmp(&pct(b)));
    let share = |p: Option<f64>| p.map_or_else(|| "not recorded".to_owned(), |p| format!("{p:.3} %"));
    let summary = match worst {
        None => "trainprof's cost is recorded, but no rank is named for its nodes and no hook \
                 recorded its own: its share of the steps' time is unknown."
            .to_owned(),
        Some(w) => format!(
            "trainprof used {:.3} % of a rank's step time at most ({}: the agent {}, the hook {}); \
             the bound is {THRESHOLD_PERCENT} %.",
            pct(w),
            w.rank,
            share(w.agent_percent),
            share(w.hook_percent)
        ),
    };
    let triggered = over > 0;
    Finding {
        rule: evidence::PROFILING_COST.to_owned(),
        triggered,
        evaluated: worst.is_some(),
        summary,
        advice: if triggered {
            "trainprof costs more than it should: see the agent's largest parts and the hook's \
             time per step under \"What profiling cost\"; a longer interval \
             (SystemMonitorIntervalMillis) or fewer NVML kinds lowers the agent's, fewer events \
             per step the hook's."
                .to_owned()
        } else {
            String::new()
        },
        evidence: Evidence::ProfilingCost(profiling_cost::Evidence {
            threshold_percent: THRESHOLD_PERCENT,
            nodes: nodes
                .iter()
                .map(|n| profiling_cost::Node {
                    node: n.node.clone(),
                    cpu_s: n.cpu_s,
                    wall_s: n.wall_s,
                    ranks: n.ranks,
                    steps_percent: n.steps_percent,
                })
                .collect(),
            ranks,
        }),
        ranges: Vec::new(),
        preliminary: None,
    }
}

impl evidence::Present for profiling_cost::Evidence {
    fn present(&self) -> evidence::Table {
        evidence::Table::of(vec![("threshold_percent", self.threshold_percent.into())], &self.ranks).units(&[
            ("threshold_percent", "%"),
            ("agent_percent", "%"),
            ("hook_percent", "%"),
            ("total_percent", "%"),
        ])
    }
}

/// Each rank's windows (detailed, Python, native) and the steps they cost, and its hook.
fn rank_windows(m: &ReportModel, steps: &RankSteps, hooks: &BTreeMap<String, HookCost>) -> Vec<RankWindows> {
    let mut out: BTreeMap<String, RankWindows> = BTreeMap::new();
    let mut add = |rank: &str, w: WindowSpan| {
        let e = out
            .entry(rank.to_owned())
            .or_insert_with(|| RankWindows { rank: rank.to_owned(), ..Default::default() });
        e.windows.push(w);
    };
    for w in &m.detailed.windows {
        add(&w.rank, span("detailed", Some(w.first_step), Some(w.last_step), Some(w.start_s), Some(w.end_s)));
    }
    for w in &m.python {
        add(&w.node, span("python", w.start_step, w.end_step, w.start_s, w.end_s));
    }
    for w in &m.native {
        add(&w.node, span("native", None, None, w.start_s, w.end_s));
    }
    for rank in hooks.keys() {
        out.entry(rank.clone()).or_insert_with(|| RankWindows { rank: rank.clone(), ..Default::default() });
    }
    for r in out.values_mut() {
        let median = steps.get(&r.rank).and_then(|s| median_us(s));
        r.median_step_us = median;
        r.hook = hooks.get(&r.rank).map(|h| hook_rank(h, median));
        r.windows.sort_by(|a, b| a.start_s.unwrap_or(0.0).total_cmp(&b.start_s.unwrap_or(0.0)));
        let mut spans: Vec<(i64, i64)> = r
            .windows
            .iter()
            .filter_map(|w| Some(((w.start_s? * 1e6).ceil() as i64, (w.end_s? * 1e6).floor() as i64)))
            .collect();
        spans.sort_unstable();
        let Some(s) = steps.get(&r.rank) else { continue };
        let mut s = s.clone();
        s.sort_unstable();
        r.steps = s.len() as u64;
        let mut after_window = false;
        for (start, dur) in s {
            let end = start.saturating_add(dur);
            let in_window = spans.iter().any(|&(a, b)| a < end && start < b);
            if in_window || after_window {
                r.steps_left_out += 1;
            }
            after_window = in_window;
        }
    }
    out.into_values().collect()
}

/// The median of the steps' durations, µs.
fn median_us(steps: &[(i64, i64)]) -> Option<f64> {
    let mut d: Vec<i64> = steps.iter().map(|s| s.1.max(0)).collect();
    if d.is_empty() {
        return None;
    }
    d.sort_unstable();
    let n = d.len();
    Some(if n % 2 == 1 { d[n / 2] as f64 } else { (d[n / 2 - 1] as f64 + d[n / 2] as f64) / 2.0 })
}

/// One rank's hook, against its median step (`median_us`).
fn hook_rank(h: &HookCost, median_us: Option<f64>) -> HookRankCost {
    let seconds = h.total_s();
    let us_per_step = (h.steps > 0).then(|| seconds * 1e6 / h.steps as f64);
    let windows = ["detailed", "python"]
        .into_iter()
        .filter_map(|kind| {
            let (opens, closes, seconds) = h.window(kind);
            let n = opens.max(closes);
            (n > 0).then(|| WindowCost {
                kind: kind.to_owned(),
                opens,
                closes,
                seconds,
                ms_per_window: Some(seconds * 1e3 / n as f64),
            })
        })
        .collect();
    HookRankCost {
        steps: h.steps,
        seconds,
        us_per_step,
        step_percent: us_per_step.zip(median_us.filter(|m| *m > 0.0)).map(|(u, m)| u / m * 100.0),
        windows,
        events_written: h.events_written,
        events_dropped: h.events_dropped,
        bytes_written: h.bytes_written,
        parts: h
            .parts
            .iter()
            .map(|p| HookPart { part: p.part.clone(), calls: p.calls, seconds: p.seconds })
            .collect(),
    }
}

fn span(
    kind: &str,
    first: Option<i64>,
    last: Option<i64>,
    start: Option<f64>,
    end: Option<f64>,
) -> WindowSpan {
    WindowSpan { kind: kind.to_owned(), first_step: first, last_step: last, start_s: start, end_s: end }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node `algo-1` whose agent used `cpu_s` over 100 s, with one rank `0-algo-1` that ran
    /// four 10 ms steps, the second in a detailed window.
    fn job(cpu_s: f64) -> (ProfilingCost, Option<Finding>) {
        let record = AgentCost { node: "algo-1".into(), wall_s: 100.0, cpu_s, ..AgentCost::default() };
        let records = BTreeMap::from([("algo-1".to_owned(), record)]);
        let mut m = ReportModel::default();
        m.detailed.windows.push(crate::model::detailed::DetailedWindow {
            rank: "0-algo-1".into(),
            first_step: 1,
            last_step: 1,
            device: None,
            steps: 1,
            start_s: 1.010,
            end_s: 1.020,
            figures: Default::default(),
        });
        let steps: RankSteps = BTreeMap::from([(
            "0-algo-1".to_owned(),
            vec![(1_000_000, 10_000), (1_010_000, 10_000), (1_020_000, 10_000), (1_030_000, 10_000)],
        )]);
        build(&records, &BTreeMap::new(), &m, &steps)
    }

    #[test]
    fn the_finding_fires_above_one_percent_and_not_at_it() {
        let (cost, f) = job(1.01);
        let f = f.unwrap();
        assert!(cost.recorded);
        assert_eq!(cost.nodes[0].ranks, 1);
        assert!((cost.nodes[0].steps_percent.unwrap() - 1.01).abs() < 1e-9);
        assert!(f.triggered && f.evaluated, "{f:?}");
        let (_, f) = job(1.0);
        let f = f.unwrap();
        assert!(!f.triggered && f.evaluated, "{f:?}");
        let (_, f) = job(0.2);
        assert!(!f.unwrap().triggered);
    }

    #[test]
    fn a_window_leaves_out_its_steps_and_the_next() {
        let (cost, _) = job(0.1);
        let r = &cost.ranks[0];
        assert_eq!((r.rank.as_str(), r.steps, r.steps_left_out), ("0-algo-1", 4, 2), "{r:?}");
    }

    #[test]
    fn without_a_record_nothing_is_judged() {
        let (cost, f) = build(&BTreeMap::new(), &BTreeMap::new(), &ReportModel::default(), &RankSteps::new());
        assert!(!cost.recorded && cost.nodes.is_empty() && !cost.hook_recorded);
        assert!(f.is_none());
    }

    /// A rank `0-algo-1` with four 10 ms steps, whose hook spent `python_s` in its Python
    /// layer over 4 steps (and less in the C ABI, which the Python layer holds), and opened
    /// and closed one detailed window.
    fn hooked(agent_cpu_s: Option<f64>, python_s: f64) -> (ProfilingCost, Option<Finding>) {
        use trainprof_output::protocol::hook_cost::PartCost;
        let part = |w: &str, calls, seconds| PartCost { part: w.into(), calls, seconds };
        let hook = HookCost {
            node: "0-algo-1".into(),
            steps: 4,
            events_dropped: 3,
            bytes_written: 1000,
            parts: vec![
                part("abi.step", 8, python_s / 4.0),
                part("python.step", 8, python_s),
                part("window.detailed.open", 1, 0.002),
                part("window.detailed.close", 1, 0.004),
            ],
            ..HookCost::default()
        };
        let hooks = BTreeMap::from([("0-algo-1".to_owned(), hook)]);
        let records: BTreeMap<String, AgentCost> = agent_cpu_s
            .map(|cpu_s| {
                (
                    "algo-1".to_owned(),
                    AgentCost { node: "algo-1".into(), wall_s: 100.0, cpu_s, ..AgentCost::default() },
                )
            })
            .into_iter()
            .collect();
        let steps: RankSteps = BTreeMap::from([(
            "0-algo-1".to_owned(),
            vec![(1_000_000, 10_000), (1_010_000, 10_000), (1_020_000, 10_000), (1_030_000, 30_000)],
        )]);
        build(&records, &hooks, &ReportModel::default(), &steps)
    }

    #[test]
    fn the_hooks_share_is_its_time_per_step_over_the_median_step() {
        // 0.0002 s over 4 steps: 50 µs a step, 0.5 % of the 10 ms median.
        let (cost, f) = hooked(None, 0.0002);
        assert!(cost.hook_recorded && !cost.recorded);
        let r = &cost.ranks[0];
        let h = r.hook.as_ref().unwrap();
        assert_eq!(r.median_step_us, Some(10_000.0));
        assert!((h.us_per_step.unwrap() - 50.0).abs() < 1e-9, "{h:?}");
        assert!((h.step_percent.unwrap() - 0.5).abs() < 1e-9);
        assert_eq!((h.events_dropped, h.bytes_written), (3, 1000));
        assert_eq!(h.windows.len(), 1);
        assert_eq!((h.windows[0].kind.as_str(), h.windows[0].opens, h.windows[0].closes), ("detailed", 1, 1));
        assert!((h.windows[0].ms_per_window.unwrap() - 6.0).abs() < 1e-9);
        let f = f.unwrap();
        assert!(f.evaluated && !f.triggered, "{f:?}");
    }

    #[test]
    fn the_finding_adds_the_agents_share_and_the_hooks() {
        // The agent: 0.6 % of its node's one rank; the hook 0.5 %: 1.1 % together.
        let (cost, f) = hooked(Some(0.6), 0.0002);
        assert!((cost.ranks[0].total_percent.unwrap() - 1.1).abs() < 1e-9);
        assert!(f.unwrap().triggered);
        // Neither alone is over the bound.
        let (_, f) = hooked(Some(0.6), 0.0);
        assert!(!f.unwrap().triggered);
        let (_, f) = hooked(None, 0.0002);
        assert!(!f.unwrap().triggered);
        // The hook alone over the bound: 0.0008 s, 200 µs a step, 2 %.
        let (_, f) = hooked(None, 0.0008);
        assert!(f.unwrap().triggered);
    }
}
