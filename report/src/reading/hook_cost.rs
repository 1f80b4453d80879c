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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_record_of_each_rank_and_no_hostile_one() {
        let tmp = tempfile::tempdir().unwrap();
        let put = |rank: &str, us: u64, text: &str| {
            let d = tmp.path().join(hook_cost::FOLDER).join(rank);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(hook_cost::file_name(us)), text).unwrap();
        };
        let good = |steps: u64| {
            format!(
                r#"{{"NodeId":"forged","Timestamp":1.0,"WallSeconds":2.0,"Steps":{steps},"EventsWritten":1,"EventsDropped":0,"BytesWritten":10,"Parts":[{{"Part":"abi.step","Calls":2,"Seconds":0.001}}]}}"#
            )
        };
        put("0-algo-1", 1, &good(1));
        put("0-algo-1", 2, &good(2));
        // Hostile: an unknown part; a negative time; too large.
        put("1-algo-1", 1, &good(1).replace("abi.step", "abi.nope"));
        put("2-algo-1", 1, &good(1).replace("0.001", "-0.5"));
        put("3-algo-1", 1, &" ".repeat(hook_cost::MAX_BYTES as usize + 1));
        let dir = Dir::open_root(tmp.path(), false).unwrap();
        let mut skipped = Skipped::default();
        let got = read(&dir, &mut skipped);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["0-algo-1"], "{skipped:?}");
        let r = &got["0-algo-1"];
        assert_eq!((r.steps, r.node.as_str()), (2, "0-algo-1"), "the newest; the folder names the rank");
        assert_eq!(skipped.0.len(), 3, "{skipped:?}");
    }
}
