//! What the hook cost its trainer (docs/formats.md, "The hook's own cost"): per rank, the
//! time the trainer's threads spent inside trainprof, per kind of entry, written once when
//! the hook shuts down as `framework/cost/<node id>/<µs>.json`, and read back, bounded, by the
//! report. The parts are a closed set ([`Part`]): a record's words are checked against it.
//!
//! Two layers are timed, each on the monotonic clock around the work: the C ABI's entries
//! (inside the library: every caller's, the Python package's included) and the Python
//! package's entry points (around the whole call: its own Python work, the ctypes crossing
//! and the C call it makes). A Python part therefore holds the C part it calls; the hook's
//! time is [`HookCost::total_s`] (the Python layer's when it drove the hook, else the C
//! ABI's), never the sum of both layers.

use serde::{Deserialize, Serialize};

/// The folder under the LocalPath that holds one folder per rank (node id).
pub const FOLDER: &str = "framework/cost";

/// The most bytes of one record the report reads.
pub const MAX_BYTES: u64 = 16 * 1024;

/// The most parts a record may hold (the closed set has fewer).
pub const MAX_PARTS: usize = 64;

/// Where a part is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// Inside the library, around an export's work.
    Abi,
    /// The Python package, around its entry point (the C call it makes included).
    Python,
    /// A window's open or close (the Python package's, around the profiler's start or stop).
    Window,
}

/// One kind of entry into the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// `trainprof_step_begin`, `trainprof_step_end`, `trainprof_step_next`.
    AbiStep,
    /// `trainprof_record`.
    AbiRecord,
    /// `trainprof_window_active`.
    AbiActive,
    /// `trainprof_python_boundary`.
    AbiBoundary,
    /// `trainprof_register_name`.
    AbiName,
    /// The Python package's step calls (`Profiler.step_begin`, `step_end`, the adapters'
    /// combined step start).
    PythonStep,
    /// `Profiler.record`, `record_event`.
    PythonRecord,
    /// `Profiler.active`.
    PythonActive,
    /// A detailed (PyTorch profiler) window's start, and its stop with the trace's hand-over.
    DetailedOpen,
    DetailedClose,
    /// A Python-profiling (cProfile, pyinstrument) window's start, and its stop with the
    /// stats' dump.
    PythonWindowOpen,
    PythonWindowClose,
}

impl Part {
    pub const ALL: [Part; 12] = [
        Part::AbiStep,
        Part::AbiRecord,
        Part::AbiActive,
        Part::AbiBoundary,
        Part::AbiName,
        Part::PythonStep,
        Part::PythonRecord,
        Part::PythonActive,
        Part::DetailedOpen,
        Part::DetailedClose,
        Part::PythonWindowOpen,
        Part::PythonWindowClose,
    ];

    /// Its word: the record's `Part`, and `trainprof_cost_add`'s `part`.
    pub fn as_str(self) -> &'static str {
        match self {
            Part::AbiStep => "abi.step",
            Part::AbiRecord => "abi.record",
            Part::AbiActive => "abi.active",
            Part::AbiBoundary => "abi.boundary",
            Part::AbiName => "abi.name",
            Part::PythonStep => "python.step",
            Part::PythonRecord => "python.record",
            Part::PythonActive => "python.active",
            Part::DetailedOpen => "window.detailed.open",
            Part::DetailedClose => "window.detailed.close",
            Part::PythonWindowOpen => "window.python.open",
            Part::PythonWindowClose => "window.python.close",
        }
    }

    /// The part of a word, or `None`.
    pub fn parse(word: &str) -> Option<Part> {
        Part::ALL.into_iter().find(|p| p.as_str() == word)
    }

    /// Its index in [`Part::ALL`].
    pub fn slot(self) -> usize {
        self as usize
    }

    pub fn layer(self) -> Layer {
        match self {
            Part::AbiStep | Part::AbiRecord | Part::AbiActive | Part::AbiBoundary | Part::AbiName => {
                Layer::Abi
            }
            Part::PythonStep | Part::PythonRecord | Part::PythonActive => Layer::Python,
            _ => Layer::Window,
        }
    }

    /// The window kind (`detailed`, `python`) of an open or close part.
    pub fn window(self) -> Option<&'static str> {
        match self {
            Part::DetailedOpen | Part::DetailedClose => Some("detailed"),
            Part::PythonWindowOpen | Part::PythonWindowClose => Some("python"),
            _ => None,
        }
    }

    /// The Python package's parts, which it hands to the library (`trainprof_cost_add`).
    pub fn from_python(self) -> bool {
        self.layer() != Layer::Abi
    }
}

/// One record: one rank's hook, from `trainprof_init` to its shutdown.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookCost {
    /// The rank's node id (`<rank>-<host>`, docs/formats.md, "Node id").
    #[serde(rename = "NodeId")]
    pub node: String,
    /// When it was written, epoch seconds.
    #[serde(rename = "Timestamp")]
    pub timestamp: f64,
    /// From `trainprof_init` to the record, seconds.
    #[serde(rename = "WallSeconds")]
    pub wall_s: f64,
    /// Steps begun (every mode).
    #[serde(rename = "Steps")]
    pub steps: u64,
    /// Events written, and lost for any reason (`trainprof_stats`).
    #[serde(rename = "EventsWritten")]
    pub events_written: u64,
    #[serde(rename = "EventsDropped")]
    pub events_dropped: u64,
    /// Bytes of the timeline files the hook sealed.
    #[serde(rename = "BytesWritten")]
    pub bytes_written: u64,
    /// Every part with calls, in [`Part::ALL`]'s order.
    #[serde(rename = "Parts")]
    pub parts: Vec<PartCost>,
}

/// One part's time and calls (windows: one call per open or close).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartCost {
    /// Its word ([`Part::as_str`]).
    #[serde(rename = "Part")]
    pub part: String,
    #[serde(rename = "Calls")]
    pub calls: u64,
    /// Monotonic-clock seconds inside the part, every call together.
    #[serde(rename = "Seconds")]
    pub seconds: f64,
}

impl HookCost {
    /// A part by its word.
    pub fn part(&self, part: Part) -> Option<&PartCost> {
        self.parts.iter().find(|p| p.part == part.as_str())
    }

    fn layer_s(&self, layer: Layer) -> (u64, f64) {
        self.parts
            .iter()
            .filter(|p| Part::parse(&p.part).is_some_and(|q| q.layer() == layer))
            .fold((0, 0.0), |(c, s), p| (c + p.calls, s + p.seconds))
    }

    /// The hook's time outside windows, seconds: the Python layer's when the Python package
    /// drove the hook (its parts hold the C calls they make), else the C ABI's.
    pub fn total_s(&self) -> f64 {
        let (calls, s) = self.layer_s(Layer::Python);
        if calls > 0 { s } else { self.layer_s(Layer::Abi).1 }
    }

    /// The windows of `kind`: (opens, closes, seconds of both).
    pub fn window(&self, kind: &str) -> (u64, u64, f64) {
        let mut out = (0, 0, 0.0);
        for p in &self.parts {
            let Some(q) = Part::parse(&p.part) else { continue };
            if q.window() != Some(kind) {
                continue;
            }
            if matches!(q, Part::DetailedOpen | Part::PythonWindowOpen) {
                out.0 += p.calls;
            } else {
                out.1 += p.calls;
            }
            out.2 += p.seconds;
        }
        out
    }
}

/// The file name of a record written at `us` (epoch microseconds).
pub fn file_name(us: u64) -> String {
    format!("{us}.json")
}

/// `record` as written: one JSON object and a newline.
pub fn to_bytes(record: &HookCost) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(record).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    TooLarge,
    Json(String),
    TooManyParts,
    UnknownPart(String),
    DuplicatePart(&'static str),
    BadTime,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::TooLarge => write!(f, "larger than {MAX_BYTES} bytes"),
            ParseError::Json(e) => write!(f, "not a hook cost record: {e}"),
            ParseError::TooManyParts => write!(f, "more than {MAX_PARTS} parts"),
            ParseError::UnknownPart(w) => write!(f, "unknown part {w:?}"),
            ParseError::DuplicatePart(w) => write!(f, "part {w} twice"),
            ParseError::BadTime => write!(f, "a time that is negative or not finite"),
        }
    }
}

impl std::error::Error for ParseError {}

/// A record as read back (at most [`MAX_BYTES`]): every part a known word, once; every time
/// finite and not negative.
pub fn parse(bytes: &[u8]) -> Result<HookCost, ParseError> {
    if bytes.len() as u64 > MAX_BYTES {
        return Err(ParseError::TooLarge);
    }
    let r: HookCost = serde_json::from_slice(bytes).map_err(|e| ParseError::Json(e.to_string()))?;
    if r.parts.len() > MAX_PARTS {
        return Err(ParseError::TooManyParts);
    }
    let mut seen = [false; Part::ALL.len()];
    for p in &r.parts {
        let q =
            Part::parse(&p.part).ok_or_else(|| ParseError::UnknownPart(p.part.chars().take(64).collect()))?;
        if std::mem::replace(&mut seen[q.slot()], true) {
            return Err(ParseError::DuplicatePart(q.as_str()));
        }
        if !(p.seconds.is_finite() && p.seconds >= 0.0) {
            return Err(ParseError::BadTime);
        }
    }
    let ok = |v: f64| v.is_finite() && v >= 0.0;
    if !ok(r.timestamp) || !ok(r.wall_s) {
        return Err(ParseError::BadTime);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_distinct_and_parse_back() {
        for (i, p) in Part::ALL.into_iter().enumerate() {
            assert_eq!(p.slot(), i);
            assert_eq!(Part::parse(p.as_str()), Some(p));
        }
        let mut words: Vec<_> = Part::ALL.iter().map(|p| p.as_str()).collect();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), Part::ALL.len());
    }

    fn record() -> HookCost {
        HookCost {
            node: "0-algo-1".into(),
            timestamp: 1.5,
            wall_s: 10.0,
            steps: 100,
            parts: vec![
                PartCost { part: "abi.step".into(), calls: 200, seconds: 0.0001 },
                PartCost { part: "python.step".into(), calls: 200, seconds: 0.0004 },
                PartCost { part: "window.detailed.open".into(), calls: 1, seconds: 0.2 },
                PartCost { part: "window.detailed.close".into(), calls: 1, seconds: 0.3 },
            ],
            ..HookCost::default()
        }
    }

    #[test]
    fn a_record_is_written_and_read_back() {
        let r = record();
        let back = parse(&to_bytes(&r)).unwrap();
        assert_eq!(back, r);
        // The Python layer holds the C calls it makes: not added to them.
        assert!((back.total_s() - 0.0004).abs() < 1e-12);
        let (o, c, s) = back.window("detailed");
        assert_eq!((o, c), (1, 1));
        assert!((s - 0.5).abs() < 1e-12);
        let mut c_only = r.clone();
        c_only.parts.retain(|p| p.part.starts_with("abi."));
        assert!((c_only.total_s() - 0.0001).abs() < 1e-12);
    }

    #[test]
    fn hostile_records_are_refused() {
        let mut r = record();
        r.parts[0].part = "abi.nope".into();
        assert!(matches!(parse(&to_bytes(&r)), Err(ParseError::UnknownPart(_))));
        let mut r = record();
        r.parts[1].part = "abi.step".into();
        assert_eq!(parse(&to_bytes(&r)), Err(ParseError::DuplicatePart("abi.step")));
        let bytes = to_bytes(&record());
        let neg = String::from_utf8(bytes).unwrap().replace("0.0001", "-1");
        assert_eq!(parse(neg.as_bytes()), Err(ParseError::BadTime));
        let big = vec![b' '; MAX_BYTES as usize + 1];
        assert_eq!(parse(&big), Err(ParseError::TooLarge));
        assert!(matches!(parse(br#"{"NodeId":"x","Extra":1}"#), Err(ParseError::Json(_))));
        assert!(matches!(parse(br#"{"NodeId":"x","Steps":-1}"#), Err(ParseError::Json(_))));
    }
}
