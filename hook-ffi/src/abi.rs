//! The exported C functions. Each one runs inside [`guard`]; see the crate docs for the
//! contract. The process-wide state lives here: one [`Hook`] per process.

use std::ffi::{CStr, c_char};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::*};
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;

use trainprof_config::{CProfileTimer, Loader, PythonProfiler, Sources};

use crate::event::{TRAINPROF_MAX_ARGS, TrainprofArg};
use crate::hook::{self, FRAMEWORKS, Hook, Options, TrainprofFeature, TrainprofMode};
use crate::python::TrainprofBoundary;
use crate::status::TrainprofStatus;
use crate::{TRAINPROF_ABI_VERSION, guard, log, node};

/// The crate version, NUL-terminated for C.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");

/// Default and bounds of the event queue (`TRAINPROF_QUEUE_EVENTS`). An event is 104
/// bytes, so the default holds 3.4 MB.
const QUEUE_EVENTS_DEFAULT: usize = 32_768;
const QUEUE_EVENTS_RANGE: std::ops::RangeInclusive<usize> = 16..=4_194_304;

/// Bounds of `TRAINPROF_MAX_NAMES` (default [`hook::MAX_NAMES_DEFAULT`]).
const MAX_NAMES_RANGE: std::ops::RangeInclusive<usize> = 16..=16_777_216;

/// How long the exit handler waits for the writer (`TRAINPROF_SHUTDOWN_TIMEOUT_MS`).
const EXIT_TIMEOUT_MS_DEFAULT: u64 = 5_000;

/// Bytes in each path buffer of [`TrainprofPythonWindow`] (PATH_MAX).
pub const TRAINPROF_PATH_MAX: usize = 4096;

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

/// A profiler for Python windows.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofPythonProfiler {
    None = 0,
    Cprofile = 1,
    Pyinstrument = 2,
}

/// A cProfile timer.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainprofCprofileTimer {
    None = 0,
    TotalTime = 1,
    CpuTime = 2,
    OffCpuTime = 3,
}

/// What `trainprof_python_boundary` decided.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TrainprofPythonWindow {
    /// 1 when a window ended here: stop its profiler, write its stats into `ended_tmp_dir`,
    /// then rename that directory to `ended_dir`.
    pub ended: i32,
    /// 1 when a window starts here: start a `profiler` with `timer`.
    pub started: i32,
    /// A `TrainprofPythonProfiler`, for the window that starts.
    pub profiler: i32,
    /// A `TrainprofCprofileTimer`, for the window that starts (cProfile only).
    pub timer: i32,
    /// `<LocalPath>/framework/<framework>/<profiler>/<node>/<start>_<end>`, NUL-terminated.
    pub ended_dir: [c_char; TRAINPROF_PATH_MAX],
    /// A directory outside the readers' view, on the same file system, NUL-terminated.
    pub ended_tmp_dir: [c_char; TRAINPROF_PATH_MAX],
}

impl TrainprofPythonWindow {
    /// Nothing ended, nothing started.
    const NOTHING: TrainprofPythonWindow = TrainprofPythonWindow {
        ended: 0,
        started: 0,
        profiler: 0,
        timer: 0,
        ended_dir: [0; TRAINPROF_PATH_MAX],
        ended_tmp_dir: [0; TRAINPROF_PATH_MAX],
    };
}

/// Counters, see `trainprof_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TrainprofStats {
    /// Events dropped on the caller's thread because the queue was full.
    pub dropped_queue_full: u64,
    /// Events dropped by the writer (after `FileOpenFailThreshold` failed opens, or in a
    /// file it could not write).
    pub dropped_writer: u64,
    /// Events written to timeline files.
    pub written: u64,
    pub files_sealed: u64,
    pub open_failures: u64,
}

/// The hook, when this process initialised it and is not a forked child; `running` also
/// requires that it is not shut down. One load of the state.
fn hook_in(running: bool) -> Result<&'static Hook, TrainprofStatus> {
    if FORKED.load(Relaxed) {
        return Err(TrainprofStatus::ForkedChild);
    }
    match STATE.load(Acquire) {
        UNINIT | INITIALIZING => Err(TrainprofStatus::NotInitialized),
        DISABLED => Err(TrainprofStatus::Disabled),
        RUNNING => HOOK.get().map(|h| &**h).ok_or(TrainprofStatus::NotInitialized),
        _ if running => Err(TrainprofStatus::ShutDown),
        _ => HOOK.get().map(|h| &**h).ok_or(TrainprofStatus::NotInitialized),
    }
}

/// The hook, running or shut down (Python windows, counters, node id).
fn hook_any() -> Result<&'static Hook, TrainprofStatus> {
    hook_in(false)
}

/// The hook, when it is running (initialised, enabled, not shut down).
fn running() -> Result<&'static Hook, TrainprofStatus> {
    hook_in(true)
}

fn status_of(r: Result<TrainprofStatus, TrainprofStatus>) -> TrainprofStatus {
    r.unwrap_or_else(|e| e)
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

/// Copies `s` NUL-terminated into `buf` of `cap` bytes.
fn copy_out(s: &str, buf: &mut [c_char]) -> Result<(), TrainprofStatus> {
    if s.len() >= buf.len() {
        return Err(TrainprofStatus::BufferTooSmall);
    }
    for (d, b) in buf.iter_mut().zip(s.bytes()) {
        *d = b as c_char;
    }
    buf[s.len()] = 0;
    Ok(())
}

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
    guard(TrainprofStatus::Internal, || {
        if FORKED.load(Relaxed) {
            return TrainprofStatus::ForkedChild;
        }
        // SAFETY: forwarded from the caller.
        let fw = match unsafe { str_arg(framework) } {
            Ok(f) => f,
            Err(e) => return e,
        };
        let Some(fw) = FRAMEWORKS.iter().copied().find(|f| *f == fw) else {
            return TrainprofStatus::InvalidArgument;
        };
        // Before the state changes: a child forked at any later moment is marked, so it
        // can never wait for an initialisation that its copy of the parent will not finish.
        AT_FORK.call_once(|| {
            // SAFETY: the handler is an extern "C" fn without arguments that never unwinds.
            unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
        });
        install_panic_hook();
        loop {
            match STATE.compare_exchange(UNINIT, INITIALIZING, AcqRel, Acquire) {
                Ok(_) => return init(fw),
                Err(INITIALIZING) => std::thread::sleep(Duration::from_millis(1)),
                Err(RUNNING) => return TrainprofStatus::Ok,
                Err(DISABLED) => return TrainprofStatus::Disabled,
                Err(_) => return TrainprofStatus::ShutDown,
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
        .map_or(hook::MAX_NAMES_DEFAULT, |v| v.clamp(*MAX_NAMES_RANGE.start(), *MAX_NAMES_RANGE.end()));
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
        if FORKED.load(Relaxed) || STATE.load(Acquire) != RUNNING {
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
            let finished = hook.stop_writer(Duration::from_millis(timeout_ms));
            STATE.store(DOWN, Release);
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
    guard(TrainprofStatus::Internal, || {
        if FORKED.load(Relaxed) {
            return TrainprofStatus::ForkedChild;
        }
        shutdown(u64::from(timeout_ms))
    })
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
    guard(TrainprofStatus::Internal, || {
        if FORKED.load(Relaxed) {
            return TrainprofStatus::ForkedChild;
        }
        let hook = match running() {
            Ok(h) => h,
            Err(e) => return e,
        };
        // SAFETY: forwarded from the caller.
        let name = match unsafe { str_arg(name) } {
            Ok(n) => n,
            Err(e) => return e,
        };
        if out_id.is_null() {
            return TrainprofStatus::NullArgument;
        }
        let id = hook.register_name(name);
        // SAFETY: out_id is not NULL and the caller promises it is valid for a write.
        unsafe { out_id.write(id) };
        if id == hook::TRAINPROF_NAME_OVER_LIMIT { TrainprofStatus::NameLimit } else { TrainprofStatus::Ok }
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
    guard(TrainprofStatus::Internal, || {
        let hook = match running() {
            Ok(h) => h,
            Err(e) => return e,
        };
        let args = match n_args {
            0 => &[][..],
            n if n as usize > TRAINPROF_MAX_ARGS => return TrainprofStatus::InvalidArgument,
            _ if args.is_null() => return TrainprofStatus::NullArgument,
            // SAFETY: args is not NULL and the caller promises n_args valid elements.
            n => unsafe { std::slice::from_raw_parts(args, n as usize) },
        };
        hook.record(phase_id, name_id, start_us, end_us, step, args)
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
    guard(TrainprofStatus::Internal, || {
        let hook = match running() {
            Ok(h) => h,
            Err(e) => return e,
        };
        let Some(mode) = TrainprofMode::from_i32(mode) else { return TrainprofStatus::InvalidArgument };
        let n = hook.step_begin(mode, step, hook::now_us());
        if !out_step.is_null() {
            // SAFETY: out_step is not NULL and the caller promises it is valid for a write.
            unsafe { out_step.write(n as i64) };
        }
        TrainprofStatus::Ok
    })
}

/// Ends the current step and records its `Step:ModeKeys.<MODE>` event. `NO_STEP` when no
/// step is in progress.
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_step_end() -> TrainprofStatus {
    guard(TrainprofStatus::Internal, || match running() {
        Ok(h) => h.step_end(hook::now_us()),
        Err(e) => e,
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
    guard(TrainprofStatus::Internal, || {
        if FORKED.load(Relaxed) {
            if !out_active.is_null() {
                // SAFETY: not NULL, and the caller promises it is valid for a write.
                unsafe { out_active.write(0) };
            }
            return TrainprofStatus::ForkedChild;
        }
        if out_active.is_null() {
            return TrainprofStatus::NullArgument;
        }
        let active = (|| {
            let hook = running()?;
            let feature = TrainprofFeature::from_i32(feature).ok_or(TrainprofStatus::InvalidArgument)?;
            let name = match feature {
                // SAFETY: forwarded from the caller.
                TrainprofFeature::Dataloader => Some(unsafe { str_arg(metrics_name) }?),
                _ => None,
            };
            Ok(hook.is_active(feature, step, name, hook::now_us() as f64 / 1e6))
        })();
        // SAFETY: out_active is not NULL and the caller promises it is valid for a write.
        unsafe { out_active.write(i32::from(active == Ok(true))) };
        status_of(active.map(|_| TrainprofStatus::Ok))
    })
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
    guard(TrainprofStatus::Internal, || {
        if FORKED.load(Relaxed) {
            if !out.is_null() {
                // SAFETY: not NULL, and the caller promises it is valid for a write.
                unsafe { out.write(TrainprofPythonWindow::NOTHING) };
            }
            return TrainprofStatus::ForkedChild;
        }
        if out.is_null() {
            return TrainprofStatus::NullArgument;
        }
        let mut w = TrainprofPythonWindow::NOTHING;
        let r = (|| {
            let hook = hook_any()?;
            let b = TrainprofBoundary::from_i32(boundary).ok_or(TrainprofStatus::InvalidArgument)?;
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
                let (done, tmp) = hook.python_stats_paths(profiler.as_str(), &name);
                copy_out(&done.to_string_lossy(), &mut w.ended_dir)?;
                copy_out(&tmp.to_string_lossy(), &mut w.ended_tmp_dir)?;
                w.ended = 1;
            }
            Ok(TrainprofStatus::Ok)
        })();
        // SAFETY: out is not NULL and the caller promises it is valid for a write.
        unsafe { out.write(w) };
        status_of(r)
    })
}

/// Writes the node id (`<rank>-<host>`) NUL-terminated into `buf` of `cap` bytes.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_node_id(buf: *mut c_char, cap: usize) -> TrainprofStatus {
    guard(TrainprofStatus::Internal, || {
        if FORKED.load(Relaxed) {
            return TrainprofStatus::ForkedChild;
        }
        if buf.is_null() {
            return TrainprofStatus::NullArgument;
        }
        let hook = match hook_any() {
            Ok(h) => h,
            Err(e) => return e,
        };
        // SAFETY: buf is not NULL and the caller promises cap valid bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(buf, cap) };
        status_of(copy_out(hook.node_id(), out).map(|()| TrainprofStatus::Ok))
    })
}

/// Fills `*out` with the hook's counters (zeros before init and in a forked child).
///
/// # Safety
/// `out` is NULL or valid for a write of a `TrainprofStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn trainprof_stats(out: *mut TrainprofStats) -> TrainprofStatus {
    guard(TrainprofStatus::Internal, || {
        if FORKED.load(Relaxed) {
            if !out.is_null() {
                // SAFETY: not NULL, and the caller promises it is valid for a write.
                unsafe { out.write(TrainprofStats::default()) };
            }
            return TrainprofStatus::ForkedChild;
        }
        if out.is_null() {
            return TrainprofStatus::NullArgument;
        }
        let (stats, status) = match hook_any() {
            Ok(h) => {
                let s = h.stats();
                let stats = TrainprofStats {
                    dropped_queue_full: s.dropped_queue_full,
                    dropped_writer: s.dropped_writer,
                    written: s.written,
                    files_sealed: s.files_sealed,
                    open_failures: s.open_failures,
                };
                (stats, TrainprofStatus::Ok)
            }
            Err(e) => (TrainprofStats::default(), e),
        };
        // SAFETY: out is not NULL and the caller promises it is valid for a write.
        unsafe { out.write(stats) };
        status
    })
}

/// Events dropped so far, for any reason (0 before init and in a forked child).
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_dropped_events() -> u64 {
    guard(0, || hook_any().map_or(0, |h| h.dropped()))
}

/// Events dropped because they use a name that did not fit in the name table
/// (`TRAINPROF_NAME_OVER_LIMIT`); part of `trainprof_dropped_events` (0 before init and in
/// a forked child).
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_dropped_names() -> u64 {
    guard(0, || hook_any().map_or(0, |h| h.stats().dropped_names))
}

/// Panics inside the guard and returns what any export returns after an internal panic
/// (`INTERNAL`). It exists so that tests can prove that no panic crosses the ABI.
#[unsafe(no_mangle)]
pub extern "C" fn trainprof_selftest_panic() -> TrainprofStatus {
    if FORKED.load(Relaxed) {
        return TrainprofStatus::ForkedChild;
    }
    install_panic_hook();
    guard(TrainprofStatus::Internal, || {
        // black_box: a real panic at run time, not one the compiler can see coming.
        if std::hint::black_box(true) {
            panic!("trainprof_selftest_panic");
        }
        TrainprofStatus::Ok
    })
}
