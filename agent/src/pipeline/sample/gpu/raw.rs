//! Single NVML calls through the raw bindings, where nvml-wrapper makes two (a count, then the
//! data, for the sample buffers and the process lists) or allocates a GPM sample per call.
//! Hand-written for the call count: every NVML call is an ioctl into the driver, and these
//! cut a GPU's calls per tick from 19 to 13 (`BENCHMARKS.md`, "NVML cost"). Each asks with a
//! fixed buffer on the stack; `Ok(None)` when NVML says it is too small, and the caller then
//! asks through nvml-wrapper (which sizes the buffer first).

use std::mem;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, GpmSample, Nvml};
use nvml_wrapper_sys::bindings::{
    NVML_VALUE_NOT_AVAILABLE, nvmlProcessInfo_t, nvmlProcessUtilizationSample_t,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, nvmlReturn_enum_NVML_ERROR_NOT_FOUND, nvmlReturn_t,
    nvmlSample_t, nvmlValue_t,
};

use super::attribution::ProcessMemory;
use super::samples::{ProcessSample, SampleStats};

/// Samples per buffer and call (NVML's rings hold fewer).
const SAMPLES: usize = 256;
/// Processes per GPU and call.
const PROCESSES: usize = 64;

fn missing(e: impl std::fmt::Display) -> NvmlError {
    NvmlError::FailedToLoadSymbol(e.to_string())
}

const NOT_FOUND: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;

/// `Ok(true)`: data; `Ok(false)`: nothing newer (`NOT_FOUND`); `Err(None)`: buffer too small.
fn result(r: nvmlReturn_t) -> Result<bool, Option<NvmlError>> {
    match r {
        0 => Ok(true),
        NOT_FOUND => Ok(false),
        INSUFFICIENT_SIZE => Err(None),
        other => Err(Some(NvmlError::from(other))),
    }
}

/// A union value as a number, by NVML's value type.
fn number(value_type: u32, v: nvmlValue_t) -> f64 {
    // SAFETY: NVML says in `value_type` which member it wrote; the buffer was zeroed first,
    // so every member read is initialised.
    unsafe {
        match value_type {
            0 => v.dVal,
            1 => f64::from(v.uiVal),
            2 => v.ulVal as f64,
            3 => v.ullVal as f64,
            4 => v.sllVal as f64,
            5 => f64::from(v.siVal),
            6 => f64::from(v.usVal),
            _ => f64::NAN,
        }
    }
}

/// `nvmlDeviceGetSamples` of `kind` newer than `since`, reduced to their mean and max.
pub(super) fn samples(
    nvml: &Nvml,
    device: &Device<'_>,
    kind: u32,
    since: u64,
) -> Result<Option<(SampleStats, u64)>, NvmlError> {
    let get = nvml.lib().nvmlDeviceGetSamples.as_ref().map_err(missing)?;
    // SAFETY: plain C data; all zeroes is a valid value.
    let mut buf: [nvmlSample_t; SAMPLES] = unsafe { mem::zeroed() };
    let mut count = SAMPLES as u32;
    let mut value_type = 0u32;
    // SAFETY: the handle is this NVML's (never shut down); `buf` holds `count` samples and
    // NVML writes at most `count`.
    let r = unsafe { get(device.handle(), kind, since, &mut value_type, &mut count, buf.as_mut_ptr()) };
    match result(r) {
        Ok(true) => {}
        Ok(false) => return Ok(Some((SampleStats::default(), since))),
        Err(None) => return Ok(None),
        Err(Some(e)) => return Err(e),
    }
    let n = (count as usize).min(SAMPLES);
    Ok(Some(SampleStats::of(
        buf[..n].iter().map(|s| (s.timeStamp, number(value_type, s.sampleValue))),
        since,
    )))
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`.
pub(super) fn compute_processes(
    nvml: &Nvml,
    device: &Device<'_>,
) -> Result<Option<Vec<ProcessMemory>>, NvmlError> {
    let get = nvml.lib().nvmlDeviceGetComputeRunningProcesses_v3.as_ref().map_err(missing)?;
    // SAFETY: plain C data; all zeroes is a valid value.
    let mut buf: [nvmlProcessInfo_t; PROCESSES] = unsafe { mem::zeroed() };
    let mut count = PROCESSES as u32;
    // SAFETY: as in `samples`: `buf` holds `count` entries.
    let r = unsafe { get(device.handle(), &mut count, buf.as_mut_ptr()) };
    match result(r) {
        Ok(true) => {}
        Ok(false) => return Ok(Some(Vec::new())),
        Err(None) => return Ok(None),
        Err(Some(e)) => return Err(e),
    }
    let n = (count as usize).min(PROCESSES);
    let not_available = NVML_VALUE_NOT_AVAILABLE as u64;
    Ok(Some(
        buf[..n]
            .iter()
            .map(|p| ProcessMemory {
                pid: p.pid,
                used_bytes: (p.usedGpuMemory != not_available).then_some(p.usedGpuMemory),
            })
            .collect(),
    ))
}

/// `nvmlDeviceGetProcessUtilization` newer than `since`.
pub(super) fn process_samples(
    nvml: &Nvml,
    device: &Device<'_>,
    since: u64,
) -> Result<Option<Vec<ProcessSample>>, NvmlError> {
    let get = nvml.lib().nvmlDeviceGetProcessUtilization.as_ref().map_err(missing)?;
    // SAFETY: plain C data; all zeroes is a valid value.
    let mut buf: [nvmlProcessUtilizationSample_t; SAMPLES] = unsafe { mem::zeroed() };
    let mut count = SAMPLES as u32;
    // SAFETY: as in `samples`: `buf` holds `count` entries.
    let r = unsafe { get(device.handle(), buf.as_mut_ptr(), &mut count, since) };
    match result(r) {
        Ok(true) => {}
        Ok(false) => return Ok(Some(Vec::new())),
        Err(None) => return Ok(None),
        Err(Some(e)) => return Err(e),
    }
    let n = (count as usize).min(SAMPLES);
    Ok(Some(
        buf[..n]
            .iter()
            .map(|s| ProcessSample {
                pid: s.pid,
                timestamp: s.timeStamp,
                sm_percent: s.smUtil,
                memory_busy_percent: s.memUtil,
            })
            .collect(),
    ))
}

/// Fills an already allocated GPM sample again (`nvmlGpmSampleGet`), so that two samples
/// serve the whole run.
pub(super) fn gpm_sample_again(
    nvml: &Nvml,
    device: &Device<'_>,
    sample: &GpmSample<'_>,
) -> Result<(), NvmlError> {
    let get = nvml.lib().nvmlGpmSampleGet.as_ref().map_err(missing)?;
    // SAFETY: both handles are live: the device's NVML is never shut down, and `sample` is
    // allocated until it is dropped, which cannot happen during this borrow.
    let r = unsafe { get(device.handle(), sample.handle()) };
    if r == 0 { Ok(()) } else { Err(NvmlError::from(r)) }
}
