//! The agent's node record (docs/formats.md, "Node record"): what does not change while an
//! agent runs on a node (its GPUs and their model, the job's identity on the node: docs/formats.md,
//! "Job identity"), written once when it starts sampling, as `system/node/<NodeId>/<µs>.json`,
//! and read back, bounded, by the report.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The folder under the LocalPath that holds one folder per node.
pub const FOLDER: &str = "system/node";

/// The most bytes of one record the report reads.
pub const MAX_BYTES: u64 = 64 * 1024;

/// GPUs of one record the report keeps.
pub const MAX_GPUS: usize = 64;

/// The most bytes of a model name the report shows.
pub const MAX_MODEL_BYTES: usize = 96;

/// One record.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NodeRecord {
    /// `algo-<n>`, as in the node's system files.
    #[serde(rename = "NodeId")]
    pub node: String,
    /// When the agent wrote it, epoch seconds.
    #[serde(rename = "Timestamp")]
    pub timestamp: f64,
    /// Every GPU NVML listed, by index; empty when there is none (or no NVML).
    #[serde(rename = "Gpus")]
    pub gpus: Vec<NodeGpu>,
    /// Which job, rank and GPUs this is (docs/formats.md, "Job identity"); absent in a
    /// record written before the identity was.
    #[serde(rename = "Job", default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobIdentity>,
}

/// One GPU of a record.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeGpu {
    /// The NVML index: the `i` of `gpu<i>` and `device<i>`.
    #[serde(rename = "Index")]
    pub index: u32,
    /// `nvmlDeviceGetName`; `null` when NVML did not give it.
    #[serde(rename = "Model")]
    pub model: Option<String>,
    /// `nvmlDeviceGetMemoryInfo`'s total; `null` when NVML did not give it.
    #[serde(rename = "MemoryTotalBytes")]
    pub memory_total_bytes: Option<u64>,
    /// `nvmlDeviceGetUUID` (`GPU-…`), cut to [`MAX_VALUE_BYTES`]; `null` when NVML did not
    /// give it (absent in a record written before it was).
    #[serde(rename = "Uuid", default)]
    pub uuid: Option<String>,
}

/// The most bytes of one identity value kept (a variable's value, a host name, a UUID): the
/// agent cuts longer ones (at a character boundary) before it writes them.
pub const MAX_VALUE_BYTES: usize = 256;

/// The most bytes of one identity value shown (the page, the metrics endpoint's info
/// series), after control characters are escaped.
pub const MAX_SHOWN_BYTES: usize = 128;

/// The keys of [`JobIdentity::summary`], in its order (the page shows them in it).
pub const SUMMARY_KEYS: [&str; 11] = [
    "platform",
    "job",
    "host",
    "pod",
    "rank",
    "local_rank",
    "world_size",
    "nodes",
    "cuda_visible_devices",
    "gpus",
    "gpu_model",
];

/// The platforms the identity recognises, as `Platforms` names them.
pub const SAGEMAKER: &str = "sagemaker";
pub const TORCHRUN: &str = "torchrun";
pub const SLURM: &str = "slurm";
pub const KUBERNETES: &str = "kubernetes";

/// The variables the identity keeps, by platform (docs/formats.md, "Job identity"): a fixed
/// list, so a record holds at most this many, each at most [`MAX_VALUE_BYTES`].
pub const VARIABLES: [(&str, &[&str]); 5] = [
    (SAGEMAKER, &["TRAINING_JOB_NAME", "TRAINING_JOB_ARN", "SM_CURRENT_HOST"]),
    (
        TORCHRUN,
        &[
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "NODE_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "TORCHELASTIC_RUN_ID",
            "PET_NNODES",
            "PET_NODE_RANK",
            "PET_NPROC_PER_NODE",
            "PET_RDZV_ID",
        ],
    ),
    (
        SLURM,
        &[
            "SLURM_JOB_ID",
            "SLURM_JOB_NAME",
            "SLURM_STEP_ID",
            "SLURM_PROCID",
            "SLURM_LOCALID",
            "SLURM_NODEID",
            "SLURM_NTASKS",
            "SLURM_JOB_NUM_NODES",
            "SLURMD_NODENAME",
            "SLURM_ARRAY_JOB_ID",
            "SLURM_ARRAY_TASK_ID",
        ],
    ),
    (KUBERNETES, &["KUBERNETES_SERVICE_HOST", "POD_NAME", "POD_NAMESPACE", "NODE_NAME"]),
    ("", &["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"]),
];

/// The variables whose presence names a platform (the others are kept when it is named).
const MARKERS: [(&str, &[&str]); 4] = [
    (SAGEMAKER, &["TRAINING_JOB_NAME", "SM_CURRENT_HOST"]),
    (TORCHRUN, &["RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "PET_NNODES", "PET_RDZV_ID"]),
    (SLURM, &["SLURM_JOB_ID"]),
    (KUBERNETES, &["KUBERNETES_SERVICE_HOST"]),
];

/// Which job, rank and GPUs a node's agent runs for, read once from its environment and the
/// platform's files (docs/formats.md, "Job identity"). Every value is untrusted text: cut to
/// [`MAX_VALUE_BYTES`] when taken, escaped wherever it is shown.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct JobIdentity {
    /// The platforms recognised, in [`VARIABLES`]' order: `sagemaker`, `torchrun`, `slurm`,
    /// `kubernetes`; empty for none.
    #[serde(rename = "Platforms", default)]
    pub platforms: Vec<String>,
    /// The machine's host name (`uname`'s nodename; a pod's name in Kubernetes).
    #[serde(rename = "Host", default)]
    pub host: Option<String>,
    /// SageMaker's `resourceconfig.json`: `current_host`.
    #[serde(rename = "CurrentHost", default)]
    pub current_host: Option<String>,
    /// SageMaker's `resourceconfig.json`: how many `hosts` it lists.
    #[serde(rename = "HostCount", default)]
    pub host_count: Option<u64>,
    /// The variables of [`VARIABLES`] that were set, name → value.
    #[serde(rename = "Variables", default)]
    pub variables: BTreeMap<String, String>,
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn bounded(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

impl JobIdentity {
    /// The identity from the environment (`var`), SageMaker's resource config (`current_host`,
    /// `hosts`' length) and the host name. Values are cut to [`MAX_VALUE_BYTES`].
    pub fn from_env(
        var: impl Fn(&str) -> Option<String>,
        resource: Option<(Option<&str>, Option<usize>)>,
        host: Option<&str>,
    ) -> JobIdentity {
        let mut variables = BTreeMap::new();
        for (_, names) in VARIABLES {
            for name in names {
                if let Some(v) = var(name) {
                    variables.insert((*name).to_owned(), bounded(&v, MAX_VALUE_BYTES));
                }
            }
        }
        let mut platforms: Vec<String> = MARKERS
            .iter()
            .filter(|(_, names)| names.iter().any(|n| variables.contains_key(*n)))
            .map(|(p, _)| (*p).to_owned())
            .collect();
        if resource.is_some() && !platforms.iter().any(|p| p == SAGEMAKER) {
            platforms.insert(0, SAGEMAKER.to_owned());
        }
        // Only the variables of a platform that is there (and the GPUs'): `RANK` alone is
        // torchrun's, `NODE_NAME` without Kubernetes is someone else's.
        variables.retain(|name, _| {
            VARIABLES.iter().any(|(p, names)| {
                names.contains(&name.as_str()) && (p.is_empty() || platforms.iter().any(|q| q == p))
            })
        });
        JobIdentity {
            platforms,
            host: host.map(|h| bounded(h, MAX_VALUE_BYTES)),
            current_host: resource.and_then(|(c, _)| c).map(|c| bounded(c, MAX_VALUE_BYTES)),
            host_count: resource.and_then(|(_, n)| n).map(|n| u64::try_from(n).unwrap_or(u64::MAX)),
            variables,
        }
    }

    fn var(&self, name: &str) -> Option<&str> {
        self.variables.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// The identity in a few words, as the page and the metrics endpoint's info series show
    /// it (docs/formats.md, "Job identity"): `(key, value)` in a fixed order, only the ones
    /// known, every value [`crate::text::printable`] and cut to [`MAX_SHOWN_BYTES`]. `gpus`:
    /// the record's GPUs (their model and count).
    pub fn summary(&self, gpus: &[NodeGpu]) -> Vec<(&'static str, String)> {
        let shown = |s: &str| crate::text::printable(s, MAX_SHOWN_BYTES);
        let mut out: Vec<(&'static str, String)> = Vec::new();
        if !self.platforms.is_empty() {
            out.push(("platform", shown(&self.platforms.join(","))));
        }
        let job = self
            .var("TRAINING_JOB_NAME")
            .or_else(|| self.var("SLURM_JOB_ID"))
            .or_else(|| self.var("TORCHELASTIC_RUN_ID"))
            .or_else(|| self.var("PET_RDZV_ID"));
        if let Some(j) = job {
            out.push(("job", shown(j)));
        }
        let host = self
            .current_host
            .as_deref()
            .filter(|h| !h.is_empty())
            .or_else(|| self.var("SLURMD_NODENAME"))
            .or_else(|| self.var("NODE_NAME"))
            .or(self.host.as_deref());
        if let Some(h) = host {
            out.push(("host", shown(h)));
        }
        if let (Some(ns), Some(pod)) = (self.var("POD_NAMESPACE"), self.var("POD_NAME")) {
            out.push(("pod", shown(&format!("{ns}/{pod}"))));
        } else if let Some(pod) = self.var("POD_NAME") {
            out.push(("pod", shown(pod)));
        }
        if let Some(r) = self.var("RANK").or_else(|| self.var("SLURM_PROCID")) {
            out.push(("rank", shown(r)));
        }
        if let Some(r) = self.var("LOCAL_RANK").or_else(|| self.var("SLURM_LOCALID")) {
            out.push(("local_rank", shown(r)));
        }
        if let Some(w) = self.var("WORLD_SIZE").or_else(|| self.var("SLURM_NTASKS")) {
            out.push(("world_size", shown(w)));
        }
        let nodes = self.host_count.map(|n| n.to_string()).or_else(|| {
            self.var("PET_NNODES").or_else(|| self.var("SLURM_JOB_NUM_NODES")).map(str::to_owned)
        });
        if let Some(n) = nodes {
            out.push(("nodes", shown(&n)));
        }
        if let Some(d) = self.var("CUDA_VISIBLE_DEVICES") {
            out.push(("cuda_visible_devices", shown(d)));
        }
        out.push(("gpus", gpus.len().to_string()));
        let mut models: Vec<&str> = gpus.iter().filter_map(|g| g.model.as_deref()).collect();
        models.sort_unstable();
        models.dedup();
        if !models.is_empty() {
            out.push(("gpu_model", shown(&models.join(","))));
        }
        out
    }
}

/// The file name of a record written at `us` (epoch microseconds): 16 digits, so that no
/// reader takes it for a system file (`<10 digits>.algo-<n>.json`).
pub fn file_name(us: u64) -> String {
    format!("{us}.json")
}

/// The time (µs) in a record's file name, or `None` when the name is not one.
pub fn name_us(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `record` as written: one JSON object and a newline.
pub fn to_bytes(record: &NodeRecord) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(record).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// A record as read back (at most [`MAX_BYTES`], which bounds what parsing it costs), or
/// `None` when `bytes` is not one.
pub fn parse(bytes: &[u8]) -> Option<NodeRecord> {
    serde_json::from_slice(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_written_and_read_back() {
        let r = NodeRecord {
            node: "algo-1".into(),
            timestamp: 1795316901.523417,
            gpus: vec![
                NodeGpu {
                    index: 0,
                    model: Some("NVIDIA H200".into()),
                    memory_total_bytes: Some(150 << 30),
                    uuid: Some("GPU-1".into()),
                },
                NodeGpu { index: 1, model: None, memory_total_bytes: None, uuid: None },
            ],
            job: None,
        };
        let bytes = to_bytes(&r);
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            "{\"NodeId\":\"algo-1\",\"Timestamp\":1795316901.523417,\"Gpus\":[{\"Index\":0,\"Model\":\"NVIDIA H200\",\
             \"MemoryTotalBytes\":161061273600,\"Uuid\":\"GPU-1\"},{\"Index\":1,\"Model\":null,\"MemoryTotalBytes\":null,\
             \"Uuid\":null}]}\n"
        );
        assert_eq!(parse(&bytes), Some(r));
        assert_eq!(parse(b"[1, 2"), None);
        assert_eq!(parse(br#"{"NodeId":"algo-1","Timestamp":1,"Gpus":[{"Index":-1}]}"#), None);
    }

    #[test]
    fn names_are_sixteen_digit_times_never_a_system_file_s() {
        assert_eq!(file_name(1795316901523417), "1795316901523417.json");
        assert_eq!(name_us("1795316901523417.json"), Some(1795316901523417));
        for bad in ["1795316901.algo-1.json", ".1795316901523417.json.1.tmp", "x.json", ".json", "1.txt"] {
            assert_eq!(name_us(bad), None, "{bad}");
        }
    }

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    fn gpu(model: &str) -> NodeGpu {
        NodeGpu { index: 0, model: Some(model.into()), memory_total_bytes: None, uuid: None }
    }

    #[test]
    fn each_platform_is_recognised_by_its_variables_and_only_its_own_are_kept() {
        let none = JobIdentity::from_env(env(&[("NODE_NAME", "n"), ("PATH", "/bin")]), None, Some("h"));
        assert_eq!(none.platforms, Vec::<String>::new());
        assert!(none.variables.is_empty(), "{none:?}");
        assert_eq!(none.summary(&[]), vec![("host", "h".to_owned()), ("gpus", "0".to_owned())]);

        let sm = JobIdentity::from_env(
            env(&[("TRAINING_JOB_NAME", "job-1"), ("CUDA_VISIBLE_DEVICES", "0,1")]),
            Some((Some("algo-2"), Some(4))),
            Some("ip-10-0-0-1"),
        );
        assert_eq!(sm.platforms, ["sagemaker"]);
        assert_eq!(
            sm.summary(&[gpu("NVIDIA H200"), gpu("NVIDIA H200")]),
            [
                ("platform", "sagemaker"),
                ("job", "job-1"),
                ("host", "algo-2"),
                ("nodes", "4"),
                ("cuda_visible_devices", "0,1"),
                ("gpus", "2"),
                ("gpu_model", "NVIDIA H200"),
            ]
            .map(|(k, v)| (k, v.to_owned()))
        );

        let all = JobIdentity::from_env(
            env(&[
                ("RANK", "3"),
                ("WORLD_SIZE", "16"),
                ("LOCAL_RANK", "1"),
                ("TORCHELASTIC_RUN_ID", "run-9"),
                ("SLURM_JOB_ID", "4242"),
                ("SLURM_PROCID", "7"),
                ("SLURMD_NODENAME", "gpu-node-3"),
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                ("POD_NAME", "train-0"),
                ("POD_NAMESPACE", "ml"),
            ]),
            None,
            None,
        );
        assert_eq!(all.platforms, ["torchrun", "slurm", "kubernetes"]);
        let s: BTreeMap<_, _> = all.summary(&[]).into_iter().collect();
        assert_eq!(s["job"], "4242");
        assert_eq!(s["rank"], "3");
        assert_eq!(s["world_size"], "16");
        assert_eq!(s["host"], "gpu-node-3");
        assert_eq!(s["pod"], "ml/train-0");
        assert_eq!(all.variables.len(), 10);
    }

    #[test]
    fn hostile_values_are_cut_when_taken_and_escaped_when_shown() {
        let huge = "é".repeat(10_000);
        let id = JobIdentity::from_env(
            env(&[("SLURM_JOB_ID", &huge), ("SLURM_JOB_NAME", "a\"b\n</script>\u{1b}[31m")]),
            Some((Some("x\ny"), None)),
            None,
        );
        let kept = &id.variables["SLURM_JOB_ID"];
        assert!(kept.len() <= MAX_VALUE_BYTES && kept.len() >= MAX_VALUE_BYTES - 1, "{}", kept.len());
        let s: BTreeMap<_, _> = id.summary(&[gpu("G\u{202e}PU")]).into_iter().collect();
        assert!(
            s["job"].len() <= MAX_SHOWN_BYTES + '…'.len_utf8() && s["job"].ends_with('…'),
            "{}",
            s["job"]
        );
        assert_eq!(s["host"], "x\\x0ay");
        assert_eq!(s["gpu_model"], "G\\u{202e}PU");
        // Written and read back as JSON: the text stays text.
        let r = NodeRecord { node: "algo-1".into(), timestamp: 1.0, gpus: vec![], job: Some(id.clone()) };
        let bytes = to_bytes(&r);
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(parse(&bytes).and_then(|r| r.job), Some(id));
        // A record of an older agent (no Job, no Uuid) still reads.
        let old = parse(
            br#"{"NodeId":"algo-1","Timestamp":1,"Gpus":[{"Index":0,"Model":"M","MemoryTotalBytes":1}]}"#,
        );
        assert_eq!(old.map(|r| (r.job, r.gpus[0].uuid.clone())), Some((None, None)));
    }
}
