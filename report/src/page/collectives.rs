//! The page's "Collectives across ranks" section (`docs/report.md`, "Collectives across
//! ranks"): the late rank, the chart of arrival spread per collective (drawn by
//! `assets/page.js` from `report-data`), the per-rank table, the widest collectives and each
//! node's clock as aligned. Drawn from `model.collectives` alone, every name escaped.

use std::fmt::Write as _;

use crate::model::collectives::{AlignState, Collectives, Inspector};
use crate::page::markup::{esc, num, offset};

/// Rows of the per-rank table on the page (all of them are in `--json`).
pub const MAX_RANK_ROWS: usize = 64;

fn state(s: AlignState) -> &'static str {
    match s {
        AlignState::Reference => "reference",
        AlignState::Aligned => "aligned",
        AlignState::Unaligned => "unaligned",
    }
}

pub fn section(out: &mut String, c: Option<&Collectives>, ins: Option<&Inspector>, t0: f64) {
    if c.is_none() && ins.is_none() {
        return;
    }
    out.push_str("<section id=\"collectives\"><h2>Collectives across ranks</h2>\n");
    if let Some(c) = c {
        matched(out, c, t0);
    }
    if let Some(i) = ins {
        inspector(out, i);
    }
    out.push_str("</section>\n");
}

/// Rows of the Inspector table on the page (all of them are in `--json`).
pub const MAX_INSPECTOR_ROWS: usize = 64;

/// The "NCCL Inspector" subsection: per process its collectives, GPU time and bus bandwidth,
/// and the process with the most execution time over the collectives shared.
fn inspector(out: &mut String, i: &Inspector) {
    out.push_str("<h3 id=\"nccl-inspector\">NCCL Inspector</h3>\n");
    let _ = writeln!(
        out,
        "<p class=\"note\">{} collectives from {} Inspector files ({} records skipped as unreadable), {} \
         communicators; {} collectives seen on two processes or more (matched by communicator and <code>coll_sn</code>). \
         Inspector records each collective's execution time (GPU time where <code>coll_timing_source</code> is \
         <code>kernel_gpu</code>), not when each rank reached it: a rank that arrives first waits inside the \
         collective, so the longest execution time marks a rank that waited as often as a slow one, and a late rank \
         shows the shortest.</p>",
        i.records,
        i.files,
        i.bad_records,
        i.communicators.len(),
        i.matched
    );
    match &i.slowest {
        Some(s) => {
            let _ = writeln!(
                out,
                "<p class=\"inspector-slowest\"><b>Most execution time: {}</b></p>",
                esc(&s.summary)
            );
        }
        None => out.push_str("<p>No two processes share a collective.</p>\n"),
    }
    let _ = writeln!(
        out,
        "<p>Execution-time spread (longest − shortest): median {} ms, p90 {} ms, max {} ms over {} collectives.</p>",
        esc(&num(i.exec_spread_ms.p50_ms)),
        esc(&num(i.exec_spread_ms.p90_ms)),
        esc(&num(i.exec_spread_ms.max_ms)),
        i.exec_spread_ms.count
    );
    out.push_str(
        "<table class=\"inspector-ranks\"><tr><th>host</th><th class=\"n\">pid</th><th class=\"n\">rank</th>\
         <th class=\"n\">collectives</th><th>kinds</th><th class=\"n\">GPU time, ms</th>\
         <th class=\"n\">mean bus bandwidth, GB/s</th><th class=\"n\">matched</th>\
         <th class=\"n\">longest at</th><th class=\"n\">shortest at</th></tr>\n",
    );
    for r in i.per_rank.iter().take(MAX_INSPECTOR_ROWS) {
        let top = i.slowest.as_ref().is_some_and(|s| s.host == r.host && s.pid == r.pid);
        let kinds: Vec<String> = r.kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(
            out,
            "<tr{}><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td></tr>",
            if top { " class=\"straggler\"" } else { "" },
            esc(&r.host),
            r.pid.map_or_else(|| "–".to_owned(), |p| p.to_string()),
            r.rank.map_or_else(|| "–".to_owned(), |k| k.to_string()),
            r.collectives,
            esc(&kinds.join(", ")),
            esc(&num(Some(r.gpu_time_ms))),
            esc(&num(r.mean_busbw_gbs)),
            r.matched,
            r.longest,
            r.shortest
        );
    }
    out.push_str("</table>\n");
    if i.per_rank.len() > MAX_INSPECTOR_ROWS {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} of {} processes listed; all are in <code>--json</code>.</p>",
            MAX_INSPECTOR_ROWS,
            i.per_rank.len()
        );
    }
}

fn matched(out: &mut String, c: &Collectives, t0: f64) {
    let _ = writeln!(
        out,
        "<p class=\"note\">{} collectives on {} ranks, matched {} ({} matched on two ranks or more, {} on one rank \
         only; {} NCCL kernels). A rank's arrival is the start of its call, on its node's clock aligned as below; \
         a collective's arrival spread is its last arrival less its first.</p>",
        c.records,
        c.ranks,
        match c.matched_by {
            crate::model::MatchedBy::Seq => "by process group and sequence number",
            crate::model::MatchedBy::Order => "by call order per process group and step",
        },
        c.matched,
        c.unmatched,
        c.kernels
    );
    match &c.late_rank {
        Some(l) => {
            let _ = writeln!(out, "<p class=\"late-rank\"><b>Late rank: {}</b></p>", esc(&l.summary));
        }
        None => out.push_str("<p>No rank arrives last at most collectives.</p>\n"),
    }
    let _ = writeln!(
        out,
        "<p>Arrival spread: median {} ms, p90 {} ms, max {} ms over {} collectives; end spread (aligned): median {} ms, \
         max {} ms.</p>",
        esc(&num(c.arrival_spread_ms.p50_ms)),
        esc(&num(c.arrival_spread_ms.p90_ms)),
        esc(&num(c.arrival_spread_ms.max_ms)),
        c.arrival_spread_ms.count,
        esc(&num(c.end_spread_ms.p50_ms)),
        esc(&num(c.end_spread_ms.max_ms))
    );
    out.push_str("<div id=\"collectives-chart\"></div>\n");
    let _ = writeln!(
        out,
        "<table class=\"collective-ranks\"><tr><th>rank</th><th>node</th><th class=\"n\">collectives</th>\
         <th class=\"n\">matched</th><th class=\"n\">last at</th><th class=\"n\">share last</th>\
         <th class=\"n\">others waited, ms</th><th class=\"n\">it waited, ms</th></tr>"
    );
    for r in c.per_rank.iter().take(MAX_RANK_ROWS) {
        let late = c.late_rank.as_ref().is_some_and(|l| l.rank == r.rank);
        let _ = writeln!(
            out,
            "<tr{}><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            if late { " class=\"straggler\"" } else { "" },
            esc(&r.rank),
            esc(&r.node),
            r.collectives,
            r.matched,
            r.last,
            r.last_share.map_or_else(|| "–".to_owned(), |s| format!("{:.0} %", s * 100.0)),
            esc(&num(Some(r.others_waited_ms))),
            esc(&num(Some(r.waited_ms)))
        );
    }
    out.push_str("</table>\n");
    if c.per_rank.len() > MAX_RANK_ROWS {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} of {} ranks listed; all are in <code>--json</code>.</p>",
            MAX_RANK_ROWS,
            c.per_rank.len()
        );
    }
    if !c.widest.is_empty() {
        out.push_str(
            "<details><summary>The widest arrival spreads</summary><table><tr><th>at</th><th>group</th>\
             <th class=\"n\">seq</th><th class=\"n\">step</th><th>kind</th><th class=\"n\">bytes</th>\
             <th class=\"n\">ranks</th><th class=\"n\">spread, ms</th><th class=\"n\">end spread, ms</th>\
             <th>first</th><th>last</th></tr>\n",
        );
        for w in &c.widest {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
                esc(&offset(Some(w.start_s), t0)),
                esc(&w.group),
                w.seq,
                w.step,
                esc(&w.kind),
                esc(&match (w.bytes, &w.dtype) {
                    (Some(b), Some(t)) => format!("{b} ({t})"),
                    (Some(b), None) => b.to_string(),
                    (None, _) => "–".to_owned(),
                }),
                w.ranks,
                esc(&num(Some(w.arrival_spread_ms))),
                esc(&num(w.end_spread_ms)),
                esc(&w.first_rank),
                esc(&w.last_rank)
            );
        }
        out.push_str("</table></details>\n");
    }
    out.push_str(
        "<h3>Node clocks</h3><p class=\"note\">Each node's offset is the median, over the collectives its ranks share \
         with the reference node's, of (its end − the reference's end): a collective ends on every participant at \
         once, give or take its completion latency. Its uncertainty is the median's standard error (1.2533 × 1.4826 × \
         MAD / √n). A node without enough shared ends is left unaligned, its times as recorded.</p>\n\
         <table class=\"node-clocks\"><tr><th>node</th><th>state</th><th class=\"n\">offset, ms</th>\
         <th class=\"n\">± ms</th><th class=\"n\">collectives</th><th class=\"n\">clock bounds, ms</th><th>note</th></tr>\n",
    );
    for k in &c.clocks {
        let note = match (&k.reason, k.within_bound) {
            (Some(r), _) => r.clone(),
            (None, Some(true)) => "within the recorded clock bounds".to_owned(),
            (None, Some(false)) => "beyond the recorded clock bounds".to_owned(),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "<tr data-state=\"{}\"><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            state(k.state),
            esc(&k.node),
            state(k.state),
            esc(&num(k.offset_ms)),
            esc(&num(k.uncertainty_ms)),
            k.collectives,
            esc(&num(k.bound_ms)),
            esc(&note)
        );
    }
    out.push_str("</table>\n");
}
