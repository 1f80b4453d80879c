//! One report job: the pass over a LocalPath ([`build`], [`build_with`]) that reads every
//! format (`reading/`), feeds the aggregates (`analysis/`), judges the rules (`rules/`) and
//! assembles the [`ReportModel`]. Every file is read through `trainprof_output::fs`: the
//! report runs as root at the end of `trainprof run`, on a folder the trainer's user could
//! write.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use trainprof_output::fs::Dir;

use crate::analysis::fleet;
use crate::analysis::incidents;
use crate::analysis::steps::{STEP_POINTS, StepRec, mode_steps};
use crate::model::*;
use crate::reading::{self, MAX_STATS_BYTES, native, node_gpus, python};
use crate::rules::{self, Agg, Options};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: {1}")]
    Root(String, io::Error),
    #[error("{0} holds no profiler data (no system/incremental, no framework/pevents, no profiling window)")]
    Empty(String),
}

/// Reads the LocalPath at `root` and computes the model. `source` is what the user gave
/// (a path or `s3://…`), kept in the model.
pub fn build(root: &Path, source: &str, opts: &Options) -> Result<ReportModel, Error> {
    build_inner(root, source, opts, |_, _| {}, |_| {}, false).map(|(m, _)| m)
}

/// What [`build_with`] hands back beside the model, for `trainprof compare`
/// (`compare.rs`): every step record (mode → rank → steps in the order read) and each
/// system node's ticks, first and last tick time.
#[derive(Debug, Default)]
pub struct Raw {
    pub steps: BTreeMap<String, BTreeMap<String, Vec<StepRec>>>,
    pub node_ticks: BTreeMap<String, (u64, f64, f64)>,
}

/// [`build`], with every system tick (node, tick) and timeline event also handed to
/// `on_tick` and `on_event` during the one pass, and the [`Raw`] records kept.
pub fn build_with(
    root: &Path,
    source: &str,
    opts: &Options,
    on_tick: impl FnMut(&str, &reading::Tick),
    on_event: impl FnMut(&reading::Event<'_>),
) -> Result<(ReportModel, Raw), Error> {
    build_inner(root, source, opts, on_tick, on_event, true)
}

fn build_inner(
    root: &Path,
    source: &str,
    opts: &Options,
    mut on_tick: impl FnMut(&str, &reading::Tick),
    mut on_event: impl FnMut(&reading::Event<'_>),
    keep_raw: bool,
) -> Result<(ReportModel, Raw), Error> {
    let dir = Dir::open_root(root, false).map_err(|e| Error::Root(root.display().to_string(), e))?;
    let mut skipped = reading::Skipped::leaving_out(opts.leave_out.clone());
    let mut agg = Agg::new(opts.patience);
    reading::system_ticks(&dir, &mut skipped, |node, t| {
        agg.tick(node, &t);
        on_tick(node, &t);
    });
    reading::timeline_events(&dir, &mut skipped, &|_, _| true, |e| {
        agg.event(e);
        on_event(e);
    });
    let stats = reading::stats_files(&dir, &mut skipped);
    let native = native::windows(&dir, &mut skipped);
    let hangs = incidents::read(&dir, &agg.steps, &mut skipped);
    let memory = crate::analysis::memory::read(&dir, &agg.steps, &agg.trainer_gpu_mem, &mut skipped);
    agg.snapshot_leaks = crate::analysis::memory::leaks(&memory);
    let (gpu_models, identities) = node_gpus::read(&dir, &mut skipped);
    let mut inspector_capped = Vec::new();
    let nccl_inspector = crate::analysis::inspector::read(&dir, &mut skipped, &mut inspector_capped);
    let agent_costs = reading::agent_cost::read(&dir, &mut skipped);
    let hook_costs = reading::hook_cost::read(&dir, &mut skipped);
    if agg.nodes.is_empty()
        && agg.ranks.is_empty()
        && stats.is_empty()
        && native.is_empty()
        && hangs.is_empty()
        && memory.is_empty()
        && nccl_inspector.is_none()
    {
        return Err(Error::Empty(root.display().to_string()));
    }
    agg.finish();
    let memory_events = std::mem::take(&mut agg.memory_events);
    let (python, python_summary) = python_windows(&dir, &stats, &mut skipped);
    let raw = if keep_raw {
        Raw {
            steps: agg.steps.clone(),
            node_ticks: agg.nodes.iter().map(|(k, n)| (k.clone(), (n.ticks, n.first_s, n.last_s))).collect(),
        }
    } else {
        Raw::default()
    };
    let rank_steps: crate::analysis::cost::RankSteps = {
        let mut r: crate::analysis::cost::RankSteps = BTreeMap::new();
        for ranks in agg.steps.values() {
            for (rank, steps) in ranks {
                r.entry(rank.clone()).or_default().extend(steps.iter().map(|s| (s.start_us, s.dur_us)));
            }
        }
        r
    };
    let mut m = assemble(agg, python, source, skipped);
    m.job.profiled.python_windows = python_summary.windows.len() as u64;
    m.job.profiled.native_windows = native.len() as u64;
    m.python_summary = python_summary;
    m.native = native;
    m.hangs = hangs;
    m.memory = memory;
    m.job.capped.extend(memory_events.capped());
    m.memory.windows = memory_events.finish();
    m.job.gpu_models = gpu_models;
    m.job.identities = identities;
    m.job.capped.extend(inspector_capped);
    m.nccl_inspector = nccl_inspector;
    let (cost, finding) = crate::analysis::cost::build(&agent_costs, &hook_costs, &m, &rank_steps);
    m.profiling_cost = cost;
    m.findings.extend(finding);
    Ok((m, raw))
}

/// The Python windows: every folder's top functions, the folders grouped into windows named
/// for people (each with its functions merged), and the top functions over the step windows.
/// Folders are read one at a time and merged as they are read: one folder's full list is
/// held at a time, and the merges keep at most [`python::MAX_MERGED`] functions.
fn python_windows(
    dir: &Dir,
    files: &[reading::StatsFile],
    skipped: &mut reading::Skipped,
) -> (Vec<PythonWindow>, PythonSummary) {
    let folders: Vec<python::Folder> = files
        .iter()
        .map(|f| python::Folder {
            node: f.node.clone(),
            profiler: f.profiler,
            edges: reading::parse_window(&f.window),
            raw: f.window.clone(),
        })
        .collect();
    let mut out = Vec::new();
    let mut summary = PythonSummary::default();
    let mut all = python::Merge::default();
    for (ix, mut g) in python::group(&folders) {
        let mut merge = python::Merge::default();
        for i in ix {
            let f = &files[i];
            let bytes = match reading::read_file(dir, &f.rel, MAX_STATS_BYTES) {
                Ok(b) => b,
                Err(e) => {
                    skipped.push(e);
                    continue;
                }
            };
            // The errors name the kind of problem and where, never the file's content.
            let functions = match f.profiler {
                PythonProfilerDir::CProfile => python::cprofile_all(&bytes).map_err(|e| e.to_string()),
                PythonProfilerDir::Pyinstrument => {
                    python::pyinstrument_all(&bytes).map_err(|e| e.to_string())
                }
            };
            drop(bytes);
            let mut functions = match functions {
                Ok(v) => v,
                Err(e) => {
                    skipped.push(format!("{}: {e}", f.rel));
                    out.push(window(f, &folders[i], &g, Vec::new()));
                    continue;
                }
            };
            merge.add(&functions);
            if g.kind == PythonGroupKind::Steps {
                all.add(&functions);
                if let Some((a, b)) = &folders[i].edges {
                    summary.top.profiled_s += ((b.time_us - a.time_us) / 1e6).max(0.0);
                }
            }
            python::top(&mut functions);
            out.push(window(f, &folders[i], &g, functions));
        }
        g.functions = merge.top(python::TOP);
        summary.windows.push(g);
    }
    summary.windows.sort_by(|a, b| {
        a.start_s
            .unwrap_or(f64::INFINITY)
            .total_cmp(&b.start_s.unwrap_or(f64::INFINITY))
            .then(a.label.cmp(&b.label))
    });
    summary.top.folders = all.folders;
    summary.top.functions_left_out = all.left_out;
    summary.top.functions = all.top(python::TOP_MERGED);
    (out, summary)
}

fn window(
    f: &reading::StatsFile,
    folder: &python::Folder,
    g: &PythonGroup,
    functions: Vec<PyFunction>,
) -> PythonWindow {
    let edges = folder.edges.as_ref();
    PythonWindow {
        node: f.node.clone(),
        window: f.window.clone(),
        profiler: f.profiler,
        start_step: edges.and_then(|e| e.0.step),
        end_step: edges.and_then(|e| e.1.step),
        functions,
        start_s: edges.map(|e| e.0.time_us / 1e6),
        end_s: edges.map(|e| e.1.time_us / 1e6),
        label: g.label.clone(),
        part: python::part(folder),
    }
}

fn assemble(mut agg: Agg, python: Vec<PythonWindow>, source: &str, skipped: reading::Skipped) -> ReportModel {
    // The Python windows count too: the pre-step-zero window starts before the first step.
    let py_start = python.iter().filter_map(|w| w.start_s).reduce(f64::min);
    let py_end = python.iter().filter_map(|w| w.end_s).reduce(f64::max);
    let starts = [agg.sys_first_s, agg.first_us.map(|u| u as f64 / 1e6), py_start];
    let ends = [agg.sys_last_s, agg.last_us.map(|u| u as f64 / 1e6), py_end];
    let start_s = starts.iter().flatten().copied().filter(|v| v.is_finite()).reduce(f64::min);
    let end_s = ends.iter().flatten().copied().filter(|v| v.is_finite()).reduce(f64::max);
    let steps: BTreeMap<String, ModeSteps> =
        agg.steps.iter().map(|(m, r)| (m.clone(), mode_steps(r))).collect();
    let findings = rules::all(&mut agg, start_s);
    let collector = std::mem::take(&mut agg.detailed_windows);
    let detailed_capped = collector.capped();
    let detailed = collector.finish(&agg.steps);
    let collectives = std::mem::take(&mut agg.collectives);
    let collectives_capped = collectives.capped();
    let mut phases: Vec<Phase> = agg
        .phases
        .iter()
        .map(|(name, (count, total_us))| Phase {
            name: name.clone(),
            count: *count,
            total_ms: *total_us as f64 / 1000.0,
            mean_ms: if *count > 0 { *total_us as f64 / 1000.0 / *count as f64 } else { 0.0 },
        })
        .collect();
    phases.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
    let job = Job {
        start_s,
        end_s,
        duration_s: start_s.zip(end_s).map(|(a, b)| b - a),
        nodes: agg.nodes.keys().cloned().collect(),
        ranks: agg.ranks.iter().cloned().collect(),
        init_s: agg.first_step_us.zip(start_s).map(|(f, s)| f as f64 / 1e6 - s),
        steps_per_mode: steps.iter().map(|(m, s)| (m.clone(), s.count)).collect(),
        profiled: Profiled {
            detailed_steps: agg.detailed.len() as u64,
            dataloader_events: agg.dataloader_events,
            // The windows as named, and the native ones: set by `build` once read.
            python_windows: 0,
            python_folders: python.len() as u64,
            native_windows: 0,
        },
        // The hook's drop counters are not in the files yet (docs/report.md).
        dropped_events: 0,
        clock: agg
            .nodes
            .iter()
            .filter_map(|(node, n)| {
                n.clock
                    .as_ref()
                    .map(|c| Clock::new(node, c.readings, c.unsynchronised, c.max_error_us, c.est_error_us))
            })
            .collect(),
        skipped: skipped.0,
        capped: agg
            .caps
            .0
            .iter()
            .map(|((what, node), c)| Capped {
                what: (*what).to_owned(),
                node: node.clone(),
                limit: c.limit,
                left_out: c.left_out,
            })
            .chain(detailed_capped)
            .chain(collectives_capped)
            .collect(),
        // Set by `build` once read.
        gpu_models: BTreeMap::new(),
        identities: BTreeMap::new(),
    };
    let collectives = collectives.finish(&job.clock);
    let mut fleet = fleet::fleet(&agg.steps, &agg.signals);
    if let (Some(f), Some(late)) = (fleet.as_mut(), collectives.as_ref().and_then(|c| c.late_rank.as_ref())) {
        fleet::set_late_rank(f, late, &agg.steps, &agg.signals);
    }
    let drawn = fleet::nodes_to_draw(agg.nodes.keys(), fleet.as_ref(), &agg.signals);
    let not_drawn = (agg.nodes.len() - drawn.len()) as u64;
    let series = series(&agg, fleet.as_ref(), &drawn);
    if let Some(f) = fleet.as_mut() {
        let many = agg.steps.get(&f.mode).is_some_and(|r| r.len() > fleet::MAX_RANK_SERIES);
        f.page = crate::model::fleet::PageChoice {
            step_chart: if many { StepChartKind::Distribution } else { StepChartKind::Ranks },
            ranks_drawn: if many { slowest(f) } else { f.scores.iter().map(|s| s.rank.clone()).collect() },
            nodes_drawn: drawn,
            nodes_not_drawn: not_drawn,
        };
    }

    let mut triggers = agg.triggers;
    triggers.sort_by(|a, b| a.start_s.total_cmp(&b.start_s).then_with(|| a.rank.cmp(&b.rank)));
    let mut requested = agg.requested;
    requested.sort_by(|a, b| a.start_s.total_cmp(&b.start_s).then_with(|| a.rank.cmp(&b.rank)));
    let mut capped_windows = agg.capped_windows;
    capped_windows.sort_by(|a, b| a.at_s.total_cmp(&b.at_s).then_with(|| a.rank.cmp(&b.rank)));
    ReportModel {
        version: VERSION,
        source: source.to_owned(),
        job,
        steps,
        phases,
        python,
        python_summary: PythonSummary::default(),
        native: Vec::new(),
        triggers,
        requested,
        capped_windows,
        findings,
        detailed,
        hangs: Hangs::default(),
        memory: Default::default(),
        fleet,
        collectives,
        nccl_inspector: None,
        // Set by `build` once the agent's records are read.
        profiling_cost: Default::default(),
        series: Some(series),
    }
}

/// The ranks a many-rank step chart draws: the highest scores.
fn slowest(f: &crate::model::fleet::Fleet) -> Vec<String> {
    f.scores.iter().take(fleet::SLOWEST_DRAWN).map(|s| s.rank.clone()).collect()
}

/// The page's series: steps as [`fleet::step_series`] draws them, and the nodes in `drawn`.
fn series(agg: &Agg, fleet: Option<&crate::model::fleet::Fleet>, drawn: &[String]) -> Series {
    let mut out = Series::default();
    let slow = fleet.map(slowest).unwrap_or_default();
    for (mode, ranks) in &agg.steps {
        out.steps.insert(mode.clone(), fleet::step_series(ranks, &slow, STEP_POINTS));
    }
    for (node, n) in agg.nodes.iter().filter(|(k, _)| drawn.contains(k)) {
        let (t_s, cols) = n.dec.finish(n.columns.len());
        let get =
            |name: &str| n.column(name).map(|i| cols[i].clone()).unwrap_or_else(|| vec![None; t_s.len()]);
        let mut s =
            NodeSeries { cpu_total: get("cpu_total"), memory: get("memory"), ..NodeSeries::default() };
        // Columns are named `core:<6 digits>`, so sorting them sorts the cores.
        let mut cores: Vec<&String> = n.columns.iter().filter(|c| c.starts_with("core:")).collect();
        cores.sort();
        s.cpu_cores = cores.iter().map(|c| get(c)).collect();
        for gpu in n.gpus.keys() {
            s.gpus.insert(
                gpu.clone(),
                GpuSeries { util: get(&format!("gpu:{gpu}:util")), mem: get(&format!("gpu:{gpu}:mem")) },
            );
        }
        if n.has_io {
            s.io = Some(IoSeries { read_mbps: get("io_read"), write_mbps: get("io_write") });
        }
        if n.has_net {
            s.net = Some(NetSeries { rx_mbps: get("net_rx"), tx_mbps: get("net_tx") });
        }
        if n.has_trainer {
            s.trainer = Some(TrainerSeries { cpu: get("trainer_cpu"), mem_mb: get("trainer_mem") });
        }
        s.t_s = t_s;
        out.nodes.insert(node.clone(), s);
    }
    out
}

/// The model as `--json` prints it: without `series`.
pub fn to_json(model: &ReportModel) -> String {
    let mut m = model.clone();
    m.series = None;
    serde_json::to_string_pretty(&m).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::collect;
    use crate::analysis::steps::stragglers;

    /// A LocalPath with two minutes of one node (two cores, one GPU) and one rank's steps.
    fn small_job() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("system/incremental/2026112203");
        std::fs::create_dir_all(&sys).unwrap();
        let mut text = String::new();
        for i in 0..1200 {
            let t = 1_795_400_000.0 + f64::from(i) * 0.1;
            for (ty, name, dim, v) in [
                ("cpu", "cpu0", "CPUUtilization", 10.0),
                ("cpu", "cpu1", "CPUUtilization", 30.0),
                ("gpu", "gpu0", "GPUUtilization", 50.0),
                ("gpu", "gpu0", "GPUMemoryUtilization", 20.0),
                ("memory", "MemoryUsedPercent", "", 40.0),
                ("trainer", "CPUPercent", "ProcessTree", 100.0),
            ] {
                // The trainer's line is missing in every other tick.
                if ty == "trainer" && i % 2 == 1 {
                    continue;
                }
                text += &format!(
                    "{{\"Type\":\"{ty}\",\"Name\":\"{name}\",\"Dimension\":\"{dim}\",\"Value\":{v},\"NodeId\":\"algo-1\",\"Timestamp\":{t}}}\n"
                );
            }
        }
        std::fs::write(sys.join("1795400000.algo-1.json"), text).unwrap();
        let tl = dir.path().join("framework/pevents/2026112203");
        std::fs::create_dir_all(&tl).unwrap();
        let mut ev = String::from(
            "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"start_time_since_epoch_in_micros\": 1795400000000000}},\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": \"Step:ModeKeys.TRAIN\"}}",
        );
        for i in 0..5000 {
            ev += &format!(
                ",\n{{\"name\": \"Step:ModeKeys.TRAIN\", \"pid\": 1, \"ph\": \"X\", \"ts\": {}, \"dur\": {}, \"args\": {{\"step_num\": \"{i}\"}}}}",
                1_000_000 + i * 20_000,
                if i == 4321 { 900_000 } else { 10_000 }
            );
        }
        ev += "\n]";
        std::fs::write(tl.join("1795400200000000_0-algo-1_pythontimeline.json"), ev).unwrap();
        dir
    }

    #[test]
    fn the_model_keeps_the_contract() {
        let dir = small_job();
        let m = build(dir.path(), "src", &Options::default()).unwrap();
        assert_eq!(m.version, VERSION);
        assert_eq!(m.job.nodes, ["algo-1"]);
        assert_eq!(m.job.ranks, ["0-algo-1"]);
        assert_eq!(m.job.steps_per_mode["TRAIN"], 5000);
        assert_eq!(m.findings.len(), 11);
        // Steps: above 4000, min/max decimated, the slow step kept.
        let s = &m.series.as_ref().unwrap().steps["TRAIN"]["0-algo-1"];
        assert!(s.t_s.len() <= STEP_POINTS && s.t_s.len() == s.ms.len());
        assert!(s.ms.contains(&900.0));
        // Nodes: every array as long as t_s; a missing sample is null.
        let n = &m.series.as_ref().unwrap().nodes["algo-1"];
        let len = n.t_s.len();
        assert!(len > 0 && len <= collect::NODE_POINTS);
        assert_eq!(n.cpu_total.len(), len);
        assert_eq!(n.memory.len(), len);
        assert_eq!(n.cpu_cores.len(), 2);
        assert!(n.cpu_cores.iter().all(|c| c.len() == len));
        assert_eq!(n.cpu_cores[1][0], Some(30.0));
        assert_eq!(n.gpus["gpu0"].util.len(), len);
        assert_eq!(n.gpus["gpu0"].mem[0], Some(20.0));
        let tr = n.trainer.as_ref().unwrap();
        assert_eq!((tr.cpu.len(), tr.mem_mb.len()), (len, len));
        assert!(tr.mem_mb.iter().all(Option::is_none));
        assert!(n.io.is_none() && n.net.is_none());
        // --json: the contract's keys, no series, nulls rather than NaN.
        let v: serde_json::Value = serde_json::from_str(&to_json(&m)).unwrap();
        assert!(v.get("series").is_none());
        for k in ["version", "source", "job", "steps", "phases", "python", "triggers", "findings"] {
            assert!(v.get(k).is_some(), "{k}");
        }
        for k in [
            "start_s",
            "end_s",
            "duration_s",
            "nodes",
            "ranks",
            "init_s",
            "steps_per_mode",
            "profiled",
            "dropped_events",
            "clock",
        ] {
            assert!(v["job"].get(k).is_some(), "job.{k}");
        }
        for k in [
            "count",
            "p50_ms",
            "p90_ms",
            "p99_ms",
            "max_ms",
            "mean_ms",
            "histogram",
            "per_rank",
            "stragglers",
            "outliers",
        ] {
            assert!(v["steps"]["TRAIN"].get(k).is_some(), "steps.TRAIN.{k}");
        }
        for k in ["rule", "triggered", "evaluated", "summary", "advice", "evidence", "ranges"] {
            assert!(v["findings"][0].get(k).is_some(), "findings.{k}");
        }
        assert_eq!(v["steps"]["TRAIN"]["outliers"][0]["step"], 4321);
    }

    #[test]
    fn hostile_python_windows_cost_one_line_each() {
        let dir = small_job();
        let window = "train-2-stepstart-1795400001000000_train-2-forwardpassend-1795400001500000";
        let put = |prof: &str, name: &str, bytes: &[u8]| {
            let d = dir.path().join(format!("framework/pytorch/{prof}/0-algo-1/{window}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(name), bytes).unwrap();
        };
        // 40 tuples, each holding two references to the one before (2^40 values if copied).
        let mut b = vec![b'['];
        b.extend_from_slice(&40i32.to_le_bytes());
        b.extend_from_slice(b"\xa9\x02NN");
        for k in 0..39i32 {
            b.extend_from_slice(b"\xa9\x02r");
            b.extend_from_slice(&k.to_le_bytes());
            b.push(b'r');
            b.extend_from_slice(&k.to_le_bytes());
        }
        put("cprofile", "python_stats", &b);
        // 100 frames deep: past serde_json's nesting limit.
        let mut j = String::from(r#"{"root_frame": "#);
        for i in 0..100 {
            j += &format!(
                r#"{{"function": "f{i}", "file_path_short": "t.py", "line_no": {i}, "time": {}, "children": ["#,
                100 - i
            );
        }
        j += &"]}".repeat(100);
        j += "}";
        put("pyinstrument", "python_stats.json", j.as_bytes());
        let m = build(dir.path(), "src", &Options::default()).unwrap();
        let by = |p: &str| m.python.iter().find(|w| w.profiler.as_str() == p).unwrap();
        assert!(by("cprofile").functions.is_empty());
        assert_eq!(by("pyinstrument").functions.len(), python::TOP);
        assert_eq!(by("pyinstrument").start_s, Some(1_795_400_001.0));
        let rel = format!("framework/pytorch/cprofile/0-algo-1/{window}/python_stats");
        assert_eq!(
            m.job.skipped,
            [format!(
                "{rel}: pstats data is not a dict of (file, line, function) → (cc, nc, tt, ct, callers)"
            )]
        );
    }

    #[test]
    fn stragglers_by_ratio_of_medians() {
        let mut per = BTreeMap::new();
        for (r, m) in [("0-a", 100.0), ("1-a", 110.0), ("2-a", 100.0), ("3-a", 125.0)] {
            per.insert(r.to_owned(), StepStats { count: 1, p50_ms: Some(m), ..StepStats::default() });
        }
        // Median of medians: 105; 125 / 105 = 1.19 < 1.2, so none.
        assert!(stragglers(&per).is_empty());
        per.insert("3-a".into(), StepStats { count: 1, p50_ms: Some(130.0), ..StepStats::default() });
        let s = stragglers(&per);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].rank, "3-a");
        assert!((s[0].ratio - 130.0 / 105.0).abs() < 1e-12);
    }

    /// The H200 fixture's shape: a 4 s first step, a few windows' steps of about a second,
    /// and 30-35 ms steps. The axis fits the 30-35 ms bulk, the long steps are listed above
    /// it, and the first step is the warm-up.
    #[test]
    fn the_step_chart_fits_the_bulk_and_calls_out_the_warm_up() {
        let ms = |i: i64| match i {
            0 => 4000.0,
            1 => 120.0,
            202 | 205 | 208 => 1000.0,
            _ => 30.0 + (i % 5) as f64,
        };
        let steps: Vec<StepRec> = (0..850)
            .map(|i| StepRec { start_us: i * 40_000, dur_us: (ms(i) * 1000.0) as i64, step: i })
            .collect();
        let mut ranks = BTreeMap::new();
        ranks.insert("0-a".to_owned(), steps);
        let m = mode_steps(&ranks);
        let c = &m.chart;
        // p99 of the steps is 34 ms: the axis runs to 1.5 × that, not to 4,000 ms.
        assert_eq!(c.y_min_ms, 0.0);
        assert!((c.y_max_ms - 51.0).abs() < 1e-9, "{}", c.y_max_ms);
        let above: Vec<(i64, f64)> = c.above.iter().map(|o| (o.step, o.ms)).collect();
        assert_eq!(above, [(0, 4000.0), (202, 1000.0), (205, 1000.0), (208, 1000.0), (1, 120.0)]);
        assert_eq!(c.above_count, 5);
        // The warm-up: steps 0 and 1 (each longer than 1.5 × the 32 ms median), not 202.
        assert_eq!(c.warmup.len(), 1);
        let w = &c.warmup[0];
        assert_eq!((w.rank.as_str(), w.steps, w.first_step, w.last_step), ("0-a", 2, 0, 1));
        assert_eq!(w.ms, 4120.0);
        assert_eq!(w.median_ms, 32.0);
        assert_eq!((w.start_s, w.end_s), (0.0, 4.0));
        // Steady steps: no warm-up, and nothing above an axis that holds every step.
        let flat: Vec<StepRec> =
            (0..200).map(|i| StepRec { start_us: i * 1000, dur_us: 10_000, step: i }).collect();
        ranks.insert("0-a".to_owned(), flat);
        let c = mode_steps(&ranks).chart;
        assert!(c.warmup.is_empty() && c.above.is_empty() && c.above_count == 0);
        assert!((c.y_max_ms - 10.5).abs() < 1e-9);
        // A warm-up is at most a tenth of the steps: half the job slow is no warm-up.
        let slowing: Vec<StepRec> = (0..100)
            .map(|i| StepRec { start_us: i * 1000, dur_us: if i < 50 { 100_000 } else { 10_000 }, step: i })
            .collect();
        ranks.insert("0-a".to_owned(), slowing);
        let c = mode_steps(&ranks).chart;
        assert!(c.warmup.is_empty(), "{:?}", c.warmup);
    }

    #[test]
    fn mode_steps_lists_outliers_longest_first() {
        let mut ranks = BTreeMap::new();
        let steps: Vec<StepRec> = (0..50)
            .map(|i| StepRec {
                start_us: i * 1000,
                dur_us: if i == 30 { 1_000_000 } else { 10_000 },
                step: i,
            })
            .collect();
        ranks.insert("0-a".to_owned(), steps);
        let m = mode_steps(&ranks);
        assert_eq!(m.count, 50);
        assert_eq!(m.max_ms, Some(1000.0));
        assert_eq!(m.outliers.len(), 1);
        assert_eq!(m.outliers[0].step, 30);
        assert_eq!(m.histogram.edges_ms.len(), m.histogram.counts.len() + 1);
    }
}
