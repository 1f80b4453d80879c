//! Where `trainprof agent` / `trainprof run` write: the configured `LocalPath`, or a
//! fallback folder nobody chose, checked as `docs/on-disk.md` ("A folder nobody chose is
//! checked") says.

use std::io;
use std::path::{Path, PathBuf};

use trainprof_output::fs::Dir;

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

/// `path` made absolute against the current folder, once, before anything starts: the
/// page's process runs in `/` (docs/on-disk.md, "Who reads what, with which rights") and
/// the trainer may change its folder. Lexical only (`std::path::absolute`): no link is
/// read or followed, so it names what `path` named here and now. A current folder that is
/// gone leaves `path` as it was.
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// Why no output folder can be used.
#[derive(Debug, thiserror::Error)]
pub enum OutputRootError {
    /// The folder a person chose cannot be written.
    #[error("cannot write to {}: {source}", path.display())]
    Chosen { path: PathBuf, source: io::Error },
    /// Neither the default nor a fallback folder can be written.
    #[error("cannot write to {} ({source}) nor to a fallback folder", path.display())]
    NoFallback { path: PathBuf, source: io::Error },
}

/// Where the files go. `explicit`: the user chose the folder (flag, variable or config
/// file), so an unwritable one is an error; otherwise the first writable of the default,
/// `./trainprof-output` and `<tmp>/trainprof-output`, with a line saying so.
pub fn output_root(
    configured: &Path,
    explicit: bool,
    cwd: &Path,
) -> Result<(PathBuf, Option<String>), OutputRootError> {
    let first = match writable(configured) {
        Ok(()) => return Ok((configured.to_owned(), None)),
        Err(source) if explicit => {
            return Err(OutputRootError::Chosen { path: configured.to_owned(), source });
        }
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
    Err(OutputRootError::NoFallback { path: configured.to_owned(), source: first })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::run::end_markers::write_end_markers;

    #[test]
    fn the_default_folder_falls_back_a_chosen_one_does_not() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
        let blocked = d.join("file");
        std::fs::write(&blocked, b"x").unwrap();
        let (root, note) = output_root(&blocked.join("out"), false, &d).unwrap();
        assert_eq!(root, d.join(FALLBACK_DIR));
        assert!(note.unwrap().contains("instead"));
        assert!(
            output_root(&blocked.join("out"), true, &d).unwrap_err().to_string().contains("cannot write")
        );
        assert_eq!(output_root(&d.join("ok"), true, &d).unwrap(), (d.join("ok"), None));
    }

    #[test]
    fn the_write_check_and_the_markers_never_write_through_a_link() {
        use std::os::unix::fs::symlink;
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
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
    }

    #[test]
    fn a_fallback_folder_someone_else_prepared_is_not_used() {
        use std::os::unix::fs::symlink;
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
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
    }
}
