//! The hook's hang and crash dumps (`docs/formats.md`, "Hang and crash dumps"): the folder
//! `framework/hangs/<node>/<step>-<µs>/`, its files, the keys of `stall.json` and
//! `ended.json`, the dump kinds, and the check that a `stall.json` is the hook's record. The
//! hook writes them (`hook-ffi/src/hang/record.rs`); the report and the agent read them.

use serde_json::Value;

use crate::protocol::timeline_event::plausible_us;

/// The folder of the dumps, relative to LocalPath; a node's dumps are in `<HANGS_DIR>/<node>/`.
pub const HANGS_DIR: &str = "framework/hangs";

/// Largest `stall.json`, `ended.json` (and agent host record) read.
pub const MAX_JSON_BYTES: u64 = 1 << 20;

words! {
    /// The files of a dump folder.
    FILES;
    STALL_FILE = "stall.json",
    PYTHON_STACKS_FILE = "python_stacks.txt",
    NATIVE_STACKS_FILE = "native_stacks.txt",
    TRACEBACK_FILE = "traceback.txt",
    ENDED_FILE = "ended.json",
}

words! {
    /// The keys of `stall.json` (and of its ring's events) and of `ended.json`.
    KEYS;
    VERSION = "version",
    KIND = "kind",
    NODE = "node",
    PID = "pid",
    MODE = "mode",
    STEP = "step",
    STEP_STARTED_US = "step_started_us",
    DETECTED_US = "detected_us",
    THRESHOLD_S = "threshold_s",
    MEDIAN_STEP_S = "median_step_s",
    LAST_COMPLETED_STEP = "last_completed_step",
    SIGNAL = "signal",
    RING = "ring",
    OPEN_WINDOWS = "open_windows",
    HOOK = "hook",
    /// A ring event's keys (with [`NAME`], [`STEP`] and, for a window, [`PHASE`]).
    RING_T_US = "t_us",
    RING_WHAT = "what",
    NAME = "name",
    PHASE = "phase",
    /// `ended.json`'s.
    ENDED_US = "ended_us",
    STALLED_S = "stalled_s",
}

words! {
    /// The keys of `stall.json`'s `hook` object: the hook's counters (`hook-ffi/src/stats.rs`)
    /// when the dump was written. The crash dump writes only [`HOOK_ENABLED`], [`HOOK_DUMPS`]
    /// and [`HOOK_CRASH`].
    HOOK_KEYS;
    HOOK_ENABLED = "enabled",
    HOOK_EVENTS_WRITTEN = "events_written",
    HOOK_FILES_SEALED = "files_sealed",
    HOOK_DROPPED_QUEUE_FULL = "dropped_queue_full",
    HOOK_DROPPED_WRITER = "dropped_writer",
    HOOK_DROPPED_NAMES = "dropped_names",
    HOOK_OPEN_FAILURES = "open_failures",
    HOOK_DUMPS = "dumps",
    HOOK_CRASH = "crash",
}

words! {
    /// What a ring event records (its [`RING_WHAT`]).
    RING_WHATS;
    RING_STEP_START = "step_start",
    RING_STEP_END = "step_end",
    RING_EVENT = "event",
}

/// The `version` of the record the hook writes.
pub const RECORD_VERSION: u64 = 1;

/// The kind of a dump (`stall.json`'s `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpKind {
    Stall,
    Signal,
    Fatal,
    Exception,
    /// Asked for by `trainprof trigger --stacks` (`docs/formats.md`, "On-demand windows
    /// (`trainprof trigger`)"): the job goes on.
    Requested,
}

impl DumpKind {
    pub const ALL: [DumpKind; 5] =
        [DumpKind::Stall, DumpKind::Signal, DumpKind::Fatal, DumpKind::Exception, DumpKind::Requested];

    pub fn as_str(self) -> &'static str {
        match self {
            DumpKind::Stall => "stall",
            DumpKind::Signal => "signal",
            DumpKind::Fatal => "fatal",
            DumpKind::Exception => "exception",
            DumpKind::Requested => "requested",
        }
    }

    /// The kind `s` names, if the hook writes it.
    pub fn parse(s: &str) -> Option<DumpKind> {
        DumpKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// `framework/hangs/<node>`, relative to LocalPath.
pub fn node_dir(node: &str) -> String {
    format!("{HANGS_DIR}/{node}")
}

/// `<step>-<detected µs>`: a dump folder's name (a step before the first is 0).
pub fn dump_name(step: i64, detected_us: i64) -> String {
    format!("{}-{detected_us}", step.max(0))
}

/// `<step>-<µs>` → (step, µs): a dump folder's name, its step whole and not negative, its
/// time plausible.
pub fn parse_folder(name: &str) -> Option<(i64, i64)> {
    let (a, b) = name.split_once('-')?;
    let step: i64 = a.parse().ok()?;
    let us: i64 = b.parse().ok()?;
    (step >= 0 && plausible_us(us)).then_some((step, us))
}

/// Why a `stall.json` is not read (the kind of problem and where, never its content); its
/// text is the dump's problem in the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StallError {
    /// Not JSON (a `NaN`, text cut short) or nested deeper than `serde_json`'s 128 levels.
    Json { what: JsonProblem, line: usize, column: usize },
    /// JSON, but not an object.
    NotObject,
    /// An object, but not the hook's record ([`hook_record`]).
    NotHookRecord,
}

/// What kind of JSON problem a [`StallError::Json`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonProblem {
    EndsEarly,
    TooDeep,
    NotJson,
}

impl JsonProblem {
    fn as_str(self) -> &'static str {
        match self {
            JsonProblem::EndsEarly => "the JSON ends early",
            JsonProblem::TooDeep => "nested too deep",
            JsonProblem::NotJson => "not JSON",
        }
    }
}

impl std::fmt::Display for StallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StallError::Json { what, line, column } => {
                write!(f, "{STALL_FILE}: {} (line {line}, column {column})", what.as_str())
            }
            StallError::NotObject => write!(f, "{STALL_FILE}: not an object"),
            StallError::NotHookRecord => write!(
                f,
                "{STALL_FILE}: not the hook's record ({VERSION}, {KIND}, {PID}, {STEP}, {DETECTED_US})"
            ),
        }
    }
}

impl std::error::Error for StallError {}

/// `stall.json`'s value, or why it cannot be read as one (the kind of problem and where,
/// never its content): not JSON (a `NaN`, text cut short), nested deeper than `serde_json`'s
/// 128 levels, or not an object.
pub fn stall_value(bytes: &[u8]) -> Result<Value, StallError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Eof => JsonProblem::EndsEarly,
            _ if e.to_string().starts_with("recursion limit exceeded") => JsonProblem::TooDeep,
            _ => JsonProblem::NotJson,
        };
        StallError::Json { what, line: e.line(), column: e.column() }
    })?;
    if !v.is_object() {
        return Err(StallError::NotObject);
    }
    Ok(v)
}

/// `stall.json`'s value when it is the hook's record (`docs/formats.md`, "Hang and crash
/// dumps"): an object with `version` 1, a `kind` the hook writes, and whole `pid`, `step` and
/// plausible `detected_us`; else why not. The agent records the host only for such a dump.
pub fn hook_record(bytes: &[u8]) -> Result<Value, StallError> {
    let v = stall_value(bytes)?;
    let int = |k: &str| v.get(k).and_then(Value::as_i64);
    let kind = v.get(KIND).and_then(Value::as_str);
    if v.get(VERSION).and_then(Value::as_u64) != Some(RECORD_VERSION)
        || kind.and_then(DumpKind::parse).is_none()
        || int(PID).is_none()
        || int(STEP).is_none()
        || !int(DETECTED_US).is_some_and(plausible_us)
    {
        return Err(StallError::NotHookRecord);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let t = 1_800_000_000_000_000;
        assert_eq!(parse_folder(&dump_name(-1, t)), Some((0, t)));
        assert_eq!(parse_folder(&dump_name(7, t)), Some((7, t)));
        assert_eq!(parse_folder("7-1"), None);
        assert_eq!(node_dir("0-a"), "framework/hangs/0-a");
        for k in DumpKind::ALL {
            assert_eq!(DumpKind::parse(k.as_str()), Some(k));
        }
        let rec = format!(r#"{{"version": 1, "kind": "signal", "pid": 1, "step": 0, "detected_us": {t}}}"#);
        assert!(hook_record(rec.as_bytes()).is_ok());
        let err = hook_record(b"{}").unwrap_err();
        assert_eq!(
            err.to_string(),
            "stall.json: not the hook's record (version, kind, pid, step, detected_us)"
        );
        assert_eq!(stall_value(b"[]").unwrap_err().to_string(), "stall.json: not an object");
        assert_eq!(
            stall_value(b"{").unwrap_err().to_string(),
            "stall.json: the JSON ends early (line 1, column 1)"
        );
        assert_eq!(stall_value(b"NaN").unwrap_err().to_string(), "stall.json: not JSON (line 1, column 1)");
        let deep = "[".repeat(200);
        assert_eq!(
            stall_value(deep.as_bytes()).unwrap_err().to_string(),
            "stall.json: nested too deep (line 1, column 128)"
        );
    }
}
