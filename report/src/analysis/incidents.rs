//! Hang and crash incidents (`docs/report.md`, "Hangs and crashes"): the dumps
//! (`reading/dumps.rs`) grouped into incidents, joined with every rank's last steps from the
//! timelines, and judged: which rank(s) the others wait for.
//!
//! The judgement ([`judge`]): the rank(s) with the lowest last begun step (a dump's open step,
//! else the timeline's last completed step) when the ranks differ; else, among the ranks that
//! dumped, the one(s) not inside the blocking call the others share (the top frame of a
//! thread that at least two ranks have in common and the rest lack).

use std::collections::BTreeMap;

use trainprof_output::fs::Dir;
use trainprof_output::protocol::dump as dk;
use trainprof_output::protocol::host_record;

use crate::analysis::steps::StepRec;
use crate::model::hangs::*;
use crate::reading::dumps::*;
use crate::reading::{Skipped, plausible_us};

/// The steps of `mode` per rank ([`crate::analysis::collect::Agg::steps`]).
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
        // Stalls and signals group together; the dumps `trainprof trigger --stacks` asked for
        // (`requested`) group among themselves, as one incident of every rank.
        let requested = d.kind == IncidentKind::Hook(DumpKind::Requested);
        let stall = requested || d.kind.is_stall();
        let joins = open.filter(|&i| {
            let inc: &Incident = &out[i];
            stall
                && (inc.kind == IncidentKind::Hook(DumpKind::Requested)) == requested
                && d.detected_s - inc.detected_s <= GROUP_S
                && !inc.dumps.iter().any(|x| x.node == d.node)
        });
        if let Some(i) = joins {
            let inc = &mut out[i];
            if inc.kind != d.kind {
                inc.kind = IncidentKind::Hook(DumpKind::Stall);
            }
            inc.dumps.push(d);
            continue;
        }
        let inc = Incident { kind: d.kind, detected_s: d.detected_s, dumps: vec![d], ..Incident::default() };
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
                    kind: IncidentKind::TimelineStopped,
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
    let stalls: Vec<&Dump> =
        inc.dumps.iter().filter(|d| d.kind == IncidentKind::Hook(DumpKind::Stall)).collect();
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
        let ring_end = d.ring.iter().filter(|e| e.what == dk::RING_STEP_END).filter_map(|e| e.step).max();
        let from_dump = d.last_completed_step.into_iter().chain(ring_end).max();
        if let Some(s) = from_dump
            && r.last_completed_step.is_none_or(|c| c < s)
        {
            r.last_completed_step = Some(s);
        }
        r.last_begun_step = d.step.or(r.last_begun_step);
        r.begun_from = BegunFrom::Dump;
        r.top_frames = top_frames(d);
    }
    for r in ranks.values_mut() {
        if r.begun_from != BegunFrom::Dump {
            r.last_begun_step = r.last_completed_step;
            r.begun_from = if r.last_begun_step.is_some() { BegunFrom::Timeline } else { BegunFrom::Nowhere };
        }
    }
    inc.ranks = ranks.into_values().collect();
    if inc.kind.is_crash() {
        let node = inc.dumps[0].node.clone();
        for r in &mut inc.ranks {
            r.culprit = r.rank == node;
        }
        inc.culprits = vec![node.clone()];
        inc.reason = Some(IncidentReason::Crashed);
        let what = if inc.kind == IncidentKind::Hook(DumpKind::Fatal) {
            inc.dumps[0].signal.clone().map_or("a fatal error".to_owned(), |s| format!("a fatal {s}"))
        } else {
            "an uncaught exception".to_owned()
        };
        inc.evidence = vec![format!("{node} died of {what} in step {}.", step_text(inc.step))];
        return;
    }
    if inc.kind == IncidentKind::Incomplete {
        let d = &inc.dumps[0];
        let why = d.problems.first().map_or("its stall.json could not be read", String::as_str);
        inc.evidence =
            vec![format!("The dump in {} is incomplete, so nothing is judged from it: {why}.", d.folder)];
        return;
    }
    let mut j = judge(&mut inc.ranks);
    if inc.kind == IncidentKind::Hook(DumpKind::Signal)
        && j.reason == Some(IncidentReason::LowestStep)
        && !behind_long(inc)
    {
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
                crate::reading::readable(signal_idle_s(inc), None)
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
    pub reason: Option<IncidentReason>,
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
        j.reason = Some(IncidentReason::LowestStep);
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
        j.reason = Some(IncidentReason::OutsideCollective);
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
    use crate::reading::dumps::dump_text_bytes;
    use serde_json::Value;
    use trainprof_output::protocol::dump::DumpKind;

    fn rank(name: &str, begun: Option<i64>, dumped: bool, frames: &[&str]) -> RankState {
        RankState {
            rank: name.into(),
            last_completed_step: begun,
            last_step_end_s: Some(1_795_400_000.0),
            last_begun_step: begun,
            begun_from: if dumped { BegunFrom::Dump } else { BegunFrom::Timeline },
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
        assert_eq!(j.reason, Some(IncidentReason::LowestStep));
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
        assert_eq!(j.reason, Some(IncidentReason::OutsideCollective));
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
            assert_eq!(i.kind, IncidentKind::Incomplete);
            assert_eq!(i.dumps[0].kind, IncidentKind::Incomplete);
            assert!(!i.dumps[0].complete);
            assert!(i.culprits.is_empty() && i.reason.is_none(), "{i:#?}");
            assert!(
                i.evidence[0].contains("is incomplete") && i.evidence[0].contains(why),
                "{:?}",
                i.evidence
            );
        }
        let mut page = String::new();
        crate::page::hangs::section(&mut page, &h);
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
        assert_eq!(i.kind, IncidentKind::Hook(DumpKind::Stall));
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
        assert_eq!(
            (g.dumps[0].pid, g.dumps[0].step, g.dumps[0].kind),
            (None, Some(40), IncidentKind::Hook(DumpKind::Stall))
        );
        let c = &h.incidents[2];
        assert_eq!(c.kind, IncidentKind::Hook(DumpKind::Fatal));
        assert!(!c.dumps[0].complete);
        assert_eq!(c.culprits, ["2-a"]);
        assert_eq!(c.dumps[0].python[0].frames, ["c.py:3 in boom"]);
        // The page keeps it text.
        let mut page = String::new();
        crate::page::hangs::section(&mut page, &h);
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
        crate::page::hangs::section(&mut page, &h);
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
        assert_eq!((i.kind, i.step, i.host.len()), (IncidentKind::TimelineStopped, None, 2));
        assert_eq!(i.culprits, ["1-a"]);
        assert_eq!(i.reason, Some(IncidentReason::LowestStep));
        let mut page = String::new();
        crate::page::hangs::section(&mut page, &Hangs { incidents: out, folders_left_out: 0 });
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
            kind: IncidentKind::Hook(DumpKind::Signal),
            complete: true,
            step: Some(step),
            step_started_s: Some(started_us as f64 / 1e6),
            detected_s: T as f64 / 1e6 + 0.001,
            median_step_s: Some(0.01),
            signal: Some("SIGTERM".into()),
            ..Dump::default()
        };
        let out = incidents(vec![sig("0-a", 100, T), sig("1-a", 99, T - 5_000)], Vec::new(), &steps);
        assert_eq!(out[0].kind, IncidentKind::Hook(DumpKind::Signal));
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
                kind: IncidentKind::Hook(DumpKind::Fatal),
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
