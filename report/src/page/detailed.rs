//! The page's "Detailed windows" section (`docs/report.md`, "Detailed windows"): drawn from
//! `model.detailed` alone, in HTML and inline-styled bars (no script), every name escaped.

use std::fmt::Write as _;

use crate::analysis::detailed::ms_text;
use crate::model::detailed::{Detailed, DetailedFigures, DetailedWindow, TopRow};
use crate::page::markup::esc;

/// Windows with a row in the windows' table, and windows whose tables are drawn in full.
pub const MAX_WINDOW_ROWS: usize = 200;
pub const MAX_WINDOW_DETAILS: usize = 20;

/// The colours of the busy/idle bar: busy computing, busy copying, then the idle categories.
const COLOURS: [(&str, &str); 7] = [
    ("busy: computing", "#2c7fb8"),
    ("busy: memcpy/memset only", "#7fcdbb"),
    ("idle: waiting for input", "#d62728"),
    ("idle: synchronisation/memcpy", "#ff7f0e"),
    ("idle: kernel queued", "#bcbd22"),
    ("idle: host launching", "#9467bd"),
    ("idle: other (no op recorded)", "#bbbbbb"),
];

fn pct(v: Option<f64>) -> String {
    v.filter(|p| p.is_finite()).map_or_else(|| "–".into(), |p| format!("{p:.1} %"))
}

fn us(v: Option<f64>) -> String {
    v.filter(|p| p.is_finite()).map_or_else(|| "–".into(), |p| format!("{p:.0} µs"))
}

/// Whether a phase's events are the detailed windows' ops or kernels (shown in this section,
/// not as phases).
pub fn is_detailed_phase(name: &str) -> bool {
    trainprof_output::protocol::timeline::is_detailed_ops_phase(name)
}

/// The section, with its heading.
pub fn section(out: &mut String, d: &Detailed) {
    out.push_str("<section id=\"detailed\"><h2>Detailed windows</h2>\n");
    let Some(total) = &d.total else {
        out.push_str(
            "<p class=\"note\">No detailed window was recorded (no <span class=\"code\">cpu_functions</span> \
             or <span class=\"code\">gpu_functions</span> events).</p>\n</section>\n",
        );
        return;
    };
    out.push_str(
        "<p class=\"note\">Where the time of the steps in the detailed windows went: the GPU's busy time \
         and why it was idle (categories and kernel classes: docs/report.md, \"Detailed windows\"). The \
         profiler itself slows these steps.</p>\n",
    );
    let _ = writeln!(out, "<p id=\"detailed-sentence\"><b>{}</b></p>", esc(&total.sentence));
    out.push_str("<h3>All windows</h3>\n");
    figures(out, total, "total");
    windows_table(out, d);
    // A window's anchor (`docs/report.md`, "Anchors"): the first window that starts at a step.
    let mut anchored = std::collections::HashSet::new();
    for (i, w) in d.windows.iter().take(MAX_WINDOW_DETAILS).enumerate() {
        let id = if anchored.insert(w.first_step) {
            format!(" id=\"window-detailed-{}\"", w.first_step)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "<details{id}><summary>{} · steps {}–{}{} · {}</summary>",
            esc(&w.rank),
            w.first_step,
            w.last_step,
            w.device.map_or(String::new(), |g| format!(" · GPU {g}")),
            esc(&ms_text(w.figures.wall_ms))
        );
        let _ = writeln!(out, "<p>{}</p>", esc(&w.figures.sentence));
        figures(out, &w.figures, &format!("w{i}"));
        out.push_str("</details>\n");
    }
    if d.windows.len() > MAX_WINDOW_DETAILS {
        let _ = writeln!(
            out,
            "<p class=\"note\">The tables of the first {MAX_WINDOW_DETAILS} windows are shown; all are in <span class=\"code\">--json</span>.</p>"
        );
    }
    out.push_str("</section>\n");
}

fn windows_table(out: &mut String, d: &Detailed) {
    out.push_str(
        "<h3>Per window</h3>\n<table><tr><th>rank</th><th>steps</th><th>GPU</th><th class=\"n\">wall</th>\
         <th class=\"n\">GPU busy</th><th class=\"n\">computing</th><th class=\"n\">idle: input</th>\
         <th class=\"n\">idle: sync</th><th class=\"n\">idle: queued</th><th class=\"n\">idle: launching</th>\
         <th class=\"n\">idle: other</th><th class=\"n\">kernels</th><th class=\"n\">ops</th>\
         <th class=\"n\">comm. overlapped</th></tr>\n",
    );
    for w in d.windows.iter().take(MAX_WINDOW_ROWS) {
        window_row(out, w);
    }
    out.push_str("</table>\n");
    let more = d.windows.len().saturating_sub(MAX_WINDOW_ROWS) as u64 + d.windows_left_out;
    if more > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{more} more windows are counted in the total but not listed here.</p>"
        );
    }
}

fn window_row(out: &mut String, w: &DetailedWindow) {
    let f = &w.figures;
    let idle = |i: usize| f.idle.get(i).map_or_else(|| "–".into(), |s| pct(s.pct));
    let _ = writeln!(
        out,
        "<tr><td>{}</td><td>{}–{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td></tr>",
        esc(&w.rank),
        w.first_step,
        w.last_step,
        w.device.map_or_else(|| "–".into(), |g| g.to_string()),
        esc(&ms_text(f.wall_ms)),
        pct(f.busy_pct),
        pct(f.compute_busy_pct),
        idle(0),
        idle(1),
        idle(2),
        idle(3),
        idle(4),
        count(f.kernels),
        count(f.ops),
        pct(f.comm_overlap.as_ref().map(|c| c.pct))
    );
}

/// The bar, the busy/idle table, the kernel classes, the two top tables and the launch delay.
fn figures(out: &mut String, f: &DetailedFigures, id: &str) {
    if f.gpu {
        let busy = f.busy_pct.unwrap_or(0.0);
        let compute = f.compute_busy_pct.unwrap_or(0.0);
        let mut parts = vec![compute, (busy - compute).max(0.0)];
        parts.extend(f.idle.iter().map(|s| s.pct.unwrap_or(0.0)));
        let _ = write!(
            out,
            "<div class=\"dw-bar\" id=\"dw-bar-{}\" style=\"display:flex;height:22px;max-width:900px;border:1px solid #ccc\">",
            esc(id)
        );
        for (p, (name, colour)) in parts.iter().zip(COLOURS) {
            if *p > 0.0 {
                let _ = write!(
                    out,
                    "<div title=\"{} {:.1} %\" style=\"width:{:.2}%;background:{colour}\"></div>",
                    esc(name),
                    p,
                    p.clamp(0.0, 100.0)
                );
            }
        }
        out.push_str("</div>\n<div class=\"note\">");
        for (name, colour) in COLOURS {
            let _ =
                write!(out, "<span class=\"legend-key\" style=\"background:{colour}\"></span>{}", esc(name));
        }
        out.push_str("</div>\n");
        out.push_str(
            "<table><tr><th>of the wall time</th><th class=\"n\">ms</th><th class=\"n\">%</th></tr>\n",
        );
        let _ = writeln!(
            out,
            "<tr><td>wall time</td><td class=\"n\">{}</td><td class=\"n\">100 %</td></tr>",
            fmt_ms(Some(f.wall_ms))
        );
        let _ = writeln!(
            out,
            "<tr><td><b>GPU busy</b> (any kernel, memcpy or memset)</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            fmt_ms(f.busy_ms),
            pct(f.busy_pct)
        );
        let _ = writeln!(
            out,
            "<tr><td>GPU computing (kernels other than memcpy/memset)</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            fmt_ms(f.compute_busy_ms),
            pct(f.compute_busy_pct)
        );
        for (s, (name, _)) in f.idle.iter().zip(&COLOURS[2..]) {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(name),
                fmt_ms(Some(s.ms)),
                pct(s.pct)
            );
        }
        out.push_str("</table>\n");
    }
    if !f.classes.is_empty() {
        let _ = writeln!(
            out,
            "<h4>GPU time by kernel class</h4><p class=\"note\">{} {}, {} of kernel time{}.</p>",
            count(f.kernels),
            crate::page::markup::plural(f.kernels, "kernel", "kernels"),
            esc(&ms_text(f.gpu_ms)),
            if f.annotations > 0 {
                format!(
                    "; {} device ranges of <span class=\"code\">record_function</span> annotations ({}) are not kernels and left out",
                    f.annotations,
                    esc(&ms_text(f.annotations_ms))
                )
            } else {
                String::new()
            }
        );
        out.push_str(
            "<table><tr><th>class</th><th class=\"n\">kernels</th><th class=\"n\">ms</th>\
             <th class=\"n\">% of GPU time</th><th></th></tr>\n",
        );
        let mut classes: Vec<_> = f.classes.iter().collect();
        classes.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        for c in classes {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td style=\"width:220px\"><div style=\"height:10px;background:#2c7fb8;width:{:.1}%\"></div></td></tr>",
                esc(&c.name),
                count(c.count.unwrap_or(0)),
                fmt_ms(Some(c.ms)),
                pct(c.pct),
                c.pct.unwrap_or(0.0).clamp(0.0, 100.0)
            );
        }
        out.push_str("</table>\n");
    }
    if !f.top_kernels.is_empty() {
        let n = f.top_kernels.len() as u64;
        let _ = writeln!(
            out,
            "<h4>Top {n} {} by GPU time</h4>",
            crate::page::markup::plural(n, "kernel", "kernels")
        );
        top_table(out, &f.top_kernels, true);
    }
    if !f.top_ops.is_empty() {
        let _ = writeln!(out, "<h4>Top {} CPU ops by self time</h4>", f.top_ops.len());
        top_table(out, &f.top_ops, false);
    }
    if let Some(c) = &f.comm_overlap {
        let _ = writeln!(
            out,
            "<p>Communication against compute: communication kernels ran {}, {} of it ({}) with a compute kernel running alongside.</p>",
            esc(&ms_text(c.comm_ms)),
            pct(Some(c.pct)),
            esc(&ms_text(c.overlapped_ms))
        );
    }
    if let Some(d) = &f.launch_delay {
        let _ = writeln!(
            out,
            "<p>Launch delay (kernel start − its launch call's start), {} {}: median {}, p90 {}, max {}, mean {}.</p>",
            count(d.kernels),
            crate::page::markup::plural(d.kernels, "kernel", "kernels"),
            us(d.p50_us),
            us(d.p90_us),
            us(d.max_us),
            us(d.mean_us)
        );
    } else if f.gpu {
        out.push_str(
            "<p class=\"note\">Launch delay: the kernels do not say when they were launched \
             (files written before the adapter recorded <span class=\"code\">cpu_thread_start_time</span>).</p>\n",
        );
    }
}

/// A count with thousands separators: `10,050`.
fn count(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::with_capacity(d.len() + d.len() / 3);
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fmt_ms(v: Option<f64>) -> String {
    v.filter(|x| x.is_finite()).map_or_else(
        || "–".into(),
        |x| {
            if x.abs() >= 100.0 {
                format!("{x:.0}")
            } else if x.abs() >= 10.0 {
                format!("{x:.1}")
            } else {
                format!("{x:.2}")
            }
        },
    )
}

fn top_table(out: &mut String, rows: &[TopRow], kernels: bool) {
    if kernels {
        out.push_str(
            "<table><tr><th>kernel</th><th>class</th><th class=\"n\">count</th><th class=\"n\">total ms</th>\
             <th class=\"n\">mean µs</th><th class=\"n\">% of GPU time</th></tr>\n",
        );
    } else {
        out.push_str(
            "<table><tr><th>op</th><th class=\"n\">count</th><th class=\"n\">self ms</th>\
             <th class=\"n\">total ms</th><th class=\"n\">mean self µs</th><th class=\"n\">self, % of wall</th></tr>\n",
        );
    }
    for r in rows {
        let mean = (r.count > 0).then(|| r.self_ms * 1000.0 / r.count as f64);
        let class = if kernels {
            format!("<td>{}</td>", esc(r.class.as_deref().unwrap_or("")))
        } else {
            String::new()
        };
        let total = if kernels {
            String::new()
        } else {
            format!("<td class=\"n\">{}</td>", fmt_ms(Some(r.total_ms)))
        };
        let _ = writeln!(
            out,
            "<tr><td class=\"code\">{}</td>{class}<td class=\"n\">{}</td><td class=\"n\">{}</td>{total}<td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&r.name),
            count(r.count),
            fmt_ms(Some(r.self_ms)),
            fmt_ms(mean),
            pct(r.pct)
        );
    }
    out.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_have_thousands_separators() {
        assert_eq!(
            [count(0), count(999), count(1000), count(10_050), count(1_234_567)],
            ["0", "999", "1,000", "10,050", "1,234,567"]
        );
    }

    #[test]
    fn the_section_escapes_names_and_says_when_nothing_was_recorded() {
        let mut out = String::new();
        section(&mut out, &Detailed::default());
        assert!(out.contains("No detailed window was recorded"));
        let mut f = DetailedFigures { gpu: true, busy_pct: Some(40.0), ..DetailedFigures::default() };
        f.top_ops.push(TopRow {
            name: "<script>x</script>".into(),
            class: None,
            count: 1,
            self_ms: 1.0,
            total_ms: 1.0,
            pct: None,
        });
        f.sentence = "a <b> sentence".into();
        let d = Detailed { total: Some(f), ..Detailed::default() };
        let mut out = String::new();
        section(&mut out, &d);
        assert!(!out.contains("<script>") && out.contains("&lt;script&gt;x&lt;/script&gt;"));
        assert!(out.contains("a &lt;b&gt; sentence") && out.contains("width:40.00%"));
    }
}
