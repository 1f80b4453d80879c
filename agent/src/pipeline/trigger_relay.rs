//! The S3 relay of `trainprof run --s3-triggers` (docs/trigger.md, "Every node of a job
//! through S3"; docs/formats.md, "Every node through S3"): `trainprof trigger s3://…` on
//! every node of a job, without a shell on any of them.
//!
//! One thread, its own current-thread runtime and the uploader's client
//! ([`crate::s3::store::S3Store`]: the same credentials and endpoint). While idle it LISTs
//! `<prefix>/trigger/` once per poll interval (one page of at most
//! [`proto::LIST_MAX_KEYS`] keys, the delimiter `/`), and reads at most
//! [`proto::MAX_READS_PER_POLL`] new request objects, each at most 4 KiB. A request is parsed
//! with the local exchange's strict parser and written new into this node's
//! `<LocalPath>/trigger/` (never made here: no folder, no trainer), which must pass the
//! hook's checks (a real folder, no permission for group or others); the node's answer
//! (`node.json`) says what was done, or why not. While that request is in flight it looks
//! every [`BUSY`]: the ranks' answers go up, the go-ahead comes down. It removes only the
//! local files it wrote.
//!
//! Nothing here changes `run`'s exit status or its upload: every S3 call is bounded by
//! [`CALL_TIMEOUT`], a failure is one line (said again only when it changes) and the call is
//! made again at the next look; the thread is told to stop before the final upload and is
//! never waited for.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use trainprof_output::fs::{self, Dir, Kind, Meta};
use trainprof_output::protocol::request::{self as local, Go, REQUEST_DIR, Request};
use trainprof_output::protocol::request_s3::{self as proto, NodeAnswer, NodeAnswerKind};

use crate::log;
use crate::s3::small::ListBound;
use crate::s3::store::{ErrorClass, S3Options, S3Store, S3Url, StoreError};

/// `--s3-trigger-poll`'s default, and its bounds (seconds).
pub const DEFAULT_POLL_S: u64 = 5;
pub const MIN_POLL_S: u64 = 1;
pub const MAX_POLL_S: u64 = 300;

/// How often the relay looks while a request it relayed is in flight.
pub const BUSY: Duration = Duration::from_millis(500);
/// The longest one S3 call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long past a request's expiry its late answers (a rank's `missed`) are still relayed.
const GRACE_US: i64 = 2_000_000;
/// Request ids remembered as handled (the prefix may hold requests already seen).
const HANDLED: usize = 256;
/// One page of the listing: the relay never asks for a second.
const LIST_ENTRIES: usize = proto::LIST_MAX_KEYS as usize;
/// The longest sleep between two looks at the stop flag.
const SLICE: Duration = Duration::from_millis(100);

/// What the relay needs to know.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The node's LocalPath (the agent's output folder).
    pub root: PathBuf,
    /// The node's name in the keys (`algo-<n>`, as in the system files).
    pub node: String,
    /// The idle poll interval.
    pub poll: Duration,
}

/// The running relay; [`Relay::stop`] tells it to stop (it is never waited for).
#[derive(Debug)]
pub struct Relay {
    stop: Arc<AtomicBool>,
}

impl Relay {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Starts the relay thread.
pub fn spawn(url: S3Url, options: S3Options, settings: Settings) -> io::Result<Relay> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let runtime = crate::s3::runtime().map_err(io::Error::other)?;
    std::thread::Builder::new().name("trainprof-trigger-relay".into()).spawn(move || {
        crate::pipeline::cost::enroll(crate::pipeline::cost::Part::Relay);
        let store = runtime.block_on(S3Store::connect(url, options));
        let mut relayer = Relayer::new(store, settings);
        relayer.run(&runtime, &flag);
    })?;
    Ok(Relay { stop })
}

/// A request relayed into the node's folder, until its answers are up.
struct InFlight {
    request: Request,
    dir: Dir,
    ranks: Vec<String>,
    /// The local answers already copied up (by file name), or passed over.
    relayed: HashSet<String>,
    /// The ranks that will not answer again (an armed, missed or refused second answer, or
    /// a first answer that is no ack).
    done: HashSet<String>,
    stacks_done: HashSet<String>,
    /// The files this relay wrote into the folder (removed at the end, if still theirs).
    wrote: Vec<(String, Meta)>,
    go: bool,
}

struct Relayer {
    store: S3Store,
    settings: Settings,
    handled: VecDeque<String>,
    current: Option<InFlight>,
    /// The last failure said, so that a lasting one is said once.
    last_error: Option<String>,
    tag: String,
}

impl Relayer {
    fn new(store: S3Store, settings: Settings) -> Relayer {
        Relayer {
            store,
            settings,
            handled: VecDeque::new(),
            current: None,
            last_error: None,
            tag: std::process::id().to_string(),
        }
    }

    fn run(&mut self, rt: &tokio::runtime::Runtime, stop: &AtomicBool) {
        let mut next_list = Instant::now();
        while !stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= next_list {
                next_list = now + self.settings.poll;
                rt.block_on(self.list());
            }
            if self.current.is_some() {
                rt.block_on(self.step());
            }
            let until = if self.current.is_some() { Instant::now() + BUSY } else { next_list };
            while !stop.load(Ordering::Acquire) {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                crate::pipeline::cost::flush();
                std::thread::sleep(left.min(SLICE));
            }
        }
        self.finish();
    }

    fn failed(&mut self, e: &StoreError) {
        let said = format!("{} {}", e.op, e.code);
        if self.last_error.as_deref() != Some(said.as_str()) {
            log!("S3 trigger relay ({}): {e}; tried again at the next look", self.store.describe_prefix());
            self.last_error = Some(said);
        }
    }

    fn succeeded(&mut self) {
        if self.last_error.take().is_some() {
            log!("S3 trigger relay ({}): S3 answers again", self.store.describe_prefix());
        }
    }

    /// One LIST of `trigger/`; each new request handled.
    async fn list(&mut self) {
        let bound = ListBound { delimiter: true, page_keys: proto::LIST_MAX_KEYS, entries: LIST_ENTRIES };
        let listed = match self.store.list_small(&proto::list_prefix(), bound, CALL_TIMEOUT).await {
            Ok(l) => l,
            Err(e) => return self.failed(&e),
        };
        self.succeeded();
        let mut new: Vec<(String, u64)> = Vec::new();
        for (rel, size) in &listed.objects {
            let Some(id) = proto::parse_request_key(rel) else { continue };
            if self.handled.iter().any(|h| h == id) || new.iter().any(|(n, _)| n == id) {
                continue;
            }
            new.push((id.to_owned(), *size));
            if new.len() == proto::MAX_READS_PER_POLL {
                break;
            }
        }
        for (id, size) in new {
            self.handle(&id, size).await;
        }
    }

    fn remember(&mut self, id: &str) {
        if self.handled.len() == HANDLED {
            self.handled.pop_front();
        }
        self.handled.push_back(id.to_owned());
    }

    /// A new request object: refused, ignored (expired), or relayed into the node's folder.
    async fn handle(&mut self, id: &str, size: u64) {
        let key = proto::request_key(id);
        let bytes = if size > local::MAX_FILE_BYTES {
            Err(format!("the request: larger than {} bytes", local::MAX_FILE_BYTES))
        } else {
            match self.get(&key, local::MAX_FILE_BYTES).await {
                Ok(Some(b)) => Ok(b),
                // Gone since the listing (the trigger ended): nothing to answer.
                Ok(None) => return self.remember(id),
                // Read again at the next look.
                Err(e) => return self.failed(&e),
            }
        };
        self.remember(id);
        let request = bytes.and_then(|b| local::parse_request(&b).map_err(|r| r.0)).and_then(|r| {
            if r.id == id { Ok(r) } else { Err("the request: its id is not its object's".to_owned()) }
        });
        let request = match request {
            Ok(r) => r,
            Err(why) => {
                log!("trainprof trigger {id} (S3): refused: {why}");
                return self.answer(id, NodeAnswerKind::Refused, Vec::new(), Some(why)).await;
            }
        };
        if now_us() > request.expires_us {
            return;
        }
        if let Some(cur) = &self.current {
            let why = format!("one request at a time: {} is in flight on this node", cur.request.id);
            return self.answer(id, NodeAnswerKind::Refused, Vec::new(), Some(why)).await;
        }
        let dir = match request_folder(&self.settings.root) {
            Ok(d) => d,
            Err((kind, why)) => return self.answer(id, kind, Vec::new(), Some(why)).await,
        };
        let ranks = local::ranks_present(&dir);
        if ranks.is_empty() {
            let why = format!("no rank has announced itself in {}", dir.path().display());
            return self.answer(id, NodeAnswerKind::NoTrainer, Vec::new(), Some(why)).await;
        }
        let name = local::request_name(id);
        let written = serde_json::to_vec(&request)
            .map_err(io::Error::other)
            .and_then(|b| fs::write_new(&dir, &name, &self.tag, &b));
        let held = match written {
            Ok(true) => dir.stat(&name).ok(),
            Ok(false) => {
                let why = format!("{name} exists already in the node's folder");
                return self.answer(id, NodeAnswerKind::Refused, Vec::new(), Some(why)).await;
            }
            Err(e) => {
                let why = format!("cannot write {}: {e}", dir.display(&name).display());
                return self.answer(id, NodeAnswerKind::Refused, Vec::new(), Some(why)).await;
            }
        };
        log!(
            "trainprof trigger {id} (S3): relayed to {} rank{} of {}",
            ranks.len(),
            if ranks.len() == 1 { "" } else { "s" },
            self.settings.node
        );
        self.current = Some(InFlight {
            request,
            dir,
            ranks: ranks.clone(),
            relayed: HashSet::new(),
            done: HashSet::new(),
            stacks_done: HashSet::new(),
            wrote: held.map(|m| vec![(name, m)]).unwrap_or_default(),
            go: false,
        });
        self.answer(id, NodeAnswerKind::Relayed, ranks, None).await;
    }

    /// Puts this node's `node.json` for request `id` (tried three times, then left).
    async fn answer(&mut self, id: &str, kind: NodeAnswerKind, ranks: Vec<String>, reason: Option<String>) {
        let mut a = NodeAnswer::new(id, &self.settings.node, kind);
        (a.ranks, a.reason) = (ranks, reason);
        let Ok(bytes) = serde_json::to_vec(&a) else { return };
        let key = proto::answer_key(id, &self.settings.node, proto::NODE_ANSWER_NAME);
        for attempt in 0..3 {
            match self.put(&key, bytes.clone()).await {
                Ok(()) => return self.succeeded(),
                Err(e) if attempt == 2 || e.class == ErrorClass::Fatal => return self.failed(&e),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// While a request is in flight: the ranks' answers up, the go-ahead down; the end.
    async fn step(&mut self) {
        let Some(mut cur) = self.current.take() else { return };
        let id = cur.request.id.clone();
        let mut names: Vec<String> = Vec::new();
        for e in cur.dir.entries().unwrap_or_default() {
            let Ok(name) = e.name else { continue };
            if e.kind == Kind::File && local::is_answer_to(&name, &id) && !cur.relayed.contains(&name) {
                names.push(name);
            }
        }
        // At most three answers a rank (ack, armed, stacks).
        names.truncate(cur.ranks.len().saturating_mul(3));
        for name in names {
            let answer = match cur.dir.read(&name, local::MAX_FILE_BYTES) {
                Ok(Some(b)) => local::parse_answer(&b).ok().filter(|a| a.id == id).map(|a| (a, b)),
                _ => None,
            };
            let Some((a, bytes)) = answer else {
                cur.relayed.insert(name);
                continue;
            };
            match self.put(&proto::answer_key(&id, &self.settings.node, &name), bytes).await {
                Ok(()) => {
                    self.succeeded();
                    let rank = local::rank_key(&a.node, a.pid);
                    if name.starts_with(local::STACKS_PREFIX) {
                        cur.stacks_done.insert(rank);
                    } else if name.starts_with(local::ARMED_PREFIX) || a.answer != local::AnswerKind::Ack {
                        cur.done.insert(rank);
                    }
                    cur.relayed.insert(name);
                }
                Err(e) => self.failed(&e),
            }
        }
        if !cur.go {
            match self.get(&proto::go_key(&id), local::MAX_GO_BYTES).await {
                Ok(None) => {}
                Ok(Some(b)) => {
                    cur.go = true;
                    self.relay_go(&mut cur, &b);
                }
                Err(e) => self.failed(&e),
            }
        }
        let features = !cur.request.features.is_empty();
        let answered = (!features || cur.ranks.iter().all(|r| cur.done.contains(r)))
            && (!cur.request.stacks || cur.ranks.iter().all(|r| cur.stacks_done.contains(r)));
        if answered || now_us() > cur.request.expires_us.saturating_add(GRACE_US) {
            clean_up(&cur);
        } else {
            self.current = Some(cur);
        }
    }

    fn relay_go(&mut self, cur: &mut InFlight, bytes: &[u8]) {
        let id = &cur.request.id;
        let go: Go = match local::parse_go(bytes) {
            Ok(g) if &g.id == id => g,
            Ok(_) => {
                return log!(
                    "trainprof trigger {id} (S3): the go-ahead's id is not its object's: not relayed"
                );
            }
            Err(why) => return log!("trainprof trigger {id} (S3): {why}: not relayed"),
        };
        // The ranks not listed will not arm: they are done.
        for r in &cur.ranks {
            if !go.ranks.contains(r) {
                cur.done.insert(r.clone());
            }
        }
        let name = local::go_name(id);
        let written = serde_json::to_vec(&go)
            .map_err(io::Error::other)
            .and_then(|b| fs::write_new(&cur.dir, &name, &self.tag, &b));
        match written {
            Ok(true) => {
                if let Ok(m) = cur.dir.stat(&name) {
                    cur.wrote.push((name, m));
                }
            }
            Ok(false) => {
                log!("trainprof trigger {id} (S3): {name} exists already: the go-ahead is not relayed")
            }
            Err(e) => log!("trainprof trigger {id} (S3): cannot write {name}: {e}"),
        }
    }

    /// At the stop: the local files of a request in flight are removed.
    fn finish(&mut self) {
        if let Some(cur) = self.current.take() {
            clean_up(&cur);
        }
    }

    async fn get(&self, rel: &str, max: u64) -> Result<Option<Vec<u8>>, StoreError> {
        self.store.get_small(rel, max, CALL_TIMEOUT).await
    }

    async fn put(&self, rel: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.store.put_small(rel, bytes, false, CALL_TIMEOUT).await.map(|_| ())
    }
}

impl S3Store {
    /// `s3://bucket/prefix/trigger/`, for the relay's lines.
    fn describe_prefix(&self) -> String {
        format!("s3://{}/{}", self.url().bucket, self.url().key(&proto::list_prefix()))
    }
}

/// Removes the files this relay wrote for `cur`, each only while it is still the one
/// written.
fn clean_up(cur: &InFlight) {
    for (name, held) in &cur.wrote {
        let _ = cur.dir.unlink_if_holds(name, held);
    }
}

/// `<root>/trigger/` when it passes the hook's checks (docs/formats.md, "On-demand windows
/// (`trainprof trigger`)", "The folder"): a real folder (not a link), owned by this process's
/// user unless that is root, with no permission bits for group or others. Never made here.
fn request_folder(root: &Path) -> Result<Dir, (NodeAnswerKind, String)> {
    let refused = |why: String| (NodeAnswerKind::Refused, why);
    let root = Dir::open_root(root, false).map_err(|e| refused(format!("the node's LocalPath: {e}")))?;
    let dir = match root.sub(REQUEST_DIR, false) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err((
                NodeAnswerKind::NoTrainer,
                format!(
                    "no trainer running: {} does not exist (the hook makes it when a trainer starts profiling)",
                    root.display(REQUEST_DIR).display()
                ),
            ));
        }
        Err(e) => return Err(refused(format!("{}: {e}", root.display(REQUEST_DIR).display()))),
    };
    let meta = fs::meta_of(&dir).map_err(|e| refused(e.to_string()))?;
    let euid = fs::euid();
    if euid != 0 && meta.uid != euid {
        return Err(refused(format!(
            "{} belongs to uid {}, not to the agent's user (uid {euid}): not used",
            dir.path().display(),
            meta.uid
        )));
    }
    if meta.mode & 0o077 != 0 {
        return Err(refused(format!(
            "{} can be used by others (mode {:o}): not used",
            dir.path().display(),
            meta.mode & 0o7777
        )));
    }
    Ok(dir)
}

fn now_us() -> i64 {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::{PermissionsExt as _, symlink};

    use super::*;

    fn root(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("trainprof-relay-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn the_nodes_folder_must_pass_the_hooks_checks_and_is_never_made() {
        let r = root("none");
        let (kind, why) = request_folder(&r).err().unwrap();
        assert_eq!(kind, NodeAnswerKind::NoTrainer, "{why}");
        assert!(!r.join(REQUEST_DIR).exists(), "never made by the relay");

        let r = root("link");
        std::fs::create_dir(r.join("elsewhere")).unwrap();
        std::fs::set_permissions(r.join("elsewhere"), std::fs::Permissions::from_mode(0o700)).unwrap();
        symlink(r.join("elsewhere"), r.join(REQUEST_DIR)).unwrap();
        let (kind, why) = request_folder(&r).err().unwrap();
        assert_eq!(kind, NodeAnswerKind::Refused, "{why}");

        let r = root("open");
        std::fs::create_dir(r.join(REQUEST_DIR)).unwrap();
        std::fs::set_permissions(r.join(REQUEST_DIR), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (kind, why) = request_folder(&r).err().unwrap();
        assert_eq!(kind, NodeAnswerKind::Refused);
        assert!(why.contains("can be used by others (mode 755)"), "{why}");

        std::fs::set_permissions(r.join(REQUEST_DIR), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(request_folder(&r).is_ok());
        for name in ["none", "link", "open"] {
            let _ = std::fs::remove_dir_all(root(name));
        }
    }
}
