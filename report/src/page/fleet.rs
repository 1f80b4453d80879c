//! The page's "Stragglers across ranks" section (`docs/report.md`, "Many ranks"): the
//! robust scores, each straggler with its node's likely causes and their evidence, and
//! what the charts draw when there are many ranks or nodes.

use std::fmt::Write as _;

use crate::model::StepChartKind;
use crate::model::fleet::Fleet;
use crate::page::markup::{esc, num};

/// Rows of the score table on the page (all of them are in `--json`).
pub const MAX_SCORE_ROWS: usize = 20;

pub fn section(out: &mut String, fleet: Option<&Fleet>) {
    let Some(f) = fleet else { return };
    out.push_str("<section id=\"fleet\"><h2>Stragglers across ranks</h2>\n");
    let _ = writeln!(
        out,
        "<p class=\"note\">{} ranks on {} {}, mode {}: the median rank's median step is {} ms, the median \
         absolute deviation of the ranks' medians {} ms. A rank is a straggler when its score (its median's \
         distance from the median rank's in units of 1.4826 × that deviation) is at least {} and its median \
         at least {}× the median rank's.</p>",
        f.ranks,
        f.nodes,
        crate::page::markup::plural(f.nodes, "node", "nodes"),
        esc(&f.mode),
        esc(&num(Some(f.median_ms))),
        esc(&num(Some(f.mad_ms))),
        esc(&num(Some(f.z_threshold))),
        esc(&num(Some(f.min_slowdown)))
    );
    if f.stragglers.is_empty() {
        out.push_str("<p>No straggler.</p>\n");
    }
    for s in &f.stragglers {
        let _ = writeln!(
            out,
            "<div class=\"straggler-rank\"><p><b>Straggler: {}</b> on {}: median step {} ms, {}× the median \
             rank's, score {}.</p>",
            esc(&s.rank),
            esc(s.node.as_deref().unwrap_or("(no system node)")),
            esc(&num(Some(s.p50_ms))),
            esc(&num(Some(s.slowdown))),
            esc(&num(Some(s.score)))
        );
        if s.causes.is_empty() {
            out.push_str(
                "<p>Its node's rows show nothing unusual (throttle reasons, Xid, pressure, PCIe).</p>\n",
            );
        } else {
            out.push_str("<p>Likely causes, from its node while it ran:</p><ul>\n");
            for c in &s.causes {
                let _ = writeln!(
                    out,
                    "<li class=\"cause\" data-cause=\"{}\"><b>{}</b>: {}</li>",
                    esc(c.cause.as_str()),
                    esc(&c.cause.as_str().replace('_', " ")),
                    esc(&c.evidence)
                );
            }
            out.push_str("</ul>\n");
        }
        out.push_str("</div>\n");
    }
    if let Some(l) = &f.late_rank {
        // Beside the step-time findings: the rank the collectives found late (docs/report.md,
        // "Many ranks").
        let _ = writeln!(
            out,
            "<div class=\"late-rank\"><p><b>Last at collectives: {}</b> on {}: {} See \
             <a href=\"#collectives\">Collectives across ranks</a>.</p>",
            esc(&l.rank),
            esc(l.node.as_deref().unwrap_or("(no system node)")),
            esc(&l.summary)
        );
        if !l.causes.is_empty() {
            out.push_str("<p>Likely causes, from its node while it ran:</p><ul>\n");
            for c in &l.causes {
                let _ = writeln!(
                    out,
                    "<li class=\"cause\" data-cause=\"{}\"><b>{}</b>: {}</li>",
                    esc(c.cause.as_str()),
                    esc(&c.cause.as_str().replace('_', " ")),
                    esc(&c.evidence)
                );
            }
            out.push_str("</ul>\n");
        }
        out.push_str("</div>\n");
    }
    let _ = writeln!(
        out,
        "<details><summary>Scores, highest first ({} of {})</summary><table><tr><th>rank</th><th>node</th>\
         <th class=\"n\">p50 ms</th><th class=\"n\">score</th><th class=\"n\">relative</th>\
         <th class=\"n\">individual</th></tr>",
        f.scores.len().min(MAX_SCORE_ROWS),
        f.scores.len()
    );
    for s in f.scores.iter().take(MAX_SCORE_ROWS) {
        let _ = writeln!(
            out,
            "<tr{}><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td></tr>",
            if s.straggler { " class=\"straggler\"" } else { "" },
            esc(&s.rank),
            esc(s.node.as_deref().unwrap_or("")),
            esc(&num(Some(s.p50_ms))),
            esc(&num(Some(s.score))),
            esc(&num(Some(s.relative))),
            esc(&num(s.individual))
        );
    }
    out.push_str("</table></details>\n");
    if f.page.step_chart == StepChartKind::Distribution {
        let _ = writeln!(
            out,
            "<p class=\"note\">The step charts draw the distribution across the {} ranks (p10, p50, p90 and max \
             of the ranks' mean step in each of {} slices of the job) and the slowest ranks: {}.</p>",
            f.ranks,
            crate::analysis::fleet::BAND_POINTS,
            esc(&f.page.ranks_drawn.join(", "))
        );
    }
    if f.page.nodes_not_drawn > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">System charts are drawn for {} of the {} nodes (the first {}, the stragglers' \
             nodes, and nodes with throttling or Xid): {}.</p>",
            f.page.nodes_drawn.len(),
            f.page.nodes_drawn.len() as u64 + f.page.nodes_not_drawn,
            crate::analysis::fleet::FIRST_NODES,
            esc(&f.page.nodes_drawn.join(", "))
        );
    }
    out.push_str("</section>\n");
}
