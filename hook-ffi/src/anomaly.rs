//! Windows opened by a slow train step (`AutoProfilingConfig`, docs/formats.md,
//! "Anomaly-triggered windows"): the rolling median, the trigger, the rate limit and the
//! window a trigger opens.
//!
//! Pure state: the hook feeds it every train step's end (under the gate lock, on the
//! trainer's thread) with the step's duration, its end time, whether a window was open
//! during it and whether the profiler's own background work overlapped it; nothing here
//! reads a clock, so tests inject times.
//!
//! The profiler's own work is never judged as a slow step (docs/formats.md,
//! "Anomaly-triggered windows"): the step right after a window is left out of both the
//! median and the judgement, because that is where a window's close lands (the adapters
//! stop torch.profiler and process its events, write the Python stats, at the next step's
//! start boundary; a close of 0.7–1.2 s after 30 ms steps triggered a window whose own close
//! triggered the next). Leaving the step out rather than subtracting a measured cost needs
//! no cooperation from the adapters (any caller of the C ABI closes windows its own way)
//! and cannot under-subtract work nobody measured; what it costs is that one step per
//! window is never judged.
//!
//! The median is kept over the latest `MedianOfSteps` durations in two fixed buffers: a
//! ring in arrival order (which value leaves next) and the same values sorted. A step
//! removes the oldest from the sorted copy and inserts the new one (two binary searches
//! and two `memmove`s of at most n values), and the median is the middle element.
//! Measured against copying the ring and selecting (`select_nth_unstable`, O(n) per step):
//! at n = 1000 a whole train step cost 2.5 µs with that and 0.38 µs with this, at n = 50
//! 0.39 against 0.25 (BENCHMARKS.md, "a train step with `AutoProfilingConfig`"); two heaps
//! would need a delete of an arbitrary element. Neither buffer grows after start-up.

use std::collections::VecDeque;

use trainprof_config::{AutoFeature, AutoFeatures, AutoProfiling};

/// The rate limit's period: `MaxPerHour` triggers in any rolling hour.
const HOUR_US: i64 = 3_600_000_000;

/// One ended train step, as the hook sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepEnd {
    /// The step number windows are tested at (global for PyTorch, the mode's own otherwise).
    pub step: u64,
    pub duration_us: i64,
    /// When it ended (µs since the epoch): the trigger's time, and the rate limit's clock.
    pub end_us: i64,
    /// A configured window (any feature) was open during the step (at its start or end).
    pub in_configured_window: bool,
    /// The profiler's own work off the trainer's thread (a native window's report) ran
    /// during the step.
    pub own_work: bool,
}

/// A trigger: the slow step and the window it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trigger {
    /// The slow step (windows' numbering).
    pub step: u64,
    pub duration_us: i64,
    /// The median it was compared with.
    pub median_us: i64,
    /// The window: steps `window_start .. window_start + num_steps`.
    pub window_start: u64,
    pub num_steps: u64,
    pub features: AutoFeatures,
    pub end_us: i64,
    /// Slow steps that did not trigger since the previous trigger (`MaxPerHour` reached).
    pub skipped: u64,
}

/// A window a trigger opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Opened {
    start: u64,
    end: u64,
    features: AutoFeatures,
}

/// The detector. Sized once from the settings; a step allocates nothing.
#[derive(Debug)]
pub struct Detector {
    settings: AutoProfiling,
    /// The latest durations (µs) of train steps outside windows, oldest overwritten.
    ring: Vec<i64>,
    next: usize,
    /// The same durations, sorted.
    sorted: Vec<i64>,
    /// Train steps ended so far (the warm-up counts them all).
    train_steps: u64,
    /// Times (µs) of the triggers of the last hour, oldest first.
    triggers: VecDeque<i64>,
    window: Option<Opened>,
    skipped: u64,
    /// The previous train step was inside a window: this one holds the window's close.
    after_window: bool,
}

impl Detector {
    pub fn new(settings: &AutoProfiling) -> Detector {
        let n = settings.median_of_steps.max(1);
        Detector {
            settings: settings.clone(),
            ring: Vec::with_capacity(n),
            next: 0,
            sorted: Vec::with_capacity(n),
            train_steps: 0,
            triggers: VecDeque::with_capacity(settings.max_per_hour as usize),
            window: None,
            skipped: 0,
            after_window: false,
        }
    }

    pub fn settings(&self) -> &AutoProfiling {
        &self.settings
    }

    /// New settings from a reloaded config. What was learnt is kept (the step count, the
    /// durations, the triggers of the last hour, an open window); a smaller
    /// `MedianOfSteps` keeps the latest durations only.
    pub fn reconfigure(&mut self, settings: &AutoProfiling) {
        if *settings == self.settings {
            return;
        }
        let n = settings.median_of_steps.max(1);
        if n != self.settings.median_of_steps.max(1) {
            // Oldest first, then the latest n.
            let mut latest: Vec<i64> =
                self.ring[self.next..].iter().chain(&self.ring[..self.next]).copied().collect();
            let cut = latest.len().saturating_sub(n);
            latest.drain(..cut);
            self.ring = Vec::with_capacity(n);
            self.ring.extend(latest);
            self.next = 0;
            self.sorted = Vec::with_capacity(n);
            self.sorted.extend_from_slice(&self.ring);
            self.sorted.sort_unstable();
        }
        self.settings = settings.clone();
    }

    /// Does a triggered window open `feature` at `step`?
    pub fn opens(&self, feature: AutoFeature, step: u64) -> bool {
        self.window.is_some_and(|w| w.features.contains(feature) && w.start <= step && step < w.end)
    }

    /// The triggered window's steps (`start..end`), if `feature` is in it.
    pub fn range_for(&self, feature: AutoFeature) -> Option<(u64, u64)> {
        self.window.filter(|w| w.features.contains(feature)).map(|w| (w.start, w.end))
    }

    /// Is `step` inside a triggered window (of any feature)?
    pub fn in_window(&self, step: u64) -> bool {
        self.window.is_some_and(|w| w.start <= step && step < w.end)
    }

    /// The median of the durations kept (the upper middle one for an even count).
    fn median(&self) -> Option<i64> {
        self.sorted.get(self.sorted.len() / 2).copied()
    }

    fn remember(&mut self, duration_us: i64) {
        let n = self.settings.median_of_steps.max(1);
        if self.ring.len() < n {
            self.ring.push(duration_us);
        } else {
            let oldest = std::mem::replace(&mut self.ring[self.next], duration_us);
            self.next = (self.next + 1) % n;
            // Always there: `sorted` holds exactly the ring's values.
            if let Ok(i) = self.sorted.binary_search(&oldest) {
                self.sorted.remove(i);
            }
        }
        let at = self.sorted.partition_point(|&d| d < duration_us);
        self.sorted.insert(at, duration_us);
    }

    /// One train step ended: a [`Trigger`] when it opens a window.
    ///
    /// A step inside a window (configured or triggered), the step right after one (where
    /// the window's close lands) and a step the profiler's own work overlapped are neither
    /// remembered nor compared. Otherwise it is compared with the median of the steps
    /// before it (after the warm-up), then remembered.
    pub fn step_end(&mut self, s: StepEnd) -> Option<Trigger> {
        let index = self.train_steps;
        self.train_steps = self.train_steps.saturating_add(1);
        let in_window = s.in_configured_window || self.in_window(s.step);
        let after_window = std::mem::replace(&mut self.after_window, in_window);
        if in_window || after_window || s.own_work {
            return None;
        }
        let median = if index >= self.settings.warmup_steps { self.median() } else { None };
        self.remember(s.duration_us);
        let median = median?;
        if (s.duration_us as f64) <= self.settings.step_time_ratio * median as f64 {
            return None;
        }
        while self.triggers.front().is_some_and(|&t| t <= s.end_us.saturating_sub(HOUR_US)) {
            self.triggers.pop_front();
        }
        if self.triggers.len() >= self.settings.max_per_hour as usize {
            self.skipped = self.skipped.saturating_add(1);
            return None;
        }
        self.triggers.push_back(s.end_us);
        let start = s.step.saturating_add(1);
        let features = self.settings.features;
        self.window = Some(Opened { start, end: start.saturating_add(self.settings.num_steps), features });
        Some(Trigger {
            step: s.step,
            duration_us: s.duration_us,
            median_us: median,
            window_start: start,
            num_steps: self.settings.num_steps,
            features,
            end_us: s.end_us,
            skipped: std::mem::take(&mut self.skipped),
        })
    }
}

#[cfg(test)]
mod tests {
    use trainprof_config::Sources;

    use super::*;

    fn settings(json: &str) -> AutoProfiling {
        let doc = format!(r#"{{"ProfilingParameters": {{"AutoProfilingConfig": {json}}}}}"#);
        let c = trainprof_config::from_bytes(doc.as_bytes(), &Sources::new());
        assert!(c.problems.is_empty(), "{:?}", c.problems);
        c.auto
    }

    /// Steps 0.. of `ms` each (1 s apart), none in a configured window: the triggers.
    fn run(d: &mut Detector, ms: &[i64]) -> Vec<Trigger> {
        ms.iter()
            .enumerate()
            .filter_map(|(i, &ms)| {
                let step = i as u64;
                let end_us = 1_000_000 * (i as i64 + 1);
                d.step_end(StepEnd {
                    step,
                    duration_us: ms * 1000,
                    end_us,
                    in_configured_window: false,
                    own_work: false,
                })
            })
            .collect()
    }

    fn steps(n: usize, slow: &[(usize, i64)]) -> Vec<i64> {
        let mut v = vec![20; n];
        for &(i, ms) in slow {
            v[i] = ms;
        }
        v
    }

    #[test]
    fn a_slow_step_opens_the_next_steps() {
        let mut d = Detector::new(&settings(
            r#"{"WarmupSteps": 20, "NumSteps": 2, "Features": ["detailed", "python"]}"#,
        ));
        let t = run(&mut d, &steps(40, &[(30, 200)]));
        assert_eq!(t.len(), 1);
        let t = t[0];
        assert_eq!(
            (t.step, t.duration_us, t.median_us, t.window_start, t.num_steps),
            (30, 200_000, 20_000, 31, 2)
        );
        assert_eq!(t.end_us, 31_000_000);
        assert_eq!(t.features.iter().collect::<Vec<_>>(), [AutoFeature::Detailed, AutoFeature::Python]);
        let opened: Vec<u64> = (0..40).filter(|&s| d.opens(AutoFeature::Detailed, s)).collect();
        assert_eq!(opened, [31, 32]);
        assert!(!d.opens(AutoFeature::Dataloader, 31));
        assert_eq!(d.range_for(AutoFeature::Python), Some((31, 33)));
        assert_eq!(d.range_for(AutoFeature::Native), None);
    }

    #[test]
    fn exactly_the_ratio_does_not_trigger() {
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 0, "StepTimeRatio": 3}"#));
        assert!(run(&mut d, &steps(10, &[(5, 60)])).is_empty());
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 0, "StepTimeRatio": 3}"#));
        assert_eq!(run(&mut d, &steps(10, &[(5, 61)])).len(), 1);
    }

    #[test]
    fn warm_up_steps_never_trigger_but_count_in_the_median() {
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 5}"#));
        // Step 0 (a compile) and step 3 are slow but in the warm-up; 6 triggers.
        let t = run(&mut d, &steps(10, &[(0, 5000), (3, 500), (6, 500)]));
        assert_eq!(t.iter().map(|t| t.step).collect::<Vec<_>>(), [6]);
        assert_eq!(t[0].median_us, 20_000);
        // WarmupSteps 0: the first step has nothing to compare with.
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 0}"#));
        assert_eq!(
            run(&mut d, &steps(3, &[(0, 500), (1, 5000)])).iter().map(|t| t.step).collect::<Vec<_>>(),
            [1]
        );
    }

    #[test]
    fn window_steps_neither_trigger_nor_enter_the_median() {
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 3, "NumSteps": 3}"#));
        // 10 triggers; 11..=13 are its window (slow too: no trigger); 14 holds the window's
        // close (slow: no trigger); 15 is compared with the steps before 10 only, so 100 ms
        // still triggers.
        let slow = [(10, 100), (11, 400), (12, 400), (13, 400), (14, 400), (15, 100)];
        let t = run(&mut d, &steps(20, &slow));
        assert_eq!(t.iter().map(|t| (t.step, t.median_us)).collect::<Vec<_>>(), [(10, 20_000), (15, 20_000)]);
        // A configured window's steps are skipped the same way.
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 0}"#));
        run(&mut d, &steps(5, &[]));
        let slow = StepEnd {
            step: 5,
            duration_us: 1_000_000,
            end_us: 6_000_000,
            in_configured_window: true,
            own_work: false,
        };
        assert_eq!(d.step_end(slow), None);
        assert_eq!(d.median(), Some(20_000));
    }

    #[test]
    fn max_per_hour_holds_over_a_rolling_hour() {
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 2, "NumSteps": 1, "MaxPerHour": 3}"#));
        // Every other step slow (the median stays 20 ms: most steps are fast).
        let mut ms = steps(200, &[]);
        for i in (10..200).step_by(10) {
            ms[i] = 300;
        }
        let t = run(&mut d, &ms);
        assert_eq!(t.iter().map(|t| t.step).collect::<Vec<_>>(), [10, 20, 30]);
        // An hour after the first trigger (step 10 ended at 11 s), one more is allowed.
        let at = |step: u64, end_us: i64| StepEnd {
            step,
            duration_us: 300_000,
            end_us,
            in_configured_window: false,
            own_work: false,
        };
        assert_eq!(d.step_end(at(300, 11_000_000 + HOUR_US - 1)), None);
        let again = d.step_end(at(302, 11_000_000 + HOUR_US)).unwrap();
        assert_eq!(again.skipped, 16 + 1, "the slow steps not profiled since the last trigger");
        assert_eq!(d.step_end(at(304, 11_000_000 + HOUR_US + 1)), None);
    }

    #[test]
    fn the_median_rolls_over_the_latest_steps() {
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 0, "MedianOfSteps": 5, "MaxPerHour": 100}"#));
        // Steps get slower for good: 20 ms, then 100 ms. The first 100 ms steps trigger
        // until they are the median of the last 5 (the windows' steps and the step after
        // each window are skipped).
        let mut ms = vec![20; 10];
        ms.extend([100; 20]);
        let t = run(&mut d, &ms);
        assert_eq!(t.iter().map(|t| t.step).collect::<Vec<_>>(), [10, 14, 18]);
        assert_eq!(d.median(), Some(100_000));
        assert_eq!(d.ring.len(), 5);
        let mut sorted = d.ring.clone();
        sorted.sort_unstable();
        assert_eq!(d.sorted, sorted);
    }

    #[test]
    fn reconfigure_keeps_the_latest_durations() {
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 0, "MedianOfSteps": 5}"#));
        run(&mut d, &[1, 2, 3, 4, 5, 6, 7]);
        d.reconfigure(&settings(r#"{"WarmupSteps": 0, "MedianOfSteps": 3}"#));
        assert_eq!(d.ring, [5000, 6000, 7000]);
        assert_eq!(d.median(), Some(6000));
        d.reconfigure(&settings(r#"{"WarmupSteps": 0, "MedianOfSteps": 4}"#));
        d.step_end(StepEnd {
            step: 7,
            duration_us: 8000,
            end_us: 9_000_000,
            in_configured_window: false,
            own_work: false,
        });
        assert_eq!(d.ring, [5000, 6000, 7000, 8000]);
        assert_eq!(d.median(), Some(7000));
        assert_eq!(d.sorted, [5000, 6000, 7000, 8000]);
    }

    /// A window's close lands in the step after it (the adapters stop torch.profiler at the
    /// next step's start): 20x the median there must neither trigger nor enter the median,
    /// after a configured window or a triggered one, and a real slow step later triggers.
    #[test]
    fn a_windows_close_is_not_a_slow_step() {
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 5, "NumSteps": 2, "MaxPerHour": 4}"#));
        let mut triggered = Vec::new();
        for step in 0..80u64 {
            let configured = (20..22).contains(&step);
            // The close of the configured window (20..=21) lands in 22, of each triggered
            // window in the step after it.
            let after = step == 22 || (step > 0 && d.in_window(step - 1));
            let ms = match step {
                _ if after => 400,
                60 => 200,
                _ => 20,
            };
            let s = StepEnd {
                step,
                duration_us: ms * 1000,
                end_us: 1_000_000 * (step as i64 + 1),
                in_configured_window: configured,
                own_work: false,
            };
            triggered.extend(d.step_end(s).map(|t| (t.step, t.median_us)));
        }
        assert_eq!(triggered, [(60, 20_000)], "no cascade; the slow step triggers");
        assert_eq!(d.median(), Some(20_000));
    }

    /// A step the profiler's own background work overlapped is skipped like a window's.
    #[test]
    fn a_step_beside_the_profilers_own_work_is_skipped() {
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 0}"#));
        run(&mut d, &steps(5, &[]));
        let at = |step: u64, own_work: bool| StepEnd {
            step,
            duration_us: 500_000,
            end_us: 1_000_000 * (step as i64 + 1),
            in_configured_window: false,
            own_work,
        };
        assert_eq!(d.step_end(at(5, true)), None);
        assert_eq!(d.ring.len(), 5, "not remembered");
        assert_eq!(d.step_end(at(6, false)).map(|t| t.step), Some(6));
    }

    /// The sorted copy stays the ring's values, sorted, through many replacements with
    /// repeated values, and its middle is the median a full sort gives.
    #[test]
    fn the_sorted_copy_follows_the_ring() {
        let mut d = Detector::new(&settings(r#"{"WarmupSteps": 0, "MedianOfSteps": 7}"#));
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            d.remember((x % 13) as i64);
            let mut want = d.ring.clone();
            want.sort_unstable();
            assert_eq!(d.sorted, want);
            assert_eq!(d.median(), Some(want[want.len() / 2]));
        }
    }
}
