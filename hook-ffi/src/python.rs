//! Python-profiling windows (docs/formats.md, "Directory pattern", "Window sequence"): which window ends and which starts at each
//! boundary, and the directory each window's stats go to. The profiling itself (cProfile,
//! pyinstrument) runs in the Python package, which asks this module at every boundary.
//!
//! The sequence is smdebug's: a pre-step-zero window from start-up to the first boundary;
//! at each boundary the running window ends there, and a new one starts if the current
//! step is inside the python window; at close the running window ends as
//! `posthookclose-*-end` and a post-close window starts as `prestepzero-*-end`, which ends
//! at process exit. PyTorch cuts windows at step start and forward-pass end, TensorFlow at
//! step start and step end. PyTorch tests and names them by the global step (a window
//! `eval-10-stepstart` is the 11th step of the run, the first eval step after ten train
//! steps), TensorFlow by the mode's own step.

use trainprof_config::{CProfileTimer, PythonFeature, PythonProfiler, Step};
use trainprof_output::protocol::python_window as pw;

pub use crate::types::TrainprofBoundary;

impl TrainprofBoundary {
    pub fn from_i32(v: i32) -> Option<TrainprofBoundary> {
        use TrainprofBoundary::*;
        [Start, StepStart, ForwardPassEnd, StepEnd, Close, Exit].into_iter().find(|b| *b as i32 == v)
    }

    fn phase(self) -> &'static str {
        match self {
            TrainprofBoundary::Start => pw::PHASE_START,
            TrainprofBoundary::StepStart => pw::PHASE_STEP_START,
            TrainprofBoundary::ForwardPassEnd => pw::PHASE_FORWARD_PASS_END,
            TrainprofBoundary::StepEnd => pw::PHASE_STEP_END,
            TrainprofBoundary::Close | TrainprofBoundary::Exit => pw::PHASE_END,
        }
    }
}

/// One end of a window: mode, step (`None` = `*`), phase, time (µs since the epoch).
#[derive(Debug, Clone, PartialEq)]
struct Mark {
    mode: &'static str,
    step: Option<u64>,
    phase: &'static str,
    time_us: f64,
}

impl Mark {
    fn write(&self, out: &mut String) {
        use std::fmt::Write as _;
        let step = self.step.map_or_else(|| "*".to_owned(), |s| s.to_string());
        let _ = write!(out, "{}-{}-{}-{}", self.mode, step, self.phase, py_float(self.time_us));
    }
}

/// What a boundary did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcome {
    /// A window ended: its directory name (`<start>_<end>`) and profiler.
    pub ended: Option<(String, PythonProfiler)>,
    /// A window started: its profiler and, for cProfile, its timer (never `Default`).
    pub started: Option<(PythonProfiler, Option<CProfileTimer>)>,
}

/// The running window, if any.
#[derive(Debug, Default)]
pub struct Windows {
    running: Option<(Mark, PythonProfiler)>,
    /// The Python window stopped at its cap (docs/formats.md, "Window caps"): step
    /// boundaries inside it start no window. The hook sets and clears it.
    pub capped: bool,
}

/// Where the trainer is when a boundary happens.
#[derive(Debug, Clone, Copy)]
pub struct Position {
    /// `train`, `eval`, `predict` or `global`.
    pub mode: &'static str,
    /// The step the window is tested at and named by: the global step for PyTorch, the
    /// mode's own step otherwise (docs/trainer.md).
    pub step: u64,
    pub pytorch: bool,
}

impl Windows {
    /// Applies boundary `b`. `now_us` gives the time of each end and start (called once
    /// per mark, like smdebug, so a new window starts a little after the old one ended).
    /// `triggered` is a step range (`start..end`) opened by a slow step
    /// (`AutoProfilingConfig`): a step inside it starts a window as the configured range
    /// does, with the feature's profiler and timer.
    pub fn boundary(
        &mut self,
        b: TrainprofBoundary,
        feature: &mut PythonFeature,
        triggered: Option<(u64, u64)>,
        at: Position,
        mut now_us: impl FnMut() -> f64,
    ) -> Outcome {
        let mut out = Outcome::default();
        let enabled = feature.feature.is_enabled();
        let (end, next) = match b {
            TrainprofBoundary::Start => {
                if self.running.is_none() && enabled {
                    self.start(&mut out, feature, pw::MODE_PRE_STEP_ZERO, None, b.phase(), now_us());
                }
                return out;
            }
            TrainprofBoundary::StepEnd if at.pytorch => return out,
            TrainprofBoundary::StepStart | TrainprofBoundary::ForwardPassEnd | TrainprofBoundary::StepEnd => {
                let configured = enabled && feature.feature.is_active(Step::At(at.step), now_us() / 1e6);
                let auto = triggered.is_some_and(|(start, end)| start <= at.step && at.step < end);
                ((at.mode, Some(at.step)), (configured || auto) && !self.capped)
            }
            TrainprofBoundary::Close => ((pw::MODE_POST_HOOK_CLOSE, None), enabled),
            TrainprofBoundary::Exit => ((pw::MODE_POST_HOOK_CLOSE, None), false),
        };
        if let Some((start, profiler)) = self.running.take() {
            let mark = Mark { mode: end.0, step: end.1, phase: b.phase(), time_us: now_us() };
            let mut name = String::with_capacity(96);
            start.write(&mut name);
            name.push('_');
            mark.write(&mut name);
            out.ended = Some((name, profiler));
        }
        if next {
            match b {
                TrainprofBoundary::Close => {
                    self.start(&mut out, feature, pw::MODE_PRE_STEP_ZERO, None, pw::PHASE_END, now_us())
                }
                _ => self.start(&mut out, feature, at.mode, Some(at.step), b.phase(), now_us()),
            }
        }
        out
    }

    fn start(
        &mut self,
        out: &mut Outcome,
        feature: &PythonFeature,
        mode: &'static str,
        step: Option<u64>,
        phase: &'static str,
        time_us: f64,
    ) {
        let timer = feature.timer.map(|t| t.for_window_start(step.map_or(Step::Any, Step::At)));
        self.running = Some((Mark { mode, step, phase, time_us }, feature.profiler));
        out.started = Some((feature.profiler, timer));
    }
}

/// A float as Python's `str()` prints it for these magnitudes: the shortest text that
/// reads back the same, always with a fractional part (`1795316597979670.5`, `12.0`).
pub fn py_float(v: f64) -> String {
    let s = format!("{v}");
    if s.contains(['.', 'e', 'E', 'N', 'n']) { s } else { s + ".0" }
}

#[cfg(test)]
mod tests {
    use trainprof_config::Sources;

    use super::*;

    fn feature(json: &str) -> PythonFeature {
        let doc = format!(
            r#"{{"ProfilingParameters": {{"ProfilerEnabled": true, "PythonProfilingConfig": "{}"}}}}"#,
            json.replace('"', "\\\"")
        );
        trainprof_config::from_bytes(doc.as_bytes(), &Sources::new()).python
    }

    /// A clock that advances by `step` at every reading.
    fn ticking(mut t: f64, step: f64) -> impl FnMut() -> f64 {
        move || {
            t += step;
            t
        }
    }

    #[test]
    fn python_float_text() {
        assert_eq!(py_float(1_795_316_597_979_670.5), "1795316597979670.5");
        assert_eq!(py_float(1_795_316_597_981_179.0), "1795316597981179.0");
        assert_eq!(py_float(12.25), "12.25");
    }

    /// The PyTorch sequence of a real smdebug 1.0.34 listing (docs/formats.md, "Directory pattern"): StartStep 2, NumSteps 2, steps 0..4.
    #[test]
    fn pytorch_sequence_matches_smdebug() {
        let mut f = feature(
            r#"{"StartStep": 2, "NumSteps": 2, "ProfilerName": "cProfile", "cProfileTimer": "total_time"}"#,
        );
        let mut w = Windows::default();
        let mut now = ticking(100.0, 1.5);
        let mut names = Vec::new();
        let pos = |step| Position { mode: "train", step, pytorch: true };
        let o = w.boundary(TrainprofBoundary::Start, &mut f, None, pos(0), &mut now);
        assert_eq!(o.started, Some((PythonProfiler::CProfile, Some(CProfileTimer::TotalTime))));
        for step in 0..5 {
            for b in
                [TrainprofBoundary::StepStart, TrainprofBoundary::ForwardPassEnd, TrainprofBoundary::StepEnd]
            {
                names.extend(w.boundary(b, &mut f, None, pos(step), &mut now).ended.map(|e| e.0));
            }
        }
        names.extend(w.boundary(TrainprofBoundary::Close, &mut f, None, pos(4), &mut now).ended.map(|e| e.0));
        names.extend(w.boundary(TrainprofBoundary::Exit, &mut f, None, pos(4), &mut now).ended.map(|e| e.0));
        assert_eq!(
            names,
            [
                "prestepzero-*-start-101.5_train-0-stepstart-104.5",
                "train-2-stepstart-112.0_train-2-forwardpassend-115.0",
                "train-2-forwardpassend-116.5_train-3-stepstart-119.5",
                "train-3-stepstart-121.0_train-3-forwardpassend-124.0",
                "train-3-forwardpassend-125.5_train-4-stepstart-128.5",
                "prestepzero-*-end-131.5_posthookclose-*-end-133.0",
            ]
        );
    }

    #[test]
    fn tensorflow_cuts_at_step_end_and_default_timer_cycles() {
        let mut f = feature(
            r#"{"StartStep": 9, "NumSteps": 3, "ProfilerName": "cProfile", "cProfileTimer": "default"}"#,
        );
        let mut w = Windows::default();
        let mut now = ticking(0.0, 1.0);
        let pos = |step| Position { mode: "eval", step, pytorch: false };
        let mut timers = Vec::new();
        let mut names = Vec::new();
        w.boundary(TrainprofBoundary::Start, &mut f, None, pos(0), &mut now);
        for step in 8..13 {
            for b in [TrainprofBoundary::StepStart, TrainprofBoundary::StepEnd] {
                let o = w.boundary(b, &mut f, None, pos(step), &mut now);
                names.extend(o.ended.map(|e| {
                    e.0.split('_')
                        .map(|h| h.rsplit_once('-').unwrap().0.to_owned())
                        .collect::<Vec<_>>()
                        .join("_")
                }));
                timers.extend(o.started.and_then(|s| s.1));
            }
        }
        assert_eq!(
            timers,
            [
                CProfileTimer::TotalTime,
                CProfileTimer::TotalTime,
                CProfileTimer::CpuTime,
                CProfileTimer::CpuTime,
                CProfileTimer::OffCpuTime,
                CProfileTimer::OffCpuTime
            ]
        );
        assert_eq!(
            names,
            [
                "prestepzero-*-start_eval-8-stepstart",
                "eval-9-stepstart_eval-9-stepend",
                "eval-9-stepend_eval-10-stepstart",
                "eval-10-stepstart_eval-10-stepend",
                "eval-10-stepend_eval-11-stepstart",
                "eval-11-stepstart_eval-11-stepend",
                "eval-11-stepend_eval-12-stepstart",
            ]
        );
    }

    #[test]
    fn nothing_when_python_profiling_is_off() {
        let mut f = trainprof_config::Config::defaults().python;
        let mut w = Windows::default();
        let pos = Position { mode: "train", step: 0, pytorch: true };
        for b in [
            TrainprofBoundary::Start,
            TrainprofBoundary::StepStart,
            TrainprofBoundary::Close,
            TrainprofBoundary::Exit,
        ] {
            assert_eq!(w.boundary(b, &mut f, None, pos, || 1.0), Outcome::default());
        }
    }
}
