//! The four framework features and what each adds to its window.

use regex::Regex;

use crate::window::{Range, Step, Window};

/// Why a feature is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Off {
    /// Its sub-config is absent, null or empty (`{}`): smdebug has no per-feature defaults.
    NotConfigured,
    /// Its sub-config is broken; [`crate::Config::problems`] says how.
    Invalid,
    /// Detailed profiling under model-parallel training (`SM_HPS`), as smdebug does.
    ModelParallel,
    /// The whole profiler is off.
    ProfilerDisabled,
}

/// The on/off shape every feature's settings share (a field `off: Option<Off>`): `is_enabled`,
/// `off_reason` and `turn_off`, written once. A feature that is enabled may still never be
/// active (see [`Range::Never`]).
macro_rules! on_off {
    ($t:ty) => {
        impl $t {
            /// Configured without error.
            pub fn is_enabled(&self) -> bool {
                self.off.is_none()
            }

            /// `None` when enabled.
            pub fn off_reason(&self) -> Option<$crate::feature::Off> {
                self.off
            }

            /// Turns it off for `why`, unless it is off already.
            pub(crate) fn turn_off(&mut self, why: $crate::feature::Off) {
                if self.off.is_none() {
                    self.off = Some(why);
                }
            }
        }
    };
}
pub(crate) use on_off;

on_off!(Feature);

/// A feature's state and window.
#[derive(Debug, Clone, PartialEq)]
pub struct Feature {
    off: Option<Off>,
    window: Window,
}

impl Feature {
    pub(crate) fn not_configured() -> Feature {
        Feature::off(Off::NotConfigured)
    }

    pub(crate) fn off(why: Off) -> Feature {
        Feature { off: Some(why), window: Window::new(Range::Never) }
    }

    pub(crate) fn on(range: Range) -> Feature {
        Feature { off: None, window: Window::new(range) }
    }

    pub fn window(&self) -> &Window {
        &self.window
    }

    /// Enabled and inside its window as resolved so far ([`Window::is_open_at`]).
    pub fn is_open_at(&self, step: u64, now_s: f64) -> bool {
        self.is_enabled() && self.window.is_open_at(step, now_s)
    }

    /// Can a window opened by a slow step (`AutoProfilingConfig`) apply? Yes when enabled
    /// or simply not configured; no when its config is broken, the profiler is off, or the
    /// feature is off for another reason (model parallelism).
    pub fn may_auto_open(&self) -> bool {
        matches!(self.off, None | Some(Off::NotConfigured))
    }

    /// Enabled and inside its window at `step` / `now_s` (seconds since the epoch).
    pub fn is_active(&mut self, step: Step, now_s: f64) -> bool {
        self.is_enabled() && self.window.is_active(step, now_s)
    }
}

/// Dataloader profiling: a window plus the names it applies to.
#[derive(Debug, Clone)]
pub struct DataloaderFeature {
    pub feature: Feature,
    /// `MetricsRegex` as written (default `.*`).
    pub metrics_regex: String,
    /// Compiled case-insensitive and anchored at the start, like Python's `re.match` on
    /// smdebug's lowercased strings. `None` when the feature is off.
    pub(crate) matcher: Option<Regex>,
}

impl DataloaderFeature {
    pub(crate) fn not_configured() -> DataloaderFeature {
        DataloaderFeature { feature: Feature::not_configured(), metrics_regex: ".*".into(), matcher: None }
    }

    pub(crate) fn new(feature: Feature, metrics_regex: String, matcher: Regex) -> DataloaderFeature {
        DataloaderFeature { feature, metrics_regex, matcher: Some(matcher) }
    }

    /// Does `MetricsRegex` match the start of `name` (ignoring case)?
    pub fn matches_name(&self, name: &str) -> bool {
        self.matcher.as_ref().is_some_and(|m| m.is_match(name))
    }

    /// Does a window opened by a slow step (`AutoProfilingConfig`) apply to `name`? The
    /// configured `MetricsRegex` decides; without a config, every name (`.*`).
    pub fn auto_matches(&self, name: &str) -> bool {
        self.matcher.as_ref().is_none_or(|m| m.is_match(name))
    }

    /// Is the window open for the metrics called `name`? A name that does not match
    /// resolves nothing (as in smdebug, the name is tested first).
    pub fn is_active_for(&mut self, name: &str, step: Step, now_s: f64) -> bool {
        self.feature.is_enabled() && self.matches_name(name) && self.feature.is_active(step, now_s)
    }
}

/// `ProfilerName`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonProfiler {
    CProfile,
    Pyinstrument,
}

impl PythonProfiler {
    pub fn as_str(self) -> &'static str {
        match self {
            PythonProfiler::CProfile => "cprofile",
            PythonProfiler::Pyinstrument => "pyinstrument",
        }
    }
}

/// `cProfileTimer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CProfileTimer {
    /// Wall clock.
    TotalTime,
    /// User + system CPU time.
    CpuTime,
    /// Wall clock minus CPU time.
    OffCpuTime,
    /// Chosen per window from its start step: 9 → total, 10 → cpu, 11 → off-cpu,
    /// anything else → total (smdebug's `cProfileDefaultPythonProfiler`, steps hard-wired).
    Default,
}

impl CProfileTimer {
    pub fn as_str(self) -> &'static str {
        match self {
            CProfileTimer::TotalTime => "total_time",
            CProfileTimer::CpuTime => "cpu_time",
            CProfileTimer::OffCpuTime => "off_cpu_time",
            CProfileTimer::Default => "default",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<CProfileTimer> {
        [CProfileTimer::TotalTime, CProfileTimer::CpuTime, CProfileTimer::OffCpuTime, CProfileTimer::Default]
            .into_iter()
            .find(|t| t.as_str().eq_ignore_ascii_case(s.trim()))
    }

    /// The timer for a window that starts at `start`; never [`CProfileTimer::Default`].
    pub fn for_window_start(self, start: Step) -> CProfileTimer {
        match (self, start) {
            (CProfileTimer::Default, Step::At(10)) => CProfileTimer::CpuTime,
            (CProfileTimer::Default, Step::At(11)) => CProfileTimer::OffCpuTime,
            (CProfileTimer::Default, _) => CProfileTimer::TotalTime,
            (t, _) => t,
        }
    }
}

/// Python profiling: a window plus the profiler and its timer.
#[derive(Debug, Clone, PartialEq)]
pub struct PythonFeature {
    pub feature: Feature,
    pub profiler: PythonProfiler,
    /// `None` for pyinstrument, which has no timer choice.
    pub timer: Option<CProfileTimer>,
}

impl PythonFeature {
    pub(crate) fn not_configured() -> PythonFeature {
        PythonFeature {
            feature: Feature::not_configured(),
            profiler: PythonProfiler::CProfile,
            timer: Some(CProfileTimer::TotalTime),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_timer_cycles_on_steps_9_10_11() {
        let t = CProfileTimer::Default;
        assert_eq!(t.for_window_start(Step::At(9)), CProfileTimer::TotalTime);
        assert_eq!(t.for_window_start(Step::At(10)), CProfileTimer::CpuTime);
        assert_eq!(t.for_window_start(Step::At(11)), CProfileTimer::OffCpuTime);
        assert_eq!(t.for_window_start(Step::At(12)), CProfileTimer::TotalTime);
        assert_eq!(t.for_window_start(Step::Any), CProfileTimer::TotalTime);
        assert_eq!(CProfileTimer::CpuTime.for_window_start(Step::At(9)), CProfileTimer::CpuTime);
    }

    #[test]
    fn timer_names_any_case() {
        assert_eq!(CProfileTimer::parse("CPU_TIME"), Some(CProfileTimer::CpuTime));
        assert_eq!(CProfileTimer::parse("Default"), Some(CProfileTimer::Default));
        assert_eq!(CProfileTimer::parse("wall"), None);
    }
}
