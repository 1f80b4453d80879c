//! `trainprof agent` and `trainprof run`: the output folder, the samplers, the end markers
//! and the summary. Argument parsing and process plumbing live in `main.rs`.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use trainprof_output::fs::{self as ofs, Dir};

use crate::sample::cgroup::{CgroupMemory, CgroupSampler};
use crate::sample::cpu::CpuSampler;
use crate::sample::disk::DiskSampler;
use crate::sample::memory::MemorySampler;
use crate::sample::net::NetSampler;
use crate::sample::process::{SelfSampler, TreeSampler};
use crate::sample::{Roots, SampleError, Sampler, gpu};
use crate::tick::LoopCounts;

/// The agent writes its own metrics at most this often.
pub const SELF_EVERY: Duration = Duration::from_secs(10);

/// The folder used when the configured one cannot be written and nobody chose it.
pub const FALLBACK_DIR: &str = "trainprof-output";

/// Checks that `dir` can be created and written, by making a new file in it (never
/// through a planted name: `docs/on-disk.md`) and removing it again.
pub fn writable(dir: &Path) -> io::Result<()> {
    let root = Dir::open_root(dir, true)?;
    let pid = std::process::id();
    // Names nobody can guess ahead: planted ones cannot make the folder look unwritable.
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut last = None;
    for k in 0..8 {
        let probe = format!(".trainprof-write-test-{pid}-{nanos}-{k}");
        match root.create_new(&probe) {
            Ok(f) => {
                root.unlink_if_same(&probe, &f)?;
                return Ok(());
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free name for a test file")))
}

/// Where the files go. `explicit`: the user chose the folder (flag, variable or config
/// file), so an unwritable one is an error; otherwise the first writable of the default,
/// `./trainprof-output` and `<tmp>/trainprof-output`, with a line saying so.
pub fn output_root(
    configured: &Path,
    explicit: bool,
    cwd: &Path,
) -> Result<(PathBuf, Option<String>), String> {
    let first = match writable(configured) {
        Ok(()) => return Ok((configured.to_owned(), None)),
        Err(e) if explicit => return Err(format!("cannot write to {}: {e}", configured.display())),
        Err(e) => e,
    };
    for dir in [cwd.join(FALLBACK_DIR), std::env::temp_dir().join(FALLBACK_DIR)] {
        if own_folder(&dir).is_ok() && writable(&dir).is_ok() {
            let note = format!(
                "cannot write to {} ({first}); writing to {} instead",
                configured.display(),
                dir.display()
            );
            return Ok((dir, Some(note)));
        }
    }
    Err(format!("cannot write to {} ({first}) nor to a fallback folder", configured.display()))
}

/// A fallback folder nobody chose is used only if it is missing (then made here) or a real
/// folder of this user that no one else can write: in a shared place such as `/tmp`,
/// another user could have put a link there, or files for the uploader to take.
fn own_folder(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let meta = match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).create(dir)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
            std::fs::symlink_metadata(dir)?
        }
        other => other?,
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if !meta.file_type().is_dir() || meta.uid() != euid || meta.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!("{} is not a folder of this user's alone", dir.display())));
    }
    Ok(())
}

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

/// Writes `system/training_job_end.ts` and `framework/training_job_end.ts` (docs/formats.md, "End-of-job markers");
/// the content is the time, which no reader looks at. Each is written under a temporary
/// name and renamed over an older job's (`trainprof_output::fs::write_replacing`).
pub fn write_end_markers(root: &Path, wall_s: f64) -> io::Result<()> {
    let root = Dir::open_root(root, true)?;
    for rel in trainprof_output::END_MARKERS {
        let (folder, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let dir = root.sub(folder, true)?;
        ofs::write_replacing(&dir, name, format!("{wall_s:.6}\n").as_bytes())?;
    }
    Ok(())
}

/// The time in an end marker already under `root`: the output folder holds a finished
/// job (an earlier run into the same folder).
pub fn finished_job(root: &Path) -> Option<String> {
    let root = Dir::open_root(root, false).ok()?;
    trainprof_output::END_MARKERS.iter().find_map(|rel| {
        let (folder, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        // A marker holds one time: anything larger is not one of ours.
        let bytes = root.sub(folder, false).ok()?.read(name, 64).ok()??;
        let s: f64 = String::from_utf8_lossy(&bytes).trim().parse().ok()?;
        Some(trainprof_output::UtcTime::from_epoch_s(s.floor() as i64).to_string())
    })
}

/// Sealed files under the output folder, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutputCounts {
    pub system: u64,
    pub timelines: u64,
    pub python_stats: u64,
    /// Temporary files left behind (a writer that could not seal).
    pub temporary: u64,
    /// Entries under the output folder left alone: links, special files.
    pub refused: u64,
}

/// Every regular file under `root` (never through a link), as sorted `/`-separated paths
/// relative to it; unreadable folders, links and special files are left out.
pub fn files_under(root: &Path) -> Vec<String> {
    walk_outputs(root).files.into_iter().map(|(rel, _)| rel).collect()
}

/// The whole output folder, walked without following a link: its regular files and the
/// entries left alone.
pub fn walk_outputs(root: &Path) -> ofs::Walk {
    match Dir::open_root(root, false) {
        Ok(dir) => ofs::walk(&dir, "", &|_, _| true),
        Err(e) => ofs::Walk { files: Vec::new(), refused: vec![format!("{}: {e}", root.display())] },
    }
}

/// Counts the files `rels` (paths relative to the output folder) the way the readers see
/// them. The summary passes this run's files only: those on disk now or uploaded, less
/// those that were there when it started.
pub fn count_outputs<'a>(rels: impl IntoIterator<Item = &'a str>) -> OutputCounts {
    let mut c = OutputCounts::default();
    for rel in rels {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        if rel.starts_with(".tmp/") || name.ends_with(".tmp") {
            c.temporary += 1;
        } else if rel.starts_with("system/incremental/") && name.ends_with(".json") {
            c.system += 1;
        } else if rel.starts_with("framework/pevents/") && name.ends_with(".json") {
            c.timelines += 1;
        } else if rel.starts_with("framework/")
            && (rel.contains("/cprofile/") || rel.contains("/pyinstrument/"))
        {
            c.python_stats += 1;
        }
    }
    c
}

/// `libtrainprof_hook.so` next to the binary, or in `../lib` from it.
pub fn hook_lib_near(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    [dir.join("libtrainprof_hook.so"), dir.join("../lib/libtrainprof_hook.so")]
        .into_iter()
        .find(|p| p.is_file())
}

/// The agent's cost over its life.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SelfCost {
    pub cpu_us: u64,
    pub rss_bytes: u64,
    pub wall_s: f64,
}

/// The closing summary, a few lines.
pub fn summary(root: &Path, out: OutputCounts, loop_counts: &LoopCounts, cost: SelfCost) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "output: {}", root.display());
    let _ = write!(
        s,
        "files: {} system, {} timeline, {} python-stats",
        out.system, out.timelines, out.python_stats
    );
    if out.temporary > 0 {
        let _ = write!(s, ", {} temporary (not sealed)", out.temporary);
    }
    if out.refused > 0 {
        let _ = write!(s, "; {} links or special files left alone", out.refused);
    }
    s.push('\n');
    let failures: Vec<String> = loop_counts
        .sample_failures
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    let _ = writeln!(
        s,
        "ticks: {} written, {} skipped (late), {} lost (not written); failed reads: {}",
        loop_counts.ticks.saturating_sub(loop_counts.system.ticks_lost),
        loop_counts.skipped,
        loop_counts.system.ticks_lost,
        if failures.is_empty() { "none".to_owned() } else { failures.join(", ") }
    );
    let ticks = loop_counts.ticks.max(1) as f64;
    let per_tick = loop_counts.sampling_cpu_us as f64 / ticks;
    let share = if cost.wall_s > 0.0 { cost.cpu_us as f64 / 1e4 / cost.wall_s } else { 0.0 };
    let _ = writeln!(
        s,
        "agent: {:.1} ms CPU in {:.1} s ({share:.2} % of one core; {per_tick:.0} µs per tick after start-up), RSS {:.1} MiB",
        cost.cpu_us as f64 / 1e3,
        cost.wall_s,
        cost.rss_bytes as f64 / 1_048_576.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("trainprof-launch-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_default_folder_falls_back_a_chosen_one_does_not() {
        let d = tmp("root");
        let blocked = d.join("file");
        std::fs::write(&blocked, b"x").unwrap();
        let (root, note) = output_root(&blocked.join("out"), false, &d).unwrap();
        assert_eq!(root, d.join(FALLBACK_DIR));
        assert!(note.unwrap().contains("instead"));
        assert!(output_root(&blocked.join("out"), true, &d).unwrap_err().contains("cannot write"));
        assert_eq!(output_root(&d.join("ok"), true, &d).unwrap(), (d.join("ok"), None));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_write_check_and_the_markers_never_write_through_a_link() {
        use std::os::unix::fs::symlink;
        let d = tmp("planted");
        let secret = d.join("secret");
        std::fs::write(&secret, b"root only").unwrap();
        let local = d.join("local");
        std::fs::create_dir_all(local.join("framework")).unwrap();
        symlink(&secret, local.join("framework/training_job_end.ts")).unwrap();
        writable(&local).unwrap();
        write_end_markers(&local, 2.5).unwrap();
        assert_eq!(std::fs::read(&secret).unwrap(), b"root only");
        assert_eq!(
            std::fs::read_to_string(local.join("framework/training_job_end.ts")).unwrap(),
            "2.500000\n"
        );
        // A linked folder: refused, the target untouched.
        let elsewhere = d.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::remove_dir_all(local.join("framework")).unwrap();
        symlink(&elsewhere, local.join("framework")).unwrap();
        let e = write_end_markers(&local, 3.5).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_fallback_folder_someone_else_prepared_is_not_used() {
        use std::os::unix::fs::symlink;
        let d = tmp("fallback-link");
        let blocked = d.join("file");
        std::fs::write(&blocked, b"x").unwrap();
        let elsewhere = d.join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let cwd = d.join("cwd");
        std::fs::create_dir_all(&cwd).unwrap();
        symlink(&elsewhere, cwd.join(FALLBACK_DIR)).unwrap();
        let (root, _) = output_root(&blocked.join("out"), false, &cwd).unwrap();
        assert_ne!(root, cwd.join(FALLBACK_DIR), "a linked fallback is skipped");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn markers_and_counts() {
        let d = tmp("count");
        write_end_markers(&d, 1.5).unwrap();
        for f in [
            "system/incremental/2026112203/1795316880.algo-1.json",
            "system/.1795316940.algo-1.tmp",
            "framework/pevents/2026112203/1795316901809988_0-algo-1_pythontimeline.json",
            "framework/pytorch/cprofile/0-algo-1/prestepzero-x/python_stats",
            ".tmp/0-algo-1/y",
        ] {
            std::fs::create_dir_all(d.join(f).parent().unwrap()).unwrap();
            std::fs::write(d.join(f), b"").unwrap();
        }
        assert!(d.join("system/training_job_end.ts").is_file());
        assert!(d.join("framework/training_job_end.ts").is_file());
        assert_eq!(finished_job(&d).as_deref(), Some("1970-01-01T00:00:01Z"));
        // A newer job's markers replace an older one's.
        write_end_markers(&d, 60.0).unwrap();
        assert_eq!(finished_job(&d).as_deref(), Some("1970-01-01T00:01:00Z"));
        let files = files_under(&d);
        let c = count_outputs(files.iter().map(String::as_str));
        assert_eq!(c, OutputCounts { system: 1, timelines: 1, python_stats: 1, temporary: 2, refused: 0 });
        let lc = LoopCounts {
            ticks: 30,
            sampling_cpu_us: 1500,
            sample_failures: vec![("gpu", 2), ("cpu", 0)],
            ..LoopCounts::default()
        };
        let text = summary(&d, c, &lc, SelfCost { cpu_us: 3000, rss_bytes: 5 << 20, wall_s: 3.0 });
        assert!(text.contains("files: 1 system, 1 timeline, 1 python-stats, 2 temporary"), "{text}");
        assert!(text.contains("failed reads: gpu 2"), "{text}");
        assert!(text.contains("0.10 % of one core; 50 µs per tick after start-up), RSS 5.0 MiB"), "{text}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
