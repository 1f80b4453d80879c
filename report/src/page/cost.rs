//! The page's "What profiling cost" section (docs/report.md, "What profiling cost"), id
//! `profiling-cost`: the agent's CPU per node and its largest parts, each rank's hook, then
//! each rank's windows and the steps they cost.

use std::fmt::Write as _;

use crate::model::cost::ProfilingCost;
use crate::page::markup::{esc, num};

pub fn section(out: &mut String, c: &ProfilingCost) {
    out.push_str("<section id=\"profiling-cost\"><h2>What profiling cost</h2>\n<h3>The agent</h3>\n");
    if !c.recorded {
        out.push_str(
            "<p class=\"note\">The agent's cost was not recorded (an agent older than its cost \
             record, docs/formats.md, \"The agent's own cost\").</p>\n",
        );
    } else {
        let _ = writeln!(
            out,
            "<p class=\"note\">The agent's process CPU (user + system) over its run; \"of the steps\" \
             is CPU s / (wall s × the node's ranks), the share of the time its ranks ran steps that \
             the agent took from the node (the finding's bound is {} %).</p>",
            num(Some(c.threshold_percent))
        );
        out.push_str(
            "<table><tr><th>node</th><th>agent CPU (s)</th><th>wall (s)</th><th>% of a core</th>\
             <th>ranks</th><th>% of the steps</th><th>peak RSS (MiB)</th><th>ticks</th><th>largest parts</th></tr>\n",
        );
        for n in &c.nodes {
            let parts: Vec<String> = n
                .largest_parts
                .iter()
                .map(|p| format!("{} {} s ({} %)", esc(&p.part), num(Some(p.seconds)), num(Some(p.percent))))
                .collect();
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{:.3}</td><td>{}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{} × {} ms</td><td>{}</td></tr>",
                esc(&n.node),
                n.cpu_s,
                num(Some(n.wall_s)),
                n.core_percent,
                n.ranks,
                n.steps_percent.map_or_else(|| "–".to_owned(), |p| format!("{p:.3}")),
                num(Some(n.peak_rss_bytes as f64 / 1048576.0)),
                n.ticks,
                n.interval_ms,
                parts.join(", ")
            );
        }
        out.push_str("</table>\n");
    }
    hook(out, c);
    out.push_str("<h3>Windows and the steps they cost</h3>\n");
    if c.ranks.iter().all(|r| r.windows.is_empty()) {
        out.push_str("<p class=\"note\">No rank ran a detailed, Python or native window.</p>\n");
    } else {
        out.push_str(
            "<p class=\"note\">Per rank, its detailed, Python and native windows; the steps that \
             overlap one, and the step right after each, are left out by <code>trainprof \
             compare</code> and the anomaly trigger. Dataloader windows cost two timestamps a batch \
             and leave no step out.</p>\n<table><tr><th>rank</th><th>windows</th><th>steps left \
             out</th><th>steps</th></tr>\n",
        );
        for r in c.ranks.iter().filter(|r| !r.windows.is_empty()) {
            let ws: Vec<String> = r
                .windows
                .iter()
                .map(|w| match (w.first_step, w.last_step) {
                    (Some(a), Some(b)) => format!("{} {a}–{b}", esc(&w.kind)),
                    _ => esc(&w.kind),
                })
                .collect();
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&r.rank),
                ws.join(", "),
                r.steps_left_out,
                r.steps
            );
        }
        out.push_str("</table>\n");
    }
    out.push_str("</section>\n");
}

/// Each rank's hook: its time per step outside windows, each window kind's opens and closes,
/// events dropped, bytes written (docs/formats.md, "The hook's own cost").
fn hook(out: &mut String, c: &ProfilingCost) {
    out.push_str("<h3>The hook</h3>\n");
    if !c.hook_recorded {
        out.push_str(
            "<p class=\"note\">The hook's cost was not recorded (a hook older than its cost record, \
             or one that never shut down: docs/formats.md, \"The hook's own cost\").</p>\n",
        );
        return;
    }
    let _ = writeln!(
        out,
        "<p class=\"note\">The time each rank's training threads spent inside trainprof outside \
         windows (the Python package's entry points when it drove the hook, else the C calls), per \
         step and as a share of the rank's median step; \"% with the agent\" adds the agent's share \
         of the node (the finding's bound is {} %).</p>",
        num(Some(c.threshold_percent))
    );
    out.push_str(
        "<table><tr><th>rank</th><th>steps</th><th>hook µs / step</th><th>% of the median step</th>\
         <th>% with the agent</th><th>windows: open + close</th><th>events dropped</th><th>bytes written</th></tr>\n",
    );
    let pct = |p: Option<f64>| p.map_or_else(|| "–".to_owned(), |p| format!("{p:.3}"));
    for r in &c.ranks {
        let Some(h) = &r.hook else {
            let _ = writeln!(out, "<tr><td>{}</td><td colspan=\"7\">not recorded</td></tr>", esc(&r.rank));
            continue;
        };
        let ws: Vec<String> = h
            .windows
            .iter()
            .map(|w| {
                format!(
                    "{} {} × {} ms (opens {}, closes {})",
                    esc(&w.kind),
                    w.opens.max(w.closes),
                    num(w.ms_per_window),
                    w.opens,
                    w.closes
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.rank),
            h.steps,
            h.us_per_step.map_or_else(|| "–".to_owned(), |u| format!("{u:.2}")),
            pct(h.step_percent),
            pct(r.total_percent),
            if ws.is_empty() { "none".to_owned() } else { ws.join(", ") },
            h.events_dropped,
            h.bytes_written
        );
    }
    out.push_str("</table>\n");
}
