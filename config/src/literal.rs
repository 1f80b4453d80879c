//! The sub-config strings: Python dict literals, read without evaluating anything.
//!
//! The SageMaker SDK writes `{"StartStep": 5, "NumSteps": 1, }` (trailing comma, not
//! JSON), smdebug's tests write `{'StartStep': 3}` and JSON-looking strings with quoted
//! numbers. smdebug runs `eval()` on them; we parse the literal subset instead:
//! dicts, lists and tuples, strings in either quote (with `r`/`u` prefixes and Python's
//! escapes), ints (with `_`, `0x`/`0o`/`0b`), floats, `True`/`False`/`None` and, for
//! people who write JSON, `true`/`false`/`null`. Any other name is an error: nothing is
//! ever looked up or called.
//!
//! The result is a [`serde_json::Value`], so the code that reads a sub-config is the same
//! whether the user wrote a string or a plain JSON object.

use std::fmt;

use serde_json::{Map, Number, Value};

/// Nesting deeper than this is refused, so hostile input cannot exhaust the stack.
const MAX_DEPTH: usize = 32;

/// Why a literal could not be read; `offset` counts characters from the start (0-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiteralError {
    pub offset: usize,
    pub message: String,
}

impl fmt::Display for LiteralError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at character {})", self.message, self.offset + 1)
    }
}

impl std::error::Error for LiteralError {}

/// Parses one Python literal (the whole input, surrounding whitespace allowed).
pub fn parse(text: &str) -> Result<Value, LiteralError> {
    let mut p = Parser { s: text.as_bytes(), text, pos: 0 };
    p.literal().map_err(|e| LiteralError {
        // The parser counts bytes; people count characters.
        offset: text.get(..e.offset).map_or(e.offset, |t| t.chars().count()),
        ..e
    })
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn literal(&mut self) -> Result<Value, LiteralError> {
        self.skip_space();
        if self.pos == self.s.len() {
            return Err(self.err("empty string, expected a dict such as {\"StartStep\": 5}"));
        }
        let v = self.value(0)?;
        self.skip_space();
        if self.pos != self.s.len() {
            return Err(self.err("unexpected text after the end of the literal"));
        }
        Ok(v)
    }

    fn err(&self, message: impl Into<String>) -> LiteralError {
        LiteralError { offset: self.pos, message: message.into() }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => self.pos += 1,
                // A backslash-newline joins lines, as in Python source.
                b'\\' if self.s.get(self.pos + 1) == Some(&b'\n') => self.pos += 2,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, LiteralError> {
        if depth >= MAX_DEPTH {
            return Err(self.err("nested too deeply"));
        }
        self.skip_space();
        match self.peek() {
            None => Err(self.err("unexpected end, expected a value")),
            Some(b'{') => self.dict(depth),
            Some(b'[') => self.sequence(b']', depth),
            Some(b'(') => self.sequence(b')', depth),
            Some(b'"' | b'\'') => self.string(false).map(Value::String),
            Some(b'+' | b'-' | b'.' | b'0'..=b'9') => self.number(),
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => self.name(),
            Some(_) => Err(self.err(format!("unexpected character {:?}", self.char_here()))),
        }
    }

    fn char_here(&self) -> char {
        self.text.get(self.pos..).and_then(|t| t.chars().next()).unwrap_or('?')
    }

    fn expect(&mut self, c: u8) -> Result<(), LiteralError> {
        self.skip_space();
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.err(format!("expected '{}'", c as char)))
        }
    }

    fn dict(&mut self, depth: usize) -> Result<Value, LiteralError> {
        self.pos += 1; // '{'
        let mut map = Map::new();
        loop {
            self.skip_space();
            if self.peek() == Some(b'}') {
                self.pos += 1;
                return Ok(Value::Object(map));
            }
            let key_at = self.pos;
            let key = match self.value(depth + 1)? {
                Value::String(k) => k,
                _ => {
                    return Err(LiteralError { offset: key_at, message: "dict keys must be strings".into() });
                }
            };
            self.expect(b':')?;
            let v = self.value(depth + 1)?;
            // Python keeps the last of two equal keys.
            map.shift_remove(&key);
            map.insert(key, v);
            self.skip_space();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {}
                _ => return Err(self.err("expected ',' or '}'")),
            }
        }
    }

    fn sequence(&mut self, close: u8, depth: usize) -> Result<Value, LiteralError> {
        self.pos += 1; // '[' or '('
        let mut items = Vec::new();
        loop {
            self.skip_space();
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok(Value::Array(items));
            }
            items.push(self.value(depth + 1)?);
            self.skip_space();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(c) if c == close => {}
                _ => return Err(self.err(format!("expected ',' or '{}'", close as char))),
            }
        }
    }

    fn name(&mut self) -> Result<Value, LiteralError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_') {
            self.pos += 1;
        }
        let word = &self.text[start..self.pos];
        // String prefixes: r"..", u"..", R'..' (bytes and f-strings are not literals we accept).
        if matches!(self.peek(), Some(b'"' | b'\'')) {
            match word {
                "r" | "R" => return self.string(true).map(Value::String),
                "u" | "U" => return self.string(false).map(Value::String),
                _ => {}
            }
        }
        match word {
            "True" | "true" => Ok(Value::Bool(true)),
            "False" | "false" => Ok(Value::Bool(false)),
            "None" | "null" => Ok(Value::Null),
            _ => Err(LiteralError {
                offset: start,
                message: format!(
                    "{word:?} is not a literal (only strings, numbers, True, False and None; nothing is evaluated)"
                ),
            }),
        }
    }

    fn string(&mut self, raw: bool) -> Result<String, LiteralError> {
        let start = self.pos;
        let quote = self.s[self.pos];
        if self.s.get(self.pos + 1) == Some(&quote) && self.s.get(self.pos + 2) == Some(&quote) {
            return Err(self.err("triple-quoted strings are not supported"));
        }
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(LiteralError { offset: start, message: "string is not closed".into() });
            };
            match c {
                _ if c == quote => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\n' => {
                    return Err(LiteralError {
                        offset: start,
                        message: "string is not closed before the end of the line".into(),
                    });
                }
                b'\\' if raw => {
                    // In a raw string a backslash stays, and still protects the next quote.
                    out.push('\\');
                    self.pos += 1;
                    if let Some(n) = self.peek().filter(|&n| n == quote || n == b'\\') {
                        out.push(n as char);
                        self.pos += 1;
                    }
                }
                b'\\' => self.escape(&mut out)?,
                _ => {
                    let ch = self.char_here();
                    out.push(ch);
                    self.pos += ch.len_utf8();
                }
            }
        }
    }

    /// One backslash escape, as Python 3 reads it in a `str` literal.
    fn escape(&mut self, out: &mut String) -> Result<(), LiteralError> {
        let at = self.pos;
        self.pos += 1; // the backslash
        let Some(c) = self.peek() else {
            return Err(self.err("string ends with a backslash"));
        };
        self.pos += 1;
        let simple = match c {
            b'\n' => Some(None),
            b'\\' => Some(Some('\\')),
            b'\'' => Some(Some('\'')),
            b'"' => Some(Some('"')),
            b'a' => Some(Some('\x07')),
            b'b' => Some(Some('\x08')),
            b'f' => Some(Some('\x0c')),
            b'n' => Some(Some('\n')),
            b'r' => Some(Some('\r')),
            b't' => Some(Some('\t')),
            b'v' => Some(Some('\x0b')),
            _ => None,
        };
        if let Some(ch) = simple {
            out.extend(ch);
            return Ok(());
        }
        let code = match c {
            b'x' => self.hex_digits(2, at)?,
            b'u' => self.hex_digits(4, at)?,
            b'U' => self.hex_digits(8, at)?,
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    match self.peek() {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            self.pos += 1;
                        }
                        _ => break,
                    }
                }
                v
            }
            _ => {
                // Python keeps unknown escapes such as "\d" as they are (regexes rely on it).
                self.pos -= 1;
                out.push('\\');
                return Ok(());
            }
        };
        match char::from_u32(code) {
            Some(ch) => {
                out.push(ch);
                Ok(())
            }
            None => Err(LiteralError { offset: at, message: "escape is not a valid character".into() }),
        }
    }

    fn hex_digits(&mut self, n: usize, at: usize) -> Result<u32, LiteralError> {
        let digits =
            self.text.get(self.pos..self.pos + n).filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
        let Some(digits) = digits else {
            return Err(LiteralError { offset: at, message: format!("escape needs {n} hex digits") });
        };
        self.pos += n;
        u32::from_str_radix(digits, 16)
            .map_err(|_| LiteralError { offset: at, message: "bad hex escape".into() })
    }

    fn number(&mut self) -> Result<Value, LiteralError> {
        let start = self.pos;
        // Python allows any run of unary signs: --5 is 5.
        let mut negative = false;
        while let Some(c @ (b'+' | b'-')) = self.peek() {
            negative ^= c == b'-';
            self.pos += 1;
            self.skip_space();
        }
        let body_start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.'))
            || (matches!(self.peek(), Some(b'+' | b'-'))
                && matches!(self.s.get(self.pos.wrapping_sub(1)), Some(b'e' | b'E'))
                && !self.text[body_start..self.pos].starts_with("0x")
                && !self.text[body_start..self.pos].starts_with("0X"))
        {
            self.pos += 1;
        }
        let body = &self.text[body_start..self.pos];
        let bad = |message: String| LiteralError { offset: start, message };
        if body.is_empty() {
            return Err(bad("a sign must be followed by a number".into()));
        }
        if body.starts_with('_') || body.ends_with('_') || body.contains("__") {
            return Err(bad(format!("{body:?} is not a number")));
        }
        let clean: String = body.chars().filter(|&c| c != '_').collect();
        let lower = clean.to_ascii_lowercase();
        let radix = match lower.get(..2) {
            Some("0x") => Some(16),
            Some("0o") => Some(8),
            Some("0b") => Some(2),
            _ => None,
        };
        if let Some(radix) = radix {
            let v = i128::from_str_radix(&lower[2..], radix)
                .map_err(|_| bad(format!("{body:?} is not a number")))?;
            return int_value(if negative { -v } else { v }).ok_or_else(|| bad(out_of_range(body)));
        }
        if clean.bytes().all(|b| b.is_ascii_digit()) {
            let v: i128 = clean.parse().map_err(|_| bad(out_of_range(body)))?;
            return int_value(if negative { -v } else { v }).ok_or_else(|| bad(out_of_range(body)));
        }
        // Rust's float parser would also take "inf" and "nan"; Python literals do not.
        let is_float =
            clean.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
                && clean.bytes().any(|b| b.is_ascii_digit());
        let v: f64 = if is_float { clean.parse().ok() } else { None }
            .ok_or_else(|| bad(format!("{body:?} is not a number")))?;
        let v = if negative { -v } else { v };
        Number::from_f64(v).map(Value::Number).ok_or_else(|| bad(out_of_range(body)))
    }
}

fn out_of_range(body: &str) -> String {
    format!("{body} is out of range")
}

fn int_value(v: i128) -> Option<Value> {
    if let Ok(i) = i64::try_from(v) {
        Some(Value::Number(i.into()))
    } else {
        u64::try_from(v).ok().map(|u| Value::Number(u.into()))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn sdk_output_with_trailing_comma() {
        let v = parse(r#"{"StartStep": 5, "NumSteps": 1, }"#).unwrap();
        assert_eq!(v, json!({"StartStep": 5, "NumSteps": 1}));
        let v = parse(
            r#"{"StartStep": 9, "NumSteps": 3, "ProfilerName": "cProfile", "cProfileTimer": "default", }"#,
        )
        .unwrap();
        assert_eq!(v["ProfilerName"], "cProfile");
    }

    #[test]
    fn python_str_of_a_dict() {
        let v = parse("{'StartStep': 3, 'NumSteps': 2, 'MetricsRegex': 'Dataloader:.*'}").unwrap();
        assert_eq!(v, json!({"StartStep": 3, "NumSteps": 2, "MetricsRegex": "Dataloader:.*"}));
    }

    #[test]
    fn keywords_and_numbers() {
        let v = parse("{'a': True, 'b': False, 'c': None, 'd': true, 'e': null, 'f': -1.5e3, 'g': 1_000, 'h': 0x10, 'i': --2, 'j': .5, 'k': 1.}")
            .unwrap();
        assert_eq!(
            v,
            json!({"a": true, "b": false, "c": null, "d": true, "e": null, "f": -1500.0, "g": 1000, "h": 16, "i": 2, "j": 0.5, "k": 1.0})
        );
    }

    #[test]
    fn escapes_follow_python() {
        let v = parse(r#"{"r": "\d+\.json", "q": 'it\'s', "n": "a\tb\x41\u00e9", "raw": r"\n"}"#).unwrap();
        assert_eq!(v["r"], r"\d+\.json");
        assert_eq!(v["q"], "it's");
        assert_eq!(v["n"], "a\tbAé");
        assert_eq!(v["raw"], r"\n");
    }

    #[test]
    fn containers_and_last_duplicate_wins() {
        assert_eq!(parse("[1, (2, 3,), {}]").unwrap(), json!([1, [2, 3], {}]));
        assert_eq!(parse("{'a': 1, 'a': 2}").unwrap(), json!({"a": 2}));
    }

    #[test]
    fn nothing_is_evaluated() {
        for text in [
            "__import__('os').system('true')",
            "{'a': open('x')}",
            "{'a': 1 + 2}",
            "{'a': inf}",
            "{'a': float('nan')}",
            "{'a': f'x'}",
        ] {
            assert!(parse(text).is_err(), "{text} parsed");
        }
    }

    #[test]
    fn errors_point_at_the_problem() {
        let e = parse("{not valid").unwrap_err();
        assert!(e.message.contains("not a literal"), "{e}");
        assert_eq!(parse("").unwrap_err().offset, 0);
        assert!(parse("{'a': 1} x").unwrap_err().message.contains("after the end"));
        assert!(parse("{'a' 1}").unwrap_err().message.contains("expected ':'"));
        assert!(parse("{1: 2}").unwrap_err().message.contains("keys must be strings"));
        assert!(parse("{'a': 'b").unwrap_err().message.contains("not closed"));
        assert!(parse("{'a': 1e999}").unwrap_err().message.contains("out of range"));
        assert!(parse("{'a': 123456789012345678901234567890}").unwrap_err().message.contains("out of range"));
    }

    #[test]
    fn offsets_count_characters() {
        let e = parse("{'é': 1 x}").unwrap_err();
        assert_eq!(e.offset, 8, "{e}");
        assert!(e.to_string().ends_with("(at character 9)"));
    }

    #[test]
    fn depth_is_bounded() {
        let deep = "[".repeat(10_000);
        assert!(parse(&deep).unwrap_err().message.contains("deeply"));
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
        assert!(parse(&ok).is_ok());
    }
}
