//! Hangs and crashes as the report holds them (`docs/report.md`, "Hangs and crashes"): the
//! incidents, each rank's state, the dumps (`reading/dumps.rs` reads them) and the agent's
//! records of the host (their format is the protocol's, `trainprof_output::protocol::host_record`).

use serde::{Deserialize, Serialize};

pub use super::kinds::{BegunFrom, DumpKind, IncidentKind, IncidentReason};
pub use trainprof_output::protocol::host_record::{HostSample, HostState, ThreadCpu};

/// Everything the report says about hangs and crashes; empty when there were none.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Hangs {
    /// Earliest first.
    pub incidents: Vec<Incident>,
    /// Dump folders past [`MAX_FOLDERS`], not read.
    pub folders_left_out: u64,
}

impl Hangs {
    pub fn is_empty(&self) -> bool {
        self.incidents.is_empty()
    }
}

/// One stall (the stall and signal dumps of the ranks, grouped by time) or one crash (one
/// fatal or exception dump).
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Incident {
    /// `stall`, `signal` (only signal dumps: the job was stopped), `fatal`, `exception`,
    /// `incomplete` (a dump whose `stall.json` could not be read: the evidence says why), or
    /// `timeline_stopped` (no dump: the agent saw the timelines stop while the trainer ran).
    pub kind: IncidentKind,
    /// The first dump's detection, epoch seconds.
    pub detected_s: f64,
    /// The step that did not end (the highest of the dumps').
    pub step: Option<i64>,
    pub mode: Option<String>,
    /// When every stall of it ended (`ended.json`): the last end, and the longest stall.
    pub ended_s: Option<f64>,
    pub stalled_s: Option<f64>,
    /// Every rank: its last steps and what it was doing.
    pub ranks: Vec<RankState>,
    /// Ranks left out of `ranks` past [`MAX_RANK_ROWS`] (0 normally).
    pub ranks_left_out: u64,
    /// The likely culprit(s): rank names.
    pub culprits: Vec<String>,
    /// `lowest_step`, `outside_collective`, `crashed` or `null` (no rank stands out).
    pub reason: Option<IncidentReason>,
    /// Sentences saying why.
    pub evidence: Vec<String>,
    /// The blocking call the others share (`outside_collective`).
    pub waiting_in: Option<String>,
    pub dumps: Vec<Dump>,
    /// The agent's records of the host around it.
    pub host: Vec<HostState>,
}

/// One rank at an incident.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct RankState {
    pub rank: String,
    /// The last step that ended before the incident (timeline or the dump's ring).
    pub last_completed_step: Option<i64>,
    /// When it ended, epoch seconds.
    pub last_step_end_s: Option<f64>,
    /// The dump's open step, else `last_completed_step`.
    pub last_begun_step: Option<i64>,
    /// `dump`, `timeline` or `none`.
    pub begun_from: BegunFrom,
    pub dumped: bool,
    /// The top frame of each of its threads (Python, else native), as in `dumps`.
    pub top_frames: Vec<String>,
    pub culprit: bool,
}

/// One dump folder.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Dump {
    pub node: String,
    /// `framework/hangs/<node>/<folder>`.
    pub folder: String,
    /// The hook's kind, or `incomplete`.
    pub kind: IncidentKind,
    /// Whether `stall.json` was there (a fatal crash may leave only its stacks).
    pub complete: bool,
    pub pid: Option<i64>,
    pub mode: Option<String>,
    pub step: Option<i64>,
    pub step_started_s: Option<f64>,
    pub detected_s: f64,
    pub threshold_s: Option<f64>,
    pub median_step_s: Option<f64>,
    pub last_completed_step: Option<i64>,
    pub signal: Option<String>,
    pub open_windows: Vec<String>,
    pub ring: Vec<RingEvent>,
    /// The hook's own state: `key: value` (JSON) lines.
    pub hook: Vec<String>,
    pub ended_s: Option<f64>,
    pub stalled_s: Option<f64>,
    /// Lines before the first thread of `python_stacks.txt` (`Fatal Python error: …`).
    pub python_notes: Vec<String>,
    pub python: Vec<Thread>,
    pub native: Vec<Thread>,
    /// The last [`MAX_TRACEBACK_LINES`] lines of `traceback.txt`.
    pub traceback: Vec<String>,
    /// What could not be read in it, and what was cut.
    pub problems: Vec<String>,
}

/// One thread of a stacks file.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Thread {
    /// `0x7f…` (Python) or the tid (native).
    pub id: String,
    pub name: Option<String>,
    /// faulthandler's `Current thread` (the one that wrote the dump).
    pub current: bool,
    /// Top (most recent) first: `file:line in function` or `symbol` (`0xip` when unknown).
    pub frames: Vec<String>,
    pub frames_left_out: u64,
}

/// One event of a dump's ring.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct RingEvent {
    pub t_s: f64,
    pub what: String,
    pub name: String,
    pub step: Option<i64>,
}
