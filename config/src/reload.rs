//! Reading the file, and re-reading it during training.
//!
//! smdebug re-reads and re-parses the file at every step on the training thread. A
//! [`Loader`] is meant for a background thread that calls [`Loader::reload`] at most
//! once a second: it reads the (small) file, and only when its bytes differ from last
//! time builds a new [`Config`]; otherwise the current one, with its lazily resolved
//! windows, stays as it is. "Changed" means different bytes (smdebug compares the parsed
//! document), so a whitespace-only edit also re-resolves the windows. A file that
//! disappears gives the no-file defaults, and one that comes back is read again (smdebug
//! turns profiling off for the first and does not notice the second). A file that stays
//! unreadable with the same error is reported once, not at every reload.
//!
//! Write the file atomically (write elsewhere, then rename): a reader that catches a
//! half-written file sees invalid JSON and switches profiling off until the next read.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::convert::kind;
use crate::{Config, FileStatus, Loaded, Sources, parse};

/// Files larger than this are refused rather than read (the real ones are < 2 KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;

/// How often [`Loader::settled`] reads a file that does not parse yet.
const SETTLE_STEP: Duration = Duration::from_millis(100);

/// What [`Loader::reload`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reload {
    /// Same bytes as last time (or still no file): nothing changed, windows kept.
    Unchanged,
    /// New content: the config was rebuilt and its windows start unresolved.
    Changed,
}

/// Loads the config and reloads it when the file changes.
#[derive(Debug)]
pub struct Loader {
    sources: Sources,
    /// What the current config was built from: the bytes (`None` = no file) or the
    /// reason the file could not be read.
    last: Raw,
    loaded: Loaded,
}

impl Loader {
    /// Reads the file once.
    pub fn new(sources: Sources) -> Loader {
        let last = read_bytes(sources.config_path());
        let loaded = build(&sources, &last);
        Loader { last, sources, loaded }
    }

    /// Reads the file; when it is there but does not parse (a writer caught half-way), reads
    /// it again every 100 ms for up to `patience` before it is judged.
    pub fn settled(sources: Sources, patience: Duration) -> Loader {
        let t0 = Instant::now();
        let mut loader = Loader::new(sources);
        while matches!(loader.last, Ok(Some(_)))
            && matches!(loader.loaded.file, FileStatus::Unusable(_))
            && t0.elapsed() < patience
        {
            std::thread::sleep(SETTLE_STEP.min(patience.saturating_sub(t0.elapsed())));
            loader.reload();
        }
        loader
    }

    /// Re-reads the file; rebuilds the config only when the bytes changed.
    pub fn reload(&mut self) -> Reload {
        let raw = read_bytes(self.sources.config_path());
        if raw == self.last {
            return Reload::Unchanged;
        }
        self.loaded = build(&self.sources, &raw);
        self.last = raw;
        Reload::Changed
    }

    pub fn loaded(&self) -> &Loaded {
        &self.loaded
    }

    pub fn config(&self) -> &Config {
        &self.loaded.config
    }

    /// For asking windows questions, which resolves them.
    pub fn config_mut(&mut self) -> &mut Config {
        &mut self.loaded.config
    }
}

/// A file's bytes, `Ok(None)` when there is none, or why it could not be read.
type Raw = Result<Option<Vec<u8>>, ReadError>;

/// Why a platform file that is there could not be read ([`read_platform_file`](crate::read_platform_file)).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot open {}: {source}", path.display())]
    Open { path: PathBuf, source: std::io::Error },
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// A directory, a FIFO, a socket, a device, …; `what` names it ("a directory").
    #[error("{} is not a regular file ({what})", path.display())]
    NotRegular { path: PathBuf, what: &'static str },
    #[error("{} is larger than {MAX_FILE_BYTES} bytes", path.display())]
    TooLarge { path: PathBuf },
}

/// The same failure: a file that stays unreadable for the same reason is reported once
/// ([`Loader::reload`] compares with the last read). I/O errors are the same when they
/// read the same.
impl PartialEq for ReadError {
    fn eq(&self, other: &ReadError) -> bool {
        use ReadError::{NotRegular, Open, Read, TooLarge};
        let same_io =
            |a: &std::io::Error, b: &std::io::Error| a.kind() == b.kind() && a.to_string() == b.to_string();
        match (self, other) {
            (Open { path: p, source: a }, Open { path: q, source: b })
            | (Read { path: p, source: a }, Read { path: q, source: b }) => p == q && same_io(a, b),
            (NotRegular { path: p, what: a }, NotRegular { path: q, what: b }) => p == q && a == b,
            (TooLarge { path: p }, TooLarge { path: q }) => p == q,
            _ => false,
        }
    }
}

fn build(sources: &Sources, raw: &Raw) -> Loaded {
    let (file, doc) = match raw {
        Ok(Some(bytes)) => parse_document(bytes),
        Ok(None) => (FileStatus::Missing, None),
        Err(why) => (FileStatus::Unusable(why.to_string()), None),
    };
    let config = parse::build(&file, doc.as_ref(), sources);
    Loaded { path: sources.config_path().to_owned(), file, config }
}

/// A platform file's bytes (the profiler config, the resource config): `Ok(None)` when
/// there is no file, else the bytes or why they could not be read.
///
/// Anything but a regular file (a directory, a FIFO, a device) is refused. The decision is
/// taken on what was opened (`fstat` of the open descriptor), so a path swapped between a
/// check and the open cannot slip through; the open is non-blocking, so a FIFO cannot hang
/// it. A `stat` before the open only spares devices an open. Links are followed:
/// Kubernetes mounts a ConfigMap as a link to a link to the file.
pub fn read_bytes(path: &Path) -> Raw {
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => return Err(not_regular(path, &m)),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ReadError::Open { path: path.to_owned(), source }),
    }
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ReadError::Open { path: path.to_owned(), source }),
    };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(m) => return Err(not_regular(path, &m)),
        Err(source) => return Err(ReadError::Read { path: path.to_owned(), source }),
    }
    let mut bytes = Vec::new();
    match file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes) {
        Ok(n) if n as u64 > MAX_FILE_BYTES => Err(ReadError::TooLarge { path: path.to_owned() }),
        Ok(_) => Ok(Some(bytes)),
        Err(source) => Err(ReadError::Read { path: path.to_owned(), source }),
    }
}

fn not_regular(path: &Path, m: &std::fs::Metadata) -> ReadError {
    use std::os::unix::fs::FileTypeExt as _;
    let t = m.file_type();
    let what = if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a file"
    };
    ReadError::NotRegular { path: path.to_owned(), what }
}

/// Reads the file once and builds the config.
pub(crate) fn load_once(sources: &Sources) -> Loaded {
    build(sources, &read_bytes(sources.config_path()))
}

pub(crate) fn parse_document(bytes: &[u8]) -> (FileStatus, Option<Value>) {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    match serde_json::from_slice::<Value>(bytes) {
        Ok(doc @ Value::Object(_)) => (FileStatus::Read, Some(doc)),
        Ok(other) => {
            (FileStatus::Unusable(format!("the file holds {}, not a JSON object", kind(&other))), None)
        }
        Err(e) => (FileStatus::Unusable(format!("the file is not valid JSON ({e})")), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_errors_read_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_bytes(dir.path()).unwrap_err();
        assert_eq!(e.to_string(), format!("{} is not a regular file (a directory)", dir.path().display()));
        assert_eq!(read_bytes(dir.path()).unwrap_err(), e, "the same failure twice is unchanged");

        let big = dir.path().join("big.json");
        std::fs::write(&big, vec![b' '; (MAX_FILE_BYTES + 1) as usize]).unwrap();
        let e = read_bytes(&big).unwrap_err();
        assert_eq!(e.to_string(), format!("{} is larger than 1048576 bytes", big.display()));
        assert_ne!(e, ReadError::TooLarge { path: dir.path().to_owned() });

        assert_eq!(read_bytes(&dir.path().join("absent")).unwrap(), None);
    }
}
