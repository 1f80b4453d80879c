//! `trainprof trigger s3://bucket/prefix`: every node of a job, through its S3 prefix
//! (docs/trigger.md, "Every node of a job through S3"; docs/formats.md, "Every node through
//! S3"). The request and the go-ahead go into `<prefix>/trigger/`; each node's agent
//! (`trainprof run --s3-triggers`) relays them to its ranks and their answers back under
//! `trigger/<id>/<node>/`. The exchange itself (the phases, the start, the lines) is the
//! local one (`mod.rs`); this file is the channel: the nodes expected (the node records
//! under `system/node/`), the answers read bounded, what is removed at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use trainprof_output::protocol::node_record;
use trainprof_output::protocol::request::{self as local, Answer, Go};
use trainprof_output::protocol::request_s3::{self as proto, NodeAnswer, NodeAnswerKind};
use trainprof_output::text::printable;

use super::{Channel, TriggerArgs, UNUSABLE, checked, exchange, fail, new_request};
use crate::s3::small::ListBound;
use crate::s3::store::{Put, S3Options, S3Store, S3Url};

/// `--wait`'s default for an `s3://` target: the agents look every 5 s by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// How often the prefix is listed for answers while the trigger waits.
const POLL: Duration = Duration::from_millis(250);
/// The longest one S3 call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `trainprof trigger` on an `s3://` target.
pub(super) fn trigger(args: &TriggerArgs) -> ExitCode {
    let url = match S3Url::parse(&args.target) {
        Ok(u) => u,
        Err(e) => return fail(UNUSABLE, &e.to_string()),
    };
    let wait = args.wait.unwrap_or(DEFAULT_WAIT);
    let rt = match crate::s3::runtime() {
        Ok(r) => r,
        Err(e) => return fail(UNUSABLE, &e.to_string()),
    };
    let options = S3Options { endpoint: args.s3_endpoint.clone(), ..S3Options::default() };
    let store = rt.block_on(S3Store::connect(url, options));
    let started = Instant::now();
    let expected = match rt.block_on(nodes_of_the_job(&store)) {
        Ok(n) => n,
        Err(e) => return fail(UNUSABLE, &format!("cannot list {}: {e}", shown(&store, node_record::FOLDER))),
    };
    let request = new_request(args, wait);
    let id = request.id.clone();
    let mut ch = S3Channel {
        rt,
        store,
        id: id.clone(),
        target: args.target.trim_end_matches('/').to_owned(),
        expected,
        nodes: BTreeMap::new(),
        answers: BTreeMap::new(),
        read: BTreeSet::new(),
        wrote: Vec::new(),
        list_error: None,
    };
    let written = serde_json::to_vec(&request)
        .map_err(|e| e.to_string())
        .and_then(|b| ch.put(&proto::request_key(&id), b));
    if let Err(e) = written {
        return fail(
            UNUSABLE,
            &format!("cannot write the request {}: {e}", shown(&ch.store, &proto::request_key(&id))),
        );
    }
    let status = exchange(&mut ch, wait, &request, started);
    ch.clean_up();
    ExitCode::from(status)
}

/// `s3://bucket/prefix/rel`, for people.
fn shown(store: &S3Store, rel: &str) -> String {
    format!("s3://{}/{}", store.url().bucket, store.url().key(rel))
}

/// The nodes whose agents wrote a node record into the prefix (`system/node/<node>/`, once
/// per agent start; docs/formats.md, "Node record"): the nodes expected to answer.
async fn nodes_of_the_job(store: &S3Store) -> Result<Vec<String>, String> {
    let folder = format!("{}/", node_record::FOLDER);
    let bound = ListBound { delimiter: true, page_keys: 1000, entries: proto::MAX_NODES };
    let listed = store.list_small(&folder, bound, CALL_TIMEOUT).await.map_err(|e| e.detail)?;
    let mut out: Vec<String> = Vec::new();
    for f in &listed.folders {
        let node = f.strip_prefix(&folder).map(|n| n.trim_end_matches('/'));
        if let Some(n) = node.filter(|n| proto::valid_node(n))
            && !out.iter().any(|o| o == n)
        {
            out.push(n.to_owned());
        }
    }
    out.truncate(proto::MAX_NODES);
    Ok(out)
}

/// The job's prefix as the exchange's channel.
struct S3Channel {
    rt: tokio::runtime::Runtime,
    store: S3Store,
    id: String,
    target: String,
    /// The nodes with a node record in the prefix.
    expected: Vec<String>,
    /// Each node's `node.json`, read.
    nodes: BTreeMap<String, Result<NodeAnswer, String>>,
    /// The ranks' answers relayed, by (node, file name).
    answers: BTreeMap<(String, String), Result<Answer, String>>,
    /// Every answer read, by its key relative to the prefix (removed at the end).
    read: BTreeSet<String>,
    /// The keys this command wrote.
    wrote: Vec<String>,
    /// The last listing's failure, said once.
    list_error: Option<String>,
}

impl S3Channel {
    fn put(&mut self, rel: &str, bytes: Vec<u8>) -> Result<(), String> {
        match self.rt.block_on(self.store.put_small(rel, bytes, true, CALL_TIMEOUT)) {
            Ok(Put::Stored) => {
                self.wrote.push(rel.to_owned());
                Ok(())
            }
            Ok(Put::Exists) => Err("it exists already".to_owned()),
            Err(e) => Err(e.detail),
        }
    }

    /// Every key under `trigger/<id>/` (at most [`proto::MAX_ANSWER_KEYS`]) with its size.
    async fn list(&self) -> Result<Vec<(String, u64)>, String> {
        let bound = ListBound { delimiter: false, page_keys: 1000, entries: proto::MAX_ANSWER_KEYS };
        let listed = self.store.list_small(&proto::answers_prefix(&self.id), bound, CALL_TIMEOUT).await;
        listed.map(|l| l.objects).map_err(|e| e.detail)
    }

    /// Removes the request and the go-ahead it wrote, and every answer it read (after one
    /// last look, for the answers that came while it printed).
    fn clean_up(&mut self) {
        self.look();
        let keys: Vec<String> = self.wrote.iter().chain(self.read.iter()).cloned().collect();
        let store = &self.store;
        self.rt.block_on(async {
            for rel in keys {
                if let Err(e) = store.delete_small(&rel, CALL_TIMEOUT).await {
                    eprintln!("trainprof trigger: cannot remove {}: {}", shown(store, &rel), e.detail);
                }
            }
        });
    }
}

impl Channel for S3Channel {
    fn every(&self) -> Duration {
        POLL
    }

    fn look(&mut self) {
        let listed = self.rt.block_on(self.list());
        let keys = match listed {
            Ok(k) => {
                self.list_error = None;
                k
            }
            Err(e) => {
                if self.list_error.as_deref() != Some(e.as_str()) {
                    eprintln!("trainprof trigger: cannot list the answers: {e}; trying again");
                    self.list_error = Some(e);
                }
                return;
            }
        };
        let head = proto::answers_prefix(&self.id);
        for (key, size) in keys {
            if self.read.contains(&key) {
                continue;
            }
            let Some((node, name)) =
                key.strip_prefix(&head).and_then(|r| proto::parse_answer_key(&self.id, r))
            else {
                continue;
            };
            let (node, name) = (node.to_owned(), name.to_owned());
            let is_node = name == proto::NODE_ANSWER_NAME;
            let max = if is_node { proto::MAX_NODE_ANSWER_BYTES } else { local::MAX_FILE_BYTES };
            let bytes = if size > max {
                Err(format!("larger than {max} bytes: not read"))
            } else {
                match self.rt.block_on(self.store.get_small(&key, max, CALL_TIMEOUT)) {
                    Ok(Some(b)) => Ok(b),
                    Ok(None) => continue,
                    // Read again at the next look.
                    Err(_) => continue,
                }
            };
            self.read.insert(key);
            if is_node {
                let a = bytes.and_then(|b| proto::parse_node_answer(&b).map_err(|r| r.0)).and_then(|a| {
                    if a.node == node && a.id == self.id {
                        Ok(a)
                    } else {
                        Err("the node's answer: its node or id is not its key's".to_owned())
                    }
                });
                if self.nodes.len() < proto::MAX_NODES || self.nodes.contains_key(&node) {
                    self.nodes.insert(node, a);
                }
            } else {
                let a = bytes.and_then(|b| local::parse_answer(&b).map_err(|r| r.0));
                self.answers.insert((node, name), a);
            }
        }
    }

    fn answers(&self, prefix: &str) -> Vec<(String, Result<Answer, String>)> {
        let head = format!("{prefix}{}-", self.id);
        let mut out = Vec::new();
        for ((_, name), a) in &self.answers {
            let Some(rank) = name.strip_prefix(&head).and_then(|r| r.strip_suffix(local::JSON_SUFFIX)) else {
                continue;
            };
            out.push((rank.to_owned(), checked(a.clone(), rank, &self.id)));
        }
        out
    }

    fn ranks(&self) -> (Vec<String>, bool) {
        let mut ranks = Vec::new();
        for a in self.nodes.values().flatten() {
            if a.answer == NodeAnswerKind::Relayed {
                for r in &a.ranks {
                    if !ranks.contains(r) && ranks.len() < local::MAX_RANKS {
                        ranks.push(r.clone());
                    }
                }
            }
        }
        let all = !self.expected.is_empty() && self.expected.iter().all(|n| self.nodes.contains_key(n));
        (ranks, all)
    }

    fn write_go(&mut self, go: &Go) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(go).map_err(std::io::Error::other)?;
        self.put(&proto::go_key(&self.id), bytes).map_err(std::io::Error::other)
    }

    fn file(&self, rel: &str) -> String {
        // The node's LocalPath is uploaded under the prefix with the same relative paths.
        format!("{}/{}", self.target, printable(rel, 200))
    }

    fn notes(&self) -> Vec<String> {
        let mut nodes: BTreeSet<&String> = self.expected.iter().collect();
        nodes.extend(self.nodes.keys());
        let mut out = Vec::new();
        for n in nodes {
            let text = match self.nodes.get(n) {
                None => "no answer (is its agent running with --s3-triggers?)".to_owned(),
                Some(Ok(a)) => {
                    let why =
                        a.reason.as_deref().map(|r| format!(": {}", printable(r, 300))).unwrap_or_default();
                    match a.answer {
                        NodeAnswerKind::Relayed => continue,
                        NodeAnswerKind::NoTrainer => format!("no trainer{why}"),
                        NodeAnswerKind::Refused => format!("refused{why}"),
                    }
                }
                Some(Err(e)) => format!("its answer could not be read: {}", printable(e, 300)),
            };
            out.push(format!("  node {}: {text}", printable(n, 100)));
        }
        out
    }

    fn no_ranks(&self) -> String {
        let answered: Vec<&NodeAnswer> = self.nodes.values().flatten().collect();
        if self.nodes.is_empty() {
            let seen = if self.expected.is_empty() {
                format!("no node record under {} either", shown(&self.store, node_record::FOLDER))
            } else {
                format!("nodes of the job: {}", self.expected.join(", "))
            };
            format!("no agent answered (is any agent running with --s3-triggers? {seen})")
        } else if !answered.is_empty() && answered.iter().all(|a| a.answer == NodeAnswerKind::NoTrainer) {
            "no trainer running on any node that answered".to_owned()
        } else {
            "no node relayed the request (refused)".to_owned()
        }
    }
}
