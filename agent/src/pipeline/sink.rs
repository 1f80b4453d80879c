//! Where the sampling loop hands each tick (ARCHITECTURE.md, "The sink seam"). The loop
//! ([`crate::pipeline::tick`]) samples every sampler into one buffer and hands the buffer to
//! every sink in turn; each sink does its own I/O and says its own failures, so a sink that
//! fails never stops the loop or another sink (dynolog's `Logger` is the model). The system
//! metrics files are one sink ([`crate::pipeline::sinks::SystemFiles`]); another output (a
//! metrics endpoint, OTLP) is another sink, added where the sinks are built
//! ([`crate::pipeline::sinks::build`]), without touching the loop.
//!
//! Every call is made on the sampling thread, inside the tick: a sink must not block. A sink
//! that serves its data elsewhere (a metrics endpoint) copies what it keeps of the tick
//! into a slot shared with its own thread and serves it from there.

use std::time::Duration;

use crate::pipeline::cost::Part;
use crate::pipeline::sample::Metric;
use crate::pipeline::system_file::SystemCounts;

/// One tick as the samplers left it.
#[derive(Debug, Clone, Copy)]
pub struct Tick<'a> {
    /// The one timestamp of every metric, epoch seconds.
    pub wall_s: f64,
    /// The samplers' metrics, in sampler order.
    pub metrics: &'a [Metric],
    /// The job's last tick, taken at the stop; [`Sink::finish`] follows.
    pub last: bool,
}

/// An output of the sampling loop. Only [`Sink::tick`] is required.
pub trait Sink: Send {
    /// One tick. A failure is the sink's to count and say; the loop goes on.
    fn tick(&mut self, tick: &Tick<'_>);

    /// How long the loop should wait before taking the last tick at `wall_s` (epoch
    /// seconds); the loop waits for the longest any sink asks. `None`: no wait.
    fn last_tick_pause(&self, _wall_s: f64) -> Option<Duration> {
        None
    }

    /// Profiling was switched off by a reloaded config (DisableProfiler): no tick comes until
    /// it is on again, so what was handed so far is made final now.
    fn pause(&mut self) {}

    /// The loop has stopped; the last call.
    fn finish(&mut self) {}

    /// Adds what the sink counted to the loop's counts (for the summary).
    fn add_counts(&self, _counts: &mut LoopCounts) {}

    /// The part its time is charged to in the agent's own account
    /// ([`crate::pipeline::cost`]).
    fn cost_part(&self) -> Part {
        Part::Loop
    }
}

/// What the loop did, for the summary and the agent's own metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopCounts {
    pub ticks: u64,
    /// Deadlines skipped because a tick came late.
    pub skipped: u64,
    /// Failed reads, per sampler name.
    pub sample_failures: Vec<(&'static str, u64)>,
    /// Set by the system files' sink.
    pub system: SystemCounts,
    /// The process's CPU time from the first tick to the last, µs (set by the caller, who
    /// owns the clock of the whole process).
    pub sampling_cpu_us: u64,
}
