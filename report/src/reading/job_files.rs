//! The files of a job the report reads (`docs/report.md`), by their path relative to the
//! job's prefix: what `trainprof report s3://…` and `trainprof compare` download, and the
//! most of each they read.

use trainprof_output::protocol::{agent_cost, hook_cost, native_window, node_record};

/// Whether an S3 key (relative to the prefix) is a file the report reads: system files,
/// timelines, Python-stats files, native windows' profiles and flame graphs, NCCL Inspector's
/// files (not the TF
/// detailed profiles, which can be large), every component a plain name.
pub fn wanted(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    let kind = rel.starts_with("system/incremental/")
        || rel.starts_with("framework/pevents/")
        || is_stats(rel, name)
        || is_native(rel, name)
        || is_hang(rel, name)
        || is_node_record(rel, name)
        || is_inspector(rel, name)
        || is_agent_cost(rel, name)
        || is_hook_cost(rel, name);
    kind && !rel.ends_with(".tmp")
        && rel.split('/').all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
}

fn is_stats(rel: &str, name: &str) -> bool {
    rel.starts_with("framework/")
        && (rel.contains("/cprofile/") || rel.contains("/pyinstrument/"))
        && (name == "python_stats" || name == "python_stats.json")
}

fn is_native(rel: &str, name: &str) -> bool {
    rel.starts_with("framework/native/") && native_window::NativeFile::parse(name).is_some()
}

/// NCCL Inspector's file of one process, `nccl-inspector/<host>-pid<pid>.log`, or of one GPU in
/// its Prometheus mode, `nccl-inspector/nccl_inspector_metrics_<uuid>.prom` (docs/formats.md,
/// "NCCL Inspector"): put there by the user, never by the uploader.
fn is_inspector(rel: &str, name: &str) -> bool {
    rel.strip_prefix(crate::reading::inspector::FOLDER).is_some_and(|r| r.starts_with('/'))
        && rel.split('/').count() == 2
        && crate::reading::inspector::is_file_name(name)
}

/// The agent's node record, `system/node/<node>/<µs>.json` (docs/formats.md, "Node record").
fn is_node_record(rel: &str, name: &str) -> bool {
    rel.strip_prefix(node_record::FOLDER).is_some_and(|r| r.starts_with('/'))
        && rel.split('/').count() == 4
        && node_record::name_us(name).is_some()
}

/// The agent's cost record, `system/cost/<node>/<µs>.json` (docs/formats.md, "The agent's own
/// cost"); read up to [`agent_cost::MAX_BYTES`].
fn is_agent_cost(rel: &str, name: &str) -> bool {
    rel.strip_prefix(agent_cost::FOLDER).is_some_and(|r| r.starts_with('/'))
        && rel.split('/').count() == 4
        && node_record::name_us(name).is_some()
}

/// A rank's hook cost record, `framework/cost/<node id>/<µs>.json` (docs/formats.md, "The
/// hook's own cost"); read up to [`hook_cost::MAX_BYTES`].
fn is_hook_cost(rel: &str, name: &str) -> bool {
    rel.strip_prefix(hook_cost::FOLDER).is_some_and(|r| r.starts_with('/'))
        && rel.split('/').count() == 4
        && node_record::name_us(name).is_some()
}

/// A hang or crash dump's file (`framework/hangs/<node>/<folder>/<file>`) or the agent's record
/// of the host at a stall (`system/hangs/<node>/<name>.json`).
fn is_hang(rel: &str, name: &str) -> bool {
    let depth = rel.split('/').count();
    // Hidden folders (a crash's dump being written) are not the report's.
    let hidden = rel.split('/').any(|c| c.starts_with('.'));
    !hidden
        && (rel.starts_with("framework/hangs/")
            && depth == 5
            && crate::reading::dumps::DUMP_FILES.contains(&name))
        || (rel.starts_with("system/hangs/") && depth == 4 && name.ends_with(".json"))
}

/// The largest object under `rel` (a [`wanted`] key) worth fetching: the size the report
/// reads at most of that kind (docs/report.md, "Memory").
pub fn max_bytes(rel: &str) -> u64 {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    if is_stats(rel, name) {
        crate::reading::MAX_STATS_BYTES
    } else if is_native(rel, name) {
        crate::reading::native::MAX_FILE_BYTES
    } else if is_hang(rel, name) {
        crate::reading::dumps::MAX_STACKS_BYTES
    } else if is_inspector(rel, name) {
        crate::reading::inspector::MAX_FILE_BYTES
    } else if is_agent_cost(rel, name) {
        agent_cost::MAX_BYTES
    } else if is_hook_cost(rel, name) {
        hook_cost::MAX_BYTES
    } else {
        crate::reading::MAX_TIMELINE_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_profiler_keys_with_plain_components() {
        assert!(wanted("system/incremental/2026112203/1795316940.algo-1.json"));
        assert!(wanted("framework/pevents/2026112203/1_0-a_pythontimeline.json"));
        assert!(!wanted("framework/../../etc/passwd"));
        assert!(!wanted("system//x"));
        assert!(!wanted("report.html"));
        assert!(!wanted("system/training_job_end.ts"));
        assert!(!wanted("framework/x.json.1-1.tmp"));
        assert!(wanted(
            "framework/pytorch/cprofile/0-algo-1/train-1-stepstart-1.0_train-2-stepstart-2.0/python_stats"
        ));
        assert!(!wanted("framework/pytorch/cprofile/0-algo-1/w/python_stats.html"));
        assert!(wanted("framework/native/0-algo-1/1795400000000000-1795400001000000_7/profile.pb.gz"));
        assert!(wanted("framework/native/0-algo-1/1795400000000000-1795400001000000_7/flamegraph.svg"));
        assert!(!wanted(
            "framework/native/0-algo-1/1795400000000000-1795400001000000_7/.profile.pb.gz.7.tmp"
        ));
        assert!(!wanted("framework/tensorflow/detailed_profiling/2026112203/000000005/x.xplane.pb"));
        assert!(wanted("framework/hangs/0-algo-1/30-1795400001000000/stall.json"));
        assert!(wanted("framework/hangs/0-algo-1/30-1795400001000000/python_stacks.txt"));
        assert!(!wanted("framework/hangs/0-algo-1/30-1795400001000000/core"));
        assert!(!wanted("framework/hangs/0-algo-1/stall.json"));
        assert!(!wanted("framework/hangs/0-algo-1/.fatal-7/stall.json"));
        assert!(wanted("system/hangs/0-algo-1/30-1795400001000000.json"));
        assert!(!wanted("system/hangs/0-algo-1/x/30-1795400001000000.json"));
        assert!(wanted("system/node/algo-1/1795400001000000.json"));
        assert!(!wanted("system/node/algo-1/x/1795400001000000.json"));
        assert!(!wanted("system/node/algo-1/notes.json"));
        assert!(!wanted("system/nodes/algo-1/1795400001000000.json"));
        assert!(wanted("nccl-inspector/node-a-pid4242.log"));
        assert!(!wanted("nccl-inspector/node-a-pid4242.log.tmp"));
        assert!(!wanted("nccl-inspector/x/node-a-pid4242.log"));
        assert!(!wanted("nccl-inspector/notes.log"));
        assert!(!wanted("nccl-inspector/node-a-pidx.log"));
        assert!(wanted("system/cost/algo-1/1795400001000000.json"));
        assert!(!wanted("system/cost/algo-1/x/1795400001000000.json"));
        assert!(!wanted("system/cost/algo-1/notes.json"));
    }

    #[test]
    fn each_kind_is_read_up_to_its_own_bound() {
        assert_eq!(
            max_bytes("framework/pytorch/cprofile/0-algo-1/w/python_stats"),
            crate::reading::MAX_STATS_BYTES
        );
        assert_eq!(
            max_bytes("framework/native/0-algo-1/1795400000000000-1795400001000000_7/profile.pb.gz"),
            crate::reading::native::MAX_FILE_BYTES
        );
        assert_eq!(
            max_bytes("framework/hangs/0-algo-1/30-1795400001000000/python_stacks.txt"),
            crate::reading::dumps::MAX_STACKS_BYTES
        );
        assert_eq!(max_bytes("nccl-inspector/node-a-pid4242.log"), crate::reading::inspector::MAX_FILE_BYTES);
        assert_eq!(max_bytes("system/cost/algo-1/1795400001000000.json"), agent_cost::MAX_BYTES);
        assert!(wanted("framework/cost/0-algo-1/1795400001000000.json"));
        assert!(!wanted("framework/cost/0-algo-1/x.json"));
        assert_eq!(max_bytes("framework/cost/0-algo-1/1795400001000000.json"), hook_cost::MAX_BYTES);
        assert_eq!(max_bytes("framework/pevents/1/t.json"), crate::reading::MAX_TIMELINE_BYTES);
        assert_eq!(max_bytes("system/incremental/1/1.algo-1.json"), crate::reading::MAX_TIMELINE_BYTES);
    }
}
