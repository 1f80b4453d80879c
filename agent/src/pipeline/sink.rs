//! Where the sampling loop hands each tick (ARCHITECTURE.md, "The sink seam"). The loop
//! ([`crate::pipeline::tick`]) samples every sampler into one buffer and hands the buffer to
//! every sink in turn; each sink does its own I/O and says its own failures, so a sink that
//! fails never stops the loop or another sink (dynolog's `Logger` is the model). The system
//! metrics files are one sink ([`SystemFiles`]); another output (a metrics endpoint, OTLP) is
//! another sink, added where `run` builds the loop, without touching the loop.
//!
//! Every call is made on the sampling thread, inside the tick: a sink must not block. A sink
//! that serves its data elsewhere (a metrics endpoint) copies what it keeps of the tick
//! into a slot shared with its own thread and serves it from there.

use std::time::Duration;

use crate::pipeline::sample::Metric;
use crate::pipeline::system_file::SystemWriter;
use crate::pipeline::tick::LoopCounts;
use crate::pipeline::upload::Waker;

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
}

/// The system metrics files (`docs/formats.md`, "System files: names" and "System files:
/// line format"), through a [`SystemWriter`], and the uploader woken whenever one is sealed.
#[derive(Debug)]
pub struct SystemFiles {
    writer: SystemWriter,
    /// Told about every sealed file.
    on_seal: Option<Waker>,
    /// Whether the last write failed, to say only changes.
    failing: bool,
}

impl SystemFiles {
    pub fn new(writer: SystemWriter, on_seal: Option<Waker>) -> SystemFiles {
        SystemFiles { writer, on_seal, failing: false }
    }

    /// Wakes the uploader when a file was sealed; logs a change of the writing state.
    fn written(&mut self, result: Result<bool, crate::pipeline::system_file::SystemWriteError>) {
        match result {
            Ok(sealed) => {
                if sealed {
                    self.wake();
                }
                if std::mem::take(&mut self.failing) {
                    crate::log!("system metrics are written again");
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut self.failing, true) {
                    crate::log!("{e}; ticks are lost and counted until it works again");
                }
            }
        }
    }

    fn wake(&self) {
        if let Some(w) = &self.on_seal {
            w.wake();
        }
    }
}

impl Sink for SystemFiles {
    /// A tick into the open minute file; the last one into a file of its own named by its
    /// second ([`SystemWriter::write_last_tick`]).
    fn tick(&mut self, tick: &Tick<'_>) {
        let written = if tick.last {
            self.writer.write_last_tick(tick.wall_s, tick.metrics).map(|s| !s.is_empty())
        } else {
            self.writer.write_tick(tick.wall_s, tick.metrics).map(|s| s.is_some())
        };
        self.written(written);
    }

    /// Not in the first second of one of smdebug's 60 s windows
    /// ([`SystemWriter::last_tick_pause`]).
    fn last_tick_pause(&self, wall_s: f64) -> Option<Duration> {
        self.writer.last_tick_pause(wall_s)
    }

    /// What was written so far is sealed now (and uploaded), not at the stop.
    fn pause(&mut self) {
        match self.writer.seal() {
            Ok(Some(_)) => self.wake(),
            Ok(None) => {}
            Err(e) => crate::log!("{e}; the temporary file is repaired at the next start"),
        }
    }

    /// Seals the open file (the final upload takes it).
    fn finish(&mut self) {
        if let Err(e) = self.writer.seal() {
            crate::log!("{e}; the temporary file is repaired at the next start");
        }
    }

    fn add_counts(&self, counts: &mut LoopCounts) {
        counts.system = self.writer.counts();
    }
}
