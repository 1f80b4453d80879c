//! `MemoryProfilingConfig`: PyTorch's caching-allocator history, dumped as a memory snapshot
//! at a window's end and at a rank's first out-of-memory error (a trainprof extension of
//! `ProfilingParameters`, docs/formats.md "Memory windows"; the files: docs/formats.md,
//! "Memory snapshots").
//!
//! The window keys are the other sub-configs' (`StartStep`/`NumSteps` or
//! `StartTimeInSecSinceEpoch`/`Duration`), read by the same code; `MaxEntries`, `Stacks` and
//! `OomSnapshot` are its own. A config with only `OomSnapshot` has no window (no warning).

use serde_json::Value;

use crate::convert::py_int;
use crate::feature::{Feature, Off};

/// `MaxEntries` when not given: the history entries torch keeps (a ring). 100,000 entries
/// hold a few steps of a large model's allocations; each costs a few hundred bytes of host
/// memory with Python stacks, and the dump's time grows with the count.
pub const DEFAULT_MAX_ENTRIES: u64 = 100_000;
/// Accepted `MaxEntries`: at least one entry, at most ten million (gigabytes of host memory
/// and minutes of dumping beyond that).
pub const MAX_ENTRIES_RANGE: std::ops::RangeInclusive<u64> = 1..=10_000_000;

/// Which stacks torch records with each allocation (`_record_memory_history(stacks=...)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stacks {
    /// Python frames only (the default: a dump takes seconds).
    Python,
    /// Python, TorchScript and C++ frames (a dump can take minutes: symbolizing C++ frames).
    All,
}

impl Stacks {
    /// The word torch takes (`"python"`, `"all"`), which is also the config's.
    pub fn as_str(self) -> &'static str {
        match self {
            Stacks::Python => "python",
            Stacks::All => "all",
        }
    }
}

/// Memory windows: a window plus the history's bound, its stacks, and the OOM snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryFeature {
    /// The window (enabled with a window that never opens when only `OomSnapshot` is given).
    pub feature: Feature,
    /// `MaxEntries`: the history's bound.
    pub max_entries: u64,
    /// `Stacks`.
    pub stacks: Stacks,
    /// `OomSnapshot`: history stays on (bounded) from the first step, and a rank's first
    /// out-of-memory error dumps a snapshot.
    pub oom_snapshot: bool,
}

impl MemoryFeature {
    pub(crate) fn not_configured() -> MemoryFeature {
        MemoryFeature {
            feature: Feature::not_configured(),
            max_entries: DEFAULT_MAX_ENTRIES,
            stacks: Stacks::Python,
            oom_snapshot: false,
        }
    }

    pub(crate) fn invalid() -> MemoryFeature {
        MemoryFeature { feature: Feature::off(Off::Invalid), ..MemoryFeature::not_configured() }
    }

    /// The OOM snapshot is on (the feature enabled and `OomSnapshot` true).
    pub fn oom_on(&self) -> bool {
        self.feature.is_enabled() && self.oom_snapshot
    }
}

/// The window keys of every sub-config.
pub(crate) const WINDOW_KEYS: &[&str] =
    &["StartStep", "NumSteps", "StartTimeInSecSinceEpoch", "DurationInSeconds", "Duration"];

/// The keys a `MemoryProfilingConfig` may hold.
pub(crate) const KEYS: &[&str] = &[
    "StartStep",
    "NumSteps",
    "StartTimeInSecSinceEpoch",
    "DurationInSeconds",
    "Duration",
    "MaxEntries",
    "Stacks",
    "OomSnapshot",
];

/// Why one of its own keys is not usable (the feature is then off).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum MemoryError {
    #[error(transparent)]
    Number(#[from] crate::convert::NumberError),
    #[error("{0} is outside {lo}..={hi} entries", lo = MAX_ENTRIES_RANGE.start(), hi = MAX_ENTRIES_RANGE.end())]
    OutOfRange(Value),
    #[error("{0} is not \"python\" or \"all\"")]
    NotStacks(Value),
    #[error("is {0}, expected true or false")]
    NotABool(Value),
}

/// `MaxEntries` (an integer, or a string holding one, as the SDK writes numbers).
pub(crate) fn max_entries(v: &Value) -> Result<u64, MemoryError> {
    let n = py_int(v)?;
    u64::try_from(n)
        .ok()
        .filter(|n| MAX_ENTRIES_RANGE.contains(n))
        .ok_or_else(|| MemoryError::OutOfRange(v.clone()))
}

/// `Stacks`: `"python"` or `"all"`, in any case.
pub(crate) fn stacks(v: &Value) -> Result<Stacks, MemoryError> {
    match v.as_str().map(str::trim) {
        Some(s) if s.eq_ignore_ascii_case("python") => Ok(Stacks::Python),
        Some(s) if s.eq_ignore_ascii_case("all") => Ok(Stacks::All),
        _ => Err(MemoryError::NotStacks(v.clone())),
    }
}

/// `OomSnapshot`: a JSON bool, or `"true"` / `"false"` in any case (the SDK writes strings).
pub(crate) fn boolean(v: &Value) -> Result<bool, MemoryError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s.trim().eq_ignore_ascii_case("true") => Ok(true),
        Value::String(s) if s.trim().eq_ignore_ascii_case("false") => Ok(false),
        other => Err(MemoryError::NotABool(other.clone())),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{Sources, Step, from_bytes};

    fn config(memory: &str) -> crate::Config {
        let doc = json!({"ProfilingParameters": {"LocalPath": "/tmp/x", "MemoryProfilingConfig": memory}});
        from_bytes(doc.to_string().as_bytes(), &Sources::default())
    }

    #[test]
    fn window_defaults_and_own_keys() {
        let mut c = config(r#"{"StartStep": 5, "NumSteps": 2}"#);
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert_eq!(
            (c.memory.max_entries, c.memory.stacks, c.memory.oom_snapshot),
            (100_000, Stacks::Python, false)
        );
        let active: Vec<u64> = (0..10).filter(|&s| c.memory.feature.is_active(Step::At(s), 0.0)).collect();
        assert_eq!(active, [5, 6]);
        let c = config(r#"{"StartStep": 1, "MaxEntries": "5000", "Stacks": "ALL", "OomSnapshot": "true"}"#);
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert_eq!((c.memory.max_entries, c.memory.stacks, c.memory.oom_on()), (5000, Stacks::All, true));
    }

    #[test]
    fn oom_only_has_no_window_and_no_warning() {
        let mut c = config(r#"{"OomSnapshot": true, "MaxEntries": 10}"#);
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert!(c.memory.oom_on());
        assert!(!(0..10).any(|s| c.memory.feature.is_active(Step::At(s), 0.0)));
    }

    #[test]
    fn every_bad_value_is_one_line_and_the_feature_is_off() {
        let c = config(r#"{"StartStep": 5, "MaxEntries": 0, "Stacks": "cpp", "OomSnapshot": 1}"#);
        assert!(!c.memory.feature.is_enabled());
        assert!(!c.memory.oom_on());
        let lines: Vec<String> = c.problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "ProfilingParameters.MemoryProfilingConfig.MaxEntries: 0 is outside 1..=10000000 entries; this feature is off",
                "ProfilingParameters.MemoryProfilingConfig.Stacks: \"cpp\" is not \"python\" or \"all\"; this feature is off",
                "ProfilingParameters.MemoryProfilingConfig.OomSnapshot: is 1, expected true or false; this feature is off",
            ]
        );
        let c = config(r#"{"StartStep": 5, "StartTimeInSecSinceEpoch": 10}"#);
        assert!(!c.memory.feature.is_enabled());
        assert!(c.problems[0].message.contains("both a step range"), "{:?}", c.problems);
        let c = config(r#"{"StartStep": 5, "MaxEntrys": 3}"#);
        assert!(c.memory.feature.is_enabled());
        assert!(c.problems[0].message.contains("did you mean 'MaxEntries'"), "{:?}", c.problems);
    }

    #[test]
    fn absent_and_disabled() {
        let c = from_bytes(br#"{"ProfilingParameters": {"LocalPath": "/tmp/x"}}"#, &Sources::default());
        assert_eq!(c.memory.feature.off_reason(), Some(Off::NotConfigured));
        let doc = json!({"DisableProfiler": true, "ProfilingParameters": {"MemoryProfilingConfig": "{\"OomSnapshot\": true}"}});
        let c = from_bytes(doc.to_string().as_bytes(), &Sources::default());
        assert_eq!(c.memory.feature.off_reason(), Some(Off::ProfilerDisabled));
        assert!(!c.memory.oom_on());
    }
}
