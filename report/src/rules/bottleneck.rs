//! CPUBottleneck and IOBottleneck: judged every 60 s of a node's data once it has more than
//! `patience` ticks: more than 50 % of its ticks so far had a GPU below 10 % while a core was
//! above 90 % busy (CPUBottleneck) or above 50 % in I/O wait (IOBottleneck).

use std::collections::BTreeMap;

use super::rule::{
    Cell, Present, RANGE_GAP_S, Ranges, Rule, StateOf, Table, TickView, Verdict, Verdicts, Window, r2,
};
use crate::analysis::collect::{self, NodeJudge};
use crate::model::evidence;
pub use crate::model::evidence::bottleneck::{Evidence, NodeEvidence};

/// SageMaker's defaults: a GPU below this is idle (%).
pub const GPU_LOW: f64 = 10.0;
/// A core above this is busy (CPUBottleneck, %).
pub const CPU_HIGH: f64 = 90.0;
/// A core above this waits for I/O (IOBottleneck, %).
pub const IO_HIGH: f64 = 50.0;
/// The share of bottleneck ticks that triggers (%).
pub const THRESHOLD_PERCENT: u64 = 50;

/// CPUBottleneck (`IO = false`) or IOBottleneck (`IO = true`).
#[derive(Debug)]
pub struct Bottleneck<const IO: bool>;

/// Per node.
#[derive(Debug, Clone, Default)]
pub struct NodeState {
    /// Ticks that had a GPU below `GPU_LOW`.
    pub low_gpu_ticks: u64,
    /// The bottleneck ticks, as time ranges.
    pub ticks: Ranges,
    /// The judgement per window (the share of bottleneck ticks so far).
    pub verdicts: Verdicts,
}

impl<const IO: bool> Bottleneck<IO> {
    fn what() -> String {
        if IO { format!("I/O wait above {IO_HIGH} %") } else { format!("a CPU core above {CPU_HIGH} %") }
    }
}

impl<const IO: bool> Rule for Bottleneck<IO> {
    const NAME: &'static str = if IO { evidence::IO_BOTTLENECK } else { evidence::CPU_BOTTLENECK };
    type Node = NodeState;
    type Evidence = Evidence;

    fn tick(s: &mut NodeState, t: &TickView<'_>) {
        if !t.gpus.iter().any(|g| g.1.is_some_and(|u| u < GPU_LOW)) {
            return;
        }
        s.low_gpu_ticks += 1;
        let busy = if IO {
            t.tick.core_iowait.iter().any(|c| c.1 > IO_HIGH)
        } else {
            t.tick.cores.iter().any(|c| c.1 > CPU_HIGH)
        };
        if busy {
            s.ticks.hit(t.tick.t_s, RANGE_GAP_S);
        }
    }

    fn judge<S>(s: &mut NodeState, node: &collect::NodeAgg<S>, w: &Window) {
        if node.gpus.is_empty() || node.ticks <= w.patience {
            return;
        }
        let pct = s.ticks.count as f64 * 100.0 / node.ticks as f64;
        s.verdicts.judge(pct > THRESHOLD_PERCENT as f64, w.from, w.end);
    }

    fn datapoints<S: NodeJudge>(agg: &collect::Agg<S>) -> Option<(u64, u64)> {
        let have = agg.nodes.values().filter(|n| !n.gpus.is_empty()).map(|n| n.ticks).max()?;
        Some((have, agg.system_patience()))
    }

    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, _: Option<f64>) -> Verdict<Evidence> {
        let patience = agg.system_patience();
        let mut nodes = BTreeMap::new();
        let (mut triggered, mut evaluated) = (false, false);
        let mut ranges = Vec::new();
        let mut worst: Option<(&str, f64)> = None;
        for (name, n) in &agg.nodes {
            if n.gpus.is_empty() {
                continue;
            }
            let s = StateOf::<Self>::state(&n.rules);
            let pct = if n.ticks > 0 { s.ticks.count as f64 * 100.0 / n.ticks as f64 } else { 0.0 };
            evaluated |= s.verdicts.evaluations > 0;
            let hit = s.verdicts.hits > 0;
            triggered |= hit;
            if hit {
                ranges.extend(s.ticks.ranges.iter().copied());
            }
            if worst.is_none_or(|w| pct > w.1) {
                worst = Some((name, pct));
            }
            nodes.insert(
                name.clone(),
                NodeEvidence {
                    datapoints: n.ticks,
                    bottlenecks: s.ticks.count,
                    percent: r2(pct),
                    low_gpu_datapoints: s.low_gpu_ticks,
                    windows_judged: s.verdicts.evaluations,
                    windows_triggered: s.verdicts.hits,
                    triggered_windows: s.verdicts.windows.ranges.clone(),
                    triggered: hit,
                },
            );
        }
        let summary = match (worst, evaluated) {
            (None, _) => "No GPU metrics: the rule needs GPU utilisation.".to_owned(),
            (Some(_), false) => {
                format!("Too few system datapoints to judge (the rule waits for more than {patience}).")
            }
            (Some((node, pct)), true) => format!(
                "On {node}, {pct:.1} % of the datapoints had a GPU below {GPU_LOW} % while {} (threshold: more than {THRESHOLD_PERCENT} % at any minute).",
                Self::what()
            ),
        };
        let advice = if IO {
            "The GPUs wait for data from disk. Read the data set from faster storage (local NVMe, a page-cached copy), prefetch more, or use larger files read sequentially."
        } else {
            "The GPUs wait for the CPU. Move preprocessing out of the training loop: more data-loader workers, preprocessing once ahead of time, or on the GPU."
        };
        let evidence = Evidence {
            threshold_percent: THRESHOLD_PERCENT,
            gpu_threshold: GPU_LOW,
            cpu_threshold: (!IO).then_some(CPU_HIGH),
            io_threshold: IO.then_some(IO_HIGH),
            patience,
            nodes,
        };
        Verdict { triggered, evaluated, summary, advice, evidence, ranges }
    }
}

impl Present for Evidence {
    fn present(&self) -> Table {
        let mut facts: Vec<(&'static str, Cell)> = vec![
            ("threshold_percent", self.threshold_percent.into()),
            ("gpu_threshold", self.gpu_threshold.into()),
        ];
        if let Some(v) = self.cpu_threshold {
            facts.push(("cpu_threshold", v.into()));
        }
        if let Some(v) = self.io_threshold {
            facts.push(("io_threshold", v.into()));
        }
        facts.push(("patience", self.patience.into()));
        Table {
            facts,
            columns: vec![
                "node",
                "datapoints",
                "bottlenecks",
                "percent",
                "low_gpu_datapoints",
                "windows_judged",
                "windows_triggered",
                "triggered",
            ],
            rows: self
                .nodes
                .iter()
                .map(|(node, n)| {
                    vec![
                        node.as_str().into(),
                        n.datapoints.into(),
                        n.bottlenecks.into(),
                        n.percent.into(),
                        n.low_gpu_datapoints.into(),
                        n.windows_judged.into(),
                        n.windows_triggered.into(),
                        n.triggered.into(),
                    ]
                })
                .collect(),
            units: &[
                ("threshold_percent", "%"),
                ("gpu_threshold", "%"),
                ("cpu_threshold", "%"),
                ("io_threshold", "%"),
                super::rule::PATIENCE_UNIT,
                ("percent", "%"),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Agg;
    use super::super::all;
    use super::super::tests::{get, run, run_with};
    use super::*;
    use crate::reading::Tick;

    fn tick(t: f64, core: f64, gpu: f64) -> Tick {
        Tick {
            t_s: t,
            cores: vec![(0, core), (1, core)],
            gpus: vec![("gpu0".into(), Some(gpu), Some(10.0))],
            memory: Some(30.0),
            ..Tick::default()
        }
    }

    #[test]
    fn needs_patience_and_half_the_ticks() {
        let mut a = run(20, 95.0, 0.0, &[(3.0, 10.0)]);
        let f = all(&mut a, Some(1000.0));
        assert!(get(&f, "CPUBottleneck").triggered);
        assert!(!get(&f, "IOBottleneck").triggered);
        assert_eq!(get(&f, "CPUBottleneck").ranges, vec![[1000.0, 1019.0]]);
        // `--patience 1000` (SageMaker's) does not judge 20 ticks; without `--patience` they
        // are judged, preliminarily.
        let mut a = run_with(Some(1000), 20, 95.0, 0.0, &[(3.0, 10.0)]);
        assert!(!get(&all(&mut a, Some(1000.0)), "CPUBottleneck").evaluated);
        let mut a = run_with(None, 20, 95.0, 0.0, &[(3.0, 10.0)]);
        let f = all(&mut a, Some(1000.0));
        let cpu = get(&f, "CPUBottleneck");
        assert!(cpu.evaluated && cpu.triggered, "{cpu:?}");
        assert_eq!(
            cpu.preliminary.as_ref().map(super::super::rule::Preliminary::label).as_deref(),
            Some("preliminary: 20 of 1000 datapoints")
        );
        // A busy GPU: no bottleneck.
        let mut a = run(20, 95.0, 0.0, &[(80.0, 10.0)]);
        assert!(!get(&all(&mut a, None), "CPUBottleneck").triggered);
        let mut a = run(20, 5.0, 60.0, &[(3.0, 10.0)]);
        let f = all(&mut a, None);
        assert!(get(&f, "IOBottleneck").triggered);
        assert!(!get(&f, "CPUBottleneck").triggered);
    }

    #[test]
    fn bottleneck_ticks_make_ranges() {
        let mut a = Agg::default();
        for i in 0..10 {
            a.tick("algo-1", &tick(f64::from(i), 95.0, 3.0));
        }
        for i in 100..105 {
            a.tick("algo-1", &tick(f64::from(i), 95.0, 3.0));
        }
        a.tick("algo-1", &tick(200.0, 20.0, 3.0));
        let n = &a.nodes["algo-1"];
        assert_eq!(n.ticks, 16);
        let cpu = n.rules.of::<Bottleneck<false>>();
        assert_eq!(cpu.low_gpu_ticks, 16);
        assert_eq!(cpu.ticks.count, 15);
        assert_eq!(cpu.ticks.ranges, vec![[0.0, 9.0], [100.0, 104.0]]);
        assert_eq!(n.rules.of::<Bottleneck<true>>().ticks.count, 0);
    }

    #[test]
    fn judged_every_minute_and_at_the_end() {
        let mut a = Agg::new(Some(10));
        // Two minutes of an idle GPU with a burning CPU, then two minutes of a busy GPU.
        for i in 0..240 {
            a.tick("algo-1", &tick(f64::from(i), 95.0, if i < 120 { 3.0 } else { 90.0 }));
        }
        a.finish();
        let v = &a.nodes["algo-1"].rules.of::<Bottleneck<false>>().verdicts;
        // Judged at 60, 120, 180 and at the end (239).
        assert_eq!(v.evaluations, 4);
        // Bottleneck share so far: 100 %, 100 %, 67 %, 50 % (not above 50).
        assert_eq!(v.hits, 3);
        assert_eq!(v.windows.ranges, vec![[0.0, 180.0]]);
    }
}
