//! LowGPUUtilization: judged every 60 s of a node's data once a GPU has more than `patience`
//! values: the p95 of its last 500 values below 70 % (underutilized), or above 70 % with
//! their p5 below 10 % (fluctuating).

use std::collections::BTreeMap;

use super::rule::{Held, Present, Rule, StateOf, Table, Verdict, Verdicts, Window, p95_p5, r2};
use crate::analysis::collect::{self, GPU_WINDOW, NodeJudge};
use crate::model::evidence;
pub use crate::model::evidence::low_gpu::{Evidence, GpuEvidence};

/// SageMaker's defaults (%).
pub const THRESHOLD_P95: f64 = 70.0;
pub const THRESHOLD_P5: f64 = 10.0;

#[derive(Debug)]
pub struct LowGpuUtilization;

/// Per GPU of a node.
#[derive(Debug, Clone, Default)]
pub struct GpuState {
    pub verdicts: Verdicts,
    /// The last window that held: (issue, p95, p5).
    pub hit: Option<(&'static str, f64, f64)>,
    /// Where the evidence lies: the ticks of the judged values that were low (below
    /// [`THRESHOLD_P5`] when fluctuating, below [`THRESHOLD_P95`] when underutilized), as time
    /// ranges (a run of low ticks is one range, to the next tick), and the last tick looked at.
    pub low: Vec<[f64; 2]>,
    pub low_dropped: u64,
    low_upto: f64,
    low_open: bool,
}

impl GpuState {
    /// Adds the low ticks of `g`'s last values not looked at yet (the windows' values overlap).
    fn mark_low(&mut self, g: &crate::analysis::collect::GpuAgg, below: f64) {
        // A run is not carried over from the last judgement: ticks between may be unseen.
        self.low_open = false;
        let next = g.util_last_t.iter().skip(1).map(Some).chain(std::iter::once(None));
        for ((&t, &v), next) in g.util_last_t.iter().zip(&g.util_last).zip(next) {
            if t <= self.low_upto {
                continue;
            }
            let end = next.copied().unwrap_or(t);
            if v >= below {
                self.low_open = false;
                continue;
            }
            if self.low_open
                && let Some(last) = self.low.last_mut()
            {
                last[1] = last[1].max(end);
            } else if self.low.len() < super::rule::MAX_RANGES {
                self.low.push([t, end]);
            } else {
                self.low_dropped += 1;
            }
            self.low_open = true;
        }
        if let Some(&t) = g.util_last_t.back() {
            self.low_upto = t;
        }
    }
}

impl Rule for LowGpuUtilization {
    const NAME: &'static str = evidence::LOW_GPU_UTILIZATION;
    type Node = BTreeMap<String, GpuState>;
    type Evidence = Evidence;

    fn judge<S>(s: &mut Self::Node, node: &collect::NodeAgg<S>, w: &Window) {
        for (name, g) in &node.gpus {
            if g.util.len() <= w.patience {
                continue;
            }
            let (Some(hi), Some(lo)) = p95_p5(&g.util_last) else { continue };
            let issue = if hi < THRESHOLD_P95 {
                Some("underutilized")
            } else if hi > THRESHOLD_P95 && lo < THRESHOLD_P5 {
                Some("fluctuating")
            } else {
                None
            };
            let st = s.entry(name.clone()).or_default();
            st.verdicts.judge(issue.is_some(), w.from, w.end);
            if let Some(k) = issue {
                st.hit = Some((k, hi, lo));
                st.mark_low(g, if k == "fluctuating" { THRESHOLD_P5 } else { THRESHOLD_P95 });
            }
        }
    }

    fn datapoints<S: NodeJudge>(agg: &collect::Agg<S>) -> Option<(u64, u64)> {
        let have = agg.nodes.values().flat_map(|n| n.gpus.values()).map(|g| g.util.len()).max()?;
        Some((have, agg.system_patience()))
    }

    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, _: Option<f64>) -> Verdict<Evidence> {
        let patience = agg.system_patience();
        let mut gpus = Vec::new();
        let mut held = Held::default();
        let none = GpuState::default();
        for (node, n) in &agg.nodes {
            for (gpu, g) in &n.gpus {
                if g.util.is_empty() {
                    continue;
                }
                let st = StateOf::<Self>::state(&n.rules).get(gpu).unwrap_or(&none);
                // Shaded where the GPU was low, not over the whole judged windows (on a short
                // job one window is the whole job, and the shading would mark nothing).
                held.add_at(
                    &st.verdicts,
                    st.hit.map(|(kind, p95, p5)| {
                        format!("{gpu} on {node} is {kind} (p95 {p95:.1} %, p5 {p5:.1} % of the last {GPU_WINDOW} values)")
                    }),
                    &st.low,
                );
                gpus.push(GpuEvidence {
                    node: node.clone(),
                    gpu: gpu.clone(),
                    datapoints: g.util.len(),
                    windows_judged: st.verdicts.evaluations,
                    windows_triggered: st.verdicts.hits,
                    issue: st.hit.map(|h| h.0.to_owned()),
                    window_p95: st.hit.map(|h| r2(h.1)),
                    window_p5: st.hit.map(|h| r2(h.2)),
                    p50: g.util.quantile(0.5),
                    p95: g.util.quantile(0.95),
                    max: g.util.max(),
                });
            }
        }
        held.verdict(
            gpus.is_empty(),
            || format!("Too few GPU datapoints to judge (the rule waits for more than {patience})."),
            "Every GPU was well used.",
            |hits| format!("{hits}."),
            "Give the GPUs more work per step (a larger batch), or find what they wait for (data loading, CPU preprocessing, synchronisation); an unused GPU can be left out of the instance type.",
            Evidence {
                threshold_p95: THRESHOLD_P95,
                threshold_p5: THRESHOLD_P5,
                window: GPU_WINDOW as u64,
                patience,
                gpus,
            },
        )
    }
}

impl Present for Evidence {
    fn present(&self) -> Table {
        Table::of(
            vec![
                ("threshold_p95", self.threshold_p95.into()),
                ("threshold_p5", self.threshold_p5.into()),
                ("window", self.window.into()),
                ("patience", self.patience.into()),
            ],
            &self.gpus,
        )
        .units(&[
            ("threshold_p95", "%"),
            ("threshold_p5", "%"),
            super::rule::WINDOW_UNIT,
            super::rule::PATIENCE_UNIT,
            ("window_p95", "%"),
            ("window_p5", "%"),
            ("p50", "%"),
            ("p95", "%"),
            ("max", "%"),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::super::Agg;
    use super::super::all;
    use super::super::tests::{get, run};
    use super::*;
    use crate::reading::Tick;

    #[test]
    fn an_idle_gpu_is_underused() {
        let mut a = run(600, 20.0, 0.0, &[(90.0, 30.0), (3.0, 30.0)]);
        let f = all(&mut a, None);
        let low = get(&f, "LowGPUUtilization");
        assert!(low.triggered && low.summary.contains("gpu1"), "{}", low.summary);
        assert!(!low.summary.contains("gpu0"), "{}", low.summary);
        let mut a = run(600, 20.0, 0.0, &[(90.0, 30.0), (90.0, 30.0)]);
        assert!(!get(&all(&mut a, None), "LowGPUUtilization").triggered);
    }

    #[test]
    fn judged_every_minute_and_at_the_end() {
        let mut a = Agg::new(Some(10));
        // Two minutes of an idle GPU, then two minutes of a busy one.
        for i in 0..240 {
            let t = Tick {
                t_s: f64::from(i),
                cores: vec![(0, 95.0)],
                gpus: vec![("gpu0".into(), Some(if i < 120 { 3.0 } else { 90.0 }), Some(10.0))],
                ..Tick::default()
            };
            a.tick("algo-1", &t);
        }
        a.finish();
        let g = &a.nodes["algo-1"].rules.of::<LowGpuUtilization>()["gpu0"];
        // The last 500 values: idle (underutilized) at 60 and 120, then idle and busy
        // (fluctuating: p95 above 70, p5 below 10) at 180 and at the end.
        assert_eq!((g.verdicts.evaluations, g.verdicts.hits), (4, 4));
        assert_eq!(g.hit, Some(("fluctuating", 90.0, 3.0)));
        assert_eq!(g.verdicts.windows.ranges, vec![[0.0, 239.0]]);
    }
}
