//! What profiling cost (docs/report.md, "What profiling cost"): the agent's CPU per node from
//! its cost records (`reading/agent_cost.rs`), each rank's windows from the model, and the
//! steps those windows cost, counted as `trainprof compare` leaves them out (docs/report.md,
//! "Which steps are compared"): a step that overlaps a window, and the step right after it.

use std::collections::BTreeMap;

use trainprof_output::protocol::agent_cost::AgentCost;

use crate::analysis::collectives::node_of;
use crate::model::cost::{AgentNodeCost, PartShare, ProfilingCost, RankWindows, WindowSpan};
use crate::model::evidence::{self, profiling_cost};
use crate::model::{Evidence, Finding, ReportModel};

/// The finding's bound: the agent's CPU over its node's steps' time, percent.
pub const THRESHOLD_PERCENT: f64 = 1.0;
/// Parts listed per node.
pub const LARGEST_PARTS: usize = 5;

/// Each rank's steps (every mode pooled) as (start µs, duration µs).
pub type RankSteps = BTreeMap<String, Vec<(i64, i64)>>;

/// The section's model, and the finding when any agent wrote a record.
pub fn build(
    records: &BTreeMap<String, AgentCost>,
    m: &ReportModel,
    steps: &RankSteps,
) -> (ProfilingCost, Option<Finding>) {
    let ranks = rank_windows(m, steps);
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
    let finding = (!nodes.is_empty()).then(|| finding(&nodes));
    let cost =
        ProfilingCost { recorded: !nodes.is_empty(), threshold_percent: THRESHOLD_PERCENT, nodes, ranks };
    (cost, finding)
}

fn finding(nodes: &[AgentNodeCost]) -> Finding {
    let judged: Vec<&AgentNodeCost> = nodes.iter().filter(|n| n.steps_percent.is_some()).collect();
    let over: Vec<&AgentNodeCost> =
        judged.iter().copied().filter(|n| n.steps_percent.is_some_and(|p| p > THRESHOLD_PERCENT)).collect();
    let worst = judged
        .iter()
        .copied()
        .max_by(|a, b| a.steps_percent.unwrap_or(0.0).total_cmp(&b.steps_percent.unwrap_or(0.0)));
    let summary = match worst {
        None => "The agent's cost is recorded, but no rank is named for its nodes: its share of the \
                 steps' time is unknown."
            .to_owned(),
        Some(w) => format!(
            "The agent used {:.3} % of its node's steps' time at most ({}: {:.3} CPU s over {:.1} s \
             and {} {}); the bound is {THRESHOLD_PERCENT} %.",
            w.steps_percent.unwrap_or(0.0),
            w.node,
            w.cpu_s,
            w.wall_s,
            w.ranks,
            if w.ranks == 1 { "rank" } else { "ranks" }
        ),
    };
    let triggered = !over.is_empty();
    Finding {
        rule: evidence::PROFILING_COST.to_owned(),
        triggered,
        evaluated: worst.is_some(),
        summary,
        advice: if triggered {
            "The agent's sampling costs more than it should: see its largest parts under \"What \
             profiling cost\"; a longer interval (SystemMonitorIntervalMillis) or fewer NVML \
             kinds lowers it."
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
        }),
        ranges: Vec::new(),
        preliminary: None,
    }
}

impl evidence::Present for profiling_cost::Evidence {
    fn present(&self) -> evidence::Table {
        evidence::Table::of(vec![("threshold_percent", self.threshold_percent.into())], &self.nodes).units(&[
            ("threshold_percent", "%"),
            ("cpu_s", "s"),
            ("wall_s", "s"),
            ("steps_percent", "%"),
        ])
    }
}

/// Each rank's windows (detailed, Python, native) and the steps they cost.
fn rank_windows(m: &ReportModel, steps: &RankSteps) -> Vec<RankWindows> {
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
    for r in out.values_mut() {
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
        build(&records, &m, &steps)
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
        let (cost, f) = build(&BTreeMap::new(), &ReportModel::default(), &RankSteps::new());
        assert!(!cost.recorded && cost.nodes.is_empty());
        assert!(f.is_none());
    }
}
