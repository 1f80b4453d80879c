//! Hostile files with many distinct names stay within the caps (`docs/report.md`, "Caps"):
//! the counts the report keeps, the cells of its series and the sizes of `--json` and the page
//! are asserted, never a time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::path::Path;

use serde_json::{Value, json};
use trainprof_report::analysis::collect::{
    MAX_COLUMNS, MAX_CORES_PER_NODE, MAX_GPUS, MAX_GPUS_PER_NODE, MAX_MODES, MAX_NODES, MAX_PHASES,
    MAX_RANKS, MAX_SERIES_CELLS, OTHER_PHASES,
};
use trainprof_report::model::{Capped, Evidence};
use trainprof_report::reading::{Event, Tick};
use trainprof_report::rules::{Agg, load_balancing};
use trainprof_report::{Options, build, page as html, to_json, trace};

const T0: f64 = 1_795_400_000.0;

fn line(name: &str, dim: &str, v: f64, node: &str, t: f64) -> String {
    format!(
        "{{\"Type\":\"gpu\",\"Name\":\"{name}\",\"Dimension\":\"{dim}\",\"Value\":{v},\"NodeId\":\"{node}\",\"Timestamp\":{t}}}\n"
    )
}

fn write_system(root: &Path, text: &str) {
    let d = root.join("system/incremental/2026112203");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("1795400000.algo-1.json"), text).unwrap();
}

/// 10,000 GPU names in a 1.1 MB system file: as 10,000 ticks of one GPU each, and as one tick.
fn ten_thousand_gpus(one_tick: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for i in 0..10_000 {
        let t = if one_tick { T0 } else { T0 + f64::from(i) * 0.1 };
        text += &line(&format!("gpu{i}"), "GPUUtilization", f64::from(i * 37 % 10_000) / 100.0, "algo-1", t);
    }
    assert!(text.len() > 1_000_000);
    write_system(dir.path(), &text);
    dir
}

fn load_balancing(m: &trainprof_report::model::ReportModel) -> &load_balancing::Evidence {
    m.findings
        .iter()
        .find_map(|f| match &f.evidence {
            Evidence::LoadBalancing(e) => Some(e),
            _ => None,
        })
        .unwrap()
}

fn capped(m: &trainprof_report::model::ReportModel, what: &str, node: Option<&str>) -> Option<Capped> {
    m.job.capped.iter().find(|c| c.what == what && c.node.as_deref() == node).cloned()
}

/// Both shapes: 10,000 ticks (the per-tick vector of every column was the cost) and one tick
/// (finding a GPU in a tick was linear in the tick's GPUs: quadratic in the file).
#[test]
fn ten_thousand_gpu_names_keep_64_and_say_so() {
    for one_tick in [false, true] {
        let dir = ten_thousand_gpus(one_tick);
        let m = build(dir.path(), "src", &Options::default()).unwrap();
        let left = 10_000 - MAX_GPUS_PER_NODE as u64;
        assert_eq!(
            capped(&m, "gpus", Some("algo-1")),
            Some(Capped { what: "gpus".into(), node: Some("algo-1".into()), limit: 64, left_out: left }),
            "{:?}",
            m.job.capped
        );
        let s = &m.series.as_ref().unwrap().nodes["algo-1"];
        assert_eq!(s.gpus.len(), MAX_GPUS_PER_NODE);
        let lb = load_balancing(&m);
        assert!(lb.pairs.len() <= 100);
        // Before the caps: --json 0.8-1.9 GB of memory; the page 134 MB.
        let json = to_json(&m);
        let page = html::render(&m);
        assert!(json.len() < 200_000, "{}", json.len());
        assert!(page.len() < 2_000_000, "{}", page.len());
        assert!(
            page.contains("GPUs of algo-1: the first 64 are kept; 9936 readings of further GPUs left out")
        );
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["job"]["capped"][0]["left_out"], json!(left));
    }
}

fn tick(t: f64, cores: u32, gpus: &[String]) -> Tick {
    Tick {
        t_s: t,
        cores: (0..cores).map(|c| (c, 50.0)).collect(),
        gpus: gpus.iter().map(|g| (g.clone(), Some(40.0), Some(20.0))).collect(),
        memory: Some(10.0),
        ..Tick::default()
    }
}

#[test]
fn ten_thousand_nodes_and_thousands_of_cores_stay_within_the_cells() {
    let mut a = Agg::new(None);
    // 10,000 nodes of 8 GPUs each: 256 nodes kept, 1,024 GPUs of them.
    let gpus: Vec<String> = (0..8).map(|g| format!("gpu{g}")).collect();
    for i in 0..10_000 {
        a.tick(&format!("algo-{i}"), &tick(T0 + f64::from(i), 2, &gpus));
    }
    assert_eq!(a.nodes.len(), MAX_NODES);
    assert_eq!(a.nodes.values().map(|n| n.gpus.len()).sum::<usize>(), MAX_GPUS);
    assert_eq!(a.caps.0[&("nodes", None)].left_out, 10_000 - MAX_NODES as u64);
    assert_eq!(a.caps.0[&("gpus", None)].left_out, (MAX_NODES * 8 - MAX_GPUS) as u64);

    // 2,000 cores on each of 40 nodes, ticking: 1,024 cores a node, 20,000 columns a job,
    // and the series within their cells.
    let mut a = Agg::new(None);
    for k in 0..20 {
        for i in 0..40 {
            a.tick(&format!("algo-{i}"), &tick(T0 + f64::from(k), 2_000, &[]));
        }
    }
    assert!(a.nodes.values().all(|n| n.cores.len() <= MAX_CORES_PER_NODE));
    let columns: usize = a.nodes.values().map(|n| n.columns.len()).sum();
    assert_eq!(columns, MAX_COLUMNS);
    assert!(a.caps.0.contains_key(&("cores", Some("algo-0".into()))));
    assert!(a.caps.0.keys().any(|k| k.0 == "columns"));
    for _ in 0..100 {
        for i in 0..40 {
            a.tick(&format!("algo-{i}"), &tick(T0 + 20.0, 4, &[]));
        }
    }
    let cells: usize = a.nodes.values().map(|n| n.dec.cells()).sum();
    assert!(cells <= MAX_SERIES_CELLS, "{cells}");
    assert!(a.nodes.values().all(|n| n.dec.len() <= trainprof_report::analysis::collect::MIN_NODE_POINTS));
}

fn event<'a>(
    node: &'a str,
    phase: &'a str,
    step: Option<i64>,
    args: &'a serde_json::Map<String, Value>,
) -> Event<'a> {
    Event { node, phase, name: "e", ph: 'X', start_us: 1_000_000, dur_us: 10, step, args }
}

#[test]
fn phases_modes_and_ranks_are_capped() {
    let args = serde_json::Map::new();
    let mut a = Agg::new(None);
    for i in 0..100_000 {
        a.event(&event("0-algo-1", &format!("phase{i}"), None, &args));
    }
    assert_eq!(a.phases.len(), MAX_PHASES + 1);
    // Every event is counted, the ones past the cap in `(other phases)`.
    assert_eq!(a.phases.values().map(|p| p.0).sum::<u64>(), 100_000);
    assert_eq!(a.phases[OTHER_PHASES].0, 100_000 - MAX_PHASES as u64);
    // A phase name longer than 256 bytes is never kept.
    a.event(&event("0-algo-1", &"x".repeat(300), None, &args));
    assert_eq!(a.phases[OTHER_PHASES].0, 100_001 - MAX_PHASES as u64);
    for i in 0..1000 {
        a.event(&event("0-algo-1", &format!("Step:ModeKeys.M{i}"), Some(1), &args));
    }
    assert_eq!(a.steps.len(), MAX_MODES);
    assert_eq!(a.caps.0[&("modes", None)].left_out, 1000 - MAX_MODES as u64);
    for i in 0..5000 {
        a.event(&event(&format!("{i}-algo-1"), "Forward", Some(1), &args));
    }
    assert_eq!(a.ranks.len(), MAX_RANKS);
    assert_eq!(a.caps.0[&("ranks", None)].left_out, 5000 - MAX_RANKS as u64);
    assert_eq!(a.detailed.len(), MAX_RANKS);
}

#[test]
fn load_balancing_lists_at_most_a_hundred_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for k in 0..20 {
        for g in 0..80 {
            let v = f64::from((g * 7 + k) % 100);
            text += &line(&format!("gpu{g}"), "GPUUtilization", v, "algo-1", T0 + f64::from(k));
        }
    }
    write_system(dir.path(), &text);
    let m = build(dir.path(), "src", &Options { patience: Some(10), ..Options::default() }).unwrap();
    let lb = load_balancing(&m);
    assert_eq!(lb.pairs_compared, 64 * 63 / 2);
    assert_eq!(lb.pairs.len(), 100);
    // The largest distances are the ones listed.
    let least = lb.pairs.iter().map(|p| p.distance).fold(f64::INFINITY, f64::min);
    let triggered = m.findings.iter().any(|f| f.rule == "LoadBalancing" && f.triggered);
    assert!(triggered && least > 0.2, "{least}");
}

#[test]
fn the_trace_caps_gpu_tracks_and_phase_threads() {
    let dir = ten_thousand_gpus(false);
    let hour = dir.path().join("framework/pevents/2026112203");
    std::fs::create_dir_all(&hour).unwrap();
    let mut ev = vec![json!({"name": "process_name", "ph": "M", "pid": 0,
        "args": {"start_time_since_epoch_in_micros": 1_795_400_000_000_000_i64}})];
    for i in 0..3000 {
        ev.push(
            json!({"name": "process_name", "ph": "M", "pid": i + 1, "args": {"name": format!("phase{i}")}}),
        );
        ev.push(json!({"name": "e", "ph": "X", "pid": i + 1, "ts": i, "dur": 1}));
    }
    std::fs::write(hour.join("1795400000200000_0-algo-1_pythontimeline.json"), Value::from(ev).to_string())
        .unwrap();
    let mut buf = Vec::new();
    let w = trace::write(dir.path(), &mut buf, &trace::Clip::default()).unwrap();
    assert_eq!(w.slices, 3000);
    let mut text = String::new();
    flate2::read::GzDecoder::new(&buf[..]).read_to_string(&mut text).unwrap();
    let doc: Vec<Value> = serde_json::from_str(&text).unwrap();
    let threads = doc.iter().filter(|e| e["name"] == "thread_name").count();
    assert_eq!(threads, MAX_PHASES + 1);
    assert_eq!(doc.iter().filter(|e| e["ph"] == "X" && e["args"].is_object()).count(), 3000);
    let gpu_tracks: std::collections::HashSet<&str> = doc
        .iter()
        .filter(|e| e["ph"] == "C")
        .filter_map(|e| e["name"].as_str())
        .filter(|n| n.starts_with("gpu"))
        .collect();
    assert_eq!(gpu_tracks.len(), MAX_GPUS_PER_NODE);
    assert!(w.skipped.iter().any(|s| s.contains("(other phases)")), "{:?}", w.skipped);
    assert!(w.skipped.iter().any(|s| s.starts_with("9936 GPU samples")), "{:?}", w.skipped);
}

/// A tick holds at most `MAX_GPUS_PER_NODE` GPUs (each line looks its GPU up among them), and
/// counts the readings of the others.
#[test]
fn a_tick_of_ten_thousand_gpus_holds_64() {
    let dir = ten_thousand_gpus(true);
    let root = trainprof_output::fs::Dir::open_root(dir.path(), false).unwrap();
    let mut skipped = trainprof_report::reading::Skipped::default();
    let mut ticks = Vec::new();
    trainprof_report::reading::system_ticks(&root, &mut skipped, |_, t| ticks.push(t));
    let [t] = ticks.as_slice() else { panic!("{} ticks", ticks.len()) };
    assert_eq!((t.gpus.len(), t.gpus_left_out), (MAX_GPUS_PER_NODE, 10_000 - MAX_GPUS_PER_NODE as u64));
}

#[test]
fn dataloader_seconds_and_pids_are_capped() {
    use trainprof_report::analysis::collect::{MAX_DATALOADER_PIDS, MAX_DATALOADER_SECONDS};
    let mut a = Agg::new(None);
    let mut args = serde_json::Map::new();
    args.insert("pid".into(), json!(7));
    for s in 0..150_000_i64 {
        let e = Event { start_us: s * 1_000_000, ..event("0-algo-1", "DataLoaderIter", None, &args) };
        a.event(&e);
    }
    assert_eq!(a.dataloader_pids.len(), MAX_DATALOADER_SECONDS);
    assert_eq!(a.caps.0[&("dataloader_seconds", None)].left_out, 50_000);
    // 4,096 pids in each of 250 seconds: 1,024,000 pairs, 1,000,000 kept in all.
    let mut a = Agg::new(None);
    for s in 0..250_i64 {
        for pid in 0..4096 {
            args.insert("pid".into(), json!(pid));
            a.event(&Event { start_us: s * 1_000_000, ..event("0-algo-1", "DataLoaderIter", None, &args) });
        }
    }
    assert_eq!(a.dataloader_pids.values().map(|p| p.len()).sum::<usize>(), MAX_DATALOADER_PIDS);
    assert_eq!(a.caps.0[&("dataloader_pids", None)].left_out, 24_000);
}
