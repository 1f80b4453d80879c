//! The metrics endpoint (`--metrics-listen ADDR:PORT`, `docs/metrics.md`): the latest tick's
//! system rows in the Prometheus text exposition format (OpenMetrics when asked for).
//!
//! Three parts, so that a scrape can never slow sampling:
//!
//! * [`Endpoint`], a [`Sink`] on the sampling thread: copies the tick's rows into a reused
//!   buffer and swaps it into a [`Slot`] (a mutex held for a pointer swap, never while
//!   anything is rendered or sent). It renders nothing and wakes nobody: waking another
//!   thread costs the waker a system call and, on a VM, an interrupt to the other CPU
//!   (measured: 15–50 µs more per tick, BENCHMARKS.md).
//! * the server thread (`trainprof-metrics`, [`server`]): one single-threaded tokio runtime
//!   with hyper's HTTP/1 server. It looks at the slot on a timer of its own, twice per tick
//!   interval (as the ticks' timestamps show it), takes each new tick and
//!   keeps the last value of the rows that are not on every tick (the GPU buffers, the
//!   counters, the clock: [`exposition::Family::sparse`]); a scrape renders that state at
//!   most once per tick and format (cached), then serves the cached bytes.
//! * [`exposition`]: names, labels, types and the two formats; [`progress`]: the trainer's
//!   steps from the hook's timelines, read on the server thread, at most once a second.
//!
//! The listening socket is bound in `prepare` (a bad address or a port in use stops
//! `agent` / `run` with exit status 2 before anything starts) and handed to [`start`].

pub mod exposition;
pub mod progress;
mod server;

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

/// The newest tick, shared by the sampling thread and the server.
#[derive(Debug, Default)]
pub struct Slot {
    latest: Mutex<Option<Arc<Snapshot>>>,
}

impl Slot {
    /// The newest tick (a pointer copy under the lock).
    pub fn latest(&self) -> Option<Arc<Snapshot>> {
        self.latest.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Puts `s` in (`None`: no tick to serve), returning the tick it replaced.
    fn put(&self, s: Option<Arc<Snapshot>>) -> Option<Arc<Snapshot>> {
        std::mem::replace(&mut *self.latest.lock().unwrap_or_else(PoisonError::into_inner), s)
    }
}

/// The sink: hands each tick's rows to the server thread.
#[derive(Debug)]
pub struct Endpoint {
    slot: Arc<Slot>,
    seq: u64,
    /// The tick before the newest: the server holds it until it has taken the newest, so
    /// its buffer is reused one tick later, when the server has let go of it. A tick then
    /// allocates nothing but the `Arc` once the buffers have grown.
    retired: Option<Arc<Snapshot>>,
}

impl Endpoint {
    /// A sink that hands its ticks to `slot` (tests; [`start`] makes one with the server).
    pub fn new(slot: Arc<Slot>) -> Endpoint {
        Endpoint { slot, seq: 0, retired: None }
    }
}

impl Sink for Endpoint {
    fn tick(&mut self, tick: &Tick<'_>) {
        self.seq += 1;
        // Still held by the server (it has not taken the newest yet, or a scrape renders
        // it): it is dropped there, and this tick allocates.
        let mut rows =
            self.retired.take().and_then(|r| Arc::try_unwrap(r).ok()).map(|r| r.rows).unwrap_or_default();
        rows.clear();
        rows.extend_from_slice(tick.metrics);
        self.retired = self.slot.put(Some(Arc::new(Snapshot { seq: self.seq, wall_s: tick.wall_s, rows })));
    }

    /// DisableProfiler: no tick is served (503) until ticks come again, rather than the
    /// last one as if it were current.
    fn pause(&mut self) {
        self.slot.put(None);
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
    use crate::pipeline::sample::{CPU, Name, dimension};

    #[test]
    fn the_sink_hands_over_each_tick_and_reuses_the_buffer_the_server_let_go() {
        let slot = Arc::new(Slot::default());
        let mut e = Endpoint::new(Arc::clone(&slot));
        let metrics =
            [Metric { kind: CPU, name: Name::core(0), dimension: dimension::CPU_UTILIZATION, value: 5.0 }; 3];
        e.tick(&Tick { wall_s: 10.0, metrics: &metrics, last: false });
        let held = slot.latest().unwrap();
        assert_eq!((held.seq, held.wall_s, held.rows.len()), (1, 10.0, 3));
        let first = held.rows.as_ptr();
        // The server still holds tick 1 at tick 3: tick 3 takes a new buffer.
        e.tick(&Tick { wall_s: 11.0, metrics: &metrics[..2], last: false });
        let second = slot.latest().unwrap().rows.as_ptr();
        e.tick(&Tick { wall_s: 12.0, metrics: &metrics[..1], last: false });
        assert_ne!(slot.latest().unwrap().rows.as_ptr(), first);
        drop(held);
        // Tick 2's buffer was let go: tick 4 fills it; then tick 3's, tick 4's, ...
        e.tick(&Tick { wall_s: 13.0, metrics: &metrics[..1], last: false });
        assert_eq!(slot.latest().unwrap().rows.as_ptr(), second);
        let s = slot.latest().unwrap();
        assert_eq!((s.seq, s.wall_s, s.rows.len()), (4, 13.0, 1));
        // DisableProfiler: nothing to serve until the next tick.
        e.pause();
        assert!(slot.latest().is_none());
        e.tick(&Tick { wall_s: 20.0, metrics: &metrics, last: false });
        assert_eq!(slot.latest().unwrap().seq, 5);
    }
}
