//! The findings' evidence (`findings[].evidence`, `docs/report.md`, "Findings"): each rule's
//! typed struct, whose fields are the documented `--json` keys, the [`Evidence`] enum over
//! them, read back from JSON by the rule a finding names, and the [`Table`] the page draws
//! for it. The rules (`rules/`) fill the structs and give their tables ([`Present`]).

use serde::Serialize;

/// Declares a row of a finding's evidence (a GPU, a rank, a pair) once: the struct, whose
/// fields are the `--json` keys, and its [`Row`] on the page, whose columns are the same names
/// and whose cells are the fields' values. A field's cell is `Cell::from` of its value, or
/// `as f` for `f(value)`. Defined before the evidence's modules below, which use it.
macro_rules! evidence_row {
    ($(#[$m:meta])* pub struct $name:ident {
        $($(#[$fm:meta])* pub $field:ident: $ty:ty $(as $cell:path)?,)*
    }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        pub struct $name {
            $($(#[$fm])* pub $field: $ty,)*
        }

        impl $crate::model::evidence::Row for $name {
            const COLUMNS: &[&str] = &[$(stringify!($field)),*];

            fn cells(&self) -> Vec<$crate::model::evidence::Cell> {
                vec![$(evidence_row!(@cell self.$field.clone() $(, $cell)?)),*]
            }
        }
    };
    (@cell $v:expr) => {
        $crate::model::evidence::Cell::from($v)
    };
    (@cell $v:expr, $cell:path) => {
        $cell($v)
    };
}

/// The evidence as the page shows it: the rule's settings and job-wide numbers as name and
/// value, then one row per node, GPU, rank or pair.
pub trait Present {
    fn present(&self) -> Table;
}

/// What the page draws for a finding's evidence (the page escapes and formats it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    pub facts: Vec<(&'static str, Cell)>,
    pub columns: Vec<&'static str>,
    pub rows: Vec<Vec<Cell>>,
    /// The unit of each fact and column that has one (`%`, `ms`, `datapoints`…), by its
    /// name; a measured number without one is declared here with `""` (a ratio, a distance).
    pub units: &'static [(&'static str, &'static str)],
}

impl Table {
    /// `facts`, then one row per item of `rows`.
    pub fn of<'a, R: Row + 'a>(
        facts: Vec<(&'static str, Cell)>,
        rows: impl IntoIterator<Item = &'a R>,
    ) -> Table {
        Table {
            facts,
            columns: R::COLUMNS.to_vec(),
            rows: rows.into_iter().map(R::cells).collect(),
            units: &[],
        }
    }

    /// The table with its units.
    pub fn units(self, units: &'static [(&'static str, &'static str)]) -> Table {
        Table { units, ..self }
    }

    /// The unit of a fact or column, if it has one.
    pub fn unit(&self, name: &str) -> Option<&'static str> {
        self.units.iter().find(|u| u.0 == name).map(|u| u.1).filter(|u| !u.is_empty())
    }
}

/// A row of a table (declared with `evidence_row!`).
pub trait Row {
    /// The columns: the row's `--json` keys, in order.
    const COLUMNS: &[&str];
    /// The cells, in `COLUMNS` order.
    fn cells(&self) -> Vec<Cell>;
}

/// One value of a table.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Text(String),
    /// A measured number: "–" when it could not be computed.
    Num(Option<f64>),
    Int(Option<i64>),
    Flag(Option<bool>),
    /// Epoch seconds, shown from the job's start.
    Time(Option<f64>),
}

impl From<&str> for Cell {
    fn from(s: &str) -> Cell {
        Cell::Text(s.to_owned())
    }
}
impl From<String> for Cell {
    fn from(s: String) -> Cell {
        Cell::Text(s)
    }
}
impl From<f64> for Cell {
    fn from(v: f64) -> Cell {
        Cell::Num(Some(v))
    }
}
impl From<Option<f64>> for Cell {
    fn from(v: Option<f64>) -> Cell {
        Cell::Num(v)
    }
}
/// Text, or "–" when absent.
impl From<Option<String>> for Cell {
    fn from(s: Option<String>) -> Cell {
        Cell::Text(s.unwrap_or_else(|| "–".to_owned()))
    }
}
impl From<u64> for Cell {
    fn from(v: u64) -> Cell {
        Cell::Int(i64::try_from(v).ok())
    }
}
impl From<i64> for Cell {
    fn from(v: i64) -> Cell {
        Cell::Int(Some(v))
    }
}
impl From<Option<i64>> for Cell {
    fn from(v: Option<i64>) -> Cell {
        Cell::Int(v)
    }
}
impl From<bool> for Cell {
    fn from(v: bool) -> Cell {
        Cell::Flag(Some(v))
    }
}
impl From<Option<bool>> for Cell {
    fn from(v: Option<bool>) -> Cell {
        Cell::Flag(v)
    }
}

/// CPUBottleneck and IOBottleneck (`rules/bottleneck.rs`).
pub mod bottleneck {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Evidence {
        pub threshold_percent: u64,
        pub gpu_threshold: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cpu_threshold: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub io_threshold: Option<f64>,
        pub patience: u64,
        pub nodes: BTreeMap<String, NodeEvidence>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct NodeEvidence {
        pub datapoints: u64,
        pub bottlenecks: u64,
        /// Of the whole job's ticks.
        pub percent: f64,
        pub low_gpu_datapoints: u64,
        pub windows_judged: u64,
        pub windows_triggered: u64,
        pub triggered_windows: Vec<[f64; 2]>,
        pub triggered: bool,
    }
}

/// LowGPUUtilization (`rules/low_gpu.rs`).
pub mod low_gpu {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Evidence {
        pub threshold_p95: f64,
        pub threshold_p5: f64,
        pub window: u64,
        pub patience: u64,
        pub gpus: Vec<GpuEvidence>,
    }

    evidence_row! {
        pub struct GpuEvidence {
            pub node: String,
            pub gpu: String,
            pub datapoints: u64,
            pub windows_judged: u64,
            pub windows_triggered: u64,
            /// `underutilized` or `fluctuating`, at the last judgement that held.
            pub issue: Option<String>,
            pub window_p95: Option<f64>,
            pub window_p5: Option<f64>,
            /// Over the whole job.
            pub p50: Option<f64>,
            pub p95: Option<f64>,
            pub max: Option<f64>,
        }
    }
}

/// GPUMemoryIncrease (`rules/gpu_memory.rs`).
pub mod gpu_memory {
    use serde::{Deserialize, Serialize};

    use super::Cell;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Evidence {
        pub increase: f64,
        pub window: u64,
        pub patience: u64,
        pub gpus: Vec<GpuEvidence>,
    }

    evidence_row! {
        pub struct GpuEvidence {
            pub node: String,
            pub gpu: String,
            pub datapoints: u64,
            pub max_increase: Option<f64>,
            pub at_s: Option<f64> as Cell::Time,
            pub violations: u64,
            pub p50: Option<f64>,
            pub max: Option<f64>,
        }
    }
}

/// GPUMemoryLeak (`rules/memory_leak.rs`).
pub mod memory_leak {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
    pub struct Evidence {
        /// The least growth over the step starts looked at, and the least step starts.
        pub min_growth_bytes: i64,
        pub min_step_starts: u64,
        /// Snapshot devices whose history spans enough step starts to be judged.
        pub devices_judged: u64,
        pub leaks: Vec<LeakEvidence>,
    }

    evidence_row! {
        /// One snapshot device whose allocated memory grew at every step start.
        pub struct LeakEvidence {
            pub node: String,
            pub file: String,
            pub device: i64,
            pub first_step: i64,
            pub last_step: i64,
            pub growth_bytes: i64,
            pub per_step_bytes: i64,
            /// The frame that allocated most of the growth (`file:line function`), or empty.
            pub site: String,
        }
    }
}

/// BatchSize (`rules/batch_size.rs`).
pub mod batch_size {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Evidence {
        pub cpu_threshold_p95: f64,
        pub gpu_threshold_p95: f64,
        pub gpu_memory_threshold_p95: f64,
        pub window: u64,
        pub patience: u64,
        pub gpus: Vec<GpuEvidence>,
    }

    evidence_row! {
        pub struct GpuEvidence {
            pub node: String,
            pub gpu: String,
            pub windows_judged: u64,
            pub windows_triggered: u64,
            /// At the last judgement that held.
            pub cpu_p95: Option<f64>,
            pub gpu_p95: Option<f64>,
            pub gpu_memory_p95: Option<f64>,
            /// Over the whole job.
            pub job_cpu_p95: Option<f64>,
            pub job_gpu_p95: Option<f64>,
            pub job_gpu_memory_p95: Option<f64>,
        }
    }
}

/// StepOutlier (`rules/step_outlier.rs`).
pub mod step_outlier {
    use serde::{Deserialize, Serialize};

    use super::Cell;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Evidence {
        pub stddev: f64,
        pub n_outliers: u64,
        pub min_steps: u64,
        pub ranks: Vec<RankEvidence>,
    }

    evidence_row! {
        pub struct RankEvidence {
            pub rank: String,
            pub mode: String,
            pub steps: u64,
            pub threshold_ms: Option<f64>,
            pub outliers: u64,
            /// At most `rules/step_outlier.rs`'s `MAX_STEPS_LISTED`; the page shows the first 10.
            pub outlier_steps: Vec<i64> as first_steps,
            pub triggered: bool,
        }
    }

    /// The first 10 steps, and "…" when there are more.
    fn first_steps(steps: Vec<i64>) -> Cell {
        let mut listed: Vec<String> = steps.iter().take(10).map(i64::to_string).collect();
        if steps.len() > 10 {
            listed.push("…".to_owned());
        }
        Cell::Text(listed.join(", "))
    }
}

/// Dataloader (`rules/dataloader.rs`).
pub mod dataloader {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Evidence {
        pub min_threshold: u64,
        pub max_threshold: u64,
        pub patience: u64,
        pub cores: u64,
        pub parallel_dataloaders_median: Option<f64>,
        pub seconds_with_dataloading: u64,
        pub events: u64,
        /// From `DataLoaderIterInitialize`.
        pub num_workers: Option<i64>,
        pub pin_memory: Option<bool>,
        pub dataloading_time_s: Quantiles,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Quantiles {
        pub p25: Option<f64>,
        pub p50: Option<f64>,
        pub p95: Option<f64>,
    }
}

/// MaxInitializationTime (`rules/max_init.rs`).
pub mod max_init {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Evidence {
        pub threshold_minutes: f64,
        pub init_s: Option<f64>,
    }
}

/// LoadBalancing (`rules/load_balancing.rs`).
pub mod load_balancing {
    use serde::{Deserialize, Serialize};

    use super::Cell;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Evidence {
        pub threshold: f64,
        pub patience: u64,
        pub pairs_compared: u64,
        /// At most `rules/load_balancing.rs`'s `MAX_PAIRS_LISTED`, in the order compared.
        pub pairs: Vec<Pair>,
    }

    evidence_row! {
        pub struct Pair {
            pub node: String,
            pub gpus: [String; 2] as pair,
            pub distance: f64,
            pub triggered: bool,
        }
    }

    /// `gpu0 / gpu1`.
    fn pair(gpus: [String; 2]) -> Cell {
        format!("{} / {}", gpus[0], gpus[1]).into()
    }
}

/// OverallSystemUsage (`rules/overall.rs`).
pub mod overall {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Evidence {
        pub nodes: BTreeMap<String, NodeUsage>,
    }

    /// One node: `cpu`, `memory`, then `<gpu>_util` and `<gpu>_memory` per GPU, `datapoints`
    /// and `cores`.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct NodeUsage {
        pub cpu: Usage,
        pub memory: Usage,
        /// `<gpu>_util`, `<gpu>_memory`.
        #[serde(flatten)]
        pub gpus: BTreeMap<String, Usage>,
        pub datapoints: u64,
        pub cores: u64,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Usage {
        pub p50: Option<f64>,
        pub p95: Option<f64>,
        pub p99: Option<f64>,
        pub max: Option<f64>,
    }
}

/// ProfilingCost (`analysis/cost.rs`): the agent's CPU against its node's steps' time, and
/// each rank's hook against its steps.
pub mod profiling_cost {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Evidence {
        pub threshold_percent: f64,
        pub nodes: Vec<Node>,
        /// Each rank judged: the agent's share of its node's steps' time plus its hook's.
        pub ranks: Vec<Rank>,
    }

    evidence_row! {
        pub struct Rank {
            pub rank: String,
            pub agent_percent: Option<f64>,
            pub hook_percent: Option<f64>,
            pub total_percent: Option<f64>,
        }
    }

    evidence_row! {
        pub struct Node {
            pub node: String,
            pub cpu_s: f64,
            pub wall_s: f64,
            pub ranks: u64,
            pub steps_percent: Option<f64>,
        }
    }
}

/// `findings[].rule`: each rule's name (SageMaker's), the words a finding is read back by.
pub const CPU_BOTTLENECK: &str = "CPUBottleneck";
pub const IO_BOTTLENECK: &str = "IOBottleneck";
pub const LOW_GPU_UTILIZATION: &str = "LowGPUUtilization";
pub const GPU_MEMORY_INCREASE: &str = "GPUMemoryIncrease";
pub const GPU_MEMORY_LEAK: &str = "GPUMemoryLeak";
pub const BATCH_SIZE: &str = "BatchSize";
pub const STEP_OUTLIER: &str = "StepOutlier";
pub const DATALOADER: &str = "Dataloader";
pub const MAX_INITIALIZATION_TIME: &str = "MaxInitializationTime";
pub const LOAD_BALANCING: &str = "LoadBalancing";
pub const OVERALL_SYSTEM_USAGE: &str = "OverallSystemUsage";
/// trainprof's own: listed only when the agent wrote its cost record.
pub const PROFILING_COST: &str = "ProfilingCost";

/// Declares [`Evidence`]: each line is `Variant(NAME): the rule's evidence`; the rules'
/// registry (`rules/mod.rs`) wraps each rule's verdict in its variant.
macro_rules! evidence {
    ($($variant:ident($name:ident): $ty:ty),* $(,)?) => {
        /// `findings[].evidence`, one variant per rule (JSON: the rule's own keys).
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(untagged)]
        pub enum Evidence {
            $($variant($ty),)*
        }

        impl Evidence {
            /// The evidence of `rule` from its JSON form.
            pub fn from_json(rule: &str, v: serde_json::Value) -> Result<Evidence, EvidenceError> {
                $(if rule == $name {
                    return serde_json::from_value(v)
                        .map(Evidence::$variant)
                        .map_err(|e| EvidenceError::Keys { rule: rule.to_owned(), error: e });
                })*
                Err(EvidenceError::NoRule(rule.to_owned()))
            }

            /// What the page shows (each rule's [`Present`]).
            pub fn present(&self) -> Table {
                match self {
                    $(Evidence::$variant(e) => e.present(),)*
                }
            }
        }
    };
}

evidence! {
    CpuBottleneck(CPU_BOTTLENECK): bottleneck::Evidence,
    IoBottleneck(IO_BOTTLENECK): bottleneck::Evidence,
    LowGpuUtilization(LOW_GPU_UTILIZATION): low_gpu::Evidence,
    GpuMemoryIncrease(GPU_MEMORY_INCREASE): gpu_memory::Evidence,
    GpuMemoryLeak(GPU_MEMORY_LEAK): memory_leak::Evidence,
    BatchSize(BATCH_SIZE): batch_size::Evidence,
    StepOutlier(STEP_OUTLIER): step_outlier::Evidence,
    Dataloader(DATALOADER): dataloader::Evidence,
    MaxInitializationTime(MAX_INITIALIZATION_TIME): max_init::Evidence,
    LoadBalancing(LOAD_BALANCING): load_balancing::Evidence,
    OverallSystemUsage(OVERALL_SYSTEM_USAGE): overall::Evidence,
    ProfilingCost(PROFILING_COST): profiling_cost::Evidence,
}

/// A finding's evidence that cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    /// The finding names no rule of this version.
    #[error("no rule {0:?}")]
    NoRule(String),
    /// The evidence is not the rule's keys.
    #[error("{rule}'s evidence: {error}")]
    Keys { rule: String, error: serde_json::Error },
}
