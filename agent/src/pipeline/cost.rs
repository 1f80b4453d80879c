//! The agent's account of its own CPU time, per part (docs/formats.md, "The agent's own
//! cost"): thread CPU clocks (`CLOCK_THREAD_CPUTIME_ID`) read around the work.
//!
//! Each thread that enrolls ([`enroll`]) has a part of its own (the sampling thread: the
//! loop; the uploader: the upload; …); a [`span`] charges the time since the last read to the
//! part that was running and starts its own, and its end charges it and gives the thread back
//! to the part it interrupted. The parts of a thread are therefore exclusive: their sum is
//! the thread's CPU time, and over every enrolled thread, the process's.
//!
//! A read of the clock is a system call (0.2 to 2 µs), and a tick makes about ten spans per
//! GPU, so not every tick is timed in full: the loop times every part on one tick in
//! [`TIMED_EVERY`] (from the second, and the last), and on the others only the slow NVML calls
//! ([`always_timed`]) and the tick's start. The rest of such a tick is one sum, shared out at
//! the end among the parts it ran, each in proportion to its time per call on the timed ticks
//! times its calls on the others (every call is counted, timed or not). That keeps the
//! accounting's own cost near one read per tick; [`Snapshot::accounting_ns`] says what it was.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use trainprof_output::protocol::agent_cost::Part;

/// One tick in this many is timed in full.
pub const TIMED_EVERY: u64 = 8;

const N: usize = Part::ALL.len();
/// The slot of a tick's time outside its timed spans, shared out at the end.
const UNSPLIT: u8 = N as u8;
/// A thread that did not enroll: nothing is charged between its spans.
const NONE: u8 = u8::MAX;

/// The counters: one for the process ([`GLOBAL`]); a test makes its own for its thread.
#[derive(Debug)]
pub struct Account {
    /// Timed ns per part (and the unsplit time at [`UNSPLIT`]).
    ns: [AtomicU64; N + 1],
    /// Calls per part, and the calls of them that were timed.
    calls: [AtomicU64; N],
    timed_calls: [AtomicU64; N],
    reads: AtomicU64,
    ticks: AtomicU64,
    timed_ticks: AtomicU64,
}

impl Account {
    pub const fn new() -> Account {
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO: AtomicU64 = AtomicU64::new(0);
        Account {
            ns: [ZERO; N + 1],
            calls: [ZERO; N],
            timed_calls: [ZERO; N],
            reads: ZERO,
            ticks: ZERO,
            timed_ticks: ZERO,
        }
    }
}

impl Default for Account {
    fn default() -> Account {
        Account::new()
    }
}

/// The process's account.
pub static GLOBAL: Account = Account::new();

thread_local! {
    /// The part running on this thread, and the clock at the last read.
    static CURRENT: Cell<u8> = const { Cell::new(NONE) };
    static SINCE: Cell<u64> = const { Cell::new(0) };
    /// False on a tick that times only the slow calls.
    static DETAIL: Cell<bool> = const { Cell::new(true) };
    /// The account this thread charges.
    static ACCOUNT: Cell<&'static Account> = const { Cell::new(&GLOBAL) };
}

/// Makes this thread charge `account` (tests).
#[cfg(test)]
pub fn use_account(account: &'static Account) {
    ACCOUNT.set(account);
}

/// NVML calls of a millisecond or more, timed on every tick they run.
pub fn always_timed(part: Part) -> bool {
    matches!(
        part,
        Part::NvmlUtilizationSamples | Part::NvmlFields | Part::NvmlGpm | Part::NvmlProcessUtilization
    )
}

/// This thread's CPU time, ns.
fn clock_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// Charges the time since the last read to the running part and makes `to` the running one;
/// returns the part that was running.
fn switch(to: u8) -> u8 {
    let now = clock_ns();
    let a = ACCOUNT.get();
    a.reads.fetch_add(1, Relaxed);
    let was = CURRENT.replace(to);
    let since = SINCE.replace(now);
    if let Some(slot) = a.ns.get(usize::from(was)) {
        slot.fetch_add(now.saturating_sub(since), Relaxed);
    }
    was
}

/// Makes `part` this thread's own: its time outside spans is charged to it from now on.
pub fn enroll(part: Part) {
    STARTED.get_or_init(std::time::Instant::now);
    if CURRENT.get() == NONE {
        // From the thread's start: all its time is the part's (the main thread's includes
        // the process's start).
        CURRENT.set(part.slot() as u8);
        SINCE.set(0);
        switch(part.slot() as u8);
    } else {
        switch(part.slot() as u8);
    }
}

/// Charges this thread's time so far (a thread that runs long without spans calls it now and
/// then, so that its part is current).
pub fn flush() {
    let c = CURRENT.get();
    if c != NONE {
        switch(c);
    }
}

/// The sampling loop, at the start of a tick: whether this tick times every part.
pub fn tick_begin(timed: bool) {
    let a = ACCOUNT.get();
    a.ticks.fetch_add(1, Relaxed);
    if timed {
        a.timed_ticks.fetch_add(1, Relaxed);
    }
    DETAIL.set(timed);
    if CURRENT.get() != NONE {
        switch(if timed { Part::Loop.slot() as u8 } else { UNSPLIT });
    }
}

/// A part's work on this thread, until the value is dropped.
#[must_use = "the span ends when dropped"]
#[derive(Debug)]
pub struct Span {
    /// The part it interrupted, when timed.
    prev: Option<u8>,
    part: Part,
}

/// Starts `part`'s span: counted always, timed on a timed tick (or a slow call).
pub fn span(part: Part) -> Span {
    ACCOUNT.get().calls[part.slot()].fetch_add(1, Relaxed);
    if !DETAIL.get() && !always_timed(part) {
        return Span { prev: None, part };
    }
    Span { prev: Some(switch(part.slot() as u8)), part }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(prev) = self.prev {
            switch(prev);
            ACCOUNT.get().timed_calls[self.part.slot()].fetch_add(1, Relaxed);
        }
    }
}

/// What one clock read costs on this machine, ns (measured once).
pub fn read_cost_ns() -> f64 {
    static COST: OnceLock<f64> = OnceLock::new();
    *COST.get_or_init(|| {
        const READS: u32 = 64;
        let start = clock_ns();
        let mut last = start;
        for _ in 0..READS {
            last = std::hint::black_box(clock_ns());
        }
        last.saturating_sub(start) as f64 / f64::from(READS)
    })
}

/// Every part's CPU time so far, the unsplit time shared out.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Per part ([`Part::slot`]): ns, calls, µs per timed call.
    pub ns: [u64; N],
    pub calls: [u64; N],
    pub us_per_call: [Option<f64>; N],
    pub ticks: u64,
    pub timed_ticks: u64,
    pub reads: u64,
}

impl Snapshot {
    /// What the reads cost, by one read's measured cost.
    pub fn accounting_ns(&self) -> f64 {
        self.reads as f64 * read_cost_ns()
    }

    /// The parts' sum, ns.
    pub fn total_ns(&self) -> u64 {
        self.ns.iter().sum()
    }

    /// Parts with time or calls, largest first.
    pub fn largest(&self) -> Vec<(Part, u64)> {
        let mut v: Vec<(Part, u64)> =
            Part::ALL.into_iter().map(|p| (p, self.ns[p.slot()])).filter(|&(_, ns)| ns > 0).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

/// The process's account so far.
pub fn snapshot() -> Snapshot {
    GLOBAL.snapshot()
}

impl Account {
    /// This account so far.
    pub fn snapshot(&self) -> Snapshot {
        let timed: [u64; N] = std::array::from_fn(|i| self.ns[i].load(Relaxed));
        let calls: [u64; N] = std::array::from_fn(|i| self.calls[i].load(Relaxed));
        let timed_calls: [u64; N] = std::array::from_fn(|i| self.timed_calls[i].load(Relaxed));
        let ticks = self.ticks.load(Relaxed);
        let timed_ticks = self.timed_ticks.load(Relaxed);
        let unsplit = self.ns[usize::from(UNSPLIT)].load(Relaxed);
        Snapshot {
            ns: share_out(&timed, &calls, &timed_calls, unsplit, (ticks, timed_ticks)),
            calls,
            us_per_call: std::array::from_fn(|i| {
                (timed_calls[i] > 0).then(|| timed[i] as f64 / timed_calls[i] as f64 / 1e3)
            }),
            ticks,
            timed_ticks,
            reads: self.reads.load(Relaxed),
        }
    }
}

/// The parts' time with `unsplit` shared out among the parts that ran untimed, each in
/// proportion to its time per timed call × its untimed calls (the loop's calls are ticks).
/// Without any timed measure of them, the loop takes it all.
fn share_out(
    timed: &[u64; N],
    calls: &[u64; N],
    timed_calls: &[u64; N],
    unsplit: u64,
    (ticks, timed_ticks): (u64, u64),
) -> [u64; N] {
    let mut out = *timed;
    let weight = |i: usize| -> f64 {
        let (all, done) =
            if i == Part::Loop.slot() { (ticks, timed_ticks) } else { (calls[i], timed_calls[i]) };
        if done == 0 || all <= done {
            return 0.0;
        }
        timed[i] as f64 / done as f64 * (all - done) as f64
    };
    let weights: [f64; N] = std::array::from_fn(weight);
    let sum: f64 = weights.iter().sum();
    if unsplit == 0 {
        return out;
    }
    if sum <= 0.0 {
        out[Part::Loop.slot()] += unsplit;
        return out;
    }
    let mut given = 0;
    for (i, w) in weights.iter().enumerate() {
        let share = (unsplit as f64 * w / sum) as u64;
        out[i] += share;
        given += share;
    }
    // What rounding left.
    out[Part::Loop.slot()] += unsplit.saturating_sub(given);
    out
}

/// When the process began accounting (the first [`enroll`]).
static STARTED: OnceLock<std::time::Instant> = OnceLock::new();

/// Seconds since the first [`enroll`].
pub fn wall_s() -> f64 {
    STARTED.get().map_or(0.0, |t| t.elapsed().as_secs_f64())
}

/// The process's CPU time (user + system, µs) and its peak resident set (bytes), from
/// `getrusage`.
pub fn process_usage() -> (u64, u64) {
    // SAFETY: getrusage writes into the zeroed struct we own.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return (0, 0);
        }
        let us = |tv: libc::timeval| {
            (tv.tv_sec as u64).saturating_mul(1_000_000).saturating_add(tv.tv_usec as u64)
        };
        (us(ru.ru_utime) + us(ru.ru_stime), (ru.ru_maxrss as u64).saturating_mul(1024))
    }
}

/// What the loop knows that the record carries.
#[derive(Debug, Clone, Copy, Default)]
pub struct Context {
    pub interval_ms: u64,
    pub gpus: u32,
}

/// The record of the process so far (docs/formats.md, "The agent's own cost").
pub fn record(node: &str, cx: Context) -> trainprof_output::protocol::agent_cost::AgentCost {
    use trainprof_output::protocol::agent_cost::{AgentCost, PartCost};
    flush();
    let snap = snapshot();
    let (cpu_us, peak_rss_bytes) = process_usage();
    let timestamp =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let parts = snap
        .largest()
        .into_iter()
        .map(|(p, ns)| PartCost {
            part: p.as_str().to_owned(),
            seconds: ns as f64 / 1e9,
            calls: snap.calls[p.slot()],
            us_per_call: snap.us_per_call[p.slot()],
        })
        .collect();
    AgentCost {
        node: node.to_owned(),
        timestamp,
        wall_s: wall_s(),
        cpu_s: cpu_us as f64 / 1e6,
        peak_rss_bytes,
        ticks: snap.ticks,
        interval_ms: cx.interval_ms,
        timed_ticks: snap.timed_ticks,
        gpus: cx.gpus,
        clock_reads: snap.reads,
        accounting_s: snap.accounting_ns() / 1e9,
        parts,
    }
}

/// The run's line (docs/formats.md, "The agent's own cost"): the share of a core and the
/// largest parts.
pub fn line(r: &trainprof_output::protocol::agent_cost::AgentCost) -> String {
    let cpu = r.cpu_s.max(1e-9);
    let top: Vec<String> =
        r.parts.iter().take(5).map(|p| format!("{} {:.0} %", p.part, p.seconds / cpu * 100.0)).collect();
    format!(
        "agent cost: {:.2} % of a core ({:.1} ms CPU in {:.1} s); largest parts: {}; accounted {:.0} %, the accounting itself {:.2} %",
        r.core_percent(),
        r.cpu_s * 1e3,
        r.wall_s,
        top.join(", "),
        r.parts_s() / cpu * 100.0,
        r.accounting_s / cpu * 100.0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn burn(ns: u64) {
        let until = clock_ns() + ns;
        while clock_ns() < until {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn share_out_follows_time_per_call_and_sums_exactly() {
        let mut timed = [0u64; N];
        let mut calls = [0u64; N];
        let mut timed_calls = [0u64; N];
        // Timed: cpu 10 µs a call (1 of 4 calls timed), gpu 30 µs (1 of 4), fields 1000 (all).
        timed[Part::SamplerCpu.slot()] = 10_000;
        calls[Part::SamplerCpu.slot()] = 4;
        timed_calls[Part::SamplerCpu.slot()] = 1;
        timed[Part::SamplerGpu.slot()] = 30_000;
        calls[Part::SamplerGpu.slot()] = 4;
        timed_calls[Part::SamplerGpu.slot()] = 1;
        timed[Part::NvmlFields.slot()] = 1_000_000;
        calls[Part::NvmlFields.slot()] = 1;
        timed_calls[Part::NvmlFields.slot()] = 1;
        let out = share_out(&timed, &calls, &timed_calls, 120_000, (4, 1));
        assert_eq!(out[Part::SamplerCpu.slot()], 40_000);
        assert_eq!(out[Part::SamplerGpu.slot()], 120_000);
        assert_eq!(out[Part::NvmlFields.slot()], 1_000_000);
        assert_eq!(out.iter().sum::<u64>(), timed.iter().sum::<u64>() + 120_000);
        // Nothing timed yet: the loop takes it.
        let out = share_out(&[0; N], &calls, &[0; N], 5, (4, 0));
        assert_eq!(out[Part::Loop.slot()], 5);
    }

    /// Spans on an enrolled thread: exclusive, nested ones charged to themselves, and the
    /// untimed ticks' time shared out (a thread of its own: the counters are global, so the
    /// test reads differences).
    #[test]
    fn spans_charge_their_own_time() {
        std::thread::spawn(|| {
            let account: &'static Account = Box::leak(Box::default());
            use_account(account);
            let before = account.snapshot();
            enroll(Part::Loop);
            for tick in 0..8u64 {
                tick_begin(tick % 4 == 0);
                {
                    let _gpu = span(Part::SamplerGpu);
                    burn(200_000);
                    let _q = span(Part::NvmlFields);
                    burn(1_000_000);
                }
            }
            flush();
            let after = account.snapshot();
            let d = |p: Part| after.ns[p.slot()] - before.ns[p.slot()];
            let fields = d(Part::NvmlFields);
            let gpu = d(Part::SamplerGpu);
            assert!((7_000_000..10_000_000).contains(&fields), "{fields}");
            assert!((1_200_000..2_400_000).contains(&gpu), "{gpu}");
            assert_eq!(after.calls[Part::SamplerGpu.slot()] - before.calls[Part::SamplerGpu.slot()], 8);
            let per_call = after.us_per_call[Part::NvmlFields.slot()].unwrap();
            assert!((900.0..1300.0).contains(&per_call), "{per_call}");
        })
        .join()
        .unwrap();
    }
}
