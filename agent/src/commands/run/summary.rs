//! The closing summary of `trainprof agent` / `trainprof run`: this run's files under the
//! output folder, by kind, the loop's counts and the agent's own cost.

use std::fmt::Write as _;
use std::path::Path;

use trainprof_output::fs::{self as ofs, Dir};

use crate::pipeline::sink::LoopCounts;

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

/// [`files_under`] without the agent's own records ([`trainprof_output::ledger::DIR`]).
#[cfg(test)]
pub(crate) fn data_files_under(root: &Path) -> Vec<String> {
    let records = format!("{}/", trainprof_output::ledger::DIR);
    files_under(root).into_iter().filter(|f| !f.starts_with(&records)).collect()
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
    use crate::commands::run::end_markers::{finished_job, write_end_markers};

    #[test]
    fn markers_and_counts() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
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
    }
}
