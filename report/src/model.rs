//! The report model: what `trainprof report` computes from a LocalPath and what the page
//! (`html.rs`) and `--json` show. The JSON shape is documented in docs/report.md; numbers that
//! cannot be computed are `null`, times are epoch seconds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The whole report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportModel {
    pub version: u32,
    /// The LocalPath or `s3://…` as given.
    pub source: String,
    pub job: Job,
    /// Per mode (`TRAIN`, `EVAL`, …).
    #[serde(default)]
    pub steps: BTreeMap<String, ModeSteps>,
    /// Longest total first.
    #[serde(default)]
    pub phases: Vec<Phase>,
    #[serde(default)]
    pub python: Vec<PythonWindow>,
    /// Anomaly-opened windows; may be empty.
    #[serde(default)]
    pub triggers: Vec<Trigger>,
    /// One per rule, all ten, in the documented order.
    #[serde(default)]
    pub findings: Vec<Finding>,
    /// Only for the page; `--json` leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<Series>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    pub duration_s: Option<f64>,
    /// System nodes (`algo-<n>`).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Timeline nodes (`<rank>-<host>`).
    #[serde(default)]
    pub ranks: Vec<String>,
    /// Job start to the first step's start; `None` when there is no step.
    pub init_s: Option<f64>,
    #[serde(default)]
    pub steps_per_mode: BTreeMap<String, u64>,
    #[serde(default)]
    pub profiled: Profiled,
    #[serde(default)]
    pub dropped_events: u64,
    #[serde(default)]
    pub clock: Vec<Clock>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Profiled {
    pub detailed_steps: u64,
    pub dataloader_events: u64,
    pub python_windows: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Clock {
    pub node: String,
    pub synchronised: bool,
    pub max_error_us: Option<f64>,
    pub est_error_us: Option<f64>,
}

/// Step-time statistics of one rank (or of all ranks together).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub mean_ms: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModeSteps {
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub mean_ms: Option<f64>,
    #[serde(default)]
    pub histogram: Histogram,
    #[serde(default)]
    pub per_rank: BTreeMap<String, StepStats>,
    #[serde(default)]
    pub stragglers: Vec<Straggler>,
    /// At most 50, longest first.
    #[serde(default)]
    pub outliers: Vec<Outlier>,
}

/// `edges_ms.len() == counts.len() + 1`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    pub edges_ms: Vec<f64>,
    pub counts: Vec<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    pub rank: String,
    pub p50_ms: Option<f64>,
    pub median_rank_p50_ms: Option<f64>,
    pub ratio: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outlier {
    pub rank: String,
    pub step: u64,
    pub start_s: f64,
    pub ms: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub count: u64,
    pub total_ms: f64,
    pub mean_ms: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PythonWindow {
    pub node: String,
    pub window: String,
    /// `cprofile` or `pyinstrument`.
    pub profiler: String,
    pub start_step: Option<u64>,
    pub end_step: Option<u64>,
    /// Top 20 by `total_s`.
    #[serde(default)]
    pub functions: Vec<PythonFunction>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PythonFunction {
    pub name: String,
    pub file: String,
    pub line: Option<u64>,
    pub calls: Option<u64>,
    pub self_s: Option<f64>,
    pub total_s: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trigger {
    pub rank: String,
    pub step: u64,
    pub ms: f64,
    pub median_ms: Option<f64>,
    pub start_s: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub rule: String,
    pub triggered: bool,
    /// False when the data the rule needs is absent; then `triggered` is false.
    pub evaluated: bool,
    pub summary: String,
    /// Empty when not triggered.
    pub advice: String,
    /// Rule-specific numbers (docs/report.md).
    #[serde(default)]
    pub evidence: serde_json::Map<String, serde_json::Value>,
    /// `[start_s, end_s]` ranges the evidence points at.
    #[serde(default)]
    pub ranges: Vec<[f64; 2]>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// mode → rank → steps (every step, or min/max decimated to ≤ 4000 points per rank).
    #[serde(default)]
    pub steps: BTreeMap<String, BTreeMap<String, StepSeries>>,
    #[serde(default)]
    pub nodes: BTreeMap<String, NodeSeries>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepSeries {
    pub t_s: Vec<f64>,
    pub ms: Vec<f64>,
}

/// One node's metrics on one shared time axis (≤ 2000 points); every array has `t_s`'s length
/// and a missing sample is `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSeries {
    pub t_s: Vec<f64>,
    pub cpu_total: Vec<Option<f64>>,
    /// Rows are cores; may be empty.
    #[serde(default)]
    pub cpu_cores: Vec<Vec<Option<f64>>>,
    pub memory: Vec<Option<f64>>,
    #[serde(default)]
    pub gpus: BTreeMap<String, GpuSeries>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoSeries>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetSeries>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer: Option<TrainerSeries>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSeries {
    pub util: Vec<Option<f64>>,
    pub mem: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IoSeries {
    pub read_mbps: Vec<Option<f64>>,
    pub write_mbps: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NetSeries {
    pub rx_mbps: Vec<Option<f64>>,
    pub tx_mbps: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerSeries {
    /// Percent of one core.
    pub cpu: Vec<Option<f64>>,
    pub mem_mb: Vec<Option<f64>>,
}
