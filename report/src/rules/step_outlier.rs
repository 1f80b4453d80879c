//! StepOutlier: for a rank and mode with more than 100 steps, more than 10 steps longer than
//! the mean + 3σ of that rank's steps of that mode.

use super::rule::{MAX_RANGES, Present, Rule, StateOf, Table, Verdict, r2};
use crate::analysis::collect;
use crate::analysis::steps::outlier_steps;
use crate::model::evidence;
pub use crate::model::evidence::step_outlier::{Evidence, RankEvidence};

/// SageMaker's defaults (its σ: [`crate::analysis::steps::STDDEV`]).
pub use crate::analysis::steps::STDDEV;
pub const N_OUTLIERS: usize = 10;
pub const MIN_STEPS: usize = 100;
/// Outlier step numbers listed per rank and mode.
pub const MAX_STEPS_LISTED: usize = 100;

#[derive(Debug)]
pub struct StepOutlier;

impl Rule for StepOutlier {
    const NAME: &'static str = evidence::STEP_OUTLIER;
    type Node = ();
    type Evidence = Evidence;

    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, _: Option<f64>) -> Verdict<Evidence> {
        /// Ranks named in the summary (`docs/report.md`, "Many ranks").
        const MAX_RANKS_SAID: usize = 8;
        let mut rows = Vec::new();
        let (mut evaluated, mut triggered) = (false, false);
        let mut ranges = Vec::new();
        let mut hits = Vec::new();
        for (mode, ranks) in &agg.steps {
            for (rank, steps) in ranks {
                let judged = steps.len() > MIN_STEPS;
                evaluated |= judged;
                let (threshold, out) = outlier_steps(steps);
                let hit = judged && out.len() > N_OUTLIERS;
                triggered |= hit;
                if hit {
                    hits.push(format!(
                        "{} {mode} steps of {rank} took longer than {threshold:.1} ms",
                        out.len()
                    ));
                    for s in out.iter().take(MAX_RANGES) {
                        ranges.push([s.start_us as f64 / 1e6, (s.start_us + s.dur_us) as f64 / 1e6]);
                    }
                }
                rows.push(RankEvidence {
                    rank: rank.clone(),
                    mode: mode.clone(),
                    steps: steps.len() as u64,
                    threshold_ms: threshold.is_finite().then(|| r2(threshold)),
                    outliers: out.len() as u64,
                    outlier_steps: out.iter().take(MAX_STEPS_LISTED).map(|s| s.step).collect(),
                    triggered: hit,
                });
            }
        }
        let summary = if rows.is_empty() {
            "No steps recorded.".to_owned()
        } else if !evaluated {
            format!("Too few steps to judge (the rule needs more than {MIN_STEPS} per rank and mode).")
        } else if hits.is_empty() {
            format!("No rank had more than {N_OUTLIERS} steps longer than mean + 3σ.")
        } else if hits.len() > MAX_RANKS_SAID {
            // Over hundreds of ranks the sentence names the first few; the evidence has all.
            format!(
                "{}; and {} more ranks (the evidence lists them).",
                hits[..MAX_RANKS_SAID].join("; "),
                hits.len() - MAX_RANKS_SAID
            )
        } else {
            format!("{}.", hits.join("; "))
        };
        Verdict {
            triggered,
            evaluated,
            summary,
            advice: "Look at what the slow steps did (the trace shows them): checkpointing, evaluation, garbage collection, data-loader stalls or a slow node; move periodic work out of the step or make it asynchronous.",
            evidence: Evidence {
                stddev: STDDEV,
                n_outliers: N_OUTLIERS as u64,
                min_steps: MIN_STEPS as u64,
                ranks: rows,
            },
            ranges,
        }
    }
}

impl Present for Evidence {
    /// The ranks that triggered first: a job of thousands of ranks shows those.
    fn present(&self) -> Table {
        let mut ranks: Vec<&RankEvidence> = self.ranks.iter().collect();
        ranks.sort_by_key(|r| !r.triggered);
        Table::of(
            vec![
                ("stddev", self.stddev.into()),
                ("n_outliers", self.n_outliers.into()),
                ("min_steps", self.min_steps.into()),
            ],
            ranks,
        )
        .units(&[
            ("stddev", "σ"),
            ("min_steps", "steps"),
            ("steps", "steps"),
            ("threshold_ms", "ms"),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::super::Agg;
    use super::*;

    #[test]
    fn needs_more_than_ten() {
        let mut a = Agg::default();
        use crate::analysis::steps::StepRec;
        let steps: Vec<StepRec> = (0..200)
            .map(|i| StepRec {
                start_us: i * 1_000_000,
                dur_us: if i % 17 == 5 { 500_000 } else { 10_000 },
                step: i,
            })
            .collect();
        a.steps.entry("TRAIN".into()).or_default().insert("0-algo-1".into(), steps.clone());
        let f = StepOutlier::verdict(&a, None);
        assert!(f.triggered, "{}", f.summary);
        assert_eq!(f.ranges.len(), 12);
        assert_eq!(f.evidence.ranks[0].outliers, 12);
        assert_eq!(f.evidence.ranks[0].outlier_steps[..2], [5, 22]);
        // Ten outliers only: not triggered.
        let mut few = steps.clone();
        for s in few.iter_mut().filter(|s| s.dur_us == 500_000).skip(10) {
            s.dur_us = 10_000;
        }
        a.steps.get_mut("TRAIN").unwrap().insert("0-algo-1".into(), few);
        let f = StepOutlier::verdict(&a, None);
        assert!(f.evaluated && !f.triggered, "{}", f.summary);
    }
}
