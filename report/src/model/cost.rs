//! What profiling cost (`profiling_cost`, docs/report.md, "What profiling cost"): the
//! agent's CPU per node, from its own cost records; per rank, its hook's time from the
//! hook's cost record, and the windows it ran with the steps they cost, from the timelines.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct ProfilingCost {
    /// Whether any node's agent wrote a cost record (an older agent did not: `nodes` is then
    /// empty and the page says "not recorded").
    pub recorded: bool,
    /// Whether any rank's hook wrote a cost record (an older hook did not: each rank's `hook`
    /// is then `null` and the page says "not recorded").
    pub hook_recorded: bool,
    /// The finding's bound: the agent's share of the steps' time, percent.
    pub threshold_percent: f64,
    pub nodes: Vec<AgentNodeCost>,
    pub ranks: Vec<RankWindows>,
}

/// One node's agent.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct AgentNodeCost {
    pub node: String,
    /// The record's span: the agent's start to the record, seconds.
    pub wall_s: f64,
    /// The agent process's CPU (user + system), seconds.
    pub cpu_s: f64,
    /// `cpu_s / wall_s`, percent of one core.
    pub core_percent: f64,
    /// The ranks of this node in the timelines (`<n>-<node>`); 0 when none is named for it.
    pub ranks: u64,
    /// `cpu_s / (wall_s × ranks)`, percent: the agent's share of the time of the node's
    /// ranks' steps; `null` without a rank.
    pub steps_percent: Option<f64>,
    pub peak_rss_bytes: u64,
    pub ticks: u64,
    pub interval_ms: u64,
    /// The largest parts (at most five), largest first.
    pub largest_parts: Vec<PartShare>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct PartShare {
    pub part: String,
    pub seconds: f64,
    /// Of the agent's `cpu_s`, percent.
    pub percent: f64,
    pub calls: u64,
}

/// One rank's profiling windows and the steps they cost.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct RankWindows {
    pub rank: String,
    pub windows: Vec<WindowSpan>,
    /// Steps that overlap a window, and the step right after each (its teardown lands
    /// there): the steps `trainprof compare` and the anomaly trigger leave out.
    pub steps_left_out: u64,
    /// The rank's steps, every mode.
    pub steps: u64,
    /// The rank's median step (every mode pooled), µs; `null` without steps.
    pub median_step_us: Option<f64>,
    /// The rank's hook, from its newest cost record; `null` when it wrote none.
    pub hook: Option<HookRankCost>,
    /// What the finding judges: the agent's share of its node's steps' time plus the hook's
    /// share of this rank's median step, percent; `null` when neither is known.
    pub total_percent: Option<f64>,
}

/// One rank's hook (docs/formats.md, "The hook's own cost").
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct HookRankCost {
    /// Steps the hook saw begin.
    pub steps: u64,
    /// The hook's time outside windows (the Python layer's when it drove the hook, else the
    /// C ABI's), seconds, and per step, µs.
    pub seconds: f64,
    pub us_per_step: Option<f64>,
    /// `us_per_step` of the rank's median step, percent.
    pub step_percent: Option<f64>,
    /// Each window kind's opens and closes.
    pub windows: Vec<WindowCost>,
    pub events_written: u64,
    pub events_dropped: u64,
    pub bytes_written: u64,
    /// Every part of the record: its word, calls and seconds.
    pub parts: Vec<HookPart>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct WindowCost {
    /// `detailed` or `python`.
    pub kind: String,
    pub opens: u64,
    pub closes: u64,
    /// Opens and closes together, seconds; and per window (per open, or per close when
    /// there were more), ms.
    pub seconds: f64,
    pub ms_per_window: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct HookPart {
    pub part: String,
    pub calls: u64,
    pub seconds: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct WindowSpan {
    /// `detailed`, `python` or `native`.
    pub kind: String,
    pub first_step: Option<i64>,
    pub last_step: Option<i64>,
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
}
