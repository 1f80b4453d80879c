//! Native CPU sampling of the whole trainer process inside the `native` window
//! (`NativeProfilingConfig`; docs/formats.md "Native profiling").
//!
//! Who does what:
//!
//! * **The decision** is a gate question like the detailed window's
//!   (`Hook::is_active` with `TrainprofFeature::Native`): a trainer thread asks it at
//!   every `step_begin` while the feature is configured and stores the answer in
//!   [`Control`] (one atomic); a process without steps (LD_PRELOAD, `TRAINPROF_AUTOSTART`)
//!   is served by the sampler thread itself, which asks about a time window with a
//!   duration every 10 ms, taking the gate only with `try_lock` (a busy gate means "ask
//!   again in 10 ms", so no trainer thread ever waits for it longer than one window
//!   question).
//! * **The sampler thread** (`trainprof-native`, started by the writer thread the first
//!   time the feature is configured) polls those answers every 10 ms and starts and stops
//!   the `pprof` profiler, builds the report (symbolisation takes 0.1–1 s) and writes the
//!   files. None of that runs on a trainer thread or on the writer thread, so the timeline
//!   queue keeps draining meanwhile.
//! * **The signal handler** is `pprof`'s (the copy in `vendor/pprof`, patched: see its
//!   `TRAINPROF.md`). **The timers** are ours: one POSIX timer per thread of the process
//!   (`timer_create` on that thread's CPU-time clock, `SIGEV_THREAD_ID`), each sending
//!   `SIGPROF` to its own thread every 1/`SamplingHz` s of CPU time that thread consumed,
//!   so every busy thread is sampled in proportion to its CPU use. The sampler thread
//!   arms a timer for each new thread every 10 ms and deletes those of threads gone. Not
//!   `ITIMER_PROF` (pprof's own choice): that interval timer survives `execve` while the
//!   handler does not, so a program exec'd inside a window died of `SIGPROF`; POSIX
//!   timers are deleted by `execve` and not inherited by `fork`. Not one process-wide
//!   `CLOCK_PROCESS_CPUTIME_ID` timer either: before Linux 6.4 its signal goes to the main
//!   thread whenever it can take it, running or not, so a busy worker thread would be
//!   sampled as an idle main thread.
//!   What the handler does, read from pprof 0.15's source: it takes the profiler's spin
//!   lock with `try_write` only (if it is held, the sample is dropped: no waiting), skips the sample when the interrupted address is in a
//!   blocklisted library, unwinds into a fixed-size on-stack array (`SmallVec` of 128
//!   frames, no heap), reads the thread name (`pthread_getname_np` of the calling thread
//!   is a `prctl`) and adds the stack to a fixed-size hash table allocated when the
//!   profiler started; an entry evicted from a full bucket goes to a pre-allocated buffer
//!   that is flushed with `write(2)` to an anonymous temporary file when full. So: no
//!   allocation and no blocking lock. What it does not guarantee: the unwinder
//!   (`backtrace`'s `_Unwind_Backtrace`, from libgcc) is not on POSIX's
//!   async-signal-safe list; it can deadlock when the interrupted code holds the dynamic
//!   loader's lock. That is why the blocklist (below) drops samples taken inside libc,
//!   libgcc, the dynamic loader and the vDSO: the interrupted frame is never one of
//!   theirs. (glibc ≥ 2.35 with libgcc ≥ 12 looks frames up without that lock,
//!   `_dl_find_object`.)
//!
//! Safety rules kept here (docs/formats.md "Native profiling", "What it guarantees"):
//!
//! * before starting, `sigaction(SIGPROF, NULL, &old)`: a handler the trainer installed
//!   (not `SIG_DFL` / `SIG_IGN`) is kept, and the feature refuses with one line; the same
//!   for an `ITIMER_PROF` already armed. A handler the trainer installs *during* a
//!   window is put back after the window;
//! * the process is left as it was found: after a window the timers are deleted, then
//!   `SIGPROF` is set to `SIG_IGN` (pprof's stop; that discards a signal of a deleted
//!   timer still pending, which `SIG_DFL` would turn into death) and then the disposition
//!   read before the window (handler, mask and flags) is put back; the profiler's
//!   temporary file exists only while a window runs and never has a name;
//! * fork: the profiler lives on the sampler thread's stack, and a forked child has no
//!   such thread, so the child never stops the profiler it inherited; POSIX timers are
//!   not inherited by `fork`, so the child is not sampled;
//! * every failure is one log line, and the feature is then off for the rest of the
//!   process.

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use trainprof_config::{AutoFeature, Config};
use trainprof_output::fs::{self, Dir};

/// Libraries whose code is never unwound from (see the module docs). Matched as
/// substrings of the loaded objects' paths, as pprof's blocklist does.
pub const BLOCKLIST: [&str; 6] =
    ["/libc.so", "/libc-", "/libgcc_s", "/ld-linux", "/libpthread", "linux-vdso"];

/// How often the sampler thread looks at the decisions.
const POLL: Duration = Duration::from_millis(10);

/// The trainer-facing half: atomics the trainer threads and the sampler thread share.
#[derive(Debug, Default)]
pub struct Control {
    /// The config has an enabled `NativeProfilingConfig`.
    configured: AtomicBool,
    /// The feature refused or failed once: off for the rest of the process.
    off: AtomicBool,
    /// The answer at the last `step_begin`.
    by_step: AtomicBool,
    /// `SamplingHz` of the current config.
    hz: AtomicU32,
    /// A window `trainprof trigger` armed names native sampling ([`crate::request`]).
    requested: AtomicBool,
    /// `WindowCapsConfig.NativeMaxSamples` of the current config.
    max_samples: AtomicU64,
}

impl Control {
    pub fn new(config: &Config) -> Control {
        let c = Control::default();
        c.configure(config);
        c
    }

    /// Takes a (re)loaded config. Native sampling is wanted when `NativeProfilingConfig`
    /// is on, or when `AutoProfilingConfig` may open it (docs/formats.md,
    /// "Anomaly-triggered windows").
    pub fn configure(&self, config: &Config) {
        let by_trigger = config.auto.is_enabled()
            && config.auto.features.contains(AutoFeature::Native)
            && config.native.feature.may_auto_open();
        self.configured.store(config.native.feature.is_enabled() || by_trigger, Relaxed);
        self.hz.store(config.native.sampling_hz, Relaxed);
        self.max_samples.store(config.caps.native_max_samples, Relaxed);
    }

    /// Should a step boundary ask the gate? One relaxed load when the feature is off.
    pub fn asks(&self) -> bool {
        (self.configured.load(Relaxed) || self.requested.load(Relaxed)) && !self.off.load(Relaxed)
    }

    /// A requested window with native sampling is armed (or ended): the step boundaries ask
    /// the gate, and the writer starts the sampler thread if it is not running.
    pub fn set_requested(&self, on: bool) {
        self.requested.store(on, Relaxed);
    }

    /// Stores the answer of a step boundary.
    pub fn set_by_step(&self, open: bool) {
        self.by_step.store(open, Relaxed);
    }

    /// The sampler thread is needed.
    pub fn wants_thread(&self) -> bool {
        self.asks()
    }

    /// The answer at the last step boundary.
    pub fn by_step(&self) -> bool {
        self.by_step.load(Relaxed)
    }

    /// `SamplingHz` of the current config.
    pub fn hz(&self) -> u32 {
        self.hz.load(Relaxed)
    }

    /// The samples a window may take (docs/formats.md, "Window caps").
    pub fn max_samples(&self) -> u64 {
        self.max_samples.load(Relaxed)
    }

    /// Off for the rest of the process (a refusal or a failure).
    pub fn turn_off(&self) {
        self.off.store(true, Relaxed);
        self.by_step.store(false, Relaxed);
    }
}

/// What the sampler thread needs from the hook that runs it. The hook implements it
/// (`hook-ffi/src/hook.rs`) and owns the [`Control`]; this module never reaches into the
/// hook itself, so the two do not depend on each other.
pub trait Host: Send + Sync + 'static {
    /// The decisions shared with the trainer threads.
    fn control(&self) -> &Control;
    /// The hook is shutting down: the sampler thread closes its window and returns.
    fn stopping(&self) -> bool;
    /// The sampler thread's own question, for a time window with a duration (the only
    /// kind that opens without steps): `None` when the gate is busy or the window is not
    /// such a window (then the step boundaries decide alone).
    fn by_clock(&self, now_s: f64) -> Option<bool>;
    /// Marks the profiler's own work (a window's report) until the value is dropped: the
    /// steps it overlaps are not judged slow (docs/formats.md, "Anomaly-triggered windows").
    fn own_work(&self) -> impl Sized + '_;
    /// `LocalPath`, the timeline node id and the trainer's pid: where a window's files go.
    fn local_path(&self) -> &std::path::Path;
    fn node_id(&self) -> &str;
    fn os_pid(&self) -> u32;
    /// The open window reached `NativeMaxSamples` (`limit`) with `samples` taken: it is
    /// stopped, and the hook says so once (docs/formats.md, "Window caps").
    fn capped(&self, samples: u64, limit: u64);
}

/// Starts the sampler thread.
pub fn spawn<H: Host>(host: Arc<H>) -> std::io::Result<JoinHandle<()>> {
    // Takes no signal of the trainer's (docs/trainer.md, "Signals"); SIGPROF samples the
    // trainer's threads, never this one.
    crate::signals::spawn_thread("trainprof-native", move || {
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&*host)));
        if ran.is_err() {
            host.control().turn_off();
            crate::log(&format_args!("native profiling failed (internal error); it is off"));
        }
    })
}

/// A running window.
struct Window {
    guard: pprof::ProfilerGuard<'static>,
    timers: Timers,
    /// The `SIGPROF` disposition before the window, put back after it.
    saved: Disposition,
    start_us: i64,
    /// The process's CPU time when the window opened ([`process_cpu_ns`]).
    cpu_start_ns: u64,
    hz: u32,
}

impl Window {
    /// The most samples the window can have taken so far: each thread's timer sends one
    /// signal per 1/hz s of that thread's CPU time, so the process's CPU time since the
    /// window opened, times hz, bounds them (threads armed late, and samples pprof drops,
    /// only make the true count smaller). Counted here, on the sampler thread, because the
    /// signal handler is pprof's and counts nothing the sampler can read while it runs.
    fn samples_bound(&self) -> u64 {
        let cpu_ns = process_cpu_ns().saturating_sub(self.cpu_start_ns);
        u64::try_from(u128::from(cpu_ns) * u128::from(self.hz) / 1_000_000_000).unwrap_or(u64::MAX)
    }
}

/// The CPU time of every thread of the process, in ns (`CLOCK_PROCESS_CPUTIME_ID`).
fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

fn run(host: &impl Host) {
    // pprof unwinds one stack when a profiler is built, so that the unwinder sets itself
    // up outside the signal handler (its patched copy resolves no symbol there). Done
    // here once, before any window, so that a start takes microseconds.
    let t0 = std::time::Instant::now();
    drop(backtrace::Backtrace::new_unresolved());
    crate::log(&format_args!("native profiling: sampler ready ({} ms to warm up)", t0.elapsed().as_millis()));
    let mut by_clock = false;
    let mut open: Option<Window> = None;
    // A window stopped at its cap: none opens again until the answer has been no once
    // (the step boundaries answer no while the capped window's range lasts; a time
    // window's answer turns no when its time ends).
    let mut held = false;
    loop {
        let control = host.control();
        let stopping = host.stopping();
        let now_us = crate::now_us();
        if let Some(b) = host.by_clock(now_us as f64 / 1e6) {
            by_clock = b;
        }
        let asked = !stopping && control.asks() && (by_clock || control.by_step());
        held &= asked;
        let want = asked && !held;
        match (open.is_some(), want) {
            (false, true) => match start(control.hz()) {
                Ok(w) => {
                    crate::log(&format_args!("native profiling: window opened ({} Hz)", w.hz));
                    open = Some(Window { start_us: now_us, cpu_start_ns: process_cpu_ns(), ..w });
                }
                Err(why) => {
                    control.turn_off();
                    crate::log(&format_args!("native profiling refused: {why}; the feature is off"));
                }
            },
            (true, false) => {
                if let Some(w) = open.take() {
                    finish(host, w, now_us);
                }
            }
            (true, true) => {
                // New threads get their timer within one poll.
                if let Some(w) = open.as_mut()
                    && let Err(e) = w.timers.sync()
                {
                    control.turn_off();
                    crate::log(&format_args!(
                        "native profiling: cannot arm a thread's timer: {e}; the feature is off"
                    ));
                }
                let limit = control.max_samples();
                let taken = open.as_ref().map_or(0, Window::samples_bound);
                if taken >= limit
                    && let Some(w) = open.take()
                {
                    host.capped(taken, limit);
                    finish(host, w, now_us);
                    held = true;
                }
            }
            _ => {}
        }
        if stopping {
            return;
        }
        thread::sleep(POLL);
    }
}

/// Why a window could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the process already has its own SIGPROF handler (kept)")]
    ForeignHandler,
    #[error("the process already runs a profiling interval timer (ITIMER_PROF, kept)")]
    TimerArmed,
    #[error("cannot read the SIGPROF disposition: {0}")]
    Sigaction(std::io::Error),
    #[error("cannot arm a CPU-time timer: {0}")]
    Timer(std::io::Error),
    #[error("pprof: {0}")]
    Pprof(#[from] pprof::Error),
}

/// `SIGPROF`'s disposition exactly as the kernel holds it: read and written with the
/// `rt_sigaction` system call itself, because glibc's `sigaction` adds `SA_RESTORER` and its
/// own restorer to whatever it installs, so a `SIG_DFL` read from a fresh process and put
/// back through glibc would come back with other flags. `handler` is `SIG_DFL` (0),
/// `SIG_IGN` (1) or a function.
#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
mod disposition {
    /// The kernel's `struct sigaction` on x86-64 and arm64 (both define `SA_RESTORER`).
    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct Disposition {
        pub handler: libc::sighandler_t,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }

    fn rt_sigaction(new: Option<&Disposition>, old: Option<&mut Disposition>) -> std::io::Result<()> {
        let new = new.map_or(std::ptr::null(), |n| n as *const Disposition);
        let old = old.map_or(std::ptr::null_mut(), |o| o as *mut Disposition);
        // SAFETY: the kernel's sigaction layout for these architectures, the size of its
        // signal set (8 bytes), valid or null pointers.
        let r = unsafe { libc::syscall(libc::SYS_rt_sigaction, libc::SIGPROF, new, old, 8usize) };
        if r != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
    }

    pub fn get() -> std::io::Result<Disposition> {
        let mut d = Disposition { handler: 0, flags: 0, restorer: 0, mask: 0 };
        rt_sigaction(None, Some(&mut d))?;
        Ok(d)
    }

    pub fn set(d: &Disposition) {
        let _ = rt_sigaction(Some(d), None);
    }
}

/// Elsewhere: through libc's `sigaction` (flags may come back with `SA_RESTORER` added).
#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
mod disposition {
    #[derive(Clone, Copy)]
    pub struct Disposition {
        pub handler: libc::sighandler_t,
        act: libc::sigaction,
    }

    impl std::fmt::Debug for Disposition {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Disposition").field("handler", &self.handler).finish_non_exhaustive()
        }
    }

    pub fn get() -> std::io::Result<Disposition> {
        // SAFETY: an all-zero sigaction is a valid value for the out-parameter.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a NULL new action only reads the current one into `act`, a valid pointer.
        if unsafe { libc::sigaction(libc::SIGPROF, std::ptr::null(), &mut act) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Disposition { handler: act.sa_sigaction, act })
    }

    pub fn set(d: &Disposition) {
        // SAFETY: `d.act` was read by sigaction and is put back unchanged.
        unsafe { libc::sigaction(libc::SIGPROF, &d.act, std::ptr::null_mut()) };
    }
}

use disposition::Disposition;

/// The current `SIGPROF` disposition.
fn sigprof_handler() -> Result<Disposition, std::io::Error> {
    disposition::get()
}

/// Is `ITIMER_PROF` armed?
fn prof_timer_armed() -> bool {
    // SAFETY: all-zero is a valid itimerval.
    let mut t: libc::itimerval = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a valid out-pointer.
    let ok = unsafe { libc::getitimer(libc::ITIMER_PROF, &mut t) } == 0;
    ok && (t.it_value.tv_sec != 0 || t.it_value.tv_usec != 0)
}

/// The start checks, on the dispositions as read (pure, for tests).
pub fn check_free(handler: libc::sighandler_t, timer_armed: bool) -> Result<(), StartError> {
    if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
        return Err(StartError::ForeignHandler);
    }
    if timer_armed {
        return Err(StartError::TimerArmed);
    }
    Ok(())
}

fn start(hz: u32) -> Result<Window, StartError> {
    let saved = sigprof_handler().map_err(StartError::Sigaction)?;
    check_free(saved.handler, prof_timer_armed())?;
    let hz =
        hz.clamp(*trainprof_config::SAMPLING_HZ_RANGE.start(), *trainprof_config::SAMPLING_HZ_RANGE.end());
    // Installs pprof's handler; the patched pprof arms no timer of its own.
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(i32::try_from(hz).unwrap_or(99))
        .blocklist(&BLOCKLIST)
        .build()?;
    if let Ok(now) = sigprof_handler() {
        let _ = PPROF_HANDLER.set(now.handler);
    }
    let mut timers = Timers::new(hz);
    if let Err(e) = timers.sync() {
        drop(timers);
        drop(guard);
        restore_sigprof(&saved);
        return Err(StartError::Timer(e));
    }
    Ok(Window { guard, timers, saved, start_us: 0, cpu_start_ns: 0, hz })
}

/// Puts a `SIGPROF` disposition back as it was read (handler, mask, flags).
fn restore_sigprof(d: &Disposition) {
    disposition::set(d);
}

/// Ends the window: stops sampling, builds the report, leaves `SIGPROF` as it was before
/// the window (or the trainer's own handler, installed meanwhile), writes the files.
fn finish(host: &impl Host, w: Window, end_us: i64) {
    // No train step this overlaps is judged slow (docs/formats.md, "Anomaly-triggered windows").
    let _own = host.own_work();
    let Window { guard, mut timers, saved, start_us, .. } = w;
    // No new signal after this; one still pending reaches pprof's handler, which finds
    // the lock held while the report is built and drops it, or is discarded below.
    timers.delete_all();
    let report = guard.report().frames_post_processor(strip_sampler_frames).build();
    let now = sigprof_handler().ok();
    // pprof's stop sets SIG_IGN, which discards pending SIGPROFs of every thread, and
    // closes the profiler's temporary file.
    drop(guard);
    match now {
        Some(theirs)
            if theirs.handler != libc::SIG_DFL
                && theirs.handler != libc::SIG_IGN
                && !is_pprof_handler(theirs.handler) =>
        {
            restore_sigprof(&theirs);
            crate::log(&format_args!("native profiling: the trainer's own SIGPROF handler is kept"));
        }
        _ => restore_sigprof(&saved),
    }
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            host.control().turn_off();
            crate::log(&format_args!("native profiling: cannot build the report: {e}; the feature is off"));
            return;
        }
    };
    let samples: isize = report.data.values().sum();
    let window = window_name(start_us, end_us, host.os_pid());
    // The files' bytes first; then everything the window allocated is given back, before
    // the first file appears (so whoever sees the files sees the memory as before).
    let files = render(&report);
    drop(report);
    give_back_memory();
    match files.and_then(|f| write_files(host, &window, &f)) {
        Ok(rel) => crate::log(&format_args!("native profiling: {samples} samples in {rel}")),
        Err(e) => {
            host.control().turn_off();
            crate::log(&format_args!("native profiling: cannot write {window}: {e}; the feature is off"));
        }
    }
}

/// Returns what a window allocated to the system: the profiler's sample table (about
/// 70 MB, freed when the profiler stopped), the report, and the symboliser's cache
/// (`backtrace`'s parsed symbol tables and debug information of every library a sample
/// touched: 25–60 MB here, more for large libraries). The cache is dropped rather than
/// kept for the next window: it only holds the four libraries used last, so windows that
/// touch more libraries re-parsed them anyway and left the freed copies scattered over
/// several heaps (measured: 0–55 MB more resident after ten windows, varying from run to
/// run); a window's report now pays the parse every time, off the trainer's threads.
/// Freeing is not enough for glibc to return pages that lie below live allocations:
/// `malloc_trim` also releases free pages inside heaps. Runs on the sampler thread once
/// per window; it holds each arena's lock while it walks it.
fn give_back_memory() {
    backtrace::clear_symbol_cache();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: no arguments beyond the padding to keep; safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The sampling timers of a window: one POSIX timer per thread, on that thread's
/// CPU-time clock, sending `SIGPROF` to that thread (see the module docs). Deleted when
/// dropped; `execve` deletes them too, and `fork` does not copy them.
struct Timers {
    interval: libc::timespec,
    by_tid: std::collections::HashMap<libc::pid_t, libc::timer_t>,
}

impl Timers {
    fn new(hz: u32) -> Timers {
        let ns = 1_000_000_000 / i64::from(hz.max(1));
        let interval = libc::timespec { tv_sec: ns / 1_000_000_000, tv_nsec: ns % 1_000_000_000 };
        Timers { interval, by_tid: std::collections::HashMap::new() }
    }

    /// Arms a timer for every thread that has none, deletes those of threads gone. A
    /// thread that ends while this runs is skipped; any other failure is returned.
    fn sync(&mut self) -> std::io::Result<()> {
        let mut live = Vec::with_capacity(self.by_tid.len() + 4);
        for entry in std::fs::read_dir("/proc/self/task")? {
            if let Some(tid) = entry?.file_name().to_str().and_then(|n| n.parse::<libc::pid_t>().ok()) {
                live.push(tid);
            }
        }
        self.by_tid.retain(|tid, id| {
            let keep = live.contains(tid);
            if !keep {
                // SAFETY: `id` was made by timer_create and is deleted once.
                unsafe { libc::timer_delete(*id) };
            }
            keep
        });
        for tid in live {
            if self.by_tid.contains_key(&tid) {
                continue;
            }
            match arm(tid, self.interval) {
                Ok(id) => {
                    self.by_tid.insert(tid, id);
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ESRCH | libc::EINVAL)) => {} // ended
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn delete_all(&mut self) {
        for (_, id) in self.by_tid.drain() {
            // SAFETY: `id` was made by timer_create and is deleted once.
            unsafe { libc::timer_delete(id) };
        }
    }
}

impl Drop for Timers {
    fn drop(&mut self) {
        self.delete_all();
    }
}

/// The CPU-time clock of thread `tid` of this process: the kernel's encoding
/// (`MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`, the value glibc's `pthread_getcpuclockid`
/// returns), written out because only the thread's id is known here, not its `pthread_t`.
pub fn thread_cpu_clock(tid: libc::pid_t) -> libc::clockid_t {
    const CPUCLOCK_SCHED: libc::clockid_t = 2;
    const CPUCLOCK_PERTHREAD: libc::clockid_t = 4;
    (!tid << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED
}

/// One timer: `SIGPROF` to thread `tid` every `interval` of its CPU time.
fn arm(tid: libc::pid_t, interval: libc::timespec) -> std::io::Result<libc::timer_t> {
    // SAFETY: all-zero is a valid sigevent; the fields that matter are set below.
    let mut sev: libc::sigevent = unsafe { std::mem::zeroed() };
    sev.sigev_notify = libc::SIGEV_THREAD_ID;
    sev.sigev_signo = libc::SIGPROF;
    sev.sigev_notify_thread_id = tid;
    let mut id: libc::timer_t = std::ptr::null_mut();
    // SAFETY: valid pointers to a sigevent and a timer_t out-parameter.
    if unsafe { libc::timer_create(thread_cpu_clock(tid), &mut sev, &mut id) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let spec = libc::itimerspec { it_interval: interval, it_value: interval };
    // SAFETY: `id` is the timer just made; a valid itimerspec; the old value is not asked.
    if unsafe { libc::timer_settime(id, 0, &spec, std::ptr::null_mut()) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: `id` was made above and is deleted once.
        unsafe { libc::timer_delete(id) };
        return Err(e);
    }
    Ok(id)
}

/// Removes the frames of the sampling itself (pprof's signal handler and its unwinder) from
/// the leaf end of a stack, so that a stack starts at the interrupted function.
pub fn strip_sampler_frames(frames: &mut pprof::Frames) {
    let own = |f: &Vec<pprof::Symbol>| {
        f.iter().any(|s| {
            let n = s.name();
            n.contains("perf_signal_handler") || n.contains("pprof::") || n.starts_with("backtrace::")
        })
    };
    if let Some(last) = frames.frames.iter().rposition(own) {
        frames.frames.drain(..=last);
    }
}

/// The handler pprof installs (its `perf_signal_handler`): found by reading the
/// disposition while a window runs, remembered here.
fn is_pprof_handler(h: libc::sighandler_t) -> bool {
    PPROF_HANDLER.get().is_some_and(|p| *p == h)
}

static PPROF_HANDLER: std::sync::OnceLock<libc::sighandler_t> = std::sync::OnceLock::new();

/// `<first µs>-<last µs>_<pid>` (unique per process and window) and its folder
/// `framework/native/<node>/<window>`: the protocol's (docs/formats.md, "Native profiling").
use trainprof_output::protocol::native_window;
pub use trainprof_output::protocol::native_window::{window_dir, window_name};

/// The profile as a gzipped pprof protobuf.
pub fn profile_gz(report: &pprof::Report) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    use pprof::protos::Message as _;
    let bytes = report.pprof()?.write_to_bytes()?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&bytes)?;
    Ok(gz.finish()?)
}

/// A window's files, rendered: the gzipped profile, and the flame graph unless the
/// window has no sample.
struct Files {
    profile_gz: Vec<u8>,
    flamegraph: Option<Vec<u8>>,
}

fn render(report: &pprof::Report) -> Result<Files, Box<dyn std::error::Error>> {
    let flamegraph = if report.data.is_empty() {
        None
    } else {
        let mut svg = Vec::new();
        report.flamegraph(&mut svg)?;
        Some(svg)
    };
    Ok(Files { profile_gz: profile_gz(report)?, flamegraph })
}

fn write_files(host: &impl Host, window: &str, files: &Files) -> Result<String, Box<dyn std::error::Error>> {
    let rel = window_dir(host.node_id(), window);
    let dir = Dir::open_root(host.local_path(), true)?.sub(&rel, true)?;
    let pid = host.os_pid();
    seal(&dir, native_window::PROFILE_FILE, pid, &files.profile_gz)?;
    match &files.flamegraph {
        Some(svg) => seal(&dir, native_window::FLAMEGRAPH_FILE, pid, svg)?,
        None => {
            crate::log(&format_args!("native profiling: no samples in {rel} (an idle window); no flamegraph"))
        }
    }
    Ok(rel)
}

/// Writes `bytes` as the new file `dir/name` through the output tree's sealing
/// ([`fs::write_new`]: a hidden temporary name, synced, renamed without replacing a file;
/// docs/on-disk.md).
fn seal(dir: &Dir, name: &str, pid: u32, bytes: &[u8]) -> std::io::Result<()> {
    if !fs::write_new(dir, name, &pid.to_string(), bytes)? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists (not replaced)", dir.display(name).display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_file_is_sealed_once_and_a_refused_one_leaves_nothing_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Dir::open_root(tmp.path(), false).unwrap().sub(&window_dir("0-n", "1-2_7"), true).unwrap();
        seal(&dir, "profile.pb.gz", 7, b"one").unwrap();
        let e = seal(&dir, "profile.pb.gz", 7, b"two").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        let names: Vec<_> = dir.entries().unwrap().into_iter().map(|e| e.name.unwrap()).collect();
        assert_eq!(names, ["profile.pb.gz"], "no temporary file stays");
        assert_eq!(dir.read("profile.pb.gz", 16).unwrap().unwrap(), b"one");
    }

    #[test]
    fn a_foreign_handler_or_timer_refuses() {
        assert!(check_free(libc::SIG_DFL, false).is_ok());
        assert!(check_free(libc::SIG_IGN, false).is_ok());
        assert!(matches!(check_free(0x1234, false), Err(StartError::ForeignHandler)));
        assert!(matches!(check_free(libc::SIG_DFL, true), Err(StartError::TimerArmed)));
    }

    #[test]
    fn a_threads_cpu_clock_is_the_one_glibc_gives() {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: the calling thread's own pthread_t, a valid out-pointer.
        assert_eq!(unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut clock) }, 0);
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        assert_eq!(thread_cpu_clock(tid), clock);
    }

    /// The process's POSIX timers whose signal goes to `tid` (/proc/self/timers).
    fn timers_for(tid: libc::pid_t) -> usize {
        let text = std::fs::read_to_string("/proc/self/timers").unwrap_or_default();
        text.lines().filter(|l| l.starts_with("notify:") && l.ends_with(&format!("/tid.{tid}"))).count()
    }

    #[test]
    fn every_thread_gets_one_timer_until_it_ends_or_the_window_does() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let worker = thread::spawn(move || {
            // SAFETY: gettid has no arguments and cannot fail.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = rx.recv();
        });
        let tid = tid_rx.recv().unwrap();
        // SAFETY: gettid has no arguments and cannot fail.
        let me = unsafe { libc::gettid() };
        // 1 Hz: a signal after a second of a thread's CPU time, which these threads never
        // use; and ignored, should one come.
        // SAFETY: SIG_IGN for SIGPROF, which nothing else in the test binary uses.
        unsafe { libc::signal(libc::SIGPROF, libc::SIG_IGN) };
        let mut timers = Timers::new(1);
        timers.sync().unwrap();
        assert_eq!((timers_for(me), timers_for(tid)), (1, 1));
        timers.sync().unwrap();
        assert_eq!((timers_for(me), timers_for(tid)), (1, 1), "one per thread, not one per sync");
        drop(tx);
        worker.join().unwrap();
        timers.sync().unwrap();
        assert!(!timers.by_tid.contains_key(&tid), "the ended thread's timer is deleted");
        assert_eq!(timers_for(me), 1);
        drop(timers);
        assert_eq!(timers_for(me), 0);
    }

    #[test]
    fn names() {
        assert_eq!(window_name(10, 20, 7), "10-20_7");
        assert_eq!(window_dir("0-host", "10-20_7"), "framework/native/0-host/10-20_7");
    }
}
