//! The ten findings: SageMaker Debugger's built-in profiler rules with their default thresholds
//! (`docs/report.md`, "Findings" says what each checks and how it differs from SageMaker's).
//!
//! One file per rule holds all of it: its name, its thresholds, what it keeps per node while
//! the ticks are read, its 60 s judgements, its verdict over the job, and the table the page
//! shows for its evidence ([`Present`]). The evidence's typed structs (the `--json` keys) are
//! the model's (`model/evidence.rs`), which reads a finding back without the rules.
//! `registry!` below lists the rules, in the order of `findings`; adding a rule is a file, its
//! evidence in the model and a line here (ARCHITECTURE.md, "Extending it").

pub mod batch_size;
pub mod bottleneck;
pub mod dataloader;
pub mod gpu_memory;
pub mod load_balancing;
pub mod low_gpu;
pub mod max_init;
pub mod memory_leak;
pub mod overall;
pub mod rule;
pub mod step_outlier;

use crate::analysis::collect::{self, NodeJudge};
use crate::model::evidence::Evidence;
use crate::model::{Finding, Preliminary};
use rule::{Rule, StateOf, TickView, Verdict, Window};

pub use rule::{Cell, Options, Present, Row, Table};

/// The one-pass aggregates with every rule's state per node (`analysis/collect.rs`).
pub type Agg = collect::Agg<NodeRules>;
/// One system node's aggregates with every rule's state.
pub type NodeAgg = collect::NodeAgg<NodeRules>;

/// The registry: each line is `Variant(field): Type`, naming the rule's variant of the
/// model's [`Evidence`] and its state in [`NodeRules`]. The order is the order of `findings`.
macro_rules! registry {
    ($($variant:ident($field:ident): $rule:ty),* $(,)?) => {
        /// Every rule's name, in the order `findings` lists them.
        pub const RULES: [&str; [$(stringify!($field)),*].len()] = [$(<$rule as Rule>::NAME),*];

        /// What every rule keeps for one system node.
        #[derive(Debug, Clone, Default)]
        pub struct NodeRules {
            $($field: <$rule as Rule>::Node,)*
        }

        $(impl StateOf<$rule> for NodeRules {
            fn state(&self) -> &<$rule as Rule>::Node {
                &self.$field
            }
            fn state_mut(&mut self) -> &mut <$rule as Rule>::Node {
                &mut self.$field
            }
        })*

        impl NodeRules {
            /// Rule `R`'s state for this node.
            pub fn of<R: Rule>(&self) -> &R::Node
            where
                Self: StateOf<R>,
            {
                StateOf::<R>::state(self)
            }

            /// One tick of the node, for every rule.
            pub fn tick(&mut self, t: &TickView<'_>) {
                $(<$rule as Rule>::tick(&mut self.$field, t);)*
            }

            /// A judgement of the node's data so far, for every rule.
            pub fn judge(&mut self, node: &NodeAgg, w: &Window) {
                $(<$rule as Rule>::judge(&mut self.$field, node, w);)*
            }
        }

        impl NodeJudge for NodeRules {
            fn tick(&mut self, t: &TickView<'_>) {
                NodeRules::tick(self, t)
            }
            fn judge(&mut self, node: &NodeAgg, w: &Window) {
                NodeRules::judge(self, node, w)
            }
        }

        /// Every finding, in `RULES` order; `agg` must be finished ([`Agg::finish`]).
        /// Without `--patience`, a rule not evaluated for less than its patience of data is
        /// judged on what there is and marked preliminary (`docs/report.md`, "Short jobs").
        pub fn all(agg: &mut Agg, job_start_s: Option<f64>) -> Vec<Finding> {
            let mut out = vec![$(finding(<$rule as Rule>::NAME, <$rule as Rule>::verdict(agg, job_start_s), Evidence::$variant)),*];
            if agg.patience.is_some() || out.iter().all(|f| f.evaluated) {
                return out;
            }
            agg.swap_preliminary();
            let mut i = 0;
            $(
                if !out[i].evaluated
                    && let Some((have, need)) = <$rule as Rule>::datapoints(agg)
                    && have < need
                {
                    let v = <$rule as Rule>::verdict(agg, job_start_s);
                    if v.evaluated {
                        out[i] = finding(<$rule as Rule>::NAME, v, Evidence::$variant);
                        out[i].preliminary = Some(Preliminary {
                            datapoints: have,
                            patience: need,
                            unit: <$rule as Rule>::UNIT.to_owned(),
                        });
                    }
                }
                i += 1;
            )*
            let _ = i;
            agg.swap_preliminary();
            out
        }
    };
}

registry! {
    CpuBottleneck(cpu_bottleneck): bottleneck::Bottleneck<false>,
    IoBottleneck(io_bottleneck): bottleneck::Bottleneck<true>,
    LowGpuUtilization(low_gpu): low_gpu::LowGpuUtilization,
    GpuMemoryIncrease(gpu_memory): gpu_memory::GpuMemoryIncrease,
    GpuMemoryLeak(memory_leak): memory_leak::GpuMemoryLeak,
    BatchSize(batch_size): batch_size::BatchSize,
    StepOutlier(step_outlier): step_outlier::StepOutlier,
    Dataloader(dataloader): dataloader::Dataloader,
    MaxInitializationTime(max_init): max_init::MaxInitializationTime,
    LoadBalancing(load_balancing): load_balancing::LoadBalancing,
    OverallSystemUsage(overall): overall::OverallSystemUsage,
}

fn finding<E>(rule: &str, v: Verdict<E>, wrap: fn(E) -> Evidence) -> Finding {
    let triggered = v.triggered && v.evaluated;
    Finding {
        rule: rule.to_owned(),
        triggered,
        evaluated: v.evaluated,
        summary: v.summary,
        advice: if triggered { v.advice.to_owned() } else { String::new() },
        evidence: wrap(v.evidence),
        ranges: v.ranges,
        preliminary: None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `ticks` ticks of `algo-1`, one a second: core 0 at `core`, core 1 at 10 %, core 0's
    /// I/O wait at `iowait`, and one GPU per `(util, mem)`.
    pub fn run(ticks: usize, core: f64, iowait: f64, gpus: &[(f64, f64)]) -> Agg {
        run_with(Some(10), ticks, core, iowait, gpus)
    }

    pub fn run_with(patience: Option<u64>, ticks: usize, core: f64, iowait: f64, gpus: &[(f64, f64)]) -> Agg {
        let mut a = Agg::new(patience);
        for i in 0..ticks {
            let t = crate::reading::Tick {
                t_s: 1000.0 + i as f64,
                cores: vec![(0, core), (1, 10.0)],
                core_iowait: vec![(0, iowait)],
                memory: Some(20.0),
                gpus: gpus
                    .iter()
                    .enumerate()
                    .map(|(k, (u, m))| (format!("gpu{k}"), Some(*u), Some(*m)))
                    .collect(),
                ..crate::reading::Tick::default()
            };
            a.tick("algo-1", &t);
        }
        a.finish();
        a
    }

    pub fn get<'a>(f: &'a [Finding], rule: &str) -> &'a Finding {
        f.iter().find(|x| x.rule == rule).unwrap()
    }

    #[test]
    fn all_eleven_in_order_even_without_data() {
        let f = all(&mut Agg::default(), None);
        assert!(f.iter().map(|x| x.rule.as_str()).eq(RULES));
        assert!(f.iter().all(|x| !x.triggered && !x.evaluated));
        // Each finding's evidence is its own rule's.
        for x in &f {
            let json = serde_json::to_value(&x.evidence).unwrap();
            assert_eq!(Evidence::from_json(&x.rule, json).ok().as_ref(), Some(&x.evidence), "{}", x.rule);
        }
    }

    /// A 48 s job (481 ticks at 100 ms): without `--patience` every system rule is judged
    /// on what there is and says so; `--patience 1000` keeps SageMaker's "not evaluated".
    #[test]
    fn a_short_job_is_judged_preliminarily_unless_patience_is_given() {
        let short = |patience| {
            let mut a = run_with(patience, 481, 95.0, 0.0, &[(3.0, 10.0), (90.0, 30.0)]);
            a.dataloader_pids.insert(1000, [1, 2].into_iter().collect());
            a.dataloader_events = 2;
            all(&mut a, None)
        };
        let f = short(None);
        for rule in [
            "CPUBottleneck",
            "IOBottleneck",
            "LowGPUUtilization",
            "GPUMemoryIncrease",
            "BatchSize",
            "LoadBalancing",
        ] {
            let x = get(&f, rule);
            assert!(x.evaluated, "{rule}: {x:?}");
            let p = x.preliminary.as_ref().unwrap_or_else(|| panic!("{rule}: {x:?}"));
            assert_eq!(p.label(), "preliminary: 481 of 1000 datapoints", "{rule}");
        }
        // Judged, with their verdicts: a core at 95 % beside an idle GPU.
        assert!(get(&f, "CPUBottleneck").triggered);
        assert!(get(&f, "LowGPUUtilization").triggered);
        assert!(get(&f, "LoadBalancing").triggered);
        assert!(!get(&f, "IOBottleneck").triggered);
        let d = get(&f, "Dataloader");
        assert_eq!(
            d.preliminary.as_ref().map(Preliminary::label).as_deref(),
            Some("preliminary: 1 of 10 seconds")
        );
        // Rules without a patience are never preliminary.
        for rule in ["StepOutlier", "MaxInitializationTime", "OverallSystemUsage"] {
            assert!(get(&f, rule).preliminary.is_none(), "{rule}");
        }
        // The evidence states SageMaker's patience, not the preliminary one.
        let Evidence::CpuBottleneck(e) = &get(&f, "CPUBottleneck").evidence else { panic!() };
        assert_eq!(e.patience, 1000);
        // --patience 1000: SageMaker's behaviour.
        let f = short(Some(1000));
        for x in &f[..5] {
            assert!(!x.evaluated && x.preliminary.is_none(), "{x:?}");
        }
        // A long job: full verdicts, never preliminary.
        let mut a = run_with(None, 1200, 95.0, 0.0, &[(3.0, 10.0)]);
        let f = all(&mut a, None);
        assert!(f.iter().all(|x| x.preliminary.is_none()), "{f:?}");
        assert!(get(&f, "CPUBottleneck").evaluated && get(&f, "CPUBottleneck").triggered);
        // The label reaches --json and reads back.
        let f = short(None);
        let v = serde_json::to_value(&f[0]).unwrap();
        assert_eq!(
            v["preliminary"],
            serde_json::json!({"datapoints": 481, "patience": 1000, "unit": "datapoints"})
        );
        let back: Finding = serde_json::from_value(v).unwrap();
        assert_eq!(back, f[0]);
    }

    #[test]
    fn evidence_of_another_rule_is_refused() {
        let f = all(&mut run(20, 95.0, 0.0, &[(3.0, 10.0)]), None);
        let low = serde_json::to_value(&get(&f, "LowGPUUtilization").evidence).unwrap();
        assert!(Evidence::from_json("LowGPUUtilization", low.clone()).is_ok());
        assert!(Evidence::from_json("StepOutlier", low.clone()).is_err());
        assert!(Evidence::from_json("NoSuchRule", low).is_err());
    }

    /// Each rule's evidence is its typed struct: `--json` writes exactly the keys
    /// docs/report.md documents ("Findings"), and the JSON reads back into the same structs.
    #[test]
    fn evidence_round_trips_through_json_with_the_documented_keys() {
        let mut agg = run(600, 20.0, 0.0, &[(90.0, 30.0), (3.0, 30.0)]);
        let steps = (0..200).map(|i| crate::analysis::steps::StepRec {
            start_us: 1_000_000_000 + i * 1000,
            dur_us: 500,
            step: i,
        });
        agg.steps.entry("TRAIN".into()).or_default().insert("0-algo-1".into(), steps.collect());
        agg.first_step_us = Some(1_000_000_000);
        agg.snapshot_leaks = (
            1,
            vec![crate::model::evidence::memory_leak::LeakEvidence {
                node: "0-algo-1".into(),
                file: "framework/memory/0-algo-1/window-1-5-9.pickle".into(),
                device: 0,
                first_step: 1,
                last_step: 5,
                growth_bytes: 4 << 20,
                per_step_bytes: 1 << 20,
                site: String::new(),
            }],
        );
        let model = crate::model::ReportModel { findings: all(&mut agg, Some(990.0)), ..Default::default() };
        assert!(get(&model.findings, "LowGPUUtilization").triggered);
        let json = crate::to_json(&model);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let sorted = |k: &[&str]| -> Vec<String> {
            let mut k: Vec<String> = k.iter().map(|s| (*s).to_owned()).collect();
            k.sort();
            k
        };
        let node = [
            "datapoints",
            "bottlenecks",
            "percent",
            "low_gpu_datapoints",
            "windows_judged",
            "windows_triggered",
            "triggered_windows",
            "triggered",
        ];
        let expect: [(&str, &[&str], &str, &[&str]); 11] = [
            (
                "CPUBottleneck",
                &["threshold_percent", "gpu_threshold", "cpu_threshold", "patience", "nodes"],
                "nodes",
                &node,
            ),
            (
                "IOBottleneck",
                &["threshold_percent", "gpu_threshold", "io_threshold", "patience", "nodes"],
                "nodes",
                &node,
            ),
            (
                "LowGPUUtilization",
                &["threshold_p95", "threshold_p5", "window", "patience", "gpus"],
                "gpus",
                &[
                    "node",
                    "gpu",
                    "datapoints",
                    "windows_judged",
                    "windows_triggered",
                    "issue",
                    "window_p95",
                    "window_p5",
                    "p50",
                    "p95",
                    "max",
                ],
            ),
            (
                "GPUMemoryIncrease",
                &["increase", "window", "patience", "gpus"],
                "gpus",
                &["node", "gpu", "datapoints", "max_increase", "at_s", "violations", "p50", "max"],
            ),
            (
                "GPUMemoryLeak",
                &["min_growth_bytes", "min_step_starts", "devices_judged", "leaks"],
                "leaks",
                &[
                    "node",
                    "file",
                    "device",
                    "first_step",
                    "last_step",
                    "growth_bytes",
                    "per_step_bytes",
                    "site",
                ],
            ),
            (
                "BatchSize",
                &[
                    "cpu_threshold_p95",
                    "gpu_threshold_p95",
                    "gpu_memory_threshold_p95",
                    "window",
                    "patience",
                    "gpus",
                ],
                "gpus",
                &[
                    "node",
                    "gpu",
                    "windows_judged",
                    "windows_triggered",
                    "cpu_p95",
                    "gpu_p95",
                    "gpu_memory_p95",
                    "job_cpu_p95",
                    "job_gpu_p95",
                    "job_gpu_memory_p95",
                ],
            ),
            (
                "StepOutlier",
                &["stddev", "n_outliers", "min_steps", "ranks"],
                "ranks",
                &["rank", "mode", "steps", "threshold_ms", "outliers", "outlier_steps", "triggered"],
            ),
            (
                "Dataloader",
                &[
                    "min_threshold",
                    "max_threshold",
                    "patience",
                    "cores",
                    "parallel_dataloaders_median",
                    "seconds_with_dataloading",
                    "events",
                    "num_workers",
                    "pin_memory",
                    "dataloading_time_s",
                ],
                "dataloading_time_s",
                &["p25", "p50", "p95"],
            ),
            ("MaxInitializationTime", &["threshold_minutes", "init_s"], "", &[]),
            (
                "LoadBalancing",
                &["threshold", "patience", "pairs_compared", "pairs"],
                "pairs",
                &["node", "gpus", "distance", "triggered"],
            ),
            (
                "OverallSystemUsage",
                &["nodes"],
                "nodes",
                &[
                    "cpu",
                    "memory",
                    "gpu0_util",
                    "gpu0_memory",
                    "gpu1_util",
                    "gpu1_memory",
                    "datapoints",
                    "cores",
                ],
            ),
        ];
        let findings = v["findings"].as_array().unwrap();
        assert_eq!(findings.len(), expect.len());
        for (f, (rule, top, inner, inner_keys)) in findings.iter().zip(expect) {
            assert_eq!(f["rule"], rule);
            let e = &f["evidence"];
            assert_eq!(keys(e), sorted(top), "{rule}");
            if inner.is_empty() {
                continue;
            }
            // The first row (a list's first item, a map's first value, or the object itself).
            let row = match &e[inner] {
                serde_json::Value::Array(a) => {
                    a.first().unwrap_or_else(|| panic!("{rule}: no {inner}")).clone()
                }
                serde_json::Value::Object(o) if o.contains_key("p50") => e[inner].clone(),
                serde_json::Value::Object(o) => {
                    o.values().next().unwrap_or_else(|| panic!("{rule}: no {inner}")).clone()
                }
                other => panic!("{rule}: {inner} is {other}"),
            };
            assert_eq!(keys(&row), sorted(inner_keys), "{rule}.{inner}");
        }
        // Read back: every finding's evidence as its rule's struct, equal to what was written.
        let back: crate::model::ReportModel = serde_json::from_str(&json).unwrap();
        assert_eq!(back.findings, model.findings);
        let Evidence::LowGpuUtilization(low) = &back.findings[2].evidence else {
            panic!("{:?}", back.findings[2])
        };
        assert_eq!(low.gpus[1].issue.as_deref(), Some("underutilized"));
    }
}
