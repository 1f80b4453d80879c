//! On-demand windows (`trainprof trigger`, `docs/formats.md`, "On-demand windows
//! (`trainprof trigger`)"): the request folder under LocalPath, its file names, the request,
//! the go-ahead, the ranks' answers and presence files, their strict bounded parsers, and
//! the choice of the step every rank starts on. `trainprof trigger`
//! (`agent/src/commands/trigger/mod.rs`) writes requests and go-aheads; the hook's writer thread
//! (`hook-ffi/src/request/`) reads them and answers.
//!
//! Everything in the folder may be planted by anyone who can write there (the folder is
//! mode 0700, so only the trainer's user and root), so every reader here is strict: a file
//! larger than its bound is never read, unknown keys, wrong types and wrong versions are
//! refusals, and a refusal names what was wrong, never the content.

use serde::{Deserialize, Serialize};

/// The request folder, relative to LocalPath.
pub const REQUEST_DIR: &str = "trigger";

/// The `version` of every file in the folder.
pub const FORMAT_VERSION: u64 = 1;

/// Largest request, answer or presence file read.
pub const MAX_FILE_BYTES: u64 = 4096;
/// Largest go-ahead read (it lists the ranks that acknowledged).
pub const MAX_GO_BYTES: u64 = 64 << 10;
/// Longest request id (`[A-Za-z0-9_]`).
pub const MAX_ID_LEN: usize = 32;
/// Most steps a requested window spans.
pub const MAX_STEPS: u64 = 10_000;
/// Largest `roundup`.
pub const MAX_ROUNDUP: u64 = 1_000_000;
/// Longest a request lives (`expires_us - requested_us`): an hour.
pub const MAX_LIFETIME_US: i64 = 3_600_000_000;
/// Steps past the furthest rank's acknowledged step before the window may start.
pub const MARGIN_STEPS: u64 = 2;
/// Seconds the go-ahead is given to reach every rank and be taken at a step boundary: a
/// rank that steps `r` times a second moves about `r × REACH_S` steps meanwhile, and the
/// start is placed past that too.
pub const REACH_S: f64 = 3.0;
/// Ranks listed in one go-ahead.
pub const MAX_RANKS: usize = 1024;

words! {
    /// The prefixes of the folder's file names (all end in `.json`).
    PREFIXES;
    /// `request-<id>.json`: written by `trainprof trigger`.
    REQUEST_PREFIX = "request-",
    /// `go-<id>.json`: the step every acknowledging rank starts on.
    GO_PREFIX = "go-",
    /// `ack-<id>-<rank>.json`: a rank's first answer (its step, or a refusal).
    ACK_PREFIX = "ack-",
    /// `armed-<id>-<rank>.json`: a rank's second answer (armed, missed or refused).
    ARMED_PREFIX = "armed-",
    /// `rank-<rank>.json`: a running hook's presence, removed at its exit.
    PRESENCE_PREFIX = "rank-",
    /// `stacks-<id>-<rank>.json`: a rank's answer to `stacks` (dumped, or refused).
    STACKS_PREFIX = "stacks-",
}

/// The suffix of every file name in the folder.
pub const JSON_SUFFIX: &str = ".json";

/// The features a request may name (the windows' names, as in `AutoProfilingConfig`'s
/// `Features`).
pub const FEATURES: [&str; 5] = ["detailed", "dataloader", "python", "native", "memory"];

/// `<node>-<pid>`: a rank's key in file names and go-aheads.
pub fn rank_key(node: &str, pid: u32) -> String {
    format!("{node}-{pid}")
}

pub fn request_name(id: &str) -> String {
    format!("{REQUEST_PREFIX}{id}{JSON_SUFFIX}")
}

pub fn go_name(id: &str) -> String {
    format!("{GO_PREFIX}{id}{JSON_SUFFIX}")
}

pub fn ack_name(id: &str, rank: &str) -> String {
    format!("{ACK_PREFIX}{id}-{rank}{JSON_SUFFIX}")
}

pub fn armed_name(id: &str, rank: &str) -> String {
    format!("{ARMED_PREFIX}{id}-{rank}{JSON_SUFFIX}")
}

pub fn stacks_name(id: &str, rank: &str) -> String {
    format!("{STACKS_PREFIX}{id}-{rank}{JSON_SUFFIX}")
}

pub fn presence_name(rank: &str) -> String {
    format!("{PRESENCE_PREFIX}{rank}{JSON_SUFFIX}")
}

/// The id of `request-<id>.json`, when `name` is one with a valid id.
pub fn parse_request_name(name: &str) -> Option<&str> {
    let id = name.strip_prefix(REQUEST_PREFIX)?.strip_suffix(JSON_SUFFIX)?;
    valid_id(id).then_some(id)
}

/// Whether `name` is an answer (`ack-…` or `armed-…`) to request `id`.
pub fn is_answer_to(name: &str, id: &str) -> bool {
    [ACK_PREFIX, ARMED_PREFIX, STACKS_PREFIX].iter().any(|p| {
        name.strip_prefix(p)
            .and_then(|r| r.strip_prefix(id))
            .is_some_and(|r| r.starts_with('-') && r.ends_with(JSON_SUFFIX))
    })
}

/// An id: 1 to [`MAX_ID_LEN`] characters of `[A-Za-z0-9_]` (no `-`, so that the names
/// built from it split unambiguously).
pub fn valid_id(id: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `request-<id>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub version: u64,
    pub id: String,
    /// Names from [`FEATURES`], each at most once; may be empty only with `stacks`.
    pub features: Vec<String>,
    /// Ask for a stack dump now (kind `requested`).
    pub stacks: bool,
    /// The window's length in steps, 1..=[`MAX_STEPS`].
    pub steps: u64,
    /// The start is a multiple of this, 1..=[`MAX_ROUNDUP`].
    pub roundup: u64,
    /// When it was written and when it stops counting (µs since the epoch).
    pub requested_us: i64,
    pub expires_us: i64,
}

/// `go-<id>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Go {
    pub version: u64,
    pub id: String,
    /// The first step of the window (windows' numbering); it spans the request's `steps`.
    pub start: u64,
    /// The ranks ([`rank_key`]) that acknowledged: only they arm.
    pub ranks: Vec<String>,
}

/// What a rank answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnswerKind {
    /// First phase: the request reached the trainer's loop at `step`.
    Ack,
    /// Second phase: the window is armed for `start..end`.
    Armed,
    /// Second phase: the rank was already at or past `start` (`step`).
    Missed,
    /// Profiling is off in that process now.
    Disabled,
    /// The request (or go-ahead) is refused; `reason` says why, nothing changed.
    Refused,
    /// `stacks`: the dump was written (`files` names its folder).
    Dumped,
}

impl AnswerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AnswerKind::Ack => "ack",
            AnswerKind::Armed => "armed",
            AnswerKind::Missed => "missed",
            AnswerKind::Disabled => "disabled",
            AnswerKind::Refused => "refused",
            AnswerKind::Dumped => "dumped",
        }
    }
}

/// `ack-<id>-<rank>.json` and `armed-<id>-<rank>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    pub version: u64,
    /// The request's id; absent when the request could not be read as one (the id is then
    /// in the file name only).
    pub id: String,
    pub node: String,
    pub pid: u32,
    pub answer: AnswerKind,
    /// The rank's step (windows' numbering) when the answer was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Its recent pace, steps a second (an ack), for the start's margin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_per_s: Option<f64>,
    /// When `step` was taken (µs since the epoch; an ack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_us: Option<i64>,
    /// The window armed: steps `start..end`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
    /// Where the window's files go (paths under LocalPath).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `rank-<rank>.json`: a running hook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Presence {
    pub version: u64,
    pub node: String,
    pub pid: u32,
    pub started_us: i64,
}

/// `bytes` as a `T`, or why not: what kind of problem, never the content. Read as a JSON
/// object first (so an array is never taken for a struct's fields in order, and nesting is
/// bounded by `serde_json`'s 128 levels), then as `T`.
/// Why a file of the request folder was refused: the reason, as the rank's answer and
/// `trainprof trigger` say it (docs/formats.md, "On-demand windows (`trainprof trigger`)").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

pub(crate) fn strict<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    max: u64,
    what: &str,
) -> Result<T, Refused> {
    if bytes.len() as u64 > max {
        return Err(Refused(format!("{what}: larger than {max} bytes")));
    }
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        let why = match e.classify() {
            serde_json::error::Category::Eof => "the JSON ends early",
            _ if e.to_string().starts_with("recursion limit exceeded") => "nested too deep",
            _ => "not JSON",
        };
        Refused(format!("{what}: {why}"))
    })?;
    if !v.is_object() {
        return Err(Refused(format!("{what}: not the format (not an object)")));
    }
    serde_json::from_value(v).map_err(|e| {
        // serde's message names the key or the type expected (and a wrong value, bounded and
        // escaped for a terminal).
        Refused(format!("{what}: not the format ({})", crate::text::printable(&e.to_string(), 120)))
    })
}

pub(crate) fn check_version(v: u64, what: &str) -> Result<(), Refused> {
    if v != FORMAT_VERSION {
        return Err(Refused(format!("{what}: version {v}, not {FORMAT_VERSION}")));
    }
    Ok(())
}

/// A request, checked: every key present and of its type, no other key, the version, a
/// valid id, known features each once (at least one, or `stacks`), `steps` and `roundup`
/// in range, a lifetime within [`MAX_LIFETIME_US`].
pub fn parse_request(bytes: &[u8]) -> Result<Request, Refused> {
    let what = "the request";
    let r: Request = strict(bytes, MAX_FILE_BYTES, what)?;
    check_version(r.version, what)?;
    if !valid_id(&r.id) {
        return Err(Refused(format!("{what}: the id is not 1 to {MAX_ID_LEN} of [A-Za-z0-9_]")));
    }
    for (i, f) in r.features.iter().enumerate() {
        if !FEATURES.contains(&f.as_str()) {
            return Err(Refused(format!("{what}: a feature is not one of {}", FEATURES.join(", "))));
        }
        if r.features[..i].contains(f) {
            return Err(Refused(format!("{what}: a feature is named twice")));
        }
    }
    if r.features.is_empty() && !r.stacks {
        return Err(Refused(format!("{what}: no feature and no stacks")));
    }
    if !(1..=MAX_STEPS).contains(&r.steps) {
        return Err(Refused(format!("{what}: steps is not in 1..={MAX_STEPS}")));
    }
    if !(1..=MAX_ROUNDUP).contains(&r.roundup) {
        return Err(Refused(format!("{what}: roundup is not in 1..={MAX_ROUNDUP}")));
    }
    let life = r.expires_us.checked_sub(r.requested_us);
    if !life.is_some_and(|l| (1..=MAX_LIFETIME_US).contains(&l)) {
        return Err(Refused(format!("{what}: expires_us is not after requested_us by at most an hour")));
    }
    Ok(r)
}

/// A go-ahead, checked: the version, a valid id, at most [`MAX_RANKS`] ranks.
pub fn parse_go(bytes: &[u8]) -> Result<Go, Refused> {
    let what = "the go-ahead";
    let g: Go = strict(bytes, MAX_GO_BYTES, what)?;
    check_version(g.version, what)?;
    if !valid_id(&g.id) {
        return Err(Refused(format!("{what}: the id is not valid")));
    }
    if g.ranks.len() > MAX_RANKS {
        return Err(Refused(format!("{what}: more than {MAX_RANKS} ranks")));
    }
    Ok(g)
}

/// An answer, checked (the trigger reads them): the version and a valid id.
pub fn parse_answer(bytes: &[u8]) -> Result<Answer, Refused> {
    let what = "the answer";
    let a: Answer = strict(bytes, MAX_FILE_BYTES, what)?;
    check_version(a.version, what)?;
    if !valid_id(&a.id) {
        return Err(Refused(format!("{what}: the id is not valid")));
    }
    Ok(a)
}

/// A presence file, checked.
pub fn parse_presence(bytes: &[u8]) -> Result<Presence, Refused> {
    let what = "the presence file";
    let p: Presence = strict(bytes, MAX_FILE_BYTES, what)?;
    check_version(p.version, what)?;
    Ok(p)
}

/// The ranks ([`rank_key`]) whose presence files are in the request folder `dir`: regular
/// files (never through a link) of at most [`MAX_FILE_BYTES`] that parse, named for the rank
/// they hold. Read by `trainprof trigger` and by the agent's S3 relay.
pub fn ranks_present(dir: &crate::fs::Dir) -> Vec<String> {
    let mut out = Vec::new();
    for e in dir.entries().unwrap_or_default() {
        let Ok(name) = e.name else { continue };
        if e.kind != crate::fs::Kind::File || !name.starts_with(PRESENCE_PREFIX) {
            continue;
        }
        let Ok(Some(bytes)) = dir.read(&name, MAX_FILE_BYTES) else { continue };
        if let Ok(p) = parse_presence(&bytes) {
            let key = rank_key(&p.node, p.pid);
            if name == presence_name(&key) && !out.contains(&key) {
                out.push(key);
            }
            if out.len() >= MAX_RANKS {
                break;
            }
        }
    }
    out
}

/// A rank's acknowledgement as the start's choice sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acked {
    /// The step it was at.
    pub step: u64,
    /// Its pace (steps a second), when known.
    pub steps_per_s: Option<f64>,
    /// Seconds since it was at `step` (the trigger waits for the slowest rank's answer).
    pub age_s: f64,
}

/// The step every rank starts on: the first multiple of `roundup` strictly past the
/// furthest rank's step plus its margin. A rank's step is moved on by its pace over the
/// time since it answered, and its margin is [`MARGIN_STEPS`] or the steps it makes in
/// [`REACH_S`] at its pace, whichever is more. `None` without acks, or when the start would
/// overflow.
pub fn choose_start(acks: &[Acked], roundup: u64) -> Option<u64> {
    let roundup = roundup.max(1);
    let ahead = acks
        .iter()
        .map(|a| {
            let age = if a.age_s.is_finite() { a.age_s.max(0.0) } else { 0.0 };
            let by_pace = a
                .steps_per_s
                .filter(|p| p.is_finite() && *p > 0.0)
                .map_or(0, |p| (p * (REACH_S + age)).ceil().min(MAX_STEPS as f64 * 100.0) as u64);
            a.step.checked_add(MARGIN_STEPS.max(by_pace))
        })
        .try_fold(None::<u64>, |m, s| s.map(|s| Some(m.map_or(s, |m| m.max(s)))))??;
    (ahead / roundup).checked_add(1)?.checked_mul(roundup)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(extra: &str) -> String {
        format!(
            r#"{{"version": 1, "id": "a1", "features": ["detailed", "python"], "stacks": false, "steps": 3,
                "roundup": 10, "requested_us": 1000, "expires_us": 2000{extra}}}"#
        )
    }

    #[test]
    fn a_good_request_parses() {
        let r = parse_request(request("").as_bytes()).unwrap();
        assert_eq!((r.id.as_str(), r.steps, r.roundup), ("a1", 3, 10));
        assert_eq!(r.features, ["detailed", "python"]);
        let again = serde_json::to_vec(&r).unwrap();
        assert_eq!(parse_request(&again).unwrap(), r);
        // Every feature at once, the memory window's among them (docs/formats.md, "Memory windows").
        let all =
            request("").replace(r#"["detailed", "python"]"#, &serde_json::to_string(&FEATURES).unwrap());
        assert_eq!(parse_request(all.as_bytes()).unwrap().features, FEATURES);
        let memory = request("").replace(r#"["detailed", "python"]"#, r#"["memory"]"#);
        assert_eq!(parse_request(memory.as_bytes()).unwrap().features, ["memory"]);
    }

    #[test]
    fn hostile_requests_are_refused_with_a_reason() {
        let cases: Vec<(String, &str)> = vec![
            (String::new(), "ends early"),
            ("garbage".into(), "not JSON"),
            ("[1, 2]".into(), "not the format"),
            ("\"x\"".into(), "not the format"),
            (request(r#", "extra": 1"#), "unknown field"),
            (request("").replace(r#""version": 1"#, r#""version": 2"#), "version 2"),
            (request("").replace(r#""version": 1"#, r#""version": "1""#), "not the format"),
            (request("").replace(r#""steps": 3"#, r#""steps": -3"#), "not the format"),
            (request("").replace(r#""steps": 3"#, r#""steps": 0"#), "steps is not"),
            (request("").replace(r#""steps": 3"#, r#""steps": 10001"#), "steps is not"),
            (request("").replace(r#""steps": 3"#, r#""steps": 3.5"#), "not the format"),
            (request("").replace(r#""roundup": 10"#, r#""roundup": 0"#), "roundup is not"),
            (request("").replace(r#""id": "a1""#, r#""id": "../x""#), "the id"),
            (request("").replace(r#""id": "a1""#, r#""id": "a-1""#), "the id"),
            (request("").replace(r#""id": "a1""#, r#""id": 7"#), "not the format"),
            (request("").replace(r#""python""#, r#""perf""#), "not one of"),
            (request("").replace(r#""python""#, r#""detailed""#), "twice"),
            (request("").replace(r#"["detailed", "python"]"#, r#"["memory", "memory"]"#), "twice"),
            (request("").replace(r#""python""#, r#""Memory""#), "not one of"),
            (request("").replace(r#""python""#, r#""gpu_memory""#), "not one of"),
            (request("").replace(r#"["detailed", "python"]"#, "[]"), "no feature"),
            (request("").replace(r#"["detailed", "python"]"#, r#"{"a": 1}"#), "not the format"),
            (request("").replace(r#""stacks": false"#, r#""stacks": 1"#), "not the format"),
            (request("").replace(r#""expires_us": 2000"#, r#""expires_us": 1000"#), "expires_us"),
            (request("").replace(r#""expires_us": 2000"#, r#""expires_us": 9000000000000"#), "expires_us"),
            (request("").replace(r#", "stacks": false"#, ""), "missing field"),
            (format!("{}{}", "[".repeat(5000), "]".repeat(5000)), "larger than"),
            (format!("{}{}", "[".repeat(1000), "]".repeat(1000)), "nested too deep"),
            (format!(r#"{{"id": {}{}}}"#, "[".repeat(200), "]".repeat(200)), "nested too deep"),
            (r#"[1, "a1", ["python"], false, 3, 10, 1000, 2000]"#.into(), "not an object"),
            (request(&format!(r#", "pad": "{}""#, "x".repeat(5000))), "larger than"),
        ];
        for (text, want) in cases {
            let err = parse_request(text.as_bytes()).unwrap_err();
            assert!(err.0.contains(want), "{text:.80}: {err}");
            assert!(!err.0.contains("../x") && !err.0.contains("perf"), "the content is never echoed: {err}");
        }
        // stacks alone is a request.
        let stacks = request("").replace(r#"["detailed", "python"]"#, "[]").replace("false", "true");
        assert!(parse_request(stacks.as_bytes()).unwrap().stacks);
    }

    #[test]
    fn ids_and_names() {
        assert!(valid_id("a_B9") && !valid_id("") && !valid_id("a-b") && !valid_id(&"a".repeat(33)));
        assert_eq!(parse_request_name(&request_name("x1")), Some("x1"));
        assert_eq!(parse_request_name("request-x.y.json"), None);
        assert_eq!(parse_request_name("request-.json"), None);
        assert_eq!(parse_request_name(".request-x.json.tmp"), None);
        let rank = rank_key("0-algo-1", 42);
        assert_eq!(ack_name("x1", &rank), "ack-x1-0-algo-1-42.json");
        assert!(is_answer_to(&ack_name("x1", &rank), "x1"));
        assert!(is_answer_to(&armed_name("x1", &rank), "x1"));
        assert!(!is_answer_to(&ack_name("x12", &rank), "x1"));
        assert!(!is_answer_to(&request_name("x1"), "x1"));
    }

    #[test]
    fn go_and_answers_round_trip() {
        let g = Go { version: 1, id: "a".into(), start: 30, ranks: vec!["0-h-1".into()] };
        assert_eq!(parse_go(&serde_json::to_vec(&g).unwrap()).unwrap(), g);
        assert!(parse_go(br#"{"version": 1, "id": "a", "start": -1, "ranks": []}"#).is_err());
        let a = Answer {
            version: 1,
            id: "a".into(),
            node: "0-h".into(),
            pid: 7,
            answer: AnswerKind::Armed,
            step: Some(12),
            steps_per_s: None,
            at_us: None,
            start: Some(30),
            end: Some(33),
            files: vec!["framework/pevents".into()],
            reason: None,
        };
        let bytes = serde_json::to_vec(&a).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("reason"));
        assert_eq!(parse_answer(&bytes).unwrap(), a);
        assert!(
            parse_answer(br#"{"version": 1, "id": "a", "node": "n", "pid": 1, "answer": "maybe"}"#).is_err()
        );
        let p = Presence { version: 1, node: "0-h".into(), pid: 3, started_us: 5 };
        assert_eq!(parse_presence(&serde_json::to_vec(&p).unwrap()).unwrap(), p);
    }

    #[test]
    fn the_start_is_the_first_multiple_past_the_furthest_rank_and_its_margin() {
        let at = |step, pace, age_s| Acked { step, steps_per_s: pace, age_s };
        // Steps 25 and 27, slow ranks: 27 + 2 = 29 → 30.
        assert_eq!(choose_start(&[at(25, Some(0.1), 0.0), at(27, None, 0.0)], 10), Some(30));
        // Strictly past: 28 + 2 = 30 → 40.
        assert_eq!(choose_start(&[at(28, None, 0.0)], 10), Some(40));
        // roundup 1: the step after the margin.
        assert_eq!(choose_start(&[at(5, None, 0.0)], 1), Some(8));
        // A fast rank (100 steps/s) moves 300 steps while the go-ahead travels...
        assert_eq!(choose_start(&[at(5, Some(100.0), 0.0), at(7, None, 0.0)], 10), Some(310));
        // ... and 200 more when it answered 2 s ago (the trigger waited for another rank).
        assert_eq!(choose_start(&[at(5, Some(100.0), 2.0), at(7, None, 9.0)], 10), Some(510));
        // A pace or an age that is no number counts as none.
        let odd = [at(5, Some(f64::NAN), 1.0), at(6, Some(f64::INFINITY), 0.0), at(6, Some(1.0), f64::NAN)];
        assert_eq!(choose_start(&odd, 10), Some(10));
        assert_eq!(choose_start(&[], 10), None);
        assert_eq!(choose_start(&[at(u64::MAX - 1, None, 0.0)], 10), None);
        assert_eq!(choose_start(&[at(u64::MAX - 100, None, 0.0)], 1_000_000), None);
    }
}
