//! `trainprof trigger`: profile a live job now, every rank on the same step
//! (docs/formats.md, "On-demand windows (`trainprof trigger`)"; docs/trigger.md).
//!
//! Two phases through the request folder `<LocalPath>/trigger/`: the request, which each
//! rank's trainer acknowledges at a step boundary with its step; then the go-ahead, the
//! first multiple of `--roundup` past the furthest rank plus its margin
//! (`protocol::request::choose_start`), which each rank arms if it is still before it. A rank
//! that does not answer in time is reported missed, never waited for past `--wait`. No
//! network: the folder is on the node's disk.

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use trainprof_output::fs::{self, Dir, Kind};
use trainprof_output::protocol::request::{
    self as proto, Answer, AnswerKind, FORMAT_VERSION, Go, REQUEST_DIR, Request,
};
use trainprof_output::text::printable;

/// What a person asked for.
#[derive(Debug, Clone)]
pub struct TriggerArgs {
    /// The LocalPath, or a job's `s3://bucket/prefix` (every node whose agent relays).
    pub target: String,
    /// The features' names, from `protocol::request::FEATURES`.
    pub features: Vec<&'static str>,
    pub stacks: bool,
    pub steps: u64,
    pub roundup: u64,
    /// `--wait`; `None`: [`DEFAULT_WAIT`] for a LocalPath, [`s3::DEFAULT_WAIT`] for S3.
    pub wait: Option<Duration>,
    /// `--s3-endpoint` (an `s3://` target).
    pub s3_endpoint: Option<String>,
}

/// `--wait`'s default for a LocalPath.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// Longest `--wait`.
pub const MAX_WAIT_S: f64 = 600.0;

/// How often the folder is looked at for answers.
const POLL: Duration = Duration::from_millis(20);

/// Exit status: a rank armed (0), none did (1), a mistake in what was typed or a target
/// that cannot be used (2).
const REACHED: u8 = 0;
const NOT_REACHED: u8 = 1;
const UNUSABLE: u8 = 2;

mod s3;

/// Where the exchange's files are: the node's request folder, or a job's S3 prefix, where
/// each node's agent relays (`s3.rs`).
trait Channel {
    /// How often to look.
    fn every(&self) -> Duration;
    /// Reads what is new.
    fn look(&mut self);
    /// The answers named `<prefix><id>-<rank>.json` seen so far, by rank.
    fn answers(&self, prefix: &str) -> Vec<(String, Result<Answer, String>)>;
    /// The ranks expected to answer, and whether that list is final.
    fn ranks(&self) -> (Vec<String>, bool);
    fn write_go(&mut self, go: &Go) -> std::io::Result<()>;
    /// Where a rank's files under `rel` (relative to its LocalPath) are, for people.
    fn file(&self, rel: &str) -> String;
    /// Lines after the ranks' (the nodes that did not relay).
    fn notes(&self) -> Vec<String>;
    /// Why no rank is expected.
    fn no_ranks(&self) -> String;
}

/// The node's request folder.
struct Local<'a> {
    dir: &'a Dir,
    id: String,
    ranks: Vec<String>,
    target: &'a str,
}

impl Channel for Local<'_> {
    fn every(&self) -> Duration {
        POLL
    }

    fn look(&mut self) {}

    fn answers(&self, prefix: &str) -> Vec<(String, Result<Answer, String>)> {
        answers(self.dir, prefix, &self.id)
    }

    fn ranks(&self) -> (Vec<String>, bool) {
        (self.ranks.clone(), true)
    }

    fn write_go(&mut self, go: &Go) -> std::io::Result<()> {
        serde_json::to_vec(go)
            .map_err(std::io::Error::other)
            .and_then(|b| {
                fs::write_new(self.dir, &proto::go_name(&self.id), &std::process::id().to_string(), &b)
            })
            .map(|_| ())
    }

    fn file(&self, rel: &str) -> String {
        Path::new(self.target).join(printable(rel, 200)).display().to_string()
    }

    fn notes(&self) -> Vec<String> {
        Vec::new()
    }

    fn no_ranks(&self) -> String {
        "no trainer running".to_owned()
    }
}

fn fail(status: u8, msg: &str) -> ExitCode {
    eprintln!("trainprof trigger: {msg}");
    ExitCode::from(status)
}

/// Runs `trainprof trigger`.
pub fn trigger(args: &TriggerArgs) -> ExitCode {
    if args.target.starts_with("s3://") {
        return s3::trigger(args);
    }
    let wait = args.wait.unwrap_or(DEFAULT_WAIT);
    let root = match Dir::open_root(Path::new(&args.target), false) {
        Ok(d) => d,
        Err(e) => return fail(UNUSABLE, &format!("{}: {e}", args.target)),
    };
    let dir = match root.sub(REQUEST_DIR, false) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return fail(
                NOT_REACHED,
                &format!(
                    "no trainer running: {} does not exist (the hook makes it when a trainer starts profiling)",
                    root.display(REQUEST_DIR).display()
                ),
            );
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return fail(NOT_REACHED, &not_allowed(&root));
        }
        Err(e) => return fail(UNUSABLE, &e.to_string()),
    };
    let euid = fs::euid();
    match fs::meta_of(&dir) {
        Ok(m) if m.uid != euid && euid != 0 => return fail(NOT_REACHED, &not_allowed(&root)),
        Ok(_) => {}
        Err(e) => return fail(UNUSABLE, &e.to_string()),
    }
    let ranks = proto::ranks_present(&dir);
    if ranks.is_empty() {
        return fail(
            NOT_REACHED,
            &format!("no trainer running: no rank has announced itself in {}", dir.path().display()),
        );
    }
    let started = Instant::now();
    let request = new_request(args, wait);
    let id = request.id.clone();
    let written = serde_json::to_vec(&request)
        .map_err(std::io::Error::other)
        .and_then(|b| fs::write_new(&dir, &proto::request_name(&id), &std::process::id().to_string(), &b));
    match written {
        Ok(true) => {}
        Ok(false) => return fail(UNUSABLE, &format!("{} exists already", proto::request_name(&id))),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return fail(NOT_REACHED, &not_allowed(&root));
        }
        Err(e) => return fail(UNUSABLE, &format!("cannot write the request: {e}")),
    }
    let mut local = Local { dir: &dir, id: id.clone(), ranks, target: &args.target };
    let status = exchange(&mut local, wait, &request, started);
    clean_up(&dir, &id);
    ExitCode::from(status)
}

/// The request `args` ask for, with a new id, alive for `wait`.
fn new_request(args: &TriggerArgs, wait: Duration) -> Request {
    let now_us = now_us();
    Request {
        version: FORMAT_VERSION,
        id: format!("{:x}{:x}", now_us, std::process::id()),
        features: args.features.iter().map(|f| (*f).to_owned()).collect(),
        stacks: args.stacks,
        steps: args.steps,
        roundup: args.roundup,
        requested_us: now_us,
        expires_us: now_us.saturating_add(i64::try_from(wait.as_micros()).unwrap_or(i64::MAX)),
    }
}

fn not_allowed(root: &Dir) -> String {
    format!(
        "not allowed: {} is not writable by you (uid {}); only the trainer's user and root may trigger",
        root.display(REQUEST_DIR).display(),
        fs::euid()
    )
}

fn now_us() -> i64 {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The answers to request `id` named `<prefix><id>-<rank>.json`, by rank.
fn answers(dir: &Dir, prefix: &str, id: &str) -> Vec<(String, Result<Answer, String>)> {
    let mut out = Vec::new();
    let head = format!("{prefix}{id}-");
    for e in dir.entries().unwrap_or_default() {
        let Ok(name) = e.name else { continue };
        let Some(rank) = name.strip_prefix(&head).and_then(|r| r.strip_suffix(proto::JSON_SUFFIX)) else {
            continue;
        };
        let read = match dir.read(&name, proto::MAX_FILE_BYTES) {
            Ok(Some(b)) => proto::parse_answer(&b).map_err(|r| r.0),
            Ok(None) => continue,
            Err(e) => Err(e.to_string()),
        };
        out.push((rank.to_owned(), checked(read, rank, id)));
    }
    out
}

/// An answer read from the file of `rank`'s answer to `id`: its rank and id must be the
/// file's.
fn checked(read: Result<Answer, String>, rank: &str, id: &str) -> Result<Answer, String> {
    read.and_then(|a| {
        if proto::rank_key(&a.node, a.pid) == rank && a.id == id {
            Ok(a)
        } else {
            Err("the answer's rank or id is not its file's".to_owned())
        }
    })
}

/// Waits until every rank expected (`wanted`, else the channel's list once final) has
/// answered with `prefix`, or until `deadline`.
fn wait_for(
    ch: &mut dyn Channel,
    prefix: &str,
    wanted: Option<&[String]>,
    deadline: Instant,
) -> Vec<(String, Result<Answer, String>)> {
    loop {
        ch.look();
        let got = ch.answers(prefix);
        let (ranks, known) = wanted.map_or_else(|| ch.ranks(), |w| (w.to_vec(), true));
        let all = known && ranks.iter().all(|r| got.iter().any(|(g, _)| g == r));
        if all || Instant::now() >= deadline {
            return got;
        }
        std::thread::sleep(ch.every());
    }
}

/// One line per rank on stdout.
struct Lines(Vec<String>);

impl Lines {
    fn rank(&mut self, rank: &str, text: &str) {
        self.0.push(format!("  {}: {text}", printable(rank, 200)));
    }
}

fn reason(a: &Answer) -> String {
    a.reason.as_deref().map(|r| format!(": {}", printable(r, 300))).unwrap_or_default()
}

/// The two phases; the exit status.
fn exchange(ch: &mut dyn Channel, wait: Duration, request: &Request, started: Instant) -> u8 {
    let id = &request.id;
    let half = started + wait / 2;
    let end = started + wait;
    let mut lines = Lines(Vec::new());
    let dumped = if request.stacks { stacks(ch, half, &mut lines) } else { 0 };
    if request.features.is_empty() {
        let ranks = ch.ranks().0;
        print_lines(
            &format!("trainprof trigger {id}: stacks of {dumped} of {} ranks", ranks.len()),
            &lines,
            ch,
        );
        if ranks.is_empty() {
            return fail_status(&ch.no_ranks());
        }
        if dumped == 0 {
            return fail_status("no rank dumped its stacks");
        }
        return REACHED;
    }
    let acks = wait_for(ch, proto::ACK_PREFIX, None, half);
    let ranks = &ch.ranks().0;
    if ranks.is_empty() {
        print_lines(&format!("trainprof trigger {id}: no rank reached"), &lines, ch);
        return fail_status(&ch.no_ranks());
    }
    let mut acked: Vec<(String, u64, Option<f64>, Option<i64>)> = Vec::new();
    let mut why_not: Vec<&'static str> = Vec::new();
    for rank in ranks {
        match acks.iter().find(|(r, _)| r == rank).map(|(_, a)| a) {
            Some(Ok(a)) if a.answer == AnswerKind::Ack => {
                acked.push((rank.clone(), a.step.unwrap_or(0), a.steps_per_s, a.at_us))
            }
            Some(Ok(a)) => {
                why_not.push(match a.answer {
                    AnswerKind::Disabled => "profiling disabled",
                    _ => "refused",
                });
                lines.rank(rank, &format!("not reached, {}{}", a.answer.as_str(), reason(a)));
            }
            Some(Err(e)) => {
                why_not.push("an answer that could not be read");
                lines
                    .rank(rank, &format!("not reached: its answer could not be read: {}", printable(e, 300)));
            }
            None => {
                why_not.push("no answer");
                lines.rank(
                    rank,
                    &format!(
                        "missed: no answer in {:.1} s (the trainer is outside a step, or not running)",
                        wait.as_secs_f64() / 2.0
                    ),
                );
            }
        }
    }
    let now = now_us();
    let seen: Vec<proto::Acked> = acked
        .iter()
        .map(|&(_, step, steps_per_s, at_us)| proto::Acked {
            step,
            steps_per_s,
            // A clock of another machine may be off: an answer from the future is fresh.
            age_s: at_us.map_or(0.0, |t| now.saturating_sub(t).max(0) as f64 / 1e6),
        })
        .collect();
    let Some(start) = proto::choose_start(&seen, request.roundup) else {
        print_lines(&format!("trainprof trigger {id}: no rank reached"), &lines, ch);
        why_not.sort_unstable();
        why_not.dedup();
        return fail_status(&format!("no rank was reached ({})", why_not.join(", ")));
    };
    let last = start.saturating_add(request.steps).saturating_sub(1);
    let go = Go {
        version: FORMAT_VERSION,
        id: id.clone(),
        start,
        ranks: acked.iter().map(|(r, ..)| r.clone()).collect(),
    };
    if let Err(e) = ch.write_go(&go) {
        eprintln!("trainprof trigger: cannot write the go-ahead: {e}");
        return UNUSABLE;
    }
    let armed = wait_for(ch, proto::ARMED_PREFIX, Some(&go.ranks), end);
    let mut reached = 0usize;
    for (rank, step, ..) in &acked {
        match armed.iter().find(|(r, _)| r == rank).map(|(_, a)| a) {
            Some(Ok(a)) if a.answer == AnswerKind::Armed => {
                reached += 1;
                let files: Vec<String> = a.files.iter().map(|f| ch.file(f)).collect();
                let note =
                    a.reason.as_deref().map(|r| format!(" ({})", printable(r, 300))).unwrap_or_default();
                lines.rank(
                    rank,
                    &format!(
                        "reached at step {step}, steps {start}..={last}; files under {}{note}",
                        files.join(", ")
                    ),
                );
            }
            Some(Ok(a)) => lines.rank(rank, &format!("{}{}", a.answer.as_str(), reason(a))),
            Some(Err(e)) => lines.rank(rank, &format!("its answer could not be read: {}", printable(e, 300))),
            None => lines.rank(
                rank,
                &format!("missed: acknowledged at step {step}, then no answer before --wait ran out"),
            ),
        }
    }
    let features =
        if request.features.is_empty() { "nothing".to_owned() } else { request.features.join(", ") };
    print_lines(
        &format!(
            "trainprof trigger {id}: {features} for steps {start}..={last} (a multiple of {}); {reached} of {} ranks armed",
            request.roundup,
            ranks.len()
        ),
        &lines,
        ch,
    );
    if reached == 0 && dumped == 0 {
        return fail_status("no rank was reached in time (every rank missed the start step)");
    }
    REACHED
}

/// `--stacks`: each rank's answer (its dump's folder, or why not); the ranks that dumped.
fn stacks(ch: &mut dyn Channel, until: Instant, lines: &mut Lines) -> usize {
    let got = wait_for(ch, proto::STACKS_PREFIX, None, until);
    let mut dumped = 0;
    for rank in &ch.ranks().0 {
        match got.iter().find(|(r, _)| r == rank).map(|(_, a)| a) {
            Some(Ok(a)) if a.answer == AnswerKind::Dumped => {
                dumped += 1;
                let files: Vec<String> = a.files.iter().map(|f| ch.file(f)).collect();
                lines.rank(rank, &format!("stacks dumped in {}", files.join(", ")));
            }
            Some(Ok(a)) => {
                lines.rank(rank, &format!("stacks not dumped, {}{}", a.answer.as_str(), reason(a)))
            }
            Some(Err(e)) => {
                lines.rank(rank, &format!("stacks: its answer could not be read: {}", printable(e, 300)))
            }
            None => lines.rank(rank, "stacks: no answer in time"),
        }
    }
    dumped
}

fn fail_status(msg: &str) -> u8 {
    eprintln!("trainprof trigger: {msg}");
    NOT_REACHED
}

fn print_lines(head: &str, lines: &Lines, ch: &dyn Channel) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{head}");
    for l in lines.0.iter().chain(&ch.notes()) {
        let _ = writeln!(out, "{l}");
    }
}

/// Removes the request, the go-ahead and the answers (regular files only, never through a
/// link): the folder keeps only the ranks' presence files between requests.
fn clean_up(dir: &Dir, id: &str) {
    for e in dir.entries().unwrap_or_default() {
        let Ok(name) = e.name else { continue };
        let ours =
            name == proto::request_name(id) || name == proto::go_name(id) || proto::is_answer_to(&name, id);
        if ours && e.kind == Kind::File {
            let _ = dir.unlink(&name);
        }
    }
}
