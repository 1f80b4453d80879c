//! The subset of Python's `marshal` format that `pstats.Stats.dump_stats` writes (a dict of
//! tuples of strings, ints and floats, with back-references), decoded in Rust so that a
//! cProfile window's top functions need no Python (`docs/report.md`, "Python windows").
//!
//! The file is written by the trainer, so the decoder is bounded (`docs/report.md`,
//! "Untrusted input"): lengths are checked against the bytes left, nesting is at most 64
//! deep, a back-reference shares the value it points to (an `Rc`, never a copy: copies of
//! nested references grow exponentially with the file's length), and a file that decodes to
//! more than [`MAX_VALUES`] values is refused. Every value takes at least one byte of input
//! and a reference is O(1), so the work is linear in the file's length. Errors name the kind
//! of problem and its offset, never the bytes found.

use std::rc::Rc;

use thiserror::Error;

/// Values decoded per file at most: about 100,000 functions of a pstats dict with their
/// callers (some 20 values each); 24 bytes each, twice that while a list grows.
pub const MAX_VALUES: usize = 2_000_000;

#[derive(Debug, Error, PartialEq)]
pub enum MarshalError {
    #[error("marshal data ends early")]
    Truncated,
    #[error("marshal data has an unsupported type code at byte {0}")]
    Unsupported(usize),
    #[error("marshal data nests deeper than 64")]
    TooDeep,
    #[error("marshal data has an unknown back-reference at byte {0}")]
    BadRef(usize),
    #[error("marshal string at byte {0} is not UTF-8")]
    NotUtf8(usize),
    #[error("marshal data holds more than {MAX_VALUES} values: not decoded")]
    TooManyValues,
    #[error("pstats data is not a dict of (file, line, function) → (cc, nc, tt, ct, callers)")]
    NotPstats,
}

/// A decoded value. Strings and containers are shared (`Rc`): a back-reference costs one
/// pointer, whatever it points to.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    Tuple(Rc<[Value]>),
    List(Rc<[Value]>),
    Dict(Rc<[(Value, Value)]>),
    Set(Rc<[Value]>),
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

/// What a decode cost: the decoder's own counters, for tests that prove its bounds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Values decoded, back-references included (each takes a slot in its container).
    pub values: usize,
    /// Of which back-references (shared, not copied).
    pub refs: usize,
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    refs: Vec<Option<Value>>,
    cost: Cost,
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
    fn string(&mut self, n: usize) -> Result<Rc<str>, MarshalError> {
        let at = self.pos;
        std::str::from_utf8(self.take(n)?).map(Rc::from).map_err(|_| MarshalError::NotUtf8(at))
    }
    /// Room for up to `n` items: never more than the values left in the budget.
    fn items<T>(&self, n: usize) -> Vec<T> {
        Vec::with_capacity(n.min(MAX_VALUES - self.cost.values).min(1024))
    }

    fn value(&mut self, depth: usize) -> Result<Value, MarshalError> {
        if depth > MAX_DEPTH {
            return Err(MarshalError::TooDeep);
        }
        // A reference counts too: it takes a slot in its container.
        if self.cost.values >= MAX_VALUES {
            return Err(MarshalError::TooManyValues);
        }
        let at = self.pos;
        let code = self.u8()?;
        // Counted once its type byte is read: one value per input byte at most, even for an
        // input that ends where a value should start.
        self.cost.values += 1;
        let flag = code & FLAG_REF != 0;
        let ty = code & !FLAG_REF;
        if ty == b'r' {
            let i = self.i32()?;
            self.cost.refs += 1;
            return match usize::try_from(i).ok().and_then(|i| self.refs.get(i)) {
                Some(Some(v)) => Ok(v.clone()),
                _ => Err(MarshalError::BadRef(at)),
            };
        }
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
                    acc += f64::from(d) * 32768f64.powi(i32::try_from(i).unwrap_or(i32::MAX));
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
                Value::Bytes(Rc::from(self.take(n)?))
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
                let mut items = self.items(n);
                for _ in 0..n {
                    items.push(self.value(depth + 1)?);
                }
                let items = Rc::from(items);
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
                Value::Dict(Rc::from(items))
            }
            _ => return Err(MarshalError::Unsupported(at)),
        };
        if let Some(s) = slot {
            self.refs[s] = Some(v.clone());
        }
        Ok(v)
    }
}

/// Decodes one marshalled value.
pub fn decode(bytes: &[u8]) -> Result<Value, MarshalError> {
    decode_counted(bytes).0
}

/// Decodes one marshalled value, with what it cost (also on an error).
pub fn decode_counted(bytes: &[u8]) -> (Result<Value, MarshalError>, Cost) {
    let mut r = Reader { b: bytes, pos: 0, refs: Vec::new(), cost: Cost::default() };
    let v = r.value(0);
    (v, r.cost)
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
    for (k, v) in items.iter() {
        let (Value::Tuple(k), Value::Tuple(v)) = (k, v) else { return Err(MarshalError::NotPstats) };
        let [file, line, function] = &k[..] else { return Err(MarshalError::NotPstats) };
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
        assert_eq!(decode(b), Err(MarshalError::BadRef(6)));
        let b = b")\x02\xda\x02ab\x72\x00\x00\x00\x00";
        assert_eq!(
            decode(b),
            Ok(Value::Tuple(Rc::from(vec![Value::Str("ab".into()), Value::Str("ab".into())])))
        );
        // 2**40 as a long: 3 digits of 15 bits: 0, 0, 1024.
        let b = b"\xec\x03\x00\x00\x00\x00\x00\x00\x00\x00\x04";
        assert_eq!(decode(b), Ok(Value::Int(1 << 40)));
    }

    /// `levels` tuples in a list, each flagged and holding two references to the one before:
    /// copied, the last one is 2^levels values.
    fn doubling_references(levels: u32) -> Vec<u8> {
        let mut b = vec![b'['];
        b.extend_from_slice(&(levels as i32).to_le_bytes());
        b.extend_from_slice(b"\xa9\x02NN");
        for k in 1..levels {
            b.extend_from_slice(b"\xa9\x02");
            for _ in 0..2 {
                b.push(b'r');
                b.extend_from_slice(&(k as i32 - 1).to_le_bytes());
            }
        }
        b
    }

    #[test]
    fn nested_references_are_shared_not_copied() {
        // 473 bytes; with a copy per reference this took 2^40 values (a 448-byte file of the
        // same shape aborted the process, out of memory).
        let b = doubling_references(40);
        assert!(b.len() < 480, "{}", b.len());
        let (v, cost) = decode_counted(&b);
        let Ok(Value::List(items)) = v else { panic!("{v:?}") };
        assert_eq!(items.len(), 40);
        // The list, the first tuple and its two Nones, then a tuple and two references a level.
        assert_eq!(cost, Cost { values: 1 + 3 + 39 * 3, refs: 78 });
        assert!(cost.values <= b.len());
        // As a pstats file it is refused at once, with what is wrong and no byte of it.
        assert_eq!(pstats(&b), Err(MarshalError::NotPstats));
    }

    #[test]
    fn more_values_than_the_budget_is_an_error() {
        // A list of MAX_VALUES + 1 Nones: one byte each.
        let n = MAX_VALUES + 1;
        let mut b = vec![b'['];
        b.extend_from_slice(&(n as i32).to_le_bytes());
        b.resize(5 + n, b'N');
        let (v, cost) = decode_counted(&b);
        assert_eq!(v, Err(MarshalError::TooManyValues));
        assert_eq!(cost.values, MAX_VALUES);
        // References count too: a dict of reference pairs (5 bytes each, no value made).
        let mut b = b"[\x02\x00\x00\x00\xce{".to_vec();
        for _ in 0..MAX_VALUES / 2 + 1 {
            b.extend_from_slice(b"r\x00\x00\x00\x00r\x00\x00\x00\x00");
        }
        assert_eq!(decode(&b), Err(MarshalError::TooManyValues));
        assert_eq!(
            MarshalError::TooManyValues.to_string(),
            format!("marshal data holds more than {MAX_VALUES} values: not decoded")
        );
    }

    #[test]
    fn hostile_input_is_an_error_not_a_panic() {
        assert_eq!(decode(b""), Err(MarshalError::Truncated));
        assert_eq!(decode(b"(\xff\xff\xff\x7f"), Err(MarshalError::Truncated));
        assert_eq!(decode(b"c"), Err(MarshalError::Unsupported(0)));
        // Errors say where, never what: no byte of the file is in the message.
        assert_eq!(
            MarshalError::Unsupported(7).to_string(),
            "marshal data has an unsupported type code at byte 7"
        );
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
