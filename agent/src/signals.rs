//! SIGTERM and SIGINT, taken synchronously by one thread (`sigwaitinfo`), so that no
//! handler runs in an arbitrary thread and nothing async-signal-unsafe is ever needed.
//!
//! [`block`] must run before any other thread starts (threads inherit the mask). A child
//! inherits it too (the standard library no longer resets the mask between fork and
//! exec), so every command must be started through [`unblock_in_child`]: a trainer with
//! SIGTERM blocked could not be stopped.

use std::io;

/// A signal that reached the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub signo: i32,
    /// Sent by a process (`kill`, `docker stop`, a scheduler) rather than by the kernel
    /// for a terminal's Ctrl-C, which reaches the whole foreground process group (the
    /// trainer included) by itself.
    pub from_process: bool,
}

impl Received {
    pub fn name(&self) -> &'static str {
        match self.signo {
            libc::SIGTERM => "SIGTERM",
            libc::SIGINT => "SIGINT",
            _ => "signal",
        }
    }
}

fn set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set we own; sigaddset adds valid signals to it.
    unsafe {
        let mut s: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut s);
        libc::sigaddset(&mut s, libc::SIGTERM);
        libc::sigaddset(&mut s, libc::SIGINT);
        s
    }
}

/// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts later.
pub fn block() -> io::Result<()> {
    let s = set();
    // SAFETY: `s` is an initialised set; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &s, std::ptr::null_mut()) };
    if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) }
}

/// Undoes [`block`] in the calling thread (when no thread can take the signals).
pub fn unblock() {
    let s = set();
    // SAFETY: `s` is an initialised set; a null old-set pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &s, std::ptr::null_mut()) };
}

/// Makes `cmd` unblock SIGTERM and SIGINT in the child, between fork and exec.
pub fn unblock_in_child(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt as _;
    let s = set();
    // SAFETY: the closure runs in the forked child before exec and only calls
    // pthread_sigmask, which is async-signal-safe, on a set built before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let rc = libc::pthread_sigmask(libc::SIG_UNBLOCK, &s, std::ptr::null_mut());
            if rc == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(rc)) }
        });
    }
}

/// Starts the thread that waits for the signals and calls `on_signal` for each.
pub fn spawn(
    mut on_signal: impl FnMut(Received) + Send + 'static,
) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("trainprof-signals".into()).spawn(move || {
        let s = set();
        loop {
            // SAFETY: `s` is an initialised set and `info` a zeroed siginfo we own.
            let (signo, code) = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                let signo = libc::sigwaitinfo(&s, &mut info);
                (signo, info.si_code)
            };
            if signo < 0 {
                // EINTR: another signal interrupted the wait.
                continue;
            }
            // SI_USER (0), SI_QUEUE (-1), SI_TKILL (-6): a process sent it; positive
            // codes (SI_KERNEL) come from the kernel, e.g. the terminal.
            on_signal(Received { signo, from_process: code <= 0 });
        }
    })
}

/// Sends `signo` to `pid`.
pub fn send(pid: u32, signo: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signo) } == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}
