//! MaxInitializationTime: the first step starts more than 20 minutes after the job's first
//! record (the earliest system tick, event or Python window).

use super::rule::{Present, Rule, StateOf, Table, Verdict, r2};
use crate::analysis::collect;
use crate::model::evidence;
pub use crate::model::evidence::max_init::Evidence;

/// SageMaker's default: 20 minutes.
pub const THRESHOLD_S: f64 = 20.0 * 60.0;

#[derive(Debug)]
pub struct MaxInitializationTime;

impl Rule for MaxInitializationTime {
    const NAME: &'static str = evidence::MAX_INITIALIZATION_TIME;
    type Node = ();
    type Evidence = Evidence;

    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, job_start_s: Option<f64>) -> Verdict<Evidence> {
        let init = match (agg.first_step_us, job_start_s) {
            (Some(f), Some(s)) => Some(f as f64 / 1e6 - s),
            _ => None,
        };
        let triggered = init.is_some_and(|i| i > THRESHOLD_S);
        let summary = match init {
            None => "No step recorded: the start of training is unknown.".to_owned(),
            Some(i) => format!(
                "The first step started {i:.1} s after the job's first record (threshold {THRESHOLD_S} s)."
            ),
        };
        let mut ranges = Vec::new();
        if let (true, Some(s), Some(first)) = (triggered, job_start_s, agg.first_step_us) {
            ranges.push([s, first as f64 / 1e6]);
        }
        Verdict {
            triggered,
            evaluated: init.is_some(),
            summary,
            advice: "Start-up is slow: download the data set ahead of time or stream it (pipe mode, FastFile), cache compiled models, and check what runs before the first step.",
            evidence: Evidence { threshold_minutes: THRESHOLD_S / 60.0, init_s: init.map(r2) },
            ranges,
        }
    }
}

impl Present for Evidence {
    fn present(&self) -> Table {
        Table {
            facts: vec![("threshold_minutes", self.threshold_minutes.into()), ("init_s", self.init_s.into())],
            units: &[("threshold_minutes", "min"), ("init_s", "s")],
            ..Table::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Agg;
    use super::*;

    #[test]
    fn twenty_minutes_to_the_first_step() {
        let mut a = Agg::default();
        a.first_step_us = Some(2_000_000_000);
        let f = MaxInitializationTime::verdict(&a, Some(2000.0 - 1300.0));
        assert!(f.triggered && f.evaluated);
        assert_eq!(f.ranges, vec![[700.0, 2000.0]]);
        assert_eq!(f.evidence, Evidence { threshold_minutes: 20.0, init_s: Some(1300.0) });
        let f = MaxInitializationTime::verdict(&a, Some(1990.0));
        assert!(f.evaluated && !f.triggered);
        assert!(!MaxInitializationTime::verdict(&Agg::default(), Some(1990.0)).evaluated);
    }
}
