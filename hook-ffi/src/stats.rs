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

/// The hook's counters, declared once: the fields of [`Stats`], their names ([`Stats::NAMES`],
/// [`Stats::IN_C`]) and the conversion to the C struct all come from this one list. The first
/// group is `struct TrainprofStats` (`hook-ffi/src/types.rs`, the header), in its order: a
/// counter added there must be added here, or the conversion does not compile, and the header
/// is checked against [`Stats::IN_C`] (this file's tests; the Python package's ctypes mirror
/// against the header: `tests/hook/test_header.py`). The second group has no place in the C
/// struct, whose layout the ABI fixes: each has an export of its own.
macro_rules! counters {
    (
        in_c { $( $(#[$ca:meta])* $c:ident, )* }
        outside { $( $(#[$oa:meta])* $o:ident, )* }
    ) => {
        /// What happened to the events, at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Stats {
            $( $(#[$ca])* pub $c: u64, )*
            $( $(#[$oa])* pub $o: u64, )*
        }

        impl Stats {
            /// Every counter's name, the C struct's first (in its order).
            pub const NAMES: &[&str] = &[$( stringify!($c), )* $( stringify!($o), )*];
            /// The counters `struct TrainprofStats` holds, in its order.
            pub const IN_C: &[&str] = &[$( stringify!($c), )*];

            /// Every counter's value, in [`Stats::NAMES`]'s order.
            pub fn values(&self) -> Vec<u64> {
                vec![$( self.$c, )* $( self.$o, )*]
            }
        }

        impl From<Stats> for TrainprofStats {
            /// The C struct has the first group only (`trainprof_dropped_names` reports the
            /// other): its layout is fixed by the ABI.
            fn from(s: Stats) -> TrainprofStats {
                TrainprofStats { $( $c: s.$c, )* }
            }
        }
    };
}

counters! {
    in_c {
        /// Dropped on the trainer's thread because the queue was full.
        dropped_queue_full,
        /// Dropped by the writer (turned off after failed opens, or a file it could not
        /// write or seal), or left in the queue when the writer thread died.
        dropped_writer,
        written,
        files_sealed,
        /// Opens and seals that failed (they count toward `FileOpenFailThreshold`).
        open_failures,
    }
    outside {
        /// Dropped on the trainer's thread because they use a name that did not fit in the
        /// name table (`TRAINPROF_MAX_NAMES`).
        dropped_names,
    }
}

impl Stats {
    /// Events lost so far, for any reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_queue_full + self.dropped_writer + self.dropped_names
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
    /// Bytes of the timeline files sealed.
    bytes_sealed: AtomicU64,
}

impl Counters {
    /// The writer thread's counts, every one of them (the writer calls this alone).
    pub(crate) fn publish(&self, c: &Counts) {
        let Counts { written, dropped, files_sealed, open_failures, write_errors: _, bytes_sealed } = *c;
        self.bytes_sealed.store(bytes_sealed, Relaxed);
        self.written.store(written, Relaxed);
        self.dropped_writer.store(dropped, Relaxed);
        self.files_sealed.store(files_sealed, Relaxed);
        self.open_failures.store(open_failures, Relaxed);
    }

    /// Bytes of the timeline files sealed, as the writer last published them.
    pub(crate) fn bytes_sealed(&self) -> u64 {
        self.bytes_sealed.load(Relaxed)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `struct TrainprofStats`'s fields in the header, in order.
    fn header_fields() -> Vec<(String, String)> {
        let h = include_str!("../include/trainprof_hook.h");
        let start = h.find("typedef struct TrainprofStats {").unwrap();
        let end = start + h[start..].find("} TrainprofStats;").unwrap();
        let body = &h[start..end];
        let mut fields = Vec::new();
        let mut in_comment = false;
        for line in body.lines().skip(1).map(str::trim) {
            if line.starts_with("/*") {
                in_comment = !line.ends_with("*/");
                continue;
            }
            if in_comment {
                in_comment = !line.ends_with("*/");
                continue;
            }
            if let Some((ty, name)) = line.trim_end_matches(';').rsplit_once(' ') {
                fields.push((ty.to_owned(), name.to_owned()));
            }
        }
        fields
    }

    #[test]
    fn the_c_struct_is_the_first_group_in_the_headers_order() {
        let fields = header_fields();
        let names: Vec<&str> = fields.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(names, Stats::IN_C);
        assert!(fields.iter().all(|(ty, _)| ty == "uint64_t"), "{fields:?}");
        assert_eq!(std::mem::size_of::<TrainprofStats>(), 8 * Stats::IN_C.len());
        assert_eq!(&Stats::NAMES[..Stats::IN_C.len()], Stats::IN_C);
        // Each counter outside the C struct has an export of its own.
        let h = include_str!("../include/trainprof_hook.h");
        for name in &Stats::NAMES[Stats::IN_C.len()..] {
            assert!(h.contains(&format!("uint64_t trainprof_{name}(void);")), "trainprof_{name}");
        }
    }

    #[test]
    fn each_counter_lands_in_its_own_c_field() {
        // Distinct values, set through the fields the list declares.
        let s = Stats {
            dropped_queue_full: 1,
            dropped_writer: 2,
            written: 3,
            files_sealed: 4,
            open_failures: 5,
            dropped_names: 6,
        };
        assert_eq!(s.values(), [1, 2, 3, 4, 5, 6], "values() follows NAMES");
        let c = TrainprofStats::from(s);
        // SAFETY: TrainprofStats is repr(C) with only u64 fields (checked against the header
        // above), so it has the layout of a u64 array of that length.
        let raw: [u64; 5] = unsafe { std::mem::transmute::<TrainprofStats, [u64; 5]>(c) };
        assert_eq!(raw[..], s.values()[..Stats::IN_C.len()]);
    }
}
