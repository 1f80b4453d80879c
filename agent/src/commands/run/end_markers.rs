//! The `training_job_end.ts` markers (docs/formats.md, "End-of-job markers"): written at
//! the end of a job, and read at the start to tell that a folder holds a finished one.

use std::io;
use std::path::Path;

use trainprof_output::fs::{self as ofs, Dir};

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
