//! The protocol module (`output/src/protocol/`) is the only place that spells a metric or
//! an event name: this test reads the sources of the other crates and fails on a string
//! literal that spells one.
//!
//! How it finds them: every `.rs` file under `agent/`, `report/`, `hook-ffi/` and `config/`
//! (their `src/`, `examples/`, `benches/` and build scripts) is scanned by a small lexer that
//! knows comments, strings (`"…"`, `b"…"`, raw `r#"…"#`), character literals and
//! lifetimes. Test code is left out: the `tests/` folders, a `tests.rs` file, and every item
//! after `#[cfg(test)]` (a `mod tests { … }`, a test-only function, or the file of a
//! `#[cfg(test)] mod name;`). A test that spells the written bytes pins the format on
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

use std::path::{Path, PathBuf};

use trainprof_output::protocol::{dump, metric, native_window, request, timeline};

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
    w.extend(request::PREFIXES);
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
    w
}

/// A string literal found outside test code: its text (escapes `\"` and `\\` undone), its
/// line, and whether the line carries the allowing comment.
#[derive(Debug, PartialEq)]
struct Literal {
    text: String,
    line: usize,
    allowed: bool,
}

/// The character at `i`, or NUL past the end.
fn peek(c: &[char], i: usize) -> char {
    c.get(i).copied().unwrap_or('\0')
}

/// The text of a string literal whose body starts at `j`, and the index past its end; the
/// lines it spans are added to `line`. A raw string (`raw`: its number of `#`s) has no
/// escapes; in another, `\"` and `\\` are undone and an escaped line end is dropped.
fn string_body(c: &[char], mut j: usize, raw: Option<usize>, line: &mut usize) -> (String, usize) {
    let hashes = raw.unwrap_or(0);
    let mut text = String::new();
    while let Some(&x) = c.get(j) {
        match x {
            '\\' if raw.is_none() => {
                let next = peek(c, j + 1);
                match next {
                    '"' | '\\' => text.push(next),
                    '\n' => *line += 1,
                    other => {
                        text.push('\\');
                        text.push(other);
                    }
                }
                j += 2;
            }
            '"' if (1..=hashes).all(|h| c.get(j + h) == Some(&'#')) => return (text, j + 1 + hashes),
            _ => {
                *line += usize::from(x == '\n');
                text.push(x);
                j += 1;
            }
        }
    }
    (text, j)
}

const ALLOW: &str = "// not the protocol:";

/// The string literals of `src` outside test code, and the names of the modules declared
/// `#[cfg(test)] mod name;` (their files are test code).
fn literals(src: &str) -> (Vec<Literal>, Vec<String>) {
    let c: Vec<char> = src.chars().collect();
    let lines: Vec<&str> = src.lines().collect();
    let allowed = |line: usize| lines.get(line - 1).is_some_and(|l| l.contains(ALLOW));
    let mut out = Vec::new();
    let mut test_mods = Vec::new();
    let (mut i, mut line, mut depth) = (0, 1, 0usize);
    // `#[cfg(test)]` seen, its item not begun; the depth a test item's body closes at.
    let mut pending: Option<usize> = None;
    let mut skip_to: Option<usize> = None;
    let mut code = String::new();
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        if ch == '/' && peek(&c, i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if ch == '/' && peek(&c, i + 1) == '*' {
            let mut nest = 0;
            while i < c.len() {
                if c[i] == '/' && peek(&c, i + 1) == '*' {
                    nest += 1;
                    i += 2;
                } else if c[i] == '*' && peek(&c, i + 1) == '/' {
                    nest -= 1;
                    i += 2;
                    if nest == 0 {
                        break;
                    }
                } else {
                    line += usize::from(c[i] == '\n');
                    i += 1;
                }
            }
            continue;
        }
        let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        // A string: "…" and b"…" (escapes), raw r"…", r#"…"#, br#"…"# (its `#`s close it).
        let raw_at = if ch == 'r' && !ident_before {
            Some(i + 1)
        } else if ch == 'b' && peek(&c, i + 1) == 'r' && !ident_before {
            Some(i + 2)
        } else {
            None
        };
        let mut string = None;
        if let Some(mut j) = raw_at {
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) == Some(&'"') {
                string = Some((j + 1, Some(hashes)));
            }
        }
        if string.is_none() && (ch == '"' || (ch == 'b' && peek(&c, i + 1) == '"' && !ident_before)) {
            string = Some((i + if ch == 'b' { 2 } else { 1 }, None));
        }
        if let Some((body, raw)) = string {
            let start_line = line;
            let (text, end) = string_body(&c, body, raw, &mut line);
            if skip_to.is_none() {
                out.push(Literal { text, line: start_line, allowed: allowed(start_line) });
            }
            i = end;
            continue;
        }
        if ch == '\'' {
            // A character literal ('a', '\n', '"') or a lifetime ('a).
            if peek(&c, i + 1) == '\\' {
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if peek(&c, i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
            continue;
        }
        // Code.
        code.push(ch);
        if code.ends_with("#[cfg(test)]") {
            pending = Some(depth);
        }
        match ch {
            '{' => {
                if pending.take().is_some() && skip_to.is_none() {
                    skip_to = Some(depth);
                }
                depth += 1;
            }
            '}' => {
                depth = depth.saturating_sub(1);
                if skip_to == Some(depth) {
                    skip_to = None;
                }
            }
            ';' if pending.is_some() => {
                // `#[cfg(test)] mod name;` (its file is test code) or `use …;`.
                let decl = code.rsplit("#[cfg(test)]").next().unwrap_or("").trim().to_owned();
                if let Some(name) = decl.strip_prefix("mod ").map(|n| n.trim_end_matches(';').trim()) {
                    test_mods.push(name.to_owned());
                }
                pending = None;
            }
            _ => {}
        }
        i += 1;
    }
    (out, test_mods)
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

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            if name != "tests" {
                rs_files(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(p);
        }
    }
}

#[test]
fn no_other_crate_spells_a_metric_or_event_name() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let words = vocabulary();
    let mut files = Vec::new();
    for krate in ["agent", "report", "hook-ffi", "config"] {
        for part in ["src", "examples", "benches"] {
            rs_files(&workspace.join(krate).join(part), &mut files);
        }
        files.push(workspace.join(krate).join("build.rs"));
    }
    let mut scanned = 0;
    let mut test_files: Vec<PathBuf> = Vec::new();
    let mut found = Vec::new();
    for f in &files {
        let Ok(src) = std::fs::read_to_string(f) else { continue };
        let (lits, test_mods) = literals(&src);
        let dir = f.parent().expect("a folder");
        let own = if f.ends_with("mod.rs") || f.ends_with("lib.rs") || f.ends_with("main.rs") {
            dir.to_owned()
        } else {
            dir.join(f.file_stem().expect("a name"))
        };
        for m in test_mods {
            test_files.push(own.join(format!("{m}.rs")));
            test_files.push(own.join(&m).join("mod.rs"));
        }
        if test_files.contains(f) {
            continue;
        }
        scanned += 1;
        for l in lits.iter().filter(|l| !l.allowed) {
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
