//! The agent's records under `LocalPath/.trainprof/` (`docs/on-disk.md`): append-only text
//! files, one record a line, in a folder the agent made and owns ([`fs::private_dir`]).
//! A record is written with one `write` on an `O_APPEND` descriptor, so a crash leaves at
//! most a broken last line, which readers skip.

use std::io::{self, Write as _};

use crate::fs::{self, Dir};

/// The folder, relative to `LocalPath`.
pub const DIR: &str = ".trainprof";
/// Every system file name ever given (a name uploaded and deleted is not free again).
pub const SYSTEM_NAMES: &str = "system-names";
/// `--keep-local`: `path<TAB>bytes` of every file the store confirmed.
pub const UPLOADED: &str = "uploaded";

/// The most a record may hold: far more than any job writes (one line per sealed file),
/// small enough that a planted file cannot exhaust memory.
pub const MAX_BYTES: u64 = 256 << 20;

/// The complete lines of the record `name`; none when it does not exist yet.
pub fn read(root: &Dir, name: &str) -> io::Result<Vec<String>> {
    let dir = match root.sub(DIR, false) {
        Ok(_) => fs::private_dir(root, DIR)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let bytes = dir.read(name, MAX_BYTES)?.unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    // A last line without its newline was cut by a crash.
    let complete = text.rfind('\n').map_or("", |i| &text[..i]);
    Ok(complete.lines().map(str::to_owned).collect())
}

/// Appends `line` (without a newline) to the record `name`.
pub fn append(root: &Dir, name: &str, line: &str) -> io::Result<()> {
    let dir = fs::private_dir(root, DIR)?;
    let mut f = dir.open_append(name)?;
    f.write_all(format!("{line}\n").as_bytes())
}
