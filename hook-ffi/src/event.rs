//! The fixed-size event that crosses the queue from the trainer's threads to the writer.
//!
//! It is plain data (no heap, no names): names travel as ids registered beforehand, so
//! building and queueing one never allocates.

/// At most this many extra numeric arguments per event.
pub const TRAINPROF_MAX_ARGS: usize = 4;

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

/// A complete event (`ph: "X"`), as queued. Times are µs since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub phase: u32,
    pub name: u32,
    pub start_us: i64,
    pub end_us: i64,
    /// The step number for `args.step_num`, or [`NO_STEP`].
    pub step: i64,
    pub n_args: u8,
    pub args: [TrainprofArg; TRAINPROF_MAX_ARGS],
}

/// [`Event::step`] when the event belongs to no step (nothing began yet).
pub const NO_STEP: i64 = -1;

impl Event {
    pub fn args(&self) -> &[TrainprofArg] {
        &self.args[..usize::from(self.n_args).min(TRAINPROF_MAX_ARGS)]
    }
}
