//! The words of the framework timeline files (`docs/formats.md`, "File content" and
//! "Event vocabulary"): the metadata events' names, the phases (trace processes) the
//! library and the report know, the anomaly trigger's phase and name, and the `args` keys
//! that a reader looks for. The hook writes them (`hook-ffi/src/trace.rs`); the report and
//! the agent's repair read them.

words! {
    /// The metadata (`"ph": "M"`) events' names.
    METADATA;
    /// Names a trace process: the phase (`args.name`), or, for pid 0, carries the base time
    /// ([`BASE_TIME_KEY`]).
    PROCESS_NAME = "process_name",
    PROCESS_SORT_INDEX = "process_sort_index",
    /// Names a thread (the report's Perfetto trace).
    THREAD_NAME = "thread_name",
}

/// The `ph` of a complete event.
pub const PH_COMPLETE: &str = "X";
/// The `ph` of a metadata event.
pub const PH_METADATA: &str = "M";
/// The `ph` of an instant event (the trigger's); `I` is its older spelling, read too.
pub const PH_INSTANT: &str = "i";
pub const PH_INSTANT_OLD: &str = "I";
/// The `s` (scope) of an instant event drawn across the whole timeline.
pub const SCOPE_GLOBAL: &str = "g";

/// `args` keys: of pid 0's `process_name` line, the base time (µs since the epoch) that
/// every `ts` is relative to.
pub const BASE_TIME_KEY: &str = "start_time_since_epoch_in_micros";
/// Of a `process_sort_index` line.
pub const SORT_INDEX_KEY: &str = "sort_index";
/// Of an event: its step, a decimal string (readers take an integer too).
pub const STEP_NUM_KEY: &str = "step_num";
/// Of a `DataLoaderIterInitialize` event.
pub const NUM_WORKERS_KEY: &str = "num_workers";
pub const PIN_MEMORY_KEY: &str = "pin_memory";

/// The trigger's `args`, in the order written: the step in the windows' numbering, the slow
/// step's duration and the median (ms), the features opened, the window opened.
pub mod trigger_key {
    pub const STEP: &str = "step";
    pub const DURATION_MS: &str = "duration_ms";
    pub const MEDIAN_MS: &str = "median_ms";
    pub const FEATURES: &str = "features";
    pub const WINDOW_START_STEP: &str = "window_start_step";
    pub const WINDOW_NUM_STEPS: &str = "window_num_steps";
}

/// An on-demand window's `args` besides `step_num` ([`trigger_key::FEATURES`],
/// [`trigger_key::WINDOW_START_STEP`] and [`trigger_key::WINDOW_NUM_STEPS`] too), in the
/// order written: who asked (the request's id) and when (µs since the epoch).
pub mod requested_key {
    pub const REQUEST_ID: &str = "request_id";
    pub const REQUESTED_US: &str = "requested_us";
}

/// The collectives in the detailed windows' `cpu_functions` and `gpu_functions-dev:<n>`
/// events (`docs/formats.md`, "Collectives"): torch's own op and kernel names, and the `args`
/// torch gives `record_param_comms` (kineto's spelling), read when an event carries them.
pub mod collective {
    /// The dispatcher's op of a collective call (`c10d::allreduce_`), on the calling thread.
    pub const CALL_PREFIX: &str = "c10d::";
    /// The process group backends' ranges: `gloo:all_reduce` (on gloo's worker thread, the
    /// collective's whole run), `nccl:all_reduce` (the enqueue on the calling thread).
    pub const GLOO_PREFIX: &str = "gloo:";
    pub const NCCL_PREFIX: &str = "nccl:";
    /// torch's range carrying the collective's parameters.
    pub const PARAM_COMMS: &str = "record_param_comms";
    /// NCCL's kernels: before NCCL 2.19 `ncclKernel_…`, since `ncclDevKernel_…`.
    pub const NCCL_KERNEL_PREFIXES: [&str; 2] = ["ncclKernel_", "ncclDevKernel_"];
    /// `record_param_comms`' args (torch's `ParamCommsUtils`).
    pub const SEQ_KEY: &str = "Seq";
    pub const GROUP_KEY: &str = "Process Group Name";
    pub const NAME_KEY: &str = "Collective name";
    pub const GROUP_SIZE_KEY: &str = "Group size";
    pub const IN_NELEMS_KEY: &str = "In msg nelems";
    pub const DTYPE_KEY: &str = "dtype";
    /// What `trainprof.torch` writes on a `c10d::*`, `gloo:*` or `nccl:*` event when torch
    /// recorded its inputs' shapes (torch.profiler's `record_shapes`: `Input Dims` and
    /// `Input type`; docs/formats.md, "Collectives"): the bytes of its tensor inputs, and
    /// their type as c10's `ScalarType` number when they share one ([`SCALAR_TYPES`]).
    pub const MSG_BYTES_KEY: &str = "msg_bytes";
    pub const SCALAR_TYPE_KEY: &str = "scalar_type";
    /// torch's element types: c10's `ScalarType` name (`record_param_comms`' `dtype`), its
    /// number ([`SCALAR_TYPE_KEY`]), the name torch.profiler's `Input type` gives it (caffe2's
    /// `TypeMeta` name, as torch 2.15 writes it), and the bytes of one element.
    pub const SCALAR_TYPES: [(&str, u8, &str, u8); 20] = [
        ("Byte", 0, "unsigned char", 1),
        ("Char", 1, "signed char", 1),
        ("Short", 2, "short int", 2),
        ("Int", 3, "int", 4),
        ("Long", 4, "long int", 8),
        ("Half", 5, "c10::Half", 2),
        ("Float", 6, "float", 4),
        ("Double", 7, "double", 8),
        ("ComplexHalf", 8, "c10::complex<c10::Half>", 4),
        ("ComplexFloat", 9, "c10::complex<float>", 8),
        ("ComplexDouble", 10, "c10::complex<double>", 16),
        ("Bool", 11, "bool", 1),
        ("BFloat16", 15, "c10::BFloat16", 2),
        ("Float8_e5m2", 23, "c10::Float8_e5m2", 1),
        ("Float8_e4m3fn", 24, "c10::Float8_e4m3fn", 1),
        ("Float8_e5m2fnuz", 25, "c10::Float8_e5m2fnuz", 1),
        ("Float8_e4m3fnuz", 26, "c10::Float8_e4m3fnuz", 1),
        ("UInt16", 27, "short unsigned int", 2),
        ("UInt32", 28, "unsigned int", 4),
        ("UInt64", 29, "long unsigned int", 8),
    ];

    /// A collective's events by name: the dispatcher's op, a backend's range.
    pub fn is_collective_range(name: &str) -> bool {
        [CALL_PREFIX, GLOO_PREFIX, NCCL_PREFIX].iter().any(|p| name.starts_with(p))
    }
}

/// A memory event's `args` ([`MEMORY_PHASE`]; docs/formats.md, "Memory events"): torch's own
/// keys of its `[memory]` instant events, in the order written. The device's type is
/// c10's `DeviceType` number (0 CPU, 1 CUDA, …), its id -1 for the CPU; the totals are the
/// allocator's after the allocation or free, in bytes.
pub mod memory_key {
    pub const DEVICE_TYPE: &str = "Device Type";
    pub const DEVICE_ID: &str = "Device Id";
    pub const TOTAL_ALLOCATED: &str = "Total Allocated";
    pub const TOTAL_RESERVED: &str = "Total Reserved";
}

/// A capped window's `args` besides `step_num`, in the order written (docs/formats.md,
/// "Window caps"): the feature, the cap reached (one of [`CAP_WORDS`]), the value the
/// window had reached and the cap's limit, and the step it stopped at (the windows'
/// numbering).
pub mod capped_key {
    pub const FEATURE: &str = "feature";
    pub const CAP: &str = "cap";
    pub const VALUE: &str = "value";
    pub const LIMIT: &str = "limit";
    pub const STEP: &str = "step";
}

/// What a capped window reached ([`capped_key::CAP`]): events written, bytes of the
/// trainer's resident memory grown during the window, profiler samples.
pub const CAP_EVENTS: &str = "events";
pub const CAP_BYTES: &str = "bytes";
pub const CAP_SAMPLES: &str = "samples";
pub const CAP_WORDS: [&str; 3] = [CAP_EVENTS, CAP_BYTES, CAP_SAMPLES];

words! {
    /// The phases (trace processes) and event names that the library, the adapters and the
    /// report know.
    PHASES;
    STEP_TRAIN = "Step:ModeKeys.TRAIN",
    STEP_EVAL = "Step:ModeKeys.EVAL",
    STEP_PREDICT = "Step:ModeKeys.PREDICT",
    STEP_GLOBAL = "Step:ModeKeys.GLOBAL",
    /// What every step phase starts with; the mode follows.
    STEP_PREFIX = "Step:ModeKeys.",
    /// The detailed window's module events (`Forward`, `Forward-SubModuleInternal`).
    FORWARD = "Forward",
    /// The torch.profiler ops' phases end with it (`cpu_functions`, `gpu_functions-dev:0`).
    FUNCTIONS = "_functions",
    /// The phase of the detailed window's CPU ops.
    CPU_FUNCTIONS = "cpu_functions",
    /// The phase prefix of a device's kernels: `gpu_functions-dev:<n>`.
    GPU_FUNCTIONS = "gpu_functions-dev:",
    DATALOADER_ITER_INITIALIZE = "DataLoaderIterInitialize",
    DATALOADER_ITER = "DataLoaderIter",
    /// smdebug's; not written, read when present.
    DATALOADER_WORKER = "DataLoaderWorker",
    /// The anomaly trigger's phase and its instant event's name.
    TRIGGER_PHASE = "trainprof:AutoProfiling",
    TRIGGER_NAME = "trainprof:AutoProfilingTrigger",
    /// The phase of an on-demand window's instant event (`trainprof trigger`) and its name.
    REQUESTED_PHASE = "trainprof:Requested",
    REQUESTED_NAME = "trainprof:RequestedWindow",
    /// The phase of a window's instant event when it stopped at its cap, and its name.
    CAPPED_PHASE = "trainprof:Capped",
    CAPPED_NAME = "trainprof:WindowCapped",
    /// The phase of a detailed window's memory events (torch.profiler's `profile_memory`):
    /// one event of zero duration per allocation or free, named as torch names it
    /// ([`MEMORY_NAME`]), with the [`memory_key`] args.
    MEMORY_PHASE = "trainprof:Memory",
    MEMORY_NAME = "[memory]",
    /// The phase of an event whose pid no `process_name` line named (smdebug's default).
    UNKNOWN_PHASE = "Unknown",
}

/// The mode of a step phase (`Step:ModeKeys.TRAIN` → `TRAIN`).
pub fn step_mode(phase: &str) -> Option<&str> {
    phase.split_once(STEP_PREFIX).map(|(_, m)| m).filter(|m| !m.is_empty())
}

/// Whether an event of `phase` marks a step as one of a detailed (profiler) window: the
/// module events (`Forward…`) and the profiler's ops and kernels (`…_functions…`). The
/// report's `job.profiled.detailed_steps` and `compare`'s profiled windows count by it.
pub fn marks_detailed_step(phase: &str) -> bool {
    phase.starts_with(FORWARD) || phase.contains(FUNCTIONS)
}

/// Whether `phase`'s events are the detailed windows' ops or kernels (`cpu_functions`,
/// `gpu_functions-dev:<n>`): shown as ops and kernels, not as phases. Narrower than
/// [`marks_detailed_step`]: the module events (`Forward`) are phases of their own.
pub fn is_detailed_ops_phase(phase: &str) -> bool {
    phase == CPU_FUNCTIONS || phase.starts_with(GPU_FUNCTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_phases_carry_their_mode() {
        for (p, m) in
            [(STEP_TRAIN, "TRAIN"), (STEP_EVAL, "EVAL"), (STEP_PREDICT, "PREDICT"), (STEP_GLOBAL, "GLOBAL")]
        {
            assert_eq!(step_mode(p), Some(m));
        }
        assert_eq!(step_mode(STEP_PREFIX), None);
        assert_eq!(step_mode(FORWARD), None);
    }

    #[test]
    fn detailed_phases() {
        for p in [CPU_FUNCTIONS, "gpu_functions-dev:0"] {
            assert!(marks_detailed_step(p) && is_detailed_ops_phase(p), "{p}");
        }
        assert!(marks_detailed_step(FORWARD) && !is_detailed_ops_phase(FORWARD));
        assert!(marks_detailed_step("Forward-SubModuleInternal"));
        assert!(!marks_detailed_step(STEP_TRAIN) && !is_detailed_ops_phase(STEP_TRAIN));
    }
}
