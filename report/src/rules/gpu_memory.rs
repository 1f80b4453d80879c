//! GPUMemoryIncrease: at any tick of a GPU that has more than `patience` values, the mean of
//! its last 10 `GPUMemoryUtilization` values exceeds the mean of the 9 before the last two by
//! more than 5 points (SageMaker's moving averages, its `[-11:-2]` slice kept as it is).

use std::collections::{BTreeMap, VecDeque};

use super::rule::{Present, RANGE_GAP_S, Ranges, Rule, StateOf, Table, TickView, Verdict, push_last, r2};
use crate::analysis::collect::{self, NodeJudge};
use crate::model::evidence;
pub use crate::model::evidence::gpu_memory::{Evidence, GpuEvidence};

/// SageMaker's moving-average window.
pub const WINDOW: usize = 10;
/// SageMaker's default increase (percentage points).
pub const INCREASE: f64 = 5.0;

#[derive(Debug)]
pub struct GpuMemoryIncrease;

/// Per GPU of a node.
#[derive(Debug, Clone, Default)]
pub struct GpuState {
    /// Memory values seen, and the last `WINDOW + 1`.
    pub n: u64,
    pub last: VecDeque<f64>,
    /// The ticks where the average rose by more than `INCREASE`.
    pub increases: Ranges,
    /// The largest rise: (points, when, the value then).
    pub max_increase: Option<(f64, f64, f64)>,
}

impl Rule for GpuMemoryIncrease {
    const NAME: &'static str = evidence::GPU_MEMORY_INCREASE;
    type Node = BTreeMap<String, GpuState>;
    type Evidence = Evidence;

    fn tick(s: &mut Self::Node, t: &TickView<'_>) {
        for (name, _, mem) in t.gpus.iter().copied() {
            let Some(m) = *mem else { continue };
            let g = match s.get_mut(name) {
                Some(g) => g,
                None => s.entry(name.clone()).or_default(),
            };
            g.n += 1;
            push_last(&mut g.last, m, WINDOW + 1);
            if g.n <= WINDOW as u64 + 1 {
                continue;
            }
            // The last `WINDOW` values against the `WINDOW - 1` from `-WINDOW - 1` to `-3`.
            let k = g.last.len();
            let recent = g.last.range(k - WINDOW..).sum::<f64>() / WINDOW as f64;
            let older = g.last.range(k - WINDOW - 1..k - 2).sum::<f64>() / (WINDOW - 1) as f64;
            let diff = recent - older;
            // SageMaker counts an increase only once it has more than `patience` values.
            if diff > INCREASE && g.n > t.patience {
                g.increases.hit(t.tick.t_s, RANGE_GAP_S);
            }
            if g.max_increase.is_none_or(|(d, _, _)| diff > d) {
                g.max_increase = Some((diff, t.tick.t_s, m));
            }
        }
    }

    fn datapoints<S: NodeJudge>(agg: &collect::Agg<S>) -> Option<(u64, u64)> {
        let have = agg.nodes.values().flat_map(|n| n.gpus.values()).map(|g| g.mem.len()).max()?;
        Some((have, agg.system_patience()))
    }

    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, _: Option<f64>) -> Verdict<Evidence> {
        let patience = agg.system_patience();
        let judging = agg.judging_patience(patience);
        let mut gpus = Vec::new();
        let (mut evaluated, mut triggered) = (false, false);
        let mut ranges = Vec::new();
        let mut worst: Option<(&str, &str, f64)> = None;
        for (node, n) in &agg.nodes {
            for (gpu, g) in &n.gpus {
                let Some(st) = StateOf::<Self>::state(&n.rules).get(gpu) else { continue };
                evaluated |= st.n > judging;
                let hit = st.increases.count > 0;
                triggered |= hit;
                if hit {
                    ranges.extend(st.increases.ranges.iter().copied());
                }
                let inc = st.max_increase.map(|m| m.0);
                if let Some(i) = inc
                    && worst.is_none_or(|w| i > w.2)
                {
                    worst = Some((node, gpu, i));
                }
                gpus.push(GpuEvidence {
                    node: node.clone(),
                    gpu: gpu.clone(),
                    datapoints: st.n,
                    max_increase: inc.map(r2),
                    at_s: st.max_increase.map(|m| m.1),
                    violations: st.increases.count,
                    p50: g.mem.quantile(0.5),
                    max: g.mem.max(),
                });
            }
        }
        let summary = match (worst, evaluated) {
            _ if gpus.is_empty() => "No GPU memory metrics.".to_owned(),
            (_, false) => {
                format!("Too few GPU memory datapoints to judge (the rule waits for more than {patience}).")
            }
            (Some((node, gpu, inc)), true) if triggered => format!(
                "GPU memory of {gpu} on {node} grew: its moving average rose by up to {inc:.1} points (threshold {INCREASE})."
            ),
            _ => "GPU memory stayed level.".to_owned(),
        };
        Verdict {
            triggered,
            evaluated,
            summary,
            advice: "Memory that keeps growing ends in an out-of-memory error: look for tensors kept across steps (losses appended with their graph, caches), and check the batch size.",
            evidence: Evidence { increase: INCREASE, window: WINDOW as u64, patience, gpus },
            ranges,
        }
    }
}

impl Present for Evidence {
    fn present(&self) -> Table {
        Table::of(
            vec![
                ("increase", self.increase.into()),
                ("window", self.window.into()),
                ("patience", self.patience.into()),
            ],
            &self.gpus,
        )
        .units(&[
            ("increase", "points of %"),
            super::rule::WINDOW_UNIT,
            super::rule::PATIENCE_UNIT,
            ("max_increase", "points of %"),
            ("p50", "%"),
            ("max", "%"),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::super::Agg;
    use super::super::all;
    use super::super::tests::get;
    use super::*;
    use crate::reading::Tick;

    fn tick(t: f64, mem: f64) -> Tick {
        Tick {
            t_s: t,
            cores: vec![(0, 10.0)],
            gpus: vec![("gpu0".into(), Some(50.0), Some(mem))],
            memory: Some(30.0),
            ..Tick::default()
        }
    }

    #[test]
    fn uses_sagemakers_moving_averages() {
        let mut a = Agg::new(Some(20));
        for i in 0..30 {
            a.tick("algo-1", &tick(f64::from(i), 10.0));
        }
        assert_eq!(a.nodes["algo-1"].rules.of::<GpuMemoryIncrease>()["gpu0"].increases.count, 0);
        // A jump of 60 points: the last-10 mean rises by 6 at once (> 5).
        a.tick("algo-1", &tick(30.0, 70.0));
        let g = &a.nodes["algo-1"].rules.of::<GpuMemoryIncrease>()["gpu0"];
        assert_eq!(g.increases.count, 1);
        let (d, t, _) = g.max_increase.unwrap();
        assert!((d - 6.0).abs() < 1e-9, "{d}");
        assert_eq!(t, 30.0);
        // The same jump before `patience` values is not counted.
        let mut a = Agg::new(Some(100));
        for i in 0..31 {
            a.tick("algo-1", &tick(f64::from(i), if i < 30 { 10.0 } else { 70.0 }));
        }
        assert_eq!(a.nodes["algo-1"].rules.of::<GpuMemoryIncrease>()["gpu0"].increases.count, 0);
    }

    #[test]
    fn a_step_up_triggers_with_its_range() {
        let mut a = Agg::new(Some(10));
        for i in 0..40 {
            a.tick("algo-1", &tick(100.0 + f64::from(i), if i < 30 { 10.0 } else { 80.0 }));
        }
        a.finish();
        let f = all(&mut a, None);
        let m = get(&f, "GPUMemoryIncrease");
        assert!(m.triggered, "{}", m.summary);
        assert!(m.summary.contains("gpu0 on algo-1"), "{}", m.summary);
        assert_eq!(m.ranges.first().map(|r| r[0]), Some(130.0));
    }
}
