//! The trainer's process tree (for `trainprof run`) and the agent itself.
//!
//! The tree is rediscovered rarely (every [`REDISCOVER`]) by one scan of `/proc/*/stat`
//! for parent pids; between scans each known process is read through its own open
//! `/proc/<pid>/stat`, which fails once the process is gone (so a reused pid is never
//! confused with the old process), for at most [`MAX_OPEN`] processes; the others are
//! read by open, read, close each tick and recognised by their start time. A process is
//! counted from its second reading: CPU time spent by a child that lives less than one
//! rediscovery period is not seen. Running out of file descriptors (EMFILE, ENFILE) is
//! counted as failed reads and logged once with the limit.
//!
//! Type `trainer`, Dimension `ProcessTree`, Names `CPUPercent` (100 = one core busy),
//! `RSSBytes`, `Processes`. The agent's own use is Type `agent`, Dimension `Self`, Names
//! `CPUPercent`, `CPUMicrosPerTick`, `RSSBytes`, written at most every 10 s.

use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Metrics, Name, ProcFile, SampleError, Sampler, fields, parse_u64};

/// How often the tree is rescanned.
pub const REDISCOVER: Duration = Duration::from_secs(2);

/// The most `/proc/<pid>/stat` files kept open: a tree of thousands of processes (data
/// loader workers, ranks) must not use up the descriptors that sealing and uploading need.
pub const MAX_OPEN: usize = 256;

/// Whether `e` says the process (EMFILE) or the system (ENFILE) is out of file descriptors.
pub fn out_of_fds(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// The soft limit on this process's open files (`ulimit -n`), for messages.
pub fn nofile_limit() -> Option<u64> {
    // SAFETY: getrlimit writes into the struct we own.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        (libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0).then_some(lim.rlim_cur as u64)
    }
}

/// What one `/proc/<pid>/stat` line says that matters here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidStat {
    pub ppid: u32,
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
    /// Resident pages.
    pub rss_pages: u64,
    /// When the process started, in clock ticks since boot: with the pid, its identity.
    pub start_ticks: u64,
}

/// Parses `/proc/<pid>/stat`. The command name is in parentheses and may itself contain
/// spaces and parentheses, so fields are counted after the *last* `)`.
pub fn parse_pid_stat(text: &[u8]) -> Option<PidStat> {
    let close = text.iter().rposition(|&b| b == b')')?;
    // After ")": state(3) ppid(4) pgrp session tty tpgid flags minflt cminflt majflt
    // cmajflt utime(14) stime(15) cutime cstime priority nice threads itrealvalue
    // starttime(22) vsize(23) rss(24)
    let mut f = fields(&text[close + 1..]);
    let ppid = u32::try_from(parse_u64(f.nth(1)?)?).ok()?;
    let utime = parse_u64(f.nth(9)?)?;
    let stime = parse_u64(f.next()?)?;
    let start_ticks = parse_u64(f.nth(6)?)?;
    let rss = f.nth(1)?;
    // rss is signed in the kernel's format; a negative value reads as 0.
    let rss_pages = parse_u64(rss).unwrap_or(0);
    Some(PidStat { ppid, cpu_ticks: utime.saturating_add(stime), rss_pages, start_ticks })
}

/// The pids under `root` (itself included) given (pid, ppid) pairs.
pub fn descendants(root: u32, pairs: &[(u32, u32)]) -> Vec<u32> {
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(pairs.iter().filter(|&&(pid, ppid)| ppid == parent && pid != root).map(|&(pid, _)| pid));
        i += 1;
    }
    tree.sort_unstable();
    tree.dedup();
    tree
}

fn sysconf(name: libc::c_int, fallback: u64) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(name) };
    u64::try_from(v).ok().filter(|&v| v > 0).unwrap_or(fallback)
}

/// Clock ticks per second (`USER_HZ`).
pub fn clock_ticks() -> u64 {
    sysconf(libc::_SC_CLK_TCK, 100)
}

/// Bytes per page.
pub fn page_size() -> u64 {
    sysconf(libc::_SC_PAGESIZE, 4096)
}

#[derive(Debug)]
struct Known {
    pid: u32,
    /// Kept open for at most [`MAX_OPEN`] processes; the others are opened each tick.
    file: Option<ProcFile>,
    /// `None` until the first reading.
    ticks: Option<u64>,
    /// From the first reading; a later one with another start is another process.
    start: Option<u64>,
}

/// The process-tree sampler.
#[derive(Debug)]
pub struct TreeSampler {
    proc: PathBuf,
    root: u32,
    known: Vec<Known>,
    last_scan: Option<Duration>,
    prev_at: Duration,
    pairs: Vec<(u32, u32)>,
    hz: f64,
    page: u64,
    /// For the processes read without a kept file.
    buf: Vec<u8>,
    /// Reads that failed for want of file descriptors.
    fd_failures: u64,
    /// That has been logged.
    fd_logged: bool,
}

impl TreeSampler {
    pub fn new(proc: &Path, root: u32, now: Duration) -> TreeSampler {
        let mut s = TreeSampler {
            proc: proc.to_owned(),
            root,
            known: Vec::new(),
            last_scan: None,
            prev_at: now,
            pairs: Vec::new(),
            hz: clock_ticks() as f64,
            page: page_size(),
            buf: Vec::with_capacity(1024),
            fd_failures: 0,
            fd_logged: false,
        };
        s.rediscover(now);
        let _ = s.read_all();
        s
    }

    /// Counts a read that failed for want of descriptors; the first is logged.
    fn out_of_fds(&mut self, path: &Path, e: &io::Error) {
        self.fd_failures += 1;
        if !std::mem::replace(&mut self.fd_logged, true) {
            let limit = nofile_limit().map_or_else(|| "unknown".to_owned(), |n| n.to_string());
            crate::log!(
                "trainer sampler: too many open files (open-file limit {limit}) reading {}: {e}; \
                 such reads are counted as failed reads",
                path.display()
            );
        }
    }

    fn rediscover(&mut self, now: Duration) {
        self.last_scan = Some(now);
        self.pairs.clear();
        let dir = match std::fs::read_dir(&self.proc) {
            Ok(d) => d,
            Err(e) => {
                if out_of_fds(&e) {
                    let proc = self.proc.clone();
                    self.out_of_fds(&proc, &e);
                }
                return;
            }
        };
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let path = entry.path().join("stat");
            match std::fs::read(&path) {
                Ok(text) => {
                    if let Some(st) = parse_pid_stat(&text) {
                        self.pairs.push((pid, st.ppid));
                    }
                }
                Err(e) if out_of_fds(&e) => self.out_of_fds(&path, &e),
                Err(_) => {}
            }
        }
        let tree = descendants(self.root, &self.pairs);
        self.known.retain(|k| tree.binary_search(&k.pid).is_ok());
        let mut open = self.known.iter().filter(|k| k.file.is_some()).count();
        // The root first, so that it has a kept file whatever the tree's size.
        let root = self.root;
        let order = std::iter::once(root).chain(tree.iter().copied().filter(|&p| p != root));
        for pid in order {
            if tree.binary_search(&pid).is_err() {
                continue;
            }
            let at = self.known.iter().position(|k| k.pid == pid);
            if at.is_some_and(|i| self.known[i].file.is_some()) {
                continue;
            }
            let file = if open < MAX_OPEN {
                match ProcFile::open(self.proc.join(pid.to_string()).join("stat")) {
                    Ok(f) => Some(f),
                    Err(SampleError::Io { path, source }) if out_of_fds(&source) => {
                        self.out_of_fds(&path, &source);
                        None
                    }
                    // Gone already.
                    Err(_) if at.is_none() => continue,
                    Err(_) => None,
                }
            } else {
                None
            };
            open += usize::from(file.is_some());
            match at {
                // A kept file for a process read by path so far: its start is checked at
                // the next reading, as a new pid's would be.
                Some(i) => self.known[i].file = file,
                None => self.known.push(Known { pid, file, ticks: None, start: None }),
            }
        }
    }

    /// Reads every known process; returns (CPU ticks since the last reading, RSS pages),
    /// and forgets the processes that are gone.
    fn read_all(&mut self) -> (u64, u64) {
        let (mut ticks, mut rss) = (0u64, 0u64);
        let mut failed: Option<(PathBuf, io::Error)> = None;
        let mut failures = 0u64;
        let proc = &self.proc;
        let buf = &mut self.buf;
        self.known.retain_mut(|k| {
            let text = match &mut k.file {
                Some(f) => f.read().map_err(|e| match e {
                    SampleError::Io { path, source } => (path, source),
                    // ProcFile::read fails with Io only.
                    other => (PathBuf::new(), io::Error::other(other.to_string())),
                }),
                None => read_stat(proc, k.pid, buf).map(|()| &buf[..]),
            };
            let st = match text {
                Ok(t) => parse_pid_stat(t),
                Err((path, e)) if out_of_fds(&e) => {
                    // Not gone: unread this tick.
                    failures += 1;
                    failed.get_or_insert((path, e));
                    return true;
                }
                Err(_) => None,
            };
            let Some(st) = st else { return false };
            if *k.start.get_or_insert(st.start_ticks) != st.start_ticks {
                // The pid now belongs to another process.
                return false;
            }
            if let Some(prev) = k.ticks {
                ticks = ticks.saturating_add(st.cpu_ticks.saturating_sub(prev));
            }
            k.ticks = Some(st.cpu_ticks);
            rss = rss.saturating_add(st.rss_pages);
            true
        });
        if let Some((path, e)) = failed {
            self.out_of_fds(&path, &e);
            self.fd_failures += failures - 1;
        }
        (ticks, rss)
    }

    /// How many `/proc/<pid>/stat` files it keeps open now.
    pub fn open_files(&self) -> usize {
        self.known.iter().filter(|k| k.file.is_some()).count()
    }

    /// How many processes it follows now.
    pub fn processes(&self) -> usize {
        self.known.len()
    }
}

impl Sampler for TreeSampler {
    fn name(&self) -> &'static str {
        "trainer"
    }

    fn failures(&self) -> u64 {
        self.fd_failures
    }

    fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        if self.last_scan.is_none_or(|t| now.saturating_sub(t) >= REDISCOVER) {
            self.rediscover(now);
        }
        let (ticks, rss_pages) = self.read_all();
        let secs = now.saturating_sub(self.prev_at).as_secs_f64();
        self.prev_at = now;
        if self.known.is_empty() {
            return Ok(());
        }
        let cpu = if secs > 0.0 { ticks as f64 / self.hz / secs * 100.0 } else { f64::NAN };
        out.push(crate::sample::TRAINER, Name::Static("CPUPercent"), "ProcessTree", cpu);
        out.push(
            crate::sample::TRAINER,
            Name::Static("RSSBytes"),
            "ProcessTree",
            rss_pages.saturating_mul(self.page) as f64,
        );
        out.push(crate::sample::TRAINER, Name::Static("Processes"), "ProcessTree", self.known.len() as f64);
        Ok(())
    }
}

/// Reads `/proc/<pid>/stat` into `buf` by open, read, close.
fn read_stat(proc: &Path, pid: u32, buf: &mut Vec<u8>) -> Result<(), (PathBuf, io::Error)> {
    let path = proc.join(pid.to_string()).join("stat");
    buf.clear();
    match std::fs::File::open(&path).and_then(|mut f| f.read_to_end(buf)) {
        Ok(_) => Ok(()),
        Err(e) => Err((path, e)),
    }
}

/// The agent's own CPU time (user + system, µs) and current RSS (bytes).
pub fn self_usage() -> (u64, u64) {
    let cpu_us = cpu_us(libc::RUSAGE_SELF);
    let rss = std::fs::read("/proc/self/statm")
        .ok()
        .and_then(|t| fields(&t).nth(1).and_then(parse_u64))
        .map_or(0, |pages| pages.saturating_mul(page_size()));
    (cpu_us, rss)
}

/// The calling thread's CPU time (user + system, µs): the sampling loop's own cost,
/// without the uploader's.
pub fn thread_cpu_us() -> u64 {
    cpu_us(libc::RUSAGE_THREAD)
}

fn cpu_us(who: libc::c_int) -> u64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(who, &mut ru) == 0 {
            let us = |tv: libc::timeval| {
                (tv.tv_sec as u64).saturating_mul(1_000_000).saturating_add(tv.tv_usec as u64)
            };
            us(ru.ru_utime) + us(ru.ru_stime)
        } else {
            0
        }
    }
}

/// The agent's own cost, at most every `every`.
#[derive(Debug)]
pub struct SelfSampler {
    every: Duration,
    prev_at: Duration,
    prev_cpu_us: u64,
    ticks: u64,
}

impl SelfSampler {
    pub fn new(every: Duration, now: Duration) -> SelfSampler {
        SelfSampler { every, prev_at: now, prev_cpu_us: self_usage().0, ticks: 0 }
    }
}

impl Sampler for SelfSampler {
    fn name(&self) -> &'static str {
        "agent"
    }

    fn sample(&mut self, now: Duration, out: &mut Metrics) -> Result<(), SampleError> {
        self.ticks += 1;
        let dt = now.saturating_sub(self.prev_at);
        if dt < self.every {
            return Ok(());
        }
        let (cpu_us, rss) = self_usage();
        let used = cpu_us.saturating_sub(self.prev_cpu_us) as f64;
        out.push(crate::sample::AGENT, Name::Static("CPUPercent"), "Self", used / dt.as_secs_f64() / 1e4);
        out.push(crate::sample::AGENT, Name::Static("CPUMicrosPerTick"), "Self", used / self.ticks as f64);
        out.push(crate::sample::AGENT, Name::Static("RSSBytes"), "Self", rss as f64);
        (self.prev_at, self.prev_cpu_us, self.ticks) = (now, cpu_us, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, comm: &str, ppid: u32, utime: u64, stime: u64, rss: i64) -> String {
        format!(
            "{pid} ({comm}) S {ppid} 1 1 0 -1 4194304 100 0 0 0 {utime} {stime} 0 0 20 0 1 0 541020 3133440 {rss} \
18446744073709551615 1 2 3 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
        )
    }

    #[test]
    fn parses_stat_with_awkward_names() {
        let s = stat(7, "py (worker) 1", 3, 250, 50, 1000);
        assert_eq!(
            parse_pid_stat(s.as_bytes()),
            Some(PidStat { ppid: 3, cpu_ticks: 300, rss_pages: 1000, start_ticks: 541020 })
        );
        let real = b"9303 (cat) R 9295 9295 5465 0 -1 4194304 100 0 0 0 3 4 0 0 20 0 1 0 541020 3133440 383 18446744073709551615 94560746942464 0";
        assert_eq!(
            parse_pid_stat(real),
            Some(PidStat { ppid: 9295, cpu_ticks: 7, rss_pages: 383, start_ticks: 541020 })
        );
        assert_eq!(parse_pid_stat(b"12 (x) S"), None);
        assert_eq!(parse_pid_stat(b"no parens"), None);
    }

    #[test]
    fn tree_from_pairs() {
        let pairs = [(1, 0), (10, 1), (11, 10), (12, 11), (13, 1), (14, 10)];
        assert_eq!(descendants(10, &pairs), vec![10, 11, 12, 14]);
        assert_eq!(descendants(99, &pairs), vec![99]);
    }

    #[test]
    fn follows_the_tree_and_forgets_the_dead() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path().to_path_buf();
        let put = |pid: u32, ppid: u32, ticks: u64, rss: i64| {
            std::fs::create_dir_all(proc.join(pid.to_string())).unwrap();
            std::fs::write(proc.join(format!("{pid}/stat")), stat(pid, "python", ppid, ticks, 0, rss))
                .unwrap();
        };
        put(1, 0, 0, 0);
        put(100, 1, 1000, 10);
        put(101, 100, 500, 20);
        put(200, 1, 9999, 99);
        let mut s = TreeSampler::new(&proc, 100, Duration::ZERO);
        assert_eq!(s.processes(), 2);
        let hz = clock_ticks();
        put(100, 1, 1000 + hz, 10);
        put(101, 100, 500 + hz / 2, 30);
        put(200, 1, 99_999, 99);
        let mut m = Metrics::new();
        s.sample(Duration::from_secs(1), &mut m).unwrap();
        assert_eq!(m.get("trainer", "CPUPercent", "ProcessTree"), Some(150.0));
        assert_eq!(m.get("trainer", "RSSBytes", "ProcessTree"), Some((40 * page_size()) as f64));
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(2.0));
        // A child appears (seen at the next rescan, counted from its second reading);
        // 101 exits.
        put(102, 101, 5000, 5);
        std::fs::remove_dir_all(proc.join("101")).unwrap();
        m.clear();
        s.sample(Duration::from_secs(3), &mut m).unwrap();
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(1.0));
        // 102's parent is gone: it is no longer under 100 (re-parented in real life).
        assert_eq!(m.get("trainer", "CPUPercent", "ProcessTree"), Some(0.0));
    }

    #[test]
    fn a_large_tree_keeps_a_bounded_number_of_files_open() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tmp.path().to_path_buf();
        let put = |pid: u32, ppid: u32, ticks: u64, start: u64| {
            std::fs::create_dir_all(proc.join(pid.to_string())).unwrap();
            let text = stat(pid, "python", ppid, ticks, 0, 1).replace(" 541020 ", &format!(" {start} "));
            std::fs::write(proc.join(format!("{pid}/stat")), text).unwrap();
        };
        let n = MAX_OPEN as u32 + 100;
        // The root has the highest pid: it still gets a kept file.
        let root = 10_000;
        put(root, 1, 0, 5);
        for pid in 1000..1000 + n {
            put(pid, root, 0, 5);
        }
        let mut s = TreeSampler::new(&proc, root, Duration::ZERO);
        assert_eq!(s.processes(), n as usize + 1);
        assert_eq!(s.open_files(), MAX_OPEN);
        assert!(s.known.iter().any(|k| k.pid == root && k.file.is_some()));
        // Every process is read, kept file or not.
        for pid in 1000..1000 + n {
            put(pid, root, 10, 5);
        }
        let mut m = Metrics::new();
        s.sample(Duration::from_secs(1), &mut m).unwrap();
        let hz = clock_ticks() as f64;
        assert_eq!(m.get("trainer", "CPUPercent", "ProcessTree"), Some(f64::from(n) * 10.0 / hz * 100.0));
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(f64::from(n) + 1.0));
        // A pid read by path that now belongs to a process started later is forgotten;
        // the same for one with a kept file (its file is still the old process's).
        put(1000 + n - 1, root, 0, 6);
        m.clear();
        s.sample(Duration::from_secs(1) + Duration::from_millis(100), &mut m).unwrap();
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(f64::from(n)));
        assert_eq!(s.failures(), 0);
        // Kept files freed by processes that are gone go to those read by path.
        for pid in 1000..1050 {
            std::fs::remove_dir_all(proc.join(pid.to_string())).unwrap();
        }
        m.clear();
        s.sample(Duration::from_secs(4), &mut m).unwrap();
        // (The reused pid is found again by the rescan, as the new process it is.)
        assert_eq!(s.processes(), n as usize + 1 - 50);
        assert_eq!(s.open_files(), MAX_OPEN);
    }

    #[test]
    fn the_agent_measures_itself_at_most_every_period() {
        let mut s = SelfSampler::new(Duration::from_secs(10), Duration::ZERO);
        let mut m = Metrics::new();
        s.sample(Duration::from_secs(5), &mut m).unwrap();
        assert!(m.is_empty());
        s.sample(Duration::from_secs(10), &mut m).unwrap();
        assert!(m.get("agent", "RSSBytes", "Self").unwrap() > 0.0);
        assert!(m.get("agent", "CPUPercent", "Self").unwrap() >= 0.0);
    }
}
