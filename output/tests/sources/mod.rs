//! The workspace's Rust sources as the source checks read them (`protocol_home.rs`,
//! `string_errors.rs`): a small lexer that knows comments, strings (`"…"`, `b"…"`, raw
//! `r#"…"#`), character literals and lifetimes, and leaves out test code (the `tests/`
//! folders, a `tests.rs` file, and every item after `#[cfg(test)]`: a `mod tests { … }`, a
//! test-only function, or the file of a `#[cfg(test)] mod name;`).

// Each check uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A string literal found outside test code: its text (escapes `\"` and `\\` undone), its
/// line, and whether the line carries the allowing comment.
#[derive(Debug, PartialEq)]
pub struct Literal {
    pub text: String,
    pub line: usize,
    pub allowed: bool,
}

/// One file as [`scan`] reads it.
#[derive(Debug, Default)]
pub struct Scanned {
    pub literals: Vec<Literal>,
    /// The code outside comments, literals and test code: each character with its line.
    pub code: Vec<(char, usize)>,
    pub test_mods: Vec<String>,
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

/// `src` read by the lexer: the string literals outside test code (`allow`: the comment that
/// lets a line's literal be), the code outside comments, literals and test code, and the
/// names of the modules declared `#[cfg(test)] mod name;` (their files are test code).
pub fn scan(src: &str, allow: &str) -> Scanned {
    let c: Vec<char> = src.chars().collect();
    let lines: Vec<&str> = src.lines().collect();
    let allowed = |line: usize| lines.get(line - 1).is_some_and(|l| l.contains(allow));
    let mut out = Vec::new();
    let mut test_mods = Vec::new();
    let (mut i, mut line, mut depth) = (0, 1, 0usize);
    // `#[cfg(test)]` seen, its item not begun; the depth a test item's body closes at.
    let mut pending: Option<usize> = None;
    let mut skip_to: Option<usize> = None;
    let mut code = String::new();
    // The code outside test code, each character with its line; where the pending
    // `#[cfg(test)]` item began in it.
    let mut kept: Vec<(char, usize)> = Vec::new();
    let mut kept_at_cfg = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            // A space in the code kept: the words either side stay apart.
            if skip_to.is_none() {
                kept.push((' ', line));
            }
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
            if skip_to.is_none() {
                kept.push((' ', line));
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
        if skip_to.is_none() {
            kept.push((ch, line));
        }
        if code.ends_with("#[cfg(test)]") {
            pending = Some(depth);
            kept_at_cfg = kept.len().saturating_sub("#[cfg(test)]".len());
        }
        match ch {
            '{' => {
                if pending.take().is_some() && skip_to.is_none() {
                    skip_to = Some(depth);
                    kept.truncate(kept_at_cfg);
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
                if skip_to.is_none() {
                    kept.truncate(kept_at_cfg);
                }
                pending = None;
            }
            _ => {}
        }
        i += 1;
    }
    Scanned { literals: out, code: kept, test_mods }
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

/// Every non-test `.rs` file of the workspace's crates `crates` (their `src/`, `examples/`,
/// `benches/` and build scripts), each with its [`scan`]: the `tests/` folders, a `tests.rs`
/// file and the file of a `#[cfg(test)] mod name;` are left out, as is every item after
/// `#[cfg(test)]` within a file.
pub fn non_test_sources(workspace: &Path, crates: &[&str], allow: &str) -> Vec<(PathBuf, Scanned)> {
    let mut files = Vec::new();
    for krate in crates {
        for part in ["src", "examples", "benches"] {
            rs_files(&workspace.join(krate).join(part), &mut files);
        }
        files.push(workspace.join(krate).join("build.rs"));
    }
    let mut test_files: Vec<PathBuf> = Vec::new();
    let mut out = Vec::new();
    for f in files {
        let Ok(src) = std::fs::read_to_string(&f) else { continue };
        let scanned = scan(&src, allow);
        // Every file here is `<crate>/<part>/…/<name>.rs`.
        let (Some(dir), Some(stem)) = (f.parent(), f.file_stem()) else { continue };
        let own = if f.ends_with("mod.rs") || f.ends_with("lib.rs") || f.ends_with("main.rs") {
            dir.to_owned()
        } else {
            dir.join(stem)
        };
        for m in &scanned.test_mods {
            test_files.push(own.join(format!("{m}.rs")));
            test_files.push(own.join(m).join("mod.rs"));
        }
        if test_files.contains(&f) {
            continue;
        }
        out.push((f, scanned));
    }
    out
}
