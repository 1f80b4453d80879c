//! `ProfilingParameters.AutoProfilingConfig`: windows opened by a slow train step, a
//! trainprof extension smdebug ignores (docs/formats.md, "Anomaly-triggered windows").
//!
//! This module only reads the settings; the hook runs the detector (the rolling median,
//! the trigger, the rate limit) on the trainer's thread.

use serde_json::Value;

use crate::feature::{Off, on_off};

/// `StepTimeRatio` when not given: a step three times the median triggers.
pub const DEFAULT_STEP_TIME_RATIO: f64 = 3.0;
/// `WarmupSteps` when not given: the first 20 train steps never trigger.
pub const DEFAULT_WARMUP_STEPS: u64 = 20;
/// `NumSteps` when not given: each trigger opens a window of 2 steps.
pub const DEFAULT_NUM_STEPS: u64 = 2;
/// `MedianOfSteps` when not given: the median of the last 50 train steps outside windows.
pub const DEFAULT_MEDIAN_OF_STEPS: usize = 50;
/// `MaxPerHour` when not given.
pub const DEFAULT_MAX_PER_HOUR: u32 = 4;
/// Accepted `MedianOfSteps` (the detector copies that many durations at every step).
pub const MEDIAN_OF_STEPS_RANGE: std::ops::RangeInclusive<i64> = 1..=1000;
/// Accepted `NumSteps`.
pub const NUM_STEPS_RANGE: std::ops::RangeInclusive<i64> = 1..=10_000;
/// Accepted `MaxPerHour` (the detector keeps that many trigger times).
pub const MAX_PER_HOUR_RANGE: std::ops::RangeInclusive<i64> = 1..=3600;

/// A feature a trigger can open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoFeature {
    Detailed,
    Dataloader,
    Python,
    /// Native CPU sampling: accepted and carried; opened by whatever runs native sampling.
    Native,
    /// PyTorch's caching-allocator history, dumped as a memory snapshot at the window's end
    /// (docs/formats.md, "Memory windows"); recorded by the PyTorch adapter only.
    Memory,
}

impl AutoFeature {
    pub const ALL: [AutoFeature; 5] = [
        AutoFeature::Detailed,
        AutoFeature::Dataloader,
        AutoFeature::Python,
        AutoFeature::Native,
        AutoFeature::Memory,
    ];

    /// The name in `Features` (and in the trigger event's `features`).
    pub fn as_str(self) -> &'static str {
        match self {
            AutoFeature::Detailed => "detailed",
            AutoFeature::Dataloader => "dataloader",
            AutoFeature::Python => "python",
            AutoFeature::Native => "native",
            AutoFeature::Memory => "memory",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    fn parse(s: &str) -> Option<AutoFeature> {
        AutoFeature::ALL.into_iter().find(|f| f.as_str().eq_ignore_ascii_case(s.trim()))
    }
}

/// A set of [`AutoFeature`]s (a bit each, so it is `Copy` and fits in a queued event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AutoFeatures(u8);

impl AutoFeatures {
    pub fn contains(self, f: AutoFeature) -> bool {
        self.0 & f.bit() != 0
    }

    pub fn insert(&mut self, f: AutoFeature) {
        self.0 |= f.bit();
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The bits, for a fixed-size event; [`AutoFeatures::from_bits`] reads them back.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Unknown bits are dropped.
    pub fn from_bits(bits: u8) -> AutoFeatures {
        AutoFeatures(bits & AutoFeature::ALL.iter().fold(0, |a, f| a | f.bit()))
    }

    /// In the order of [`AutoFeature::ALL`].
    pub fn iter(self) -> impl Iterator<Item = AutoFeature> {
        AutoFeature::ALL.into_iter().filter(move |f| self.contains(*f))
    }
}

impl FromIterator<AutoFeature> for AutoFeatures {
    fn from_iter<I: IntoIterator<Item = AutoFeature>>(iter: I) -> AutoFeatures {
        let mut s = AutoFeatures::default();
        for f in iter {
            s.insert(f);
        }
        s
    }
}

/// The settings of anomaly-triggered windows.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoProfiling {
    off: Option<Off>,
    /// A train step longer than this × the median triggers (> 1).
    pub step_time_ratio: f64,
    /// Train steps (counted from the first) that never trigger.
    pub warmup_steps: u64,
    /// Steps each trigger opens, from the step after the slow one.
    pub num_steps: u64,
    /// How many of the latest train steps outside windows the median is taken over.
    pub median_of_steps: usize,
    /// Triggers allowed in any rolling hour.
    pub max_per_hour: u32,
    pub features: AutoFeatures,
}

on_off!(AutoProfiling);

impl AutoProfiling {
    pub(crate) fn not_configured() -> AutoProfiling {
        AutoProfiling {
            off: Some(Off::NotConfigured),
            step_time_ratio: DEFAULT_STEP_TIME_RATIO,
            warmup_steps: DEFAULT_WARMUP_STEPS,
            num_steps: DEFAULT_NUM_STEPS,
            median_of_steps: DEFAULT_MEDIAN_OF_STEPS,
            max_per_hour: DEFAULT_MAX_PER_HOUR,
            features: [AutoFeature::Detailed, AutoFeature::Python].into_iter().collect(),
        }
    }

    pub(crate) fn off(why: Off) -> AutoProfiling {
        AutoProfiling { off: Some(why), ..AutoProfiling::not_configured() }
    }
}

/// The keys of `AutoProfilingConfig`.
pub(crate) const AUTO_KEYS: &[&str] =
    &["StepTimeRatio", "WarmupSteps", "NumSteps", "MedianOfSteps", "MaxPerHour", "Features"];

/// Why one `AutoProfilingConfig` value is refused (the whole feature is then off).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum AutoError {
    #[error(transparent)]
    Number(#[from] crate::convert::NumberError),
    #[error("{} is not above 1", crate::convert::Shown(*.0))]
    RatioNotAboveOne(f64),
    #[error("{0} is outside {lo}..={hi}", lo = .1.start(), hi = .1.end())]
    OutOfRange(i64, std::ops::RangeInclusive<i64>),
    #[error("{0} is negative")]
    Negative(i64),
    #[error("is {0}, expected a list of feature names")]
    NotAList(&'static str),
    #[error("{0} is not a feature name (detailed, dataloader, python, native, memory)")]
    NotAName(Value),
    #[error("unknown feature {0:?}{hint}", hint = did_you_mean(.0))]
    UnknownFeature(String),
    #[error("is empty: no feature to open")]
    NoFeature,
}

fn did_you_mean(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    AutoFeature::ALL
        .iter()
        .map(|f| (strsim::damerau_levenshtein(&lower, f.as_str()), f.as_str()))
        .filter(|&(d, _)| d <= 2)
        .min_by_key(|&(d, _)| d)
        .map_or_else(
            || " (detailed, dataloader, python, native, memory)".to_owned(),
            |(_, n)| format!("; did you mean {n:?}?"),
        )
}

/// Reads the dict (already checked for unknown keys by the caller): the settings, or the
/// list of (key, why) for every refused value.
pub(crate) fn read(
    get: impl Fn(&str) -> Option<Value>,
) -> Result<AutoProfiling, Vec<(&'static str, AutoError)>> {
    use crate::convert::{py_float, py_int};
    let mut a = AutoProfiling { off: None, ..AutoProfiling::not_configured() };
    let mut bad = Vec::new();
    let int_in = |key: &'static str, range: std::ops::RangeInclusive<i64>, bad: &mut Vec<_>| -> Option<i64> {
        let v = get(key)?;
        match py_int(&v) {
            Ok(n) if range.contains(&n) => Some(n),
            Ok(n) => {
                bad.push((key, AutoError::OutOfRange(n, range)));
                None
            }
            Err(e) => {
                bad.push((key, e.into()));
                None
            }
        }
    };
    if let Some(v) = get("StepTimeRatio") {
        match py_float(&v) {
            Ok(r) if r > 1.0 => a.step_time_ratio = r,
            Ok(r) => bad.push(("StepTimeRatio", AutoError::RatioNotAboveOne(r))),
            Err(e) => bad.push(("StepTimeRatio", e.into())),
        }
    }
    if let Some(v) = get("WarmupSteps") {
        match py_int(&v) {
            Ok(n) if n >= 0 => a.warmup_steps = n.unsigned_abs(),
            Ok(n) => bad.push(("WarmupSteps", AutoError::Negative(n))),
            Err(e) => bad.push(("WarmupSteps", e.into())),
        }
    }
    if let Some(n) = int_in("NumSteps", NUM_STEPS_RANGE, &mut bad) {
        a.num_steps = n.unsigned_abs();
    }
    if let Some(n) = int_in("MedianOfSteps", MEDIAN_OF_STEPS_RANGE, &mut bad) {
        a.median_of_steps = usize::try_from(n).unwrap_or(DEFAULT_MEDIAN_OF_STEPS);
    }
    if let Some(n) = int_in("MaxPerHour", MAX_PER_HOUR_RANGE, &mut bad) {
        a.max_per_hour = u32::try_from(n).unwrap_or(DEFAULT_MAX_PER_HOUR);
    }
    if let Some(v) = get("Features") {
        match features(&v) {
            Ok(f) => a.features = f,
            Err(errs) => bad.extend(errs.into_iter().map(|e| ("Features", e))),
        }
    }
    if bad.is_empty() { Ok(a) } else { Err(bad) }
}

/// `Features`: a list of names (any case), or one name alone.
fn features(v: &Value) -> Result<AutoFeatures, Vec<AutoError>> {
    let items: &[Value] = match v {
        Value::Array(items) => items,
        Value::String(_) => std::slice::from_ref(v),
        other => return Err(vec![AutoError::NotAList(crate::convert::kind(other))]),
    };
    let mut set = AutoFeatures::default();
    let mut errs = Vec::new();
    for item in items {
        match item {
            Value::String(s) => match AutoFeature::parse(s) {
                Some(f) => set.insert(f),
                None => errs.push(AutoError::UnknownFeature(s.clone())),
            },
            other => errs.push(AutoError::NotAName(other.clone())),
        }
    }
    if errs.is_empty() && set.is_empty() {
        errs.push(AutoError::NoFeature);
    }
    if errs.is_empty() { Ok(set) } else { Err(errs) }
}

/// The dict's values by canonical key (for [`read`] in tests).
#[cfg(test)]
fn from_map(m: &serde_json::Map<String, Value>) -> Result<AutoProfiling, Vec<(&'static str, AutoError)>> {
    read(|k| m.iter().find(|(key, v)| key.eq_ignore_ascii_case(k) && !v.is_null()).map(|(_, v)| v.clone()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read_json(v: Value) -> Result<AutoProfiling, Vec<(&'static str, String)>> {
        from_map(v.as_object().unwrap())
            .map_err(|errs| errs.into_iter().map(|(k, e)| (k, e.to_string())).collect())
    }

    #[test]
    fn defaults_and_values() {
        let a = read_json(json!({})).unwrap();
        assert!(a.is_enabled());
        assert_eq!(
            (a.step_time_ratio, a.warmup_steps, a.num_steps, a.median_of_steps, a.max_per_hour),
            (3.0, 20, 2, 50, 4)
        );
        assert_eq!(a.features.iter().collect::<Vec<_>>(), [AutoFeature::Detailed, AutoFeature::Python]);
        let a =
            read_json(json!({"StepTimeRatio": "2.5", "WarmupSteps": 0, "NumSteps": 3, "MedianOfSteps": 9,
            "MaxPerHour": 1, "Features": ["Native", "dataloader", "MEMORY"]}))
            .unwrap();
        assert_eq!(
            (a.step_time_ratio, a.warmup_steps, a.num_steps, a.median_of_steps, a.max_per_hour),
            (2.5, 0, 3, 9, 1)
        );
        assert_eq!(
            a.features.iter().collect::<Vec<_>>(),
            [AutoFeature::Dataloader, AutoFeature::Native, AutoFeature::Memory]
        );
        assert_eq!(AutoFeatures::from_bits(a.features.bits()), a.features);
        assert_eq!(
            read_json(json!({"Features": "python"})).unwrap().features.bits(),
            AutoFeature::Python.bit()
        );
    }

    #[test]
    fn every_bad_value_is_listed() {
        let errs =
            read_json(json!({"StepTimeRatio": 1, "WarmupSteps": -1, "NumSteps": 0, "MedianOfSteps": 5000,
            "MaxPerHour": "x", "Features": ["pyton", 3, "detailed"]}))
            .unwrap_err();
        assert_eq!(
            errs,
            [
                ("StepTimeRatio", "1 is not above 1".to_owned()),
                ("WarmupSteps", "-1 is negative".to_owned()),
                ("NumSteps", "0 is outside 1..=10000".to_owned()),
                ("MedianOfSteps", "5000 is outside 1..=1000".to_owned()),
                ("MaxPerHour", "\"x\" is not an integer".to_owned()),
                ("Features", "unknown feature \"pyton\"; did you mean \"python\"?".to_owned()),
                (
                    "Features",
                    "3 is not a feature name (detailed, dataloader, python, native, memory)".to_owned()
                ),
            ]
        );
        assert_eq!(
            read_json(json!({"Features": []})).unwrap_err(),
            [("Features", "is empty: no feature to open".into())]
        );
        assert_eq!(
            read_json(json!({"Features": {"a": 1}})).unwrap_err(),
            [("Features", "is an object, expected a list of feature names".into())]
        );
        assert_eq!(
            read_json(json!({"Features": ["gpu"]})).unwrap_err(),
            [("Features", "unknown feature \"gpu\" (detailed, dataloader, python, native, memory)".into())]
        );
    }
}
