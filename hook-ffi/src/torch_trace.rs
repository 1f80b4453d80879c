//! A detailed window's op events from torch's own chrome trace, written by the writer
//! thread (docs/formats.md, "Detailed windows through torch's own trace"; docs/trainer.md,
//! "Framework adapters: `trainprof.torch` and `trainprof.keras`").
//!
//! At the window's close the adapter does on the training thread only what plain
//! torch.profiler does: `stop()`, then torch's C++ export of its trace, into a file this
//! module made for it ([`Hook::torch_trace_create`]); then it hands the file back
//! ([`Hook::torch_trace_import`]) and the writer thread turns the trace into
//! `cpu_functions` events ([`run_jobs`]), streaming it, and removes the files.
//!
//! What the trainer can write is untrusted, and the file is never reached by its name
//! again: the hook makes `<name>` and `<name>.tmp` (torch writes `<name>.tmp`, then renames
//! it over `<name>`), each `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600, in its own folder
//! `<LocalPath>/.trainprof-torch/` (mode 0700, used only if it is a real folder of this
//! user that no one else can enter), and keeps both open. The trace read is the file the
//! hook holds whose inode `<name>` names once torch is done: a link or any other file
//! planted there is refused (one line, no event). Only the files it made are removed, and
//! only while their names still hold them.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, BufReader, Read as _, Seek as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use trainprof_config::AutoFeature;
use trainprof_output::fs::{self as ofs, Dir, Meta};
use trainprof_output::protocol::timeline::{
    CPU_FUNCTIONS, MEMORY_NAME, MEMORY_PHASE, collective, memory_key,
};
use trainprof_output::protocol::torch_trace::{self as proto, Flow, TraceEvent};

use crate::event::{Event, Kind};
use crate::hook::Hook;
use crate::lock;
use crate::types::{
    TRAINPROF_MAX_ARGS, TRAINPROF_NAME_OVER_LIMIT, TrainprofArg, TrainprofArgKind, TrainprofCap,
};
use crate::writer::TimelineWriter;

/// Trace files made and not yet handed back: a window makes one; more are a caller that
/// never handed them back, and the oldest is removed.
const MAX_MADE: usize = 4;
/// Step boundaries one import takes (one a step of the window).
pub const MAX_BOUNDARIES: usize = 1 << 20;
/// Bytes of a trace read per event the window may still write, and at least
/// [`MIN_TRACE_BYTES`]: torch writes a few hundred bytes an op (with `record_shapes`, a
/// few more), so a trace is read to its end, while a file that is not torch's cannot make
/// the writer read for long.
const BYTES_PER_EVENT: u64 = 4096;
const MIN_TRACE_BYTES: u64 = 64 << 20;
/// The read buffer: the only memory the reading takes besides one event.
const READ_BUFFER: usize = 64 << 10;
/// Events imported between two looks at the queue (what the trainer records meanwhile).
const DRAIN_EVERY: u64 = 4096;

/// A trace file made for torch, with `<name>.tmp` beside it.
#[derive(Debug)]
struct Made {
    token: u64,
    dir: Dir,
    name: String,
    tmp: String,
    file: File,
    temp: File,
}

impl Made {
    /// Removes both names, each only while it still holds a file made for it (`<name>`
    /// holds the `.tmp` one once torch renamed it).
    fn remove(&self) {
        for (name, files) in [(&self.name, [&self.file, &self.temp]), (&self.tmp, [&self.temp, &self.temp])] {
            for f in files {
                if self.dir.unlink_if_same(name, f).unwrap_or(false) {
                    break;
                }
            }
        }
    }
}

/// One trace to import.
#[derive(Debug)]
pub(crate) struct Job {
    made: Made,
    /// (µs, global step) at each step begin inside the window, in time order: an event is
    /// numbered with the step it began in.
    boundaries: Vec<(i64, i64)>,
    /// Events the window wrote before (its `Forward` events), and its cap.
    events_before: u64,
    max_events: u64,
    /// Say so (`trainprof:WindowCapped`) when the cap is reached: false when the window
    /// was capped already.
    notify_cap: bool,
}

/// The hook's trace files: made, and handed back for the writer.
#[derive(Debug, Default)]
pub(crate) struct Traces {
    next: AtomicU64,
    made: std::sync::Mutex<VecDeque<Made>>,
    jobs: std::sync::Mutex<VecDeque<Job>>,
}

/// Why an import was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportRefused {
    /// No trace file with that token is waiting (never made, handed back already, or
    /// removed as too old).
    UnknownToken,
    /// Boundaries out of order, or too many.
    BadBoundaries,
}

impl Hook {
    /// Makes a new trace file for torch in `<LocalPath>/.trainprof-torch/`: its path, and
    /// the token that hands it back.
    pub fn torch_trace_create(&self) -> io::Result<(u64, PathBuf)> {
        let root = Dir::open_root(self.local_path(), true)?;
        let dir = ofs::private_dir_mode(&root, proto::TRACE_DIR, 0o700)?;
        let mut last = None;
        for _ in 0..8 {
            let token = self.traces.next.fetch_add(1, Relaxed);
            let name = proto::trace_name(self.writer.os_pid, token);
            let tmp = proto::trace_temp_name(&name);
            let file = match dir.create_new(&name) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let temp = match dir.create_new(&tmp) {
                Ok(f) => f,
                Err(e) => {
                    let _ = dir.unlink_if_same(&name, &file);
                    if e.kind() == io::ErrorKind::AlreadyExists {
                        last = Some(e);
                        continue;
                    }
                    return Err(e);
                }
            };
            for f in [&file, &temp] {
                f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            }
            let path = dir.display(&name);
            let mut made = lock(&self.traces.made);
            if made.len() >= MAX_MADE
                && let Some(old) = made.pop_front()
            {
                old.remove();
            }
            made.push_back(Made { token, dir, name, tmp, file, temp });
            return Ok((token, path));
        }
        Err(last.unwrap_or_else(|| io::Error::other("its names were all taken")))
    }

    fn take_made(&self, token: u64) -> Option<Made> {
        let mut made = lock(&self.traces.made);
        let i = made.iter().position(|m| m.token == token)?;
        made.remove(i)
    }

    /// Hands trace `token` to the writer thread, which writes its ops as the window's
    /// `cpu_functions` events (up to `max_events` for the window, `events_before` of which it
    /// wrote already) and removes the files.
    pub fn torch_trace_import(
        &self,
        token: u64,
        boundaries: Vec<(i64, i64)>,
        events_before: u64,
        max_events: u64,
        notify_cap: bool,
    ) -> Result<(), ImportRefused> {
        if boundaries.len() > MAX_BOUNDARIES || boundaries.windows(2).any(|w| w[1].0 < w[0].0) {
            return Err(ImportRefused::BadBoundaries);
        }
        let made = self.take_made(token).ok_or(ImportRefused::UnknownToken)?;
        lock(&self.traces.jobs).push_back(Job { made, boundaries, events_before, max_events, notify_cap });
        Ok(())
    }

    /// Removes trace `token` unread (torch could not write it). False when no such trace
    /// is waiting.
    pub fn torch_trace_discard(&self, token: u64) -> bool {
        match self.take_made(token) {
            Some(m) => {
                m.remove();
                true
            }
            None => false,
        }
    }

    /// Removes every trace file still made or waiting (the writer's end).
    pub(crate) fn torch_traces_drop(&self) {
        for m in lock(&self.traces.made).drain(..) {
            m.remove();
        }
        for j in lock(&self.traces.jobs).drain(..) {
            j.made.remove();
        }
    }
}

/// Which file holds the trace torch wrote: the one `<name>` names now (torch's `<name>.tmp`
/// renamed over it, or `<name>` written in place); an error for anything else there.
fn written_file(m: &Made) -> io::Result<&File> {
    let now = m.dir.stat(&m.name)?;
    for f in [&m.temp, &m.file] {
        if now.is_same(&ofs::meta_of(f)?) {
            return Ok(f);
        }
    }
    Err(io::Error::other(format!(
        "{} is not the file the hook made for torch's trace ({}): not read",
        m.dir.display(&m.name).display(),
        kind_word(&now)
    )))
}

fn kind_word(m: &Meta) -> &'static str {
    match m.kind() {
        ofs::Kind::Symlink => "a symbolic link",
        ofs::Kind::Dir => "a folder",
        ofs::Kind::File => "another file",
        ofs::Kind::Other => "not a regular file",
    }
}

/// What an import did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Imported {
    pub written: u64,
    /// The cap stopped it: (events the window reached, the step of the first left out).
    pub capped_at: Option<(u64, i64)>,
    /// Events left out because they ran on a device (the adapter reads those in Python).
    pub on_device: u64,
}

/// Turns the trace in `read` into the window's events, handed to `emit` (`register` gives
/// a name's id). Stops at the window's cap.
pub(crate) fn convert(
    read: impl io::Read,
    job: &Job,
    register: &mut dyn FnMut(&str) -> u32,
    emit: &mut dyn FnMut(&Event),
) -> (Imported, Result<proto::Summary, proto::TraceError>) {
    let times: Vec<i64> = job.boundaries.iter().map(|b| b.0).collect();
    let step_of = |start: i64| {
        let i = times.partition_point(|t| *t <= start);
        job.boundaries.get(i.saturating_sub(1)).map_or(-1, |b| b.1)
    };
    let phase = register(CPU_FUNCTIONS);
    let tid_key = register(proto::OP_THREAD_ARG);
    // torch's memory events (`profile_memory`), lazily: a window without them registers nothing.
    let mut memory_ids: Option<[u32; 6]> = None;
    // The keys of a collective's message, lazily as well.
    let mut message_keys: Option<[u32; 2]> = None;
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut out = Imported::default();
    let room = job.max_events.saturating_sub(job.events_before);
    let r = proto::read_events(read, &mut |e: TraceEvent| {
        if e.cat == proto::CAT_TRACE {
            return Flow::Go;
        }
        if e.on_device() {
            out.on_device += 1;
            return Flow::Go;
        }
        let memory = e.memory;
        let name = match memory {
            Some(_) => MEMORY_NAME,
            None => match proto::op_name(&e.name) {
                Some(n) => n,
                None => return Flow::Go,
            },
        };
        let (start, end) = e.span_us();
        let step = step_of(start);
        if out.written >= room {
            out.capped_at = Some((job.events_before + out.written, step));
            return Flow::Stop;
        }
        if let Some(m) = memory {
            // docs/formats.md, "Memory events": one zero-length event, torch's four numbers.
            let ids = *memory_ids.get_or_insert_with(|| {
                [
                    register(MEMORY_PHASE),
                    register(MEMORY_NAME),
                    register(memory_key::DEVICE_TYPE),
                    register(memory_key::DEVICE_ID),
                    register(memory_key::TOTAL_ALLOCATED),
                    register(memory_key::TOTAL_RESERVED),
                ]
            });
            let mut args = [TrainprofArg::EMPTY; TRAINPROF_MAX_ARGS];
            let values = [m.device_type, m.device_id, m.total_allocated, m.total_reserved];
            for (slot, (key, value)) in args.iter_mut().zip(ids[2..].iter().zip(values)) {
                *slot = TrainprofArg { key: *key, kind: TrainprofArgKind::Int as i32, value };
            }
            emit(&Event {
                kind: Kind::Complete,
                phase: ids[0],
                name: ids[1],
                start_us: start,
                end_us: start,
                step,
                n_args: 4,
                args,
            });
            out.written += 1;
            return Flow::Go;
        }
        let id = match ids.get(name) {
            Some(id) => *id,
            None => {
                let id = register(name);
                ids.insert(name.to_owned(), id);
                id
            }
        };
        let mut args = [TrainprofArg::EMPTY; TRAINPROF_MAX_ARGS];
        args[0] =
            TrainprofArg { key: tid_key, kind: TrainprofArgKind::Int as i32, value: e.tid.unwrap_or(0) };
        let mut n_args = 1;
        // A collective's message, when torch recorded its inputs (docs/formats.md, "Collectives").
        if let Some(m) = e.message.filter(|_| collective::is_collective_range(name)) {
            let keys = *message_keys.get_or_insert_with(|| {
                [register(collective::MSG_BYTES_KEY), register(collective::SCALAR_TYPE_KEY)]
            });
            let int = |key: u32, value: i64| TrainprofArg { key, kind: TrainprofArgKind::Int as i32, value };
            args[1] = int(keys[0], i64::try_from(m.bytes).unwrap_or(i64::MAX));
            n_args = 2;
            if let Some(t) = m.scalar_type {
                args[2] = int(keys[1], i64::from(t));
                n_args = 3;
            }
        }
        let ev =
            Event { kind: Kind::Complete, phase, name: id, start_us: start, end_us: end, step, n_args, args };
        emit(&ev);
        out.written += 1;
        Flow::Go
    });
    (out, r)
}

/// The writer thread's part: every trace handed back is read and written through `w`, the
/// queue drained every [`DRAIN_EVERY`] events (`drain`), and the files removed.
pub(crate) fn run_jobs(
    hook: &Hook,
    w: &mut TimelineWriter,
    names: &mut Vec<Arc<str>>,
    clock: fn() -> i64,
    drain: &mut dyn FnMut(&mut TimelineWriter, &mut Vec<Arc<str>>),
) {
    loop {
        let Some(job) = lock(&hook.traces.jobs).pop_front() else { return };
        let _own = hook.own_work();
        run_job(hook, &job, w, names, clock, drain);
        job.made.remove();
    }
}

fn run_job(
    hook: &Hook,
    job: &Job,
    w: &mut TimelineWriter,
    names: &mut Vec<Arc<str>>,
    clock: fn() -> i64,
    drain: &mut dyn FnMut(&mut TimelineWriter, &mut Vec<Arc<str>>),
) {
    let shown = job.made.dir.display(&job.made.name);
    let file = match written_file(&job.made) {
        Ok(f) => f,
        Err(e) => {
            crate::log(&format_args!("torch.profiler's trace: {e}; the window's op events are left out"));
            return;
        }
    };
    let mut reader: &File = file;
    if let Err(e) = reader.rewind() {
        crate::log(&format_args!(
            "cannot read {}: {e}; the window's op events are left out",
            shown.display()
        ));
        return;
    }
    let limit =
        job.max_events.saturating_sub(job.events_before).saturating_mul(BYTES_PER_EVENT).max(MIN_TRACE_BYTES);
    let read = BufReader::with_capacity(READ_BUFFER, reader.take(limit));
    let mut since_drain = 0u64;
    let mut register = |name: &str| hook.names.register(name);
    let mut emit = |ev: &Event| {
        if ev.name == TRAINPROF_NAME_OVER_LIMIT || ev.phase == TRAINPROF_NAME_OVER_LIMIT {
            hook.counters.dropped_names.add_one();
            return;
        }
        let top = ev.phase.max(ev.name).max(ev.args().iter().map(|a| a.key).max().unwrap_or(0));
        if top as usize >= names.len() {
            hook.names.copy_new(names);
        }
        w.write(ev, names, clock());
        since_drain += 1;
        if since_drain >= DRAIN_EVERY {
            since_drain = 0;
            drain(w, names);
        }
    };
    let (done, read) = convert(read, job, &mut register, &mut emit);
    match read {
        Ok(s) if s.no_events => crate::log(&format_args!(
            "{} has no traceEvents; the window's op events are left out",
            shown.display()
        )),
        Ok(s) if s.base_after_events => crate::log(&format_args!(
            "{}: baseTimeNanoseconds came after the events; their times are off",
            shown.display()
        )),
        Ok(_) => {}
        Err(e) => crate::log(&format_args!(
            "{}: {e}; {} op events written, the rest left out",
            shown.display(),
            done.written
        )),
    }
    if done.on_device > 0 {
        crate::log(&format_args!(
            "{}: {} device events left out (the adapter reads a window's device events itself)",
            shown.display(),
            done.on_device
        ));
    }
    if let Some((value, step)) = done.capped_at
        && job.notify_cap
        && let Some(ev) = hook.capped_after_window(
            AutoFeature::Detailed,
            TrainprofCap::Events,
            value,
            job.max_events,
            step,
            clock(),
        )
    {
        hook.names.copy_new(names);
        w.write(&ev, names, clock());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn job(dir: &Dir, boundaries: Vec<(i64, i64)>, before: u64, max: u64) -> Job {
        let name = format!("t-{before}-{max}.json");
        let tmp = proto::trace_temp_name(&name);
        let file = dir.create_new(&name).unwrap();
        let temp = dir.create_new(&tmp).unwrap();
        Job {
            made: Made { token: 0, dir: dir.try_clone().unwrap(), name, tmp, file, temp },
            boundaries,
            events_before: before,
            max_events: max,
            notify_cap: true,
        }
    }

    const TRACE: &str = r#"{"baseTimeNanoseconds": 1000000000000000,
        "traceEvents": [
          {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "ts": 0, "dur": 100, "tid": 1},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10.5, "dur": 2.2, "tid": 77},
          {"ph": "X", "cat": "cpu_op", "name": "aten::is_leaf", "ts": 11, "dur": 1, "tid": 77},
          {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 20, "dur": 1, "tid": 77},
          {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 21, "dur": 1, "tid": 7},
          {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 30, "dur": 1, "tid": 78}
        ]}"#;

    /// `trace` converted whole: the names registered (an event's ids index it), the events
    /// written, what the conversion says it did.
    fn convert_all(trace: &str, j: &Job) -> (Vec<String>, Vec<Event>, Imported) {
        let mut table: Vec<String> = Vec::new();
        let mut register = |n: &str| match table.iter().position(|t| t == n) {
            Some(i) => i as u32,
            None => {
                table.push(n.to_owned());
                (table.len() - 1) as u32
            }
        };
        let mut evs = Vec::new();
        let (done, r) = convert(trace.as_bytes(), j, &mut register, &mut |e| evs.push(*e));
        r.unwrap();
        (table, evs, done)
    }

    /// (name, start, end, step, tid) of each event written.
    type Written = Vec<(String, i64, i64, i64, i64)>;

    fn run(j: &Job) -> (Written, Imported) {
        let (table, evs, done) = convert_all(TRACE, j);
        let got = evs
            .iter()
            .map(|e| {
                assert_eq!(table[e.phase as usize], "cpu_functions");
                assert_eq!(table[e.args[0].key as usize], "tid");
                (table[e.name as usize].clone(), e.start_us, e.end_us, e.step, e.args[0].value)
            })
            .collect();
        (got, done)
    }

    #[test]
    fn ops_become_cpu_functions_numbered_by_the_step_they_began_in() {
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open_root(t.path(), true).unwrap();
        let base = 1_000_000_000_000;
        let (got, done) = run(&job(&dir, vec![(base, 5), (base + 20, 6)], 0, 100));
        assert_eq!(
            got,
            [
                ("aten::mm".to_owned(), base + 10, base + 12, 5, 77),
                ("ProfilerStep*".to_owned(), base + 20, base + 21, 6, 77),
                ("aten::add".to_owned(), base + 30, base + 31, 6, 78),
            ]
        );
        assert_eq!(done, Imported { written: 3, capped_at: None, on_device: 1 });
    }

    #[test]
    fn memory_events_are_written_with_torchs_numbers_and_count_toward_the_cap() {
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open_root(t.path(), true).unwrap();
        let base = 1_000_000_000_000;
        let trace = r#"{"baseTimeNanoseconds": 1000000000000000, "traceEvents": [
          {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "ts": 12.7,
           "args": {"Total Reserved": 0, "Total Allocated": 4202496, "Bytes": 4194304, "Device Id": -1, "Device Type": 0}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 13, "dur": 1, "tid": 77},
          {"ph": "i", "name": "[memory]", "ts": 25, "args": {"Total Allocated": 8192, "Total Reserved": 65536, "Device Id": 1, "Device Type": 1}}
        ]}"#;
        let j = job(&dir, vec![(base, 5), (base + 20, 6)], 0, 100);
        let (table, evs, done) = convert_all(trace, &j);
        assert_eq!(done.written, 3);
        let mem: Vec<_> = evs.iter().filter(|e| table[e.phase as usize] == "trainprof:Memory").collect();
        assert_eq!(mem.len(), 2);
        let args = |e: &Event| -> Vec<(String, i64)> {
            e.args().iter().map(|a| (table[a.key as usize].clone(), a.value)).collect()
        };
        assert_eq!(table[mem[0].name as usize], "[memory]");
        assert_eq!((mem[0].start_us, mem[0].end_us, mem[0].step), (base + 12, base + 12, 5));
        assert_eq!(
            args(mem[0]),
            [
                ("Device Type".to_owned(), 0),
                ("Device Id".to_owned(), -1),
                ("Total Allocated".to_owned(), 4_202_496),
                ("Total Reserved".to_owned(), 0)
            ]
        );
        assert_eq!(mem[1].step, 6);
        assert_eq!(args(mem[1])[2], ("Total Allocated".to_owned(), 8192));
        // The cap counts them as it counts ops.
        let j = job(&dir, vec![(base, 5)], 0, 1);
        let (done, _) = convert(trace.as_bytes(), &j, &mut |_| 0, &mut |_| {});
        assert_eq!((done.written, done.capped_at), (1, Some((1, 5))));
    }

    #[test]
    fn a_collectives_message_is_written_from_torchs_recorded_shapes() {
        // As torch 2.15 writes a gloo all-reduce with `record_shapes=True` (docs/formats.md,
        // "Collectives"): the message goes on the collective's events only.
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open_root(t.path(), true).unwrap();
        let trace = r#"{"baseTimeNanoseconds": 1000000000000000, "traceEvents": [
          {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 9, "dur": 7, "tid": 1,
           "args": {"Input type": ["TensorList", "", "", "", "Scalar", "Scalar"], "Input Dims": [[[1000]], [], [], [], [], []]}},
          {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 10, "dur": 5, "tid": 2,
           "args": {"Input type": ["float"], "Input Strides": [[1]], "Input Dims": [[1000]]}},
          {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 20, "dur": 5, "tid": 2,
           "args": {"Input type": ["float", "double"], "Input Dims": [[10], [3]]}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 11, "dur": 1, "tid": 1,
           "args": {"Input type": ["float"], "Input Dims": [[1000]]}}
        ]}"#;
        let j = job(&dir, vec![(1_000_000_000_000, 5)], 0, 100);
        let (table, evs, _) = convert_all(trace, &j);
        let got: Vec<(String, Vec<(String, i64)>)> = evs
            .iter()
            .map(|e| {
                let args =
                    e.args().iter().skip(1).map(|a| (table[a.key as usize].clone(), a.value)).collect();
                (table[e.name as usize].clone(), args)
            })
            .collect();
        let kv = |k: &str, v: i64| (k.to_owned(), v);
        assert_eq!(
            got,
            [
                ("c10d::allreduce_".to_owned(), vec![]),
                ("gloo:all_reduce".to_owned(), vec![kv("msg_bytes", 4000), kv("scalar_type", 6)]),
                ("gloo:all_reduce".to_owned(), vec![kv("msg_bytes", 10 * 4 + 3 * 8)]),
                ("aten::add".to_owned(), vec![]),
            ]
        );
    }

    #[test]
    fn the_window_cap_counts_the_events_written_before() {
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open_root(t.path(), true).unwrap();
        let base = 1_000_000_000_000;
        let (got, done) = run(&job(&dir, vec![(base, 5), (base + 20, 6)], 8, 10));
        assert_eq!(got.len(), 2);
        // The first event left out began in step 6.
        assert_eq!(done.capped_at, Some((10, 6)));
    }

    #[test]
    fn only_the_file_made_is_read_never_a_link_or_a_file_planted_in_its_place() {
        let t = tempfile::tempdir().unwrap();
        let dir = Dir::open_root(t.path(), true).unwrap();
        let outside = t.path().join("outside.json");
        std::fs::write(&outside, TRACE).unwrap();

        // torch's way: <name>.tmp written, then renamed over <name>.
        let j = job(&dir, vec![], 0, 100);
        std::fs::write(t.path().join(&j.made.tmp), TRACE).unwrap();
        std::fs::rename(t.path().join(&j.made.tmp), t.path().join(&j.made.name)).unwrap();
        let mut s = String::new();
        let mut f = written_file(&j.made).unwrap().try_clone().unwrap();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, TRACE);
        j.made.remove();
        assert!(std::fs::read_dir(t.path()).unwrap().count() == 1, "only outside.json is left");

        // A link in its place: refused, and the link (not its target) left alone.
        let j = job(&dir, vec![], 1, 100);
        std::fs::remove_file(t.path().join(&j.made.name)).unwrap();
        std::os::unix::fs::symlink(&outside, t.path().join(&j.made.name)).unwrap();
        let e = written_file(&j.made).unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        j.made.remove();
        assert!(t.path().join(&j.made.name).symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), TRACE);

        // Another file renamed over it: refused too.
        let j = job(&dir, vec![], 2, 100);
        std::fs::copy(&outside, t.path().join("other")).unwrap();
        std::fs::rename(t.path().join("other"), t.path().join(&j.made.name)).unwrap();
        let e = written_file(&j.made).unwrap_err();
        assert!(e.to_string().contains("another file"), "{e}");
        j.made.remove();
        assert!(t.path().join(&j.made.name).exists(), "what the hook did not make is not removed");
        assert!(!t.path().join(&j.made.tmp).exists(), "its own .tmp is removed");
    }
}
