//! GPUs through NVML (`libnvidia-ml.so.1`, loaded at run time by `nvml-wrapper`).
//!
//! Per GPU `i` (the NVML index, as `nvidia-smi` shows it) and tick, in the vocabulary of
//! `docs/formats.md` ("System metrics: vocabulary" and "GPU", which has every row and its
//! NVML source): under Type `gpu` / Name `gpu<i>` only the two percentages the analysis
//! reads (`GPUUtilization`, `GPUMemoryUtilization`); everything else under Type
//! `accelerator` / Name `device<i>`, with Dimensions that contain neither `GPU` nor
//! `Memory` unless they end in `Percent`.
//!
//! Each kind of query has its own cadence ([`Cadence`], `docs/formats.md`, "GPU: cadence"),
//! because some NVML calls cost a thousand times what others do: the instant readings every
//! tick; the sample buffers often enough that none of their samples is lost (three quarters
//! of the span the ring was seen to hold); the cumulative counters (PCIe, NVLink, energy,
//! ECC, GPM) at most [`Cadence::counters`] apart. Every query runs on the first and on the last tick.
//! A slow query's rows are written on the ticks it runs, and cover the time since its
//! previous run.
//!
//! `GPUUtilization` and `MemoryBusyPercent` are the instant reading
//! (`nvmlDeviceGetUtilizationRates`, NVML's newest sample), or the sample buffer's mean
//! ([`samples`]) when the buffer is read on every tick; `BusyMeanPercent` / `BusyMaxPercent`
//! and their `Memory…` pair are the buffer's mean and maximum over its read interval.
//! `GPUMemoryUtilization` is the memory *footprint* (smdebug computes it the same way).
//!
//! The values come through the [`GpuSource`] trait: [`NvmlSource`] on a real machine, a
//! scripted double in the unit tests, and the real `NvmlSource` over a fake
//! `libnvidia-ml.so.1` built from `tests/c/fake_nvml.c` for the loading path.
//!
//! Errors, per GPU and per [`Query`] (one NVML call or one batch):
//! * *not supported* (NVML `NotSupported`, `FunctionNotFound`, or a function missing from the
//!   library) switches that query off for that GPU only, logged once; inside the batched
//!   field query ([`Field`]) and the GPM query ([`GpmMetric`]) the same holds per field;
//! * anything else is *transient*: that tick leaves the query's dimensions out, the failure is
//!   counted ([`GpuSampler::failures`]) and logged when the query starts and stops failing,
//!   and the next tick asks again. This includes `GpuLost`: the call fails fast, so asking
//!   again costs nothing, and a GPU that falls off the bus then shows as missing values and a
//!   log line rather than as a GPU list that silently shrank; a reset GPU is picked up again.
//!
//! A missing library, a driver that is not loaded, or a machine without GPUs is not an error:
//! [`probe`] says so in one log line and returns `Ok(None)`.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::Path;
use std::time::Duration;

use nvml_wrapper::error::NvmlError;

use super::tree_pids::TreePids;
use super::{MetricType, Metrics, Name, SampleError, Sampler, percent, rate};
use crate::log;
use crate::pipeline::cost::Part;

pub mod attribution;
mod nvml;
mod raw;
pub mod samples;
#[cfg(test)]
mod tests;

pub use attribution::{PidNamespace, ProcessMemory};
pub use nvml::NvmlSource;
pub use samples::{ProcessBusy, SampleStats};

/// The environment variable naming another NVML library (a path), e.g. a fake one for tests.
pub const LIB_ENV: &str = "TRAINPROF_NVML_LIB";

/// The library loaded when [`LIB_ENV`] is not set; the dynamic loader's search path applies.
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// The value of [`LIB_ENV`], if set and not empty: `probe(lib_from_env().as_deref())`.
pub fn lib_from_env() -> Option<OsString> {
    std::env::var_os(LIB_ENV).filter(|v| !v.is_empty())
}

// The Dimensions are the protocol's (`trainprof_output::protocol::metric::dimension`).
use trainprof_output::protocol::metric::dimension as d;
pub use trainprof_output::protocol::metric::dimension::{
    GPU_BUSY_MAX_PERCENT, GPU_BUSY_MEAN_PERCENT, GPU_ECC_DOUBLE_BIT_EVENTS, GPU_ECC_SINGLE_BIT_EVENTS,
    GPU_MEM_USED_BYTES, GPU_MEMORY_BUSY_MAX_PERCENT, GPU_MEMORY_BUSY_MEAN_PERCENT, GPU_MEMORY_BUSY_PERCENT,
    GPU_MEMORY_UTILIZATION, GPU_POWER_WATTS, GPU_SM_CLOCK_MHZ, GPU_TEMPERATURE_CELSIUS, GPU_THROTTLE_MASK,
    GPU_UTILIZATION, GPU_XID_EVENTS, THROTTLE_FLAGS, TOP_PROCESS, TRAINER_MEM_USED_BYTES,
    TRAINER_MEMORY_BUSY_PERCENT, TRAINER_PROCESSES, TRAINER_SM_BUSY_PERCENT, UNATTRIBUTED_MEM_USED_BYTES,
    UNATTRIBUTED_PROCESSES, UNATTRIBUTED_SM_BUSY_PERCENT,
};

// One row of Dimensions per process the attribution ranks.
const _: () = assert!(TOP_PROCESS.len() == attribution::TOP);

/// The Type and Name of GPU `index`'s `dimension`: `gpu` / `gpu<i>` for the two
/// percentages the analysis reads, `accelerator` / `device<i>` for the rest.
pub fn placed(dimension: &str, index: u32) -> (MetricType, Name) {
    if dimension == GPU_UTILIZATION || dimension == GPU_MEMORY_UTILIZATION {
        (MetricType::Gpu, Name::gpu(index))
    } else {
        (MetricType::Accelerator, Name::device(index))
    }
}

/// One NVML call (or batch) per GPU; the unit that is switched off when a GPU lacks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Query {
    /// The instant reading; not asked when the buffers' means stand for the tick.
    Utilization,
    Memory,
    Power,
    Temperature,
    SmClock,
    /// `nvmlDeviceGetSamples` for GPU and memory-controller utilisation.
    UtilizationSamples,
    Throttle,
    /// One `nvmlDeviceGetFieldValues` for the instant [`Field`]s (every tick).
    InstantFields,
    /// One `nvmlDeviceGetFieldValues` for the counter [`Field`]s (at the counters' cadence).
    Fields,
    /// GPM (Hopper and newer): two samples a tick apart.
    Gpm,
    /// Running compute processes (only with a trainer tree).
    Processes,
    /// Per-process utilisation samples (only with a trainer tree).
    ProcessUtilization,
}

impl Query {
    pub const ALL: [Query; 12] = [
        Query::Utilization,
        Query::Memory,
        Query::Power,
        Query::Temperature,
        Query::SmClock,
        Query::UtilizationSamples,
        Query::Throttle,
        Query::InstantFields,
        Query::Fields,
        Query::Gpm,
        Query::Processes,
        Query::ProcessUtilization,
    ];

    /// The dimensions this query fills, for log lines.
    pub fn dimensions(self) -> &'static str {
        match self {
            Query::Utilization => "GPUUtilization, MemoryBusyPercent (instant)",
            Query::Memory => "GPUMemoryUtilization, MemUsedBytes",
            Query::Power => GPU_POWER_WATTS,
            Query::Temperature => GPU_TEMPERATURE_CELSIUS,
            Query::SmClock => GPU_SM_CLOCK_MHZ,
            Query::UtilizationSamples => {
                "the utilisation sample buffer (BusyMaxPercent, MemoryBusyMaxPercent)"
            }
            Query::Throttle => "the throttle reasons",
            Query::InstantFields => "the instant power field",
            Query::Fields => "PCIe, NVLink, energy and ECC counters",
            Query::Gpm => "the GPM metrics",
            Query::Processes => "the processes' GPU memory",
            Query::ProcessUtilization => "the processes' SM and memory busy",
        }
    }

    /// How often it runs.
    pub fn kind(self) -> Kind {
        match self {
            Query::UtilizationSamples | Query::ProcessUtilization => Kind::Buffers,
            Query::Fields | Query::Gpm => Kind::Counters,
            Query::Power | Query::Temperature | Query::SmClock | Query::Throttle => Kind::Second,
            _ => Kind::Tick,
        }
    }

    fn slot(self) -> usize {
        self as usize
    }

    /// Its part in the agent's own account ([`crate::pipeline::cost`]).
    pub fn cost_part(self) -> Part {
        match self {
            Query::Utilization => Part::NvmlUtilization,
            Query::Memory => Part::NvmlMemory,
            Query::Power => Part::NvmlPower,
            Query::Temperature => Part::NvmlTemperature,
            Query::SmClock => Part::NvmlSmClock,
            Query::UtilizationSamples => Part::NvmlUtilizationSamples,
            Query::Throttle => Part::NvmlThrottle,
            Query::InstantFields => Part::NvmlInstantFields,
            Query::Fields => Part::NvmlFields,
            Query::Gpm => Part::NvmlGpm,
            Query::Processes => Part::NvmlProcesses,
            Query::ProcessUtilization => Part::NvmlProcessUtilization,
        }
    }
}

/// The cadence a [`Query`] runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Every tick: instant readings, each a few µs.
    Tick,
    /// NVML's sample buffers (a millisecond or more per call): often enough to lose none.
    Buffers,
    /// Cumulative counters (PCIe and NVLink bytes, energy, ECC counts, GPM samples): the
    /// totals and means between two reads are exact however far apart they are.
    Counters,
    /// Readings that move slowly or are already a mean over a second (power usage, which
    /// NVML averages over 1 s on current GPUs; temperature, SM clock, throttle reasons): once
    /// a second, each a few to tens of µs on a real driver.
    Second,
}

/// How often the slow [`Kind`]s run (`docs/formats.md`, "GPU: cadence").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// Counters: at most this long apart.
    pub counters: Duration,
    /// Buffers: three quarters of the span the ring was seen to hold, within these bounds
    /// (the lower one until a span was seen).
    pub buffers_min: Duration,
    pub buffers_max: Duration,
    /// The slow instant readings ([`Kind::Second`]): at most this long apart.
    pub second: Duration,
    /// The instant utilisation only when the driver has a new sample since its last read
    /// (its sample period seen in the buffers); between, the last reading stands, which is
    /// what NVML would return (docs/formats.md, "GPU: cadence").
    pub utilization_per_sample: bool,
}

impl Cadence {
    /// 60 s for the counters; the buffers between 1 s and 30 s (docs/formats.md, "GPU:
    /// cadence": an H200's ring holds 14 s, read every 10.5 s).
    pub const DEFAULT: Cadence = Cadence {
        counters: Duration::from_secs(60),
        buffers_min: Duration::from_secs(1),
        buffers_max: Duration::from_secs(30),
        second: Duration::from_secs(1),
        utilization_per_sample: true,
    };

    /// Every query on every tick.
    pub const EVERY_TICK: Cadence = Cadence {
        counters: Duration::ZERO,
        buffers_min: Duration::ZERO,
        buffers_max: Duration::ZERO,
        second: Duration::ZERO,
        utilization_per_sample: false,
    };

    /// The buffers' cadence for a ring seen to hold `held` (µs), or none seen yet: three
    /// quarters of the span, so that a read may come a quarter of it late (a loaded machine's
    /// tick) and still find the previous read's newest sample in the ring.
    pub fn buffers(&self, held: Option<u64>) -> Duration {
        match held {
            Some(us) => (Duration::from_micros(us) * 3 / 4).clamp(self.buffers_min, self.buffers_max),
            None => self.buffers_min,
        }
    }
}

/// The values read in one `nvmlDeviceGetFieldValues` call, each with its own result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// Bytes sent over PCIe since the driver loaded (`NVML_FI_DEV_PCIE_COUNT_TX_BYTES`).
    PcieTxBytes,
    PcieRxBytes,
    /// KiB of NVLink data sent, all links (`NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`, scope
    /// `UINT_MAX`).
    NvlinkTxKib,
    NvlinkRxKib,
    /// `NVML_FI_DEV_POWER_INSTANT`, mW.
    PowerInstantMilliwatts,
    /// `NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, mJ since the driver loaded (the counter of
    /// `nvmlDeviceGetTotalEnergyConsumption`).
    EnergyMillijoules,
    /// `NVML_FI_DEV_ECC_SBE_VOL_TOTAL`: corrected (single-bit) errors since the driver loaded.
    EccCorrectedVolatile,
    EccUncorrectedVolatile,
    /// `…_AGG_TOTAL`: over the board's life.
    EccCorrectedAggregate,
    EccUncorrectedAggregate,
}

impl Field {
    pub const ALL: [Field; 10] = [
        Field::PcieTxBytes,
        Field::PcieRxBytes,
        Field::NvlinkTxKib,
        Field::NvlinkRxKib,
        Field::PowerInstantMilliwatts,
        Field::EnergyMillijoules,
        Field::EccCorrectedVolatile,
        Field::EccUncorrectedVolatile,
        Field::EccCorrectedAggregate,
        Field::EccUncorrectedAggregate,
    ];

    /// The NVML field id. All are below 251, the range whose numbering changed with driver
    /// 580.82, so no translation is needed.
    pub fn id(self) -> u32 {
        match self {
            Field::PcieTxBytes => 197,
            Field::PcieRxBytes => 198,
            Field::NvlinkTxKib => 138,
            Field::NvlinkRxKib => 139,
            Field::PowerInstantMilliwatts => 186,
            Field::EnergyMillijoules => 83,
            Field::EccCorrectedVolatile => 3,
            Field::EccUncorrectedVolatile => 4,
            Field::EccCorrectedAggregate => 5,
            Field::EccUncorrectedAggregate => 6,
        }
    }

    /// The `scopeId`: `UINT_MAX` sums the NVLink counters over all links.
    pub fn scope(self) -> u32 {
        match self {
            Field::NvlinkTxKib | Field::NvlinkRxKib => u32::MAX,
            _ => 0,
        }
    }

    /// The batch it is read in: the instant power every tick, the counters at their cadence.
    pub fn batch(self) -> Query {
        match self {
            Field::PowerInstantMilliwatts => Query::InstantFields,
            _ => Query::Fields,
        }
    }

    /// The row it gives: counters as a rate over the interval, the rest as read.
    pub fn dimension(self) -> &'static str {
        match self {
            Field::PcieTxBytes => d::GPU_PCIE_TX_BYTES_PER_SECOND,
            Field::PcieRxBytes => d::GPU_PCIE_RX_BYTES_PER_SECOND,
            Field::NvlinkTxKib => d::GPU_NVLINK_TX_BYTES_PER_SECOND,
            Field::NvlinkRxKib => d::GPU_NVLINK_RX_BYTES_PER_SECOND,
            Field::PowerInstantMilliwatts => d::GPU_POWER_INSTANT_WATTS,
            Field::EnergyMillijoules => d::GPU_ENERGY_MEAN_WATTS,
            Field::EccCorrectedVolatile => d::GPU_ECC_CORRECTED_VOLATILE,
            Field::EccUncorrectedVolatile => d::GPU_ECC_UNCORRECTED_VOLATILE,
            Field::EccCorrectedAggregate => d::GPU_ECC_CORRECTED_AGGREGATE,
            Field::EccUncorrectedAggregate => d::GPU_ECC_UNCORRECTED_AGGREGATE,
        }
    }

    /// For a counter whose rate is written: the factor from its unit to the row's.
    fn rate_scale(self) -> Option<f64> {
        match self {
            Field::PcieTxBytes | Field::PcieRxBytes => Some(1.0),
            Field::NvlinkTxKib | Field::NvlinkRxKib => Some(1024.0),
            Field::EnergyMillijoules => Some(0.001),
            _ => None,
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// The GPM metrics read on Hopper and newer (percent of the interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpmMetric {
    SmActive,
    SmOccupancy,
    TensorActive,
    DramActive,
}

impl GpmMetric {
    pub const ALL: [GpmMetric; 4] =
        [GpmMetric::SmActive, GpmMetric::SmOccupancy, GpmMetric::TensorActive, GpmMetric::DramActive];

    pub fn dimension(self) -> &'static str {
        match self {
            GpmMetric::SmActive => d::GPU_SM_ACTIVE_PERCENT,
            GpmMetric::SmOccupancy => d::GPU_SM_OCCUPANCY_PERCENT,
            GpmMetric::TensorActive => d::GPU_TENSOR_ACTIVE_PERCENT,
            GpmMetric::DramActive => d::GPU_DRAM_ACTIVE_PERCENT,
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// Each [`Field`]'s value (raw, in NVML's unit) or why not; only the fields of the batch
/// asked for are looked at.
pub type FieldValues = [Result<u64, GpuReadError>; Field::ALL.len()];
/// Each [`GpmMetric`]'s value or why not.
pub type GpmValues = [Result<f64, GpuReadError>; GpmMetric::ALL.len()];

/// What one [`Query`] returned, in NVML's units.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    Utilization {
        gpu_percent: u32,
        memory_busy_percent: u32,
    },
    Memory {
        used_bytes: u64,
        total_bytes: u64,
    },
    PowerMilliwatts(u32),
    TemperatureCelsius(u32),
    SmClockMhz(u32),
    /// The samples since the previous read.
    UtilizationSamples {
        gpu: SampleStats,
        memory_busy: SampleStats,
    },
    /// The raw reasons mask.
    Throttle(u64),
    Fields(FieldValues),
    /// `None` for the first GPM sample (a figure needs two).
    Gpm(Option<GpmValues>),
    Processes(Vec<ProcessMemory>),
    /// Averaged per process over the samples since the previous read.
    ProcessUtilization(Vec<ProcessBusy>),
}

/// Why a [`Query`] failed. `Copy` with a static text, so that a GPU failing every tick
/// allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GpuReadError {
    /// This GPU or this driver cannot answer the query: it is switched off for the GPU.
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    /// Anything else; asked again next tick.
    #[error("{0}")]
    Failed(&'static str),
}

impl GpuReadError {
    /// Sorts an NVML error into switched off / asked again.
    pub fn from_nvml(e: &NvmlError) -> GpuReadError {
        let what = nvml_error_text(e);
        match e {
            NvmlError::NotSupported | NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_) => {
                GpuReadError::NotSupported(what)
            }
            _ => GpuReadError::Failed(what),
        }
    }
}

/// A short, static description of an NVML error (nvml-wrapper's own `Display` allocates for
/// some variants, and this runs on the tick).
fn nvml_error_text(e: &NvmlError) -> &'static str {
    match e {
        NvmlError::NotSupported => "NVML_ERROR_NOT_SUPPORTED",
        NvmlError::FunctionNotFound => "NVML_ERROR_FUNCTION_NOT_FOUND",
        NvmlError::FailedToLoadSymbol(_) => "function missing from the NVML library",
        NvmlError::GpuLost => "GPU lost (NVML_ERROR_GPU_IS_LOST)",
        NvmlError::ResetRequired => "GPU needs a reset (NVML_ERROR_RESET_REQUIRED)",
        NvmlError::NoPermission => "no permission (NVML_ERROR_NO_PERMISSION)",
        NvmlError::Uninitialized => "NVML not initialised (NVML_ERROR_UNINITIALIZED)",
        NvmlError::InvalidArg => "invalid argument (NVML_ERROR_INVALID_ARGUMENT)",
        NvmlError::Timeout => "timed out (NVML_ERROR_TIMEOUT)",
        NvmlError::DriverNotLoaded => "driver not loaded (NVML_ERROR_DRIVER_NOT_LOADED)",
        NvmlError::LibRmVersionMismatch => {
            "driver and NVML versions differ (NVML_ERROR_LIB_RM_VERSION_MISMATCH)"
        }
        NvmlError::InsufficientPower => "power cables not attached (NVML_ERROR_INSUFFICIENT_POWER)",
        NvmlError::IrqIssue => "interrupt issue (NVML_ERROR_IRQ_ISSUE)",
        NvmlError::OperatingSystem => "blocked by the operating system (NVML_ERROR_OPERATING_SYSTEM)",
        NvmlError::InsufficientMemory => "out of memory (NVML_ERROR_MEMORY)",
        NvmlError::NoData => "no data (NVML_ERROR_NO_DATA)",
        NvmlError::NotFound => "not found (NVML_ERROR_NOT_FOUND)",
        NvmlError::Unknown => "unknown error (NVML_ERROR_UNKNOWN)",
        NvmlError::UnexpectedVariant(_) => "unexpected NVML return code",
        _ => "unexpected NVML error",
    }
}

/// What does not change while the agent runs, read once at probe for the log and the run
/// summary. A field NVML would not give is `None`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuFacts {
    /// The NVML index: the `i` of `gpu<i>`.
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub memory_total_bytes: Option<u64>,
    /// The enforced power limit.
    pub power_limit_watts: Option<f64>,
    /// Whether Xid / ECC events are registered for this GPU ([`GpuSource::poll_events`]).
    pub events: bool,
}

impl fmt::Display for GpuFacts {
    /// `gpu0 NVIDIA A100-SXM4-40GB (GPU-…, 40960 MiB, power limit 400 W)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpu{} {} (", self.index, self.name.as_deref().unwrap_or("(name unknown)"))?;
        write!(f, "{}", self.uuid.as_deref().unwrap_or("uuid unknown"))?;
        match self.memory_total_bytes {
            Some(b) => write!(f, ", {} MiB", b >> 20)?,
            None => f.write_str(", memory unknown")?,
        }
        match self.power_limit_watts {
            Some(w) => write!(f, ", power limit {w} W)"),
            None => f.write_str(", no power limit)"),
        }
    }
}

/// An NVML event of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuEvent {
    /// A critical Xid error with its code (NVML gives the most recent Xid of the GPU;
    /// `None` when it cannot say).
    Xid(Option<u64>),
    SingleBitEcc,
    DoubleBitEcc,
}

/// Where GPU values come from. Blocking calls: run on the sampling thread.
pub trait GpuSource: Send {
    /// The NVML indices of the GPUs to sample, fixed for the source's life.
    fn devices(&self) -> Vec<u32>;

    /// The static facts of one GPU (called once per GPU, at probe).
    fn facts(&mut self, index: u32) -> GpuFacts;

    /// One query of one GPU.
    fn read(&mut self, index: u32, query: Query) -> Result<Reading, GpuReadError>;

    /// The events that arrived since the last call, without waiting, as `(GPU, event)`; at
    /// most [`MAX_EVENTS_PER_TICK`] per GPU. Only GPUs whose facts say `events`.
    fn poll_events(&mut self, _out: &mut Vec<(u32, GpuEvent)>) -> Result<(), GpuReadError> {
        Ok(())
    }
}

/// Events read per GPU and tick at most; the rest wait for the next tick.
pub const MAX_EVENTS_PER_TICK: usize = 64;

/// Events logged one line each per GPU; later ones are counted only (said once).
pub const MAX_EVENT_LOGS: u64 = 32;

/// Finds the GPUs: [`NvmlSource::open`] with `lib` (e.g. [`lib_from_env`]) or
/// `libnvidia-ml.so.1`. `Ok(None)` when this machine has no usable NVML or no GPU.
pub fn probe(lib: Option<&OsStr>) -> Result<Option<GpuSampler<NvmlSource>>, SampleError> {
    Ok(NvmlSource::open(lib)?.map(GpuSampler::new))
}

/// [`probe`], and with a trainer its tree's processes are attributed (`tree`: the tree
/// sampler's pids, as `proc_root` shows them).
pub fn probe_with(
    lib: Option<&OsStr>,
    tree: Option<TreePids>,
    proc_root: &Path,
) -> Result<Option<GpuSampler<NvmlSource>>, SampleError> {
    let sampler = probe(lib)?;
    Ok(match tree {
        Some(tree) => sampler.map(|s| s.with_tree(tree, PidNamespace::of(proc_root))),
        None => sampler,
    })
}

/// A query's or a field's state on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QueryState {
    /// Read on the last tick, or not yet asked.
    Ok,
    /// Not supported on this GPU: never asked again.
    Off,
    /// Failing for `ticks` ticks in a row, the last time with `error` (the log shows changes
    /// only).
    Failing { error: GpuReadError, ticks: u64 },
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct EventCounts {
    xid: u64,
    single_bit_ecc: u64,
    double_bit_ecc: u64,
    /// Of those, logged one line each (at most [`MAX_EVENT_LOGS`]).
    logged: u64,
}

#[derive(Debug)]
struct GpuState {
    index: u32,
    queries: [QueryState; Query::ALL.len()],
    fields: [QueryState; Field::ALL.len()],
    gpm: [QueryState; GpmMetric::ALL.len()],
    /// The previous reading of each counter field and when.
    counters: [Option<(u64, Duration)>; Field::ALL.len()],
    events: EventCounts,
    /// When the buffers and the counters are next due (`None` before the first tick).
    buffers_due: Option<Duration>,
    counters_due: Option<Duration>,
    second_due: Option<Duration>,
    /// The buffers' cadence ([`Cadence::buffers`] of the span they were seen to hold).
    buffers_every: Duration,
    held_us: Option<u64>,
    /// The tick the buffers were last read on.
    buffers_read: Option<Duration>,
    /// Samples of the GPU-utilisation buffer read, and lost between reads.
    samples_read: u64,
    samples_lost: u64,
    /// The driver's sample period and a sample's timestamp (µs, NVML's wall clock), from
    /// the buffers; the last instant reading and when it was taken (the same clock).
    sample_period_us: Option<u64>,
    sample_anchor_us: u64,
    utilization: Option<((u32, u32), u64)>,
}

impl GpuState {
    fn new(index: u32) -> GpuState {
        GpuState {
            index,
            queries: [QueryState::Ok; Query::ALL.len()],
            fields: [QueryState::Ok; Field::ALL.len()],
            gpm: [QueryState::Ok; GpmMetric::ALL.len()],
            counters: [None; Field::ALL.len()],
            events: EventCounts::default(),
            buffers_due: None,
            counters_due: None,
            second_due: None,
            buffers_every: Duration::ZERO,
            held_us: None,
            buffers_read: None,
            samples_read: 0,
            samples_lost: 0,
            sample_period_us: None,
            sample_anchor_us: 0,
            utilization: None,
        }
    }

    /// Whether a query of `kind` runs on the tick at `now` (every kind on the first tick
    /// and on the `last`).
    fn due(&self, kind: Kind, now: Duration, last: bool) -> bool {
        let at = match kind {
            Kind::Tick => return true,
            Kind::Buffers => self.buffers_due,
            Kind::Counters => self.counters_due,
            Kind::Second => self.second_due,
        };
        last || at.is_none_or(|at| now >= at)
    }
}

/// Now on NVML's clock for sample timestamps (epoch µs).
fn wall_now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl GpuState {
    /// Whether the driver has taken no utilisation sample since the last instant reading:
    /// the samples fall every period from the anchor, and the next after that reading is
    /// more than a tenth of a period away still. Unknown (no period, no reading, a clock
    /// that disagrees with NVML's by more than a minute): false, so it is read.
    fn no_new_sample(&self, now_us: u64) -> bool {
        let (Some(period), Some((_, read_at))) = (self.sample_period_us, self.utilization) else {
            return false;
        };
        let anchor = self.sample_anchor_us;
        if !(10_000..=2_000_000).contains(&period) || read_at < anchor || now_us < read_at {
            return false;
        }
        // The anchor moves at every buffer read (at most 30 s apart): older than a minute,
        // the clocks disagree.
        if now_us - anchor > 60_000_000 {
            return false;
        }
        let newest_at_read = anchor + (read_at - anchor) / period * period;
        now_us + period / 10 < newest_at_read + period
    }
}

/// The next due time of a kind read at `now` every `every`: the last tick before `every`
/// has passed (`tick` is the tick's length, which the next one is taken to have). On the
/// first tick the GPUs are spread over the period (`share` of it: GPU k of n reads at
/// (k + 1) / n of it), so that their slow calls fall on different ticks.
fn next_due(now: Duration, every: Duration, tick: Duration, share: Option<f64>) -> Duration {
    match share {
        Some(f) => now + every.mul_f64(f).saturating_sub(tick),
        None => now + every.saturating_sub(tick),
    }
}

/// Samples every GPU of a [`GpuSource`] each tick; see the module docs for the dimensions and
/// the error policy.
#[derive(Debug)]
pub struct GpuSampler<S: GpuSource = NvmlSource> {
    source: S,
    gpus: Vec<GpuState>,
    facts: Vec<GpuFacts>,
    failures: u64,
    /// The trainer tree (with `trainprof run`) and the pid namespace its pids are in.
    tree: Option<(TreePids, PidNamespace)>,
    events_on: bool,
    event_buf: Vec<(u32, GpuEvent)>,
    tree_buf: Vec<u32>,
    cadence: Cadence,
    /// The previous tick, and whether this one is the job's last.
    prev_tick: Option<Duration>,
    last: bool,
}

impl<S: GpuSource> GpuSampler<S> {
    /// Reads the static facts of every GPU and logs them in one line.
    pub fn new(mut source: S) -> GpuSampler<S> {
        let indices = source.devices();
        let facts: Vec<GpuFacts> = indices.iter().map(|&i| source.facts(i)).collect();
        let gpus = indices.iter().map(|&index| GpuState::new(index)).collect();
        let list = facts.iter().map(GpuFacts::to_string).collect::<Vec<_>>().join("; ");
        log!("gpu: {} GPU{}: {list}", facts.len(), if facts.len() == 1 { "" } else { "s" });
        let events_on = facts.iter().any(|f| f.events);
        GpuSampler {
            source,
            gpus,
            facts,
            failures: 0,
            tree: None,
            events_on,
            event_buf: Vec::new(),
            tree_buf: Vec::new(),
            cadence: Cadence::DEFAULT,
            prev_tick: None,
            last: false,
        }
    }

    /// Another [`Cadence`] than [`Cadence::DEFAULT`].
    pub fn with_cadence(mut self, cadence: Cadence) -> GpuSampler<S> {
        self.cadence = cadence;
        self
    }

    /// GPU `index`'s sample buffers: how often they are read now, and the samples read and
    /// lost so far (GPU utilisation buffer).
    pub fn buffer_state(&self, index: u32) -> Option<(Duration, u64, u64)> {
        let g = self.gpus.iter().find(|g| g.index == index)?;
        Some((g.buffers_every, g.samples_read, g.samples_lost))
    }

    /// Attributes the GPUs' processes to the trainer tree whose pids `tree` publishes
    /// (`docs/formats.md`, "GPU: the trainer's processes").
    pub fn with_tree(mut self, tree: TreePids, ns: PidNamespace) -> GpuSampler<S> {
        if ns == PidNamespace::Child {
            log!(
                "gpu: this agent is not in the host pid namespace: GPU processes outside the \
                 trainer tree's pids are reported as unattributed"
            );
        }
        self.tree = Some((tree, ns));
        self
    }

    /// The static facts of each sampled GPU, for the run summary.
    pub fn facts(&self) -> &[GpuFacts] {
        &self.facts
    }

    /// Transient read failures so far (one per query, GPU and tick).
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// The queries switched off for GPU `index` (not supported there).
    pub fn switched_off(&self, index: u32) -> impl Iterator<Item = Query> + '_ {
        let gpu = self.gpus.iter().find(move |g| g.index == index);
        Query::ALL.into_iter().filter(move |q| gpu.is_some_and(|g| g.queries[q.slot()] == QueryState::Off))
    }

    /// The fields switched off for GPU `index`.
    pub fn fields_off(&self, index: u32) -> impl Iterator<Item = Field> + '_ {
        let gpu = self.gpus.iter().find(move |g| g.index == index);
        Field::ALL.into_iter().filter(move |f| gpu.is_some_and(|g| g.fields[f.slot()] == QueryState::Off))
    }

    /// The events counted so far on GPU `index`: (Xid, single-bit ECC, double-bit ECC, how
    /// many of those were logged).
    pub fn event_counts(&self, index: u32) -> Option<(u64, u64, u64, u64)> {
        let g = self.gpus.iter().find(|g| g.index == index)?;
        let c = g.events;
        Some((c.xid, c.single_bit_ecc, c.double_bit_ecc, c.logged))
    }

    fn poll_events(&mut self) {
        if !self.events_on {
            return;
        }
        self.event_buf.clear();
        match self.source.poll_events(&mut self.event_buf) {
            Ok(()) => {}
            Err(e @ GpuReadError::NotSupported(_)) => {
                log!("gpu: Xid and ECC events switched off: {e}");
                self.events_on = false;
            }
            Err(e @ GpuReadError::Failed(_)) => {
                self.failures += 1;
                log!("gpu: cannot read Xid and ECC events: {e}");
            }
        }
        for &(index, event) in &self.event_buf {
            let Some(gpu) = self.gpus.iter_mut().find(|g| g.index == index) else { continue };
            let c = &mut gpu.events;
            match event {
                GpuEvent::Xid(_) => c.xid += 1,
                GpuEvent::SingleBitEcc => c.single_bit_ecc += 1,
                GpuEvent::DoubleBitEcc => c.double_bit_ecc += 1,
            }
            let n = c.xid + c.single_bit_ecc + c.double_bit_ecc;
            if n <= MAX_EVENT_LOGS {
                c.logged += 1;
                match event {
                    GpuEvent::Xid(Some(code)) => log!("gpu{index}: Xid {code} (critical error event)"),
                    GpuEvent::Xid(None) => log!("gpu{index}: Xid (code unknown) (critical error event)"),
                    GpuEvent::SingleBitEcc => log!("gpu{index}: single-bit ECC error event"),
                    GpuEvent::DoubleBitEcc => log!("gpu{index}: double-bit ECC error event"),
                }
                if n == MAX_EVENT_LOGS {
                    log!("gpu{index}: {MAX_EVENT_LOGS} events logged; later ones are counted only");
                }
            }
        }
    }
}

/// Asks `query` unless it is switched off; handles its failure (switch off, or count and log
/// on change).
fn ask<S: GpuSource>(
    source: &mut S,
    failures: &mut u64,
    gpu: &mut GpuState,
    query: Query,
) -> Option<Reading> {
    let name = Name::gpu(gpu.index);
    let state = &mut gpu.queries[query.slot()];
    if *state == QueryState::Off {
        return None;
    }
    let read = {
        let _cost = crate::pipeline::cost::span(query.cost_part());
        source.read(gpu.index, query)
    };
    match read {
        Ok(reading) => {
            if let QueryState::Failing { ticks, .. } = *state {
                let s = if ticks == 1 { "" } else { "s" };
                log!("{name}: {} read again after {ticks} failed tick{s}", query.dimensions());
            }
            *state = QueryState::Ok;
            Some(reading)
        }
        Err(error) => {
            *state = failed(*state, error, failures, |what| log!("{name}: {} {what}", query.dimensions()));
            None
        }
    }
}

/// The state after `error`, logging through `say` what changed.
fn failed(
    state: QueryState,
    error: GpuReadError,
    failures: &mut u64,
    say: impl Fn(fmt::Arguments<'_>),
) -> QueryState {
    match error {
        GpuReadError::NotSupported(_) => {
            say(format_args!("switched off: {error}"));
            QueryState::Off
        }
        GpuReadError::Failed(_) => {
            *failures += 1;
            let ticks = match state {
                QueryState::Failing { error: was, ticks } if was == error => ticks,
                QueryState::Failing { ticks, .. } => {
                    say(format_args!("cannot be read: now {error}"));
                    ticks
                }
                _ => {
                    say(format_args!("cannot be read: {error}; asked again at its next read"));
                    0
                }
            };
            QueryState::Failing { error, ticks: ticks + 1 }
        }
    }
}

/// A value of a field or GPM metric: passes it on, or switches the field off / counts it.
fn field_value<T>(
    state: &mut QueryState,
    value: Result<T, GpuReadError>,
    failures: &mut u64,
    index: u32,
    dimension: &str,
) -> Option<T> {
    if *state == QueryState::Off {
        return None;
    }
    match value {
        Ok(v) => {
            *state = QueryState::Ok;
            Some(v)
        }
        Err(error) => {
            *state = failed(*state, error, failures, |what| log!("gpu{index}: {dimension} {what}"));
            None
        }
    }
}

impl<S: GpuSource> GpuSampler<S> {
    fn sample_gpu(&mut self, i: usize, now: Duration, out: &mut Metrics) {
        let source = &mut self.source;
        let failures = &mut self.failures;
        let cadence = self.cadence;
        let last = self.last;
        let prev_tick = self.prev_tick;
        let tick = prev_tick.map_or(Duration::ZERO, |p| now.saturating_sub(p));
        let share = prev_tick.is_none().then(|| (i + 1) as f64 / self.gpus.len() as f64);
        let gpu = &mut self.gpus[i];
        let index = gpu.index;
        let mut put = |dimension: &'static str, value: f64| {
            let (kind, name) = placed(dimension, index);
            out.push(kind, name, dimension, value);
        };
        let buffers = gpu.due(Kind::Buffers, now, last);
        let counters = gpu.due(Kind::Counters, now, last);
        let second = gpu.due(Kind::Second, now, last);

        // Utilisation: the instant reading, or the buffers' means when they are read every
        // tick (their interval is the tick's); the buffers' mean and max over their interval.
        let (mut gpu_done, mut mem_done) = (false, false);
        if buffers {
            let every_tick = gpu.buffers_read == prev_tick;
            if let Some(Reading::UtilizationSamples { gpu: g, memory_busy: m }) =
                ask(source, failures, gpu, Query::UtilizationSamples)
            {
                if g.count > 0 {
                    if every_tick {
                        put(GPU_UTILIZATION, g.mean);
                        gpu_done = true;
                    }
                    put(GPU_BUSY_MEAN_PERCENT, g.mean);
                    put(GPU_BUSY_MAX_PERCENT, g.max);
                }
                if m.count > 0 {
                    if every_tick {
                        put(GPU_MEMORY_BUSY_PERCENT, m.mean);
                        mem_done = true;
                    }
                    put(GPU_MEMORY_BUSY_MEAN_PERCENT, m.mean);
                    put(GPU_MEMORY_BUSY_MAX_PERCENT, m.max);
                }
                buffer_seen(gpu, &cadence, g, m);
            }
        }
        let wall_us = wall_now_us();
        let unchanged = cadence.utilization_per_sample && !last && gpu.no_new_sample(wall_us);
        let instant = if unchanged {
            gpu.utilization.map(|((g, m), _)| Reading::Utilization { gpu_percent: g, memory_busy_percent: m })
        } else if !(gpu_done && mem_done) {
            let r = ask(source, failures, gpu, Query::Utilization);
            gpu.utilization = match r {
                Some(Reading::Utilization { gpu_percent, memory_busy_percent }) => {
                    Some(((gpu_percent, memory_busy_percent), wall_us))
                }
                _ => None,
            };
            r
        } else {
            None
        };
        if !(gpu_done && mem_done)
            && let Some(Reading::Utilization { gpu_percent, memory_busy_percent }) = instant
        {
            if !gpu_done {
                put(GPU_UTILIZATION, f64::from(gpu_percent));
            }
            if !mem_done {
                put(GPU_MEMORY_BUSY_PERCENT, f64::from(memory_busy_percent));
            }
        }

        for query in [Query::Memory, Query::Power, Query::Temperature, Query::SmClock, Query::Throttle] {
            if query.kind() == Kind::Second && !second {
                continue;
            }
            match ask(source, failures, gpu, query) {
                Some(Reading::Memory { used_bytes, total_bytes }) => {
                    // Total 0 (never seen, but a broken board could say so) gives NaN: left out.
                    put(GPU_MEMORY_UTILIZATION, percent(used_bytes as f64, total_bytes as f64));
                    put(GPU_MEM_USED_BYTES, used_bytes as f64);
                }
                Some(Reading::PowerMilliwatts(mw)) => put(GPU_POWER_WATTS, f64::from(mw) / 1000.0),
                Some(Reading::TemperatureCelsius(c)) => put(GPU_TEMPERATURE_CELSIUS, f64::from(c)),
                Some(Reading::SmClockMhz(mhz)) => put(GPU_SM_CLOCK_MHZ, f64::from(mhz)),
                Some(Reading::Throttle(mask)) => {
                    put(GPU_THROTTLE_MASK, mask as f64);
                    for (bit, dimension) in THROTTLE_FLAGS {
                        if mask & bit != 0 {
                            put(dimension, 1.0);
                        }
                    }
                }
                _ => {}
            }
        }

        let batches: &[Query] =
            if counters { &[Query::InstantFields, Query::Fields] } else { &[Query::InstantFields] };
        for &batch in batches {
            let Some(Reading::Fields(values)) = ask(source, failures, gpu, batch) else { continue };
            for (field, value) in Field::ALL.into_iter().zip(values) {
                if field.batch() != batch {
                    continue;
                }
                let state = &mut gpu.fields[field.slot()];
                let Some(v) = field_value(state, value, failures, index, field.dimension()) else { continue };
                match field.rate_scale() {
                    Some(scale) => {
                        if let Some((prev, then)) = gpu.counters[field.slot()] {
                            put(field.dimension(), rate(prev, v, now.saturating_sub(then)) * scale);
                        }
                        gpu.counters[field.slot()] = Some((v, now));
                    }
                    None if field == Field::PowerInstantMilliwatts => {
                        put(field.dimension(), v as f64 / 1000.0)
                    }
                    None => put(field.dimension(), v as f64),
                }
            }
            let mut of_batch = Field::ALL.into_iter().filter(|f| f.batch() == batch);
            if of_batch.all(|f| gpu.fields[f.slot()] == QueryState::Off) {
                log!("gpu{index}: no field is supported: {} switched off", batch.dimensions());
                gpu.queries[batch.slot()] = QueryState::Off;
            }
        }

        if counters && let Some(Reading::Gpm(Some(values))) = ask(source, failures, gpu, Query::Gpm) {
            for (metric, value) in GpmMetric::ALL.into_iter().zip(values) {
                let state = &mut gpu.gpm[metric.slot()];
                if let Some(v) = field_value(state, value, failures, index, metric.dimension()) {
                    put(metric.dimension(), v);
                }
            }
            if gpu.gpm.iter().all(|s| *s == QueryState::Off) {
                gpu.queries[Query::Gpm.slot()] = QueryState::Off;
            }
        }

        if let Some((_, ns)) = self.tree {
            let memory = match ask(source, failures, gpu, Query::Processes) {
                Some(Reading::Processes(p)) => Some(p),
                _ => None,
            };
            let busy = match buffers.then(|| ask(source, failures, gpu, Query::ProcessUtilization)) {
                Some(Some(Reading::ProcessUtilization(b))) => Some(b),
                _ => None,
            };
            if memory.is_some() || busy.is_some() {
                let a = attribution::attribute(memory.as_deref(), busy.as_deref(), &self.tree_buf, ns);
                put(TRAINER_PROCESSES, f64::from(a.processes));
                if memory.is_some() {
                    put(TRAINER_MEM_USED_BYTES, a.used_bytes as f64);
                }
                if busy.is_some() {
                    put(TRAINER_SM_BUSY_PERCENT, a.sm_percent);
                    put(TRAINER_MEMORY_BUSY_PERCENT, a.memory_busy_percent);
                }
                if let Some(u) = a.unattributed {
                    put(UNATTRIBUTED_PROCESSES, f64::from(u.processes));
                    if memory.is_some() {
                        put(UNATTRIBUTED_MEM_USED_BYTES, u.used_bytes as f64);
                    }
                    if busy.is_some() {
                        put(UNATTRIBUTED_SM_BUSY_PERCENT, u.sm_percent);
                    }
                }
                for (p, [pid, bytes, sm]) in a.top.iter().zip(TOP_PROCESS) {
                    put(pid, f64::from(p.pid));
                    if memory.is_some() {
                        put(bytes, p.used_bytes as f64);
                    }
                    if busy.is_some() {
                        put(sm, p.sm_percent);
                    }
                }
            }
        }

        if self.facts.get(i).is_some_and(|f| f.events) && self.events_on {
            let c = gpu.events;
            put(GPU_XID_EVENTS, c.xid as f64);
            put(GPU_ECC_SINGLE_BIT_EVENTS, c.single_bit_ecc as f64);
            put(GPU_ECC_DOUBLE_BIT_EVENTS, c.double_bit_ecc as f64);
        }

        if buffers {
            gpu.buffers_every = cadence.buffers(gpu.held_us);
            gpu.buffers_read = Some(now);
            gpu.buffers_due = Some(next_due(now, gpu.buffers_every, tick, share));
        }
        if counters {
            gpu.counters_due = Some(next_due(now, cadence.counters, tick, share));
        }
        if second {
            gpu.second_due = Some(next_due(now, cadence.second, tick, None));
        }
    }
}

/// What a read of the sample buffers tells of their span: the cadence follows it (three
/// quarters of it, within the bounds), and lost samples are counted and logged.
fn buffer_seen(gpu: &mut GpuState, cadence: &Cadence, g: SampleStats, m: SampleStats) {
    let index = gpu.index;
    if let Some(p) = g.period {
        gpu.sample_period_us = Some(p);
        gpu.sample_anchor_us = g.newest;
    }
    gpu.samples_read += u64::from(g.count);
    gpu.samples_lost += g.lost;
    let held = match (g.held, m.held) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    if held.is_some() {
        gpu.held_us = held;
    }
    let every = cadence.buffers(gpu.held_us);
    let lost = g.lost.max(m.lost);
    if lost > 0 {
        // Said each time: with the lower bound above the span's three quarters, it goes on.
        log!(
            "gpu{index}: {lost} sample{} fell out of the utilisation buffer between two reads \
             (it holds {:.1} s): now read every {:.1} s",
            if lost == 1 { "" } else { "s" },
            gpu.held_us.unwrap_or(0) as f64 / 1e6,
            every.as_secs_f64()
        );
    } else if every != gpu.buffers_every {
        log!(
            "gpu{index}: sample buffers read every {:.1} s (they hold {})",
            every.as_secs_f64(),
            match gpu.held_us {
                Some(us) => format!("{:.1} s", us as f64 / 1e6),
                None => "an unknown span".to_owned(),
            }
        );
    }
}

impl<S: GpuSource> Sampler for GpuSampler<S> {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn failures(&self) -> u64 {
        self.failures
    }

    /// Reads every query that is due and not switched off, of every GPU. Failures are
    /// handled here (switched off, or counted and logged on change), so this always returns
    /// `Ok` with whatever could be read: one GPU or one field failing must not cost the others.
    fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        self.poll_events();
        if let Some((tree, _)) = &self.tree {
            self.tree_buf.clear();
            self.tree_buf.extend_from_slice(&tree.get());
            self.tree_buf.sort_unstable();
        }
        for i in 0..self.gpus.len() {
            self.sample_gpu(i, now, out);
        }
        self.prev_tick = Some(now);
        Ok(())
    }

    /// Every query, due or not, so that the counters' totals and the buffers' samples
    /// reach the job's end.
    fn sample_last(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        self.last = true;
        let r = self.sample(now, out);
        self.last = false;
        r
    }
}
