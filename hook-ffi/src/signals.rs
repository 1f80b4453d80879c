//! trainprof as a guest in the trainer's signal handling (docs/trainer.md, "Signals"): reading
//! and installing dispositions, calling the trainer's handler the way the kernel would have,
//! choosing a real-time signal that nobody in the process uses, and starting threads that take
//! no signal meant for the trainer.
//!
//! Everything a signal handler calls here is async-signal-safe: atomics, `sigaction`,
//! `pthread_sigmask`, `sigpending`.

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering::SeqCst};

/// A handler installed with `SA_SIGINFO`.
pub type SigInfoHandler = extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void);

/// The signals a fault raises on the faulting thread. They are never blocked in a thread of
/// ours: the kernel answers a blocked fault by resetting the whole process's disposition to
/// the default action and killing it, so no handler of the trainer's would run.
const SYNCHRONOUS: [i32; 6] =
    [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS];

/// `sig`'s disposition now, or `None` for a number the kernel refuses.
pub fn get(sig: i32) -> Option<libc::sigaction> {
    // SAFETY: all-zero is a valid sigaction; a NULL new action only reads.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    (unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == 0).then_some(old)
}

/// The handler address installed for `sig` (`SIG_DFL` when it cannot be read).
pub fn handler(sig: i32) -> usize {
    get(sig).map_or(libc::SIG_DFL, |a| a.sa_sigaction)
}

/// Installs `handler` for `sig` with `flags` (`SA_SIGINFO` added) and the signals of `mask`
/// (a bit set, [`bits`]) blocked while it runs.
pub fn install(sig: i32, handler: SigInfoHandler, flags: i32, mask: u64) -> bool {
    swap(sig, handler, flags, mask).is_some()
}

/// [`install`] that returns the disposition it replaced, read in the same call: what a caller
/// wraps must be that one, not one read earlier (the trainer may install its own between).
pub fn swap(sig: i32, handler: SigInfoHandler, flags: i32, mask: u64) -> Option<libc::sigaction> {
    // SAFETY: all-zero is a valid sigaction; the fields that matter are set.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler as usize;
    act.sa_flags = libc::SA_SIGINFO | flags;
    act.sa_mask = sigset(mask);
    // SAFETY: all-zero is a valid sigaction for the out-parameter.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    (unsafe { libc::sigaction(sig, &act, &mut old) } == 0).then_some(old)
}

/// Puts the default action back for `sig` (async-signal-safe).
pub fn set_default(sig: i32) {
    // SAFETY: all-zero is a valid sigaction (flags 0, empty mask) and SIG_DFL is 0.
    let act: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a valid sigaction.
    unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) };
}

/// Ignores `sig`, which discards one pending for any thread.
pub fn set_ignore(sig: i32) {
    // SAFETY: all-zero is a valid sigaction; SIG_IGN set as its handler.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = libc::SIG_IGN;
    // SAFETY: a valid sigaction.
    unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) };
}

/// Puts back a disposition read before (by [`get`] or [`swap`]).
pub fn restore(sig: i32, old: &libc::sigaction) {
    // SAFETY: a sigaction the kernel gave us.
    unsafe { libc::sigaction(sig, old, std::ptr::null_mut()) };
}

/// The signals 1–64 of `set` as bits (bit `n - 1` for signal `n`).
pub fn bits(set: &libc::sigset_t) -> u64 {
    (1..=64)
        .filter(|&s| {
            // SAFETY: a valid set and a signal number in range.
            unsafe { libc::sigismember(set, s) == 1 }
        })
        .fold(0, |acc, s| acc | (1u64 << (s - 1)))
}

/// The set of the signals whose bits are set ([`bits`]).
pub fn sigset(mask: u64) -> libc::sigset_t {
    // SAFETY: all-zero is a valid sigset_t, emptied before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid set pointers and signal numbers in range.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in 1..=64 {
            if mask & (1u64 << (s - 1)) != 0 {
                libc::sigaddset(&mut set, s);
            }
        }
    }
    set
}

/// The bit of one signal.
pub fn bit(sig: i32) -> u64 {
    if (1..=64).contains(&sig) { 1u64 << (sig - 1) } else { 0 }
}

/// Blocks (`how` = `SIG_BLOCK`), unblocks or sets the calling thread's mask; the old mask.
pub fn thread_mask(how: i32, mask: u64) -> u64 {
    let set = sigset(mask);
    // SAFETY: all-zero is a valid sigset_t for the out-parameter.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid set pointers; pthread_sigmask is async-signal-safe.
    unsafe { libc::pthread_sigmask(how, &set, &mut old) };
    bits(&old)
}

/// Whether `sig` is pending for the calling thread or the process.
pub fn pending(sig: i32) -> bool {
    // SAFETY: all-zero is a valid sigset_t for the out-parameter; sigpending is
    // async-signal-safe.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::sigpending(&mut set) == 0 && libc::sigismember(&set, sig) == 1 }
}

/// A disposition kept to chain to, readable from a signal handler: the handler, its flags
/// and its mask, each in an atomic.
#[derive(Debug)]
pub struct Saved {
    handler: AtomicUsize,
    flags: AtomicU64,
    mask: AtomicU64,
}

impl Saved {
    pub const fn new() -> Saved {
        Saved { handler: AtomicUsize::new(libc::SIG_DFL), flags: AtomicU64::new(0), mask: AtomicU64::new(0) }
    }

    pub fn save(&self, a: &libc::sigaction) {
        self.flags.store(a.sa_flags as u32 as u64, SeqCst);
        self.mask.store(bits(&a.sa_mask), SeqCst);
        self.handler.store(a.sa_sigaction, SeqCst);
    }

    /// The saved disposition now (a handler reads it once, at its start: the watchdog may
    /// save another while the handler runs).
    pub fn load(&self) -> Disposition {
        Disposition {
            handler: self.handler.load(SeqCst),
            flags: self.flags.load(SeqCst) as u32 as i32,
            mask: self.mask.load(SeqCst),
        }
    }
}

/// A disposition as [`Saved`] keeps it.
#[derive(Debug, Clone, Copy)]
pub struct Disposition {
    pub handler: usize,
    pub flags: i32,
    /// The signals blocked while the handler runs ([`bits`]).
    pub mask: u64,
}

impl Disposition {
    /// Whether it is a function (neither `SIG_DFL` nor `SIG_IGN`).
    pub fn is_function(&self) -> bool {
        !matches!(self.handler, libc::SIG_DFL | libc::SIG_IGN)
    }

    /// Calls the function with the kernel's own `info` and `ctx`, so that what it changes in
    /// the context (a runtime moving the program counter past a fault) takes effect when the
    /// outer handler returns. The caller installed its own handler with these flags and this
    /// mask, so the kernel already blocked what this one expects blocked.
    ///
    /// Always with three arguments, as the kernel itself calls every handler on x86-64 and
    /// arm64 (`info` and `ctx` are in the argument registers whatever `SA_SIGINFO` says, and a
    /// one-argument function ignores them): a handler read while the watchdog saves another
    /// one's flags is still called correctly.
    pub fn call(&self, sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        if !self.is_function() {
            return;
        }
        // SAFETY: a handler the trainer installed; see above for the calling convention.
        let f: SigInfoHandler = unsafe { std::mem::transmute::<usize, SigInfoHandler>(self.handler) };
        f(sig, info, ctx);
    }
}

impl Default for Saved {
    fn default() -> Self {
        Saved::new()
    }
}

// ---- a free real-time signal -------------------------------------------------------------

/// The signals blocked in some thread of the process other than trainprof's own, read from
/// `/proc/self/task/*/status` (`SigBlk`): a library waiting for a signal with `sigwait` or a
/// `signalfd` blocks it and leaves its disposition at the default, so the disposition alone
/// cannot tell that the signal is in use. A thread that blocks every signal of `range` (a
/// library's helper thread, or one starting a thread of ours) tells nothing about any one.
fn blocked_by_the_trainer(range: u64) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    let mut mask = 0;
    for t in tasks.flatten().take(4096) {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if is_guest(tid) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(t.path().join("status")) else { continue };
        if let Some(hex) = status.lines().find_map(|l| l.strip_prefix("SigBlk:")) {
            let blocked = u64::from_str_radix(hex.trim(), 16).unwrap_or(0);
            if blocked & range != range {
                mask |= blocked;
            }
        }
    }
    mask
}

/// Whether thread `tid` of this process blocks `sig` (`SigBlk` in its status): such a thread
/// waits for the signal with `sigwait` or a `signalfd`, or takes none, so nothing of ours is
/// sent to it.
pub fn thread_blocks(tid: i32, sig: i32) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .ok()
        .and_then(|st| st.lines().find_map(|l| l.strip_prefix("SigBlk:")).map(|h| h.trim().to_owned()))
        .and_then(|h| u64::from_str_radix(&h, 16).ok())
        .is_some_and(|m| m & bit(sig) != 0)
}

/// A real-time signal from `SIGRTMIN + 4` to `SIGRTMAX - 4` that nobody in the process uses:
/// its C-level disposition is the default (a handler installed by C code counts, which
/// Python's `signal.getsignal` cannot see) and no thread of the trainer's blocks it. Searched
/// upwards, or downwards with `from_top`; `None` when every one is in use.
pub fn free_real_time(from_top: bool, except: &[i32]) -> Option<i32> {
    let (lo, hi) = (libc::SIGRTMIN() + 4, libc::SIGRTMAX() - 4);
    let blocked = blocked_by_the_trainer((lo..=hi).fold(0, |m, s| m | bit(s)));
    let usable = |sig: i32| {
        !except.contains(&sig)
            && blocked & bit(sig) == 0
            && get(sig).is_some_and(|a| a.sa_sigaction == libc::SIG_DFL)
    };
    if from_top { (lo..=hi).rev().find(|&s| usable(s)) } else { (lo..=hi).find(|&s| usable(s)) }
}

// ---- threads of ours ---------------------------------------------------------------------

/// The thread ids of trainprof's own threads that are running (0: a free slot).
static GUESTS: [AtomicI32; 16] = [const { AtomicI32::new(0) }; 16];

/// Whether `tid` is one of trainprof's own threads.
pub fn is_guest(tid: i32) -> bool {
    tid != 0 && GUESTS.iter().any(|g| g.load(SeqCst) == tid)
}

/// Every signal but the synchronous ones: what a thread of ours blocks for its whole life.
fn asynchronous() -> u64 {
    SYNCHRONOUS.iter().fold(u64::MAX, |m, &s| m & !bit(s))
}

/// Starts a thread of trainprof's that takes no signal meant for the trainer: every
/// asynchronous signal is blocked in it from its first instruction (the calling thread blocks
/// them around the spawn, and the new thread inherits its mask), so a process-directed
/// signal goes to one of the trainer's threads, and reaches its `sigwait` or `signalfd`, as
/// without trainprof. The synchronous signals stay unblocked.
pub fn spawn_thread<F, T>(name: &str, f: F) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let old = thread_mask(libc::SIG_BLOCK, asynchronous());
    let spawned = std::thread::Builder::new().name(name.into()).spawn(move || {
        thread_mask(libc::SIG_UNBLOCK, !asynchronous());
        // SAFETY: no arguments, cannot fail.
        let tid = unsafe { libc::gettid() };
        /// Frees the thread's slot however `f` ends (a tid is reused by the kernel).
        struct Slot(Option<&'static AtomicI32>);
        impl Drop for Slot {
            fn drop(&mut self) {
                if let Some(g) = self.0 {
                    g.store(0, SeqCst);
                }
            }
        }
        let _slot = Slot(GUESTS.iter().find(|g| g.compare_exchange(0, tid, SeqCst, SeqCst).is_ok()));
        f()
    });
    // The caller's own mask, exactly as it was.
    thread_mask(libc::SIG_SETMASK, old);
    spawned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_and_sets_round_trip() {
        let m = bit(libc::SIGTERM) | bit(libc::SIGRTMIN() + 5) | bit(64);
        assert_eq!(bits(&sigset(m)), m);
        assert_eq!(bit(0), 0);
        assert_eq!(bit(65), 0);
    }

    #[test]
    fn a_thread_of_ours_blocks_every_asynchronous_signal_and_no_synchronous_one() {
        let before = thread_mask(libc::SIG_BLOCK, 0);
        let h = spawn_thread("trainprof-test", || {
            // SAFETY: no arguments, cannot fail.
            let tid = unsafe { libc::gettid() };
            (thread_mask(libc::SIG_BLOCK, 0), is_guest(tid))
        })
        .unwrap();
        let (mask, guest) = h.join().unwrap();
        assert!(guest);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGPROF, libc::SIGRTMIN() + 4, libc::SIGCHLD] {
            assert_ne!(mask & bit(s), 0, "signal {s} blocked");
        }
        for s in SYNCHRONOUS {
            assert_eq!(mask & bit(s), 0, "signal {s} not blocked");
        }
        assert_eq!(thread_mask(libc::SIG_BLOCK, 0), before, "the caller's mask is unchanged");
    }

    #[test]
    fn a_free_real_time_signal_is_neither_handled_nor_blocked() {
        extern "C" fn h(_: i32, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}
        let lo = libc::SIGRTMIN() + 4;
        let first = free_real_time(false, &[]).unwrap();
        assert!(first >= lo);
        // Handled from C: skipped.
        assert!(install(first, h, 0, 0));
        let second = free_real_time(false, &[]).unwrap();
        assert_ne!(second, first);
        // Blocked in a thread of the process (a sigwait user): skipped too.
        let old = thread_mask(libc::SIG_BLOCK, bit(second));
        let third = free_real_time(false, &[]).unwrap();
        thread_mask(libc::SIG_SETMASK, old);
        assert!(third != first && third != second);
        assert_eq!(free_real_time(false, &[second, third]).map(|s| s != second && s != third), Some(true));
        set_default(first);
    }
}
