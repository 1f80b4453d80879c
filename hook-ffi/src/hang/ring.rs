//! The step ring and the event ring: a bounded in-memory record of the last step begins and
//! ends, and of the last complete events, written by the trainer's threads without a lock
//! (docs/formats.md, "Hang and crash dumps"), and the median step read back from it.

use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU32, AtomicU64, Ordering::*};

use trainprof_output::protocol::dump as dk;

use super::RING;
use crate::types::TrainprofMode;

/// What a ring entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum What {
    StepStart = 1,
    StepEnd = 2,
    /// A complete event (a phase's span: `record`), in [`super::Hang::events`].
    Event = 3,
}

impl What {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            What::StepStart => dk::RING_STEP_START,
            What::StepEnd => dk::RING_STEP_END,
            What::Event => dk::RING_EVENT,
        }
    }

    fn from_u8(v: u8) -> Option<What> {
        match v {
            1 => Some(What::StepStart),
            2 => Some(What::StepEnd),
            3 => Some(What::Event),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// The entry's index + 1 once written, 0 while being written.
    seq: AtomicU64,
    t_us: AtomicI64,
    what: AtomicU8,
    mode: AtomicU8,
    step: AtomicI64,
    /// An event's end, phase and name ids ([`What::Event`] only).
    end_us: AtomicI64,
    phase: AtomicU32,
    name: AtomicU32,
}

/// One entry, as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub t_us: i64,
    pub what: What,
    pub mode: TrainprofMode,
    pub step: i64,
    /// [`What::Event`]: its end and its phase and name ids.
    pub end_us: i64,
    pub phase: u32,
    pub name: u32,
}

impl Entry {
    pub(super) const EMPTY: Entry = Entry {
        t_us: 0,
        what: What::StepStart,
        mode: TrainprofMode::Train,
        step: 0,
        end_us: 0,
        phase: 0,
        name: 0,
    };
}

/// The last [`RING`] step events, written by any thread without a lock; a reader skips an
/// entry that is being overwritten while it reads it.
#[derive(Debug)]
pub struct Ring {
    head: AtomicU64,
    slots: Box<[Slot]>,
}

impl Default for Ring {
    fn default() -> Ring {
        Ring { head: AtomicU64::new(0), slots: (0..RING).map(|_| Slot::default()).collect() }
    }
}

impl Ring {
    /// The hot path: one `fetch_add` and five stores.
    pub fn push(&self, what: What, mode: TrainprofMode, step: i64, t_us: i64) {
        self.put(what, mode, step, t_us, (0, 0, 0));
    }

    /// A complete event (`start_us`..`end_us`, phase and name ids): one `fetch_add` and
    /// eight stores.
    pub fn push_event(&self, phase: u32, name: u32, start_us: i64, end_us: i64, step: i64) {
        self.put(What::Event, TrainprofMode::Train, step, start_us, (end_us, phase, name));
    }

    fn put(&self, what: What, mode: TrainprofMode, step: i64, t_us: i64, event: (i64, u32, u32)) {
        let i = self.head.fetch_add(1, Relaxed);
        let s = &self.slots[(i % RING as u64) as usize];
        s.seq.store(0, Relaxed);
        std::sync::atomic::fence(Release);
        s.t_us.store(t_us, Relaxed);
        s.what.store(what as u8, Relaxed);
        s.mode.store(mode as u8, Relaxed);
        s.step.store(step, Relaxed);
        if what == What::Event {
            s.end_us.store(event.0, Relaxed);
            s.phase.store(event.1, Relaxed);
            s.name.store(event.2, Relaxed);
        }
        s.seq.store(i + 1, Release);
    }

    /// Copies the entries, oldest first, into `out` (no allocation: usable in a signal
    /// handler); returns how many.
    pub fn snapshot(&self, out: &mut [Entry; RING]) -> usize {
        let head = self.head.load(Acquire);
        let first = head.saturating_sub(RING as u64);
        let mut n = 0;
        for i in first..head {
            let s = &self.slots[(i % RING as u64) as usize];
            if s.seq.load(Acquire) != i + 1 {
                continue;
            }
            let e = (s.t_us.load(Relaxed), s.what.load(Relaxed), s.mode.load(Relaxed), s.step.load(Relaxed));
            let ev = (s.end_us.load(Relaxed), s.phase.load(Relaxed), s.name.load(Relaxed));
            std::sync::atomic::fence(Acquire);
            if s.seq.load(Relaxed) != i + 1 {
                continue;
            }
            if let (Some(what), Some(mode)) = (What::from_u8(e.1), TrainprofMode::from_i32(i32::from(e.2))) {
                out[n] = Entry { t_us: e.0, what, mode, step: e.3, end_us: ev.0, phase: ev.1, name: ev.2 };
                n += 1;
            }
        }
        n
    }
}

/// The median duration (s) of the completed steps of `mode` in `entries` (a start followed
/// by the end of the same step).
pub fn median_step_s(entries: &[Entry], mode: TrainprofMode) -> Option<f64> {
    let mut d: Vec<i64> = entries
        .windows(2)
        .filter(|w| {
            w[0].what == What::StepStart
                && w[1].what == What::StepEnd
                && w[0].mode == mode
                && w[1].mode == mode
                && w[0].step == w[1].step
        })
        .map(|w| w[1].t_us - w[0].t_us)
        .collect();
    if d.is_empty() {
        return None;
    }
    d.sort_unstable();
    Some(d[d.len() / 2] as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_entries_oldest_first_and_the_median_pairs_steps() {
        let r = Ring::default();
        for s in 0..300 {
            r.push(What::StepStart, TrainprofMode::Train, s, s * 100);
            r.push(What::StepEnd, TrainprofMode::Train, s, s * 100 + 10 + (s % 3));
        }
        let mut out = [Entry::EMPTY; RING];
        let n = r.snapshot(&mut out);
        assert_eq!(n, RING);
        assert_eq!(out[0].step, 300 - 128);
        assert_eq!(out[n - 1].what, What::StepEnd);
        assert_eq!(median_step_s(&out[..n], TrainprofMode::Train), Some(11e-6));
        assert_eq!(median_step_s(&out[..n], TrainprofMode::Eval), None);
    }

    /// Events go to their own ring: a burst of them leaves the steps (and the median) alone.
    #[test]
    fn events_keep_their_ids_and_times_and_leave_the_steps_alone() {
        let (steps, events) = (Ring::default(), Ring::default());
        steps.push(What::StepStart, TrainprofMode::Train, 3, 100);
        for i in 0..1000 {
            events.push_event(7, 8 + i, 100 + i64::from(i), 101 + i64::from(i), 3);
        }
        let mut out = [Entry::EMPTY; RING];
        assert_eq!(steps.snapshot(&mut out), 1);
        let n = events.snapshot(&mut out);
        assert_eq!(n, RING);
        let last = out[n - 1];
        assert_eq!(
            (last.what, last.phase, last.name, last.t_us, last.end_us, last.step),
            (What::Event, 7, 1007, 1099, 1100, 3)
        );
    }

    #[test]
    fn a_wrapped_ring_gives_the_last_entries_in_the_order_they_were_pushed() {
        let r = Ring::default();
        let pushed = RING as i64 + 37;
        for i in 0..pushed {
            r.push(What::StepStart, TrainprofMode::Eval, i, 1000 + i);
        }
        let mut out = [Entry::EMPTY; RING];
        let n = r.snapshot(&mut out);
        assert_eq!(n, RING, "full, not more");
        let steps: Vec<i64> = out[..n].iter().map(|e| e.step).collect();
        let want: Vec<i64> = (pushed - RING as i64..pushed).collect();
        assert_eq!(steps, want, "the last RING entries, oldest first");
        assert!(out[..n].iter().all(|e| e.t_us == 1000 + e.step && e.mode == TrainprofMode::Eval));
        // Before it wraps: every entry, in order.
        let r = Ring::default();
        for i in 0..5 {
            r.push(if i % 2 == 0 { What::StepStart } else { What::StepEnd }, TrainprofMode::Train, i / 2, i);
        }
        let n = r.snapshot(&mut out);
        assert_eq!(n, 5);
        assert_eq!(out[..n].iter().map(|e| e.t_us).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert_eq!(out[4].what, What::StepStart);
    }

    #[test]
    fn the_median_step_pairs_a_start_with_the_end_of_the_same_step_and_mode() {
        let e = |what, mode, step, t_us| Entry { t_us, what, mode, step, ..Entry::EMPTY };
        use TrainprofMode::{Eval, Train};
        use What::{StepEnd as End, StepStart as Start};
        let entries = [
            e(Start, Train, 0, 0),
            e(End, Train, 0, 3_000_000),
            e(Start, Train, 1, 4_000_000),
            e(End, Train, 1, 5_000_000),
            // An eval step between: not a train step.
            e(Start, Eval, 0, 6_000_000),
            e(End, Eval, 0, 16_000_000),
            // A start whose end is another step's: not a step.
            e(Start, Train, 2, 17_000_000),
            e(End, Train, 3, 99_000_000),
            e(Start, Train, 4, 100_000_000),
            e(End, Train, 4, 102_000_000),
            // Open: no end yet.
            e(Start, Train, 5, 103_000_000),
        ];
        // Train steps of 3, 1 and 2 s: the median is 2 s.
        assert_eq!(median_step_s(&entries, Train), Some(2.0));
        assert_eq!(median_step_s(&entries, Eval), Some(10.0));
        assert_eq!(median_step_s(&entries, TrainprofMode::Predict), None);
        // An even count takes the upper of the two middle ones.
        assert_eq!(median_step_s(&entries[..4], Train), Some(3.0));
        assert_eq!(median_step_s(&[], Train), None);
    }
}
