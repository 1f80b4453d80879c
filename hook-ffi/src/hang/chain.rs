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

#[cfg(test)]
mod tests {
    use super::*;

    /// A disposition as `sigaction` reads it: `handler` with `flags` and `mask` ([`signals::bits`]).
    fn action(handler: usize, flags: i32, mask: u64) -> libc::sigaction {
        // SAFETY: all-zero is a valid sigaction; the fields that matter are set.
        let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
        a.sa_sigaction = handler;
        a.sa_flags = flags;
        a.sa_mask = signals::sigset(mask);
        a
    }

    extern "C" fn some_handler(_: i32, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

    #[test]
    fn the_chain_for_each_previous_disposition() {
        let f = some_handler as SigInfoHandler as usize;
        // SIGTERM / SIGINT (never a fault) and a sent fatal signal.
        assert_eq!(chain(libc::SIG_IGN, false), Chain::Nothing);
        assert_eq!(chain(libc::SIG_DFL, false), Chain::Default);
        assert_eq!(chain(f, false), Chain::Call);
        // A fault: SIG_IGN is the default action (the kernel will not ignore it).
        assert_eq!(chain(libc::SIG_IGN, true), Chain::Default);
        assert_eq!(chain(libc::SIG_DFL, true), Chain::Default);
        assert_eq!(chain(f, true), Chain::Call);
    }

    #[test]
    fn ours_takes_the_trainers_flags_and_mask_and_keeps_sa_resethand() {
        let f = some_handler as SigInfoHandler as usize;
        let mask = signals::bit(libc::SIGUSR2) | signals::bit(libc::SIGCHLD);
        let all =
            libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESETHAND;
        let kept = libc::SA_RESTART | libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESETHAND;
        // A handler with SA_SIGINFO and without: the same flags but SA_SIGINFO (ours always has
        // it, signals::swap), the same mask.
        for flags in [all, all & !libc::SA_SIGINFO, libc::SA_RESETHAND, libc::SA_SIGINFO | libc::SA_RESETHAND]
        {
            let prev = action(f, flags, mask);
            assert_eq!(term_flags(&prev), flags & kept, "term, flags {flags:#x}");
            assert_eq!(fatal_flags(&prev, true), (flags & kept, mask), "fatal, flags {flags:#x}");
            assert_ne!(term_flags(&prev) & libc::SA_RESETHAND, 0, "SA_RESETHAND kept");
        }
        // Python's handlers (no SA_RESTART) stay without it.
        assert_eq!(term_flags(&action(f, libc::SA_ONSTACK, 0)), libc::SA_ONSTACK);
        // SIG_DFL / SIG_IGN in front of a fatal signal: ours on the alternate stack, open to a
        // fault in itself, restarting; nothing of the disposition's flags or mask.
        for h in [libc::SIG_DFL, libc::SIG_IGN] {
            assert_eq!(
                fatal_flags(&action(h, libc::SA_RESETHAND, mask), false),
                (libc::SA_ONSTACK | libc::SA_NODEFER | libc::SA_RESTART, 0)
            );
        }
    }

    #[test]
    fn only_cpython_faulthandler_is_taken_for_one_that_raises_back() {
        let f = some_handler as SigInfoHandler as usize;
        let cpython = action(f, libc::SA_NODEFER | libc::SA_ONSTACK, 0);
        assert!(raises_back(true, true, &cpython));
        assert!(!raises_back(false, true, &cpython), "the trainer has no faulthandler");
        assert!(!raises_back(true, false, &action(libc::SIG_DFL, libc::SA_NODEFER, 0)));
        assert!(!raises_back(true, true, &action(f, libc::SA_NODEFER | libc::SA_SIGINFO, 0)));
        assert!(!raises_back(true, true, &action(f, 0, 0)));
    }

    #[test]
    fn a_fault_is_what_the_kernel_raised_for_the_instruction() {
        const SI_USER: i32 = 0;
        const SI_TKILL: i32 = -6;
        assert!(is_fault(libc::SIGSEGV, 1));
        assert!(is_fault(libc::SIGFPE, 1));
        assert!(is_fault(libc::SIGBUS, 2));
        assert!(is_fault(libc::SIGBUS, 0x80));
        assert!(!is_fault(libc::SIGBUS, 5), "BUS_MCEERR_AO: an early report");
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGABRT] {
            assert!(!is_fault(sig, SI_USER) && !is_fault(sig, SI_TKILL), "sent, signal {sig}");
        }
        assert!(!is_fault(libc::SIGABRT, 1));
    }

    /// The only test that touches SIGINT and SIGTERM (tests run on threads of one process):
    /// no watchdog runs here, so ours chains at once.
    #[test]
    fn the_term_handler_wraps_the_trainers_and_chains_to_it() {
        static CALLS: AtomicU32 = AtomicU32::new(0);
        extern "C" fn trainer(_: i32, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
            CALLS.fetch_add(1, SeqCst);
        }
        let sig = libc::SIGINT;
        let ours = TERM_HANDLERS.map(|h| h as usize);
        assert!(WAKE_FD.load(SeqCst) < 0, "no watchdog in this process");
        // SIG_IGN: never wrapped.
        // SAFETY: installing SIG_IGN for SIGINT in this test process.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
        wrap_term_signals();
        assert_eq!(signals::handler(sig), libc::SIG_IGN);
        // The trainer's handler, without SA_SIGINFO, with SA_RESETHAND and a mask: wrapped with
        // both.
        let mask = signals::bit(libc::SIGUSR2);
        let a = action(trainer as SigInfoHandler as usize, libc::SA_RESETHAND, mask);
        // SAFETY: a valid sigaction for SIGINT.
        assert_eq!(unsafe { libc::sigaction(sig, &a, std::ptr::null_mut()) }, 0);
        wrap_term_signals();
        let now = signals::get(sig).unwrap();
        assert!(ours.contains(&now.sa_sigaction), "ours is installed");
        assert_eq!(now.sa_flags & (libc::SA_RESETHAND | libc::SA_RESTART), libc::SA_RESETHAND);
        assert_eq!(signals::bits(&now.sa_mask) & mask, mask);
        // Ours is not wrapped again.
        wrap_term_signals();
        assert_eq!(signals::handler(sig), now.sa_sigaction);
        // Raised: ours runs and calls the trainer's; SA_RESETHAND left the default behind.
        // SAFETY: SIGINT is handled by ours, which chains to `trainer`.
        unsafe { libc::raise(sig) };
        assert_eq!(CALLS.load(SeqCst), 1);
        assert_eq!(signals::handler(sig), libc::SIG_DFL);
        // SIG_DFL: wrapped too, chaining to the default (not raised here: it would end the test).
        wrap_term_signals();
        let which = usize::from(TERM_LAST[sig as usize].load(SeqCst));
        assert_eq!(signals::handler(sig), ours[which]);
        assert_eq!(TERM_PREV[which][sig as usize].load().handler, libc::SIG_DFL);
        // The handler that took its turn before still chains to the trainer's.
        assert_eq!(TERM_PREV[1 - which][sig as usize].load().handler, trainer as SigInfoHandler as usize);
        for s in [libc::SIGINT, libc::SIGTERM] {
            signals::set_default(s);
        }
    }
}
