//! The page's "Hangs and crashes" section (docs/report.md, "Hangs and crashes"), first on the
//! page when the job had any: per incident the likely culprit and why, every rank's last
//! steps, each dump's stacks (top frames first), the host around it. Every string is the
//! trainer's and is HTML-escaped; stacks are text in `<pre>`/`<li>`, never markup.

use std::fmt::Write as _;

use crate::model::hangs::{Dump, DumpKind, Hangs, HostState, Incident, IncidentKind, Thread};
use crate::page::markup::{duration, esc, int, num, utc};

/// Frames shown per thread on the page (all of them, up to the model's cap, are in `--json`).
const PAGE_FRAMES: usize = 24;
/// Ring events shown per dump (its last ones).
const PAGE_RING: usize = 20;
/// Threads shown per stacks file.
const PAGE_THREADS: usize = 64;
/// Bytes of the section past which dumps and host records are no longer drawn (only named):
/// the page stays a page whatever the trainer wrote; `--json` has everything.
const PAGE_BUDGET: usize = 8 << 20;

/// The section; nothing when there were no hangs or crashes.
pub fn section(out: &mut String, h: &Hangs) {
    if h.is_empty() {
        return;
    }
    out.push_str("<section id=\"hangs\"><h2>Hangs and crashes</h2>\n");
    if h.folders_left_out > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} dump folders past the first {} were not read.</p>",
            h.folders_left_out,
            crate::reading::dumps::MAX_FOLDERS
        );
    }
    let start = out.len();
    for (i, inc) in h.incidents.iter().enumerate() {
        incident(out, i, inc, start);
    }
    out.push_str("</section>\n");
}

fn kind_title(kind: IncidentKind) -> &'static str {
    match kind {
        IncidentKind::Hook(DumpKind::Stall) => "Stall",
        IncidentKind::Hook(DumpKind::Signal) => "Stopped by a signal",
        IncidentKind::Hook(DumpKind::Fatal) => "Crash (fatal error)",
        IncidentKind::Hook(DumpKind::Exception) => "Crash (uncaught exception)",
        IncidentKind::TimelineStopped => "The timelines stopped",
        IncidentKind::Incomplete => "Incomplete dump",
        IncidentKind::Hook(DumpKind::Requested) => "Stacks on request (trainprof trigger)",
    }
}

fn incident(out: &mut String, i: usize, inc: &Incident, start: usize) {
    let _ = writeln!(
        out,
        "<div class=\"hang\" id=\"hang-{i}\" data-kind=\"{}\"><h3>{}{} at {}</h3>",
        esc(inc.kind.as_str()),
        kind_title(inc.kind),
        inc.step.map_or(String::new(), |s| format!(" in step {s}")),
        esc(&utc(Some(inc.detected_s)))
    );
    if inc.kind == IncidentKind::TimelineStopped {
        out.push_str(
            "<p>No rank wrote a dump: the agent saw no timeline file change for a while as the trainer ran \
             (the hook's hang detection is off, or no rank was inside a step).</p>\n",
        );
    }
    if let Some(s) = inc.stalled_s {
        let _ = writeln!(
            out,
            "<p>The stall ended at {} after {}.</p>",
            esc(&utc(inc.ended_s)),
            esc(&duration(Some(s)))
        );
    } else if inc.kind == IncidentKind::Hook(DumpKind::Stall) {
        out.push_str("<p>The stall did not end while the job was recorded.</p>\n");
    }
    if inc.culprits.is_empty() {
        out.push_str("<p class=\"culprit\">No rank stands out.</p>\n");
    } else {
        let names: Vec<String> = inc.culprits.iter().map(|c| format!("<b>{}</b>", esc(c))).collect();
        let _ = writeln!(out, "<p class=\"culprit\">Likely culprit: {}</p>", names.join(", "));
    }
    out.push_str("<ul class=\"hang-evidence\">\n");
    for e in &inc.evidence {
        let _ = writeln!(out, "<li>{}</li>", esc(e));
    }
    out.push_str("</ul>\n");
    out.push_str(
        "<table><thead><tr><th>Rank</th><th>Last completed step</th><th>Ended at</th>\
         <th>Last begun step</th><th>From</th><th>Where its threads are</th></tr></thead><tbody>\n",
    );
    for r in &inc.ranks {
        let _ = writeln!(
            out,
            "<tr{}><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if r.culprit { " class=\"culprit\"" } else { "" },
            esc(&r.rank),
            if r.culprit { " (likely culprit)" } else { "" },
            int(r.last_completed_step),
            esc(&utc(r.last_step_end_s)),
            int(r.last_begun_step),
            esc(r.begun_from.as_str()),
            if r.top_frames.is_empty() {
                "–".to_owned()
            } else {
                r.top_frames
                    .iter()
                    .map(|f| format!("<code>{}</code>", esc(f)))
                    .collect::<Vec<_>>()
                    .join("<br>")
            }
        );
    }
    out.push_str("</tbody></table>\n");
    if inc.ranks_left_out > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} more ranks left out (the report keeps {} rank rows over all incidents).</p>",
            inc.ranks_left_out,
            crate::reading::dumps::MAX_RANK_ROWS
        );
    }
    let mut left = Vec::new();
    for d in &inc.dumps {
        if out.len() - start > PAGE_BUDGET {
            left.push(esc(&d.folder));
        } else {
            dump(out, d);
        }
    }
    for h in &inc.host {
        if out.len() - start <= PAGE_BUDGET {
            host(out, h);
        }
    }
    if !left.is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"note\">Not drawn here (the section is already long; <code>--json</code> has them): {}</p>",
            left.join(", ")
        );
    }
    out.push_str("</div>\n");
}

fn dump(out: &mut String, d: &Dump) {
    let open = if d.kind.is_crash() { " open" } else { "" };
    let _ = writeln!(
        out,
        "<details class=\"dump\"{open}><summary>{}: {} dump, step {} (<code>{}</code>)</summary>",
        esc(&d.node),
        esc(d.kind.as_str()),
        int(d.step),
        esc(&d.folder)
    );
    let mut facts = Vec::new();
    if let Some(p) = d.pid {
        facts.push(format!("pid {p}"));
    }
    if let Some(m) = &d.mode {
        facts.push(format!("mode {}", esc(m)));
    }
    if let Some(t) = d.step_started_s {
        facts.push(format!("step began at {}", esc(&utc(Some(t)))));
    }
    facts.push(format!("detected at {}", esc(&utc(Some(d.detected_s)))));
    if let Some(t) = d.threshold_s {
        facts.push(format!("threshold {} s", num(Some(t))));
    }
    if let Some(t) = d.median_step_s {
        facts.push(format!("median step {} s", num(Some(t))));
    }
    if let Some(s) = &d.signal {
        facts.push(format!("signal {}", esc(s)));
    }
    if let Some(s) = d.stalled_s {
        facts.push(format!("ended after {}", esc(&duration(Some(s)))));
    }
    if d.kind == IncidentKind::Incomplete {
        facts.push("stall.json could not be read: the dump is incomplete (why below)".into());
    } else if !d.complete {
        facts.push("no stall.json: the process died while writing it".into());
    }
    let _ = writeln!(out, "<p>{}</p>", facts.join(" · "));
    if !d.traceback.is_empty() {
        out.push_str("<h4>Traceback</h4>\n<pre class=\"stack\">");
        for l in &d.traceback {
            out.push_str(&esc(l));
            out.push('\n');
        }
        out.push_str("</pre>\n");
    }
    if !d.python_notes.is_empty() {
        let _ = writeln!(out, "<pre class=\"stack\">{}</pre>", esc(&d.python_notes.join("\n")));
    }
    threads(out, "Python stacks", &d.python);
    threads(out, "Native stacks", &d.native);
    if !d.open_windows.is_empty() {
        let w: Vec<String> = d.open_windows.iter().map(|w| esc(w)).collect();
        let _ = writeln!(out, "<p>Open windows: {}</p>", w.join(", "));
    }
    if !d.ring.is_empty() {
        out.push_str("<h4>Last events</h4>\n<table><thead><tr><th>Time</th><th>What</th><th>Name</th><th>Step</th></tr></thead><tbody>\n");
        for e in d.ring.iter().skip(d.ring.len().saturating_sub(PAGE_RING)) {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&utc(Some(e.t_s))),
                esc(&e.what),
                esc(&e.name),
                int(e.step)
            );
        }
        out.push_str("</tbody></table>\n");
    }
    if !d.hook.is_empty() {
        let _ = writeln!(out, "<h4>The hook's state</h4>\n<pre>{}</pre>", esc(&d.hook.join("\n")));
    }
    if !d.problems.is_empty() {
        let _ = writeln!(out, "<p class=\"note\">Not read: {}</p>", esc(&d.problems.join("; ")));
    }
    out.push_str("</details>\n");
}

fn threads(out: &mut String, title: &str, ts: &[Thread]) {
    if ts.is_empty() {
        return;
    }
    let _ = writeln!(out, "<h4>{title} (most recent call first)</h4>");
    if ts.len() > PAGE_THREADS {
        let _ = writeln!(out, "<p class=\"note\">The first {PAGE_THREADS} of {} threads.</p>", ts.len());
    }
    for t in ts.iter().take(PAGE_THREADS) {
        let mut head = format!("Thread {}", esc(&t.id));
        if let Some(n) = &t.name {
            let _ = write!(head, " {}", esc(n));
        }
        if t.current {
            head.push_str(" (wrote the dump)");
        }
        let _ = write!(out, "<div class=\"thread\"><b>{head}</b>\n<pre class=\"stack\">");
        for f in t.frames.iter().take(PAGE_FRAMES) {
            out.push_str(&esc(f));
            out.push('\n');
        }
        let more = t.frames.len().saturating_sub(PAGE_FRAMES) as u64 + t.frames_left_out;
        if more > 0 {
            let _ = writeln!(out, "… {more} more frames");
        }
        out.push_str("</pre></div>\n");
    }
}

fn host(out: &mut String, h: &HostState) {
    let _ = writeln!(
        out,
        "<details class=\"host\"><summary>The host of {} around it (agent, {})</summary>", // not the protocol: a CSS class
        esc(&h.node),
        esc(&h.trigger)
    );
    let states: Vec<String> = h.trainer_threads.iter().map(|(s, n)| format!("{n} {}", esc(s))).collect();
    let _ = writeln!(
        out,
        "<p>Trainer tree: <b>{}</b>; threads: {}.</p>",
        esc(if h.trainer_cpu_state.is_empty() { "unknown" } else { &h.trainer_cpu_state }),
        if states.is_empty() { "–".to_owned() } else { states.join(", ") }
    );
    if !h.busy_threads.is_empty() {
        out.push_str("<table><thead><tr><th>pid</th><th>tid</th><th>Name</th><th>State</th><th>CPU %</th></tr></thead><tbody>\n");
        for t in &h.busy_threads {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                t.pid,
                t.tid,
                esc(&t.name),
                esc(&t.state),
                num(t.cpu_pct)
            );
        }
        out.push_str("</tbody></table>\n");
    }
    if let Some(s) = h.samples.last() {
        let gpus: Vec<String> = s
            .gpus
            .iter()
            .map(|(g, (u, m))| format!("{} {}% busy, {}% memory", esc(g), num(*u), num(*m)))
            .collect();
        let procs: Vec<String> =
            s.gpu_processes.iter().map(|(k, v)| format!("{} {}", esc(k), num(Some(*v)))).collect();
        let errs: Vec<String> =
            s.gpu_errors.iter().map(|(k, v)| format!("{} {}", esc(k), num(Some(*v)))).collect();
        let psi: Vec<String> =
            s.pressure.iter().map(|(k, v)| format!("{} {}%", esc(k), num(Some(*v)))).collect();
        let _ = writeln!(
            out,
            "<p>At {} ({} samples): GPUs: {}. GPU processes: {}. GPU errors: {}. Pressure: {}. Host CPU {}%, trainer CPU {}%.</p>",
            esc(&utc(Some(s.t_s))),
            h.samples.len(),
            or_dash(&gpus),
            or_dash(&procs),
            or_dash(&errs),
            or_dash(&psi),
            num(s.cpu_total),
            num(s.trainer_cpu)
        );
    }
    out.push_str("</details>\n");
}

fn or_dash(v: &[String]) -> String {
    if v.is_empty() { "–".to_owned() } else { v.join(", ") }
}
