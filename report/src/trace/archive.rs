//! `trainprof trace --per-node-archive FILE`: one uncompressed tar (POSIX ustar) holding
//! `perfetto_manifest.json` first, then one Chrome JSON trace per node with its times as
//! recorded; the manifest names each file's machine and its clock offset, for Perfetto to
//! merge (`docs/report.md`, "The trace"; the manifest: `docs/formats.md`, "Per-node trace
//! archive").
//!
//! Members are streamed: each one's header is written with its size once its data is done
//! (the archive is a new file we created, so we seek back in it), so memory does not grow
//! with the job.

use std::collections::BTreeSet;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;

use serde_json::json;
use trainprof_output::fs::Dir;

use super::{Clip, Error, Shifts, Sink, Written, clocks, write_shifted};
use crate::analysis::collectives::node_of;
use crate::model::collectives::{AlignState, NodeClock};
use crate::reading::{self, Skipped};

/// The manifest's member name (Perfetto reads it first in an archive).
pub const MANIFEST: &str = "perfetto_manifest.json";
/// A member's size in ustar's 11 octal digits: under 8 GiB.
const MAX_MEMBER: u64 = (1 << 33) - 1;
/// Bytes of a node's name kept in its member's name.
const NAME_BYTES: usize = 64;

/// What was written.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Archive {
    /// Per node: its member's name, and what went into it.
    pub files: Vec<(String, String, Written)>,
    pub clocks: Vec<NodeClock>,
}

/// A member's name for a node: `<i>-<node>.json`, the node's name with anything but ASCII
/// letters, digits, `.`, `_` and `-` as `_`, cut to [`NAME_BYTES`].
fn member_name(i: usize, node: &str) -> String {
    let safe: String = node
        .chars()
        .take(NAME_BYTES)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .collect();
    format!("{i:03}-{safe}.json")
}

/// The manifest: per file its machine (the node) and, for a node the collectives align, its
/// clock offset (`offset_ns`: the file's time = the trace's time + offset); a node without
/// an estimate has no `clocks` (its times are taken as recorded).
pub fn manifest(files: &[(String, String)], clocks: &[NodeClock]) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = files
        .iter()
        .map(|(path, node)| {
            let offset = clocks
                .iter()
                .find(|c| &c.node == node && c.state != AlignState::Unaligned)
                .and_then(|c| c.offset_ms);
            match offset {
                Some(ms) => json!({"path": path, "machine": {"name": node},
                    "clocks": {"offset_ns": (ms * 1000.0).round() as i64 * 1000}}),
                None => json!({"path": path, "machine": {"name": node}}),
            }
        })
        .collect();
    json!({"perfetto_manifest": {"version": 1, "files": entries}})
}

/// A ustar header for a regular file `name` of `size` bytes.
fn header(name: &str, size: u64) -> io::Result<[u8; 512]> {
    if name.len() > 99 || size > MAX_MEMBER {
        return Err(io::Error::other(format!("{name}: {size} bytes, more than a tar member holds here")));
    }
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let mut put = |at: usize, text: &str| h[at..at + text.len()].copy_from_slice(text.as_bytes());
    put(100, "0000644\0");
    put(108, "0000000\0");
    put(116, "0000000\0");
    put(124, &format!("{size:011o}\0"));
    put(136, "00000000000\0");
    put(148, "        ");
    put(156, "0");
    put(257, "ustar\0");
    put(263, "00");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    Ok(h)
}

/// Counts what goes through.
struct Counted<W> {
    w: W,
    n: u64,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let k = self.w.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

/// One member: a placeholder header, its data from `body`, the padding, then the header
/// with its size.
fn member<W: Write + Seek, T>(
    out: &mut W,
    name: &str,
    body: impl FnOnce(&mut Counted<&mut W>) -> Result<T, Error>,
) -> Result<T, Error> {
    let at = out.stream_position()?;
    out.write_all(&[0u8; 512])?;
    let mut c = Counted { w: &mut *out, n: 0 };
    let t = body(&mut c)?;
    let n = c.n;
    let pad = (512 - n % 512) % 512;
    out.write_all(&vec![0u8; pad as usize])?;
    let end = out.stream_position()?;
    out.seek(SeekFrom::Start(at))?;
    out.write_all(&header(name, n)?)?;
    out.seek(SeekFrom::Start(end))?;
    Ok(t)
}

/// The nodes of the job: the hosts of the timelines' ranks and the system metrics' nodes.
fn nodes(dir: &Dir) -> BTreeSet<String> {
    let found = std::cell::RefCell::new(BTreeSet::new());
    let mut skipped = Skipped::default();
    reading::timeline_events(
        dir,
        &mut skipped,
        &|rank, _| {
            found.borrow_mut().insert(node_of(rank).to_owned());
            false
        },
        |_| {},
    );
    let mut found = found.into_inner();
    reading::system_ticks(dir, &mut skipped, |node, _| {
        if !found.contains(node) {
            found.insert(node.to_owned());
        }
    });
    found
}

/// Writes the per-node archive of the LocalPath at `root` into `out` (a new file).
pub fn write<W: Write + Seek>(root: &Path, mut out: W, clip: &Clip) -> Result<Archive, Error> {
    let dir = Dir::open_root(root, false).map_err(|e| Error::Root(root.display().to_string(), e))?;
    let clocks = clocks(&dir);
    let files: Vec<(String, String)> =
        nodes(&dir).into_iter().enumerate().map(|(i, n)| (member_name(i, &n), n)).collect();
    let m = serde_json::to_vec_pretty(&manifest(&files, &clocks)).map_err(io::Error::other)?;
    member(&mut out, MANIFEST, |w| Ok(w.write_all(&m)?))?;
    let mut archive = Archive { files: Vec::new(), clocks: clocks.clone() };
    for (name, node) in files {
        let shifts = Shifts::new(&clocks, false);
        let written = member(&mut out, &name, |w| {
            write_shifted(&dir, Sink::Plain(w), clip, Some(&node), shifts, clocks.clone(), false)
        })?;
        archive.files.push((name, node, written));
    }
    out.write_all(&[0u8; 1024])?;
    out.flush()?;
    Ok(archive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_safe_and_headers_sum() {
        assert_eq!(member_name(2, "algo-1"), "002-algo-1.json");
        assert_eq!(member_name(0, "../x\u{1b}y"), "000-.._x_y.json");
        assert_eq!(member_name(1, &"é".repeat(100)).len(), 4 + 64 + 5);
        let h = header("a.json", 1234).unwrap();
        assert_eq!(&h[124..136], b"00000002322\0");
        let sum: u32 =
            h.iter().enumerate().map(|(i, b)| if (148..156).contains(&i) { 32 } else { u32::from(*b) }).sum();
        assert_eq!(std::str::from_utf8(&h[148..154]).unwrap(), format!("{sum:06o}"));
        assert!(header("a.json", 1 << 33).is_err());
    }
}
