//! The HTML page on synthetic models: hostile strings stay text, the largest model the series
//! bounds allow stays under the size goal, and (ignored, run by `scripts/test-browser`) the
//! fixture page the browser tier opens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use trainprof_report::model::ReportModel;
use trainprof_report::page::render;

/// Strings a trainer controls (function, file and window names) that would run script if a
/// renderer put them into the page as markup. Each sets `data-xss` on the body if it ever runs.
const HOSTILE_FN: &str = "</script><script>document.body.dataset.xss='fn'</script>";
const HOSTILE_FILE: &str = "\"><img src=x onerror=\"document.body.dataset.xss='file'\">";
const HOSTILE_WINDOW: &str = "<!--<svg onload=\"document.body.dataset.xss='window'\">\u{2028}&amp;";
/// A phase name (any `Profiler.record` caller picks one): it goes into a table and, through the
/// chart data, onto a chart's axis.
const HOSTILE_PHASE: &str = "<img src=x onerror=\"document.body.dataset.xss='phase'\">";

/// A small deterministic generator (xorshift64*), so the fixture is the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

const START: f64 = 1_700_000_000.0;

fn stats(rng: &mut Rng, base: f64, count: usize) -> Value {
    json!({"count": count, "p50_ms": base, "p90_ms": base * 1.2 + rng.next(), "p99_ms": base * 1.8,
           "max_ms": base * 10.0, "mean_ms": base * 1.05})
}

/// An hour of one node with `cores` cores and 8 GPUs, 8 ranks, every series at the contract's
/// bounds (2000 points per node, 4000 steps per rank), 50 outliers, all ten findings. Built as
/// the model's JSON (the documented shape) and read into `ReportModel`, so it checks that shape.
fn synthetic(cores: usize, points: usize, steps_per_rank: usize) -> ReportModel {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let duration = 3600.0;
    let ranks: Vec<String> = (0..8).map(|r| format!("{r}-algo-1")).collect();
    let mut steps = serde_json::Map::new();
    let mut step_series = serde_json::Map::new();
    for (mode, n, base) in [("TRAIN", steps_per_rank, 100.0), ("EVAL", steps_per_rank / 20, 40.0)] {
        let mut per_rank = serde_json::Map::new();
        let mut series = serde_json::Map::new();
        for (i, rank) in ranks.iter().enumerate() {
            let slow = if i == 5 { 1.5 } else { 1.0 };
            per_rank.insert(rank.clone(), stats(&mut rng, base * slow, n));
            let t_s: Vec<f64> = (0..n)
                .map(|k| START + 10.0 + k as f64 * (duration - 20.0) / n as f64 + rng.next() * 0.01)
                .collect();
            let ms: Vec<f64> = (0..n)
                .map(|k| base * slow * (0.9 + 0.2 * rng.next()) + if k % 997 == 0 { 900.0 } else { 0.0 })
                .collect();
            series.insert(rank.clone(), json!({"t_s": t_s, "ms": ms}));
        }
        let edges_ms: Vec<f64> = (0..=40).map(|k| k as f64 * base / 10.0).collect();
        let counts: Vec<u64> = (0..40).map(|k| ((20 - (k as i64 - 10).abs()).max(0) * 37) as u64).collect();
        let outliers: Vec<Value> = (0..50)
            .map(|k| {
                json!({"rank": ranks[k % 8], "step": k * 97, "start_s": START + 30.0 + k as f64 * 70.0,
                       "ms": 1000.0 - k as f64})
            })
            .collect();
        steps.insert(
            mode.to_string(),
            json!({
                "count": n * 8, "p50_ms": base, "p90_ms": base * 1.2, "p99_ms": base * 1.8,
                "max_ms": base * 10.0, "mean_ms": base * 1.05,
                "histogram": {"edges_ms": edges_ms, "counts": counts},
                "per_rank": per_rank,
                "stragglers": [{"rank": ranks[5], "p50_ms": base * 1.5, "median_rank_p50_ms": base, "ratio": 1.5}],
                "outliers": outliers,
                // The axis fits the bulk; the outliers (and the 900 ms steps) are above it.
                "chart": {"y_min_ms": 0.0, "y_max_ms": base * 1.8 * 1.5, "above": outliers, "above_count": 50 + 8 * (n / 997 + 1),
                          "warmup": if mode == "TRAIN" {
                              json!([{"rank": ranks[0], "steps": 3, "first_step": 0, "last_step": 2, "start_s": START + 10.0,
                                      "end_s": START + 12.5, "ms": 2500.0, "median_ms": base}])
                          } else { json!([]) }},
            }),
        );
        step_series.insert(mode.to_string(), Value::Object(series));
    }
    let t_s: Vec<f64> = (0..points).map(|k| START + k as f64 * duration / points as f64).collect();
    let mut pct = |lo: f64, hi: f64| -> Value {
        Value::from(
            (0..points)
                .map(|k| if k == 700 { Value::Null } else { json!(lo + (hi - lo) * rng.next()) })
                .collect::<Vec<_>>(),
        )
    };
    let cpu_cores: Vec<Value> = (0..cores).map(|c| pct(c as f64 % 50.0, 100.0)).collect();
    let mut gpus = serde_json::Map::new();
    for g in 0..8 {
        gpus.insert(format!("gpu{g}"), json!({"util": pct(60.0, 99.9), "mem": pct(30.0, 31.0)}));
    }
    let node = json!({
        "t_s": t_s,
        "cpu_total": pct(20.0, 80.0),
        "cpu_cores": cpu_cores,
        "memory": pct(40.0, 42.0),
        "gpus": gpus,
        "io": {"read_mbps": pct(0.0, 900.0), "write_mbps": pct(0.0, 90.0)},
        "net": {"rx_mbps": pct(0.0, 1200.0), "tx_mbps": pct(0.0, 1200.0)},
        "trainer": {"cpu": pct(100.0, 800.0), "mem_mb": pct(20_000.0, 21_000.0)},
    });
    let rules = trainprof_report::rules::RULES;
    let findings: Vec<Value> = rules
        .iter()
        .enumerate()
        .map(|(i, rule)| {
            let triggered = i % 3 == 0;
            let ranges: Vec<[f64; 2]> = if triggered {
                vec![[START + 600.0 + i as f64 * 100.0, START + 660.0 + i as f64 * 100.0]]
            } else {
                vec![]
            };
            json!({
                "rule": rule, "triggered": triggered, "evaluated": i != 4,
                "summary": format!("{rule}: synthetic summary with a <tag> & an ampersand"),
                "advice": if triggered { "Do the synthetic thing." } else { "" },
                "evidence": evidence(rule, i as f64),
                "ranges": ranges,
            })
        })
        .collect();
    let functions: Vec<Value> = (0..20u64)
        .map(|k| {
            json!({
                "name": if k == 0 { HOSTILE_FN.to_string() } else { format!("function_{k}") },
                "file": if k == 0 { HOSTILE_FILE } else { "train.py" },
                "line": 10 + k, "calls": 100 * (k + 1),
                "self_s": 0.5 / (k + 1) as f64, "total_s": 2.0 / (k + 1) as f64,
            })
        })
        .collect();
    let python: Vec<Value> = (0..2)
        .map(|w| {
            json!({
                "node": ranks[w],
                "window": if w == 0 { HOSTILE_WINDOW } else { "stepstart-10_stepend-12" },
                "profiler": if w == 0 { "cprofile" } else { "pyinstrument" },
                "start_step": 10, "end_step": 12, "functions": functions,
            })
        })
        .collect();
    let phases: Vec<Value> = ["Forward", "Backward", HOSTILE_PHASE, "Step:ModeKeys.TRAIN"]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            json!({"name": p, "count": 1000, "total_ms": 50_000.0 / (i + 1) as f64, "mean_ms": 50.0 / (i + 1) as f64})
        })
        .collect();
    let triggers: Vec<Value> = (0..5)
        .map(|k| {
            json!({"rank": ranks[k], "step": 100 + k, "ms": 1010.0, "median_ms": 100.0,
                   "start_s": START + 1000.0 + k as f64 * 300.0, "features": ["detailed", "native"]})
        })
        .collect();
    let model = json!({
        "version": 1,
        "source": "/data/run <one>",
        "job": {
            "start_s": START, "end_s": START + duration, "duration_s": duration,
            "nodes": ["algo-1"], "ranks": ranks, "init_s": 10.0,
            "steps_per_mode": {"TRAIN": steps_per_rank * 8, "EVAL": steps_per_rank / 20 * 8},
            "profiled": {"detailed_steps": 10, "dataloader_events": 120, "python_windows": 2},
            "dropped_events": 3,
            "clock": [{"node": "algo-1", "state": "synchronised", "synchronised": true, "readings": 60,
                       "unsynchronised_readings": 0, "max_error_us": 1000.0, "est_error_us": null}],
        },
        "steps": steps,
        "phases": phases,
        "python": python,
        "triggers": triggers,
        "findings": findings,
        "series": {"steps": step_series, "nodes": {"algo-1": node}},
    });
    serde_json::from_value(model).expect("the synthetic model has the documented shape")
}

/// Each rule's evidence in the shape docs/report.md gives (a GPU name from the trainer's files
/// is hostile: it reaches the evidence tables).
fn evidence(rule: &str, x: f64) -> Value {
    let gpu = |node: &str, gpu: &str| json!({"node": node, "gpu": gpu});
    let with = |mut a: Value, b: Value| {
        a.as_object_mut().unwrap().extend(b.as_object().unwrap().clone());
        a
    };
    let node = json!({"datapoints": 36000, "bottlenecks": 20000 + x as u64, "percent": 55.5, "low_gpu_datapoints": 21000,
        "windows_judged": 60, "windows_triggered": 3, "triggered_windows": [[START + 60.0, START + 240.0]],
        "triggered": true});
    match rule {
        "CPUBottleneck" => json!({"threshold_percent": 50, "gpu_threshold": 10.0, "cpu_threshold": 90.0,
            "patience": 1000, "nodes": {"algo-1": node}}),
        "IOBottleneck" => json!({"threshold_percent": 50, "gpu_threshold": 10.0, "io_threshold": 50.0,
            "patience": 1000, "nodes": {"algo-1": node}}),
        "LowGPUUtilization" => {
            json!({"threshold_p95": 70.0, "threshold_p5": 10.0, "window": 500, "patience": 1000,
            "gpus": [with(gpu("algo-1", HOSTILE_PHASE), json!({"datapoints": 36000, "windows_judged": 60,
                "windows_triggered": 2, "issue": "underutilized", "window_p95": 40.5, "window_p5": 3.0,
                "p50": 30.0, "p95": 45.0, "max": 99.0}))]})
        }
        "GPUMemoryIncrease" => json!({"increase": 5.0, "window": 10, "patience": 1000,
            "gpus": [with(gpu("algo-1", "gpu0"), json!({"datapoints": 36000, "max_increase": 6.5,
                "at_s": START + 700.0, "violations": 4, "p50": 30.0, "max": 91.0}))]}),
        "GPUMemoryLeak" => json!({"min_growth_bytes": 1048576, "min_step_starts": 4, "devices_judged": 1,
            "leaks": [{"node": "0-algo-1", "file": "framework/memory/algo-1/window-0-1.pickle", "device": 0,
                "first_step": 10, "last_step": 14, "growth_bytes": 41943040, "per_step_bytes": 10485760,
                "site": format!("train.py:42 {HOSTILE_PHASE}")}]}),
        "BatchSize" => {
            json!({"cpu_threshold_p95": 70.0, "gpu_threshold_p95": 70.0, "gpu_memory_threshold_p95": 70.0,
            "window": 500, "patience": 1000,
            "gpus": [with(gpu("algo-1", "gpu1"), json!({"windows_judged": 60, "windows_triggered": 0,
                "cpu_p95": null, "gpu_p95": null, "gpu_memory_p95": null, "job_cpu_p95": 80.0,
                "job_gpu_p95": 99.0, "job_gpu_memory_p95": 31.0}))]})
        }
        "StepOutlier" => json!({"stddev": 3.0, "n_outliers": 10, "min_steps": 100,
            "ranks": [{"rank": "5-algo-1", "mode": "TRAIN", "steps": 4000, "threshold_ms": 180.25, "outliers": 12,
                "outlier_steps": [0, 997, 1994, 2991], "triggered": true}]}),
        "Dataloader" => json!({"min_threshold": 70, "max_threshold": 200, "patience": 10, "cores": 16,
            "parallel_dataloaders_median": 2.0, "seconds_with_dataloading": 120, "events": 120, "num_workers": 2,
            "pin_memory": false, "dataloading_time_s": {"p25": 0.01, "p50": 0.02, "p95": 0.2}}),
        "MaxInitializationTime" => json!({"threshold_minutes": 20.0, "init_s": 10.0}),
        "LoadBalancing" => json!({"threshold": 0.2, "patience": 1000, "pairs_compared": 28,
            "pairs": [{"node": "algo-1", "gpus": ["gpu0", "gpu5"], "distance": 0.31, "triggered": true}]}),
        "OverallSystemUsage" => {
            let q = json!({"p50": 50.0, "p95": 90.0 + x, "p99": 99.0, "max": 100.0});
            json!({"nodes": {"algo-1": {"cpu": q, "memory": q, "gpu0_util": q, "gpu0_memory": q,
                "datapoints": 36000, "cores": 16}}})
        }
        other => panic!("no evidence for {other}"),
    }
}

fn page_data(page: &str) -> Value {
    let data = page.split("<script type=\"application/json\" id=\"report-data\">").nth(1).unwrap();
    serde_json::from_str(data.split("</script>").next().unwrap()).unwrap()
}

#[test]
fn hostile_names_stay_text() {
    let page = render(&synthetic(4, 50, 40));
    // Exactly our three script elements (data, uPlot, the page's), no element from the data.
    assert_eq!(page.matches("<script").count(), 3);
    for bad in ["<img", "<svg", "<script>document", "<tag>"] {
        assert!(!page.contains(bad), "page contains {bad}");
    }
    // The strings are there, escaped, where people read them.
    assert!(
        page.contains("&lt;/script&gt;&lt;script&gt;document.body.dataset.xss=&#39;fn&#39;&lt;/script&gt;")
    );
    assert!(page.contains("&quot;&gt;&lt;img src=x onerror=&quot;"));
    assert!(page.contains("&lt;!--&lt;svg onload="));
    assert!(page.contains("/data/run &lt;one&gt;"));
    assert!(page.contains(
        "<td>&lt;img src=x onerror=&quot;document.body.dataset.xss=&#39;phase&#39;&quot;&gt;</td>"
    ));
    // The chart data reads back intact, the hostile phase name included.
    let data = page_data(&page);
    assert!(data["modes"].as_array().unwrap().len() == 2);
    assert_eq!(data["phases"][2]["name"], HOSTILE_PHASE);
}

#[test]
fn an_hour_of_8_gpus_at_the_series_bounds_stays_under_3_mb() {
    // 96 cores: the most a single 8-GPU instance has (p4d / p5).
    let model = synthetic(96, 2000, 4000);
    let page = render(&model);
    let mb = page.len() as f64 / 1e6;
    println!("page size: {mb:.2} MB");
    assert!(page.len() < 3_000_000, "page is {mb:.2} MB");
    // Nothing was dropped to get there: every point of every series is in the chart data.
    let data = page_data(&page);
    let node = &data["nodes"][0];
    assert_eq!(node["t"].as_array().unwrap().len(), 2000);
    assert_eq!(node["cores"].as_array().unwrap().len(), 96);
    assert_eq!(node["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(node["cpu"][700], Value::Null, "a missing sample stays null");
    let train = &data["modes"][1];
    assert_eq!(train["mode"], "TRAIN");
    assert_eq!(train["ranks"].as_array().unwrap().len(), 8);
    assert_eq!(train["ranks"][7]["ms"].as_array().unwrap().len(), 4000);
    assert_eq!(train["outliers"].as_array().unwrap().len(), 50);
    // Outliers, triggers and the triggered findings' ranges are shaded.
    // And the warm-up of TRAIN's rank 0.
    assert_eq!(data["bands"].as_array().unwrap().len(), 50 + 50 + 5 + 4 + 1);
    assert_eq!(train["y"], json!([0.0, 270.0]));
    assert_eq!(train["above"].as_array().unwrap().len(), 50);
}

#[test]
fn every_section_is_there() {
    let page = render(&synthetic(4, 50, 40));
    for id in ["job", "steps", "system", "framework", "findings", "triggers"] {
        assert!(page.contains(&format!("<section id=\"{id}\">")), "no section {id}");
    }
    assert_eq!(page.matches("<div class=\"finding").count(), 11);
    assert_eq!(page.matches("<div class=\"finding triggered\">").count(), 4);
    assert_eq!(page.matches("<span class=\"badge\">not evaluated</span>").count(), 1);
    assert!(page.contains("<b>Straggler: 5-algo-1</b>"));
    assert!(page.contains("2023-11-14 22:13:20.000 UTC"));
    assert!(page.contains("1 h 00 min 00 s"));
    // Each trigger names what it opened.
    assert_eq!(
        page.matches("<td><a href=\"#detailed\">detailed</a>, <a href=\"#native\">native</a></td>").count(),
        5,
        "{page}"
    );
    // Each finding's evidence is its rule's table: settings, then rows (the hostile GPU name
    // as text).
    assert_eq!(page.matches("<table class=\"evidence\">").count(), 10);
    assert_eq!(page.matches("<table class=\"evidence-rows\">").count(), 9);
    assert!(page.contains(
        "<tr><td>algo-1</td><td>&lt;img src=x onerror=&quot;document.body.dataset.xss=&#39;phase&#39;&quot;&gt;</td><td class=\"n\">36000</td>"
    ));
    assert!(page.contains(
        "<tr><td>algo-1</td><td>gpu0 / gpu5</td><td class=\"n\">0.31</td><td class=\"n\">yes</td></tr>"
    ));
}

/// Writes the browser tier's fixture page: `REPORT_PAGE_OUT=x.html cargo test -p
/// trainprof-report --test page -- --ignored write_fixture_page`; with `REPORT_PAGE_SIZE=max`
/// the size test's model (96 cores, every series at its bound) instead.
#[test]
#[ignore]
fn write_fixture_page() {
    let out = std::env::var("REPORT_PAGE_OUT").expect("REPORT_PAGE_OUT: where to write the page");
    let model = match std::env::var("REPORT_PAGE_SIZE").as_deref() {
        Ok("max") => synthetic(96, 2000, 4000),
        _ => synthetic(16, 2000, 1500),
    };
    std::fs::write(&out, render(&model)).unwrap();
}
