//! On-demand windows on every node of a job, through its S3 prefix (`trainprof trigger
//! s3://bucket/prefix`; docs/formats.md, "Every node through S3"): the keys under
//! `<prefix>/trigger/`, the node's answer (`node.json`), its strict bounded parser, and the
//! bounds of one look at the prefix.
//!
//! The exchange is the local one ([`super::request`]), relayed: `trainprof trigger` writes
//! `trigger/request-<id>.json` and, later, `trigger/go-<id>.json` into the prefix; the agent
//! of each node (`trainprof run --s3-triggers`) copies them into its node's
//! `<LocalPath>/trigger/`, and copies its ranks' answers up to
//! `trigger/<id>/<node>/<the answer's file name>`, beside its own `node.json`.
//!
//! Whoever can write the prefix can write a request, so every object is read bounded
//! (by its listed size first, then by the bytes read) and parsed strictly, as the local
//! files are.

use serde::{Deserialize, Serialize};

use super::request::{self as local, FORMAT_VERSION, MAX_RANKS, REQUEST_DIR, Refused, check_version, strict};

/// A node's answer to a request, `trigger/<id>/<node>/node.json`.
pub const NODE_ANSWER_NAME: &str = "node.json";
/// Largest `node.json` read (it lists the node's ranks).
pub const MAX_NODE_ANSWER_BYTES: u64 = 64 << 10;
/// Longest node name (the agent's `algo-<n>`; `[A-Za-z0-9_-]`).
pub const MAX_NODE_LEN: usize = 64;
/// Keys asked for in one LIST of `trigger/` (an agent's poll; the requests are there).
pub const LIST_MAX_KEYS: i32 = 100;
/// New request objects an agent reads in one poll (each at most
/// [`local::MAX_FILE_BYTES`]).
pub const MAX_READS_PER_POLL: usize = 4;
/// Nodes `trainprof trigger` expects or takes answers from.
pub const MAX_NODES: usize = 1024;
/// Keys `trainprof trigger` lists under `trigger/<id>/` in one look (answers of every
/// node: a `node.json` and up to three answers per rank).
pub const MAX_ANSWER_KEYS: usize = 16_384;

/// `trigger/request-<id>.json`, relative to the job's prefix.
pub fn request_key(id: &str) -> String {
    format!("{REQUEST_DIR}/{}", local::request_name(id))
}

/// `trigger/go-<id>.json`, relative to the job's prefix.
pub fn go_key(id: &str) -> String {
    format!("{REQUEST_DIR}/{}", local::go_name(id))
}

/// `trigger/`: what an agent lists (with the delimiter `/`, so the answers' folders are one
/// entry each).
pub fn list_prefix() -> String {
    format!("{REQUEST_DIR}/")
}

/// `trigger/<id>/`: every node's answers to request `id`.
pub fn answers_prefix(id: &str) -> String {
    format!("{REQUEST_DIR}/{id}/")
}

/// `trigger/<id>/<node>/<name>`: a file of node `node`'s answer (`node.json`, or a rank's
/// answer under its local name).
pub fn answer_key(id: &str, node: &str, name: &str) -> String {
    format!("{REQUEST_DIR}/{id}/{node}/{name}")
}

/// The id of `trigger/request-<id>.json` (relative to the prefix).
pub fn parse_request_key(rel: &str) -> Option<&str> {
    local::parse_request_name(rel.strip_prefix(REQUEST_DIR)?.strip_prefix('/')?)
}

/// `(node, name)` of a key under [`answers_prefix`] (`rest` is what follows it), when the
/// node is valid and the name is `node.json` or an answer to `id`.
pub fn parse_answer_key<'a>(id: &str, rest: &'a str) -> Option<(&'a str, &'a str)> {
    let (node, name) = rest.split_once('/')?;
    (valid_node(node) && (name == NODE_ANSWER_NAME || local::is_answer_to(name, id))).then_some((node, name))
}

/// A node's name: 1 to [`MAX_NODE_LEN`] of `[A-Za-z0-9_-]`.
pub fn valid_node(node: &str) -> bool {
    (1..=MAX_NODE_LEN).contains(&node.len())
        && node.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// What a node's agent did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeAnswerKind {
    /// Written into the node's `<LocalPath>/trigger/`; `ranks` are the ranks it expects
    /// answers from (their presence files).
    Relayed,
    /// No trainer on that node: no `trigger/` folder, or no rank announced itself in it.
    NoTrainer,
    /// The request (its object or the node's folder) is refused; `reason` says why, nothing
    /// changed on the node.
    Refused,
}

impl NodeAnswerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeAnswerKind::Relayed => "relayed",
            NodeAnswerKind::NoTrainer => "no_trainer",
            NodeAnswerKind::Refused => "refused",
        }
    }
}

/// `trigger/<id>/<node>/node.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeAnswer {
    pub version: u64,
    pub id: String,
    pub node: String,
    pub answer: NodeAnswerKind,
    /// The ranks ([`local::rank_key`]) whose presence files the agent saw.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl NodeAnswer {
    pub fn new(id: &str, node: &str, answer: NodeAnswerKind) -> NodeAnswer {
        NodeAnswer {
            version: FORMAT_VERSION,
            id: id.to_owned(),
            node: node.to_owned(),
            answer,
            ranks: Vec::new(),
            reason: None,
        }
    }
}

/// A node's answer, checked: the version, a valid id and node, at most [`MAX_RANKS`] ranks.
pub fn parse_node_answer(bytes: &[u8]) -> Result<NodeAnswer, Refused> {
    let what = "the node's answer";
    let a: NodeAnswer = strict(bytes, MAX_NODE_ANSWER_BYTES, what)?;
    check_version(a.version, what)?;
    if !local::valid_id(&a.id) {
        return Err(Refused(format!("{what}: the id is not valid")));
    }
    if !valid_node(&a.node) {
        return Err(Refused(format!("{what}: the node is not 1 to {MAX_NODE_LEN} of [A-Za-z0-9_-]")));
    }
    if a.ranks.len() > MAX_RANKS {
        return Err(Refused(format!("{what}: more than {MAX_RANKS} ranks")));
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_their_parsers() {
        assert_eq!(request_key("a1"), "trigger/request-a1.json");
        assert_eq!(go_key("a1"), "trigger/go-a1.json");
        assert_eq!(parse_request_key(&request_key("a1")), Some("a1"));
        assert_eq!(parse_request_key("trigger/request-a-1.json"), None);
        assert_eq!(parse_request_key("trigger/go-a1.json"), None);
        assert_eq!(parse_request_key("other/request-a1.json"), None);
        let ack = local::ack_name("a1", "0-h-7");
        let key = answer_key("a1", "algo-2", &ack);
        let rest = key.strip_prefix(&answers_prefix("a1")).unwrap();
        assert_eq!(parse_answer_key("a1", rest), Some(("algo-2", ack.as_str())));
        assert_eq!(parse_answer_key("a1", "algo-2/node.json"), Some(("algo-2", NODE_ANSWER_NAME)));
        assert_eq!(parse_answer_key("a2", rest), None, "an answer to another request");
        assert_eq!(parse_answer_key("a1", "../node.json"), None);
        assert_eq!(parse_answer_key("a1", "algo 2/node.json"), None);
        assert_eq!(parse_answer_key("a1", "algo-2/x/node.json"), None);
        assert!(
            valid_node("algo-1") && !valid_node("") && !valid_node("a/b") && !valid_node(&"a".repeat(65))
        );
    }

    #[test]
    fn node_answers_round_trip_and_hostile_ones_are_refused() {
        let mut a = NodeAnswer::new("a1", "algo-1", NodeAnswerKind::Relayed);
        a.ranks = vec!["0-h-7".into(), "1-h-8".into()];
        let bytes = serde_json::to_vec(&a).unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("reason"));
        assert_eq!(parse_node_answer(&bytes).unwrap(), a);
        let text = String::from_utf8(bytes).unwrap();
        for (bad, want) in [
            (text.replace("relayed", "maybe"), "not the format"),
            (text.replace("algo-1", "../x"), "the node"),
            (text.replace(r#""a1""#, r#""a-1""#), "the id"),
            (text.replace(r#""version":1"#, r#""version":2"#), "version 2"),
            (text.replace('}', r#","extra":1}"#), "unknown field"),
            (format!(r#"{{"pad": "{}"}}"#, "x".repeat(70_000)), "larger than"),
        ] {
            let err = parse_node_answer(bad.as_bytes()).unwrap_err();
            assert!(err.0.contains(want), "{bad:.80}: {err}");
        }
        let many = NodeAnswer { ranks: vec!["r".into(); MAX_RANKS + 1], ..a };
        assert!(parse_node_answer(&serde_json::to_vec(&many).unwrap()).is_err());
        assert_eq!(NodeAnswerKind::NoTrainer.as_str(), "no_trainer");
    }
}
