//! LoadBalancing: on a node, two GPUs with more than `patience` values whose utilisation
//! histograms (bins of 2 % from 0 to 98) are more than 0.2 apart (Jensen–Shannon distance).
//! Every pair is compared (SageMaker compares only the last GPU with itself, an upstream loop
//! bug).

use super::rule::{Present, Rule, StateOf, Table, Verdict, r2};
use crate::analysis::collect::{self, NodeJudge};
use crate::analysis::stats::js_distance;
use crate::model::evidence;
pub use crate::model::evidence::load_balancing::{Evidence, Pair};

/// SageMaker's default distance threshold.
pub const THRESHOLD: f64 = 0.2;
/// Pairs listed in the evidence (the largest distances when there are more; at most
/// `MAX_GPUS_PER_NODE` GPUs a node are compared, `docs/report.md`, "Caps").
pub const MAX_PAIRS_LISTED: usize = 100;

#[derive(Debug)]
pub struct LoadBalancing;

impl Rule for LoadBalancing {
    const NAME: &'static str = evidence::LOAD_BALANCING;
    type Node = ();
    type Evidence = Evidence;

    /// The second-most values of a node's GPUs (a pair needs two), the most of any node.
    fn datapoints<S: NodeJudge>(agg: &collect::Agg<S>) -> Option<(u64, u64)> {
        let second = |n: &collect::NodeAgg<S>| {
            let mut v: Vec<u64> = n.gpus.values().map(|g| g.util.len()).collect();
            v.sort_unstable();
            v.len().checked_sub(2).map(|i| v[i])
        };
        let have = agg.nodes.values().filter_map(second).max()?;
        Some((have, agg.system_patience()))
    }

    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, _: Option<f64>) -> Verdict<Evidence> {
        let patience = agg.system_patience();
        let judging = agg.judging_patience(patience);
        let mut pairs: Vec<(f64, Pair)> = Vec::new();
        let mut compared = 0u64;
        let mut evaluated = false;
        let mut worst: Option<(&str, &str, &str, f64)> = None;
        let mut ranges = Vec::new();
        for (node, n) in &agg.nodes {
            let judged: Vec<(&String, Vec<f64>)> = n
                .gpus
                .iter()
                .filter(|(_, g)| g.util.len() > judging)
                .map(|(k, g)| (k, g.util.load_bins()))
                .collect();
            for i in 0..judged.len() {
                for j in i + 1..judged.len() {
                    let Some(d) = js_distance(&judged[i].1, &judged[j].1) else { continue };
                    evaluated = true;
                    let hit = d > THRESHOLD;
                    if hit && worst.is_none_or(|w| d > w.3) {
                        worst = Some((node, judged[i].0, judged[j].0, d));
                    }
                    if hit && !ranges.contains(&[n.first_s, n.last_s]) {
                        ranges.push([n.first_s, n.last_s]);
                    }
                    compared += 1;
                    let gpus = [judged[i].0.clone(), judged[j].0.clone()];
                    pairs.push((d, Pair { node: node.clone(), gpus, distance: r2(d), triggered: hit }));
                    // Keep the listed pairs bounded while comparing: the largest distances,
                    // in the order compared.
                    if pairs.len() >= 2 * MAX_PAIRS_LISTED {
                        keep_largest(&mut pairs, MAX_PAIRS_LISTED);
                    }
                }
            }
        }
        keep_largest(&mut pairs, MAX_PAIRS_LISTED);
        let summary = match (worst, evaluated) {
            (_, false) => format!("Needs two GPUs on a node with more than {patience} datapoints each."),
            (None, true) => "The GPUs of each node were equally busy.".to_owned(),
            (Some((node, a, b, d)), true) => format!(
                "On {node}, {a} and {b} were unequally busy (histogram distance {d:.2}, threshold {THRESHOLD})."
            ),
        };
        Verdict {
            triggered: worst.is_some(),
            evaluated,
            summary,
            advice: "Spread the work evenly over the GPUs: check the data-parallel setup (every GPU should run one rank), uneven batch shards, and work pinned to GPU 0.",
            evidence: Evidence {
                threshold: THRESHOLD,
                patience,
                pairs_compared: compared,
                pairs: pairs.into_iter().map(|p| p.1).collect(),
            },
            ranges,
        }
    }
}

/// The `n` entries of `v` with the largest distance, in their order.
fn keep_largest(v: &mut Vec<(f64, Pair)>, n: usize) {
    if v.len() <= n {
        return;
    }
    let mut by: Vec<usize> = (0..v.len()).collect();
    by.sort_by(|&a, &b| v[b].0.total_cmp(&v[a].0).then(a.cmp(&b)));
    let mut keep = vec![false; v.len()];
    for &i in &by[..n] {
        keep[i] = true;
    }
    let mut i = 0;
    v.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

impl Present for Evidence {
    fn present(&self) -> Table {
        Table::of(
            vec![
                ("threshold", self.threshold.into()),
                ("patience", self.patience.into()),
                ("pairs_compared", self.pairs_compared.into()),
            ],
            &self.pairs,
        )
        .units(&[("threshold", ""), super::rule::PATIENCE_UNIT, ("distance", "")])
    }
}

#[cfg(test)]
mod tests {
    use super::super::all;
    use super::super::tests::{get, run};

    #[test]
    fn unequal_gpus_of_a_node() {
        let f = all(&mut run(600, 20.0, 0.0, &[(90.0, 30.0), (3.0, 30.0)]), None);
        let lb = get(&f, "LoadBalancing");
        assert!(lb.triggered, "{}", lb.summary);
        let f = all(&mut run(600, 20.0, 0.0, &[(90.0, 30.0), (90.0, 30.0)]), None);
        let lb = get(&f, "LoadBalancing");
        assert!(lb.evaluated && !lb.triggered, "{}", lb.summary);
    }
}
