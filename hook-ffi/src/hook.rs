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
//!   boundary, so it never waits for the writer.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use trainprof_config::{Config, Loader, Reload, Step};

use crate::event::{Event, NO_STEP, TRAINPROF_MAX_ARGS, TrainprofArg};
use crate::python::{self, Outcome, Position, TrainprofBoundary};
use crate::status::TrainprofStatus;
use crate::writer::{self, TimelineWriter};

/// A training mode, numbered as smdebug's `ModeKeys`.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofMode {
    Train = 1,
    Eval = 2,
    Predict = 3,
    Global = 4,
}

impl TrainprofMode {
    pub(crate) const ALL: [TrainprofMode; 4] =
        [TrainprofMode::Train, TrainprofMode::Eval, TrainprofMode::Predict, TrainprofMode::Global];

    pub fn from_i32(v: i32) -> Option<TrainprofMode> {
        TrainprofMode::ALL.into_iter().find(|m| *m as i32 == v)
    }

    /// The phase (and name) of this mode's step events: `Step:ModeKeys.TRAIN`.
    pub fn step_phase(self) -> &'static str {
        match self {
            TrainprofMode::Train => "Step:ModeKeys.TRAIN",
            TrainprofMode::Eval => "Step:ModeKeys.EVAL",
            TrainprofMode::Predict => "Step:ModeKeys.PREDICT",
            TrainprofMode::Global => "Step:ModeKeys.GLOBAL",
        }
    }

    /// The mode in Python-stats directory names.
    pub fn python_name(self) -> &'static str {
        match self {
            TrainprofMode::Train => "train",
            TrainprofMode::Eval => "eval",
            TrainprofMode::Predict => "predict",
            TrainprofMode::Global => "global",
        }
    }

    fn index(self) -> usize {
        self as usize - 1
    }

    /// The name id of [`TrainprofMode::step_phase`], registered when the hook is made.
    pub fn step_name_id(self) -> u32 {
        self.index() as u32
    }
}

/// A profiling feature whose window can be asked about.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofFeature {
    Detailed = 1,
    Dataloader = 2,
    Python = 3,
    Smdataparallel = 4,
}

impl TrainprofFeature {
    pub fn from_i32(v: i32) -> Option<TrainprofFeature> {
        use TrainprofFeature::*;
        [Detailed, Dataloader, Python, Smdataparallel].into_iter().find(|f| *f as i32 == v)
    }
}

/// The id `trainprof_register_name` gives a name that does not fit in the name table
/// (`TRAINPROF_MAX_NAMES`): an event that uses it is dropped and counted.
pub const TRAINPROF_NAME_OVER_LIMIT: u32 = u32::MAX;

/// Default of `TRAINPROF_MAX_NAMES`: distinct names per process.
pub(crate) const MAX_NAMES_DEFAULT: usize = 65_536;

/// The bytes all names may take together, whatever their number: with the count limit,
/// the table's memory is bounded however long the names are.
pub(crate) const MAX_NAME_BYTES: usize = 16 << 20;

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

/// Counters, for `trainprof_stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Dropped on the trainer's thread because the queue was full.
    pub dropped_queue_full: u64,
    /// Dropped by the writer (turned off after failed opens, or a file it could not write).
    pub dropped_writer: u64,
    pub written: u64,
    pub files_sealed: u64,
    pub open_failures: u64,
    /// Dropped on the trainer's thread because they use a name that did not fit in the
    /// name table (`TRAINPROF_MAX_NAMES`).
    pub dropped_names: u64,
}

struct Names {
    table: Mutex<NameTable>,
    /// How many names are registered: ids below it are valid. Read on the hot path.
    count: AtomicU32,
    /// The most names the table takes.
    max: usize,
}

#[derive(Default)]
struct NameTable {
    list: Vec<Arc<str>>,
    index: HashMap<Arc<str>, u32>,
    /// The bytes of all names in `list`.
    bytes: usize,
    /// Whether the table being full was logged.
    full_logged: bool,
}

/// The trainer-side window state. Only trainer threads lock it.
struct Gate {
    config: Config,
    python: python::Windows,
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

/// Which step number the windows are tested at, as smdebug tests them (README, "The
/// trainer side"): its PyTorch hook at the global step (`hook.step`, every mode counted
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

/// The hook. See the module docs for who touches what.
pub struct Hook {
    queue: ArrayQueue<Event>,
    dropped_full: ShardedCounter,
    /// Events that used [`TRAINPROF_NAME_OVER_LIMIT`].
    dropped_names: ShardedCounter,
    /// Pushes under way (see [`Hook::push`]).
    in_flight: ShardedCounter,
    /// Events left in the queue when the writer thread died (a caught panic).
    dropped_writer_died: AtomicU64,
    names: Names,
    enabled: AtomicBool,
    local_path_override: bool,
    steps: Steps,
    gate: Mutex<Gate>,
    pending: Mutex<Option<Box<Config>>>,
    framework: &'static str,
    window_step: WindowStep,
    node_id: String,
    local_path: PathBuf,
    os_pid: u32,
    base_us: i64,
    rotate: (u64, i64, u32),
    written: AtomicU64,
    dropped_writer: AtomicU64,
    files_sealed: AtomicU64,
    open_failures: AtomicU64,
    stop: AtomicBool,
    finished: (Mutex<bool>, Condvar),
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hook")
            .field("framework", &self.framework)
            .field("node_id", &self.node_id)
            .field("local_path", &self.local_path)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A counter split over cache lines, so that threads dropping events at the same time
/// do not fight over one line; each thread adds to its own slot (by a thread-local index).
#[derive(Debug, Default)]
struct ShardedCounter([PaddedU64; SHARDS]);

const SHARDS: usize = 16;

#[derive(Debug, Default)]
#[repr(align(128))]
struct PaddedU64(AtomicU64);

impl ShardedCounter {
    /// This thread's slot.
    fn slot() -> usize {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            static SLOT: usize = NEXT.fetch_add(1, Relaxed) % SHARDS;
        }
        SLOT.try_with(|s| *s).unwrap_or(0)
    }

    /// The total (slots add and subtract with wrapping, so the sum is exact).
    fn sum(&self) -> u64 {
        self.0.iter().fold(0u64, |a, c| a.wrapping_add(c.0.load(SeqCst)))
    }
}

/// Locks `m`, ignoring poisoning (a panic in another thread leaves plain data behind).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Wall-clock time in µs since the epoch (clock_gettime through the vDSO: no syscall).
pub fn now_us() -> i64 {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Wall-clock time in µs since the epoch, with the sub-µs part, as Python's
/// `time.time() * 1e6`.
pub fn now_us_f64() -> f64 {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    d.as_nanos() as f64 / 1000.0
}

impl Hook {
    pub fn new(o: Options) -> Arc<Hook> {
        let mut table = NameTable::default();
        for m in TrainprofMode::ALL {
            let name: Arc<str> = Arc::from(m.step_phase());
            table.index.insert(name.clone(), table.list.len() as u32);
            table.bytes += name.len();
            table.list.push(name);
        }
        let count = table.list.len() as u32;
        let c = &o.config;
        Arc::new(Hook {
            queue: ArrayQueue::new(o.queue_capacity.max(1)),
            dropped_full: ShardedCounter::default(),
            dropped_names: ShardedCounter::default(),
            in_flight: ShardedCounter::default(),
            dropped_writer_died: AtomicU64::new(0),
            names: Names {
                table: Mutex::new(table),
                count: AtomicU32::new(count),
                max: o.max_names.max(count as usize),
            },
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
            node_id: o.node_id,
            local_path: c.local_path().to_path_buf(),
            os_pid: o.os_pid,
            base_us: o.base_us,
            rotate: (
                c.rotate_max_file_size,
                interval_us(c.rotate_close_interval_s),
                c.file_open_fail_threshold,
            ),
            gate: Mutex::new(Gate { config: o.config, python: python::Windows::default() }),
            pending: Mutex::new(None),
            written: AtomicU64::new(0),
            dropped_writer: AtomicU64::new(0),
            files_sealed: AtomicU64::new(0),
            open_failures: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            finished: (Mutex::new(false), Condvar::new()),
        })
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn local_path(&self) -> &std::path::Path {
        &self.local_path
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// Registers `name` (idempotent) and returns its id; [`TRAINPROF_NAME_OVER_LIMIT`] when
    /// the table is full (`max_names` names, or [`MAX_NAME_BYTES`]): the table never grows
    /// past that, and events that use that id are dropped and counted.
    pub fn register_name(&self, name: &str) -> u32 {
        let mut t = lock(&self.names.table);
        if let Some(&id) = t.index.get(name) {
            return id;
        }
        if t.list.len() >= self.names.max || t.bytes.saturating_add(name.len()) > MAX_NAME_BYTES {
            if !t.full_logged {
                t.full_logged = true;
                crate::log(&format_args!(
                    "the name table is full ({} names, {} bytes; TRAINPROF_MAX_NAMES={}): events with new names are dropped and counted",
                    t.list.len(),
                    t.bytes,
                    self.names.max
                ));
            }
            return TRAINPROF_NAME_OVER_LIMIT;
        }
        let id = t.list.len() as u32;
        let name: Arc<str> = Arc::from(name);
        t.index.insert(name.clone(), id);
        t.bytes += name.len();
        t.list.push(name);
        self.names.count.store(id + 1, Release);
        id
    }

    /// Names registered so far (the step names included).
    pub fn name_count(&self) -> usize {
        self.names.count.load(Acquire) as usize
    }

    fn valid_id(&self, id: u32) -> bool {
        id < self.names.count.load(Acquire)
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
        self.dropped_names.0[ShardedCounter::slot()].0.fetch_add(1, Relaxed);
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
        self.push(ev)
    }

    fn push(&self, ev: Event) -> TrainprofStatus {
        // In flight from here to the end: the writer's final drain waits until no push is
        // in flight, and a push that starts after the stop is refused. `stop` and the
        // in-flight counts are SeqCst, so one of the two always sees the other: every OK
        // event is written, and no event is taken back.
        let slot = ShardedCounter::slot();
        self.in_flight.0[slot].0.fetch_add(1, SeqCst);
        let status = if self.stop.load(SeqCst) {
            TrainprofStatus::ShutDown
        } else {
            match self.queue.push(ev) {
                Ok(()) => TrainprofStatus::Ok,
                Err(_) => {
                    self.dropped_full.0[slot].0.fetch_add(1, Relaxed);
                    TrainprofStatus::Dropped
                }
            }
        };
        self.in_flight.0[slot].0.fetch_sub(1, SeqCst);
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
        self.record(id, id, begin, now_us.max(begin), self.steps.step.load(Relaxed), &[])
    }

    fn position(&self) -> Position {
        let mode = TrainprofMode::from_i32(self.steps.mode.load(Relaxed)).unwrap_or(TrainprofMode::Train);
        Position {
            mode: mode.python_name(),
            step: self.window_step().unwrap_or(0),
            pytorch: self.framework == "pytorch",
        }
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
            let mut gate = lock(&self.gate);
            gate.config = *config;
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
        let c = &mut gate.config;
        match feature {
            TrainprofFeature::Detailed => c.detailed.is_active(at, now_s),
            TrainprofFeature::Dataloader => c.dataloader.is_active_for(name.unwrap_or(""), at, now_s),
            TrainprofFeature::Python => c.python.feature.is_active(at, now_s),
            TrainprofFeature::Smdataparallel => c.smdataparallel.is_active(at, now_s),
        }
    }

    /// A Python-profiling boundary: which window ended (with its directory under
    /// `LocalPath`) and which starts.
    pub fn python_boundary(&self, b: TrainprofBoundary, now_us: impl FnMut() -> f64) -> Outcome {
        let at = self.position();
        let mut gate = lock(&self.gate);
        let Gate { config, python } = &mut *gate;
        if !records(config, self.local_path_override) {
            // Profiling switched off: close what runs, start nothing.
            let mut off = config.python.clone();
            off.feature = Config::defaults().python.feature;
            return python.boundary(b, &mut off, at, now_us);
        }
        python.boundary(b, &mut config.python, at, now_us)
    }

    /// `<LocalPath>/framework/<framework>/<profiler>/<node>/<dir_name>`, and the temporary
    /// directory the stats are written to before they are renamed there.
    pub fn python_stats_paths(&self, profiler: &str, dir_name: &str) -> (PathBuf, PathBuf) {
        let done = self
            .local_path
            .join("framework")
            .join(self.framework)
            .join(profiler)
            .join(&self.node_id)
            .join(dir_name);
        let tmp = self.local_path.join(".tmp").join(&self.node_id).join(dir_name);
        (done, tmp)
    }

    pub fn stats(&self) -> Stats {
        Stats {
            dropped_queue_full: self.dropped_full.sum(),
            dropped_writer: self.dropped_writer.load(Relaxed) + self.dropped_writer_died.load(Relaxed),
            written: self.written.load(Relaxed),
            files_sealed: self.files_sealed.load(Relaxed),
            open_failures: self.open_failures.load(Relaxed),
            dropped_names: self.dropped_names.sum(),
        }
    }

    /// Events lost so far, for any reason.
    pub fn dropped(&self) -> u64 {
        let s = self.stats();
        s.dropped_queue_full + s.dropped_writer + s.dropped_names
    }

    /// Pops one queued event (for tests that drain the queue themselves).
    pub fn pop(&self) -> Option<Event> {
        self.queue.pop()
    }

    /// Starts the writer thread. `loader` re-reads the config; `clock` gives µs since the
    /// epoch.
    pub fn spawn_writer(self: &Arc<Self>, loader: Option<Loader>, clock: fn() -> i64) -> std::io::Result<()> {
        let hook = Arc::clone(self);
        thread::Builder::new().name("trainprof-writer".into()).spawn(move || {
            let ran =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook.run_writer(loader, clock)));
            if ran.is_err() {
                // A bug, not a state: stop recording, count what is left, never hang a
                // shutdown.
                hook.enabled.store(false, Relaxed);
                hook.stop.store(true, SeqCst);
                while hook.in_flight.sum() != 0 {
                    thread::yield_now();
                }
                let left = std::iter::from_fn(|| hook.queue.pop()).count() as u64;
                hook.dropped_writer_died.fetch_add(left, Relaxed);
                crate::log(&format_args!(
                    "the writer thread failed; recording is off ({left} queued events dropped)"
                ));
            }
            let (done, cv) = &hook.finished;
            *lock(done) = true;
            cv.notify_all();
        })?;
        Ok(())
    }

    /// Asks the writer to drain the queue, seal its file and stop; waits at most `timeout`.
    /// True when it finished in time.
    pub fn stop_writer(&self, timeout: Duration) -> bool {
        self.stop.store(true, SeqCst);
        let (done, cv) = &self.finished;
        let deadline = Instant::now() + timeout;
        let mut finished = lock(done);
        while !*finished {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            finished = cv.wait_timeout(finished, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }

    fn run_writer(&self, mut loader: Option<Loader>, clock: fn() -> i64) {
        let (max_bytes, interval, threshold) = self.rotate;
        let settings = writer::Settings {
            root: self.local_path.clone(),
            node_id: self.node_id.clone(),
            os_pid: self.os_pid,
            rotate_max_bytes: max_bytes,
            rotate_interval_us: interval,
            file_open_fail_threshold: threshold,
        };
        let mut w = TimelineWriter::new(settings, self.base_us);
        let mut names: Vec<Arc<str>> = Vec::new();
        let mut last_reload = clock();
        loop {
            let stopping = self.stop.load(SeqCst);
            let mut n = 0usize;
            while let Some(ev) = self.queue.pop() {
                let top = ev.phase.max(ev.name).max(ev.args().iter().map(|a| a.key).max().unwrap_or(0));
                if top as usize >= names.len() {
                    // Only the names added since the last look: the lock is held for
                    // those alone, never for a copy of the whole table (register_name
                    // waits on it).
                    let t = lock(&self.names.table);
                    names.extend_from_slice(t.list.get(names.len()..).unwrap_or_default());
                }
                w.write(&ev, &names, clock());
                n += 1;
                if n == 4096 {
                    break;
                }
            }
            let now = clock();
            if n > 0 {
                w.flush(now);
            }
            w.rotate_if_due(now);
            let c = w.counts();
            self.written.store(c.written, Relaxed);
            self.dropped_writer.store(c.dropped, Relaxed);
            self.files_sealed.store(c.files_sealed, Relaxed);
            self.open_failures.store(c.open_failures, Relaxed);
            if stopping && self.in_flight.sum() == 0 && self.queue.is_empty() {
                w.close(clock());
                let c = w.counts();
                self.written.store(c.written, Relaxed);
                self.dropped_writer.store(c.dropped, Relaxed);
                self.files_sealed.store(c.files_sealed, Relaxed);
                return;
            }
            if let Some(l) = loader.as_mut()
                && now.saturating_sub(last_reload) >= 1_000_000
            {
                last_reload = now;
                if l.reload() == Reload::Changed {
                    let c = l.config();
                    crate::log(&format_args!(
                        "config changed ({}); new windows apply from the next step",
                        l.loaded().path.display()
                    ));
                    for p in &c.problems {
                        crate::log(&format_args!("config: {}: {}", p.key, p.message));
                    }
                    w.set_rotation(c.rotate_max_file_size, interval_us(c.rotate_close_interval_s));
                    *lock(&self.pending) = Some(Box::new(c.clone()));
                }
            }
            if n == 0 {
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn interval_us(s: f64) -> i64 {
    if s.is_finite() && s > 0.0 { (s * 1e6).min(i64::MAX as f64) as i64 } else { i64::MAX }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicI64;

    use trainprof_config::Sources;

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
        let dir = std::env::temp_dir().join(format!("trainprof-names-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
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
        assert_eq!(lock(&hook.names.table).index.len(), 16);
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
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Names are registered while the writer keeps taking new ones: each registration
    /// costs the same whether the table is small or large (the writer copies only what
    /// is new, not the table).
    #[test]
    fn the_writer_copies_only_new_names() {
        let mut config = Config::defaults();
        let dir = std::env::temp_dir().join(format!("trainprof-names2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
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
        std::fs::remove_dir_all(&dir).unwrap();
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

    /// Replaces `path` atomically, as the README asks: a reader never sees half a file.
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
        let dir = std::env::temp_dir().join(format!("trainprof-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
        std::fs::remove_dir_all(&dir).unwrap();
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
        let dir = std::env::temp_dir().join(format!("trainprof-reload2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
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
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Events recorded while the writer stops: exactly those that got OK are in the files
    /// (a push can race with the writer's final drain).
    #[test]
    fn recording_through_a_shutdown_writes_exactly_the_ok_events() {
        for round in 0..10 {
            let dir = std::env::temp_dir().join(format!("trainprof-late-{}-{round}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
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
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
