//! The command `trainprof run` starts, as a shell starts a foreground job: in a process
//! group of its own, holding the terminal's foreground when `run` held it, so that a
//! terminal's Ctrl-C, Ctrl-\ and reads (pdb) go to the command and never to `run`; every
//! signal `run` takes is passed on to that group once; and the command's job-control
//! stops (Ctrl-Z) are mirrored by `run`, so the shell sees its job stop and resume.
//! docs/run.md ("Signals") lists the cases.
//!
//! POSIX calls used: `setpgid` (through `CommandExt::process_group`), `tcsetpgrp` (allowed
//! from a background group when SIGTTOU is blocked, which [`crate::process::signals::install`] does
//! in every thread of the agent and which the child still has until its mask is reset),
//! `waitid` with `WNOWAIT`, `kill` on a process group.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// The controlling terminal, open (close-on-exec, so the command does not inherit this
/// descriptor), when this process's group is its foreground group.
#[derive(Debug)]
pub struct Terminal {
    fd: OwnedFd,
}

impl Terminal {
    /// `/dev/tty` when there is a controlling terminal and this process is in its
    /// foreground group; `None` otherwise (no terminal, or started in the background).
    pub fn foreground() -> Option<Terminal> {
        // SAFETY: a valid NUL-terminated path; the descriptor returned is ours.
        let fd = unsafe { libc::open(c"/dev/tty".as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let t = Terminal { fd: unsafe { OwnedFd::from_raw_fd(fd) } };
        t.is_foreground().then_some(t)
    }

    fn foreground_group(&self) -> io::Result<libc::pid_t> {
        // SAFETY: tcgetpgrp has no memory-safety preconditions.
        let g = unsafe { libc::tcgetpgrp(self.fd.as_raw_fd()) };
        if g < 0 { Err(io::Error::last_os_error()) } else { Ok(g) }
    }

    /// Whether this process's group is the terminal's foreground group.
    pub fn is_foreground(&self) -> bool {
        // SAFETY: getpgrp has no preconditions.
        self.foreground_group().is_ok_and(|g| g == unsafe { libc::getpgrp() })
    }

    /// Whether the terminal was hung up (its descriptors then answer EIO).
    pub fn hung_up(&self) -> bool {
        self.foreground_group().is_err_and(|e| e.raw_os_error() == Some(libc::EIO))
    }

    /// Makes `pgid` the foreground group. SIGTTOU must be blocked in the calling thread.
    fn give_to(&self, pgid: libc::pid_t) -> io::Result<()> {
        // SAFETY: tcsetpgrp has no memory-safety preconditions.
        if unsafe { libc::tcsetpgrp(self.fd.as_raw_fd(), pgid) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Gives the foreground back to this process's group.
    fn take_back(&self) -> io::Result<()> {
        // SAFETY: getpgrp has no preconditions.
        self.give_to(unsafe { libc::getpgrp() })
    }
}

/// Starts `cmd` in a process group of its own and, with `terminal`, makes that group the
/// terminal's foreground before exec (in the child, so the command never runs a moment in
/// the background: a read from the terminal then would stop it). `nofile`: the file limit
/// to give the command back (the agent raised its own, [`raise_nofile_limit`]). Register
/// this before [`crate::process::signals::unblock_in_child`], which must come last.
pub fn prepare(cmd: &mut Command, terminal: Option<&Terminal>, nofile: Option<libc::rlimit>) {
    use std::os::unix::process::CommandExt as _;
    cmd.process_group(0);
    let fd = terminal.map(|t| t.fd.as_raw_fd());
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe calls (getpid, tcsetpgrp, setrlimit) on values copied before the
    // fork; the terminal descriptor stays open until exec (close-on-exec).
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = fd {
                // A failure leaves the command in the background: it still runs.
                libc::tcsetpgrp(fd, libc::getpid());
            }
            if let Some(lim) = nofile {
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
            Ok(())
        });
    }
}

/// Raises this process's soft limit on open files to the hard limit; returns the limits
/// as they were when it changed them, for [`prepare`] to give the command back (a trainer
/// using `select` needs descriptors below 1024, so its limit must not change).
pub fn raise_nofile_limit() -> Option<libc::rlimit> {
    // SAFETY: getrlimit / setrlimit read and write the struct we own.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= lim.rlim_max {
            return None;
        }
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        (libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0).then_some(lim)
    }
}

/// What [`Trainer::pass_on`] did.
#[derive(Debug)]
pub enum Passed {
    /// Sent to the command's process group.
    Sent,
    /// The command has exited: nothing sent (its pid may belong to someone else soon).
    Gone,
    /// SIGHUP after the terminal hung up while the command's group held its foreground:
    /// the kernel sends SIGHUP to that group itself when the session's leader exits, so
    /// passing this one on (a shell resending the hang-up to its jobs) would be a second.
    KernelSendsIt,
    Failed(io::Error),
}

/// The running command, shared by the thread that waits for it and the signal thread.
#[derive(Debug)]
pub struct Trainer {
    pid: libc::pid_t,
    /// Set, under the lock, just before the command is reaped: until then its pid (and
    /// process group id) cannot be reused, so a signal sent under the lock while it is
    /// false reaches the command's group and nobody else.
    reaped: Mutex<bool>,
    terminal: Option<Terminal>,
    /// The command's group holds the terminal's foreground (as far as `run` knows).
    has_terminal: AtomicBool,
}

impl Trainer {
    /// `terminal`: the one given to the command by [`prepare`].
    pub fn new(pid: u32, terminal: Option<Terminal>) -> Trainer {
        let has_terminal = AtomicBool::new(terminal.is_some());
        Trainer { pid: pid as libc::pid_t, reaped: Mutex::new(false), terminal, has_terminal }
    }

    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Takes the terminal back after the command could not be started.
    pub fn not_started(terminal: Option<Terminal>) {
        if let Some(t) = terminal {
            let _ = t.take_back();
        }
    }

    /// Sends `signo` to the command's process group (its workers and ranks in that group
    /// get it too, as from a terminal), once, unless the command has exited.
    pub fn pass_on(&self, signo: libc::c_int) -> Passed {
        let reaped = self.reaped.lock().unwrap_or_else(PoisonError::into_inner);
        if *reaped {
            return Passed::Gone;
        }
        if signo == libc::SIGHUP
            && self.has_terminal.load(Ordering::SeqCst)
            // SAFETY: getsid and getpid have no preconditions.
            && unsafe { libc::getsid(0) != libc::getpid() }
            && self.terminal.as_ref().is_some_and(Terminal::hung_up)
        {
            return Passed::KernelSendsIt;
        }
        // SAFETY: kill has no memory-safety preconditions; the group exists while its
        // leader is unreaped.
        let mut rc = unsafe { libc::kill(-self.pid, signo) };
        if rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            // The command left its group (setpgid / setsid of its own): the pid itself.
            // SAFETY: as above; the pid is unreaped.
            rc = unsafe { libc::kill(self.pid, signo) };
        }
        drop(reaped);
        if rc == 0 { Passed::Sent } else { Passed::Failed(io::Error::last_os_error()) }
    }

    /// Waits for the command to exit, mirroring its job-control stops, then reaps it and
    /// gives the terminal back to `run`'s group.
    pub fn wait(&self, child: &mut Child) -> io::Result<ExitStatus> {
        let stops = if self.terminal.is_some() { libc::WSTOPPED } else { 0 };
        loop {
            // SAFETY: waitid writes into the zeroed siginfo we own.
            let (rc, code, status) = unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                let rc = libc::waitid(
                    libc::P_PID,
                    self.pid as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT | stops,
                );
                (rc, info.si_code, info.si_status())
            };
            if rc != 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                // Reported by the wait below.
                break;
            }
            if code == libc::CLD_STOPPED {
                // SAFETY: as above. WSTOPPED alone: takes the stop report, never the exit.
                unsafe {
                    let mut info: libc::siginfo_t = std::mem::zeroed();
                    libc::waitid(
                        libc::P_PID,
                        self.pid as libc::id_t,
                        &mut info,
                        libc::WSTOPPED | libc::WNOHANG,
                    );
                }
                self.stopped(status);
                continue;
            }
            break;
        }
        *self.reaped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        let status = child.wait();
        if self.has_terminal.swap(false, Ordering::SeqCst)
            && let Some(t) = &self.terminal
        {
            let _ = t.take_back();
        }
        status
    }

    /// The command stopped with `sig`: as a shell running `run` as a job would see it, `run`
    /// stops too, with the terminal back in its group; when continued (`fg`, `bg`), it gives
    /// the terminal to the command again if it is in the foreground, and continues it.
    fn stopped(&self, sig: libc::c_int) {
        let Some(t) = &self.terminal else { return };
        if !matches!(sig, libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU) {
            // SIGSTOP from a debugger or `kill -STOP`: whoever sent it continues it.
            return;
        }
        crate::log!("the command stopped ({}); stopping too", crate::process::signals::name(sig));
        if self.has_terminal.swap(false, Ordering::SeqCst) {
            let _ = t.take_back();
        }
        let stoppable = can_stop();
        if stoppable {
            // SIGTTOU is blocked here (signals::install): SIGTSTP stops as well.
            let own = if sig == libc::SIGTTOU { libc::SIGTSTP } else { sig };
            // SAFETY: kill has no memory-safety preconditions. The main thread is the
            // target and takes part in the stop before this call returns.
            unsafe { libc::kill(libc::getpid(), own) };
        }
        // Continued, or never stopped (see `can_stop`).
        let foreground = t.is_foreground();
        if foreground && t.give_to(self.pid).is_ok() {
            self.has_terminal.store(true, Ordering::SeqCst);
        }
        if !stoppable && !foreground && sig != libc::SIGTSTP {
            // It stopped reading or writing a terminal it does not hold, and nobody can
            // resume `run`: continuing it would stop it again at once, in a loop.
            crate::log!("the command waits for the terminal; `kill -CONT -{}` continues it", self.pid);
            return;
        }
        // SAFETY: kill has no memory-safety preconditions; this thread reaps the
        // command, which has not happened yet.
        unsafe { libc::kill(-self.pid, libc::SIGCONT) };
    }
}

/// Whether a job-control stop signal stops this process: not for PID 1 (the kernel keeps
/// signals with default action away from it) nor for an orphaned process group, whose
/// SIGTSTP / SIGTTIN / SIGTTOU POSIX discards (approximated by: the parent is in the same
/// session and another group, as a job-control shell is).
fn can_stop() -> bool {
    // SAFETY: these calls have no preconditions.
    unsafe {
        let parent = libc::getppid();
        libc::getpid() != 1
            && parent > 0
            && libc::getsid(parent) == libc::getsid(0)
            && libc::getpgid(parent) != libc::getpgrp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_reaches_the_group_until_the_command_is_reaped() {
        // `sh` starts a grandchild in its (new) group and waits for it; the signal passed
        // on reaches both.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & wait"]);
        prepare(&mut cmd, None, None);
        let mut child = cmd.spawn().unwrap();
        let t = Trainer::new(child.id(), None);
        assert!(matches!(t.pass_on(libc::SIGTERM), Passed::Sent));
        let st = t.wait(&mut child).unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(st.signal(), Some(libc::SIGTERM));
        assert!(matches!(t.pass_on(libc::SIGTERM), Passed::Gone));
    }

    #[test]
    fn the_command_gets_its_own_group_and_the_file_limit_back() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "cut -d' ' -f5 /proc/$$/stat; ulimit -n"]);
        // SAFETY: getrlimit writes into the struct we own.
        let lim = unsafe {
            let mut l: libc::rlimit = std::mem::zeroed();
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
            l
        };
        let low = libc::rlimit { rlim_cur: lim.rlim_cur.min(200), rlim_max: lim.rlim_max };
        prepare(&mut cmd, None, Some(low));
        let out = cmd.output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines().map(str::trim);
        let pgid: i32 = lines.next().unwrap().parse().unwrap();
        // SAFETY: getpgrp has no preconditions.
        assert_ne!(pgid, unsafe { libc::getpgrp() });
        assert_eq!(lines.next().unwrap(), low.rlim_cur.to_string());
    }
}
