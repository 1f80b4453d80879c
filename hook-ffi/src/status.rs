//! Status codes. Their numbers never change meaning; new codes get new numbers.
//! Zero is success, positive codes are harmless no-ops (the call did nothing and the
//! trainer may go on), negative codes are the caller's mistakes or internal errors.

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
