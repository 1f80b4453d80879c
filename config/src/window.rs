//! Profiling windows: when a feature (detailed, dataloader, python, smdataparallel) is on.
//!
//! The semantics are smdebug's `ProfileRange.can_start_profiling`, kept exactly because
//! users' configs were written against it (docs/formats.md, "Window resolution"):
//!
//! * zero counts as absent when deciding whether a step or a time range was given;
//! * a window that gives both is refused by the parser (see `parse.rs`), neither wins;
//! * a missing start is resolved lazily, to the first step (or time) the window is asked
//!   about, and then kept: [`Window`] carries that resolved state, and the config loader
//!   keeps a window (state included) for as long as the file's content does not change;
//! * a time range without a duration covers exactly one step: the first one asked about
//!   at or after the start time;
//! * a window with no range at all is enabled but never active.
//!
//! Nothing here reads a clock: callers pass the time, so tests need no sleeping.

/// The step a caller asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A real step number (counted per mode or globally, as the framework does).
    At(u64),
    /// smdebug's `"*"`: before step zero or after the hook closed (python profiling).
    /// A step window answers yes without resolving anything; a time window answers by
    /// the clock when it has a duration, and no otherwise.
    Any,
}

/// What a sub-config asked for, validated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Range {
    /// Steps `start .. start + num`. `start: None` = the first step asked about;
    /// `num: None` = 1.
    Steps { start: Option<u64>, num: Option<u64> },
    /// Seconds since the epoch. `start: None` = the time of the first question;
    /// `duration: None` = one step, the first asked about at or after `start`.
    Time { start: Option<f64>, duration: Option<f64> },
    /// Configured, but with no step or time field that counts: never active.
    Never,
}

impl Range {
    /// Builds the range from the four fields as smdebug sees them (already converted).
    /// `Err` when both a step and a time range are present.
    ///
    /// Negative values are kept as smdebug keeps them (Python ints): StartStep -1 with
    /// NumSteps 3 covers steps -1, 0, 1, so trainprof, which counts from 0, profiles 0 and 1.
    pub(crate) fn from_fields(
        start_step: Option<i64>,
        num_steps: Option<i64>,
        start_time: Option<f64>,
        duration: Option<f64>,
    ) -> Result<Range, BothRanges> {
        // Python truthiness: None and 0 are both "absent" here.
        let truthy_u = |v: Option<i64>| v.is_some_and(|v| v != 0);
        let truthy_f = |v: Option<f64>| v.is_some_and(|v| v != 0.0);
        let has_steps = truthy_u(start_step) || truthy_u(num_steps);
        let has_time = truthy_f(start_time) || truthy_f(duration);
        match (has_steps, has_time) {
            (true, true) => Err(BothRanges),
            (true, false) => {
                let (start, num) = steps_from_zero(start_step, num_steps);
                Ok(Range::Steps { start, num })
            }
            // A zero duration is no duration (smdebug: `if self.duration_in_sec:`).
            (false, true) => Ok(Range::Time { start: start_time, duration: duration.filter(|&d| d != 0.0) }),
            (false, false) => Ok(Range::Never),
        }
    }
}

/// The part of a step range at or after step 0, as (start, num). Non-negative input is
/// returned as it is; `start: None` (resolved later, to a step >= 0) with a negative count
/// is an empty window.
fn steps_from_zero(start: Option<i64>, num: Option<i64>) -> (Option<u64>, Option<u64>) {
    let to_u = |v: i64| u64::try_from(v.max(0)).unwrap_or(0);
    match (start, num) {
        (Some(s), n) if s < 0 || n.is_some_and(|n| n < 0) => {
            let end = s.saturating_add(n.unwrap_or(1));
            let s = s.max(0);
            (Some(to_u(s)), Some(to_u(end.saturating_sub(s))))
        }
        (None, Some(n)) if n < 0 => (None, Some(0)),
        (s, n) => (s.map(to_u), n.map(to_u)),
    }
}

/// Both a step range and a time range were given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BothRanges;

/// A window and what has been resolved of it so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    range: Range,
    start_step: Option<u64>,
    end_step: Option<u64>,
    start_time: Option<f64>,
    end_time: Option<f64>,
}

impl Window {
    pub fn new(range: Range) -> Window {
        let (start_step, start_time) = match range {
            Range::Steps { start, .. } => (start, None),
            Range::Time { start, .. } => (None, start),
            Range::Never => (None, None),
        };
        Window { range, start_step, end_step: None, start_time, end_time: None }
    }

    /// The range as configured (nothing resolved).
    pub fn range(&self) -> Range {
        self.range
    }

    /// First step of a step window, once known (configured, or resolved by a question).
    pub fn start_step(&self) -> Option<u64> {
        self.start_step
    }

    /// End step (exclusive), once known: of a step window, or of a one-step time window.
    pub fn end_step(&self) -> Option<u64> {
        self.end_step.or(match (self.range, self.start_step) {
            (Range::Steps { num, .. }, Some(start)) => Some(start.saturating_add(num.unwrap_or(1))),
            _ => None,
        })
    }

    /// Start of a time window in seconds since the epoch, once known.
    pub fn start_time(&self) -> Option<f64> {
        self.start_time
    }

    /// End of a time window with a duration (exclusive), once known.
    pub fn end_time(&self) -> Option<f64> {
        self.end_time.or(match (self.range, self.start_time) {
            (Range::Time { duration: Some(d), .. }, Some(start)) => Some(start + d),
            _ => None,
        })
    }

    /// Is the window open at `step` and time `now_s`, as far as it is resolved? Unlike
    /// [`Window::is_active`] this resolves nothing: a window whose start waits for its first
    /// question is not open yet (nothing asked, so nothing was profiled).
    pub fn is_open_at(&self, step: u64, now_s: f64) -> bool {
        match self.range {
            Range::Never => false,
            Range::Steps { .. } => {
                matches!((self.start_step, self.end_step()), (Some(s), Some(e)) if s <= step && step < e)
            }
            Range::Time { duration: Some(_), .. } => {
                matches!((self.start_time, self.end_time()), (Some(s), Some(e)) if s <= now_s && now_s < e)
            }
            Range::Time { duration: None, .. } => self.end_step.is_some_and(|e| step.saturating_add(1) == e),
        }
    }

    /// Is the window open at `step` and time `now_s`? The first question may resolve a
    /// missing start (and end), which later questions then use.
    pub fn is_active(&mut self, step: Step, now_s: f64) -> bool {
        match self.range {
            Range::Never => false,
            Range::Steps { num, .. } => {
                let Step::At(step) = step else { return true };
                let start = *self.start_step.get_or_insert(step);
                let end = *self.end_step.get_or_insert(start.saturating_add(num.unwrap_or(1)));
                start <= step && step < end
            }
            Range::Time { duration: Some(d), .. } => {
                let start = *self.start_time.get_or_insert(now_s);
                let end = *self.end_time.get_or_insert(start + d);
                start <= now_s && now_s < end
            }
            Range::Time { duration: None, .. } => {
                let start = *self.start_time.get_or_insert(now_s);
                match step {
                    Step::At(step) if start <= now_s => {
                        let end = *self.end_step.get_or_insert(step.saturating_add(1));
                        step < end
                    }
                    _ => false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps 0..=5 at times 1000..=1005, one question per step (the examples of docs/formats.md, "Window resolution").
    fn active_steps(range: Range, first_question_at: u64) -> Vec<u64> {
        let mut w = Window::new(range);
        (first_question_at..6).filter(|&s| w.is_active(Step::At(s), 1000.0 + s as f64)).collect()
    }

    fn range(s: Option<i64>, n: Option<i64>, t: Option<f64>, d: Option<f64>) -> Range {
        Range::from_fields(s, n, t, d).unwrap()
    }

    #[test]
    fn spec_examples() {
        assert_eq!(active_steps(range(Some(2), None, None, None), 0), [2]);
        assert_eq!(active_steps(range(Some(0), None, None, None), 0), Vec::<u64>::new());
        assert_eq!(active_steps(range(Some(0), Some(2), None, None), 0), [0, 1]);
        assert_eq!(active_steps(range(None, Some(2), None, None), 3), [3, 4]);
        assert_eq!(active_steps(range(None, None, Some(1002.0), None), 0), [2]);
        assert_eq!(active_steps(range(None, None, Some(1001.0), Some(2.0)), 0), [1, 2]);
        assert_eq!(active_steps(range(None, None, None, Some(2.0)), 0), [0, 1]);
        assert_eq!(Range::from_fields(Some(1), None, None, Some(3.0)), Err(BothRanges));
        assert_eq!(active_steps(range(Some(0), None, None, Some(5.0)), 0), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn resolution_is_kept() {
        let mut w = Window::new(range(None, Some(2), None, None));
        assert_eq!(w.start_step(), None);
        assert!(w.is_active(Step::At(5), 0.0));
        assert_eq!((w.start_step(), w.end_step()), (Some(5), Some(7)));
        assert!(!w.is_active(Step::At(4), 0.0));
        assert!(w.is_active(Step::At(6), 0.0));
        assert!(!w.is_active(Step::At(7), 0.0));

        let mut w = Window::new(range(None, None, None, Some(0.5)));
        assert!(w.is_active(Step::At(0), 100.0));
        assert_eq!((w.start_time(), w.end_time()), (Some(100.0), Some(100.5)));
        assert!(!w.is_active(Step::At(1), 100.5));
    }

    #[test]
    fn one_step_time_window_waits_for_the_start() {
        let mut w = Window::new(range(None, None, Some(1002.5), None));
        assert!(!w.is_active(Step::At(2), 1002.0));
        assert_eq!(w.end_step(), None);
        assert!(w.is_active(Step::At(3), 1003.0));
        assert_eq!(w.end_step(), Some(4));
        assert!(!w.is_active(Step::At(4), 1004.0));
    }

    #[test]
    fn is_open_at_resolves_nothing() {
        let w = Window::new(range(None, Some(2), None, None));
        assert!(!w.is_open_at(0, 0.0));
        assert_eq!(w.start_step(), None);
        let mut w = Window::new(range(Some(3), Some(2), None, None));
        assert_eq!((3..7).map(|s| w.is_open_at(s, 0.0)).collect::<Vec<_>>(), [true, true, false, false]);
        assert!(w.is_active(Step::At(3), 0.0));
        let mut w = Window::new(range(None, None, Some(10.0), Some(5.0)));
        assert!(!w.is_open_at(0, 9.0) && w.is_open_at(0, 10.0) && !w.is_open_at(0, 15.0));
        assert!(w.is_active(Step::At(0), 11.0));
        let mut w = Window::new(range(None, None, Some(10.0), None));
        assert!(!w.is_open_at(4, 12.0));
        assert!(w.is_active(Step::At(4), 12.0));
        assert!(w.is_open_at(4, 13.0) && !w.is_open_at(5, 13.0));
    }

    #[test]
    fn any_step() {
        let mut w = Window::new(range(Some(9), Some(3), None, None));
        assert!(w.is_active(Step::Any, 0.0));
        let mut w = Window::new(range(None, Some(3), None, None));
        assert!(w.is_active(Step::Any, 0.0));
        assert_eq!(w.start_step(), None, "\"*\" resolves nothing");
        let mut w = Window::new(range(None, None, Some(10.0), Some(5.0)));
        assert!(!w.is_active(Step::Any, 9.0));
        assert!(w.is_active(Step::Any, 12.0));
        let mut w = Window::new(range(None, None, Some(10.0), None));
        assert!(!w.is_active(Step::Any, 12.0));
        assert!(!w.is_active(Step::At(0), 9.0));
    }

    #[test]
    fn negative_steps_as_python_counts_them() {
        assert_eq!(active_steps(range(Some(-1), Some(3), None, None), 0), [0, 1]);
        assert_eq!(active_steps(range(Some(-1), None, None, None), 0), Vec::<u64>::new());
        assert_eq!(active_steps(range(Some(4), Some(-2), None, None), 0), Vec::<u64>::new());
        assert_eq!(active_steps(range(None, Some(-2), None, None), 0), Vec::<u64>::new());
    }

    #[test]
    fn empty_and_never() {
        assert_eq!(active_steps(range(Some(5), Some(0), None, None), 0), Vec::<u64>::new());
        assert_eq!(range(None, Some(0), None, Some(0.0)), Range::Never);
        let mut w = Window::new(Range::Never);
        assert!(!w.is_active(Step::Any, 0.0));
        assert!(!w.is_active(Step::At(0), 0.0));
    }

    #[test]
    fn huge_numbers_do_not_overflow() {
        let mut w = Window::new(Range::Steps { start: Some(u64::MAX), num: Some(u64::MAX) });
        assert!(!w.is_active(Step::At(u64::MAX - 1), 0.0));
        assert_eq!(w.end_step(), Some(u64::MAX));
        let mut w = Window::new(range(Some(i64::MAX), Some(i64::MAX), None, None));
        assert!(w.is_active(Step::At(i64::MAX as u64), 0.0));
        assert_eq!(
            range(Some(i64::MIN), Some(i64::MIN), None, None),
            Range::Steps { start: Some(0), num: Some(0) }
        );
        let mut w = Window::new(range(None, None, None, Some(f64::MAX)));
        assert!(w.is_active(Step::At(0), f64::MAX));
    }
}
