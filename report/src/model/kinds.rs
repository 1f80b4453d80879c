//! The closed sets of words the model holds (`docs/report.md` names each): enums that
//! several layers share, serialised as the words themselves.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
pub use trainprof_output::protocol::dump::DumpKind;

/// An incident's kind, and a dump's (`docs/report.md`, "Hangs and crashes"): the hook's
/// dump kind (`stall.json`'s `kind`), `incomplete` (a dump whose `stall.json` could not be
/// read), or `timeline_stopped` (an incident with no dump: the agent saw the timelines stop
/// while the trainer ran).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncidentKind {
    Hook(DumpKind),
    #[default]
    Incomplete,
    TimelineStopped,
}

impl IncidentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentKind::Hook(k) => k.as_str(),
            IncidentKind::Incomplete => "incomplete",
            IncidentKind::TimelineStopped => "timeline_stopped",
        }
    }

    pub fn parse(s: &str) -> Option<IncidentKind> {
        match s {
            "incomplete" => Some(IncidentKind::Incomplete),
            "timeline_stopped" => Some(IncidentKind::TimelineStopped),
            _ => DumpKind::parse(s).map(IncidentKind::Hook),
        }
    }

    /// A stall or a signal dump: the ones grouped by time into one incident.
    pub fn is_stall(self) -> bool {
        match self {
            IncidentKind::Hook(DumpKind::Stall | DumpKind::Signal) => true,
            IncidentKind::Hook(DumpKind::Fatal | DumpKind::Exception | DumpKind::Requested)
            | IncidentKind::Incomplete
            | IncidentKind::TimelineStopped => false,
        }
    }

    /// A crash: a fatal error or an uncaught exception.
    pub fn is_crash(self) -> bool {
        match self {
            IncidentKind::Hook(DumpKind::Fatal | DumpKind::Exception) => true,
            IncidentKind::Hook(DumpKind::Stall | DumpKind::Signal | DumpKind::Requested)
            | IncidentKind::Incomplete
            | IncidentKind::TimelineStopped => false,
        }
    }
}

impl fmt::Display for IncidentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for IncidentKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for IncidentKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<IncidentKind, D::Error> {
        let s = String::deserialize(d)?;
        IncidentKind::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown incident kind {s:?}")))
    }
}

/// A node's clock (`job.clock[].state`): `synchronised` (every reading), `unsynchronised` (at
/// least one reading) or `unknown` (no `Synchronised` row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockState {
    Synchronised,
    Unsynchronised,
    Unknown,
}

/// How a job's collectives were matched across ranks (`collectives.matched_by`,
/// `docs/report.md`, "Collectives across ranks"): by the process group and sequence number
/// torch recorded (`seq`), or by call order per process group and step (`order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchedBy {
    Seq,
    Order,
}

/// A node's clock as the collectives align it (`collectives.clocks[].state`): the
/// `reference` the others are aligned to, `aligned` (an offset estimated and applied) or
/// `unaligned` (no estimate the data supports; its times are used as recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlignState {
    Reference,
    Aligned,
    Unaligned,
}

/// What a group of Python windows profiled (`python_summary.windows[].kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PythonGroupKind {
    /// Steps of one mode.
    Steps,
    BeforeFirstStep,
    AfterClose,
    /// Folders whose names do not say their edges.
    #[default]
    Other,
}

/// How the page draws the steps of many ranks (`fleet.page.step_chart`): one line per rank,
/// or the distribution across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepChartKind {
    #[default]
    Ranks,
    Distribution,
}

/// Why an incident names its culprits (`incidents[].reason`, `docs/report.md`, "Hangs and
/// crashes"): a rank behind the others, a rank outside the call the others wait in, or the
/// rank that crashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IncidentReason {
    LowestStep,
    OutsideCollective,
    Crashed,
}

/// Where a rank's last begun step comes from (`incidents[].ranks[].begun_from`): its dump,
/// its timeline, or nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BegunFrom {
    Dump,
    Timeline,
    #[default]
    #[serde(rename = "none")]
    Nowhere,
}

impl BegunFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            BegunFrom::Dump => "dump",
            BegunFrom::Timeline => "timeline",
            BegunFrom::Nowhere => "none",
        }
    }
}

/// A likely cause of a straggler, seen on its node (`fleet.stragglers[].causes[].cause`,
/// `docs/report.md`, "Many ranks").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseKind {
    #[default]
    ThermalThrottling,
    PowerThrottling,
    HwSlowdown,
    Xid,
    CpuPressure,
    MemoryPressure,
    IoPressure,
    LowPcie,
}

impl CauseKind {
    pub const ALL: [CauseKind; 8] = [
        CauseKind::ThermalThrottling,
        CauseKind::PowerThrottling,
        CauseKind::HwSlowdown,
        CauseKind::Xid,
        CauseKind::CpuPressure,
        CauseKind::MemoryPressure,
        CauseKind::IoPressure,
        CauseKind::LowPcie,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CauseKind::ThermalThrottling => "thermal_throttling",
            CauseKind::PowerThrottling => "power_throttling",
            CauseKind::HwSlowdown => "hw_slowdown",
            CauseKind::Xid => "xid",
            CauseKind::CpuPressure => "cpu_pressure",
            CauseKind::MemoryPressure => "memory_pressure",
            CauseKind::IoPressure => "io_pressure",
            CauseKind::LowPcie => "low_pcie",
        }
    }
}

/// Why the GPU was idle in a detailed window (`docs/report.md`, "Idle categories"), in the
/// order the categories win where they overlap; `detailed.*.idle[].name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleCategory {
    Input,
    Sync,
    Queued,
    Launching,
    Other,
}

impl IdleCategory {
    pub const ALL: [IdleCategory; 5] = [
        IdleCategory::Input,
        IdleCategory::Sync,
        IdleCategory::Queued,
        IdleCategory::Launching,
        IdleCategory::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            IdleCategory::Input => "input",
            IdleCategory::Sync => "sync",
            IdleCategory::Queued => "queued",
            IdleCategory::Launching => "launching",
            IdleCategory::Other => "other",
        }
    }

    /// What the category is called in a sentence.
    pub fn words(self) -> &'static str {
        match self {
            IdleCategory::Input => "waiting for input (DataLoader)",
            IdleCategory::Sync => "the host synchronising or copying",
            IdleCategory::Queued => "kernels launched but not yet started",
            IdleCategory::Launching => "the host still launching (CPU ops running, no kernel queued)",
            IdleCategory::Other => {
                "no op recorded (Python or data loading outside any op, the profiler starting)"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incident_kinds_are_their_words() {
        let all = DumpKind::ALL
            .map(IncidentKind::Hook)
            .into_iter()
            .chain([IncidentKind::Incomplete, IncidentKind::TimelineStopped]);
        for k in all {
            let v = serde_json::to_value(k).unwrap();
            assert_eq!(v, serde_json::Value::from(k.as_str()));
            assert_eq!(serde_json::from_value::<IncidentKind>(v).unwrap(), k);
        }
        assert_eq!(IncidentKind::Hook(DumpKind::Stall).as_str(), "stall");
        assert_eq!(IncidentKind::TimelineStopped.as_str(), "timeline_stopped");
        assert!(IncidentKind::parse("dump").is_none());
    }

    #[test]
    fn the_other_sets_are_their_words() {
        let word = |v: serde_json::Value| v.as_str().unwrap().to_owned();
        let clocks = [ClockState::Synchronised, ClockState::Unsynchronised, ClockState::Unknown];
        let clocks: Vec<String> = clocks.iter().map(|c| word(serde_json::to_value(c).unwrap())).collect();
        assert_eq!(clocks, ["synchronised", "unsynchronised", "unknown"]);
        let groups = [
            PythonGroupKind::Steps,
            PythonGroupKind::BeforeFirstStep,
            PythonGroupKind::AfterClose,
            PythonGroupKind::Other,
        ];
        let groups: Vec<String> = groups.iter().map(|g| word(serde_json::to_value(g).unwrap())).collect();
        assert_eq!(groups, ["steps", "before_first_step", "after_close", "other"]);
        let charts = [StepChartKind::Ranks, StepChartKind::Distribution];
        let charts: Vec<String> = charts.iter().map(|c| word(serde_json::to_value(c).unwrap())).collect();
        assert_eq!(charts, ["ranks", "distribution"]);
    }

    #[test]
    fn the_later_sets_are_their_words() {
        let word = |v: serde_json::Value| v.as_str().unwrap().to_owned();
        let reasons =
            [IncidentReason::LowestStep, IncidentReason::OutsideCollective, IncidentReason::Crashed];
        let reasons: Vec<String> = reasons.iter().map(|r| word(serde_json::to_value(r).unwrap())).collect();
        assert_eq!(reasons, ["lowest_step", "outside_collective", "crashed"]);
        for b in [BegunFrom::Dump, BegunFrom::Timeline, BegunFrom::Nowhere] {
            assert_eq!(word(serde_json::to_value(b).unwrap()), b.as_str());
        }
        assert_eq!(BegunFrom::default().as_str(), "none");
        for c in CauseKind::ALL {
            assert_eq!(word(serde_json::to_value(c).unwrap()), c.as_str());
        }
        let idle: Vec<&str> = IdleCategory::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(idle, ["input", "sync", "queued", "launching", "other"]);
    }
}
