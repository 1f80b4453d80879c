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
    self as proto, Answer, AnswerKind, FORMAT_VERSION, Go, Presence, REQUEST_DIR, Request,
};
use trainprof_output::text::printable;

/// What a person asked for.
#[derive(Debug, Clone)]
pub struct TriggerArgs {
    /// The LocalPath (an `s3://` prefix is refused for now).
    pub target: String,
    /// The features' names, from `protocol::request::FEATURES`.
    pub features: Vec<&'static str>,
    pub stacks: bool,
    pub steps: u64,
    pub roundup: u64,
    pub wait: Duration,
}

/// Longest `--wait`.
pub const MAX_WAIT_S: f64 = 600.0;

/// How often the folder is looked at for answers.
const POLL: Duration = Duration::from_millis(20);

/// Exit status: a rank armed (0), none did (1), a mistake in what was typed or a target
/// that cannot be used (2).
const REACHED: u8 = 0;
const NOT_REACHED: u8 = 1;
const UNUSABLE: u8 = 2;

fn fail(status: u8, msg: &str) -> ExitCode {
    eprintln!("trainprof trigger: {msg}");
    ExitCode::from(status)
}

/// Runs `trainprof trigger`.
pub fn trigger(args: &TriggerArgs) -> ExitCode {
    if args.target.starts_with("s3://") {
        return fail(
            UNUSABLE,
            "an s3:// target is not supported yet: run trainprof trigger on each node with its LocalPath",
        );
    }
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
    let ranks = presences(&dir);
    if ranks.is_empty() {
        return fail(
            NOT_REACHED,
            &format!("no trainer running: no rank has announced itself in {}", dir.path().display()),
        );
    }
    let started = Instant::now();
    let now_us = now_us();
    let id = format!("{:x}{:x}", now_us, std::process::id());
    let request = Request {
        version: FORMAT_VERSION,
        id: id.clone(),
        features: args.features.iter().map(|f| (*f).to_owned()).collect(),
        stacks: args.stacks,
        steps: args.steps,
        roundup: args.roundup,
        requested_us: now_us,
        expires_us: now_us.saturating_add(i64::try_from(args.wait.as_micros()).unwrap_or(i64::MAX)),
    };
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
    let status = exchange(&dir, args, &request, &ranks, started);
    clean_up(&dir, &id);
    ExitCode::from(status)
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

/// The ranks whose presence files are in the folder (`rank-<node>-<pid>.json`), by key.
fn presences(dir: &Dir) -> Vec<String> {
    let mut out = Vec::new();
    for e in dir.entries().unwrap_or_default() {
        let Ok(name) = e.name else { continue };
        if e.kind != Kind::File || !name.starts_with(proto::PRESENCE_PREFIX) {
            continue;
        }
        let Ok(Some(bytes)) = dir.read(&name, proto::MAX_FILE_BYTES) else { continue };
        if let Ok(p) = proto::parse_presence(&bytes) {
            let Presence { node, pid, .. } = p;
            let key = proto::rank_key(&node, pid);
            if name == proto::presence_name(&key) && !out.contains(&key) {
                out.push(key);
            }
        }
    }
    out
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
        let read = read.and_then(|a| {
            if proto::rank_key(&a.node, a.pid) == rank && a.id == id {
                Ok(a)
            } else {
                Err("the answer's rank or id is not its file's".to_owned())
            }
        });
        out.push((rank.to_owned(), read));
    }
    out
}

/// Waits until every rank of `wanted` has answered with `prefix`, or until `deadline`.
fn wait_for(
    dir: &Dir,
    prefix: &str,
    id: &str,
    wanted: &[String],
    deadline: Instant,
) -> Vec<(String, Result<Answer, String>)> {
    loop {
        let got = answers(dir, prefix, id);
        let all = wanted.iter().all(|r| got.iter().any(|(g, _)| g == r));
        if all || Instant::now() >= deadline {
            return got;
        }
        std::thread::sleep(POLL);
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
fn exchange(dir: &Dir, args: &TriggerArgs, request: &Request, ranks: &[String], started: Instant) -> u8 {
    let id = &request.id;
    let half = started + args.wait / 2;
    let end = started + args.wait;
    let mut lines = Lines(Vec::new());
    let dumped = if request.stacks { stacks(dir, args, id, ranks, half, &mut lines) } else { 0 };
    if request.features.is_empty() {
        print_lines(&format!("trainprof trigger {id}: stacks of {dumped} of {} ranks", ranks.len()), &lines);
        if dumped == 0 {
            return fail_status("no rank dumped its stacks");
        }
        return REACHED;
    }
    let acks = wait_for(dir, proto::ACK_PREFIX, id, ranks, half);
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
                        args.wait.as_secs_f64() / 2.0
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
        print_lines(&format!("trainprof trigger {id}: no rank reached"), &lines);
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
    let written = serde_json::to_vec(&go)
        .map_err(std::io::Error::other)
        .and_then(|b| fs::write_new(dir, &proto::go_name(id), &std::process::id().to_string(), &b));
    if let Err(e) = written {
        eprintln!("trainprof trigger: cannot write the go-ahead: {e}");
        return UNUSABLE;
    }
    let armed = wait_for(dir, proto::ARMED_PREFIX, id, &go.ranks, end);
    let mut reached = 0usize;
    for (rank, step, ..) in &acked {
        match armed.iter().find(|(r, _)| r == rank).map(|(_, a)| a) {
            Some(Ok(a)) if a.answer == AnswerKind::Armed => {
                reached += 1;
                let files: Vec<String> = a
                    .files
                    .iter()
                    .map(|f| Path::new(&args.target).join(printable(f, 200)).display().to_string())
                    .collect();
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
    );
    if reached == 0 && dumped == 0 {
        return fail_status("no rank was reached in time (every rank missed the start step)");
    }
    REACHED
}

/// `--stacks`: each rank's answer (its dump's folder, or why not); the ranks that dumped.
fn stacks(
    dir: &Dir,
    args: &TriggerArgs,
    id: &str,
    ranks: &[String],
    until: Instant,
    lines: &mut Lines,
) -> usize {
    let got = wait_for(dir, proto::STACKS_PREFIX, id, ranks, until);
    let mut dumped = 0;
    for rank in ranks {
        match got.iter().find(|(r, _)| r == rank).map(|(_, a)| a) {
            Some(Ok(a)) if a.answer == AnswerKind::Dumped => {
                dumped += 1;
                let files: Vec<String> = a
                    .files
                    .iter()
                    .map(|f| Path::new(&args.target).join(printable(f, 200)).display().to_string())
                    .collect();
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

fn print_lines(head: &str, lines: &Lines) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{head}");
    for l in &lines.0 {
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
