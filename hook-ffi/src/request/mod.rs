//! On-demand windows (`trainprof trigger`; docs/formats.md, "On-demand windows (`trainprof
//! trigger`)"): the writer thread looks for requests in `<LocalPath>/trigger/` and answers
//! them; the trainer's thread takes each step of the exchange at a step boundary, so an
//! answer says that the trainer's loop itself saw the request (a rank stuck outside a step
//! answers nothing and is reported missed).
//!
//! Three parts:
//! * [`Slot`]: what the writer hands the trainer (an ask) and what the trainer hands back
//!   (what it took). One relaxed load per `step_begin` while nothing is asked.
//! * [`Requested`]: an armed window, kept in the gate beside the anomaly detector's: an extra
//!   step range per feature, consulted after the configured window (docs/formats.md,
//!   "Anomaly-triggered windows").
//! * [`Poller`]: the writer thread's side. While idle it `fstat`s the folder once a second
//!   and lists it only when it changed; while a request is in flight it looks every 50 ms.
//!   Every file is opened without following a link, read only when regular, owned by this
//!   process's user or root and at most 4 KiB; every answer is created new (never over a
//!   file) through `trainprof_output::fs::write_new`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::*;

use trainprof_config::{AutoFeature, AutoFeatures};
use trainprof_output::fs::{self, Dir, Kind};
use trainprof_output::protocol::request::{
    self as proto, Answer, AnswerKind, FORMAT_VERSION, Presence, REQUEST_DIR, Refused, Request,
};

use crate::hook::Hook;

/// How often the folder is looked at while idle, and while a request is in flight (µs).
const IDLE_US: i64 = 1_000_000;
const BUSY_US: i64 = 50_000;
/// Request ids remembered as handled (the folder may hold old requests).
const HANDLED: usize = 256;

pub(crate) mod slot;

pub(crate) use slot::{Ask, Requested, Taken, openable};

impl Hook {
    /// At a step boundary: takes what the writer asked (`due`), and opens or ends an armed
    /// window (`armed`). `step` is the step just begun (windows' numbering).
    pub(crate) fn requests_at_step(&self, step: u64, now_us: i64) {
        if self.requests.due.load(Acquire) {
            self.take_ask(step, now_us);
        }
        if self.requests.armed.load(Acquire) {
            self.requested_window_at(step, now_us);
        }
    }

    fn take_ask(&self, step: u64, now_us: i64) {
        let Ok(mut s) = self.requests.state.try_lock() else { return };
        let taken = match s.ask.take() {
            Some(Ask::Ack) => Some(Taken::Step { step, at_us: now_us }),
            Some(Ask::Go { window }) if step < window.start => {
                let mut gate = crate::lock(&self.gate);
                let (open, files, left_out) =
                    openable(&gate.config, window.features, self.framework(), self.node_id());
                if open.contains(AutoFeature::Native) {
                    self.native.set_requested(true);
                }
                gate.requested = Some(Requested { features: open, ..window });
                self.requests.armed.store(true, Release);
                Some(Taken::Armed { step, files, left_out })
            }
            Some(Ask::Go { .. }) => Some(Taken::Missed { step }),
            None => None,
        };
        s.taken = taken;
        self.requests.due.store(false, Release);
    }

    fn requested_window_at(&self, step: u64, now_us: i64) {
        let announce = {
            let mut gate = crate::lock(&self.gate);
            match gate.requested.as_mut() {
                None => {
                    self.requests.armed.store(false, Release);
                    None
                }
                Some(r) if step >= r.end => {
                    gate.requested = None;
                    self.native.set_requested(false);
                    self.requests.armed.store(false, Release);
                    None
                }
                Some(r) if step >= r.start && !r.announced => {
                    r.announced = true;
                    Some(r.clone())
                }
                Some(_) => None,
            }
        };
        if let Some(r) = announce {
            self.record_requested(&r, now_us);
        }
    }
}

/// One request in flight.
#[derive(Debug)]
struct Current {
    request: Request,
    phase: Phase,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The ack is asked of the trainer.
    Asked,
    /// The ack is written; waiting for the go-ahead.
    Acked,
    /// The go-ahead is asked of the trainer: `start..end`.
    GoAsked { start: u64, end: u64 },
    /// Armed; done once the trainer is past `end`.
    Armed { end: u64 },
}

/// The writer thread's side (see the module docs). Off (`dir` None) when the folder could
/// not be made or is not this user's own.
#[derive(Debug)]
pub(crate) struct Poller {
    dir: Option<Dir>,
    rank: String,
    euid: u32,
    presence: Option<fs::Meta>,
    last_look_us: i64,
    last_scan_us: i64,
    /// The folder's mtime at the last listing.
    listed_mtime: Option<(i64, i64)>,
    handled: VecDeque<String>,
    current: Option<Current>,
    /// The last (time, step) seen, for the pace an ack reports.
    pace_from: Option<(i64, u64)>,
    pace: Option<f64>,
    /// A `stacks` request whose dump the watchdog is writing: its id and expiry.
    stacks: Option<(String, i64)>,
    /// Without the recorder, the thread writing that dump ([`crate::hang::on_request`]).
    on_request: Option<crate::hang::on_request::Outcome>,
}

impl Poller {
    /// Makes `<LocalPath>/trigger/` (mode 0700) and this rank's presence file. Any failure is
    /// one log line and the feature is off in this process.
    pub(crate) fn start(hook: &Hook, now_us: i64) -> Poller {
        let rank = proto::rank_key(hook.node_id(), hook.writer.os_pid);
        let euid = fs::euid();
        let mut p = Poller {
            dir: None,
            rank,
            euid,
            presence: None,
            last_look_us: i64::MIN,
            last_scan_us: i64::MIN,
            listed_mtime: None,
            handled: VecDeque::new(),
            current: None,
            pace_from: None,
            pace: None,
            stacks: None,
            on_request: None,
        };
        let dir = Dir::open_root(hook.local_path(), true)
            .and_then(|root| fs::private_dir_mode(&root, REQUEST_DIR, 0o700));
        let dir = match dir {
            Ok(d) => d,
            Err(e) => {
                crate::log(&format_args!("on-demand windows are off (trainprof trigger): {e}"));
                return p;
            }
        };
        let presence = Presence {
            version: FORMAT_VERSION,
            node: hook.node_id().to_owned(),
            pid: hook.writer.os_pid,
            started_us: now_us,
        };
        let name = proto::presence_name(&p.rank);
        let written = serde_json::to_vec(&presence)
            .map_err(std::io::Error::other)
            .and_then(|bytes| fs::write_new(&dir, &name, &p.rank, &bytes));
        match written {
            Ok(true) => p.presence = dir.stat(&name).ok(),
            Ok(false) => crate::log(&format_args!(
                "{} exists already: this rank's presence is not announced",
                dir.display(&name).display()
            )),
            Err(e) => crate::log(&format_args!("cannot write {}: {e}", dir.display(&name).display())),
        }
        p.dir = Some(dir);
        p
    }

    /// Removes the presence file (only while it is still the one written), at the writer's
    /// end.
    pub(crate) fn stop(&mut self) {
        if let (Some(dir), Some(held)) = (&self.dir, self.presence.take()) {
            let _ = dir.unlink_if_holds(&proto::presence_name(&self.rank), &held);
        }
    }

    /// One look, from the writer's loop (every 10 ms when idle): at most every 50 ms while a
    /// request is in flight, else at most once a second.
    pub(crate) fn poll(&mut self, hook: &Arc<Hook>, now_us: i64) {
        if self.dir.is_none() {
            return;
        }
        let busy = self.stacks.is_some()
            || self.current.as_ref().is_some_and(|c| !matches!(c.phase, Phase::Armed { .. }));
        let every = if busy { BUSY_US } else { IDLE_US };
        if now_us.saturating_sub(self.last_look_us) < every {
            return;
        }
        self.last_look_us = now_us;
        self.note_pace(hook, now_us);
        self.stacks_done(hook, now_us);
        self.progress(hook, now_us);
        if now_us.saturating_sub(self.last_scan_us) >= IDLE_US {
            self.last_scan_us = now_us;
            self.scan(hook, now_us);
        }
    }

    fn note_pace(&mut self, hook: &Hook, now_us: i64) {
        let Some(step) = hook.window_step() else { return };
        match self.pace_from {
            Some((t, s)) if now_us.saturating_sub(t) >= IDLE_US => {
                let dt = now_us.saturating_sub(t) as f64 / 1e6;
                self.pace = Some(step.saturating_sub(s) as f64 / dt);
                self.pace_from = Some((now_us, step));
            }
            Some(_) => {}
            None => self.pace_from = Some((now_us, step)),
        }
    }

    /// Answers a `stacks` request once the watchdog wrote its dump (or gives up at the
    /// request's expiry).
    fn stacks_done(&mut self, hook: &Hook, now_us: i64) {
        let Some((id, expires_us)) = self.stacks.clone() else { return };
        let done = match (&self.on_request, hook.hang.as_deref()) {
            (Some(outcome), _) => crate::hang::on_request::take(outcome),
            (None, Some(h)) => h.take_requested(),
            (None, None) => None,
        };
        let mut a = match done {
            Some(Some(folder)) => {
                let mut a = self.answer(hook, &id, AnswerKind::Dumped);
                a.files = vec![format!("{folder}/")];
                a
            }
            Some(None) => {
                let mut a = self.answer(hook, &id, AnswerKind::Refused);
                a.reason = Some("the dump could not be written (the trainer's stderr says why)".into());
                a
            }
            None if now_us > expires_us => {
                let mut a = self.answer(hook, &id, AnswerKind::Refused);
                a.reason = Some("the watchdog did not write the dump before the request expired".into());
                a
            }
            None => return,
        };
        a.step = hook.window_step();
        self.write(&proto::stacks_name(&id, &self.rank), &a);
        self.stacks = None;
        self.on_request = None;
    }

    /// Moves the request in flight on: what the trainer took is answered, the go-ahead is
    /// looked for, an expired request is dropped.
    fn progress(&mut self, hook: &Hook, now_us: i64) {
        let Some(cur) = self.current.as_ref() else { return };
        let (expired, id, phase) = (now_us > cur.request.expires_us, cur.request.id.clone(), cur.phase);
        let features = cur.request.features.join(", ");
        match phase {
            Phase::Asked => match hook.requests.taken() {
                Some(Taken::Step { step, at_us }) => {
                    let mut a = self.answer(hook, &id, AnswerKind::Ack);
                    // Before a pace was measured over a second: the average since the
                    // hook started (init time included, so it errs low).
                    let since_start = (at_us.saturating_sub(hook.base_us) as f64 / 1e6 > 0.05)
                        .then(|| (step as f64 + 1.0) / (at_us.saturating_sub(hook.base_us) as f64 / 1e6));
                    (a.step, a.steps_per_s, a.at_us) = (Some(step), self.pace.or(since_start), Some(at_us));
                    self.write(&proto::ack_name(&id, &self.rank), &a);
                    if let Some(c) = self.current.as_mut() {
                        c.phase = Phase::Acked;
                    }
                }
                Some(_) => {}
                None if expired => {
                    hook.requests.withdraw();
                    self.current = None;
                }
                None => {}
            },
            Phase::Acked => self.look_for_go(hook, now_us),
            Phase::GoAsked { start, end } => {
                let taken = if expired { hook.requests.withdraw() } else { hook.requests.taken() };
                match taken {
                    Some(Taken::Armed { step, files, left_out }) => {
                        let mut a = self.answer(hook, &id, AnswerKind::Armed);
                        (a.step, a.start, a.end, a.files) = (Some(step), Some(start), Some(end), files);
                        if !left_out.is_empty() {
                            a.reason = Some(format!(
                                "{}: off in this process's config, not opened",
                                left_out.join(", ")
                            ));
                        }
                        self.write(&proto::armed_name(&id, &self.rank), &a);
                        crate::log(&format_args!(
                            "trainprof trigger {id}: {features} armed for steps {start}..={}",
                            end.saturating_sub(1)
                        ));
                        if let Some(c) = self.current.as_mut() {
                            c.phase = Phase::Armed { end };
                        }
                    }
                    Some(Taken::Missed { step }) => {
                        let mut a = self.answer(hook, &id, AnswerKind::Missed);
                        (a.step, a.start, a.end) = (Some(step), Some(start), Some(end));
                        a.reason = Some(format!("at step {step}, not before step {start}"));
                        self.write(&proto::armed_name(&id, &self.rank), &a);
                        self.current = None;
                    }
                    Some(Taken::Step { .. }) | None if expired => {
                        let mut a = self.answer(hook, &id, AnswerKind::Missed);
                        (a.start, a.end) = (Some(start), Some(end));
                        a.reason = Some("no step boundary before the request expired".into());
                        self.write(&proto::armed_name(&id, &self.rank), &a);
                        self.current = None;
                    }
                    _ => {}
                }
            }
            Phase::Armed { end } => {
                if hook.window_step().is_some_and(|s| s >= end) || !hook.requests.armed.load(Acquire) {
                    self.current = None;
                }
            }
        }
    }

    fn look_for_go(&mut self, hook: &Hook, now_us: i64) {
        let Some(cur) = self.current.as_ref() else { return };
        let (id, expires_us) = (cur.request.id.clone(), cur.request.expires_us);
        let go = match self.read_owned(&proto::go_name(&id), proto::MAX_GO_BYTES) {
            Ok(None) => {
                if now_us > expires_us {
                    self.current = None;
                }
                return;
            }
            Ok(Some(bytes)) => proto::parse_go(&bytes),
            Err(why) => Err(why),
        };
        let go = go.and_then(|g| {
            if g.id != id { Err(Refused("the go-ahead: its id is not its file's".to_owned())) } else { Ok(g) }
        });
        let go = match go {
            Ok(g) => g,
            Err(why) => {
                let mut a = self.answer(hook, &id, AnswerKind::Refused);
                a.reason = Some(why.0);
                self.write(&proto::armed_name(&id, &self.rank), &a);
                self.current = None;
                return;
            }
        };
        if !go.ranks.contains(&self.rank) {
            // Not among the ranks that acknowledged in time: never armed late.
            self.current = None;
            return;
        }
        let Some(cur) = self.current.as_mut() else { return };
        let features: AutoFeatures = cur
            .request
            .features
            .iter()
            .filter_map(|f| AutoFeature::ALL.into_iter().find(|a| a.as_str() == f))
            .collect();
        let end = go.start.saturating_add(cur.request.steps);
        let window = Requested {
            id: Arc::from(id.as_str()),
            start: go.start,
            end,
            features,
            requested_us: cur.request.requested_us,
            announced: false,
        };
        cur.phase = Phase::GoAsked { start: go.start, end };
        hook.requests.put(Ask::Go { window });
    }

    /// Lists the folder when it changed (or changed within the last second: a change in the
    /// same clock tick as the last listing keeps the mtime), and handles each new request.
    fn scan(&mut self, hook: &Arc<Hook>, now_us: i64) {
        let Some(dir) = &self.dir else { return };
        let Ok(meta) = fs::meta_of(dir) else { return };
        let recent = meta.mtime.0.saturating_mul(1_000_000).saturating_add(meta.mtime.1 / 1000)
            >= now_us.saturating_sub(2 * IDLE_US);
        if self.listed_mtime == Some(meta.mtime) && !recent {
            return;
        }
        self.listed_mtime = Some(meta.mtime);
        let Ok(entries) = dir.entries() else { return };
        for e in entries {
            let Ok(name) = e.name else { continue };
            let Some(id) = proto::parse_request_name(&name) else { continue };
            if self.handled.iter().any(|h| h == id) {
                continue;
            }
            let id = id.to_owned();
            if self.handled.len() == HANDLED {
                self.handled.pop_front();
            }
            self.handled.push_back(id.clone());
            self.handle(hook, &id, &name, e.kind, now_us);
        }
    }

    /// A new `request-<id>.json`: refused with a reason, ignored when expired, or asked of
    /// the trainer.
    fn handle(&mut self, hook: &Arc<Hook>, id: &str, name: &str, kind: Kind, now_us: i64) {
        let request = if kind == Kind::File {
            match self.read_owned(name, proto::MAX_FILE_BYTES) {
                Ok(Some(bytes)) => proto::parse_request(&bytes),
                Ok(None) => return,
                Err(why) => Err(why),
            }
        } else {
            Err(Refused(format!("{name} is not a regular file (a link or a special file): not read")))
        };
        let request = request.and_then(|r| {
            if r.id == id { Ok(r) } else { Err(Refused("the request: its id is not its file's".to_owned())) }
        });
        let refuse = |p: &Self, kind: AnswerKind, why: String| {
            let mut a = p.answer(hook, id, kind);
            a.reason = Some(why);
            p.write(&proto::ack_name(id, &p.rank), &a);
        };
        let r = match request {
            Ok(r) => r,
            Err(why) => {
                crate::log(&format_args!("trainprof trigger {id}: refused: {why}"));
                return refuse(self, AnswerKind::Refused, why.0);
            }
        };
        if now_us > r.expires_us {
            return;
        }
        if !hook.is_enabled() {
            return refuse(self, AnswerKind::Disabled, "profiling is off in this process".into());
        }
        if r.stacks {
            self.ask_stacks(hook, &r);
        }
        if r.features.is_empty() {
            return;
        }
        if let Some(cur) = &self.current {
            let what = match cur.phase {
                Phase::Armed { end } => format!("armed until step {end}"),
                _ => "in flight".to_owned(),
            };
            return refuse(
                self,
                AnswerKind::Refused,
                format!("one request at a time: {} is {what}", cur.request.id),
            );
        }
        self.current = Some(Current { request: r, phase: Phase::Asked });
        hook.requests.put(Ask::Ack);
    }

    /// `stacks`: the flight recorder's watchdog writes a dump of kind `requested` from its own
    /// thread (a rank stuck outside a step is dumped too); without `HangDetectionConfig` a
    /// short-lived thread of trainprof's writes the same dump and gives back what it borrowed
    /// ([`crate::hang::on_request`]).
    fn ask_stacks(&mut self, hook: &Arc<Hook>, r: &Request) {
        let started = if self.stacks.is_some() {
            Err("one stack dump at a time: another is being written".to_owned())
        } else {
            match hook.hang.as_deref() {
                None => match crate::hang::on_request::dump_now(Arc::clone(hook)) {
                    Ok(outcome) => {
                        self.on_request = Some(outcome);
                        Ok(())
                    }
                    Err(e) => Err(format!("cannot start the thread that takes the stacks: {e}")),
                },
                Some(h) if h.request_dump() => Ok(()),
                Some(_) => Err("the recorder's watchdog is not running".to_owned()),
            }
        };
        match started {
            Ok(()) => self.stacks = Some((r.id.clone(), r.expires_us)),
            Err(why) => {
                let mut a = self.answer(hook, &r.id, AnswerKind::Refused);
                a.reason = Some(why);
                self.write(&proto::stacks_name(&r.id, &self.rank), &a);
            }
        }
    }

    /// The bytes of the regular file `name` of the folder when it is this user's or root's
    /// and at most `max` bytes; `Ok(None)` when it does not exist; else why not.
    fn read_owned(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>, Refused> {
        let Some(dir) = &self.dir else { return Ok(None) };
        let f = match dir.open_regular(name, false) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Refused(format!("{name}: {}", strip_dir(&e.to_string(), dir)))),
        };
        let meta = fs::meta_of(&f).map_err(|e| Refused(format!("{name}: {e}")))?;
        if meta.uid != self.euid && meta.uid != 0 {
            return Err(Refused(format!(
                "{name} belongs to uid {}, not to the trainer's user or root: not read",
                meta.uid
            )));
        }
        if meta.nlink != 1 {
            return Err(Refused(format!("{name} has another hard link: not read")));
        }
        if meta.len > max {
            return Err(Refused(format!("{name} holds {} bytes, more than {max}: not read", meta.len)));
        }
        fs::read_bounded(f, max, std::path::Path::new(name)).map(Some).map_err(|e| Refused(e.to_string()))
    }

    fn answer(&self, hook: &Hook, id: &str, answer: AnswerKind) -> Answer {
        Answer {
            version: FORMAT_VERSION,
            id: id.to_owned(),
            node: hook.node_id().to_owned(),
            pid: hook.writer.os_pid,
            answer,
            step: None,
            steps_per_s: None,
            at_us: None,
            start: None,
            end: None,
            files: Vec::new(),
            reason: None,
        }
    }

    fn write(&self, name: &str, a: &Answer) {
        let Some(dir) = &self.dir else { return };
        let written = serde_json::to_vec(a)
            .map_err(std::io::Error::other)
            .and_then(|bytes| fs::write_new(dir, name, &self.rank, &bytes));
        match written {
            Ok(true) => {}
            Ok(false) => {
                crate::log(&format_args!("{} exists already: not answered", dir.display(name).display()))
            }
            Err(e) => crate::log(&format_args!("cannot write {}: {e}", dir.display(name).display())),
        }
    }
}

/// An error's text without the folder's path (the answer names files relative to it).
fn strip_dir(text: &str, dir: &Dir) -> String {
    let prefix = format!("{}/", dir.path().display());
    text.replace(&prefix, "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainprof_config::Config;

    #[test]
    fn a_window_opens_its_features_in_its_steps() {
        let r = Requested {
            id: Arc::from("a"),
            start: 30,
            end: 33,
            features: [AutoFeature::Python].into_iter().collect(),
            requested_us: 0,
            announced: false,
        };
        assert!(r.opens(AutoFeature::Python, 30) && r.opens(AutoFeature::Python, 32));
        assert!(!r.opens(AutoFeature::Python, 33) && !r.opens(AutoFeature::Python, 29));
        assert!(!r.opens(AutoFeature::Detailed, 31));
        assert!(r.contains(31) && !r.contains(33));
    }

    #[test]
    fn a_broken_feature_config_is_left_out() {
        let doc = r#"{"ProfilingParameters": {"LocalPath": "/x", "PythonProfilingConfig": "{\"ProfilerName\": \"perf\"}"}}"#;
        let c = trainprof_config::from_bytes(doc.as_bytes(), &trainprof_config::Sources::new());
        let all: AutoFeatures = AutoFeature::ALL.into_iter().collect();
        let (open, files, left_out) = openable(&c, all, "pytorch", "0-h");
        assert!(!open.contains(AutoFeature::Python) && open.contains(AutoFeature::Detailed));
        assert_eq!(left_out, ["python"]);
        assert_eq!(files, ["framework/pevents/", "framework/native/0-h/", "framework/memory/0-h/"]);
        // A broken MemoryProfilingConfig leaves the memory window out, as any feature's.
        let doc = r#"{"ProfilingParameters": {"LocalPath": "/x", "MemoryProfilingConfig": "{\"Stacks\": \"cpp\"}"}}"#;
        let c = trainprof_config::from_bytes(doc.as_bytes(), &trainprof_config::Sources::new());
        let (open, files, left_out) = openable(&c, all, "pytorch", "0-h");
        assert!(!open.contains(AutoFeature::Memory) && open.contains(AutoFeature::Python));
        assert_eq!(left_out, ["memory"]);
        assert!(!files.iter().any(|f| f.contains("memory")));
    }

    fn hook_in(dir: &std::path::Path) -> Arc<Hook> {
        let mut config = Config::defaults();
        config.local_path = dir.display().to_string();
        config.framework_configured = true;
        Hook::new(crate::hook::Options {
            framework: "pytorch",
            config,
            node_id: "0-test".into(),
            os_pid: 77,
            queue_capacity: 1024,
            base_us: crate::now_us() - 10_000_000,
            local_path_override: false,
            max_names: 1024,
        })
    }

    fn put(dir: &std::path::Path, name: &str, v: &serde_json::Value) {
        std::fs::write(dir.join(name), serde_json::to_vec(v).unwrap()).unwrap();
    }

    fn answer(dir: &std::path::Path, name: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
    }

    /// The whole exchange in one process, times injected: the request is acknowledged only
    /// once the trainer took it at a step boundary, the go-ahead arms `start..end` for the
    /// features asked, the window opens exactly there (with its event), and ends.
    #[test]
    fn request_ack_go_armed_and_the_window_opens_on_its_steps() {
        use crate::types::{TrainprofFeature, TrainprofMode};
        let scratch = tempfile::tempdir().unwrap();
        let hook = hook_in(scratch.path());
        let t0 = crate::now_us();
        let mut p = Poller::start(&hook, t0);
        let folder = scratch.path().join(REQUEST_DIR);
        assert!(folder.join("rank-0-test-77.json").is_file());
        for _ in 0..5 {
            hook.step_begin(TrainprofMode::Train, -1, t0);
            hook.step_end(t0);
        }
        put(
            &folder,
            "request-r1.json",
            &serde_json::json!({"version": 1, "id": "r1", "features": ["python", "detailed"], "stacks": false,
                "steps": 2, "roundup": 10, "requested_us": t0, "expires_us": t0 + 60_000_000}),
        );
        p.poll(&hook, t0);
        p.poll(&hook, t0 + 60_000);
        assert!(!folder.join("ack-r1-0-test-77.json").exists(), "no ack before a step boundary");
        hook.step_begin(TrainprofMode::Train, -1, t0);
        hook.step_end(t0);
        p.poll(&hook, t0 + 120_000);
        let ack = answer(&folder, "ack-r1-0-test-77.json");
        assert_eq!((ack["answer"].as_str(), ack["step"].as_u64()), (Some("ack"), Some(5)));
        put(
            &folder,
            "go-r1.json",
            &serde_json::json!({"version": 1, "id": "r1", "start": 10, "ranks": ["0-test-77"]}),
        );
        p.poll(&hook, t0 + 180_000);
        hook.step_begin(TrainprofMode::Train, -1, t0);
        hook.step_end(t0);
        p.poll(&hook, t0 + 240_000);
        let armed = answer(&folder, "armed-r1-0-test-77.json");
        assert_eq!(armed["answer"], "armed");
        assert_eq!((armed["start"].as_u64(), armed["end"].as_u64()), (Some(10), Some(12)));
        assert_eq!(
            armed["files"],
            serde_json::json!(["framework/pevents/", "framework/pytorch/cprofile/0-test/"])
        );
        let mut detailed = Vec::new();
        for _ in 7..16 {
            let step = hook.step_begin(TrainprofMode::Train, -1, t0);
            if hook.is_active(TrainprofFeature::Detailed, -1, None, 0.0) {
                detailed.push(step);
            }
            assert!(!hook.is_active(TrainprofFeature::Dataloader, -1, Some("x"), 0.0));
            hook.step_end(t0);
        }
        assert_eq!(detailed, [10, 11]);
        let events: Vec<_> = std::iter::from_fn(|| hook.pop()).filter_map(|e| e.requested_info()).collect();
        assert_eq!(events.len(), 1);
        assert_eq!((events[0].window_start, events[0].num_steps), (10, 2));
        assert!(!hook.requests.armed.load(Acquire), "dropped past its end");
        // A second request is welcome again once the window is over.
        p.poll(&hook, t0 + 2_000_000);
        assert!(p.current.is_none());
        p.stop();
        assert!(!folder.join("rank-0-test-77.json").exists());
    }

    /// A memory request (docs/formats.md, "Memory windows"): armed with the snapshots'
    /// folder, open on its steps for `trainprof_window_active` and for `trainprof_step_next`'s
    /// memory bit ([`Hook::extra_memory_open`]), which says nothing outside them.
    #[test]
    fn a_memory_request_opens_the_memory_window_on_its_steps() {
        use crate::types::{TrainprofFeature, TrainprofMode};
        let scratch = tempfile::tempdir().unwrap();
        let hook = hook_in(scratch.path());
        let t0 = crate::now_us();
        let mut p = Poller::start(&hook, t0);
        let folder = scratch.path().join(REQUEST_DIR);
        hook.step_begin(TrainprofMode::Train, -1, t0);
        assert!(!hook.extra_memory_open(-1) && !hook.is_active(TrainprofFeature::Memory, -1, None, 0.0));
        put(
            &folder,
            "request-m1.json",
            &serde_json::json!({"version": 1, "id": "m1", "features": ["memory"], "stacks": false,
                "steps": 3, "roundup": 1, "requested_us": t0, "expires_us": t0 + 60_000_000}),
        );
        p.poll(&hook, t0);
        hook.step_end(t0);
        hook.step_begin(TrainprofMode::Train, -1, t0);
        p.poll(&hook, t0 + 60_000);
        assert_eq!(answer(&folder, "ack-m1-0-test-77.json")["step"], 1);
        put(
            &folder,
            "go-m1.json",
            &serde_json::json!({"version": 1, "id": "m1", "start": 4, "ranks": ["0-test-77"]}),
        );
        p.poll(&hook, t0 + 120_000);
        hook.step_end(t0);
        hook.step_begin(TrainprofMode::Train, -1, t0);
        p.poll(&hook, t0 + 180_000);
        let armed = answer(&folder, "armed-m1-0-test-77.json");
        assert_eq!((armed["answer"].as_str(), armed["start"].as_u64()), (Some("armed"), Some(4)));
        assert_eq!(armed["files"], serde_json::json!(["framework/memory/0-test/"]));
        let (mut active, mut bit) = (Vec::new(), Vec::new());
        for _ in 3..10 {
            hook.step_end(t0);
            let step = hook.step_begin(TrainprofMode::Train, -1, t0);
            if hook.is_active(TrainprofFeature::Memory, -1, None, 0.0) {
                active.push(step);
            }
            if hook.extra_memory_open(-1) {
                bit.push(step);
            }
            assert!(!hook.is_active(TrainprofFeature::Detailed, -1, None, 0.0), "only the memory window");
        }
        assert_eq!((active.as_slice(), bit.as_slice()), ([4, 5, 6].as_slice(), [4, 5, 6].as_slice()));
        let events: Vec<_> = std::iter::from_fn(|| hook.pop()).filter_map(|e| e.requested_info()).collect();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].features.iter().collect::<Vec<_>>(), [AutoFeature::Memory]);
        assert!(!hook.requests.armed.load(Acquire) && !hook.extra_memory_open(5), "dropped past its end");
        p.stop();
    }

    /// A rank already at or past the start answers missed and arms nothing; a rank not listed
    /// in the go-ahead never arms; a second request while one is in flight is refused.
    #[test]
    fn missed_unlisted_and_busy() {
        use crate::types::TrainprofMode;
        let scratch = tempfile::tempdir().unwrap();
        let hook = hook_in(scratch.path());
        let t0 = crate::now_us();
        let mut p = Poller::start(&hook, t0);
        let folder = scratch.path().join(REQUEST_DIR);
        let request = |id: &str| {
            serde_json::json!({"version": 1, "id": id, "features": ["python"], "stacks": false,
                "steps": 2, "roundup": 1, "requested_us": t0, "expires_us": t0 + 60_000_000})
        };
        put(&folder, "request-a.json", &request("a"));
        p.poll(&hook, t0);
        hook.step_begin(TrainprofMode::Train, -1, t0);
        p.poll(&hook, t0 + 60_000);
        assert_eq!(answer(&folder, "ack-a-0-test-77.json")["answer"], "ack");
        put(&folder, "request-b.json", &request("b"));
        p.poll(&hook, t0 + 1_100_000);
        let busy = answer(&folder, "ack-b-0-test-77.json");
        assert_eq!(busy["answer"], "refused");
        assert!(busy["reason"].as_str().unwrap().contains("one request at a time"), "{busy}");
        // The go-ahead's start is the step the rank is at: missed.
        put(
            &folder,
            "go-a.json",
            &serde_json::json!({"version": 1, "id": "a", "start": 0, "ranks": ["0-test-77"]}),
        );
        p.poll(&hook, t0 + 1_200_000);
        hook.step_begin(TrainprofMode::Train, -1, t0);
        p.poll(&hook, t0 + 1_300_000);
        assert_eq!(answer(&folder, "armed-a-0-test-77.json")["answer"], "missed");
        assert!(!hook.requests.armed.load(Acquire));
        // Unlisted: no answer, nothing armed.
        put(&folder, "request-c.json", &request("c"));
        p.poll(&hook, t0 + 2_400_000);
        hook.step_begin(TrainprofMode::Train, -1, t0);
        p.poll(&hook, t0 + 2_500_000);
        put(
            &folder,
            "go-c.json",
            &serde_json::json!({"version": 1, "id": "c", "start": 100, "ranks": ["1-x-1"]}),
        );
        p.poll(&hook, t0 + 2_600_000);
        hook.step_begin(TrainprofMode::Train, -1, t0);
        p.poll(&hook, t0 + 2_700_000);
        assert!(!folder.join("armed-c-0-test-77.json").exists());
        assert!(!hook.requests.armed.load(Acquire) && p.current.is_none());
    }

    /// A request owned by another user is refused unread (root can give a file away).
    #[test]
    fn a_request_of_another_user_is_refused() {
        if fs::euid() != 0 {
            return;
        }
        let scratch = tempfile::tempdir().unwrap();
        let hook = hook_in(scratch.path());
        let t0 = crate::now_us();
        let mut p = Poller::start(&hook, t0);
        let folder = scratch.path().join(REQUEST_DIR);
        let path = folder.join("request-u.json");
        std::fs::write(&path, b"{}").unwrap();
        std::os::unix::fs::chown(&path, Some(12345), None).unwrap();
        p.poll(&hook, t0);
        let a = answer(&folder, "ack-u-0-test-77.json");
        assert_eq!(a["answer"], "refused");
        assert!(a["reason"].as_str().unwrap().contains("belongs to uid 12345"), "{a}");
    }
}
