//! The uploader against an in-memory store that fails on command.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::retry::Policy;
use super::{Msg, Report, Settings, run};
use crate::s3::store::{ErrorClass, ObjectStore, Put, Remote, StoreError};

/// What the fake store holds and how it misbehaves.
#[derive(Debug, Default)]
struct State {
    objects: Mutex<HashMap<String, Vec<u8>>>,
    /// Keys in the order their puts succeeded.
    put_order: Mutex<Vec<String>>,
    /// Every request fails with a connection error while set.
    down: AtomicBool,
    /// Every request fails with this fatal code while set.
    fatal: Mutex<Option<String>>,
    /// Puts of this key are refused for the key itself (as S3 refuses a key too long).
    refuse: Mutex<Option<String>>,
    requests: AtomicU64,
    /// Every request waits for an answer that never comes while set.
    hang: AtomicBool,
}

#[derive(Debug, Clone, Default)]
struct FaultStore(Arc<State>);

impl FaultStore {
    fn check(&self, op: &'static str, key: &str) -> Result<(), StoreError> {
        self.0.requests.fetch_add(1, Ordering::SeqCst);
        let err = |class, code: &str| StoreError {
            class,
            code: code.to_owned(),
            op,
            key: key.to_owned(),
            detail: "injected".to_owned(),
            file_only: false,
        };
        if self.0.down.load(Ordering::SeqCst) {
            return Err(err(ErrorClass::Retry, "connection"));
        }
        if let Some(code) = self.0.fatal.lock().unwrap().clone() {
            return Err(err(ErrorClass::Fatal, &code));
        }
        Ok(())
    }

    fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.0.objects.lock().unwrap().keys().cloned().collect();
        k.sort();
        k
    }
}

impl ObjectStore for FaultStore {
    fn describe(&self) -> String {
        "fake://".to_owned()
    }

    async fn head(&self, key: &str) -> Result<Option<Remote>, StoreError> {
        if self.0.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.check("HeadObject", key)?;
        Ok(self
            .0
            .objects
            .lock()
            .unwrap()
            .get(key)
            .map(|b| Remote { len: b.len() as u64, etag: Some(super::md5_hex_bytes(b)) }))
    }

    async fn put_file(
        &self,
        key: &str,
        file: &std::fs::File,
        len: u64,
        if_absent: bool,
    ) -> Result<Put, StoreError> {
        if self.0.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.check("PutObject", key)?;
        if self.0.refuse.lock().unwrap().as_deref() == Some(key) {
            return Err(StoreError {
                class: ErrorClass::Fatal,
                code: "KeyTooLongError".to_owned(),
                op: "PutObject",
                key: key.to_owned(),
                detail: "injected".to_owned(),
                file_only: true,
            });
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file.try_clone().unwrap(), &mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, len);
        let mut objects = self.0.objects.lock().unwrap();
        if if_absent && objects.contains_key(key) {
            return Ok(Put::Exists);
        }
        objects.insert(key.to_owned(), bytes);
        self.0.put_order.lock().unwrap().push(key.to_owned());
        Ok(Put::Stored)
    }
}

/// A scratch folder, removed when the first value is dropped (also when the test fails).
fn root(tag: &str) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::Builder::new().prefix(&format!("trainprof-upload-{tag}-")).tempdir().unwrap();
    let d = t.path().to_path_buf();
    (t, d)
}

fn put(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn settings(root: &Path) -> Settings {
    let mut s = Settings::new(root);
    s.scan_interval = Duration::from_millis(20);
    s.policy = Policy {
        retry_base: Duration::from_millis(5),
        throttled_base: Duration::from_millis(10),
        cap: Duration::from_millis(40),
        fatal: Duration::from_millis(50),
    };
    s
}

const SYS: &str = "system/incremental/2020072013/1595253600.algo-1.json";
const SYS2: &str = "system/incremental/2020072013/1595253660.algo-1.json";
const TIMELINE: &str = "framework/pevents/2020072013/1595253601000000_0-algo-1_pythontimeline.json";
const STATS: &str =
    "framework/pytorch/cprofile/0-algo-1/prestepzero-0-start0_prestepzero-0-end1/python_stats";

/// Four sealed files and some that are never uploaded; the returned file holds the lock
/// of a live writer's temporary file (a dead writer's would be repaired and uploaded).
fn data_files(root: &Path) -> std::fs::File {
    put(root, SYS, "{\"Timestamp\": 1}\n");
    put(root, SYS2, "{\"Timestamp\": 2}\n");
    put(root, TIMELINE, "[\n{}\n]");
    put(root, STATS, "stats");
    put(root, LIVE_TMP, "{\"Timestamp\": 3}\n");
    put(root, ".tmp/0-algo-1/window/python_stats", "partial");
    put(root, "system/incremental/2020072013/.hidden.json", "x");
    put(root, "notes.txt", "mine");
    let live = std::fs::OpenOptions::new().read(true).write(true).open(root.join(LIVE_TMP)).unwrap();
    live.try_lock().unwrap();
    live
}

const LIVE_TMP: &str = "system/.1595253720.algo-1.77.tmp";

/// Runs the uploader on `store` until finished (`deadline` from the start), with `during`
/// called while it runs.
async fn upload(
    store: FaultStore,
    settings: Settings,
    deadline: Duration,
    during: impl AsyncFnOnce(&mpsc::Sender<Msg>),
) -> Report {
    let (tx, rx) = mpsc::channel(8);
    let task = tokio::spawn(run(store, settings, rx));
    during(&tx).await;
    tx.send(Msg::Finish { deadline: Instant::now() + deadline }).await.unwrap();
    task.await.unwrap()
}

async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn every_sealed_file_is_uploaded_then_deleted_and_nothing_else_is_touched() {
    let (_scratch, root) = root("all");
    let _live = data_files(&root);
    let store = FaultStore::default();
    let report = upload(store.clone(), settings(&root), Duration::from_secs(10), async |_| {}).await;
    assert_eq!(store.keys(), [TIMELINE, STATS, SYS, SYS2]);
    assert_eq!(store.0.objects.lock().unwrap()[SYS], b"{\"Timestamp\": 1}\n");
    assert_eq!(report.counts.uploaded, 4);
    assert_eq!(report.counts.uploaded_bytes, 17 + 17 + 6 + 5);
    assert!(report.left.is_empty(), "{:?}", report.left);
    let on_disk = crate::commands::run::summary::files_under(&root);
    assert_eq!(
        on_disk,
        [
            ".tmp/0-algo-1/window/python_stats",
            "notes.txt",
            LIVE_TMP,
            "system/incremental/2020072013/.hidden.json"
        ]
    );
}

#[tokio::test]
async fn keep_local_records_uploads_and_a_restart_sends_nothing_again() {
    let (_scratch, root) = root("keep");
    let _live = data_files(&root);
    let store = FaultStore::default();
    let mut s = settings(&root);
    s.keep_local = true;
    let first = upload(store.clone(), s.clone(), Duration::from_secs(10), async |_| {}).await;
    assert_eq!(first.counts.uploaded, 4);
    assert!(root.join(SYS).is_file(), "kept");
    let ledger = std::fs::read_to_string(root.join(super::LEDGER)).unwrap();
    assert_eq!(ledger.lines().count(), 4, "{ledger}");

    // The same files again: the ledger says they are there, not even a HEAD is sent.
    let before = store.0.requests.load(Ordering::SeqCst);
    let second = upload(store.clone(), s.clone(), Duration::from_secs(10), async |_| {}).await;
    assert_eq!(second.counts, super::Counts::default());
    assert_eq!(store.0.requests.load(Ordering::SeqCst), before);

    // Without the ledger (a crash between the upload and the record): HEAD finds the
    // same bytes and nothing is sent twice.
    std::fs::remove_file(root.join(super::LEDGER)).unwrap();
    let third = upload(store.clone(), s, Duration::from_secs(10), async |_| {}).await;
    assert_eq!((third.counts.uploaded, third.counts.already_there), (0, 4));
    assert_eq!(store.0.put_order.lock().unwrap().len(), 4, "every key put once");
}

#[tokio::test]
async fn an_outage_only_delays_and_every_file_is_put_once() {
    let (_scratch, root) = root("outage");
    put(&root, SYS, "{\"Timestamp\": 1}\n");
    let store = FaultStore::default();
    store.0.down.store(true, Ordering::SeqCst);
    let s2 = store.clone();
    let r2 = root.clone();
    let report = upload(store.clone(), settings(&root), Duration::from_secs(10), async move |tx| {
        // Files keep coming while the store is down.
        for i in 0..5 {
            put(&r2, &format!("system/incremental/2020072014/159525720{i}.algo-1.json"), "{}\n");
            tx.send(Msg::Wake).await.unwrap();
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        wait_for("failed attempts", || s2.0.requests.load(Ordering::SeqCst) >= 5).await;
        assert!(s2.keys().is_empty());
        s2.0.down.store(false, Ordering::SeqCst);
    })
    .await;
    assert_eq!(store.keys().len(), 6);
    assert_eq!(store.0.put_order.lock().unwrap().len(), 6, "no file put twice");
    assert_eq!(report.counts.uploaded, 6);
    assert!(report.counts.failed_attempts >= 5, "{:?}", report.counts);
    assert!(report.left.is_empty());
}

#[tokio::test]
async fn markers_go_last_and_only_at_the_finish() {
    let (_scratch, root) = root("markers");
    let _live = data_files(&root);
    for m in trainprof_output::END_MARKERS {
        put(&root, m, "1595253700.000000\n");
    }
    let store = FaultStore::default();
    for m in trainprof_output::END_MARKERS {
        store.0.objects.lock().unwrap().insert(m.to_owned(), b"1500000000.000000\n".to_vec());
    }
    let s2 = store.clone();
    let report = upload(store.clone(), settings(&root), Duration::from_secs(10), async move |_| {
        wait_for("the data files", || s2.keys().len() == 6).await;
        // Several walks later the markers are still held back.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(s2.0.put_order.lock().unwrap().len(), 4);
    })
    .await;
    assert_eq!((report.counts.uploaded, report.counts.conflicts), (6, 0));
    assert_eq!(store.0.objects.lock().unwrap()["system/training_job_end.ts"], b"1595253700.000000\n");
    let order = store.0.put_order.lock().unwrap().clone();
    assert_eq!(order.len(), 6);
    let mut last_two = order[4..].to_vec();
    last_two.sort();
    assert_eq!(last_two, ["framework/training_job_end.ts", "system/training_job_end.ts"]);
}

#[tokio::test]
async fn with_the_store_down_the_finish_ends_at_its_deadline_and_keeps_every_file() {
    let (_scratch, root) = root("deadline");
    let _live = data_files(&root);
    for m in trainprof_output::END_MARKERS {
        put(&root, m, "1\n");
    }
    let store = FaultStore::default();
    store.0.down.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let report = upload(store.clone(), settings(&root), Duration::from_millis(300), async |_| {}).await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(3), "{took:?}");
    assert_eq!(
        report.left,
        [TIMELINE, STATS, "framework/training_job_end.ts", SYS, SYS2, "system/training_job_end.ts"]
    );
    assert!(
        report.last_error.as_deref().is_some_and(|e| e.contains("connection")),
        "{:?}",
        report.last_error
    );
    for rel in &report.left {
        assert!(root.join(rel).is_file(), "{rel} kept");
    }
}

#[tokio::test]
async fn a_fatal_error_probes_one_file_at_a_time_and_recovers() {
    let (_scratch, root) = root("fatal");
    let _live = data_files(&root);
    let store = FaultStore::default();
    *store.0.fatal.lock().unwrap() = Some("NoSuchBucket".to_owned());
    let s2 = store.clone();
    let report = upload(store.clone(), settings(&root), Duration::from_secs(10), async move |_| {
        wait_for("a few probes", || s2.0.requests.load(Ordering::SeqCst) >= 3).await;
        *s2.0.fatal.lock().unwrap() = None;
    })
    .await;
    assert_eq!(report.counts.uploaded, 4);
    // While failing, one request at a time: the probes are spaced by the fatal delay.
    assert!(report.counts.failed_attempts >= 3 && report.counts.failed_attempts < 10, "{:?}", report.counts);
}

#[tokio::test]
async fn a_fatal_refusal_at_the_end_ends_at_once_and_keeps_the_files() {
    let (_scratch, root) = root("fatal-end");
    let _live = data_files(&root);
    let store = FaultStore::default();
    *store.0.fatal.lock().unwrap() = Some("AccessDenied".to_owned());
    let mut s = settings(&root);
    s.policy.fatal = Duration::from_secs(3600);
    let started = Instant::now();
    let report = upload(store.clone(), s, Duration::from_secs(3600), async |_| {}).await;
    // One try after Finish (the probe), then the end: not the hour of the deadline.
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
    assert_eq!(report.counts.uploaded, 0);
    assert!(report.last_error.as_deref().is_some_and(|e| e.contains("AccessDenied")), "{report:?}");
    assert_eq!(report.left.len(), 4, "{:?}", report.left);
    for rel in &report.left {
        assert!(root.join(rel).is_file(), "{rel} kept");
    }
}

#[tokio::test]
async fn other_bytes_under_the_same_key_are_never_overwritten() {
    let (_scratch, root) = root("conflict");
    put(&root, SYS, "{\"Timestamp\": 1}\n");
    put(&root, SYS2, "{\"Timestamp\": 2}\n");
    let store = FaultStore::default();
    store.0.objects.lock().unwrap().insert(SYS.to_owned(), b"{\"Timestamp\": 9}\n".to_vec());
    let report = upload(store.clone(), settings(&root), Duration::from_secs(10), async |_| {}).await;
    assert_eq!(store.0.objects.lock().unwrap()[SYS], b"{\"Timestamp\": 9}\n");
    assert_eq!((report.counts.uploaded, report.counts.conflicts), (1, 1));
    assert_eq!(report.left, [SYS]);
    assert!(root.join(SYS).is_file());
}

#[tokio::test]
async fn a_full_spool_drops_the_oldest_files_and_counts_them() {
    let (_scratch, root) = root("spool");
    let store = FaultStore::default();
    store.0.down.store(true, Ordering::SeqCst);
    let names: Vec<String> =
        (0..6).map(|i| format!("system/incremental/2020072014/15952572{i}0.algo-1.json")).collect();
    // All there before the first walk: the spool bound goes by when a walk first saw a
    // file, then by name (never by mtime), so no file needs to be older than another.
    for n in &names {
        put(&root, n, &"x".repeat(99));
    }
    let mut s = settings(&root);
    s.spool_max_bytes = 350;
    let s2 = store.clone();
    let report = upload(store.clone(), s, Duration::from_secs(10), async move |_| {
        wait_for("a failed attempt", || s2.0.requests.load(Ordering::SeqCst) >= 1).await;
        s2.0.down.store(false, Ordering::SeqCst);
    })
    .await;
    assert_eq!(report.counts.spool_dropped, 3, "{:?}", report.counts);
    assert_eq!(report.counts.spool_dropped_bytes, 297);
    assert_eq!(store.keys(), names[3..].to_vec(), "the newest are kept and uploaded");
}

#[tokio::test]
async fn a_file_the_store_refuses_is_set_aside_and_the_others_go_on() {
    let (_scratch, root) = root("refused");
    let _live = data_files(&root);
    for m in trainprof_output::END_MARKERS {
        put(&root, m, "1595253700.000000\n");
    }
    let store = FaultStore::default();
    *store.0.refuse.lock().unwrap() = Some(SYS.to_owned());
    let report = upload(store.clone(), settings(&root), Duration::from_secs(10), async |_| {}).await;
    assert_eq!((report.counts.uploaded, report.counts.rejected), (5, 1), "{:?}", report.counts);
    assert_eq!(report.left, [SYS]);
    assert!(root.join(SYS).is_file());
    // No back-off: the refusal concerned that file only, and the markers still went.
    assert_eq!(store.0.put_order.lock().unwrap().len(), 5);
    assert!(store.keys().contains(&"system/training_job_end.ts".to_owned()));
}

#[tokio::test]
async fn requests_that_never_get_an_answer_count_as_failed_and_are_named() {
    let (_scratch, root) = root("no-answer");
    let _live = data_files(&root);
    let store = FaultStore::default();
    store.0.hang.store(true, Ordering::SeqCst);
    let report = upload(store.clone(), settings(&root), Duration::from_millis(300), async |_| {}).await;
    assert_eq!(report.counts.uploaded, 0);
    assert_eq!(report.counts.failed_attempts, 4, "the 4 requests in flight at the deadline");
    assert!(
        report.last_error.as_deref().is_some_and(|e| e.contains("did not answer 4 request(s)")),
        "{report:?}"
    );
    assert_eq!(report.left.len(), 4, "{:?}", report.left);
}

#[test]
fn a_flaky_store_is_said_once_per_30_s_with_counts() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut log = super::StateLog::default();
    // The first change is said at once.
    log.failed();
    log.change(at(0), "failing".to_owned());
    assert!(log.last == Some(at(0)) && log.held.is_none());
    // Changes within the 30 s are held back: only the latest state is kept.
    for s in 1..29 {
        if s % 2 == 1 {
            log.succeeded();
            log.change(at(s), "reachable again".to_owned());
        } else {
            log.failed();
            log.change(at(s), "failing".to_owned());
        }
        assert_eq!(log.flush(at(s)), None);
    }
    // After 30 s: one line, the latest state, with the counts since the last line.
    assert_eq!(
        log.flush(at(30)).as_deref(),
        Some("failing (14 failed attempts, 14 files sent in the last 30 s)")
    );
    assert_eq!(log.flush(at(31)), None, "nothing new");
    // A change after a quiet period is said at once.
    log.succeeded();
    log.change(at(100), "reachable again".to_owned());
    assert!(log.held.is_none() && log.last == Some(at(100)));
}

/// A sealed file swapped, after the walk and while the store was failing, for a hard
/// link to a file outside the output folder: the open file is not the one the walk saw,
/// so nothing of it is sent, and the planted link is left alone (named, counted).
#[tokio::test]
async fn a_file_swapped_for_a_hard_link_after_the_walk_is_never_sent() {
    let (_scratch, root) = root("swapped");
    let secret = root.with_extension("secret");
    std::fs::write(&secret, b"root only secret").unwrap();
    put(&root, TIMELINE, "[\n{}\n]");
    let store = FaultStore::default();
    store.0.down.store(true, Ordering::SeqCst);
    let (s2, r2, sec2) = (store.clone(), root.clone(), secret.clone());
    let report = upload(store.clone(), settings(&root), Duration::from_secs(5), async move |_| {
        wait_for("a failed put", || s2.0.requests.load(Ordering::SeqCst) >= 2).await;
        let p = r2.join(TIMELINE);
        let tmp = p.with_extension("new");
        std::fs::hard_link(&sec2, &tmp).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        s2.0.down.store(false, Ordering::SeqCst);
        // Two more walks: the swapped name is looked at again and refused.
        tokio::time::sleep(Duration::from_millis(300)).await;
    })
    .await;
    assert_eq!(store.0.objects.lock().unwrap().get(TIMELINE), None);
    assert!(report.counts.refused >= 1, "{:?}", report.counts);
    assert_eq!(std::fs::read(&secret).unwrap(), b"root only secret");
    assert!(root.join(TIMELINE).exists(), "the planted link is not deleted");
    std::fs::remove_file(&secret).unwrap();
}

/// A planted sparse file as large as the spool bound (taking no disk space), with a
/// far-future mtime, does not make the spool bound delete the agent's own files.
#[tokio::test]
async fn a_planted_sparse_file_does_not_fill_the_spool() {
    let (_scratch, root) = root("sparse-spool");
    put(&root, SYS, "{\"Timestamp\": 1}\n");
    let planted = root.join("framework/pevents/2099010100/4070908800000000_x_pythontimeline.json");
    std::fs::create_dir_all(planted.parent().unwrap()).unwrap();
    let f = std::fs::File::create(&planted).unwrap();
    f.set_len(1 << 29).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(4_070_908_800)).unwrap();
    drop(f);
    let store = FaultStore::default();
    store.0.down.store(true, Ordering::SeqCst);
    let mut s = settings(&root);
    s.spool_max_bytes = 1 << 29;
    let s2 = store.clone();
    let report = upload(store.clone(), s, Duration::from_millis(200), async move |_| {
        wait_for("a failed put", || s2.0.requests.load(Ordering::SeqCst) >= 1).await;
    })
    .await;
    assert_eq!(report.counts.spool_dropped, 0, "{:?}", report.counts);
    assert!(root.join(SYS).exists());
}
