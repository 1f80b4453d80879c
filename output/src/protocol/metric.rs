//! The system metrics' vocabulary (`docs/formats.md`, "System metrics: vocabulary"): every
//! `Type` ([`MetricType`]), `Name` ([`name`], [`Name`]) and `Dimension` ([`dimension`]) the
//! agent writes and the report reads, and the rule that keeps them apart from what
//! smdebug's analysis takes for a core, a GPU or a percentage ([`vocabulary_ok`]).

use std::fmt;

use super::decimal::push_u64;

/// A metric's `Type`: the five that smdebug's readers and rules know, and ours, chosen so
/// that no reader or rule takes them for one of those. [`MetricType::as_str`] is what is
/// written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricType {
    Cpu,
    Gpu,
    Memory,
    Io,
    Network,
    /// Ours: the whole machine's figures that are not per core (all cores together).
    Host,
    /// Ours: memory in bytes (used, and the limit the percentage was taken of).
    Ram,
    /// Ours: per-GPU figures other than the two percentages (power, temperature, clock, bytes).
    Accelerator,
    /// Ours: the container's cgroup (quota, throttling, its own I/O).
    Container,
    /// Ours: the trainer's process tree (`trainprof run`).
    Trainer,
    /// Ours: the agent's own cost.
    Agent,
    /// Ours: pressure stall information (share of time tasks waited for CPU, memory, I/O).
    Pressure,
    /// Ours: the kernel's clock synchronisation state and error bounds.
    Clock,
}

impl MetricType {
    pub const ALL: [MetricType; 13] = [
        MetricType::Cpu,
        MetricType::Gpu,
        MetricType::Memory,
        MetricType::Io,
        MetricType::Network,
        MetricType::Host,
        MetricType::Ram,
        MetricType::Accelerator,
        MetricType::Container,
        MetricType::Trainer,
        MetricType::Agent,
        MetricType::Pressure,
        MetricType::Clock,
    ];

    /// The `Type` as written in the system metrics files.
    pub const fn as_str(self) -> &'static str {
        match self {
            MetricType::Cpu => "cpu",
            MetricType::Gpu => "gpu",
            MetricType::Memory => "memory",
            MetricType::Io => "i/o",
            MetricType::Network => "network",
            MetricType::Host => "host",
            MetricType::Ram => "ram",
            MetricType::Accelerator => "accelerator",
            MetricType::Container => "container",
            MetricType::Trainer => "trainer",
            MetricType::Agent => "agent",
            MetricType::Pressure => "pressure",
            MetricType::Clock => "clock",
        }
    }

    /// The type written as `s`, if it is one of ours.
    pub fn from_written(s: &str) -> Option<MetricType> {
        MetricType::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

impl fmt::Display for MetricType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for MetricType {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The fixed `Name`s; the ones that are data are [`Name`]s built from [`CORE`], [`GPU_NAME`],
/// [`DEVICE`] and [`PROCESS`].
pub mod name {
    words! {
        /// Every fixed Name.
        ALL;
        // smdebug's.
        MEMORY_USED_PERCENT = "MemoryUsedPercent",
        IOPS = "IOPS",
        READ_THROUGHPUT = "ReadThroughputInBytesPerSecond",
        WRITE_THROUGHPUT = "WriteThroughputInBytesPerSecond",
        RECEIVE_BYTES_PER_SECOND = "ReceiveBytesPerSecond",
        TRANSMIT_BYTES_PER_SECOND = "TransmitBytesPerSecond",
        // Ours.
        ALL_CORES = "AllCores",
        MEMORY_USED_BYTES = "MemoryUsedBytes",
        MEMORY_LIMIT_BYTES = "MemoryLimitBytes",
        CPU_UTILIZATION_OF_QUOTA = "CPUUtilizationOfQuota",
        CPU_QUOTA_CORES = "CPUQuotaCores",
        CPU_THROTTLED_PERIODS_PERCENT = "CPUThrottledPeriodsPercent",
        /// The trainer tree's and the agent's CPU (100 = one core).
        CPU_PERCENT = "CPUPercent",
        PSS_BYTES = "PSSBytes",
        RSS_BYTES = "RSSBytes",
        PROCESSES = "Processes",
        CPU_MICROS_PER_TICK = "CPUMicrosPerTick",
        /// The pressure stalls' resources.
        PRESSURE_CPU = "CPU",
        PRESSURE_MEMORY = "Memory",
        PRESSURE_IO = "IO",
        SYNCHRONISED = "Synchronised",
        MAX_ERROR_MICROS = "MaxErrorMicros",
        ESTIMATED_ERROR_MICROS = "EstimatedErrorMicros",
    }

    words! {
        /// The prefixes of the Names that are data ([`super::Name`]).
        PREFIXES;
        /// `cpu<i>`: a core, under Type `cpu`.
        CORE = "cpu",
        /// `gpu<i>`: a GPU (the NVML index), under Type `gpu`.
        GPU = "gpu",
        /// `device<i>`: the same GPU, under Type `accelerator`.
        DEVICE = "device",
        /// `pid<pid>-<comm>`: one process of the trainer tree.
        PROCESS = "pid",
    }
}

pub use name::{CORE, DEVICE, GPU as GPU_NAME, PROCESS};

/// The `Dimension`s.
pub mod dimension {
    /// No dimension (smdebug's `memory` and `i/o` rows).
    pub const NONE: &str = "";

    words! {
        /// Every Dimension but [`NONE`].
        ALL;
        // smdebug's.
        CPU_UTILIZATION = "CPUUtilization",
        IO_WAIT_PERCENTAGE = "I/OWaitPercentage",
        GPU_UTILIZATION = "GPUUtilization",
        GPU_MEMORY_UTILIZATION = "GPUMemoryUtilization",
        /// Network traffic, summed by the rules.
        ALGORITHM = "Algorithm",
        // Ours.
        BUSY_PERCENT = "BusyPercent",
        IO_WAIT_PERCENT = "IOWaitPercent",
        /// What a memory percentage was taken of, and the container's rows.
        CGROUP = "cgroup",
        HOST = "host",
        PROCESS_TREE = "ProcessTree",
        PROCESS_CPU_PERCENT = "ProcessCPUPercent",
        PROCESS_PSS_BYTES = "ProcessPSSBytes",
        SOME_STALLED_PERCENT = "SomeStalledPercent",
        FULL_STALLED_PERCENT = "FullStalledPercent",
        KERNEL = "Kernel",
        /// The agent's own rows.
        SELF = "Self",
        // The GPUs' (`docs/formats.md`, "GPU").
        GPU_MEMORY_BUSY_PERCENT = "MemoryBusyPercent",
        GPU_BUSY_MAX_PERCENT = "BusyMaxPercent",
        GPU_MEMORY_BUSY_MAX_PERCENT = "MemoryBusyMaxPercent",
        GPU_BUSY_MEAN_PERCENT = "BusyMeanPercent",
        GPU_MEMORY_BUSY_MEAN_PERCENT = "MemoryBusyMeanPercent",
        GPU_MEM_USED_BYTES = "MemUsedBytes",
        GPU_POWER_WATTS = "PowerWatts",
        GPU_TEMPERATURE_CELSIUS = "TemperatureCelsius",
        GPU_SM_CLOCK_MHZ = "SMClockMHz",
        GPU_THROTTLE_MASK = "ThrottleReasonsMask",
        GPU_XID_EVENTS = "XidEvents",
        GPU_ECC_SINGLE_BIT_EVENTS = "EccSingleBitEvents",
        GPU_ECC_DOUBLE_BIT_EVENTS = "EccDoubleBitEvents",
        GPU_PCIE_TX_BYTES_PER_SECOND = "PcieTxBytesPerSecond",
        GPU_PCIE_RX_BYTES_PER_SECOND = "PcieRxBytesPerSecond",
        GPU_NVLINK_TX_BYTES_PER_SECOND = "NvlinkTxBytesPerSecond",
        GPU_NVLINK_RX_BYTES_PER_SECOND = "NvlinkRxBytesPerSecond",
        GPU_POWER_INSTANT_WATTS = "PowerInstantWatts",
        GPU_ENERGY_MEAN_WATTS = "EnergyMeanWatts",
        GPU_ECC_CORRECTED_VOLATILE = "EccCorrectedVolatile",
        GPU_ECC_UNCORRECTED_VOLATILE = "EccUncorrectedVolatile",
        GPU_ECC_CORRECTED_AGGREGATE = "EccCorrectedAggregate",
        GPU_ECC_UNCORRECTED_AGGREGATE = "EccUncorrectedAggregate",
        GPU_SM_ACTIVE_PERCENT = "SmActivePercent",
        GPU_SM_OCCUPANCY_PERCENT = "SmOccupancyPercent",
        GPU_TENSOR_ACTIVE_PERCENT = "TensorActivePercent",
        GPU_DRAM_ACTIVE_PERCENT = "DramActivePercent",
        TRAINER_PROCESSES = "TrainerProcesses",
        TRAINER_MEM_USED_BYTES = "TrainerMemUsedBytes",
        TRAINER_SM_BUSY_PERCENT = "TrainerSmBusyPercent",
        TRAINER_MEMORY_BUSY_PERCENT = "TrainerMemoryBusyPercent",
        UNATTRIBUTED_PROCESSES = "UnattributedProcesses",
        UNATTRIBUTED_MEM_USED_BYTES = "UnattributedMemUsedBytes",
        UNATTRIBUTED_SM_BUSY_PERCENT = "UnattributedSmBusyPercent",
    }

    /// `TopProcess<k>Pid`, `…MemUsedBytes`, `…SmBusyPercent` for the k-th busiest of the
    /// trainer tree's processes on a GPU (k = 1..3).
    pub const TOP_PROCESS: [[&str; 3]; 3] = [
        ["TopProcess1Pid", "TopProcess1MemUsedBytes", "TopProcess1SmBusyPercent"],
        ["TopProcess2Pid", "TopProcess2MemUsedBytes", "TopProcess2SmBusyPercent"],
        ["TopProcess3Pid", "TopProcess3MemUsedBytes", "TopProcess3SmBusyPercent"],
    ];

    /// NVML's clock throttle reasons (`nvmlClocksEventReason*`, formerly
    /// `…ThrottleReason*`) and their Dimensions: each active one is a row with value 1
    /// beside the whole mask ([`GPU_THROTTLE_MASK`]).
    pub const THROTTLE_FLAGS: [(u64, &str); 9] = [
        (0x1, "ThrottleGpuIdle"),
        (0x2, "ThrottleApplicationClocks"),
        (0x4, "ThrottleSwPowerCap"),
        (0x8, "ThrottleHwSlowdown"),
        (0x10, "ThrottleSyncBoost"),
        (0x20, "ThrottleSwThermal"),
        (0x40, "ThrottleHwThermal"),
        (0x80, "ThrottleHwPowerBrake"),
        (0x100, "ThrottleDisplayClocks"),
    ];
}

/// A metric's `Name`: a fixed one ([`name`]), a prefix and an index (`cpu3`, `gpu0`), or a
/// process (`pid1234-python`), so that a tick allocates nothing. [`Name::push_to`] is the
/// one place these are formatted; [`indexed`] reads an indexed one back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    Static(&'static str),
    /// A prefix of [`name::PREFIXES`] and an index.
    Indexed(&'static str, u32),
    /// `pid<pid>-<label>`: one process of the trainer's tree.
    Process(u32, Label),
}

impl Name {
    /// `cpu<i>`.
    pub const fn core(i: u32) -> Name {
        Name::Indexed(CORE, i)
    }

    /// `gpu<i>`.
    pub const fn gpu(i: u32) -> Name {
        Name::Indexed(GPU_NAME, i)
    }

    /// `device<i>`.
    pub const fn device(i: u32) -> Name {
        Name::Indexed(DEVICE, i)
    }

    /// Appends the Name as written.
    #[inline]
    pub fn push_to(&self, buf: &mut String) {
        match *self {
            Name::Static(s) => buf.push_str(s),
            Name::Indexed(prefix, i) => {
                buf.push_str(prefix);
                push_u64(buf, u64::from(i));
            }
            Name::Process(pid, label) => {
                buf.push_str(PROCESS);
                push_u64(buf, u64::from(pid));
                buf.push('-');
                buf.push_str(label.as_str());
            }
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::new();
        self.push_to(&mut s);
        f.write_str(&s)
    }
}

/// The index of an indexed Name (`cpu3` → 3 for [`CORE`]): the prefix, then decimal digits
/// only.
pub fn indexed(name: &str, prefix: &str) -> Option<u32> {
    let digits = name.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A short name from outside (a process's `comm`, at most 15 bytes), kept to the bytes a
/// JSON string and a chart label take as they are: ASCII letters, digits, `_`, `.` and `-`;
/// any other byte becomes `_`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Label {
    bytes: [u8; 15],
    len: u8,
}

impl Label {
    pub fn sanitized(raw: &[u8]) -> Label {
        let mut l = Label::default();
        for (slot, &b) in l.bytes.iter_mut().zip(raw) {
            let keep = b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-');
            *slot = if keep { b } else { b'_' };
            l.len += 1;
        }
        l
    }

    pub fn as_str(&self) -> &str {
        // Only ASCII bytes are ever stored.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a metric follows the vocabulary of `docs/formats.md`, "System metrics:
/// vocabulary". smdebug's `PandasFrameAnalysis.get_utilization_stats` takes every row whose
/// Type *contains* `cpu`, `gpu` or `memory` as a percentage of that resource; the rules count
/// every Name with Dimension `CPUUtilization` as a core and match `GPUUtilization`,
/// `GPUMemoryUtilization`, `I/OWaitPercentage`, `Algorithm` and the Name
/// `MemoryUsedPercent` under any Type; the numpy reader keeps Names starting with `cpu` /
/// `gpu`; the charts draw Dimensions with `CPU`, `GPU`, `Utilization` or `Memory` in them as
/// percentages.
pub fn vocabulary_ok(kind: &str, name: &str, dimension: &str) -> bool {
    use self::dimension as d;
    match MetricType::from_written(kind) {
        Some(MetricType::Cpu) => {
            indexed(name, CORE).is_some() && matches!(dimension, d::CPU_UTILIZATION | d::IO_WAIT_PERCENTAGE)
        }
        Some(MetricType::Gpu) => {
            indexed(name, GPU_NAME).is_some()
                && matches!(dimension, d::GPU_UTILIZATION | d::GPU_MEMORY_UTILIZATION)
        }
        Some(MetricType::Memory) => name == name::MEMORY_USED_PERCENT && dimension == d::NONE,
        Some(MetricType::Io) => name != name::MEMORY_USED_PERCENT && dimension == d::NONE,
        Some(MetricType::Network) => dimension == d::ALGORITHM,
        _ => {
            // The words smdebug's filters look for inside a Type or a Dimension.
            let taken_type =
                [MetricType::Cpu, MetricType::Gpu, MetricType::Memory, MetricType::Io, MetricType::Network]
                    .iter()
                    .any(|w| kind.contains(w.as_str()));
            let drawn_as_percent =
                ["CPU", "GPU", "Utilization", "Memory"].iter().any(|w| dimension.contains(w));
            let rule_dimension = matches!(dimension, d::ALGORITHM | "Platform" | d::NONE)
                || dimension.starts_with(d::CPU_UTILIZATION)
                || dimension.contains("I/OWait");
            let is_percent = dimension.ends_with("Percent");
            let bad = [taken_type, percent_like_name(name), drawn_as_percent && !is_percent, rule_dimension];
            !bad.contains(&true)
        }
    }
}

/// A Name that a rule or reader would take for a core, a GPU or the memory percentage.
fn percent_like_name(name: &str) -> bool {
    name.starts_with(CORE) || name.starts_with(GPU_NAME) || name == name::MEMORY_USED_PERCENT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_keeps_non_percentages_away_from_the_analysis() {
        for (k, n, d) in [
            ("cpu", "cpu0", "CPUUtilization"),
            ("cpu", "cpu15", "I/OWaitPercentage"),
            ("gpu", "gpu1", "GPUUtilization"),
            ("gpu", "gpu0", "GPUMemoryUtilization"),
            ("memory", "MemoryUsedPercent", ""),
            ("i/o", "IOPS", ""),
            ("network", "ReceiveBytesPerSecond", "Algorithm"),
            ("host", "AllCores", "BusyPercent"),
            ("ram", "MemoryUsedBytes", "cgroup"),
            ("accelerator", "device0", "PowerWatts"),
            ("accelerator", "device0", "MemoryBusyPercent"),
            ("container", "CPUUtilizationOfQuota", "cgroup"),
            ("trainer", "RSSBytes", "ProcessTree"),
            ("agent", "CPUMicrosPerTick", "Self"),
            ("trainer", "PSSBytes", "ProcessTree"),
            ("trainer", "pid12-pt_data_worker", "ProcessCPUPercent"),
            ("trainer", "pid12-cpu_burner", "ProcessPSSBytes"),
            ("pressure", "CPU", "SomeStalledPercent"),
            ("pressure", "Memory", "FullStalledPercent"),
            ("pressure", "IO", "SomeStalledPercent"),
            ("clock", "Synchronised", "Kernel"),
            ("clock", "MaxErrorMicros", "Kernel"),
        ] {
            assert!(vocabulary_ok(k, n, d), "{k}/{n}/{d}");
        }
        for (k, n, d) in [
            // The CPU total counted as a core; bytes, watts taken for percentages.
            ("cpu", "total", "CPUUtilization"),
            ("host", "AllCores", "CPUUtilization"),
            ("memory", "MemoryUsedBytes", "host"),
            ("memory_bytes", "MemoryUsedBytes", "host"),
            ("gpu", "gpu0", "GPUPowerWatts"),
            ("gpu_extra", "gpu0", "PowerWatts"),
            ("accelerator", "gpu0", "PowerWatts"),
            ("accelerator", "device0", "GPUPowerWatts"),
            ("accelerator", "device0", "MemUsedBytesOfMemory"),
            ("cpu", "cpu", "CPUUtilization"),
            ("cpu", "cpu+1", "CPUUtilization"),
            ("host", "x", "I/OWaitPercentage"),
            ("host", "MemoryUsedPercent", "host"),
            ("host", "x", "Algorithm"),
            // A process's comm must not make its Name a core's, nor bytes a percentage.
            ("trainer", "cpu_burner", "ProcessCPUPercent"),
            ("trainer", "pid12-python", "ProcessMemoryBytes"),
            ("pressure", "cpu", "SomeStalledPercent"),
            ("clock", "MaxErrorMicros", ""),
        ] {
            assert!(!vocabulary_ok(k, n, d), "{k}/{n}/{d}");
        }
        for t in MetricType::ALL {
            assert_eq!(MetricType::from_written(t.as_str()), Some(t));
        }
        assert_eq!(MetricType::Io.to_string(), "i/o");
        assert_eq!(MetricType::from_written("memory_bytes"), None);
    }

    #[test]
    fn every_word_of_ours_is_in_the_vocabulary() {
        // Each dimension under the Type it is written with (GPU extras under
        // `accelerator`, the others as the tables of docs/formats.md place them).
        let ours = [
            (MetricType::Host, name::ALL_CORES, dimension::BUSY_PERCENT),
            (MetricType::Ram, name::MEMORY_LIMIT_BYTES, dimension::HOST),
            (MetricType::Container, name::CPU_QUOTA_CORES, dimension::CGROUP),
            (MetricType::Trainer, name::PROCESSES, dimension::PROCESS_TREE),
            (MetricType::Agent, name::RSS_BYTES, dimension::SELF),
            (MetricType::Clock, name::ESTIMATED_ERROR_MICROS, dimension::KERNEL),
        ];
        for (k, n, d) in ours {
            assert!(vocabulary_ok(k.as_str(), n, d), "{k}/{n}/{d}");
        }
        // The GPUs' Dimensions are declared last, from `MemoryBusyPercent` on.
        let gpu_rows = dimension::ALL
            .iter()
            .skip_while(|d| **d != dimension::GPU_MEMORY_BUSY_PERCENT)
            .copied()
            .chain(dimension::TOP_PROCESS.concat())
            .chain(dimension::THROTTLE_FLAGS.map(|f| f.1));
        for d in gpu_rows {
            assert!(vocabulary_ok("accelerator", "device0", d), "accelerator/device0/{d}");
        }
    }

    #[test]
    fn names_that_are_data_are_formatted_and_read_back_in_one_place() {
        assert_eq!(Name::core(3).to_string(), "cpu3");
        assert_eq!(Name::gpu(0).to_string(), "gpu0");
        assert_eq!(Name::device(4_294_967_295).to_string(), "device4294967295");
        assert_eq!(Name::Process(42, Label::sanitized(b"python3")).to_string(), "pid42-python3");
        assert_eq!(Name::Static(name::ALL_CORES).to_string(), "AllCores");
        assert_eq!(indexed("cpu12", CORE), Some(12));
        assert_eq!(indexed(&Name::gpu(7).to_string(), GPU_NAME), Some(7));
        for bad in ["cpu", "cpu+1", "cpu-1", "cpu 1", "gpu1", "cpu99999999999"] {
            assert_eq!(indexed(bad, CORE), None, "{bad}");
        }
    }

    #[test]
    fn labels_keep_json_and_charts_safe() {
        assert_eq!(Label::sanitized(b"pt_data_worker").as_str(), "pt_data_worker");
        assert_eq!(Label::sanitized(b"a \"b\\c)").as_str(), "a__b_c_");
        assert_eq!(Label::sanitized("caf\u{e9}".as_bytes()).as_str(), "caf__");
        assert_eq!(Label::sanitized(b"0123456789abcdefXYZ").as_str(), "0123456789abcde");
        assert!(Label::sanitized(b"").is_empty());
    }
}
