//! GPUMemoryLeak: a PyTorch memory snapshot's allocated memory grows at every step start of
//! its history (`docs/report.md`, "Memory", "Leak"), beside GPUMemoryIncrease, which sees the
//! whole GPU's memory from the system metrics. The judgement per snapshot device is
//! `analysis/memory.rs`'s; this rule gathers it into `findings`.

use super::rule::{Present, Rule, StateOf, Table, Verdict};
use crate::analysis::collect;
use crate::analysis::memory::{LEAK_MIN_BYTES, LEAK_MIN_STEPS};
use crate::model::evidence;
pub use crate::model::evidence::memory_leak::Evidence;

#[derive(Debug)]
pub struct GpuMemoryLeak;

impl Rule for GpuMemoryLeak {
    const NAME: &'static str = evidence::GPU_MEMORY_LEAK;
    type Node = ();
    type Evidence = Evidence;

    fn verdict<S: StateOf<Self>>(agg: &collect::Agg<S>, _job_start_s: Option<f64>) -> Verdict<Evidence> {
        let (judged, leaks) = &agg.snapshot_leaks;
        let mib = |b: i64| b as f64 / 1048576.0;
        let summary = match leaks.first() {
            _ if *judged == 0 => format!(
                "No memory snapshot's history spans {} step starts: a leak cannot be judged.",
                LEAK_MIN_STEPS + 1
            ),
            None => format!(
                "Allocated memory did not grow at every step start in any of the {judged} snapshot device(s) judged."
            ),
            Some(l) => format!(
                "Allocated memory grew at every step start in {} of {judged} snapshot device(s): on {} device {}, steps {}–{}, {:.1} MiB in all, {:.1} MiB a step{}.",
                leaks.len(),
                l.node,
                l.device,
                l.first_step,
                l.last_step,
                mib(l.growth_bytes),
                mib(l.per_step_bytes),
                if l.site.is_empty() {
                    String::new()
                } else {
                    format!("; most of it allocated at {}", l.site)
                }
            ),
        };
        Verdict {
            triggered: !leaks.is_empty(),
            evaluated: *judged > 0,
            summary,
            advice: "Memory allocated in each step stays live: look at the frame named (a tensor kept in a list, a loss kept with its graph instead of `.item()`, a growing cache), and at the snapshot in pytorch.org/memory_viz.",
            evidence: Evidence {
                min_growth_bytes: LEAK_MIN_BYTES,
                min_step_starts: LEAK_MIN_STEPS as u64 + 1,
                devices_judged: *judged,
                leaks: leaks.clone(),
            },
            ranges: Vec::new(),
        }
    }
}

impl Present for Evidence {
    fn present(&self) -> Table {
        Table::of(
            vec![
                ("min_growth_bytes", self.min_growth_bytes.into()),
                ("min_step_starts", self.min_step_starts.into()),
                ("devices_judged", self.devices_judged.into()),
            ],
            &self.leaks,
        )
        .units(&[
            ("min_growth_bytes", "bytes"),
            ("min_step_starts", "step starts"),
            ("devices_judged", "devices"),
            ("device", ""),
            ("first_step", ""),
            ("last_step", ""),
            ("growth_bytes", "bytes"),
            ("per_step_bytes", "bytes"),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::super::Agg;
    use super::*;
    use crate::model::evidence::memory_leak::LeakEvidence;

    #[test]
    fn a_snapshot_that_grew_at_every_step_start_triggers() {
        let mut a = Agg::default();
        assert!(!GpuMemoryLeak::verdict(&a, None).evaluated);
        a.snapshot_leaks.0 = 2;
        let v = GpuMemoryLeak::verdict(&a, None);
        assert!(v.evaluated && !v.triggered, "{}", v.summary);
        a.snapshot_leaks.1.push(LeakEvidence {
            node: "0-h".into(),
            file: "framework/memory/0-h/window-0-5-1.pickle".into(),
            device: 0,
            first_step: 1,
            last_step: 5,
            growth_bytes: 16 << 20,
            per_step_bytes: 4 << 20,
            site: "/job/train.py:30 remember".into(),
        });
        let v = GpuMemoryLeak::verdict(&a, None);
        assert!(v.evaluated && v.triggered);
        assert!(
            v.summary.contains("4.0 MiB a step; most of it allocated at /job/train.py:30 remember"),
            "{}",
            v.summary
        );
        assert_eq!(v.evidence.leaks.len(), 1);
    }
}
