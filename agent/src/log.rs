//! The agent's log: one line per state change on stderr, `trainprof: <message>`, never one
//! per tick. (A tracing subscriber would cost more build time than this whole crate.)
//!
//! Every line goes through [`redact`]: the user info of any URL in it (`--s3-endpoint
//! http://user:pass@host`, an error chain that quotes the URL) never reaches the log
//! (docs/run.md, "Secrets"), and through [`printable`]: names the
//! trainer wrote (ranks, phases, files, the findings' summaries that quote them) reach a
//! terminal, so no control character or escape sequence in them does.

use std::borrow::Cow;
use std::fmt;
use std::io::Write as _;

/// Writes one line, redacted; a closed stderr is ignored.
pub fn line(args: fmt::Arguments<'_>) {
    let text = args.to_string();
    let _ = writeln!(std::io::stderr().lock(), "trainprof: {}", printable(&redact(&one_line(&text))));
}

/// `text` without anything a terminal acts on: C0 controls (tab included), DEL and C1
/// controls, and the Unicode controls that reorder text (bidirectional overrides and
/// isolates), each shown as its escape (`\x1b`, `\x7f`, `\u{9b}`, `\u{202e}`). An escape
/// sequence (`ESC ] 0 ; title BEL`, `ESC [ 8 m`) then stays visible as text and does nothing.
/// A backslash is left as it is: the output is for people, not a format to parse back. The
/// report escapes what it shows the same way ([`trainprof_output::text`]).
pub fn printable(text: &str) -> Cow<'_, str> {
    trainprof_output::text::shown(text)
}

/// `text` on one line: a message with line breaks in it (an error chain that lists its
/// sources on lines of their own) keeps its non-empty lines, trimmed, `; `-separated.
pub fn one_line(text: &str) -> Cow<'_, str> {
    if !text.contains(['\n', '\r']) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.split(['\n', '\r']).map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; "),
    )
}

/// `log!("cannot read {}: {e}", path.display())`
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => { $crate::log::line(format_args!($($arg)*)) };
}

/// `text` with the user info of every URL in it replaced by `***`
/// (`http://user:pass@host/x` → `http://***@host/x`). A URL runs from its `://` to the next
/// white space or quote; everything up to its last `@` is hidden, so a password with a
/// raw `/` or `@` in it is hidden too (at worst, a path with an `@` is hidden with it).
pub fn redact(text: &str) -> Cow<'_, str> {
    if !text.contains("://") || !text.contains('@') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>'))
            .unwrap_or(tail.len());
        let url = &tail[..end];
        match url.rfind('@') {
            Some(at) => {
                out.push_str("***");
                out.push_str(&url[at..]);
            }
            None => out.push_str(url),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::{one_line, printable, redact};

    #[test]
    fn terminal_escapes_are_shown_not_obeyed() {
        // A rank named to retitle the terminal, and one to hide what follows.
        assert_eq!(
            printable("finding: StepOutlier: rank 0-\x1b]0;owned\x07algo-1: 12 slow steps"),
            "finding: StepOutlier: rank 0-\\x1b]0;owned\\x07algo-1: 12 slow steps"
        );
        assert_eq!(printable("\x1b[8mhidden\x1b[0m"), "\\x1b[8mhidden\\x1b[0m");
        // DEL, a C1 CSI, a tab, a right-to-left override; plain text and non-ASCII letters stay.
        assert_eq!(printable("a\x7fb\u{9b}2Jc\td\u{202e}e"), "a\\x7fb\\u{9b}2Jc\\x09d\\u{202e}e");
        assert_eq!(printable("µs, ü, 日本, \\x1b"), "µs, ü, 日本, \\x1b");
        assert!(matches!(printable("plain"), std::borrow::Cow::Borrowed(_)));
        for s in ["\x1b]0;t\x07", "\x1b[8m", "\u{85}", "\u{9b}", "\x00", "\u{2066}"] {
            assert!(
                !printable(s).chars().any(|c| c.is_control() || ('\u{2066}'..='\u{2069}').contains(&c)),
                "{s:?}"
            );
        }
    }

    #[test]
    fn a_message_with_line_breaks_is_one_line() {
        assert_eq!(one_line("plain"), "plain");
        assert_eq!(
            one_line("no credentials. Attempted:\n  Environment: not set\r\n\n  Profile: off"),
            "no credentials. Attempted:; Environment: not set; Profile: off"
        );
    }

    #[test]
    fn user_info_is_hidden_wherever_a_url_appears() {
        for (text, want) in [
            ("via http://user:pass@127.0.0.1:9000", "via http://***@127.0.0.1:9000"),
            ("http://AKIA:s3cr%2Ft@host/bucket/key?x=1", "http://***@host/bucket/key?x=1"),
            (
                "dispatch failure: error sending request for url (https://u:p@h:1/b/k): refused",
                "dispatch failure: error sending request for url (https://***@h:1/b/k): refused",
            ),
            ("two: http://a:b@x and \"https://c:d@y/\"", "two: http://***@x and \"https://***@y/\""),
            // A raw `/` or `@` in the password: hidden all the same.
            ("http://u:pa/ss@host/k", "http://***@host/k"),
            ("http://u:p@ss@host", "http://***@host"),
            ("http://[::1]:9000 s3://bucket/prefix a@b", "http://[::1]:9000 s3://bucket/prefix a@b"),
            ("no url here, user@example.com", "no url here, user@example.com"),
        ] {
            assert_eq!(redact(text), want, "{text}");
        }
    }
}
