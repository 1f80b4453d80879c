//! The fixed-size event that crosses the queue from the trainer's threads to the writer.
//!
//! It is plain data (no heap, no names): names travel as ids registered beforehand, so
//! building and queueing one never allocates.

use crate::types::{TRAINPROF_MAX_ARGS, TrainprofArg};

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
