//! The sampling loop: every interval, all samplers into one buffer with one timestamp,
//! then the buffer to every sink ([`crate::pipeline::sink`]; the system metrics files are
//! one).
//!
//! Ticks are due at `start + k × interval` and never drift. A tick that comes late (the
//! machine was busy, a GPU call hung) is taken once, now, and the deadlines it overran
//! are skipped and counted, never queued up and run back to back.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::pipeline::cost::{self, Part};
use crate::pipeline::sample::{Metrics, Sampler};
use crate::pipeline::sink::{LoopCounts, Sink, Tick};
use crate::pipeline::system_file::SystemCounts;

/// Monotonic and wall time, and a way to wait that a stop request cuts short.
pub trait Clock {
    /// Monotonic time since an arbitrary start.
    fn mono(&self) -> Duration;
    /// Seconds since the Unix epoch.
    fn wall_s(&self) -> f64;
    /// Waits until `mono() >= deadline` or a stop is requested; true when stopping.
    fn wait_until(&self, deadline: Duration) -> bool;
    /// Waits `d`, stop requested or not (the short waits before the last tick).
    fn pause(&self, d: Duration);
}

/// A stop request that wakes the loop at once.
#[derive(Debug, Clone, Default)]
pub struct Stop {
    inner: Arc<(Mutex<bool>, Condvar)>,
}

impl Stop {
    pub fn new() -> Stop {
        Stop::default()
    }

    pub fn request(&self) {
        let (flag, cv) = &*self.inner;
        *flag.lock().unwrap_or_else(PoisonError::into_inner) = true;
        cv.notify_all();
    }

    pub fn requested(&self) -> bool {
        *self.inner.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The real clocks.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
    stop: Stop,
}

impl SystemClock {
    pub fn new(stop: Stop) -> SystemClock {
        SystemClock { origin: Instant::now(), stop }
    }
}

impl Clock for SystemClock {
    fn mono(&self) -> Duration {
        self.origin.elapsed()
    }

    fn wall_s(&self) -> f64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
    }

    fn wait_until(&self, deadline: Duration) -> bool {
        let (flag, cv) = &*self.stop.inner;
        let mut stopped = flag.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if *stopped {
                return true;
            }
            let now = self.mono();
            if now >= deadline {
                return false;
            }
            // Capped, so that a far deadline (Duration::MAX: "until stopped") is no
            // special case for the platform's timed wait.
            let wait = (deadline - now).min(Duration::from_secs(3600));
            stopped = cv.wait_timeout(stopped, wait).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    fn pause(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// The shortest stretch a last tick at the stop covers (unless it is the only tick): the
/// last tick waits for it, for jiffy-based CPU figures (10 ms resolution) to mean something.
const LAST_TICK_MIN: Duration = Duration::from_millis(50);

/// One sampler and what the loop knows about its health.
struct Source {
    sampler: Box<dyn Sampler>,
    /// Its part in the agent's own account.
    part: Part,
    failures: u64,
    /// The last error's text, to log only changes.
    failing: Option<String>,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("sampler", &self.sampler.name())
            .field("failures", &self.failures)
            .finish()
    }
}

/// A sampler's part in the agent's own account, by its name.
fn sampler_part(name: &str) -> Part {
    match name {
        "cpu" => Part::SamplerCpu,
        "memory" => Part::SamplerMemory,
        "disk" => Part::SamplerDisk,
        "network" => Part::SamplerNetwork,
        "cgroup" => Part::SamplerCgroup,
        "trainer" => Part::SamplerTree,
        "agent" => Part::SamplerAgent,
        "pressure" => Part::SamplerPressure,
        "clock" => Part::SamplerClock,
        "gpu" => Part::SamplerGpu,
        _ => Part::SamplerOther,
    }
}

/// What a reloaded configuration may change while the loop runs (docs/configuration.md, "Reload").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopSettings {
    pub interval: Duration,
    /// False (DisableProfiler): ticks are neither taken nor written until it is true again.
    pub enabled: bool,
}

/// Asked before every tick whether the settings changed (the agent: a
/// [`trainprof_config::Loader`] that re-reads the file at most once a second).
pub trait Reconfigure: Send {
    /// The new settings when they changed since the last answer; `mono` is the loop's
    /// clock, for rate limits.
    fn poll(&mut self, mono: Duration) -> Option<LoopSettings>;
}

/// The samplers, the buffer and the sinks.
pub struct Ticker {
    sources: Vec<Source>,
    metrics: Metrics,
    /// Each tick goes to every one, in this order.
    sinks: Vec<Box<dyn Sink>>,
    interval: Duration,
    ticks: u64,
    skipped: u64,
    /// False while a reloaded config says DisableProfiler.
    enabled: bool,
    reconfigure: Option<Box<dyn Reconfigure>>,
}

impl std::fmt::Debug for Ticker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticker")
            .field("sources", &self.sources)
            .field("interval", &self.interval)
            .field("enabled", &self.enabled)
            .field("ticks", &self.ticks)
            .finish_non_exhaustive()
    }
}

impl Ticker {
    pub fn new(samplers: Vec<Box<dyn Sampler>>, sinks: Vec<Box<dyn Sink>>, interval: Duration) -> Ticker {
        let sources = samplers
            .into_iter()
            .map(|sampler| Source { part: sampler_part(sampler.name()), sampler, failures: 0, failing: None })
            .collect();
        Ticker {
            sources,
            metrics: Metrics::new(),
            sinks,
            interval: interval.max(Duration::from_millis(1)),
            ticks: 0,
            skipped: 0,
            enabled: true,
            reconfigure: None,
        }
    }

    /// Asks `r` before every tick for new settings (a reloaded config).
    pub fn reconfigure_with(&mut self, r: Box<dyn Reconfigure>) {
        self.reconfigure = Some(r);
    }

    /// The interval in use.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Applies new settings, one line per change. True when the interval changed (the
    /// schedule starts again from now).
    fn apply(&mut self, new: LoopSettings) -> bool {
        let new_interval = new.interval.max(Duration::from_millis(1));
        let rescheduled = new_interval != self.interval;
        if rescheduled {
            self.interval = new_interval;
            if new.enabled {
                crate::log!("config changed: sampling every {} ms from now on", new_interval.as_millis());
            }
        }
        if new.enabled != self.enabled {
            self.enabled = new.enabled;
            if new.enabled {
                crate::log!(
                    "config changed: profiling on again, sampling every {} ms",
                    self.interval.as_millis()
                );
            } else {
                crate::log!(
                    "config changed: DisableProfiler is true; no ticks are written until it is false again"
                );
                for s in &mut self.sinks {
                    s.pause();
                }
            }
        }
        rescheduled
    }

    /// The names of the samplers it runs.
    pub fn sampler_names(&self) -> Vec<&'static str> {
        self.sources.iter().map(|s| s.sampler.name()).collect()
    }

    /// One tick: every sampler, then every sink.
    pub fn tick(&mut self, mono: Duration, wall_s: f64) {
        self.sample(mono, false);
        self.hand_on(wall_s, false);
    }

    /// The job's last tick (the system files: in a file of its own named by its second).
    fn last_tick(&mut self, mono: Duration, wall_s: f64) {
        self.sample(mono, true);
        self.hand_on(wall_s, true);
    }

    /// The buffer to every sink.
    fn hand_on(&mut self, wall_s: f64, last: bool) {
        let tick = Tick { wall_s, metrics: self.metrics.as_slice(), last };
        for s in &mut self.sinks {
            let _cost = cost::span(s.cost_part());
            s.tick(&tick);
        }
    }

    /// Every sampler into the buffer (`last`: [`Sampler::sample_last`]).
    fn sample(&mut self, mono: Duration, last: bool) {
        // Every part timed on one tick in TIMED_EVERY from the second (the first's calls pay
        // for lazy loading once, which would skew a call's cost), and on the last.
        cost::tick_begin(last || self.ticks % cost::TIMED_EVERY == 1);
        self.ticks += 1;
        self.metrics.clear();
        for s in &mut self.sources {
            let _cost = cost::span(s.part);
            let result = if last {
                s.sampler.sample_last(mono, &mut self.metrics)
            } else {
                s.sampler.sample(mono, &mut self.metrics)
            };
            match result {
                Ok(()) => {
                    if s.failing.take().is_some() {
                        crate::log!("{} sampler recovered", s.sampler.name());
                    }
                }
                Err(e) => {
                    s.failures += 1;
                    let text = e.to_string();
                    if s.failing.as_deref() != Some(text.as_str()) {
                        crate::log!("{} sampler: {text} (counted; sampling goes on)", s.sampler.name());
                        s.failing = Some(text);
                    }
                }
            }
        }
    }

    /// Runs ticks until `clock` says stop, takes a last tick for the time since the
    /// previous one (so a job shorter than one interval still leaves a system file, which
    /// smdebug's `ProfilerTrial` waits for) in a file of its own named by its second
    /// (`docs/formats.md`, "System files: names"), then finishes every sink. The stop may
    /// be the trainer's exit (`run`) or a signal (`agent`): the same path.
    pub fn run(&mut self, clock: &dyn Clock) {
        let mut start = clock.mono();
        let mut last = start;
        let mut k: u64 = 1;
        loop {
            let deadline = start + self.interval.saturating_mul(u32::try_from(k).unwrap_or(u32::MAX));
            if clock.wait_until(deadline) {
                if self.enabled {
                    // A stretch long enough for the CPU figures, unless it is the only tick.
                    let since = clock.mono().saturating_sub(last);
                    if self.ticks > 0 && since < LAST_TICK_MIN {
                        clock.pause(LAST_TICK_MIN - since);
                    }
                    // Not in the first second of one of the trial's windows (the system
                    // files: ≤ 1 s, one stop in 60).
                    let wall_s = clock.wall_s();
                    if let Some(d) = self.sinks.iter().filter_map(|s| s.last_tick_pause(wall_s)).max() {
                        clock.pause(d);
                    }
                    self.last_tick(clock.mono(), clock.wall_s());
                }
                break;
            }
            let mut now = clock.mono();
            let polled = self.reconfigure.as_mut().and_then(|r| r.poll(now));
            if let Some(new) = polled
                && self.apply(new)
            {
                // The new interval counts from this tick on.
                now = clock.mono();
                start = now;
                k = 0;
            }
            if self.enabled {
                last = now;
                self.tick(now, clock.wall_s());
            }
            // The next deadline after the end of this tick; any passed meanwhile are skipped.
            let done = clock.mono().saturating_sub(start);
            let next = u64::try_from(done.as_nanos() / self.interval.as_nanos())
                .unwrap_or(u64::MAX)
                .saturating_add(1);
            self.skipped += next.saturating_sub(k + 1);
            k = next.max(k + 1);
        }
        self.finish();
    }

    /// Finishes every sink (the system files: seals the open file).
    pub fn finish(&mut self) {
        for s in &mut self.sinks {
            s.finish();
        }
    }

    pub fn counts(&self) -> LoopCounts {
        let mut c = LoopCounts {
            ticks: self.ticks,
            skipped: self.skipped,
            sample_failures: self
                .sources
                .iter()
                .map(|s| (s.sampler.name(), s.failures + s.sampler.failures()))
                .collect(),
            system: SystemCounts::default(),
            sampling_cpu_us: 0,
        };
        for s in &self.sinks {
            s.add_counts(&mut c);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering::SeqCst;

    use super::*;
    use crate::pipeline::sample::{Name, SampleError};
    use crate::pipeline::sinks::SystemFiles;
    use crate::pipeline::system_file::SystemWriter;

    /// The system files under `dir` as algo-1, the only sink.
    fn system_files(dir: &Path, node: trainprof_output::node::SystemNode) -> Vec<Box<dyn Sink>> {
        vec![Box::new(SystemFiles::new(SystemWriter::new(dir, node), None))]
    }

    /// Time moves only when the loop waits or a sampler "works".
    struct FakeClock {
        now_ns: AtomicU64,
        wall0: f64,
        stop_at: Duration,
    }

    impl FakeClock {
        fn new(wall0: f64, stop_at_ms: u64) -> Arc<FakeClock> {
            Arc::new(FakeClock {
                now_ns: AtomicU64::new(0),
                wall0,
                stop_at: Duration::from_millis(stop_at_ms),
            })
        }
        fn set(&self, d: Duration) {
            self.now_ns.store(d.as_nanos() as u64, SeqCst);
        }
    }

    impl Clock for FakeClock {
        fn mono(&self) -> Duration {
            Duration::from_nanos(self.now_ns.load(SeqCst))
        }
        fn wall_s(&self) -> f64 {
            self.wall0 + self.mono().as_secs_f64()
        }
        fn wait_until(&self, deadline: Duration) -> bool {
            if deadline >= self.stop_at {
                self.set(self.stop_at);
                return true;
            }
            self.set(self.mono().max(deadline));
            false
        }
        fn pause(&self, d: Duration) {
            self.set(self.mono() + d);
        }
    }

    /// Reports the time it was called at; takes `cost` of (fake) time on the calls listed
    /// in `slow`, fails on those in `fail`.
    struct Probe {
        clock: Arc<FakeClock>,
        slow: Vec<u64>,
        cost: Duration,
        n: u64,
        fail: Vec<u64>,
    }

    impl Sampler for Probe {
        fn name(&self) -> &'static str {
            "probe"
        }
        fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
            self.n += 1;
            if self.slow.contains(&self.n) {
                self.clock.set(self.clock.mono() + self.cost);
            }
            if self.fail.contains(&self.n) {
                return Err(SampleError::parse(Path::new("/fake"), "scripted"));
            }
            out.push(
                crate::pipeline::sample::MetricType::Cpu,
                Name::Indexed("cpu", 0),
                "CPUUtilization",
                now.as_millis() as f64,
            );
            out.push(crate::pipeline::sample::MetricType::Memory, Name::Static("MemoryUsedPercent"), "", 1.0);
            Ok(())
        }
    }

    /// A scratch folder, removed when the first value is dropped (also when the test fails).
    /// A ticker with one plain probe (no slow ticks, no failures) writing into `dir` as
    /// algo-1, every `interval_ms`.
    fn plain_ticker(clock: &Arc<FakeClock>, dir: &Path, interval_ms: u64) -> Ticker {
        let probe =
            Probe { clock: Arc::clone(clock), slow: vec![], cost: Duration::ZERO, n: 0, fail: vec![] };
        Ticker::new(
            vec![Box::new(probe)],
            system_files(dir, trainprof_output::node::SystemNode::new(1)),
            Duration::from_millis(interval_ms),
        )
    }

    fn root(tag: &str) -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::Builder::new().prefix(&format!("trainprof-tick-{tag}-")).tempdir().unwrap();
        // A folder that does not exist yet: the writer makes it.
        let d = t.path().join("root");
        (t, d)
    }

    fn lines(root: &Path) -> Vec<serde_json::Value> {
        let mut out: Vec<serde_json::Value> = Vec::new();
        for f in crate::commands::run::summary::files_under(&root.join("system")) {
            for l in std::fs::read_to_string(root.join("system").join(f)).unwrap().lines() {
                out.push(serde_json::from_str(l).unwrap());
            }
        }
        out.sort_by(|a, b| a["Timestamp"].as_f64().partial_cmp(&b["Timestamp"].as_f64()).unwrap());
        out
    }

    /// The window starts in the names of the sealed system files, in order.
    fn names(root: &Path) -> Vec<i64> {
        let mut out: Vec<i64> = crate::commands::run::summary::files_under(&root.join("system"))
            .iter()
            .filter_map(|f| f.rsplit('/').next()?.split('.').next()?.parse().ok())
            .collect();
        out.sort_unstable();
        out
    }

    /// The timestamps of the `cpu` lines smdebug's profiler trial hands its rules, as its
    /// rules walk it: 60 s windows from the oldest file name, while a window starts before
    /// the newest name (`ProfilerTrial.wait_for_data`), each window's lines taken with both
    /// ends included (the system reader's `get_events`).
    fn seen_by_rules(root: &Path) -> Vec<f64> {
        let names = names(root);
        let (first, latest) = (names[0] * 1_000_000, names[names.len() - 1] * 1_000_000);
        let stamps: Vec<f64> = lines(root)
            .iter()
            .filter(|l| l["Type"] == "cpu")
            .map(|l| l["Timestamp"].as_f64().unwrap())
            .collect();
        let mut seen = Vec::new();
        let mut start = first;
        while start < latest {
            let end = start + 60_000_000;
            let ns = |us: i64| us as f64 * 1e3;
            seen.extend(stamps.iter().filter(|t| (ns(start)..=ns(end)).contains(&(**t * 1e9))));
            start = end;
        }
        seen
    }

    fn cpu_stamps(root: &Path) -> Vec<f64> {
        lines(root).iter().filter(|l| l["Type"] == "cpu").map(|l| l["Timestamp"].as_f64().unwrap()).collect()
    }

    #[test]
    fn a_job_inside_one_minute_ends_in_a_file_named_by_its_last_second() {
        // Ticks at …625.1 to …627.9; stopped at …628.25 (`run`: the trainer exited;
        // `agent`: a signal; both end the loop the same way).
        let clock = FakeClock::new(1_595_455_625.0, 3250);
        let (_scratch, dir) = root("short");
        let mut t = plain_ticker(&clock, &dir, 100);
        t.run(&*clock);
        assert_eq!(t.counts().ticks, 33);
        // The first file by its first line's second, the last tick alone by its own.
        assert_eq!(names(&dir), [1_595_455_625, 1_595_455_628]);
        let last = std::fs::read_to_string(dir.join("system/incremental/2020072222/1595455628.algo-1.json"))
            .unwrap();
        assert_eq!(last.lines().count(), 2);
        assert!(last.contains(r#""Timestamp":1595455628.25}"#), "{last}");
        // Every tick is in a window the rules analyse.
        let all = cpu_stamps(&dir);
        assert_eq!(all.len(), 33);
        assert_eq!(seen_by_rules(&dir), all);
    }

    #[test]
    fn the_last_tick_in_the_same_second_as_the_first_gets_a_later_name() {
        // Ticks at …625.1 to …625.7, the stop at …625.75: the first file takes the second
        // before its first line, so the newest name is still the newest.
        let clock = FakeClock::new(1_595_455_625.0, 750);
        let (_scratch, dir) = root("one-second");
        let mut t = plain_ticker(&clock, &dir, 100);
        t.run(&*clock);
        assert_eq!(names(&dir), [1_595_455_624, 1_595_455_625]);
        let all = cpu_stamps(&dir);
        assert_eq!(all.len(), 8);
        assert_eq!(seen_by_rules(&dir), all);
    }

    #[test]
    fn a_stop_just_after_a_tick_waits_for_a_measurable_stretch() {
        // The stop comes 10 ms after the tick at 300: the last tick is taken at 350.
        let clock = FakeClock::new(1_595_455_625.0, 310);
        let (_scratch, dir) = root("close-stop");
        let mut t = plain_ticker(&clock, &dir, 100);
        t.run(&*clock);
        let cpu: Vec<f64> =
            lines(&dir).iter().filter(|l| l["Type"] == "cpu").map(|l| l["Value"].as_f64().unwrap()).collect();
        assert_eq!(cpu, [100.0, 200.0, 300.0, 350.0]);
        assert_eq!(names(&dir), [1_595_455_624, 1_595_455_625]);
    }

    #[test]
    fn a_last_tick_at_the_start_of_a_window_waits_for_the_next_second() {
        // First file …610 (first line …610.8); the stop at …670.5 would name the last file
        // …670 = …610 + 60: the rules' last window would be [610, 670] and the tick at
        // 670.5 outside it. It waits for …671.0 instead.
        let clock = FakeClock::new(1_595_455_609.8, 60_700);
        let (_scratch, dir) = root("boundary");
        let mut t = plain_ticker(&clock, &dir, 1000);
        t.run(&*clock);
        assert_eq!(names(&dir), [1_595_455_610, 1_595_455_620, 1_595_455_671]);
        let all = cpu_stamps(&dir);
        assert_eq!(*all.last().unwrap(), 1_595_455_671.0);
        assert_eq!(seen_by_rules(&dir), all);
        // Elsewhere in a second, no wait: the stop at …669.7 is taken then.
        let clock = FakeClock::new(1_595_455_609.8, 59_900);
        let (_scratch, dir2) = root("no-boundary");
        let mut t = plain_ticker(&clock, &dir2, 1000);
        t.run(&*clock);
        let all = cpu_stamps(&dir2);
        assert_eq!(*all.last().unwrap(), 1_595_455_669.7);
        assert_eq!(seen_by_rules(&dir2), all);
    }

    #[test]
    fn ticks_do_not_drift_and_late_ones_are_skipped_not_queued() {
        // The minute changes 1 s in (…620).
        let clock = FakeClock::new(1_595_455_619.0, 2050);
        let (_scratch, dir) = root("drift");
        // Tick 3 takes 350 ms: deadlines 400, 500, 600 are overrun, 700 is next.
        let probe = Probe {
            clock: Arc::clone(&clock),
            slow: vec![3],
            cost: Duration::from_millis(350),
            n: 0,
            fail: vec![],
        };
        let mut t = Ticker::new(
            vec![Box::new(probe)],
            system_files(&dir, trainprof_output::node::SystemNode::new(1)),
            Duration::from_millis(100),
        );
        t.run(&*clock);
        let c = t.counts();
        let cpu: Vec<f64> =
            lines(&dir).iter().filter(|l| l["Type"] == "cpu").map(|l| l["Value"].as_f64().unwrap()).collect();
        let expected: Vec<f64> = [100, 200, 300]
            .into_iter()
            .chain((7..=20).map(|k| k * 100))
            .chain([2050])
            .map(f64::from)
            .collect();
        assert_eq!(cpu, expected);
        // …the last one at the stop.
        assert_eq!(c.ticks, 18);
        assert_eq!(c.skipped, 3);
        // Both metrics of a tick share one timestamp; the minute boundary split the files,
        // and the last tick has a file of its own.
        let all = lines(&dir);
        assert!(all.chunks(2).all(|p| p[0]["Timestamp"] == p[1]["Timestamp"]));
        assert_eq!(c.system.files_sealed, 3);
        assert_eq!(names(&dir), [1_595_455_619, 1_595_455_620, 1_595_455_621]);
        assert_eq!(c.system.lines, 36);
    }

    #[test]
    fn a_failing_sampler_is_counted_and_the_loop_goes_on() {
        let clock = FakeClock::new(1_595_455_600.0, 1050);
        let (_scratch, dir) = root("fail");
        let probe = Probe {
            clock: Arc::clone(&clock),
            slow: vec![],
            cost: Duration::ZERO,
            n: 0,
            fail: vec![2, 3, 7],
        };
        let mut t = Ticker::new(
            vec![Box::new(probe)],
            system_files(&dir, trainprof_output::node::SystemNode::new(1)),
            Duration::from_millis(100),
        );
        t.run(&*clock);
        let c = t.counts();
        assert_eq!(c.ticks, 11);
        assert_eq!(c.sample_failures, vec![("probe", 3)]);
        assert_eq!(lines(&dir).len(), 16);
    }

    #[test]
    fn a_stop_before_the_first_deadline_still_leaves_one_tick() {
        let clock = FakeClock::new(1_595_455_600.0, 5);
        let (_scratch, dir) = root("early");
        let mut t = plain_ticker(&clock, &dir, 100);
        t.run(&*clock);
        assert_eq!(t.counts().ticks, 1);
        assert_eq!(lines(&dir).len(), 2);
    }

    /// Settings that change at given (fake) times.
    struct Script(Vec<(u64, LoopSettings)>);

    impl Reconfigure for Script {
        fn poll(&mut self, mono: Duration) -> Option<LoopSettings> {
            let (at, _) = self.0.first()?;
            (Duration::from_millis(*at) <= mono).then(|| self.0.remove(0).1)
        }
    }

    #[test]
    fn a_reloaded_interval_and_disable_take_effect_at_the_next_tick() {
        // A minute starts at 0: only the pause and the stop split the files.
        let clock = FakeClock::new(1_595_455_620.0, 2050);
        let (_scratch, dir) = root("reconfigure");
        let mut t = plain_ticker(&clock, &dir, 100);
        let ms = Duration::from_millis;
        t.reconfigure_with(Box::new(Script(vec![
            (500, LoopSettings { interval: ms(200), enabled: true }),
            (1000, LoopSettings { interval: ms(200), enabled: false }),
            (1500, LoopSettings { interval: ms(200), enabled: true }),
        ])));
        t.run(&*clock);
        let cpu: Vec<f64> =
            lines(&dir).iter().filter(|l| l["Type"] == "cpu").map(|l| l["Value"].as_f64().unwrap()).collect();
        // 100 ms until 500; then every 200 ms from 500; nothing while disabled (1100,
        // 1300); again from 1500; the last tick at the stop.
        let expected: Vec<f64> =
            [100, 200, 300, 400, 500, 700, 900, 1500, 1700, 1900, 2050].map(f64::from).to_vec();
        assert_eq!(cpu, expected);
        let c = t.counts();
        assert_eq!((c.ticks, c.skipped), (11, 0));
        // The pause sealed the file written so far; the last tick has a file of its own.
        assert_eq!(c.system.files_sealed, 3);
        assert_eq!(t.interval(), ms(200));
    }

    #[test]
    fn a_stop_while_disabled_takes_no_last_tick() {
        let clock = FakeClock::new(1_595_455_620.0, 1050);
        let (_scratch, dir) = root("reconfigure-off");
        let mut t = plain_ticker(&clock, &dir, 100);
        let off = LoopSettings { interval: Duration::from_millis(100), enabled: false };
        t.reconfigure_with(Box::new(Script(vec![(300, off)])));
        t.run(&*clock);
        assert_eq!(t.counts().ticks, 2);
        assert_eq!(lines(&dir).len(), 4);
    }

    /// What a sink was handed, in order.
    #[derive(Debug, Clone, PartialEq)]
    enum Heard {
        /// The timestamp to the µs (as in the files), the number of metrics, `last`.
        Tick(f64, usize, bool),
        Pause,
        Finish,
    }

    /// A second output: records what the loop hands it.
    struct Recorder(Arc<Mutex<Vec<Heard>>>);

    impl Sink for Recorder {
        fn tick(&mut self, tick: &Tick<'_>) {
            let us = (tick.wall_s * 1e6).round() / 1e6;
            self.0.lock().unwrap().push(Heard::Tick(us, tick.metrics.len(), tick.last));
        }
        fn pause(&mut self) {
            self.0.lock().unwrap().push(Heard::Pause);
        }
        fn finish(&mut self) {
            self.0.lock().unwrap().push(Heard::Finish);
        }
    }

    /// A ticker with the plain probe, the system files under `dir` and a recorder.
    fn two_sinks(clock: &Arc<FakeClock>, dir: &Path) -> (Ticker, Arc<Mutex<Vec<Heard>>>) {
        let heard = Arc::new(Mutex::new(Vec::new()));
        let probe =
            Probe { clock: Arc::clone(clock), slow: vec![], cost: Duration::ZERO, n: 0, fail: vec![] };
        let mut sinks = system_files(dir, trainprof_output::node::SystemNode::new(1));
        sinks.push(Box::new(Recorder(Arc::clone(&heard))));
        (Ticker::new(vec![Box::new(probe)], sinks, Duration::from_millis(100)), heard)
    }

    #[test]
    fn a_second_sink_hears_every_tick_the_system_files_get() {
        let clock = FakeClock::new(1_595_455_620.0, 1050);
        let (_scratch, dir) = root("two-sinks");
        let (mut t, heard) = two_sinks(&clock, &dir);
        let ms = Duration::from_millis;
        t.reconfigure_with(Box::new(Script(vec![
            (300, LoopSettings { interval: ms(100), enabled: false }),
            (600, LoopSettings { interval: ms(100), enabled: true }),
        ])));
        t.run(&*clock);
        let heard = heard.lock().unwrap().clone();
        // The same ticks, with the same timestamps, as the files hold; the pause between
        // them; the last tick flagged; the finish after it.
        let stamps: Vec<f64> = cpu_stamps(&dir);
        let ticks: Vec<f64> = heard
            .iter()
            .filter_map(|h| match h {
                Heard::Tick(ts, 2, _) => Some(*ts),
                _ => None,
            })
            .collect();
        assert_eq!(ticks, stamps);
        let wall = |ms: u64| 1_595_455_620.0 + ms as f64 / 1e3;
        let mut expected =
            vec![Heard::Tick(wall(100), 2, false), Heard::Tick(wall(200), 2, false), Heard::Pause];
        expected.extend((6..=10).map(|k| Heard::Tick(wall(k * 100), 2, false)));
        expected.extend([Heard::Tick(wall(1050), 2, true), Heard::Finish]);
        assert_eq!(heard, expected);
    }

    #[test]
    fn a_sink_that_cannot_write_stops_neither_the_loop_nor_another_sink() {
        let clock = FakeClock::new(1_595_455_620.0, 550);
        let scratch = tempfile::tempdir().unwrap();
        // The system files' root is under a regular file: every write fails.
        let file = scratch.path().join("a-file");
        std::fs::write(&file, b"").unwrap();
        let (mut t, heard) = two_sinks(&clock, &file.join("root"));
        t.run(&*clock);
        let c = t.counts();
        assert_eq!((c.ticks, c.system.ticks_lost, c.system.lines), (6, 6, 0));
        let heard = heard.lock().unwrap();
        assert_eq!(heard.iter().filter(|h| matches!(h, Heard::Tick(..))).count(), 6);
        assert_eq!(heard.last(), Some(&Heard::Finish));
    }

    #[test]
    fn a_stop_request_wakes_the_real_clock_at_once() {
        let stop = Stop::new();
        let clock = SystemClock::new(stop.clone());
        let waker = std::thread::spawn({
            let stop = stop.clone();
            move || {
                std::thread::sleep(Duration::from_millis(50));
                stop.request();
            }
        });
        let t0 = Instant::now();
        assert!(clock.wait_until(Duration::from_secs(600)));
        assert!(t0.elapsed() < Duration::from_secs(60));
        waker.join().unwrap();
        assert!(stop.requested());
        assert!(!SystemClock::new(Stop::new()).wait_until(Duration::ZERO));
    }
}
