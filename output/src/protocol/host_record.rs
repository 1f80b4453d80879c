//! The agent's record of the host around a stall (`docs/on-disk.md`, "Host state at a
//! stall"), `system/hangs/<node>/<name>.json`: written by the agent
//! (`agent/src/pipeline/hangs.rs`) and read back by the report (`report/src/reading/dumps.rs`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The folder of the records, relative to LocalPath.
pub const HOST_DIR: &str = "system/hangs";

/// [`HostState::trigger`]: a new `stall.json`, or the timelines stopped while the trainer ran.
pub const TRIGGER_DUMP: &str = "dump";
pub const TRIGGER_TIMELINE_STOPPED: &str = "timeline_stopped";

/// The agent's record of the host at a stall (`docs/on-disk.md`, "Host state at a stall"): the
/// agent writes it, the report reads it back, so this is both the writer's and the reader's
/// shape. Every key may be missing.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct HostState {
    pub version: u32,
    /// The dump folder's node, or the host's node for `timeline_stopped`.
    pub node: String,
    /// `dump` (a new `stall.json`) or `timeline_stopped`.
    pub trigger: String,
    /// `<node>/<step>-<µs>` of the dump, for `dump`.
    pub folder: Option<String>,
    /// When the agent saw it, epoch µs.
    pub detected_us: i64,
    /// The samples around it, oldest first.
    pub samples: Vec<HostSample>,
    /// The trainer tree's threads at the stall: how many in each state.
    pub trainer_threads: BTreeMap<String, u64>,
    /// The busiest threads (CPU % of one core since the previous sample).
    pub busy_threads: Vec<ThreadCpu>,
    /// `busy` (a thread is running: busy-looping or computing), `asleep` (every thread
    /// sleeps: waiting) or `unknown`.
    pub trainer_cpu_state: String,
}

/// One sample of the host (the agent's tick, every metric it has of these).
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct HostSample {
    pub t_s: f64,
    /// `gpuN` → (utilisation %, memory %).
    pub gpus: BTreeMap<String, (Option<f64>, Option<f64>)>,
    /// `<device>:<Dimension>` → value: the GPU's figures of the trainer tree's processes and
    /// of the others (`TrainerMemUsedBytes`, `TopProcess1Pid`, …).
    pub gpu_processes: BTreeMap<String, f64>,
    /// `<device>:<Dimension>` → value: Xid and ECC event counters.
    pub gpu_errors: BTreeMap<String, f64>,
    /// Pressure stall shares (`cpu_some`, `memory_full`, `io_some`, …), %.
    pub pressure: BTreeMap<String, f64>,
    pub trainer_cpu: Option<f64>,
    pub cpu_total: Option<f64>,
}

/// One thread of the trainer tree.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct ThreadCpu {
    pub pid: i64,
    pub tid: i64,
    pub name: String,
    /// `/proc/…/stat` state letter.
    pub state: String,
    pub cpu_pct: Option<f64>,
}
