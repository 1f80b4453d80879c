//! The comparison as one offline HTML page, by `report.html`'s rules (docs/report.md, "The
//! HTML page"): tables and text written here with every string from the data escaped
//! ([`crate::page::markup::esc`]), the overlaid step-time histograms drawn by the vendored uPlot from
//! JSON embedded with [`crate::page::markup::script_json`], the same Content-Security-Policy (no
//! request of any kind), the same styles. The script is `report/assets/compare.js`.

use std::fmt::Write as _;

use serde::Serialize;

use super::{Comparison, Status, StepComparison};
use crate::page::markup::{CSP, PAGE_CSS, UPLOT_CSS, UPLOT_JS, esc, num, script_json};

const COMPARE_JS: &str = include_str!("../../assets/compare.js");

fn signed(v: Option<f64>) -> String {
    match v.filter(|x| x.is_finite()) {
        Some(x) if x > 0.0 => format!("+{}", num(Some(x))),
        v => num(v),
    }
}

/// One mode's chart data.
#[derive(Serialize)]
struct Overlay<'a> {
    mode: &'a str,
    edges_ms: &'a [f64],
    /// Each bin's share of its side's kept steps, in per cent: the two sides usually keep
    /// different numbers of steps, and counts overlaid would compare totals, not shapes.
    a_pct: Vec<f64>,
    b_pct: Vec<f64>,
    a_kept: u64,
    b_kept: u64,
}

/// Each count as a share of `kept`, in per cent (all 0 without a kept step).
fn shares(counts: &[u64], kept: u64) -> Vec<f64> {
    counts.iter().map(|&n| if kept > 0 { n as f64 * 100.0 / kept as f64 } else { 0.0 }).collect()
}

/// Characters of a mover's name shown; the whole name is its cell's tooltip.
const MOVER_NAME_CHARS: usize = 120;

/// The page for `c`.
pub fn render(c: &Comparison) -> String {
    let mut out = String::with_capacity(64 * 1024);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(out, "<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let _ = writeln!(out, "<title>trainprof compare: {} vs {}</title>", esc(&c.a.source), esc(&c.b.source));
    let _ = writeln!(out, "<style>\n{UPLOT_CSS}\n{PAGE_CSS}</style>\n</head>\n<body data-charts=\"0/0\">");
    let _ = writeln!(
        out,
        "<header><h1>trainprof compare</h1><div class=\"source\">A: {}</div><div class=\"source\">B: {}</div></header>",
        esc(&c.a.source),
        esc(&c.b.source)
    );
    out.push_str(
        "<nav><a href=\"#comparable\">Comparable?</a><a href=\"#steps\">Step time</a>\
         <a href=\"#movers\">Where it moved</a><a href=\"#system\">System</a><a href=\"#findings\">Findings</a></nav>\n\
         <div id=\"page-errors\" class=\"page-errors\" hidden><b>Errors while drawing this page</b>\
         <pre id=\"page-errors-list\"></pre></div>\n\
         <noscript><p class=\"page-errors\">The charts need JavaScript; the tables below do not.</p></noscript>\n<main>\n",
    );
    section_comparable(&mut out, c);
    section_steps(&mut out, c);
    section_movers(&mut out, c);
    section_system(&mut out, c);
    section_findings(&mut out, c);
    let overlays: Vec<Overlay<'_>> = c
        .steps
        .iter()
        .map(|(m, s)| Overlay {
            mode: m,
            edges_ms: &s.edges_ms,
            a_pct: shares(&s.a.histogram, s.a.kept),
            b_pct: shares(&s.b.histogram, s.b.kept),
            a_kept: s.a.kept,
            b_kept: s.b.kept,
        })
        .collect();
    out.push_str("</main>\n<script type=\"application/json\" id=\"compare-data\">");
    out.push_str(&script_json(&overlays));
    out.push_str("</script>\n<script>\n");
    out.push_str(UPLOT_JS);
    out.push_str("\n</script>\n<script>\n");
    out.push_str(COMPARE_JS);
    out.push_str("</script>\n</body>\n</html>\n");
    out
}

fn section_comparable(out: &mut String, c: &Comparison) {
    out.push_str("<section id=\"comparable\"><h2>Comparable?</h2>\n");
    if c.comparable.ok {
        out.push_str(
            "<p>Nothing found that makes the two runs hard to compare (but see the unknowns).</p>\n",
        );
    } else {
        out.push_str(
            "<p class=\"note\"><b>Not comparable as they stand:</b> the rows marked <i>differs</i> change \
             the step time by themselves; read the verdict with them in mind.</p>\n",
        );
    }
    out.push_str("<table><tr><th>what</th><th>A</th><th>B</th><th>status</th><th>note</th></tr>\n");
    for i in &c.comparable.items {
        let cls = if i.status == Status::Differs { " class=\"bad\"" } else { "" };
        let _ = writeln!(
            out,
            "<tr{cls}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&i.what),
            esc(&i.a),
            esc(&i.b),
            esc(i.status.as_str()),
            esc(&i.note)
        );
    }
    out.push_str("</table></section>\n");
}

fn side_row(out: &mut String, name: &str, s: &super::SideSteps) {
    let _ = writeln!(
        out,
        "<tr><th>{name}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        s.steps,
        s.kept,
        s.warmup_left_out,
        s.window_left_out,
        num(s.p50_ms),
        num(s.p90_ms),
        num(s.mean_ms)
    );
}

fn section_steps(out: &mut String, c: &Comparison) {
    out.push_str("<section id=\"steps\"><h2>Step time</h2>\n");
    let _ = writeln!(
        out,
        "<p>B ÷ A of the median kept step, with a 95 % bootstrap interval; a change under {} % is \
         reported as no difference. Left out of both sides: the first {} steps of each rank and mode \
         (warm-up), and every step that overlaps a profiled window (detailed, Python or native) plus the \
         step after it.</p>",
        esc(&super::stats::pct(c.noise_pct)),
        c.warmup
    );
    if c.steps.is_empty() {
        out.push_str("<p class=\"note\">No step mode is in both runs: nothing to compare.</p>\n");
    }
    for (i, (mode, s)) in c.steps.iter().enumerate() {
        step_mode(out, i, mode, s);
    }
    if let Some(g) = &c.gate {
        let _ = writeln!(
            out,
            "<p class=\"{}\"><b>Gate (--fail-if-slower {} %):</b> {}</p>",
            if g.failed { "note bad" } else { "note" },
            esc(&super::stats::pct(g.pct)),
            esc(&g.why)
        );
    }
    out.push_str("</section>\n");
}

fn step_mode(out: &mut String, i: usize, mode: &str, s: &StepComparison) {
    let _ = writeln!(out, "<h3>{}</h3>", esc(mode));
    let _ = writeln!(out, "<p class=\"verdict\"><b>{}</b></p>", esc(&s.text));
    out.push_str(
        "<table><tr><th></th><th>steps</th><th>kept</th><th>warm-up left out</th><th>window left out</th>\
         <th>p50 ms</th><th>p90 ms</th><th>mean ms</th></tr>\n",
    );
    side_row(out, "A", &s.a);
    side_row(out, "B", &s.b);
    out.push_str("</table>\n");
    if let (Some(r), Some([lo, hi])) = (s.ratio, s.ci) {
        let _ = writeln!(out, "<p>Ratio B ÷ A: {r:.4} (95 % CI {lo:.4}–{hi:.4})</p>");
    }
    let _ = writeln!(out, "<div class=\"chart\" id=\"overlay-{i}\" data-mode=\"{}\"></div>", esc(mode));
}

fn section_movers(out: &mut String, c: &Comparison) {
    out.push_str("<section id=\"movers\"><h2>Where it moved</h2>\n");
    let Some(mode) = &c.mode else {
        out.push_str("<p>No mode compared.</p></section>\n");
        return;
    };
    let _ = writeln!(
        out,
        "<p>{} steps: time per kept step (per profiled step for Python functions), largest change \
         first (<i>median</i> or <i>mean</i> per step: docs/report.md); <i>explains</i> is the change \
         over the change of the median kept step.</p>",
        esc(mode)
    );
    if c.movers.is_empty() {
        out.push_str("<p>No phase, function or kernel class to compare.</p></section>\n");
        return;
    }
    // A fixed layout over the page's width: the numbers keep their columns, a long name wraps
    // (and is shortened, whole in its tooltip) instead of pushing them off the page.
    out.push_str(
        "<table class=\"movers\"><colgroup><col class=\"kind\"><col><col class=\"stat\"><col class=\"ms\">\
         <col class=\"ms\"><col class=\"ms\"><col class=\"stat\"></colgroup>\n\
         <tr><th>kind</th><th>name</th><th>per step</th><th class=\"n\">A ms</th><th class=\"n\">B ms</th>\
         <th class=\"n\">B − A ms</th><th class=\"n\">explains</th></tr>\n",
    );
    for m in &c.movers {
        let explains =
            m.explains.filter(|x| x.is_finite()).map_or("–".into(), |x| format!("{:.0} %", x * 100.0));
        let shown = match m.name.char_indices().nth(MOVER_NAME_CHARS) {
            Some((i, _)) => format!("{}…", &m.name[..i]),
            None => m.name.clone(),
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"name\" title=\"{}\">{}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(m.kind.as_str()),
            esc(&m.name),
            esc(&shown),
            esc(m.stat.as_str()),
            num(Some(m.a_ms)),
            num(Some(m.b_ms)),
            signed(Some(m.diff_ms)),
            esc(&explains)
        );
    }
    out.push_str("</table></section>\n");
}

fn section_system(out: &mut String, c: &Comparison) {
    out.push_str(
        "<section id=\"system\"><h2>System</h2>\n<p>Means over the kept steps' time, per node \
         (and GPU), averaged; largest relative change first.</p>\n",
    );
    if c.system.is_empty() {
        out.push_str("<p>No system metrics in both runs.</p></section>\n");
        return;
    }
    out.push_str("<table><tr><th>metric</th><th>unit</th><th>A</th><th>B</th><th>B − A</th></tr>\n");
    for m in &c.system {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&m.metric),
            esc(&m.unit),
            num(m.a),
            num(m.b),
            signed(m.diff)
        );
    }
    out.push_str("</table></section>\n");
}

fn section_findings(out: &mut String, c: &Comparison) {
    out.push_str("<section id=\"findings\"><h2>Findings that changed</h2>\n");
    if c.findings.is_empty() {
        out.push_str("<p>The same findings in both runs.</p></section>\n");
        return;
    }
    out.push_str("<table><tr><th>rule</th><th>A</th><th>B</th><th>A says</th><th>B says</th></tr>\n");
    for f in &c.findings {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&f.rule),
            esc(&f.a),
            esc(&f.b),
            esc(&f.a_summary),
            esc(&f.b_summary)
        );
    }
    out.push_str("</table></section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_the_data_stay_text() {
        let bad = "<img src=x onerror=alert(1)>&\u{2028}</script><!--";
        let mk = |phase: &str, ms: f64| {
            let mut m = super::super::ModeRun {
                ms: (0..100).map(|i| ms + f64::from(i) * 0.01).collect(),
                ..Default::default()
            };
            m.phases.insert(
                phase.to_owned(),
                super::super::PhaseStat {
                    total_us: 100_000,
                    events: 100,
                    steps_with: 100,
                    median_ms: Some(1.0),
                },
            );
            let mut modes = std::collections::BTreeMap::new();
            modes.insert(bad.to_owned(), m);
            let model = crate::model::ReportModel { source: bad.to_owned(), ..Default::default() };
            super::super::Run { model, modes, node_ticks: Default::default(), pressure: Vec::new() }
        };
        let c = super::super::compare(&mk(bad, 10.0), &mk("ok", 12.0), &super::super::Options::default());
        let page = render(&c);
        assert!(!page.contains("<img") && !page.contains("<!--"));
        assert_eq!(page.matches("</script>").count(), 3);
        assert!(page.contains("&lt;img src=x onerror=alert(1)&gt;"));
        let data = page.split("id=\"compare-data\">").nth(1).unwrap().split("</script>").next().unwrap();
        assert!(!data.contains('<') && !data.contains('&') && !data.contains('\u{2028}'));
    }

    /// 797 steps against 406: each side's histogram is drawn as shares of its own kept steps
    /// (each sums to 100 %), and "Where it moved" is a fixed-layout table whose long names are
    /// shortened (whole in the tooltip).
    #[test]
    fn the_histograms_are_shares_and_the_movers_fit() {
        let long = format!("{}_kernel", "cutlass_wgrad_".repeat(30));
        let mk = |n: u32, ms: f64, phase_ms: i64| {
            let mut m = super::super::ModeRun {
                ms: crate::analysis::stats::sorted(
                    &(0..n).map(|i| ms + f64::from(i % 50) * 0.1).collect::<Vec<_>>(),
                ),
                ..Default::default()
            };
            let total_us = phase_ms * 1000 * i64::from(n);
            m.phases.insert(
                long.clone(),
                super::super::PhaseStat {
                    total_us,
                    events: u64::from(n),
                    steps_with: u64::from(n),
                    median_ms: Some(phase_ms as f64),
                },
            );
            let mut modes = std::collections::BTreeMap::new();
            modes.insert("TRAIN".to_owned(), m);
            super::super::Run {
                model: Default::default(),
                modes,
                node_ticks: Default::default(),
                pressure: Vec::new(),
            }
        };
        let c =
            super::super::compare(&mk(797, 30.0, 10), &mk(406, 33.0, 13), &super::super::Options::default());
        let page = render(&c);
        let data = page.split("id=\"compare-data\">").nth(1).unwrap().split("</script>").next().unwrap();
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        let o = &v[0];
        assert_eq!((o["a_kept"].as_u64(), o["b_kept"].as_u64()), (Some(797), Some(406)));
        assert!(o.get("a").is_none() && o.get("b").is_none(), "{o}");
        for side in ["a_pct", "b_pct"] {
            let sum: f64 = o[side].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).sum();
            assert!((sum - 100.0).abs() < 1e-9, "{side}: {sum}");
        }
        assert!(COMPARE_JS.contains("o.a_pct") && COMPARE_JS.contains("% of its kept steps"));
        // The movers' table: fixed layout, the long name shortened in its cell.
        assert!(page.contains("<table class=\"movers\">"));
        assert!(PAGE_CSS.contains("table.movers { table-layout: fixed; width: 100%; }"));
        let cell = page.split("<td class=\"name\" title=\"").nth(1).unwrap();
        let (title, rest) = cell.split_once("\">").unwrap();
        assert_eq!(title, long);
        let shown = rest.split("</td>").next().unwrap();
        assert_eq!(shown.chars().count(), MOVER_NAME_CHARS + 1);
        assert!(shown.ends_with('…'));
    }

    #[test]
    fn the_page_script_requests_nothing() {
        for bad in
            ["</script", "<!--", "fetch(", "XMLHttpRequest", "WebSocket", "import(", "url(", "innerHTML"]
        {
            assert!(!COMPARE_JS.contains(bad), "{bad}");
        }
    }
}
