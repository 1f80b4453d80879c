//! The agent's node record (docs/formats.md, "Node record"): what does not change while an
//! agent runs on a node (its GPUs and their model), written once when it starts sampling,
//! as `system/node/<NodeId>/<µs>.json`, and read back, bounded, by the report.

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
                NodeGpu { index: 0, model: Some("NVIDIA H200".into()), memory_total_bytes: Some(150 << 30) },
                NodeGpu { index: 1, model: None, memory_total_bytes: None },
            ],
        };
        let bytes = to_bytes(&r);
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            "{\"NodeId\":\"algo-1\",\"Timestamp\":1795316901.523417,\"Gpus\":[{\"Index\":0,\"Model\":\"NVIDIA H200\",\
             \"MemoryTotalBytes\":161061273600},{\"Index\":1,\"Model\":null,\"MemoryTotalBytes\":null}]}\n"
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
}
