//! BatchSize: judged every 60 s of a node's data once it has more than 500 and more than
//! `patience` CPU values: over the last 500 values, the CPU p95 (all cores), a GPU's
//! utilisation p95 and its memory p95 all below 70 %: the batch could be larger.

use std::collections::{BTreeMap, VecDeque};

use super::rule::{
    Held, Present, Rule, StateOf, Table, TickView, Verdict, Verdicts, Window, p95_p5, push_last, r2,
};
use crate::analysis::collect::{self, GPU_WINDOW, NodeJudge};
use crate::model::evidence;
pub use crate::model::evidence::batch_size::{Evidence, GpuEvidence};

/// SageMaker's defaults: the p95 thresholds (%) and the window (the last 500 values, and it
/// needs more than 500). A GPU's utilisation window is the node's last `GPU_WINDOW` values.
pub const THRESHOLD_P95: f64 = 70.0;
pub const WINDOW: usize = 500;
const _: () = assert!(WINDOW == GPU_WINDOW);

#[derive(Debug)]
pub struct BatchSize;

/// Per node.
#[derive(Debug, Clone, Default)]
pub struct NodeState {
    /// The CPU (all cores) of the last `WINDOW` ticks, and how many ticks had one.
    pub cpu_window: VecDeque<f64>,
    pub cpu_n: u64,
    pub gpus: BTreeMap<String, GpuState>,
}

/// Per GPU of a node.
#[derive(Debug, Clone, Default)]
pub struct GpuState {
    /// The last `WINDOW` memory values.
    pub mem_window: VecDeque<f64>,
    pub verdicts: Verdicts,
    /// The last window that held: (CPU p95, GPU p95, GPU memory p95).
    pub hit: Option<(f64, f64, f64)>,
}

impl Rule for BatchSize {
    const NAME: &'static str = evidence::BATCH_SIZE;
    type Node = NodeState;
    type Evidence = Evidence;

    fn tick(s: &mut NodeState, t: &TickView<'_>) {
        if let Some(v) = t.cpu_total {
            s.cpu_n += 1;
            push_last(&mut s.cpu_window, v, WINDOW);
        }
        for (name, _, mem) in t.gpus.iter().copied() {
            let Some(m) = *mem else { continue };
            let g = match s.gpus.get_mut(name) {
                Some(g) => g,
                None => s.gpus.entry(name.clone()).or_default(),
            };
            push_last(&mut g.mem_window, m, WINDOW);
        }
    }

    fn judge<S>(s: &mut NodeState, node: &collect::NodeAgg<S>, w: &Window) {
        // A preliminary judgement takes the windows as they are (fewer than 500 values).
        let window = if w.preliminary { 0 } else { WINDOW as u64 };
        if s.cpu_n <= window.max(w.patience) {
            return;
        }
        let Some(c) = p95_p5(&s.cpu_window).0 else { return };
        for (name, g) in &node.gpus {
            let Some(st) = s.gpus.get_mut(name) else { continue };
            if g.util.len() <= window.max(w.patience)
                || st.mem_window.len() as u64 <= window.max(w.patience).min(WINDOW as u64 - 1)
            {
                continue;
            }
            let u = p95_p5(&g.util_last).0.unwrap_or(100.0);
            let m = p95_p5(&st.mem_window).0.unwrap_or(100.0);
            let hit = c < THRESHOLD_P95 && u < THRESHOLD_P95 && m < THRESHOLD_P95;
            st.verdicts.judge(hit, w.from, w.end);
            if hit {
                st.hit = Some((c, u, m));
            }
        }
    }

    fn datapoints<S: NodeJudge>(agg: &collect::Agg<S>) -> Option<(u64, u64)> {
        let have = agg.nodes.values().filter(|n| !n.gpus.is_empty()).map(|n| n.cpu_total.len()).max()?;
        Some((have, (WINDOW as u64).max(agg.system_patience())))
    }

    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, _: Option<f64>) -> Verdict<Evidence> {
        let patience = agg.system_patience();
        let mut rows = Vec::new();
        let mut held = Held::default();
        let none = GpuState::default();
        for (node, n) in &agg.nodes {
            for (gpu, g) in &n.gpus {
                let st = StateOf::<Self>::state(&n.rules).gpus.get(gpu).unwrap_or(&none);
                held.add(
                    &st.verdicts,
                    st.hit.map(|(c, u, m)| {
                        format!(
                            "{gpu} on {node} (CPU p95 {c:.1} %, GPU p95 {u:.1} %, GPU memory p95 {m:.1} %)"
                        )
                    }),
                );
                rows.push(GpuEvidence {
                    node: node.clone(),
                    gpu: gpu.clone(),
                    windows_judged: st.verdicts.evaluations,
                    windows_triggered: st.verdicts.hits,
                    cpu_p95: st.hit.map(|h| r2(h.0)),
                    gpu_p95: st.hit.map(|h| r2(h.1)),
                    gpu_memory_p95: st.hit.map(|h| r2(h.2)),
                    job_cpu_p95: n.cpu_total.quantile(0.95),
                    job_gpu_p95: g.util.quantile(0.95),
                    job_gpu_memory_p95: g.mem.quantile(0.95),
                });
            }
        }
        let need = (WINDOW as u64).max(patience);
        held.verdict(
            rows.is_empty(),
            || format!("Too few datapoints to judge (the rule waits for more than {need})."),
            "At least one of CPU, GPU and GPU memory was busy (p95 ≥ 70 %) in every window.",
            |hits| format!("CPU, GPU and GPU memory all stayed below 70 % (p95 of the last {WINDOW} values) for {hits}."),
            "The machine has room to spare: try a larger batch size (scale the learning rate with it), or a smaller instance.",
            Evidence {
                cpu_threshold_p95: THRESHOLD_P95,
                gpu_threshold_p95: THRESHOLD_P95,
                gpu_memory_threshold_p95: THRESHOLD_P95,
                window: WINDOW as u64,
                patience,
                gpus: rows,
            },
        )
    }
}

impl Present for Evidence {
    fn present(&self) -> Table {
        Table::of(
            vec![
                ("cpu_threshold_p95", self.cpu_threshold_p95.into()),
                ("gpu_threshold_p95", self.gpu_threshold_p95.into()),
                ("gpu_memory_threshold_p95", self.gpu_memory_threshold_p95.into()),
                ("window", self.window.into()),
                ("patience", self.patience.into()),
            ],
            &self.gpus,
        )
        .units(&[
            ("cpu_threshold_p95", "%"),
            ("gpu_threshold_p95", "%"),
            ("gpu_memory_threshold_p95", "%"),
            super::rule::WINDOW_UNIT,
            super::rule::PATIENCE_UNIT,
            ("cpu_p95", "%"),
            ("gpu_p95", "%"),
            ("gpu_memory_p95", "%"),
            ("job_cpu_p95", "%"),
            ("job_gpu_p95", "%"),
            ("job_gpu_memory_p95", "%"),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::super::all;
    use super::super::tests::{get, run};

    #[test]
    fn an_idle_machine_could_take_a_larger_batch() {
        // BatchSize needs more than 500 values; gpu1 and the CPU are below 70 % everywhere.
        let f = all(&mut run(600, 20.0, 0.0, &[(90.0, 30.0), (3.0, 30.0)]), None);
        let b = get(&f, "BatchSize");
        assert!(b.triggered && b.summary.contains("gpu1 on algo-1"), "{}", b.summary);
        assert!(!b.summary.contains("gpu0"), "{}", b.summary);
        assert!(
            !get(&all(&mut run(600, 20.0, 0.0, &[(90.0, 30.0), (90.0, 30.0)]), None), "BatchSize").triggered
        );
        // 500 values are not enough.
        assert!(!get(&all(&mut run(500, 20.0, 0.0, &[(3.0, 30.0)]), None), "BatchSize").evaluated);
    }
}
