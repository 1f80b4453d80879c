//! The node id `<rank>-<host>` (docs/formats.md, "Node id") that names the timeline files and the
//! Python-stats folders.
//!
//! * rank: the first of the usual launcher variables that holds a number (`RANK` from
//!   torchrun, then Open MPI, MPICH / Intel MPI, MVAPICH2, SLURM), else the OS pid, as
//!   smdebug does outside distributed training;
//! * host: `current_host` of the SageMaker `resourceconfig.json` (its path overridable with
//!   `TRAINPROF_RESOURCE_CONFIG`), else the machine's host name;
//! * every `_` (and `/`) becomes `-`, because readers split file names on `_`.

use std::path::Path;

/// Launcher variables that carry the global rank, in the order they are tried.
pub const RANK_VARS: [&str; 5] =
    ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"];

/// Where SageMaker writes the resource config.
pub const DEFAULT_RESOURCE_CONFIG: &str = "/opt/ml/input/config/resourceconfig.json";

/// The node id for this process, from `var` (the environment) and the files it names.
pub fn node_id(var: impl Fn(&str) -> Option<String>, pid: u32) -> String {
    let rank = RANK_VARS
        .iter()
        .find_map(|v| var(v).and_then(|s| s.trim().parse::<u64>().ok()))
        .unwrap_or(u64::from(pid));
    let resource_config = var("TRAINPROF_RESOURCE_CONFIG").unwrap_or_else(|| DEFAULT_RESOURCE_CONFIG.into());
    let host = current_host(Path::new(&resource_config)).unwrap_or_else(host_name);
    trainprof_output::node_id(rank, &host)
}

/// `current_host` from a resourceconfig.json, if the file exists and has one.
pub fn current_host(path: &Path) -> Option<String> {
    // Non-blocking and by `fstat`: a FIFO there cannot hang the trainer's init.
    let bytes = trainprof_config::read_platform_file(path).ok()??;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("current_host")?.as_str().filter(|h| !h.is_empty()).map(str::to_owned)
}

/// The kernel's host name (what Python's `socket.gethostname()` returns).
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

    #[test]
    fn rank_and_current_host() {
        let dir = std::env::temp_dir().join(format!("trainprof-node-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rc = dir.join("resourceconfig.json");
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
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn host_name_without_resource_config() {
        let id = node_id(env(&[("TRAINPROF_RESOURCE_CONFIG", "/nonexistent/rc.json")]), 12);
        assert_eq!(id, trainprof_output::node_id(12, &host_name()));
        assert!(!id.contains('_'));
    }
}
