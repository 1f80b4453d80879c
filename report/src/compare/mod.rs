//! `trainprof compare A B` (docs/report.md, "compare"): two jobs read with the report's
//! rules ([`crate::build_with`]), their step times per mode compared with a bootstrap
//! interval of the ratio of medians ([`stats`]), what moved (phases, Python functions, system
//! metrics, findings), what makes the two hard to compare, and the CI gate. The page is
//! [`page::render`].
//!
//! Each job is read in two passes over its timelines: the report's own pass (which also
//! notes the detailed windows' steps), then, once every step and window is known, a second
//! pass that adds each phase event to the step it starts in when that step is kept. Memory
//! is the report's plus a few numbers per phase and per profiled step.

pub mod page;
pub mod stats;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};
use trainprof_output::fs::Dir;
use trainprof_output::protocol::timeline;

use crate::analysis::collect::{MAX_DETAILED, MAX_PHASES, OTHER_PHASES, step_mode};
use crate::analysis::steps::StepRec;
use crate::model::{PythonGroupKind, ReportModel};
pub use stats::{Ratio, Verdict};

/// The version of the `--json` shape.
pub const VERSION: u32 = 1;
/// Warm-up steps left out at the start of each rank's steps of each mode.
pub const DEFAULT_WARMUP: usize = 10;
/// The default practical threshold, per cent.
pub const DEFAULT_NOISE_PCT: f64 = 1.0;
/// Kept steps below which a side's statistics are called weak in the comparability list.
pub const FEW_STEPS: usize = 30;
/// Rows of each movers list kept.
pub const MAX_MOVERS: usize = 50;
/// Python functions compared per side (by their time per profiled step).
pub const MAX_FUNCTIONS: usize = 200;

/// The settings of one comparison.
#[derive(Debug, Clone)]
pub struct Options {
    /// Only this mode (`TRAIN`, `EVAL`, …; case ignored); `None`: every mode both have.
    pub mode: Option<String>,
    /// The practical threshold, per cent.
    pub noise_pct: f64,
    /// Warm-up steps left out per rank and mode.
    pub warmup: usize,
    /// `--fail-if-slower PCT`.
    pub fail_if_slower: Option<f64>,
    /// Bootstrap resamples.
    pub resamples: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            mode: None,
            noise_pct: DEFAULT_NOISE_PCT,
            warmup: DEFAULT_WARMUP,
            fail_if_slower: None,
            resamples: stats::RESAMPLES,
        }
    }
}

/// One job, read.
#[derive(Debug)]
pub struct Run {
    pub model: ReportModel,
    /// Per mode: the kept steps' durations (ms, sorted) and what was left out.
    pub modes: BTreeMap<String, ModeRun>,
    /// Per system node: ticks, first and last tick time.
    pub node_ticks: BTreeMap<String, (u64, f64, f64)>,
    /// Per system node with pressure lines: the time axis and the CPU, memory and I/O
    /// "some" stall percentages, decimated.
    pub pressure: Vec<Decimated>,
}

/// A decimated series: its time axis and its columns (a missing value `None`).
pub type Decimated = (Vec<f64>, Vec<Vec<Option<f64>>>);

/// One mode of one job.
#[derive(Debug, Default, Clone)]
pub struct ModeRun {
    /// Kept step durations, ms, sorted.
    pub ms: Vec<f64>,
    pub warmup: u64,
    pub windows: u64,
    /// The kept steps' span (epoch s): the first start and the last end.
    pub span: Option<(f64, f64)>,
    /// phase → its time inside kept steps.
    pub phases: BTreeMap<String, PhaseStat>,
}

/// One phase's time inside the kept steps of one mode.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PhaseStat {
    pub total_us: i64,
    pub events: u64,
    /// Kept steps with at least one event of the phase.
    pub steps_with: u64,
    /// The median over the kept steps of the phase's time in each (0 in a step without it),
    /// ms; `None` past [`MAX_PHASE_ENTRIES`].
    pub median_ms: Option<f64>,
}

/// (step, µs) pairs kept while reading, for the phases' medians: 32 MB at most. Past it the
/// movers use means.
pub const MAX_PHASE_ENTRIES: usize = 4_000_000;

/// A step of one rank, for the second pass.
#[derive(Debug, Clone, Copy)]
struct Slot {
    start: i64,
    end: i64,
    mode: usize,
    /// The step's index among its mode's kept steps; `None`: left out.
    kept: Option<u32>,
}

/// Reads the job at `root` with the report's rules and splits its steps (docs/report.md,
/// "compare": warm-up and profiled windows).
pub fn load(root: &Path, source: &str, opts: &crate::Options, warmup: usize) -> Result<Run, crate::Error> {
    // Pass 1: the report, and per rank the time each step with detailed events spans.
    let mut detailed: HashMap<String, HashMap<i64, (i64, i64)>> = HashMap::new();
    let mut detailed_n = 0usize;
    // Pressure stalls per node, decimated as the report's series are (`docs/report.md`).
    let mut pressure: BTreeMap<String, crate::analysis::stats::Decimator> = BTreeMap::new();
    let on_tick = |node: &str, t: &crate::reading::Tick| {
        let row: Vec<(usize, f64)> =
            t.pressure.iter().enumerate().filter_map(|(i, v)| v.map(|v| (i, v))).collect();
        if row.is_empty() {
            return;
        }
        if let Some(d) = pressure.get_mut(node) {
            d.push(t.t_s, &row);
        } else if pressure.len() < crate::analysis::collect::MAX_NODES
            && node.len() <= crate::analysis::collect::MAX_NAME_BYTES
        {
            let mut d = crate::analysis::stats::Decimator::new(crate::analysis::collect::NODE_POINTS);
            d.push(t.t_s, &row);
            pressure.insert(node.to_owned(), d);
        }
    };
    let (model, raw) = crate::build_with(root, source, opts, on_tick, |e| {
        if e.ph != 'X' || !timeline::marks_detailed_step(e.phase) {
            return;
        }
        let Some(step) = e.step else { return };
        let end = e.start_us.saturating_add(e.dur_us);
        if let Some(w) = detailed.get_mut(e.node).and_then(|r| r.get_mut(&step)) {
            *w = (w.0.min(e.start_us), w.1.max(end));
            return;
        }
        if detailed_n < MAX_DETAILED {
            detailed_n += 1;
            detailed.entry(e.node.to_owned()).or_default().insert(step, (e.start_us, end));
        }
    })?;
    // The windows of each rank, as merged, sorted time intervals (µs).
    let mut windows: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    for (rank, steps) in detailed {
        windows.entry(rank).or_default().extend(steps.into_values());
    }
    let python = model.python.iter().map(|w| (&w.node, w.start_s, w.end_s));
    let native = model.native.iter().map(|w| (&w.node, w.start_s, w.end_s));
    for (node, start, end) in python.chain(native) {
        if let (Some(a), Some(b)) = (start, end) {
            windows
                .entry(node.clone())
                .or_default()
                .push(((a * 1e6).ceil() as i64, (b * 1e6).floor() as i64));
        }
    }
    for v in windows.values_mut() {
        *v = merge(std::mem::take(v));
    }
    // Each rank's steps of every mode, in time order, kept or not.
    let mode_names: Vec<String> = raw.steps.keys().cloned().collect();
    let mut modes: BTreeMap<String, ModeRun> = BTreeMap::new();
    let mut slots: HashMap<String, Vec<Slot>> = HashMap::new();
    for (mi, (mode, ranks)) in raw.steps.iter().enumerate() {
        let m = modes.entry(mode.clone()).or_default();
        let mut span: Option<(i64, i64)> = None;
        for (rank, steps) in ranks {
            let mut v: Vec<StepRec> = steps.clone();
            v.sort_by_key(|s| s.start_us);
            let win = windows.get(rank).map(Vec::as_slice).unwrap_or(&[]);
            let mut after_window = false;
            for (i, s) in v.iter().enumerate() {
                let end = s.start_us.saturating_add(s.dur_us);
                let in_window = overlaps(win, s.start_us, end);
                let kept = if i < warmup {
                    m.warmup += 1;
                    false
                } else if in_window || after_window {
                    m.windows += 1;
                    false
                } else {
                    true
                };
                // The step right after a window pays for its teardown: left out too.
                after_window = in_window;
                let kept = kept.then(|| {
                    m.ms.push(s.dur_us as f64 / 1000.0);
                    span = Some(span.map_or((s.start_us, end), |(a, b)| (a.min(s.start_us), b.max(end))));
                    u32::try_from(m.ms.len() - 1).unwrap_or(u32::MAX)
                });
                slots.entry(rank.clone()).or_default().push(Slot { start: s.start_us, end, mode: mi, kept });
            }
        }
        m.ms.sort_by(f64::total_cmp);
        m.span = span.map(|(a, b)| (a as f64 / 1e6, b as f64 / 1e6));
    }
    for v in slots.values_mut() {
        v.sort_by_key(|s| s.start);
    }
    // Pass 2: each phase event into the kept step it starts in.
    type Acc = (i64, u64, Vec<(u32, u32)>);
    let mut phases: Vec<BTreeMap<String, Acc>> = vec![BTreeMap::new(); mode_names.len()];
    let mut names: BTreeSet<String> = BTreeSet::new();
    let mut entries = 0usize;
    let mut capped = false;
    if let Ok(dir) = Dir::open_root(root, false) {
        let mut skipped = crate::reading::Skipped::leaving_out(opts.leave_out.clone());
        crate::reading::timeline_events(&dir, &mut skipped, &|_, _| true, |e| {
            if e.ph != 'X' || step_mode(e.phase).is_some() {
                return;
            }
            let Some(v) = slots.get(e.node) else { return };
            let i = v.partition_point(|s| s.start <= e.start_us);
            let Some(s) = i.checked_sub(1).map(|i| v[i]) else { return };
            let Some(idx) = s.kept else { return };
            if e.start_us >= s.end {
                return;
            }
            let us = u32::try_from(e.dur_us.max(0)).unwrap_or(u32::MAX);
            let mut entry = |v: &mut Vec<(u32, u32)>| {
                if let Some(l) = v.last_mut().filter(|l| l.0 == idx) {
                    l.1 = l.1.saturating_add(us);
                } else if entries < MAX_PHASE_ENTRIES {
                    entries += 1;
                    v.push((idx, us));
                } else {
                    capped = true;
                }
            };
            let known =
                names.contains(e.phase) || names.len() < MAX_PHASES && names.insert(e.phase.to_owned());
            let key = if known { e.phase } else { OTHER_PHASES };
            let p = &mut phases[s.mode];
            if let Some(x) = p.get_mut(key) {
                x.0 = x.0.saturating_add(e.dur_us);
                x.1 += 1;
                entry(&mut x.2);
            } else {
                let mut v = Vec::new();
                entry(&mut v);
                p.insert(key.to_owned(), (e.dur_us, 1, v));
            }
        });
    }
    for (name, p) in mode_names.iter().zip(phases) {
        if let Some(m) = modes.get_mut(name) {
            let kept = m.ms.len();
            m.phases = p
                .into_iter()
                .map(|(k, (total_us, events, v))| {
                    let (steps_with, median_ms) = per_step_median(v, kept);
                    (k, PhaseStat { total_us, events, steps_with, median_ms: median_ms.filter(|_| !capped) })
                })
                .collect();
        }
    }
    let pressure = pressure.into_values().map(|d| d.finish(3)).collect();
    Ok(Run { model, modes, node_ticks: raw.node_ticks, pressure })
}

/// From (kept step, µs) pairs: the steps with the phase, and the median over all `kept`
/// steps of the phase's ms in each (0 where absent).
fn per_step_median(mut v: Vec<(u32, u32)>, kept: usize) -> (u64, Option<f64>) {
    v.sort_unstable_by_key(|x| x.0);
    let mut ms: Vec<f64> = Vec::with_capacity(kept);
    let mut last: Option<u32> = None;
    for (i, us) in v {
        if last == Some(i) {
            if let Some(x) = ms.last_mut() {
                *x += f64::from(us) / 1000.0;
            }
        } else {
            ms.push(f64::from(us) / 1000.0);
            last = Some(i);
        }
    }
    let with = ms.len() as u64;
    ms.resize(kept.max(ms.len()), 0.0);
    ms.sort_by(f64::total_cmp);
    (with, stats::median(&ms))
}

/// Sorted, merged intervals.
fn merge(mut v: Vec<(i64, i64)>) -> Vec<(i64, i64)> {
    v.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Whether [start, end) overlaps one of the sorted, merged intervals.
fn overlaps(win: &[(i64, i64)], start: i64, end: i64) -> bool {
    // The first interval that ends after `start`.
    let i = win.partition_point(|w| w.1 <= start);
    win.get(i).is_some_and(|w| w.0 < end.max(start.saturating_add(1)))
}

// ---------------------------------------------------------------------------------------------
// The comparison: what `--json` prints and the page draws.

/// The whole comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    pub version: u32,
    pub a: Side,
    pub b: Side,
    pub noise_pct: f64,
    pub warmup: usize,
    pub comparable: Comparable,
    /// Per mode compared.
    pub steps: BTreeMap<String, StepComparison>,
    /// The mode the movers and the gate are about.
    pub mode: Option<String>,
    pub movers: Vec<Mover>,
    pub system: Vec<SystemMover>,
    pub findings: Vec<FindingChange>,
    pub gate: Option<Gate>,
}

/// What identifies a side.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Side {
    pub source: String,
    pub start_s: Option<f64>,
    pub duration_s: Option<f64>,
    pub ranks: usize,
    pub nodes: usize,
    pub gpus: usize,
    /// Entries left alone while reading (`job.skipped` of its report).
    pub skipped: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparable {
    /// False when an item `differs`.
    pub ok: bool,
    pub items: Vec<Item>,
}

/// One thing checked for comparability.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Item {
    pub what: String,
    pub a: String,
    pub b: String,
    pub status: Status,
    pub note: String,
}

/// An [`Item`]'s status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Same,
    /// The comparison is weaker for it.
    Differs,
    /// A side has little data.
    Weak,
    /// The files do not say.
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Same => "same",
            Status::Differs => "differs",
            Status::Weak => "weak",
            Status::Unknown => "unknown",
        }
    }
}

/// What a [`Mover`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoverKind {
    Phase,
    /// A function in the Python windows.
    Python,
    /// A kernel class or op of the detailed windows.
    Detailed,
}

impl MoverKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MoverKind::Phase => "phase",
            MoverKind::Python => "python",
            MoverKind::Detailed => "detailed",
        }
    }
}

/// How a [`Mover`]'s times are taken over the steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoverStat {
    /// Per kept step.
    Median,
    /// Per kept step; per profiled step for `python`.
    Mean,
}

impl MoverStat {
    pub fn as_str(self) -> &'static str {
        match self {
            MoverStat::Median => "median",
            MoverStat::Mean => "mean",
        }
    }
}

/// One side's steps of one mode.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct SideSteps {
    pub steps: u64,
    pub kept: u64,
    pub warmup_left_out: u64,
    pub window_left_out: u64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub mean_ms: Option<f64>,
    /// 30 bins over both sides' range (the page's overlay).
    pub histogram: Vec<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepComparison {
    pub a: SideSteps,
    pub b: SideSteps,
    /// B's median ÷ A's; `null` when a side has no kept step.
    pub ratio: Option<f64>,
    pub ci: Option<[f64; 2]>,
    pub change_pct: Option<f64>,
    pub ci_pct: Option<[f64; 2]>,
    /// `slower`, `faster`, `same`; `null` without a ratio.
    pub verdict: Option<Verdict>,
    pub text: String,
    /// The histogram's 31 edges, ms.
    pub edges_ms: Vec<f64>,
}

/// Something that moved, in ms per step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mover {
    /// `phase`, `python` (a function in the Python windows) or `detailed` (a kernel class or
    /// op of the detailed windows).
    pub kind: MoverKind,
    pub name: String,
    /// `median` (per kept step) or `mean` (per kept step; per profiled step for `python`).
    pub stat: MoverStat,
    pub a_ms: f64,
    pub b_ms: f64,
    pub diff_ms: f64,
    /// `diff_ms` ÷ the change of the median kept step; `null` when the verdict is `same`.
    pub explains: Option<f64>,
}

/// A system metric over the kept steps' span.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SystemMover {
    pub metric: String,
    pub unit: String,
    pub a: Option<f64>,
    pub b: Option<f64>,
    pub diff: Option<f64>,
    /// `diff ÷ a`, for the order.
    pub rel: Option<f64>,
}

/// A finding that differs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FindingChange {
    pub rule: String,
    /// `triggered`, `not triggered`, `not evaluated` or `absent`.
    pub a: String,
    pub b: String,
    pub a_summary: String,
    pub b_summary: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Gate {
    pub mode: String,
    pub pct: f64,
    pub failed: bool,
    pub why: String,
}

fn side(run: &Run) -> Side {
    let m = &run.model;
    Side {
        source: m.source.clone(),
        start_s: m.job.start_s,
        duration_s: m.job.duration_s,
        ranks: m.job.ranks.len(),
        nodes: m.job.nodes.len(),
        gpus: gpus(m),
        skipped: m.job.skipped.len(),
    }
}

fn gpus(m: &ReportModel) -> usize {
    m.series.as_ref().map_or(0, |s| s.nodes.values().map(|n| n.gpus.len()).sum())
}

/// The modes compared: `opts.mode` (case ignored), else every mode both have.
fn modes_compared(a: &Run, b: &Run, opts: &Options) -> Vec<String> {
    let both: Vec<String> = a.modes.keys().filter(|m| b.modes.contains_key(*m)).cloned().collect();
    match &opts.mode {
        Some(want) => both.into_iter().filter(|m| m.eq_ignore_ascii_case(want)).collect(),
        None => both,
    }
}

/// Compares `a` with `b`.
pub fn compare(a: &Run, b: &Run, opts: &Options) -> Comparison {
    let modes = modes_compared(a, b, opts);
    let steps: BTreeMap<String, StepComparison> =
        modes.iter().map(|m| (m.clone(), step_comparison(&a.modes[m], &b.modes[m], opts))).collect();
    // The mode of the movers and the gate: the one asked for, else TRAIN, else the one with
    // the most kept steps.
    let mode = modes
        .iter()
        .find(|m| m.as_str() == "TRAIN")
        .or_else(|| modes.iter().max_by_key(|m| a.modes[*m].ms.len().min(b.modes[*m].ms.len())))
        .cloned();
    let (movers, system) = match &mode {
        Some(m) => {
            // A change within the noise explains nothing: no `explains` then.
            let moved = steps.get(m).is_some_and(|s| s.verdict.is_some_and(|v| v != Verdict::Same));
            (time_movers(a, b, m, moved), system_movers(a, b, m))
        }
        None => (Vec::new(), Vec::new()),
    };
    let gate = opts.fail_if_slower.map(|pct| gate(&steps, mode.as_deref(), opts.mode.as_deref(), pct));
    Comparison {
        version: VERSION,
        a: side(a),
        b: side(b),
        noise_pct: opts.noise_pct,
        warmup: opts.warmup,
        comparable: comparable(a, b),
        steps,
        mode,
        movers,
        system,
        findings: findings(&a.model, &b.model),
        gate,
    }
}

fn side_steps(m: &ModeRun, edges: &[f64]) -> SideSteps {
    let mut histogram = vec![0u64; edges.len().saturating_sub(1)];
    let bins = histogram.len();
    if bins > 0 {
        let (lo, hi) = (edges[0], edges[edges.len() - 1]);
        let w = (hi - lo) / bins as f64;
        for &x in &m.ms {
            let i = if w > 0.0 { ((x - lo) / w).max(0.0) as usize } else { 0 };
            histogram[i.min(bins - 1)] += 1;
        }
    }
    SideSteps {
        steps: m.ms.len() as u64 + m.warmup + m.windows,
        kept: m.ms.len() as u64,
        warmup_left_out: m.warmup,
        window_left_out: m.windows,
        p50_ms: stats::median(&m.ms),
        p90_ms: crate::analysis::stats::quantile_sorted(&m.ms, 0.9),
        mean_ms: crate::analysis::stats::mean(&m.ms),
        histogram,
    }
}

/// 31 edges over both sides' steps, from the shortest to the larger p99 (a few stalls do not
/// squeeze the rest into one bin; the last bin holds everything above).
fn overlay_edges(a: &[f64], b: &[f64]) -> Vec<f64> {
    let lo = a.first().copied().into_iter().chain(b.first().copied()).reduce(f64::min);
    let hi = [a, b].iter().filter_map(|v| crate::analysis::stats::quantile_sorted(v, 0.99)).reduce(f64::max);
    match (lo, hi) {
        (Some(lo), Some(hi)) => {
            let hi = if hi > lo { hi } else { lo + 1.0 };
            (0..=30).map(|i| lo + (hi - lo) * f64::from(i) / 30.0).collect()
        }
        _ => Vec::new(),
    }
}

fn step_comparison(a: &ModeRun, b: &ModeRun, opts: &Options) -> StepComparison {
    let edges_ms = overlay_edges(&a.ms, &b.ms);
    let r = stats::median_ratio(&a.ms, &b.ms, opts.resamples, stats::SEED);
    StepComparison {
        a: side_steps(a, &edges_ms),
        b: side_steps(b, &edges_ms),
        ratio: r.map(|r| r.ratio),
        ci: r.map(|r| [r.lo, r.hi]),
        change_pct: r.map(|r| (r.ratio - 1.0) * 100.0),
        ci_pct: r.map(|r| [(r.lo - 1.0) * 100.0, (r.hi - 1.0) * 100.0]),
        verdict: r.map(|r| stats::verdict(&r, opts.noise_pct)),
        text: match r {
            Some(r) => stats::verdict_text(&r, opts.noise_pct),
            None => "not compared: a side has no kept step with a positive median".into(),
        },
        edges_ms,
    }
}

/// The gate on `mode` (`asked`: `--mode`, for the message).
fn gate(steps: &BTreeMap<String, StepComparison>, mode: Option<&str>, asked: Option<&str>, pct: f64) -> Gate {
    let Some(mode) = mode else {
        let why = match asked {
            Some(m) => format!("no {} steps in both runs to compare", m.to_uppercase()),
            None => "no step mode in both runs to compare".into(),
        };
        return Gate { mode: asked.unwrap_or("").to_uppercase(), pct, failed: false, why };
    };
    let s = &steps[mode];
    let (Some(ratio), Some([lo, hi])) = (s.ratio, s.ci) else {
        return Gate { mode: mode.into(), pct, failed: false, why: format!("{mode}: {}", s.text) };
    };
    let r = Ratio { ratio, lo, hi };
    let failed = stats::gate_fails(&r, pct);
    let p = stats::pct;
    let why = if failed {
        format!("{mode}: {}: slower by more than {} % (--fail-if-slower)", s.text, p(pct))
    } else if ratio > 1.0 + pct / 100.0 {
        format!(
            "{mode}: {}: over {} %, but the interval reaches down to {} %, so not failed",
            s.text,
            p(pct),
            p((lo - 1.0) * 100.0)
        )
    } else {
        format!("{mode}: {}: within {} % (--fail-if-slower)", s.text, p(pct))
    };
    Gate { mode: mode.into(), pct, failed, why }
}

/// Phases, Python functions and (once the report has them) the detailed windows' classes,
/// ms per step, largest change first.
fn time_movers(a: &Run, b: &Run, mode: &str, moved: bool) -> Vec<Mover> {
    let (ma, mb) = (&a.modes[mode], &b.modes[mode]);
    let delta = match (stats::median(&ma.ms), stats::median(&mb.ms)) {
        (Some(x), Some(y)) if y != x && moved => Some(y - x),
        _ => None,
    };
    let mut out = Vec::new();
    let names: BTreeSet<&String> = ma.phases.keys().chain(mb.phases.keys()).collect();
    for name in names {
        let (pa, pb) = (ma.phases.get(name), mb.phases.get(name));
        // The median per step where the phase is in at least half the kept steps of both
        // runs (robust to a stalled step); else the mean per step.
        let typical = |p: Option<&PhaseStat>, m: &ModeRun| {
            p.is_some_and(|p| p.median_ms.is_some() && 2 * p.steps_with as usize >= m.ms.len())
        };
        let (x, y, stat) = if typical(pa, ma) && typical(pb, mb) {
            (
                pa.and_then(|p| p.median_ms).unwrap_or(0.0),
                pb.and_then(|p| p.median_ms).unwrap_or(0.0),
                MoverStat::Median,
            )
        } else {
            let mean = |p: Option<&PhaseStat>, m: &ModeRun| match p {
                Some(p) if !m.ms.is_empty() => p.total_us as f64 / 1000.0 / m.ms.len() as f64,
                _ => 0.0,
            };
            (mean(pa, ma), mean(pb, mb), MoverStat::Mean)
        };
        let mut m = mover(MoverKind::Phase, name, x, y, delta);
        m.stat = stat;
        out.push(m);
    }
    let (pa, pb) = (python_per_step(&a.model), python_per_step(&b.model));
    // A function absent from a full top list is below it, not at 0: left out.
    let full = |m: &BTreeMap<String, f64>| m.len() >= crate::reading::python::TOP_MERGED;
    let (fa, fb) = (full(&pa), full(&pb));
    let keys: BTreeSet<&String> = pa.keys().chain(pb.keys()).collect();
    for k in keys {
        let (x, y) = (pa.get(k).copied(), pb.get(k).copied());
        if (x.is_none() && fa) || (y.is_none() && fb) {
            continue;
        }
        out.push(mover(MoverKind::Python, k, x.unwrap_or(0.0), y.unwrap_or(0.0), delta));
    }
    out.extend(detailed_movers(&a.model, &b.model, delta));
    out.retain(|m| m.a_ms != 0.0 || m.b_ms != 0.0);
    out.sort_by(|x, y| y.diff_ms.abs().total_cmp(&x.diff_ms.abs()).then_with(|| x.name.cmp(&y.name)));
    out.truncate(MAX_MOVERS);
    out
}

fn mover(kind: MoverKind, name: &str, a_ms: f64, b_ms: f64, delta: Option<f64>) -> Mover {
    let diff_ms = b_ms - a_ms;
    Mover {
        kind,
        name: name.into(),
        stat: MoverStat::Mean,
        a_ms,
        b_ms,
        diff_ms,
        explains: delta.map(|d| diff_ms / d),
    }
}

/// The detailed windows' breakdown (`model.detailed`, docs/report.md, "Detailed windows"),
/// ms per profiled step (the job's totals over every window ÷ the windows' steps): the
/// kernel classes (`class: …`), the GPU's idle categories (`idle: …`), the top kernels
/// (`kernel: …`, their time) and top ops (`op: …`, their self time). A kernel or op in one
/// side's top list only counts as 0 on the other side when that side's list is not full
/// (else it is just below the other's top and left out). Nothing when either job has no
/// detailed window.
fn detailed_movers(a: &ReportModel, b: &ReportModel, delta: Option<f64>) -> Vec<Mover> {
    let (Some(fa), Some(fb)) = (detailed_per_step(a), detailed_per_step(b)) else { return Vec::new() };
    let mut out = Vec::new();
    let keys: BTreeSet<&String> = fa.0.keys().chain(fb.0.keys()).collect();
    for k in keys {
        let (x, y) = (fa.0.get(k), fb.0.get(k));
        // Absent from a full top list: unknown, not 0.
        let known = |v: Option<&f64>, full: &BTreeSet<&'static str>| {
            v.copied().or_else(|| (!full.iter().any(|p| k.starts_with(p))).then_some(0.0))
        };
        if let (Some(x), Some(y)) = (known(x, &fa.1), known(y, &fb.1)) {
            out.push(mover(MoverKind::Detailed, k, x, y, delta));
        }
    }
    out
}

/// One job's detailed figures per profiled step: name → ms, and the prefixes whose top list
/// is full.
fn detailed_per_step(m: &ReportModel) -> Option<(BTreeMap<String, f64>, BTreeSet<&'static str>)> {
    let d = &m.detailed;
    let total = d.total.as_ref()?;
    let listed: u64 = d.windows.iter().map(|w| w.steps).sum();
    // Windows past the list's cap are in the totals: their steps estimated at the mean.
    let steps = if d.windows.is_empty() {
        total.windows
    } else {
        listed * total.windows.max(d.windows.len() as u64) / d.windows.len() as u64
    }
    .max(1) as f64;
    let mut v = BTreeMap::new();
    for c in &total.classes {
        v.insert(format!("class: {}", c.name), c.ms / steps);
    }
    for c in &total.idle {
        v.insert(format!("idle: {}", c.name), c.ms / steps);
    }
    for k in &total.top_kernels {
        v.insert(format!("kernel: {}", k.name), k.total_ms / steps);
    }
    for o in &total.top_ops {
        v.insert(format!("op: {}", o.name), o.self_ms / steps);
    }
    let mut full = BTreeSet::new();
    if total.top_kernels.len() >= crate::analysis::detailed::TOP {
        full.insert("kernel: ");
    }
    if total.top_ops.len() >= crate::analysis::detailed::TOP {
        full.insert("op: ");
    }
    Some((v, full))
}

/// Per Python function (`name (file:line)`): its total time over the job's step windows
/// (`python_summary.top`: the windows before the first step and after close profile setup
/// and teardown, and are left out), ms per profiled step (the step windows' steps, `last_step
/// − first_step + 1` each).
fn python_per_step(m: &ReportModel) -> BTreeMap<String, f64> {
    let steps: i64 = m
        .python_summary
        .windows
        .iter()
        .filter(|g| g.kind == PythonGroupKind::Steps)
        .map(|g| match (g.first_step, g.last_step) {
            (Some(a), Some(b)) if b >= a => b - a + 1,
            _ => 1,
        })
        .sum();
    let steps = steps.max(1) as f64;
    m.python_summary
        .top
        .functions
        .iter()
        .take(MAX_FUNCTIONS)
        .map(|f| {
            let key = match f.line {
                Some(l) => format!("{} ({}:{l})", f.name, f.file),
                None => format!("{} ({})", f.name, f.file),
            };
            (key, f.total_s * 1000.0 / steps)
        })
        .collect()
}

/// The mean of `values` whose time is within `span`.
fn mean_in(t: &[f64], values: &[Option<f64>], span: Option<(f64, f64)>) -> Option<(f64, usize)> {
    let (mut sum, mut n) = (0.0, 0usize);
    for (i, v) in values.iter().enumerate() {
        let (Some(v), Some(&ti)) = (v, t.get(i)) else { continue };
        if span.is_none_or(|(a, b)| ti >= a && ti <= b) {
            sum += v;
            n += 1;
        }
    }
    (n > 0).then(|| (sum / n as f64, n))
}

/// The system metrics of a run over the kept steps' span of `mode`: per metric, the mean of
/// the nodes' (and GPUs') means.
fn system_means(run: &Run, mode: &str) -> BTreeMap<&'static str, f64> {
    let mut acc: BTreeMap<&'static str, (f64, usize)> = BTreeMap::new();
    let span = run.modes.get(mode).and_then(|m| m.span);
    let no_series = crate::model::Series::default();
    let series = run.model.series.as_ref().unwrap_or(&no_series);
    let mut add = |k: &'static str, t: &[f64], v: &[Option<f64>]| {
        // Too short a span for the decimated series (a few ticks): the whole series.
        let m = mean_in(t, v, span).or_else(|| mean_in(t, v, None));
        if let Some((m, _)) = m {
            let e = acc.entry(k).or_default();
            e.0 += m;
            e.1 += 1;
        }
    };
    for n in series.nodes.values() {
        add("CPU total", &n.t_s, &n.cpu_total);
        add("memory", &n.t_s, &n.memory);
        for g in n.gpus.values() {
            add("GPU utilisation", &n.t_s, &g.util);
            add("GPU memory", &n.t_s, &g.mem);
        }
        if let Some(io) = &n.io {
            add("disk read", &n.t_s, &io.read_mbps);
            add("disk write", &n.t_s, &io.write_mbps);
        }
        if let Some(net) = &n.net {
            add("network received", &n.t_s, &net.rx_mbps);
            add("network sent", &n.t_s, &net.tx_mbps);
        }
        if let Some(tr) = &n.trainer {
            add("trainer CPU", &n.t_s, &tr.cpu);
            add("trainer memory", &n.t_s, &tr.mem_mb);
        }
    }
    for (t, cols) in &run.pressure {
        for (k, v) in ["CPU pressure", "memory pressure", "I/O pressure"].into_iter().zip(cols) {
            add(k, t, v);
        }
    }
    acc.into_iter().map(|(k, (s, n))| (k, s / n as f64)).collect()
}

fn unit(metric: &str) -> &'static str {
    match metric {
        "disk read" | "disk write" | "network received" | "network sent" => "MB/s",
        "trainer CPU" => "% of a core",
        "trainer memory" => "MB",
        _ => "%",
    }
}

fn system_movers(a: &Run, b: &Run, mode: &str) -> Vec<SystemMover> {
    let (sa, sb) = (system_means(a, mode), system_means(b, mode));
    let keys: BTreeSet<&&str> = sa.keys().chain(sb.keys()).collect();
    let mut out: Vec<SystemMover> = keys
        .into_iter()
        .map(|k| {
            let (x, y) = (sa.get(k).copied(), sb.get(k).copied());
            let diff = x.zip(y).map(|(x, y)| y - x);
            let rel = x.zip(diff).and_then(|(x, d)| (x.abs() > 1e-9).then(|| d / x.abs()));
            SystemMover { metric: (*k).to_owned(), unit: unit(k).into(), a: x, b: y, diff, rel }
        })
        .collect();
    out.sort_by(|x, y| {
        let key = |m: &SystemMover| m.rel.map_or(f64::INFINITY, f64::abs);
        key(y).total_cmp(&key(x)).then_with(|| x.metric.cmp(&y.metric))
    });
    out
}

fn finding_state(m: &ReportModel, rule: &str) -> (String, String) {
    match m.findings.iter().find(|f| f.rule == rule) {
        Some(f) if f.triggered => ("triggered".into(), f.summary.clone()),
        Some(f) if f.evaluated => ("not triggered".into(), f.summary.clone()),
        Some(f) => ("not evaluated".into(), f.summary.clone()),
        None => ("absent".into(), String::new()),
    }
}

fn findings(a: &ReportModel, b: &ReportModel) -> Vec<FindingChange> {
    let mut rules: Vec<&str> = a.findings.iter().map(|f| f.rule.as_str()).collect();
    for f in &b.findings {
        if !rules.contains(&f.rule.as_str()) {
            rules.push(&f.rule);
        }
    }
    rules
        .into_iter()
        .filter_map(|r| {
            let ((sa, ta), (sb, tb)) = (finding_state(a, r), finding_state(b, r));
            (sa != sb).then(|| FindingChange { rule: r.into(), a: sa, b: sb, a_summary: ta, b_summary: tb })
        })
        .collect()
}

/// The median time between two ticks of the job's nodes, s.
fn interval(run: &Run) -> Option<f64> {
    let v: Vec<f64> = run
        .node_ticks
        .values()
        .filter(|(n, _, _)| *n > 1)
        .map(|(n, a, b)| (b - a) / (*n - 1) as f64)
        .collect();
    stats::median(&crate::analysis::stats::sorted(&v))
}

fn profiled(m: &ReportModel) -> String {
    let p = &m.job.profiled;
    let mut profilers: Vec<&str> = m.python.iter().map(|w| w.profiler.as_str()).collect();
    profilers.sort_unstable();
    profilers.dedup();
    let mut parts = Vec::new();
    if p.detailed_steps > 0 {
        parts.push("detailed".to_owned());
    }
    if p.dataloader_events > 0 {
        parts.push("dataloader".to_owned());
    }
    if !profilers.is_empty() {
        parts.push(format!("python ({})", profilers.join(", ")));
    }
    if !m.triggers.is_empty() {
        parts.push("anomaly-triggered windows".to_owned());
    }
    if parts.is_empty() { "system metrics and steps only".into() } else { parts.join(", ") }
}

fn comparable(a: &Run, b: &Run) -> Comparable {
    let mut items = Vec::new();
    let mut item = |what: &str, x: String, y: String, status: Status, note: &str| {
        items.push(Item { what: what.into(), a: x, b: y, status, note: note.into() });
    };
    let same_or = |x: &dyn PartialEq<usize>, y: usize| if x.eq(&y) { Status::Same } else { Status::Differs };
    let (ma, mb) = (&a.model, &b.model);
    let (ra, rb) = (ma.job.ranks.len(), mb.job.ranks.len());
    item(
        "ranks",
        ra.to_string(),
        rb.to_string(),
        same_or(&ra, rb),
        "ranks wait for each other: a different count changes the step",
    );
    let (na, nb) = (ma.job.nodes.len(), mb.job.nodes.len());
    item("nodes", na.to_string(), nb.to_string(), same_or(&na, nb), "");
    let (ga, gb) = (gpus(ma), gpus(mb));
    item("GPUs", ga.to_string(), gb.to_string(), same_or(&ga, gb), "");
    // From the agent's node records (docs/formats.md, "Node record").
    let (ga, gb) = (
        crate::reading::node_gpus::describe(&ma.job.gpu_models),
        crate::reading::node_gpus::describe(&mb.job.gpu_models),
    );
    let (s, note) = match (&ga, &gb) {
        (Some(x), Some(y)) if x == y => (Status::Same, ""),
        (Some(_), Some(_)) => (Status::Differs, "another GPU model changes the step"),
        _ => (
            Status::Unknown,
            "a job without the agent's node record does not name its GPU model: check it yourself",
        ),
    };
    let recorded = |g: Option<String>| g.unwrap_or_else(|| "not recorded".into());
    item("GPU model", recorded(ga), recorded(gb), s, note);
    // The launcher and platform, from the records' job identity (docs/formats.md, "Job identity").
    let platforms = |m: &ReportModel| {
        let mut p: Vec<&str> =
            m.job.identities.values().filter_map(|id| id.get("platform").map(String::as_str)).collect();
        p.sort_unstable();
        p.dedup();
        (!m.job.identities.is_empty())
            .then(|| if p.is_empty() { "none recognised".to_owned() } else { p.join("; ") })
    };
    let (pa, pb) = (platforms(ma), platforms(mb));
    let s = match (&pa, &pb) {
        (Some(x), Some(y)) if x == y => Status::Same,
        (Some(_), Some(_)) => Status::Differs,
        _ => Status::Unknown,
    };
    let note =
        if s == Status::Differs { "another launcher may place ranks and GPUs differently" } else { "" };
    item("platform (job identity)", recorded(pa), recorded(pb), s, note);
    let config = |m: &ReportModel| profiled(m);
    let (ca, cb) = (config(ma), config(mb));
    let s = if ca == cb { Status::Same } else { Status::Differs };
    item(
        "profiling config (what was profiled)",
        ca,
        cb,
        s,
        "windows cost the trainer time; their steps are left out, the rest may still differ",
    );
    let (ia, ib) = (interval(a), interval(b));
    let s = match (ia, ib) {
        (Some(x), Some(y)) if (x - y).abs() <= 0.1 * x.max(y) => Status::Same,
        (None, None) => Status::Same,
        _ => Status::Differs,
    };
    let secs = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{:.3} s", v));
    item("system sampling interval", secs(ia), secs(ib), s, "");
    let modes = |r: &Run| r.modes.keys().cloned().collect::<Vec<_>>().join(", ");
    let (xa, xb) = (modes(a), modes(b));
    let s = if xa == xb { Status::Same } else { Status::Differs };
    item("step modes", xa, xb, s, "");
    let pa: BTreeSet<&str> = a.modes.values().flat_map(|m| m.phases.keys().map(String::as_str)).collect();
    let pb: BTreeSet<&str> = b.modes.values().flat_map(|m| m.phases.keys().map(String::as_str)).collect();
    let only = |x: &BTreeSet<&str>, y: &BTreeSet<&str>| {
        let v: Vec<&str> = x.difference(y).copied().take(10).collect();
        if v.is_empty() { "–".to_owned() } else { v.join(", ") }
    };
    let s = if pa == pb { Status::Same } else { Status::Differs };
    item("phases only in one run", only(&pa, &pb), only(&pb, &pa), s, "the code records different phases");
    for (mode, x) in &a.modes {
        let Some(y) = b.modes.get(mode) else { continue };
        let (ka, kb) = (x.ms.len(), y.ms.len());
        let status = if ka.min(kb) < FEW_STEPS {
            Status::Weak
        } else if ka.max(kb) > 2 * ka.min(kb) {
            Status::Differs
        } else {
            Status::Same
        };
        item(
            &format!("{mode} steps kept (of all)"),
            format!("{ka} (of {})", ka as u64 + x.warmup + x.windows),
            format!("{kb} (of {})", kb as u64 + y.warmup + y.windows),
            status,
            if status == Status::Weak { "few steps: a wide interval" } else { "" },
        );
    }
    let ok = !items.iter().any(|i| i.status == Status::Differs);
    Comparable { ok, items }
}

/// The comparison as `--json` prints it.
pub fn to_json(c: &Comparison) -> String {
    serde_json::to_string_pretty(c).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_merge_and_overlap() {
        let w = merge(vec![(10, 20), (0, 5), (15, 30), (40, 50)]);
        assert_eq!(w, [(0, 5), (10, 30), (40, 50)]);
        assert!(overlaps(&w, 4, 8));
        assert!(!overlaps(&w, 5, 10));
        assert!(overlaps(&w, 29, 35));
        assert!(!overlaps(&w, 30, 40));
        assert!(overlaps(&w, 45, 45));
        assert!(!overlaps(&[], 1, 2));
    }

    #[test]
    fn a_phase_median_counts_steps_without_it_as_zero() {
        // Step 0: 1.5 ms in two events; step 2: 3 ms; steps 1 and 3: none.
        let (with, m) = per_step_median(vec![(0, 1000), (2, 3000), (0, 500)], 4);
        assert_eq!((with, m), (2, Some(0.75)));
        assert_eq!(per_step_median(Vec::new(), 0), (0, None));
    }

    fn detailed_model(gemm_ms: f64, kernels: &[(&str, f64)]) -> ReportModel {
        use crate::model::detailed::{Detailed, DetailedFigures, DetailedWindow, Share, TopRow};
        let figures = DetailedFigures {
            windows: 2,
            classes: vec![Share { name: "gemm".into(), ms: gemm_ms, pct: None, count: Some(1) }],
            top_kernels: kernels
                .iter()
                .map(|(n, ms)| TopRow {
                    name: (*n).into(),
                    class: None,
                    count: 1,
                    self_ms: *ms,
                    total_ms: *ms,
                    pct: None,
                })
                .collect(),
            ..DetailedFigures::default()
        };
        let window = |first| DetailedWindow {
            rank: "0-a".into(),
            device: Some(0),
            first_step: first,
            last_step: first + 4,
            steps: 5,
            start_s: 0.0,
            end_s: 1.0,
            figures: DetailedFigures::default(),
        };
        let detailed =
            Detailed { total: Some(figures), windows: vec![window(10), window(100)], ..Detailed::default() };
        ReportModel { detailed, ..ReportModel::default() }
    }

    #[test]
    fn the_detailed_windows_move_per_profiled_step() {
        // Two windows of 5 steps: 100 ms of gemm is 10 ms a step; 150 ms is 15.
        let full: Vec<(String, f64)> =
            (0..crate::analysis::detailed::TOP).map(|i| (format!("k{i}"), 1.0)).collect();
        let full: Vec<(&str, f64)> = full.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        let a = detailed_model(100.0, &[("sgemm", 80.0), ("only_a", 10.0)]);
        let b = detailed_model(150.0, &full);
        let m = detailed_movers(&a, &b, Some(5.0));
        let by: BTreeMap<&str, &Mover> = m.iter().map(|m| (m.name.as_str(), m)).collect();
        let gemm = by["class: gemm"];
        assert_eq!((gemm.a_ms, gemm.b_ms, gemm.diff_ms), (10.0, 15.0, 5.0));
        assert_eq!(gemm.explains, Some(1.0));
        assert_eq!(gemm.kind, MoverKind::Detailed);
        // B's top list is full: A's kernels missing from it are unknown there, left out; B's
        // kernels missing from A's short list are 0 in A.
        assert!(!by.contains_key("kernel: sgemm") && !by.contains_key("kernel: only_a"));
        assert_eq!(by["kernel: k3"].a_ms, 0.0);
        assert!((by["kernel: k3"].b_ms - 0.1).abs() < 1e-12);
        // A job without detailed windows: nothing to compare.
        assert!(detailed_movers(&ReportModel::default(), &b, None).is_empty());
    }

    fn run(ms: &[f64], phases: &[(&str, i64)]) -> Run {
        let mut m = ModeRun { ms: crate::analysis::stats::sorted(ms), ..ModeRun::default() };
        let n = m.ms.len() as u64;
        m.phases = phases
            .iter()
            .map(|(k, us)| {
                let median_ms = Some(*us as f64 / 1000.0 / n as f64);
                ((*k).to_owned(), PhaseStat { total_us: *us, events: n, steps_with: n, median_ms })
            })
            .collect();
        let mut modes = BTreeMap::new();
        modes.insert("TRAIN".to_owned(), m);
        Run { model: ReportModel::default(), modes, node_ticks: BTreeMap::new(), pressure: Vec::new() }
    }

    #[test]
    fn the_planted_phase_tops_the_movers_and_the_gate_fails() {
        let a_ms: Vec<f64> = (0..200).map(|i| 40.0 + f64::from(i % 10) * 0.1).collect();
        let b_ms: Vec<f64> = a_ms.iter().map(|x| x + 3.0).collect();
        // 200 steps: Backward 30 ms → 33 ms a step; Forward unchanged.
        let a = run(&a_ms, &[("Backward", 200 * 30_000), ("Forward", 200 * 5_000)]);
        let b = run(&b_ms, &[("Backward", 200 * 33_000), ("Forward", 200 * 5_000)]);
        let c = compare(&a, &b, &Options { fail_if_slower: Some(5.0), ..Options::default() });
        let s = &c.steps["TRAIN"];
        assert_eq!(s.verdict, Some(Verdict::Slower));
        assert_eq!(c.movers[0].name, "Backward");
        assert!((c.movers[0].diff_ms - 3.0).abs() < 1e-9);
        assert!((c.movers[0].explains.unwrap() - 1.0).abs() < 1e-9);
        let g = c.gate.unwrap();
        assert!(g.failed, "{}", g.why);
        // The same run: no difference, the gate passes.
        let c = compare(&a, &a, &Options { fail_if_slower: Some(5.0), ..Options::default() });
        assert_eq!(c.steps["TRAIN"].verdict, Some(Verdict::Same));
        assert!(!c.gate.unwrap().failed);
        assert!(c.comparable.ok);
        // A mode neither has: the gate cannot judge.
        let c = compare(
            &a,
            &b,
            &Options { mode: Some("eval".into()), fail_if_slower: Some(5.0), ..Options::default() },
        );
        assert!(c.steps.is_empty() && c.mode.is_none());
        assert!(c.gate.unwrap().why.contains("no EVAL steps"));
    }

    /// A side whose median step is 0 is refused alike on either side: no ratio, so the gate
    /// neither passes nor fails (`trainprof compare` exits 2, unusable input).
    #[test]
    fn a_zero_median_step_is_refused_on_either_side() {
        let ok = run(&[40.0, 41.0, 42.0], &[]);
        let zero = run(&[0.0, 0.0, 0.0, 1.0], &[]);
        for (a, b) in [(&ok, &zero), (&zero, &ok)] {
            let c = compare(a, b, &Options { fail_if_slower: Some(5.0), ..Options::default() });
            let s = &c.steps["TRAIN"];
            assert_eq!((s.ratio, s.verdict), (None, None), "{}", s.text);
            assert!(s.text.contains("positive median"), "{}", s.text);
            let g = c.gate.unwrap();
            assert!(!g.failed && g.why.contains("not compared"), "{}", g.why);
        }
    }
}
