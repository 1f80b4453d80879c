//! The detailed windows explained (`docs/report.md`, "Detailed windows"): from the
//! `cpu_functions` and `gpu_functions-dev:<n>` events of each rank (`docs/formats.md`, "Event
//! vocabulary"), its steps and its DataLoader events, per window and device and for the job:
//! how much of the window's wall time the GPU was busy, why it was idle (in categories), the
//! GPU time by kernel class, the top kernels and CPU ops by self time, the launch delay, and
//! one sentence.
//!
//! While reading, each op, kernel and DataLoader wait is kept as a small record (times, an
//! interned name, a few numbers), at most [`MAX_RECORDS`] and [`MAX_WAITS`] per job and
//! [`MAX_NAMES`] distinct names: the rest is counted and said in `job.capped`. A window is a
//! run of consecutive step numbers with such events on one rank; it is worked out once all
//! files are read, since a window's events may sit in several files.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::analysis::steps::StepRec;
use crate::model::Capped;
use crate::model::detailed::*;
use trainprof_output::protocol::timeline_event::MAX_NAME_BYTES;

/// The phase of the CPU ops and the phase prefix of a device's kernels
/// (`gpu_functions-dev:<n>`; `docs/formats.md`, "Event vocabulary").
pub use trainprof_output::protocol::timeline::{CPU_FUNCTIONS, GPU_FUNCTIONS};
/// The DataLoader's batch fetches: the trainer waiting for input.
pub const DATALOADER_ITER: &str = trainprof_output::protocol::timeline::DATALOADER_ITER;
/// Op and kernel records kept per job (40 bytes each: 80 MB at most).
pub const MAX_RECORDS: usize = 2_000_000;
/// DataLoader waits kept per job (16 bytes each).
pub const MAX_WAITS: usize = 1_000_000;
/// Distinct op and kernel names kept per job; further names are counted under [`OTHER_NAMES`].
pub const MAX_NAMES: usize = 20_000;
pub const OTHER_NAMES: &str = "(other names)";
/// Rows of each top table.
pub const TOP: usize = 15;
/// A gap between two CPU ops shorter than this counts as the host still launching (the Python
/// between two ops of one sequence); a longer one is `other`.
pub const HOST_GAP_US: i64 = 1000;
/// Windows listed in the model (every window counts in the job's total).
pub const MAX_WINDOWS: usize = 1000;

// The `args` keys the adapter writes on kernels (`docs/formats.md`, "Event vocabulary").
pub const DEVICE_KEY: &str = "device";
pub const TID_KEY: &str = "tid";
pub const STREAM_KEY: &str = "stream";
pub const LAUNCH_KEY: &str = "cpu_thread_start_time";
pub const ANNOTATION_KEY: &str = "annotation";

/// Kernel classes, in the order they are tried and listed (`docs/report.md`, "Kernel classes").
pub const CLASSES: [&str; 7] = [
    "communication",
    "memcpy/memset",
    "normalisation",
    "gemm/convolution",
    "reduction",
    "elementwise",
    "other",
];
const COMMUNICATION: u8 = 0;
const MEMCPY: u8 = 1;

/// Idle categories, in the order they win where they overlap (`docs/report.md`, "Idle
/// categories").
pub const IDLE: [IdleCategory; 5] = IdleCategory::ALL;

/// The class of a kernel by its name: the first class with a pattern the lower-cased name
/// contains (memcpy/memset: the name starts with it).
pub fn class_of(name: &str) -> u8 {
    let n = name.to_ascii_lowercase();
    let has = |pats: &[&str]| pats.iter().any(|p| n.contains(p));
    if has(&["nccl"]) {
        0
    } else if n.starts_with("memcpy") || n.starts_with("memset") {
        MEMCPY
    } else if has(&[
        "batch_norm",
        "batchnorm",
        "layer_norm",
        "layernorm",
        "group_norm",
        "groupnorm",
        "instance_norm",
        "instancenorm",
        "rms_norm",
        "rmsnorm",
        "bn_fw",
        "bn_bw",
    ]) {
        2
    } else if has(&[
        "gemm", "conv", "cutlass", "xmma", "nvjet", "cublas", "cudnn", "matmul", "wgrad", "dgrad", "fprop",
        "flash",
    ]) {
        3
    } else if has(&[
        "reduce",
        "reduction",
        "softmax",
        "pool",
        "argmax",
        "argmin",
        "cub::",
        "scan",
        "triton_red",
        "triton_per",
    ]) {
        4
    } else if has(&[
        "elementwise",
        "functor",
        "fill",
        "copy",
        "multi_tensor_apply",
        "pointwise",
        "triton_poi",
        "index",
    ]) {
        5
    } else {
        6
    }
}

/// Whether a CPU op makes the host wait for the device (`docs/report.md`, "Idle categories").
pub fn is_sync(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("synchronize")
        || n == "aten::item"
        || n == "aten::_local_scalar_dense"
        || ((n.starts_with("cudamemcpy") || n.starts_with("cumemcpy")) && !n.contains("async"))
}

// ---------------------------------------------------------------------------------------------
// Reading

#[derive(Debug, Clone, Copy)]
struct Op {
    start: i64,
    end: i64,
    step: i64,
    tid: i64,
    name: u32,
}

#[derive(Debug, Clone, Copy)]
struct Kernel {
    start: i64,
    end: i64,
    step: i64,
    /// The launch call's start (epoch µs); `i64::MIN` when the event does not say.
    launch: i64,
    device: i64,
    name: u32,
    annotation: bool,
}

#[derive(Debug, Default)]
struct Rank {
    ops: Vec<Op>,
    kernels: Vec<Kernel>,
    waits: Vec<(i64, i64)>,
}

/// What is kept while reading.
#[derive(Debug, Default)]
pub struct Collector {
    ranks: Vec<(String, Rank)>,
    rank_ids: HashMap<String, usize>,
    names: Vec<String>,
    classes: Vec<u8>,
    sync: Vec<bool>,
    name_ids: HashMap<String, u32>,
    records: usize,
    waits: usize,
    left_out_records: u64,
    left_out_waits: u64,
    left_out_names: u64,
    /// Names cut to [`MAX_NAME_BYTES`].
    pub names_cut: u64,
    /// The job's demangling budget (`docs/report.md`, "Mangled names").
    demangler: crate::reading::demangle::Demangler,
}

fn arg_i64(e: &crate::reading::Event<'_>, k: &str) -> Option<i64> {
    let v = e.args.get(k)?;
    v.as_i64().or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
}

impl Collector {
    /// The id of a name as shown: a mangled kernel name (CUPTI reports some CUTLASS and cuDNN
    /// kernels mangled, `_ZN17cutlass…`) is demangled first, as the native windows' names are
    /// (`docs/report.md`, "Mangled names"). A name given to the demangler maps to its id under
    /// its mangled spelling too, so it is demangled once (those names' bytes are at most the
    /// budget); any other is looked up by the name as shown, its readable prefix, which is
    /// cheap to make again.
    fn name(&mut self, raw: &str) -> u32 {
        if let Some(&i) = self.name_ids.get(raw) {
            return i;
        }
        if !crate::reading::demangle::is_mangled(raw) || self.names.len() >= MAX_NAMES {
            return self.intern(raw);
        }
        let keep = self.demangler.would_try(raw);
        let shown = self.demangler.show(raw, crate::reading::demangle::MAX_NAME);
        let i = self.intern(&shown);
        if keep {
            self.name_ids.insert(raw.to_owned(), i);
        }
        i
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.name_ids.get(name) {
            return i;
        }
        let (key, cut) = if name.len() > MAX_NAME_BYTES {
            let mut end = MAX_NAME_BYTES;
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            (format!("{}…", &name[..end]), true)
        } else {
            (name.to_owned(), false)
        };
        if let Some(&i) = self.name_ids.get(&key) {
            return i;
        }
        let (key, class) = if self.names.len() >= MAX_NAMES {
            self.left_out_names += 1;
            if let Some(&i) = self.name_ids.get(OTHER_NAMES) {
                return i;
            }
            (OTHER_NAMES.to_owned(), 6)
        } else {
            self.names_cut += u64::from(cut);
            // The class and the sync test read the whole name, not the cut one.
            (key, class_of(name))
        };
        let i = self.names.len() as u32;
        self.classes.push(class);
        self.sync.push(is_sync(name));
        self.names.push(key.clone());
        self.name_ids.insert(key, i);
        i
    }

    /// One event of a timeline: kept when it is an op, a kernel or a DataLoader wait.
    pub fn event(&mut self, e: &crate::reading::Event<'_>) {
        if e.ph != 'X' {
            return;
        }
        let is_op = e.phase == CPU_FUNCTIONS;
        let device = e.phase.strip_prefix(GPU_FUNCTIONS);
        if e.phase == DATALOADER_ITER {
            if self.waits >= MAX_WAITS {
                self.left_out_waits += 1;
                return;
            }
            self.waits += 1;
            let end = e.start_us.saturating_add(e.dur_us);
            self.rank(e.node).waits.push((e.start_us, end));
            return;
        }
        if !is_op && device.is_none() {
            return;
        }
        let Some(step) = e.step else { return };
        if self.records >= MAX_RECORDS {
            self.left_out_records += 1;
            return;
        }
        self.records += 1;
        let name = self.name(e.name);
        let (start, end) = (e.start_us, e.start_us.saturating_add(e.dur_us));
        if is_op {
            let tid = arg_i64(e, TID_KEY).unwrap_or(0);
            self.rank(e.node).ops.push(Op { start, end, step, tid, name });
        } else {
            let device =
                arg_i64(e, DEVICE_KEY).or_else(|| device.and_then(|d| d.trim().parse().ok())).unwrap_or(0);
            let launch = arg_i64(e, LAUNCH_KEY).filter(|l| *l <= start && start - l < 60_000_000);
            let annotation = arg_i64(e, ANNOTATION_KEY) == Some(1);
            self.rank(e.node).kernels.push(Kernel {
                start,
                end,
                step,
                launch: launch.unwrap_or(i64::MIN),
                device,
                name,
                annotation,
            });
        }
    }

    fn rank(&mut self, node: &str) -> &mut Rank {
        // A rank's name is copied once, not per event.
        let i = match self.rank_ids.get(node) {
            Some(&i) => i,
            None => {
                self.ranks.push((node.to_owned(), Rank::default()));
                self.rank_ids.insert(node.to_owned(), self.ranks.len() - 1);
                self.ranks.len() - 1
            }
        };
        &mut self.ranks[i].1
    }

    /// The caps reached, for `job.capped`.
    pub fn capped(&self) -> Vec<Capped> {
        let mut out = Vec::new();
        for (what, limit, n) in [
            ("detailed_events", MAX_RECORDS, self.left_out_records),
            ("detailed_waits", MAX_WAITS, self.left_out_waits),
            ("detailed_names", MAX_NAMES, self.left_out_names),
            ("demangled_bytes", crate::reading::demangle::BUDGET_BYTES, self.demangler.not_tried),
        ] {
            if n > 0 {
                out.push(Capped { what: what.into(), node: None, limit: limit as u64, left_out: n });
            }
        }
        out
    }

    /// Every window, and the job's total. `steps`: mode → rank → steps (the window's wall time
    /// is its steps' span).
    pub fn finish(mut self, steps: &BTreeMap<String, BTreeMap<String, Vec<StepRec>>>) -> Detailed {
        let mut out = Detailed::default();
        let mut total = Sums::default();
        let mut ranks = std::mem::take(&mut self.ranks);
        ranks.sort_by(|a, b| a.0.cmp(&b.0));
        for (rank, mut r) in ranks {
            // The names of the rank's ops: a "kernel" of the same name is a range the profiler
            // drew on the device (a `record_function` annotation such as
            // `Optimizer.step#SGD.step`), not a kernel.
            let op_names: HashSet<u32> = r.ops.iter().map(|o| o.name).collect();
            for k in &mut r.kernels {
                k.annotation |= op_names.contains(&k.name);
            }
            r.ops.sort_by_key(|o| o.step);
            r.kernels.sort_by_key(|k| (k.step, k.device, k.start));
            r.waits.sort_unstable();
            let mut all: Vec<i64> =
                r.ops.iter().map(|o| o.step).chain(r.kernels.iter().map(|k| k.step)).collect();
            all.sort_unstable();
            all.dedup();
            let mut runs: Vec<(i64, i64)> = Vec::new();
            for s in all {
                match runs.last_mut() {
                    Some(run) if run.1.checked_add(1) == Some(s) => run.1 = s,
                    _ => runs.push((s, s)),
                }
            }
            let spans = step_spans(steps, &rank);
            let waits = merge(r.waits.iter().copied());
            for (first, last) in runs {
                let in_run = |s: i64| s >= first && s <= last;
                let ops = slice_by(&r.ops, |o| o.step, first, last);
                let kernels = slice_by(&r.kernels, |k| k.step, first, last);
                // Wall time: the window's steps, and its events where they go past them.
                let mut ws = i64::MAX;
                let mut we = i64::MIN;
                let mut nsteps = 0u64;
                if let Some(sp) = spans {
                    for s in sp.iter().filter(|s| in_run(s.step)) {
                        ws = ws.min(s.start_us);
                        we = we.max(s.start_us.saturating_add(s.dur_us));
                        nsteps += 1;
                    }
                }
                for (a, b) in
                    ops.iter().map(|o| (o.start, o.end)).chain(kernels.iter().map(|k| (k.start, k.end)))
                {
                    ws = ws.min(a);
                    we = we.max(b);
                }
                let mut devices: Vec<Option<i64>> = kernels.iter().map(|k| Some(k.device)).collect();
                devices.sort_unstable();
                devices.dedup();
                if devices.is_empty() {
                    devices.push(None);
                }
                for device in devices {
                    let ks: Vec<&Kernel> = kernels.iter().filter(|k| Some(k.device) == device).collect();
                    let s = self.window_sums(ws, we, ops, &ks, &waits, device.is_some());
                    let fig = s.figures(&self.names, &self.classes);
                    total.add(&s);
                    if out.windows.len() >= MAX_WINDOWS {
                        out.windows_left_out += 1;
                        continue;
                    }
                    let mut w = DetailedWindow {
                        rank: rank.clone(),
                        device,
                        first_step: first,
                        last_step: last,
                        steps: nsteps,
                        start_s: ws as f64 / 1e6,
                        end_s: we as f64 / 1e6,
                        figures: fig,
                    };
                    w.figures.sentence = sentence(&w.figures, &window_label(&w));
                    out.windows.push(w);
                }
            }
        }
        if total.windows > 0 {
            let mut f = total.figures(&self.names, &self.classes);
            let label = format!(
                "Over the {} detailed window{}",
                total.windows,
                if total.windows == 1 { "" } else { "s" }
            );
            f.sentence = sentence(&f, &label);
            out.total = Some(f);
        }
        out.names_cut = self.names_cut;
        out
    }

    fn window_sums(
        &self,
        ws: i64,
        we: i64,
        ops: &[Op],
        kernels: &[&Kernel],
        waits: &[(i64, i64)],
        gpu: bool,
    ) -> Sums {
        let mut s = Sums { windows: 1, wall_us: (we - ws).max(0), gpu, ..Sums::default() };
        let clip = |a: i64, b: i64| (a.max(ws), b.min(we));
        let real: Vec<&&Kernel> = kernels.iter().filter(|k| !k.annotation).collect();
        for k in kernels.iter().filter(|k| k.annotation) {
            s.annotations += 1;
            s.annotations_us += k.end - k.start;
        }
        let busy = merge(real.iter().map(|k| clip(k.start, k.end)));
        let compute = merge(
            real.iter().filter(|k| self.classes[k.name as usize] != MEMCPY).map(|k| clip(k.start, k.end)),
        );
        s.busy_us = measure(&busy);
        s.compute_us = measure(&compute);
        // Communication against compute (HTA's comm/comp overlap): the communication kernels'
        // time, and the part of it that kernels of the other classes but memcpy/memset run
        // alongside (`docs/report.md`, "Communication against compute").
        let class = |k: &&&Kernel| self.classes[k.name as usize];
        let comm = merge(real.iter().filter(|k| class(k) == COMMUNICATION).map(|k| clip(k.start, k.end)));
        let comp = merge(
            real.iter().filter(|k| !matches!(class(k), COMMUNICATION | MEMCPY)).map(|k| clip(k.start, k.end)),
        );
        s.comm_us = measure(&comm);
        s.comm_overlap_us = measure(&intersect(&comm, &comp));
        if gpu {
            let mut idle = subtract(&[(ws, we)], &busy);
            // The waits are disjoint and sorted, so those that meet the window are one run.
            let from = waits.partition_point(|w| w.1 <= ws);
            let to = waits.partition_point(|w| w.0 < we).max(from);
            let input = merge(waits[from..to].iter().map(|&(a, b)| clip(a, b)));
            let sync = merge(ops.iter().filter(|o| self.sync[o.name as usize]).map(|o| clip(o.start, o.end)));
            let queued = merge(real.iter().filter(|k| k.launch != i64::MIN).map(|k| clip(k.launch, k.start)));
            let launching = bridge(&merge(ops.iter().map(|o| clip(o.start, o.end))), HOST_GAP_US);
            for (i, layer) in [input, sync, queued, launching].iter().enumerate() {
                let part = intersect(&idle, layer);
                s.idle_us[i] = measure(&part);
                idle = subtract(&idle, layer);
            }
            s.idle_us[4] = measure(&idle);
        }
        for k in &real {
            let d = k.end - k.start;
            let c = &mut s.classes[self.classes[k.name as usize] as usize];
            c.0 += 1;
            c.1 += d;
            let e = s.kernels.entry(k.name).or_default();
            e.0 += 1;
            e.1 += d;
            if k.launch != i64::MIN {
                s.delays.push(k.start - k.launch);
            }
        }
        // Self time per op: its time less its children's on the same thread (the ops of a
        // thread nest; an op inside another is its descendant).
        let mut by_thread: Vec<&Op> = ops.iter().collect();
        by_thread.sort_by(|a, b| a.tid.cmp(&b.tid).then(a.start.cmp(&b.start)).then(b.end.cmp(&a.end)));
        let mut stack: Vec<Frame> = Vec::new();
        for o in by_thread {
            while let Some(top) = stack.last()
                && (top.0 != o.tid || top.1 < o.end || top.1 <= o.start)
            {
                pop_op(&mut stack, &mut s);
            }
            let dur = o.end - o.start;
            if let Some(top) = stack.last_mut() {
                top.4 += dur;
            }
            stack.push((o.tid, o.end, o.name, dur, 0));
        }
        while !stack.is_empty() {
            pop_op(&mut stack, &mut s);
        }
        s
    }
}

/// An op's frame: (thread, end, name, duration, children's time).
type Frame = (i64, i64, u32, i64, i64);

/// Ends the op on top of the stack: its self time is its time less its children's.
fn pop_op(stack: &mut Vec<Frame>, s: &mut Sums) {
    if let Some((_, _, name, dur, children)) = stack.pop() {
        let e = s.ops.entry(name).or_default();
        e.0 += 1;
        e.1 += (dur - children).max(0);
        e.2 += dur;
    }
}

/// The rank's steps of the first mode that has any (`GLOBAL` first, then `TRAIN`, then the
/// others): the windows' numbering is the global step for PyTorch.
fn step_spans<'a>(
    steps: &'a BTreeMap<String, BTreeMap<String, Vec<StepRec>>>,
    rank: &str,
) -> Option<&'a Vec<StepRec>> {
    let order = ["GLOBAL", "TRAIN"];
    order
        .iter()
        .filter_map(|m| steps.get(*m))
        .chain(steps.iter().filter(|(m, _)| !order.contains(&m.as_str())).map(|(_, v)| v))
        .find_map(|ranks| ranks.get(rank).filter(|v| !v.is_empty()))
}

/// The records with steps `first..=last` of a list sorted by step.
fn slice_by<T>(v: &[T], step: impl Fn(&T) -> i64, first: i64, last: i64) -> &[T] {
    let a = v.partition_point(|x| step(x) < first);
    let b = v.partition_point(|x| step(x) <= last);
    &v[a..b.max(a)]
}

// ---------------------------------------------------------------------------------------------
// Intervals: sorted, disjoint, non-empty `[a, b)`.

/// The union of intervals (empty ones dropped), sorted.
pub fn merge(it: impl Iterator<Item = (i64, i64)>) -> Vec<(i64, i64)> {
    let mut v: Vec<(i64, i64)> = it.filter(|(a, b)| b > a).collect();
    v.sort_unstable();
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(l) if a <= l.1 => l.1 = l.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// The intervals with gaps shorter than `gap` filled.
pub fn bridge(v: &[(i64, i64)], gap: i64) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = Vec::with_capacity(v.len());
    for &(a, b) in v {
        match out.last_mut() {
            Some(l) if a - l.1 < gap => l.1 = l.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

pub fn measure(v: &[(i64, i64)]) -> i64 {
    v.iter().map(|(a, b)| b - a).sum()
}

pub fn intersect(x: &[(i64, i64)], y: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < x.len() && j < y.len() {
        let a = x[i].0.max(y[j].0);
        let b = x[i].1.min(y[j].1);
        if b > a {
            out.push((a, b));
        }
        if x[i].1 < y[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

pub fn subtract(x: &[(i64, i64)], y: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(a, b) in x {
        let mut cur = a;
        while j < y.len() && y[j].1 <= cur {
            j += 1;
        }
        let mut k = j;
        while k < y.len() && y[k].0 < b {
            if y[k].0 > cur {
                out.push((cur, y[k].0));
            }
            cur = cur.max(y[k].1);
            k += 1;
        }
        if cur < b {
            out.push((cur, b));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Sums and figures

#[derive(Debug, Default)]
struct Sums {
    windows: u64,
    gpu: bool,
    wall_us: i64,
    busy_us: i64,
    compute_us: i64,
    /// Communication kernels' time (merged), and the part compute kernels overlap.
    comm_us: i64,
    comm_overlap_us: i64,
    idle_us: [i64; 5],
    /// Per class: kernels, µs.
    classes: [(u64, i64); 7],
    /// Per kernel name: count, µs.
    kernels: HashMap<u32, (u64, i64)>,
    /// Per op name: count, self µs, total µs.
    ops: HashMap<u32, (u64, i64, i64)>,
    delays: Vec<i64>,
    annotations: u64,
    annotations_us: i64,
}

impl Sums {
    fn add(&mut self, o: &Sums) {
        self.windows += o.windows;
        self.gpu |= o.gpu;
        self.wall_us += o.wall_us;
        self.busy_us += o.busy_us;
        self.compute_us += o.compute_us;
        self.comm_us += o.comm_us;
        self.comm_overlap_us += o.comm_overlap_us;
        for i in 0..5 {
            self.idle_us[i] += o.idle_us[i];
        }
        for i in 0..7 {
            self.classes[i].0 += o.classes[i].0;
            self.classes[i].1 += o.classes[i].1;
        }
        for (k, v) in &o.kernels {
            let e = self.kernels.entry(*k).or_default();
            e.0 += v.0;
            e.1 += v.1;
        }
        for (k, v) in &o.ops {
            let e = self.ops.entry(*k).or_default();
            e.0 += v.0;
            e.1 += v.1;
            e.2 += v.2;
        }
        self.delays.extend_from_slice(&o.delays);
        self.annotations += o.annotations;
        self.annotations_us += o.annotations_us;
    }

    fn figures(&self, names: &[String], classes: &[u8]) -> DetailedFigures {
        let ms = |us: i64| us as f64 / 1000.0;
        let pct = |part: i64, of: i64| (of > 0).then(|| 100.0 * part as f64 / of as f64);
        let gpu_us: i64 = self.classes.iter().map(|c| c.1).sum();
        let kernels: u64 = self.classes.iter().map(|c| c.0).sum();
        let mut top_kernels: Vec<(&u32, &(u64, i64))> = self.kernels.iter().collect();
        top_kernels.sort_by(|a, b| b.1.1.cmp(&a.1.1).then(a.0.cmp(b.0)));
        let mut top_ops: Vec<(&u32, &(u64, i64, i64))> = self.ops.iter().collect();
        top_ops.sort_by(|a, b| b.1.1.cmp(&a.1.1).then(a.0.cmp(b.0)));
        let mut d = self.delays.clone();
        d.sort_unstable();
        let q = |p: f64| {
            let v: Vec<f64> = d.iter().map(|x| *x as f64).collect();
            crate::analysis::stats::quantile_sorted(&v, p)
        };
        DetailedFigures {
            windows: self.windows,
            wall_ms: ms(self.wall_us),
            gpu: self.gpu,
            busy_ms: self.gpu.then(|| ms(self.busy_us)),
            busy_pct: if self.gpu { pct(self.busy_us, self.wall_us) } else { None },
            compute_busy_ms: self.gpu.then(|| ms(self.compute_us)),
            compute_busy_pct: if self.gpu { pct(self.compute_us, self.wall_us) } else { None },
            comm_overlap: (self.comm_us > 0).then(|| CommOverlap {
                comm_ms: ms(self.comm_us),
                overlapped_ms: ms(self.comm_overlap_us),
                pct: 100.0 * self.comm_overlap_us as f64 / self.comm_us as f64,
            }),
            idle_ms: self.gpu.then(|| ms(self.idle_us.iter().sum())),
            idle: if self.gpu {
                IDLE.iter()
                    .zip(self.idle_us)
                    .map(|(c, us)| Share {
                        name: c.as_str().into(),
                        ms: ms(us),
                        pct: pct(us, self.wall_us),
                        count: None,
                    })
                    .collect()
            } else {
                Vec::new()
            },
            gpu_ms: ms(gpu_us),
            kernels,
            annotations: self.annotations,
            annotations_ms: ms(self.annotations_us),
            classes: if kernels > 0 {
                CLASSES
                    .iter()
                    .zip(self.classes)
                    .map(|(c, (n, us))| Share {
                        name: (*c).into(),
                        ms: ms(us),
                        pct: pct(us, gpu_us),
                        count: Some(n),
                    })
                    .collect()
            } else {
                Vec::new()
            },
            ops: self.ops.values().map(|v| v.0).sum(),
            top_kernels: top_kernels
                .iter()
                .take(TOP)
                .map(|(n, (c, us))| TopRow {
                    name: names[**n as usize].clone(),
                    class: Some(CLASSES[classes[**n as usize] as usize].into()),
                    count: *c,
                    self_ms: ms(*us),
                    total_ms: ms(*us),
                    pct: pct(*us, gpu_us),
                })
                .collect(),
            top_ops: top_ops
                .iter()
                .take(TOP)
                .map(|(n, (c, s, t))| TopRow {
                    name: names[**n as usize].clone(),
                    class: None,
                    count: *c,
                    self_ms: ms(*s),
                    total_ms: ms(*t),
                    pct: pct(*s, self.wall_us),
                })
                .collect(),
            launch_delay: (!d.is_empty()).then(|| LaunchDelay {
                kernels: d.len() as u64,
                p50_us: q(0.5),
                p90_us: q(0.9),
                max_us: d.last().map(|x| *x as f64),
                mean_us: Some(d.iter().sum::<i64>() as f64 / d.len() as f64),
            }),
            sentence: String::new(),
        }
    }
}

/// `0-algo-1 steps 200–201 (GPU 0)`.
fn window_label(w: &DetailedWindow) -> String {
    let steps = if w.first_step == w.last_step {
        format!("step {}", w.first_step)
    } else {
        format!("steps {}–{}", w.first_step, w.last_step)
    };
    match w.device {
        Some(d) => format!("{}, {steps}, GPU {d}", w.rank),
        None => format!("{}, {steps}", w.rank),
    }
}

/// Milliseconds for people: `134 ms`, `12.3 ms`, `0.42 ms`.
pub fn ms_text(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0} ms")
    } else if v.abs() >= 10.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.2} ms")
    }
}

fn pct_text(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |p| format!("{p:.0} %"))
}

/// One sentence (two at most) that says where the time went, with numbers.
pub fn sentence(f: &DetailedFigures, label: &str) -> String {
    let mut s = format!("{label}: {} of wall time", ms_text(f.wall_ms));
    if !f.gpu {
        let top = f.top_ops.first().map_or(String::new(), |o| {
            format!("; the CPU op with the most self time was {} ({})", o.name, ms_text(o.self_ms))
        });
        return format!("{s}, no GPU kernel recorded{top}.");
    }
    let busy = f.busy_ms.unwrap_or(0.0);
    s += &format!(
        ", the GPU busy {} ({}; computing {})",
        ms_text(busy),
        pct_text(f.busy_pct),
        pct_text(f.compute_busy_pct)
    );
    if let Some(c) = f.classes.iter().filter(|c| c.ms > 0.0).max_by(|a, b| a.ms.total_cmp(&b.ms)) {
        s += &format!(
            ", the largest share {} kernels ({}, {} of GPU time)",
            c.name,
            ms_text(c.ms),
            pct_text(c.pct)
        );
    }
    // `f.idle` is in [`IDLE`] order (or empty).
    let mut idle: Vec<(&Share, IdleCategory)> =
        f.idle.iter().zip(IDLE).filter(|(c, _)| c.ms >= 0.005).collect();
    idle.sort_by(|a, b| b.0.ms.total_cmp(&a.0.ms));
    if let Some(total) = f.idle_ms.filter(|t| *t > 0.0) {
        s += &format!("; of the {} idle, ", ms_text(total));
        let parts: Vec<String> = idle
            .iter()
            .take(2)
            .map(|(c, cat)| format!("{} {} ({} of wall time)", ms_text(c.ms), cat.words(), pct_text(c.pct)))
            .collect();
        s += &parts.join(" and ");
    }
    s.push('.');
    if let Some(c) = &f.comm_overlap {
        s += &format!(
            " Communication kernels ran {}, {} of it overlapped by compute.",
            ms_text(c.comm_ms),
            pct_text(Some(c.pct))
        );
    }
    if let Some(d) = &f.launch_delay
        && let Some(p50) = d.p50_us
    {
        s += &format!(" A kernel started a median {p50:.0} µs after its launch.");
    }
    s
}

// ---------------------------------------------------------------------------------------------
// The model

#[cfg(test)]
mod tests {
    use super::*;

    const RANK: &str = "0-algo-1";
    const T0: i64 = 1_795_400_000_000_000;

    /// Feeds one event; times are µs from `T0`.
    fn feed(c: &mut Collector, phase: &str, name: &str, a: i64, b: i64, step: i64, args: &[(&str, i64)]) {
        let mut m = serde_json::Map::new();
        for (k, v) in args {
            m.insert((*k).into(), (*v).into());
        }
        let e = crate::reading::Event {
            node: RANK,
            phase,
            name,
            ph: 'X',
            start_us: T0 + a,
            dur_us: b - a,
            step: Some(step),
            args: &m,
        };
        c.event(&e);
    }

    fn steps(spans: &[(i64, i64, i64)]) -> BTreeMap<String, BTreeMap<String, Vec<StepRec>>> {
        let v = spans.iter().map(|&(step, a, b)| StepRec { start_us: T0 + a, dur_us: b - a, step }).collect();
        BTreeMap::from([("TRAIN".to_owned(), BTreeMap::from([(RANK.to_owned(), v)]))])
    }

    /// A window of two steps (200 ms) with every idle category and kernel class planted (the
    /// answers are worked out in the comments).
    fn planted() -> Collector {
        let mut c = Collector::default();
        let gpu = "gpu_functions-dev:0";
        let k = |c: &mut Collector, name: &str, a: i64, b: i64, step: i64| {
            feed(c, gpu, name, a, b, step, &[("device", 0)])
        };
        // Busy 77 ms: GEMM 30, normalisation 10, elementwise 5 + 5, memcpy 2, NCCL 20, reduction 5.
        k(&mut c, "sm90_xmma_fprop_implicit_gemm_bf16", 10_000, 40_000, 10);
        k(&mut c, "void at::native::batch_norm_collect_statistics_kernel<float>", 40_000, 50_000, 10);
        k(
            &mut c,
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
            50_000,
            55_000,
            10,
        );
        k(&mut c, "Memcpy HtoD (Pinned -> Device)", 55_000, 57_000, 10);
        k(&mut c, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 150_000, 170_000, 11);
        k(&mut c, "void at::native::reduce_kernel<512, 1>", 170_000, 175_000, 11);
        // Launched at 186 ms, started at 190 ms: 4 ms queued.
        feed(
            &mut c,
            gpu,
            "triton_poi_fused_add_0",
            190_000,
            195_000,
            11,
            &[("device", 0), ("cpu_thread_start_time", T0 + 186_000)],
        );
        // A record_function range on the device: not a kernel (its op has the same name).
        k(&mut c, "Optimizer.step#SGD.step", 10_000, 57_000, 10);
        let op = |c: &mut Collector, name: &str, a: i64, b: i64, step: i64, tid: i64| {
            feed(c, CPU_FUNCTIONS, name, a, b, step, &[("tid", tid)])
        };
        // The host launching while the GPU idles: 57-90 ms (a child launch call inside).
        op(&mut c, "aten::conv2d", 57_000, 90_000, 10, 1);
        op(&mut c, "cudaLaunchKernel", 60_000, 61_000, 10, 1);
        // 110-130 ms: the first 10 ms overlap the DataLoader wait, which wins.
        op(&mut c, "aten::to", 110_000, 130_000, 11, 1);
        op(&mut c, "Optimizer.step#SGD.step", 150_000, 151_000, 11, 2);
        // 175-185 ms: the host synchronising.
        op(&mut c, "cudaDeviceSynchronize", 175_000, 185_000, 11, 1);
        op(&mut c, "cudaLaunchKernel", 186_000, 187_000, 11, 1);
        // A DataLoader wait of 30 ms numbered with step 12, inside the window by time; another
        // of step 11 after the window is not its.
        feed(
            &mut c,
            DATALOADER_ITER,
            "_MultiProcessingDataLoaderIter.DataLoaderIter::GetNext",
            90_000,
            120_000,
            12,
            &[],
        );
        feed(
            &mut c,
            DATALOADER_ITER,
            "_MultiProcessingDataLoaderIter.DataLoaderIter::GetNext",
            250_000,
            260_000,
            11,
            &[],
        );
        c
    }

    fn share(v: &[Share], name: &str) -> f64 {
        v.iter().find(|s| s.name == name).map(|s| s.ms).unwrap()
    }

    /// A mangled kernel name is shown and classed demangled, and counts as one name with its
    /// demangled spelling.
    #[test]
    fn mangled_kernel_names_are_demangled() {
        let mut c = Collector::default();
        let a = c.name("_ZN17cutlass__5x_cudnn6KernelI4ConvEEvNT_6ParamsE");
        let b = c.name("_ZN17cutlass__5x_cudnn6KernelI4ConvEEvNT_6ParamsE");
        assert_eq!(a, b);
        let shown = c.names[a as usize].clone();
        assert!(shown.starts_with("void cutlass__5x_cudnn::Kernel<Conv>("), "{shown}");
        assert_eq!(usize::from(c.classes[a as usize]), 3);
        assert_eq!(c.name(&shown), a);
        // The H200 fixture's kernel that no demangler reads, whole and cut: as far as it reads.
        let cut =
            "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22Impl";
        let i = c.name(cut);
        assert_eq!(c.names[i as usize], "cutlass__5x_cudnn::Kernel<…>");
        assert_eq!(usize::from(c.classes[i as usize]), 3);
    }

    /// 20,000 distinct hostile names (each a failure of the demangler): at most
    /// `MAX_FAILURES` are given to it, none is shown as raw mangling, and each maps to one id
    /// however often it comes.
    #[test]
    fn hostile_names_are_demangled_within_the_budget() {
        let mut c = Collector::default();
        let bomb = |i: usize| format!("_ZN9bombs{:04}1fI{}EEvv", i % 10_000, "S_".repeat(500 + i / 10_000));
        for i in 0..20_000 {
            let a = c.name(&bomb(i));
            assert_eq!(c.name(&bomb(i)), a);
        }
        let d = &c.demangler;
        assert_eq!(
            (d.attempts, d.failed),
            (
                u64::from(crate::reading::demangle::MAX_FAILURES),
                u64::from(crate::reading::demangle::MAX_FAILURES)
            )
        );
        assert!(d.attempted_bytes <= crate::reading::demangle::BUDGET_BYTES as u64);
        assert!(c.names.iter().all(|n| !n.starts_with("_Z")), "{:?}", &c.names[..3]);
        assert_eq!(c.names[0], "bombs0000::f<…>");
        // The two spellings of one readable prefix are one name.
        assert_eq!(c.names.len(), 10_000);
        assert_eq!(c.capped()[0].what, "demangled_bytes");
        // The budget in bytes: readable names past it are read by their prefix, not demangled.
        let mut c = Collector::default();
        let name = |i: usize| format!("_ZN3foo{}x{i}{}Ev", 2001 + i.to_string().len(), "x".repeat(2000));
        for i in 0..2_000 {
            c.name(&name(i));
        }
        let d = &c.demangler;
        assert!(d.attempted_bytes <= crate::reading::demangle::BUDGET_BYTES as u64);
        assert_eq!(d.attempts + d.not_tried, 2_000);
        assert!(d.not_tried > 1_000 && d.failed == 0, "{d:?}");
        assert!(c.names.iter().all(|n| n.starts_with("foo::")));
    }

    #[test]
    fn a_planted_window_gives_the_planted_categories_and_classes() {
        let d = planted().finish(&steps(&[(10, 0, 100_000), (11, 100_000, 200_000), (12, 200_000, 300_000)]));
        assert_eq!(d.windows.len(), 1);
        let w = &d.windows[0];
        assert_eq!((w.first_step, w.last_step, w.steps, w.device), (10, 11, 2, Some(0)));
        let f = &w.figures;
        assert_eq!(f.wall_ms, 200.0);
        assert_eq!((f.busy_ms, f.compute_busy_ms, f.idle_ms), (Some(77.0), Some(75.0), Some(123.0)));
        assert_eq!(f.busy_pct, Some(38.5));
        // Idle 123 ms: input 30, sync 10, queued 4, launching 33 + 10, other 10 + 20 + 1 + 5.
        for (cat, ms) in
            [("input", 30.0), ("sync", 10.0), ("queued", 4.0), ("launching", 43.0), ("other", 36.0)]
        {
            assert_eq!(share(&f.idle, cat), ms, "{cat}");
        }
        for (class, ms) in [
            ("gemm/convolution", 30.0),
            ("normalisation", 10.0),
            ("elementwise", 10.0),
            ("memcpy/memset", 2.0),
            ("communication", 20.0),
            ("reduction", 5.0),
            ("other", 0.0),
        ] {
            assert_eq!(share(&f.classes, class), ms, "{class}");
        }
        assert_eq!((f.kernels, f.gpu_ms, f.annotations, f.annotations_ms), (7, 77.0, 1, 47.0));
        assert_eq!(f.top_kernels[0].name, "sm90_xmma_fprop_implicit_gemm_bf16");
        // Self time: conv2d's 33 ms less its child's 1 ms.
        let ops: Vec<(&str, u64, f64, f64)> =
            f.top_ops.iter().map(|o| (o.name.as_str(), o.count, o.self_ms, o.total_ms)).collect();
        assert_eq!(
            ops,
            [
                ("aten::conv2d", 1, 32.0, 33.0),
                ("aten::to", 1, 20.0, 20.0),
                ("cudaDeviceSynchronize", 1, 10.0, 10.0),
                ("cudaLaunchKernel", 2, 2.0, 2.0),
                ("Optimizer.step#SGD.step", 1, 1.0, 1.0),
            ]
        );
        let ld = f.launch_delay.as_ref().unwrap();
        assert_eq!((ld.kernels, ld.p50_us, ld.max_us), (1, Some(4000.0), Some(4000.0)));
        assert!(f.sentence.contains("0-algo-1, steps 10–11, GPU 0: 200 ms of wall time"), "{}", f.sentence);
        assert!(f.sentence.contains("the GPU busy 77.0 ms (38 %"), "{}", f.sentence);
        assert!(f.sentence.contains("gemm/convolution kernels (30.0 ms"), "{}", f.sentence);
        assert!(f.sentence.contains("43.0 ms the host still launching"), "{}", f.sentence);
        // The job's total is the one window.
        let t = d.total.as_ref().unwrap();
        assert_eq!((t.windows, t.busy_ms, &t.idle), (1, Some(77.0), &f.idle));
    }

    #[test]
    fn windows_are_runs_of_steps_and_the_total_sums_them() {
        let mut c = planted();
        // A second window, step 20 alone: 10 ms of one kernel in a 20 ms step.
        feed(&mut c, "gpu_functions-dev:0", "sm90_gemm", 1_000_000, 1_010_000, 20, &[("device", 0)]);
        feed(&mut c, CPU_FUNCTIONS, "aten::mm", 999_000, 1_000_500, 20, &[("tid", 1)]);
        let d = c.finish(&steps(&[(10, 0, 100_000), (11, 100_000, 200_000), (20, 995_000, 1_015_000)]));
        assert_eq!(d.windows.len(), 2);
        let w = &d.windows[1];
        assert_eq!(
            (w.first_step, w.last_step, w.figures.wall_ms, w.figures.busy_pct),
            (20, 20, 20.0, Some(50.0))
        );
        let t = d.total.as_ref().unwrap();
        assert_eq!((t.windows, t.wall_ms, t.busy_ms), (2, 220.0, Some(87.0)));
        assert_eq!(share(&t.classes, "gemm/convolution"), 40.0);
        assert!(t.sentence.starts_with("Over the 2 detailed windows: 220 ms of wall time"), "{}", t.sentence);
    }

    /// Communication against compute, per rank: rank 0's NCCL kernels (both eras) run 30 ms,
    /// 15 of them beside a GEMM or an elementwise kernel (a memcpy beside them is no compute):
    /// 50 %; rank 1's 20 ms run alone: 0 %; the total 15 of 50 ms: 30 %.
    #[test]
    fn communication_overlapped_by_compute_per_rank() {
        let mut c = Collector::default();
        let m = serde_json::Map::from_iter([("device".to_owned(), serde_json::Value::from(0))]);
        let mut k = |rank: &str, name: &str, a: i64, b: i64| {
            c.event(&crate::reading::Event {
                node: rank,
                phase: "gpu_functions-dev:0",
                name,
                ph: 'X',
                start_us: T0 + a,
                dur_us: b - a,
                step: Some(1),
                args: &m,
            })
        };
        k("0-a", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 20_000);
        k("0-a", "sm90_xmma_gemm_bf16", 5_000, 15_000);
        k("0-a", "Memcpy DtoD (Device -> Device)", 15_000, 20_000);
        k("0-a", "ncclKernel_AllGather_RING_LL_Sum_int8_t", 30_000, 40_000);
        k("0-a", "void at::native::vectorized_elementwise_kernel<4>", 35_000, 45_000);
        k("1-a", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 20_000);
        k("1-a", "sm90_xmma_gemm_bf16", 25_000, 35_000);
        let d = c.finish(&BTreeMap::new());
        let o: Vec<(&str, f64, f64, f64)> = d
            .windows
            .iter()
            .map(|w| {
                let c = w.figures.comm_overlap.as_ref().unwrap();
                (w.rank.as_str(), c.comm_ms, c.overlapped_ms, c.pct)
            })
            .collect();
        assert_eq!(o, [("0-a", 30.0, 15.0, 50.0), ("1-a", 20.0, 0.0, 0.0)]);
        let t = d.total.as_ref().unwrap().comm_overlap.as_ref().unwrap();
        assert_eq!((t.comm_ms, t.overlapped_ms, t.pct), (50.0, 15.0, 30.0));
        assert!(
            d.windows[0]
                .figures
                .sentence
                .contains("Communication kernels ran 30.0 ms, 50 % of it overlapped by compute."),
            "{}",
            d.windows[0].figures.sentence
        );
        // Without a communication kernel there is no figure.
        let mut c = Collector::default();
        feed(&mut c, "gpu_functions-dev:0", "sm90_gemm", 0, 1000, 1, &[("device", 0)]);
        assert!(c.finish(&BTreeMap::new()).windows[0].figures.comm_overlap.is_none());
    }

    #[test]
    fn two_devices_give_one_entry_each() {
        let mut c = Collector::default();
        for step in [1, 2] {
            for dev in [0, 1] {
                let a = step * 10_000 + dev * 1000;
                feed(
                    &mut c,
                    &format!("gpu_functions-dev:{dev}"),
                    "gemm",
                    a,
                    a + 1000,
                    step,
                    &[("device", dev)],
                );
            }
        }
        let d = c.finish(&BTreeMap::new());
        let got: Vec<(Option<i64>, u64)> = d.windows.iter().map(|w| (w.device, w.figures.kernels)).collect();
        assert_eq!(got, [(Some(0), 2), (Some(1), 2)]);
    }

    #[test]
    fn without_kernels_the_gpu_figures_are_null() {
        let mut c = Collector::default();
        feed(&mut c, CPU_FUNCTIONS, "aten::mm", 0, 5_000, 3, &[("tid", 1)]);
        let d = c.finish(&BTreeMap::new());
        let f = &d.windows[0].figures;
        assert_eq!(
            (d.windows[0].device, f.gpu, f.busy_pct, f.idle.len(), f.classes.len()),
            (None, false, None, 0, 0)
        );
        assert_eq!(f.wall_ms, 5.0);
        assert!(f.sentence.contains("no GPU kernel recorded"), "{}", f.sentence);
    }

    #[test]
    fn names_and_records_are_capped() {
        let mut c = Collector::default();
        let long = "k".repeat(400);
        feed(&mut c, "gpu_functions-dev:0", &long, 0, 10, 1, &[]);
        feed(&mut c, "gpu_functions-dev:0", &long, 10, 20, 1, &[]);
        assert_eq!((c.names.len(), c.names_cut), (1, 1));
        assert!(c.names[0].ends_with('…') && c.names[0].len() == MAX_NAME_BYTES + '…'.len_utf8());
        for i in 0..(MAX_NAMES + 5) {
            c.name(&format!("op{i}"));
        }
        assert_eq!((c.names.len(), c.left_out_names), (MAX_NAMES + 1, 6));
        assert_eq!(c.names[MAX_NAMES], OTHER_NAMES);
        c.records = MAX_RECORDS;
        feed(&mut c, CPU_FUNCTIONS, "aten::mm", 0, 5, 1, &[]);
        let capped = c.capped();
        let what: Vec<(&str, u64)> = capped.iter().map(|x| (x.what.as_str(), x.left_out)).collect();
        assert_eq!(what, [("detailed_events", 1), ("detailed_names", 6)]);
    }

    #[test]
    fn kernel_classes_by_name() {
        for (name, class) in [
            ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "communication"),
            ("Memset (Device)", "memcpy/memset"),
            ("void at::native::batch_norm_backward_reduce_channels_last_kernel<4>", "normalisation"),
            ("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_bf16>", "gemm/convolution"),
            ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "gemm/convolution"),
            ("void cublasLt::splitKreduce_kernel<32, 16>", "gemm/convolution"),
            ("void at::native::(anonymous namespace)::max_pool_forward_nhwc<float>", "reduction"),
            (
                "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
                "elementwise",
            ),
            ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<>", "elementwise"),
            ("my_custom_kernel", "other"),
        ] {
            assert_eq!(CLASSES[class_of(name) as usize], class, "{name}");
        }
        assert!(is_sync("cudaStreamSynchronize") && is_sync("aten::item") && is_sync("cudaMemcpy"));
        assert!(!is_sync("cudaMemcpyAsync") && !is_sync("aten::mm"));
    }

    #[test]
    fn interval_arithmetic() {
        let a = merge([(5, 10), (0, 3), (2, 4), (20, 20)].into_iter());
        assert_eq!(a, [(0, 4), (5, 10)]);
        assert_eq!(measure(&a), 9);
        assert_eq!(subtract(&[(0, 100)], &a), [(4, 5), (10, 100)]);
        assert_eq!(intersect(&[(0, 6), (8, 50)], &a), [(0, 4), (5, 6), (8, 10)]);
        assert_eq!(bridge(&[(0, 10), (15, 20), (30, 40)], 6), [(0, 20), (30, 40)]);
    }
}
