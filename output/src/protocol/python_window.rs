//! The Python profiler's window folders (`docs/formats.md`, "Directory pattern"):
//! `framework/<framework>/<profiler>/<node>/<start half>_<end half>/<stats file>`, each half
//! `<mode>-<step>-<phase>-<time µs>`. The hook names the folders (`hook-ffi/src/python.rs`),
//! the Python package writes the stats files in them, and the report reads them.

use serde::{Deserialize, Serialize};

words! {
    /// The profilers' folders.
    PROFILERS;
    CPROFILE_DIR = "cprofile",
    PYINSTRUMENT_DIR = "pyinstrument",
}

words! {
    /// The stats file of each profiler's window (cProfile's `pstats` dump, pyinstrument's JSON).
    STATS_FILES;
    CPROFILE_STATS_FILE = "python_stats",
    PYINSTRUMENT_STATS_FILE = "python_stats.json",
}

words! {
    /// The modes of the windows around the steps (the others are the trainer's: `train`, …).
    MODES;
    /// From start-up to the first boundary, and from close to exit.
    MODE_PRE_STEP_ZERO = "prestepzero",
    /// The window that ends at close.
    MODE_POST_HOOK_CLOSE = "posthookclose",
}

words! {
    /// The boundaries a window starts or ends at.
    PHASES;
    PHASE_START = "start",
    PHASE_STEP_START = "stepstart",
    PHASE_FORWARD_PASS_END = "forwardpassend",
    PHASE_STEP_END = "stepend",
    PHASE_END = "end",
}

/// A profiler's folder, serialised as its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PythonProfilerDir {
    #[default]
    #[serde(rename = "cprofile")]
    CProfile,
    Pyinstrument,
}

impl PythonProfilerDir {
    pub const ALL: [PythonProfilerDir; 2] = [PythonProfilerDir::CProfile, PythonProfilerDir::Pyinstrument];

    pub fn as_str(self) -> &'static str {
        match self {
            PythonProfilerDir::CProfile => CPROFILE_DIR,
            PythonProfilerDir::Pyinstrument => PYINSTRUMENT_DIR,
        }
    }

    /// The profiler whose folder is `name`.
    pub fn parse(name: &str) -> Option<PythonProfilerDir> {
        PythonProfilerDir::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// The stats file of its windows.
    pub fn stats_file(self) -> &'static str {
        match self {
            PythonProfilerDir::CProfile => CPROFILE_STATS_FILE,
            PythonProfilerDir::Pyinstrument => PYINSTRUMENT_STATS_FILE,
        }
    }

    /// The profiler as it spells itself: `cProfile`, `pyinstrument`.
    pub fn tool_name(self) -> &'static str {
        match self {
            PythonProfilerDir::CProfile => "cProfile",
            PythonProfilerDir::Pyinstrument => "pyinstrument",
        }
    }
}

/// The mode of a window's half: one of [`MODES`], or the trainer's mode as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EdgeMode {
    PreStepZero,
    PostHookClose,
    Trainer(String),
}

impl EdgeMode {
    pub fn parse(s: &str) -> EdgeMode {
        match s {
            MODE_PRE_STEP_ZERO => EdgeMode::PreStepZero,
            MODE_POST_HOOK_CLOSE => EdgeMode::PostHookClose,
            other => EdgeMode::Trainer(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            EdgeMode::PreStepZero => MODE_PRE_STEP_ZERO,
            EdgeMode::PostHookClose => MODE_POST_HOOK_CLOSE,
            EdgeMode::Trainer(m) => m,
        }
    }
}

/// The phase of a window's half: one of [`PHASES`], or a word a later hook may write, kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EdgePhase {
    Start,
    StepStart,
    ForwardPassEnd,
    StepEnd,
    End,
    Other(String),
}

impl EdgePhase {
    pub fn parse(s: &str) -> EdgePhase {
        match s {
            PHASE_START => EdgePhase::Start,
            PHASE_STEP_START => EdgePhase::StepStart,
            PHASE_FORWARD_PASS_END => EdgePhase::ForwardPassEnd,
            PHASE_STEP_END => EdgePhase::StepEnd,
            PHASE_END => EdgePhase::End,
            other => EdgePhase::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            EdgePhase::Start => PHASE_START,
            EdgePhase::StepStart => PHASE_STEP_START,
            EdgePhase::ForwardPassEnd => PHASE_FORWARD_PASS_END,
            EdgePhase::StepEnd => PHASE_STEP_END,
            EdgePhase::End => PHASE_END,
            EdgePhase::Other(p) => p,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        for p in PythonProfilerDir::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), serde_json::Value::from(p.as_str()));
            assert_eq!(PythonProfilerDir::parse(p.as_str()), Some(p));
        }
        assert_eq!(PythonProfilerDir::ALL.map(PythonProfilerDir::as_str), PROFILERS);
        assert_eq!(PythonProfilerDir::ALL.map(PythonProfilerDir::stats_file), STATS_FILES);
        assert_eq!(PythonProfilerDir::parse("cProfile"), None);
        for m in MODES.iter().chain(&["train", "eval"]) {
            assert_eq!(EdgeMode::parse(m).as_str(), *m);
        }
        assert_eq!(EdgeMode::parse("train"), EdgeMode::Trainer("train".into()));
        for p in PHASES.iter().chain(&["later"]) {
            assert_eq!(EdgePhase::parse(p).as_str(), *p);
        }
        assert_eq!(EdgePhase::parse("later"), EdgePhase::Other("later".into()));
        assert_eq!(EdgePhase::parse("stepend"), EdgePhase::StepEnd);
    }
}
