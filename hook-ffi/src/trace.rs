//! The lines of a framework timeline file (docs/formats.md, "File content"): a bare JSON array whose first two
//! lines carry the base time, one `process_name` / `process_sort_index` pair per phase
//! the first time it appears in a file, then one complete (`X`) event per line.
//!
//! Lines are formatted the way Python's `json.dumps` writes them (`", "` and `": "`), so a
//! file reads like one written by smdebug.

use std::fmt::Write as _;

use trainprof_config::AutoFeatures;
use trainprof_output::protocol::timeline::{
    self, BASE_TIME_KEY, PROCESS_NAME, PROCESS_SORT_INDEX, SORT_INDEX_KEY, STEP_NUM_KEY, capped_key,
    requested_key, trigger_key as key,
};

use crate::event::{CappedInfo, Event, RequestedInfo, TriggerInfo};
use crate::types::TrainprofArgKind;

/// The first line of every file: pid 0 carries the base time that `ts` is relative to.
pub fn header(out: &mut String, base_us: i64) {
    let m = timeline::PH_METADATA;
    let _ = write!(
        out,
        "{{\"name\": \"{PROCESS_NAME}\", \"ph\": \"{m}\", \"pid\": 0, \"args\": {{\"{BASE_TIME_KEY}\": {base_us}}}}},\n\
         {{\"name\": \"{PROCESS_SORT_INDEX}\", \"ph\": \"{m}\", \"pid\": 0, \"args\": {{\"{SORT_INDEX_KEY}\": 0}}}}"
    );
}

/// The two metadata lines that name phase `index`.
pub fn phase_meta(out: &mut String, index: u32, phase: &str) {
    let m = timeline::PH_METADATA;
    let _ = write!(
        out,
        "{{\"name\": \"{PROCESS_NAME}\", \"ph\": \"{m}\", \"pid\": {index}, \"args\": {{\"name\": "
    );
    json_string(out, phase);
    let _ = write!(
        out,
        "}}}},\n{{\"name\": \"{PROCESS_SORT_INDEX}\", \"ph\": \"{m}\", \"pid\": {index}, \"args\": {{\"{SORT_INDEX_KEY}\": {index}}}}}"
    );
}

/// One event: a complete one, or a trigger's instant event ([`trigger`]). `name_of`
/// resolves the ids of the event's name and argument keys.
pub fn record<'a>(
    out: &mut String,
    ev: &Event,
    phase_index: u32,
    base_us: i64,
    os_pid: u32,
    name_of: impl Fn(u32) -> &'a str,
) {
    if let Some(t) = ev.trigger_info() {
        return trigger(out, ev, &t, phase_index, base_us, os_pid, name_of(ev.name));
    }
    if let Some(c) = ev.capped_info() {
        return capped(out, ev, &c, phase_index, base_us, os_pid, name_of(ev.name));
    }
    if let Some(r) = ev.requested_info() {
        let (name, id) = (name_of(ev.name), name_of(r.id_name));
        return requested(out, ev, &r, phase_index, base_us, os_pid, name, id);
    }
    out.push_str("{\"name\": ");
    json_string(out, name_of(ev.name));
    let ts = ev.start_us.saturating_sub(base_us);
    let dur = ev.end_us.saturating_sub(ev.start_us);
    let _ = write!(
        out,
        ", \"pid\": {phase_index}, \"ph\": \"X\", \"ts\": {ts}, \"dur\": {dur}, \"args\": {{\"pid\": {os_pid}"
    );
    if ev.step >= 0 {
        // A string, as smdebug's hooks write it; readers accept both.
        let _ = write!(out, ", \"{STEP_NUM_KEY}\": \"{}\"", ev.step);
    }
    for arg in ev.args() {
        out.push_str(", ");
        json_string(out, name_of(arg.key));
        out.push_str(": ");
        match arg.kind {
            k if k == TrainprofArgKind::Float as i32 => {
                let v = f64::from_bits(arg.value as u64);
                if v.is_finite() {
                    // `{:?}` keeps a fractional part (`2.0`), like Python.
                    let _ = write!(out, "{v:?}");
                } else {
                    out.push_str("null");
                }
            }
            k if k == TrainprofArgKind::Bool as i32 => {
                out.push_str(if arg.value != 0 { "true" } else { "false" })
            }
            _ => {
                let _ = write!(out, "{}", arg.value);
            }
        }
    }
    out.push_str("}}");
}

/// The head both instant events share (a trigger's, a requested window's): name, process,
/// global scope, and `args` opened with the pid and the step; the caller adds its own args.
fn instant_head(out: &mut String, ev: &Event, phase_index: u32, base_us: i64, os_pid: u32, name: &str) {
    out.push_str("{\"name\": ");
    json_string(out, name);
    let ts = ev.start_us.saturating_sub(base_us);
    let _ = write!(
        out,
        ", \"pid\": {phase_index}, \"ph\": \"i\", \"ts\": {ts}, \"s\": \"g\", \"args\": {{\"pid\": {os_pid}"
    );
    if ev.step >= 0 {
        let _ = write!(out, ", \"{STEP_NUM_KEY}\": \"{}\"", ev.step);
    }
}

/// An anomaly trigger (docs/formats.md, "Event vocabulary"): an instant event of global
/// scope at the slow step's end, keys in this order.
fn trigger(
    out: &mut String,
    ev: &Event,
    t: &TriggerInfo,
    phase_index: u32,
    base_us: i64,
    os_pid: u32,
    name: &str,
) {
    instant_head(out, ev, phase_index, base_us, os_pid, name);
    let ms = |us: i64| us as f64 / 1000.0;
    let _ = write!(
        out,
        ", \"{sk}\": {step}, \"{dk}\": {duration:?}, \"{mk}\": {median:?}, \"{fk}\": [",
        sk = key::STEP,
        step = t.step,
        dk = key::DURATION_MS,
        duration = ms(t.duration_us),
        mk = key::MEDIAN_MS,
        median = ms(t.median_us),
        fk = key::FEATURES,
    );
    features(out, t.features);
    let _ = write!(
        out,
        "], \"{sk}\": {start}, \"{nk}\": {n}}}}}",
        sk = key::WINDOW_START_STEP,
        start = t.step.saturating_add(1),
        nk = key::WINDOW_NUM_STEPS,
        n = t.num_steps
    );
}

/// `["detailed", "python"]`: the features, in the order of `AutoFeature::ALL`, without the
/// brackets.
fn features(out: &mut String, features: AutoFeatures) {
    for (i, f) in features.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        json_string(out, f.as_str());
    }
}

/// An on-demand window opening (docs/formats.md, "On-demand windows (`trainprof
/// trigger`)"): an instant event of global scope at the window's first step's begin, keys in
/// this order.
#[allow(clippy::too_many_arguments)]
fn requested(
    out: &mut String,
    ev: &Event,
    r: &RequestedInfo,
    phase_index: u32,
    base_us: i64,
    os_pid: u32,
    name: &str,
    id: &str,
) {
    instant_head(out, ev, phase_index, base_us, os_pid, name);
    let _ = write!(out, ", \"{}\": ", requested_key::REQUEST_ID);
    json_string(out, id);
    let _ =
        write!(out, ", \"{}\": {}, \"{}\": [", requested_key::REQUESTED_US, r.requested_us, key::FEATURES);
    features(out, r.features);
    let _ = write!(
        out,
        "], \"{sk}\": {start}, \"{nk}\": {n}}}}}",
        sk = key::WINDOW_START_STEP,
        start = r.window_start,
        nk = key::WINDOW_NUM_STEPS,
        n = r.num_steps
    );
}

/// A window that stopped at its cap (docs/formats.md, "Window caps"): an instant event of
/// global scope when the adapter stopped it, keys in this order.
fn capped(
    out: &mut String,
    ev: &Event,
    c: &CappedInfo,
    phase_index: u32,
    base_us: i64,
    os_pid: u32,
    name: &str,
) {
    instant_head(out, ev, phase_index, base_us, os_pid, name);
    let _ = write!(out, ", \"{}\": ", capped_key::FEATURE);
    json_string(out, c.feature.as_str());
    let _ = write!(out, ", \"{}\": ", capped_key::CAP);
    json_string(out, c.cap.word());
    let _ = write!(
        out,
        ", \"{vk}\": {value}, \"{lk}\": {limit}, \"{sk}\": {step}}}}}",
        vk = capped_key::VALUE,
        value = c.value,
        lk = capped_key::LIMIT,
        limit = c.limit,
        sk = capped_key::STEP,
        step = c.step,
    );
}

/// `s` as a JSON string literal.
pub fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NO_STEP;
    use crate::types::{TRAINPROF_MAX_ARGS, TrainprofArg};

    fn event(step: i64, args: &[TrainprofArg]) -> Event {
        let mut ev = Event {
            kind: crate::event::Kind::Complete,
            phase: 1,
            name: 2,
            start_us: 1_795_316_901_771_000,
            end_us: 1_795_316_901_781_000,
            step,
            n_args: args.len() as u8,
            args: [TrainprofArg::EMPTY; TRAINPROF_MAX_ARGS],
        };
        ev.args[..args.len()].copy_from_slice(args);
        ev
    }

    fn names(id: u32) -> &'static str {
        ["k\"ey", "Forward", "Net", "worker_id", "ratio", "pin_memory"][id as usize]
    }

    #[test]
    fn lines_are_what_smdebug_writes() {
        let mut s = String::new();
        header(&mut s, 1_795_316_901_767_630);
        assert_eq!(
            s,
            "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"start_time_since_epoch_in_micros\": 1795316901767630}},\n\
             {\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"sort_index\": 0}}"
        );
        s.clear();
        phase_meta(&mut s, 3, "Step:ModeKeys.TRAIN");
        assert_eq!(
            s,
            "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 3, \"args\": {\"name\": \"Step:ModeKeys.TRAIN\"}},\n\
             {\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": 3, \"args\": {\"sort_index\": 3}}"
        );
        s.clear();
        record(&mut s, &event(0, &[]), 1, 1_795_316_901_767_630, 29945, names);
        assert_eq!(
            s,
            "{\"name\": \"Net\", \"pid\": 1, \"ph\": \"X\", \"ts\": 3370, \"dur\": 10000, \"args\": {\"pid\": 29945, \"step_num\": \"0\"}}"
        );
    }

    #[test]
    fn arguments_and_escapes() {
        let args = [
            TrainprofArg { key: 3, kind: TrainprofArgKind::Int as i32, value: -7 },
            TrainprofArg { key: 4, kind: TrainprofArgKind::Float as i32, value: 2.0f64.to_bits() as i64 },
            TrainprofArg { key: 5, kind: TrainprofArgKind::Bool as i32, value: 1 },
            TrainprofArg { key: 0, kind: TrainprofArgKind::Float as i32, value: f64::NAN.to_bits() as i64 },
        ];
        let mut s = String::new();
        record(&mut s, &event(NO_STEP, &args), 2, 1_795_316_901_781_500, 1, names);
        assert_eq!(
            s,
            "{\"name\": \"Net\", \"pid\": 2, \"ph\": \"X\", \"ts\": -10500, \"dur\": 10000, \"args\": {\"pid\": 1, \
             \"worker_id\": -7, \"ratio\": 2.0, \"pin_memory\": true, \"k\\\"ey\": null}}"
        );
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["args"]["k\"ey"], serde_json::Value::Null);
        s.clear();
        json_string(&mut s, "a\u{1}\n\\é");
        assert_eq!(s, "\"a\\u0001\\n\\\\é\"");
    }

    #[test]
    fn a_trigger_is_an_instant_event() {
        use trainprof_config::{AutoFeature, AutoFeatures};
        let t = crate::anomaly::Trigger {
            step: 30,
            duration_us: 200_512,
            median_us: 20_000,
            window_start: 31,
            num_steps: 2,
            features: [AutoFeature::Python, AutoFeature::Detailed].into_iter().collect::<AutoFeatures>(),
            end_us: 1_795_316_901_781_000,
            skipped: 0,
        };
        let ev = Event::trigger(&t, 1, 2, 29);
        let mut s = String::new();
        record(&mut s, &ev, 4, 1_795_316_901_771_000, 7, names);
        assert_eq!(
            s,
            "{\"name\": \"Net\", \"pid\": 4, \"ph\": \"i\", \"ts\": 10000, \"s\": \"g\", \"args\": {\"pid\": 7, \
             \"step_num\": \"29\", \"step\": 30, \"duration_ms\": 200.512, \"median_ms\": 20.0, \
             \"features\": [\"detailed\", \"python\"], \"window_start_step\": 31, \"window_num_steps\": 2}}"
        );
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["args"]["features"][1], "python");
    }

    #[test]
    fn a_capped_window_is_an_instant_event() {
        use trainprof_config::AutoFeature;
        let c = CappedInfo {
            feature: AutoFeature::Dataloader,
            cap: crate::types::TrainprofCap::Events,
            step: 12,
            value: 40,
            limit: 40,
        };
        let ev = Event::capped(&c, 1, 2, 11, 1_795_316_901_781_000);
        assert_eq!(ev.capped_info(), Some(c));
        assert_eq!((ev.trigger_info(), ev.requested_info()), (None, None));
        let mut s = String::new();
        record(&mut s, &ev, 4, 1_795_316_901_771_000, 7, names);
        assert_eq!(
            s,
            "{\"name\": \"Net\", \"pid\": 4, \"ph\": \"i\", \"ts\": 10000, \"s\": \"g\", \"args\": {\"pid\": 7, \
             \"step_num\": \"11\", \"feature\": \"dataloader\", \"cap\": \"events\", \"value\": 40, \"limit\": 40, \
             \"step\": 12}}"
        );
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["args"]["cap"], "events");
    }

    #[test]
    fn a_requested_window_is_an_instant_event() {
        use trainprof_config::AutoFeature;
        let r = RequestedInfo {
            window_start: 30,
            num_steps: 3,
            requested_us: 1_795_316_900_000_000,
            id_name: 1,
            features: [AutoFeature::Python, AutoFeature::Detailed].into_iter().collect(),
        };
        let ev = Event::requested(&r, 1, 2, 30, 1_795_316_901_781_000);
        assert_eq!(ev.requested_info(), Some(r));
        assert_eq!(ev.trigger_info(), None);
        let mut s = String::new();
        record(&mut s, &ev, 4, 1_795_316_901_771_000, 7, names);
        assert_eq!(
            s,
            "{\"name\": \"Net\", \"pid\": 4, \"ph\": \"i\", \"ts\": 10000, \"s\": \"g\", \"args\": {\"pid\": 7, \
             \"step_num\": \"30\", \"request_id\": \"Forward\", \"requested_us\": 1795316900000000, \
             \"features\": [\"detailed\", \"python\"], \"window_start_step\": 30, \"window_num_steps\": 3}}"
        );
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["args"]["window_num_steps"], 3);
    }
}
