//! A minimal, dependency-free HTML page of the model (job, steps, findings), every string
//! escaped. The full page with charts replaces this file; the signature stays.

use std::fmt::Write as _;

use crate::model::ReportModel;

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |x| format!("{x:.1}"))
}

/// One self-contained page.
pub fn render(model: &ReportModel) -> String {
    let mut h = String::new();
    let j = &model.job;
    let _ = write!(
        h,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>trainprof report</title></head><body>\
         <h1>trainprof report</h1><p>{}</p><h2>Job</h2><table>\
         <tr><th>duration (s)</th><td>{}</td></tr><tr><th>nodes</th><td>{}</td></tr>\
         <tr><th>ranks</th><td>{}</td></tr><tr><th>initialisation (s)</th><td>{}</td></tr></table>",
        esc(&model.source),
        num(j.duration_s),
        esc(&j.nodes.join(", ")),
        esc(&j.ranks.join(", ")),
        num(j.init_s)
    );
    h.push_str("<h2>Steps</h2><table><tr><th>mode</th><th>count</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>max ms</th></tr>");
    for (mode, s) in &model.steps {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(mode),
            s.count,
            num(s.p50_ms),
            num(s.p90_ms),
            num(s.p99_ms),
            num(s.max_ms)
        );
    }
    h.push_str("</table><h2>Findings</h2><table><tr><th>rule</th><th>triggered</th><th>summary</th><th>advice</th></tr>");
    for f in &model.findings {
        let state = if f.triggered {
            "yes"
        } else if f.evaluated {
            "no"
        } else {
            "not evaluated"
        };
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{state}</td><td>{}</td><td>{}</td></tr>",
            esc(&f.rule),
            esc(&f.summary),
            esc(&f.advice)
        );
    }
    h.push_str("</table></body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_everything() {
        let m = ReportModel { source: "<script>".into(), ..ReportModel::default() };
        let page = render(&m);
        assert!(page.contains("&lt;script&gt;"));
        assert!(!page.contains("<script>"));
    }
}
