//! What the agent cost (docs/formats.md, "The agent's own cost"): the CPU time of each part
//! of the agent, from thread CPU clocks around the work, written once at the end of sampling
//! as `system/cost/<NodeId>/<µs>.json`, and read back, bounded, by the report. The parts are
//! a closed set ([`Part`]): the same words name the metrics endpoint's `part` label.

use serde::{Deserialize, Serialize};

/// The folder under the LocalPath that holds one folder per node.
pub const FOLDER: &str = "system/cost";

/// The most bytes of one record the report reads.
pub const MAX_BYTES: u64 = 64 * 1024;

/// One part of the agent's work. The set is closed, so the metrics endpoint's `part` label
/// has a bounded number of values and the report knows every word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// The sampling thread before its first tick: the probe of every source (NVML's loading
    /// among them), the sinks' start.
    Start,
    /// The sampling thread outside every other part: the loop's own bookkeeping and waits.
    Loop,
    SamplerCpu,
    SamplerMemory,
    SamplerDisk,
    SamplerNetwork,
    SamplerCgroup,
    /// The trainer's process tree.
    SamplerTree,
    /// The agent's own rows.
    SamplerAgent,
    SamplerPressure,
    SamplerClock,
    /// The GPU sampler outside its NVML calls.
    SamplerGpu,
    /// A sampler of no other part.
    SamplerOther,
    NvmlUtilization,
    NvmlMemory,
    NvmlPower,
    NvmlTemperature,
    NvmlSmClock,
    /// Both sample buffers (two `nvmlDeviceGetSamples`).
    NvmlUtilizationSamples,
    NvmlThrottle,
    NvmlInstantFields,
    /// The counters' `nvmlDeviceGetFieldValues`.
    NvmlFields,
    /// A GPM sample and the metrics call.
    NvmlGpm,
    NvmlProcesses,
    NvmlProcessUtilization,
    /// `nvmlEventSetWait_v2(0)`, every GPU with events.
    NvmlEvents,
    /// The system metrics files: each tick's write, and the seals.
    Write,
    /// The host at a stall: the watcher thread, and the sink's copy of each tick.
    HangWatch,
    HangSink,
    /// The metrics endpoint: its server thread, and the sink's copy of each tick.
    Metrics,
    MetricsSink,
    /// The S3 uploader's thread.
    Upload,
    /// The S3 trigger relay's thread.
    Relay,
    /// The signal thread.
    Signals,
    /// The main thread: start-up, waiting for CMD, the end of the job.
    Main,
}

impl Part {
    pub const ALL: [Part; 35] = [
        Part::Start,
        Part::Loop,
        Part::SamplerCpu,
        Part::SamplerMemory,
        Part::SamplerDisk,
        Part::SamplerNetwork,
        Part::SamplerCgroup,
        Part::SamplerTree,
        Part::SamplerAgent,
        Part::SamplerPressure,
        Part::SamplerClock,
        Part::SamplerGpu,
        Part::SamplerOther,
        Part::NvmlUtilization,
        Part::NvmlMemory,
        Part::NvmlPower,
        Part::NvmlTemperature,
        Part::NvmlSmClock,
        Part::NvmlUtilizationSamples,
        Part::NvmlThrottle,
        Part::NvmlInstantFields,
        Part::NvmlFields,
        Part::NvmlGpm,
        Part::NvmlProcesses,
        Part::NvmlProcessUtilization,
        Part::NvmlEvents,
        Part::Write,
        Part::HangWatch,
        Part::HangSink,
        Part::Metrics,
        Part::MetricsSink,
        Part::Upload,
        Part::Relay,
        Part::Signals,
        Part::Main,
    ];

    /// Its word: the record's `Part` and the endpoint's `part` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Start => "start",
            Part::Loop => "loop",
            Part::SamplerCpu => "sampler.cpu",
            Part::SamplerMemory => "sampler.memory",
            Part::SamplerDisk => "sampler.disk",
            Part::SamplerNetwork => "sampler.network",
            Part::SamplerCgroup => "sampler.cgroup",
            Part::SamplerTree => "sampler.trainer",
            Part::SamplerAgent => "sampler.agent",
            Part::SamplerPressure => "sampler.pressure",
            Part::SamplerClock => "sampler.clock",
            Part::SamplerGpu => "sampler.gpu",
            Part::SamplerOther => "sampler.other",
            Part::NvmlUtilization => "nvml.utilization",
            Part::NvmlMemory => "nvml.memory",
            Part::NvmlPower => "nvml.power",
            Part::NvmlTemperature => "nvml.temperature",
            Part::NvmlSmClock => "nvml.sm_clock",
            Part::NvmlUtilizationSamples => "nvml.utilization_samples",
            Part::NvmlThrottle => "nvml.throttle",
            Part::NvmlInstantFields => "nvml.instant_fields",
            Part::NvmlFields => "nvml.fields",
            Part::NvmlGpm => "nvml.gpm",
            Part::NvmlProcesses => "nvml.processes",
            Part::NvmlProcessUtilization => "nvml.process_utilization",
            Part::NvmlEvents => "nvml.events",
            Part::Write => "write",
            Part::HangWatch => "hang_watch",
            Part::HangSink => "hang_watch.tick",
            Part::Metrics => "metrics",
            Part::MetricsSink => "metrics.tick",
            Part::Upload => "upload",
            Part::Relay => "relay",
            Part::Signals => "signals",
            Part::Main => "main",
        }
    }

    /// The part of a word, or `None`.
    pub fn parse(word: &str) -> Option<Part> {
        Part::ALL.into_iter().find(|p| p.as_str() == word)
    }

    /// Its index in [`Part::ALL`].
    pub fn slot(self) -> usize {
        self as usize
    }
}

/// One record: the agent's whole process, and its parts.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AgentCost {
    /// `algo-<n>`, as in the node's system files.
    #[serde(rename = "NodeId")]
    pub node: String,
    /// When it was written, epoch seconds.
    #[serde(rename = "Timestamp")]
    pub timestamp: f64,
    /// From the agent's start to the record, seconds.
    #[serde(rename = "WallSeconds")]
    pub wall_s: f64,
    /// The process's CPU time (`getrusage`, user + system), seconds.
    #[serde(rename = "CpuSeconds")]
    pub cpu_s: f64,
    /// The largest resident set the process had (`ru_maxrss`), bytes.
    #[serde(rename = "PeakRssBytes")]
    pub peak_rss_bytes: u64,
    /// Ticks taken, and the interval, ms.
    #[serde(rename = "Ticks")]
    pub ticks: u64,
    #[serde(rename = "IntervalMs")]
    pub interval_ms: u64,
    /// Ticks whose every part was timed (the rest time only the slow calls: docs/formats.md,
    /// "The agent's own cost").
    #[serde(rename = "TimedTicks")]
    pub timed_ticks: u64,
    /// The GPUs sampled.
    #[serde(rename = "Gpus")]
    pub gpus: u32,
    /// Thread CPU clock reads the accounting made, and what they cost, seconds (the reads ×
    /// one read's cost, measured at the start).
    #[serde(rename = "ClockReads")]
    pub clock_reads: u64,
    #[serde(rename = "AccountingSeconds")]
    pub accounting_s: f64,
    /// Every part with time or calls, largest first.
    #[serde(rename = "Parts")]
    pub parts: Vec<PartCost>,
}

/// One part's CPU time and calls.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PartCost {
    /// Its word ([`Part::as_str`]).
    #[serde(rename = "Part")]
    pub part: String,
    /// CPU seconds over the record's span.
    #[serde(rename = "Seconds")]
    pub seconds: f64,
    /// Calls made (a sampler's or a sink's: one per tick; an NVML kind's: one per GPU and
    /// read); 0 for a thread's own part.
    #[serde(rename = "Calls")]
    pub calls: u64,
    /// CPU µs per call, measured on the calls that were timed; `null` without calls.
    #[serde(rename = "MicrosPerCall")]
    pub us_per_call: Option<f64>,
}

impl AgentCost {
    /// The parts' sum, seconds.
    pub fn parts_s(&self) -> f64 {
        self.parts.iter().map(|p| p.seconds).sum()
    }

    /// The share of one core over the record's span, percent.
    pub fn core_percent(&self) -> f64 {
        if self.wall_s > 0.0 { self.cpu_s / self.wall_s * 100.0 } else { 0.0 }
    }

    /// A part by its word.
    pub fn part(&self, part: Part) -> Option<&PartCost> {
        self.parts.iter().find(|p| p.part == part.as_str())
    }
}

/// The file name of a record written at `us` (epoch microseconds).
pub fn file_name(us: u64) -> String {
    format!("{us}.json")
}

/// `record` as written: one JSON object and a newline.
pub fn to_bytes(record: &AgentCost) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(record).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// A record as read back (at most [`MAX_BYTES`]), or `None` when `bytes` is not one.
pub fn parse(bytes: &[u8]) -> Option<AgentCost> {
    if bytes.len() as u64 > MAX_BYTES {
        return None;
    }
    serde_json::from_slice(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_distinct_and_parse_back() {
        for (i, p) in Part::ALL.into_iter().enumerate() {
            assert_eq!(p.slot(), i);
            assert_eq!(Part::parse(p.as_str()), Some(p));
        }
        let mut words: Vec<_> = Part::ALL.iter().map(|p| p.as_str()).collect();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), Part::ALL.len());
        assert_eq!(Part::parse("nvml.nope"), None);
    }

    #[test]
    fn a_record_is_written_and_read_back() {
        let r = AgentCost {
            node: "algo-1".into(),
            timestamp: 1.5,
            wall_s: 10.0,
            cpu_s: 0.05,
            parts: vec![PartCost {
                part: Part::NvmlUtilization.as_str().into(),
                seconds: 0.01,
                calls: 100,
                us_per_call: Some(100.0),
            }],
            ..AgentCost::default()
        };
        let back = parse(&to_bytes(&r)).unwrap();
        assert_eq!(back, r);
        assert!((back.core_percent() - 0.5).abs() < 1e-9);
        assert_eq!(back.part(Part::NvmlUtilization).map(|p| p.calls), Some(100));
        assert!(parse(b"{").is_none());
    }
}
