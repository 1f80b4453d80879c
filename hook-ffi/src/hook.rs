//! The hook's state: one [`Hook`] per process (the C ABI keeps it in a global; tests make
//! their own).
//!
//! Threads and what they touch:
//!
//! * the trainer's threads record events (hot path: two atomic loads and one push into a
//!   bounded lock-free [`ArrayQueue`]; when it is full the event is dropped and counted),
//!   begin and end steps (atomics), and ask about windows (the `gate` mutex, which only
//!   trainer threads ever lock);
//! * one writer thread, started by [`Hook::spawn_writer`], pops events and writes the
//!   timeline files, re-reads the config at most once a second, and hands a changed config
//!   over through `pending`; a trainer thread takes it with `try_lock` at the next step
//!   boundary, so it never waits for the writer (the loop is in [`crate::writer_thread`]).
//!
//! The name table is [`crate::names`], the counters [`crate::stats`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};

use crossbeam_queue::ArrayQueue;
use trainprof_config::{AutoFeature, Config, Range, Step};

use crate::anomaly::{Detector, StepEnd, Trigger};
use crate::event::{Event, Kind, NO_STEP};
use crate::lock;
use crate::names::Names;
use crate::python::{self, Outcome, Position};
use crate::stats::{Counters, ShardedCounter, Stats};
use crate::types::{
    TRAINPROF_MAX_ARGS, TRAINPROF_NAME_OVER_LIMIT, TrainprofArg, TrainprofBoundary, TrainprofFeature,
    TrainprofMode, TrainprofStatus,
};
use crate::writer;

/// The phase and name of a capped window's instant event (docs/formats.md, "Window caps").
pub use trainprof_output::protocol::timeline::{CAPPED_NAME, CAPPED_PHASE};
/// The phase and name of an on-demand window's instant event (docs/formats.md, "On-demand
/// windows (`trainprof trigger`)").
pub use trainprof_output::protocol::timeline::{REQUESTED_NAME, REQUESTED_PHASE};
/// The phase (trace process) and name of a trigger's instant event (docs/formats.md,
/// "Event vocabulary"), the protocol's: the report finds triggers by them.
pub use trainprof_output::protocol::timeline::{TRIGGER_NAME, TRIGGER_PHASE};

/// The frameworks smdebug names folders after.
pub const FRAMEWORKS: [&str; 4] = ["pytorch", "tensorflow", "mxnet", "xgboost"];

/// Everything needed to make a [`Hook`].
#[derive(Debug)]
pub struct Options {
    /// One of [`FRAMEWORKS`].
    pub framework: &'static str,
    pub config: Config,
    pub node_id: String,
    pub os_pid: u32,
    pub queue_capacity: usize,
    /// The writer's base time (µs since the epoch).
    pub base_us: i64,
    /// `LocalPath` was given by `TRAINPROF_LOCAL_PATH`: record even without a
    /// `ProfilingParameters` section (see [`records`]).
    pub local_path_override: bool,
    /// Distinct names the table takes (the step names included); further names get
    /// [`TRAINPROF_NAME_OVER_LIMIT`].
    pub max_names: usize,
}

/// Whether the hook records under `config`: profiling is on, and the framework side is
/// configured (`ProfilingParameters`, as smdebug requires) or the user named an output
/// folder explicitly.
pub fn records(config: &Config, local_path_override: bool) -> bool {
    config.enabled && (config.framework_configured || local_path_override)
}

/// The trainer-side window state. Only trainer threads lock it.
pub(crate) struct Gate {
    pub(crate) config: Config,
    pub(crate) python: python::Windows,
    /// `AutoProfilingConfig`'s detector, while it is on: its triggered window is an extra
    /// step range for each feature it names, consulted wherever a window is evaluated.
    pub(crate) auto: Option<Detector>,
    /// A window `trainprof trigger` armed ([`crate::request`]): another extra step range
    /// per feature, consulted like the detector's.
    pub(crate) requested: Option<crate::request::slot::Requested>,
    /// Per feature (in `AutoFeature::ALL` order), the step its window stopped at its cap
    /// (docs/formats.md, "Window caps"): until that window closes, it answers no. Cleared at
    /// the first question the window itself answers no to.
    pub(crate) capped: [Option<u64>; 4],
}

impl Gate {
    fn new(config: Config) -> Gate {
        let auto = config.auto.is_enabled().then(|| Detector::new(&config.auto));
        Gate { config, python: python::Windows::default(), auto, requested: None, capped: [None; 4] }
    }

    /// A new config from a reload: the detector keeps what it learnt unless auto
    /// profiling was switched off.
    fn set_config(&mut self, config: Config) {
        self.auto = match (self.auto.take(), config.auto.is_enabled()) {
            (_, false) => None,
            (None, true) => Some(Detector::new(&config.auto)),
            (Some(mut d), true) => {
                d.reconfigure(&config.auto);
                Some(d)
            }
        };
        self.config = config;
    }

    /// Does a triggered window open `feature` at `step`?
    fn auto_opens(&self, feature: AutoFeature, step: u64) -> bool {
        self.auto.as_ref().is_some_and(|d| d.opens(feature, step))
    }

    /// Does a triggered or a requested window open `feature` at `step`?
    fn extra_opens(&self, feature: AutoFeature, step: u64) -> bool {
        self.auto_opens(feature, step) || self.requested.as_ref().is_some_and(|r| r.opens(feature, step))
    }

    /// Is `step` inside a requested window (of any feature)?
    fn in_requested(&self, step: u64) -> bool {
        self.requested.as_ref().is_some_and(|r| r.contains(step))
    }

    /// Was a configured window (any feature) open at `step` / `now_s`, as resolved so far?
    fn configured_open(&self, step: u64, now_s: f64) -> bool {
        let c = &self.config;
        [
            &c.detailed,
            &c.dataloader.feature,
            &c.python.feature,
            &c.smdataparallel,
            &c.native.feature,
            &c.memory.feature,
        ]
        .into_iter()
        .any(|f| f.is_open_at(step, now_s))
    }
}

struct Steps {
    /// The current mode (`TrainprofMode` as i32), 0 before the first step.
    mode: AtomicI32,
    /// The current step of the current mode, [`NO_STEP`] before the first step.
    step: AtomicI64,
    begin_us: AtomicI64,
    in_step: AtomicBool,
    /// The next step number of each mode, when the caller does not give one.
    next: [AtomicI64; 4],
    /// The global step: `step_begin` calls of every mode, counted from 0 ([`NO_STEP`]
    /// before the first), as smdebug's PyTorch hook counts `hook.step`; a step number the
    /// caller gives sets it.
    global: AtomicI64,
}

/// Which step number the windows are tested at, as smdebug tests them (docs/trainer.md,
/// "Behaviour to know"): its PyTorch hook at the global step (`hook.step`, every mode counted
/// together), its TensorFlow (Keras) hook at the mode's own step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowStep {
    Global,
    PerMode,
}

impl WindowStep {
    pub fn for_framework(framework: &str) -> WindowStep {
        if framework == "pytorch" { WindowStep::Global } else { WindowStep::PerMode }
    }
}

/// A capped feature's place in [`Gate::capped`] (`AutoFeature::ALL` order); SMDataParallel
/// has no window of its own to cap.
fn cap_index(feature: TrainprofFeature) -> Option<usize> {
    match feature {
        TrainprofFeature::Detailed => Some(0),
        TrainprofFeature::Dataloader => Some(1),
        TrainprofFeature::Python => Some(2),
        TrainprofFeature::Native => Some(3),
        TrainprofFeature::Smdataparallel | TrainprofFeature::Memory => None,
    }
}

/// The hook. See the module docs for who touches what.
pub struct Hook {
    pub(crate) queue: ArrayQueue<Event>,
    /// Pushes under way (see [`Hook::push`]).
    pub(crate) in_flight: ShardedCounter,
    pub(crate) counters: Counters,
    pub(crate) names: Names,
    pub(crate) enabled: AtomicBool,
    local_path_override: bool,
    steps: Steps,
    pub(crate) gate: Mutex<Gate>,
    /// Native sampling: the decisions the sampler thread acts on ([`crate::native`]).
    pub(crate) native: crate::native::Control,
    /// `AutoProfilingConfig` is on: train step ends go to the detector (one relaxed load
    /// otherwise).
    auto_on: AtomicBool,
    /// A config the writer reloaded, for the next step boundary.
    pub(crate) pending: Mutex<Option<Box<Config>>>,
    framework: &'static str,
    window_step: WindowStep,
    /// `LocalPath`, the node id, the pid and the rotation limits the writer starts with.
    pub(crate) writer: writer::Settings,
    /// The writer's base time (µs since the epoch).
    pub(crate) base_us: i64,
    pub(crate) stop: AtomicBool,
    pub(crate) finished: (Mutex<bool>, Condvar),
    /// The native sampler thread, once started (only the writer thread touches it).
    pub(crate) native_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub(crate) native_spawn_failed: AtomicBool,
    /// The profiler's own work off the trainer's threads, which no train step is judged by.
    own_work: OwnWork,
    /// `HangDetectionConfig`, read at start (a reload does not change it): the step ring
    /// and what the watchdog needs ([`crate::hang`]).
    pub(crate) hang: Option<Box<crate::hang::Hang>>,
    /// On-demand windows: what the writer asks of the next step boundary ([`crate::request`]).
    pub(crate) requests: crate::request::slot::Slot,
    /// torch.profiler's traces made for detailed windows and handed back to the writer
    /// ([`crate::torch_trace`]).
    pub(crate) traces: crate::torch_trace::Traces,
}

/// The profiler's own work off the trainer's threads (a native window's report: 0.1–1 s of
/// symbolising): how much runs now and when the last ended, so that a train step that
/// overlapped it is left out of `AutoProfilingConfig`'s median and judgement.
#[derive(Debug, Default)]
struct OwnWork {
    running: AtomicU32,
    last_end_us: AtomicI64,
}

/// Marks the profiler's own work from [`Hook::own_work`] until dropped.
#[must_use]
pub(crate) struct OwnWorkGuard<'a>(&'a OwnWork);

impl Drop for OwnWorkGuard<'_> {
    fn drop(&mut self) {
        self.0.last_end_us.fetch_max(now_us(), SeqCst);
        self.0.running.fetch_sub(1, SeqCst);
    }
}

/// The native sampler thread sees the hook through this ([`crate::native`]).
impl crate::native::Host for Hook {
    fn control(&self) -> &crate::native::Control {
        &self.native
    }

    fn stopping(&self) -> bool {
        self.stop.load(SeqCst)
    }

    fn by_clock(&self, now_s: f64) -> Option<bool> {
        self.native_by_clock(now_s)
    }

    fn own_work(&self) -> impl Sized + '_ {
        Hook::own_work(self)
    }

    fn local_path(&self) -> &std::path::Path {
        Hook::local_path(self)
    }

    fn node_id(&self) -> &str {
        Hook::node_id(self)
    }

    fn os_pid(&self) -> u32 {
        self.writer.os_pid
    }

    fn capped(&self, samples: u64, limit: u64) {
        let cap = crate::types::TrainprofCap::Samples;
        self.window_capped(TrainprofFeature::Native, cap, samples, limit, -1, now_us());
    }
}

/// The flight recorder sees the hook through this ([`crate::hang`]). What the crash handler
/// calls (`hang`, `step_state`, `node_id`, `os_pid`, `is_enabled`) reads fields and atomics
/// only: no lock, no allocation.
impl crate::hang::Host for Hook {
    fn hang(&self) -> Option<&crate::hang::Hang> {
        self.hang.as_deref()
    }

    fn step_state(&self) -> crate::hang::StepState {
        Hook::step_state(self)
    }

    fn open_windows(&self, step: u64, now_s: f64) -> Vec<&'static str> {
        Hook::open_windows(self, step, now_s)
    }

    fn own_work(&self) -> Box<dyn Send + '_> {
        Box::new(Hook::own_work(self))
    }

    fn local_path(&self) -> &std::path::Path {
        Hook::local_path(self)
    }

    fn node_id(&self) -> &str {
        Hook::node_id(self)
    }

    fn os_pid(&self) -> u32 {
        self.writer.os_pid
    }

    fn is_enabled(&self) -> bool {
        Hook::is_enabled(self)
    }

    fn stats(&self) -> Stats {
        Hook::stats(self)
    }

    fn names(&self, names: &mut Vec<Arc<str>>) {
        self.names.copy_new(names);
    }
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hook")
            .field("framework", &self.framework)
            .field("writer", &self.writer)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

pub use crate::{now_us, now_us_f64};

impl Hook {
    pub fn new(o: Options) -> Arc<Hook> {
        let c = &o.config;
        let writer = writer::Settings {
            root: c.local_path().to_path_buf(),
            node_id: o.node_id,
            os_pid: o.os_pid,
            rotate_max_bytes: c.rotate_max_file_size,
            rotate_interval_us: writer::interval_us(c.rotate_close_interval_s),
            file_open_fail_threshold: c.file_open_fail_threshold,
        };
        Arc::new(Hook {
            queue: ArrayQueue::new(o.queue_capacity.max(1)),
            in_flight: ShardedCounter::default(),
            counters: Counters::default(),
            // The step names take the first ids (TrainprofMode::step_name_id).
            names: Names::new(TrainprofMode::ALL.map(TrainprofMode::step_phase), o.max_names),
            enabled: AtomicBool::new(records(c, o.local_path_override)),
            local_path_override: o.local_path_override,
            steps: Steps {
                mode: AtomicI32::new(0),
                step: AtomicI64::new(NO_STEP),
                begin_us: AtomicI64::new(0),
                in_step: AtomicBool::new(false),
                next: Default::default(),
                global: AtomicI64::new(NO_STEP),
            },
            framework: o.framework,
            window_step: WindowStep::for_framework(o.framework),
            writer,
            base_us: o.base_us,
            native: crate::native::Control::new(&o.config),
            auto_on: AtomicBool::new(o.config.auto.is_enabled()),
            gate: Mutex::new(Gate::new(o.config.clone())),
            pending: Mutex::new(None),
            stop: AtomicBool::new(false),
            finished: (Mutex::new(false), Condvar::new()),
            native_thread: Mutex::new(None),
            native_spawn_failed: AtomicBool::new(false),
            own_work: OwnWork::default(),
            hang: o.config.hang.is_enabled().then(|| Box::new(crate::hang::Hang::new(o.config.hang.clone()))),
            requests: crate::request::slot::Slot::default(),
            traces: crate::torch_trace::Traces::default(),
        })
    }

    /// Marks the profiler's own work off the trainer's threads until the guard drops: train
    /// steps it overlaps are not judged (docs/formats.md, "Anomaly-triggered windows").
    pub(crate) fn own_work(&self) -> OwnWorkGuard<'_> {
        self.own_work.running.fetch_add(1, SeqCst);
        OwnWorkGuard(&self.own_work)
    }

    /// Did the profiler's own work run at any time since `since_us`?
    fn own_work_since(&self, since_us: i64) -> bool {
        self.own_work.running.load(SeqCst) > 0 || self.own_work.last_end_us.load(SeqCst) > since_us
    }

    pub fn node_id(&self) -> &str {
        &self.writer.node_id
    }

    /// One of [`FRAMEWORKS`].
    pub fn framework(&self) -> &'static str {
        self.framework
    }

    /// The native sampler thread's own question ([`crate::native::Host::by_clock`]).
    pub(crate) fn native_by_clock(&self, now_s: f64) -> Option<bool> {
        let mut gate = self.gate.try_lock().ok()?;
        let native = &mut gate.config.native;
        match native.feature.window().range() {
            Range::Time { duration: Some(_), .. } if native.feature.is_enabled() => {
                Some(native.feature.is_active(Step::Any, now_s))
            }
            _ => None,
        }
    }

    /// `MemoryProfilingConfig` as the config now says (docs/formats.md, "Memory windows").
    pub fn memory_settings(&self) -> trainprof_config::MemoryFeature {
        lock(&self.gate).config.memory.clone()
    }

    /// The effective `LocalPath` (the config's, or `TRAINPROF_LOCAL_PATH`), fixed at init.
    pub fn local_path(&self) -> &std::path::Path {
        &self.writer.root
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// Registers `name` (idempotent) and returns its id; [`TRAINPROF_NAME_OVER_LIMIT`] when
    /// the table is full (see [`Names::register`]).
    pub fn register_name(&self, name: &str) -> u32 {
        self.names.register(name)
    }

    /// Names registered so far (the step names included).
    pub fn name_count(&self) -> usize {
        self.names.count()
    }

    fn valid_id(&self, id: u32) -> bool {
        self.names.valid(id)
    }

    /// Not on the hot path: only for an event refused for its ids. An event that uses an
    /// over-limit name (and no id that is simply wrong) is dropped and counted.
    fn refuse(&self, ids: impl IntoIterator<Item = u32>) -> TrainprofStatus {
        let mut over = false;
        for id in ids {
            if id == TRAINPROF_NAME_OVER_LIMIT {
                over = true;
            } else if !self.valid_id(id) {
                return TrainprofStatus::InvalidArgument;
            }
        }
        if !over {
            return TrainprofStatus::InvalidArgument;
        }
        self.counters.dropped_names.add_one();
        TrainprofStatus::Dropped
    }

    /// The hot path: queues one complete event, or drops and counts it.
    pub fn record(
        &self,
        phase: u32,
        name: u32,
        start_us: i64,
        end_us: i64,
        step: i64,
        args: &[TrainprofArg],
    ) -> TrainprofStatus {
        if !self.enabled.load(Relaxed) {
            return TrainprofStatus::Disabled;
        }
        if end_us < start_us || args.len() > TRAINPROF_MAX_ARGS {
            return TrainprofStatus::InvalidArgument;
        }
        if !self.valid_id(phase) || !self.valid_id(name) || args.iter().any(|a| !self.valid_id(a.key)) {
            if args.iter().any(|a| !(0..=2).contains(&a.kind)) {
                return TrainprofStatus::InvalidArgument;
            }
            return self.refuse([phase, name].into_iter().chain(args.iter().map(|a| a.key)));
        }
        let mut ev = Event {
            kind: Kind::Complete,
            phase,
            name,
            start_us,
            end_us,
            step: if step < 0 { self.steps.step.load(Relaxed) } else { step },
            n_args: args.len() as u8,
            args: [TrainprofArg::EMPTY; TRAINPROF_MAX_ARGS],
        };
        for (slot, a) in ev.args.iter_mut().zip(args) {
            if !self.valid_id(a.key) || !(0..=2).contains(&a.kind) {
                return TrainprofStatus::InvalidArgument;
            }
            *slot = *a;
        }
        if let Some(h) = &self.hang {
            h.events.push_event(phase, name, start_us, end_us, ev.step);
        }
        self.push(ev)
    }

    fn push(&self, ev: Event) -> TrainprofStatus {
        // In flight from here to the end: the writer's final drain waits until no push is
        // in flight, and a push that starts after the stop is refused. `stop` and the
        // in-flight counts are SeqCst, so one of the two always sees the other: every OK
        // event is written, and no event is taken back.
        let slot = ShardedCounter::slot();
        self.in_flight.at(slot).fetch_add(1, SeqCst);
        let status = if self.stop.load(SeqCst) {
            TrainprofStatus::ShutDown
        } else {
            match self.queue.push(ev) {
                Ok(()) => TrainprofStatus::Ok,
                Err(_) => {
                    self.counters.dropped_full.at(slot).fetch_add(1, Relaxed);
                    TrainprofStatus::Dropped
                }
            }
        };
        self.in_flight.at(slot).fetch_sub(1, SeqCst);
        status
    }

    /// Begins a step of `mode`: `step` if it is ≥ 0, else the next of that mode (from 0).
    /// The global step goes up by one whatever the mode, or is `step` when the caller
    /// numbers the step (a trainer that numbers its steps, e.g. one that resumes at step
    /// 1000, numbers the global count too). Takes a reloaded config, if the writer has one
    /// ready.
    pub fn step_begin(&self, mode: TrainprofMode, step: i64, now_us: i64) -> u64 {
        self.take_pending();
        let n = if step >= 0 { step } else { self.steps.next[mode.index()].load(Relaxed) };
        self.steps.next[mode.index()].store(n.saturating_add(1), Relaxed);
        self.steps.mode.store(mode as i32, Relaxed);
        self.steps.step.store(n, Relaxed);
        let g = match self.steps.global.load(Relaxed) {
            _ if step >= 0 => step,
            g if g < 0 => 0,
            g => g.saturating_add(1),
        };
        self.steps.global.store(g, Relaxed);
        self.steps.begin_us.store(now_us, Relaxed);
        self.steps.in_step.store(true, Release);
        if let Some(h) = &self.hang {
            h.ring.push(crate::hang::What::StepStart, mode, n, now_us);
        }
        // Two relaxed loads while no `trainprof trigger` request is in flight or armed.
        if self.requests.due.load(Relaxed) || self.requests.armed.load(Relaxed) {
            self.requests_at_step(self.window_step().unwrap_or(0), now_us);
        }
        if self.native.asks() {
            // One uncontended gate lock per step, only while native sampling is configured.
            let open = self.is_active(TrainprofFeature::Native, -1, None, now_us as f64 / 1e6);
            self.native.set_by_step(open);
        }
        n as u64
    }

    /// Ends the current step and records its `Step:ModeKeys.<MODE>` event.
    pub fn step_end(&self, now_us: i64) -> TrainprofStatus {
        if !self.steps.in_step.swap(false, AcqRel) {
            return TrainprofStatus::NoStep;
        }
        let Some(mode) = TrainprofMode::from_i32(self.steps.mode.load(Relaxed)) else {
            return TrainprofStatus::NoStep;
        };
        let begin = self.steps.begin_us.load(Relaxed);
        let id = mode.step_name_id();
        let end = now_us.max(begin);
        let step = self.steps.step.load(Relaxed);
        if let Some(h) = &self.hang {
            h.ring.push(crate::hang::What::StepEnd, mode, step, end);
        }
        let status = self.record(id, id, begin, end, step, &[]);
        if self.auto_on.load(Relaxed)
            && matches!(mode, TrainprofMode::Train | TrainprofMode::Global)
            && self.enabled.load(Relaxed)
        {
            self.auto_step_end(begin, end);
        }
        status
    }

    /// A train step ended: the detector sees it and may open a window from the next step,
    /// recorded as an instant event and one log line (docs/formats.md, "Anomaly-triggered
    /// windows").
    fn auto_step_end(&self, begin_us: i64, end_us: i64) {
        let step = self.window_step().unwrap_or(0);
        let own_work = self.own_work_since(begin_us);
        let trigger = {
            let mut gate = lock(&self.gate);
            // Open at the step's start or its end: a window by time may end mid-step.
            let in_configured_window = gate.configured_open(step, begin_us as f64 / 1e6)
                || gate.configured_open(step, end_us as f64 / 1e6)
                || gate.in_requested(step);
            let Some(d) = gate.auto.as_mut() else { return };
            let duration_us = end_us.saturating_sub(begin_us);
            d.step_end(StepEnd { step, duration_us, end_us, in_configured_window, own_work })
        };
        if let Some(t) = trigger {
            self.record_trigger(&t);
        }
    }

    /// Not on the hot path: a trigger is rare (`MaxPerHour`).
    fn record_trigger(&self, t: &Trigger) {
        let features: Vec<&str> = t.features.iter().map(AutoFeature::as_str).collect();
        let skipped = match t.skipped {
            0 => String::new(),
            n => format!("; {n} slower steps before it were not profiled (MaxPerHour)"),
        };
        crate::log(&format_args!(
            "auto profiling: step {} took {:.1} ms, {:.1}x the median {:.1} ms: {} for steps {}..={}{skipped}",
            t.step,
            t.duration_us as f64 / 1000.0,
            t.duration_us as f64 / (t.median_us.max(1) as f64),
            t.median_us as f64 / 1000.0,
            features.join(", "),
            t.window_start,
            t.window_start.saturating_add(t.num_steps).saturating_sub(1),
        ));
        let (phase, name) = (self.names.register(TRIGGER_PHASE), self.names.register(TRIGGER_NAME));
        if phase == TRAINPROF_NAME_OVER_LIMIT || name == TRAINPROF_NAME_OVER_LIMIT {
            self.counters.dropped_names.add_one();
            return;
        }
        let _ = self.push(Event::trigger(t, phase, name, self.steps.step.load(Relaxed)));
    }

    /// A requested window opens at this step: one instant event and one log line
    /// (docs/formats.md, "On-demand windows (`trainprof trigger`)"). Rare: one per request.
    pub(crate) fn record_requested(&self, r: &crate::request::slot::Requested, now_us: i64) {
        let features: Vec<&str> = r.features.iter().map(AutoFeature::as_str).collect();
        crate::log(&format_args!(
            "trainprof trigger {}: {} for steps {}..={}",
            r.id,
            features.join(", "),
            r.start,
            r.end.saturating_sub(1)
        ));
        let ids = [REQUESTED_PHASE, REQUESTED_NAME, &r.id].map(|n| self.names.register(n));
        if ids.contains(&TRAINPROF_NAME_OVER_LIMIT) {
            self.counters.dropped_names.add_one();
            return;
        }
        let info = crate::event::RequestedInfo {
            window_start: r.start,
            num_steps: r.end.saturating_sub(r.start),
            requested_us: r.requested_us,
            id_name: ids[2],
            features: r.features,
        };
        let _ = self.push(Event::requested(&info, ids[0], ids[1], self.steps.step.load(Relaxed), now_us));
    }

    fn position(&self) -> Position {
        let mode = TrainprofMode::from_i32(self.steps.mode.load(Relaxed)).unwrap_or(TrainprofMode::Train);
        Position {
            mode: mode.python_name(),
            step: self.window_step().unwrap_or(0),
            pytorch: self.framework == "pytorch",
        }
    }

    /// The step state the watchdog judges ([`crate::hang`]): the atomics the step calls
    /// store anyway.
    pub fn step_state(&self) -> crate::hang::StepState {
        crate::hang::StepState {
            in_step: self.steps.in_step.load(Acquire),
            mode: TrainprofMode::from_i32(self.steps.mode.load(Relaxed)),
            step: self.steps.step.load(Relaxed),
            begin_us: self.steps.begin_us.load(Relaxed),
        }
    }

    /// The features whose window is open at `step` / `now_s` (as resolved so far); empty
    /// when the gate is busy (the watchdog never waits for it).
    pub(crate) fn open_windows(&self, step: u64, now_s: f64) -> Vec<&'static str> {
        let Ok(gate) = self.gate.try_lock() else { return Vec::new() };
        let c = &gate.config;
        [
            ("detailed", &c.detailed),
            ("dataloader", &c.dataloader.feature),
            ("python", &c.python.feature),
            ("smdataparallel", &c.smdataparallel),
            ("native", &c.native.feature),
            ("memory", &c.memory.feature),
        ]
        .into_iter()
        .filter(|(_, f)| f.is_open_at(step, now_s))
        .map(|(n, _)| n)
        .collect()
    }

    /// The current step of the current mode, or `None` before the first.
    pub fn current_step(&self) -> Option<u64> {
        u64::try_from(self.steps.step.load(Relaxed)).ok()
    }

    /// The global step (every mode counted together, from 0), or `None` before the first.
    pub fn global_step(&self) -> Option<u64> {
        u64::try_from(self.steps.global.load(Relaxed)).ok()
    }

    /// The step the windows are tested at (see [`WindowStep`]), or `None` before the first.
    pub fn window_step(&self) -> Option<u64> {
        match self.window_step {
            WindowStep::Global => self.global_step(),
            WindowStep::PerMode => self.current_step(),
        }
    }

    fn take_pending(&self) {
        let new = match self.pending.try_lock() {
            Ok(mut slot) => slot.take(),
            Err(_) => None,
        };
        if let Some(config) = new {
            self.enabled.store(records(&config, self.local_path_override), Relaxed);
            self.native.configure(&config);
            self.auto_on.store(config.auto.is_enabled(), Relaxed);
            let mut gate = lock(&self.gate);
            gate.set_config(*config);
        }
    }

    /// Is `feature`'s window open at `step` (< 0: the current [`Hook::window_step`])? `name`
    /// is the metrics name for the dataloader feature.
    pub fn is_active(&self, feature: TrainprofFeature, step: i64, name: Option<&str>, now_s: f64) -> bool {
        if !self.enabled.load(Relaxed) {
            return false;
        }
        let step = if step >= 0 { step as u64 } else { self.window_step().unwrap_or(0) };
        let at = Step::At(step);
        let mut gate = lock(&self.gate);
        // The configured window first (its question may resolve it, as without triggers),
        // then a triggered one (docs/formats.md, "Anomaly-triggered windows").
        let configured = {
            let c = &mut gate.config;
            match feature {
                TrainprofFeature::Detailed => c.detailed.is_active(at, now_s),
                TrainprofFeature::Dataloader => c.dataloader.is_active_for(name.unwrap_or(""), at, now_s),
                TrainprofFeature::Python => c.python.feature.is_active(at, now_s),
                TrainprofFeature::Smdataparallel => c.smdataparallel.is_active(at, now_s),
                TrainprofFeature::Native => c.native.feature.is_active(at, now_s),
                TrainprofFeature::Memory => c.memory.feature.is_active(at, now_s),
            }
        };
        let open = configured || {
            let c = &gate.config;
            match feature {
                TrainprofFeature::Detailed => {
                    c.detailed.may_auto_open() && gate.extra_opens(AutoFeature::Detailed, step)
                }
                TrainprofFeature::Dataloader => {
                    c.dataloader.feature.may_auto_open()
                        && c.dataloader.auto_matches(name.unwrap_or(""))
                        && gate.extra_opens(AutoFeature::Dataloader, step)
                }
                TrainprofFeature::Python => {
                    c.python.feature.may_auto_open() && gate.extra_opens(AutoFeature::Python, step)
                }
                TrainprofFeature::Smdataparallel => false,
                TrainprofFeature::Native => {
                    c.native.feature.may_auto_open() && gate.extra_opens(AutoFeature::Native, step)
                }
                TrainprofFeature::Memory => {
                    c.memory.feature.may_auto_open() && gate.extra_opens(AutoFeature::Memory, step)
                }
            }
        };
        let Some(i) = cap_index(feature) else { return open };
        if gate.capped[i].is_none() {
            return open;
        }
        // A capped window answers no until it closes; the dataloader's is open whatever the
        // name asked about (a name its regex does not match does not close it).
        let window_open = match feature {
            TrainprofFeature::Dataloader => {
                gate.config.dataloader.feature.is_open_at(step, now_s)
                    || (gate.config.dataloader.feature.may_auto_open()
                        && gate.extra_opens(AutoFeature::Dataloader, step))
            }
            _ => open,
        };
        if !window_open {
            gate.capped[i] = None;
        }
        false
    }

    /// Does a triggered or requested window (not the configured one) open the memory
    /// feature at `step` (< 0: the current [`Hook::window_step`])? The PyTorch adapter learns
    /// it from `trainprof_step_next` (docs/formats.md, "Memory windows"): while neither an
    /// `AutoProfilingConfig` detector runs nor a requested window is armed, two relaxed loads
    /// and no lock.
    pub fn extra_memory_open(&self, step: i64) -> bool {
        if !self.requests.armed.load(Relaxed) && !self.auto_on.load(Relaxed) {
            return false;
        }
        if !self.enabled.load(Relaxed) {
            return false;
        }
        let step = if step >= 0 { step as u64 } else { self.window_step().unwrap_or(0) };
        let gate = lock(&self.gate);
        gate.config.memory.feature.may_auto_open() && gate.extra_opens(AutoFeature::Memory, step)
    }

    #[cfg(test)]
    fn lock_gate_capped(&self) -> [Option<u64>; 4] {
        lock(&self.gate).capped
    }

    /// The caps of every window (`WindowCapsConfig`), as the config now says.
    pub fn window_caps(&self) -> trainprof_config::WindowCaps {
        lock(&self.gate).config.caps
    }

    /// A window stopped at its cap at `step` (< 0: the current window step;
    /// docs/formats.md, "Window caps"): `feature`'s window answers no for the rest of its
    /// steps, and one instant event and one log line say so.
    /// Once per window: a second call while it is capped changes nothing (`Dropped`).
    pub fn window_capped(
        &self,
        feature: TrainprofFeature,
        cap: crate::types::TrainprofCap,
        value: u64,
        limit: u64,
        step: i64,
        now_us: i64,
    ) -> TrainprofStatus {
        if !self.enabled.load(Relaxed) {
            return TrainprofStatus::Disabled;
        }
        let Some(i) = cap_index(feature) else { return TrainprofStatus::InvalidArgument };
        let step = u64::try_from(step).ok().or_else(|| self.window_step()).unwrap_or(0);
        {
            let mut gate = lock(&self.gate);
            if gate.capped[i].is_some() {
                return TrainprofStatus::Dropped;
            }
            gate.capped[i] = Some(step);
            if i == 2 {
                gate.python.capped = true;
            }
        }
        let info = crate::event::CappedInfo { feature: AutoFeature::ALL[i], cap, step, value, limit };
        match self.capped_event(info, now_us) {
            Some(ev) => self.push(ev),
            None => TrainprofStatus::Dropped,
        }
    }

    /// A window that ended already reached its cap while its events were written after it
    /// (a detailed window's trace, written by the writer thread): the log line of
    /// [`Hook::window_capped`] and its instant event, returned for the writer to write (a
    /// queued one would be refused once the hook stops), without closing a window (the next
    /// one opens as usual). `step`: the step of the first event left out.
    pub(crate) fn capped_after_window(
        &self,
        feature: AutoFeature,
        cap: crate::types::TrainprofCap,
        value: u64,
        limit: u64,
        step: i64,
        now_us: i64,
    ) -> Option<Event> {
        let step = u64::try_from(step).unwrap_or(0);
        self.capped_event(crate::event::CappedInfo { feature, cap, step, value, limit }, now_us)
    }

    /// Logs a capped window and makes its instant event (None when its names do not fit the
    /// name table: counted).
    fn capped_event(&self, info: crate::event::CappedInfo, now_us: i64) -> Option<Event> {
        let crate::event::CappedInfo { cap, step, value, limit, .. } = info;
        crate::log(&format_args!(
            "the {} window stopped at its cap at step {step}: {value} {} (cap {limit}, WindowCapsConfig); \
             its later steps are not profiled",
            info.feature.as_str(),
            cap.word(),
        ));
        let (phase, name) = (self.names.register(CAPPED_PHASE), self.names.register(CAPPED_NAME));
        if phase == TRAINPROF_NAME_OVER_LIMIT || name == TRAINPROF_NAME_OVER_LIMIT {
            self.counters.dropped_names.add_one();
            return None;
        }
        Some(Event::capped(&info, phase, name, self.steps.step.load(Relaxed), now_us))
    }

    /// A Python-profiling boundary: which window ended (with its directory under
    /// `LocalPath`) and which starts.
    pub fn python_boundary(&self, b: TrainprofBoundary, now_us: impl FnMut() -> f64) -> Outcome {
        let at = self.position();
        let mut gate = lock(&self.gate);
        let Gate { config, python, auto, requested, capped } = &mut *gate;
        if !records(config, self.local_path_override) {
            // Profiling switched off: close what runs, start nothing.
            let mut off = config.python.clone();
            off.feature = Config::defaults().python.feature;
            return python.boundary(b, &mut off, None, at, now_us);
        }
        let triggered = requested
            .as_ref()
            .filter(|r| r.opens(AutoFeature::Python, at.step))
            .map(|r| (r.start, r.end))
            .or_else(|| auto.as_ref().and_then(|d| d.range_for(AutoFeature::Python)))
            .filter(|_| config.python.feature.may_auto_open());
        if python.capped {
            // The capped window ends where it would have: at a step outside it.
            let inside = triggered.is_some_and(|(start, end)| start <= at.step && at.step < end)
                || config.python.feature.is_open_at(at.step, crate::now_us() as f64 / 1e6);
            let step_boundary = matches!(
                b,
                TrainprofBoundary::StepStart | TrainprofBoundary::ForwardPassEnd | TrainprofBoundary::StepEnd
            );
            if step_boundary && !inside {
                python.capped = false;
                capped[2] = None;
            }
        }
        python.boundary(b, &mut config.python, triggered, at, now_us)
    }

    /// `<LocalPath>/framework/<framework>/<profiler>/<node>/<dir_name>`, and the temporary
    /// directory the stats are written to before they are renamed there.
    pub fn python_stats_paths(&self, profiler: &str, dir_name: &str) -> (PathBuf, PathBuf) {
        let done = self
            .local_path()
            .join("framework")
            .join(self.framework)
            .join(profiler)
            .join(self.node_id())
            .join(dir_name);
        let tmp = self.local_path().join(".tmp").join(self.node_id()).join(dir_name);
        (done, tmp)
    }

    /// Every counter, read in one place (`trainprof_stats`, `trainprof_dropped_*`, the
    /// shutdown log line).
    pub fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    /// Bytes of the timeline files sealed so far.
    pub fn bytes_sealed(&self) -> u64 {
        self.counters.bytes_sealed()
    }

    /// Events lost so far, for any reason.
    pub fn dropped(&self) -> u64 {
        self.stats().dropped()
    }

    /// Pops one queued event (for tests that drain the queue themselves).
    pub fn pop(&self) -> Option<Event> {
        self.queue.pop()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicI64;
    use std::thread;
    use std::time::Duration;

    use trainprof_config::{Loader, Sources};

    use crate::names::MAX_NAMES_DEFAULT;

    use super::*;

    fn hook_with(mut config: Config, queue_capacity: usize) -> Arc<Hook> {
        config.framework_configured = true;
        Hook::new(Options {
            framework: "pytorch",
            config,
            node_id: "0-test".into(),
            os_pid: 1,
            queue_capacity,
            base_us: HOOK_BASE,
            local_path_override: false,
            max_names: MAX_NAMES_DEFAULT,
        })
    }

    const HOOK_BASE: i64 = 1_795_316_901_000_000;
    /// Event times in tests: well after HOOK_BASE.
    const BASE: i64 = HOOK_BASE + 1_000_000;

    const THREADS: u64 = 8;
    const PER_THREAD: u64 = 1_000_000;

    /// Every thread records PER_THREAD events and counts what each call returned.
    fn hammer(hook: &Arc<Hook>, phase: u32) -> (u64, u64) {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let hook = Arc::clone(hook);
                thread::spawn(move || {
                    let (mut ok, mut dropped) = (0u64, 0u64);
                    for i in 0..PER_THREAD as i64 {
                        match hook.record(phase, phase, i, i + 1, t as i64, &[]) {
                            TrainprofStatus::Ok => ok += 1,
                            TrainprofStatus::Dropped => dropped += 1,
                            other => panic!("{other:?}"),
                        }
                    }
                    (ok, dropped)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    #[test]
    fn a_full_queue_drops_and_counts_exactly() {
        let hook = hook_with(Config::defaults(), 10_000);
        let phase = hook.register_name("Forward");
        let (ok, dropped) = hammer(&hook, phase);
        assert_eq!(ok, 10_000);
        assert_eq!(dropped, THREADS * PER_THREAD - 10_000);
        assert_eq!(hook.stats().dropped_queue_full, dropped);
        assert_eq!(std::iter::from_fn(|| hook.pop()).count(), 10_000);
    }

    #[test]
    fn with_a_consumer_every_event_is_either_taken_or_counted() {
        let hook = hook_with(Config::defaults(), 4096);
        let phase = hook.register_name("Forward");
        let stop = Arc::new(AtomicBool::new(false));
        let consumer = {
            let (hook, stop) = (Arc::clone(&hook), Arc::clone(&stop));
            thread::spawn(move || {
                let mut n = 0u64;
                let mut per_thread = [0u64; THREADS as usize];
                loop {
                    // Read `stop` before popping: an empty queue seen after every producer
                    // finished is really empty, one seen before may still be filled.
                    let producers_done = stop.load(Acquire);
                    match hook.pop() {
                        Some(ev) => {
                            n += 1;
                            per_thread[ev.step as usize] += 1;
                        }
                        None if producers_done => return (n, per_thread),
                        None => std::hint::spin_loop(),
                    }
                }
            })
        };
        let (ok, dropped) = hammer(&hook, phase);
        stop.store(true, Release);
        let (taken, per_thread) = consumer.join().unwrap();
        assert_eq!(ok + dropped, THREADS * PER_THREAD);
        assert_eq!(taken, ok);
        assert_eq!(hook.stats().dropped_queue_full, dropped);
        assert_eq!(per_thread.iter().sum::<u64>(), ok);
    }

    #[test]
    fn invalid_events_are_refused_before_the_queue() {
        let hook = hook_with(Config::defaults(), 16);
        let p = hook.register_name("Forward");
        assert_eq!(hook.register_name("Forward"), p);
        let bad_kind = TrainprofArg { key: p, kind: 9, value: 0 };
        let bad_key = TrainprofArg { key: 999, kind: 0, value: 0 };
        assert_eq!(hook.record(p, 999, 0, 1, 0, &[]), TrainprofStatus::InvalidArgument);
        assert_eq!(hook.record(p, p, 5, 4, 0, &[]), TrainprofStatus::InvalidArgument);
        assert_eq!(hook.record(p, p, 0, 1, 0, &[bad_kind]), TrainprofStatus::InvalidArgument);
        assert_eq!(hook.record(p, p, 0, 1, 0, &[bad_key]), TrainprofStatus::InvalidArgument);
        assert_eq!(hook.record(p, p, 0, 1, 0, &[TrainprofArg::EMPTY; 5]), TrainprofStatus::InvalidArgument);
        assert!(hook.pop().is_none());
        assert_eq!(hook.step_end(10), TrainprofStatus::NoStep);
    }

    #[test]
    fn the_name_table_is_bounded_and_over_limit_events_are_counted() {
        let mut config = Config::defaults();
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("out");
        config.local_path = dir.display().to_string();
        config.framework_configured = true;
        let hook = Hook::new(Options {
            framework: "pytorch",
            config,
            node_id: "0-test".into(),
            os_pid: 1,
            queue_capacity: 4096,
            base_us: HOOK_BASE,
            local_path_override: false,
            max_names: 16,
        });
        hook.spawn_writer(None, now_us).unwrap();
        let phase = hook.register_name("Forward");
        let mut kept = Vec::new();
        for i in 0..1000 {
            let id = hook.register_name(&format!("name-{i}"));
            if id != TRAINPROF_NAME_OVER_LIMIT {
                kept.push(i);
            }
            let status = hook.record(phase, id, BASE + i, BASE + i + 1, 0, &[]);
            let want =
                if id == TRAINPROF_NAME_OVER_LIMIT { TrainprofStatus::Dropped } else { TrainprofStatus::Ok };
            assert_eq!(status, want, "name {i}");
        }
        // The 4 step names, Forward, and 11 more: the rest never entered the table.
        assert_eq!(kept, (0..11).collect::<Vec<_>>());
        assert_eq!(hook.name_count(), 16);
        assert_eq!(hook.names.indexed(), 16);
        // A known name keeps its id; a new one still gets none.
        assert_eq!(hook.register_name("name-3"), 8);
        assert_eq!(hook.register_name("yet another"), TRAINPROF_NAME_OVER_LIMIT);
        // An over-limit name as an argument key drops the event too; a wrong id stays an error.
        let over_key = TrainprofArg { key: TRAINPROF_NAME_OVER_LIMIT, kind: 0, value: 1 };
        assert_eq!(hook.record(phase, phase, BASE, BASE + 1, 0, &[over_key]), TrainprofStatus::Dropped);
        assert_eq!(hook.record(phase, 999, BASE, BASE + 1, 0, &[over_key]), TrainprofStatus::InvalidArgument);
        assert!(hook.stop_writer(Duration::from_secs(10)));
        let s = hook.stats();
        assert_eq!((s.dropped_names, s.written), (1000 - 11 + 1, 11));
        assert_eq!(hook.dropped(), 990);
    }

    /// Names are registered while the writer keeps taking new ones: each registration
    /// costs the same whether the table is small or large (the writer copies only what
    /// is new, not the table).
    #[test]
    fn the_writer_copies_only_new_names() {
        let mut config = Config::defaults();
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("out");
        config.local_path = dir.display().to_string();
        let hook = hook_with(config, 1 << 16);
        hook.spawn_writer(None, now_us).unwrap();
        let phase = hook.register_name("Forward");
        for i in 0..20_000 {
            let id = hook.register_name(&format!("n{i}"));
            assert_eq!(hook.record(phase, id, BASE + i, BASE + i + 1, 0, &[]), TrainprofStatus::Ok);
        }
        assert!(hook.stop_writer(Duration::from_secs(30)));
        assert_eq!(hook.stats().written, 20_000);
        assert_eq!(hook.stats().dropped_names, 0);
    }

    #[test]
    fn steps_are_counted_per_mode_and_step_events_recorded() {
        let hook = hook_with(Config::defaults(), 64);
        assert_eq!(hook.step_begin(TrainprofMode::Train, -1, 100), 0);
        assert_eq!(hook.step_end(150), TrainprofStatus::Ok);
        assert_eq!(hook.step_begin(TrainprofMode::Train, -1, 200), 1);
        assert_eq!(hook.step_begin(TrainprofMode::Eval, -1, 300), 0);
        assert_eq!(hook.step_end(350), TrainprofStatus::Ok);
        assert_eq!(hook.global_step(), Some(2));
        assert_eq!(hook.step_begin(TrainprofMode::Train, 10, 400), 10);
        assert_eq!(hook.global_step(), Some(10));
        assert_eq!(hook.step_begin(TrainprofMode::Train, -1, 500), 11);
        assert_eq!(hook.global_step(), Some(11));
        let evs: Vec<_> =
            std::iter::from_fn(|| hook.pop()).map(|e| (e.phase, e.start_us, e.end_us, e.step)).collect();
        let (train, eval) = (TrainprofMode::Train.step_name_id(), TrainprofMode::Eval.step_name_id());
        assert_eq!(evs, [(train, 100, 150, 0), (eval, 300, 350, 0)]);
    }

    /// Train steps 0-9, eval 0-1, train 10-11, with a Python window at StartStep 9 for 3
    /// steps and a detailed window at 10 for 2: PyTorch tests both at the global step (the
    /// eval steps are global 10 and 11) and names the Python windows by mode and global step,
    /// as smdebug's PyTorch hook does; TensorFlow tests each mode's own step.
    #[test]
    fn windows_use_the_global_step_for_pytorch_and_the_mode_step_otherwise() {
        let doc = r#"{"ProfilingParameters": {"LocalPath": "/nonexistent",
            "DetailedProfilingConfig": "{\"StartStep\": 10, \"NumSteps\": 2}",
            "PythonProfilingConfig": "{\"StartStep\": 9, \"NumSteps\": 3}"}}"#;
        for (framework, want_python, want_detailed) in [
            (
                "pytorch",
                vec!["train-9-stepstart", "eval-10-stepstart", "eval-11-stepstart"],
                vec![("eval", 0), ("eval", 1)],
            ),
            (
                "tensorflow",
                vec!["train-9-stepstart", "train-10-stepstart", "train-11-stepstart"],
                vec![("train", 10), ("train", 11)],
            ),
        ] {
            let mut config = trainprof_config::from_bytes(doc.as_bytes(), &trainprof_config::Sources::new());
            config.framework_configured = true;
            let hook = Hook::new(Options {
                framework,
                config,
                node_id: "0-test".into(),
                os_pid: 1,
                queue_capacity: 64,
                base_us: HOOK_BASE,
                local_path_override: false,
                max_names: MAX_NAMES_DEFAULT,
            });
            let mut t = 0.0;
            let mut tick = || {
                t += 1.0;
                t
            };
            let mut started = Vec::new();
            let mut detailed = Vec::new();
            let plan = (0..10)
                .map(|_| TrainprofMode::Train)
                .chain([TrainprofMode::Eval; 2])
                .chain([TrainprofMode::Train; 2]);
            for (global, mode) in plan.enumerate() {
                let n = hook.step_begin(mode, -1, 0);
                assert_eq!(hook.global_step(), Some(global as u64));
                let mut boundary = |b| {
                    if let Some((dir, _)) = hook.python_boundary(b, &mut tick).ended {
                        started.push(dir.split('_').next().unwrap().rsplit_once('-').unwrap().0.to_owned());
                    }
                };
                boundary(TrainprofBoundary::StepStart);
                if hook.is_active(TrainprofFeature::Detailed, -1, None, 0.0) {
                    detailed.push((mode.python_name(), n));
                }
                boundary(TrainprofBoundary::ForwardPassEnd);
                hook.step_end(0);
                boundary(TrainprofBoundary::StepEnd);
            }
            // The windows that started at a step start, named by their start.
            let starts: Vec<_> = started.into_iter().filter(|s| s.ends_with("-stepstart")).collect();
            assert_eq!(starts, want_python, "{framework}");
            assert_eq!(detailed, want_detailed, "{framework}");
        }
    }

    /// Replaces `path` atomically, as docs/configuration.md ("Reload") asks: a reader never
    /// sees half a file.
    fn write_atomically(path: &std::path::Path, text: String) {
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    static FAKE_NOW: AtomicI64 = AtomicI64::new(1_795_316_901_000_000);

    fn fake_now() -> i64 {
        FAKE_NOW.load(Relaxed)
    }

    /// A changed config file is read by the writer thread and applies from the next step
    /// boundary, not before.
    #[test]
    fn reloaded_windows_apply_from_the_next_step() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let path = dir.join("profilerconfig.json");
        let config = |start: u32| {
            format!(
                r#"{{"ProfilingParameters": {{"LocalPath": "{}", "DetailedProfilingConfig": "{{\"StartStep\": {start}, \"NumSteps\": 1}}"}}}}"#,
                dir.join("out").display()
            )
        };
        std::fs::write(&path, config(2)).unwrap();
        let loader = Loader::new(Sources::new().with_config_path(&path));
        let hook = hook_with(loader.config().clone(), 64);
        hook.spawn_writer(Some(loader), fake_now).unwrap();
        let detailed = |step| hook.is_active(TrainprofFeature::Detailed, step, None, 0.0);
        hook.step_begin(TrainprofMode::Train, 0, 0);
        assert!(detailed(2) && !detailed(3));

        write_atomically(&path, config(3));
        // The windows stay as they were until a step begins.
        wait_for_reload(&hook);
        assert!(detailed(2) && !detailed(3));
        hook.step_begin(TrainprofMode::Train, 1, 0);
        assert!(!detailed(2) && detailed(3));
        assert!(hook.stop_writer(Duration::from_secs(5)));
    }

    /// Waits until the writer has a reloaded config ready (it polls every 10 ms).
    fn wait_for_reload(hook: &Hook) {
        for _ in 0..500 {
            if lock(&hook.pending).is_some() {
                return;
            }
            // The writer compares with the time it last looked, which may be after any
            // one advance: keep the clock moving.
            FAKE_NOW.fetch_add(200_000, Relaxed);
            thread::sleep(Duration::from_millis(10));
        }
        panic!("the writer never reloaded the config");
    }

    /// Python profiling switched on by a reload starts at the next boundary (smdebug's
    /// hook crashes); profiling switched off by a reload refuses events and the open file
    /// is still sealed.
    #[test]
    fn reload_turns_python_on_then_profiling_off() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("out");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("profilerconfig.json");
        let out = dir.join("out");
        let write = |extra: &str| {
            let doc = format!(
                r#"{{{extra}"ProfilingParameters": {{"LocalPath": "{}", "PythonProfilingConfig": "{{\"StartStep\": 1, \"NumSteps\": 1}}"}}}}"#,
                out.display()
            );
            write_atomically(
                &path,
                if extra == "none" {
                    format!(r#"{{"ProfilingParameters": {{"LocalPath": "{}"}}}}"#, out.display())
                } else {
                    doc.replace("none", "")
                },
            );
        };
        write("none");
        let loader = Loader::new(Sources::new().with_config_path(&path));
        let hook = hook_with(loader.config().clone(), 64);
        hook.spawn_writer(Some(loader), fake_now).unwrap();
        let forward = hook.register_name("Forward");
        assert!(hook.python_boundary(TrainprofBoundary::Start, || 1.0).started.is_none());

        write("");
        wait_for_reload(&hook);
        hook.step_begin(TrainprofMode::Train, 1, 0);
        let o = hook.python_boundary(TrainprofBoundary::StepStart, || 2.0);
        assert_eq!(o.started.map(|s| s.0), Some(trainprof_config::PythonProfiler::CProfile));
        assert_eq!(hook.record(forward, forward, 10, 20, -1, &[]), TrainprofStatus::Ok);

        write(r#""DisableProfiler": true, "#);
        wait_for_reload(&hook);
        hook.step_begin(TrainprofMode::Train, 2, 0);
        assert_eq!(hook.record(forward, forward, 30, 40, -1, &[]), TrainprofStatus::Disabled);
        assert!(!hook.is_active(TrainprofFeature::Python, 1, None, 0.0));
        // The running window ends; none starts.
        let o = hook.python_boundary(TrainprofBoundary::StepStart, || 3.0);
        assert!(o.ended.is_some() && o.started.is_none());
        assert!(hook.stop_writer(Duration::from_secs(5)));
        assert_eq!(hook.stats().written, 1);
        assert_eq!(hook.stats().files_sealed, 1);
        let tmp_left = std::fs::read_dir(out.join("framework"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "tmp"))
            .count();
        assert_eq!(tmp_left, 0);
    }

    /// Events recorded while the writer stops: exactly those that got OK are in the files
    /// (a push can race with the writer's final drain).
    #[test]
    fn recording_through_a_shutdown_writes_exactly_the_ok_events() {
        for round in 0..10 {
            let scratch = tempfile::tempdir().unwrap();
            let dir = scratch.path().join("out");
            let mut config = Config::defaults();
            config.local_path = dir.display().to_string();
            let hook = hook_with(config, 1 << 16);
            let p = hook.register_name("Forward");
            hook.spawn_writer(None, now_us).unwrap();
            let started = Arc::new(std::sync::Barrier::new(4));
            let recorders: Vec<_> = (0..3i64)
                .map(|t| {
                    let (hook, started) = (Arc::clone(&hook), Arc::clone(&started));
                    thread::spawn(move || {
                        started.wait();
                        let mut ok = Vec::new();
                        for i in 0..20_000 {
                            let id = t * 1_000_000 + i;
                            if hook.record(p, p, BASE + id, BASE + id + 1, 0, &[]) == TrainprofStatus::Ok {
                                ok.push(id);
                            }
                        }
                        ok
                    })
                })
                .collect();
            started.wait();
            thread::sleep(Duration::from_millis(1));
            assert!(hook.stop_writer(Duration::from_secs(10)));
            let mut ok: Vec<i64> = recorders.into_iter().flat_map(|r| r.join().unwrap()).collect();
            ok.sort_unstable();
            let mut written = Vec::new();
            // No folder at all when the stop came before the first event.
            for hour in std::fs::read_dir(dir.join("framework/pevents")).into_iter().flatten() {
                for f in std::fs::read_dir(hour.unwrap().path()).unwrap() {
                    let v: serde_json::Value =
                        serde_json::from_slice(&std::fs::read(f.unwrap().path()).unwrap()).unwrap();
                    let events = v.as_array().unwrap().iter().filter(|e| e["ph"] == "X");
                    written.extend(events.map(|e| e["ts"].as_i64().unwrap() + HOOK_BASE - BASE));
                }
            }
            written.sort_unstable();
            assert_eq!(written, ok, "round {round}");
            assert_eq!(hook.stats().written, ok.len() as u64);
        }
    }

    /// The final seal at shutdown fails (a file planted where the hour folders go): the
    /// failure shows in the stats the library reports (`trainprof_stats`), and its event
    /// counts as dropped, not written.
    #[test]
    fn a_final_seal_that_fails_at_shutdown_is_counted() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("out");
        let mut config = Config::defaults();
        config.local_path = dir.display().to_string();
        let hook = hook_with(config, 64);
        let p = hook.register_name("Forward");
        hook.spawn_writer(None, now_us).unwrap();
        assert_eq!(hook.record(p, p, BASE, BASE + 1, 0, &[]), TrainprofStatus::Ok);
        // The writer has the file open (the event is in it) before the folder is planted.
        for _ in 0..500 {
            if hook.stats().written == 1 {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(hook.stats().written, 1);
        std::fs::write(dir.join("framework/pevents"), b"planted").unwrap();
        assert!(hook.stop_writer(Duration::from_secs(10)));
        let s = hook.stats();
        assert_eq!((s.written, s.dropped_writer, s.files_sealed, s.open_failures), (0, 1, 0, 1));
    }

    /// A slow train step (injected times) opens the detailed and python windows at the
    /// next two steps through the same questions the adapters ask; the trigger is one
    /// instant event after the slow step's own; eval steps do not count.
    #[test]
    fn a_slow_train_step_opens_the_named_windows_at_the_next_steps() {
        let doc = r#"{"ProfilingParameters": {"LocalPath": "/nonexistent",
            "DetailedProfilingConfig": "{\"StartStep\": 5, \"NumSteps\": 1}",
            "AutoProfilingConfig": "{\"WarmupSteps\": 3, \"NumSteps\": 2, \"Features\": [\"detailed\", \"python\"]}"}}"#;
        let config = trainprof_config::from_bytes(doc.as_bytes(), &Sources::new());
        assert!(config.problems.is_empty(), "{:?}", config.problems);
        let hook = hook_with(config, 256);
        let (mut detailed, mut python_started) = (Vec::new(), Vec::new());
        let mut t = BASE;
        // Steps 0-9 of 20 ms, step 5 (the configured window) and step 7 slow, an eval step
        // between 7 and 8 slow too; global numbering (pytorch).
        let plan: Vec<(TrainprofMode, i64)> = (0..8)
            .map(|i| (TrainprofMode::Train, if i == 5 || i == 7 { 500 } else { 20 }))
            .chain([(TrainprofMode::Eval, 900)])
            .chain((0..4).map(|_| (TrainprofMode::Train, 20)))
            .collect();
        for (mode, ms) in plan {
            hook.step_begin(mode, -1, t);
            let g = hook.global_step().unwrap();
            if hook.python_boundary(TrainprofBoundary::StepStart, || t as f64).started.is_some() {
                python_started.push(g);
            }
            if hook.is_active(TrainprofFeature::Detailed, -1, None, t as f64 / 1e6) {
                detailed.push(g);
            }
            t += ms * 1000;
            assert_eq!(hook.step_end(t), TrainprofStatus::Ok);
        }
        assert_eq!(detailed, [5, 8, 9]);
        assert_eq!(python_started, [8, 9]);
        assert!(!hook.is_active(TrainprofFeature::Dataloader, 8, Some("x"), 0.0), "not named");
        let events: Vec<Event> = std::iter::from_fn(|| hook.pop()).collect();
        let triggers: Vec<_> = events.iter().filter_map(|e| e.trigger_info().map(|t| (e, t))).collect();
        assert_eq!(triggers.len(), 1);
        let (ev, info) = triggers[0];
        assert_eq!((info.step, info.duration_us, info.median_us, info.num_steps), (7, 500_000, 20_000, 2));
        // Steps 0-4 20 ms, 5 500 ms, 6 20 ms, 7 500 ms: at the end of step 7.
        assert_eq!((ev.step, ev.start_us, ev.end_us), (7, BASE + 1_120_000, BASE + 1_120_000));
        assert_eq!(
            (hook.register_name(TRIGGER_PHASE), hook.register_name(TRIGGER_NAME)),
            (ev.phase, ev.name)
        );
        // The step's own event comes first.
        let i = events.iter().position(|e| e.trigger_info().is_some()).unwrap();
        assert_eq!((events[i - 1].step, events[i - 1].end_us), (7, BASE + 1_120_000));
    }

    /// `memory` in `AutoProfilingConfig`'s `Features` (docs/formats.md, "Memory windows"): a
    /// slow step opens the memory window at the next steps for both questions the PyTorch
    /// adapter can ask (`trainprof_window_active`, and `trainprof_step_next`'s memory bit),
    /// without a `MemoryProfilingConfig`; a configured memory window is not in the bit.
    #[test]
    fn a_slow_train_step_opens_the_memory_window_and_its_step_next_bit() {
        let doc = r#"{"ProfilingParameters": {"LocalPath": "/nonexistent",
            "AutoProfilingConfig": "{\"WarmupSteps\": 3, \"NumSteps\": 2, \"Features\": [\"memory\"]}"}}"#;
        let config = trainprof_config::from_bytes(doc.as_bytes(), &Sources::new());
        assert!(config.problems.is_empty(), "{:?}", config.problems);
        let hook = hook_with(config, 256);
        let (mut active, mut bit) = (Vec::new(), Vec::new());
        let mut t = BASE;
        for i in 0..10 {
            hook.step_begin(TrainprofMode::Train, -1, t);
            let g = hook.global_step().unwrap();
            if hook.is_active(TrainprofFeature::Memory, -1, None, t as f64 / 1e6) {
                active.push(g);
            }
            if hook.extra_memory_open(-1) {
                bit.push(g);
            }
            assert!(!hook.is_active(TrainprofFeature::Detailed, -1, None, t as f64 / 1e6), "not named");
            t += if i == 5 { 500_000 } else { 20_000 };
            assert_eq!(hook.step_end(t), TrainprofStatus::Ok);
        }
        assert_eq!((active.as_slice(), bit.as_slice()), ([6, 7].as_slice(), [6, 7].as_slice()));
        // A configured memory window is the adapter's own question, not the bit.
        let doc = r#"{"ProfilingParameters": {"LocalPath": "/nonexistent",
            "MemoryProfilingConfig": "{\"StartStep\": 1, \"NumSteps\": 2}"}}"#;
        let hook = hook_with(trainprof_config::from_bytes(doc.as_bytes(), &Sources::new()), 256);
        hook.step_begin(TrainprofMode::Train, -1, BASE);
        hook.step_begin(TrainprofMode::Train, -1, BASE);
        assert!(hook.is_active(TrainprofFeature::Memory, 1, None, 0.0) && !hook.extra_memory_open(1));
    }

    /// A capped window answers no for the rest of its steps (the detailed and the dataloader
    /// window, whatever the name; the Python window starts none), one instant event says so,
    /// and the next window opens as usual (docs/formats.md, "Window caps").
    #[test]
    fn a_capped_window_is_closed_until_its_steps_end() {
        use crate::types::TrainprofCap;
        let doc = r#"{"ProfilingParameters": {"LocalPath": "/nonexistent",
            "DetailedProfilingConfig": "{\"StartStep\": 2, \"NumSteps\": 3}",
            "DataloaderProfilingConfig": "{\"StartStep\": 2, \"NumSteps\": 3, \"MetricsRegex\": \"a\"}",
            "PythonProfilingConfig": "{\"StartStep\": 2, \"NumSteps\": 3}"}}"#;
        let hook = hook_with(trainprof_config::from_bytes(doc.as_bytes(), &Sources::new()), 64);
        let mut seen = Vec::new();
        for step in 0..7_i64 {
            hook.step_begin(TrainprofMode::Train, -1, BASE + step * 1000);
            let python = hook.python_boundary(TrainprofBoundary::StepStart, || 1.0).started.is_some();
            let detailed = hook.is_active(TrainprofFeature::Detailed, -1, None, 0.0);
            // A name the regex does not match first: it must not end the capped window.
            let other = hook.is_active(TrainprofFeature::Dataloader, -1, Some("b"), 0.0);
            let dl = hook.is_active(TrainprofFeature::Dataloader, -1, Some("a"), 0.0);
            seen.push((detailed, dl, python, other));
            if step == 3 {
                for f in [TrainprofFeature::Detailed, TrainprofFeature::Dataloader, TrainprofFeature::Python]
                {
                    assert_eq!(
                        hook.window_capped(f, TrainprofCap::Events, 10, 10, -1, BASE),
                        TrainprofStatus::Ok
                    );
                }
                let again =
                    hook.window_capped(TrainprofFeature::Detailed, TrainprofCap::Bytes, 1, 1, -1, BASE);
                assert_eq!(again, TrainprofStatus::Dropped);
            }
            hook.step_end(BASE + step * 1000 + 500);
        }
        let open = (true, true, true, false);
        let closed = (false, false, false, false);
        assert_eq!(seen, [closed, closed, open, open, closed, closed, closed]);
        let capped: Vec<_> = std::iter::from_fn(|| hook.pop()).filter_map(|e| e.capped_info()).collect();
        assert_eq!(capped.len(), 3);
        assert_eq!((capped[0].feature, capped[0].step, capped[0].value), (AutoFeature::Detailed, 3, 10));
        assert_eq!(hook.lock_gate_capped(), [None; 4], "cleared when the window closed");
        // A window armed after it (a reload with a later range) opens.
        let mut gate = lock(&hook.gate);
        gate.config = trainprof_config::from_bytes(
            br#"{"ProfilingParameters": {"DetailedProfilingConfig": "{\"StartStep\": 7, \"NumSteps\": 1}"}}"#,
            &Sources::new(),
        );
        drop(gate);
        hook.step_begin(TrainprofMode::Train, -1, BASE + 9000);
        assert!(hook.is_active(TrainprofFeature::Detailed, -1, None, 0.0));
    }

    /// A triggered window opens a feature whose sub-config is absent (the dataloader for
    /// every name), follows a configured `MetricsRegex`, and never opens a feature whose
    /// sub-config is broken.
    #[test]
    fn a_triggered_window_respects_each_features_own_config() {
        let run = |extra: &str| {
            let doc = format!(
                r#"{{"ProfilingParameters": {{"LocalPath": "/nonexistent", {extra}
                "AutoProfilingConfig": "{{\"WarmupSteps\": 0, \"NumSteps\": 1, \"Features\": [\"dataloader\", \"python\"]}}"}}}}"#
            );
            let hook = hook_with(trainprof_config::from_bytes(doc.as_bytes(), &Sources::new()), 64);
            for ms in [20, 20, 200] {
                let t = BASE + hook.global_step().map_or(0, |g| g as i64 + 1) * 1_000_000;
                hook.step_begin(TrainprofMode::Train, -1, t);
                hook.step_end(t + ms * 1000);
            }
            hook.step_begin(TrainprofMode::Train, -1, BASE + 10_000_000);
            let dl = |name| hook.is_active(TrainprofFeature::Dataloader, -1, Some(name), 0.0);
            let python = hook.python_boundary(TrainprofBoundary::StepStart, || 1.0).started.is_some();
            (
                dl("a.DataLoaderIter::GetNext"),
                dl("TFDataset::Prefetch"),
                python,
                hook.is_active(TrainprofFeature::Detailed, -1, None, 0.0),
            )
        };
        assert_eq!(run(""), (true, true, true, false));
        assert_eq!(
            run(r#""DataloaderProfilingConfig": "{\"MetricsRegex\": \".*DataLoaderIter\"}","#),
            (true, false, true, false)
        );
        assert_eq!(
            run(r#""PythonProfilingConfig": "{\"ProfilerName\": \"perf\"}","#),
            (true, true, false, false)
        );
    }

    /// A reload keeps what the detector learnt while auto profiling stays on, drops it when
    /// it goes off, and starts afresh when it comes back.
    #[test]
    fn a_reload_keeps_or_drops_the_detector() {
        let config = |auto: &str| {
            let doc = format!(r#"{{"ProfilingParameters": {{"LocalPath": "/x"{auto}}}}}"#);
            trainprof_config::from_bytes(doc.as_bytes(), &Sources::new())
        };
        let mut gate = Gate::new(config(r#", "AutoProfilingConfig": {"WarmupSteps": 0, "NumSteps": 3}"#));
        let d = gate.auto.as_mut().unwrap();
        for (i, ms) in [20, 20, 20, 500].into_iter().enumerate() {
            let end_us = (i as i64 + 1) * 1_000_000;
            d.step_end(StepEnd {
                step: i as u64,
                duration_us: ms * 1000,
                end_us,
                in_configured_window: false,
                own_work: false,
            });
        }
        assert!(gate.extra_opens(AutoFeature::Detailed, 4));
        gate.set_config(config(
            r#", "AutoProfilingConfig": {"WarmupSteps": 0, "NumSteps": 3, "MaxPerHour": 9}"#,
        ));
        assert!(gate.extra_opens(AutoFeature::Detailed, 5), "the open window is kept");
        assert_eq!(gate.auto.as_ref().unwrap().settings().max_per_hour, 9);
        gate.set_config(config(""));
        assert!(gate.auto.is_none() && !gate.extra_opens(AutoFeature::Detailed, 5));
        gate.set_config(config(r#", "AutoProfilingConfig": {"WarmupSteps": 0}"#));
        assert!(!gate.extra_opens(AutoFeature::Detailed, 5), "a fresh detector");
    }

    /// Without `AutoProfilingConfig` a step end takes no lock and opens nothing.
    #[test]
    fn no_auto_config_no_detector() {
        let hook = hook_with(Config::defaults(), 64);
        assert!(!hook.auto_on.load(Relaxed) && lock(&hook.gate).auto.is_none());
    }

    fn native_hook(native: &str) -> Arc<Hook> {
        let doc = serde_json::json!({"ProfilingParameters": {"LocalPath": "/nonexistent", "NativeProfilingConfig": native}});
        let config =
            trainprof_config::from_bytes(doc.to_string().as_bytes(), &trainprof_config::Sources::default());
        Hook::new(Options {
            framework: "pytorch",
            config,
            node_id: "0-test".into(),
            os_pid: 1,
            queue_capacity: 64,
            base_us: 0,
            local_path_override: false,
            max_names: 1024,
        })
    }

    #[test]
    fn step_boundaries_decide_a_step_window() {
        let h = native_hook(r#"{"StartStep": 2, "NumSteps": 2, "SamplingHz": 7}"#);
        assert!(h.native.asks());
        assert_eq!(h.native.hz(), 7);
        let open: Vec<bool> = (0..5)
            .map(|_| {
                h.step_begin(crate::types::TrainprofMode::Train, -1, 1_000_000);
                h.native.by_step()
            })
            .collect();
        assert_eq!(open, [false, false, true, true, false]);
        // A step window is never the clock's question.
        assert_eq!(h.native_by_clock(1.0), None);
    }

    #[test]
    fn the_clock_decides_a_time_window() {
        let h = native_hook(r#"{"StartTimeInSecSinceEpoch": 100, "Duration": 5}"#);
        assert_eq!(h.native_by_clock(99.0), Some(false));
        assert_eq!(h.native_by_clock(100.0), Some(true));
        assert_eq!(h.native_by_clock(105.0), Some(false));
        let h = native_hook(r#"{"StartTimeInSecSinceEpoch": 100}"#);
        assert_eq!(h.native_by_clock(101.0), None, "one step: only steps decide");
    }

    #[test]
    fn off_when_not_configured_or_refused() {
        let h = native_hook("{}");
        assert!(!h.native.asks());
        h.step_begin(crate::types::TrainprofMode::Train, -1, 0);
        assert!(!h.native.by_step());
        let h = native_hook(r#"{"StartStep": 1}"#);
        h.native.turn_off();
        assert!(!h.native.asks());
        assert!(!h.native.wants_thread());
    }
}
