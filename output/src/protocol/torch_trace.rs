//! torch.profiler's chrome trace, as the hook reads it after a detailed window
//! (docs/formats.md, "Detailed windows through torch's own trace"): the adapter has torch
//! write its trace (`kineto_results.save`, what `export_chrome_trace` calls) into a file the
//! hook made for it in its private folder, and the hook's writer thread turns its ops into
//! `cpu_functions` events, off the training thread.
//!
//! The file is streamed: one element of `traceEvents` at a time (serde's visitor, never
//! the whole document in memory), each complete event (`ph: "X"`) and each memory event
//! (torch's `[memory]` instant events, with `profile_memory`) handed to the caller, who may
//! stop the reading at any event (the window's event cap).
//!
//! Times: torch (Kineto) writes `ts` and `dur` in µs with 3 decimals, `ts` counted from
//! `baseTimeNanoseconds` (a top-level key written before `traceEvents`); the epoch time of
//! an event is `baseTimeNanoseconds + ts × 1000` ns, exactly the `start_ns()` of the same
//! event in torch's raw results (what the adapter's Python conversion reads). A trace
//! without `baseTimeNanoseconds` (torch before 2.1) has epoch µs in `ts`.

use std::fmt;
use std::io::Read;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::protocol::timeline;

words! {
    /// Every word of this format.
    ALL;
    /// The hook's private folder under `LocalPath` for the traces torch writes (mode 0700,
    /// hidden: never uploaded, no reader lists it).
    TRACE_DIR = ".trainprof-torch",
    /// The top-level key of the event list.
    TRACE_EVENTS = "traceEvents",
    /// The top-level key of the time `ts` counts from, in ns since the epoch.
    BASE_TIME_NS = "baseTimeNanoseconds",
    /// The phase of a complete event.
    PH_COMPLETE = "X",
    /// The phase of an instant event: only torch's memory events ([`timeline::MEMORY_NAME`])
    /// are read.
    PH_INSTANT = "i",
    /// The category of the trace's own span (`PyTorch Profiler (0)`), not an op.
    CAT_TRACE = "Trace",
    /// What torch's raw results call a `ProfilerStep#<n>` range, and the adapter writes.
    PROFILER_STEP_PREFIX = "ProfilerStep#",
    PROFILER_STEP_WILDCARD = "ProfilerStep*",
    /// The argument of a `cpu_functions` event that names its thread.
    OP_THREAD_ARG = "tid",
}

/// The ops torch's own tables leave out (`torch.autograd.profiler_util._filter_name`), and
/// the adapter with them.
pub const FILTERED_NAMES: [&str; 8] = [
    "[memory]",
    "[OutOfMemory]",
    "profiler::_record_function_enter",
    "profiler::_record_function_enter_new",
    "profiler::_record_function_exit",
    "aten::is_leaf",
    "aten::output_nr",
    "aten::_version",
];

/// The categories torch gives events that ran on a device, not on the CPU (a kernel, a
/// copy, a fill, a range drawn on the device's timeline).
pub const DEVICE_CATEGORIES: [&str; 5] =
    ["kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"];

/// The file name of trace `k` of process `pid` in [`TRACE_DIR`] (the hook creates it, and
/// `<name>.tmp` beside it, which torch writes first and renames over it).
pub fn trace_name(pid: u32, k: u64) -> String {
    format!("trace-{pid}-{k}.json")
}

/// The name torch writes first (`<name>.tmp`), then renames to `name`.
pub fn trace_temp_name(name: &str) -> String {
    format!("{name}.tmp")
}

/// The name an op is written under: torch's raw results' (`_rewrite_name(...,
/// with_wildcard=True)`: every `ProfilerStep#<n>` is `ProfilerStep*`); None for an op left out
/// ([`FILTERED_NAMES`]).
pub fn op_name(name: &str) -> Option<&str> {
    if FILTERED_NAMES.contains(&name) {
        return None;
    }
    if name.starts_with(PROFILER_STEP_PREFIX) {
        return Some(PROFILER_STEP_WILDCARD);
    }
    Some(name)
}

/// One complete event of the trace, times in ns since the epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEvent {
    pub name: String,
    pub cat: String,
    pub start_ns: i64,
    pub dur_ns: i64,
    /// The thread (`tid`), when it is a number.
    pub tid: Option<i64>,
    /// A memory event (`[memory]`, `ph: "i"`, duration 0): its numbers.
    pub memory: Option<MemoryArgs>,
    /// Its tensor inputs, when torch recorded their shapes and types (`record_shapes`).
    pub message: Option<Message>,
}

/// An op's tensor inputs as torch.profiler's `record_shapes` records them (`args`' `Input
/// Dims` and `Input type`, one entry an input; docs/formats.md, "Collectives"): their bytes
/// (each input's elements × its type's size), and their type (c10's `ScalarType` number,
/// `timeline::collective::SCALAR_TYPES`) when they share one. Only an op whose every input
/// with dimensions is a tensor of a known type has one: a `TensorList` (`c10d::allreduce_`'s
/// input, whose type torch does not write) or an unknown type gives none; an input with no
/// dimensions is a scalar tensor of a known type (1 element) or no tensor at all. At most
/// [`MAX_INPUTS`] inputs are read (an op with more has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    pub bytes: u64,
    pub scalar_type: Option<u8>,
}

/// The inputs of an op read for its [`Message`].
pub const MAX_INPUTS: usize = 16;
/// The most elements an input may count (larger is taken as not recorded).
const MAX_ELEMENTS: u64 = 1 << 50;

/// The numbers of one of torch's memory events (its `args`; a key that is missing or not
/// an integer is 0, the device id -1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct MemoryArgs {
    #[serde(rename = "Device Type", default, deserialize_with = "integer_or_zero")]
    pub device_type: i64,
    #[serde(rename = "Device Id", default = "minus_one", deserialize_with = "integer_or_minus_one")]
    pub device_id: i64,
    #[serde(rename = "Total Allocated", default, deserialize_with = "integer_or_zero")]
    pub total_allocated: i64,
    #[serde(rename = "Total Reserved", default, deserialize_with = "integer_or_zero")]
    pub total_reserved: i64,
}

impl Default for MemoryArgs {
    fn default() -> Self {
        MemoryArgs { device_type: 0, device_id: -1, total_allocated: 0, total_reserved: 0 }
    }
}

fn minus_one() -> i64 {
    -1
}

fn integer_or_zero<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    Ok(integer(d)?.unwrap_or(0))
}

fn integer_or_minus_one<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    Ok(integer(d)?.unwrap_or(-1))
}

impl TraceEvent {
    /// Ran on a device ([`DEVICE_CATEGORIES`]).
    pub fn on_device(&self) -> bool {
        DEVICE_CATEGORIES.contains(&self.cat.as_str())
    }

    /// The whole µs it began in, and the whole µs it ended in (never before the start).
    pub fn span_us(&self) -> (i64, i64) {
        let start = self.start_ns.div_euclid(1000);
        let end = self.start_ns.saturating_add(self.dur_ns.max(0)).div_euclid(1000);
        (start, end.max(start))
    }
}

/// What the caller says after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Go,
    Stop,
}

/// How a read ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Complete events handed to the caller.
    pub events: u64,
    /// The caller stopped the reading.
    pub stopped: bool,
    /// `baseTimeNanoseconds` came after `traceEvents`: the events' times were taken as epoch
    /// µs (torch writes it first).
    pub base_after_events: bool,
    /// The document has no `traceEvents`.
    pub no_events: bool,
}

/// A trace that could not be read to its end (what was handed over before stays handed
/// over).
#[derive(Debug)]
pub struct TraceError {
    pub events_before: u64,
    pub source: serde_json::Error,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a chrome trace after {} events: {}", self.events_before, self.source)
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Reads the chrome trace from `r` (bound its bytes with `Read::take`), handing every
/// complete event to `each` in file order until `each` says [`Flow::Stop`].
pub fn read_events<R: Read>(r: R, each: &mut dyn FnMut(TraceEvent) -> Flow) -> Result<Summary, TraceError> {
    let mut state = State { each, base_ns: None, summary: Summary::default(), seen_events: false };
    let mut de = serde_json::Deserializer::from_reader(r);
    let read = (&mut de).deserialize_map(TopVisitor(&mut state));
    match read {
        Ok(()) => {}
        Err(_) if state.summary.stopped => return Ok(state.summary),
        Err(source) => return Err(TraceError { events_before: state.summary.events, source }),
    }
    if let Err(source) = de.end() {
        return Err(TraceError { events_before: state.summary.events, source });
    }
    state.summary.no_events = !state.seen_events;
    Ok(state.summary)
}

struct State<'a> {
    each: &'a mut dyn FnMut(TraceEvent) -> Flow,
    base_ns: Option<i64>,
    summary: Summary,
    seen_events: bool,
}

/// The error that ends a reading the caller stopped (told apart by `summary.stopped`).
const STOPPED: &str = "stopped at the caller's request";

struct TopVisitor<'s, 'a>(&'s mut State<'a>);

impl<'de> Visitor<'de> for TopVisitor<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a chrome trace object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            if key == BASE_TIME_NS {
                let base: i64 = map.next_value()?;
                if self.0.seen_events {
                    self.0.summary.base_after_events = true;
                }
                self.0.base_ns = Some(base);
            } else if key == TRACE_EVENTS {
                self.0.seen_events = true;
                map.next_value_seed(EventsSeed(&mut *self.0))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

struct EventsSeed<'s, 'a>(&'s mut State<'a>);

impl<'de> DeserializeSeed<'de> for EventsSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of trace events")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let state = self.0;
        while let Some(raw) = seq.next_element::<Raw>()? {
            let memory = raw.ph == PH_INSTANT && raw.name == timeline::MEMORY_NAME;
            if raw.ph != PH_COMPLETE && !memory {
                continue;
            }
            let dur = if memory { Some(0.0) } else { raw.dur };
            let (Some(ts), Some(dur)) = (raw.ts, dur) else { continue };
            let start_ns = match state.base_ns {
                Some(base) => base.saturating_add(us_to_ns(ts)),
                None => us_to_ns(ts),
            };
            let args = raw.args.unwrap_or_default();
            let (memory, message) = if memory { (Some(args.memory()), None) } else { (None, args.message()) };
            let ev = TraceEvent {
                name: raw.name,
                cat: raw.cat,
                start_ns,
                dur_ns: us_to_ns(dur),
                tid: raw.tid,
                memory,
                message,
            };
            state.summary.events += 1;
            if (state.each)(ev) == Flow::Stop {
                state.summary.stopped = true;
                return Err(de::Error::custom(STOPPED));
            }
        }
        Ok(())
    }
}

/// µs with decimals to whole ns (saturating; a NaN is 0).
fn us_to_ns(us: f64) -> i64 {
    (us * 1000.0).round() as i64
}

/// One element of `traceEvents`: the keys read (the rest skipped; of `args`, a memory
/// event's numbers and the inputs' shapes and types).
#[derive(Deserialize)]
struct Raw {
    #[serde(default, deserialize_with = "raw_args")]
    args: Option<RawArgs>,
    #[serde(default)]
    ph: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    cat: String,
    #[serde(default, deserialize_with = "number")]
    ts: Option<f64>,
    #[serde(default, deserialize_with = "number")]
    dur: Option<f64>,
    #[serde(default, deserialize_with = "integer")]
    tid: Option<i64>,
}

/// The keys of `args` read: a memory event's numbers ([`MemoryArgs`]' keys and defaults), an
/// op's `Input Dims` and `Input type` (a [`Message`]); the rest skipped as they are read.
#[derive(Deserialize)]
struct RawArgs {
    #[serde(rename = "Device Type", default, deserialize_with = "integer_or_zero")]
    device_type: i64,
    #[serde(rename = "Device Id", default = "minus_one", deserialize_with = "integer_or_minus_one")]
    device_id: i64,
    #[serde(rename = "Total Allocated", default, deserialize_with = "integer_or_zero")]
    total_allocated: i64,
    #[serde(rename = "Total Reserved", default, deserialize_with = "integer_or_zero")]
    total_reserved: i64,
    #[serde(rename = "Input Dims", default, deserialize_with = "input_dims")]
    dims: Inputs<Dims>,
    #[serde(rename = "Input type", default, deserialize_with = "input_types")]
    types: Inputs<Type>,
}

impl Default for RawArgs {
    fn default() -> Self {
        let m = MemoryArgs::default();
        RawArgs {
            device_type: m.device_type,
            device_id: m.device_id,
            total_allocated: m.total_allocated,
            total_reserved: m.total_reserved,
            dims: Inputs::default(),
            types: Inputs::default(),
        }
    }
}

impl RawArgs {
    fn memory(&self) -> MemoryArgs {
        MemoryArgs {
            device_type: self.device_type,
            device_id: self.device_id,
            total_allocated: self.total_allocated,
            total_reserved: self.total_reserved,
        }
    }

    /// The op's [`Message`], when its inputs say it.
    fn message(&self) -> Option<Message> {
        let (dims, types) = (&self.dims, &self.types);
        if dims.over || types.over {
            return None;
        }
        let mut bytes = 0u64;
        let mut any = false;
        let mut scalar_type: Option<Option<u8>> = None;
        for (i, d) in dims.items[..dims.n].iter().enumerate() {
            let ty = if i < types.n { types.items[i] } else { Type::Other };
            let n = match (d, ty) {
                (Dims::Empty, Type::Known { .. }) => 1,
                (Dims::Empty, _) => continue,
                (Dims::Tensor(Some(n)), Type::Known { .. }) => *n,
                _ => return None,
            };
            let Type::Known { code, size } = ty else { return None };
            bytes = bytes.checked_add(n.checked_mul(u64::from(size))?)?;
            any = true;
            scalar_type = match scalar_type {
                None => Some(Some(code)),
                Some(Some(c)) if c == code => Some(Some(c)),
                Some(_) => Some(None),
            };
        }
        any.then_some(Message { bytes, scalar_type: scalar_type.flatten() })
    }
}

/// The first [`MAX_INPUTS`] entries of an input list; `over` when it had more.
#[derive(Debug, Clone, Copy)]
struct Inputs<T> {
    items: [T; MAX_INPUTS],
    n: usize,
    over: bool,
}

impl<T: Copy + Default> Default for Inputs<T> {
    fn default() -> Self {
        Inputs { items: [T::default(); MAX_INPUTS], n: 0, over: false }
    }
}

/// One input's `Input Dims` entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Dims {
    /// `[]`: a scalar, or no tensor.
    #[default]
    Empty,
    /// A tensor's dimensions: its elements (None past [`MAX_ELEMENTS`]).
    Tensor(Option<u64>),
    /// Anything else (a `TensorList`'s list of dimensions, a value that is no list).
    Other,
}

/// One input's `Input type` entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Type {
    Known {
        code: u8,
        size: u8,
    },
    #[default]
    Other,
}

/// A list of `T`s, the first [`MAX_INPUTS`] kept (each read by `T`'s visitor, the rest
/// skipped); anything that is no list is no entries.
struct ListOf<T>(std::marker::PhantomData<T>);

impl<'de, T: Copy + Default + Deserialize<'de>> Visitor<'de> for ListOf<T> {
    type Value = Inputs<T>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Inputs::<T>::default();
        while out.n < MAX_INPUTS {
            match seq.next_element::<T>()? {
                Some(t) => {
                    out.items[out.n] = t;
                    out.n += 1;
                }
                None => return Ok(out),
            }
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {
            out.over = true;
        }
        Ok(out)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Inputs { over: true, ..Inputs::default() })
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Inputs { over: true, ..Inputs::default() })
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Inputs { over: true, ..Inputs::default() })
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Inputs { over: true, ..Inputs::default() })
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Inputs { over: true, ..Inputs::default() })
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Inputs { over: true, ..Inputs::default() })
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Inputs { over: true, ..Inputs::default() })
    }
}

fn input_dims<'de, D: Deserializer<'de>>(d: D) -> Result<Inputs<Dims>, D::Error> {
    d.deserialize_any(ListOf::<Dims>(std::marker::PhantomData))
}

fn input_types<'de, D: Deserializer<'de>>(d: D) -> Result<Inputs<Type>, D::Error> {
    d.deserialize_any(ListOf::<Type>(std::marker::PhantomData))
}

impl<'de> Deserialize<'de> for Dims {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Dims;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of dimensions")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Dims, A::Error> {
                // The product of integers ≥ 0; anything else in the list makes it `Other`.
                let mut n = Some(1u64);
                let mut empty = true;
                let mut other = false;
                while let Some(g) = seq.next_element::<Scalar2>()? {
                    empty = false;
                    match g.0 {
                        Some(v) if !other => {
                            n = n.and_then(|n| n.checked_mul(v)).filter(|n| *n <= MAX_ELEMENTS);
                        }
                        _ => other = true,
                    }
                }
                Ok(if other {
                    Dims::Other
                } else if empty {
                    Dims::Empty
                } else {
                    Dims::Tensor(n)
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Dims, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Dims::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Dims, E> {
                Ok(Dims::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Dims, E> {
                Ok(Dims::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Dims, E> {
                Ok(Dims::Other)
            }
            fn visit_str<E>(self, _: &str) -> Result<Dims, E> {
                Ok(Dims::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Dims, E> {
                Ok(Dims::Other)
            }
            fn visit_unit<E>(self) -> Result<Dims, E> {
                Ok(Dims::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// One dimension: an integer ≥ 0 (else None; a nested list is skipped).
struct Scalar2(Option<u64>);

impl<'de> Deserialize<'de> for Scalar2 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let g = d.deserialize_any(Scalar)?;
        Ok(Scalar2(g.1.and_then(|v| u64::try_from(v).ok())))
    }
}

impl<'de> Deserialize<'de> for Type {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Type;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a type name")
            }
            fn visit_str<E>(self, v: &str) -> Result<Type, E> {
                Ok(timeline::collective::SCALAR_TYPES
                    .iter()
                    .find(|t| t.2 == v)
                    .map_or(Type::Other, |t| Type::Known { code: t.1, size: t.3 }))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Type, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Type::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Type, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Type::Other)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Type, E> {
                Ok(Type::Other)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Type, E> {
                Ok(Type::Other)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Type, E> {
                Ok(Type::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Type, E> {
                Ok(Type::Other)
            }
            fn visit_unit<E>(self) -> Result<Type, E> {
                Ok(Type::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// `args` when it is an object (else None).
fn raw_args<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RawArgs>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<RawArgs>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            RawArgs::deserialize(de::value::MapAccessDeserializer::new(map)).map(Some)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
    }
    d.deserialize_any(V)
}

/// A number (else None: a string, null, ...).
fn number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    d.deserialize_any(Scalar).map(|s| s.0)
}

/// An integer (else None).
fn integer<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    d.deserialize_any(Scalar).map(|s| s.1)
}

/// Any JSON value, as (number, integer) when it is one.
struct Scalar;

struct Got(Option<f64>, Option<i64>);

impl<'de> Visitor<'de> for Scalar {
    type Value = Got;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }
    fn visit_i64<E>(self, v: i64) -> Result<Got, E> {
        Ok(Got(Some(v as f64), Some(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Got, E> {
        Ok(Got(Some(v as f64), i64::try_from(v).ok()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Got, E> {
        Ok(Got(v.is_finite().then_some(v), None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Got, E> {
        Ok(Got(None, None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Got, E> {
        Ok(Got(None, None))
    }
    fn visit_unit<E>(self) -> Result<Got, E> {
        Ok(Got(None, None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Got, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Got(None, None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Got, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Got(None, None))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn read(text: &str) -> (Vec<TraceEvent>, Result<Summary, TraceError>) {
        let mut got = Vec::new();
        let r = read_events(text.as_bytes(), &mut |e| {
            got.push(e);
            Flow::Go
        });
        (got, r)
    }

    #[test]
    fn times_count_from_the_base_and_only_complete_events_are_read() {
        let text = r#"{"schemaVersion": 1, "baseTimeNanoseconds": 1790857026000000000,
            "traceEvents": [
              {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 4242,
               "ts": 5022102557237.932, "dur": 61.545, "args": {"Input Dims": [[8, 8], []]}},
              {"ph": "s", "id": 7, "pid": 1, "tid": 1, "ts": 5.0, "cat": "fwdbwd", "name": "fwdbwd"},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": "stream 7", "ts": 1, "dur": 0}
            ],
            "traceName": "x.json"}"#;
        let (got, r) = read(text);
        let s = r.unwrap();
        assert_eq!(s, Summary { events: 2, stopped: false, base_after_events: false, no_events: false });
        assert_eq!(got[0].name, "aten::mm");
        assert_eq!(got[0].cat, "cpu_op");
        assert_eq!(got[0].start_ns, 1_795_879_128_557_237_932);
        assert_eq!(got[0].dur_ns, 61_545);
        assert_eq!(got[0].tid, Some(4242));
        assert_eq!(got[0].span_us(), (1_795_879_128_557_237, 1_795_879_128_557_299));
        assert_eq!(got[1].tid, None);
        assert_eq!(got[1].start_ns, 1_790_857_026_000_001_000);
    }

    #[test]
    fn the_caller_can_stop_the_reading() {
        let text = r#"{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1},
            {"ph": "X", "name": "b", "ts": 2, "dur": 1}, {"ph": "X", "name": "c", "ts": 3, "dur": 1}]}"#;
        let mut names = Vec::new();
        let s = read_events(text.as_bytes(), &mut |e| {
            names.push(e.name);
            if names.len() == 2 { Flow::Stop } else { Flow::Go }
        })
        .unwrap();
        assert_eq!(names, ["a", "b"]);
        assert!(s.stopped);
        assert_eq!(s.events, 2);
    }

    #[test]
    fn what_is_not_a_trace_is_an_error_with_the_events_before_it() {
        let (got, r) = read(r#"{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}, {"ph": "X""#);
        assert_eq!(got.len(), 1);
        assert_eq!(r.unwrap_err().events_before, 1);
        for bad in ["[1, 2]", "", "{\"traceEvents\": 5}", "{} trailing"] {
            assert!(read(bad).1.is_err(), "{bad:?}");
        }
        let (_, r) = read(r#"{"traceName": "x"}"#);
        assert!(r.unwrap().no_events);
        let (_, r) = read(r#"{"traceEvents": [], "baseTimeNanoseconds": 5}"#);
        assert!(r.unwrap().base_after_events);
    }

    #[test]
    fn memory_events_are_read_with_their_numbers() {
        // As torch 2.15 writes them with `profile_memory=True` on a CPU model.
        let text = r#"{"baseTimeNanoseconds": 1790857026000000000, "traceEvents": [
            {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 11294, "tid": 11294,
             "ts": 5033871899455.97, "args": {"Total Reserved": 0, "Total Allocated": 4202496, "Bytes": 4194304,
             "Device Id": -1, "Device Type": 0, "Addr": 94250429355904, "finished": false, "Ev Idx": 36}},
            {"ph": "i", "name": "[memory]", "ts": 5, "args": {"Total Allocated": "x", "Device Type": 1, "Device Id": 3}},
            {"ph": "i", "name": "other", "ts": 6, "args": {"Total Allocated": 9}},
            {"ph": "X", "name": "aten::mm", "ts": 7, "dur": 1, "args": {"Total Allocated": 9, "Input Dims": [[1]]}},
            {"ph": "i", "name": "[memory]", "ts": 8, "args": 5}
        ]}"#;
        let (got, r) = read(text);
        assert_eq!(r.unwrap().events, 4);
        let m = got[0].memory.unwrap();
        assert_eq!(
            m,
            MemoryArgs { device_type: 0, device_id: -1, total_allocated: 4_202_496, total_reserved: 0 }
        );
        assert_eq!(got[0].start_ns, 1_795_890_897_899_455_970);
        assert_eq!(got[0].dur_ns, 0);
        assert_eq!(
            got[1].memory.unwrap(),
            MemoryArgs { device_type: 1, device_id: 3, total_allocated: 0, total_reserved: 0 }
        );
        assert_eq!(got[2].name, "aten::mm");
        assert!(got[2].memory.is_none());
        assert_eq!(got[3].memory.unwrap(), MemoryArgs { device_id: -1, ..MemoryArgs::default() });
        // The keys are the timeline's (docs/formats.md, "Memory events").
        let keys = [
            timeline::memory_key::DEVICE_TYPE,
            timeline::memory_key::DEVICE_ID,
            timeline::memory_key::TOTAL_ALLOCATED,
            timeline::memory_key::TOTAL_RESERVED,
        ];
        let obj = format!(r#"{{"{}": 1, "{}": 2, "{}": 3, "{}": 4}}"#, keys[0], keys[1], keys[2], keys[3]);
        let m: MemoryArgs = serde_json::from_str(&obj).unwrap();
        assert_eq!(m, MemoryArgs { device_type: 1, device_id: 2, total_allocated: 3, total_reserved: 4 });
    }

    #[test]
    fn an_ops_tensor_inputs_are_read_from_its_shapes_and_types() {
        // As torch 2.15 writes a gloo all-reduce of 1,000 floats with `record_shapes=True`:
        // gloo's range has the tensor, the dispatcher's op a TensorList without its type.
        let text = r#"{"baseTimeNanoseconds": 1790857026000000000, "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 10, "dur": 5,
             "args": {"External id": 513, "Record function id": 0, "Concrete Inputs": [""], "Input type": ["float"],
                      "Input Strides": [[1]], "Input Dims": [[1000]], "Ev Idx": 0}},
            {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 9, "dur": 7,
             "args": {"External id": 1, "Sequence number": 0, "Concrete Inputs": ["", "", "", "", "False", "-1"],
                      "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"],
                      "Input Strides": [[[1]], [], [], [], [], []], "Input Dims": [[[1000]], [], [], [], [], []]}},
            {"ph": "X", "name": "aten::add", "ts": 1, "dur": 1,
             "args": {"Input Dims": [[2, 3], [], [4]], "Input type": ["c10::BFloat16", "Scalar", "double"]}},
            {"ph": "X", "name": "aten::mul", "ts": 1, "dur": 1,
             "args": {"Input Dims": [[2, 3], []], "Input type": ["c10::Half", "long int"]}},
            {"ph": "X", "name": "no shapes", "ts": 1, "dur": 1, "args": {"Ev Idx": 3}},
            {"ph": "X", "name": "unknown type", "ts": 1, "dur": 1, "args": {"Input Dims": [[2]], "Input type": ["c10::qint8"]}},
            {"ph": "X", "name": "no type", "ts": 1, "dur": 1, "args": {"Input Dims": [[2]]}},
            {"ph": "X", "name": "only scalars", "ts": 1, "dur": 1, "args": {"Input Dims": [[], []], "Input type": ["Scalar", ""]}},
            {"ph": "X", "name": "overflow", "ts": 1, "dur": 1,
             "args": {"Input Dims": [[1125899906842624, 2]], "Input type": ["float"]}},
            {"ph": "X", "name": "negative", "ts": 1, "dur": 1, "args": {"Input Dims": [[-3]], "Input type": ["float"]}},
            {"ph": "X", "name": "not lists", "ts": 1, "dur": 1, "args": {"Input Dims": 5, "Input type": {"a": 1}}}
        ]}"#;
        let (got, r) = read(text);
        assert_eq!(r.unwrap().events, 11);
        let m: Vec<(&str, Option<Message>)> = got.iter().map(|e| (e.name.as_str(), e.message)).collect();
        assert_eq!(m[0], ("gloo:all_reduce", Some(Message { bytes: 4000, scalar_type: Some(6) })));
        assert_eq!(m[1], ("c10d::allreduce_", None));
        assert_eq!(m[2].1, Some(Message { bytes: 2 * 6 + 8 * 4, scalar_type: None }));
        // A 0-d tensor of a known type counts one element.
        assert_eq!(m[3].1, Some(Message { bytes: 2 * 6 + 8, scalar_type: None }));
        assert!(m[4..].iter().all(|(_, m)| m.is_none()), "{m:?}");
        // The table's element sizes are torch's, and its names unique.
        for (i, t) in timeline::collective::SCALAR_TYPES.iter().enumerate() {
            assert!(
                timeline::collective::SCALAR_TYPES[i + 1..]
                    .iter()
                    .all(|u| u.0 != t.0 && u.1 != t.1 && u.2 != t.2)
            );
        }
    }

    #[test]
    fn more_inputs_than_read_give_no_message() {
        let n = MAX_INPUTS + 1;
        let dims = vec!["[1]"; n].join(",");
        let types = vec!["\"float\""; n].join(",");
        let text = format!(
            r#"{{"traceEvents": [{{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {{"Input Dims": [{dims}], "Input type": [{types}]}}}},
               {{"ph": "X", "name": "b", "ts": 1, "dur": 1, "args": {{"Input Dims": [{d}], "Input type": [{t}]}}}}]}}"#,
            d = vec!["[1]"; MAX_INPUTS].join(","),
            t = vec!["\"float\""; MAX_INPUTS].join(","),
        );
        let (got, r) = read(&text);
        r.unwrap();
        assert_eq!(got[0].message, None);
        assert_eq!(got[1].message, Some(Message { bytes: 4 * MAX_INPUTS as u64, scalar_type: Some(6) }));
    }

    #[test]
    fn op_names_are_torchs_raw_results_names() {
        assert_eq!(op_name("ProfilerStep#12"), Some("ProfilerStep*"));
        assert_eq!(op_name("aten::is_leaf"), None);
        assert_eq!(op_name("aten::mm"), Some("aten::mm"));
    }
}
