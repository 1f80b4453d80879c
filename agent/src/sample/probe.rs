//! Probing every sampler once at the start: what is there to sample on this machine.

use std::ffi::OsStr;
use std::time::Duration;

use super::cgroup::{CgroupMemory, CgroupSampler};
use super::cpu::CpuSampler;
use super::disk::DiskSampler;
use super::memory::MemorySampler;
use super::net::NetSampler;
use super::process::{SelfSampler, TreeSampler};
use super::{Roots, SampleError, Sampler, gpu};

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
}

impl std::fmt::Debug for Probed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.samplers.iter().map(|s| s.name()).collect();
        f.debug_struct("Probed").field("samplers", &names).field("absent", &self.absent).finish()
    }
}

/// Probes every source. A source that fails to probe is left out with its reason; the
/// agent runs with whatever remains. `now` is asked again for each sampler, since a probe
/// (NVML's above all) can take a while and a sampler's first rate is measured from its
/// own first reading.
pub fn probe_samplers(
    roots: &Roots,
    now: &dyn Fn() -> Duration,
    trainer: Option<u32>,
    nvml_lib: Option<&OsStr>,
) -> Probed {
    let mut p = Probed::default();
    let keep = |p: &mut Probed, what: &str, r: Result<Option<Box<dyn Sampler>>, SampleError>| match r {
        Ok(Some(s)) => p.samplers.push(s),
        Ok(None) => p.absent.push(what.to_owned()),
        Err(e) => p.absent.push(format!("{what}: {e}")),
    };
    let cpu = CpuSampler::probe(&roots.proc).map(|s| {
        p.cores = s.cores();
        Some(Box::new(s) as Box<dyn Sampler>)
    });
    keep(&mut p, "cpu", cpu);
    let cgroup_memory = CgroupMemory::probe(roots).unwrap_or_else(|e| {
        crate::log!("memory against the host: {e}");
        None
    });
    keep(&mut p, "memory", MemorySampler::probe(&roots.proc, cgroup_memory).map(|s| Some(Box::new(s) as _)));
    keep(&mut p, "disks", DiskSampler::probe(&roots.sys, now()).map(|s| s.map(|s| Box::new(s) as _)));
    keep(&mut p, "network", NetSampler::probe(&roots.proc, now()).map(|s| Some(Box::new(s) as _)));
    keep(&mut p, "cgroup", CgroupSampler::probe(roots, now()).map(|s| s.map(|s| Box::new(s) as _)));
    let gpus = gpu::probe(nvml_lib).map(|s| {
        s.map(|s| {
            p.gpus = s.facts().len();
            Box::new(s) as Box<dyn Sampler>
        })
    });
    keep(&mut p, "gpu", gpus);
    if let Some(pid) = trainer {
        p.samplers.push(Box::new(TreeSampler::new(&roots.proc, pid, now())));
    }
    p.samplers.push(Box::new(SelfSampler::new(SELF_EVERY, now())));
    p
}
