//! The data subset of Python's `pickle` format (protocols 2 to 5), decoded in Rust so that a
//! PyTorch memory snapshot (`torch.cuda.memory._dump_snapshot`, docs/formats.md, "Memory
//! snapshots") is read without running anything: a pickle is a program, and its general
//! loader imports modules and calls functions. This reader knows only the opcodes that build
//! data: dicts, lists, tuples, strings, bytes, ints, floats, bools, `None`, the memo (`PUT`,
//! `GET`, `MEMOIZE`), marks, `FRAME`, `PROTO` and `STOP`. Every other opcode (`GLOBAL`,
//! `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, persistent ids, extensions,
//! sets, out-of-band buffers, the text opcodes of protocols 0 and 1) ends the read with an
//! error that names it and its offset (docs/report.md, "Untrusted input").
//!
//! Bounds, as for [`super::marshal`]: every length is checked against the bytes left; at most
//! [`MAX_VALUES`] values are made (memo writes included: each costs a slot), so the work and
//! memory are linear in the file's length; containers nest at most [`MAX_DEPTH`] deep, checked
//! as they are filled. Lists and dicts are mutable in a pickle (a memo reference sees the
//! items added later), so they live in an arena and a [`Value`] names them by index: a
//! reference costs one index, never a copy, and dropping a value never recurses. A container
//! that holds itself through the memo is possible; readers of the result follow a fixed shape
//! with a visit budget (`Pickle::get` looks at [`MAX_DICT_SCAN`] keys at most), never
//! recursing through the data. Errors name the kind of problem and its offset, never the bytes.

use std::collections::HashMap;
use std::rc::Rc;

use thiserror::Error;

/// Values made per file at most (memo writes and reads included): a snapshot of 100,000
/// history entries with 8-frame stacks, frames shared as torch shares them, is well within
/// (BENCHMARKS.md, "Memory snapshots").
pub const MAX_VALUES: usize = 8_000_000;
/// Containers nest at most so deep (a snapshot nests 6: the dict, `segments`, a segment,
/// `blocks`, a block, `frames`, a frame).
pub const MAX_DEPTH: u32 = 64;
/// [`Pickle::get`] looks at the first so many keys of a dict (a snapshot's dicts have fewer
/// than 20), so a lookup costs a bounded time whatever the dict.
pub const MAX_DICT_SCAN: usize = 64;

#[derive(Debug, Error, PartialEq)]
pub enum PickleError {
    #[error("pickle data ends early")]
    Truncated,
    #[error("pickle does not start with PROTO 2 to 5")]
    Protocol,
    #[error(
        "pickle opcode {0} at byte {1} refused: it imports or calls Python code, which the report never runs"
    )]
    Code(&'static str, usize),
    #[error("pickle opcode {0} at byte {1} refused: not data of the memory snapshot format")]
    NotData(&'static str, usize),
    #[error("pickle has an unknown opcode at byte {0}")]
    Unknown(usize),
    #[error("pickle containers nest deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("pickle data holds more than {MAX_VALUES} values: not decoded")]
    TooManyValues,
    #[error("pickle has an unknown memo reference at byte {0}")]
    BadMemo(usize),
    #[error("pickle opcode at byte {0} does not fit the stack (malformed)")]
    Malformed(usize),
}

/// A decoded value. Lists, tuples and dicts are indices into the [`Pickle`]'s arena.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An int outside i64 (kept approximately).
    BigInt(f64),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    List(u32),
    Tuple(u32),
    Dict(u32),
}

impl Value {
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::BigInt(f) | Value::Float(f) => Some(*f),
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

/// A decoded pickle: its top value and the arena its containers live in.
#[derive(Debug, Default)]
pub struct Pickle {
    pub root: Option<Value>,
    seqs: Vec<Vec<Value>>,
    dicts: Vec<Vec<(Value, Value)>>,
    /// Nesting of each container as filled (for the depth bound).
    seq_depth: Vec<u32>,
    dict_depth: Vec<u32>,
}

impl Pickle {
    /// The items of a list or tuple.
    pub fn items(&self, v: &Value) -> Option<&[Value]> {
        match v {
            Value::List(i) | Value::Tuple(i) => self.seqs.get(*i as usize).map(Vec::as_slice),
            _ => None,
        }
    }
    /// The value of a dict's string key (the last one set, among the first
    /// [`MAX_DICT_SCAN`] pairs).
    pub fn get(&self, dict: &Value, key: &str) -> Option<&Value> {
        let Value::Dict(i) = dict else { return None };
        let pairs = self.dicts.get(*i as usize)?;
        pairs[..pairs.len().min(MAX_DICT_SCAN)]
            .iter()
            .rev()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }
    /// Pairs of a dict.
    pub fn pairs(&self, v: &Value) -> Option<&[(Value, Value)]> {
        match v {
            Value::Dict(i) => self.dicts.get(*i as usize).map(Vec::as_slice),
            _ => None,
        }
    }
    fn depth(&self, v: &Value) -> u32 {
        match v {
            Value::List(i) | Value::Tuple(i) => self.seq_depth[*i as usize],
            Value::Dict(i) => self.dict_depth[*i as usize],
            _ => 0,
        }
    }
}

/// What a decode cost, for tests that prove its bounds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Values made (memo writes included).
    pub values: usize,
    /// Memo reads (shared, not copied).
    pub refs: usize,
}

/// The name of a refused opcode, and whether it runs code (`true`) or is only outside the
/// format's data.
fn refused(op: u8) -> Option<(&'static str, bool)> {
    Some(match op {
        b'c' => ("GLOBAL", true),
        0x93 => ("STACK_GLOBAL", true),
        b'R' => ("REDUCE", true),
        b'b' => ("BUILD", true),
        b'i' => ("INST", true),
        b'o' => ("OBJ", true),
        0x81 => ("NEWOBJ", true),
        0x92 => ("NEWOBJ_EX", true),
        0x82 => ("EXT1", true),
        0x83 => ("EXT2", true),
        0x84 => ("EXT4", true),
        b'P' => ("PERSID", true),
        b'Q' => ("BINPERSID", true),
        0x8f => ("EMPTY_SET", false),
        0x90 => ("ADDITEMS", false),
        0x91 => ("FROZENSET", false),
        0x96 => ("BYTEARRAY8", false),
        0x97 => ("NEXT_BUFFER", false),
        0x98 => ("READONLY_BUFFER", false),
        b'S' => ("STRING", false),
        b'T' => ("BINSTRING", false),
        b'U' => ("SHORT_BINSTRING", false),
        b'V' => ("UNICODE", false),
        b'F' => ("FLOAT", false),
        b'I' => ("INT", false),
        b'L' => ("LONG", false),
        b'p' => ("PUT", false),
        b'g' => ("GET", false),
        _ => return None,
    })
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    out: Pickle,
    cost: Cost,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        let end = self.pos.checked_add(n).ok_or(PickleError::Truncated)?;
        let s = self.b.get(self.pos..end).ok_or(PickleError::Truncated)?;
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let s = self.take(n)?;
        Ok(s.iter().rev().fold(0u64, |a, &b| (a << 8) | u64::from(b)))
    }
    /// A length read in `n` bytes, checked against the bytes left.
    fn len(&mut self, n: usize) -> Result<usize, PickleError> {
        let l = self.le(n)?;
        let left = (self.b.len() - self.pos) as u64;
        if l > left {
            return Err(PickleError::Truncated);
        }
        Ok(l as usize)
    }
    fn count(&mut self) -> Result<(), PickleError> {
        if self.cost.values >= MAX_VALUES {
            return Err(PickleError::TooManyValues);
        }
        self.cost.values += 1;
        Ok(())
    }
    fn push(&mut self, v: Value) -> Result<(), PickleError> {
        self.count()?;
        self.stack.push(v);
        Ok(())
    }
    fn pop(&mut self, at: usize) -> Result<Value, PickleError> {
        // Never below the innermost mark.
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(PickleError::Malformed(at));
        }
        self.stack.pop().ok_or(PickleError::Malformed(at))
    }
    fn pop_mark(&mut self, at: usize) -> Result<Vec<Value>, PickleError> {
        let m = self.marks.pop().ok_or(PickleError::Malformed(at))?;
        Ok(self.stack.split_off(m))
    }
    fn seq(&mut self, items: Vec<Value>, tuple: bool) -> Result<Value, PickleError> {
        let depth = 1 + items.iter().map(|v| self.out.depth(v)).max().unwrap_or(0);
        if depth > MAX_DEPTH {
            return Err(PickleError::TooDeep);
        }
        let i = u32::try_from(self.out.seqs.len()).map_err(|_| PickleError::TooManyValues)?;
        self.out.seqs.push(items);
        self.out.seq_depth.push(depth);
        Ok(if tuple { Value::Tuple(i) } else { Value::List(i) })
    }
    fn dict(&mut self, pairs: Vec<(Value, Value)>) -> Result<Value, PickleError> {
        let depth =
            1 + pairs.iter().map(|(k, v)| self.out.depth(k).max(self.out.depth(v))).max().unwrap_or(0);
        if depth > MAX_DEPTH {
            return Err(PickleError::TooDeep);
        }
        let i = u32::try_from(self.out.dicts.len()).map_err(|_| PickleError::TooManyValues)?;
        self.out.dicts.push(pairs);
        self.out.dict_depth.push(depth);
        Ok(Value::Dict(i))
    }
    /// The list under the innermost mark (or the stack's top for one item), extended.
    fn append(&mut self, items: Vec<Value>, at: usize) -> Result<(), PickleError> {
        let Some(Value::List(i)) = self.stack.last() else { return Err(PickleError::Malformed(at)) };
        let i = *i as usize;
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(PickleError::Malformed(at));
        }
        let d = 1 + items.iter().map(|v| self.out.depth(v)).max().unwrap_or(0);
        if d > MAX_DEPTH {
            return Err(PickleError::TooDeep);
        }
        self.out.seq_depth[i] = self.out.seq_depth[i].max(d);
        self.out.seqs[i].extend(items);
        Ok(())
    }
    fn set_items(&mut self, items: Vec<Value>, at: usize) -> Result<(), PickleError> {
        let Some(Value::Dict(i)) = self.stack.last() else { return Err(PickleError::Malformed(at)) };
        let i = *i as usize;
        let floor = self.marks.last().copied().unwrap_or(0);
        if !items.len().is_multiple_of(2) || self.stack.len() <= floor {
            return Err(PickleError::Malformed(at));
        }
        let d = 1 + items.iter().map(|v| self.out.depth(v)).max().unwrap_or(0);
        if d > MAX_DEPTH {
            return Err(PickleError::TooDeep);
        }
        self.out.dict_depth[i] = self.out.dict_depth[i].max(d);
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            self.out.dicts[i].push((k, v));
        }
        Ok(())
    }
    fn memo_put(&mut self, idx: u32, at: usize) -> Result<(), PickleError> {
        self.count()?;
        let v = self.stack.last().ok_or(PickleError::Malformed(at))?.clone();
        self.memo.insert(idx, v);
        Ok(())
    }
    fn memo_get(&mut self, idx: u32, at: usize) -> Result<(), PickleError> {
        let v = self.memo.get(&idx).ok_or(PickleError::BadMemo(at))?.clone();
        self.cost.refs += 1;
        self.push(v)
    }
    fn string(&mut self, n: usize) -> Result<Value, PickleError> {
        // Python writes lone surrogates with "surrogatepass": shown as U+FFFD, not refused.
        let s = String::from_utf8_lossy(self.take(n)?);
        Ok(Value::Str(Rc::from(s.as_ref())))
    }
    /// A two's-complement little-endian int of `n` bytes (`LONG1`, `LONG4`).
    fn long(&mut self, n: usize) -> Result<Value, PickleError> {
        let s = self.take(n)?;
        if s.is_empty() {
            return Ok(Value::Int(0));
        }
        let neg = s[s.len() - 1] & 0x80 != 0;
        if s.len() <= 8 {
            let mut a = if neg { [0xffu8; 8] } else { [0u8; 8] };
            a[..s.len()].copy_from_slice(s);
            return Ok(Value::Int(i64::from_le_bytes(a)));
        }
        // Wider: approximately, from the most significant bytes.
        let mut f = 0f64;
        for &b in s.iter().rev() {
            f = f * 256.0 + f64::from(if neg { !b } else { b });
        }
        Ok(Value::BigInt(if neg { -(f + 1.0) } else { f }))
    }

    fn run(&mut self) -> Result<Value, PickleError> {
        if self.u8()? != 0x80 {
            return Err(PickleError::Protocol);
        }
        if !(2..=5).contains(&self.u8()?) {
            return Err(PickleError::Protocol);
        }
        loop {
            let at = self.pos;
            let op = self.u8()?;
            match op {
                b'.' => {
                    if !self.marks.is_empty() || self.stack.len() != 1 {
                        return Err(PickleError::Malformed(at));
                    }
                    return self.pop(at);
                }
                0x95 => {
                    // FRAME: the length of what follows, advisory; checked, then read through.
                    self.len(8)?;
                }
                0x80 => return Err(PickleError::Malformed(at)),
                b'(' => {
                    if self.marks.len() >= MAX_DEPTH as usize {
                        return Err(PickleError::TooDeep);
                    }
                    self.marks.push(self.stack.len());
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'0' => {
                    self.pop(at)?;
                }
                b'2' => {
                    let v = self.stack.last().ok_or(PickleError::Malformed(at))?.clone();
                    self.push(v)?;
                }
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'K' => {
                    let v = self.le(1)? as i64;
                    self.push(Value::Int(v))?;
                }
                b'M' => {
                    let v = self.le(2)? as i64;
                    self.push(Value::Int(v))?;
                }
                b'J' => {
                    let v = self.le(4)? as u32 as i32;
                    self.push(Value::Int(i64::from(v)))?;
                }
                0x8a => {
                    let n = self.len(1)?;
                    let v = self.long(n)?;
                    self.push(v)?;
                }
                0x8b => {
                    let n = self.len(4)?;
                    let v = self.long(n)?;
                    self.push(v)?;
                }
                b'G' => {
                    let s = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(s);
                    self.push(Value::Float(f64::from_be_bytes(a)))?;
                }
                0x8c | b'X' | 0x8d => {
                    let n = self.len(match op {
                        0x8c => 1,
                        b'X' => 4,
                        _ => 8,
                    })?;
                    let v = self.string(n)?;
                    self.push(v)?;
                }
                b'C' | b'B' | 0x8e => {
                    let n = self.len(match op {
                        b'C' => 1,
                        b'B' => 4,
                        _ => 8,
                    })?;
                    let v = Value::Bytes(Rc::from(self.take(n)?));
                    self.push(v)?;
                }
                b'}' => {
                    let v = self.dict(Vec::new())?;
                    self.push(v)?;
                }
                b']' => {
                    let v = self.seq(Vec::new(), false)?;
                    self.push(v)?;
                }
                b')' => {
                    let v = self.seq(Vec::new(), true)?;
                    self.push(v)?;
                }
                b'd' | b'l' | b't' => {
                    let items = self.pop_mark(at)?;
                    let v = match op {
                        b'd' => {
                            if !items.len().is_multiple_of(2) {
                                return Err(PickleError::Malformed(at));
                            }
                            let mut it = items.into_iter();
                            let mut pairs = Vec::new();
                            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                                pairs.push((k, v));
                            }
                            self.dict(pairs)?
                        }
                        b'l' => self.seq(items, false)?,
                        _ => self.seq(items, true)?,
                    };
                    self.push(v)?;
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(PickleError::Malformed(at));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    let v = self.seq(items, true)?;
                    self.push(v)?;
                }
                b'a' => {
                    let v = self.pop(at)?;
                    self.append(vec![v], at)?;
                }
                b'e' => {
                    let items = self.pop_mark(at)?;
                    self.append(items, at)?;
                }
                b's' => {
                    let v = self.pop(at)?;
                    let k = self.pop(at)?;
                    self.set_items(vec![k, v], at)?;
                }
                b'u' => {
                    let items = self.pop_mark(at)?;
                    self.set_items(items, at)?;
                }
                0x94 => {
                    let idx = u32::try_from(self.memo.len()).map_err(|_| PickleError::TooManyValues)?;
                    self.memo_put(idx, at)?;
                }
                b'q' => {
                    let idx = self.le(1)? as u32;
                    self.memo_put(idx, at)?;
                }
                b'r' => {
                    let idx = self.le(4)? as u32;
                    self.memo_put(idx, at)?;
                }
                b'h' => {
                    let idx = self.le(1)? as u32;
                    self.memo_get(idx, at)?;
                }
                b'j' => {
                    let idx = self.le(4)? as u32;
                    self.memo_get(idx, at)?;
                }
                _ => {
                    return Err(match refused(op) {
                        Some((name, true)) => PickleError::Code(name, at),
                        Some((name, false)) => PickleError::NotData(name, at),
                        None => PickleError::Unknown(at),
                    });
                }
            }
        }
    }
}

/// Decodes one pickle (the bytes after its `STOP` are not read).
pub fn decode(bytes: &[u8]) -> Result<Pickle, PickleError> {
    decode_counted(bytes).0
}

/// Decodes one pickle, with what it cost (also on an error).
pub fn decode_counted(bytes: &[u8]) -> (Result<Pickle, PickleError>, Cost) {
    let mut r = Reader {
        b: bytes,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        out: Pickle::default(),
        cost: Cost::default(),
    };
    let res = r.run();
    let cost = r.cost;
    match res {
        Ok(v) => {
            let mut out = r.out;
            out.root = Some(v);
            (Ok(out), cost)
        }
        Err(e) => (Err(e), cost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pickle.dumps({'a': [1, 2**40, -3, 1.5, None, True], 'b': ('x', b'y'), 'c': {}}, 4)`
    /// from CPython 3.11.
    const SAMPLE: &[u8] = b"\x80\x04\x95;\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01\x8a\x06\x00\x00\x00\x00\x00\x01J\xfd\xff\xff\xffG?\xf8\x00\x00\x00\x00\x00\x00N\x88e\x8c\x01b\x94\x8c\x01x\x94C\x01y\x94\x86\x94\x8c\x01c\x94}\x94u.";

    #[test]
    fn decodes_the_data_opcodes() {
        let p = decode(SAMPLE).unwrap();
        let root = p.root.clone().unwrap();
        let a = p.items(p.get(&root, "a").unwrap()).unwrap();
        assert_eq!(
            a,
            &[
                Value::Int(1),
                Value::Int(1 << 40),
                Value::Int(-3),
                Value::Float(1.5),
                Value::None,
                Value::Bool(true)
            ]
        );
        let b = p.items(p.get(&root, "b").unwrap()).unwrap();
        assert_eq!(b, &[Value::Str("x".into()), Value::Bytes(Rc::from(&b"y"[..]))]);
        assert_eq!(p.pairs(p.get(&root, "c").unwrap()).unwrap().len(), 0);
        assert!(p.get(&root, "d").is_none());
    }

    #[test]
    fn memo_references_share_and_see_later_items() {
        // [L, L] with L put in the memo empty (BINPUT 1), both items read from it, then 5
        // appended to L through the memo (BINGET 1, APPEND, POP): both items see it.
        let b = b"\x80\x02]q\x00(]q\x01h\x01eh\x01K\x05a0.";
        let p = decode(b).unwrap();
        let root = p.root.clone().unwrap();
        let outer = p.items(&root).unwrap();
        assert_eq!(outer.len(), 2);
        assert_eq!(outer[0], outer[1]);
        assert_eq!(p.items(&outer[0]).unwrap(), &[Value::Int(5)]);
    }

    #[test]
    fn code_opcodes_are_refused_by_name() {
        // pickle.dumps(os.system) style: GLOBAL 'os\nsystem\n' then REDUCE.
        let b = b"\x80\x02cos\nsystem\n(X\x02\x00\x00\x00idtR.";
        assert_eq!(decode(b).unwrap_err(), PickleError::Code("GLOBAL", 2));
        let b = b"\x80\x04\x8c\x02os\x8c\x06system\x93.";
        assert_eq!(decode(b).unwrap_err(), PickleError::Code("STACK_GLOBAL", 14));
        for (op, name) in [(b'R', "REDUCE"), (b'b', "BUILD"), (b'i', "INST"), (b'o', "OBJ"), (0x81, "NEWOBJ")]
        {
            let b = [0x80, 4, b'N', op, b'.'];
            assert_eq!(decode(&b).unwrap_err(), PickleError::Code(name, 3));
        }
        assert_eq!(decode(b"\x80\x04\x8f.").unwrap_err(), PickleError::NotData("EMPTY_SET", 2));
        assert_eq!(decode(b"\x80\x04\xff.").unwrap_err(), PickleError::Unknown(2));
        assert_eq!(
            PickleError::Code("GLOBAL", 2).to_string(),
            "pickle opcode GLOBAL at byte 2 refused: it imports or calls Python code, which the report never runs"
        );
        // Protocols 0 and 1 (no PROTO) and unknown protocols are refused.
        assert_eq!(decode(b"(dp0\n.").unwrap_err(), PickleError::Protocol);
        assert_eq!(decode(b"\x80\x06N.").unwrap_err(), PickleError::Protocol);
    }

    #[test]
    fn truncation_and_lengths_are_checked() {
        for n in 0..SAMPLE.len() - 1 {
            assert!(decode(&SAMPLE[..n]).is_err(), "{n}");
        }
        // A string claiming 2^63 bytes.
        let b = b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x80.";
        assert_eq!(decode(b).unwrap_err(), PickleError::Truncated);
        // A frame claiming more than is left.
        let b = b"\x80\x04\x95\xff\xff\xff\xff\x00\x00\x00\x00N.";
        assert_eq!(decode(b).unwrap_err(), PickleError::Truncated);
        // LONG4 with a huge length.
        let b = b"\x80\x04\x8b\xff\xff\xff\x7f.";
        assert_eq!(decode(b).unwrap_err(), PickleError::Truncated);
        // Stack misuse.
        assert!(matches!(decode(b"\x80\x04a.").unwrap_err(), PickleError::Malformed(_)));
        assert!(matches!(decode(b"\x80\x04N(s.").unwrap_err(), PickleError::Malformed(_)));
        assert!(matches!(decode(b"\x80\x04NN.").unwrap_err(), PickleError::Malformed(_)));
        assert_eq!(decode(b"\x80\x04h\x07.").unwrap_err(), PickleError::BadMemo(2));
        // Every byte flipped: an error or a value, never a panic.
        for i in 0..SAMPLE.len() {
            for x in [0x00u8, 0xff, 0x80, b'(', b'.'] {
                let mut b = SAMPLE.to_vec();
                b[i] = x;
                let _ = decode(&b);
            }
        }
    }

    #[test]
    fn nesting_is_bounded() {
        // 100 nested single-item lists without marks: ] ... then APPEND each into the one below.
        let mut b = b"\x80\x04".to_vec();
        b.extend(std::iter::repeat_n(b']', 100));
        b.extend(std::iter::repeat_n(b'a', 99));
        b.push(b'.');
        assert_eq!(decode(&b).unwrap_err(), PickleError::TooDeep);
        // Nested tuples through TUPLE1.
        let mut b = b"\x80\x04N".to_vec();
        b.extend(std::iter::repeat_n(0x85u8, 100));
        b.push(b'.');
        assert_eq!(decode(&b).unwrap_err(), PickleError::TooDeep);
        // 64 deep is fine.
        let mut b = b"\x80\x04N".to_vec();
        b.extend(std::iter::repeat_n(0x85u8, 64));
        b.push(b'.');
        assert!(decode(&b).is_ok());
        // Marks without end.
        let mut b = b"\x80\x04".to_vec();
        b.extend(std::iter::repeat_n(b'(', 1000));
        assert_eq!(decode(&b).unwrap_err(), PickleError::TooDeep);
        // A list holding itself: made, and no reader recursion happens here.
        let p = decode(b"\x80\x04]\x94h\x00a.").unwrap();
        let root = p.root.clone().unwrap();
        assert_eq!(p.items(&root).unwrap(), std::slice::from_ref(&root));
    }

    #[test]
    fn huge_counts_are_bounded() {
        // MAX_VALUES + 1 Nones in one list (APPENDS): refused at the budget.
        let mut b = b"\x80\x04](".to_vec();
        b.resize(b.len() + MAX_VALUES + 1, b'N');
        b.extend_from_slice(b"e.");
        let (r, cost) = decode_counted(&b);
        assert_eq!(r.unwrap_err(), PickleError::TooManyValues);
        assert_eq!(cost.values, MAX_VALUES);
        // Memo reads count too: one memoized value read 5 bytes at a time.
        let mut b = b"\x80\x04](N\x94".to_vec();
        for _ in 0..MAX_VALUES {
            b.extend_from_slice(b"j\x00\x00\x00\x00");
        }
        b.extend_from_slice(b"e.");
        assert_eq!(decode(&b).unwrap_err(), PickleError::TooManyValues);
    }
}
