//! The ten findings: what each of SageMaker Debugger's built-in profiler rules checks, with
//! its default thresholds, computed over the whole job at once (`docs/report.md`,
//! "Findings" says how each differs from the SageMaker rule).

use serde_json::{Value, json};

use crate::collect::{
    Agg, BATCH_WINDOW, CPU_HIGH, GPU_LOW, IO_HIGH, LOW_P5 as P5_LOW, LOW_P95 as P95_LOW, MEM_INCREASE,
    StepRec,
};
use crate::model::{Finding, RULES};
use crate::stats::{js_distance, mean, quantile_sorted, sorted, std};

/// What to read and how to judge.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Datapoints a system-metric rule needs before it judges (SageMaker's `patience`:
    /// 1000 for the system rules, 10 seconds of dataloader events for Dataloader). `Some(n)`
    /// lowers both to at most `n` (for short jobs and tests).
    pub patience: Option<u64>,
    /// Files (paths relative to the LocalPath) left out: `trainprof run` reports on its own
    /// job only, not on an earlier one's files beside it.
    pub leave_out: std::collections::HashSet<String>,
}

/// SageMaker's Dataloader `patience`: seconds with dataloader events.
pub const DATALOADER_PATIENCE: u64 = 10;

fn dataloader_patience(agg: &Agg) -> u64 {
    agg.patience.map_or(DATALOADER_PATIENCE, |p| p.min(DATALOADER_PATIENCE))
}

/// StepOutlier: SageMaker's defaults.
pub const STEP_STDDEV: f64 = 3.0;
pub const STEP_N_OUTLIERS: usize = 10;
pub const STEP_MIN_STEPS: usize = 100;
/// MaxInitializationTime: 20 minutes.
pub const MAX_INIT_S: f64 = 20.0 * 60.0;
/// LoadBalancing's distance threshold.
const LOAD_THRESHOLD: f64 = 0.2;
/// LoadBalancing's pairs listed in its evidence (the largest distances when there are more;
/// at most `MAX_GPUS_PER_NODE` GPUs a node are compared, `docs/report.md`, "Caps").
pub const MAX_PAIRS_LISTED: usize = 100;

fn finding(
    rule: &str,
    triggered: bool,
    evaluated: bool,
    summary: String,
    advice: &str,
    evidence: Value,
) -> Finding {
    Finding {
        rule: rule.to_owned(),
        triggered: triggered && evaluated,
        evaluated,
        summary,
        advice: if triggered && evaluated { advice.to_owned() } else { String::new() },
        evidence,
        ranges: Vec::new(),
    }
}

fn r2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// Every finding, in `RULES` order; `agg` must be finished ([`Agg::finish`]).
pub fn all(agg: &Agg, job_start_s: Option<f64>) -> Vec<Finding> {
    let out = vec![
        bottleneck(agg, false),
        bottleneck(agg, true),
        low_gpu(agg),
        gpu_memory(agg),
        batch_size(agg),
        step_outlier(agg),
        dataloader(agg),
        max_init(agg, job_start_s),
        load_balancing(agg),
        overall(agg),
    ];
    debug_assert!(out.iter().map(|f| f.rule.as_str()).eq(RULES));
    out
}

/// CPUBottleneck (`io = false`) and IOBottleneck (`io = true`): judged every 60 s of data
/// once a node has more than `patience` ticks: the share of its ticks so far where a GPU is
/// below 10 % while a core is above 90 % busy (a core's I/O wait above 50 %) exceeds 50 %.
fn bottleneck(agg: &Agg, io: bool) -> Finding {
    let rule = if io { "IOBottleneck" } else { "CPUBottleneck" };
    let patience = agg.system_patience();
    let mut per_node = serde_json::Map::new();
    let mut triggered = false;
    let mut evaluated = false;
    let mut ranges = Vec::new();
    let mut worst: Option<(String, f64)> = None;
    for (name, n) in &agg.nodes {
        if n.gpus.is_empty() {
            continue;
        }
        let (b, v) = if io { (&n.io_bottleneck, &n.io_verdict) } else { (&n.cpu_bottleneck, &n.cpu_verdict) };
        let pct = if n.ticks > 0 { b.count as f64 * 100.0 / n.ticks as f64 } else { 0.0 };
        evaluated |= v.evaluations > 0;
        let hit = v.hits > 0;
        triggered |= hit;
        if hit {
            ranges.extend(b.ranges.iter().copied());
        }
        if worst.as_ref().is_none_or(|w| pct > w.1) {
            worst = Some((name.clone(), pct));
        }
        per_node.insert(
            name.clone(),
            json!({"datapoints": n.ticks, "bottlenecks": b.count, "percent": r2(pct),
                   "low_gpu_datapoints": n.low_gpu_ticks, "windows_judged": v.evaluations,
                   "windows_triggered": v.hits, "triggered_windows": v.windows.ranges, "triggered": hit}),
        );
    }
    let what =
        if io { format!("I/O wait above {IO_HIGH} %") } else { format!("a CPU core above {CPU_HIGH} %") };
    let evidence = json!({"threshold_percent": 50, "gpu_threshold": GPU_LOW,
        if io { "io_threshold" } else { "cpu_threshold" }: if io { IO_HIGH } else { CPU_HIGH },
        "patience": patience, "nodes": per_node});
    let summary = match (&worst, evaluated) {
        (None, _) => "No GPU metrics: the rule needs GPU utilisation.".to_owned(),
        (Some(_), false) => {
            format!("Too few system datapoints to judge (the rule waits for more than {patience}).")
        }
        (Some((node, pct)), true) => format!(
            "On {node}, {pct:.1} % of the datapoints had a GPU below {GPU_LOW} % while {what} (threshold: more than 50 % at any minute)."
        ),
    };
    let advice = if io {
        "The GPUs wait for data from disk. Read the data set from faster storage (local NVMe, a page-cached copy), prefetch more, or use larger files read sequentially."
    } else {
        "The GPUs wait for the CPU. Move preprocessing out of the training loop: more data-loader workers, preprocessing once ahead of time, or on the GPU."
    };
    let mut f = finding(rule, triggered, evaluated, summary, advice, evidence);
    f.ranges = ranges;
    f
}

/// LowGPUUtilization: judged every 60 s of data once a GPU has more than `patience`
/// values: the p95 of its last 500 values below 70 % (underused), or above 70 % with the p5
/// below 10 % (fluctuating).
fn low_gpu(agg: &Agg) -> Finding {
    let patience = agg.system_patience();
    let mut gpus = Vec::new();
    let mut evaluated = false;
    let mut hits = Vec::new();
    let mut ranges = Vec::new();
    for (node, n) in &agg.nodes {
        for (gpu, g) in &n.gpus {
            if g.util.is_empty() {
                continue;
            }
            evaluated |= g.low.evaluations > 0;
            if let Some((kind, p95, p5)) = g.low_hit {
                hits.push(format!(
                    "{gpu} on {node} is {kind} (p95 {p95:.1} %, p5 {p5:.1} % of the last {} values)",
                    crate::collect::GPU_WINDOW
                ));
                ranges.extend(g.low.windows.ranges.iter().copied());
            }
            gpus.push(json!({"node": node, "gpu": gpu, "datapoints": g.util.len(),
                "windows_judged": g.low.evaluations, "windows_triggered": g.low.hits,
                "issue": g.low_hit.map(|h| h.0), "window_p95": g.low_hit.map(|h| r2(h.1)), "window_p5": g.low_hit.map(|h| r2(h.2)),
                "p50": g.util.quantile(0.5), "p95": g.util.quantile(0.95), "max": g.util.max()}));
        }
    }
    let summary = if gpus.is_empty() {
        "No GPU metrics.".to_owned()
    } else if !evaluated {
        format!("Too few GPU datapoints to judge (the rule waits for more than {patience}).")
    } else if hits.is_empty() {
        "Every GPU was well used.".to_owned()
    } else {
        format!("{}.", hits.join("; "))
    };
    let mut f = finding(
        "LowGPUUtilization",
        !hits.is_empty(),
        evaluated,
        summary,
        "Give the GPUs more work per step (a larger batch), or find what they wait for (data loading, CPU preprocessing, synchronisation); an unused GPU can be left out of the instance type.",
        json!({"threshold_p95": P95_LOW, "threshold_p5": P5_LOW, "window": crate::collect::GPU_WINDOW,
               "patience": patience, "gpus": gpus}),
    );
    f.ranges = ranges;
    f
}

/// GPUMemoryIncrease: the moving average of GPU memory rising by more than 5 points.
fn gpu_memory(agg: &Agg) -> Finding {
    let patience = agg.system_patience();
    let mut gpus = Vec::new();
    let mut evaluated = false;
    let mut triggered = false;
    let mut ranges = Vec::new();
    let mut worst: Option<(String, String, f64)> = None;
    for (node, n) in &agg.nodes {
        for (gpu, g) in &n.gpus {
            if g.mem.is_empty() {
                continue;
            }
            evaluated |= g.mem_n > patience;
            let hit = g.mem_increases.count > 0;
            triggered |= hit;
            if hit {
                ranges.extend(g.mem_increases.ranges.iter().copied());
            }
            let inc = g.max_increase.map(|m| m.0);
            if let Some(i) = inc
                && worst.as_ref().is_none_or(|w| i > w.2)
            {
                worst = Some((node.clone(), gpu.clone(), i));
            }
            gpus.push(json!({"node": node, "gpu": gpu, "datapoints": g.mem_n,
                "max_increase": inc.map(r2), "at_s": g.max_increase.map(|m| m.1),
                "violations": g.mem_increases.count, "p50": g.mem.quantile(0.5), "max": g.mem.max()}));
        }
    }
    let summary = match (&worst, evaluated) {
        _ if gpus.is_empty() => "No GPU memory metrics.".to_owned(),
        (_, false) => {
            format!("Too few GPU memory datapoints to judge (the rule waits for more than {patience}).")
        }
        (Some((node, gpu, inc)), true) if triggered => format!(
            "GPU memory of {gpu} on {node} grew: its moving average rose by up to {inc:.1} points (threshold {MEM_INCREASE})."
        ),
        _ => "GPU memory stayed level.".to_owned(),
    };
    let mut f = finding(
        "GPUMemoryIncrease",
        triggered,
        evaluated,
        summary,
        "Memory that keeps growing ends in an out-of-memory error: look for tensors kept across steps (losses appended with their graph, caches), and check the batch size.",
        json!({"increase": MEM_INCREASE, "window": crate::collect::MEM_WINDOW, "patience": patience, "gpus": gpus}),
    );
    f.ranges = ranges;
    f
}

/// BatchSize: judged every 60 s of data once a node has more than 500 and more than
/// `patience` CPU values: over the last 500 values, the CPU p95 (all cores), a GPU's
/// utilisation p95 and its memory p95 all below 70 %: the batch could be larger.
fn batch_size(agg: &Agg) -> Finding {
    let patience = agg.system_patience();
    let mut rows = Vec::new();
    let mut evaluated = false;
    let mut hits = Vec::new();
    let mut ranges = Vec::new();
    for (node, n) in &agg.nodes {
        for (gpu, g) in &n.gpus {
            evaluated |= g.batch.evaluations > 0;
            if let Some((c, u, m)) = g.batch_hit {
                hits.push(format!(
                    "{gpu} on {node} (CPU p95 {c:.1} %, GPU p95 {u:.1} %, GPU memory p95 {m:.1} %)"
                ));
                ranges.extend(g.batch.windows.ranges.iter().copied());
            }
            rows.push(json!({"node": node, "gpu": gpu, "windows_judged": g.batch.evaluations,
                "windows_triggered": g.batch.hits,
                "cpu_p95": g.batch_hit.map(|h| r2(h.0)), "gpu_p95": g.batch_hit.map(|h| r2(h.1)),
                "gpu_memory_p95": g.batch_hit.map(|h| r2(h.2)),
                "job_cpu_p95": n.cpu_total.quantile(0.95), "job_gpu_p95": g.util.quantile(0.95),
                "job_gpu_memory_p95": g.mem.quantile(0.95)}));
        }
    }
    let need = (BATCH_WINDOW as u64).max(patience);
    let summary = if rows.is_empty() {
        "No GPU metrics.".to_owned()
    } else if !evaluated {
        format!("Too few datapoints to judge (the rule waits for more than {need}).")
    } else if hits.is_empty() {
        "At least one of CPU, GPU and GPU memory was busy (p95 ≥ 70 %) in every window.".to_owned()
    } else {
        format!(
            "CPU, GPU and GPU memory all stayed below 70 % (p95 of the last {BATCH_WINDOW} values) for {}.",
            hits.join("; ")
        )
    };
    let mut f = finding(
        "BatchSize",
        !hits.is_empty(),
        evaluated,
        summary,
        "The machine has room to spare: try a larger batch size (scale the learning rate with it), or a smaller instance.",
        json!({"cpu_threshold_p95": P95_LOW, "gpu_threshold_p95": P95_LOW, "gpu_memory_threshold_p95": P95_LOW,
               "window": BATCH_WINDOW, "patience": patience, "gpus": rows}),
    );
    f.ranges = ranges;
    f
}

/// The steps of one rank and mode longer than mean + 3σ.
pub fn step_outliers(steps: &[StepRec]) -> (f64, Vec<StepRec>) {
    let ms: Vec<f64> = steps.iter().map(|s| s.dur_us as f64 / 1000.0).collect();
    let (Some(m), Some(sd)) = (mean(&ms), std(&ms)) else { return (f64::NAN, Vec::new()) };
    let threshold = m + STEP_STDDEV * sd;
    (threshold, steps.iter().filter(|s| s.dur_us as f64 / 1000.0 > threshold).copied().collect())
}

/// StepOutlier: per rank and mode with more than 100 steps, more than 10 steps longer than
/// mean + 3σ.
fn step_outlier(agg: &Agg) -> Finding {
    let mut rows = Vec::new();
    let mut evaluated = false;
    let mut triggered = false;
    let mut ranges = Vec::new();
    let mut hits = Vec::new();
    for (mode, ranks) in &agg.steps {
        for (rank, steps) in ranks {
            let judged = steps.len() > STEP_MIN_STEPS;
            evaluated |= judged;
            let (threshold, out) = step_outliers(steps);
            let hit = judged && out.len() > STEP_N_OUTLIERS;
            triggered |= hit;
            if hit {
                hits.push(format!("{} {mode} steps of {rank} took longer than {threshold:.1} ms", out.len()));
                for s in out.iter().take(crate::collect::MAX_RANGES) {
                    ranges.push([s.start_us as f64 / 1e6, (s.start_us + s.dur_us) as f64 / 1e6]);
                }
            }
            let mut nums: Vec<i64> = out.iter().map(|s| s.step).collect();
            nums.truncate(100);
            rows.push(json!({"rank": rank, "mode": mode, "steps": steps.len(),
                "threshold_ms": threshold.is_finite().then(|| r2(threshold)),
                "outliers": out.len(), "outlier_steps": nums, "triggered": hit}));
        }
    }
    let summary = if rows.is_empty() {
        "No steps recorded.".to_owned()
    } else if !evaluated {
        format!("Too few steps to judge (the rule needs more than {STEP_MIN_STEPS} per rank and mode).")
    } else if hits.is_empty() {
        format!("No rank had more than {STEP_N_OUTLIERS} steps longer than mean + 3σ.")
    } else {
        format!("{}.", hits.join("; "))
    };
    let mut f = finding(
        "StepOutlier",
        triggered,
        evaluated,
        summary,
        "Look at what the slow steps did (the trace shows them): checkpointing, evaluation, garbage collection, data-loader stalls or a slow node; move periodic work out of the step or make it asynchronous.",
        json!({"stddev": STEP_STDDEV, "n_outliers": STEP_N_OUTLIERS, "min_steps": STEP_MIN_STEPS, "ranks": rows}),
    );
    f.ranges = ranges;
    f
}

/// Dataloader: the median number of processes loading data in parallel (per second)
/// against the cores: below 70 % or above 200 % of them.
fn dataloader(agg: &Agg) -> Finding {
    let patience = dataloader_patience(agg);
    let cores = agg.nodes.values().map(|n| n.cores.len()).max().unwrap_or(0);
    let parallel: Vec<f64> = agg.dataloader_pids.values().map(|p| p.len() as f64).collect();
    let median = quantile_sorted(&sorted(&parallel), 0.5).map(|m| m.floor());
    let evaluated = parallel.len() as u64 > patience && cores > 0;
    let (too_few, too_many) = match median {
        Some(m) if evaluated => (m < cores as f64 * 0.7, m > cores as f64 * 2.0),
        _ => (false, false),
    };
    let d = sorted(&agg.dataloader_durations_s);
    let evidence = json!({"min_threshold": 70, "max_threshold": 200, "patience": patience,
        "cores": cores, "parallel_dataloaders_median": median, "seconds_with_dataloading": parallel.len(),
        "events": agg.dataloader_events, "num_workers": agg.dataloader_num_workers, "pin_memory": agg.dataloader_pin_memory,
        "dataloading_time_s": {"p25": quantile_sorted(&d, 0.25), "p50": quantile_sorted(&d, 0.5), "p95": quantile_sorted(&d, 0.95)}});
    let summary = if agg.dataloader_events == 0 {
        "No dataloader events (profile a dataloader window to get them).".to_owned()
    } else if cores == 0 {
        "No CPU core metrics to compare the dataloaders with.".to_owned()
    } else if !evaluated {
        format!(
            "{} dataloader events over {} seconds: too few to judge (the rule waits for more than {patience} seconds).",
            agg.dataloader_events,
            parallel.len()
        )
    } else {
        let m = median.unwrap_or(0.0);
        let verdict = if too_few {
            "fewer than 70 % of the cores"
        } else if too_many {
            "more than twice the cores"
        } else {
            "in range"
        };
        format!("A median of {m} processes loaded data in parallel on {cores} cores: {verdict}.")
    };
    let advice = if too_many {
        "Too many data-loading processes compete for the cores: lower num_workers."
    } else {
        "Data loading uses few of the cores: raise the DataLoader's num_workers, and set pin_memory=True when training on GPUs."
    };
    finding("Dataloader", too_few || too_many, evaluated, summary, advice, evidence)
}

/// MaxInitializationTime: job start to the first step over 20 minutes.
fn max_init(agg: &Agg, job_start_s: Option<f64>) -> Finding {
    let init = match (agg.first_step_us, job_start_s) {
        (Some(f), Some(s)) => Some(f as f64 / 1e6 - s),
        _ => None,
    };
    let evaluated = init.is_some();
    let hit = init.is_some_and(|i| i > MAX_INIT_S);
    let summary = match init {
        None => "No step recorded: the start of training is unknown.".to_owned(),
        Some(i) => format!(
            "The first step started {i:.1} s after the job's first record (threshold {MAX_INIT_S} s)."
        ),
    };
    let mut f = finding(
        "MaxInitializationTime",
        hit,
        evaluated,
        summary,
        "Start-up is slow: download the data set ahead of time or stream it (pipe mode, FastFile), cache compiled models, and check what runs before the first step.",
        json!({"threshold_minutes": MAX_INIT_S / 60.0, "init_s": init.map(r2)}),
    );
    if let (true, Some(s), Some(fst)) = (hit, job_start_s, agg.first_step_us) {
        f.ranges.push([s, fst as f64 / 1e6]);
    }
    f
}

/// LoadBalancing: between every two GPUs of a node, the Jensen–Shannon distance between
/// their utilisation histograms above 0.2 (SageMaker compares only the last GPU with
/// itself, an upstream loop bug; every pair is compared here).
fn load_balancing(agg: &Agg) -> Finding {
    let patience = agg.system_patience();
    let mut pairs: Vec<(f64, Value)> = Vec::new();
    let mut compared = 0u64;
    let mut evaluated = false;
    let mut worst: Option<(String, String, String, f64)> = None;
    let mut ranges = Vec::new();
    for (node, n) in &agg.nodes {
        let judged: Vec<(&String, Vec<f64>)> = n
            .gpus
            .iter()
            .filter(|(_, g)| g.util.len() > patience)
            .map(|(k, g)| (k, g.util.load_bins()))
            .collect();
        for i in 0..judged.len() {
            for j in i + 1..judged.len() {
                let Some(d) = js_distance(&judged[i].1, &judged[j].1) else { continue };
                evaluated = true;
                let hit = d > LOAD_THRESHOLD;
                if hit && worst.as_ref().is_none_or(|w| d > w.3) {
                    worst = Some((node.clone(), judged[i].0.clone(), judged[j].0.clone(), d));
                }
                if hit && !ranges.contains(&[n.first_s, n.last_s]) {
                    ranges.push([n.first_s, n.last_s]);
                }
                compared += 1;
                pairs.push((d, json!({"node": node, "gpus": [judged[i].0, judged[j].0], "distance": r2(d), "triggered": hit})));
                // Keep the listed pairs bounded while comparing: the largest distances, in
                // the order compared.
                if pairs.len() >= 2 * MAX_PAIRS_LISTED {
                    keep_largest(&mut pairs, MAX_PAIRS_LISTED);
                }
            }
        }
    }
    keep_largest(&mut pairs, MAX_PAIRS_LISTED);
    let pairs: Vec<Value> = pairs.into_iter().map(|p| p.1).collect();
    let summary = match (&worst, evaluated) {
        (_, false) => format!("Needs two GPUs on a node with more than {patience} datapoints each."),
        (None, true) => "The GPUs of each node were equally busy.".to_owned(),
        (Some((node, a, b, d)), true) => {
            format!(
                "On {node}, {a} and {b} were unequally busy (histogram distance {d:.2}, threshold {LOAD_THRESHOLD})."
            )
        }
    };
    let mut f = finding(
        "LoadBalancing",
        worst.is_some(),
        evaluated,
        summary,
        "Spread the work evenly over the GPUs: check the data-parallel setup (every GPU should run one rank), uneven batch shards, and work pinned to GPU 0.",
        json!({"threshold": LOAD_THRESHOLD, "patience": patience, "pairs_compared": compared, "pairs": pairs}),
    );
    f.ranges = ranges;
    f
}

/// The `n` entries of `v` with the largest distance, in their order.
fn keep_largest(v: &mut Vec<(f64, Value)>, n: usize) {
    if v.len() <= n {
        return;
    }
    let mut by: Vec<usize> = (0..v.len()).collect();
    by.sort_by(|&a, &b| v[b].0.total_cmp(&v[a].0).then(a.cmp(&b)));
    let mut keep = vec![false; v.len()];
    for &i in &by[..n] {
        keep[i] = true;
    }
    let mut i = 0;
    v.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

/// OverallSystemUsage: p50 / p95 / p99 per resource and node; informational, never triggers.
fn overall(agg: &Agg) -> Finding {
    let mut nodes = serde_json::Map::new();
    for (node, n) in &agg.nodes {
        let q = |h: &crate::stats::PctHist| json!({"p50": h.quantile(0.5), "p95": h.quantile(0.95), "p99": h.quantile(0.99), "max": h.max()});
        let mut m = serde_json::Map::new();
        m.insert("cpu".into(), q(&n.cpu_total));
        m.insert("memory".into(), q(&n.memory));
        for (gpu, g) in &n.gpus {
            m.insert(format!("{gpu}_util"), q(&g.util));
            m.insert(format!("{gpu}_memory"), q(&g.mem));
        }
        m.insert("datapoints".into(), json!(n.ticks));
        m.insert("cores".into(), json!(n.cores.len()));
        nodes.insert(node.clone(), Value::Object(m));
    }
    let evaluated = !nodes.is_empty();
    let summary = if evaluated {
        let parts: Vec<String> = agg
            .nodes
            .iter()
            .map(|(k, n)| {
                format!(
                    "{k}: CPU p95 {}, memory p95 {}",
                    n.cpu_total.quantile(0.95).map_or("n/a".into(), |v| format!("{v:.1} %")),
                    n.memory.quantile(0.95).map_or("n/a".into(), |v| format!("{v:.1} %"))
                )
            })
            .collect();
        format!("{}.", parts.join("; "))
    } else {
        "No system metrics.".to_owned()
    };
    finding("OverallSystemUsage", false, evaluated, summary, "", json!({"nodes": nodes}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::Tick;

    fn run(ticks: usize, core: f64, iowait: f64, gpus: &[(f64, f64)]) -> Agg {
        run_with(Some(10), ticks, core, iowait, gpus)
    }

    fn run_with(patience: Option<u64>, ticks: usize, core: f64, iowait: f64, gpus: &[(f64, f64)]) -> Agg {
        let mut a = Agg::new(patience);
        for i in 0..ticks {
            let t = Tick {
                t_s: 1000.0 + i as f64,
                cores: vec![(0, core), (1, 10.0)],
                core_iowait: vec![(0, iowait)],
                memory: Some(20.0),
                gpus: gpus
                    .iter()
                    .enumerate()
                    .map(|(k, (u, m))| (format!("gpu{k}"), Some(*u), Some(*m)))
                    .collect(),
                ..Tick::default()
            };
            a.tick("algo-1", &t);
        }
        a.finish();
        a
    }

    fn get<'a>(f: &'a [Finding], rule: &str) -> &'a Finding {
        f.iter().find(|x| x.rule == rule).unwrap()
    }

    #[test]
    fn all_ten_in_order_even_without_data() {
        let f = all(&Agg::default(), None);
        assert!(f.iter().map(|x| x.rule.as_str()).eq(RULES));
        assert!(f.iter().all(|x| !x.triggered && !x.evaluated));
    }

    #[test]
    fn cpu_bottleneck_needs_patience_and_half_the_ticks() {
        let a = run(20, 95.0, 0.0, &[(3.0, 10.0)]);
        let f = all(&a, Some(1000.0));
        assert!(get(&f, "CPUBottleneck").triggered);
        assert!(!get(&f, "IOBottleneck").triggered);
        assert_eq!(get(&f, "CPUBottleneck").ranges, vec![[1000.0, 1019.0]]);
        // The default patience (1000) does not judge 20 ticks.
        let a = run_with(None, 20, 95.0, 0.0, &[(3.0, 10.0)]);
        assert!(!get(&all(&a, Some(1000.0)), "CPUBottleneck").evaluated);
        // A busy GPU: no bottleneck.
        let a = run(20, 95.0, 0.0, &[(80.0, 10.0)]);
        assert!(!get(&all(&a, None), "CPUBottleneck").triggered);
        let a = run(20, 5.0, 60.0, &[(3.0, 10.0)]);
        let f = all(&a, None);
        assert!(get(&f, "IOBottleneck").triggered);
        assert!(!get(&f, "CPUBottleneck").triggered);
    }

    #[test]
    fn low_gpu_batch_size_and_load_balancing() {
        // BatchSize needs more than 500 values.
        let a = run(600, 20.0, 0.0, &[(90.0, 30.0), (3.0, 30.0)]);
        let f = all(&a, None);
        let low = get(&f, "LowGPUUtilization");
        assert!(low.triggered && low.summary.contains("gpu1"), "{}", low.summary);
        assert!(!low.summary.contains("gpu0"), "{}", low.summary);
        assert!(get(&f, "LoadBalancing").triggered);
        // gpu1 is below 70 everywhere and the CPU too: batch could be larger for it.
        assert!(get(&f, "BatchSize").triggered);
        let a = run(600, 20.0, 0.0, &[(90.0, 30.0), (90.0, 30.0)]);
        let f = all(&a, None);
        assert!(!get(&f, "LowGPUUtilization").triggered);
        assert!(!get(&f, "LoadBalancing").triggered);
        assert!(get(&f, "LoadBalancing").evaluated);
        assert!(!get(&f, "BatchSize").triggered);
        assert!(get(&f, "OverallSystemUsage").evaluated && !get(&f, "OverallSystemUsage").triggered);
    }

    #[test]
    fn step_outlier_needs_more_than_ten() {
        let mut a = Agg::default();
        let steps: Vec<StepRec> = (0..200)
            .map(|i| StepRec {
                start_us: i * 1_000_000,
                dur_us: if i % 17 == 5 { 500_000 } else { 10_000 },
                step: i,
            })
            .collect();
        a.steps.entry("TRAIN".into()).or_default().insert("0-algo-1".into(), steps.clone());
        let f = step_outlier(&a);
        assert!(f.triggered, "{}", f.summary);
        assert_eq!(f.ranges.len(), 12);
        // Ten outliers only: not triggered.
        let mut few = steps.clone();
        for s in few.iter_mut().filter(|s| s.dur_us == 500_000).skip(10) {
            s.dur_us = 10_000;
        }
        a.steps.get_mut("TRAIN").unwrap().insert("0-algo-1".into(), few);
        let f = step_outlier(&a);
        assert!(f.evaluated && !f.triggered, "{}", f.summary);
    }

    #[test]
    fn gpu_memory_increase_and_overall_usage() {
        let mut a = Agg::new(Some(10));
        for i in 0..40 {
            let mem = if i < 30 { 10.0 } else { 80.0 };
            let t = Tick {
                t_s: 100.0 + f64::from(i),
                cores: vec![(0, 50.0)],
                memory: Some(25.0),
                gpus: vec![("gpu0".into(), Some(90.0), Some(mem))],
                ..Tick::default()
            };
            a.tick("algo-1", &t);
        }
        a.finish();
        let f = all(&a, None);
        let m = get(&f, "GPUMemoryIncrease");
        assert!(m.triggered, "{}", m.summary);
        assert!(m.summary.contains("gpu0 on algo-1"), "{}", m.summary);
        assert_eq!(m.ranges.first().map(|r| r[0]), Some(130.0));
        let o = get(&f, "OverallSystemUsage");
        assert!(o.evaluated && !o.triggered);
        assert_eq!(o.evidence["nodes"]["algo-1"]["memory"]["p50"], 25.0);
        assert_eq!(o.evidence["nodes"]["algo-1"]["gpu0_util"]["p95"], 90.0);
    }

    #[test]
    fn max_init_and_dataloader() {
        let mut a = Agg::default();
        a.first_step_us = Some(2_000_000_000);
        let f = max_init(&a, Some(2000.0 - 1300.0));
        assert!(f.triggered);
        let f = max_init(&a, Some(1990.0));
        assert!(f.evaluated && !f.triggered);
        let mut a = run(5, 10.0, 0.0, &[]);
        for s in 0..20 {
            a.dataloader_pids.entry(s).or_default().insert(7);
        }
        a.dataloader_events = 20;
        a.patience = None;
        let f = dataloader(&a);
        // One process on two cores: below 70 %.
        assert!(f.triggered, "{}", f.summary);
        // Five processes on two cores: above 200 %.
        for s in 0..20 {
            a.dataloader_pids.entry(s).or_default().extend([8, 9, 10, 11]);
        }
        let f = dataloader(&a);
        assert!(f.triggered && f.summary.contains("more than twice"), "{}", f.summary);
        assert!(f.advice.contains("lower num_workers"), "{}", f.advice);
        // Two on two: in range.
        for s in 0..20 {
            a.dataloader_pids.insert(s, [1, 2].into_iter().collect());
        }
        let f = dataloader(&a);
        assert!(f.evaluated && !f.triggered, "{}", f.summary);
    }
}
