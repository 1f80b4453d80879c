//! OverallSystemUsage: p50 / p95 / p99 / max per resource and node; information, never
//! triggers.

use std::collections::BTreeMap;

use super::rule::{Present, Rule, StateOf, Table, Verdict};
use crate::analysis::collect;
use crate::analysis::stats::PctHist;
use crate::model::evidence;
pub use crate::model::evidence::overall::{Evidence, NodeUsage, Usage};

#[derive(Debug)]
pub struct OverallSystemUsage;

impl Usage {
    fn of(h: &PctHist) -> Usage {
        Usage { p50: h.quantile(0.5), p95: h.quantile(0.95), p99: h.quantile(0.99), max: h.max() }
    }
}

impl Rule for OverallSystemUsage {
    const NAME: &'static str = evidence::OVERALL_SYSTEM_USAGE;
    type Node = ();
    type Evidence = Evidence;

    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, _: Option<f64>) -> Verdict<Evidence> {
        let mut nodes = BTreeMap::new();
        for (node, n) in &agg.nodes {
            let mut gpus = BTreeMap::new();
            for (gpu, g) in &n.gpus {
                gpus.insert(format!("{gpu}_util"), Usage::of(&g.util));
                gpus.insert(format!("{gpu}_memory"), Usage::of(&g.mem));
            }
            let usage = NodeUsage {
                cpu: Usage::of(&n.cpu_total),
                memory: Usage::of(&n.memory),
                gpus,
                datapoints: n.ticks,
                cores: n.cores.len() as u64,
            };
            nodes.insert(node.clone(), usage);
        }
        let evaluated = !nodes.is_empty();
        let summary = if evaluated {
            let pct = |v: Option<f64>| v.map_or("n/a".into(), |v| format!("{v:.1} %"));
            let parts: Vec<String> = nodes
                .iter()
                .map(|(k, n)| format!("{k}: CPU p95 {}, memory p95 {}", pct(n.cpu.p95), pct(n.memory.p95)))
                .collect();
            format!("{}.", parts.join("; "))
        } else {
            "No system metrics.".to_owned()
        };
        Verdict {
            triggered: false,
            evaluated,
            summary,
            advice: "",
            evidence: Evidence { nodes },
            ranges: Vec::new(),
        }
    }
}

impl Present for Evidence {
    fn present(&self) -> Table {
        let mut rows = Vec::new();
        for (node, n) in &self.nodes {
            let cpu = format!("cpu ({} cores, {} datapoints)", n.cores, n.datapoints);
            let resources = [(cpu, &n.cpu), ("memory".to_owned(), &n.memory)]
                .into_iter()
                .chain(n.gpus.iter().map(|(k, v)| (k.clone(), v)));
            for (what, u) in resources {
                rows.push(vec![
                    node.as_str().into(),
                    what.into(),
                    u.p50.into(),
                    u.p95.into(),
                    u.p99.into(),
                    u.max.into(),
                ]);
            }
        }
        Table {
            facts: Vec::new(),
            columns: vec!["node", "resource", "p50", "p95", "p99", "max"],
            rows,
            units: &[("p50", "%"), ("p95", "%"), ("p99", "%"), ("max", "%")],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Agg;
    use super::*;
    use crate::reading::Tick;

    #[test]
    fn per_node_and_gpu() {
        let mut a = Agg::new(Some(10));
        for i in 0..40 {
            let t = Tick {
                t_s: 100.0 + f64::from(i),
                cores: vec![(0, 50.0)],
                memory: Some(25.0),
                gpus: vec![("gpu0".into(), Some(90.0), Some(10.0))],
                ..Tick::default()
            };
            a.tick("algo-1", &t);
        }
        a.finish();
        let f = OverallSystemUsage::verdict(&a, None);
        assert!(f.evaluated && !f.triggered);
        let n = &f.evidence.nodes["algo-1"];
        assert_eq!(n.memory.p50, Some(25.0));
        assert_eq!(n.gpus["gpu0_util"].p95, Some(90.0));
        assert_eq!((n.datapoints, n.cores), (40, 1));
        // In JSON the GPUs' keys sit beside `cpu` and `memory`.
        let v = serde_json::to_value(&f.evidence).unwrap();
        assert_eq!(v["nodes"]["algo-1"]["gpu0_util"]["p95"], 90.0);
        assert_eq!(v["nodes"]["algo-1"]["datapoints"], 40);
        assert_eq!(serde_json::from_value::<Evidence>(v).unwrap(), f.evidence);
    }
}
