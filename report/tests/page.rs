//! The HTML page on synthetic models: hostile strings stay text, the largest model the series
//! bounds allow stays under the size goal, and (ignored, run by `scripts/test-browser`) the
//! fixture page the browser tier opens.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use trainprof_report::html::render;
use trainprof_report::model::*;

/// Strings a trainer controls (function, file and window names) that would run script if a
/// renderer put them into the page as markup. Each sets `data-xss` on the body if it ever runs.
const HOSTILE_FN: &str = "</script><script>document.body.dataset.xss='fn'</script>";
const HOSTILE_FILE: &str = "\"><img src=x onerror=\"document.body.dataset.xss='file'\">";
const HOSTILE_WINDOW: &str = "<!--<svg onload=\"document.body.dataset.xss='window'\">\u{2028}&amp;";

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

fn stats(rng: &mut Rng, base: f64, count: u64) -> StepStats {
    StepStats {
        count,
        p50_ms: Some(base),
        p90_ms: Some(base * 1.2 + rng.next()),
        p99_ms: Some(base * 1.8),
        max_ms: Some(base * 10.0),
        mean_ms: Some(base * 1.05),
    }
}

/// An hour of one node with `cores` cores and 8 GPUs, 8 ranks, every series at the contract's
/// bounds (2000 points per node, 4000 steps per rank), 50 outliers, all ten findings.
fn synthetic(cores: usize, points: usize, steps_per_rank: usize) -> ReportModel {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let duration = 3600.0;
    let ranks: Vec<String> = (0..8).map(|r| format!("{r}-algo-1")).collect();
    let mut steps = BTreeMap::new();
    let mut step_series = BTreeMap::new();
    for (mode, n, base) in [("TRAIN", steps_per_rank, 100.0), ("EVAL", steps_per_rank / 20, 40.0)] {
        let mut per_rank = BTreeMap::new();
        let mut series = BTreeMap::new();
        for (i, rank) in ranks.iter().enumerate() {
            let slow = if i == 5 { 1.5 } else { 1.0 };
            per_rank.insert(rank.clone(), stats(&mut rng, base * slow, n as u64));
            let t_s: Vec<f64> =
                (0..n).map(|k| START + 10.0 + k as f64 * (duration - 20.0) / n as f64 + rng.next() * 0.01).collect();
            let ms: Vec<f64> = (0..n)
                .map(|k| base * slow * (0.9 + 0.2 * rng.next()) + if k % 997 == 0 { 900.0 } else { 0.0 })
                .collect();
            series.insert(rank.clone(), StepSeries { t_s, ms });
        }
        let edges_ms: Vec<f64> = (0..=40).map(|k| k as f64 * base / 10.0).collect();
        let counts: Vec<u64> = (0..40).map(|k| ((20 - (k as i64 - 10).abs()).max(0) * 37) as u64).collect();
        let outliers = (0..50)
            .map(|k| Outlier {
                rank: ranks[k % 8].clone(),
                step: (k * 97) as u64,
                start_s: START + 30.0 + k as f64 * 70.0,
                ms: 1000.0 - k as f64,
            })
            .collect();
        steps.insert(
            mode.to_string(),
            ModeSteps {
                count: (n * 8) as u64,
                p50_ms: Some(base),
                p90_ms: Some(base * 1.2),
                p99_ms: Some(base * 1.8),
                max_ms: Some(base * 10.0),
                mean_ms: Some(base * 1.05),
                histogram: Histogram { edges_ms, counts },
                per_rank,
                stragglers: vec![Straggler {
                    rank: ranks[5].clone(),
                    p50_ms: Some(base * 1.5),
                    median_rank_p50_ms: Some(base),
                    ratio: Some(1.5),
                }],
                outliers,
            },
        );
        step_series.insert(mode.to_string(), series);
    }
    let t_s: Vec<f64> = (0..points).map(|k| START + k as f64 * duration / points as f64).collect();
    let mut pct = |lo: f64, hi: f64| -> Vec<Option<f64>> {
        (0..points).map(|k| if k == 700 { None } else { Some(lo + (hi - lo) * rng.next()) }).collect()
    };
    let cpu_cores: Vec<Vec<Option<f64>>> = (0..cores).map(|c| pct(c as f64 % 50.0, 100.0)).collect();
    let gpus = (0..8).map(|g| (format!("gpu{g}"), GpuSeries { util: pct(60.0, 99.9), mem: pct(30.0, 31.0) })).collect();
    let node = NodeSeries {
        cpu_total: pct(20.0, 80.0),
        memory: pct(40.0, 42.0),
        cpu_cores,
        gpus,
        io: Some(IoSeries { read_mbps: pct(0.0, 900.0), write_mbps: pct(0.0, 90.0) }),
        net: Some(NetSeries { rx_mbps: pct(0.0, 1200.0), tx_mbps: pct(0.0, 1200.0) }),
        trainer: Some(TrainerSeries { cpu: pct(100.0, 800.0), mem_mb: pct(20_000.0, 21_000.0) }),
        t_s,
    };
    let rules = [
        "CPUBottleneck",
        "IOBottleneck",
        "LowGPUUtilization",
        "GPUMemoryIncrease",
        "BatchSize",
        "StepOutlier",
        "Dataloader",
        "MaxInitializationTime",
        "LoadBalancing",
        "OverallSystemUsage",
    ];
    let findings = rules
        .iter()
        .enumerate()
        .map(|(i, rule)| {
            let triggered = i % 3 == 0;
            let mut evidence = serde_json::Map::new();
            evidence.insert("threshold".into(), json!(90));
            evidence.insert("value".into(), json!(91.5 + i as f64));
            evidence.insert("worst_rank".into(), json!("5-algo-1"));
            Finding {
                rule: rule.to_string(),
                triggered,
                evaluated: i != 4,
                summary: format!("{rule}: synthetic summary with a <tag> & an ampersand"),
                advice: if triggered { "Do the synthetic thing.".into() } else { String::new() },
                evidence,
                ranges: if triggered {
                    vec![[START + 600.0 + i as f64 * 100.0, START + 660.0 + i as f64 * 100.0]]
                } else {
                    vec![]
                },
            }
        })
        .collect();
    let functions = (0..20)
        .map(|k| PythonFunction {
            name: if k == 0 { HOSTILE_FN.into() } else { format!("function_{k}") },
            file: if k == 0 { HOSTILE_FILE.into() } else { "train.py".into() },
            line: Some(10 + k),
            calls: Some(100 * (k + 1)),
            self_s: Some(0.5 / (k + 1) as f64),
            total_s: Some(2.0 / (k + 1) as f64),
        })
        .collect::<Vec<_>>();
    let python = (0..2)
        .map(|w| PythonWindow {
            node: ranks[w].clone(),
            window: if w == 0 { HOSTILE_WINDOW.into() } else { "stepstart-10_stepend-12".into() },
            profiler: if w == 0 { "cprofile".into() } else { "pyinstrument".into() },
            start_step: Some(10),
            end_step: Some(12),
            functions: functions.clone(),
        })
        .collect();
    ReportModel {
        version: 1,
        source: "/data/run <one>".into(),
        job: Job {
            start_s: Some(START),
            end_s: Some(START + duration),
            duration_s: Some(duration),
            nodes: vec!["algo-1".into()],
            ranks: ranks.clone(),
            init_s: Some(10.0),
            steps_per_mode: [("TRAIN".into(), (steps_per_rank * 8) as u64), ("EVAL".into(), (steps_per_rank / 20 * 8) as u64)]
                .into(),
            profiled: Profiled { detailed_steps: 10, dataloader_events: 120, python_windows: 2 },
            dropped_events: 3,
            clock: vec![Clock { node: "algo-1".into(), synchronised: true, max_error_us: Some(1000.0), est_error_us: None }],
        },
        steps,
        phases: ["Forward", "Backward", "DataLoader", "Step:ModeKeys.TRAIN"]
            .iter()
            .enumerate()
            .map(|(i, p)| Phase {
                name: p.to_string(),
                count: 1000,
                total_ms: 50_000.0 / (i + 1) as f64,
                mean_ms: Some(50.0 / (i + 1) as f64),
            })
            .collect(),
        python,
        triggers: (0..5)
            .map(|k| Trigger {
                rank: ranks[k].clone(),
                step: 100 + k as u64,
                ms: 1010.0,
                median_ms: Some(100.0),
                start_s: START + 1000.0 + k as f64 * 300.0,
            })
            .collect(),
        findings,
        series: Some(Series { steps: step_series, nodes: [("algo-1".to_string(), node)].into() }),
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
    assert!(page.contains("&lt;/script&gt;&lt;script&gt;document.body.dataset.xss=&#39;fn&#39;&lt;/script&gt;"));
    assert!(page.contains("&quot;&gt;&lt;img src=x onerror=&quot;"));
    assert!(page.contains("&lt;!--&lt;svg onload="));
    assert!(page.contains("/data/run &lt;one&gt;"));
    // The chart data holds no raw markup characters and reads back intact.
    let data = page_data(&page);
    assert!(data["modes"].as_array().unwrap().len() == 2);
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
    assert_eq!(data["bands"].as_array().unwrap().len(), 50 + 50 + 5 + 4);
}

#[test]
fn every_section_is_there() {
    let page = render(&synthetic(4, 50, 40));
    for id in ["job", "steps", "system", "framework", "findings", "triggers"] {
        assert!(page.contains(&format!("<section id=\"{id}\">")), "no section {id}");
    }
    assert_eq!(page.matches("<div class=\"finding").count(), 10);
    assert_eq!(page.matches("<div class=\"finding triggered\">").count(), 4);
    assert_eq!(page.matches("not evaluated: no data").count(), 1);
    assert!(page.contains("<b>Straggler: 5-algo-1</b>"));
    assert!(page.contains("2023-11-14 22:13:20.000 UTC"));
    assert!(page.contains("1 h 00 min 00 s"));
}

/// Writes the browser tier's fixture page: `REPORT_PAGE_OUT=/tmp/x.html cargo test -p
/// trainprof-report --test page -- --ignored write_fixture_page`.
#[test]
#[ignore]
fn write_fixture_page() {
    let out = std::env::var("REPORT_PAGE_OUT").expect("REPORT_PAGE_OUT: where to write the page");
    std::fs::write(&out, render(&synthetic(16, 2000, 1500))).unwrap();
}
