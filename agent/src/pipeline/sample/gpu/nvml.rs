//! [`NvmlSource`]: the [`GpuSource`] over the real NVML (or a fake library at its path).
//!
//! NVML calls per GPU (`docs/formats.md`, "GPU: cadence"; measured in `BENCHMARKS.md`,
//! "NVML cost"): every tick the instant utilisation, memory, the instant-power field, with a
//! trainer the process list, and one `nvmlEventSetWait_v2(0)` per GPU with events; once a
//! second the power usage, temperature, SM clock and throttle reasons; at the buffers' cadence the two sample
//! buffers and the per-process samples (one call each, [`raw`]); at the counters' cadence one
//! batched `nvmlDeviceGetFieldValues` and GPM (the older of two samples filled again, and the
//! metrics call).

use std::ffi::OsStr;
use std::mem;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, Sampling, TemperatureSensor};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::Sample;
use nvml_wrapper::{Device, EventSet, GpmSample, Nvml};
use nvml_wrapper_sys::bindings::{nvmlFieldValue_t, nvmlValue_t};

use super::raw;
use super::samples::{ProcessSample, SampleStats, per_process};
use super::{
    DEFAULT_LIB, Field, FieldValues, GpmMetric, GpmValues, GpuEvent, GpuFacts, GpuReadError, GpuSource,
    MAX_EVENTS_PER_TICK, ProcessMemory, Query, Reading,
};
use crate::log;
use crate::pipeline::sample::SampleError;

/// `nvmlSamplingType_t` of the two buffers read.
const GPU_SAMPLES: u32 = 1;
const MEMORY_SAMPLES: u32 = 2;

#[derive(Debug)]
struct NvmlGpu {
    index: u32,
    device: Device<'static>,
    /// The newest sample timestamp seen per buffer (GPU, memory, processes).
    gpu_since: u64,
    memory_since: u64,
    process_since: u64,
    /// The span the probe's read of the whole rings showed, and the GPU buffer's sample period
    /// and newest timestamp, handed on with the first reading.
    held: (Option<u64>, Option<u64>),
    probe_period: Option<(u64, u64)>,
    /// GPM: whether the GPU has it (asked once), two samples taken in turn, and which of
    /// them is the newer.
    gpm_supported: Option<bool>,
    gpm_samples: [Option<GpmSample<'static>>; 2],
    gpm_newest: usize,
    /// One event set per GPU, so that a GPU refusing registration costs no other.
    events: Option<EventSet<'static>>,
}

/// The real thing: NVML loaded from a library path.
#[derive(Debug)]
pub struct NvmlSource {
    nvml: &'static Nvml,
    gpus: Vec<NvmlGpu>,
}

/// The events watched: critical Xid errors and ECC errors.
fn watched() -> EventTypes {
    EventTypes::CRITICAL_XID_ERROR | EventTypes::SINGLE_BIT_ECC_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR
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
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            match nvml.device_by_index(index) {
                Ok(device) => gpus.push(NvmlGpu::new(nvml, index, device)),
                Err(e) => log!("gpu{index}: not sampled: NVML gives no handle: {e}"),
            }
        }
        if gpus.is_empty() {
            log!("no GPU sampler: none of the {count} GPUs could be opened");
            return Ok(None);
        }
        Ok(Some(NvmlSource { nvml, gpus }))
    }

    fn gpu(&mut self, index: u32) -> Option<&mut NvmlGpu> {
        self.gpus.iter_mut().find(|g| g.index == index)
    }
}

impl NvmlGpu {
    /// Registers the GPU's events and takes the sample buffers' newest timestamps, so that
    /// the first tick reports its own interval, not the buffer's whole past.
    fn new(nvml: &'static Nvml, index: u32, device: Device<'static>) -> NvmlGpu {
        let mut g = NvmlGpu {
            index,
            device,
            gpu_since: 0,
            memory_since: 0,
            process_since: 0,
            held: (None, None),
            probe_period: None,
            gpm_supported: None,
            gpm_samples: [None, None],
            gpm_newest: 1,
            events: None,
        };
        g.events = g.register_events(nvml);
        // A failure here shows on the first tick, where the same call is made.
        if let Ok(Reading::UtilizationSamples { gpu, memory_busy }) = g.utilization_samples(nvml) {
            g.held = (gpu.held, memory_busy.held);
            g.probe_period = gpu.period.map(|p| (p, gpu.newest));
        }
        let _ = g.process_utilization(nvml);
        g
    }

    fn register_events(&self, nvml: &'static Nvml) -> Option<EventSet<'static>> {
        let index = self.index;
        let types = match self.device.supported_event_types() {
            Ok(t) => t & watched(),
            Err(e) => {
                log!("gpu{index}: no Xid or ECC events: {e}");
                return None;
            }
        };
        if types.is_empty() {
            log!("gpu{index}: no Xid or ECC events: not supported");
            return None;
        }
        let set = match nvml.create_event_set() {
            Ok(set) => set,
            Err(e) => {
                log!("gpu{index}: no Xid or ECC events: cannot create an event set: {e}");
                return None;
            }
        };
        match self.device.register_events(types, set) {
            Ok(set) => Some(set),
            Err(e) => {
                log!("gpu{index}: no Xid or ECC events: {}", e.error);
                None
            }
        }
    }

    fn utilization_samples(&mut self, nvml: &Nvml) -> Result<Reading, NvmlError> {
        let (gpu, gpu_since) = match raw::samples(nvml, &self.device, GPU_SAMPLES, self.gpu_since)? {
            Some(got) => got,
            None => stats(buffer(&self.device, Sampling::GpuUtilization, self.gpu_since)?, self.gpu_since),
        };
        let (memory_busy, memory_since) =
            match raw::samples(nvml, &self.device, MEMORY_SAMPLES, self.memory_since)? {
                Some(got) => got,
                None => stats(
                    buffer(&self.device, Sampling::MemoryUtilization, self.memory_since)?,
                    self.memory_since,
                ),
            };
        self.gpu_since = gpu_since;
        self.memory_since = memory_since;
        let (mut gpu, mut memory_busy) = (gpu, memory_busy);
        let (gpu_held, memory_held) = mem::take(&mut self.held);
        gpu.held = gpu.held.or(gpu_held);
        if gpu.period.is_none()
            && let Some((period, newest)) = self.probe_period.take()
        {
            gpu.period = Some(period);
            gpu.newest = newest;
        }
        memory_busy.held = memory_busy.held.or(memory_held);
        Ok(Reading::UtilizationSamples { gpu, memory_busy })
    }

    fn process_utilization(&mut self, nvml: &Nvml) -> Result<Reading, NvmlError> {
        let samples = match raw::process_samples(nvml, &self.device, self.process_since)? {
            Some(samples) => samples,
            None => match self.device.process_utilization_stats(self.process_since) {
                Ok(raw) => raw
                    .iter()
                    .map(|s| ProcessSample {
                        pid: s.pid,
                        timestamp: s.timestamp,
                        sm_percent: s.sm_util,
                        memory_busy_percent: s.mem_util,
                    })
                    .collect(),
                // No process was sampled since then.
                Err(NvmlError::NotFound) => Vec::new(),
                Err(e) => return Err(e),
            },
        };
        let (busy, since) = per_process(&samples, self.process_since);
        self.process_since = since;
        Ok(Reading::ProcessUtilization(busy))
    }

    fn processes(&self, nvml: &Nvml) -> Result<Reading, NvmlError> {
        if let Some(list) = raw::compute_processes(nvml, &self.device)? {
            return Ok(Reading::Processes(list));
        }
        let list = self.device.running_compute_processes()?;
        Ok(Reading::Processes(
            list.iter()
                .map(|p| ProcessMemory {
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                })
                .collect(),
        ))
    }

    /// One `nvmlDeviceGetFieldValues` for the [`Field`]s of `batch`, called through the raw
    /// binding: nvml-wrapper's `field_values_for` leaves `scopeId` 0, which for the NVLink
    /// counters means link 0 only; `UINT_MAX` sums all links. NVML's cost is per field (the
    /// energy counter alone costs milliseconds), hence the batches.
    fn fields(&self, nvml: &Nvml, batch: Query) -> Result<Reading, GpuReadError> {
        let get = nvml
            .lib()
            .nvmlDeviceGetFieldValues
            .as_ref()
            .map_err(|_| GpuReadError::NotSupported("function missing from the NVML library"))?;
        // SAFETY: nvmlFieldValue_t is plain C data (integers and a union of numbers); all
        // zeroes is a valid value of it.
        let mut values: [nvmlFieldValue_t; Field::ALL.len()] = unsafe { mem::zeroed() };
        // Where each field of the batch is in `values`.
        let mut at = [None; Field::ALL.len()];
        let mut n = 0;
        for (i, f) in Field::ALL.into_iter().enumerate().filter(|(_, f)| f.batch() == batch) {
            values[n].fieldId = f.id();
            values[n].scopeId = f.scope();
            at[i] = Some(n);
            n += 1;
        }
        // SAFETY: the handle comes from this NVML, which is never shut down (leaked at
        // open); `values` holds at least the count passed, and NVML writes only inside it.
        let r = unsafe { get(self.device.handle(), n as i32, values.as_mut_ptr()) };
        if r != 0 {
            return Err(GpuReadError::from_nvml(&NvmlError::from(r)));
        }
        let out: FieldValues = std::array::from_fn(|i| {
            let Some(k) = at[i] else {
                return Err(GpuReadError::Failed("not in this batch"));
            };
            let v = &values[k];
            if v.nvmlReturn != 0 {
                return Err(GpuReadError::from_nvml(&NvmlError::from(v.nvmlReturn)));
            }
            field_number(v.valueType, v.value)
        });
        Ok(Reading::Fields(out))
    }

    /// GPM: a new sample each read, compared with the previous one. Two samples serve the
    /// whole run: the older is filled again ([`raw::gpm_sample_again`]) instead of a new one
    /// being allocated and the old freed each tick.
    fn gpm(&mut self, nvml: &'static Nvml) -> Result<Reading, NvmlError> {
        if self.gpm_supported.is_none() {
            self.gpm_supported = Some(self.device.gpm_support()?);
        }
        if self.gpm_supported == Some(false) {
            return Err(NvmlError::NotSupported);
        }
        let newest = self.gpm_newest;
        let older = 1 - newest;
        match &self.gpm_samples[older] {
            Some(sample) => raw::gpm_sample_again(nvml, &self.device, sample)?,
            None => self.gpm_samples[older] = Some(self.device.gpm_sample()?),
        }
        self.gpm_newest = older;
        let (Some(prev), Some(now)) = (&self.gpm_samples[newest], &self.gpm_samples[older]) else {
            return Ok(Reading::Gpm(None));
        };
        let ids = [
            GpmMetricId::SmUtil,
            GpmMetricId::SmOccupancy,
            GpmMetricId::AnyTensorUtil,
            GpmMetricId::DramBwUtil,
        ];
        let results = nvml_wrapper::gpm::gpm_metrics_get(nvml, prev, now, &ids)?;
        let values: GpmValues = std::array::from_fn(|i| match results.get(i) {
            Some(Ok(r)) => Ok(r.value),
            Some(Err(e)) => Err(GpuReadError::from_nvml(e)),
            None => Err(GpuReadError::Failed("NVML returned fewer GPM metrics than asked")),
        });
        debug_assert_eq!(GpmMetric::ALL.len(), ids.len());
        Ok(Reading::Gpm(Some(values)))
    }
}

/// A field value as an unsigned number (counters, mW); a negative or fractional one is an
/// error for that field.
fn field_number(value_type: u32, value: nvmlValue_t) -> Result<u64, GpuReadError> {
    // SAFETY: NVML says which member of the union it wrote in `valueType`; the union was
    // zeroed first, so any member read is initialised.
    unsafe {
        match value_type {
            1 => Ok(u64::from(value.uiVal)),
            2 => Ok(value.ulVal),
            3 => Ok(value.ullVal),
            4 => u64::try_from(value.sllVal).map_err(|_| GpuReadError::Failed("negative field value")),
            5 => u64::try_from(value.siVal).map_err(|_| GpuReadError::Failed("negative field value")),
            6 => Ok(u64::from(value.usVal)),
            0 if value.dVal >= 0.0 && value.dVal.is_finite() => Ok(value.dVal as u64),
            _ => Err(GpuReadError::Failed("unexpected field value type")),
        }
    }
}

/// The samples newer than `since`; none is not an error (NVML says `NotFound`).
fn buffer(d: &Device<'static>, kind: Sampling, since: u64) -> Result<Vec<Sample>, NvmlError> {
    match d.samples(kind, since) {
        Err(NvmlError::NotFound) => Ok(Vec::new()),
        other => other,
    }
}

fn stats(samples: Vec<Sample>, since: u64) -> (SampleStats, u64) {
    SampleStats::of(
        samples.iter().map(|s| {
            let v = match s.value {
                SampleValue::F64(v) => v,
                SampleValue::U32(v) => f64::from(v),
                SampleValue::U64(v) => v as f64,
                SampleValue::I64(v) => v as f64,
            };
            (s.timestamp, v)
        }),
        since,
    )
}

impl GpuSource for NvmlSource {
    fn devices(&self) -> Vec<u32> {
        self.gpus.iter().map(|g| g.index).collect()
    }

    fn facts(&mut self, index: u32) -> GpuFacts {
        let Some(g) = self.gpu(index) else {
            return GpuFacts { index, ..GpuFacts::default() };
        };
        let d = &g.device;
        GpuFacts {
            index,
            name: d.name().ok(),
            uuid: d.uuid().ok(),
            memory_total_bytes: d.memory_info().ok().map(|m| m.total),
            power_limit_watts: d.enforced_power_limit().ok().map(|mw| f64::from(mw) / 1000.0),
            events: g.events.is_some(),
        }
    }

    fn read(&mut self, index: u32, query: Query) -> Result<Reading, GpuReadError> {
        let nvml = self.nvml;
        let g = self.gpu(index).ok_or(GpuReadError::Failed("no such GPU"))?;
        let d = &g.device;
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
            Query::Throttle => d.current_throttle_reasons().map(|r| Reading::Throttle(r.bits())),
            Query::UtilizationSamples => g.utilization_samples(nvml),
            Query::InstantFields | Query::Fields => return g.fields(nvml, query),
            Query::Gpm => g.gpm(nvml),
            Query::Processes => g.processes(nvml),
            Query::ProcessUtilization => g.process_utilization(nvml),
        };
        reading.map_err(|e| GpuReadError::from_nvml(&e))
    }

    /// Drains every GPU's event set. A GPU whose set NVML stops supporting loses its events
    /// alone (one log line); another error is returned after the other GPUs were drained.
    fn poll_events(&mut self, out: &mut Vec<(u32, GpuEvent)>) -> Result<(), GpuReadError> {
        let mut failed = None;
        for g in &mut self.gpus {
            let Some(set) = &g.events else { continue };
            for _ in 0..MAX_EVENTS_PER_TICK {
                // Each wait is one call of the agent's own account (docs/formats.md, "The
                // agent's own cost").
                let waited = {
                    let _cost = crate::pipeline::cost::span(crate::pipeline::cost::Part::NvmlEvents);
                    set.wait(0)
                };
                match waited {
                    Ok(data) => {
                        let t = data.event_type;
                        if t.contains(EventTypes::CRITICAL_XID_ERROR) {
                            let code = match data.event_data {
                                Some(XidError::Value(code)) => Some(code),
                                _ => None,
                            };
                            out.push((g.index, GpuEvent::Xid(code)));
                        }
                        if t.contains(EventTypes::SINGLE_BIT_ECC_ERROR) {
                            out.push((g.index, GpuEvent::SingleBitEcc));
                        }
                        if t.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                            out.push((g.index, GpuEvent::DoubleBitEcc));
                        }
                    }
                    Err(NvmlError::Timeout) => break,
                    Err(e) => {
                        match GpuReadError::from_nvml(&e) {
                            off @ GpuReadError::NotSupported(_) => {
                                log!("gpu{}: Xid and ECC events switched off: {off}", g.index);
                                g.events = None;
                            }
                            again @ GpuReadError::Failed(_) => failed = failed.or(Some(again)),
                        }
                        break;
                    }
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }
}
