//! The report model: what `trainprof report --json` prints and what the HTML page draws.
//! Every key is documented in `docs/report.md`. Times are epoch seconds; numbers that cannot be
//! computed are `None` (JSON `null`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod collectives;
pub mod cost;
pub mod detailed;
pub mod evidence;
pub mod fleet;
pub mod hangs;
pub mod kinds;
pub mod memory;

pub use detailed::{Detailed, DetailedFigures, DetailedWindow, LaunchDelay, Share, TopRow};
pub use evidence::Evidence;
pub use hangs::Hangs;
pub use kinds::{AlignState, ClockState, MatchedBy, PythonGroupKind, StepChartKind};
pub use trainprof_output::protocol::native_window::NativeFile;
pub use trainprof_output::protocol::python_window::PythonProfilerDir;

/// The version of this shape; raised when a key changes meaning.
pub const VERSION: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ReportModel {
    pub version: u32,
    pub source: String,
    pub job: Job,
    /// Per mode (`TRAIN`, `EVAL`, …).
    pub steps: BTreeMap<String, ModeSteps>,
    pub phases: Vec<Phase>,
    pub python: Vec<PythonWindow>,
    /// The Python windows grouped as configured or triggered, and the top functions over the
    /// step windows (docs/report.md, "Python windows"); an optional extra.
    #[serde(default)]
    pub python_summary: PythonSummary,
    /// The native windows (docs/report.md, "Native windows"); an optional extra.
    #[serde(default)]
    pub native: Vec<NativeWindow>,
    pub triggers: Vec<Trigger>,
    /// The windows `trainprof trigger` armed, one per rank that opened one (docs/report.md,
    /// "Requested windows"); an optional extra, left out when there were none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requested: Vec<RequestedWindow>,
    /// The windows that stopped at their cap, one per `trainprof:WindowCapped` event
    /// (docs/report.md, "Capped windows"); an optional extra, left out when there were none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capped_windows: Vec<CappedWindow>,
    pub findings: Vec<Finding>,
    /// The detailed windows explained (`docs/report.md`, "Detailed windows").
    #[serde(default)]
    pub detailed: Detailed,
    /// Hangs and crashes (`docs/report.md`, "Hangs and crashes"): empty when there were none.
    #[serde(default)]
    pub hangs: Hangs,
    /// PyTorch memory snapshots (`docs/report.md`, "Memory"): empty without them.
    #[serde(default)]
    pub memory: memory::Memory,
    /// Many ranks: robust straggler scores and their nodes' causes (`docs/report.md`,
    /// "Many ranks"); `null` with fewer than two ranks.
    #[serde(default)]
    pub fleet: Option<fleet::Fleet>,
    /// Collectives matched across ranks and the nodes' clocks aligned from them
    /// (`docs/report.md`, "Collectives across ranks"); left out when the detailed windows
    /// hold no collective.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collectives: Option<collectives::Collectives>,
    /// NCCL Inspector's records of the job's collectives, per process (`docs/report.md`,
    /// "NCCL Inspector"); left out without Inspector files in the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_inspector: Option<collectives::Inspector>,
    /// What profiling cost: the agent's CPU per node and each rank's windows
    /// (`docs/report.md`, "What profiling cost").
    #[serde(default)]
    pub profiling_cost: cost::ProfilingCost,
    /// Only for the HTML page; `--json` leaves it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<Series>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Job {
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    pub duration_s: Option<f64>,
    pub nodes: Vec<String>,
    pub ranks: Vec<String>,
    pub init_s: Option<f64>,
    pub steps_per_mode: BTreeMap<String, u64>,
    pub profiled: Profiled,
    pub dropped_events: u64,
    pub clock: Vec<Clock>,
    /// Files and folders left alone while reading (links, special files, unreadable or
    /// unparsable files), with why. Not in the contract's minimum; optional.
    #[serde(default)]
    pub skipped: Vec<String>,
    /// The caps on distinct names that were reached, and what was left out because of them
    /// (`docs/report.md`, "Caps"); empty when none was.
    #[serde(default)]
    pub capped: Vec<Capped>,
    /// Each system node's GPUs by model, from its newest node record (docs/formats.md,
    /// "Node record"): node → model → GPUs; a node without a record is absent (optional).
    #[serde(default)]
    pub gpu_models: BTreeMap<String, BTreeMap<String, u32>>,
    /// Each system node's job identity from its newest node record (docs/formats.md, "Job
    /// identity"): node → key → value (the keys of `SUMMARY_KEYS` that are known); a node
    /// whose record has none is absent (optional).
    #[serde(default)]
    pub identities: BTreeMap<String, BTreeMap<String, String>>,
}

/// A cap that was reached.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Capped {
    /// `nodes`, `gpus`, `cores`, `columns`, `ranks`, `modes`, `phases`, `dataloader_seconds`,
    /// `dataloader_pids`, `detailed_steps`, `detailed_events`, `detailed_waits`, `detailed_names`,
    /// `memory_events` (`docs/report.md`, "Memory over the detailed windows"),
    /// `trainer_gpu_memory` (`docs/report.md`, "Memory"),
    /// `demangled_bytes` (mangled names not demangled, `docs/report.md` "Mangled names"),
    /// `nccl_inspector_records`, `nccl_inspector_files` (`docs/report.md`, "NCCL Inspector") or
    /// `names` (names longer than the cap, in bytes).
    pub what: String,
    /// The node, for a per-node cap; `null` for a per-job one.
    pub node: Option<String>,
    pub limit: u64,
    /// Values past the cap: ticks (`nodes`), readings (`gpus`, `cores`, `columns`), events
    /// (`ranks`, `modes`, `phases`, `dataloader_*`, `detailed_steps`), or any of these
    /// (`names`).
    pub left_out: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Profiled {
    pub detailed_steps: u64,
    pub dataloader_events: u64,
    /// Python profiling windows as named on the page (`python_summary.windows`).
    pub python_windows: u64,
    /// Their folders (two a profiled step).
    #[serde(default)]
    pub python_folders: u64,
    #[serde(default)]
    pub native_windows: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Clock {
    pub node: String,
    /// `synchronised` (every reading), `unsynchronised` (at least one reading) or `unknown`
    /// (no `Synchronised` row).
    /// `None` only in a model written before the state was kept.
    #[serde(default)]
    pub state: Option<ClockState>,
    /// `state` is `synchronised`.
    pub synchronised: bool,
    /// `Synchronised` rows read, and how many of them said 0.
    #[serde(default)]
    pub readings: u64,
    #[serde(default)]
    pub unsynchronised_readings: u64,
    /// The largest error bound and estimate, µs: only when synchronised. An undisciplined
    /// kernel's bound grows to its 16 s ceiling, which is no measurement.
    pub max_error_us: Option<f64>,
    pub est_error_us: Option<f64>,
}

impl Clock {
    /// A node's clock from its readings.
    pub fn new(
        node: &str,
        readings: u64,
        unsynchronised: u64,
        max_error_us: Option<f64>,
        est_error_us: Option<f64>,
    ) -> Clock {
        let state = match (readings, unsynchronised) {
            (0, _) => ClockState::Unknown,
            (_, 0) => ClockState::Synchronised,
            _ => ClockState::Unsynchronised,
        };
        let synchronised = state == ClockState::Synchronised;
        Clock {
            node: node.to_owned(),
            state: Some(state),
            synchronised,
            readings,
            unsynchronised_readings: unsynchronised,
            max_error_us: max_error_us.filter(|_| synchronised),
            est_error_us: est_error_us.filter(|_| synchronised),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct StepStats {
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub mean_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct ModeSteps {
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub mean_ms: Option<f64>,
    pub histogram: Histogram,
    pub per_rank: BTreeMap<String, StepStats>,
    pub stragglers: Vec<Straggler>,
    pub outliers: Vec<Outlier>,
    /// The step-time chart's axis, the steps above it and the warm-up (`docs/report.md`,
    /// "The step chart"): the page draws only these.
    #[serde(default)]
    pub chart: StepChart,
}

/// The step-time chart of a mode.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct StepChart {
    /// The y axis, ms: from 0 to 1.5 × the p99 step when longer steps exist (the bulk),
    /// else to 1.05 × the longest step.
    pub y_min_ms: f64,
    pub y_max_ms: f64,
    /// Steps above `y_max_ms` (drawn at the axis's top edge), longest first, at most
    /// `MAX_OUTLIERS`; `above_count` counts them all.
    pub above: Vec<Outlier>,
    pub above_count: u64,
    /// Per rank, its warm-up (ranks without one are left out).
    pub warmup: Vec<Warmup>,
}

/// A rank's warm-up: its first steps (by start time) that are each longer than
/// `WARMUP_RATIO` (1.5) × the rank's median step, when they are at most a tenth of its steps.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Warmup {
    pub rank: String,
    pub steps: u64,
    pub first_step: i64,
    pub last_step: i64,
    pub start_s: f64,
    pub end_s: f64,
    /// The warm-up steps' total, and the rank's median step.
    pub ms: f64,
    pub median_ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Histogram {
    pub edges_ms: Vec<f64>,
    pub counts: Vec<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Straggler {
    pub rank: String,
    pub p50_ms: f64,
    pub median_rank_p50_ms: f64,
    pub ratio: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Outlier {
    pub rank: String,
    pub step: i64,
    pub start_s: f64,
    pub ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Phase {
    pub name: String,
    pub count: u64,
    pub total_ms: f64,
    pub mean_ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PythonWindow {
    pub node: String,
    pub window: String,
    pub profiler: PythonProfilerDir,
    pub start_step: Option<i64>,
    pub end_step: Option<i64>,
    pub functions: Vec<PyFunction>,
    /// The window's start and end (epoch s) from its folder name; optional extras.
    #[serde(default)]
    pub start_s: Option<f64>,
    #[serde(default)]
    pub end_s: Option<f64>,
    /// The name of the window this folder is part of (`train steps 240–242 · cProfile`,
    /// `before the first step · cProfile`); an optional extra.
    #[serde(default)]
    pub label: String,
    /// Which part of it (`step 240: step start → forward pass end`); an optional extra.
    #[serde(default)]
    pub part: String,
}

/// The Python windows as a person names them, and what they hold together.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PythonSummary {
    /// Per window (folders of consecutive boundaries of one node and profiler), in time order.
    pub windows: Vec<PythonGroup>,
    /// The top functions over every step window (the windows before the first step and after
    /// close left out: they profile setup and teardown).
    pub top: PythonTop,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PythonGroup {
    /// `train steps 240–242 · cProfile`, `train step 206 · cProfile`, `before the first step ·
    /// cProfile`, `after close · cProfile`.
    pub label: String,
    pub node: String,
    pub profiler: PythonProfilerDir,
    /// `steps`, `before_first_step`, `after_close` or `other` (folders whose names do not say
    /// their edges).
    pub kind: PythonGroupKind,
    /// The mode of its steps (`train`, `eval`, …); `null` for the others.
    pub mode: Option<String>,
    pub first_step: Option<i64>,
    pub last_step: Option<i64>,
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    /// Folders in it.
    pub folders: u64,
    /// Its top functions, merged over its folders (by total time).
    pub functions: Vec<PyFunctionTotal>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PythonTop {
    /// Folders merged, and the wall time they cover (s).
    pub folders: u64,
    pub profiled_s: f64,
    /// Distinct functions past the merge's cap, left out (0 normally).
    pub functions_left_out: u64,
    pub functions: Vec<PyFunctionTotal>,
}

/// A function's figures summed over several folders.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PyFunctionTotal {
    pub name: String,
    pub file: String,
    pub line: Option<i64>,
    /// `null` when any folder was pyinstrument's (no call counts).
    pub calls: Option<u64>,
    pub self_s: f64,
    pub total_s: f64,
    /// Folders it appears in.
    pub folders: u64,
}

/// One native window (`framework/native/<node>/<window>/`).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct NativeWindow {
    pub node: String,
    /// Its folder name, `<first µs>-<last µs>_<pid>`.
    pub window: String,
    pub pid: Option<u64>,
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    /// The file read: `profile.pb.gz`, else `flamegraph.svg`.
    pub source: NativeFile,
    pub samples: u64,
    /// CPU time of the samples (the profile's `cpu` value); `null` from a flame graph.
    pub cpu_s: Option<f64>,
    /// Samples of stacks past the report's caps, not in the figures below.
    pub samples_left_out: u64,
    /// The top functions by self samples and by total samples.
    pub top_self: Vec<NativeFunction>,
    pub top_total: Vec<NativeFunction>,
    pub flame: Flame,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NativeFunction {
    pub name: String,
    pub self_samples: u64,
    pub total_samples: u64,
}

/// The frames the page draws: `[name index, depth, first sample, samples]`, the root (`all`)
/// first, then breadth first.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Flame {
    pub names: Vec<String>,
    pub frames: Vec<[u64; 4]>,
    /// Frames not drawn (narrower than 0.1 % of the samples, or past the frame cap).
    pub left_out: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PyFunction {
    pub name: String,
    pub file: String,
    pub line: Option<i64>,
    /// `null` for pyinstrument, which samples instead of counting calls.
    pub calls: Option<u64>,
    pub self_s: f64,
    pub total_s: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trigger {
    pub rank: String,
    pub step: i64,
    pub ms: f64,
    pub median_ms: f64,
    pub start_s: f64,
    /// The features the trigger opened (`detailed`, `dataloader`, `python`, `native`); an
    /// optional extra (`null` when the event did not name them).
    #[serde(default)]
    pub features: Option<Vec<String>>,
    /// The first step and the length of the windows it opened (the event's
    /// `window_start_step`, `window_num_steps`); optional extras, `null` when the event did
    /// not say. The page links the trigger to `#window-<feature>-<window_start_step>`
    /// (`docs/report.md`, "Anchors").
    #[serde(default)]
    pub window_start_step: Option<i64>,
    #[serde(default)]
    pub window_num_steps: Option<i64>,
}

/// A window `trainprof trigger` armed, as one rank's `trainprof:RequestedWindow` event says
/// (docs/formats.md, "On-demand windows (`trainprof trigger`)").
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestedWindow {
    /// The request's id: the ranks of one request share it.
    pub request_id: String,
    pub rank: String,
    /// When the window opened (its first step's begin) and when it was asked for (epoch s).
    pub start_s: f64,
    pub requested_s: Option<f64>,
    pub features: Vec<String>,
    pub window_start_step: Option<i64>,
    pub window_num_steps: Option<i64>,
}

/// A window that stopped at its cap, as one rank's `trainprof:WindowCapped` event says
/// (docs/formats.md, "Window caps").
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CappedWindow {
    pub rank: String,
    /// `detailed`, `dataloader`, `python` or `native`.
    pub feature: String,
    /// `events`, `bytes` or `samples`.
    pub cap: String,
    /// What the window had reached, and the cap.
    pub value: u64,
    pub limit: u64,
    /// The step it stopped at (the windows' numbering): from there on not profiled.
    pub step: i64,
    /// When it was stopped (epoch s).
    pub at_s: f64,
}

impl CappedWindow {
    /// "stopped at its cap: 2000000 events at step 12" (bytes in MiB).
    pub fn mark(&self) -> String {
        let what = if self.cap == "bytes" {
            format!("{:.0} MiB of trainer memory growth", self.value as f64 / 1_048_576.0)
        } else {
            format!("{} {}", self.value, self.cap)
        };
        format!("stopped at its cap: {what} at step {}", self.step)
    }
}

/// One rule's finding. Its evidence is the rule's own typed struct (`evidence.rs`); read
/// back from JSON by the rule it names.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(try_from = "FindingJson")]
pub struct Finding {
    pub rule: String,
    pub triggered: bool,
    pub evaluated: bool,
    pub summary: String,
    pub advice: String,
    pub evidence: Evidence,
    pub ranges: Vec<[f64; 2]>,
    /// Judged on less than the rule's patience of data (`docs/report.md`, "Short jobs");
    /// `null` for a full verdict, or when not evaluated.
    pub preliminary: Option<Preliminary>,
}

/// How much data a preliminary finding was judged on (`findings[].preliminary`).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Preliminary {
    /// The data there was (the most any node or GPU the rule judges had).
    pub datapoints: u64,
    /// What the rule waits for before a full verdict (its patience).
    pub patience: u64,
    /// `datapoints`, or `seconds` (Dataloader: seconds with dataloader events).
    pub unit: String,
}

impl Preliminary {
    /// `preliminary: 481 of 1000 datapoints`.
    pub fn label(&self) -> String {
        format!("preliminary: {} of {} {}", self.datapoints, self.patience, self.unit)
    }
}

/// A finding as JSON holds it, before its evidence is read as its rule's.
#[derive(Deserialize)]
struct FindingJson {
    rule: String,
    triggered: bool,
    evaluated: bool,
    summary: String,
    advice: String,
    evidence: serde_json::Value,
    ranges: Vec<[f64; 2]>,
    #[serde(default)]
    preliminary: Option<Preliminary>,
}

impl TryFrom<FindingJson> for Finding {
    type Error = evidence::EvidenceError;

    fn try_from(f: FindingJson) -> Result<Finding, evidence::EvidenceError> {
        Ok(Finding {
            evidence: Evidence::from_json(&f.rule, f.evidence)?,
            rule: f.rule,
            triggered: f.triggered,
            evaluated: f.evaluated,
            summary: f.summary,
            advice: f.advice,
            ranges: f.ranges,
            preliminary: f.preliminary,
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Series {
    /// mode → rank → points.
    pub steps: BTreeMap<String, BTreeMap<String, StepSeries>>,
    pub nodes: BTreeMap<String, NodeSeries>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct StepSeries {
    pub t_s: Vec<f64>,
    pub ms: Vec<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct NodeSeries {
    pub t_s: Vec<f64>,
    pub cpu_total: Vec<Option<f64>>,
    pub cpu_cores: Vec<Vec<Option<f64>>>,
    pub memory: Vec<Option<f64>>,
    pub gpus: BTreeMap<String, GpuSeries>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoSeries>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<NetSeries>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer: Option<TrainerSeries>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct GpuSeries {
    pub util: Vec<Option<f64>>,
    pub mem: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct IoSeries {
    pub read_mbps: Vec<Option<f64>>,
    pub write_mbps: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct NetSeries {
    pub rx_mbps: Vec<Option<f64>>,
    pub tx_mbps: Vec<Option<f64>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct TrainerSeries {
    pub cpu: Vec<Option<f64>>,
    pub mem_mb: Vec<Option<f64>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_bound_is_given_only_for_a_synchronised_clock() {
        let c = Clock::new("algo-1", 3, 0, Some(900.0), Some(20.0));
        assert_eq!(
            (c.state, c.synchronised, c.max_error_us),
            (Some(ClockState::Synchronised), true, Some(900.0))
        );
        // A host without a time daemon: the kernel's 16 s ceiling is no measurement.
        let c = Clock::new("algo-1", 3, 3, Some(16_000_000.0), Some(16_000_000.0));
        assert_eq!(
            c,
            Clock {
                node: "algo-1".into(),
                state: Some(ClockState::Unsynchronised),
                synchronised: false,
                readings: 3,
                unsynchronised_readings: 3,
                max_error_us: None,
                est_error_us: None,
            }
        );
        let c = Clock::new("algo-1", 0, 0, Some(16_000_000.0), None);
        assert_eq!((c.state, c.synchronised, c.max_error_us), (Some(ClockState::Unknown), false, None));
    }
}
