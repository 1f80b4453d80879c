//! The exported C functions; see the crate docs for the contract. The process-wide state
//! lives here: one [`Hook`] per process.
//!
//! Every export goes through one edge: [`edge`] (a value-returning export) or [`export`]
//! (a status-returning one) runs it inside [`guard`] and answers a fork()ed child before
//! anything else; [`export_out`] does the same for an export that fills one out-pointer,
//! and writes that out-pointer's "nothing" value whatever happens (a forked child, a
//! hook not running, a caught panic leaves it as the caller made it). The hook's state is
//! checked by [`running`] / [`hook_any`], the pointers by [`str_arg`], [`non_null`],
//! [`out_buf`] and [`copy_out`]: no export checks `FORKED` or a NULL pointer by hand.

use std::ffi::{CStr, c_char};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::*};
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;

use trainprof_config::{CProfileTimer, Loader, PythonProfiler, Sources};
use trainprof_output::protocol::python_window;

use crate::hook::{self, FRAMEWORKS, Hook, Options};
use crate::names::MAX_NAMES_DEFAULT;
use crate::types::{
    TRAINPROF_MAX_ARGS, TRAINPROF_NAME_OVER_LIMIT, TrainprofArg, TrainprofBoundary, TrainprofCap,
    TrainprofCprofileTimer, TrainprofFeature, TrainprofMemorySettings, TrainprofMode,
    TrainprofPythonProfiler, TrainprofPythonWindow, TrainprofSnapshotKind, TrainprofStacks, TrainprofStats,
    TrainprofStatus, TrainprofStepNext, TrainprofWindowCaps,
};
use crate::{TRAINPROF_ABI_VERSION, cost, guard, log, node};
use trainprof_output::protocol::hook_cost::Part as CostPart;

/// The crate version, NUL-terminated for C.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// Default and bounds of the event queue (`TRAINPROF_QUEUE_EVENTS`). An event is 104
/// bytes, so the default holds 3.4 MB.
const QUEUE_EVENTS_DEFAULT: usize = 32_768;
const QUEUE_EVENTS_RANGE: std::ops::RangeInclusive<usize> = 16..=4_194_304;

/// Bounds of `TRAINPROF_MAX_NAMES` (default [`MAX_NAMES_DEFAULT`]).
const MAX_NAMES_RANGE: std::ops::RangeInclusive<usize> = 16..=16_777_216;

/// How long the exit handler waits for the writer (`TRAINPROF_SHUTDOWN_TIMEOUT_MS`).
const EXIT_TIMEOUT_MS_DEFAULT: u64 = 5_000;

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const RUNNING: u8 = 2;
const DISABLED: u8 = 3;
const STOPPING: u8 = 4;
const DOWN: u8 = 5;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static HOOK: OnceLock<Arc<Hook>> = OnceLock::new();
static FORKED: AtomicBool = AtomicBool::new(false);
static AT_FORK: Once = Once::new();
static AT_EXIT: Once = Once::new();
static PANIC_HOOK: Once = Once::new();

// --- the edge -------------------------------------------------------------------------

/// Runs an export: `fallback` if it panics, `forked` in a fork()ed child (before anything
/// is touched: see the crate docs), else `f`'s answer.
fn edge<T>(fallback: T, forked: T, f: impl FnOnce() -> T) -> T {
    guard(fallback, || if FORKED.load(Relaxed) { forked } else { f() })
}

/// Runs an export that returns a status: `INTERNAL` if it panics, `FORKED_CHILD` in a
/// fork()ed child, else `f`'s status (its error, when it failed).
fn export(f: impl FnOnce() -> Result<TrainprofStatus, TrainprofStatus>) -> TrainprofStatus {
    edge(TrainprofStatus::Internal, TrainprofStatus::ForkedChild, || f().unwrap_or_else(|e| e))
}

/// The out-pointers of an export: one `*mut T`, or a tuple of them that an export fills
/// together ([`trainprof_step_next`]).
trait OutPtrs: Copy {
    /// What is written through them.
    type Value: Copy;
    /// Is any of them NULL?
    fn any_null(self) -> bool;
    /// Writes `v` through every pointer that is not NULL.
    ///
    /// # Safety
    /// Each pointer is NULL or valid for a write of its type.
    unsafe fn write(self, v: Self::Value);
}

impl<T: Copy> OutPtrs for *mut T {
    type Value = T;
    fn any_null(self) -> bool {
        self.is_null()
    }
    unsafe fn write(self, v: T) {
        if let Some(p) = NonNull::new(self) {
            // SAFETY: not NULL, and the caller promises it is valid for a write.
            unsafe { p.write(v) };
        }
    }
}

impl<A: Copy, B: Copy, C: Copy> OutPtrs for (*mut A, *mut B, *mut C) {
    type Value = (A, B, C);
    fn any_null(self) -> bool {
        self.0.is_null() || self.1.is_null() || self.2.is_null()
    }
    unsafe fn write(self, v: (A, B, C)) {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.0.write(v.0);
            self.1.write(v.1);
            self.2.write(v.2);
        }
    }
}

/// Runs an export that fills `*out` (one out-pointer, or a tuple of them): `NULL_ARGUMENT`
/// when any is NULL (after the fork check; nothing written); otherwise every one always
/// ends up written, with `nothing` in a fork()ed child (each one that is not NULL), with
/// what `f` made of `nothing` else (also when `f` fails part-way: what it filled in
/// stays), and the status is `f`'s.
///
/// # Safety
/// Each pointer of `out` is NULL or valid for a write of its type.
unsafe fn export_out<P: OutPtrs>(
    out: P,
    nothing: P::Value,
    f: impl FnOnce(&mut P::Value) -> Result<TrainprofStatus, TrainprofStatus>,
) -> TrainprofStatus {
    guard(TrainprofStatus::Internal, || {
        if FORKED.load(Relaxed) {
            // SAFETY: the caller promises each pointer is NULL or valid for a write.
            unsafe { out.write(nothing) };
            return TrainprofStatus::ForkedChild;
        }
        if out.any_null() {
            return TrainprofStatus::NullArgument;
        }
        let mut value = nothing;
        let status = f(&mut value).unwrap_or_else(|e| e);
        // SAFETY: none is NULL, and the caller promises each is valid for a write.
        unsafe { out.write(value) };
        status
    })
}

/// The hook, when this process initialised it; `running` also requires that it is not
/// shut down. One load of the state. (The fork check is the edge's.)
fn hook_in(running: bool) -> Result<&'static Hook, TrainprofStatus> {
    match STATE.load(Acquire) {
        UNINIT | INITIALIZING => Err(TrainprofStatus::NotInitialized),
        DISABLED => Err(TrainprofStatus::Disabled),
        RUNNING => HOOK.get().map(|h| &**h).ok_or(TrainprofStatus::NotInitialized),
        _ if running => Err(TrainprofStatus::ShutDown),
        _ => HOOK.get().map(|h| &**h).ok_or(TrainprofStatus::NotInitialized),
    }
}

/// The hook, running or shut down (Python windows, counters, node id, LocalPath).
fn hook_any() -> Result<&'static Hook, TrainprofStatus> {
    hook_in(false)
}

/// The hook, when it is running (initialised, enabled, not shut down).
fn running() -> Result<&'static Hook, TrainprofStatus> {
    hook_in(true)
}

/// A required out-pointer.
fn non_null<T>(p: *mut T) -> Result<NonNull<T>, TrainprofStatus> {
    NonNull::new(p).ok_or(TrainprofStatus::NullArgument)
}

/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
unsafe fn str_arg<'a>(p: *const c_char) -> Result<&'a str, TrainprofStatus> {
    if p.is_null() {
        return Err(TrainprofStatus::NullArgument);
    }
    // SAFETY: p is not NULL, and the caller promises a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| TrainprofStatus::InvalidUtf8)
}

/// The caller's string buffer `buf` of `cap` bytes.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes.
unsafe fn out_buf<'a>(buf: *mut c_char, cap: usize) -> Result<&'a mut [c_char], TrainprofStatus> {
    let buf = non_null(buf)?;
    // SAFETY: not NULL, and the caller promises cap valid bytes.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.as_ptr(), cap) })
}

/// Copies `s` NUL-terminated into `buf`; `BUFFER_TOO_SMALL` (and `buf` untouched) when it
/// does not fit.
fn copy_out(s: &[u8], buf: &mut [c_char]) -> Result<(), TrainprofStatus> {
    if s.len() >= buf.len() {
        return Err(TrainprofStatus::BufferTooSmall);
    }
    for (d, b) in buf.iter_mut().zip(s) {
        *d = *b as c_char;
    }
    buf[s.len()] = 0;
    Ok(())
}

// --- the exports ----------------------------------------------------------------------

/// The ABI version ([`TRAINPROF_ABI_VERSION`]).
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_abi_version() -> u32 {
    guard(0, || TRAINPROF_ABI_VERSION)
}

/// The library's version as a static NUL-terminated string (`"0.1.0"`); never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_version() -> *const c_char {
    guard(c"?".as_ptr(), || VERSION.as_ptr().cast())
}

/// Starts the hook: reads the profiler config (`SMPROFILER_CONFIG_PATH`, `TRAINPROF_*`),
/// picks the node id and starts the writer thread. `framework` is `"pytorch"`,
/// `"tensorflow"`, `"mxnet"` or `"xgboost"`: it names the Python-stats folder and says
/// which step the windows are tested at (`"pytorch"`: the global step, as smdebug's
/// PyTorch hook; the others: each mode's own step).
///
/// Idempotent: later calls return what the first one did (`OK`, or `DISABLED` when the
/// config turns profiling off). After `trainprof_shutdown` it returns `SHUT_DOWN`: one
/// hook per process.
///
/// # Safety
/// `framework` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_init(framework: *const c_char) -> TrainprofStatus {
    export(|| {
        // SAFETY: forwarded from the caller.
        let fw = unsafe { str_arg(framework) }?;
        let fw = FRAMEWORKS.iter().copied().find(|f| *f == fw).ok_or(TrainprofStatus::InvalidArgument)?;
        // Before the state changes: a child forked at any later moment is marked, so it
        // can never wait for an initialisation that its copy of the parent will not finish.
        AT_FORK.call_once(|| {
            // SAFETY: the handler is an extern "C" fn without arguments that never unwinds.
            unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
        });
        install_panic_hook();
        loop {
            match STATE.compare_exchange(UNINIT, INITIALIZING, AcqRel, Acquire) {
                Ok(_) => return Ok(init(fw)),
                Err(INITIALIZING) => std::thread::sleep(Duration::from_millis(1)),
                Err(RUNNING) => return Ok(TrainprofStatus::Ok),
                Err(DISABLED) => return Ok(TrainprofStatus::Disabled),
                Err(_) => return Ok(TrainprofStatus::ShutDown),
            }
        }
    })
}

/// Sets the state back when [`init`] does not finish (a panic): the hook is then off.
struct InitGuard(bool);

impl Drop for InitGuard {
    fn drop(&mut self) {
        if !self.0 {
            STATE.store(DISABLED, Release);
        }
    }
}

fn init(framework: &'static str) -> TrainprofStatus {
    let mut done = InitGuard(false);
    let env = |k: &str| std::env::var(k).ok();
    let loader = Loader::new(Sources::from_env(env));
    let loaded = loader.loaded();
    log(&format_args!("config {} ({:?})", loaded.path.display(), loaded.file));
    for p in &loaded.config.problems {
        log(&format_args!("config: {}: {}", p.key, p.message));
    }
    let config = loader.config().clone();
    let local_path_override = env("TRAINPROF_LOCAL_PATH").is_some_and(|v| !v.trim().is_empty());
    if !hook::records(&config, local_path_override) {
        let why = if config.enabled {
            "the config has no ProfilingParameters (set TRAINPROF_LOCAL_PATH to record anyway)"
        } else {
            "profiling is disabled"
        };
        log(&format_args!("{why}; the hook does nothing in this process"));
        STATE.store(DISABLED, Release);
        done.0 = true;
        return TrainprofStatus::Disabled;
    }
    let pid = std::process::id();
    let node_id = node::node_id(env, pid);
    let queue_capacity = env("TRAINPROF_QUEUE_EVENTS")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(QUEUE_EVENTS_DEFAULT, |v| v.clamp(*QUEUE_EVENTS_RANGE.start(), *QUEUE_EVENTS_RANGE.end()));
    let max_names = env("TRAINPROF_MAX_NAMES")
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(MAX_NAMES_DEFAULT, |v| v.clamp(*MAX_NAMES_RANGE.start(), *MAX_NAMES_RANGE.end()));
    let hook = Hook::new(Options {
        framework,
        config,
        node_id,
        os_pid: pid,
        queue_capacity,
        base_us: hook::now_us(),
        local_path_override,
        max_names,
    });
    if let Err(e) = hook.spawn_writer(Some(loader), hook::now_us) {
        log(&format_args!("cannot start the writer thread: {e}; the hook is off"));
        STATE.store(DISABLED, Release);
        done.0 = true;
        return TrainprofStatus::Io;
    }
    log(&format_args!(
        "profiling {framework}: node {}, timelines under {}",
        hook.node_id(),
        hook.local_path().join("framework").display()
    ));
    if hook.hang.is_some() {
        match crate::hang::spawn(Arc::clone(&hook)) {
            Ok(()) => log(&format_args!(
                "hang detection on: dumps go under {}",
                hook.local_path().join("framework/hangs").display()
            )),
            Err(e) => log(&format_args!("cannot start the watchdog thread: {e}; hang detection is off")),
        }
    }
    cost::start();
    let _ = HOOK.set(hook);
    AT_EXIT.call_once(|| {
        // SAFETY: the handler is an extern "C" fn without arguments that never unwinds.
        unsafe { libc::atexit(at_exit) };
    });
    STATE.store(RUNNING, Release);
    done.0 = true;
    TrainprofStatus::Ok
}

/// This library has its own std, so its panic hook only sees panics raised in this
/// library. A caught panic becomes one log line, not a backtrace in the trainer's output.
fn install_panic_hook() {
    PANIC_HOOK.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            log(&format_args!(
                "internal error{at} (caught; the call returned an error and the trainer goes on)"
            ));
        }));
    });
}

/// `pthread_atfork` child handler: async-signal-safe, one atomic store.
extern "C" fn in_forked_child() {
    FORKED.store(true, Relaxed);
}

/// `atexit` handler: seals the open timeline file if the trainer never shut the hook down.
extern "C" fn at_exit() {
    guard((), || {
        if FORKED.load(Relaxed) {
            return;
        }
        if STATE.load(Acquire) != RUNNING {
            return;
        }
        let ms = std::env::var("TRAINPROF_SHUTDOWN_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(EXIT_TIMEOUT_MS_DEFAULT);
        shutdown(ms);
    })
}

fn shutdown(timeout_ms: u64) -> TrainprofStatus {
    match STATE.compare_exchange(RUNNING, STOPPING, AcqRel, Acquire) {
        Ok(_) => {
            let Some(hook) = HOOK.get() else { return TrainprofStatus::Internal };
            if let Some(h) = hook.hang.as_deref() {
                crate::hang::stop(h);
            }
            let finished = hook.stop_writer(Duration::from_millis(timeout_ms));
            STATE.store(DOWN, Release);
            cost::write(hook);
            let s = hook.stats();
            log(&format_args!(
                "shut down: {} events written in {} files, {} dropped (queue full), {} dropped (writer){}",
                s.written,
                s.files_sealed,
                s.dropped_queue_full,
                s.dropped_writer,
                if finished { "" } else { "; the writer did not finish in time" }
            ));
            if finished { TrainprofStatus::Ok } else { TrainprofStatus::Timeout }
        }
        Err(UNINIT | INITIALIZING) => TrainprofStatus::NotInitialized,
        Err(DISABLED) => TrainprofStatus::Disabled,
        Err(_) => TrainprofStatus::ShutDown,
    }
}

/// Drains the queue, seals the open timeline file and stops the writer, waiting at most
/// `timeout_ms`. Afterwards events are refused (`SHUT_DOWN`); Python-window calls still
/// work, so the post-close window can end at exit. Returns `TIMEOUT` when the writer did
/// not finish in time (it goes on in the background).
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_shutdown(timeout_ms: u32) -> TrainprofStatus {
    export(|| Ok(shutdown(u64::from(timeout_ms))))
}

/// Registers a name (a phase, an event name, an argument key) and writes its id to
/// `*out_id`. The same name always gets the same id. Call it once per name, not per event.
/// When the name table is full (`TRAINPROF_MAX_NAMES` distinct names, default 65536)
/// a new name gets `TRAINPROF_NAME_OVER_LIMIT` and the call returns `NAME_LIMIT`: events
/// that use that id are dropped and counted (`trainprof_dropped_names`).
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `out_id` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_register_name(name: *const c_char, out_id: *mut u32) -> TrainprofStatus {
    export(|| {
        let hook = running()?;
        let _t = cost::Timer::new(CostPart::AbiName);
        // SAFETY: forwarded from the caller.
        let name = unsafe { str_arg(name) }?;
        let out_id = non_null(out_id)?;
        let id = hook.register_name(name);
        // SAFETY: not NULL, and the caller promises it is valid for a write.
        unsafe { out_id.write(id) };
        Ok(if id == TRAINPROF_NAME_OVER_LIMIT { TrainprofStatus::NameLimit } else { TrainprofStatus::Ok })
    })
}

/// Records one complete event: `phase_id` and `name_id` from `trainprof_register_name`,
/// start and end in µs since the epoch, `step` (< 0: the current step), and up to 4
/// arguments (`args` may be NULL when `n_args` is 0). Never blocks: a full queue drops
/// the event and returns `DROPPED`.
///
/// # Safety
/// `args` is NULL or points to `n_args` valid `TrainprofArg`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_record(
    phase_id: u32,
    name_id: u32,
    start_us: i64,
    end_us: i64,
    step: i64,
    args: *const TrainprofArg,
    n_args: u32,
) -> TrainprofStatus {
    export(|| {
        let hook = running()?;
        let _t = cost::record_timer();
        let args = match n_args {
            0 => &[][..],
            n if n as usize > TRAINPROF_MAX_ARGS => return Err(TrainprofStatus::InvalidArgument),
            _ if args.is_null() => return Err(TrainprofStatus::NullArgument),
            // SAFETY: args is not NULL and the caller promises n_args valid elements.
            n => unsafe { std::slice::from_raw_parts(args, n as usize) },
        };
        Ok(hook.record(phase_id, name_id, start_us, end_us, step, args))
    })
}

/// Begins a step of `mode` (a `TrainprofMode`). `step` ≥ 0 sets the step number; < 0
/// takes the next one of that mode (counted from 0). The number used is written to
/// `*out_step` unless it is NULL. Every call also advances the global step (every mode
/// counted together, from 0; set to `step` when that is ≥ 0), which the windows of a
/// `"pytorch"` hook are tested at. A config reloaded in the background applies from here.
///
/// # Safety
/// `out_step` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_step_begin(mode: i32, step: i64, out_step: *mut i64) -> TrainprofStatus {
    export(|| {
        let hook = running()?;
        let _t = cost::Timer::new(CostPart::AbiStep);
        let mode = TrainprofMode::from_i32(mode).ok_or(TrainprofStatus::InvalidArgument)?;
        cost::step();
        let n = hook.step_begin(mode, step, hook::now_us());
        if let Some(out_step) = NonNull::new(out_step) {
            // SAFETY: not NULL, and the caller promises it is valid for a write.
            unsafe { out_step.write(n as i64) };
        }
        Ok(TrainprofStatus::Ok)
    })
}

/// Ends the current step and records its `Step:ModeKeys.<MODE>` event. `NO_STEP` when no
/// step is in progress.
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_step_end() -> TrainprofStatus {
    export(|| {
        let hook = running()?;
        let _t = cost::Timer::new(CostPart::AbiStep);
        Ok(hook.step_end(hook::now_us()))
    })
}

/// The hook's clock: µs since the epoch (what event times are measured in).
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_now_us() -> i64 {
    guard(0, hook::now_us)
}

/// Is `feature`'s window (a `TrainprofFeature`) open at `step`? `step` < 0 asks about the
/// current step as smdebug counts it for the framework: the global step for `"pytorch"`,
/// the current mode's step otherwise.
/// Writes 1 or 0 to `*out_active`. `metrics_name` is needed for the dataloader feature
/// (its `MetricsRegex` is matched against it) and ignored otherwise (may be NULL).
///
/// # Safety
/// `metrics_name` is NULL or a NUL-terminated string; `out_active` is NULL or valid for a
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_window_active(
    feature: i32,
    step: i64,
    metrics_name: *const c_char,
    out_active: *mut i32,
) -> TrainprofStatus {
    // SAFETY: out_active is forwarded from the caller.
    unsafe {
        export_out(out_active, 0, |active| {
            let hook = running()?;
            let _t = cost::Timer::new(CostPart::AbiActive);
            let feature = TrainprofFeature::from_i32(feature).ok_or(TrainprofStatus::InvalidArgument)?;
            let name = match feature {
                // SAFETY: forwarded from the caller.
                TrainprofFeature::Dataloader => Some(str_arg(metrics_name)?),
                _ => None,
            };
            *active = window_active(hook, feature, step, name);
            Ok(TrainprofStatus::Ok)
        })
    }
}

/// A Python-profiling boundary (a `TrainprofBoundary`): fills `*out` with the window that
/// ended here (if any) and the one that starts (if any). Works until the process exits,
/// also after `trainprof_shutdown`, so that the post-close window can end at exit.
/// `BUFFER_TOO_SMALL` (a `LocalPath` near `TRAINPROF_PATH_MAX`) loses the ended window's
/// directory; `started` is still filled in.
///
/// # Safety
/// `out` is NULL or valid for a write of a `TrainprofPythonWindow`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_python_boundary(
    boundary: i32,
    out: *mut TrainprofPythonWindow,
) -> TrainprofStatus {
    // SAFETY: out is forwarded from the caller.
    unsafe {
        export_out(out, TrainprofPythonWindow::NOTHING, |w| {
            let hook = hook_any()?;
            let _t = cost::Timer::new(CostPart::AbiBoundary);
            let b = TrainprofBoundary::from_i32(boundary).ok_or(TrainprofStatus::InvalidArgument)?;
            python_boundary(hook, b, w)
        })
    }
}

/// `trainprof_window_active`'s answer (1 or 0), on the hook's clock at the call.
fn window_active(hook: &Hook, feature: TrainprofFeature, step: i64, name: Option<&str>) -> i32 {
    i32::from(hook.is_active(feature, step, name, hook::now_us() as f64 / 1e6))
}

/// `trainprof_python_boundary`'s work: applies boundary `b` and fills `w` (made
/// [`TrainprofPythonWindow::NOTHING`] by the caller).
fn python_boundary(
    hook: &Hook,
    b: TrainprofBoundary,
    w: &mut TrainprofPythonWindow,
) -> Result<TrainprofStatus, TrainprofStatus> {
    let o = hook.python_boundary(b, hook::now_us_f64);
    // What starts first: a path too long for the buffer must not hide it.
    if let Some((profiler, timer)) = o.started {
        w.started = 1;
        w.profiler = match profiler {
            PythonProfiler::CProfile => TrainprofPythonProfiler::Cprofile,
            PythonProfiler::Pyinstrument => TrainprofPythonProfiler::Pyinstrument,
        } as i32;
        w.timer = match timer {
            None => TrainprofCprofileTimer::None,
            Some(CProfileTimer::CpuTime) => TrainprofCprofileTimer::CpuTime,
            Some(CProfileTimer::OffCpuTime) => TrainprofCprofileTimer::OffCpuTime,
            Some(_) => TrainprofCprofileTimer::TotalTime,
        } as i32;
    }
    if let Some((name, profiler)) = o.ended {
        let folder = match profiler {
            PythonProfiler::CProfile => python_window::CPROFILE_DIR,
            PythonProfiler::Pyinstrument => python_window::PYINSTRUMENT_DIR,
        };
        let (done, tmp) = hook.python_stats_paths(folder, &name);
        copy_out(done.to_string_lossy().as_bytes(), &mut w.ended_dir)?;
        copy_out(tmp.to_string_lossy().as_bytes(), &mut w.ended_tmp_dir)?;
        w.ended = 1;
    }
    Ok(TrainprofStatus::Ok)
}

/// A step's start in one call, for a trainer that makes these calls at every step (the
/// PyTorch adapter): exactly, in this order and each on its own clock reading,
///
/// 1. `trainprof_step_end()` when a step is in progress (none is not an error here);
/// 2. `trainprof_step_begin(mode, -1, out_step)`: the next step of `mode`;
/// 3. `trainprof_python_boundary(TRAINPROF_BOUNDARY_STEP_START, out_window)`;
/// 4. `trainprof_window_active(TRAINPROF_FEATURE_DETAILED, detailed_step, NULL, …)`:
///    `detailed_step` < 0 asks about the current step (the one just begun, counted as that
///    function counts it); its answer is the bit `TRAINPROF_STEP_NEXT_DETAILED` of
///    `*out_windows`;
/// 5. the bit `TRAINPROF_STEP_NEXT_MEMORY` of `*out_windows`: a triggered or requested
///    memory window (`AutoProfilingConfig`, `trainprof trigger --memory`) is open at that
///    same step (docs/formats.md, "Memory windows"); the configured memory window is not in
///    it (`trainprof_window_active` answers for it). While no detector runs and no request
///    is armed this costs two relaxed loads.
///
/// The status is the Python boundary's (`OK`, or `BUFFER_TOO_SMALL` as
/// `trainprof_python_boundary` returns it); the step end's own status (`NO_STEP`,
/// `DROPPED`) is not reported. All three pointers are required: with one NULL the call
/// does nothing and writes nothing (`NULL_ARGUMENT`). When the hook is not running
/// (`NOT_INITIALIZED`, `SHUT_DOWN`, `DISABLED`) or `mode` is unknown (`INVALID_ARGUMENT`),
/// nothing is done and the "nothing" values are written: `*out_step` = -1, `*out_window`
/// = nothing ended or started, `*out_windows` = 0 (as in a fork()ed child,
/// `FORKED_CHILD`); the caller may then make the separate calls instead
/// (`trainprof_python_boundary` also works after `trainprof_shutdown`). After a caught
/// panic (`INTERNAL`) the out-values are left as the caller made them.
///
/// # Safety
/// `out_step`, `out_window` and `out_windows` are each NULL or valid for a write of
/// their type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_step_next(
    mode: i32,
    detailed_step: i64,
    out_step: *mut i64,
    out_window: *mut TrainprofPythonWindow,
    out_windows: *mut i32,
) -> TrainprofStatus {
    // SAFETY: the out-pointers are forwarded from the caller.
    unsafe {
        export_out((out_step, out_window, out_windows), (-1, TrainprofPythonWindow::NOTHING, 0), |out| {
            let hook = running()?;
            let _t = cost::Timer::new(CostPart::AbiStep);
            let mode = TrainprofMode::from_i32(mode).ok_or(TrainprofStatus::InvalidArgument)?;
            cost::step();
            let (step, window, windows) = out;
            // NO_STEP (none in progress) is what "if one is in progress" means here;
            // DROPPED / DISABLED are counted by the hook as for trainprof_step_end.
            let _ = hook.step_end(hook::now_us());
            *step = hook.step_begin(mode, -1, hook::now_us()) as i64;
            let status = python_boundary(hook, TrainprofBoundary::StepStart, window).unwrap_or_else(|e| e);
            let detailed = window_active(hook, TrainprofFeature::Detailed, detailed_step, None);
            let memory = i32::from(hook.extra_memory_open(detailed_step));
            *windows =
                (detailed * TrainprofStepNext::Detailed as i32) | (memory * TrainprofStepNext::Memory as i32);
            Ok(status)
        })
    }
}

/// Writes the node id (`<rank>-<host>`) NUL-terminated into `buf` of `cap` bytes.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_node_id(buf: *mut c_char, cap: usize) -> TrainprofStatus {
    export(|| {
        // SAFETY: forwarded from the caller.
        let out = unsafe { out_buf(buf, cap) }?;
        copy_out(hook_any()?.node_id().as_bytes(), out)?;
        Ok(TrainprofStatus::Ok)
    })
}

/// Writes the effective `LocalPath` (where the timelines and Python stats go: the
/// config's `LocalPath`, or `TRAINPROF_LOCAL_PATH`, as resolved once by `trainprof_init`)
/// NUL-terminated into `buf` of `cap` bytes: the path's bytes as the file system has them
/// (not necessarily UTF-8). `BUFFER_TOO_SMALL` leaves `buf` as it was; a buffer of
/// `TRAINPROF_PATH_MAX` bytes holds any path the hook can write under. Works after
/// `trainprof_shutdown` too; `DISABLED` when the config turned profiling off.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_local_path(buf: *mut c_char, cap: usize) -> TrainprofStatus {
    use std::os::unix::ffi::OsStrExt as _;
    export(|| {
        // SAFETY: forwarded from the caller.
        let out = unsafe { out_buf(buf, cap) }?;
        copy_out(hook_any()?.local_path().as_os_str().as_bytes(), out)?;
        Ok(TrainprofStatus::Ok)
    })
}

/// Fills `*out` with the hook's counters (zeros before init and in a forked child).
///
/// # Safety
/// `out` is NULL or valid for a write of a `TrainprofStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_stats(out: *mut TrainprofStats) -> TrainprofStatus {
    // SAFETY: out is forwarded from the caller.
    unsafe {
        export_out(out, TrainprofStats::default(), |stats| {
            *stats = hook_any()?.stats().into();
            Ok(TrainprofStatus::Ok)
        })
    }
}

/// Adds `calls` calls and `ns` nanoseconds to the hook's cost part `part` (a word of
/// docs/formats.md, "The hook's own cost": `python.step`, `python.record`,
/// `python.active`, `window.detailed.open`, `window.detailed.close`, `window.python.open`,
/// `window.python.close`), for a caller that times its own entry points (the Python package,
/// once before it shuts the hook down). The record is written at `trainprof_shutdown`.
/// `INVALID_ARGUMENT` for another word (the C ABI's own parts are timed inside the library).
///
/// # Safety
/// `part` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_cost_add(part: *const c_char, calls: u64, ns: u64) -> TrainprofStatus {
    export(|| {
        let _ = running()?;
        // SAFETY: forwarded from the caller.
        let word = unsafe { str_arg(part) }?;
        let part =
            CostPart::parse(word).filter(|p| p.from_python()).ok_or(TrainprofStatus::InvalidArgument)?;
        cost::add(part, calls, ns);
        Ok(TrainprofStatus::Ok)
    })
}

/// Fills `*out` with the caps of every window (`WindowCapsConfig`, docs/formats.md,
/// "Window caps"), as the config now says; the defaults before init, in a forked child and
/// when profiling is off.
///
/// # Safety
/// `out` is NULL or valid for a write of a `TrainprofWindowCaps`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_window_caps(out: *mut TrainprofWindowCaps) -> TrainprofStatus {
    let defaults = window_caps(trainprof_config::WindowCaps::default());
    // SAFETY: out is forwarded from the caller.
    unsafe {
        export_out(out, defaults, |caps| {
            *caps = window_caps(running()?.window_caps());
            Ok(TrainprofStatus::Ok)
        })
    }
}

fn window_caps(c: trainprof_config::WindowCaps) -> TrainprofWindowCaps {
    TrainprofWindowCaps {
        detailed_max_events: c.detailed_max_events,
        detailed_max_bytes: c.detailed_max_bytes,
        dataloader_max_events: c.dataloader_max_events,
        python_max_samples: c.python_max_samples,
    }
}

/// The caller stopped `feature`'s window at its cap (a `TrainprofCap`: it reached `value`,
/// the cap being `limit`), at `step` (< 0: the current step, in the windows' numbering;
/// docs/formats.md, "Window caps"): the window
/// answers no for the rest of its steps (`trainprof_window_active`; the Python windows
/// start none), and one `trainprof:WindowCapped` instant event and one log line say so.
/// `DROPPED` when the window was capped already (once per window) or the event could not
/// be queued; `INVALID_ARGUMENT` for an unknown feature or cap, or SMDataParallel.
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_window_capped(
    feature: i32,
    cap: i32,
    value: u64,
    limit: u64,
    step: i64,
) -> TrainprofStatus {
    export(|| {
        let hook = running()?;
        let feature = TrainprofFeature::from_i32(feature).ok_or(TrainprofStatus::InvalidArgument)?;
        let cap = TrainprofCap::from_i32(cap).ok_or(TrainprofStatus::InvalidArgument)?;
        Ok(hook.window_capped(feature, cap, value, limit, step, hook::now_us()))
    })
}

/// Fills `*out` with what `MemoryProfilingConfig` asks for (docs/formats.md, "Memory
/// windows"), as the config now says; all zeros (off) before init, in a forked child and
/// when profiling is off.
///
/// # Safety
/// `out` is NULL or valid for a write of a `TrainprofMemorySettings`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_memory_settings(out: *mut TrainprofMemorySettings) -> TrainprofStatus {
    // SAFETY: out is forwarded from the caller.
    unsafe {
        export_out(out, TrainprofMemorySettings::default(), |settings| {
            let hook = running()?;
            if !hook.is_enabled() {
                return Ok(TrainprofStatus::Disabled);
            }
            let m = hook.memory_settings();
            *settings = TrainprofMemorySettings {
                max_entries: m.max_entries,
                enabled: i32::from(m.feature.is_enabled()),
                oom_snapshot: i32::from(m.oom_on()),
                stacks: match m.stacks {
                    trainprof_config::Stacks::Python => TrainprofStacks::Python as i32,
                    trainprof_config::Stacks::All => TrainprofStacks::All as i32,
                },
            };
            Ok(TrainprofStatus::Ok)
        })
    }
}

/// Makes the new, empty file of a PyTorch memory snapshot (docs/formats.md, "Memory
/// windows"): `framework/memory/<node>/window-<first_step>-<last_step>-<µs>.pickle` for
/// `kind` `WINDOW`, `oom-<first_step>-<µs>.pickle` for `OOM` (`last_step` is then
/// ignored), each folder opened without following a link and the file created with
/// `O_EXCL | O_NOFOLLOW`, mode 0600. Writes its path NUL-terminated into `buf` of `cap`
/// bytes and a descriptor open for writing (close-on-exec; the caller owns and closes it)
/// into `*out_fd`. `IO` (one log line says why) when the file cannot be made: a link or a
/// file at its name, a folder that is a link; `INVALID_ARGUMENT` for an unknown kind or
/// steps out of order; `BUFFER_TOO_SMALL` (the file is removed again) when the path does
/// not fit: `TRAINPROF_PATH_MAX` bytes always do.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes; `out_fd` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_memory_snapshot_create(
    kind: i32,
    first_step: i64,
    last_step: i64,
    buf: *mut c_char,
    cap: usize,
    out_fd: *mut i32,
) -> TrainprofStatus {
    use std::os::fd::IntoRawFd as _;
    use std::os::unix::ffi::OsStrExt as _;
    use trainprof_output::protocol::memory_snapshot::SnapshotKind;
    export(|| {
        let fd_out = non_null(out_fd)?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { out_buf(buf, cap) }?;
        let hook = running()?;
        let kind = match kind {
            k if k == TrainprofSnapshotKind::Window as i32 => SnapshotKind::Window,
            k if k == TrainprofSnapshotKind::Oom as i32 => SnapshotKind::Oom,
            _ => return Err(TrainprofStatus::InvalidArgument),
        };
        let first = u64::try_from(first_step).map_err(|_| TrainprofStatus::InvalidArgument)?;
        let last = match kind {
            SnapshotKind::Window => u64::try_from(last_step).map_err(|_| TrainprofStatus::InvalidArgument)?,
            SnapshotKind::Oom => first,
        };
        if last < first {
            return Err(TrainprofStatus::InvalidArgument);
        }
        let us = u64::try_from(hook::now_us()).unwrap_or(0);
        let made = hook.memory_snapshot_create(kind, first, last, us).map_err(|e| {
            log(&format_args!("cannot make the memory snapshot's file: {e}"));
            TrainprofStatus::Io
        })?;
        let (dir, name, file) = made;
        if let Err(e) = copy_out(dir.display(&name).as_os_str().as_bytes(), out) {
            let _ = dir.unlink_if_same(&name, &file);
            return Err(e);
        }
        // SAFETY: not NULL, and the caller promises it is valid for a write.
        unsafe { fd_out.as_ptr().write(file.into_raw_fd()) };
        Ok(TrainprofStatus::Ok)
    })
}

/// Makes a new, empty file for torch.profiler's chrome trace of a detailed window
/// (docs/formats.md, "Detailed windows through torch's own trace"), in the hook's own folder
/// `<LocalPath>/.trainprof-torch/` (mode 0700; with `<name>.tmp` beside it, which torch
/// writes first): writes its path NUL-terminated into `buf` of `cap` bytes and the token
/// that hands it back into `*out_token`. The caller has torch write its trace to that path,
/// then calls `trainprof_torch_trace_import` (or `trainprof_torch_trace_discard` when torch
/// could not write it). `IO` (one log line says why) when the file cannot be made;
/// `BUFFER_TOO_SMALL` (nothing kept) when the path does not fit: `TRAINPROF_PATH_MAX`
/// bytes always do.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes; `out_token` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_torch_trace_create(
    buf: *mut c_char,
    cap: usize,
    out_token: *mut u64,
) -> TrainprofStatus {
    use std::os::unix::ffi::OsStrExt as _;
    export(|| {
        let token_out = non_null(out_token)?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { out_buf(buf, cap) }?;
        let hook = running()?;
        let (token, path) = hook.torch_trace_create().map_err(|e| {
            log(&format_args!("cannot make a file for torch.profiler's trace: {e}"));
            TrainprofStatus::Io
        })?;
        if let Err(e) = copy_out(path.as_os_str().as_bytes(), out) {
            hook.torch_trace_discard(token);
            return Err(e);
        }
        // SAFETY: not NULL, and the caller promises it is valid for a write.
        unsafe { token_out.as_ptr().write(token) };
        Ok(TrainprofStatus::Ok)
    })
}

/// Hands the trace file `token` (from `trainprof_torch_trace_create`), now written by torch,
/// to the hook's writer thread, which writes its CPU ops as the window's `cpu_functions`
/// events (docs/formats.md, "Detailed windows through torch's own trace") and removes the
/// files. Each op is numbered with the step it began in: `step_num[i]` for an op that began
/// at or after `step_start_us[i]` (µs since the epoch, in increasing order; `n_steps` of
/// each, at most 1,048,576), before the next. The window writes at most `max_events` events
/// (its `DetailedMaxEvents`), `events_before` of which it wrote already; at that cap the rest
/// are left out and, when `notify_cap` is 1, one `trainprof:WindowCapped` event says so.
/// `INVALID_ARGUMENT` for a token not waiting (unknown, handed back already) or steps out of
/// order; the trace is then not read.
///
/// # Safety
/// `step_start_us` and `step_num` are each NULL (only when `n_steps` is 0) or valid for
/// `n_steps` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_torch_trace_import(
    token: u64,
    step_start_us: *const i64,
    step_num: *const i64,
    n_steps: u32,
    events_before: u64,
    max_events: u64,
    notify_cap: i32,
) -> TrainprofStatus {
    export(|| {
        let hook = running()?;
        let n = n_steps as usize;
        if n > crate::torch_trace::MAX_BOUNDARIES {
            return Err(TrainprofStatus::InvalidArgument);
        }
        let (starts, steps) = match n {
            0 => (&[][..], &[][..]),
            _ if step_start_us.is_null() || step_num.is_null() => return Err(TrainprofStatus::NullArgument),
            // SAFETY: not NULL, and the caller promises n_steps valid elements of each.
            _ => unsafe {
                (std::slice::from_raw_parts(step_start_us, n), std::slice::from_raw_parts(step_num, n))
            },
        };
        let boundaries = starts.iter().copied().zip(steps.iter().copied()).collect();
        hook.torch_trace_import(token, boundaries, events_before, max_events, notify_cap == 1)
            .map_err(|_| TrainprofStatus::InvalidArgument)?;
        Ok(TrainprofStatus::Ok)
    })
}

/// Removes the trace file `token` unread (torch could not write it). `INVALID_ARGUMENT` for
/// a token not waiting. Works after `trainprof_shutdown` too.
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_torch_trace_discard(token: u64) -> TrainprofStatus {
    export(|| {
        if hook_any()?.torch_trace_discard(token) {
            Ok(TrainprofStatus::Ok)
        } else {
            Err(TrainprofStatus::InvalidArgument)
        }
    })
}

/// Events dropped so far, for any reason (0 before init and in a forked child).
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_dropped_events() -> u64 {
    edge(0, 0, || hook_any().map_or(0, |h| h.dropped()))
}

/// Events dropped because they use a name that did not fit in the name table
/// (`TRAINPROF_NAME_OVER_LIMIT`); part of `trainprof_dropped_events` (0 before init and in
/// a forked child).
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_dropped_names() -> u64 {
    edge(0, 0, || hook_any().map_or(0, |h| h.stats().dropped_names))
}

/// 1 when `HangDetectionConfig` is on in this (initialised, recording) process, else 0:
/// the Python package then registers its part (docs/formats.md, "Hang and crash dumps").
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_hang_enabled() -> i32 {
    edge(0, 0, || i32::from(running().is_ok_and(|h| h.hang.is_some())))
}

/// A real-time signal that nobody in the process uses, for the caller's
/// `faulthandler.register`: its C-level disposition is the default (a handler a C library
/// installed counts, which Python's own table cannot see), no thread of the trainer's blocks it
/// (a `sigwait` or `signalfd` user), and it is not the hook's own native-stack signal; from
/// `SIGRTMIN + 4` up. 0 when there is none or hang detection is off (docs/trainer.md,
/// "Signals").
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_hang_free_signal() -> i32 {
    edge(0, 0, || {
        if !running().is_ok_and(|h| h.hang.is_some()) {
            return 0;
        }
        crate::signals::free_real_time(false, &[crate::hang::native_signal_now()]).unwrap_or(0)
    })
}

/// Registers the file (`fd`, an anonymous memfd the caller keeps open) that
/// `faulthandler.register(signum, file=fd, all_threads=True)`, called just before, writes
/// every Python thread's stack to when `signum` is raised: a dump raises it on the
/// watchdog's thread (or the crashing thread) and copies what faulthandler wrote into
/// `python_stacks.txt`, and only while the handler installed now is still the one installed.
/// `DISABLED` when hang detection is off; `INVALID_ARGUMENT` when no handler is installed
/// for `signum`.
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_hang_python(fd: i32, signum: i32) -> TrainprofStatus {
    export(|| {
        let hook = running()?;
        let hang = hook.hang.as_deref().ok_or(TrainprofStatus::Disabled)?;
        if fd < 0 || signum <= 0 || signum > 64 || !hang.set_python(fd, signum) {
            return Err(TrainprofStatus::InvalidArgument);
        }
        Ok(TrainprofStatus::Ok)
    })
}

/// Prepares a crash's dump: opens the node's dump folder and installs the hook's handler for
/// SIGSEGV, SIGBUS, SIGABRT and SIGFPE in front of the dispositions found, which it calls as
/// the kernel would have; a dump is written only when the signal is going to end the process
/// (docs/trainer.md, "Signals"). Its Python stacks come from the registration of
/// `trainprof_hang_python`, when there is one. `trainer_faulthandler` is 1 when the trainer
/// enabled Python's `faulthandler` itself (it then gives a fault back by raising it again,
/// which the handler waits for to write the dump first). `DISABLED` when hang detection is
/// off; `IO` when the folder cannot be made.
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_hang_arm_crash(trainer_faulthandler: i32) -> TrainprofStatus {
    export(|| {
        let hook = HOOK.get().filter(|_| running().is_ok()).ok_or(TrainprofStatus::NotInitialized)?;
        if hook.hang.is_none() {
            return Err(TrainprofStatus::Disabled);
        }
        crate::hang::arm_fatal(hook, trainer_faulthandler == 1).map_err(|e| {
            log(&format_args!("hang detection: cannot prepare a crash dump: {e}"));
            TrainprofStatus::Io
        })?;
        Ok(TrainprofStatus::Ok)
    })
}

/// Writes an `exception` dump (`traceback.txt`, the formatted traceback of an uncaught
/// exception, and `stall.json`) on the calling thread. `DISABLED` when hang detection is
/// off; `IO` when it could not be written.
///
/// # Safety
/// `text` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_hang_exception(text: *const c_char) -> TrainprofStatus {
    export(|| {
        // SAFETY: forwarded from the caller.
        let text = unsafe { str_arg(text) }?;
        let hook = hook_any()?;
        let hang = hook.hang.as_deref().ok_or(TrainprofStatus::Disabled)?;
        match crate::hang::dump(hook, hang, None, crate::hang::DumpKind::Exception, None, None, Some(text)) {
            Some(_) => Ok(TrainprofStatus::Ok),
            None => Err(TrainprofStatus::Io),
        }
    })
}

/// Panics inside the guard and returns what any export returns after an internal panic
/// (`INTERNAL`). It exists so that tests can prove that no panic crosses the ABI.
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_selftest_panic() -> TrainprofStatus {
    export(|| {
        install_panic_hook();
        // black_box: a real panic at run time, not one the compiler can see coming.
        if std::hint::black_box(true) {
            panic!("trainprof_selftest_panic");
        }
        Ok(TrainprofStatus::Ok)
    })
}

// --- LD_PRELOAD without code changes ---------------------------------------------------

/// Run at load from `.init_array` (the dynamic loader calls it before `main`, or inside
/// `dlopen`). Without `TRAINPROF_AUTOSTART` it reads one environment variable and returns:
/// nothing runs at load, as the crate docs promise. With it, the library initialises
/// itself as `trainprof_init` would, so an unmodified program (Python or not) preloaded
/// with `LD_PRELOAD` is served time-based windows (docs/formats.md, "Without code changes:
/// LD_PRELOAD").
///
/// Safe in a constructor: it reads the environment, the config file and the resource
/// config, calls `pthread_atfork` and `atexit`, and starts the writer thread. glibc allows
/// threads started from a constructor; inside a `dlopen` the new threads wait for the
/// loader's lock until the constructor returns, and the constructor never waits for them.
#[used]
#[unsafe(link_section = ".init_array")]
static AUTOSTART: extern "C" fn() = autostart;

/// The framework an autostarted hook takes: `TRAINPROF_AUTOSTART=1` (or `true`, `yes`,
/// `on`) means `"pytorch"`; a framework's name means that framework; `0` (or `false`,
/// `no`, `off`, empty) or no variable means no autostart; anything else is an error (no
/// autostart, one line).
pub fn autostart_framework(value: Option<&str>) -> Autostart {
    let Some(v) = value else { return Autostart::Off };
    let v = v.trim().to_ascii_lowercase();
    match v.as_str() {
        "1" | "true" | "yes" | "on" => Autostart::Start("pytorch"),
        "" | "0" | "false" | "no" | "off" => Autostart::Off,
        _ => FRAMEWORKS.iter().copied().find(|f| *f == v).map_or(Autostart::Invalid, Autostart::Start),
    }
}

/// What `TRAINPROF_AUTOSTART` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Autostart {
    Off,
    /// Start, with this framework.
    Start(&'static str),
    /// A value that is none of the accepted ones.
    Invalid,
}

extern "C" fn autostart() {
    guard((), || {
        let Some(v) = std::env::var_os("TRAINPROF_AUTOSTART") else { return };
        let fw = match autostart_framework(Some(v.to_str().unwrap_or("?"))) {
            Autostart::Start(fw) => fw,
            Autostart::Off => return,
            Autostart::Invalid => {
                log(&format_args!(
                    "TRAINPROF_AUTOSTART={v:?} is not 1, 0 or a framework name ({}); not started",
                    FRAMEWORKS.join(", ")
                ));
                return;
            }
        };
        let Ok(fw) = std::ffi::CString::new(fw) else { return };
        // SAFETY: a NUL-terminated string that outlives the call.
        let status = unsafe { trainprof_init(fw.as_ptr()) };
        if status != TrainprofStatus::Ok {
            log(&format_args!("TRAINPROF_AUTOSTART: trainprof_init returned {status:?}"));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn autostart_values() {
        assert_eq!(autostart_framework(None), Autostart::Off);
        assert_eq!(autostart_framework(Some("1")), Autostart::Start("pytorch"));
        assert_eq!(autostart_framework(Some(" TRUE")), Autostart::Start("pytorch"));
        assert_eq!(autostart_framework(Some("tensorflow")), Autostart::Start("tensorflow"));
        assert_eq!(autostart_framework(Some("0")), Autostart::Off);
        assert_eq!(autostart_framework(Some("")), Autostart::Off);
        assert_eq!(autostart_framework(Some("maybe")), Autostart::Invalid);
    }
}
