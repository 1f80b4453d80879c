//! The detailed windows as the report holds them (`docs/report.md`, "Detailed windows"):
//! `analysis/detailed.rs` computes them from the torch profiler's events.

use serde::{Deserialize, Serialize};

pub use super::kinds::IdleCategory;

/// `detailed` in the model (`docs/report.md`, "Detailed windows").
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Detailed {
    /// The job's total over every window; `null` without detailed events.
    pub total: Option<DetailedFigures>,
    /// Per rank, window and device, in rank then step order; at most [`MAX_WINDOWS`].
    pub windows: Vec<DetailedWindow>,
    /// Windows past [`MAX_WINDOWS`] (counted in `total`).
    pub windows_left_out: u64,
    /// Op and kernel names longer than 256 bytes, cut (`…`).
    pub names_cut: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DetailedWindow {
    pub rank: String,
    /// The device index of `gpu_functions-dev:<n>`; `null` when the window has no kernel.
    pub device: Option<i64>,
    pub first_step: i64,
    pub last_step: i64,
    /// Step events found for the window's steps.
    pub steps: u64,
    pub start_s: f64,
    pub end_s: f64,
    #[serde(flatten)]
    pub figures: DetailedFigures,
}

#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct DetailedFigures {
    /// Windows summed (1 for a window).
    pub windows: u64,
    pub wall_ms: f64,
    /// Whether any kernel was recorded; without, the GPU figures are `null` / empty.
    pub gpu: bool,
    pub busy_ms: Option<f64>,
    pub busy_pct: Option<f64>,
    pub compute_busy_ms: Option<f64>,
    pub compute_busy_pct: Option<f64>,
    /// Communication against compute (HTA's comm/comp overlap); `null` without a
    /// communication kernel.
    #[serde(default)]
    pub comm_overlap: Option<CommOverlap>,
    pub idle_ms: Option<f64>,
    /// The idle categories in [`IDLE`] order: `name`, `ms`, `pct` (of wall time).
    pub idle: Vec<Share>,
    /// Kernel time summed (kernels on several streams at once count each).
    pub gpu_ms: f64,
    pub kernels: u64,
    /// Device ranges that are not kernels (`record_function` annotations), left out.
    pub annotations: u64,
    pub annotations_ms: f64,
    /// The kernel classes in [`CLASSES`] order: `name`, `ms`, `pct` (of `gpu_ms`), `count`.
    pub classes: Vec<Share>,
    pub ops: u64,
    pub top_kernels: Vec<TopRow>,
    pub top_ops: Vec<TopRow>,
    pub launch_delay: Option<LaunchDelay>,
    pub sentence: String,
}

/// The communication kernels' time and the part of it compute kernels (every class but
/// communication and memcpy/memset) run alongside (`docs/report.md`, "Communication against
/// compute").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CommOverlap {
    /// Communication kernels' time, overlaps counted once, ms.
    pub comm_ms: f64,
    /// The part of it with a compute kernel running, ms.
    pub overlapped_ms: f64,
    /// `overlapped_ms` of `comm_ms`, %.
    pub pct: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Share {
    pub name: String,
    pub ms: f64,
    pub pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TopRow {
    pub name: String,
    /// A kernel's class; absent for an op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    pub count: u64,
    pub self_ms: f64,
    pub total_ms: f64,
    /// Of the GPU time (kernels) or of the wall time (ops).
    pub pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LaunchDelay {
    /// Kernels whose launch time is known.
    pub kernels: u64,
    pub p50_us: Option<f64>,
    pub p90_us: Option<f64>,
    pub max_us: Option<f64>,
    pub mean_us: Option<f64>,
}
