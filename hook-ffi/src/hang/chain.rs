//! trainprof's handlers in front of the trainer's dispositions (docs/trainer.md, "Signals"):
//! SIGTERM / SIGINT, which ask the watchdog for a dump, and the fatal signals, whose handler
//! writes the crash dump ([`super::crash`]); each chains to the trainer's disposition as the
//! kernel would have. The generic helpers (reading, installing, calling a disposition) are
//! [`crate::signals`].
//!
//! Everything a handler here calls is async-signal-safe: atomics, raw system calls,
//! [`crate::signals`]'s helpers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, Ordering::*};
use std::time::Duration;

use trainprof_output::fs::Dir;

use super::crash::{FATAL_HOOK, FATAL_PARENT_FD, crash_dump, dup_forever};
use super::record::node_dir;
use super::{Host, OWNER_PID, errno_location, in_owner};
use crate::signals::{self, Saved, SigInfoHandler};

/// How long the SIGTERM/SIGINT handler waits for the dump before it chains.
const SIGNAL_WAIT: Duration = Duration::from_secs(5);

/// Per signal number: the trainer's disposition that ours chains to (the fatal signals, read
/// when the crash handler was armed; SIGTERM and SIGINT have [`TERM_PREV`]).
static PREV: [Saved; 65] = [const { Saved::new() }; 65];

/// The watchdog's wake-up pipe (write end), -1 without a watchdog.
pub(super) static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// The signal whose dump the watchdog is asked for (0: none).
pub(super) static SIGNAL_PENDING: AtomicI32 = AtomicI32::new(0);
/// Signal dumps finished (the handler waits for it to move).
pub(super) static SIGNAL_DONE: AtomicU32 = AtomicU32::new(0);
/// One signal dump per process.
static SIGNAL_DUMPED: AtomicBool = AtomicBool::new(false);

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
    match chain(prev.handler, false) {
        Chain::Nothing => {}
        Chain::Default => {
            // The default action, as without trainprof: restored, and the signal raised
            // again (blocked while this handler runs, delivered when it returns).
            signals::set_default(sig);
            // SAFETY: raise is async-signal-safe.
            unsafe { libc::raise(sig) };
        }
        Chain::Call => prev.call(sig, info, ctx),
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
pub(super) fn wrap_term_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let Some(cur) = signals::get(sig) else { continue };
        let ours = TERM_HANDLERS.map(|h| h as usize);
        if ours.contains(&cur.sa_sigaction) || cur.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        let which = 1 - usize::from(TERM_LAST[sig as usize].load(SeqCst)).min(1);
        let prev = &TERM_PREV[which][sig as usize];
        prev.save(&cur);
        let flags = term_flags(&cur);
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

/// What a handler of ours does after its dump, for the trainer's disposition `handler` (read
/// once, at the handler's start); `fault`: the signal is a fault that happens again when the
/// handler returns ([`is_fault`]; SIGTERM and SIGINT never are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chain {
    /// `SIG_IGN` for a signal that is not a fault: nothing, as without trainprof.
    Nothing,
    /// `SIG_DFL` (or `SIG_IGN` for a fault, which the kernel turns into the default action):
    /// the default action put back.
    Default,
    /// The trainer's handler, called as the kernel would have called it.
    Call,
}

fn chain(handler: usize, fault: bool) -> Chain {
    match handler {
        libc::SIG_IGN if !fault => Chain::Nothing,
        libc::SIG_DFL | libc::SIG_IGN => Chain::Default,
        _ => Chain::Call,
    }
}

/// The flags a term handler is installed with in front of `cur` (see [`wrap_term_signals`]).
fn term_flags(cur: &libc::sigaction) -> i32 {
    cur.sa_flags & (libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESETHAND)
}

/// The flags and mask the crash handler is installed with in front of `prev` (`function`:
/// `prev` is a handler, neither `SIG_DFL` nor `SIG_IGN`). The trainer's flags and mask where
/// it has a handler, so that the kernel does for this call what it would have done for the
/// trainer's (SA_RESETHAND included). Else on the alternate stack where the thread has one (a
/// stack overflow), open to a fault inside itself (which then ends the process at once),
/// restarting what a sent signal interrupts (SIG_IGN stays invisible).
fn fatal_flags(prev: &libc::sigaction, function: bool) -> (i32, u64) {
    if function {
        let keep = libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESETHAND;
        (prev.sa_flags & keep, signals::bits(&prev.sa_mask))
    } else {
        (libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESTART, 0)
    }
}

/// Whether the trainer's handler `prev` is CPython's faulthandler: installed without
/// SA_SIGINFO and with SA_NODEFER, it always gives the fault back by raising it again.
fn raises_back(trainer_faulthandler: bool, function: bool, prev: &libc::sigaction) -> bool {
    trainer_faulthandler
        && function
        && prev.sa_flags & libc::SA_SIGINFO == 0
        && prev.sa_flags & libc::SA_NODEFER != 0
}

static FATAL_ARMED: AtomicBool = AtomicBool::new(false);

/// Per signal: the trainer's handler is its own faulthandler's, which gives the fault back by
/// `raise` with `SA_NODEFER`: blocked while it runs, so that the raise is seen ([`fatal_handler`]).
static RAISES_BACK: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];

/// The signals a crash dump is written for.
pub const FATAL_SIGNALS: [i32; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT, libc::SIGFPE];

/// Opens `framework/hangs/<node>` (made if need be) for the crash handler and installs the
/// crash handler in front of the trainer's dispositions, which it keeps ([`PREV`]) and chains
/// to as the kernel would have called them (docs/trainer.md, "Signals"). Nothing is left on
/// disk unless a crash comes.
pub fn arm_fatal<H: Host>(hook: &Arc<H>, trainer_faulthandler: bool) -> std::io::Result<()> {
    if FATAL_ARMED.load(SeqCst) {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "armed already"));
    }
    let parent = Dir::open_root(hook.local_path(), true)?.sub(&node_dir(hook.node_id()), true)?;
    if FATAL_ARMED.swap(true, SeqCst) {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "armed already"));
    }
    OWNER_PID.store(std::process::id() as i32, SeqCst);
    let _ = FATAL_HOOK.set(Arc::clone(hook) as Arc<dyn Host>);
    FATAL_PARENT_FD.store(dup_forever(&parent)?, SeqCst);
    for sig in FATAL_SIGNALS {
        let Some(prev) = signals::get(sig) else { continue };
        PREV[sig as usize].save(&prev);
        let function = PREV[sig as usize].load().is_function();
        let (flags, mask) = fatal_flags(&prev, function);
        let faulthandler = raises_back(trainer_faulthandler, function, &prev);
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
    match chain(prev.handler, fault) {
        Chain::Nothing => {}
        Chain::Default => {
            crash_dump(sig);
            signals::set_default(sig);
            if !fault {
                // SAFETY: raise is async-signal-safe.
                unsafe { libc::raise(sig) };
            }
        }
        Chain::Call => {
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
