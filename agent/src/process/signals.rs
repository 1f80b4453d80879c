//! SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2, taken by one thread through a self-pipe:
//! the handler only writes the signal's number to a pipe (`write` is async-signal-safe),
//! and the signal thread reads it and acts, so nothing async-signal-unsafe ever runs in a
//! handler. What `run` does with them (pass them on to the command's process group) is in
//! [`crate::process::child`]; `agent` stops on the first four ([`Received::stops`]) and logs the
//! user signals. SIGQUIT and the user signals are taken so that one meant for the trainer
//! (a stack dump, a checkpoint request, a scheduler's warning before the time limit)
//! neither ends `run`, their default action, nor is dropped when `run` is a container's
//! PID 1 (the kernel drops a signal a namespace's init has no handler for).
//!
//! These signals are never blocked: every child, however started (the trainer, or the
//! AWS SDK's `credential_process` helper from the uploader's thread), starts with them
//! unblocked and, since a caught signal's action is reset by `exec`, at their default
//! action. [`install`] runs before any other thread starts, so that a signal that arrives
//! before the signal thread reads the pipe waits there. Handlers use `SA_RESTART`; the
//! few calls that are not restarted (`waitid` in [`crate::process::child`]) retry on `EINTR`.
//!
//! SIGTTOU alone is blocked (never taken): the agent writes its log lines to a terminal
//! whose foreground may be the trainer's process group, and with `stty tostop` a write
//! from the background would stop it; and giving the terminal's foreground back
//! (`tcsetpgrp`) from the background is allowed only with SIGTTOU blocked or ignored
//! (POSIX `tcsetpgrp`). A handler would not do: the kernel would send SIGTTOU and
//! restart the call for ever. The trainer gets it unblocked through [`unblock_in_child`].

use std::io::{self, Read as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, IntoRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// The signals the agent takes, in the order tried.
pub const SIGNALS: [libc::c_int; 6] =
    [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2];

/// A signal that reached the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub signo: i32,
}

impl Received {
    pub fn name(&self) -> &'static str {
        name(self.signo)
    }

    /// Whether `trainprof agent` stops on it (SIGTERM, SIGINT, SIGHUP, SIGQUIT; not the
    /// user signals).
    pub fn stops(&self) -> bool {
        matches!(self.signo, libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT)
    }
}

/// `SIGTERM`, `SIGINT`, … for the signals this crate deals with.
pub fn name(signo: libc::c_int) -> &'static str {
    match signo {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGCONT => "SIGCONT",
        _ => "signal",
    }
}

/// The signals the agent takes: [`SIGNALS`] less those that were ignored when it started.
/// Those stay ignored, as a shell leaves them (`nohup` ignores SIGHUP, a non-interactive
/// shell SIGINT for a command in the background), and the command inherits them ignored.
#[derive(Clone, Copy)]
pub struct Taken {
    set: libc::sigset_t,
}

impl std::fmt::Debug for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = SIGNALS.iter().filter(|&&s| self.contains(s)).map(|&s| name(s)).collect();
        f.debug_tuple("Taken").field(&names).finish()
    }
}

impl Taken {
    /// Looks at the current dispositions.
    pub fn from_dispositions() -> Taken {
        let set = empty();
        let mut t = Taken { set };
        for sig in SIGNALS {
            if !ignored(sig) {
                // SAFETY: `t.set` is initialised and `sig` a valid signal.
                unsafe { libc::sigaddset(&mut t.set, sig) };
            }
        }
        t
    }

    pub fn contains(&self, signo: libc::c_int) -> bool {
        // SAFETY: the set is initialised.
        unsafe { libc::sigismember(&self.set, signo) == 1 }
    }
}

/// What is blocked: SIGTTOU alone.
fn ttou_mask() -> libc::sigset_t {
    let mut m = empty();
    // SAFETY: `m` is initialised.
    unsafe { libc::sigaddset(&mut m, libc::SIGTTOU) };
    m
}

fn empty() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set we own.
    unsafe {
        let mut s: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut s);
        s
    }
}

/// Whether `sig` is ignored (SIG_IGN) in this process now.
pub fn ignored(sig: libc::c_int) -> bool {
    // SAFETY: a null new action only reads the current one into the struct we own.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

fn sigmask(how: libc::c_int, set: &libc::sigset_t) -> io::Result<()> {
    // SAFETY: `set` is an initialised set; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(how, set, std::ptr::null_mut()) };
    if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) }
}

/// The write end of the self-pipe, for the handler; -1 before [`install`].
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

/// The process that called [`install`].
static OWNER: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(signo: libc::c_int) {
    // SAFETY: only async-signal-safe calls (errno location, write) on a descriptor that
    // stays open for the life of the process; errno is restored for the interrupted code.
    unsafe {
        let errno = *libc::__errno_location();
        let byte = signo as u8;
        let fd = PIPE_WRITE.load(Ordering::Relaxed);
        // Not in a child between fork and exec: the signal is the child's, not ours.
        if fd >= 0 && libc::getpid() == OWNER.load(Ordering::Relaxed) {
            // Non-blocking: a full pipe (a flood of signals) drops this one.
            libc::write(fd, (&raw const byte).cast(), 1);
        }
        *libc::__errno_location() = errno;
    }
}

/// The read end of the self-pipe: what [`spawn`] reads.
#[derive(Debug)]
pub struct Installed {
    read: std::os::fd::OwnedFd,
}

/// Catches the taken signals (their numbers go to a pipe until [`spawn`]'s thread reads
/// them) and blocks SIGTTOU, in the calling thread and every thread it starts later. Call
/// before any other thread starts.
pub fn install(taken: Taken) -> io::Result<Installed> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just returned these two descriptors, owned by nothing else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // The reader blocks; the handler's end stays non-blocking.
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(read.as_raw_fd(), libc::F_SETFL, 0) };
    OWNER.store(std::process::id() as i32, Ordering::SeqCst);
    let old = PIPE_WRITE.swap(write.into_raw_fd(), Ordering::SeqCst);
    if old >= 0 {
        // SAFETY: the previous write end, owned by this static alone.
        unsafe { libc::close(old) };
    }
    for sig in SIGNALS.into_iter().filter(|&s| taken.contains(s)) {
        set_action(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t)?;
    }
    sigmask(libc::SIG_BLOCK, &ttou_mask())?;
    Ok(Installed { read })
}

fn set_action(sig: libc::c_int, handler: libc::sighandler_t) -> io::Result<()> {
    // SAFETY: a zeroed sigaction with an initialised mask; the handler only writes to a
    // pipe (async-signal-safe).
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler;
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        if libc::sigaction(sig, &act, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Gives the taken signals their default action back (when no thread can take them).
pub fn restore_defaults(taken: &Taken) {
    for sig in SIGNALS.into_iter().filter(|&s| taken.contains(s)) {
        let _ = set_action(sig, libc::SIG_DFL);
    }
}

/// Makes `cmd` unblock SIGTTOU (blocked by [`install`]), in the child between fork and
/// exec (after every other `pre_exec` step registered before it).
pub fn unblock_in_child(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt as _;
    let s = ttou_mask();
    // SAFETY: the closure runs in the forked child before exec and only calls
    // pthread_sigmask, which is async-signal-safe, on a set built before the fork.
    unsafe {
        cmd.pre_exec(move || sigmask(libc::SIG_UNBLOCK, &s));
    }
}

/// Starts the thread that reads the caught signals and calls `on_signal` for each.
pub fn spawn(
    installed: Installed,
    mut on_signal: impl FnMut(Received) + Send + 'static,
) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("trainprof-signals".into()).spawn(move || {
        crate::pipeline::cost::enroll(crate::pipeline::cost::Part::Signals);
        let mut pipe = std::fs::File::from(installed.read);
        let mut buf = [0u8; 64];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    for &b in &buf[..n] {
                        on_signal(Received { signo: i32::from(b) });
                    }
                    crate::pipeline::cost::flush();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    })
}

/// Sends `signo` to `pid`.
pub fn send(pid: u32, signo: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signo) } == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sets() {
        assert_eq!(name(libc::SIGHUP), "SIGHUP");
        assert_eq!(Received { signo: libc::SIGINT }.name(), "SIGINT");
        assert_eq!(name(libc::SIGUSR2), "SIGUSR2");
        assert!(Received { signo: libc::SIGHUP }.stops());
        assert!(Received { signo: libc::SIGQUIT }.stops());
        assert!(!Received { signo: libc::SIGUSR1 }.stops());
        let t = Taken::from_dispositions();
        for s in SIGNALS {
            assert_eq!(t.contains(s), !ignored(s), "{}", name(s));
        }
        assert!(!t.contains(libc::SIGTTOU));
        let m = ttou_mask();
        // SAFETY: `m` is initialised.
        assert_eq!(unsafe { libc::sigismember(&m, libc::SIGTTOU) }, 1);
    }
}
