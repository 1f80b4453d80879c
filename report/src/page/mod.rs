//! The report as one self-contained, offline HTML page (docs/report.md, "The page").
//!
//! Tables and text are written here, every string from the data HTML-escaped. The charts are
//! drawn in the browser by the vendored uPlot (`report/assets/`) from a compact copy of the
//! model's series embedded as JSON in a `<script type="application/json">` element. Nothing
//! is loaded from anywhere: the script, the styles and the data are all inline, and the page's
//! Content-Security-Policy forbids every request.
//!
//! The renderer reads the typed model (`model.rs`): a renamed field fails to compile here
//! instead of blanking the page. A number that could not be computed (`None`) shows as "–". A
//! finding's evidence is drawn from the table its rule gives ([`crate::rules::Present`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::model::{
    Capped, Clock, ClockState, Finding, Job, ModeSteps, NodeSeries, Phase, PythonSummary, PythonWindow,
    ReportModel, StepSeries, Trigger,
};
use crate::rules::Cell;

pub mod collectives;
pub mod cost;
pub mod detailed;
pub mod fleet;
pub mod hangs;
pub mod markup;
pub mod memory;
pub mod windows;

use markup::{
    CSP, PAGE_CSS, PAGE_JS, UPLOT_CSS, UPLOT_JS, duration, esc, int, list, num, offset, plural, script_json,
    utc,
};

/// Decimals kept in the page's chart data: percentages and rates to 0.1, step times to 0.01 ms,
/// times (seconds from the job's start) to the ms. Shorter numbers keep an hour of 8 GPUs
/// under the size goal (docs/report.md).
const PCT_DECIMALS: i32 = 1;
const MS_DECIMALS: i32 = 2;
const T_DECIMALS: i32 = 3;

/// Step boundaries are drawn on the system charts only when there are at most this many
/// (more would be a grey wash); outliers and triggers are always drawn.
const MAX_MARKS: usize = 400;

/// Rows of a finding's evidence table on the page (all of them are in `--json`).
const MAX_EVIDENCE_ROWS: usize = 50;
/// Profiled windows marked on the time axis (detailed, then Python, then native).
const MAX_WINDOW_MARKS: usize = 1000;

/// The page for `model`.
pub fn render(m: &ReportModel) -> String {
    let job = &m.job;
    let no_series = crate::model::Series::default();
    let series = m.series.as_ref().unwrap_or(&no_series);
    let mut out = String::with_capacity(256 * 1024);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(out, "<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let _ = writeln!(out, "<title>trainprof report: {}</title>", esc(&m.source));
    let _ = writeln!(out, "<style>\n{UPLOT_CSS}\n{PAGE_CSS}</style>\n</head>\n<body data-charts=\"0/0\">");
    let _ = writeln!(
        out,
        "<header><h1>trainprof report</h1><div class=\"source\">{}</div></header>",
        esc(&m.source)
    );
    out.push_str("<nav>");
    if !m.hangs.is_empty() {
        out.push_str("<a href=\"#hangs\">Hangs and crashes</a>");
    }
    out.push_str(
        "<a href=\"#job\">Job</a><a href=\"#steps\">Steps</a><a href=\"#system\">System</a>\
         <a href=\"#framework\">Framework</a><a href=\"#detailed\">Detailed</a><a href=\"#native\">Native</a>\
         <a href=\"#findings\">Findings</a><a href=\"#profiling-cost\">Profiling cost</a>",
    );
    if m.collectives.is_some() || m.nccl_inspector.is_some() {
        out.push_str("<a href=\"#collectives\">Collectives</a>");
    }
    if !m.triggers.is_empty() {
        out.push_str("<a href=\"#triggers\">Triggers</a>");
    }
    if !m.requested.is_empty() {
        out.push_str("<a href=\"#requested\">Requested</a>");
    }
    if !m.memory.is_empty() {
        out.push_str("<a href=\"#memory-snapshots\">Memory</a>");
    }
    if !m.capped_windows.is_empty() {
        out.push_str("<a href=\"#capped\">Capped</a>");
    }
    out.push_str("</nav>\n");
    out.push_str(
        "<div id=\"page-errors\" class=\"page-errors\" hidden><b>Errors while drawing this page</b>\
         <pre id=\"page-errors-list\"></pre></div>\n\
         <noscript><p class=\"page-errors\">The charts need JavaScript; the tables below do not.</p></noscript>\n<main>\n",
    );
    if !job.capped.is_empty() {
        out.push_str(
            "<p class=\"note\"><b>Part of the data was left out:</b> the files name more nodes, \
             GPUs, cores, ranks or phases than the report keeps (see <a href=\"#capped\">Left out</a>).</p>\n",
        );
    }
    let t0 = time_origin(job, series);
    crate::page::hangs::section(&mut out, &m.hangs);
    section_job(&mut out, job);
    section_steps(&mut out, &m.steps, t0);
    crate::page::fleet::section(&mut out, m.fleet.as_ref());
    crate::page::collectives::section(&mut out, m.collectives.as_ref(), m.nccl_inspector.as_ref(), t0);
    section_system(&mut out, &series.nodes);
    section_framework(&mut out, &m.phases, &m.python, &m.python_summary);
    crate::page::detailed::section(&mut out, &m.detailed);
    crate::page::memory::section(&mut out, &m.memory);
    crate::page::windows::section_native(&mut out, &m.native, t0);
    section_findings(&mut out, &m.findings, t0);
    crate::page::cost::section(&mut out, &m.profiling_cost);
    section_triggers(&mut out, &m.triggers, t0);
    section_requested(&mut out, &m.requested, t0);
    section_capped(&mut out, &m.capped_windows, t0);
    out.push_str("</main>\n<script type=\"application/json\" id=\"report-data\">");
    out.push_str(&script_json(&page_data(m, series, t0)));
    out.push_str("</script>\n<script>\n");
    out.push_str(UPLOT_JS);
    out.push_str("\n</script>\n<script>\n");
    out.push_str(PAGE_JS);
    out.push_str("</script>\n</body>\n</html>\n");
    out
}

// ---------------------------------------------------------------------------------------------
// Sections

fn section_job(out: &mut String, job: &Job) {
    out.push_str("<section id=\"job\"><h2>Job</h2><table>\n");
    let row = |out: &mut String, k: &str, v: String| {
        let _ = writeln!(out, "<tr><th>{k}</th><td>{v}</td></tr>");
    };
    row(out, "Start", esc(&utc(job.start_s)));
    row(out, "End", esc(&utc(job.end_s)));
    row(out, "Duration", esc(&duration(job.duration_s)));
    row(out, "Nodes (system)", list(&job.nodes));
    if !job.gpu_models.is_empty() {
        row(out, "GPUs (node records)", esc(&gpu_models(&job.gpu_models)));
    }
    if !job.identities.is_empty() {
        row(out, "Job identity (node records)", esc(&identities(&job.identities)));
    }
    row(out, "Ranks (timelines)", list(&job.ranks));
    let mut spm = String::new();
    for (mode, n) in &job.steps_per_mode {
        let _ = write!(spm, "{}: {n} &nbsp; ", esc(mode));
    }
    row(out, "Steps per mode", if spm.is_empty() { "none".into() } else { spm });
    row(
        out,
        "Initialisation (job start to first step)",
        if job.init_s.is_none() { "– (no step)".into() } else { esc(&duration(job.init_s)) },
    );
    let p = &job.profiled;
    row(
        out,
        "Profiled",
        format!(
            "{} detailed {}, {} dataloader {}, {} Python profiling {} ({} {}), {} native {}",
            p.detailed_steps,
            plural(p.detailed_steps, "step", "steps"),
            p.dataloader_events,
            plural(p.dataloader_events, "event", "events"),
            p.python_windows,
            plural(p.python_windows, "window", "windows"),
            p.python_folders,
            plural(p.python_folders, "folder", "folders"),
            p.native_windows,
            plural(p.native_windows, "window", "windows"),
        ),
    );
    row(out, "Dropped events", job.dropped_events.to_string());
    out.push_str("</table>\n");
    if !job.clock.is_empty() {
        out.push_str(
            "<h3>Clock</h3><table><tr><th>node</th><th>state</th>\
             <th class=\"n\">max error, µs</th><th class=\"n\">estimated error, µs</th></tr>\n",
        );
        for c in &job.clock {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&c.node),
                esc(&clock_state(c)),
                esc(&num(c.max_error_us)),
                esc(&num(c.est_error_us))
            );
        }
        out.push_str(
            "</table>\n<p class=\"note\">The error bounds are the kernel's, the largest of the job; \
             they are shown only for a clock that stayed synchronised. An unsynchronised clock \
             has no measured bound (the kernel's figure then only grows towards its 16 s \
             ceiling), so its timelines cannot be lined up with another node's to better than \
             that.</p>\n",
        );
    }
    if !job.capped.is_empty() {
        out.push_str(
            "<h3 id=\"capped\">Left out</h3><p class=\"note\">The files name more distinct \
             things than the report keeps (docs/report.md, \"Caps\"); the tables and charts \
             cover the rest:</p><ul class=\"capped\">\n",
        );
        for c in &job.capped {
            let _ = writeln!(out, "<li>{}</li>", esc(&capped_text(c)));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</section>\n");
}

/// Each node's GPUs by model (`job.gpu_models`, docs/formats.md, "Node record"):
/// `algo-1: 8 × NVIDIA H200; algo-2: no GPU`.
fn gpu_models(nodes: &BTreeMap<String, BTreeMap<String, u32>>) -> String {
    let node = |(n, models): (&String, &BTreeMap<String, u32>)| {
        let one = BTreeMap::from([(n.clone(), models.clone())]);
        format!("{n}: {}", crate::reading::node_gpus::describe(&one).unwrap_or_default())
    };
    nodes.iter().map(node).collect::<Vec<_>>().join("; ")
}

/// Each node's job identity (`job.identities`, docs/formats.md, "Job identity"), the keys in
/// the summary's order: `algo-1: platform slurm, job 42, rank 3; algo-2: …`.
fn identities(nodes: &BTreeMap<String, BTreeMap<String, String>>) -> String {
    use trainprof_output::protocol::node_record::SUMMARY_KEYS;
    let node = |(n, id): (&String, &BTreeMap<String, String>)| {
        let words: Vec<String> = SUMMARY_KEYS
            .iter()
            .filter_map(|k| Some(format!("{} {}", k.replace('_', " "), id.get(*k)?)))
            .collect();
        format!("{n}: {}", words.join(", "))
    };
    nodes.iter().map(node).collect::<Vec<_>>().join("; ")
}

/// A clock's state in words (`job.clock[].state`).
fn clock_state(c: &Clock) -> String {
    let (n, bad) = (c.readings, c.unsynchronised_readings);
    match c.state {
        Some(ClockState::Synchronised) => "synchronised".to_owned(),
        Some(ClockState::Unsynchronised) if bad == n => {
            "unsynchronised (no time daemon disciplined it): no error bound".to_owned()
        }
        Some(ClockState::Unsynchronised) => {
            format!("unsynchronised in {bad} of {n} readings: no error bound")
        }
        Some(ClockState::Unknown) => "unknown (no synchronisation reading)".to_owned(),
        // A model without `state`: the older boolean.
        None if c.synchronised => "synchronised".to_owned(),
        None => "unsynchronised".to_owned(),
    }
}

/// One reached cap in words (`job.capped[]`).
fn capped_text(c: &Capped) -> String {
    let (limit, n) = (c.limit, c.left_out);
    let of = c.node.as_deref().unwrap_or("the job");
    match c.what.as_str() {
        "nodes" => format!("system nodes: the first {limit} are read; {n} ticks of further nodes left out"),
        "gpus" => format!("GPUs of {of}: the first {limit} are kept; {n} readings of further GPUs left out"),
        "cores" => format!(
            "cores of {of}: the first {limit} are charted and counted; {n} readings of further cores left out of the chart (the CPU total and the bottleneck checks still count them)"
        ),
        "columns" => format!(
            "chart series: {limit} per job; {n} values of further series ({of}) left out of the charts"
        ),
        "ranks" => format!("ranks: the first {limit} are read; {n} events of further ranks left out"),
        "modes" => format!("step modes: the first {limit} are kept; {n} steps of further modes left out"),
        "phases" => format!(
            "phases: the first {limit} are listed; {n} events of further phases are summed in \"(other phases)\""
        ),
        "dataloader_seconds" => format!(
            "dataloader: {limit} seconds with events are judged; {n} events in further seconds left out"
        ),
        "dataloader_pids" => format!(
            "dataloader: {limit} (second, process) pairs are judged; {n} events of further processes left out"
        ),
        "detailed_steps" => {
            format!("detailed steps: {limit} are counted; {n} events of further steps not counted")
        }
        "detailed_events" => format!(
            "detailed windows: {limit} ops and kernels are kept; {n} further ones left out of the Detailed windows section"
        ),
        "detailed_waits" => format!(
            "detailed windows: {limit} DataLoader waits are kept; {n} further ones left out of \"waiting for input\""
        ),
        "detailed_names" => format!(
            "detailed windows: {limit} op and kernel names are kept; {n} events of further names summed under \"(other names)\""
        ),
        "demangled_bytes" => format!(
            "mangled names: {limit} bytes of them per job are demangled; {n} further names are shown as far as they read"
        ),
        "names" => format!(
            "names longer than {limit} bytes ({of}): {n} ticks, readings or events under them left out (phases: summed in \"(other phases)\")"
        ),
        other => format!("{other} ({of}): more than {limit}; {n} left out"),
    }
}

/// A row's count and p50 / p90 / p99 / max / mean cells.
fn stat_cells(count: u64, stats: [Option<f64>; 5]) -> String {
    let mut c = format!("<td class=\"n\">{count}</td>");
    for v in stats {
        let _ = write!(c, "<td class=\"n\">{}</td>", esc(&num(v)));
    }
    c
}

/// Under a mode's charts: the step chart's axis, the steps above it, the warm-up.
fn step_chart_notes(out: &mut String, c: &crate::model::StepChart, t0: f64) {
    for w in &c.warmup {
        let (steps, took) = if w.steps == 1 {
            (format!("step (step {})", w.first_step), "took")
        } else {
            (format!("{} steps ({}–{})", w.steps, w.first_step, w.last_step), "took on average")
        };
        let _ = writeln!(
            out,
            "<p class=\"note warmup\"><span class=\"legend-key\" style=\"background:rgba(31,119,180,0.25)\"></span>\
             <b>Warm-up</b> of {}: its first {} {took} {}× its median step of {} ms \
             ({} ms in all, until {}; shaded blue on the charts).</p>",
            esc(&w.rank),
            esc(&steps),
            esc(&num(Some(w.ms / w.steps.max(1) as f64 / w.median_ms))),
            esc(&num(Some(w.median_ms))),
            esc(&num(Some(w.ms))),
            esc(&offset(Some(w.end_s), t0))
        );
    }
    if c.above_count == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "<details class=\"above-axis\"><summary>{} {} than the chart's axis ({} ms, 1.5 × the p99 step) \
         {} marked ▲ at its top edge{}</summary>\
         <table><tr><th>rank</th><th class=\"n\">step</th><th>start</th><th class=\"n\">ms</th></tr>",
        c.above_count,
        plural(c.above_count, "step longer", "steps longer"),
        esc(&num(Some(c.y_max_ms))),
        plural(c.above_count, "is", "are"),
        if c.above_count > c.above.len() as u64 {
            format!(" (the {} longest listed)", c.above.len())
        } else {
            String::new()
        }
    );
    for o in &c.above {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
            esc(&o.rank),
            o.step,
            esc(&offset(Some(o.start_s), t0)),
            esc(&num(Some(o.ms)))
        );
    }
    out.push_str("</table></details>\n");
}

fn section_steps(out: &mut String, modes: &BTreeMap<String, ModeSteps>, t0: f64) {
    out.push_str("<section id=\"steps\"><h2>Steps</h2>\n");
    if modes.is_empty() {
        out.push_str("<p class=\"note\">No steps were recorded.</p>\n");
    }
    for (i, (mode, s)) in modes.iter().enumerate() {
        let _ = writeln!(out, "<h3>{}</h3>", esc(mode));
        // Many ranks: their rows folded (`docs/report.md`, "Many ranks").
        let many = s.per_rank.len() > crate::analysis::fleet::MAX_RANK_SERIES;
        if many {
            let _ = write!(out, "<details><summary>{} ranks' steps</summary>", s.per_rank.len());
        }
        out.push_str(
            "<table><tr><th></th><th class=\"n\">steps</th><th class=\"n\">p50 ms</th><th class=\"n\">p90 ms</th>\
             <th class=\"n\">p99 ms</th><th class=\"n\">max ms</th><th class=\"n\">mean ms</th></tr>\n",
        );
        let _ = writeln!(
            out,
            "<tr><th>all ranks</th>{}</tr>",
            stat_cells(s.count, [s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms, s.mean_ms])
        );
        for (rank, r) in &s.per_rank {
            let slow = s.stragglers.iter().any(|x| &x.rank == rank);
            let _ = writeln!(
                out,
                "<tr{}><th>{}{}</th>{}</tr>",
                if slow { " class=\"straggler\"" } else { "" },
                esc(rank),
                if slow { " (straggler)" } else { "" },
                stat_cells(r.count, [r.p50_ms, r.p90_ms, r.p99_ms, r.max_ms, r.mean_ms])
            );
        }
        out.push_str("</table>\n");
        if many {
            out.push_str("</details>\n");
        }
        for x in &s.stragglers {
            let _ = writeln!(
                out,
                "<p><b>Straggler: {}</b>, median step {} ms, {}× the median rank's {} ms.</p>",
                esc(&x.rank),
                esc(&num(Some(x.p50_ms))),
                esc(&num(Some(x.ratio))),
                esc(&num(Some(x.median_rank_p50_ms)))
            );
        }
        let _ = writeln!(out, "<div id=\"mode-{i}-charts\"></div>");
        step_chart_notes(out, &s.chart, t0);
        if !s.outliers.is_empty() {
            let _ = writeln!(
                out,
                "<details><summary>{} outlier steps (longest first; red on the charts)</summary>\
                 <table><tr><th>rank</th><th class=\"n\">step</th><th>start</th><th class=\"n\">ms</th></tr>",
                s.outliers.len()
            );
            for o in &s.outliers {
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
                    esc(&o.rank),
                    o.step,
                    esc(&utc(Some(o.start_s))),
                    esc(&num(Some(o.ms)))
                );
            }
            out.push_str("</table></details>\n");
        }
    }
    out.push_str("</section>\n");
}

fn section_system(out: &mut String, nodes: &BTreeMap<String, NodeSeries>) {
    out.push_str(
        "<section id=\"system\"><h2>System over time</h2>\n<p class=\"note\">All charts share the job's \
         time axis (drag to zoom, double-click to reset). <span class=\"legend-key\" \
         style=\"background:rgba(214,39,40,0.4)\"></span>outlier steps \
         <span class=\"legend-key\" style=\"background:rgba(148,103,189,0.45)\"></span>anomaly triggers \
         <span class=\"legend-key\" style=\"background:rgba(255,165,0,0.35)\"></span>findings' evidence \
         <span class=\"legend-key\" style=\"background:rgba(44,160,44,0.8)\"></span>profiled windows (marked along \
         the time axis); thin grey lines are step boundaries when there are few enough to see.</p>\n",
    );
    if nodes.is_empty() {
        out.push_str("<p class=\"note\">No system metrics were recorded.</p>\n");
    }
    for (i, node) in nodes.keys().enumerate() {
        let _ = writeln!(out, "<h3>{}</h3><div id=\"node-{i}-charts\"></div>", esc(node));
    }
    out.push_str("</section>\n");
}

fn section_framework(out: &mut String, phases: &[Phase], windows: &[PythonWindow], summary: &PythonSummary) {
    out.push_str("<section id=\"framework\"><h2>Framework</h2>\n<h3>Time per phase</h3>\n");
    // The detailed windows' ops and kernels have their own section.
    let detailed = phases.iter().any(|p| crate::page::detailed::is_detailed_phase(&p.name));
    let phases: Vec<&Phase> =
        phases.iter().filter(|p| !crate::page::detailed::is_detailed_phase(&p.name)).collect();
    if detailed {
        out.push_str(
            "<p class=\"note\">The detailed windows' CPU ops and GPU kernels are explained under \
             <a href=\"#detailed\">Detailed windows</a>.</p>\n",
        );
    }
    if phases.is_empty() {
        out.push_str("<p class=\"note\">No phase events were recorded.</p>\n");
    } else {
        out.push_str(
            "<div id=\"phases-chart\"></div>\n<table><tr><th>phase</th><th class=\"n\">events</th>\
             <th class=\"n\">total ms</th><th class=\"n\">mean ms</th></tr>\n",
        );
        for p in &phases {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&p.name),
                p.count,
                esc(&num(Some(p.total_ms))),
                esc(&num(Some(p.mean_ms)))
            );
        }
        out.push_str("</table>\n");
    }
    crate::page::windows::python_windows(out, summary, windows);
    out.push_str("</section>\n");
}

fn section_findings(out: &mut String, findings: &[Finding], t0: f64) {
    out.push_str("<section id=\"findings\"><h2>Findings</h2>\n");
    let n = findings.iter().filter(|f| f.triggered).count();
    let _ = writeln!(
        out,
        "<p>{n} of {} checks triggered (the checks of SageMaker Debugger's built-in profiler rules, \
         with their default thresholds).</p>",
        findings.len()
    );
    let prelim = findings.iter().filter(|f| f.preliminary.is_some()).count();
    if prelim > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{prelim} of them are <b>preliminary</b>: the job has less data than \
             the rule waits for (its patience), so they are judged on what there is \
             (<code>trainprof report --patience 1000</code> leaves them not evaluated, as SageMaker \
             does).</p>"
        );
    }
    for f in findings {
        let (class, badge) = match (f.triggered, f.evaluated) {
            (true, _) => ("finding triggered", "triggered"),
            (false, true) => ("finding", "not triggered"),
            (false, false) => ("finding not-evaluated", "not evaluated"),
        };
        let _ =
            write!(out, "<div class=\"{class}\"><h3>{}<span class=\"badge\">{badge}</span>", esc(&f.rule));
        if let Some(p) = &f.preliminary {
            let _ = write!(out, "<span class=\"badge preliminary\">{}</span>", esc(&p.label()));
        }
        let _ = writeln!(out, "</h3><p>{}</p>", esc(&f.summary));
        if f.preliminary.is_some() {
            out.push_str(
                "<p class=\"note\">Judged on less data than the rule's patience (SageMaker would not \
                 judge it yet): read it as a first look. <code>--patience</code> gives SageMaker's \
                 behaviour.</p>\n",
            );
        }
        if !f.advice.is_empty() {
            let _ = writeln!(out, "<p><b>What to do:</b> {}</p>", esc(&f.advice));
        }
        evidence_table(out, &f.evidence.present(), t0);
        if !f.ranges.is_empty() {
            out.push_str("<p class=\"note\">Time ranges (shaded orange on the system charts): ");
            let shown: Vec<String> = f
                .ranges
                .iter()
                .take(20)
                .map(|r| esc(&format!("{} → {}", offset(Some(r[0]), t0), offset(Some(r[1]), t0))))
                .collect();
            out.push_str(&shown.join(", "));
            if f.ranges.len() > 20 {
                let _ = write!(out, ", and {} more", f.ranges.len() - 20);
            }
            out.push_str("</p>\n");
        }
        out.push_str("</div>\n");
    }
    out.push_str("</section>\n");
}

/// A finding's evidence: its settings and totals as name and value, then its rows (at most
/// `MAX_EVIDENCE_ROWS`).
fn evidence_table(out: &mut String, t: &crate::rules::Table, t0: f64) {
    if !t.facts.is_empty() {
        out.push_str("<table class=\"evidence\">");
        for (k, v) in &t.facts {
            let mut text = cell(v, t0);
            if let Some(u) = t.unit(k).filter(|_| text != "–") {
                text = format!("{text} {u}");
            }
            let _ = write!(out, "<tr><th>{}</th><td class=\"code\">{}</td></tr>", esc(k), esc(&text));
        }
        out.push_str("</table>\n");
    }
    if t.rows.is_empty() {
        return;
    }
    out.push_str("<table class=\"evidence-rows\"><tr>");
    for c in &t.columns {
        match t.unit(c) {
            Some(u) => {
                let _ = write!(out, "<th>{} <span class=\"unit\">({})</span></th>", esc(c), esc(u));
            }
            None => {
                let _ = write!(out, "<th>{}</th>", esc(c));
            }
        }
    }
    out.push_str("</tr>\n");
    for row in t.rows.iter().take(MAX_EVIDENCE_ROWS) {
        out.push_str("<tr>");
        for v in row {
            let class = if matches!(v, Cell::Text(_)) { "" } else { " class=\"n\"" };
            let _ = write!(out, "<td{class}>{}</td>", esc(&cell(v, t0)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    if t.rows.len() > MAX_EVIDENCE_ROWS {
        let _ = writeln!(
            out,
            "<p class=\"note\">and {} more rows (all of them in <code>trainprof report --json</code>).</p>",
            t.rows.len() - MAX_EVIDENCE_ROWS
        );
    }
}

/// One evidence value as text.
fn cell(v: &Cell, t0: f64) -> String {
    match v {
        Cell::Text(s) => s.clone(),
        Cell::Num(x) => num(*x),
        Cell::Int(x) => int(*x),
        Cell::Flag(None) => "–".into(),
        Cell::Flag(Some(b)) => if *b { "yes" } else { "no" }.into(),
        Cell::Time(t) => offset(*t, t0),
    }
}

fn section_triggers(out: &mut String, triggers: &[Trigger], t0: f64) {
    if triggers.is_empty() {
        return;
    }
    out.push_str(
        "<section id=\"triggers\"><h2>Triggers</h2>\n<p class=\"note\">Profiling windows opened \
         by an anomalous step (<code>AutoProfilingConfig</code>; shaded purple on the charts).</p>\n<table><tr><th>rank</th><th class=\"n\">step</th>\
         <th>start</th><th class=\"n\">ms</th><th class=\"n\">median ms</th><th>opened</th></tr>\n",
    );
    let ids = page_ids(out);
    for t in triggers {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            esc(&t.rank),
            t.step,
            esc(&offset(Some(t.start_s), t0)),
            esc(&num(Some(t.ms))),
            esc(&num(Some(t.median_ms))),
            opened(t, &ids)
        );
    }
    out.push_str("</table></section>\n");
}

/// The windows `trainprof trigger` armed (docs/report.md, "Requested windows"): one row per
/// rank, the request's id saying which rows one request matched.
fn section_requested(out: &mut String, windows: &[crate::model::RequestedWindow], t0: f64) {
    if windows.is_empty() {
        return;
    }
    out.push_str(
        "<section id=\"requested\"><h2>Requested windows</h2>\n<p class=\"note\">Profiling windows \
         opened on demand (<code>trainprof trigger</code>), each rank of a request on the same step.</p>\n\
         <table><tr><th>request</th><th>rank</th><th>asked</th><th>opened</th><th>windows</th></tr>\n",
    );
    let ids = page_ids(out);
    for w in windows {
        let as_trigger = Trigger {
            rank: w.rank.clone(),
            step: w.window_start_step.unwrap_or(0),
            ms: 0.0,
            median_ms: 0.0,
            start_s: w.start_s,
            features: Some(w.features.clone()),
            window_start_step: w.window_start_step,
            window_num_steps: w.window_num_steps,
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&w.request_id),
            esc(&w.rank),
            esc(&offset(w.requested_s, t0)),
            esc(&offset(Some(w.start_s), t0)),
            opened(&as_trigger, &ids)
        );
    }
    out.push_str("</table></section>\n");
}

/// The windows that stopped at their cap (docs/report.md, "Capped windows"): one row per
/// rank and window, marked "stopped at its cap: N events at step S".
fn section_capped(out: &mut String, windows: &[crate::model::CappedWindow], t0: f64) {
    if windows.is_empty() {
        return;
    }
    out.push_str(
        "<section id=\"capped\"><h2>Capped windows</h2>\n<p class=\"note\">Windows that stopped \
         early at their cap (<code>WindowCapsConfig</code>): the steps after it were not profiled.</p>\n\
         <table><tr><th>rank</th><th>window</th><th>when</th><th></th></tr>\n",
    );
    for w in windows {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} (cap {})</td></tr>",
            esc(&w.rank),
            esc(&w.feature),
            esc(&offset(Some(w.at_s), t0)),
            esc(&w.mark()),
            w.limit
        );
    }
    out.push_str("</table></section>\n");
}

/// Every `id="…"` of the page so far.
fn page_ids(page: &str) -> std::collections::HashSet<String> {
    page.split(" id=\"").skip(1).filter_map(|s| s.split('"').next()).map(str::to_owned).collect()
}

/// Where the page shows a window of `feature` that starts at `start` (`docs/report.md`,
/// "Anchors"): its own anchor `window-<feature>-<start>`, else the section that shows that
/// feature's windows; `None` when the page has neither.
pub fn window_anchor(
    feature: &str,
    start: Option<i64>,
    ids: &std::collections::HashSet<String>,
) -> Option<String> {
    let own = start.map(|s| format!("window-{feature}-{s}"));
    let sections: &[&str] = match feature {
        "detailed" => &["detailed"],
        "python" => &["python-windows", "framework"],
        "native" => &["native"],
        "dataloader" => &["framework"],
        _ => &[],
    };
    own.into_iter().chain(sections.iter().map(|s| (*s).to_owned())).find(|id| ids.contains(id))
}

/// A trigger's windows: their steps, and each feature linked to where the page shows it.
fn opened(t: &Trigger, ids: &std::collections::HashSet<String>) -> String {
    let Some(names) = t.features.as_deref().filter(|n| !n.is_empty()) else { return "–".to_owned() };
    let links: Vec<String> = names
        .iter()
        .map(|f| match window_anchor(f, t.window_start_step, ids) {
            Some(id) => format!("<a href=\"#{}\">{}</a>", esc(&id), esc(f)),
            None => esc(f),
        })
        .collect();
    let steps = match (t.window_start_step, t.window_num_steps) {
        (Some(a), Some(n)) if n > 1 => format!("steps {a}–{}: ", a + n - 1),
        (Some(a), _) => format!("step {a}: "),
        _ => String::new(),
    };
    format!("{}{}", esc(&steps), links.join(", "))
}

// ---------------------------------------------------------------------------------------------
// The charts' data

/// The time every chart counts from: the job's start, else the earliest series time, else 0.
fn time_origin(job: &Job, series: &crate::model::Series) -> f64 {
    if let Some(s) = job.start_s {
        return s;
    }
    let firsts = series
        .nodes
        .values()
        .filter_map(|n| n.t_s.first())
        .chain(series.steps.values().flat_map(|r| r.values().filter_map(|s| s.t_s.first())));
    let min = firsts.copied().fold(f64::INFINITY, f64::min);
    if min.is_finite() { min } else { 0.0 }
}

/// The compact JSON the page's script draws from (`report/assets/page.js` reads these keys):
/// times in seconds from `t0`, numbers rounded. A non-finite number is written as `null`.
#[derive(Serialize)]
struct PageData<'a> {
    t0: f64,
    span: f64,
    modes: Vec<ModeData<'a>>,
    nodes: Vec<NodeData<'a>>,
    bands: Vec<Band>,
    marks: Vec<f64>,
    phases: Vec<PhaseData<'a>>,
    /// The arrival spread per collective (`collectives.chart`): times relative to `t0`, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    collectives: Option<[Vec<f64>; 2]>,
}

#[derive(Serialize)]
struct ModeData<'a> {
    mode: &'a str,
    hist: HistData<'a>,
    ranks: Vec<RankData<'a>>,
    outliers: Vec<OutlierData<'a>>,
    per_rank: Vec<RankStatsData<'a>>,
    /// The step chart's y axis, ms (`steps.<mode>.chart`), and the steps above it, drawn at
    /// its top edge with their values in the legend.
    /// `null` for a model without the chart (an older one): the page then fits the axis.
    y: Option<[f64; 2]>,
    above: Vec<OutlierData<'a>>,
}

#[derive(Serialize)]
struct HistData<'a> {
    edges: Vec<f64>,
    counts: &'a [u64],
    /// The last bin when it is the overflow bin (`stats::step_histogram`): drawn as wide as
    /// the others, its true range in its label.
    over: Option<[f64; 2]>,
}

#[derive(Serialize)]
struct RankData<'a> {
    rank: &'a str,
    t: Vec<f64>,
    ms: Vec<f64>,
}

#[derive(Serialize)]
struct OutlierData<'a> {
    rank: &'a str,
    step: i64,
    t: f64,
    ms: f64,
}

#[derive(Serialize)]
struct RankStatsData<'a> {
    rank: &'a str,
    p50: Option<f64>,
    p90: Option<f64>,
    straggler: bool,
}

#[derive(Serialize)]
struct NodeData<'a> {
    node: &'a str,
    t: Vec<f64>,
    cpu: Vec<Option<f64>>,
    cores: Vec<Vec<Option<f64>>>,
    mem: Vec<Option<f64>>,
    gpus: Vec<GpuData<'a>>,
    io: Option<Pair>,
    net: Option<Pair>,
    trainer: Option<Pair>,
}

#[derive(Serialize)]
struct GpuData<'a> {
    name: &'a str,
    util: Vec<Option<f64>>,
    mem: Vec<Option<f64>>,
}

/// Two series of a node under the names the script reads.
struct Pair(&'static str, Vec<Option<f64>>, &'static str, Vec<Option<f64>>);

impl Serialize for Pair {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry(self.0, &self.1)?;
        m.serialize_entry(self.2, &self.3)?;
        m.end()
    }
}

#[derive(Serialize)]
struct Band {
    a: f64,
    b: f64,
    kind: &'static str,
    /// A finding's charts (their names' last words: `gpu util`, `cpu`, `steps`…); none: every
    /// time chart.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    on: &'static [&'static str],
}

#[derive(Serialize)]
struct PhaseData<'a> {
    name: &'a str,
    total: f64,
}

fn page_data<'a>(m: &'a ReportModel, series: &'a crate::model::Series, t0: f64) -> PageData<'a> {
    let job = &m.job;
    let mut span = job.duration_s.or_else(|| Some(job.end_s? - t0)).unwrap_or(0.0);
    let mut bands = Vec::new();
    let mut modes = Vec::new();
    let mut marks: Vec<f64> = Vec::new();
    for (mode, s) in &m.steps {
        let is_straggler = |rank: &str| s.stragglers.iter().any(|x| x.rank == rank);
        let mut ranks = Vec::new();
        for (rank, r) in series.steps.get(mode).into_iter().flatten() {
            let r: &StepSeries = r;
            let t = rel(&r.t_s, t0);
            span = span.max(last_time(&t));
            if marks.is_empty() && r.t_s.len() <= MAX_MARKS {
                marks = t.clone();
            }
            ranks.push(RankData { rank, t, ms: r.ms.iter().map(|&x| round(x, MS_DECIMALS)).collect() });
        }
        let mut outliers = Vec::new();
        for o in &s.outliers {
            let a = o.start_s - t0;
            bands.push(band(a, a + o.ms / 1000.0, "outlier"));
            outliers.push(OutlierData {
                rank: &o.rank,
                step: o.step,
                t: round(a, T_DECIMALS),
                ms: round(o.ms, MS_DECIMALS),
            });
        }
        let per_rank = s
            .per_rank
            .iter()
            .map(|(rank, r)| RankStatsData {
                rank,
                p50: r.p50_ms.map(|x| round(x, MS_DECIMALS)),
                p90: r.p90_ms.map(|x| round(x, MS_DECIMALS)),
                straggler: is_straggler(rank),
            })
            .collect();
        let mut edges: Vec<f64> = s.histogram.edges_ms.iter().map(|&x| round(x, MS_DECIMALS)).collect();
        let over = overflow_bin(&s.histogram.edges_ms);
        if let (Some(o), Some(last)) = (over, edges.last_mut()) {
            // Drawn as wide as the others.
            *last = round(o[0] + (s.histogram.edges_ms[1] - s.histogram.edges_ms[0]), MS_DECIMALS);
        }
        let hist = HistData {
            edges,
            counts: &s.histogram.counts,
            over: over.map(|o| [round(o[0], MS_DECIMALS), round(o[1], MS_DECIMALS)]),
        };
        let c = &s.chart;
        let above = c
            .above
            .iter()
            .map(|o| OutlierData {
                rank: &o.rank,
                step: o.step,
                t: round(o.start_s - t0, T_DECIMALS),
                ms: round(o.ms, MS_DECIMALS),
            })
            .collect();
        for w in &c.warmup {
            bands.push(band(w.start_s - t0, w.end_s - t0, "warmup"));
        }
        let y = (c.y_max_ms > c.y_min_ms)
            .then(|| [round(c.y_min_ms, MS_DECIMALS), round(c.y_max_ms, MS_DECIMALS)]);
        modes.push(ModeData { mode, hist, ranks, outliers, per_rank, y, above });
    }
    for t in &m.triggers {
        bands.push(band(t.start_s - t0, t.start_s - t0 + t.ms / 1000.0, "trigger"));
    }
    for f in m.findings.iter().filter(|f| f.triggered) {
        for r in &f.ranges {
            bands.push(Band { on: finding_charts(&f.rule), ..band(r[0] - t0, r[1] - t0, "finding") });
        }
    }
    // The profiled windows, marked along the time axis (docs/report.md, "The page").
    let detailed = m.detailed.windows.iter().map(|w| (w.start_s, w.end_s));
    let python = m.python.iter().filter_map(|w| w.start_s.zip(w.end_s));
    let native = m.native.iter().filter_map(|w| w.start_s.zip(w.end_s));
    for (a, b) in detailed.chain(python).chain(native).filter(|(a, b)| b >= a).take(MAX_WINDOW_MARKS) {
        bands.push(band(a - t0, b - t0, "window"));
    }
    let pct = |v: &[Option<f64>]| -> Vec<Option<f64>> {
        v.iter().map(|x| x.map(|x| round(x, PCT_DECIMALS))).collect()
    };
    let mut nodes = Vec::new();
    for (node, n) in &series.nodes {
        let t = rel(&n.t_s, t0);
        span = span.max(last_time(&t));
        nodes.push(NodeData {
            node,
            t,
            cpu: pct(&n.cpu_total),
            cores: n.cpu_cores.iter().map(|c| pct(c)).collect(),
            mem: pct(&n.memory),
            gpus: n
                .gpus
                .iter()
                .map(|(name, g)| GpuData { name, util: pct(&g.util), mem: pct(&g.mem) })
                .collect(),
            io: n.io.as_ref().map(|v| Pair("read", pct(&v.read_mbps), "write", pct(&v.write_mbps))),
            net: n.net.as_ref().map(|v| Pair("rx", pct(&v.rx_mbps), "tx", pct(&v.tx_mbps))),
            trainer: n.trainer.as_ref().map(|v| Pair("cpu", pct(&v.cpu), "mem", pct(&v.mem_mb))),
        });
    }
    let phases = m
        .phases
        .iter()
        .filter(|p| !crate::page::detailed::is_detailed_phase(&p.name))
        .map(|p| PhaseData { name: &p.name, total: round(p.total_ms, MS_DECIMALS) })
        .collect();
    let collectives = m.collectives.as_ref().map(|c| {
        [
            c.chart.iter().map(|p| round(p[0] - t0, T_DECIMALS)).collect(),
            c.chart.iter().map(|p| round(p[1], MS_DECIMALS)).collect(),
        ]
    });
    PageData { t0, span: round(span, T_DECIMALS), modes, nodes, bands, marks, phases, collectives }
}

/// The histogram's last bin `[from, to]` when it is an overflow bin: wider than the others
/// (`stats::step_histogram` makes the others equal).
fn overflow_bin(edges: &[f64]) -> Option<[f64; 2]> {
    let n = edges.len();
    if n < 3 {
        return None;
    }
    let width = edges[1] - edges[0];
    let last = edges[n - 1] - edges[n - 2];
    (width > 0.0 && last > width * 1.5).then(|| [edges[n - 2], edges[n - 1]])
}

fn band(a: f64, b: f64, kind: &'static str) -> Band {
    Band { a: round(a, T_DECIMALS), b: round(b, T_DECIMALS), kind, on: &[] }
}

/// The time charts a finding's ranges are shaded on: those of the metric its rule reads.
fn finding_charts(rule: &str) -> &'static [&'static str] {
    match rule {
        "LowGPUUtilization" | "LoadBalancing" | "BatchSize" => &["gpu util", "gpu mem"],
        "GPUMemoryIncrease" => &["gpu mem"],
        "CPUBottleneck" => &["cpu", "gpu util"],
        "IOBottleneck" => &["io", "gpu util"],
        "StepOutlier" => &["over time"],
        _ => &[],
    }
}

/// Times relative to `t0`, rounded.
fn rel(ts: &[f64], t0: f64) -> Vec<f64> {
    ts.iter().map(|t| round(t - t0, T_DECIMALS)).collect()
}

/// The last finite time (a non-finite one is written as `null`).
fn last_time(t: &[f64]) -> f64 {
    t.iter().rev().copied().find(|t| t.is_finite()).unwrap_or(0.0)
}

/// `x` to `decimals` places; NaN and ±inf stay as they are (the JSON writer makes them
/// `null`, the model's "cannot be computed").
fn round(x: f64, decimals: i32) -> f64 {
    let p = 10f64.powi(decimals);
    (x * p).round() / p
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn esc_escapes_markup_and_quotes() {
        assert_eq!(esc(r#"<a href='x'>&"</a>"#), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
        assert_eq!(esc("plain_name.py"), "plain_name.py");
    }

    #[test]
    fn script_json_cannot_close_the_element_and_reads_back_the_same() {
        let v = serde_json::json!({"f": "</script><!-- & \u{2028}\u{2029} -->", "n": [1, 2.5]});
        let s = script_json(&v);
        assert!(!s.contains('<') && !s.contains('>') && !s.contains('&'), "{s}");
        assert!(!s.contains('\u{2028}') && !s.contains('\u{2029}'));
        let back: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(back, v);
    }

    #[test]
    fn numbers_and_times_format_for_people() {
        assert_eq!(num(None), "–");
        assert_eq!(num(Some(f64::NAN)), "–");
        assert_eq!(num(Some(101.234)), "101");
        assert_eq!(num(Some(12.345)), "12.3");
        assert_eq!(num(Some(1.234)), "1.23");
        assert_eq!(int(None::<i64>), "–");
        assert_eq!(utc(Some(1_700_000_000.25)), "2023-11-14 22:13:20.250 UTC");
        assert_eq!(utc(Some(0.0)), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(utc(Some(951_782_400.0)), "2000-02-29 00:00:00.000 UTC");
        assert_eq!(duration(Some(3723.4)), "1 h 02 min 03 s");
        assert_eq!(duration(Some(12.5)), "12.50 s");
        assert_eq!(duration(Some(75.0)), "1 min 15 s");
        assert_eq!(offset(Some(1_000_075.0), 1_000_000.0), "+1 min 15 s");
    }

    #[test]
    fn rounding_keeps_nulls_and_writes_non_finite_as_null() {
        let v = [Some(1.26), None, Some(3.0), Some(f64::NAN)];
        let rounded: Vec<Option<f64>> = v.iter().map(|x| x.map(|x| round(x, 1))).collect();
        assert_eq!(serde_json::to_value(rounded).unwrap(), serde_json::json!([1.3, null, 3.0, null]));
    }

    #[test]
    fn vendored_scripts_cannot_end_their_element_or_reach_the_network() {
        for (name, text) in [
            ("uPlot.iife.min.js", UPLOT_JS),
            ("page.js", PAGE_JS),
            ("uPlot.min.css", UPLOT_CSS),
            ("page.css", PAGE_CSS),
        ] {
            let lower = text.to_ascii_lowercase();
            for bad in [
                "</script",
                "</style",
                "<!--",
                "fetch(",
                "xmlhttprequest",
                "websocket",
                "eventsource",
                "sendbeacon",
                "import(",
                "url(",
                "@import",
            ] {
                assert!(!lower.contains(bad), "{name} contains {bad:?}");
            }
            // The one address in uPlot is its licence comment on the first line.
            let addresses = lower.matches("http").count();
            let first_line = lower.lines().next().unwrap_or("");
            assert_eq!(
                addresses,
                first_line.matches("http").count(),
                "{name} names an address outside its header"
            );
        }
    }

    #[test]
    fn the_clock_state_and_the_caps_are_said_in_words() {
        let mut m = ReportModel::default();
        m.job.clock = vec![
            crate::model::Clock::new("algo-1", 60, 60, Some(16_000_000.0), Some(16_000_000.0)),
            crate::model::Clock::new("algo-2", 60, 0, Some(1234.0), Some(56.0)),
            crate::model::Clock::new("algo-3", 60, 2, Some(16_000_000.0), None),
        ];
        m.job.capped = vec![crate::model::Capped {
            what: "gpus".into(),
            node: Some("algo-<1>".into()),
            limit: 64,
            left_out: 9936,
        }];
        let page = render(&m);
        let clock = page.split("<h3>Clock</h3>").nth(1).unwrap().split("</table>").next().unwrap();
        assert!(clock.contains("<td>algo-1</td><td>unsynchronised (no time daemon disciplined it): no error bound</td><td class=\"n\">–</td>"), "{clock}");
        assert!(clock.contains("<td>algo-2</td><td>synchronised</td><td class=\"n\">1234</td>"), "{clock}");
        assert!(clock.contains("unsynchronised in 2 of 60 readings"), "{clock}");
        assert!(!clock.contains("16000000"), "{clock}");
        assert!(page.contains("Part of the data was left out"));
        assert!(page.contains(
            "<li>GPUs of algo-&lt;1&gt;: the first 64 are kept; 9936 readings of further GPUs left out</li>"
        ));
        // Without caps reached, no note.
        assert!(!render(&ReportModel::default()).contains("left out"));
    }

    #[test]
    fn a_long_evidence_table_is_cut_on_the_page() {
        let mut m = ReportModel {
            findings: crate::rules::all(&mut crate::rules::Agg::default(), None),
            ..ReportModel::default()
        };
        let Some(crate::model::Evidence::StepOutlier(e)) = m.findings.get_mut(6).map(|f| &mut f.evidence)
        else {
            panic!("{:?}", m.findings.get(6))
        };
        for r in 0..60 {
            e.ranks.push(crate::rules::step_outlier::RankEvidence {
                rank: format!("{r}-algo-1"),
                mode: "TRAIN".into(),
                steps: 200,
                threshold_ms: Some(12.5),
                outliers: if r == 59 { 11 } else { 0 },
                outlier_steps: (0..15).collect(),
                triggered: r == 59,
            });
        }
        let page = render(&m);
        let table = page.split("<h3>StepOutlier").nth(1).unwrap().split("</div>").next().unwrap();
        assert_eq!(table.matches("<tr><td>").count(), MAX_EVIDENCE_ROWS);
        assert!(table.contains("and 10 more rows"), "{table}");
        // The rank that triggered comes first; its steps are listed up to ten.
        assert!(table.contains("<tr><td>59-algo-1</td><td>TRAIN</td><td class=\"n\">200</td><td class=\"n\">12.5</td><td class=\"n\">11</td><td>0, 1, 2, 3, 4, 5, 6, 7, 8, 9, …</td><td class=\"n\">yes</td></tr>"), "{table}");
    }

    /// A short job's findings: every evidence table has units and rounded numbers, no JSON
    /// text; the preliminary ones say so in their badge.
    #[test]
    fn evidence_is_tables_with_units_and_preliminary_is_said() {
        let mut agg = crate::rules::tests::run_with(None, 481, 95.0, 0.0, &[(3.0, 10.0), (90.0, 30.0)]);
        let steps = (0..200).map(|i| crate::analysis::steps::StepRec {
            start_us: i * 1000,
            dur_us: 500 + i % 7,
            step: i,
        });
        agg.steps.entry("TRAIN".into()).or_default().insert("0-algo-1".into(), steps.collect());
        let findings = crate::rules::all(&mut agg, Some(990.0));
        let page = render(&ReportModel { findings: findings.clone(), ..ReportModel::default() });
        let section =
            page.split("<section id=\"findings\">").nth(1).unwrap().split("</section>").next().unwrap();
        assert_eq!(
            section
                .matches("<span class=\"badge preliminary\">preliminary: 481 of 1000 datapoints</span>")
                .count(),
            6,
            "{section}"
        );
        // No JSON text: no braces, no quotes (escaped or not), no long decimals.
        for bad in ["{", "}", "&quot;", "\"p50\""] {
            assert!(!section.contains(bad), "{bad} in {section}");
        }
        let long = regex_like_long_decimal(section);
        assert!(long.is_none(), "an unrounded number: {long:?}");
        // Units: on the facts' values and in the columns' headers.
        assert!(
            section.contains("<tr><th>gpu_threshold</th><td class=\"code\">10.0 %</td></tr>"),
            "{section}"
        );
        assert!(section.contains("<tr><th>patience</th><td class=\"code\">1000 datapoints</td></tr>"));
        assert!(section.contains("<th>window_p95 <span class=\"unit\">(%)</span></th>"));
        assert!(section.contains("<th>threshold_ms <span class=\"unit\">(ms)</span></th>"));
        // Every measured number of every rule's table has its unit declared.
        for f in &findings {
            let t = f.evidence.present();
            for (k, v) in &t.facts {
                if matches!(v, Cell::Num(_)) {
                    assert!(t.units.iter().any(|u| u.0 == *k), "{}: fact {k} has no unit", f.rule);
                }
            }
            for row in &t.rows {
                for (c, v) in t.columns.iter().zip(row) {
                    if matches!(v, Cell::Num(_)) {
                        assert!(t.units.iter().any(|u| u.0 == *c), "{}: column {c} has no unit", f.rule);
                    }
                }
            }
        }
    }

    /// The first number with more than 3 decimals in `s`, if any.
    fn regex_like_long_decimal(s: &str) -> Option<String> {
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'.' && i > 0 && b[i - 1].is_ascii_digit() {
                let n = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                if n > 3 {
                    return Some(s[i.saturating_sub(5)..(i + 1 + n).min(s.len())].to_owned());
                }
            }
            i += 1;
        }
        None
    }

    /// The step chart draws only what the model carries: its axis and the steps above it.
    #[test]
    fn the_step_chart_takes_its_axis_and_marks_from_the_model() {
        let mut ranks = BTreeMap::new();
        let steps: Vec<crate::analysis::steps::StepRec> = (0..300)
            .map(|i| crate::analysis::steps::StepRec {
                start_us: 1_000_000_000_000 + i * 40_000,
                dur_us: if i == 0 { 4_000_000 } else { 30_000 + (i % 5) * 1000 },
                step: i,
            })
            .collect();
        ranks.insert("0-a".to_owned(), steps);
        let mut m = ReportModel::default();
        m.steps.insert("TRAIN".into(), crate::analysis::steps::mode_steps(&ranks));
        m.job.start_s = Some(1_000_000.0);
        let page = render(&m);
        let data = page.split("id=\"report-data\">").nth(1).unwrap().split("</script>").next().unwrap();
        let v: Value = serde_json::from_str(data).unwrap();
        let mode = &v["modes"][0];
        assert_eq!(mode["y"], serde_json::json!([0.0, 51.0]));
        assert_eq!(mode["above"], serde_json::json!([{"rank": "0-a", "step": 0, "t": 0.0, "ms": 4000.0}]));
        // The warm-up is shaded and said.
        assert!(
            v["bands"]
                .as_array()
                .unwrap()
                .iter()
                .any(|b| b["kind"] == "warmup" && b["a"] == 0.0 && b["b"] == 4.0)
        );
        assert!(page.contains("<b>Warm-up</b> of 0-a: its first step (step 0) took 125× its median step of 32.0 ms (4000 ms in all"), "{page}");
        assert!(
            page.contains("1 step longer than the chart&#39;s axis (51.0 ms, 1.5 × the p99 step) is marked")
                || page
                    .contains("1 step longer than the chart's axis (51.0 ms, 1.5 × the p99 step) is marked")
        );
        // The histogram's overflow bin is drawn as wide as the others, its range in the data.
        assert_eq!(mode["hist"]["over"][1], 4000.0);
        let edges = mode["hist"]["edges"].as_array().unwrap();
        let w = edges[1].as_f64().unwrap() - edges[0].as_f64().unwrap();
        let last = edges[edges.len() - 1].as_f64().unwrap() - edges[edges.len() - 2].as_f64().unwrap();
        assert!((last - w).abs() < 0.02, "{w} {last}");
    }

    /// A trigger links what it opened to where the page shows it: the window's own anchor
    /// when the page has one, else the feature's section, else nothing.
    #[test]
    fn a_trigger_links_its_windows() {
        let ids = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<std::collections::HashSet<_>>();
        let page = ids(&["framework", "detailed", "window-detailed-203", "python-windows"]);
        assert_eq!(window_anchor("detailed", Some(203), &page).as_deref(), Some("window-detailed-203"));
        assert_eq!(window_anchor("detailed", Some(206), &page).as_deref(), Some("detailed"));
        assert_eq!(window_anchor("python", Some(203), &page).as_deref(), Some("python-windows"));
        assert_eq!(window_anchor("native", Some(203), &page), None);
        assert_eq!(window_anchor("dataloader", None, &page).as_deref(), Some("framework"));
        let t = Trigger {
            rank: "0-a".into(),
            step: 202,
            ms: 1000.0,
            median_ms: 30.0,
            start_s: 0.0,
            features: Some(vec!["detailed".into(), "python".into(), "native".into()]),
            window_start_step: Some(203),
            window_num_steps: Some(2),
        };
        assert_eq!(
            opened(&t, &page),
            "steps 203–204: <a href=\"#window-detailed-203\">detailed</a>, <a href=\"#python-windows\">python</a>, native"
        );
        // On a rendered page without windows: each feature's section (the Python windows'
        // heading is always drawn).
        let m = ReportModel { triggers: vec![t], ..ReportModel::default() };
        let page = render(&m);
        assert!(page.contains("<a href=\"#python-windows\">python</a>"), "{page}");
        assert!(page.contains("<a href=\"#detailed\">detailed</a>"));
    }

    #[test]
    fn an_empty_model_renders_a_whole_page() {
        let page = render(&ReportModel::default());
        assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
        assert!(page.contains("No steps were recorded") && page.contains("No system metrics were recorded"));
        let data = page.split("id=\"report-data\">").nth(1).unwrap().split("</script>").next().unwrap();
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["t0"], serde_json::json!(0.0));
    }
}
