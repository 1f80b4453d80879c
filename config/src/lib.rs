//! The SageMaker profiler configuration, as trainprof reads it.
//!
//! Data flow: [`Sources`] says where the file is (`SMPROFILER_CONFIG_PATH`, else
//! [`DEFAULT_CONFIG_PATH`]) and which `TRAINPROF_*` variables and command-line flags
//! override it; [`load`] reads the file once into a [`Loaded`] (the [`Config`] plus what
//! happened to the file); a [`Loader`] does the same repeatedly and tells whether the
//! content changed, keeping the lazily resolved windows when it did not.
//!
//! The file format is smdebug 1.0.34's (docs/formats.md, "Configuration file"), with the differences docs/formats.md, "Differences from smdebug", lists:
//! keys are case-insensitive but values keep their case; sub-configs are Python dict
//! literals (or plain JSON objects) read without evaluating anything; the SDK's
//! `Duration` counts as `DurationInSeconds`; a bad value turns off only what it belongs
//! to. Every such decision leaves a [`Problem`] (key path + message) in
//! [`Config::problems`], one line each, for the caller to log.
//!
//! No input makes this crate panic; the only I/O is reading the one file.

pub mod auto;
pub mod caps;
mod convert;
mod feature;
pub mod hang;
pub mod literal;
pub mod memory;
mod native;
mod parse;
mod reload;
mod sources;
pub mod window;

pub use auto::{AutoFeature, AutoFeatures, AutoProfiling};
pub use caps::WindowCaps;
pub use feature::{CProfileTimer, DataloaderFeature, Feature, Off, PythonFeature, PythonProfiler};
pub use hang::HangDetection;
pub use memory::{MemoryFeature, Stacks};
pub use native::{DEFAULT_SAMPLING_HZ, NativeFeature, SAMPLING_HZ_RANGE};
pub use reload::{Loader, ReadError, Reload, read_bytes as read_platform_file};
pub use sources::{OverrideKey, Sources};
pub use window::{Range, Step, Window};

use std::path::{Path, PathBuf};

/// Where the SageMaker platform puts the file.
pub const DEFAULT_CONFIG_PATH: &str = "/opt/ml/input/config/profilerconfig.json";
/// `ProfilingParameters.LocalPath` when not given.
pub const DEFAULT_LOCAL_PATH: &str = "/opt/ml/output/profiler";
/// `ProfilingIntervalInMilliseconds` when not given or out of range.
pub const DEFAULT_INTERVAL_MS: u32 = 500;
/// Accepted sampling intervals (the API allows 100 ms to 60 s).
pub const INTERVAL_MS_RANGE: std::ops::RangeInclusive<u32> = 100..=60_000;
pub const DEFAULT_ROTATE_MAX_FILE_SIZE: u64 = 10_485_760;
pub const DEFAULT_ROTATE_CLOSE_INTERVAL_S: f64 = 60.0;
pub const DEFAULT_FILE_OPEN_FAIL_THRESHOLD: u32 = 50;

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// False when the profiler is switched off (`DisableProfiler`, `TRAINPROF_DISABLE`, an
    /// unrecognised value of either, or a file that exists but cannot be read as JSON):
    /// then nothing is sampled or written, and every feature is off.
    pub enabled: bool,
    /// `ProfilingParameters` is present and an object: the framework side (the hook's
    /// timelines and windows) is configured. Without it smdebug writes no framework files,
    /// and neither does the hook unless `LocalPath` is overridden.
    pub framework_configured: bool,
    /// System sampling interval (`ProfilingIntervalInMilliseconds`).
    pub interval_ms: u32,
    /// Root of all output (`ProfilingParameters.LocalPath`), case kept.
    pub local_path: String,
    /// Where sealed files go (`S3OutputPath`), `s3://bucket[/prefix]`, if anywhere.
    pub s3_output_path: Option<String>,
    pub rotate_max_file_size: u64,
    pub rotate_close_interval_s: f64,
    pub file_open_fail_threshold: u32,
    pub detailed: Feature,
    pub dataloader: DataloaderFeature,
    pub python: PythonFeature,
    pub smdataparallel: Feature,
    /// Native CPU sampling (`NativeProfilingConfig`, a trainprof extension).
    pub native: NativeFeature,
    /// `AutoProfilingConfig`: windows opened by a slow train step (a trainprof extension).
    pub auto: AutoProfiling,
    /// `HangDetectionConfig`: stall detection and last words (a trainprof extension).
    pub hang: HangDetection,
    /// `WindowCapsConfig`: how much one window may capture (a trainprof extension).
    pub caps: WindowCaps,
    /// `MemoryProfilingConfig`: PyTorch memory snapshots (a trainprof extension).
    pub memory: MemoryFeature,
    /// Everything that was ignored, replaced by a default or turned off, one line each.
    pub problems: Vec<Problem>,
}

impl Config {
    /// The built-in defaults: system monitoring on, every framework feature off.
    pub fn defaults() -> Config {
        Config {
            enabled: true,
            framework_configured: false,
            interval_ms: DEFAULT_INTERVAL_MS,
            local_path: DEFAULT_LOCAL_PATH.to_owned(),
            s3_output_path: None,
            rotate_max_file_size: DEFAULT_ROTATE_MAX_FILE_SIZE,
            rotate_close_interval_s: DEFAULT_ROTATE_CLOSE_INTERVAL_S,
            file_open_fail_threshold: DEFAULT_FILE_OPEN_FAIL_THRESHOLD,
            detailed: Feature::not_configured(),
            dataloader: DataloaderFeature::not_configured(),
            python: PythonFeature::not_configured(),
            smdataparallel: Feature::not_configured(),
            native: NativeFeature::not_configured(),
            auto: AutoProfiling::not_configured(),
            hang: HangDetection::not_configured(),
            caps: WindowCaps::default(),
            memory: MemoryFeature::not_configured(),
            problems: Vec::new(),
        }
    }

    pub fn local_path(&self) -> &Path {
        Path::new(&self.local_path)
    }
}

/// One thing in the configuration that did not take effect as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where: a key path with the documented spelling
    /// (`ProfilingParameters.DetailedProfilingConfig.StartStep`), `env:NAME` for an
    /// environment variable, `flag:--name` for a command-line flag, or `file`.
    pub key: String,
    /// What was wrong and what was done instead.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// What became of the configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileStatus {
    /// Read and parsed as a JSON object (its content may still have problems).
    Read,
    /// There is no file: built-in defaults (system monitoring on, framework features off).
    Missing,
    /// It exists but could not be read, is not JSON, or is not a JSON object: profiling is
    /// off, since the file might have said so (a kill switch must not be ambiguous).
    Unusable(String),
}

/// A config as [`load`] returns it.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub path: PathBuf,
    pub file: FileStatus,
    pub config: Config,
}

/// Reads the file named by `sources` once and builds the effective configuration.
pub fn load(sources: &Sources) -> Loaded {
    reload::load_once(sources)
}

/// The overrides (`TRAINPROF_*` variables and flags) whose values are not valid, one
/// [`Problem`] each, keyed `flag:--name` or `env:NAME`. [`load`] reports them too (and keeps
/// the value below); the agent refuses to start with any, since a person typed them.
pub fn override_problems(sources: &Sources) -> Vec<Problem> {
    parse::override_problems(sources)
}

/// Builds the effective configuration from a file's bytes (as [`load`] does after reading).
pub fn from_bytes(bytes: &[u8], sources: &Sources) -> Config {
    let (file, doc) = reload::parse_document(bytes);
    parse::build(&file, doc.as_ref(), sources)
}
