//! Reading the file, and re-reading it during training.
//!
//! smdebug re-reads and re-parses the file at every step on the training thread. A
//! [`Loader`] is meant for a background thread that calls [`Loader::reload`] at most
//! once a second: it reads the (small) file, and only when its bytes differ from last
//! time builds a new [`Config`]; otherwise the current one, with its lazily resolved
//! windows, stays as it is. A file that disappears gives the no-file defaults, and one
//! that comes back is read again (smdebug ignores both).
//!
//! Write the file atomically (write elsewhere, then rename): a reader that catches a
//! half-written file sees invalid JSON and switches profiling off until the next read.

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::convert::kind;
use crate::{Config, FileStatus, Loaded, Sources, parse};

/// Files larger than this are refused rather than read (the real ones are < 2 KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;

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
    /// The bytes the current config was built from; `None` = no file.
    last: Option<Vec<u8>>,
    loaded: Loaded,
}

impl Loader {
    /// Reads the file once.
    pub fn new(sources: Sources) -> Loader {
        let raw = read_bytes(sources.config_path());
        let loaded = build(&sources, &raw);
        Loader { last: raw.ok().flatten(), sources, loaded }
    }

    /// Re-reads the file; rebuilds the config only when the bytes changed.
    pub fn reload(&mut self) -> Reload {
        let raw = read_bytes(self.sources.config_path());
        if let Ok(bytes) = &raw
            && *bytes == self.last
        {
            return Reload::Unchanged;
        }
        self.loaded = build(&self.sources, &raw);
        // An unreadable file is retried at every reload until it reads.
        self.last = raw.ok().flatten();
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

fn build(sources: &Sources, raw: &Result<Option<Vec<u8>>, String>) -> Loaded {
    let (file, doc) = match raw {
        Ok(Some(bytes)) => parse_document(bytes),
        Ok(None) => (FileStatus::Missing, None),
        Err(why) => (FileStatus::Unusable(why.clone()), None),
    };
    let config = parse::build(&file, doc.as_ref(), sources);
    Loaded { path: sources.config_path().to_owned(), file, config }
}

/// `Ok(None)` when there is no file.
fn read_bytes(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    let mut bytes = Vec::new();
    match file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes) {
        Ok(n) if n as u64 > MAX_FILE_BYTES => {
            Err(format!("{} is larger than {MAX_FILE_BYTES} bytes", path.display()))
        }
        Ok(_) => Ok(Some(bytes)),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
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
