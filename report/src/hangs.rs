//! Hangs and crashes (`docs/report.md`, "Hangs and crashes"): the hook's dump folders
//! (`framework/hangs/<node>/<step>-<µs>/`, `docs/formats.md`, "Hang and crash dumps") and the
//! agent's records of the host around them (`system/hangs/<node>/<name>.json`, "Host state at
//! a stall"), read strictly through `trainprof_output::fs` and bounded in every dimension
//! (folders, bytes per file, threads, frames, text per line); joined with every rank's last
//! steps from the timelines; and judged: which rank(s) the others wait for.
//!
//! The judgement ([`judge`]): the rank(s) with the lowest last begun step (a dump's open step,
//! else the timeline's last completed step) when the ranks differ; else, among the ranks that
//! dumped, the one(s) not inside the blocking call the others share (the top frame of a
//! thread that at least two ranks have in common and the rest lack).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use trainprof_output::fs::{self as ofs, Dir};

use trainprof_output::protocol::dump::{self as dk, DumpKind};
pub use trainprof_output::protocol::dump::{MAX_JSON_BYTES, hook_record, parse_folder, stall_value};
pub use trainprof_output::protocol::host_record::{self, HostSample, HostState, ThreadCpu};

use crate::collect::StepRec;
use crate::read::{self, Skipped, plausible_us};

/// Dump folders read per job; more are counted in `folders_left_out`.
pub const MAX_FOLDERS: usize = 1024;
/// Agent records (`system/hangs/`) read per job, at most [`MAX_HOST_BYTES`] in all.
pub const MAX_HOST_FILES: usize = 256;
/// Largest `python_stacks.txt` / `native_stacks.txt` read.
pub const MAX_STACKS_BYTES: u64 = 4 << 20;
/// Largest `traceback.txt` read.
pub const MAX_TRACEBACK_BYTES: u64 = 1 << 20;
/// Threads kept per stacks file, frames per thread (top first), lines of a traceback (its
/// last ones: the innermost frames and the exception), ring events and open windows per dump.
pub const MAX_THREADS: usize = 256;
pub const MAX_FRAMES: usize = 64;
pub const MAX_TRACEBACK_LINES: usize = 200;
pub const MAX_RING: usize = 256;
pub const MAX_OPEN_WINDOWS: usize = 64;
/// Keys of the hook's free-form state kept, and of an agent record's lists.
pub const MAX_HOOK_KEYS: usize = 64;
pub const MAX_HOST_ITEMS: usize = 256;
/// Any text kept (a frame, a name, a line) is cut to this many bytes, control characters
/// escaped.
pub const MAX_TEXT: usize = 512;
/// The dumps' text kept per job (frames, ring events, traceback lines, the hook's state: the
/// bytes of their strings): a dump past it keeps its facts but not its stacks, ring and
/// traceback (`problems` says so). And the bytes of agent records read per job.
pub const MAX_JOB_TEXT_BYTES: usize = 64 << 20;
pub const MAX_HOST_BYTES: u64 = 64 << 20;
/// Rank rows kept over all incidents; past it an incident keeps only the ranks that dumped
/// and the culprits (`ranks_left_out` counts the rest).
pub const MAX_RANK_ROWS: usize = 100_000;
/// Stall and signal dumps detected within this many seconds of an incident's first one (and of
/// a node not yet in it) are the same incident.
pub const GROUP_S: f64 = 600.0;

/// Everything the report says about hangs and crashes; empty when there were none.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Hangs {
    /// Earliest first.
    pub incidents: Vec<Incident>,
    /// Dump folders past [`MAX_FOLDERS`], not read.
    pub folders_left_out: u64,
}

impl Hangs {
    pub fn is_empty(&self) -> bool {
        self.incidents.is_empty()
    }
}

/// One stall (the stall and signal dumps of the ranks, grouped by time) or one crash (one
/// fatal or exception dump).
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Incident {
    /// `stall`, `signal` (only signal dumps: the job was stopped), `fatal`, `exception`,
    /// `incomplete` (a dump whose `stall.json` could not be read: the evidence says why), or
    /// `timeline_stopped` (no dump: the agent saw the timelines stop while the trainer ran).
    pub kind: String,
    /// The first dump's detection, epoch seconds.
    pub detected_s: f64,
    /// The step that did not end (the highest of the dumps').
    pub step: Option<i64>,
    pub mode: Option<String>,
    /// When every stall of it ended (`ended.json`): the last end, and the longest stall.
    pub ended_s: Option<f64>,
    pub stalled_s: Option<f64>,
    /// Every rank: its last steps and what it was doing.
    pub ranks: Vec<RankState>,
    /// Ranks left out of `ranks` past [`MAX_RANK_ROWS`] (0 normally).
    pub ranks_left_out: u64,
    /// The likely culprit(s): rank names.
    pub culprits: Vec<String>,
    /// `lowest_step`, `outside_collective`, `crashed` or `null` (no rank stands out).
    pub reason: Option<String>,
    /// Sentences saying why.
    pub evidence: Vec<String>,
    /// The blocking call the others share (`outside_collective`).
    pub waiting_in: Option<String>,
    pub dumps: Vec<Dump>,
    /// The agent's records of the host around it.
    pub host: Vec<HostState>,
}

/// One rank at an incident.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct RankState {
    pub rank: String,
    /// The last step that ended before the incident (timeline or the dump's ring).
    pub last_completed_step: Option<i64>,
    /// When it ended, epoch seconds.
    pub last_step_end_s: Option<f64>,
    /// The dump's open step, else `last_completed_step`.
    pub last_begun_step: Option<i64>,
    /// `dump`, `timeline` or `none`.
    pub begun_from: String,
    pub dumped: bool,
    /// The top frame of each of its threads (Python, else native), as in `dumps`.
    pub top_frames: Vec<String>,
    pub culprit: bool,
}

/// One dump folder.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Dump {
    pub node: String,
    /// `framework/hangs/<node>/<folder>`.
    pub folder: String,
    pub kind: String,
    /// Whether `stall.json` was there (a fatal crash may leave only its stacks).
    pub complete: bool,
    pub pid: Option<i64>,
    pub mode: Option<String>,
    pub step: Option<i64>,
    pub step_started_s: Option<f64>,
    pub detected_s: f64,
    pub threshold_s: Option<f64>,
    pub median_step_s: Option<f64>,
    pub last_completed_step: Option<i64>,
    pub signal: Option<String>,
    pub open_windows: Vec<String>,
    pub ring: Vec<RingEvent>,
    /// The hook's own state: `key: value` (JSON) lines.
    pub hook: Vec<String>,
    pub ended_s: Option<f64>,
    pub stalled_s: Option<f64>,
    /// Lines before the first thread of `python_stacks.txt` (`Fatal Python error: …`).
    pub python_notes: Vec<String>,
    pub python: Vec<Thread>,
    pub native: Vec<Thread>,
    /// The last [`MAX_TRACEBACK_LINES`] lines of `traceback.txt`.
    pub traceback: Vec<String>,
    /// What could not be read in it, and what was cut.
    pub problems: Vec<String>,
}

/// One thread of a stacks file.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Thread {
    /// `0x7f…` (Python) or the tid (native).
    pub id: String,
    pub name: Option<String>,
    /// faulthandler's `Current thread` (the one that wrote the dump).
    pub current: bool,
    /// Top (most recent) first: `file:line in function` or `symbol` (`0xip` when unknown).
    pub frames: Vec<String>,
    pub frames_left_out: u64,
}

/// One event of a dump's ring.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct RingEvent {
    pub t_s: f64,
    pub what: String,
    pub name: String,
    pub step: Option<i64>,
}

/// `s` cut to [`MAX_TEXT`] bytes, control characters escaped.
pub fn text(s: &str) -> String {
    crate::read::printable(s, MAX_TEXT)
}

fn us_to_s(v: Option<i64>) -> Option<f64> {
    v.filter(|&u| plausible_us(u)).map(|u| u as f64 / 1e6)
}

fn int(v: &Value, k: &str) -> Option<i64> {
    v.get(k).and_then(Value::as_i64)
}

fn float(v: &Value, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64).filter(|f| f.is_finite())
}

fn string(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(text)
}

/// Fills `d` from `stall.json`'s value; a field of the wrong type is left empty.
pub fn stall_fields(d: &mut Dump, v: &Value) {
    if !v.is_object() {
        d.problems.push("stall.json: not an object".into());
        return;
    }
    if let Some(k) = string(v, dk::KIND)
        && DumpKind::parse(&k).is_some()
    {
        d.kind = k;
    }
    d.pid = int(v, dk::PID);
    d.mode = string(v, dk::MODE);
    if let Some(s) = int(v, dk::STEP) {
        d.step = Some(s);
    }
    d.step_started_s = us_to_s(int(v, dk::STEP_STARTED_US));
    if let Some(t) = us_to_s(int(v, dk::DETECTED_US)) {
        d.detected_s = t;
    }
    d.threshold_s = float(v, dk::THRESHOLD_S);
    d.median_step_s = float(v, dk::MEDIAN_STEP_S);
    d.last_completed_step = int(v, dk::LAST_COMPLETED_STEP);
    d.signal = string(v, dk::SIGNAL);
    if let Some(w) = v.get(dk::OPEN_WINDOWS).and_then(Value::as_array) {
        d.open_windows = w.iter().filter_map(Value::as_str).take(MAX_OPEN_WINDOWS).map(text).collect();
    }
    if let Some(r) = v.get(dk::RING).and_then(Value::as_array) {
        let skip = r.len().saturating_sub(MAX_RING);
        d.ring = r
            .iter()
            .skip(skip)
            .filter_map(|e| {
                Some(RingEvent {
                    t_s: us_to_s(int(e, dk::RING_T_US))?,
                    what: string(e, dk::RING_WHAT)?,
                    name: string(e, dk::NAME).unwrap_or_default(),
                    step: int(e, dk::STEP),
                })
            })
            .collect();
    }
    if let Some(h) = v.get(dk::HOOK).and_then(Value::as_object) {
        d.hook = h
            .iter()
            .take(MAX_HOOK_KEYS)
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => serde_json::to_string(other).unwrap_or_default(),
                };
                text(&format!("{k}: {v}"))
            })
            .collect();
    }
}

/// faulthandler's text: `(notes, threads)`; frames top first.
pub fn parse_python_stacks(s: &str) -> (Vec<String>, Vec<Thread>, u64) {
    let mut notes = Vec::new();
    let mut threads: Vec<Thread> = Vec::new();
    let mut left_out = 0u64;
    let mut in_thread = false;
    for line in s.lines() {
        let t = line.trim();
        let header = t
            .strip_prefix("Current thread ")
            .map(|r| (true, r))
            .or_else(|| t.strip_prefix("Thread ").map(|r| (false, r)))
            .or_else(|| t.starts_with("Stack (most recent call first)").then_some((false, "")));
        if let Some((current, rest)) = header {
            in_thread = threads.len() < MAX_THREADS;
            if !in_thread {
                left_out += 1;
                continue;
            }
            let id = rest.split_whitespace().next().unwrap_or("").trim_end_matches(':');
            threads.push(Thread { id: text(id), current, ..Thread::default() });
            continue;
        }
        if let Some(frame) = t.strip_prefix("File ") {
            if in_thread && let Some(th) = threads.last_mut() {
                if th.frames.len() >= MAX_FRAMES {
                    th.frames_left_out += 1;
                } else {
                    th.frames.push(python_frame(frame));
                }
            }
            continue;
        }
        if t.is_empty() {
            in_thread = false;
            continue;
        }
        if in_thread && t.starts_with('<') {
            // `<no Python frame>`, `<truncated>`.
            if let Some(th) = threads.last_mut()
                && th.frames.len() < MAX_FRAMES
            {
                th.frames.push(text(t));
            }
        } else if !in_thread && notes.len() < 32 {
            notes.push(text(t));
        }
    }
    (notes, threads, left_out)
}

/// `"x.py", line 12 in func` → `x.py:12 in func`.
fn python_frame(f: &str) -> String {
    let parsed = (|| {
        let f = f.strip_prefix('"')?;
        let (file, rest) = f.rsplit_once("\", line ")?;
        let (line, func) = rest.split_once(" in ").unwrap_or((rest, "?"));
        let line = line.trim().trim_end_matches(',');
        Some(format!("{file}:{line} in {}", func.trim()))
    })();
    text(&parsed.unwrap_or_else(|| f.to_owned()))
}

/// `native_stacks.txt`: `thread <tid> <name>` then `  #<i> 0x<ip> <symbol>` lines.
pub fn parse_native_stacks(s: &str) -> (Vec<Thread>, u64) {
    let mut threads: Vec<Thread> = Vec::new();
    let mut left_out = 0u64;
    let mut in_thread = false;
    for line in s.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("thread ") {
            in_thread = threads.len() < MAX_THREADS;
            if !in_thread {
                left_out += 1;
                continue;
            }
            let (id, name) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = name.trim();
            threads.push(Thread {
                id: text(id),
                name: (!name.is_empty()).then(|| text(name)),
                ..Thread::default()
            });
        } else if let Some(rest) = t.strip_prefix('#') {
            let Some(th) = threads.last_mut().filter(|_| in_thread) else { continue };
            if th.frames.len() >= MAX_FRAMES {
                th.frames_left_out += 1;
                continue;
            }
            let mut p = rest.splitn(3, ' ');
            let _index = p.next();
            let ip = p.next().unwrap_or("");
            let sym = p.next().map(str::trim).filter(|s| !s.is_empty() && *s != "??");
            th.frames.push(text(sym.unwrap_or(ip)));
        } else if t.is_empty() {
            in_thread = false;
        } else if t.starts_with('(')
            && let Some(th) = threads.last_mut().filter(|_| in_thread)
            && th.frames.len() < MAX_FRAMES
        {
            // `(did not answer in 200 ms)`: shown, never a frame of its own.
            th.frames.push(text(t));
        }
    }
    (threads, left_out)
}

fn read_text(dir: &Dir, rel: &str, max: u64, d: &mut Dump) -> Option<String> {
    match read::read_file(dir, rel, max) {
        Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
        Err(e) => {
            d.problems.push(text(&e));
            None
        }
    }
}

fn read_json(dir: &Dir, rel: &str, d: &mut Dump) -> Option<Value> {
    let s = read_text(dir, rel, MAX_JSON_BYTES, d)?;
    match serde_json::from_str(&s) {
        Ok(v) => Some(v),
        Err(e) => {
            d.problems.push(format!("{rel}: not JSON (line {}, column {})", e.line(), e.column()));
            None
        }
    }
}

/// Reads one dump folder (`rel` = `framework/hangs/<node>/<folder>`) with the files `has`.
pub fn read_dump(dir: &Dir, node: &str, folder: &str, has: &BTreeSet<String>) -> Option<Dump> {
    let (step, us) = parse_folder(folder)?;
    let rel = format!("{}/{folder}", dk::node_dir(node));
    let mut d = Dump {
        node: text(node),
        folder: text(&rel),
        kind: DumpKind::Fatal.as_str().into(),
        step: Some(step),
        detected_s: us as f64 / 1e6,
        ..Dump::default()
    };
    if has.contains(dk::STALL_FILE) {
        // A `stall.json` that cannot be read is no crash: the dump is incomplete, and says why.
        let v = read::read_file(dir, &format!("{rel}/{}", dk::STALL_FILE), MAX_JSON_BYTES)
            .map_err(|e| text(&e))
            .and_then(|b| stall_value(&b));
        match v {
            Ok(v) => {
                d.complete = true;
                d.kind = DumpKind::Stall.as_str().into();
                stall_fields(&mut d, &v);
            }
            Err(why) => {
                d.kind = "incomplete".into();
                d.problems.push(why);
            }
        }
    } else if !has.contains(dk::PYTHON_STACKS_FILE) {
        // Not complete yet, and no crash's stacks: a dump being written.
        return None;
    }
    if has.contains(dk::ENDED_FILE)
        && let Some(v) = read_json(dir, &format!("{rel}/{}", dk::ENDED_FILE), &mut d)
    {
        d.ended_s = us_to_s(int(&v, dk::ENDED_US));
        d.stalled_s = float(&v, dk::STALLED_S).filter(|s| *s >= 0.0);
    }
    if has.contains(dk::PYTHON_STACKS_FILE)
        && let Some(s) =
            read_text(dir, &format!("{rel}/{}", dk::PYTHON_STACKS_FILE), MAX_STACKS_BYTES, &mut d)
    {
        let (notes, threads, left) = parse_python_stacks(&s);
        d.python_notes = notes;
        d.python = threads;
        if left > 0 {
            d.problems
                .push(format!("{}: {left} threads past {MAX_THREADS} left out", dk::PYTHON_STACKS_FILE));
        }
    }
    if has.contains(dk::NATIVE_STACKS_FILE)
        && let Some(s) =
            read_text(dir, &format!("{rel}/{}", dk::NATIVE_STACKS_FILE), MAX_STACKS_BYTES, &mut d)
    {
        let (threads, left) = parse_native_stacks(&s);
        d.native = threads;
        if left > 0 {
            d.problems
                .push(format!("{}: {left} threads past {MAX_THREADS} left out", dk::NATIVE_STACKS_FILE));
        }
    }
    if has.contains(dk::TRACEBACK_FILE)
        && let Some(s) = read_text(dir, &format!("{rel}/{}", dk::TRACEBACK_FILE), MAX_TRACEBACK_BYTES, &mut d)
    {
        let lines: Vec<&str> = s.lines().collect();
        let skip = lines.len().saturating_sub(MAX_TRACEBACK_LINES);
        d.traceback = lines[skip..].iter().map(|l| text(l)).collect();
        if skip > 0 {
            d.problems.push(format!("{}: its first {skip} lines left out", dk::TRACEBACK_FILE));
        }
    }
    Some(d)
}

/// The files of a dump folder that are read.
pub const DUMP_FILES: [&str; 5] =
    [dk::STALL_FILE, dk::PYTHON_STACKS_FILE, dk::NATIVE_STACKS_FILE, dk::TRACEBACK_FILE, dk::ENDED_FILE];

/// Every dump folder under `framework/hangs/`, at most [`MAX_FOLDERS`]: `(dumps, left out)`.
pub fn read_dumps(dir: &Dir, skipped: &mut Skipped) -> (Vec<Dump>, u64) {
    let want = |name: &str, is_dir: bool| {
        if is_dir { !name.starts_with('.') } else { DUMP_FILES.contains(&name) }
    };
    let w = ofs::walk(dir, dk::HANGS_DIR, &want);
    for r in w.refused {
        // The Python windows' walk of `framework/` may have met these links too.
        if !skipped.0.contains(&r) {
            skipped.push(r);
        }
    }
    let mut found: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (rel, _) in w.files {
        if skipped.1.contains(&rel) {
            continue;
        }
        let parts: Vec<&str> = rel.split('/').collect();
        let [_, _, node, folder, file] = parts.as_slice() else { continue };
        found.entry(((*node).to_owned(), (*folder).to_owned())).or_default().insert((*file).to_owned());
    }
    let left = found.len().saturating_sub(MAX_FOLDERS) as u64;
    if left > 0 {
        skipped.push(format!("{}: more than {MAX_FOLDERS} dump folders; {left} not read", dk::HANGS_DIR));
    }
    let mut out = Vec::new();
    let mut text_bytes = 0usize;
    for ((node, folder), has) in found.into_iter().take(MAX_FOLDERS) {
        if let Some(mut d) = read_dump(dir, &node, &folder, &has) {
            let size = dump_text_bytes(&d);
            if text_bytes + size > MAX_JOB_TEXT_BYTES {
                d.python.clear();
                d.native.clear();
                d.ring.clear();
                d.traceback.clear();
                d.hook.clear();
                d.python_notes.clear();
                d.problems.push(format!(
                    "its stacks, ring and traceback left out: the report keeps at most {MAX_JOB_TEXT_BYTES} bytes of dump text per job"
                ));
            } else {
                text_bytes += size;
            }
            out.push(d);
        }
    }
    (out, left)
}

/// The bytes of a dump's variable text.
fn dump_text_bytes(d: &Dump) -> usize {
    let threads = |ts: &[Thread]| -> usize {
        ts.iter()
            .map(|t| {
                t.id.len()
                    + t.name.as_ref().map_or(0, String::len)
                    + t.frames.iter().map(String::len).sum::<usize>()
            })
            .sum()
    };
    threads(&d.python)
        + threads(&d.native)
        + d.ring.iter().map(|e| e.what.len() + e.name.len() + 16).sum::<usize>()
        + [&d.traceback, &d.hook, &d.python_notes, &d.open_windows]
            .iter()
            .flat_map(|v| v.iter())
            .map(String::len)
            .sum::<usize>()
}

/// Every agent record under `system/hangs/<node>/*.json`, at most [`MAX_HOST_FILES`].
pub fn read_host_states(dir: &Dir, skipped: &mut Skipped) -> Vec<HostState> {
    let want = |name: &str, is_dir: bool| !name.starts_with('.') && (is_dir || name.ends_with(".json"));
    let w = ofs::walk(dir, host_record::HOST_DIR, &want);
    for r in w.refused {
        skipped.push(r);
    }
    let mut out = Vec::new();
    let mut read_bytes = 0u64;
    for (rel, _) in w.files.into_iter().take(MAX_HOST_FILES) {
        if skipped.1.contains(&rel) || rel.split('/').count() != 4 {
            continue;
        }
        let bytes = match read::read_file(dir, &rel, MAX_JSON_BYTES) {
            Ok(b) => b,
            Err(e) => {
                skipped.push(e);
                continue;
            }
        };
        read_bytes += bytes.len() as u64;
        if read_bytes > MAX_HOST_BYTES {
            skipped.push(format!(
                "{}: more than {MAX_HOST_BYTES} bytes of host records; the rest not read",
                host_record::HOST_DIR
            ));
            break;
        }
        match serde_json::from_slice::<HostState>(&bytes) {
            Ok(h) => out.push(bound_host(h)),
            Err(e) => {
                skipped.push(format!("{rel}: not a host record (line {}, column {})", e.line(), e.column()))
            }
        }
    }
    out
}

/// `h` with every list and text cut to the caps.
fn bound_host(mut h: HostState) -> HostState {
    h.node = text(&h.node);
    h.trigger = text(&h.trigger);
    h.folder = h.folder.map(|f| text(&f));
    h.trainer_cpu_state = text(&h.trainer_cpu_state);
    h.samples.truncate(MAX_HOST_ITEMS);
    for s in &mut h.samples {
        for m in [&mut s.gpu_processes, &mut s.gpu_errors, &mut s.pressure] {
            while m.len() > MAX_HOST_ITEMS {
                m.pop_last();
            }
            *m = std::mem::take(m).into_iter().map(|(k, v)| (text(&k), v)).collect();
        }
        while s.gpus.len() > MAX_HOST_ITEMS {
            s.gpus.pop_last();
        }
        s.gpus = std::mem::take(&mut s.gpus).into_iter().map(|(k, v)| (text(&k), v)).collect();
    }
    while h.trainer_threads.len() > MAX_HOST_ITEMS {
        h.trainer_threads.pop_last();
    }
    h.trainer_threads =
        std::mem::take(&mut h.trainer_threads).into_iter().map(|(k, v)| (text(&k), v)).collect();
    h.busy_threads.truncate(MAX_HOST_ITEMS);
    for t in &mut h.busy_threads {
        t.name = text(&t.name);
        t.state = text(&t.state);
    }
    h
}

/// The top frames of a dump's threads that say where it waits: Python threads' top frames
/// (not faulthandler's current thread, which wrote the dump, nor the hook's own threads),
/// else the native threads'.
pub fn top_frames(d: &Dump) -> Vec<String> {
    let hook = |f: &str| f.contains("trainprof/") || f.contains("trainprof\\");
    let py: Vec<String> = d
        .python
        .iter()
        .filter(|t| !t.current)
        .filter_map(|t| t.frames.first())
        // faulthandler's markers (`<no Python frame>`) are no frames; `<string>:10 in …` is.
        .filter(|f| !hook(f) && (!f.starts_with('<') || f.contains(':')))
        .cloned()
        .collect();
    if !py.is_empty() {
        return dedup(py);
    }
    dedup(
        d.native
            .iter()
            .filter(|t| !t.name.as_deref().is_some_and(|n| n.starts_with("trainprof")))
            .filter_map(|t| t.frames.first())
            .filter(|f| !f.starts_with('('))
            .cloned()
            .collect(),
    )
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

/// The steps of `mode` per rank ([`crate::collect::Agg::steps`]).
pub type Steps = BTreeMap<String, BTreeMap<String, Vec<StepRec>>>;

/// Per mode and rank, the steps' `(end µs, step)` sorted: an incident's last completed step
/// per rank is one binary search, not a pass over every step.
type Ends = BTreeMap<String, BTreeMap<String, Vec<(i64, i64)>>>;

fn ends(steps: &Steps) -> Ends {
    steps
        .iter()
        .map(|(mode, ranks)| {
            let per = ranks
                .iter()
                .map(|(rank, recs)| {
                    let mut v: Vec<(i64, i64)> =
                        recs.iter().map(|s| (s.start_us.saturating_add(s.dur_us), s.step)).collect();
                    v.sort_unstable();
                    (rank.clone(), v)
                })
                .collect();
            (mode.clone(), per)
        })
        .collect()
}

/// The dumps grouped into incidents, each judged against the ranks' steps.
pub fn incidents(mut dumps: Vec<Dump>, host: Vec<HostState>, steps: &Steps) -> Vec<Incident> {
    dumps.sort_by(|a, b| a.detected_s.total_cmp(&b.detected_s).then(a.node.cmp(&b.node)));
    let mut out: Vec<Incident> = Vec::new();
    let mut open: Option<usize> = None;
    for d in dumps {
        let stall = matches!(d.kind.as_str(), "stall" | "signal");
        let joins = open.filter(|&i| {
            let inc: &Incident = &out[i];
            stall && d.detected_s - inc.detected_s <= GROUP_S && !inc.dumps.iter().any(|x| x.node == d.node)
        });
        if let Some(i) = joins {
            let inc = &mut out[i];
            if inc.kind != d.kind {
                inc.kind = "stall".into();
            }
            inc.dumps.push(d);
            continue;
        }
        let inc = Incident {
            kind: d.kind.clone(),
            detected_s: d.detected_s,
            dumps: vec![d],
            ..Incident::default()
        };
        out.push(inc);
        open = stall.then_some(out.len() - 1);
    }
    let steps = &ends(steps);
    // Rank rows are trimmed as each incident is judged, so that many incidents of many ranks
    // never hold more than the cap at once.
    let mut rows = 0usize;
    let mut trim = |inc: &mut Incident| {
        if rows + inc.ranks.len() > MAX_RANK_ROWS {
            let before = inc.ranks.len();
            inc.ranks.retain(|r| r.dumped || r.culprit);
            inc.ranks_left_out = (before - inc.ranks.len()) as u64;
        }
        rows += inc.ranks.len();
    };
    for inc in &mut out {
        finish(inc, steps);
        trim(inc);
    }
    // The agent's records: joined to a dump's incident by folder, else to the nearest within
    // GROUP_S; a `timeline_stopped` record near none is an incident of its own.
    let mut host = host;
    host.sort_by_key(|h| h.detected_us);
    let mut stopped: Vec<Incident> = Vec::new();
    for h in host {
        let t = h.detected_us as f64 / 1e6;
        let by_folder = h.folder.as_ref().and_then(|f| {
            let rel = format!("{}/{f}", dk::HANGS_DIR);
            out.iter().position(|i| i.dumps.iter().any(|d| d.folder == rel))
        });
        let near = || {
            out.iter()
                .enumerate()
                .filter(|(_, i)| (t - i.detected_s).abs() <= GROUP_S)
                .min_by(|a, b| (t - a.1.detected_s).abs().total_cmp(&(t - b.1.detected_s).abs()))
                .map(|(k, _)| k)
        };
        if let Some(k) = by_folder.or_else(near) {
            if out[k].host.len() < MAX_HOST_ITEMS {
                out[k].host.push(h);
            }
        } else if h.trigger == host_record::TRIGGER_TIMELINE_STOPPED && plausible_us(h.detected_us) {
            match stopped.last_mut() {
                Some(i) if t - i.detected_s <= GROUP_S => {
                    if i.host.len() < MAX_HOST_ITEMS {
                        i.host.push(h);
                    }
                }
                _ => stopped.push(Incident {
                    kind: "timeline_stopped".into(),
                    detected_s: t,
                    host: vec![h],
                    ..Incident::default()
                }),
            }
        }
    }
    for mut inc in stopped {
        finish(&mut inc, steps);
        trim(&mut inc);
        out.push(inc);
    }
    out.sort_by(|a, b| a.detected_s.total_cmp(&b.detected_s));
    out
}

/// The step, mode, end and ranks of an incident, and its judgement.
fn finish(inc: &mut Incident, steps: &Ends) {
    inc.step = inc.dumps.iter().filter_map(|d| d.step).max();
    inc.mode = inc.dumps.iter().find_map(|d| d.mode.clone());
    let stalls: Vec<&Dump> = inc.dumps.iter().filter(|d| d.kind == "stall").collect();
    if !stalls.is_empty() && stalls.iter().all(|d| d.ended_s.is_some()) {
        inc.ended_s = stalls.iter().filter_map(|d| d.ended_s).reduce(f64::max);
        inc.stalled_s = stalls.iter().filter_map(|d| d.stalled_s).reduce(f64::max);
    }
    // The steps of the incident's mode (`train` → `TRAIN`), else of every mode.
    let mode = inc.mode.as_ref().map(|m| m.to_ascii_uppercase());
    let chosen: Vec<&BTreeMap<String, Vec<(i64, i64)>>> = match mode.as_ref().and_then(|m| steps.get(m)) {
        Some(r) => vec![r],
        None => steps.values().collect(),
    };
    let until_us = (inc.dumps.iter().map(|d| d.detected_s).fold(inc.detected_s, f64::max) * 1e6) as i64;
    let mut ranks: BTreeMap<String, RankState> = BTreeMap::new();
    for per_rank in chosen {
        for (rank, ends) in per_rank {
            // The last (end, step) with end ≤ until.
            let n = ends.partition_point(|&(end, _)| end <= until_us);
            let r = ranks
                .entry(rank.clone())
                .or_insert_with(|| RankState { rank: rank.clone(), ..RankState::default() });
            if let Some(&(end_us, step)) = n.checked_sub(1).map(|i| &ends[i]) {
                let end = end_us as f64 / 1e6;
                if r.last_step_end_s.is_none_or(|e| e < end) {
                    r.last_step_end_s = Some(end);
                    r.last_completed_step = Some(step);
                }
            }
        }
    }
    for d in &inc.dumps {
        let r = ranks
            .entry(d.node.clone())
            .or_insert_with(|| RankState { rank: d.node.clone(), ..RankState::default() });
        r.dumped = true;
        let ring_end = d.ring.iter().filter(|e| e.what == "step_end").filter_map(|e| e.step).max();
        let from_dump = d.last_completed_step.into_iter().chain(ring_end).max();
        if let Some(s) = from_dump
            && r.last_completed_step.is_none_or(|c| c < s)
        {
            r.last_completed_step = Some(s);
        }
        r.last_begun_step = d.step.or(r.last_begun_step);
        r.begun_from = "dump".into();
        r.top_frames = top_frames(d);
    }
    for r in ranks.values_mut() {
        if r.begun_from.is_empty() {
            r.last_begun_step = r.last_completed_step;
            r.begun_from = if r.last_begun_step.is_some() { "timeline" } else { "none" }.into();
        }
    }
    inc.ranks = ranks.into_values().collect();
    if matches!(inc.kind.as_str(), "fatal" | "exception") {
        let node = inc.dumps[0].node.clone();
        for r in &mut inc.ranks {
            r.culprit = r.rank == node;
        }
        inc.culprits = vec![node.clone()];
        inc.reason = Some("crashed".into());
        let what = if inc.kind == "fatal" {
            inc.dumps[0].signal.clone().map_or("a fatal error".to_owned(), |s| format!("a fatal {s}"))
        } else {
            "an uncaught exception".to_owned()
        };
        inc.evidence = vec![format!("{node} died of {what} in step {}.", step_text(inc.step))];
        return;
    }
    if inc.kind == "incomplete" {
        let d = &inc.dumps[0];
        let why = d.problems.first().map_or("its stall.json could not be read", String::as_str);
        inc.evidence =
            vec![format!("The dump in {} is incomplete, so nothing is judged from it: {why}.", d.folder)];
        return;
    }
    let mut j = judge(&mut inc.ranks);
    if inc.kind == "signal" && j.reason.as_deref() == Some("lowest_step") && !behind_long(inc) {
        // Stopped by a signal with no stall: ranks a step apart are the usual skew.
        for r in &mut inc.ranks {
            r.culprit = false;
        }
        let begun: Vec<i64> = inc.ranks.iter().filter_map(|r| r.last_begun_step).collect();
        let (lo, hi) = (begun.iter().min().copied(), begun.iter().max().copied());
        j = Judgement {
            evidence: vec![format!(
                "The job was stopped by a signal with the ranks at steps {}..{}, every one of them busy within the last {} s: the usual skew, no rank stands out.",
                step_text(lo),
                step_text(hi),
                crate::read::readable(signal_idle_s(inc), None)
            )],
            ..Judgement::default()
        };
    }
    inc.culprits = j.culprits;
    inc.reason = j.reason;
    inc.evidence = j.evidence;
    inc.waiting_in = j.waiting_in;
}

/// How long a rank must have been idle (its step open, or no step since its last one) at a
/// signal for the lowest step to mean it is behind: 10 median steps, at least 1 s.
fn signal_idle_s(inc: &Incident) -> f64 {
    let median = inc.dumps.iter().find_map(|d| d.median_step_s).unwrap_or(0.0);
    (10.0 * median).max(1.0)
}

/// Whether every culprit of a signal incident had been idle for [`signal_idle_s`].
fn behind_long(inc: &Incident) -> bool {
    let least = signal_idle_s(inc);
    inc.ranks.iter().filter(|r| r.culprit).all(|r| {
        let since = inc
            .dumps
            .iter()
            .find(|d| d.node == r.rank)
            .map(|d| d.step_started_s.map(|s| d.detected_s - s))
            .unwrap_or_else(|| r.last_step_end_s.map(|e| inc.detected_s - e));
        since.is_some_and(|s| s >= least)
    })
}

fn step_text(s: Option<i64>) -> String {
    s.map_or("–".to_owned(), |s| s.to_string())
}

/// What [`judge`] found.
#[derive(Debug, Default, PartialEq)]
pub struct Judgement {
    pub culprits: Vec<String>,
    pub reason: Option<String>,
    pub evidence: Vec<String>,
    pub waiting_in: Option<String>,
}

/// Names the rank(s) the others wait for, and marks them in `ranks`.
pub fn judge(ranks: &mut [RankState]) -> Judgement {
    let mut j = Judgement::default();
    let begun: Vec<i64> = ranks.iter().filter_map(|r| r.last_begun_step).collect();
    let (Some(&lo), Some(&hi)) = (begun.iter().min(), begun.iter().max()) else {
        j.evidence.push("No rank's steps are known: no rank can be named.".into());
        return j;
    };
    if lo < hi {
        let ahead = begun.iter().filter(|&&b| b > lo).count();
        for r in ranks.iter_mut().filter(|r| r.last_begun_step == Some(lo)) {
            r.culprit = true;
            j.culprits.push(r.rank.clone());
            let how = match (r.dumped, r.last_step_end_s) {
                (true, _) => format!("its dump is in step {lo}"),
                (false, Some(t)) => format!(
                    "no step begun after step {lo} (its timeline's last step ended at {}; it left no dump)",
                    utc_time(t)
                ),
                (false, None) => format!("its last step is {lo} and it left no dump"),
            };
            j.evidence.push(format!("{}: last begun step {lo}: {how}.", r.rank));
        }
        j.evidence.push(format!(
            "{ahead} other rank(s) began step {}{}.",
            if ranks
                .iter()
                .filter(|r| r.last_begun_step.is_some_and(|b| b > lo))
                .all(|r| r.last_begun_step == Some(hi))
            {
                hi.to_string()
            } else {
                format!("{}..{hi}", lo + 1)
            },
            waiting_sentence(ranks)
        ));
        j.reason = Some("lowest_step".into());
        return j;
    }
    // Every rank at the same step: the dumped ranks not inside the call the others share.
    let dumped: Vec<usize> =
        (0..ranks.len()).filter(|&i| ranks[i].dumped && !ranks[i].top_frames.is_empty()).collect();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for &i in &dumped {
        for f in &ranks[i].top_frames {
            *count.entry(f.as_str()).or_default() += 1;
        }
    }
    let shared = count.iter().filter(|(_, n)| **n >= 2 && **n < dumped.len()).max_by_key(|(_, n)| **n);
    if let Some((frame, n)) = shared {
        let frame = (*frame).to_owned();
        let n = *n;
        for &i in &dumped {
            if !ranks[i].top_frames.contains(&frame) {
                let r = &mut ranks[i];
                r.culprit = true;
                j.culprits.push(r.rank.clone());
                j.evidence.push(format!(
                    "{}: in step {lo} like the others, but not in {frame}: its threads are in {}.",
                    r.rank,
                    r.top_frames.join("; ")
                ));
            }
        }
        j.evidence.push(format!("{n} rank(s) wait in {frame}."));
        j.reason = Some("outside_collective".into());
        j.waiting_in = Some(frame);
        return j;
    }
    j.evidence.push(format!(
        "Every rank's last begun step is {lo}, and no rank's stacks differ from the others': no rank stands out."
    ));
    j
}

fn waiting_sentence(ranks: &[RankState]) -> String {
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for r in ranks.iter().filter(|r| r.dumped && !r.culprit) {
        for f in &r.top_frames {
            *count.entry(f.as_str()).or_default() += 1;
        }
    }
    match count.into_iter().max_by_key(|(_, n)| *n) {
        Some((f, n)) => format!(" and wait for it ({n} in {f})"),
        None => String::new(),
    }
}

/// `t` (epoch seconds) as `HH:MM:SS.mmm UTC`.
pub fn utc_time(t: f64) -> String {
    let ms = (t * 1000.0).round() as i64;
    let day_ms = ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03} UTC",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

/// Reads the dumps and the agent's records under `dir` and judges them with `steps`.
pub fn read(dir: &Dir, steps: &Steps, skipped: &mut Skipped) -> Hangs {
    let (dumps, folders_left_out) = read_dumps(dir, skipped);
    let host = read_host_states(dir, skipped);
    Hangs { incidents: incidents(dumps, host, steps), folders_left_out }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(name: &str, begun: Option<i64>, dumped: bool, frames: &[&str]) -> RankState {
        RankState {
            rank: name.into(),
            last_completed_step: begun,
            last_step_end_s: Some(1_795_400_000.0),
            last_begun_step: begun,
            begun_from: if dumped { "dump" } else { "timeline" }.into(),
            dumped,
            top_frames: frames.iter().map(|f| (*f).to_owned()).collect(),
            culprit: false,
        }
    }

    #[test]
    fn the_lowest_last_begun_step_is_the_culprit() {
        let mut r = vec![
            rank("0-a", Some(30), true, &["t.py:20 in wait"]),
            rank("1-a", Some(29), false, &[]),
            rank("2-a", Some(30), true, &["t.py:20 in wait"]),
        ];
        let j = judge(&mut r);
        assert_eq!(j.culprits, ["1-a"]);
        assert_eq!(j.reason.as_deref(), Some("lowest_step"));
        assert!(r[1].culprit && !r[0].culprit && !r[2].culprit);
        assert!(
            j.evidence[0].contains("last begun step 29") && j.evidence[0].contains("no dump"),
            "{:?}",
            j.evidence
        );
        assert!(j.evidence[1].contains("2 in t.py:20 in wait"), "{:?}", j.evidence);
    }

    #[test]
    fn at_one_step_the_rank_outside_the_shared_call_is_the_culprit() {
        let mut r = vec![
            rank("0-a", Some(30), true, &["dist.py:10 in all_reduce", "loader.py:5 in get"]),
            rank("1-a", Some(30), true, &["model.py:77 in forward"]),
            rank("2-a", Some(30), true, &["dist.py:10 in all_reduce"]),
        ];
        let j = judge(&mut r);
        assert_eq!(j.culprits, ["1-a"]);
        assert_eq!(j.reason.as_deref(), Some("outside_collective"));
        assert_eq!(j.waiting_in.as_deref(), Some("dist.py:10 in all_reduce"));
        assert!(j.evidence[0].contains("model.py:77 in forward"));
        // All in the same call, or no shared call: nobody.
        let mut same = vec![rank("0-a", Some(3), true, &["x"]), rank("1-a", Some(3), true, &["x"])];
        assert!(judge(&mut same).culprits.is_empty());
        let mut two = vec![rank("0-a", Some(3), true, &["x"]), rank("1-a", Some(3), true, &["y"])];
        assert!(judge(&mut two).culprits.is_empty());
        let mut none: Vec<RankState> = vec![rank("0-a", None, false, &[])];
        assert!(judge(&mut none).culprits.is_empty());
    }

    #[test]
    fn python_and_native_stacks_parse_top_first() {
        let py = "Fatal Python error: Segmentation fault\n\nThread 0x00007f01 (most recent call first):\n  File \"/x/trainprof/watch.py\", line 9 in run\n\nCurrent thread 0x00007f00 (most recent call first):\n  File \"t.py\", line 20 in step\n  File \"t.py\", line 40 in <module>\n";
        let (notes, th, left) = parse_python_stacks(py);
        assert_eq!(notes, ["Fatal Python error: Segmentation fault"]);
        assert_eq!(left, 0);
        assert_eq!(th.len(), 2);
        assert_eq!(th[1].id, "0x00007f00");
        assert!(th[1].current && !th[0].current);
        assert_eq!(th[1].frames, ["t.py:20 in step", "t.py:40 in <module>"]);
        let nat = "thread 11 python3\n  #0 0x7f00 read\n  #1 0x7f01 ??\n\nthread 12 trainprof-watch\n  #0 0x7f02 futex_wait\n\nthread 13 worker\n  (did not answer in 200 ms)\n\n(3 more threads not shown)\n";
        let (th, _) = parse_native_stacks(nat);
        assert_eq!(th[0].frames, ["read", "0x7f01"]);
        assert_eq!(th[2].frames, ["(did not answer in 200 ms)"]);
        assert_eq!(th[1].name.as_deref(), Some("trainprof-watch"));
        let d = Dump { native: th, ..Dump::default() };
        assert_eq!(top_frames(&d), ["read"]);
        // Huge: threads and frames are capped.
        let mut big = String::new();
        for i in 0..(MAX_THREADS + 5) {
            big += &format!("Thread 0x{i:x} (most recent call first):\n");
            for _ in 0..(MAX_FRAMES + 3) {
                big += &format!("  File \"{}\", line 1 in f\n", "a".repeat(2000));
            }
            big += "\n";
        }
        let (_, th, left) = parse_python_stacks(&big);
        assert_eq!((th.len(), left), (MAX_THREADS, 5));
        assert_eq!(th[0].frames.len(), MAX_FRAMES);
        assert_eq!(th[0].frames_left_out, 3);
        assert!(th[0].frames[0].len() <= MAX_TEXT + 3);
    }

    fn put(root: &std::path::Path, rel: &str, body: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }

    const T: i64 = 1_795_400_100_000_000;

    #[test]
    fn a_stall_json_that_cannot_be_read_makes_an_incomplete_dump_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let nan = format!(
            r#"{{"version": 1, "kind": "stall", "pid": 7, "step": 3, "detected_us": {T}, "threshold_s": NaN}}"#
        );
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        let big = format!(r#"{{"kind": "stall", "pad": "{}"}}"#, "x".repeat(MAX_JSON_BYTES as usize));
        let cases: [(&str, &str, &str); 5] = [
            ("0-a", &nan, "not JSON"),
            ("1-a", &deep, "nested too deep"),
            ("2-a", &big, "more than"),
            ("3-a", "[1, 2]", "not an object"),
            ("4-a", r#"{"kind": "stall", "step": "#, "ends early"),
        ];
        for (k, (node, body, _)) in cases.iter().enumerate() {
            // Hours apart: an incident each.
            put(r, &format!("framework/hangs/{node}/3-{}/stall.json", T + k as i64 * 3_600_000_000), body);
        }
        let dir = Dir::open_root(r, false).unwrap();
        let mut skipped = Skipped::default();
        let h = read(&dir, &BTreeMap::new(), &mut skipped);
        assert_eq!(h.incidents.len(), cases.len(), "{:#?}", h.incidents);
        for (i, (_, _, why)) in h.incidents.iter().zip(cases) {
            assert_eq!(i.kind, "incomplete");
            assert_eq!(i.dumps[0].kind, "incomplete");
            assert!(!i.dumps[0].complete);
            assert!(i.culprits.is_empty() && i.reason.is_none(), "{i:#?}");
            assert!(
                i.evidence[0].contains("is incomplete") && i.evidence[0].contains(why),
                "{:?}",
                i.evidence
            );
        }
        let mut page = String::new();
        crate::page_hangs::section(&mut page, &h);
        assert!(page.contains("Incomplete dump") && !page.contains("Crash"), "{page}");
    }

    #[test]
    fn dumps_and_timelines_make_one_judged_incident() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let f0 = format!("framework/hangs/0-a/30-{T}");
        put(
            r,
            &format!("{f0}/python_stacks.txt"),
            "Thread 0x1 (most recent call first):\n  File \"t.py\", line 20 in wait_peer\n",
        );
        put(
            r,
            &format!("{f0}/stall.json"),
            &format!(
                r#"{{"version": 1, "kind": "stall", "node": "0-a", "pid": 7, "mode": "train", "step": 30, "step_started_us": {}, "detected_us": {T}, "threshold_s": 5.0, "median_step_s": 0.01, "last_completed_step": 29, "signal": null, "ring": [{{"t_us": {}, "what": "step_start", "name": "Step", "step": 30}}, {{"t_us": "x"}}], "open_windows": ["<b>w</b>", 3], "hook": {{"a": 1, "b": "<script>"}}}}"#,
                T - 5_000_000,
                T - 5_000_000
            ),
        );
        put(
            r,
            &format!("{f0}/ended.json"),
            &format!(r#"{{"ended_us": {}, "stalled_s": 12.5}}"#, T + 7_500_000),
        );
        // Garbage everywhere in a second rank's dump of another step, far later: its own incident.
        let f1 = format!("framework/hangs/1-a/40-{}", T + 10_000_000_000);
        put(
            r,
            &format!("{f1}/stall.json"),
            r#"{"kind": 5, "pid": "x", "step": [], "detected_us": -1, "ring": {}, "open_windows": "no"}"#,
        );
        // Not complete, no stacks: being written, not read. A folder name that is not one.
        put(r, &format!("framework/hangs/1-a/41-{T}/native_stacks.txt"), "thread 1 x\n");
        put(r, "framework/hangs/1-a/nonsense/stall.json", "{}");
        // A fatal crash without stall.json.
        put(
            r,
            &format!("framework/hangs/2-a/12-{}/python_stacks.txt", T + 20_000_000_000),
            "Fatal Python error: Segmentation fault\n\nCurrent thread 0x9 (most recent call first):\n  File \"c.py\", line 3 in boom\n",
        );
        // A host record joined by folder, and garbage.
        put(
            r,
            "system/hangs/0-a/x.json",
            &format!(
                r#"{{"node": "0-a", "trigger": "dump", "folder": "0-a/30-{T}", "detected_us": {T}, "trainer_cpu_state": "asleep", "trainer_threads": {{"S": 4}}}}"#
            ),
        );
        put(r, "system/hangs/0-a/y.json", "[1,2");
        // A link is refused, not followed.
        std::os::unix::fs::symlink("/etc/passwd", r.join(format!("{f0}/traceback.txt"))).unwrap();
        let dir = Dir::open_root(r, false).unwrap();
        let mut steps: Steps = BTreeMap::new();
        let mut ranks = BTreeMap::new();
        let recs = |n: i64| {
            (0..n)
                .map(|i| StepRec { start_us: T - 9_000_000 + i * 10_000, dur_us: 10_000, step: i })
                .collect::<Vec<_>>()
        };
        ranks.insert("0-a".to_owned(), recs(30));
        ranks.insert("1-a".to_owned(), recs(25));
        steps.insert("TRAIN".to_owned(), ranks);
        let mut skipped = Skipped::default();
        let h = read(&dir, &steps, &mut skipped);
        assert_eq!(h.incidents.len(), 3, "{:#?}", h.incidents);
        let i = &h.incidents[0];
        assert_eq!(i.kind, "stall");
        assert_eq!(i.step, Some(30));
        assert_eq!(i.stalled_s, Some(12.5));
        assert_eq!(i.culprits, ["1-a"]);
        let r1 = i.ranks.iter().find(|r| r.rank == "1-a").unwrap();
        assert_eq!(
            (r1.last_completed_step, r1.last_begun_step, r1.begun_from.as_str()),
            (Some(24), Some(24), "timeline")
        );
        let d = &i.dumps[0];
        assert_eq!((d.pid, d.ring.len(), d.open_windows.len()), (Some(7), 1, 1));
        assert_eq!(d.hook, ["a: 1", "b: <script>"]);
        assert_eq!(i.host.len(), 1);
        assert_eq!(i.host[0].trainer_cpu_state, "asleep");
        assert!(skipped.0.iter().any(|s| s.contains("traceback.txt")), "{:?}", skipped.0);
        assert!(skipped.0.iter().any(|s| s.contains("y.json")), "{:?}", skipped.0);
        let g = &h.incidents[1];
        assert_eq!((g.dumps[0].pid, g.dumps[0].step, g.dumps[0].kind.as_str()), (None, Some(40), "stall"));
        let c = &h.incidents[2];
        assert_eq!(c.kind, "fatal");
        assert!(!c.dumps[0].complete);
        assert_eq!(c.culprits, ["2-a"]);
        assert_eq!(c.dumps[0].python[0].frames, ["c.py:3 in boom"]);
        // The page keeps it text.
        let mut page = String::new();
        crate::page_hangs::section(&mut page, &h);
        assert!(page.contains("&lt;script&gt;") && !page.contains("<script>"));
        assert!(page.contains("&lt;b&gt;w&lt;/b&gt;"));
    }

    #[test]
    fn too_many_folders_are_counted_not_read() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..(MAX_FOLDERS + 3) {
            put(dir.path(), &format!("framework/hangs/0-a/{i}-{T}/python_stacks.txt"), "");
        }
        let d = Dir::open_root(dir.path(), false).unwrap();
        let mut skipped = Skipped::default();
        let (dumps, left) = read_dumps(&d, &mut skipped);
        assert_eq!((dumps.len(), left), (MAX_FOLDERS, 3));
    }

    #[test]
    fn the_jobs_dump_text_and_the_page_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        // 256 threads × 30 frames × ~500 bytes ≈ 3.7 MiB a folder: the 18th folder is past the
        // job's 64 MiB.
        let mut big = String::new();
        for i in 0..MAX_THREADS {
            big += &format!("Thread 0x{i:x} (most recent call first):\n");
            for _ in 0..30 {
                big += &format!("  File \"{}\", line 1 in f\n", "a".repeat(480));
            }
            big += "\n";
        }
        assert!(big.len() as u64 <= MAX_STACKS_BYTES);
        for k in 0..20 {
            put(dir.path(), &format!("framework/hangs/{k}-a/1-{T}/python_stacks.txt"), &big);
        }
        let d = Dir::open_root(dir.path(), false).unwrap();
        let mut skipped = Skipped::default();
        let h = read(&d, &Steps::new(), &mut skipped);
        let dumps: Vec<&Dump> = h.incidents.iter().flat_map(|i| &i.dumps).collect();
        assert_eq!(dumps.len(), 20);
        let kept: usize = dumps.iter().map(|d| dump_text_bytes(d)).sum();
        assert!(kept <= MAX_JOB_TEXT_BYTES, "{kept}");
        assert!(
            dumps.iter().any(|d| d.python.is_empty() && d.problems.iter().any(|p| p.contains("left out")))
        );
        let mut page = String::new();
        crate::page_hangs::section(&mut page, &h);
        assert!(page.len() < 12 << 20, "{}", page.len());
        assert!(page.contains("Not drawn here"));
    }

    #[test]
    fn a_timeline_stopped_record_alone_is_an_incident_judged_by_the_timelines() {
        let mut steps: Steps = BTreeMap::new();
        let mut ranks = BTreeMap::new();
        let recs = |n: i64| {
            (0..n)
                .map(|i| StepRec { start_us: T - 9_000_000 + i * 10_000, dur_us: 10_000, step: i })
                .collect::<Vec<_>>()
        };
        ranks.insert("0-a".to_owned(), recs(50));
        ranks.insert("1-a".to_owned(), recs(42));
        steps.insert("TRAIN".to_owned(), ranks);
        let rec = |us: i64, trigger: &str| HostState {
            trigger: trigger.into(),
            detected_us: us,
            node: "algo-1".into(),
            ..HostState::default()
        };
        let host = vec![rec(T + 60_000_000, "timeline_stopped"), rec(T, "timeline_stopped"), rec(T, "dump")];
        let out = incidents(Vec::new(), host, &steps);
        assert_eq!(out.len(), 1, "{out:#?}");
        let i = &out[0];
        assert_eq!((i.kind.as_str(), i.step, i.host.len()), ("timeline_stopped", None, 2));
        assert_eq!(i.culprits, ["1-a"]);
        assert_eq!(i.reason.as_deref(), Some("lowest_step"));
        let mut page = String::new();
        crate::page_hangs::section(&mut page, &Hangs { incidents: out, folders_left_out: 0 });
        assert!(page.contains("The timelines stopped at"));
    }

    #[test]
    fn a_signal_with_the_usual_skew_names_no_one_but_a_long_idle_rank_is_named() {
        let mut steps: Steps = BTreeMap::new();
        let mut ranks = BTreeMap::new();
        // Both ranks step until T; rank 1 is one step behind rank 0 at the kill.
        let recs = |n: i64| {
            (0..n)
                .map(|i| StepRec { start_us: T - n * 10_000 + i * 10_000, dur_us: 10_000, step: i })
                .collect::<Vec<_>>()
        };
        ranks.insert("0-a".to_owned(), recs(100));
        ranks.insert("1-a".to_owned(), recs(99));
        steps.insert("TRAIN".to_owned(), ranks);
        let sig = |node: &str, step: i64, started_us: i64| Dump {
            node: node.into(),
            folder: format!("framework/hangs/{node}/{step}-{T}"),
            kind: "signal".into(),
            complete: true,
            step: Some(step),
            step_started_s: Some(started_us as f64 / 1e6),
            detected_s: T as f64 / 1e6 + 0.001,
            median_step_s: Some(0.01),
            signal: Some("SIGTERM".into()),
            ..Dump::default()
        };
        let out = incidents(vec![sig("0-a", 100, T), sig("1-a", 99, T - 5_000)], Vec::new(), &steps);
        assert_eq!(out[0].kind, "signal");
        assert!(out[0].culprits.is_empty(), "{:?}", out[0].evidence);
        assert!(out[0].evidence[0].contains("usual skew"));
        assert!(out[0].ranks.iter().all(|r| !r.culprit));
        // Rank 1 in its step 99 for a minute: behind, named.
        let out = incidents(vec![sig("0-a", 100, T), sig("1-a", 99, T - 60_000_000)], Vec::new(), &steps);
        assert_eq!(out[0].culprits, ["1-a"]);
    }

    #[test]
    fn every_byte_flipped_still_parses_without_a_panic() {
        let py = "Fatal Python error: x\n\nThread 0x1 (most recent call first):\n  File \"t.py\", line 20 in f\n  <no Python frame>\n\nCurrent thread 0x2 (most recent call first):\n  File \"u.py\", line 3 in g\n";
        let nat = "thread 1 python\n  #0 0x7f00 read\n  #1 0x7f01 ??\n\nthread 2 w\n  #0 0x1\n";
        let js = format!(
            r#"{{"kind": "stall", "pid": 1, "step": 3, "detected_us": {T}, "ring": [{{"t_us": {T}, "what": "step_end", "step": 2}}], "open_windows": ["a"], "hook": {{"a": [1]}}}}"#
        );
        for text in [py, nat, js.as_str()] {
            for i in 0..text.len() {
                for b in [b'\n', b' ', b'"', b'#', b'{', 0xff, b'0'] {
                    let mut bytes = text.as_bytes().to_vec();
                    bytes[i] = b;
                    let t = String::from_utf8_lossy(&bytes);
                    let _ = parse_python_stacks(&t);
                    let _ = parse_native_stacks(&t);
                    if let Ok(v) = serde_json::from_str::<Value>(&t) {
                        stall_fields(&mut Dump::default(), &v);
                    }
                }
            }
        }
    }

    #[test]
    fn rank_rows_are_capped_over_the_incidents() {
        let mut ranks = BTreeMap::new();
        for r in 0..4096 {
            ranks.insert(format!("{r}-a"), vec![StepRec { start_us: T - 1000, dur_us: 10, step: 1 }]);
        }
        let mut steps: Steps = BTreeMap::new();
        steps.insert("TRAIN".to_owned(), ranks);
        let dumps: Vec<Dump> = (0..30)
            .map(|k| Dump {
                node: format!("{k}-a"),
                folder: format!("framework/hangs/{k}-a/2-{T}"),
                kind: DumpKind::Fatal.as_str().into(),
                step: Some(2),
                detected_s: T as f64 / 1e6 + f64::from(k),
                ..Dump::default()
            })
            .collect();
        let out = incidents(dumps, Vec::new(), &steps);
        assert_eq!(out.len(), 30);
        let rows: usize = out.iter().map(|i| i.ranks.len()).sum();
        assert!(rows <= MAX_RANK_ROWS, "{rows}");
        let last = &out[29];
        assert_eq!((last.ranks.len(), last.ranks_left_out), (1, 4095));
        assert!(last.ranks[0].culprit && last.ranks[0].dumped);
    }
}
