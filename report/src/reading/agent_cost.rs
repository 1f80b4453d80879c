//! The agent's own cost records (`system/cost/<node>/<µs>.json`, docs/formats.md, "The
//! agent's own cost"): what "What profiling cost" says about the agent. Read with bounds, as
//! everything the trainer's user could have written: the newest record of at most
//! [`MAX_NODES`] nodes, each of at most [`agent_cost::MAX_BYTES`], at most [`MAX_PARTS`] parts
//! kept, every word shown printable.

use std::collections::BTreeMap;

use trainprof_output::fs::Dir;
use trainprof_output::protocol::agent_cost::{self, AgentCost};

use crate::reading::{self, Skipped};

/// Nodes whose record is read at most per job.
pub const MAX_NODES: usize = 4096;
/// Parts kept per record (the closed set has fewer: a planted record cannot grow the model).
pub const MAX_PARTS: usize = 64;
/// A node's name or a part's word is cut to this many bytes.
const MAX_WORD_BYTES: usize = 128;

/// node (the folder's name) → its newest record (by its name's time); a node without a
/// record (an agent older than the record) is absent.
pub fn read(dir: &Dir, skipped: &mut Skipped) -> BTreeMap<String, AgentCost> {
    // The records are named like the node records: `<µs>.json`.
    let newest = reading::newest_per_node(dir, agent_cost::FOLDER, MAX_NODES, skipped);
    let mut out = BTreeMap::new();
    for (node, rel) in newest {
        let bytes = match reading::read_file(dir, &rel, agent_cost::MAX_BYTES) {
            Ok(b) => b,
            Err(e) => {
                skipped.push(e);
                continue;
            }
        };
        let Some(mut record) = agent_cost::parse(&bytes) else {
            skipped.push(format!("{rel}: not an agent cost record"));
            continue;
        };
        let finite = |v: f64| if v.is_finite() && v >= 0.0 { v } else { 0.0 };
        record.wall_s = finite(record.wall_s);
        record.cpu_s = finite(record.cpu_s);
        record.accounting_s = finite(record.accounting_s);
        record.parts.truncate(MAX_PARTS);
        for p in &mut record.parts {
            p.part = reading::printable(&p.part, MAX_WORD_BYTES);
            p.seconds = finite(p.seconds);
            p.us_per_call = p.us_per_call.map(finite);
        }
        record.parts.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        // The folder names the node; the record's own NodeId is not trusted over it.
        let node = reading::printable(&node, MAX_WORD_BYTES);
        record.node = node.clone();
        out.insert(node, record);
    }
    out
}
