//! The fleet view as the report holds it (`docs/report.md`, "Many ranks"): every rank's
//! robust score, the stragglers and their likely causes, and what the page draws;
//! `analysis/fleet.rs` computes it.

use serde::{Deserialize, Serialize};

pub use super::kinds::{CauseKind, StepChartKind};

/// `--json`'s `fleet`: the scores of the ranks of one mode and the stragglers' causes.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Fleet {
    /// The mode scored: `TRAIN` when there is one, else the mode with the most steps.
    pub mode: String,
    pub ranks: u64,
    pub nodes: u64,
    /// The median of the ranks' median steps, and their median absolute deviation.
    pub median_ms: f64,
    pub mad_ms: f64,
    /// The thresholds: score ≥ `z_threshold` and median ≥ `min_slowdown` × `median_ms`.
    pub z_threshold: f64,
    pub min_slowdown: f64,
    /// Every rank's score, the highest first (at most [`MAX_SCORES`]).
    pub scores: Vec<RankScore>,
    pub stragglers: Vec<FleetStraggler>,
    /// The rank that arrived last at the collectives (`collectives.late_rank`), with its
    /// score and its node's likely causes; `None` when no rank was named late.
    #[serde(default)]
    pub late_rank: Option<FleetLateRank>,
    /// What the page draws: every rank's line, or the distribution and these ranks; the
    /// nodes whose system charts are drawn, and how many are not.
    pub page: PageChoice,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct RankScore {
    pub rank: String,
    /// The system node of the rank (`<rank>-<host>`'s host), when there is one by that name.
    pub node: Option<String>,
    pub p50_ms: f64,
    /// Modified z-score of the rank's median.
    pub score: f64,
    /// Fastest rank's median ÷ this rank's (NVIDIA's relative score).
    pub relative: f64,
    /// The rank's best tenth's median ÷ its whole median (NVIDIA's individual score).
    pub individual: Option<f64>,
    pub straggler: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct FleetStraggler {
    pub rank: String,
    pub node: Option<String>,
    pub p50_ms: f64,
    pub score: f64,
    /// Its median ÷ the median rank's.
    pub slowdown: f64,
    /// Its first step's start and last step's end (s since the epoch).
    pub from_s: f64,
    pub to_s: f64,
    /// Likely causes on its node while it ran, the strongest first; empty when the node's
    /// rows show nothing unusual (or the rank has no system node).
    pub causes: Vec<Cause>,
}

/// `fleet.late_rank`: the collectives' late rank beside the step-time scores (`docs/report.md`,
/// "Many ranks").
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct FleetLateRank {
    pub rank: String,
    pub node: Option<String>,
    /// The share of its matched collectives it arrived last at, and the others' wait for it.
    pub last_share: f64,
    pub others_waited_ms: f64,
    /// Its step-time score and whether it is a straggler by it (`None`: not among the scores).
    pub score: Option<f64>,
    pub straggler: bool,
    /// Likely causes on its node while it ran, as for a straggler.
    pub causes: Vec<Cause>,
    pub summary: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Cause {
    /// `thermal_throttling`, `power_throttling`, `hw_slowdown`, `xid`, `cpu_pressure`,
    /// `memory_pressure`, `io_pressure`, `low_pcie`.
    pub cause: CauseKind,
    /// The share of the node's ticks with the signal (for `low_pcie`: its mean PCIe bytes/s
    /// ÷ the median node's; for `xid`: the count).
    pub node_value: f64,
    /// The same on the median node.
    pub fleet_value: f64,
    /// When the signal was on (s since the epoch).
    pub from_s: Option<f64>,
    pub to_s: Option<f64>,
    /// The rows and numbers, in words.
    pub evidence: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct PageChoice {
    /// `ranks` (one line per rank) or `distribution` (p10/p50/p90/max across ranks and the
    /// ranks in `ranks_drawn`).
    pub step_chart: StepChartKind,
    pub ranks_drawn: Vec<String>,
    pub nodes_drawn: Vec<String>,
    pub nodes_not_drawn: u64,
}
