//! The flight recorder (`HangDetectionConfig`; docs/formats.md "Hang and crash dumps"):
//! stall detection off the training thread, and last words on a signal, a crash or an
//! uncaught exception, all written under `framework/hangs/<node>/<step>-<µs>/`.
//!
//! Who does what:
//!
//! * **The trainer's threads** add one entry to a bounded in-memory [`Ring`] at each step
//!   begin and end (one `fetch_add` and five relaxed stores, only while the feature is on),
//!   and one to a second ring ([`Hang::events`]) at each complete event they record (eight
//!   stores); nothing else on the hot path. The step state the watchdog reads (in a step, since when)
//!   is the atomics the step calls already store.
//! * **The watchdog thread** (`trainprof-watchdog`) wakes once a second (or at once, woken
//!   through a pipe by the SIGTERM/SIGINT handler), judges the open step against
//!   `max(HangTimeoutS, HangFactor × median step)` (the median of the completed steps of the
//!   same mode in the ring), writes a dump once per stall and `ended.json` when the stalled
//!   step ends. Like every thread of trainprof's it blocks every asynchronous signal
//!   ([`crate::signals::spawn_thread`]), so the process's signal never lands on the thread
//!   that must write its dump, nor takes one the trainer waits for.
//! * **Python stacks** are `faulthandler`'s: the Python package registers
//!   `faulthandler.register(signum, file=<anonymous memfd>, all_threads=True)` on a real-time
//!   signal nobody uses ([`crate::signals::free_real_time`]) and hands the fd and signal
//!   number to the hook
//!   ([`crate::abi`]'s `trainprof_hang_python`). The watchdog empties the memfd, sends that
//!   signal to its own thread with `tgkill` (so faulthandler's C handler runs synchronously,
//!   on a thread that holds no Python lock, and writes every thread's stack without the GIL),
//!   then copies what it wrote into `python_stacks.txt`. No Python code runs for it, so a
//!   trainer stuck holding the GIL in C code still gets its stacks.
//! * **Native stacks**: another free real-time signal, sent with `tgkill` to each thread in
//!   turn; that thread's handler (this module's) unwinds itself with
//!   `backtrace::trace_unsynchronized` into a preallocated buffer of [`MAX_FRAMES`]
//!   addresses (no allocation, no lock) and raises a flag; the watchdog waits at most
//!   200 ms for it, then symbolises on its own thread. The handler is installed with
//!   `SA_RESTART`, so a thread blocked in a restartable call goes back to it.
//!   Every send first checks that the handler is still ours: one the trainer installed since
//!   is never called by a dump.
//! * **SIGTERM / SIGINT**: the hook's handler, installed with the trainer's handler's flags
//!   and mask, wakes the watchdog, waits up to 5 s for the dump, then chains: the trainer's own handler is called as the kernel would have called
//!   it, or for `SIG_DFL` the default action is restored and the signal raised again (the
//!   exit status is the signal's, as without trainprof). A disposition the trainer installs
//!   later is seen by the watchdog within a second and wrapped the same way (it is then the
//!   one chained to); `SIG_IGN` is never wrapped.
//! * **Fatal signals** (SIGSEGV, SIGBUS, SIGABRT, SIGFPE): the hook's handler sits in front of
//!   the trainer's dispositions and calls the trainer's handler directly with the kernel's
//!   `siginfo` and context ([`fatal_handler`]); only a signal that is going to end the process
//!   gets a dump: the folder (`mkdirat` under the node's folder, opened at start), the Python
//!   stacks through the same faulthandler registration, the crashing thread's native stack and
//!   `stall.json`, with raw system calls and formatting into static buffers (no allocation, no
//!   lock). Nothing is on disk unless a crash comes.
//! * **Uncaught exceptions**: the package's `sys.excepthook` / `threading.excepthook` hand the
//!   formatted traceback to `trainprof_hang_exception`, which writes the dump on the calling
//!   thread, then call the previous hook.

use std::fmt::Write as _;
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicI64, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering::*,
};
use std::time::Duration;

use trainprof_config::HangDetection;
use trainprof_output::fs::{self, Dir};

use crate::hook::Hook;
use crate::signals::{self, Saved, SigInfoHandler};
use crate::types::TrainprofMode;

/// Entries the ring keeps.
pub const RING: usize = 256;
/// Threads whose native stack a dump holds.
pub const MAX_THREADS: usize = 64;
/// Frames per native stack.
pub const MAX_FRAMES: usize = 128;
/// Bytes of `python_stacks.txt` at most (faulthandler itself stops at 100 threads × 100
/// frames).
pub const MAX_PYTHON_BYTES: usize = 256 * 1024;
/// Bytes of `traceback.txt` at most.
pub const MAX_TRACEBACK_BYTES: usize = 64 * 1024;
/// How long the SIGTERM/SIGINT handler waits for the dump before it chains.
const SIGNAL_WAIT: Duration = Duration::from_secs(5);
/// How long the watchdog waits for one thread to unwind itself.
const THREAD_WAIT: Duration = Duration::from_millis(200);

/// What a ring entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum What {
    StepStart = 1,
    StepEnd = 2,
    /// A complete event (a phase's span: `record`), in [`Hang::events`].
    Event = 3,
}

impl What {
    fn as_str(self) -> &'static str {
        match self {
            What::StepStart => "step_start",
            What::StepEnd => "step_end",
            What::Event => "event",
        }
    }

    fn from_u8(v: u8) -> Option<What> {
        match v {
            1 => Some(What::StepStart),
            2 => Some(What::StepEnd),
            3 => Some(What::Event),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    /// The entry's index + 1 once written, 0 while being written.
    seq: AtomicU64,
    t_us: AtomicI64,
    what: AtomicU8,
    mode: AtomicU8,
    step: AtomicI64,
    /// An event's end, phase and name ids ([`What::Event`] only).
    end_us: AtomicI64,
    phase: AtomicU32,
    name: AtomicU32,
}

/// One entry, as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub t_us: i64,
    pub what: What,
    pub mode: TrainprofMode,
    pub step: i64,
    /// [`What::Event`]: its end and its phase and name ids.
    pub end_us: i64,
    pub phase: u32,
    pub name: u32,
}

impl Entry {
    const EMPTY: Entry = Entry {
        t_us: 0,
        what: What::StepStart,
        mode: TrainprofMode::Train,
        step: 0,
        end_us: 0,
        phase: 0,
        name: 0,
    };
}

/// The last [`RING`] step events, written by any thread without a lock; a reader skips an
/// entry that is being overwritten while it reads it.
#[derive(Debug)]
pub struct Ring {
    head: AtomicU64,
    slots: Box<[Slot]>,
}

impl Default for Ring {
    fn default() -> Ring {
        Ring { head: AtomicU64::new(0), slots: (0..RING).map(|_| Slot::default()).collect() }
    }
}

impl Ring {
    /// The hot path: one `fetch_add` and five stores.
    pub fn push(&self, what: What, mode: TrainprofMode, step: i64, t_us: i64) {
        self.put(what, mode, step, t_us, (0, 0, 0));
    }

    /// A complete event (`start_us`..`end_us`, phase and name ids): one `fetch_add` and
    /// eight stores.
    pub fn push_event(&self, phase: u32, name: u32, start_us: i64, end_us: i64, step: i64) {
        self.put(What::Event, TrainprofMode::Train, step, start_us, (end_us, phase, name));
    }

    fn put(&self, what: What, mode: TrainprofMode, step: i64, t_us: i64, event: (i64, u32, u32)) {
        let i = self.head.fetch_add(1, Relaxed);
        let s = &self.slots[(i % RING as u64) as usize];
        s.seq.store(0, Relaxed);
        std::sync::atomic::fence(Release);
        s.t_us.store(t_us, Relaxed);
        s.what.store(what as u8, Relaxed);
        s.mode.store(mode as u8, Relaxed);
        s.step.store(step, Relaxed);
        if what == What::Event {
            s.end_us.store(event.0, Relaxed);
            s.phase.store(event.1, Relaxed);
            s.name.store(event.2, Relaxed);
        }
        s.seq.store(i + 1, Release);
    }

    /// Copies the entries, oldest first, into `out` (no allocation: usable in a signal
    /// handler); returns how many.
    pub fn snapshot(&self, out: &mut [Entry; RING]) -> usize {
        let head = self.head.load(Acquire);
        let first = head.saturating_sub(RING as u64);
        let mut n = 0;
        for i in first..head {
            let s = &self.slots[(i % RING as u64) as usize];
            if s.seq.load(Acquire) != i + 1 {
                continue;
            }
            let e = (s.t_us.load(Relaxed), s.what.load(Relaxed), s.mode.load(Relaxed), s.step.load(Relaxed));
            let ev = (s.end_us.load(Relaxed), s.phase.load(Relaxed), s.name.load(Relaxed));
            std::sync::atomic::fence(Acquire);
            if s.seq.load(Relaxed) != i + 1 {
                continue;
            }
            if let (Some(what), Some(mode)) = (What::from_u8(e.1), TrainprofMode::from_i32(i32::from(e.2))) {
                out[n] = Entry { t_us: e.0, what, mode, step: e.3, end_us: ev.0, phase: ev.1, name: ev.2 };
                n += 1;
            }
        }
        n
    }
}

/// The median duration (s) of the completed steps of `mode` in `entries` (a start followed
/// by the end of the same step).
pub fn median_step_s(entries: &[Entry], mode: TrainprofMode) -> Option<f64> {
    let mut d: Vec<i64> = entries
        .windows(2)
        .filter(|w| {
            w[0].what == What::StepStart
                && w[1].what == What::StepEnd
                && w[0].mode == mode
                && w[1].mode == mode
                && w[0].step == w[1].step
        })
        .map(|w| w[1].t_us - w[0].t_us)
        .collect();
    if d.is_empty() {
        return None;
    }
    d.sort_unstable();
    Some(d[d.len() / 2] as f64 / 1e6)
}

/// The hook's share: settings, the ring, and what the Python package registered.
#[derive(Debug)]
pub struct Hang {
    pub config: HangDetection,
    pub ring: Ring,
    /// The last [`RING`] complete events (phases, ops: `Hook::record`), apart from the steps
    /// so that a burst of events cannot push the steps (and the median step) out.
    pub events: Ring,
    /// The memfd faulthandler writes to on [`Hang::python_signal`], -1 until registered.
    python_fd: AtomicI32,
    python_signal: AtomicI32,
    /// faulthandler's handler for [`Hang::python_signal`], as installed when the package
    /// registered it: a dump sends the signal only while this is still the one installed.
    python_handler: AtomicUsize,
    pub(crate) stop: AtomicBool,
    dumps: AtomicU32,
}

impl Hang {
    pub fn new(config: HangDetection) -> Hang {
        Hang {
            config,
            ring: Ring::default(),
            events: Ring::default(),
            python_fd: AtomicI32::new(-1),
            python_signal: AtomicI32::new(0),
            python_handler: AtomicUsize::new(libc::SIG_DFL),
            stop: AtomicBool::new(false),
            dumps: AtomicU32::new(0),
        }
    }

    /// The Python package's faulthandler registration, made just before: the handler now
    /// installed for `signum` is faulthandler's. False when none is (nothing is kept).
    pub fn set_python(&self, fd: i32, signum: i32) -> bool {
        let handler = signals::handler(signum);
        if matches!(handler, libc::SIG_DFL | libc::SIG_IGN) {
            return false;
        }
        self.python_handler.store(handler, SeqCst);
        self.python_signal.store(signum, SeqCst);
        self.python_fd.store(fd, SeqCst);
        true
    }
}

/// The kind of a dump (`stall.json`'s `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpKind {
    Stall,
    Signal,
    Fatal,
    Exception,
}

impl DumpKind {
    fn as_str(self) -> &'static str {
        match self {
            DumpKind::Stall => "stall",
            DumpKind::Signal => "signal",
            DumpKind::Fatal => "fatal",
            DumpKind::Exception => "exception",
        }
    }
}

/// The step state a dump names.
#[derive(Debug, Clone, Copy)]
pub struct StepState {
    pub in_step: bool,
    pub mode: Option<TrainprofMode>,
    /// The current (or last begun) step of the current mode, -1 before the first.
    pub step: i64,
    pub begin_us: i64,
}

/// `stall.json`'s fields that are not read from the ring.
#[derive(Debug, Clone, Copy)]
pub struct Header<'a> {
    pub kind: DumpKind,
    pub node: &'a str,
    pub pid: u32,
    pub state: StepState,
    pub detected_us: i64,
    pub threshold_s: Option<f64>,
    pub median_step_s: Option<f64>,
    pub signal: Option<i32>,
}

/// `SIGTERM` for 15, …: the names a dump uses.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGABRT => "SIGABRT",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        _ => "signal",
    }
}

/// A JSON string (no allocation).
struct JsonStr<'a>(&'a str);

impl std::fmt::Display for JsonStr<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('"')
    }
}

/// A float or `null`, as JSON.
struct Num(Option<f64>);

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            // Far from 1 in scientific notation (a 1e308 timeout is 5 bytes, not 309 digits;
            // both are JSON numbers). No allocation either way: the crash path uses it.
            Some(v) if v.is_finite() && v != 0.0 && !(1e-6..1e15).contains(&v.abs()) => write!(f, "{v:e}"),
            Some(v) if v.is_finite() => write!(f, "{v}"),
            _ => f.write_str("null"),
        }
    }
}

/// A complete event of [`Hang::events`] with its names, for `stall.json`'s ring.
#[derive(Debug, Clone, Copy)]
pub struct Span<'a> {
    pub start_us: i64,
    pub end_us: i64,
    pub phase: &'a str,
    pub name: &'a str,
    pub step: i64,
}

/// Writes `stall.json` (docs/formats.md, "Hang and crash dumps") to `out` without
/// allocating (the fatal-signal path formats into a static buffer). `ring` is the steps'
/// entries, `spans` the last complete events (each a `phase_start` and a `phase_end` entry
/// after the steps'; none on the fatal-signal path); `open_windows` and `hook` are written as
/// given (`hook` a JSON object).
pub fn write_stall_json(
    out: &mut impl std::fmt::Write,
    h: &Header<'_>,
    ring: &[Entry],
    spans: &[Span<'_>],
    open_windows: &[&str],
    hook: &dyn Fn(&mut dyn std::fmt::Write) -> std::fmt::Result,
) -> std::fmt::Result {
    let s = h.state;
    let step = s.step.max(0);
    let mode = s.mode.map_or("train", TrainprofMode::python_name);
    write!(
        out,
        "{{\"version\": 1, \"kind\": \"{}\", \"node\": {}, \"pid\": {}, \"mode\": \"{mode}\", \"step\": {step}, ",
        h.kind.as_str(),
        JsonStr(h.node),
        h.pid
    )?;
    if s.in_step {
        write!(out, "\"step_started_us\": {}, ", s.begin_us)?;
    } else {
        out.write_str("\"step_started_us\": null, ")?;
    }
    write!(
        out,
        "\"detected_us\": {}, \"threshold_s\": {}, \"median_step_s\": {}, ",
        h.detected_us,
        Num(h.threshold_s),
        Num(h.median_step_s)
    )?;
    // The last step of the current mode that ended.
    let last_completed = ring
        .iter()
        .rev()
        .find(|e| e.what == What::StepEnd && s.mode.is_none_or(|m| m == e.mode))
        .map(|e| e.step);
    match last_completed {
        Some(n) => write!(out, "\"last_completed_step\": {n}, ")?,
        None => out.write_str("\"last_completed_step\": null, ")?,
    }
    match h.signal {
        Some(sig) => write!(out, "\"signal\": \"{}\", ", signal_name(sig))?,
        None => out.write_str("\"signal\": null, ")?,
    }
    out.write_str("\"ring\": [")?;
    for (i, e) in ring.iter().enumerate() {
        if i > 0 {
            out.write_str(", ")?;
        }
        write!(
            out,
            "{{\"t_us\": {}, \"what\": \"{}\", \"name\": {}, \"step\": {}}}",
            e.t_us,
            e.what.as_str(),
            JsonStr(e.mode.step_phase()),
            e.step
        )?;
    }
    for (i, sp) in spans.iter().enumerate() {
        if i > 0 || !ring.is_empty() {
            out.write_str(", ")?;
        }
        for (k, (t, what)) in [(sp.start_us, "phase_start"), (sp.end_us, "phase_end")].into_iter().enumerate()
        {
            if k > 0 {
                out.write_str(", ")?;
            }
            write!(
                out,
                "{{\"t_us\": {t}, \"what\": \"{what}\", \"name\": {}, \"phase\": {}, \"step\": {}}}",
                JsonStr(sp.name),
                JsonStr(sp.phase),
                sp.step
            )?;
        }
    }
    out.write_str("], \"open_windows\": [")?;
    for (i, w) in open_windows.iter().enumerate() {
        if i > 0 {
            out.write_str(", ")?;
        }
        write!(out, "{}", JsonStr(w))?;
    }
    out.write_str("], \"hook\": ")?;
    hook(out)?;
    out.write_str("}\n")
}

/// `framework/hangs/<node>`, relative to `LocalPath`.
pub fn node_dir(node: &str) -> String {
    format!("framework/hangs/{node}")
}

/// `<step>-<detected µs>`.
pub fn dump_name(step: i64, detected_us: i64) -> String {
    format!("{}-{detected_us}", step.max(0))
}

// ---- signals -----------------------------------------------------------------------

/// Per signal number: the trainer's disposition that ours chains to (the fatal signals, read
/// when the crash handler was armed; SIGTERM and SIGINT have [`TERM_PREV`]).
static PREV: [Saved; 65] = [const { Saved::new() }; 65];
/// The process that armed the handlers: a `fork()`ed child (a DataLoader worker) inherits
/// them, but its handlers only chain (its hook is inert; it must not wait for a watchdog it
/// does not have, nor write the parent's dump).
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

fn in_owner() -> bool {
    // SAFETY: getpid is async-signal-safe and cannot fail.
    OWNER_PID.load(SeqCst) == unsafe { libc::getpid() }
}

/// The watchdog's wake-up pipe (write end), -1 without a watchdog.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The signal whose dump the watchdog is asked for (0: none).
static SIGNAL_PENDING: AtomicI32 = AtomicI32::new(0);
/// Signal dumps finished (the handler waits for it to move).
static SIGNAL_DONE: AtomicU32 = AtomicU32::new(0);
/// One signal dump per process.
static SIGNAL_DUMPED: AtomicBool = AtomicBool::new(false);
/// The signal of the native-stack handler (0: not installed).
static NATIVE_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// The thread asked to unwind itself, its frames and whether it finished.
static SLOT_TID: AtomicI32 = AtomicI32::new(0);
static SLOT_N: AtomicUsize = AtomicUsize::new(0);
/// The thread that finished unwinding into the slot (0: none yet).
static SLOT_DONE: AtomicI32 = AtomicI32::new(0);
static SLOT_IPS: [AtomicUsize; MAX_FRAMES] = [const { AtomicUsize::new(0) }; MAX_FRAMES];

fn gettid() -> i32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::gettid() }
}

fn errno_location() -> *mut i32 {
    // SAFETY: returns the calling thread's errno.
    unsafe { libc::__errno_location() }
}

/// Sends `sig` to the calling thread with `sig` unblocked for the call (trainprof's threads
/// block every asynchronous signal, [`signals::spawn_thread`]): its handler has run when this
/// returns.
fn raise_here(sig: i32) {
    let old = signals::thread_mask(libc::SIG_UNBLOCK, signals::bit(sig));
    // SAFETY: tgkill with this process's pid, the calling thread and a signal number.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), gettid(), sig) };
    signals::thread_mask(libc::SIG_SETMASK, old);
}

/// Per signal number, for SIGTERM and SIGINT: the trainer's disposition each of the two
/// term handlers chains to ([`wrap_term_signals`] says why two).
static TERM_PREV: [[Saved; 65]; 2] = [const { [const { Saved::new() }; 65] }; 2];
/// Per signal number: the term handler installed last (0 or 1).
static TERM_LAST: [AtomicU8; 65] = [const { AtomicU8::new(0) }; 65];

extern "C" fn term_handler_0(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    term_handler(0, sig, info, ctx);
}

extern "C" fn term_handler_1(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    term_handler(1, sig, info, ctx);
}

const TERM_HANDLERS: [SigInfoHandler; 2] = [term_handler_0, term_handler_1];

/// SIGTERM / SIGINT: ask the watchdog for the dump, wait for it (bounded), then do what the
/// trainer's disposition does. Ours is installed with the trainer's flags and mask
/// ([`wrap_term_signals`]), so the kernel already did for this call what it would have done
/// for the trainer's (the mask, `SA_NODEFER`, and `SA_RESETHAND`'s reset to the default).
fn term_handler(which: usize, sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let errno = errno_location();
    // SAFETY: the calling thread's errno.
    let saved = unsafe { *errno };
    // What the trainer's disposition was when this signal came (the watchdog may wrap a new
    // one while the dump is written).
    let prev = TERM_PREV[which][sig as usize].load();
    let wake = WAKE_FD.load(SeqCst);
    if wake >= 0 && in_owner() && !SIGNAL_DUMPED.swap(true, SeqCst) {
        let before = SIGNAL_DONE.load(SeqCst);
        SIGNAL_PENDING.store(sig, SeqCst);
        // SAFETY: write(2) on the pipe, a valid one-byte buffer.
        unsafe { libc::write(wake, b"s".as_ptr().cast(), 1) };
        let step = libc::timespec { tv_sec: 0, tv_nsec: 5_000_000 };
        let mut waited = Duration::ZERO;
        while SIGNAL_DONE.load(SeqCst) == before && waited < SIGNAL_WAIT {
            // SAFETY: nanosleep is async-signal-safe; a valid timespec.
            unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
            waited += Duration::from_millis(5);
        }
    }
    match prev.handler {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // The default action, as without trainprof: restored, and the signal raised
            // again (blocked while this handler runs, delivered when it returns).
            signals::set_default(sig);
            // SAFETY: raise is async-signal-safe.
            unsafe { libc::raise(sig) };
        }
        _ => prev.call(sig, info, ctx),
    }
    // SAFETY: as above.
    unsafe { *errno = saved };
}

/// Wraps SIGTERM and SIGINT's current disposition, unless it is ours or `SIG_IGN`. Called
/// at start and by the watchdog once a second (a handler the trainer installed since is
/// wrapped in turn). Ours takes the trainer's flags (`SA_RESTART`: Python's handlers are
/// installed without it so that a blocking call returns and the Python handler runs;
/// `SA_RESETHAND`, `SA_NODEFER`, `SA_ONSTACK`) and its mask, so that the signal is handled
/// with the same semantics as without trainprof.
///
/// Two term handlers take turns: a library that saved ours (chaining to the trainer's `H`),
/// installed its own `T` for a while (wrapped meanwhile by the other one, chaining to `T`) and
/// puts the saved one back gets the one that still chains to `H`, not to the `T` it removed.
fn wrap_term_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let Some(cur) = signals::get(sig) else { continue };
        let ours = TERM_HANDLERS.map(|h| h as usize);
        if ours.contains(&cur.sa_sigaction) || cur.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        let which = 1 - usize::from(TERM_LAST[sig as usize].load(SeqCst)).min(1);
        let prev = &TERM_PREV[which][sig as usize];
        prev.save(&cur);
        let flags =
            cur.sa_flags & (libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESETHAND);
        TERM_LAST[sig as usize].store(which as u8, SeqCst);
        // One that the trainer installed between the read and ours is the one wrapped.
        if let Some(old) = signals::swap(sig, TERM_HANDLERS[which], flags, signals::bits(&cur.sa_mask))
            && old.sa_sigaction != cur.sa_sigaction
            && !ours.contains(&old.sa_sigaction)
        {
            prev.save(&old);
        }
    }
}

/// The native-stack handler: the thread named in `SLOT_TID` unwinds itself.
extern "C" fn native_handler(_sig: i32, _info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    let errno = errno_location();
    // SAFETY: the calling thread's errno.
    let saved = unsafe { *errno };
    let me = gettid();
    if SLOT_TID.load(SeqCst) == me && SLOT_DONE.load(SeqCst) == 0 {
        let mut n = 0;
        // SAFETY: the unwinder runs on this thread's own stack; no allocation.
        unsafe {
            backtrace::trace_unsynchronized(|f| {
                if n >= MAX_FRAMES {
                    return false;
                }
                SLOT_IPS[n].store(f.ip() as usize, Relaxed);
                n += 1;
                true
            });
        }
        SLOT_N.store(n, SeqCst);
        SLOT_DONE.store(me, SeqCst);
    }
    // SAFETY: as above.
    unsafe { *errno = saved };
}

/// The native-stack signal while the handler is installed on it, else 0.
pub fn native_signal_now() -> i32 {
    let s = NATIVE_SIGNAL.load(SeqCst);
    if s != 0 && native_installed(s) { s } else { 0 }
}

/// Whether the native-stack handler is still the one installed for `sig` (the trainer may
/// have installed its own since: then the signal is the trainer's).
fn native_installed(sig: i32) -> bool {
    signals::handler(sig) == native_handler as SigInfoHandler as usize
}

/// The signal of the native-stack handler: the one installed before if it is still ours,
/// else the first free real-time signal from the top ([`signals::free_real_time`]; the
/// Python package's is searched from the bottom), installed now; or `None`.
fn native_signal(python_signal: i32) -> Option<i32> {
    let s = NATIVE_SIGNAL.load(SeqCst);
    if s != 0 && native_installed(s) {
        return Some(s);
    }
    let sig = signals::free_real_time(true, &[s, python_signal])?;
    if !signals::install(sig, native_handler, libc::SA_RESTART | libc::SA_ONSTACK, 0) {
        return None;
    }
    NATIVE_SIGNAL.store(sig, SeqCst);
    Some(sig)
}

/// One thread's native stack: its frame addresses, unwound by itself.
fn unwind_thread(pid: i32, tid: i32, sig: i32) -> Result<Vec<usize>, &'static str> {
    if tid == gettid() {
        let mut ips = Vec::new();
        backtrace::trace(|f| {
            ips.push(f.ip() as usize);
            ips.len() < MAX_FRAMES
        });
        return Ok(ips);
    }
    if !native_installed(sig) {
        return Err("the signal is the trainer's now");
    }
    SLOT_DONE.store(0, SeqCst);
    SLOT_N.store(0, SeqCst);
    SLOT_TID.store(tid, SeqCst);
    // SAFETY: tgkill with this process's pid, a thread id and a signal number.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
    if r != 0 {
        SLOT_TID.store(0, SeqCst);
        return Err("gone");
    }
    let t0 = std::time::Instant::now();
    while SLOT_DONE.load(SeqCst) != tid {
        if t0.elapsed() > THREAD_WAIT {
            SLOT_TID.store(0, SeqCst);
            return Err("did not answer in 200 ms");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    SLOT_TID.store(0, SeqCst);
    let n = SLOT_N.load(SeqCst).min(MAX_FRAMES);
    Ok(SLOT_IPS[..n].iter().map(|a| a.load(Relaxed)).collect())
}

/// Drops the frames of the signal handling itself (ours and the unwinder's, up to the
/// kernel's signal trampoline), so that a stack starts where the thread was.
fn strip_handler_frames(frames: &mut Vec<(usize, String)>) {
    if let Some(i) = frames.iter().position(|(_, s)| s.contains("__restore_rt")) {
        frames.drain(..=i);
    } else if let Some(i) = frames.iter().position(|(_, s)| s.contains("hang::native_handler")) {
        // The trampoline has no symbol of its own: the frame after the handler.
        frames.drain(..(i + 2).min(frames.len()));
    }
}

fn symbol(ip: usize) -> String {
    let mut name = None;
    // The address after a call: look up the call itself.
    backtrace::resolve(ip.saturating_sub(1) as *mut libc::c_void, |s| {
        if name.is_none() {
            name = s.name().map(|n| n.to_string());
        }
    });
    name.unwrap_or_else(|| "??".into())
}

fn thread_name(tid: i32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .map(|s| s.trim().chars().filter(|c| !c.is_control()).collect())
        .unwrap_or_else(|_| "?".into())
}

/// `native_stacks.txt`: every thread (at most [`MAX_THREADS`]), each unwinding itself.
/// Trainprof's own threads block the signal ([`signals::spawn_thread`]) and are named only.
pub fn native_stacks(python_signal: i32) -> String {
    let mut out = String::new();
    let Some(sig) = native_signal(python_signal) else {
        return "no free real-time signal for the native stacks\n".into();
    };
    let pid = std::process::id() as i32;
    let mut tids: Vec<i32> = std::fs::read_dir("/proc/self/task")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    tids.sort_unstable();
    for (i, tid) in tids.iter().copied().enumerate() {
        if i == MAX_THREADS {
            let _ = writeln!(out, "({} more threads not shown)", tids.len() - MAX_THREADS);
            break;
        }
        let _ = writeln!(out, "thread {tid} {}", thread_name(tid));
        if signals::is_guest(tid) {
            let _ = writeln!(out, "  (trainprof's own thread: it takes no signal, not unwound)\n");
            continue;
        }
        if tid != gettid() && signals::thread_blocks(tid, sig) {
            // A thread that blocks the signal would leave it pending for its sigwait.
            let _ = writeln!(out, "  (it blocks the signal: not unwound)\n");
            continue;
        }
        match unwind_thread(pid, tid, sig) {
            Ok(ips) => {
                let mut frames: Vec<(usize, String)> =
                    ips.into_iter().filter(|&ip| ip != 0).map(|ip| (ip, symbol(ip))).collect();
                strip_handler_frames(&mut frames);
                for (k, (ip, s)) in frames.iter().enumerate() {
                    let _ = writeln!(out, "  #{k} 0x{ip:x} {s}");
                }
            }
            Err(why) => {
                let _ = writeln!(out, "  ({why})");
            }
        }
        out.push('\n');
    }
    out
}

/// What `/proc/self/fd/<n>` of the package's memfd starts with (its name,
/// `trainprof-python-stacks`, hook-ffi/python/trainprof/_hang.py).
const PYTHON_MEMFD: &str = "/memfd:trainprof-python-stacks";

/// `python_stacks.txt` through faulthandler (see the module docs), or `None` when the Python
/// package registered nothing or faulthandler's handler is no longer the one installed.
fn python_stacks(h: &Hang) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; MAX_PYTHON_BYTES];
    let n = python_stacks_into(h, &mut buf)?;
    buf.truncate(n);
    Some(buf)
}

/// Every Python thread's stack into `buf` through the package's faulthandler registration:
/// the memfd emptied, the signal sent to the calling thread (faulthandler's handler has run
/// when that returns), the memfd read back; the length. `None` when the package registered
/// nothing, the fd is no longer its memfd (closed and reused for a file of the trainer's,
/// which the truncation would destroy), or faulthandler's handler is no longer the one
/// installed (Python's finalisation removes it, the default action of a real-time signal
/// would end the process, and a handler the trainer installed since must never be called by
/// a dump). Async-signal-safe (raw calls, no allocation): the crash handler uses it too.
fn python_stacks_into(h: &Hang, buf: &mut [u8]) -> Option<usize> {
    let fd = h.python_fd.load(SeqCst);
    let sig = h.python_signal.load(SeqCst);
    if fd < 0 || sig <= 0 || signals::handler(sig) != h.python_handler.load(SeqCst) {
        return None;
    }
    let mut path = [0u8; 48];
    if fmt_into(&mut path, format_args!("/proc/self/fd/{fd}")) >= path.len() {
        return None;
    }
    let mut link = [0u8; 64];
    // SAFETY: a NUL-terminated path and a valid buffer.
    let n = unsafe { libc::readlink(path.as_ptr().cast(), link.as_mut_ptr().cast(), link.len()) };
    if n <= 0 || !link[..n as usize].starts_with(PYTHON_MEMFD.as_bytes()) {
        return None;
    }
    // SAFETY: plain system calls on the registered fd.
    unsafe {
        libc::ftruncate(fd, 0);
        libc::lseek(fd, 0, libc::SEEK_SET);
    }
    raise_here(sig);
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: a valid buffer of the given length.
        let n = unsafe { libc::pread(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got, got as i64) };
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    Some(got)
}

// ---- the watchdog --------------------------------------------------------------------

/// A stall dumped, waiting for its step to end.
struct Stalled {
    dir: String,
    begin_us: i64,
    step: i64,
}

/// Starts the watchdog thread and wraps SIGTERM / SIGINT.
pub fn spawn(hook: Arc<Hook>) -> std::io::Result<()> {
    let mut fds = [0i32; 2];
    // SAFETY: a valid array of two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let read_fd = fds[0];
    // The process's signals never land on this thread (it writes their dump), nor on any
    // thread of ours: they are the trainer's.
    signals::spawn_thread("trainprof-watchdog", move || {
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&hook, read_fd)));
        WAKE_FD.store(-1, SeqCst);
        WATCHDOG_DONE.store(true, SeqCst);
        if ran.is_err() {
            crate::log(&format_args!("hang detection failed (internal error); it is off"));
        }
    })?;
    OWNER_PID.store(std::process::id() as i32, SeqCst);
    WAKE_FD.store(fds[1], SeqCst);
    wrap_term_signals();
    Ok(())
}

fn run(hook: &Hook, read_fd: i32) {
    let Some(hang) = hook.hang.as_deref() else { return };
    let mut stalled: Option<Stalled> = None;
    // The begin time of the last step dumped: one dump per stall.
    let mut dumped_begin = i64::MIN;
    let mut entries = Box::new([Entry::EMPTY; RING]);
    loop {
        let mut pfd = libc::pollfd { fd: read_fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 1000) };
        let mut sink = [0u8; 64];
        // SAFETY: a valid buffer; the pipe is non-blocking.
        while unsafe { libc::read(read_fd, sink.as_mut_ptr().cast(), sink.len()) } > 0 {}
        let stopping = hang.stop.load(SeqCst);
        if !stopping {
            wrap_term_signals();
        }
        let sig = SIGNAL_PENDING.swap(0, SeqCst);
        let state = hook.step_state();
        if sig != 0 {
            let _ = dump(hook, hang, Some(state), DumpKind::Signal, Some(sig), None, None);
            SIGNAL_DONE.fetch_add(1, SeqCst);
            // The step the signal came in is dumped: not again as a stall (the process
            // is ending, or its own handler decides).
            if state.in_step {
                dumped_begin = state.begin_us;
            }
        }
        let now = crate::now_us();
        if let Some(s) = &stalled
            && (!state.in_step || state.begin_us != s.begin_us)
        {
            let n = hang.ring.snapshot(&mut entries);
            let ended_us = entries[..n]
                .iter()
                .find(|e| e.what == What::StepEnd && e.step == s.step && e.t_us >= s.begin_us)
                .map_or(now, |e| e.t_us);
            let body = format!(
                "{{\"ended_us\": {ended_us}, \"stalled_s\": {}}}\n",
                (ended_us - s.begin_us) as f64 / 1e6
            );
            if let Err(e) = write_file(hook, &s.dir, "ended.json", body.as_bytes()) {
                crate::log(&format_args!("hang detection: cannot write {}/ended.json: {e}", s.dir));
            } else {
                crate::log(&format_args!(
                    "hang detection: step {} ended after {:.1} s",
                    s.step,
                    (ended_us - s.begin_us) as f64 / 1e6
                ));
            }
            stalled = None;
        }
        if stopping {
            return;
        }
        if state.in_step && stalled.is_none() && dumped_begin != state.begin_us {
            let n = hang.ring.snapshot(&mut entries);
            let median = state.mode.and_then(|m| median_step_s(&entries[..n], m));
            let threshold = hang.config.threshold_s(median);
            let open_s = (now - state.begin_us) as f64 / 1e6;
            if open_s > threshold {
                dumped_begin = state.begin_us;
                crate::log(&format_args!(
                    "hang detection: step {} has not ended after {open_s:.1} s (threshold {threshold:.1} s): writing its dump",
                    state.step
                ));
                if let Some(dir) =
                    dump(hook, hang, Some(state), DumpKind::Stall, None, Some((threshold, median)), None)
                {
                    stalled = Some(Stalled { dir, begin_us: state.begin_us, step: state.step });
                }
            }
        }
    }
}

fn write_file(hook: &Hook, rel: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let dir = Dir::open_root(hook.local_path(), true)?.sub(rel, true)?;
    if !fs::write_new(&dir, name, &hook.writer.os_pid.to_string(), bytes)? {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, format!("{name} exists")));
    }
    Ok(())
}

/// The hook's state as `stall.json`'s `hook` object.
fn hook_json(hook: &Hook, dumps: u32) -> impl Fn(&mut dyn std::fmt::Write) -> std::fmt::Result + '_ {
    move |out| {
        let s = hook.stats();
        write!(
            out,
            "{{\"enabled\": {}, \"events_written\": {}, \"files_sealed\": {}, \"dropped_queue_full\": {}, \"dropped_writer\": {}, \"dropped_names\": {}, \"open_failures\": {}, \"dumps\": {dumps}}}",
            hook.is_enabled(),
            s.written,
            s.files_sealed,
            s.dropped_queue_full,
            s.dropped_writer,
            s.dropped_names,
            s.open_failures
        )
    }
}

/// Writes one dump folder; its path relative to `LocalPath`, or `None` (one log line).
/// `state` is the step state judged (`None`: read now); `stall` the threshold and median of
/// a stall; `traceback` an exception's text.
#[allow(clippy::too_many_arguments)]
pub fn dump(
    hook: &Hook,
    hang: &Hang,
    state: Option<StepState>,
    kind: DumpKind,
    signal: Option<i32>,
    stall: Option<(f64, Option<f64>)>,
    traceback: Option<&str>,
) -> Option<String> {
    let _own = hook.own_work();
    let dumps = hang.dumps.fetch_add(1, SeqCst) + 1;
    let state = state.unwrap_or_else(|| hook.step_state());
    let detected_us = crate::now_us();
    // The ring, the median and the open windows as at detection: taking the stacks may take
    // a while (a signal per thread, symbolising), and the trainer may step on meanwhile.
    let mut entries = Box::new([Entry::EMPTY; RING]);
    let n = hang.ring.snapshot(&mut entries);
    let median = stall.map_or_else(|| state.mode.and_then(|m| median_step_s(&entries[..n], m)), |s| s.1);
    let open = hook.open_windows(state.step.max(0) as u64, detected_us as f64 / 1e6);
    let mut events = Box::new([Entry::EMPTY; RING]);
    let m = hang.events.snapshot(&mut events);
    let mut names = Vec::new();
    hook.names.copy_new(&mut names);
    let name_of = |id: u32| names.get(id as usize).map_or("?", |n| &**n);
    let spans: Vec<Span<'_>> = events[..m]
        .iter()
        .map(|e| Span {
            start_us: e.t_us,
            end_us: e.end_us,
            phase: name_of(e.phase),
            name: name_of(e.name),
            step: e.step,
        })
        .collect();
    let rel = format!("{}/{}", node_dir(hook.node_id()), dump_name(state.step, detected_us));
    let result = (|| -> std::io::Result<()> {
        let dir = Dir::open_root(hook.local_path(), true)?.sub(&rel, true)?;
        let tag = hook.writer.os_pid.to_string();
        let put = |name: &str, bytes: &[u8]| -> std::io::Result<()> {
            if fs::write_new(&dir, name, &tag, bytes)? {
                Ok(())
            } else {
                Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, format!("{name} exists")))
            }
        };
        if let Some(tb) = traceback {
            let end = tb.floor_char_boundary(MAX_TRACEBACK_BYTES);
            put("traceback.txt", &tb.as_bytes()[..end])?;
        } else {
            if let Some(py) = python_stacks(hang) {
                put("python_stacks.txt", &py)?;
            }
            put("native_stacks.txt", native_stacks(hang.python_signal.load(SeqCst)).as_bytes())?;
        }
        let header = Header {
            kind,
            node: hook.node_id(),
            pid: hook.writer.os_pid,
            state,
            detected_us,
            threshold_s: stall.map(|s| s.0),
            median_step_s: median,
            signal,
        };
        let mut json = String::new();
        write_stall_json(&mut json, &header, &entries[..n], &spans, &open, &hook_json(hook, dumps))
            .map_err(std::io::Error::other)?;
        put("stall.json", json.as_bytes())
    })();
    match result {
        Ok(()) => {
            crate::log(&format_args!("hang detection: {} dump in {rel}", kind.as_str()));
            Some(rel)
        }
        Err(e) => {
            crate::log(&format_args!("hang detection: cannot write {rel}: {e}"));
            None
        }
    }
}

// ---- fatal signals -------------------------------------------------------------------

/// The node's dump folder (`framework/hangs/<node>`), opened when armed; -1 until then.
static FATAL_PARENT_FD: AtomicI32 = AtomicI32::new(-1);
static FATAL_ARMED: AtomicBool = AtomicBool::new(false);
static FATAL_ONCE: AtomicBool = AtomicBool::new(false);
/// Per signal: the trainer's handler is its own faulthandler's, which gives the fault back by
/// `raise` with `SA_NODEFER`: blocked while it runs, so that the raise is seen ([`fatal_handler`]).
static RAISES_BACK: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];
/// The hook, for the crash handler (set when armed).
static FATAL_HOOK: std::sync::OnceLock<Arc<Hook>> = std::sync::OnceLock::new();
/// The signals a crash dump is written for.
pub const FATAL_SIGNALS: [i32; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT, libc::SIGFPE];

/// Opens `framework/hangs/<node>` (made if need be) for the crash handler and installs the
/// crash handler in front of the trainer's dispositions, which it keeps ([`PREV`]) and chains
/// to as the kernel would have called them (docs/trainer.md, "Signals"). Nothing is left on
/// disk unless a crash comes.
pub fn arm_fatal(hook: &Arc<Hook>, trainer_faulthandler: bool) -> std::io::Result<()> {
    if FATAL_ARMED.load(SeqCst) {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "armed already"));
    }
    let parent = Dir::open_root(hook.local_path(), true)?.sub(&node_dir(hook.node_id()), true)?;
    if FATAL_ARMED.swap(true, SeqCst) {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "armed already"));
    }
    OWNER_PID.store(std::process::id() as i32, SeqCst);
    let _ = FATAL_HOOK.set(Arc::clone(hook));
    FATAL_PARENT_FD.store(dup_forever(&parent)?, SeqCst);
    for sig in FATAL_SIGNALS {
        let Some(prev) = signals::get(sig) else { continue };
        PREV[sig as usize].save(&prev);
        let function = PREV[sig as usize].load().is_function();
        // The trainer's flags and mask where it has a handler, so that the kernel does for
        // this call what it would have done for the trainer's (SA_RESETHAND included). Else on
        // the alternate stack where the thread has one (a stack overflow), open to a fault
        // inside itself (which then ends the process at once), restarting what a sent signal
        // interrupts (SIG_IGN stays invisible).
        let (flags, mask) = if function {
            let keep = libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESETHAND;
            (prev.sa_flags & keep, signals::bits(&prev.sa_mask))
        } else {
            (libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESTART, 0)
        };
        // CPython's faulthandler installs its handler without SA_SIGINFO and with SA_NODEFER,
        // and always gives the fault back by raising it again.
        let faulthandler = trainer_faulthandler
            && function
            && prev.sa_flags & libc::SA_SIGINFO == 0
            && prev.sa_flags & libc::SA_NODEFER != 0;
        RAISES_BACK[sig as usize].store(faulthandler, SeqCst);
        // One that the trainer installed between the read and ours is the one chained to.
        if let Some(old) = signals::swap(sig, fatal_handler, flags, mask)
            && old.sa_sigaction != prev.sa_sigaction
        {
            PREV[sig as usize].save(&old);
        }
    }
    Ok(())
}

/// A copy of `dir`'s fd that is never closed (the crash handler uses it).
fn dup_forever(dir: &Dir) -> std::io::Result<i32> {
    use std::os::fd::AsFd as _;
    // SAFETY: duplicating an open fd.
    let fd = unsafe { libc::fcntl(dir.as_fd().as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if fd < 0 { Err(std::io::Error::last_os_error()) } else { Ok(fd) }
}

/// A fixed buffer that `write!` fills without allocating; output past the end is cut.
struct Fixed<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl std::fmt::Write for Fixed<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let room = self.buf.len().saturating_sub(self.len);
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        if n < s.len() { Err(std::fmt::Error) } else { Ok(()) }
    }
}

/// Formats into `buf` with a NUL after; the length without it (`buf.len()` when cut).
fn fmt_into(buf: &mut [u8], args: std::fmt::Arguments<'_>) -> usize {
    let cap = buf.len().saturating_sub(1);
    let mut f = Fixed { buf: &mut buf[..cap], len: 0 };
    if f.write_fmt(args).is_err() {
        return buf.len();
    }
    let n = f.len;
    buf[n] = 0;
    n
}

/// The crash dump's buffers: static, so that the handler allocates nothing.
struct CrashBuf(std::cell::UnsafeCell<[u8; MAX_PYTHON_BYTES]>);
// SAFETY: used only by the crash handler, once per process (FATAL_ONCE).
unsafe impl Sync for CrashBuf {}
static CRASH_BUF: CrashBuf = CrashBuf(std::cell::UnsafeCell::new([0; MAX_PYTHON_BYTES]));

struct CrashRing(std::cell::UnsafeCell<[Entry; RING]>);
// SAFETY: as CrashBuf.
unsafe impl Sync for CrashRing {}
static CRASH_RING: CrashRing = CrashRing(std::cell::UnsafeCell::new([Entry::EMPTY; RING]));

/// Writes `bytes` as the new file `name` in the folder `dir` (raw calls; no follow, no
/// replace).
fn raw_write_new(dir: i32, name: &std::ffi::CStr, bytes: &[u8]) {
    // SAFETY: an open directory fd, a NUL-terminated name, a valid buffer.
    unsafe {
        let fd = libc::openat(
            dir,
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644,
        );
        if fd < 0 {
            return;
        }
        let mut off = 0;
        while off < bytes.len() {
            let n = libc::write(fd, bytes[off..].as_ptr().cast(), bytes.len() - off);
            if n <= 0 {
                break;
            }
            off += n as usize;
        }
        libc::close(fd);
    }
}

/// The crash handler (docs/trainer.md, "Signals"). It writes a dump only when the signal is
/// going to end the process, and otherwise leaves the trainer's handling exactly as it was:
///
/// * the trainer's disposition was the default action (or `SIG_IGN` for a fault, which the
///   kernel turns into the default action): dump, put the default back, and for a fault
///   return, so that the faulting instruction runs again and the process dies of the real
///   fault (its address and a core dump as without trainprof); a signal sent by `kill` or
///   `raise` is raised again;
/// * the trainer's handler (a runtime that fixes its own faults, the trainer's own
///   faulthandler): called directly with the kernel's `siginfo` and context, so it sees the
///   real fault. If it gives the fault back (returns with the default action installed, or
///   puts the default back and raises the signal), the dump is written before the process
///   dies of it; if it handled the fault, nothing is written and the faulting instruction
///   runs again. A raise inside it is seen as pending because the signal is blocked while it
///   runs: by the kernel, from its own flags, or here for the trainer's faulthandler (whose
///   `SA_NODEFER` would let the raise kill at once).
extern "C" fn fatal_handler(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let errno = errno_location();
    // SAFETY: the calling thread's errno.
    let saved = unsafe { *errno };
    // SAFETY: the kernel's siginfo, when there is one.
    let code = if info.is_null() { 0 } else { unsafe { (*info).si_code } };
    let fault = is_fault(sig, code);
    let prev = PREV[sig as usize].load();
    match prev.handler {
        libc::SIG_IGN if !fault => {}
        libc::SIG_DFL | libc::SIG_IGN => {
            crash_dump(sig);
            signals::set_default(sig);
            if !fault {
                // SAFETY: raise is async-signal-safe.
                unsafe { libc::raise(sig) };
            }
        }
        _ => {
            // The trainer's faulthandler raises the signal again: blocked (it has SA_NODEFER),
            // that raise waits for the dump. Any other handler runs with the flags it chose
            // (one with SA_NODEFER may longjmp out, leaving no mask of ours behind).
            let old = RAISES_BACK[sig as usize]
                .load(SeqCst)
                .then(|| signals::thread_mask(libc::SIG_BLOCK, signals::bit(sig)));
            prev.call(sig, info, ctx);
            // Given back: the default action is installed again, and the signal is raised
            // again (pending), or it is a fault that happens again when this returns. With
            // SA_RESETHAND the kernel installed the default itself: only a raise counts.
            // One system call per fault handled (a runtime may fault thousands of times a
            // second): the pending set is read only once the default is back.
            let again = fault && prev.flags & libc::SA_RESETHAND == 0;
            if signals::handler(sig) == libc::SIG_DFL && (again || signals::pending(sig)) {
                crash_dump(sig);
            }
            if let Some(old) = old {
                signals::thread_mask(libc::SIG_SETMASK, old);
            }
        }
    }
    // SAFETY: as above.
    unsafe { *errno = saved };
}

/// Whether `code` says the kernel raised `sig` for the instruction the thread was running, so
/// that it happens again when the handler returns (SIGBUS's `BUS_MCEERR_AO`, an early memory
/// error report, and every code of a signal sent by `kill`, `raise` or `abort`, which are 0 or
/// negative, do not).
fn is_fault(sig: i32, code: i32) -> bool {
    const SI_KERNEL: i32 = 0x80;
    const BUS_MCEERR_AR: i32 = 4;
    match sig {
        libc::SIGSEGV => code > 0,
        libc::SIGBUS => (1..=BUS_MCEERR_AR).contains(&code) || code == SI_KERNEL,
        libc::SIGFPE => code > 0,
        _ => false,
    }
}

/// The crash's dump, once per process and only in the process that armed it.
fn crash_dump(sig: i32) {
    if in_owner() && !FATAL_ONCE.swap(true, SeqCst) {
        write_crash(sig);
    }
}

fn write_crash(sig: i32) {
    let parent = FATAL_PARENT_FD.load(SeqCst);
    let Some(hook) = FATAL_HOOK.get() else { return };
    let Some(hang) = hook.hang.as_deref() else { return };
    if parent < 0 {
        return;
    }
    let state = hook.step_state();
    let detected_us = crate::now_us();
    // The folder: made here (mkdirat does not follow a link in the last component, and
    // fails on any existing name), then opened without following one.
    let mut name = [0u8; 64];
    if fmt_into(&mut name, format_args!("{}-{detected_us}", state.step.max(0))) >= name.len() {
        return;
    }
    // SAFETY: an open directory fd and a NUL-terminated name.
    let dir = unsafe {
        if libc::mkdirat(parent, name.as_ptr().cast(), 0o755) != 0 {
            return;
        }
        libc::openat(
            parent,
            name.as_ptr().cast(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return;
    }
    // SAFETY: once per process (FATAL_ONCE); nothing else touches these buffers.
    let (buf, ring) = unsafe { (&mut *CRASH_BUF.0.get(), &mut *CRASH_RING.0.get()) };
    // Every Python thread's stack, faulthandler's (through the package's registration).
    let got = python_stacks_into(hang, buf).unwrap_or(0);
    if got > 0 {
        raw_write_new(dir, c"python_stacks.txt", &buf[..got]);
    }
    // The crashing thread's native stack.
    let mut ips = [0usize; MAX_FRAMES];
    let mut n = 0;
    // SAFETY: unwinding this thread's own stack into a local array.
    unsafe {
        backtrace::trace_unsynchronized(|f| {
            if n >= MAX_FRAMES {
                return false;
            }
            ips[n] = f.ip() as usize;
            n += 1;
            true
        });
    }
    let len = {
        let mut f = Fixed { buf: &mut buf[..], len: 0 };
        let _ = writeln!(f, "thread {} (crashed: {})", gettid(), signal_name(sig));
        for (k, ip) in ips[..n].iter().filter(|ip| **ip != 0).enumerate() {
            let _ = write!(f, "  #{k} 0x{ip:x} ");
            let _ = dladdr_name(&mut f, *ip);
            let _ = f.write_str("\n");
        }
        f.len
    };
    raw_write_new(dir, c"native_stacks.txt", &buf[..len]);
    let count = hang.ring.snapshot(ring);
    let header = Header {
        kind: DumpKind::Fatal,
        node: hook.node_id(),
        pid: hook.writer.os_pid,
        state,
        detected_us,
        threshold_s: None,
        median_step_s: None,
        signal: Some(sig),
    };
    let dumps = hang.dumps.fetch_add(1, SeqCst) + 1;
    let stats = |out: &mut dyn std::fmt::Write| {
        write!(out, "{{\"enabled\": {}, \"dumps\": {dumps}, \"crash\": true}}", hook.is_enabled())
    };
    let len = {
        let mut f = Fixed { buf: &mut buf[..], len: 0 };
        match write_stall_json(&mut f, &header, &ring[..count], &[], &[], &stats) {
            Ok(()) => f.len,
            Err(_) => 0,
        }
    };
    if len > 0 {
        // Last: its presence says the folder is complete.
        raw_write_new(dir, c"stall.json", &buf[..len]);
    }
    // SAFETY: the fd opened above.
    unsafe { libc::close(dir) };
}

/// The symbol `dladdr` finds for `ip` (the exported name, mangled), or `??`.
fn dladdr_name(f: &mut Fixed<'_>, ip: usize) -> std::fmt::Result {
    // SAFETY: all-zero is a valid Dl_info.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer; the address is only looked up.
    if unsafe { libc::dladdr(ip.saturating_sub(1) as *const libc::c_void, &mut info) } != 0
        && !info.dli_sname.is_null()
    {
        // SAFETY: dladdr returns a NUL-terminated name that lives as long as the library.
        let name = unsafe { std::ffi::CStr::from_ptr(info.dli_sname) };
        match name.to_str() {
            Ok(_) => write!(f, "{}", backtrace::SymbolName::new(name.to_bytes())),
            Err(_) => f.write_str("??"),
        }
    } else {
        f.write_str("??")
    }
}

/// The watchdog thread has returned.
static WATCHDOG_DONE: AtomicBool = AtomicBool::new(false);

/// Stops the watchdog: it writes the `ended.json` of a stall whose step has ended since it
/// last looked, then returns; waits for that at most 2 s.
pub fn stop(hang: &Hang) {
    hang.stop.store(true, SeqCst);
    let wake = WAKE_FD.load(SeqCst);
    if wake < 0 {
        return;
    }
    // SAFETY: write(2) on the pipe, a valid one-byte buffer.
    unsafe { libc::write(wake, b"q".as_ptr().cast(), 1) };
    let t0 = std::time::Instant::now();
    while !WATCHDOG_DONE.load(SeqCst) && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_entries_oldest_first_and_the_median_pairs_steps() {
        let r = Ring::default();
        for s in 0..300 {
            r.push(What::StepStart, TrainprofMode::Train, s, s * 100);
            r.push(What::StepEnd, TrainprofMode::Train, s, s * 100 + 10 + (s % 3));
        }
        let mut out = [Entry::EMPTY; RING];
        let n = r.snapshot(&mut out);
        assert_eq!(n, RING);
        assert_eq!(out[0].step, 300 - 128);
        assert_eq!(out[n - 1].what, What::StepEnd);
        assert_eq!(median_step_s(&out[..n], TrainprofMode::Train), Some(11e-6));
        assert_eq!(median_step_s(&out[..n], TrainprofMode::Eval), None);
    }

    #[test]
    fn stall_json_is_json_and_fits_a_fixed_buffer() {
        let step = |t_us, what, step| Entry { t_us, what, step, ..Entry::EMPTY };
        let entries =
            [step(5, What::StepStart, 29), step(9, What::StepEnd, 29), step(10, What::StepStart, 30)];
        let spans = [Span { start_us: 11, end_us: 12, phase: "Forward", name: "conv\"1", step: 30 }];
        let header = Header {
            kind: DumpKind::Stall,
            node: "0-h\"x",
            pid: 7,
            state: StepState { in_step: true, mode: Some(TrainprofMode::Train), step: 30, begin_us: 10 },
            detected_us: 2_000_010,
            threshold_s: Some(1.0),
            median_step_s: Some(4e-6),
            signal: None,
        };
        let hook = |o: &mut dyn std::fmt::Write| o.write_str("{\"x\": 1}");
        let mut buf = [0u8; 4096];
        let mut f = Fixed { buf: &mut buf, len: 0 };
        write_stall_json(&mut f, &header, &entries, &spans, &["detailed"], &hook).unwrap();
        let len = f.len;
        let v: serde_json::Value = serde_json::from_slice(&buf[..len]).unwrap();
        assert_eq!(v["kind"], "stall");
        assert_eq!(v["node"], "0-h\"x");
        assert_eq!(v["step"], 30);
        assert_eq!(v["step_started_us"], 10);
        assert_eq!(v["last_completed_step"], 29);
        assert_eq!(v["signal"], serde_json::Value::Null);
        assert_eq!(v["ring"][2]["what"], "step_start");
        assert_eq!(v["ring"][2]["name"], "Step:ModeKeys.TRAIN");
        assert_eq!(v["ring"][3]["what"], "phase_start");
        assert_eq!(v["ring"][3]["t_us"], 11);
        assert_eq!(v["ring"][4]["what"], "phase_end");
        assert_eq!(v["ring"][4]["name"], "conv\"1");
        assert_eq!(v["ring"][4]["phase"], "Forward");
        assert_eq!(v["ring"][4]["t_us"], 12);
        assert_eq!(v["open_windows"][0], "detailed");
        assert_eq!(v["hook"]["x"], 1);
        let mut small = [0u8; 64];
        let mut f = Fixed { buf: &mut small, len: 0 };
        assert!(write_stall_json(&mut f, &header, &entries, &[], &[], &hook).is_err(), "cut, not overrun");
    }

    /// Events go to their own ring: a burst of them leaves the steps (and the median) alone.
    #[test]
    fn events_keep_their_ids_and_times_and_leave_the_steps_alone() {
        let (steps, events) = (Ring::default(), Ring::default());
        steps.push(What::StepStart, TrainprofMode::Train, 3, 100);
        for i in 0..1000 {
            events.push_event(7, 8 + i, 100 + i64::from(i), 101 + i64::from(i), 3);
        }
        let mut out = [Entry::EMPTY; RING];
        assert_eq!(steps.snapshot(&mut out), 1);
        let n = events.snapshot(&mut out);
        assert_eq!(n, RING);
        let last = out[n - 1];
        assert_eq!(
            (last.what, last.phase, last.name, last.t_us, last.end_us, last.step),
            (What::Event, 7, 1007, 1099, 1100, 3)
        );
    }

    #[test]
    fn numbers_far_from_one_are_short_json_numbers() {
        let shown = |v| Num(Some(v)).to_string();
        assert_eq!(shown(1e308), "1e308");
        assert_eq!(shown(1e-300), "1e-300");
        assert_eq!(shown(300.0), "300");
        assert_eq!(shown(0.25), "0.25");
        assert_eq!(shown(0.0), "0");
        assert_eq!(Num(Some(f64::NAN)).to_string(), "null");
        for v in [1e308, 1e-300, 123456789012345678.0] {
            assert_eq!(serde_json::from_str::<f64>(&shown(v)).unwrap(), v);
        }
    }

    #[test]
    fn names() {
        assert_eq!(dump_name(30, 123), "30-123");
        assert_eq!(dump_name(-1, 5), "0-5");
        assert_eq!(node_dir("0-h"), "framework/hangs/0-h");
    }
}
