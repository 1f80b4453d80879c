//! Which node a file comes from. Two names, for two kinds of file (docs/formats.md, "System
//! files: names" and "Node id"), kept apart by type so that one is never used for the other:
//!
//! * [`SystemNode`], `algo-<n>`: the host, in the names and lines of the agent's system
//!   metrics files. `current_host` of the resource config when it reads `algo-<n>`; else the
//!   host's position in its `hosts` list + 1; else a node-rank variable
//!   ([`NODE_RANK_VARS`]) + 1; else 1.
//! * [`TimelineNode`], `<rank>-<host>`: the trainer process, in the names of the timeline
//!   files and the Python-stats folders. rank: the first launcher variable
//!   ([`RANK_VARS`]) that holds a number, else the OS pid, as smdebug does outside
//!   distributed training; host: `current_host` of the resource config, else the machine's
//!   host name; every `_` (and `/`) becomes `-`, because readers split file names on `_`.
//!
//! Both read the same SageMaker `resourceconfig.json` ([`ResourceConfig`]); reading the
//! file is the caller's (`trainprof_config::read_platform_file`: never blocks on a FIFO).

use std::fmt;
use std::path::PathBuf;

/// Launcher variables that carry the global rank (a process's), in the order they are
/// tried: torchrun, Open MPI, MPICH / Intel MPI, MVAPICH2, SLURM.
pub const RANK_VARS: [&str; 5] =
    ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"];

/// Variables that carry the node's index in the cluster, in the order they are tried
/// (torchrun, PyTorch Lightning, SLURM, Open MPI).
pub const NODE_RANK_VARS: [&str; 4] =
    ["GROUP_RANK", "NODE_RANK", "SLURM_NODEID", "OMPI_COMM_WORLD_NODE_RANK"];

/// Where SageMaker writes the resource config.
pub const DEFAULT_RESOURCE_CONFIG: &str = "/opt/ml/input/config/resourceconfig.json";

/// The variable that overrides [`DEFAULT_RESOURCE_CONFIG`].
pub const RESOURCE_CONFIG_VAR: &str = "TRAINPROF_RESOURCE_CONFIG";

/// What the node names take from SageMaker's `resourceconfig.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    /// `current_host`, when it is a string.
    pub current_host: Option<String>,
    /// `hosts`, when it is a list (an entry that is not a string is `None`, so that
    /// positions are kept).
    pub hosts: Option<Vec<Option<String>>>,
}

impl ResourceConfig {
    /// The file to read: `TRAINPROF_RESOURCE_CONFIG` from `var`, else the default.
    pub fn path(var: impl Fn(&str) -> Option<String>) -> PathBuf {
        var(RESOURCE_CONFIG_VAR).map_or_else(|| DEFAULT_RESOURCE_CONFIG.into(), PathBuf::from)
    }

    /// The file's content, if it is a JSON object.
    pub fn parse(bytes: &[u8]) -> Option<ResourceConfig> {
        let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        let v = v.as_object()?;
        let current_host = v.get("current_host").and_then(|h| h.as_str()).map(str::to_owned);
        let hosts = v
            .get("hosts")
            .and_then(|h| h.as_array())
            .map(|a| a.iter().map(|h| h.as_str().map(str::to_owned)).collect());
        Some(ResourceConfig { current_host, hosts })
    }
}

/// `algo-<n>`: the host, in the system metrics files (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SystemNode(u32);

impl SystemNode {
    pub const fn new(n: u32) -> SystemNode {
        SystemNode(n)
    }

    /// This host's node, from the resource config and the environment (`var`).
    pub fn from_env(rc: Option<&ResourceConfig>, var: impl Fn(&str) -> Option<String>) -> SystemNode {
        if let Some(rc) = rc {
            let current = rc.current_host.as_deref();
            if let Some(n) = current.and_then(|h| h.strip_prefix("algo-")).and_then(|n| n.parse::<u32>().ok())
            {
                return SystemNode(n);
            }
            if let (Some(cur), Some(hosts)) = (current, &rc.hosts)
                && let Some(i) = hosts.iter().position(|h| h.as_deref() == Some(cur))
            {
                return SystemNode(u32::try_from(i).map_or(1, |i| i.saturating_add(1)));
            }
        }
        SystemNode(
            NODE_RANK_VARS
                .iter()
                .find_map(|v| var(v).and_then(|s| s.trim().parse::<u32>().ok()))
                .map_or(1, |r| r.saturating_add(1)),
        )
    }

    /// The `<n>` of `algo-<n>`, as in the system file names.
    pub const fn index(self) -> u32 {
        self.0
    }
}

impl fmt::Display for SystemNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "algo-{}", self.0)
    }
}

/// `<rank>-<host>`: the trainer process, in the timeline files (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TimelineNode(String);

impl TimelineNode {
    /// The node of `rank` on `host`, with every `_` and `/` replaced by `-` (as smdebug
    /// does for `_`; `/` would make a folder).
    pub fn new(rank: u64, host: &str) -> TimelineNode {
        TimelineNode(format!("{rank}-{host}").replace(['_', '/'], "-"))
    }

    /// This process's node: the rank from `var`, else `pid`; the host from the resource
    /// config, else `host_name()`.
    pub fn from_env(
        rc: Option<&ResourceConfig>,
        var: impl Fn(&str) -> Option<String>,
        pid: u32,
        host_name: impl FnOnce() -> String,
    ) -> TimelineNode {
        let rank = RANK_VARS
            .iter()
            .find_map(|v| var(v).and_then(|s| s.trim().parse::<u64>().ok()))
            .unwrap_or(u64::from(pid));
        let host = rc.and_then(|rc| rc.current_host.clone()).filter(|h| !h.is_empty());
        TimelineNode::new(rank, &host.unwrap_or_else(host_name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for TimelineNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kernel's host name (what Python's `socket.gethostname()` returns), else `localhost`.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes; gethostname NUL-terminates on success
    // when the name fits, and we stop at the first NUL or the end of buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..len]) {
        Ok(s) if !s.is_empty() => s.to_owned(),
        _ => "localhost".into(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    fn rc(json: &str) -> ResourceConfig {
        ResourceConfig::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn system_node_from_resource_config_hosts_or_rank() {
        let none = |_: &str| None;
        let node = |r: &ResourceConfig| SystemNode::from_env(Some(r), none).index();
        assert_eq!(node(&rc(r#"{"current_host": "algo-3"}"#)), 3);
        assert_eq!(node(&rc(r#"{"current_host": "b", "hosts": ["a", "b", "c"]}"#)), 2);
        // Positions count entries that are not strings too.
        assert_eq!(node(&rc(r#"{"current_host": "b", "hosts": [1, "b"]}"#)), 2);
        assert_eq!(node(&rc(r#"{"current_host": "z", "hosts": ["a"]}"#)), 1);
        let rank = |k: &str| (k == "NODE_RANK").then(|| "4".to_owned());
        assert_eq!(SystemNode::from_env(None, rank).index(), 5);
        assert_eq!(SystemNode::from_env(None, none), SystemNode::new(1));
        assert_eq!(SystemNode::new(7).to_string(), "algo-7");
        assert_eq!(ResourceConfig::parse(b"[1]"), None);
    }

    #[test]
    fn timeline_node_rank_and_current_host() {
        let r = rc(r#"{"current_host": "algo_1", "hosts": ["algo_1", "algo_2"]}"#);
        let node = |vars: &[(&str, &str)]| {
            TimelineNode::from_env(Some(&r), env(vars), 99, || unreachable!("the host is in the file"))
                .into_string()
        };
        assert_eq!(node(&[("RANK", "3")]), "3-algo-1");
        assert_eq!(node(&[("SLURM_PROCID", "7")]), "7-algo-1");
        // A variable that is not a number is skipped, as is a missing one.
        assert_eq!(node(&[("RANK", "x"), ("OMPI_COMM_WORLD_RANK", "2")]), "2-algo-1");
        assert_eq!(node(&[]), "99-algo-1");
        // No resource config, or an empty current_host: the host name.
        let empty = rc(r#"{"current_host": ""}"#);
        for rc in [None, Some(&empty)] {
            let id = TimelineNode::from_env(rc, env(&[]), 12, || "my_host".into());
            assert_eq!(id.as_str(), "12-my-host");
        }
    }

    #[test]
    fn timeline_nodes_have_no_underscores() {
        assert_eq!(TimelineNode::new(0, "algo-1").as_str(), "0-algo-1");
        assert_eq!(TimelineNode::new(905, "b88a_bb/x").as_str(), "905-b88a-bb-x");
        assert!(!host_name().is_empty());
    }
}
