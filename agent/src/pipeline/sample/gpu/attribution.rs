//! Which of a GPU's processes belong to the trainer tree (`docs/formats.md`, "GPU: the
//! trainer's processes").
//!
//! The tree's pids are the ones this agent's `/proc` shows. NVML's process lists carry host
//! pids (current drivers translate the running-compute-process list into the caller's pid
//! namespace, not the utilisation samples). So:
//! * the agent's `/proc` is in the host (initial) pid namespace: a pid matches directly, and
//!   a pid outside the tree is someone else's, left out;
//! * otherwise (a container with its own pid namespace) a pid that matches the tree is
//!   ours, the rest is *unattributed* (it may be ours under its host pid, or not). One
//!   exception: when every running compute process on the GPU matched the tree (the driver
//!   translated them), the utilisation samples that did not match are the same processes
//!   under their host pids, so they count towards the tree's totals (not its per-process
//!   rows). `NSpid` in `/proc/<pid>/status` cannot help there: it lists a process's pids
//!   from the reading `/proc`'s namespace inwards, never the host's.

use std::path::Path;

use super::samples::ProcessBusy;

/// The kernel's inode number of the initial pid namespace (`PROC_PID_INIT_INO`), what
/// `readlink /proc/self/ns/pid` shows as `pid:[4026531836]` in the host namespace.
pub const INIT_PID_NS_INODE: u64 = 0xEFFF_FFFC;

/// How many of the tree's processes per GPU get their own rows.
pub const TOP: usize = 3;

/// The pid namespace of the agent's `/proc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidNamespace {
    /// The initial one: its pids are NVML's.
    Host,
    /// Another one (or one that could not be read): NVML's pids may not be ours.
    Child,
}

impl PidNamespace {
    /// From the text of the `<proc>/self/ns/pid` link (`pid:[4026531836]`).
    pub fn from_link(text: &str) -> PidNamespace {
        let inode = text.strip_prefix("pid:[").and_then(|r| r.strip_suffix(']')).and_then(|n| n.parse().ok());
        if inode == Some(INIT_PID_NS_INODE) { PidNamespace::Host } else { PidNamespace::Child }
    }

    /// The namespace `proc_root` (a `/proc`) shows pids in; `Child` when it cannot be read.
    pub fn of(proc_root: &Path) -> PidNamespace {
        match std::fs::read_link(proc_root.join("self/ns/pid")) {
            Ok(target) => PidNamespace::from_link(&target.to_string_lossy()),
            Err(_) => PidNamespace::Child,
        }
    }
}

/// One running compute process: its pid and GPU memory (`None`: NVML cannot say, e.g. on
/// Windows WDDM or without permission).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pub pid: u32,
    pub used_bytes: Option<u64>,
}

/// One of the tree's processes on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TreeProcess {
    pub pid: u32,
    pub used_bytes: u64,
    pub sm_percent: f64,
    pub memory_busy_percent: f64,
}

/// GPU processes that may or may not be ours (child pid namespace only).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Unattributed {
    pub processes: u32,
    pub used_bytes: u64,
    pub sm_percent: f64,
}

/// One GPU's processes sorted into the tree's and the rest.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attribution {
    /// The tree's processes seen on the GPU (in either list).
    pub processes: u32,
    pub used_bytes: u64,
    /// Sums over the tree's processes, at most 100.
    pub sm_percent: f64,
    pub memory_busy_percent: f64,
    /// `None` in the host pid namespace.
    pub unattributed: Option<Unattributed>,
    /// The busiest of the tree's processes (SM busy, then memory), at most [`TOP`].
    pub top: Vec<TreeProcess>,
}

/// Sorts one GPU's processes; `tree` must be sorted. `memory` / `busy` are `None` when that
/// list could not be read this tick.
pub fn attribute(
    memory: Option<&[ProcessMemory]>,
    busy: Option<&[ProcessBusy]>,
    tree: &[u32],
    ns: PidNamespace,
) -> Attribution {
    let ours_pid = |pid: u32| tree.binary_search(&pid).is_ok();
    let mut ours: Vec<TreeProcess> = Vec::new();
    let mut entry = |pid: u32| -> usize {
        match ours.iter().position(|p| p.pid == pid) {
            Some(i) => i,
            None => {
                ours.push(TreeProcess { pid, ..TreeProcess::default() });
                ours.len() - 1
            }
        }
    };
    let mut slots: Vec<(usize, Option<u64>, Option<&ProcessBusy>)> = Vec::new();
    let mut others: Vec<u32> = Vec::new();
    let mut un = Unattributed::default();
    let mut sm_extra = 0.0;
    let mut mem_extra = 0.0;
    let all_compute_ours = ns == PidNamespace::Child
        && memory.is_some_and(|m| !m.is_empty() && m.iter().all(|p| ours_pid(p.pid)));
    for p in memory.unwrap_or(&[]) {
        if ours_pid(p.pid) {
            slots.push((entry(p.pid), p.used_bytes, None));
        } else if ns == PidNamespace::Child {
            others.push(p.pid);
            un.used_bytes += p.used_bytes.unwrap_or(0);
        }
    }
    for b in busy.unwrap_or(&[]) {
        if ours_pid(b.pid) {
            slots.push((entry(b.pid), None, Some(b)));
        } else if all_compute_ours {
            sm_extra += b.sm_percent;
            mem_extra += b.memory_busy_percent;
        } else if ns == PidNamespace::Child {
            others.push(b.pid);
            un.sm_percent += b.sm_percent;
        }
    }
    for (i, bytes, b) in slots {
        let p = &mut ours[i];
        p.used_bytes += bytes.unwrap_or(0);
        if let Some(b) = b {
            p.sm_percent += b.sm_percent;
            p.memory_busy_percent += b.memory_busy_percent;
        }
    }
    others.sort_unstable();
    others.dedup();
    un.processes = others.len() as u32;
    un.sm_percent = un.sm_percent.min(100.0);
    let mut a = Attribution {
        processes: ours.len() as u32,
        used_bytes: ours.iter().map(|p| p.used_bytes).sum(),
        sm_percent: (ours.iter().map(|p| p.sm_percent).sum::<f64>() + sm_extra).min(100.0),
        memory_busy_percent: (ours.iter().map(|p| p.memory_busy_percent).sum::<f64>() + mem_extra).min(100.0),
        unattributed: (ns == PidNamespace::Child).then_some(un),
        top: ours,
    };
    a.top.sort_by(|x, y| {
        y.sm_percent.total_cmp(&x.sm_percent).then(y.used_bytes.cmp(&x.used_bytes)).then(x.pid.cmp(&y.pid))
    });
    a.top.truncate(TOP);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(pid: u32, mib: u64) -> ProcessMemory {
        ProcessMemory { pid, used_bytes: Some(mib << 20) }
    }

    fn busy(pid: u32, sm: f64, m: f64) -> ProcessBusy {
        ProcessBusy { pid, sm_percent: sm, memory_busy_percent: m }
    }

    #[test]
    fn the_namespace_comes_from_the_link_text() {
        assert_eq!(PidNamespace::from_link("pid:[4026531836]"), PidNamespace::Host);
        assert_eq!(PidNamespace::from_link("pid:[4026532451]"), PidNamespace::Child);
        assert_eq!(PidNamespace::from_link("garbage"), PidNamespace::Child);
        let t = tempfile::tempdir().unwrap();
        assert_eq!(PidNamespace::of(t.path()), PidNamespace::Child);
        std::fs::create_dir_all(t.path().join("self/ns")).unwrap();
        std::os::unix::fs::symlink("pid:[4026531836]", t.path().join("self/ns/pid")).unwrap();
        assert_eq!(PidNamespace::of(t.path()), PidNamespace::Host);
    }

    #[test]
    fn in_the_host_namespace_others_are_left_out() {
        let m = [mem(10, 100), mem(11, 50), mem(99, 1000)];
        let b = [busy(10, 30.0, 5.0), busy(12, 50.0, 10.0), busy(99, 90.0, 90.0)];
        let a = attribute(Some(&m), Some(&b), &[10, 11, 12], PidNamespace::Host);
        assert_eq!(a.processes, 3);
        assert_eq!(a.used_bytes, 150 << 20);
        assert_eq!(a.sm_percent, 80.0);
        assert_eq!(a.memory_busy_percent, 15.0);
        assert_eq!(a.unattributed, None);
        let pids: Vec<u32> = a.top.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [12, 10, 11]);
        assert_eq!(
            a.top[1],
            TreeProcess { pid: 10, used_bytes: 100 << 20, sm_percent: 30.0, memory_busy_percent: 5.0 }
        );
    }

    #[test]
    fn in_a_child_namespace_the_rest_is_unattributed() {
        let m = [mem(10, 100), mem(5000, 1000)];
        let b = [busy(10, 30.0, 5.0), busy(6000, 50.0, 10.0), busy(5000, 60.0, 1.0)];
        let a = attribute(Some(&m), Some(&b), &[10], PidNamespace::Child);
        assert_eq!((a.processes, a.used_bytes, a.sm_percent), (1, 100 << 20, 30.0));
        assert_eq!(
            a.unattributed,
            Some(Unattributed { processes: 2, used_bytes: 1000 << 20, sm_percent: 100.0 })
        );
    }

    #[test]
    fn when_every_compute_process_is_ours_the_host_pid_samples_are_too() {
        // The driver translated the compute list (pids 10, 11) but not the samples.
        let m = [mem(10, 100), mem(11, 100)];
        let b = [busy(7010, 30.0, 5.0), busy(7011, 20.0, 4.0)];
        let a = attribute(Some(&m), Some(&b), &[10, 11], PidNamespace::Child);
        assert_eq!((a.processes, a.sm_percent, a.memory_busy_percent), (2, 50.0, 9.0));
        assert_eq!(a.unattributed, Some(Unattributed::default()));
        assert!(a.top.iter().all(|p| p.sm_percent == 0.0));
        // Not in the host namespace: there those pids are someone else's.
        let a = attribute(Some(&m), Some(&b), &[10, 11], PidNamespace::Host);
        assert_eq!(a.sm_percent, 0.0);
    }

    #[test]
    fn a_missing_list_or_an_unknown_size_counts_nothing() {
        let m = [ProcessMemory { pid: 10, used_bytes: None }];
        let a = attribute(Some(&m), None, &[10], PidNamespace::Host);
        assert_eq!((a.processes, a.used_bytes), (1, 0));
        let a = attribute(None, None, &[10], PidNamespace::Child);
        assert_eq!(a, Attribution { unattributed: Some(Unattributed::default()), ..Attribution::default() });
    }
}
