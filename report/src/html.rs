//! The report as one self-contained, offline HTML page (docs/report.md, "The page").
//!
//! Tables and text are written here, every string from the data HTML-escaped. The charts are
//! drawn in the browser by the vendored uPlot (`report/assets/`) from a compact copy of the
//! model's series embedded as JSON in a `<script type="application/json">` element. Nothing
//! is loaded from anywhere: the script, the styles and the data are all inline, and the page's
//! Content-Security-Policy forbids every request.
//!
//! The renderer works on the model's JSON form (`serde_json::Value`), so it reads exactly the
//! documented keys and tolerates a missing or `null` one (shown as "–").

use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::model::ReportModel;

const UPLOT_JS: &str = include_str!("../assets/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../assets/uPlot.min.css");
const PAGE_JS: &str = include_str!("../assets/page.js");
const PAGE_CSS: &str = include_str!("../assets/page.css");

/// Only inline scripts and styles, no request of any kind (connect, img, font, frame…).
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:";

/// Decimals kept in the page's chart data: percentages and rates to 0.1, step times to 0.01 ms,
/// times (seconds from the job's start) to the ms. Shorter numbers keep an hour of 8 GPUs
/// under the size goal (docs/report.md).
const PCT_DECIMALS: i32 = 1;
const MS_DECIMALS: i32 = 2;
const T_DECIMALS: i32 = 3;

/// Step boundaries are drawn on the system charts only when there are at most this many
/// (more would be a grey wash); outliers and triggers are always drawn.
const MAX_MARKS: usize = 400;

/// The page for `model`.
pub fn render(model: &ReportModel) -> String {
    match serde_json::to_value(model) {
        Ok(v) => render_value(&v),
        Err(e) => render_value(&serde_json::json!({
            "source": format!("(the report could not be prepared: {e})")
        })),
    }
}

/// The page for a model in its JSON form (the shape of docs/report.md).
pub fn render_value(m: &Value) -> String {
    let job = &m["job"];
    let mut out = String::with_capacity(256 * 1024);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(out, "<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let _ = writeln!(out, "<title>trainprof report: {}</title>", esc(str_of(&m["source"])));
    let _ = writeln!(out, "<style>\n{UPLOT_CSS}\n{PAGE_CSS}</style>\n</head>\n<body data-charts=\"0/0\">");
    let _ = writeln!(
        out,
        "<header><h1>trainprof report</h1><div class=\"source\">{}</div></header>",
        esc(str_of(&m["source"]))
    );
    out.push_str(
        "<nav><a href=\"#job\">Job</a><a href=\"#steps\">Steps</a><a href=\"#system\">System</a>\
         <a href=\"#framework\">Framework</a><a href=\"#findings\">Findings</a>",
    );
    if non_empty(&m["triggers"]) {
        out.push_str("<a href=\"#triggers\">Triggers</a>");
    }
    out.push_str("</nav>\n");
    out.push_str(
        "<div id=\"page-errors\" class=\"page-errors\" hidden><b>Errors while drawing this page</b>\
         <pre id=\"page-errors-list\"></pre></div>\n\
         <noscript><p class=\"page-errors\">The charts need JavaScript; the tables below do not.</p></noscript>\n<main>\n",
    );
    if non_empty(&job["capped"]) {
        out.push_str(
            "<p class=\"note\"><b>Part of the data was left out:</b> the files name more nodes, \
             GPUs, cores, ranks or phases than the report keeps (see <a href=\"#capped\">Left out</a>).</p>\n",
        );
    }
    let t0 = time_origin(m);
    section_job(&mut out, job);
    section_steps(&mut out, m);
    section_system(&mut out, m);
    section_framework(&mut out, m);
    section_findings(&mut out, m, t0);
    section_triggers(&mut out, m, t0);
    out.push_str("</main>\n<script type=\"application/json\" id=\"report-data\">");
    out.push_str(&script_json(&page_data(m, t0)));
    out.push_str("</script>\n<script>\n");
    out.push_str(UPLOT_JS);
    out.push_str("\n</script>\n<script>\n");
    out.push_str(PAGE_JS);
    out.push_str("</script>\n</body>\n</html>\n");
    out
}

// ---------------------------------------------------------------------------------------------
// Sections

fn section_job(out: &mut String, job: &Value) {
    out.push_str("<section id=\"job\"><h2>Job</h2><table>\n");
    let row = |out: &mut String, k: &str, v: String| {
        let _ = writeln!(out, "<tr><th>{k}</th><td>{v}</td></tr>");
    };
    row(out, "Start", esc(&utc(&job["start_s"])));
    row(out, "End", esc(&utc(&job["end_s"])));
    row(out, "Duration", esc(&duration(&job["duration_s"])));
    row(out, "Nodes (system)", list(&job["nodes"]));
    row(out, "Ranks (timelines)", list(&job["ranks"]));
    let mut spm = String::new();
    for (mode, n) in obj(&job["steps_per_mode"]) {
        let _ = write!(spm, "{}: {} &nbsp; ", esc(mode), esc(&int(n)));
    }
    row(out, "Steps per mode", if spm.is_empty() { "none".into() } else { spm });
    row(
        out,
        "Initialisation (job start to first step)",
        if job["init_s"].is_null() { "– (no step)".into() } else { esc(&duration(&job["init_s"])) },
    );
    let p = &job["profiled"];
    row(
        out,
        "Profiled",
        format!(
            "{} detailed steps, {} dataloader events, {} Python profiling windows",
            esc(&int(&p["detailed_steps"])),
            esc(&int(&p["dataloader_events"])),
            esc(&int(&p["python_windows"]))
        ),
    );
    row(out, "Dropped events", esc(&int(&job["dropped_events"])));
    out.push_str("</table>\n");
    let clocks = arr(&job["clock"]);
    if !clocks.is_empty() {
        out.push_str(
            "<h3>Clock</h3><table><tr><th>node</th><th>state</th>\
             <th class=\"n\">max error, µs</th><th class=\"n\">estimated error, µs</th></tr>\n",
        );
        for c in clocks {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(str_of(&c["node"])),
                esc(&clock_state(c)),
                esc(&num(&c["max_error_us"])),
                esc(&num(&c["est_error_us"]))
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
    let capped = arr(&job["capped"]);
    if !capped.is_empty() {
        out.push_str(
            "<h3 id=\"capped\">Left out</h3><p class=\"note\">The files name more distinct \
             things than the report keeps (docs/report.md, \"Caps\"); the tables and charts \
             cover the rest:</p><ul class=\"capped\">\n",
        );
        for c in capped {
            let _ = writeln!(out, "<li>{}</li>", esc(&capped_text(c)));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</section>\n");
}

/// A clock's state in words (`job.clock[].state`).
fn clock_state(c: &Value) -> String {
    let (n, bad) = (c["readings"].as_u64().unwrap_or(0), c["unsynchronised_readings"].as_u64().unwrap_or(0));
    match str_of(&c["state"]) {
        "synchronised" => "synchronised".to_owned(),
        "unsynchronised" if bad == n => {
            "unsynchronised (no time daemon disciplined it): no error bound".to_owned()
        }
        "unsynchronised" => format!("unsynchronised in {bad} of {n} readings: no error bound"),
        "unknown" => "unknown (no synchronisation reading)".to_owned(),
        // A model without `state`: the older boolean.
        _ => match c["synchronised"].as_bool() {
            Some(true) => "synchronised".to_owned(),
            Some(false) => "unsynchronised".to_owned(),
            None => "–".to_owned(),
        },
    }
}

/// One reached cap in words (`job.capped[]`).
fn capped_text(c: &Value) -> String {
    let (limit, n) = (int(&c["limit"]), int(&c["left_out"]));
    let of = c["node"].as_str().map_or_else(|| "the job".to_owned(), |node| node.to_owned());
    match str_of(&c["what"]) {
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
        "names" => format!(
            "names longer than {limit} bytes ({of}): {n} ticks, readings or events under them left out (phases: summed in \"(other phases)\")"
        ),
        other => format!("{other} ({of}): more than {limit}; {n} left out"),
    }
}

const STAT_KEYS: [&str; 5] = ["p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"];

fn stat_cells(s: &Value) -> String {
    let mut c = format!("<td class=\"n\">{}</td>", esc(&int(&s["count"])));
    for k in STAT_KEYS {
        let _ = write!(c, "<td class=\"n\">{}</td>", esc(&num(&s[k])));
    }
    c
}

fn section_steps(out: &mut String, m: &Value) {
    out.push_str("<section id=\"steps\"><h2>Steps</h2>\n");
    let modes = obj(&m["steps"]);
    if modes.is_empty() {
        out.push_str("<p class=\"note\">No steps were recorded.</p>\n");
    }
    for (i, (mode, s)) in modes.iter().enumerate() {
        let _ = writeln!(out, "<h3>{}</h3>", esc(mode));
        let stragglers: Vec<&str> = arr(&s["stragglers"]).iter().map(|x| str_of(&x["rank"])).collect();
        out.push_str(
            "<table><tr><th></th><th class=\"n\">steps</th><th class=\"n\">p50 ms</th><th class=\"n\">p90 ms</th>\
             <th class=\"n\">p99 ms</th><th class=\"n\">max ms</th><th class=\"n\">mean ms</th></tr>\n",
        );
        let _ = writeln!(out, "<tr><th>all ranks</th>{}</tr>", stat_cells(s));
        for (rank, r) in obj(&s["per_rank"]) {
            let slow = stragglers.contains(&rank.as_str());
            let _ = writeln!(
                out,
                "<tr{}><th>{}{}</th>{}</tr>",
                if slow { " class=\"straggler\"" } else { "" },
                esc(rank),
                if slow { " (straggler)" } else { "" },
                stat_cells(r)
            );
        }
        out.push_str("</table>\n");
        for x in arr(&s["stragglers"]) {
            let _ = writeln!(
                out,
                "<p><b>Straggler: {}</b>, median step {} ms, {}× the median rank's {} ms.</p>",
                esc(str_of(&x["rank"])),
                esc(&num(&x["p50_ms"])),
                esc(&num(&x["ratio"])),
                esc(&num(&x["median_rank_p50_ms"]))
            );
        }
        let _ = writeln!(out, "<div id=\"mode-{i}-charts\"></div>");
        let outliers = arr(&s["outliers"]);
        if !outliers.is_empty() {
            let _ = writeln!(
                out,
                "<details><summary>{} outlier steps (longest first; red on the charts)</summary>\
                 <table><tr><th>rank</th><th class=\"n\">step</th><th>start</th><th class=\"n\">ms</th></tr>",
                outliers.len()
            );
            for o in outliers {
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
                    esc(str_of(&o["rank"])),
                    esc(&int(&o["step"])),
                    esc(&utc(&o["start_s"])),
                    esc(&num(&o["ms"]))
                );
            }
            out.push_str("</table></details>\n");
        }
    }
    out.push_str("</section>\n");
}

fn section_system(out: &mut String, m: &Value) {
    out.push_str(
        "<section id=\"system\"><h2>System over time</h2>\n<p class=\"note\">All charts share the job's \
         time axis (drag to zoom, double-click to reset). <span class=\"legend-key\" \
         style=\"background:rgba(214,39,40,0.4)\"></span>outlier steps \
         <span class=\"legend-key\" style=\"background:rgba(148,103,189,0.45)\"></span>anomaly triggers \
         <span class=\"legend-key\" style=\"background:rgba(255,165,0,0.35)\"></span>findings' evidence; \
         thin grey lines are step boundaries when there are few enough to see.</p>\n",
    );
    let nodes = obj(&m["series"]["nodes"]);
    if nodes.is_empty() {
        out.push_str("<p class=\"note\">No system metrics were recorded.</p>\n");
    }
    for (i, (node, _)) in nodes.iter().enumerate() {
        let _ = writeln!(out, "<h3>{}</h3><div id=\"node-{i}-charts\"></div>", esc(node));
    }
    out.push_str("</section>\n");
}

fn section_framework(out: &mut String, m: &Value) {
    out.push_str("<section id=\"framework\"><h2>Framework</h2>\n<h3>Time per phase</h3>\n");
    let phases = arr(&m["phases"]);
    if phases.is_empty() {
        out.push_str("<p class=\"note\">No phase events were recorded.</p>\n");
    } else {
        out.push_str(
            "<div id=\"phases-chart\"></div>\n<table><tr><th>phase</th><th class=\"n\">events</th>\
             <th class=\"n\">total ms</th><th class=\"n\">mean ms</th></tr>\n",
        );
        for p in phases {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(str_of(&p["name"])),
                esc(&int(&p["count"])),
                esc(&num(&p["total_ms"])),
                esc(&num(&p["mean_ms"]))
            );
        }
        out.push_str("</table>\n");
    }
    out.push_str("<h3>Python profiling windows</h3>\n");
    let windows = arr(&m["python"]);
    if windows.is_empty() {
        out.push_str("<p class=\"note\">No Python profiling window was recorded.</p>\n");
    }
    for (i, w) in windows.iter().enumerate() {
        let _ = writeln!(
            out,
            "<details{}><summary>{} · {} · steps {}–{} · <span class=\"code\">{}</span></summary>",
            if i == 0 { " open" } else { "" },
            esc(str_of(&w["node"])),
            esc(str_of(&w["profiler"])),
            esc(&int(&w["start_step"])),
            esc(&int(&w["end_step"])),
            esc(str_of(&w["window"]))
        );
        out.push_str(
            "<table><tr><th>function</th><th>file:line</th><th class=\"n\">calls</th>\
             <th class=\"n\">self s</th><th class=\"n\">total s</th></tr>\n",
        );
        for f in arr(&w["functions"]) {
            let _ = writeln!(
                out,
                "<tr><td class=\"code\">{}</td><td class=\"code\">{}:{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(str_of(&f["name"])),
                esc(str_of(&f["file"])),
                esc(&int(&f["line"])),
                esc(&int(&f["calls"])),
                esc(&num(&f["self_s"])),
                esc(&num(&f["total_s"]))
            );
        }
        out.push_str("</table></details>\n");
    }
    out.push_str("</section>\n");
}

fn section_findings(out: &mut String, m: &Value, t0: f64) {
    out.push_str("<section id=\"findings\"><h2>Findings</h2>\n");
    let findings = arr(&m["findings"]);
    let n = findings.iter().filter(|f| f["triggered"].as_bool() == Some(true)).count();
    let _ = writeln!(
        out,
        "<p>{n} of {} checks triggered (the checks of SageMaker Debugger's built-in profiler rules, \
         with their default thresholds).</p>",
        findings.len()
    );
    for f in findings {
        let triggered = f["triggered"].as_bool() == Some(true);
        let evaluated = f["evaluated"].as_bool() != Some(false);
        let (class, badge) = match (triggered, evaluated) {
            (true, _) => ("finding triggered", "triggered"),
            (false, true) => ("finding", "not triggered"),
            (false, false) => ("finding not-evaluated", "not evaluated: no data"),
        };
        let _ = writeln!(
            out,
            "<div class=\"{class}\"><h3>{}<span class=\"badge\">{badge}</span></h3><p>{}</p>",
            esc(str_of(&f["rule"])),
            esc(str_of(&f["summary"]))
        );
        let advice = str_of(&f["advice"]);
        if !advice.is_empty() {
            let _ = writeln!(out, "<p><b>What to do:</b> {}</p>", esc(advice));
        }
        let evidence = obj(&f["evidence"]);
        if !evidence.is_empty() {
            out.push_str("<table class=\"evidence\">");
            for (k, v) in evidence {
                let _ = write!(
                    out,
                    "<tr><th>{}</th><td class=\"code\">{}</td></tr>",
                    esc(k),
                    esc(&evidence_value(v))
                );
            }
            out.push_str("</table>\n");
        }
        let ranges = arr(&f["ranges"]);
        if !ranges.is_empty() {
            out.push_str("<p class=\"note\">Time ranges (shaded orange on the system charts): ");
            let shown: Vec<String> = ranges
                .iter()
                .take(20)
                .map(|r| esc(&format!("{} → {}", offset(&r[0], t0), offset(&r[1], t0))))
                .collect();
            out.push_str(&shown.join(", "));
            if ranges.len() > 20 {
                let _ = write!(out, ", and {} more", ranges.len() - 20);
            }
            out.push_str("</p>\n");
        }
        out.push_str("</div>\n");
    }
    out.push_str("</section>\n");
}

fn section_triggers(out: &mut String, m: &Value, t0: f64) {
    let triggers = arr(&m["triggers"]);
    if triggers.is_empty() {
        return;
    }
    out.push_str(
        "<section id=\"triggers\"><h2>Triggers</h2>\n<p class=\"note\">Profiling windows opened \
         by an anomalous step (<code>AutoProfilingConfig</code>; shaded purple on the charts).</p>\n<table><tr><th>rank</th><th class=\"n\">step</th>\
         <th>start</th><th class=\"n\">ms</th><th class=\"n\">median ms</th><th>opened</th></tr>\n",
    );
    for t in triggers {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            esc(str_of(&t["rank"])),
            esc(&int(&t["step"])),
            esc(&offset(&t["start_s"], t0)),
            esc(&num(&t["ms"])),
            esc(&num(&t["median_ms"])),
            esc(&features(&t["features"]))
        );
    }
    out.push_str("</table></section>\n");
}

/// A trigger's features (`["detailed", "python"]`) as "detailed, python"; "–" when absent.
fn features(v: &Value) -> String {
    let names: Vec<&str> = arr(v).iter().filter_map(Value::as_str).collect();
    if names.is_empty() { "–".to_owned() } else { names.join(", ") }
}

// ---------------------------------------------------------------------------------------------
// The charts' data

/// The time every chart counts from: the job's start, else the earliest series time, else 0.
fn time_origin(m: &Value) -> f64 {
    if let Some(s) = m["job"]["start_s"].as_f64() {
        return s;
    }
    let mut min = f64::INFINITY;
    for n in obj(&m["series"]["nodes"]).values() {
        if let Some(t) = n["t_s"][0].as_f64() {
            min = min.min(t);
        }
    }
    for ranks in obj(&m["series"]["steps"]).values() {
        for r in obj(ranks).values() {
            if let Some(t) = r["t_s"][0].as_f64() {
                min = min.min(t);
            }
        }
    }
    if min.is_finite() { min } else { 0.0 }
}

/// The compact JSON the page's script draws from: times in seconds from `t0`, numbers rounded.
fn page_data(m: &Value, t0: f64) -> Value {
    let job = &m["job"];
    let mut span = job["duration_s"].as_f64().or_else(|| Some(job["end_s"].as_f64()? - t0)).unwrap_or(0.0);
    let mut bands = Vec::new();
    let mut modes = Vec::new();
    let mut marks: Vec<Value> = Vec::new();
    let series_steps = &m["series"]["steps"];
    for (mode, s) in obj(&m["steps"]) {
        let stragglers: Vec<&str> = arr(&s["stragglers"]).iter().map(|x| str_of(&x["rank"])).collect();
        let mut ranks = Vec::new();
        for (rank, r) in obj(&series_steps[mode.as_str()]) {
            let t = rel(&r["t_s"], t0);
            span = span.max(last_time(&t));
            if marks.is_empty() && arr(&r["t_s"]).len() <= MAX_MARKS {
                marks = t.clone();
            }
            ranks.push(obj_of([
                ("rank", Value::from(rank.as_str())),
                ("t", Value::from(t)),
                ("ms", round_all(&r["ms"], MS_DECIMALS)),
            ]));
        }
        let mut outliers = Vec::new();
        for o in arr(&s["outliers"]) {
            let (Some(start), Some(ms)) = (o["start_s"].as_f64(), o["ms"].as_f64()) else { continue };
            let a = start - t0;
            bands.push(band(a, a + ms / 1000.0, "outlier"));
            outliers.push(obj_of([
                ("rank", o["rank"].clone()),
                ("step", o["step"].clone()),
                ("t", round(a, T_DECIMALS)),
                ("ms", round(ms, MS_DECIMALS)),
            ]));
        }
        let per_rank: Vec<Value> = obj(&s["per_rank"])
            .iter()
            .map(|(rank, r)| {
                obj_of([
                    ("rank", Value::from(rank.as_str())),
                    ("p50", round_v(&r["p50_ms"], MS_DECIMALS)),
                    ("p90", round_v(&r["p90_ms"], MS_DECIMALS)),
                    ("straggler", Value::from(stragglers.contains(&rank.as_str()))),
                ])
            })
            .collect();
        let h = &s["histogram"];
        modes.push(obj_of([
            ("mode", Value::from(mode.as_str())),
            (
                "hist",
                obj_of([
                    ("edges", round_all(&h["edges_ms"], MS_DECIMALS)),
                    ("counts", round_all(&h["counts"], 0)),
                ]),
            ),
            ("ranks", Value::from(ranks)),
            ("outliers", Value::from(outliers)),
            ("per_rank", Value::from(per_rank)),
        ]));
    }
    for t in arr(&m["triggers"]) {
        let (Some(start), Some(ms)) = (t["start_s"].as_f64(), t["ms"].as_f64()) else { continue };
        bands.push(band(start - t0, start - t0 + ms / 1000.0, "trigger"));
    }
    for f in arr(&m["findings"]) {
        if f["triggered"].as_bool() != Some(true) {
            continue;
        }
        for r in arr(&f["ranges"]) {
            if let (Some(a), Some(b)) = (r[0].as_f64(), r[1].as_f64()) {
                bands.push(band(a - t0, b - t0, "finding"));
            }
        }
    }
    let mut nodes = Vec::new();
    for (node, n) in obj(&m["series"]["nodes"]) {
        let t = rel(&n["t_s"], t0);
        span = span.max(last_time(&t));
        let gpus: Vec<Value> = obj(&n["gpus"])
            .iter()
            .map(|(name, g)| {
                obj_of([
                    ("name", Value::from(name.as_str())),
                    ("util", round_all(&g["util"], PCT_DECIMALS)),
                    ("mem", round_all(&g["mem"], PCT_DECIMALS)),
                ])
            })
            .collect();
        let pair = |v: &Value, a: &str, ka: &str, b: &str, kb: &str| {
            if v.is_object() {
                obj_of([(a, round_all(&v[ka], PCT_DECIMALS)), (b, round_all(&v[kb], PCT_DECIMALS))])
            } else {
                Value::Null
            }
        };
        nodes.push(obj_of([
            ("node", Value::from(node.as_str())),
            ("t", Value::from(t)),
            ("cpu", round_all(&n["cpu_total"], PCT_DECIMALS)),
            (
                "cores",
                Value::from(
                    arr(&n["cpu_cores"]).iter().map(|c| round_all(c, PCT_DECIMALS)).collect::<Vec<_>>(),
                ),
            ),
            ("mem", round_all(&n["memory"], PCT_DECIMALS)),
            ("gpus", Value::from(gpus)),
            ("io", pair(&n["io"], "read", "read_mbps", "write", "write_mbps")),
            ("net", pair(&n["net"], "rx", "rx_mbps", "tx", "tx_mbps")),
            ("trainer", pair(&n["trainer"], "cpu", "cpu", "mem", "mem_mb")),
        ]));
    }
    let phases: Vec<Value> = arr(&m["phases"])
        .iter()
        .map(|p| obj_of([("name", p["name"].clone()), ("total", round_v(&p["total_ms"], MS_DECIMALS))]))
        .collect();
    obj_of([
        ("t0", Value::from(t0)),
        ("span", round(span, T_DECIMALS)),
        ("modes", Value::from(modes)),
        ("nodes", Value::from(nodes)),
        ("bands", Value::from(bands)),
        ("marks", Value::from(marks)),
        ("phases", Value::from(phases)),
    ])
}

fn band(a: f64, b: f64, kind: &str) -> Value {
    obj_of([("a", round(a, T_DECIMALS)), ("b", round(b, T_DECIMALS)), ("kind", Value::from(kind))])
}

fn obj_of<const N: usize>(kv: [(&str, Value); N]) -> Value {
    Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// Times relative to `t0`, rounded; a missing time stays `null`.
fn rel(ts: &Value, t0: f64) -> Vec<Value> {
    arr(ts).iter().map(|t| t.as_f64().map_or(Value::Null, |t| round(t - t0, T_DECIMALS))).collect()
}

fn last_time(t: &[Value]) -> f64 {
    t.iter().rev().find_map(Value::as_f64).unwrap_or(0.0)
}

fn round(x: f64, decimals: i32) -> Value {
    let p = 10f64.powi(decimals);
    // Value::from(NaN or ±inf) is null, the model's "cannot be computed".
    Value::from((x * p).round() / p)
}

fn round_v(v: &Value, decimals: i32) -> Value {
    v.as_f64().map_or(Value::Null, |x| round(x, decimals))
}

fn round_all(v: &Value, decimals: i32) -> Value {
    Value::from(arr(v).iter().map(|x| round_v(x, decimals)).collect::<Vec<_>>())
}

/// JSON for inside `<script type="application/json">`: `<`, `>` and `&` as `\u` escapes (so no
/// `</script>` or `<!--` can end or change the element), and U+2028 / U+2029 too (line ends to
/// old JavaScript parsers). These characters only ever occur inside JSON strings, where the
/// escapes mean the same.
pub fn script_json(v: &Value) -> String {
    let s = v.to_string();
    let mut out = String::with_capacity(s.len() + 64);
    for c in s.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Small helpers

/// HTML text and attribute escaping.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

fn obj(v: &Value) -> &Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    v.as_object().unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

fn non_empty(v: &Value) -> bool {
    !arr(v).is_empty()
}

fn list(v: &Value) -> String {
    let items: Vec<String> = arr(v).iter().map(|x| esc(str_of(x))).collect();
    if items.is_empty() { "none".into() } else { items.join(", ") }
}

fn int(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        _ => "–".into(),
    }
}

/// A number for a table: 3 significant-ish digits, "–" for null.
fn num(v: &Value) -> String {
    match v.as_f64() {
        None => "–".into(),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
    }
}

fn evidence_value(v: &Value) -> String {
    match v {
        Value::Number(_) => num(v),
        Value::String(s) => s.clone(),
        Value::Null => "–".into(),
        other => other.to_string(),
    }
}

/// Epoch seconds as `YYYY-MM-DD HH:MM:SS.mmm UTC`.
fn utc(v: &Value) -> String {
    let Some(t) = v.as_f64().filter(|t| t.is_finite()) else { return "–".into() };
    let ms_total = (t * 1000.0).round() as i64;
    let (secs, ms) = (ms_total.div_euclid(1000), ms_total.rem_euclid(1000));
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, mo, d) = civil_from_days(days);
    format!("{y:04}-{mo:02}-{d:02} {:02}:{:02}:{:02}.{ms:03} UTC", sod / 3600, sod % 3600 / 60, sod % 60)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn duration(v: &Value) -> String {
    let Some(s) = v.as_f64().filter(|s| s.is_finite()) else { return "–".into() };
    if s.abs() < 60.0 {
        return format!("{s:.2} s");
    }
    let whole = s.round() as i64;
    let (h, mi, se) = (whole / 3600, whole % 3600 / 60, whole % 60);
    if h > 0 { format!("{h} h {mi:02} min {se:02} s") } else { format!("{mi} min {se:02} s") }
}

/// A time as an offset from the job's start (`+1 min 02 s`).
fn offset(v: &Value, t0: f64) -> String {
    match v.as_f64() {
        Some(t) => format!("+{}", duration(&Value::from(t - t0))),
        None => "–".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(num(&Value::Null), "–");
        assert_eq!(num(&serde_json::json!(101.234)), "101");
        assert_eq!(num(&serde_json::json!(12.345)), "12.3");
        assert_eq!(num(&serde_json::json!(1.234)), "1.23");
        assert_eq!(utc(&serde_json::json!(1_700_000_000.25)), "2023-11-14 22:13:20.250 UTC");
        assert_eq!(utc(&serde_json::json!(0)), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(utc(&serde_json::json!(951_782_400)), "2000-02-29 00:00:00.000 UTC");
        assert_eq!(duration(&serde_json::json!(3723.4)), "1 h 02 min 03 s");
        assert_eq!(duration(&serde_json::json!(12.5)), "12.50 s");
        assert_eq!(duration(&serde_json::json!(75)), "1 min 15 s");
        assert_eq!(offset(&serde_json::json!(1_000_075.0), 1_000_000.0), "+1 min 15 s");
    }

    #[test]
    fn rounding_keeps_nulls_and_drops_non_finite() {
        assert_eq!(round_all(&serde_json::json!([1.26, null, 3]), 1), serde_json::json!([1.3, null, 3.0]));
        assert_eq!(round(f64::NAN, 2), Value::Null);
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
    fn an_empty_model_renders_a_whole_page() {
        let page = render(&ReportModel::default());
        assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
        assert!(page.contains("No steps were recorded") && page.contains("No system metrics were recorded"));
        let data = page.split("id=\"report-data\">").nth(1).unwrap().split("</script>").next().unwrap();
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["t0"], serde_json::json!(0.0));
    }
}
