//! The JSON document -> [`Config`], one key at a time.
//!
//! Each key is read on its own: a bad scalar falls back to its own default, a bad
//! sub-config turns off its own feature, and each leaves one [`Problem`]. Keys match
//! without regard to case (smdebug lowercases the whole text); values keep their case.

use regex::RegexBuilder;
use serde_json::{Map, Value};

use crate::auto::AutoProfiling;
use crate::convert::{NumberError, kind, py_float, py_int};
use crate::feature::{CProfileTimer, DataloaderFeature, Feature, Off, PythonFeature, PythonProfiler};
use crate::literal;
use crate::memory::{self, MemoryFeature};
use crate::native::{self, NativeFeature};
use crate::sources::{OverrideKey, Sources};
use crate::window::Range;
use crate::{Config, FileStatus, INTERVAL_MS_RANGE, Problem};

/// Regexes bigger than this when compiled are refused (hostile configs).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

pub(crate) fn build(file: &FileStatus, doc: Option<&Value>, sources: &Sources) -> Config {
    let mut cfg = Config::defaults();
    let mut p = Problems::default();
    let mut disable = false;
    let mut unusable = false;
    match (file, doc) {
        (FileStatus::Read, Some(Value::Object(top))) => read_top(top, &mut cfg, &mut disable, &mut p),
        (FileStatus::Unusable(why), _) => {
            unusable = true;
            p.push("file", format!("{why}; profiling is off"));
        }
        _ => {}
    }
    for o in &sources.overrides {
        let origin = o.origin.as_str();
        match (o.key, convert_override(o.key, &o.value)) {
            (_, Ok(Overridden::LocalPath(path))) => cfg.local_path = path,
            (_, Ok(Overridden::IntervalMs(ms))) => cfg.interval_ms = ms,
            (_, Ok(Overridden::S3OutputPath(url))) => cfg.s3_output_path = url,
            (_, Ok(Overridden::Disable(d))) => disable = d,
            (OverrideKey::LocalPath, Err(e)) => p.push(origin, format!("{e}; keeping {:?}", cfg.local_path)),
            (OverrideKey::IntervalMs, Err(e)) => {
                p.push(origin, format!("{e}; keeping {} ms", cfg.interval_ms))
            }
            (OverrideKey::S3OutputPath, Err(e)) => p.push(
                origin,
                format!("{e}; keeping {}", cfg.s3_output_path.as_deref().unwrap_or("no upload")),
            ),
            (OverrideKey::Disable, Err(e)) => {
                disable = true;
                p.push(origin, format!("{e}; profiling is off"));
            }
        }
    }
    if cfg.detailed.is_enabled()
        && let Some(which) = sources.sm_hps.as_deref().and_then(model_parallel)
    {
        cfg.detailed.turn_off(Off::ModelParallel);
        p.push(
            "env:SM_HPS",
            format!(
                "model-parallel training (mp_parameters.{which}): detailed profiling is off, as in smdebug"
            ),
        );
    }
    if disable || unusable {
        cfg.enabled = false;
        for f in [
            &mut cfg.detailed,
            &mut cfg.dataloader.feature,
            &mut cfg.python.feature,
            &mut cfg.smdataparallel,
            &mut cfg.native.feature,
            &mut cfg.memory.feature,
        ] {
            f.turn_off(Off::ProfilerDisabled);
        }
        cfg.auto.turn_off(Off::ProfilerDisabled);
        cfg.hang.turn_off(Off::ProfilerDisabled);
    }
    cfg.problems = p.0;
    cfg
}

/// An override's value, converted.
enum Overridden {
    LocalPath(String),
    IntervalMs(u32),
    S3OutputPath(Option<String>),
    Disable(bool),
}

/// Why a scalar value (a key's in the file, or an override's) is not usable; its text is a
/// short reason, to which the caller adds what it did instead.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum ValueError {
    #[error(transparent)]
    Number(#[from] NumberError),
    #[error("is empty")]
    Empty,
    #[error("contains a NUL character")]
    NulCharacter,
    /// A path that is not a string (the JSON kind).
    #[error("is {0}, expected a path")]
    NotAPath(&'static str),
    #[error("{0} is outside {lo}..={hi} ms", lo = INTERVAL_MS_RANGE.start(), hi = INTERVAL_MS_RANGE.end())]
    IntervalOutOfRange(Value),
    /// An S3 URL that is not a string (the JSON kind).
    #[error("is {0}, expected s3://bucket/prefix")]
    NotAnS3Url(&'static str),
    #[error("{0:?} does not start with s3://")]
    NoS3Scheme(String),
    #[error("{0:?} is not a valid S3 bucket name")]
    BadBucket(String),
    /// `TRAINPROF_DISABLE` (or its flag) with a value that is neither yes nor no.
    #[error("unrecognised value {0:?} (use 1 or 0)")]
    BadFlag(String),
    #[error("{0} is not a positive number of bytes")]
    NotPositiveBytes(Value),
    #[error("{0} is not a positive number of seconds")]
    NotPositiveSeconds(Value),
    #[error("{0} is not a positive count")]
    NotPositiveCount(Value),
}

/// Converts one override's value with the same rules as the file's key.
fn convert_override(key: OverrideKey, value: &str) -> Result<Overridden, ValueError> {
    let v = Value::String(value.to_owned());
    match key {
        OverrideKey::LocalPath => local_path(&v).map(Overridden::LocalPath),
        OverrideKey::IntervalMs => interval_ms(&v).map(Overridden::IntervalMs),
        OverrideKey::S3OutputPath => s3_url(&v).map(Overridden::S3OutputPath),
        OverrideKey::Disable => {
            env_flag(value).map(Overridden::Disable).ok_or_else(|| ValueError::BadFlag(value.to_owned()))
        }
    }
}

/// The overrides (environment variables and flags) whose values are not valid, one
/// [`Problem`] each, keyed by their origin (`flag:--interval-ms`, `env:TRAINPROF_…`).
pub(crate) fn override_problems(sources: &Sources) -> Vec<Problem> {
    sources
        .overrides
        .iter()
        .filter_map(|o| convert_override(o.key, &o.value).err().map(|e| (o, e)))
        .map(|(o, e)| Problem { key: o.origin.clone(), message: e.to_string() })
        .collect()
}

#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn push(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem { key: key.into(), message: message.into() });
    }
}

/// The keys of one JSON object, matched case-insensitively against the documented ones.
struct Keys<'a> {
    parent: String,
    found: Vec<(&'static str, &'a Value)>,
}

impl<'a> Keys<'a> {
    /// Unknown keys and keys given twice (in different case) are reported here.
    fn fold(obj: &'a Map<String, Value>, parent: &str, known: &[&'static str], p: &mut Problems) -> Keys<'a> {
        let mut keys = Keys { parent: parent.to_owned(), found: Vec::new() };
        for (k, v) in obj {
            match known.iter().find(|c| c.eq_ignore_ascii_case(k)) {
                None => p.push(keys.path(k), unknown_key(k, parent, known)),
                Some(&c) => {
                    if let Some(slot) = keys.found.iter_mut().find(|(f, _)| *f == c) {
                        slot.1 = v;
                        p.push(keys.path(c), "given more than once (keys ignore case); the last one is used");
                    } else {
                        keys.found.push((c, v));
                    }
                }
            }
        }
        keys
    }

    /// The value of a documented key; `null` counts as not given.
    fn get(&self, canonical: &str) -> Option<&'a Value> {
        self.found.iter().find(|(c, v)| *c == canonical && !v.is_null()).map(|(_, v)| *v)
    }

    fn path(&self, key: &str) -> String {
        if self.parent.is_empty() { key.to_owned() } else { format!("{}.{key}", self.parent) }
    }

    /// Converts one scalar; on failure reports it and keeps `current`.
    fn scalar<T: std::fmt::Debug>(
        &self,
        key: &str,
        current: &mut T,
        p: &mut Problems,
        conv: impl Fn(&Value) -> Result<T, ValueError>,
    ) {
        if let Some(v) = self.get(key) {
            match conv(v) {
                Ok(x) => *current = x,
                Err(e) => p.push(self.path(key), format!("{e}; using the default {current:?}")),
            }
        }
    }
}

fn read_top(top: &Map<String, Value>, cfg: &mut Config, disable: &mut bool, p: &mut Problems) {
    let keys = Keys::fold(
        top,
        "",
        &["ProfilingParameters", "DisableProfiler", "S3OutputPath", "ProfilingIntervalInMilliseconds"],
        p,
    );
    if let Some(v) = keys.get("DisableProfiler") {
        *disable = match v {
            Value::Bool(b) => *b,
            Value::String(s) if s.trim().eq_ignore_ascii_case("true") => true,
            Value::String(s) if s.trim().eq_ignore_ascii_case("false") => false,
            other => {
                p.push(
                    "DisableProfiler",
                    format!("unrecognised value {other} (use true or false); profiling is off"),
                );
                true
            }
        };
    }
    keys.scalar("ProfilingIntervalInMilliseconds", &mut cfg.interval_ms, p, interval_ms);
    if let Some(v) = keys.get("S3OutputPath") {
        match s3_url(v) {
            Ok(url) => cfg.s3_output_path = url,
            Err(e) => p.push("S3OutputPath", format!("{e}; files stay local (no upload)")),
        }
    }
    match keys.get("ProfilingParameters") {
        None => {}
        Some(Value::Object(params)) => {
            // `{}` counts as absent, as in smdebug.
            cfg.framework_configured = !params.is_empty();
            read_params(params, cfg, p)
        }
        Some(other) => p.push(
            "ProfilingParameters",
            format!("is {}, expected an object; framework profiling is off", kind(other)),
        ),
    }
}

fn read_params(params: &Map<String, Value>, cfg: &mut Config, p: &mut Problems) {
    let keys = Keys::fold(
        params,
        "ProfilingParameters",
        &[
            "LocalPath",
            "RotateMaxFileSizeInBytes",
            "RotateFileCloseIntervalInSeconds",
            "FileOpenFailThreshold",
            "DetailedProfilingConfig",
            "DataloaderProfilingConfig",
            "PythonProfilingConfig",
            "SMDataParallelProfilingConfig",
            // trainprof's own (docs/formats.md, "Native profiling").
            "NativeProfilingConfig",
            // A trainprof extension (docs/formats.md, "Anomaly-triggered windows").
            "AutoProfilingConfig",
            // A trainprof extension (docs/formats.md, "Hang and crash dumps").
            "HangDetectionConfig",
            // A trainprof extension (docs/formats.md, "Window caps").
            "WindowCapsConfig",
            // A trainprof extension (docs/formats.md, "Memory windows").
            "MemoryProfilingConfig",
            // Written by the SDK, read by nobody (smdebug neither): ignored quietly.
            "HorovodProfilingConfig",
            "ProfilerEnabled",
        ],
        p,
    );
    keys.scalar("LocalPath", &mut cfg.local_path, p, local_path);
    keys.scalar("RotateMaxFileSizeInBytes", &mut cfg.rotate_max_file_size, p, |v| {
        // smdebug: int(float(v)).
        let f = py_float(v)?;
        if (1.0..18_446_744_073_709_551_616.0).contains(&f) {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // range checked
            Ok(f as u64)
        } else {
            Err(ValueError::NotPositiveBytes(v.clone()))
        }
    });
    keys.scalar("RotateFileCloseIntervalInSeconds", &mut cfg.rotate_close_interval_s, p, |v| {
        let f = py_float(v)?;
        if f > 0.0 { Ok(f) } else { Err(ValueError::NotPositiveSeconds(v.clone())) }
    });
    keys.scalar("FileOpenFailThreshold", &mut cfg.file_open_fail_threshold, p, |v| {
        let i = py_int(v)?;
        u32::try_from(i).ok().filter(|&n| n >= 1).ok_or_else(|| ValueError::NotPositiveCount(v.clone()))
    });
    if keys.get("ProfilerEnabled").is_some() {
        p.push(
            keys.path("ProfilerEnabled"),
            "ignored (a pre-release smdebug key); use the top-level DisableProfiler to switch profiling off",
        );
    }
    let sub = |name: &str, p: &mut Problems| sub_config(keys.get(name), &keys.path(name), p);
    if let Some(s) = sub("DetailedProfilingConfig", p) {
        cfg.detailed = feature(s, &keys.path("DetailedProfilingConfig"), Which::Detailed, p);
    }
    if let Some(s) = sub("SMDataParallelProfilingConfig", p) {
        cfg.smdataparallel =
            feature(s, &keys.path("SMDataParallelProfilingConfig"), Which::SmDataParallel, p);
    }
    if let Some(s) = sub("DataloaderProfilingConfig", p) {
        cfg.dataloader = dataloader(s, &keys.path("DataloaderProfilingConfig"), p);
    }
    if let Some(s) = sub("PythonProfilingConfig", p) {
        cfg.python = python(s, &keys.path("PythonProfilingConfig"), p);
    }
    if let Some(s) = sub("NativeProfilingConfig", p) {
        cfg.native = native_feature(s, &keys.path("NativeProfilingConfig"), p);
    }
    if let Some(s) = sub("AutoProfilingConfig", p) {
        cfg.auto = auto(s, &keys.path("AutoProfilingConfig"), p);
    }
    if let Some(s) = sub("HangDetectionConfig", p) {
        cfg.hang = hang(s, &keys.path("HangDetectionConfig"), p);
    }
    if let Some(s) = sub("MemoryProfilingConfig", p) {
        cfg.memory = memory_feature(s, &keys.path("MemoryProfilingConfig"), p);
    }
    if let Some(Ok(m)) = sub("WindowCapsConfig", p) {
        cfg.caps = caps(&m, &keys.path("WindowCapsConfig"), p);
    }
}

/// `WindowCapsConfig`: a refused value keeps that cap's default, one line each; a broken
/// dict (reported by `sub_config`) keeps every default.
fn caps(m: &Map<String, Value>, path: &str, p: &mut Problems) -> crate::WindowCaps {
    let keys = Keys::fold(m, path, crate::caps::CAPS_KEYS, p);
    let (caps, bad) = crate::caps::read(|k| keys.get(k).cloned());
    for (key, e, default) in bad {
        p.push(keys.path(key), format!("{e}; the default {default} is kept"));
    }
    caps
}

/// `AutoProfilingConfig`: every refused value is reported, then the feature is off.
fn auto(sub: Sub, path: &str, p: &mut Problems) -> AutoProfiling {
    let off = AutoProfiling::off(Off::Invalid);
    let Ok(m) = sub else { return off };
    let keys = Keys::fold(&m, path, crate::auto::AUTO_KEYS, p);
    match crate::auto::read(|k| keys.get(k).cloned()) {
        Ok(a) => a,
        Err(errs) => {
            for (key, e) in errs {
                p.push(keys.path(key), format!("{e}; auto profiling is off"));
            }
            off
        }
    }
}

/// `HangDetectionConfig`: every refused value is reported, then the feature is off.
fn hang(sub: Sub, path: &str, p: &mut Problems) -> crate::HangDetection {
    let off = crate::HangDetection::off(Off::Invalid);
    let Ok(m) = sub else { return off };
    let keys = Keys::fold(&m, path, crate::hang::HANG_KEYS, p);
    match crate::hang::read(|k| keys.get(k).cloned()) {
        Ok(h) => h,
        Err(errs) => {
            for (key, e) in errs {
                p.push(keys.path(key), format!("{e}; hang detection is off"));
            }
            off
        }
    }
}

/// A sub-config that was given: its dict, or `Err` when it is broken (already reported).
type Sub = Result<Map<String, Value>, ()>;

/// `None` when absent or empty (`{}`): the feature is not configured, which is no problem.
fn sub_config(v: Option<&Value>, path: &str, p: &mut Problems) -> Option<Sub> {
    let parsed = match v? {
        Value::String(s) => literal::parse(s).map_err(|e| format!("is not a dict literal: {e}")),
        obj @ Value::Object(_) => Ok(obj.clone()),
        other => Err(format!("is {}, expected a dict literal string or a JSON object", kind(other))),
    };
    let why = match parsed {
        Ok(Value::Object(m)) if m.is_empty() => return None,
        Ok(Value::Object(m)) => return Some(Ok(m)),
        Ok(other) => format!("is {}, expected a dict", kind(&other)),
        Err(e) => e,
    };
    p.push(path, format!("{why}; this feature is off"));
    Some(Err(()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Detailed,
    Dataloader,
    Python,
    SmDataParallel,
    Native,
    Memory,
}

const SUB_KEYS: &[&str] = &[
    "StartStep",
    "NumSteps",
    "StartTimeInSecSinceEpoch",
    "DurationInSeconds",
    "Duration",
    "MetricsRegex",
    "ProfilerName",
    "cProfileTimer",
    // Declared by smdebug, never read.
    "DefaultProfiling",
];

/// A sub-config's window. `Err` means the feature is off; its problem is already reported.
fn range_of(keys: &Keys<'_>, which: Which, p: &mut Problems) -> Result<Range, ()> {
    for (key, owner) in [
        ("MetricsRegex", Which::Dataloader),
        ("ProfilerName", Which::Python),
        ("cProfileTimer", Which::Python),
    ] {
        if which != owner && keys.get(key).is_some() {
            p.push(keys.path(key), "does not apply to this feature, ignored");
        }
    }
    // Every bad key is reported (not only the first), then the feature is off.
    let mut bad = false;
    let mut off = |p: &mut Problems, key: &str, why: NumberError| {
        p.push(keys.path(key), format!("{why}; this feature is off"));
        bad = true;
    };
    // Negative values are odd but well defined (smdebug does the arithmetic): noted, kept.
    let negative = |p: &mut Problems, key: &str, what: &str| {
        p.push(keys.path(key), format!("is negative; kept as smdebug keeps it ({what})"));
    };
    let mut step = |key: &str, p: &mut Problems| -> Option<i64> {
        match py_int(keys.get(key)?) {
            Ok(n) => {
                if n < 0 {
                    negative(p, key, "the window is cut to the steps from 0 on");
                }
                Some(n)
            }
            Err(e) => {
                off(p, key, e);
                None
            }
        }
    };
    let start_step = step("StartStep", p);
    let num_steps = step("NumSteps", p);
    let mut seconds = |key: &str, p: &mut Problems| -> Option<f64> {
        match py_float(keys.get(key)?) {
            Ok(f) => {
                if f < 0.0 {
                    negative(p, key, "a time before 1970 or a negative duration never opens");
                }
                Some(f)
            }
            Err(e) => {
                off(p, key, e);
                None
            }
        }
    };
    let start_time = seconds("StartTimeInSecSinceEpoch", p);
    // The SDK writes `Duration`; smdebug reads only `DurationInSeconds`. We take both.
    let duration = match (seconds("DurationInSeconds", p), seconds("Duration", p)) {
        (Some(a), Some(b)) if a != b => {
            p.push(keys.path("Duration"), "DurationInSeconds is also given and wins; Duration ignored");
            Some(a)
        }
        (a, b) => a.or(b),
    };
    if bad {
        return Err(());
    }
    let Ok(range) = Range::from_fields(start_step, num_steps, start_time, duration) else {
        p.push(
            &keys.parent,
            "has both a step range (StartStep/NumSteps) and a time range \
             (StartTimeInSecSinceEpoch/Duration); this feature is off, as in smdebug",
        );
        return Err(());
    };
    match range {
        Range::Never if start_step == Some(0) => p.push(
            keys.path("StartStep"),
            "0 counts as not given (as in smdebug), so this window never opens; \
             add NumSteps to profile from step 0",
        ),
        Range::Never => p.push(&keys.parent, "has no step or time range: enabled but never active"),
        Range::Steps { start: Some(s), num: Some(0) } if num_steps == Some(0) => {
            p.push(
                keys.path("NumSteps"),
                format!("0 with StartStep {s}: the window is empty and never opens"),
            );
        }
        _ => {}
    }
    Ok(range)
}

fn feature(sub: Sub, path: &str, which: Which, p: &mut Problems) -> Feature {
    let Ok(m) = sub else {
        return Feature::off(Off::Invalid);
    };
    let keys = Keys::fold(&m, path, SUB_KEYS, p);
    match range_of(&keys, which, p) {
        Ok(range) => Feature::on(range),
        Err(()) => Feature::off(Off::Invalid),
    }
}

fn dataloader(sub: Sub, path: &str, p: &mut Problems) -> DataloaderFeature {
    let invalid =
        DataloaderFeature { feature: Feature::off(Off::Invalid), ..DataloaderFeature::not_configured() };
    let Ok(m) = sub else { return invalid };
    let keys = Keys::fold(&m, path, SUB_KEYS, p);
    // The range and the regex are both checked, so that every problem is listed.
    let range = range_of(&keys, Which::Dataloader, p);
    let pattern = match keys.get("MetricsRegex") {
        None => ".*".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            p.push(
                keys.path("MetricsRegex"),
                format!("is {}, expected a string; this feature is off", kind(other)),
            );
            return invalid;
        }
    };
    // Checked alone first: "x)|(?:y" would otherwise escape the anchor below.
    let build = |re: &str| RegexBuilder::new(re).case_insensitive(true).size_limit(REGEX_SIZE_LIMIT).build();
    let compiled = build(&pattern).and_then(|_| build(&format!("^(?:{pattern})")));
    match (range, compiled) {
        (Ok(range), Ok(re)) => DataloaderFeature::new(Feature::on(range), pattern, re),
        (_, Err(e)) => {
            let text = e.to_string();
            let last = text.lines().last().unwrap_or_default().trim();
            let reason = last.strip_prefix("error: ").unwrap_or(last);
            p.push(
                keys.path("MetricsRegex"),
                format!("{pattern:?} is not a valid regular expression ({reason}); this feature is off"),
            );
            invalid
        }
        (Err(()), Ok(_)) => invalid,
    }
}

fn python(sub: Sub, path: &str, p: &mut Problems) -> PythonFeature {
    let invalid = PythonFeature { feature: Feature::off(Off::Invalid), ..PythonFeature::not_configured() };
    let Ok(m) = sub else { return invalid };
    let keys = Keys::fold(&m, path, SUB_KEYS, p);
    // Every key is checked, so that every problem is listed.
    let range = range_of(&keys, Which::Python, p);
    let profiler = match keys.get("ProfilerName") {
        None => Some(PythonProfiler::CProfile),
        Some(Value::String(s)) if s.trim().eq_ignore_ascii_case("cprofile") => Some(PythonProfiler::CProfile),
        Some(Value::String(s)) if s.trim().eq_ignore_ascii_case("pyinstrument") => {
            Some(PythonProfiler::Pyinstrument)
        }
        Some(other) => {
            p.push(
                keys.path("ProfilerName"),
                format!("{other} is not cProfile or pyinstrument; this feature is off"),
            );
            None
        }
    };
    let timer = match (profiler, keys.get("cProfileTimer")) {
        (Some(PythonProfiler::Pyinstrument), _) => Ok(None),
        (_, None) => Ok(Some(CProfileTimer::TotalTime)),
        (_, Some(v)) => v.as_str().and_then(CProfileTimer::parse).map(Some).ok_or_else(|| {
            p.push(
                keys.path("cProfileTimer"),
                format!("{v} is not one of total_time, cpu_time, off_cpu_time, default; this feature is off"),
            );
        }),
    };
    match (range, profiler, timer) {
        (Ok(range), Some(profiler), Ok(timer)) => {
            PythonFeature { feature: Feature::on(range), profiler, timer }
        }
        _ => invalid,
    }
}

fn native_feature(sub: Sub, path: &str, p: &mut Problems) -> NativeFeature {
    let Ok(m) = sub else { return NativeFeature::invalid() };
    let keys = Keys::fold(&m, path, native::KEYS, p);
    // Both are checked, so that every problem is listed.
    let range = range_of(&keys, Which::Native, p);
    let hz = match keys.get("SamplingHz").map(native::sampling_hz) {
        None => Ok(native::DEFAULT_SAMPLING_HZ),
        Some(Ok(hz)) => Ok(hz),
        Some(Err(e)) => {
            p.push(keys.path("SamplingHz"), format!("{e}; this feature is off"));
            Err(())
        }
    };
    match (range, hz) {
        (Ok(range), Ok(sampling_hz)) => NativeFeature { feature: Feature::on(range), sampling_hz },
        _ => NativeFeature::invalid(),
    }
}

/// `MemoryProfilingConfig`: its window (none, without a warning, when only its own keys are
/// given: an OOM snapshot alone) and its own keys; every refused value is reported, then the
/// feature is off.
fn memory_feature(sub: Sub, path: &str, p: &mut Problems) -> MemoryFeature {
    let Ok(m) = sub else { return MemoryFeature::invalid() };
    let keys = Keys::fold(&m, path, memory::KEYS, p);
    let range = if memory::WINDOW_KEYS.iter().any(|k| keys.get(k).is_some()) {
        range_of(&keys, Which::Memory, p)
    } else {
        Ok(Range::Never)
    };
    let mut bad = false;
    let mut report = |p: &mut Problems, key: &str, e: memory::MemoryError| {
        p.push(keys.path(key), format!("{e}; this feature is off"));
        bad = true;
    };
    let mut out = MemoryFeature::not_configured();
    match keys.get("MaxEntries").map(memory::max_entries) {
        Some(Ok(n)) => out.max_entries = n,
        Some(Err(e)) => report(p, "MaxEntries", e),
        None => {}
    }
    match keys.get("Stacks").map(memory::stacks) {
        Some(Ok(s)) => out.stacks = s,
        Some(Err(e)) => report(p, "Stacks", e),
        None => {}
    }
    match keys.get("OomSnapshot").map(memory::boolean) {
        Some(Ok(b)) => out.oom_snapshot = b,
        Some(Err(e)) => report(p, "OomSnapshot", e),
        None => {}
    }
    match range {
        Ok(range) if !bad => MemoryFeature { feature: Feature::on(range), ..out },
        _ => MemoryFeature::invalid(),
    }
}

/// "unknown key 'StarStep' in DetailedProfilingConfig; did you mean 'StartStep'? (ignored)"
fn unknown_key(key: &str, parent: &str, known: &[&str]) -> String {
    let place = match parent.rsplit('.').next() {
        Some(last) if !last.is_empty() => format!(" in {last}"),
        _ => " at the top level".to_owned(),
    };
    match nearest_key(key, known) {
        Some(k) => format!("unknown key '{key}'{place}; did you mean '{k}'? (ignored)"),
        None => format!("unknown key '{key}'{place}, ignored"),
    }
}

/// The known key nearest to `key` (ignoring case), when it is near enough to be a typo:
/// at most a third of its letters edited (at least one, at most three).
fn nearest_key<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let lower = key.trim().to_ascii_lowercase();
    let limit = (lower.chars().count() / 3).clamp(1, 3);
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(&lower, &k.to_ascii_lowercase()), *k))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, k)| k)
}

// ---- scalar converters: Ok(value) or why not ------------------------------------

fn local_path(v: &Value) -> Result<String, ValueError> {
    match v {
        Value::String(s) if s.trim().is_empty() => Err(ValueError::Empty),
        Value::String(s) if s.contains('\0') => Err(ValueError::NulCharacter),
        Value::String(s) => Ok(s.clone()),
        other => Err(ValueError::NotAPath(kind(other))),
    }
}

fn interval_ms(v: &Value) -> Result<u32, ValueError> {
    let ms = py_int(v)?;
    u32::try_from(ms)
        .ok()
        .filter(|ms| INTERVAL_MS_RANGE.contains(ms))
        .ok_or_else(|| ValueError::IntervalOutOfRange(v.clone()))
}

/// `s3://bucket[/prefix]`, returned without a trailing slash; empty means no upload.
fn s3_url(v: &Value) -> Result<Option<String>, ValueError> {
    let Value::String(s) = v else {
        return Err(ValueError::NotAnS3Url(kind(v)));
    };
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    let rest = s
        .get(..5)
        .filter(|scheme| scheme.eq_ignore_ascii_case("s3://"))
        .map(|_| &s[5..])
        .ok_or_else(|| ValueError::NoS3Scheme(s.to_owned()))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    if !bucket_ok {
        return Err(ValueError::BadBucket(bucket.to_owned()));
    }
    let prefix = prefix.trim_end_matches('/');
    Ok(Some(if prefix.is_empty() { format!("s3://{bucket}") } else { format!("s3://{bucket}/{prefix}") }))
}

/// `TRAINPROF_DISABLE`: the usual spellings of yes and no.
fn env_flag(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// smdebug's `check_smmodelparallel_training`: the key that marks model parallelism.
fn model_parallel(sm_hps: &str) -> Option<&'static str> {
    let v: Value = serde_json::from_str(sm_hps).ok()?;
    let mp = v.get("mp_parameters")?.as_object()?;
    ["pipeline_parallel_degree", "partitions"].into_iter().find(|k| mp.contains_key(*k))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn s3_urls() {
        let ok = |s: &str| s3_url(&json!(s)).unwrap();
        assert_eq!(ok("s3://my-bucket/a/b/"), Some("s3://my-bucket/a/b".into()));
        assert_eq!(ok("S3://my-bucket"), Some("s3://my-bucket".into()));
        assert_eq!(ok(""), None);
        assert!(s3_url(&json!("https://my-bucket")).is_err());
        assert!(s3_url(&json!("s3://")).is_err());
        assert!(s3_url(&json!("s3://My_Bucket/x")).is_err());
        assert!(s3_url(&json!(5)).is_err());
    }

    /// The reasons' texts, as they appear in problem lines (the CLI tests compare them).
    #[test]
    fn reasons_read_as_before() {
        let text = |r: Result<Overridden, ValueError>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            text(convert_override(OverrideKey::Disable, "maybe")),
            r#"unrecognised value "maybe" (use 1 or 0)"#
        );
        assert_eq!(text(convert_override(OverrideKey::IntervalMs, "5")), r#""5" is outside 100..=60000 ms"#);
        assert_eq!(text(convert_override(OverrideKey::IntervalMs, "x")), r#""x" is not an integer"#);
        assert_eq!(text(convert_override(OverrideKey::LocalPath, " ")), "is empty");
        assert_eq!(text(convert_override(OverrideKey::LocalPath, "a\0b")), "contains a NUL character");
        assert_eq!(
            text(convert_override(OverrideKey::S3OutputPath, "http://b")),
            r#""http://b" does not start with s3://"#
        );
        assert_eq!(
            text(convert_override(OverrideKey::S3OutputPath, "s3://B")),
            r#""B" is not a valid S3 bucket name"#
        );
        assert_eq!(local_path(&json!(1)).unwrap_err().to_string(), "is a number, expected a path");
        assert_eq!(s3_url(&json!([])).unwrap_err().to_string(), "is a list, expected s3://bucket/prefix");
        assert_eq!(interval_ms(&json!(50)).unwrap_err().to_string(), "50 is outside 100..=60000 ms");
    }

    #[test]
    fn env_flags() {
        assert_eq!(env_flag("1"), Some(true));
        assert_eq!(env_flag(" TRUE "), Some(true));
        assert_eq!(env_flag("0"), Some(false));
        assert_eq!(env_flag(""), None);
        assert_eq!(env_flag("maybe"), None);
    }

    #[test]
    fn model_parallel_detection() {
        assert_eq!(model_parallel(r#"{"mp_parameters":{"partitions": 2}}"#), Some("partitions"));
        assert_eq!(
            model_parallel(r#"{"mp_parameters":{"pipeline_parallel_degree": 2}}"#),
            Some("pipeline_parallel_degree")
        );
        assert_eq!(model_parallel("{}"), None);
        assert_eq!(model_parallel("not json"), None);
        assert_eq!(model_parallel(r#"{"mp_parameters": 3}"#), None);
    }

    fn with_auto(auto: &str, top: &str) -> Config {
        let doc = format!(r#"{{{top}"ProfilingParameters": {{"AutoProfilingConfig": {auto}}}}}"#);
        crate::from_bytes(doc.as_bytes(), &Sources::new())
    }

    /// The SDK's string style, keys in any case, and the documented defaults.
    #[test]
    fn auto_profiling_config() {
        let c = with_auto(
            r#""{\"StepTimeRatio\": 3, \"warmupsteps\": 20, \"NumSteps\": 2, \"Features\": [\"detailed\", \"python\", \"native\"], \"MaxPerHour\": 4}""#,
            "",
        );
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert!(c.auto.is_enabled());
        assert_eq!(c.auto.median_of_steps, 50);
        let names: Vec<_> = c.auto.features.iter().map(|f| f.as_str()).collect();
        assert_eq!(names, ["detailed", "python", "native"]);
        let c = with_auto(r#"{"MedianOfSteps": 9}"#, "");
        assert!(c.auto.is_enabled() && c.problems.is_empty());
        assert_eq!((c.auto.median_of_steps, c.auto.step_time_ratio, c.auto.max_per_hour), (9, 3.0, 4));
        assert_eq!(with_auto(r#""{}""#, "").auto.off_reason(), Some(Off::NotConfigured));
        assert_eq!(Config::defaults().auto.off_reason(), Some(Off::NotConfigured));
        let c = with_auto(r#"{"MedianOfSteps": 9}"#, r#""DisableProfiler": true, "#);
        assert_eq!(c.auto.off_reason(), Some(Off::ProfilerDisabled));
    }

    /// A bad value turns off this feature alone, one line per bad key; an unknown key gets a
    /// "did you mean" and is ignored.
    #[test]
    fn auto_profiling_bad_values() {
        let c = with_auto(r#"{"StepTimeRatio": 0.5, "Features": ["detailed", "pythn"], "NumStep": 3}"#, "");
        assert_eq!(c.auto.off_reason(), Some(Off::Invalid));
        let lines: Vec<_> = c.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            lines,
            [
                "ProfilingParameters.AutoProfilingConfig.NumStep: unknown key 'NumStep' in AutoProfilingConfig; did you mean 'NumSteps'? (ignored)",
                "ProfilingParameters.AutoProfilingConfig.StepTimeRatio: 0.5 is not above 1; auto profiling is off",
                "ProfilingParameters.AutoProfilingConfig.Features: unknown feature \"pythn\"; did you mean \"python\"?; auto profiling is off",
            ]
        );
        let c = with_auto(r#"{"NumStep": 3}"#, "");
        assert!(c.auto.is_enabled(), "an unknown key alone is ignored");
        let c = with_auto(r#""not a dict""#, "");
        assert_eq!(c.auto.off_reason(), Some(Off::Invalid));
        assert_eq!(c.problems.len(), 1);
        assert!(c.python.feature.off_reason() == Some(Off::NotConfigured));
    }
}
