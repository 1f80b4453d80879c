//! NCCL Inspector's per-process output (NVIDIA's NCCL profiler plugin, `ext-profiler/inspector`
//! in the NCCL repository), read from `<job>/nccl-inspector/` (docs/formats.md, "NCCL
//! Inspector"): one file per process, `<hostname>-pid<pid>.log`, holding one JSON object per
//! collective per communicator. Inspector writes them one to a line; objects spread over lines
//! (pretty-printed) are read too. Everything is bounded: at most [`MAX_FILES`] files, the first
//! [`MAX_FILE_BYTES`] of each, records of at most [`MAX_RECORD_BYTES`] and [`MAX_RECORDS`] per
//! job; a record that is not one of Inspector's (garbage, a cut line, a `nan`, a missing key)
//! is skipped and counted, never fails the report.

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

/// Whether `name` is one of Inspector's files: `<hostname>-pid<pid>.log`.
pub fn is_file_name(name: &str) -> bool {
    name.strip_suffix(".log").and_then(|s| s.rsplit_once("-pid")).is_some_and(|(host, pid)| {
        !host.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
    })
}

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
        split_objects(f.take(m.len.min(MAX_FILE_BYTES)), |o| {
            let Ok(bytes) = o else {
                c.bad += 1;
                return true;
            };
            let Some((rec, host, pid)) = parse_record(bytes) else {
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
        });
    }
    (procs, c)
}
