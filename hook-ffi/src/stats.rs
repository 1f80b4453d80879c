//! The hook's counters, kept in one place ([`Counters`]) and read in one place
//! ([`Counters::snapshot`], the [`Stats`] that `trainprof_stats` and the shutdown log line
//! report).
//!
//! Trainer threads count drops in [`ShardedCounter`]s (no two threads fight over one cache
//! line); the writer thread publishes its own [`Counts`] whole with
//! [`Counters::publish`], after every batch and after the final seal.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};

use crate::types::TrainprofStats;
use crate::writer::Counts;

/// What happened to the events, at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Dropped on the trainer's thread because the queue was full.
    pub dropped_queue_full: u64,
    /// Dropped by the writer (turned off after failed opens, or a file it could not
    /// write or seal), or left in the queue when the writer thread died.
    pub dropped_writer: u64,
    pub written: u64,
    pub files_sealed: u64,
    /// Opens and seals that failed (they count toward `FileOpenFailThreshold`).
    pub open_failures: u64,
    /// Dropped on the trainer's thread because they use a name that did not fit in the
    /// name table (`TRAINPROF_MAX_NAMES`).
    pub dropped_names: u64,
}

impl Stats {
    /// Events lost so far, for any reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full + self.dropped_writer + self.dropped_names
    }
}

impl From<Stats> for TrainprofStats {
    /// The C struct has no `dropped_names` (`trainprof_dropped_names` reports it): its
    /// layout is fixed by the ABI.
    fn from(s: Stats) -> TrainprofStats {
        TrainprofStats {
            dropped_queue_full: s.dropped_queue_full,
            dropped_writer: s.dropped_writer,
            written: s.written,
            files_sealed: s.files_sealed,
            open_failures: s.open_failures,
        }
    }
}

/// Every counter of one hook.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Events dropped because the queue was full.
    pub(crate) dropped_full: ShardedCounter,
    /// Events that used `TRAINPROF_NAME_OVER_LIMIT`.
    pub(crate) dropped_names: ShardedCounter,
    /// Events left in the queue when the writer thread died (a caught panic).
    pub(crate) dropped_writer_died: AtomicU64,
    /// The writer's own counts, as it last published them.
    written: AtomicU64,
    dropped_writer: AtomicU64,
    files_sealed: AtomicU64,
    open_failures: AtomicU64,
}

impl Counters {
    /// The writer thread's counts, every one of them (the writer calls this alone).
    pub(crate) fn publish(&self, c: &Counts) {
        let Counts { written, dropped, files_sealed, open_failures, write_errors: _ } = *c;
        self.written.store(written, Relaxed);
        self.dropped_writer.store(dropped, Relaxed);
        self.files_sealed.store(files_sealed, Relaxed);
        self.open_failures.store(open_failures, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            dropped_queue_full: self.dropped_full.sum(),
            dropped_writer: self.dropped_writer.load(Relaxed) + self.dropped_writer_died.load(Relaxed),
            written: self.written.load(Relaxed),
            files_sealed: self.files_sealed.load(Relaxed),
            open_failures: self.open_failures.load(Relaxed),
            dropped_names: self.dropped_names.sum(),
        }
    }
}

/// A counter split over cache lines, so that threads dropping events at the same time
/// do not fight over one line; each thread adds to its own slot (by a thread-local index).
#[derive(Debug, Default)]
pub(crate) struct ShardedCounter([PaddedU64; SHARDS]);

const SHARDS: usize = 16;

#[derive(Debug, Default)]
#[repr(align(128))]
struct PaddedU64(AtomicU64);

impl ShardedCounter {
    /// This thread's slot.
    pub(crate) fn slot() -> usize {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static SLOT: usize = NEXT.fetch_add(1, Relaxed) % SHARDS;
        }
        SLOT.try_with(|s| *s).unwrap_or(0)
    }

    /// The counter of `slot` (from [`ShardedCounter::slot`]).
    pub(crate) fn at(&self, slot: usize) -> &AtomicU64 {
        &self.0[slot % SHARDS].0
    }

    /// Adds one in this thread's slot.
    pub(crate) fn add_one(&self) {
        self.at(Self::slot()).fetch_add(1, Relaxed);
    }

    /// The total (slots add and subtract with wrapping, so the sum is exact).
    pub(crate) fn sum(&self) -> u64 {
        self.0.iter().fold(0u64, |a, c| a.wrapping_add(c.0.load(SeqCst)))
    }
}
