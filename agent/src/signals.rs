//! SIGTERM, SIGINT and SIGHUP, taken synchronously by one thread (`sigwaitinfo`), so that
//! no handler runs in an arbitrary thread and nothing async-signal-unsafe is ever needed.
//! What `run` does with them (pass them on to the command's process group) is in
//! [`crate::child`]; `agent` stops on any of them.
//!
//! [`block`] must run before any other thread starts (threads inherit the mask). A child
//! inherits it too (the standard library no longer resets the mask between fork and
//! exec), so every command must be started through [`unblock_in_child`]: a trainer with
//! SIGTERM blocked could not be stopped.
//!
//! SIGTTOU is blocked as well (never taken): the agent writes its log lines to a terminal
//! whose foreground may be the trainer's process group, and with `stty tostop` a write
//! from the background would stop it; and giving the terminal's foreground back
//! (`tcsetpgrp`) from the background is allowed only with SIGTTOU blocked or ignored
//! (POSIX `tcsetpgrp`).

use std::io;

/// The signals the agent takes, in the order tried.
pub const SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// A signal that reached the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub signo: i32,
}

impl Received {
    pub fn name(&self) -> &'static str {
        name(self.signo)
    }
}

/// `SIGTERM`, `SIGINT`, … for the signals this crate deals with.
pub fn name(signo: libc::c_int) -> &'static str {
    match signo {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
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

    /// The taken signals and SIGTTOU: what is blocked.
    fn mask(&self) -> libc::sigset_t {
        let mut m = self.set;
        // SAFETY: `m` is initialised.
        unsafe { libc::sigaddset(&mut m, libc::SIGTTOU) };
        m
    }
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

/// Blocks the taken signals and SIGTTOU in the calling thread and every thread it starts
/// later.
pub fn block(taken: &Taken) -> io::Result<()> {
    sigmask(libc::SIG_BLOCK, &taken.mask())
}

/// Undoes [`block`] for the taken signals in the calling thread (when no thread can take
/// them); SIGTTOU stays blocked.
pub fn unblock(taken: &Taken) {
    let _ = sigmask(libc::SIG_UNBLOCK, &taken.set);
}

/// Makes `cmd` unblock what [`block`] blocked, in the child between fork and exec (after
/// every other `pre_exec` step registered before it).
pub fn unblock_in_child(cmd: &mut std::process::Command, taken: &Taken) {
    use std::os::unix::process::CommandExt as _;
    let s = taken.mask();
    // SAFETY: the closure runs in the forked child before exec and only calls
    // pthread_sigmask, which is async-signal-safe, on a set built before the fork.
    unsafe {
        cmd.pre_exec(move || sigmask(libc::SIG_UNBLOCK, &s));
    }
}

/// Starts the thread that waits for the taken signals and calls `on_signal` for each.
pub fn spawn(
    taken: Taken,
    mut on_signal: impl FnMut(Received) + Send + 'static,
) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("trainprof-signals".into()).spawn(move || {
        loop {
            // SAFETY: the set is initialised and `info` a zeroed siginfo we own.
            let signo = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                libc::sigwaitinfo(&taken.set, &mut info)
            };
            if signo < 0 {
                // EINTR: another signal interrupted the wait.
                continue;
            }
            on_signal(Received { signo });
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
        let t = Taken::from_dispositions();
        for s in SIGNALS {
            assert_eq!(t.contains(s), !ignored(s), "{}", name(s));
        }
        assert!(!t.contains(libc::SIGTTOU));
        let m = t.mask();
        // SAFETY: `m` is initialised.
        assert_eq!(unsafe { libc::sigismember(&m, libc::SIGTTOU) }, 1);
    }
}
