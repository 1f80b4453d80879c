//! Aggregation while reading: one pass over the system files and one over the timelines,
//! keeping per node and per GPU only bounded state (percentage histograms, the last 500
//! values, a decimated series) and per rank the step durations, which are small
//! (`docs/report.md`, "Memory"). What the trainer names (nodes, GPUs, cores, ranks, modes,
//! phases) is capped per job and per node (`docs/report.md`, "Caps"): what comes past a cap is
//! left out (or, for phases, summed into one), counted, and the model says so.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use trainprof_output::protocol::timeline;

use crate::analysis::stats::{Decimator, PctHist};
use crate::analysis::steps::StepRec;
use crate::reading::Tick;

/// Points of a node's series in the HTML page.
pub const NODE_POINTS: usize = 2000;
/// A GPU's recent utilisation values kept for the rules (SageMaker's LowGPUUtilization and
/// BatchSize windows: the last 500 values).
pub const GPU_WINDOW: usize = 500;
/// Dataloader durations kept for quantiles.
const MAX_DATALOADER_DURATIONS: usize = 100_000;
/// SageMaker's rules run every 60 s of data (`scan_interval_us`); so are the windowed checks
/// here ([`crate::rules::rule::Rule::judge`]), and once more at the end of each node's data.
pub const EVAL_EVERY_S: f64 = 60.0;

// Caps (`docs/report.md`, "Caps"). Each bounds state that grows with the number of distinct
// names the trainer writes, not with the job's length; the worst case of each is in the docs.
/// System nodes per job.
pub const MAX_NODES: usize = 256;
/// GPUs per node and per job (each costs two 40 KB histograms and 1,011 recent values).
pub const MAX_GPUS_PER_NODE: usize = crate::reading::MAX_TICK_GPUS;
pub const MAX_GPUS: usize = 1024;
/// Readings of the trainer tree's GPU memory kept per job (16 bytes each), for the memory
/// snapshots' comparison (`docs/report.md`, "Memory").
pub const MAX_TRAINER_GPU_POINTS: usize = 500_000;
/// Cores per node (a core costs a series column).
pub const MAX_CORES_PER_NODE: usize = 1024;
/// Series columns (one per core, two per GPU, a few per node) per job.
pub const MAX_COLUMNS: usize = 20_000;
/// Cells (points × columns) of all nodes' series: a node keeps `MAX_SERIES_CELLS / columns of
/// the job` points, between `MIN_NODE_POINTS` and `NODE_POINTS`.
pub const MAX_SERIES_CELLS: usize = 2_000_000;
pub const MIN_NODE_POINTS: usize = MAX_SERIES_CELLS / MAX_COLUMNS;
/// Timeline nodes (ranks) per job.
pub const MAX_RANKS: usize = 4096;
pub use trainprof_output::protocol::timeline_event::{MAX_MODES, MAX_NAME_BYTES};
/// Timeline phases per job; events of further phases are summed into [`OTHER_PHASES`].
pub const MAX_PHASES: usize = 1000;
pub const OTHER_PHASES: &str = "(other phases)";
/// Seconds with dataloader events kept for the Dataloader rule, and (second, pid) pairs in
/// all (at most 4,096 pids a second).
pub const MAX_DATALOADER_SECONDS: usize = 100_000;
pub const MAX_DATALOADER_PIDS: usize = 1_000_000;
/// Distinct (rank, step) pairs with detailed events counted.
pub const MAX_DETAILED: usize = 1_000_000;

/// A cap that was reached (`model::Capped` names what and where): the cap, and how many
/// values were left out (ticks, GPU or core readings, events).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapHit {
    pub limit: u64,
    pub left_out: u64,
}

/// Every cap reached, by (what, node).
#[derive(Debug, Clone, Default)]
pub struct Caps(pub BTreeMap<(&'static str, Option<String>), CapHit>);

impl Caps {
    fn hit(&mut self, what: &'static str, node: Option<&str>, limit: usize) {
        let e = self.0.entry((what, node.map(str::to_owned))).or_default();
        e.limit = limit as u64;
        e.left_out += 1;
    }

    /// Whether `name`, not yet in a collection of `len` names capped at `cap`, may join it;
    /// if not, one value is counted as left out under `what` (under `names` when the name is
    /// longer than `MAX_NAME_BYTES`; such a name is never kept, not even here).
    fn admit(&mut self, what: &'static str, node: Option<&str>, name: &str, len: usize, cap: usize) -> bool {
        if name.len() > MAX_NAME_BYTES {
            self.hit("names", node, MAX_NAME_BYTES);
            false
        } else if len >= cap {
            self.hit(what, node, cap);
            false
        } else {
            true
        }
    }
}

/// One GPU of one node.
#[derive(Debug, Clone, Default)]
pub struct GpuAgg {
    pub util: PctHist,
    pub mem: PctHist,
    /// The last `GPU_WINDOW` utilisation values, and their ticks' times (epoch s).
    pub util_last: VecDeque<f64>,
    pub util_last_t: VecDeque<f64>,
}

/// SageMaker's `patience` for the system rules: datapoints a rule waits for before it
/// judges (`--patience` lowers it, [`Agg::system_patience`]).
pub const SYSTEM_PATIENCE: u64 = 1000;

/// The patience of a preliminary verdict, for a rule with less than its `full` patience of
/// data (`docs/report.md`, "Short jobs"): a hundredth of it (10 of the system rules' 1000
/// datapoints; any second of the Dataloader's 10 seconds).
pub fn preliminary_patience(full: u64) -> u64 {
    full / 100
}

/// A tick of one node as the rules see it (`rules/`).
#[derive(Debug)]
pub struct TickView<'a> {
    pub tick: &'a Tick,
    /// The tick's GPUs within the caps: (name, utilisation, memory).
    pub gpus: &'a [&'a (String, Option<f64>, Option<f64>)],
    /// CPU, all cores (`Tick::cpu_total`).
    pub cpu_total: Option<f64>,
    /// Datapoints a system rule waits for.
    pub patience: u64,
}

/// A judgement's window: from the previous judgement to `end`.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub from: f64,
    pub end: f64,
    pub patience: u64,
    /// A preliminary judgement (`patience` is then [`preliminary_patience`]): a rule's
    /// other minimums (BatchSize's 500 values) give way to what there is too.
    pub preliminary: bool,
}

/// Appends `v` to a window of at most `cap` recent values.
pub fn push_last(q: &mut std::collections::VecDeque<f64>, v: f64, cap: usize) {
    if q.len() == cap {
        q.pop_front();
    }
    q.push_back(v);
}

/// What judges a node's data during the pass: every rule's state for one node
/// (`rules::NodeRules`). The aggregates hold it without naming the rules, which sit a layer
/// above (ARCHITECTURE.md, "The report crate").
pub trait NodeJudge: Default {
    /// One tick of the node.
    fn tick(&mut self, t: &TickView<'_>);
    /// A judgement of the node's data so far.
    fn judge(&mut self, node: &NodeAgg<Self>, w: &Window);
}

/// One system node.
#[derive(Debug, Clone)]
pub struct NodeAgg<R> {
    pub ticks: u64,
    pub first_s: f64,
    pub last_s: f64,
    pub cores: BTreeSet<u32>,
    pub cpu_total: PctHist,
    pub memory: PctHist,
    pub gpus: BTreeMap<String, GpuAgg>,
    /// What each rule keeps for this node (`rules/`).
    pub rules: R,
    /// The same rules judged with the preliminary patience ([`preliminary_patience`]),
    /// for a rule that has less than its patience of data (`docs/report.md`, "Short jobs");
    /// `None` under `--patience`, which keeps SageMaker's behaviour.
    pub prelim: Option<Box<R>>,
    next_eval_s: f64,
    last_eval_s: f64,
    pub dec: Decimator,
    pub columns: Vec<String>,
    col_index: HashMap<String, usize>,
    pub has_io: bool,
    pub has_net: bool,
    pub has_trainer: bool,
    /// The clock readings of the job, each field its worst (`docs/report.md`, `job.clock`).
    pub clock: Option<ClockAgg>,
}

/// The worst clock readings of one node: `Synchronised` readings and how many said 0, the
/// largest error bound and estimate (`docs/report.md`, `job.clock`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClockAgg {
    pub readings: u64,
    pub unsynchronised: u64,
    pub max_error_us: Option<f64>,
    pub est_error_us: Option<f64>,
}

impl ClockAgg {
    pub fn add(&mut self, synchronised: Option<f64>, max_error_us: Option<f64>, est_error_us: Option<f64>) {
        if let Some(s) = synchronised {
            self.readings += 1;
            self.unsynchronised += u64::from(s == 0.0);
        }
        let worst = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.max_error_us = worst(self.max_error_us, max_error_us);
        self.est_error_us = worst(self.est_error_us, est_error_us);
    }
}

impl<R: NodeJudge> NodeAgg<R> {
    fn new(t: f64, points: usize, prelim: bool) -> NodeAgg<R> {
        NodeAgg {
            prelim: prelim.then(Box::default),
            ticks: 0,
            first_s: t,
            last_s: t,
            cores: BTreeSet::new(),
            cpu_total: PctHist::default(),
            memory: PctHist::default(),
            gpus: BTreeMap::new(),
            rules: R::default(),
            next_eval_s: t + EVAL_EVERY_S,
            last_eval_s: t,
            dec: Decimator::new(points),
            columns: Vec::new(),
            col_index: HashMap::new(),
            has_io: false,
            has_net: false,
            has_trainer: false,
            clock: None,
        }
    }

    /// The column of `name`, added if the job has room for it (`MAX_COLUMNS`, counted in
    /// `total`); `None` when it has not.
    fn col(&mut self, node: &str, name: String, total: &mut usize, caps: &mut Caps) -> Option<usize> {
        if let Some(&i) = self.col_index.get(&name) {
            return Some(i);
        }
        if !caps.admit("columns", Some(node), &name, *total, MAX_COLUMNS) {
            return None;
        }
        *total += 1;
        self.columns.push(name.clone());
        self.col_index.insert(name, self.columns.len() - 1);
        Some(self.columns.len() - 1)
    }

    /// Every rule's judgement of the data so far, for the window ending at `end`.
    fn evaluate(&mut self, end: f64, patience: u64) {
        let w = Window { from: self.last_eval_s, end, patience, preliminary: false };
        self.last_eval_s = end;
        // The rules read the node while they change their own state, so that state is taken
        // out for the call (the empty `NodeRules` left in its place allocates nothing).
        let mut rules = std::mem::take(&mut self.rules);
        rules.judge(self, &w);
        self.rules = rules;
        if let Some(mut prelim) = self.prelim.take() {
            let w = Window { patience: preliminary_patience(patience), preliminary: true, ..w };
            prelim.judge(self, &w);
            self.prelim = Some(prelim);
        }
    }

    /// The column of `name`, if it was ever seen.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.col_index.get(name).copied()
    }
}

/// Everything the report keeps from a LocalPath.
#[derive(Debug, Default)]
pub struct Agg<R> {
    /// `--patience` (`None`: SageMaker's defaults, and the preliminary verdicts of short jobs).
    pub patience: Option<u64>,
    /// True while the nodes' `rules` are their preliminary twins ([`Agg::swap_preliminary`]).
    pub preliminary: bool,
    pub nodes: BTreeMap<String, NodeAgg<R>>,
    /// mode → rank → steps in the order read.
    pub steps: BTreeMap<String, BTreeMap<String, Vec<StepRec>>>,
    pub ranks: BTreeSet<String>,
    /// Each rank's number, for `detailed`.
    rank_ids: HashMap<String, u32>,
    /// phase → (events, total µs).
    pub phases: BTreeMap<String, (u64, i64)>,
    /// (rank number, step) with detailed events.
    pub detailed: HashSet<(u32, i64)>,
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
    /// Anomaly triggers (`trainprof:AutoProfilingTrigger` instant events), at most
    /// `MAX_TRIGGERS`.
    pub triggers: Vec<crate::model::Trigger>,
    /// On-demand windows (`trainprof:RequestedWindow` instant events), at most
    /// `MAX_TRIGGERS`.
    pub requested: Vec<crate::model::RequestedWindow>,
    /// Windows stopped at their cap (`trainprof:WindowCapped`), at most `MAX_TRIGGERS`.
    pub capped_windows: Vec<crate::model::CappedWindow>,
    /// The caps reached (`docs/report.md`, "Caps").
    pub caps: Caps,
    /// The detailed windows' ops, kernels and DataLoader waits (`detailed.rs`).
    pub detailed_windows: crate::analysis::detailed::Collector,
    /// The detailed windows' collectives (`collectives.rs`).
    pub collectives: crate::analysis::collectives::Collector,
    /// The trainer tree's GPU memory per (system node, device index): `(epoch s, bytes)` at
    /// each tick, at most [`MAX_TRAINER_GPU_POINTS`] in all (the memory snapshots' comparison,
    /// `memory.rs`).
    pub trainer_gpu_mem: BTreeMap<(String, u32), Vec<(f64, f64)>>,
    trainer_gpu_points: usize,
    /// The memory snapshots' leak judgements (`memory.rs`), for the GPUMemoryLeak rule: the
    /// devices judged, and those that grew.
    pub snapshot_leaks: (u64, Vec<crate::model::evidence::memory_leak::LeakEvidence>),
    /// The detailed windows' memory events (`memory_events.rs`).
    pub memory_events: crate::analysis::memory_events::Collector,
    /// What each node's rows showed for the stragglers' causes (`fleet.rs`).
    pub signals: BTreeMap<String, crate::analysis::fleet::NodeSignals>,
    /// GPUs and series columns of all nodes.
    gpu_count: usize,
    columns: usize,
    /// Points each node's series keeps now.
    points: usize,
    /// (second, pid) pairs in `dataloader_pids`.
    dataloader_pid_count: usize,
}

/// The start of the first 60 s window after `t`, counted from `next` (the window due):
/// `next + k × 60` by arithmetic, O(1) for a gap of any length. Where 60 s no longer moves a
/// float of `t`'s size (beyond about 10^17 s), there is no next window: infinity.
pub fn next_window(next: f64, t: f64) -> f64 {
    let k = ((t - next) / EVAL_EVERY_S).floor() + 1.0;
    let at = next + k.max(1.0) * EVAL_EVERY_S;
    if at > t {
        at
    } else if t + EVAL_EVERY_S > t {
        t + EVAL_EVERY_S
    } else {
        f64::INFINITY
    }
}

/// Points each node's series keeps when the job has `columns` columns.
pub fn node_points(columns: usize) -> usize {
    (MAX_SERIES_CELLS / columns.max(1)).clamp(MIN_NODE_POINTS, NODE_POINTS)
}

impl<R: NodeJudge> Agg<R> {
    pub fn new(patience: Option<u64>) -> Agg<R> {
        Agg { patience, ..Agg::default() }
    }

    /// Datapoints a system rule waits for.
    pub fn system_patience(&self) -> u64 {
        self.patience.map_or(SYSTEM_PATIENCE, |p| p.min(SYSTEM_PATIENCE))
    }

    /// The patience a verdict judges with: [`Agg::system_patience`], or while the
    /// preliminary verdicts are made ([`crate::rules::all`]) the preliminary one.
    pub fn judging_patience(&self, full: u64) -> u64 {
        if self.preliminary { preliminary_patience(full) } else { full }
    }

    /// Swaps every node's rules with their preliminary twins (made only without
    /// `--patience`); twice restores them. `preliminary` says which are in place.
    pub fn swap_preliminary(&mut self) {
        for n in self.nodes.values_mut() {
            if let Some(p) = n.prelim.as_mut() {
                std::mem::swap(&mut n.rules, p);
            }
        }
        self.preliminary = !self.preliminary;
    }

    /// The last window of every node, once all ticks are in.
    pub fn finish(&mut self) {
        let patience = self.system_patience();
        for n in self.nodes.values_mut() {
            if n.last_s > n.last_eval_s {
                let end = n.last_s;
                n.evaluate(end, patience);
            }
        }
        // The step table is most of the memory over many ranks: its growth slack (up to half
        // of each rank's vector) is given back before the statistics are made.
        for ranks in self.steps.values_mut() {
            for steps in ranks.values_mut() {
                steps.shrink_to_fit();
            }
        }
    }

    pub fn tick(&mut self, node: &str, t: &Tick) {
        let patience = self.system_patience();
        if !self.nodes.contains_key(node)
            && !self.caps.admit("nodes", None, node, self.nodes.len(), MAX_NODES)
        {
            return;
        }
        match self.signals.get_mut(node) {
            Some(s) => s.tick(t),
            None => self.signals.entry(node.to_owned()).or_default().tick(t),
        }
        for &(gpu, bytes) in &t.gpu_trainer_mem {
            if self.trainer_gpu_points >= MAX_TRAINER_GPU_POINTS {
                self.caps.hit("trainer_gpu_memory", None, MAX_TRAINER_GPU_POINTS);
                continue;
            }
            self.trainer_gpu_points += 1;
            self.trainer_gpu_mem.entry((node.to_owned(), gpu)).or_default().push((t.t_s, bytes));
        }
        self.sys_first_s = Some(self.sys_first_s.map_or(t.t_s, |f| f.min(t.t_s)));
        self.sys_last_s = Some(self.sys_last_s.map_or(t.t_s, |f| f.max(t.t_s)));
        let prelim = self.patience.is_none();
        let Agg { nodes, caps, gpu_count, columns, .. } = self;
        let n = nodes
            .entry(node.to_owned())
            .or_insert_with(|| NodeAgg::new(t.t_s, node_points(*columns), prelim));
        // The windows that ended before this tick are judged on the data before it, once: a
        // gap of any length costs one judgement, and the next window is found by arithmetic
        // (stepping 60 s at a time never ends where `t + 60 == t`).
        if t.t_s >= n.next_eval_s {
            let end = n.next_eval_s;
            n.evaluate(end, patience);
            n.next_eval_s = next_window(n.next_eval_s, t.t_s);
        }
        n.ticks += 1;
        n.first_s = n.first_s.min(t.t_s);
        n.last_s = n.last_s.max(t.t_s);
        for (c, _) in &t.cores {
            if !n.cores.contains(c) && caps.admit("cores", Some(node), "", n.cores.len(), MAX_CORES_PER_NODE)
            {
                n.cores.insert(*c);
            }
        }
        // The GPUs within the caps; the others' values are left out.
        if t.gpus_left_out > 0 {
            let e = caps.0.entry(("gpus", Some(node.to_owned()))).or_default();
            e.limit = MAX_GPUS_PER_NODE as u64;
            e.left_out += t.gpus_left_out;
        }
        let mut gpus: Vec<&(String, Option<f64>, Option<f64>)> = Vec::with_capacity(t.gpus.len());
        for g in &t.gpus {
            if n.gpus.contains_key(&g.0) {
                gpus.push(g);
            } else if caps.admit("gpus", Some(node), &g.0, n.gpus.len(), MAX_GPUS_PER_NODE)
                && caps.admit("gpus", None, &g.0, *gpu_count, MAX_GPUS)
            {
                n.gpus.insert(g.0.clone(), GpuAgg::default());
                *gpu_count += 1;
                gpus.push(g);
            }
        }
        let total = t.cpu_total();
        if let Some(v) = total {
            n.cpu_total.add(v);
        }
        if let Some(v) = t.memory {
            n.memory.add(v);
        }
        for (name, util, mem) in gpus.iter().copied() {
            let Some(g) = n.gpus.get_mut(name) else { continue };
            if let Some(u) = util {
                g.util.add(*u);
                push_last(&mut g.util_last, *u, GPU_WINDOW);
                push_last(&mut g.util_last_t, t.t_s, GPU_WINDOW);
            }
            if let Some(m) = mem {
                g.mem.add(*m);
            }
        }
        n.rules.tick(&TickView { tick: t, gpus: &gpus, cpu_total: total, patience });
        if let Some(p) = n.prelim.as_mut() {
            let patience = preliminary_patience(patience);
            p.tick(&TickView { tick: t, gpus: &gpus, cpu_total: total, patience });
        }
        // The decimated series: only the columns this tick has a value for.
        let mut row: Vec<(usize, f64)> = Vec::new();
        let mut put = |n: &mut NodeAgg<R>, name: String, v: Option<f64>| {
            if let Some(i) = n.col(node, name, columns, caps)
                && let Some(v) = v
            {
                row.push((i, v));
            }
        };
        put(n, "cpu_total".into(), total);
        for (c, v) in &t.cores {
            if n.cores.contains(c) {
                put(n, format!("core:{c:06}"), Some(*v));
            }
        }
        put(n, "memory".into(), t.memory);
        for (name, util, mem) in gpus.iter().copied() {
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
        if t.clock_synchronised.is_some() || t.clock_max_error_us.is_some() || t.clock_est_error_us.is_some()
        {
            n.clock.get_or_insert_with(ClockAgg::default).add(
                t.clock_synchronised,
                t.clock_max_error_us,
                t.clock_est_error_us,
            );
        }
        n.dec.push(t.t_s, &row);
        // Fewer points per node as the job's columns grow, so all series together stay
        // within `MAX_SERIES_CELLS`.
        let points = node_points(self.columns);
        if points != self.points {
            self.points = points;
            for n in self.nodes.values_mut() {
                n.dec.set_cap(points);
            }
        }
    }

    pub fn event(&mut self, e: &crate::reading::Event<'_>) {
        let rank = match self.rank_ids.get(e.node) {
            Some(&r) => r,
            None => {
                if !self.caps.admit("ranks", None, e.node, self.ranks.len(), MAX_RANKS) {
                    return;
                }
                let r = self.ranks.len() as u32;
                self.ranks.insert(e.node.to_owned());
                self.rank_ids.insert(e.node.to_owned(), r);
                r
            }
        };
        let end = e.start_us.saturating_add(e.dur_us);
        self.first_us = Some(self.first_us.map_or(e.start_us, |f| f.min(e.start_us)));
        self.last_us = Some(self.last_us.map_or(end, |f| f.max(end)));
        if e.ph != 'X' {
            if e.name == TRIGGER_EVENT
                && self.triggers.len() < MAX_TRIGGERS
                && let Some(t) = trigger(e)
            {
                self.triggers.push(t);
            }
            if e.name == timeline::REQUESTED_NAME
                && self.requested.len() < MAX_TRIGGERS
                && let Some(r) = requested(e)
            {
                self.requested.push(r);
            }
            if e.name == timeline::CAPPED_NAME
                && self.capped_windows.len() < MAX_TRIGGERS
                && let Some(c) = capped(e)
            {
                self.capped_windows.push(c);
            }
            return;
        }
        if let Some(mode) = step_mode(e.phase) {
            if let Some(step) = e.step {
                if !self.steps.contains_key(mode)
                    && !self.caps.admit("modes", None, mode, self.steps.len(), MAX_MODES)
                {
                    return;
                }
                let v = self.steps.entry(mode.to_owned()).or_default().entry(e.node.to_owned()).or_default();
                // The step table is most of the memory over many ranks: it grows by a quarter,
                // not by doubling, so its slack while read is at most a quarter
                // (`docs/report.md`, "Many ranks").
                if v.len() == v.capacity() {
                    v.reserve_exact((v.len() / 4).max(64));
                }
                v.push(StepRec { start_us: e.start_us, dur_us: e.dur_us, step });
                self.first_step_us = Some(self.first_step_us.map_or(e.start_us, |f| f.min(e.start_us)));
            }
            return;
        }
        if e.phase == timeline::MEMORY_PHASE {
            self.memory_events.event(e);
            return;
        }
        self.detailed_windows.event(e);
        self.collectives.event(e);
        // Phases past the cap are summed into one; `OTHER_PHASES` itself is not capped.
        let known = self.phases.contains_key(e.phase)
            || self.caps.admit("phases", None, e.phase, self.phases.len(), MAX_PHASES);
        let key = if known { e.phase } else { OTHER_PHASES };
        if let Some(p) = self.phases.get_mut(key) {
            p.0 += 1;
            p.1 = p.1.saturating_add(e.dur_us);
        } else {
            self.phases.insert(key.to_owned(), (1, e.dur_us));
        }
        if timeline::marks_detailed_step(e.phase)
            && let Some(s) = e.step
            && !self.detailed.contains(&(rank, s))
        {
            if self.detailed.len() < MAX_DETAILED {
                self.detailed.insert((rank, s));
            } else {
                self.caps.hit("detailed_steps", None, MAX_DETAILED);
            }
        }
        match e.phase {
            timeline::DATALOADER_ITER | timeline::DATALOADER_WORKER => {
                self.dataloader_events += 1;
                let second = e.start_us.div_euclid(1_000_000);
                if let Some(pid) = e.args.get("pid").and_then(serde_json::Value::as_i64) {
                    if !self.dataloader_pids.contains_key(&second)
                        && self.dataloader_pids.len() >= MAX_DATALOADER_SECONDS
                    {
                        self.caps.hit("dataloader_seconds", None, MAX_DATALOADER_SECONDS);
                    } else {
                        let pids = self.dataloader_pids.entry(second).or_default();
                        if pids.len() < 4096 && !pids.contains(&pid) {
                            if self.dataloader_pid_count < MAX_DATALOADER_PIDS {
                                pids.insert(pid);
                                self.dataloader_pid_count += 1;
                            } else {
                                self.caps.hit("dataloader_pids", None, MAX_DATALOADER_PIDS);
                            }
                        }
                    }
                }
                if self.dataloader_durations_s.len() < MAX_DATALOADER_DURATIONS {
                    self.dataloader_durations_s.push(e.dur_us as f64 / 1e6);
                }
            }
            timeline::DATALOADER_ITER_INITIALIZE => {
                self.dataloader_events += 1;
                if let Some(n) = e.args.get(timeline::NUM_WORKERS_KEY).and_then(serde_json::Value::as_i64) {
                    self.dataloader_num_workers = Some(n);
                }
                if let Some(b) = e.args.get(timeline::PIN_MEMORY_KEY).and_then(serde_json::Value::as_bool) {
                    self.dataloader_pin_memory = Some(b);
                }
            }
            _ => {}
        }
    }
}

/// The instant event of an anomaly trigger (`docs/formats.md`, "Anomaly-triggered windows").
pub const TRIGGER_EVENT: &str = timeline::TRIGGER_NAME;
/// Triggers kept (the hook allows at most 3600 an hour per rank).
pub const MAX_TRIGGERS: usize = 10_000;

/// A trigger from its event: `ts` is the slow step's end, so the step started `duration_ms`
/// before. `None` when the duration or the median is missing.
pub fn trigger(e: &crate::reading::Event<'_>) -> Option<crate::model::Trigger> {
    let f = |k: &str| e.args.get(k).and_then(serde_json::Value::as_f64).filter(|v| v.is_finite());
    let ms = f(timeline::trigger_key::DURATION_MS)?;
    let median_ms = f(timeline::trigger_key::MEDIAN_MS)?;
    let step = e.args.get(timeline::trigger_key::STEP).and_then(serde_json::Value::as_i64).or(e.step)?;
    // At most a few short names: the features are `detailed`, `dataloader`, `python`, `native`.
    let features = e.args.get(timeline::trigger_key::FEATURES).and_then(|v| v.as_array()).map(|a| {
        a.iter()
            .filter_map(|x| {
                x.as_str().filter(|s| s.len() <= 32).map(|s| crate::reading::shown(s).into_owned())
            })
            .take(8)
            .collect::<Vec<_>>()
    });
    Some(crate::model::Trigger {
        rank: e.node.to_owned(),
        step,
        ms,
        median_ms,
        start_s: e.start_us as f64 / 1e6 - ms / 1000.0,
        features,
        window_start_step: e
            .args
            .get(timeline::trigger_key::WINDOW_START_STEP)
            .and_then(serde_json::Value::as_i64),
        window_num_steps: e
            .args
            .get(timeline::trigger_key::WINDOW_NUM_STEPS)
            .and_then(serde_json::Value::as_i64),
    })
}

/// An on-demand window from its event; `None` without a request id.
pub fn requested(e: &crate::reading::Event<'_>) -> Option<crate::model::RequestedWindow> {
    use timeline::{requested_key, trigger_key};
    let id = e.args.get(requested_key::REQUEST_ID).and_then(|v| v.as_str()).filter(|s| s.len() <= 64)?;
    let int = |k: &str| e.args.get(k).and_then(serde_json::Value::as_i64);
    let features = e.args.get(trigger_key::FEATURES).and_then(|v| v.as_array()).map_or_else(Vec::new, |a| {
        a.iter()
            .filter_map(|x| {
                x.as_str().filter(|s| s.len() <= 32).map(|s| crate::reading::shown(s).into_owned())
            })
            .take(8)
            .collect()
    });
    Some(crate::model::RequestedWindow {
        request_id: crate::reading::shown(id).into_owned(),
        rank: e.node.to_owned(),
        start_s: e.start_us as f64 / 1e6,
        requested_s: int(requested_key::REQUESTED_US).map(|us| us as f64 / 1e6),
        features,
        window_start_step: int(trigger_key::WINDOW_START_STEP),
        window_num_steps: int(trigger_key::WINDOW_NUM_STEPS),
    })
}

/// A capped window from its event (docs/formats.md, "Window caps"); `None` when a key is
/// missing or a word is not one the hook writes.
pub fn capped(e: &crate::reading::Event<'_>) -> Option<crate::model::CappedWindow> {
    use timeline::capped_key;
    let word = |k: &str, words: &[&str]| {
        e.args.get(k).and_then(|v| v.as_str()).filter(|s| words.contains(s)).map(str::to_owned)
    };
    let uint = |k: &str| e.args.get(k).and_then(serde_json::Value::as_u64);
    Some(crate::model::CappedWindow {
        rank: e.node.to_owned(),
        feature: word(capped_key::FEATURE, &["detailed", "dataloader", "python", "native"])?,
        cap: word(capped_key::CAP, &timeline::CAP_WORDS)?,
        value: uint(capped_key::VALUE)?,
        limit: uint(capped_key::LIMIT)?,
        step: e.args.get(capped_key::STEP).and_then(serde_json::Value::as_i64).or(e.step)?,
        at_s: e.start_us as f64 / 1e6,
    })
}

/// `TRAIN` for `Step:ModeKeys.TRAIN`; `None` for a phase that is not a step.
pub fn step_mode(phase: &str) -> Option<&str> {
    timeline::step_mode(phase)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Agg;

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
    fn the_next_window_is_found_by_arithmetic() {
        assert_eq!(next_window(160.0, 160.0), 220.0);
        assert_eq!(next_window(160.0, 219.9), 220.0);
        assert_eq!(next_window(160.0, 220.0), 280.0);
        assert_eq!(next_window(160.0, 160.0 + 60.0 * 1e6 + 1.0), 160.0 + 60.0 * 1e6 + 60.0);
        // Where 60 s no longer moves a float of that size: no next window, never a loop.
        for t in [1e12, 1e17, 1e18, 1.7e308] {
            let n = next_window(1_795_400_060.0, t);
            assert!(n > t, "{t}: {n}");
        }
    }

    /// A `Timestamp` of 1e18 (`t + 60 == t`) stepped the windows forever, and 1e12 after a
    /// normal tick took 10.8 s: each now costs one judgement. Run on a thread so that a
    /// regression fails here instead of hanging the suite (a guard, not a timing).
    #[test]
    fn a_jump_in_time_costs_one_judgement() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            for far in [1e12, 1e18] {
                let mut a = Agg::new(Some(0));
                a.tick("algo-1", &tick(1_795_400_000.0, 95.0, 3.0, 10.0));
                a.tick("algo-1", &tick(far, 95.0, 3.0, 10.0));
                // More ticks at and around the far time, and one back in the present.
                a.tick("algo-1", &tick(far, 95.0, 3.0, 10.0));
                a.tick("algo-1", &tick(far * 1.5, 95.0, 3.0, 10.0));
                a.tick("algo-1", &tick(1_795_400_001.0, 95.0, 3.0, 10.0));
                a.finish();
                let n = &a.nodes["algo-1"];
                let judged = n.rules.of::<crate::rules::bottleneck::Bottleneck<false>>().verdicts.evaluations;
                out.push((far, judged, n.ticks));
            }
            let _ = tx.send(out);
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(120)).expect("Agg::tick did not return");
        // Judged at the first window's end, at the jump to 1.5 × far, and at the end: never
        // once per 60 s of the gap.
        for (far, judged, ticks) in got {
            assert_eq!(ticks, 5, "{far}");
            assert!((1..=3).contains(&judged), "{far}: {judged}");
        }
    }

    #[test]
    fn step_modes() {
        assert_eq!(step_mode("Step:ModeKeys.TRAIN"), Some("TRAIN"));
        assert_eq!(step_mode("Forward"), None);
    }

    #[test]
    fn a_trigger_event_becomes_a_trigger_and_a_bad_one_nothing() {
        let args: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            r#"{"pid": 7, "step_num": "30", "step": 31, "duration_ms": 200.5, "median_ms": 20.0,
                "features": ["detailed", "python"], "window_start_step": 32, "window_num_steps": 2}"#,
        )
        .unwrap();
        let e = crate::reading::Event {
            node: "0-algo-1",
            phase: "trainprof:AutoProfiling",
            name: TRIGGER_EVENT,
            ph: 'i',
            start_us: 10_000_000,
            dur_us: 0,
            step: Some(30),
            args: &args,
        };
        let mut agg = Agg::new(None);
        agg.event(&e);
        let [t] = agg.triggers.as_slice() else { panic!("{:?}", agg.triggers) };
        assert_eq!((t.rank.as_str(), t.step, t.ms, t.median_ms), ("0-algo-1", 31, 200.5, 20.0));
        assert!((t.start_s - (10.0 - 0.2005)).abs() < 1e-9);
        assert_eq!(t.features.as_deref(), Some(&["detailed".to_owned(), "python".to_owned()][..]));
        // No duration: not a trigger; another instant event: not a trigger.
        let mut bad = args.clone();
        bad.remove("duration_ms");
        assert!(trigger(&crate::reading::Event { args: &bad, ..e.clone() }).is_none());
        agg.event(&crate::reading::Event { name: "other", ..e });
        assert_eq!(agg.triggers.len(), 1);
    }

    #[test]
    fn a_capped_event_becomes_a_capped_window_and_a_bad_one_nothing() {
        let args: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            r#"{"pid": 7, "step_num": "4", "feature": "detailed", "cap": "events", "value": 6, "limit": 4, "step": 4}"#,
        )
        .unwrap();
        let e = crate::reading::Event {
            node: "0-algo-1",
            phase: timeline::CAPPED_PHASE,
            name: timeline::CAPPED_NAME,
            ph: 'i',
            start_us: 10_000_000,
            dur_us: 0,
            step: Some(4),
            args: &args,
        };
        let mut agg = Agg::new(None);
        agg.event(&e);
        let [c] = agg.capped_windows.as_slice() else { panic!("{:?}", agg.capped_windows) };
        assert_eq!(
            (c.feature.as_str(), c.cap.as_str(), c.value, c.limit, c.step),
            ("detailed", "events", 6, 4, 4)
        );
        assert_eq!(c.mark(), "stopped at its cap: 6 events at step 4");
        for (k, v) in [
            ("cap", serde_json::json!("<b>")),
            ("feature", serde_json::json!("gpu")),
            ("value", serde_json::json!(-1)),
        ] {
            let mut bad = args.clone();
            bad.insert(k.into(), v);
            assert!(capped(&crate::reading::Event { args: &bad, ..e.clone() }).is_none(), "{k}");
        }
        let mut bytes = args.clone();
        bytes.insert("cap".into(), serde_json::json!("bytes"));
        bytes.insert("value".into(), serde_json::json!(537_919_488));
        let c = capped(&crate::reading::Event { args: &bytes, ..e }).unwrap();
        assert_eq!(c.mark(), "stopped at its cap: 513 MiB of trainer memory growth at step 4");
    }

    #[test]
    fn the_clock_keeps_the_worst_reading() {
        let mut c = ClockAgg::default();
        c.add(Some(1.0), Some(500.0), Some(20.0));
        c.add(Some(0.0), Some(16_000.0), None);
        c.add(Some(1.0), Some(800.0), Some(30.0));
        assert_eq!(
            c,
            ClockAgg {
                readings: 3,
                unsynchronised: 1,
                max_error_us: Some(16_000.0),
                est_error_us: Some(30.0)
            }
        );
        let mut agg = Agg::new(None);
        let t = Tick {
            t_s: 1.0,
            clock_synchronised: Some(1.0),
            clock_max_error_us: Some(9.0),
            ..Tick::default()
        };
        agg.tick("algo-1", &t);
        let got = agg.nodes["algo-1"].clock.clone();
        assert_eq!(
            got,
            Some(ClockAgg { readings: 1, unsynchronised: 0, max_error_us: Some(9.0), est_error_us: None })
        );
    }
}
