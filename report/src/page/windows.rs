//! The page's Python windows (inside "Framework") and its "Native windows" section
//! (docs/report.md, "Python windows" and "Native windows"). Anchors for links from elsewhere
//! on the page: `#python-windows`, `#python-window-<i>` (the i-th of
//! `python_summary.windows`), `#native` and `#native-<i>` (the i-th of `native`).
//!
//! The flame graph of a native window is redrawn here from the frames the report parsed
//! ([`crate::reading::native`]), as plain SVG markup written by this code: rectangles, text and
//! `<title>` tooltips, every name HTML-escaped. The trainer's own `flamegraph.svg` is never
//! embedded, not even sanitised: it carries inferno's script (and a hostile one could carry
//! anything), and a sanitiser that must keep SVG while removing every way to run script
//! (`on*` attributes, `<script>`, `<foreignObject>`, `javascript:` links, `<animate>` on
//! `href`, …) is a list that only has to miss one entry. Redrawn, the graph costs the page
//! only its frames (at most [`crate::reading::native::MAX_FLAME_FRAMES`] per window) and needs no
//! script: hovering a frame shows its name and samples.

use std::fmt::Write as _;

use crate::model::{
    NativeFunction, NativeWindow, PyFunctionTotal, PythonGroupKind, PythonSummary, PythonWindow,
};
use crate::page::markup::esc;
use trainprof_output::protocol::native_window::{NativeFile, PROFILE_FILE};

/// The flame graph's drawing units: its width, and the height of one frame.
const FLAME_WIDTH: f64 = 1200.0;
const FRAME_HEIGHT: f64 = 16.0;
/// Width of one character of the frames' 11-unit monospace text, for cutting names.
const CHAR_WIDTH: f64 = 6.7;
/// A tooltip's name is cut to this many characters (the tables hold it whole).
const MAX_TITLE: usize = 600;

/// The Python windows: one entry per window with its functions merged over its folders,
/// then the top functions over all step windows.
pub fn python_windows(out: &mut String, summary: &PythonSummary, folders: &[PythonWindow]) {
    out.push_str("<h3 id=\"python-windows\">Python profiling windows</h3>\n");
    if folders.is_empty() && summary.windows.is_empty() {
        out.push_str("<p class=\"note\">No Python profiling window was recorded.</p>\n");
        return;
    }
    if summary.windows.is_empty() {
        // A model without the summary (read back from an older `--json`): each folder alone.
        for (i, w) in folders.iter().enumerate() {
            let _ = writeln!(
                out,
                "<details{}><summary>{} · {} · <span class=\"code\">{}</span></summary>",
                if i == 0 { " open" } else { "" },
                esc(&w.node),
                esc(crate::reading::python::profiler_name(w.profiler)),
                esc(&w.window)
            );
            let rows: Vec<PyFunctionTotal> = w
                .functions
                .iter()
                .map(|f| PyFunctionTotal {
                    name: f.name.clone(),
                    file: f.file.clone(),
                    line: f.line,
                    calls: f.calls,
                    self_s: f.self_s,
                    total_s: f.total_s,
                    folders: 1,
                })
                .collect();
            functions_table(out, &rows);
            out.push_str("</details>\n");
        }
        return;
    }
    let top = &summary.top;
    if !top.functions.is_empty() {
        let _ = writeln!(
            out,
            "<h4>Top functions over the step windows</h4><p class=\"note\">{} {} of the step \
             windows, {} s profiled, merged by function, file and line (by total time). The windows \
             before the first step and after close (setup and teardown) are listed below on their own.</p>",
            top.folders,
            crate::page::markup::plural(top.folders, "folder", "folders"),
            esc(&num(top.profiled_s))
        );
        functions_table(out, &top.functions);
        if top.functions_left_out > 0 {
            let _ = writeln!(
                out,
                "<p class=\"note\">{} further distinct functions were past the merge's cap and are left out.</p>",
                top.functions_left_out
            );
        }
    }
    out.push_str(
        "<h4>Windows</h4><table><tr><th>window</th><th>node</th><th class=\"n\">folders</th>\
         <th class=\"n\">wall s</th><th>top function (total)</th></tr>\n",
    );
    for g in &summary.windows {
        let wall = g.start_s.zip(g.end_s).map(|(a, b)| b - a);
        let first = g.functions.first().map_or("–".to_owned(), |f| f.name.clone());
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"code\">{}</td></tr>",
            esc(&g.label),
            esc(&g.node),
            g.folders,
            esc(&wall.map_or("–".to_owned(), num)),
            esc(&first)
        );
    }
    out.push_str("</table>\n");
    // A step window's anchor (`docs/report.md`, "Anchors"): the first window that starts at a step.
    let mut anchored = std::collections::HashSet::new();
    for (i, g) in summary.windows.iter().enumerate() {
        if let Some(first) = g.first_step.filter(|f| g.kind == PythonGroupKind::Steps && anchored.insert(*f))
        {
            let _ = write!(out, "<span id=\"window-python-{first}\"></span>");
        }
        let _ = writeln!(
            out,
            "<details{} id=\"python-window-{i}\"><summary>{} · {}</summary>",
            if i == 0 { " open" } else { "" },
            esc(&g.label),
            esc(&g.node)
        );
        functions_table(out, &g.functions);
        let parts: Vec<&PythonWindow> = folders
            .iter()
            .filter(|w| w.label == g.label && w.node == g.node && w.profiler == g.profiler)
            .collect();
        if !parts.is_empty() {
            out.push_str("<p class=\"note\">Folders: ");
            let names: Vec<String> = parts
                .iter()
                .map(|w| format!("<span title=\"{}\">{}</span>", esc(&w.window), esc(&w.part)))
                .collect();
            out.push_str(&names.join("; "));
            out.push_str("</p>\n");
        }
        out.push_str("</details>\n");
    }
}

fn functions_table(out: &mut String, functions: &[PyFunctionTotal]) {
    out.push_str(
        "<table><tr><th>function</th><th>file:line</th><th class=\"n\">calls</th>\
         <th class=\"n\">self s</th><th class=\"n\">total s</th><th class=\"n\">folders</th></tr>\n",
    );
    for f in functions {
        let _ = writeln!(
            out,
            "<tr><td class=\"code\">{}</td><td class=\"code\">{}:{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&f.name),
            esc(&f.file),
            f.line.map_or("–".to_owned(), |l| l.to_string()),
            f.calls.map_or("–".to_owned(), |c| c.to_string()),
            esc(&num(f.self_s)),
            esc(&num(f.total_s)),
            f.folders
        );
    }
    out.push_str("</table>\n");
}

/// The "Native windows" section: per window, its top functions by self and by total
/// samples and its flame graph.
pub fn section_native(out: &mut String, windows: &[NativeWindow], t0: f64) {
    out.push_str("<section id=\"native\"><h2>Native windows</h2>\n");
    if windows.is_empty() {
        out.push_str("<p class=\"note\">No native profiling window was recorded.</p>\n</section>\n");
        return;
    }
    out.push_str(
        "<p class=\"note\">CPU samples of the trainer's native code (C, C++, Rust) inside each native \
         window (<code>NativeProfilingConfig</code>), every thread in proportion to the CPU time it \
         used. <i>Self</i>: samples in the function itself; <i>total</i>: samples with the function \
         anywhere on the stack. The flame graph is redrawn from the window's profile (hover a frame \
         for its name and samples).</p>\n",
    );
    for (i, w) in windows.iter().enumerate() {
        let wall = w.start_s.zip(w.end_s).map(|(a, b)| b - a);
        let _ = writeln!(
            out,
            "<details{} id=\"native-{i}\"><summary>{} · pid {} · {} → {} ({} s) · {} {}{}</summary>",
            if i == 0 { " open" } else { "" },
            esc(&w.node),
            w.pid.map_or("–".to_owned(), |p| p.to_string()),
            esc(&offset(w.start_s, t0)),
            esc(&offset(w.end_s, t0)),
            esc(&wall.map_or("–".to_owned(), num)),
            w.samples,
            crate::page::markup::plural(w.samples, "sample", "samples"),
            w.cpu_s.map_or(String::new(), |c| format!(", {} s of CPU", esc(&num(c))))
        );
        let source = match w.source {
            NativeFile::Profile => format!("read from <code>{PROFILE_FILE}</code>"),
            NativeFile::Flamegraph => format!(
                "read from <code>{}</code> (the window has no readable <code>{PROFILE_FILE}</code>)",
                esc(w.source.as_str())
            ),
        };
        let _ = writeln!(
            out,
            "<p class=\"note\">Folder <span class=\"code\">{}</span>, {source}.",
            esc(&w.window)
        );
        if w.samples_left_out > 0 {
            let _ = write!(
                out,
                " {} {} of stacks past the report's caps {} left out.",
                w.samples_left_out,
                crate::page::markup::plural(w.samples_left_out, "sample", "samples"),
                crate::page::markup::plural(w.samples_left_out, "is", "are")
            );
        }
        out.push_str("</p>\n");
        if w.samples == 0 {
            out.push_str("<p class=\"note\">The window caught no sample.</p></details>\n");
            continue;
        }
        out.push_str("<div class=\"native-tops\"><div><h4>Top functions by self samples</h4>\n");
        native_table(out, &w.top_self, w.samples, true);
        out.push_str("</div><div><h4>Top functions by total samples</h4>\n");
        native_table(out, &w.top_total, w.samples, false);
        out.push_str("</div></div>\n<h4>Flame graph</h4>\n");
        flame_svg(out, w);
        out.push_str("</details>\n");
    }
    out.push_str("</section>\n");
}

fn native_table(out: &mut String, rows: &[NativeFunction], samples: u64, by_self: bool) {
    let (a, b) = if by_self { ("self", "total") } else { ("total", "self") };
    let _ = writeln!(
        out,
        "<table class=\"native-top\"><tr><th>function</th><th class=\"n\">{a}</th><th class=\"n\">{a} %</th>\
         <th class=\"n\">{b}</th></tr>"
    );
    let pct = |n: u64| if samples > 0 { n as f64 * 100.0 / samples as f64 } else { 0.0 };
    for r in rows {
        let (x, y) =
            if by_self { (r.self_samples, r.total_samples) } else { (r.total_samples, r.self_samples) };
        let _ = writeln!(
            out,
            "<tr><td class=\"code\">{}</td><td class=\"n\">{x}</td><td class=\"n\">{:.1}</td><td class=\"n\">{y}</td></tr>",
            esc(&r.name),
            pct(x)
        );
    }
    out.push_str("</table>\n");
}

/// The flame graph as inline SVG: the root at the bottom, each frame as wide as its samples.
fn flame_svg(out: &mut String, w: &NativeWindow) {
    let f = &w.flame;
    let Some(root) = f.frames.first() else { return };
    let total = root[3].max(1) as f64;
    let depth = f.frames.iter().map(|r| r[1]).max().unwrap_or(0);
    let height = (depth + 1) as f64 * FRAME_HEIGHT;
    let _ = write!(
        out,
        "<svg class=\"flame\" viewBox=\"0 0 {FLAME_WIDTH} {height}\" width=\"100%\" \
         preserveAspectRatio=\"xMinYMin meet\" font-family=\"monospace\" font-size=\"11\" role=\"img\" \
         aria-label=\"flame graph\">"
    );
    for r in &f.frames {
        let [name, d, x, n] = *r;
        let name = f.names.get(name as usize).map_or("?", String::as_str);
        let px = x as f64 / total * FLAME_WIDTH;
        let pw = n as f64 / total * FLAME_WIDTH;
        let py = height - (d + 1) as f64 * FRAME_HEIGHT;
        let title: String = if name.chars().count() > MAX_TITLE {
            name.chars().take(MAX_TITLE).chain(['…']).collect()
        } else {
            name.to_owned()
        };
        let _ = write!(
            out,
            "<g><title>{} ({n} samples, {:.2}%)</title><rect x=\"{px:.1}\" y=\"{py}\" width=\"{:.1}\" height=\"{}\" fill=\"{}\"/>",
            esc(&title),
            n as f64 * 100.0 / total,
            pw.max(0.1),
            FRAME_HEIGHT - 1.0,
            color(name)
        );
        let chars = ((pw - 4.0) / CHAR_WIDTH).floor();
        if chars >= 3.0 {
            let chars = chars as usize;
            let shown: String = if name.chars().count() > chars {
                name.chars().take(chars.saturating_sub(2)).chain("..".chars()).collect()
            } else {
                name.to_owned()
            };
            let _ = write!(out, "<text x=\"{:.1}\" y=\"{}\">{}</text>", px + 3.0, py + 11.5, esc(&shown));
        }
        out.push_str("</g>");
    }
    out.push_str("</svg>\n");
    if f.left_out > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} {} narrower than 0.1 % of the samples (or past {} frames) {} not drawn; \
             {} samples are in {} callers' width.</p>",
            f.left_out,
            crate::page::markup::plural(f.left_out, "frame", "frames"),
            crate::reading::native::MAX_FLAME_FRAMES,
            crate::page::markup::plural(f.left_out, "is", "are"),
            crate::page::markup::plural(f.left_out, "its", "their"),
            crate::page::markup::plural(f.left_out, "its", "their"),
        );
    }
}

/// A warm colour from the name (the same name, the same colour), as flame graphs draw.
fn color(name: &str) -> String {
    // FNV-1a: stable across runs and platforms.
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    let r = 205 + (h % 50);
    let g = (h >> 8) % 230;
    let b = (h >> 16) % 55;
    format!("rgb({r},{g},{b})")
}

fn num(x: f64) -> String {
    if !x.is_finite() {
        "–".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else if x.abs() >= 0.005 {
        format!("{x:.2}")
    } else if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.4}")
    }
}

fn offset(t: Option<f64>, t0: f64) -> String {
    match t.filter(|t| t.is_finite()) {
        Some(t) => format!("+{:.2} s", t - t0),
        None => "–".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ReportModel;

    const HOSTILE: &str = "</title></svg><script>alert(1)</script><img src=x onerror=alert(2)>";

    fn native_model() -> ReportModel {
        let b = crate::reading::native::tests::profile_bytes(&[
            ("main", &[HOSTILE, "_ZN3foo3barEv", "main"], 6),
            ("main", &["main"], 1),
        ]);
        let mut t = crate::reading::native::profile(&b, &crate::reading::native::CAPS).unwrap();
        t.show_names(&mut crate::reading::demangle::Demangler::default());
        let (top_self, top_total) = t.top(20);
        let w = NativeWindow {
            node: "0-algo-1".into(),
            window: "1795400000000000-1795400001000000_7".into(),
            pid: Some(7),
            start_s: Some(1_795_400_000.0),
            end_s: Some(1_795_400_001.0),
            source: NativeFile::Profile,
            samples: t.samples(),
            cpu_s: Some(0.07),
            samples_left_out: 0,
            top_self,
            top_total,
            flame: t.flame(1500, 0.001),
        };
        ReportModel { native: vec![w], ..ReportModel::default() }
    }

    #[test]
    fn the_native_section_draws_tables_and_a_flame_graph_of_escaped_names() {
        let page = crate::page::render(&native_model());
        let sec = page.split("<section id=\"native\">").nth(1).unwrap().split("</section>").next().unwrap();
        assert!(sec.contains("<td class=\"code\">foo::bar()</td><td class=\"n\">6</td><td class=\"n\">85.7</td><td class=\"n\">0</td>"), "{sec}");
        assert!(
            !sec.contains("<script") && !sec.contains("<img") && !sec.contains("</title></svg>"),
            "{sec}"
        );
        assert!(sec.contains("&lt;/title&gt;&lt;/svg&gt;&lt;script&gt;alert(1)"));
        // One <g> per frame: all, main (thread), main, foo::bar(), the hostile one.
        let svg = sec.split("<svg class=\"flame\"").nth(1).unwrap();
        assert_eq!(svg.matches("<g>").count(), 5, "{svg}");
        assert_eq!(svg.matches("<svg").count(), 0);
        assert!(svg.contains("<title>all (7 samples, 100.00%)</title>"));
        assert!(sec.contains("7 samples, 0.07 s of CPU"));
    }

    #[test]
    fn no_native_window_is_one_line() {
        let page = crate::page::render(&ReportModel::default());
        assert!(page.contains("No native profiling window was recorded."));
        assert!(page.contains("No Python profiling window was recorded."));
    }

    #[test]
    fn python_windows_are_listed_by_their_names() {
        let mut m = ReportModel::default();
        let f = PyFunctionTotal {
            name: "<lambda>".into(),
            file: "train.py".into(),
            line: Some(3),
            calls: Some(4),
            self_s: 0.5,
            total_s: 1.5,
            folders: 2,
        };
        m.python_summary.top.functions = vec![f.clone()];
        m.python_summary.top.folders = 2;
        m.python_summary.windows.push(crate::model::PythonGroup {
            label: "train steps 240–242 · cProfile".into(),
            node: "0-algo-1".into(),
            profiler: crate::model::PythonProfilerDir::CProfile,
            kind: PythonGroupKind::Steps,
            functions: vec![f],
            folders: 2,
            start_s: Some(1.0),
            end_s: Some(1.25),
            ..Default::default()
        });
        let page = crate::page::render(&m);
        let sec =
            page.split("<h3 id=\"python-windows\">").nth(1).unwrap().split("</section>").next().unwrap();
        assert!(sec.contains("<tr><td>train steps 240–242 · cProfile</td><td>0-algo-1</td><td class=\"n\">2</td><td class=\"n\">0.25</td><td class=\"code\">&lt;lambda&gt;</td></tr>"), "{sec}");
        assert!(sec.contains("<details open id=\"python-window-0\"><summary>train steps 240–242 · cProfile · 0-algo-1</summary>"));
        assert!(sec.contains("Top functions over the step windows"));
    }
}
