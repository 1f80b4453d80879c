//! Native windows (`framework/native/<node>/<first µs>-<last µs>_<pid>/`, docs/formats.md
//! "Native profiling"): the samples of each window as a tree of frames, its top functions by
//! self and by total samples, and the frames of its flame graph, for the page to redraw.
//!
//! **Source of truth.** `profile.pb.gz` when the window has one: it holds every sample, stack
//! and count exactly (the flame graph is drawn from it and leaves out frames narrower than a
//! tenth of a pixel). Only when it is missing (not kept, or refused: too large, a link, not a
//! protobuf) is `flamegraph.svg` read, for its frames' names and sample counts (inferno's
//! `fg:x` / `fg:w` attributes); the SVG's own markup and script are never used, and the page
//! redraws the graph with its own code ([`crate::page::windows`]).
//!
//! Both files are the trainer's, so untrusted: read through `trainprof_output::fs` (no link
//! followed, a plain file only), at most [`MAX_FILE_BYTES`] bytes (and as much unzipped), with
//! caps on the strings, functions, locations, samples and frames read ([`Caps`]): memory is
//! bounded whatever the file holds. Names are demangled here too (C++ and Rust; files written
//! before the hook demangled hold mangled names), at most [`MAX_NAME`] bytes each, within one
//! budget for the job's windows ([`crate::reading::demangle`]).

use std::collections::HashMap;
use std::io::Read as _;

use trainprof_output::fs::{self as ofs, Dir};
use trainprof_output::protocol::native_window::{self, NativeFile};

use crate::model::{Flame, NativeFunction, NativeWindow};
use crate::reading::Skipped;
use crate::reading::demangle::Demangler;

/// Largest `profile.pb.gz` or `flamegraph.svg` read, and largest unzipped profile.
pub const MAX_FILE_BYTES: u64 = 64 << 20;
/// Functions listed per window, by self and by total samples.
pub const TOP: usize = 20;
/// A name is cut to this many bytes (a demangled C++ name is at most 4,096).
pub const MAX_NAME: usize = 4096;
/// Windows read at most (the rest are counted in `job.skipped`).
pub const MAX_WINDOWS: usize = 64;
/// Frames of the flame graph kept per window: those of at least [`FLAME_MIN_SHARE`] of the
/// samples, nearest the root first.
pub const MAX_FLAME_FRAMES: usize = 1500;
pub const FLAME_MIN_SHARE: f64 = 0.001;

/// The counts a read may reach before the file is refused (strings, functions, locations,
/// lines, SVG frames) or stacks are left out (tree nodes, depth).
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    pub strings: usize,
    pub functions: usize,
    pub locations: usize,
    pub lines: usize,
    pub samples: usize,
    pub frames: usize,
    pub nodes: usize,
    pub depth: usize,
}

pub const CAPS: Caps = Caps {
    strings: 1 << 20,
    functions: 1 << 20,
    locations: 1 << 20,
    lines: 4 << 20,
    samples: 4 << 20,
    frames: 200_000,
    nodes: 200_000,
    depth: 1024,
};

/// The windows under `framework/native/`, read.
pub fn windows(root: &Dir, skipped: &mut Skipped) -> Vec<NativeWindow> {
    let want = |name: &str, is_dir: bool| {
        if is_dir { !name.starts_with('.') } else { NativeFile::parse(name).is_some() }
    };
    let w = ofs::walk(root, native_window::NATIVE_DIR, &want);
    for r in w.refused {
        // The Python windows' walk of `framework/` met these links too.
        if !skipped.0.contains(&r) {
            skipped.push(r);
        }
    }
    // node/window → the files it has.
    let mut found: std::collections::BTreeMap<(String, String), (bool, bool)> = Default::default();
    for (rel, _) in w.files {
        if skipped.1.contains(&rel) {
            continue;
        }
        let parts: Vec<&str> = rel.split('/').collect();
        let [_, _, node, window, file] = parts.as_slice() else { continue };
        let e = found.entry(((*node).to_owned(), (*window).to_owned())).or_default();
        match NativeFile::parse(file) {
            Some(NativeFile::Profile) => e.0 = true,
            Some(NativeFile::Flamegraph) => e.1 = true,
            None => {}
        }
    }
    let mut out = Vec::new();
    // One budget for the job's windows (`docs/report.md`, "Mangled names").
    let mut demangler = Demangler::default();
    for (i, ((node, window), (pb, svg))) in found.into_iter().enumerate() {
        if i == MAX_WINDOWS {
            skipped.push(format!(
                "{}: more than {MAX_WINDOWS} windows; the rest not read",
                native_window::NATIVE_DIR
            ));
            break;
        }
        let dir = native_window::window_dir(&node, &window);
        let mut read = None;
        if pb {
            let rel = format!("{dir}/{}", native_window::PROFILE_FILE);
            match read_gz(root, &rel)
                .and_then(|b| profile(&b, &CAPS).map_err(|e| Unread::Tree(rel.clone(), e)))
            {
                Ok(t) => read = Some((NativeFile::Profile, t)),
                Err(e) => skipped.push(e),
            }
        }
        if read.is_none() && svg {
            let rel = format!("{dir}/{}", native_window::FLAMEGRAPH_FILE);
            match crate::reading::read_file(root, &rel, MAX_FILE_BYTES)
                .map_err(Unread::File)
                .and_then(|b| flamegraph_svg(&b, &CAPS).map_err(|e| Unread::Tree(rel.clone(), e)))
            {
                Ok(t) => read = Some((NativeFile::Flamegraph, t)),
                Err(e) => skipped.push(e),
            }
        }
        let Some((source, mut tree)) = read else { continue };
        tree.show_names(&mut demangler);
        out.push(window_model(node, window, source, &tree));
    }
    out
}

/// Why a native window's file was not read (the reason [`Skipped`] lists).
#[derive(Debug, thiserror::Error)]
enum Unread {
    #[error(transparent)]
    File(#[from] crate::reading::Unread),
    #[error("{0}: not gzip ({1})")]
    NotGzip(String, std::io::ErrorKind),
    #[error("{0}: more than {MAX_FILE_BYTES} bytes unzipped: not read")]
    Unzipped(String),
    #[error("{0}: {1}")]
    Tree(String, ReadError),
}

/// The bytes of a gzipped file, unzipped: at most [`MAX_FILE_BYTES`] read and as many unzipped.
fn read_gz(root: &Dir, rel: &str) -> Result<Vec<u8>, Unread> {
    let (f, _) = crate::reading::open_limited(root, rel, MAX_FILE_BYTES)?;
    // Reserved whole (only the pages written are ever resident): grown by doubling, the
    // buffer would peak at twice the cap while its bytes are copied.
    let mut out = Vec::with_capacity(usize::try_from(MAX_FILE_BYTES + 1).unwrap_or(usize::MAX));
    flate2::read::GzDecoder::new(f)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| Unread::NotGzip(rel.to_owned(), e.kind()))?;
    if out.len() as u64 > MAX_FILE_BYTES {
        return Err(Unread::Unzipped(rel.to_owned()));
    }
    Ok(out)
}

/// `<first µs>-<last µs>_<pid>` → (start s, end s, pid).
pub fn parse_window(name: &str) -> Option<(f64, f64, u64)> {
    let (a, b, pid) = native_window::parse_window(name)?;
    Some((a as f64 / 1e6, b as f64 / 1e6, pid))
}

fn window_model(node: String, window: String, source: NativeFile, t: &Tree) -> NativeWindow {
    let (self_top, total_top) = t.top(TOP);
    let times = parse_window(&window);
    NativeWindow {
        node,
        start_s: times.map(|t| t.0),
        end_s: times.map(|t| t.1),
        pid: times.map(|t| t.2),
        window,
        source,
        samples: t.samples(),
        cpu_s: t.cpu_ns.map(|ns| ns as f64 / 1e9),
        samples_left_out: t.left_out,
        top_self: self_top,
        top_total: total_top,
        flame: t.flame(MAX_FLAME_FRAMES, FLAME_MIN_SHARE),
    }
}

// ---------------------------------------------------------------------------------------------
// The tree of frames

/// One frame of the tree: a function under its caller. Node 0 is the root (`all`).
#[derive(Debug, Clone)]
struct Node {
    name: u32,
    parent: u32,
    depth: u32,
    total: u64,
    own: u64,
}

/// The frames of a window, root first, with their samples.
#[derive(Debug, Default)]
pub struct Tree {
    names: Vec<String>,
    by_name: HashMap<String, u32>,
    nodes: Vec<Node>,
    children: HashMap<(u32, u32), u32>,
    /// Samples of stacks not added (past the node cap).
    pub left_out: u64,
    /// CPU time of the samples, when the profile says (its second value, nanoseconds).
    pub cpu_ns: Option<u64>,
    /// The frames under the root are threads (pprof's flame graph always draws them; a profile
    /// when its samples carry a `thread` label).
    pub threads: bool,
}

/// Why a profile or flame graph was not read: the kind of problem, never the file's content.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReadError {
    #[error("not a pprof profile: {0}")]
    Protobuf(&'static str),
    #[error("not an inferno flame graph: {0}")]
    Svg(&'static str),
    #[error("more than {1} {0}: not read")]
    TooMany(&'static str, usize),
}

impl Tree {
    fn new() -> Tree {
        let mut t = Tree::default();
        // The root's name is "" (no function has it: an empty name reads as "?").
        let root = t.intern("");
        t.nodes.push(Node { name: root, parent: u32::MAX, depth: 0, total: 0, own: 0 });
        t
    }

    fn intern(&mut self, raw: &str) -> u32 {
        let raw = if raw.is_empty() && !self.names.is_empty() { "?" } else { raw };
        if let Some(&i) = self.by_name.get(raw) {
            return i;
        }
        let i = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        // As written (cut); shown by `show_names` once the tree is whole.
        self.names.push(cut(raw, MAX_NAME).to_owned());
        self.by_name.insert(raw.to_owned(), i);
        i
    }

    /// Every name as shown, demangled within the job's budget ([`Demangler::show`]; control
    /// characters as escapes): called once, before the window's tops and flame are made.
    pub fn show_names(&mut self, demangler: &mut Demangler) {
        for n in self.names.iter_mut().skip(1) {
            *n = demangler.show(n, MAX_NAME);
        }
    }

    /// The child `name` of `parent`, made when missing (`None` past the node cap).
    fn child(&mut self, parent: u32, name: u32, caps: &Caps) -> Option<u32> {
        if let Some(&c) = self.children.get(&(parent, name)) {
            return Some(c);
        }
        let depth = self.nodes[parent as usize].depth + 1;
        if self.nodes.len() >= caps.nodes || depth as usize > caps.depth {
            return None;
        }
        let c = u32::try_from(self.nodes.len()).ok()?;
        self.nodes.push(Node { name, parent, depth, total: 0, own: 0 });
        self.children.insert((parent, name), c);
        Some(c)
    }

    /// Adds `count` samples of a stack given root first (interned names).
    fn add(&mut self, root_first: &[u32], count: u64, caps: &Caps) {
        let mut path = Vec::with_capacity(root_first.len() + 1);
        let mut at = 0u32;
        path.push(at);
        for &n in root_first {
            match self.child(at, n, caps) {
                Some(c) => {
                    at = c;
                    path.push(c);
                }
                None => {
                    self.left_out += count;
                    return;
                }
            }
        }
        for &p in &path {
            let node = &mut self.nodes[p as usize];
            node.total = node.total.saturating_add(count);
        }
        let leaf = &mut self.nodes[at as usize];
        leaf.own = leaf.own.saturating_add(count);
    }

    /// Samples in the tree.
    pub fn samples(&self) -> u64 {
        self.nodes.first().map_or(0, |r| r.total)
    }

    /// Children of every node, ordered by name (as inferno orders them).
    fn child_lists(&self) -> Vec<Vec<u32>> {
        let mut kids = vec![Vec::new(); self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            kids[n.parent as usize].push(i as u32);
        }
        for k in &mut kids {
            k.sort_by(|a, b| {
                self.names[self.nodes[*a as usize].name as usize]
                    .cmp(&self.names[self.nodes[*b as usize].name as usize])
            });
        }
        kids
    }

    /// The top `n` functions by self samples and by total samples (a function's total counts a
    /// sample once however often it recurs in the stack). The root is not a function.
    pub fn top(&self, n: usize) -> (Vec<NativeFunction>, Vec<NativeFunction>) {
        let mut own = vec![0u64; self.names.len()];
        let mut total = vec![0u64; self.names.len()];
        let kids = self.child_lists();
        let mut on_path = vec![0u32; self.names.len()];
        // The root, and the threads under it (pprof's bottom frame), are no functions.
        let first = if self.threads { 2 } else { 1 };
        // Iterative depth-first walk: (node, entering).
        let mut stack = vec![(0u32, true)];
        while let Some((i, entering)) = stack.pop() {
            let node = &self.nodes[i as usize];
            let name = node.name as usize;
            let counted = node.depth >= first;
            if !entering {
                if counted {
                    on_path[name] -= 1;
                }
                continue;
            }
            if counted {
                own[name] += node.own;
                if on_path[name] == 0 {
                    total[name] += node.total;
                }
                on_path[name] += 1;
            }
            stack.push((i, false));
            for &k in kids[i as usize].iter().rev() {
                stack.push((k, true));
            }
        }
        let mut listed = vec![false; self.names.len()];
        for node in self.nodes.iter().filter(|n| n.depth >= first) {
            listed[node.name as usize] = true;
        }
        let root = self.nodes[0].name as usize;
        let list = |key: &dyn Fn(usize) -> (u64, u64)| {
            let mut v: Vec<usize> = (0..self.names.len()).filter(|&i| i != root && listed[i]).collect();
            v.sort_by(|&a, &b| key(b).cmp(&key(a)).then_with(|| self.names[a].cmp(&self.names[b])));
            v.truncate(n);
            v.into_iter()
                .filter(|&i| key(i).0 > 0)
                .map(|i| NativeFunction {
                    name: self.names[i].clone(),
                    self_samples: own[i],
                    total_samples: total[i],
                })
                .collect::<Vec<_>>()
        };
        (list(&|i| (own[i], total[i])), list(&|i| (total[i], own[i])))
    }

    /// The frames of the flame graph: breadth first from the root, children by name, each at
    /// least `min_share` of the samples, at most `max` of them.
    pub fn flame(&self, max: usize, min_share: f64) -> Flame {
        let total = self.samples();
        let mut flame = Flame::default();
        if total == 0 {
            return flame;
        }
        let min = ((total as f64 * min_share).ceil() as u64).max(1);
        let kids = self.child_lists();
        let mut name_ix: HashMap<u32, u64> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([(0u32, 0u64)]);
        while let Some((i, x)) = queue.pop_front() {
            let node = &self.nodes[i as usize];
            if flame.frames.len() >= max {
                flame.left_out += 1;
                continue;
            }
            let next = flame.names.len() as u64;
            let f = *name_ix.entry(node.name).or_insert(next);
            if f == next {
                let name = if i == 0 { "all" } else { &self.names[node.name as usize] };
                flame.names.push(name.to_owned());
            }
            flame.frames.push([f, u64::from(node.depth), x, node.total]);
            let mut cx = x;
            for &k in &kids[i as usize] {
                let w = self.nodes[k as usize].total;
                if w >= min {
                    queue.push_back((k, cx));
                } else {
                    flame.left_out += 1;
                }
                cx += w;
            }
        }
        flame
    }
}

fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

// ---------------------------------------------------------------------------------------------
// pprof's Profile protobuf (profile.proto: sample 2, location 4, function 5, string_table 6)

/// One field's value.
#[derive(Debug, Clone, Copy)]
enum Val<'a> {
    Int(u64),
    Bytes(&'a [u8]),
}

/// A protobuf message's fields, one at a time.
struct Fields<'a> {
    buf: &'a [u8],
    i: usize,
}

const BAD: ReadError = ReadError::Protobuf("malformed");

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Fields { buf, i: 0 }
    }

    fn varint(&mut self) -> Result<u64, ReadError> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = *self.buf.get(self.i).ok_or(BAD)?;
            self.i += 1;
            if shift == 63 && b > 1 {
                return Err(BAD);
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(BAD)
    }

    fn next(&mut self) -> Result<Option<(u64, Val<'a>)>, ReadError> {
        if self.i >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (num, wire) = (key >> 3, key & 7);
        let take = |s: &mut Self, n: usize| -> Result<&'a [u8], ReadError> {
            let end = s.i.checked_add(n).filter(|&e| e <= s.buf.len()).ok_or(BAD)?;
            let b = &s.buf[s.i..end];
            s.i = end;
            Ok(b)
        };
        let v = match wire {
            0 => Val::Int(self.varint()?),
            1 => Val::Int(u64::from_le_bytes(take(self, 8)?.try_into().map_err(|_| BAD)?)),
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| BAD)?;
                Val::Bytes(take(self, n)?)
            }
            5 => Val::Int(u64::from(u32::from_le_bytes(take(self, 4)?.try_into().map_err(|_| BAD)?))),
            _ => return Err(ReadError::Protobuf("unsupported wire type")),
        };
        Ok(Some((num, v)))
    }
}

/// A repeated integer field's values, packed or not, passed to `f`.
fn each_int(v: Val<'_>, mut f: impl FnMut(u64) -> Result<(), ReadError>) -> Result<(), ReadError> {
    match v {
        Val::Int(x) => f(x),
        Val::Bytes(b) => {
            let mut p = Fields::new(b);
            while p.i < b.len() {
                f(p.varint()?)?;
            }
            Ok(())
        }
    }
}

fn int(v: Val<'_>) -> Result<u64, ReadError> {
    match v {
        Val::Int(x) => Ok(x),
        Val::Bytes(_) => Err(BAD),
    }
}

fn bytes(v: Val<'_>) -> Result<&[u8], ReadError> {
    match v {
        Val::Bytes(b) => Ok(b),
        Val::Int(_) => Err(BAD),
    }
}

/// The frame tree of an unzipped pprof `Profile`: its first value (samples) per stack, its
/// second (CPU nanoseconds) summed.
pub fn profile(buf: &[u8], caps: &Caps) -> Result<Tree, ReadError> {
    // Pass 1: strings, functions, locations (written after the samples).
    let mut strings: Vec<&[u8]> = Vec::new();
    let mut functions: HashMap<u64, u64> = HashMap::new();
    // location id → its lines' function ids (innermost first), as a range of `lines`.
    let mut locations: HashMap<u64, (u32, u32)> = HashMap::new();
    let mut lines: Vec<u64> = Vec::new();
    let mut top = Fields::new(buf);
    while let Some((num, v)) = top.next()? {
        match num {
            6 => {
                if strings.len() >= caps.strings {
                    return Err(ReadError::TooMany("strings", caps.strings));
                }
                strings.push(bytes(v)?);
            }
            5 => {
                if functions.len() >= caps.functions {
                    return Err(ReadError::TooMany("functions", caps.functions));
                }
                let (mut id, mut name) = (0, 0);
                let mut f = Fields::new(bytes(v)?);
                while let Some((n, v)) = f.next()? {
                    match n {
                        1 => id = int(v)?,
                        2 => name = int(v)?,
                        _ => {}
                    }
                }
                functions.insert(id, name);
            }
            4 => {
                if locations.len() >= caps.locations {
                    return Err(ReadError::TooMany("locations", caps.locations));
                }
                let start = lines.len();
                let mut id = 0;
                let mut f = Fields::new(bytes(v)?);
                while let Some((n, v)) = f.next()? {
                    match n {
                        1 => id = int(v)?,
                        4 => {
                            let mut l = Fields::new(bytes(v)?);
                            let mut func = 0;
                            while let Some((n, v)) = l.next()? {
                                if n == 1 {
                                    func = int(v)?;
                                }
                            }
                            if lines.len() >= caps.lines {
                                return Err(ReadError::TooMany("lines", caps.lines));
                            }
                            lines.push(func);
                        }
                        _ => {}
                    }
                }
                let (s, e) = (start as u32, (lines.len() - start) as u32);
                locations.insert(id, (s, e));
            }
            _ => {}
        }
    }
    if strings.first().is_some_and(|s| !s.is_empty()) {
        return Err(ReadError::Protobuf("the string table does not start with \"\""));
    }
    // Interned names by string index, made when first used.
    let mut t = Tree::new();
    let mut name_of: HashMap<u64, u32> = HashMap::new();
    let mut name = |t: &mut Tree, func: u64| -> u32 {
        let s = functions.get(&func).copied().unwrap_or(0);
        *name_of.entry(s).or_insert_with(|| {
            let raw = strings
                .get(s as usize)
                .map_or(std::borrow::Cow::Borrowed("?"), |b| String::from_utf8_lossy(b));
            t.intern(if raw.is_empty() { "?" } else { &raw })
        })
    };
    // Pass 2: the samples.
    let mut top = Fields::new(buf);
    let mut stack: Vec<u32> = Vec::new();
    let mut cpu_ns: Option<u64> = None;
    let mut samples = 0usize;
    let mut thread_names: HashMap<u64, u32> = HashMap::new();
    while let Some((num, v)) = top.next()? {
        if num != 2 {
            continue;
        }
        samples += 1;
        if samples > caps.samples {
            return Err(ReadError::TooMany("samples", caps.samples));
        }
        stack.clear();
        let mut values: [Option<u64>; 2] = [None, None];
        let mut nv = 0;
        let mut locs: Vec<u64> = Vec::new();
        let mut thread: Option<u64> = None;
        let mut f = Fields::new(bytes(v)?);
        while let Some((n, v)) = f.next()? {
            match n {
                1 => each_int(v, |id| {
                    if locs.len() >= caps.depth {
                        return Ok(());
                    }
                    locs.push(id);
                    Ok(())
                })?,
                2 => each_int(v, |x| {
                    if nv < 2 {
                        values[nv] = Some(x);
                    }
                    nv += 1;
                    Ok(())
                })?,
                3 => {
                    // A label: the `thread` one names the stack's thread (as the flame graph's
                    // bottom frame does).
                    let (mut key, mut val) = (0u64, 0u64);
                    let mut l = Fields::new(bytes(v)?);
                    while let Some((n, v)) = l.next()? {
                        match n {
                            1 => key = int(v)?,
                            2 => val = int(v)?,
                            _ => {}
                        }
                    }
                    if strings.get(key as usize).is_some_and(|k| *k == b"thread") && val != 0 {
                        thread = Some(val);
                    }
                }
                _ => {}
            }
        }
        let count = values[0].unwrap_or(0);
        if count == 0 {
            continue;
        }
        if let Some(ns) = values[1] {
            cpu_ns = Some(cpu_ns.unwrap_or(0).saturating_add(ns));
        }
        // Leaf first in the file: location by location, each innermost line first.
        for id in &locs {
            let (s, n) = locations.get(id).copied().unwrap_or((0, 0));
            if n == 0 {
                stack.push(t.intern("?"));
            }
            for k in s..s + n {
                let func = lines[k as usize];
                let nm = name(&mut t, func);
                stack.push(nm);
            }
        }
        if let Some(th) = thread {
            t.threads = true;
            let nm = *thread_names.entry(th).or_insert_with(|| {
                let raw = strings
                    .get(th as usize)
                    .map_or(std::borrow::Cow::Borrowed("?"), |b| String::from_utf8_lossy(b));
                t.intern(&raw)
            });
            stack.push(nm);
        }
        stack.reverse();
        stack.truncate(caps.depth);
        let root_first = std::mem::take(&mut stack);
        t.add(&root_first, count, caps);
        stack = root_first;
    }
    t.cpu_ns = cpu_ns;
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// inferno's flamegraph.svg

/// The frame tree of an inferno flame graph: each `<g><title>NAME (…)</title><rect … fg:x="X"
/// fg:w="W"/>` is a frame of W samples from X, its depth from the rect's `y` (the root, the
/// widest frame, lowest). Only those attributes and the title's text are read; everything else
/// (script, styles, other elements) is passed over as text.
pub fn flamegraph_svg(bytes: &[u8], caps: &Caps) -> Result<Tree, ReadError> {
    let text = String::from_utf8_lossy(bytes);
    let Some(start) = text.find("<svg id=\"frames\"") else {
        return Err(ReadError::Svg("no frames"));
    };
    let body = &text[start..];
    // (name, y, x, w)
    let mut frames: Vec<(String, f64, u64, u64)> = Vec::new();
    let mut rest = body;
    while let Some(g) = rest.find("<g><title>") {
        rest = &rest[g + "<g><title>".len()..];
        let Some(end) = rest.find("</title>") else { break };
        let title = cut(&rest[..end], MAX_TITLE_BYTES);
        rest = &rest[end..];
        // The rect follows the title at once (some 120 bytes): looked for only that far, so a
        // file of titles without rects costs linear time, not quadratic.
        let near = cut(rest, RECT_WINDOW);
        let Some(rect_end) = near.find("/>") else { continue };
        let rect = &near[..rect_end];
        if !rect.starts_with("</title><rect ") {
            continue;
        }
        let (Some(y), Some(x), Some(w)) = (attr(rect, "y"), attr(rect, "fg:x"), attr(rect, "fg:w")) else {
            continue;
        };
        let (Ok(y), Ok(x), Ok(w)) = (y.parse::<f64>(), x.parse::<u64>(), w.parse::<u64>()) else { continue };
        if !y.is_finite() || w == 0 {
            continue;
        }
        if frames.len() >= caps.frames {
            return Err(ReadError::TooMany("frames", caps.frames));
        }
        let title = unescape(title);
        // "NAME (1,234 samples, 12.34%)": the name is what comes before the last " (".
        let name = title.rfind(" (").map_or(title.as_str(), |i| &title[..i]);
        frames.push((cut(name, MAX_NAME).to_owned(), y, x, w));
    }
    if frames.is_empty() {
        return Err(ReadError::Svg("no frames"));
    }
    // Depth from y: the lowest frame (largest y) is the root; frames are 16 units apart.
    let y_root = frames.iter().map(|f| f.1).fold(f64::MIN, f64::max);
    let step = {
        let mut ys: Vec<f64> = frames.iter().map(|f| f.1).collect();
        ys.sort_by(f64::total_cmp);
        ys.dedup();
        ys.windows(2).map(|p| p[1] - p[0]).filter(|d| *d > 0.0).fold(f64::MAX, f64::min)
    };
    let step = if step.is_finite() && step < f64::MAX { step } else { 16.0 };
    let mut by_pos: Vec<(u64, u32, u64, String)> = frames
        .into_iter()
        .map(|(name, y, x, w)| (x, ((y_root - y) / step).round().clamp(0.0, u32::MAX as f64) as u32, w, name))
        .collect();
    // Parents before their children: by x, then depth.
    by_pos.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut t = Tree::new();
    // The open frames: (tree node, depth, end x).
    let mut open: Vec<(u32, u32, u64)> = Vec::new();
    let mut root_seen = false;
    for (x, depth, w, name) in by_pos {
        if depth == 0 {
            if root_seen {
                continue;
            }
            root_seen = true;
            t.nodes[0].total = w;
            t.nodes[0].own = w;
            open.clear();
            open.push((0, 0, x.saturating_add(w)));
            continue;
        }
        while let Some(&(_, d, end)) = open.last() {
            if d >= depth || end <= x {
                open.pop();
            } else {
                break;
            }
        }
        let Some(&(parent, pd, _)) = open.last() else { continue };
        if pd + 1 != depth || depth as usize > caps.depth {
            continue;
        }
        let nm = t.intern(&name);
        let Some(c) = t.child(parent, nm, caps) else {
            t.left_out += w;
            continue;
        };
        let node = &mut t.nodes[c as usize];
        node.total = node.total.saturating_add(w);
        node.own = node.own.saturating_add(w);
        let p = &mut t.nodes[parent as usize];
        p.own = p.own.saturating_sub(w);
        open.push((c, depth, x.saturating_add(w)));
    }
    if !root_seen {
        return Err(ReadError::Svg("no root frame"));
    }
    t.threads = true;
    Ok(t)
}

/// A title is read up to this many bytes (escaped, a name of [`MAX_NAME`] bytes and its counts).
const MAX_TITLE_BYTES: usize = 6 * MAX_NAME + 64;
/// How far after a title its rect's end is looked for.
const RECT_WINDOW: usize = 1024;

/// The value of `name="…"` in a tag's text.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let i = tag.find(&key)? + key.len();
    let end = tag[i..].find('"')?;
    Some(&tag[i..i + end])
}

/// XML text with its five named entities and numeric references replaced.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let Some(end) = rest.find(';').filter(|&e| e <= 12) else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let ent = &rest[1..end];
        let c = match ent {
            "lt" => Some('<'),
            "gt" => Some('>'),
            "amp" => Some('&'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => ent
                .strip_prefix("#x")
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match c {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    // A minimal protobuf writer for the tests' profiles.
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    fn field_int(out: &mut Vec<u8>, num: u64, v: u64) {
        varint(out, num << 3);
        varint(out, v);
    }
    fn field_bytes(out: &mut Vec<u8>, num: u64, b: &[u8]) {
        varint(out, (num << 3) | 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }
    fn packed(v: &[u64]) -> Vec<u8> {
        let mut o = Vec::new();
        for &x in v {
            varint(&mut o, x);
        }
        o
    }

    /// An unzipped pprof profile as the hook writes it: `stacks` are (thread, function names
    /// leaf first, samples); each function its own location; values (samples, cpu ns).
    pub(crate) fn profile_bytes(stacks: &[(&str, &[&str], u64)]) -> Vec<u8> {
        let mut strings: Vec<String> = vec![String::new(), "thread".into()];
        let sid = |s: &str, strings: &mut Vec<String>| -> u64 {
            if let Some(i) = strings.iter().position(|x| x == s) {
                return i as u64;
            }
            strings.push(s.to_owned());
            (strings.len() - 1) as u64
        };
        let mut funcs: Vec<String> = Vec::new();
        let mut out = Vec::new();
        for (thread, names, n) in stacks {
            let mut locs = Vec::new();
            for name in *names {
                let id = match funcs.iter().position(|f| f == name) {
                    Some(i) => i + 1,
                    None => {
                        funcs.push((*name).to_owned());
                        funcs.len()
                    }
                };
                locs.push(id as u64);
            }
            let mut s = Vec::new();
            field_bytes(&mut s, 1, &packed(&locs));
            field_bytes(&mut s, 2, &packed(&[*n, n * 10_000_000]));
            let mut label = Vec::new();
            field_int(&mut label, 1, 1);
            let th = sid(thread, &mut strings);
            field_int(&mut label, 2, th);
            field_bytes(&mut s, 3, &label);
            field_bytes(&mut out, 2, &s);
        }
        for i in 0..funcs.len() {
            let mut l = Vec::new();
            field_int(&mut l, 1, i as u64 + 1);
            let mut line = Vec::new();
            field_int(&mut line, 1, i as u64 + 1);
            field_bytes(&mut l, 4, &line);
            field_bytes(&mut out, 4, &l);
        }
        for (i, f) in funcs.iter().enumerate() {
            let mut m = Vec::new();
            field_int(&mut m, 1, i as u64 + 1);
            let name = sid(f, &mut strings);
            field_int(&mut m, 2, name);
            field_bytes(&mut out, 5, &m);
        }
        for s in &strings {
            field_bytes(&mut out, 6, s.as_bytes());
        }
        out
    }

    fn row(v: &[NativeFunction], name: &str) -> (u64, u64) {
        let f = v.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("{name} not in {v:?}"));
        (f.self_samples, f.total_samples)
    }

    #[test]
    fn a_profile_gives_self_and_total_samples_and_demangled_names() {
        let b = profile_bytes(&[
            ("main", &["hot", "_ZN2at6native5copy_ERNS_6TensorERKS1_b", "main"], 6),
            ("main", &["main"], 1),
            // Recursion: `rec` twice on one stack is counted once in its total.
            ("worker", &["leaf", "rec", "rec", "run"], 3),
        ]);
        let mut t = profile(&b, &CAPS).unwrap();
        t.show_names(&mut Demangler::default());
        assert_eq!(t.samples(), 10);
        assert_eq!(t.cpu_ns, Some(100_000_000));
        let (own, total) = t.top(TOP);
        assert_eq!(own[0].name, "hot");
        assert_eq!(row(&own, "hot"), (6, 6));
        assert_eq!(row(&total, "at::native::copy_(at::Tensor&, at::Tensor const&, bool)"), (0, 6));
        assert_eq!(row(&total, "main"), (1, 7));
        assert_eq!(row(&total, "rec"), (0, 3));
        assert_eq!(row(&own, "leaf"), (3, 3));
        // Threads are frames of the flame graph, not functions.
        assert!(!total.iter().any(|f| f.name == "worker" || f.name.is_empty()), "{total:?}");
        let fl = t.flame(MAX_FLAME_FRAMES, FLAME_MIN_SHARE);
        assert_eq!(fl.names[fl.frames[0][0] as usize], "all");
        assert_eq!(fl.frames[0], [0, 0, 0, 10]);
        let at = |name: &str| fl.frames.iter().find(|f| fl.names[f[0] as usize] == name).unwrap();
        // Children by name: `main` (7) before `worker` (3).
        assert_eq!(at("main")[1..], [1, 0, 7]);
        assert_eq!(at("worker")[1..], [1, 7, 3]);
        assert_eq!(at("hot")[1..], [4, 0, 6]);
    }

    #[test]
    fn narrow_frames_and_frames_past_the_cap_are_not_drawn() {
        let mut stacks: Vec<(&str, &[&str], u64)> = vec![("t", &["big"], 10_000)];
        stacks.push(("t", &["tiny"], 1));
        let t = profile(&profile_bytes(&stacks), &CAPS).unwrap();
        let fl = t.flame(MAX_FLAME_FRAMES, FLAME_MIN_SHARE);
        assert!(!fl.names.iter().any(|n| n == "tiny"));
        assert_eq!(fl.left_out, 1);
        let fl = t.flame(2, FLAME_MIN_SHARE);
        assert_eq!((fl.frames.len(), fl.left_out), (2, 2));
    }

    #[test]
    fn the_node_cap_leaves_stacks_out_and_counts_their_samples() {
        let caps = Caps { nodes: 4, ..CAPS };
        let b = profile_bytes(&[("t", &["a", "b"], 2), ("t", &["c", "d"], 5)]);
        let t = profile(&b, &caps).unwrap();
        assert_eq!((t.samples(), t.left_out), (2, 5));
        let caps = Caps { strings: 3, ..CAPS };
        assert_eq!(profile(&b, &caps).unwrap_err(), ReadError::TooMany("strings", 3));
    }

    #[test]
    fn malformed_profiles_are_errors_not_panics() {
        let good = profile_bytes(&[("t", &["a", "b"], 2)]);
        for cut in 0..good.len() {
            let _ = profile(&good[..cut], &CAPS);
        }
        // Every byte flipped in turn.
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0xff;
            let _ = profile(&b, &CAPS);
        }
        assert_eq!(profile(&[0x0b], &CAPS).unwrap_err(), ReadError::Protobuf("unsupported wire type"));
        assert_eq!(profile(&[0x12, 0xff, 0x01], &CAPS).unwrap_err(), BAD);
        assert!(profile(&[0xff; 16], &CAPS).is_err());
    }

    pub(crate) const SVG: &str = r#"<?xml version="1.0" standalone="no"?><svg version="1.1" width="1200" height="102" onload="init(evt)" xmlns="http://www.w3.org/2000/svg" xmlns:fg="http://github.com/jonhoo/inferno"><script type="text/ecmascript"><![CDATA[ alert("<g><title>x</title>") ]]></script><svg id="frames" x="10" width="1180" total_samples="10"><g><title>all (10 samples, 100%)</title><rect x="0.0000%" y="85" width="100.0000%" height="15" fill="rgb(1,2,3)" fg:x="0" fg:w="10"/><text x="0.25%" y="95.50"></text></g><g><title>python3 (10 samples, 100.00%)</title><rect x="0.0000%" y="69" width="100%" height="15" fill="rgb(1,2,3)" fg:x="0" fg:w="10"/><text x="0.25%" y="79.50">python3</text></g><g><title>_ZN3foo3barEv (7 samples, 70.00%)</title><rect x="0%" y="53" width="70%" height="15" fill="rgb(1,2,3)" fg:x="0" fg:w="7"/><text x="0.25%" y="63.50">..</text></g><g><title>std::vector&lt;int&gt;::push_back (&amp;) (4 samples, 40.00%)</title><rect x="0%" y="37" width="40%" height="15" fill="rgb(1,2,3)" fg:x="0" fg:w="4"/><text x="0.25%" y="47.50">..</text></g><g><title>&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt; (2 samples, 20.00%)</title><rect x="70%" y="53" width="20%" height="15" fill="rgb(1,2,3)" fg:x="7" fg:w="2"/><text x="70.25%" y="63.50">..</text></g></svg></svg>"#;

    #[test]
    fn an_inferno_flame_graph_gives_the_same_tree() {
        let mut t = flamegraph_svg(SVG.as_bytes(), &CAPS).unwrap();
        t.show_names(&mut Demangler::default());
        assert_eq!(t.samples(), 10);
        let (own, total) = t.top(TOP);
        assert_eq!(row(&total, "foo::bar()"), (3, 7));
        assert_eq!(row(&own, "std::vector<int>::push_back (&)"), (4, 4));
        assert_eq!(row(&own, "</title><script>alert(1)</script>"), (2, 2));
        // The thread is no function; the root keeps the sample no frame above it took.
        assert!(!total.iter().any(|f| f.name == "python3" || f.name == "all"));
        let fl = t.flame(MAX_FLAME_FRAMES, FLAME_MIN_SHARE);
        assert_eq!(fl.frames.len(), 5);
        assert_eq!(fl.names[fl.frames[1][0] as usize], "python3");
        assert!(t.cpu_ns.is_none());
    }

    #[test]
    fn svgs_without_frames_or_past_the_cap_are_refused() {
        assert_eq!(
            flamegraph_svg(b"<svg><script>x</script></svg>", &CAPS).unwrap_err(),
            ReadError::Svg("no frames")
        );
        let caps = Caps { frames: 3, ..CAPS };
        assert_eq!(flamegraph_svg(SVG.as_bytes(), &caps).unwrap_err(), ReadError::TooMany("frames", 3));
        // Cut anywhere: an error or a smaller tree, never a panic.
        for cut in (0..SVG.len()).step_by(7) {
            let _ = flamegraph_svg(&SVG.as_bytes()[..cut], &CAPS);
        }
        // 16 MiB of titles without rects: linear (a search for each title's rect to the end of
        // the file would take hours).
        let mut b = b"<svg id=\"frames\">".to_vec();
        while b.len() < 16 << 20 {
            b.extend_from_slice(b"<g><title>a (1 samples)</title>");
        }
        let t0 = std::time::Instant::now();
        assert_eq!(flamegraph_svg(&b, &CAPS).unwrap_err(), ReadError::Svg("no frames"));
        assert!(t0.elapsed().as_secs() < 30);
    }

    #[test]
    fn names_are_demangled_cut_and_escaped() {
        let mut d = Demangler::default();
        let mut display_name = |raw: &str| d.show(raw, MAX_NAME);
        assert_eq!(
            display_name("_ZN5torch8autograd9generated13ReluBackward05applyEOSt6vectorIN2at6TensorESaIS5_EE"),
            "torch::autograd::generated::ReluBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"
        );
        assert_eq!(display_name("_ZN3std2rt10lang_start17h0123456789abcdefE"), "std::rt::lang_start");
        assert_eq!(display_name("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        assert_eq!(display_name("cudaGetDevice"), "cudaGetDevice");
        assert_eq!(display_name("_Znot a symbol"), "_Znot a symbol");
        assert_eq!(display_name("a\u{1b}[31mb"), "a\\x1b[31mb");
        let long = "x".repeat(10_000);
        assert!(display_name(&long).len() <= MAX_NAME + '…'.len_utf8());
        // A hostile mangled name: bounded output, no hang, its readable part.
        let bomb = format!("_Z1f{}", "IS_S_S_S_S_".repeat(300));
        assert_eq!(display_name(&bomb), "f<…>");
    }

    #[test]
    fn window_folder_names_parse() {
        assert_eq!(
            parse_window("1795658444075479-1795658444782650_743"),
            Some((1795658444.075479, 1795658444.78265, 743))
        );
        assert_eq!(parse_window("1-2_3"), None);
        assert_eq!(parse_window("nonsense"), None);
    }
}
