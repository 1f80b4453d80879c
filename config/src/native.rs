//! `NativeProfilingConfig`: native CPU sampling of the whole trainer process (a trainprof
//! extension of `ProfilingParameters`, docs/formats.md "Native profiling").
//!
//! The window keys are the other sub-configs' (`StartStep`/`NumSteps` or
//! `StartTimeInSecSinceEpoch`/`Duration`), read by the same code; `SamplingHz` is the only
//! key of its own.

use serde_json::Value;

use crate::convert::py_int;
use crate::feature::{Feature, Off};

/// `SamplingHz` when not given.
pub const DEFAULT_SAMPLING_HZ: u32 = 99;
/// Accepted sampling rates. Above 1000 Hz the interval timer's resolution and the
/// handler's own cost dominate; 0 would mean no samples at all.
pub const SAMPLING_HZ_RANGE: std::ops::RangeInclusive<u32> = 1..=1000;

/// Native sampling: a window plus the sampling rate.
#[derive(Debug, Clone, PartialEq)]
pub struct NativeFeature {
    pub feature: Feature,
    /// Samples per second of CPU time, per thread (docs/formats.md "Native profiling").
    pub sampling_hz: u32,
}

impl NativeFeature {
    pub(crate) fn not_configured() -> NativeFeature {
        NativeFeature { feature: Feature::not_configured(), sampling_hz: DEFAULT_SAMPLING_HZ }
    }

    pub(crate) fn invalid() -> NativeFeature {
        NativeFeature { feature: Feature::off(Off::Invalid), ..NativeFeature::not_configured() }
    }
}

/// The keys a `NativeProfilingConfig` may hold (the window keys and `SamplingHz`).
pub(crate) const KEYS: &[&str] =
    &["StartStep", "NumSteps", "StartTimeInSecSinceEpoch", "DurationInSeconds", "Duration", "SamplingHz"];

/// Why `SamplingHz` is not usable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum HzError {
    #[error(transparent)]
    Number(#[from] crate::convert::NumberError),
    #[error("{0} is outside {lo}..={hi} Hz", lo = SAMPLING_HZ_RANGE.start(), hi = SAMPLING_HZ_RANGE.end())]
    OutOfRange(Value),
}

/// `SamplingHz` (an integer, or a string holding one, as the SDK writes numbers).
pub(crate) fn sampling_hz(v: &Value) -> Result<u32, HzError> {
    let n = py_int(v)?;
    u32::try_from(n)
        .ok()
        .filter(|n| SAMPLING_HZ_RANGE.contains(n))
        .ok_or_else(|| HzError::OutOfRange(v.clone()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{Sources, Step, from_bytes};

    fn config(native: &str) -> crate::Config {
        let doc = json!({"ProfilingParameters": {"LocalPath": "/tmp/x", "NativeProfilingConfig": native}});
        from_bytes(doc.to_string().as_bytes(), &Sources::default())
    }

    #[test]
    fn sdk_string_with_steps_and_rate() {
        let mut c = config(r#"{"StartStep": 5, "NumSteps": 2, "SamplingHz": 199}"#);
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert_eq!(c.native.sampling_hz, 199);
        let active: Vec<u64> = (0..10).filter(|&s| c.native.feature.is_active(Step::At(s), 0.0)).collect();
        assert_eq!(active, [5, 6]);
    }

    #[test]
    fn default_rate_and_time_window() {
        let mut c = config(r#"{"StartTimeInSecSinceEpoch": 100, "Duration": 5}"#);
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert_eq!(c.native.sampling_hz, DEFAULT_SAMPLING_HZ);
        assert!(!c.native.feature.is_active(Step::Any, 99.0));
        assert!(c.native.feature.is_active(Step::Any, 104.0));
        assert!(!c.native.feature.is_active(Step::Any, 105.0));
    }

    #[test]
    fn rate_out_of_range_turns_the_feature_off_with_one_line() {
        for bad in ["0", "1001", "-3", "\"fast\"", "\"2.5\""] {
            let c = config(&format!(r#"{{"StartStep": 5, "SamplingHz": {bad}}}"#));
            assert!(!c.native.feature.is_enabled(), "{bad}");
            assert_eq!(c.problems.len(), 1, "{bad}: {:?}", c.problems);
            assert_eq!(c.problems[0].key, "ProfilingParameters.NativeProfilingConfig.SamplingHz");
        }
        let c = config(r#"{"StartStep": 5, "SamplingHz": 1001}"#);
        assert_eq!(c.problems[0].message, "1001 is outside 1..=1000 Hz; this feature is off");
        let c = config(r#"{"StartStep": 5, "SamplingHz": "250"}"#);
        assert_eq!(c.native.sampling_hz, 250);
    }

    #[test]
    fn window_problems_are_the_other_features() {
        let c = config(r#"{"StartStep": 5, "StartTimeInSecSinceEpoch": 10}"#);
        assert!(!c.native.feature.is_enabled());
        assert!(c.problems[0].message.contains("both a step range"), "{:?}", c.problems);
        let c = config(r#"{"StartStep": 5, "MetricsRegex": ".*"}"#);
        assert!(c.native.feature.is_enabled());
        assert!(c.problems[0].message.contains("unknown key 'MetricsRegex'"), "{:?}", c.problems);
    }

    #[test]
    fn absent_and_disabled() {
        let c = from_bytes(br#"{"ProfilingParameters": {"LocalPath": "/tmp/x"}}"#, &Sources::default());
        assert_eq!(c.native.feature.off_reason(), Some(Off::NotConfigured));
        let doc = json!({"DisableProfiler": true, "ProfilingParameters": {"NativeProfilingConfig": "{\"StartStep\": 5}"}});
        let c = from_bytes(doc.to_string().as_bytes(), &Sources::default());
        assert_eq!(c.native.feature.off_reason(), Some(Off::ProfilerDisabled));
    }
}
