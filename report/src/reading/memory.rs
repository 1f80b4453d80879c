//! PyTorch memory snapshots (docs/formats.md, "Memory snapshots"): the files under
//! `framework/memory/<node>/`, decoded by [`super::pickle`] (nothing is executed) and reduced
//! to what the report uses: per device, the live blocks at the snapshot and the allocator's
//! history (`device_traces`), each allocation attributed to one Python frame.
//!
//! The walk follows the format's fixed shape (the dict, `segments`, a segment, `blocks`, a
//! block, `frames`, a frame; `device_traces`, a device's list, an entry, `frames`), never
//! recursing through the data, and counts every item it visits: a file whose references make
//! the walk visit more than [`MAX_VISITS`] items is refused (`docs/report.md`, "Untrusted
//! input").

use std::collections::HashMap;

use trainprof_output::fs::{self as ofs, Dir};
use trainprof_output::protocol::memory_snapshot::{MEMORY_DIR, SnapshotName};

use super::pickle::{self, Pickle, PickleError, Value};
use super::{Skipped, read_file, shown};

/// A snapshot file larger than this is not read (100,000 history entries with Python stacks
/// are some 12 MB: BENCHMARKS.md, "Memory snapshots").
pub const MAX_SNAPSHOT_BYTES: u64 = 256 << 20;
/// Snapshot files read per job; more are listed in `job.skipped`.
pub const MAX_SNAPSHOTS: usize = 64;
/// Items the walk visits per file (a shared list visited twice counts twice).
pub const MAX_VISITS: usize = 2 * pickle::MAX_VALUES;
/// Frames of a stack looked at to attribute an allocation.
pub const MAX_FRAMES: usize = 64;
/// A frame's file and function are cut to this many bytes.
pub const MAX_NAME: usize = 512;

// torch's keys (`torch/cuda/memory.py`, `_snapshot`): the format is torch's, not ours.
const SEGMENTS: &str = "segments";
const DEVICE_TRACES: &str = "device_traces";
const BLOCKS: &str = "blocks";
const FRAMES: &str = "frames";

/// The frame an allocation is attributed to: `file:line` and the function.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Site {
    pub file: String,
    pub line: i64,
    pub function: String,
}

/// What a history entry did (`TraceEntry.action`); others are kept as `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    Oom,
    Other,
}

/// One history entry: `site` indexes [`Snapshot::sites`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    pub action: Action,
    pub addr: i64,
    pub size: i64,
    pub time_us: i64,
    pub site: Option<u32>,
}

/// One device's state in a snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Device {
    /// Blocks `active_allocated` at the snapshot: (address, size, site).
    pub live: Vec<(i64, i64, Option<u32>)>,
    /// Segments' `total_size` summed: reserved at the snapshot.
    pub reserved: i64,
    /// Segments at the snapshot.
    pub segments: u64,
    pub trace: Vec<Entry>,
}

/// A decoded snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Device index → state.
    pub devices: std::collections::BTreeMap<i64, Device>,
    pub sites: Vec<Site>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SnapshotError {
    #[error(transparent)]
    Pickle(#[from] PickleError),
    #[error("not a torch memory snapshot (no dict with `segments` and `device_traces`)")]
    NotSnapshot,
    #[error("its references make the walk visit more than {MAX_VISITS} items: not read")]
    TooManyVisits,
}

struct Walk<'a> {
    p: &'a Pickle,
    visits: usize,
    sites: Vec<Site>,
    site_ids: HashMap<Site, u32>,
    /// Frames list (arena value) → its site, so a shared stack is attributed once.
    by_stack: HashMap<u32, Option<u32>>,
}

impl<'a> Walk<'a> {
    fn items(&mut self, v: Option<&'a Value>) -> Result<&'a [Value], SnapshotError> {
        let items = v.and_then(|v| self.p.items(v)).unwrap_or(&[]);
        self.visits += items.len();
        if self.visits > MAX_VISITS {
            return Err(SnapshotError::TooManyVisits);
        }
        Ok(items)
    }
    fn int(&self, d: &Value, key: &str) -> i64 {
        self.p.get(d, key).and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f as i64))).unwrap_or(0)
    }

    /// The site of a stack: the innermost Python frame outside the installed packages and
    /// the standard library, else the innermost `.py` frame, else the innermost frame
    /// (docs/formats.md, "Memory snapshots").
    fn site(&mut self, frames: Option<&'a Value>) -> Result<Option<u32>, SnapshotError> {
        let key = match frames {
            Some(Value::List(i)) | Some(Value::Tuple(i)) => Some(*i),
            _ => None,
        };
        if let Some(k) = key
            && let Some(s) = self.by_stack.get(&k)
        {
            return Ok(*s);
        }
        let all = self.items(frames)?;
        let mut first = None;
        let mut first_py = None;
        let mut user = None;
        for f in all.iter().take(MAX_FRAMES) {
            let Some(file) = self.p.get(f, "filename").and_then(Value::as_str) else { continue };
            let py = file.ends_with(".py");
            let library =
                ["site-packages", "dist-packages", "/lib/python", "<frozen"].iter().any(|m| file.contains(m));
            first.get_or_insert(f);
            if py {
                first_py.get_or_insert(f);
                if !library {
                    user = Some(f);
                    break;
                }
            }
        }
        let chosen = user.or(first_py).or(first);
        let id = match chosen {
            None => None,
            Some(f) => {
                let text = |k: &str| {
                    let s = self.p.get(f, k).and_then(Value::as_str).unwrap_or("?");
                    let mut end = s.len().min(MAX_NAME);
                    while !s.is_char_boundary(end) {
                        end -= 1;
                    }
                    shown(&s[..end]).into_owned()
                };
                let site = Site { file: text("filename"), line: self.int(f, "line"), function: text("name") };
                let next = self.sites.len() as u32;
                Some(*self.site_ids.entry(site.clone()).or_insert_with(|| {
                    self.sites.push(site);
                    next
                }))
            }
        };
        if let Some(k) = key {
            self.by_stack.insert(k, id);
        }
        Ok(id)
    }
}

fn action(s: Option<&str>) -> Action {
    match s {
        Some("alloc") => Action::Alloc,
        Some("free_requested") => Action::FreeRequested,
        Some("free_completed") => Action::FreeCompleted,
        Some("segment_alloc") | Some("segment_map") => Action::SegmentAlloc,
        Some("segment_free") | Some("segment_unmap") => Action::SegmentFree,
        Some("oom") => Action::Oom,
        _ => Action::Other,
    }
}

/// Reduces a decoded pickle to a [`Snapshot`].
pub fn snapshot(p: &Pickle) -> Result<Snapshot, SnapshotError> {
    let root = p.root.as_ref().ok_or(SnapshotError::NotSnapshot)?;
    let (Some(segments), Some(traces)) = (p.get(root, SEGMENTS), p.get(root, DEVICE_TRACES)) else {
        return Err(SnapshotError::NotSnapshot);
    };
    if p.items(segments).is_none() || p.items(traces).is_none() {
        return Err(SnapshotError::NotSnapshot);
    }
    let mut w = Walk { p, visits: 0, sites: Vec::new(), site_ids: HashMap::new(), by_stack: HashMap::new() };
    let mut out = Snapshot::default();
    for seg in w.items(Some(segments))? {
        let device = w.int(seg, "device");
        let total = w.int(seg, "total_size");
        let blocks = w.items(p.get(seg, BLOCKS))?;
        let mut live = Vec::new();
        for b in blocks {
            if p.get(b, "state").and_then(Value::as_str) == Some("active_allocated") {
                let site = w.site(p.get(b, FRAMES))?;
                live.push((w.int(b, "address"), w.int(b, "size"), site));
            }
        }
        let d = out.devices.entry(device).or_default();
        d.reserved = d.reserved.saturating_add(total);
        d.segments += 1;
        d.live.extend(live);
    }
    for (i, dev) in w.items(Some(traces))?.iter().enumerate() {
        let entries = w.items(Some(dev))?;
        if entries.is_empty() {
            continue;
        }
        let mut trace = Vec::with_capacity(entries.len());
        for e in entries {
            let action = action(p.get(e, "action").and_then(Value::as_str));
            // Only allocations are attributed: a free's stack is where it was freed.
            let site = if action == Action::Alloc { w.site(p.get(e, FRAMES))? } else { None };
            trace.push(Entry {
                action,
                addr: w.int(e, "addr"),
                size: w.int(e, "size"),
                time_us: w.int(e, "time_us"),
                site,
            });
        }
        out.devices.entry(i as i64).or_default().trace = trace;
    }
    out.sites = w.sites;
    Ok(out)
}

/// Decodes a snapshot file's bytes.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    let p = pickle::decode(bytes)?;
    snapshot(&p)
}

/// A snapshot file found under `framework/memory/<node>/`.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    pub node: String,
    pub name: SnapshotName,
    pub rel: String,
    pub bytes: u64,
}

/// The snapshot files of the job (at most [`MAX_SNAPSHOTS`]), sorted by path.
pub fn files(root: &Dir, skipped: &mut Skipped) -> Vec<SnapshotFile> {
    let want = |name: &str, is_dir: bool| is_dir || SnapshotName::parse(name).is_some();
    let w = ofs::walk(root, MEMORY_DIR, &want);
    for r in w.refused {
        skipped.push(r);
    }
    let mut out = Vec::new();
    for (rel, meta) in w.files {
        if skipped.1.contains(&rel) {
            continue;
        }
        let Some(rest) = rel.strip_prefix(MEMORY_DIR).and_then(|r| r.strip_prefix('/')) else { continue };
        let Some((node, file)) = rest.split_once('/') else { continue };
        let Some(name) = (!file.contains('/')).then(|| SnapshotName::parse(file)).flatten() else { continue };
        out.push(SnapshotFile { node: shown(node).into_owned(), name, rel: rel.clone(), bytes: meta.len });
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    if out.len() > MAX_SNAPSHOTS {
        skipped.push(format!(
            "{MEMORY_DIR}: more than {MAX_SNAPSHOTS} snapshots; {} not read",
            out.len() - MAX_SNAPSHOTS
        ));
        out.truncate(MAX_SNAPSHOTS);
    }
    out
}

/// Why a snapshot file was not read; its line goes to `job.skipped`.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Unread(#[from] super::Unread),
    #[error("{0}: {1}")]
    Decode(String, SnapshotError),
}

/// Reads and decodes one file.
pub fn read(root: &Dir, f: &SnapshotFile) -> Result<Snapshot, ReadError> {
    let bytes = read_file(root, &f.rel, MAX_SNAPSHOT_BYTES)?;
    decode(&bytes).map_err(|e| ReadError::Decode(f.rel.clone(), e))
}
