//! Hang and crash dumps (`docs/report.md`, "Hangs and crashes"): the hook's dump folders
//! (`framework/hangs/<node>/<step>-<µs>/`, `docs/formats.md`, "Hang and crash dumps") and the
//! agent's records of the host around them (`system/hangs/<node>/<name>.json`, "Host state at
//! a stall"), read strictly through `trainprof_output::fs` and bounded in every dimension
//! (folders, bytes per file, threads, frames, text per line). `analysis/incidents.rs` groups
//! and judges them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use trainprof_output::fs::{self as ofs, Dir};
use trainprof_output::protocol::dump::{self as dk, DumpKind};
pub use trainprof_output::protocol::dump::{MAX_JSON_BYTES, hook_record, parse_folder, stall_value};
use trainprof_output::protocol::host_record;

use crate::model::hangs::*;
use crate::reading::{self as read, Skipped, plausible_us};

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

/// `s` cut to [`MAX_TEXT`] bytes, control characters escaped.
pub fn text(s: &str) -> String {
    crate::reading::printable(s, MAX_TEXT)
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
    if let Some(k) = v.get(dk::KIND).and_then(Value::as_str).and_then(DumpKind::parse) {
        d.kind = IncidentKind::Hook(k);
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
            d.problems.push(text(&e.to_string()));
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
        kind: IncidentKind::Hook(DumpKind::Fatal),
        step: Some(step),
        detected_s: us as f64 / 1e6,
        ..Dump::default()
    };
    if has.contains(dk::STALL_FILE) {
        // A `stall.json` that cannot be read is no crash: the dump is incomplete, and says why.
        let v = read::read_file(dir, &format!("{rel}/{}", dk::STALL_FILE), MAX_JSON_BYTES)
            .map_err(|e| text(&e.to_string()))
            .and_then(|b| stall_value(&b).map_err(|e| e.to_string()));
        match v {
            Ok(v) => {
                d.complete = true;
                d.kind = IncidentKind::Hook(DumpKind::Stall);
                stall_fields(&mut d, &v);
            }
            Err(why) => {
                d.kind = IncidentKind::Incomplete;
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
pub(crate) fn dump_text_bytes(d: &Dump) -> usize {
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
