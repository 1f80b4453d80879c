//! Errors are typed below the binary's edge (ARCHITECTURE.md, "Around the code": errors):
//! this test reads the sources of the agent, the protocol, the config, the hook and the report, and fails
//! on a `Result<…, String>` outside the edge, `agent/src/main.rs` (clap's value parsers) and
//! `agent/src/commands/` (where a command turns an error into its one line and its exit
//! status).
//!
//! How it finds them: the lexer of [`sources`] (the one `protocol_home.rs` reads with) keeps
//! the code outside comments, string literals and test code; in it, every `Result<` is read
//! to its closing `>`, and its last argument at the top level (`String` or
//! `std::string::String`) is the error type. `io::Result<T>` and other one-argument aliases
//! are let be.

mod sources;

use std::path::Path;

/// The crates read, and the files and folders (relative to the workspace, `/` at the end for
/// a folder) where an error may be a `String`.
const CRATES: [&str; 5] = ["agent", "output", "config", "hook-ffi", "report"];
const EDGE: [&str; 2] = ["agent/src/main.rs", "agent/src/commands/"];

/// Each `Result<…, String>` in `code` (a file's code as [`sources::scan`] keeps it): its
/// line and its text, spaces squeezed.
fn string_errors(code: &[(char, usize)]) -> Vec<(usize, String)> {
    let text: Vec<char> = code.iter().map(|&(c, _)| c).collect();
    let mut found = Vec::new();
    let word: Vec<char> = "Result<".chars().collect();
    let mut i = 0;
    while i + word.len() <= text.len() {
        let ident_before = i > 0 && (text[i - 1].is_alphanumeric() || text[i - 1] == '_');
        if ident_before || text[i..i + word.len()] != word[..] {
            i += 1;
            continue;
        }
        // The arguments, split at the top level, up to the closing `>`.
        let (mut depth, mut j) = (0usize, i + word.len());
        let mut args = vec![String::new()];
        while let Some(&c) = text.get(j) {
            match c {
                '<' | '(' | '[' => depth += 1,
                // `->` in a closure or `fn` type is no bracket.
                '>' if j > 0 && text[j - 1] == '-' => {}
                '>' | ')' | ']' if depth == 0 => break,
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => {
                    args.push(String::new());
                    j += 1;
                    continue;
                }
                _ => {}
            }
            if let Some(a) = args.last_mut() {
                a.push(c);
            }
            j += 1;
        }
        let err = args.last().map(|a| a.split_whitespace().collect::<String>()).unwrap_or_default();
        if args.len() == 2 && (err == "String" || err == "std::string::String") {
            let shown: String = text[i..=j.min(text.len() - 1)].iter().collect();
            found.push((code[i].1, shown.split_whitespace().collect::<Vec<_>>().join(" ")));
        }
        i = j.max(i + 1);
    }
    found
}

fn at_edge(rel: &str) -> bool {
    EDGE.iter().any(|e| if e.ends_with('/') { rel.starts_with(e) } else { rel == *e })
}

#[test]
fn errors_are_strings_only_at_the_binarys_edge() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let files = sources::non_test_sources(workspace, &CRATES, "");
    assert!(files.len() > 50, "only {} files scanned: is the workspace where it was?", files.len());
    let mut found = Vec::new();
    for (f, s) in &files {
        let rel = f.strip_prefix(workspace).unwrap_or(f).display().to_string();
        if at_edge(&rel) {
            continue;
        }
        for (line, text) in string_errors(&s.code) {
            found.push(format!("{rel}:{line}: {text}"));
        }
    }
    assert!(
        found.is_empty(),
        "{} `Result<…, String>` below the binary's edge; give the module a typed error (an enum \
         with Display and std::error::Error: ARCHITECTURE.md, \"Around the code\") and turn it into a \
         string only in agent/src/main.rs or a command:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_check_finds_string_errors_in_code_only() {
    let src = r##"
// fn a() -> Result<(), String> in a comment
fn b() -> Result<(Vec<u8>, Option<u32>), String> { let _ = "Result<(), String>"; todo() }
fn c() -> io::Result<String> { x }
fn d() -> Result<String, Error> { x }
type Fetched = (usize, Result<(u64, bool),
    std::string::String>);
fn e() -> (Result<(), MyError>, u8) { let f = |x| -> Result<(), String> { Ok(()) }; }
fn g(h: impl Fn() -> u8) -> Result<u8, Box<dyn Fn(u8) -> String>> { x }
#[cfg(test)]
fn only_in_tests() -> Result<(), String> { Ok(()) }
#[cfg(test)]
mod tests {
    fn t() -> Result<(), String> { Ok(()) }
}
"##;
    let s = sources::scan(src, "");
    let lines: Vec<usize> = string_errors(&s.code).into_iter().map(|(l, _)| l).collect();
    assert_eq!(lines, [3, 6, 8]);
    assert_eq!(string_errors(&s.code)[1].1, "Result<(u64, bool), std::string::String>", "the text as shown");
    assert!(at_edge("agent/src/main.rs") && at_edge("agent/src/commands/report.rs"));
    assert!(!at_edge("agent/src/s3/download.rs") && !at_edge("agent/src/main.rs.bak"));
}
