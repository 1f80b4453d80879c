//! The metrics endpoint (`--metrics-listen ADDR:PORT`, `docs/metrics.md`): the latest tick's
//! system rows in the Prometheus text exposition format (OpenMetrics when asked for).
//!
//! Three parts, so that a scrape can never slow sampling:
//!
//! * [`Endpoint`], a [`Sink`] on the sampling thread: copies the tick's rows into a reused
//!   buffer and queues it in a [`Slot`] (a mutex held to move a pointer, never while
//!   anything is rendered or sent). It renders nothing and wakes nobody: waking another
//!   thread costs the waker a system call and, on a VM, an interrupt to the other CPU
//!   (measured: 15–50 µs more per tick, BENCHMARKS.md).
//! * the server thread (`trainprof-metrics`, [`server`]): one single-threaded tokio runtime
//!   with hyper's HTTP/1 server. It drains the slot on a timer of its own (every half
//!   second) and at each scrape, takes every tick queued and
//!   keeps the last value of the rows that are not on every tick (the GPU buffers, the
//!   counters, the clock: [`exposition::Family::sparse`]); a scrape renders that state at
//!   most once per tick and format (cached), then serves the cached bytes.
//! * [`exposition`]: names, labels and types; [`format`]: the two formats and the label
//!   escaping; [`progress`]: the trainer's steps from the hook's timelines, read on the
//!   server thread, at most once a second.
//!
//! The listening socket is bound in `prepare` (a bad address or a port in use stops
//! `agent` / `run` with exit status 2 before anything starts) and handed to [`start`].

pub mod exposition;
pub mod format;
pub mod progress;
mod server;

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex, PoisonError};

use crate::pipeline::sample::Metric;
use crate::pipeline::sink::{Sink, Tick};

pub use self::exposition::Labels;

/// One tick as handed over.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Counts the ticks handed over (1 = the first).
    pub seq: u64,
    pub wall_s: f64,
    pub rows: Vec<Metric>,
}

/// The ticks not yet taken by the server, oldest first (`None`: profiling paused there).
pub type Handed = VecDeque<Option<Arc<Snapshot>>>;

/// Ticks handed over and not yet taken by the server, and spare buffers: shared by the
/// sampling thread and the server, each holding the lock only to move a pointer.
#[derive(Debug, Default)]
pub struct Slot {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// At most [`HANDED_MAX`]; the oldest goes when full (the server was held up).
    handed: Handed,
    /// Buffers the server let go of, at most [`SPARE_MAX`].
    spare: Vec<Vec<Metric>>,
}

/// Ticks kept for the server at most: 6.4 s of the shortest interval (100 ms); the server
/// takes them every half second.
pub const HANDED_MAX: usize = 64;
const SPARE_MAX: usize = 8;

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every tick handed over since the last call, oldest first.
    pub fn drain(&self) -> Handed {
        std::mem::take(&mut self.lock().handed)
    }

    /// Gives a tick's buffer back for reuse, when nobody else holds the tick.
    pub fn recycle(&self, s: Arc<Snapshot>) {
        if let Ok(s) = Arc::try_unwrap(s) {
            let mut inner = self.lock();
            if inner.spare.len() < SPARE_MAX {
                inner.spare.push(s.rows);
            }
        }
    }

    fn spare(&self) -> Vec<Metric> {
        self.lock().spare.pop().unwrap_or_default()
    }

    fn hand(&self, s: Option<Arc<Snapshot>>) {
        let dropped = {
            let mut inner = self.lock();
            let dropped = if inner.handed.len() >= HANDED_MAX { inner.handed.pop_front() } else { None };
            inner.handed.push_back(s);
            dropped
        };
        if let Some(Some(d)) = dropped {
            self.recycle(d);
        }
    }
}

/// The sink: hands each tick's rows to the server thread.
#[derive(Debug)]
pub struct Endpoint {
    slot: Arc<Slot>,
    seq: u64,
}

impl Endpoint {
    /// A sink that hands its ticks to `slot` (tests; [`start`] makes one with the server).
    pub fn new(slot: Arc<Slot>) -> Endpoint {
        Endpoint { slot, seq: 0 }
    }
}

impl Sink for Endpoint {
    fn cost_part(&self) -> crate::pipeline::cost::Part {
        crate::pipeline::cost::Part::MetricsSink
    }

    /// Copies the rows into a spare buffer (a new one until the server gives buffers back)
    /// and queues it; wakes nobody.
    fn tick(&mut self, tick: &Tick<'_>) {
        self.seq += 1;
        let mut rows = self.slot.spare();
        rows.clear();
        rows.extend_from_slice(tick.metrics);
        self.slot.hand(Some(Arc::new(Snapshot { seq: self.seq, wall_s: tick.wall_s, rows })));
    }

    /// DisableProfiler: no tick is served (503) until ticks come again, rather than the
    /// last one as if it were current.
    fn pause(&mut self) {
        self.slot.hand(None);
    }
}

/// Why the endpoint cannot listen.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("--metrics-listen {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// Binds `addr` (checked before anything starts: a port in use is the person's mistake).
pub fn bind(addr: SocketAddr) -> Result<TcpListener, ListenError> {
    let l = TcpListener::bind(addr).map_err(|source| ListenError::Bind { addr, source })?;
    l.set_nonblocking(true).map_err(|source| ListenError::Bind { addr, source })?;
    Ok(l)
}

/// Starts the server thread on `listener`, following the trainer's timelines under `root`
/// ([`progress`]); the sink to hand ticks to.
pub fn start(listener: TcpListener, labels: Labels, root: &std::path::Path) -> std::io::Result<Endpoint> {
    let slot = Arc::new(Slot::default());
    server::spawn(listener, Arc::clone(&slot), labels, Some(root.to_owned()))?;
    Ok(Endpoint::new(slot))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::sample::{MetricType, Name, dimension};

    #[test]
    fn the_sink_queues_each_tick_and_reuses_the_buffers_the_server_gives_back() {
        let slot = Arc::new(Slot::default());
        let mut e = Endpoint::new(Arc::clone(&slot));
        let metrics = [Metric {
            kind: MetricType::Cpu,
            name: Name::core(0),
            dimension: dimension::CPU_UTILIZATION,
            value: 5.0,
        }; 3];
        e.tick(&Tick { wall_s: 10.0, metrics: &metrics, last: false });
        e.tick(&Tick { wall_s: 11.0, metrics: &metrics[..2], last: false });
        let got: Vec<_> = slot.drain().into_iter().map(|s| s.unwrap()).collect();
        assert_eq!(
            got.iter().map(|s| (s.seq, s.wall_s, s.rows.len())).collect::<Vec<_>>(),
            [(1, 10.0, 3), (2, 11.0, 2)]
        );
        assert!(slot.drain().is_empty());
        let first = got[0].rows.as_ptr();
        for s in got {
            slot.recycle(s);
        }
        // The buffers come back (the last given back first).
        e.tick(&Tick { wall_s: 12.0, metrics: &metrics[..1], last: false });
        e.tick(&Tick { wall_s: 13.0, metrics: &metrics[..1], last: false });
        let got: Vec<_> = slot.drain().into_iter().map(|s| s.unwrap()).collect();
        assert_eq!(got[1].rows.as_ptr(), first);
        assert_eq!((got[1].seq, got[1].rows.len()), (4, 1));
        // DisableProfiler is queued in order.
        e.pause();
        e.tick(&Tick { wall_s: 20.0, metrics: &metrics, last: false });
        let got = slot.drain();
        assert!(got[0].is_none());
        assert_eq!(got[1].as_ref().unwrap().seq, 5);
        // A server held up: the oldest ticks go, at most HANDED_MAX wait.
        for k in 0..HANDED_MAX + 10 {
            e.tick(&Tick { wall_s: 30.0 + k as f64, metrics: &metrics, last: false });
        }
        let got = slot.drain();
        assert_eq!(got.len(), HANDED_MAX);
        assert_eq!(got[0].as_ref().unwrap().seq, 5 + 1 + 10);
    }
}
