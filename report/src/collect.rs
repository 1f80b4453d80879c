//! Aggregation while reading: one pass over the system files and one over the timelines,
//! keeping per node and per GPU only bounded state (percentage histograms, the last 500
//! values, a decimated series) and per rank the step durations, which are small
//! (`docs/report.md`, "Memory").

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use crate::read::Tick;
use crate::stats::{Decimator, PctHist};

/// Points of a node's series in the HTML page.
pub const NODE_POINTS: usize = 2000;
/// SageMaker's LowGPUUtilization window (the last 500 values).
pub const GPU_WINDOW: usize = 500;
/// SageMaker's GPUMemoryIncrease moving-average window.
pub const MEM_WINDOW: usize = 10;
/// Dataloader durations kept for quantiles.
const MAX_DATALOADER_DURATIONS: usize = 100_000;
/// Ranges kept per finding.
pub const MAX_RANGES: usize = 50;

/// Time ranges built from ticks: a tick within `gap` seconds of the open range extends it.
#[derive(Debug, Clone, Default)]
pub struct Ranges {
    pub count: u64,
    pub ranges: Vec<[f64; 2]>,
    pub dropped: u64,
}

impl Ranges {
    pub fn hit(&mut self, t: f64, gap: f64) {
        self.count += 1;
        if let Some(last) = self.ranges.last_mut()
            && t - last[1] <= gap
        {
            last[1] = t;
            return;
        }
        if self.ranges.len() < MAX_RANGES {
            self.ranges.push([t, t]);
        } else {
            self.dropped += 1;
        }
    }
}

/// One GPU of one node.
#[derive(Debug, Clone, Default)]
pub struct GpuAgg {
    pub util: PctHist,
    pub mem: PctHist,
    pub util_last: VecDeque<f64>,
    pub mem_last: VecDeque<f64>,
    /// GPUMemoryIncrease: values seen, violations, the largest increase and when.
    pub mem_n: u64,
    pub mem_increases: Ranges,
    pub max_increase: Option<(f64, f64, f64)>,
}

/// One system node.
#[derive(Debug, Clone)]
pub struct NodeAgg {
    pub ticks: u64,
    pub first_s: f64,
    pub last_s: f64,
    pub cores: BTreeSet<u32>,
    pub cpu_total: PctHist,
    pub memory: PctHist,
    pub gpus: BTreeMap<String, GpuAgg>,
    /// Ticks that had a GPU below 10 % (CPUBottleneck / IOBottleneck's low-GPU count).
    pub low_gpu_ticks: u64,
    pub cpu_bottleneck: Ranges,
    pub io_bottleneck: Ranges,
    pub dec: Decimator,
    pub columns: Vec<String>,
    col_index: HashMap<String, usize>,
    pub has_io: bool,
    pub has_net: bool,
    pub has_trainer: bool,
}

impl NodeAgg {
    fn new(t: f64) -> NodeAgg {
        NodeAgg {
            ticks: 0,
            first_s: t,
            last_s: t,
            cores: BTreeSet::new(),
            cpu_total: PctHist::default(),
            memory: PctHist::default(),
            gpus: BTreeMap::new(),
            low_gpu_ticks: 0,
            cpu_bottleneck: Ranges::default(),
            io_bottleneck: Ranges::default(),
            dec: Decimator::new(NODE_POINTS),
            columns: Vec::new(),
            col_index: HashMap::new(),
            has_io: false,
            has_net: false,
            has_trainer: false,
        }
    }

    fn col(&mut self, name: String) -> usize {
        if let Some(&i) = self.col_index.get(&name) {
            return i;
        }
        self.columns.push(name.clone());
        self.col_index.insert(name, self.columns.len() - 1);
        self.columns.len() - 1
    }

    /// The column of `name`, if it was ever seen.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.col_index.get(name).copied()
    }
}

/// Thresholds of SageMaker's CPUBottleneck and IOBottleneck (defaults).
pub const GPU_LOW: f64 = 10.0;
pub const CPU_HIGH: f64 = 90.0;
pub const IO_HIGH: f64 = 50.0;
/// Two bottleneck ticks closer than this belong to one time range (seconds).
pub const RANGE_GAP_S: f64 = 5.0;
/// GPUMemoryIncrease's default increase (percentage points).
pub const MEM_INCREASE: f64 = 5.0;

/// One step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRec {
    pub start_us: i64,
    pub dur_us: i64,
    pub step: i64,
}

/// Everything the report keeps from a LocalPath.
#[derive(Debug, Default)]
pub struct Agg {
    pub nodes: BTreeMap<String, NodeAgg>,
    /// mode → rank → steps in the order read.
    pub steps: BTreeMap<String, BTreeMap<String, Vec<StepRec>>>,
    pub ranks: BTreeSet<String>,
    /// phase → (events, total µs).
    pub phases: BTreeMap<String, (u64, i64)>,
    pub detailed: HashSet<(String, i64)>,
    pub dataloader_events: u64,
    /// Second → the set of OS pids with a dataloader event that second.
    pub dataloader_pids: BTreeMap<i64, BTreeSet<i64>>,
    pub dataloader_durations_s: Vec<f64>,
    pub dataloader_num_workers: Option<i64>,
    pub dataloader_pin_memory: Option<bool>,
    pub first_us: Option<i64>,
    pub last_us: Option<i64>,
    pub first_step_us: Option<i64>,
    pub sys_first_s: Option<f64>,
    pub sys_last_s: Option<f64>,
}

fn push_last(q: &mut VecDeque<f64>, v: f64, cap: usize) {
    if q.len() == cap {
        q.pop_front();
    }
    q.push_back(v);
}

impl Agg {
    pub fn tick(&mut self, node: &str, t: &Tick) {
        self.sys_first_s = Some(self.sys_first_s.map_or(t.t_s, |f| f.min(t.t_s)));
        self.sys_last_s = Some(self.sys_last_s.map_or(t.t_s, |f| f.max(t.t_s)));
        let n = self.nodes.entry(node.to_owned()).or_insert_with(|| NodeAgg::new(t.t_s));
        n.ticks += 1;
        n.first_s = n.first_s.min(t.t_s);
        n.last_s = n.last_s.max(t.t_s);
        for (c, _) in &t.cores {
            n.cores.insert(*c);
        }
        let total = t.cpu_total();
        if let Some(v) = total {
            n.cpu_total.add(v);
        }
        if let Some(v) = t.memory {
            n.memory.add(v);
        }
        let low_gpu = t.gpus.iter().any(|g| g.1.is_some_and(|u| u < GPU_LOW));
        if low_gpu {
            n.low_gpu_ticks += 1;
            if t.cores.iter().any(|c| c.1 > CPU_HIGH) {
                n.cpu_bottleneck.hit(t.t_s, RANGE_GAP_S);
            }
            if t.core_iowait.iter().any(|c| c.1 > IO_HIGH) {
                n.io_bottleneck.hit(t.t_s, RANGE_GAP_S);
            }
        }
        for (name, util, mem) in &t.gpus {
            let g = n.gpus.entry(name.clone()).or_default();
            if let Some(u) = util {
                g.util.add(*u);
                push_last(&mut g.util_last, *u, GPU_WINDOW);
            }
            if let Some(m) = mem {
                g.mem.add(*m);
                g.mem_n += 1;
                push_last(&mut g.mem_last, *m, MEM_WINDOW + 1);
                // SageMaker's moving averages: the last `window` values against the
                // `window - 1` values from `-window - 1` to `-3` (its slice `[-w-1:-2]`).
                if g.mem_n > MEM_WINDOW as u64 + 1 {
                    let v: Vec<f64> = g.mem_last.iter().copied().collect();
                    let k = v.len();
                    let recent = v[k - MEM_WINDOW..].iter().sum::<f64>() / MEM_WINDOW as f64;
                    let older = &v[k - MEM_WINDOW - 1..k - 2];
                    let older = older.iter().sum::<f64>() / older.len() as f64;
                    let diff = recent - older;
                    if diff > MEM_INCREASE {
                        g.mem_increases.hit(t.t_s, RANGE_GAP_S);
                    }
                    if g.max_increase.is_none_or(|(d, _, _)| diff > d) {
                        g.max_increase = Some((diff, t.t_s, *m));
                    }
                }
            }
        }
        // The decimated series.
        let mut row: Vec<(usize, f64)> = Vec::new();
        let mut put = |n: &mut NodeAgg, name: String, v: Option<f64>| {
            let i = n.col(name);
            if let Some(v) = v {
                row.push((i, v));
            }
        };
        put(n, "cpu_total".into(), total);
        for (c, v) in &t.cores {
            put(n, format!("core:{c:06}"), Some(*v));
        }
        put(n, "memory".into(), t.memory);
        for (name, util, mem) in &t.gpus {
            put(n, format!("gpu:{name}:util"), *util);
            put(n, format!("gpu:{name}:mem"), *mem);
        }
        let mb = |v: Option<f64>| v.map(|b| b / 1e6);
        if t.io_read.is_some() || t.io_write.is_some() {
            n.has_io = true;
            put(n, "io_read".into(), mb(t.io_read));
            put(n, "io_write".into(), mb(t.io_write));
        }
        if t.net_rx.is_some() || t.net_tx.is_some() {
            n.has_net = true;
            put(n, "net_rx".into(), mb(t.net_rx));
            put(n, "net_tx".into(), mb(t.net_tx));
        }
        if t.trainer_cpu.is_some() || t.trainer_rss.is_some() {
            n.has_trainer = true;
            put(n, "trainer_cpu".into(), t.trainer_cpu);
            put(n, "trainer_mem".into(), mb(t.trainer_rss));
        }
        let mut cols = vec![None; n.columns.len()];
        for (i, v) in row {
            cols[i] = Some(v);
        }
        n.dec.push(t.t_s, &cols);
    }

    pub fn event(&mut self, e: &crate::read::Event<'_>) {
        let end = e.start_us.saturating_add(e.dur_us);
        self.first_us = Some(self.first_us.map_or(e.start_us, |f| f.min(e.start_us)));
        self.last_us = Some(self.last_us.map_or(end, |f| f.max(end)));
        self.ranks.insert(e.node.to_owned());
        if e.ph != 'X' {
            return;
        }
        if let Some(mode) = step_mode(e.phase) {
            if let Some(step) = e.step {
                self.steps
                    .entry(mode.to_owned())
                    .or_default()
                    .entry(e.node.to_owned())
                    .or_default()
                    .push(StepRec { start_us: e.start_us, dur_us: e.dur_us, step });
                self.first_step_us = Some(self.first_step_us.map_or(e.start_us, |f| f.min(e.start_us)));
            }
            return;
        }
        let p = self.phases.entry(e.phase.to_owned()).or_insert((0, 0));
        p.0 += 1;
        p.1 = p.1.saturating_add(e.dur_us);
        if (e.phase.starts_with("Forward") || e.phase.contains("_functions"))
            && let Some(s) = e.step
            && self.detailed.len() < 1_000_000
        {
            self.detailed.insert((e.node.to_owned(), s));
        }
        match e.phase {
            "DataLoaderIter" | "DataLoaderWorker" => {
                self.dataloader_events += 1;
                if let Some(pid) = e.args.get("pid").and_then(serde_json::Value::as_i64) {
                    let pids = self.dataloader_pids.entry(e.start_us.div_euclid(1_000_000)).or_default();
                    if pids.len() < 4096 {
                        pids.insert(pid);
                    }
                }
                if self.dataloader_durations_s.len() < MAX_DATALOADER_DURATIONS {
                    self.dataloader_durations_s.push(e.dur_us as f64 / 1e6);
                }
            }
            "DataLoaderIterInitialize" => {
                self.dataloader_events += 1;
                if let Some(n) = e.args.get("num_workers").and_then(serde_json::Value::as_i64) {
                    self.dataloader_num_workers = Some(n);
                }
                if let Some(b) = e.args.get("pin_memory").and_then(serde_json::Value::as_bool) {
                    self.dataloader_pin_memory = Some(b);
                }
            }
            _ => {}
        }
    }
}

/// `TRAIN` for `Step:ModeKeys.TRAIN`; `None` for a phase that is not a step.
pub fn step_mode(phase: &str) -> Option<&str> {
    phase.split_once("Step:ModeKeys.").map(|(_, m)| m).filter(|m| !m.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(t: f64, core: f64, gpu: f64, mem: f64) -> Tick {
        Tick {
            t_s: t,
            cores: vec![(0, core), (1, core)],
            gpus: vec![("gpu0".into(), Some(gpu), Some(mem))],
            memory: Some(30.0),
            ..Tick::default()
        }
    }

    #[test]
    fn bottleneck_ticks_make_ranges() {
        let mut a = Agg::default();
        for i in 0..10 {
            a.tick("algo-1", &tick(f64::from(i), 95.0, 3.0, 10.0));
        }
        for i in 100..105 {
            a.tick("algo-1", &tick(f64::from(i), 95.0, 3.0, 10.0));
        }
        a.tick("algo-1", &tick(200.0, 20.0, 3.0, 10.0));
        let n = &a.nodes["algo-1"];
        assert_eq!(n.ticks, 16);
        assert_eq!(n.low_gpu_ticks, 16);
        assert_eq!(n.cpu_bottleneck.count, 15);
        assert_eq!(n.cpu_bottleneck.ranges, vec![[0.0, 9.0], [100.0, 104.0]]);
        assert_eq!(n.io_bottleneck.count, 0);
    }

    #[test]
    fn memory_increase_uses_sagemakers_moving_averages() {
        let mut a = Agg::default();
        for i in 0..30 {
            a.tick("algo-1", &tick(f64::from(i), 10.0, 50.0, 10.0));
        }
        assert_eq!(a.nodes["algo-1"].gpus["gpu0"].mem_increases.count, 0);
        // A jump of 60 points: the last-10 mean rises by 6 at once (> 5).
        a.tick("algo-1", &tick(30.0, 10.0, 50.0, 70.0));
        let g = &a.nodes["algo-1"].gpus["gpu0"];
        assert_eq!(g.mem_increases.count, 1);
        let (d, t, _) = g.max_increase.unwrap();
        assert!((d - 6.0).abs() < 1e-9, "{d}");
        assert_eq!(t, 30.0);
    }

    #[test]
    fn step_modes() {
        assert_eq!(step_mode("Step:ModeKeys.TRAIN"), Some("TRAIN"));
        assert_eq!(step_mode("Forward"), None);
    }
}
