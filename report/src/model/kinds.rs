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
}
