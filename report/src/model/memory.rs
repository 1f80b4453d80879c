//! GPU memory as the report holds it (`docs/report.md`, "Memory"): each PyTorch memory
//! snapshot's peak, the frames holding memory at the peak, the timeline and the leak finding
//! (`analysis/memory.rs` computes them from `reading/memory.rs`).

use serde::{Deserialize, Serialize};

/// Everything the report says about memory; empty without snapshots or memory events.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Memory {
    /// One per snapshot file read, by node then file name.
    pub snapshots: Vec<MemorySnapshot>,
    /// The detailed windows' memory events (torch.profiler's `profile_memory`): one per
    /// node, device and window, by node, device, then first step.
    #[serde(default)]
    pub windows: Vec<MemoryWindow>,
}

impl Memory {
    pub fn is_empty(&self) -> bool {
        self.snapshots.is_empty() && self.windows.is_empty()
    }
}

/// Allocated memory over one detailed window on one device, from torch's memory events
/// (`docs/report.md`, "Memory over the detailed windows").
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct MemoryWindow {
    pub node: String,
    /// `cpu`, `cuda:<id>`, … (from `device_type` and `device_id`).
    pub device: String,
    /// c10's `DeviceType` number (0 CPU, 1 CUDA, …) and the device's index (-1: the CPU).
    pub device_type: i64,
    pub device_id: i64,
    pub first_step: i64,
    pub last_step: i64,
    /// Memory events read (allocations and frees).
    pub events: u64,
    pub start_s: f64,
    pub end_s: f64,
    /// The highest `Total Allocated` of the window, when (epoch s) and in which step.
    pub peak_allocated_bytes: i64,
    pub peak_s: f64,
    pub peak_step: i64,
    /// The highest `Total Reserved` (0 on the CPU).
    pub peak_reserved_bytes: i64,
    /// `Total Allocated` after the window's first and last event.
    pub first_allocated_bytes: i64,
    pub last_allocated_bytes: i64,
    /// Allocated memory over the window: `[epoch s, bytes]`, 2,000 points at most (each the
    /// highest of its span).
    pub chart: Vec<[f64; 2]>,
}

/// One snapshot file (`framework/memory/<node>/<file>`).
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct MemorySnapshot {
    pub node: String,
    /// `window` or `oom`.
    pub kind: String,
    pub first_step: i64,
    pub last_step: i64,
    /// The path relative to the job (opens in pytorch.org/memory_viz as it is).
    pub file: String,
    pub bytes: u64,
    pub devices: Vec<SnapshotDevice>,
}

/// One device of a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct SnapshotDevice {
    pub device: i64,
    /// History entries (alloc, free, segment events) the snapshot kept.
    pub entries: u64,
    /// First and last history entry, epoch seconds (`null` without history).
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    /// Highest allocated (caching allocator, `torch.cuda.memory_allocated`'s sense) over the
    /// history and at the snapshot; when, epoch seconds (`null`: at the history's start or
    /// without history).
    pub peak_allocated_bytes: i64,
    pub peak_s: Option<f64>,
    /// Highest reserved (the segments, `torch.cuda.memory_reserved`'s sense).
    pub peak_reserved_bytes: i64,
    /// Reserved − allocated at the allocated peak: cached, unused.
    pub fragmentation_bytes: i64,
    pub allocated_bytes: i64,
    pub reserved_bytes: i64,
    pub segments: u64,
    /// The live allocations at the peak, grouped by frame, largest first (15 at most).
    pub top: Vec<SiteRow>,
    /// Allocations at the peak not in `top`.
    pub top_left_out_bytes: i64,
    pub top_left_out_count: u64,
    /// Allocated memory over the history: `[epoch s, bytes]`, 2,000 points at most (each
    /// the highest of its span).
    pub chart: Vec<[f64; 2]>,
    /// The finding when allocated memory grows at every step start of the history.
    pub leak: Option<Leak>,
    /// Whether the history spans enough step starts to judge a leak (4): `leak` is `null`
    /// either way when it did not grow.
    #[serde(default)]
    pub leak_judged: bool,
    /// The agent's reading of the trainer's GPU memory on the same GPU nearest the peak
    /// (`null` without one within 5 s).
    #[serde(default)]
    pub agent: Option<AgentGpuMemory>,
}

/// What the agent saw on the snapshot's GPU (the system metrics' `TrainerMemUsedBytes`: the
/// trainer tree's processes' GPU memory, NVML's), against what the snapshot holds then.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct AgentGpuMemory {
    /// The system node (`algo-<n>`, the host of the snapshot's rank) and its GPU (`gpu<N>`, the
    /// snapshot's device index).
    pub node: String,
    pub gpu: String,
    /// The tick's time, epoch s.
    pub at_s: f64,
    pub trainer_bytes: i64,
    /// The snapshot's reserved memory at the allocated peak (allocated + fragmentation).
    pub reserved_bytes: i64,
    /// `trainer_bytes − reserved_bytes`: memory outside the caching allocator (CUDA context,
    /// NCCL buffers, libraries' workspaces, other processes of the tree on that GPU); negative
    /// when the allocator released memory between the two readings.
    pub outside_bytes: i64,
}

/// Allocations attributed to one Python frame.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct SiteRow {
    /// `(allocated before the history)` when the allocation's stack was not kept.
    pub file: String,
    pub line: i64,
    pub function: String,
    pub bytes: i64,
    pub count: u64,
}

/// Allocated memory grows step over step.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Leak {
    /// `[step, allocated bytes at its start]`.
    pub steps: Vec<[i64; 2]>,
    pub growth_bytes: i64,
    pub per_step_bytes: i64,
    /// Allocations made after the first step's start and still live at the last one's,
    /// grouped by frame, largest first.
    pub sites: Vec<SiteRow>,
    pub sentence: String,
}
