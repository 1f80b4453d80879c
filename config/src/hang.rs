//! `ProfilingParameters.HangDetectionConfig`: the hook's flight recorder (stall detection,
//! last words on a signal, a crash or an uncaught exception), a trainprof extension smdebug
//! ignores (docs/formats.md, "Hang and crash dumps"; docs/configuration.md).
//!
//! This module only reads the settings; the hook's watchdog thread acts on them.

use serde_json::Value;

use crate::feature::{Off, on_off};

/// `HangTimeoutS` when not given: 5 minutes. A train step that long is beyond any healthy
/// step of the jobs trainprof targets (seconds at most), yet shorter than NCCL's default
/// 10-minute (PyTorch: 30-minute) collective timeout, so the dump is written while the
/// ranks still hang, before the collective library kills them.
pub const DEFAULT_HANG_TIMEOUT_S: f64 = 300.0;
/// `HangFactor` when not given: a step 10 × the median is a stall once it is also past
/// `HangTimeoutS`. With long steps (minutes) the factor raises the bar above the timeout.
pub const DEFAULT_HANG_FACTOR: f64 = 10.0;
/// Accepted `HangTimeoutS` (the watchdog looks once a second; a week is the most).
pub const HANG_TIMEOUT_S_RANGE: std::ops::RangeInclusive<f64> = 0.5..=604_800.0;
/// Accepted `HangFactor`.
pub const HANG_FACTOR_RANGE: std::ops::RangeInclusive<f64> = 1.0..=1000.0;

/// The settings of hang and crash detection.
#[derive(Debug, Clone, PartialEq)]
pub struct HangDetection {
    off: Option<Off>,
    /// A train step not ended after `max(timeout_s, factor × median step)` is a stall.
    pub timeout_s: f64,
    pub factor: f64,
}

on_off!(HangDetection);

impl HangDetection {
    /// The settings when `HangDetectionConfig` is absent (the feature off).
    pub fn not_configured() -> HangDetection {
        HangDetection {
            off: Some(Off::NotConfigured),
            timeout_s: DEFAULT_HANG_TIMEOUT_S,
            factor: DEFAULT_HANG_FACTOR,
        }
    }

    pub(crate) fn off(why: Off) -> HangDetection {
        HangDetection { off: Some(why), ..HangDetection::not_configured() }
    }

    /// The stall threshold in seconds for a median step of `median_s` (none yet: the
    /// timeout alone).
    pub fn threshold_s(&self, median_s: Option<f64>) -> f64 {
        median_s.map_or(self.timeout_s, |m| self.timeout_s.max(self.factor * m))
    }
}

/// The keys of `HangDetectionConfig`. `Enabled` (default true) lets a config keep its
/// settings while switching the feature off.
pub(crate) const HANG_KEYS: &[&str] = &["HangTimeoutS", "HangFactor", "Enabled"];

/// Why one `HangDetectionConfig` value is refused (the whole feature is then off).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum HangError {
    #[error(transparent)]
    Number(#[from] crate::convert::NumberError),
    #[error("{} is outside {lo}..={hi}", crate::convert::Shown(*.0), lo = .1.start(), hi = .1.end())]
    OutOfRange(f64, std::ops::RangeInclusive<f64>),
    #[error("is {0}, expected true or false")]
    NotABool(Value),
}

/// Reads the dict (already checked for unknown keys by the caller): the settings, or the
/// list of (key, why) for every refused value.
pub(crate) fn read(
    get: impl Fn(&str) -> Option<Value>,
) -> Result<HangDetection, Vec<(&'static str, HangError)>> {
    use crate::convert::py_float;
    let mut h = HangDetection { off: None, ..HangDetection::not_configured() };
    let mut bad = Vec::new();
    let mut float_in = |key: &'static str, range: std::ops::RangeInclusive<f64>, out: &mut f64| {
        if let Some(v) = get(key) {
            match py_float(&v) {
                Ok(f) if range.contains(&f) => *out = f,
                Ok(f) => bad.push((key, HangError::OutOfRange(f, range))),
                Err(e) => bad.push((key, e.into())),
            }
        }
    };
    float_in("HangTimeoutS", HANG_TIMEOUT_S_RANGE, &mut h.timeout_s);
    float_in("HangFactor", HANG_FACTOR_RANGE, &mut h.factor);
    match get("Enabled") {
        None | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => h.off = Some(Off::NotConfigured),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => {}
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => h.off = Some(Off::NotConfigured),
        Some(other) => bad.push(("Enabled", HangError::NotABool(other))),
    }
    if bad.is_empty() { Ok(h) } else { Err(bad) }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Off, Sources, from_bytes};

    fn config(hang: Value) -> crate::Config {
        let doc = json!({"ProfilingParameters": {"LocalPath": "/tmp/x", "HangDetectionConfig": hang}});
        from_bytes(doc.to_string().as_bytes(), &Sources::default())
    }

    use serde_json::Value;

    #[test]
    fn defaults_values_and_sdk_strings() {
        let c = config(json!("{\"HangTimeoutS\": 1}"));
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert!(c.hang.is_enabled());
        assert_eq!((c.hang.timeout_s, c.hang.factor), (1.0, 10.0));
        let c = config(json!({"hangtimeouts": "600", "HangFactor": 4.5}));
        assert_eq!((c.hang.timeout_s, c.hang.factor), (600.0, 4.5));
        assert_eq!(c.hang.threshold_s(None), 600.0);
        assert_eq!(c.hang.threshold_s(Some(200.0)), 900.0);
        let c = config(json!({"Enabled": true}));
        assert_eq!((c.hang.timeout_s, c.hang.factor), (300.0, 10.0));
        assert!(c.hang.is_enabled());
    }

    #[test]
    fn absent_empty_disabled_and_switched_off() {
        let c = from_bytes(br#"{"ProfilingParameters": {"LocalPath": "/tmp/x"}}"#, &Sources::default());
        assert_eq!(c.hang.off_reason(), Some(Off::NotConfigured));
        assert_eq!(config(json!("{}")).hang.off_reason(), Some(Off::NotConfigured));
        let c = config(json!({"HangTimeoutS": 5, "Enabled": false}));
        assert_eq!(c.hang.off_reason(), Some(Off::NotConfigured));
        assert!(c.problems.is_empty());
        let doc = json!({"DisableProfiler": true, "ProfilingParameters": {"HangDetectionConfig": {"HangTimeoutS": 5}}});
        let c = from_bytes(doc.to_string().as_bytes(), &Sources::default());
        assert_eq!(c.hang.off_reason(), Some(Off::ProfilerDisabled));
    }

    #[test]
    fn every_bad_value_is_one_line_and_the_feature_is_off() {
        let c = config(json!({"HangTimeoutS": 0, "HangFactor": "x", "Enabled": 3}));
        assert_eq!(c.hang.off_reason(), Some(Off::Invalid));
        let lines: Vec<String> = c.problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "ProfilingParameters.HangDetectionConfig.HangTimeoutS: 0 is outside 0.5..=604800; hang detection is off",
                "ProfilingParameters.HangDetectionConfig.HangFactor: \"x\" is not a number; hang detection is off",
                "ProfilingParameters.HangDetectionConfig.Enabled: is 3, expected true or false; hang detection is off",
            ]
        );
        // Extreme values read as numbers, not hundreds of digits.
        let c = config(json!({"HangTimeoutS": 1e-300, "HangFactor": 1e308}));
        let lines: Vec<String> = c.problems.iter().map(|p| p.message.clone()).collect();
        assert_eq!(
            lines,
            [
                "1e-300 is outside 0.5..=604800; hang detection is off",
                "1e308 is outside 1..=1000; hang detection is off"
            ]
        );
        let c = config(json!({"HangTimeoutS": 5, "HangTimout": 3}));
        assert!(c.hang.is_enabled());
        assert!(c.problems[0].message.contains("did you mean 'HangTimeoutS'"), "{:?}", c.problems);
        let c = config(json!("not a dict"));
        assert_eq!(c.hang.off_reason(), Some(Off::Invalid));
        assert_eq!(c.problems.len(), 1);
    }
}
