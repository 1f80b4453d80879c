//! Probing every sampler once at the start: what is there to sample on this machine.

use std::ffi::OsStr;
use std::time::Duration;

use trainprof_output::protocol::node_record::{self, NodeGpu};

use super::cgroup::{CgroupMemory, CgroupSampler};
use super::clock::ClockSampler;
use super::cpu::CpuSampler;
use super::disk::DiskSampler;
use super::gpu::{self, GpuSampler, NvmlSource};
use super::memory::MemorySampler;
use super::net::NetSampler;
use super::pressure::PressureSampler;
use super::process::{SelfSampler, TreeSampler};
use super::tree_pids::TreePids;
use super::{Roots, SampleError, Sampler};

/// The agent writes its own metrics at most this often.
pub const SELF_EVERY: Duration = Duration::from_secs(10);

/// What the probes found, for the start-up line and the summary.
#[derive(Default)]
pub struct Probed {
    pub samplers: Vec<Box<dyn Sampler>>,
    /// The sources that are not sampled: a name (not here), or a name and why.
    pub absent: Vec<String>,
    pub cores: usize,
    pub gpus: usize,
    /// Each GPU's UUID by NVML index, where NVML gave one (the metrics endpoint's `uuid`).
    pub gpu_uuids: Vec<(u32, String)>,
    /// Each GPU's model and memory, for the node record (docs/formats.md, "Node record").
    pub gpu_record: Vec<NodeGpu>,
}

impl std::fmt::Debug for Probed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.samplers.iter().map(|s| s.name()).collect();
        f.debug_struct("Probed").field("samplers", &names).field("absent", &self.absent).finish()
    }
}

/// What every probe may need.
pub struct ProbeContext<'a> {
    pub roots: &'a Roots,
    /// Monotonic time, asked again for each sampler: a probe (NVML's above all) can take a
    /// while, and a sampler's first rate is measured from its own first reading.
    pub now: &'a dyn Fn() -> Duration,
    /// `trainprof run`'s command, whose process tree is sampled.
    pub trainer: Option<u32>,
    /// The NVML library to load instead of `libnvidia-ml.so.1`.
    pub nvml_lib: Option<&'a OsStr>,
    /// The trainer tree's pids: the tree sampler publishes, others (GPU) read.
    pub tree: TreePids,
}

impl std::fmt::Debug for ProbeContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeContext")
            .field("roots", self.roots)
            .field("trainer", &self.trainer)
            .field("nvml_lib", &self.nvml_lib)
            .field("tree", &self.tree)
            .finish_non_exhaustive()
    }
}

/// One signature for every sampler's start: `Ok(None)` when the source is not here.
pub trait Probe: Sampler + Sized + 'static {
    /// The source's name in the start-up line's "not sampled: …".
    const SOURCE: &'static str;
    /// Whether a source that is not here is named in that line.
    const SAY_ABSENT: bool = true;

    fn probe(cx: &ProbeContext<'_>) -> Result<Option<Self>, SampleError>;
}

impl Probe for CpuSampler {
    const SOURCE: &'static str = "cpu";
    fn probe(cx: &ProbeContext<'_>) -> Result<Option<Self>, SampleError> {
        CpuSampler::probe(&cx.roots.proc).map(Some)
    }
}

impl Probe for MemorySampler {
    const SOURCE: &'static str = "memory";
    fn probe(cx: &ProbeContext<'_>) -> Result<Option<Self>, SampleError> {
        let cgroup_memory = CgroupMemory::probe(cx.roots).unwrap_or_else(|e| {
            crate::log!("memory against the host: {e}");
            None
        });
        MemorySampler::probe(&cx.roots.proc, cgroup_memory).map(Some)
    }
}

impl Probe for DiskSampler {
    const SOURCE: &'static str = "disks";
    fn probe(cx: &ProbeContext<'_>) -> Result<Option<Self>, SampleError> {
        DiskSampler::probe(&cx.roots.sys, (cx.now)())
    }
}

impl Probe for NetSampler {
    const SOURCE: &'static str = "network";
    fn probe(cx: &ProbeContext<'_>) -> Result<Option<Self>, SampleError> {
        NetSampler::probe(&cx.roots.proc, (cx.now)()).map(Some)
    }
}

impl Probe for CgroupSampler {
    const SOURCE: &'static str = "cgroup";
    fn probe(cx: &ProbeContext<'_>) -> Result<Option<Self>, SampleError> {
        CgroupSampler::probe(cx.roots, (cx.now)())
    }
}

impl Probe for PressureSampler {
    const SOURCE: &'static str = "pressure";
    fn probe(cx: &ProbeContext<'_>) -> Result<Option<Self>, SampleError> {
        PressureSampler::probe(cx.roots, (cx.now)())
    }
}

impl Probe for ClockSampler {
    const SOURCE: &'static str = "clock";
    fn probe(_: &ProbeContext<'_>) -> Result<Option<Self>, SampleError> {
        ClockSampler::probe().map(Some)
    }
}

impl Probe for GpuSampler<NvmlSource> {
    const SOURCE: &'static str = "gpu";
    fn probe(cx: &ProbeContext<'_>) -> Result<Option<Self>, SampleError> {
        gpu::probe_with(cx.nvml_lib, cx.trainer.map(|_| cx.tree.clone()), &cx.roots.proc)
    }
}

impl Probe for TreeSampler {
    const SOURCE: &'static str = "trainer";
    /// `trainprof agent` has no trainer: nothing to say.
    const SAY_ABSENT: bool = false;
    fn probe(cx: &ProbeContext<'_>) -> Result<Option<Self>, SampleError> {
        Ok(cx.trainer.map(|pid| TreeSampler::new(&cx.roots.proc, pid, (cx.now)(), cx.tree.clone())))
    }
}

impl Probe for SelfSampler {
    const SOURCE: &'static str = "agent";
    fn probe(cx: &ProbeContext<'_>) -> Result<Option<Self>, SampleError> {
        Ok(Some(SelfSampler::new(SELF_EVERY, (cx.now)())))
    }
}

impl Probed {
    /// Probes `P`, keeps it or says why not; `seen` looks at it first.
    fn add<P: Probe>(&mut self, cx: &ProbeContext<'_>, seen: impl FnOnce(&mut Probed, &P)) {
        match P::probe(cx) {
            Ok(Some(s)) => {
                seen(self, &s);
                self.samplers.push(Box::new(s));
            }
            Ok(None) if P::SAY_ABSENT => self.absent.push(P::SOURCE.to_owned()),
            Ok(None) => {}
            Err(e) => self.absent.push(format!("{}: {e}", P::SOURCE)),
        }
    }
}

/// Probes every source. A source that fails to probe is left out with its reason; the
/// agent runs with whatever remains.
pub fn probe_samplers(cx: &ProbeContext<'_>) -> Probed {
    let mut p = Probed::default();
    p.add(cx, |p, s: &CpuSampler| p.cores = s.cores());
    p.add::<MemorySampler>(cx, |_, _| {});
    p.add::<DiskSampler>(cx, |_, _| {});
    p.add::<NetSampler>(cx, |_, _| {});
    p.add::<CgroupSampler>(cx, |_, _| {});
    p.add::<PressureSampler>(cx, |_, _| {});
    p.add(cx, |p, s: &GpuSampler<NvmlSource>| {
        p.gpus = s.facts().len();
        p.gpu_uuids = s.facts().iter().filter_map(|f| Some((f.index, f.uuid.clone()?))).collect();
        p.gpu_record = s
            .facts()
            .iter()
            .map(|f| NodeGpu {
                index: f.index,
                model: f.name.clone(),
                memory_total_bytes: f.memory_total_bytes,
                uuid: f.uuid.as_deref().map(|u| node_record::bounded(u, node_record::MAX_VALUE_BYTES)),
            })
            .collect();
    });
    p.add::<TreeSampler>(cx, |_, _| {});
    p.add::<ClockSampler>(cx, |_, _| {});
    p.add::<SelfSampler>(cx, |_, _| {});
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_machine_is_probed_with_reasons_and_the_agent_still_samples_itself() {
        let t = tempfile::tempdir().unwrap();
        let roots = Roots::under(t.path());
        let now = || Duration::from_secs(1);
        let nvml = t.path().join("no-libnvidia-ml.so.1");
        let mut cx = ProbeContext {
            roots: &roots,
            now: &now,
            trainer: None,
            nvml_lib: Some(nvml.as_os_str()),
            tree: TreePids::default(),
        };
        let p = probe_samplers(&cx);
        let names: Vec<_> = p.samplers.iter().map(|s| s.name()).collect();
        // The clock is the kernel's, whatever the roots.
        assert_eq!(names, ["clock", "agent"], "{p:?}");
        assert!(p.absent.iter().any(|a| a.starts_with("cpu: ")), "{p:?}");
        assert!(!p.absent.iter().any(|a| a.starts_with("trainer")), "{p:?}");
        assert_eq!((p.cores, p.gpus), (0, 0));
        // With a trainer, its tree is sampled too.
        cx.trainer = Some(std::process::id());
        let p = probe_samplers(&cx);
        let names: Vec<_> = p.samplers.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["trainer", "clock", "agent"], "{names:?}");
    }
}
