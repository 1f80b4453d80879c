//! The page at the end of `trainprof run`, made in a child process (docs/on-disk.md, "Who
//! reads what, with which rights"): the report reads what the trainer's user wrote, so
//! nothing it does may change `run`'s exit status, hold up the upload or outlive a bound.
//! The child is this binary again (`trainprof page-child`, hidden), started:
//!
//! * as the owner of the folder it reads, when `run` is root and that owner is not
//!   (`setgroups`, `setgid`, `setuid` through `std::process::Command`);
//! * with an empty environment (the upload's credentials stay here), `/` as its folder,
//!   in a process group of its own, killed with `run` (`PR_SET_PDEATHSIG`);
//! * with limits it cannot raise: [`ADDRESS_SPACE`] of memory (`RLIMIT_AS`), CPU time up to
//!   its wall bound (`RLIMIT_CPU`), no core file, no file written (`RLIMIT_FSIZE` 0);
//! * under a wall bound kept here: at the bound (or when `run` is told to stop) its process
//!   group is killed.
//!
//! It writes one JSON line (the summary's lines, or the error) and then the page on its
//! stdout; this side reads at most [`MAX_OUTPUT`] bytes of it and trusts none of it (the
//! trainer's user can trace a process running as itself): lines are stripped of control
//! characters and a page must look like one. Whatever the child does ends in one line.

use std::collections::HashSet;
use std::io::{self, Read as _, Write as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

/// The child's address space (`RLIMIT_AS`). The report's memory grows with the steps only
/// (docs/report.md, "Memory"); a job far beyond any real one is refused here.
pub const ADDRESS_SPACE: u64 = 4 << 30;

/// The most the child may write (its summary line and the page).
pub const MAX_OUTPUT: usize = 128 << 20;

/// The hidden subcommand the child runs.
pub const SUBCOMMAND: &str = "page-child";

/// Debug builds only: makes the child misbehave on purpose (`abort`, `hang`, `oom`,
/// `garbage`, `flood`, `limits`), so that tests can show what `run` does then.
pub const TEST_VAR: &str = "TRAINPROF_TEST_REPORT_CHILD";

/// What the child runs as: `Some((uid, gid))` to drop to.
pub type RunAs = Option<(u32, u32)>;

/// Whom the child runs as for a folder owned by `owner` (uid, gid): that owner when this
/// process is root and the owner is not.
pub fn run_as(owner: Option<(u32, u32)>) -> RunAs {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    owner.filter(|&(uid, _)| root && uid != 0)
}

/// The owner of the folder `path` (the LocalPath itself may be a link: it is followed).
pub fn owner_of(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| (m.uid(), m.gid()))
}

/// Set by a SIGTERM / SIGINT that reaches `run` once the command is gone: the page stops.
static STOPPED: AtomicBool = AtomicBool::new(false);

/// The child's pid while it is unreaped (so its process group cannot be another's).
static RUNNING: Mutex<Option<libc::pid_t>> = Mutex::new(None);

/// Stops the page: the child's group is killed now and none is started after this.
pub fn stop() {
    STOPPED.store(true, Ordering::SeqCst);
    let running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(pid) = *running {
        // SAFETY: kill has no memory-safety preconditions; the leader is unreaped, so the
        // group is the child's.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
}

/// Whether [`stop`] was called.
pub fn stopped() -> bool {
    STOPPED.load(Ordering::SeqCst)
}

/// What the child made.
#[derive(Debug)]
pub struct Made {
    /// `finding: …` lines, control characters removed.
    pub lines: Vec<String>,
    pub page: Vec<u8>,
    /// Why the report says there is no page (nothing to report, an unreadable folder);
    /// then `lines` and `page` are empty.
    pub error: Option<String>,
}

/// A child at work.
#[derive(Debug)]
pub struct Running {
    child: Child,
    output: mpsc::Receiver<io::Result<(Vec<u8>, bool)>>,
    wall: Duration,
    until: Instant,
}

/// Starts the child on the folder `root` (`source`: what the page calls it), leaving out
/// the files `leave_out`, with `wall` to finish. `root` is absolute: the child runs in `/`
/// (`run` resolves its LocalPath before anything starts); a relative one is refused here
/// rather than read from `/`.
/// Why the child made no page (its text follows `no report: ` in the run's summary).
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    #[error("stopped by a signal")]
    Stopped,
    #[error("{}: a relative path, and its process runs in /", .0.display())]
    Relative(std::path::PathBuf),
    #[error("cannot find this program: {0}")]
    NoProgram(#[source] io::Error),
    #[error("cannot start its process: {0}")]
    Start(#[source] io::Error),
    #[error("cannot start a thread: {0}")]
    Thread(#[source] io::Error),
    #[error("stopped by a signal (its process was killed)")]
    Killed,
    #[error("lost track of its process: {0}")]
    LostTrack(#[source] io::Error),
    #[error("not done within {0} s (its process was killed)")]
    TooSlow(u64),
    /// Ended by signal `sig`; `what`: the likely cause, in parentheses after a space, or empty.
    #[error("its process ended by signal {sig}{what}")]
    Signal { sig: i32, what: &'static str },
    #[error("its process exited with status {0}")]
    Status(i32),
    #[error("reading its output: {0}")]
    Output(#[source] io::Error),
    #[error("its output is larger than {MAX_OUTPUT} bytes")]
    TooLarge,
    #[error("its output is not a page")]
    NotAPage,
}

pub fn spawn(
    root: &Path,
    source: &str,
    leave_out: &HashSet<String>,
    run_as: RunAs,
    wall: Duration,
) -> Result<Running, ChildError> {
    if stopped() {
        return Err(ChildError::Stopped);
    }
    if root.is_relative() {
        return Err(ChildError::Relative(root.to_owned()));
    }
    let exe = std::env::current_exe().map_err(ChildError::NoProgram)?;
    let mut cmd = Command::new(exe);
    cmd.arg(SUBCOMMAND).arg(root).arg(source);
    cmd.env_clear().current_dir("/").process_group(0);
    if cfg!(debug_assertions)
        && let Some(v) = std::env::var_os(TEST_VAR)
    {
        cmd.env(TEST_VAR, v);
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
    if let Some((uid, gid)) = run_as {
        // std calls setgroups(0), setgid, setuid in this order before the hook below.
        cmd.uid(uid).gid(gid);
    }
    // Whole seconds, at least one, a second more than the wall bound: the wall bound is
    // the one that is meant to act; this one holds even if this process is gone.
    let cpu = wall.as_secs().saturating_add(2);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the hook runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, getppid, setrlimit, _exit) on values copied
    // before the fork.
    unsafe {
        cmd.pre_exec(move || {
            // After the uid change, which would clear it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            for (res, lim) in [
                (libc::RLIMIT_AS, ADDRESS_SPACE),
                (libc::RLIMIT_CPU, cpu),
                (libc::RLIMIT_CORE, 0),
                (libc::RLIMIT_FSIZE, 0),
            ] {
                let l = libc::rlimit { rlim_cur: lim, rlim_max: lim };
                if libc::setrlimit(res, &l) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    crate::process::signals::unblock_in_child(&mut cmd);
    let mut child = {
        // Registered before the child can be reaped by anyone but `wait` below.
        let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        let child = cmd.spawn().map_err(ChildError::Start)?;
        *running = Some(child.id() as libc::pid_t);
        child
    };
    // The list goes in from a thread of its own: a child that does not read cannot block
    // this one.
    let names: Vec<u8> = leave_out.iter().flat_map(|n| n.bytes().chain([b'\n'])).collect();
    if let Some(mut stdin) = child.stdin.take() {
        let _ = std::thread::Builder::new().name("trainprof-page-in".into()).spawn(move || {
            let _ = stdin.write_all(&names);
        });
    }
    let (tx, output) = mpsc::sync_channel(1);
    if let Some(stdout) = child.stdout.take() {
        let spawned = std::thread::Builder::new().name("trainprof-page-out".into()).spawn(move || {
            let mut buf = Vec::new();
            // One byte past the bound tells that it was passed; then the pipe is closed.
            let read = stdout.take(MAX_OUTPUT as u64 + 1).read_to_end(&mut buf);
            let _ = tx.send(read.map(|n| {
                let over = n > MAX_OUTPUT;
                buf.truncate(MAX_OUTPUT);
                (buf, over)
            }));
        });
        if let Err(e) = spawned {
            let running = Running { child, output, wall, until: Instant::now() };
            running.kill();
            return Err(ChildError::Thread(e));
        }
    }
    Ok(Running { child, output, wall, until: Instant::now() + wall })
}

impl Running {
    /// Waits for the page until the wall bound, or `until` if sooner.
    pub fn wait(mut self, until: Option<Instant>) -> Result<Made, ChildError> {
        let until = until.map_or(self.until, |u| u.min(self.until));
        let bound = |r: &Running| ChildError::TooSlow(r.wall.as_secs());
        // Exited (not reaped yet), or the bound or a stop came first.
        loop {
            if stopped() {
                self.kill();
                return Err(ChildError::Killed);
            }
            match exited(self.child.id()) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    self.kill();
                    return Err(ChildError::LostTrack(e));
                }
            }
            if Instant::now() >= until {
                let why = bound(&self);
                self.kill();
                return Err(why);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Whatever it left in its group goes with it; then it is reaped.
        let status = self.reap();
        let status = match status {
            Ok(s) => s,
            Err(e) => return Err(ChildError::LostTrack(e)),
        };
        if let Some(sig) = status.signal() {
            let what = match sig {
                libc::SIGABRT => " (an allocation above its memory limit, or an internal error)",
                libc::SIGXCPU => " (its CPU-time limit)",
                libc::SIGKILL => " (killed)",
                _ => "",
            };
            return Err(ChildError::Signal { sig, what });
        }
        if !status.success() {
            return Err(ChildError::Status(status.code().unwrap_or(-1)));
        }
        let left = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let (bytes, over) = match self.output.recv_timeout(left) {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => return Err(ChildError::Output(e)),
            Err(_) => return Err(bound(&self)),
        };
        if over {
            return Err(ChildError::TooLarge);
        }
        parse_output(&bytes)
    }

    /// Kills the child's group and reaps it.
    fn kill(mut self) {
        let _ = self.reap();
    }

    /// Kills what is left of the child's group (the leader is unreaped until then, so the
    /// group is the child's), then reaps it.
    fn reap(&mut self) -> io::Result<std::process::ExitStatus> {
        {
            let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
            // SAFETY: kill has no memory-safety preconditions; see above.
            unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
            *running = None;
        }
        self.child.wait()
    }
}

/// Whether the process `pid` (a child) has exited, without reaping it.
fn exited(pid: u32) -> io::Result<bool> {
    // SAFETY: waitid writes into the zeroed siginfo we own.
    let (rc, got) = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        (rc, info.si_pid())
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(got != 0)
}

/// The child's output: a JSON line, then the page.
fn parse_output(bytes: &[u8]) -> Result<Made, ChildError> {
    let garbage = || ChildError::NotAPage;
    let end = bytes.iter().position(|&b| b == b'\n').ok_or_else(garbage)?;
    let head: serde_json::Value = serde_json::from_slice(&bytes[..end]).map_err(|_| garbage())?;
    if let Some(e) = head.get("error").and_then(|e| e.as_str()) {
        return Ok(Made { lines: Vec::new(), page: Vec::new(), error: Some(clean(e)) });
    }
    let lines: Vec<String> = head
        .get("lines")
        .and_then(|l| l.as_array())
        .ok_or_else(garbage)?
        .iter()
        .filter_map(|l| l.as_str())
        .take(MAX_LINES)
        .map(clean)
        .collect();
    let page = bytes[end + 1..].to_vec();
    if !page.starts_with(b"<!DOCTYPE html>") {
        return Err(garbage());
    }
    Ok(Made { lines, page, error: None })
}

/// Summary lines taken from the child (one per rule at most).
const MAX_LINES: usize = 32;

/// `text` without control characters, at most 1000 characters.
fn clean(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(1000).collect()
}

/// `trainprof page-child ROOT SOURCE`: the report of `ROOT`, leaving out the files named on
/// stdin (one a line), written to stdout as [`Running::wait`] reads it. Exit status 0
/// unless the output could not be written.
pub fn child_main(root: &Path, source: &str) -> ExitCode {
    if cfg!(debug_assertions)
        && let Some(code) = misbehave()
    {
        return code;
    }
    let mut names = String::new();
    let _ = io::stdin().take(MAX_OUTPUT as u64).read_to_string(&mut names);
    let leave_out = names.lines().map(str::to_owned).collect();
    let opts = trainprof_report::Options { leave_out, ..Default::default() };
    let (head, page) = match trainprof_report::build(root, source, &opts) {
        Ok(model) => (
            serde_json::json!({ "lines": super::triggered_lines(&model) }),
            trainprof_report::page::render(&model),
        ),
        Err(e) => (serde_json::json!({ "error": e.to_string() }), String::new()),
    };
    let mut out = io::stdout().lock();
    let written =
        writeln!(out, "{head}").and_then(|()| out.write_all(page.as_bytes())).and_then(|()| out.flush());
    if written.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

/// The misbehaviour [`TEST_VAR`] asks for.
fn misbehave() -> Option<ExitCode> {
    let how = std::env::var(TEST_VAR).ok()?;
    let mut out = io::stdout().lock();
    match how.as_str() {
        "abort" => std::process::abort(),
        "hang" => loop {
            std::hint::spin_loop();
        },
        "oom" => loop {
            // Address space only: the limit ends it without touching the memory.
            let v = Vec::<u8>::with_capacity(256 << 20);
            std::hint::black_box(v.as_ptr());
            std::mem::forget(v);
        },
        "garbage" => {
            let _ = out.write_all(b"\x1b]0;owned\x07{not json\n<html>");
            Some(ExitCode::SUCCESS)
        }
        "flood" => {
            let _ = writeln!(out, "{{\"lines\": []}}");
            let chunk = vec![b'x'; 1 << 20];
            while out.write_all(&chunk).is_ok() {}
            Some(ExitCode::SUCCESS)
        }
        "limits" => {
            let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
            let mut lines: Vec<String> = limits
                .lines()
                .filter(|l| {
                    ["Max cpu time", "Max address space", "Max core", "Max file size"]
                        .iter()
                        .any(|k| l.starts_with(k))
                })
                .map(|l| format!("child limit: {}", l.split_whitespace().collect::<Vec<_>>().join(" ")))
                .collect();
            // SAFETY: these calls have no preconditions.
            let (uid, gid, groups) =
                unsafe { (libc::getuid(), libc::getgid(), libc::getgroups(0, std::ptr::null_mut())) };
            lines.push(format!("child ids: uid {uid} gid {gid} groups {groups}"));
            lines.push(format!("child env: {}", std::env::vars_os().count()));
            let _ = writeln!(out, "{}", serde_json::json!({ "lines": lines }));
            let _ = out.write_all(b"<!DOCTYPE html><html></html>");
            Some(ExitCode::SUCCESS)
        }
        _ => None,
    }
}
