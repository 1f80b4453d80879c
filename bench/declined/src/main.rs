//! The crates trainprof declined, measured against what it does instead (ARCHITECTURE.md,
//! "Dependencies"). Linux only. Run with `scripts/bench-declined`.
//!
//! Reads (median µs per read over `BENCH_SAMPLES` rounds (40) `BENCH_GAP_MS` (250 ms) apart,
//! the agent's default tick; each round does every read once, in turn. Not tighter:
//! sysinfo skips a CPU refresh sooner than `MINIMUM_CPU_UPDATE_INTERVAL`, 200 ms):
//!   hand-rolled: the agent's technique (`agent/src/pipeline/sample/mod.rs`, `ProcFile`):
//!                the file opened once, read with `pread` at offset 0 into a kept buffer,
//!                parsed in place into numbers. A minimal equivalent of the agent's
//!                parsers, not the agent's code (the agent is a binary crate).
//!   procfs 0.18: `KernelStats`, `Meminfo`, `DiskStats`, `InterfaceDeviceStatus` (`current()`),
//!                `all_processes()` + `stat()`, a kept `Process` per known pid + `stat()`.
//!   sysinfo 0.40: one `System` / `Disks` / `Networks` kept across rounds and refreshed:
//!                `refresh_cpu_usage`, `refresh_memory`, `Disks::refresh_specifics(io_usage)`,
//!                `Networks::refresh`, `refresh_processes_specifics(All | Some(pids), cpu)`.
//!
//! Handoff: 4 producer threads push 104-byte events (the hook's `Event`) into a bounded
//! queue of 32 768 (the hook's default) that 1 consumer drains; ns per push on the
//! producer side (what the trainer pays), median over `BENCH_ROUNDS` rounds (5) of
//! `BENCH_EVENTS` pushes per producer (1 000 000). A full queue drops the event (the hook's
//! policy), so the channels use `try_send`; the producers pace themselves so that none is
//! full (see `handoff`).
//!
//! Prints a table and `RESULT {json}` lines (bench/run.py's format).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use procfs::{Current, CurrentSI};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// A file kept open and read with `pread` at 0 (the agent's `ProcFile`).
struct ProcFile {
    file: File,
    buf: Vec<u8>,
}

impl ProcFile {
    fn open(path: &str) -> io::Result<ProcFile> {
        Ok(ProcFile { file: File::open(path)?, buf: vec![0; 4096] })
    }

    fn read(&mut self) -> io::Result<&[u8]> {
        let mut at = 0usize;
        loop {
            if self.buf.len() - at < 4096 {
                self.buf.resize(self.buf.len() + self.buf.len().max(4096), 0);
            }
            match self.file.read_at(&mut self.buf[at..], at as u64) {
                Ok(0) => break,
                Ok(n) => at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(&self.buf[..at])
    }
}

fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty())
}

fn parse_u64(field: &[u8]) -> Option<u64> {
    if field.is_empty() || field.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// Every number on every line (`/proc/diskstats`, `/proc/net/dev`: the agent keeps a
/// subset of these).
fn sum_numbers(text: &[u8]) -> u64 {
    let mut s = 0u64;
    for line in text.split(|&b| b == b'\n') {
        for f in fields(line) {
            s = s.wrapping_add(parse_u64(f).unwrap_or(0));
        }
    }
    s
}

/// `/proc/stat` as the agent reads it (`cpu.rs`): the `cpu` lines only, up to the first
/// other line (`intr` alone holds one number per interrupt).
fn parse_stat(text: &[u8]) -> u64 {
    let mut s = 0u64;
    for line in text.split(|&b| b == b'\n') {
        let Some(rest) = line.strip_prefix(b"cpu") else { break };
        for f in fields(rest).skip(1) {
            s = s.wrapping_add(parse_u64(f).unwrap_or(0));
        }
    }
    s
}

/// `/proc/meminfo` as the agent reads it (`memory.rs`): `MemTotal` and `MemAvailable`.
fn parse_meminfo(text: &[u8]) -> u64 {
    let mut s = 0u64;
    for line in text.split(|&b| b == b'\n') {
        if line.starts_with(b"MemTotal:") || line.starts_with(b"MemAvailable:") {
            s = s.wrapping_add(fields(line).nth(1).and_then(parse_u64).unwrap_or(0));
        }
    }
    s
}

/// `/proc/<pid>/stat`: ppid, utime, stime (after the `comm` in parentheses).
fn parse_pid_stat(text: &[u8]) -> Option<(u32, u64, u64)> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let mut f = fields(&text[close + 1..]);
    let ppid = parse_u64(f.nth(1)?)? as u32;
    let utime = parse_u64(f.nth(9)?)?;
    let stime = parse_u64(f.next()?)?;
    Some((ppid, utime, stime))
}

fn descendants(root: u32, pairs: &[(u32, u32)]) -> Vec<u32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(pairs.iter().filter(|&&(_, pp)| pp == p).map(|&(c, _)| c));
        i += 1;
    }
    out
}

/// The agent's tree discovery: list `/proc`, read each pid's `stat` (opened, read, closed).
fn hand_tree(root: u32, buf: &mut Vec<u8>) -> usize {
    let mut pairs = Vec::new();
    let Ok(dir) = fs::read_dir("/proc") else { return 0 };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(file) = File::open(format!("/proc/{pid}/stat")) else { continue };
        buf.clear();
        buf.resize(4096, 0);
        let Ok(n) = file.read_at(buf, 0) else { continue };
        if let Some((ppid, _, _)) = parse_pid_stat(&buf[..n]) {
            pairs.push((pid, ppid));
        }
    }
    descendants(root, &pairs).len()
}

struct Case {
    read: &'static str,
    how: &'static str,
    samples: Vec<f64>,
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn time_us(f: impl FnOnce() -> u64) -> (f64, u64) {
    let t = Instant::now();
    let r = f();
    (t.elapsed().as_secs_f64() * 1e6, r)
}

fn reads(samples: u64, gap: Duration, known: &[u32]) -> Vec<Case> {
    let me = std::process::id();
    let mut cases: Vec<Case> = Vec::new();
    let names =
        ["/proc/stat", "/proc/meminfo", "/proc/diskstats", "/proc/net/dev", "tree scan", "known pids"];
    for read in names {
        for how in ["hand-rolled", "procfs", "sysinfo"] {
            cases.push(Case { read, how, samples: Vec::new() });
        }
    }

    let mut files: Vec<ProcFile> = ["/proc/stat", "/proc/meminfo", "/proc/diskstats", "/proc/net/dev"]
        .iter()
        .filter_map(|p| ProcFile::open(p).ok())
        .collect();
    let mut known_files: Vec<ProcFile> =
        known.iter().filter_map(|p| ProcFile::open(&format!("/proc/{p}/stat")).ok()).collect();
    let known_procs: Vec<procfs::process::Process> =
        known.iter().filter_map(|&p| procfs::process::Process::new(p as i32).ok()).collect();
    let known_sys: Vec<sysinfo::Pid> = known.iter().map(|&p| sysinfo::Pid::from_u32(p)).collect();
    let Ok(mut sys) = sysinfo::System::new() else { return cases };
    let Ok(mut disks) = sysinfo::Disks::new_with_refreshed_list() else { return cases };
    let Ok(mut nets) = sysinfo::Networks::new_with_refreshed_list() else { return cases };
    let proc_kind = sysinfo::ProcessRefreshKind::nothing().with_cpu().without_tasks();
    let disk_kind = sysinfo::DiskRefreshKind::nothing().with_io_usage();
    let mut buf = Vec::new();
    let mut sink = 0u64;

    // Round 0 warms every reader (first refreshes list what later ones update) and is not counted.
    for round in 0..=samples {
        let mut t: Vec<(f64, u64)> = Vec::with_capacity(cases.len());
        for i in 0..4 {
            t.push(time_us(|| {
                files.get_mut(i).and_then(|f| f.read().ok()).map_or(0, |text| match i {
                    0 => parse_stat(text),
                    1 => parse_meminfo(text),
                    _ => sum_numbers(text),
                })
            }));
            t.push(time_us(|| match i {
                0 => procfs::KernelStats::current().map_or(0, |k| k.total.user),
                1 => procfs::Meminfo::current().map_or(0, |m| m.mem_free),
                2 => procfs::DiskStats::current().map_or(0, |d| d.0.len() as u64),
                _ => procfs::net::InterfaceDeviceStatus::current().map_or(0, |d| d.0.len() as u64),
            }));
            t.push(time_us(|| match i {
                0 => {
                    sys.refresh_cpu_usage();
                    sys.cpus().len() as u64
                }
                1 => {
                    sys.refresh_memory();
                    sys.free_memory()
                }
                2 => {
                    disks.refresh_specifics(true, disk_kind);
                    disks.len() as u64
                }
                _ => {
                    nets.refresh(true);
                    nets.len() as u64
                }
            }));
        }
        t.push(time_us(|| hand_tree(me, &mut buf) as u64));
        t.push(time_us(|| {
            let Ok(all) = procfs::process::all_processes() else { return 0 };
            let pairs: Vec<(u32, u32)> =
                all.flatten().filter_map(|p| p.stat().ok().map(|s| (s.pid as u32, s.ppid as u32))).collect();
            descendants(me, &pairs).len() as u64
        }));
        t.push(time_us(|| {
            sys.refresh_processes_specifics(sysinfo::ProcessesToUpdate::All, true, proc_kind) as u64
        }));
        t.push(time_us(|| {
            known_files
                .iter_mut()
                .filter_map(|f| f.read().ok().and_then(parse_pid_stat))
                .map(|s| s.1 + s.2)
                .sum()
        }));
        t.push(time_us(|| known_procs.iter().filter_map(|p| p.stat().ok()).map(|s| s.utime + s.stime).sum()));
        t.push(time_us(|| {
            sys.refresh_processes_specifics(sysinfo::ProcessesToUpdate::Some(&known_sys), true, proc_kind)
                as u64
        }));
        if round > 0 {
            for (case, (us, r)) in cases.iter_mut().zip(t) {
                case.samples.push(us);
                sink = sink.wrapping_add(r);
            }
        }
        thread::sleep(gap);
    }
    std::hint::black_box(sink);
    cases
}

#[derive(Clone, Copy)]
#[allow(dead_code)] // the fields are the payload's shape, never read
struct Event {
    kind: u32,
    phase: u32,
    name: u32,
    start_us: i64,
    end_us: i64,
    step: i64,
    n_args: u8,
    args: [(u32, i32, i64); 4],
}

/// The hook's default queue (`TRAINPROF_QUEUE_EVENTS`).
const CAPACITY: usize = 32_768;

const _: () = assert!(std::mem::size_of::<Event>() == 104);

fn event(i: u64) -> Event {
    Event {
        kind: 1,
        phase: 2,
        name: i as u32,
        start_us: i as i64,
        end_us: i as i64 + 1,
        step: 0,
        n_args: 0,
        args: [(0, 0, 0); 4],
    }
}

trait Queue: Send + Sync + 'static {
    fn push(&self, e: Event) -> bool;
    fn pop(&self) -> Option<Event>;
}

struct ArrayQ(crossbeam_queue::ArrayQueue<Event>);
impl Queue for ArrayQ {
    fn push(&self, e: Event) -> bool {
        self.0.push(e).is_ok()
    }
    fn pop(&self) -> Option<Event> {
        self.0.pop()
    }
}

struct CbChan(crossbeam_channel::Sender<Event>, crossbeam_channel::Receiver<Event>);
impl Queue for CbChan {
    fn push(&self, e: Event) -> bool {
        self.0.try_send(e).is_ok()
    }
    fn pop(&self) -> Option<Event> {
        self.1.try_recv().ok()
    }
}

// std's Receiver is Send but not Sync; the one consumer is the only caller of `pop`.
struct StdChan(std::sync::mpsc::SyncSender<Event>, std::sync::Mutex<std::sync::mpsc::Receiver<Event>>);
impl Queue for StdChan {
    fn push(&self, e: Event) -> bool {
        self.0.try_send(e).is_ok()
    }
    fn pop(&self) -> Option<Event> {
        self.1.lock().ok()?.try_recv().ok()
    }
}

/// ns per push (the median over every producer's bursts of each burst's mean: a burst a
/// producer was descheduled in, on a machine with fewer cores than threads, does not count)
/// and the share dropped for a full queue.
///
/// The producers push in bursts of `BURST` and wait, untimed, while more than half the
/// capacity is queued: a trainer records at a rate the writer keeps up with, so what is
/// timed is a push into a queue that is being drained, not the drop of a full one.
fn handoff(q: Arc<dyn Queue>, per_producer: u64) -> (f64, f64) {
    const BURST: u64 = 1024;
    let stop = Arc::new(AtomicBool::new(false));
    let pushed = Arc::new(AtomicU64::new(0));
    let consumed = Arc::new(AtomicU64::new(0));
    let consumer = {
        let (q, stop, consumed) = (Arc::clone(&q), Arc::clone(&stop), Arc::clone(&consumed));
        thread::spawn(move || {
            let mut n = 0u64;
            loop {
                match q.pop() {
                    Some(e) => {
                        n = n.wrapping_add(u64::from(e.name));
                        consumed.fetch_add(1, Ordering::Relaxed);
                    }
                    None if stop.load(Ordering::Relaxed) => break,
                    None => std::hint::spin_loop(),
                }
            }
            std::hint::black_box(n);
        })
    };
    let producers: Vec<_> = (0..4)
        .map(|_| {
            let (q, pushed, consumed) = (Arc::clone(&q), Arc::clone(&pushed), Arc::clone(&consumed));
            thread::spawn(move || {
                let mut dropped = 0u64;
                let mut bursts = Vec::new();
                let mut i = 0;
                while i < per_producer {
                    while pushed.load(Ordering::Relaxed).saturating_sub(consumed.load(Ordering::Relaxed))
                        > CAPACITY as u64 / 2
                    {
                        thread::yield_now();
                    }
                    let n = BURST.min(per_producer - i);
                    let t = Instant::now();
                    for j in i..i + n {
                        if !q.push(event(j)) {
                            dropped += 1;
                        }
                    }
                    bursts.push(t.elapsed().as_nanos() as f64 / n as f64);
                    pushed.fetch_add(n, Ordering::Relaxed);
                    i += n;
                }
                (bursts, dropped)
            })
        })
        .collect();
    let mut bursts = Vec::new();
    let mut dropped = 0u64;
    for p in producers {
        if let Ok((b, d)) = p.join() {
            bursts.extend(b);
            dropped += d;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = consumer.join();
    (median(&mut bursts), dropped as f64 / (4 * per_producer) as f64)
}

fn spawn_known(n: usize) -> Vec<Child> {
    (0..n).filter_map(|_| Command::new("sleep").arg("600").spawn().ok()).collect()
}

fn result(metric: &str, unit: &str, mine: f64, peer: f64, peer_name: &str) {
    println!(
        "RESULT {{\"metric\": \"{metric}\", \"unit\": \"{unit}\", \"trainprof\": {mine:.3}, \"peer\": {peer:.3}, \"peer_name\": \"{peer_name}\", \"better\": \"lower\"}}"
    );
}

fn main() {
    let samples = env_or("BENCH_SAMPLES", 40);
    let gap = Duration::from_millis(env_or("BENCH_GAP_MS", 250));
    let rounds = env_or("BENCH_ROUNDS", 5);
    let per_producer = env_or("BENCH_EVENTS", 1_000_000);
    let mut children = spawn_known(8);
    let known: Vec<u32> = children.iter().map(Child::id).collect();
    let processes = fs::read_dir("/proc")
        .map(|d| {
            d.flatten().filter(|e| e.file_name().to_str().is_some_and(|s| s.parse::<u32>().is_ok())).count()
        })
        .unwrap_or(0);

    println!(
        "reads: median µs per read over {samples} rounds {} ms apart; {processes} processes in /proc; {} known pids",
        gap.as_millis(),
        known.len()
    );
    let mut cases = reads(samples, gap, &known);
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let mut by: HashMap<(&str, &str), f64> = HashMap::new();
    println!("{:<16} {:>12} {:>12} {:>12}", "read", "hand-rolled", "procfs", "sysinfo");
    for chunk in cases.chunks_mut(3) {
        let read = chunk[0].read;
        let m: Vec<f64> = chunk.iter_mut().map(|c| median(&mut c.samples)).collect();
        for (c, v) in chunk.iter().zip(&m) {
            by.insert((read, c.how), *v);
        }
        println!("{:<16} {:>12.1} {:>12.1} {:>12.1}", read, m[0], m[1], m[2]);
    }

    println!(
        "\nhandoff: 4 producers → 1 consumer, 104-byte events, capacity 32768, {per_producer} pushes per producer, median of {rounds} rounds"
    );
    let mut ns: [Vec<f64>; 3] = Default::default();
    let mut drops: [Vec<f64>; 3] = Default::default();
    for _ in 0..rounds {
        let qs: [Arc<dyn Queue>; 3] = [
            Arc::new(ArrayQ(crossbeam_queue::ArrayQueue::new(CAPACITY))),
            {
                let (s, r) = crossbeam_channel::bounded(CAPACITY);
                Arc::new(CbChan(s, r))
            },
            {
                let (s, r) = std::sync::mpsc::sync_channel(CAPACITY);
                Arc::new(StdChan(s, std::sync::Mutex::new(r)))
            },
        ];
        for (i, q) in qs.into_iter().enumerate() {
            let (n, d) = handoff(q, per_producer);
            ns[i].push(n);
            drops[i].push(d);
        }
    }
    let names =
        ["crossbeam_queue::ArrayQueue", "crossbeam_channel::bounded", "std::sync::mpsc::sync_channel"];
    let med: Vec<f64> = ns.iter_mut().map(|v| median(v)).collect();
    println!("{:<32} {:>10} {:>10}", "queue", "ns/push", "dropped");
    for i in 0..3 {
        println!("{:<32} {:>10.1} {:>9.1}%", names[i], med[i], median(&mut drops[i]) * 100.0);
    }

    for read in ["/proc/stat", "/proc/meminfo", "/proc/diskstats", "/proc/net/dev", "tree scan", "known pids"]
    {
        let mine = by[&(read, "hand-rolled")];
        result(&format!("read {read} vs procfs"), "µs", mine, by[&(read, "procfs")], "procfs 0.18");
        result(&format!("read {read} vs sysinfo"), "µs", mine, by[&(read, "sysinfo")], "sysinfo 0.40");
    }
    result("push vs crossbeam-channel", "ns", med[0], med[1], "crossbeam_channel::bounded");
    result("push vs std sync_channel", "ns", med[0], med[2], "std::sync::mpsc::sync_channel");
}
