//! Numbers as the SageMaker SDK writes them: JSON numbers or numeric strings.
//!
//! The conversions mirror Python's `int(v)` and `float(v)`, which smdebug applies: a float
//! number truncates under `int`, a string must be an integer literal for `int` ("2.0" is
//! refused) and any float literal for `float` ("1e3" is fine). Booleans are refused
//! (Python would take `True` as 1, which no user means). `null` is treated as "not given"
//! by the callers, before conversion.

use serde_json::{Number, Value};

/// A float in a message as a person reads it, never hundreds of digits: scientific notation
/// (`1e308`, `1e-300`) from a billion up and below a thousandth, else as written. (The
/// report's `trainprof_report::read::readable` does the same for its pages; this crate is
/// below it.)
pub(crate) struct Shown(pub f64);

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (x, a) = (self.0, self.0.abs());
        if x.is_finite() && (a >= 1e9 || (x != 0.0 && a < 1e-3)) {
            let s = format!("{x:.2e}");
            let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
            write!(f, "{}e{exp}", mantissa.trim_end_matches('0').trim_end_matches('.'))
        } else {
            write!(f, "{x}")
        }
    }
}

/// Why a value is not the number a key wants; its text is a short reason for a problem line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum NumberError {
    /// A JSON number beyond what the setting can hold.
    #[error("{0} is out of range")]
    OutOfRange(Number),
    /// A float whose integer part is beyond `i64`.
    #[error("{} is out of range", Shown(*.0))]
    FloatOutOfRange(f64),
    /// A string that is not an integer literal.
    #[error("{0:?} is not an integer")]
    NotAnInteger(String),
    /// A string that is not a float literal.
    #[error("{0:?} is not a number")]
    NotANumber(String),
    /// inf or nan.
    #[error("{0} is not a finite number")]
    NotFinite(Value),
    /// Neither a number nor a string (the JSON kind, as [`kind`] names it).
    #[error("expected a number, got {0}")]
    WrongType(&'static str),
}

/// Python's `int(v)`, limited to `i64`.
pub(crate) fn py_int(v: &Value) -> Result<i64, NumberError> {
    match v {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(i)
            } else if n.is_u64() {
                Err(NumberError::OutOfRange(n.clone()))
            } else if let Some(f) = n.as_f64() {
                float_to_int(f)
            } else {
                Err(NumberError::OutOfRange(n.clone()))
            }
        }
        Value::String(s) => parse_int_str(s).ok_or_else(|| NumberError::NotAnInteger(s.clone())),
        other => Err(NumberError::WrongType(kind(other))),
    }
}

/// Python's `float(v)`, with inf and nan refused (no setting here means them).
pub(crate) fn py_float(v: &Value) -> Result<f64, NumberError> {
    let f = match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| NumberError::OutOfRange(n.clone()))?,
        Value::String(s) => parse_float_str(s).ok_or_else(|| NumberError::NotANumber(s.clone()))?,
        other => return Err(NumberError::WrongType(kind(other))),
    };
    if f.is_finite() { Ok(f) } else { Err(NumberError::NotFinite(v.clone())) }
}

fn float_to_int(f: f64) -> Result<i64, NumberError> {
    // i64::MAX as f64 rounds up to 2^63, so the upper bound is exclusive.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if f.is_finite() && f.trunc() >= -LIMIT && f.trunc() < LIMIT {
        #[allow(clippy::cast_possible_truncation)] // range checked just above
        Ok(f.trunc() as i64)
    } else {
        Err(NumberError::FloatOutOfRange(f))
    }
}

/// An integer literal as Python's `int(str)` takes it: surrounding whitespace, one sign,
/// decimal digits with single underscores between them.
fn parse_int_str(s: &str) -> Option<i64> {
    let t = s.trim();
    let (neg, digits) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    {
        return None;
    }
    let clean: String = digits.chars().filter(|&c| c != '_').collect();
    let v: i128 = clean.parse().ok()?;
    i64::try_from(if neg { -v } else { v }).ok()
}

/// A float literal as Python's `float(str)` takes it (inf / nan are parsed, then refused by
/// the caller).
fn parse_float_str(s: &str) -> Option<f64> {
    let t = s.trim();
    let ok_chars = t.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-' | b'_'));
    // Python: an underscore only between two digits.
    let b = t.as_bytes();
    let lone_underscores = b.iter().enumerate().all(|(i, &c)| {
        c != b'_' || (i > 0 && b[i - 1].is_ascii_digit() && b.get(i + 1).is_some_and(u8::is_ascii_digit))
    });
    if t.is_empty() || !ok_chars || !lone_underscores {
        return None;
    }
    let clean: String = t.chars().filter(|&c| c != '_').collect();
    clean.parse().ok()
}

/// How a JSON value is named in messages.
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn int_like_python() {
        assert_eq!(py_int(&json!(5)), Ok(5));
        assert_eq!(py_int(&json!(2.9)), Ok(2));
        assert_eq!(py_int(&json!(-2.9)), Ok(-2));
        assert_eq!(py_int(&json!("2")), Ok(2));
        assert_eq!(py_int(&json!(" +1_000 ")), Ok(1000));
        assert!(py_int(&json!("2.0")).is_err());
        assert!(py_int(&json!("None")).is_err());
        assert!(py_int(&json!("")).is_err());
        assert!(py_int(&json!(true)).is_err());
        assert!(py_int(&json!(1e300)).is_err());
        assert!(py_int(&json!("99999999999999999999")).is_err());
        assert_eq!(py_int(&json!(u64::MAX)).unwrap_err().to_string(), "18446744073709551615 is out of range");
        // Not 301 digits.
        assert_eq!(py_int(&json!(1e300)).unwrap_err().to_string(), "1e300 is out of range");
        assert_eq!(py_int(&json!("2.0")).unwrap_err().to_string(), r#""2.0" is not an integer"#);
        assert_eq!(py_int(&json!(true)).unwrap_err().to_string(), "expected a number, got a boolean");
    }

    #[test]
    fn float_like_python() {
        assert_eq!(py_float(&json!(0.5)), Ok(0.5));
        assert_eq!(py_float(&json!("0.5")), Ok(0.5));
        assert_eq!(py_float(&json!("1e3")), Ok(1000.0));
        assert_eq!(py_float(&json!(" 60 ")), Ok(60.0));
        assert_eq!(py_float(&json!(7)), Ok(7.0));
        assert!(py_float(&json!("inf")).is_err());
        assert_eq!(py_float(&json!("inf")).unwrap_err().to_string(), r#""inf" is not a finite number"#);
        assert_eq!(py_float(&json!("x")).unwrap_err().to_string(), r#""x" is not a number"#);
        assert!(py_float(&json!("nan")).is_err());
        assert!(py_float(&json!("None")).is_err());
        assert!(py_float(&json!([1])).is_err());
        assert_eq!(py_float(&json!("1_000.5")), Ok(1000.5));
        for bad in ["_1", "1_", "1_.5", "1._5", "1__0", "1e_3"] {
            assert!(py_float(&json!(bad)).is_err(), "{bad}");
        }
    }
}
