//! One timeline event as every reader decodes it (`docs/formats.md`, "File content"), with
//! the bounds that keep a planted file from growing memory (`docs/report.md`, "Untrusted
//! input"): an event of at most [`MAX_EVENT_BYTES`], `args` cut to [`MAX_ARGS`] keys,
//! [`MAX_ARG_VALUES`] values and strings of [`MAX_ARG_STRING`] bytes, at most [`MAX_PHASES`]
//! phases a file, and times within [`PLAUSIBLE_S`].
//!
//! The report reads whole files ([`file_events`]); the agent's progress reads the lines it
//! follows one at a time ([`line`]) and its repair the events of a cut file
//! ([`RawEvent::from_value`]). Each decides what it skips and counts from the same fields.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader};

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::protocol::timeline;
use crate::text::shown;

/// One timeline event larger than this ends the file's read (ours are < 1 KiB): an event is
/// held whole while it is parsed.
pub const MAX_EVENT_BYTES: u64 = 1 << 20;
/// Per event, `args` keeps its first `MAX_ARGS` keys, `MAX_ARG_VALUES` JSON values in all
/// (nested ones included) and strings up to `MAX_ARG_STRING` bytes; the rest is dropped
/// (ours hold at most 6 numbers and a short string).
pub const MAX_ARGS: usize = 64;
pub const MAX_ARG_VALUES: usize = 256;
pub const MAX_ARG_STRING: usize = 4096;
/// Phases (trace processes) per timeline file (the hook names a few dozen).
pub const MAX_PHASES: usize = 4096;
/// Step modes (`TRAIN`, `EVAL`, …) kept per job by the report, per node by the agent's
/// progress (`docs/metrics.md`, "Labels and caps").
pub const MAX_MODES: usize = 16;
/// Longest name kept (node, GPU, rank, mode, phase), in bytes; a longer one counts as past
/// its cap.
pub const MAX_NAME_BYTES: usize = 256;
/// Times (seconds since the epoch) outside [2000-01-01, 2100-01-01) are not read: no job
/// runs then, and arithmetic on them (a tick every 60 s from 1e18) would not advance.
pub const PLAUSIBLE_S: std::ops::Range<f64> = 946_684_800.0..4_102_444_800.0;

/// Whether `t` (seconds since the epoch) is a plausible time ([`PLAUSIBLE_S`]).
pub fn plausible_s(t: f64) -> bool {
    PLAUSIBLE_S.contains(&t)
}

/// Whether `t` (µs since the epoch) is a plausible time ([`PLAUSIBLE_S`]).
pub fn plausible_us(t: i64) -> bool {
    plausible_s(t as f64 / 1e6)
}

/// One complete event of a timeline, with absolute times.
#[derive(Debug, Clone)]
pub struct Event<'a> {
    /// The timeline node (`<rank>-<host>`).
    pub node: &'a str,
    /// The trace process's name (the phase: `Step:ModeKeys.TRAIN`, `Forward`, …).
    pub phase: &'a str,
    pub name: &'a str,
    /// `X` (complete) or `i`/`I` (instant, `dur_us` 0).
    pub ph: char,
    pub start_us: i64,
    pub dur_us: i64,
    pub step: Option<i64>,
    pub args: &'a serde_json::Map<String, serde_json::Value>,
}

/// One element of a timeline's array as written, its fields typed and bounded; a field of
/// the wrong type fails the element (and, for the report, the file's read).
#[derive(Debug, Deserialize)]
pub struct RawEvent {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub ph: Option<String>,
    #[serde(default)]
    pid: Option<Small>,
    #[serde(default)]
    pub ts: Option<f64>,
    #[serde(default)]
    pub dur: Option<f64>,
    #[serde(default)]
    pub args: Option<Args>,
}

/// Why an event's times are not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadTime {
    /// No `ts` (or, for a complete event, no `dur`), not finite, or `dur` negative.
    Invalid,
    /// Its start or end outside [`PLAUSIBLE_S`].
    Implausible,
}

impl RawEvent {
    /// The element `v` (one of a repaired file's events); `None` when a field has the wrong
    /// type.
    pub fn from_value(v: &serde_json::Value) -> Option<RawEvent> {
        RawEvent::deserialize(v).ok()
    }

    /// `ph`, or empty.
    pub fn ph(&self) -> &str {
        self.ph.as_deref().unwrap_or("")
    }

    /// Its `args` (bounded), empty without.
    pub fn args(&self) -> &serde_json::Map<String, serde_json::Value> {
        static EMPTY: std::sync::OnceLock<serde_json::Map<String, serde_json::Value>> =
            std::sync::OnceLock::new();
        self.args.as_ref().map_or_else(|| EMPTY.get_or_init(serde_json::Map::new), |a| &a.map)
    }

    /// Its start (µs since the epoch: `base` plus `ts`) and duration (µs, 0 for an instant
    /// event): `ts` and, for a complete event, `dur` finite numbers, `dur` not negative, the
    /// start and end plausible ([`plausible_us`]). `as` saturates: a huge `ts` or `dur` stays
    /// huge and is not plausible.
    pub fn times(&self, base: i64) -> Result<(i64, i64), BadTime> {
        let complete = self.ph() == timeline::PH_COMPLETE;
        let Some(ts) = self.ts else { return Err(BadTime::Invalid) };
        let dur = if complete { self.dur.unwrap_or(-1.0) } else { 0.0 };
        if !ts.is_finite() || !dur.is_finite() || dur < 0.0 {
            return Err(BadTime::Invalid);
        }
        let start_us = base.saturating_add(ts as i64);
        let dur_us = dur as i64;
        if !plausible_us(start_us) || !plausible_us(start_us.saturating_add(dur_us)) {
            return Err(BadTime::Implausible);
        }
        Ok((start_us, dur_us))
    }

    /// Its step (`args.step_num`): a decimal string, or an integer.
    pub fn step(&self) -> Option<i64> {
        match self.args().get(timeline::STEP_NUM_KEY) {
            Some(serde_json::Value::String(s)) => s.trim().parse().ok(),
            Some(v) => v.as_i64(),
            None => None,
        }
    }

    /// The base time of pid 0's `process_name` line (`args.start_time_since_epoch_in_micros`).
    pub fn base_time(&self) -> Option<i64> {
        self.args().get(timeline::BASE_TIME_KEY).and_then(serde_json::Value::as_i64)
    }
}

/// One line of a timeline as the hook writes it (one event a line, `,` before or after it):
/// the event, or `None` for a line that is not one (`[`, `]`, a cut line).
pub fn line(line: &[u8]) -> Option<RawEvent> {
    let t = line.trim_ascii();
    let t = t.strip_suffix(b",").unwrap_or(t);
    if !t.starts_with(b"{") {
        return None;
    }
    serde_json::from_slice(t).ok()
}

/// An event's `args`, bounded as [`MAX_ARGS`] says; `cut` when something was dropped.
#[derive(Debug, Default)]
pub struct Args {
    map: serde_json::Map<String, serde_json::Value>,
    cut: bool,
}

impl<'de> Deserialize<'de> for Args {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Args, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Args;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Args, A::Error> {
                let budget = std::cell::Cell::new(MAX_ARG_VALUES);
                let mut out = Args::default();
                while let Some(k) = m.next_key::<String>()? {
                    if out.map.len() >= MAX_ARGS {
                        m.next_value::<IgnoredAny>()?;
                        out.cut = true;
                        continue;
                    }
                    match m.next_value_seed(Bounded(&budget))? {
                        Some(v) => {
                            out.map.insert(k, v);
                        }
                        None => out.cut = true,
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

/// A JSON value of at most a few nodes (an event's `pid`); a larger one reads as none.
#[derive(Debug)]
struct Small(Option<serde_json::Value>);

impl<'de> Deserialize<'de> for Small {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Small, D::Error> {
        let budget = std::cell::Cell::new(16);
        Bounded(&budget).deserialize(d).map(Small)
    }
}

/// Reads one JSON value while `budget` lasts (one a value, nested ones included; strings up
/// to [`MAX_ARG_STRING`] bytes): `None`, the value consumed but dropped, when it does not fit.
/// Nesting is serde_json's (at most 128).
struct Bounded<'b>(&'b std::cell::Cell<usize>);

impl Bounded<'_> {
    fn take(&self) -> bool {
        let left = self.0.get();
        self.0.set(left.saturating_sub(1));
        left > 0
    }
}

impl<'de> DeserializeSeed<'de> for Bounded<'_> {
    type Value = Option<serde_json::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded<'_> {
    type Value = Option<serde_json::Value>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(self.take().then_some(serde_json::Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(self.take().then(|| v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(self.take().then(|| v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(self.take().then(|| v.into()))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok((self.take() && v.len() <= MAX_ARG_STRING).then(|| v.into()))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(self.take().then_some(serde_json::Value::Null))
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(self.take().then_some(serde_json::Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut whole = self.take();
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Bounded(self.0))? {
            match v {
                Some(v) if whole => out.push(v),
                _ => whole = false,
            }
        }
        Ok(whole.then_some(serde_json::Value::Array(out)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        let mut whole = self.take();
        let mut out = serde_json::Map::new();
        while let Some(k) = m.next_key::<String>()? {
            match m.next_value_seed(Bounded(self.0))? {
                Some(v) if whole && k.len() <= MAX_ARG_STRING => {
                    out.insert(k, v);
                }
                _ => whole = false,
            }
        }
        Ok(whole.then_some(serde_json::Value::Object(out)))
    }
}

/// State carried from one file of a node to the next: smdebug reads a file without a base
/// time with the previous file's (`docs/formats.md`, trap T19).
#[derive(Debug, Default)]
pub struct Bases(HashMap<String, i64>);

/// Reads one timeline file's events from `r` (node `node`) as `f(event)`, `bases` carrying
/// a node's base time from one of its files to the next: `(result, cost)`; the error says
/// why the read stopped (events before it were handed on).
pub fn file_events(
    r: impl io::Read,
    node: &str,
    bases: &mut Bases,
    f: &mut dyn FnMut(&Event<'_>),
) -> (Result<(), TimelineError>, TimelineCost) {
    one_timeline(r, node, bases, f)
}

/// What one timeline file's read dropped, and what it cost.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TimelineCost {
    /// Events handed on.
    pub events: u64,
    /// Events skipped for a time outside [`PLAUSIBLE_S`] (start or end).
    pub implausible: u64,
    /// Events whose `args` lost something to the bounds.
    pub args_cut: u64,
    /// `process_name` lines past [`MAX_PHASES`].
    pub phases_dropped: u64,
    /// Bytes of the largest event (at most [`MAX_EVENT_BYTES`]).
    pub largest_event: u64,
}

/// Reads one timeline's events from `r` (at most [`MAX_EVENT_BYTES`] an event) as
/// the report does, for tests of the bounds: `(result, cost)`.
pub fn read_timeline(
    r: impl io::Read,
    node: &str,
    f: &mut dyn FnMut(&Event<'_>),
) -> (Result<(), TimelineError>, TimelineCost) {
    let mut bases = Bases::default();
    one_timeline(r, node, &mut bases, f)
}

fn one_timeline(
    file: impl io::Read,
    node: &str,
    bases: &mut Bases,
    f: &mut dyn FnMut(&Event<'_>),
) -> (Result<(), TimelineError>, TimelineCost) {
    let used = std::rc::Rc::new(EventBytes::default());
    let limited = EventLimit { inner: BufReader::new(file), used: used.clone() };
    let mut de = serde_json::Deserializer::from_reader(limited);
    let mut st = FileState {
        node,
        base: bases.0.get(node).copied(),
        phases: HashMap::new(),
        f,
        used,
        cost: TimelineCost::default(),
    };
    let r = de.deserialize_seq(Elements(&mut st)).map_err(TimelineError::of);
    if let Some(b) = st.base {
        bases.0.insert(node.to_owned(), b);
    }
    (r, st.cost)
}

/// Why a timeline's read stopped: the kind of problem and where, never a value from the
/// file (serde_json's messages quote what they found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimelineError {
    /// Our own limits ([`MAX_EVENT_BYTES`]) and the OS's read errors: serde_json's message,
    /// which holds no content.
    Read(String),
    /// Not JSON.
    Syntax { line: usize, column: usize },
    /// JSON, but not an array of trace events.
    WrongType { line: usize, column: usize },
    /// The JSON ends early.
    EndsEarly { line: usize, column: usize },
}

impl TimelineError {
    fn of(e: serde_json::Error) -> TimelineError {
        use serde_json::error::Category;
        let (line, column) = (e.line(), e.column());
        match e.classify() {
            Category::Io => TimelineError::Read(e.to_string()),
            Category::Syntax => TimelineError::Syntax { line, column },
            Category::Data => TimelineError::WrongType { line, column },
            Category::Eof => TimelineError::EndsEarly { line, column },
        }
    }
}

impl std::fmt::Display for TimelineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TimelineError::Read(e) => write!(f, "{e}"),
            TimelineError::Syntax { line, column } => {
                write!(f, "not JSON (syntax error at line {line}, column {column})")
            }
            TimelineError::WrongType { line, column } => write!(
                f,
                "not an array of trace events (a value of the wrong type at line {line}, column {column})"
            ),
            TimelineError::EndsEarly { line, column } => {
                write!(f, "the JSON ends early (at line {line}, column {column})")
            }
        }
    }
}

impl std::error::Error for TimelineError {}

/// Bytes read of the event being parsed, while `armed`.
#[derive(Debug, Default)]
struct EventBytes {
    n: std::cell::Cell<u64>,
    armed: std::cell::Cell<bool>,
    largest: std::cell::Cell<u64>,
}

/// A reader that fails once one event has taken more than [`MAX_EVENT_BYTES`].
struct EventLimit<R> {
    inner: R,
    used: std::rc::Rc<EventBytes>,
}

impl<R: io::Read> io::Read for EventLimit<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let u = &self.used;
        if !u.armed.get() {
            return self.inner.read(buf);
        }
        let left = MAX_EVENT_BYTES + 1 - u.n.get().min(MAX_EVENT_BYTES + 1);
        if left == 0 {
            return Err(io::Error::other(format!("an event holds more than {MAX_EVENT_BYTES} bytes")));
        }
        let cap = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..cap])?;
        u.n.set(u.n.get() + n as u64);
        u.largest.set(u.largest.get().max(u.n.get()));
        Ok(n)
    }
}

struct FileState<'a, 'f> {
    node: &'a str,
    base: Option<i64>,
    /// Trace pid (as JSON text) → the phase's name.
    phases: HashMap<String, String>,
    f: &'f mut dyn FnMut(&Event<'_>),
    used: std::rc::Rc<EventBytes>,
    cost: TimelineCost,
}

impl FileState<'_, '_> {
    fn take(&mut self, e: RawEvent) {
        let pid = e.pid.as_ref().and_then(|p| p.0.as_ref()).map(|p| p.to_string()).unwrap_or_default();
        let ph = e.ph();
        if e.args.as_ref().is_some_and(|a| a.cut) {
            self.cost.args_cut += 1;
        }
        let args = e.args();
        use timeline::{PH_COMPLETE, PH_INSTANT, PH_INSTANT_OLD, PH_METADATA};
        match ph {
            PH_METADATA if e.name.as_deref() == Some(timeline::PROCESS_NAME) => {
                if let Some(b) = e.base_time() {
                    self.base = Some(b);
                } else if let Some(n) = args.get("name").and_then(|v| v.as_str()) {
                    if self.phases.len() < MAX_PHASES || self.phases.contains_key(&pid) {
                        self.phases.insert(pid, shown(n).into_owned());
                    } else {
                        self.cost.phases_dropped += 1;
                    }
                }
            }
            PH_COMPLETE | PH_INSTANT | PH_INSTANT_OLD => {
                let Some(name) = e.name.as_deref() else { return };
                let (start_us, dur_us) = match e.times(self.base.unwrap_or(0)) {
                    Ok(t) => t,
                    Err(BadTime::Invalid) => return,
                    Err(BadTime::Implausible) => {
                        self.cost.implausible += 1;
                        return;
                    }
                };
                let step = e.step();
                let phase = self.phases.get(&pid).map_or(timeline::UNKNOWN_PHASE, String::as_str);
                let name = shown(name);
                let ev = Event {
                    node: self.node,
                    phase,
                    name: &name,
                    ph: if ph == PH_COMPLETE { 'X' } else { 'i' },
                    start_us,
                    dur_us,
                    step,
                    args,
                };
                self.cost.events += 1;
                (self.f)(&ev);
            }
            _ => {}
        }
    }
}

/// Visits the top-level array one element at a time.
struct Elements<'s, 'a, 'f>(&'s mut FileState<'a, 'f>);

impl<'de> Visitor<'de> for Elements<'_, '_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON array of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        loop {
            // Each element's bytes are counted from here ([`MAX_EVENT_BYTES`]).
            self.0.used.n.set(0);
            self.0.used.armed.set(true);
            let e = seq.next_element::<Option<RawEvent>>();
            self.0.used.armed.set(false);
            self.0.cost.largest_event = self.0.used.largest.get();
            match e? {
                Some(Some(e)) => self.0.take(e),
                Some(None) => {}
                None => return Ok(()),
            }
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // An object wrapper (`{"traceEvents": [...]}`): smdebug reads zero events; so do we
        // (skipped without holding a value).
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for Elements<'_, '_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}
