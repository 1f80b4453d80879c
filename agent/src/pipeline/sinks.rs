//! The sinks `trainprof agent` and `trainprof run` hand every tick to, built in one place
//! ([`build`]; ARCHITECTURE.md, "The sink seam"): the system metrics files
//! ([`SystemFiles`]), the host state at a stall ([`crate::pipeline::hangs::HangSink`]) and
//! the metrics endpoint ([`crate::pipeline::metrics::Endpoint`]) when one was asked for.

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use trainprof_output::node::SystemNode;

use crate::log;
use crate::pipeline::hangs::HangSink;
use crate::pipeline::metrics;
use crate::pipeline::sample::tree_pids::TreePids;
use crate::pipeline::sink::{LoopCounts, Sink, Tick};
use crate::pipeline::system_file::SystemWriter;
use crate::pipeline::upload::Waker;

/// What the sinks are built from.
#[derive(Debug)]
pub struct Outputs<'a> {
    /// LocalPath: the system files, the stall records and the trainer's timelines under it.
    pub root: &'a Path,
    /// This node, as the system files and the stall records name it.
    pub node: SystemNode,
    /// Told about every sealed system file (the uploader).
    pub on_seal: Option<Waker>,
    /// `/proc`, read at a stall.
    pub proc: &'a Path,
    /// The trainer's process tree, read at a stall.
    pub tree: TreePids,
    /// The endpoint's socket (bound in `prepare`) and the labels of its series.
    pub metrics: Option<(TcpListener, metrics::Labels)>,
}

/// The sinks, in the order each tick goes to them. A sink other than the system files that
/// cannot start is one line, and sampling goes on without it.
pub fn build(o: Outputs<'_>) -> Vec<Box<dyn Sink>> {
    // Another output is another sink here (ARCHITECTURE.md, "The sink seam").
    let mut sinks: Vec<Box<dyn Sink>> =
        vec![Box::new(SystemFiles::new(SystemWriter::new(o.root, o.node), o.on_seal))];
    // The host at a stall (docs/on-disk.md, "Host state at a stall").
    if let Some(h) = HangSink::start(o.root, o.proc, &o.node.to_string(), o.tree) {
        sinks.push(Box::new(h));
    }
    if let Some((listener, labels)) = o.metrics {
        match metrics::start(listener, labels, o.root) {
            Ok(endpoint) => sinks.push(Box::new(endpoint)),
            Err(e) => log!("cannot start the metrics endpoint ({e}); sampling goes on without it"),
        }
    }
    sinks
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
    fn cost_part(&self) -> crate::pipeline::cost::Part {
        crate::pipeline::cost::Part::Write
    }

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
