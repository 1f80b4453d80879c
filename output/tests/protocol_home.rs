//! The protocol module (`output/src/protocol/`) is the only place that spells a metric or
//! an event name: this test reads the sources of the other crates and fails on a string
//! literal that spells one.
//!
//! How it finds them: every `.rs` file under `agent/`, `report/`, `hook-ffi/` and `config/`
//! (their `src/`, `examples/`, `benches/` and build scripts) is scanned by a small lexer
//! ([`sources`]) that knows comments, strings (`"…"`, `b"…"`, raw `r#"…"#`), character
//! literals and lifetimes. Test code is left out: the `tests/` folders, a `tests.rs` file,
//! and every item after `#[cfg(test)]` (a `mod tests { … }`, a test-only function, or the
//! file of a `#[cfg(test)] mod name;`). A test that spells the written bytes pins the format on
//! purpose: renaming a word in the protocol then fails that test, which is the point.
//!
//! A literal spells a word W of the vocabulary (every `Type`, fixed `Name` and `Dimension`
//! of [`metric`], every metadata event name and phase of [`timeline`]) when its text is W
//! (unless W is a plain lowercase word such as `cpu` or `cgroup`, which the code also uses
//! for other things: a sampler's name in the log, a cgroup controller), when it holds W in
//! JSON quotes (`{"Type":"cpu"…` in a format string), or, for a Name prefix P (`cpu`,
//! `gpu`, `device`, `pid`), when it is one word that starts with P and a `{`
//! (`format!("cpu{i}")`: the format of a Name that is data, which is [`metric::Name`]'s
//! alone; a log line such as `"gpu{index}: …"` is words, not a Name). A line that spells a
//! word for another reason says so with a `// not the protocol:` comment, and is let be.

mod sources;

use std::path::Path;

use sources::Literal;
use trainprof_output::protocol::{dump, metric, native_window, request, timeline, torch_trace};

/// The words no other crate may spell.
fn vocabulary() -> Vec<&'static str> {
    let mut w: Vec<&str> = metric::MetricType::ALL.iter().map(|t| t.as_str()).collect();
    w.extend(metric::name::ALL);
    w.extend(metric::dimension::ALL);
    w.extend(metric::dimension::TOP_PROCESS.concat());
    w.extend(metric::dimension::THROTTLE_FLAGS.map(|f| f.1));
    w.extend(timeline::METADATA);
    w.extend(timeline::PHASES);
    w.extend(dump_words());
    w.push(native_window::NATIVE_DIR);
    w.push(torch_trace::TRACE_DIR);
    w.extend(request::PREFIXES);
    w.extend(native_window::FILES);
    w.sort_unstable();
    w.dedup();
    w
}

/// The words of the hook's hang and crash dumps: the folder, its files, and the keys of
/// `stall.json` and `ended.json` that are not [`plain`] (`name`, `pid`, `step`, `kind` are
/// also the timeline's and the trace's keys, and the dump kinds the report's incident kinds:
/// [`dump`] is where they are defined, but a literal of them is no sign of a second format).
fn dump_words() -> Vec<&'static str> {
    let mut w = vec![dump::HANGS_DIR];
    w.extend(dump::FILES);
    w.extend(dump::KEYS.iter().filter(|k| !plain(k)));
    w.extend(dump::HOOK_KEYS.iter().filter(|k| !plain(k)));
    w.extend(dump::RING_WHATS.iter().filter(|k| !plain(k)));
    w
}

const ALLOW: &str = "// not the protocol:";

/// The string literals of `src` outside test code, and the names of the modules declared
/// `#[cfg(test)] mod name;` (their files are test code).
fn literals(src: &str) -> (Vec<Literal>, Vec<String>) {
    let s = sources::scan(src, ALLOW);
    (s.literals, s.test_mods)
}

/// A plain word (lowercase letters and `/`: `cpu`, `memory`, `i/o`, `cgroup`) is also an
/// ordinary word of the code (a sampler's name in the log, a cgroup controller, a column of
/// the report): it counts only in JSON quotes.
fn plain(word: &str) -> bool {
    word.bytes().all(|b| b.is_ascii_lowercase() || b == b'/')
}

/// The words `text` spells ([the rules above](self)).
fn spelled<'w>(text: &str, words: &[&'w str]) -> Vec<&'w str> {
    let quoted = words.iter().filter(|w| (text == **w && !plain(w)) || text.contains(&format!("\"{w}\"")));
    let one_word = !text.contains(char::is_whitespace);
    let formatted = metric::name::PREFIXES.iter().filter(|p| one_word && text.starts_with(&format!("{p}{{")));
    let mut found: Vec<&str> = quoted.chain(formatted).copied().collect();
    found.dedup();
    found
}

#[test]
fn no_other_crate_spells_a_metric_or_event_name() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let words = vocabulary();
    let files = sources::non_test_sources(workspace, &["agent", "report", "hook-ffi", "config"], ALLOW);
    let scanned = files.len();
    let mut found = Vec::new();
    for (f, s) in &files {
        for l in s.literals.iter().filter(|l| !l.allowed) {
            let rel = f.strip_prefix(workspace).unwrap_or(f).display().to_string();
            for w in spelled(&l.text, &words) {
                found.push(format!("{rel}:{}: {:?} spells {w:?}", l.line, l.text));
            }
        }
    }
    assert!(scanned > 50, "only {scanned} files scanned: is the workspace where it was?");
    assert!(
        found.is_empty(),
        "{} literals spell a word of the protocol; use the constants of trainprof_output::protocol \
         (or, where the word means something else, say so with `{ALLOW} …` on the line):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_lexer_finds_literals_outside_comments_and_test_code() {
    let src = r##"
// "cpu" in a comment
/* "gpu" /* nested */ "memory" */
fn f<'a>(x: &'a str) -> char { let _ = "CPUUtilization"; let _ = r#"{"Type":"host"}"#; '"' }
const Q: char = '\'';
fn g() { let _ = b"AllCores"; let _ = "Kernel"; // not the protocol: a test of the rule
}
#[cfg(test)]
fn only_in_tests() { let _ = "IOPS"; }
#[cfg(test)]
mod helpers;
#[cfg(test)]
mod tests {
    fn h() { let _ = "ProcessTree"; }
}
fn after() -> &'static str { "gpu{}" }
"##;
    let (lits, mods) = literals(src);
    let texts: Vec<_> = lits.iter().map(|l| (l.text.as_str(), l.line, l.allowed)).collect();
    assert_eq!(
        texts,
        [
            ("CPUUtilization", 4, false),
            (r#"{"Type":"host"}"#, 4, false),
            ("AllCores", 6, true),
            ("Kernel", 6, true),
            ("gpu{}", 16, false)
        ]
    );
    assert_eq!(mods, ["helpers"]);
    let words = vocabulary();
    assert_eq!(spelled(r#"{"Type":"host"}"#, &words), ["host"]);
    assert_eq!(spelled("host", &words), Vec::<&str>::new());
    assert_eq!(spelled("ProcessTree", &words), ["ProcessTree"]);
    assert_eq!(spelled("gpu{}", &words), ["gpu"]);
    assert_eq!(spelled("pid{pid}-{label}", &words), ["pid"]);
    assert_eq!(spelled(r#""pid": {os_pid}"#, &words), Vec::<&str>::new());
    assert_eq!(spelled("gpus", &words), Vec::<&str>::new());
    assert_eq!(spelled("gpu{i}: lost", &words), Vec::<&str>::new());
    assert_eq!(spelled("Step:ModeKeys.TRAIN", &words), ["Step:ModeKeys.TRAIN"]);
}
