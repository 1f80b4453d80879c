//! The system rows in the Prometheus text exposition format (0.0.4) and in OpenMetrics 1.0
//! (`docs/metrics.md`): the names, labels and types of every row of the vocabulary
//! (`docs/formats.md`, "System metrics: vocabulary"), each family with its dcgm-exporter
//! counterpart where one measures the same quantity.
//!
//! Every row maps to one family ([`family_of`]); a row the table does not know (a Type or
//! Dimension added later) is served as `trainprof_system_row{type,name,dimension}` rather
//! than dropped. Values are what the system files hold: rounded to two decimals as the
//! files write them ([`push_value`]), then scaled to the base unit where the row's unit is
//! not one (MHz → Hz, µs → s).

use std::fmt::Write as _;

use trainprof_output::protocol::metric::{Label, MetricType, Name, dimension as dim, name};
use trainprof_output::protocol::system_line::{push_u64, push_value};

use super::format::{Format, escaped};
use crate::pipeline::sample::Metric;

/// A family's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    /// Served with `_total` (in OpenMetrics the family's name is without it).
    Counter,
}

/// How a row's value becomes the family's base unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    One,
    /// MHz → Hz.
    Mega,
    /// µs → s.
    Micro,
}

/// One metric family.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// Without `_total`.
    pub name: &'static str,
    pub kind: Kind,
    pub scale: Scale,
    pub help: &'static str,
    /// The dcgm-exporter field measuring the same quantity, and how the values relate.
    pub dcgm: Option<&'static str>,
    /// The rows' Type, Name and Dimension in the system files (for docs/metrics.md).
    pub row: &'static str,
    /// Absent from most ticks (read at a slower cadence than the tick): the last value is
    /// held for [`HOLD_S`] rather than dropped at the next tick.
    pub sparse: bool,
}

/// How long a sparse family's last value is served after the tick that had it: longer
/// than the slowest cadence (the clock's, once a minute).
pub const HOLD_S: f64 = 65.0;

macro_rules! families {
    ($($id:ident = $name:literal, $kind:ident, $scale:ident, $sparse:literal, $row:literal, $dcgm:expr, $help:literal;)*) => {
        /// The families, in the order they are served.
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        #[repr(u16)]
        pub enum F { $($id),* }

        pub static FAMILIES: &[Family] = &[$(Family {
            name: $name, kind: Kind::$kind, scale: Scale::$scale, help: $help, dcgm: $dcgm, row: $row, sparse: $sparse,
        }),*];
    };
}

families! {
    TickTimestamp = "trainprof_tick_timestamp_seconds", Gauge, One, false, "(the tick)", None,
        "Wall time of the tick these values were sampled at (the system files' Timestamp), epoch seconds.";
    CpuCoreBusy = "trainprof_cpu_core_busy_percent", Gauge, One, false, "cpu / cpuN / CPUUtilization", None,
        "Share of the interval one core was busy, percent (label core).";
    CpuCoreIowait = "trainprof_cpu_core_iowait_percent", Gauge, One, false, "cpu / cpuN / I/OWaitPercentage", None,
        "Share of the interval one core waited for I/O, percent (label core).";
    CpuBusy = "trainprof_cpu_busy_percent", Gauge, One, false, "host / AllCores / BusyPercent", None,
        "Share of the interval all cores together were busy, percent.";
    CpuIowait = "trainprof_cpu_iowait_percent", Gauge, One, false, "host / AllCores / IOWaitPercent", None,
        "Share of the interval all cores together waited for I/O, percent.";
    MemoryUsedPercent = "trainprof_memory_used_percent", Gauge, One, false, "memory / MemoryUsedPercent", None,
        "Memory used, percent of the cgroup's limit when there is one, else of the host's memory.";
    MemoryUsed = "trainprof_memory_used_bytes", Gauge, One, false, "ram / MemoryUsedBytes / cgroup or host", None,
        "Memory used, bytes (label scope: cgroup or host, what the percentage is of).";
    MemoryLimit = "trainprof_memory_limit_bytes", Gauge, One, false, "ram / MemoryLimitBytes / cgroup or host", None,
        "The memory the percentage is of, bytes (label scope).";
    DiskOps = "trainprof_disk_operations_per_second", Gauge, One, false, "i/o / IOPS", None,
        "Reads and writes per second, all physical disks together.";
    DiskRead = "trainprof_disk_read_bytes_per_second", Gauge, One, false, "i/o / ReadThroughputInBytesPerSecond", None,
        "Bytes read per second, all physical disks together.";
    DiskWrite = "trainprof_disk_write_bytes_per_second", Gauge, One, false, "i/o / WriteThroughputInBytesPerSecond", None,
        "Bytes written per second, all physical disks together.";
    NetReceive = "trainprof_network_receive_bytes_per_second", Gauge, One, false, "network / ReceiveBytesPerSecond / Algorithm", None,
        "Bytes received per second, all interfaces but loopback together.";
    NetTransmit = "trainprof_network_transmit_bytes_per_second", Gauge, One, false, "network / TransmitBytesPerSecond / Algorithm", None,
        "Bytes sent per second, all interfaces but loopback together.";
    PressureSome = "trainprof_pressure_some_stalled_percent", Gauge, One, false, "pressure / CPU, Memory, IO / SomeStalledPercent", None,
        "Share of the interval at least one task stalled on the resource, percent (label resource).";
    PressureFull = "trainprof_pressure_full_stalled_percent", Gauge, One, false, "pressure / CPU, Memory, IO / FullStalledPercent", None,
        "Share of the interval every non-idle task stalled on the resource at once, percent (label resource).";
    ContainerQuotaUsed = "trainprof_container_cpu_quota_used_percent", Gauge, One, false, "container / CPUUtilizationOfQuota / cgroup", None,
        "CPU used, percent of the container's CPU quota.";
    ContainerQuotaCores = "trainprof_container_cpu_quota_cores", Gauge, One, false, "container / CPUQuotaCores / cgroup", None,
        "The container's CPU quota, cores.";
    ContainerThrottled = "trainprof_container_cpu_throttled_periods_percent", Gauge, One, false, "container / CPUThrottledPeriodsPercent / cgroup", None,
        "Share of the interval's CFS periods in which the container was throttled, percent.";
    ContainerDiskOps = "trainprof_container_disk_operations_per_second", Gauge, One, false, "container / IOPS / cgroup", None,
        "The container's own reads and writes per second.";
    ContainerDiskRead = "trainprof_container_disk_read_bytes_per_second", Gauge, One, false, "container / ReadThroughputInBytesPerSecond / cgroup", None,
        "The container's own bytes read per second.";
    ContainerDiskWrite = "trainprof_container_disk_write_bytes_per_second", Gauge, One, false, "container / WriteThroughputInBytesPerSecond / cgroup", None,
        "The container's own bytes written per second.";
    GpuUtil = "trainprof_gpu_utilization_percent", Gauge, One, false, "gpu / gpuN / GPUUtilization", Some("DCGM_FI_DEV_GPU_UTIL (same, %)"),
        "Share of NVML's sample period a kernel ran on the GPU, percent.";
    GpuMemoryUsedPercent = "trainprof_gpu_memory_used_percent", Gauge, One, false, "gpu / gpuN / GPUMemoryUtilization", Some("100 × DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)"),
        "GPU memory used, percent of its total.";
    GpuMemoryUsed = "trainprof_gpu_memory_used_bytes", Gauge, One, false, "accelerator / deviceN / MemUsedBytes", Some("DCGM_FI_DEV_FB_USED × 2²⁰ (DCGM: MiB)"),
        "GPU memory used, bytes.";
    GpuMemoryBusy = "trainprof_gpu_memory_busy_percent", Gauge, One, false, "accelerator / deviceN / MemoryBusyPercent", Some("DCGM_FI_DEV_MEM_COPY_UTIL (same, %)"),
        "Share of NVML's sample period the memory controller was busy, percent.";
    GpuUtilMean = "trainprof_gpu_utilization_mean_percent", Gauge, One, true, "accelerator / deviceN / BusyMeanPercent", None,
        "Mean of NVML's utilisation samples since the buffer's previous read, percent.";
    GpuUtilMax = "trainprof_gpu_utilization_max_percent", Gauge, One, true, "accelerator / deviceN / BusyMaxPercent", None,
        "Highest of NVML's utilisation samples since the buffer's previous read, percent.";
    GpuMemoryBusyMean = "trainprof_gpu_memory_busy_mean_percent", Gauge, One, true, "accelerator / deviceN / MemoryBusyMeanPercent", None,
        "Mean of NVML's memory-controller samples since the buffer's previous read, percent.";
    GpuMemoryBusyMax = "trainprof_gpu_memory_busy_max_percent", Gauge, One, true, "accelerator / deviceN / MemoryBusyMaxPercent", None,
        "Highest of NVML's memory-controller samples since the buffer's previous read, percent.";
    GpuPower = "trainprof_gpu_power_watts", Gauge, One, true, "accelerator / deviceN / PowerWatts", Some("DCGM_FI_DEV_POWER_USAGE (same, W)"),
        "Power draw as NVML reports it (the driver may average it over up to a second), watts.";
    GpuPowerInstant = "trainprof_gpu_power_instant_watts", Gauge, One, false, "accelerator / deviceN / PowerInstantWatts", Some("DCGM_FI_DEV_POWER_USAGE_INSTANT (same, W)"),
        "Instant power draw, watts.";
    GpuEnergyMean = "trainprof_gpu_energy_mean_watts", Gauge, One, true, "accelerator / deviceN / EnergyMeanWatts", Some("rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[…]) / 1000 (DCGM: the mJ counter)"),
        "Mean power over the energy counter's last interval, watts.";
    GpuTemperature = "trainprof_gpu_temperature_celsius", Gauge, One, true, "accelerator / deviceN / TemperatureCelsius", Some("DCGM_FI_DEV_GPU_TEMP (same, °C)"),
        "GPU temperature, degrees Celsius.";
    GpuSmClock = "trainprof_gpu_sm_clock_hertz", Gauge, Mega, true, "accelerator / deviceN / SMClockMHz", Some("DCGM_FI_DEV_SM_CLOCK × 10⁶ (DCGM: MHz)"),
        "SM clock, hertz.";
    GpuThrottleMask = "trainprof_gpu_throttle_reasons_mask", Gauge, One, true, "accelerator / deviceN / ThrottleReasonsMask", Some("DCGM_FI_DEV_CLOCKS_EVENT_REASONS (formerly DCGM_FI_DEV_CLOCK_THROTTLE_REASONS; same bits)"),
        "NVML's clock throttle (clocks event) reasons, the bit mask.";
    GpuThrottleActive = "trainprof_gpu_throttle_reason_active", Gauge, One, false, "accelerator / deviceN / ThrottleReasonsMask (one series per reason, from the mask)", None,
        "1 while the clock throttle reason is active, else 0 (label reason).";
    GpuPcieTx = "trainprof_gpu_pcie_transmit_bytes_per_second", Gauge, One, true, "accelerator / deviceN / PcieTxBytesPerSecond", Some("DCGM_FI_PROF_PCIE_TX_BYTES (same, bytes/s)"),
        "PCIe bytes sent per second over the counters' last interval.";
    GpuPcieRx = "trainprof_gpu_pcie_receive_bytes_per_second", Gauge, One, true, "accelerator / deviceN / PcieRxBytesPerSecond", Some("DCGM_FI_PROF_PCIE_RX_BYTES (same, bytes/s)"),
        "PCIe bytes received per second over the counters' last interval.";
    GpuNvlinkTx = "trainprof_gpu_nvlink_transmit_bytes_per_second", Gauge, One, true, "accelerator / deviceN / NvlinkTxBytesPerSecond", Some("DCGM_FI_PROF_NVLINK_TX_BYTES (same, bytes/s)"),
        "NVLink bytes sent per second, all links, over the counters' last interval.";
    GpuNvlinkRx = "trainprof_gpu_nvlink_receive_bytes_per_second", Gauge, One, true, "accelerator / deviceN / NvlinkRxBytesPerSecond", Some("DCGM_FI_PROF_NVLINK_RX_BYTES (same, bytes/s)"),
        "NVLink bytes received per second, all links, over the counters' last interval.";
    GpuEccCorrectedVolatile = "trainprof_gpu_ecc_corrected_volatile_errors", Counter, One, true, "accelerator / deviceN / EccCorrectedVolatile", Some("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL (same)"),
        "Corrected (single-bit) ECC errors since the driver loaded.";
    GpuEccUncorrectedVolatile = "trainprof_gpu_ecc_uncorrected_volatile_errors", Counter, One, true, "accelerator / deviceN / EccUncorrectedVolatile", Some("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL (same)"),
        "Uncorrected (double-bit) ECC errors since the driver loaded.";
    GpuEccCorrectedAggregate = "trainprof_gpu_ecc_corrected_aggregate_errors", Counter, One, true, "accelerator / deviceN / EccCorrectedAggregate", Some("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL (same)"),
        "Corrected (single-bit) ECC errors over the board's life.";
    GpuEccUncorrectedAggregate = "trainprof_gpu_ecc_uncorrected_aggregate_errors", Counter, One, true, "accelerator / deviceN / EccUncorrectedAggregate", Some("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL (same)"),
        "Uncorrected (double-bit) ECC errors over the board's life.";
    GpuXidEvents = "trainprof_gpu_xid_events", Counter, One, false, "accelerator / deviceN / XidEvents", Some("none: DCGM_FI_DEV_XID_ERRORS is the last Xid's code, this the number of critical Xid events"),
        "Critical Xid events since the agent started.";
    GpuEccSbeEvents = "trainprof_gpu_ecc_single_bit_events", Counter, One, false, "accelerator / deviceN / EccSingleBitEvents", None,
        "Single-bit ECC events since the agent started.";
    GpuEccDbeEvents = "trainprof_gpu_ecc_double_bit_events", Counter, One, false, "accelerator / deviceN / EccDoubleBitEvents", None,
        "Double-bit ECC events since the agent started.";
    GpuSmActive = "trainprof_gpu_sm_active_percent", Gauge, One, true, "accelerator / deviceN / SmActivePercent", Some("100 × DCGM_FI_PROF_SM_ACTIVE (DCGM: ratio)"),
        "GPM: share of the interval SMs had a warp resident, percent.";
    GpuSmOccupancy = "trainprof_gpu_sm_occupancy_percent", Gauge, One, true, "accelerator / deviceN / SmOccupancyPercent", Some("100 × DCGM_FI_PROF_SM_OCCUPANCY (DCGM: ratio)"),
        "GPM: resident warps, percent of the maximum.";
    GpuTensorActive = "trainprof_gpu_tensor_active_percent", Gauge, One, true, "accelerator / deviceN / TensorActivePercent", Some("100 × DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (DCGM: ratio)"),
        "GPM: share of the interval any tensor pipe was active, percent.";
    GpuDramActive = "trainprof_gpu_dram_active_percent", Gauge, One, true, "accelerator / deviceN / DramActivePercent", Some("100 × DCGM_FI_PROF_DRAM_ACTIVE (DCGM: ratio)"),
        "GPM: share of the interval device memory was busy, percent.";
    GpuTrainerProcesses = "trainprof_gpu_trainer_processes", Gauge, One, false, "accelerator / deviceN / TrainerProcesses", None,
        "Processes of the trainer's tree on the GPU.";
    GpuTrainerMemory = "trainprof_gpu_trainer_memory_used_bytes", Gauge, One, false, "accelerator / deviceN / TrainerMemUsedBytes", None,
        "GPU memory used by the trainer's tree, bytes.";
    GpuTrainerSmBusy = "trainprof_gpu_trainer_sm_busy_percent", Gauge, One, false, "accelerator / deviceN / TrainerSmBusyPercent", None,
        "SM utilisation of the trainer's tree, percent.";
    GpuTrainerMemoryBusy = "trainprof_gpu_trainer_memory_busy_percent", Gauge, One, false, "accelerator / deviceN / TrainerMemoryBusyPercent", None,
        "Memory-controller utilisation of the trainer's tree, percent.";
    GpuUnattributedProcesses = "trainprof_gpu_unattributed_processes", Gauge, One, false, "accelerator / deviceN / UnattributedProcesses", None,
        "Processes on the GPU outside the trainer's tree.";
    GpuUnattributedMemory = "trainprof_gpu_unattributed_memory_used_bytes", Gauge, One, false, "accelerator / deviceN / UnattributedMemUsedBytes", None,
        "GPU memory used outside the trainer's tree, bytes.";
    GpuUnattributedSmBusy = "trainprof_gpu_unattributed_sm_busy_percent", Gauge, One, false, "accelerator / deviceN / UnattributedSmBusyPercent", None,
        "SM utilisation outside the trainer's tree, percent.";
    GpuTopPid = "trainprof_gpu_top_process_pid", Gauge, One, false, "accelerator / deviceN / TopProcess<k>Pid", None,
        "Pid of the k-th busiest process of the trainer's tree on the GPU (label rank).";
    GpuTopMemory = "trainprof_gpu_top_process_memory_used_bytes", Gauge, One, false, "accelerator / deviceN / TopProcess<k>MemUsedBytes", None,
        "GPU memory of the k-th busiest process of the trainer's tree, bytes (label rank).";
    GpuTopSmBusy = "trainprof_gpu_top_process_sm_busy_percent", Gauge, One, false, "accelerator / deviceN / TopProcess<k>SmBusyPercent", None,
        "SM utilisation of the k-th busiest process of the trainer's tree, percent (label rank).";
    TrainerCpu = "trainprof_trainer_cpu_percent", Gauge, One, false, "trainer / CPUPercent / ProcessTree", None,
        "CPU of the trainer's process tree, percent of one core.";
    TrainerPss = "trainprof_trainer_pss_bytes", Gauge, One, false, "trainer / PSSBytes / ProcessTree", None,
        "Proportional set size of the trainer's process tree, bytes.";
    TrainerRss = "trainprof_trainer_rss_bytes", Gauge, One, false, "trainer / RSSBytes / ProcessTree", None,
        "Resident set size summed over the trainer's process tree (shared pages counted per process), bytes.";
    TrainerProcesses = "trainprof_trainer_processes", Gauge, One, false, "trainer / Processes / ProcessTree", None,
        "Processes in the trainer's tree.";
    TrainerProcessCpu = "trainprof_trainer_process_cpu_percent", Gauge, One, false, "trainer / pid<pid>-<comm> / ProcessCPUPercent", None,
        "CPU of one of the tree's five busiest processes, percent of one core (labels pid, comm).";
    TrainerProcessPss = "trainprof_trainer_process_pss_bytes", Gauge, One, false, "trainer / pid<pid>-<comm> / ProcessPSSBytes", None,
        "Proportional set size of one of the tree's five busiest processes, bytes (labels pid, comm).";
    ClockSynchronised = "trainprof_clock_synchronised", Gauge, One, true, "clock / Synchronised / Kernel", None,
        "1 when the kernel's clock is disciplined (NTP), else 0.";
    ClockMaxError = "trainprof_clock_max_error_seconds", Gauge, Micro, true, "clock / MaxErrorMicros / Kernel", None,
        "The kernel's bound on the clock's error, seconds.";
    ClockEstimatedError = "trainprof_clock_estimated_error_seconds", Gauge, Micro, true, "clock / EstimatedErrorMicros / Kernel", None,
        "The kernel's estimate of the clock's error, seconds.";
    AgentCpu = "trainprof_agent_cpu_percent", Gauge, One, false, "agent / CPUPercent / Self", None,
        "The agent's own CPU, percent of one core.";
    AgentCpuPerTick = "trainprof_agent_cpu_seconds_per_tick", Gauge, Micro, false, "agent / CPUMicrosPerTick / Self", None,
        "The agent's own CPU time per tick, seconds.";
    AgentRss = "trainprof_agent_rss_bytes", Gauge, One, false, "agent / RSSBytes / Self", None,
        "The agent's own resident set size, bytes.";
    Unknown = "trainprof_system_row", Gauge, One, false, "any other row", None,
        "A system row without a family of its own yet, by its Type, Name and Dimension.";
}

/// What a row adds to the family's labels (beyond `node`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extra {
    None,
    Core(u32),
    /// `gpu` and, when known, `uuid`.
    Gpu(u32),
    /// A GPU and a label of its own (`rank`, `reason`).
    GpuAnd(u32, &'static str, &'static str),
    /// `scope` (memory) or `resource` (pressure).
    Word(&'static str, &'static str),
    /// `pid`, `comm`.
    Process(u32, Label),
    /// `type`, `name`, `dimension` of a row no family knows.
    Row,
}

/// The family a row is served in, and its labels.
pub fn family_of(m: &Metric) -> (F, Extra) {
    use MetricType as T;
    let d = m.dimension;
    let fixed = match m.name {
        Name::Static(s) => Some(s),
        _ => None,
    };
    let indexed = match m.name {
        Name::Indexed(_, i) => Some(i),
        _ => None,
    };
    let known = match (m.kind, indexed, fixed) {
        (T::Cpu, Some(i), _) => match d {
            dim::CPU_UTILIZATION => Some((F::CpuCoreBusy, Extra::Core(i))),
            dim::IO_WAIT_PERCENTAGE => Some((F::CpuCoreIowait, Extra::Core(i))),
            _ => None,
        },
        (T::Gpu, Some(i), _) => match d {
            dim::GPU_UTILIZATION => Some((F::GpuUtil, Extra::Gpu(i))),
            dim::GPU_MEMORY_UTILIZATION => Some((F::GpuMemoryUsedPercent, Extra::Gpu(i))),
            _ => None,
        },
        (T::Accelerator, Some(i), _) => accelerator(d, i),
        (T::Memory, _, Some(name::MEMORY_USED_PERCENT)) => Some((F::MemoryUsedPercent, Extra::None)),
        (T::Io, _, Some(n)) => match n {
            name::IOPS => Some(F::DiskOps),
            name::READ_THROUGHPUT => Some(F::DiskRead),
            name::WRITE_THROUGHPUT => Some(F::DiskWrite),
            _ => None,
        }
        .map(|f| (f, Extra::None)),
        (T::Network, _, Some(n)) => match n {
            name::RECEIVE_BYTES_PER_SECOND => Some(F::NetReceive),
            name::TRANSMIT_BYTES_PER_SECOND => Some(F::NetTransmit),
            _ => None,
        }
        .map(|f| (f, Extra::None)),
        (T::Host, _, Some(name::ALL_CORES)) => match d {
            dim::BUSY_PERCENT => Some((F::CpuBusy, Extra::None)),
            dim::IO_WAIT_PERCENT => Some((F::CpuIowait, Extra::None)),
            _ => None,
        },
        (T::Ram, _, Some(n)) => {
            let f = match n {
                name::MEMORY_USED_BYTES => Some(F::MemoryUsed),
                name::MEMORY_LIMIT_BYTES => Some(F::MemoryLimit),
                _ => None,
            };
            let scope = match d {
                dim::CGROUP => Some("cgroup"),
                dim::HOST => Some("host"),
                _ => None,
            };
            f.zip(scope).map(|(f, s)| (f, Extra::Word("scope", s)))
        }
        (T::Container, _, Some(n)) => match n {
            name::CPU_UTILIZATION_OF_QUOTA => Some(F::ContainerQuotaUsed),
            name::CPU_QUOTA_CORES => Some(F::ContainerQuotaCores),
            name::CPU_THROTTLED_PERIODS_PERCENT => Some(F::ContainerThrottled),
            name::IOPS => Some(F::ContainerDiskOps),
            name::READ_THROUGHPUT => Some(F::ContainerDiskRead),
            name::WRITE_THROUGHPUT => Some(F::ContainerDiskWrite),
            _ => None,
        }
        .map(|f| (f, Extra::None)),
        (T::Pressure, _, Some(n)) => {
            let f = match d {
                dim::SOME_STALLED_PERCENT => Some(F::PressureSome),
                dim::FULL_STALLED_PERCENT => Some(F::PressureFull),
                _ => None,
            };
            let resource = match n {
                name::PRESSURE_CPU => Some("cpu"),
                name::PRESSURE_MEMORY => Some("memory"),
                name::PRESSURE_IO => Some("io"),
                _ => None,
            };
            f.zip(resource).map(|(f, r)| (f, Extra::Word("resource", r)))
        }
        (T::Trainer, _, _) => trainer(m),
        (T::Clock, _, Some(n)) => match n {
            name::SYNCHRONISED => Some(F::ClockSynchronised),
            name::MAX_ERROR_MICROS => Some(F::ClockMaxError),
            name::ESTIMATED_ERROR_MICROS => Some(F::ClockEstimatedError),
            _ => None,
        }
        .map(|f| (f, Extra::None)),
        (T::Agent, _, Some(n)) => match n {
            name::CPU_PERCENT => Some(F::AgentCpu),
            name::CPU_MICROS_PER_TICK => Some(F::AgentCpuPerTick),
            name::RSS_BYTES => Some(F::AgentRss),
            _ => None,
        }
        .map(|f| (f, Extra::None)),
        _ => None,
    };
    known.unwrap_or((F::Unknown, Extra::Row))
}

/// The `accelerator` rows of GPU `i`.
fn accelerator(d: &str, i: u32) -> Option<(F, Extra)> {
    let f = match d {
        dim::GPU_MEMORY_BUSY_PERCENT => F::GpuMemoryBusy,
        dim::GPU_BUSY_MEAN_PERCENT => F::GpuUtilMean,
        dim::GPU_BUSY_MAX_PERCENT => F::GpuUtilMax,
        dim::GPU_MEMORY_BUSY_MEAN_PERCENT => F::GpuMemoryBusyMean,
        dim::GPU_MEMORY_BUSY_MAX_PERCENT => F::GpuMemoryBusyMax,
        dim::GPU_MEM_USED_BYTES => F::GpuMemoryUsed,
        dim::GPU_POWER_WATTS => F::GpuPower,
        dim::GPU_POWER_INSTANT_WATTS => F::GpuPowerInstant,
        dim::GPU_ENERGY_MEAN_WATTS => F::GpuEnergyMean,
        dim::GPU_TEMPERATURE_CELSIUS => F::GpuTemperature,
        dim::GPU_SM_CLOCK_MHZ => F::GpuSmClock,
        dim::GPU_THROTTLE_MASK => F::GpuThrottleMask,
        dim::GPU_PCIE_TX_BYTES_PER_SECOND => F::GpuPcieTx,
        dim::GPU_PCIE_RX_BYTES_PER_SECOND => F::GpuPcieRx,
        dim::GPU_NVLINK_TX_BYTES_PER_SECOND => F::GpuNvlinkTx,
        dim::GPU_NVLINK_RX_BYTES_PER_SECOND => F::GpuNvlinkRx,
        dim::GPU_ECC_CORRECTED_VOLATILE => F::GpuEccCorrectedVolatile,
        dim::GPU_ECC_UNCORRECTED_VOLATILE => F::GpuEccUncorrectedVolatile,
        dim::GPU_ECC_CORRECTED_AGGREGATE => F::GpuEccCorrectedAggregate,
        dim::GPU_ECC_UNCORRECTED_AGGREGATE => F::GpuEccUncorrectedAggregate,
        dim::GPU_XID_EVENTS => F::GpuXidEvents,
        dim::GPU_ECC_SINGLE_BIT_EVENTS => F::GpuEccSbeEvents,
        dim::GPU_ECC_DOUBLE_BIT_EVENTS => F::GpuEccDbeEvents,
        dim::GPU_SM_ACTIVE_PERCENT => F::GpuSmActive,
        dim::GPU_SM_OCCUPANCY_PERCENT => F::GpuSmOccupancy,
        dim::GPU_TENSOR_ACTIVE_PERCENT => F::GpuTensorActive,
        dim::GPU_DRAM_ACTIVE_PERCENT => F::GpuDramActive,
        dim::TRAINER_PROCESSES => F::GpuTrainerProcesses,
        dim::TRAINER_MEM_USED_BYTES => F::GpuTrainerMemory,
        dim::TRAINER_SM_BUSY_PERCENT => F::GpuTrainerSmBusy,
        dim::TRAINER_MEMORY_BUSY_PERCENT => F::GpuTrainerMemoryBusy,
        dim::UNATTRIBUTED_PROCESSES => F::GpuUnattributedProcesses,
        dim::UNATTRIBUTED_MEM_USED_BYTES => F::GpuUnattributedMemory,
        dim::UNATTRIBUTED_SM_BUSY_PERCENT => F::GpuUnattributedSmBusy,
        _ => {
            for (k, [pid, mem, sm]) in dim::TOP_PROCESS.iter().enumerate() {
                let rank = ["1", "2", "3"][k];
                let f = if d == *pid {
                    F::GpuTopPid
                } else if d == *mem {
                    F::GpuTopMemory
                } else if d == *sm {
                    F::GpuTopSmBusy
                } else {
                    continue;
                };
                return Some((f, Extra::GpuAnd(i, "rank", rank)));
            }
            // The per-reason rows repeat the mask's bits: every reason is served from the
            // mask instead (0 or 1), so that a reason that ends reads 0 rather than vanishing.
            if dim::THROTTLE_FLAGS.iter().any(|(_, name)| *name == d) {
                return Some((F::GpuThrottleActive, Extra::GpuAnd(i, "reason", "")));
            }
            return None;
        }
    };
    Some((f, Extra::Gpu(i)))
}

/// The `trainer` rows.
fn trainer(m: &Metric) -> Option<(F, Extra)> {
    match (m.name, m.dimension) {
        (Name::Static(n), dim::PROCESS_TREE) => match n {
            name::CPU_PERCENT => Some(F::TrainerCpu),
            name::PSS_BYTES => Some(F::TrainerPss),
            name::RSS_BYTES => Some(F::TrainerRss),
            name::PROCESSES => Some(F::TrainerProcesses),
            _ => None,
        }
        .map(|f| (f, Extra::None)),
        (Name::Process(pid, label), dim::PROCESS_CPU_PERCENT) => {
            Some((F::TrainerProcessCpu, Extra::Process(pid, label)))
        }
        (Name::Process(pid, label), dim::PROCESS_PSS_BYTES) => {
            Some((F::TrainerProcessPss, Extra::Process(pid, label)))
        }
        _ => None,
    }
}

/// What every series carries: the node, and each GPU's UUID by index.
#[derive(Debug, Clone, Default)]
pub struct Labels {
    /// `algo-<n>`, the system files' NodeId.
    pub node: String,
    /// The UUID of GPU `i` (when NVML gave one).
    pub gpu_uuid: Vec<(u32, String)>,
    /// The job's identity on this node ([`trainprof_output::protocol::node_record::JobIdentity::summary`], docs/formats.md, "Job
    /// identity"): the labels of the one `trainprof_job_info` series, on no other series.
    pub job_info: Vec<(&'static str, String)>,
}

/// The info series' name: one series, value 1, the job's identity in its labels.
pub const JOB_INFO: &str = "trainprof_job_info";

/// The info series (docs/metrics.md, "Job identity"): the node, then the identity's labels,
/// each value escaped as every label value is.
fn job_info(buf: &mut String, format: Format, labels: &Labels) {
    // OpenMetrics types an info metric `info` and names its sample `_info`; the text
    // format has no such type: a gauge, as the convention for `*_info` series has it.
    let (family, kind) = match format {
        Format::OpenMetrics => ("trainprof_job", "info"),
        Format::Text => (JOB_INFO, "gauge"),
    };
    let _ = writeln!(
        buf,
        "# HELP {family} The job this node's agent runs for: platform, job, host, rank, GPUs (always 1).\n# TYPE {family} {kind}"
    );
    buf.push_str(JOB_INFO);
    buf.push_str("{node=\"");
    escaped(buf, &labels.node);
    buf.push('"');
    for (k, v) in &labels.job_info {
        pair(buf, k, v);
    }
    buf.push_str("} 1\n");
}

/// A row to serve and its family, in serving order.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub family: F,
    pub extra: Extra,
    pub metric: Metric,
}

/// The rows of `metrics` in family order (stable: within a family, the tick's order), the
/// throttle reasons spread out of each mask.
pub fn rows(metrics: impl Iterator<Item = Metric>, out: &mut Vec<Row>) {
    out.clear();
    for metric in metrics {
        let (family, extra) = family_of(&metric);
        match (family, extra) {
            // Served from the mask.
            (F::GpuThrottleActive, _) => {}
            (F::GpuThrottleMask, Extra::Gpu(i)) => {
                out.push(Row { family, extra, metric });
                let mask = metric.value as u64;
                for (bit, name) in dim::THROTTLE_FLAGS {
                    let reason = name.strip_prefix("Throttle").unwrap_or(name);
                    let value = if mask & bit != 0 { 1.0 } else { 0.0 };
                    out.push(Row {
                        family: F::GpuThrottleActive,
                        extra: Extra::GpuAnd(i, "reason", reason),
                        metric: Metric { value, ..metric },
                    });
                }
            }
            _ => out.push(Row { family, extra, metric }),
        }
    }
    out.sort_by_key(|r| r.family);
}

/// Appends the exposition of `rows` (from [`rows`]), with the tick's time first, then the
/// trainer's progress.
pub fn render(
    buf: &mut String,
    format: Format,
    labels: &Labels,
    wall_s: f64,
    rows: &[Row],
    progress: Option<&super::progress::Progress>,
    cost_ns: &[u64],
) {
    let tick = Row {
        family: F::TickTimestamp,
        extra: Extra::None,
        metric: Metric { kind: MetricType::Agent, name: Name::Static(""), dimension: "", value: 0.0 },
    };
    let mut last: Option<F> = None;
    for row in std::iter::once(&tick).chain(rows) {
        let family = &FAMILIES[row.family as usize];
        if last != Some(row.family) {
            last = Some(row.family);
            header(buf, format, family);
        }
        buf.push_str(family.name);
        if family.kind == Kind::Counter {
            buf.push_str("_total");
        }
        push_labels(buf, labels, row);
        buf.push(' ');
        if row.family == F::TickTimestamp {
            // To the microsecond, as the files' Timestamp.
            let _ = write!(buf, "{}", trainprof_output::protocol::system_line::round_us(wall_s));
        } else {
            push_scaled(buf, family.scale, row.metric.value);
        }
        buf.push('\n');
    }
    job_info(buf, format, labels);
    if let Some(p) = progress {
        super::progress::render(buf, format, &labels.node, p);
    }
    cost(buf, format, &labels.node, cost_ns);
    if format == Format::OpenMetrics {
        buf.push_str("# EOF\n");
    }
}

/// The agent's CPU time per part ([`crate::pipeline::cost`]): one counter, a `part` label
/// from the closed set of [`Part::ALL`], the parts with time only (docs/metrics.md, "The
/// agent's own cost").
fn cost(buf: &mut String, format: Format, node: &str, ns: &[u64]) {
    use crate::pipeline::cost::Part;
    if ns.iter().all(|&n| n == 0) {
        return;
    }
    let name = "trainprof_agent_cpu_seconds";
    let typed = if format == Format::Text { "_total" } else { "" };
    let _ = write!(
        buf,
        "# HELP {name}{typed} The agent's own CPU time by part, seconds (thread CPU clocks around each part's work).\n# TYPE {name}{typed} counter\n"
    );
    for (part, &n) in Part::ALL.iter().zip(ns).filter(|(_, n)| **n > 0) {
        buf.push_str(name);
        buf.push_str("_total{node=\"");
        super::format::escaped(buf, node);
        let _ = writeln!(buf, "\",part=\"{}\"}} {:.6}", part.as_str(), n as f64 / 1e9);
    }
}

fn header(buf: &mut String, format: Format, family: &Family) {
    let name = family.name;
    let typed = match (format, family.kind) {
        (Format::Text, Kind::Counter) => "_total",
        _ => "",
    };
    buf.push_str("# HELP ");
    buf.push_str(name);
    buf.push_str(typed);
    buf.push(' ');
    // The help texts are ours: no backslash or newline to escape.
    buf.push_str(family.help);
    buf.push_str("\n# TYPE ");
    buf.push_str(name);
    buf.push_str(typed);
    buf.push_str(match family.kind {
        Kind::Gauge => " gauge\n",
        Kind::Counter => " counter\n",
    });
}

/// The value as the files hold it (two decimals), in the family's unit.
fn push_scaled(buf: &mut String, scale: Scale, value: f64) {
    let rounded = (value * 100.0).round() / 100.0;
    match scale {
        Scale::One => push_value(buf, value),
        Scale::Mega if rounded.is_finite() => {
            let _ = write!(buf, "{}", rounded * 1e6);
        }
        Scale::Micro if rounded.is_finite() => {
            let _ = write!(buf, "{}", rounded / 1e6);
        }
        _ => push_value(buf, value),
    }
}

fn push_labels(buf: &mut String, labels: &Labels, row: &Row) {
    buf.push_str("{node=\"");
    escaped(buf, &labels.node);
    buf.push('"');
    let gpu = |buf: &mut String, i: u32| {
        buf.push_str(",gpu=\"");
        push_u64(buf, u64::from(i));
        buf.push('"');
        if let Some((_, uuid)) = labels.gpu_uuid.iter().find(|(g, _)| *g == i) {
            buf.push_str(",uuid=\"");
            escaped(buf, uuid);
            buf.push('"');
        }
    };
    match row.extra {
        Extra::None => {}
        Extra::Core(i) => {
            buf.push_str(",core=\"");
            push_u64(buf, u64::from(i));
            buf.push('"');
        }
        Extra::Gpu(i) => gpu(buf, i),
        Extra::GpuAnd(i, key, value) => {
            gpu(buf, i);
            pair(buf, key, value);
        }
        Extra::Word(key, value) => pair(buf, key, value),
        Extra::Process(pid, label) => {
            buf.push_str(",pid=\"");
            push_u64(buf, u64::from(pid));
            buf.push('"');
            pair(buf, "comm", label.as_str());
        }
        Extra::Row => {
            pair(buf, "type", row.metric.kind.as_str());
            buf.push_str(",name=\"");
            let mut n = String::new();
            row.metric.name.push_to(&mut n);
            escaped(buf, &n);
            buf.push('"');
            pair(buf, "dimension", row.metric.dimension);
        }
    }
    buf.push('}');
}

fn pair(buf: &mut String, key: &str, value: &str) {
    buf.push(',');
    buf.push_str(key);
    buf.push_str("=\"");
    escaped(buf, value);
    buf.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::sample::MetricType;

    fn m(kind: MetricType, name: Name, dimension: &'static str, value: f64) -> Metric {
        Metric { kind, name, dimension, value }
    }

    fn labels() -> Labels {
        Labels { node: "algo-1".into(), gpu_uuid: vec![(0, "GPU-0000".into())], job_info: vec![] }
    }

    fn text(metrics: &[Metric], format: Format) -> String {
        let mut r = Vec::new();
        rows(metrics.iter().copied(), &mut r);
        let mut buf = String::new();
        render(&mut buf, format, &labels(), 1_595_455_620.123_456, &r, None, &[]);
        buf
    }

    #[test]
    fn every_dimension_of_the_vocabulary_has_a_family() {
        // Every Dimension under the Type that writes it (the GPU's under accelerator).
        for d in dim::ALL.iter().copied() {
            let metric = match d {
                dim::CPU_UTILIZATION | dim::IO_WAIT_PERCENTAGE => m(MetricType::Cpu, Name::core(0), d, 1.0),
                dim::GPU_UTILIZATION | dim::GPU_MEMORY_UTILIZATION => {
                    m(MetricType::Gpu, Name::gpu(0), d, 1.0)
                }
                dim::ALGORITHM => {
                    m(MetricType::Network, Name::Static(name::RECEIVE_BYTES_PER_SECOND), d, 1.0)
                }
                dim::BUSY_PERCENT | dim::IO_WAIT_PERCENT => {
                    m(MetricType::Host, Name::Static(name::ALL_CORES), d, 1.0)
                }
                dim::CGROUP | dim::HOST => m(MetricType::Ram, Name::Static(name::MEMORY_USED_BYTES), d, 1.0),
                dim::PROCESS_TREE => m(MetricType::Trainer, Name::Static(name::CPU_PERCENT), d, 1.0),
                dim::PROCESS_CPU_PERCENT | dim::PROCESS_PSS_BYTES => {
                    m(MetricType::Trainer, Name::Process(7, Label::sanitized(b"python")), d, 1.0)
                }
                dim::SOME_STALLED_PERCENT | dim::FULL_STALLED_PERCENT => {
                    m(MetricType::Pressure, Name::Static(name::PRESSURE_IO), d, 1.0)
                }
                dim::KERNEL => m(MetricType::Clock, Name::Static(name::SYNCHRONISED), d, 1.0),
                dim::SELF => m(MetricType::Agent, Name::Static(name::RSS_BYTES), d, 1.0),
                _ => m(MetricType::Accelerator, Name::device(0), d, 1.0),
            };
            assert_ne!(family_of(&metric).0, F::Unknown, "{d}");
        }
        for [a, b, c] in dim::TOP_PROCESS {
            for d in [a, b, c] {
                assert_ne!(
                    family_of(&m(MetricType::Accelerator, Name::device(1), d, 1.0)).0,
                    F::Unknown,
                    "{d}"
                );
            }
        }
        assert_eq!(
            family_of(&m(MetricType::Memory, Name::Static(name::MEMORY_USED_PERCENT), dim::NONE, 1.0)).0,
            F::MemoryUsedPercent
        );
    }

    #[test]
    fn docs_metrics_md_names_every_family() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md");
        let doc = std::fs::read_to_string(path).unwrap();
        for f in FAMILIES {
            let served = match f.kind {
                Kind::Counter => format!("`{}_total`", f.name),
                Kind::Gauge => format!("`{}`", f.name),
            };
            assert!(doc.contains(&served), "docs/metrics.md does not name {served}");
            if let Some(d) = f.dcgm {
                let field = d
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .find(|w| w.starts_with("DCGM_"));
                assert!(field.is_none_or(|w| doc.contains(w)), "docs/metrics.md lacks {d}");
            }
        }
    }

    #[test]
    fn names_follow_the_conventions_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for f in FAMILIES {
            assert!(seen.insert(f.name), "{}", f.name);
            assert!(f.name.starts_with("trainprof_"), "{}", f.name);
            assert!(f.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
            assert!(!f.name.ends_with("_total"), "{}", f.name);
        }
    }

    #[test]
    fn the_text_format_groups_families_and_labels_each_series() {
        let t = text(
            &[
                m(MetricType::Cpu, Name::core(0), dim::CPU_UTILIZATION, 12.345),
                m(MetricType::Cpu, Name::core(0), dim::IO_WAIT_PERCENTAGE, 1.0),
                m(MetricType::Cpu, Name::core(1), dim::CPU_UTILIZATION, 50.0),
                m(MetricType::Gpu, Name::gpu(0), dim::GPU_UTILIZATION, 90.0),
                m(MetricType::Accelerator, Name::device(0), dim::GPU_SM_CLOCK_MHZ, 1410.0),
                m(MetricType::Accelerator, Name::device(0), dim::GPU_THROTTLE_MASK, 0x41 as f64),
                m(MetricType::Accelerator, Name::device(0), "ThrottleGpuIdle", 1.0),
                m(MetricType::Accelerator, Name::device(0), dim::GPU_XID_EVENTS, 2.0),
                m(
                    MetricType::Trainer,
                    Name::Process(42, Label::sanitized(b"pt_data_worker")),
                    dim::PROCESS_CPU_PERCENT,
                    99.5,
                ),
                m(MetricType::Clock, Name::Static(name::MAX_ERROR_MICROS), dim::KERNEL, 15.0),
                m(MetricType::Ram, Name::Static(name::MEMORY_USED_BYTES), dim::CGROUP, 1024.0),
            ],
            Format::Text,
        );
        assert!(t.starts_with("# HELP trainprof_tick_timestamp_seconds "), "{t}");
        assert!(t.contains("trainprof_tick_timestamp_seconds{node=\"algo-1\"} 1595455620.123456\n"), "{t}");
        assert!(t.contains("# TYPE trainprof_cpu_core_busy_percent gauge\ntrainprof_cpu_core_busy_percent{node=\"algo-1\",core=\"0\"} 12.35\ntrainprof_cpu_core_busy_percent{node=\"algo-1\",core=\"1\"} 50\n"), "{t}");
        assert!(t.contains("trainprof_cpu_core_iowait_percent{node=\"algo-1\",core=\"0\"} 1\n"), "{t}");
        assert!(
            t.contains("trainprof_gpu_utilization_percent{node=\"algo-1\",gpu=\"0\",uuid=\"GPU-0000\"} 90\n"),
            "{t}"
        );
        assert!(
            t.contains(
                "trainprof_gpu_sm_clock_hertz{node=\"algo-1\",gpu=\"0\",uuid=\"GPU-0000\"} 1410000000\n"
            ),
            "{t}"
        );
        assert!(t.contains("trainprof_gpu_throttle_reason_active{node=\"algo-1\",gpu=\"0\",uuid=\"GPU-0000\",reason=\"GpuIdle\"} 1\n"), "{t}");
        assert!(t.contains("trainprof_gpu_throttle_reason_active{node=\"algo-1\",gpu=\"0\",uuid=\"GPU-0000\",reason=\"HwThermal\"} 1\n"), "{t}");
        assert!(t.contains("trainprof_gpu_throttle_reason_active{node=\"algo-1\",gpu=\"0\",uuid=\"GPU-0000\",reason=\"SwThermal\"} 0\n"), "{t}");
        // From the mask only: nine reasons, not ten.
        assert_eq!(t.matches("trainprof_gpu_throttle_reason_active{").count(), 9);
        assert!(t.contains("# TYPE trainprof_gpu_xid_events_total counter\ntrainprof_gpu_xid_events_total{node=\"algo-1\",gpu=\"0\",uuid=\"GPU-0000\"} 2\n"), "{t}");
        assert!(t.contains("trainprof_trainer_process_cpu_percent{node=\"algo-1\",pid=\"42\",comm=\"pt_data_worker\"} 99.5\n"), "{t}");
        assert!(t.contains("trainprof_clock_max_error_seconds{node=\"algo-1\"} 0.000015\n"), "{t}");
        assert!(t.contains("trainprof_memory_used_bytes{node=\"algo-1\",scope=\"cgroup\"} 1024\n"), "{t}");
        assert!(!t.contains("# EOF"));
        // Each family's header once.
        assert_eq!(t.matches("# TYPE trainprof_cpu_core_busy_percent ").count(), 1);
    }

    #[test]
    fn the_agent_cost_is_one_counter_with_a_part_label() {
        use crate::pipeline::cost::Part;
        let mut ns = vec![0u64; Part::ALL.len()];
        ns[Part::NvmlUtilization.slot()] = 1_500_000_000;
        ns[Part::Write.slot()] = 2_000;
        let mut t = String::new();
        cost(&mut t, Format::Text, "algo-1", &ns);
        assert!(t.contains("# TYPE trainprof_agent_cpu_seconds_total counter\n"), "{t}");
        assert!(
            t.contains(
                "trainprof_agent_cpu_seconds_total{node=\"algo-1\",part=\"nvml.utilization\"} 1.500000\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("trainprof_agent_cpu_seconds_total{node=\"algo-1\",part=\"write\"} 0.000002\n"),
            "{t}"
        );
        assert_eq!(t.matches("part=").count(), 2, "{t}");
        let mut om = String::new();
        cost(&mut om, Format::OpenMetrics, "algo-1", &ns);
        assert!(om.contains("# TYPE trainprof_agent_cpu_seconds counter\n"), "{om}");
        let mut none = String::new();
        cost(&mut none, Format::Text, "algo-1", &vec![0; Part::ALL.len()]);
        assert!(none.is_empty());
    }

    #[test]
    fn openmetrics_names_counters_without_total_and_ends_with_eof() {
        let t = text(
            &[m(MetricType::Accelerator, Name::device(3), dim::GPU_XID_EVENTS, 1.0)],
            Format::OpenMetrics,
        );
        assert!(t.contains("# TYPE trainprof_gpu_xid_events counter\ntrainprof_gpu_xid_events_total{node=\"algo-1\",gpu=\"3\"} 1\n"), "{t}");
        assert!(t.ends_with("# EOF\n"), "{t}");
    }

    #[test]
    fn a_row_without_a_family_is_served_by_its_words() {
        let t =
            text(&[m(MetricType::Host, Name::Static(name::ALL_CORES), "SomethingNew", 3.0)], Format::Text);
        assert!(t.contains("trainprof_system_row{node=\"algo-1\",type=\"host\",name=\"AllCores\",dimension=\"SomethingNew\"} 3\n"), "{t}");
    }

    /// The job's identity is one series, its values escaped; no other series carries it.
    #[test]
    fn the_job_s_identity_is_one_info_series_with_escaped_values() {
        let mut l = labels();
        let id = trainprof_output::protocol::node_record::JobIdentity::from_env(
            |k| match k {
                "SLURM_JOB_ID" => Some("42\"} 0\nfake{x=\"\\".to_owned()),
                "SLURM_PROCID" => Some("3".to_owned()),
                _ => None,
            },
            None,
            Some("h"),
        );
        l.job_info = id.summary(&[]);
        let metrics = [m(MetricType::Cpu, Name::core(0), dim::CPU_UTILIZATION, 1.0)];
        let mut rows_out = Vec::new();
        rows(metrics.iter().copied(), &mut rows_out);
        for format in [Format::Text, Format::OpenMetrics] {
            let mut t = String::new();
            render(&mut t, format, &l, 1.0, &rows_out, None, &[]);
            let series: Vec<&str> = t.lines().filter(|l| l.starts_with("trainprof_job_info{")).collect();
            assert_eq!(
                series,
                [
                    "trainprof_job_info{node=\"algo-1\",platform=\"slurm\",job=\"42\\\"} 0\\\\x0afake{x=\\\"\\\\\",\
                     host=\"h\",rank=\"3\",gpus=\"0\"} 1"
                ],
                "{t}"
            );
            assert_eq!(t.matches("platform=").count(), 1, "{t}");
            assert!(!t.lines().any(|l| l.starts_with("fake")), "{t}");
        }
    }
}
