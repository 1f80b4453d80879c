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
//!   trainer stuck holding the GIL in C code still gets its stacks. Where the package
//!   registered nothing (`LD_PRELOAD`, or `trainprof trigger --stacks` without the recorder,
//!   [`on_request`]) the interpreter's own dumper is called from the dumping thread instead
//!   (`faulthandler.rs`'s `interpreter_stacks`).
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
//!
//! The files of this folder, one job each:
//!
//! | file | job |
//! |---|---|
//! | `mod.rs` | the public surface: [`Hang`] (the hook's share), [`StepState`], [`Host`] (what the recorder needs from the hook), the limits |
//! | `ring.rs` | the step and event rings ([`Ring`]) and the median step |
//! | `record.rs` | a dump folder ([`dump`]): `stall.json` ([`write_stall_json`]), `ended.json`, the folder names |
//! | `chain.rs` | the SIGTERM/SIGINT and crash handlers in front of the trainer's dispositions, and how each chains to them |
//! | `unwind.rs` | native stacks, each thread unwinding itself on a real-time signal |
//! | `faulthandler.rs` | Python stacks through the package's faulthandler memfd |
//! | `watchdog.rs` | the `trainprof-watchdog` thread |
//! | `on_request.rs` | `trainprof trigger --stacks` without the recorder: one dump from a short-lived thread |
//! | `crash.rs` | the crash dump, async-signal-safe: raw calls and static buffers |
//! | `fixed.rs` | formatting into a caller's buffer without allocating (the crash and faulthandler paths) |
//!
//! The recorder sees the hook only through [`Host`] (as native sampling does,
//! [`crate::native::Host`]): `hook.rs` implements it and owns the [`Hang`]; nothing here
//! reaches into the hook itself, so the two do not depend on each other.

mod chain;
mod crash;
mod faulthandler;
mod fixed;
pub mod on_request;
mod record;
mod ring;
mod unwind;
mod watchdog;

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering::*};

use trainprof_config::HangDetection;

use crate::signals;
use crate::stats::Stats;
use crate::types::TrainprofMode;

pub use chain::{FATAL_SIGNALS, arm_fatal};
pub use record::{DumpKind, Header, Span, dump, dump_name, node_dir, signal_name, write_stall_json};
pub use ring::{Entry, Ring, What, median_step_s};
pub use unwind::{native_signal_now, native_stacks};
pub use watchdog::{spawn, stop};

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
    /// `trainprof trigger --stacks`: a dump is asked of the watchdog ([`Hang::request_dump`]).
    requested: AtomicBool,
    /// The folder of the last requested dump (`None` inside: it could not be written), until
    /// taken ([`Hang::take_requested`]).
    requested_done: std::sync::Mutex<Option<Option<String>>>,
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
            requested: AtomicBool::new(false),
            requested_done: std::sync::Mutex::new(None),
        }
    }

    /// Asks the watchdog for a dump of kind `requested` now (the job goes on); false when no
    /// watchdog runs in this process.
    pub fn request_dump(&self) -> bool {
        let wake = chain::WAKE_FD.load(SeqCst);
        if wake < 0 || self.stop.load(SeqCst) {
            return false;
        }
        self.requested.store(true, SeqCst);
        // SAFETY: write(2) on the pipe, a valid one-byte buffer.
        unsafe { libc::write(wake, b"r".as_ptr().cast(), 1) };
        true
    }

    /// The requested dump's folder once written (`Some(None)`: it failed), else `None`.
    pub fn take_requested(&self) -> Option<Option<String>> {
        self.requested_done.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
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

/// The step state a dump names.
#[derive(Debug, Clone, Copy)]
pub struct StepState {
    pub in_step: bool,
    pub mode: Option<TrainprofMode>,
    /// The current (or last begun) step of the current mode, -1 before the first.
    pub step: i64,
    pub begin_us: i64,
}

/// What the recorder needs from the hook that owns it. The hook implements it
/// (`hook-ffi/src/hook.rs`); the watchdog and the crash handler hold it as `dyn Host`.
/// Everything the crash handler calls ([`Host::hang`], [`Host::step_state`],
/// [`Host::node_id`], [`Host::os_pid`], [`Host::is_enabled`]) must stay async-signal-safe:
/// atomics and fields, no lock, no allocation.
pub trait Host: Send + Sync + 'static {
    /// The recorder's state, `None` without `HangDetectionConfig`.
    fn hang(&self) -> Option<&Hang>;
    /// The step state the watchdog judges: the atomics the step calls store anyway.
    fn step_state(&self) -> StepState;
    /// The features whose window is open at `step` / `now_s`; empty when that cannot be
    /// told without waiting (the watchdog never waits for the hook).
    fn open_windows(&self, step: u64, now_s: f64) -> Vec<&'static str>;
    /// Marks the profiler's own work (a dump) until the value is dropped: the steps it
    /// overlaps are not judged slow (docs/formats.md, "Anomaly-triggered windows").
    fn own_work(&self) -> Box<dyn Send + '_>;
    /// `LocalPath`, the timeline node id and the trainer's pid: where a dump goes.
    fn local_path(&self) -> &std::path::Path;
    fn node_id(&self) -> &str;
    fn os_pid(&self) -> u32;
    /// Whether the hook records (`stall.json`'s `hook.enabled`).
    fn is_enabled(&self) -> bool;
    /// The hook's counters (`stall.json`'s `hook` object).
    fn stats(&self) -> Stats;
    /// Appends the names registered since `names` was last filled (ids are indexes).
    fn names(&self, names: &mut Vec<std::sync::Arc<str>>);
}

/// The process that armed the handlers: a `fork()`ed child (a DataLoader worker) inherits
/// them, but its handlers only chain (its hook is inert; it must not wait for a watchdog it
/// does not have, nor write the parent's dump).
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

fn in_owner() -> bool {
    // SAFETY: getpid is async-signal-safe and cannot fail.
    OWNER_PID.load(SeqCst) == unsafe { libc::getpid() }
}

fn gettid() -> i32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::gettid() }
}

fn errno_location() -> *mut i32 {
    // SAFETY: returns the calling thread's errno.
    unsafe { libc::__errno_location() }
}
