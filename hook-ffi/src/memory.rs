//! The files of PyTorch memory snapshots (docs/formats.md, "Memory windows" and "Memory
//! snapshots"): the adapter takes the snapshot and pickles it; the hook makes the file it
//! goes into.
//!
//! Everything below LocalPath may have been planted by the trainer's user (ARCHITECTURE.md):
//! each folder of `framework/memory/<node>/` is opened without following a link (made when
//! missing), and the file is created `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600, so a link
//! or a file already at its name is refused, never followed or replaced.

use std::fs::File;
use std::io;
use std::os::unix::fs::PermissionsExt as _;

use trainprof_output::fs::Dir;
use trainprof_output::protocol::memory_snapshot::{MEMORY_DIR, SnapshotKind, SnapshotName};

use crate::hook::Hook;

/// Names tried when one is taken by a file of the same µs (another snapshot of this rank
/// in the same µs cannot happen; a planted one can): each a µs later.
const TRIES: u64 = 4;

impl Hook {
    /// Creates the new, empty snapshot file for `kind` at steps `first..=last` (the OOM's
    /// step twice) written at `us`: its folder, its name and the open file (for writing).
    pub fn memory_snapshot_create(
        &self,
        kind: SnapshotKind,
        first: u64,
        last: u64,
        us: u64,
    ) -> io::Result<(Dir, String, File)> {
        let (Ok(first_step), Ok(last_step)) = (i64::try_from(first), i64::try_from(last)) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "step out of range"));
        };
        if last_step < first_step {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the last step is before the first"));
        }
        let root = Dir::open_root(self.local_path(), true)?;
        let dir = root.sub(&format!("{MEMORY_DIR}/{}", self.node_id()), true)?;
        let mut last_err = None;
        for n in 0..TRIES {
            let name = SnapshotName { kind, first_step, last_step, us: us.saturating_add(n) }.file_name();
            match dir.create_new(&name) {
                Ok(f) => {
                    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                    return Ok((dir, name, f));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("its names were all taken")))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn hook(dir: &std::path::Path) -> Arc<Hook> {
        let doc = serde_json::json!({"ProfilingParameters": {"LocalPath": dir, "MemoryProfilingConfig": {"OomSnapshot": true}}});
        let config =
            trainprof_config::from_bytes(doc.to_string().as_bytes(), &trainprof_config::Sources::default());
        Hook::new(crate::hook::Options {
            framework: "pytorch",
            config,
            node_id: "0-test".into(),
            os_pid: 1,
            queue_capacity: 64,
            base_us: 0,
            local_path_override: false,
            max_names: 1024,
        })
    }

    #[test]
    fn makes_the_file_once_and_refuses_a_planted_link() {
        let tmp = tempfile::tempdir().unwrap();
        let h = hook(tmp.path());
        assert!(h.memory_settings().oom_on());
        let (dir, name, f) = h.memory_snapshot_create(SnapshotKind::Window, 3, 5, 17).unwrap();
        let path = dir.display(&name);
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        let want = tmp.path().join(MEMORY_DIR).join(h.node_id()).join("window-3-5-17.pickle");
        assert_eq!(path, want);
        // The name is taken: the next µs.
        let (_, again, _) = h.memory_snapshot_create(SnapshotKind::Window, 3, 5, 17).unwrap();
        assert_eq!(again, "window-3-5-18.pickle");
        // A link planted at the name is neither followed nor replaced.
        let dir = want.parent().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        for n in 40..40 + TRIES {
            std::os::unix::fs::symlink(&victim, dir.join(format!("oom-7-{n}.pickle"))).unwrap();
        }
        assert!(h.memory_snapshot_create(SnapshotKind::Oom, 7, 7, 40).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        // A link in place of the node's folder: refused.
        let tmp2 = tempfile::tempdir().unwrap();
        let h2 = hook(tmp2.path());
        std::fs::create_dir_all(tmp2.path().join(MEMORY_DIR)).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), tmp2.path().join(MEMORY_DIR).join(h2.node_id()))
            .unwrap();
        assert!(h2.memory_snapshot_create(SnapshotKind::Oom, 1, 1, 1).is_err());
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
        assert!(h.memory_snapshot_create(SnapshotKind::Window, 5, 3, 1).is_err());
    }
}
