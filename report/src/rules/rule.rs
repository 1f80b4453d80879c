//! What every rule file builds on: the [`Rule`] trait, a rule's [`Verdict`], the windowed
//! judgements ([`Verdicts`], [`Held`], [`Ranges`]) and the helpers the rules share. It names no
//! rule and not the registry (`mod.rs`), so a rule file imports this file only (ARCHITECTURE.md,
//! "The report crate").

use std::fmt::Debug;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::analysis::collect::{self, NodeJudge};

pub use crate::analysis::collect::{SYSTEM_PATIENCE, TickView, Window, preliminary_patience, push_last};
pub use crate::model::Preliminary;
pub use crate::model::evidence::{Cell, Present, Row, Table};

/// What to read and how to judge.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Datapoints a system-metric rule needs before it judges (SageMaker's `patience`:
    /// 1000 for the system rules, 10 seconds of dataloader events for Dataloader). `Some(n)`
    /// lowers both to at most `n` (for short jobs and tests).
    pub patience: Option<u64>,
    /// Files (paths relative to the LocalPath) left out: `trainprof run` reports on its own
    /// job only, not on an earlier one's files beside it.
    pub leave_out: std::collections::HashSet<String>,
}

/// Time ranges kept per finding (per source: a node, a GPU, a rank).
pub const MAX_RANGES: usize = 50;

/// One rule. The aggregation ([`collect::Agg`]) calls [`Rule::tick`] for every tick of a node
/// and [`Rule::judge`] at every 60 s of the node's data and at its last tick; `all` (the
/// registry, `mod.rs`) calls [`Rule::verdict`] once every file is read. The methods take the
/// aggregates over any per-node state `S` that holds this rule's ([`StateOf`]), so a rule file
/// names no registry.
pub trait Rule: Sized {
    /// `findings[].rule`.
    const NAME: &'static str;
    /// What the rule keeps per system node while reading (`()` for a rule judged on the
    /// aggregation alone). Bounded: per node, or per GPU of a node within the caps.
    type Node: Debug + Clone + Default;
    /// `findings[].evidence`: its fields are the documented `--json` keys.
    type Evidence: Debug + Clone + PartialEq + Serialize + DeserializeOwned + Present;

    /// One tick of a node, after the caps.
    fn tick(_state: &mut Self::Node, _tick: &TickView<'_>) {}

    /// A 60 s judgement of a node's data so far (`docs/report.md`, "Findings"). `node` is the
    /// node's aggregation before this tick; its `rules` are not to be read here.
    fn judge<S>(_state: &mut Self::Node, _node: &collect::NodeAgg<S>, _window: &Window) {}

    /// The verdict over the whole job; `agg` is finished ([`collect::Agg::finish`]).
    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, job_start_s: Option<f64>) -> Verdict<Self::Evidence>;

    /// For a rule with a patience: the data it has (the most of any node or GPU it judges)
    /// and the patience, in `UNIT`. A rule with less is judged preliminarily on what there is
    /// (`all`); `None` for a rule without a patience.
    fn datapoints<S: NodeJudge>(_agg: &collect::Agg<S>) -> Option<(u64, u64)> {
        None
    }
    /// The unit of [`Rule::datapoints`].
    const UNIT: &'static str = "datapoints";
}

/// A rule's verdict, before it becomes a [`crate::model::Finding`].
#[derive(Debug, Clone)]
pub struct Verdict<E> {
    pub triggered: bool,
    /// False when the data the rule needs is absent or too short.
    pub evaluated: bool,
    pub summary: String,
    /// What to do; shown only when triggered.
    pub advice: &'static str,
    pub evidence: E,
    /// `[start_s, end_s]` the evidence points at.
    pub ranges: Vec<[f64; 2]>,
}

/// The units shared by the system rules' evidence.
pub const PATIENCE_UNIT: (&str, &str) = ("patience", "datapoints");
pub const WINDOW_UNIT: (&str, &str) = ("window", "values");

/// Rounded to 2 decimals, as the evidence's measured numbers are.
pub fn r2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// The outcome of a windowed check over the job: how often it was judged, how often it
/// held, and the 60 s windows where it held (joined when adjacent).
#[derive(Debug, Clone, Default)]
pub struct Verdicts {
    pub evaluations: u64,
    pub hits: u64,
    pub windows: Ranges,
}

impl Verdicts {
    pub fn judge(&mut self, hit: bool, from: f64, to: f64) {
        self.evaluations += 1;
        if hit {
            self.hits += 1;
            if let Some(last) = self.windows.ranges.last_mut()
                && from <= last[1]
            {
                last[1] = to;
                return;
            }
            if self.windows.ranges.len() < MAX_RANGES {
                self.windows.ranges.push([from, to]);
            } else {
                self.windows.dropped += 1;
            }
        }
    }
}

/// What a rule judged per GPU in 60 s windows gathers for its verdict: whether any window
/// was judged, a description of each GPU whose windows held, and those windows.
#[derive(Debug, Default)]
pub struct Held {
    pub evaluated: bool,
    pub hits: Vec<String>,
    pub ranges: Vec<[f64; 2]>,
}

impl Held {
    /// One GPU's judgements, its evidence at `ranges` (not the whole windows that held).
    pub fn add_at(&mut self, v: &Verdicts, hit: Option<String>, ranges: &[[f64; 2]]) {
        self.evaluated |= v.evaluations > 0;
        if let Some(h) = hit {
            self.hits.push(h);
            self.ranges.extend(ranges.iter().copied());
        }
    }

    /// One GPU's judgements; `hit` describes it when a window held.
    pub fn add(&mut self, v: &Verdicts, hit: Option<String>) {
        self.evaluated |= v.evaluations > 0;
        if let Some(h) = hit {
            self.hits.push(h);
            self.ranges.extend(v.windows.ranges.iter().copied());
        }
    }

    /// The verdict: `no_gpus` when there was no GPU to judge, `too_few` when none was judged
    /// yet, `fine` when no window held, else `held` of the GPUs' descriptions.
    pub fn verdict<E>(
        self,
        no_gpus: bool,
        too_few: impl FnOnce() -> String,
        fine: &str,
        held: impl FnOnce(String) -> String,
        advice: &'static str,
        evidence: E,
    ) -> Verdict<E> {
        let summary = if no_gpus {
            "No GPU metrics.".to_owned()
        } else if !self.evaluated {
            too_few()
        } else if self.hits.is_empty() {
            fine.to_owned()
        } else {
            held(self.hits.join("; "))
        };
        Verdict {
            triggered: !self.hits.is_empty(),
            evaluated: self.evaluated,
            summary,
            advice,
            evidence,
            ranges: self.ranges,
        }
    }
}

/// Time ranges built from ticks: a tick within `gap` seconds of the open range extends it.
#[derive(Debug, Clone, Default)]
pub struct Ranges {
    pub count: u64,
    pub ranges: Vec<[f64; 2]>,
    pub dropped: u64,
}

impl Ranges {
    pub fn hit(&mut self, t: f64, gap: f64) {
        self.count += 1;
        if let Some(last) = self.ranges.last_mut()
            && t - last[1] <= gap
        {
            last[1] = t;
            return;
        }
        if self.ranges.len() < MAX_RANGES {
            self.ranges.push([t, t]);
        } else {
            self.dropped += 1;
        }
    }
}

/// Two ticks closer than this belong to one time range (seconds).
pub const RANGE_GAP_S: f64 = 5.0;

/// The p95 and p5 of a window of recent values.
pub fn p95_p5(q: &std::collections::VecDeque<f64>) -> (Option<f64>, Option<f64>) {
    let v = crate::analysis::stats::sorted(&q.iter().copied().collect::<Vec<_>>());
    (crate::analysis::stats::quantile_sorted(&v, 0.95), crate::analysis::stats::quantile_sorted(&v, 0.05))
}

/// A rule's state inside the per-node state of every rule (the registry's `NodeRules`).
pub trait StateOf<R: Rule>: NodeJudge {
    fn state(&self) -> &R::Node;
    fn state_mut(&mut self) -> &mut R::Node;
}
