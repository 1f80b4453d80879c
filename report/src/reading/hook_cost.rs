//! The hook's own cost records (`framework/cost/<node id>/<µs>.json`, docs/formats.md, "The
//! hook's own cost"): what "What profiling cost" says about each rank's hook. Read with
//! bounds, as everything the trainer's user could have written: the newest record of at most
//! [`MAX_RANKS`] ranks, each of at most [`hook_cost::MAX_BYTES`], checked by
//! [`hook_cost::parse`] (known parts only, each once, no negative or non-finite time).

use std::collections::BTreeMap;

use trainprof_output::fs::Dir;
use trainprof_output::protocol::hook_cost::{self, HookCost};

use crate::reading::{self, Skipped};

/// Ranks whose record is read at most per job.
pub const MAX_RANKS: usize = 65_536;
/// A rank's name is cut to this many bytes.
const MAX_WORD_BYTES: usize = 128;

/// rank (the folder's name) → its newest record (by its name's time); a rank whose hook
/// wrote none (an older hook, or one that never shut down) is absent.
pub fn read(dir: &Dir, skipped: &mut Skipped) -> BTreeMap<String, HookCost> {
    let newest = reading::newest_per_node(dir, hook_cost::FOLDER, MAX_RANKS, skipped);
    let mut out = BTreeMap::new();
    for (rank, rel) in newest {
        let bytes = match reading::read_file(dir, &rel, hook_cost::MAX_BYTES) {
            Ok(b) => b,
            Err(e) => {
                skipped.push(e);
                continue;
            }
        };
        let mut record = match hook_cost::parse(&bytes) {
            Ok(r) => r,
            Err(e) => {
                skipped.push(format!("{rel}: {e}"));
                continue;
            }
        };
        // The folder names the rank; the record's own NodeId is not trusted over it.
        let rank = reading::printable(&rank, MAX_WORD_BYTES);
        record.node = rank.clone();
        out.insert(rank, record);
    }
    out
}
