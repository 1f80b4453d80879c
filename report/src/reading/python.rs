//! Python-profiling windows: the top functions of a cProfile (`pstats` marshal data) or a
//! pyinstrument (JSON frame tree) window.

use std::collections::HashMap;

use trainprof_output::protocol::python_window::{EdgeMode, EdgePhase, PythonProfilerDir};

use crate::model::{PyFunction, PyFunctionTotal, PythonGroup, PythonGroupKind};

/// Functions listed per window.
pub const TOP: usize = 20;

/// The top functions of a cProfile window, by total (cumulative) time.
pub fn cprofile(bytes: &[u8]) -> Result<Vec<PyFunction>, crate::reading::marshal::MarshalError> {
    let mut out = cprofile_all(bytes)?;
    top(&mut out);
    Ok(out)
}

/// Every function of a cProfile window, by total time.
pub fn cprofile_all(bytes: &[u8]) -> Result<Vec<PyFunction>, crate::reading::marshal::MarshalError> {
    let rows = crate::reading::marshal::pstats(bytes)?;
    let mut out: Vec<PyFunction> = rows
        .into_iter()
        .map(|r| PyFunction {
            name: crate::reading::shown(&r.function).into_owned(),
            file: crate::reading::shown(&r.file).into_owned(),
            line: Some(r.line),
            calls: Some(r.calls),
            self_s: r.self_s,
            total_s: r.total_s,
        })
        .collect();
    sort(&mut out);
    Ok(out)
}

/// The first [`TOP`] of a list by total time.
pub fn top(v: &mut Vec<PyFunction>) {
    sort(v);
    v.truncate(TOP);
}

fn sort(v: &mut [PyFunction]) {
    v.sort_by(|a, b| b.total_s.total_cmp(&a.total_s).then_with(|| a.name.cmp(&b.name)));
}

/// Frames below this depth (the root is 0) are not counted; their time is still in their
/// parent's total. Deeper real stacks exist but add nothing to a top-20 list.
pub const MAX_DEPTH: usize = 512;
/// Frames read per file at most: a real 64 MiB window holds about 270,000 (some 250 bytes a
/// frame); 24 bytes each.
pub const MAX_FRAMES: usize = 1_000_000;
/// JSON nesting at most (arrays and objects, skipped ones included): two levels a frame.
const MAX_NESTING: u32 = 1 << 16;

/// Why a pyinstrument file was not read: the kind of problem and where, never its content.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PyinstrumentError {
    #[error("not pyinstrument JSON: {0}")]
    Json(String),
    #[error("more than {MAX_FRAMES} frames: not read")]
    TooManyFrames,
}

/// What a read cost: the parser's own counters, for tests that prove its bounds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Frames kept (at most `MAX_FRAMES`).
    pub frames: usize,
}

/// One frame as read: `parent` is `u32::MAX` for the root.
#[derive(Debug)]
struct Node {
    parent: u32,
    depth: u16,
    key: u32,
    time: f64,
}

/// A frame whose object is still open: its fields arrive in any order.
#[derive(Debug, Default)]
struct Open {
    node: u32,
    function: Option<String>,
    short: Option<String>,
    path: Option<String>,
    line: Option<i64>,
}

type Key = (String, String, Option<i64>);

/// The members of a frame object that are read.
#[derive(Debug, Clone, Copy)]
enum Field {
    Function,
    Short,
    Path,
    Line,
    Time,
    Children,
    Other,
}

/// The top functions of a pyinstrument window: per (function, file, line), total = the
/// time of its frames (not counted twice under recursion), self = total − its children's.
pub fn pyinstrument(bytes: &[u8]) -> Result<Vec<PyFunction>, PyinstrumentError> {
    let mut v = pyinstrument_all(bytes)?;
    top(&mut v);
    Ok(v)
}

/// Every function of a pyinstrument window, by total time.
pub fn pyinstrument_all(bytes: &[u8]) -> Result<Vec<PyFunction>, PyinstrumentError> {
    let mut t = Tree::default();
    t.read(bytes)?;
    let mut v = t.aggregate();
    sort(&mut v);
    Ok(v)
}

/// [`pyinstrument`], with what it cost (also on an error).
pub fn pyinstrument_counted(bytes: &[u8]) -> (Result<Vec<PyFunction>, PyinstrumentError>, Cost) {
    let mut t = Tree::default();
    let r = t.read(bytes);
    let cost = Cost { frames: t.nodes.len() };
    (
        r.map(|()| {
            let mut v = t.aggregate();
            top(&mut v);
            v
        }),
        cost,
    )
}

/// The frame tree as a flat list in document order (a parent before its children), read
/// with a pull parser (`struson`) that keeps its nesting in a heap stack, not on the call
/// stack: pyinstrument nests two JSON levels a frame, so a 512-frame stack is 1,000 levels,
/// beyond what a recursive parser (serde_json: 128) takes, and a hostile file may nest
/// 30 million deep. Frames are not kept as a tree of structs either (a file of empty
/// children would cost some 120 bytes a frame).
#[derive(Debug, Default)]
struct Tree {
    nodes: Vec<Node>,
    keys: Vec<Key>,
    index: HashMap<Key, u32>,
}

const NO_PARENT: u32 = u32::MAX;
const NO_KEY: u32 = u32::MAX;

impl Tree {
    fn read(&mut self, bytes: &[u8]) -> Result<(), PyinstrumentError> {
        use struson::reader::{JsonReader, JsonStreamReader, ReaderSettings, ValueType};
        let settings = ReaderSettings {
            track_path: false,
            max_nesting_depth: Some(MAX_NESTING),
            ..ReaderSettings::default()
        };
        let mut r = JsonStreamReader::new_custom(bytes, settings);
        let mut found_root = false;
        (|| -> Result<(), PyinstrumentError> {
            r.begin_object()?;
            while r.has_next()? {
                if r.next_name()? == "root_frame" && !found_root && r.peek()? == ValueType::Object {
                    found_root = true;
                    self.frames(&mut r)?;
                } else {
                    r.skip_value()?;
                }
            }
            r.end_object()?;
            r.consume_trailing_whitespace()?;
            Ok(())
        })()
    }

    /// Reads the frame object at `r` and every frame under it, iteratively: `open` holds
    /// the frames whose object is not finished, each inside its `children` array or not.
    fn frames<J: struson::reader::JsonReader>(&mut self, r: &mut J) -> Result<(), PyinstrumentError> {
        use struson::reader::ValueType;
        // (the frame, whether its `children` array is open).
        let mut open: Vec<(Open, bool)> = Vec::new();
        self.begin(r, &mut open, NO_PARENT, 0)?;
        while !open.is_empty() {
            let depth = open.len() - 1;
            let Some((top, in_children)) = open.last_mut() else { break };
            if *in_children {
                if r.has_next()? {
                    let parent = top.node;
                    if r.peek()? == ValueType::Object && depth < MAX_DEPTH + 1 {
                        self.begin(r, &mut open, parent, depth + 1)?;
                    } else {
                        // A frame below MAX_DEPTH + 1 is not read (its parent, at MAX_DEPTH + 1,
                        // only gives its time to the one above).
                        r.skip_value()?;
                    }
                } else {
                    r.end_array()?;
                    *in_children = false;
                }
                continue;
            }
            if !r.has_next()? {
                r.end_object()?;
                let Some((done, _)) = open.pop() else { break };
                self.finish(done);
                continue;
            }
            let field = match r.next_name()? {
                "function" => Field::Function,
                "file_path_short" => Field::Short,
                "file_path" => Field::Path,
                "line_no" => Field::Line,
                "time" => Field::Time,
                "children" => Field::Children,
                _ => Field::Other,
            };
            let nullable = |r: &mut J| -> Result<bool, PyinstrumentError> {
                Ok(if r.peek()? == ValueType::Null {
                    r.next_null()?;
                    true
                } else {
                    false
                })
            };
            match field {
                Field::Function => top.function = Some(r.next_string()?),
                Field::Short => top.short = if nullable(r)? { None } else { Some(r.next_string()?) },
                Field::Path => top.path = if nullable(r)? { None } else { Some(r.next_string()?) },
                Field::Line => top.line = if nullable(r)? { None } else { Some(number(r)?) },
                Field::Time => {
                    let t: f64 = number(r)?;
                    let node = top.node as usize;
                    self.nodes[node].time = t;
                }
                Field::Children => {
                    r.begin_array()?;
                    if let Some(top) = open.last_mut() {
                        top.1 = true;
                    }
                }
                Field::Other => r.skip_value()?,
            }
        }
        Ok(())
    }

    fn begin<J: struson::reader::JsonReader>(
        &mut self,
        r: &mut J,
        open: &mut Vec<(Open, bool)>,
        parent: u32,
        depth: usize,
    ) -> Result<(), PyinstrumentError> {
        if self.nodes.len() >= MAX_FRAMES {
            return Err(PyinstrumentError::TooManyFrames);
        }
        r.begin_object()?;
        let node = u32::try_from(self.nodes.len()).map_err(|_| PyinstrumentError::TooManyFrames)?;
        self.nodes.push(Node {
            parent,
            depth: u16::try_from(depth).unwrap_or(u16::MAX),
            key: NO_KEY,
            time: 0.0,
        });
        open.push((Open { node, ..Open::default() }, false));
        Ok(())
    }

    fn finish(&mut self, f: Open) {
        let file = f.short.or(f.path).unwrap_or_default();
        let key = (f.function.unwrap_or_default(), file, f.line);
        let next = u32::try_from(self.keys.len()).unwrap_or(NO_KEY);
        let id = *self.index.entry(key.clone()).or_insert_with(|| next);
        if id == next {
            self.keys.push(key);
        }
        self.nodes[f.node as usize].key = id;
    }

    /// Totals and self times per key, in one pass over the frames in document order.
    fn aggregate(self) -> Vec<PyFunction> {
        let n = self.nodes.len();
        let mut children = vec![0.0f64; n];
        for node in &self.nodes {
            if node.parent != NO_PARENT {
                children[node.parent as usize] += node.time;
            }
        }
        let mut acc = vec![(0.0f64, 0.0f64); self.keys.len()];
        // The frames from the root to the current one, and how often each key is on it.
        let mut path: Vec<u32> = Vec::new();
        let mut on_path: HashMap<u32, u32> = HashMap::new();
        for (i, node) in self.nodes.iter().enumerate() {
            while let Some(&top) = path.last() {
                if node.parent != NO_PARENT && top == node.parent {
                    break;
                }
                path.pop();
                let k = self.nodes[top as usize].key;
                if let Some(c) = on_path.get_mut(&k) {
                    *c -= 1;
                }
            }
            if usize::from(node.depth) > MAX_DEPTH {
                continue;
            }
            let Some(a) = acc.get_mut(node.key as usize) else { continue };
            if on_path.get(&node.key).copied().unwrap_or(0) == 0 {
                a.0 += node.time;
            }
            a.1 += (node.time - children[i]).max(0.0);
            path.push(u32::try_from(i).unwrap_or(NO_PARENT));
            *on_path.entry(node.key).or_insert(0) += 1;
        }
        let mut out: Vec<PyFunction> = self
            .keys
            .into_iter()
            .zip(acc)
            .map(|((name, file, line), (total, selft))| PyFunction {
                name: crate::reading::shown(&name).into_owned(),
                file: crate::reading::shown(&file).into_owned(),
                line,
                calls: None,
                self_s: selft,
                total_s: total,
            })
            .collect();
        sort(&mut out);
        out
    }
}

fn number<T: std::str::FromStr, J: struson::reader::JsonReader>(r: &mut J) -> Result<T, PyinstrumentError> {
    r.next_number::<T>()?.map_err(|_| PyinstrumentError::Json("a number out of range".to_owned()))
}

impl From<struson::reader::ReaderError> for PyinstrumentError {
    /// The kind of problem and its line and column: never a name or a value from the file.
    fn from(e: struson::reader::ReaderError) -> Self {
        use struson::reader::ReaderError as E;
        let (what, at) = match &e {
            E::SyntaxError(s) => (format!("syntax error ({})", s.kind), Some(&s.location)),
            E::UnexpectedValueType { expected, actual, location } => {
                (format!("{actual} where {expected} belongs"), Some(location))
            }
            E::UnexpectedStructure { location, .. } => ("unexpected structure".to_owned(), Some(location)),
            E::MaxNestingDepthExceeded { max_nesting_depth, location } => {
                (format!("nested deeper than {max_nesting_depth}"), Some(location))
            }
            E::UnsupportedNumberValue { location, .. } => {
                ("a number out of range".to_owned(), Some(location))
            }
            E::IoError { error, location } => (format!("{}", error.kind()), Some(location)),
            _ => ("unreadable".to_owned(), None),
        };
        let at = at
            .and_then(|l| l.line_pos.as_ref())
            .map_or(String::new(), |p| format!(" at line {}, column {}", p.line + 1, p.column + 1));
        PyinstrumentError::Json(format!("{what}{at}"))
    }
}

// ---------------------------------------------------------------------------------------------
// Windows as a person names them, and functions merged over windows

/// Functions listed over all step windows.
pub const TOP_MERGED: usize = 30;
/// Distinct functions a merge keeps (the rest are counted as left out).
pub const MAX_MERGED: usize = 200_000;

/// What a folder name says, for grouping: its edges (`reading::parse_window`).
#[derive(Debug, Clone)]
pub struct Folder {
    pub node: String,
    pub profiler: PythonProfilerDir,
    pub edges: Option<(crate::reading::WindowEdge, crate::reading::WindowEdge)>,
    pub raw: String,
}

/// `cProfile` / `pyinstrument` as the tools spell themselves.
pub fn profiler_name(p: PythonProfilerDir) -> &'static str {
    p.tool_name()
}

/// One boundary in words: `step 240 start`, `step 240 forward pass end`, `init`, `close`,
/// `exit`.
fn edge_words(e: &crate::reading::WindowEdge, is_start: bool) -> String {
    let phase = match &e.phase {
        EdgePhase::StepStart => "start",
        EdgePhase::ForwardPassEnd => "forward pass end",
        EdgePhase::StepEnd => "end",
        other @ (EdgePhase::Start | EdgePhase::End | EdgePhase::Other(_)) => other.as_str(),
    };
    match (&e.mode, e.step) {
        (EdgeMode::PreStepZero, _) if e.phase == EdgePhase::Start => "init".to_owned(),
        (EdgeMode::PreStepZero, _) => "close".to_owned(),
        (EdgeMode::PostHookClose, _) => if is_start { "close" } else { "exit" }.to_owned(),
        (EdgeMode::Trainer(mode), Some(step)) => format!("{mode} step {step} {phase}"),
        (EdgeMode::Trainer(mode), None) => format!("{mode} {phase}"),
    }
}

/// A folder's part of its window: `train step 240 start → train step 240 forward pass end`.
pub fn part(f: &Folder) -> String {
    match &f.edges {
        Some((a, b)) => format!("{} → {}", edge_words(a, true), edge_words(b, false)),
        None => f.raw.clone(),
    }
}

/// The folders grouped into windows: per node and profiler, in time order, a folder that
/// starts where the previous one ended (same mode, step and phase) continues its window.
/// Returns the groups (indices into `folders`, in time order) and each group's
/// [`PythonGroup`] without functions.
pub fn group(folders: &[Folder]) -> Vec<(Vec<usize>, PythonGroup)> {
    let mut order: Vec<usize> = (0..folders.len()).collect();
    let start = |i: usize| folders[i].edges.as_ref().map_or(f64::INFINITY, |e| e.0.time_us);
    order.sort_by(|&a, &b| {
        (&folders[a].node, &folders[a].profiler)
            .cmp(&(&folders[b].node, &folders[b].profiler))
            .then(start(a).total_cmp(&start(b)))
            .then(folders[a].raw.cmp(&folders[b].raw))
    });
    let mut out: Vec<(Vec<usize>, PythonGroup)> = Vec::new();
    let mut last: Option<usize> = None;
    for i in order {
        let f = &folders[i];
        let continues = last.is_some_and(|l| {
            let p = &folders[l];
            p.node == f.node
                && p.profiler == f.profiler
                && match (&p.edges, &f.edges) {
                    (Some((_, pe)), Some((fs, _))) => {
                        fs.mode != EdgeMode::PreStepZero
                            && fs.step.is_some()
                            && (&pe.mode, pe.step, &pe.phase) == (&fs.mode, fs.step, &fs.phase)
                    }
                    _ => false,
                }
        });
        if !continues {
            out.push((Vec::new(), PythonGroup::default()));
        }
        if let Some(g) = out.last_mut() {
            g.0.push(i);
        }
        last = Some(i);
    }
    for (ix, g) in &mut out {
        let first = &folders[ix[0]];
        let prof = profiler_name(first.profiler);
        g.node = first.node.clone();
        g.profiler = first.profiler;
        g.folders = ix.len() as u64;
        g.start_s =
            ix.iter().filter_map(|&i| folders[i].edges.as_ref()).map(|e| e.0.time_us / 1e6).reduce(f64::min);
        g.end_s =
            ix.iter().filter_map(|&i| folders[i].edges.as_ref()).map(|e| e.1.time_us / 1e6).reduce(f64::max);
        let Some((a, _)) = &first.edges else {
            g.kind = PythonGroupKind::Other;
            g.label = format!("{} · {prof}", first.raw);
            continue;
        };
        if a.mode == EdgeMode::PreStepZero {
            let before = a.phase == EdgePhase::Start;
            g.kind = if before { PythonGroupKind::BeforeFirstStep } else { PythonGroupKind::AfterClose };
            g.label = format!("{} · {prof}", if before { "before the first step" } else { "after close" });
            continue;
        }
        let steps: Vec<i64> = ix.iter().filter_map(|&i| folders[i].edges.as_ref()?.0.step).collect();
        g.kind = PythonGroupKind::Steps;
        g.mode = Some(a.mode.as_str().to_owned());
        g.first_step = steps.iter().copied().min();
        g.last_step = steps.iter().copied().max();
        g.label = match (g.first_step, g.last_step) {
            (Some(x), Some(y)) if x == y => format!("{} step {x} · {prof}", a.mode.as_str()),
            (Some(x), Some(y)) => format!("{} steps {x}–{y} · {prof}", a.mode.as_str()),
            _ => format!("{} · {prof}", a.mode.as_str()),
        };
    }
    out
}

/// Functions summed over folders, keyed by (function, file, line).
#[derive(Debug, Default)]
pub struct Merge {
    index: HashMap<Key, usize>,
    rows: Vec<PyFunctionTotal>,
    pub folders: u64,
    pub left_out: u64,
}

impl Merge {
    /// Adds one folder's functions.
    pub fn add(&mut self, functions: &[PyFunction]) {
        self.folders += 1;
        for f in functions {
            let key = (f.name.clone(), f.file.clone(), f.line);
            let i = match self.index.get(&key) {
                Some(&i) => i,
                None if self.rows.len() >= MAX_MERGED => {
                    self.left_out += 1;
                    continue;
                }
                None => {
                    self.rows.push(PyFunctionTotal {
                        name: f.name.clone(),
                        file: f.file.clone(),
                        line: f.line,
                        calls: Some(0),
                        self_s: 0.0,
                        total_s: 0.0,
                        folders: 0,
                    });
                    self.index.insert(key, self.rows.len() - 1);
                    self.rows.len() - 1
                }
            };
            let r = &mut self.rows[i];
            r.calls = r.calls.zip(f.calls).map(|(a, b)| a.saturating_add(b));
            r.self_s += f.self_s;
            r.total_s += f.total_s;
            r.folders += 1;
        }
    }

    /// The first `n` by total time.
    pub fn top(mut self, n: usize) -> Vec<PyFunctionTotal> {
        self.rows.sort_by(|a, b| b.total_s.total_cmp(&a.total_s).then_with(|| a.name.cmp(&b.name)));
        self.rows.truncate(n);
        self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pyinstrument_self_and_total() {
        let j = br#"{"root_frame": {"function": "<module>", "file_path_short": "train.py", "line_no": 1, "time": 3.0,
            "children": [{"function": "step", "file_path_short": "train.py", "line_no": 5, "time": 2.0,
               "children": [{"function": "step", "file_path_short": "train.py", "line_no": 5, "time": 1.5, "children": []}]}]}}"#;
        let f = pyinstrument(j).unwrap();
        assert_eq!(f[0].name, "<module>");
        assert_eq!((f[0].total_s, f[0].self_s), (3.0, 1.0));
        let step = f.iter().find(|x| x.name == "step").unwrap();
        assert_eq!((step.total_s, step.self_s, step.calls), (2.0, 2.0, None));
        assert!(pyinstrument(br#"{"root_frame": null}"#).unwrap().is_empty());
    }

    /// A chain of `depth` + 1 frames of one recursive function, each with every key
    /// pyinstrument writes, the root's time `depth` + 1 and each child's one less.
    fn chain(depth: usize, name: impl Fn(usize) -> String) -> String {
        let mut s = String::from(r#"{"start_time": 1795400000.5, "duration": 9.0, "root_frame": "#);
        for i in 0..=depth {
            s += &format!(
                r#"{{"function": "{}", "file_path_short": "train.py", "file_path": "/w/train.py", "line_no": 7, "time": {}, "await_stack": [], "is_application_code": true, "group_id": null, "class_name": null, "children": ["#,
                name(i),
                depth + 1 - i
            );
        }
        for _ in 0..=depth {
            s += "]}";
        }
        s + "}"
    }

    #[test]
    fn deep_windows_are_read_to_the_depth_limit() {
        // 100 frames: beyond serde_json's 128 nesting levels (two a frame), which read as 0
        // functions; distinct functions: each frame's self time is 1.
        let f = pyinstrument(chain(99, |i| format!("f{i}")).as_bytes()).unwrap();
        assert_eq!(f.len(), TOP);
        assert_eq!((f[0].name.as_str(), f[0].total_s, f[0].self_s), ("f0", 100.0, 1.0));
        // 600 frames of one recursive function: counted to depth MAX_DEPTH (513 frames of
        // self time 1), its total once.
        let f = pyinstrument(chain(599, |_| "rec".to_owned()).as_bytes()).unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].total_s, f[0].self_s), (600.0, (MAX_DEPTH + 1) as f64));
        assert_eq!((f[0].file.as_str(), f[0].line), ("train.py", Some(7)));
    }

    #[test]
    fn members_in_any_order() {
        let j = br#"{"root_frame": {"children": [{"children": [], "time": 1.0, "function": "g"}], "time": 3.0, "function": "f", "file_path": "/a.py"}}"#;
        let f = pyinstrument(j).unwrap();
        assert_eq!(
            (f[0].name.as_str(), f[0].file.as_str(), f[0].total_s, f[0].self_s),
            ("f", "/a.py", 3.0, 2.0)
        );
        assert_eq!((f[1].name.as_str(), f[1].total_s, f[1].self_s), ("g", 1.0, 1.0));
    }

    #[test]
    fn a_file_of_empty_children_stops_at_the_frame_budget() {
        // 64 MiB of `{}`: some 22 million frames, which took 2.7 GB as a tree of structs.
        let mut j = br#"{"root_frame": {"function": "r", "time": 1, "children": [{}"#.to_vec();
        while j.len() < 64 << 20 {
            j.extend_from_slice(b",{}");
        }
        j.extend_from_slice(b"]}}");
        let (r, cost) = pyinstrument_counted(&j);
        assert_eq!(r, Err(PyinstrumentError::TooManyFrames));
        assert_eq!(cost.frames, MAX_FRAMES);
        // Under the budget it is read, each frame counted once.
        let n = 1000;
        let mut j = br#"{"root_frame": {"function": "r", "time": 1, "children": [{}"#.to_vec();
        for _ in 1..n {
            j.extend_from_slice(b",{}");
        }
        j.extend_from_slice(b"]}}");
        let (r, cost) = pyinstrument_counted(&j);
        assert_eq!(r.unwrap().len(), 2);
        assert_eq!(cost.frames, n + 1);
    }

    #[test]
    fn nesting_is_bounded_without_recursion() {
        // Nested far below the depth limit but within MAX_NESTING: read, the deep part skipped
        // (iteratively: no stack overflow).
        let levels = 30_000;
        let mut j = br#"{"root_frame": {"function": "r", "time": 1, "children": "#.to_vec();
        j.extend(std::iter::repeat_n(&b"[{\"children\": "[..], levels).flatten());
        j.extend_from_slice(b"[]");
        j.extend(std::iter::repeat_n(&b"}]"[..], levels).flatten());
        j.extend_from_slice(b"}}");
        let (r, cost) = pyinstrument_counted(&j);
        assert_eq!(r.unwrap().len(), 2);
        assert_eq!(cost.frames, MAX_DEPTH + 2);
        // Beyond MAX_NESTING: an error that says where, not a crash.
        let mut j = br#"{"root_frame": {"children": "#.to_vec();
        j.extend(std::iter::repeat_n(b'[', (MAX_NESTING as usize) + 10));
        let e = pyinstrument(&j).unwrap_err().to_string();
        assert!(e.contains("nested deeper than 65536 at line 1"), "{e}");
    }

    #[test]
    fn errors_never_quote_the_file() {
        for j in [
            &br#"{"root_frame": {"function": "f", "time": "SECRET"}}"#[..],
            br#"{"root_frame": {"function": "f", "time": 1e999}} SECRET"#,
            br#"{"root_frame": {"function": "f", "time": 1}} SECRET"#,
            br#"{"SECRET": 1, "root_frame": {"function": SECRET}}"#,
            br#""SECRET""#,
        ] {
            let e = pyinstrument(j).unwrap_err().to_string();
            assert!(!e.contains("SECRET") && e.starts_with("not pyinstrument JSON: "), "{e}");
        }
    }

    fn folders(names: &[&str]) -> Vec<Folder> {
        names
            .iter()
            .map(|n| Folder {
                node: "0-algo-1".into(),
                profiler: PythonProfilerDir::CProfile,
                edges: crate::reading::parse_window(n),
                raw: (*n).to_owned(),
            })
            .collect()
    }

    #[test]
    fn folders_group_into_windows_named_by_mode_steps_and_profiler() {
        // docs/formats.md's example (StartStep 2, NumSteps 2), shuffled, with a triggered
        // window of one step later (steps 7) and a window running at close.
        let f = folders(&[
            "train-3-stepstart-1795316597985757.2_train-3-forwardpassend-1795316597985851.0",
            "prestepzero-*-start-1795316597979670.5_train-0-stepstart-1795316597979794.8",
            "train-2-stepstart-1795316597980690.5_train-2-forwardpassend-1795316597980765.2",
            "train-2-forwardpassend-1795316597981179.0_train-3-stepstart-1795316597981250.5",
            "train-3-forwardpassend-1795316597986493.0_train-4-stepstart-1795316597986566.5",
            "train-7-stepstart-1795316597990000.0_train-7-forwardpassend-1795316597990100.0",
            "train-7-forwardpassend-1795316597990200.0_posthookclose-*-end-1795316597990300.0",
            "prestepzero-*-end-1795316597990400.8_posthookclose-*-end-1795316597990500.8",
        ]);
        let g = group(&f);
        let labels: Vec<(&str, PythonGroupKind, u64)> =
            g.iter().map(|(_, g)| (g.label.as_str(), g.kind, g.folders)).collect();
        assert_eq!(
            labels,
            [
                ("before the first step · cProfile", PythonGroupKind::BeforeFirstStep, 1),
                ("train steps 2–3 · cProfile", PythonGroupKind::Steps, 4),
                ("train step 7 · cProfile", PythonGroupKind::Steps, 2),
                ("after close · cProfile", PythonGroupKind::AfterClose, 1),
            ]
        );
        let (ix, steps) = &g[1];
        assert_eq!(
            (steps.first_step, steps.last_step, steps.mode.as_deref()),
            (Some(2), Some(3), Some("train"))
        );
        assert_eq!(part(&f[ix[0]]), "train step 2 start → train step 2 forward pass end");
        assert_eq!(part(&f[ix[1]]), "train step 2 forward pass end → train step 3 start");
        assert_eq!(part(&f[1]), "init → train step 0 start");
        assert_eq!(part(&f[6]), "train step 7 forward pass end → exit");
        assert_eq!(part(&f[7]), "close → exit");
        // Another node or profiler is another window, even at the same steps.
        let mut two =
            folders(&["train-2-stepstart-1795316597980690.5_train-2-forwardpassend-1795316597980765.2"; 2]);
        two[1].profiler = PythonProfilerDir::Pyinstrument;
        let g = group(&two);
        assert_eq!(g[1].1.label, "train step 2 · pyinstrument");
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn a_merge_sums_over_folders_and_keeps_calls_only_when_every_folder_counts_them() {
        let f = |name: &str, calls: Option<u64>, s: f64, t: f64| PyFunction {
            name: name.into(),
            file: "train.py".into(),
            line: Some(1),
            calls,
            self_s: s,
            total_s: t,
        };
        let mut m = Merge::default();
        m.add(&[f("step", Some(2), 0.5, 1.0), f("load", Some(1), 0.1, 0.1)]);
        m.add(&[f("step", Some(3), 0.25, 2.0)]);
        m.add(&[f("load", None, 0.2, 0.2)]);
        assert_eq!(m.folders, 3);
        let top = m.top(10);
        assert_eq!(
            (top[0].name.as_str(), top[0].calls, top[0].self_s, top[0].total_s, top[0].folders),
            ("step", Some(5), 0.75, 3.0, 2)
        );
        assert_eq!((top[1].name.as_str(), top[1].calls, top[1].folders), ("load", None, 2));
    }
}
