//! Every type and constant the C header (`include/trainprof_hook.h`) declares, in one
//! place: status codes, enums, structs and limits (cbindgen reads them from here), with
//! their conversions from C integers. The logic that uses them lives in the other modules.
//!
//! Status codes: their numbers never change meaning; new codes get new numbers. Zero is
//! success, positive codes are harmless no-ops (the call did nothing and the trainer may
//! go on), negative codes are the caller's mistakes or internal errors.

use std::ffi::c_char;

use trainprof_output::protocol::timeline;

// --- limits ---------------------------------------------------------------------------

/// At most this many extra numeric arguments per event.
pub const TRAINPROF_MAX_ARGS: usize = 4;

/// Bytes in each path buffer of [`TrainprofPythonWindow`] (PATH_MAX).
pub const TRAINPROF_PATH_MAX: usize = 4096;

/// The id `trainprof_register_name` gives a name that does not fit in the name table
/// (`TRAINPROF_MAX_NAMES`): an event that uses it is dropped and counted.
pub const TRAINPROF_NAME_OVER_LIMIT: u32 = u32::MAX;

// --- enums ----------------------------------------------------------------------------

/// What a call did.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofStatus {
    Ok = 0,
    /// `trainprof_init` has not been called (or is still running in another thread).
    NotInitialized = 1,
    /// `trainprof_shutdown` was called; the hook is off for the rest of the process.
    ShutDown = 2,
    /// Profiling is disabled (`DisableProfiler`, `TRAINPROF_DISABLE`): nothing is recorded.
    Disabled = 3,
    /// Called in a `fork()`ed child: the hook is inert there (see the crate docs).
    ForkedChild = 4,
    /// The event queue was full: the event was dropped and counted.
    Dropped = 5,
    /// `trainprof_shutdown` did not finish within its time bound; the writer goes on in
    /// the background.
    Timeout = 6,
    /// `trainprof_step_end` without a step in progress.
    NoStep = 7,
    /// `trainprof_register_name`: the name table is full (`TRAINPROF_MAX_NAMES`); the id
    /// given is `TRAINPROF_NAME_OVER_LIMIT`, and events that use it are dropped and counted.
    NameLimit = 8,
    /// A required pointer argument was NULL.
    NullArgument = -1,
    /// A string argument was not UTF-8.
    InvalidUtf8 = -2,
    /// An argument was out of range (unknown mode, feature, id; end before start; ...).
    InvalidArgument = -3,
    /// An internal error (a caught panic). The hook is still safe to call.
    Internal = -4,
    /// The writer thread could not be started.
    Io = -5,
    /// The caller's buffer is too small for the answer.
    BufferTooSmall = -6,
}

/// A training mode, numbered as smdebug's `ModeKeys`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofMode {
    Train = 1,
    Eval = 2,
    Predict = 3,
    Global = 4,
}

impl TrainprofMode {
    pub(crate) const ALL: [TrainprofMode; 4] =
        [TrainprofMode::Train, TrainprofMode::Eval, TrainprofMode::Predict, TrainprofMode::Global];

    pub fn from_i32(v: i32) -> Option<TrainprofMode> {
        TrainprofMode::ALL.into_iter().find(|m| *m as i32 == v)
    }

    /// The phase (and name) of this mode's step events: `Step:ModeKeys.TRAIN`.
    pub fn step_phase(self) -> &'static str {
        match self {
            TrainprofMode::Train => timeline::STEP_TRAIN,
            TrainprofMode::Eval => timeline::STEP_EVAL,
            TrainprofMode::Predict => timeline::STEP_PREDICT,
            TrainprofMode::Global => timeline::STEP_GLOBAL,
        }
    }

    /// The mode in Python-stats directory names.
    pub fn python_name(self) -> &'static str {
        match self {
            TrainprofMode::Train => "train",
            TrainprofMode::Eval => "eval",
            TrainprofMode::Predict => "predict",
            TrainprofMode::Global => "global",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize - 1
    }

    /// The name id of [`TrainprofMode::step_phase`], registered when the hook is made.
    pub fn step_name_id(self) -> u32 {
        self.index() as u32
    }
}

/// A profiling feature whose window can be asked about.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofFeature {
    Detailed = 1,
    Dataloader = 2,
    Python = 3,
    Smdataparallel = 4,
    /// Native CPU sampling (`NativeProfilingConfig`); the hook samples by itself, the
    /// answer is for the caller's information.
    Native = 5,
    /// PyTorch memory snapshots (`MemoryProfilingConfig`, docs/formats.md, "Memory
    /// windows"); the adapter records and dumps, the hook only answers.
    Memory = 6,
}

impl TrainprofFeature {
    pub fn from_i32(v: i32) -> Option<TrainprofFeature> {
        use TrainprofFeature::*;
        [Detailed, Dataloader, Python, Smdataparallel, Native, Memory].into_iter().find(|f| *f as i32 == v)
    }
}

/// The cap a window reached (`trainprof_window_capped`, docs/formats.md, "Window caps").
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofCap {
    /// Events the window wrote.
    Events = 1,
    /// Bytes the trainer's resident memory grew by during the window.
    Bytes = 2,
    /// Profiler samples the window took.
    Samples = 3,
}

impl TrainprofCap {
    pub fn from_i32(v: i32) -> Option<TrainprofCap> {
        use TrainprofCap::*;
        [Events, Bytes, Samples].into_iter().find(|c| *c as i32 == v)
    }

    /// Its word in the capped event's `cap` (`CAP_WORDS`).
    pub fn word(self) -> &'static str {
        match self {
            TrainprofCap::Events => timeline::CAP_EVENTS,
            TrainprofCap::Bytes => timeline::CAP_BYTES,
            TrainprofCap::Samples => timeline::CAP_SAMPLES,
        }
    }
}

/// A point where windows are cut.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofBoundary {
    /// Profiler start-up: opens the pre-step-zero window.
    Start = 1,
    StepStart = 2,
    ForwardPassEnd = 3,
    StepEnd = 4,
    /// The hook closes: ends the running window, opens the post-close one.
    Close = 5,
    /// Process exit: ends the post-close window.
    Exit = 6,
}

/// The kind of a numeric argument's value.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofArgKind {
    /// `value` holds an `int64_t`.
    Int = 0,
    /// `value` holds a `double` (its bits, see [`TrainprofArg`]).
    Float = 1,
    /// `value` is 0 (false) or anything else (true).
    Bool = 2,
}

/// A profiler for Python windows.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofPythonProfiler {
    None = 0,
    Cprofile = 1,
    Pyinstrument = 2,
}

/// A cProfile timer.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofCprofileTimer {
    None = 0,
    TotalTime = 1,
    CpuTime = 2,
    OffCpuTime = 3,
}

// --- structs --------------------------------------------------------------------------

/// One extra argument of an event: `args.<name of key> = value`.
///
/// For [`TrainprofArgKind::Float`], `value` carries the bits of an IEEE-754 double
/// (`memcpy` it in C; the Python package does this for you).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainprofArg {
    /// A name id from `trainprof_register_name`.
    pub key: u32,
    /// A [`TrainprofArgKind`] value.
    pub kind: i32,
    pub value: i64,
}

impl TrainprofArg {
    pub(crate) const EMPTY: TrainprofArg = TrainprofArg { key: 0, kind: 0, value: 0 };
}

/// What `trainprof_python_boundary` decided.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TrainprofPythonWindow {
    /// 1 when a window ended here: stop its profiler, write its stats into `ended_tmp_dir`,
    /// then rename that directory to `ended_dir`.
    pub ended: i32,
    /// 1 when a window starts here: start a `profiler` with `timer`.
    pub started: i32,
    /// A `TrainprofPythonProfiler`, for the window that starts.
    pub profiler: i32,
    /// A `TrainprofCprofileTimer`, for the window that starts (cProfile only).
    pub timer: i32,
    /// `<LocalPath>/framework/<framework>/<profiler>/<node>/<start>_<end>`, NUL-terminated.
    pub ended_dir: [c_char; TRAINPROF_PATH_MAX],
    /// A directory outside the readers' view, on the same file system, NUL-terminated.
    pub ended_tmp_dir: [c_char; TRAINPROF_PATH_MAX],
}

impl TrainprofPythonWindow {
    /// Nothing ended, nothing started.
    pub(crate) const NOTHING: TrainprofPythonWindow = TrainprofPythonWindow {
        ended: 0,
        started: 0,
        profiler: 0,
        timer: 0,
        ended_dir: [0; TRAINPROF_PATH_MAX],
        ended_tmp_dir: [0; TRAINPROF_PATH_MAX],
    };
}

/// The caps of every window (`WindowCapsConfig`, docs/formats.md, "Window caps"), see
/// `trainprof_window_caps`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrainprofWindowCaps {
    /// Events a detailed window writes.
    pub detailed_max_events: u64,
    /// Bytes the trainer's resident memory may grow by while a detailed window runs.
    pub detailed_max_bytes: u64,
    /// Events a dataloader window writes.
    pub dataloader_max_events: u64,
    /// pyinstrument samples in one Python window.
    pub python_max_samples: u64,
}

/// What `MemoryProfilingConfig` asks for (docs/formats.md, "Memory windows"), see
/// `trainprof_memory_settings`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrainprofMemorySettings {
    /// The history's bound (`MaxEntries`).
    pub max_entries: u64,
    /// 1 when the feature is on (a window, or the OOM snapshot), else 0.
    pub enabled: i32,
    /// 1 when `OomSnapshot` keeps history on for a snapshot at the first out-of-memory error.
    pub oom_snapshot: i32,
    /// A `TrainprofStacks`.
    pub stacks: i32,
}

/// Which stacks torch records (`Stacks`).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofStacks {
    Python = 1,
    All = 2,
}

/// Why a memory snapshot is taken (`trainprof_memory_snapshot_create`).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofSnapshotKind {
    /// At a memory window's end: `window-<first>-<last>-<µs>.pickle`.
    Window = 1,
    /// At a rank's first out-of-memory error: `oom-<step>-<µs>.pickle`.
    Oom = 2,
}

/// The bits `trainprof_step_next` writes into `*out_windows`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofStepNext {
    /// The detailed window is open at the step asked about (`trainprof_window_active`'s
    /// answer for `TRAINPROF_FEATURE_DETAILED`).
    Detailed = 1,
    /// A triggered or requested memory window (`AutoProfilingConfig`, `trainprof trigger
    /// --memory`; not the configured one, which `trainprof_window_active` answers for) is open
    /// at that step (docs/formats.md, "Memory windows").
    Memory = 2,
}

/// Counters, see `trainprof_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TrainprofStats {
    /// Events dropped on the caller's thread because the queue was full.
    pub dropped_queue_full: u64,
    /// Events dropped by the writer (after `FileOpenFailThreshold` failed opens, or in a
    /// file it could not write).
    pub dropped_writer: u64,
    /// Events written to timeline files.
    pub written: u64,
    pub files_sealed: u64,
    pub open_failures: u64,
}
