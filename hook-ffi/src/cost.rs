//! What the hook costs its trainer (docs/formats.md, "The hook's own cost"): the time the
//! trainer's threads spend inside each kind of export, from a pair of monotonic-clock reads
//! (`clock_gettime(CLOCK_MONOTONIC)` through the vDSO: no syscall) around the work, added to
//! relaxed atomics (no lock, no allocation: the hot path's contract, `lib.rs`); the Python
//! package's own entry points and window opens and closes, which it times itself and hands
//! over once, before it shuts the hook down (`trainprof_cost_add`). Written once per rank
//! when the hook shuts down: `framework/cost/<node id>/<µs>.json`, a new file
//! ([`fs::write_new`]), never replacing one.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use trainprof_output::fs::{self, Dir};
use trainprof_output::protocol::hook_cost::{self, HookCost, Part, PartCost};

use crate::hook::Hook;

const PARTS: usize = Part::ALL.len();

struct Slot {
    calls: AtomicU64,
    ns: AtomicU64,
}

static SLOTS: [Slot; PARTS] = [const { Slot { calls: AtomicU64::new(0), ns: AtomicU64::new(0) } }; PARTS];
static STEPS: AtomicU64 = AtomicU64::new(0);
/// The monotonic clock's zero: the first read (at `trainprof_init`).
static START: OnceLock<Instant> = OnceLock::new();

/// Marks the hook's start (the record's `WallSeconds` counts from here).
pub(crate) fn start() {
    let _ = START.get_or_init(Instant::now);
}

/// Times one call of `part` from its making to its drop (an export's work, whichever way
/// it returns).
/// A timed call stands for `weight` calls ([`record_timer`]; 1 otherwise).
pub(crate) struct Timer(Part, u64, Instant);

impl Timer {
    #[inline]
    pub(crate) fn new(part: Part) -> Timer {
        Timer::weighted(part, 1)
    }

    #[inline]
    fn weighted(part: Part, weight: u64) -> Timer {
        Timer(part, weight, Instant::now())
    }
}

impl Drop for Timer {
    #[inline]
    fn drop(&mut self) {
        let ns: u64 = self.2.elapsed().as_nanos().try_into().unwrap_or(u64::MAX);
        add(self.0, self.1, ns.saturating_mul(self.1));
    }
}

/// One call in this many of a thread's `trainprof_record` is timed (docs/formats.md, "The
/// hook's own cost"). Timing every call cost more than the call: two clock reads and two
/// atomics shared by every recording thread took `trainprof_record` from 54 to 125–152 ns a
/// call at the median (scripts/bench-hook, 1 and 4 threads; BENCHMARKS.md, "the hook's own
/// bill"); the other exports run a few times a step, and each of their calls is timed.
pub(crate) const RECORD_SAMPLE: u64 = 32;

thread_local! {
    /// This thread's `trainprof_record` calls so far (a plain thread-local: no atomic).
    static RECORD_CALLS: Cell<u64> = const { Cell::new(0) };
}

/// Times a `trainprof_record` call when it is its thread's first or a multiple of
/// [`RECORD_SAMPLE`] after it; its time then stands for the calls since the thread's previous
/// timed one ([`RECORD_SAMPLE`] of them, or 1 for the first). So a thread's last calls, up
/// to `RECORD_SAMPLE - 1`, are not counted.
pub(crate) fn record_timer() -> Option<Timer> {
    let n = RECORD_CALLS.with(|c| {
        let n = c.get();
        c.set(n.wrapping_add(1));
        n
    });
    if !n.is_multiple_of(RECORD_SAMPLE) {
        return None;
    }
    Some(Timer::weighted(Part::AbiRecord, if n == 0 { 1 } else { RECORD_SAMPLE }))
}

/// Adds `calls` and `ns` to `part`.
pub(crate) fn add(part: Part, calls: u64, ns: u64) {
    let s = &SLOTS[part.slot()];
    s.calls.fetch_add(calls, Relaxed);
    s.ns.fetch_add(ns, Relaxed);
}

/// One step begun.
pub(crate) fn step() {
    STEPS.fetch_add(1, Relaxed);
}

/// The record as it stands now, for `hook`.
pub(crate) fn record(hook: &Hook, now_s: f64) -> HookCost {
    let stats = hook.stats();
    let parts = Part::ALL
        .into_iter()
        .filter_map(|p| {
            let s = &SLOTS[p.slot()];
            let calls = s.calls.load(Relaxed);
            (calls > 0).then(|| PartCost {
                part: p.as_str().to_owned(),
                calls,
                seconds: s.ns.load(Relaxed) as f64 / 1e9,
            })
        })
        .collect();
    HookCost {
        node: hook.node_id().to_owned(),
        timestamp: now_s,
        wall_s: START.get().map_or(0.0, |t| t.elapsed().as_secs_f64()),
        steps: STEPS.load(Relaxed),
        events_written: stats.written,
        events_dropped: stats.dropped(),
        bytes_written: hook.bytes_sealed(),
        parts,
    }
}

/// Writes the record once, at shutdown (after the writer stopped: its counts are final).
/// A failure is one log line: the trainer goes on.
pub(crate) fn write(hook: &Hook) {
    let us = u64::try_from(crate::now_us()).unwrap_or(0);
    let r = record(hook, us as f64 / 1e6);
    let rel = format!("{}/{}", hook_cost::FOLDER, hook.node_id());
    let written =
        Dir::open_root(hook.local_path(), true).and_then(|root| root.sub(&rel, true)).and_then(|dir| {
            fs::write_new(
                &dir,
                &hook_cost::file_name(us),
                &std::process::id().to_string(),
                &hook_cost::to_bytes(&r),
            )
        });
    match written {
        Ok(true) => {}
        Ok(false) => {
            crate::log(&format_args!("the hook's cost record {rel}/{us}.json exists (not replaced)"))
        }
        Err(e) => crate::log(&format_args!("cannot write the hook's cost record under {rel}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_record_calls_are_timed_one_in_the_sample_each_standing_for_the_calls_since() {
        // A fresh thread counts its own calls from 0.
        std::thread::spawn(|| {
            let weights: Vec<(usize, u64)> = (0..2 * RECORD_SAMPLE as usize + 1)
                .filter_map(|i| record_timer().map(|t| (i, t.1)))
                .collect();
            // The first, then every RECORD_SAMPLE-th: 1 + 32 + 32 calls counted for 65 made.
            let n = RECORD_SAMPLE as usize;
            assert_eq!(weights, [(0, 1), (n, RECORD_SAMPLE), (2 * n, RECORD_SAMPLE)]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_timer_adds_a_call_and_its_time() {
        let before = SLOTS[Part::AbiName.slot()].calls.load(Relaxed);
        let ns_before = SLOTS[Part::AbiName.slot()].ns.load(Relaxed);
        {
            let _t = Timer::new(Part::AbiName);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(SLOTS[Part::AbiName.slot()].calls.load(Relaxed), before + 1);
        assert!(SLOTS[Part::AbiName.slot()].ns.load(Relaxed) - ns_before >= 2_000_000);
    }
}
