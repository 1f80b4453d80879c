//! Dataloader: with more than `patience` seconds of dataloader events, the median number of
//! processes (`args.pid`) with a `DataLoaderIter` / `DataLoaderWorker` event per second below
//! 70 % or above 200 % of the cores. The events are gathered by `collect.rs` (bounded:
//! `docs/report.md`, "Caps").

use super::rule::{Present, Rule, StateOf, Table, Verdict};
use crate::analysis::collect::{self, NodeJudge};
use crate::analysis::stats::{quantile_sorted, sorted};
use crate::model::evidence;
pub use crate::model::evidence::dataloader::{Evidence, Quantiles};

/// SageMaker's defaults: percentages of the cores, and `patience` in seconds with events.
pub const MIN_THRESHOLD: u64 = 70;
pub const MAX_THRESHOLD: u64 = 200;
pub const PATIENCE: u64 = 10;

#[derive(Debug)]
pub struct Dataloader;

/// Seconds with dataloader events the rule waits for (`--patience` lowers it).
fn patience<S: NodeJudge>(agg: &collect::Agg<S>) -> u64 {
    agg.patience.map_or(PATIENCE, |p| p.min(PATIENCE))
}

impl Rule for Dataloader {
    const NAME: &'static str = evidence::DATALOADER;
    type Node = ();
    type Evidence = Evidence;

    const UNIT: &'static str = "seconds";

    fn datapoints<S: NodeJudge>(agg: &collect::Agg<S>) -> Option<(u64, u64)> {
        Some((agg.dataloader_pids.len() as u64, patience(agg)))
    }

    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, _: Option<f64>) -> Verdict<Evidence> {
        let patience = patience(agg);
        let cores = agg.nodes.values().map(|n| n.cores.len()).max().unwrap_or(0) as u64;
        let parallel: Vec<f64> = agg.dataloader_pids.values().map(|p| p.len() as f64).collect();
        let median = quantile_sorted(&sorted(&parallel), 0.5).map(f64::floor);
        let evaluated = parallel.len() as u64 > agg.judging_patience(patience) && cores > 0;
        let (too_few, too_many) = match median {
            Some(m) if evaluated => (
                m < cores as f64 * (MIN_THRESHOLD as f64 / 100.0),
                m > cores as f64 * (MAX_THRESHOLD as f64 / 100.0),
            ),
            _ => (false, false),
        };
        let d = sorted(&agg.dataloader_durations_s);
        let summary = if agg.dataloader_events == 0 {
            "No dataloader events (profile a dataloader window to get them).".to_owned()
        } else if cores == 0 {
            "No CPU core metrics to compare the dataloaders with.".to_owned()
        } else if !evaluated {
            format!(
                "{} dataloader events over {} seconds: too few to judge (the rule waits for more than {patience} seconds).",
                agg.dataloader_events,
                parallel.len()
            )
        } else {
            let verdict = if too_few {
                "fewer than 70 % of the cores"
            } else if too_many {
                "more than twice the cores"
            } else {
                "in range"
            };
            format!(
                "A median of {} processes loaded data in parallel on {cores} cores: {verdict}.",
                median.unwrap_or(0.0)
            )
        };
        Verdict {
            triggered: too_few || too_many,
            evaluated,
            summary,
            advice: if too_many {
                "Too many data-loading processes compete for the cores: lower num_workers."
            } else {
                "Data loading uses few of the cores: raise the DataLoader's num_workers, and set pin_memory=True when training on GPUs."
            },
            evidence: Evidence {
                min_threshold: MIN_THRESHOLD,
                max_threshold: MAX_THRESHOLD,
                patience,
                cores,
                parallel_dataloaders_median: median,
                seconds_with_dataloading: parallel.len() as u64,
                events: agg.dataloader_events,
                num_workers: agg.dataloader_num_workers,
                pin_memory: agg.dataloader_pin_memory,
                dataloading_time_s: Quantiles {
                    p25: quantile_sorted(&d, 0.25),
                    p50: quantile_sorted(&d, 0.5),
                    p95: quantile_sorted(&d, 0.95),
                },
            },
            ranges: Vec::new(),
        }
    }
}

impl Present for Evidence {
    fn present(&self) -> Table {
        let q = &self.dataloading_time_s;
        Table {
            facts: vec![
                ("min_threshold", self.min_threshold.into()),
                ("max_threshold", self.max_threshold.into()),
                ("patience", self.patience.into()),
                ("cores", self.cores.into()),
                ("parallel_dataloaders_median", self.parallel_dataloaders_median.into()),
                ("seconds_with_dataloading", self.seconds_with_dataloading.into()),
                ("events", self.events.into()),
                ("num_workers", self.num_workers.into()),
                ("pin_memory", self.pin_memory.into()),
                ("dataloading_time_s p25", q.p25.into()),
                ("dataloading_time_s p50", q.p50.into()),
                ("dataloading_time_s p95", q.p95.into()),
            ],
            units: &[
                ("min_threshold", "% of the cores"),
                ("max_threshold", "% of the cores"),
                ("patience", "seconds"),
                ("parallel_dataloaders_median", "processes"),
                ("seconds_with_dataloading", "seconds"),
                ("dataloading_time_s p25", "s"),
                ("dataloading_time_s p50", "s"),
                ("dataloading_time_s p95", "s"),
            ],
            ..Table::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::run;
    use super::*;

    #[test]
    fn parallel_loaders_against_the_cores() {
        let mut a = run(5, 10.0, 0.0, &[]);
        for s in 0..20 {
            a.dataloader_pids.entry(s).or_default().insert(7);
        }
        a.dataloader_events = 20;
        a.patience = None;
        // One process on two cores: below 70 %.
        let f = Dataloader::verdict(&a, None);
        assert!(f.triggered, "{}", f.summary);
        // Five processes on two cores: above 200 %.
        for s in 0..20 {
            a.dataloader_pids.entry(s).or_default().extend([8, 9, 10, 11]);
        }
        let f = Dataloader::verdict(&a, None);
        assert!(f.triggered && f.summary.contains("more than twice"), "{}", f.summary);
        assert!(f.advice.contains("lower num_workers"), "{}", f.advice);
        assert_eq!(f.evidence.parallel_dataloaders_median, Some(5.0));
        // Two on two: in range.
        for s in 0..20 {
            a.dataloader_pids.insert(s, [1, 2].into_iter().collect());
        }
        let f = Dataloader::verdict(&a, None);
        assert!(f.evaluated && !f.triggered, "{}", f.summary);
    }
}
