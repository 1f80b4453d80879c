//! The trainer's process tree (for `trainprof run`) and the agent itself.
//!
//! `docs/formats.md`, "The trainer tree", says what each row means and why; in short:
//!
//! * **Finding the tree.** One scan of `/proc/*/stat` for parent pids at the start. After
//!   it, new processes are found from the kernel's last allocated pid (the fifth field of
//!   `/proc/loadavg`): the pids allocated since the last tick are read one by one and those
//!   whose parent is in the tree (and that lead a thread group) join it, born during the
//!   interval, so all their CPU time counts. The whole of `/proc` is scanned again only
//!   when that range is too wide or has wrapped, and every [`RESCAN`] as a safety net
//!   ([`REDISCOVER`] where `/proc/loadavg` cannot be read, as on a fake tree).
//! * **Reading it.** Each known process is read through its own open `/proc/<pid>/stat`,
//!   which fails once the process is gone (so a reused pid is never confused with the old
//!   process), for at most [`MAX_OPEN`] processes; the others are read by open, read, close
//!   each tick and recognised by their start time. Running out of file descriptors
//!   (EMFILE, ENFILE) is counted as failed reads and logged once with the limit.
//! * **CPU** is each process's own time plus the growth of the time of the children it
//!   waited for (`cutime` + `cstime`): a child that lived and died between two ticks is
//!   counted when its parent reaps it. What the tree already counted for a child that it
//!   followed is credited back from its parent's next growth, so nothing counts twice.
//! * **Memory** is PSS (`/proc/<pid>/smaps_rollup`), which shares each page among the
//!   processes that map it, beside the summed RSS. `smaps_rollup` walks the process's page
//!   tables (about 10 µs per MiB resident), so PSS is refreshed in passes over the tree at
//!   least [`PSS_EVERY`] apart, a new process is read when first seen, and every read is
//!   paced so that PSS takes at most [`PSS_BUDGET_PERCENT`] % of one core over time.
//!   Between reads, nothing may overcount (a fork storm of 20 children sharing 300 MiB
//!   copy-on-write summed their RSS to 3 GiB): a process read before others were born into
//!   the tree counts its last PSS divided by one plus those born since that are still
//!   there (each newcomer can share a page once more at most), and is read again first
//!   when a child of its own waits for its first read; a process not read yet counts what
//!   its nearest read ancestor counts (a fork child shares its parent's pages), its RSS
//!   only when it has none (the root before its first read). A zombie (exited, not yet
//!   reaped) counts nothing, and the parent of a child that exited or went is read again
//!   first: the pages they shared are the parent's alone now.
//!
//! Type `trainer`, Dimension `ProcessTree`, Names `CPUPercent` (100 = one core busy),
//! `PSSBytes`, `RSSBytes`, `Processes`; the busiest [`TOP`] processes by CPU as Names
//! `pid<pid>-<comm>` with Dimensions `ProcessCPUPercent` and `ProcessPSSBytes`. The agent's
//! own use is Type `agent`, Dimension `Self`, Names `CPUPercent`, `CPUMicrosPerTick`,
//! `RSSBytes`, written at most every 10 s.

use std::io::{self, Read as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::tree_pids::TreePids;
use super::{Label, Metrics, Name, ProcFile, SampleError, Sampler, fields, parse_u64};
use super::{dimension as d, name as n};

/// How often the whole of `/proc` is scanned when new pids cannot be followed.
pub const REDISCOVER: Duration = Duration::from_secs(2);

/// How often the whole of `/proc` is scanned anyway (a process that joined the tree in a
/// way the pid range misses, e.g. one re-parented to a subreaper in the tree).
pub const RESCAN: Duration = Duration::from_secs(30);

/// The widest range of new pids read one by one; a wider one means a full scan.
pub const MAX_NEW_PIDS: u32 = 2048;

/// The most `/proc/<pid>/stat` files kept open: a tree of thousands of processes (data
/// loader workers, ranks) must not use up the descriptors that sealing and uploading need.
pub const MAX_OPEN: usize = 256;

/// How many of the busiest processes get rows of their own.
pub const TOP: usize = 5;

/// PSS passes start at most this often.
pub const PSS_EVERY: Duration = Duration::from_secs(5);

/// PSS reading uses at most this share of one core over time.
pub const PSS_BUDGET_PERCENT: u64 = 1;

/// CPU time one tick may spend on `smaps_rollup` before the rest waits for the next tick.
const PSS_PER_TICK_US: u64 = 2_000;

/// How many ticks a parent keeps the credit of a child that went (its `cutime` may grow a
/// tick after the child's `stat` is gone).
const CREDIT_TICKS: u8 = 2;

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
    /// cutime + cstime: the time of the children it waited for, in clock ticks.
    pub children_ticks: u64,
    /// Resident pages.
    pub rss_pages: u64,
    /// When the process started, in clock ticks since boot: with the pid, its identity.
    pub start_ticks: u64,
    /// State `Z` (zombie) or `X` (dead): it exited and holds no memory, though its parent
    /// has not reaped it yet.
    pub exited: bool,
}

/// The command name of a `/proc/<pid>/stat` line (between the first `(` and the last `)`).
pub fn stat_comm(text: &[u8]) -> &[u8] {
    let open = text.iter().position(|&b| b == b'(');
    let close = text.iter().rposition(|&b| b == b')');
    match (open, close) {
        (Some(o), Some(c)) if o < c => &text[o + 1..c],
        _ => b"",
    }
}

/// Parses `/proc/<pid>/stat`. The command name is in parentheses and may itself contain
/// spaces and parentheses, so fields are counted after the *last* `)`.
pub fn parse_pid_stat(text: &[u8]) -> Option<PidStat> {
    let close = text.iter().rposition(|&b| b == b')')?;
    // After ")": state(3) ppid(4) pgrp session tty tpgid flags minflt cminflt majflt
    // cmajflt utime(14) stime(15) cutime(16) cstime(17) priority nice threads itrealvalue
    // starttime(22) vsize(23) rss(24)
    let mut f = fields(&text[close + 1..]);
    let exited = matches!(f.next()?, b"Z" | b"X");
    let ppid = u32::try_from(parse_u64(f.next()?)?).ok()?;
    let utime = parse_u64(f.nth(9)?)?;
    let stime = parse_u64(f.next()?)?;
    // cutime and cstime are signed in the kernel's format; a negative value reads as 0.
    let cutime = parse_u64(f.next()?).unwrap_or(0);
    let cstime = parse_u64(f.next()?).unwrap_or(0);
    let start_ticks = parse_u64(f.nth(4)?)?;
    let rss = f.nth(1)?;
    // rss is signed too.
    let rss_pages = parse_u64(rss).unwrap_or(0);
    Some(PidStat {
        ppid,
        cpu_ticks: utime.saturating_add(stime),
        children_ticks: cutime.saturating_add(cstime),
        rss_pages,
        start_ticks,
        exited,
    })
}

/// The `Pss:` of `/proc/<pid>/smaps_rollup`, in bytes.
pub fn parse_pss(text: &[u8]) -> Option<u64> {
    let line = text.split(|&b| b == b'\n').find(|l| l.starts_with(b"Pss:"))?;
    let mut f = fields(&line[4..]);
    let kb = parse_u64(f.next()?)?;
    (f.next()? == b"kB").then(|| kb.saturating_mul(1024))
}

/// The last pid the kernel allocated in this pid namespace: the fifth field of
/// `/proc/loadavg` (`0.50 0.40 0.30 2/345 12345`).
pub fn parse_last_pid(text: &[u8]) -> Option<u32> {
    fields(text).nth(4).and_then(parse_u64).and_then(|p| u32::try_from(p).ok())
}

/// The `Tgid:` of `/proc/<pid>/status`: a pid whose Tgid is another is a thread.
pub fn parse_tgid(text: &[u8]) -> Option<u32> {
    let line = text.split(|&b| b == b'\n').find(|l| l.starts_with(b"Tgid:"))?;
    fields(&line[5..]).next().and_then(parse_u64).and_then(|p| u32::try_from(p).ok())
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

/// What this tick's read of one process found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    Fresh(PidStat),
    /// Gone, or its pid now belongs to another process.
    Gone,
    /// Not read for want of file descriptors: kept as it was.
    Unread,
}

#[derive(Debug)]
struct Known {
    pid: u32,
    /// Kept open for at most [`MAX_OPEN`] processes; the others are opened each tick.
    file: Option<ProcFile>,
    /// From the first reading; a later one with another start is another process.
    start: Option<u64>,
    /// Own and reaped children's ticks at the last reading; `None` before the first.
    own: Option<u64>,
    reaped: Option<u64>,
    /// Own + reaped ticks at the baseline (the first reading, or 0 for a process born
    /// during an interval): what was counted for it is its last total less this.
    base: Option<u64>,
    ppid: u32,
    comm: Label,
    rss_pages: u64,
    pss: Option<u64>,
    /// Whether its `smaps_rollup` was read (or tried) once.
    pss_tried: bool,
    /// [`TreeSampler::births`] when it joined the tree (0: in the first scan).
    born: u64,
    /// [`TreeSampler::births`] when its PSS was last read, and last tried.
    pss_at: u64,
    pss_tried_at: u64,
    /// What it counts in `PSSBytes` this tick (see the module's doc).
    pss_counted: u64,
    /// Ticks of children that went, already counted, to take off this one's reaped growth.
    credit: u64,
    credit_age: u8,
    /// Ticks counted on this tick.
    delta: u64,
    reading: Reading,
    /// Not in `/proc` at the last scan.
    vanished: bool,
    /// A zombie at its last reading: it counts no memory (its last PSS would count pages
    /// it no longer maps, which the processes still alive now count whole).
    exited: bool,
    /// A child of it exited or went away since its last PSS read: the pages they shared
    /// are its alone now, so its PSS grew, and it is read again first.
    reread: bool,
}

impl Known {
    fn new(pid: u32, file: Option<ProcFile>) -> Known {
        Known {
            pid,
            file,
            start: None,
            own: None,
            reaped: None,
            base: None,
            ppid: 0,
            comm: Label::default(),
            rss_pages: 0,
            pss: None,
            pss_tried: false,
            born: 0,
            pss_at: 0,
            pss_tried_at: 0,
            pss_counted: 0,
            credit: 0,
            credit_age: 0,
            delta: 0,
            reading: Reading::Unread,
            vanished: false,
            exited: false,
            reread: false,
        }
    }

    /// A process found among the new pids: everything it used fell in this interval.
    fn born(pid: u32, st: &PidStat, comm: Label, births: u64) -> Known {
        let mut k = Known::new(pid, None);
        k.born = births;
        k.start = Some(st.start_ticks);
        k.own = Some(0);
        k.reaped = Some(0);
        k.base = Some(0);
        k.ppid = st.ppid;
        k.comm = comm;
        k
    }

    fn total(&self) -> Option<u64> {
        Some(self.own?.saturating_add(self.reaped?))
    }
}

/// Totals of one tick.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Totals {
    ticks: u64,
    rss_pages: u64,
    pss_bytes: u64,
}

/// Pacing of the PSS reads.
#[derive(Debug, Default)]
struct PssPace {
    /// No read before this: the budget for the last reads' cost.
    ready_at: Duration,
    /// The next pass starts no earlier than this.
    pass_at: Duration,
    in_pass: bool,
    /// Pids read in the pass under way.
    done: Vec<u32>,
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
    /// `/proc/loadavg`, for the last pid; `None` where it cannot be read.
    loadavg: Option<ProcFile>,
    last_pid: Option<u32>,
    pss: PssPace,
    /// The first scan is done: processes found later joined the tree since.
    scanned: bool,
    /// Processes that joined the tree after the first scan, counted from 1.
    births: u64,
    /// The `born` of the processes followed now, sorted (scratch).
    born_sorted: Vec<u64>,
    /// (pid, index in `known`), sorted (scratch).
    by_pid: Vec<(u32, usize)>,
    /// Where the tree's pids are published after each tick.
    published: TreePids,
    scratch: Vec<u32>,
    top: Vec<(u64, usize)>,
    /// Reads that failed for want of file descriptors.
    fd_failures: u64,
    /// That has been logged.
    fd_logged: bool,
}

impl TreeSampler {
    pub fn new(proc: &Path, root: u32, now: Duration, published: TreePids) -> TreeSampler {
        let loadavg = ProcFile::open(proc.join("loadavg")).ok();
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
            loadavg,
            last_pid: None,
            pss: PssPace::default(),
            scanned: false,
            births: 0,
            born_sorted: Vec::new(),
            by_pid: Vec::new(),
            published,
            scratch: Vec::new(),
            top: Vec::new(),
            fd_failures: 0,
            fd_logged: false,
        };
        s.last_pid = s.read_last_pid();
        s.rediscover(now);
        s.read_all();
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

    fn read_last_pid(&mut self) -> Option<u32> {
        let f = self.loadavg.as_mut()?;
        match f.read() {
            Ok(text) => parse_last_pid(text),
            Err(_) => None,
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
        let first = !std::mem::replace(&mut self.scanned, true);
        // A process that left the tree (re-parented outside it) is no longer followed; one
        // that is gone is left for `read_all` to see, so that its parent gets its credit.
        self.pairs.sort_unstable();
        let pairs = &self.pairs;
        let seen = |pid: u32| pairs.binary_search_by_key(&pid, |&(p, _)| p).is_ok();
        self.known.retain_mut(|k| {
            k.vanished = !seen(k.pid);
            if k.vanished {
                // Its descriptor goes to a process that has none.
                k.file = None;
            }
            k.vanished || tree.binary_search(&k.pid).is_ok()
        });
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
                None => {
                    let mut k = Known::new(pid, file);
                    // Not in the first scan: it joined the tree since.
                    if !first {
                        self.births += 1;
                        k.born = self.births;
                    }
                    self.known.push(k);
                }
            }
        }
    }

    /// Follows the pids allocated since the last tick; `false` when a full scan is needed
    /// instead (no last pid, a range too wide, or one that wrapped).
    fn follow_new_pids(&mut self) -> bool {
        let (Some(prev), Some(cur)) = (self.last_pid, self.read_last_pid()) else { return false };
        self.last_pid = Some(cur);
        if cur == prev {
            return true;
        }
        if cur < prev || cur - prev > MAX_NEW_PIDS {
            return false;
        }
        self.scratch.clear();
        self.scratch.extend(self.known.iter().map(|k| k.pid));
        self.scratch.sort_unstable();
        for pid in prev + 1..=cur {
            if read_file(&self.proc, pid, "stat", &mut self.buf).is_err() {
                continue;
            }
            let Some(st) = parse_pid_stat(&self.buf) else { continue };
            if self.scratch.binary_search(&st.ppid).is_err() || self.scratch.binary_search(&pid).is_ok() {
                continue;
            }
            let comm = Label::sanitized(stat_comm(&self.buf));
            // A new thread of a process in the tree shows that process's parent: only a
            // thread group's leader is a process.
            if read_file(&self.proc, pid, "status", &mut self.buf).is_err()
                || parse_tgid(&self.buf) != Some(pid)
            {
                continue;
            }
            self.births += 1;
            self.known.push(Known::born(pid, &st, comm, self.births));
            let at = self.scratch.partition_point(|&p| p < pid);
            self.scratch.insert(at, pid);
        }
        true
    }

    /// Reads every known process, counts its CPU since the last reading (crediting what
    /// children that went had already counted), and forgets the processes that are gone.
    fn read_all(&mut self) -> Totals {
        let mut failed: Option<(PathBuf, io::Error)> = None;
        let mut failures = 0u64;
        let proc = &self.proc;
        let buf = &mut self.buf;
        // Pass 1: read every process.
        for k in &mut self.known {
            if k.vanished {
                k.reading = Reading::Gone;
                continue;
            }
            let text = match &mut k.file {
                Some(f) => f.read().map_err(|e| match e {
                    SampleError::Io { path, source } => (path, source),
                    // ProcFile::read fails with Io only.
                    other => (PathBuf::new(), io::Error::other(other.to_string())),
                }),
                None => read_file(proc, k.pid, "stat", buf).map(|()| &buf[..]),
            };
            k.reading = match text {
                Ok(t) => match parse_pid_stat(t) {
                    Some(st) if *k.start.get_or_insert(st.start_ticks) == st.start_ticks => {
                        // Every reading: a process that exec'd has a new name.
                        k.comm = Label::sanitized(stat_comm(t));
                        Reading::Fresh(st)
                    }
                    // Unreadable, or the pid now belongs to another process.
                    _ => Reading::Gone,
                },
                Err((path, e)) if out_of_fds(&e) => {
                    failures += 1;
                    failed.get_or_insert((path, e));
                    Reading::Unread
                }
                Err(_) => Reading::Gone,
            };
        }
        if let Some((path, e)) = failed {
            self.out_of_fds(&path, &e);
            self.fd_failures += failures - 1;
        }
        // Pass 2: what a child that went had counted is its parent's credit: the parent's
        // reaped time grows by the child's whole time when it waits for it.
        for i in 0..self.known.len() {
            if self.known[i].reading != Reading::Gone {
                continue;
            }
            let (ppid, counted) = {
                let k = &self.known[i];
                (k.ppid, k.total().zip(k.base).map_or(0, |(t, b)| t.saturating_sub(b)))
            };
            if let Some(p) = self.known.iter_mut().find(|p| p.pid == ppid && p.reading != Reading::Gone) {
                p.credit = p.credit.saturating_add(counted);
                p.credit_age = 0;
                p.reread = true;
            }
        }
        self.known.retain(|k| k.reading != Reading::Gone);
        // Pass 3: count.
        let mut t = Totals::default();
        let mut exited_parents = Vec::new();
        for k in &mut self.known {
            k.delta = 0;
            if let Reading::Fresh(st) = k.reading {
                if let (Some(own), Some(reaped)) = (k.own, k.reaped) {
                    let grown = st.children_ticks.saturating_sub(reaped);
                    let credited = grown.min(k.credit);
                    k.credit -= credited;
                    k.delta = st.cpu_ticks.saturating_sub(own).saturating_add(grown - credited);
                }
                k.own = Some(st.cpu_ticks);
                k.reaped = Some(st.children_ticks);
                k.base.get_or_insert(st.cpu_ticks.saturating_add(st.children_ticks));
                k.ppid = st.ppid;
                k.rss_pages = st.rss_pages;
                if st.exited && !k.exited {
                    exited_parents.push(k.ppid);
                }
                k.exited = st.exited;
            }
            k.credit_age = k.credit_age.saturating_add(1);
            if k.credit_age > CREDIT_TICKS {
                k.credit = 0;
            }
            t.ticks = t.ticks.saturating_add(k.delta);
            t.rss_pages = t.rss_pages.saturating_add(k.rss_pages);
        }
        for ppid in exited_parents {
            if let Some(p) = self.known.iter_mut().find(|p| p.pid == ppid) {
                p.reread = true;
            }
        }
        self.count_pss();
        t.pss_bytes = self.known.iter().fold(0u64, |sum, k| sum.saturating_add(k.pss_counted));
        t
    }

    /// Sorts the `born` of the processes followed now into `born_sorted`.
    fn sort_births(&mut self) {
        self.born_sorted.clear();
        self.born_sorted.extend(self.known.iter().map(|k| k.born).filter(|&b| b > 0));
        self.born_sorted.sort_unstable();
        self.by_pid.clear();
        self.by_pid.extend(self.known.iter().enumerate().map(|(i, k)| (k.pid, i)));
        self.by_pid.sort_unstable();
    }

    /// The index of `pid` in `known` (after [`Self::sort_births`]).
    fn index_of(&self, pid: u32) -> Option<usize> {
        self.by_pid.binary_search_by_key(&pid, |&(p, _)| p).ok().map(|j| self.by_pid[j].1)
    }

    /// What each process counts in `PSSBytes` (the module's doc says why): a read
    /// process its last PSS divided by one plus the processes still here born after that
    /// read; one not read yet what its nearest read ancestor counts, else its RSS.
    fn count_pss(&mut self) {
        self.sort_births();
        let born = &self.born_sorted;
        for k in &mut self.known {
            k.pss_counted = match k.pss {
                _ if k.exited => 0,
                Some(pss) => {
                    let newer = born.len() - born.partition_point(|&b| b <= k.pss_at);
                    pss / (1 + newer as u64)
                }
                None => u64::MAX,
            };
        }
        for i in 0..self.known.len() {
            if self.known[i].pss_counted != u64::MAX {
                continue;
            }
            // The nearest read ancestor (a bounded walk: a tree deeper than this counts RSS).
            let mut at = i;
            let mut counted = None;
            for _ in 0..64 {
                let Some(p) = self.index_of(self.known[at].ppid).filter(|&p| p != at) else { break };
                if self.known[p].pss.is_some() {
                    counted = Some(self.known[p].pss_counted);
                    break;
                }
                at = p;
            }
            let page = self.page;
            let k = &mut self.known[i];
            k.pss_counted = counted.unwrap_or_else(|| k.rss_pages.saturating_mul(page));
        }
    }

    /// A read process whose child, born after that read, waits for its first read: the
    /// child counts what the parent counts, so the parent is read again first.
    fn stale_parent(&self) -> Option<usize> {
        self.known.iter().filter(|c| c.pss.is_none() && !c.pss_tried).find_map(|c| {
            let p = self.index_of(c.ppid)?;
            let parent = &self.known[p];
            (parent.pss.is_some() && parent.pss_tried_at < c.born).then_some(p)
        })
    }

    /// Reads `smaps_rollup` of the processes due: those never read first, then the rest
    /// of a pass under way; each read costs its CPU time × 100 / [`PSS_BUDGET_PERCENT`] of
    /// waiting before the next, so that over time PSS takes at most that share of a core.
    fn refresh_pss(&mut self, now: Duration) {
        if self.known.is_empty() || now < self.pss.ready_at {
            return;
        }
        if !self.pss.in_pass && now >= self.pss.pass_at {
            self.pss.in_pass = true;
            self.pss.pass_at = now + PSS_EVERY;
            self.pss.done.clear();
        }
        let tick_start = thread_cpu_us();
        self.sort_births();
        loop {
            let done = &self.pss.done;
            let next = self
                .stale_parent()
                .or_else(|| self.known.iter().position(|k| k.reread && !k.exited))
                .or_else(|| self.known.iter().position(|k| !k.pss_tried))
                .or_else(|| {
                    self.pss.in_pass.then(|| self.known.iter().position(|k| !done.contains(&k.pid))).flatten()
                });
            let Some(i) = next else {
                self.pss.in_pass = false;
                break;
            };
            let pid = self.known[i].pid;
            self.known[i].pss_tried = true;
            self.known[i].reread = false;
            self.known[i].pss_tried_at = self.births;
            if self.pss.in_pass {
                self.pss.done.push(pid);
            }
            match read_file(&self.proc, pid, "smaps_rollup", &mut self.buf) {
                Ok(()) => {
                    if let Some(pss) = parse_pss(&self.buf) {
                        self.known[i].pss = Some(pss);
                        self.known[i].pss_at = self.births;
                    }
                }
                Err((path, e)) if out_of_fds(&e) => self.out_of_fds(&path, &e),
                // Gone (noticed at the next stat read) or not allowed: a stand-in counts (`count_pss`).
                Err(_) => {}
            }
            if thread_cpu_us().saturating_sub(tick_start) >= PSS_PER_TICK_US {
                break;
            }
        }
        let spent = thread_cpu_us().saturating_sub(tick_start);
        self.pss.ready_at = now + Duration::from_micros(spent.saturating_mul(100 / PSS_BUDGET_PERCENT));
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
        let every = if self.loadavg.is_some() { RESCAN } else { REDISCOVER };
        if self.last_scan.is_none_or(|t| now.saturating_sub(t) >= every) {
            self.last_pid = self.read_last_pid();
            self.rediscover(now);
        } else if !self.follow_new_pids() {
            self.rediscover(now);
        }
        self.refresh_pss(now);
        let t = self.read_all();
        let secs = now.saturating_sub(self.prev_at).as_secs_f64();
        self.prev_at = now;
        self.scratch.clear();
        self.scratch.extend(self.known.iter().map(|k| k.pid));
        self.published.publish(&self.scratch);
        if self.known.is_empty() {
            return Ok(());
        }
        let percent = |ticks: u64| if secs > 0.0 { ticks as f64 / self.hz / secs * 100.0 } else { f64::NAN };
        let kind = crate::pipeline::sample::MetricType::Trainer;
        out.push(kind, Name::Static(n::CPU_PERCENT), d::PROCESS_TREE, percent(t.ticks));
        out.push(kind, Name::Static(n::PSS_BYTES), d::PROCESS_TREE, t.pss_bytes as f64);
        out.push(
            kind,
            Name::Static(n::RSS_BYTES),
            d::PROCESS_TREE,
            t.rss_pages.saturating_mul(self.page) as f64,
        );
        out.push(kind, Name::Static(n::PROCESSES), d::PROCESS_TREE, self.known.len() as f64);
        self.top.clear();
        self.top.extend(self.known.iter().enumerate().map(|(i, k)| (k.delta, i)));
        // The busiest first; among equals the lowest pid (the tree's root, the ranks).
        let known = &self.known;
        self.top.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(known[a.1].pid.cmp(&known[b.1].pid)));
        for &(ticks, i) in self.top.iter().take(TOP) {
            let k = &self.known[i];
            let name = Name::Process(k.pid, k.comm);
            out.push(kind, name, d::PROCESS_CPU_PERCENT, percent(ticks));
            out.push(kind, name, d::PROCESS_PSS_BYTES, k.pss_counted as f64);
        }
        Ok(())
    }
}

/// Reads `<proc>/<pid>/<file>` into `buf` by open, read, close.
fn read_file(proc: &Path, pid: u32, file: &str, buf: &mut Vec<u8>) -> Result<(), (PathBuf, io::Error)> {
    let mut path = proc.join(pid.to_string());
    path.push(file);
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

/// This thread's CPU time in ns from `CLOCK_THREAD_CPUTIME_ID` (exact, unlike
/// `getrusage`'s tick-sampled split): for measurements of a few µs (`agent/examples/`).
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
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
        out.push(
            crate::pipeline::sample::MetricType::Agent,
            Name::Static(n::CPU_PERCENT),
            d::SELF,
            used / dt.as_secs_f64() / 1e4,
        );
        out.push(
            crate::pipeline::sample::MetricType::Agent,
            Name::Static(n::CPU_MICROS_PER_TICK),
            d::SELF,
            used / self.ticks as f64,
        );
        out.push(crate::pipeline::sample::MetricType::Agent, Name::Static(n::RSS_BYTES), d::SELF, rss as f64);
        (self.prev_at, self.prev_cpu_us, self.ticks) = (now, cpu_us, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, comm: &str, ppid: u32, utime: u64, stime: u64, rss: i64) -> String {
        stat_c(pid, comm, ppid, utime, stime, 0, rss)
    }

    /// With `cutime` (reaped children's time) too.
    fn stat_c(pid: u32, comm: &str, ppid: u32, utime: u64, stime: u64, cutime: u64, rss: i64) -> String {
        format!(
            "{pid} ({comm}) S {ppid} 1 1 0 -1 4194304 100 0 0 0 {utime} {stime} {cutime} 0 20 0 1 0 541020 3133440 {rss} \
18446744073709551615 1 2 3 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n"
        )
    }

    /// A fake `/proc` in a temp dir.
    struct FakeProc {
        _dir: tempfile::TempDir,
        proc: PathBuf,
    }

    impl FakeProc {
        fn new() -> FakeProc {
            let dir = tempfile::tempdir().unwrap();
            let proc = dir.path().to_path_buf();
            FakeProc { _dir: dir, proc }
        }

        fn put(&self, pid: u32, comm: &str, ppid: u32, ticks: u64, cutime: u64, rss: i64) {
            std::fs::create_dir_all(self.proc.join(pid.to_string())).unwrap();
            let text = stat_c(pid, comm, ppid, ticks, 0, cutime, rss);
            std::fs::write(self.proc.join(format!("{pid}/stat")), text).unwrap();
            self.status(pid, pid);
        }

        fn status(&self, pid: u32, tgid: u32) {
            let text = format!(
                "Name:\tx\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{tgid}\nNgid:\t0\nPid:\t{pid}\n"
            );
            std::fs::write(self.proc.join(format!("{pid}/status")), text).unwrap();
        }

        fn pss(&self, pid: u32, kb: u64) {
            let text = format!(
                "55d0-7ffd ---p 00000000 00:00 0   [rollup]\nRss:  {}\tkB\nPss:   {kb} kB\nPss_Anon: 1 kB\n",
                kb * 4
            );
            std::fs::write(self.proc.join(format!("{pid}/smaps_rollup")), text).unwrap();
        }

        fn last_pid(&self, pid: u32) {
            std::fs::write(self.proc.join("loadavg"), format!("0.50 0.40 0.30 2/345 {pid}\n")).unwrap();
        }

        fn gone(&self, pid: u32) {
            std::fs::remove_dir_all(self.proc.join(pid.to_string())).unwrap();
        }
    }

    #[test]
    fn parses_stat_with_awkward_names() {
        let s = stat(7, "py (worker) 1", 3, 250, 50, 1000);
        assert_eq!(
            parse_pid_stat(s.as_bytes()),
            Some(PidStat {
                ppid: 3,
                cpu_ticks: 300,
                children_ticks: 0,
                rss_pages: 1000,
                start_ticks: 541020,
                exited: false,
            })
        );
        let real = b"9303 (cat) R 9295 9295 5465 0 -1 4194304 100 0 0 0 3 4 10 2 20 0 1 0 541020 3133440 383 18446744073709551615 94560746942464 0";
        assert_eq!(
            parse_pid_stat(real),
            Some(PidStat {
                ppid: 9295,
                cpu_ticks: 7,
                children_ticks: 12,
                rss_pages: 383,
                start_ticks: 541020,
                exited: false,
            })
        );
        assert_eq!(stat_comm(s.as_bytes()), b"py (worker) 1");
        assert_eq!(stat_comm(b"no parens"), b"");
        assert_eq!(parse_pid_stat(b"12 (x) S"), None);
        assert_eq!(parse_pid_stat(b"no parens"), None);
    }

    #[test]
    fn parses_pss_last_pid_and_tgid() {
        assert_eq!(
            parse_pss(b"x [rollup]\nRss: 1728 kB\nPss:                 339 kB\nPss_Dirty: 112 kB\n"),
            Some(339 * 1024)
        );
        assert_eq!(parse_pss(b"Rss: 1 kB\nPss_Anon: 3 kB\n"), None);
        assert_eq!(parse_pss(b"Pss: 339 MB\n"), None);
        assert_eq!(parse_last_pid(b"0.50 0.40 0.30 2/345 12345\n"), Some(12345));
        assert_eq!(parse_last_pid(b"0.50 0.40 0.30 2/345\n"), None);
        assert_eq!(parse_tgid(b"Name:\tpython\nTgid:\t77\nPid:\t80\n"), Some(77));
        assert_eq!(parse_tgid(b"Name:\tpython\n"), None);
    }

    #[test]
    fn children_that_went_count_once_through_their_parent() {
        let p = FakeProc::new();
        let hz = clock_ticks();
        p.put(100, "python", 1, 0, 0, 1);
        p.put(101, "worker", 100, 100, 0, 1);
        let mut s = TreeSampler::new(&p.proc, 100, Duration::ZERO, TreePids::default());
        let mut m = Metrics::new();
        // 101 burns one core for a second.
        p.put(101, "worker", 100, 100 + hz, 0, 1);
        s.sample(Duration::from_secs(1), &mut m).unwrap();
        assert_eq!(m.get("trainer", "CPUPercent", "ProcessTree"), Some(100.0));
        // It burns another second, exits, and 100 reaps it: 100's cutime grows by all of
        // 101's time. Counted: its last second, and the 100 ticks it had used before the
        // first reading; not the second already counted.
        p.gone(101);
        p.put(100, "python", 1, 0, 100 + 2 * hz, 1);
        m.clear();
        s.sample(Duration::from_secs(2), &mut m).unwrap();
        let expect = (hz + 100) as f64 / hz as f64 * 100.0;
        assert_eq!(m.get("trainer", "CPUPercent", "ProcessTree"), Some(expect));
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(1.0));
        // Children never seen (born and reaped between two ticks): 3 cores' worth.
        p.put(100, "python", 1, 0, 100 + 5 * hz, 1);
        m.clear();
        s.sample(Duration::from_secs(3), &mut m).unwrap();
        assert_eq!(m.get("trainer", "CPUPercent", "ProcessTree"), Some(300.0));
    }

    #[test]
    fn the_credit_waits_a_tick_for_the_parent_and_then_lapses() {
        let p = FakeProc::new();
        let hz = clock_ticks();
        p.put(100, "python", 1, 0, 0, 1);
        p.put(101, "worker", 100, 0, 0, 1);
        let mut s = TreeSampler::new(&p.proc, 100, Duration::ZERO, TreePids::default());
        let mut m = Metrics::new();
        p.put(101, "worker", 100, hz, 0, 1);
        s.sample(Duration::from_secs(1), &mut m).unwrap();
        // 101 is gone, but 100's cutime grows only on the next tick.
        p.gone(101);
        m.clear();
        s.sample(Duration::from_secs(2), &mut m).unwrap();
        assert_eq!(m.get("trainer", "CPUPercent", "ProcessTree"), Some(0.0));
        p.put(100, "python", 1, 0, hz, 1);
        m.clear();
        s.sample(Duration::from_secs(3), &mut m).unwrap();
        assert_eq!(m.get("trainer", "CPUPercent", "ProcessTree"), Some(0.0));
        // A parent that never reaps: the credit lapses and later children count in full.
        p.put(102, "worker", 100, 0, 0, 1);
        s.sample(Duration::from_secs(6), &mut m).unwrap();
        p.put(102, "worker", 100, hz, 0, 1);
        s.sample(Duration::from_secs(7), &mut m).unwrap();
        p.gone(102);
        for t in 8..12 {
            s.sample(Duration::from_secs(t), &mut m).unwrap();
        }
        p.put(100, "python", 1, 0, 3 * hz, 1);
        m.clear();
        s.sample(Duration::from_secs(12), &mut m).unwrap();
        assert_eq!(m.get("trainer", "CPUPercent", "ProcessTree"), Some(200.0));
    }

    #[test]
    fn new_pids_join_between_scans_and_threads_do_not() {
        let p = FakeProc::new();
        let hz = clock_ticks();
        p.put(1, "init", 0, 0, 0, 1);
        p.put(100, "python", 1, 0, 0, 1);
        p.last_pid(100);
        let pids = TreePids::default();
        let mut s = TreeSampler::new(&p.proc, 100, Duration::ZERO, pids.clone());
        assert_eq!(&*pids.get(), &[] as &[u32]);
        let mut m = Metrics::new();
        s.sample(Duration::from_millis(100), &mut m).unwrap();
        assert_eq!(&*pids.get(), &[100]);
        // 101: a DataLoader worker born this interval that already burned half a second;
        // 102: its child; 103: a thread of 100 (its stat shows 100's parent); 104: elsewhere.
        p.put(101, "pt_data_worker", 100, hz / 2, 0, 1);
        p.put(102, "sh", 101, 0, 0, 1);
        p.put(103, "python", 1, 0, 0, 1);
        p.status(103, 100);
        p.put(104, "bash", 1, 0, 0, 1);
        p.last_pid(104);
        m.clear();
        s.sample(Duration::from_millis(600), &mut m).unwrap();
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(3.0));
        assert_eq!(m.get("trainer", "CPUPercent", "ProcessTree"), Some(100.0));
        assert_eq!(&*pids.get(), &[100, 101, 102]);
        // The busiest process has a row of its own, named.
        assert_eq!(m.get("trainer", "pid101-pt_data_worker", "ProcessCPUPercent"), Some(100.0));
        assert_eq!(m.get("trainer", "pid100-python", "ProcessCPUPercent"), Some(0.0));
        // Nothing new, and no full scan before RESCAN: a process the pid range missed is
        // not seen (it is at the next scan).
        p.put(90, "late", 100, 0, 0, 1);
        m.clear();
        s.sample(Duration::from_secs(1), &mut m).unwrap();
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(3.0));
        m.clear();
        s.sample(RESCAN + Duration::from_secs(1), &mut m).unwrap();
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(4.0));
        // A range that wrapped means a full scan.
        p.put(50, "wrapped", 102, 0, 0, 1);
        p.last_pid(50);
        m.clear();
        s.sample(RESCAN + Duration::from_secs(2), &mut m).unwrap();
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(5.0));
    }

    #[test]
    fn pss_beside_rss_and_the_top_processes() {
        let p = FakeProc::new();
        let hz = clock_ticks();
        let page = page_size();
        p.put(100, "python", 1, 0, 0, 1000);
        for pid in 101..=107 {
            p.put(pid, "pt_data_worker", 100, 0, 0, 1000);
            p.pss(pid, 100);
        }
        // 100's smaps_rollup cannot be read and it has no read ancestor: its RSS stands in.
        let mut s = TreeSampler::new(&p.proc, 100, Duration::ZERO, TreePids::default());
        for pid in 101..=107 {
            p.put(pid, "pt_data_worker", 100, u64::from(pid - 100) * hz / 10, 0, 1000);
        }
        let mut m = Metrics::new();
        s.sample(Duration::from_secs(1), &mut m).unwrap();
        assert_eq!(m.get("trainer", "RSSBytes", "ProcessTree"), Some((8 * 1000 * page) as f64));
        assert_eq!(m.get("trainer", "PSSBytes", "ProcessTree"), Some((1000 * page + 7 * 100 * 1024) as f64));
        let top: Vec<_> = m
            .as_slice()
            .iter()
            .filter(|x| x.dimension == "ProcessCPUPercent")
            .map(|x| (x.name.to_string(), x.value))
            .collect();
        let expect: Vec<_> = (103..=107)
            .rev()
            .map(|pid| (format!("pid{pid}-pt_data_worker"), f64::from(pid - 100) * 10.0))
            .collect();
        assert_eq!(top, expect);
        assert_eq!(m.get("trainer", "pid107-pt_data_worker", "ProcessPSSBytes"), Some(102_400.0));
        // The next pass waits at least PSS_EVERY: a changed PSS shows after it.
        p.pss(101, 200);
        m.clear();
        s.sample(Duration::from_secs(2), &mut m).unwrap();
        assert_eq!(m.get("trainer", "PSSBytes", "ProcessTree"), Some((1000 * page + 7 * 100 * 1024) as f64));
        m.clear();
        s.sample(Duration::from_secs(1) + PSS_EVERY, &mut m).unwrap();
        assert_eq!(m.get("trainer", "PSSBytes", "ProcessTree"), Some((1000 * page + 8 * 100 * 1024) as f64));
    }

    /// A fork storm: 20 children share the parent's 300 MiB copy-on-write. Each one's RSS
    /// is 300 MiB, the tree's PSS stays 300 MiB: a child whose PSS is not read (yet) must
    /// not stand in with its RSS, and the parent's PSS read before the forks must not count
    /// whole beside its children.
    #[test]
    fn a_fork_storm_never_counts_shared_pages_twice() {
        let p = FakeProc::new();
        let page = page_size();
        let mib_pages = (1 << 20) / page as i64;
        let shared_kb = 300 * 1024;
        p.put(100, "python", 1, 0, 0, 300 * mib_pages);
        p.pss(100, shared_kb);
        p.last_pid(100);
        let mut s = TreeSampler::new(&p.proc, 100, Duration::ZERO, TreePids::default());
        let mut m = Metrics::new();
        s.sample(Duration::from_millis(100), &mut m).unwrap();
        let pss = |m: &Metrics| m.get("trainer", "PSSBytes", "ProcessTree").unwrap();
        assert_eq!(pss(&m), (shared_kb * 1024) as f64);
        // The forks; the children's smaps_rollup cannot be read, nor the parent's again.
        std::fs::remove_file(p.proc.join("100/smaps_rollup")).unwrap();
        for pid in 101..=120 {
            p.put(pid, "python", 100, 0, 0, 300 * mib_pages);
        }
        p.last_pid(120);
        m.clear();
        s.sample(Duration::from_secs(1), &mut m).unwrap();
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(21.0));
        assert_eq!(
            m.get("trainer", "RSSBytes", "ProcessTree"),
            Some((21 * 300 * mib_pages * page as i64) as f64)
        );
        // The parent's last PSS over the 21 sharers, and each child the same.
        let share = (shared_kb * 1024 / 21) as f64;
        assert_eq!(pss(&m), 21.0 * share);
        assert_eq!(m.get("trainer", "pid100-python", "ProcessPSSBytes"), Some(share));
        // The parent read again first (before its children) once it can be: the children
        // it shares with count its new PSS until their own is read.
        let now_kb = shared_kb / 21;
        p.pss(100, now_kb);
        p.put(121, "python", 100, 0, 0, 300 * mib_pages);
        p.last_pid(121);
        m.clear();
        s.sample(Duration::from_secs(2), &mut m).unwrap();
        assert_eq!(pss(&m), 22.0 * (now_kb * 1024) as f64);
        // The children read at last: their own PSS.
        for pid in 101..=121 {
            p.pss(pid, now_kb);
        }
        m.clear();
        s.sample(Duration::from_secs(1) + PSS_EVERY, &mut m).unwrap();
        assert_eq!(pss(&m), 22.0 * (now_kb * 1024) as f64);
        // A tick to finish the pass under way, if the pace cut it short.
        s.sample(Duration::from_secs(1) + PSS_EVERY + Duration::from_millis(500), &mut m).unwrap();
        assert_eq!(pss(&m), 22.0 * (now_kb * 1024) as f64);
        // The children exit and wait as zombies for their parent to reap them: they hold no
        // memory (their smaps_rollup is gone, their rss 0), and the parent, read again,
        // holds all of it. A zombie's last PSS would count the shared pages a second time.
        for pid in 101..=121 {
            let zombie = stat(pid, "python", 100, 0, 0, 0).replacen(" S ", " Z ", 1);
            std::fs::write(p.proc.join(format!("{pid}/stat")), zombie).unwrap();
            std::fs::remove_file(p.proc.join(format!("{pid}/smaps_rollup"))).unwrap();
        }
        p.pss(100, shared_kb);
        // One tick sees them exit, the next reads their parent again, before its next pass.
        for ms in [1000, 1500] {
            m.clear();
            s.sample(Duration::from_secs(1) + PSS_EVERY + Duration::from_millis(ms), &mut m).unwrap();
        }
        assert_eq!(m.get("trainer", "Processes", "ProcessTree"), Some(22.0));
        assert_eq!(pss(&m), (shared_kb * 1024) as f64);
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
        let mut s = TreeSampler::new(&proc, 100, Duration::ZERO, TreePids::default());
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
        let mut s = TreeSampler::new(&proc, root, Duration::ZERO, TreePids::default());
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
