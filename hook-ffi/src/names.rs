//! The name table: phases, event names and argument keys travel through the queue as ids
//! (docs/trainer.md); this table gives them. Registration takes the table's
//! lock (never on the hot path); the hot path checks an id against one atomic count; the
//! writer copies only the names added since it last looked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::{Arc, Mutex};

use crate::lock;
use crate::types::TRAINPROF_NAME_OVER_LIMIT;

/// Default of `TRAINPROF_MAX_NAMES`: distinct names per process.
pub(crate) const MAX_NAMES_DEFAULT: usize = 65_536;

/// The bytes all names may take together, whatever their number: with the count limit,
/// the table's memory is bounded however long the names are.
pub(crate) const MAX_NAME_BYTES: usize = 16 << 20;

/// The names registered so far; an id is an index into them.
#[derive(Debug)]
pub(crate) struct Names {
    table: Mutex<NameTable>,
    /// How many names are registered: ids below it are valid. Read on the hot path.
    count: AtomicU32,
    /// The most names the table takes.
    max: usize,
}

#[derive(Debug, Default)]
struct NameTable {
    list: Vec<Arc<str>>,
    index: HashMap<Arc<str>, u32>,
    /// The bytes of all names in `list`.
    bytes: usize,
    /// Whether the table being full was logged.
    full_logged: bool,
}

impl Names {
    /// A table holding `first` (ids 0, 1, …, whatever `max` says) that takes at most `max`
    /// names in all.
    pub(crate) fn new<'a>(first: impl IntoIterator<Item = &'a str>, max: usize) -> Names {
        let mut t = NameTable::default();
        for name in first {
            let name: Arc<str> = Arc::from(name);
            t.index.insert(name.clone(), t.list.len() as u32);
            t.bytes += name.len();
            t.list.push(name);
        }
        let count = t.list.len() as u32;
        Names { table: Mutex::new(t), count: AtomicU32::new(count), max: max.max(count as usize) }
    }

    /// Registers `name` (idempotent) and returns its id; [`TRAINPROF_NAME_OVER_LIMIT`] when
    /// the table is full (`max` names, or [`MAX_NAME_BYTES`]): the table never grows past
    /// that, and events that use that id are dropped and counted.
    pub(crate) fn register(&self, name: &str) -> u32 {
        let mut t = lock(&self.table);
        if let Some(&id) = t.index.get(name) {
            return id;
        }
        if t.list.len() >= self.max || t.bytes.saturating_add(name.len()) > MAX_NAME_BYTES {
            if !t.full_logged {
                t.full_logged = true;
                crate::log(&format_args!(
                    "the name table is full ({} names, {} bytes; TRAINPROF_MAX_NAMES={}): events with new names are dropped and counted",
                    t.list.len(),
                    t.bytes,
                    self.max
                ));
            }
            return TRAINPROF_NAME_OVER_LIMIT;
        }
        let id = t.list.len() as u32;
        let name: Arc<str> = Arc::from(name);
        t.index.insert(name.clone(), id);
        t.bytes += name.len();
        t.list.push(name);
        self.count.store(id + 1, Release);
        id
    }

    /// Names registered so far.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Acquire) as usize
    }

    /// Is `id` a registered name? The hot path's check: one atomic load.
    pub(crate) fn valid(&self, id: u32) -> bool {
        id < self.count.load(Acquire)
    }

    /// Appends to `copy` the names registered since it was last brought up to date: the
    /// lock is held for those alone, never for a copy of the whole table (registration
    /// waits on it).
    pub(crate) fn copy_new(&self, copy: &mut Vec<Arc<str>>) {
        let t = lock(&self.table);
        copy.extend_from_slice(t.list.get(copy.len()..).unwrap_or_default());
    }

    /// Distinct names in the index (for tests: the index never outgrows the list).
    #[cfg(test)]
    pub(crate) fn indexed(&self) -> usize {
        lock(&self.table).index.len()
    }
}
