//! The words and line formats that one process writes and another reads, in one place so
//! that a rename cannot compile on one side only (`docs/formats.md`; `ARCHITECTURE.md`,
//! "The protocol"):
//!
//! * [`metric`]: the system metrics' vocabulary (every `Type`, `Name` and `Dimension` the
//!   agent's samplers write and the report matches), and the formats of the Names that are
//!   data (`cpu3`, `gpu0`, `device0`, `pid42-python`);
//! * [`system_line`]: one line of a system metrics file, written by the agent and read
//!   back, with bounded memory, by the report;
//! * [`timeline`]: the names, phases and argument keys of the timeline events the hook
//!   writes and the report reads, the anomaly trigger's among them;
//! * [`timeline_event`]: one timeline event as every reader decodes it, with its bounds and
//!   checks (the report's files, the agent's progress and repair);
//! * [`node_record`]: the agent's record of a node's GPUs, written once when it starts
//!   sampling and read back by the report;
//! * [`agent_cost`]: what the agent cost, per part, written at the end of sampling and read
//!   back by the report;
//! * [`hook_cost`]: what the hook cost its trainer, per rank and kind of entry, written when
//!   the hook shuts down and read back by the report;
//! * [`host_record`]: the agent's record of the host around a stall, read back by the report;
//! * [`dump`]: the hook's hang and crash dumps (folder and file names, `stall.json` and
//!   `ended.json` keys, the dump kinds, the check that a `stall.json` is the hook's record);
//! * [`memory_snapshot`]: the PyTorch memory snapshots' folder and file names;
//! * [`native_window`]: the native profiler's window folder names and files;
//! * [`python_window`]: the Python profiler's window folders: profilers, stats files, modes
//!   and phases.
//! * [`request`]: on-demand windows (`trainprof trigger`): the request folder, its files
//!   and their strict parsers, the start step every rank takes.
//! * [`request_s3`]: the same exchange for every node of a job through its S3 prefix
//!   (`trainprof trigger s3://…`, relayed by the agents of `run --s3-triggers`): the keys,
//!   the node's answer, the bounds of a poll.
//!
//! No other crate spells these words: `output/tests/protocol_home.rs` reads the other
//! crates' sources and fails on a literal that does.

/// Defines one `pub const` per word and `$all`, the list of them all (for the test that
/// looks for the words outside this module), so that a word cannot be left out of it.
macro_rules! words {
    ($(#[$all_doc:meta])* $all:ident; $($(#[$doc:meta])* $id:ident = $word:literal,)*) => {
        $($(#[$doc])* pub const $id: &str = $word;)*
        $(#[$all_doc])*
        pub const $all: &[&str] = &[$($id),*];
    };
}

pub mod agent_cost;
pub mod decimal;
pub mod dump;
pub mod hook_cost;
pub mod host_record;
pub mod memory_snapshot;
pub mod metric;
pub mod native_window;
pub mod node_record;
pub mod python_window;
pub mod request;
pub mod request_s3;
pub mod system_line;
pub mod timeline;
pub mod timeline_event;
pub mod torch_trace;
