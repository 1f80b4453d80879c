//! The file-system half of the on-disk protocol (`docs/on-disk.md`): every file the agent
//! and the hook create, seal, walk or delete under `LocalPath` goes through here.
//!
//! `LocalPath` may be written by the trainer's user, while the agent runs as root, so
//! nothing here follows a symbolic link below `LocalPath` (`LocalPath` itself may be one:
//! a mounted volume):
//! * folders are opened one component at a time with `O_DIRECTORY | O_NOFOLLOW`, and every
//!   other call works relative to such a handle (`openat`, `linkat`, `renameat2`,
//!   `unlinkat`), so a folder swapped for a link after a check is still never followed;
//! * files are created with `O_CREAT | O_EXCL | O_NOFOLLOW` (a planted name is an error,
//!   never written through) and opened with `O_NOFOLLOW | O_NONBLOCK`, then `fstat`ed: only
//!   regular files are read (a FIFO cannot hang a reader);
//! * a sealed name is taken with a hard link or `renameat2(RENAME_NOREPLACE)`, which fail
//!   on an existing name: no file is ever replaced, save the end markers, which are
//!   written to a temporary name and renamed over (a rename replaces a link itself, never
//!   its target);
//! * walks list entries with their type as stored (`lstat`), descend only into real
//!   folders and report links and special files instead of touching them.
//!
//! Errors are `std::io::Error`; a link where a folder or file should be reads
//! "is a symbolic link (not followed)".

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

/// Mode bits of new folders and files before the umask, as `mkdir(1)` and `open(2)` use:
/// the trainer's user (who may not be root) must be able to write where the hook writes.
const DIR_MODE: u32 = 0o777;
const FILE_MODE: u32 = 0o666;

/// `LocalPath` as the agent found it at start ([`pin_root`]).
#[derive(Debug)]
struct Pinned {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

static PINNED: std::sync::OnceLock<Pinned> = std::sync::OnceLock::new();

/// Pins `LocalPath` for the life of the process: from now on [`Dir::open_root`] of the same
/// path refuses a folder other than the one found now. `LocalPath` is reached by its path
/// (it may be a link to a mounted volume); pinned, a trainer that can rename entries in its
/// parent folder cannot point the agent at another folder mid-run. Once per process; a
/// second call is an error.
pub fn pin_root(path: &Path) -> io::Result<()> {
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let m = meta_of(&fd)?;
    PINNED
        .set(Pinned { path: path.to_owned(), dev: m.dev, ino: m.ino })
        .map_err(|_| io::Error::other("LocalPath is pinned already"))
}

/// An open folder under (or at) `LocalPath`.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// For messages only; never used to reach the folder again.
    path: PathBuf,
}

/// What an entry of a folder is, as stored (links not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// A FIFO, socket or device: never read.
    Other,
}

/// One entry of a folder.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The name, when it is UTF-8 (no writer of ours gives another, nor is one an S3 key).
    pub name: Result<String, Vec<u8>>,
    pub kind: Kind,
}

/// See [`Meta::is_mostly_holes`]. A file system that compresses JSON text stays far above
/// 1/64 of the length on disk; files up to 1 MiB are never judged.
pub const SPARSE_MIN_BYTES: u64 = 1 << 20;
pub const SPARSE_RATIO: u64 = 64;

/// A file's identity and size, from `fstat` / `lstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    /// Bytes the file takes on disk (`st_blocks` × 512): less than `len` for a sparse file.
    pub allocated: u64,
    /// Last change of content, seconds and nanoseconds since the epoch.
    pub mtime: (i64, i64),
}

impl Meta {
    fn from_stat(s: &rustix::fs::Stat) -> Meta {
        Meta {
            dev: s.st_dev,
            ino: s.st_ino,
            len: u64::try_from(s.st_size).unwrap_or(0),
            nlink: s.st_nlink,
            uid: s.st_uid,
            gid: s.st_gid,
            mode: s.st_mode,
            allocated: u64::try_from(s.st_blocks).unwrap_or(0).saturating_mul(512),
            mtime: (s.st_mtime, i64::try_from(s.st_mtime_nsec).unwrap_or(0)),
        }
    }

    pub fn kind(&self) -> Kind {
        kind_of(FileType::from_raw_mode(self.mode))
    }

    /// Whether the file may be read or uploaded (`docs/on-disk.md`): a regular file with
    /// no other hard link. A second link may be a file from outside `LocalPath` that the
    /// trainer's user linked in (where `fs.protected_hardlinks` is 0), not theirs to read.
    pub fn is_plain_file(&self) -> bool {
        self.kind() == Kind::File && self.nlink == 1
    }

    /// Whether the file is mostly holes (`docs/on-disk.md`, "Files the readers refuse"): longer than
    /// [`SPARSE_MIN_BYTES`] with less than a [`SPARSE_RATIO`]-th of its length on disk. No
    /// writer of ours makes one; a 20 GB sparse file takes 20 KB, and neither the report nor
    /// the uploader spends time on it.
    pub fn is_mostly_holes(&self) -> bool {
        self.len > SPARSE_MIN_BYTES && self.allocated < self.len / SPARSE_RATIO
    }

    pub fn is_same(&self, other: &Meta) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    pub fn modified(&self) -> std::time::SystemTime {
        let (s, ns) = self.mtime;
        let ns = u32::try_from(ns).unwrap_or(0);
        match u64::try_from(s) {
            Ok(s) => std::time::UNIX_EPOCH + std::time::Duration::new(s, ns),
            Err(_) => std::time::UNIX_EPOCH,
        }
    }
}

/// The content of the open file `f`, if it holds at most `max` bytes: a larger (or sparse,
/// planted) file is refused before anything is read into memory.
pub fn read_bounded(mut f: File, max: u64, shown: &Path) -> io::Result<Vec<u8>> {
    let len = meta_of(&f)?.len;
    if len > max {
        return Err(io::Error::other(format!(
            "{} holds {len} bytes, more than the {max} expected: not read",
            shown.display()
        )));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // A writer may still append: never more than `max`.
    (&mut f).take(max).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `fstat` of an open file.
pub fn meta_of(file: &impl AsFd) -> io::Result<Meta> {
    Ok(Meta::from_stat(&rustix::fs::fstat(file)?))
}

fn kind_of(t: FileType) -> Kind {
    match t {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    }
}

/// ELOOP (`O_NOFOLLOW` on a link) and ENOTDIR (`O_DIRECTORY` on a link to a file) read as
/// what they are.
fn refused(e: Errno, what: &Path) -> io::Error {
    if e == Errno::LOOP {
        return io::Error::other(format!("{} is a symbolic link (not followed)", what.display()));
    }
    io::Error::from(e)
}

fn not_regular(what: &Path, kind: Kind) -> io::Error {
    let is = match kind {
        Kind::Dir => "a folder",
        Kind::Symlink => "a symbolic link (not followed)",
        _ => "not a regular file",
    };
    io::Error::other(format!("{} is {is}", what.display()))
}

/// One path component: no `/`, not empty, not `.` or `..`.
fn component(name: &str) -> io::Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{name:?} is not a file name")));
    }
    Ok(name)
}

impl Dir {
    /// Opens `LocalPath` (following it if it is a link: a mounted volume), creating it and
    /// its parents first when `create`.
    pub fn open_root(path: &Path, create: bool) -> io::Result<Dir> {
        if create {
            std::fs::create_dir_all(path)?;
        }
        let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        if let Some(pinned) = PINNED.get()
            && pinned.path == path
        {
            let now = meta_of(&fd)?;
            if (now.dev, now.ino) != (pinned.dev, pinned.ino) {
                return Err(io::Error::other(format!(
                    "{} is not the folder it was when the agent started (it was replaced): not used",
                    path.display()
                )));
            }
        }
        Ok(Dir { fd, path: path.to_owned() })
    }

    /// The folder at `rel` (`/`-separated, relative) below this one, each component opened
    /// without following a link; missing components are made when `create`.
    pub fn sub(&self, rel: &str, create: bool) -> io::Result<Dir> {
        let mut dir: Option<Dir> = None;
        for name in rel.split('/').filter(|c| !c.is_empty()) {
            let parent = dir.as_ref().unwrap_or(self);
            dir = Some(parent.child(component(name)?, create)?);
        }
        match dir {
            Some(d) => Ok(d),
            None => self.try_clone(),
        }
    }

    fn child(&self, name: &str, create: bool) -> io::Result<Dir> {
        let path = self.path.join(name);
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let open = || rustix::fs::openat(&self.fd, name, flags, Mode::empty());
        let mut made = false;
        let fd = match open() {
            Err(Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(DIR_MODE)) {
                    Ok(()) => made = true,
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(io::Error::from(e)),
                }
                open()
            }
            other => other,
        };
        if made && let Ok(fd) = &fd {
            // A new folder takes the owner of the folder it is made in: an hour folder the
            // agent (root) makes under the trainer's `framework/` must stay writable for
            // the trainer's hook. Best effort: only root may change an owner.
            if let Ok(parent) = meta_of(&self.fd)
                && parent.uid != rustix::process::geteuid().as_raw()
            {
                let _ = rustix::fs::fchown(
                    fd,
                    Some(rustix::process::Uid::from_raw(parent.uid)),
                    Some(rustix::process::Gid::from_raw(parent.gid)),
                );
            }
        }
        match fd {
            Ok(fd) => Ok(Dir { fd, path }),
            Err(Errno::LOOP | Errno::NOTDIR) => match self.stat(name) {
                Ok(m) if m.kind() == Kind::Symlink => Err(refused(Errno::LOOP, &path)),
                Ok(_) => Err(io::Error::new(
                    io::ErrorKind::NotADirectory,
                    format!("{} is not a folder", path.display()),
                )),
                Err(e) => Err(e),
            },
            Err(e) => Err(io::Error::from(e)),
        }
    }

    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir { fd: self.fd.try_clone()?, path: self.path.clone() })
    }

    /// The folder's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path()` joined with `name`, for messages.
    pub fn display(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Creates `name`, which must not exist (a planted file or link is an error), open for
    /// reading and writing.
    pub fn create_new(&self, name: &str) -> io::Result<File> {
        let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, component(name)?, flags, Mode::from_raw_mode(FILE_MODE))
            .map_err(|e| refused(e, &self.display(name)))?;
        Ok(File::from(fd))
    }

    /// Opens the regular file `name` (never through a link; a FIFO cannot block it), for
    /// reading, and for writing when `write`.
    pub fn open_regular(&self, name: &str, write: bool) -> io::Result<File> {
        let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
        let flags = access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, component(name)?, flags, Mode::empty())
            .map_err(|e| refused(e, &self.display(name)))?;
        let meta = meta_of(&fd)?;
        if meta.kind() != Kind::File {
            return Err(not_regular(&self.display(name), meta.kind()));
        }
        // Reads and writes of a regular file never block anyway; clear the flag so that
        // nothing downstream sees EAGAIN.
        rustix::fs::fcntl_setfl(&fd, access)?;
        Ok(File::from(fd))
    }

    /// Opens `name` for appending, creating it if missing; never through a link.
    pub fn open_append(&self, name: &str) -> io::Result<File> {
        let flags = OFlags::WRONLY
            | OFlags::APPEND
            | OFlags::CREATE
            | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, component(name)?, flags, Mode::from_raw_mode(FILE_MODE))
            .map_err(|e| refused(e, &self.display(name)))?;
        let meta = meta_of(&fd)?;
        if meta.kind() != Kind::File {
            return Err(not_regular(&self.display(name), meta.kind()));
        }
        Ok(File::from(fd))
    }

    /// The whole regular file `name`, if it holds at most `max` bytes (a larger one is an
    /// error, never read into memory); `Ok(None)` when it does not exist.
    pub fn read(&self, name: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
        let f = match self.open_regular(name, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        read_bounded(f, max, &self.display(name)).map(Some)
    }

    /// `lstat` of `name`.
    pub fn stat(&self, name: &str) -> io::Result<Meta> {
        let s = rustix::fs::statat(&self.fd, component(name)?, AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(Meta::from_stat(&s))
    }

    /// Whether `name` is still the file `file` is open on.
    pub fn names(&self, name: &str, file: &impl AsFd) -> io::Result<bool> {
        self.holds(name, &meta_of(file)?)
    }

    /// Whether `name` is still the file `held` describes (same device and inode).
    pub fn holds(&self, name: &str, held: &Meta) -> io::Result<bool> {
        match self.stat(name) {
            Ok(now) => Ok(now.is_same(held)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes the entry `name` (a file or a link itself, never what a link points to).
    pub fn unlink(&self, name: &str) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&self.fd, component(name)?, AtFlags::empty())?)
    }

    /// Removes `name` only while it is still the file `file` is open on: what this process
    /// sealed, not what someone put in its place.
    pub fn unlink_if_same(&self, name: &str, file: &impl AsFd) -> io::Result<bool> {
        self.unlink_if_holds(name, &meta_of(file)?)
    }

    /// Removes `name` only while it is still the file `held` describes.
    pub fn unlink_if_holds(&self, name: &str, held: &Meta) -> io::Result<bool> {
        if !self.holds(name, held)? {
            return Ok(false);
        }
        self.unlink(name).map(|()| true)
    }

    /// Makes the folder's entries durable (after a link, rename or unlink).
    pub fn sync(&self) -> io::Result<()> {
        Ok(rustix::fs::fsync(&self.fd)?)
    }

    /// Every entry of the folder but `.` and `..`, sorted by name.
    pub fn entries(&self) -> io::Result<Vec<Entry>> {
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.fd)? {
            let entry = entry?;
            let raw = entry.file_name().to_bytes();
            if raw == b"." || raw == b".." {
                continue;
            }
            let name = std::str::from_utf8(raw).map(str::to_owned).map_err(|_| raw.to_vec());
            let kind = match entry.file_type() {
                FileType::Unknown => match &name {
                    Ok(n) => self.stat(n).map_or(Kind::Other, |m| m.kind()),
                    Err(raw) => {
                        rustix::fs::statat(&self.fd, OsStr::from_bytes(raw), AtFlags::SYMLINK_NOFOLLOW)
                            .map_or(Kind::Other, |s| kind_of(FileType::from_raw_mode(s.st_mode)))
                    }
                },
                t => kind_of(t),
            };
            out.push(Entry { name, kind });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A folder's entries read a few at a time ([`Dir::stream`]): a listing that a caller may
/// stop and take up again later, so one look at a folder of any size costs what the caller
/// allows. Entries added or removed while it reads may or may not be seen (`readdir`); the
/// others are seen once.
pub struct Stream {
    dir: rustix::fs::Dir,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").finish_non_exhaustive()
    }
}

impl Stream {
    /// The next entry's name but `.` and `..` (`Err` with the bytes when it is not UTF-8), or
    /// `None` at the end of the folder.
    pub fn next_name(&mut self) -> Option<io::Result<Result<String, Vec<u8>>>> {
        loop {
            let entry = match self.dir.read()? {
                Ok(e) => e,
                Err(e) => return Some(Err(io::Error::from(e))),
            };
            let raw = entry.file_name().to_bytes();
            if raw == b"." || raw == b".." {
                continue;
            }
            return Some(Ok(std::str::from_utf8(raw).map(str::to_owned).map_err(|_| raw.to_vec())));
        }
    }
}

impl Dir {
    /// The folder's entries as a [`Stream`], on a descriptor of its own.
    pub fn stream(&self) -> io::Result<Stream> {
        Ok(Stream { dir: rustix::fs::Dir::read_from(&self.fd)? })
    }
}

/// Gives the file `from_dir/from` the name `to_dir/to` unless that name exists: `false`
/// when it does. A hard link cannot replace a file, so the check and the move are one
/// step; the old name is then removed. Where hard links are not supported, a
/// `renameat2(RENAME_NOREPLACE)`; where that is not supported either, a check and a
/// rename (no other process of ours seals under these names at the same time).
pub fn link_no_replace(from_dir: &Dir, from: &str, to_dir: &Dir, to: &str) -> io::Result<bool> {
    match rustix::fs::linkat(from_dir, component(from)?, to_dir, component(to)?, AtFlags::empty()) {
        Ok(()) => {
            // Sealed from here on, whatever follows. A temporary name that stays behind has
            // a second link, and the repair only removes it.
            let _ = from_dir.unlink(from);
            Ok(true)
        }
        Err(Errno::EXIST) => Ok(false),
        Err(Errno::PERM | Errno::NOTSUP | Errno::MLINK) => rename_no_replace(from_dir, from, to_dir, to),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Renames `from_dir/from` to `to_dir/to` unless that name exists: `false` when it does.
pub fn rename_no_replace(from_dir: &Dir, from: &str, to_dir: &Dir, to: &str) -> io::Result<bool> {
    let (from, to) = (component(from)?, component(to)?);
    match rustix::fs::renameat_with(from_dir, from, to_dir, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(true),
        Err(Errno::EXIST) => Ok(false),
        Err(Errno::INVAL | Errno::NOSYS) => match to_dir.stat(to) {
            Ok(_) => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                rustix::fs::renameat(from_dir, from, to_dir, to)?;
                Ok(true)
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(io::Error::from(e)),
    }
}

/// How [`seal`] moves a file to its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// A hard link, then the temporary name is removed ([`link_no_replace`]). A crash in
    /// between leaves a second link, which the repair recognises.
    Link,
    /// `renameat2(RENAME_NOREPLACE)` ([`rename_no_replace`]).
    Rename,
}

/// Seals the complete, synced temporary file `tmp_dir/tmp` under the first of
/// `candidates` (paths relative to `root`, e.g. from [`crate::system_file`]) that `claim`
/// allows and that is free on disk; the folders are made as needed and the final folder
/// is synced. `claim` is asked before each name is tried (and may record it: a name given
/// and then lost to a crash is still never given again). `Ok(None)` when every candidate
/// was taken.
pub fn seal(
    root: &Dir,
    tmp_dir: &Dir,
    tmp: &str,
    candidates: impl IntoIterator<Item = String>,
    how: Move,
    mut claim: impl FnMut(&str) -> bool,
) -> io::Result<Option<String>> {
    for rel in candidates {
        if !claim(&rel) {
            continue;
        }
        let (folder, name) = rel.rsplit_once('/').unwrap_or(("", rel.as_str()));
        let dir = root.sub(folder, true)?;
        let placed = match how {
            Move::Link => link_no_replace(tmp_dir, tmp, &dir, name)?,
            Move::Rename => rename_no_replace(tmp_dir, tmp, &dir, name)?,
        };
        if placed {
            // The new name is durable only once the folder is; a failed sync does not undo
            // the name (the file is sealed), so it is not an error of the seal.
            let _ = dir.sync();
            return Ok(Some(rel));
        }
    }
    Ok(None)
}

/// Writes `bytes` as the new file `dir/name`, never over a file (docs/on-disk.md): to a hidden
/// temporary name `.<name>.<tag>.tmp` created new, synced, then [`seal`]ed there by
/// `renameat2(RENAME_NOREPLACE)`. `Ok(false)` when `name` is taken; whenever the file is
/// not sealed its temporary name is removed again (only while it still holds this file),
/// so nothing half-written stays behind. `tag` keeps writers apart (a pid).
pub fn write_new(dir: &Dir, name: &str, tag: &str, bytes: &[u8]) -> io::Result<bool> {
    let tmp = format!(".{}.{tag}.tmp", component(name)?);
    let mut f = dir.create_new(&tmp)?;
    let sealed = f
        .write_all(bytes)
        .and_then(|()| f.sync_all())
        .and_then(|()| seal(dir, dir, &tmp, [name.to_owned()], Move::Rename, |_| true));
    if !matches!(sealed, Ok(Some(_))) {
        let _ = dir.unlink_if_same(&tmp, &f);
    }
    sealed.map(|placed| placed.is_some())
}

/// Writes `bytes` to `dir/name`, replacing what is there (the end markers only: they hold
/// a time, and a newer job's replace an older one's): written and synced under a
/// temporary name first, then renamed over, so neither a half-written marker nor a write
/// through a planted link can happen.
pub fn write_replacing(dir: &Dir, name: &str, bytes: &[u8]) -> io::Result<()> {
    let name = component(name)?;
    let mut last = None;
    for n in 0..16 {
        let tmp = format!(".{name}.{}-{n}.tmp", std::process::id());
        let mut f = match dir.create_new(&tmp) {
            Ok(f) => f,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let written = f.write_all(bytes).and_then(|()| f.sync_all());
        let renamed = written.and_then(|()| Ok(rustix::fs::renameat(dir, tmp.as_str(), dir, name)?));
        if let Err(e) = renamed {
            let _ = dir.unlink_if_same(&tmp, &f);
            return Err(e);
        }
        return dir.sync();
    }
    Err(last.unwrap_or_else(|| io::Error::other("no temporary name")))
}

/// What a walk found.
#[derive(Debug, Default)]
pub struct Walk {
    /// Regular files: `/`-separated paths relative to the walk's root, and their `lstat`.
    pub files: Vec<(String, Meta)>,
    /// Entries left alone, with why: links, special files, names that are not UTF-8,
    /// folders that could not be opened.
    pub refused: Vec<String>,
}

/// Walks `top` (a `/`-separated path relative to `root`; missing is empty) without ever
/// following a link, the top folder's own components included. `keep(name, is_dir)` says
/// whether an entry is looked at: a folder it rejects is not entered, a file not listed.
/// Refused entries (links, special files) are listed in [`Walk::refused`], untouched.
pub fn walk(root: &Dir, top: &str, keep: &dyn Fn(&str, bool) -> bool) -> Walk {
    let mut out = Walk::default();
    let start = match root.sub(top, false) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return out,
        Err(e) => {
            out.refused.push(format!("{}: {e}", root.display(top).display()));
            return out;
        }
    };
    // Folders wait on the stack by name, not open: a tree of many folders costs one
    // descriptor per level, not one per folder. Each is opened again from `start`, one
    // component at a time, never through a link.
    let top = top.trim_matches('/').to_owned();
    let mut stack = vec![String::new()];
    while let Some(below) = stack.pop() {
        let rel = match (top.is_empty(), below.is_empty()) {
            (_, true) => top.clone(),
            (true, false) => below.clone(),
            (false, false) => format!("{top}/{below}"),
        };
        let dir = match start.sub(&below, false) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                out.refused.push(format!("{}: {e}", start.display(&below).display()));
                continue;
            }
        };
        let entries = match dir.entries() {
            Ok(e) => e,
            Err(e) => {
                out.refused.push(format!("cannot list {}: {e}", dir.path().display()));
                continue;
            }
        };
        for e in entries {
            let name = match e.name {
                Ok(n) => n,
                Err(raw) => {
                    let shown = dir.path().join(OsStr::from_bytes(&raw));
                    out.refused.push(format!("{}: the name is not UTF-8", shown.display()));
                    continue;
                }
            };
            let child_rel = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
            match e.kind {
                Kind::Dir if keep(&name, true) => {
                    stack.push(if below.is_empty() { name.clone() } else { format!("{below}/{name}") });
                }
                Kind::File if keep(&name, false) => match dir.stat(&name) {
                    Ok(m) if m.kind() == Kind::File => out.files.push((child_rel, m)),
                    Ok(m) if m.kind() == Kind::Dir => {
                        stack.push(if below.is_empty() { name.clone() } else { format!("{below}/{name}") });
                    }
                    Ok(m) => out.refused.push(not_regular(&dir.display(&name), m.kind()).to_string()),
                    Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                    Err(err) => out.refused.push(format!("{}: {err}", dir.display(&name).display())),
                },
                Kind::Symlink if keep(&name, false) || keep(&name, true) => {
                    out.refused.push(not_regular(&dir.display(&name), Kind::Symlink).to_string());
                }
                Kind::Other if keep(&name, false) => {
                    out.refused.push(not_regular(&dir.display(&name), Kind::Other).to_string());
                }
                _ => {}
            }
        }
    }
    out.files.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Opens the regular file at `rel` (relative to `root`) without following any link on the
/// way, for reading, together with the folder that holds it (to remove it afterwards
/// with [`Dir::unlink_if_same`]).
pub fn open_at(root: &Dir, rel: &str, write: bool) -> io::Result<(Dir, String, File)> {
    let (folder, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    let dir = root.sub(folder, false)?;
    let file = dir.open_regular(name, write)?;
    Ok((dir, name.to_owned(), file))
}

/// This process's effective uid (who may own what a private folder holds).
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A private folder of the agent under `LocalPath` (`.trainprof/`), made with mode 0755
/// (whatever the umask) when missing, and used only if it is a real folder owned by this
/// process's user and writable by no one else: the records in it decide what is uploaded
/// and which names are free, so a folder the trainer's user planted is not trusted.
pub fn private_dir(root: &Dir, rel: &str) -> io::Result<Dir> {
    private_dir_mode(root, rel, 0o755)
}

/// A folder under `LocalPath` made with `mode` (whatever the umask) when missing, and used
/// only if it is a real folder owned by this process's user whose permission bits are
/// within `mode`: [`private_dir`] (0755), and the hook's request folder (0700: only the
/// trainer's user, and root, may write a request into it; `docs/formats.md`, "On-demand
/// windows (`trainprof trigger`)").
pub fn private_dir_mode(root: &Dir, rel: &str, mode: u32) -> io::Result<Dir> {
    let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    let parent = root.sub(parent, true)?;
    match rustix::fs::mkdirat(&parent, component(name)?, Mode::from_raw_mode(mode)) {
        Ok(()) => {
            let d = parent.child(name, false)?;
            rustix::fs::fchmod(&d, Mode::from_raw_mode(mode))?;
        }
        Err(Errno::EXIST) => {}
        Err(e) => return Err(io::Error::from(e)),
    }
    let dir = parent.child(name, false)?;
    let meta = meta_of(&dir)?;
    let euid = rustix::process::geteuid().as_raw();
    if meta.uid != euid {
        return Err(io::Error::other(format!(
            "{} belongs to uid {}, not to this process (uid {euid}): not used",
            dir.path().display(),
            meta.uid
        )));
    }
    if meta.mode & 0o777 & !mode != 0 {
        let who = if meta.mode & 0o022 != 0 { "written" } else { "read" };
        return Err(io::Error::other(format!(
            "{} can be {who} by others (mode {:o}): not used",
            dir.path().display(),
            meta.mode & 0o7777
        )));
    }
    Ok(dir)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A LocalPath and, beside it, a folder the attacker would like root to touch.
    fn setup() -> (tempfile::TempDir, Dir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("local");
        let secret = t.path().join("secret");
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::write(secret.join("key"), b"root only").unwrap();
        let dir = Dir::open_root(&root, true).unwrap();
        (t, dir, secret)
    }

    fn unchanged(secret: &Path) {
        let names: Vec<_> = std::fs::read_dir(secret).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["key"], "nothing made or removed in the target");
        assert_eq!(std::fs::read(secret.join("key")).unwrap(), b"root only");
    }

    #[test]
    fn a_linked_folder_is_never_entered_nor_made_through() {
        let (_t, root, secret) = setup();
        symlink(&secret, root.path().join("framework")).unwrap();
        for create in [false, true] {
            let e = root.sub("framework/pevents", create).unwrap_err();
            assert!(e.to_string().contains("is a symbolic link (not followed)"), "{e}");
        }
        std::fs::create_dir(root.path().join("system")).unwrap();
        symlink(&secret, root.path().join("system/incremental")).unwrap();
        assert!(root.sub("system/incremental/2020072222", true).is_err());
        std::fs::write(root.path().join("plain"), b"").unwrap();
        assert_eq!(root.sub("plain", true).unwrap_err().kind(), io::ErrorKind::NotADirectory);
        // LocalPath itself may be a link (a mounted volume).
        let link = secret.parent().unwrap().join("local-link");
        symlink(root.path(), &link).unwrap();
        assert!(Dir::open_root(&link, false).unwrap().sub("system", false).is_ok());
        unchanged(&secret);
    }

    #[test]
    fn new_files_never_write_through_a_planted_name() {
        let (_t, root, secret) = setup();
        symlink(secret.join("key"), root.path().join("x.tmp")).unwrap();
        symlink(secret.join("new"), root.path().join("y.tmp")).unwrap();
        std::fs::write(root.path().join("z.tmp"), b"theirs").unwrap();
        for name in ["x.tmp", "y.tmp"] {
            let e = root.create_new(name).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{name}: {e}");
            assert!(root.open_append(name).unwrap_err().to_string().contains("symbolic link"), "{name}");
            assert!(root.open_regular(name, true).unwrap_err().to_string().contains("symbolic link"));
        }
        assert_eq!(root.create_new("z.tmp").unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(root.path().join("z.tmp")).unwrap(), b"theirs");
        assert!(root.create_new("../escape").is_err());
        unchanged(&secret);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let (_t, root, _secret) = setup();
        rustix::fs::mknodat(&root, "cfg", FileType::Fifo, Mode::from_raw_mode(0o644), 0).unwrap();
        let e = root.open_regular("cfg", false).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(root.read("cfg", 64).is_err());
        assert_eq!(root.read("missing", 64).unwrap(), None);
    }

    #[test]
    fn sealing_takes_the_first_free_claimed_name_and_replaces_nothing() {
        let (_t, root, _secret) = setup();
        let tmp_dir = root.sub("system", true).unwrap();
        for (how, tmp) in [(Move::Link, "a.tmp"), (Move::Rename, "b.tmp")] {
            let mut f = tmp_dir.create_new(tmp).unwrap();
            f.write_all(tmp.as_bytes()).unwrap();
            let claimed = std::cell::RefCell::new(Vec::new());
            let names = ["s/1", "s/2", "s/3", "s/4"].map(str::to_owned);
            let placed = seal(&root, &tmp_dir, tmp, names, how, |n| {
                claimed.borrow_mut().push(n.to_owned());
                n != "s/1"
            })
            .unwrap();
            let want = if how == Move::Link { "s/2" } else { "s/3" };
            assert_eq!(placed.as_deref(), Some(want));
            assert_eq!(std::fs::read(root.path().join(want)).unwrap(), tmp.as_bytes());
            assert!(tmp_dir.stat(tmp).is_err(), "the temporary name is gone");
        }
        // Every name taken (one of them by a link): nothing placed, the file stays.
        let _f = tmp_dir.create_new("c.tmp").unwrap();
        symlink("/nonexistent", root.path().join("s/4")).unwrap();
        let names = ["s/2", "s/3", "s/4"].map(str::to_owned);
        assert_eq!(seal(&root, &tmp_dir, "c.tmp", names, Move::Link, |_| true).unwrap(), None);
        assert!(tmp_dir.stat("c.tmp").is_ok());
        assert_eq!(std::fs::read(root.path().join("s/2")).unwrap(), b"a.tmp");
    }

    #[test]
    fn a_new_file_never_replaces_one_and_leaves_no_temporary_behind() {
        let (_t, root, secret) = setup();
        let dir = root.sub("framework/native/n/w", true).unwrap();
        assert!(write_new(&dir, "profile.pb.gz", "7", b"first").unwrap());
        // Taken: not replaced, and the temporary file is gone again.
        assert!(!write_new(&dir, "profile.pb.gz", "7", b"second").unwrap());
        assert_eq!(dir.read("profile.pb.gz", 64).unwrap().unwrap(), b"first");
        // A planted link at the name is left as it is, its target untouched.
        symlink(secret.join("key"), dir.path().join("flamegraph.svg")).unwrap();
        assert!(!write_new(&dir, "flamegraph.svg", "7", b"<svg/>").unwrap());
        assert_eq!(std::fs::read_link(dir.path().join("flamegraph.svg")).unwrap(), secret.join("key"));
        // A planted link at the temporary name is never written through.
        symlink(secret.join("key"), dir.path().join(".x.7.tmp")).unwrap();
        assert!(write_new(&dir, "x", "7", b"x").is_err());
        let mut names: Vec<_> = dir.entries().unwrap().into_iter().map(|e| e.name.unwrap()).collect();
        names.sort();
        assert_eq!(names, [".x.7.tmp", "flamegraph.svg", "profile.pb.gz"]);
        assert!(write_new(&dir, "../x", "7", b"x").is_err());
        unchanged(&secret);
    }

    #[test]
    fn a_marker_replaces_a_planted_link_not_its_target() {
        let (_t, root, secret) = setup();
        let dir = root.sub("system", true).unwrap();
        symlink(secret.join("key"), dir.path().join("training_job_end.ts")).unwrap();
        write_replacing(&dir, "training_job_end.ts", b"1.5\n").unwrap();
        assert_eq!(dir.read("training_job_end.ts", 64).unwrap().unwrap(), b"1.5\n");
        write_replacing(&dir, "training_job_end.ts", b"2.5\n").unwrap();
        assert_eq!(dir.read("training_job_end.ts", 64).unwrap().unwrap(), b"2.5\n");
        assert_eq!(dir.entries().unwrap().len(), 1, "no temporary file left");
        unchanged(&secret);
    }

    #[test]
    fn a_walk_never_descends_through_a_link_and_reports_what_it_left() {
        let (_t, root, secret) = setup();
        let hour = root.sub("framework/pevents/2026112203", true).unwrap();
        std::fs::write(hour.path().join("1_n_pythontimeline.json"), b"[]").unwrap();
        std::fs::write(hour.path().join(".hidden"), b"").unwrap();
        symlink(&secret, hour.path().join("2026112204")).unwrap();
        symlink(secret.join("key"), hour.path().join("2_n_pythontimeline.json")).unwrap();
        rustix::fs::mknodat(&hour, "3_n_pythontimeline.json", FileType::Fifo, Mode::from_raw_mode(0o644), 0)
            .unwrap();
        let w = walk(&root, "framework", &|name, _| !name.starts_with('.'));
        let files: Vec<_> = w.files.iter().map(|(rel, m)| (rel.as_str(), m.len)).collect();
        assert_eq!(files, [("framework/pevents/2026112203/1_n_pythontimeline.json", 2)]);
        assert_eq!(w.refused.len(), 3, "{:?}", w.refused);
        // The top folder itself a link: nothing listed, one refusal.
        symlink(&secret, root.path().join("system")).unwrap();
        let w = walk(&root, "system", &|_, _| true);
        assert!(w.files.is_empty());
        assert_eq!(w.refused.len(), 1, "{:?}", w.refused);
        assert!(walk(&root, "missing", &|_, _| true).refused.is_empty());
        unchanged(&secret);
    }

    #[test]
    fn a_large_or_sparse_planted_file_is_not_read_into_memory() {
        let (_t, root, _secret) = setup();
        let f = root.create_new("big").unwrap();
        f.set_len(3 << 30).unwrap();
        let e = root.read("big", 1 << 20).unwrap_err();
        assert!(e.to_string().contains("more than the 1048576 expected"), "{e}");
        let m = root.stat("big").unwrap();
        assert!(m.allocated < m.len, "sparse: {m:?}");
    }

    #[test]
    fn a_walk_holds_one_descriptor_per_level_not_per_folder() {
        let (_t, root, _secret) = setup();
        for i in 0..300 {
            std::fs::create_dir_all(root.path().join(format!("framework/pevents/d{i}"))).unwrap();
            std::fs::write(root.path().join(format!("framework/pevents/d{i}/f")), b"x").unwrap();
        }
        let open_fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
        let before = open_fds();
        let most = std::cell::Cell::new(0);
        let w = walk(&root, "framework", &|_, _| {
            most.set(most.get().max(open_fds()));
            true
        });
        assert_eq!(w.files.len(), 300);
        assert!(w.refused.is_empty(), "{:?}", w.refused);
        assert!(most.get() < before + 16, "{} descriptors open during the walk, {before} before", most.get());
    }

    #[test]
    fn a_pinned_root_that_was_replaced_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let local = t.path().join("local");
        std::fs::create_dir(&local).unwrap();
        pin_root(&local).unwrap();
        assert!(pin_root(&local).is_err(), "once per process");
        assert!(Dir::open_root(&local, false).is_ok());
        // Someone who can write the parent swaps LocalPath for another folder (or a link).
        std::fs::rename(&local, t.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(t.path().join("elsewhere"), &local).unwrap();
        std::fs::create_dir(t.path().join("elsewhere")).unwrap();
        let e = Dir::open_root(&local, true).unwrap_err();
        assert!(e.to_string().contains("it was replaced"), "{e}");
        // Put back: the same folder again.
        std::fs::remove_file(&local).unwrap();
        std::fs::rename(t.path().join("moved"), &local).unwrap();
        assert!(Dir::open_root(&local, false).is_ok());
    }

    #[test]
    fn only_the_file_this_process_holds_is_removed() {
        let (_t, root, _secret) = setup();
        let f = root.create_new("mine").unwrap();
        assert!(root.unlink_if_same("mine", &f).unwrap());
        let f = root.create_new("mine").unwrap();
        std::fs::rename(root.path().join("mine"), root.path().join("moved")).unwrap();
        std::fs::write(root.path().join("mine"), b"someone else's").unwrap();
        assert!(!root.unlink_if_same("mine", &f).unwrap());
        assert_eq!(std::fs::read(root.path().join("mine")).unwrap(), b"someone else's");
    }

    #[test]
    fn the_private_folder_must_be_the_agents_own() {
        let (_t, root, secret) = setup();
        let d = private_dir(&root, ".trainprof").unwrap();
        assert_eq!(meta_of(&d).unwrap().mode & 0o777, 0o755);
        std::fs::set_permissions(d.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(
            private_dir(&root, ".trainprof").unwrap_err().to_string().contains("can be written by others")
        );
        symlink(&secret, root.path().join(".other")).unwrap();
        assert!(private_dir(&root, ".other").is_err());
        unchanged(&secret);
    }
}
