//! Text a person reads from what the trainer wrote: control characters escaped, cut to a
//! length (`docs/report.md`, "Untrusted input"). The report shows names through it, and the
//! agent's stderr lines go through it too, so both escape the same way.

/// `s` as text a person reads: every [`is_terminal_control`] character as its escape (`\x1b`,
/// `\x00`, `\x0d`, `\u{9b}`, `\u{202e}`: the form the agent's stderr lines use), cut to at
/// most `max` bytes (then `…`). Every string the trainer wrote goes through this (or
/// [`shown`]) before it is shown. A backslash is left as it is: the text is for people.
pub fn printable(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max));
    let mut piece = String::new();
    for c in s.chars() {
        piece.clear();
        if is_terminal_control(c) {
            escape(&mut piece, c);
        } else {
            piece.push(c);
        }
        if out.len().saturating_add(piece.len()) > max {
            out.push('…');
            break;
        }
        out.push_str(&piece);
    }
    out
}

/// Whether a terminal or a page's text direction acts on `c`: C0 (tab and line feed
/// included), DEL, C1, and the bidirectional embeddings, overrides, isolates and marks.
pub fn is_terminal_control(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{061c}')
}

fn escape(out: &mut String, c: char) {
    use std::fmt::Write as _;
    if (c as u32) < 0x80 {
        let _ = write!(out, "\\x{:02x}", c as u32);
    } else {
        let _ = write!(out, "\\u{{{:x}}}", c as u32);
    }
}

/// `s` with its control characters as escapes ([`printable`], not cut), borrowed when it has
/// none: the names read from the trainer's files (a node, phase, event or function name) go
/// through it as they are read, so that the page, `--json` and stderr never carry a raw NUL,
/// ESC or CR (`docs/report.md`, "Untrusted input").
pub fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(is_terminal_control) {
        std::borrow::Cow::Owned(printable(s, usize::MAX))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}
