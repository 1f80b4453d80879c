//! `ProfilingParameters.WindowCapsConfig`: how much one window may capture before it stops
//! early, in events, bytes and samples, a trainprof extension smdebug ignores
//! (docs/formats.md, "Window caps").
//!
//! A window is otherwise bounded by its steps only, and a step can be long: a torch.profiler
//! window with stacks over a fast job's steps grew the trainer by tens of GiB. Each cap has a
//! default that a normal window never reaches; a value that does not convert, or is out of
//! range, keeps that cap's default with one problem line (the other caps are unaffected).
//! Unlike the windows' own sub-configs, nothing here turns a feature off.
//!
//! This module only reads the settings; the hook hands them to the adapters, which count
//! and stop (docs/formats.md, "Window caps").

use serde_json::Value;

/// `DetailedMaxEvents` when not given: a detailed window's op, kernel and module events.
/// 2 million events are about 400 MB of timeline; the H200 ResNet-50 fixture's two-step
/// windows hold about 5,000 each.
pub const DEFAULT_DETAILED_MAX_EVENTS: u64 = 2_000_000;
/// `DetailedMaxMemoryMiB` when not given: the trainer's resident memory may grow by this
/// much while a detailed window runs (the framework profiler's buffers).
pub const DEFAULT_DETAILED_MAX_MEMORY_MIB: u64 = 512;
/// `DataloaderMaxEvents` when not given: one event a batch, so a window of a few steps holds
/// a handful.
pub const DEFAULT_DATALOADER_MAX_EVENTS: u64 = 100_000;
/// `PythonMaxSamples` when not given: pyinstrument's samples in one Python window (it keeps
/// every sample: 1 ms apart, a million is 17 minutes of one thread).
pub const DEFAULT_PYTHON_MAX_SAMPLES: u64 = 1_000_000;
/// `NativeMaxSamples` when not given: the samples one native window may take (at 100 Hz, a
/// million is 2.8 hours of one busy thread). What grows with them is the file of stacks
/// evicted from pprof's fixed-size table, read back when the window's report is built.
pub const DEFAULT_NATIVE_MAX_SAMPLES: u64 = 1_000_000;

/// Accepted counts (events, samples).
pub const COUNT_RANGE: std::ops::RangeInclusive<i64> = 1..=1_000_000_000_000;
/// Accepted `DetailedMaxMemoryMiB` (1 MiB to 1 TiB).
pub const MEMORY_MIB_RANGE: std::ops::RangeInclusive<i64> = 1..=1_048_576;

/// The caps of the windows (every window, configured, anomaly-triggered or requested).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowCaps {
    /// Events a detailed window writes (op, kernel, `Forward` events).
    pub detailed_max_events: u64,
    /// Bytes the trainer's resident memory may grow by during a detailed window.
    pub detailed_max_bytes: u64,
    /// Events a dataloader window writes.
    pub dataloader_max_events: u64,
    /// pyinstrument samples in one Python window (cProfile keeps one entry per distinct
    /// function, bounded by the code, and has no cap).
    pub python_max_samples: u64,
    /// Samples one native window may take, counted by the library's sampler thread.
    pub native_max_samples: u64,
}

impl Default for WindowCaps {
    fn default() -> WindowCaps {
        WindowCaps {
            detailed_max_events: DEFAULT_DETAILED_MAX_EVENTS,
            detailed_max_bytes: DEFAULT_DETAILED_MAX_MEMORY_MIB << 20,
            dataloader_max_events: DEFAULT_DATALOADER_MAX_EVENTS,
            python_max_samples: DEFAULT_PYTHON_MAX_SAMPLES,
            native_max_samples: DEFAULT_NATIVE_MAX_SAMPLES,
        }
    }
}

/// The keys of `WindowCapsConfig`.
pub(crate) const CAPS_KEYS: &[&str] = &[
    "DetailedMaxEvents",
    "DetailedMaxMemoryMiB",
    "DataloaderMaxEvents",
    "PythonMaxSamples",
    "NativeMaxSamples",
];

/// Why one `WindowCapsConfig` value is refused (that cap keeps its default).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum CapError {
    #[error(transparent)]
    Number(#[from] crate::convert::NumberError),
    #[error("{0} is outside {lo}..={hi}", lo = .1.start(), hi = .1.end())]
    OutOfRange(i64, std::ops::RangeInclusive<i64>),
}

/// Reads the dict (already checked for unknown keys by the caller): the caps, every refused
/// value at its default, and the list of (key, why, the default kept).
pub(crate) fn read(get: impl Fn(&str) -> Option<Value>) -> (WindowCaps, Vec<(&'static str, CapError, u64)>) {
    let mut c = WindowCaps::default();
    let mut bad = Vec::new();
    let mut int_in = |key: &'static str, range: std::ops::RangeInclusive<i64>, out: &mut u64| {
        let Some(v) = get(key) else { return };
        match crate::convert::py_int(&v) {
            Ok(n) if range.contains(&n) => *out = n.unsigned_abs(),
            Ok(n) => bad.push((key, CapError::OutOfRange(n, range), *out)),
            Err(e) => bad.push((key, e.into(), *out)),
        }
    };
    let mut mib = DEFAULT_DETAILED_MAX_MEMORY_MIB;
    int_in("DetailedMaxEvents", COUNT_RANGE, &mut c.detailed_max_events);
    int_in("DetailedMaxMemoryMiB", MEMORY_MIB_RANGE, &mut mib);
    int_in("DataloaderMaxEvents", COUNT_RANGE, &mut c.dataloader_max_events);
    int_in("PythonMaxSamples", COUNT_RANGE, &mut c.python_max_samples);
    int_in("NativeMaxSamples", COUNT_RANGE, &mut c.native_max_samples);
    c.detailed_max_bytes = mib << 20;
    (c, bad)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Sources, from_bytes};

    fn config(caps: serde_json::Value) -> crate::Config {
        let doc = json!({"ProfilingParameters": {"LocalPath": "/tmp/x", "WindowCapsConfig": caps}});
        from_bytes(doc.to_string().as_bytes(), &Sources::default())
    }

    #[test]
    fn defaults_values_and_sdk_strings() {
        let d = from_bytes(br#"{"ProfilingParameters": {"LocalPath": "/tmp/x"}}"#, &Sources::default());
        assert_eq!(
            (d.caps.detailed_max_events, d.caps.detailed_max_bytes, d.caps.dataloader_max_events),
            (2_000_000, 512 << 20, 100_000)
        );
        assert_eq!(d.caps.python_max_samples, 1_000_000);
        let c = config(json!(
            "{\"DetailedMaxEvents\": 50, \"detailedmaxmemorymib\": \"64\", 'DataloaderMaxEvents': 3}"
        ));
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        assert_eq!(
            (c.caps.detailed_max_events, c.caps.detailed_max_bytes, c.caps.dataloader_max_events),
            (50, 64 << 20, 3)
        );
        assert_eq!(c.caps.python_max_samples, 1_000_000);
        assert_eq!(c.caps.native_max_samples, 1_000_000);
        let c = config(json!({"PythonMaxSamples": 7, "NativeMaxSamples": "9"}));
        assert_eq!((c.caps.python_max_samples, c.caps.native_max_samples), (7, 9));
    }

    #[test]
    fn a_bad_value_keeps_its_default_with_one_line() {
        let c =
            config(json!({"DetailedMaxEvents": 0, "DetailedMaxMemoryMiB": "lots", "DataloaderMaxEvents": 9,
            "PythonMaxSample": 3}));
        let lines: Vec<String> = c.problems.iter().map(ToString::to_string).collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(
            lines[0],
            "ProfilingParameters.WindowCapsConfig.PythonMaxSample: unknown key 'PythonMaxSample' in WindowCapsConfig; did you mean 'PythonMaxSamples'? (ignored)",
        );
        assert_eq!(
            lines[1..],
            [
                "ProfilingParameters.WindowCapsConfig.DetailedMaxEvents: 0 is outside 1..=1000000000000; the default 2000000 is kept",
                "ProfilingParameters.WindowCapsConfig.DetailedMaxMemoryMiB: \"lots\" is not an integer; the default 512 is kept",
            ]
        );
        assert_eq!((c.caps.detailed_max_events, c.caps.detailed_max_bytes), (2_000_000, 512 << 20));
        assert_eq!(c.caps.dataloader_max_events, 9);
        let c = config(json!("[1, 2]"));
        assert_eq!(c.caps, crate::WindowCaps::default());
        assert_eq!(c.problems.len(), 1, "{:?}", c.problems);
    }
}
