//! The subset of Python's `marshal` format that `pstats.Stats.dump_stats` writes (a dict of
//! tuples of strings, ints and floats, with back-references), decoded in Rust so that a
//! cProfile window's top functions need no Python (`docs/report.md`, "Python windows").
//! Bounded: lengths are checked against the bytes left, nesting is at most 64 deep.

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum MarshalError {
    #[error("marshal data ends early")]
    Truncated,
    #[error("marshal type code {0:#04x} is not supported")]
    Unsupported(u8),
    #[error("marshal data nests deeper than 64")]
    TooDeep,
    #[error("marshal back-reference {0} is unknown")]
    BadRef(u32),
    #[error("marshal string is not UTF-8")]
    NotUtf8,
    #[error("pstats data is not a dict of (file, line, function) → (cc, nc, tt, ct, callers)")]
    NotPstats,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Set(Vec<Value>),
    /// A long too large for i64 (kept approximately).
    BigInt(f64),
}

impl Value {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) | Value::BigInt(f) => Some(*f),
            Value::Bool(b) => Some(f64::from(u8::from(*b))),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

const FLAG_REF: u8 = 0x80;
const MAX_DEPTH: usize = 64;

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    refs: Vec<Option<Value>>,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], MarshalError> {
        let end = self.pos.checked_add(n).ok_or(MarshalError::Truncated)?;
        let s = self.b.get(self.pos..end).ok_or(MarshalError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, MarshalError> {
        Ok(self.take(1)?[0])
    }
    fn i32(&mut self) -> Result<i32, MarshalError> {
        let s = self.take(4)?;
        Ok(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn len(&mut self) -> Result<usize, MarshalError> {
        let n = self.i32()?;
        let n = usize::try_from(n).map_err(|_| MarshalError::Truncated)?;
        if n > self.b.len() - self.pos {
            return Err(MarshalError::Truncated);
        }
        Ok(n)
    }
    fn string(&mut self, n: usize) -> Result<String, MarshalError> {
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| MarshalError::NotUtf8)
    }

    fn value(&mut self, depth: usize) -> Result<Value, MarshalError> {
        if depth > MAX_DEPTH {
            return Err(MarshalError::TooDeep);
        }
        let code = self.u8()?;
        let flag = code & FLAG_REF != 0;
        let ty = code & !FLAG_REF;
        // A container's slot is reserved before its content, as CPython numbers them.
        let slot = if flag {
            self.refs.push(None);
            Some(self.refs.len() - 1)
        } else {
            None
        };
        let v = match ty {
            b'N' => Value::None,
            b'F' => Value::Bool(false),
            b'T' => Value::Bool(true),
            b'i' => Value::Int(i64::from(self.i32()?)),
            b'l' => {
                let n = self.i32()?;
                let digits = n.unsigned_abs() as usize;
                if digits > (self.b.len() - self.pos) / 2 {
                    return Err(MarshalError::Truncated);
                }
                let mut acc: f64 = 0.0;
                let mut exact: i128 = 0;
                let mut fits = true;
                for i in 0..digits {
                    let s = self.take(2)?;
                    let d = u16::from_le_bytes([s[0], s[1]]);
                    acc += f64::from(d) * 32768f64.powi(i as i32);
                    if i < 8 {
                        exact |= i128::from(d) << (15 * i);
                    } else if d != 0 {
                        fits = false;
                    }
                }
                let sign: i128 = if n < 0 { -1 } else { 1 };
                match i64::try_from(exact * sign) {
                    Ok(x) if fits => Value::Int(x),
                    _ => Value::BigInt(acc * if n < 0 { -1.0 } else { 1.0 }),
                }
            }
            b'g' => {
                let s = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(s);
                Value::Float(f64::from_le_bytes(a))
            }
            b'f' => {
                let n = usize::from(self.u8()?);
                let s = self.string(n)?;
                Value::Float(s.trim().parse().map_err(|_| MarshalError::NotPstats)?)
            }
            b's' => {
                let n = self.len()?;
                Value::Bytes(self.take(n)?.to_vec())
            }
            b't' | b'u' | b'a' | b'A' => {
                let n = self.len()?;
                Value::Str(self.string(n)?)
            }
            b'z' | b'Z' => {
                let n = usize::from(self.u8()?);
                Value::Str(self.string(n)?)
            }
            b'(' | b'[' | b'<' | b'>' | b')' => {
                let n = if ty == b')' { usize::from(self.u8()?) } else { self.len()? };
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    items.push(self.value(depth + 1)?);
                }
                match ty {
                    b'(' | b')' => Value::Tuple(items),
                    b'[' => Value::List(items),
                    _ => Value::Set(items),
                }
            }
            b'{' => {
                let mut items = Vec::new();
                loop {
                    if self.b.get(self.pos) == Some(&b'0') {
                        self.pos += 1;
                        break;
                    }
                    let k = self.value(depth + 1)?;
                    let v = self.value(depth + 1)?;
                    items.push((k, v));
                }
                Value::Dict(items)
            }
            b'r' => {
                let i = self.i32()? as u32;
                return match self.refs.get(i as usize) {
                    Some(Some(v)) => Ok(v.clone()),
                    _ => Err(MarshalError::BadRef(i)),
                };
            }
            other => return Err(MarshalError::Unsupported(other)),
        };
        if let Some(s) = slot {
            self.refs[s] = Some(v.clone());
        }
        Ok(v)
    }
}

/// Decodes one marshalled value.
pub fn decode(bytes: &[u8]) -> Result<Value, MarshalError> {
    Reader { b: bytes, pos: 0, refs: Vec::new() }.value(0)
}

/// One function's line of a pstats dict.
#[derive(Debug, Clone, PartialEq)]
pub struct PstatsRow {
    pub file: String,
    pub line: i64,
    pub function: String,
    pub primitive_calls: u64,
    pub calls: u64,
    /// Time in the function itself (`tottime`), seconds.
    pub self_s: f64,
    /// Time including callees (`cumtime`), seconds.
    pub total_s: f64,
}

/// The rows of a `pstats.Stats.dump_stats` file.
pub fn pstats(bytes: &[u8]) -> Result<Vec<PstatsRow>, MarshalError> {
    let Value::Dict(items) = decode(bytes)? else { return Err(MarshalError::NotPstats) };
    let mut out = Vec::with_capacity(items.len());
    for (k, v) in items {
        let (Value::Tuple(k), Value::Tuple(v)) = (k, v) else { return Err(MarshalError::NotPstats) };
        let [file, line, function] = k.as_slice() else { return Err(MarshalError::NotPstats) };
        if v.len() < 4 {
            return Err(MarshalError::NotPstats);
        }
        let num = |i: usize| v[i].as_f64().ok_or(MarshalError::NotPstats);
        out.push(PstatsRow {
            file: file.as_str().ok_or(MarshalError::NotPstats)?.to_owned(),
            line: line.as_f64().ok_or(MarshalError::NotPstats)? as i64,
            function: function.as_str().ok_or(MarshalError::NotPstats)?.to_owned(),
            primitive_calls: num(0)?.max(0.0) as u64,
            calls: num(1)?.max(0.0) as u64,
            self_s: num(2)?,
            total_s: num(3)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `marshal.dumps({('train.py', 10, 'f'): (2, 3, 0.5, 1.5, {})})` from CPython 3.12.
    const ONE_ROW: &[u8] = b"{\xa9\x03\xfa\x08train.py\xe9\n\x00\x00\x00\xda\x01f)\x05\xe9\x02\x00\x00\x00\xe9\x03\x00\x00\x00\xe7\x00\x00\x00\x00\x00\x00\xe0?\xe7\x00\x00\x00\x00\x00\x00\xf8?{00";

    #[test]
    fn decodes_a_pstats_row() {
        let rows = pstats(ONE_ROW).unwrap();
        assert_eq!(
            rows,
            vec![PstatsRow {
                file: "train.py".into(),
                line: 10,
                function: "f".into(),
                primitive_calls: 2,
                calls: 3,
                self_s: 0.5,
                total_s: 1.5
            }]
        );
    }

    #[test]
    fn references_and_longs() {
        // ('ab', <ref 0>) where 'ab' is flagged: marshal.dumps(('ab','ab')) with interning.
        let b = b")\x02\xda\x02ab\x72\x01\x00\x00\x00";
        // Slot 0 is the tuple itself (no flag here), so 'ab' is ref 0; test ref 1 fails.
        assert_eq!(decode(b), Err(MarshalError::BadRef(1)));
        let b = b")\x02\xda\x02ab\x72\x00\x00\x00\x00";
        assert_eq!(decode(b), Ok(Value::Tuple(vec![Value::Str("ab".into()), Value::Str("ab".into())])));
        // 2**40 as a long: 3 digits of 15 bits: 0, 0, 1024.
        let b = b"\xec\x03\x00\x00\x00\x00\x00\x00\x00\x00\x04";
        assert_eq!(decode(b), Ok(Value::Int(1 << 40)));
    }

    #[test]
    fn hostile_input_is_an_error_not_a_panic() {
        assert_eq!(decode(b""), Err(MarshalError::Truncated));
        assert_eq!(decode(b"(\xff\xff\xff\x7f"), Err(MarshalError::Truncated));
        assert_eq!(decode(b"c"), Err(MarshalError::Unsupported(b'c')));
        let deep = vec![b'['; 200].into_iter().chain([1, 0, 0, 0]).collect::<Vec<u8>>();
        let mut deep2 = Vec::new();
        for _ in 0..100 {
            deep2.extend_from_slice(b"[\x01\x00\x00\x00");
        }
        deep2.push(b'N');
        assert!(decode(&deep).is_err());
        assert_eq!(decode(&deep2), Err(MarshalError::TooDeep));
        assert_eq!(pstats(b"N"), Err(MarshalError::NotPstats));
    }
}
