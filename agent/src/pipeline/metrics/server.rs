//! The endpoint's HTTP server: hyper's HTTP/1 server on a single-threaded tokio runtime on a
//! thread of its own (`trainprof-metrics`), never the sampling thread.
//!
//! What a client can cost is bounded (`docs/metrics.md`, "Hostile clients"):
//! [`MAX_CONNECTIONS`] at once, and never more than a quarter of the file limit (a
//! connection beyond them is accepted, and the one idle longest is closed to make room, so
//! idle or slow clients can never lock a scraper out, and the kernel's backlog never fills
//! with them), request heads of at most
//! [`MAX_HEAD_BYTES`] (hyper answers 431 beyond), [`HEAD_TIMEOUT`] to send a request's head
//! (slowloris), and [`CONNECTION_LIFETIME`] for a whole connection, keep-alive included.
//! Only `GET` and `HEAD` of `/metrics` are served: another path is 404, another method 405.

use std::convert::Infallible;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use super::exposition::{self, FAMILIES, HOLD_S, Labels, Row};
use super::format::Format;
use super::progress::Progress;
use super::{Slot, Snapshot};
use crate::log;
use crate::pipeline::sample::Metric;

/// Connections served at once; a new one beyond them closes the one idle longest.
pub const MAX_CONNECTIONS: usize = 64;
/// A request's head (request line and headers) at most.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Time to send a request's head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection's whole life (keep-alive included).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// The path served.
pub const PATH: &str = "/metrics";
/// How often the server takes the ticks queued when nobody scrapes (a scrape takes them
/// too): the sparse rows of every tick are kept (`HANDED_MAX` ticks wait at most).
const POLL: Duration = Duration::from_millis(500);

/// What the server keeps between ticks.
#[derive(Debug, Default)]
struct State {
    latest: Option<Arc<Snapshot>>,
    /// The last row of each sparse series and the wall time of its tick.
    held: Vec<(Metric, f64)>,
    /// The rendered bytes of one tick and progress reading, per format: (seq, generation,
    /// bytes).
    cache: [Option<(u64, u64, Bytes)>; 2],
    /// The trainer's progress (`None`: not followed, tests).
    progress: Option<Progress>,
    /// Reused between renders.
    rows: Vec<Row>,
    /// The agent's own CPU time per part as last served, ns: a counter never goes down,
    /// though the shares of the untimed ticks move (docs/metrics.md, "The agent's own cost").
    cost_ns: Vec<u64>,
}

impl State {
    /// Takes a newer tick: keeps its sparse rows in `held`, drops held ones older than
    /// [`HOLD_S`]. Returns the tick it replaced (or `s`, when not newer).
    fn take(&mut self, s: Arc<Snapshot>) -> Option<Arc<Snapshot>> {
        if self.latest.as_ref().is_some_and(|l| l.seq >= s.seq) {
            return Some(s);
        }
        for m in s.rows.iter().filter(|m| sparse(m)) {
            match self.held.iter_mut().find(|(h, _)| same_series(h, m)) {
                Some(slot) => *slot = (*m, s.wall_s),
                None => self.held.push((*m, s.wall_s)),
            }
        }
        self.held.retain(|(_, at)| s.wall_s - at <= HOLD_S);
        self.latest.replace(s)
    }

    /// Takes every tick queued in `slot`, in order; gives their buffers back.
    fn take_all(&mut self, slot: &Slot) {
        for handed in slot.drain() {
            match handed {
                Some(s) => {
                    if let Some(old) = self.take(s) {
                        slot.recycle(old);
                    }
                }
                // Paused (DisableProfiler): nothing to serve until the next tick.
                None => {
                    if let Some(old) = self.clear() {
                        slot.recycle(old);
                    }
                }
            }
        }
    }

    /// Forgets every tick (profiling paused); the one it held.
    fn clear(&mut self) -> Option<Arc<Snapshot>> {
        self.held.clear();
        self.latest.take()
    }

    /// The exposition of the newest tick in `format` (rendered once per tick and format).
    fn body(&mut self, format: Format, labels: &Labels) -> Option<Bytes> {
        let latest = self.latest.clone()?;
        let k = usize::from(format == Format::OpenMetrics);
        if let Some(p) = &mut self.progress {
            p.refresh(Instant::now());
        }
        let generation = self.progress.as_ref().map_or(0, |p| p.generation);
        if let Some((seq, g, b)) = &self.cache[k]
            && (*seq, *g) == (latest.seq, generation)
        {
            return Some(b.clone());
        }
        let rows = latest.rows.iter().filter(|m| !sparse(m)).chain(self.held.iter().map(|(m, _)| m)).copied();
        exposition::rows(rows, &mut self.rows);
        let mut buf = String::with_capacity(64 * self.rows.len() + 4096);
        let now = crate::pipeline::cost::snapshot();
        self.cost_ns.resize(now.ns.len(), 0);
        for (kept, ns) in self.cost_ns.iter_mut().zip(now.ns) {
            *kept = (*kept).max(ns);
        }
        let progress = self.progress.as_ref();
        exposition::render(&mut buf, format, labels, latest.wall_s, &self.rows, progress, &self.cost_ns);
        let b = Bytes::from(buf);
        self.cache[k] = Some((latest.seq, generation, b.clone()));
        Some(b)
    }
}

fn sparse(m: &Metric) -> bool {
    FAMILIES[exposition::family_of(m).0 as usize].sparse
}

fn same_series(a: &Metric, b: &Metric) -> bool {
    a.kind == b.kind && a.name == b.name && a.dimension == b.dimension
}

/// Starts the server thread.
pub(super) fn spawn(
    listener: TcpListener,
    slot: Arc<Slot>,
    labels: Labels,
    root: Option<PathBuf>,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    let addr = listener.local_addr()?;
    let listener = {
        let _entered = rt.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    std::thread::Builder::new().name("trainprof-metrics".into()).spawn(move || {
        crate::pipeline::cost::enroll(crate::pipeline::cost::Part::Metrics);
        lower_priority();
        rt.block_on(serve(listener, slot, Arc::new(labels), root.map(Progress::new)));
    })?;
    log!("serving metrics at http://{addr}{PATH}");
    Ok(())
}

/// Lowers this thread's priority by [`NICE`]: on a machine where the CPUs are busy, the
/// sampling thread (and the trainer) go first. A failure is one line; nothing else changes.
fn lower_priority() {
    // SAFETY: `gettid` has no preconditions; `setpriority` with `PRIO_PROCESS` and a thread id
    // changes only this thread's nice value (Linux: each thread has its own).
    let result = unsafe {
        let tid = libc::gettid();
        let id = libc::id_t::try_from(tid).unwrap_or(0);
        let now = libc::getpriority(libc::PRIO_PROCESS, id);
        libc::setpriority(libc::PRIO_PROCESS, id, now.saturating_add(NICE).min(19))
    };
    if result != 0 {
        log!("metrics endpoint: cannot lower its thread's priority ({})", std::io::Error::last_os_error());
    }
}

/// How much lower than the agent's the endpoint thread's priority is (nice).
const NICE: i32 = 10;

async fn serve(
    listener: tokio::net::TcpListener,
    slot: Arc<Slot>,
    labels: Arc<Labels>,
    progress: Option<Progress>,
) {
    let state = Arc::new(Mutex::new(State { progress, ..State::default() }));
    // Takes the ticks queued, off the sampling thread, every POLL.
    tokio::spawn({
        let (slot, state) = (Arc::clone(&slot), Arc::clone(&state));
        async move {
            loop {
                tokio::time::sleep(POLL).await;
                state.lock().unwrap_or_else(PoisonError::into_inner).take_all(&slot);
                crate::pipeline::cost::flush();
            }
        }
    });
    let cap = connection_cap(file_limit());
    let conns = Arc::new(Mutex::new(Conns::default()));
    let epoch = Instant::now();
    let mut accept_failing = false;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => {
                accept_failing = false;
                s
            }
            Err(e) => {
                if !std::mem::replace(&mut accept_failing, true) {
                    log!("metrics endpoint: cannot accept a connection ({e}); trying again");
                }
                // Out of descriptors (the agent's file limit, or the system's): the connection
                // idle longest gives its own back, so a scraper is not locked out; otherwise
                // wait a little rather than spin.
                let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                if out_of_fds && conns.lock().unwrap_or_else(PoisonError::into_inner).evict_idlest() {
                    // Its task runs (and closes the socket) before the accept is tried again.
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        let (conn, made_room) = {
            let mut c = conns.lock().unwrap_or_else(PoisonError::into_inner);
            let before = c.evicted;
            let conn = c.admit(cap, ms_since(epoch));
            let evicted = c.evicted;
            if evicted.is_power_of_two() && evicted != std::mem::replace(&mut c.logged, evicted) {
                log!(
                    "metrics endpoint: {evicted} connection(s) closed so far to make room ({cap} open at once at most; the one idle longest goes)"
                );
            }
            (conn, evicted != before)
        };
        let (state, labels, slot, conns) =
            (Arc::clone(&state), Arc::clone(&labels), Arc::clone(&slot), Arc::clone(&conns));
        tokio::spawn(async move {
            let service = hyper::service::service_fn({
                let conn = Arc::clone(&conn);
                move |req| {
                    conn.since_ms.store(ms_since(epoch), Ordering::Relaxed);
                    let reply = respond(&req, &state, &labels, &slot);
                    async move { Ok::<_, Infallible>(reply) }
                }
            });
            let http = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .max_header_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            // Dropping the connection closes its socket: at the end of its life, or when a new
            // connection needed its place.
            tokio::select! {
                _ = tokio::time::timeout(CONNECTION_LIFETIME, http) => {}
                () = conn.evict.notified() => {}
            }
            conns.lock().unwrap_or_else(PoisonError::into_inner).remove(&conn);
        });
        if made_room {
            // The evicted connection's task closes its socket before the next accept: without
            // this, a burst of connections would be accepted (up to tokio's budget of 128)
            // before any evicted one lets go of its descriptor.
            tokio::task::yield_now().await;
        }
    }
}

/// One open connection, as the accept loop sees it.
#[derive(Debug, Default)]
struct Conn {
    /// When it was accepted or last sent a request, ms since the server started.
    since_ms: AtomicU64,
    /// Told when it must close to make room.
    evict: tokio::sync::Notify,
}

/// The open connections (at most the cap), and how many were closed to make room.
#[derive(Debug, Default)]
struct Conns {
    open: Vec<Arc<Conn>>,
    evicted: u64,
    /// `evicted` when it was last logged.
    logged: u64,
}

impl Conns {
    /// Registers a connection just accepted; at `cap`, the one idle longest (accepted or last
    /// asked the longest ago: a keep-alive connection between scrapes, a client that never
    /// finishes its head) is told to close first (`docs/metrics.md`, "Hostile clients").
    fn admit(&mut self, cap: usize, now_ms: u64) -> Arc<Conn> {
        while self.open.len() >= cap.max(1) && self.evict_idlest() {}
        let conn = Arc::new(Conn { since_ms: AtomicU64::new(now_ms), evict: tokio::sync::Notify::new() });
        self.open.push(Arc::clone(&conn));
        conn
    }

    /// Tells the connection idle longest to close (it leaves `open` now); whether there was one.
    fn evict_idlest(&mut self) -> bool {
        let Some(i) = (0..self.open.len()).min_by_key(|&i| self.open[i].since_ms.load(Ordering::Relaxed))
        else {
            return false;
        };
        // `notify_one` keeps the wake-up for a task that is not waiting yet.
        self.open.swap_remove(i).evict.notify_one();
        self.evicted += 1;
        true
    }

    /// A connection closed (evicted ones have left already).
    fn remove(&mut self, conn: &Arc<Conn>) {
        self.open.retain(|c| !Arc::ptr_eq(c, conn));
    }
}

fn ms_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The connections held at once: [`MAX_CONNECTIONS`], and never more than a quarter of the
/// process's file limit, so the rest of the agent (the files it writes, the uploader) keeps
/// descriptors however many clients connect (`docs/metrics.md`, "Hostile clients").
fn connection_cap(file_limit: Option<u64>) -> usize {
    file_limit
        .map_or(MAX_CONNECTIONS, |l| usize::try_from(l / 4).unwrap_or(usize::MAX).clamp(1, MAX_CONNECTIONS))
}

/// The soft `RLIMIT_NOFILE` (`None`: unlimited or unknown).
fn file_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `getrlimit` writes only the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// One request's answer.
fn respond(
    req: &Request<Incoming>,
    state: &Mutex<State>,
    labels: &Labels,
    slot: &Slot,
) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, text: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"));
        r
    };
    if req.uri().path() != PATH {
        return plain(StatusCode::NOT_FOUND, "not found: the metrics are at /metrics\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n");
        r.headers_mut().insert(ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let accept = req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok());
    let Some(format) = Format::from_accept(accept) else {
        return plain(
            StatusCode::NOT_ACCEPTABLE,
            "not acceptable: served as text/plain; version=0.0.4 or application/openmetrics-text; version=1.0.0\n",
        );
    };
    let body = {
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        // The newest tick, even if the timer has not taken it yet.
        state.take_all(slot);
        state.body(format, labels)
    };
    let Some(body) = body else {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "no tick to serve (none yet, or profiling is paused)\n",
        );
    };
    let mut r = Response::new(Full::new(body));
    r.headers_mut().insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(format.content_type()));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::sample::{MetricType, Name, dimension};

    fn snapshot(seq: u64, wall_s: f64, rows: Vec<Metric>) -> Arc<Snapshot> {
        Arc::new(Snapshot { seq, wall_s, rows })
    }

    #[test]
    fn sparse_rows_are_held_and_renders_cached_per_tick() {
        let cpu = Metric {
            kind: MetricType::Cpu,
            name: Name::core(0),
            dimension: dimension::CPU_UTILIZATION,
            value: 5.0,
        };
        let mean = Metric {
            kind: MetricType::Accelerator,
            name: Name::device(0),
            dimension: dimension::GPU_BUSY_MEAN_PERCENT,
            value: 70.0,
        };
        let labels = Labels { node: "algo-1".into(), gpu_uuid: vec![], job_info: vec![] };
        let mut s = State::default();
        assert!(s.body(Format::Text, &labels).is_none());
        s.take(snapshot(1, 100.0, vec![cpu, mean]));
        let b1 = s.body(Format::Text, &labels).unwrap();
        assert!(
            std::str::from_utf8(&b1)
                .unwrap()
                .contains("trainprof_gpu_utilization_mean_percent{node=\"algo-1\",gpu=\"0\"} 70\n")
        );
        // Cached: the same bytes.
        assert_eq!(s.body(Format::Text, &labels).unwrap().as_ptr(), b1.as_ptr());
        // The next tick has no buffer read: the mean is held.
        s.take(snapshot(2, 100.1, vec![Metric { value: 6.0, ..cpu }]));
        let t = String::from_utf8(s.body(Format::Text, &labels).unwrap().to_vec()).unwrap();
        assert!(t.contains("core=\"0\"} 6\n") && t.contains("gpu=\"0\"} 70\n"), "{t}");
        // An older tick never replaces a newer one.
        s.take(snapshot(1, 100.0, vec![cpu]));
        assert!(
            String::from_utf8(s.body(Format::Text, &labels).unwrap().to_vec()).unwrap().contains("} 6\n")
        );
        // After HOLD_S without it, it goes.
        s.take(snapshot(3, 100.0 + HOLD_S + 1.0, vec![cpu]));
        let t = String::from_utf8(s.body(Format::OpenMetrics, &labels).unwrap().to_vec()).unwrap();
        assert!(!t.contains("utilization_mean"), "{t}");
        assert!(t.ends_with("# EOF\n"));
        s.clear();
        assert!(s.body(Format::Text, &labels).is_none());
    }

    #[test]
    fn at_the_cap_the_connection_idle_longest_makes_room() {
        let mut c = Conns::default();
        let a = c.admit(3, 0);
        let b = c.admit(3, 10);
        let d = c.admit(3, 20);
        // `a` asked for a scrape since: `b` is now the one idle longest.
        a.since_ms.store(30, Ordering::Relaxed);
        let e = c.admit(3, 40);
        let open = |c: &Conns, x: &Arc<Conn>| c.open.iter().any(|o| Arc::ptr_eq(o, x));
        assert!(!open(&c, &b) && open(&c, &a) && open(&c, &d) && open(&c, &e));
        assert_eq!((c.open.len(), c.evicted), (3, 1));
        // `b` was told to close (the wake-up is kept for a task not waiting yet); no other was.
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let told = |x: &Arc<Conn>| {
            rt.block_on(async {
                tokio::time::timeout(Duration::from_millis(10), x.evict.notified()).await.is_ok()
            })
        };
        assert!(told(&b));
        assert!(!told(&a) && !told(&d) && !told(&e));
        // A connection that ends leaves; the next one then needs no room.
        c.remove(&d);
        let _f = c.admit(3, 50);
        assert_eq!((c.open.len(), c.evicted), (3, 1));
        // Out of descriptors: the one idle longest (`a`, 30) goes.
        assert!(c.evict_idlest());
        assert!(!open(&c, &a));
        assert!(!Conns::default().evict_idlest());
    }

    #[test]
    fn the_endpoint_holds_at_most_a_quarter_of_the_file_limit() {
        assert_eq!(connection_cap(None), MAX_CONNECTIONS);
        assert_eq!(connection_cap(Some(1 << 20)), MAX_CONNECTIONS);
        assert_eq!(connection_cap(Some(64)), 16);
        assert_eq!(connection_cap(Some(2)), 1);
    }
}
