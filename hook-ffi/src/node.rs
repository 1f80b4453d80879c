//! The node id `<rank>-<host>` (docs/formats.md, "Node id") that names the timeline files and the
//! Python-stats folders: [`trainprof_output::node::TimelineNode`], with the resource config
//! read here (never blocking on a FIFO: the trainer's init must not hang).

use std::path::Path;

use trainprof_output::node::{ResourceConfig, TimelineNode};

pub use trainprof_output::node::{DEFAULT_RESOURCE_CONFIG, RANK_VARS, host_name};

/// The node id for this process, from `var` (the environment) and the files it names.
pub fn node_id(var: impl Fn(&str) -> Option<String>, pid: u32) -> String {
    let rc = read_resource_config(&ResourceConfig::path(&var));
    TimelineNode::from_env(rc.as_ref(), var, pid, host_name).into_string()
}

/// `current_host` from a resourceconfig.json, if the file exists and has one.
pub fn current_host(path: &Path) -> Option<String> {
    read_resource_config(path)?.current_host.filter(|h| !h.is_empty())
}

fn read_resource_config(path: &Path) -> Option<ResourceConfig> {
    ResourceConfig::parse(&trainprof_config::read_platform_file(path).ok()??)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn rank_and_current_host() {
        let dir = tempfile::tempdir().unwrap();
        let rc = dir.path().join("resourceconfig.json");
        std::fs::write(&rc, br#"{"current_host": "algo_1", "hosts": ["algo_1", "algo_2"]}"#).unwrap();
        let rc = rc.to_str().unwrap();
        assert_eq!(node_id(env(&[("RANK", "3"), ("TRAINPROF_RESOURCE_CONFIG", rc)]), 99), "3-algo-1");
        assert_eq!(node_id(env(&[("SLURM_PROCID", "7"), ("TRAINPROF_RESOURCE_CONFIG", rc)]), 99), "7-algo-1");
        // A variable that is not a number is skipped, as is a missing one.
        assert_eq!(
            node_id(
                env(&[("RANK", "x"), ("OMPI_COMM_WORLD_RANK", "2"), ("TRAINPROF_RESOURCE_CONFIG", rc)]),
                99
            ),
            "2-algo-1"
        );
        assert_eq!(node_id(env(&[("TRAINPROF_RESOURCE_CONFIG", rc)]), 99), "99-algo-1");
        assert_eq!(current_host(Path::new(rc)).as_deref(), Some("algo_1"));
    }

    #[test]
    fn host_name_without_resource_config() {
        let id = node_id(env(&[("TRAINPROF_RESOURCE_CONFIG", "/nonexistent/rc.json")]), 12);
        assert_eq!(id, TimelineNode::new(12, &host_name()).into_string());
        assert!(!id.contains('_'));
    }
}
