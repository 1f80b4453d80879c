//! A dump folder (docs/formats.md, "Hang and crash dumps"): `stall.json` (written without
//! allocating, so that the crash handler formats it into a static buffer too), `ended.json`,
//! and the folder's names under `framework/hangs/<node>/`.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::SeqCst;

use trainprof_output::fs::{self, Dir};
use trainprof_output::protocol::dump::{
    DETECTED_US, ENDED_US, HOOK, HOOK_DROPPED_NAMES, HOOK_DROPPED_QUEUE_FULL, HOOK_DROPPED_WRITER,
    HOOK_DUMPS, HOOK_ENABLED, HOOK_EVENTS_WRITTEN, HOOK_FILES_SEALED, HOOK_OPEN_FAILURES, KIND,
    LAST_COMPLETED_STEP, MEDIAN_STEP_S, MODE, NAME, NATIVE_STACKS_FILE, NODE, OPEN_WINDOWS, PHASE, PID,
    PYTHON_STACKS_FILE, RECORD_VERSION, RING as RING_KEY, RING_T_US, RING_WHAT, SIGNAL, STALL_FILE,
    STALLED_S, STEP, STEP_STARTED_US, THRESHOLD_S, TRACEBACK_FILE, VERSION,
};
pub use trainprof_output::protocol::dump::{DumpKind, dump_name, node_dir};

use super::faulthandler::python_stacks;
use super::ring::{Entry, What, median_step_s};
use super::unwind::native_stacks;
use super::{Hang, Host, MAX_TRACEBACK_BYTES, RING, StepState};
use crate::types::TrainprofMode;

/// `stall.json`'s fields that are not read from the ring.
#[derive(Debug, Clone, Copy)]
pub struct Header<'a> {
    pub kind: DumpKind,
    pub node: &'a str,
    pub pid: u32,
    pub state: StepState,
    pub detected_us: i64,
    pub threshold_s: Option<f64>,
    pub median_step_s: Option<f64>,
    pub signal: Option<i32>,
}

/// `SIGTERM` for 15, …: the names a dump uses.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGABRT => "SIGABRT",
        libc::SIGFPE => "SIGFPE",
        libc::SIGILL => "SIGILL",
        _ => "signal",
    }
}

/// A JSON string (no allocation).
pub(super) struct JsonStr<'a>(&'a str);

impl std::fmt::Display for JsonStr<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('"')
    }
}

/// A float or `null`, as JSON.
pub(super) struct Num(Option<f64>);

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            // Far from 1 in scientific notation (a 1e308 timeout is 5 bytes, not 309 digits;
            // both are JSON numbers). No allocation either way: the crash path uses it.
            Some(v) if v.is_finite() && v != 0.0 && !(1e-6..1e15).contains(&v.abs()) => write!(f, "{v:e}"),
            Some(v) if v.is_finite() => write!(f, "{v}"),
            _ => f.write_str("null"),
        }
    }
}

/// A complete event of [`Hang::events`] with its names, for `stall.json`'s ring.
#[derive(Debug, Clone, Copy)]
pub struct Span<'a> {
    pub start_us: i64,
    pub end_us: i64,
    pub phase: &'a str,
    pub name: &'a str,
    pub step: i64,
}

/// Writes `stall.json` (docs/formats.md, "Hang and crash dumps") to `out` without
/// allocating (the fatal-signal path formats into a static buffer). `ring` is the steps'
/// entries, `spans` the last complete events (each a `phase_start` and a `phase_end` entry
/// after the steps'; none on the fatal-signal path); `open_windows` and `hook` are written as
/// given (`hook` a JSON object).
pub fn write_stall_json(
    out: &mut impl std::fmt::Write,
    h: &Header<'_>,
    ring: &[Entry],
    spans: &[Span<'_>],
    open_windows: &[&str],
    hook: &dyn Fn(&mut dyn std::fmt::Write) -> std::fmt::Result,
) -> std::fmt::Result {
    let s = h.state;
    let step = s.step.max(0);
    let mode = s.mode.map_or("train", TrainprofMode::python_name);
    write!(
        out,
        "{{\"{VERSION}\": {RECORD_VERSION}, \"{KIND}\": \"{}\", \"{NODE}\": {}, \"{PID}\": {}, \"{MODE}\": \"{mode}\", \"{STEP}\": {step}, ",
        h.kind.as_str(),
        JsonStr(h.node),
        h.pid
    )?;
    if s.in_step {
        write!(out, "\"{STEP_STARTED_US}\": {}, ", s.begin_us)?;
    } else {
        write!(out, "\"{STEP_STARTED_US}\": null, ")?;
    }
    write!(
        out,
        "\"{DETECTED_US}\": {}, \"{THRESHOLD_S}\": {}, \"{MEDIAN_STEP_S}\": {}, ",
        h.detected_us,
        Num(h.threshold_s),
        Num(h.median_step_s)
    )?;
    // The last step of the current mode that ended.
    let last_completed = ring
        .iter()
        .rev()
        .find(|e| e.what == What::StepEnd && s.mode.is_none_or(|m| m == e.mode))
        .map(|e| e.step);
    match last_completed {
        Some(n) => write!(out, "\"{LAST_COMPLETED_STEP}\": {n}, ")?,
        None => write!(out, "\"{LAST_COMPLETED_STEP}\": null, ")?,
    }
    match h.signal {
        Some(sig) => write!(out, "\"{SIGNAL}\": \"{}\", ", signal_name(sig))?,
        None => write!(out, "\"{SIGNAL}\": null, ")?,
    }
    write!(out, "\"{RING_KEY}\": [")?;
    for (i, e) in ring.iter().enumerate() {
        if i > 0 {
            out.write_str(", ")?;
        }
        write!(
            out,
            "{{\"{RING_T_US}\": {}, \"{RING_WHAT}\": \"{}\", \"{NAME}\": {}, \"{STEP}\": {}}}",
            e.t_us,
            e.what.as_str(),
            JsonStr(e.mode.step_phase()),
            e.step
        )?;
    }
    for (i, sp) in spans.iter().enumerate() {
        if i > 0 || !ring.is_empty() {
            out.write_str(", ")?;
        }
        for (k, (t, what)) in [(sp.start_us, "phase_start"), (sp.end_us, "phase_end")].into_iter().enumerate()
        {
            if k > 0 {
                out.write_str(", ")?;
            }
            write!(
                out,
                "{{\"{RING_T_US}\": {t}, \"{RING_WHAT}\": \"{what}\", \"{NAME}\": {}, \"{PHASE}\": {}, \"{STEP}\": {}}}",
                JsonStr(sp.name),
                JsonStr(sp.phase),
                sp.step
            )?;
        }
    }
    write!(out, "], \"{OPEN_WINDOWS}\": [")?;
    for (i, w) in open_windows.iter().enumerate() {
        if i > 0 {
            out.write_str(", ")?;
        }
        write!(out, "{}", JsonStr(w))?;
    }
    write!(out, "], \"{HOOK}\": ")?;
    hook(out)?;
    out.write_str("}\n")
}

/// `ended.json`: when the stalled step that began at `begin_us` ended.
pub(super) fn ended_json(ended_us: i64, begin_us: i64) -> String {
    format!("{{\"{ENDED_US}\": {ended_us}, \"{STALLED_S}\": {}}}\n", (ended_us - begin_us) as f64 / 1e6)
}

pub(super) fn write_file(hook: &dyn Host, rel: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let dir = Dir::open_root(hook.local_path(), true)?.sub(rel, true)?;
    if !fs::write_new(&dir, name, &hook.os_pid().to_string(), bytes)? {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, format!("{name} exists")));
    }
    Ok(())
}

/// The hook's state as `stall.json`'s `hook` object.
fn hook_json(hook: &dyn Host, dumps: u32) -> impl Fn(&mut dyn std::fmt::Write) -> std::fmt::Result + '_ {
    move |out| {
        let s = hook.stats();
        write!(
            out,
            "{{\"{HOOK_ENABLED}\": {}, \"{HOOK_EVENTS_WRITTEN}\": {}, \"{HOOK_FILES_SEALED}\": {}, \"{HOOK_DROPPED_QUEUE_FULL}\": {}, \"{HOOK_DROPPED_WRITER}\": {}, \"{HOOK_DROPPED_NAMES}\": {}, \"{HOOK_OPEN_FAILURES}\": {}, \"{HOOK_DUMPS}\": {dumps}}}",
            hook.is_enabled(),
            s.written,
            s.files_sealed,
            s.dropped_queue_full,
            s.dropped_writer,
            s.dropped_names,
            s.open_failures
        )
    }
}

/// Writes one dump folder; its path relative to `LocalPath`, or `None` (one log line).
/// `state` is the step state judged (`None`: read now); `stall` the threshold and median of
/// a stall; `traceback` an exception's text.
#[allow(clippy::too_many_arguments)]
pub fn dump(
    hook: &dyn Host,
    hang: &Hang,
    state: Option<StepState>,
    kind: DumpKind,
    signal: Option<i32>,
    stall: Option<(f64, Option<f64>)>,
    traceback: Option<&str>,
) -> Option<String> {
    let _own = hook.own_work();
    let dumps = hang.dumps.fetch_add(1, SeqCst) + 1;
    let state = state.unwrap_or_else(|| hook.step_state());
    let detected_us = crate::now_us();
    // The ring, the median and the open windows as at detection: taking the stacks may take
    // a while (a signal per thread, symbolising), and the trainer may step on meanwhile.
    let mut entries = Box::new([Entry::EMPTY; RING]);
    let n = hang.ring.snapshot(&mut entries);
    let median = stall.map_or_else(|| state.mode.and_then(|m| median_step_s(&entries[..n], m)), |s| s.1);
    let open = hook.open_windows(state.step.max(0) as u64, detected_us as f64 / 1e6);
    let mut events = Box::new([Entry::EMPTY; RING]);
    let m = hang.events.snapshot(&mut events);
    let mut names = Vec::new();
    hook.names(&mut names);
    let name_of = |id: u32| names.get(id as usize).map_or("?", |n| &**n);
    let spans: Vec<Span<'_>> = events[..m]
        .iter()
        .map(|e| Span {
            start_us: e.t_us,
            end_us: e.end_us,
            phase: name_of(e.phase),
            name: name_of(e.name),
            step: e.step,
        })
        .collect();
    let rel = format!("{}/{}", node_dir(hook.node_id()), dump_name(state.step, detected_us));
    let result = (|| -> std::io::Result<()> {
        let dir = Dir::open_root(hook.local_path(), true)?.sub(&rel, true)?;
        let tag = hook.os_pid().to_string();
        let put = |name: &str, bytes: &[u8]| -> std::io::Result<()> {
            if fs::write_new(&dir, name, &tag, bytes)? {
                Ok(())
            } else {
                Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, format!("{name} exists")))
            }
        };
        if let Some(tb) = traceback {
            let end = tb.floor_char_boundary(MAX_TRACEBACK_BYTES);
            put(TRACEBACK_FILE, &tb.as_bytes()[..end])?;
        } else {
            if let Some(py) = python_stacks(hang) {
                put(PYTHON_STACKS_FILE, &py)?;
            }
            put(NATIVE_STACKS_FILE, native_stacks(hang.python_signal.load(SeqCst)).as_bytes())?;
        }
        let header = Header {
            kind,
            node: hook.node_id(),
            pid: hook.os_pid(),
            state,
            detected_us,
            threshold_s: stall.map(|s| s.0),
            median_step_s: median,
            signal,
        };
        let mut json = String::new();
        write_stall_json(&mut json, &header, &entries[..n], &spans, &open, &hook_json(hook, dumps))
            .map_err(std::io::Error::other)?;
        put(STALL_FILE, json.as_bytes())
    })();
    match result {
        Ok(()) => {
            crate::log(&format_args!("hang detection: {} dump in {rel}", kind.as_str()));
            Some(rel)
        }
        Err(e) => {
            crate::log(&format_args!("hang detection: cannot write {rel}: {e}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hang::fixed::Fixed;

    #[test]
    fn stall_json_is_json_and_fits_a_fixed_buffer() {
        let step = |t_us, what, step| Entry { t_us, what, step, ..Entry::EMPTY };
        let entries =
            [step(5, What::StepStart, 29), step(9, What::StepEnd, 29), step(10, What::StepStart, 30)];
        let spans = [Span { start_us: 11, end_us: 12, phase: "Forward", name: "conv\"1", step: 30 }];
        let header = Header {
            kind: DumpKind::Stall,
            node: "0-h\"x",
            pid: 7,
            state: StepState { in_step: true, mode: Some(TrainprofMode::Train), step: 30, begin_us: 10 },
            detected_us: 2_000_010,
            threshold_s: Some(1.0),
            median_step_s: Some(4e-6),
            signal: None,
        };
        let hook = |o: &mut dyn std::fmt::Write| o.write_str("{\"x\": 1}");
        let mut buf = [0u8; 4096];
        let mut f = Fixed { buf: &mut buf, len: 0 };
        write_stall_json(&mut f, &header, &entries, &spans, &["detailed"], &hook).unwrap();
        let len = f.len;
        let v: serde_json::Value = serde_json::from_slice(&buf[..len]).unwrap();
        assert_eq!(v["kind"], "stall");
        assert_eq!(v["node"], "0-h\"x");
        assert_eq!(v["step"], 30);
        assert_eq!(v["step_started_us"], 10);
        assert_eq!(v["last_completed_step"], 29);
        assert_eq!(v["signal"], serde_json::Value::Null);
        assert_eq!(v["ring"][2]["what"], "step_start");
        assert_eq!(v["ring"][2]["name"], "Step:ModeKeys.TRAIN");
        assert_eq!(v["ring"][3]["what"], "phase_start");
        assert_eq!(v["ring"][3]["t_us"], 11);
        assert_eq!(v["ring"][4]["what"], "phase_end");
        assert_eq!(v["ring"][4]["name"], "conv\"1");
        assert_eq!(v["ring"][4]["phase"], "Forward");
        assert_eq!(v["ring"][4]["t_us"], 12);
        assert_eq!(v["open_windows"][0], "detailed");
        assert_eq!(v["hook"]["x"], 1);
        let mut small = [0u8; 64];
        let mut f = Fixed { buf: &mut small, len: 0 };
        assert!(write_stall_json(&mut f, &header, &entries, &[], &[], &hook).is_err(), "cut, not overrun");
    }

    #[test]
    fn numbers_far_from_one_are_short_json_numbers() {
        let shown = |v| Num(Some(v)).to_string();
        assert_eq!(shown(1e308), "1e308");
        assert_eq!(shown(1e-300), "1e-300");
        assert_eq!(shown(300.0), "300");
        assert_eq!(shown(0.25), "0.25");
        assert_eq!(shown(0.0), "0");
        assert_eq!(Num(Some(f64::NAN)).to_string(), "null");
        for v in [1e308, 1e-300, 123456789012345678.0] {
            assert_eq!(serde_json::from_str::<f64>(&shown(v)).unwrap(), v);
        }
    }

    #[test]
    fn names() {
        assert_eq!(dump_name(30, 123), "30-123");
        assert_eq!(dump_name(-1, 5), "0-5");
        assert_eq!(node_dir("0-h"), "framework/hangs/0-h");
    }

    /// Every key of `stall.json` (docs/formats.md, "Hang and crash dumps"), for a state out of
    /// a step and a signal dump, through `String` (the watchdog's path).
    #[test]
    fn stall_json_has_every_key_out_of_a_step_too() {
        let header = Header {
            kind: DumpKind::Signal,
            node: "n",
            pid: 42,
            state: StepState { in_step: false, mode: Some(TrainprofMode::Eval), step: -1, begin_us: 0 },
            detected_us: 7,
            threshold_s: None,
            median_step_s: None,
            signal: Some(libc::SIGTERM),
        };
        let ring =
            [Entry { t_us: 3, what: What::StepEnd, mode: TrainprofMode::Train, step: 9, ..Entry::EMPTY }];
        let hook = |o: &mut dyn std::fmt::Write| o.write_str("{}");
        let mut json = String::new();
        write_stall_json(&mut json, &header, &ring, &[], &[], &hook).unwrap();
        assert!(json.ends_with("}\n"));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "detected_us",
                "hook",
                "kind",
                "last_completed_step",
                "median_step_s",
                "mode",
                "node",
                "open_windows",
                "pid",
                "ring",
                "signal",
                "step",
                "step_started_us",
                "threshold_s",
                "version"
            ]
        );
        assert_eq!(v["version"], 1);
        assert_eq!(v["kind"], "signal");
        assert_eq!(v["pid"], 42);
        assert_eq!(v["mode"], "eval");
        assert_eq!(v["step"], 0, "-1 before the first step is written as 0");
        assert_eq!(v["step_started_us"], serde_json::Value::Null);
        assert_eq!(v["threshold_s"], serde_json::Value::Null);
        assert_eq!(v["median_step_s"], serde_json::Value::Null);
        assert_eq!(v["signal"], "SIGTERM");
        // The last completed step is the current mode's: a train step does not count.
        assert_eq!(v["last_completed_step"], serde_json::Value::Null);
        assert_eq!(v["ring"][0]["name"], "Step:ModeKeys.TRAIN");
        assert_eq!(v["open_windows"], serde_json::json!([]));
        assert_eq!(v["hook"], serde_json::json!({}));
    }

    #[test]
    fn strings_are_escaped_and_read_back_as_written() {
        for s in ["plain", "q\"uote", "back\\slash", "line\nfeed\ttab\r", "\u{1}\u{1f}", "é ✓ 𝄞", "</script>"]
        {
            let json = JsonStr(s).to_string();
            assert_eq!(serde_json::from_str::<String>(&json).unwrap(), s, "{json}");
            assert!(
                !json[1..json.len() - 1].chars().any(|c| (c as u32) < 0x20),
                "no raw control character: {json}"
            );
        }
        assert_eq!(JsonStr("a\"b\\c\n").to_string(), r#""a\"b\\c\u000a""#);
    }

    #[test]
    fn numbers_far_from_one_are_scientific_and_near_one_are_plain() {
        let shown = |v| Num(Some(v)).to_string();
        assert_eq!(shown(-1e20), "-1e20");
        assert_eq!(shown(1e15), "1e15");
        assert_eq!(shown(999_999_999_999_999.0), "999999999999999");
        assert_eq!(shown(1e-6), "0.000001");
        assert_eq!(shown(9e-7), "9e-7");
        assert_eq!(Num(None).to_string(), "null");
        assert_eq!(Num(Some(f64::INFINITY)).to_string(), "null");
    }

    #[test]
    fn ended_json_says_when_the_stalled_step_ended() {
        let v: serde_json::Value = serde_json::from_str(&ended_json(3_500_000, 1_000_000)).unwrap();
        assert_eq!(v, serde_json::json!({"ended_us": 3_500_000, "stalled_s": 2.5}));
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        assert_eq!(signal_name(libc::SIGUSR1), "signal");
    }
}
