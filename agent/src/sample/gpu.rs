//! GPUs through NVML (`libnvidia-ml.so.1`, loaded at run time by `nvml-wrapper`).
//!
//! Per GPU `i` (the NVML index, as `nvidia-smi` shows it) and tick, in the vocabulary of
//! `docs/formats.md`:
//!
//! | Type | Name | Dimension | from | unit |
//! |---|---|---|---|---|
//! | `gpu` | `gpu<i>` | `GPUUtilization` | `nvmlDeviceGetUtilizationRates().gpu` | % |
//! | `gpu` | `gpu<i>` | `GPUMemoryUtilization` | memory used / total (`nvmlDeviceGetMemoryInfo_v2`) | % |
//! | `accelerator` | `device<i>` | `MemoryBusyPercent` | `nvmlDeviceGetUtilizationRates().memory` | % |
//! | `accelerator` | `device<i>` | `MemUsedBytes` | memory used | bytes |
//! | `accelerator` | `device<i>` | `PowerWatts` | `nvmlDeviceGetPowerUsage` / 1000 | W |
//! | `accelerator` | `device<i>` | `TemperatureCelsius` | `nvmlDeviceGetTemperature(GPU)` | °C |
//! | `accelerator` | `device<i>` | `SMClockMHz` | `nvmlDeviceGetClockInfo(SM)` | MHz |
//!
//! `GPUMemoryUtilization` is the memory *footprint*, which is what the SageMaker rules read
//! (smdebug computes it the same way); NVML's own "memory utilization" (time the memory
//! controller was busy) is `MemoryBusyPercent`. Only the two percentages the analysis
//! expects are under Type `gpu` (smdebug's analysis takes every row under a Type containing
//! `gpu` for a GPU percentage); the rest is under `accelerator`, with Names that do not start
//! with `gpu` (the numpy reader keeps those) and Dimensions without `GPU` (the heatmap draws
//! those as percentages). `MemUsedBytes` avoids the word "Memory" for the same reason.
//!
//! The values come through the [`GpuSource`] trait: [`NvmlSource`] on a real machine, a
//! scripted double in the unit tests, and the real `NvmlSource` over a fake
//! `libnvidia-ml.so.1` built from `tests/c/fake_nvml.c` for the loading path.
//!
//! Errors, per GPU and per [`Query`] (one NVML call, one or two dimensions):
//! * *not supported* (NVML `NotSupported`, `FunctionNotFound`, or a function missing from the
//!   library) switches that query off for that GPU only, logged once;
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
use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{ACCELERATOR, GPU, MetricType, Metrics, Name, SampleError, Sampler, percent};
use crate::log;

/// The environment variable naming another NVML library (a path), e.g. a fake one for tests.
pub const LIB_ENV: &str = "TRAINPROF_NVML_LIB";

/// The library loaded when [`LIB_ENV`] is not set; the dynamic loader's search path applies.
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// The value of [`LIB_ENV`], if set and not empty: `probe(lib_from_env().as_deref())`.
pub fn lib_from_env() -> Option<OsString> {
    std::env::var_os(LIB_ENV).filter(|v| !v.is_empty())
}

pub const GPU_UTILIZATION: &str = "GPUUtilization";
pub const GPU_MEMORY_UTILIZATION: &str = "GPUMemoryUtilization";
pub const GPU_MEMORY_BUSY_PERCENT: &str = "MemoryBusyPercent";
pub const GPU_MEM_USED_BYTES: &str = "MemUsedBytes";
pub const GPU_POWER_WATTS: &str = "PowerWatts";
pub const GPU_TEMPERATURE_CELSIUS: &str = "TemperatureCelsius";
pub const GPU_SM_CLOCK_MHZ: &str = "SMClockMHz";

/// The Type and Name of GPU `index`'s `dimension`: `gpu` / `gpu<i>` for the two
/// percentages the analysis reads, `accelerator` / `device<i>` for the rest.
pub fn placed(dimension: &str, index: u32) -> (MetricType, Name) {
    if dimension == GPU_UTILIZATION || dimension == GPU_MEMORY_UTILIZATION {
        (GPU, Name::Indexed("gpu", index))
    } else {
        (ACCELERATOR, Name::Indexed("device", index))
    }
}

/// One NVML call per GPU and tick; the unit that is switched off when a GPU lacks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Query {
    Utilization,
    Memory,
    Power,
    Temperature,
    SmClock,
}

impl Query {
    pub const ALL: [Query; 5] =
        [Query::Utilization, Query::Memory, Query::Power, Query::Temperature, Query::SmClock];

    /// The dimensions this query fills, for log lines.
    pub fn dimensions(self) -> &'static str {
        match self {
            Query::Utilization => "GPUUtilization, MemoryBusyPercent",
            Query::Memory => "GPUMemoryUtilization, MemUsedBytes",
            Query::Power => GPU_POWER_WATTS,
            Query::Temperature => GPU_TEMPERATURE_CELSIUS,
            Query::SmClock => GPU_SM_CLOCK_MHZ,
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// What one [`Query`] returned, in NVML's units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reading {
    Utilization { gpu_percent: u32, memory_busy_percent: u32 },
    Memory { used_bytes: u64, total_bytes: u64 },
    PowerMilliwatts(u32),
    TemperatureCelsius(u32),
    SmClockMhz(u32),
}

impl Reading {
    fn push(self, index: u32, out: &mut Metrics) {
        let mut put = |dimension: &'static str, value: f64| {
            let (kind, name) = placed(dimension, index);
            out.push(kind, name, dimension, value);
        };
        match self {
            Reading::Utilization { gpu_percent, memory_busy_percent } => {
                put(GPU_UTILIZATION, f64::from(gpu_percent));
                put(GPU_MEMORY_BUSY_PERCENT, f64::from(memory_busy_percent));
            }
            Reading::Memory { used_bytes, total_bytes } => {
                // Total 0 (never seen, but a broken board could say so) gives NaN: left out.
                put(GPU_MEMORY_UTILIZATION, percent(used_bytes as f64, total_bytes as f64));
                put(GPU_MEM_USED_BYTES, used_bytes as f64);
            }
            Reading::PowerMilliwatts(mw) => put(GPU_POWER_WATTS, f64::from(mw) / 1000.0),
            Reading::TemperatureCelsius(c) => put(GPU_TEMPERATURE_CELSIUS, f64::from(c)),
            Reading::SmClockMhz(mhz) => put(GPU_SM_CLOCK_MHZ, f64::from(mhz)),
        }
    }
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

/// Where GPU values come from. Blocking calls: run on the sampling thread.
pub trait GpuSource: Send {
    /// The NVML indices of the GPUs to sample, fixed for the source's life.
    fn devices(&self) -> Vec<u32>;

    /// The static facts of one GPU (called once per GPU, at probe).
    fn facts(&mut self, index: u32) -> GpuFacts;

    /// One query of one GPU.
    fn read(&mut self, index: u32, query: Query) -> Result<Reading, GpuReadError>;
}

/// The real thing: NVML loaded from a library path.
#[derive(Debug)]
pub struct NvmlSource {
    /// `(NVML index, handle)` of every GPU whose handle NVML gave.
    devices: Vec<(u32, Device<'static>)>,
}

impl NvmlSource {
    /// Loads and initialises NVML. `Ok(None)` when there is no usable NVML or no GPU (said in
    /// one log line); `Err` only when NVML initialised but cannot count its GPUs.
    ///
    /// The `Nvml` value is leaked: the device handles borrow it for the rest of the process
    /// (one per agent, never unloaded; nvml-wrapper never unloads the library either), and
    /// leaking avoids a self-referential struct. The driver releases it at exit.
    pub fn open(lib: Option<&OsStr>) -> Result<Option<NvmlSource>, SampleError> {
        let path = lib.unwrap_or(OsStr::new(DEFAULT_LIB));
        let nvml = match Nvml::builder().lib_path(path).init() {
            Ok(nvml) => nvml,
            Err(e) => {
                let what = match e {
                    NvmlError::LibloadingError(_) => "cannot load",
                    _ => "cannot initialise NVML from",
                };
                log!("no GPU sampler: {what} {}: {e}", path.display());
                return Ok(None);
            }
        };
        let count = nvml.device_count().map_err(|e| SampleError::Device {
            device: "nvml".to_owned(),
            what: format!("cannot count GPUs: {e}"),
        })?;
        if count == 0 {
            log!("no GPU sampler: NVML ({}) reports no GPUs", path.display());
            return Ok(None);
        }
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let mut devices = Vec::with_capacity(count as usize);
        for index in 0..count {
            match nvml.device_by_index(index) {
                Ok(device) => devices.push((index, device)),
                Err(e) => log!("gpu{index}: not sampled: NVML gives no handle: {e}"),
            }
        }
        if devices.is_empty() {
            log!("no GPU sampler: none of the {count} GPUs could be opened");
            return Ok(None);
        }
        Ok(Some(NvmlSource { devices }))
    }

    fn device(&self, index: u32) -> Option<&Device<'static>> {
        self.devices.iter().find(|(i, _)| *i == index).map(|(_, d)| d)
    }
}

impl GpuSource for NvmlSource {
    fn devices(&self) -> Vec<u32> {
        self.devices.iter().map(|(i, _)| *i).collect()
    }

    fn facts(&mut self, index: u32) -> GpuFacts {
        let Some(d) = self.device(index) else {
            return GpuFacts { index, ..GpuFacts::default() };
        };
        GpuFacts {
            index,
            name: d.name().ok(),
            uuid: d.uuid().ok(),
            memory_total_bytes: d.memory_info().ok().map(|m| m.total),
            power_limit_watts: d.enforced_power_limit().ok().map(|mw| f64::from(mw) / 1000.0),
        }
    }

    fn read(&mut self, index: u32, query: Query) -> Result<Reading, GpuReadError> {
        let d = self.device(index).ok_or(GpuReadError::Failed("no such GPU"))?;
        let reading = match query {
            Query::Utilization => d
                .utilization_rates()
                .map(|u| Reading::Utilization { gpu_percent: u.gpu, memory_busy_percent: u.memory }),
            Query::Memory => {
                d.memory_info().map(|m| Reading::Memory { used_bytes: m.used, total_bytes: m.total })
            }
            Query::Power => d.power_usage().map(Reading::PowerMilliwatts),
            Query::Temperature => d.temperature(TemperatureSensor::Gpu).map(Reading::TemperatureCelsius),
            Query::SmClock => d.clock_info(Clock::SM).map(Reading::SmClockMhz),
        };
        reading.map_err(|e| GpuReadError::from_nvml(&e))
    }
}

/// Finds the GPUs: [`NvmlSource::open`] with `lib` (e.g. [`lib_from_env`]) or
/// [`DEFAULT_LIB`], then [`GpuSampler::new`]. `Ok(None)`: no GPU sampling on this machine.
/// An `Err` is worth a log line, never a reason to stop.
pub fn probe(lib: Option<&OsStr>) -> Result<Option<GpuSampler<NvmlSource>>, SampleError> {
    Ok(NvmlSource::open(lib)?.map(GpuSampler::new))
}

/// The state of one query of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QueryState {
    Ok,
    /// Not supported: never asked again.
    Off,
    /// Failing for `ticks` ticks in a row, the last time with `error` (the log shows changes
    /// only).
    Failing {
        error: GpuReadError,
        ticks: u64,
    },
}

#[derive(Debug)]
struct GpuState {
    index: u32,
    queries: [QueryState; Query::ALL.len()],
}

/// Samples every GPU of a [`GpuSource`] each tick; see the module docs for the dimensions and
/// the error policy.
#[derive(Debug)]
pub struct GpuSampler<S: GpuSource = NvmlSource> {
    source: S,
    gpus: Vec<GpuState>,
    facts: Vec<GpuFacts>,
    failures: u64,
}

impl<S: GpuSource> GpuSampler<S> {
    /// Reads the static facts of every GPU and logs them in one line.
    pub fn new(mut source: S) -> GpuSampler<S> {
        let indices = source.devices();
        let facts: Vec<GpuFacts> = indices.iter().map(|&i| source.facts(i)).collect();
        let gpus = indices.iter().map(|&index| GpuState { index, queries: [QueryState::Ok; 5] }).collect();
        let list = facts.iter().map(GpuFacts::to_string).collect::<Vec<_>>().join("; ");
        log!("gpu: {} GPU{}: {list}", facts.len(), if facts.len() == 1 { "" } else { "s" });
        GpuSampler { source, gpus, facts, failures: 0 }
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
}

impl<S: GpuSource> Sampler for GpuSampler<S> {
    fn name(&self) -> &'static str {
        "gpu"
    }

    fn failures(&self) -> u64 {
        self.failures
    }

    /// Reads every query that is not switched off, of every GPU. Failures are handled here
    /// (switched off, or counted and logged on change), so this always returns `Ok` with
    /// whatever could be read: one GPU or one field failing must not cost the others.
    fn sample(&mut self, _now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        for gpu in &mut self.gpus {
            let name = Name::Indexed("gpu", gpu.index);
            for query in Query::ALL {
                let state = &mut gpu.queries[query.slot()];
                if *state == QueryState::Off {
                    continue;
                }
                match self.source.read(gpu.index, query) {
                    Ok(reading) => {
                        if let QueryState::Failing { ticks, .. } = *state {
                            let s = if ticks == 1 { "" } else { "s" };
                            log!("{name}: {} read again after {ticks} failed tick{s}", query.dimensions());
                        }
                        *state = QueryState::Ok;
                        reading.push(gpu.index, out);
                    }
                    Err(error @ GpuReadError::NotSupported(_)) => {
                        log!("{name}: {} switched off: {error}", query.dimensions());
                        *state = QueryState::Off;
                    }
                    Err(error @ GpuReadError::Failed(_)) => {
                        self.failures += 1;
                        let ticks = match *state {
                            QueryState::Failing { error: was, ticks } if was == error => ticks,
                            QueryState::Failing { ticks, .. } => {
                                log!("{name}: cannot read {}: now {error}", query.dimensions());
                                ticks
                            }
                            _ => {
                                log!(
                                    "{name}: cannot read {}: {error}; retrying each tick",
                                    query.dimensions()
                                );
                                0
                            }
                        };
                        *state = QueryState::Failing { error, ticks: ticks + 1 };
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::process::Command;

    use super::*;

    /// A scripted source: per (GPU, query) a list of answers, one per call, the last one
    /// repeated; calls are counted.
    #[derive(Debug, Default)]
    struct Script {
        gpus: Vec<u32>,
        answers: HashMap<(u32, Query), Vec<Result<Reading, GpuReadError>>>,
        calls: HashMap<(u32, Query), usize>,
    }

    impl Script {
        /// Two GPUs answering every query.
        fn two_gpus() -> Script {
            let mut s = Script { gpus: vec![0, 1], ..Script::default() };
            for i in [0u32, 1] {
                s.answer(
                    i,
                    Query::Utilization,
                    &[Ok(Reading::Utilization { gpu_percent: 90 + i, memory_busy_percent: 40 + i })],
                );
                s.answer(
                    i,
                    Query::Memory,
                    &[Ok(Reading::Memory { used_bytes: 1 << 30, total_bytes: 4 << 30 })],
                );
                s.answer(i, Query::Power, &[Ok(Reading::PowerMilliwatts(250_500 + i))]);
                s.answer(i, Query::Temperature, &[Ok(Reading::TemperatureCelsius(60 + i))]);
                s.answer(i, Query::SmClock, &[Ok(Reading::SmClockMhz(1410 + i))]);
            }
            s
        }

        fn answer(&mut self, gpu: u32, q: Query, a: &[Result<Reading, GpuReadError>]) {
            self.answers.insert((gpu, q), a.to_vec());
        }
    }

    impl GpuSource for Script {
        fn devices(&self) -> Vec<u32> {
            self.gpus.clone()
        }

        fn facts(&mut self, index: u32) -> GpuFacts {
            GpuFacts { index, name: Some(format!("Scripted {index}")), ..GpuFacts::default() }
        }

        fn read(&mut self, index: u32, query: Query) -> Result<Reading, GpuReadError> {
            let n = self.calls.entry((index, query)).or_default();
            *n += 1;
            let answers = &self.answers[&(index, query)];
            answers[(*n - 1).min(answers.len() - 1)]
        }
    }

    /// GPU `index`'s `dimension`, under the Type and Name it belongs to.
    fn get(m: &Metrics, index: u32, dimension: &str) -> Option<f64> {
        let (kind, name) = placed(dimension, index);
        m.get(kind.as_str(), &name.to_string(), dimension)
    }

    fn tick<S: GpuSource>(s: &mut GpuSampler<S>) -> Metrics {
        let mut m = Metrics::new();
        s.sample(Duration::ZERO, &mut m).unwrap();
        m
    }

    const ALL_DIMENSIONS: [&str; 7] = [
        GPU_UTILIZATION,
        GPU_MEMORY_UTILIZATION,
        GPU_MEMORY_BUSY_PERCENT,
        GPU_MEM_USED_BYTES,
        GPU_POWER_WATTS,
        GPU_TEMPERATURE_CELSIUS,
        GPU_SM_CLOCK_MHZ,
    ];

    #[test]
    fn every_gpu_gets_every_dimension_with_its_name_and_unit() {
        let mut s = GpuSampler::new(Script::two_gpus());
        assert_eq!(s.name(), "gpu");
        assert_eq!(s.facts().len(), 2);
        assert_eq!(s.facts()[1].name.as_deref(), Some("Scripted 1"));
        let m = tick(&mut s);
        assert_eq!(m.len(), 14);
        for (gpu, dimension) in [0, 1].into_iter().flat_map(|g| ALL_DIMENSIONS.map(|d| (g, d))) {
            assert!(get(&m, gpu, dimension).is_some(), "{gpu} {dimension}");
        }
        // Under Type `gpu` only the two percentages, one Name per GPU.
        let under_gpu: Vec<_> = m.as_slice().iter().filter(|x| x.kind == "gpu").collect();
        assert_eq!(under_gpu.len(), 4);
        assert!(under_gpu.iter().all(|x| [GPU_UTILIZATION, GPU_MEMORY_UTILIZATION].contains(&x.dimension)));
        assert!(m.as_slice().iter().all(|x| x.kind == "gpu" || x.kind == "accelerator"));
        assert_eq!(m.as_slice()[0].name, Name::Indexed("gpu", 0));
        assert_eq!(m.as_slice()[1].name, Name::Indexed("device", 0));
        assert_eq!(get(&m, 0, GPU_UTILIZATION), Some(90.0));
        assert_eq!(get(&m, 1, GPU_UTILIZATION), Some(91.0));
        assert_eq!(get(&m, 0, GPU_MEMORY_UTILIZATION), Some(25.0));
        assert_eq!(get(&m, 1, GPU_MEMORY_BUSY_PERCENT), Some(41.0));
        assert_eq!(get(&m, 0, GPU_MEM_USED_BYTES), Some(1073741824.0));
        assert_eq!(get(&m, 0, GPU_POWER_WATTS), Some(250.5));
        assert_eq!(get(&m, 1, GPU_POWER_WATTS), Some(250.501));
        assert_eq!(get(&m, 1, GPU_TEMPERATURE_CELSIUS), Some(61.0));
        assert_eq!(get(&m, 0, GPU_SM_CLOCK_MHZ), Some(1410.0));
        assert_eq!(s.failures(), 0);
        // smdebug draws dimensions containing "Memory" as percentages.
        assert!(!GPU_MEM_USED_BYTES.contains("Memory"));
    }

    #[test]
    fn not_supported_switches_off_that_query_of_that_gpu_only() {
        let mut script = Script::two_gpus();
        script.answer(1, Query::Power, &[Err(GpuReadError::NotSupported("NVML_ERROR_NOT_SUPPORTED"))]);
        let mut s = GpuSampler::new(script);
        for _ in 0..3 {
            let m = tick(&mut s);
            assert_eq!(m.len(), 13);
            assert_eq!(get(&m, 1, GPU_POWER_WATTS), None);
            assert_eq!(get(&m, 0, GPU_POWER_WATTS), Some(250.5));
            assert_eq!(get(&m, 1, GPU_TEMPERATURE_CELSIUS), Some(61.0));
        }
        assert_eq!(s.source.calls[&(1, Query::Power)], 1, "never asked again");
        assert_eq!(s.source.calls[&(0, Query::Power)], 3);
        assert_eq!(s.source.calls[&(1, Query::SmClock)], 3);
        assert_eq!(s.switched_off(1).collect::<Vec<_>>(), [Query::Power]);
        assert_eq!(s.switched_off(0).count(), 0);
        assert_eq!(s.failures(), 0);
    }

    #[test]
    fn transient_errors_leave_the_tick_out_and_are_asked_again() {
        let lost = Err(GpuReadError::Failed("GPU lost"));
        let unknown = Err(GpuReadError::Failed("unknown"));
        let mut script = Script::two_gpus();
        script.answer(0, Query::Temperature, &[unknown, unknown, lost, Ok(Reading::TemperatureCelsius(70))]);
        script.answer(1, Query::Memory, &[lost]);
        let mut s = GpuSampler::new(script);
        for t in 0..3 {
            let m = tick(&mut s);
            assert_eq!(get(&m, 0, GPU_TEMPERATURE_CELSIUS), None, "tick {t}");
            assert_eq!(get(&m, 1, GPU_MEMORY_UTILIZATION), None);
            assert_eq!(get(&m, 1, GPU_MEM_USED_BYTES), None);
            assert_eq!(get(&m, 0, GPU_MEMORY_UTILIZATION), Some(25.0));
            assert_eq!(get(&m, 1, GPU_TEMPERATURE_CELSIUS), Some(61.0));
            assert_eq!(m.len(), 11);
        }
        let m = tick(&mut s);
        assert_eq!(get(&m, 0, GPU_TEMPERATURE_CELSIUS), Some(70.0));
        assert_eq!(s.source.calls[&(0, Query::Temperature)], 4);
        assert_eq!(s.source.calls[&(1, Query::Memory)], 4);
        assert_eq!(s.failures(), 3 + 4);
        assert_eq!(s.switched_off(0).count() + s.switched_off(1).count(), 0);
        assert_eq!(s.gpus[0].queries[Query::Temperature.slot()], QueryState::Ok);
        assert_eq!(
            s.gpus[1].queries[Query::Memory.slot()],
            QueryState::Failing { error: GpuReadError::Failed("GPU lost"), ticks: 4 }
        );
    }

    #[test]
    fn a_zero_memory_total_leaves_the_percentage_out() {
        let mut script = Script::two_gpus();
        script.answer(0, Query::Memory, &[Ok(Reading::Memory { used_bytes: 5, total_bytes: 0 })]);
        let m = tick(&mut GpuSampler::new(script));
        assert_eq!(get(&m, 0, GPU_MEMORY_UTILIZATION), None);
        assert_eq!(get(&m, 0, GPU_MEM_USED_BYTES), Some(5.0));
    }

    #[test]
    fn nvml_errors_are_sorted_into_switched_off_and_transient() {
        let off =
            [NvmlError::NotSupported, NvmlError::FunctionNotFound, NvmlError::FailedToLoadSymbol("x".into())];
        for e in off {
            assert!(matches!(GpuReadError::from_nvml(&e), GpuReadError::NotSupported(_)), "{e:?}");
        }
        let again = [NvmlError::Unknown, NvmlError::GpuLost, NvmlError::NoPermission, NvmlError::Timeout];
        for e in again {
            assert!(matches!(GpuReadError::from_nvml(&e), GpuReadError::Failed(_)), "{e:?}");
        }
    }

    #[test]
    fn facts_read_as_one_line() {
        let f = GpuFacts {
            index: 1,
            name: Some("Tesla T4".into()),
            uuid: Some("GPU-1".into()),
            memory_total_bytes: Some(15 << 30),
            power_limit_watts: Some(70.0),
        };
        assert_eq!(f.to_string(), "gpu1 Tesla T4 (GPU-1, 15360 MiB, power limit 70 W)");
        let f = GpuFacts { index: 0, ..GpuFacts::default() };
        assert_eq!(f.to_string(), "gpu0 (name unknown) (uuid unknown, memory unknown, no power limit)");
    }

    /// Builds `tests/c/fake_nvml.c` with `defines` as `libnvidia-ml.so.1` in a folder of its
    /// own (a loaded library is never unloaded, so each variant needs its own path), probes
    /// it, and removes the folder (the mapped library stays usable). No `cc` is a failure,
    /// not a skip.
    fn probe_fake(variant: &str, defines: &[&str]) -> Option<GpuSampler<NvmlSource>> {
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/fake_nvml.c");
        let tmp =
            tempfile::Builder::new().prefix(&format!("trainprof-fake-nvml-{variant}-")).tempdir().unwrap();
        let lib = tmp.path().join("libnvidia-ml.so.1");
        let out = Command::new("cc")
            .args(["-shared", "-fPIC", "-Wall", "-Werror", "-o"])
            .arg(&lib)
            .args(defines)
            .arg(src)
            .output()
            .unwrap_or_else(|e| panic!("cannot run cc (a C compiler is needed for this test): {e}"));
        assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
        probe(Some(lib.as_os_str())).unwrap()
    }

    #[test]
    fn a_fake_nvml_library_is_loaded_enumerated_and_read() {
        let mut s = probe_fake("full", &[]).expect("two fake GPUs");
        let facts = s.facts();
        assert_eq!(facts.len(), 2);
        assert_eq!(facts[0].name.as_deref(), Some("Fake GPU A"));
        assert_eq!(facts[0].uuid.as_deref(), Some("GPU-00000000-0000-0000-0000-00000000000a"));
        assert_eq!(facts[0].memory_total_bytes, Some(16 << 30));
        assert_eq!(facts[0].power_limit_watts, Some(300.0));
        assert_eq!(facts[1].name.as_deref(), Some("Fake GPU B"));
        assert_eq!(facts[1].power_limit_watts, None);

        // Tick 1: gpu0's temperature fails once (NVML_ERROR_UNKNOWN), gpu1 has no power.
        let m = tick(&mut s);
        assert_eq!(get(&m, 0, GPU_UTILIZATION), Some(87.0));
        assert_eq!(get(&m, 0, GPU_MEMORY_BUSY_PERCENT), Some(41.0));
        assert_eq!(get(&m, 0, GPU_MEMORY_UTILIZATION), Some(25.0));
        assert_eq!(get(&m, 0, GPU_MEM_USED_BYTES), Some((4u64 << 30) as f64));
        assert_eq!(get(&m, 0, GPU_POWER_WATTS), Some(212.5));
        assert_eq!(get(&m, 0, GPU_TEMPERATURE_CELSIUS), None);
        assert_eq!(get(&m, 0, GPU_SM_CLOCK_MHZ), Some(1410.0));
        assert_eq!(get(&m, 1, GPU_UTILIZATION), Some(3.0));
        assert_eq!(get(&m, 1, GPU_POWER_WATTS), None);
        assert_eq!(get(&m, 1, GPU_TEMPERATURE_CELSIUS), Some(35.0));
        assert_eq!(m.len(), 12);
        assert_eq!(s.failures(), 1);
        assert_eq!(s.switched_off(1).collect::<Vec<_>>(), [Query::Power]);
        assert_eq!(s.switched_off(0).count(), 0);

        // Tick 2: the transient error is over; power stays off for gpu1 only.
        let m = tick(&mut s);
        assert_eq!(get(&m, 0, GPU_TEMPERATURE_CELSIUS), Some(64.0));
        assert_eq!(get(&m, 0, GPU_POWER_WATTS), Some(212.5));
        assert_eq!(get(&m, 1, GPU_POWER_WATTS), None);
        assert_eq!(m.len(), 13);
        assert_eq!(s.failures(), 1);
    }

    #[test]
    fn a_function_missing_from_the_library_switches_its_field_off() {
        let mut s = probe_fake("no-clock", &["-DFAKE_NVML_NO_CLOCK"]).expect("two fake GPUs");
        for _ in 0..2 {
            let m = tick(&mut s);
            assert_eq!(get(&m, 0, GPU_SM_CLOCK_MHZ), None);
            assert_eq!(get(&m, 1, GPU_SM_CLOCK_MHZ), None);
            assert_eq!(get(&m, 1, GPU_UTILIZATION), Some(3.0));
        }
        assert_eq!(s.switched_off(0).collect::<Vec<_>>(), [Query::SmClock]);
        assert_eq!(s.switched_off(1).collect::<Vec<_>>(), [Query::Power, Query::SmClock]);
    }

    #[test]
    fn no_library_no_driver_or_no_gpu_is_no_sampler() {
        let tmp = tempfile::tempdir().unwrap();
        let absent = tmp.path().join("no-such-dir/libnvidia-ml.so.1");
        assert!(probe(Some(absent.as_os_str())).unwrap().is_none());
        assert!(probe_fake("no-driver", &["-DFAKE_NVML_INIT_RESULT=9"]).is_none());
        assert!(probe_fake("no-gpus", &["-DFAKE_NVML_DEVICES=0"]).is_none());
    }
}
