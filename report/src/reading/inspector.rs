//! NCCL Inspector's per-process output (NVIDIA's NCCL profiler plugin, `ext-profiler/inspector`
//! in the NCCL repository), read from `<job>/nccl-inspector/` (docs/formats.md, "NCCL
//! Inspector"): one file per process, `<hostname>-pid<pid>.log`, holding one JSON object per
//! collective per communicator. Inspector writes them one to a line; objects spread over lines
//! (pretty-printed) are read too. Everything is bounded: at most [`MAX_FILES`] files, the first
//! [`MAX_FILE_BYTES`] of each, records of at most [`MAX_RECORD_BYTES`] and [`MAX_RECORDS`] per
//! job; a record that is not one of Inspector's (garbage, a cut line, a `nan`, a missing key)
//! is skipped and counted, never fails the report.
//!
//! In its Prometheus mode (`NCCL_INSPECTOR_PROM_DUMP=1`) Inspector writes instead one text file
//! per GPU, `nccl_inspector_metrics_<device uuid>.prom`, in Prometheus's text exposition format:
//! three lines per collective (bandwidths and execution time) with the same labels. Those files
//! are read here too ([`read_prom`]), each line at most [`MAX_RECORD_BYTES`], into the same
//! records.

use std::io::{BufRead, BufReader, Read};

use serde::Deserialize;
use trainprof_output::fs::{self as ofs, Dir};

use crate::reading::{self, Skipped};

/// The folder under the job's root the report reads Inspector's files from.
pub const FOLDER: &str = "nccl-inspector";
/// Files read per job (one per process).
pub const MAX_FILES: usize = 4096;
/// Bytes read of one file: the rest is left out and said in `job.skipped` (Inspector writes
/// 200–500 bytes per collective).
pub const MAX_FILE_BYTES: u64 = 256 << 20;
/// A record longer than this (a verbose record lists one entry per channel, 64 at most) is
/// skipped unread.
pub const MAX_RECORD_BYTES: usize = 64 << 10;
/// Records taken per job; the further ones are counted in `job.capped` (`nccl_inspector_records`).
pub const MAX_RECORDS: u64 = 1_000_000;
/// Names (communicator id, host, collective kind) are cut to this many bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Whether `name` is one of Inspector's files: `<hostname>-pid<pid>.log`, or in its
/// Prometheus mode `nccl_inspector_metrics_<device uuid>.prom`.
pub fn is_file_name(name: &str) -> bool {
    is_prom_file_name(name)
        || name.strip_suffix(".log").and_then(|s| s.rsplit_once("-pid")).is_some_and(|(host, pid)| {
            !host.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
        })
}

/// Whether `name` is a file of Inspector's Prometheus mode: `nccl_inspector_metrics_<device
/// uuid>.prom` (the uuid: letters, digits, `-`, `_`).
pub fn is_prom_file_name(name: &str) -> bool {
    name.strip_prefix(PROM_PREFIX).and_then(|s| s.strip_suffix(".prom")).is_some_and(|u| {
        !u.is_empty() && u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// The name of a Prometheus-mode file before its device's uuid.
pub const PROM_PREFIX: &str = "nccl_inspector_metrics_";
/// The metrics of the Prometheus mode read (the rest are passed over): the execution time
/// (µs), required, and the bus bandwidth (GB/s).
pub const PROM_EXEC_TIME: &str = "nccl_collective_exec_time_microseconds";
pub const PROM_BUSBW: &str = "nccl_bus_bandwidth_gbs";
/// Labels read per line at most; a line with more is skipped.
pub const MAX_PROM_LABELS: usize = 64;

/// One collective on one rank, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The communicator (`header.id`) and this process's rank in it (`header.rank`, `n_ranks`).
    pub comm: String,
    pub rank: i64,
    pub n_ranks: i64,
    pub kind: String,
    pub sn: u64,
    pub bytes: Option<u64>,
    /// `coll_exec_time_us`.
    pub exec_us: f64,
    /// `coll_busbw_gbs`; `None` when not a finite number (Inspector writes `"nan"`).
    pub busbw_gbs: Option<f64>,
    /// `coll_timing_source` (`kernel_gpu`, `kernel_cpu`, `collective_cpu`).
    pub timing: Option<String>,
}

/// The process a file is: `metadata.hostname` and `pid` of its first record, else its name's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Process {
    pub file: String,
    pub host: String,
    pub pid: Option<u64>,
}

/// What a read of the folder counted.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Counts {
    pub files: u64,
    pub records: u64,
    /// Records skipped: not JSON, not Inspector's shape, too long, cut at the file's end.
    pub bad: u64,
    /// Records past [`MAX_RECORDS`], and files past [`MAX_FILES`].
    pub left_out_records: u64,
    pub left_out_files: u64,
}

#[derive(Deserialize)]
struct RawRecord {
    header: RawHeader,
    #[serde(default)]
    metadata: Option<RawMeta>,
    coll_perf: RawPerf,
}

#[derive(Deserialize)]
struct RawHeader {
    id: String,
    rank: i64,
    n_ranks: i64,
}

#[derive(Deserialize)]
struct RawMeta {
    #[serde(default)]
    hostname: Option<String>,
    #[serde(default)]
    pid: Option<u64>,
}

#[derive(Deserialize)]
struct RawPerf {
    coll: String,
    coll_sn: u64,
    #[serde(default)]
    coll_msg_size_bytes: Option<u64>,
    coll_exec_time_us: f64,
    #[serde(default)]
    coll_timing_source: Option<String>,
    #[serde(default)]
    coll_busbw_gbs: Option<serde_json::Value>,
}

/// Parses one record; `None` when it is not one of Inspector's.
pub fn parse_record(bytes: &[u8]) -> Option<(Record, Option<String>, Option<u64>)> {
    let r: RawRecord = serde_json::from_slice(bytes).ok()?;
    let p = r.coll_perf;
    if !p.coll_exec_time_us.is_finite() || p.coll_exec_time_us < 0.0 {
        return None;
    }
    let name = |s: &str| reading::printable(s, MAX_NAME_BYTES);
    let meta = r.metadata.unwrap_or(RawMeta { hostname: None, pid: None });
    Some((
        Record {
            comm: name(&r.header.id),
            rank: r.header.rank,
            n_ranks: r.header.n_ranks,
            kind: name(&p.coll),
            sn: p.coll_sn,
            bytes: p.coll_msg_size_bytes,
            exec_us: p.coll_exec_time_us,
            busbw_gbs: p.coll_busbw_gbs.and_then(|v| v.as_f64()).filter(|v| v.is_finite()),
            timing: p.coll_timing_source.as_deref().map(name),
        },
        meta.hostname.as_deref().map(name),
        meta.pid,
    ))
}

/// Splits a stream into top-level JSON objects, bounded: each object's bytes (at most
/// [`MAX_RECORD_BYTES`]) go to `each`, `Err(())` for one that was too long, cut (a one-line
/// object whose line ends before it does, or the stream's end) or preceded by bytes that are no
/// object. Nesting is counted, never recursed into; strings are followed so their braces do not
/// count.
pub fn split_objects(r: impl Read, mut each: impl FnMut(Result<&[u8], ()>) -> bool) {
    let mut r = BufReader::with_capacity(64 << 10, r);
    let mut buf: Vec<u8> = Vec::new();
    let (mut depth, mut in_str, mut esc, mut too_long, mut one_line) = (0u64, false, false, false, false);
    let mut junk = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok([]) => break,
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let n = chunk.len();
        for &b in chunk {
            if depth == 0 {
                match b {
                    b'{' => {
                        if junk {
                            junk = false;
                            if !each(Err(())) {
                                return;
                            }
                        }
                        depth = 1;
                        (in_str, esc, too_long, one_line) = (false, false, false, true);
                        buf.clear();
                        buf.push(b);
                    }
                    b' ' | b'\t' | b'\r' | b'\n' => {}
                    _ => junk = true,
                }
                continue;
            }
            if !too_long {
                if buf.len() >= MAX_RECORD_BYTES {
                    too_long = true;
                    buf.clear();
                } else {
                    buf.push(b);
                }
            }
            if in_str {
                match (esc, b) {
                    (true, _) => esc = false,
                    (false, b'\\') => esc = true,
                    (false, b'"') => in_str = false,
                    // A string never holds a raw newline: the object was cut there.
                    (false, b'\n') => {
                        depth = 0;
                        if !each(Err(())) {
                            return;
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        let ok = if too_long { Err(()) } else { Ok(&buf[..]) };
                        if !each(ok) {
                            return;
                        }
                    }
                }
                b'\n' => {
                    // Inspector's own objects are one to a line: one that began on this line with
                    // no newline after its `{` and is still open was cut (a writer killed
                    // mid-line); the next line starts afresh.
                    if one_line && buf.len() > 2 {
                        depth = 0;
                        if !each(Err(())) {
                            return;
                        }
                    } else {
                        one_line = false;
                    }
                }
                _ => {}
            }
        }
        r.consume(n);
    }
    if depth > 0 || junk {
        each(Err(()));
    }
}

/// A Prometheus line's labels: (name, unescaped value), in the line's order.
pub type PromLabels<'a> = Vec<(&'a str, String)>;

/// One line of Prometheus's text format: the metric's name, its labels, its value; `None` for
/// a line that is not one (a comment or a blank line among them). Label values are unescaped
/// (`\\`, `\"`, `\n`).
pub fn parse_prom_line(line: &str) -> Option<(&str, PromLabels<'_>, f64)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            rest = rest.trim_start_matches([' ', ',']);
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            if labels.len() >= MAX_PROM_LABELS {
                return None;
            }
            let (key, r) = rest.split_once('=')?;
            let r = r.strip_prefix('"')?;
            let mut value = String::new();
            let mut chars = r.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.push((key.trim(), value));
            rest = &r[end + 1..];
        }
    }
    // The value, then an optional timestamp (ms).
    let mut it = rest.split_ascii_whitespace();
    let value = match it.next()? {
        "NaN" => f64::NAN,
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    match (it.next(), it.next()) {
        (None, _) => {}
        (Some(t), None) if t.parse::<i64>().is_ok() => {}
        _ => return None,
    }
    Some((name, labels, value))
}

/// Inspector's `message_size` label (`2.00GB`, `512B`: powers of 1024, two decimals) in bytes,
/// as close as its two decimals allow.
pub fn prom_size(s: &str) -> Option<u64> {
    let split = s.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = s.split_at(split);
    let scale: u64 = match unit {
        "B" => 1,
        "KB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return None,
    };
    let n: f64 = n.parse().ok().filter(|n: &f64| n.is_finite() && *n >= 0.0 && *n < 1e6)?;
    Some((n * scale as f64).round() as u64)
}

/// One record read with its process's `hostname` and `pid`, or `Err(())` for one skipped.
pub type Item = Result<(Record, Option<String>, Option<u64>), ()>;

/// The collective a Prometheus-mode line is about, and what the record takes from it.
#[derive(Default)]
struct PromPending {
    key: Option<(String, String, String)>,
    rec: Option<Record>,
    host: Option<String>,
    pid: Option<u64>,
}

/// Reads one Prometheus-mode file: `each(Ok((record, hostname, pid)))` per collective (its
/// consecutive lines with the same `comm_id`, `rank` and `coll_sn`), `each(Err(()))` per line
/// skipped (not the text format, over [`MAX_RECORD_BYTES`], cut at the file's end, or a
/// collective without its execution time, `comm_id`, `rank` or `coll_sn`); comments, blank
/// lines and other metrics are passed over. `each` returns whether to go on.
pub fn read_prom(r: impl Read, mut each: impl FnMut(Item) -> bool) {
    let mut r = BufReader::with_capacity(64 << 10, r);
    let mut buf = Vec::new();
    let mut p = PromPending::default();
    let name = |s: &str| reading::printable(s, MAX_NAME_BYTES);
    let flush = |p: &mut PromPending, each: &mut dyn FnMut(Item) -> bool| {
        let Some(rec) = p.rec.take() else { return true };
        p.key = None;
        if rec.exec_us.is_finite() && rec.exec_us >= 0.0 {
            each(Ok((rec, p.host.take(), p.pid.take())))
        } else {
            each(Err(()))
        }
    };
    loop {
        buf.clear();
        let n = match (&mut r).take(MAX_RECORD_BYTES as u64 + 1).read_until(b'\n', &mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if n == 0 {
            break;
        }
        if buf.last() != Some(&b'\n') {
            // Longer than a record may be (skipped unread), or cut at the file's end.
            if buf.len() > MAX_RECORD_BYTES && r.skip_until(b'\n').is_err() {
                break;
            }
            if !each(Err(())) {
                return;
            }
            continue;
        }
        let Ok(line) = std::str::from_utf8(&buf) else {
            if !each(Err(())) {
                return;
            }
            continue;
        };
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let Some((metric, labels, value)) = parse_prom_line(t) else {
            if !each(Err(())) {
                return;
            }
            continue;
        };
        if metric != PROM_EXEC_TIME && metric != PROM_BUSBW && !metric.starts_with("nccl_") {
            continue;
        }
        let label = |k: &str| labels.iter().find(|(key, _)| *key == k).map(|(_, v)| v.as_str());
        let (Some(comm), Some(rank), Some(sn)) = (label("comm_id"), label("rank"), label("coll_sn")) else {
            if !each(Err(())) {
                return;
            }
            continue;
        };
        let key = (comm.to_owned(), rank.to_owned(), sn.to_owned());
        if p.key.as_ref() != Some(&key) {
            if !flush(&mut p, &mut each) {
                return;
            }
            let (Ok(rank_n), Ok(sn_n)) = (rank.parse::<i64>(), sn.parse::<u64>()) else {
                if !each(Err(())) {
                    return;
                }
                continue;
            };
            p.rec = Some(Record {
                comm: name(comm),
                rank: rank_n,
                n_ranks: label("nranks").or(label("n_ranks")).and_then(|v| v.parse().ok()).unwrap_or(-1),
                kind: name(label("collective").unwrap_or("")),
                sn: sn_n,
                bytes: label("message_size").and_then(prom_size),
                exec_us: f64::NAN,
                busbw_gbs: None,
                timing: label("coll_timing_source").map(name),
            });
            p.host = label("hostname").map(name);
            p.pid = label("pid").and_then(|v| v.parse().ok());
            p.key = Some(key);
        }
        if let Some(rec) = p.rec.as_mut() {
            match metric {
                PROM_EXEC_TIME => rec.exec_us = value,
                PROM_BUSBW => rec.busbw_gbs = Some(value).filter(|v| v.is_finite()),
                _ => {}
            }
        }
    }
    flush(&mut p, &mut each);
}

/// Reads every Inspector file of the job: `each(process index, record)` for each record, in
/// file order; returns the processes (one per file read) and the counts.
pub fn read(dir: &Dir, skipped: &mut Skipped, mut each: impl FnMut(usize, Record)) -> (Vec<Process>, Counts) {
    let want = |name: &str, is_dir: bool| !name.starts_with('.') && !is_dir && is_file_name(name);
    let w = ofs::walk(dir, FOLDER, &want);
    for r in w.refused {
        skipped.push(r);
    }
    let mut procs = Vec::new();
    let mut c = Counts::default();
    for (rel, _) in w.files {
        if skipped.1.contains(&rel) {
            continue;
        }
        if procs.len() >= MAX_FILES {
            c.left_out_files += 1;
            continue;
        }
        let (_, _, f) = match ofs::open_at(dir, &rel, false) {
            Ok(x) => x,
            Err(e) => {
                skipped.push(format!("{rel}: {e}"));
                continue;
            }
        };
        let m = match ofs::meta_of(&f) {
            Ok(m) => m,
            Err(e) => {
                skipped.push(format!("{rel}: {e}"));
                continue;
            }
        };
        if !m.is_plain_file() || m.is_mostly_holes() {
            skipped.push(format!("{rel}: not a plain file, or mostly holes: not read"));
            continue;
        }
        if m.len > MAX_FILE_BYTES {
            skipped.push(format!("{rel}: {} bytes: only the first {MAX_FILE_BYTES} read", m.len));
        }
        let name = rel.rsplit('/').next().unwrap_or(&rel);
        let (host, pid) = name
            .strip_suffix(".log")
            .and_then(|s| s.rsplit_once("-pid"))
            .map_or((String::new(), None), |(h, p)| (reading::printable(h, MAX_NAME_BYTES), p.parse().ok()));
        let idx = procs.len();
        procs.push(Process { file: rel.clone(), host, pid });
        c.files += 1;
        let mut first = true;
        let mut take = |o: Item| {
            let Ok((rec, host, pid)) = o else {
                c.bad += 1;
                return true;
            };
            if first {
                first = false;
                let p = &mut procs[idx];
                if let Some(h) = host.filter(|h| !h.is_empty()) {
                    p.host = h;
                }
                p.pid = pid.or(p.pid);
            }
            if c.records >= MAX_RECORDS {
                c.left_out_records += 1;
                return true;
            }
            c.records += 1;
            each(idx, rec);
            true
        };
        let f = f.take(m.len.min(MAX_FILE_BYTES));
        if is_prom_file_name(name) {
            read_prom(f, take);
        } else {
            split_objects(f, |o| take(o.ok().and_then(parse_record).ok_or(())));
        }
    }
    (procs, c)
}
